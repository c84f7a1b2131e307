//! The NCCL backend on a machine without CUDA or NCCL: a clear "library
//! missing" error naming what was searched, never a panic. On a machine with
//! both, the probe must report a real NCCL version instead.

use qsync_runtime::nccl::probe;
use qsync_runtime::CommError;

#[test]
fn missing_library_is_a_clear_error() {
    match probe() {
        Err(e @ CommError::LibraryMissing { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("not found (searched:"), "{msg}");
            assert!(msg.contains("libnccl") || msg.contains("libcuda"), "{msg}");
            eprintln!("no NCCL here, as expected: {msg}");
        }
        Ok(info) => {
            assert!(info.version >= 20_000, "implausible NCCL version {}", info.version);
            eprintln!("NCCL {} present: the library-missing path is not reachable on this machine", info.version);
        }
        Err(other) => panic!("expected LibraryMissing or a version, got: {other}"),
    }
}
