//! `comp`: CoMP's two-stage plan search (convergence-aware mixed precision,
//! Sec. 3), with the measurements replaced by oracles.
//!
//! **Reads:** op types through a `tf-amp` [`Policy`], float data edges, value
//! shapes, initializer values (the convergence proxy's weight magnitudes),
//! a [`ConvergenceOracle`] and a [`CostOracle`] (the performance oracle: the
//! cost model of `--target` by default, measured batch times later).
//! **Guarantees:**
//! - *Stage 1* fixes the ops with a list tendency (allow, infer, deny):
//!   Tensor-Core-eligible allow ops go low; deny ops stay FP32; every other
//!   allow or infer op goes low only if the convergence oracle accepts the
//!   change (the library takes any [`ConvergenceOracle`], e.g. "train one
//!   epoch, compare the loss with FP32's"; the CLI uses [`VarianceProxy`]).
//! - *Stage 2* settles the remaining lowerable ops (clear ops: no list
//!   tendency), grouped into segments (connected runs of them): a segment
//!   whose Stage-1 neighbours all agree takes their precision; one whose
//!   neighbours differ is searched for the cheapest plan by the performance
//!   oracle, casts included — exhaustively when it has at most
//!   [`EXHAUSTIVE_MAX`] ops, otherwise by dynamic programming along its
//!   chains (two states per op, casts additive at chain edges; linear in the
//!   segment's size). Never exponential beyond `2^EXHAUSTIVE_MAX`.
//! - Unlisted ops stay FP32; a precision the target lacks is never chosen.
//!
//! **Requires:** `infer-shapes`.

use std::collections::{BTreeSet, HashMap, HashSet};

use qsync_ir::{DType, Graph, Model, NodeId, OpClass, ValueId};

use super::materialize::lowerable;
use super::plancost::{self, Assignment};
use super::policy::{Category, Policy, PolicyKind};
use super::{float_preds, float_succs, CostOracle, PlanOptions};
use crate::manager::{Pass, PassContext, PassError, PassOutcome};

/// Segments up to this many ops are searched exhaustively.
pub const EXHAUSTIVE_MAX: usize = 12;

/// Decides whether lowering some ops keeps training convergent.
pub trait ConvergenceOracle {
    /// Accept moving `changed` (in `g`, whose annotations hold the plan so
    /// far) to precision `p`?
    fn accept(&mut self, g: &Graph, changed: &[NodeId], p: DType) -> bool;
}

/// The CLI's default convergence oracle: a QSync-style variance proxy.
///
/// Rounding to a float format with `m` explicit mantissa bits adds variance
/// about `(2^-m)^2 / 12` per unit of squared magnitude (QSync Prop. 2's
/// quantization term). For one op the proxy is
///
/// `Δ = k · ((2^-m_low)^2 − (2^-23)^2) · s²`
///
/// where `k` is how many rounded products one output sums (a GEMM's or
/// Conv's reduction length; a norm's or softmax's row length — the last
/// input dim; 1 for elementwise ops) and `s²` the mean square of the op's
/// weight initializer when its values are present, else 1 (activations are
/// taken as unit scale). A change is rejected when `Δ` exceeds `threshold`
/// (default [`VarianceProxy::DEFAULT_THRESHOLD`]); the `1/12` is folded into
/// the threshold. With FP16 (`m = 10`) this accepts any op summing fewer than
/// ~10^4 unit-scale products; with BF16 (`m = 7`) fewer than ~160.
#[derive(Clone, Debug, PartialEq)]
pub struct VarianceProxy {
    pub threshold: f64,
    pub base_dir: Option<std::path::PathBuf>,
}

impl VarianceProxy {
    pub const DEFAULT_THRESHOLD: f64 = 1e-2;

    /// The mantissa bits of a plan precision.
    pub fn mantissa_bits(p: DType) -> i32 {
        match p {
            DType::F16 => 10,
            DType::BF16 => 7,
            DType::F8E4M3 => 3,
            DType::I8 => 7,
            DType::F64 => 52,
            _ => 23,
        }
    }

    /// The proxy's variance increase for one node.
    pub fn increase(&self, g: &Graph, n: NodeId, p: DType) -> f64 {
        let node = g.node(n);
        let dims = |v: Option<ValueId>| -> Option<Vec<i64>> {
            g.ty(v?).shape.as_ref()?.iter().map(|d| d.as_const()).collect()
        };
        let k: f64 = match node.op.class() {
            OpClass::Conv => dims(node.input(1)).map_or(1.0, |w| w.iter().skip(1).product::<i64>() as f64),
            OpClass::MatMul => dims(node.input(1)).and_then(|b| b.first().copied()).map_or(1.0, |k| k as f64),
            OpClass::Norm | OpClass::Softmax | OpClass::Reduce => {
                dims(node.input(0)).and_then(|d| d.last().copied()).map_or(1.0, |k| k as f64)
            }
            _ => 1.0,
        };
        let s2 = node
            .inputs()
            .iter()
            .flatten()
            .filter_map(|&v| g.value(v).init().filter(|t| t.dtype.is_float() && t.numel() > 1))
            .find_map(|t| {
                let bytes = t.load(self.base_dir.as_deref()).ok()??;
                let vals = qsync_ir::Tensor {
                    dtype: t.dtype,
                    dims: t.dims.clone(),
                    data: qsync_ir::TensorData::Inline(bytes),
                }
                .as_f64s()?;
                (!vals.is_empty()).then(|| vals.iter().map(|x| x * x).sum::<f64>() / vals.len() as f64)
            })
            .unwrap_or(1.0);
        let u = |m: i32| 2f64.powi(-m).powi(2);
        k * (u(Self::mantissa_bits(p)) - u(23)).max(0.0) * s2
    }
}

impl Default for VarianceProxy {
    fn default() -> Self {
        VarianceProxy { threshold: VarianceProxy::DEFAULT_THRESHOLD, base_dir: None }
    }
}

impl ConvergenceOracle for VarianceProxy {
    fn accept(&mut self, g: &Graph, changed: &[NodeId], p: DType) -> bool {
        changed.iter().map(|&n| self.increase(g, n, p)).sum::<f64>() <= self.threshold
    }
}

/// What the two stages decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompReport {
    pub tensor_core_fixed: usize,
    pub accepted: usize,
    pub rejected: usize,
    pub segments_searched: usize,
    pub segments_exhaustive: usize,
}

/// Both stages; writes the plan into `g`'s annotations.
pub fn plan_comp(
    g: &mut Graph,
    policy: &Policy,
    low: DType,
    conv: &mut dyn ConvergenceOracle,
    perf: &dyn CostOracle,
) -> CompReport {
    let mut report = CompReport::default();
    let order = g.topo_order().unwrap_or_else(|_| g.node_ids());
    let mut a: Assignment = plancost::assignment_of(g);
    for p in a.values_mut() {
        *p = DType::F32;
    }
    let cat = |g: &Graph, n: NodeId| {
        if lowerable(g, n) {
            policy.category(g.node(n).op.op_type())
        } else {
            Category::Unlisted
        }
    };
    if !perf.supports(low) {
        plancost::write(g, &a);
        return report;
    }
    // Stage 1.
    let mut fixed: HashSet<NodeId> = HashSet::new();
    for &n in &order {
        match cat(g, n) {
            Category::Allow if perf.tensor_core_eligible(g, n, low) => {
                a.insert(n, low);
                report.tensor_core_fixed += 1;
            }
            Category::Allow | Category::Infer => {
                plancost::write(g, &a);
                if conv.accept(g, &[n], low) {
                    a.insert(n, low);
                    report.accepted += 1;
                } else {
                    report.rejected += 1;
                }
            }
            Category::Deny => {}
            _ => continue,
        }
        fixed.insert(n);
    }
    // Stage 2: segments of clear ops.
    let free = |g: &Graph, n: NodeId| cat(g, n) == Category::Clear;
    let mut seen: HashSet<NodeId> = HashSet::new();
    for &n in &order {
        if !free(g, n) || seen.contains(&n) {
            continue;
        }
        let mut seg = Vec::new();
        let mut stack = vec![n];
        seen.insert(n);
        while let Some(x) = stack.pop() {
            seg.push(x);
            for y in float_preds(g, x).into_iter().chain(float_succs(g, x)) {
                if free(g, y) && seen.insert(y) {
                    stack.push(y);
                }
            }
        }
        let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        seg.sort_by_key(|x| pos.get(x).copied().unwrap_or(usize::MAX));
        let set: HashSet<NodeId> = seg.iter().copied().collect();
        let neighbours: BTreeSet<DType> = seg
            .iter()
            .flat_map(|&x| float_preds(g, x).into_iter().chain(float_succs(g, x)))
            .filter(|y| !set.contains(y) && fixed.contains(y))
            .filter_map(|y| a.get(&y).copied())
            .collect();
        match neighbours.len() {
            0 => {}
            1 => {
                let p = *neighbours.iter().next().unwrap_or(&DType::F32);
                for &x in &seg {
                    a.insert(x, p);
                }
            }
            _ => {
                report.segments_searched += 1;
                if seg.len() <= EXHAUSTIVE_MAX {
                    report.segments_exhaustive += 1;
                    exhaustive(g, &mut a, &seg, low, perf);
                } else {
                    chains_dp(g, &mut a, &seg, &set, low, perf);
                }
            }
        }
    }
    plancost::write(g, &a);
    report
}

/// Cost of a segment under `a`: its ops plus every cast on values it touches.
fn segment_cost(g: &Graph, a: &Assignment, seg: &[NodeId], vals: &BTreeSet<ValueId>, perf: &dyn CostOracle) -> f64 {
    seg.iter().map(|&n| plancost::node_time(g, a, n, perf)).sum::<f64>()
        + vals.iter().map(|&v| plancost::value_cast_cost(g, a, v, perf, &plancost::WeightPricing::casts())).sum::<f64>()
}

fn exhaustive(g: &Graph, a: &mut Assignment, seg: &[NodeId], low: DType, perf: &dyn CostOracle) {
    let mut vals = BTreeSet::new();
    for &n in seg {
        plancost::touched_values(g, n, &mut vals);
    }
    let mut best = (f64::INFINITY, 0u32);
    for mask in 0u32..(1u32 << seg.len()) {
        for (i, &n) in seg.iter().enumerate() {
            a.insert(n, if mask >> i & 1 == 1 { low } else { DType::F32 });
        }
        let c = segment_cost(g, a, seg, &vals, perf);
        // Ties go to the plan with fewer low ops (lower masks first): FP32 is safer.
        if c < best.0 {
            best = (c, mask);
        }
    }
    for (i, &n) in seg.iter().enumerate() {
        a.insert(n, if best.1 >> i & 1 == 1 { low } else { DType::F32 });
    }
}

/// Split a segment into chains (runs where each op has one in-segment
/// predecessor and that predecessor one in-segment successor), then settle
/// each chain, in order, by dynamic programming over {f32, low} with the rest
/// of the plan fixed.
fn chains_dp(g: &Graph, a: &mut Assignment, seg: &[NodeId], set: &HashSet<NodeId>, low: DType, perf: &dyn CostOracle) {
    let preds_in = |x: NodeId| -> Vec<NodeId> { float_preds(g, x).into_iter().filter(|y| set.contains(y)).collect() };
    let succs_in = |x: NodeId| -> Vec<NodeId> { float_succs(g, x).into_iter().filter(|y| set.contains(y)).collect() };
    let mut in_chain: HashSet<NodeId> = HashSet::new();
    let mut chains: Vec<Vec<NodeId>> = Vec::new();
    for &n in seg {
        if in_chain.contains(&n) {
            continue;
        }
        let mut chain = vec![n];
        in_chain.insert(n);
        let mut cur = n;
        loop {
            let s = succs_in(cur);
            if s.len() != 1 || in_chain.contains(&s[0]) || preds_in(s[0]).len() != 1 {
                break;
            }
            cur = s[0];
            chain.push(cur);
            in_chain.insert(cur);
        }
        chains.push(chain);
    }
    let ps = [DType::F32, low];
    for chain in chains {
        // Local cost of chain op i at precision p given the previous op's q:
        // its op time plus the casts on values it touches, with the other
        // chain ops at the precision being tried (the previous at q).
        let k = chain.len();
        let mut cost = vec![[f64::INFINITY; 2]; k];
        let mut from = vec![[0usize; 2]; k];
        for i in 0..k {
            for (pi, &p) in ps.iter().enumerate() {
                for qi in 0..if i == 0 { 1 } else { 2 } {
                    let prev = if i == 0 { 0.0 } else { cost[i - 1][qi] };
                    if i > 0 {
                        a.insert(chain[i - 1], ps[qi]);
                    }
                    a.insert(chain[i], p);
                    let c = prev + local(g, a, chain[i], i + 1 == k, perf);
                    if c < cost[i][pi] {
                        cost[i][pi] = c;
                        from[i][pi] = qi;
                    }
                }
            }
        }
        let mut pi = if cost[k - 1][1] < cost[k - 1][0] { 1 } else { 0 };
        for i in (0..k).rev() {
            a.insert(chain[i], ps[pi]);
            pi = from[i][pi];
        }
    }
}

/// Op time of `n` plus the casts on its inputs (and, for a chain's last op,
/// on its outputs too): each edge's cast is charged once, to its consumer.
fn local(g: &Graph, a: &Assignment, n: NodeId, last: bool, perf: &dyn CostOracle) -> f64 {
    let node = g.node(n);
    let mut t = plancost::node_time(g, a, n, perf);
    let mut vals: BTreeSet<ValueId> = node.inputs().iter().flatten().copied().collect();
    if last {
        vals.extend(node.outputs().iter().copied());
    }
    for v in vals {
        t += plancost::value_cast_cost(g, a, v, perf, &plancost::WeightPricing::casts());
    }
    t
}

/// The `comp` pass (CLI: the [`VarianceProxy`] convergence oracle).
#[derive(Debug, Clone)]
pub struct Comp {
    pub policy: Policy,
    pub options: PlanOptions,
    pub threshold: f64,
}

impl Comp {
    pub fn new(policy: Policy, options: PlanOptions, threshold: f64) -> Result<Comp, PassError> {
        if policy.kind != PolicyKind::TfAmp {
            return Err(PassError::FailedGraph {
                pass: "comp".into(),
                message: format!("policy `{}` is not a tf-amp policy", policy.name),
            });
        }
        Ok(Comp { policy, options, threshold })
    }
}

impl Pass for Comp {
    fn name(&self) -> &'static str {
        "comp"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let oracle = super::oracle_for(cx, self.name())?;
        super::require_support(&*oracle, self.options.dtype, self.name(), cx.target.as_deref())?;
        let mut proxy = VarianceProxy { threshold: self.threshold, base_dir: model.base_dir.clone() };
        let r = plan_comp(&mut model.graph, &self.policy, self.options.dtype, &mut proxy, &*oracle);
        super::apply_overrides(&mut model.graph, &self.options.overrides, &*oracle, self.name())?;
        let mut out = super::finish(model, self.options.mode, cx, self.name())?;
        out.summary += &format!(
            "; stage 1: {} tensor-core ops fixed low, {} accepted, {} rejected; stage 2: {} segments searched ({} exhaustively)",
            r.tensor_core_fixed, r.accepted, r.rejected, r.segments_searched, r.segments_exhaustive
        );
        Ok(out)
    }
}
