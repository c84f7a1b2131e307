//! Kernel selection from planned graphs, and MLIR emission: every shared
//! model maps completely (no generic `qsync.*` op) and verifies in-process
//! and with `mlir-opt-22` and no flag, imported and (CNNs, transformers)
//! after `amp` for a T4.

use std::path::{Path, PathBuf};
use std::process::Command;

use qsync_codegen::{emit_mlir_model, select_kernels};
use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{DType, Model};
use qsync_kernels::{Half, KernelSpec, QBits, Rounding};

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/models")
}

fn load(path: &Path) -> Model {
    let mut m = qsync_onnx::import_file(path).expect("import");
    let opset = m.opset();
    infer_shapes(&mut m.graph, opset, &InferOptions::default());
    m
}

fn parse(text: &str) -> Model {
    let mut m = qsync_ir::text::parse_model(text).expect("text IR");
    let opset = m.opset();
    infer_shapes(&mut m.graph, opset, &InferOptions::default());
    m
}

/// Runs `mlir-opt-22` on the text; a missing tool is a clear failure.
fn mlir_opt(text: &str, allow_unregistered: bool, tag: &str) {
    let tool = std::env::var("QSYNC_MLIR_OPT").unwrap_or_else(|_| "mlir-opt-22".into());
    let path = std::env::temp_dir().join(format!("qsync-mlir-{}-{tag}.mlir", std::process::id()));
    std::fs::write(&path, text).expect("write mlir");
    let mut cmd = Command::new(&tool);
    if allow_unregistered {
        cmd.arg("--allow-unregistered-dialect");
    }
    let out = cmd.arg(&path).output().unwrap_or_else(|e| {
        panic!("`{tool}` is needed to check emitted MLIR (Debian package mlir-22-tools; set QSYNC_MLIR_OPT to another path): {e}")
    });
    assert!(out.status.success(), "{tag}: {tool} rejected the module:\n{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_file(&path);
}

/// Imported, then planned like `qsyncc opt MODEL --passes amp --target t4`.
fn planned(path: &Path) -> Model {
    planned_with(path, "amp")
}

fn planned_with(path: &Path, spec: &str) -> Model {
    let mut m = load(path);
    let pm = qsync_passes::pipeline_from_spec(spec).expect("pipeline");
    let mut cx = qsync_passes::PassContext { target: Some("t4".into()), ..Default::default() };
    pm.run(&mut m, &mut cx).expect(spec);
    m
}

/// Whether `mlir-opt-22` (or `QSYNC_MLIR_OPT`) runs; prints why not.
fn mlir_opt_installed() -> bool {
    let tool = std::env::var("QSYNC_MLIR_OPT").unwrap_or_else(|_| "mlir-opt-22".into());
    match Command::new(&tool).arg("--version").output() {
        Ok(o) if o.status.success() => true,
        r => {
            eprintln!("skipping the mlir-opt checks: `{tool}` is not installed ({r:?})");
            false
        }
    }
}

const CNN_MODELS: [&str; 5] = ["squeezenet1_1", "vgg16", "vgg16_bn", "resnet50", "resnet50_train"];

#[test]
fn cnn_models_map_completely_and_verify_without_flags() {
    let check_tool = mlir_opt_installed();
    for name in CNN_MODELS {
        let path = models_dir().join(format!("{name}.onnx"));
        // campo,egraph-casts: resnet50_train's BatchNormalizations then read
        // FP32 parameters over f16 data (opset-15 mixed types).
        let stages = [
            ("imported", load(&path)),
            ("amp", planned(&path)),
            ("campo+egraph", planned_with(&path, "campo,egraph-casts")),
        ];
        for (stage, m) in stages {
            let tag = format!("{name}-{stage}");
            let out = emit_mlir_model(&m, name).unwrap_or_else(|e| panic!("{tag}: {e}"));
            assert!(out.generic_ops.is_empty(), "{tag}: generic ops {:?}", out.generic_ops);
            assert!(out.all_ops_mapped() && out.warning().is_none(), "{tag}");
            assert!(!out.rng_offset && !out.text.contains("rng_offset"), "{tag}: draws nothing, takes no offset");
            assert!(!out.text.contains("qsync.opaque") && !out.text.contains("\"qsync."), "{tag}");
            assert!(out.text.contains("linalg.conv_2d_nchw_fchw"), "{tag}: convolutions are linalg ops");
            if stage != "imported" {
                assert!(out.text.contains("qsync.precision = \"f16\""), "{tag}: the plan stays on the ops");
                assert!(out.text.contains("xf16>"), "{tag}: convs compute in f16");
            }
            assert_eq!(out.text, emit_mlir_model(&m, name).expect("again").text, "{tag}: deterministic");
            if check_tool {
                mlir_opt(&out.text, false, &tag);
            }
        }
    }
}

#[test]
fn transformer_models_map_completely() {
    let check_tool = mlir_opt_installed();
    for name in ["bert_tiny", "bert_base_qa", "bert_base_train"] {
        let m = planned(&models_dir().join(format!("{name}.onnx")));
        let out = emit_mlir_model(&m, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.generic_ops.is_empty(), "{name}: generic ops {:?}", out.generic_ops);
        assert!(out.text.contains("linalg.batch_matmul") && out.text.contains("linalg.softmax"), "{name}");
        if name == "bert_base_train" {
            // Its Dropouts train (training_mode is a constant true): masks
            // come from the counter-based random stream, selected per call
            // by the trailing offset argument.
            assert!(out.text.contains("arith.cmpf oge") && out.text.contains("arith.shrui"), "{name}");
            let sig = out.text.lines().find(|l| l.contains("func.func @")).expect("func");
            assert!(
                out.rng_offset && sig.contains(": tensor<i64> {qsync.name = \"rng_offset\", qsync.rng_offset}) ->"),
                "{name}: trailing offset argument in {sig}"
            );
        } else {
            assert!(!out.rng_offset && !out.text.contains("rng_offset"), "{name}: inference draws nothing");
        }
        if check_tool {
            mlir_opt(&out.text, false, name);
        }
    }
}

const MAPPED: &str = r#"opset "" 18
graph "mapped" {
  input %x: f32[batch,4]
  input %b: f32[1,4]
  %y = Add "add"(%x, %b)
  %r = Relu "relu"(%y)
  %h = Cast "to_half"(%r) {to=10}
  %e = Cast "to_float"(%h) {to=1}
  %t = Tanh "tanh"(%e)
  %s = Sub "sub"(%t, %e)
  %z = Transpose "tr"(%s) {perm=[1, 0]}
  output %h, %z
}
"#;

#[test]
fn fully_mapped_model_verifies_without_unregistered_dialects() {
    let m = parse(MAPPED);
    let out = emit_mlir_model(&m, "mapped").expect("mlir");
    assert!(out.all_ops_mapped(), "{:?}", out.generic_ops);
    assert!(out.warning().is_none());
    for op in ["tosa.add", "tosa.clamp", "arith.truncf", "arith.extf", "tosa.tanh", "arith.subf", "tosa.transpose"] {
        assert!(out.text.contains(op), "missing {op}:\n{}", out.text);
    }
    assert!(out.text.contains("tensor<?x4xf32>"), "symbolic dims print as ?:\n{}", out.text);
    mlir_opt(&out.text, false, "mapped");
}

#[test]
fn every_shared_model_emits_verified_mlir() {
    let mut seen = 0;
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(models_dir()).expect("models").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for path in entries {
        if path.extension().is_none_or(|e| e != "onnx") {
            continue;
        }
        seen += 1;
        let m = load(&path);
        let tag = path.file_stem().and_then(|s| s.to_str()).unwrap_or("model").to_string();
        let out = emit_mlir_model(&m, &tag).unwrap_or_else(|e| {
            let (text, _) = qsync_codegen::mlir::mlir_text_model(&m, &tag);
            let _ = std::fs::write(std::env::temp_dir().join(format!("qsync-failed-{tag}.mlir")), text);
            panic!("{tag}: {e}")
        });
        assert!(out.generic_ops.is_empty() && out.warning().is_none(), "{tag}: generic ops {:?}", out.generic_ops);
        mlir_opt(&out.text, false, &tag);
    }
    assert!(seen >= 8, "expected the shared models, saw {seen}");
}

#[test]
fn selection_follows_the_plan() {
    let m = parse(MAPPED);
    let k = select_kernels(&m.graph);
    assert!(k.contains(&KernelSpec::CastTo(Half::F16)) && k.contains(&KernelSpec::CastFrom(Half::F16)));
    assert!(!k.contains(&KernelSpec::CastTo(Half::BF16)), "no bf16 in the plan");
    assert!(!k.iter().any(|s| matches!(s, KernelSpec::QuantizeInt8 { .. })), "no int8 in the plan");
    // Always: gradient-compression kernels.
    for s in [
        KernelSpec::RowMinMax,
        KernelSpec::PackBits { bits: 2, rounding: Rounding::Stochastic },
        KernelSpec::DequantAccumulate { bits: QBits::Int4 },
    ] {
        assert!(k.contains(&s), "{s}");
    }
    // An int8 plan: mark a node i8.
    let mut m2 = parse(MAPPED);
    let id = m2.graph.schedule()[0];
    m2.graph.node_mut(id).precision = Some(DType::I8);
    let k2 = select_kernels(&m2.graph);
    assert!(k2.contains(&KernelSpec::QuantizeInt8 { symmetric: true, rounding: Rounding::Nearest }));
    assert!(k2.contains(&KernelSpec::DequantizeInt8 { symmetric: true }));
    assert!(!k2.contains(&KernelSpec::DequantizeInt8 { symmetric: false }));
    // Deterministic order.
    assert_eq!(k2, select_kernels(&m2.graph));
    // A refreshed bf16 weight copy brings the bf16 casts (the optimizer
    // step rewrites it), though no node computes in bf16.
    let mut m3 = parse(MAPPED);
    let w = m3.graph.add_init("w", qsync_ir::Tensor::from_f32(vec![4], &[1.0; 4]));
    let copy = qsync_ir::Tensor { dtype: DType::BF16, dims: vec![4], data: qsync_ir::TensorData::Absent };
    m3.graph.add_refreshed_copy(w, "w.bf16", copy);
    let k3 = select_kernels(&m3.graph);
    assert!(k3.contains(&KernelSpec::CastTo(Half::BF16)) && k3.contains(&KernelSpec::CastFrom(Half::BF16)));
}
