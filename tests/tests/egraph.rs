//! `egraph-casts` on every real model: after `amp` it verifies, keeps the
//! outputs' names and dtypes, never adds casts; on the models with weights
//! onnxruntime outputs of `amp` / `campo` and the same plus `egraph-casts`
//! are bitwise equal (every rule it applies there is exact;
//! `passes/tests/numerics.py` with zero tolerance). The one inexact rule
//! (FP32 BatchNormalization parameters) is checked on a model with weights
//! written here.

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
    let report =
        pm.run(&mut m, &mut PassContext::default()).unwrap_or_else(|e| panic!("{} {spec}: {e}", path.display()));
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
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "python3 with onnx and onnxruntime is needed: run scripts/setup.sh"
    );
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../passes/tests/numerics.py");
    let dir = std::env::temp_dir().join(format!("qsync-egraph-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for model in ["squeezenet1_1.onnx", "bert_tiny.onnx"] {
        for plan in ["amp", "campo"] {
            let src = qsync_tests::models_dir().join(model);
            let a = dir.join(format!("{model}.{plan}.onnx"));
            let b = dir.join(format!("{model}.{plan}_egraph.onnx"));
            let planned = run(&src, plan);
            let rewritten = run(&src, &format!("{plan},egraph-casts"));
            qsync_onnx::export_file(&planned, &a).unwrap_or_else(|e| panic!("{e}"));
            qsync_onnx::export_file(&rewritten, &b).unwrap_or_else(|e| panic!("{e}"));
            let o = Command::new("python3")
                .arg(&script)
                .arg(&a)
                .arg(&b)
                .args(["0", "0"])
                .output()
                .expect("run numerics.py");
            let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            eprintln!("{model}: {plan} vs {plan},egraph-casts\n{text}");
            assert!(o.status.success(), "{model}: {text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The check of the DAG extractor: on every egraph filetest graph
/// and on the small real models (whole cast regions after `amp`, in
/// training and inference mode), the extractor's DAG cost equals the ILP
/// optimum (`extract::ilp_cost`, good_lp + microlp). Tolerance: 1e-9
/// relative plus 1e-15 s absolute (float summation order; the ILP sees
/// nanoseconds), far below the smallest cost term (the 1e-12 s tie-break).
#[test]
fn dag_extractor_matches_the_ilp_optimum() {
    use qsync_passes::egraph::{EgraphCasts, Limits};
    use qsync_passes::precision::Policy;
    let pass = EgraphCasts {
        limits: Limits::default(),
        policy: Policy::load("tf-amp").expect("policy"),
        exact: false,
        refresh: true,
    };
    let check = |label: &str, m: &Model, cx: &PassContext| -> bool {
        let Some(c) = pass.ilp_check(m, cx, 4000).unwrap_or_else(|e| panic!("{label}: {e}")) else {
            eprintln!("{label}: no cast region, or too big for the ILP");
            return false;
        };
        let ilp = c.ilp.unwrap_or_else(|| panic!("{label}: the ILP solver failed ({c:?})"));
        eprintln!(
            "{label}: {} e-classes, {} e-nodes; input {:.6e}s, DAG extractor {:.6e}s, ILP optimum {:.6e}s",
            c.eclasses, c.enodes, c.input, c.dag, ilp
        );
        assert!((c.dag - ilp).abs() <= 1e-9 * ilp.abs() + 1e-15, "{label}: DAG {} vs ILP {}", c.dag, ilp);
        assert!(c.dag <= c.input + 1e-15, "{label}: extractor costlier than the input");
        true
    };
    let mut checked = 0;
    let dir = qsync_tests::filetests_dir().join("egraph");
    let mut files: Vec<_> = std::fs::read_dir(&dir).expect("filetests").map(|e| e.expect("entry").path()).collect();
    files.sort();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "qir")) {
        let src = std::fs::read_to_string(f).expect("read");
        let m = qsync_ir::text::parse_model(&src).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        checked += usize::from(check(&f.display().to_string(), &m, &PassContext::default()));
    }
    assert!(checked >= 6, "every egraph filetest has a cast region");
    for model in ["squeezenet1_1.onnx", "bert_tiny.onnx"] {
        for inference in [false, true] {
            let mut m =
                qsync_onnx::import_file(qsync_tests::models_dir().join(model)).unwrap_or_else(|e| panic!("{e}"));
            let mut cx = PassContext { inference, target: Some("t4".into()), ..PassContext::default() };
            pipeline_from_spec("infer-shapes,amp")
                .expect("spec")
                .run(&mut m, &mut cx)
                .unwrap_or_else(|e| panic!("{e}"));
            checked += usize::from(check(&format!("{model} amp inference={inference}"), &m, &cx));
        }
    }
    assert!(checked >= 8, "real subgraphs checked too");
}

/// The inexact rule checked where it can be: a Conv → BatchNormalization →
/// Relu → Conv model with weights (inference-mode BatchNormalization, so mean and
/// variance matter), planned by `amp` in training mode (every parameter
/// cast per iteration). `egraph-casts` drops the four parameter casts
/// (FP32 T1/T2 at opset 17); onnxruntime runs the mixed-type model, it
/// passes `onnx.checker` (full check), and its outputs stay within FP16
/// tolerance of the FP32 original; `egraph-casts(exact=true)` keeps the
/// casts and the bits.
#[test]
fn batchnorm_fp32_parameters_run_in_onnxruntime() {
    use std::fmt::Write as _;
    use std::process::Command;
    // A deterministic pseudo-random stream (xorshift), values in [-1, 1).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    };
    let mut list = |n: usize, f: &dyn Fn(f64) -> f64| -> String {
        (0..n).map(|_| format!("{:?}", f(next()) as f32)).collect::<Vec<_>>().join(", ")
    };
    let mut src = String::from("opset \"\" 17\ngraph \"bn\" {\n");
    let _ = writeln!(src, "  init %w: f32[8,3,3,3] = [{}]", list(216, &|x| 0.3 * x));
    let _ = writeln!(src, "  init %s: f32[8] = [{}]", list(8, &|x| 1.0 + 0.37 * x));
    let _ = writeln!(src, "  init %b: f32[8] = [{}]", list(8, &|x| 0.1 * x));
    let _ = writeln!(src, "  init %m: f32[8] = [{}]", list(8, &|x| 0.0123 * x));
    let _ = writeln!(src, "  init %v: f32[8] = [{}]", list(8, &|x| 0.9 + 0.0777 * x));
    let _ = writeln!(src, "  init %w2: f32[4,8,1,1] = [{}]", list(32, &|x| 0.3 * x));
    src.push_str(concat!(
        "  input %x: f32[2,3,8,8]\n",
        "  %c: f32[2,8,8,8] = Conv \"conv\"(%x, %w) {pads=[1, 1, 1, 1]}\n",
        "  %y: f32[2,8,8,8] = BatchNormalization \"bn\"(%c, %s, %b, %m, %v)\n",
        "  %r: f32[2,8,8,8] = Relu \"relu\"(%y)\n",
        "  %z: f32[2,4,8,8] = Conv \"conv2\"(%r, %w2)\n",
        "  output %z\n}\n",
    ));
    let plan = |spec: &str| -> Model {
        let mut m = qsync_ir::text::parse_model(&src).expect("parse");
        let mut pm = pipeline_from_spec(&format!("infer-shapes,{spec},verify")).expect("pipeline");
        pm.verify_each(true);
        pm.run(&mut m, &mut PassContext::default()).unwrap_or_else(|e| panic!("{spec}: {e}"));
        m
    };
    let (orig, amp, mixed, exact) =
        (plan("dce"), plan("amp"), plan("amp,egraph-casts"), plan("amp,egraph-casts(exact=true)"));
    assert_eq!(casts(&amp), 8, "amp: input, output, two conv weights, four BatchNormalization parameters");
    // Training: the two conv weights become refreshed copies (an exact
    // rule, so under `exact` too); the four BatchNormalization parameter
    // casts go, except under `exact`, where the trained scale and bias
    // become refreshed copies as well and the running statistics (buffers)
    // keep their casts.
    assert_eq!(casts(&mixed), 2, "the four parameter casts go, the two weight casts become copies");
    assert_eq!(mixed.graph.refreshed_copies().count(), 2, "conv weights stored as refreshed copies");
    assert_eq!(casts(&exact), 4, "exact keeps the statistics' casts");
    assert_eq!(exact.graph.refreshed_copies().count(), 4, "conv weights, scale and bias stored as refreshed copies");
    let probe = Command::new("python3").args(["-c", "import onnx, onnxruntime"]).output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "python3 with onnx and onnxruntime is needed: run scripts/setup.sh"
    );
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../passes/tests/numerics.py");
    let dir = std::env::temp_dir().join(format!("qsync-egraph-bn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = |name: &str, m: &Model| {
        let p = dir.join(name);
        qsync_onnx::export_file(m, &p).unwrap_or_else(|e| panic!("{e}"));
        p
    };
    let (o, a, x, e) =
        (file("orig.onnx", &orig), file("amp.onnx", &amp), file("mixed.onnx", &mixed), file("exact.onnx", &exact));
    let check = |ref_: &std::path::Path, got: &std::path::Path, tol: &[&str]| {
        let out = Command::new("python3").arg(&script).arg(ref_).arg(got).args(tol).output().expect("numerics.py");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{} vs {}: {text}", ref_.display(), got.display());
        assert!(out.status.success(), "{} vs {}: {text}", ref_.display(), got.display());
    };
    check(&o, &a, &[]);
    check(&o, &x, &[]);
    check(&a, &e, &["0", "0"]);
    let _ = std::fs::remove_dir_all(&dir);
}
