//! The error type of the TorchScript frontend. Every variant names the
//! archive (the label the caller gave) and, where the problem belongs to one
//! place, the member file and line or the node, so a message alone says where
//! to look.

/// What can go wrong importing a TorchScript archive.
#[derive(Debug, thiserror::Error)]
pub enum TsError {
    #[error("{file}: cannot read: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not a TorchScript archive: {why}")]
    NotArchive { file: String, why: String },
    #[error("{file}: zip entry `{member}` would take the archive's decompressed size to {read} bytes, over the limit of {limit} (a decompression bomb, or an archive too large to import)")]
    Inflate { file: String, member: String, read: u64, limit: u64 },
    #[error("{file}: archive has no `{member}`")]
    Missing { file: String, member: String },
    #[error("{file}: {member}: malformed pickle at byte {offset}: {msg}")]
    Pickle { file: String, member: String, offset: usize, msg: String },
    #[error("{file}: {member}:{line}: {msg}")]
    Code { file: String, member: String, line: usize, msg: String },
    #[error("{file}: {place}: {msg}")]
    Lower { file: String, place: String, msg: String },
    #[error("{file}: {msg}")]
    Invalid { file: String, msg: String },
}

pub type Result<T> = std::result::Result<T, TsError>;
