//! `qsyncc profile`: the CPU ends of GPU calibration (`qsync_cost::calibrate`).
//!
//! `worklist` writes the distinct operators of models at a batch for a
//! measuring script (`scripts/gpu/profile.py`); `build` turns that script's
//! measurements into a calibration profile for one device, optionally
//! leaving out model families (leave-one-out: the profile that predicts a
//! model must not have measured it). Thin: the logic is in `qsync-cost`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use qsync_cost::calibrate::{build_profile_with, fit_host_overhead, Measurements, TrainingRuns, Worklist};

use crate::simulate::{parse_cluster, prepare};

/// Arguments of `qsyncc profile`.
#[derive(clap::Subcommand, Debug)]
pub enum ProfileCmd {
    /// Write the distinct operators (op, input shapes) of models, for a GPU to measure.
    Worklist {
        /// Models, each `PATH` or `PATH=FAMILY` (the family defaults to the file stem;
        /// models of one architecture share a family, e.g. `resnet50.onnx=resnet50`).
        #[arg(required = true)]
        models: Vec<String>,
        /// The batch every model is measured at (graphs must not fix another).
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(i64).range(1..=crate::MAX_DIM))]
        batch: i64,
        /// Bind a named symbolic dimension: `--dim seq=128` (repeatable).
        #[arg(long = "dim", value_parser = crate::parse_dim_binding)]
        dims: Vec<(String, i64)>,
        /// Further batches every op is also measured at (its batch curve):
        /// `--batch-points 1,2,32`. The models' batch symbol must be `batch`.
        #[arg(long = "batch-points", value_delimiter = ',',
              value_parser = clap::value_parser!(i64).range(1..=crate::MAX_DIM))]
        batch_points: Vec<i64>,
        /// Output file (JSON).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Build a calibration profile from a measurement file (`scripts/gpu/profile.py`).
    Build {
        /// The measurements (schema `qsync-ops/1`).
        measurements: PathBuf,
        /// The device the profile is for (its datasheet figures are the fit's start).
        #[arg(long)]
        device: String,
        /// Leave out every model of this family (repeatable).
        #[arg(long = "exclude")]
        exclude: Vec<String>,
        /// Extra device description files.
        #[arg(long = "device-file")]
        device_files: Vec<PathBuf>,
        /// Output profile (JSON, the `--calibration` format).
        #[arg(short, long)]
        output: PathBuf,
        /// Print the fit report as JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Price the host too (measurements that timed it), fitted to
        /// training runs measured on the same machine (`scripts/gpu/train.py`,
        /// schema `qsync-iterations/1`): their host-bound phases give how much
        /// more a training step issues than the isolated ops (the profile's
        /// `host.overhead_*`; runs of an `--exclude`d family are left out).
        #[arg(long)]
        iterations: Option<PathBuf>,
    },
}

/// A worklist entry's input shapes at its main batch.
fn first_shapes(e: &qsync_cost::calibrate::WorkItem) -> Vec<Option<Vec<i64>>> {
    e.inputs.iter().map(|i| i.as_ref().map(|i| i.shape.clone())).collect()
}

fn split_model(s: &str) -> (PathBuf, Option<String>) {
    match s.rsplit_once('=') {
        Some((p, f)) if !f.is_empty() && !f.contains('/') => (PathBuf::from(p), Some(f.to_string())),
        _ => (PathBuf::from(s), None),
    }
}

fn stem(p: &Path) -> String {
    p.file_stem().map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into_owned())
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

pub fn run(cmd: &ProfileCmd) -> Result<String> {
    match cmd {
        ProfileCmd::Worklist { models, batch, dims, batch_points, output } => {
            let mut list =
                Worklist::new(*batch, dims.iter().cloned().collect::<BTreeMap<_, _>>()).with_batch_points(batch_points);
            let mut out = String::new();
            for m in models {
                let (path, family) = split_model(m);
                let prepared = prepare(&path, *batch, dims)?;
                if prepared.batch != *batch {
                    bail!(
                        "{}: the graph fixes its batch at {}, not {batch}: measured shapes would not be the \
                         ones predicted (give it a symbolic batch, e.g. scripts/gpu/rebatch.py)",
                        path.display(),
                        prepared.loaded.fixed_batch.unwrap_or(0)
                    );
                }
                if let Some(w) = prepared.warnings.iter().find(|w| w.contains("is not bound")) {
                    bail!("{}: {w}", path.display());
                }
                let name = stem(&path);
                let family = family.unwrap_or_else(|| name.clone());
                let before = list.entries.len();
                // The loader binds the batch into the graph: load it again at
                // every batch point.
                let mut at = Vec::with_capacity(list.batch_points.len());
                for &b in &list.batch_points {
                    let p = prepare(&path, b, dims)?;
                    if p.batch != b {
                        bail!("{}: the graph fixes its batch: it cannot be measured at batch {b}", path.display());
                    }
                    at.push(p);
                }
                let at_graphs: Vec<_> = at.iter().map(|p| (&p.loaded.model.graph, &p.bindings)).collect();
                list.add_graph_at(&name, &family, &prepared.loaded.model.graph, &prepared.bindings, &at_graphs)
                    .with_context(|| path.display().to_string())?;
                let added = &list.entries[before..];
                if !list.batch_points.is_empty()
                    && !added.is_empty()
                    && added.iter().all(|e| e.at_batches.iter().all(|a| a.inputs == first_shapes(e)))
                {
                    bail!("{}: no shape changes with `batch`: its batch symbol has another name", path.display());
                }
                let nodes = list.models.last().map_or(0, |m| m.nodes);
                let _ = writeln!(
                    out,
                    "{name} ({family}): {nodes} kernel nodes, {} new distinct ops",
                    list.entries.len() - before
                );
            }
            write_json(output, &list)?;
            let _ = writeln!(out, "{} distinct ops -> {}", list.entries.len(), output.display());
            Ok(out)
        }
        ProfileCmd::Build { measurements, device, exclude, device_files, output, json, iterations } => {
            let src = crate::simulate::ClusterSource { targets: device, ..Default::default() };
            let cluster = parse_cluster(device_files, src, &[])?;
            let dev = cluster.db.get(device)?.clone();
            let text = std::fs::read_to_string(measurements)
                .with_context(|| format!("cannot read {}", measurements.display()))?;
            let m = Measurements::from_json(&text, &measurements.display().to_string())?;
            let (mut profile, report) = build_profile_with(&m, &dev, exclude, iterations.is_some())
                .with_context(|| measurements.display().to_string())?;
            let host_note = match iterations {
                Some(path) => {
                    let text =
                        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
                    let runs = TrainingRuns::from_json(&text, &path.display().to_string())?;
                    Some(
                        fit_host_overhead(&mut profile, &m, &runs, exclude)
                            .with_context(|| format!("{} with {}", measurements.display(), path.display()))?,
                    )
                }
                None => None,
            };
            write_json(output, &profile)?;
            if *json {
                return Ok(serde_json::to_string_pretty(&report)? + "\n");
            }
            let mut o = String::new();
            if let Some(note) = host_note {
                let _ = writeln!(o, "  {note}");
            }
            let _ = writeln!(
                o,
                "profile for {} from {} ({} op entries, {} cast pairs) -> {}",
                dev.name,
                profile.meta.get("profiled_models").map_or("", String::as_str),
                profile.ops.len(),
                profile.casts.len(),
                output.display()
            );
            for c in &report.classes {
                let _ = writeln!(
                    o,
                    "  {:<22} {:>6.3} -> {:>6.3}  ({} phases, {:.0} us)",
                    c.class, c.before, c.after, c.phases, c.measured_us
                );
            }
            let _ = writeln!(
                o,
                "  {} phases: predicted/measured {:.3} -> {:.3}, median |error| {:.1}% -> {:.1}%",
                report.phases,
                report.total_ratio_before,
                report.total_ratio_after,
                100.0 * report.median_rel_err_before,
                100.0 * report.median_rel_err_after
            );
            Ok(o)
        }
    }
}
