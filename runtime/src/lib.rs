//! # qsync-runtime — quantized gradient synchronization
//!
//! The last stage of qsync: keeping a hybrid data-parallel cluster in lock
//! step. A [`Communicator`] (MPI on CPUs, NCCL on GPUs) moves bytes and
//! sums f32/f16/bf16; [`GradSync`] runs every synchronization scheme over
//! it — FP16/BF16 compression, qgZ (ZeRO++: int8/int4 block quantization,
//! one-shot or hierarchical), TernGrad/HiPress n-bit packing, with
//! stochastic rounding and error feedback — doing every quantized reduction
//! itself, in f32, with `qsync-kernels`' reference arithmetic, so every rank
//! and every backend computes the same bits. [`bound`] evaluates each
//! scheme's documented error bound; [`bench`] is `qsyncc sync-bench`.
//!
//! Layering: this crate sits above `qsync-kernels` (CPU reference of the
//! quantize / pack / dequantize-accumulate kernels) and knows nothing of the
//! IR, passes, the planner or the simulator.
//!
//! The schemes' element-wise kernels run on a [`KernelEngine`]: the CPU
//! reference, or our PTX kernels on the GPU (`cuda.rs`).
//!
//! Only the backends (`mpi.rs`, `nccl.rs`), the PTX launcher (`cuda.rs`)
//! the allocator setting (`memory.rs`) and the CPU affinity calls
//! (`affinity.rs`) contain `unsafe` (foreign calls); everything else is
//! safe Rust.

#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
pub mod affinity;
pub mod bench;
pub mod bound;
pub mod comm;
#[cfg(feature = "nccl")]
pub mod cuda;
pub mod engine;
pub mod error;
pub mod fault;
pub mod memory;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod scheme;
pub mod shard;
pub mod shard_bench;
pub mod sync;
pub mod testdata;

pub use comm::{ClusterShape, Communicator, Deadline, Done, NodeGroups, NodeMap, Pending, ReduceBuf};
pub use engine::{HostEngine, KernelEngine, Kernels, ThreadedHostEngine};
pub use error::{CommError, SyncError};
pub use scheme::{Gather, Kind, Scheme, SyncConfig};
pub use sync::{GradSync, Phases, WireBytes};
