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
//! - Every failure is an [`OnnxError`] naming the file (and node); no input
//!   bytes make the importer panic.

pub mod compare;
mod error;
pub mod export;
pub mod import;
pub mod proto;

pub use error::OnnxError;
pub use export::{export_bytes, export_file};
pub use import::{import_bytes, import_bytes_with_report, import_file, import_file_with_report, ImportReport};

/// The number of nodes in the main graph of a serialized model, decoding
/// nothing but the node list (an independent check on the importer).
pub fn count_file_nodes(bytes: &[u8]) -> Result<usize, prost::DecodeError> {
    use prost::Message;
    let m = proto::ModelNodeCount::decode(bytes)?;
    Ok(m.graph.map_or(0, |g| g.node.len()))
}
