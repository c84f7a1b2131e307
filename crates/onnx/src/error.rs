//! The error type of the ONNX frontend. Every variant names the file (the
//! label the caller gave) and, where the problem belongs to one, the node or
//! value, so that a message alone says where to look.

use std::path::PathBuf;

/// What can go wrong reading or writing an ONNX model.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("{file}: cannot read or write: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: empty file (0 bytes): not an ONNX model")]
    Empty { file: String },
    #[error("{file}: not an ONNX model: {why}")]
    NotOnnx { file: String, why: String },
    #[error("{file}: malformed ONNX protobuf (truncated or corrupt): {detail}")]
    Decode { file: String, detail: String },
    #[error("{file}: the model has no graph")]
    MissingGraph { file: String },
    #[error("{file}: unsupported opset: domain `{domain}` version {version} (the default domain must be imported at a version in 7..=25)")]
    UnsupportedOpset { file: String, domain: String, version: i64 },
    #[error("{file}: {place}: unknown tensor element type code {code}")]
    UnknownElemType { file: String, place: String, code: i32 },
    #[error(
        "{file}: {place}: value `{value}` is used but never defined (no node, initializer or graph input produces it)"
    )]
    UndefinedValue { file: String, place: String, value: String },
    #[error("{file}: {place}: value `{value}` is defined more than once")]
    DuplicateDefinition { file: String, place: String, value: String },
    #[error("{file}: {place}: {msg}")]
    Invalid { file: String, place: String, msg: String },
    #[error("{file}: export: {msg}")]
    Export { file: String, msg: String },
}

impl OnnxError {
    pub(crate) fn io(file: impl Into<PathBuf>, source: std::io::Error) -> OnnxError {
        OnnxError::Io { file: file.into().display().to_string(), source }
    }
}
