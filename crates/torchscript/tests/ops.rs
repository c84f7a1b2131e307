//! Lowering of individual aten ops and code constructs, on small synthetic
//! archives: a parameterless module `__torch__.M` whose `forward` is given as
//! TorchScript source.

use std::io::{Cursor, Write};

use qsync_ir::{Model, Op};
use qsync_torchscript::{import_bytes, InputSpec};

fn archive(code: &str) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let o = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let data: &[u8] = b"\x80\x02c__torch__\nM\n)\x81}(X\x08\x00\x00\x00training\x89ub.";
    for (name, bytes) in [("m/data.pkl", data), ("m/code/__torch__.py", code.as_bytes()), ("m/version", b"3\n")] {
        z.start_file(name, o).expect("start");
        z.write_all(bytes).expect("write");
    }
    z.finish().expect("finish").into_inner()
}

fn lower(body: &str, inputs: &[&str]) -> (Model, Vec<String>) {
    let params: Vec<String> = inputs.iter().map(|s| s.split('=').next().unwrap_or("").to_string()).collect();
    let src = format!(
        "class M(Module):\n  __parameters__ = []\n  __buffers__ = []\n  training : bool\n  def forward(self: __torch__.M,\n    {}) -> Tensor:\n{}",
        params.iter().map(|p| format!("{p}: Tensor")).collect::<Vec<_>>().join(",\n    "),
        body.lines().map(|l| format!("    {l}\n")).collect::<String>()
    );
    let specs: Vec<InputSpec> = inputs.iter().map(|s| InputSpec::parse(s).expect("spec")).collect();
    let (m, rep) = import_bytes(&archive(&src), "m.pt", &specs).unwrap_or_else(|e| panic!("{e}\n{src}"));
    (m, rep.warnings)
}

fn out_types(m: &Model) -> Vec<String> {
    m.graph.outputs().iter().map(|&v| m.graph.ty(v).to_string()).collect()
}

fn ops(m: &Model) -> Vec<String> {
    m.graph.schedule().into_iter().map(|n| m.graph.node(n).op.to_string()).filter(|o| o != "Constant").collect()
}

#[test]
fn split_chunk_unbind() {
    let (m, _) = lower("a, b, = torch.chunk(x, 2, 1)\nc = torch.unbind(x, 0)\nreturn (a, b, c[1])", &["x=f32[2,6]"]);
    assert_eq!(out_types(&m), ["f32[2,3]", "f32[2,3]", "f32[6]"]);
}

#[test]
fn max_along_dim_and_adaptive_pool() {
    let (m, _) = lower(
        "v, i, = torch.max(x, 1, False)\np = torch.adaptive_avg_pool2d(x, [2, 2])\nreturn (v, i, p)",
        &["x=f32[1,3,8,8]"],
    );
    assert_eq!(out_types(&m), ["f32[1,8,8]", "i64[1,8,8]", "f32[1,3,2,2]"]);
    assert!(ops(&m).contains(&"AveragePool".to_string()));
}

#[test]
fn views_with_symbolic_sizes() {
    let (m, _) = lower(
        "_0 = ops.prim.NumToTensor(torch.size(x, 0))\ny = torch.view(x, [int(_0), -1, 4])\nz = torch.unflatten(y, 1, [2, 2])\nw = torch.transpose(z, -1, 1)\nreturn torch.flatten(w, 2)",
        &["x=f32[n,4,4]"],
    );
    assert_eq!(out_types(&m), ["f32[n,4,4]"]);
    assert!(ops(&m).contains(&"Shape".to_string()), "symbolic sizes go through Shape: {:?}", ops(&m));
}

#[test]
fn linear_gemm_and_matmul() {
    let (m, _) = lower("w = torch.ones([8, 4], dtype=6)\na = torch.linear(x, w, None)\nb = torch.linear(torch.unsqueeze(x, 0), w, None)\nreturn (a, b)", &["x=f32[3,4]"]);
    assert_eq!(out_types(&m), ["f32[3,8]", "f32[1,3,8]"]);
    let o = ops(&m);
    assert!(o.contains(&"Gemm".to_string()) && o.contains(&"MatMul".to_string()), "{o:?}");
}

#[test]
fn scalars_take_the_tensor_dtype_and_alpha_scales() {
    let (m, _) = lower("a = torch.add(x, 1, alpha=2)\nb = torch.rsub(x, 1.5)\nc = torch.masked_fill(x, torch.eq(x, 0), -1)\nreturn (a, b, c)", &["x=f16[2]"]);
    assert_eq!(out_types(&m), ["f16[2]", "f16[2]", "f16[2]"]);
}

#[test]
fn static_if_runs_one_branch_dynamic_if_is_opaque() {
    let (m, w) = lower("if 1 == 1:\n  y = torch.relu(x)\nelse:\n  y = torch.tanh(x)\nreturn y", &["x=f32[2]"]);
    assert_eq!(ops(&m), ["Relu"]);
    assert!(w.is_empty());
    let (m, w) = lower("if torch.gt(torch.sum(x), 0):\n  y = torch.relu(x)\nelse:\n  y = x\nreturn y", &["x=f32[2]"]);
    assert!(ops(&m).iter().any(|o| o == "!prim::If"), "{:?}", ops(&m));
    assert!(w.iter().any(|w| w.contains("prim::If")), "{w:?}");
}

#[test]
fn unknown_ops_stay_opaque_with_their_arguments() {
    let (m, w) = lower("return torch.roll(x, [1], [0])", &["x=f32[4]"]);
    let n = m.graph.schedule().into_iter().find(|&n| m.graph.node(n).op.is_opaque()).expect("opaque node");
    let node = m.graph.node(n);
    assert_eq!(node.op, Op::Opaque { domain: "aten".into(), op_type: "roll".into() });
    assert_eq!(node.attr_ints("arg1"), Some(&[1][..]));
    assert!(w.iter().any(|w| w.contains("aten::roll")));
}

#[test]
fn attention_decomposes_into_two_matmuls() {
    let (m, _) = lower("return torch.scaled_dot_product_attention(q, q, q, None, 0., False)", &["q=f32[1,2,5,8]"]);
    assert_eq!(out_types(&m), ["f32[1,2,5,8]"]);
    assert_eq!(ops(&m).iter().filter(|o| *o == "MatMul").count(), 2);
}

#[test]
fn rank_dependent_ops_after_opaque_ones_degrade_to_opaque() {
    let (m, w) = lower("y = torch.roll(x, [1], [0])\nreturn torch.transpose(y, 0, 1)", &["x=f32[4,3]"]);
    assert_eq!(ops(&m), ["!aten::roll", "!aten::transpose"]);
    assert_eq!(w.len(), 2, "{w:?}");
}
