//! QSync's indicator Ω_o^(b) (Prop. 2–3, eqs. 3–5): the variance a
//! low-precision operator adds to training, used to rank which operators to
//! give precision back first.
//!
//! For operator `o` at precision `b` (Ω = 0 at FP32):
//!
//! ```text
//! Ω = γ² d_o σ_fp + (d_L − d_o) σ_bp                                   (3)
//! fixed point (INT8):   σ_fp = ( ‖x‖² q_v² D_v + ‖v‖² q_x² D_x ) / 6    (4)
//!                       σ_bp = ( ‖∇v‖² q_v² D_v + ‖v‖² 2^{2e_∇v} ε₁₆² D_∇v ) / 6   (5)
//! floating point:       σ_fp = ε² ( ‖x‖² 2^{2e_v} D_v + ‖v‖² 2^{2e_x} D_x ) / 6
//!                       σ_bp = ε² ( ‖∇v‖² 2^{2e_v} D_v + ‖v‖² 2^{2e_∇v} D_∇v ) / 6
//! ```
//!
//! `v` is the operator's activation input, `x` its weight, `∇v` the gradient
//! arriving at its output; `D` are element counts, `q` quantization scales
//! (activations asymmetric: range / 255; weights symmetric: absmax / 127, as
//! `materialize` quantizes them), `e` effective exponents `⌊log2 absmax⌋` and
//! `ε = 2^-k` with `k = mantissa bits − 1` (the paper's k = 9 for FP16).
//! INT8 backward runs in FP16, hence ε₁₆ in its σ_bp. Operators without
//! weights (Softmax, norms without affine data, …) add only their input's
//! quantization variance (Prop. 2) in the forward and nothing backward.
//!
//! `d_o` is the operator's depth — the longest producer chain from a graph
//! input, found by DFS over the forward DAG (first operator: 1) — and `d_L`
//! the model depth (the deepest operator).
//!
//! **Statistics.** Weights: from the initializer when its data is inline,
//! otherwise estimated (He-style: std = 1/√fan_in, absmax = 3 std); the
//! [`Indicator::sources`] say which. Activations and gradients: from a
//! [`Calibration`] file when one is given (see its docs for the format and
//! `scripts/calibrate.py` for how to make one), otherwise estimated from
//! shapes (unit-variance activations with absmax 4; gradients with
//! per-element std 1e-3, absmax 4e-3).

use std::collections::{BTreeMap, HashMap};

use qsync_cost::{GraphFacts, Precision};
use qsync_ir::{DType, Graph, NodeId, Op, ValueId};
use qsync_passes::precision::qscale::{needs_range, uncalibrated_input};
use qsync_passes::precision::ActivationRanges;
use serde::{Deserialize, Serialize};

/// Summary statistics of one tensor, averaged over calibration iterations.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorStats {
    /// Squared L2 norm, ‖t‖².
    pub norm2: f64,
    pub min: f64,
    pub max: f64,
    /// Elements (D). When absent in a calibration file, the graph's count is used.
    #[serde(default)]
    pub numel: f64,
}

impl TensorStats {
    /// The largest magnitude, max(|min|, |max|).
    pub fn absmax(&self) -> f64 {
        self.min.abs().max(self.max.abs())
    }

    /// 2^{2e} with e the effective exponent ⌊log2 absmax⌋.
    fn exp2(&self) -> f64 {
        let a = self.absmax();
        if a > 0.0 && a.is_finite() {
            4f64.powf(a.log2().floor())
        } else {
            0.0
        }
    }

    /// Asymmetric 8-bit scale of an activation.
    fn q_act(&self) -> f64 {
        (self.max - self.min).max(0.0) / 255.0
    }

    /// Symmetric 8-bit scale of a weight.
    fn q_weight(&self) -> f64 {
        self.absmax() / 127.0
    }

    /// Statistics of a tensor's values.
    pub fn of(values: &[f64]) -> TensorStats {
        let (mut n2, mut lo, mut hi) = (0.0, f64::INFINITY, f64::NEG_INFINITY);
        for &x in values {
            n2 += x * x;
            lo = lo.min(x);
            hi = hi.max(x);
        }
        if values.is_empty() {
            (lo, hi) = (0.0, 0.0);
        }
        TensorStats { norm2: n2, min: lo, max: hi, numel: values.len() as f64 }
    }
}

/// Per-operator statistics in a calibration file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    /// The operator's activation input v.
    pub input: Option<TensorStats>,
    /// Its weight x (usually known from the model; the file may override it).
    pub weight: Option<TensorStats>,
    /// The gradient arriving at its output, ∇v.
    pub grad_output: Option<TensorStats>,
    /// The GEMM-like operators the module calls in its own forward rather
    /// than through a submodule (attention's `torch.matmul`s, a functional
    /// `F.conv2d`), by family (`matmul`: MatMul, Gemm, Einsum; `conv`:
    /// Conv, ConvTranspose), each family's calls in the order they ran.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub calls: BTreeMap<String, Vec<CallStats>>,
}

/// One functional call's statistics (see [`OpStats::calls`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CallStats {
    /// Every tensor operand, in the order the graph's node reads them
    /// (`torch.matmul(a, b)`: a, b; `F.linear(x, w, b)`: x, w, b).
    #[serde(default)]
    pub inputs: Vec<TensorStats>,
    /// The gradient arriving at its output.
    #[serde(default)]
    pub grad_output: Option<TensorStats>,
}

/// A node's statistics: its module's, or those of the functional call it
/// came from (then `operands` are every float input's, in order).
#[derive(Clone, Debug, Default)]
struct NodeStats {
    input: Option<TensorStats>,
    weight: Option<TensorStats>,
    grad_output: Option<TensorStats>,
    operands: Vec<TensorStats>,
}

impl NodeStats {
    fn module(s: &OpStats) -> NodeStats {
        NodeStats { input: s.input, weight: s.weight, grad_output: s.grad_output, operands: Vec::new() }
    }

    fn call(c: &CallStats) -> NodeStats {
        NodeStats {
            input: c.inputs.first().copied(),
            weight: None,
            grad_output: c.grad_output,
            operands: c.inputs.clone(),
        }
    }
}

/// The calibration file (`--calibration FILE`), version 1:
///
/// ```json
/// { "format": "qsync-calibration", "version": 1,
///   "model": "resnet50", "iterations": 50, "batch": 16,
///   "ops": { "layer1.0.conv1": { "input": {"norm2": 1.2e5, "min": -3.1, "max": 4.0, "numel": 802816},
///                                "weight": {...}, "grad_output": {...} },
///            "blocks.0": { "calls": { "matmul": [ { "inputs": [{...}, {...}], "grad_output": {...} } ] } } } }
/// ```
///
/// Keys name PyTorch modules (`layer1.0.conv1`) or graph nodes. A node takes
/// the entry, most specific first, whose key is its name; that records the
/// functional call it came from (its scope's module is the key and it is
/// the i-th node of its family there: the i-th call of
/// [`OpStats::calls`]); whose key `KEY` names a parameter initializer it
/// reads (`KEY.weight`/`KEY.bias`); whose key is its scope's module (the module whose
/// forward the exporter recorded it in, `qsync_ir::Scope`: the legacy
/// exporter's `/blocks.0/q/MatMul` is in `blocks.0.q`); or whose key, dots
/// as slashes, its name contains (`/layer1/0/conv1/`; the longest wins).
/// Statistics are running means over the first `iterations` steps (the
/// paper uses 50).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    #[serde(default)]
    pub format: Option<String>,
    pub version: u32,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub iterations: Option<u32>,
    #[serde(default)]
    pub batch: Option<u32>,
    pub ops: BTreeMap<String, OpStats>,
}

impl Calibration {
    pub fn from_json(text: &str) -> Result<Calibration, String> {
        let c: Calibration = serde_json::from_str(text).map_err(|e| format!("not a calibration file: {e}"))?;
        if c.version != 1 {
            return Err(format!("calibration version {} is not supported (1 is)", c.version));
        }
        Ok(c)
    }

    /// The quantization ranges of the activations the statistics describe,
    /// by value name, for materialization's INT8 / FP8 scales: per matched
    /// node, its `input` statistics' largest magnitude (max(|min|, |max|))
    /// is the range of its activation input — the first float input not
    /// computed from initializers and constants alone — and, where the file
    /// has `weight` statistics, theirs the range of a weight the graph
    /// computes (a transposed initializer), when the node reads exactly one.
    /// A node matched to a functional call ([`OpStats::calls`]) gives each
    /// float input that is not an initializer the range of the operand at
    /// its position. A value read by several matched nodes keeps the
    /// largest range.
    pub fn activation_ranges(&self, g: &Graph) -> ActivationRanges {
        let mut ranges = ActivationRanges::default();
        let mut constant = HashMap::new();
        for (n, s) in match_calibration(g, self) {
            let float_ins: Vec<ValueId> = g
                .node(n)
                .inputs()
                .iter()
                .flatten()
                .copied()
                .filter(|&v| g.ty(v).dtype.is_none_or(DType::is_float))
                .collect();
            // A functional call recorded every operand: each float input
            // that needs a range takes its own.
            if !s.operands.is_empty() {
                for (&v, st) in float_ins.iter().zip(&s.operands) {
                    if needs_range(g, v) {
                        ranges.insert(g.value_name(v), st.absmax());
                    }
                }
                continue;
            }
            let derived: Vec<bool> = float_ins.iter().map(|&v| from_constants(g, v, &mut constant)).collect();
            if let (Some(st), Some(i)) = (s.input, derived.iter().position(|d| !d)) {
                ranges.insert(g.value_name(float_ins[i]), st.absmax());
            }
            let computed_weights: Vec<ValueId> = float_ins
                .iter()
                .zip(&derived)
                .filter(|&(&v, &d)| d && g.value(v).init().is_none())
                .map(|(&v, _)| v)
                .collect();
            if let (Some(st), [w]) = (s.weight, computed_weights.as_slice()) {
                ranges.insert(g.value_name(*w), st.absmax());
            }
        }
        ranges
    }
}

/// Whether `v` is computed from initializers and constants alone (a
/// weight, possibly transposed or cast), not from a graph input.
fn from_constants(g: &Graph, v: ValueId, memo: &mut HashMap<ValueId, bool>) -> bool {
    if let Some(&b) = memo.get(&v) {
        return b;
    }
    // Iterative DFS: real exports chain thousands of nodes.
    let mut stack = vec![(v, false)];
    while let Some((u, expanded)) = stack.pop() {
        if memo.contains_key(&u) {
            continue;
        }
        let Some((p, _)) = g.producer(u) else {
            memo.insert(u, g.value(u).init().is_some());
            continue;
        };
        let ins: Vec<ValueId> = g.node(p).inputs().iter().flatten().copied().collect();
        if expanded {
            let all = ins.iter().all(|i| memo.get(i).copied().unwrap_or(false));
            memo.insert(u, all);
        } else {
            stack.push((u, true));
            stack.extend(ins.into_iter().filter(|i| !memo.contains_key(i)).map(|i| (i, false)));
        }
    }
    memo.get(&v).copied().unwrap_or(false)
}

/// Where an operator's statistics came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Calibrated,
    Initializer,
    Estimated,
}

/// Everything eqs. (3)–(5) need about one operator.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpTerms {
    pub depth: u32,
    pub v: TensorStats,
    pub x: Option<TensorStats>,
    pub grad: TensorStats,
    pub weight_source: Option<Source>,
    pub activation_source: Source,
}

/// Counts of where statistics came from, for the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sources {
    pub weights_from_initializers: usize,
    pub weights_estimated: usize,
    pub activations_calibrated: usize,
    pub activations_estimated: usize,
}

/// The indicator of every operator of a graph.
#[derive(Clone, Debug)]
pub struct Indicator {
    terms: HashMap<NodeId, OpTerms>,
    model_depth: u32,
    /// γ of eq. (3); 1 unless told otherwise.
    pub gamma: f64,
    pub sources: Sources,
    /// The calibration's activation ranges (empty without one): the scales
    /// materialization writes for INT8 / FP8 activations.
    ranges: ActivationRanges,
    /// Candidates reading an activation without a range, with the first
    /// such value: never INT8 ([`Indicator::int8_allowed`]).
    uncalibrated: BTreeMap<NodeId, ValueId>,
    /// Of `uncalibrated`, the GEMM-like ones (the only ones INT8 is offered
    /// to) and the first of them in schedule order, for the warning.
    uncalibrated_gemm: usize,
    first_uncalibrated_gemm: Option<(NodeId, ValueId)>,
    gemm: usize,
}

/// ε = 2^-k of a floating-point format (k = mantissa bits − 1); 0 at FP32.
pub fn epsilon(p: Precision) -> f64 {
    match p {
        Precision::Fp32 => 0.0,
        Precision::Tf32 | Precision::Fp16 => 2f64.powi(-9),
        Precision::Bf16 => 2f64.powi(-6),
        Precision::Fp8e4m3 => 2f64.powi(-2),
        Precision::Fp8e5m2 => 2f64.powi(-1),
        Precision::Int8 => 0.0,
    }
}

/// Longest producer chain from a graph input to each node (first node: 1).
pub fn depths(g: &Graph) -> HashMap<NodeId, u32> {
    let mut d: HashMap<NodeId, u32> = HashMap::new();
    for n in g.schedule() {
        let pd = g
            .node(n)
            .inputs()
            .iter()
            .flatten()
            .filter_map(|&v| g.producer(v))
            .map(|(p, _)| d.get(&p).copied().unwrap_or(0))
            .max();
        d.insert(n, pd.unwrap_or(0) + 1);
    }
    d
}

fn is_float(g: &Graph, v: ValueId) -> bool {
    g.ty(v).dtype.is_some_and(DType::is_float)
}

/// Estimated weight statistics from the shape alone.
fn estimate_weight(g: &Graph, n: NodeId, v: ValueId, numel: f64) -> TensorStats {
    let dims: Vec<f64> = g.ty(v).shape.iter().flatten().filter_map(|d| d.as_const()).map(|d| d as f64).collect();
    let first = dims.first().copied().unwrap_or(1.0).max(1.0);
    let fan_in = match g.node(n).op {
        Op::MatMul => first,
        _ => (numel / first).max(1.0),
    };
    let std = 1.0 / fan_in.sqrt();
    TensorStats { norm2: numel * std * std, min: -3.0 * std, max: 3.0 * std, numel }
}

const ACT_ABSMAX: f64 = 4.0;
const GRAD_STD: f64 = 1e-3;

impl Indicator {
    /// Terms for every node `candidates` names. `calibration` supplies
    /// activation / gradient statistics (and may override weights).
    pub fn new(g: &Graph, facts: &GraphFacts, candidates: &[NodeId], calibration: Option<&Calibration>) -> Indicator {
        let depth = depths(g);
        let model_depth = depth.values().copied().max().unwrap_or(1);
        let calib = calibration.map(|c| match_calibration(g, c)).unwrap_or_default();
        let ranges = calibration.map(|c| c.activation_ranges(g)).unwrap_or_default();
        let (mut uncalibrated, mut uncalibrated_gemm, mut gemm) = (BTreeMap::new(), 0, 0);
        let mut first_uncalibrated_gemm = None;
        for &n in candidates {
            let is_gemm = facts.node(n).is_ok_and(|f| f.kind.is_gemm_like());
            gemm += usize::from(is_gemm);
            if let Some(v) = uncalibrated_input(g, n, &ranges) {
                uncalibrated.insert(n, v);
                if is_gemm {
                    uncalibrated_gemm += 1;
                    first_uncalibrated_gemm.get_or_insert((n, v));
                }
            }
        }
        let mut sources = Sources::default();
        let mut terms = HashMap::new();
        for &n in candidates {
            let node = g.node(n);
            let ins: Vec<ValueId> = node.inputs().iter().flatten().copied().filter(|&v| is_float(g, v)).collect();
            let act = ins.iter().copied().find(|&v| !facts.is_param(v) && g.value(v).init().is_none());
            let weight = ins.iter().copied().find(|&v| facts.is_param(v) || g.value(v).init().is_some());
            let d_v = act.and_then(|v| facts.elements(v)).unwrap_or(0.0);
            let d_out: f64 = node.outputs().iter().filter_map(|&v| facts.elements(v)).sum();
            let cal = calib.get(&n);
            let (v, activation_source) = match cal.and_then(|c| c.input) {
                Some(s) => (TensorStats { numel: if s.numel > 0.0 { s.numel } else { d_v }, ..s }, Source::Calibrated),
                None => (TensorStats { norm2: d_v, min: -ACT_ABSMAX, max: ACT_ABSMAX, numel: d_v }, Source::Estimated),
            };
            let grad = match cal.and_then(|c| c.grad_output) {
                Some(s) => TensorStats { numel: if s.numel > 0.0 { s.numel } else { d_out }, ..s },
                None => TensorStats {
                    norm2: d_out * GRAD_STD * GRAD_STD,
                    min: -4.0 * GRAD_STD,
                    max: 4.0 * GRAD_STD,
                    numel: d_out,
                },
            };
            match activation_source {
                Source::Calibrated => sources.activations_calibrated += 1,
                _ => sources.activations_estimated += 1,
            }
            let (x, weight_source) = match weight {
                None => (None, None),
                Some(w) => {
                    let numel = facts.elements(w).unwrap_or(0.0);
                    if let Some(s) = cal.and_then(|c| c.weight) {
                        (
                            Some(TensorStats { numel: if s.numel > 0.0 { s.numel } else { numel }, ..s }),
                            Some(Source::Calibrated),
                        )
                    } else if let Some(vals) = g.value(w).init().and_then(|t| t.as_f64s()) {
                        sources.weights_from_initializers += 1;
                        (Some(TensorStats::of(&vals)), Some(Source::Initializer))
                    } else {
                        sources.weights_estimated += 1;
                        (Some(estimate_weight(g, n, w, numel)), Some(Source::Estimated))
                    }
                }
            };
            terms.insert(
                n,
                OpTerms { depth: depth.get(&n).copied().unwrap_or(1), v, x, grad, weight_source, activation_source },
            );
        }
        Indicator {
            terms,
            model_depth,
            gamma: 1.0,
            sources,
            ranges,
            uncalibrated,
            uncalibrated_gemm,
            first_uncalibrated_gemm,
            gemm,
        }
    }

    /// The activation ranges materialization scales INT8 / FP8 activations
    /// by (empty without a calibration).
    pub fn activation_ranges(&self) -> &ActivationRanges {
        &self.ranges
    }

    /// Whether `n` may be INT8: every activation it would read through a
    /// QDQ pair has a calibrated range (weights scale by their own data).
    pub fn int8_allowed(&self, n: NodeId) -> bool {
        !self.uncalibrated.contains_key(&n)
    }

    /// What to tell the user, once, when GEMM-like operators are kept out
    /// of INT8 for want of activation ranges; `None` when none is.
    pub fn int8_warning(&self, g: &Graph) -> Option<String> {
        let (n, v) = self.first_uncalibrated_gemm?;
        let first = format!("first: `{}` reading `{}`", g.node(n).name, g.value_name(v));
        Some(if self.ranges.is_empty() {
            format!(
                "no calibration statistics: activations kept out of INT8 ({} GEMM-like operators kept at a float \
                 precision, {first}); pass --stats",
                self.uncalibrated_gemm
            )
        } else {
            format!(
                "{} of {} GEMM-like operators read an activation the calibration statistics have no range for \
                 ({first}): kept out of INT8",
                self.uncalibrated_gemm, self.gemm
            )
        })
    }

    /// d_L.
    pub fn model_depth(&self) -> u32 {
        self.model_depth
    }

    pub fn terms(&self, n: NodeId) -> Option<&OpTerms> {
        self.terms.get(&n)
    }

    /// (σ_fp, σ_bp) of eqs. (4)–(5).
    pub fn sigmas(&self, n: NodeId, p: Precision) -> (f64, f64) {
        let Some(t) = self.terms.get(&n) else { return (0.0, 0.0) };
        if p == Precision::Fp32 {
            return (0.0, 0.0);
        }
        let (v, g) = (&t.v, &t.grad);
        if p.is_fixed_point() {
            let qv = v.q_act();
            match &t.x {
                Some(x) => {
                    let qx = x.q_weight();
                    let e16 = epsilon(Precision::Fp16);
                    let fp = (x.norm2 * qv * qv * v.numel + v.norm2 * qx * qx * x.numel) / 6.0;
                    let bp = (g.norm2 * qv * qv * v.numel + v.norm2 * g.exp2() * e16 * e16 * g.numel) / 6.0;
                    (fp, bp)
                }
                None => (qv * qv * v.numel / 6.0, 0.0),
            }
        } else {
            let e2 = epsilon(p).powi(2);
            match &t.x {
                Some(x) => {
                    let fp = e2 * (x.norm2 * v.exp2() * v.numel + v.norm2 * x.exp2() * x.numel) / 6.0;
                    let bp = e2 * (g.norm2 * v.exp2() * v.numel + v.norm2 * g.exp2() * g.numel) / 6.0;
                    (fp, bp)
                }
                None => (e2 * v.exp2() * v.numel / 6.0, 0.0),
            }
        }
    }

    /// Ω_o^(b), eq. (3).
    pub fn omega(&self, n: NodeId, p: Precision) -> f64 {
        let Some(t) = self.terms.get(&n) else { return 0.0 };
        let (fp, bp) = self.sigmas(n, p);
        let d = f64::from(t.depth);
        self.gamma * self.gamma * d * fp + (f64::from(self.model_depth) - d).max(0.0) * bp
    }
}

/// The family of a GEMM-like operator, as the calibration records the
/// functional calls that make it (`qsync.calibrate`: `torch.matmul`,
/// `F.linear`, … are `matmul`; `F.conv2d`, … `conv`).
fn call_family(op: &Op) -> Option<&'static str> {
    match op.to_string().as_str() {
        "MatMul" | "Gemm" | "Einsum" | "MatMulInteger" => Some("matmul"),
        "Conv" | "ConvTranspose" => Some("conv"),
        _ => None,
    }
}

/// Node → its statistics (see [`Calibration`] for the matching rules).
fn match_calibration(g: &Graph, c: &Calibration) -> HashMap<NodeId, NodeStats> {
    let scoped: Vec<(String, &OpStats)> =
        c.ops.iter().map(|(k, s)| (format!("/{}/", k.replace('.', "/")), s)).collect();
    // The i-th call of a family in a module's own forward is the i-th node
    // of that family in the module's scope, in graph (the exporter's) order:
    // the order `apply_plan` matches calls in too.
    let mut calls_seen: HashMap<(String, &'static str), usize> = HashMap::new();
    let mut out = HashMap::new();
    for n in g.node_ids() {
        let node = g.node(n);
        let scope = node.scope.as_ref();
        let call = match (scope, call_family(&node.op)) {
            (Some(sc), Some(fam)) => {
                let seen = calls_seen.entry((sc.module.clone(), fam)).or_insert(0);
                let i = *seen;
                *seen += 1;
                c.ops.get(&sc.module).and_then(|s| s.calls.get(fam)).and_then(|calls| calls.get(i))
            }
            _ => None,
        };
        let by_param = || {
            node.inputs().iter().flatten().filter(|&&v| g.value(v).init().is_some()).find_map(|&v| {
                let p = g.value_name(v);
                p.strip_suffix(".weight").or_else(|| p.strip_suffix(".bias")).and_then(|k| c.ops.get(k))
            })
        };
        let by_scope = || scope.and_then(|sc| c.ops.get(&sc.module));
        let by_name = || {
            scoped.iter().filter(|(p, _)| node.name.contains(p.as_str())).max_by_key(|(p, _)| p.len()).map(|(_, s)| *s)
        };
        let stats = match (c.ops.get(&node.name), call) {
            (Some(s), _) => Some(NodeStats::module(s)),
            (None, Some(cs)) => Some(NodeStats::call(cs)),
            (None, None) => by_param().or_else(by_scope).or_else(by_name).map(NodeStats::module),
        };
        if let Some(s) = stats {
            out.insert(n, s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use qsync_cost::Bindings;

    const TWO_LAYERS: &str = r#"opset "" 17
graph "two" {
  init %w1: f32[2,2] = [1.0, -2.0, 0.5, 0.25]
  init %w2: f32[2,1] = [3.0, -1.0]
  input %x: f32[1,2]
  %h: f32[1,2] = MatMul "fc1"(%x, %w1)
  %r: f32[1,2] = Relu "relu"(%h)
  %y: f32[1,1] = MatMul "fc2"(%r, %w2)
  output %y
}
"#;

    fn setup(cal: Option<&Calibration>) -> (Graph, Indicator, NodeId, NodeId) {
        let g = qsync_ir::text::parse_graph(TWO_LAYERS).expect("parses");
        let facts = GraphFacts::new(&g, &Bindings::new()).expect("facts");
        let by = |name: &str| g.node_ids().into_iter().find(|&n| g.node(n).name == name).expect("node");
        let (fc1, fc2) = (by("fc1"), by("fc2"));
        let ind = Indicator::new(&g, &facts, &[fc1, fc2], cal);
        (g, ind, fc1, fc2)
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1e-300), "{a} != {b}");
    }

    #[test]
    fn depths_and_estimated_fp16_by_hand() {
        let (_, ind, fc1, fc2) = setup(None);
        assert_eq!(ind.model_depth(), 3);
        assert_eq!(ind.terms(fc1).map(|t| t.depth), Some(1));
        assert_eq!(ind.terms(fc2).map(|t| t.depth), Some(3));
        assert_eq!(ind.sources.weights_from_initializers, 2);
        // fc1, FP16: ε = 2^-9. v estimated: ‖v‖² = D_v = 2, absmax 4 → 2^{2e} = 16.
        // w1 = [1,-2,.5,.25]: ‖x‖² = 5.3125, absmax 2 → 2^{2e} = 4, D_x = 4.
        // ∇v: D = 2, ‖∇v‖² = 2e-6, absmax 4e-3 → e = -8, 2^{2e} = 2^-16.
        let e2 = 2f64.powi(-18);
        let fp = e2 * (5.3125 * 16.0 * 2.0 + 2.0 * 4.0 * 4.0) / 6.0;
        let bp = e2 * (2e-6 * 16.0 * 2.0 + 2.0 * 2f64.powi(-16) * 2.0) / 6.0;
        close(ind.omega(fc1, Precision::Fp16), 1.0 * fp + 2.0 * bp);
        // fc2 is the deepest: no backward term.
        let fp2 = e2 * (10.0 * 16.0 * 2.0 + 2.0 * 4.0 * 2.0) / 6.0;
        close(ind.omega(fc2, Precision::Fp16), 3.0 * fp2);
        assert_eq!(ind.omega(fc1, Precision::Fp32), 0.0);
    }

    #[test]
    fn calibrated_int8_by_hand() {
        let mut ops = BTreeMap::new();
        ops.insert(
            "fc1".to_string(),
            OpStats {
                input: Some(TensorStats { norm2: 2.0, min: -1.0, max: 1.55, numel: 0.0 }),
                weight: None,
                grad_output: Some(TensorStats { norm2: 0.5, min: -0.5, max: 0.25, numel: 2.0 }),
                ..Default::default()
            },
        );
        let cal = Calibration { version: 1, ops, ..Default::default() };
        let (_, ind, fc1, _) = setup(Some(&cal));
        assert_eq!(ind.sources.activations_calibrated, 1);
        let qv = 2.55 / 255.0; // 0.01
        let qx = 2.0 / 127.0;
        let fp = (5.3125 * qv * qv * 2.0 + 2.0 * qx * qx * 4.0) / 6.0;
        // ∇v absmax 0.5 → e = -1 → 2^{2e} = 1/4; ε₁₆² = 2^-18.
        let bp = (0.5 * qv * qv * 2.0 + 2.0 * 0.25 * 2f64.powi(-18) * 2.0) / 6.0;
        close(ind.omega(fc1, Precision::Int8), fp + 2.0 * bp);
        assert!(ind.omega(fc1, Precision::Int8) > ind.omega(fc1, Precision::Fp16));
    }

    /// INT8 activation ranges by hand: fc1's input statistics (min -1,
    /// max 1.55) give its activation %x the range max(1, 1.55) = 1.55, so
    /// materialization scales it by 1.55 / 127; fc2 has no statistics, so
    /// its activation %r has no range and fc2 is never offered INT8. Without
    /// a calibration no candidate is.
    #[test]
    fn activation_ranges_gate_int8_by_hand() {
        let mut ops = BTreeMap::new();
        let input = Some(TensorStats { norm2: 2.0, min: -1.0, max: 1.55, numel: 0.0 });
        ops.insert("fc1".to_string(), OpStats { input, ..Default::default() });
        let cal = Calibration { version: 1, ops, ..Default::default() };
        let (g, ind, fc1, fc2) = setup(Some(&cal));
        let r = ind.activation_ranges();
        assert_eq!((r.len(), r.get("x")), (1, Some(1.55)));
        assert!(ind.int8_allowed(fc1));
        assert!(!ind.int8_allowed(fc2));
        let w = ind.int8_warning(&g).expect("fc2 is kept out");
        assert!(w.contains("1 of 2 GEMM-like") && w.contains("`fc2` reading `r`"), "{w}");

        let (g, ind, fc1, fc2) = setup(None);
        assert!(ind.activation_ranges().is_empty());
        assert!(!ind.int8_allowed(fc1) && !ind.int8_allowed(fc2));
        let w = ind.int8_warning(&g).expect("no statistics");
        assert!(w.starts_with("no calibration statistics: activations kept out of INT8 (2 GEMM-like"), "{w}");
        assert!(w.ends_with("pass --stats"), "{w}");
    }

    /// A weight the graph computes (Transpose of an initializer) has no
    /// values of its own at materialization: it takes the `weight`
    /// statistics' range (max(|-3|, 2) = 3), the activation the `input`'s.
    #[test]
    fn computed_weights_take_the_weight_statistics() {
        let g = qsync_ir::text::parse_graph(
            r#"opset "" 17
graph "t" {
  init %w: f32[2,2] = [1.0, -3.0, 0.5, 2.0]
  input %x: f32[1,2]
  %wt: f32[2,2] = Transpose "fc.t"(%w)
  %y: f32[1,2] = MatMul "fc"(%x, %wt)
  output %y
}
"#,
        )
        .expect("parses");
        let st = |lo: f64, hi: f64| Some(TensorStats { norm2: 1.0, min: lo, max: hi, numel: 0.0 });
        let mut ops = BTreeMap::new();
        ops.insert("fc".to_string(), OpStats { input: st(-0.25, 0.5), weight: st(-3.0, 2.0), ..Default::default() });
        let r = Calibration { version: 1, ops, ..Default::default() }.activation_ranges(&g);
        assert_eq!((r.get("x"), r.get("wt"), r.get("w")), (Some(0.5), Some(3.0), None));
    }

    /// The legacy exporter's transformer block, by hand: the Linear `q`'s
    /// nodes are in scope `blocks.0.q` (`/blocks.0/q/MatMul`: the module
    /// path keeps the ModuleList's dot, so no `/blocks/0/q/` in the name),
    /// and the attention's two `torch.matmul`s are `blocks.0`'s own calls,
    /// recorded in order under `calls.matmul`. Ranges: x ← q's input
    /// max(|-0.25|, 0.5) = 0.5; wt ← q's weight max(|-3|, 2) = 3; the first
    /// call reads (q, kt): 1.5 and 2; the second (p, q): 0.75 and 1.25, and
    /// q keeps the larger, 1.5. Every MatMul may then be INT8.
    #[test]
    fn scoped_modules_and_functional_calls_by_hand() {
        let mut g = qsync_ir::text::parse_graph(
            r#"opset "" 17
graph "block" {
  init %wq: f32[2,2] = [1.0, -3.0, 0.5, 2.0]
  input %x: f32[2,2]
  %wt: f32[2,2] = Transpose "/blocks.0/q/Transpose"(%wq)
  %q: f32[2,2] = MatMul "/blocks.0/q/MatMul"(%x, %wt)
  %kt: f32[2,2] = Transpose "/blocks.0/Transpose"(%q)
  %s: f32[2,2] = MatMul "/blocks.0/MatMul"(%q, %kt)
  %p: f32[2,2] = Softmax "/blocks.0/Softmax"(%s)
  %o: f32[2,2] = MatMul "/blocks.0/MatMul_1"(%p, %q)
  output %o
}
"#,
        )
        .expect("parses");
        // What the ONNX importer records for these names.
        for n in g.node_ids() {
            let name = g.node(n).name.clone();
            let module = if name.starts_with("/blocks.0/q/") { "blocks.0.q" } else { "blocks.0" };
            let call = name.rsplit('/').next().unwrap_or_default().to_string();
            g.node_mut(n).scope = Some(qsync_ir::Scope { module: module.into(), call });
        }
        let st = |lo: f64, hi: f64| format!(r#"{{"norm2": 1, "min": {lo}, "max": {hi}, "numel": 4}}"#);
        let text = format!(
            r#"{{"version": 1, "ops": {{
                "blocks.0.q": {{"input": {}, "weight": {}}},
                "blocks.0": {{"calls": {{"matmul": [{{"inputs": [{}, {}]}}, {{"inputs": [{}, {}], "grad_output": {}}}]}}}}}}}}"#,
            st(-0.25, 0.5),
            st(-3.0, 2.0),
            st(-1.5, 1.0),
            st(-2.0, 0.5),
            st(0.0, 0.75),
            st(-1.25, 1.0),
            st(-0.5, 0.25)
        );
        let cal = Calibration::from_json(&text).expect("parses");
        let r = cal.activation_ranges(&g);
        let got: Vec<(&str, f64)> = r.iter().collect::<BTreeMap<_, _>>().into_iter().collect();
        assert_eq!(got, vec![("kt", 2.0), ("p", 0.75), ("q", 1.5), ("wt", 3.0), ("x", 0.5)]);

        let facts = GraphFacts::new(&g, &Bindings::new()).expect("facts");
        let mm: Vec<NodeId> = g.node_ids().into_iter().filter(|&n| g.node(n).op.to_string() == "MatMul").collect();
        assert_eq!(mm.len(), 3);
        let ind = Indicator::new(&g, &facts, &mm, Some(&cal));
        assert!(mm.iter().all(|&n| ind.int8_allowed(n)));
        assert_eq!(ind.int8_warning(&g), None);
        assert_eq!(ind.sources.activations_calibrated, 3);
        // The second call's statistics are its node's: v = p's, ∇v its own.
        let t = ind.terms(mm[2]).expect("terms");
        assert_eq!((t.v.min, t.v.max, t.grad.min, t.grad.max), (0.0, 0.75, -0.5, 0.25));
    }

    #[test]
    fn calibration_json_parses_and_matches_module_names() {
        let text = r#"{"version": 1, "ops": {"fc1": {"input": {"norm2": 1, "min": 0, "max": 1}}}}"#;
        let c = Calibration::from_json(text).expect("parses");
        assert!(c.ops["fc1"].input.is_some());
        assert!(Calibration::from_json(r#"{"version": 9, "ops": {}}"#).is_err());
    }
}
