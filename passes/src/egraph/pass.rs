//! `egraph-casts`: import the cast region, saturate, extract, rebuild.
//!
//! **Reads:** value dtypes and shapes, Cast nodes, node precisions, the
//! policy (which ops may change precision), the target's cost oracle.
//! **Guarantees:**
//! - the *region* is every float↔float Cast (f64/f32/f16/bf16/i8) and every
//!   data-movement or order-preserving op ([`transparent`]) whose float
//!   inputs and outputs share one dtype; nothing producing a graph output is
//!   in it. Every other op is kept verbatim, with its precision and the dtype
//!   of each input it reads: its inputs are the *roots* of extraction;
//! - graph outputs keep their names and dtypes;
//! - the result is used only when its DAG cost is strictly below the input's
//!   and it has no more casts; otherwise the graph is returned unchanged;
//! - new nodes are named `{node}.{dtype}` / `{value}.cast_{dtype}`, stored
//!   constants and refreshed copies `{init}.{dtype}` (a copy is paired with
//!   its master, which stays; `refreshable` says which weights may get
//!   one); output is deterministic (egg's
//!   `deterministic` feature, ordered maps) unless the time limit stops the
//!   runner;
//! - the summary reports casts before → after, activation casts, the
//!   runner's stop reason, iterations and e-nodes.
//!
//! Cost: a cast costs `2 · cast_time` in training when a gradient flows
//! through its input (the forward cast and the backward cast of its
//! gradient; [`gradient_values`]), `cast_time` otherwise and in inference;
//! a refreshed copy its rewrite in the optimizer step (`refresh_time`);
//! region ops cost `op_time` at their dtype. **Requires:** `infer-shapes`; any planning pass
//! (or none: imported models that already contain casts).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use egg::{Id, Language, Runner};
use qsync_ir::{Attr, DType, Graph, Model, NodeId, NodeSpec, Op, OpClass, Tensor, TensorData, TensorType, ValueId};

use super::extract::{dag_cost, dag_refine, reached, tree_choice, Choice, Costs};
use super::language::{CastGraph, CastLang, Key, Typing};
use super::rules::{rules, RuleCx};
use crate::manager::{Pass, PassContext, PassError, PassOutcome};
use crate::precision::oracle::numel;
use crate::precision::{lowerable, oracle_for, Category, CostOracle, Policy};

/// Runner limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub iters: usize,
    pub nodes: usize,
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { iters: 30, nodes: 200_000, time: Duration::from_secs(5) }
    }
}

/// The pass.
#[derive(Debug)]
pub struct EgraphCasts {
    pub limits: Limits,
    /// Which ops may change precision (the planner's policy; `tf-amp` default).
    pub policy: Policy,
    /// Use only the rules that keep every bit (no FP32 BatchNormalization
    /// parameters; see [`super::rules`]).
    pub exact: bool,
    /// Offer refreshed copies of trained parameters (`refresh-copy`; training
    /// only). Off: every trained weight keeps its per-iteration casts.
    pub refresh: bool,
}

/// Largest value (elements) the pass evaluates to fold its cast.
pub const KNOWN_MAX_ELEMS: usize = 4096;

/// Ops whose results the pass computes exactly (bit for bit what a runtime
/// computes): data movement, comparisons, casts, and the IEEE correctly
/// rounded arithmetic.
fn exactly_evaluated(op: &Op) -> bool {
    use Op::*;
    matches!(
        op,
        Constant
            | Identity
            | Cast
            | CastLike
            | Neg
            | Sqrt
            | Reciprocal
            | Add
            | Sub
            | Mul
            | Div
            | Equal
            | Less
            | Greater
            | LessOrEqual
            | GreaterOrEqual
            | And
            | Or
            | Where
            | Reshape
            | Squeeze
            | Unsqueeze
            | Flatten
            | Transpose
            | Concat
            | Gather
            | Slice
            | Expand
            | ConstantOfShape
            | Shape
            | Size
    )
}

/// Whether initializer `v` is a constant: every initializer in inference;
/// in training only scalars and single-element tensors (trained parameters
/// change every step).
fn constant_init(g: &Graph, v: ValueId, inference: bool) -> bool {
    let Some(t) = g.value(v).init() else { return false };
    (inference || t.numel() <= 1) && !g.inputs().contains(&v)
}

/// The float values a gradient flows back through in training: trained
/// parameters (float initializers that are not [`constant_init`] nor
/// BatchNormalization running statistics) and what
/// float ops compute from them. Graph inputs carry none (the data needs no
/// gradient), nor do constants. A cast of any other value has no backward
/// cast. Empty in inference.
pub fn gradient_values(g: &Graph, inference: bool) -> std::collections::HashSet<ValueId> {
    let mut grad = std::collections::HashSet::new();
    if inference {
        return grad;
    }
    // BatchNormalization's running mean and variance are buffers, updated
    // by the op, not trained (as the cost model's facts count them), also
    // when the op reads them through a cast.
    let through_cast = |v: ValueId| match g.producer(v) {
        Some((p, _)) if g.node(p).op == Op::Cast => g.node(p).input(0).unwrap_or(v),
        _ => v,
    };
    let buffers: std::collections::HashSet<ValueId> = g
        .node_ids()
        .into_iter()
        .filter(|&n| g.node(n).op == Op::BatchNormalization)
        .flat_map(|n| [g.node(n).input(3), g.node(n).input(4)])
        .flatten()
        .map(through_cast)
        .collect();
    for &v in g.inits() {
        let trained = g.value(v).init().is_some_and(|t| t.dtype.is_float()) && !constant_init(g, v, false);
        if trained && !g.inputs().contains(&v) && !buffers.contains(&v) {
            grad.insert(v);
        }
    }
    let Ok(order) = g.topo_order() else { return grad };
    for n in order {
        let node = g.node(n);
        if node.inputs().iter().flatten().any(|v| grad.contains(v)) {
            for &o in node.outputs() {
                if g.ty(o).dtype.is_some_and(DType::is_float) {
                    grad.insert(o);
                }
            }
        }
    }
    grad
}

/// Values whose contents the pass computed: `Constant` outputs and small
/// results (at most [`KNOWN_MAX_ELEMS`] elements, judged from the inferred
/// output types before anything is evaluated) of exactly evaluated ops over
/// constants alone. Constant initializers ([`constant_init`], inline data)
/// are read from the graph, not copied here.
fn known_values(g: &Graph, order: &[NodeId], opset: i64, inference: bool) -> HashMap<ValueId, Tensor> {
    let mut known: HashMap<ValueId, Tensor> = HashMap::new();
    let init = |v: ValueId| {
        g.value(v).init().filter(|t| matches!(t.data, TensorData::Inline(_)) && constant_init(g, v, inference))
    };
    for &n in order {
        let node = g.node(n);
        if !exactly_evaluated(&node.op) || node.outputs().is_empty() {
            continue;
        }
        // A `Constant` is known whatever its size; computed values only when small.
        let small = node
            .outputs()
            .iter()
            .all(|&o| g.ty(o).concrete_shape().is_some_and(|s| s.iter().product::<i64>() <= KNOWN_MAX_ELEMS as i64));
        if node.op != Op::Constant && !small {
            continue;
        }
        let inputs: Vec<Option<&Tensor>> =
            node.inputs().iter().map(|i| i.and_then(|v| known.get(&v).or_else(|| init(v)))).collect();
        let shape_only = matches!(node.op, Op::Shape | Op::Size);
        if !shape_only && node.inputs().iter().zip(&inputs).any(|(i, t)| i.is_some() && t.is_none()) {
            continue;
        }
        let Some(results) = qsync_ir::infer::eval_node(g, n, &inputs, opset) else { continue };
        if results.len() != node.outputs().len() {
            continue;
        }
        for (&o, t) in node.outputs().iter().zip(results) {
            known.insert(o, t);
        }
    }
    known
}

/// A group of a kept node's inputs that `use-uncast` may read differently.
#[derive(Clone, Debug)]
struct UseGroup {
    group: u8,
    slots: Vec<usize>,
    /// Dtypes the group may read instead.
    accept: Vec<DType>,
}

/// The use groups of kept node `n` (see `use-uncast` in [`super::rules`]).
fn use_groups(g: &Graph, n: NodeId, opset: i64, exact: bool) -> Vec<UseGroup> {
    let node = g.node(n);
    let floats = vec![DType::F64, DType::F32, DType::F16, DType::BF16];
    match node.op {
        Op::IsNaN => vec![UseGroup { group: 0, slots: vec![0], accept: floats }],
        Op::Shape | Op::Size => {
            let mut all = floats;
            all.push(DType::I8);
            vec![UseGroup { group: 0, slots: vec![0], accept: all }]
        }
        Op::BatchNormalization if opset >= 15 && !exact && node.inputs().len() == 5 => {
            let x = node.input(0).and_then(|v| g.ty(v).dtype);
            if !matches!(x, Some(DType::F16 | DType::BF16)) {
                return vec![];
            }
            let mut groups = vec![UseGroup { group: 1, slots: vec![1, 2], accept: vec![DType::F32] }];
            // Mean and var (T2) also type the running-statistics outputs:
            // only when nothing reads those.
            let stats_free = node.outputs().iter().skip(1).all(|&o| g.users(o).is_empty() && !g.outputs().contains(&o));
            if stats_free {
                groups.push(UseGroup { group: 2, slots: vec![3, 4], accept: vec![DType::F32] });
            }
            groups
        }
        _ => vec![],
    }
}

/// Ops a cast commutes with (data movement and order-preserving ops).
pub fn transparent(op: &Op) -> bool {
    use Op::*;
    matches!(
        op,
        Reshape
            | Transpose
            | Flatten
            | Slice
            | Gather
            | Concat
            | Split
            | Squeeze
            | Unsqueeze
            | Expand
            | Identity
            | Relu
            | MaxPool
            | Max
            | Min
    )
}

fn castable(d: DType) -> bool {
    matches!(d, DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::I8)
}

/// Whether node `n` is in the rewritable region.
fn in_region(g: &Graph, n: NodeId, outputs: &[ValueId]) -> bool {
    let node = g.node(n);
    if node.outputs().iter().any(|o| outputs.contains(o)) {
        return false;
    }
    let dt = |v: ValueId| g.ty(v).dtype;
    if node.op == Op::Cast {
        let (Some(i), Some(&o)) = (node.input(0), node.outputs().first()) else { return false };
        return node.outputs().len() == 1 && dt(i).is_some_and(castable) && dt(o).is_some_and(castable);
    }
    if !transparent(&node.op) || node.outputs().is_empty() {
        return false;
    }
    let Some(d) = dt(node.outputs()[0]).filter(|d| d.is_float()) else { return false };
    let outs_ok = node.outputs().iter().all(|&o| dt(o) == Some(d));
    let float_ins: Vec<ValueId> =
        node.inputs().iter().flatten().copied().filter(|&v| dt(v).is_some_and(DType::is_float)).collect();
    outs_ok && !float_ins.is_empty() && float_ins.iter().all(|&v| dt(v) == Some(d))
}

/// Float input slots of a region node (its e-node children, in order).
fn child_slots(g: &Graph, n: NodeId) -> Vec<usize> {
    let node = g.node(n);
    if node.op == Op::Cast {
        return vec![0];
    }
    node.inputs()
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_some_and(|v| g.ty(v).dtype.is_some_and(DType::is_float)))
        .map(|(i, _)| i)
        .collect()
}

/// Where a kept node reads the region: one slot (a value's class) or a use
/// group (a [`Key::Use`] class).
#[derive(Clone, Debug)]
struct Root {
    node: NodeId,
    slots: Vec<usize>,
    vals: Vec<ValueId>,
    class: Id,
}

struct Import {
    eg: CastGraph,
    region: Vec<NodeId>,
    roots: Vec<Root>,
    uses: BTreeMap<(u32, u8), Vec<DType>>,
    /// The input graph's own e-nodes, in import (topological) order.
    added: Vec<CastLang>,
}

fn import(
    g: &Graph,
    order: &[NodeId],
    grads: &std::collections::HashSet<ValueId>,
    groups: impl Fn(NodeId) -> Vec<UseGroup>,
) -> Import {
    let outputs = g.outputs().to_vec();
    let mut eg = CastGraph::default();
    let mut class_of: HashMap<ValueId, Id> = HashMap::new();
    let mut region = Vec::new();
    let mut roots = Vec::new();
    let mut uses = BTreeMap::new();
    let mut added = Vec::new();
    let leaf = |eg: &mut CastGraph, class_of: &mut HashMap<ValueId, Id>, added: &mut Vec<CastLang>, v: ValueId| -> Id {
        *class_of.entry(v).or_insert_with(|| {
            let ty = g.ty(v);
            let n = CastLang::Op(
                Key::Leaf {
                    value: v.index() as u32,
                    dt: ty.dtype.unwrap_or(DType::F32),
                    elems: numel(ty),
                    grad: grads.contains(&v),
                },
                vec![],
            );
            added.push(n.clone());
            eg.add(n)
        })
    };
    for &n in order {
        if in_region(g, n, &outputs) {
            let node = g.node(n);
            let kids: Vec<Id> = child_slots(g, n)
                .into_iter()
                .filter_map(|s| node.input(s))
                .map(|v| leaf(&mut eg, &mut class_of, &mut added, v))
                .collect();
            for (slot, &o) in node.outputs().iter().enumerate() {
                let ty = g.ty(o);
                let dt = ty.dtype.unwrap_or(DType::F32);
                let key = if node.op == Op::Cast {
                    Key::Cast { to: dt }
                } else {
                    Key::Node { node: n.index() as u32, slot: slot as u16, dt, elems: numel(ty) }
                };
                added.push(CastLang::Op(key, kids.clone()));
                let id = eg.add(CastLang::Op(key, kids.clone()));
                class_of.insert(o, id);
            }
            region.push(n);
        }
    }
    let region_out: std::collections::HashSet<ValueId> =
        region.iter().flat_map(|&n| g.node(n).outputs().to_vec()).collect();
    let in_region: std::collections::HashSet<NodeId> = region.iter().copied().collect();
    for &n in order {
        if in_region.contains(&n) {
            continue;
        }
        let node = g.node(n);
        let mut grouped = Vec::new();
        for ug in groups(n) {
            let vals: Option<Vec<ValueId>> = ug.slots.iter().map(|&s| node.input(s)).collect();
            let Some(vals) = vals.filter(|vs| vs.iter().all(|v| region_out.contains(v))) else { continue };
            let kids: Vec<Id> = vals.iter().map(|v| class_of[v]).collect();
            let dt = g.ty(vals[0]).dtype.unwrap_or(DType::F32);
            let use_node = CastLang::Op(Key::Use { node: n.index() as u32, group: ug.group, dt }, kids);
            added.push(use_node.clone());
            let class = eg.add(use_node);
            uses.insert((n.index() as u32, ug.group), ug.accept.clone());
            grouped.extend(ug.slots.iter().copied());
            roots.push(Root { node: n, slots: ug.slots.clone(), vals, class });
        }
        // Captures are roots too: a subgraph reads the value at its dtype.
        for (slot, v) in node.reads() {
            if region_out.contains(&v) && !grouped.contains(&slot) {
                roots.push(Root { node: n, slots: vec![slot], vals: vec![v], class: class_of[&v] });
            }
        }
    }
    Import { eg, region, roots, uses, added }
}

impl EgraphCasts {
    #[allow(clippy::too_many_arguments)]
    fn rule_cx(
        &self,
        g: &Graph,
        imp: &Import,
        known: &HashMap<ValueId, Tensor>,
        grads: &std::collections::HashSet<ValueId>,
        oracle: &dyn CostOracle,
        inference: bool,
        opset: i64,
    ) -> RuleCx {
        let region = &imp.region;
        let mut cx = RuleCx { uses: imp.uses.clone(), ..RuleCx::default() };
        for &n in region {
            let node = g.node(n);
            if node.op == Op::Cast {
                continue;
            }
            let Some(orig) = node.outputs().first().and_then(|&o| g.ty(o).dtype) else { continue };
            let mut ok = vec![orig];
            if lowerable(g, n) && self.policy.category(node.op.op_type()) != Category::Deny {
                // Only dtypes the op's ONNX schema accepts at this opset
                // (MaxPool takes bf16 only from opset 22).
                ok.extend([DType::F32, DType::F16, DType::BF16].into_iter().filter(|&d| {
                    d != orig && oracle.supports(d) && qsync_ir::op::node_float_allowed(g, n, opset, d) != Some(false)
                }));
            }
            cx.allowed.insert(n.index() as u32, ok);
        }
        for &v in g.inits() {
            let Some(t) = g.value(v).init() else { continue };
            if t.dtype.is_float() && constant_init(g, v, inference) {
                cx.foldable.insert(v.index() as u32);
            }
        }
        // `Constant` nodes (exporters emit them for scales, masks, fill
        // values) are never trained, and neither is what is computed from
        // them and constant initializers alone: foldable in training too.
        for (&v, t) in known {
            if t.dtype.is_float() && !g.outputs().contains(&v) && g.value(v).init().is_none() {
                cx.foldable.insert(v.index() as u32);
            }
        }
        if !inference && self.refresh {
            cx.refreshable = refreshable(g, grads, oracle);
        }
        cx
    }
}

/// Trained FP32 parameters that `refresh-copy` may store as refreshed
/// copies (training only), decided by the memory model and then the cost
/// model.
///
/// Candidates: float initializers with a gradient that are not graph
/// inputs or copies themselves, read at f16/bf16 through Casts whose
/// results are not graph outputs ([`low_casts`]: directly or through
/// element-preserving movement ops). A candidate's copies add *no* peak memory
/// when every reader of each low cast keeps it for its backward
/// ([`qsync_cost::facts::keeps_input`]: the per-iteration cast is alive at
/// the peak anyway); otherwise each such copy adds its bytes. Those are
/// admitted only within the oracle's memory headroom
/// ([`CostOracle::memory_headroom`]; none without a memory model), most
/// time saved per byte first (`2 · cast_time − refresh_time`; ties by
/// value, so the choice is deterministic). Extraction then still weighs
/// each admitted copy against its casts.
fn refreshable(
    g: &Graph,
    grads: &std::collections::HashSet<ValueId>,
    oracle: &dyn CostOracle,
) -> std::collections::BTreeSet<u32> {
    let mut out = std::collections::BTreeSet::new();
    // (time saved per byte, value, extra bytes) of peak-raising candidates.
    let mut raising: Vec<(f64, ValueId, f64)> = Vec::new();
    for &w in g.inits() {
        if !refresh_candidate(g, w, grads) {
            continue;
        }
        let elems = oracle.elements(g, w);
        let (mut extra, mut saved, mut low_reads, mut ok) = (0.0, 0.0, 0, true);
        for (cast, to, moved) in low_casts(g, w) {
            if g.outputs().contains(&cast) {
                ok = false;
                break;
            }
            low_reads += 1;
            saved += 2.0 * oracle.cast_time(DType::F32, to, elems) - oracle.refresh_time(to, elems);
            // Read through a movement op, the copy is what that op reads
            // (`cast-hoist` moves the cast up to the parameter), and no
            // movement op keeps its input for the backward.
            let kept = !moved
                && g.users(cast)
                    .into_iter()
                    .all(|(r, slot)| qsync_cost::facts::keeps_input(g, r, slot, |v| grads.contains(&v) || v == cast));
            if !kept {
                extra += to.storage_bytes(elems) as f64;
            }
        }
        if !ok || low_reads == 0 || saved <= 0.0 {
            continue;
        }
        if extra == 0.0 {
            out.insert(w.index() as u32);
        } else {
            raising.push((saved / extra, w, extra));
        }
    }
    let mut headroom = oracle.memory_headroom(g).unwrap_or(0.0);
    raising.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, w, extra) in raising {
        if extra <= headroom {
            headroom -= extra;
            out.insert(w.index() as u32);
        }
    }
    out
}

/// The f16/bf16 Casts that read parameter `w`, directly or through a
/// chain of element-preserving movement ops (Transpose, Reshape, Flatten,
/// Squeeze, Unsqueeze, Identity — as exporters write `Transpose(W)` before
/// a MatMul), each as (cast output, dtype, whether it reads through a
/// movement op). `cast-hoist` turns `cast(transpose(w))` into
/// `transpose(cast(w))`, which `refresh-copy` then serves from the copy.
fn low_casts(g: &Graph, w: ValueId) -> Vec<(ValueId, DType, bool)> {
    let mut out = Vec::new();
    let mut stack = vec![(w, false)];
    while let Some((v, moved)) = stack.pop() {
        for (n, slot) in g.users(v) {
            let node = g.node(n);
            let Some(&o) = node.outputs().first() else { continue };
            let to = g.ty(o).dtype;
            match &node.op {
                Op::Cast => {
                    if let Some(to) = to.filter(|d| matches!(d, DType::F16 | DType::BF16)) {
                        out.push((o, to, moved));
                    }
                }
                Op::Transpose | Op::Reshape | Op::Flatten | Op::Squeeze | Op::Unsqueeze | Op::Identity
                    if slot == 0 && to == Some(DType::F32) && node.outputs().len() == 1 =>
                {
                    stack.push((o, true));
                }
                _ => {}
            }
        }
    }
    out.sort_by_key(|&(c, _, _)| c);
    out.dedup();
    out
}

/// Whether initializer `w` is a trained FP32 parameter that may get a
/// refreshed copy at all: it carries a gradient (`grads`, from
/// [`gradient_values`]), is neither a graph input nor output, and is not a
/// copy itself.
pub(crate) fn refresh_candidate(g: &Graph, w: ValueId, grads: &std::collections::HashSet<ValueId>) -> bool {
    g.value(w).init().is_some_and(|t| t.dtype == DType::F32)
        && grads.contains(&w)
        && !g.inputs().contains(&w)
        && !g.outputs().contains(&w)
        && g.master_of(w).is_none()
}

/// Replace each per-iteration f16/bf16 cast of a `refreshable` parameter
/// by a refreshed copy of it, as `egraph-casts` stores one where its
/// extraction agrees (it weighs the same costs). The copies' data is left
/// absent: this is for pricing a plan (`campo` compares plans as they will
/// be stored), not for writing one. Returns the casts replaced.
pub fn refresh_weight_casts(g: &mut Graph, oracle: &dyn CostOracle) -> usize {
    let grads = gradient_values(g, false);
    let keep = refreshable(g, &grads, oracle);
    let mut copies: HashMap<(ValueId, DType), ValueId> = HashMap::new();
    let mut replaced = 0;
    for n in g.node_ids() {
        let node = g.node(n);
        let (Some(w), Some(&o)) = (node.input(0), node.outputs().first()) else { continue };
        let Some(to) = g.ty(o).dtype.filter(|d| matches!(d, DType::F16 | DType::BF16)) else { continue };
        if node.op != Op::Cast || !keep.contains(&(w.index() as u32)) {
            continue;
        }
        let copy = *copies.entry((w, to)).or_insert_with(|| {
            let copy = g.value(w).init().map(|t| t.absent_converted(to));
            let copy = copy.unwrap_or(Tensor { dtype: to, dims: Vec::new(), data: TensorData::Absent });
            let name = g.fresh_value_name(&format!("{}.{to}", g.value_name(w)));
            g.add_refreshed_copy(w, name, copy)
        });
        g.replace_all_uses(o, copy);
        g.remove_node(n);
        replaced += 1;
    }
    replaced
}

/// Casts in the graph, and those reading an initializer.
pub fn count_casts(g: &Graph) -> (usize, usize) {
    let casts: Vec<NodeId> = g.node_ids().into_iter().filter(|&n| g.node(n).op == Op::Cast).collect();
    let weight = casts.iter().filter(|&&n| g.node(n).input(0).is_some_and(|v| g.value(v).init().is_some())).count();
    (casts.len(), weight)
}

/// A saturated e-graph of one graph's cast region.
struct Saturated {
    imp: Import,
    egraph: CastGraph,
    roots: Vec<Id>,
    /// Cast-time multiplier (2 in training: forward and gradient casts).
    weight: f64,
    stats: String,
    /// Contents of the values the pass knows (for stored constants).
    known: HashMap<ValueId, Tensor>,
    /// Values a gradient flows through ([`gradient_values`]).
    grads: std::collections::HashSet<ValueId>,
}

/// The DAG extractor: egg's tree choice refined DAG-aware.
///
/// Two starting points are refined and the cheaper kept: egg's tree choice,
/// and the input graph's own selection (each class's earliest imported
/// e-node, which is acyclic: its children were imported before it) over
/// the tree choice for the classes the rules made. The second guarantees
/// the result is never costlier than the input where the tree choice,
/// counting shared casts once per use, strays.
fn extract(
    g: &Graph,
    eg: &CastGraph,
    oracle: &dyn CostOracle,
    weight: f64,
    roots: &[Id],
    added: &[CastLang],
) -> (Choice, f64) {
    let mut costs = Costs::new(g, eg, oracle).cast_weight(weight);
    let tree = tree_choice(Costs::new(g, eg, oracle).cast_weight(weight));
    let mut original = tree.clone();
    let mut seen = std::collections::HashSet::new();
    for n in added {
        let c = eg.lookup(n.clone()).map(|c| eg.find(c));
        if let Some(c) = c.filter(|&c| seen.insert(c)) {
            original.insert(c, n.clone().map_children(|k| eg.find(k)));
        }
    }
    let a = dag_refine(&mut costs, tree, roots, 2);
    let b = dag_refine(&mut costs, original, roots, 2);
    if b.1 < a.1 {
        b
    } else {
        a
    }
}

/// The DAG extractor's cost against the ILP optimum on one graph's
/// saturated cast region (see [`EgraphCasts::ilp_check`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IlpCheck {
    pub eclasses: usize,
    pub enodes: usize,
    /// The input region's cost.
    pub input: f64,
    /// The DAG extractor's selection cost.
    pub dag: f64,
    /// The ILP optimum (`None`: the solver failed).
    pub ilp: Option<f64>,
}

impl EgraphCasts {
    /// Import and saturate; `Ok(Err(why))` when there is nothing to rewrite.
    fn saturate(
        &self,
        g: &Graph,
        opset: i64,
        cx: &PassContext,
        oracle: &dyn CostOracle,
    ) -> Result<Result<Saturated, String>, PassError> {
        if g.node_ids().iter().any(|&n| g.node(n).op.class() == OpClass::Control) {
            return Ok(Err("graph has subgraphs".into()));
        }
        let order = g.topo_order().map_err(|_| PassError::FailedGraph {
            pass: self.name().into(),
            message: "the graph has a cycle".into(),
        })?;
        let grads = gradient_values(g, cx.inference);
        let mut imp = import(g, &order, &grads, |n| use_groups(g, n, opset, self.exact));
        if imp.roots.is_empty() {
            return Ok(Err("no cast region".into()));
        }
        let known = known_values(g, &order, opset, cx.inference);
        let rcx = Arc::new(self.rule_cx(g, &imp, &known, &grads, oracle, cx.inference, opset));
        let runner = Runner::<_, Typing, ()>::default()
            .with_egraph(std::mem::take(&mut imp.eg))
            .with_iter_limit(self.limits.iters)
            .with_node_limit(self.limits.nodes)
            .with_time_limit(self.limits.time)
            .run(&rules(&rcx));
        let stop = match &runner.stop_reason {
            Some(egg::StopReason::Saturated) => "saturated".to_string(),
            Some(egg::StopReason::IterationLimit(i)) => format!("iteration limit {i}"),
            Some(egg::StopReason::NodeLimit(n)) => format!("node limit {n}"),
            Some(egg::StopReason::TimeLimit(t)) => format!("time limit {t:.2}s"),
            Some(egg::StopReason::Other(s)) => s.clone(),
            None => "not run".into(),
        };
        let egraph = runner.egraph;
        let stats =
            format!("{stop} after {} iterations, {} e-nodes", runner.iterations.len(), egraph.total_number_of_nodes());
        let roots: Vec<Id> = imp.roots.iter().map(|r| egraph.find(r.class)).collect();
        let weight = if cx.inference { 1.0 } else { 2.0 };
        Ok(Ok(Saturated { imp, egraph, roots, weight, stats, known, grads }))
    }

    /// Saturate `model`'s cast region and compare the DAG extractor with the
    /// ILP optimum ([`super::extract::ilp_cost`]). `None` when the graph has
    /// no cast region or its e-graph exceeds `max_enodes` (the ILP is for
    /// small graphs).
    pub fn ilp_check(&self, model: &Model, cx: &PassContext, max_enodes: usize) -> Result<Option<IlpCheck>, PassError> {
        let oracle = oracle_for(cx, self.name())?;
        let oracle: &dyn CostOracle = oracle.as_ref();
        let g = &model.graph;
        let Ok(sat) = self.saturate(g, model.opset(), cx, oracle)? else { return Ok(None) };
        let eg = &sat.egraph;
        if eg.total_number_of_nodes() > max_enodes {
            return Ok(None);
        }
        let (choice, dag) = extract(g, eg, oracle, sat.weight, &sat.roots, &sat.imp.added);
        let mut costs = Costs::new(g, eg, oracle).cast_weight(sat.weight);
        let dag = dag_cost(&mut costs, &choice, &sat.roots).unwrap_or(dag);
        let ilp = super::extract::ilp_cost(&mut costs, &sat.roots);
        let input = original_cost(g, &sat.imp, &sat.grads, oracle, sat.weight);
        Ok(Some(IlpCheck { eclasses: eg.number_of_classes(), enodes: eg.total_number_of_nodes(), input, dag, ilp }))
    }
}

impl Pass for EgraphCasts {
    fn name(&self) -> &'static str {
        "egraph-casts"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let oracle = oracle_for(cx, self.name())?;
        let oracle: &dyn CostOracle = oracle.as_ref();
        let g = &model.graph;
        let (casts_before, weight_before) = count_casts(g);
        let sat = match self.saturate(g, model.opset(), cx, oracle)? {
            Ok(s) => s,
            Err(why) => {
                return Ok(PassOutcome { changed: false, summary: format!("{why}; {casts_before} casts unchanged") })
            }
        };
        let (imp, eg, stats) = (&sat.imp, &sat.egraph, &sat.stats);
        let roots = &sat.roots;
        let weight = sat.weight;
        let mut costs = Costs::new(g, eg, oracle).cast_weight(weight);
        let orig_cost = original_cost(g, imp, &sat.grads, oracle, weight);
        let (choice, new_cost) = extract(g, eg, oracle, weight, roots, &imp.added);
        let new_cost = dag_cost(&mut costs, &choice, roots).unwrap_or(new_cost);
        let region_casts_before = imp.region.iter().filter(|&&n| g.node(n).op == Op::Cast).count();
        let new_casts =
            reached(eg, &choice, roots).iter().filter(|c| matches!(choice[c].key(), Key::Cast { .. })).count();
        let cheaper = new_cost < orig_cost * (1.0 - 1e-9);
        if !cheaper || new_casts > region_casts_before {
            return Ok(PassOutcome {
                changed: false,
                summary: format!(
                    "nothing cheaper ({stats}); {casts_before} casts ({} activation) unchanged",
                    casts_before - weight_before
                ),
            });
        }
        let roots_with: Vec<Root> = imp.roots.iter().zip(roots).map(|(r, &c)| Root { class: c, ..r.clone() }).collect();
        let base_dir = model.base_dir.clone();
        let region = imp.region.clone();
        let known = &sat.known;
        rebuild(&mut model.graph, eg, &choice, &roots_with, &region, known, base_dir.as_deref());
        let (casts_after, weight_after) = count_casts(&model.graph);
        let copies = model.graph.refreshed_copies().count();
        Ok(PassOutcome::changed(format!(
            "casts {casts_before} -> {casts_after} (activation {} -> {}), refreshed weight copies {copies}, \
             cast-region cost {:.3e}s -> {:.3e}s; {stats}",
            casts_before - weight_before,
            casts_after - weight_after,
            orig_cost,
            new_cost
        )))
    }
}

/// The input region's cost, priced as extraction prices a selection: each
/// region value reachable from the roots once — a cast its cast time, an
/// op's output its share of the op's time.
fn original_cost(
    g: &Graph,
    imp: &Import,
    grads: &std::collections::HashSet<ValueId>,
    oracle: &dyn CostOracle,
    weight: f64,
) -> f64 {
    let (region, roots) = (&imp.region, &imp.roots);
    let in_region: std::collections::HashSet<NodeId> = region.iter().copied().collect();
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<ValueId> = roots.iter().flat_map(|r| r.vals.iter().copied()).collect();
    let mut total = 0.0;
    while let Some(v) = stack.pop() {
        let Some((n, _)) = g.producer(v) else { continue };
        if !in_region.contains(&n) || !seen.insert(v) {
            continue;
        }
        let node = g.node(n);
        if node.op == Op::Cast {
            let (Some(i), Some(&o)) = (node.input(0), node.outputs().first()) else { continue };
            let (from, to) = (g.ty(i).dtype.unwrap_or(DType::F32), g.ty(o).dtype.unwrap_or(DType::F32));
            let w = if grads.contains(&i) { weight } else { 1.0 };
            total += w * oracle.cast_time(from, to, numel(g.ty(i))) + super::extract::CAST_EPSILON;
        } else if let Some(dt) = node.outputs().first().and_then(|&o| g.ty(o).dtype) {
            total += oracle.op_time(g, n, dt) / node.outputs().len().max(1) as f64;
        }
        stack.extend(child_slots(g, n).into_iter().filter_map(|s| node.input(s)));
    }
    total
}

/// The tensor of an initializer, a `Constant` node's output, or a value
/// the pass evaluated.
fn constant_value(g: &Graph, known: &HashMap<ValueId, Tensor>, v: ValueId) -> Option<Tensor> {
    if let Some(t) = g.value(v).init() {
        return Some(t.clone());
    }
    if let Some(t) = known.get(&v) {
        return Some(t.clone());
    }
    let (n, _) = g.producer(v)?;
    match g.node(n).attr("value") {
        Some(Attr::Tensor(t)) if g.node(n).op == Op::Constant => Some(t.clone()),
        _ => None,
    }
}

struct Rebuild<'a> {
    g: &'a mut Graph,
    eg: &'a CastGraph,
    choice: &'a Choice,
    memo: HashMap<Id, ValueId>,
    made: BTreeMap<(u32, DType, Vec<ValueId>), NodeId>,
    casts: HashMap<(ValueId, DType), ValueId>,
    stored: HashMap<(ValueId, DType), ValueId>,
    refreshed: HashMap<(ValueId, DType), ValueId>,
    known: &'a HashMap<ValueId, Tensor>,
    base_dir: Option<&'a std::path::Path>,
    vals: Vec<ValueId>,
}

impl Rebuild<'_> {
    fn value(&mut self, c: Id) -> ValueId {
        let c = self.eg.find(c);
        if let Some(&v) = self.memo.get(&c) {
            return v;
        }
        let node = self.choice[&c].clone();
        let kids: Vec<ValueId> = node.kids().iter().map(|&k| self.value(k)).collect();
        let v = match node.key() {
            Key::Leaf { value, .. } => self.vals[value as usize],
            Key::Stored { value, dt, refreshed: false, .. } => {
                let w = self.vals[value as usize];
                self.store(w, dt)
            }
            Key::Stored { value, dt, refreshed: true, .. } => {
                let w = self.vals[value as usize];
                self.refreshed_copy(w, dt)
            }
            Key::Cast { to } => self.cast(kids[0], to),
            Key::Node { node: n, slot, dt, .. } => self.node(NodeId::new(n as usize), slot as usize, dt, kids),
            Key::Use { .. } => unreachable!("use classes are roots, never children"),
        };
        self.memo.insert(c, v);
        v
    }

    fn cast(&mut self, x: ValueId, to: DType) -> ValueId {
        if let Some(&c) = self.casts.get(&(x, to)) {
            return c;
        }
        let name = self.g.fresh_value_name(&format!("{}.cast_{to}", self.g.value_name(x)));
        let ty = TensorType { container: None, dtype: Some(to), shape: self.g.ty(x).shape.clone() };
        let spec = NodeSpec::new(name.clone(), Op::Cast)
            .input(x)
            .attr("to", Attr::Int(i64::from(to.onnx_code())))
            .output(name, ty);
        let n = self.g.add_node(spec);
        let out = self.g.node(n).outputs()[0];
        self.casts.insert((x, to), out);
        out
    }

    /// `t` rounded to `to` (nearest even), or, when its data cannot be
    /// read, absent like `t` ([`Tensor::absent_converted`]).
    fn converted(&self, t: &Tensor, to: DType) -> Tensor {
        t.converted(to, self.base_dir)
    }

    fn store(&mut self, w: ValueId, to: DType) -> ValueId {
        if let Some(&s) = self.stored.get(&(w, to)) {
            return s;
        }
        let t = constant_value(self.g, self.known, w).expect("a foldable value is a constant");
        let converted = self.converted(&t, to);
        let name = self.g.fresh_value_name(&format!("{}.{to}", self.g.value_name(w)));
        let s = self.g.add_init(name, converted);
        self.stored.insert((w, to), s);
        s
    }

    /// The refreshed copy of trained parameter `w` at `to`; `w` stays as
    /// its master.
    fn refreshed_copy(&mut self, w: ValueId, to: DType) -> ValueId {
        if let Some(&s) = self.refreshed.get(&(w, to)) {
            return s;
        }
        let t = self.g.value(w).init().cloned().expect("a refreshable value is an initializer");
        let converted = self.converted(&t, to);
        let name = self.g.fresh_value_name(&format!("{}.{to}", self.g.value_name(w)));
        let s = self.g.add_refreshed_copy(w, name, converted);
        self.refreshed.insert((w, to), s);
        s
    }

    fn node(&mut self, n: NodeId, slot: usize, dt: DType, kids: Vec<ValueId>) -> ValueId {
        let slots = child_slots(self.g, n);
        let orig = self.g.node(n).clone();
        let orig_dt = orig.outputs().first().and_then(|&o| self.g.ty(o).dtype);
        let same = slots.iter().zip(&kids).all(|(&s, &k)| orig.input(s) == Some(k));
        if same && orig_dt == Some(dt) {
            return orig.outputs()[slot];
        }
        let key = (n.index() as u32, dt, kids.clone());
        if let Some(&m) = self.made.get(&key) {
            return self.g.node(m).outputs()[slot];
        }
        let name = self.g.fresh_value_name(&format!("{}.{dt}", orig.name));
        let mut spec = NodeSpec::new(name, orig.op.clone());
        spec.attrs = orig.attrs.clone();
        spec.inputs = orig.inputs().to_vec();
        for (&s, &k) in slots.iter().zip(&kids) {
            spec.inputs[s] = Some(k);
        }
        for &o in orig.outputs() {
            let oname = self.g.fresh_value_name(&format!("{}.{dt}", self.g.value_name(o)));
            spec.outputs
                .push((oname, TensorType { container: None, dtype: Some(dt), shape: self.g.ty(o).shape.clone() }));
        }
        spec.precision = if orig.precision.is_some() || orig_dt != Some(dt) { Some(dt) } else { None };
        let m = self.g.add_node(spec);
        self.made.insert(key, m);
        self.g.node(m).outputs()[slot]
    }
}

fn rebuild(
    g: &mut Graph,
    eg: &CastGraph,
    choice: &Choice,
    roots: &[Root],
    region: &[NodeId],
    known: &HashMap<ValueId, Tensor>,
    base_dir: Option<&std::path::Path>,
) {
    let mut casts = HashMap::new();
    for &n in region {
        let node = g.node(n);
        if node.op == Op::Cast {
            if let (Some(i), Some(&o)) = (node.input(0), node.outputs().first()) {
                if let Some(to) = g.ty(o).dtype {
                    casts.entry((i, to)).or_insert(o);
                }
            }
        }
    }
    let mut rb = Rebuild {
        g,
        eg,
        choice,
        memo: HashMap::new(),
        made: BTreeMap::new(),
        casts,
        stored: HashMap::new(),
        refreshed: HashMap::new(),
        known,
        base_dir,
        vals: Vec::new(),
    };
    rb.vals = rb.g.all_values().collect();
    let mut rewires = Vec::new();
    for r in roots {
        let c = eg.find(r.class);
        let new: Vec<ValueId> = match choice[&c].key() {
            Key::Use { .. } => choice[&c].kids().to_vec().into_iter().map(|k| rb.value(k)).collect(),
            _ => vec![rb.value(c)],
        };
        for ((&slot, &old), new) in r.slots.iter().zip(&r.vals).zip(new) {
            if new != old {
                rewires.push((r.node, slot, new));
            }
        }
    }
    // Stored copies, and the constant initializers they were made from.
    let mut stored: Vec<ValueId> = rb.stored.values().copied().collect();
    let mut sources: Vec<ValueId> =
        rb.stored.keys().map(|&(w, _)| w).filter(|&w| rb.g.value(w).init().is_some()).collect();
    sources.sort();
    sources.dedup();
    stored.extend(sources);
    let g = rb.g;
    for (n, slot, new) in rewires {
        g.set_input(n, slot, Some(new));
        retype_after_use_change(g, n, slot);
    }
    // Remove what was left without users, consumers first: region nodes,
    // the nodes that computed a folded constant, stored copies not used.
    let outputs = g.outputs().to_vec();
    let removable: Vec<NodeId> = {
        let mut v: Vec<NodeId> = region.to_vec();
        let mut computed: Vec<NodeId> = g
            .node_ids()
            .into_iter()
            .filter(|&n| {
                let node = g.node(n);
                !node.outputs().is_empty() && node.outputs().iter().all(|o| known.contains_key(o))
            })
            .collect();
        computed.sort();
        v.extend(computed);
        v
    };
    let order: std::collections::HashMap<NodeId, usize> =
        g.topo_order().unwrap_or_default().into_iter().enumerate().map(|(i, n)| (n, i)).collect();
    let mut removable = removable;
    removable.sort_by_key(|n| std::cmp::Reverse(order.get(n).copied().unwrap_or(0)));
    removable.dedup();
    let mut changed = true;
    while changed {
        changed = false;
        for &n in &removable {
            if !g.contains_node(n) {
                continue;
            }
            let dead = g.node(n).outputs().iter().all(|&o| g.users(o).is_empty() && !outputs.contains(&o));
            if dead {
                g.remove_node(n);
                changed = true;
            }
        }
    }
    for s in stored {
        if g.users(s).is_empty() && !outputs.contains(&s) {
            g.remove_source(s);
        }
    }
}

/// After kept node `n` reads another dtype at `slot` (a `use-uncast`
/// choice), keep its own typing true: `IsNaN`'s precision follows its
/// input; BatchNormalization's running-statistics outputs (T2) follow its
/// mean and variance.
fn retype_after_use_change(g: &mut Graph, n: NodeId, slot: usize) {
    let Some(dt) = g.node(n).input(slot).and_then(|v| g.ty(v).dtype) else { return };
    match g.node(n).op {
        Op::IsNaN if g.node(n).precision.is_some() => g.node_mut(n).precision = Some(dt),
        Op::BatchNormalization if slot == 3 => {
            for o in g.node(n).outputs().iter().skip(1).copied().collect::<Vec<_>>() {
                let shape = g.ty(o).shape.clone();
                g.set_ty(o, TensorType { container: None, dtype: Some(dt), shape });
            }
        }
        _ => {}
    }
}
