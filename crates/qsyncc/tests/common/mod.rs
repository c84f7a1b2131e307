//! Helpers shared by the CLI tests: running the binary, the real models,
//! scratch directories.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `../shared/models` beside the checkout (the tests fail, never skip, without it).
pub fn models_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models");
    assert!(d.is_dir(), "real models expected at {}", d.display());
    d
}

/// Every `.onnx` model in [`models_dir`], sorted; at least the eight shared ones.
pub fn onnx_models() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(models_dir())
        .expect("models")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    assert!(v.len() >= 8, "expected the shared models, found {}", v.len());
    v
}

pub fn qsyncc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qsyncc")).args(args).output().expect("run qsyncc")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh directory, unique per call: tests run in parallel threads of one
/// process and may plan the same model with the same flags.
pub fn tmpdir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("qsyncc-test-{}-{k}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp");
    d
}

/// Run `qsyncc SUBCOMMAND MODEL --json EXTRA…`, which must succeed, and parse its JSON.
pub fn run_json(sub: &str, model: &Path, extra: &[&str]) -> serde_json::Value {
    let p = model.to_str().expect("utf8 path");
    let mut args = vec![sub, p, "--json"];
    args.extend_from_slice(extra);
    let o = qsyncc(&args);
    assert!(o.status.success(), "{sub} {p} {extra:?} failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{sub} --json prints JSON: {e}"))
}

/// `inspect --json`.
pub fn inspect_json(model: &Path, extra: &[&str]) -> serde_json::Value {
    run_json("inspect", model, extra)
}
