//! `egraph-casts` on every real model: after `amp` it verifies, keeps the
//! outputs' names and dtypes, never adds casts; on the models with weights
//! onnxruntime outputs of `amp` and `amp,egraph-casts` are bitwise equal
//! (every rule it applies there is exact; `passes/tests/numerics.py` with
//! zero tolerance).

use qsync_ir::{Model, Op};
use qsync_passes::{pipeline_from_spec, PassContext};

fn casts(m: &Model) -> usize {
    m.graph.node_ids().iter().filter(|&&n| m.graph.node(n).op == Op::Cast).count()
}

fn run(path: &std::path::Path, spec: &str) -> Model {
    let mut m = qsync_onnx::import_file(path).unwrap_or_else(|e| panic!("{e}"));
    let outputs = |m: &Model| -> Vec<String> {
        m.graph.outputs().iter().map(|&v| format!("{}:{}", m.graph.value_name(v), m.graph.ty(v))).collect()
    };
    let before = outputs(&m);
    let mut pm = pipeline_from_spec(&format!("infer-shapes,{spec},verify")).expect("pipeline");
    pm.verify_each(true);
    let report = pm.run(&mut m, &mut PassContext::default()).unwrap_or_else(|e| panic!("{} {spec}: {e}", path.display()));
    for r in &report.runs {
        if r.pass == "egraph-casts" {
            eprintln!("{}: {}", path.display(), r.outcome.summary);
        }
    }
    assert_eq!(before, outputs(&m), "{} {spec}: outputs keep names and dtypes", path.display());
    m
}

#[test]
fn every_model_through_amp_then_egraph_casts() {
    for path in qsync_tests::onnx_models() {
        let amp = casts(&run(&path, "amp"));
        let eg = casts(&run(&path, "amp,egraph-casts"));
        eprintln!("{}: amp {amp} casts, amp+egraph-casts {eg}", path.display());
        assert!(eg <= amp, "{}: {eg} > {amp}", path.display());
        // Imported models as they are (exporters emit casts).
        run(&path, "egraph-casts");
    }
}

#[test]
fn egraph_casts_is_bitwise_exact_in_onnxruntime() {
    use std::process::Command;
    let probe = Command::new("python3").args(["-c", "import onnx, onnxruntime"]).output();
    assert!(probe.is_ok_and(|o| o.status.success()), "python3 with onnx and onnxruntime is needed: run scripts/setup.sh");
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../passes/tests/numerics.py");
    let dir = std::env::temp_dir().join(format!("qsync-egraph-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for model in ["squeezenet1_1.onnx", "bert_tiny.onnx"] {
        let src = qsync_tests::models_dir().join(model);
        let a = dir.join(format!("{model}.amp.onnx"));
        let b = dir.join(format!("{model}.amp_egraph.onnx"));
        qsync_onnx::export_file(&run(&src, "amp"), &a).unwrap_or_else(|e| panic!("{e}"));
        qsync_onnx::export_file(&run(&src, "amp,egraph-casts"), &b).unwrap_or_else(|e| panic!("{e}"));
        let o = Command::new("python3").arg(&script).arg(&a).arg(&b).args(["0", "0"]).output().expect("run numerics.py");
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        eprintln!("{model}: amp vs amp,egraph-casts\n{text}");
        assert!(o.status.success(), "{model}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
