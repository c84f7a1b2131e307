//! Precision passes respect the ONNX schemas' type constraints: an op whose
//! schema refuses a precision at the model's opset stays at f32 with casts
//! around it (`Celu` accepts only f32; `Relu` accepts bf16 only from opset
//! 14), and the written model verifies again.

mod common;

use common::{qsyncc, stderr, tmpdir};

fn plan(opset: i64, passes: &str) -> qsync_ir::Model {
    let dir = tmpdir("type-constraints");
    let src = dir.join("m.qir");
    std::fs::write(
        &src,
        format!(
            "opset \"\" {opset}\ngraph \"g\" {{\n  init %w: f32[8,8] = absent\n  input %x: f32[4,8]\n  \
             %h = MatMul \"mm\"(%x, %w)\n  %c = Celu \"celu\"(%h)\n  %r = Relu \"relu\"(%c)\n  output %r\n}}\n"
        ),
    )
    .expect("write model");
    let out = dir.join("out.onnx");
    let o = qsyncc(&["opt", src.to_str().expect("utf8"), "--passes", passes, "-o", out.to_str().expect("utf8")]);
    assert!(o.status.success(), "{passes}: {}", stderr(&o));
    // The written model verifies (the verifier checks the same constraints).
    let o = qsyncc(&["opt", out.to_str().expect("utf8"), "--passes", "verify"]);
    assert!(o.status.success(), "written model does not verify: {}", stderr(&o));
    qsync_onnx::import_file(&out).unwrap_or_else(|e| panic!("{e}"))
}

fn input_dtype(m: &qsync_ir::Model, node: &str) -> Option<qsync_ir::DType> {
    let g = &m.graph;
    let n = g.node_ids().into_iter().find(|&n| g.node(n).name == node).expect("node kept");
    g.node(n).inputs()[0].and_then(|v| g.ty(v).dtype)
}

#[test]
fn celu_stays_f32_under_uniform_f16() {
    let m = plan(21, "uniform=f16");
    assert_eq!(input_dtype(&m, "mm"), Some(qsync_ir::DType::F16), "MatMul is lowered");
    assert_eq!(input_dtype(&m, "celu"), Some(qsync_ir::DType::F32), "Celu's schema allows only f32");
    assert_eq!(input_dtype(&m, "relu"), Some(qsync_ir::DType::F16), "Relu accepts f16 at every opset");
}

#[test]
fn bf16_follows_the_opset() {
    let old = plan(12, "uniform=bf16");
    assert_eq!(input_dtype(&old, "relu"), Some(qsync_ir::DType::F32), "Relu-6 has no bf16");
    let new = plan(14, "uniform=bf16");
    assert_eq!(input_dtype(&new, "relu"), Some(qsync_ir::DType::BF16), "Relu-14 accepts bf16");
}

/// `Pow`'s exponent (type T1) accepts bf16 only from opset 15, while its
/// base (T) does from 13: a constraint on the second input.
fn pow_model(opset: i64, exp_dtype: &str) -> std::path::PathBuf {
    let dir = tmpdir("type-constraints-pow");
    let src = dir.join(format!("pow{opset}{exp_dtype}.qir"));
    std::fs::write(
        &src,
        format!(
            "opset \"\" {opset}\ngraph \"g\" {{\n  input %x: f32[4,8]\n  input %e: {exp_dtype}[4,8]\n  \
             %h = Relu \"relu\"(%x)\n  %p = Pow \"pow\"(%h, %e)\n  output %p\n}}\n"
        ),
    )
    .expect("write model");
    src
}

#[test]
fn every_input_is_checked_by_planners_and_the_verifier() {
    let dir = tmpdir("type-constraints-pow-out");
    for (opset, want) in [(13, qsync_ir::DType::F32), (15, qsync_ir::DType::BF16)] {
        let src = pow_model(opset, "f32");
        let out = dir.join(format!("out{opset}.onnx"));
        let o = qsyncc(&[
            "opt",
            src.to_str().expect("utf8"),
            "--passes",
            "uniform=bf16",
            "-o",
            out.to_str().expect("utf8"),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let o = qsyncc(&["opt", out.to_str().expect("utf8"), "--passes", "verify"]);
        assert!(o.status.success(), "written model does not verify: {}", stderr(&o));
        let m = qsync_onnx::import_file(&out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input_dtype(&m, "pow"), Some(want), "Pow at opset {opset}");
        assert_eq!(input_dtype(&m, "relu"), Some(qsync_ir::DType::BF16), "Relu-14+ at opset {opset}");
    }
    // A bf16 exponent at opset 13 is refused by the verifier, naming the input.
    let src = pow_model(13, "bf16");
    let o = qsyncc(&["opt", src.to_str().expect("utf8"), "--passes", "verify"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("pow") && err.contains("input 1 is bf16") && err.contains("opset 13"), "{err}");
}
