//! Errors of the cost model. Every error names what it is about: the device
//! file and field, the node, the symbol, the precision.

use std::path::PathBuf;

use crate::Precision;

/// Everything the cost model can refuse.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    #[error("device file `{file}`: {message}")]
    DeviceParse { file: String, message: String },
    #[error("device file `{file}`: field `{field}`: {message}")]
    DeviceField { file: String, field: String, message: String },
    #[error("cannot read `{path}`: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("unknown device `{name}` (known: {known})")]
    UnknownDevice { name: String, known: String },
    #[error("unknown precision `{0}` (expected one of fp32, tf32, fp16, bf16, int8, fp8e4m3, fp8e5m2; also spelt f32, f16, i8, f8e4m3 / fp8, f8e5m2)")]
    UnknownPrecision(String),
    #[error("device `{device}` does not support precision {precision}")]
    UnsupportedPrecision { device: String, precision: Precision },
    #[error("node `{node}`: value `{value}` has dimension `{dim}` with unbound symbol(s) {symbols}")]
    UnboundSymbol { node: String, value: String, dim: String, symbols: String },
    #[error("node `{node}`: value `{value}` has no known shape (run infer-shapes first)")]
    UnknownShape { node: String, value: String },
    #[error("node `{node}` ({op}): {message}")]
    BadNode { node: String, op: String, message: String },
    #[error("node id {0} is not in the graph the facts were built from")]
    NoSuchNode(usize),
    #[error("profile `{file}`: {message}")]
    Profile { file: String, message: String },
    #[error("cannot fit a linear model: {0}")]
    Fit(String),
}

/// Result alias of this crate.
pub type Result<T, E = CostError> = std::result::Result<T, E>;
