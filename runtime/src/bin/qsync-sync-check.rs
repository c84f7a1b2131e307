//! `qsync-sync-check`: the multi-process correctness and failure checks of
//! qsync-runtime, run under `mpirun` (by `tests/mpi_jobs.rs`, or by hand),
//! or over NCCL (`--backend nccl`): without `$QSYNC_NCCL_ID` the process is
//! the launcher — it starts `--ranks N` copies of itself on this machine
//! (`qsync_runtime::nccl::spawn_local`: the NCCL unique id in the
//! environment, every rank on the GPUs present, several per GPU allowed) and
//! exits with the job's status; with it, the process is one rank.
//!
//! Suites (`--suite`):
//! - `bounds`: every scheme × gradient kind × size (sizes not divisible by
//!   the world or the group) against the exact f64 mean within the
//!   documented bound; results bitwise identical across ranks (digests
//!   all-gathered) and across a repeated run with the same seed; NaN and
//!   infinity propagate to every rank;
//! - `stochastic`: stochastic rounding is unbiased (a z-test over many seeds
//!   on inputs round-to-nearest is biased on — which the same test rejects);
//! - `feedback`: with error feedback the summed outputs of `T` steps stay
//!   within a few single-step bounds of `T ×` the mean, without it they drift;
//! - `fault`: one rank fails (`--fault exit|panic|stall`, `--fault-rank R`;
//!   `--fault-at split`: while the node groups are split, not at its second call)
//!   inside a hierarchical synchronization; the job must end with an error;
//! - `digests`: every scheme on fixed inputs and seeds; `--write FILE`
//!   records each result's digest (rank 0), `--expect FILE` compares with a
//!   recorded file — bit for bit for every scheme whose arithmetic is ours
//!   (all but `fp32`, which is the engine's own f32 sum in the engine's
//!   order), so an NCCL run is checked against an MPI run of the same
//!   inputs and seeds; every result is also checked against its bound;
//! - `probe` (`--backend nccl` only): prints NCCL's version, or the
//!   missing library, and starts no rank;
//! - `bench`: `qsync_runtime::bench` (what `qsyncc sync-bench` runs) for
//!   every scheme (or those of `--schemes a,b,…`) at `--bytes` (default
//!   16M) for `--iterations` (default 10), one JSON object per scheme on
//!   stdout from rank 0.
//!
//! `--kernels device` runs every scheme's quantization kernels as our PTX
//! on the rank's GPU (NCCL only; the PTX from `$QSYNC_PTX_DIR`), instead of
//! the CPU reference (`host`, the default): with `--suite digests --expect`
//! that holds the GPU kernels inside real synchronizations to the MPI run's
//! bytes.
//!
//! Exit status: 0 when every check passed, 1 when a check failed (rank 0
//! prints each failure), 2 on bad arguments or a missing library, 3 when
//! synchronization itself failed (the job is aborted). The NCCL launcher
//! exits 0 when every rank did, else the first failed rank's status (3 if
//! it was killed).

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use qsync_runtime::bench::{self, BenchOptions};
use qsync_runtime::bound;
use qsync_runtime::comm::{Communicator, Deadline, NodeMap};
use qsync_runtime::fault::{Fault, FaultyComm};
use qsync_runtime::testdata::{digest, gradient, GradKind};
use qsync_runtime::{GradSync, Kernels, Scheme, SyncConfig};

struct Args {
    suite: String,
    backend: String,
    ranks: usize,
    nodes: usize,
    fault: Option<Fault>,
    fault_rank: usize,
    /// `--fault-at split`: the fault fires when the rank makes its node
    /// groups, not at its second call.
    fault_at_split: bool,
    timeout: Duration,
    write: Option<PathBuf>,
    expect: Option<PathBuf>,
    bytes: usize,
    /// `--suite bench`: the schemes (all base names when empty) and iterations.
    schemes: Vec<String>,
    iterations: usize,
}

/// `--kernels`: where every configuration's quantization kernels run.
static KERNELS: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
/// `--pipeline-chunk`: every configuration's piece size (results must not
/// depend on it: `--suite digests --expect` with a tiny one checks that).
static PIPELINE_CHUNK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
/// `--node-map 0,0,1`: the node of every rank (nodes of any size).
static NODE_MAP: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();

/// The nodes of this job: `--node-map`, else `--nodes` equal nodes.
fn nodes_of(a: &Args, p: usize) -> Result<NodeMap> {
    let mut cfg = SyncConfig::new("fp32".parse::<Scheme>()?);
    cfg.nodes = a.nodes;
    cfg.node_of = NODE_MAP.get().cloned();
    Ok(qsync_runtime::sync::node_map(&cfg, p)?)
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        suite: "bounds".into(),
        backend: "mpi".into(),
        ranks: 2,
        nodes: 1,
        fault: None,
        fault_rank: 1,
        fault_at_split: false,
        timeout: Duration::from_secs(60),
        write: None,
        expect: None,
        bytes: 16 << 20,
        schemes: Vec::new(),
        iterations: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--suite" => a.suite = val()?,
            "--backend" => {
                a.backend = val()?;
                if a.backend != "mpi" && a.backend != "nccl" {
                    bail!("unknown backend `{}` (mpi, nccl)", a.backend);
                }
            }
            "--ranks" => a.ranks = val()?.parse().context("--ranks")?,
            "--write" => a.write = Some(val()?.into()),
            "--expect" => a.expect = Some(val()?.into()),
            "--bytes" => a.bytes = val()?.parse().context("--bytes (a number of bytes)")?,
            "--kernels" => {
                let k: Kernels = val()?.parse().map_err(anyhow::Error::msg)?;
                let _ = KERNELS.set(k);
            }
            "--nodes" => a.nodes = val()?.parse().context("--nodes")?,
            "--node-map" => {
                let map = val()?
                    .split(',')
                    .map(|v| v.trim().parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .context("--node-map (node ids, one per rank: 0,0,1)")?;
                let _ = NODE_MAP.set(map);
            }
            "--pipeline-chunk" => {
                let _ = PIPELINE_CHUNK.set(val()?.parse().context("--pipeline-chunk (elements)")?);
            }
            "--schemes" => a.schemes = val()?.split(',').map(str::to_string).collect(),
            "--iterations" => a.iterations = val()?.parse().context("--iterations")?,
            "--fault-rank" => a.fault_rank = val()?.parse().context("--fault-rank")?,
            "--fault-at" => {
                a.fault_at_split = match val()?.as_str() {
                    "split" => true,
                    "call" => false,
                    other => bail!("unknown --fault-at `{other}` (call, split)"),
                }
            }
            "--timeout" => {
                let secs: f64 = val()?.parse().context("--timeout")?;
                if !(secs > 0.0 && secs < 1e9) {
                    bail!("--timeout must be a positive number of seconds");
                }
                a.timeout = Duration::from_secs_f64(secs);
            }
            "--fault" => {
                a.fault = Some(match val()?.as_str() {
                    "exit" => Fault::Exit,
                    "panic" => Fault::Panic,
                    "stall" => Fault::Stall(Duration::from_secs(3600)),
                    other => bail!("unknown fault `{other}` (exit, panic, stall)"),
                })
            }
            other => bail!("unknown argument `{other}`"),
        }
    }
    if a.ranks == 0 || a.nodes == 0 {
        bail!("--ranks and --nodes must be positive");
    }
    Ok(a)
}

/// Failures seen on this rank.
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

fn config(name: &str, nodes: usize, group: usize, seed: u64, timeout: Duration) -> Result<SyncConfig> {
    let mut cfg = SyncConfig::new(name.parse::<Scheme>()?);
    cfg.nodes = nodes;
    cfg.group = group;
    cfg.seed = seed;
    cfg.timeout = timeout;
    cfg.kernels = KERNELS.get().copied().unwrap_or_default();
    cfg.node_of = NODE_MAP.get().cloned();
    if let Some(&c) = PIPELINE_CHUNK.get() {
        cfg.pipeline_chunk = c;
    }
    Ok(cfg)
}

fn all_reduce(world: &dyn Communicator, cfg: &SyncConfig, grad: &[f32]) -> Result<Vec<f32>> {
    let mut out = grad.to_vec();
    GradSync::new(world, cfg.clone())?.all_reduce_mean(&mut out)?;
    Ok(out)
}

fn digests(world: &dyn Communicator, x: &[f32], timeout: Duration) -> Result<Vec<u64>> {
    let mut all = vec![0u8; 8 * world.size()];
    world.all_gather(&digest(x).to_le_bytes(), &mut all, Deadline::after(timeout))?;
    Ok(all.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
}

const SCHEMES: [&str; 16] = [
    "fp32",
    "fp16",
    "bf16",
    "qgz-int8",
    "qgz-int4",
    "qgz-int8-sr",
    "qgz-int4-sr",
    "qgz-int8-hier",
    "qgz-int4-hier",
    "qgz-int4-int8-hier",
    "qgz-int4-hier-sr",
    "nbit-1",
    "nbit-2",
    "nbit-4",
    "nbit-8",
    "nbit-2-sr",
];

fn bounds_suite(world: &dyn Communicator, a: &Args, rep: &mut Report) -> Result<()> {
    let (p, me) = (world.size(), world.rank());
    let shape = nodes_of(a, p)?;
    // With every rank alone on its node, a hierarchical scheme has no
    // intra-node stage: rounded to nearest, it is the one-shot scheme at its
    // inter-node width, bit for bit.
    let alone = (0..shape.nodes()).all(|n| shape.members(n).len() == 1);
    let mut case = 0u64;
    for name in SCHEMES {
        let flat_twin = name
            .strip_suffix("-hier")
            .filter(|_| alone && p > 1)
            .and_then(|s| s.rsplit('-').next())
            .map(|bits| format!("qgz-{bits}"));
        let mut worst = 0.0f64;
        for (n, group) in [(1usize, 64usize), (13, 4), (1000, 64), (4099, 512)] {
            for kind in GradKind::ALL {
                case += 1;
                let cfg = config(name, a.nodes, group, case, a.timeout)?;
                let grad = gradient(kind, n, case, me);
                let out = all_reduce(world, &cfg, &grad)?;
                let again = all_reduce(world, &cfg, &grad)?;
                let d = digests(world, &out, a.timeout)?;
                let what = format!("{name} n={n} group={group} {kind} ranks={p} nodes={}", a.nodes);
                rep.check(d.iter().all(|&x| x == d[0]), || format!("{what}: ranks disagree: {d:x?}"));
                rep.check(digest(&again) == digest(&out), || format!("{what}: a repeated run differs"));
                if let Some(twin) = &flat_twin {
                    let flat = all_reduce(world, &config(twin, a.nodes, group, case, a.timeout)?, &grad)?;
                    rep.check(digest(&flat) == digest(&out), || {
                        format!("{what}: differs from {twin} with every rank alone on its node")
                    });
                }
                if me == 0 {
                    let reference = bound::reference_on(&cfg, &shape, n, &|r| gradient(kind, n, case, r));
                    let (violations, err, b, ratio) = bound::compare(&out, &reference);
                    worst = worst.max(ratio);
                    rep.check(violations == 0, || {
                        format!("{what}: {violations} elements over the bound (max error {err:e}, bound {b:e}, ratio {ratio:.3})")
                    });
                }
            }
        }
        if me == 0 {
            eprintln!("bounds: {name}: largest error / bound over all cases = {worst:.3}");
            // A bound far above every error would make the checks above
            // unfalsifiable: the worst case must come reasonably close. (One
            // rank's f32 "sum" is its own gradient, exact: nothing to bound.)
            let exact_alone = p == 1 && worst == 0.0;
            rep.check(worst >= 0.1 || exact_alone, || {
                format!("{name}: the bound is loose (largest error/bound {worst:.3} < 0.1)")
            });
        }
        // Non-finite values reach every rank.
        let n = 777;
        let mut grad = gradient(GradKind::Normal, n, 99, me);
        if me == 1 % p {
            grad[3] = f32::NAN;
        }
        if me == p - 1 {
            grad[n - 2] = f32::INFINITY;
        }
        let cfg = config(name, a.nodes, 64, 5, a.timeout)?;
        let out = all_reduce(world, &cfg, &grad)?;
        let d = digests(world, &out, a.timeout)?;
        rep.check(!out[3].is_finite() && !out[n - 2].is_finite(), || {
            format!("{name}: NaN/inf lost on rank {me}: out[3] = {}, out[{}] = {}", out[3], n - 2, out[n - 2])
        });
        rep.check(d.iter().all(|&x| x == d[0]), || format!("{name}: ranks disagree with non-finite input"));
    }
    Ok(())
}

/// `Σ e / sqrt(Σ e²)` of the errors against the mean over `trials` seeds.
fn z_statistic(world: &dyn Communicator, name: &str, a: &Args, x: &[f32], trials: u64) -> Result<f64> {
    let p = world.size();
    let (mut s1, mut s2) = (0.0f64, 0.0f64);
    for seed in 0..trials {
        let cfg = config(name, a.nodes, 64, 1000 + seed, a.timeout)?;
        let out = all_reduce(world, &cfg, x)?;
        // Every rank holds the same `x`, so the mean is `x`.
        for (o, v) in out.iter().zip(x) {
            let e = f64::from(*o) - f64::from(*v) * p as f64 / p as f64;
            s1 += e;
            s2 += e * e;
        }
    }
    Ok(if s2 > 0.0 { s1 / s2.sqrt() } else { 0.0 })
}

fn stochastic_suite(world: &dyn Communicator, a: &Args, rep: &mut Report) -> Result<()> {
    let n = 2048;
    for (sr, qmax_or_levels, is_qgz) in [
        ("qgz-int4-sr", 7.0, true),
        ("qgz-int8-sr", 127.0, true),
        ("qgz-int4-hier-sr", 7.0, true),
        ("nbit-2-sr", 3.0, false),
        ("nbit-4-sr", 15.0, false),
    ] {
        // 0.3 of a quantization step everywhere except the value that fixes
        // the step: round-to-nearest drops them all (bias −0.3 step).
        let step = 1.0f32 / qmax_or_levels;
        let x: Vec<f32> = (0..n)
            .map(|i| {
                if is_qgz {
                    if i % 64 == 0 {
                        1.0
                    } else {
                        0.3 * step
                    }
                } else if i == 0 {
                    0.0
                } else if i == 1 {
                    1.0
                } else {
                    0.3 * step
                }
            })
            .collect();
        let z = z_statistic(world, sr, a, &x, 40)?;
        let rn = sr.trim_end_matches("-sr");
        let z_rn = z_statistic(world, rn, a, &x, 3)?;
        rep.check(z.abs() < 5.0, || format!("{sr}: stochastic rounding looks biased: z = {z:.2}"));
        rep.check(z_rn.abs() > 5.0, || {
            format!("{rn}: the bias test cannot see round-to-nearest's bias: z = {z_rn:.2}")
        });
        if world.rank() == 0 {
            eprintln!("stochastic: {sr} z = {z:+.2}; {rn} z = {z_rn:+.2}");
        }
    }
    Ok(())
}

fn feedback_suite(world: &dyn Communicator, a: &Args, rep: &mut Report) -> Result<()> {
    let (p, me) = (world.size(), world.rank());
    let shape = nodes_of(a, p)?;
    let (n, steps) = (3001usize, 16usize);
    for name in ["qgz-int4-ef", "qgz-int8-ef", "qgz-int4-hier-ef", "nbit-4-ef", "fp16-ef", "bf16-ef"] {
        let grad = gradient(GradKind::Normal, n, 7, me);
        let drift = |name: &str| -> Result<Vec<f64>> {
            let cfg = config(name, a.nodes, 64, 11, a.timeout)?;
            let mut sync = GradSync::new(world, cfg)?;
            let mut total = vec![0.0f64; n];
            for _ in 0..steps {
                let mut g = grad.clone();
                sync.all_reduce_mean(&mut g)?;
                total.iter_mut().zip(&g).for_each(|(t, v)| *t += f64::from(*v));
            }
            Ok(total)
        };
        let with = drift(name)?;
        let without = drift(name.trim_end_matches("-ef"))?;
        let cfg = config(name, a.nodes, 64, 11, a.timeout)?;
        let reference = bound::reference_on(&cfg, &shape, n, &|r| gradient(GradKind::Normal, n, 7, r));
        let dev =
            |t: &[f64]| t.iter().zip(&reference.mean).map(|(s, m)| (s - steps as f64 * m).abs()).fold(0.0, f64::max);
        let single = reference.bound.iter().copied().fold(0.0, f64::max);
        let (d_with, d_without) = (dev(&with), dev(&without));
        rep.check(d_with <= 3.0 * single, || {
            format!("{name}: {steps}-step drift {d_with:e} exceeds 3 single-step bounds ({single:e})")
        });
        rep.check(d_with * 2.0 < d_without, || {
            format!("{name}: error feedback does not help: drift {d_with:e} with, {d_without:e} without")
        });
        if me == 0 {
            eprintln!("feedback: {name}: {steps}-step drift {d_with:.3e} with, {d_without:.3e} without (one-step bound {single:.3e})");
        }
    }
    Ok(())
}

fn fault_suite(world: &dyn Communicator, a: &Args, fault: Fault) -> Result<()> {
    let faulty = if a.fault_at_split {
        FaultyComm::at_split(world, a.fault_rank, fault)
    } else {
        FaultyComm::new(world, a.fault_rank, fault, 2)
    };
    let cfg = config("qgz-int4-hier", a.nodes, 512, 1, a.timeout)?;
    let mut sync = GradSync::new(&faulty, cfg)?;
    let grad = gradient(GradKind::Normal, 100_000, 1, world.rank());
    for _ in 0..4 {
        let mut g = grad.clone();
        sync.all_reduce_mean(&mut g)?;
    }
    Ok(())
}

/// Inputs of the `digests` suite: (elements, group) × kinds, seeds from
/// the case number, so any backend can rerun exactly these.
const DIGEST_SIZES: [(usize, usize); 3] = [(13, 4), (1000, 64), (4099, 512)];
const DIGEST_KINDS: [GradKind; 3] = [GradKind::Normal, GradKind::HeavyTailed, GradKind::Outliers];

fn read_expected(path: &PathBuf) -> Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut map = HashMap::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let (key, d) = line
            .rsplit_once('\t')
            .with_context(|| format!("{}:{}: expected `case<TAB>digest`", path.display(), i + 1))?;
        map.insert(key.to_string(), d.trim().to_string());
    }
    Ok(map)
}

fn digests_suite(world: &dyn Communicator, a: &Args, rep: &mut Report) -> Result<()> {
    let (p, me) = (world.size(), world.rank());
    let shape = nodes_of(a, p)?;
    let expected = match (&a.expect, me) {
        (Some(path), 0) => Some(read_expected(path)?),
        _ => None,
    };
    let (mut lines, mut compared) = (Vec::new(), 0usize);
    let mut case = 5000u64;
    for name in SCHEMES {
        for (n, group) in DIGEST_SIZES {
            for kind in DIGEST_KINDS {
                case += 1;
                let cfg = config(name, a.nodes, group, case, a.timeout)?;
                let grad = gradient(kind, n, case, me);
                let out = all_reduce(world, &cfg, &grad)?;
                let d = digests(world, &out, a.timeout)?;
                let key = format!("{name} n={n} group={group} {kind} seed={case} ranks={p} nodes={}", a.nodes);
                rep.check(d.iter().all(|&x| x == d[0]), || format!("{key}: ranks disagree: {d:x?}"));
                if me != 0 {
                    continue;
                }
                let mine = format!("{:016x}", digest(&out));
                let reference = bound::reference_on(&cfg, &shape, n, &|r| gradient(kind, n, case, r));
                let (violations, err, b, _) = bound::compare(&out, &reference);
                rep.check(violations == 0, || format!("{key}: {violations} elements over the bound ({err:e} > {b:e})"));
                // fp32 is the engine's own sum, in the engine's order.
                if let (Some(exp), true) = (&expected, name != "fp32") {
                    compared += 1;
                    match exp.get(&key) {
                        None => rep.check(false, || {
                            format!("{key}: no expected digest (record it with the same ranks and nodes)")
                        }),
                        Some(e) => {
                            rep.check(*e == mine, || format!("{key}: digest {mine} differs from the recorded {e}"))
                        }
                    }
                }
                lines.push(format!("{key}\t{mine}"));
            }
        }
    }
    // Error feedback carries residuals between steps: three steps of one
    // synchronization state, the last step's result recorded.
    for name in ["fp16-ef", "bf16-ef", "qgz-int8-ef", "qgz-int4-ef"] {
        for (n, group) in DIGEST_SIZES {
            case += 1;
            let cfg = config(name, a.nodes, group, case, a.timeout)?;
            let grad = gradient(GradKind::Normal, n, case, me);
            let mut sync = GradSync::new(world, cfg)?;
            let mut out = grad.clone();
            for _ in 0..3 {
                out.copy_from_slice(&grad);
                sync.all_reduce_mean(&mut out)?;
            }
            let d = digests(world, &out, a.timeout)?;
            let key = format!("{name} n={n} group={group} steps=3 seed={case} ranks={p} nodes={}", a.nodes);
            rep.check(d.iter().all(|&x| x == d[0]), || format!("{key}: ranks disagree: {d:x?}"));
            if me != 0 {
                continue;
            }
            let mine = format!("{:016x}", digest(&out));
            if let Some(exp) = &expected {
                compared += 1;
                match exp.get(&key) {
                    None => rep.check(false, || {
                        format!("{key}: no expected digest (record it with the same ranks and nodes)")
                    }),
                    Some(e) => rep.check(*e == mine, || format!("{key}: digest {mine} differs from the recorded {e}")),
                }
            }
            lines.push(format!("{key}\t{mine}"));
        }
    }
    if me == 0 {
        if let Some(path) = &a.write {
            std::fs::write(path, lines.join("\n") + "\n").with_context(|| format!("writing {}", path.display()))?;
            eprintln!("digests: {} cases written to {}", lines.len(), path.display());
        }
        if expected.is_some() {
            eprintln!(
                "digests: {compared} results compared bit for bit with {}",
                a.expect.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn bench_suite(world: &dyn Communicator, a: &Args, rep: &mut Report) -> Result<()> {
    let names: Vec<&str> =
        if a.schemes.is_empty() { Scheme::BASE_NAMES.to_vec() } else { a.schemes.iter().map(String::as_str).collect() };
    for name in names {
        let opts = BenchOptions {
            config: config(name, a.nodes, 512, 1, a.timeout)?,
            bytes: a.bytes,
            kind: GradKind::Normal,
            iterations: a.iterations.max(1),
            warmup: 2,
            fault: None,
            compare_f32: true,
        };
        let r = bench::run(world, &opts)?;
        if world.rank() == 0 {
            rep.check(r.within_bound, || format!("bench {name}: {} elements over the bound", r.bound_violations));
            rep.check(r.bitwise_identical, || format!("bench {name}: ranks disagree"));
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", serde_json::to_string(&r)?)?;
            out.flush()?;
        }
    }
    Ok(())
}

fn run(world: &dyn Communicator, a: &Args) -> Result<Report> {
    let mut rep = Report::default();
    match a.suite.as_str() {
        "bounds" => bounds_suite(world, a, &mut rep)?,
        "stochastic" => stochastic_suite(world, a, &mut rep)?,
        "feedback" => feedback_suite(world, a, &mut rep)?,
        "all" => {
            bounds_suite(world, a, &mut rep)?;
            stochastic_suite(world, a, &mut rep)?;
            feedback_suite(world, a, &mut rep)?;
        }
        "fault" => fault_suite(world, a, a.fault.context("--suite fault needs --fault")?)?,
        "digests" => digests_suite(world, a, &mut rep)?,
        "bench" => bench_suite(world, a, &mut rep)?,
        other => bail!("unknown suite `{other}` (bounds, stochastic, feedback, all, fault, digests, bench)"),
    }
    Ok(rep)
}

/// Runs the suite on this rank of a started job and gathers the verdict.
fn job(world: &dyn Communicator, args: &Args) -> ExitCode {
    let rep = match run(world, args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("qsync-sync-check: {e:#} (seen by rank {})", world.rank());
            world.abort(3);
        }
    };
    // Every rank's failures, counted on rank 0.
    let mut all = vec![0u8; 8 * world.size()];
    let mine = rep.failures.len() as u64;
    if let Err(e) = world.all_gather(&mine.to_le_bytes(), &mut all, Deadline::after(args.timeout)) {
        eprintln!("qsync-sync-check: rank {}: {e}", world.rank());
        world.abort(3);
    }
    let total: u64 = all.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).sum();
    for f in &rep.failures {
        eprintln!("FAIL (rank {}): {f}", world.rank());
    }
    if world.rank() == 0 {
        eprintln!(
            "qsync-sync-check: suite {} on {} ranks ({}), {} nodes: {} checks on rank 0, {total} failures over all ranks",
            args.suite,
            world.size(),
            world.backend(),
            args.nodes,
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
            eprintln!("qsync-sync-check: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(not(feature = "mpi"))]
fn mpi_main(_: &Args) -> ExitCode {
    eprintln!("qsync-sync-check: built without the `mpi` feature: use --backend nccl");
    ExitCode::from(2)
}

#[cfg(feature = "nccl")]
fn nccl_main(args: &Args) -> ExitCode {
    use qsync_runtime::nccl::{launch_self, probe, rank_from_env, RankEnv};
    if RankEnv::present() {
        // One rank of a launched job.
        return match rank_from_env("qsync-sync-check", args.timeout) {
            Ok(world) => job(&world, args),
            Err(code) => ExitCode::from(code),
        };
    }
    // The launcher.
    match probe() {
        Ok(info) if args.suite == "probe" => {
            let v = info.version;
            eprintln!("NCCL {}.{}.{} ({v}), loadable with the CUDA driver", v / 10000, v / 100 % 100, v % 100);
            return ExitCode::SUCCESS;
        }
        Ok(info) => eprintln!("qsync-sync-check: NCCL {}: starting {} ranks", info.version, args.ranks),
        Err(e) => {
            eprintln!("qsync-sync-check: {e}");
            return ExitCode::from(2);
        }
    }
    ExitCode::from(launch_self("qsync-sync-check", args.ranks, args.timeout))
}

#[cfg(not(feature = "nccl"))]
fn nccl_main(_: &Args) -> ExitCode {
    eprintln!("qsync-sync-check: built without the `nccl` feature");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("qsync-sync-check: {e:#}");
            return ExitCode::from(2);
        }
    };
    if args.backend == "nccl" {
        nccl_main(&args)
    } else {
        mpi_main(&args)
    }
}
