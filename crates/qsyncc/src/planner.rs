//! `qsyncc MODEL --targets v100:16,t4:16 -o plan/`: the QSync planner.
//!
//! Loads the model, runs the allocator (`qsync-planner`) with its baselines
//! and writes the plan directory (schema `qsync-plan/1`):
//!
//! - `manifest.json` — `schema`, `model` {name, sha256}, `targets` (type,
//!   count, per node, local batch, memory fraction, role), `cluster` (devices,
//!   global batch), `pipeline` (passes run on each device's graph after the
//!   casts are materialized), `indicator` (statistics sources), `chosen`
//!   (`ours` or `greedy-fallback`), `t_min_samples_per_s` and `t_min_rule`
//!   (`fastest` or `lowest`, `--t-min`), `devices` per type
//!   {iteration_ms, peak_memory_bytes, memory_capacity_bytes, indicator,
//!   casts, precision_histogram, files}, and `methods` {qsync, up, greedy,
//!   dbs} with iteration_ms, samples_per_s and indicator_sum (DBS adds its
//!   batch split), `optimality_gap` when the graph was small enough;
//! - `<device>/model.onnx` — the planned graph with casts / QDQ materialized;
//! - `<device>/plan.json` — per node its precision, the forward / backward
//!   µs the chosen plan was simulated with (the casts its precision needs
//!   and the batch scaling included; their sum plus the optimizer step is
//!   the device's `compute_ms`), and Ω for the planned candidates;
//! - `timeline.json` — Chrome trace of the planned iteration;
//! - `report.md` — the baseline table and an SVG timeline of UP vs the plan.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;
use qsync_cost::{GraphFacts, Plan, Precision};
use qsync_ir::infer::InferOptions;
use qsync_planner::{allocate, AllocOptions, Calibration, Eval, Indicator, Outcome};
use qsync_sim::{PredictOptions, SimConfig, Target};
use serde_json::json;

use crate::load;

/// Manifest schema version.
pub const SCHEMA: &str = "qsync-plan/1";

#[derive(Parser, Debug)]
#[command(
    name = "qsyncc",
    about = "Plan per-device mixed precision for a hybrid cluster: qsyncc MODEL --targets v100:16,t4:16 -o plan/"
)]
pub struct PlanArgs {
    /// An ONNX model (.onnx), TorchScript archive (.pt) or text IR (.qir).
    pub model: PathBuf,
    /// Device types and counts: `v100:16,t4:16` (`t4:16/4`: 4 per node).
    #[arg(long)]
    pub targets: String,
    /// Output directory.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Samples per device per iteration.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(i64).range(1..=1 << 24))]
    pub batch: i64,
    /// Bind a named symbolic dimension: `--dim seq=128` (repeatable).
    #[arg(long = "dim", value_parser = crate::parse_dim_binding)]
    pub dims: Vec<(String, i64)>,
    /// Available memory of a device type: `t4=30%` (repeatable).
    #[arg(long, value_delimiter = ',')]
    pub memory: Vec<String>,
    /// Precisions inference devices may use.
    #[arg(long, default_value = "fp32,fp16,int8")]
    pub precisions: String,
    /// Passes run on each device's graph after materialization.
    #[arg(long, default_value = "egraph-casts")]
    pub pipeline: String,
    /// Activation / gradient statistics for the indicator (JSON, see
    /// `qsync_planner::Calibration`; `scripts/calibrate.py` writes one).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// The throughput floor precision recovery keeps: `fastest` (the
    /// fastest uniform level that fits, UP — never slower than the best
    /// uniform plan) or `lowest` (the paper's T_min: the lowest uniform
    /// precision that fits, e.g. INT8; recovery may then trade throughput
    /// down to it for precision).
    #[arg(long = "t-min", default_value = "fastest", value_parser = ["fastest", "lowest"])]
    pub t_min: String,
    /// Training devices: `fp32` (default) or `amp`.
    #[arg(long, default_value = "fp32", value_parser = ["fp32", "amp"])]
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
}

fn progress(quiet: bool, msg: &str, start: std::time::Instant) {
    if !quiet {
        eprintln!("[{:>6.2}s] {msg}", start.elapsed().as_secs_f64());
    }
}

/// Run the planner; returns what goes to stdout.
pub fn run(a: &PlanArgs) -> Result<String> {
    if let Some(bad) = a.emit.iter().map(|e| e.trim()).find(|e| !matches!(*e, "onnx" | "mlir" | "ptx")) {
        bail!("unknown --emit kind `{bad}` (expected onnx, mlir, ptx)");
    }
    let start = std::time::Instant::now();
    let crate::simulate::ClusterSpec { db, specs, fractions } =
        crate::simulate::parse_cluster(&a.device_files, &a.targets, &a.memory)?;
    let mut precisions = Vec::new();
    for s in a.precisions.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let p: Precision = s
            .parse()
            .map_err(|e| anyhow::anyhow!("--precisions: {e} (fp32, tf32, fp16, bf16, int8, fp8e4m3, fp8e5m2)"))?;
        if !specs.iter().any(|(n, _, _)| db.get(n).is_ok_and(|d| d.supports(p))) {
            bail!("--precisions: no target supports {p}");
        }
        precisions.push(p);
    }
    let optimizer = crate::simulate::parse_optimizer(&a.optimizer)?;
    let calibration = match &a.calibration {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
            Some(Calibration::from_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?)
        }
        None => None,
    };
    let bytes = std::fs::read(&a.model).with_context(|| format!("cannot read {}", a.model.display()))?;
    let crate::simulate::Prepared { loaded, work_scale, bindings, mut warnings } =
        crate::simulate::prepare(&a.model, a.batch, &a.dims)?;
    let quiet = false;
    progress(quiet, &format!("loaded {} ({} nodes)", a.model.display(), loaded.model.graph.node_count()), start);
    let g = &loaded.model.graph;
    let mut targets = Vec::new();
    for (name, count, per_node) in &specs {
        targets.push(Target {
            device: db.get(name)?.clone(),
            count: *count,
            per_node: *per_node,
            local_batch: a.batch as u32,
            plan: Plan::new(),
            memory_fraction: fractions.get(name).copied(),
            calibration: None,
        });
    }
    // The per-device pipeline's egraph-casts stores the FP16/BF16 GEMM
    // weights as refreshed copies (unless told not to): the predictions
    // count their rewrite in the optimizer step.
    let weight_copies = a.pipeline.contains("egraph-casts") && !a.pipeline.contains("refresh=false");
    let popts = PredictOptions {
        bindings: bindings.clone(),
        work_scale,
        optimizer,
        config: SimConfig::default(),
        weight_copies,
    };
    let label = a.model.display().to_string();
    let facts = GraphFacts::new(g, &bindings).with_context(|| label.clone())?;
    let cands = qsync_planner::candidates(g, &facts);
    let ind = Indicator::new(g, &facts, &cands, calibration.as_ref());
    if calibration.is_none() {
        warnings.push("no --calibration: activation and gradient statistics are estimated from shapes".into());
    }
    if ind.sources.weights_estimated > 0 {
        warnings.push(format!(
            "{} weights have no data in the model: their statistics are estimated",
            ind.sources.weights_estimated
        ));
    }
    let aopts = AllocOptions {
        precisions: precisions.clone(),
        train_amp: a.train_precision == "amp",
        t_min: a.t_min.parse().map_err(|e: String| anyhow::anyhow!("--t-min: {e}"))?,
        ..AllocOptions::default()
    };
    let mut prog = |m: &str| progress(quiet, m, start);
    let out =
        allocate(g, &facts, targets.clone(), popts.clone(), &ind, &aopts, &mut prog).with_context(|| label.clone())?;
    // The chosen plan, simulated once more for its per-node times.
    let chosen_targets: Vec<Target> =
        targets.iter().zip(&out.ours.types).map(|(t, te)| Target { plan: te.plan.clone(), ..t.clone() }).collect();
    let chosen = qsync_sim::Predictor::new(g, chosen_targets, popts).with_context(|| label.clone())?;
    progress(quiet, "writing the plan directory", start);

    // Per-device outputs.
    std::fs::create_dir_all(&a.output).with_context(|| format!("creating {}", a.output.display()))?;
    let pm = qsync_passes::pipeline_from_spec(&a.pipeline)?;
    let mut dev_json = serde_json::Map::new();
    for (t, te) in out.ours.types.iter().enumerate() {
        let dir = a.output.join(&te.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut model = loaded.model.clone();
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
        let stats = qsync_passes::precision::materialize(&mut model, qsync_passes::precision::Mode::Training)
            .map_err(|e| anyhow::anyhow!("{label}: materializing the plan of {}: {e}", te.name))?;
        let mut cx = qsync_passes::PassContext {
            infer: InferOptions { batch: Some(a.batch), dims: a.dims.iter().cloned().collect() },
            warnings: Vec::new(),
            target: Some(te.name.clone()).filter(|n| qsync_passes::precision::KNOWN_TARGETS.contains(&n.as_str())),
            inference: false,
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
        load::save_model(&model, &dir.join("model.onnx"))?;
        let code: Vec<&str> = a.emit.iter().map(|e| e.trim()).filter(|e| *e == "mlir" || *e == "ptx").collect();
        if !code.is_empty() {
            crate::codegen::run(&a.model, &model, &te.name, &code.join(","), &dir, false)
                .with_context(|| format!("{label}: code for {}", te.name))?;
        }
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
            let cand = cands.contains(&n);
            nodes.push(json!({
                "name": g.node(n).name,
                "op": g.node(n).op.to_string(),
                "precision": p.to_string(),
                "planned": cand,
                "forward_us": c.map(|c| round(c.fwd_us)),
                "backward_us": c.map(|c| round(c.input_grad_us + c.weight_grad_us)),
                "indicator": if cand { Some(ind.omega(n, p)) } else { None },
            }));
        }
        let plan_json = json!({
            "schema": SCHEMA,
            "device": te.name,
            "role": te.role,
            "local_batch": te.local_batch,
            "indicator_sum": te.indicator,
            "peak_memory_bytes": te.peak_memory_bytes,
            "memory_capacity_bytes": te.memory_capacity_bytes,
            "precision_histogram": te.precision_histogram,
            "refreshed_copies": copies,
            "nodes": nodes,
        });
        write_json(&dir.join("plan.json"), &plan_json)?;
        dev_json.insert(
            te.name.clone(),
            json!({
                "role": te.role,
                "count": te.count,
                "local_batch": te.local_batch,
                "iteration_ms": out.ours.iteration_ms,
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
                "files": { "model": format!("{}/model.onnx", te.name), "plan": format!("{}/plan.json", te.name) },
            }),
        );
    }
    std::fs::write(a.output.join("timeline.json"), &out.ours_trace).context("writing timeline.json")?;

    let method = |e: &Eval| json!({ "iteration_ms": e.iteration_ms, "samples_per_s": e.samples_per_s, "indicator_sum": e.indicator_sum });
    let dbs = json!({
        "iteration_ms": out.dbs.iteration_ms, "samples_per_s": out.dbs.samples_per_s, "indicator_sum": 0.0,
        "batch_split": out.dbs.batch_split, "fits": out.dbs.fits,
    });
    let model_name = a.model.file_stem().and_then(|s| s.to_str()).unwrap_or("model").to_string();
    let manifest = json!({
        "schema": SCHEMA,
        "model": { "name": model_name, "path": label, "sha256": sha256_hex(&bytes) },
        "targets": out.ours.types.iter().zip(&specs).map(|(te, (_, _, per_node))| json!({
            "device": te.name, "count": te.count, "per_node": per_node, "local_batch": te.local_batch,
            "memory_fraction": fractions.get(&te.name), "role": te.role,
        })).collect::<Vec<_>>(),
        "cluster": {
            "devices": specs.iter().map(|s| s.1).sum::<u32>(),
            "global_batch": specs.iter().map(|s| u64::from(s.1) * a.batch as u64).sum::<u64>(),
            "train_precision": a.train_precision,
            "precisions": precisions.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        },
        "pipeline": ["materialize", a.pipeline],
        "indicator": { "calibrated": calibration.is_some(), "sources": ind.sources, "model_depth": ind.model_depth() },
        "chosen": out.chosen,
        "t_min_samples_per_s": out.t_min,
        "t_min_rule": out.t_min_rule,
        "iteration_ms": out.ours.iteration_ms,
        "samples_per_s": out.ours.samples_per_s,
        "devices": dev_json,
        "methods": { "qsync": method(&out.ours), "up": method(&out.up), "greedy": method(&out.greedy), "dbs": dbs },
        "search": { "candidates": out.candidates, "classes": out.classes, "steps_tried": out.steps_tried, "steps_kept": out.steps_kept },
        "optimality_gap": out.gap,
        "warnings": warnings,
    });
    write_json(&a.output.join("manifest.json"), &manifest)?;
    std::fs::write(a.output.join("report.md"), report(&model_name, &out, &warnings)).context("writing report.md")?;
    progress(quiet, &format!("done: {}", a.output.display()), start);

    let summary = json!({
        "model": model_name,
        "output": a.output.display().to_string(),
        "iteration_ms": out.ours.iteration_ms,
        "samples_per_s": out.ours.samples_per_s,
        "indicator_sum": out.ours.indicator_sum,
        "chosen": out.chosen,
        "baselines": { "up": method(&out.up), "dbs": dbs, "greedy": method(&out.greedy) },
        "devices": manifest["devices"].clone(),
        "optimality_gap": out.gap,
        "warnings": warnings,
    });
    if a.json {
        return Ok(serde_json::to_string_pretty(&summary)? + "\n");
    }
    let mut o = String::new();
    let _ = writeln!(o, "{}", table(&out));
    let _ = writeln!(o, "wrote {}", a.output.display());
    for w in &warnings {
        let _ = writeln!(o, "warning: {w}");
    }
    Ok(o)
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n").with_context(|| format!("writing {}", path.display()))
}

/// The baseline table in Markdown.
fn table(out: &Outcome) -> String {
    let mut s =
        String::from("| method | iteration ms | samples/s | vs UP | indicator sum |\n|---|---:|---:|---:|---:|\n");
    let up = out.up.samples_per_s.max(1e-12);
    let rows = [
        ("UP", out.up.iteration_ms, out.up.samples_per_s, out.up.indicator_sum),
        ("DBS", out.dbs.iteration_ms, out.dbs.samples_per_s, 0.0),
        ("QSync greedy", out.greedy.iteration_ms, out.greedy.samples_per_s, out.greedy.indicator_sum),
        ("qsync (ours)", out.ours.iteration_ms, out.ours.samples_per_s, out.ours.indicator_sum),
    ];
    for (name, it, sps, ind) in rows {
        let _ = writeln!(s, "| {name} | {it:.2} | {sps:.1} | {:+.1}% | {ind:.4e} |", (sps / up - 1.0) * 100.0);
    }
    s
}

/// `report.md`: table, DBS split, gap, and an SVG of UP vs the plan.
fn report(model: &str, out: &Outcome, warnings: &[String]) -> String {
    let mut s = format!("# qsync plan: {model}\n\n");
    let _ = writeln!(s, "{}", table(out));
    let split: Vec<String> = out.dbs.batch_split.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(
        s,
        "DBS batch split per device: {}. T_min ({}): {:.1} samples/s. Chosen: {}.\n",
        split.join(", "),
        match out.t_min_rule {
            qsync_planner::TMin::Lowest => "lowest uniform precision that fits",
            qsync_planner::TMin::Fastest => "UP throughput",
        },
        out.t_min,
        out.chosen
    );
    if let Some(g) = &out.gap {
        let _ = writeln!(
            s,
            "Optimality gap against exhaustive search over {} class-uniform plans: {:+.2}% (optimum {:.4e}).\n",
            g.combinations,
            g.relative_gap * 100.0,
            g.optimal_indicator_sum
        );
    }
    let _ = writeln!(s, "## Timeline (UP above, qsync below; forward, backward, optimizer per device type)\n");
    s += &svg(out);
    s += "\n\n## Per device\n\n| device | role | precisions | memory GiB | capacity GiB | indicator |\n|---|---|---|---:|---:|---:|\n";
    for t in &out.ours.types {
        let h: Vec<String> = t.precision_histogram.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {:.2} | {:.4e} |",
            t.name,
            t.role,
            h.join(" "),
            gib(t.peak_memory_bytes),
            gib(t.memory_capacity_bytes),
            t.indicator
        );
    }
    if !warnings.is_empty() {
        s += "\n## Notes\n\n";
        for w in warnings {
            let _ = writeln!(s, "- {w}");
        }
    }
    s
}

fn svg(out: &Outcome) -> String {
    let span = out.up.iteration_ms.max(out.ours.iteration_ms).max(1e-9);
    let (w, row, left) = (720.0, 22.0, 140.0);
    let rows: Vec<(String, &qsync_planner::TypeEval, f64)> = out
        .up
        .types
        .iter()
        .map(|t| (format!("UP {}", t.name), t, out.up.iteration_ms))
        .chain(out.ours.types.iter().map(|t| (format!("qsync {}", t.name), t, out.ours.iteration_ms)))
        .collect();
    let h = row * rows.len() as f64 + 30.0;
    let x = |ms: f64| left + ms / span * (w - left - 10.0);
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n");
    for (i, (label, t, it)) in rows.iter().enumerate() {
        let y = 5.0 + i as f64 * row;
        let _ = writeln!(s, "<text x=\"2\" y=\"{:.1}\">{label}</text>", y + 13.0);
        for (a, b, color) in [
            (0.0, t.forward_end_ms, "#4c78a8"),
            (t.forward_end_ms, t.backward_end_ms, "#f58518"),
            (t.backward_end_ms, t.finish_ms, "#54a24b"),
            (t.finish_ms, *it, "#dddddd"),
        ] {
            if b > a {
                let _ = writeln!(
                    s,
                    "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\"/>",
                    x(a),
                    x(b) - x(a),
                    row - 4.0
                );
            }
        }
    }
    let _ = writeln!(s, "<text x=\"{left}\" y=\"{:.1}\">0 … {span:.1} ms (blue forward, orange backward, green optimizer, grey waiting)</text>", h - 6.0);
    s += "</svg>";
    s
}

/// Lower-case hex SHA-256 of the model file, recorded in the manifest.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_known_inputs() {
        assert_eq!(super::sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(super::sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
