//! The PyTorch environment the Python-driven tests run in: where it is, and
//! the `qsync` wheel built from this checkout and installed into it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The environment `scripts/setup.sh` makes (`QSYNC_TORCH_VENV` overrides).
pub fn venv() -> PathBuf {
    match std::env::var_os("QSYNC_TORCH_VENV") {
        Some(v) => PathBuf::from(v),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/qsync/torch-venv"),
    }
}

/// Builds the wheel with maturin into `target/<out>` and installs it into
/// the environment (no dependencies: the environment's PyTorch is used),
/// once per test process: the tests of one binary that call it at once wait
/// for the first (a second build would empty the folder the first writes).
pub fn install_wheel(out: &str) {
    static DONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if done.iter().any(|d| d == out) {
        return;
    }
    build_and_install(out);
    done.push(out.to_string());
}

fn build_and_install(out: &str) {
    let bin = venv().join("bin");
    assert!(
        bin.join("python").exists() && bin.join("maturin").exists(),
        "no PyTorch environment at {}: run scripts/setup.sh (the README's test command does)",
        venv().display()
    );
    let out = root().join("target").join(out);
    let _ = std::fs::remove_dir_all(&out);
    let st = Command::new(bin.join("maturin"))
        .args(["build", "-q", "-o"])
        .arg(&out)
        .current_dir(root().join("crates/python"))
        .status()
        .expect("maturin runs");
    assert!(st.success(), "maturin build failed");
    let wheel = std::fs::read_dir(&out)
        .expect("wheel dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel was built");
    let st = Command::new(bin.join("pip"))
        .args(["install", "-q", "--disable-pip-version-check", "--no-deps", "--force-reinstall"])
        .arg(&wheel)
        .status()
        .expect("pip runs");
    assert!(st.success(), "pip install {} failed", wheel.display());
}
