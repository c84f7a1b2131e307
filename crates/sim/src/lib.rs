//! # qsync-sim — the replayer
//!
//! Simulates one iteration of synchronous data-parallel training on a hybrid
//! cluster where every device type may run its own mixed-precision plan
//! (QSync, IPDPS'24, Sec. IV-B). Its input is plain data: a [`Cluster`]
//! (device types, their node shape, links and local batch) and, per device
//! type, a [`LocalProgram`] (forward ops with forward, input-gradient and
//! weight-gradient times, gradient and saved-activation bytes, and an
//! optimizer step). A cost model fills programs through [`CostSource`]; this
//! crate knows nothing of devices' datasheets or precisions.
//!
//! [`Simulator`] builds each type's local DFG (forward, reverse backward,
//! optimizer; DDP gradient buckets launching all-reduces on a separate
//! communication stream), merges them through the collectives as in QSync
//! eq. (6), and reports iteration time, throughput, per-type compute /
//! communication / idle time and peak memory ([`SimResult`]), plus a Chrome
//! trace. Changing one op's cost re-simulates only the affected suffix of
//! that type's timeline, and the answer is bit-identical to a full run.
//!
//! Output is deterministic: same input, same numbers, same trace bytes.
//!
//! ```
//! use qsync_sim::{Cluster, DeviceType, LocalOp, LocalProgram, OpCost, SimConfig, Simulator};
//!
//! // One linear layer (10 µs forward, 10 + 20 backward, 1 MB of gradient).
//! let program = LocalProgram {
//!     ops: vec![LocalOp::new("fc", OpCost::weighted(10.0, 10.0, 20.0, 1 << 20))],
//!     optimizer_us: 5.0,
//!     optimizer_host_us: 0.0,
//! };
//! let cluster = Cluster::new(vec![
//!     DeviceType::new("v100", 16, 8, 32), // 16 GPUs, 8 to a node, batch 32 each
//!     DeviceType::new("t4", 16, 8, 32),
//! ]);
//! let mut sim = Simulator::new(cluster, vec![program.clone(), program], SimConfig::default())?;
//! let before = sim.result().iteration_us;
//! // The T4s run `fc` three times slower: only their timeline is redone.
//! sim.set_op_cost(1, 0, OpCost::weighted(30.0, 30.0, 60.0, 1 << 20))?;
//! assert!(sim.result().iteration_us > before);
//! let trace = sim.chrome_trace_json(); // open in https://ui.perfetto.dev
//! assert!(trace.contains("traceEvents"));
//! # Ok::<(), qsync_sim::SimError>(())
//! ```

mod cluster;
mod error;
pub mod predict;
mod program;
pub mod shard;
mod sim;
pub mod sync;
pub mod topology;
mod trace;

pub use cluster::{AllReduceAlgo, Cluster, DeviceType, Fabric};
pub use error::SimError;
pub use predict::{
    cluster_of, optimizer_seconds, path_exists, refresh_seconds, sync_paths, GraphAnalysis, PredictError,
    PredictOptions, Predictor, Target,
};
pub use program::{CostSource, LocalOp, LocalProgram, OpCost};
pub use shard::{
    predict_sharded, CollectiveChoices, GatherPrecision, ReducePrecision, ShardSpec, ShardedResult, Stage, Units,
};
pub use sim::{CollectiveResult, DeviceResult, SimConfig, SimResult, Simulator};
pub use sync::{
    PieceKernels, PieceRates, SizeRates, SyncBreakdown, SyncChoice, SyncKernels, SyncPath, SyncScheme, SyncSpec,
};
