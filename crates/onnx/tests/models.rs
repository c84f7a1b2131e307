//! Every shared model imports with the file's node count, round-trips
//! through export to an identical graph, and exports deterministically.

mod common;

use qsync_onnx::compare::model_diff;
use qsync_onnx::{count_file_nodes, export_bytes, export_file, import_bytes, import_file, import_file_with_report};

#[test]
fn node_counts_match_the_files() {
    for path in common::model_files() {
        let bytes = std::fs::read(&path).expect("read model");
        let want = count_file_nodes(&bytes).expect("count nodes");
        let (model, report) = import_file_with_report(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(model.graph.node_count(), want, "{}", path.display());
        assert!(want > 0, "{}", path.display());
        assert_eq!(model.base_dir.as_deref(), path.parent(), "{}", path.display());
        eprintln!("{}: {} nodes, {} warnings", path.display(), want, report.warnings.len());
    }
}

#[test]
fn round_trip_is_identity_and_deterministic() {
    for path in common::model_files() {
        let a = import_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let bytes1 = export_bytes(&a).unwrap_or_else(|e| panic!("{e}"));
        let bytes2 = export_bytes(&a).unwrap_or_else(|e| panic!("{e}"));
        assert!(bytes1 == bytes2, "{}: export is not deterministic", path.display());
        let b = import_bytes(&bytes1, path.parent(), "exported").unwrap_or_else(|e| panic!("{e}"));
        let diff = model_diff(&a, &b);
        assert!(diff.is_empty(), "{}: round trip differs:\n{}", path.display(), diff[..diff.len().min(20)].join("\n"));
        // A second round is byte-identical to the first.
        let bytes3 = export_bytes(&b).unwrap_or_else(|e| panic!("{e}"));
        assert!(bytes1 == bytes3, "{}: export of the re-import differs", path.display());
        assert_eq!(count_file_nodes(&bytes1).ok(), Some(a.graph.node_count()));
    }
}

#[test]
fn export_file_keeps_external_references() {
    let dir = common::temp_dir("ext");
    let path = common::models_dir().join("resnet50.onnx");
    let a = import_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let out = dir.join("resnet50.onnx");
    export_file(&a, &out).unwrap_or_else(|e| panic!("{e}"));
    let b = import_file(&out).unwrap_or_else(|e| panic!("{e}"));
    assert!(model_diff(&a, &b).is_empty());
    let ext = b
        .graph
        .inits()
        .iter()
        .filter(|&&v| matches!(b.graph.value(v).init().map(|t| &t.data), Some(qsync_ir::TensorData::External { .. })))
        .count();
    assert!(ext > 0, "external initializers survive");
}
