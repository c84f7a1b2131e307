//! # qsync-onnx — the ONNX frontend
//!
//! Reads ONNX models into the qsync IR ([`import`]) and writes them back
//! ([`export`]), through protobuf messages written by hand ([`proto`]; no
//! protoc, no build script).
//!
//! - [`import_file`] / [`import_bytes`] give a [`qsync_ir::Model`]; the
//!   `_with_report` variants also return an [`ImportReport`] listing what was
//!   kept opaque (control-flow bodies, model-local functions) or dropped.
//!   Shape inference ([`qsync_ir::infer::infer_shapes`]) runs after import.
//! - [`export_file`] / [`export_bytes`] write a model; export is
//!   deterministic and import → export → import is the identity on graphs
//!   (checked with [`compare::model_diff`]).
//! - Refreshed weight copies ([`qsync_ir::Graph::add_refreshed_copy`]) travel
//!   as model metadata: one entry per copy, key [`REFRESH_KEY_PREFIX`] + the
//!   copy's name, value the master's name. Both are initializers of the
//!   graph; a trainer reads these entries to refresh each copy after its
//!   optimizer step.
//! - Every failure is an [`OnnxError`] naming the file (and node); no input
//!   bytes make the importer panic.

pub mod compare;
mod error;
pub mod export;
pub mod import;
pub mod proto;
pub mod subgraph;

pub use error::OnnxError;
pub use export::{export_bytes, export_file};
pub use import::{import_bytes, import_bytes_with_report, import_file, import_file_with_report, ImportReport};

/// Metadata key prefix of a refreshed copy (see the crate docs).
pub const REFRESH_KEY_PREFIX: &str = "qsync.refresh:";

/// The number of nodes in the main graph of a serialized model, decoding
/// nothing but the node list (an independent check on the importer).
pub fn count_file_nodes(bytes: &[u8]) -> Result<usize, prost::DecodeError> {
    use prost::Message;
    let m = proto::ModelNodeCount::decode(bytes)?;
    Ok(m.graph.map_or(0, |g| g.node.len()))
}
