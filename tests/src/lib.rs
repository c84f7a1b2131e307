//! Shared helpers for qsync's integration tests and benches.

use std::path::PathBuf;

/// `../shared/models` beside the checkout. Panics with a clear message when
/// it is missing: the real-model tests are part of the suite, never skipped.
pub fn models_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/models");
    assert!(
        dir.is_dir(),
        "the real models are expected at {} (a checkout of qsync with ../shared beside it)",
        dir.display()
    );
    dir
}

/// Every `.onnx` model in [`models_dir`], sorted by name.
pub fn onnx_models() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(models_dir())
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "onnx"));
    v.sort();
    assert!(!v.is_empty(), "no .onnx models found in {}", models_dir().display());
    v
}

/// The directory of text-IR filetests.
pub fn filetests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("filetests")
}
