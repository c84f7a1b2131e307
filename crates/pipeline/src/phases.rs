//! The plan pipeline's phases, in the order [`crate::plan`] runs them:
//! [`load`] (request checks, the cluster, the model loaded and rebatched),
//! [`baselines`] (what every method is priced with: the synchronization,
//! the graph's facts, the candidates and their indicator), [`search`]
//! (every method of `qsync-planner`, the chosen plan simulated once more),
//! then per device type [`materialize`] and [`device_pipeline`], and
//! [`assemble`] (manifest, report, summary). Writing is
//! [`Planned::write`](crate::Planned::write).

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Context;
use qsync_cost::{Bindings, GraphFacts, Plan, Precision, Profile};
use qsync_ir::infer::InferOptions;
use qsync_ir::NodeId;
use qsync_planner::{allocate, AllocOptions, Calibration, Eval, Indicator, Outcome};
use qsync_sim::{PredictOptions, Predictor, SimConfig, Target};
use serde_json::json;

use crate::error::{Error, Result};
use crate::input::{PlanRequest, SyncChoice, MAX_DIM};
use crate::manifest::{external_data_copied, round, sha256_hex, sharding_json, single_value_batchnorm};
use crate::{DevicePlan, Planned, SCHEMA};

/// Progress lines on stderr and the per-phase timings of `--json`.
pub(crate) struct Clock {
    start: std::time::Instant,
    last: std::time::Instant,
    on: bool,
    phases: Vec<(String, f64)>,
}

impl Clock {
    pub(crate) fn new(on: bool) -> Clock {
        let now = std::time::Instant::now();
        Clock { start: now, last: now, on, phases: Vec::new() }
    }
    pub(crate) fn say(&self, msg: &str) {
        if self.on {
            eprintln!("[{:>6.2}s] {msg}", self.start.elapsed().as_secs_f64());
        }
    }
    pub(crate) fn lap(&mut self, phase: &str) {
        let now = std::time::Instant::now();
        self.phases.push((phase.to_string(), (now - self.last).as_secs_f64()));
        self.last = now;
    }
}

/// The request checked, the cluster resolved and the model loaded at the
/// requested batch (or the batch it fixes).
pub(crate) struct Workload {
    /// `(device, count, per node)`, in the cluster's order.
    pub specs: Vec<(String, u32, u32)>,
    pub fractions: BTreeMap<String, f64>,
    pub notes: Vec<String>,
    pub cluster_json: serde_json::Value,
    pub fabric: Option<qsync_sim::Fabric>,
    pub calibration: Option<Calibration>,
    /// The model file's bytes, for the manifest's hash.
    pub bytes: Vec<u8>,
    pub loaded: crate::load::Loaded,
    pub batch: i64,
    pub bindings: Bindings,
    pub warnings: Vec<String>,
    /// The batch every device is planned at when the graph cannot be rebatched.
    pub fixed_batch: Option<u32>,
    /// A BatchNormalization that needs a local batch of 2.
    pub single_value_bn: Option<String>,
    /// Every device type at the uniform batch, no plan yet.
    pub targets: Vec<Target>,
    pub label: String,
}

/// Load and rebatch: check the request, resolve the cluster and its
/// profiles, read the statistics and load the model.
pub(crate) fn load(req: &PlanRequest, clock: &mut Clock) -> Result<Workload> {
    if !(1..=MAX_DIM).contains(&req.batch) {
        return Err(Error::Request(format!("--batch {} is outside 1..={}", req.batch, MAX_DIM)));
    }
    let cluster = crate::cluster::resolve(&req.device_files, &req.cluster, req.network, &req.memory)?;
    let cluster_json = cluster.describe();
    let networks = cluster.networks.clone();
    let fabric = cluster.fabric;
    let profiles: BTreeMap<String, Profile> = crate::cluster::load_profiles(&req.profiles, &cluster)?;
    let crate::cluster::ClusterSpec { db, specs, fractions, notes, .. } = cluster;
    for &p in &req.precisions {
        if !specs.iter().any(|(n, _, _)| db.get(n).is_ok_and(|d| d.supports(p))) {
            return Err(Error::Request(format!("--precisions: no target supports {p}")));
        }
    }
    let calibration = match &req.stats {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).map_err(|e| Error::Plan(format!("cannot read {}: {e}", p.display())))?;
            Some(Calibration::from_json(&text).map_err(|e| {
                Error::Request(format!(
                    "--stats {}: {e} (activation and gradient statistics, as `scripts/calibrate.py` writes; a \
                     timing profile goes to --profile)",
                    p.display()
                ))
            })?)
        }
        None => None,
    };
    let bytes =
        std::fs::read(&req.model).map_err(|e| Error::Model(format!("cannot read {}: {e}", req.model.display())))?;
    let crate::load::Prepared { loaded, batch, bindings, mut warnings } =
        crate::load::prepare(&req.model, req.batch, &req.dims).map_err(Error::model)?;
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
    let mut targets = Vec::new();
    for (name, count, per_node) in &specs {
        targets.push(Target {
            device: db.get(name).map_err(|e| Error::Cluster(e.to_string()))?.clone(),
            count: *count,
            per_node: *per_node,
            local_batch: batch as u32,
            plan: Plan::new(),
            memory_fraction: fractions.get(name).copied(),
            calibration: profiles.get(name).cloned(),
            network: networks.get(name).cloned(),
        });
    }
    Ok(Workload {
        specs,
        fractions,
        notes,
        cluster_json,
        fabric,
        calibration,
        bytes,
        loaded,
        batch,
        bindings,
        warnings,
        fixed_batch,
        single_value_bn,
        targets,
        label: req.model.display().to_string(),
    })
}

/// What every method is priced with.
pub(crate) struct Baselines {
    pub popts: PredictOptions,
    pub sync_json: serde_json::Value,
    pub facts: GraphFacts,
    pub cands: Vec<NodeId>,
    pub is_cand: HashSet<NodeId>,
    pub ind: Indicator,
    pub shard_allowed: Vec<&'static str>,
    pub aopts: AllocOptions,
}

/// Baselines: the prediction options, the gradient synchronization every
/// method is predicted with (for `auto`, every scheme priced against
/// FP32's iteration), the graph's facts, the candidates and their
/// indicator, and the allocator's options.
pub(crate) fn baselines(req: &PlanRequest, w: &mut Workload, clock: &mut Clock) -> Result<Baselines> {
    let g = &w.loaded.model.graph;
    // The per-device pipeline's egraph-casts stores the FP16/BF16 GEMM
    // weights as refreshed copies (unless told not to): the predictions
    // count their rewrite in the optimizer step.
    let mut popts = PredictOptions {
        bindings: w.bindings.clone(),
        work_scale: 1.0,
        optimizer: req.optimizer,
        config: SimConfig::default(),
        weight_copies: req.pipeline.weight_copies(),
        reference_batch: Some(w.batch as u32),
        fabric: w.fabric,
        host_kernels: req.host_kernels.unwrap_or_else(qsync_sim::SyncKernels::host),
        ..PredictOptions::default()
    };
    // Every method is predicted with the synchronization the plan will run.
    let (sync_spec, sync_json) = resolve_sync(req, g, &w.targets, &popts)?;
    popts.config.sync = sync_spec;
    clock.say(&format!("gradient synchronization: {}", sync_spec.scheme.name()));
    let label = &w.label;
    let facts = GraphFacts::new(g, &w.bindings).with_context(|| label.clone()).map_err(Error::plan)?;
    let cands = qsync_planner::candidates(g, &facts);
    let is_cand: HashSet<NodeId> = cands.iter().copied().collect();
    // Weight statistics come from the values: external data found next to
    // the model is read for them. Initializers without data are counted
    // (and warned about) once, by the loader, the same in every command.
    let inlined = crate::load::with_external_data_inline(&w.loaded.model).map_err(Error::plan)?;
    let ind = Indicator::new(inlined.as_ref().unwrap_or(g), &facts, &cands, w.calibration.as_ref());
    drop(inlined);
    if w.calibration.is_none() {
        w.warnings.push("no --stats: activation and gradient statistics are estimated from shapes".into());
    }
    // INT8 needs a calibrated scale for every activation it reads.
    if let Some(warning) = ind.int8_warning(g).filter(|_| req.precisions.contains(&Precision::Int8)) {
        w.warnings.push(warning);
    }
    let (shard_collectives, shard_allowed) = resolve_shard_collectives(req, &w.targets)?;
    let aopts = AllocOptions {
        precisions: req.precisions.clone(),
        train_precision: req.train_precision,
        t_min: req.t_min,
        method: req.method,
        objective: req.objective,
        indicator_bound: req.indicator_bound,
        opset: Some(w.loaded.model.opset()),
        fixed_local_batch: w.fixed_batch,
        min_local_batch: if w.single_value_bn.is_some() { 2 } else { 1 },
        shard_collectives,
        shard_error_budget: req.sync_error_budget,
        ..AllocOptions::default()
    };
    Ok(Baselines { popts, sync_json, facts, cands, is_cand, ind, shard_allowed, aopts })
}

/// The search's result: every method's outcome and the chosen plan,
/// simulated once more for its per-node times.
pub(crate) struct Search<'g> {
    pub out: Outcome,
    pub chosen: Predictor<'g>,
}

/// Search: UP, DBS, QSync's greedy and allocator, the joint batch and
/// precision search (`qsync_planner::allocate`), and the chosen plan
/// simulated once more.
pub(crate) fn search<'g>(w: &'g Workload, b: &Baselines, clock: &mut Clock) -> Result<Search<'g>> {
    let g = &w.loaded.model.graph;
    let label = &w.label;
    let mut prog = |m: &str| clock.say(m);
    let out = allocate(g, &b.facts, w.targets.clone(), b.popts.clone(), &b.ind, &b.aopts, &mut prog)
        .with_context(|| label.clone())
        .map_err(Error::plan)?;
    clock.phases.extend(out.phases.iter().cloned());
    clock.last = std::time::Instant::now();
    let chosen_targets: Vec<Target> = w
        .targets
        .iter()
        .zip(&out.chosen_eval.types)
        .map(|(t, te)| Target { plan: te.plan.clone(), local_batch: te.local_batch, ..t.clone() })
        .collect();
    let mut chosen =
        Predictor::new(g, chosen_targets, b.popts.clone()).with_context(|| label.clone()).map_err(Error::plan)?;
    chosen.result();
    Ok(Search { out, chosen })
}

/// Materialize: device type `t`'s graph at its own local batch with the
/// chosen plan's precisions, casts and QDQ written in.
pub(crate) fn materialize(
    req: &PlanRequest,
    w: &Workload,
    b: &Baselines,
    s: &Search<'_>,
    t: usize,
    te: &qsync_planner::TypeEval,
) -> Result<(qsync_ir::Model, qsync_passes::precision::MaterializeStats)> {
    let g = &w.loaded.model.graph;
    let label = &w.label;
    // Each device's graph at its own local batch: the written model's
    // batch dimension is the manifest's `local_batch`. The same file
    // loads to the same nodes, so the plan's node ids carry over.
    let local = i64::from(te.local_batch);
    let mut model = if local == w.batch {
        w.loaded.model.clone()
    } else {
        let l = crate::load::prepare(&req.model, local, &req.dims).map_err(Error::plan)?.loaded;
        if l.model.graph.node_ids() != g.node_ids() {
            return Err(Error::Plan(format!("{label}: the model loads to other nodes at batch {local}")));
        }
        l.model
    };
    for &n in &b.cands {
        model.graph.node_mut(n).precision = Some(te.plan.get(n).unwrap_or(Precision::Fp32).storage_dtype());
    }
    // The precision-dependent ops (O_dep: elementwise, pooling, data
    // movement) run at their widest input's precision, as the
    // predictions assumed; without an annotation materialize would keep
    // them FP32 and cast around every one.
    let resolved = s.chosen.resolved(t).ok_or_else(|| Error::Plan("the chosen plan has every device type".into()))?;
    for &n in b.facts.order() {
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
    let ranges = b.ind.activation_ranges();
    let stats = qsync_passes::precision::materialize_with(&mut model, qsync_passes::precision::Mode::Training, ranges)
        .map_err(|e| Error::Plan(format!("{label}: materializing the plan of {}: {e}", te.name)))?;
    if let Some((n, v)) = &stats.first_uncalibrated {
        return Err(Error::Plan(format!(
            "{label}: the plan of {} has `{n}` at INT8 but no calibrated range for `{v}`",
            te.name
        )));
    }
    Ok((model, stats))
}

/// The per-device pipeline: the request's passes on device type `t`'s
/// materialized graph, then its `plan.json` and manifest entry.
#[allow(clippy::too_many_arguments)]
pub(crate) fn device_pipeline(
    req: &PlanRequest,
    w: &Workload,
    b: &Baselines,
    s: &Search<'_>,
    t: usize,
    te: &qsync_planner::TypeEval,
    (mut model, stats): (qsync_ir::Model, qsync_passes::precision::MaterializeStats),
    global_batch: u64,
) -> Result<DevicePlan> {
    let g = &w.loaded.model.graph;
    let label = &w.label;
    let pm = req.pipeline.manager()?;
    let mut cx = qsync_passes::PassContext {
        infer: InferOptions { batch: Some(i64::from(te.local_batch)), dims: req.dims.iter().cloned().collect() },
        warnings: Vec::new(),
        target: Some(te.name.clone()).filter(|n| qsync_passes::precision::KNOWN_TARGETS.contains(&n.as_str())),
        inference: false,
        activation_ranges: b.ind.activation_ranges().clone(),
    };
    pm.run(&mut model, &mut cx).with_context(|| format!("{label}: pipeline on {}", te.name)).map_err(Error::plan)?;
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
    let resolved = s.chosen.resolved(t).ok_or_else(|| Error::Plan("the chosen plan has every device type".into()))?;
    let costs: HashMap<NodeId, qsync_sim::OpCost> = s
        .chosen
        .program(t)
        .map(|prog| prog.ops.iter().filter_map(|op| op.node.map(|n| (n, op.cost))).collect())
        .unwrap_or_default();
    let mut nodes = Vec::new();
    for &n in b.facts.order() {
        let p = resolved.compute(n);
        let c = costs.get(&n);
        let cand = b.is_cand.contains(&n);
        nodes.push(json!({
            "name": g.node(n).name,
            "op": g.node(n).op.to_string(),
            "precision": p.to_string(),
            "planned": cand,
            "module": g.node(n).scope.as_ref().map(|s| s.module.as_str()),
            "call": g.node(n).scope.as_ref().map(|s| s.call.as_str()),
            "forward_us": c.map(|c| round(c.fwd_us)),
            "backward_us": c.map(|c| round(c.input_grad_us + c.weight_grad_us)),
            "indicator": if cand { Some(b.ind.omega(n, p)) } else { None },
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
    for e in &req.emit {
        files.insert(e.name().to_string(), json!(format!("{}/{}", te.name, e.file())));
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
        "iteration_ms": s.out.chosen_eval.iteration_ms,
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
}

/// Every device type through [`materialize`] and [`device_pipeline`], each
/// on its own thread (the results keep the types' order), and the chosen
/// plan's Chrome trace beside them.
pub(crate) fn per_device(
    req: &PlanRequest,
    w: &Workload,
    b: &Baselines,
    s: &Search<'_>,
    global_batch: u64,
) -> Result<(Vec<DevicePlan>, String)> {
    let one = |t: usize, te: &qsync_planner::TypeEval| -> Result<DevicePlan> {
        let materialized = materialize(req, w, b, s, t, te)?;
        device_pipeline(req, w, b, s, t, te, materialized, global_batch)
    };
    std::thread::scope(|scope| {
        let trace = scope.spawn(|| s.chosen.chrome_trace_json_cached().unwrap_or_default());
        let workers: Vec<_> = s
            .out
            .chosen_eval
            .types
            .iter()
            .enumerate()
            .map(|(t, te)| {
                let one = &one;
                scope.spawn(move || one(t, te))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect::<Result<Vec<DevicePlan>>>()
            .map(|d| (d, trace.join().unwrap_or_else(|e| std::panic::resume_unwind(e))))
    })
}

/// The manifest, the report and the `--json` summary of a finished plan.
pub(crate) fn assemble(
    req: &PlanRequest,
    w: Workload,
    b: Baselines,
    out: Outcome,
    (devices, timeline): (Vec<DevicePlan>, String),
    global_batch: u64,
    clock: &Clock,
) -> Planned {
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
    let Workload { specs, fractions, cluster_json, calibration, bytes, warnings, notes, label, .. } = w;
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
        "pipeline": ["materialize", req.pipeline.spec()],
        "sync": b.sync_json,
        "indicator": { "calibrated": calibration.is_some(), "sources": b.ind.sources, "model_depth": b.ind.model_depth() },
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
        "sharding": sharding_json(&out, &b.shard_allowed, req.sync_error_budget),
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
    Planned {
        outcome: out,
        devices,
        manifest,
        summary,
        report,
        timeline,
        warnings,
        notes,
        model_path: req.model.clone(),
        emit: req.emit.clone(),
    }
}

/// The synchronization the plan assumes: the scheme, the path it runs on,
/// and, for `auto`, what was compared — every scheme within the error
/// budget on every path that exists for the cluster's devices
/// (`qsync_sim::sync_paths`), each priced by its whole predicted iteration
/// (a path that does not overlap the backward pass pays its full time).
/// fp32 wins ties.
fn resolve_sync(
    req: &PlanRequest,
    g: &qsync_ir::Graph,
    targets: &[Target],
    popts: &PredictOptions,
) -> Result<(qsync_sim::SyncSpec, serde_json::Value)> {
    use qsync_sim::{SyncScheme, SyncSpec};
    let group = req.sync_group;
    if !(2..=1 << 20).contains(&group) {
        return Err(Error::Request(format!("--sync-group {group} is outside 2..=1048576")));
    }
    let exist = qsync_sim::sync_paths(targets);
    let paths = match req.sync_path {
        Some(p) if !qsync_sim::path_exists(targets, p) => {
            return Err(Error::Request(format!(
                "--sync-path {}: not a path these devices synchronize on (they have: {})",
                p.name(),
                exist.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
            )))
        }
        Some(p) => vec![p],
        None => exist.clone(),
    };
    // Where the host kernels' rates come from: the caller's measurement
    // (`--host-kernels`), or the built-in one.
    let host_rates =
        if req.host_kernels.is_some() { "given (--host-kernels)" } else { qsync_sim::SyncKernels::host_source() };
    let describe = |spec: &SyncSpec| {
        let (kernels, rates) = match (spec.scheme, spec.path) {
            (SyncScheme::Fp32, _) => ("none (the engine's own all-reduce)", None),
            (_, qsync_sim::SyncPath::Device) => ("device (qsync's PTX kernels)", None),
            _ => ("host", Some(host_rates)),
        };
        let mut path = json!({
            "name": spec.path.name(),
            "overlaps_backward": spec.path.overlaps(spec.scheme),
            "kernels": kernels,
        });
        if let Some(rates) = rates {
            path["host_kernels"] = json!(rates);
        }
        path
    };
    let SyncChoice::Given(scheme) = req.sync else {
        return resolve_auto_sync(req, g, targets, popts, &exist, &paths, &describe);
    };
    let spec = SyncSpec::new(scheme, group).with_path(paths[0]);
    Ok((
        spec,
        json!({ "mode": "given", "scheme": scheme.name(), "group": group, "relative_error": scheme.relative_error(),
                "path": describe(&spec) }),
    ))
}

/// `--sync auto`: every scheme within the budget on every path, priced.
fn resolve_auto_sync(
    req: &PlanRequest,
    g: &qsync_ir::Graph,
    targets: &[Target],
    popts: &PredictOptions,
    exist: &[qsync_sim::SyncPath],
    paths: &[qsync_sim::SyncPath],
    describe: &dyn Fn(&qsync_sim::SyncSpec) -> serde_json::Value,
) -> Result<(qsync_sim::SyncSpec, serde_json::Value)> {
    use qsync_sim::{SyncScheme, SyncSpec};
    let group = req.sync_group;
    let budget = req.sync_error_budget;
    if !(budget.is_finite() && budget >= 0.0) {
        return Err(Error::Request(format!("--sync-error-budget must be a finite number ≥ 0, got {budget}")));
    }
    let analysis = std::sync::Arc::new(qsync_sim::GraphAnalysis::new(g, popts).map_err(|e| Error::plan(e.into()))?);
    let iteration_us = |spec: SyncSpec| -> Result<f64> {
        let mut o = popts.clone();
        o.config.sync = spec;
        let mut pred = qsync_sim::Predictor::with_analysis(g, analysis.clone(), targets.to_vec(), o)
            .map_err(|e| Error::plan(e.into()))?;
        Ok(pred.result().iteration_us)
    };
    let fp32 = SyncSpec::new(SyncScheme::Fp32, group).with_path(paths[0]);
    let fp32_us = iteration_us(fp32)?;
    let mut considered = vec![(fp32, fp32_us)];
    for &path in paths {
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
    let choices = req.shard_collectives.choices.clone();
    let budget = req.sync_error_budget;
    if choices != CollectiveChoices::default() && !(budget.is_finite() && budget >= 0.0) {
        return Err(Error::Request(format!("--sync-error-budget must be a finite number ≥ 0, got {budget}")));
    }
    let p: u64 = targets.iter().map(|t| u64::from(t.count)).sum();
    let mut named: Vec<(&'static str, f64)> = Vec::new();
    if choices.qwz {
        named.push(("qwz", GatherPrecision::QwzInt8.relative_error()));
    }
    for r in &choices.reduce {
        named.push((r.name(), r.relative_error(p)));
    }
    if !req.shard_collectives.auto {
        if let Some((name, err)) = named.iter().find(|(_, e)| *e > budget) {
            return Err(Error::Request(format!(
                "--shard-collectives {name}: its relative error {err:.4} on {p} devices exceeds --sync-error-budget \
                 {budget} (raise the budget or leave it out)"
            )));
        }
    }
    Ok((choices, named.into_iter().filter(|(_, e)| *e <= budget).map(|(n, _)| n).collect()))
}
