//! `campo`: Campo's cost-aware rewrite (ATC'22 Sec. 4.3–4.4) — TensorFlow's
//! lists, but every FP16 decision that costs casts is checked against the
//! target's cost model.
//!
//! **Reads:** op types through a `tf-amp` [`Policy`], float data edges, value
//! shapes, and the [`CostOracle`] (the cost model of `--target`).
//! **Guarantees:** four traverses over the graph, then optional Tensor Core
//! padding, then materialization:
//! 1. an allow op goes low only if its op time at low plus the casts it
//!    induces (Campo eq. 1, forward and gradient casts, weights' per-iteration
//!    casts included) beats FP32. In training, a trained weight whose every
//!    reader keeps it for the backward is priced as `egraph-casts` will
//!    store it — a refreshed copy, costing the optimizer step's rewrite
//!    ([`super::plancost::WeightPricing`]; `refresh=off` prices
//!    per-iteration casts everywhere), and whole-graph comparisons below
//!    store such weights the same way (`evaluate`). The casts are counted against the plan TF-AMP
//!    would paint around it (its neighbours as `amp` sets them), so casts
//!    shared along an all-low chain are not charged to every op of it;
//! 2. deny propagation: deny ops, and infer / clear ops downstream of them
//!    (clear ones only where they lead to infer or deny ops), stay FP32;
//! 3. infer / clear ops on a path between two allow ops that went low go low;
//! 4. each remaining connected chain of clear and infer ops touching a low
//!    op goes low as a whole only if the casts it saves exceed its op-time
//!    increase (a chain with an infer op — which TF-AMP leaves FP32 unless
//!    it lies between low ops — only if it also removes casts);
//! 5. Tensor Core padding ([`pad_for_tensor_cores`], on unless
//!    `padding=off`): a low GEMM / Conv whose dims miss the alignment gets a
//!    Pad before (zeros: exact) and a Slice after, kept only where the padded
//!    op plus the Pad / Slice ops beats the unpadded low op.
//!
//! **Guarantee against the baseline:** the result never has more casts than
//! `amp` nor a larger predicted time (same oracle, same mode). The traverses
//! are greedy and local, so after them the whole-graph plan is compared with
//! `amp`'s (both materialized and predicted); if campo's loses on either
//! figure, the pass keeps `amp`'s plan and says so in its summary
//! ("fell back to amp"). The comparison is whole-graph, not per region.
//! A precision the target lacks is never chosen (an error, as in `amp`).
//! **Requires:** `infer-shapes`.

use std::collections::{HashMap, HashSet};

use qsync_ir::{DType, Graph, Model, NodeId, NodeSpec, Op, Tensor, TensorType, ValueId};

use super::amp::plan_amp;
use super::materialize::{lowerable, materialize_with, Mode};
use super::plancost::{self, Assignment, WeightPricing};
use super::policy::{Category, Policy, PolicyKind};
use super::qscale::ActivationRanges;
use super::{float_preds, float_succs, CostOracle, PlanOptions, Prediction};
use crate::manager::{Pass, PassContext, PassError, PassOutcome};

/// What the traverses decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CampoReport {
    /// Allow ops kept FP32 by traverse 1 (low would not pay on the target).
    pub rejected_allow: usize,
    /// Clear (and infer) ops lowered by traverse 4.
    pub clear_lowered: usize,
    /// Clear chains traverse 4 judged not worth lowering.
    pub clear_chains_rejected: usize,
}

/// The four traverses: the plan as an assignment (not yet written).
pub fn plan_campo(
    g: &Graph,
    policy: &Policy,
    low: DType,
    oracle: &dyn CostOracle,
    w: &WeightPricing,
) -> (Assignment, CampoReport) {
    let mut report = CampoReport::default();
    let nodes = g.topo_order().unwrap_or_else(|_| g.node_ids());
    let cats: HashMap<NodeId, Category> = nodes
        .iter()
        .map(|&n| (n, if lowerable(g, n) { policy.category(g.node(n).op.op_type()) } else { Category::Unlisted }))
        .collect();
    let is = |n: &NodeId, c: Category| cats.get(n) == Some(&c);
    let mut f32_all: Assignment = plancost::assignment_of(g);
    for p in f32_all.values_mut() {
        *p = DType::F32;
    }
    if !oracle.supports(low) {
        return (f32_all, report);
    }

    // Context for traverse 1: the plan TF-AMP paints.
    let mut ctx = {
        let mut h = g.clone();
        plan_amp(&mut h, policy, low, oracle);
        plancost::assignment_of(&h)
    };

    // 1. allow ops: low only where it pays, casts included.
    let mut low_set: HashSet<NodeId> = HashSet::new();
    for &n in &nodes {
        if !is(&n, Category::Allow) {
            continue;
        }
        ctx.insert(n, DType::F32);
        let (d, _) = plancost::delta(g, &mut ctx, &[n], low, oracle, w);
        if d < 0.0 {
            ctx.insert(n, low);
            low_set.insert(n);
        } else {
            report.rejected_allow += 1;
        }
    }

    // 2. deny propagation (as TF-AMP).
    let deny = super::amp::deny_set(g, &nodes, &cats);

    // 3. infer / clear between low allow ops.
    let between = super::amp::between_set(g, &low_set, &deny, &cats);
    low_set.extend(between);

    let mut a = f32_all;
    for &n in &low_set {
        a.insert(n, low);
    }

    // 4. clear chains touching low ops, judged by cost.
    let candidate = |n: &NodeId, low_set: &HashSet<NodeId>| {
        (is(n, Category::Clear) || is(n, Category::Infer)) && !deny.contains(n) && !low_set.contains(n)
    };
    let mut seen: HashSet<NodeId> = HashSet::new();
    for &n in &nodes {
        if !candidate(&n, &low_set) || seen.contains(&n) {
            continue;
        }
        // The connected chain of candidate clear ops through n.
        let mut chain = Vec::new();
        let mut stack = vec![n];
        seen.insert(n);
        while let Some(x) = stack.pop() {
            chain.push(x);
            for y in float_preds(g, x).into_iter().chain(float_succs(g, x)) {
                if candidate(&y, &low_set) && seen.insert(y) {
                    stack.push(y);
                }
            }
        }
        let touches_low =
            chain.iter().any(|&x| float_preds(g, x).into_iter().chain(float_succs(g, x)).any(|y| low_set.contains(&y)));
        if !touches_low {
            continue;
        }
        chain.sort();
        let (d, dc) = plancost::delta(g, &mut a, &chain, low, oracle, w);
        // A chain with infer ops (TF-AMP would leave them FP32 here) goes
        // low only when it also saves casts.
        let infer = chain.iter().any(|x| is(x, Category::Infer));
        if d < 0.0 && (!infer || dc < 0) {
            for &x in &chain {
                a.insert(x, low);
            }
            report.clear_lowered += chain.len();
        } else {
            report.clear_chains_rejected += 1;
        }
    }
    (a, report)
}

/// Reconciliation after the traverses: each node where the campo plan and
/// `amp`'s differ moves to `amp`'s precision when that alone lowers the
/// predicted time (casts included). Returns how many moved.
pub fn reconcile(
    g: &Graph,
    plan: &mut Assignment,
    amp: &Assignment,
    oracle: &dyn CostOracle,
    w: &WeightPricing,
) -> usize {
    let mut moved = 0;
    let mut differing: Vec<NodeId> =
        plan.iter().filter(|(n, p)| amp.get(n).is_some_and(|q| q != *p)).map(|(&n, _)| n).collect();
    differing.sort();
    for n in differing {
        let Some(&q) = amp.get(&n) else { continue };
        let (d, dc) = plancost::delta(g, plan, &[n], q, oracle, w);
        if d < 0.0 && dc <= 0 {
            plan.insert(n, q);
            moved += 1;
        }
    }
    moved
}

/// Materialize a copy of `model` under `a` (INT8 activations scaled by
/// `ranges`, nodes without one kept f32 as the final materialization keeps
/// them): (casts added, prediction).
/// With `refresh`, trained weights are then stored as `egraph-casts` would
/// store them ([`crate::egraph::refresh_weight_casts`]): their casts become
/// refreshed copies, neither counted as casts nor timed as casts.
pub fn evaluate(
    model: &Model,
    a: &Assignment,
    mode: Mode,
    oracle: &dyn CostOracle,
    refresh: bool,
    ranges: &ActivationRanges,
) -> Result<(usize, Prediction), String> {
    let mut m = model.clone();
    plancost::write(&mut m.graph, a);
    let stats = materialize_with(&mut m, mode, ranges)?;
    let stored = if refresh { crate::egraph::refresh_weight_casts(&mut m.graph, oracle) } else { 0 };
    Ok((stats.casts - stored, oracle.predict(&m.graph)))
}

/// Padding a misaligned low GEMM / Conv: where it pays, Pad its inputs with
/// zeros up to the Tensor Core alignment and Slice its output back. Returns
/// the nodes padded. Conv: input channels (input dim 1, weight dim 1) and
/// output channels (weight dim 0, output dim 1). MatMul with a 2-D FP32
/// weight initializer: k (A's last dim, B's first) and n (B's last, output's
/// last). Other shapes are left alone.
pub fn pad_for_tensor_cores(g: &mut Graph, low: DType, oracle: &dyn CostOracle) -> Vec<String> {
    let align: i64 = match low {
        DType::F16 | DType::BF16 => 8,
        _ => return Vec::new(),
    };
    let mut padded = Vec::new();
    let candidates: Vec<NodeId> = g
        .node_ids()
        .into_iter()
        .filter(|&n| {
            g.node(n).precision == Some(low)
                && matches!(g.node(n).op, Op::Conv | Op::MatMul)
                && !oracle.tensor_core_eligible(g, n, low)
        })
        .collect();
    for n in candidates {
        let Some(plan) = pad_plan(g, n, align) else { continue };
        let before = oracle.op_time(g, n, low);
        let mut trial = g.clone();
        let Some(new_nodes) = apply_pad(&mut trial, n, &plan, low) else { continue };
        if !oracle.tensor_core_eligible(&trial, n, low) {
            continue;
        }
        let after: f64 = new_nodes.iter().chain([&n]).map(|&m| oracle.op_time(&trial, m, low)).sum();
        if after < before {
            padded.push(g.node(n).name.clone());
            *g = trial;
        }
    }
    padded
}

/// Per input slot: (axis, pad amount) pairs; and the output (axis, kept size).
struct PadPlan {
    inputs: Vec<(usize, Vec<(usize, i64)>)>,
    output: Option<(usize, i64)>,
}

fn const_shape(g: &Graph, v: ValueId) -> Option<Vec<i64>> {
    g.ty(v).shape.as_ref()?.iter().map(|d| d.as_const()).collect()
}

fn pad_plan(g: &Graph, n: NodeId, align: i64) -> Option<PadPlan> {
    let node = g.node(n);
    let up = |d: i64| (align - d % align) % align;
    match node.op {
        Op::Conv => {
            if node.attr_int("group").unwrap_or(1) != 1 {
                return None;
            }
            let w = const_shape(g, node.input(1)?)?;
            let x_rank = g.ty(node.input(0)?).shape.as_ref()?.len();
            if w.len() < 3 || x_rank != w.len() {
                return None;
            }
            let (pm, pc) = (up(w[0]), up(w[1]));
            if pm == 0 && pc == 0 {
                return None;
            }
            let mut inputs = vec![];
            if pc > 0 {
                inputs.push((0, vec![(1, pc)]));
            }
            let mut wp = vec![];
            if pm > 0 {
                wp.push((0, pm));
            }
            if pc > 0 {
                wp.push((1, pc));
            }
            inputs.push((1, wp));
            if pm > 0 && node.input(2).is_some() {
                inputs.push((2, vec![(0, pm)]));
            }
            Some(PadPlan { inputs, output: (pm > 0).then_some((1, w[0])) })
        }
        Op::MatMul => {
            let b = node.input(1)?;
            g.value(b).init()?;
            let bs = const_shape(g, b)?;
            let a_rank = g.ty(node.input(0)?).shape.as_ref()?.len();
            if bs.len() != 2 || a_rank < 2 {
                return None;
            }
            let (pk, pn) = (up(bs[0]), up(bs[1]));
            if pk == 0 && pn == 0 {
                return None;
            }
            let mut inputs = vec![];
            if pk > 0 {
                inputs.push((0, vec![(a_rank - 1, pk)]));
            }
            let mut bp = vec![];
            if pk > 0 {
                bp.push((0, pk));
            }
            if pn > 0 {
                bp.push((1, pn));
            }
            inputs.push((1, bp));
            let out_rank = g.ty(node.outputs()[0]).shape.as_ref()?.len();
            Some(PadPlan { inputs, output: (pn > 0).then_some((out_rank - 1, bs[1])) })
        }
        _ => None,
    }
}

fn i64_init(g: &mut Graph, base: &str, vals: &[i64]) -> ValueId {
    let name = g.fresh_value_name(base);
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    g.add_init(
        name,
        Tensor { dtype: DType::I64, dims: vec![vals.len() as i64], data: qsync_ir::TensorData::Inline(bytes.into()) },
    )
}

fn apply_pad(g: &mut Graph, n: NodeId, plan: &PadPlan, low: DType) -> Option<Vec<NodeId>> {
    let mut added = Vec::new();
    for (slot, axes) in &plan.inputs {
        let v = g.node(n).input(*slot)?;
        let shape = g.ty(v).shape.clone()?;
        let rank = shape.len();
        let mut pads = vec![0i64; 2 * rank];
        let mut new_shape = shape.clone();
        for &(axis, amount) in axes {
            pads[rank + axis] = amount;
            new_shape[axis] = new_shape[axis].add(&qsync_ir::Dim::from(amount));
        }
        let base = g.value_name(v).to_string();
        let pads_v = i64_init(g, &format!("{base}.pads"), &pads);
        let name = g.fresh_value_name(&format!("{base}.pad"));
        let ty = TensorType { container: None, dtype: g.ty(v).dtype, shape: Some(new_shape) };
        let spec = NodeSpec::new(name.clone(), Op::Pad).input(v).input(pads_v).output(name, ty);
        let pn = g.add_node(spec);
        g.node_mut(pn).precision = Some(low);
        let out = g.node(pn).outputs()[0];
        g.set_input(n, *slot, Some(out));
        added.push(pn);
    }
    if let Some((axis, keep)) = plan.output {
        let y = g.node(n).outputs()[0];
        let ty = g.ty(y).clone();
        let mut padded_shape = ty.shape.clone()?;
        let pad_to = (keep + 7) / 8 * 8;
        padded_shape[axis] = qsync_ir::Dim::from(pad_to);
        let yname = g.value_name(y).to_string();
        let wide = g.fresh_value_name(&format!("{yname}.padded"));
        g.rename_value(y, wide);
        g.set_ty(y, TensorType { container: None, dtype: ty.dtype, shape: Some(padded_shape) });
        let starts = i64_init(g, &format!("{yname}.slice_starts"), &[0]);
        let ends = i64_init(g, &format!("{yname}.slice_ends"), &[keep]);
        let axes = i64_init(g, &format!("{yname}.slice_axes"), &[axis as i64]);
        let spec = NodeSpec::new(format!("{yname}.slice"), Op::Slice)
            .input(y)
            .input(starts)
            .input(ends)
            .input(axes)
            .output(yname, ty);
        let placeholder = g.add_undefined("campo.placeholder");
        let sn = g.add_node(spec);
        let s_out = g.node(sn).outputs()[0];
        // Consumers of y (except the slice) read the slice instead.
        g.set_input(sn, 0, Some(placeholder));
        g.replace_all_uses(y, s_out);
        g.set_input(sn, 0, Some(y));
        g.remove_source(placeholder);
        let outs: Vec<ValueId> = g.outputs().iter().map(|&o| if o == y { s_out } else { o }).collect();
        g.set_outputs(outs);
        g.node_mut(sn).precision = Some(low);
        added.push(sn);
    }
    Some(added)
}

/// The `campo` pass.
#[derive(Debug, Clone)]
pub struct Campo {
    pub policy: Policy,
    pub options: PlanOptions,
    /// Tensor Core padding (traverse 5); `padding=off` disables it.
    pub padding: bool,
    /// Price trained weights as refreshed copies where `egraph-casts` will
    /// store them (training); `refresh=off`: per-iteration casts.
    pub refresh: bool,
}

/// Predicted times within this fraction of each other count as equal when
/// campo picks between its candidate plans (fewer casts then wins): below
/// what the cost model can resolve.
pub const TIME_TIE: f64 = 0.005;

impl Campo {
    pub fn new(policy: Policy, options: PlanOptions, padding: bool) -> Result<Campo, PassError> {
        if policy.kind != PolicyKind::TfAmp {
            return Err(PassError::FailedGraph {
                pass: "campo".into(),
                message: format!("policy `{}` is not a tf-amp policy", policy.name),
            });
        }
        Ok(Campo { policy, options, padding, refresh: true })
    }
}

impl Pass for Campo {
    fn name(&self) -> &'static str {
        "campo"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let oracle = super::oracle_for(cx, self.name())?;
        let oracle = &*oracle;
        let low = self.options.dtype;
        super::require_support(oracle, low, self.name(), cx.target.as_deref())?;
        let mode = if cx.inference { Mode::Inference } else { self.options.mode };
        let fail = |message: String| PassError::FailedGraph { pass: "campo".into(), message };
        let ranges = cx.activation_ranges.clone();

        // Trained weights are priced as `egraph-casts` stores them, unless
        // `refresh=off` (or inference, where weights are constants).
        let refresh = self.refresh && mode == Mode::Training;
        let amp_plan = {
            let mut h = model.graph.clone();
            plan_amp(&mut h, &self.policy, low, oracle);
            super::apply_overrides(&mut h, &self.options.overrides, oracle, self.name())?;
            plancost::assignment_of(&h)
        };
        // The traverses are greedy and local; with refreshed copies they run
        // twice, weights priced as copies and as per-iteration casts (the
        // second keeps FP32 the tiny ops whose casts cost more than they
        // save), and the whole-graph prediction picks: the faster plan,
        // or, within `TIME_TIE` of each other, the one with fewer casts.
        let pricings = if refresh {
            vec![WeightPricing::training(&model.graph), WeightPricing::casts()]
        } else {
            vec![WeightPricing::casts()]
        };
        let mut best: Option<(Assignment, CampoReport, usize, usize, Prediction)> = None;
        for pricing in &pricings {
            let (mut plan, report) = plan_campo(&model.graph, &self.policy, low, oracle, pricing);
            {
                let mut h = model.graph.clone();
                plancost::write(&mut h, &plan);
                super::apply_overrides(&mut h, &self.options.overrides, oracle, self.name())?;
                plan = plancost::assignment_of(&h);
            }
            let reconciled = reconcile(&model.graph, &mut plan, &amp_plan, oracle, pricing);
            let (casts, t) = evaluate(model, &plan, mode, oracle, refresh, &ranges).map_err(fail)?;
            let better = best.as_ref().is_none_or(|(_, _, _, bc, bt)| {
                let (a, b) = (t.total(), bt.total());
                if (a - b).abs() <= TIME_TIE * a.min(b) {
                    casts < *bc
                } else {
                    a < b
                }
            });
            if better {
                best = Some((plan, report, reconciled, casts, t));
            }
        }
        let (plan, report, reconciled, campo_casts, campo_t) = best.expect("at least one pricing");
        let (amp_casts, amp_t) = evaluate(model, &amp_plan, mode, oracle, refresh, &ranges).map_err(fail)?;
        let mut fp32_plan = plan.clone();
        for p in fp32_plan.values_mut() {
            *p = DType::F32;
        }
        let (fp32_casts, fp32_t) = evaluate(model, &fp32_plan, mode, oracle, refresh, &ranges).map_err(fail)?;
        let campo_ok = campo_casts <= amp_casts && campo_t.total() <= amp_t.total();
        let fp32_wins = fp32_casts <= amp_casts
            && fp32_t.total() < amp_t.total().min(if campo_ok { campo_t.total() } else { f64::INFINITY });
        let fell_back = !campo_ok && !fp32_wins;
        let chosen = if fp32_wins {
            &fp32_plan
        } else if fell_back {
            &amp_plan
        } else {
            &plan
        };
        plancost::write(&mut model.graph, chosen);
        let mut note = format!(
            "traverses: {} allow ops kept f32, {} clear ops lowered, {} clear chains kept f32, {} ops reconciled",
            report.rejected_allow, report.clear_lowered, report.clear_chains_rejected, reconciled
        );
        if fp32_wins {
            note += &format!(
                "; fp32 predicted fastest ({:.3} ms, amp {:.3} ms): nothing lowered",
                fp32_t.total() * 1e3,
                amp_t.total() * 1e3
            );
        }
        if fell_back {
            note += &format!(
                "; fell back to amp (campo {campo_casts} casts / {:.3} ms, amp {amp_casts} casts / {:.3} ms)",
                campo_t.total() * 1e3,
                amp_t.total() * 1e3
            );
        }
        if self.padding && !fell_back && !fp32_wins {
            let before = model.graph.clone();
            let padded = pad_for_tensor_cores(&mut model.graph, low, oracle);
            if !padded.is_empty() {
                // Padding must not break the guarantee either.
                let a = plancost::assignment_of(&model.graph);
                let (c, t) = evaluate(model, &a, mode, oracle, refresh, &ranges).map_err(fail)?;
                if c > amp_casts || t.total() > amp_t.total() {
                    model.graph = before;
                } else {
                    note += &format!("; padded for Tensor Cores: {}", padded.join(", "));
                }
            }
        }
        let mut out = super::finish(model, mode, cx, self.name())?;
        out.summary += &format!("; {note}");
        Ok(out)
    }
}
