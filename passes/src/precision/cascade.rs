//! `cascade`: QSync's precision-dependent propagation and Alg. 1's cost
//! mapping, incrementally.
//!
//! **Reads:** `Node::precision` of the precision-adjustable ops (O_adj:
//! every lowerable op not in O_dep; unannotated = f32), float data edges,
//! and a [`CostOracle`].
//! **Guarantees:** an O_dep op ([`is_dependent`]: elementwise binary and
//! activation ops, data movement, MaxPool / AveragePool, Dropout) runs at the
//! widest precision of its activation inputs (weights and constants are cast
//! to it); a change spreads breadth-first through dependent successors. INT8 / FP8 ops output FP32 (QSync's kernels) and
//! run their backward in FP16.
//! [`Cascade::set_precision`] returns the change in total cost, where a
//! node's cost is Alg. 1's mapping: its op time at its precision, plus for
//! every float input at another precision a forward cast (weights included:
//! an FP32 master cast to the op's precision each iteration) and a backward
//! cast of the gradient back to the input's precision.
//! **Requires:** `infer-shapes`; an acyclic graph.

use std::collections::{HashMap, VecDeque};

use qsync_ir::{DType, Graph, Model, NodeId, Op, OpClass};

use super::materialize::is_quantized;
use super::{float_succs, lowerable, oracle::numel, widest, CostOracle, PlanOptions};
use crate::manager::{Pass, PassContext, PassError, PassOutcome};

/// Whether an op's precision follows its inputs (QSync's O_dep).
pub fn is_dependent(op: &Op) -> bool {
    match op.class() {
        OpClass::Binary | OpClass::Activation | OpClass::Movement => true,
        OpClass::Pool => matches!(op, Op::MaxPool | Op::AveragePool | Op::GlobalAveragePool | Op::GlobalMaxPool),
        OpClass::Random => *op == Op::Dropout,
        _ => false,
    }
}

/// Why a precision change was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CascadeError {
    #[error("node `{0}` cannot compute below its graph dtypes")]
    NotLowerable(String),
    #[error("the target has no {0} kernels")]
    Unsupported(DType),
    #[error("the graph has a cycle")]
    Cycle,
}

/// A precision DAG with its costs, updated incrementally.
pub struct Cascade<'a> {
    g: &'a Graph,
    oracle: &'a dyn CostOracle,
    prec: HashMap<NodeId, DType>,
    cost: HashMap<NodeId, f64>,
    total: f64,
}

impl std::fmt::Debug for Cascade<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cascade").field("nodes", &self.prec.len()).field("total", &self.total).finish()
    }
}

impl<'a> Cascade<'a> {
    /// Start from `g`'s annotations (unannotated lowerable nodes at f32),
    /// with O_dep ops at their widest input precision.
    pub fn new(g: &'a Graph, oracle: &'a dyn CostOracle) -> Result<Cascade<'a>, CascadeError> {
        let order = g.topo_order().map_err(|_| CascadeError::Cycle)?;
        let mut c = Cascade { g, oracle, prec: HashMap::new(), cost: HashMap::new(), total: 0.0 };
        for &n in &order {
            if lowerable(g, n) {
                let p = g.node(n).precision.filter(|p| p.is_float()).unwrap_or(DType::F32);
                c.prec.insert(n, p);
            }
        }
        for &n in &order {
            if c.prec.contains_key(&n) && is_dependent(&g.node(n).op) {
                if let Some(p) = c.widest_input(n) {
                    c.prec.insert(n, p);
                }
            }
        }
        for &n in &order {
            let k = c.node_cost(n);
            c.cost.insert(n, k);
            c.total += k;
        }
        Ok(c)
    }

    /// Total predicted seconds (forward + backward, casts included).
    pub fn total(&self) -> f64 {
        self.total
    }

    /// The node's compute precision, `None` for nodes that are not lowerable.
    pub fn precision(&self, n: NodeId) -> Option<DType> {
        self.prec.get(&n).copied()
    }

    /// Set `n` to `p`, cascade through O_dep successors, return the cost delta.
    pub fn set_precision(&mut self, n: NodeId, p: DType) -> Result<f64, CascadeError> {
        if !self.prec.contains_key(&n) {
            return Err(CascadeError::NotLowerable(self.g.node(n).name.clone()));
        }
        if !self.oracle.supports(p) {
            return Err(CascadeError::Unsupported(p));
        }
        let mut changed = Vec::new();
        if self.prec.insert(n, p) != Some(p) {
            changed.push(n);
        }
        let mut queue: VecDeque<NodeId> = changed.iter().copied().collect();
        while let Some(x) = queue.pop_front() {
            for s in float_succs(self.g, x) {
                if !self.prec.contains_key(&s) || !is_dependent(&self.g.node(s).op) {
                    continue;
                }
                if let Some(w) = self.widest_input(s) {
                    if self.prec.insert(s, w) != Some(w) {
                        changed.push(s);
                        queue.push_back(s);
                    }
                }
            }
        }
        let mut affected: Vec<NodeId> = changed.clone();
        for &c in &changed {
            affected.extend(float_succs(self.g, c));
        }
        affected.sort();
        affected.dedup();
        let mut delta = 0.0;
        for a in affected {
            let new = self.node_cost(a);
            let old = self.cost.insert(a, new).unwrap_or(0.0);
            delta += new - old;
        }
        self.total += delta;
        Ok(delta)
    }

    /// Write the precisions into a graph (the same graph, or a copy of it).
    pub fn apply(&self, g: &mut Graph) {
        for (&n, &p) in &self.prec {
            if g.contains_node(n) {
                g.node_mut(n).precision = Some(p);
            }
        }
    }

    fn out_precision(&self, n: NodeId) -> Option<DType> {
        self.prec.get(&n).map(|&p| if is_quantized(p) { DType::F32 } else { p })
    }

    fn input_precision(&self, v: qsync_ir::ValueId) -> Option<DType> {
        let d = self.g.ty(v).dtype.filter(|d| d.is_float())?;
        match self.g.producer(v) {
            Some((p, slot)) if !super::materialize::pinned_output(&self.g.node(p).op, slot) => {
                self.out_precision(p).or(Some(d))
            }
            _ => Some(d),
        }
    }

    /// The widest precision among `n`'s activation inputs. Weights and
    /// constants (initializers, Constant nodes) do not widen: they are cast
    /// to the activations' precision, as a framework's fused op casts its
    /// bias (the same rule as `qsync_cost::Plan::resolve`). An op reading
    /// only weights and constants runs at their precision.
    fn widest_input(&self, n: NodeId) -> Option<DType> {
        let g = self.g;
        let op = &g.node(n).op;
        let data: Vec<qsync_ir::ValueId> = g
            .node(n)
            .inputs()
            .iter()
            .enumerate()
            .filter(|(slot, _)| !super::materialize::pinned_input(op, *slot))
            .filter_map(|(_, v)| *v)
            .collect();
        let fixed = |v: &qsync_ir::ValueId| {
            g.value(*v).init().is_some() || g.producer(*v).is_some_and(|(p, _)| g.node(p).op == Op::Constant)
        };
        let activations = data.iter().filter(|v| !fixed(v)).filter_map(|&v| self.input_precision(v)).reduce(widest);
        activations.or_else(|| data.iter().filter_map(|&v| self.input_precision(v)).reduce(widest))
    }

    fn node_cost(&self, n: NodeId) -> f64 {
        let Some(&p) = self.prec.get(&n) else { return 0.0 };
        let bwd = if is_quantized(p) { DType::F16 } else { p };
        let mut t = self.oracle.op_time(self.g, n, p);
        for (slot, v) in self.g.node(n).inputs().iter().enumerate() {
            let Some(v) = *v else { continue };
            if super::materialize::pinned_input(&self.g.node(n).op, slot) {
                continue;
            }
            let Some(from) = self.input_precision(v) else { continue };
            let elems = numel(self.g.ty(v));
            t += self.oracle.cast_time(from, p, elems) + self.oracle.cast_time(bwd, from, elems);
        }
        t
    }
}

/// The `cascade` pass: optionally set every O_adj op to the given precision
/// (`cascade=f16`), apply overrides, propagate, materialize.
#[derive(Debug, Clone, Default)]
pub struct CascadePass {
    /// `None`: keep the O_adj annotations already there.
    pub dtype: Option<DType>,
    pub options: PlanOptions,
}

impl Pass for CascadePass {
    fn name(&self) -> &'static str {
        "cascade"
    }

    fn run(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassOutcome, PassError> {
        let oracle = super::oracle_for(cx, self.name())?;
        if let Some(p) = self.dtype {
            super::require_support(&*oracle, p, self.name(), cx.target.as_deref())?;
        }
        let err = |e: CascadeError| PassError::FailedGraph { pass: "cascade".into(), message: e.to_string() };
        let snapshot = model.graph.clone();
        let mut c = Cascade::new(&snapshot, &*oracle).map_err(err)?;
        let before = c.total();
        for n in snapshot.topo_order().unwrap_or_default() {
            if !lowerable(&snapshot, n) || is_dependent(&snapshot.node(n).op) {
                continue;
            }
            let name = &snapshot.node(n).name;
            if let Some(p) = super::policy::override_for(&self.options.overrides, name).or(self.dtype) {
                c.set_precision(n, p).map_err(|e| PassError::Failed {
                    pass: "cascade".into(),
                    node: format!("\"{name}\" ({})", snapshot.node(n).op),
                    message: e.to_string(),
                })?;
            }
        }
        let after = c.total();
        c.apply(&mut model.graph);
        let mut out = super::finish(model, self.options.mode, cx, self.name())?;
        out.summary += &format!(", analytic cost {:.3} ms -> {:.3} ms", before * 1e3, after * 1e3);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::AnalyticOracle;
    use qsync_ir::text::parse_model;

    const SRC: &str = "opset \"\" 17\ngraph \"g\" {\n  input %x: f32[64,64]\n  input %w: f32[64,64]\n  %a: f32[64,64] = MatMul \"mm1\"(%x, %w)\n  %r: f32[64,64] = Relu \"relu\"(%a)\n  %t: f32[64,64] = Transpose \"tr\"(%r)\n  %b: f32[64,64] = MatMul \"mm2\"(%t, %w)\n  %s: f32[64,64] = Add \"add\"(%b, %r)\n  output %s\n}\n";

    fn node(g: &Graph, name: &str) -> NodeId {
        g.node_ids().into_iter().find(|&n| g.node(n).name == name).expect("node")
    }

    #[test]
    fn changes_cascade_and_deltas_match_a_fresh_costing() {
        let mut m = parse_model(SRC).expect("parse");
        let oracle = AnalyticOracle::for_target("t4").expect("t4");
        let g = m.graph.clone();
        let mut c = Cascade::new(&g, &oracle).expect("acyclic");
        let start = c.total();
        let d1 = c.set_precision(node(&g, "mm1"), DType::F16).expect("f16");
        // Relu and Transpose follow mm1; Add has an f32 input (mm2) so stays f32.
        assert_eq!(c.precision(node(&g, "relu")), Some(DType::F16));
        assert_eq!(c.precision(node(&g, "tr")), Some(DType::F16));
        assert_eq!(c.precision(node(&g, "add")), Some(DType::F32));
        let d2 = c.set_precision(node(&g, "mm2"), DType::F16).expect("f16");
        assert_eq!(c.precision(node(&g, "add")), Some(DType::F16));
        c.apply(&mut m.graph);
        let fresh = Cascade::new(&m.graph, &oracle).expect("acyclic");
        assert!((start + d1 + d2 - fresh.total()).abs() < 1e-12, "{} vs {}", start + d1 + d2, fresh.total());
        assert_eq!(c.set_precision(node(&g, "mm1"), DType::BF16), Err(CascadeError::Unsupported(DType::BF16)));
        assert!(c.set_precision(node(&g, "mm1"), DType::I8).is_ok());
        // INT8 outputs f32, so the Relu after it goes back to f32.
        assert_eq!(c.precision(node(&g, "relu")), Some(DType::F32));
    }
}
