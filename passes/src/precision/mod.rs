//! Precision planning: policies, plans and their materialization.
//!
//! A **plan** is a compute precision per node, held in `Node::precision`
//! (printed `@f16` in the text IR). Planners ([`amp`], [`autocast`],
//! [`uniform`], [`cascade`]) write the annotations; [`materialize`] inserts
//! the casts (and QDQ pairs for INT8 / FP8) that make the graph compute it.
//! Planners ask a [`CostOracle`] which precisions the target has (and, for
//! `cascade`, what things cost); the cost model implements it later.
//!
//! Each planner is also a [`crate::Pass`] that plans then materializes; see
//! [`crate::registry`] for their pipeline arguments.

pub mod amp;
pub mod autocast;
pub mod campo;
pub mod cascade;
pub mod comp;
pub mod costmodel;
pub mod materialize;
pub mod oracle;
pub mod plancost;
pub mod policy;
pub mod qscale;
pub mod uniform;

use qsync_ir::{DType, Graph, Model, NodeId};

pub use cascade::Cascade;
pub use costmodel::CostModelOracle;
pub use materialize::{lowerable, materialize, materialize_with, MaterializeStats, Mode};
pub use oracle::{AnalyticOracle, CostOracle, Prediction, KNOWN_TARGETS};
pub use policy::{Category, Override, Policy, PolicyError, PolicyKind};
pub use qscale::ActivationRanges;

use crate::manager::{PassContext, PassError, PassOutcome};

/// What every planning pass takes besides its policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// The low precision to plan for.
    pub dtype: DType,
    /// Per-node pins, first match wins, applied after the planner.
    pub overrides: Vec<Override>,
    pub mode: Mode,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions { dtype: DType::F16, overrides: Vec::new(), mode: Mode::Training }
    }
}

/// The oracle for the context's target: the cost model on that device
/// ([`CostModelOracle`], symbolic dims bound from `cx.infer` then the
/// documented defaults), or the generic [`AnalyticOracle`] when no target
/// is named (hand-computable numbers for tests).
pub fn oracle_for(cx: &PassContext, pass: &str) -> Result<Box<dyn CostOracle>, PassError> {
    match cx.target.as_deref() {
        None => Ok(Box::new(AnalyticOracle::default())),
        Some(t) => {
            let unknown = || PassError::FailedGraph {
                pass: pass.into(),
                message: format!("unknown target `{t}` (known: {})", KNOWN_TARGETS.join(", ")),
            };
            if !KNOWN_TARGETS.contains(&t) {
                return Err(unknown());
            }
            match CostModelOracle::for_target(t, &cx.infer) {
                Ok(o) => Ok(Box::new(o)),
                Err(_) => AnalyticOracle::for_target(t).map(|o| Box::new(o) as Box<dyn CostOracle>).ok_or_else(unknown),
            }
        }
    }
}

/// Fail unless the target supports `p`.
pub fn require_support(oracle: &dyn CostOracle, p: DType, pass: &str, target: Option<&str>) -> Result<(), PassError> {
    if oracle.supports(p) {
        Ok(())
    } else {
        Err(PassError::FailedGraph {
            pass: pass.into(),
            message: format!("target `{}` has no {p} kernels", target.unwrap_or("generic")),
        })
    }
}

/// Apply overrides to lowerable nodes; an override to a precision the target
/// lacks is an error naming the node.
pub fn apply_overrides(
    g: &mut Graph,
    overrides: &[Override],
    oracle: &dyn CostOracle,
    pass: &str,
) -> Result<(), PassError> {
    if overrides.is_empty() {
        return Ok(());
    }
    for n in g.node_ids() {
        if !lowerable(g, n) {
            continue;
        }
        if let Some(p) = policy::override_for(overrides, &g.node(n).name) {
            if !oracle.supports(p) {
                return Err(PassError::Failed {
                    pass: pass.into(),
                    node: format!("\"{}\" ({})", g.node(n).name, g.node(n).op),
                    message: format!("override asks for {p}, which the target lacks"),
                });
            }
            g.node_mut(n).precision = Some(p);
        }
    }
    Ok(())
}

/// Materialize the plan and summarise it.
pub fn finish(model: &mut Model, mode: Mode, cx: &mut PassContext, pass: &str) -> Result<PassOutcome, PassError> {
    let mode = if cx.inference { Mode::Inference } else { mode };
    let low = count_low(&model.graph);
    let stats = materialize_with(model, mode, &cx.activation_ranges)
        .map_err(|message| PassError::FailedGraph { pass: pass.into(), message })?;
    let mut summary = format!("{low} nodes below f32, {} casts added ({} of weights)", stats.casts, stats.weight_casts);
    if stats.qdq_pairs > 0 {
        summary += &format!(", {} QDQ pairs", stats.qdq_pairs);
    }
    if stats.converted_weights > 0 {
        summary += &format!(", {} weights stored low", stats.converted_weights);
    }
    if let Some((from, to, nodes)) = stats.opset_raised {
        summary += &format!(", opset raised {from} -> {to} for {nodes} nodes");
        cx.warnings.push(format!(
            "{pass}: the written model's opset is raised from {from} to {to}: {nodes} planned nodes take their \
             precision only from opset {to}"
        ));
    }
    if stats.kept_by_schema > 0 {
        summary += &format!(", {} kept at f32 by their ONNX type constraints", stats.kept_by_schema);
    }
    if let Some(why) = &stats.opset_blocked {
        cx.warnings.push(format!("{pass}: nodes kept at f32 that a later opset would accept: {why}"));
    }
    if let Some(w) = stats.uncalibrated_warning(cx.activation_ranges.len()) {
        summary += &format!(", {} kept at f32 without calibrated activation ranges", stats.kept_uncalibrated);
        cx.warnings.push(format!("{pass}: {w}"));
    }
    Ok(PassOutcome { changed: low > 0 || stats.casts > 0, summary })
}

fn count_low(g: &Graph) -> usize {
    g.node_ids().into_iter().filter(|&n| is_low(g, n)).count()
}

fn is_low(g: &Graph, n: NodeId) -> bool {
    g.node(n).precision.is_some_and(|p| p != DType::F32 && p != DType::F64) && lowerable(g, n)
}

/// The wider of two float precisions (f16 with bf16 gives f32).
pub fn widest(a: DType, b: DType) -> DType {
    if a == b || (a.bits() > b.bits() && !is_quant(a)) {
        a
    } else if b.bits() > a.bits() && !is_quant(b) {
        b
    } else {
        DType::F32
    }
}

fn is_quant(p: DType) -> bool {
    materialize::is_quantized(p)
}

/// Producers of a node's float inputs (data edges that carry precision).
pub fn float_preds(g: &Graph, n: NodeId) -> Vec<NodeId> {
    let mut v: Vec<NodeId> = g
        .node(n)
        .inputs()
        .iter()
        .flatten()
        .filter(|&&v| g.ty(v).dtype.is_some_and(DType::is_float))
        .filter_map(|&v| g.producer(v).map(|(p, _)| p))
        .collect();
    v.dedup();
    v
}

/// Consumers of a node's float outputs.
pub fn float_succs(g: &Graph, n: NodeId) -> Vec<NodeId> {
    let mut v: Vec<NodeId> = g
        .node(n)
        .outputs()
        .iter()
        .filter(|&&v| g.ty(v).dtype.is_some_and(DType::is_float))
        .flat_map(|&v| g.users(v).into_iter().map(|(c, _)| c))
        .collect();
    v.dedup();
    v
}

/// The dtype value `v` will have under the plan so far: its producer's
/// planned float precision for float outputs, else its current dtype.
pub fn planned_dtype(g: &Graph, v: qsync_ir::ValueId) -> Option<DType> {
    let d = g.ty(v).dtype?;
    if !d.is_float() {
        return Some(d);
    }
    match g.producer(v) {
        Some((p, slot)) if !materialize::pinned_output(&g.node(p).op, slot) => {
            match materialize::planned_precision(g, p) {
                Some(q) if !is_quant(q) => Some(q),
                Some(_) => Some(DType::F32),
                None => Some(d),
            }
        }
        _ => Some(d),
    }
}
