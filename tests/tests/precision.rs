//! Precision passes on every real model: the result verifies, shape
//! inference agrees with the types materialization wrote, outputs keep their
//! dtypes, and cast counts stay sane (amp on the big graphs adds no more
//! casts than onnxconverter-common's 201 / 214, NOTES.md).

use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{Model, Op};
use qsync_passes::{pipeline_from_spec, PassContext};

fn casts(m: &Model) -> usize {
    m.graph.node_ids().iter().filter(|&&n| m.graph.node(n).op == Op::Cast).count()
}

fn run(path: &std::path::Path, spec: &str) -> (Model, usize) {
    run_on(path, spec, None)
}

fn run_on(path: &std::path::Path, spec: &str, target: Option<&str>) -> (Model, usize) {
    let mut m = qsync_onnx::import_file(path).unwrap_or_else(|e| panic!("{e}"));
    let pm = pipeline_from_spec("infer-shapes").expect("pipeline");
    pm.run(&mut m, &mut PassContext::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let before = casts(&m);
    let outputs: Vec<String> =
        m.graph.outputs().iter().map(|&v| format!("{}:{}", m.graph.value_name(v), m.graph.ty(v))).collect();
    let mut pm = pipeline_from_spec(&format!("{spec},verify")).expect("pipeline");
    pm.verify_each(true);
    let mut cx = PassContext { target: target.map(str::to_string), ..PassContext::default() };
    pm.run(&mut m, &mut cx).unwrap_or_else(|e| panic!("{} {spec}: {e}", path.display()));
    let after: Vec<String> =
        m.graph.outputs().iter().map(|&v| format!("{}:{}", m.graph.value_name(v), m.graph.ty(v))).collect();
    assert_eq!(outputs, after, "{} {spec}: outputs keep names and types", path.display());
    let types: Vec<String> = m.graph.all_values().map(|v| m.graph.ty(v).to_string()).collect();
    let mut again = m.clone();
    let opset = again.opset();
    let r = infer_shapes(&mut again.graph, opset, &InferOptions::default());
    assert!(r.errors.is_empty(), "{} {spec}: {:?}", path.display(), r.errors);
    let re: Vec<String> = again.graph.all_values().map(|v| again.graph.ty(v).to_string()).collect();
    let names: Vec<&str> = again.graph.all_values().map(|v| again.graph.value_name(v)).collect();
    for ((a, b), n) in types.iter().zip(&re).zip(&names) {
        assert_eq!(a, b, "{} {spec}: infer-shapes disagrees on value {n}", path.display());
    }
    let added = casts(&m) - before;
    (m, added)
}

#[test]
fn every_model_through_every_precision_pass() {
    for path in qsync_tests::onnx_models() {
        let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let mut counts = Vec::new();
        for spec in ["amp", "autocast", "uniform=f16", "cascade=f16", "amp(mode=inference)", "campo", "comp"] {
            let (m, added) = run(&path, spec);
            let nodes = m.graph.node_count();
            assert!(added < nodes, "{name} {spec}: {added} casts in {nodes} nodes");
            counts.push(format!("{spec}={added}"));
        }
        eprintln!("{name}: casts added {}", counts.join(" "));
    }
}

/// onnxconverter stores weights in FP16, so its figure compares with our
/// inference mode, and with the activation casts (casts not reading an
/// initializer) of training mode, whose extra casts are the per-iteration
/// FP32-master weight casts.
#[test]
fn amp_adds_no_more_casts_than_onnxconverter() {
    for (model, converter) in [("bert_base_qa.onnx", 201), ("resnet50_train.onnx", 214)] {
        let path = qsync_tests::models_dir().join(model);
        let (_, added) = run(&path, "amp(mode=inference)");
        assert!(added <= converter, "{model}: amp added {added} casts, onnxconverter {converter}");
        let (m, _) = run(&path, "amp");
        let g = &m.graph;
        let activation_casts = g
            .node_ids()
            .into_iter()
            .filter(|&n| g.node(n).op == Op::Cast)
            .filter(|&n| g.node(n).input(0).is_some_and(|v| g.value(v).init().is_none()))
            .count();
        eprintln!("{model}: amp inference {added}, training activation casts {activation_casts}");
        assert!(activation_casts <= converter, "{model}: {activation_casts} activation casts");
    }
}

/// The models with weights, planned by amp / autocast / uniform=f16 and
/// exported, run in onnxruntime within FP16 tolerance of the FP32 original
/// (`passes/tests/numerics.py`).
#[test]
fn planned_models_with_weights_stay_within_fp16_tolerance() {
    use std::process::Command;
    let probe = Command::new("python3").args(["-c", "import onnx, onnxruntime"]).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "python3 cannot import onnx and onnxruntime ({}): run scripts/setup.sh",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("python3 not runnable ({e}): run scripts/setup.sh"),
    }
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../passes/tests/numerics.py");
    let dir = std::env::temp_dir().join(format!("qsync-numerics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for model in ["squeezenet1_1.onnx", "bert_tiny.onnx"] {
        let src = qsync_tests::models_dir().join(model);
        for spec in ["amp", "autocast", "uniform=f16", "amp(mode=inference)", "campo", "comp"] {
            // campo and comp plan with the cost model of a real target.
            let target = matches!(spec, "campo" | "comp").then_some("v100");
            let (m, _) = run_on(&src, spec, target);
            let out =
                dir.join(format!("{}.{}.onnx", model.trim_end_matches(".onnx"), spec.replace(['(', ')', '='], "_")));
            qsync_onnx::export_file(&m, &out).unwrap_or_else(|e| panic!("{e}"));
            let o = Command::new("python3").arg(&script).arg(&src).arg(&out).output().expect("run numerics.py");
            let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            eprintln!("{model} {spec}:\n{text}");
            assert!(o.status.success(), "{model} {spec}: {text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Campo's guarantee: on every shared model, for every planned
/// dtype on targets that have it (f16: v100, t4; bf16: a100-40gb, h100-sxm;
/// i8: t4, a100-40gb; f8e4m3: h100-sxm), campo adds no more casts than amp
/// and is never predicted slower. Times are the CLI's `predicted_ms`
/// (`CostModelOracle::predict` on the planned graph, default bindings).
/// comp runs on the same grid.
#[test]
fn campo_never_worse_than_amp_on_every_dtype_and_target() {
    use qsync_passes::precision::{CostModelOracle, CostOracle};
    let grid: [(&str, &[&str]); 4] = [
        ("f16", &["v100", "t4"]),
        ("bf16", &["a100-40gb", "h100-sxm"]),
        ("i8", &["t4", "a100-40gb"]),
        ("f8e4m3", &["h100-sxm"]),
    ];
    for path in qsync_tests::onnx_models() {
        let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        for (dtype, targets) in grid {
            for &target in targets {
                let oracle = CostModelOracle::for_target(target, &InferOptions::default()).expect("oracle");
                let d = match dtype {
                    "f16" => qsync_ir::DType::F16,
                    "bf16" => qsync_ir::DType::BF16,
                    "i8" => qsync_ir::DType::I8,
                    _ => qsync_ir::DType::F8E4M3,
                };
                assert!(oracle.supports(d), "{target} lacks {dtype}");
                let (amp, amp_casts) = run_on(&path, &format!("amp={dtype}"), Some(target));
                let (campo, campo_casts) = run_on(&path, &format!("campo={dtype}"), Some(target));
                let (comp, comp_casts) = run_on(&path, &format!("comp={dtype}"), Some(target));
                let (ta, tc, tp) = (
                    oracle.predict(&amp.graph).total(),
                    oracle.predict(&campo.graph).total(),
                    oracle.predict(&comp.graph).total(),
                );
                eprintln!(
                    "{name} {target} {dtype}: amp {amp_casts} casts {:.3} ms, campo {campo_casts} casts {:.3} ms, comp {comp_casts} casts {:.3} ms",
                    ta * 1e3,
                    tc * 1e3,
                    tp * 1e3
                );
                assert!(
                    campo_casts <= amp_casts,
                    "{name} {target} {dtype}: campo {campo_casts} casts > amp {amp_casts}"
                );
                assert!(tc <= ta * (1.0 + 1e-9), "{name} {target} {dtype}: campo {tc} s > amp {ta} s");
            }
        }
    }
}

/// A precision the target lacks is never chosen: every planning pass fails
/// with a clear error instead.
#[test]
fn no_pass_chooses_a_precision_the_target_lacks() {
    let path = qsync_tests::models_dir().join("squeezenet1_1.onnx");
    for (dtype, target) in [("bf16", "v100"), ("f8e4m3", "v100"), ("f8e4m3", "a100-40gb")] {
        for pass in ["amp", "autocast", "uniform", "campo", "comp", "cascade"] {
            let mut m = qsync_onnx::import_file(&path).unwrap_or_else(|e| panic!("{e}"));
            pipeline_from_spec("infer-shapes")
                .expect("pipeline")
                .run(&mut m, &mut PassContext::default())
                .expect("infer");
            let pm = pipeline_from_spec(&format!("{pass}={dtype}")).expect("pipeline");
            let mut cx = PassContext { target: Some(target.to_string()), ..PassContext::default() };
            let err = pm.run(&mut m, &mut cx).err().unwrap_or_else(|| panic!("{pass}={dtype} on {target} succeeded"));
            let text = err.to_string();
            assert!(text.contains(&format!("has no {dtype} kernels")), "{pass}={dtype} on {target}: {text}");
        }
    }
}
