//! Errors for malformed simulator input.

use thiserror::Error;

/// Why a cluster, a program set or an incremental change was rejected.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SimError {
    #[error("the cluster has no device types")]
    EmptyCluster,
    #[error("device type `{device}`: {what} must not be zero")]
    ZeroCount { device: String, what: &'static str },
    #[error("device type `{device}`: {what} must be positive and finite, got {value}")]
    BadNumber { device: String, what: &'static str, value: f64 },
    #[error("device type `{0}` appears twice in the cluster")]
    DuplicateDevice(String),
    #[error("the cluster has {types} device types but {programs} programs were given")]
    ProgramCount { types: usize, programs: usize },
    #[error("device type `{device}`, op {index} (`{op}`): {what} must be finite and non-negative, got {value}")]
    BadCost { device: String, index: usize, op: String, what: &'static str, value: f64 },
    #[error(
        "device type `{device}` produces {found} weight gradients ({found_bytes} bytes) where `{reference}` produces \
         {expected} ({expected_bytes} bytes): data-parallel replicas must all-reduce the same gradients"
    )]
    MismatchedGradients {
        device: String,
        reference: String,
        found: usize,
        found_bytes: u64,
        expected: usize,
        expected_bytes: u64,
    },
    #[error("no device type with index {0}")]
    NoDevice(usize),
    #[error("device type `{device}` has {len} ops; op index {index} is out of range")]
    NoOp { device: String, index: usize, len: usize },
    #[error(
        "device type `{device}`, op {index} (`{op}`): a change may not alter gradient bytes ({old} -> {new}); \
         rebuild the simulator instead"
    )]
    GradBytesChanged { device: String, index: usize, op: String, old: u64, new: u64 },
    #[error(
        "device type `{device}`, op {index} (`{op}`): a change may not alter the parameter tensors of its \
         gradient ({old} -> {new}); rebuild the simulator instead"
    )]
    GradTensorsChanged { device: String, index: usize, op: String, old: u64, new: u64 },
    #[error("bucket capacity must be positive")]
    ZeroBucketCap,
}
