//! Graph builders the cost tests share.
#![allow(dead_code)]

use qsync_ir::{Attr, DType, Dim, Graph, NodeId, NodeSpec, Op, Tensor, TensorType};

pub fn t(dims: &[i64]) -> TensorType {
    TensorType::new(DType::F32, dims.iter().map(|&d| Dim::from(d)).collect())
}

pub fn init(g: &mut Graph, name: &str, dims: &[i64]) -> qsync_ir::ValueId {
    let n: i64 = dims.iter().product();
    g.add_init(name, Tensor::from_f32(dims.to_vec(), &vec![0.0; n as usize]))
}

/// x[m,k] → Add(s[k]) → Gemm(W[n,k]ᵀ, b[n]) → y[m,n]. The trained shift
/// makes the Gemm's input need a gradient, so all three phases exist.
pub fn gemm_graph(m: i64, k: i64, n: i64) -> (Graph, NodeId) {
    let mut g = Graph::new("gemm");
    let x = g.add_input("x", t(&[m, k]));
    let s = init(&mut g, "s", &[k]);
    let r = g.add_node(NodeSpec::new("shift", Op::Add).input(x).input(s).output("r", t(&[m, k])));
    let rv = g.node(r).outputs()[0];
    let w = init(&mut g, "w", &[n, k]);
    let b = init(&mut g, "b", &[n]);
    let spec =
        NodeSpec::new("fc", Op::Gemm).input(rv).input(w).input(b).attr("transB", Attr::Int(1)).output("y", t(&[m, n]));
    let fc = g.add_node(spec);
    let y = g.node(fc).outputs()[0];
    g.set_outputs(vec![y]);
    (g, fc)
}
