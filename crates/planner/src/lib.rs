//! # qsync-planner — QSync's indicator and allocator
//!
//! Given a graph and a hybrid cluster, decide what precision each operator
//! runs in on each device type (QSync, IPDPS'24, Sec. IV-A and V):
//!
//! - [`indicator`]: Ω_o^(b), the variance an operator at precision b adds
//!   (Prop. 2–3, eqs. 3–5), from initializers and an optional calibration file;
//! - [`allocator`]: UP, DBS, QSync's greedy and our allocator (fastest start
//!   under memory over classes of repeated operators, then max-heap recovery),
//!   all evaluated by the predictor of `qsync-sim`;
//! - [`joint`]: each device type's local batch and precisions searched
//!   together, under QSync's objective (smallest indicator at a throughput
//!   floor) or the fastest plan within an indicator bound;
//! - [`shard`]: the FSDP baselines and the sharded search (stage, hpZ,
//!   checkpointing, batch split) for models DDP cannot hold, or trains slower.
//!
//! Reads the IR, the cost model and the predictor; knows nothing of files
//! or the CLI.

pub mod allocator;
mod context;
pub mod indicator;
pub mod joint;
mod par;
mod recovery;
pub mod shard;
mod types;

pub use allocator::{
    allocate, candidates, classes, AllocOptions, DbsEval, Eval, Gap, Method, Objective, Outcome, PlanError, TMin,
    TrainPrecision, TypeEval,
};
pub use indicator::{Calibration, CallStats, Indicator, OpStats, Source, Sources, TensorStats};
pub use shard::{ShardOutcome, ShardedEval};
