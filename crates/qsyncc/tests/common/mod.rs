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

/// Every file under `dir`, relative and `/`-separated, sorted.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).expect("under root");
                out.push(rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Check a plan directory's `manifest.json` against the schema in
/// `crates/qsyncc/schema/` (every error listed), and that its `files` are
/// exactly the files in the directory; returns the manifest.
pub fn check_plan_dir(dir: &Path) -> serde_json::Value {
    let schema_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schema/qsync-plan-4.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("schema file")).expect("schema JSON");
    let validator = jsonschema::validator_for(&schema).expect("the schema is a valid JSON Schema");
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest.json");
    let manifest: serde_json::Value = serde_json::from_str(&text).expect("manifest JSON");
    let errors: Vec<String> = validator.iter_errors(&manifest).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{}: manifest does not match the schema:\n{}", dir.display(), errors.join("\n"));
    let listed: Vec<String> =
        manifest["files"].as_array().expect("files").iter().map(|f| f.as_str().expect("str").to_string()).collect();
    assert_eq!(listed, files_under(dir), "{}: `files` must list every file written", dir.display());
    let chosen = manifest["chosen"].as_str().expect("chosen");
    assert!(manifest["methods"].get(chosen).is_some(), "chosen `{chosen}` is a key of methods");
    manifest
}

/// Runs `cmd` (its stdout discarded), killing it and failing the test as a
/// hang past `limit`: (exit code, stderr, elapsed).
pub fn run_within(mut cmd: Command, limit: std::time::Duration) -> (Option<i32>, String, std::time::Duration) {
    use std::process::Stdio;
    let t0 = std::time::Instant::now();
    let what = format!("{cmd:?}");
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn");
    let mut err = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return (status.code(), reader.join().expect("stderr reader"), t0.elapsed());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {limit:?}: a hang");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
