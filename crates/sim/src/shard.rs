//! Sharded data parallelism: ZeRO / FSDP stages with ZeRO++'s qwZ, hpZ
//! and qgZ, priced on top of a [`Predictor`]'s per-type compute and memory.
//!
//! **Stages** ([`Stage`]). `Replicate` is DDP: the predictor's own
//! iteration (the replayer's buckets and all-reduces). `ShardGradOp`
//! (ZeRO-2, FSDP `SHARD_GRAD_OP`): FP32 master weights, gradients and
//! optimizer state sharded; each unit all-gathered in the forward and kept
//! unsharded until the backward ends; gradients reduce-scattered.
//! `FullShard` (ZeRO-3, FSDP `FULL_SHARD`): the same, but each unit is
//! freed after its forward and all-gathered again in the backward.
//! `HybridShard`: `FullShard` inside each node, replicas across nodes (each
//! device all-reduces its gradient shard with its peers of the same local
//! index on the other nodes). `hpz` (with `FullShard`): a secondary copy of
//! the weights sharded inside the node, so the backward's all-gather stays
//! inside the node, at the memory of that secondary shard.
//!
//! **Units** ([`Units::of`]): what is gathered at a time, one wrapped
//! module. The rule: a node's *block key* is the path of its PyTorch module
//! (its scope, else its name, `/` and `.` both separators) up to the first
//! all-digit component that follows another component (`transformer.h.3`,
//! `model.layers.12`, `/blocks.0/…`); a key whose prefix
//! (`transformer.h`) has at least two indices in the graph is a block. Each
//! block is a unit, in order of first appearance; nodes outside every block
//! form a *root* unit before the first block and one after the last (a
//! node between blocks joins the block before it). A graph with fewer than
//! two blocks is cut along its schedule into [`FALLBACK_UNITS`] units of
//! about equal parameter count. A parameter belongs to the first unit that
//! reads it (tied weights once). A block's key is also its PyTorch module's
//! qualified name ([`Unit::module`]) when each component is an identifier
//! or an index: what a trainer wraps.
//!
//! **Memory per device** ([`ShardMemory`]): its shard of the FP32 master
//! weights, gradients and optimizer state (the predictor's replicated
//! breakdown times the device's *share*), plus the gathered units — two
//! at a time (the one computing and the one prefetched), the largest unit,
//! at the gather's held precision (4 bytes for an FP32 gather, else 2) —
//! plus one unit's unsharded FP32 gradient before its reduce-scatter, plus
//! (hpZ) the secondary shard `P·2/g`, plus (`ShardGradOp`) every unit's
//! weights at the held precision instead of two, plus activations and
//! workspace. With activation checkpointing a block unit keeps only its
//! input (the activations it reads from outside it) and the largest block
//! is recomputed whole in the backward; root units keep theirs. Shares are
//! either equal (`1/N`) or *uneven* ([`ShardSpec::uneven`]): each device's
//! share in proportion to the memory it has left after its fixed part, so
//! every device fills the same fraction of what it can hold.
//!
//! **Time** ([`predict_sharded`]): per type the forward and backward compute
//! of each unit (the predictor's program summed over the unit's nodes; a
//! checkpointed block recomputes its forward in the backward), and one
//! communication stream shared by every collective, first-in first-out in
//! program order: the forward's all-gather of unit `u+1` is issued when unit
//! `u` starts computing (prefetch), the backward's all-gather of unit `v−1`
//! when unit `v`'s backward starts, unit `v`'s reduce-scatter (and, hybrid,
//! its all-reduce across nodes) when its backward ends. A collective over
//! the whole cluster starts once every type has issued it and the stream is
//! free, and ends at the same time for all; one inside a node runs per type.
//! The optimizer step then runs over the device's share. Exposed
//! communication is what the compute waits for.
//!
//! **Fixed costs.** A unit without parameters runs no collective and no
//! hook (FSDP has nothing to gather). A unit with parameters pays, per
//! collective it takes part in (its forward all-gather, its backward
//! all-gather when re-gathered, its reduce-scatter), the host time of
//! FSDP's hook on the device's compute stream ([`FSDP_UNIT_HOST_US`]:
//! before the unit's forward or backward, and after its backward, before
//! its reduce-scatter is issued); and each collective a launch on the
//! communication stream ([`COLLECTIVE_LAUNCH_US`]) on top of its ring
//! steps' latencies. A small model then pays these per unit where DDP pays
//! one all-reduce per bucket.
//!
//! **Collectives' prices.** A ring of `p` members moving shards of at most
//! `s` bytes (the largest share times the unit's bytes) costs
//! `(p−1)·s/bw + (p−1)·lat + launch`. Across nodes the collective follows the
//! engine's all-reduce algorithm ([`crate::AllReduceAlgo`], as DDP's
//! all-reduce is priced): `Ring` (and `HalvingDoubling`) is a flat ring that
//! crosses each node boundary once and gets the whole node network (the
//! slowest type's); `Hierarchical` (the default) is a ring of the node's
//! `g` devices over the intra-node link, then each device's part, `S/g`, in
//! a ring across the `m` nodes at `1/g` of the node's network, one after
//! the other, as [`crate::Cluster::allreduce_us`] prices half an
//! all-reduce; inside one node, the intra-node link. Hybrid's all-reduce across `m` nodes of a shard of `s`
//! bytes is `2(m−1)/m·s/(bw/g) + 2(m−1)·lat`: all `g` devices of a node send
//! at once and share its network ([`DeviceType::network_share`]). Bytes per
//! element on the wire are the runtime's (`qsync_runtime::shard`): FP32 4,
//! BF16/FP16 2, qwZ `1 + 4/G`, qgZ-int8 `1 + 4/G`, qgZ-int4 `1/2 + 4/G`
//! (`G` = 512: qwZ 0.5039 of FP16's bytes, qgZ-int4 0.1270 of FP32's).
//! A quantized or 16-bit collective also runs its kernels on the device's
//! stream before it is done, at the device type's synchronization kernel
//! rates ([`crate::SyncKernels`], `seconds = r·elements + c`, as `sync.rs`
//! prices DDP's schemes), for a unit of `E` elements and a device share
//! `s`: qwZ all-gather `quantize(s·E) + dequantize(E)` (its shard in, the
//! whole unit out); qgZ reduce-scatter `quantize(E) + dequantize(P·s·E)`
//! (every peer's slice out, `P` blocks of its own shard decoded and
//! summed; inside a node `P = g`, `s = 1/g`), each decoding plus its pass
//! over the sum where the engine decodes in one pass
//! ([`crate::SyncKernels::qgz_decode_r`]); a BF16 reduce-scatter
//! `cast16(E) + cast16(s·E)`; hybrid's qgZ all-reduce across nodes the
//! one-shot qgZ all-reduce's kernels ([`crate::sync::kernel_seconds`]).
//! 16-bit gathers and FP32 reduce-scatters run none (the 16-bit weights
//! are what AMP computes with anyway).
//!
//! **Error** ([`GatherPrecision::relative_error`],
//! [`ReducePrecision::relative_error`]): as [`crate::SyncScheme::relative_error`],
//! the documented bound (`qsync_runtime::shard`) relative to the largest
//! magnitude of the unit it scales by, `1/2` of a step per round-to-nearest
//! quantization stage: qwZ one stage of int8, `1/(2·127)`; qgZ one-shot one
//! stage, `1/(2·127)` (int8) or `1/(2·7)` (int4); a BF16 ring reduce-scatter
//! rounds the running sum at each of its `P−1` hops, `(P−1)·2^-8`; 16-bit
//! gathers at the AMP type and FP32 reduce-scatters add nothing.

use qsync_ir::{Graph, NodeId};
use serde::Serialize;

use crate::{DeviceType, PredictError, Predictor};

/// Units a graph without repeated blocks is cut into.
pub const FALLBACK_UNITS: usize = 8;

/// Host time of one FSDP unit's hooks per collective it takes part in, µs:
/// the pre-forward (and, re-gathering, pre-backward) hook with the flat
/// buffer's copy-in before the all-gather and copy-out into the
/// parameters after it, the post-backward hook with the gradients'
/// copy-in before the reduce-scatter and the views of the shard after it.
/// Assumption, not measured here: 100 µs, the Python work of a hook and a
/// few small foreach copies on a server CPU. For scale, PyTorch's issue
/// "Large CPU overhead with FSDP2" (github.com/pytorch/pytorch/issues/173680,
/// torch 2.10) reports FSDP2's `pre_forward` near 1 ms a call on a Xeon
/// host, enough to idle the GPU; 100 µs is the low end. A device file's
/// `fsdp_unit_host_us` replaces it.
pub const FSDP_UNIT_HOST_US: f64 = 100.0;

/// Fixed latency of one collective's launch beyond its ring steps, µs:
/// NCCL's tuning model (`src/graph/tuning.cc`, `baseLat` of Ring over the
/// Simple protocol, the one large collectives use: 8.4 µs), whose per-step
/// `hwLat` is what the cluster's per-step latencies already stand for. A
/// device file's `collective_launch_us` replaces it.
pub const COLLECTIVE_LAUNCH_US: f64 = 8.4;

/// The quantization group of qwZ and qgZ (the runtime's default).
pub const QUANT_GROUP: f64 = 512.0;

/// How a device type's training state is spread over the devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// DDP: everything replicated, gradients all-reduced.
    Replicate,
    /// ZeRO-2 / FSDP `SHARD_GRAD_OP`.
    ShardGradOp,
    /// ZeRO-3 / FSDP `FULL_SHARD`.
    FullShard,
    /// FSDP `HYBRID_SHARD`: full sharding inside a node, replicas across.
    HybridShard,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Replicate => "replicate",
            Stage::ShardGradOp => "shard-grad-op",
            Stage::FullShard => "full-shard",
            Stage::HybridShard => "hybrid-shard",
        }
    }

    /// FSDP's name of the strategy.
    pub fn fsdp_name(self) -> &'static str {
        match self {
            Stage::Replicate => "NO_SHARD",
            Stage::ShardGradOp => "SHARD_GRAD_OP",
            Stage::FullShard => "FULL_SHARD",
            Stage::HybridShard => "HYBRID_SHARD",
        }
    }
}

/// What the weights' all-gather moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GatherPrecision {
    Fp32,
    Bf16,
    Fp16,
    /// ZeRO++ qwZ: int8 blocks with an f32 scale per group, dequantized to 16 bits.
    QwzInt8,
}

impl GatherPrecision {
    pub fn name(self) -> &'static str {
        match self {
            GatherPrecision::Fp32 => "fp32",
            GatherPrecision::Bf16 => "bf16",
            GatherPrecision::Fp16 => "fp16",
            GatherPrecision::QwzInt8 => "qwz-int8",
        }
    }

    /// Bytes per element on the wire.
    pub fn wire_bytes(self) -> f64 {
        match self {
            GatherPrecision::Fp32 => 4.0,
            GatherPrecision::Bf16 | GatherPrecision::Fp16 => 2.0,
            GatherPrecision::QwzInt8 => 1.0 + 4.0 / QUANT_GROUP,
        }
    }

    /// Bytes per element of the gathered weights held on the device.
    pub fn held_bytes(self) -> f64 {
        match self {
            GatherPrecision::Fp32 => 4.0,
            _ => 2.0,
        }
    }

    /// Error added to the weights AMP computes with, relative to the
    /// largest magnitude of a quantization group (see the module doc).
    pub fn relative_error(self) -> f64 {
        match self {
            GatherPrecision::QwzInt8 => 0.5 / 127.0,
            _ => 0.0,
        }
    }

    /// Kernel seconds on a device that holds `shard` of a unit's `whole`
    /// elements (see the module doc).
    pub fn kernel_seconds(self, k: &crate::SyncKernels, shard: f64, whole: f64) -> f64 {
        let k = &k.at_size(whole);
        match self {
            GatherPrecision::QwzInt8 => k.quantize(shard, 8) + k.dequantize(whole, 8) + k.qgz_pass(whole),
            _ => 0.0,
        }
    }
}

/// What the gradients' reduce-scatter moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReducePrecision {
    Fp32,
    Bf16,
    QgzInt8,
    QgzInt4,
}

impl ReducePrecision {
    pub fn name(self) -> &'static str {
        match self {
            ReducePrecision::Fp32 => "fp32",
            ReducePrecision::Bf16 => "bf16",
            ReducePrecision::QgzInt8 => "qgz-int8",
            ReducePrecision::QgzInt4 => "qgz-int4",
        }
    }

    /// Bytes per element on the wire.
    pub fn wire_bytes(self) -> f64 {
        match self {
            ReducePrecision::Fp32 => 4.0,
            ReducePrecision::Bf16 => 2.0,
            ReducePrecision::QgzInt8 => 1.0 + 4.0 / QUANT_GROUP,
            ReducePrecision::QgzInt4 => 0.5 + 4.0 / QUANT_GROUP,
        }
    }

    /// Error added to the reduced gradient, relative to the largest
    /// magnitude of its scaling unit, on a ring of `p` devices (see the
    /// module doc).
    pub fn relative_error(self, p: u64) -> f64 {
        match self {
            ReducePrecision::Fp32 => 0.0,
            ReducePrecision::Bf16 => p.saturating_sub(1) as f64 * 2f64.powi(-8),
            ReducePrecision::QgzInt8 => 0.5 / 127.0,
            ReducePrecision::QgzInt4 => 0.5 / 7.0,
        }
    }

    /// Kernel seconds of a reduce-scatter of a unit's `whole` elements on a
    /// device that keeps `shard` of them, `members` devices taking part.
    pub fn kernel_seconds(self, k: &crate::SyncKernels, shard: f64, whole: f64, members: f64) -> f64 {
        let k = &k.at_size(whole);
        match self {
            ReducePrecision::Fp32 => 0.0,
            ReducePrecision::Bf16 => k.cast_half(true, whole) + k.cast_half(true, shard),
            ReducePrecision::QgzInt8 => k.quantize(whole, 8) + k.dequantize(members * shard, 8) + k.qgz_pass(shard),
            ReducePrecision::QgzInt4 => k.quantize(whole, 4) + k.dequantize(members * shard, 4) + k.qgz_pass(shard),
        }
    }

    fn qgz_bits(self) -> Option<u8> {
        match self {
            ReducePrecision::QgzInt8 => Some(8),
            ReducePrecision::QgzInt4 => Some(4),
            _ => None,
        }
    }
}

/// Which collectives' precisions a search may choose, beyond the 16-bit
/// all-gather at the AMP type and the FP32 reduce-scatter that are always
/// candidates (`qsyncc --shard-collectives`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CollectiveChoices {
    /// qwZ all-gathers allowed.
    pub qwz: bool,
    /// Reduce-scatter precisions allowed besides FP32.
    pub reduce: Vec<ReducePrecision>,
}

impl CollectiveChoices {
    /// `fp` (nothing but the 16-bit gather and the FP32 reduce-scatter),
    /// `auto` (every one: qwZ, bf16, qgZ-int8, qgZ-int4), or a comma list
    /// of `qwz`, `bf16`, `qgz-int8`, `qgz-int4`.
    pub fn parse(s: &str) -> Result<CollectiveChoices, String> {
        let mut c = CollectiveChoices::default();
        match s.trim() {
            "fp" => return Ok(c),
            "auto" => {
                return Ok(CollectiveChoices {
                    qwz: true,
                    reduce: vec![ReducePrecision::Bf16, ReducePrecision::QgzInt8, ReducePrecision::QgzInt4],
                })
            }
            _ => {}
        }
        for tok in s.split(',').map(str::trim) {
            let r = match tok {
                "qwz" => {
                    c.qwz = true;
                    continue;
                }
                "bf16" => ReducePrecision::Bf16,
                "qgz-int8" => ReducePrecision::QgzInt8,
                "qgz-int4" => ReducePrecision::QgzInt4,
                _ => {
                    return Err(format!(
                    "unknown sharded collective `{tok}` (fp, auto, or a comma list of qwz, bf16, qgz-int8, qgz-int4)"
                ))
                }
            };
            if !c.reduce.contains(&r) {
                c.reduce.push(r);
            }
        }
        Ok(c)
    }

    /// The `(gather, reduce)` pairs to price on `p` devices, the 16-bit
    /// gather at `sixteen` and the FP32 reduce-scatter first (so ties keep
    /// them), those over `budget` left out.
    pub fn pairs(&self, sixteen: GatherPrecision, p: u64, budget: f64) -> Vec<(GatherPrecision, ReducePrecision)> {
        let mut gathers = vec![sixteen];
        if self.qwz && GatherPrecision::QwzInt8.relative_error() <= budget {
            gathers.push(GatherPrecision::QwzInt8);
        }
        let mut reduces = vec![ReducePrecision::Fp32];
        reduces.extend(self.reduce.iter().copied().filter(|r| r.relative_error(p) <= budget));
        gathers.iter().flat_map(|&g| reduces.iter().map(move |&r| (g, r))).collect()
    }
}

/// The cluster-wide sharding (one process group spans every device, so the
/// stage and the collectives' precisions are the cluster's), with each
/// type's activation checkpointing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardSpec {
    pub stage: Stage,
    /// ZeRO++ hpZ (only with `FullShard`).
    pub hpz: bool,
    pub gather: GatherPrecision,
    pub reduce: ReducePrecision,
    /// Shares in proportion to what each device can hold (else equal).
    pub uneven: bool,
    /// Per device type: activation checkpointing of the block units.
    pub checkpoint: Vec<bool>,
}

impl ShardSpec {
    /// `stage` with 16-bit gathers, FP32 reduce-scatters, equal shares, no
    /// checkpointing, for `types` device types.
    pub fn new(stage: Stage, types: usize) -> ShardSpec {
        ShardSpec {
            stage,
            hpz: false,
            gather: GatherPrecision::Bf16,
            reduce: ReducePrecision::Fp32,
            uneven: false,
            checkpoint: vec![false; types],
        }
    }
}

/// One unit: a wrapped module gathered at a time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unit {
    pub name: String,
    /// The PyTorch module a block unit is, by its qualified name
    /// (`model.layers.3`): the block key when each of its components is a
    /// Python identifier or an index; `None` for root units, equal-parameter
    /// parts and keys no module could carry.
    pub module: Option<String>,
    /// A repeated block (checkpointed when asked), not a root unit.
    pub block: bool,
    /// Trained parameter elements it owns.
    pub params: f64,
    /// Elements of its nodes' outputs (its share of the activations).
    pub out_elems: f64,
    /// Bytes of activations it reads from outside (what checkpointing keeps),
    /// at the graph's batch.
    pub input_bytes: f64,
}

/// A graph's units and which unit each scheduled node belongs to.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Units {
    pub units: Vec<Unit>,
    /// Per position in the schedule, its unit.
    #[serde(skip)]
    pub of_op: Vec<usize>,
    /// How the units were found: `blocks` or `equal-parameters`.
    pub rule: &'static str,
}

/// The block key of a path (see the module doc): `(prefix, key)`.
fn block_key(path: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = path.split(['/', '.']).filter(|s| !s.is_empty()).collect();
    for i in 1..parts.len() {
        if parts[i].bytes().all(|b| b.is_ascii_digit()) && !parts[i - 1].bytes().all(|b| b.is_ascii_digit()) {
            return Some((parts[..i].join("."), parts[..=i].join(".")));
        }
    }
    None
}

/// `key` as a PyTorch qualified module name, when every component is a
/// Python identifier (ASCII) or an index.
fn module_name(key: &str) -> Option<String> {
    let ok = |c: &str| {
        let mut b = c.bytes();
        match b.next() {
            Some(f) if f.is_ascii_digit() => c.bytes().all(|x| x.is_ascii_digit()),
            Some(f) if f.is_ascii_alphabetic() || f == b'_' => b.all(|x| x.is_ascii_alphanumeric() || x == b'_'),
            _ => false,
        }
    };
    key.split('.').all(ok).then(|| key.to_string())
}

impl Units {
    /// The units of `graph` under `facts`' schedule (see the module doc).
    pub fn of(graph: &Graph, facts: &qsync_cost::GraphFacts) -> Units {
        let order = facts.order();
        let keys: Vec<Option<(String, String)>> = order
            .iter()
            .map(|&n| {
                let node = graph.node(n);
                node.scope.as_ref().and_then(|s| block_key(&s.module)).or_else(|| block_key(&node.name))
            })
            .collect();
        let mut indices: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> = Default::default();
        for (prefix, key) in keys.iter().flatten() {
            indices.entry(prefix.as_str()).or_default().insert(key.as_str());
        }
        let is_block = |k: &Option<(String, String)>| k.as_ref().is_some_and(|(p, _)| indices[p.as_str()].len() >= 2);
        let blocks: std::collections::BTreeSet<&str> =
            keys.iter().filter(|k| is_block(k)).map(|k| k.as_ref().map_or("", |(_, k)| k.as_str())).collect();
        let mut units: Vec<Unit> = Vec::new();
        let mut of_op = vec![0usize; order.len()];
        let unit = |name: &str, block: bool| Unit {
            name: name.to_string(),
            module: None,
            block,
            params: 0.0,
            out_elems: 0.0,
            input_bytes: 0.0,
        };
        let rule = if blocks.len() >= 2 {
            let mut by_key: std::collections::HashMap<String, usize> = Default::default();
            let mut seen_block = false;
            let mut after_root: Option<usize> = None;
            for (i, k) in keys.iter().enumerate() {
                let u = if is_block(k) {
                    let key = k.as_ref().map_or(String::new(), |(_, k)| k.clone());
                    seen_block = true;
                    *by_key.entry(key.clone()).or_insert_with(|| {
                        units.push(Unit { module: module_name(&key), ..unit(&key, true) });
                        units.len() - 1
                    })
                } else if !seen_block {
                    *by_key.entry("(root: before the blocks)".into()).or_insert_with(|| {
                        units.push(unit("(root: before the blocks)", false));
                        units.len() - 1
                    })
                } else if keys[i..].iter().any(is_block) {
                    // Between blocks: with the block before it.
                    of_op[i - 1]
                } else {
                    *after_root.get_or_insert_with(|| {
                        units.push(unit("(root: after the blocks)", false));
                        units.len() - 1
                    })
                };
                of_op[i] = u;
            }
            "blocks"
        } else {
            let total: f64 = order.iter().map(|&n| facts.node(n).map_or(0.0, |f| f.weight)).sum();
            let per = total / FALLBACK_UNITS as f64;
            let mut acc = 0.0;
            for (i, &n) in order.iter().enumerate() {
                let w = facts.node(n).map_or(0.0, |f| f.weight);
                let u = if per > 0.0 { ((acc / per) as usize).min(FALLBACK_UNITS - 1) } else { 0 };
                while units.len() <= u {
                    units.push(unit(&format!("(part {})", units.len()), true));
                }
                of_op[i] = u;
                acc += w;
            }
            if units.is_empty() {
                units.push(unit("(part 0)", true));
            }
            "equal-parameters"
        };
        // Parameters to the first unit reading them; outputs; inputs from
        // outside the unit (each value once per unit).
        let mut owner: std::collections::HashMap<qsync_ir::ValueId, usize> = Default::default();
        let mut unit_of_node: std::collections::HashMap<NodeId, usize> = Default::default();
        for (i, &n) in order.iter().enumerate() {
            unit_of_node.insert(n, of_op[i]);
        }
        let mut read: std::collections::HashSet<(usize, qsync_ir::ValueId)> = Default::default();
        for (i, &n) in order.iter().enumerate() {
            let u = of_op[i];
            let node = graph.node(n);
            for &v in node.inputs().iter().flatten() {
                if facts.is_param(v) {
                    if let std::collections::hash_map::Entry::Vacant(e) = owner.entry(v) {
                        e.insert(u);
                        units[u].params += facts.elements(v).unwrap_or(0.0);
                    }
                    continue;
                }
                let ty = graph.ty(v);
                if !ty.dtype.is_some_and(|d| d.is_float()) {
                    continue;
                }
                let outside = match graph.producer(v) {
                    Some((p, _)) => unit_of_node.get(&p).is_some_and(|&pu| pu != u),
                    None => matches!(graph.value(v).def, qsync_ir::ValueDef::Input),
                };
                if outside && read.insert((u, v)) {
                    let bytes = ty.dtype.map_or(4.0, |d| f64::from(d.bits()) / 8.0);
                    units[u].input_bytes += facts.elements(v).unwrap_or(0.0) * bytes;
                }
            }
            for &o in node.outputs() {
                units[u].out_elems += facts.elements(o).unwrap_or(0.0);
            }
        }
        Units { units, of_op, rule }
    }

    /// The largest unit's parameter elements.
    pub fn max_params(&self) -> f64 {
        self.units.iter().map(|u| u.params).fold(0.0, f64::max)
    }

    /// Every unit's parameter elements.
    pub fn total_params(&self) -> f64 {
        self.units.iter().map(|u| u.params).sum()
    }
}

/// Memory of one device under a sharding, bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShardMemory {
    /// Its share of the FP32 master weights, gradients and optimizer state.
    pub sharded_state: f64,
    /// Unsharded weights held at a time (two units; `ShardGradOp`: all).
    pub gathered: f64,
    /// One unit's unsharded FP32 gradient before its reduce-scatter.
    pub unsharded_grad: f64,
    /// hpZ's secondary shard.
    pub secondary: f64,
    pub activations: f64,
    pub workspace: f64,
    pub total: f64,
    pub capacity: f64,
}

/// One device type under a sharding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardedDevice {
    pub name: String,
    pub count: u32,
    pub local_batch: u32,
    /// Fraction of the sharded state each of its devices holds (of the
    /// whole model; `HybridShard`: of the node's copy).
    pub share: f64,
    pub checkpoint: bool,
    pub memory: ShardMemory,
    pub fits: bool,
    /// Forward, backward (with recomputation) and optimizer step.
    pub compute_us: f64,
    /// The same plan's compute replicated (DDP: the whole optimizer step,
    /// no recomputation), what a simulation of its graph gives.
    pub replicated_compute_us: f64,
    /// FSDP's host time (its hooks' copies and bookkeeping), counted in
    /// `compute_us`.
    pub host_us: f64,
    /// Iteration time minus compute: waiting on collectives or stragglers.
    pub exposed_comm_us: f64,
    pub forward_end_us: f64,
    pub backward_end_us: f64,
    pub finish_us: f64,
}

/// One collective of a sharded iteration, in the order the stream runs them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardCollective {
    /// `all-gather`, `reduce-scatter` or `all-reduce`.
    pub kind: &'static str,
    /// `forward` or `backward`.
    pub phase: &'static str,
    pub unit: usize,
    /// `cluster` or `node`.
    pub scope: &'static str,
    /// The wire precision's name.
    pub precision: &'static str,
    /// Bytes each device receives, the largest over the types.
    pub bytes: f64,
    pub start_us: f64,
    pub end_us: f64,
}

/// A predicted sharded iteration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardedResult {
    pub spec: ShardSpec,
    pub iteration_us: f64,
    pub samples_per_s: f64,
    pub global_batch: u64,
    pub devices: Vec<ShardedDevice>,
    pub collectives: Vec<ShardCollective>,
}

impl ShardedResult {
    pub fn fits(&self) -> bool {
        self.devices.iter().all(|d| d.fits)
    }
}

/// A type's figures the sharded model reads from the predictor.
struct TypeInput {
    count: u32,
    per_node: u32,
    fwd: Vec<f64>,
    bwd: Vec<f64>,
    optimizer_us: f64,
    state: f64,
    replicated_weights: f64,
    activations: f64,
    /// Activations with checkpointing.
    checkpointed: f64,
    workspace: f64,
    capacity: f64,
}

/// The fixed part of a device's memory (all but the sharded state).
fn fixed_memory(spec: &ShardSpec, units: &Units, ti: &TypeInput, checkpoint: bool) -> ShardMemory {
    let held = spec.gather.held_bytes();
    let activations = if checkpoint { ti.checkpointed } else { ti.activations };
    let mut m = ShardMemory { activations, workspace: ti.workspace, capacity: ti.capacity, ..Default::default() };
    match spec.stage {
        Stage::Replicate => {
            m.gathered = ti.replicated_weights;
            m.sharded_state = ti.state;
        }
        Stage::ShardGradOp => {
            m.gathered = units.total_params() * held;
            m.unsharded_grad = 4.0 * units.max_params();
        }
        Stage::FullShard | Stage::HybridShard => {
            m.gathered = 2.0 * units.max_params() * held;
            m.unsharded_grad = 4.0 * units.max_params();
            if spec.hpz && spec.stage == Stage::FullShard {
                m.secondary = units.total_params() * held / f64::from(ti.per_node.max(1));
            }
        }
    }
    m
}

fn total(m: &mut ShardMemory) {
    m.total = m.sharded_state + m.gathered + m.unsharded_grad + m.secondary + m.activations + m.workspace;
}

/// Each type's share: equal (`1/N`, or `1/g` inside a node for hybrid), or
/// in proportion to the memory left after the fixed part (`uneven`).
fn shares(spec: &ShardSpec, inputs: &[TypeInput], fixed: &[ShardMemory]) -> Vec<f64> {
    match spec.stage {
        Stage::Replicate => vec![1.0; inputs.len()],
        Stage::HybridShard => inputs.iter().map(|t| 1.0 / f64::from(t.per_node.max(1))).collect(),
        Stage::ShardGradOp | Stage::FullShard => {
            let n: f64 = inputs.iter().map(|t| f64::from(t.count)).sum();
            let free: Vec<f64> = fixed.iter().map(|m| (m.capacity - m.total).max(0.0)).collect();
            let pool: f64 = inputs.iter().zip(&free).map(|(t, f)| f64::from(t.count) * f).sum();
            if spec.uneven && pool > 0.0 {
                free.iter().map(|f| f / pool).collect()
            } else {
                vec![1.0 / n.max(1.0); inputs.len()]
            }
        }
    }
}

/// Ring of `p` members each moving at most `s` bytes per step:
/// `(p−1)·s/bw + (p−1)·lat` (`bw` bytes/µs).
fn ring_steps(p: u64, s: f64, bw: f64, lat: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let steps = (p - 1) as f64;
    steps * s / bw + steps * lat
}

/// The sharded iteration of the predictor's targets under `spec`. The
/// predictor gives each type's compute per node, its replicated memory and
/// its cluster (links, nodes); `Replicate` takes its iteration as is.
pub fn predict_sharded(
    pred: &mut Predictor<'_>,
    units: &Units,
    spec: &ShardSpec,
) -> Result<ShardedResult, PredictError> {
    let n_types = pred.targets().len();
    if spec.checkpoint.len() != n_types {
        return Err(PredictError::Target {
            device: String::new(),
            reason: format!("the sharding names {} types, the cluster has {n_types}", spec.checkpoint.len()),
        });
    }
    if spec.hpz && spec.stage != Stage::FullShard {
        return Err(PredictError::Target {
            device: String::new(),
            reason: format!("hpZ needs full-shard, not {}", spec.stage.name()),
        });
    }
    let cluster = pred.cluster().clone();
    if spec.stage == Stage::HybridShard {
        let shapes: std::collections::BTreeSet<u32> =
            cluster.types.iter().flat_map(|t| t.nodes.iter().copied()).collect();
        if shapes.len() > 1 {
            return Err(PredictError::Target {
                device: String::new(),
                reason: "hybrid-shard needs every node to hold the same number of devices (shards align across nodes)"
                    .into(),
            });
        }
    }
    let mut inputs = Vec::with_capacity(n_types);
    for t in 0..n_types {
        let target = &pred.targets()[t];
        let program = pred.program(t).ok_or(crate::SimError::NoDevice(t))?;
        let mem = pred.memory(t).ok_or(crate::SimError::NoDevice(t))?;
        let mut fwd = vec![0.0; units.units.len()];
        let mut bwd = vec![0.0; units.units.len()];
        for (i, op) in program.ops.iter().enumerate() {
            let u = units.of_op.get(i).copied().unwrap_or(0);
            fwd[u] += op.cost.fwd_us;
            bwd[u] += op.cost.input_grad_us + op.cost.weight_grad_us;
        }
        let scale = pred.options().scale_of(target);
        let out_total: f64 = units.units.iter().map(|u| u.out_elems).sum();
        let act_of = |u: &Unit| if out_total > 0.0 { mem.activations * u.out_elems / out_total } else { 0.0 };
        let largest_block = units.units.iter().filter(|u| u.block).map(act_of).fold(0.0, f64::max);
        let checkpointed: f64 =
            units.units.iter().map(|u| if u.block { u.input_bytes * scale } else { act_of(u) }).sum::<f64>()
                + largest_block;
        inputs.push(TypeInput {
            count: target.count,
            per_node: target.per_node.max(1),
            fwd,
            bwd,
            optimizer_us: program.optimizer_us,
            state: mem.master_weights + mem.gradients + mem.optimizer_state,
            replicated_weights: mem.low_precision_weights,
            activations: mem.activations,
            checkpointed: checkpointed.min(mem.activations),
            workspace: mem.workspace,
            capacity: mem.capacity,
        });
    }
    let mut fixed: Vec<ShardMemory> =
        inputs.iter().zip(&spec.checkpoint).map(|(ti, &c)| fixed_memory(spec, units, ti, c)).collect();
    for m in &mut fixed {
        total(m);
    }
    let share = shares(spec, &inputs, &fixed);
    let mut devices = Vec::with_capacity(n_types);
    for t in 0..n_types {
        let mut m = fixed[t].clone();
        if spec.stage != Stage::Replicate {
            m.sharded_state = share[t] * inputs[t].state;
        }
        total(&mut m);
        let target = &pred.targets()[t];
        devices.push(ShardedDevice {
            name: target.device.name.clone(),
            count: target.count,
            local_batch: target.local_batch,
            share: share[t],
            checkpoint: spec.checkpoint[t],
            fits: m.total <= m.capacity,
            memory: m,
            compute_us: 0.0,
            replicated_compute_us: 0.0,
            host_us: 0.0,
            exposed_comm_us: 0.0,
            forward_end_us: 0.0,
            backward_end_us: 0.0,
            finish_us: 0.0,
        });
    }
    let global_batch = cluster.global_batch();
    let r = pred.result().clone();
    for (d, rd) in devices.iter_mut().zip(&r.devices) {
        d.replicated_compute_us = rd.compute_us;
    }
    if spec.stage == Stage::Replicate {
        let mut iteration = r.iteration_us;
        // Recomputing checkpointed blocks lengthens each type's backward;
        // the slowest type's recomputation lies on the critical path.
        let mut extra = 0.0f64;
        for (t, d) in devices.iter_mut().enumerate() {
            let rd = &r.devices[t];
            let re: f64 = if spec.checkpoint[t] {
                units.units.iter().zip(&inputs[t].fwd).filter(|(u, _)| u.block).map(|(_, f)| f).sum()
            } else {
                0.0
            };
            extra = extra.max(re);
            d.compute_us = rd.compute_us + re;
            d.forward_end_us = rd.forward_end_us;
            d.backward_end_us = rd.backward_end_us + re;
            d.finish_us = rd.finish_us + re;
        }
        iteration += extra;
        for d in &mut devices {
            d.exposed_comm_us = (iteration - d.compute_us).max(0.0);
        }
        let samples_per_s = if iteration > 0.0 { global_batch as f64 / (iteration * 1e-6) } else { 0.0 };
        return Ok(ShardedResult {
            spec: spec.clone(),
            iteration_us: iteration,
            samples_per_s,
            global_batch,
            devices,
            collectives: Vec::new(),
        });
    }
    let sched = Schedule::new(&cluster, spec, units, &inputs, &share, pred.options().config.algo);
    let (collectives, times) = sched.run();
    let iteration = times.iter().map(|t| t.3).fold(0.0, f64::max);
    for (t, d) in devices.iter_mut().enumerate() {
        let (compute, f_end, b_end, finish, host) = times[t];
        d.compute_us = compute;
        d.host_us = host;
        d.forward_end_us = f_end;
        d.backward_end_us = b_end;
        d.finish_us = finish;
        d.exposed_comm_us = (iteration - compute).max(0.0);
    }
    let samples_per_s = if iteration > 0.0 { global_batch as f64 / (iteration * 1e-6) } else { 0.0 };
    Ok(ShardedResult { spec: spec.clone(), iteration_us: iteration, samples_per_s, global_batch, devices, collectives })
}

/// A type's `(compute, forward end, backward end, finish, host)`, µs.
type TypeTimes = (f64, f64, f64, f64, f64);

/// The two streams of every type, stepped through the program.
struct Schedule<'a> {
    cluster: &'a crate::Cluster,
    spec: &'a ShardSpec,
    units: &'a Units,
    inputs: &'a [TypeInput],
    share: &'a [f64],
    /// How collectives across nodes run (the engine's all-reduce algorithm).
    algo: crate::AllReduceAlgo,
    /// Per type: when its communication stream is free.
    comm_free: Vec<f64>,
    out: Vec<ShardCollective>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Gather,
    Scatter,
    AllReduce,
}

impl<'a> Schedule<'a> {
    fn new(
        cluster: &'a crate::Cluster,
        spec: &'a ShardSpec,
        units: &'a Units,
        inputs: &'a [TypeInput],
        share: &'a [f64],
        algo: crate::AllReduceAlgo,
    ) -> Schedule<'a> {
        Schedule { cluster, spec, units, inputs, share, algo, comm_free: vec![0.0; inputs.len()], out: Vec::new() }
    }

    /// One type's time for a collective on unit `u` (µs), its kernels
    /// included, and the bytes its device receives.
    fn price(&self, t: usize, kind: Kind, u: usize, local: bool) -> (f64, f64) {
        let (wire, received) = self.price_wire(t, kind, u, local);
        let members = match kind {
            Kind::AllReduce => self.cluster.node_count(),
            _ if local => u64::from(self.inputs[t].per_node),
            _ => self.inputs.iter().map(|i| u64::from(i.count)).sum(),
        };
        let launch = if members > 1 { self.cluster.types[t].collective_launch_us } else { 0.0 };
        (wire + self.kernel_us(t, kind, u, local) + launch, received)
    }

    /// The host time of unit `u`'s hook for one of its collectives on type
    /// `t` (none without parameters).
    fn hook_us(&self, t: usize, u: usize) -> f64 {
        if self.units.units[u].params > 0.0 {
            self.cluster.types[t].fsdp_unit_host_us
        } else {
            0.0
        }
    }

    /// The quantize / dequantize / cast kernels of a collective on one
    /// device of type `t`, µs (see the module doc).
    fn kernel_us(&self, t: usize, kind: Kind, u: usize, local: bool) -> f64 {
        let k = &self.cluster.types[t].sync_kernels;
        let elems = self.units.units[u].params;
        let g = f64::from(self.inputs[t].per_node.max(1));
        let p: f64 = self.inputs.iter().map(|i| f64::from(i.count)).sum();
        let seconds = match kind {
            Kind::Gather if local => self.spec.gather.kernel_seconds(k, elems / g, elems),
            Kind::Gather => self.spec.gather.kernel_seconds(k, elems * self.share[t], elems),
            Kind::Scatter if local => self.spec.reduce.kernel_seconds(k, elems / g, elems, g),
            Kind::Scatter => self.spec.reduce.kernel_seconds(k, elems * self.share[t], elems, p),
            Kind::AllReduce => {
                let m = self.cluster.node_count();
                let scheme = match (self.spec.reduce, self.spec.reduce.qgz_bits()) {
                    (_, Some(b)) => crate::SyncScheme::Qgz { intra: b, inter: None, stochastic: false },
                    (ReducePrecision::Bf16, None) => crate::SyncScheme::Bf16,
                    _ => return 0.0,
                };
                if m <= 1 {
                    return 0.0;
                }
                let spec = crate::SyncSpec::new(scheme, QUANT_GROUP as u32);
                crate::sync::kernel_seconds(&spec, k, elems / g * 4.0, m, 1)
            }
        };
        seconds * 1e6
    }

    /// A collective's time on the links alone.
    fn price_wire(&self, t: usize, kind: Kind, u: usize, local: bool) -> (f64, f64) {
        let ty: &DeviceType = &self.cluster.types[t];
        let elems = self.units.units[u].params;
        let b = match kind {
            Kind::Gather => self.spec.gather.wire_bytes(),
            Kind::Scatter | Kind::AllReduce => self.spec.reduce.wire_bytes(),
        };
        let intra = ty.intra_node_gb_per_s * 1e3;
        if kind == Kind::AllReduce {
            // Hybrid: the shard all-reduced across the type's nodes, all g
            // devices of a node at once.
            let g = u64::from(self.inputs[t].per_node);
            let m = self.cluster.node_count();
            let s = elems * b / g as f64;
            if m <= 1 {
                return (0.0, 0.0);
            }
            let steps = 2.0 * (m - 1) as f64;
            return (steps / m as f64 * s / ty.network_share(g) + steps * ty.network_latency_us, steps / m as f64 * s);
        }
        if local {
            let g = u64::from(self.inputs[t].per_node);
            let s = elems * b / g as f64;
            return (ring_steps(g, s, intra, ty.intra_node_latency_us), (g - 1) as f64 * s);
        }
        // Across the whole cluster: the largest share sets each step.
        let p: u64 = self.inputs.iter().map(|i| u64::from(i.count)).sum();
        let max_share = self.share.iter().copied().fold(0.0, f64::max);
        let s = elems * b * max_share;
        let received = elems * b * (1.0 - self.share[t].min(1.0));
        let m = self.cluster.node_count();
        if self.algo == crate::AllReduceAlgo::Hierarchical && m > 1 {
            // As the engine's hierarchical all-reduce: a ring inside the
            // node, then each of its g devices' part in a ring across the m
            // nodes, all g at once (1/g of the node's network each).
            let whole = s * p as f64;
            let g = u64::from(self.inputs[t].per_node);
            let inner = ring_steps(g, whole / g as f64, intra, ty.intra_node_latency_us);
            let mut bw = ty.network_share(g);
            let mut lat = ty.network_latency_us;
            if let Some((fbw, flat)) = self.cluster.fabric_link() {
                bw = bw.min(fbw / g as f64);
                lat = lat.max(flat);
            }
            let outer = ring_steps(m, whole / (g * m) as f64, bw, lat);
            return (inner + outer, received);
        }
        let (bw, lat) = if m > 1 {
            let bw = self.cluster.types.iter().map(|d| d.network_share(1)).fold(f64::INFINITY, f64::min);
            let lat = self.cluster.types.iter().map(|d| d.network_latency_us).fold(0.0, f64::max);
            match self.cluster.fabric_link() {
                Some((fbw, flat)) => (bw.min(fbw), lat.max(flat)),
                None => (bw, lat),
            }
        } else {
            (
                self.cluster.types.iter().map(|d| d.intra_node_gb_per_s * 1e3).fold(f64::INFINITY, f64::min),
                self.cluster.types.iter().map(|d| d.intra_node_latency_us).fold(0.0, f64::max),
            )
        };
        (ring_steps(p, s, bw, lat), received)
    }

    /// Run a collective issued by each type at `issue[t]`; returns each
    /// type's end.
    fn collective(&mut self, kind: Kind, phase: &'static str, u: usize, local: bool, issue: &[f64]) -> Vec<f64> {
        if self.units.units[u].params <= 0.0 {
            return issue.to_vec();
        }
        let n = self.inputs.len();
        let priced: Vec<(f64, f64)> = (0..n).map(|t| self.price(t, kind, u, local)).collect();
        let bytes = priced.iter().map(|p| p.1).fold(0.0, f64::max);
        let precision = match kind {
            Kind::Gather => self.spec.gather.name(),
            _ => self.spec.reduce.name(),
        };
        let name = match kind {
            Kind::Gather => "all-gather",
            Kind::Scatter => "reduce-scatter",
            Kind::AllReduce => "all-reduce",
        };
        let mut ends = vec![0.0; n];
        if local {
            let mut first = f64::INFINITY;
            let mut last = 0.0f64;
            for t in 0..n {
                let start = issue[t].max(self.comm_free[t]);
                ends[t] = start + priced[t].0;
                self.comm_free[t] = ends[t];
                first = first.min(start);
                last = last.max(ends[t]);
            }
            self.out.push(ShardCollective {
                kind: name,
                phase,
                unit: u,
                scope: "node",
                precision,
                bytes,
                start_us: first,
                end_us: last,
            });
        } else {
            let start = (0..n).map(|t| issue[t].max(self.comm_free[t])).fold(0.0, f64::max);
            let dur = priced.iter().map(|p| p.0).fold(0.0, f64::max);
            let end = start + dur;
            ends.fill(end);
            self.comm_free.fill(end);
            self.out.push(ShardCollective {
                kind: name,
                phase,
                unit: u,
                scope: "cluster",
                precision,
                bytes,
                start_us: start,
                end_us: end,
            });
        }
        ends
    }

    /// The collectives in order and per type `(compute, forward end,
    /// backward end, finish)`.
    fn run(mut self) -> (Vec<ShardCollective>, Vec<TypeTimes>) {
        let n = self.inputs.len();
        let nu = self.units.units.len();
        let stage = self.spec.stage;
        let hybrid = stage == Stage::HybridShard;
        let mut cend = vec![0.0f64; n];
        let mut compute = vec![0.0f64; n];
        let mut host = vec![0.0f64; n];
        // Forward: unit u+1 gathered while u computes.
        let mut issue = vec![0.0; n];
        for u in 0..nu {
            let ready = self.collective(Kind::Gather, "forward", u, hybrid, &issue);
            for t in 0..n {
                let start = cend[t].max(ready[t]);
                issue[t] = start;
                let hook = self.hook_us(t, u);
                cend[t] = start + hook + self.inputs[t].fwd[u];
                compute[t] += hook + self.inputs[t].fwd[u];
                host[t] += hook;
            }
        }
        let f_end = cend.clone();
        // Backward, last unit first.
        let regather = matches!(stage, Stage::FullShard | Stage::HybridShard);
        let local_gather = hybrid || self.spec.hpz;
        let mut ready = cend.clone();
        if regather && nu > 0 {
            ready = self.collective(Kind::Gather, "backward", nu - 1, local_gather, &cend);
        }
        for v in (0..nu).rev() {
            let bstart: Vec<f64> = (0..n).map(|t| cend[t].max(ready[t])).collect();
            let next = if regather && v > 0 {
                self.collective(Kind::Gather, "backward", v - 1, local_gather, &bstart)
            } else {
                bstart.clone()
            };
            for t in 0..n {
                let recompute =
                    if self.spec.checkpoint[t] && self.units.units[v].block { self.inputs[t].fwd[v] } else { 0.0 };
                // The re-gather's hook before, the reduce-scatter's after.
                let hooks = self.hook_us(t, v) * if regather { 2.0 } else { 1.0 };
                let work = self.inputs[t].bwd[v] + recompute + hooks;
                cend[t] = bstart[t] + work;
                compute[t] += work;
                host[t] += hooks;
            }
            let done = self.collective(Kind::Scatter, "backward", v, hybrid, &cend);
            if hybrid {
                self.collective(Kind::AllReduce, "backward", v, false, &done);
            }
            ready = next;
        }
        let b_end = cend.clone();
        let mut times = Vec::with_capacity(n);
        for t in 0..n {
            let step = self.inputs[t].optimizer_us * self.share[t].min(1.0);
            let start = b_end[t].max(self.comm_free[t]);
            compute[t] += step;
            times.push((compute[t], f_end[t], b_end[t], start + step, host[t]));
        }
        (self.out, times)
    }
}
