//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The shared models directory; panics (fails the test) when it is missing.
pub fn models_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models");
    assert!(
        dir.is_dir(),
        "the shared models directory `{}` is missing: these tests need the real ONNX models (../shared/models beside the checkout)",
        dir.display()
    );
    dir
}

/// Every `.onnx` file in the models directory, sorted.
pub fn model_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(models_dir())
        .expect("read models dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no .onnx models in {}", models_dir().display());
    v
}

/// A fresh empty temporary directory under the target dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("qsync-onnx-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}
