//! The NCCL backend's library discovery, through `cudarc` 0.19 with dynamic
//! loading: the crate builds, and this module runs, on machines without
//! CUDA; a missing `libcuda` or `libnccl` is [`CommError::LibraryMissing`]
//! naming what was searched, never cudarc's panic on first use (every sys
//! module's `is_culib_present()` is checked before any symbol is touched).
//!
//! The trap this module exists for: cudarc opens `libnccl.so` or
//! `libnccl.so.{13,12,11,10,9,1}`, while the PyPI wheel `nvidia-nccl-cu13`
//! ships only `libnccl.so.2`. [`probe`] searches the usual places for
//! `libnccl.so.2` (`$QSYNC_NCCL_LIB_DIR`, `$LD_LIBRARY_PATH`, the system
//! library directories, the wheel's directory given by Python's
//! `nvidia.nccl.__path__`) and, when it finds one cudarc cannot open, says
//! how to expose it (a `libnccl.so` symlink in a directory on
//! `LD_LIBRARY_PATH`; `scripts/gpu-sync-check.sh` does this).
//!
//! Not here yet: the NCCL `Communicator` itself (non-blocking communicators,
//! asynchronous-error polling and abort, split, grouped send/recv
//! all-to-all) — see the README's status of issue 17.

#![allow(unsafe_code)]

use std::path::{Path, PathBuf};

use crate::error::CommError;

/// What [`probe`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclInfo {
    /// `ncclGetVersion`, e.g. 23007 for 2.30.7.
    pub version: i32,
}

/// Directories where a `libnccl.so.2` may live.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["QSYNC_NCCL_LIB_DIR", "LD_LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    dirs.extend(
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/cuda/lib64", "/usr/local/lib"]
            .map(PathBuf::from),
    );
    // The pip wheel: `nvidia.nccl` is a namespace package (no __file__).
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if let Ok(out) = std::process::Command::new(py)
        .args(["-c", "import nvidia.nccl as m; print(list(m.__path__)[0])"])
        .stderr(std::process::Stdio::null())
        .output()
    {
        if out.status.success() {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !p.is_empty() {
                dirs.push(Path::new(&p).join("lib"));
            }
        }
    }
    dirs
}

/// Checks that the CUDA driver and NCCL can be loaded and returns NCCL's
/// version; otherwise a [`CommError::LibraryMissing`] that lists what was
/// searched and, if a wheel's `libnccl.so.2` exists, how to expose it.
pub fn probe() -> Result<NcclInfo, CommError> {
    let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
    let nccl_present = unsafe { cudarc::nccl::sys::is_culib_present() };
    if !nccl_present {
        let candidates = cudarc::get_lib_name_candidates("nccl").join(", ");
        let dirs = search_dirs();
        let found: Vec<PathBuf> = dirs.iter().map(|d| d.join("libnccl.so.2")).filter(|p| p.exists()).collect();
        let hint = match found.first() {
            Some(p) => format!(
                "; found {} but cudarc opens only the names above: link it as libnccl.so in a directory on LD_LIBRARY_PATH",
                p.display()
            ),
            None => String::new(),
        };
        return Err(CommError::LibraryMissing {
            library: "NCCL (libnccl)".into(),
            searched: format!(
                "the loader's path for {candidates}; libnccl.so.2 in {}{hint}",
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":")
            ),
        });
    }
    if !driver_present {
        return Err(CommError::LibraryMissing {
            library: "the CUDA driver (libcuda)".into(),
            searched: format!(
                "the loader's path for {} (no NVIDIA driver on this machine?)",
                cudarc::get_lib_name_candidates("cuda").join(", ")
            ),
        });
    }
    let version = cudarc::nccl::result::get_nccl_version().map_err(|e| CommError::Backend {
        backend: "nccl",
        op: "get_version",
        code: e.0 as i32,
        message: format!("{e:?}"),
    })?;
    Ok(NcclInfo { version })
}
