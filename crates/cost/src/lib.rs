//! # qsync-cost — how fast, how much memory
//!
//! The cost model every planning pass and the simulator query, thousands of
//! times per plan (QSync's predictor minus the indicator, Sec. IV-B; Campo's
//! cast model, eq. 1):
//!
//! - [`DeviceDb`]: the device database, one JSON file per GPU under
//!   `crates/cost/devices/` compiled in, extensible with
//!   [`DeviceDb::load_file`]; every figure cites its datasheet;
//! - [`Precision`]: compute precisions and their mapping to [`qsync_ir::DType`];
//! - [`GraphFacts`]: per-node shape facts, built once per graph and
//!   [`Bindings`] (symbolic dims must all be bound);
//! - [`CostModel`]: roofline operator costs (forward, input gradient,
//!   weight gradient) with Tensor Core eligibility and QSync's INT8 rules,
//!   plus cast costs ([`CastModel`]);
//! - [`Profile`]: the calibration format (measured ops, cast samples) that
//!   overrides the analytic model, with least-squares fits ([`fit_linear`]);
//! - [`Plan`] and [`estimate_memory`]: per-device training memory;
//! - [`calibrate`]: the worklist of distinct operators a GPU measures, and
//!   the calibration profile (measured ops, fitted rates) built from the
//!   measurements.
//!
//! ```
//! use qsync_cost::{DeviceDb, Precision};
//! let db = DeviceDb::bundled().unwrap();
//! let t4 = db.get("t4").unwrap();
//! assert_eq!(t4.arch, "sm_75");
//! assert!(t4.tensor_peak(Precision::Int8) > t4.tensor_peak(Precision::Fp16));
//! ```
//!
//! Calibration profile format: see [`profile`]; an example lives in
//! `crates/cost/examples/t4_profile.json`.
//!
//! This crate reads the IR and knows nothing of ONNX, passes or the simulator.

pub mod calibrate;
pub mod cast;
pub mod device;
pub mod error;
pub mod facts;
pub mod memory;
pub mod model;
pub mod plan;
pub mod precision;
pub mod profile;

pub use cast::{fit_linear, CastModel, LinearFit, LinearModel};
pub use device::{Device, DeviceDb, Efficiency, IntraNode, LinkKind, Occupancy};
pub use error::{CostError, Result};
pub use facts::{Bindings, GraphFacts, Kind, NodeFacts, Work};
pub use memory::{estimate_memory, MemoryBreakdown, MemoryTracker, Optimizer, SharedBytes};
pub use model::{CostModel, OpCost, HOST_OP_S};
pub use plan::{is_precision_dependent, Plan, ResolvedPlan};
pub use precision::Precision;
pub use profile::{
    BatchCurve, BatchPoint, CastFit, CastSamples, Measured, OpSample, OptimizerSamples, Profile, ProfileEfficiency,
    SizeCurve,
};
