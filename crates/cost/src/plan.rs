//! Precision plans: which precision each node computes in.
//!
//! A [`Plan`] holds explicit choices (everything else is FP32). QSync's
//! precision-dependent operators (O_dep: Add, Relu, MaxPool, movement, …)
//! without an explicit choice run at the widest precision of their float
//! inputs; [`Plan::resolve`] computes that for every node in one
//! topological sweep. INT8 Conv/GEMM kernels write FP32 (dequantization
//! fused in the epilogue), so their consumers see FP32.

use std::collections::BTreeMap;

use qsync_ir::{DType, Graph, NodeId, Op, OpClass};

use crate::facts::node_bound;
use crate::Precision;

/// Whether `op` is precision-dependent (O_dep): its precision follows its inputs.
pub fn is_precision_dependent(op: &Op) -> bool {
    matches!(op.class(), OpClass::Binary | OpClass::Unary | OpClass::Activation | OpClass::Pool | OpClass::Movement | OpClass::Random)
}

/// Explicit per-node precisions; unlisted nodes are FP32 (or follow their
/// inputs when precision-dependent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    map: BTreeMap<NodeId, Precision>,
}

/// The effective precision of every node under a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedPlan {
    compute: Vec<Precision>,
    output: Vec<Precision>,
}

impl Plan {
    pub fn new() -> Plan {
        Plan::default()
    }

    /// Every node of `graph` that is not precision-dependent set to `p`.
    pub fn uniform(graph: &Graph, p: Precision) -> Plan {
        let mut plan = Plan::new();
        for n in graph.node_ids() {
            if !is_precision_dependent(&graph.node(n).op) && graph.node(n).op.class() != OpClass::Shape {
                plan.set(n, p);
            }
        }
        plan
    }

    pub fn set(&mut self, n: NodeId, p: Precision) {
        self.map.insert(n, p);
    }

    /// The explicit choice for `n`, if any.
    pub fn get(&self, n: NodeId) -> Option<Precision> {
        self.map.get(&n).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (NodeId, Precision)> + '_ {
        self.map.iter().map(|(&n, &p)| (n, p))
    }

    /// Effective compute and output precisions of every node.
    pub fn resolve(&self, graph: &Graph) -> ResolvedPlan {
        let bound = node_bound(graph);
        let mut compute = vec![Precision::Fp32; bound];
        let mut output = vec![Precision::Fp32; bound];
        for n in graph.schedule() {
            let node = graph.node(n);
            let p = match self.get(n) {
                Some(p) => p,
                None if is_precision_dependent(&node.op) => {
                    let mut widest: Option<Precision> = None;
                    for v in node.inputs().iter().flatten() {
                        // Constants and weights are cast to the activation's precision.
                        if !graph.ty(*v).dtype.is_some_and(DType::is_float) || graph.value(*v).init().is_some() {
                            continue;
                        }
                        let q = match graph.producer(*v) {
                            Some((pn, _)) => output[pn.index()],
                            None => graph.ty(*v).dtype.and_then(Precision::from_dtype).unwrap_or(Precision::Fp32),
                        };
                        widest = Some(widest.map_or(q, |w| w.widest(q)));
                    }
                    widest.unwrap_or(Precision::Fp32)
                }
                None => Precision::Fp32,
            };
            compute[n.index()] = p;
            output[n.index()] = match p {
                Precision::Int8 if !is_precision_dependent(&node.op) => Precision::Fp32,
                Precision::Tf32 => Precision::Fp32,
                q => q,
            };
        }
        ResolvedPlan { compute, output }
    }
}

impl ResolvedPlan {
    /// The precision node `n` computes in.
    pub fn compute(&self, n: NodeId) -> Precision {
        self.compute.get(n.index()).copied().unwrap_or(Precision::Fp32)
    }

    /// The precision of node `n`'s outputs.
    pub fn output(&self, n: NodeId) -> Precision {
        self.output.get(n.index()).copied().unwrap_or(Precision::Fp32)
    }
}
