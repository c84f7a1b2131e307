//! The runtime's typed errors. A communicator failure says which operation,
//! which rank and why, so a job that dies tells its user where; nothing in
//! this crate panics on a failing peer, a missing library or bad input.

use std::time::Duration;

/// A communicator failure.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// A shared library the backend loads at run time is absent.
    #[error("{library} not found (searched: {searched})")]
    LibraryMissing { library: String, searched: String },
    /// The operation did not complete before its deadline. The communicator
    /// is unusable afterwards (the operation may still be in flight).
    #[error("rank {rank}: {op} did not complete within {timeout:.1?} (a peer is stalled or dead)")]
    /// `rank` is the world rank of the process that timed out.
    Timeout { op: &'static str, rank: usize, timeout: Duration },
    /// A peer failed (exited, aborted, or reported an error) during `op`.
    #[error("rank {rank}: a peer failed during {op}: {detail}")]
    PeerFailed { op: &'static str, rank: usize, detail: String },
    /// The engine reported an error.
    #[error("{backend} error {code} in {op}: {message}")]
    Backend { backend: &'static str, op: &'static str, code: i32, message: String },
    /// The backend cannot do this.
    #[error("unsupported by {backend}: {what}")]
    Unsupported { backend: &'static str, what: String },
    /// The caller passed buffers or counts that do not fit the operation.
    #[error("invalid arguments to {op}: {detail}")]
    InvalidArgument { op: &'static str, detail: String },
    /// An earlier failure left the communicator unusable.
    #[error("communicator unusable after an earlier failure: {0}")]
    Poisoned(String),
}

/// A gradient-synchronization failure.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The scheme name or its parameters are invalid.
    #[error("bad synchronization scheme: {0}")]
    BadScheme(String),
    /// The cluster shape does not fit the communicator.
    #[error("bad cluster shape: {0}")]
    BadShape(String),
    /// A received payload is malformed (a peer ran another scheme or
    /// another gradient size).
    #[error("rank {rank}: malformed payload from rank {peer}: {detail}")]
    BadPayload { rank: usize, peer: usize, detail: String },
}
