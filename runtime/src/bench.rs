//! `qsyncc sync-bench`: one scheme, one tensor size, one cluster shape, on a
//! running job (every rank calls [`run`]; rank 0's report is the answer).
//!
//! It measures, in one job:
//! - bytes on the wire per rank (received from other ranks, averaged over
//!   ranks, split intra/inter-node) for one all-reduce, next to a ring f32
//!   all-reduce's `2·M·(P−1)/P`;
//! - the error of the first synchronization (fresh state) against the exact
//!   f64 mean of every rank's gradient, next to the scheme's documented bound
//!   ([`crate::bound`]), checked element by element on rank 0;
//! - whether every rank ended with the same bits (digests all-gathered);
//! - the median time of the scheme's all-reduce and of the engine's own f32
//!   all-reduce of the same buffer, each bracketed by barriers;
//! - where the scheme's time went ([`Phases`]): the mean over the timed
//!   iterations on rank 0 (`phases`) and the largest of every rank's mean
//!   (`phases_max`), each with `other_s`, the rest of the mean iteration
//!   (copies, allocation, the closing barrier's wait for the slowest rank).
//!
//! With a fault (`--kill-rank`, `--stall-rank`) the chosen rank fails at its
//! second communicator call of the timed loop; the job must end with an
//! error on every surviving rank (see [`crate::fault`]).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bound;
use crate::comm::{ClusterShape, Communicator, Deadline, ReduceBuf};
use crate::error::SyncError;
use crate::fault::{Fault, FaultyComm};
use crate::scheme::{Gather, SyncConfig};
use crate::sync::{GradSync, Phases};
use crate::testdata::{digest, gradient, GradKind};

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub config: SyncConfig,
    /// Gradient size in bytes (f32 elements × 4).
    pub bytes: usize,
    pub kind: GradKind,
    pub iterations: usize,
    pub warmup: usize,
    /// `(world rank, fault)` to inject in the timed loop.
    pub fault: Option<(usize, Fault)>,
    /// Also time the engine's own f32 all-reduce (off: the job moves only
    /// the scheme's bytes, what a test counting link bytes wants).
    pub compare_f32: bool,
}

/// Synchronizations a benchmark runs: the fresh one, the warm-up and the
/// timed iterations (what multiplies the per-sync wire bytes).
pub fn syncs(opts: &BenchOptions) -> usize {
    1 + opts.warmup + opts.iterations
}

/// The measurements (rank 0's view; identical fields on every rank except
/// the error, which only rank 0 computes).
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub scheme: String,
    pub backend: String,
    pub ranks: usize,
    pub nodes: usize,
    pub bytes: usize,
    pub elements: usize,
    pub group: usize,
    pub gather: String,
    pub gradient: String,
    pub seed: u64,
    pub wire_bytes_per_rank: f64,
    pub intra_node_bytes_per_rank: f64,
    pub inter_node_bytes_per_rank: f64,
    pub ring_f32_bytes_per_rank: f64,
    pub wire_fraction: f64,
    pub max_abs_error: f64,
    pub error_bound: f64,
    pub max_error_to_bound: f64,
    pub bound_violations: usize,
    pub within_bound: bool,
    pub bitwise_identical: bool,
    pub iterations: usize,
    pub seconds: f64,
    pub f32_allreduce_seconds: f64,
    /// The fastest and the slowest timed iteration of the scheme, and of
    /// the engine's f32 all-reduce: two schemes whose ranges overlap are
    /// not told apart by this run.
    pub seconds_range: [f64; 2],
    pub f32_allreduce_seconds_range: [f64; 2],
    /// Rank 0's mean time per phase over the timed iterations.
    pub phases: PhaseReport,
    /// Per phase, the largest of every rank's mean.
    pub phases_max: PhaseReport,
    /// Minor page faults per timed synchronization, the largest over ranks
    /// (`None` where the kernel does not count them): memory the scheme
    /// touched for the first time — a fresh buffer the size of the gradient
    /// costs its pages at every call.
    pub page_faults_per_sync: Option<f64>,
    /// The MPI engine's TCP eager limit as the library holds it
    /// (`btl_tcp_eager_limit`, [`crate::mpi::TCP_EAGER_LIMIT`]): messages
    /// above it wait for the receiver's answer. `None`: another engine, or
    /// not reported by the library. Set by the caller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_eager_limit_bytes: Option<u64>,
}

/// [`Phases`] of one mean iteration, with the unaccounted rest.
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize)]
pub struct PhaseReport {
    pub quantize_s: f64,
    pub exchange_s: f64,
    pub wait_s: f64,
    pub dequantize_s: f64,
    /// The mean iteration's time outside the four phases.
    pub other_s: f64,
    /// The mean iteration (barrier to barrier).
    pub total_s: f64,
}

impl PhaseReport {
    fn new(p: Phases, total: f64) -> PhaseReport {
        PhaseReport {
            quantize_s: p.quantize_s,
            exchange_s: p.exchange_s,
            wait_s: p.wait_s,
            dequantize_s: p.dequantize_s,
            other_s: (total - p.sum()).max(0.0),
            total_s: total,
        }
    }

    fn to_array(self) -> [f64; 6] {
        [self.quantize_s, self.exchange_s, self.wait_s, self.dequantize_s, self.other_s, self.total_s]
    }

    fn from_array(a: [f64; 6]) -> PhaseReport {
        PhaseReport {
            quantize_s: a[0],
            exchange_s: a[1],
            wait_s: a[2],
            dequantize_s: a[3],
            other_s: a[4],
            total_s: a[5],
        }
    }
}

/// `[min, max]` of `v` (`[0, 0]` when empty).
fn range(v: &[f64]) -> [f64; 2] {
    if v.is_empty() {
        return [0.0, 0.0];
    }
    [v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max)]
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// All-gathers one u64 per rank.
fn gather_u64(comm: &dyn Communicator, v: u64, deadline: Deadline) -> Result<Vec<u64>, SyncError> {
    let mut all = vec![0u8; 8 * comm.size()];
    comm.all_gather(&v.to_le_bytes(), &mut all, deadline)?;
    Ok(all.chunks_exact(8).map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect())
}

/// Every rank's phase report, the largest per field.
fn max_over_ranks(comm: &dyn Communicator, mine: PhaseReport, deadline: Deadline) -> Result<PhaseReport, SyncError> {
    let send: Vec<u8> = mine.to_array().iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut all = vec![0u8; send.len() * comm.size()];
    comm.all_gather(&send, &mut all, deadline)?;
    let mut max = [0f64; 6];
    for rank in all.chunks_exact(send.len()) {
        for (m, c) in max.iter_mut().zip(rank.chunks_exact(8)) {
            *m = m.max(f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
        }
    }
    Ok(PhaseReport::from_array(max))
}

/// Runs the benchmark on `world` (collective: every rank calls it).
pub fn run(world: &dyn Communicator, opts: &BenchOptions) -> Result<BenchReport, SyncError> {
    let cfg = &opts.config;
    if opts.bytes == 0 || !opts.bytes.is_multiple_of(4) {
        return Err(SyncError::BadScheme(format!(
            "--bytes {} is not a positive multiple of 4 (f32 elements)",
            opts.bytes
        )));
    }
    let n = opts.bytes / 4;
    let (p, me) = (world.size(), world.rank());
    let shape = ClusterShape::new(p, cfg.nodes)?;
    let deadline = || Deadline::after(cfg.timeout);
    let grad = gradient(opts.kind, n, cfg.seed, me);

    // One synchronization from a fresh state: bytes, error, agreement.
    let mut result = grad.clone();
    let mut sync = GradSync::new(world, cfg.clone())?;
    sync.all_reduce_mean(&mut result)?;
    let wire = sync.wire_bytes();
    drop(sync);
    let intra = gather_u64(world, wire.intra_node, deadline())?;
    let inter = gather_u64(world, wire.inter_node, deadline())?;
    let digests = gather_u64(world, digest(&result), deadline())?;
    let avg = |v: &[u64]| v.iter().map(|&x| x as f64).sum::<f64>() / p as f64;
    let (intra_avg, inter_avg) = (avg(&intra), avg(&inter));
    let ring = 2.0 * opts.bytes as f64 * (p as f64 - 1.0) / p as f64;

    let (mut violations, mut max_err, mut max_bound, mut ratio) = (0, 0.0, 0.0, 0.0);
    if me == 0 {
        let reference = bound::reference(cfg, shape, n, &|r| gradient(opts.kind, n, cfg.seed, r));
        (violations, max_err, max_bound, ratio) = bound::compare(&result, &reference);
    }

    // Timing: the scheme, then the engine's f32 all-reduce, same buffer.
    let faulty;
    let comm: &dyn Communicator = match opts.fault {
        Some((rank, fault)) => {
            faulty = FaultyComm::new(world, rank, fault, 2);
            &faulty
        }
        None => world,
    };
    let mut sync = GradSync::new(comm, cfg.clone())?;
    let mut buf = vec![0f32; n];
    let mut times = Vec::with_capacity(opts.iterations);
    let mut faults = Some(0u64);
    for it in 0..opts.warmup + opts.iterations {
        buf.copy_from_slice(&grad);
        comm.barrier(deadline())?;
        if it == opts.warmup {
            sync.reset_phases();
        }
        let f0 = minor_faults();
        let t0 = Instant::now();
        sync.all_reduce_mean(&mut buf)?;
        comm.barrier(deadline())?;
        if it >= opts.warmup {
            times.push(t0.elapsed().as_secs_f64());
            faults = faults.zip(f0.zip(minor_faults())).map(|(sum, (a, b))| sum + b.saturating_sub(a));
        }
    }
    let faults_all = gather_u64(comm, faults.unwrap_or(u64::MAX), deadline())?;
    let iters = opts.iterations as f64;
    let mean_time = times.iter().sum::<f64>() / iters;
    let phases = PhaseReport::new(sync.phases().scaled(1.0 / iters), mean_time);
    drop(sync);
    let phases_max = max_over_ranks(comm, phases, deadline())?;
    let mut f32_times = Vec::with_capacity(opts.iterations);
    let f32_runs = if opts.compare_f32 { opts.warmup + opts.iterations } else { 0 };
    for it in 0..f32_runs {
        buf.copy_from_slice(&grad);
        comm.barrier(deadline())?;
        let t0 = Instant::now();
        comm.all_reduce_sum(ReduceBuf::F32(&mut buf), deadline())?;
        comm.barrier(deadline())?;
        if it >= opts.warmup {
            f32_times.push(t0.elapsed().as_secs_f64());
        }
    }

    Ok(BenchReport {
        scheme: cfg.scheme.name(),
        backend: world.backend().to_string(),
        ranks: p,
        nodes: cfg.nodes,
        bytes: opts.bytes,
        elements: n,
        group: cfg.group,
        gather: match cfg.gather {
            Gather::Quantized => "quantized".into(),
            Gather::F32 => "f32".into(),
        },
        gradient: opts.kind.name().into(),
        seed: cfg.seed,
        wire_bytes_per_rank: intra_avg + inter_avg,
        intra_node_bytes_per_rank: intra_avg,
        inter_node_bytes_per_rank: inter_avg,
        ring_f32_bytes_per_rank: ring,
        wire_fraction: if ring > 0.0 { (intra_avg + inter_avg) / ring } else { 0.0 },
        max_abs_error: max_err,
        error_bound: max_bound,
        max_error_to_bound: ratio,
        bound_violations: violations,
        within_bound: violations == 0,
        bitwise_identical: digests.iter().all(|&d| d == digests[0]),
        iterations: opts.iterations,
        seconds_range: range(&times),
        f32_allreduce_seconds_range: range(&f32_times),
        seconds: median(times),
        f32_allreduce_seconds: median(f32_times),
        phases,
        phases_max,
        page_faults_per_sync: if faults_all.contains(&u64::MAX) {
            None
        } else {
            faults_all.iter().max().map(|&f| f as f64 / opts.iterations.max(1) as f64)
        },
        tcp_eager_limit_bytes: None,
    })
}

/// This process's minor page faults so far (`/proc/self/stat`'s tenth
/// field; `None` where there is no such file).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count after its `)`.
    stat.rsplit_once(')')?.1.split_whitespace().nth(7)?.parse().ok()
}

/// Default deadline for the benchmark's calls.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What `sync-bench --collective all-to-all` measured: the engine's
/// all-to-all alone, the exchange every flat scheme is made of, with no
/// kernel around it. Run twice with the same bytes and different
/// `messages`, it separates what the transport costs per byte from what it
/// costs per message (see `scripts/validate/sync.py`).
#[derive(Clone, Debug, Serialize)]
pub struct ExchangeReport {
    pub backend: String,
    pub ranks: usize,
    pub nodes: usize,
    /// Bytes each rank sends per iteration, over all its all-to-alls.
    pub bytes: usize,
    /// All-to-alls per iteration, one after the other.
    pub messages: usize,
    /// Bytes of one message (one all-to-all's share for one peer).
    pub message_bytes: usize,
    /// Bytes a rank receives from the other ranks per iteration.
    pub received_bytes_per_rank: usize,
    pub iterations: usize,
    /// Median seconds of one iteration, bracketed by barriers.
    pub seconds: f64,
    /// The MPI engine's TCP eager limit as the library holds it
    /// (`btl_tcp_eager_limit`, [`crate::mpi::TCP_EAGER_LIMIT`]): messages
    /// above it wait for the receiver's answer. `None`: another engine, or
    /// not reported by the library. Set by the caller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_eager_limit_bytes: Option<u64>,
}

/// Times `messages` all-to-alls one after another, together sending
/// `bytes` from each rank (collective: every rank calls it).
pub fn exchange(
    world: &dyn Communicator,
    bytes: usize,
    messages: usize,
    nodes: usize,
    iterations: usize,
    warmup: usize,
    timeout: Duration,
) -> Result<ExchangeReport, SyncError> {
    let p = world.size();
    let per_call = bytes / messages.max(1);
    if messages == 0 || per_call == 0 || !per_call.is_multiple_of(p) || per_call * messages != bytes {
        return Err(SyncError::BadScheme(format!(
            "--bytes {bytes} in --messages {messages}: each all-to-all must send a positive multiple of {p} bytes \
             (one equal share per rank)"
        )));
    }
    if iterations == 0 {
        return Err(SyncError::BadScheme("--iterations must be at least 1".into()));
    }
    ClusterShape::new(p, nodes)?;
    let deadline = || Deadline::after(timeout);
    let send: Vec<u8> = (0..bytes).map(|i| (i as u8).wrapping_add(world.rank() as u8)).collect();
    let mut recv = vec![0u8; per_call];
    let mut times = Vec::with_capacity(iterations);
    for it in 0..warmup + iterations {
        world.barrier(deadline())?;
        let t0 = Instant::now();
        for chunk in send.chunks_exact(per_call) {
            world.all_to_all(chunk, &mut recv, deadline())?;
        }
        world.barrier(deadline())?;
        if it >= warmup {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    // What arrived is what was sent: rank r's share for this rank, from
    // the last all-to-all.
    let share = per_call / p;
    let me = world.rank();
    for (r, got) in recv.chunks_exact(share).enumerate() {
        let first = (messages - 1) * per_call + me * share;
        let ok = got.iter().enumerate().all(|(i, &b)| b == ((first + i) as u8).wrapping_add(r as u8));
        if !ok {
            return Err(SyncError::BadScheme(format!(
                "all-to-all: rank {me} received wrong bytes from rank {r} in its last exchange"
            )));
        }
    }
    Ok(ExchangeReport {
        backend: world.backend().to_string(),
        ranks: p,
        nodes,
        bytes,
        messages,
        message_bytes: share,
        received_bytes_per_rank: bytes / p * (p - 1),
        iterations,
        seconds: median(times),
        tcp_eager_limit_bytes: None,
    })
}
