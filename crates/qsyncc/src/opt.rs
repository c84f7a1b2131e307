//! `qsyncc opt` without its printing: load a model, run a pass pipeline
//! over it, keep the input for comparison. The CLI and the Python
//! package's `qsync.passes.run` both call [`optimize`], so a pipeline gives
//! the same graph and the same errors in either.

use std::path::{Path, PathBuf};

use qsync_ir::infer::InferOptions;
use qsync_ir::Model;

use crate::load;

/// What to run, as types (the CLI's flags parsed).
#[derive(Clone, Debug, Default)]
pub struct OptRequest {
    /// The pipeline: `infer-shapes,amp,egraph-casts` (see
    /// `qsync_passes::pipeline_from_spec`).
    pub passes: String,
    /// `--batch` / `--dim` bindings.
    pub infer: InferOptions,
    /// Input types for TorchScript archives without traced inputs.
    pub inputs: Vec<qsync_torchscript::InputSpec>,
    /// Verify the graph after every pass.
    pub verify: bool,
    /// The device precision passes plan for (a device table name).
    pub target: Option<String>,
    /// Plan inference graphs (weights stored low).
    pub inference: bool,
    /// Calibration statistics: the activations' ranges.
    pub stats: Option<PathBuf>,
}

/// Why [`optimize`] failed, by stage; every message is the one the CLI
/// prints after `error: `.
#[derive(Debug, thiserror::Error)]
pub enum OptError {
    /// The model could not be read or imported.
    #[error("{0}")]
    Model(String),
    /// The request is wrong: an unknown pass or pass option, an unreadable
    /// statistics file.
    #[error("{0}")]
    Request(String),
    /// A pass failed or left a graph the verifier refuses; the message
    /// names the model, the pass and the node.
    #[error("{0}")]
    Pass(String),
}

/// The result of [`optimize`].
#[derive(Debug)]
pub struct Optimized {
    /// The model as loaded, before any pass.
    pub input: Model,
    /// The model after the pipeline.
    pub model: Model,
    /// The pass manager's report (per pass: time, nodes before and after).
    pub report: String,
}

/// Loads `model` and runs `req.passes` over it. Warnings (the loader's,
/// then the passes') go to `warn` as they arise.
pub fn optimize(model: &Path, req: &OptRequest, warn: &mut dyn FnMut(&str)) -> Result<Optimized, OptError> {
    let chain = |e: anyhow::Error| format!("{e:#}");
    let mut loaded = load::load_model(model, &req.infer, &req.inputs).map_err(|e| OptError::Model(chain(e)))?;
    for w in &loaded.warnings {
        warn(w);
    }
    let mut pm =
        qsync_passes::pipeline_from_spec(&req.passes).map_err(|e| OptError::Request(chain(anyhow::Error::new(e))))?;
    pm.verify_each(req.verify);
    let input = loaded.model.clone();
    let activation_ranges = match &req.stats {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| OptError::Request(format!("cannot read {}: {e}", p.display())))?;
            let cal = qsync_planner::Calibration::from_json(&text)
                .map_err(|e| OptError::Request(format!("--stats {}: {e}", p.display())))?;
            let ranges = cal.activation_ranges(&loaded.model.graph);
            if ranges.is_empty() {
                warn(&format!("--stats {}: no activation of the model has a range there", p.display()));
            }
            ranges
        }
        None => Default::default(),
    };
    let mut cx = qsync_passes::PassContext {
        infer: req.infer.clone(),
        warnings: Vec::new(),
        target: req.target.clone(),
        inference: req.inference,
        activation_ranges,
    };
    let report = pm
        .run(&mut loaded.model, &mut cx)
        .map_err(|e| OptError::Pass(chain(anyhow::Error::new(e).context(format!("{}", model.display())))))?;
    for w in &cx.warnings {
        warn(w);
    }
    Ok(Optimized { input, model: loaded.model, report: report.to_string() })
}
