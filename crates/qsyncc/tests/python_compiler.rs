//! The compiler in the `qsync` wheel, against this crate's binary: the
//! wheel is built with maturin and installed into the PyTorch environment
//! `scripts/setup.sh` makes (as `tests/python.rs`), then
//! `crates/python/tests/compiler_check.py` checks on SqueezeNet 1.1 that
//! - the wheel's `qsyncc` console command is the CLI (`--help`, a plan with
//!   the binary's manifest);
//! - `qsync.plan` (from a path or an `onnx.ModelProto`, into a given or a
//!   temporary directory, with options) returns the manifest and the
//!   per-device models the binary writes for the same arguments, and the
//!   models pass the ONNX checker;
//! - `qsync.passes.run` returns the model `qsyncc opt -o` writes;
//! - without PyTorch (`import torch` refused) `import qsync`, `qsync.plan`
//!   and `qsync.passes.run` work, and `qsync.apply_plan` & co. raise an
//!   ImportError naming PyTorch;
//! - a missing or corrupt model, an unknown target, scheme or pass raise
//!   `qsync.ModelError` / `TargetError` / `OptionError` with the message
//!   the binary prints.

use std::process::Command;
use std::time::Duration;

mod common;
mod pyenv;
use pyenv::{root, venv};

#[test]
fn wheel_compiler_is_the_binary() {
    pyenv::install_wheel("wheels-compiler");
    let work = common::tmpdir("python-compiler");
    let mut c = Command::new(venv().join("bin/python"));
    c.arg(root().join("crates/python/tests/compiler_check.py"))
        .arg(common::models_dir())
        .arg(&work)
        .env("QSYNCC", env!("CARGO_BIN_EXE_qsyncc"))
        .env("OMP_NUM_THREADS", "1")
        .current_dir(root());
    let (code, stderr, took) = common::run_within(c, Duration::from_secs(240));
    assert_eq!(code, Some(0), "compiler_check.py failed after {took:?}:\n{stderr}");
    eprintln!("compiler_check.py: {took:.1?}");
    let _ = std::fs::remove_dir_all(&work);
}
