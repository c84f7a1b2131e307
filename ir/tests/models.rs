//! Shape inference on the shared ONNX models: every value gets a type, no
//! errors, and the results agree with `onnx.shape_inference` wherever onnx
//! gives a definite answer.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod support;

use std::path::{Path, PathBuf};

use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{Dim, TensorType};

/// `../shared/models` beside the checkout; the tests fail without it.
fn models_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/models");
    assert!(dir.is_dir(), "the real models are expected at {}", dir.display());
    dir
}

fn models() -> Vec<PathBuf> {
    let rd = std::fs::read_dir(models_dir()).expect("read the models directory");
    let mut v: Vec<PathBuf> =
        rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "onnx")).collect();
    v.sort();
    assert!(!v.is_empty(), "no .onnx models in {}", models_dir().display());
    v
}

/// Compare with onnx's answer: dtype, rank, and each dim onnx knows
/// (integers, and named symbols other than onnx's own `unk__N`).
fn agrees(ours: &TensorType, reference: &serde_json::Value) -> Result<(), String> {
    let r = support::ttype(reference);
    if let (Some(a), Some(b)) = (ours.dtype, r.dtype) {
        if a != b {
            return Err(format!("dtype {a} vs onnx {b}"));
        }
    }
    let (Some(a), Some(b)) = (&ours.shape, &r.shape) else { return Ok(()) };
    if a.len() != b.len() {
        return Err(format!("rank {} vs onnx {}", a.len(), b.len()));
    }
    for (x, y) in a.iter().zip(b) {
        let onnx_knows =
            y.as_const().is_some() || y.as_sym().is_some_and(|s| !s.starts_with("unk__") && !s.contains("_d"));
        if onnx_knows && x != y {
            return Err(format!("dim {x} vs onnx {y}"));
        }
    }
    Ok(())
}

fn run_model(path: &Path, opts: &InferOptions) -> (usize, usize, Vec<String>) {
    let mut l = support::load(path);
    let report = infer_shapes(&mut l.graph, l.opset, opts);
    let g = &l.graph;
    let mut problems = Vec::new();
    for e in &report.errors {
        problems.push(format!("error at {} ({}): {}", e.node, e.op, e.message));
    }
    for &v in &report.unknown {
        problems.push(format!("unknown: {} : {}", g.value_name(v), g.ty(v)));
    }
    if let Err(es) = qsync_ir::verify::verify(g, l.opset) {
        problems.extend(es.iter().map(|e| format!("verify: {e}")));
    }
    eprintln!("  warnings {}", report.warnings.len());
    if std::env::var_os("QSYNC_SHOW").is_some() {
        for n in g.node_ids() {
            let node = g.node(n);
            if matches!(node.op.op_type(), "Reshape" | "Expand" | "Range" | "Slice" | "ConstantOfShape") {
                for &o in node.outputs() {
                    eprintln!("  {} {} : {}", node.op.op_type(), g.value_name(o), g.ty(o));
                }
            }
        }
    }
    let mut compared = 0;
    if opts.batch.is_none() && opts.dims.is_empty() {
        for v in g.live_values() {
            let name = g.value_name(v);
            if let Some(r) = l.reference.get(name) {
                compared += 1;
                if let Err(m) = agrees(g.ty(v), r) {
                    problems.push(format!("{name}: ours {} — {m}", g.ty(v)));
                }
            }
        }
    }
    (report.unknown.len(), compared, problems)
}

#[test]
fn every_model_infers_completely_and_agrees_with_onnx() {
    let ms = models();
    let mut all = Vec::new();
    for m in &ms {
        let (unknown, compared, problems) = run_model(m, &InferOptions::default());
        eprintln!("{}: unknown {unknown}, compared {compared}, problems {}", m.display(), problems.len());
        for p in problems.iter().take(15) {
            eprintln!("  {p}");
        }
        all.extend(problems.into_iter().map(|p| format!("{}: {p}", m.display())));
    }
    assert!(all.is_empty(), "{} problems", all.len());
}

#[test]
fn batch_binding_propagates_on_bert_train() {
    let p = models_dir().join("bert_base_train.onnx");
    let mut l = support::load(&p);
    let opts = InferOptions { batch: Some(4), dims: [("seq".to_string(), 128)].into_iter().collect() };
    let report = infer_shapes(&mut l.graph, l.opset, &opts);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.unknown.is_empty());
    assert_eq!(report.fixed_batch, None);
    let g = &l.graph;
    for v in g.live_values() {
        let t = g.ty(v);
        assert!(t.shape.as_ref().unwrap().iter().all(Dim::is_const), "{} : {t}", g.value_name(v));
    }
}

#[test]
fn batch_on_fixed_batch_model_reports_it() {
    let p = models_dir().join("resnet50.onnx");
    let mut l = support::load(&p);
    let report = infer_shapes(&mut l.graph, l.opset, &InferOptions { batch: Some(8), ..Default::default() });
    assert_eq!(report.fixed_batch, Some(1));
    assert!(report.errors.is_empty());
}
