//! Cost model of the gradient-synchronization schemes `qsync-runtime` runs
//! (fp32, fp16/bf16, qgZ one-shot and hierarchical, n-bit), and the choice
//! of the fastest scheme within an error budget.
//!
//! For one all-reduce of `S` f32 bytes (`E = S/4` elements) over `P` devices
//! in `N` nodes of `L`, a scheme is a sequence of phases. Each phase moves
//! bytes per device — split into the intra-node and inter-node share by
//! which peers it talks to — and costs `max(intra / B_intra, inter / B_net)`
//! plus one step latency (the network's if any byte leaves the node), then
//! the scheme's kernels (quantize, dequantize-and-accumulate, 16-bit casts)
//! at the rates of where they run ([`SyncKernels`], `seconds = r·elements +
//! c`), plus the copies between GPU and host the path makes. Kernels and
//! communication do not overlap inside one bucket.
//!
//! **Paths** ([`SyncPath`]): a compressed scheme is priced as the runtime
//! executes it. fp32 is always the engine's own all-reduce (DDP's, on its
//! communication stream), overlapping the backward pass. Otherwise:
//! - [`SyncPath::Host`] — CPU tensors (gloo or MPI): kernels on the host at
//!   the host's measured rates, on the hook's worker thread, overlapping the
//!   backward pass — but where the device is the host's own cores
//!   ([`crate::DeviceType::compute_on_host`]), the synchronization's CPU work
//!   ([`Cluster::sync_cpu_us`]) shares those cores with the backward pass,
//!   slowing both;
//! - [`SyncPath::HostStaged`] — CUDA tensors through qsync's hook with
//!   `kernels="host"` (the default): the hook copies the f32 bucket to
//!   pageable host memory and back (`2·S` over the host link), the kernels run
//!   on the host, and the NCCL communicator stages each call's send and
//!   receive buffers through the device (`2·` the bytes each phase moves,
//!   own share included); all inside the hook call, so the backward pass
//!   waits (no overlap);
//! - [`SyncPath::Device`] — `kernels="device"`: the same copies, the
//!   kernels at the GPU's rates (the device's cast model); no overlap.
//!
//! Bytes per device, as the runtime moves them (block of `m` elements at
//! `b` bits, group `G`: `m·b/8 + 4·⌈m/G⌉`):
//! - fp32: the engine's all-reduce ([`Cluster::allreduce_us`]; on a CPU
//!   device, gloo's flat ring, whose bytes and sums cost the host's cores);
//! - fp16/bf16: all-to-all of 16-bit shards then all-gather:
//!   `2 · (P−1)/P · S/2`, a flat exchange (every peer);
//! - qgZ one-shot: all-to-all of blocks, all-gather of requantized shards:
//!   `(P−1)·block(E/P)` each;
//! - qgZ hierarchical: intra-node all-to-all `(L−1)·N·block(E/P)`,
//!   inter-node all-to-all `(N−1)·block'(E/P)`, flat all-gather;
//! - n-bit: all-gather of every device's packed gradient,
//!   `(P−1)·(10 + ⌈E·b/8⌉)`.
//!
//! [`choose`] never returns a scheme predicted slower than fp32: fp32 is a
//! candidate and wins ties.
//!
//! The relative error bound of a scheme ([`SyncScheme::relative_error`]) is
//! its documented bound divided by the largest magnitude in the unit it
//! scales by (quantization group for qgZ, tensor for n-bit, the value for
//! fp16/bf16): `k/qmax` per quantization stage for qgZ (`k = 1/2`
//! round-to-nearest, `1` stochastic), `2k/(2^b−1)` for n-bit (the range
//! spans up to twice the largest magnitude), the unit roundoff twice for
//! 16-bit formats.

use serde::{Deserialize, Serialize};

use crate::{AllReduceAlgo, Cluster};

/// Kernel costs on one device type, `seconds = r·elements + c`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SyncKernels {
    /// f32 → block-quantized (range reduction, scales, codes).
    pub quantize_r: f64,
    pub quantize_c: f64,
    /// Block-quantized → f32, accumulated.
    pub dequantize_r: f64,
    pub dequantize_c: f64,
    /// f32 ↔ f16/bf16.
    pub cast16_r: f64,
    pub cast16_c: f64,
    /// f32 ↔ bf16 per element, where it differs from `cast16_r` (`None`:
    /// `cast16_r`, measured on f16). A CPU narrows to bf16 with a rounding
    /// shift, to f16 with an exponent rebias as well, so bf16 can be the
    /// cheaper of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_r: Option<f64>,
    /// Per element at int4, where it differs from int8 (`None`: int8's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize4_r: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dequantize4_r: Option<f64>,
    /// n-bit min/max packing and unpack-accumulate, per element (`None`:
    /// int8 quantize's and dequantize's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack_r: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpack_r: Option<f64>,
    /// n-bit pack and unpack-accumulate per element at 1, 2, 4 and 8 bits
    /// (the kernels' cost differs by width: codes a byte holds decide how
    /// they vectorize); `None`: `pack_r` / `unpack_r` (measured at 2 bits)
    /// at every width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbit_pack_r: Option<[f64; 4]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbit_unpack_r: Option<[f64; 4]>,
    /// The passes over a sum besides decoding, per element: zeroing it
    /// before the accumulates and dividing it by `P` after — n-bit's over
    /// the whole gradient, qgZ's over a rank's shard (`None`: free).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbit_finish_r: Option<f64>,
    /// n-bit's decoding, per element of the sum, beyond what its buffers
    /// add, where the engine decodes in one pass over the sum
    /// (`KernelEngine::unpack_mean` on the host: each cache-sized slice of
    /// the sum zeroed, every rank's codes added into it, divided by `P`,
    /// written once); `nbit_unpack_r` is then what each buffer adds. Both
    /// are fitted through the decoding of 1 and of 4 buffers (`qsyncc
    /// host-kernels`). `None`: the passes one after the other, each over
    /// the whole sum (`nbit_finish_r`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbit_decode_r: Option<f64>,
    /// qgZ's decoding, per element of the sum, beyond what its blocks
    /// add, where the engine decodes in one pass over the sum
    /// (`KernelEngine::dequant_mean` on the host: each cache-sized slice
    /// zeroed, every block added into it, divided, written once);
    /// `dequantize_r`, `dequantize4_r` and the ladder's `dequantize` rates
    /// are then what each block adds, fitted through the decoding of 4
    /// blocks and of one, and the pieces' rates are one block's whole
    /// decoding ([`PieceRates`]). `None`: the sums zeroed, and divided, in
    /// passes of their own (`zero_r`, `nbit_finish_r`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qgz_decode_r: Option<f64>,
    /// Zeroing f32 values, per element: the sums the 16-bit schemes and
    /// qgZ accumulate a shard's blocks into, and qgZ's decoding of the
    /// gathered blocks, which zeroes the gradient before it accumulates
    /// each block into it (`None`: free).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_r: Option<f64>,
    /// f32 accumulate (`a += b`), per element: what a host engine's own
    /// all-reduce computes in each reduce-scatter step (`None`: free).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum_r: Option<f64>,
    /// Host CPU seconds to move one byte between two processes through the
    /// kernel's TCP stack, sender and receiver together (`None`: free, as a
    /// GPU transport's bytes are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_r: Option<f64>,
    /// Host CPU seconds per message a rank receives through a host
    /// transport, sender and receiver together, beyond its bytes' `tcp_r`
    /// (`None`: free). Measured with the engine's all-to-all at two message
    /// sizes (`sync-bench --collective all-to-all --messages K`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_s: Option<f64>,
    /// Host CPU seconds per byte of a host engine's own all-reduce (gloo's
    /// ring under DDP's fp32 synchronization), sender and receiver
    /// together, where it differs from the transport the compressed
    /// schemes' exchanges use (`tcp_r`): DDP hands gloo its bucket in
    /// place, while qsync's hook on gloo moves every exchange through
    /// Python buffers (`None`: `tcp_r`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_tcp_r: Option<f64>,
    /// Host CPU seconds per step of that all-reduce beyond its bytes
    /// (`None`: `message_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_step_s: Option<f64>,
    /// Host CPU seconds per step of the host engine's ring all-gather
    /// (gloo's, the last phase of every compressed scheme through the DDP
    /// hook: `P−1` steps, each waiting for the step before), beyond its
    /// bytes' `tcp_r`. Measured with the transport's all-gather of a few
    /// bytes (`scripts/validate/gloo_probe.py`); gloo's ring answers far
    /// slower than its all-to-all of the same bytes (`None`: `message_s`
    /// per peer, as a flat exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gather_step_s: Option<f64>,
    /// Seconds an exchange round of a host transport waits, beyond its
    /// work at the cores' shared speed, while the rank's cores compute:
    /// its threads wait to be scheduled behind the backward pass (`None`:
    /// no wait). Measured with the transport's all-to-all in many rounds
    /// beside a compute thread in every rank, against the same alone
    /// (`scripts/validate/gloo_probe.py`); it holds for the ranks and
    /// cores of the node it was measured on. Applies only where a device
    /// computes on the host's cores, to the rounds a synchronization runs
    /// while its backward pass does ([`crate::Cluster::sync_rounds`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_round_s: Option<f64>,
    /// CPU seconds added per CPU second of synchronization work that runs
    /// interleaved with the backward pass on the same cores, the two
    /// threads' extra together: each takes the core back with its caches
    /// and TLB refilled from what the other evicted, so the synchronization's
    /// kernels and the backward's both run slower than alone (`None`: no
    /// extra). Measured with the runtime's all-reduce of a bucket beside a
    /// backward pass on the same core, against each alone
    /// (`scripts/validate/gloo_probe.py`); it holds for the cores it was
    /// measured on. Applies only where a device computes on the host's
    /// cores, to the part of the synchronization's CPU work that runs
    /// while its backward pass does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interleave_r: Option<f64>,
    /// Seconds the DDP hook's own machinery adds to each bucket it
    /// synchronizes on a device that is the host's own cores, beyond the
    /// synchronization: handing the bucket to the hook's worker thread (or
    /// running it in the call) and the result back to DDP through a
    /// future, and the hook's Python around the runtime's call. Measured
    /// with a one-bucket model's backward under the hook against the same
    /// under a hook that hands the bucket straight back, less the
    /// runtime's call (`scripts/validate/gloo_probe.py`); it holds for the
    /// ranks and cores of the node it was measured on (`None`: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_call_s: Option<f64>,
    /// DDP's own copies per gradient element on a device that is the
    /// host's own cores: the gradient into its bucket as the backward pass
    /// produces it, and the synchronized bucket back into the gradient
    /// (two f32 copies, whatever the scheme; `None`: free, as they are
    /// taken to be on a GPU, whose device memory copies them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_r: Option<f64>,
    /// DDP's own work per gradient tensor on a device that is the host's
    /// own cores, beyond [`SyncKernels::bucket_r`]'s per element: the
    /// autograd hook that marks each parameter's gradient ready, and its
    /// bookkeeping when the bucket comes back, on the training thread
    /// (`None`: nothing). It is what makes a model of many small
    /// parameters cost more than its elements say
    /// (`scripts/validate/gloo_probe.py` measures it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_tensor_s: Option<f64>,
    /// The kernels' seconds per element measured at [`LADDER`] gradient
    /// sizes, smallest first (`None`: the `r·elements + c` fits at every
    /// size). A CPU runs a kernel over a gradient that stays in its caches
    /// at up to twice the rate of one streamed from memory, which the fits,
    /// taken through the largest sizes, do not show; [`SyncKernels::at_size`]
    /// reads the rates for a gradient's size off this ladder. Not where a
    /// device computes on the host's cores and the kernels run beside its
    /// backward pass, which shares the caches
    /// ([`crate::DeviceType::host_sync_kernels`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_size: Option<[SizeRates; LADDER]>,
    /// The kernels' seconds per element at [`LADDER`] sizes, as
    /// [`SyncKernels::by_size`], measured while every core of the host
    /// runs them at once, each on its own data in a process of its own
    /// (`None`: as alone). Cores of one machine that run the same kernels
    /// together can each run them slower than one alone (on the build VM,
    /// 2 cores, the accumulating and casting passes 1.5–1.9× at times, at
    /// times not at all; arithmetic-bound quantization 1.0×). A
    /// synchronization that is not pipelined runs its kernels in lockstep
    /// on every rank (each phase starts as a collective ends), so where the
    /// ranks' cores share a machine they meet each other's:
    /// [`SyncKernels::in_lockstep`]. Holds for the cores it was measured on
    /// (the node's ranks, or emulated nodes sharing one machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corun_by_size: Option<[SizeRates; LADDER]>,
    /// The pipelined schemes' kernels as the pipeline runs them on a
    /// gradient cut into pieces (the MPI path, [`pipeline_pieces`] > 1):
    /// the kernels on a piece's own buffers alone, and those that read or
    /// write the gradient piece by piece (`None`: the whole-gradient rates,
    /// [`SyncKernels::at_size`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pieces: Option<PieceRates>,
}

/// Seconds per element of the pipelined schemes' kernels (one cast, one
/// quantization, one dequantize-accumulate) on buffers of `elements`: one
/// row of [`PieceRates`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PieceKernels {
    pub elements: f64,
    pub cast16: f64,
    pub bf16: f64,
    pub quantize: f64,
    pub dequantize: f64,
    pub quantize4: f64,
    pub dequantize4: f64,
}

impl PieceKernels {
    /// Every figure, for checks (`elements` first).
    pub fn values(&self) -> [f64; 7] {
        [self.elements, self.cast16, self.bf16, self.quantize, self.dequantize, self.quantize4, self.dequantize4]
    }

    fn cast(&self, bf16: bool) -> f64 {
        if bf16 {
            self.bf16
        } else {
            self.cast16
        }
    }

    fn quantize(&self, bits: u8) -> f64 {
        if bits == 4 {
            self.quantize4
        } else {
            self.quantize
        }
    }

    fn dequantize(&self, bits: u8) -> f64 {
        if bits == 4 {
            self.dequantize4
        } else {
            self.dequantize
        }
    }
}

/// The pipelined schemes' kernels as the runtime's pipeline runs them. A
/// rank encodes its gradient piece by piece into a piece-sized send buffer
/// and decodes the gathered pieces back into it (the gradient streamed
/// through the caches, the piece's buffers kept in them: `streamed`, per
/// gradient size), and sums the ranks' pieces of its shard and re-encodes
/// the sum on buffers of one piece alone (`cached`). Measured by `qsyncc
/// host-kernels` with the runtime's engine, piece by piece as the pipeline
/// calls it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PieceRates {
    /// On one piece's buffers (`elements`: the piece).
    pub cached: PieceKernels,
    /// Piece by piece over gradients of [`LADDER`] sizes (`elements`: the
    /// gradient), smallest first.
    pub streamed: [PieceKernels; LADDER],
}

impl PieceRates {
    /// The streamed rates for a gradient of `elements`, interpolated in
    /// the logarithm of the size between the two measured around it, the
    /// nearest end's outside the measured sizes.
    pub fn streamed_at(&self, elements: f64) -> PieceKernels {
        let (i, j, w) = bracket(self.streamed.map(|r| r.elements), elements);
        let (a, b) = (self.streamed[i], self.streamed[j]);
        let mix = |x: f64, y: f64| x + (y - x) * w;
        PieceKernels {
            elements,
            cast16: mix(a.cast16, b.cast16),
            bf16: mix(a.bf16, b.bf16),
            quantize: mix(a.quantize, b.quantize),
            dequantize: mix(a.dequantize, b.dequantize),
            quantize4: mix(a.quantize4, b.quantize4),
            dequantize4: mix(a.dequantize4, b.dequantize4),
        }
    }
}

/// The two measured sizes around `elements` among `sizes` (growing) and
/// the weight of the larger, linear in the size's logarithm; the nearest
/// end's size alone (weight 0) outside them, and the smallest for a size
/// that is not a positive number.
fn bracket(sizes: [f64; LADDER], elements: f64) -> (usize, usize, f64) {
    if elements.is_nan() || elements <= 0.0 {
        return (0, 0, 0.0);
    }
    match sizes.iter().position(|&n| n > elements) {
        Some(0) => (0, 0, 0.0),
        None => (LADDER - 1, LADDER - 1, 0.0),
        Some(i) => (i - 1, i, (elements.ln() - sizes[i - 1].ln()) / (sizes[i].ln() - sizes[i - 1].ln())),
    }
}

/// Gradient sizes `qsyncc host-kernels` measures the kernels at: the
/// largest and 1/2, 1/4, 1/8 and 1/16 of it.
pub const LADDER: usize = 5;

/// Seconds per element of each kernel on a gradient of `elements`, as
/// measured (the whole call's time over its elements, per-call costs
/// included): one rung of [`SyncKernels::by_size`]. Fields as
/// [`SyncKernels`]'s rates; `cast16` and `bf16` are one cast, `bucket` both
/// of DDP's copies.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SizeRates {
    pub elements: f64,
    pub quantize: f64,
    pub quantize4: f64,
    pub dequantize: f64,
    pub dequantize4: f64,
    pub cast16: f64,
    pub bf16: f64,
    /// At 1, 2, 4 and 8 bits.
    pub nbit_pack: [f64; 4],
    pub nbit_unpack: [f64; 4],
    pub nbit_finish: f64,
    /// [`SyncKernels::nbit_decode_r`] (absent: the passes one after the other).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbit_decode: Option<f64>,
    /// [`SyncKernels::qgz_decode_r`] (absent: passes of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qgz_decode: Option<f64>,
    pub sum: f64,
    pub bucket: f64,
}

impl SizeRates {
    /// Every figure, for checks (`elements` first).
    pub fn values(&self) -> impl Iterator<Item = f64> + '_ {
        [
            self.elements,
            self.quantize,
            self.quantize4,
            self.dequantize,
            self.dequantize4,
            self.cast16,
            self.bf16,
            self.nbit_finish,
            self.sum,
            self.bucket,
        ]
        .into_iter()
        .chain(self.nbit_pack)
        .chain(self.nbit_unpack)
        .chain(self.nbit_decode)
        .chain(self.qgz_decode)
    }
}

impl Default for SyncKernels {
    /// A memory-bound default for 500 GB/s and 5 µs per launch (the
    /// predictor replaces it with the device's cast model).
    fn default() -> Self {
        let per_byte = 1.0 / 500e9;
        SyncKernels {
            quantize_r: 2.0 * 4.0 * per_byte + 1.0 * per_byte,
            quantize_c: 15e-6,
            dequantize_r: (1.0 + 4.0) * per_byte,
            dequantize_c: 5e-6,
            cast16_r: (4.0 + 2.0) * per_byte,
            cast16_c: 5e-6,
            bf16_r: None,
            quantize4_r: None,
            dequantize4_r: None,
            pack_r: None,
            unpack_r: None,
            nbit_pack_r: None,
            nbit_unpack_r: None,
            nbit_finish_r: None,
            nbit_decode_r: None,
            qgz_decode_r: None,
            zero_r: None,
            sum_r: None,
            tcp_r: None,
            message_s: None,
            ring_tcp_r: None,
            ring_step_s: None,
            gather_step_s: None,
            busy_round_s: None,
            interleave_r: None,
            hook_call_s: None,
            bucket_r: None,
            bucket_tensor_s: None,
            by_size: None,
            corun_by_size: None,
            pieces: None,
        }
    }
}

/// Pageable copies between a GPU and its host, GB/s each way: an
/// assumption (pinned PCIe 3.0/4.0 x16 copies reach 12–25 GB/s; pageable
/// ones, through a bounce buffer, about half), until measured on the GPU
/// machine.
pub const HOST_LINK_GB_PER_S: f64 = 8.0;

impl SyncKernels {
    /// The runtime's CPU kernels on one core of a host: what `qsyncc
    /// host-kernels --threads 1` measured on this project's build machine
    /// ([`HOST_MEASURED`], the file it wrote: every kernel's rate per
    /// element, its ladder of sizes and the pipeline's pieces), without the
    /// transport's costs (`tcp_r`, `message_s`, the ring's and the
    /// all-gather's steps, `busy_round_s`), which depend on the cluster's
    /// network stack and are measured on it. Replace with your hosts' own
    /// measurement (`--host-kernels FILE`).
    pub fn host() -> SyncKernels {
        builtin_host().0
    }

    /// Where [`SyncKernels::host`]'s rates come from, in words (what a
    /// plan's manifest writes in `sync.path.host_kernels` when it prices
    /// host kernels at them).
    pub fn host_source() -> &'static str {
        &builtin_host().1
    }

    /// These kernels without the host transport's costs (`tcp_r`,
    /// `message_s`, the engine's ring and all-gather steps,
    /// `busy_round_s`, the hook's `hook_call_s`): what a host measured
    /// alone says of a cluster whose network stack was not measured.
    pub fn without_transport(self) -> SyncKernels {
        SyncKernels {
            tcp_r: None,
            message_s: None,
            ring_tcp_r: None,
            ring_step_s: None,
            gather_step_s: None,
            busy_round_s: None,
            interleave_r: None,
            hook_call_s: None,
            ..self
        }
    }

    /// The kernels as they run on a gradient (or bucket) of `elements`:
    /// the rates [`SyncKernels::by_size`] gives for that size, interpolated
    /// between the two measured sizes around it (linearly in the size's
    /// logarithm), the smallest measured size's below the ladder, with no
    /// per-call term (the rates include it). From the largest measured size
    /// up, and without a ladder, `self`: the fits, which pass through the
    /// largest size's measurement, so the two meet there. What the host
    /// transport costs is not per size and stays as it is.
    pub fn at_size(&self, elements: f64) -> SyncKernels {
        let Some(ladder) = self.by_size else { return *self };
        if elements.is_nan() || elements >= ladder[LADDER - 1].elements {
            return *self;
        }
        self.on_ladder(&ladder, elements)
    }

    /// The kernels of a synchronization that runs in lockstep on ranks
    /// whose cores share a machine, on a gradient of `elements`: the
    /// rates [`SyncKernels::corun_by_size`] gives for that size (the
    /// largest measured size's from there up), or [`SyncKernels::at_size`]'s
    /// where the host was not measured so. DDP's copies stay as they are
    /// (measured in place where a device computes on the host's cores).
    pub fn in_lockstep(&self, elements: f64) -> SyncKernels {
        match self.corun_by_size {
            Some(ladder) => SyncKernels { bucket_r: self.bucket_r, ..self.on_ladder(&ladder, elements) },
            None => self.at_size(elements),
        }
    }

    /// `self` with the rates of `ladder` at `elements`, interpolated as
    /// [`SyncKernels::at_size`] says (the nearest rung's outside it).
    fn on_ladder(&self, ladder: &[SizeRates; LADDER], elements: f64) -> SyncKernels {
        let (i, j, w) = bracket(ladder.map(|r| r.elements), elements);
        let (a, b) = (ladder[i], ladder[j]);
        let mix = |x: f64, y: f64| x + (y - x) * w;
        let mix4 = |x: [f64; 4], y: [f64; 4]| -> [f64; 4] { std::array::from_fn(|i| mix(x[i], y[i])) };
        let (pack, unpack) = (mix4(a.nbit_pack, b.nbit_pack), mix4(a.nbit_unpack, b.nbit_unpack));
        SyncKernels {
            quantize_r: mix(a.quantize, b.quantize),
            quantize_c: 0.0,
            dequantize_r: mix(a.dequantize, b.dequantize),
            dequantize_c: 0.0,
            cast16_r: mix(a.cast16, b.cast16),
            cast16_c: 0.0,
            bf16_r: Some(mix(a.bf16, b.bf16)),
            quantize4_r: Some(mix(a.quantize4, b.quantize4)),
            dequantize4_r: Some(mix(a.dequantize4, b.dequantize4)),
            pack_r: Some(pack[1]),
            unpack_r: Some(unpack[1]),
            nbit_pack_r: Some(pack),
            nbit_unpack_r: Some(unpack),
            nbit_finish_r: Some(mix(a.nbit_finish, b.nbit_finish)),
            // A ladder measured without the one-pass decoding prices the
            // passes one after the other.
            nbit_decode_r: a.nbit_decode.zip(b.nbit_decode).map(|(x, y)| mix(x, y)),
            qgz_decode_r: a.qgz_decode.zip(b.qgz_decode).map(|(x, y)| mix(x, y)),
            sum_r: Some(mix(a.sum, b.sum)),
            bucket_r: Some(mix(a.bucket, b.bucket)),
            by_size: None,
            ..*self
        }
    }

    /// Seconds to zero `elements` f32 values ([`SyncKernels::zero_r`]).
    pub fn zero(&self, elements: f64) -> f64 {
        self.zero_r.unwrap_or(0.0) * elements.max(0.0)
    }

    /// Seconds of zeroing a sum of `elements` and dividing it by `P`
    /// ([`SyncKernels::nbit_finish_r`]).
    pub fn finish(&self, elements: f64) -> f64 {
        self.nbit_finish_r.unwrap_or(0.0) * elements.max(0.0)
    }

    /// Seconds n-bit's decoding spends on a sum of `elements` beyond adding
    /// its buffers ([`SyncKernels::nbit_decode_r`], else
    /// [`SyncKernels::finish`]).
    pub fn nbit_decode(&self, elements: f64) -> f64 {
        match self.nbit_decode_r {
            Some(r) => r * elements.max(0.0),
            None => self.finish(elements),
        }
    }

    /// Seconds qgZ's one-pass decoding spends on a sum of `elements` beyond
    /// adding its blocks ([`SyncKernels::qgz_decode_r`]; 0 where the engine
    /// decodes in passes, which [`SyncKernels::zero`] and
    /// [`SyncKernels::finish`] price).
    pub fn qgz_pass(&self, elements: f64) -> f64 {
        self.qgz_decode_r.unwrap_or(0.0) * elements.max(0.0)
    }

    /// Seconds of `elements` f32 additions.
    pub fn sum(&self, elements: f64) -> f64 {
        self.sum_r.unwrap_or(0.0) * elements.max(0.0)
    }

    /// CPU seconds to move `bytes` through the host's TCP stack.
    pub fn tcp(&self, bytes: f64) -> f64 {
        self.tcp_r.unwrap_or(0.0) * bytes.max(0.0)
    }

    /// CPU seconds of `messages` received through the host transport,
    /// beyond their bytes.
    pub fn messages(&self, messages: f64) -> f64 {
        self.message_s.unwrap_or(0.0) * messages.max(0.0)
    }

    /// CPU seconds of DDP's copies of `elements` gradient elements of
    /// `tensors` parameters into their bucket and back, and its work per
    /// tensor ([`SyncKernels::bucket_r`], [`SyncKernels::bucket_tensor_s`]).
    pub fn bucket_copies(&self, elements: f64, tensors: f64) -> f64 {
        self.bucket_r.unwrap_or(0.0) * elements.max(0.0) + self.bucket_tensor_s.unwrap_or(0.0) * tensors.max(0.0)
    }

    /// CPU seconds of one step of the host engine's own all-reduce that
    /// moves `bytes` ([`SyncKernels::ring_tcp_r`], [`SyncKernels::ring_step_s`]).
    pub fn ring_step(&self, bytes: f64) -> f64 {
        self.ring_tcp_r.or(self.tcp_r).unwrap_or(0.0) * bytes.max(0.0)
            + self.ring_step_s.or(self.message_s).unwrap_or(0.0)
    }

    pub(crate) fn quantize(&self, e: f64, bits: u8) -> f64 {
        let r = if bits == 4 { self.quantize4_r.unwrap_or(self.quantize_r) } else { self.quantize_r };
        if e > 0.0 {
            r * e + self.quantize_c
        } else {
            0.0
        }
    }
    pub(crate) fn dequantize(&self, e: f64, bits: u8) -> f64 {
        let r = if bits == 4 { self.dequantize4_r.unwrap_or(self.dequantize_r) } else { self.dequantize_r };
        if e > 0.0 {
            r * e + self.dequantize_c
        } else {
            0.0
        }
    }
    fn pack(&self, e: f64, bits: u8) -> f64 {
        let r = width_rate(self.nbit_pack_r, bits).or(self.pack_r).unwrap_or(self.quantize_r);
        if e > 0.0 {
            r * e + self.quantize_c
        } else {
            0.0
        }
    }
    fn unpack(&self, e: f64, bits: u8) -> f64 {
        let r = width_rate(self.nbit_unpack_r, bits).or(self.unpack_r).unwrap_or(self.dequantize_r);
        if e > 0.0 {
            r * e + self.dequantize_c
        } else {
            0.0
        }
    }
    /// `e` f32 ↔ 16-bit casts, bf16 (`bf16`) at its own rate where one was
    /// measured.
    pub(crate) fn cast_half(&self, bf16: bool, e: f64) -> f64 {
        let r = if bf16 { self.bf16_r.unwrap_or(self.cast16_r) } else { self.cast16_r };
        if e > 0.0 {
            r * e + self.cast16_c
        } else {
            0.0
        }
    }
}

/// The rate at `bits` (1, 2, 4 or 8) of a per-width table.
fn width_rate(table: Option<[f64; 4]>, bits: u8) -> Option<f64> {
    let i = match bits {
        1 => 0,
        2 => 1,
        4 => 2,
        8 => 3,
        _ => return None,
    };
    table.map(|t| t[i])
}

/// The built-in host measurement: `qsyncc host-kernels --threads 1
/// --elements 16777216` (release build) on one core of the build machine,
/// nothing else running (docs/calibration.md has the command that rewrites
/// it). Embedded, so every build prices the same rates.
const HOST_MEASURED: &str = include_str!("../data/host-kernels.json");

/// What [`HOST_MEASURED`] holds that the model reads (the file's other
/// fields, the raw timings, are for the record).
#[derive(Deserialize)]
struct HostMeasurement {
    schema: String,
    cpu: String,
    threads: u32,
    elements: Vec<u64>,
    kernels: SyncKernels,
}

/// The built-in host's kernels (the measurement without the transport's
/// figures) and where they come from, in words: [`HOST_MEASURED`] parsed
/// once.
fn builtin_host() -> &'static (SyncKernels, String) {
    static HOST: std::sync::OnceLock<(SyncKernels, String)> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let m = builtin_host_measurement();
        let source = format!(
            "built-in: `qsyncc host-kernels` on the project's build machine ({}, {} thread(s), up to {} elements); \
             measure your hosts with it and pass --host-kernels",
            m.cpu,
            m.threads,
            m.elements.last().copied().unwrap_or(0)
        );
        (m.kernels.without_transport(), source)
    })
}

/// [`HOST_MEASURED`], parsed. A file that does not parse fails the build's
/// tests (`the_built_in_host_is_the_committed_measurement`), not a user.
fn builtin_host_measurement() -> HostMeasurement {
    let m: HostMeasurement = serde_json::from_str(HOST_MEASURED)
        .unwrap_or_else(|e| panic!("crates/sim/data/host-kernels.json is not a host-kernels file: {e}"));
    assert_eq!(m.schema, "qsync-host-kernels/1", "crates/sim/data/host-kernels.json: schema");
    m
}

/// A scheme, as far as its cost and error go (names as in `qsync-runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncScheme {
    Fp32,
    Fp16,
    Bf16,
    /// qgZ; bits 8 or 4; `inter: Some(bits)` is hierarchical.
    Qgz {
        intra: u8,
        inter: Option<u8>,
        stochastic: bool,
    },
    NBit {
        bits: u8,
        stochastic: bool,
    },
}

/// Where a compressed scheme's kernels run and whether it overlaps the
/// backward pass (see the module doc). fp32 ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SyncPath {
    /// CPU tensors: host kernels on the hook's worker thread, overlapped.
    Host,
    /// The runtime over Open MPI (`sync-bench`, MPI jobs): host kernels;
    /// the flat schemes (16-bit, one-shot qgZ, round-to-nearest) run as a
    /// pipeline of pieces whose kernels overlap the non-blocking exchanges.
    Mpi,
    /// CUDA tensors, host kernels, staged through pageable host memory, in
    /// the hook call (not overlapped). What the Python hook does by default.
    #[default]
    HostStaged,
    /// CUDA tensors, qsync's PTX kernels, staged, not overlapped.
    Device,
}

impl SyncPath {
    pub fn name(self) -> &'static str {
        match self {
            SyncPath::Host => "host",
            SyncPath::Mpi => "mpi",
            SyncPath::HostStaged => "host-staged",
            SyncPath::Device => "device",
        }
    }

    pub fn parse(s: &str) -> Result<SyncPath, String> {
        match s {
            "host" => Ok(SyncPath::Host),
            "mpi" => Ok(SyncPath::Mpi),
            "host-staged" => Ok(SyncPath::HostStaged),
            "device" => Ok(SyncPath::Device),
            _ => Err(format!("unknown synchronization path `{s}` (host, mpi, host-staged, device)")),
        }
    }

    /// Whether `scheme` on this path runs beside the backward pass.
    pub fn overlaps(self, scheme: SyncScheme) -> bool {
        scheme == SyncScheme::Fp32 || matches!(self, SyncPath::Host | SyncPath::Mpi)
    }
}

/// A scheme with its quantization group size and execution path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncSpec {
    pub scheme: SyncScheme,
    pub group: u32,
    #[serde(default)]
    pub path: SyncPath,
}

impl SyncSpec {
    pub fn new(scheme: SyncScheme, group: u32) -> SyncSpec {
        SyncSpec { scheme, group, path: SyncPath::default() }
    }

    pub fn with_path(mut self, path: SyncPath) -> SyncSpec {
        self.path = path;
        self
    }
}

impl Default for SyncSpec {
    fn default() -> Self {
        SyncSpec::new(SyncScheme::Fp32, 512)
    }
}

fn qbits(s: &str) -> Option<u8> {
    match s {
        "int8" => Some(8),
        "int4" => Some(4),
        _ => None,
    }
}

impl SyncScheme {
    /// Parses a runtime scheme name (`-ef` is accepted and costs nothing
    /// extra here; `-sr` doubles the error bound).
    pub fn parse(name: &str) -> Result<SyncScheme, String> {
        let bad = || format!("unknown synchronization scheme `{name}`");
        let mut base = name.strip_suffix("-ef").unwrap_or(name);
        let stochastic = match base.strip_suffix("-sr") {
            Some(b) => {
                base = b;
                true
            }
            None => false,
        };
        let s = match base {
            "fp32" => SyncScheme::Fp32,
            "fp16" => SyncScheme::Fp16,
            "bf16" => SyncScheme::Bf16,
            _ => {
                if let Some(b) = base.strip_prefix("nbit-") {
                    match b {
                        "1" | "2" | "4" | "8" => SyncScheme::NBit { bits: b.parse().map_err(|_| bad())?, stochastic },
                        _ => return Err(bad()),
                    }
                } else if let Some(rest) = base.strip_prefix("qgz-") {
                    let parts: Vec<&str> = rest.split('-').collect();
                    match parts.as_slice() {
                        [b] => SyncScheme::Qgz { intra: qbits(b).ok_or_else(bad)?, inter: None, stochastic },
                        [b, "hier"] => {
                            let w = qbits(b).ok_or_else(bad)?;
                            SyncScheme::Qgz { intra: w, inter: Some(w), stochastic }
                        }
                        [a, b, "hier"] => SyncScheme::Qgz {
                            intra: qbits(a).ok_or_else(bad)?,
                            inter: Some(qbits(b).ok_or_else(bad)?),
                            stochastic,
                        },
                        _ => return Err(bad()),
                    }
                } else {
                    return Err(bad());
                }
            }
        };
        if stochastic && matches!(s, SyncScheme::Fp32 | SyncScheme::Fp16 | SyncScheme::Bf16) {
            return Err(format!("`{name}`: -sr applies to quantized schemes only"));
        }
        Ok(s)
    }

    pub fn name(&self) -> String {
        let sr = |s: bool| if s { "-sr" } else { "" };
        match *self {
            SyncScheme::Fp32 => "fp32".into(),
            SyncScheme::Fp16 => "fp16".into(),
            SyncScheme::Bf16 => "bf16".into(),
            SyncScheme::Qgz { intra, inter: None, stochastic } => format!("qgz-int{intra}{}", sr(stochastic)),
            SyncScheme::Qgz { intra, inter: Some(i), stochastic } if i == intra => {
                format!("qgz-int{intra}-hier{}", sr(stochastic))
            }
            SyncScheme::Qgz { intra, inter: Some(i), stochastic } => {
                format!("qgz-int{intra}-int{i}-hier{}", sr(stochastic))
            }
            SyncScheme::NBit { bits, stochastic } => format!("nbit-{bits}{}", sr(stochastic)),
        }
    }

    /// The documented error bound relative to the largest magnitude in the
    /// scaling unit (see the module doc).
    pub fn relative_error(&self) -> f64 {
        let k = |s: bool| if s { 1.0 } else { 0.5 };
        let qmax = |b: u8| if b == 8 { 127.0 } else { 7.0 };
        match *self {
            SyncScheme::Fp32 => 0.0,
            SyncScheme::Fp16 => 2.0 * 2f64.powi(-11),
            SyncScheme::Bf16 => 2.0 * 2f64.powi(-8),
            SyncScheme::Qgz { intra, inter: None, stochastic } => 2.0 * k(stochastic) / qmax(intra),
            SyncScheme::Qgz { intra, inter: Some(i), stochastic } => {
                k(stochastic) * (1.0 / qmax(intra) + 2.0 / qmax(i))
            }
            SyncScheme::NBit { bits, stochastic } => 2.0 * k(stochastic) / f64::from((1u32 << bits) - 1),
        }
    }

    /// Every round-to-nearest scheme the chooser considers.
    pub fn candidates() -> Vec<SyncScheme> {
        let mut v = vec![SyncScheme::Fp32, SyncScheme::Fp16, SyncScheme::Bf16];
        for b in [8, 4] {
            v.push(SyncScheme::Qgz { intra: b, inter: None, stochastic: false });
        }
        for a in [8, 4] {
            for b in [8, 4] {
                v.push(SyncScheme::Qgz { intra: a, inter: Some(b), stochastic: false });
            }
        }
        for bits in [8, 4, 2, 1] {
            v.push(SyncScheme::NBit { bits, stochastic: false });
        }
        v
    }
}

/// Bytes one device receives in one phase, by hop.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct PhaseBytes {
    pub intra_node: f64,
    pub inter_node: f64,
}

fn block(m: f64, bits: u8, group: u32) -> f64 {
    m * f64::from(bits) / 8.0 + 4.0 * (m / f64::from(group.max(1))).ceil()
}

/// The communication phases of `spec` for `bytes` of f32 gradient on a
/// cluster of `p` devices, `per_node` to a node (uniform nodes).
pub fn phases(spec: &SyncSpec, bytes: f64, p: u64, per_node: u64) -> Vec<PhaseBytes> {
    let pf = p as f64;
    let l = per_node.clamp(1, p.max(1)) as f64;
    let nodes = (pf / l).max(1.0);
    let e = bytes / 4.0;
    // A flat exchange receiving `each` bytes from each of the P−1 peers.
    let flat = |each: f64| PhaseBytes { intra_node: (l - 1.0) * each, inter_node: (pf - l) * each };
    if p <= 1 {
        return Vec::new();
    }
    match spec.scheme {
        SyncScheme::Fp32 => {
            let total = 2.0 * bytes * (pf - 1.0) / pf;
            vec![PhaseBytes { intra_node: total * (l - 1.0) / (pf - 1.0), inter_node: total * (pf - l) / (pf - 1.0) }]
        }
        SyncScheme::Fp16 | SyncScheme::Bf16 => vec![flat(2.0 * e / pf), flat(2.0 * e / pf)],
        SyncScheme::Qgz { intra, inter: None, .. } => {
            vec![flat(block(e / pf, intra, spec.group)), flat(block(e / pf, intra, spec.group))]
        }
        SyncScheme::Qgz { intra, inter: Some(inter), .. } => vec![
            PhaseBytes { intra_node: (l - 1.0) * nodes * block(e / pf, intra, spec.group), inter_node: 0.0 },
            PhaseBytes { intra_node: 0.0, inter_node: (nodes - 1.0) * block(e / pf, inter, spec.group) },
            flat(block(e / pf, inter, spec.group)),
        ],
        SyncScheme::NBit { bits, .. } => vec![flat(10.0 + (e * f64::from(bits) / 8.0).ceil())],
    }
}

/// The phases of `spec` as they cross the links on `path`. Over Open MPI
/// ([`SyncPath::Mpi`]) every exchange is pairwise: [`phases`]. Through the
/// DDP hook the transport is gloo (CPU) or NCCL (GPU), whose all-gather is
/// a ring: the last phase of every compressed scheme (the all-gather of
/// reduced shards, or n-bit's of whole packed gradients) then moves `P−1`
/// pieces along each ring edge, and a node-major ring crosses each node's
/// NIC once each way — `(P−1)·piece` per node instead of the flat
/// exchange's `L·(P−L)·piece`. Bytes are per device, averaged over the
/// node's devices (`(P−1)·piece/L` across, the rest inside). On CPU
/// tensors between 2 devices, or with one device a node, the hook gathers
/// with an all-to-all instead, which moves the same bytes as the ring there.
pub fn phases_on(spec: &SyncSpec, bytes: f64, p: u64, per_node: u64, path: SyncPath) -> Vec<PhaseBytes> {
    let mut v = phases(spec, bytes, p, per_node);
    if !ends_in_ring_gather(spec, p, per_node, path) {
        return v;
    }
    let l = per_node.clamp(1, p) as f64;
    let pf = p as f64;
    if let Some(last) = v.last_mut() {
        let piece = (last.intra_node + last.inter_node) / (pf - 1.0);
        let across = if l < pf { (pf - 1.0) * piece / l } else { 0.0 };
        *last = PhaseBytes { intra_node: (pf - 1.0) * piece - across, inter_node: across };
    }
    v
}

/// Whether the last phase of `spec` over `p` devices, `per_node` to a node,
/// on `path` is the transport's ring all-gather (the DDP hook's gloo or
/// NCCL) rather than a flat exchange ([`phases_on`]). On CPU tensors the
/// hook's transport gathers with an all-to-all where that moves no more
/// bytes across nodes than the ring: between 2 devices, or with one device
/// a node (`TorchTransport._gathers_flat`). Told to
/// (`QSYNC_ALL_GATHER=measured`), the transport times both forms elsewhere
/// and keeps the faster; the model still prices the ring there: priced as
/// the cheaper of the two, the all-to-all's small exchanges (their
/// messages at the cost fitted from 512 KiB ones) came out below both
/// forms' measured times, and table 3's median error doubled
/// (docs/validation.md, the twentieth run).
fn ends_in_ring_gather(spec: &SyncSpec, p: u64, per_node: u64, path: SyncPath) -> bool {
    let flat = path == SyncPath::Host && (p == 2 || per_node <= 1);
    path != SyncPath::Mpi && p > 1 && spec.scheme != SyncScheme::Fp32 && !flat
}

/// Elements of a shard's piece in the runtime's pipelined schemes (its
/// `DEFAULT_PIPELINE_CHUNK`, 256 Ki).
pub const PIPELINE_CHUNK: f64 = 262_144.0;

/// Pieces a pipelined scheme cuts each shard into on the MPI path (1 for
/// the schemes that do not pipeline: hierarchical qgZ, n-bit, stochastic
/// rounding, which draws by index within a whole shard).
pub fn pipeline_pieces(spec: &SyncSpec, bytes: f64, p: u64) -> f64 {
    let pipelined = match spec.scheme {
        SyncScheme::Fp16 | SyncScheme::Bf16 => true,
        SyncScheme::Qgz { inter: None, stochastic, .. } => !stochastic,
        _ => false,
    };
    if !pipelined || p <= 1 {
        return 1.0;
    }
    (bytes / 4.0 / p as f64 / PIPELINE_CHUNK).ceil().max(1.0)
}

/// Seconds of the kernels `spec` runs on one device for `bytes` of gradient
/// (at the rates `k` has for a gradient of that size, [`SyncKernels::at_size`]).
pub fn kernel_seconds(spec: &SyncSpec, k: &SyncKernels, bytes: f64, p: u64, per_node: u64) -> f64 {
    kernel_seconds_in_pieces(spec, k, bytes, p, per_node, 1.0)
}

/// [`kernel_seconds`] for a scheme the runtime pipelines in `pieces` pieces
/// a shard: where `k` measured the pipeline's kernels
/// ([`SyncKernels::pieces`]) and there is more than one piece, a rank's
/// encoding of its gradient and decoding of the gathered pieces into it run
/// at the streamed rates for the gradient's size, and the sum of the ranks'
/// pieces of its shard (`E` elements in all) and its re-encoding (`E/P`) at
/// the rates on one piece's buffers.
pub fn kernel_seconds_in_pieces(
    spec: &SyncSpec,
    k: &SyncKernels,
    bytes: f64,
    p: u64,
    per_node: u64,
    pieces: f64,
) -> f64 {
    let e = bytes / 4.0;
    let pf = p.max(1) as f64;
    // The rates for this size (the piece rates, `k.pieces`, carry over).
    // Pipelined, a rank's kernels interleave with the exchanges of its
    // pieces and rarely meet the other ranks' at the same moment; whole,
    // every rank runs each kernel over the gradient at once.
    let pipelined = pieces > 1.0 && k.pieces.is_some();
    let k = &if pipelined { k.at_size(e) } else { k.in_lockstep(e) };
    if let (Some(pr), true) = (k.pieces, pipelined) {
        let (s, c) = (pr.streamed_at(e), pr.cached);
        // The passes besides the kernels as in the whole-gradient case below.
        match spec.scheme {
            SyncScheme::Fp16 | SyncScheme::Bf16 => {
                let bf16 = spec.scheme == SyncScheme::Bf16;
                return (2.0 * s.cast(bf16) + c.cast(bf16)) * e + c.cast(bf16) * e / pf + k.zero(e / pf);
            }
            SyncScheme::Qgz { intra: b, inter: None, .. } => {
                // Decoded in one pass, a piece's zeroing and division are in
                // its rates (one block's decoding: the gathered pieces' as
                // they run, the sum of `P` blocks' within one pass on a
                // piece in the caches).
                let passes = if k.qgz_decode_r.is_some() { 0.0 } else { k.finish(e / pf) + k.zero(e) };
                return (s.quantize(b) + s.dequantize(b) + c.dequantize(b)) * e + c.quantize(b) * e / pf + passes;
            }
            _ => {}
        }
    }
    let l = per_node.clamp(1, p.max(1)) as f64;
    // Besides the kernels: the 16-bit schemes and qgZ sum a shard's blocks
    // into a zeroed sum (qgZ then divides it by `P`), and qgZ zeroes the
    // gradient before it accumulates the gathered blocks into it — qgZ in
    // passes of their own, or within the one pass that decodes each sum.
    let fused = k.qgz_decode_r.is_some();
    let passes = |zero_before: f64, finished: f64, zero_after: f64| {
        if fused {
            k.qgz_pass(zero_before) + k.qgz_pass(finished) + k.qgz_pass(zero_after)
        } else {
            k.zero(zero_before) + k.finish(finished) + k.zero(zero_after)
        }
    };
    match spec.scheme {
        SyncScheme::Fp32 => 0.0,
        SyncScheme::Fp16 | SyncScheme::Bf16 => {
            let cast = |x| k.cast_half(spec.scheme == SyncScheme::Bf16, x);
            cast(e) + cast(e) + cast(e / pf) + cast(e) + k.zero(e / pf)
        }
        SyncScheme::Qgz { intra: b, inter: None, .. } => {
            k.quantize(e, b) + k.dequantize(e, b) + k.quantize(e / pf, b) + k.dequantize(e, b) + passes(0.0, e / pf, e)
        }
        SyncScheme::Qgz { intra: a, inter: Some(b), .. } => {
            // A device alone on its node sends its gradient on as the node's
            // partial: no intra-node quantization, decoding or sum.
            let (intra, partial) = if l > 1.0 { (k.quantize(e, a) + k.dequantize(e, a), e / l) } else { (0.0, 0.0) };
            intra
                + k.quantize(e / l, b)
                + k.dequantize(e / l, b)
                + k.quantize(e / pf, b)
                + k.dequantize(e, b)
                + passes(partial, e / pf, e)
        }
        SyncScheme::NBit { bits, .. } => k.pack(e, bits) + k.unpack(e * pf, bits) + k.nbit_decode(e),
    }
}

impl Cluster {
    /// Microseconds that devices of type `t` spend in one all-reduce of
    /// `bytes` under `spec` (fp32: the engine's `algo`).
    ///
    /// Every device of a node exchanges at once, so each gets `1/L` of the
    /// node's network ([`crate::DeviceType::network_share`]). With a fabric
    /// between types, the bytes a phase sends to peers of other types —
    /// `(P − P_t)/(P − L)` of its inter-node bytes, peers being spread evenly
    /// — from all `P_t` devices of this type share the fabric.
    pub fn sync_us(&self, t: usize, bytes: u64, spec: &SyncSpec, algo: AllReduceAlgo) -> f64 {
        if spec.scheme == SyncScheme::Fp32 {
            return self.allreduce_us(t, bytes, algo);
        }
        self.sync_breakdown(t, bytes, spec).total_us
    }

    /// [`Cluster::sync_us`] and [`Cluster::sync_cpu_us`] together, a
    /// compressed scheme's breakdown computed once.
    pub fn sync_us_and_cpu(&self, t: usize, bytes: u64, spec: &SyncSpec, algo: AllReduceAlgo) -> (f64, f64) {
        if spec.scheme == SyncScheme::Fp32 {
            return (self.allreduce_us(t, bytes, algo), self.sync_cpu_us(t, bytes, spec));
        }
        let b = self.sync_breakdown(t, bytes, spec);
        (b.total_us, self.host_cpu_of(t, spec, &b))
    }

    /// The part of a compressed scheme's breakdown `b` that runs on the
    /// cores a device of type `t` computes on (module doc: host paths on a
    /// CPU device).
    fn host_cpu_of(&self, t: usize, spec: &SyncSpec, b: &SyncBreakdown) -> f64 {
        let on_host_path = matches!(spec.path, SyncPath::Host | SyncPath::Mpi);
        if self.syncs_on_compute_cores(t) && on_host_path {
            b.kernel_us + b.transport_cpu_us
        } else {
            0.0
        }
    }

    /// Whether devices of type `t` synchronize on the cores they compute
    /// on: they are the host's own cores
    /// ([`crate::DeviceType::compute_on_host`]) and DDP synchronizes (more
    /// than one device).
    fn syncs_on_compute_cores(&self, t: usize) -> bool {
        self.types[t].compute_on_host && self.device_count() > 1
    }

    /// CPU microseconds that one synchronization of `bytes` under `spec`
    /// takes from the cores a device of type `t` computes on: none unless
    /// the device is the host's own cores ([`crate::DeviceType::compute_on_host`]).
    /// Then fp32 (a host engine's ring: TCP work on `2(P−1)/P·S` bytes and
    /// `2(P−1)` messages, sums of `(P−1)/P·S/4` elements) and the
    /// compressed schemes on the host paths (their kernels and transport
    /// work), on cores the node's ranks share.
    pub fn sync_cpu_us(&self, t: usize, bytes: u64, spec: &SyncSpec) -> f64 {
        if !self.syncs_on_compute_cores(t) {
            return 0.0;
        }
        let (ty, p) = (&self.types[t], self.device_count());
        if spec.scheme == SyncScheme::Fp32 {
            let nic = ty.ring_nic_cpu_us(bytes as f64 / p as f64, self.node_count());
            return crate::cluster::host_ring_cpu_us(
                p,
                bytes as f64,
                &ty.host_sync_kernels(SyncPath::Host),
                ty.host_share(),
                nic,
            );
        }
        if !matches!(spec.path, SyncPath::Host | SyncPath::Mpi) {
            return 0.0;
        }
        self.host_cpu_of(t, spec, &self.sync_breakdown(t, bytes, spec))
    }

    /// Exchange rounds that one synchronization of `bytes` under `spec`
    /// runs on cores a device of type `t` computes on: none unless the
    /// device is the host's own cores. Then fp32 (a host engine's ring) has
    /// its `2(P−1)` steps, and a compressed scheme on the host paths a
    /// round per phase that reaches a peer, per piece. Each waits
    /// [`SyncKernels::busy_round_s`] more while the backward pass computes.
    pub fn sync_rounds(&self, t: usize, bytes: u64, spec: &SyncSpec) -> f64 {
        if !self.syncs_on_compute_cores(t) {
            return 0.0;
        }
        let (ty, p) = (&self.types[t], self.device_count());
        if spec.scheme == SyncScheme::Fp32 {
            return 2.0 * (p - 1) as f64;
        }
        if !matches!(spec.path, SyncPath::Host | SyncPath::Mpi) {
            return 0.0;
        }
        let pieces = if spec.path == SyncPath::Mpi { pipeline_pieces(spec, bytes as f64, p) } else { 1.0 };
        let phases = phases_on(spec, bytes as f64, p, ty.per_node(), spec.path);
        phases.iter().filter(|ph| ph.intra_node > 0.0 || ph.inter_node > 0.0).count() as f64 * pieces
    }

    /// Microseconds one synchronization of `bytes` under `spec` waits on a
    /// device of type `t` if it runs wholly beside the backward pass: its
    /// rounds ([`Cluster::sync_rounds`]) times the host's
    /// [`SyncKernels::busy_round_s`].
    pub fn sync_busy_wait_us(&self, t: usize, bytes: u64, spec: &SyncSpec) -> f64 {
        let path = if spec.scheme == SyncScheme::Fp32 { SyncPath::Host } else { spec.path };
        let wait = self.types[t].host_sync_kernels(path).busy_round_s.unwrap_or(0.0);
        if wait > 0.0 {
            self.sync_rounds(t, bytes, spec) * wait * 1e6
        } else {
            0.0
        }
    }

    /// The fraction by which a synchronization's CPU work on the cores a
    /// device of type `t` computes on grows, with the backward's work
    /// beside it, where the two interleave ([`SyncKernels::interleave_r`]):
    /// 0 unless the device is the host's own cores and DDP synchronizes.
    pub fn sync_interleave(&self, t: usize, spec: &SyncSpec) -> f64 {
        if !self.syncs_on_compute_cores(t) {
            return 0.0;
        }
        let path = if spec.scheme == SyncScheme::Fp32 { SyncPath::Host } else { spec.path };
        self.types[t].host_sync_kernels(path).interleave_r.unwrap_or(0.0).max(0.0)
    }

    /// Microseconds the DDP hook's own machinery adds to each bucket a
    /// device of type `t` synchronizes under `spec`
    /// ([`SyncKernels::hook_call_s`]): none unless the device is the
    /// host's own cores, DDP synchronizes, and `spec` is a compressed
    /// scheme (fp32 is DDP's own all-reduce, no hook).
    pub fn hook_us(&self, t: usize, spec: &SyncSpec) -> f64 {
        if !self.syncs_on_compute_cores(t) || spec.scheme == SyncScheme::Fp32 {
            return 0.0;
        }
        self.types[t].host_sync_kernels(spec.path).hook_call_s.unwrap_or(0.0).max(0.0) * 1e6
    }

    /// Microseconds that DDP's copies of a bucket of `bytes` holding the
    /// gradients of `tensors` parameters (into the bucket and back,
    /// [`SyncKernels::bucket_r`], and its work per tensor,
    /// [`SyncKernels::bucket_tensor_s`]) take from the cores a device of
    /// type `t` computes on: none unless the device is the host's own cores
    /// and DDP synchronizes (more than one device), on cores the node's
    /// ranks share. Whatever the scheme: DDP copies before its hook.
    pub fn bucket_copy_us(&self, t: usize, bytes: u64, tensors: u64) -> f64 {
        if !self.syncs_on_compute_cores(t) {
            return 0.0;
        }
        let (ty, e) = (&self.types[t], bytes as f64 / 4.0);
        ty.host_sync_kernels(SyncPath::Host).at_size(e).bucket_copies(e, tensors as f64) * ty.host_share() * 1e6
    }

    /// Where [`Cluster::sync_us`] puts the time of a compressed scheme
    /// (`spec` not fp32, whose all-reduce the engine runs as one call): the
    /// parts that a measured run's phases can be set against.
    pub fn sync_breakdown(&self, t: usize, bytes: u64, spec: &SyncSpec) -> SyncBreakdown {
        let ty = &self.types[t];
        let p = self.device_count();
        // Nodes as the type sees them: its largest node.
        let per_node = ty.per_node();
        let intra_bw = ty.intra_node_gb_per_s * 1e3;
        let net_bw = ty.network_share(per_node);
        let fabric = self.fabric_link();
        let p_t = ty.count() as f64;
        let off_node = p.saturating_sub(per_node) as f64;
        let pieces = if spec.path == SyncPath::Mpi { pipeline_pieces(spec, bytes as f64, p) } else { 1.0 };
        let kernels = &match spec.path {
            SyncPath::Host | SyncPath::Mpi | SyncPath::HostStaged => ty.host_sync_kernels(spec.path),
            SyncPath::Device => ty.sync_kernels,
        };
        // Host-side work shares the node's cores among its ranks; the host
        // transports (gloo, Open MPI over TCP) also spend CPU on every byte.
        let share = if spec.path == SyncPath::Device { 1.0 } else { ty.host_share() };
        let tcp = matches!(spec.path, SyncPath::Host | SyncPath::Mpi);
        let (mut link_sum, mut tcp_sum, mut lat_sum, mut serial) = (0.0, 0.0, 0.0, 0.0);
        let phs = phases_on(spec, bytes as f64, p, per_node, spec.path);
        // The ring all-gather's P−1 steps, each at its measured cost, where
        // the host measured one; else its messages as a flat exchange's.
        let ring_step = kernels.gather_step_s.filter(|_| ends_in_ring_gather(spec, p, per_node, spec.path));
        for (i, ph) in phs.iter().enumerate() {
            // A phase with nobody to reach (hierarchical qgZ's intra-node
            // phase with one device a node, its inter-node one on one
            // node) sends nothing and waits for nobody.
            if ph.intra_node == 0.0 && ph.inter_node == 0.0 {
                continue;
            }
            let mut lat = if ph.inter_node > 0.0 { ty.network_latency_us } else { ty.intra_node_latency_us };
            let mut link = (ph.intra_node / intra_bw).max(ph.inter_node / net_bw);
            if let Some((fbw, flat)) = fabric {
                if ph.inter_node > 0.0 && off_node > 0.0 {
                    let crossing = ph.inter_node * (p as f64 - p_t) / off_node * p_t;
                    link = link.max(crossing / fbw);
                    lat = lat.max(flat);
                }
            }
            // Messages a rank receives in the phase: one from each peer the
            // phase reaches, per piece.
            let peers = match (ph.intra_node > 0.0, ph.inter_node > 0.0) {
                (true, true) => p as f64 - 1.0,
                (true, false) => per_node as f64 - 1.0,
                (false, true) => (p as f64 / per_node.max(1) as f64).ceil() - 1.0,
                (false, false) => 0.0,
            };
            let messages = match ring_step {
                Some(step) if i + 1 == phs.len() => (p as f64 - 1.0) * step,
                _ => kernels.messages(pieces * peers),
            };
            // The NIC's own work on the bytes crossing nodes, where it lands
            // on the host's cores (`nic_cpu_s_per_byte`; 0 for a NIC that
            // offloads it).
            let cpu = if tcp {
                (kernels.tcp(ph.intra_node + ph.inter_node) + messages) * share * 1e6 + ty.nic_cpu_us(ph.inter_node)
            } else {
                0.0
            };
            link_sum += link;
            tcp_sum += cpu;
            lat_sum += pieces * lat;
            // A phase streams its bytes while the stack works on them.
            serial += link.max(cpu) + pieces * lat;
        }
        let staging = match spec.path {
            SyncPath::Host | SyncPath::Mpi => 0.0,
            SyncPath::HostStaged | SyncPath::Device => {
                let moved: f64 =
                    phs.iter().map(|ph| (ph.intra_node + ph.inter_node) * p as f64 / (p as f64 - 1.0).max(1.0)).sum();
                (2.0 * bytes as f64 + 2.0 * moved) / (ty.host_link_gb_per_s * 1e3)
            }
        };
        let k = kernel_seconds_in_pieces(spec, kernels, bytes as f64, p, per_node, pieces) * share * 1e6;
        let total_us = if pieces > 1.0 {
            // Pieces on the wire while others are in the kernels: the link
            // against the CPU (kernels and the stack's work on the bytes,
            // one pool of cores), the longer side, plus what of one piece
            // the longer side cannot overlap as the pipeline fills and
            // drains. Wire-bound: a piece's kernels (the first piece's
            // encoding before anything can be sent, the last one's decoding
            // after everything arrived). CPU-bound, on cores a rank has to
            // itself: a piece of the shorter of the two stages, the kernels
            // or the exchange (which streams its bytes while the stack
            // works on them: the longer of the two), as the rank waits for
            // its first piece's bytes and decodes its last. CPU-bound, on
            // cores the node's ranks share: the cores stay busy with the
            // other ranks' work while one rank waits, from the first kernel
            // to the last, but for the wire time of a piece beyond its
            // stack time, if any.
            let (wire, cpu) = (link_sum + lat_sum, k + tcp_sum);
            let unhidden = if wire >= cpu {
                k
            } else if share > 1.0 {
                (wire - tcp_sum).max(0.0)
            } else {
                k.min(wire.max(tcp_sum))
            };
            wire.max(cpu) + unhidden / pieces + staging
        } else {
            serial + staging + k
        };
        SyncBreakdown {
            kernel_us: k,
            link_us: link_sum,
            latency_us: lat_sum,
            transport_cpu_us: tcp_sum,
            staging_us: staging,
            pieces,
            total_us,
        }
    }
}

/// The parts of one compressed synchronization's predicted time, per device
/// (microseconds). They do not add up to `total_us`: a phase lasts the
/// longer of its link time and its transport CPU time, and a pipelined
/// scheme (`pieces > 1`) overlaps the wire with the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SyncBreakdown {
    /// The scheme's kernels (quantize, dequantize, pack, unpack-accumulate),
    /// on the cores the node's ranks share.
    pub kernel_us: f64,
    /// Bytes on the links, every phase's slower link.
    pub link_us: f64,
    /// Link latency, per phase and piece.
    pub latency_us: f64,
    /// The host transport's CPU work on the bytes and messages.
    pub transport_cpu_us: f64,
    /// Copies between device and host memory (host-staged and device paths).
    pub staging_us: f64,
    /// Pieces a pipelined scheme streams (1: not pipelined).
    pub pieces: f64,
    /// What [`Cluster::sync_us`] returns.
    pub total_us: f64,
}

/// What [`choose`] decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SyncChoice {
    pub scheme: String,
    pub predicted_us: f64,
    pub fp32_us: f64,
    pub relative_error: f64,
    /// Every candidate within budget: `(name, µs)`, fastest first.
    pub considered: Vec<(String, f64)>,
}

/// The fastest scheme whose relative error is within `error_budget` for
/// synchronizing `gradient_bytes` in DDP buckets of `bucket_cap_bytes` on
/// `cluster`, compressed schemes run on `path` (the slowest device type
/// decides each bucket). fp32 when no compressed scheme is strictly faster.
/// This compares synchronization time alone; the planner compares whole
/// iterations, where a path that does not overlap pays its full time.
pub fn choose(
    cluster: &Cluster,
    gradient_bytes: u64,
    bucket_cap_bytes: u64,
    error_budget: f64,
    group: u32,
    algo: AllReduceAlgo,
    path: SyncPath,
) -> SyncChoice {
    let cap = bucket_cap_bytes.max(1);
    let mut buckets = vec![cap; (gradient_bytes / cap) as usize];
    if !gradient_bytes.is_multiple_of(cap) {
        buckets.push(gradient_bytes % cap);
    }
    let cost = |spec: &SyncSpec| -> f64 {
        buckets
            .iter()
            .map(|&b| (0..cluster.types.len()).map(|t| cluster.sync_us(t, b, spec, algo)).fold(0.0, f64::max))
            .sum()
    };
    let fp32_us = cost(&SyncSpec::new(SyncScheme::Fp32, group).with_path(path));
    let mut considered: Vec<(SyncScheme, f64)> = SyncScheme::candidates()
        .into_iter()
        .filter(|s| s.relative_error() <= error_budget)
        .map(|s| (s, cost(&SyncSpec::new(s, group).with_path(path))))
        .collect();
    // Stable: fp32 is first among equals, so ties keep fp32.
    considered.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (best, us) = considered.first().copied().unwrap_or((SyncScheme::Fp32, fp32_us));
    SyncChoice {
        scheme: best.name(),
        predicted_us: us,
        fp32_us,
        relative_error: best.relative_error(),
        considered: considered.iter().map(|(s, t)| (s.name(), *t)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceType;

    #[test]
    fn the_built_in_host_is_the_committed_measurement() {
        let file = builtin_host_measurement().kernels;
        let k = SyncKernels::host();
        // Every kernel `host-kernels` measures is there, a positive rate.
        let rates = [
            ("quantize_r", Some(k.quantize_r)),
            ("dequantize_r", Some(k.dequantize_r)),
            ("cast16_r", Some(k.cast16_r)),
            ("bf16_r", k.bf16_r),
            ("quantize4_r", k.quantize4_r),
            ("dequantize4_r", k.dequantize4_r),
            ("pack_r", k.pack_r),
            ("unpack_r", k.unpack_r),
            ("nbit_finish_r", k.nbit_finish_r),
            ("nbit_decode_r", k.nbit_decode_r),
            ("qgz_decode_r", k.qgz_decode_r),
            ("zero_r", k.zero_r),
            ("sum_r", k.sum_r),
            ("bucket_r", k.bucket_r),
        ];
        for (what, r) in rates {
            let r = r.unwrap_or_else(|| panic!("{what} missing from the built-in host"));
            assert!(r.is_finite() && r > 0.0 && r < 1e-7, "{what} = {r}");
        }
        for table in [k.nbit_pack_r, k.nbit_unpack_r] {
            assert!(table.expect("n-bit rates by width").iter().all(|r| r.is_finite() && *r > 0.0));
        }
        let ladder = k.by_size.expect("the size ladder");
        assert!(ladder.windows(2).all(|w| w[0].elements < w[1].elements));
        assert!(k.pieces.is_some());
        // As measured, but for the transport's costs, which are the
        // cluster's (the file's `tcp_r` is this machine's loopback).
        assert!(file.tcp_r.is_some());
        assert_eq!(k, file.without_transport());
        let m = builtin_host_measurement();
        assert!(SyncKernels::host_source().contains(&m.cpu) && m.threads == 1, "{}", SyncKernels::host_source());
        assert_eq!(m.elements.last(), Some(&16_777_216), "the ladder tops out at 64 MiB of f32");
        assert!(k.tcp_r.is_none() && k.message_s.is_none() && k.ring_tcp_r.is_none() && k.ring_step_s.is_none());
        assert!(k.gather_step_s.is_none() && k.busy_round_s.is_none() && k.corun_by_size.is_none());
    }

    /// Kernels that cost nothing, so a test prices communication alone.
    fn free_kernels() -> SyncKernels {
        SyncKernels {
            quantize_r: 0.0,
            quantize_c: 0.0,
            dequantize_r: 0.0,
            dequantize_c: 0.0,
            cast16_r: 0.0,
            cast16_c: 0.0,
            ..SyncKernels::default()
        }
    }

    #[test]
    fn names_round_trip() {
        for s in SyncScheme::candidates() {
            assert_eq!(SyncScheme::parse(&s.name()), Ok(s));
        }
        assert!(SyncScheme::parse("qgz-int4-hier-sr-ef").is_ok());
        assert!(SyncScheme::parse("fp16-sr").is_err());
        assert!(SyncScheme::parse("nbit-3").is_err());
    }

    #[test]
    fn qgz_fractions_by_hand() {
        // 8 ranks, 1 node, 2^20 f32 elements, group 512: every shard is
        // 131072 elements = 256 groups. int8 block: 131072 + 1024 bytes.
        let bytes = 4.0 * (1u64 << 20) as f64;
        let ring = 2.0 * bytes * 7.0 / 8.0;
        let spec = SyncSpec::new(SyncScheme::Qgz { intra: 8, inter: None, stochastic: false }, 512);
        let total: f64 = phases(&spec, bytes, 8, 8).iter().map(|p| p.intra_node + p.inter_node).sum();
        assert_eq!(total, 2.0 * 7.0 * (131072.0 + 1024.0));
        assert!((total / ring - (1.0 + 4.0 / 512.0) / 4.0).abs() < 1e-12);
        let spec4 = SyncSpec::new(SyncScheme::Qgz { intra: 4, inter: None, stochastic: false }, 512);
        let total4: f64 = phases(&spec4, bytes, 8, 8).iter().map(|p| p.intra_node + p.inter_node).sum();
        assert_eq!(total4, 2.0 * 7.0 * (65536.0 + 1024.0));
    }

    #[test]
    fn hierarchical_keeps_most_bytes_inside_the_node() {
        let bytes = 64e6;
        let one = SyncSpec::new(SyncScheme::Qgz { intra: 4, inter: None, stochastic: false }, 512);
        let hier = SyncSpec::new(SyncScheme::Qgz { intra: 4, inter: Some(4), stochastic: false }, 512);
        let inter = |s: &SyncSpec| phases(s, bytes, 16, 8).iter().map(|p| p.inter_node).sum::<f64>();
        // Reduce-scatter part: one-shot sends 8/16 of its blocks off-node,
        // hierarchical 1/16; both all-gather flat.
        assert!(inter(&hier) < inter(&one));
    }

    #[test]
    fn compressed_exchanges_share_the_node_nic() {
        // 2 nodes × 4 devices, 1e5 B/µs inside, one NIC of 1 GB/s = 1e3 B/µs
        // per node; free kernels. fp16 of S = 8e6 B (E = 2e6): two flat
        // phases, each receiving 2·E/P = 5e5 B from each of the P−1 = 7
        // peers: 3 inside (1.5e6 B), 4 outside (2e6 B). The 4 devices of a
        // node share the NIC: 2e6 B / (1e3/4) = 8000 µs per phase (the
        // intra part, 15 µs, hides under it), plus 20 µs latency.
        let free = free_kernels();
        let c = Cluster::new(vec![DeviceType::new("a", 8, 4, 1).with_bandwidth(100.0, 1.0).with_host(free, 1.0)]);
        // The MPI path: every exchange pairwise (the hook's ring all-gather is
        // the next test's), one piece (E/P < 2^18: nothing to pipeline).
        let spec = SyncSpec::new(SyncScheme::Fp16, 512).with_path(SyncPath::Mpi);
        assert_eq!(c.sync_us(0, 8_000_000, &spec, AllReduceAlgo::Hierarchical), 2.0 * (8000.0 + 20.0));
        // A fabric of 0.5 GB/s between two such types (4 + 4 devices, one node
        // each): each device sends its 2e6 B of a phase to the other type's
        // 4 devices, all of them inter-node; 4 devices × 2e6 B = 8e6 B over
        // 5e2 B/µs = 16000 µs per phase, latency max(20, 50) = 50.
        let two = Cluster::new(vec![
            DeviceType::new("a", 4, 4, 1).with_bandwidth(100.0, 1.0).with_host(free, 1.0),
            DeviceType::new("b", 4, 4, 1).with_bandwidth(100.0, 1.0).with_host(free, 1.0),
        ])
        .with_fabric(Some(crate::cluster::Fabric { gb_per_s: 0.5, latency_us: 50.0 }));
        assert_eq!(two.sync_us(0, 8_000_000, &spec, AllReduceAlgo::Hierarchical), 2.0 * (16000.0 + 50.0));
    }

    #[test]
    fn the_hooks_all_gather_is_a_ring() {
        // fp16, 2 nodes × 2 devices, E = 2^20: pieces of 2E/P = 2^19 B. The
        // reduce-scatter is a flat exchange on every path: 1 peer inside,
        // 2 outside. The all-gather: MPI's is flat too (2 pieces across per
        // device, 4 per node); the hook's ring crosses each node once with
        // P−1 = 3 pieces, 1.5 per device.
        let spec = SyncSpec::new(SyncScheme::Fp16, 512);
        let piece = 2f64.powi(19);
        let mpi = phases_on(&spec, 4.0 * 2f64.powi(20), 4, 2, SyncPath::Mpi);
        assert_eq!(mpi[1], PhaseBytes { intra_node: piece, inter_node: 2.0 * piece });
        let hook = phases_on(&spec, 4.0 * 2f64.powi(20), 4, 2, SyncPath::Host);
        assert_eq!(hook[0], mpi[0]);
        assert_eq!(hook[1], PhaseBytes { intra_node: 1.5 * piece, inter_node: 1.5 * piece });
    }

    #[test]
    fn the_hooks_ring_all_gather_pays_its_measured_steps() {
        // n-bit 2 (one phase: the all-gather of packed gradients), 2 nodes
        // × 2 devices of one core a node (share 2), free kernels, no bytes'
        // cost, links of 1e5 B/µs inside and out, 20 µs latency; 100 µs a
        // message, 1 ms a step of the ring all-gather. E = 4000 elements:
        // 10 + 1000 B a device, so the link time is 0.04 µs, under the CPU.
        // A flat exchange (the MPI path) receives from 3 peers: 3 · 100 µs
        // · 2 = 600 µs, + 20 µs latency. Through the hook, gloo's ring: 3
        // steps of 1 ms · 2 = 6000 µs, + 20. Without a measured step the
        // hook's ring is priced as the flat exchange's messages.
        let k = SyncKernels { message_s: Some(1e-4), gather_step_s: Some(1e-3), ..free_kernels() };
        let ty = |k| {
            DeviceType::new("cpu", 4, 2, 1).with_bandwidth(100.0, 800.0).with_host(k, 10.0).with_host_cores(Some(1))
        };
        let c = Cluster::new(vec![ty(k)]);
        let nbit = SyncSpec::new(SyncScheme::NBit { bits: 2, stochastic: false }, 512);
        let at = |c: &Cluster, path| c.sync_breakdown(0, 16_000, &nbit.with_path(path));
        let lat = c.types[0].network_latency_us;
        let (mpi, hook) = (at(&c, SyncPath::Mpi), at(&c, SyncPath::Host));
        assert!((mpi.transport_cpu_us - 600.0).abs() < 1e-6, "{mpi:?}");
        assert!((hook.transport_cpu_us - 6000.0).abs() < 1e-6, "{hook:?}");
        assert!((hook.total_us - (6000.0 + lat)).abs() < 1e-6, "{hook:?}");
        let unmeasured = Cluster::new(vec![ty(SyncKernels { gather_step_s: None, ..k })]);
        assert!((at(&unmeasured, SyncPath::Host).transport_cpu_us - 600.0).abs() < 1e-6);
        // fp16 (two phases): only the last, the all-gather, is the ring.
        let fp16 = SyncSpec::new(SyncScheme::Fp16, 512).with_path(SyncPath::Host);
        let b = c.sync_breakdown(0, 16_000, &fp16);
        assert!((b.transport_cpu_us - (600.0 + 6000.0)).abs() < 1e-6, "{b:?}");
    }

    #[test]
    fn the_hooks_gather_is_flat_where_it_moves_no_more_bytes() {
        // As the test above, with 100 µs a message and 1 ms a ring step, on
        // a core a node. 4 nodes × 1 device: the hook's transport gathers
        // with an all-to-all (one device a node), n-bit 2 pays 3 peers'
        // messages, 3 · 100 µs, not 3 ring steps; and its bytes are the
        // flat exchange's, which here are the ring's. 2 devices on one node
        // (share 2): 1 peer · 100 µs · 2. Over NCCL (the staged path) the
        // all-gather stays the ring, and so does gloo's with 2 devices a
        // node of 4: 3 steps of 1 ms · 2.
        let k = SyncKernels { message_s: Some(1e-4), gather_step_s: Some(1e-3), ..free_kernels() };
        let nbit = SyncSpec::new(SyncScheme::NBit { bits: 2, stochastic: false }, 512).with_path(SyncPath::Host);
        let ty = |n, per_node| {
            DeviceType::new("cpu", n, per_node, 1)
                .with_bandwidth(100.0, 800.0)
                .with_host(k, 10.0)
                .with_host_cores(Some(1))
        };
        let alone = Cluster::new(vec![ty(4, 1)]);
        let b = alone.sync_breakdown(0, 16_000, &nbit);
        assert!((b.transport_cpu_us - 300.0).abs() < 1e-6, "{b:?}");
        assert_eq!(phases_on(&nbit, 16_000.0, 4, 1, SyncPath::Host), phases(&nbit, 16_000.0, 4, 1));
        let pair = Cluster::new(vec![ty(2, 2)]);
        let b = pair.sync_breakdown(0, 16_000, &nbit);
        assert!((b.transport_cpu_us - 200.0).abs() < 1e-6, "{b:?}");
        assert!(ends_in_ring_gather(&nbit, 4, 1, SyncPath::HostStaged));
        // With 2 devices a node the hook's gloo gather stays the ring.
        let b = Cluster::new(vec![ty(4, 2)]).sync_breakdown(0, 16_000, &nbit);
        assert!((b.transport_cpu_us - 3.0 * 1000.0 * 2.0).abs() < 1e-6, "{b:?}");
    }

    #[test]
    fn the_mpi_path_pipelines_the_flat_schemes() {
        // 1 node × 4 devices, 1e5 B/µs, 5 µs latency; casts at 1 ns per
        // element. fp16 of S = 16 MiB (E = 2^22): shard 2^20 elements, four
        // pieces of 2^18. Communication: two phases of 3 peers × 2·E/P =
        // 3·2^21 B at 1e5 B/µs = 62.91 µs each, plus 4 pieces × 5 µs latency.
        // Kernels: (3E + E/P)·1 ns = 13107.2 µs. Pipelined: the longer
        // side plus a piece of the shorter: 13107.2 + comm/4.
        let k = SyncKernels { cast16_r: 1e-9, ..free_kernels() };
        let c = Cluster::new(vec![DeviceType::new("a", 4, 4, 1).with_host(k, 10.0)]);
        let spec = SyncSpec::new(SyncScheme::Fp16, 512);
        let bytes = 16u64 << 20;
        let e = (1u64 << 22) as f64;
        let comm = 2.0 * (3.0 * 2f64.powi(21) / 1e5 + 4.0 * 5.0);
        let kern = (3.0 * e + e / 4.0) * 1e-3;
        assert_eq!(pipeline_pieces(&spec, bytes as f64, 4), 4.0);
        let mpi = c.sync_us(0, bytes, &spec.with_path(SyncPath::Mpi), AllReduceAlgo::Ring);
        assert!((mpi - (kern + comm / 4.0)).abs() < 1e-6, "{mpi}");
        // The stack at 10 ns a byte and casts at 0.1 ns an element: the CPU
        // (kernels 1310.72 µs and the stack's 2 × 62914.56) is the longer
        // side. Each rank on cores of its own: the pipeline fills and
        // drains with one piece of its shorter stage, the kernels (a
        // piece's exchange streams its bytes while the stack works on them:
        // the stack's part is the longer).
        let k = SyncKernels { cast16_r: 1e-10, tcp_r: Some(1e-8), ..free_kernels() };
        let c2 = Cluster::new(vec![DeviceType::new("a", 4, 4, 1).with_host(k, 10.0)]);
        let (kern10, stack) = (kern / 10.0, 2.0 * 3.0 * 2f64.powi(21) * 1e-2);
        let mpi = c2.sync_us(0, bytes, &spec.with_path(SyncPath::Mpi), AllReduceAlgo::Ring);
        assert!((mpi - (kern10 + stack + kern10 / 4.0)).abs() < 1e-6, "{mpi}");
        // The node's 4 ranks on one core: 4× the CPU, which the other
        // ranks keep busy while one waits; the wire (145.83 µs) never holds
        // it up, as the stack's work on a piece outlasts its wire time.
        let c2s = Cluster::new(vec![DeviceType::new("a", 4, 4, 1).with_host(k, 10.0).with_host_cores(Some(1))]);
        let mpi = c2s.sync_us(0, bytes, &spec.with_path(SyncPath::Mpi), AllReduceAlgo::Ring);
        assert!((mpi - 4.0 * (kern10 + stack)).abs() < 1e-6, "{mpi}");
        // Two cores for the 4 ranks, the stack at 0.1 ns a byte (2 ×
        // 1258.29 µs) and the link at 3200 B/µs (wire 2 × (1966.08 + 20)
        // µs): the CPU (2 × (1310.72 + 1258.29)) is the longer side, but a
        // piece's bytes take longer on the wire than the stack's work on
        // them; the cores wait that difference, a piece's worth, as the
        // pipeline fills and drains.
        let k = SyncKernels { cast16_r: 1e-10, tcp_r: Some(1e-10), ..free_kernels() };
        let c3 = Cluster::new(vec![DeviceType::new("a", 4, 4, 1)
            .with_bandwidth(3.2, 3.2)
            .with_host(k, 10.0)
            .with_host_cores(Some(2))]);
        let wire = 2.0 * (3.0 * 2f64.powi(21) / 3200.0 + 4.0 * 5.0);
        let stack = 2.0 * (2.0 * 3.0 * 2f64.powi(21) * 1e-4);
        assert!(stack < wire && wire < 2.0 * kern10 + stack);
        let mpi = c3.sync_us(0, bytes, &spec.with_path(SyncPath::Mpi), AllReduceAlgo::Ring);
        assert!((mpi - (2.0 * kern10 + stack + (wire - stack) / 4.0)).abs() < 1e-6, "{mpi}");
        // On the hook's path (gloo: blocking exchanges) the two add up.
        let host = c.sync_us(0, bytes, &spec.with_path(SyncPath::Host), AllReduceAlgo::Ring);
        assert!((host - (kern + 2.0 * (3.0 * 2f64.powi(21) / 1e5 + 5.0))).abs() < 1e-6, "{host}");
        // Hierarchical qgZ and n-bit do not pipeline.
        let nbit = SyncSpec::new(SyncScheme::NBit { bits: 2, stochastic: false }, 512);
        assert_eq!(pipeline_pieces(&nbit, bytes as f64, 4), 1.0);
    }

    #[test]
    fn bf16_casts_at_its_own_rate_where_measured() {
        // 4 devices, E = 2^20 elements (4 MiB of f32): a 16-bit scheme
        // narrows E, widens E, narrows the E/4 mean and widens E — 3.25·E
        // casts. f16 at 1 ns an element: 3.25·2^20 ns = 3407.872 µs; bf16
        // at its own 0.5 ns: 1703.936 µs; bf16 without a rate of its own
        // takes f16's.
        let e = (1u64 << 20) as f64;
        let spec = |s| SyncSpec::new(s, 512);
        let k = SyncKernels { cast16_r: 1e-9, bf16_r: Some(5e-10), ..free_kernels() };
        let f16 = kernel_seconds(&spec(SyncScheme::Fp16), &k, 4.0 * e, 4, 4) * 1e6;
        let bf16 = kernel_seconds(&spec(SyncScheme::Bf16), &k, 4.0 * e, 4, 4) * 1e6;
        assert!((f16 - 3407.872).abs() < 1e-6, "{f16}");
        assert!((bf16 - 1703.936).abs() < 1e-6, "{bf16}");
        let same = SyncKernels { bf16_r: None, ..k };
        let bf16 = kernel_seconds(&spec(SyncScheme::Bf16), &same, 4.0 * e, 4, 4) * 1e6;
        assert!((bf16 - 3407.872).abs() < 1e-6, "{bf16}");
    }

    #[test]
    fn the_schemes_pay_for_zeroing_and_dividing_their_sums() {
        // 8 devices, 2 a node, E = 2^20 elements, kernels free but zeroing
        // (1 ns an element) and zero-and-divide (2 ns an element):
        // - fp16 zeroes the sum of its shard, E/8: 131.072 µs;
        // - one-shot qgZ zeroes and divides its shard's sum (E/8 at 2 ns,
        //   262.144 µs) and zeroes the gradient before it decodes the
        //   gathered blocks into it (E at 1 ns, 1048.576 µs): 1310.72 µs;
        // - hierarchical qgZ also zeroes its node partial, E/2 (524.288
        //   µs): 1835.008 µs;
        // - n-bit zeroes and divides the whole gradient's sum: 2097.152 µs.
        let e = (1u64 << 20) as f64;
        let spec = |s| SyncSpec::new(s, 512);
        let k = SyncKernels { zero_r: Some(1e-9), nbit_finish_r: Some(2e-9), ..free_kernels() };
        let scheme = |name| SyncScheme::parse(name).expect("a scheme");
        for (name, want) in
            [("fp16", 131.072), ("qgz-int8", 1310.72), ("qgz-int8-int4-hier", 1835.008), ("nbit-2", 2097.152)]
        {
            let got = kernel_seconds(&spec(scheme(name)), &k, 4.0 * e, 8, 2) * 1e6;
            assert!((got - want).abs() < 1e-6, "{name}: {got} µs, want {want}");
        }
        // Unmeasured, the passes are free.
        let bare = SyncKernels { zero_r: None, nbit_finish_r: None, ..k };
        assert_eq!(kernel_seconds(&spec(scheme("qgz-int8")), &bare, 4.0 * e, 8, 2), 0.0);
        // Decoded in one pass (0.5 ns an element of each sum beyond its
        // blocks), qgZ pays that pass instead of its zeroing and division:
        // one-shot over its shard's sum and the gathered gradient, (E/8 + E)
        // at 0.5 ns = 589.824 µs; hierarchical over its node partial too,
        // + E/2 at 0.5 ns = 851.968 µs. fp16 and n-bit keep theirs.
        let fused = SyncKernels { qgz_decode_r: Some(0.5e-9), ..k };
        for (name, want) in
            [("fp16", 131.072), ("qgz-int8", 589.824), ("qgz-int8-int4-hier", 851.968), ("nbit-2", 2097.152)]
        {
            let got = kernel_seconds(&spec(scheme(name)), &fused, 4.0 * e, 8, 2) * 1e6;
            assert!((got - want).abs() < 1e-6, "{name} in one pass: {got} µs, want {want}");
        }
    }

    #[test]
    fn a_device_alone_on_its_node_skips_the_intra_node_stage() {
        // qgz-int8-int4-hier, E = 2^20 elements, quantize 1 ns an element
        // at either width, decode 2 ns an element of the blocks, the rest
        // free. With 2 devices a node of 8 it pays E at int8 both ways
        // (3 ns·E), its partial E/2 (3 ns·E/2), its shard's re-encoding E/8
        // (1 ns·E/8) and the gathered decoding E (2 ns·E): 6.625 ns·E =
        // 6946.816 µs. Alone on its node there is no int8 stage and the
        // partial is the whole gradient: 3 + 0.125 + 2 = 5.125 ns·E =
        // 5373.952 µs, one-shot int4's own.
        let e = (1u64 << 20) as f64;
        let k = SyncKernels {
            quantize_r: 1e-9,
            quantize4_r: Some(1e-9),
            dequantize_r: 2e-9,
            dequantize4_r: Some(2e-9),
            ..free_kernels()
        };
        let hier = SyncSpec::new(SyncScheme::parse("qgz-int8-int4-hier").expect("a scheme"), 512);
        let flat = SyncSpec::new(SyncScheme::parse("qgz-int4").expect("a scheme"), 512);
        let us = |spec: &SyncSpec, per_node| kernel_seconds(spec, &k, 4.0 * e, 8, per_node) * 1e6;
        assert!((us(&hier, 2) - 6946.816).abs() < 1e-6, "{}", us(&hier, 2));
        assert!((us(&hier, 1) - 5373.952).abs() < 1e-6, "{}", us(&hier, 1));
        assert_eq!(us(&hier, 1), us(&flat, 1));
        // The whole synchronization too, on the hook's path (no pipeline):
        // the intra-node phase reaches nobody, so it costs no latency.
        let c = |per_node| {
            Cluster::new(vec![DeviceType::new("a", 8, per_node, 1)
                .with_bandwidth(100.0, 1.0)
                .with_latency(5.0, 20.0)
                .with_host(k, 10.0)])
        };
        let on = |s: SyncSpec| s.with_path(SyncPath::Host);
        assert_eq!(
            c(1).sync_us(0, 1 << 22, &on(hier), AllReduceAlgo::Ring),
            c(1).sync_us(0, 1 << 22, &on(flat), AllReduceAlgo::Ring)
        );
        assert!(
            c(2).sync_us(0, 1 << 22, &on(hier), AllReduceAlgo::Ring)
                != c(2).sync_us(0, 1 << 22, &on(flat), AllReduceAlgo::Ring)
        );
    }

    /// A rung of a size ladder at 2^(16+i) elements: n-bit pack,
    /// unpack-accumulate, zeroing and division and the 16-bit casts at the
    /// given ns an element (every width alike), the rest free.
    fn rung(i: u32, pack: f64, unpack: f64, finish: f64, cast: f64) -> SizeRates {
        SizeRates {
            elements: (1u64 << (16 + i)) as f64,
            quantize: 0.0,
            quantize4: 0.0,
            dequantize: 0.0,
            dequantize4: 0.0,
            cast16: cast * 1e-9,
            bf16: cast * 1e-9,
            nbit_pack: [pack * 1e-9; 4],
            nbit_unpack: [unpack * 1e-9; 4],
            nbit_finish: finish * 1e-9,
            nbit_decode: None,
            qgz_decode: None,
            sum: 0.0,
            bucket: 0.0,
        }
    }

    #[test]
    fn a_gradient_in_the_caches_runs_at_its_measured_rate() {
        // A ladder at 2^16..2^20 elements whose f16 cast costs 0.2, 0.2,
        // 0.4, 0.8 and 1.0 ns an element; the fit above it: 1 ns an element
        // and no per-call term (so it meets the ladder at 2^20).
        let rung = |i: u32, cast: f64| rung(i, 0.0, 0.0, 0.0, cast);
        let ladder = [rung(0, 0.2), rung(1, 0.2), rung(2, 0.4), rung(3, 0.8), rung(4, 1.0)];
        let k = SyncKernels { cast16_r: 1e-9, by_size: Some(ladder), ..free_kernels() };
        let spec = SyncSpec::new(SyncScheme::Fp16, 512);
        // 4 devices: 3.25·E casts (as above).
        let us = |e: f64| kernel_seconds(&spec, &k, 4.0 * e, 4, 4) * 1e6;
        // On a rung: 2^18 elements at 0.4 ns: 3.25·2^18·0.4 ns = 340.7872 µs.
        assert!((us((1u64 << 18) as f64) - 340.7872).abs() < 1e-6, "{}", us((1u64 << 18) as f64));
        // Halfway (in the logarithm) between 2^18 and 2^19: 0.6 ns.
        let mid = (1u64 << 18) as f64 * 2f64.sqrt();
        assert!((us(mid) - 3.25 * mid * 0.6e-3).abs() < 1e-6, "{}", us(mid));
        // Below the ladder: its smallest size's rate, 0.2 ns.
        assert!((us(1000.0) - 3.25 * 1000.0 * 0.2e-3).abs() < 1e-9, "{}", us(1000.0));
        // From the largest size up, the fit: 2^21 elements at 1 ns.
        let e = (1u64 << 21) as f64;
        assert!((us(e) - 3.25 * e * 1e-3).abs() < 1e-6, "{}", us(e));
        // Just below it, the ladder meets the fit.
        assert!((us(e / 2.0 * 0.999_999) / us(e / 2.0) - 0.999_999).abs() < 1e-5);
        // Without a ladder every size is priced by the fit.
        let fit = SyncKernels { by_size: None, ..k };
        let e = (1u64 << 18) as f64;
        assert!((kernel_seconds(&spec, &fit, 4.0 * e, 4, 4) * 1e6 - 3.25 * e * 1e-3).abs() < 1e-6);
        // A cluster of 4 hosts, one rank and one core each: on the MPI path
        // a 2^18-element gradient's casts take the ladder's 340.7872 µs; on
        // a device that computes on those cores (DDP's hook beside the
        // backward pass) the fit's 851.968.
        let host = |on_host: bool| {
            let ty = DeviceType::new("cpu", 4, 1, 1).with_host(k, 10.0).with_host_cores(Some(1));
            Cluster::new(vec![ty.with_compute_on_host(on_host)])
        };
        let bytes = 4 * (1u64 << 18);
        let mpi = host(false).sync_breakdown(0, bytes, &spec.with_path(SyncPath::Mpi)).kernel_us;
        assert!((mpi - 340.7872).abs() < 1e-6, "{mpi}");
        let ddp = host(true).sync_breakdown(0, bytes, &spec.with_path(SyncPath::Host)).kernel_us;
        assert!((ddp - 851.968).abs() < 1e-6, "{ddp}");
        // The same cores on the MPI path (sync-bench, an MPI job): the
        // kernels run alone between exchanges, at the ladder's rates.
        let alone = host(true).sync_breakdown(0, bytes, &spec.with_path(SyncPath::Mpi)).kernel_us;
        assert!((alone - 340.7872).abs() < 1e-6, "{alone}");
    }

    #[test]
    fn kernels_in_lockstep_run_at_the_rates_measured_on_every_core() {
        // Alone: n-bit pack 0.4 ns an element, unpack-accumulate 0.2, the
        // sum's zeroing and division 0.3, the f16 cast 1.0, at every size
        // of the ladder (2^16..2^20) and in the fits. On every core at
        // once: 0.5, 0.4, 0.45 and 2.0, except pack 0.25 on the smallest
        // rung.
        let alone = std::array::from_fn(|i| rung(i as u32, 0.4, 0.2, 0.3, 1.0));
        let corun = std::array::from_fn(|i| rung(i as u32, if i == 0 { 0.25 } else { 0.5 }, 0.4, 0.45, 2.0));
        let k = SyncKernels {
            cast16_r: 1e-9,
            nbit_pack_r: Some([0.4e-9; 4]),
            nbit_unpack_r: Some([0.2e-9; 4]),
            nbit_finish_r: Some(0.3e-9),
            by_size: Some(alone),
            corun_by_size: Some(corun),
            ..free_kernels()
        };
        // n-bit on 2 ranks, one a node: pack(E) + unpack(2E) + finish(E),
        // every rank at once: 0.5 + 0.8 + 0.45 = 1.75 ns an element at
        // 2^18 elements and above the ladder (its largest rung there).
        let nbit = SyncSpec::new(SyncScheme::NBit { bits: 2, stochastic: false }, 512);
        for e in [(1u64 << 18) as f64, (1u64 << 22) as f64] {
            let got = kernel_seconds(&nbit, &k, 4.0 * e, 2, 1) * 1e9;
            assert!((got - 1.75 * e).abs() < 1e-6 * e, "{e}: {got} ns");
            // Unmeasured so, the rates alone: 0.4 + 0.4 + 0.3 = 1.1 ns.
            let got = kernel_seconds(&nbit, &SyncKernels { corun_by_size: None, ..k }, 4.0 * e, 2, 1) * 1e9;
            assert!((got - 1.1 * e).abs() < 1e-6 * e, "{e}: {got} ns");
        }
        // On the smallest rung the pack's own rate there: 0.25 + 0.8 + 0.45.
        let e = (1u64 << 16) as f64;
        assert!((kernel_seconds(&nbit, &k, 4.0 * e, 2, 1) * 1e9 - 1.5 * e).abs() < 1e-6 * e);
        // Where the device computes on those cores (DDP's hook beside the
        // backward pass), every size at the largest rung's rates, as the
        // fits alone are: 1.75 ns at 2^16 elements too.
        let ty = DeviceType::new("cpu", 2, 1, 1).with_host(k, 10.0).with_host_cores(Some(1));
        let ddp = Cluster::new(vec![ty.with_compute_on_host(true)]);
        let got = ddp.sync_breakdown(0, 4 * (1u64 << 16), &nbit.with_path(SyncPath::Host)).kernel_us * 1e3;
        assert!((got - 1.75 * e).abs() < 1e-6 * e, "{got} ns");
        // A pipelined scheme's kernels interleave with its pieces'
        // exchanges: at the rates alone. fp16 in 4 pieces over 2 ranks,
        // the piece rates 1 ns every cast: 3·E + E/2 casts at 1 ns.
        let row = |elements: f64| PieceKernels {
            elements,
            cast16: 1e-9,
            bf16: 1e-9,
            quantize: 0.0,
            dequantize: 0.0,
            quantize4: 0.0,
            dequantize4: 0.0,
        };
        let pieces =
            PieceRates { cached: row(65_536.0), streamed: std::array::from_fn(|i| row((1u64 << (16 + i)) as f64)) };
        let k = SyncKernels { pieces: Some(pieces), ..k };
        let fp16 = SyncSpec::new(SyncScheme::Fp16, 512);
        let e = (1u64 << 20) as f64;
        let got = kernel_seconds_in_pieces(&fp16, &k, 4.0 * e, 2, 1, 4.0) * 1e9;
        assert!((got - 3.5 * e).abs() < 1e-6 * e, "{got} ns");
        // Whole (one piece), every rank casts at once: 3.5·E at 2 ns.
        let got = kernel_seconds_in_pieces(&fp16, &k, 4.0 * e, 2, 1, 1.0) * 1e9;
        assert!((got - 7.0 * e).abs() < 1e-6 * e, "{got} ns");
    }

    #[test]
    fn the_pipeline_runs_its_kernels_at_the_pieces_rates() {
        // Pieces measured on one piece's buffers: f16 cast 0.3 ns, bf16 0.2,
        // int8 quantize 1.0, dequantize-accumulate 0.5 an element. Piece by
        // piece over gradients of 2^18..2^22 elements: f16 0.4, 0.5, 0.6,
        // 0.7, 0.8 ns; quantize 1.1..1.5; dequantize 0.6..1.0.
        let row = |elements: f64, cast: f64, q: f64, d: f64| PieceKernels {
            elements,
            cast16: cast * 1e-9,
            bf16: (cast - 0.1) * 1e-9,
            quantize: q * 1e-9,
            dequantize: d * 1e-9,
            quantize4: q * 1e-9,
            dequantize4: d * 1e-9,
        };
        let streamed = std::array::from_fn(|i| {
            let x = 0.1 * i as f64;
            row((1u64 << (18 + i)) as f64, 0.4 + x, 1.1 + x, 0.6 + x)
        });
        let pieces = PieceRates { cached: row(262_144.0, 0.3, 1.0, 0.5), streamed };
        // The whole-gradient fits: 1 ns an element for every kernel.
        let k = SyncKernels {
            cast16_r: 1e-9,
            quantize_r: 1e-9,
            dequantize_r: 1e-9,
            pieces: Some(pieces),
            ..free_kernels()
        };
        let e = (1u64 << 20) as f64;
        let fp16 = SyncSpec::new(SyncScheme::Fp16, 512).with_path(SyncPath::Mpi);
        // 2 ranks, E = 2^20: shards of 2^19, 2 pieces each. Encode and
        // decode stream the gradient at its size's 0.6 ns; the sum of the
        // ranks' pieces (E) and its re-encoding (E/2) at the piece's 0.3:
        // (2·0.6 + 0.3 + 0.3/2)·2^20 ns = 1730.1504 µs.
        assert_eq!(pipeline_pieces(&fp16, 4.0 * e, 2), 2.0);
        let us = |spec: &SyncSpec, e: f64, pieces: f64| kernel_seconds_in_pieces(spec, &k, 4.0 * e, 2, 1, pieces) * 1e6;
        assert!((us(&fp16, e, 2.0) - 1730.1504).abs() < 1e-6, "{}", us(&fp16, e, 2.0));
        // bf16 at its own rates: (2·0.5 + 0.2 + 0.1)·2^20 ns.
        let bf16 = SyncSpec::new(SyncScheme::Bf16, 512);
        assert!((us(&bf16, e, 2.0) - 1.3 * e * 1e-3).abs() < 1e-6, "{}", us(&bf16, e, 2.0));
        // Halfway (in the logarithm) between 2^20 and 2^21: streamed 0.65.
        let mid = e * 2f64.sqrt();
        assert!((us(&fp16, mid, 2.0) - (2.0 * 0.65 + 0.45) * mid * 1e-3).abs() < 1e-6);
        // Outside the measured sizes: the nearest end's (0.4 and 0.8).
        assert!((us(&fp16, 4.0 * e, 2.0) - (1.6 + 0.45) * 4.0 * e * 1e-3).abs() < 1e-6);
        assert!((us(&fp16, e / 8.0, 2.0) - (0.8 + 0.45) * e / 8.0 * 1e-3).abs() < 1e-6);
        // One-shot qgZ int8: quantize and dequantize-accumulate stream,
        // the sum's dequantize-accumulate and re-quantization on the piece:
        // (1.3 + 0.8 + 0.5 + 1.0/2)·2^20 ns.
        let qgz = SyncSpec::new(SyncScheme::parse("qgz-int8").expect("a scheme"), 512);
        assert!((us(&qgz, e, 2.0) - 3.1 * e * 1e-3).abs() < 1e-6, "{}", us(&qgz, e, 2.0));
        // One piece (nothing pipelined), and schemes the pipeline does not
        // run, keep the whole-gradient rates: fp16 3.5·E at 1 ns.
        assert!((us(&fp16, e, 1.0) - 3.5 * e * 1e-3).abs() < 1e-6);
        let nbit = SyncSpec::new(SyncScheme::parse("nbit-2").expect("a scheme"), 512);
        assert_eq!(us(&nbit, e, 2.0), us(&nbit, e, 1.0));
        // Through the cluster: 2 hosts of one rank and one core. The MPI
        // path pipelines (1730.1504 µs of kernels); the hooks' host path
        // sends one piece (3.5·E at 1 ns).
        let ty = DeviceType::new("cpu", 2, 1, 1).with_host(k, 10.0).with_host_cores(Some(1));
        let c = Cluster::new(vec![ty]);
        let b = c.sync_breakdown(0, 4 * (1u64 << 20), &fp16);
        assert_eq!(b.pieces, 2.0);
        assert!((b.kernel_us - 1730.1504).abs() < 1e-6, "{}", b.kernel_us);
        let host = c.sync_breakdown(0, 4 * (1u64 << 20), &fp16.with_path(SyncPath::Host)).kernel_us;
        assert!((host - 3.5 * e * 1e-3).abs() < 1e-6, "{host}");
        // Hosts that are the devices (a CPU cluster): the MPI path still
        // runs its pieces alone.
        let cpu = Cluster::new(vec![c.types[0].clone().with_compute_on_host(true)]);
        let b = cpu.sync_breakdown(0, 4 * (1u64 << 20), &fp16);
        assert!((b.kernel_us - 1730.1504).abs() < 1e-6, "{}", b.kernel_us);
    }

    #[test]
    fn exchange_rounds_are_the_phases_that_reach_a_peer() {
        // 2 nodes × 2 ranks that compute on the host's cores, on the hooks'
        // host path: gloo's ring 2(P−1) = 6 steps; fp16 and one-shot qgZ an
        // all-to-all and an all-gather; hierarchical qgZ an all-to-all
        // inside the node, one across, and the all-gather; n-bit one
        // all-gather. Each waits 2 ms beside the backward pass.
        let k = SyncKernels { busy_round_s: Some(2e-3), ..free_kernels() };
        let ty = DeviceType::new("cpu", 4, 2, 1).with_host(k, 10.0).with_host_cores(Some(1));
        let cpu = Cluster::new(vec![ty.clone().with_compute_on_host(true)]);
        for (name, rounds) in [("fp32", 6.0), ("fp16", 2.0), ("qgz-int8", 2.0), ("qgz-int4-hier", 3.0), ("nbit-2", 1.0)]
        {
            let spec = SyncSpec::new(SyncScheme::parse(name).expect("a scheme"), 512).with_path(SyncPath::Host);
            assert_eq!(cpu.sync_rounds(0, 1 << 22, &spec), rounds, "{name}");
            assert!((cpu.sync_busy_wait_us(0, 1 << 22, &spec) - rounds * 2000.0).abs() < 1e-9, "{name}");
            // A GPU's synchronization shares no cores with its backward.
            assert_eq!(Cluster::new(vec![ty.clone()]).sync_busy_wait_us(0, 1 << 22, &spec), 0.0, "{name}");
        }
    }

    #[test]
    fn nbit_kernels_cost_their_own_width() {
        // n-bit on 4 devices of one node, E = 2^20 elements: one pack of E
        // and unpack-accumulate of every rank's E (4E), priced at the
        // width's own rates; a file without the per-width table prices
        // every width at the 2-bit pack_r / unpack_r.
        let e = (1u64 << 20) as f64;
        let k = SyncKernels {
            pack_r: Some(2e-9),
            unpack_r: Some(1e-9),
            nbit_pack_r: Some([1e-9, 2e-9, 3e-9, 4e-9]),
            nbit_unpack_r: Some([5e-10, 1e-9, 2e-9, 3e-9]),
            ..free_kernels()
        };
        let nbit = |bits| SyncSpec::new(SyncScheme::NBit { bits, stochastic: false }, 512);
        let secs = |k: &SyncKernels, bits| kernel_seconds(&nbit(bits), k, 4.0 * e, 4, 4);
        assert!((secs(&k, 4) - (3e-9 * e + 2e-9 * 4.0 * e)).abs() < 1e-12);
        assert!((secs(&k, 1) - (1e-9 * e + 5e-10 * 4.0 * e)).abs() < 1e-12);
        assert!((secs(&k, 8) - (4e-9 * e + 3e-9 * 4.0 * e)).abs() < 1e-12);
        let old = SyncKernels { nbit_pack_r: None, nbit_unpack_r: None, ..k };
        for bits in [1, 2, 4, 8] {
            assert!((secs(&old, bits) - (2e-9 * e + 1e-9 * 4.0 * e)).abs() < 1e-12);
        }
        // Zeroing the sum and dividing it: once over E, at any width.
        let finish = SyncKernels { nbit_finish_r: Some(7e-10), ..k };
        assert!((secs(&finish, 4) - (3e-9 * e + 2e-9 * 4.0 * e + 7e-10 * e)).abs() < 1e-12);
        // Decoded in one pass: what the pass costs beyond its buffers
        // replaces the zeroing and division passes (4-bit: 3E + 4·2E + 0.1E
        // ns), on the ladder too; a ladder without it keeps the passes.
        let fused = SyncKernels { nbit_decode_r: Some(1e-10), ..finish };
        assert!((secs(&fused, 4) - (3e-9 * e + 2e-9 * 4.0 * e + 1e-10 * e)).abs() < 1e-12);
        let rung = |i: u32, decode: Option<f64>| SizeRates {
            elements: (1u64 << (16 + i)) as f64,
            nbit_pack: [3e-9; 4],
            nbit_unpack: [2e-9; 4],
            nbit_finish: 7e-10,
            nbit_decode: decode,
            ..rung(i, 0.0, 0.0, 0.0, 0.0)
        };
        let small = |k: &SyncKernels| kernel_seconds(&nbit(4), k, 4.0 * 65536.0, 4, 4);
        for (decode, beyond) in [(Some(1e-10), 1e-10), (None, 7e-10)] {
            let mut k = fused;
            k.by_size = Some([0, 1, 2, 3, 4].map(|i| rung(i, decode)));
            assert!((small(&k) - 65536.0 * (3e-9 + 4.0 * 2e-9 + beyond)).abs() < 1e-15, "{decode:?}");
        }
    }

    #[test]
    fn host_work_shares_the_node_cores() {
        // 2 nodes × 2 devices; 1e5 B/µs inside, a 1 GB/s NIC per node (500
        // B/µs to each of its 2 devices), 5/20 µs latencies. Host casts at
        // 1 ns per element, the TCP stack at 1 ns of CPU per byte; one core
        // per node, so its 2 ranks share it: host work takes twice as long.
        // fp16 of S = 4e6 B (E = 1e6, shards of 2.5e5 < 2^18: one piece) on
        // the MPI path: two flat phases receiving 2·E/P = 5e5 B from each
        // peer, 1 inside (5e5 B, 5 µs) and 2 outside (1e6 B, 2000 µs). The
        // stack's work on the 1.5e6 B: 1.5e6 ns × 2 = 3000 µs, longer than
        // the link: 3000 + 20 per phase. Casts: (3E + E/P) ns × 2 = 6500 µs.
        let k = SyncKernels { cast16_r: 1e-9, tcp_r: Some(1e-9), ..free_kernels() };
        let ty = DeviceType::new("a", 4, 2, 1).with_bandwidth(100.0, 1.0).with_host(k, 10.0);
        let spec = SyncSpec::new(SyncScheme::Fp16, 512).with_path(SyncPath::Mpi);
        let shared = Cluster::new(vec![ty.clone().with_host_cores(Some(1))]);
        let t = shared.sync_us(0, 4_000_000, &spec, AllReduceAlgo::Ring);
        assert!((t - (2.0 * (3000.0 + 20.0) + 6500.0)).abs() < 1e-6, "{t}");
        // The same, part by part: casts 6500; per phase the slower link
        // 2000, latency 20 and the stack's 3000: 4000, 40 and 6000.
        let b = shared.sync_breakdown(0, 4_000_000, &spec);
        assert!((b.kernel_us - 6500.0).abs() < 1e-6, "{b:?}");
        assert!((b.link_us - 4000.0).abs() < 1e-6, "{b:?}");
        assert!((b.latency_us - 40.0).abs() < 1e-6, "{b:?}");
        assert!((b.transport_cpu_us - 6000.0).abs() < 1e-6, "{b:?}");
        assert_eq!((b.staging_us, b.pieces, b.total_us), (0.0, 1.0, t));
        // A core per rank: the stack's 1500 µs hides under the link's 2000.
        let own = Cluster::new(vec![ty.clone().with_host_cores(Some(2))]);
        let t = own.sync_us(0, 4_000_000, &spec, AllReduceAlgo::Ring);
        assert!((t - (2.0 * (2000.0 + 20.0) + 3250.0)).abs() < 1e-6, "{t}");
        // The same bytes through a GPU's own kernels pay no TCP work.
        let dev = shared.sync_us(0, 4_000_000, &spec.with_path(SyncPath::Device), AllReduceAlgo::Ring);
        assert!(dev < t, "{dev}");
        // Open MPI's f32 all-reduce (halving and doubling), f32 sums at 1 ns
        // per element. Step 1 (distance 1, inside): 2e6 B, link 20 µs, the
        // stack 2e6 ns × 2 = 4000 µs, + 5; step 2 (across): 1e6 B, link
        // 2000, stack 2000, + 20. Each twice (reduce-scatter, all-gather),
        // plus the reduce-scatter's sums of 5e5 and 2.5e5 elements × 2.
        let k = SyncKernels { sum_r: Some(1e-9), tcp_r: Some(1e-9), ..free_kernels() };
        let c = Cluster::new(vec![ty.with_host(k, 10.0).with_host_cores(Some(1))]);
        let t = c.allreduce_us(0, 4_000_000, AllReduceAlgo::HalvingDoubling);
        let want = 2.0 * (4000.0 + 5.0) + 1000.0 + 2.0 * (2000.0 + 20.0) + 500.0;
        assert!((t - want).abs() < 1e-6, "{t} vs {want}");
    }

    #[test]
    fn each_message_costs_the_host_transport() {
        // The cluster of `host_work_shares_the_node_cores` (2 nodes × 2,
        // one core a node), the TCP stack at 1 ns a byte and 100 µs of CPU
        // per message received. fp16 of S = 4e6 B: one piece, two flat
        // phases of 3 messages each (one from every peer): the stack's
        // 1500 µs + 300 µs, × 2 ranks a core = 3600 µs against the link's
        // 2000, + 20 per phase; casts 6500 µs.
        let k = SyncKernels { cast16_r: 1e-9, tcp_r: Some(1e-9), message_s: Some(1e-4), ..free_kernels() };
        let ty = DeviceType::new("a", 4, 2, 1).with_bandwidth(100.0, 1.0).with_host(k, 10.0).with_host_cores(Some(1));
        let c = Cluster::new(vec![ty.clone()]);
        let spec = SyncSpec::new(SyncScheme::Fp16, 512).with_path(SyncPath::Mpi);
        let t = c.sync_us(0, 4_000_000, &spec, AllReduceAlgo::Ring);
        assert!((t - (2.0 * (3600.0 + 20.0) + 6500.0)).abs() < 1e-6, "{t}");
        // Hierarchical qgZ int8 (free kernels): phase 1 inside the node (1
        // message), phase 2 between nodes (1), phase 3 flat (3): 5 messages,
        // 500 µs × 2 of CPU beyond the bytes'.
        let hier = SyncSpec::new(SyncScheme::Qgz { intra: 8, inter: Some(8), stochastic: false }, 512)
            .with_path(SyncPath::Mpi);
        let without = SyncKernels { message_s: None, ..k };
        let c0 = Cluster::new(vec![ty.clone().with_host(without, 10.0)]);
        let (with_msgs, bytes_only) =
            (c.sync_us(0, 4_000_000, &hier, AllReduceAlgo::Ring), c0.sync_us(0, 4_000_000, &hier, AllReduceAlgo::Ring));
        assert!(with_msgs > bytes_only, "{with_msgs} vs {bytes_only}");
        // Open MPI's halving-doubling: one message a step, 2 steps, each
        // twice: 4 × 100 µs × 2 on top of the bytes-only time.
        let f32k = SyncKernels { sum_r: Some(1e-9), ..k };
        let c1 = Cluster::new(vec![ty.clone().with_host(f32k, 10.0)]);
        let c2 = Cluster::new(vec![ty.with_host(SyncKernels { message_s: None, ..f32k }, 10.0)]);
        let d = c1.allreduce_us(0, 4_000_000, AllReduceAlgo::HalvingDoubling)
            - c2.allreduce_us(0, 4_000_000, AllReduceAlgo::HalvingDoubling);
        assert!((d - 800.0).abs() < 1e-6, "{d}");
    }

    #[test]
    fn a_nic_whose_work_lands_on_the_host_costs_its_cores() {
        // The cluster of `host_work_shares_the_node_cores` (2 nodes × 2, a
        // 1 GB/s NIC a node, one core a node shared by its 2 ranks), the
        // TCP stack at 1 ns a byte, and the NIC's own work at 0.5 ns a byte
        // sent or received. fp16 of S = 4e6 B: two flat phases, each
        // receiving 5e5 B inside and 1e6 B across (and sending as much).
        // The stack: 1.5e6 ns × 2 = 3000 µs a phase, as before; the NIC:
        // (1e6 sent + 1e6 received) × 0.5 ns × 2 ranks a core = 2000 µs
        // more: 5000 µs a phase, + 20 latency; casts 6500 µs.
        let k = SyncKernels { cast16_r: 1e-9, tcp_r: Some(1e-9), ..free_kernels() };
        let ty = DeviceType::new("a", 4, 2, 1).with_bandwidth(100.0, 1.0).with_host(k, 10.0).with_host_cores(Some(1));
        let spec = SyncSpec::new(SyncScheme::Fp16, 512).with_path(SyncPath::Mpi);
        let nic = Cluster::new(vec![ty.clone().with_nic_cpu(0.5e-9)]);
        let b = nic.sync_breakdown(0, 4_000_000, &spec);
        assert!((b.transport_cpu_us - 2.0 * 5000.0).abs() < 1e-6, "{b:?}");
        assert!((b.total_us - (2.0 * (5000.0 + 20.0) + 6500.0)).abs() < 1e-6, "{b:?}");
        // A GPU's own path moves no bytes through the host's stack: no NIC
        // work on its cores either.
        let plain = Cluster::new(vec![ty.clone()]);
        let dev = spec.with_path(SyncPath::Device);
        assert_eq!(
            nic.sync_us(0, 4_000_000, &dev, AllReduceAlgo::Ring),
            plain.sync_us(0, 4_000_000, &dev, AllReduceAlgo::Ring)
        );
        // Open MPI's f32 all-reduce (halving and doubling, f32 sums at 1 ns
        // an element): only its step across nodes (1e6 B each way) pays
        // the NIC, 2e6 B × 0.5 ns × 2 = 2000 µs beside the stack's 2000,
        // longer than the link's 2000: (4000 + 20) twice instead of (2000
        // + 20) twice.
        let f = SyncKernels { sum_r: Some(1e-9), tcp_r: Some(1e-9), ..free_kernels() };
        let (with, without) = (
            Cluster::new(vec![ty.clone().with_host(f, 10.0).with_nic_cpu(0.5e-9)]),
            Cluster::new(vec![ty.clone().with_host(f, 10.0)]),
        );
        let d = with.allreduce_us(0, 4_000_000, AllReduceAlgo::HalvingDoubling)
            - without.allreduce_us(0, 4_000_000, AllReduceAlgo::HalvingDoubling);
        assert!((d - 2.0 * 2000.0).abs() < 1e-6, "{d}");
        // A device that is the host's own cores runs fp32 as gloo's flat
        // ring: 4 members, 3·2 steps of 1e6 B a member, the stack's 1e6 ns
        // × 2 ranks a core = 2000 µs a step against a link of 1 µs. The
        // ring crosses each node's NIC once each way a step: 1e6 B out
        // and in for the node's 2 ranks, 2e6 × 0.5 ns = 1000 µs of its
        // core, 1000 µs more a step: 6000 µs, in the time and in the CPU
        // the synchronization takes from the backward pass.
        let gloo = DeviceType::new("a", 4, 2, 1)
            .with_bandwidth(100.0, 1000.0)
            .with_host(f, 10.0)
            .with_host_cores(Some(1))
            .with_compute_on_host(true);
        let (with, without) = (Cluster::new(vec![gloo.clone().with_nic_cpu(0.5e-9)]), Cluster::new(vec![gloo]));
        let d = with.allreduce_us(0, 4_000_000, AllReduceAlgo::Ring)
            - without.allreduce_us(0, 4_000_000, AllReduceAlgo::Ring);
        assert!((d - 6000.0).abs() < 1e-6, "{d}");
        let fp32 = SyncSpec::new(SyncScheme::Fp32, 512);
        let d = with.sync_cpu_us(0, 4_000_000, &fp32) - without.sync_cpu_us(0, 4_000_000, &fp32);
        assert!((d - 6000.0).abs() < 1e-6, "{d}");
        // One node: nothing crosses a NIC, nothing changes.
        let one = DeviceType::new("a", 2, 2, 1).with_host(k, 10.0).with_host_cores(Some(1));
        let (a, b) = (Cluster::new(vec![one.clone().with_nic_cpu(0.5e-9)]), Cluster::new(vec![one]));
        assert_eq!(
            a.sync_us(0, 4_000_000, &spec, AllReduceAlgo::Ring),
            b.sync_us(0, 4_000_000, &spec, AllReduceAlgo::Ring)
        );
    }

    #[test]
    fn staged_paths_pay_the_host_link() {
        // 1 node × 4 devices, 1e5 B/µs inside, free kernels; host link
        // 10 GB/s = 1e4 B/µs. fp16 of S = 4e6 B (E = 1e6): two flat phases,
        // each receiving 2·E/P = 5e5 B from each of 3 peers = 1.5e6 B: 15 µs
        // + 5 µs latency each. Staging: the hook's 2·S = 8e6 B, and each
        // phase's buffers up and down, own share included: 2·(1.5e6·4/3) =
        // 4e6 B per phase, 8e6 B for both. 16e6 B / 1e4 = 1600 µs.
        let free = free_kernels();
        let c = Cluster::new(vec![DeviceType::new("a", 4, 4, 1).with_host(free, 10.0).with_sync_kernels(free)]);
        let spec = SyncSpec::new(SyncScheme::Fp16, 512);
        let host = c.sync_us(0, 4_000_000, &spec.with_path(SyncPath::Host), AllReduceAlgo::Ring);
        assert_eq!(host, 2.0 * (15.0 + 5.0));
        let staged = c.sync_us(0, 4_000_000, &spec.with_path(SyncPath::HostStaged), AllReduceAlgo::Ring);
        assert!((staged - (host + 1600.0)).abs() < 1e-9, "{staged}");
        // Host kernels are the host's rates, device kernels the GPU's.
        let slow = SyncKernels { cast16_r: 1e-9, ..free };
        let c = Cluster::new(vec![DeviceType::new("a", 4, 4, 1).with_host(slow, 10.0).with_sync_kernels(free)]);
        let dev = c.sync_us(0, 4_000_000, &spec.with_path(SyncPath::Device), AllReduceAlgo::Ring);
        let hs = c.sync_us(0, 4_000_000, &spec.with_path(SyncPath::HostStaged), AllReduceAlgo::Ring);
        // fp16 casts 3·E + E/P elements: (3e6 + 2.5e5)·1e-9 s = 3250 µs.
        assert!((hs - dev - 3250.0).abs() < 1e-6, "{hs} {dev}");
        assert!(!SyncPath::HostStaged.overlaps(SyncScheme::Fp16));
        assert!(SyncPath::HostStaged.overlaps(SyncScheme::Fp32));
        assert!(SyncPath::Host.overlaps(SyncScheme::Fp16));
    }

    #[test]
    fn auto_is_never_slower_than_fp32() {
        // A fast network: compression's kernels cost more than they save.
        let fast = Cluster::new(vec![DeviceType::new("a", 8, 8, 32).with_bandwidth(600.0, 600.0)]);
        let c = choose(&fast, 4 << 20, 25 << 20, 1.0, 512, AllReduceAlgo::Hierarchical, SyncPath::Device);
        assert!(c.predicted_us <= c.fp32_us);
        // A slow network and a loose budget: a quantized scheme wins.
        let slow = Cluster::new(vec![DeviceType::new("a", 16, 4, 32).with_bandwidth(50.0, 1.0)]);
        let c = choose(&slow, 400 << 20, 25 << 20, 0.5, 512, AllReduceAlgo::Hierarchical, SyncPath::Device);
        assert!(c.predicted_us < c.fp32_us, "{c:?}");
        assert_ne!(c.scheme, "fp32");
        // A zero budget admits only fp32.
        let c = choose(&slow, 400 << 20, 25 << 20, 0.0, 512, AllReduceAlgo::Hierarchical, SyncPath::Device);
        assert_eq!(c.scheme, "fp32");
        assert_eq!(c.predicted_us, c.fp32_us);
    }
}
