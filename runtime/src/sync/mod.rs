//! [`GradSync`]: gradient synchronization written once over
//! [`Communicator`], for every scheme of [`crate::scheme`].
//!
//! `all_reduce_mean` leaves the mean of every rank's gradient on every rank;
//! qgZ also offers `reduce_scatter_mean` (each rank its own shard). The
//! schemes and their error bounds are documented in their modules
//! ([`half`], [`qgz`], [`nbit`]); [`crate::bound`] evaluates those bounds.
//!
//! Guarantees:
//! - every quantized reduction is done here in f32 with the kernels'
//!   arithmetic (on the [`KernelEngine`] `cfg.kernels` names: the CPU
//!   reference, or our PTX on the GPU, bit for bit the same), in a fixed
//!   order (rank order), so all ranks end
//!   with bitwise-identical gradients, and a run is reproducible: the same
//!   inputs, seed and step give the same bytes;
//! - stochastic rounding draws from `hash(seed, step, stage, rank, shard)`,
//!   so ranks, stages and steps use independent streams;
//! - a NaN or infinity in any rank's gradient is non-finite in every rank's
//!   result (at element granularity for fp32/fp16/bf16, quantization group
//!   for qgZ, the whole tensor for n-bit), so overflow checks still fire;
//! - with error feedback, every quantization site (a rank's first stage,
//!   a node partial's requantization, a shard's requantization before the
//!   all-gather) keeps its residual and adds it to the next step's input, so
//!   the sum of outputs over `T` steps is `T ×` the exact mean plus one
//!   step's error, instead of `T ×` a step's error. Residuals reset when
//!   the gradient length changes;
//! - wire bytes are counted as bytes this rank receives from others, split
//!   into intra- and inter-node by the node map (`SyncConfig::node_of`, or
//!   `nodes` equal nodes).

pub mod block;
pub mod half;
pub mod nbit;
mod pipeline;
pub mod qgz;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use qsync_kernels::rng;

use crate::comm::{Communicator, Deadline, NodeGroups, NodeMap, ReduceBuf};
use crate::engine::{DecodeError, HostEngine, KernelEngine, Kernels, ThreadedHostEngine};
use crate::error::{CommError, SyncError};
use crate::scheme::{Kind, SyncConfig};

/// Bytes this rank received from other ranks, by hop.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct WireBytes {
    pub intra_node: u64,
    pub inter_node: u64,
}

impl WireBytes {
    pub fn total(&self) -> u64 {
        self.intra_node + self.inter_node
    }
}

/// Where one rank's synchronization time went, in seconds accumulated
/// since [`GradSync::reset_phases`] (or creation).
///
/// - `quantize_s`: scaling, casting to 16 bits, block quantization, n-bit
///   packing, error-feedback residuals — everything that makes the payload;
/// - `exchange_s`: inside communicator calls that move data (a blocking
///   collective counts whole, waiting for slow peers included; for a
///   non-blocking exchange, starting it and driving it between kernels);
/// - `wait_s`: blocked on a started exchange with no kernel left to run;
/// - `dequantize_s`: widening, dequantize-accumulate, unpacking, the sums
///   and the division by the world size — everything that reads payloads.
///
/// What the four leave out (allocation, copies between them) is the
/// caller's total minus their sum.
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize)]
pub struct Phases {
    pub quantize_s: f64,
    pub exchange_s: f64,
    pub wait_s: f64,
    pub dequantize_s: f64,
}

/// One of [`Phases`]' buckets.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Quantize,
    Exchange,
    Wait,
    Dequantize,
}

impl Phases {
    pub fn sum(&self) -> f64 {
        self.quantize_s + self.exchange_s + self.wait_s + self.dequantize_s
    }

    /// Every field multiplied by `k` (e.g. `1/iterations` for a mean).
    pub fn scaled(&self, k: f64) -> Phases {
        Phases {
            quantize_s: self.quantize_s * k,
            exchange_s: self.exchange_s * k,
            wait_s: self.wait_s * k,
            dequantize_s: self.dequantize_s * k,
        }
    }

    /// The fields in order, for gathering across ranks.
    pub fn to_array(&self) -> [f64; 4] {
        [self.quantize_s, self.exchange_s, self.wait_s, self.dequantize_s]
    }

    pub fn from_array(a: [f64; 4]) -> Phases {
        Phases { quantize_s: a[0], exchange_s: a[1], wait_s: a[2], dequantize_s: a[3] }
    }

    pub(crate) fn add(&mut self, phase: Phase, since: Instant) {
        let dt = since.elapsed().as_secs_f64();
        match phase {
            Phase::Quantize => self.quantize_s += dt,
            Phase::Exchange => self.exchange_s += dt,
            Phase::Wait => self.wait_s += dt,
            Phase::Dequantize => self.dequantize_s += dt,
        }
    }
}

/// Which group a collective ran on, for classifying its bytes by hop.
#[derive(Copy, Clone, Debug)]
enum Hop {
    World,
    Intra,
    Inter,
}

/// The world communicator, borrowed or owned.
#[derive(Debug)]
enum World<'c> {
    Borrowed(&'c dyn Communicator),
    Owned(Box<dyn Communicator>),
}

/// Gradient synchronization state for one communicator and scheme.
#[derive(Debug)]
pub struct GradSync<'c> {
    world: World<'c>,
    groups: Option<NodeGroups>,
    nodes: NodeMap,
    cfg: SyncConfig,
    step: u64,
    residuals: BTreeMap<&'static str, Vec<f32>>,
    wire: WireBytes,
    /// Where the element-wise kernels run (`cfg.kernels`).
    engine: Arc<dyn KernelEngine>,
    phases: Phases,
}

/// The nodes `cfg` describes for a world of `world` ranks: its explicit
/// map, else `cfg.nodes` equal node-major nodes.
pub fn node_map(cfg: &SyncConfig, world: usize) -> Result<NodeMap, SyncError> {
    match &cfg.node_of {
        None => NodeMap::even(world, cfg.nodes),
        Some(map) => {
            let m = NodeMap::new(map.clone())?;
            if m.world() != world {
                return Err(SyncError::BadShape(format!("a node map of {} ranks for {world} ranks", m.world())));
            }
            if cfg.nodes != 1 && cfg.nodes != m.nodes() {
                return Err(SyncError::BadShape(format!(
                    "{} nodes requested, the node map has {}",
                    cfg.nodes,
                    m.nodes()
                )));
            }
            Ok(m)
        }
    }
}

/// The engine `kernels` asks for on `world`: the CPU kernels (on threads
/// of their own for a GPU rank's buckets, whose host cores are free while
/// the GPU computes; `local_ranks` share them), or our PTX on the GPU of an
/// NCCL communicator (`$QSYNC_PTX_DIR`).
fn engine_for(
    kernels: Kernels,
    world: &dyn Communicator,
    local_ranks: usize,
) -> Result<Arc<dyn KernelEngine>, SyncError> {
    match kernels {
        Kernels::Host if world.cuda_device().is_some() => Ok(Arc::new(ThreadedHostEngine::for_gpu_rank(local_ranks))),
        Kernels::Host => Ok(Arc::new(HostEngine)),
        Kernels::Device => {
            let Some(ordinal) = world.cuda_device() else {
                return Err(SyncError::Comm(CommError::Unsupported {
                    backend: world.backend(),
                    what: "device kernels (they run on the GPU of an NCCL communicator)".into(),
                }));
            };
            #[cfg(feature = "nccl")]
            {
                Ok(Arc::new(crate::cuda::CudaEngine::from_env(ordinal)?))
            }
            #[cfg(not(feature = "nccl"))]
            {
                Err(SyncError::Comm(CommError::Unsupported {
                    backend: world.backend(),
                    what: format!("device kernels on GPU {ordinal}: built without the `nccl` feature"),
                }))
            }
        }
    }
}

impl<'c> GradSync<'c> {
    /// Prepares `cfg` on `world`: checks the shape and, for hierarchical
    /// schemes, splits the node groups (collective over `world`).
    pub fn new(world: &'c dyn Communicator, cfg: SyncConfig) -> Result<Self, SyncError> {
        let nodes = node_map(&cfg, world.size())?;
        if cfg.group == 0 {
            return Err(SyncError::BadScheme("quantization group size must be positive".into()));
        }
        let groups = if cfg.scheme.is_hierarchical() {
            Some(NodeGroups::split_map(world, &nodes, Deadline::after(cfg.timeout))?)
        } else {
            None
        };
        let local_ranks = nodes.members(nodes.node_of(world.rank())).len();
        let engine = engine_for(cfg.kernels, world, local_ranks)?;
        Ok(GradSync {
            world: World::Borrowed(world),
            groups,
            nodes,
            cfg,
            step: 0,
            residuals: BTreeMap::new(),
            wire: WireBytes::default(),
            engine,
            phases: Phases::default(),
        })
    }

    /// Runs the element-wise kernels on `engine` instead of the one
    /// `cfg.kernels` chose (a caller's own engine: results must match the
    /// reference bit for bit for the ranks to agree).
    pub fn with_engine(mut self, engine: Arc<dyn KernelEngine>) -> Self {
        self.engine = engine;
        self
    }

    /// The engine the kernels run on (`"host"`, `"cuda"`).
    pub fn engine(&self) -> &dyn KernelEngine {
        self.engine.as_ref()
    }

    /// [`GradSync::new`] owning its communicator, for callers that keep the
    /// synchronization state beyond any borrow (the Python bindings keep
    /// one per DDP bucket).
    pub fn owning(world: Box<dyn Communicator>, cfg: SyncConfig) -> Result<GradSync<'static>, SyncError> {
        let GradSync { groups, nodes, cfg, step, residuals, wire, engine, phases, .. } =
            GradSync::new(world.as_ref(), cfg)?;
        Ok(GradSync { world: World::Owned(world), groups, nodes, cfg, step, residuals, wire, engine, phases })
    }

    /// The communicator every rank of the job is in.
    pub fn world(&self) -> &dyn Communicator {
        match &self.world {
            World::Borrowed(w) => *w,
            World::Owned(w) => w.as_ref(),
        }
    }

    pub fn config(&self) -> &SyncConfig {
        &self.cfg
    }

    /// The node of every rank.
    pub fn node_map(&self) -> &NodeMap {
        &self.nodes
    }

    /// Bytes received from other ranks since creation.
    pub fn wire_bytes(&self) -> WireBytes {
        self.wire
    }

    /// Time per phase since creation or the last [`GradSync::reset_phases`].
    pub fn phases(&self) -> Phases {
        self.phases
    }

    pub fn reset_phases(&mut self) {
        self.phases = Phases::default();
    }

    /// Adds the time since `since` to `phase`.
    pub(crate) fn charge(&mut self, phase: Phase, since: Instant) {
        self.phases.add(phase, since);
    }

    /// Replaces `grad` by the mean over all ranks. Every rank must call it
    /// with the same length.
    pub fn all_reduce_mean(&mut self, grad: &mut [f32]) -> Result<(), SyncError> {
        let p = self.world().size();
        match self.cfg.scheme.kind {
            Kind::Fp32 => {
                let t = Instant::now();
                self.world().all_reduce_sum(ReduceBuf::F32(grad), self.deadline())?;
                self.charge(Phase::Exchange, t);
                // The engine's ring moves 2·(P−1)/P of the buffer per rank.
                let moved = 2 * 4 * grad.len() as u64 * (p as u64 - 1) / p as u64;
                self.count_model(moved);
                let t = Instant::now();
                let pf = p as f32;
                grad.iter_mut().for_each(|v| *v /= pf);
                self.charge(Phase::Dequantize, t);
            }
            // The pipeline advances the step itself.
            Kind::Half(h) => return self.pipelined_all_reduce(grad, pipeline::Codec::Half(h)),
            Kind::Qgz { intra, inter: None } => {
                let codec = self.one_shot_codec(intra);
                return self.pipelined_all_reduce(grad, codec);
            }
            Kind::Qgz { .. } => {
                let mean = self.reduce_scatter_mean(grad)?;
                self.gather_shards(&mean, grad)?;
                // reduce_scatter_mean already advanced the step.
                return Ok(());
            }
            Kind::NBit(bits) => self.nbit_all_reduce(grad, bits)?,
        }
        self.step += 1;
        Ok(())
    }

    /// Bytes from `peer` that did not decode: a payload error naming both
    /// ranks, or the engine's failure.
    fn decode_error(&self, peer: usize, e: DecodeError) -> SyncError {
        match e {
            DecodeError::Malformed(detail) => SyncError::BadPayload { rank: self.world().rank(), peer, detail },
            DecodeError::Engine(e) => SyncError::Comm(e),
        }
    }

    fn deadline(&self) -> Deadline {
        Deadline::after(self.cfg.timeout)
    }

    fn comm(&self, hop: Hop) -> &dyn Communicator {
        match (&self.groups, hop) {
            (Some(g), Hop::Intra) => g.intra.as_ref(),
            (Some(NodeGroups { inter: Some(inter), .. }), Hop::Inter) => inter.as_ref(),
            _ => self.world(),
        }
    }

    /// Counts the bytes received in one collective on `hop` (`recv[j]` from
    /// group rank `j`).
    fn count(&mut self, hop: Hop, recv: &[usize]) {
        let me = self.comm(hop).rank();
        let world_rank = self.world().rank();
        for (j, &c) in recv.iter().enumerate() {
            if j == me {
                continue;
            }
            let c = c as u64;
            let same_node = match hop {
                Hop::Intra => true,
                Hop::Inter => false,
                Hop::World => self.nodes.node_of(j) == self.nodes.node_of(world_rank),
            };
            if same_node {
                self.wire.intra_node += c;
            } else {
                self.wire.inter_node += c;
            }
        }
    }

    /// Counts an engine-internal collective by its traffic model (split by
    /// the share of peers on other nodes).
    fn count_model(&mut self, bytes: u64) {
        let p = self.nodes.world() as u64;
        let here = self.nodes.node_of(self.world().rank());
        let remote = p - self.nodes.members(here).len() as u64;
        let inter = if p > 1 { bytes * remote / (p - 1) } else { 0 };
        self.wire.inter_node += inter;
        self.wire.intra_node += bytes - inter;
    }

    /// The stochastic-rounding seed of one quantization site.
    fn seed(&self, stage: u64, shard: usize) -> u64 {
        let site = (stage << 56) ^ ((self.world().rank() as u64) << 28) ^ shard as u64;
        rng::hash(rng::hash(self.cfg.seed, self.step), site)
    }

    /// `x + residual[stage]` when error feedback is on (the residual is
    /// created, or reset, at `x`'s length); `x` itself otherwise.
    fn with_residual<'x>(&mut self, stage: &'static str, x: &'x [f32]) -> Cow<'x, [f32]> {
        if !self.cfg.scheme.error_feedback {
            return Cow::Borrowed(x);
        }
        let r = self.residuals.entry(stage).or_default();
        if r.len() != x.len() {
            *r = vec![0.0; x.len()];
        }
        let mut v = x.to_vec();
        v.iter_mut().zip(r.iter()).for_each(|(a, b)| *a += b);
        Cow::Owned(v)
    }

    /// The residual buffer of `stage`, when error feedback is on.
    fn residual_mut(&mut self, stage: &'static str) -> Option<&mut Vec<f32>> {
        if self.cfg.scheme.error_feedback {
            self.residuals.get_mut(stage)
        } else {
            None
        }
    }
}

/// Raw little-endian bytes of f32 values (what travels for an f32 buffer).
pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; 4 * x.len()];
    for (o, v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// f32 values from their little-endian bytes (a trailing partial value is ignored).
pub fn f32_from_bytes(b: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; b.len() / 4];
    for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    out
}

/// Raw little-endian bytes of 16-bit values.
pub fn u16_bytes(x: &[u16]) -> Vec<u8> {
    let mut out = vec![0u8; 2 * x.len()];
    for (o, v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// 16-bit values from their little-endian bytes.
pub fn u16_from_bytes(b: &[u8]) -> Vec<u16> {
    let mut out = vec![0u16; b.len() / 2];
    for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
        *o = u16::from_le_bytes([c[0], c[1]]);
    }
    out
}
