//! Our start: the fastest plan of an inference type under its memory cap,
//! over classes of structurally identical operators (a multiple-choice
//! knapsack, exhaustive or DP), checked by the predictor.

use std::collections::HashMap;

use qsync_cost::{CostModel, GraphFacts, Plan, Precision};
use qsync_ir::{Graph, NodeId};

use crate::context::Ctx;
use crate::types::{AllocOptions, PlanError};

/// A structural signature: op, attributes and input / output types.
fn signature(g: &Graph, n: NodeId) -> String {
    let node = g.node(n);
    let ins: Vec<String> =
        node.inputs().iter().map(|v| v.map_or("-".to_string(), |v| format!("{:?}", g.ty(v)))).collect();
    let outs: Vec<String> = node.outputs().iter().map(|&v| format!("{:?}", g.ty(v))).collect();
    format!("{:?}|{:?}|{}|{}", node.op, node.attrs, ins.join(","), outs.join(","))
}

/// Classes of structurally identical candidates, in first-appearance order.
pub fn classes(g: &Graph, candidates: &[NodeId]) -> Vec<Vec<NodeId>> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<Vec<NodeId>> = Vec::new();
    for &n in candidates {
        let s = signature(g, n);
        let i = *index.entry(s).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[i].push(n);
    }
    out
}

/// Linear memory estimate of a node at `p` (activation copy + weight copy).
fn node_memory(facts: &GraphFacts, n: NodeId, p: Precision) -> f64 {
    let Ok(f) = facts.node(n) else { return 0.0 };
    let low_w = if p.bits() < 32 && p != Precision::Tf32 { f.weight * p.bytes() } else { 0.0 };
    f.act_in * p.bytes() + low_w
}

/// The fastest class-uniform plan of type `t` under its memory cap.
pub(super) fn fastest_start(
    cx: &Ctx<'_>,
    t: usize,
    cls: &[Vec<NodeId>],
    current: &[Plan],
    opts: &AllocOptions,
) -> Result<Option<Plan>, PlanError> {
    let Some(levels) = cx.levels[t].clone() else { return Ok(None) };
    let model = CostModel::new(&cx.targets[t].device, cx.targets[t].calibration.as_ref())?;
    // Per class and level: (time, memory) of its members.
    let mut items: Vec<Vec<(Precision, f64, f64)>> = Vec::new();
    for c in cls {
        let mut opts_c = Vec::new();
        for &p in &levels {
            let (mut time, mut mem) = (0.0, 0.0);
            for &n in c {
                let q = cx.at_level(t, n, p);
                time += model.op_cost(cx.facts, n, q)?.total();
                mem += node_memory(cx.facts, n, q);
            }
            if !opts_c.iter().any(|&(_, tt, mm)| tt == time && mm == mem) {
                opts_c.push((p, time, mem));
            }
        }
        items.push(opts_c);
    }
    // Memory the candidates do not control, from the FP32 plan.
    let mut fp32 = current.to_vec();
    fp32[t] = cx.uniform(t, Precision::Fp32);
    let mut pred = cx.predictor(&fp32)?;
    let total_fp32 = pred.memory(t).map_or(0.0, |m| m.total);
    let capacity = pred.memory(t).map_or(0.0, |m| m.capacity);
    let _ = pred.result();
    let cand_fp32: f64 = items.iter().map(|o| o[0].2).sum();
    let fixed = total_fp32 - cand_fp32;
    let mut budget = capacity - fixed;
    for _ in 0..6 {
        let Some(choice) = knapsack(&items, budget, opts.exhaustive_limit) else { return Ok(None) };
        let mut plan = Plan::new();
        for (c, &k) in cls.iter().zip(&choice) {
            for &n in c {
                plan.set(n, cx.at_level(t, n, items_p(&items, c, cls, k)));
            }
        }
        let mut plans = current.to_vec();
        plans[t] = plan.clone();
        let mut pred = cx.predictor(&plans)?;
        let m = pred.memory(t).copied().unwrap_or_default();
        if pred.result().devices[t].fits {
            return Ok(Some(plan));
        }
        budget -= (m.total - m.capacity).max(0.0) * 1.1 + 1.0;
    }
    Ok(None)
}

fn items_p(items: &[Vec<(Precision, f64, f64)>], c: &[NodeId], cls: &[Vec<NodeId>], k: usize) -> Precision {
    let i = cls.iter().position(|x| x.as_slice() == c).unwrap_or(0);
    items[i][k].0
}

/// Multiple-choice knapsack: one option per class, minimise time with
/// memory ≤ budget. Exhaustive when the combinations are few, else DP over
/// memory discretised into 1024 steps (rounded up, so the DP never overshoots
/// its own estimate).
fn knapsack(items: &[Vec<(Precision, f64, f64)>], budget: f64, exhaustive_limit: u64) -> Option<Vec<usize>> {
    if budget < 0.0 {
        return None;
    }
    let combos = items.iter().try_fold(1u64, |a, o| a.checked_mul(o.len() as u64)).unwrap_or(u64::MAX);
    if combos <= exhaustive_limit {
        let mut best: Option<(f64, Vec<usize>)> = None;
        let mut idx = vec![0usize; items.len()];
        for _ in 0..combos {
            let (time, mem): (f64, f64) =
                idx.iter().zip(items).fold((0.0, 0.0), |(a, b), (&k, o)| (a + o[k].1, b + o[k].2));
            if mem <= budget && best.as_ref().is_none_or(|(bt, _)| time < *bt) {
                best = Some((time, idx.clone()));
            }
            for (i, o) in idx.iter_mut().zip(items) {
                *i += 1;
                if *i < o.len() {
                    break;
                }
                *i = 0;
            }
        }
        return best.map(|(_, c)| c);
    }
    const STEPS: usize = 1024;
    let unit = (budget / STEPS as f64).max(1.0);
    let cells = (budget / unit).floor() as usize;
    let inf = f64::INFINITY;
    let mut dp = vec![0.0f64; cells + 1];
    let mut choice: Vec<Vec<u8>> = Vec::with_capacity(items.len());
    for o in items {
        let mut next = vec![inf; cells + 1];
        let mut ch = vec![u8::MAX; cells + 1];
        for (k, &(_, time, mem)) in o.iter().enumerate() {
            let w = (mem / unit).ceil() as usize;
            for m in w..=cells {
                let v = dp[m - w] + time;
                if v < next[m] {
                    next[m] = v;
                    ch[m] = k as u8;
                }
            }
        }
        dp = next;
        choice.push(ch);
    }
    if !dp[cells].is_finite() {
        return None;
    }
    // Walk back.
    let mut m = cells;
    let mut out = vec![0usize; items.len()];
    for i in (0..items.len()).rev() {
        let k = choice[i][m];
        if k == u8::MAX {
            return None;
        }
        out[i] = k as usize;
        m -= (items[i][k as usize].2 / unit).ceil() as usize;
    }
    Some(out)
}
