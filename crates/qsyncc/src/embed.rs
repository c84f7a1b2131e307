//! What the Python package calls (`qsync.plan`, `qsync.passes.run`): the
//! CLI's own pipelines, with each failure sorted by what went wrong so
//! that Python raises a typed error. Messages are the CLI's, without its
//! `error: ` prefix.

use std::path::Path;

use clap::Parser;

use crate::opt::{OptError, OptRequest};
use crate::planner::{PipelineError, PlanArgs};

/// What a failure was about; the Python package raises one exception class
/// per kind (`qsync.OptionError`, `TargetError`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A flag or option the CLI would refuse.
    Option,
    /// The targets, cluster or memory limits name no known device or are
    /// malformed.
    Target,
    /// The model cannot be read or imported.
    Model,
    /// The model was read but could not be planned.
    Plan,
    /// A pass failed on the model.
    Pass,
    /// The output directory could not be written.
    Output,
}

impl Kind {
    /// The Python exception class's name.
    pub fn class_name(self) -> &'static str {
        match self {
            Kind::Option => "OptionError",
            Kind::Target => "TargetError",
            Kind::Model => "ModelError",
            Kind::Plan => "PlanError",
            Kind::Pass => "PassError",
            Kind::Output => "OutputError",
        }
    }
}

/// A failure: its kind and the CLI's message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: Kind,
    pub message: String,
}

fn error(kind: Kind, message: impl Into<String>) -> Error {
    Error { kind, message: message.into() }
}

/// A plan written by [`plan`].
#[derive(Debug)]
pub struct Written {
    /// What `qsyncc plan --json` prints (with `output`).
    pub summary: serde_json::Value,
    /// Which device each alias of the targets was taken as.
    pub notes: Vec<String>,
    pub warnings: Vec<String>,
}

/// `qsyncc plan FLAGS…` (`flags`: the model, `--targets …`, `-o DIR`, as on
/// the command line), without its progress lines and printing.
pub fn plan(flags: &[String]) -> Result<Written, Error> {
    let args = PlanArgs::try_parse_from(std::iter::once("qsyncc plan").chain(flags.iter().map(String::as_str)))
        .map_err(|e| error(Kind::Option, clap_message(&e)))?;
    let mut req = args.request().map_err(classify)?;
    req.progress = false;
    let planned = crate::planner::plan(&req).map_err(classify)?;
    planned.write_with(&args.output, Some(&crate::codegen::PlanCode)).map_err(classify)?;
    let mut summary = planned.summary.clone();
    summary["output"] = serde_json::json!(args.output.display().to_string());
    Ok(Written { summary, notes: planned.notes.clone(), warnings: planned.warnings.clone() })
}

/// The pipeline's error sorted by kind: a bad cluster (targets, cluster
/// file, network, memory limits) is the targets', a model that cannot be
/// read or imported the model's, any other bad flag an option.
fn classify(e: PipelineError) -> Error {
    let message = e.to_string();
    match e {
        PipelineError::Request(_) => error(Kind::Option, message),
        PipelineError::Cluster(_) => error(Kind::Target, message),
        PipelineError::Model(_) => error(Kind::Model, message),
        PipelineError::Plan(_) => error(Kind::Plan, message),
        PipelineError::Output { .. } => error(Kind::Output, message),
    }
}

/// clap's error as the CLI prints it, less the `error: ` prefix and the
/// `--help` hint.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    text.split("\n\nFor more information").next().unwrap_or(text).trim_end().to_string()
}

/// Options of [`passes`], as Python passes them.
#[derive(Clone, Debug, Default)]
pub struct PassOptions<'a> {
    /// A device of the table, by name or alias.
    pub target: Option<&'a str>,
    pub batch: Option<i64>,
    /// `("seq", 128)`.
    pub dims: Vec<(String, i64)>,
    /// `training` or `inference`.
    pub mode: &'a str,
    pub stats: Option<&'a Path>,
    pub verify: bool,
}

/// `qsyncc opt MODEL --passes PIPELINE … -o OUTPUT`: the rewritten model
/// written to `output` (`.onnx` or `.qir`); returns the pass report and the
/// warnings.
pub fn passes(
    model: &Path,
    pipeline: &str,
    o: &PassOptions<'_>,
    output: &Path,
) -> Result<(String, Vec<String>), Error> {
    let target = o.target.map(crate::devices::parse_target_flag).transpose().map_err(|e| error(Kind::Target, e))?;
    if let Some(b) = o.batch {
        if !(1..=crate::MAX_DIM).contains(&b) {
            return Err(error(Kind::Option, format!("--batch {b} is outside 1..={}", crate::MAX_DIM)));
        }
    }
    let mut dims = Vec::new();
    for (name, v) in &o.dims {
        dims.push(crate::parse_dim_binding(&format!("{name}={v}")).map_err(|e| error(Kind::Option, e))?);
    }
    let inference = match o.mode {
        "training" => false,
        "inference" => true,
        m => return Err(error(Kind::Option, format!("mode `{m}`: expected training or inference"))),
    };
    let req = OptRequest {
        passes: pipeline.to_string(),
        infer: qsync_ir::infer::InferOptions { batch: o.batch, dims: dims.into_iter().collect() },
        inputs: Vec::new(),
        verify: o.verify,
        target,
        inference,
        stats: o.stats.map(Path::to_path_buf),
    };
    let mut warnings = Vec::new();
    let done = crate::opt::optimize(model, &req, &mut |w| warnings.push(w.to_string())).map_err(|e| match e {
        OptError::Model(m) => error(Kind::Model, m),
        OptError::Request(m) => error(Kind::Option, m),
        OptError::Pass(m) => error(Kind::Pass, m),
    })?;
    crate::load::save_model(&done.model, output).map_err(|e| error(Kind::Output, format!("{e:#}")))?;
    Ok((done.report, warnings))
}
