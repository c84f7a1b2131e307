//! The NCCL backend on a machine without CUDA or NCCL: a clear "library
//! missing" error naming what was searched, never a panic — from the probe,
//! the unique id, the communicator's constructor and the `qsync-sync-check`
//! launcher (exit status 2). On a machine with NCCL and a GPU, the same
//! tests run a real 2-rank NCCL job instead (and print which case ran).

use std::process::Command;
use std::time::Duration;

use qsync_runtime::cuda::CudaEngine;
use qsync_runtime::nccl::{probe, NcclComm, UniqueId};
use qsync_runtime::CommError;

fn assert_missing(e: &CommError) {
    let msg = e.to_string();
    assert!(matches!(e, CommError::LibraryMissing { .. }), "expected LibraryMissing, got: {msg}");
    assert!(msg.contains("not found (searched:"), "{msg}");
    assert!(msg.contains("libnccl") || msg.contains("libcuda"), "{msg}");
}

#[test]
fn missing_library_is_a_clear_error() {
    match probe() {
        Err(e @ CommError::LibraryMissing { .. }) => {
            assert_missing(&e);
            eprintln!("no NCCL here, as expected: {e}");
        }
        Ok(info) => {
            assert!(info.version >= 20_000, "implausible NCCL version {}", info.version);
            eprintln!("NCCL {} present: the library-missing path is not reachable on this machine", info.version);
        }
        Err(other) => panic!("expected LibraryMissing or a version, got: {other}"),
    }
}

#[test]
fn constructor_and_unique_id_report_the_missing_library() {
    let Err(probe_err) = probe() else {
        eprintln!("skipped: NCCL and the CUDA driver are present (the GPU job test covers this machine)");
        return;
    };
    // The library check comes before the environment is read: no launcher
    // variables are set here, and the error must still be about the library.
    match NcclComm::from_env(Duration::from_secs(5)) {
        Err(e) => assert_missing(&e),
        Ok(c) => panic!("a communicator without NCCL: {c:?}"),
    }
    let nccl_missing = probe_err.to_string().contains("libnccl");
    match UniqueId::new() {
        Err(e) => {
            assert!(nccl_missing, "the unique id needs only libnccl, yet: {e}");
            assert_missing(&e);
        }
        Ok(id) => assert!(!nccl_missing, "a unique id without libnccl: {id:?}"),
    }
}

#[test]
fn unique_id_hex_is_checked() {
    // Parsing needs no library.
    let hex: String = (0..128u32).map(|i| format!("{:02x}", (i * 37 + 5) % 256)).collect();
    let id = UniqueId::from_hex(&hex).expect("valid hex");
    assert_eq!(id.to_hex(), hex);
    for bad in ["", "abc", &hex[..254], &format!("{}zz", &hex[..254])] {
        match UniqueId::from_hex(bad) {
            Err(CommError::InvalidArgument { .. }) => {}
            other => panic!("`{bad}` accepted or wrong error: {other:?}"),
        }
    }
}

fn sync_check(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new("timeout")
        .args(["-k", "5", "600", env!("CARGO_BIN_EXE_qsync-sync-check")])
        .args(args)
        .output()
        .expect("run qsync-sync-check");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), log)
}

fn gpu_present() -> bool {
    probe().is_ok() && Command::new("nvidia-smi").arg("-L").output().map(|o| o.status.success()).unwrap_or(false)
}

/// Without NCCL: the launcher exits 2 naming the library. With NCCL and a
/// GPU: two ranks (on one GPU if need be) pass the bounds suite.
#[test]
fn nccl_job_or_a_clear_error() {
    if !gpu_present() {
        let (code, log) = sync_check(&["--backend", "nccl", "--ranks", "2", "--suite", "bounds"]);
        match probe() {
            Err(_) => {
                assert_eq!(code, Some(2), "{log}");
                assert!(log.contains("not found (searched:"), "{log}");
                assert!(!log.contains("panicked"), "{log}");
                eprintln!("no NCCL: the launcher exits 2: {}", log.lines().next().unwrap_or(""));
            }
            Ok(_) => eprintln!("skipped: NCCL is present but no GPU is visible (nvidia-smi -L failed)"),
        }
        return;
    }
    let (code, log) = sync_check(&["--backend", "nccl", "--ranks", "2", "--suite", "bounds", "--timeout", "60"]);
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains(" 0 failures over all ranks"), "{log}");
    eprintln!("NCCL 2-rank bounds suite passed:\n{log}");
}

/// A killed rank ends an NCCL job with an error on the survivors, not a hang.
#[test]
fn nccl_killed_rank_is_an_error() {
    if !gpu_present() {
        eprintln!("skipped: needs NCCL and a GPU (probe: {:?})", probe().err().map(|e| e.to_string()));
        return;
    }
    let args = ["--backend", "nccl", "--ranks", "2", "--suite", "fault", "--fault", "exit", "--fault-rank", "1"];
    let (code, log) = sync_check(&[&args[..], &["--nodes", "2", "--timeout", "10"]].concat());
    assert_ne!(code, Some(0), "{log}");
    assert_ne!(code, Some(124), "the NCCL job hung:\n{log}");
    assert!(log.contains("injected fault: exiting abruptly"), "{log}");
    assert!(log.contains("rank 0:"), "the survivor said nothing:\n{log}");
}

#[test]
fn the_device_kernel_engine_reports_what_is_missing() {
    // Without the CUDA driver: LibraryMissing naming libcuda. With one, an
    // empty PTX lacks every kernel: an error naming the first, never a
    // module with kernels missing.
    match CudaEngine::new(0, "") {
        Err(e @ CommError::LibraryMissing { .. }) => {
            assert_missing(&e);
            eprintln!("no CUDA driver here, as expected: {e}");
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("lacks kernel") || msg.contains("cuda error"), "{msg}");
            eprintln!("a CUDA driver is present: {msg}");
        }
        Ok(engine) => panic!("an empty PTX loaded as {engine:?}"),
    }
    let dir = std::env::temp_dir().join(format!("qsync-no-ptx-{}", std::process::id()));
    match CudaEngine::from_dir(0, &dir) {
        Err(CommError::LibraryMissing { .. }) => {}
        Err(e) => assert!(e.to_string().contains("kernels.ptx") || e.to_string().contains("cuda error"), "{e}"),
        Ok(engine) => panic!("no PTX directory, yet {engine:?}"),
    }
}
