//! Per-node shape facts, computed once per graph and [`Bindings`] so that
//! costing a node at a precision is a few multiplications.
//!
//! [`GraphFacts::new`] binds every symbolic dimension, classifies each node
//! ([`Kind`]), counts FLOPs and the elements each phase (forward,
//! input-gradient, weight-gradient) moves through DRAM, records the GEMM
//! dimensions that decide Tensor Core eligibility, which inputs are trained
//! parameters, which values need gradients, and which values backward keeps
//! alive. Reads the graph's value types: run `infer-shapes` first.

use std::collections::{BTreeMap, HashMap, HashSet};

use qsync_ir::{DType, Dim, Graph, NodeId, Op, OpClass, ValueDef, ValueId};

use crate::{CostError, Result};

/// Values for symbolic dimensions (`batch`, `seq`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings {
    map: BTreeMap<String, i64>,
}

impl Bindings {
    pub fn new() -> Bindings {
        Bindings::default()
    }

    /// Bind `name` to `value` (builder style).
    pub fn with(mut self, name: &str, value: i64) -> Bindings {
        self.map.insert(name.to_string(), value);
        self
    }

    pub fn set(&mut self, name: &str, value: i64) {
        self.map.insert(name.to_string(), value);
    }

    pub fn get(&self, name: &str) -> Option<i64> {
        self.map.get(name).copied()
    }

    /// Concrete value of `d`, or the unbound symbols it mentions.
    pub fn eval(&self, d: &Dim) -> std::result::Result<i64, Vec<String>> {
        if let Some(c) = d.as_const() {
            return Ok(c);
        }
        let r = d.substitute(&|s| self.get(s).map(Dim::from));
        r.as_const()
            .ok_or_else(|| d.symbols().iter().filter(|s| self.get(s).is_none()).map(|s| s.to_string()).collect())
    }
}

/// How a node is costed.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Kind {
    /// Convolution (implicit GEMM on Tensor Cores when aligned).
    Conv,
    /// Gemm / MatMul / Einsum.
    Gemm,
    Norm,
    Softmax,
    Pool,
    Reduce,
    /// Elementwise arithmetic and activations.
    Elementwise,
    /// Data movement that copies (Transpose, Concat, Gather, Slice, …).
    Copy,
    /// Views that move no data (Reshape, Flatten, Squeeze, …).
    View,
    /// Shape arithmetic on small integer tensors (runs on the host).
    Host,
    Dropout,
    Loss,
    Cast,
    Other,
}

impl Kind {
    pub const ALL: [Kind; 14] = [
        Kind::Conv,
        Kind::Gemm,
        Kind::Norm,
        Kind::Softmax,
        Kind::Pool,
        Kind::Reduce,
        Kind::Elementwise,
        Kind::Copy,
        Kind::View,
        Kind::Host,
        Kind::Dropout,
        Kind::Loss,
        Kind::Cast,
        Kind::Other,
    ];

    /// The kind's name in measurement files and profiles (`conv`, `gemm`, …).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Conv => "conv",
            Kind::Gemm => "gemm",
            Kind::Norm => "norm",
            Kind::Softmax => "softmax",
            Kind::Pool => "pool",
            Kind::Reduce => "reduce",
            Kind::Elementwise => "elementwise",
            Kind::Copy => "copy",
            Kind::View => "view",
            Kind::Host => "host",
            Kind::Dropout => "dropout",
            Kind::Loss => "loss",
            Kind::Cast => "cast",
            Kind::Other => "other",
        }
    }

    /// The kind named `name` ([`Kind::name`]).
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kind does work per element that the roofline's FLOPs and
    /// bytes leave out: dropout draws a random number for every element,
    /// which costs what the generator costs on the device (a CPU's scalar
    /// generator many times a fused add). Only such kinds get a fitted
    /// factor of their own in a profile (`ProfileEfficiency::kinds`).
    pub fn has_uncounted_work(self) -> bool {
        matches!(self, Kind::Dropout)
    }

    /// Whether the op has a matrix-multiply core (Tensor Core candidate).
    pub fn is_gemm_like(self) -> bool {
        matches!(self, Kind::Conv | Kind::Gemm)
    }
}

/// One phase of a node's work: FLOPs, DRAM traffic in elements of the compute
/// precision, and precision-independent bytes (indices, masks).
#[derive(Copy, Clone, PartialEq, Debug, Default)]
pub struct Work {
    pub flops: f64,
    pub elems: f64,
    pub fixed_bytes: f64,
    /// Kernels launched.
    pub kernels: f64,
    /// Elements a GEMM-like phase writes: its parallel work for the wave
    /// model (`model::wave_factor`). 0 for other phases.
    pub outputs: f64,
}

impl Work {
    fn new(flops: f64, elems: f64) -> Work {
        Work { flops, elems, fixed_bytes: 0.0, kernels: 1.0, outputs: 0.0 }
    }

    /// A GEMM-like phase writing `outputs` elements.
    fn gemm(flops: f64, elems: f64, outputs: f64) -> Work {
        Work { outputs, ..Work::new(flops, elems) }
    }

    /// This phase with its per-sample work multiplied by `scale` (the same
    /// node at `scale` times the batch): FLOPs, the fixed bytes (indices,
    /// masks) and the elements other than the `weight` elements it reads or
    /// writes once; the outputs too, unless `outputs_per_sample` is false
    /// (a weight gradient writes the weights' size at any batch). Kernels
    /// stay.
    pub fn scaled(&self, scale: f64, weight: f64, outputs_per_sample: bool) -> Work {
        let once = weight.min(self.elems);
        Work {
            flops: self.flops * scale,
            elems: once + (self.elems - once) * scale,
            fixed_bytes: self.fixed_bytes * scale,
            kernels: self.kernels,
            outputs: if outputs_per_sample { self.outputs * scale } else { self.outputs },
        }
    }

    /// Nothing to do (no kernel).
    pub fn is_empty(&self) -> bool {
        self.kernels == 0.0
    }
}

/// Shape facts of one node.
#[derive(Clone, PartialEq, Debug)]
pub struct NodeFacts {
    pub kind: Kind,
    pub fwd: Work,
    pub bwd_input: Work,
    pub bwd_weight: Work,
    /// Elements of float activation inputs (not parameters).
    pub act_in: f64,
    /// Elements of trained parameters consumed.
    pub weight: f64,
    /// Elements of the outputs.
    pub out: f64,
    /// Dimensions that must be multiples of the Tensor Core alignment
    /// (GEMM m, n, k; channel counts for convolutions); empty if not a GEMM.
    pub align_dims: Vec<i64>,
    /// Whether any input needs a gradient (the node has a backward).
    pub needs_backward: bool,
    /// `op|shape,shape,…`: the key calibration profiles use.
    pub profile_key: String,
}

/// Facts for a whole graph under one set of bindings.
#[derive(Clone, Debug)]
pub struct GraphFacts {
    nodes: Vec<Option<NodeFacts>>,
    /// Elements of each value (`None` when unknown), by `ValueId::index`.
    elems: Vec<Option<f64>>,
    params: Vec<ValueId>,
    is_param: Vec<bool>,
    requires_grad: Vec<bool>,
    saved: Vec<Vec<ValueId>>,
    saved_extra: Vec<f64>,
    order: Vec<NodeId>,
    copies: Vec<(ValueId, DType)>,
}

fn view_op(op: &Op) -> bool {
    matches!(op, Op::Reshape | Op::Flatten | Op::Squeeze | Op::Unsqueeze | Op::Identity | Op::Expand)
}

/// FLOPs per output element of elementwise ops: transcendental ones cost more.
fn elementwise_flops(op: &Op) -> f64 {
    match op {
        Op::Erf | Op::Gelu | Op::Pow | Op::Mish | Op::Softplus | Op::Selu | Op::Elu | Op::Celu => 8.0,
        Op::Exp
        | Op::Log
        | Op::Sqrt
        | Op::Reciprocal
        | Op::Div
        | Op::Sigmoid
        | Op::Tanh
        | Op::HardSwish
        | Op::HardSigmoid => 4.0,
        // x·sigmoid(αx): a sigmoid and two multiplies.
        Op::Swish => 6.0,
        // x·cos + rotate(x)·sin per element.
        Op::RotaryEmbedding => 3.0,
        _ => 1.0,
    }
}

/// Ops that keep their output (not input) for backward.
fn saves_output(op: &Op) -> bool {
    matches!(op, Op::Relu | Op::Sigmoid | Op::Tanh | Op::Exp | Op::Softmax | Op::LogSoftmax | Op::Sqrt | Op::Clip)
}

/// Ops whose backward needs none of their inputs.
fn saves_nothing(op: &Op) -> bool {
    matches!(op.class(), OpClass::Movement | OpClass::Shape | OpClass::Cast | OpClass::Reduce)
        || matches!(
            op,
            Op::Add | Op::Sub | Op::Neg | Op::Sum | Op::Mean | Op::GlobalAveragePool | Op::AveragePool | Op::Dropout
        )
}

/// Whether node `n`'s backward keeps the value it reads at input `slot`,
/// by the rules [`GraphFacts`] records saved values with (PyTorch
/// autograd's), given which values require a gradient. Conv and MatMul-class
/// ops count as keeping every input: the memory model charges their
/// low-precision weight copies whatever the slot. A low-precision copy of a
/// weight that its reader keeps is alive at the memory peak either way, cast
/// per iteration or stored.
pub fn keeps_input(graph: &Graph, n: NodeId, slot: usize, requires_grad: impl Fn(ValueId) -> bool) -> bool {
    let node = graph.node(n);
    if matches!(node.op.class(), OpClass::Conv | OpClass::MatMul) {
        return true;
    }
    if saves_nothing(&node.op) || saves_output(&node.op) {
        return false;
    }
    if matches!(node.op, Op::Mul | Op::Div) && node.inputs().len() == 2 {
        let rg = |s: usize| node.input(s).is_some_and(&requires_grad);
        return match (&node.op, slot) {
            (Op::Div, 1) => rg(0) || rg(1),
            (_, 0) => rg(1),
            (_, _) => rg(0),
        };
    }
    true
}

/// Decomposed erf-GELUs, as exporters without an ONNX `Gelu` write them:
/// `Mul(x, Add(Erf(Div(x, c)), 1))` (the `* 0.5` after or before it is a
/// Mul by a constant, which keeps nothing). PyTorch trains the fused op,
/// whose backward keeps only `x`. Returns the outer Mul → `x`, and the inner
/// Div / Erf / Add nodes, which then keep nothing.
fn erf_gelus(graph: &Graph) -> (HashMap<NodeId, ValueId>, HashSet<NodeId>) {
    let (mut muls, mut inner) = (HashMap::new(), HashSet::new());
    let prod = |v: Option<ValueId>, op: fn(&Op) -> bool| -> Option<NodeId> {
        let (p, _) = graph.producer(v?)?;
        op(&graph.node(p).op).then_some(p)
    };
    for n in graph.node_ids() {
        let node = graph.node(n);
        if !matches!(node.op, Op::Mul) || node.inputs().len() != 2 {
            continue;
        }
        for (xi, ai) in [(0, 1), (1, 0)] {
            let Some(x) = node.input(xi) else { continue };
            let Some(add) = prod(node.input(ai), |o| matches!(o, Op::Add)) else { continue };
            let an = graph.node(add);
            let Some((erf, _)) =
                [an.input(0), an.input(1)].into_iter().find_map(|v| prod(v, |o| matches!(o, Op::Erf)).map(|e| (e, v)))
            else {
                continue;
            };
            let Some(div) = prod(graph.node(erf).input(0), |o| matches!(o, Op::Div | Op::Mul)) else { continue };
            if graph.node(div).input(0) != Some(x) {
                continue;
            }
            muls.insert(n, x);
            inner.extend([add, erf, div]);
            break;
        }
    }
    (muls, inner)
}

impl GraphFacts {
    /// Bind every dimension and compute the facts of every node. Errors name
    /// the node and value with an unbound symbol or an unknown shape.
    pub fn new(graph: &Graph, bindings: &Bindings) -> Result<GraphFacts> {
        let cap = graph.value_capacity();
        let mut elems: Vec<Option<f64>> = vec![None; cap];
        let mut shapes: Vec<Option<Vec<i64>>> = vec![None; cap];
        let mut unbound: Vec<Option<(String, Vec<String>)>> = vec![None; cap];
        for v in graph.live_values() {
            let Some(shape) = &graph.ty(v).shape else { continue };
            let mut dims = Vec::with_capacity(shape.len());
            for d in shape {
                match bindings.eval(d) {
                    Ok(c) => dims.push(c.max(0)),
                    Err(syms) => {
                        unbound[v.index()] = Some((d.to_string(), syms));
                        break;
                    }
                }
            }
            if unbound[v.index()].is_none() {
                elems[v.index()] = Some(dims.iter().map(|&d| d as f64).product());
                shapes[v.index()] = Some(dims);
            }
        }

        // Trained parameters: float initializers with more than one element,
        // excluding normalisation running statistics.
        let mut buffers = HashSet::new();
        for n in graph.node_ids() {
            if matches!(graph.node(n).op, Op::BatchNormalization) {
                buffers.extend([graph.node(n).input(3), graph.node(n).input(4)].into_iter().flatten());
            }
        }
        let mut is_param = vec![false; cap];
        let mut params = Vec::new();
        for &v in graph.inits() {
            if let ValueDef::Init(t) = &graph.value(v).def {
                if t.dtype.is_float() && t.numel() > 1 && !buffers.contains(&v) {
                    is_param[v.index()] = true;
                    // A refreshed copy is read as a weight (its gradient is
                    // its master's), but the master is what is trained.
                    if graph.master_of(v).is_none() {
                        params.push(v);
                    }
                }
            }
        }

        let order = graph.schedule();
        let is_float = |v: ValueId| graph.ty(v).dtype.is_some_and(DType::is_float);
        let mut requires_grad = is_param.clone();
        let mut nodes: Vec<Option<NodeFacts>> = vec![None; node_bound(graph)];
        let mut saved: Vec<Vec<ValueId>> = vec![Vec::new(); node_bound(graph)];
        let mut saved_extra = vec![0.0; node_bound(graph)];
        let (gelu_mul, gelu_inner) = erf_gelus(graph);
        // Weights as the ops read them: parameters and their per-iteration
        // casts (a Conv reading `Cast(W)` still computes a weight gradient).
        let mut weight_like = is_param.clone();
        for &n in &order {
            let node = graph.node(n);
            if node.op == Op::Cast && node.input(0).is_some_and(|v| weight_like[v.index()]) {
                for &o in node.outputs() {
                    weight_like[o.index()] = true;
                }
            }
            // QuantizeLinear / DequantizeLinear pass gradients straight
            // through (quantization-aware training): the quantized value
            // between them carries the gradient though it is not float.
            let qdq = matches!(node.op, Op::QuantizeLinear | Op::DequantizeLinear);
            let needs_backward =
                node.inputs().iter().flatten().any(|v| requires_grad[v.index()] && (is_float(*v) || qdq));
            let differentiable = !matches!(node.op.class(), OpClass::Shape | OpClass::Random)
                && !matches!(
                    node.op,
                    Op::ArgMax | Op::ArgMin | Op::Equal | Op::Less | Op::Greater | Op::Not | Op::NonZero
                );
            let grads_flow = needs_backward && (differentiable || matches!(node.op, Op::Dropout));
            for &o in node.outputs() {
                requires_grad[o.index()] = grads_flow && (is_float(o) || qdq);
            }
            let f = node_facts(graph, n, &elems, &shapes, &unbound, &weight_like, &requires_grad, grads_flow)?;
            if grads_flow && !saves_nothing(&node.op) && !gelu_inner.contains(&n) {
                let keep = |v: ValueId| is_float(v) && !is_param[v.index()] && graph.value(v).init().is_none();
                let vals: Vec<ValueId> = if let Some(&x) = gelu_mul.get(&n) {
                    // A decomposed erf-GELU: PyTorch's GeluBackward keeps only x.
                    vec![x]
                } else if saves_output(&node.op) {
                    node.outputs().first().copied().into_iter().collect()
                } else if matches!(node.op, Op::Mul | Op::Div | Op::MatMul) && node.inputs().len() == 2 {
                    // Autograd keeps an operand only when the other one's
                    // gradient needs it: Mul/MatMul keep a iff b requires grad
                    // and b iff a does; Div keeps b iff either does, a iff b does.
                    let (a, b) = (node.input(0), node.input(1));
                    let rg = |v: Option<ValueId>| v.is_some_and(|v| requires_grad[v.index()]);
                    let keep_a = rg(b);
                    let keep_b = if matches!(node.op, Op::Div) { rg(a) || rg(b) } else { rg(a) };
                    [(a, keep_a), (b, keep_b)].into_iter().filter_map(|(v, k)| v.filter(|&v| k && keep(v))).collect()
                } else {
                    node.inputs().iter().flatten().copied().filter(|&v| keep(v)).collect()
                };
                saved[n.index()] = vals;
            }
            saved_extra[n.index()] = match node.op {
                // PyTorch keeps int64 argmax indices for max pooling, a bool mask for dropout.
                Op::MaxPool if grads_flow => f.out * 8.0,
                Op::Dropout if grads_flow => f.out,
                _ => 0.0,
            };
            nodes[n.index()] = Some(f);
        }
        let copies = graph.refreshed_copies().filter_map(|(c, _)| Some((c, graph.value(c).init()?.dtype))).collect();
        Ok(GraphFacts { nodes, elems, params, is_param, requires_grad, saved, saved_extra, order, copies })
    }

    /// Facts of node `n`.
    pub fn node(&self, n: NodeId) -> Result<&NodeFacts> {
        self.nodes.get(n.index()).and_then(Option::as_ref).ok_or(CostError::NoSuchNode(n.index()))
    }

    /// Elements of value `v`, when its shape is known.
    pub fn elements(&self, v: ValueId) -> Option<f64> {
        self.elems.get(v.index()).copied().flatten()
    }

    /// Refreshed low-precision copies of trained parameters and their dtypes
    /// (the graph reads them as weights; the optimizer step rewrites them).
    pub fn copies(&self) -> &[(ValueId, DType)] {
        &self.copies
    }

    /// Trained parameters (float initializers, without normalisation
    /// buffers and refreshed copies; the masters of copies are included even
    /// when the graph reads only their copies).
    pub fn params(&self) -> &[ValueId] {
        &self.params
    }

    pub fn is_param(&self, v: ValueId) -> bool {
        self.is_param.get(v.index()).copied().unwrap_or(false)
    }

    /// Whether backward computes a gradient for `v`.
    pub fn requires_grad(&self, v: ValueId) -> bool {
        self.requires_grad.get(v.index()).copied().unwrap_or(false)
    }

    /// Values node `n` keeps for its backward.
    pub fn saved(&self, n: NodeId) -> &[ValueId] {
        self.saved.get(n.index()).map_or(&[], Vec::as_slice)
    }

    /// Precision-independent bytes node `n` keeps for backward (indices, masks).
    pub fn saved_extra_bytes(&self, n: NodeId) -> f64 {
        self.saved_extra.get(n.index()).copied().unwrap_or(0.0)
    }

    /// The topological order the facts were computed in.
    pub fn order(&self) -> &[NodeId] {
        &self.order
    }
}

#[allow(clippy::too_many_arguments)]
fn node_facts(
    graph: &Graph,
    n: NodeId,
    elems: &[Option<f64>],
    shapes: &[Option<Vec<i64>>],
    unbound: &[Option<(String, Vec<String>)>],
    weight_like: &[bool],
    requires_grad: &[bool],
    needs_backward: bool,
) -> Result<NodeFacts> {
    let node = graph.node(n);
    let op = &node.op;
    let all_int_small = node.outputs().iter().all(|&o| {
        let ty = graph.ty(o);
        !ty.dtype.is_some_and(DType::is_float) && elems[o.index()].is_none_or(|e| e <= 4096.0)
    });
    let host =
        op.class() == OpClass::Shape || (all_int_small && !matches!(op.class(), OpClass::Conv | OpClass::MatMul));
    let kind = if host {
        Kind::Host
    } else if view_op(op) {
        Kind::View
    } else if *op == Op::Attention {
        // Two batched GEMMs around a softmax: Tensor Core work.
        Kind::Gemm
    } else {
        match op.class() {
            OpClass::Conv => Kind::Conv,
            OpClass::MatMul => Kind::Gemm,
            OpClass::Norm => Kind::Norm,
            OpClass::Softmax => Kind::Softmax,
            OpClass::Pool => Kind::Pool,
            OpClass::Reduce => Kind::Reduce,
            OpClass::Binary | OpClass::Unary | OpClass::Activation => Kind::Elementwise,
            OpClass::Movement => Kind::Copy,
            OpClass::Cast => Kind::Cast,
            OpClass::Random => Kind::Dropout,
            OpClass::Loss => Kind::Loss,
            _ => Kind::Other,
        }
    };
    let tiny = Work { flops: 0.0, elems: 0.0, fixed_bytes: 0.0, kernels: 0.0, outputs: 0.0 };
    let key_shapes: Vec<String> = node
        .inputs()
        .iter()
        .map(|i| match i.and_then(|v| shapes[v.index()].as_ref()) {
            Some(s) => s.iter().map(i64::to_string).collect::<Vec<_>>().join("x"),
            None => "_".to_string(),
        })
        .collect();
    let profile_key = format!("{}|{}", op.op_type(), key_shapes.join(","));
    if kind == Kind::Host || kind == Kind::View {
        return Ok(NodeFacts {
            kind,
            fwd: tiny,
            bwd_input: tiny,
            bwd_weight: tiny,
            act_in: 0.0,
            weight: 0.0,
            out: 0.0,
            align_dims: Vec::new(),
            needs_backward,
            profile_key,
        });
    }

    // Every value this node touches must have a concrete shape.
    let known = |v: ValueId| -> Result<f64> {
        if let Some((dim, syms)) = &unbound[v.index()] {
            return Err(CostError::UnboundSymbol {
                node: node.name.clone(),
                value: graph.value_name(v).to_string(),
                dim: dim.clone(),
                symbols: syms.join(", "),
            });
        }
        elems[v.index()]
            .ok_or_else(|| CostError::UnknownShape { node: node.name.clone(), value: graph.value_name(v).to_string() })
    };
    let is_float = |v: ValueId| graph.ty(v).dtype.is_some_and(DType::is_float);
    let (mut act_in, mut weight, mut int_in, mut act_grad) = (0.0, 0.0, 0.0, 0.0);
    let (mut n_act_grad, mut n_weight) = (0.0, 0.0);
    for (slot, v) in node.inputs().iter().enumerate() {
        let Some(v) = *v else { continue };
        let e = match known(v) {
            Ok(e) => e,
            // Secondary integer inputs (axes, shapes) may stay unknown.
            Err(_) if slot > 0 && !is_float(v) => continue,
            Err(err) => return Err(err),
        };
        if !is_float(v) {
            int_in += e * graph.ty(v).dtype.map_or(8.0, |d| (d.bits() as f64 / 8.0).max(1.0));
        } else if weight_like[v.index()] {
            weight += e;
            n_weight += 1.0;
        } else {
            act_in += e;
            if requires_grad[v.index()] {
                act_grad += e;
                n_act_grad += 1.0;
            }
        }
    }
    let out0 = node.outputs().first().copied().ok_or_else(|| CostError::BadNode {
        node: node.name.clone(),
        op: op.op_type().into(),
        message: "no outputs".into(),
    })?;
    let mut out = known(out0)?;
    for &o in node.outputs().iter().skip(1) {
        if is_float(o) {
            out += elems[o.index()].unwrap_or(0.0);
        }
    }
    let shape = |slot: usize| node.input(slot).and_then(|v| shapes[v.index()].clone());
    let bad = |m: &str| CostError::BadNode { node: node.name.clone(), op: op.op_type().into(), message: m.into() };
    let has_bwd = needs_backward;
    let mut align_dims = Vec::new();
    let (fwd, bwd_input, bwd_weight);
    match kind {
        Kind::Conv => {
            let x = shape(0).ok_or_else(|| bad("input has no shape"))?;
            let w = shape(1).ok_or_else(|| bad("weight has no shape"))?;
            if x.len() < 3 || w.len() != x.len() {
                return Err(bad("convolution input and weight ranks do not match"));
            }
            let g = node.attr_int("group").unwrap_or(1).max(1);
            let kernel: f64 = w[2..].iter().map(|&d| d as f64).product();
            // Weight is [Cout, Cin/g, k…] for Conv and [Cin, Cout/g, k…] for ConvTranspose.
            let (macs, cin_g, cout_g) = if matches!(op, Op::ConvTranspose) {
                (elems[node.input(0).map_or(0, |v| v.index())].unwrap_or(0.0) * w[1] as f64 * kernel, x[1] / g, w[1])
            } else {
                (out * w[1] as f64 * kernel, w[1], w[0] / g)
            };
            align_dims = vec![cin_g, cout_g];
            let bias = if node.input(2).is_some() { out } else { 0.0 };
            fwd = Work::gemm(2.0 * macs + bias, act_in + weight + out, out);
            bwd_input = if act_grad > 0.0 { Work::gemm(2.0 * macs, out + weight + act_grad, act_grad) } else { tiny };
            bwd_weight = if n_weight > 0.0 && has_bwd {
                Work::gemm(2.0 * macs + bias, out + act_in + weight, weight)
            } else {
                tiny
            };
        }
        Kind::Gemm if *op == Op::Attention => {
            let (q, k, v) = match (shape(0), shape(1), shape(2)) {
                (Some(q), Some(k), Some(v)) if q.len() == k.len() && q.len() == v.len() => (q, k, v),
                _ => return Err(bad("Q, K and V need shapes of one rank")),
            };
            let head_count = |name: &str| node.attr_int(name).filter(|&h| h > 0);
            // (batch·q_heads, q_seq, kv_seq, head_size, v_head_size)
            let (bh, sq, skv, dk, dv) = match q.len() {
                4 => (q[0] * q[1], q[2], k[2], k[3], v[3]),
                3 => {
                    let (hq, hkv) = head_count("q_num_heads")
                        .zip(head_count("kv_num_heads"))
                        .ok_or_else(|| bad("3-D Attention needs q_num_heads and kv_num_heads"))?;
                    (q[0] * hq, q[1], k[1], k[2] / hkv, v[2] / hkv)
                }
                _ => return Err(bad("Q must have rank 3 or 4")),
            };
            let total = skv + shape(4).filter(|p| p.len() == 4).map_or(0, |p| p[2]);
            let scores = (bh * sq * total) as f64;
            // QKᵀ and ·V, plus scale, mask and softmax over the scores.
            let macs = scores * (dk + dv) as f64;
            align_dims = vec![dk, dv, total];
            fwd = Work::gemm(2.0 * macs + 8.0 * scores, act_in + weight + out + scores, out);
            // dV, dP, then dQ and dK: twice the forward GEMMs.
            bwd_input = if act_grad > 0.0 {
                Work::gemm(4.0 * macs + 8.0 * scores, out + act_in + act_grad + 2.0 * scores, act_grad)
            } else {
                tiny
            };
            bwd_weight = tiny;
        }
        Kind::Gemm => {
            let a = shape(0).ok_or_else(|| bad("A has no shape"))?;
            let b = shape(1).ok_or_else(|| bad("B has no shape"))?;
            let (m, k, nn) = if matches!(op, Op::Gemm) {
                if a.len() != 2 || b.len() != 2 {
                    return Err(bad("Gemm needs 2-D A and B"));
                }
                let ta = node.attr_int("transA").unwrap_or(0) != 0;
                let tb = node.attr_int("transB").unwrap_or(0) != 0;
                let (m, k) = if ta { (a[1], a[0]) } else { (a[0], a[1]) };
                (m, k, if tb { b[0] } else { b[1] })
            } else {
                let m = if a.len() >= 2 { a[a.len() - 2] } else { 1 };
                let k = a.last().copied().unwrap_or(1);
                let nn = if b.len() >= 2 { b[b.len() - 1] } else { 1 };
                (m, k, nn)
            };
            let batch = if m * nn > 0 { (out / (m * nn) as f64).max(1.0) } else { 1.0 };
            let macs = batch * (m * nn * k) as f64;
            align_dims = vec![m, nn, k];
            let bias = if matches!(op, Op::Gemm) && node.input(2).is_some() { out } else { 0.0 };
            fwd = Work::gemm(2.0 * macs + bias, act_in + weight + out, out);
            bwd_input = if act_grad > 0.0 {
                Work::gemm(2.0 * macs * n_act_grad, out + act_in + weight + act_grad, act_grad)
            } else {
                tiny
            };
            bwd_weight = if n_weight > 0.0 && has_bwd {
                Work::gemm(2.0 * macs + bias, out + act_in + weight, weight)
            } else {
                tiny
            };
        }
        _ => {
            // Memory-bound kinds: (fwd flops/elem, fwd traffic, bwd flops/elem, bwd traffic).
            let (ff, fe, bf, be) = match kind {
                Kind::Norm => {
                    (8.0 * act_in, 2.0 * act_in + out + weight, 10.0 * act_in, 3.0 * out + 2.0 * act_in + weight)
                }
                Kind::Softmax => (5.0 * act_in, act_in + out, 3.0 * out, 3.0 * out),
                Kind::Loss => (6.0 * act_in, act_in + out, 3.0 * act_in, 2.0 * act_in),
                Kind::Pool => {
                    let window: f64 =
                        node.attr_ints("kernel_shape").map_or(1.0, |k| k.iter().map(|&d| d as f64).product());
                    let f = if matches!(op, Op::GlobalAveragePool | Op::GlobalMaxPool) { act_in } else { out * window };
                    (f, act_in + out, f, act_in + out)
                }
                Kind::Reduce => (act_in, act_in + out, act_in, act_in + out),
                Kind::Dropout => (3.0 * out, act_in + out, out, act_in + out),
                Kind::Copy => {
                    let moved = if matches!(op, Op::Gather | Op::GatherElements | Op::GatherND) {
                        2.0 * out
                    } else {
                        act_in.max(out) + out
                    };
                    (0.0, moved, 0.0, moved)
                }
                _ => {
                    let c = elementwise_flops(op);
                    (c * out, act_in + weight + out, c * out, out + act_in + act_grad)
                }
            };
            let mut f = Work::new(ff, fe);
            f.fixed_bytes = int_in + if kind == Kind::Dropout { out } else { 0.0 };
            fwd = f;
            bwd_input = if act_grad > 0.0 {
                let mut w = Work::new(bf, be);
                w.fixed_bytes = if matches!(kind, Kind::Dropout) {
                    out
                } else if matches!(op, Op::MaxPool) {
                    out * 8.0
                } else {
                    0.0
                };
                w
            } else {
                tiny
            };
            // Norm affine gradients come out of the input-gradient kernel;
            // other parameters (biases, embeddings) need a reduction or a scatter.
            bwd_weight = if n_weight > 0.0 && has_bwd && kind != Kind::Norm {
                if kind == Kind::Copy {
                    Work::new(out, weight + 2.0 * out)
                } else {
                    Work::new(out, out + weight)
                }
            } else {
                tiny
            };
        }
    }
    Ok(NodeFacts { kind, fwd, bwd_input, bwd_weight, act_in, weight, out, align_dims, needs_backward, profile_key })
}

/// One past the largest node index (dense per-node tables).
pub(crate) fn node_bound(graph: &Graph) -> usize {
    graph.dag().node_indices().map(|n| n.index() + 1).max().unwrap_or(0)
}
