//! Planning figures for `qsyncc opt --json`: casts, weight casts and the
//! share of FLOPs planned below FP32.

use std::collections::HashSet;

use qsync_ir::infer::InferOptions;
use qsync_ir::{DType, Dim, Graph, Op};
use serde::Serialize;

use crate::inspect::node_flops;

/// Symbolic dims are valued at this when a FLOP ratio needs numbers.
const SYMBOLIC_DIM: i64 = 8;

#[derive(Serialize, Debug)]
pub struct Figures {
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
    /// FLOPs of nodes planned below FP32 over all FLOPs (symbolic dims at 8).
    low_precision_flop_fraction: f64,
    /// Nodes per planned precision.
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

fn value(d: &Dim) -> f64 {
    d.substitute(&|_| Some(Dim::from(SYMBOLIC_DIM))).as_const().unwrap_or(0) as f64
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
    let (mut low, mut total) = (0.0, 0.0);
    let mut precisions = std::collections::BTreeMap::new();
    for n in result.node_ids() {
        let f = node_flops(result, n).map_or(0.0, |d| value(&d));
        total += f;
        if let Some(p) = result.node(n).precision {
            *precisions.entry(p.to_string()).or_insert(0) += 1;
            if p != DType::F32 && p != DType::F64 {
                low += f;
            }
        }
    }
    Figures {
        casts: cast_count(result),
        casts_added: cast_count(result) as i64 - cast_count(input) as i64,
        weight_casts,
        refreshed_copies: result.refreshed_copies().count(),
        low_precision_flop_fraction: if total > 0.0 { low / total } else { 0.0 },
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
    pub low_precision_flop_fraction: f64,
    pub predicted_ms: Option<PredictedMs>,
}

/// `None` when the graph has no casts, no low-precision node and no target.
pub fn planned(g: &Graph, target: Option<&str>, opts: &InferOptions) -> Option<Planned> {
    let g = &*quantized_ops(g);
    let casts: Vec<_> = g.node_ids().into_iter().filter(|&n| g.node(n).op == Op::Cast).collect();
    let weight_casts =
        casts.iter().filter(|&&n| g.node(n).input(0).is_some_and(|v| g.value(v).init().is_some())).count();
    let (mut low, mut total) = (0.0, 0.0);
    for n in g.node_ids() {
        if g.node(n).op == Op::Cast {
            continue;
        }
        let f = node_flops(g, n).map_or(0.0, |d| value(&d));
        total += f;
        let p = qsync_passes::precision::oracle::compute_precision(g, n);
        if p != DType::F32 && p != DType::F64 {
            low += f;
        }
    }
    if casts.is_empty() && low == 0.0 && target.is_none() && g.refreshed_copies().next().is_none() {
        return None;
    }
    Some(Planned {
        casts: casts.len(),
        weight_casts,
        refreshed_copies: g.refreshed_copies().count(),
        low_precision_flop_fraction: if total > 0.0 { low / total } else { 0.0 },
        predicted_ms: target.and_then(|t| predict(g, t, opts)),
    })
}
