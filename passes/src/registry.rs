//! Passes by name, and pipelines from a comma-separated spec.

use qsync_ir::infer::infer_shapes;
use qsync_ir::verify::verify;
use qsync_ir::Model;

use crate::dce::Dce;
use crate::fold::FoldConstants;
use crate::manager::{Pass, PassContext, PassError, PassManager, PassOutcome};

/// `infer-shapes`: (re-)infer every value's dtype and shape, applying the
/// context's dim bindings. Fails on inconsistent shapes.
#[derive(Debug, Default)]
pub struct InferShapes;

impl Pass for InferShapes {
    fn name(&self) -> &'static str {
        "infer-shapes"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let before: Vec<_> = model.graph.all_values().map(|v| model.graph.ty(v).clone()).collect();
        let opset = model.opset();
        let report = infer_shapes(&mut model.graph, opset, &cx.infer);
        if let Some(e) = report.errors.first() {
            return Err(PassError::Failed {
                pass: self.name().into(),
                node: format!("{:?} ({})", e.node, e.op),
                message: e.message.clone(),
            });
        }
        for w in &report.warnings {
            cx.warnings.push(format!("infer-shapes: node {:?} ({}): {}", w.node, w.op, w.message));
        }
        if let Some(b) = report.fixed_batch {
            cx.warnings.push(format!("infer-shapes: the batch is fixed at {b} inside the graph; inputs not rebatched"));
        }
        let changed = model.graph.all_values().zip(before.iter()).filter(|(v, t)| model.graph.ty(*v) != *t).count();
        let summary = format!("{changed} value types updated, {} unknown", report.unknown.len());
        Ok(if changed > 0 { PassOutcome::changed(summary) } else { PassOutcome { changed: false, summary } })
    }
}

/// `verify`: fail if the verifier finds anything.
#[derive(Debug, Default)]
pub struct Verify;

impl Pass for Verify {
    fn name(&self) -> &'static str {
        "verify"
    }

    fn run(&self, model: &mut Model, _cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        verify(&model.graph, model.opset()).map_err(|errors| PassError::Verify { pass: self.name().into(), errors })?;
        Ok(PassOutcome { changed: false, summary: "ok".into() })
    }
}

/// Names of every registered pass, in the order they are documented.
pub fn available_passes() -> &'static [&'static str] {
    &["infer-shapes", "fold-constants", "dce", "verify"]
}

/// A pass by its pipeline name.
pub fn pass_by_name(name: &str) -> Result<Box<dyn Pass>, PassError> {
    Ok(match name {
        "infer-shapes" => Box::new(InferShapes),
        "fold-constants" => Box::new(FoldConstants::default()),
        "dce" => Box::new(Dce),
        "verify" => Box::new(Verify),
        _ => {
            return Err(PassError::UnknownPass { name: name.into(), available: available_passes().join(", ") });
        }
    })
}

/// A pipeline from `a,b,c` (whitespace around names is ignored; empty
/// entries are an error).
pub fn pipeline_from_spec(spec: &str) -> Result<PassManager, PassError> {
    let mut pm = PassManager::new();
    for name in spec.split(',').map(str::trim) {
        pm.add(pass_by_name(name)?);
    }
    Ok(pm)
}
