//! The qsync plan pipeline: `qsyncc MODEL --targets v100:16,t4:16 -o plan/`
//! as a library, with typed inputs ([`input`]) and typed errors
//! ([`Error`]).
//!
//! [`plan`] runs the phases of [`phases`] in order: load and rebatch the
//! model, the baselines every method is priced with, the search (every
//! method of `qsync-planner`: UP, DBS, QSync's greedy and allocator, the
//! joint batch-and-precision search), then per device type materialize
//! the chosen plan and run the per-device pipeline (`egraph-casts` by
//! default). [`Planned::write`] writes the plan directory atomically (a
//! temporary sibling renamed into place, so a failed run never leaves a
//! half-written plan). The crate is pure Rust: code generation (MLIR, PTX)
//! is the caller's [`CodeEmitter`], run by [`Planned::write_with`] inside
//! the temporary directory.
//!
//! ```no_run
//! use qsync_pipeline::{plan, PlanRequest};
//!
//! let mut req = PlanRequest::new("examples/squeezenet1_1.onnx", "v100:16,t4:16".parse::<qsync_pipeline::Targets>()?);
//! req.batch = 32;
//! let planned = plan(&req)?;
//! println!("{}: {:.1} samples/s", planned.outcome.chosen, planned.outcome.chosen_eval.samples_per_s);
//! planned.write(std::path::Path::new("plan"))?;
//! # Ok::<(), qsync_pipeline::Error>(())
//! ```
//!
//! The directory (schema `qsync-plan/4`; `manifest.json` is described by
//! the JSON Schema `crates/qsyncc/schema/qsync-plan-4.schema.json`, which
//! the tests validate every written manifest against — change both
//! together):
//!
//! - `manifest.json` — `schema`, `files` (every file of the directory,
//!   sorted), `model` {name, path, sha256}, `targets`
//!   (device, count, per node, local batch, gradient weight, memory
//!   fraction, role), `cluster` (devices, global batch, training precision,
//!   precisions), `sync` (the gradient synchronization every prediction
//!   assumes: `mode` given or auto, `scheme`, `group`, its relative error
//!   and, for auto, the budget and the schemes compared), `gradient_averaging` (each device's gradient is weighted by
//!   its local batch over the global batch: per type the weight of one
//!   device), `pipeline`, `indicator` (statistics sources), `method`,
//!   `objective`, `chosen` (a key of `methods`), `t_min_samples_per_s` and
//!   `t_min_rule` (`best`, `fastest`, `lowest`), `indicator_bound`, the
//!   chosen plan's `iteration_ms`, `samples_per_s` and `indicator_sum`, `devices` per type
//!   {role, count, local_batch, iteration_ms, compute_ms, memory, fits,
//!   indicator, casts, precision_histogram, files}, `methods` {up, dbs,
//!   qsync-greedy, qsync, joint-fastest, joint — those found} with
//!   iteration_ms, samples_per_s, indicator_sum and local_batches,
//!   `search` (candidates, classes, recovery steps, joint combinations),
//!   `optimality_gap`, `warnings` (byte-deterministic: the per-phase
//!   timings go only to `--json`'s `timings_s`);
//! - `<device>/model.onnx` — the planned graph with casts / QDQ
//!   materialized, at the device's local batch;
//! - `<device>/plan.json` — per node its precision, the forward / backward
//!   µs the chosen plan was simulated with (casts and batch scaling
//!   included), and Ω for the planned candidates;
//! - `timeline.json` — Chrome trace of the chosen plan's iteration;
//! - `report.md` — the verdict, the methods side by side, what changed per
//!   device, and an SVG timeline of UP against the chosen plan.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use qsync_planner::Outcome;

pub mod cluster;
pub mod devices;
mod error;
pub mod input;
pub mod load;
mod manifest;
mod phases;
pub mod report;

pub use error::{Error, Result};
pub use input::{
    parse_network, parse_optimizer, parse_precisions, ClusterInput, Emit, MemoryLimit, PassPipeline, PlanRequest,
    ShardCollectives, SyncChoice, TargetSpec, Targets, MAX_DIM,
};

/// Manifest schema version.
pub const SCHEMA: &str = "qsync-plan/4";

/// One device type's share of a plan, ready to write.
#[derive(Debug)]
pub struct DevicePlan {
    pub name: String,
    /// The planned graph, casts materialized and the pipeline run.
    pub model: qsync_ir::Model,
    /// `plan.json`.
    pub plan_json: serde_json::Value,
    /// Its entry in the manifest's `devices`.
    pub manifest_entry: serde_json::Value,
}

/// A finished plan, in memory.
#[derive(Debug)]
pub struct Planned {
    pub outcome: Outcome,
    pub devices: Vec<DevicePlan>,
    pub manifest: serde_json::Value,
    /// What `--json` prints.
    pub summary: serde_json::Value,
    pub report: String,
    pub timeline: String,
    pub warnings: Vec<String>,
    /// Which device each alias of the targets was taken as (`a100` →
    /// `a100-40gb`): for stderr, not the manifest.
    pub notes: Vec<String>,
    /// Kept for code emission at write time.
    model_path: PathBuf,
    emit: Vec<Emit>,
}

/// Writes a device's code (`model.mlir`, `kernels.ptx`) into its directory
/// of the plan being written; the files are those the manifest lists
/// ([`Emit::file`]).
pub trait CodeEmitter: Sync {
    /// `model_path`: the planned model file; `device`: the device type's
    /// plan; `kinds`: what to write (never empty); `dir`: the device's
    /// directory.
    fn emit(&self, model_path: &Path, device: &DevicePlan, kinds: &[Emit], dir: &Path) -> anyhow::Result<()>;
}

/// Plan `req.model` for the request's cluster: every method, the chosen
/// plan materialized per device type. Nothing is written.
pub fn plan(req: &PlanRequest) -> Result<Planned> {
    let mut clock = phases::Clock::new(req.progress);
    let mut w = phases::load(req, &mut clock)?;
    let b = phases::baselines(req, &mut w, &mut clock)?;
    let s = phases::search(&w, &b, &mut clock)?;
    clock.say("materializing each device's graph");
    let global_batch: u64 = s.out.chosen_eval.types.iter().map(|t| u64::from(t.count) * u64::from(t.local_batch)).sum();
    let written = phases::per_device(req, &w, &b, &s, global_batch)?;
    clock.lap("materialize and per-device pipeline");
    let phases::Search { out, chosen } = s;
    drop(chosen);
    Ok(phases::assemble(req, w, b, out, written, global_batch, &clock))
}

impl Planned {
    /// Write the plan directory. It is built in a temporary sibling and
    /// renamed into place when complete: an existing plan directory is
    /// replaced whole (no stale files), an existing directory that is not a
    /// plan (and not empty) is refused, and a failure leaves nothing.
    ///
    /// A plan that emits code needs [`Planned::write_with`].
    pub fn write(&self, dir: &Path) -> Result<()> {
        self.write_with(dir, None)
    }

    /// [`Planned::write`], with `code` writing each device's MLIR / PTX
    /// into the temporary directory before it is renamed into place.
    pub fn write_with(&self, dir: &Path, code: Option<&dyn CodeEmitter>) -> Result<()> {
        let out_err = |reason: String| Error::Output { path: dir.to_path_buf(), reason };
        if let (false, None) = (self.emit.is_empty(), code) {
            let kinds: Vec<&str> = self.emit.iter().map(|e| e.name()).collect();
            return Err(out_err(format!(
                "the plan emits {} but no code emitter was given (Planned::write_with)",
                kinds.join(", ")
            )));
        }
        if dir.exists() && !replaceable(dir) {
            return Err(out_err(
                "exists and is not a qsync plan directory (no manifest.json of schema qsync-plan/*); refusing to replace it"
                    .into(),
            ));
        }
        let name = dir.file_name().and_then(|n| n.to_str()).ok_or_else(|| out_err("has no file name".into()))?;
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|e| out_err(format!("creating its parent: {e}")))?;
        let tmp = parent.join(format!(".{name}.qsync-tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        if let Err(e) = self.write_into(&tmp, code) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(out_err(format!("{e:#}")));
        }
        let old = parent.join(format!(".{name}.qsync-old-{}", std::process::id()));
        if dir.exists() {
            std::fs::rename(dir, &old).map_err(|e| {
                let _ = std::fs::remove_dir_all(&tmp);
                out_err(format!("moving the previous plan aside: {e}"))
            })?;
        }
        std::fs::rename(&tmp, dir).map_err(|e| {
            let _ = std::fs::rename(&old, dir);
            let _ = std::fs::remove_dir_all(&tmp);
            out_err(format!("moving the new plan into place: {e}"))
        })?;
        let _ = std::fs::remove_dir_all(&old);
        Ok(())
    }

    fn write_into(&self, dir: &Path, code: Option<&dyn CodeEmitter>) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // Each device's model and plan are serialized on their own thread;
        // code generation (LLVM, MLIR) stays on this one.
        let save = |d: &DevicePlan| -> anyhow::Result<()> {
            let sub = dir.join(&d.name);
            std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
            load::save_model(&d.model, &sub.join("model.onnx"))?;
            write_json(&sub.join("plan.json"), &d.plan_json)
        };
        std::thread::scope(|scope| {
            let workers: Vec<_> = self.devices.iter().map(|d| scope.spawn(|| save(d))).collect();
            workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        })?;
        if let (false, Some(code)) = (self.emit.is_empty(), code) {
            for d in &self.devices {
                code.emit(&self.model_path, d, &self.emit, &dir.join(&d.name))
                    .with_context(|| format!("code for {}", d.name))?;
            }
        }
        std::fs::write(dir.join("timeline.json"), &self.timeline).context("writing timeline.json")?;
        std::fs::write(dir.join("report.md"), &self.report).context("writing report.md")?;
        // The manifest last: a directory with a manifest is complete.
        write_json(&dir.join("manifest.json"), &self.manifest)?;
        // `files` lists every file written, no more and no fewer.
        let mut found = Vec::new();
        list_files(dir, dir, &mut found)?;
        found.sort();
        let listed: Vec<String> = self.manifest["files"]
            .as_array()
            .map(|v| v.iter().filter_map(|f| f.as_str().map(String::from)).collect())
            .unwrap_or_default();
        if found != listed {
            bail!("internal error: the files written ({found:?}) are not the manifest's `files` ({listed:?})");
        }
        Ok(())
    }
}

/// Every file under `dir`, as `/`-separated paths relative to `root`.
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            list_files(root, &p, out)?;
        } else {
            let rel = p.strip_prefix(root).unwrap_or(&p);
            out.push(rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"));
        }
    }
    Ok(())
}

/// An empty directory, or one holding a qsync plan manifest.
fn replaceable(dir: &Path) -> bool {
    if !dir.is_dir() {
        return false;
    }
    if std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(false) {
        return true;
    }
    std::fs::read_to_string(dir.join("manifest.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|m| m["schema"].as_str().map(|s| s.starts_with("qsync-plan/")))
        .unwrap_or(false)
}

fn write_json(path: &Path, v: &serde_json::Value) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n").with_context(|| format!("writing {}", path.display()))
}
