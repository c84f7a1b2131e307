//! Precision passes respect the ONNX schemas' type constraints: an op whose
//! schema refuses a precision at the model's opset gets the opset that
//! accepts it (raised up to 22 when the model can be rewritten: `Conv`
//! takes bf16 from 22, `Pow`'s exponent from 15), or else stays at f32 with
//! casts around it (`Celu` accepts only f32; `Relu` accepts bf16 only from
//! opset 14, and a model below opset 13 is not raised), and the written
//! model verifies again.

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
    // At 13 the exponent refuses bf16, so the opset is raised to 15.
    for (opset, written) in [(13, 15), (15, 15)] {
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
        assert_eq!(m.opset(), written, "the written opset, from {opset}");
        assert_eq!(input_dtype(&m, "pow"), Some(qsync_ir::DType::BF16), "Pow from opset {opset}");
        assert_eq!(input_dtype(&m, "relu"), Some(qsync_ir::DType::BF16), "Relu-14+ at opset {opset}");
    }
    // A bf16 exponent at opset 13 is refused by the verifier, naming the input.
    let src = pow_model(13, "bf16");
    let o = qsyncc(&["opt", src.to_str().expect("utf8"), "--passes", "verify"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("pow") && err.contains("input 1 is bf16") && err.contains("opset 13"), "{err}");
}

/// A CNN block at opset 17 (`Conv`, a `ReduceMean` with its axes as an
/// attribute, a `Split` with neither sizes nor `num_outputs`), with an
/// extra node after it when given.
fn cnn_model(opset: i64, extra: &str) -> std::path::PathBuf {
    let dir = tmpdir("type-constraints-cnn");
    let src = dir.join(format!("cnn{opset}{}.qir", extra.len()));
    std::fs::write(
        &src,
        format!(
            "opset \"\" {opset}\ngraph \"g\" {{\n  init %w: f32[4,3,3,3] = absent\n  input %x: f32[2,3,8,8]\n  \
             %c = Conv \"conv\"(%x, %w) {{kernel_shape=[3, 3], pads=[1, 1, 1, 1]}}\n  \
             %m = ReduceMean \"mean\"(%c) {{axes=[2, 3], keepdims=0}}\n  \
             %a: f32[1,4], %b: f32[1,4] = Split \"split\"(%m) {{axis=0}}\n{extra}  output %a\n  output %b\n}}\n"
        ),
    )
    .expect("write model");
    src
}

fn node<'a>(m: &'a qsync_ir::Model, name: &str) -> &'a qsync_ir::Node {
    let g = &m.graph;
    g.node(g.node_ids().into_iter().find(|&n| g.node(n).name == name).expect("node kept"))
}

#[test]
fn conv_takes_bf16_by_raising_the_opset_to_22() {
    let dir = tmpdir("type-constraints-cnn-out");
    let out = dir.join("cnn.onnx");
    let src = cnn_model(17, "");
    let o =
        qsyncc(&["opt", src.to_str().expect("utf8"), "--passes", "uniform=bf16", "-o", out.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("raised from 17 to 22"), "the raise is said: {}", stderr(&o));
    let o = qsyncc(&["opt", out.to_str().expect("utf8"), "--passes", "verify"]);
    assert!(o.status.success(), "written model does not verify: {}", stderr(&o));
    let m = qsync_onnx::import_file(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((m.opset(), m.ir_version), (22, 10), "opset 22 needs IR version 10");
    assert_eq!(input_dtype(&m, "conv"), Some(qsync_ir::DType::BF16), "Conv-22 accepts bf16");
    // ReduceMean-18 reads its axes from an int64 input, and keeps their values.
    let mean = node(&m, "mean");
    assert!(mean.attr("axes").is_none(), "the attribute is gone");
    let axes = mean.input(1).expect("an axes input");
    let t = m.graph.value(axes).init().expect("an initializer");
    assert_eq!((t.dtype, t.dims.clone()), (qsync_ir::DType::I64, vec![2]));
    assert_eq!(t.inline_bytes().expect("inline"), [2i64, 3].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    // Split-18 needs its sizes or `num_outputs`.
    assert_eq!(node(&m, "split").attr_int("num_outputs"), Some(2));
    let g = &m.graph;
    assert_eq!(g.ty(g.outputs()[0]).shape.as_ref().map(|s| s.len()), Some(2), "shapes infer at 22");
}

#[test]
fn a_model_that_cannot_be_raised_keeps_conv_at_f32_and_says_why() {
    let dir = tmpdir("type-constraints-cnn-blocked");
    let out = dir.join("cnn.onnx");
    // An op the IR does not know, in the default domain: its schema changes
    // between 17 and 22 are unknown, so the model is not raised.
    let src = cnn_model(17, "  %z: f32[1,4] = !::Mystery \"mystery\"(%a)\n");
    let o =
        qsyncc(&["opt", src.to_str().expect("utf8"), "--passes", "uniform=bf16", "-o", out.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("mystery") && err.contains("not known"), "the blocker is named: {err}");
    let m = qsync_onnx::import_file(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.opset(), 17);
    assert_eq!(input_dtype(&m, "conv"), Some(qsync_ir::DType::F32), "Conv-11 has no bf16");
    assert!(node(&m, "mean").attr("axes").is_some(), "nothing was rewritten");
}
