//! Sharded collectives for ZeRO-3 / FSDP with ZeRO++'s three techniques,
//! written once over [`Communicator`] (so MPI and NCCL both run them):
//!
//! - **qwZ all-gather** ([`ShardComm::all_gather`] with
//!   [`GatherCodec::Qwz`]): every rank holds one shard of a weight tensor
//!   (f32, or fp16/bf16 bit patterns), of any length (`counts[r]` elements
//!   on rank `r`, zero allowed). It block-quantizes its shard to int8
//!   (symmetric, one f32 scale per group of `G` values from the shard's
//!   first element, round-to-nearest: [`Quantizer`], run by the
//!   [`KernelEngine`]), the blocks are all-gathered (`all_gather_v`) and
//!   every rank dequantizes every block, its own included, into the full
//!   tensor — at the input's type (16-bit outputs round the dequantized f32
//!   once, to nearest even). Bytes per rank: `Σ_{j≠r} (m_j + 4·⌈m_j/G⌉)`
//!   against fp16's `Σ_{j≠r} 2·m_j`: a fraction `1/2 + 2/G` (G = 512:
//!   0.504).
//! - **hpZ** ([`ShardComm::hpz_secondary`], [`ShardComm::hpz_all_gather`]):
//!   a secondary copy of the weights sharded inside each node. Primary shard
//!   `s` (world rank `s`'s) is held, on node `m` of `L_m` ranks, by the rank
//!   whose local index is `local(s) mod L_m` ([`NodeMap::handler`]); a
//!   rank's secondary shard is the primary shards it handles, in
//!   `(node(s), s)` order. Building it is one exchange across nodes, once
//!   per step: with equal nodes an all-gather over the ranks of one local
//!   index (one per node), otherwise an all-to-all over the world in which
//!   each owner sends its shard to its handler on every node (exact bytes,
//!   at the input's type). The backward's all-gather then runs over the
//!   intra-node group alone (split by node from the explicit rank → node
//!   map, never by division), raw or qwZ-quantized per primary shard —
//!   quantized, its blocks are the very blocks the world qwZ all-gather
//!   moves, so both give the same bits on every rank of every node.
//! - **qgZ reduce-scatter** ([`ShardComm::reduce_scatter`]): each rank
//!   gets its own reduced shard (`counts[r]` elements of the sum or mean),
//!   not the whole tensor. One-shot: each shard's slice is quantized (int8
//!   or int4 blocks, groups from the shard's start) and sent to its owner
//!   (`all_to_all_v`), which dequantizes and sums the `P` blocks in f32 in
//!   rank order. Hierarchical (`inter: Some(b)`): the intra-node
//!   all-to-all sends each local peer the blocks of the shards it handles;
//!   the handler sums its node's blocks (node partials, f32), requantizes
//!   them at the inter-node width and sends each to the shard's owner (over
//!   the group of its local index with equal nodes, else over the world),
//!   which sums the `N` node partials in node order — as
//!   [`crate::sync::qgz`] does for the all-reduce. Bytes per rank, int4,
//!   one-shot: `(P−1)·(m_r/2 + 4·⌈m_r/G⌉)` against fp32's `(P−1)·4·m_r`:
//!   `1/8 + 1/G` (G = 512: 0.127).
//!
//! **Error bounds** (per element; `ε` = 2^-24; `q_b(s) = s·(1/2 + 2^-10)`
//! is one round-to-nearest quantization's error with scale `s`, the 2^-10
//! covering the f32 evaluation of the scale, of `x·(1/s)` and of the
//! dequantized product; `qmax` = 127 for int8, 7 for int4; `A` = absmax of
//! the element's group, groups of `G` from its shard's start):
//!
//! ```text
//! qwZ, f32 out:        E_w = q(A/127) + 2·ε·(A + A/127)
//! qwZ, 16-bit out:     E_w + u·(|x| + E_w) + η      (fp16: u = 2^-11, η = 2^-25,
//!                                                    unbounded once |x| + E_w ≥ 65504;
//!                                                    bf16: u = 2^-8, η = 2^-134)
//! raw all-gather, hpZ raw, secondary build: 0 (the bytes themselves)
//! hpZ quantized:       as qwZ (the same blocks)
//! reduce-scatter, f32: sum  E = (P+1)·ε·Σ_r |x_r|
//! qgZ one-shot:        sum  E = Σ_r q(A_r/qmax) + (P+1)·ε·Σ_r (A_r + A_r/qmax)
//! qgZ hierarchical:    E1_m = Σ_{r∈m} q(A_r/qmax) + (L_m+1)·ε·Σ_{r∈m} (A_r + A_r/qmax)
//!                      B_m  = absmax_g(exact node partial) + max_g E1_m
//!                      sum  E = Σ_m (E1_m + q(B_m/qmax')) + (N+1)·ε·Σ_m (B_m + B_m/qmax')
//! mean:                E/P + |mean|·ε
//! ```
//!
//! ([`reduce_scatter_reference`] and [`all_gather_bound`] evaluate them in
//! f64 from the inputs alone.)
//!
//! **Agreement and non-finite values.** Every rank decodes the same bytes
//! in the same order with the same kernels, so all-gathered tensors are
//! bitwise identical on every rank (and across MPI and NCCL). A group
//! holding a NaN or an infinity travels with a NaN scale: after a quantized
//! all-gather the whole group is NaN on every rank; after a quantized
//! reduce-scatter the owner's group is NaN; raw and f32 paths propagate the
//! value itself.
//!
//! **Failures.** Every call takes the configured deadline; a dead or
//! stalled peer is a [`ShardError::Comm`] naming the operation (`qwZ
//! all-gather`, `hpZ secondary build`, …) and the communicator call inside
//! it, never a hang.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use qsync_kernels::{Half, QBits, Rounding};

use crate::comm::{displacements, Communicator, Deadline, NodeGroups, NodeMap};
use crate::engine::{DecodeError, HostEngine, KernelEngine, Kernels};
use crate::error::{CommError, SyncError};
use crate::sync::block::Quantizer;
use crate::sync::WireBytes;

const EPS: f64 = 1.0 / 16_777_216.0; // 2^-24

/// A sharded collective's failure, naming the operation.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The communicator failed inside `op` (a dead or stalled peer: the
    /// source names the call and the deadline).
    #[error("{op}: {error}")]
    Comm { op: &'static str, error: CommError },
    /// Node groups or the rank → node map did not fit the world.
    #[error("{op}: {error}")]
    Setup { op: &'static str, error: SyncError },
    /// The caller's shard sizes or buffers do not fit.
    #[error("{op}: invalid arguments: {detail}")]
    Invalid { op: &'static str, detail: String },
    /// Received bytes did not decode.
    #[error("{op}: rank {rank}: malformed payload from rank {peer}: {detail}")]
    BadPayload { op: &'static str, rank: usize, peer: usize, detail: String },
}

/// Settings of a [`ShardComm`].
#[derive(Clone, Debug)]
pub struct ShardConfig {
    /// Elements per quantization group (one f32 scale each).
    pub group: usize,
    /// Deadline of every communicator call.
    pub timeout: Duration,
    /// Where the quantization kernels run.
    pub kernels: Kernels,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig { group: 512, timeout: Duration::from_secs(60), kernels: Kernels::Host }
    }
}

/// A weight tensor's element type.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }

    fn half(self) -> Option<Half> {
        match self {
            Dtype::F32 => None,
            Dtype::F16 => Some(Half::F16),
            Dtype::BF16 => Some(Half::BF16),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "fp16",
            Dtype::BF16 => "bf16",
        }
    }
}

/// Weights (a shard, or a gathered tensor): f32, or 16-bit bit patterns.
#[derive(Clone, Debug, PartialEq)]
pub enum Weights {
    F32(Vec<f32>),
    F16(Vec<u16>),
    BF16(Vec<u16>),
}

impl Weights {
    pub fn dtype(&self) -> Dtype {
        match self {
            Weights::F32(_) => Dtype::F32,
            Weights::F16(_) => Dtype::F16,
            Weights::BF16(_) => Dtype::BF16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Weights::F32(v) => v.len(),
            Weights::F16(v) | Weights::BF16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `values` rounded to `dtype` (nearest even; exact for f32).
    pub fn from_f32(dtype: Dtype, values: &[f32]) -> Weights {
        match dtype.half() {
            None => Weights::F32(values.to_vec()),
            Some(h) => {
                let bits = qsync_kernels::cpu::cast_to(h, values);
                if h == Half::F16 {
                    Weights::F16(bits)
                } else {
                    Weights::BF16(bits)
                }
            }
        }
    }

    /// The values as f32 (exact).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Weights::F32(v) => v.clone(),
            Weights::F16(v) => qsync_kernels::cpu::cast_from(Half::F16, v),
            Weights::BF16(v) => qsync_kernels::cpu::cast_from(Half::BF16, v),
        }
    }

    /// Little-endian bytes (what a raw all-gather moves).
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            Weights::F32(v) => crate::sync::f32_bytes(v),
            Weights::F16(v) | Weights::BF16(v) => crate::sync::u16_bytes(v),
        }
    }

    /// Weights of `dtype` from little-endian bytes.
    pub fn from_bytes(dtype: Dtype, b: &[u8]) -> Weights {
        match dtype {
            Dtype::F32 => Weights::F32(crate::sync::f32_from_bytes(b)),
            Dtype::F16 => Weights::F16(crate::sync::u16_from_bytes(b)),
            Dtype::BF16 => Weights::BF16(crate::sync::u16_from_bytes(b)),
        }
    }

    /// A digest of the bit patterns (for bitwise comparisons across ranks).
    pub fn digest(&self) -> u64 {
        self.to_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    }
}

/// What an all-gather moves.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GatherCodec {
    /// The elements' own bytes (exact).
    Raw,
    /// qwZ: int8 blocks with one f32 scale per group.
    Qwz,
}

/// What a reduce-scatter moves.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ScatterCodec {
    /// f32 slices, summed in f32 in rank order.
    F32,
    /// qgZ blocks at `bits`; `inter: Some(b)` is the hierarchical form with
    /// inter-node width `b`.
    Qgz { bits: QBits, inter: Option<QBits> },
}

/// The reduction a reduce-scatter applies.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the world size.
    Mean,
}

/// A rank's hpZ secondary shard: the primary shards it handles on its node,
/// at their type, in `(node(s), s)` order.
#[derive(Clone, Debug, PartialEq)]
pub struct Secondary {
    pub dtype: Dtype,
    /// Every world rank's primary shard length (elements).
    pub counts: Vec<usize>,
    /// The primary shards held, in order.
    pub shards: Vec<usize>,
    /// Their bytes, laid end to end.
    pub bytes: Vec<u8>,
}

/// Which group a collective runs on (for counting its bytes by hop).
#[derive(Copy, Clone, Debug)]
enum Hop {
    World,
    Intra,
    Inter,
}

/// Sharded collectives over one world communicator and rank → node map.
#[derive(Debug)]
pub struct ShardComm<'c> {
    world: &'c dyn Communicator,
    map: NodeMap,
    groups: NodeGroups,
    cfg: ShardConfig,
    engine: Arc<dyn KernelEngine>,
    wire: WireBytes,
}

/// The element ranges of shards of the given lengths laid end to end.
pub fn ranges(counts: &[usize]) -> Vec<Range<usize>> {
    displacements(counts).into_iter().zip(counts).map(|(d, &c)| d..d + c).collect()
}

/// World shards handled by local rank `j` of `node`, in `(node(s), s)` order.
pub fn handled(map: &NodeMap, node: usize, j: usize) -> Vec<usize> {
    let l = map.members(node).len();
    let mut s: Vec<usize> = (0..map.world()).filter(|&s| map.local_of(s) % l == j).collect();
    s.sort_by_key(|&s| (map.node_of(s), s));
    s
}

fn engine_for(kernels: Kernels, world: &dyn Communicator) -> Result<Arc<dyn KernelEngine>, CommError> {
    match kernels {
        Kernels::Host => Ok(Arc::new(HostEngine)),
        Kernels::Device => {
            let Some(ordinal) = world.cuda_device() else {
                return Err(CommError::Unsupported {
                    backend: world.backend(),
                    what: "device kernels (they run on the GPU of an NCCL communicator)".into(),
                });
            };
            #[cfg(feature = "nccl")]
            {
                Ok(Arc::new(crate::cuda::CudaEngine::from_env(ordinal)?))
            }
            #[cfg(not(feature = "nccl"))]
            {
                Err(CommError::Unsupported {
                    backend: world.backend(),
                    what: format!("device kernels on GPU {ordinal}: built without the `nccl` feature"),
                })
            }
        }
    }
}

impl<'c> ShardComm<'c> {
    /// Splits `world` by `map` into intra-node groups (and, with equal
    /// nodes, one group per local index). Collective over `world`.
    pub fn new(world: &'c dyn Communicator, map: NodeMap, cfg: ShardConfig) -> Result<Self, ShardError> {
        const OP: &str = "sharded collectives setup";
        if cfg.group == 0 {
            return Err(ShardError::Invalid { op: OP, detail: "quantization group size must be positive".into() });
        }
        let engine = engine_for(cfg.kernels, world).map_err(|error| ShardError::Comm { op: OP, error })?;
        let groups = NodeGroups::split_map(world, &map, Deadline::after(cfg.timeout))
            .map_err(|error| ShardError::Setup { op: "split into node groups", error })?;
        Ok(ShardComm { world, map, groups, cfg, engine, wire: WireBytes::default() })
    }

    /// Runs the kernels on `engine` (it must equal the reference bit for bit).
    pub fn with_engine(mut self, engine: Arc<dyn KernelEngine>) -> Self {
        self.engine = engine;
        self
    }

    pub fn node_map(&self) -> &NodeMap {
        &self.map
    }

    /// Bytes received from other ranks since creation or [`ShardComm::reset_wire`].
    pub fn wire_bytes(&self) -> WireBytes {
        self.wire
    }

    pub fn reset_wire(&mut self) {
        self.wire = WireBytes::default();
    }

    fn deadline(&self) -> Deadline {
        Deadline::after(self.cfg.timeout)
    }

    fn quantizer(&self, bits: QBits) -> Quantizer {
        Quantizer { bits, group: self.cfg.group, rounding: Rounding::Nearest }
    }

    fn comm(&self, hop: Hop) -> &dyn Communicator {
        match hop {
            Hop::World => self.world,
            Hop::Intra => self.groups.intra.as_ref(),
            Hop::Inter => self.groups.inter.as_deref().unwrap_or(self.world),
        }
    }

    /// Counts `recv[j]` bytes from group rank `j` of `hop` (self excluded).
    fn count(&mut self, hop: Hop, recv: &[usize]) {
        let me = self.comm(hop).rank();
        let here = self.map.node_of(self.world.rank());
        for (j, &c) in recv.iter().enumerate() {
            if j == me {
                continue;
            }
            let intra = match hop {
                Hop::Intra => true,
                Hop::Inter => false,
                Hop::World => self.map.node_of(j) == here,
            };
            if intra {
                self.wire.intra_node += c as u64;
            } else {
                self.wire.inter_node += c as u64;
            }
        }
    }

    fn check_counts(&self, op: &'static str, counts: &[usize], mine: usize) -> Result<(), ShardError> {
        let p = self.world.size();
        if counts.len() != p {
            return Err(ShardError::Invalid { op, detail: format!("{} shard sizes for {p} ranks", counts.len()) });
        }
        if counts[self.world.rank()] != mine {
            return Err(ShardError::Invalid {
                op,
                detail: format!(
                    "rank {} holds {mine} elements, the sizes say {}",
                    self.world.rank(),
                    counts[self.world.rank()]
                ),
            });
        }
        Ok(())
    }

    fn payload(&self, op: &'static str, peer: usize, e: DecodeError) -> ShardError {
        match e {
            DecodeError::Malformed(detail) => ShardError::BadPayload { op, rank: self.world.rank(), peer, detail },
            DecodeError::Engine(source) => ShardError::Comm { op, error: source },
        }
    }

    /// The qwZ block of `values` (int8, groups from the first element).
    fn encode(&self, op: &'static str, values: &[f32], out: &mut Vec<u8>) -> Result<(), ShardError> {
        if values.is_empty() {
            return Ok(());
        }
        self.quantizer(QBits::Int8)
            .encode(&*self.engine, values, 0, out, None)
            .map_err(|error| ShardError::Comm { op, error })
    }

    /// Decodes a shard's bytes (raw or a qwZ block) into `out` at `dtype`.
    #[allow(clippy::too_many_arguments)]
    fn decode_into(
        &self,
        op: &'static str,
        codec: GatherCodec,
        dtype: Dtype,
        peer: usize,
        bytes: &[u8],
        m: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ShardError> {
        if m == 0 {
            return Ok(());
        }
        match codec {
            GatherCodec::Raw => out.extend_from_slice(bytes),
            GatherCodec::Qwz => {
                let vals = self
                    .quantizer(QBits::Int8)
                    .decode(&*self.engine, bytes, m)
                    .map_err(|e| self.payload(op, peer, e))?;
                match dtype.half() {
                    None => out.extend_from_slice(&crate::sync::f32_bytes(&vals)),
                    Some(h) => {
                        let bits = self.engine.cast_to(h, &vals).map_err(|error| ShardError::Comm { op, error })?;
                        out.extend_from_slice(&crate::sync::u16_bytes(&bits));
                    }
                }
            }
        }
        Ok(())
    }

    /// Bytes a shard of `m` elements travels as.
    fn wire_len(&self, codec: GatherCodec, dtype: Dtype, m: usize) -> usize {
        match codec {
            GatherCodec::Raw => m * dtype.size(),
            GatherCodec::Qwz => self.quantizer(QBits::Int8).block_len(m),
        }
    }

    /// What this rank sends for its shard.
    fn shard_payload(&self, op: &'static str, codec: GatherCodec, shard: &Weights) -> Result<Vec<u8>, ShardError> {
        match codec {
            GatherCodec::Raw => Ok(shard.to_bytes()),
            GatherCodec::Qwz => {
                let x = match shard {
                    Weights::F32(v) => v.clone(),
                    Weights::F16(v) => {
                        self.engine.cast_from(Half::F16, v).map_err(|error| ShardError::Comm { op, error })?
                    }
                    Weights::BF16(v) => {
                        self.engine.cast_from(Half::BF16, v).map_err(|error| ShardError::Comm { op, error })?
                    }
                };
                let mut out = Vec::with_capacity(self.wire_len(codec, shard.dtype(), x.len()));
                self.encode(op, &x, &mut out)?;
                Ok(out)
            }
        }
    }

    /// The full tensor from every rank's shard (`counts[r]` elements on rank
    /// `r`, laid end to end in rank order), over the world. With
    /// [`GatherCodec::Qwz`] this is qwZ's quantized all-gather.
    pub fn all_gather(&mut self, shard: &Weights, counts: &[usize], codec: GatherCodec) -> Result<Weights, ShardError> {
        let op = match codec {
            GatherCodec::Raw => "all-gather",
            GatherCodec::Qwz => "qwZ all-gather",
        };
        self.check_counts(op, counts, shard.len())?;
        let dtype = shard.dtype();
        let send = self.shard_payload(op, codec, shard)?;
        let bytes: Vec<usize> = counts.iter().map(|&m| self.wire_len(codec, dtype, m)).collect();
        let d = self.deadline();
        let all = self
            .world
            .start_all_gather_v(send, &bytes, d)
            .and_then(|p| p.wait(d))
            .map_err(|error| ShardError::Comm { op, error })?;
        self.count(Hop::World, &bytes);
        let mut out = Vec::with_capacity(counts.iter().sum::<usize>() * dtype.size());
        for (j, (r, &m)) in ranges(&bytes).into_iter().zip(counts).enumerate() {
            self.decode_into(op, codec, dtype, j, &all[r], m, &mut out)?;
        }
        Ok(Weights::from_bytes(dtype, &out))
    }

    /// hpZ: builds this rank's secondary shard from every rank's primary
    /// shard (`counts[r]` elements on rank `r`): one exact exchange across
    /// nodes (an all-gather over the ranks of this local index with equal
    /// nodes, an all-to-all over the world otherwise). Collective.
    pub fn hpz_secondary(&mut self, primary: &Weights, counts: &[usize]) -> Result<Secondary, ShardError> {
        const OP: &str = "hpZ secondary build";
        self.check_counts(OP, counts, primary.len())?;
        let dtype = primary.dtype();
        let (p, me) = (self.world.size(), self.world.rank());
        let node = self.map.node_of(me);
        let mine = handled(&self.map, node, self.map.local_of(me) % self.map.members(node).len());
        let send = primary.to_bytes();
        let d = self.deadline();
        let (recv, from): (Vec<u8>, Vec<usize>) = match &self.groups.inter {
            Some(inter) => {
                // Group rank n is this local index on node n.
                let from: Vec<usize> =
                    (0..self.map.nodes()).map(|n| self.map.members(n)[self.map.local_of(me)]).collect();
                let bytes: Vec<usize> = from.iter().map(|&s| counts[s] * dtype.size()).collect();
                let recv = inter
                    .start_all_gather_v(send, &bytes, d)
                    .and_then(|p| p.wait(d))
                    .map_err(|error| ShardError::Comm { op: OP, error })?;
                self.count(Hop::Inter, &bytes);
                (recv, from)
            }
            None => {
                // To the handler of my shard on every node; from every shard I handle.
                let mut send_counts = vec![0; p];
                let mut buf = Vec::new();
                for (dst, c) in send_counts.iter_mut().enumerate() {
                    if self.map.handler(self.map.node_of(dst), me) == dst {
                        *c = send.len();
                        buf.extend_from_slice(&send);
                    }
                }
                let mut from: Vec<usize> = mine.clone();
                from.sort_unstable();
                let mut recv_counts = vec![0; p];
                for &s in &from {
                    recv_counts[s] = counts[s] * dtype.size();
                }
                let recv = self
                    .world
                    .start_all_to_all_v(buf, &send_counts, &recv_counts, d)
                    .and_then(|p| p.wait(d))
                    .map_err(|error| ShardError::Comm { op: OP, error })?;
                self.count(Hop::World, &recv_counts);
                (recv, from)
            }
        };
        // Reorder into (node(s), s) order.
        let mut at = Vec::with_capacity(from.len());
        let mut off = 0;
        for &s in &from {
            at.push((s, off));
            off += counts[s] * dtype.size();
        }
        if off != recv.len() {
            return Err(ShardError::BadPayload {
                op: OP,
                rank: me,
                peer: p,
                detail: format!("{} bytes received, {off} expected", recv.len()),
            });
        }
        let mut bytes = Vec::with_capacity(off);
        for &s in &mine {
            let Some(&(_, o)) = at.iter().find(|(f, _)| *f == s) else {
                return Err(ShardError::Invalid { op: OP, detail: format!("shard {s} was not received") });
            };
            bytes.extend_from_slice(&recv[o..o + counts[s] * dtype.size()]);
        }
        Ok(Secondary { dtype, counts: counts.to_vec(), shards: mine, bytes })
    }

    /// hpZ's all-gather: the full tensor from the node's secondary shards,
    /// over the intra-node group only (nothing crosses nodes). With
    /// [`GatherCodec::Qwz`] every primary shard travels as its own qwZ
    /// block: the result equals [`ShardComm::all_gather`]'s bit for bit.
    pub fn hpz_all_gather(&mut self, secondary: &Secondary, codec: GatherCodec) -> Result<Weights, ShardError> {
        let op = match codec {
            GatherCodec::Raw => "hpZ all-gather",
            GatherCodec::Qwz => "hpZ qwZ all-gather",
        };
        let (dtype, counts) = (secondary.dtype, &secondary.counts);
        let me = self.world.rank();
        let node = self.map.node_of(me);
        let l = self.map.members(node).len();
        if counts.len() != self.world.size() || secondary.shards != handled(&self.map, node, self.map.local_of(me) % l)
        {
            return Err(ShardError::Invalid { op, detail: "the secondary shard was built for another layout".into() });
        }
        let elems = ranges(&secondary.shards.iter().map(|&s| counts[s] * dtype.size()).collect::<Vec<_>>());
        if elems.last().map_or(0, |r| r.end) != secondary.bytes.len() {
            return Err(ShardError::Invalid { op, detail: "secondary bytes do not match its shards".into() });
        }
        let send = match codec {
            GatherCodec::Raw => secondary.bytes.clone(),
            GatherCodec::Qwz => {
                let mut out = Vec::new();
                for r in &elems {
                    let w = Weights::from_bytes(dtype, &secondary.bytes[r.clone()]);
                    out.extend_from_slice(&self.shard_payload(op, codec, &w)?);
                }
                out
            }
        };
        let per_peer: Vec<Vec<usize>> = (0..l).map(|j| handled(&self.map, node, j)).collect();
        let bytes: Vec<usize> =
            per_peer.iter().map(|ss| ss.iter().map(|&s| self.wire_len(codec, dtype, counts[s])).sum()).collect();
        let d = self.deadline();
        let all = self
            .groups
            .intra
            .start_all_gather_v(send, &bytes, d)
            .and_then(|p| p.wait(d))
            .map_err(|error| ShardError::Comm { op, error })?;
        self.count(Hop::Intra, &bytes);
        // Decode every shard, then lay them out in rank order.
        let mut decoded: Vec<Vec<u8>> = vec![Vec::new(); counts.len()];
        let mut at = 0;
        for (j, ss) in per_peer.iter().enumerate() {
            for &s in ss {
                let len = self.wire_len(codec, dtype, counts[s]);
                let src = self.map.members(node)[j];
                let mut out = Vec::with_capacity(counts[s] * dtype.size());
                self.decode_into(op, codec, dtype, src, &all[at..at + len], counts[s], &mut out)?;
                decoded[s] = out;
                at += len;
            }
        }
        Ok(Weights::from_bytes(dtype, &decoded.concat()))
    }

    /// Every rank's gradient (the whole tensor, `Σ counts` elements) reduced
    /// to this rank's shard (`counts[rank]` elements at offset
    /// `Σ_{j<rank} counts[j]`). Collective; every rank passes the same counts.
    pub fn reduce_scatter(
        &mut self,
        grad: &[f32],
        counts: &[usize],
        codec: ScatterCodec,
        reduce: ReduceOp,
    ) -> Result<Vec<f32>, ShardError> {
        let op = match codec {
            ScatterCodec::F32 => "reduce-scatter",
            ScatterCodec::Qgz { inter: None, .. } => "qgZ reduce-scatter",
            ScatterCodec::Qgz { inter: Some(_), .. } => "qgZ hierarchical reduce-scatter",
        };
        let p = self.world.size();
        if counts.len() != p || counts.iter().sum::<usize>() != grad.len() {
            return Err(ShardError::Invalid {
                op,
                detail: format!(
                    "{} shard sizes summing to {} for {p} ranks and {} elements",
                    counts.len(),
                    counts.iter().sum::<usize>(),
                    grad.len()
                ),
            });
        }
        let mut sum = match codec {
            ScatterCodec::F32 => self.f32_scatter(op, grad, counts)?,
            ScatterCodec::Qgz { bits, inter: None } => self.one_shot_scatter(op, grad, counts, bits)?,
            ScatterCodec::Qgz { bits, inter: Some(inter) } => self.hier_scatter(op, grad, counts, bits, inter)?,
        };
        if reduce == ReduceOp::Mean {
            let pf = p as f32;
            sum.iter_mut().for_each(|v| *v /= pf);
        }
        Ok(sum)
    }

    fn f32_scatter(&mut self, op: &'static str, grad: &[f32], counts: &[usize]) -> Result<Vec<f32>, ShardError> {
        let (p, me) = (self.world.size(), self.world.rank());
        let m = counts[me];
        let send_counts: Vec<usize> = counts.iter().map(|c| 4 * c).collect();
        let recv_counts = vec![4 * m; p];
        let d = self.deadline();
        let recv = self
            .world
            .start_all_to_all_v(crate::sync::f32_bytes(grad), &send_counts, &recv_counts, d)
            .and_then(|p| p.wait(d))
            .map_err(|error| ShardError::Comm { op, error })?;
        self.count(Hop::World, &recv_counts);
        let vals = crate::sync::f32_from_bytes(&recv);
        let mut sum = vec![0f32; m];
        for chunk in vals.chunks(m.max(1)).take(if m == 0 { 0 } else { p }) {
            sum.iter_mut().zip(chunk).for_each(|(a, v)| *a += v);
        }
        Ok(sum)
    }

    fn one_shot_scatter(
        &mut self,
        op: &'static str,
        grad: &[f32],
        counts: &[usize],
        bits: QBits,
    ) -> Result<Vec<f32>, ShardError> {
        let (p, me) = (self.world.size(), self.world.rank());
        let q = self.quantizer(bits);
        let mut send = Vec::with_capacity(q.block_len(grad.len()) + 4 * p);
        let mut send_counts = Vec::with_capacity(p);
        for r in ranges(counts) {
            let before = send.len();
            if !r.is_empty() {
                q.encode(&*self.engine, &grad[r], 0, &mut send, None)
                    .map_err(|error| ShardError::Comm { op, error })?;
            }
            send_counts.push(send.len() - before);
        }
        let m = counts[me];
        let block = q.block_len(m);
        let recv_counts = vec![block; p];
        let d = self.deadline();
        let recv = self
            .world
            .start_all_to_all_v(send, &send_counts, &recv_counts, d)
            .and_then(|p| p.wait(d))
            .map_err(|error| ShardError::Comm { op, error })?;
        self.count(Hop::World, &recv_counts);
        let mut sum = vec![0f32; m];
        if m > 0 {
            let blocks: Vec<&[u8]> = recv.chunks(block).collect();
            q.decode_mean(&*self.engine, &blocks, 1.0, &mut sum).map_err(|e| self.payload(op, p, e))?;
        }
        Ok(sum)
    }

    fn hier_scatter(
        &mut self,
        op: &'static str,
        grad: &[f32],
        counts: &[usize],
        bits: QBits,
        inter_bits: QBits,
    ) -> Result<Vec<f32>, ShardError> {
        let (p, me) = (self.world.size(), self.world.rank());
        let map = self.map.clone();
        let node = map.node_of(me);
        let l = map.members(node).len();
        let sh = ranges(counts);
        let per_peer: Vec<Vec<usize>> = (0..l).map(|j| handled(&map, node, j)).collect();
        let mine = &per_peer[map.local_of(me) % l];

        // Intra-node: each local peer gets the blocks of the shards it
        // handles. A rank alone on its node has nobody to send to: its
        // gradient is its node's partial, not quantized at `bits`.
        let q1 = self.quantizer(bits);
        let d = self.deadline();
        let intra = if l == 1 {
            None
        } else {
            let mut send = Vec::with_capacity(q1.block_len(grad.len()) + 4 * p);
            let mut send_counts = Vec::with_capacity(l);
            for ss in &per_peer {
                let before = send.len();
                for &s in ss {
                    if !sh[s].is_empty() {
                        q1.encode(&*self.engine, &grad[sh[s].clone()], 0, &mut send, None)
                            .map_err(|error| ShardError::Comm { op, error })?;
                    }
                }
                send_counts.push(send.len() - before);
            }
            let per_src: usize = mine.iter().map(|&s| q1.block_len(counts[s])).sum();
            let recv_counts = vec![per_src; l];
            let recv = self
                .groups
                .intra
                .start_all_to_all_v(send, &send_counts, &recv_counts, d)
                .and_then(|p| p.wait(d))
                .map_err(|error| ShardError::Comm { op, error })?;
            self.count(Hop::Intra, &recv_counts);
            Some((recv, per_src))
        };

        // Node partials, requantized at the inter-node width, to each owner.
        let q2 = self.quantizer(inter_bits);
        let equal = self.groups.inter.is_some();
        let (hop, size) = if equal { (Hop::Inter, map.nodes()) } else { (Hop::World, p) };
        let index = |r: usize| if equal { map.node_of(r) } else { r };
        let mut blocks_by_dst: Vec<Vec<u8>> = vec![Vec::new(); size];
        let mut offset = 0;
        for &s in mine {
            let (m, len) = (counts[s], q1.block_len(counts[s]));
            if m > 0 {
                let partial = match &intra {
                    None => std::borrow::Cow::Borrowed(&grad[sh[s].clone()]),
                    Some((recv, per_src)) => {
                        let blocks: Vec<&[u8]> =
                            (0..l).map(|i| &recv[i * per_src + offset..i * per_src + offset + len]).collect();
                        let mut partial = vec![0f32; m];
                        q1.decode_mean(&*self.engine, &blocks, 1.0, &mut partial)
                            .map_err(|e| self.payload(op, l, e))?;
                        std::borrow::Cow::Owned(partial)
                    }
                };
                q2.encode(&*self.engine, &partial, 0, &mut blocks_by_dst[index(s)], None)
                    .map_err(|error| ShardError::Comm { op, error })?;
            }
            offset += len;
        }
        let send_counts: Vec<usize> = blocks_by_dst.iter().map(Vec::len).collect();
        let send = blocks_by_dst.concat();
        let m = counts[me];
        let block = q2.block_len(m);
        let from: Vec<usize> = (0..map.nodes()).map(|n| index(map.handler(n, me))).collect();
        let mut recv_counts = vec![0; size];
        for &f in &from {
            recv_counts[f] = block;
        }
        let recv = self
            .comm(hop)
            .start_all_to_all_v(send, &send_counts, &recv_counts, d)
            .and_then(|p| p.wait(d))
            .map_err(|error| ShardError::Comm { op, error })?;
        self.count(hop, &recv_counts);
        let starts = displacements(&recv_counts);
        let mut sum = vec![0f32; m];
        if m > 0 {
            let blocks: Vec<&[u8]> = from.iter().map(|&f| &recv[starts[f]..starts[f] + block]).collect();
            q2.decode_mean(&*self.engine, &blocks, 1.0, &mut sum).map_err(|e| self.payload(op, map.nodes(), e))?;
        }
        Ok(sum)
    }
}

/// One round-to-nearest quantization's largest error with scale `s`.
fn q_err(s: f64) -> f64 {
    s * (0.5 + 1.0 / 1024.0)
}

fn qmax(b: QBits) -> f64 {
    f64::from(b.qmax())
}

/// For every element, `f` over its group (groups of `group` from each
/// shard's start, shards of `counts`).
fn per_group(v: &[f64], counts: &[usize], group: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let g = group.max(1);
    let mut out = vec![0.0; v.len()];
    for r in ranges(counts) {
        for (gi, chunk) in v[r.clone()].chunks(g).enumerate() {
            let val = f(chunk);
            let start = r.start + gi * g;
            out[start..start + chunk.len()].iter_mut().for_each(|o| *o = val);
        }
    }
    out
}

fn absmax(c: &[f64]) -> f64 {
    c.iter().fold(0.0, |a, v| a.max(v.abs()))
}

fn maxof(c: &[f64]) -> f64 {
    c.iter().fold(0.0, |a, &v| a.max(v))
}

/// The documented bound of a qwZ all-gather (or hpZ quantized) per element
/// of the full tensor `full` (the exact values, at their type, widened to
/// f32), shards of `counts`; raw gathers are exact (bound 0).
pub fn all_gather_bound(full: &[f32], dtype: Dtype, counts: &[usize], group: usize, codec: GatherCodec) -> Vec<f64> {
    if codec == GatherCodec::Raw {
        return vec![0.0; full.len()];
    }
    let x: Vec<f64> = full.iter().map(|&v| f64::from(v)).collect();
    let a = per_group(&x, counts, group, absmax);
    (0..x.len())
        .map(|i| {
            let e = q_err(a[i] / 127.0) + 2.0 * EPS * (a[i] + a[i] / 127.0);
            match dtype {
                Dtype::F32 => e,
                Dtype::F16 if x[i].abs() + e >= 65504.0 => f64::INFINITY,
                Dtype::F16 => e + (x[i].abs() + e) / 2048.0 + 2f64.powi(-25),
                Dtype::BF16 => e + (x[i].abs() + e) / 256.0 + 2f64.powi(-134),
            }
        })
        .collect()
}

/// The exact reduction (f64) and the documented bound per element of the
/// whole tensor, for a reduce-scatter of `grad(r)` (rank `r`'s gradient of
/// `Σ counts` elements) over `map`'s ranks.
pub fn reduce_scatter_reference(
    map: &NodeMap,
    counts: &[usize],
    group: usize,
    codec: ScatterCodec,
    reduce: ReduceOp,
    grad: &dyn Fn(usize) -> Vec<f32>,
) -> (Vec<f64>, Vec<f64>) {
    let n: usize = counts.iter().sum();
    let p = map.world();
    let pf = p as f64;
    let as64 = |r: usize| grad(r).into_iter().map(f64::from).collect::<Vec<f64>>();
    let mut sum = vec![0.0f64; n];
    let mut e = vec![0.0f64; n];
    match codec {
        ScatterCodec::F32 => {
            let mut abs = vec![0.0; n];
            for r in 0..p {
                for (i, v) in as64(r).into_iter().enumerate() {
                    sum[i] += v;
                    abs[i] += v.abs();
                }
            }
            (0..n).for_each(|i| e[i] = (pf + 1.0) * EPS * abs[i]);
        }
        ScatterCodec::Qgz { bits, inter: None } => {
            let qm = qmax(bits);
            let mut slop = vec![0.0; n];
            for r in 0..p {
                let x = as64(r);
                let a = per_group(&x, counts, group, absmax);
                for i in 0..n {
                    sum[i] += x[i];
                    e[i] += q_err(a[i] / qm);
                    slop[i] += a[i] + a[i] / qm;
                }
            }
            (0..n).for_each(|i| e[i] += (pf + 1.0) * EPS * slop[i]);
        }
        ScatterCodec::Qgz { bits, inter: Some(inter) } => {
            let (qm1, qm2) = (qmax(bits), qmax(inter));
            let mut slop2 = vec![0.0; n];
            for node in 0..map.nodes() {
                let members = map.members(node);
                let mut partial = vec![0.0f64; n];
                let mut e1 = vec![0.0f64; n];
                let mut slop1 = vec![0.0f64; n];
                // A rank alone on its node is its node's partial, never
                // quantized at the intra-node width.
                let quantized = members.len() > 1;
                for &r in members {
                    let x = as64(r);
                    if quantized {
                        let a = per_group(&x, counts, group, absmax);
                        for i in 0..n {
                            e1[i] += q_err(a[i] / qm1);
                            slop1[i] += a[i] + a[i] / qm1;
                        }
                    }
                    partial.iter_mut().zip(&x).for_each(|(s, v)| *s += v);
                }
                if quantized {
                    let lf = members.len() as f64;
                    (0..n).for_each(|i| e1[i] += (lf + 1.0) * EPS * slop1[i]);
                }
                let b: Vec<f64> = per_group(&partial, counts, group, absmax)
                    .into_iter()
                    .zip(per_group(&e1, counts, group, maxof))
                    .map(|(a, x)| a + x)
                    .collect();
                for i in 0..n {
                    sum[i] += partial[i];
                    e[i] += e1[i] + q_err(b[i] / qm2);
                    slop2[i] += b[i] + b[i] / qm2;
                }
            }
            let nf = map.nodes() as f64;
            (0..n).for_each(|i| e[i] += (nf + 1.0) * EPS * slop2[i]);
        }
    }
    match reduce {
        ReduceOp::Sum => (sum, e),
        ReduceOp::Mean => {
            let mean: Vec<f64> = sum.iter().map(|s| s / pf).collect();
            let bound = (0..n).map(|i| e[i] / pf + mean[i].abs() * EPS).collect();
            (mean, bound)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handlers_cover_every_shard_once_per_node() {
        for map in [vec![0, 0, 1], vec![1, 0, 0], vec![0, 0, 1, 1], vec![0, 1, 0, 1], vec![0, 0, 0, 1, 1]] {
            let m = NodeMap::new(map.clone()).expect("map");
            for node in 0..m.nodes() {
                let mut all: Vec<usize> = (0..m.members(node).len()).flat_map(|j| handled(&m, node, j)).collect();
                all.sort_unstable();
                assert_eq!(all, (0..m.world()).collect::<Vec<_>>(), "{map:?} node {node}");
                for s in 0..m.world() {
                    let h = m.handler(node, s);
                    assert!(handled(&m, node, m.local_of(h)).contains(&s), "{map:?}");
                }
            }
        }
    }

    #[test]
    fn ranges_follow_uneven_counts() {
        assert_eq!(ranges(&[3, 0, 2]), vec![0..3, 3..3, 3..5]);
    }

    #[test]
    fn qwz_bound_holds_for_one_block_and_is_tight_enough_to_fail() {
        let x: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let q = Quantizer { bits: QBits::Int8, group: 64, rounding: Rounding::Nearest };
        let mut b = Vec::new();
        q.encode(&HostEngine, &x, 0, &mut b, None).expect("encode");
        let y = q.decode(&HostEngine, &b, x.len()).expect("decode");
        let bound = all_gather_bound(&x, Dtype::F32, &[1000], 64, GatherCodec::Qwz);
        let mut worst = 0f64;
        for i in 0..x.len() {
            let err = (f64::from(y[i]) - f64::from(x[i])).abs();
            assert!(err <= bound[i], "{i}: {err} > {}", bound[i]);
            worst = worst.max(err / bound[i]);
        }
        // Half a step is reached: a bound of a quarter step would fail.
        assert!(worst > 0.5, "worst ratio {worst}");
    }
}
