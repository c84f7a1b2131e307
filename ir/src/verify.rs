//! The verifier: checks a graph's structural and type invariants and reports
//! every problem at once.
//!
//! Checked: uses of undefined or removed values, undefined graph outputs,
//! names defined twice, dependency cycles, input arity of known ops, dtype
//! agreement between inputs that must share a type (and `Cast` outputs
//! against `to`), and — by re-running per-node shape inference on the
//! recorded input types — recorded output types that contradict the op's
//! semantics (a different rank or a different known dimension; a symbol
//! against a different symbol is not an error).

use std::collections::BTreeMap;
use std::fmt;

use crate::infer::{infer_node_types, known_table};
use crate::{DType, Graph, Node, NodeId, Op, ValueDef};

/// One problem found by [`verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The node at fault, when there is one.
    pub node: Option<String>,
    /// Its op type.
    pub op: Option<String>,
    pub message: String,
}

impl VerifyError {
    fn at(node: &Node, message: String) -> VerifyError {
        VerifyError { node: Some(node.name.clone()), op: Some(node.op.op_type().to_string()), message }
    }

    fn graph(message: String) -> VerifyError {
        VerifyError { node: None, op: None, message }
    }
}

/// `node "/conv1/Conv" (Conv): input 1 has dtype f16 but input 0 has f32`
impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.node, &self.op) {
            (Some(n), Some(op)) => write!(f, "node {n:?} ({op}): {}", self.message),
            (Some(n), None) => write!(f, "node {n:?}: {}", self.message),
            (None, Some(op)) => write!(f, "({op}): {}", self.message),
            (None, None) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for VerifyError {}

const MANY: usize = usize::MAX;

/// `(min, max)` number of inputs (omitted optional inputs count as slots).
fn arity(op: &Op, opset: i64) -> Option<(usize, usize)> {
    use Op::*;
    if op.is_unary_same_shape() {
        return Some((1, 1));
    }
    Some(match op {
        IsNaN
        | IsInf
        | Transpose
        | Flatten
        | Shape
        | Size
        | NonZero
        | EyeLike
        | GlobalAveragePool
        | GlobalMaxPool
        | GlobalLpPool
        | MaxPool
        | AveragePool
        | LpPool
        | ArgMax
        | ArgMin
        | DepthToSpace
        | SpaceToDepth
        | RandomNormalLike
        | RandomUniformLike
        | Bernoulli
        | Multinomial
        | DynamicQuantizeLinear => (1, 1),
        Add | Sub | Mul | Div | Pow | Mod | BitShift | And | Or | Xor | BitwiseAnd | BitwiseOr | BitwiseXor | Equal
        | Less | LessOrEqual | Greater | GreaterOrEqual | PRelu | MatMul | GatherElements | GatherND | Gather
        | CastLike | CumSum | Expand | Tile => (2, 2),
        Max | Min | Sum | Mean | Concat | Einsum => (1, MANY),
        Where | Range | OneHot => (3, 3),
        Cast | ConstantOfShape => (1, 1),
        Constant | RandomNormal | RandomUniform => (0, 0),
        Conv | ConvTranspose | Gemm => (2, 3),
        ConvInteger | MatMulInteger => (2, 4),
        QLinearConv => (8, 9),
        QLinearMatMul => (8, 8),
        Reshape => {
            if opset >= 5 {
                (2, 2)
            } else {
                (1, 1)
            }
        }
        Split => (1, 2),
        Slice => {
            if opset >= 10 {
                (3, 5)
            } else {
                (1, 1)
            }
        }
        Squeeze | Unsqueeze => {
            if opset >= 13 {
                (1, 2)
            } else {
                (1, 1)
            }
        }
        Pad => {
            if opset >= 11 {
                (2, 4)
            } else {
                (1, 1)
            }
        }
        BatchNormalization => (5, 5),
        LayerNormalization => (2, 3),
        InstanceNormalization => (3, 3),
        GroupNormalization => (3, 3),
        ReduceSum | ReduceMean | ReduceMax | ReduceMin | ReduceProd | ReduceL1 | ReduceL2 | ReduceLogSum
        | ReduceLogSumExp | ReduceSumSquare => (1, 2),
        Dropout => (1, 3),
        Clip => (1, 3),
        TopK => {
            if opset >= 10 {
                (2, 2)
            } else {
                (1, 1)
            }
        }
        Resize => (1, 4),
        Upsample => (1, 2),
        QuantizeLinear | DequantizeLinear => (2, 3),
        Trilu => (1, 2),
        SoftmaxCrossEntropyLoss | NegativeLogLikelihoodLoss => (2, 3),
        ScatterElements | ScatterND | Scatter => (3, 3),
        _ => return None,
    })
}

/// Input slots whose dtypes must agree.
fn same_dtype_slots(op: &Op, n_in: usize) -> Vec<usize> {
    use Op::*;
    match op {
        Add | Sub | Mul | Div | Mod | And | Or | Xor | BitwiseAnd | BitwiseOr | BitwiseXor | BitShift | Equal
        | Less | LessOrEqual | Greater | GreaterOrEqual | PRelu | Max | Min | Sum | Mean | Concat | MatMul => {
            (0..n_in).collect()
        }
        Conv | ConvTranspose | Gemm => (0..n_in.min(3)).collect(),
        LayerNormalization | InstanceNormalization | GroupNormalization => (0..n_in.min(3)).collect(),
        Where => vec![1, 2],
        Expand | Reshape | Tile | Transpose | Squeeze | Unsqueeze => vec![],
        _ => vec![],
    }
}

fn check_node(
    graph: &Graph,
    n: NodeId,
    opset: i64,
    known: &[Option<crate::infer::Known>],
    errs: &mut Vec<VerifyError>,
) {
    let node = graph.node(n);
    let mut inputs_ok = true;
    for (slot, v) in node.inputs().iter().enumerate() {
        let Some(v) = *v else { continue };
        match graph.value(v).def {
            ValueDef::Undefined => {
                inputs_ok = false;
                errs.push(VerifyError::at(node, format!("input {slot} `{}` is undefined", graph.value_name(v))));
            }
            ValueDef::Removed => {
                inputs_ok = false;
                errs.push(VerifyError::at(node, format!("input {slot} `{}` was removed", graph.value_name(v))));
            }
            _ => {}
        }
    }
    for c in node.captures() {
        let what = match graph.value(c.value).def {
            ValueDef::Undefined => "is undefined",
            ValueDef::Removed => "was removed",
            _ => continue,
        };
        errs.push(VerifyError::at(
            node,
            format!("value `{}` read by its subgraphs (as `{}`) {what}", graph.value_name(c.value), c.name),
        ));
    }
    // The schema's float type constraint on every input (see
    // `Op::float_input_allowed_at`): e.g. Celu computes only in f32, and
    // Pow's exponent takes bf16 only from opset 15.
    for (slot, v) in node.inputs().iter().enumerate() {
        let Some(dt) = v.and_then(|v| graph.ty(v).dtype) else { continue };
        if node.op.float_input_allowed_at(slot, opset, dt) == Some(false) {
            errs.push(VerifyError::at(
                node,
                format!("input {slot} is {dt}, which the ONNX schema of {} at opset {opset} does not allow", node.op),
            ));
        }
    }
    let n_in = node.inputs().len();
    if let Some((lo, hi)) = arity(&node.op, opset) {
        if n_in < lo || n_in > hi {
            let want = if lo == hi {
                format!("{lo}")
            } else if hi == MANY {
                format!("at least {lo}")
            } else {
                format!("{lo} to {hi}")
            };
            errs.push(VerifyError::at(node, format!("has {n_in} inputs, expected {want}")));
            inputs_ok = false;
        } else if lo > 0
            && node.input(0).is_none()
            && !matches!(node.op, Op::Concat | Op::Max | Op::Min | Op::Sum | Op::Mean)
        {
            errs.push(VerifyError::at(node, "required input 0 is missing".into()));
            inputs_ok = false;
        }
    }
    // Dtype agreement.
    // BatchNormalization types its data (T), scale and bias (T1) and mean
    // and variance (T2) apart from opset 15 on; before, all are T.
    let groups: Vec<Vec<usize>> = match node.op {
        Op::BatchNormalization if opset >= 15 => vec![vec![1, 2], vec![3, 4]],
        Op::BatchNormalization => vec![(0..n_in.min(5)).collect()],
        _ => vec![same_dtype_slots(&node.op, n_in)],
    };
    for slots in groups {
        let typed: Vec<(usize, DType)> =
            slots.iter().filter_map(|&s| node.input(s).and_then(|v| graph.ty(v).dtype).map(|d| (s, d))).collect();
        if let Some(&(s0, d0)) = typed.first() {
            for &(s, d) in &typed[1..] {
                if d != d0 {
                    errs.push(VerifyError::at(node, format!("input {s} has dtype {d} but input {s0} has {d0}")));
                }
            }
        }
    }
    if matches!(node.op, Op::Where) {
        if let Some(d) = node.input(0).and_then(|v| graph.ty(v).dtype) {
            if d != DType::Bool {
                errs.push(VerifyError::at(node, format!("condition has dtype {d}, expected bool")));
            }
        }
    }
    if matches!(node.op, Op::Cast) {
        let to = node.attr_int("to").and_then(|c| i32::try_from(c).ok()).and_then(DType::from_onnx_code);
        match (to, node.outputs().first().and_then(|&v| graph.ty(v).dtype)) {
            (None, _) => errs.push(VerifyError::at(node, "missing or invalid `to`".into())),
            (Some(t), Some(o)) if t != o => {
                errs.push(VerifyError::at(node, format!("output has dtype {o} but `to` is {t}")))
            }
            _ => {}
        }
    }
    // Identity passes its input's kind through (tensor, sequence, optional, map).
    if matches!(node.op, Op::Identity) {
        if let (Some(i), Some(&o)) = (node.input(0), node.outputs().first()) {
            let (a, b) = (graph.ty(i), graph.ty(o));
            let known = |t: &crate::TensorType| !t.is_tensor() || t.dtype.is_some();
            if known(a) && known(b) && a.is_tensor() != b.is_tensor() {
                errs.push(VerifyError::at(node, format!("input is {a} but output `{}` is {b}", graph.value_name(o))));
            }
        }
    }
    // Shapes: re-run inference from the recorded input types.
    if !inputs_ok || node.op.is_opaque() {
        return;
    }
    match infer_node_types(graph, n, opset, known) {
        Err(m) => errs.push(VerifyError::at(node, m)),
        Ok(None) => {}
        Ok(Some(types)) => {
            for (slot, (&v, inf)) in node.outputs().iter().zip(&types).enumerate() {
                let rec = graph.ty(v);
                let name = graph.value_name(v);
                if let (Some(a), Some(b)) = (rec.dtype, inf.dtype) {
                    if a != b && !matches!(node.op, Op::Cast) {
                        errs.push(VerifyError::at(
                            node,
                            format!("output {slot} `{name}` has dtype {a} but the op gives {b}"),
                        ));
                    }
                }
                if let (Some(a), Some(b)) = (&rec.shape, &inf.shape) {
                    if a.len() != b.len() {
                        errs.push(VerifyError::at(
                            node,
                            format!(
                                "output {slot} `{name}` has rank {} but the op gives rank {} ({rec} vs {inf})",
                                a.len(),
                                b.len()
                            ),
                        ));
                    } else if let Some(i) = (0..a.len())
                        .find(|&i| matches!((a[i].as_const(), b[i].as_const()), (Some(x), Some(y)) if x != y))
                    {
                        errs.push(VerifyError::at(
                            node,
                            format!(
                                "output {slot} `{name}` has dimension {i} = {} but the op gives {} ({rec} vs {inf})",
                                a[i], b[i]
                            ),
                        ));
                    }
                }
            }
        }
    }
}

/// Cycle check on node inputs (the source of truth), in case the petgraph
/// edges missed a forward reference resolved after its user was added.
fn cycle_by_inputs(graph: &Graph) -> Result<(), Vec<NodeId>> {
    let ids = graph.node_ids();
    let mut indeg: std::collections::HashMap<NodeId, usize> = ids.iter().map(|&n| (n, 0)).collect();
    let mut users: std::collections::HashMap<NodeId, Vec<NodeId>> = std::collections::HashMap::new();
    for &n in &ids {
        for (_, v) in graph.node(n).reads() {
            if let Some((p, _)) = graph.producer(v) {
                if graph.contains_node(p) {
                    *indeg.entry(n).or_default() += 1;
                    users.entry(p).or_default().push(n);
                }
            }
        }
    }
    let mut ready: Vec<NodeId> = ids.iter().copied().filter(|n| indeg[n] == 0).collect();
    let mut done = 0;
    while let Some(n) = ready.pop() {
        done += 1;
        for &u in users.get(&n).map_or(&[][..], Vec::as_slice) {
            if let Some(d) = indeg.get_mut(&u) {
                *d -= 1;
                if *d == 0 {
                    ready.push(u);
                }
            }
        }
    }
    if done == ids.len() {
        Ok(())
    } else {
        Err(ids.into_iter().filter(|n| indeg[n] > 0).collect())
    }
}

/// Check the graph; `Err` holds every problem found.
pub fn verify(graph: &Graph, opset: i64) -> Result<(), Vec<VerifyError>> {
    let mut errs = Vec::new();
    // Doubly defined names. The empty name marks an omitted optional output
    // (ONNX writes `""`), of which a graph may have many.
    let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
    for v in graph.live_values().filter(|&v| !graph.value_name(v).is_empty()) {
        *by_name.entry(graph.value_name(v)).or_default() += 1;
    }
    for (name, count) in by_name {
        if count > 1 {
            errs.push(VerifyError::graph(format!("value `{name}` is defined {count} times")));
        }
    }
    // Cycles.
    if let Err(rest) = graph.topo_order().and_then(|_| cycle_by_inputs(graph)) {
        let names: Vec<String> =
            rest.iter().map(|&n| format!("{:?} ({})", graph.node(n).name, graph.node(n).op.op_type())).collect();
        errs.push(VerifyError::graph(format!("dependency cycle through nodes {}", names.join(", "))));
    }
    // Nodes.
    let known = known_table(graph, opset);
    for n in graph.node_ids() {
        check_node(graph, n, opset, &known, &mut errs);
    }
    // Refreshed copies: both initializers, float, same shape, other dtypes.
    for (c, m) in graph.refreshed_copies() {
        let (cn, mn) = (graph.value_name(c), graph.value_name(m));
        let (ct, mt) = (graph.value(c).init(), graph.value(m).init());
        let why = match (ct, mt) {
            (None, _) => Some(format!("`{cn}` is not an initializer")),
            (_, None) => Some(format!("master `{mn}` is not an initializer")),
            (Some(ct), Some(mt)) if !ct.dtype.is_float() || !mt.dtype.is_float() => {
                Some(format!("copy {} and master {} must both be float", ct.dtype, mt.dtype))
            }
            (Some(ct), Some(mt)) if ct.dtype == mt.dtype => Some(format!("copy and master are both {}", ct.dtype)),
            (Some(ct), Some(mt)) if ct.dims != mt.dims => {
                Some(format!("copy has shape {:?} but master `{mn}` has {:?}", ct.dims, mt.dims))
            }
            _ if graph.inputs().contains(&c) || graph.outputs().contains(&c) => {
                Some("a copy cannot be a graph input or output".to_string())
            }
            _ if graph.master_of(m).is_some() => Some(format!("master `{mn}` is itself a copy")),
            _ => None,
        };
        if let Some(why) = why {
            errs.push(VerifyError::graph(format!("refreshed copy `{cn}` of `{mn}`: {why}")));
        }
    }
    // Graph outputs.
    for &v in graph.outputs() {
        match graph.value(v).def {
            ValueDef::Undefined => {
                errs.push(VerifyError::graph(format!("graph output `{}` is undefined", graph.value_name(v))))
            }
            ValueDef::Removed => {
                errs.push(VerifyError::graph(format!("graph output `{}` was removed", graph.value_name(v))))
            }
            _ => {}
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{Attr, Dim, NodeSpec, Tensor, TensorType};

    fn t(dt: DType, dims: &[i64]) -> TensorType {
        TensorType::new(dt, dims.iter().map(|&d| Dim::from(d)).collect())
    }

    fn has(errs: &[VerifyError], node: Option<&str>, needle: &str) -> bool {
        errs.iter().any(|e| e.node.as_deref() == node && e.message.contains(needle))
    }

    #[test]
    fn clean_graph_verifies() {
        let mut g = Graph::new("ok");
        let x = g.add_input("x", t(DType::F32, &[1, 3, 8, 8]));
        let w = g.add_init("w", Tensor { dtype: DType::F32, dims: vec![4, 3, 3, 3], data: crate::TensorData::Absent });
        let n = g.add_node(NodeSpec::new("conv", Op::Conv).input(x).input(w).output("y", t(DType::F32, &[1, 4, 6, 6])));
        let y = g.node(n).outputs()[0];
        g.set_outputs(vec![y]);
        assert_eq!(verify(&g, 17), Ok(()));
    }

    #[test]
    fn reports_every_problem_at_once() {
        let mut g = Graph::new("bad");
        let x = g.add_input("x", t(DType::F32, &[1, 3, 8, 8]));
        let h = g.add_input("h", t(DType::F16, &[1, 3, 8, 8]));
        let w16 =
            g.add_init("w", Tensor { dtype: DType::F16, dims: vec![4, 3, 3, 3], data: crate::TensorData::Absent });
        // Conv X/W dtypes differ, and the recorded output shape is wrong.
        g.add_node(
            NodeSpec::new("/conv1/Conv", Op::Conv).input(x).input(w16).output("c", t(DType::F32, &[1, 4, 7, 6])),
        );
        // Conv arity.
        g.add_node(NodeSpec::new("lonely", Op::Conv).input(x).output("c2", t(DType::F32, &[1, 4, 6, 6])));
        // Add of f32 and f16.
        g.add_node(NodeSpec::new("add", Op::Add).input(x).input(h).output("a", t(DType::F32, &[1, 3, 8, 8])));
        // Use of an undefined value.
        let u = g.add_undefined("ghost");
        g.add_node(NodeSpec::new("relu", Op::Relu).input(u).output("r", TensorType::unknown()));
        // Doubly defined name.
        g.add_node(NodeSpec::new("dup", Op::Relu).input(x).output("a", t(DType::F32, &[1, 3, 8, 8])));
        // Cast output vs `to`.
        g.add_node(
            NodeSpec::new("cast", Op::Cast)
                .input(x)
                .attr("to", Attr::Int(10))
                .output("k", t(DType::F32, &[1, 3, 8, 8])),
        );
        // Wrong rank recorded.
        g.add_node(NodeSpec::new("flat", Op::Flatten).input(x).output("f", t(DType::F32, &[1, 3, 64])));
        // Where branches differ; condition not bool.
        g.add_node(
            NodeSpec::new("where", Op::Where).input(x).input(x).input(h).output("wh", t(DType::F32, &[1, 3, 8, 8])),
        );
        // Removed value used.
        let rm = g.add_node(NodeSpec::new("gone", Op::Relu).input(x).output("gone_out", t(DType::F32, &[1, 3, 8, 8])));
        let gone = g.node(rm).outputs()[0];
        g.add_node(NodeSpec::new("user", Op::Relu).input(gone).output("uu", t(DType::F32, &[1, 3, 8, 8])));
        g.remove_node(rm);
        let ghost_out = g.add_undefined("missing_out");
        g.set_outputs(vec![ghost_out, gone]);

        let errs = verify(&g, 17).unwrap_err();
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        let dump = text.join("\n");
        assert!(
            text.contains(&"node \"/conv1/Conv\" (Conv): input 1 has dtype f16 but input 0 has f32".to_string()),
            "{dump}"
        );
        assert!(has(&errs, Some("/conv1/Conv"), "dimension 2 = 7 but the op gives 6"), "{dump}");
        assert!(has(&errs, Some("lonely"), "has 1 inputs, expected 2 to 3"), "{dump}");
        assert!(has(&errs, Some("add"), "input 1 has dtype f16"), "{dump}");
        assert!(has(&errs, Some("relu"), "`ghost` is undefined"), "{dump}");
        assert!(has(&errs, None, "value `a` is defined 2 times"), "{dump}");
        assert!(has(&errs, Some("cast"), "output has dtype f32 but `to` is f16"), "{dump}");
        assert!(has(&errs, Some("flat"), "rank 3 but the op gives rank 2"), "{dump}");
        assert!(has(&errs, Some("where"), "input 2 has dtype f16 but input 1 has f32"), "{dump}");
        assert!(has(&errs, Some("where"), "condition has dtype f32"), "{dump}");
        assert!(has(&errs, Some("user"), "`gone_out` was removed"), "{dump}");
        assert!(has(&errs, None, "graph output `missing_out` is undefined"), "{dump}");
        assert!(has(&errs, None, "graph output `gone_out` was removed"), "{dump}");
    }

    #[test]
    fn checks_refreshed_copy_pairs() {
        let absent = |dtype, dims: &[i64]| Tensor { dtype, dims: dims.to_vec(), data: crate::TensorData::Absent };
        let mut g = Graph::new("copies");
        let w = g.add_init("w", absent(DType::F32, &[4, 3]));
        g.add_refreshed_copy(w, "w.f16", absent(DType::F16, &[4, 3]));
        assert_eq!(verify(&g, 17), Ok(()));
        g.add_refreshed_copy(w, "w.bad_shape", absent(DType::F16, &[3, 4]));
        g.add_refreshed_copy(w, "w.same", absent(DType::F32, &[4, 3]));
        let x = g.add_input("x", t(DType::F16, &[4, 3]));
        g.link_refreshed_copy(x, w);
        let errs = verify(&g, 17).unwrap_err();
        let dump: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert!(has(&errs, None, "`w.bad_shape` of `w`: copy has shape [3, 4]"), "{dump:?}");
        assert!(has(&errs, None, "`w.same` of `w`: copy and master are both f32"), "{dump:?}");
        assert!(has(&errs, None, "`x` of `w`: `x` is not an initializer"), "{dump:?}");
        assert_eq!(errs.len(), 3, "{dump:?}");
    }

    #[test]
    fn reports_cycles_by_name() {
        let mut g = Graph::new("cyc");
        let fwd = g.add_undefined("b_out");
        let a = g.add_node(NodeSpec::new("A", Op::Relu).input(fwd).output("a_out", TensorType::unknown()));
        let a_out = g.node(a).outputs()[0];
        g.add_node_defining(
            NodeSpec::new("B", Op::Relu).input(a_out).output("b_out", TensorType::unknown()),
            vec![fwd],
        );
        let errs = verify(&g, 17).unwrap_err();
        let dump: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert!(
            errs.iter()
                .any(|e| e.message.contains("cycle") && e.message.contains("\"A\"") && e.message.contains("\"B\"")),
            "{dump:?}"
        );
    }

    #[test]
    fn symbolic_dims_against_other_symbols_are_fine() {
        let mut g = Graph::new("sym");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::from(4)]));
        g.add_node(
            NodeSpec::new("r", Op::Relu)
                .input(x)
                .output("y", TensorType::new(DType::F32, vec![Dim::sym("n"), Dim::from(4)])),
        );
        assert_eq!(verify(&g, 17), Ok(()));
    }
}
