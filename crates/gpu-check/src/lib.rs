//! # qsync-gpu-check — where the GPU check finds its PTX
//!
//! The check itself is `tests/gpu.rs` (run by `scripts/gpu-check.sh`): it
//! loads `<dir>/sm_XX/kernels.ptx` for the GPU's compute capability, runs
//! every kernel through the CUDA driver and compares with
//! `qsync_kernels::reference`, then measures bandwidth on 256 MiB tensors.

use std::path::{Path, PathBuf};

/// `sm_75` for compute capability 7.5.
pub fn sm_name(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// The PTX directory: `$QSYNC_PTX_DIR`, else `target/gpu-check` under the
/// workspace root.
pub fn ptx_dir() -> PathBuf {
    std::env::var_os("QSYNC_PTX_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/gpu-check"))
}

/// Reads `<dir>/<sm>/kernels.ptx`, with an error that says how to make it.
pub fn read_ptx(dir: &Path, sm: &str) -> Result<String, String> {
    let path = dir.join(sm).join("kernels.ptx");
    std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (generate it with `qsyncc codegen MODEL --target {sm} --emit ptx --all-kernels -o {}`)",
            path.display(),
            dir.join(sm).display()
        )
    })
}
