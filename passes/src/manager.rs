//! The [`Pass`] trait and the [`PassManager`] that runs pipelines of passes.

use std::fmt;
use std::time::{Duration, Instant};

use qsync_ir::infer::InferOptions;
use qsync_ir::verify::{verify, VerifyError};
use qsync_ir::Model;

/// What a pass reports about one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassOutcome {
    pub changed: bool,
    /// One line saying what changed, e.g. `removed 12 nodes, 3 initializers`.
    pub summary: String,
}

impl PassOutcome {
    pub fn unchanged() -> PassOutcome {
        PassOutcome { changed: false, summary: "no change".into() }
    }

    pub fn changed(summary: impl Into<String>) -> PassOutcome {
        PassOutcome { changed: true, summary: summary.into() }
    }
}

/// Shared state passes may read: dimension bindings and diagnostics sink.
#[derive(Clone, Debug, Default)]
pub struct PassContext {
    /// Bindings for symbolic dims, used whenever a pass (re-)infers shapes.
    pub infer: InferOptions,
    /// Warnings passes want the user to see, prefixed with the pass name.
    pub warnings: Vec<String>,
    /// The target device planning passes cost for (`v100`, `t4`, …);
    /// `None`: a generic device with every precision.
    pub target: Option<String>,
    /// Plan inference graphs (weights stored low) whatever a pass's own `mode`.
    pub inference: bool,
    /// Calibrated activation ranges (`--stats`): the scales of INT8 / FP8
    /// activations. A node planned INT8 reading an activation without one
    /// computes in f32 (see [`crate::precision::qscale`]).
    pub activation_ranges: crate::precision::ActivationRanges,
}

/// A graph transformation.
pub trait Pass: fmt::Debug {
    /// The name used in pipelines (`--passes a,b`).
    fn name(&self) -> &'static str;

    /// Rewrite `model` in place.
    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError>;
}

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("unknown pass `{name}` (available: {available})")]
    UnknownPass { name: String, available: String },
    #[error("pass `{pass}` failed at node {node}: {message}")]
    Failed { pass: String, node: String, message: String },
    #[error("bad arguments for `{entry}`: {message}")]
    BadArguments { entry: String, message: String },
    #[error("pass `{pass}` failed: {message}")]
    FailedGraph { pass: String, message: String },
    #[error("graph does not verify after pass `{pass}`:\n{}", list(.errors))]
    Verify { pass: String, errors: Vec<VerifyError> },
}

fn list(errors: &[VerifyError]) -> String {
    errors.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n")
}

/// One pass's line in the report.
#[derive(Clone, Debug)]
pub struct PassRun {
    pub pass: String,
    pub time: Duration,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub outcome: PassOutcome,
}

/// What a pipeline did, pass by pass.
#[derive(Clone, Debug, Default)]
pub struct PassReport {
    pub runs: Vec<PassRun>,
}

impl fmt::Display for PassReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.runs {
            writeln!(
                f,
                "{:<16} {:>9.3} ms  nodes {:>5} -> {:<5} {}",
                r.pass,
                r.time.as_secs_f64() * 1e3,
                r.nodes_before,
                r.nodes_after,
                r.outcome.summary
            )?;
        }
        Ok(())
    }
}

/// Runs passes in order.
#[derive(Debug)]
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    verify_each: bool,
}

impl Default for PassManager {
    fn default() -> Self {
        PassManager::new()
    }
}

impl PassManager {
    /// An empty pipeline; verification after each pass is on in debug builds.
    pub fn new() -> PassManager {
        PassManager { passes: Vec::new(), verify_each: cfg!(debug_assertions) }
    }

    pub fn add(&mut self, p: Box<dyn Pass>) -> &mut Self {
        self.passes.push(p);
        self
    }

    /// Turn verification after every pass on or off.
    pub fn verify_each(&mut self, on: bool) -> &mut Self {
        self.verify_each = on;
        self
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Run the pipeline. On failure, the model holds the state after the last
    /// pass that succeeded or the failing pass's partial work.
    pub fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        for p in &self.passes {
            let nodes_before = model.graph.node_count();
            let start = Instant::now();
            let outcome = p.run(model, cx)?;
            let time = start.elapsed();
            if self.verify_each {
                verify(&model.graph, model.opset())
                    .map_err(|errors| PassError::Verify { pass: p.name().into(), errors })?;
            }
            report.runs.push(PassRun {
                pass: p.name().into(),
                time,
                nodes_before,
                nodes_after: model.graph.node_count(),
                outcome,
            });
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qsync_ir::text::parse_model;

    /// A pass that leaves a use of a removed value behind.
    #[derive(Debug)]
    struct Breaker;

    impl Pass for Breaker {
        fn name(&self) -> &'static str {
            "breaker"
        }
        fn run(&self, model: &mut Model, _cx: &mut PassContext) -> Result<PassOutcome, PassError> {
            let g = &mut model.graph;
            let first = g.schedule()[0];
            g.remove_node(first);
            Ok(PassOutcome::changed("removed a live node"))
        }
    }

    fn model() -> Model {
        parse_model(
            "opset \"\" 17\ngraph \"g\" {\n  input %x: f32[2]\n  %y: f32[2] = Relu \"r\"(%x)\n  %z: f32[2] = Neg \"n\"(%y)\n  output %z\n}\n",
        )
        .expect("parse")
    }

    #[test]
    fn verification_after_each_pass_names_the_pass() {
        let mut pm = PassManager::new();
        pm.add(Box::new(Breaker)).verify_each(true);
        let err = pm.run(&mut model(), &mut PassContext::default()).expect_err("must fail");
        let text = err.to_string();
        assert!(text.contains("after pass `breaker`"), "{text}");
        assert!(text.contains("\"n\" (Neg)") && text.contains("removed"), "{text}");
    }

    #[test]
    fn verification_can_be_turned_off() {
        let mut pm = PassManager::new();
        pm.add(Box::new(Breaker)).verify_each(false);
        let report = pm.run(&mut model(), &mut PassContext::default()).expect("runs");
        assert_eq!(report.runs.len(), 1);
        assert_eq!((report.runs[0].nodes_before, report.runs[0].nodes_after), (2, 1));
        assert!(report.to_string().contains("breaker"));
    }
}
