//! Hostile inputs end to end: every reproducer checked into the fuzz
//! corpora (`fuzz/corpus/*/manual-*`) and every file in `../shared/repro/`
//! (when the checkout has it) must make `qsyncc inspect` and `qsyncc opt`
//! exit with status 2 and a message naming the file — never a panic, an
//! abort, a hang or memory exhaustion.
//!
//! The deadline below is a hang guard, not a performance budget: a
//! reproducer that regresses into unbounded work is killed and reported.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{run_within, tmpdir};

/// Far above the few milliseconds each file takes; only a hang reaches it.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn reproducers() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut v = Vec::new();
    let corpora = root.join("fuzz/corpus");
    for dir in std::fs::read_dir(&corpora).expect("fuzz/corpus exists") {
        let dir = dir.expect("entry").path();
        for f in std::fs::read_dir(&dir).expect("corpus dir") {
            let f = f.expect("entry").path();
            if f.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("manual-")) {
                v.push(f);
            }
        }
    }
    let shared = root.join("../shared/repro");
    if let Ok(rd) = std::fs::read_dir(&shared) {
        v.extend(rd.map(|e| e.expect("entry").path()).filter(|p| p.is_file()));
    }
    v.sort();
    v
}

/// Run qsyncc with a hang guard; (exit code, stderr, seconds).
fn run_guarded(args: &[&str]) -> (Option<i32>, String, f64) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qsyncc"));
    cmd.args(args);
    let (code, stderr, took) = run_within(cmd, HANG_GUARD);
    (code, stderr, took.as_secs_f64())
}

fn check(args: &[&str], file: &Path) {
    let (code, stderr, secs) = run_guarded(args);
    let name = file.file_name().and_then(|n| n.to_str()).expect("utf8 name");
    assert_eq!(code, Some(2), "qsyncc {args:?}: exit {code:?} after {secs:.2}s, stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "qsyncc {args:?} panicked:\n{stderr}");
    assert!(stderr.contains(name), "qsyncc {args:?}: the error must name the file `{name}`:\n{stderr}");
}

#[test]
fn every_reproducer_is_refused_with_exit_2_by_every_command() {
    let files = reproducers();
    assert!(files.len() >= 9, "expected the nine checked-in reproducers, found {}", files.len());
    let out = tmpdir("hostile");
    for f in &files {
        let p = f.to_str().expect("utf8 path");
        check(&["inspect", p], f);
        let o = out.join("out.onnx");
        check(&["opt", p, "--passes", "verify", "-o", o.to_str().expect("utf8")], f);
        // What inspect refuses, every command that reads a model refuses
        // the same way.
        let plan = out.join("plan");
        check(&["plan", p, "--targets", "v100:1,t4:1", "--batch", "4", "-o", plan.to_str().expect("utf8")], f);
        check(&["simulate", p, "--targets", "v100:1,t4:1", "--batch", "4"], f);
        let cg = out.join("codegen");
        check(&["codegen", p, "--target", "t4", "-o", cg.to_str().expect("utf8")], f);
    }
}
