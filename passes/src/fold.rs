//! `fold-constants`: evaluate nodes whose inputs are all known.
//!
//! Reads: initializers with inline values, `Constant` nodes, and value types
//! (a `Shape`/`Size` of a fully concrete shape is known without data).
//! Replaces each foldable node by initializers named as its outputs were, so
//! names stay stable. Results larger than [`FoldConstants::max_bytes`] are
//! not materialised (folding an `Expand` to a large constant would bloat the
//! model). Nodes with random outputs are never folded. Run `dce` afterwards to
//! drop the inputs that became unused; run `infer-shapes` before it so that
//! `Shape` nodes see concrete shapes.

use qsync_ir::infer::eval_node;
use qsync_ir::{Model, Op, OpClass, Tensor, TensorData};

use crate::manager::{Pass, PassContext, PassError, PassOutcome};

#[derive(Debug)]
pub struct FoldConstants {
    /// Largest folded result kept, in bytes.
    pub max_bytes: u64,
}

impl Default for FoldConstants {
    fn default() -> Self {
        FoldConstants { max_bytes: 64 * 1024 }
    }
}

impl Pass for FoldConstants {
    fn name(&self) -> &'static str {
        "fold-constants"
    }

    fn run(&self, model: &mut Model, _cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let opset = model.opset();
        let g = &mut model.graph;
        let mut folded = 0usize;
        for n in g.schedule() {
            let node = g.node(n);
            if node.op.is_opaque() || node.op.class() == OpClass::Random || node.op.class() == OpClass::Control {
                continue;
            }
            let shape_only = matches!(node.op, Op::Shape | Op::Size);
            let inputs: Vec<Option<&Tensor>> = node
                .inputs()
                .iter()
                .map(|i| i.and_then(|v| g.value(v).init()).filter(|t| matches!(t.data, TensorData::Inline(_))))
                .collect();
            let all_known = node.inputs().iter().zip(&inputs).all(|(i, t)| i.is_none() || t.is_some());
            if !all_known && !shape_only {
                continue;
            }
            let Some(results) = eval_node(g, n, &inputs, opset) else { continue };
            if results.len() != node.outputs().len()
                || results.iter().map(Tensor::byte_len).sum::<u64>() > self.max_bytes
            {
                continue;
            }
            let outs: Vec<_> = node.outputs().to_vec();
            let names: Vec<String> = outs.iter().map(|&o| g.value_name(o).to_string()).collect();
            g.remove_node(n);
            for ((old, name), t) in outs.into_iter().zip(names).zip(results) {
                let new = g.add_init(name, t);
                g.replace_all_uses(old, new);
            }
            folded += 1;
        }
        if folded == 0 {
            return Ok(PassOutcome::unchanged());
        }
        g.compact_order();
        Ok(PassOutcome::changed(format!("folded {folded} nodes into initializers")))
    }
}
