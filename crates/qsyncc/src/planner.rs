//! The plan pipeline: `qsyncc MODEL --targets v100:16,t4:16 -o plan/`, as a
//! library.
//!
//! [`plan`] loads the model, runs every method of `qsync-planner` (UP, DBS,
//! QSync's greedy and allocator, the joint batch-and-precision search),
//! materializes the chosen plan on each device type's graph and runs the
//! per-device pipeline (`egraph-casts` by default); [`Planned::write`] writes
//! the plan directory atomically (a temporary sibling renamed into place, so
//! a failed run never leaves a half-written plan). [`run`] is the CLI's thin
//! wrapper.
//!
//! ```no_run
//! use qsyncc::planner::{plan, PlanRequest};
//!
//! let mut req = PlanRequest::new("examples/squeezenet1_1.onnx", "v100:16,t4:16");
//! req.batch = 32;
//! let planned = plan(&req)?;
//! println!("{}: {:.1} samples/s", planned.outcome.chosen, planned.outcome.chosen_eval.samples_per_s);
//! planned.write(std::path::Path::new("plan"))?;
//! # Ok::<(), qsyncc::planner::PipelineError>(())
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

use anyhow::{bail, Context, Result};
use clap::Parser;
use qsync_cost::{GraphFacts, Plan, Precision};
use qsync_ir::infer::InferOptions;
use qsync_planner::{allocate, AllocOptions, Calibration, Eval, Indicator, Method, Objective, Outcome, TMin};
use qsync_sim::{PredictOptions, SimConfig, Target};
use serde_json::json;

use crate::load;

/// Manifest schema version.
pub const SCHEMA: &str = "qsync-plan/4";

/// Why the plan pipeline failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The request itself is wrong (unknown device, precision, flag value).
    #[error("{0}")]
    Request(String),
    /// Loading, planning or rewriting the model failed; the message names
    /// the file and, where there is one, the node.
    #[error("{0}")]
    Plan(String),
    /// The output directory could not be written, or is not ours to replace.
    #[error("{path}: {reason}")]
    Output { path: PathBuf, reason: String },
}

fn plan_err(e: anyhow::Error) -> PipelineError {
    PipelineError::Plan(format!("{e:#}"))
}

/// Everything the planner needs; [`PlanRequest::new`] gives the CLI's
/// defaults.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// An ONNX model (.onnx), TorchScript archive (.pt) or text IR (.qir).
    pub model: PathBuf,
    /// Device types and counts: `v100:16,t4:16` (`t4:16/4`: 4 per node);
    /// empty when `cluster` describes the cluster.
    pub targets: String,
    /// A cluster file (TOML; `qsync_sim::topology`), instead of `targets`.
    pub cluster: Option<PathBuf>,
    /// Every node's NIC at this rate (`25gbit`).
    pub network: Option<String>,
    /// Samples per device per iteration before any split (the global batch
    /// is this times the device count).
    pub batch: i64,
    /// Named symbolic dimensions: `("seq", 128)`.
    pub dims: Vec<(String, i64)>,
    /// Available memory of a device type: `t4=30%`.
    pub memory: Vec<String>,
    /// Precisions inference devices may use.
    pub precisions: Vec<Precision>,
    /// Passes run on each device's graph after materialization.
    pub pipeline: String,
    /// Activation / gradient statistics for the indicator (`--stats`,
    /// `qsync_planner::Calibration`'s JSON, what `scripts/calibrate.py`
    /// writes).
    pub stats: Option<PathBuf>,
    /// Timing profiles (`--profile`, what `qsyncc profile build` writes),
    /// one per device type at most: measured op times replace the analytic
    /// model's on the device each names, as in `qsyncc simulate`.
    pub profiles: Vec<PathBuf>,
    pub t_min: TMin,
    pub method: Method,
    pub objective: Objective,
    pub indicator_bound: Option<f64>,
    /// What the training device type computes in (default: AMP in its best
    /// 16-bit type).
    pub train_precision: qsync_planner::TrainPrecision,
    /// sgd, momentum or adam.
    pub optimizer: String,
    pub device_files: Vec<PathBuf>,
    /// `mlir` / `ptx` besides the ONNX always written.
    pub emit: Vec<String>,
    /// Gradient synchronization: `fp32`, a runtime scheme name
    /// (`qgz-int4-hier`, `fp16`, …) or `auto` (the fastest scheme whose
    /// relative error stays within `sync_error_budget`, fp32 when none is
    /// predicted faster).
    pub sync: String,
    /// Relative error `auto` may accept.
    pub sync_error_budget: f64,
    /// The path compressed schemes run on (`None`: the cluster's default,
    /// or for `auto` every path its devices have).
    pub sync_path: Option<qsync_sim::SyncPath>,
    /// The hosts' synchronization kernels (`--host-kernels`, what `qsyncc
    /// profile sync-kernels` writes; `None`: the build machine's).
    pub host_kernels: Option<qsync_sim::SyncKernels>,
    /// Elements per quantization group of the quantized schemes.
    pub sync_group: u32,
    /// The sharded collectives' precisions the sharded search may choose
    /// (`qsync_sim::CollectiveChoices::parse`): `fp` (16-bit all-gathers at
    /// the AMP type, FP32 reduce-scatters), `auto` (also qwZ, BF16, qgZ-int8
    /// and qgZ-int4, those within `sync_error_budget`), or a comma list of
    /// `qwz`, `bf16`, `qgz-int8`, `qgz-int4`, each of which must be within
    /// the budget.
    pub shard_collectives: String,
    /// Progress lines with elapsed seconds on stderr.
    pub progress: bool,
}

impl PlanRequest {
    pub fn new(model: impl Into<PathBuf>, targets: impl Into<String>) -> PlanRequest {
        PlanRequest {
            model: model.into(),
            targets: targets.into(),
            cluster: None,
            network: None,
            batch: 32,
            dims: Vec::new(),
            memory: Vec::new(),
            precisions: vec![Precision::Fp32, Precision::Fp16, Precision::Int8],
            pipeline: "egraph-casts".into(),
            stats: None,
            profiles: Vec::new(),
            t_min: TMin::Best,
            method: Method::Joint,
            objective: Objective::Indicator,
            indicator_bound: None,
            train_precision: qsync_planner::TrainPrecision::Auto,
            optimizer: "adam".into(),
            device_files: Vec::new(),
            emit: Vec::new(),
            sync: "fp32".into(),
            sync_error_budget: 0.01,
            sync_path: None,
            host_kernels: None,
            sync_group: 512,
            shard_collectives: "fp".into(),
            progress: false,
        }
    }
}

/// The synchronization the plan assumes: the scheme, the path it runs on,
/// and, for `auto`, what was compared — every scheme within the error
/// budget on every path that exists for the cluster's devices
/// ([`sync_paths`]), each priced by its whole predicted iteration (a path
/// that does not overlap the backward pass pays its full time). fp32 wins
/// ties.
fn resolve_sync(
    req: &PlanRequest,
    g: &qsync_ir::Graph,
    targets: &[Target],
    popts: &PredictOptions,
) -> Result<(qsync_sim::SyncSpec, serde_json::Value)> {
    use qsync_sim::{SyncScheme, SyncSpec};
    let group = req.sync_group;
    if !(2..=1 << 20).contains(&group) {
        return Err(request_err(format!("--sync-group {group} is outside 2..=1048576")));
    }
    let exist = qsync_sim::sync_paths(targets);
    let paths = match req.sync_path {
        Some(p) if !qsync_sim::path_exists(targets, p) => {
            return Err(request_err(format!(
                "--sync-path {}: not a path these devices synchronize on (they have: {})",
                p.name(),
                exist.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
            )))
        }
        Some(p) => vec![p],
        None => exist.clone(),
    };
    let describe = |spec: &SyncSpec| {
        json!({
            "name": spec.path.name(),
            "overlaps_backward": spec.path.overlaps(spec.scheme),
            "kernels": match (spec.scheme, spec.path) {
                (SyncScheme::Fp32, _) => "none (the engine's own all-reduce)",
                (_, qsync_sim::SyncPath::Device) => "device (qsync's PTX kernels)",
                _ => "host",
            },
        })
    };
    if req.sync != "auto" {
        let scheme = SyncScheme::parse(&req.sync).map_err(|e| request_err(format!("--sync: {e}")))?;
        let spec = SyncSpec::new(scheme, group).with_path(paths[0]);
        return Ok((
            spec,
            json!({ "mode": "given", "scheme": scheme.name(), "group": group, "relative_error": scheme.relative_error(),
                    "path": describe(&spec) }),
        ));
    }
    let budget = req.sync_error_budget;
    if !(budget.is_finite() && budget >= 0.0) {
        return Err(request_err(format!("--sync-error-budget must be a finite number ≥ 0, got {budget}")));
    }
    let analysis = std::sync::Arc::new(qsync_sim::GraphAnalysis::new(g, popts)?);
    let iteration_us = |spec: SyncSpec| -> Result<f64> {
        let mut o = popts.clone();
        o.config.sync = spec;
        let mut pred = qsync_sim::Predictor::with_analysis(g, analysis.clone(), targets.to_vec(), o)?;
        Ok(pred.result().iteration_us)
    };
    let fp32 = SyncSpec::new(SyncScheme::Fp32, group).with_path(paths[0]);
    let fp32_us = iteration_us(fp32)?;
    let mut considered = vec![(fp32, fp32_us)];
    for &path in &paths {
        for scheme in SyncScheme::candidates() {
            if scheme != SyncScheme::Fp32 && scheme.relative_error() <= budget {
                let spec = SyncSpec::new(scheme, group).with_path(path);
                considered.push((spec, iteration_us(spec)?));
            }
        }
    }
    // Stable: fp32 is first among equals, so ties keep fp32.
    considered.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (best, best_us) = considered[0];
    let rows: Vec<serde_json::Value> = considered
        .iter()
        .map(|(s, us)| json!({ "scheme": s.scheme.name(), "path": s.path.name(), "iteration_us": round(*us) }))
        .collect();
    Ok((
        best,
        json!({
            "mode": "auto", "scheme": best.scheme.name(), "group": group, "error_budget": budget,
            "relative_error": best.scheme.relative_error(), "path": describe(&best),
            "iteration_us": round(best_us), "fp32_iteration_us": round(fp32_us),
            "paths_available": exist.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "considered": rows,
        }),
    ))
}

/// The sharded collectives the search may choose (`--shard-collectives`)
/// and their names for the manifest. `auto` keeps those within
/// `--sync-error-budget`; a precision named in a list must be within it.
fn resolve_shard_collectives(
    req: &PlanRequest,
    targets: &[Target],
) -> Result<(qsync_sim::CollectiveChoices, Vec<&'static str>)> {
    use qsync_sim::{CollectiveChoices, GatherPrecision};
    let choices = CollectiveChoices::parse(&req.shard_collectives)
        .map_err(|e| request_err(format!("--shard-collectives: {e}")))?;
    let budget = req.sync_error_budget;
    if choices != CollectiveChoices::default() && !(budget.is_finite() && budget >= 0.0) {
        return Err(request_err(format!("--sync-error-budget must be a finite number ≥ 0, got {budget}")));
    }
    let p: u64 = targets.iter().map(|t| u64::from(t.count)).sum();
    let mut named: Vec<(&'static str, f64)> = Vec::new();
    if choices.qwz {
        named.push(("qwz", GatherPrecision::QwzInt8.relative_error()));
    }
    for r in &choices.reduce {
        named.push((r.name(), r.relative_error(p)));
    }
    if req.shard_collectives.trim() != "auto" {
        if let Some((name, err)) = named.iter().find(|(_, e)| *e > budget) {
            return Err(request_err(format!(
                "--shard-collectives {name}: its relative error {err:.4} on {p} devices exceeds --sync-error-budget \
                 {budget} (raise the budget or leave it out)"
            )));
        }
    }
    Ok((choices, named.into_iter().filter(|(_, e)| *e <= budget).map(|(n, _)| n).collect()))
}

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
    /// Which device each alias of `--targets` was taken as (`a100` →
    /// `a100-40gb`): for stderr, not the manifest.
    pub notes: Vec<String>,
    /// Kept for code emission at write time.
    model_path: PathBuf,
    emit: Vec<String>,
}

struct Clock {
    start: std::time::Instant,
    last: std::time::Instant,
    on: bool,
    phases: Vec<(String, f64)>,
}

impl Clock {
    fn new(on: bool) -> Clock {
        let now = std::time::Instant::now();
        Clock { start: now, last: now, on, phases: Vec::new() }
    }
    fn say(&self, msg: &str) {
        if self.on {
            eprintln!("[{:>6.2}s] {msg}", self.start.elapsed().as_secs_f64());
        }
    }
    fn lap(&mut self, phase: &str) {
        let now = std::time::Instant::now();
        self.phases.push((phase.to_string(), (now - self.last).as_secs_f64()));
        self.last = now;
    }
}

/// Plan `req.model` for `req.targets`: every method, the chosen plan
/// materialized per device type. Nothing is written.
pub fn plan(req: &PlanRequest) -> Result<Planned, PipelineError> {
    plan_inner(req).map_err(|e| match e.downcast::<PipelineError>() {
        Ok(p) => p,
        Err(e) => plan_err(e),
    })
}

fn request_err(msg: String) -> anyhow::Error {
    anyhow::Error::new(PipelineError::Request(msg))
}

fn plan_inner(req: &PlanRequest) -> Result<Planned> {
    if let Some(bad) = req.emit.iter().map(|e| e.trim()).find(|e| !matches!(*e, "onnx" | "mlir" | "ptx")) {
        return Err(request_err(format!("unknown --emit kind `{bad}` (expected onnx, mlir, ptx)")));
    }
    if let Some(code) = req.emit.iter().map(|e| e.trim()).find(|e| matches!(*e, "mlir" | "ptx")) {
        crate::codegen::require(&format!("`plan --emit {code}`")).map_err(|e| request_err(format!("{e:#}")))?;
    }
    // Flags are checked before any work: a bad pipeline fails at once.
    qsync_passes::pipeline_from_spec(&req.pipeline).map_err(|e| request_err(format!("--pipeline: {e:#}")))?;
    if !(1..=crate::MAX_DIM).contains(&req.batch) {
        return Err(request_err(format!("--batch {} is outside 1..={}", req.batch, crate::MAX_DIM)));
    }
    let mut clock = Clock::new(req.progress);
    let src = crate::simulate::ClusterSource {
        targets: &req.targets,
        cluster: req.cluster.as_deref(),
        network: req.network.as_deref(),
    };
    let cluster = crate::simulate::parse_cluster(&req.device_files, src, &req.memory)
        .map_err(|e| request_err(format!("{e:#}")))?;
    let cluster_json = cluster.describe();
    let networks = cluster.networks.clone();
    let fabric = cluster.fabric;
    let profiles =
        crate::simulate::load_profiles(&req.profiles, &cluster).map_err(|e| request_err(format!("{e:#}")))?;
    let crate::simulate::ClusterSpec { db, specs, fractions, notes, .. } = cluster;
    for &p in &req.precisions {
        if !specs.iter().any(|(n, _, _)| db.get(n).is_ok_and(|d| d.supports(p))) {
            return Err(request_err(format!("--precisions: no target supports {p}")));
        }
    }
    let optimizer = crate::simulate::parse_optimizer(&req.optimizer).map_err(|e| request_err(format!("{e:#}")))?;
    let calibration = match &req.stats {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
            Some(Calibration::from_json(&text).map_err(|e| {
                request_err(format!(
                    "--stats {}: {e} (activation and gradient statistics, as `scripts/calibrate.py` writes; a \
                     timing profile goes to --profile)",
                    p.display()
                ))
            })?)
        }
        None => None,
    };
    let bytes = std::fs::read(&req.model).with_context(|| format!("cannot read {}", req.model.display()))?;
    let crate::simulate::Prepared { loaded, batch, bindings, mut warnings } =
        crate::simulate::prepare(&req.model, req.batch, &req.dims)?;
    // A graph that fixes its batch and cannot be rebatched is planned at
    // that batch on every device: no batch split (the loader warns).
    let fixed_batch = loaded.fixed_batch.map(|_| batch as u32);
    let single_value_bn = single_value_batchnorm(&loaded.model.graph);
    if let Some(n) = single_value_bn.as_ref().filter(|_| batch < 2) {
        warnings.push(format!(
            "BatchNormalization {n:?} sees one value per sample and channel: training it (PyTorch's BatchNorm in \
             train mode) needs a local batch of at least 2, and --batch is {batch}"
        ));
    }
    clock.say(&format!("loaded {} ({} nodes)", req.model.display(), loaded.model.graph.node_count()));
    clock.lap("load");
    let g = &loaded.model.graph;
    let mut targets = Vec::new();
    for (name, count, per_node) in &specs {
        targets.push(Target {
            device: db.get(name)?.clone(),
            count: *count,
            per_node: *per_node,
            local_batch: batch as u32,
            plan: Plan::new(),
            memory_fraction: fractions.get(name).copied(),
            calibration: profiles.get(name).cloned(),
            network: networks.get(name).cloned(),
        });
    }
    // The per-device pipeline's egraph-casts stores the FP16/BF16 GEMM
    // weights as refreshed copies (unless told not to): the predictions
    // count their rewrite in the optimizer step.
    let weight_copies = req.pipeline.contains("egraph-casts") && !req.pipeline.contains("refresh=false");
    let mut popts = PredictOptions {
        bindings: bindings.clone(),
        work_scale: 1.0,
        optimizer,
        config: SimConfig::default(),
        weight_copies,
        reference_batch: Some(batch as u32),
        fabric,
        host_kernels: req.host_kernels.unwrap_or_else(qsync_sim::SyncKernels::host),
        ..PredictOptions::default()
    };
    // Every method is predicted with the synchronization the plan will run.
    let (sync_spec, sync_json) = resolve_sync(req, g, &targets, &popts)?;
    popts.config.sync = sync_spec;
    clock.say(&format!("gradient synchronization: {}", sync_spec.scheme.name()));
    let label = req.model.display().to_string();
    let facts = GraphFacts::new(g, &bindings).with_context(|| label.clone())?;
    let cands = qsync_planner::candidates(g, &facts);
    let is_cand: std::collections::HashSet<qsync_ir::NodeId> = cands.iter().copied().collect();
    // Weight statistics come from the values: external data found next to
    // the model is read for them. Initializers without data are counted
    // (and warned about) once, by the loader, the same in every command.
    let inlined = load::with_external_data_inline(&loaded.model)?;
    let ind = Indicator::new(inlined.as_ref().unwrap_or(g), &facts, &cands, calibration.as_ref());
    drop(inlined);
    if calibration.is_none() {
        warnings.push("no --stats: activation and gradient statistics are estimated from shapes".into());
    }
    // INT8 needs a calibrated scale for every activation it reads.
    if let Some(w) = ind.int8_warning(g).filter(|_| req.precisions.contains(&Precision::Int8)) {
        warnings.push(w);
    }
    let (shard_collectives, shard_allowed) = resolve_shard_collectives(req, &targets)?;
    let aopts = AllocOptions {
        precisions: req.precisions.clone(),
        train_precision: req.train_precision,
        t_min: req.t_min,
        method: req.method,
        objective: req.objective,
        indicator_bound: req.indicator_bound,
        opset: Some(loaded.model.opset()),
        fixed_local_batch: fixed_batch,
        min_local_batch: if single_value_bn.is_some() { 2 } else { 1 },
        shard_collectives,
        shard_error_budget: req.sync_error_budget,
        ..AllocOptions::default()
    };
    let mut prog = |m: &str| clock.say(m);
    let out =
        allocate(g, &facts, targets.clone(), popts.clone(), &ind, &aopts, &mut prog).with_context(|| label.clone())?;
    clock.phases.extend(out.phases.iter().cloned());
    clock.last = std::time::Instant::now();
    // The chosen plan, simulated once more for its per-node times.
    let chosen_targets: Vec<Target> = targets
        .iter()
        .zip(&out.chosen_eval.types)
        .map(|(t, te)| Target { plan: te.plan.clone(), local_batch: te.local_batch, ..t.clone() })
        .collect();
    let mut chosen = qsync_sim::Predictor::new(g, chosen_targets, popts).with_context(|| label.clone())?;
    chosen.result();
    let chosen = chosen;
    clock.say("materializing each device's graph");

    let emitted: Vec<String> =
        req.emit.iter().map(|e| e.trim().to_string()).filter(|e| e == "mlir" || e == "ptx").collect();
    let global_batch: u64 = out.chosen_eval.types.iter().map(|t| u64::from(t.count) * u64::from(t.local_batch)).sum();
    // Each device type's graph is materialized, run through the pipeline
    // and described on its own thread; the results keep the types' order.
    let per_device = |t: usize, te: &qsync_planner::TypeEval| -> Result<DevicePlan> {
        let pm =
            qsync_passes::pipeline_from_spec(&req.pipeline).map_err(|e| request_err(format!("--pipeline: {e:#}")))?;
        // Each device's graph at its own local batch: the written model's
        // batch dimension is the manifest's `local_batch`. The same file
        // loads to the same nodes, so the plan's node ids carry over.
        let local = i64::from(te.local_batch);
        let mut model = if local == batch {
            loaded.model.clone()
        } else {
            let l = crate::simulate::prepare(&req.model, local, &req.dims)?.loaded;
            if l.model.graph.node_ids() != g.node_ids() {
                bail!("{label}: the model loads to other nodes at batch {local}");
            }
            l.model
        };
        for &n in &cands {
            model.graph.node_mut(n).precision = Some(te.plan.get(n).unwrap_or(Precision::Fp32).storage_dtype());
        }
        // The precision-dependent ops (O_dep: elementwise, pooling, data
        // movement) run at their widest input's precision, as the
        // predictions above assumed; without an annotation materialize
        // would keep them FP32 and cast around every one.
        let resolved = chosen.resolved(t).context("the chosen plan has every device type")?;
        for &n in facts.order() {
            let p = resolved.compute(n);
            if p != Precision::Fp32
                && qsync_cost::is_precision_dependent(&g.node(n).op)
                && qsync_passes::precision::lowerable(g, n)
            {
                model.graph.node_mut(n).precision = Some(p.storage_dtype());
            }
        }
        // INT8 / FP8 activations are scaled by the calibrated ranges; the
        // allocator offered INT8 only where every activation has one.
        let ranges = ind.activation_ranges();
        let stats =
            qsync_passes::precision::materialize_with(&mut model, qsync_passes::precision::Mode::Training, ranges)
                .map_err(|e| anyhow::anyhow!("{label}: materializing the plan of {}: {e}", te.name))?;
        if let Some((n, v)) = &stats.first_uncalibrated {
            bail!("{label}: the plan of {} has `{n}` at INT8 but no calibrated range for `{v}`", te.name);
        }
        let mut cx = qsync_passes::PassContext {
            infer: InferOptions { batch: Some(local), dims: req.dims.iter().cloned().collect() },
            warnings: Vec::new(),
            target: Some(te.name.clone()).filter(|n| qsync_passes::precision::KNOWN_TARGETS.contains(&n.as_str())),
            inference: false,
            activation_ranges: ranges.clone(),
        };
        pm.run(&mut model, &mut cx).with_context(|| format!("{label}: pipeline on {}", te.name))?;
        let casts = model.graph.node_ids().iter().filter(|&&n| model.graph.node(n).op == qsync_ir::Op::Cast).count();
        // What the trainer must rewrite after each optimizer step (also in
        // model.onnx's metadata, `qsync.refresh:<copy>` = master).
        let copies: Vec<serde_json::Value> = model
            .graph
            .refreshed_copies()
            .map(|(c, m)| {
                let g = &model.graph;
                json!({
                    "copy": g.value_name(c),
                    "master": g.value_name(m),
                    "dtype": g.ty(c).dtype.map(|d| d.to_string()),
                })
            })
            .collect();
        // Per node, the times the chosen plan was simulated with: its op at
        // its precision, the casts that precision needs, the batch scaling.
        let costs: std::collections::HashMap<qsync_ir::NodeId, qsync_sim::OpCost> = chosen
            .program(t)
            .map(|prog| prog.ops.iter().filter_map(|op| op.node.map(|n| (n, op.cost))).collect())
            .unwrap_or_default();
        let mut nodes = Vec::new();
        for &n in facts.order() {
            let p = resolved.compute(n);
            let c = costs.get(&n);
            let cand = is_cand.contains(&n);
            nodes.push(json!({
                "name": g.node(n).name,
                "op": g.node(n).op.to_string(),
                "precision": p.to_string(),
                "planned": cand,
                "module": g.node(n).scope.as_ref().map(|s| s.module.as_str()),
                "call": g.node(n).scope.as_ref().map(|s| s.call.as_str()),
                "forward_us": c.map(|c| round(c.fwd_us)),
                "backward_us": c.map(|c| round(c.input_grad_us + c.weight_grad_us)),
                "indicator": if cand { Some(ind.omega(n, p)) } else { None },
            }));
        }
        let weight = f64::from(te.local_batch) / global_batch.max(1) as f64;
        let plan_json = json!({
            "schema": SCHEMA,
            "device": te.name,
            "role": te.role,
            "local_batch": te.local_batch,
            "gradient_weight": weight,
            "indicator_sum": te.indicator,
            "peak_memory_bytes": te.peak_memory_bytes,
            "memory_capacity_bytes": te.memory_capacity_bytes,
            "precision_histogram": te.precision_histogram,
            "refreshed_copies": copies,
            "nodes": nodes,
        });
        let mut files = serde_json::Map::new();
        files.insert("model".into(), json!(format!("{}/model.onnx", te.name)));
        files.insert("plan".into(), json!(format!("{}/plan.json", te.name)));
        for e in &emitted {
            let f = if e == "mlir" { "model.mlir" } else { "kernels.ptx" };
            files.insert(e.clone(), json!(format!("{}/{f}", te.name)));
        }
        // The exporter copies the external data the model references beside
        // its model.onnx.
        let external = external_data_copied(&model);
        if !external.is_empty() {
            files.insert(
                "external_data".into(),
                json!(external.iter().map(|f| format!("{}/{f}", te.name)).collect::<Vec<_>>()),
            );
        }
        let manifest_entry = json!({
            "role": te.role,
            "count": te.count,
            "local_batch": te.local_batch,
            "gradient_weight": weight,
            "iteration_ms": out.chosen_eval.iteration_ms,
            "compute_ms": te.compute_ms,
            "peak_memory_bytes": te.peak_memory_bytes,
            "memory_capacity_bytes": te.memory_capacity_bytes,
            "fits": te.fits,
            "indicator": te.indicator,
            "casts": casts,
            "casts_added": stats.casts,
            "refreshed_copies": copies.len(),
            "qdq_pairs": stats.qdq_pairs,
            "precision_histogram": te.precision_histogram,
            "files": files,
        });
        Ok(DevicePlan { name: te.name.clone(), model, plan_json, manifest_entry })
    };
    let (devices, timeline) = std::thread::scope(|scope| {
        // The Chrome trace is serialized beside the devices' pipelines.
        let trace = scope.spawn(|| chosen.chrome_trace_json_cached().unwrap_or_default());
        let workers: Vec<_> = out
            .chosen_eval
            .types
            .iter()
            .enumerate()
            .map(|(t, te)| {
                let per_device = &per_device;
                scope.spawn(move || per_device(t, te))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect::<Result<Vec<DevicePlan>>>()
            .map(|d| (d, trace.join().unwrap_or_else(|e| std::panic::resume_unwind(e))))
    })?;
    clock.lap("materialize and per-device pipeline");

    let method = |e: &Eval| {
        json!({
            "iteration_ms": e.iteration_ms,
            "samples_per_s": e.samples_per_s,
            "indicator_sum": e.indicator_sum,
            "local_batches": e.types.iter().map(|t| (t.name.clone(), json!(t.local_batch))).collect::<serde_json::Map<_, _>>(),
            "fits": e.types.iter().all(|t| t.fits),
        })
    };
    let methods: serde_json::Map<String, serde_json::Value> =
        out.methods().into_iter().map(|(k, e)| (k.to_string(), method(e))).collect();
    // Each device type alone, by name: its prediction, or that it does not fit.
    let alone: serde_json::Map<String, serde_json::Value> = out
        .alone
        .iter()
        .map(|(name, e)| {
            let v = e.as_ref().map_or_else(
                || json!({ "fits": false }),
                |e| {
                    let mut v = method(e);
                    v["accumulation_steps"] =
                        e.types.iter().map(|t| (t.name.clone(), json!(t.accumulation_steps))).collect();
                    v
                },
            );
            (name.clone(), v)
        })
        .collect();
    let verdict = crate::report::verdict(&out);
    let model_name = req.model.file_stem().and_then(|s| s.to_str()).unwrap_or("model").to_string();
    let dev_json: serde_json::Map<String, serde_json::Value> =
        devices.iter().map(|d| (d.name.clone(), d.manifest_entry.clone())).collect();
    let weights: serde_json::Map<String, serde_json::Value> = out
        .chosen_eval
        .types
        .iter()
        .map(|t| (t.name.clone(), json!(f64::from(t.local_batch) / global_batch.max(1) as f64)))
        .collect();
    let timings: Vec<serde_json::Value> =
        clock.phases.iter().map(|(k, v)| json!({ "phase": k, "seconds": round(*v) })).collect();
    let mut all_files: Vec<String> = vec!["manifest.json".into(), "report.md".into(), "timeline.json".into()];
    for d in &devices {
        for f in d.manifest_entry["files"].as_object().into_iter().flat_map(|m| m.values()) {
            match f {
                serde_json::Value::Array(v) => all_files.extend(v.iter().filter_map(|x| x.as_str()).map(String::from)),
                v => all_files.extend(v.as_str().map(String::from)),
            }
        }
    }
    all_files.sort();
    let manifest = json!({
        "schema": SCHEMA,
        "files": all_files,
        "model": { "name": model_name, "path": label, "sha256": sha256_hex(&bytes) },
        "targets": out.chosen_eval.types.iter().zip(&specs).map(|(te, (_, _, per_node))| json!({
            "device": te.name, "count": te.count, "per_node": per_node, "local_batch": te.local_batch,
            "gradient_weight": f64::from(te.local_batch) / global_batch.max(1) as f64,
            "memory_fraction": fractions.get(&te.name), "role": te.role,
        })).collect::<Vec<_>>(),
        "cluster": {
            "devices": specs.iter().map(|s| s.1).sum::<u32>(),
            "global_batch": global_batch,
            "train_precision": req.train_precision,
            "precisions": req.precisions.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            "groups": cluster_json["groups"].clone(),
            "fabric": cluster_json["fabric"].clone(),
        },
        "gradient_averaging": {
            "rule": "weighted by local batch: g = sum over devices of (local_batch / global_batch) * g_device",
            "weight_per_device": weights,
        },
        "pipeline": ["materialize", req.pipeline],
        "sync": sync_json,
        "indicator": { "calibrated": calibration.is_some(), "sources": ind.sources, "model_depth": ind.model_depth() },
        "method": out.method,
        "objective": out.objective,
        "chosen": out.chosen,
        "t_min_samples_per_s": out.t_min,
        "t_min_rule": out.t_min_rule,
        "indicator_bound": out.indicator_bound,
        "iteration_ms": out.chosen_eval.iteration_ms,
        "samples_per_s": out.chosen_eval.samples_per_s,
        "indicator_sum": out.chosen_eval.indicator_sum,
        "devices": dev_json,
        "methods": methods,
        "alone": alone,
        "verdict": verdict,
        "search": {
            "candidates": out.candidates, "classes": out.classes, "steps_tried": out.steps_tried,
            "steps_kept": out.steps_kept, "joint_combinations": out.joint_combinations, "joint_verified": out.joint_verified,
        },
        "optimality_gap": out.gap,
        "sharding": sharding_json(&out, &shard_allowed, req.sync_error_budget),
        "warnings": warnings,
    });
    let report = crate::report::report(&model_name, &out, &warnings);
    // `--json`: the manifest's names for the manifest's data (`model`,
    // `methods`, `devices`, …), plus what only a run has (`timings_s`).
    let summary = json!({
        "model": manifest["model"].clone(),
        "chosen": out.chosen,
        "iteration_ms": out.chosen_eval.iteration_ms,
        "samples_per_s": out.chosen_eval.samples_per_s,
        "indicator_sum": out.chosen_eval.indicator_sum,
        "t_min_samples_per_s": out.t_min,
        "sync": manifest["sync"].clone(),
        "verdict": manifest["verdict"].clone(),
        "methods": manifest["methods"].clone(),
        "alone": manifest["alone"].clone(),
        "devices": manifest["devices"].clone(),
        "files": manifest["files"].clone(),
        "timings_s": timings,
        "optimality_gap": out.gap,
        "warnings": warnings,
    });
    Ok(Planned {
        outcome: out,
        devices,
        manifest,
        summary,
        report,
        timeline,
        warnings,
        notes,
        model_path: req.model.clone(),
        emit: emitted,
    })
}

impl Planned {
    /// Write the plan directory. It is built in a temporary sibling and
    /// renamed into place when complete: an existing plan directory is
    /// replaced whole (no stale files), an existing directory that is not a
    /// plan (and not empty) is refused, and a failure leaves nothing.
    pub fn write(&self, dir: &Path) -> Result<(), PipelineError> {
        let out_err = |reason: String| PipelineError::Output { path: dir.to_path_buf(), reason };
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
        if let Err(e) = self.write_into(&tmp) {
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

    fn write_into(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // Each device's model and plan are serialized on their own thread;
        // code generation (LLVM, MLIR) stays on this one.
        let save = |d: &DevicePlan| -> Result<()> {
            let sub = dir.join(&d.name);
            std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
            load::save_model(&d.model, &sub.join("model.onnx"))?;
            write_json(&sub.join("plan.json"), &d.plan_json)
        };
        std::thread::scope(|scope| {
            let workers: Vec<_> = self.devices.iter().map(|d| scope.spawn(|| save(d))).collect();
            workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        })?;
        for d in &self.devices {
            let sub = dir.join(&d.name);
            if !self.emit.is_empty() {
                crate::codegen::run(&self.model_path, &d.model, &d.name, &self.emit.join(","), &sub, false)
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
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
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

/// The external-data files `qsync_onnx::export_file` copies beside a
/// written model: plain relative locations that exist under the model's
/// base directory.
fn external_data_copied(model: &qsync_ir::Model) -> Vec<String> {
    let Some(base) = &model.base_dir else { return Vec::new() };
    let g = &model.graph;
    let mut out = std::collections::BTreeSet::new();
    for &v in g.inits() {
        if let Some(qsync_ir::Tensor { data: qsync_ir::TensorData::External { location, .. }, .. }) = g.value(v).init()
        {
            if matches!(qsync_ir::tensor::resolve_external(Some(base), location), Ok(Some(_))) {
                out.insert(location.clone());
            }
        }
    }
    out.into_iter().collect()
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

#[derive(Parser, Debug)]
#[command(
    name = "qsyncc plan",
    about = "Plan per-device mixed precision and batch split for a hybrid cluster: qsyncc MODEL --targets v100:16,t4:16 -o plan/"
)]
pub struct PlanArgs {
    /// An ONNX model (.onnx), TorchScript archive (.pt) or text IR (.qir).
    pub model: PathBuf,
    /// Device types and counts: `v100:16,t4:16` (`t4:16/4`: 4 per node).
    /// Names are those of the device table (`crates/cost/devices`) or a
    /// short form: `a100` is taken as `a100-40gb`, `h100` as `h100-sxm`
    /// (a note on stderr says so).
    #[arg(long, default_value = "", required_unless_present = "cluster")]
    pub targets: String,
    /// The cluster as a file (TOML: node groups with their GPU, GPUs and
    /// NICs per node, NIC rate and latency, the link inside the node, and
    /// the fabric between groups; see `examples/clusters/`), instead of
    /// `--targets`.
    #[arg(long, conflicts_with = "targets")]
    pub cluster: Option<PathBuf>,
    /// Every node's NIC at this rate (`25gbit`, `800mbit`), overriding the
    /// device files and the cluster file.
    #[arg(long)]
    pub network: Option<String>,
    /// Output directory, written atomically: the plan is built in a hidden
    /// sibling and renamed into place when complete. An existing plan
    /// directory is replaced whole; any other non-empty directory is
    /// refused.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Samples per device per iteration before the split (the global batch
    /// is this times the device count, and is kept).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(i64).range(1..=crate::MAX_DIM))]
    pub batch: i64,
    /// Bind a named symbolic dimension: `--dim seq=128` (repeatable).
    #[arg(long = "dim", value_parser = crate::parse_dim_binding)]
    pub dims: Vec<(String, i64)>,
    /// Available memory of a device type: `t4=30%` (repeatable).
    #[arg(long, value_delimiter = ',')]
    pub memory: Vec<String>,
    /// Precisions inference devices may use: fp32, tf32, fp16, bf16, int8,
    /// fp8e4m3, fp8e5m2 (also spelt f32, f16, i8, f8e4m3, fp8, …).
    #[arg(long, default_value = "fp32,fp16,int8")]
    pub precisions: String,
    /// Passes run on each device's graph after materialization.
    #[arg(long, default_value = "egraph-casts")]
    pub pipeline: String,
    /// Activation and gradient statistics for the indicator (JSON, see
    /// `qsync_planner::Calibration`; `scripts/calibrate.py` writes one).
    /// Without it they are estimated from shapes.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// A timing profile (JSON, what `qsyncc profile build` writes; the
    /// format of `qsyncc simulate --profile`): measured op times replace
    /// the analytic model's on the device the profile names (repeatable,
    /// one per device type).
    #[arg(long = "profile")]
    pub profiles: Vec<PathBuf>,
    /// Replaced by `--stats` and `--profile`; kept to say so.
    #[arg(long, hide = true)]
    pub calibration: Option<PathBuf>,
    /// The throughput floor: `best` (max of UP and DBS, computed in the same
    /// run — the plan is never predicted slower than either), `fastest`
    /// (UP) or `lowest` (the paper's T_min: the lowest uniform precision
    /// that fits).
    #[arg(long = "t-min", default_value = "best", value_parser = ["best", "fastest", "lowest"])]
    pub t_min: String,
    /// `joint` (batch split and precision searched together; the best plan
    /// of every method is chosen), `qsync` (QSync's allocator at the
    /// uniform batch, as published) or `up` (QSync's UP baseline itself:
    /// every inference type at the lowest uniform precision level that fits;
    /// `methods` reports it as `up-lowest` where the fastest level, `up`, is
    /// another plan).
    #[arg(long, default_value = "joint", value_parser = ["joint", "qsync", "up"])]
    pub method: String,
    /// `indicator`: the least indicator sum at the throughput floor;
    /// `throughput`: the fastest plan whose indicator sum stays within
    /// `--indicator-bound` (default: UP's).
    #[arg(long, default_value = "indicator", value_parser = ["indicator", "throughput"])]
    pub objective: String,
    /// The largest indicator sum `--objective throughput` accepts.
    #[arg(long)]
    pub indicator_bound: Option<f64>,
    /// What the training device type computes in: `auto` (default; also
    /// `amp`): mixed precision in BF16 where the device has it, else FP16;
    /// `fp32`; `fp16`, `bf16`; `fp8` (GEMMs in FP8 E4M3, H100/L4). A single
    /// device type is always a training cluster.
    #[arg(long, default_value = "auto")]
    pub train_precision: String,
    /// Optimizer whose state is kept: sgd, momentum or adam.
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    /// Extra device description files.
    #[arg(long = "device-file")]
    pub device_files: Vec<PathBuf>,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    /// What each `<device>/` directory gets: `onnx` (always written), and
    /// `mlir` / `ptx` for the device's `model.mlir` and `kernels.ptx`.
    #[arg(long, default_value = "onnx", value_delimiter = ',')]
    pub emit: Vec<String>,
    /// Gradient synchronization the runtime runs: `fp32`, a scheme
    /// (`fp16`, `bf16`, `qgz-int8`, `qgz-int4`, `qgz-int8-hier`,
    /// `qgz-int4-hier`, `nbit-1|2|4|8`, with `-sr` / `-ef`), or `auto` (the
    /// fastest within `--sync-error-budget`; fp32 when compression does not
    /// pay). Recorded in the manifest's `sync`.
    #[arg(long, default_value = "fp32")]
    pub sync: String,
    /// Relative gradient error `--sync auto` may accept.
    #[arg(long, default_value_t = 0.01)]
    pub sync_error_budget: f64,
    /// Elements per quantization group of the quantized schemes.
    #[arg(long, default_value_t = 512)]
    pub sync_group: u32,
    /// Where compressed schemes run: `host-staged` (CUDA buckets copied to
    /// the host, host kernels — the Python hook's default), `device` (the
    /// hook's `kernels="device"`), `host` (CPU devices). Default: the
    /// cluster's own; `--sync auto` then compares every path it has.
    #[arg(long, value_parser = qsync_sim::SyncPath::parse)]
    pub sync_path: Option<qsync_sim::SyncPath>,
    /// The hosts' synchronization kernels, as `qsyncc host-kernels` measures
    /// them (default: the build machine's measurement).
    #[arg(long)]
    pub host_kernels: Option<PathBuf>,
    /// Precisions the sharded plan's collectives may use: `fp` (16-bit
    /// all-gathers at the AMP type, FP32 reduce-scatters), `auto` (also
    /// qwZ, bf16, qgz-int8, qgz-int4 within `--sync-error-budget`), or a
    /// comma list of those four. The fastest is chosen; the fp pair wins
    /// ties.
    #[arg(long, default_value = "fp")]
    pub shard_collectives: String,
}

impl PlanArgs {
    /// The library request these flags describe.
    pub fn request(&self) -> Result<PlanRequest> {
        if let Some(p) = &self.calibration {
            return Err(crate::simulate::calibration_moved(p));
        }
        let mut precisions = Vec::new();
        for s in self.precisions.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let p: Precision = s.parse().map_err(|e| anyhow::anyhow!("--precisions: {e}"))?;
            precisions.push(p);
        }
        if let Some(b) = self.indicator_bound {
            if !(b.is_finite() && b >= 0.0) {
                bail!("--indicator-bound must be a finite number ≥ 0, got {b}");
            }
        }
        Ok(PlanRequest {
            model: self.model.clone(),
            targets: self.targets.clone(),
            cluster: self.cluster.clone(),
            network: self.network.clone(),
            batch: self.batch,
            dims: self.dims.clone(),
            memory: self.memory.clone(),
            precisions,
            pipeline: self.pipeline.clone(),
            stats: self.stats.clone(),
            profiles: self.profiles.clone(),
            t_min: self.t_min.parse().map_err(|e: String| anyhow::anyhow!("--t-min: {e}"))?,
            method: self.method.parse().map_err(|e: String| anyhow::anyhow!("--method: {e}"))?,
            objective: self.objective.parse().map_err(|e: String| anyhow::anyhow!("--objective: {e}"))?,
            indicator_bound: self.indicator_bound,
            train_precision: self
                .train_precision
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--train-precision: {e}"))?,
            optimizer: self.optimizer.clone(),
            device_files: self.device_files.clone(),
            emit: self.emit.clone(),
            sync: self.sync.clone(),
            sync_error_budget: self.sync_error_budget,
            sync_path: self.sync_path,
            host_kernels: self.host_kernels.as_deref().map(crate::hostkernels::load).transpose()?,
            sync_group: self.sync_group,
            shard_collectives: self.shard_collectives.clone(),
            progress: true,
        })
    }
}

/// Run the planner from CLI flags; returns what goes to stdout.
pub fn run(a: &PlanArgs) -> Result<String> {
    let req = a.request()?;
    let start = std::time::Instant::now();
    let planned = plan(&req)?;
    for n in &planned.notes {
        eprintln!("note: {n}");
    }
    eprintln!("[{:>6.2}s] writing {}", start.elapsed().as_secs_f64(), a.output.display());
    planned.write(&a.output)?;
    eprintln!("[{:>6.2}s] done", start.elapsed().as_secs_f64());
    if a.json {
        let mut summary = planned.summary.clone();
        summary["output"] = json!(a.output.display().to_string());
        return Ok(serde_json::to_string_pretty(&summary)? + "\n");
    }
    let out = &planned.outcome;
    let mut o = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(o, "{}\n", crate::report::verdict(out));
    let _ = writeln!(o, "{}\n", crate::report::explanation(out));
    let _ = writeln!(o, "{}", crate::report::table(out));
    let _ = writeln!(o, "chosen: {} — wrote {}", out.chosen, a.output.display());
    for w in &planned.warnings {
        let _ = writeln!(o, "warning: {w}");
    }
    Ok(o)
}

/// The manifest's `sharding`: the chosen plan's stage, per device type its
/// shard fraction, what it all-gathers in which precision and whether it
/// checkpoints, the units and the collectives in the order they run. A DDP
/// plan is `replicate` with every fraction 1 and no collectives here (its
/// all-reduce is `sync`'s).
fn sharding_json(out: &qsync_planner::Outcome, allowed: &[&str], budget: f64) -> serde_json::Value {
    let s = out.sharded.as_ref();
    let chosen = s.and_then(|s| s.methods().into_iter().find(|(k, _)| *k == out.chosen).map(|(_, e)| e.result.clone()));
    let units: Vec<serde_json::Value> = s
        .map(|s| s.units.units.iter().map(|u| json!({ "name": u.name, "parameters": u.params as u64 })).collect())
        .unwrap_or_default();
    let unit_rule = s.map_or("blocks", |s| s.units.rule);
    let Some(r) = chosen else {
        let devices: serde_json::Map<String, serde_json::Value> = out
            .chosen_eval
            .types
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    json!({ "stage": "replicate", "shard_fraction": 1.0, "all_gather": null,
                            "reduce_scatter_precision": null, "checkpoint": false }),
                )
            })
            .collect();
        return json!({
            "stage": "replicate", "fsdp_strategy": "NO_SHARD", "hpz": false, "uneven_shares": false,
            "unit_rule": unit_rule, "units": units, "devices": devices, "collectives": [],
        });
    };
    let spec = &r.spec;
    let backward_scope = match spec.stage {
        qsync_sim::Stage::FullShard if spec.hpz => Some("node"),
        qsync_sim::Stage::FullShard => Some("cluster"),
        qsync_sim::Stage::HybridShard => Some("node"),
        _ => None,
    };
    let devices: serde_json::Map<String, serde_json::Value> = r
        .devices
        .iter()
        .map(|d| {
            (
                d.name.clone(),
                json!({
                    "stage": spec.stage.name(),
                    "shard_fraction": d.share,
                    "all_gather": {
                        "what": "the weights of one unit at a time, the next prefetched",
                        "precision": spec.gather.name(),
                        "forward_scope": if spec.stage == qsync_sim::Stage::HybridShard { "node" } else { "cluster" },
                        "backward_scope": backward_scope,
                    },
                    "reduce_scatter_precision": spec.reduce.name(),
                    "checkpoint": d.checkpoint,
                    "memory": d.memory,
                    "replicated_compute_ms": d.replicated_compute_us / 1e3,
                }),
            )
        })
        .collect();
    let collectives: Vec<serde_json::Value> = r
        .collectives
        .iter()
        .map(
            |c| json!({ "kind": c.kind, "phase": c.phase, "unit": c.unit, "scope": c.scope, "precision": c.precision }),
        )
        .collect();
    let p: u64 = r.devices.iter().map(|d| u64::from(d.count)).sum();
    json!({
        "stage": spec.stage.name(), "fsdp_strategy": spec.stage.fsdp_name(), "hpz": spec.hpz,
        "uneven_shares": spec.uneven,
        "collective_precisions": {
            "allowed": allowed, "error_budget": budget,
            "all_gather": { "precision": spec.gather.name(), "relative_error": spec.gather.relative_error() },
            "reduce_scatter": { "precision": spec.reduce.name(), "relative_error": spec.reduce.relative_error(p) },
        },
        "unit_rule": unit_rule, "units": units, "devices": devices,
        "collectives": collectives,
    })
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Lower-case hex SHA-256 of the model file, recorded in the manifest.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The first BatchNormalization that normalizes one value per sample and
/// channel (its input is `[N, C]` or `[N, C, 1, …]`): batch statistics of a
/// single sample do not exist and PyTorch refuses to train it, so the graph
/// needs a local batch of at least 2.
fn single_value_batchnorm(g: &qsync_ir::Graph) -> Option<String> {
    g.schedule().into_iter().map(|n| g.node(n)).filter(|node| node.op == qsync_ir::Op::BatchNormalization).find_map(
        |node| {
            let shape = g.ty(node.input(0)?).shape.as_ref()?;
            (shape.len() >= 2 && shape[2..].iter().all(|d| d.as_const() == Some(1))).then(|| node.name.clone())
        },
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_known_inputs() {
        assert_eq!(super::sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(super::sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
