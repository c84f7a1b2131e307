//! Local plan costing shared by `campo` and `comp`: the change in predicted
//! time when a set of nodes changes precision, casts included, without
//! materializing.
//!
//! **Reads:** a precision assignment (a map over lowerable nodes; absent =
//! the dtype the graph has), value types, and a [`CostOracle`].
//! **Guarantees:** casts are counted as materialization makes them — one per
//! (value, dtype) shared by every consumer; graph outputs cast back to their
//! dtype; pinned slots and Shape / Cast inputs demand nothing — each costing
//! its forward conversion plus, unless the value is a graph input, the
//! gradient's conversion back (training semantics).
//! **Requires:** `infer-shapes`.

use std::collections::{BTreeSet, HashMap};

use qsync_ir::{DType, Graph, NodeId, Op, ValueId};

use super::materialize::{is_quantized, lowerable, pinned_input, pinned_output};
use super::CostOracle;

/// A tentative plan: compute precision per lowerable node.
pub type Assignment = HashMap<NodeId, DType>;

fn any_dtype_input(op: &Op) -> bool {
    matches!(op, Op::Shape | Op::Size | Op::Cast | Op::CastLike)
}

/// The dtype value `v` holds under `a`.
pub fn value_dtype(g: &Graph, a: &Assignment, v: ValueId) -> Option<DType> {
    let d = g.ty(v).dtype?;
    if !d.is_float() {
        return Some(d);
    }
    match g.producer(v) {
        // A quantized (QDQ) node computes around an FP32 op: its output is FP32.
        Some((p, slot)) if !pinned_output(&g.node(p).op, slot) => {
            Some(a.get(&p).copied().map_or(d, |q| if is_quantized(q) { DType::F32 } else { q }))
        }
        _ => Some(d),
    }
}

/// The dtypes `v`'s consumers (and the graph outputs) demand under `a`.
fn demands(g: &Graph, a: &Assignment, v: ValueId) -> BTreeSet<DType> {
    let Some(orig) = g.ty(v).dtype.filter(|d| d.is_float()) else { return BTreeSet::new() };
    let mut out = BTreeSet::new();
    for (c, slot) in g.users(v) {
        let op = &g.node(c).op;
        if slot == 0 && any_dtype_input(op) {
            continue;
        }
        let p = a.get(&c).copied().filter(|_| !pinned_input(op, slot)).unwrap_or(orig);
        out.insert(p);
    }
    if g.outputs().contains(&v) {
        out.insert(orig);
    }
    out
}

/// How planners price trained weights: a parameter in `refreshed` is read
/// at f16/bf16 through a refreshed copy (as `egraph-casts` stores it:
/// `refresh-copy`), so its low conversion costs the optimizer step's
/// rewrite ([`CostOracle::refresh_time`]) and is not a cast; any other
/// value's conversions are casts, forward and gradient.
#[derive(Clone, Debug, Default)]
pub struct WeightPricing {
    pub refreshed: BTreeSet<ValueId>,
}

impl WeightPricing {
    /// Per-iteration casts everywhere (inference, or `refresh=off`).
    pub fn casts() -> WeightPricing {
        WeightPricing::default()
    }

    /// For training `g`: the trained FP32 parameters whose every reader
    /// keeps its input for the backward (`qsync_cost::facts::keeps_input`),
    /// so a refreshed copy adds no peak memory over a per-iteration cast.
    /// (`egraph-casts` may also store others within the memory headroom;
    /// planning does not count on those.)
    pub fn training(g: &Graph) -> WeightPricing {
        let grads = crate::egraph::gradient_values(g, false);
        let refreshed = g
            .inits()
            .iter()
            .copied()
            .filter(|&w| {
                crate::egraph::pass::refresh_candidate(g, w, &grads)
                    && g.users(w)
                        .into_iter()
                        .all(|(n, slot)| qsync_cost::facts::keeps_input(g, n, slot, |v| grads.contains(&v)))
            })
            .collect();
        WeightPricing { refreshed }
    }

    fn refreshes(&self, v: ValueId, have: DType, to: DType) -> bool {
        have == DType::F32 && matches!(to, DType::F16 | DType::BF16) && self.refreshed.contains(&v)
    }
}

/// The float conversions (casts) value `v` needs under `a`, as materialization
/// makes them: one per demanded float dtype; a quantized demand (a QDQ pair)
/// reads the FP32 copy, so it needs a cast to FP32 when `v` is not FP32.
fn cast_targets(g: &Graph, a: &Assignment, v: ValueId) -> (Option<DType>, BTreeSet<DType>, BTreeSet<DType>) {
    let Some(have) = value_dtype(g, a, v).filter(|d| d.is_float()) else {
        return (None, BTreeSet::new(), BTreeSet::new());
    };
    let ds = demands(g, a, v);
    let qdq: BTreeSet<DType> = ds.iter().copied().filter(|&d| is_quantized(d)).collect();
    let mut casts: BTreeSet<DType> =
        ds.into_iter().filter(|&d| !is_quantized(d) && d.is_float() && d != have).collect();
    if !qdq.is_empty() && have != DType::F32 {
        casts.insert(DType::F32);
    }
    (Some(have), casts, qdq)
}

/// Seconds of the casts (and QDQ pairs) value `v` needs under `a`: each
/// cast's forward conversion plus, unless `v` is a graph input, the
/// gradient's conversion back; each QDQ pair's quantize and dequantize
/// (forward) and the straight-through gradient's pass back.
pub fn value_cast_cost(g: &Graph, a: &Assignment, v: ValueId, oracle: &dyn CostOracle, w: &WeightPricing) -> f64 {
    let (Some(have), casts, qdq) = cast_targets(g, a, v) else { return 0.0 };
    let e = oracle.elements(g, v);
    let back = !g.inputs().contains(&v);
    let c: f64 = casts
        .into_iter()
        .map(|d| {
            if w.refreshes(v, have, d) {
                return oracle.refresh_time(d, e);
            }
            oracle.cast_time(have, d, e) + if back { oracle.cast_time(d, have, e) } else { 0.0 }
        })
        .sum();
    let q: f64 = qdq
        .into_iter()
        .map(|d| {
            let pair = oracle.cast_time(DType::F32, d, e) + oracle.cast_time(d, DType::F32, e);
            pair + if back { pair } else { 0.0 }
        })
        .sum();
    c + q
}

/// Number of casts value `v` needs under `a` (QDQ pairs and refreshed
/// copies are not casts).
pub fn value_cast_count(g: &Graph, a: &Assignment, v: ValueId, w: &WeightPricing) -> usize {
    let (have, casts, _) = cast_targets(g, a, v);
    casts.into_iter().filter(|&d| !have.is_some_and(|h| w.refreshes(v, h, d))).count()
}

/// Float values a node reads or writes.
pub fn touched_values(g: &Graph, n: NodeId, out: &mut BTreeSet<ValueId>) {
    let node = g.node(n);
    for &v in node.inputs().iter().flatten().chain(node.outputs()) {
        if g.ty(v).dtype.is_some_and(DType::is_float) {
            out.insert(v);
        }
    }
}

/// Op time of `n` under `a` (f32 when unassigned and lowerable).
pub fn node_time(g: &Graph, a: &Assignment, n: NodeId, oracle: &dyn CostOracle) -> f64 {
    oracle.op_time(g, n, a.get(&n).copied().unwrap_or(DType::F32))
}

/// Predicted change (seconds) when every node of `set` moves to `p`.
/// Cast counts change by the second element. `a` is restored on return.
pub fn delta(
    g: &Graph,
    a: &mut Assignment,
    set: &[NodeId],
    p: DType,
    oracle: &dyn CostOracle,
    w: &WeightPricing,
) -> (f64, i64) {
    let mut vals = BTreeSet::new();
    for &n in set {
        touched_values(g, n, &mut vals);
    }
    let (mut before, mut after) = (0.0, 0.0);
    let (mut cb, mut ca) = (0i64, 0i64);
    let measure = |a: &Assignment, t: &mut f64, c: &mut i64| {
        for &n in set {
            if lowerable(g, n) {
                *t += node_time(g, a, n, oracle);
            }
        }
        for &v in &vals {
            *t += value_cast_cost(g, a, v, oracle, w);
            *c += value_cast_count(g, a, v, w) as i64;
        }
    };
    measure(a, &mut before, &mut cb);
    // Try the change in place, then restore.
    let saved: Vec<(NodeId, Option<DType>)> = set.iter().map(|&n| (n, a.get(&n).copied())).collect();
    for &n in set {
        if lowerable(g, n) {
            a.insert(n, p);
        }
    }
    measure(a, &mut after, &mut ca);
    for (n, old) in saved {
        match old {
            Some(o) => a.insert(n, o),
            None => a.remove(&n),
        };
    }
    (after - before, ca - cb)
}

/// The plan annotations of `g` as an assignment (lowerable nodes only).
pub fn assignment_of(g: &Graph) -> Assignment {
    g.node_ids()
        .into_iter()
        .filter(|&n| lowerable(g, n))
        .map(|n| (n, g.node(n).precision.filter(|&p| p.is_float() || is_quantized(p)).unwrap_or(DType::F32)))
        .collect()
}

/// Write an assignment into the graph's annotations.
pub fn write(g: &mut Graph, a: &Assignment) {
    for (&n, &p) in a {
        g.node_mut(n).precision = Some(p);
    }
}
