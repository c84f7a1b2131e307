//! `qsync-shard-check`: the multi-process checks of the sharded collectives
//! (`qsync_runtime::shard`: qwZ all-gather, hpZ, qgZ reduce-scatter), run
//! under `mpirun` (by `tests/shard_jobs.rs`, or by hand), or over NCCL
//! (`--backend nccl`, as `qsync-sync-check` does it: without
//! `$QSYNC_NCCL_ID` the process is the launcher of `--ranks N` copies of
//! itself on this machine's GPUs, several per GPU allowed; with it, one rank).
//!
//! Suites (`--suite`):
//! - `bounds`: f32/fp16/bf16 weights × gradient kinds × shard layouts (near
//!   equal, and uneven with an empty shard), groups that divide no shard:
//!   raw all-gathers and hpZ rebuild the exact tensor; qwZ (world and hpZ)
//!   gives the same bits on every rank, within its documented bound, and
//!   hpZ's quantized gather equals the world one bit for bit while moving
//!   no byte across nodes; every reduce-scatter (f32, qgZ int8/int4,
//!   one-shot and hierarchical, sum and mean) is within its bound of the
//!   exact f64 reduction and reproducible; NaN and infinity propagate;
//! - `wire`: `qsync_runtime::shard_bench` for qwZ, hpZ and qgZ-int4
//!   (one-shot and hierarchical) at `--bytes` (default 1 MiB): wire
//!   fractions against the fp16 all-gather (qwZ ≤ 0.52) and the fp32
//!   reduce-scatter (qgZ-int4 ≤ 0.14), printed by rank 0 as
//!   `wire fraction COLLECTIVE SCHEME: F (B of BASE bytes per rank)`;
//! - `fault`: rank `--fault-rank` fails (`--fault exit|stall`) at its
//!   `--fault-call`-th communicator call of the sequence hpZ secondary
//!   build (1), hpZ all-gather (2), qwZ all-gather (3), hierarchical qgZ
//!   reduce-scatter (4, 5); the job must end with an error naming the
//!   operation, not hang.
//!
//! Exit status: 0 when every check passed, 1 when one failed, 2 on bad
//! arguments, 3 when a collective failed (the job is aborted).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use qsync_kernels::QBits;
use qsync_runtime::comm::{Communicator, Deadline, NodeMap};
use qsync_runtime::fault::{Fault, FaultyComm};
use qsync_runtime::shard::{
    all_gather_bound, ranges, reduce_scatter_reference, Dtype, GatherCodec, ReduceOp, ScatterCodec, ShardComm,
    ShardConfig, Weights,
};
use qsync_runtime::shard_bench::{self, Collective, ShardBenchOptions};
use qsync_runtime::sync::block::shards;
use qsync_runtime::testdata::{digest, gradient, GradKind};
use qsync_runtime::Kernels;

struct Args {
    backend: String,
    ranks: usize,
    suite: String,
    nodes: usize,
    node_map: Option<Vec<usize>>,
    fault: Option<Fault>,
    fault_rank: usize,
    fault_call: usize,
    timeout: Duration,
    bytes: usize,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        backend: "mpi".into(),
        ranks: 2,
        suite: "bounds".into(),
        nodes: 1,
        node_map: None,
        fault: None,
        fault_rank: 1,
        fault_call: 2,
        timeout: Duration::from_secs(60),
        bytes: 1 << 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--backend" => {
                a.backend = val()?;
                if a.backend != "mpi" && a.backend != "nccl" {
                    bail!("unknown backend `{}` (mpi, nccl)", a.backend);
                }
            }
            "--ranks" => a.ranks = val()?.parse().context("--ranks")?,
            "--suite" => a.suite = val()?,
            "--nodes" => a.nodes = val()?.parse()?,
            "--node-map" => {
                a.node_map = Some(val()?.split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?);
            }
            "--fault" => {
                a.fault = Some(match val()?.as_str() {
                    "exit" => Fault::Exit,
                    "stall" => Fault::Stall(Duration::from_secs(3600)),
                    other => bail!("unknown fault `{other}` (exit, stall)"),
                })
            }
            "--fault-rank" => a.fault_rank = val()?.parse()?,
            "--fault-call" => a.fault_call = val()?.parse()?,
            "--timeout" => a.timeout = Duration::from_secs_f64(val()?.parse()?),
            "--bytes" => a.bytes = val()?.parse()?,
            other => bail!("unknown argument `{other}`"),
        }
    }
    if a.ranks == 0 {
        bail!("--ranks must be positive");
    }
    Ok(a)
}

fn node_map(a: &Args, p: usize) -> Result<NodeMap> {
    let m = match &a.node_map {
        Some(m) => NodeMap::new(m.clone())?,
        None => NodeMap::even(p, a.nodes)?,
    };
    if m.world() != p {
        bail!("a node map of {} ranks for {p} ranks", m.world());
    }
    Ok(m)
}

#[derive(Default)]
struct Report {
    checks: usize,
    failures: Vec<String>,
}

impl Report {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            self.failures.push(what());
        }
    }
}

fn gather_u64(world: &dyn Communicator, v: u64, timeout: Duration) -> Result<Vec<u64>> {
    let mut all = vec![0u8; 8 * world.size()];
    world.all_gather(&v.to_le_bytes(), &mut all, Deadline::after(timeout))?;
    Ok(all.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
}

/// Shard layouts for `p` ranks: near-equal over `n`, and uneven (rank 1's
/// shard empty, the others of unrelated lengths).
fn layouts(p: usize) -> Vec<Vec<usize>> {
    let even = shards(1000, p).iter().map(|r| r.len()).collect();
    let uneven = (0..p).map(|j| if j == 1 { 0 } else { [700, 1301, 37][j % 3] + 5 * j }).collect();
    vec![even, uneven]
}

/// Elements over their bound: `(count, worst index)`.
fn violations(got: &[f32], exact: &[f64], bound: &[f64]) -> (usize, Option<usize>) {
    let mut count = 0;
    let mut worst: Option<(usize, f64)> = None;
    for (i, ((&g, &x), &b)) in got.iter().zip(exact).zip(bound).enumerate() {
        let err = (f64::from(g) - x).abs();
        let err = if err.is_nan() { f64::INFINITY } else { err };
        if err > b {
            count += 1;
            let r = err / b;
            if worst.is_none_or(|(_, w)| r > w) {
                worst = Some((i, r));
            }
        }
    }
    (count, worst.map(|w| w.0))
}

const SCATTERS: [(&str, ScatterCodec); 6] = [
    ("f32", ScatterCodec::F32),
    ("qgz-int8", ScatterCodec::Qgz { bits: QBits::Int8, inter: None }),
    ("qgz-int4", ScatterCodec::Qgz { bits: QBits::Int4, inter: None }),
    ("qgz-int8-hier", ScatterCodec::Qgz { bits: QBits::Int8, inter: Some(QBits::Int8) }),
    ("qgz-int4-hier", ScatterCodec::Qgz { bits: QBits::Int4, inter: Some(QBits::Int4) }),
    ("qgz-int4-int8-hier", ScatterCodec::Qgz { bits: QBits::Int4, inter: Some(QBits::Int8) }),
];

fn bounds_suite(world: &dyn Communicator, a: &Args, rep: &mut Report) -> Result<()> {
    let (p, me) = (world.size(), world.rank());
    let map = node_map(a, p)?;
    let t = a.timeout;
    for group in [64, 100] {
        let cfg = ShardConfig { group, timeout: t, kernels: Kernels::Host };
        let mut sc = ShardComm::new(world, map.clone(), cfg)?;
        for counts in layouts(p) {
            let n: usize = counts.iter().sum();
            let mine = ranges(&counts)[me].clone();
            for kind in [GradKind::Normal, GradKind::HeavyTailed, GradKind::Outliers] {
                let case = |what: &str| format!("{what}, {kind}, group {group}, shards {counts:?}");
                for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
                    let full = Weights::from_f32(dtype, &gradient(kind, n, 7, 0));
                    let exact = full.to_f32();
                    let x64: Vec<f64> = exact.iter().map(|&v| f64::from(v)).collect();
                    let shard = Weights::from_f32(dtype, &exact[mine.clone()]);
                    let raw = sc.all_gather(&shard, &counts, GatherCodec::Raw)?;
                    rep.check(raw == full, || case(&format!("{} raw all-gather is not the tensor", dtype.name())));
                    let q = sc.all_gather(&shard, &counts, GatherCodec::Qwz)?;
                    let ds = gather_u64(world, q.digest(), t)?;
                    rep.check(ds.iter().all(|&d| d == ds[0]), || {
                        case(&format!("{} qwZ all-gather differs across ranks: {ds:x?}", dtype.name()))
                    });
                    let bound = all_gather_bound(&exact, dtype, &counts, group, GatherCodec::Qwz);
                    let (v, worst) = violations(&q.to_f32(), &x64, &bound);
                    rep.check(v == 0, || {
                        let i = worst.unwrap_or(0);
                        case(&format!(
                            "{} qwZ all-gather: {v} elements over the bound (element {i}: {} vs {}, bound {:e})",
                            dtype.name(),
                            q.to_f32()[i],
                            exact[i],
                            bound[i]
                        ))
                    });
                    let sec = sc.hpz_secondary(&shard, &counts)?;
                    sc.reset_wire();
                    let h = sc.hpz_all_gather(&sec, GatherCodec::Raw)?;
                    rep.check(h == full, || case(&format!("{} hpZ raw all-gather is not the tensor", dtype.name())));
                    let hq = sc.hpz_all_gather(&sec, GatherCodec::Qwz)?;
                    rep.check(hq == q, || {
                        case(&format!("{} hpZ qwZ all-gather differs from the world's", dtype.name()))
                    });
                    let w = sc.wire_bytes();
                    rep.check(w.inter_node == 0, || {
                        case(&format!("hpZ all-gathers moved {} bytes across nodes", w.inter_node))
                    });
                }
                let grad = gradient(kind, n, 11, me);
                for (name, codec) in SCATTERS {
                    for reduce in [ReduceOp::Sum, ReduceOp::Mean] {
                        let got = sc.reduce_scatter(&grad, &counts, codec, reduce)?;
                        let again = sc.reduce_scatter(&grad, &counts, codec, reduce)?;
                        rep.check(digest(&got) == digest(&again), || {
                            case(&format!("{name} {reduce:?} not reproducible"))
                        });
                        rep.check(got.len() == counts[me], || case(&format!("{name}: {} elements", got.len())));
                        let (exact, bound) = reduce_scatter_reference(&map, &counts, group, codec, reduce, &|r| {
                            gradient(kind, n, 11, r)
                        });
                        let (v, worst) = violations(&got, &exact[mine.clone()], &bound[mine.clone()]);
                        rep.check(v == 0, || {
                            let i = worst.unwrap_or(0);
                            case(&format!(
                                "{name} {reduce:?} reduce-scatter: {v} over the bound (shard element {i}: {} vs {}, bound {:e})",
                                got[i],
                                exact[mine.start + i],
                                bound[mine.start + i]
                            ))
                        });
                    }
                }
            }
        }
        non_finite(world, &mut sc, rep, t)?;
    }
    Ok(())
}

/// NaN in rank 0's shard, +inf in the last rank's: non-finite on every rank
/// after every all-gather; in the owner's shard after every reduce-scatter.
fn non_finite(world: &dyn Communicator, sc: &mut ShardComm<'_>, rep: &mut Report, t: Duration) -> Result<()> {
    let (p, me) = (world.size(), world.rank());
    let counts: Vec<usize> = (0..p).map(|j| 50 + 17 * j).collect();
    let n: usize = counts.iter().sum();
    let r = ranges(&counts);
    let (i_nan, i_inf) = (r[0].start + 3, r[p - 1].start + 20);
    let mut full = gradient(GradKind::Normal, n, 3, 0);
    full[i_nan] = f32::NAN;
    full[i_inf] = f32::INFINITY;
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        let shard = Weights::from_f32(dtype, &full[r[me].clone()]);
        for codec in [GatherCodec::Raw, GatherCodec::Qwz] {
            let g = sc.all_gather(&shard, &counts, codec)?.to_f32();
            rep.check(g[i_nan].is_nan() && !g[i_inf].is_finite(), || {
                format!("{} {codec:?} all-gather lost a non-finite value: {} {}", dtype.name(), g[i_nan], g[i_inf])
            });
            let sec = sc.hpz_secondary(&shard, &counts)?;
            let h = sc.hpz_all_gather(&sec, codec)?.to_f32();
            rep.check(h[i_nan].is_nan() && !h[i_inf].is_finite(), || {
                format!("{} hpZ {codec:?} all-gather lost a non-finite value", dtype.name())
            });
            let ds = gather_u64(world, digest(&g), t)?;
            rep.check(ds.iter().all(|&d| d == ds[0]), || format!("{codec:?} all-gather with NaN differs across ranks"));
        }
    }
    let mut grad = gradient(GradKind::Normal, n, 5, me);
    if me == 0 {
        grad[i_nan] = f32::NAN;
    }
    if me == p - 1 {
        grad[i_inf] = f32::INFINITY;
    }
    for (name, codec) in SCATTERS {
        let got = sc.reduce_scatter(&grad, &counts, codec, ReduceOp::Mean)?;
        for (i, what) in [(i_nan, "NaN"), (i_inf, "infinity")] {
            if r[me].contains(&i) {
                let v = got[i - r[me].start];
                rep.check(!v.is_finite(), || format!("{name} reduce-scatter lost a {what}: {v}"));
            }
        }
    }
    Ok(())
}

fn wire_suite(world: &dyn Communicator, a: &Args, rep: &mut Report) -> Result<()> {
    let map = node_map(a, world.size())?;
    for (collective, scheme, limit) in [
        (Collective::AllGather, "qwz", 0.52),
        (Collective::AllGather, "qwz-hpz", 0.52),
        (Collective::AllGather, "hpz", 1.0),
        (Collective::ReduceScatter, "qgz-int4", 0.14),
        (Collective::ReduceScatter, "qgz-int4-hier", 0.14),
    ] {
        let o = ShardBenchOptions {
            collective,
            scheme: scheme.into(),
            bytes: a.bytes,
            nodes: map.clone(),
            group: 512,
            seed: 0,
            kind: GradKind::Normal,
            iterations: 1,
            warmup: 0,
            timeout: a.timeout,
            kernels: Kernels::Host,
        };
        let r = shard_bench::run(world, &o)?;
        if world.rank() == 0 {
            eprintln!(
                "wire fraction {} {}: {:.4} ({:.0} of {:.0} bytes per rank; {:.0} inter-node)",
                r.collective,
                r.scheme,
                r.wire_fraction,
                r.wire_bytes_per_rank,
                r.baseline_bytes_per_rank,
                r.inter_node_bytes_per_rank
            );
        }
        rep.check(r.wire_fraction > 0.0 && r.wire_fraction <= limit, || {
            format!("{} {}: wire fraction {:.4} above {limit}", r.collective, r.scheme, r.wire_fraction)
        });
        rep.check(r.within_bound && r.bitwise_identical, || format!("{} {}: {r:?}", r.collective, r.scheme));
        if scheme.ends_with("hpz") {
            rep.check(r.inter_node_bytes_per_rank == 0.0, || format!("{scheme} crossed nodes: {r:?}"));
        }
    }
    Ok(())
}

fn fault_suite(world: &dyn Communicator, a: &Args, fault: Fault) -> Result<()> {
    let faulty = FaultyComm::new(world, a.fault_rank, fault, a.fault_call);
    let map = node_map(a, world.size())?;
    let mut sc = ShardComm::new(&faulty, map, ShardConfig { group: 512, timeout: a.timeout, kernels: Kernels::Host })?;
    let p = world.size();
    let counts: Vec<usize> = shards(100_000, p).iter().map(|r| r.len()).collect();
    let mine = ranges(&counts)[world.rank()].clone();
    let full = gradient(GradKind::Normal, 100_000, 1, 0);
    let shard = Weights::from_f32(Dtype::F16, &full[mine]);
    let sec = sc.hpz_secondary(&shard, &counts)?;
    sc.hpz_all_gather(&sec, GatherCodec::Qwz)?;
    sc.all_gather(&shard, &counts, GatherCodec::Qwz)?;
    let grad = gradient(GradKind::Normal, 100_000, 1, world.rank());
    let codec = ScatterCodec::Qgz { bits: QBits::Int4, inter: Some(QBits::Int4) };
    sc.reduce_scatter(&grad, &counts, codec, ReduceOp::Mean)?;
    Ok(())
}

fn run(world: &dyn Communicator, a: &Args) -> Result<Report> {
    let mut rep = Report::default();
    match a.suite.as_str() {
        "bounds" => bounds_suite(world, a, &mut rep)?,
        "wire" => wire_suite(world, a, &mut rep)?,
        "fault" => fault_suite(world, a, a.fault.context("--suite fault needs --fault")?)?,
        other => bail!("unknown suite `{other}` (bounds, wire, fault)"),
    }
    Ok(rep)
}

fn job(world: &dyn Communicator, a: &Args) -> ExitCode {
    let rep = match run(world, a) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("qsync-shard-check: {e:#} (seen by rank {})", world.rank());
            world.abort(3);
        }
    };
    let total: u64 = match gather_u64(world, rep.failures.len() as u64, a.timeout) {
        Ok(v) => v.iter().sum(),
        Err(e) => {
            eprintln!("qsync-shard-check: rank {}: {e:#}", world.rank());
            world.abort(3);
        }
    };
    for f in &rep.failures {
        eprintln!("FAIL (rank {}): {f}", world.rank());
    }
    if world.rank() == 0 {
        eprintln!(
            "qsync-shard-check: suite {} on {} ranks ({}): {} checks on rank 0, {total} failures over all ranks",
            a.suite,
            world.size(),
            world.backend(),
            rep.checks
        );
    }
    if total == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(feature = "mpi")]
fn mpi_main(args: &Args) -> ExitCode {
    match qsync_runtime::mpi::MpiComm::init() {
        Ok(world) => job(&world, args),
        Err(e) => {
            eprintln!("qsync-shard-check: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(not(feature = "mpi"))]
fn mpi_main(_: &Args) -> ExitCode {
    eprintln!("qsync-shard-check: built without the `mpi` feature: use --backend nccl");
    ExitCode::from(2)
}

#[cfg(feature = "nccl")]
fn nccl_main(args: &Args) -> ExitCode {
    use qsync_runtime::nccl::{launch_self, probe, rank_from_env, RankEnv};
    if RankEnv::present() {
        // One rank of a launched job.
        return match rank_from_env("qsync-shard-check", args.timeout) {
            Ok(world) => job(&world, args),
            Err(code) => ExitCode::from(code),
        };
    }
    // The launcher.
    match probe() {
        Ok(info) => eprintln!("qsync-shard-check: NCCL {}: starting {} ranks", info.version, args.ranks),
        Err(e) => {
            eprintln!("qsync-shard-check: {e}");
            return ExitCode::from(2);
        }
    }
    ExitCode::from(launch_self("qsync-shard-check", args.ranks, args.timeout))
}

#[cfg(not(feature = "nccl"))]
fn nccl_main(_: &Args) -> ExitCode {
    eprintln!("qsync-shard-check: built without the `nccl` feature");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("qsync-shard-check: {e:#}");
            return ExitCode::from(2);
        }
    };
    if args.backend == "nccl" {
        nccl_main(&args)
    } else {
        mpi_main(&args)
    }
}
