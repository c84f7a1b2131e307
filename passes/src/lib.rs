//! # qsync-passes — the pass manager and graph passes
//!
//! A [`Pass`] rewrites a [`Model`] in place and says what it changed. The
//! [`PassManager`] runs a named pipeline (`infer-shapes,fold-constants,dce`),
//! re-verifies the graph after every pass when asked (always in tests and
//! debug builds), times each pass, and stops at the first failure with an
//! error naming the pass and the node.
//!
//! Passes here know the IR and nothing above it: no ONNX protobufs, no
//! devices, no files.

pub mod dce;
pub mod egraph;
pub mod fold;
pub mod manager;
pub mod precision;
pub mod registry;

pub use manager::{Pass, PassContext, PassError, PassManager, PassOutcome, PassReport, PassRun};
pub use registry::{available_passes, parse_entry, pass_by_name, pass_with_args, pipeline_from_spec, PassArgs};
