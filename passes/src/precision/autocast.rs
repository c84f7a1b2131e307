//! `autocast`: PyTorch's per-op autocast policy.
//!
//! **Reads:** op types (through a `torch-autocast` [`Policy`]), input dtypes
//! as planned so far, the target's supported precisions.
//! **Guarantees:** in topological order each lowerable node gets:
//! - `lower`: the low precision (default f16);
//! - `fp32`: f32;
//! - `promote`: the widest precision among its float inputs;
//! - `follow` (unlisted): the widest among its float inputs that are not
//!   single-element constants (PyTorch does not let scalars promote), or
//!   f32 when it has none;
//!
//! then overrides, then materialization (see [`super::materialize`]).
//! **Requires:** `infer-shapes`.

use qsync_ir::{DType, Graph, Model, ValueDef};

use super::materialize::pinned_input;
use super::policy::{Category, Policy, PolicyKind};
use super::{lowerable, planned_dtype, widest, CostOracle, PlanOptions};
use crate::manager::{Pass, PassContext, PassError, PassOutcome};

/// Plan `g` under a `torch-autocast` policy.
pub fn plan_autocast(g: &mut Graph, policy: &Policy, low: DType, oracle: &dyn CostOracle) -> Result<(), String> {
    let order = g.topo_order().map_err(|_| "the graph has a cycle".to_string())?;
    let low = if oracle.supports(low) { low } else { DType::F32 };
    for n in order {
        if !lowerable(g, n) {
            continue;
        }
        let cat = policy.category(g.node(n).op.op_type());
        let op = &g.node(n).op;
        let inputs = |scalars: bool| {
            g.node(n)
                .inputs()
                .iter()
                .enumerate()
                .filter(|(slot, _)| !pinned_input(op, *slot))
                .filter_map(|(_, v)| *v)
                .filter(|&v| scalars || !is_scalar_constant(g, v))
                .filter_map(|v| planned_dtype(g, v))
                .filter(|d| d.is_float())
                .reduce(widest)
        };
        let p = match cat {
            Category::Lower => low,
            Category::Fp32 => DType::F32,
            Category::Promote => inputs(true).unwrap_or(DType::F32),
            _ => inputs(false).or_else(|| inputs(true)).unwrap_or(DType::F32),
        };
        g.node_mut(n).precision = Some(p);
    }
    Ok(())
}

fn is_scalar_constant(g: &Graph, v: qsync_ir::ValueId) -> bool {
    matches!(g.value(v).def, ValueDef::Init(_)) && super::oracle::numel(g.ty(v)) == 1
}

/// The `autocast` pass.
#[derive(Debug, Clone)]
pub struct Autocast {
    pub policy: Policy,
    pub options: PlanOptions,
}

impl Autocast {
    pub fn new(policy: Policy, options: PlanOptions) -> Result<Autocast, PassError> {
        if policy.kind != PolicyKind::TorchAutocast {
            return Err(PassError::FailedGraph {
                pass: "autocast".into(),
                message: format!("policy `{}` is not a torch-autocast policy", policy.name),
            });
        }
        Ok(Autocast { policy, options })
    }
}

impl Pass for Autocast {
    fn name(&self) -> &'static str {
        "autocast"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let oracle = super::oracle_for(cx, self.name())?;
        super::require_support(&*oracle, self.options.dtype, self.name(), cx.target.as_deref())?;
        plan_autocast(&mut model.graph, &self.policy, self.options.dtype, &*oracle)
            .map_err(|message| PassError::FailedGraph { pass: self.name().into(), message })?;
        super::apply_overrides(&mut model.graph, &self.options.overrides, &*oracle, self.name())?;
        super::finish(model, self.options.mode, cx, self.name())
    }
}
