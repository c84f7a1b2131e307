//! Why the plan pipeline failed. Each variant says which part of the work
//! went wrong; the message is the CLI's, naming the flag, the file, the
//! node or the device.

use std::path::PathBuf;

/// A failure of the plan pipeline or of parsing one of its inputs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag value is wrong (an unknown precision, pass, scheme, a bound
    /// out of range, a statistics file that is not one).
    #[error("{0}")]
    Request(String),
    /// The cluster is wrong: the targets are malformed, name an unknown
    /// device or one twice, the cluster file, the network rate, a device
    /// file or a memory limit is bad.
    #[error("{0}")]
    Cluster(String),
    /// The model cannot be read or imported at the requested batch.
    #[error("{0}")]
    Model(String),
    /// The model was read but planning, materializing or the per-device
    /// pipeline failed; the message names the file and, where there is
    /// one, the node and the device.
    #[error("{0}")]
    Plan(String),
    /// The output directory could not be written, or is not ours to replace.
    #[error("{path}: {reason}")]
    Output { path: PathBuf, reason: String },
}

impl Error {
    /// `e` with its causes, as the CLI prints them.
    pub(crate) fn cluster(e: anyhow::Error) -> Error {
        Error::Cluster(format!("{e:#}"))
    }

    pub(crate) fn model(e: anyhow::Error) -> Error {
        Error::Model(format!("{e:#}"))
    }

    pub(crate) fn plan(e: anyhow::Error) -> Error {
        Error::Plan(format!("{e:#}"))
    }
}

/// The pipeline's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
