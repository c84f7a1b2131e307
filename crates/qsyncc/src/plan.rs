//! Planning figures for `qsyncc opt --json`: casts, weight casts and the
//! share of FLOPs planned below FP32.

use std::collections::HashSet;

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
    /// FLOPs of nodes planned below FP32 over all FLOPs (symbolic dims at 8).
    low_precision_flop_fraction: f64,
    /// Nodes per planned precision.
    precisions: std::collections::BTreeMap<String, usize>,
    target: Option<String>,
    mode: String,
    /// COST MODEL HOOK: `{ "forward": ms, "backward": ms }` on the target,
    /// filled in when `crates/cost` implements `qsync_passes::precision::CostOracle`.
    /// Always null until then.
    predicted_ms: Option<serde_json::Value>,
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

pub fn figures(input: &Graph, result: &Graph, target: Option<&str>, mode: &str) -> Figures {
    let before = cast_names(input);
    let added: Vec<_> = result
        .node_ids()
        .into_iter()
        .filter(|&n| result.node(n).op == Op::Cast && !before.contains(&result.node(n).name))
        .collect();
    let weight_casts = added.iter().filter(|&&n| result.node(n).input(0).is_some_and(|v| result.value(v).init().is_some())).count();
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
        low_precision_flop_fraction: if total > 0.0 { low / total } else { 0.0 },
        precisions,
        target: target.map(str::to_string),
        mode: mode.to_string(),
        predicted_ms: None,
    }
}
