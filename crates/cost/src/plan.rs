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
    matches!(
        op.class(),
        OpClass::Binary | OpClass::Unary | OpClass::Activation | OpClass::Pool | OpClass::Movement | OpClass::Random
    )
}

/// Explicit per-node precisions; unlisted nodes are FP32 (or follow their
/// inputs when precision-dependent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// By node index; never longer than the highest explicit node + 1, so
    /// plans with the same choices compare equal.
    map: Vec<Option<Precision>>,
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
        let i = n.index();
        if i >= self.map.len() {
            self.map.resize(i + 1, None);
        }
        self.map[i] = Some(p);
    }

    /// The explicit choice for `n`, if any.
    pub fn get(&self, n: NodeId) -> Option<Precision> {
        self.map.get(n.index()).copied().flatten()
    }

    /// The explicit choices, by node.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, Precision)> + '_ {
        self.map.iter().enumerate().filter_map(|(i, p)| p.map(|p| (NodeId::new(i), p)))
    }

    /// Effective compute and output precisions of every node.
    pub fn resolve(&self, graph: &Graph) -> ResolvedPlan {
        self.resolve_in(graph, &graph.schedule())
    }

    /// [`Plan::resolve`] with `graph`'s schedule already computed (callers
    /// resolving many plans of one graph sort it once).
    pub fn resolve_in(&self, graph: &Graph, schedule: &[NodeId]) -> ResolvedPlan {
        let bound = node_bound(graph);
        let mut r = ResolvedPlan { compute: vec![Precision::Fp32; bound], output: vec![Precision::Fp32; bound] };
        for &n in schedule {
            let (c, o) = self.node_precision(graph, n, &r.output);
            r.compute[n.index()] = c;
            r.output[n.index()] = o;
        }
        r
    }

    /// Compute and output precision of `n`, given its producers' outputs.
    fn node_precision(&self, graph: &Graph, n: NodeId, output: &[Precision]) -> (Precision, Precision) {
        let node = graph.node(n);
        let p = match self.get(n) {
            Some(p) => p,
            None if is_precision_dependent(&node.op) => {
                let mut widest: Option<Precision> = None;
                for (slot, v) in node.inputs().iter().enumerate() {
                    let Some(v) = v else { continue };
                    // Constants and weights are cast to the activation's
                    // precision; the op's own parameters (Dropout's ratio)
                    // keep theirs.
                    if !graph.ty(*v).dtype.is_some_and(DType::is_float)
                        || graph.value(*v).init().is_some()
                        || node.op.pins_input_dtype(slot)
                        || graph.producer(*v).is_some_and(|(p, _)| graph.node(p).op == Op::Constant)
                    {
                        continue;
                    }
                    let q = match graph.producer(*v) {
                        Some((pn, _)) => output.get(pn.index()).copied().unwrap_or(Precision::Fp32),
                        None => graph.ty(*v).dtype.and_then(Precision::from_dtype).unwrap_or(Precision::Fp32),
                    };
                    widest = Some(widest.map_or(q, |w| w.widest(q)));
                }
                widest.unwrap_or(Precision::Fp32)
            }
            None => Precision::Fp32,
        };
        // A Cast writes the dtype it names, whatever it computes in.
        if node.op == Op::Cast {
            let to = node.outputs().first().and_then(|&o| graph.ty(o).dtype);
            if let Some(q) = to.filter(|d| d.is_float()).and_then(Precision::from_dtype) {
                return (p, q);
            }
        }
        let out = match p {
            Precision::Int8 if !is_precision_dependent(&node.op) => Precision::Fp32,
            Precision::Tf32 => Precision::Fp32,
            q => q,
        };
        (p, out)
    }
}

impl ResolvedPlan {
    /// Bring `self` (the resolution of `plan` before the choice of `n`
    /// changed) up to date with `plan` after it: re-resolves `n` (which must be a node of
    /// `graph`), then,
    /// breadth-first, only the consumers whose inputs changed precision.
    /// Returns every node whose compute precision changed, in id order.
    /// Equals `plan.resolve(graph)` when `self` was up to date before.
    pub fn update(&mut self, graph: &Graph, plan: &Plan, n: NodeId) -> Vec<NodeId> {
        // Compute precisions before the update, of every node touched.
        let mut before: BTreeMap<NodeId, Precision> = BTreeMap::new();
        if n.index() >= self.compute.len() || !graph.contains_node(n) {
            return Vec::new();
        }
        let mut queue = std::collections::VecDeque::from([n]);
        while let Some(m) = queue.pop_front() {
            let (c, o) = plan.node_precision(graph, m, &self.output);
            let i = m.index();
            before.entry(m).or_insert(self.compute[i]);
            self.compute[i] = c;
            if o != self.output[i] {
                self.output[i] = o;
                // A DAG: a consumer re-resolved before all its inputs settled
                // is queued again when the next one changes.
                for &v in graph.node(m).outputs() {
                    for (u, _) in graph.users(v) {
                        if plan.get(u).is_none() && is_precision_dependent(&graph.node(u).op) {
                            queue.push_back(u);
                        }
                    }
                }
            }
        }
        before.into_iter().filter(|&(m, p)| self.compute[m.index()] != p).map(|(m, _)| m).collect()
    }

    /// The precision node `n` computes in.
    pub fn compute(&self, n: NodeId) -> Precision {
        self.compute.get(n.index()).copied().unwrap_or(Precision::Fp32)
    }

    /// The precision of node `n`'s outputs.
    pub fn output(&self, n: NodeId) -> Precision {
        self.output.get(n.index()).copied().unwrap_or(Precision::Fp32)
    }
}
