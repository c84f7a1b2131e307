//! `qsyncc sync-bench --collective all-gather|reduce-scatter`: one sharded
//! collective ([`crate::shard`]) on a running job, every rank calling
//! [`run`]. It measures, next to the uncompressed collective of the same
//! tensor run in the same job (fp16 all-gather, fp32 reduce-scatter):
//! - bytes on the wire per rank (received from other ranks, averaged over
//!   ranks, intra/inter-node) and their fraction of the baseline's — a
//!   count of bytes, not a timing;
//! - the error against the exact values (the full weight tensor for an
//!   all-gather, the f64 mean of every rank's gradient for a
//!   reduce-scatter) next to the documented bound, on every rank;
//! - whether every rank's all-gathered tensor has the same bits;
//! - the median time of the collective.
//!
//! All-gather schemes: `qwz` (int8 blocks over the world), `hpz` (the
//! intra-node gather from hpZ's secondary shard, exact), `qwz-hpz` (the
//! same, quantized), `fp16`, `bf16`, `fp32` (raw); the weights are fp16
//! except for `bf16` and `fp32`. Reduce-scatter schemes: `fp32` and the
//! qgZ names of [`crate::Scheme`] (`qgz-int4`, `qgz-int4-hier`, …; round
//! to nearest, no error feedback). Shards are near-equal
//! ([`crate::sync::block::shards`]).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::comm::{Communicator, Deadline, NodeMap};
use crate::engine::Kernels;
use crate::scheme::{Kind, Scheme};
use crate::shard::{
    all_gather_bound, ranges, reduce_scatter_reference, Dtype, GatherCodec, ReduceOp, ScatterCodec, ShardComm,
    ShardConfig, ShardError, Weights,
};
use crate::sync::block::shards;
use crate::testdata::{gradient, GradKind};

/// Which sharded collective.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Collective {
    AllGather,
    ReduceScatter,
}

impl std::str::FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all-gather" => Ok(Collective::AllGather),
            "reduce-scatter" => Ok(Collective::ReduceScatter),
            _ => Err(format!("unknown collective `{s}` (all-gather, reduce-scatter, all-reduce)")),
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ShardBenchOptions {
    pub collective: Collective,
    pub scheme: String,
    /// The full tensor's size in bytes (f32 elements × 4).
    pub bytes: usize,
    pub nodes: NodeMap,
    pub group: usize,
    pub seed: u64,
    pub kind: GradKind,
    pub iterations: usize,
    pub warmup: usize,
    pub timeout: Duration,
    pub kernels: Kernels,
}

/// The measurements (the same on every rank).
#[derive(Clone, Debug, Serialize)]
pub struct ShardBenchReport {
    pub collective: String,
    pub scheme: String,
    pub baseline: String,
    pub backend: String,
    pub ranks: usize,
    pub nodes: usize,
    pub bytes: usize,
    pub elements: usize,
    pub group: usize,
    pub gradient: String,
    pub wire_bytes_per_rank: f64,
    pub intra_node_bytes_per_rank: f64,
    pub inter_node_bytes_per_rank: f64,
    /// hpZ: the secondary shard's build (once per step), not in the above.
    pub secondary_bytes_per_rank: f64,
    pub baseline_bytes_per_rank: f64,
    pub wire_fraction: f64,
    pub max_abs_error: f64,
    pub error_bound: f64,
    pub bound_violations: u64,
    pub within_bound: bool,
    pub bitwise_identical: bool,
    pub iterations: usize,
    pub seconds: f64,
}

enum Plan {
    Gather { dtype: Dtype, codec: GatherCodec, hpz: bool },
    Scatter(ScatterCodec),
}

fn plan(o: &ShardBenchOptions) -> Result<Plan, ShardError> {
    let bad = |detail: String| ShardError::Invalid { op: "sync-bench", detail };
    match o.collective {
        Collective::AllGather => {
            let (dtype, codec, hpz) = match o.scheme.as_str() {
                "qwz" => (Dtype::F16, GatherCodec::Qwz, false),
                "hpz" => (Dtype::F16, GatherCodec::Raw, true),
                "qwz-hpz" => (Dtype::F16, GatherCodec::Qwz, true),
                "fp16" => (Dtype::F16, GatherCodec::Raw, false),
                "bf16" => (Dtype::BF16, GatherCodec::Raw, false),
                "fp32" => (Dtype::F32, GatherCodec::Raw, false),
                s => return Err(bad(format!("`{s}` is no all-gather scheme (qwz, hpz, qwz-hpz, fp16, bf16, fp32)"))),
            };
            Ok(Plan::Gather { dtype, codec, hpz })
        }
        Collective::ReduceScatter => {
            let scheme: Scheme = o.scheme.parse().map_err(|e| bad(format!("{e}")))?;
            if scheme.quantizes() && (scheme.rounding != qsync_kernels::Rounding::Nearest || scheme.error_feedback) {
                return Err(bad(format!("`{scheme}`: the sharded reduce-scatter rounds to nearest, without feedback")));
            }
            match scheme.kind {
                Kind::Fp32 => Ok(Plan::Scatter(ScatterCodec::F32)),
                Kind::Qgz { intra, inter } => Ok(Plan::Scatter(ScatterCodec::Qgz { bits: intra, inter })),
                _ => Err(bad(format!("`{scheme}` is no reduce-scatter scheme (fp32, qgz-…)"))),
            }
        }
    }
}

fn gather_u64(comm: &dyn Communicator, v: u64, timeout: Duration) -> Result<Vec<u64>, ShardError> {
    let mut all = vec![0u8; 8 * comm.size()];
    comm.all_gather(&v.to_le_bytes(), &mut all, Deadline::after(timeout))
        .map_err(|error| ShardError::Comm { op: "sync-bench report", error })?;
    Ok(all.chunks_exact(8).map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `(violations, max error, max bound)` of `got` against `exact` ± `bound`
/// (non-finite exact values skipped).
fn compare(got: &[f32], exact: &[f64], bound: &[f64]) -> (u64, f64, f64) {
    let (mut v, mut e, mut b) = (0, 0f64, 0f64);
    for ((&g, &x), &bd) in got.iter().zip(exact).zip(bound) {
        if !x.is_finite() {
            continue;
        }
        let err = (f64::from(g) - x).abs();
        let err = if err.is_nan() { f64::INFINITY } else { err };
        if err > bd {
            v += 1;
        }
        e = e.max(err);
        b = b.max(bd);
    }
    (v, e, b)
}

/// Runs the benchmark (collective: every rank calls it).
pub fn run(world: &dyn Communicator, o: &ShardBenchOptions) -> Result<ShardBenchReport, ShardError> {
    let plan = plan(o)?;
    if o.bytes == 0 || !o.bytes.is_multiple_of(4) {
        return Err(ShardError::Invalid {
            op: "sync-bench",
            detail: format!("--bytes {} is not a positive multiple of 4", o.bytes),
        });
    }
    let n = o.bytes / 4;
    let (p, me) = (world.size(), world.rank());
    let counts: Vec<usize> = shards(n, p).iter().map(|r| r.len()).collect();
    let mine = ranges(&counts)[me].clone();
    let cfg = ShardConfig { group: o.group, timeout: o.timeout, kernels: o.kernels };
    let mut sc = ShardComm::new(world, o.nodes.clone(), cfg)?;
    let barrier = || {
        world.barrier(Deadline::after(o.timeout)).map_err(|error| ShardError::Comm { op: "sync-bench barrier", error })
    };
    let (mut times, mut secondary) = (Vec::new(), 0u64);
    let (baseline, wire, base_wire, err, digest) = match plan {
        Plan::Gather { dtype, codec, hpz } => {
            // One weight tensor (the same on every rank), sharded.
            let full = Weights::from_f32(dtype, &gradient(o.kind, n, o.seed, 0));
            let exact = full.to_f32();
            let shard = Weights::from_f32(dtype, &exact[mine.clone()]);
            let sec = if hpz {
                let s = sc.hpz_secondary(&shard, &counts)?;
                secondary = sc.wire_bytes().total();
                sc.reset_wire();
                Some(s)
            } else {
                None
            };
            let once = |sc: &mut ShardComm<'_>| match &sec {
                Some(s) => sc.hpz_all_gather(s, codec),
                None => sc.all_gather(&shard, &counts, codec),
            };
            let got = once(&mut sc)?;
            let wire = sc.wire_bytes();
            let bound = all_gather_bound(&exact, dtype, &counts, o.group, codec);
            let x64: Vec<f64> = exact.iter().map(|&v| f64::from(v)).collect();
            let err = compare(&got.to_f32(), &x64, &bound);
            for it in 0..o.warmup + o.iterations {
                barrier()?;
                let t = Instant::now();
                once(&mut sc)?;
                barrier()?;
                if it >= o.warmup {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            sc.reset_wire();
            sc.all_gather(&Weights::from_f32(Dtype::F16, &exact[mine]), &counts, GatherCodec::Raw)?;
            ("fp16 all-gather", wire, sc.wire_bytes(), err, got.digest())
        }
        Plan::Scatter(codec) => {
            let grad = gradient(o.kind, n, o.seed, me);
            let got = sc.reduce_scatter(&grad, &counts, codec, ReduceOp::Mean)?;
            let wire = sc.wire_bytes();
            let (exact, bound) = reduce_scatter_reference(&o.nodes, &counts, o.group, codec, ReduceOp::Mean, &|r| {
                gradient(o.kind, n, o.seed, r)
            });
            let err = compare(&got, &exact[mine.clone()], &bound[mine]);
            for it in 0..o.warmup + o.iterations {
                barrier()?;
                let t = Instant::now();
                sc.reduce_scatter(&grad, &counts, codec, ReduceOp::Mean)?;
                barrier()?;
                if it >= o.warmup {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            sc.reset_wire();
            sc.reduce_scatter(&grad, &counts, ScatterCodec::F32, ReduceOp::Mean)?;
            // Each shard has one owner: agreement is not a question here.
            ("fp32 reduce-scatter", wire, sc.wire_bytes(), err, 0)
        }
    };
    finish(world, o, &counts, baseline, wire, base_wire, secondary, err, digest, times)
}

#[allow(clippy::too_many_arguments)]
fn finish(
    world: &dyn Communicator,
    o: &ShardBenchOptions,
    counts: &[usize],
    baseline: &str,
    wire: crate::sync::WireBytes,
    base: crate::sync::WireBytes,
    secondary: u64,
    err: (u64, f64, f64),
    digest: u64,
    times: Vec<f64>,
) -> Result<ShardBenchReport, ShardError> {
    let p = world.size();
    let t = o.timeout;
    let avg = |v: Vec<u64>| v.iter().map(|&x| x as f64).sum::<f64>() / p as f64;
    let intra = avg(gather_u64(world, wire.intra_node, t)?);
    let inter = avg(gather_u64(world, wire.inter_node, t)?);
    let base = avg(gather_u64(world, base.total(), t)?);
    let secondary = avg(gather_u64(world, secondary, t)?);
    let violations: u64 = gather_u64(world, err.0, t)?.iter().sum();
    let max_err = gather_u64(world, err.1.to_bits(), t)?.into_iter().map(f64::from_bits).fold(0.0, f64::max);
    let max_bound = gather_u64(world, err.2.to_bits(), t)?.into_iter().map(f64::from_bits).fold(0.0, f64::max);
    let digests = gather_u64(world, digest, t)?;
    Ok(ShardBenchReport {
        collective: match o.collective {
            Collective::AllGather => "all-gather".into(),
            Collective::ReduceScatter => "reduce-scatter".into(),
        },
        scheme: o.scheme.clone(),
        baseline: baseline.into(),
        backend: world.backend().into(),
        ranks: p,
        nodes: o.nodes.nodes(),
        bytes: o.bytes,
        elements: counts.iter().sum(),
        group: o.group,
        gradient: o.kind.name().into(),
        wire_bytes_per_rank: intra + inter,
        intra_node_bytes_per_rank: intra,
        inter_node_bytes_per_rank: inter,
        secondary_bytes_per_rank: secondary,
        baseline_bytes_per_rank: base,
        wire_fraction: if base > 0.0 { (intra + inter) / base } else { 0.0 },
        max_abs_error: max_err,
        error_bound: max_bound,
        bound_violations: violations,
        within_bound: violations == 0,
        bitwise_identical: digests.iter().all(|&d| d == digests[0]),
        iterations: o.iterations,
        seconds: median(times),
    })
}

/// The report as text (what `sync-bench` prints without `--json`).
pub fn render(r: &ShardBenchReport) -> String {
    format!(
        "{} {} on {} ranks ({} nodes, {}), {} bytes ({} f32), group {}\n\
         wire bytes per rank: {:.0} ({:.0} intra-node, {:.0} inter-node) = {:.4} of {}'s {:.0}{}\n\
         error vs exact: max {:.3e}, bound {:.3e}, {}\n\
         ranks bitwise identical: {}\n\
         time: {:.6} s median of {}\n",
        r.collective,
        r.scheme,
        r.ranks,
        r.nodes,
        r.backend,
        r.bytes,
        r.elements,
        r.group,
        r.wire_bytes_per_rank,
        r.intra_node_bytes_per_rank,
        r.inter_node_bytes_per_rank,
        r.wire_fraction,
        r.baseline,
        r.baseline_bytes_per_rank,
        if r.secondary_bytes_per_rank > 0.0 {
            format!(" (secondary shard build, once per step: {:.0})", r.secondary_bytes_per_rank)
        } else {
            String::new()
        },
        r.max_abs_error,
        r.error_bound,
        if r.within_bound {
            "within bound".to_string()
        } else {
            format!("{} elements OVER the bound", r.bound_violations)
        },
        r.bitwise_identical,
        r.seconds,
        r.iterations,
    )
}
