//! Every real model in `../shared/models`: import, infer, verify, the
//! standard pipeline, text round trip and ONNX round trip.

use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::text::{parse_model, print_model};
use qsync_passes::{pipeline_from_spec, PassContext};

fn load(path: &std::path::Path) -> qsync_ir::Model {
    qsync_onnx::import_file(path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn import_infers_every_shape_and_verifies() {
    for path in qsync_tests::onnx_models() {
        let mut m = load(&path);
        let opset = m.opset();
        let r = infer_shapes(&mut m.graph, opset, &InferOptions::default());
        assert!(r.errors.is_empty(), "{}: {:?}", path.display(), r.errors);
        assert!(r.unknown.is_empty(), "{}: {} unknown", path.display(), r.unknown.len());
        qsync_ir::verify::verify(&m.graph, opset).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
    }
}

#[test]
fn text_ir_round_trips_exactly() {
    for path in qsync_tests::onnx_models() {
        let m = load(&path);
        let text = print_model(&m);
        let back = parse_model(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(print_model(&back), text, "{}", path.display());
    }
}

#[test]
fn onnx_round_trip_gives_identical_ir_text() {
    for path in qsync_tests::onnx_models() {
        let m = load(&path);
        let bytes = qsync_onnx::export_bytes(&m).unwrap_or_else(|e| panic!("{e}"));
        let again =
            qsync_onnx::import_bytes(&bytes, m.base_dir.as_deref(), "round-trip").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(print_model(&again), print_model(&m), "{}", path.display());
        assert_eq!(
            qsync_onnx::export_bytes(&again).expect("export"),
            bytes,
            "{}: export is deterministic",
            path.display()
        );
    }
}

#[test]
fn standard_pipeline_keeps_models_valid() {
    for path in qsync_tests::onnx_models() {
        let mut m = load(&path);
        let outputs_before: Vec<String> = m.graph.outputs().iter().map(|&v| m.graph.ty(v).to_string()).collect();
        let nodes_before = m.graph.node_count();
        let mut pm = pipeline_from_spec("infer-shapes,fold-constants,dce,verify").expect("pipeline");
        pm.verify_each(true);
        let mut cx = PassContext::default();
        pm.run(&mut m, &mut cx).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let outputs_after: Vec<String> = m.graph.outputs().iter().map(|&v| m.graph.ty(v).to_string()).collect();
        assert_eq!(outputs_before, outputs_after, "{}", path.display());
        assert!(m.graph.node_count() <= nodes_before, "{}", path.display());
        // The exporters' Constant nodes always fold away.
        assert!(
            m.graph.node_ids().iter().all(|&n| m.graph.node(n).op != qsync_ir::Op::Constant),
            "{}: Constant nodes left after fold-constants",
            path.display()
        );
    }
}

#[test]
fn static_training_graph_shape_arithmetic_folds_away() {
    // With batch and seq bound, BERT's Shape → Gather → Concat → Reshape
    // chains are all constant: fold-constants + dce removes every Shape node.
    let mut m = load(&qsync_tests::models_dir().join("bert_base_train.onnx"));
    let mut cx = PassContext::default();
    cx.infer.batch = Some(4);
    cx.infer.dims.insert("seq".into(), 128);
    let mut pm = pipeline_from_spec("infer-shapes,fold-constants,dce,verify").expect("pipeline");
    pm.verify_each(true);
    let before = m.graph.node_count();
    pm.run(&mut m, &mut cx).unwrap_or_else(|e| panic!("{e}"));
    let shapes = m.graph.node_ids().iter().filter(|&&n| m.graph.node(n).op == qsync_ir::Op::Shape).count();
    assert_eq!(shapes, 0, "Shape nodes left");
    assert!(m.graph.node_count() < before / 2, "{before} -> {}", m.graph.node_count());
}
