//! Planning figures for `qsyncc opt` (its summary and `--json`): nodes by
//! op and precision, casts, weight casts, the share of FLOPs planned below
//! FP32 and the predicted time.

use std::collections::HashSet;

use qsync_ir::infer::InferOptions;
use qsync_ir::{DType, Dim, Graph, Op};
use serde::Serialize;

use crate::inspect::node_flops;

/// Symbolic dims are valued at this when a FLOP ratio needs numbers.
const SYMBOLIC_DIM: i64 = 8;

#[derive(Serialize, Debug)]
pub struct Figures {
    /// Nodes in the result.
    nodes: usize,
    /// Nodes per op type and, within each, per planned precision (`fp16`,
    /// …; `-` for nodes without a plan annotation).
    ops: std::collections::BTreeMap<String, std::collections::BTreeMap<String, usize>>,
    /// Cast nodes in the result.
    casts: usize,
    /// Result minus input.
    casts_added: i64,
    /// Of the added casts, those reading an initializer (per-iteration casts
    /// of FP32 master weights).
    weight_casts: usize,
    /// Refreshed weight copies in the result: trained weights the graph
    /// reads as stored low-precision copies that the optimizer step
    /// rewrites, instead of casting them every iteration.
    refreshed_copies: usize,
    /// FLOPs of nodes planned below FP32 over all FLOPs (symbolic dims at
    /// 8); null when a node's FLOP count does not fit a 64-bit integer.
    low_precision_flop_fraction: Option<f64>,
    /// Nodes per planned precision (`fp32`, `fp16`, `bf16`, `int8`, …: the
    /// names of the planner and `simulate`).
    precisions: std::collections::BTreeMap<String, usize>,
    target: Option<String>,
    mode: String,
    /// `{ "forward", "backward", "refresh", "total" }` milliseconds of one
    /// training iteration on the target, from the cost model
    /// (`qsync_passes::precision::CostModelOracle::predict`: every node at
    /// its planned precision, every Cast with its gradient's cast back,
    /// `refresh` the optimizer step's rewrite of refreshed weight copies;
    /// symbolic dims from `--batch` / `--dim`, else batch 32, others 128).
    /// Null without `--target`.
    predicted_ms: Option<PredictedMs>,
}

#[derive(Serialize, Debug, Clone, Copy)]
pub struct PredictedMs {
    pub forward: f64,
    pub backward: f64,
    /// Optimizer-step time rewriting refreshed weight copies.
    pub refresh: f64,
    pub total: f64,
}

/// `g` with each op between QDQ pairs reading the pairs' inputs and
/// annotated with their quantized dtype: QDQ around an op is its INT8 /
/// FP8 compute (how materialize writes it), whose quantization the cost
/// model charges inside the op. `g` itself when it has no QDQ.
fn quantized_ops(g: &Graph) -> std::borrow::Cow<'_, Graph> {
    if g.node_ids().iter().any(|&n| g.node(n).op == Op::DequantizeLinear) {
        let mut c = g.clone();
        qsync_passes::precision::materialize::unmaterialize_qdq(&mut c);
        std::borrow::Cow::Owned(c)
    } else {
        std::borrow::Cow::Borrowed(g)
    }
}

/// The cost model's prediction for `g` on `target`.
pub fn predict(g: &Graph, target: &str, opts: &InferOptions) -> Option<PredictedMs> {
    use qsync_passes::precision::CostOracle;
    let g = &*quantized_ops(g);
    let oracle = qsync_passes::precision::CostModelOracle::for_target(target, opts).ok()?;
    let p = oracle.predict(g);
    let r = |x: f64| (x * 1e6).round() / 1e3;
    Some(PredictedMs { forward: r(p.forward), backward: r(p.backward), refresh: r(p.refresh), total: r(p.total()) })
}

fn cast_names(g: &Graph) -> HashSet<String> {
    g.node_ids().into_iter().filter(|&n| g.node(n).op == Op::Cast).map(|n| g.node(n).name.clone()).collect()
}

fn cast_count(g: &Graph) -> usize {
    g.node_ids().into_iter().filter(|&n| g.node(n).op == Op::Cast).count()
}

/// A FLOP count with symbolic dims at [`SYMBOLIC_DIM`]; `None` when it
/// does not fit (a count that overflowed is unknown, not zero).
fn value(d: &Dim) -> Option<f64> {
    d.substitute(&|_| Some(Dim::from(SYMBOLIC_DIM))).as_const().map(|v| v as f64)
}

/// A dtype by the precision names of the planner and `simulate` (`fp16`,
/// `int8`), the IR's name for dtypes that are no plan precision.
fn precision_name(d: DType) -> String {
    qsync_cost::Precision::from_dtype(d).map_or_else(|| d.to_string(), |p| p.to_string())
}

pub fn figures(input: &Graph, result: &Graph, target: Option<&str>, mode: &str, opts: &InferOptions) -> Figures {
    let before = cast_names(input);
    let added: Vec<_> = result
        .node_ids()
        .into_iter()
        .filter(|&n| result.node(n).op == Op::Cast && !before.contains(&result.node(n).name))
        .collect();
    let weight_casts =
        added.iter().filter(|&&n| result.node(n).input(0).is_some_and(|v| result.value(v).init().is_some())).count();
    let (mut low, mut total) = (Some(0.0), Some(0.0));
    let mut precisions = std::collections::BTreeMap::new();
    let mut ops: std::collections::BTreeMap<String, std::collections::BTreeMap<String, usize>> = Default::default();
    for n in result.node_ids() {
        let f = node_flops(result, n).map_or(Some(0.0), |d| value(&d));
        total = total.zip(f).map(|(t, f)| t + f);
        let p = result.node(n).precision;
        *ops.entry(result.node(n).op.op_type().to_string())
            .or_default()
            .entry(p.map_or_else(|| "-".to_string(), precision_name))
            .or_insert(0) += 1;
        if let Some(p) = p {
            *precisions.entry(precision_name(p)).or_insert(0) += 1;
            if p != DType::F32 && p != DType::F64 {
                low = low.zip(f).map(|(l, f)| l + f);
            }
        }
    }
    Figures {
        nodes: result.node_count(),
        ops,
        casts: cast_count(result),
        casts_added: cast_count(result) as i64 - cast_count(input) as i64,
        weight_casts,
        refreshed_copies: result.refreshed_copies().count(),
        low_precision_flop_fraction: low.zip(total).map(|(l, t)| if t > 0.0 { l / t } else { 0.0 }),
        precisions,
        target: target.map(str::to_string),
        mode: mode.to_string(),
        predicted_ms: target.and_then(|t| predict(result, t, opts)),
    }
}

/// What `qsyncc inspect` shows of a planned model: the same figures as
/// `opt --json`, read from the graph alone (a node computes at its plan
/// annotation, or at the dtype of its first float output once exported; an
/// op between QDQ pairs at their quantized dtype).
#[derive(Serialize, Debug)]
pub struct Planned {
    pub casts: usize,
    /// Casts reading an initializer (per-iteration casts of master weights).
    pub weight_casts: usize,
    /// Refreshed weight copies (rewritten by the optimizer step).
    pub refreshed_copies: usize,
    /// Null when a node's FLOP count does not fit a 64-bit integer.
    pub low_precision_flop_fraction: Option<f64>,
    pub predicted_ms: Option<PredictedMs>,
}

/// `None` when the graph has no casts, no low-precision node and no target.
pub fn planned(g: &Graph, target: Option<&str>, opts: &InferOptions) -> Option<Planned> {
    let g = &*quantized_ops(g);
    let casts: Vec<_> = g.node_ids().into_iter().filter(|&n| g.node(n).op == Op::Cast).collect();
    let weight_casts =
        casts.iter().filter(|&&n| g.node(n).input(0).is_some_and(|v| g.value(v).init().is_some())).count();
    let (mut low, mut total) = (Some(0.0), Some(0.0));
    for n in g.node_ids() {
        if g.node(n).op == Op::Cast {
            continue;
        }
        let f = node_flops(g, n).map_or(Some(0.0), |d| value(&d));
        total = total.zip(f).map(|(t, f)| t + f);
        let p = qsync_passes::precision::oracle::compute_precision(g, n);
        if p != DType::F32 && p != DType::F64 {
            low = low.zip(f).map(|(l, f)| l + f);
        }
    }
    if casts.is_empty() && low == Some(0.0) && target.is_none() && g.refreshed_copies().next().is_none() {
        return None;
    }
    Some(Planned {
        casts: casts.len(),
        weight_casts,
        refreshed_copies: g.refreshed_copies().count(),
        low_precision_flop_fraction: low.zip(total).map(|(l, t)| if t > 0.0 { l / t } else { 0.0 }),
        predicted_ms: target.and_then(|t| predict(g, t, opts)),
    })
}

/// `qsyncc opt`'s summary: what the passes left, without the IR.
pub fn summary_text(model: &std::path::Path, f: &Figures) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(o, "model       {}", model.display());
    let _ = writeln!(o, "nodes       {}", f.nodes);
    let _ = writeln!(o, "ops         (count by planned precision; `-`: no plan annotation)");
    for (op, by) in &f.ops {
        let total: usize = by.values().sum();
        let parts: Vec<String> = by.iter().map(|(p, n)| format!("{p} {n}")).collect();
        let _ = writeln!(o, "  {op:<22} {total:>6}  {}", parts.join(", "));
    }
    let _ = writeln!(
        o,
        "casts       {} ({:+} by the passes, {} of weights); {} refreshed weight copies",
        f.casts, f.casts_added, f.weight_casts, f.refreshed_copies
    );
    match f.low_precision_flop_fraction {
        Some(x) => {
            let _ = writeln!(o, "low-precision FLOPs  {x:.4} of all");
        }
        None => {
            let _ = writeln!(o, "low-precision FLOPs  unknown (a FLOP count overflows 64 bits at this batch)");
        }
    }
    match (&f.target, &f.predicted_ms) {
        (Some(t), Some(ms)) => {
            let _ = writeln!(
                o,
                "predicted   {:.3} ms forward + {:.3} ms backward + {:.3} ms refresh = {:.3} ms per iteration on {t} ({})",
                ms.forward, ms.backward, ms.refresh, ms.total, f.mode
            );
        }
        (Some(t), None) => {
            let _ = writeln!(o, "predicted   no prediction for {t}");
        }
        (None, _) => {
            let _ = writeln!(o, "predicted   (give --target DEVICE for the predicted iteration time)");
        }
    }
    let _ =
        writeln!(o, "(the model itself: -o FILE.onnx, -o FILE.qir, or -o - / --print-ir for the text IR on stdout)");
    o
}
