//! `uniform=<precision>`: every node at one precision.
//!
//! **Reads:** which nodes are [`super::lowerable`]; the target's precisions.
//! **Guarantees:** every lowerable node computes at the given float
//! precision. For a quantized precision (`i8`, `f8e4m3`) only the GEMM-like
//! ops (Conv, MatMul, Gemm — QSync's O_adj kernels with INT8 variants) are
//! quantized and everything else stays f32. Then overrides, then
//! materialization. A precision the target lacks is an error.
//! **Requires:** `infer-shapes`.

use qsync_ir::{DType, Graph, Model, OpClass};

use super::materialize::is_quantized;
use super::{lowerable, PlanOptions};
use crate::manager::{Pass, PassContext, PassError, PassOutcome};

/// Plan every lowerable node at `p`.
pub fn plan_uniform(g: &mut Graph, p: DType) {
    for n in g.node_ids() {
        if !lowerable(g, n) {
            continue;
        }
        let gemm = matches!(g.node(n).op.class(), OpClass::Conv | OpClass::MatMul);
        g.node_mut(n).precision = Some(if is_quantized(p) && !gemm { DType::F32 } else { p });
    }
}

/// The `uniform` pass.
#[derive(Debug, Clone, Default)]
pub struct Uniform {
    pub options: PlanOptions,
}

impl Pass for Uniform {
    fn name(&self) -> &'static str {
        "uniform"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let oracle = super::oracle_for(cx, self.name())?;
        super::require_support(&*oracle, self.options.dtype, self.name(), cx.target.as_deref())?;
        plan_uniform(&mut model.graph, self.options.dtype);
        super::apply_overrides(&mut model.graph, &self.options.overrides, &*oracle, self.name())?;
        super::finish(model, self.options.mode, cx, self.name())
    }
}
