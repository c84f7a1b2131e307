//! The verifier (placeholder until the full implementation lands).

use std::fmt;

use crate::Graph;

/// One problem found by the verifier.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyError {
    pub node: Option<String>,
    pub op: Option<String>,
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.node, &self.op) {
            (Some(n), Some(o)) => write!(f, "node {n:?} ({o}): {}", self.message),
            (Some(n), None) => write!(f, "node {n:?}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// Check the graph; every problem is reported.
pub fn verify(graph: &Graph, opset: i64) -> Result<(), Vec<VerifyError>> {
    let _ = (graph, opset);
    Ok(())
}
