//! Dtype and shape inference.
//!
//! [`infer_shapes`] walks the graph in topological order and computes every
//! node's output types from its input types and attributes (per-op rules in
//! the submodules), overwriting stale declared types. Alongside the types it
//! keeps the *known contents* of small integer tensors, whose elements are
//! symbolic [`crate::Dim`]s, so that the shape arithmetic exporters emit
//! (`Shape → Gather → Unsqueeze → Concat → Reshape`) folds to symbolic
//! shapes such as `[batch, seq, 12, 64]`.
//!
//! [`eval_node`] evaluates a node on constant inline tensors for constant
//! folding.

use std::collections::BTreeMap;

use crate::{Dim, Graph, NodeId, Op, Tensor, TensorType, ValueDef, ValueId};

mod ctx;
mod elementwise;
mod eval;
mod movement;
mod nn;
mod shape_ops;
#[cfg(test)]
mod tests;

pub use ctx::{broadcast, Known};
use ctx::{Cx, InferResult, Outcome};

/// What to bind before inferring.
#[derive(Clone, Debug, Default)]
pub struct InferOptions {
    /// `--batch N`: bind the leading symbolic dim of the graph inputs.
    pub batch: Option<i64>,
    /// `--dim name=N`: bind a named symbolic dim everywhere.
    pub dims: BTreeMap<String, i64>,
}

/// A problem found at one node.
#[derive(Clone, Debug, PartialEq)]
pub struct InferIssue {
    pub node: String,
    pub op: String,
    pub message: String,
}

/// What inference did.
#[derive(Clone, Debug, Default)]
pub struct InferReport {
    /// Live values whose dtype or shape is still unknown.
    pub unknown: Vec<ValueId>,
    /// Inconsistencies (e.g. incompatible broadcast, wrong rank): bad input.
    pub errors: Vec<InferIssue>,
    /// Non-fatal notes (e.g. opaque op outputs left as declared).
    pub warnings: Vec<InferIssue>,
    /// When `batch` was asked for but the graph fixes the batch internally
    /// (a constant reshape target), the fixed batch found.
    pub fixed_batch: Option<i64>,
}

/// Per-node inference: the output types (and known contents) of one node
/// given its input types and known input contents. A dim whose arithmetic
/// overflowed or grew past the limits of [`Dim`] is an error at this node,
/// so hostile shapes fail where they arise instead of spreading.
pub(crate) fn infer_op(cx: &Cx) -> InferResult {
    if let Some(d) = cx.tys.iter().flatten().find_map(|t| t.shape.iter().flatten().find(|d| d.is_invalid())) {
        return Err(format!("an input shape has an invalid dimension {d}"));
    }
    let out = infer_op_rules(cx)?;
    if let Outcome::Done(inf) = &out {
        let bad_ty = inf.types.iter().any(|t| t.shape.iter().flatten().any(Dim::is_invalid));
        let bad_known = inf.known.iter().flatten().any(|k| k.vals.iter().any(Dim::is_invalid));
        if bad_ty || bad_known {
            return Err(format!(
                "an output dimension overflows i64 or exceeds the symbolic-dim limits ({} terms, degree {}, \
                 nesting {})",
                crate::dim::MAX_TERMS,
                crate::dim::MAX_DEGREE,
                crate::dim::MAX_NESTING
            ));
        }
    }
    Ok(out)
}

fn infer_op_rules(cx: &Cx) -> InferResult {
    use Op::*;
    if cx.node.op.is_unary_same_shape() {
        return elementwise::same_as_input(cx);
    }
    match &cx.node.op {
        InstanceNormalization
        | GroupNormalization
        | RMSNormalization
        | RotaryEmbedding
        | TensorScatter
        | CumSum
        | Trilu
        | ReverseSequence
        | ScatterElements
        | ScatterND
        | Scatter => elementwise::same_as_input(cx),
        IsNaN | IsInf => elementwise::bool_like(cx),
        Add | Sub | Mul | Div | Pow | Mod | BitShift | And | Or | Xor | BitwiseAnd | BitwiseOr | BitwiseXor | Equal
        | Less | LessOrEqual | Greater | GreaterOrEqual => elementwise::binary(cx),
        PRelu => elementwise::prelu(cx),
        Max | Min | Mean | Sum => elementwise::variadic(cx),
        Where => elementwise::where_op(cx),
        Cast | CastLike => elementwise::cast(cx),
        QuantizeLinear | DequantizeLinear | DynamicQuantizeLinear => elementwise::quant(cx),
        Dropout => elementwise::dropout(cx),
        Clip => elementwise::clip(cx),
        Conv | ConvInteger | QLinearConv | DeformConv => nn::conv(cx),
        ConvTranspose => nn::conv_transpose(cx),
        MaxPool | AveragePool | LpPool => nn::pool(cx),
        GlobalAveragePool | GlobalMaxPool | GlobalLpPool => nn::global_pool(cx),
        MaxRoiPool | RoiAlign => nn::roi(cx),
        MaxUnpool => nn::max_unpool(cx),
        Gemm => nn::gemm(cx),
        MatMul | MatMulInteger | QLinearMatMul => nn::matmul(cx),
        Einsum => nn::einsum(cx),
        BatchNormalization => nn::batch_norm(cx),
        LayerNormalization => nn::layer_norm(cx),
        LSTM | GRU | RNN => nn::recurrent(cx),
        Attention => nn::attention(cx),
        SoftmaxCrossEntropyLoss | NegativeLogLikelihoodLoss => nn::loss(cx),
        GridSample => nn::grid_sample(cx),
        Reshape => movement::reshape(cx),
        Transpose => movement::transpose(cx),
        Concat => movement::concat(cx),
        Split => movement::split(cx),
        Slice => movement::slice(cx),
        Gather => movement::gather(cx),
        GatherElements => movement::gather_elements(cx),
        GatherND => movement::gather_nd(cx),
        Squeeze => movement::squeeze(cx),
        Unsqueeze => movement::unsqueeze(cx),
        Expand => movement::expand(cx),
        Flatten => movement::flatten(cx),
        Pad => movement::pad(cx),
        Tile => movement::tile(cx),
        DepthToSpace => movement::depth_space(cx, true),
        SpaceToDepth => movement::depth_space(cx, false),
        Resize | Upsample => movement::resize(cx),
        OneHot => movement::one_hot(cx),
        NonZero => movement::non_zero(cx),
        Compress => movement::compress(cx),
        Unique => movement::unique(cx),
        NonMaxSuppression => movement::nms(cx),
        Shape => shape_ops::shape(cx),
        Size => shape_ops::size(cx),
        Constant => shape_ops::constant(cx),
        ConstantOfShape => shape_ops::constant_of_shape(cx),
        Range => shape_ops::range(cx),
        EyeLike => shape_ops::eye_like(cx),
        RandomNormal | RandomUniform | RandomNormalLike | RandomUniformLike | Bernoulli | Multinomial => {
            shape_ops::random(cx)
        }
        ReduceSum | ReduceMean | ReduceMax | ReduceMin | ReduceProd | ReduceL1 | ReduceL2 | ReduceLogSum
        | ReduceLogSumExp | ReduceSumSquare => shape_ops::reduce(cx),
        ArgMax | ArgMin => shape_ops::arg_reduce(cx),
        TopK => shape_ops::top_k(cx),
        If | Loop | Scan => Ok(Outcome::Skip("control flow: outputs left as declared".into())),
        Opaque { domain, op_type } => {
            Ok(Outcome::Skip(format!("opaque op {domain}::{op_type}: outputs left as declared")))
        }
        other => Ok(Outcome::Skip(format!("no inference for {}: outputs left as declared", other.op_type()))),
    }
}

/// Build the context for node `n` from the graph's current types and the
/// known-contents table.
pub(crate) fn node_cx<'a>(graph: &'a Graph, n: NodeId, opset: i64, known: &[Option<Known>]) -> Cx<'a> {
    let node = graph.node(n);
    let tys = node.inputs().iter().map(|v| v.map(|v| graph.ty(v).clone())).collect();
    let kn = node
        .inputs()
        .iter()
        .map(|v| {
            v.and_then(|v| {
                known.get(v.index()).cloned().flatten().or_else(|| graph.value(v).init().and_then(Known::from_tensor))
            })
        })
        .collect();
    let out_names = node.outputs().iter().map(|&v| graph.value_name(v).to_string()).collect();
    Cx { node, opset, tys, known: kn, out_names }
}

/// Infer the output types of one node from the types currently recorded on
/// its inputs (used by the verifier). `Ok(None)` when the op has no rule.
pub(crate) fn infer_node_types(
    graph: &Graph,
    n: NodeId,
    opset: i64,
    known: &[Option<Known>],
) -> Result<Option<Vec<TensorType>>, String> {
    let node = graph.node(n);
    if node.inputs().iter().flatten().chain(node.outputs()).any(|&v| !graph.ty(v).is_tensor()) {
        return Ok(None);
    }
    let cx = node_cx(graph, n, opset, known);
    match infer_op(&cx)? {
        Outcome::Done(inf) => Ok(Some(inf.types)),
        Outcome::Skip(_) => Ok(None),
    }
}

/// Known contents of the initializers, indexed by `ValueId::index` (every
/// other value unknown): where both inference walks start.
fn init_known(graph: &Graph) -> Vec<Option<Known>> {
    let mut known: Vec<Option<Known>> = vec![None; graph.value_capacity()];
    for &v in graph.inits() {
        if let Some(t) = graph.value(v).init() {
            known[v.index()] = Known::from_tensor(t);
        }
    }
    known
}

/// Known contents of every value, computed by a pass over the graph (inits,
/// constants and shape arithmetic), indexed by `ValueId::index`.
pub(crate) fn known_table(graph: &Graph, opset: i64) -> Vec<Option<Known>> {
    let mut known = init_known(graph);
    for n in graph.schedule() {
        let cx = node_cx(graph, n, opset, &known);
        if let Ok(Outcome::Done(inf)) = infer_op(&cx) {
            for (slot, &v) in graph.node(n).outputs().iter().enumerate() {
                known[v.index()] = inf.known.get(slot).cloned().flatten();
            }
        }
    }
    known
}

fn bind_type(t: &TensorType, bind: &BTreeMap<String, i64>) -> TensorType {
    let f = |s: &str| bind.get(s).map(|&v| Dim::from(v));
    if !t.is_tensor() {
        return t.clone();
    }
    TensorType {
        container: None,
        dtype: t.dtype,
        shape: t.shape.as_ref().map(|s| s.iter().map(|d| d.substitute(&f)).collect()),
    }
}

fn shape_concrete(t: &TensorType) -> bool {
    t.shape.as_ref().is_some_and(|s| s.iter().all(Dim::is_const))
}

/// Infer dtypes and shapes for every value, in topological order, folding the
/// shape arithmetic exporters emit over symbolic dims.
pub fn infer_shapes(graph: &mut Graph, opset: i64, opts: &InferOptions) -> InferReport {
    let mut report = InferReport::default();
    let mut bind = opts.dims.clone();
    if let Some(b) = opts.batch {
        let mut any_sym = false;
        let mut fixed = None;
        for &v in graph.inputs() {
            if graph.value(v).init().is_some() {
                continue;
            }
            match graph.ty(v).shape.as_ref().and_then(|s| s.first()) {
                Some(d) if d.as_sym().is_some() => {
                    any_sym = true;
                    bind.insert(d.as_sym().unwrap_or_default().to_string(), b);
                }
                Some(d) => {
                    if let Some(c) = d.as_const() {
                        fixed.get_or_insert(c);
                    }
                }
                None => {}
            }
        }
        if !any_sym {
            report.fixed_batch = fixed;
        }
    }
    if !bind.is_empty() {
        let vals: Vec<ValueId> = graph.live_values().filter(|&v| graph.value(v).init().is_none()).collect();
        for v in vals {
            let t = bind_type(graph.ty(v), &bind);
            graph.set_ty(v, t);
        }
    }

    let mut known = init_known(graph);
    for n in graph.schedule() {
        let cx = node_cx(graph, n, opset, &known);
        let node = graph.node(n);
        let issue = |m: String| InferIssue { node: node.name.clone(), op: node.op.op_type().to_string(), message: m };
        let outs: Vec<ValueId> = node.outputs().to_vec();
        // Sequence, optional and map values are carried, not inferred.
        let containers = node.inputs().iter().flatten().chain(&outs).any(|&v| !graph.ty(v).is_tensor());
        // Identity passes a container through: an undeclared output takes its type.
        if containers && node.op == crate::Op::Identity {
            if let (Some(i), Some(&o)) = (node.input(0), outs.first()) {
                if !graph.ty(i).is_tensor() && *graph.ty(o) == TensorType::unknown() {
                    let t = graph.ty(i).clone();
                    graph.set_ty(o, t);
                }
            }
            continue;
        }
        let outcome = if containers {
            Ok(Outcome::Skip("reads or writes a sequence, optional or map value: types left as declared".into()))
        } else {
            infer_op(&cx)
        };
        match outcome {
            Err(m) => report.errors.push(issue(m)),
            Ok(Outcome::Skip(m)) => report.warnings.push(issue(m)),
            Ok(Outcome::Done(inf)) => {
                let mut warns = Vec::new();
                let mut updates = Vec::new();
                for (slot, &v) in outs.iter().enumerate() {
                    let declared = graph.ty(v);
                    let Some(new) = inf.types.get(slot) else { continue };
                    let merged = TensorType {
                        container: declared.container.clone(),
                        dtype: new.dtype.or(declared.dtype),
                        shape: new.shape.clone().or_else(|| declared.shape.clone()),
                    };
                    let dt_diff = matches!((declared.dtype, new.dtype), (Some(a), Some(b)) if a != b);
                    let sh_diff = shape_concrete(declared) && new.shape.is_some() && declared.shape != new.shape;
                    if dt_diff || sh_diff {
                        warns.push(issue(format!(
                            "output {slot} `{}` declared {declared} but inferred {merged}",
                            graph.value_name(v)
                        )));
                    }
                    known[v.index()] = inf.known.get(slot).cloned().flatten();
                    updates.push((v, merged));
                }
                report.warnings.extend(warns);
                for (v, t) in updates {
                    graph.set_ty(v, t);
                }
            }
        }
    }
    report.unknown = graph
        .live_values()
        .filter(|&v| matches!(graph.value(v).def, ValueDef::Node(..) | ValueDef::Input | ValueDef::Init(_)))
        .filter(|&v| !graph.ty(v).is_complete())
        .collect();
    report
}

/// Evaluate a node whose inputs are all constant, for constant folding.
/// `None` when the op is not evaluable here or an input is missing.
pub fn eval_node(graph: &Graph, node: NodeId, inputs: &[Option<&Tensor>], opset: i64) -> Option<Vec<Tensor>> {
    eval::eval(graph, node, inputs, opset)
}

/// Inference one node at a time, for frontends that need the types (and
/// known contents) of what they have built so far — e.g. a transpose of two
/// axes needs its input's rank to become an ONNX permutation.
#[derive(Clone, Debug, Default)]
pub struct Incremental {
    known: Vec<Option<Known>>,
}

impl Incremental {
    pub fn new() -> Incremental {
        Incremental::default()
    }

    /// Infer the outputs of node `n` (its inputs already inferred) and record
    /// their types on the graph. `Ok(false)` when the op has no rule.
    pub fn infer_node(&mut self, graph: &mut Graph, n: NodeId, opset: i64) -> Result<bool, String> {
        if self.known.len() < graph.value_capacity() {
            self.known.resize(graph.value_capacity(), None);
        }
        let cx = node_cx(graph, n, opset, &self.known);
        let outs: Vec<ValueId> = graph.node(n).outputs().to_vec();
        match infer_op(&cx)? {
            Outcome::Skip(_) => Ok(false),
            Outcome::Done(inf) => {
                for (slot, &v) in outs.iter().enumerate() {
                    if let Some(t) = inf.types.get(slot) {
                        let declared = graph.ty(v).clone();
                        let merged = TensorType {
                            container: None,
                            dtype: t.dtype.or(declared.dtype),
                            shape: t.shape.clone().or(declared.shape),
                        };
                        graph.set_ty(v, merged);
                    }
                    self.known[v.index()] = inf.known.get(slot).cloned().flatten();
                }
                Ok(true)
            }
        }
    }

    /// The known contents of `v` (small integer tensors, shape arithmetic),
    /// falling back to an initializer's values.
    pub fn known(&self, graph: &Graph, v: ValueId) -> Option<Known> {
        self.known.get(v.index()).cloned().flatten().or_else(|| graph.value(v).init().and_then(Known::from_tensor))
    }
}
