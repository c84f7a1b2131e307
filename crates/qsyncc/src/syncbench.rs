//! `qsyncc sync-bench`: a thin wrapper over `qsync_runtime::bench`, run on
//! every rank of an `mpirun` job (`--backend mpi`), or over NCCL
//! (`--backend nccl`): the command then launches `--ranks N` copies of
//! itself on this machine (`qsync_runtime::nccl::spawn_local`, the NCCL
//! unique id passed in the environment) and each copy is one rank. Rank 0
//! prints the report; any failure after the engine is up ends the whole job
//! (`abort`) with the error printed by the rank that saw it, so no rank
//! waits forever on a dead peer. Without CUDA or NCCL, `--backend nccl` is
//! a "not found (searched: …)" error, exit status 2.
//!
//! Each backend is a feature of qsyncc (`mpi`: Open MPI at build time;
//! `nccl`), off in a bare build; a backend left out is an error naming its
//! feature, exit status 2.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;

use qsync_runtime::bench::BenchOptions;
use qsync_runtime::fault::Fault;
use qsync_runtime::testdata::GradKind;
use qsync_runtime::{Gather, Scheme, SyncConfig};

/// `qsyncc sync-bench` arguments.
#[derive(Args, Debug, Clone)]
pub struct SyncBenchArgs {
    /// fp32, fp16, bf16, qgz-int8, qgz-int4, qgz-int8-hier, qgz-int4-hier,
    /// qgz-intA-intB-hier, nbit-1/2/4/8; suffixes -sr (stochastic rounding), -ef (error feedback).
    /// With `--collective all-gather`: qwz, hpz, qwz-hpz, fp16, bf16, fp32.
    #[arg(long)]
    pub scheme: String,
    /// The collective: `all-reduce` (a gradient synchronization), or the
    /// sharded `all-gather` / `reduce-scatter` of ZeRO-3 (qwZ, hpZ, qgZ:
    /// `qsync_runtime::shard`), reported against fp16 all-gather / fp32
    /// reduce-scatter bytes. `all-to-all`: the engine's all-to-all alone,
    /// `--bytes` from each rank in `--messages` exchanges one after another
    /// (`--scheme` is not used): what the transport costs per byte and per
    /// message, with no kernel around it.
    #[arg(long, default_value = "all-reduce", value_parser = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"])]
    pub collective: String,
    /// With `--collective all-to-all`: the exchanges `--bytes` is sent in.
    #[arg(long, default_value_t = 1)]
    pub messages: usize,
    /// Gradient size in bytes (f32 elements × 4); K, M, G (or KiB, MiB, GiB) suffixes, powers of 1024.
    #[arg(long, value_parser = parse_size)]
    pub bytes: usize,
    /// Emulated nodes: the world's ranks split node-major into this many equal nodes.
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Elements per quantization group (one f32 scale each).
    #[arg(long, default_value_t = 512)]
    pub group: usize,
    /// Elements per piece of a shard in the pipelined schemes (16-bit and
    /// one-shot qgZ over MPI); 0: one piece a shard (no pipeline). Default:
    /// the runtime's, 256 Ki.
    #[arg(long)]
    pub pipeline_chunk: Option<usize>,
    /// How qgZ's all-reduce gathers reduced shards: `quantized` or `f32`.
    #[arg(long, default_value = "quantized", value_parser = ["quantized", "f32"])]
    pub gather: String,
    /// Synthetic gradient: normal, heavy-tailed, zeros, tiny, outliers.
    #[arg(long, default_value = "normal")]
    pub gradient: String,
    #[arg(long, default_value_t = 10)]
    pub iterations: usize,
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Deadline of every communicator call, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Communication engine: `mpi` (under mpirun) or `nccl`.
    #[arg(long, default_value = "mpi", value_parser = ["mpi", "nccl"])]
    pub backend: String,
    /// With `--backend nccl`: the number of ranks to start on this machine
    /// (several may share one GPU: NCCL ≥ 2.30).
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// This rank exits abruptly in the middle of the timed synchronization.
    #[arg(long)]
    pub kill_rank: Option<usize>,
    /// This rank stalls (sleeps an hour) in the middle of the timed synchronization.
    #[arg(long)]
    pub stall_rank: Option<usize>,
    /// Print one JSON object (rank 0).
    #[arg(long)]
    pub json: bool,
    /// Skip timing the engine's own f32 all-reduce (the job then moves only
    /// the scheme's bytes: for counting what crosses the links).
    #[arg(long)]
    pub skip_f32: bool,
    /// Leave the C allocator as it is. By default the benchmark keeps freed
    /// memory in the process (`qsync_runtime::memory`), so every scheme
    /// reuses its buffers; this measures a process that does not, paying
    /// fresh pages at every call (see `page_faults_per_sync`).
    #[arg(long)]
    pub fresh_memory: bool,
}

/// `4096`, `64K`, `16M`, `1G` (binary multiples).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix("ib")).unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("`{s}` is not a size (e.g. 4096, 64K, 16M, 16MiB)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("`{s}` is too large"))
}

fn options(args: &SyncBenchArgs) -> Result<BenchOptions> {
    let scheme: Scheme = args.scheme.parse()?;
    let mut config = SyncConfig::new(scheme);
    config.nodes = args.nodes;
    config.seed = args.seed;
    config.group = args.group;
    if let Some(c) = args.pipeline_chunk {
        config.pipeline_chunk = c;
    }
    config.gather = if args.gather == "f32" { Gather::F32 } else { Gather::Quantized };
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        bail!("--timeout must be a positive number of seconds");
    }
    config.timeout = Duration::from_secs_f64(args.timeout);
    let fault = match (args.kill_rank, args.stall_rank) {
        (Some(_), Some(_)) => bail!("--kill-rank and --stall-rank are exclusive"),
        (Some(r), None) => Some((r, Fault::Exit)),
        (None, Some(r)) => Some((r, Fault::Stall(Duration::from_secs(3600)))),
        (None, None) => None,
    };
    if args.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    Ok(BenchOptions {
        config,
        bytes: args.bytes,
        kind: args.gradient.parse::<GradKind>().map_err(anyhow::Error::msg)?,
        iterations: args.iterations,
        warmup: args.warmup,
        fault,
        compare_f32: !args.skip_f32,
    })
}

#[cfg(any(feature = "mpi", feature = "nccl"))]
fn render(r: &qsync_runtime::bench::BenchReport, json: bool) -> Result<String> {
    if json {
        return Ok(serde_json::to_string(r)? + "\n");
    }
    let (a, m) = (&r.phases, &r.phases_max);
    let phases = format!(
        "phases per iteration, rank 0 (max over ranks): quantize {:.4} ({:.4}) s, exchange {:.4} ({:.4}) s, \
         wait {:.4} ({:.4}) s, dequantize {:.4} ({:.4}) s, other {:.4} ({:.4}) s\n{}",
        a.quantize_s,
        m.quantize_s,
        a.exchange_s,
        m.exchange_s,
        a.wait_s,
        m.wait_s,
        a.dequantize_s,
        m.dequantize_s,
        a.other_s,
        m.other_s,
        match r.page_faults_per_sync {
            Some(f) => format!(
                "page faults per synchronization (max over ranks): {f:.0} ({:.1} MiB first touched)\n",
                f * 4096.0 / (1 << 20) as f64
            ),
            None => String::new(),
        },
    );
    Ok(format!(
        "scheme {} on {} ranks ({} nodes, {}), {} bytes ({} f32), group {}, gather {}\n\
         wire bytes per rank: {:.0} ({:.0} intra-node, {:.0} inter-node) = {:.4} of f32 ring all-reduce's {:.0}\n\
         error vs exact f64 mean: max {:.3e}, bound {:.3e} (largest error/bound {:.3}), {}\n\
         ranks bitwise identical: {}\n\
         time: {:.6} s median of {} vs the engine's f32 all-reduce {:.6} s ({:.2}x){}\n{}",
        r.scheme,
        r.ranks,
        r.nodes,
        r.backend,
        r.bytes,
        r.elements,
        r.group,
        r.gather,
        r.wire_bytes_per_rank,
        r.intra_node_bytes_per_rank,
        r.inter_node_bytes_per_rank,
        r.wire_fraction,
        r.ring_f32_bytes_per_rank,
        r.max_abs_error,
        r.error_bound,
        r.max_error_to_bound,
        if r.within_bound {
            "within bound".to_string()
        } else {
            format!("{} elements OVER the bound", r.bound_violations)
        },
        r.bitwise_identical,
        r.seconds,
        r.iterations,
        r.f32_allreduce_seconds,
        if r.seconds > 0.0 { r.f32_allreduce_seconds / r.seconds } else { 0.0 },
        if r.f32_allreduce_seconds == 0.0 { " (not timed: --skip-f32)" } else { "" },
        phases,
    ))
}

/// Runs the benchmark on this rank; `Some(text)` on rank 0.
pub fn run(args: &SyncBenchArgs) -> Result<Option<String>> {
    if args.collective == "all-to-all" {
        return run_exchange(args);
    }
    if args.collective != "all-reduce" {
        return crate::shardbench::run(args);
    }
    let opts = options(args)?;
    if args.backend == "nccl" {
        return run_nccl(args, &opts);
    }
    run_mpi(args, &opts)
}

#[cfg(feature = "mpi")]
fn run_mpi(args: &SyncBenchArgs, opts: &BenchOptions) -> Result<Option<String>> {
    if !args.fresh_memory {
        qsync_runtime::memory::retain_freed_memory();
    }
    let world = qsync_runtime::mpi::MpiComm::init()?;
    on_rank(&world, opts, args.json, qsync_runtime::mpi::control_variable("btl_tcp_eager_limit"))
}

/// `--collective all-to-all` under mpirun.
#[cfg(feature = "mpi")]
fn run_exchange(args: &SyncBenchArgs) -> Result<Option<String>> {
    if args.backend != "mpi" {
        bail!("--collective all-to-all runs over --backend mpi");
    }
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        bail!("--timeout must be a positive number of seconds");
    }
    qsync_runtime::memory::retain_freed_memory();
    let world = qsync_runtime::mpi::MpiComm::init()?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let eager = qsync_runtime::mpi::control_variable("btl_tcp_eager_limit");
    let r = match qsync_runtime::bench::exchange(
        &world,
        args.bytes,
        args.messages,
        args.nodes,
        args.iterations,
        args.warmup,
        timeout,
    ) {
        Ok(r) => qsync_runtime::bench::ExchangeReport { tcp_eager_limit_bytes: eager, ..r },
        Err(e) => {
            eprintln!("error: {e}");
            qsync_runtime::Communicator::abort(&world, 2);
        }
    };
    if qsync_runtime::Communicator::rank(&world) != 0 {
        return Ok(None);
    }
    Ok(Some(if args.json {
        serde_json::to_string(&r)? + "\n"
    } else {
        format!(
            "all-to-all on {} ranks ({} nodes, {}): {} bytes a rank in {} exchange(s) of {} bytes a peer: \
             {:.6} s median of {}\n",
            r.ranks, r.nodes, r.backend, r.bytes, r.messages, r.message_bytes, r.seconds, r.iterations
        )
    }))
}

#[cfg(not(feature = "mpi"))]
fn run_exchange(_: &SyncBenchArgs) -> Result<Option<String>> {
    Err(crate::feature_off("`sync-bench --collective all-to-all`", "mpi", "Open MPI"))
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &SyncBenchArgs, _: &BenchOptions) -> Result<Option<String>> {
    Err(crate::feature_off("`sync-bench --backend mpi`", "mpi", "Open MPI"))
}

#[cfg(not(feature = "nccl"))]
fn run_nccl(_: &SyncBenchArgs, _: &BenchOptions) -> Result<Option<String>> {
    Err(crate::feature_off("`sync-bench --backend nccl`", "nccl", "NCCL and CUDA, loaded at run time"))
}

/// The benchmark on one rank of a started job; the world is aborted on error.
#[cfg(any(feature = "mpi", feature = "nccl"))]
fn on_rank(
    world: &dyn qsync_runtime::Communicator,
    opts: &BenchOptions,
    json: bool,
    tcp_eager_limit_bytes: Option<u64>,
) -> Result<Option<String>> {
    let report = match qsync_runtime::bench::run(world, opts) {
        Ok(r) => qsync_runtime::bench::BenchReport { tcp_eager_limit_bytes, ..r },
        Err(e) => {
            // The error names the rank (world rank) itself.
            eprintln!("error: {e}");
            world.abort(2);
        }
    };
    if world.rank() == 0 {
        Ok(Some(render(&report, json)?))
    } else {
        Ok(None)
    }
}

/// `--backend nccl`: a rank (started by the launcher) or the launcher.
#[cfg(feature = "nccl")]
fn run_nccl(args: &SyncBenchArgs, opts: &BenchOptions) -> Result<Option<String>> {
    use qsync_runtime::nccl::{probe, spawn_local, NcclComm, RankEnv};
    if RankEnv::present() {
        let world = NcclComm::from_env(opts.config.timeout)?;
        return on_rank(&world, opts, args.json, None);
    }
    if args.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    let info = probe()?;
    eprintln!("sync-bench: NCCL {}: starting {} ranks on this machine", info.version, args.ranks);
    let exe = std::env::current_exe()?;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let grace = opts.config.timeout + Duration::from_secs(10);
    let outcomes = spawn_local(args.ranks, &exe, &argv, grace, Duration::from_secs(3600))?;
    let failed: Vec<String> =
        outcomes.iter().enumerate().filter(|(_, o)| !o.success()).map(|(r, o)| format!("rank {r}: {o}")).collect();
    if !failed.is_empty() {
        bail!("the NCCL job failed: {}", failed.join("; "));
    }
    // Rank 0 printed the report itself (the ranks share this stdout).
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("iB").is_err());
        assert!(parse_size("16MB").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }
}
