//! `qsyncc sync-bench --collective all-gather|reduce-scatter`: a thin
//! wrapper over `qsync_runtime::shard_bench` (the sharded collectives of
//! ZeRO-3/FSDP with qwZ, hpZ and qgZ), on every rank of an `mpirun` job
//! (`--backend mpi`) or of a local NCCL job (`--backend nccl --ranks N`:
//! the command launches its ranks as `sync-bench` does). Rank 0 prints the
//! report: wire bytes per rank and their fraction of the fp16 all-gather's
//! (all-gather) or the fp32 reduce-scatter's (reduce-scatter), the error
//! against the exact values next to the documented bound, agreement across
//! ranks and the median time. `--scheme`: `qwz`, `hpz`, `qwz-hpz`, `fp16`,
//! `bf16`, `fp32` for an all-gather; `fp32`, `qgz-int8`, `qgz-int4`,
//! `qgz-…-hier` for a reduce-scatter. `--collective all-reduce` is the
//! plain `sync-bench`.

use std::time::Duration;

use anyhow::{bail, Result};

use qsync_runtime::shard_bench::{Collective, ShardBenchOptions};
use qsync_runtime::testdata::GradKind;
use qsync_runtime::{Kernels, NodeMap};

use crate::syncbench::SyncBenchArgs;

fn options(args: &SyncBenchArgs, collective: Collective, world: usize) -> Result<ShardBenchOptions> {
    if args.kill_rank.is_some() || args.stall_rank.is_some() {
        bail!("--kill-rank and --stall-rank apply to --collective all-reduce only");
    }
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        bail!("--timeout must be a positive number of seconds");
    }
    if args.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    Ok(ShardBenchOptions {
        collective,
        scheme: args.scheme.clone(),
        bytes: args.bytes,
        nodes: NodeMap::even(world, args.nodes)?,
        group: args.group,
        seed: args.seed,
        kind: args.gradient.parse::<GradKind>().map_err(anyhow::Error::msg)?,
        iterations: args.iterations,
        warmup: args.warmup,
        timeout: Duration::from_secs_f64(args.timeout),
        kernels: Kernels::Host,
    })
}

/// Runs the sharded benchmark on this rank; `Some(text)` on rank 0.
pub fn run(args: &SyncBenchArgs) -> Result<Option<String>> {
    let collective: Collective = args.collective.parse().map_err(anyhow::Error::msg)?;
    if args.backend == "nccl" {
        return run_nccl(args, collective);
    }
    run_mpi(args, collective)
}

#[cfg(any(feature = "mpi", feature = "nccl"))]
fn on_rank(world: &dyn qsync_runtime::Communicator, args: &SyncBenchArgs, c: Collective) -> Result<Option<String>> {
    let opts = options(args, c, world.size())?;
    let report = match qsync_runtime::shard_bench::run(world, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: rank {}: {e}", world.rank());
            world.abort(2);
        }
    };
    if world.rank() != 0 {
        return Ok(None);
    }
    if args.json {
        return Ok(Some(serde_json::to_string(&report)? + "\n"));
    }
    Ok(Some(qsync_runtime::shard_bench::render(&report)))
}

#[cfg(feature = "mpi")]
fn run_mpi(args: &SyncBenchArgs, c: Collective) -> Result<Option<String>> {
    if !args.fresh_memory {
        qsync_runtime::memory::retain_freed_memory();
    }
    let world = qsync_runtime::mpi::MpiComm::init()?;
    on_rank(&world, args, c)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(args: &SyncBenchArgs, c: Collective) -> Result<Option<String>> {
    options(args, c, args.nodes.max(1))?;
    Err(crate::feature_off("`sync-bench --backend mpi`", "mpi", "Open MPI"))
}

#[cfg(feature = "nccl")]
fn run_nccl(args: &SyncBenchArgs, c: Collective) -> Result<Option<String>> {
    use qsync_runtime::nccl::{probe, spawn_local, NcclComm, RankEnv};
    let timeout =
        Duration::from_secs_f64(if args.timeout > 0.0 && args.timeout.is_finite() { args.timeout } else { 60.0 });
    if RankEnv::present() {
        let world = NcclComm::from_env(timeout)?;
        return on_rank(&world, args, c);
    }
    if args.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    options(args, c, args.ranks)?;
    let info = probe()?;
    eprintln!("sync-bench: NCCL {}: starting {} ranks on this machine", info.version, args.ranks);
    let exe = std::env::current_exe()?;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let outcomes = spawn_local(args.ranks, &exe, &argv, timeout + Duration::from_secs(10), Duration::from_secs(3600))?;
    let failed: Vec<String> =
        outcomes.iter().enumerate().filter(|(_, o)| !o.success()).map(|(r, o)| format!("rank {r}: {o}")).collect();
    if !failed.is_empty() {
        bail!("the NCCL job failed: {}", failed.join("; "));
    }
    Ok(None)
}

#[cfg(not(feature = "nccl"))]
fn run_nccl(_: &SyncBenchArgs, _: Collective) -> Result<Option<String>> {
    Err(crate::feature_off("`sync-bench --backend nccl`", "nccl", "NCCL and CUDA, loaded at run time"))
}
