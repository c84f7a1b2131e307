//! Dtype and shape inference (API fixed; implementation in progress).

use std::collections::BTreeMap;

use crate::{Graph, NodeId, Tensor, ValueId};

/// What to bind before inferring.
#[derive(Clone, Debug, Default)]
pub struct InferOptions {
    /// `--batch N`: bind the leading symbolic dim of the graph inputs.
    pub batch: Option<i64>,
    /// `--dim name=N`: bind a named symbolic dim everywhere.
    pub dims: BTreeMap<String, i64>,
}

/// A problem found at one node.
#[derive(Clone, Debug, PartialEq)]
pub struct InferIssue {
    pub node: String,
    pub op: String,
    pub message: String,
}

/// What inference did.
#[derive(Clone, Debug, Default)]
pub struct InferReport {
    /// Live values whose dtype or shape is still unknown.
    pub unknown: Vec<ValueId>,
    /// Inconsistencies (e.g. incompatible broadcast, wrong rank): bad input.
    pub errors: Vec<InferIssue>,
    /// Non-fatal notes (e.g. opaque op outputs left as declared).
    pub warnings: Vec<InferIssue>,
    /// When `batch` was asked for but the graph fixes the batch internally
    /// (a constant reshape target), the fixed batch found.
    pub fixed_batch: Option<i64>,
}

/// Infer dtypes and shapes for every value, in topological order, folding the
/// shape arithmetic exporters emit over symbolic dims.
pub fn infer_shapes(graph: &mut Graph, opset: i64, opts: &InferOptions) -> InferReport {
    let _ = (graph, opset, opts);
    InferReport::default()
}

/// Evaluate a node whose inputs are all constant, for constant folding.
/// `None` when the op is not evaluable here or an input is missing.
pub fn eval_node(graph: &Graph, node: NodeId, inputs: &[Option<&Tensor>], opset: i64) -> Option<Vec<Tensor>> {
    let _ = (graph, node, inputs, opset);
    None
}
