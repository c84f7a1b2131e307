//! Raising a model's default-domain opset.
//!
//! A plan may put a node in a precision its schema accepts only at a later
//! opset than the model's (`Conv` and `MaxPool` take bfloat16 from opset
//! 22); raising the opset lets the written model compute what the plan
//! says. [`upgrade_opset`] rewrites what changed incompatibly between the
//! model's opset and the target, and refuses (naming the node and why)
//! what it cannot rewrite:
//!
//! - opset 18: the `axes` attribute of `ReduceMean`, `ReduceMax`,
//!   `ReduceMin`, `ReduceProd`, `ReduceL1`, `ReduceL2`, `ReduceLogSum`,
//!   `ReduceLogSumExp` and `ReduceSumSquare` becomes an int64 input (a new
//!   initializer); a `Split` with neither its `split` input nor
//!   `num_outputs` gains `num_outputs` (the 18 schema needs one of them);
//! - opset 20: `GridSample`'s modes `bilinear`/`bicubic` are renamed
//!   `linear`/`cubic`;
//! - refused: `DFT` (its `axis` became an input at 20), `GroupNormalization`
//!   across 21 (its scale and bias changed meaning), unknown default-domain
//!   ops, subgraph attributes and model-local functions (kept encoded, so
//!   their nodes cannot be rewritten), and sources below opset 13 (the
//!   attribute-to-input moves of 13 are not done here).
//!
//! Every other change between 13 and 22 only added types, attributes with
//! defaults that keep the old meaning, or optional inputs.

use crate::attr::{Attr, RawAttrKind};
use crate::graph::{Model, NodeId};
use crate::op::Op;
use crate::tensor::Tensor;

/// The lowest opset [`upgrade_opset`] raises from.
pub const UPGRADE_FROM: i64 = 13;
/// The highest opset [`upgrade_opset`] raises to.
pub const UPGRADE_TO: i64 = 22;

/// The IR version a model of default-domain `opset` needs (the version that
/// came with that opset in the ONNX releases).
pub fn ir_version_for(opset: i64) -> i64 {
    match opset {
        ..=8 => 3,
        9 => 4,
        10 => 5,
        11 => 6,
        12..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        21..=22 => 10,
        _ => 11,
    }
}

/// Reduce ops whose `axes` moved from an attribute to an input at 18.
fn axes_move_at_18(op: &Op) -> bool {
    matches!(
        op,
        Op::ReduceMean
            | Op::ReduceMax
            | Op::ReduceMin
            | Op::ReduceProd
            | Op::ReduceL1
            | Op::ReduceL2
            | Op::ReduceLogSum
            | Op::ReduceLogSumExp
            | Op::ReduceSumSquare
    )
}

/// Why `model` cannot be raised to opset `to`, naming the node; `None`
/// when [`upgrade_opset`] can do it.
pub fn upgrade_blocker(model: &Model, to: i64) -> Option<String> {
    let from = model.opset();
    if to <= from {
        return None;
    }
    if from < UPGRADE_FROM {
        return Some(format!("opset {from} is below {UPGRADE_FROM}, the lowest this raises from"));
    }
    if to > UPGRADE_TO {
        return Some(format!("opset {to} is above {UPGRADE_TO}, the highest this raises to"));
    }
    if !model.functions.is_empty() {
        return Some(format!("the model has {} model-local function(s), kept encoded", model.functions.len()));
    }
    let g = &model.graph;
    for n in g.schedule() {
        let node = g.node(n);
        let why = match &node.op {
            Op::Opaque { domain, op_type } if domain.is_empty() || domain == "ai.onnx" => {
                Some(format!("op `{op_type}` is not known here"))
            }
            Op::DFT if to >= 20 => Some("DFT's `axis` became an input at opset 20".to_string()),
            Op::GroupNormalization if from < 21 && to >= 21 => {
                Some("GroupNormalization's scale and bias changed meaning at opset 21".to_string())
            }
            _ if node
                .attrs
                .values()
                .any(|a| matches!(a, Attr::Raw { kind: RawAttrKind::Graph | RawAttrKind::Graphs, .. })) =>
            {
                Some("its subgraphs are kept encoded".to_string())
            }
            _ => None,
        };
        if let Some(why) = why {
            return Some(format!("node `{}`: {why}", node.name));
        }
    }
    None
}

/// Raises the default-domain opset of `model` to `to` (see the module doc)
/// and its IR version to what that opset needs; returns how many nodes
/// were rewritten. A `to` at or below the model's opset changes nothing.
/// Errors (nothing changed) say why, as [`upgrade_blocker`].
pub fn upgrade_opset(model: &mut Model, to: i64) -> Result<usize, String> {
    let from = model.opset();
    if to <= from {
        return Ok(0);
    }
    if let Some(why) = upgrade_blocker(model, to) {
        return Err(format!("cannot raise opset {from} to {to}: {why}"));
    }
    let mut rewritten = 0;
    let g = &mut model.graph;
    let nodes: Vec<NodeId> = g.schedule();
    for n in nodes {
        let node = g.node(n);
        let op = node.op.clone();
        if from < 18 && to >= 18 && axes_move_at_18(&op) {
            if let Some(axes) = node.attr_ints("axes").map(<[i64]>::to_vec) {
                let name = g.fresh_value_name(&format!("{}_axes", node.name));
                let v = g.add_init(name, Tensor::from_i64(vec![axes.len() as i64], &axes));
                g.node_mut(n).attrs.remove("axes");
                // Below 18 these ops read only their data input.
                if g.node(n).inputs().len() == 1 {
                    g.push_input_to(n, Some(v));
                } else {
                    g.set_input(n, 1, Some(v));
                }
                rewritten += 1;
            }
        } else if from < 18 && to >= 18 && op == Op::Split {
            let node = g.node(n);
            if node.input(1).is_none() && node.attr("num_outputs").is_none() {
                let k = node.outputs().len() as i64;
                g.node_mut(n).attrs.insert("num_outputs".into(), Attr::Int(k));
                rewritten += 1;
            }
        } else if from < 20 && to >= 20 && op == Op::GridSample {
            let renamed = match g.node(n).attr_str("mode") {
                Some("bilinear") => Some("linear"),
                Some("bicubic") => Some("cubic"),
                _ => None,
            };
            if let Some(mode) = renamed {
                g.node_mut(n).attrs.insert("mode".into(), Attr::String(mode.as_bytes().to_vec()));
                rewritten += 1;
            }
        }
    }
    for (d, v) in &mut model.opsets {
        if d.is_empty() || d == "ai.onnx" {
            *v = to;
        }
    }
    model.ir_version = model.ir_version.max(ir_version_for(to));
    Ok(rewritten)
}
