//! The simulator's input: what one device type runs in an iteration.
//!
//! A [`LocalProgram`] is plain data — forward ops in topological order with
//! their costs, and the optimizer step — so the simulator needs nothing from
//! the cost model. A cost model provides it by implementing [`CostSource`]
//! and calling [`LocalProgram::from_graph`]; a plan that inserts casts on a
//! device type hands that type's graph (casts are ordinary nodes).

use qsync_ir::{Graph, NodeId};
use serde::{Deserialize, Serialize};

use crate::DeviceType;

/// What one forward op costs on one device type, per device, at that type's
/// local batch. Times are in µs.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct OpCost {
    /// Forward kernel time.
    pub fwd_us: f64,
    /// Backward time for the gradients of the op's activation inputs.
    pub input_grad_us: f64,
    /// Backward time for the gradients of the op's weights (0 without weights).
    pub weight_grad_us: f64,
    /// Bytes of weight gradient the op hands to the all-reduce (0 without weights).
    pub grad_bytes: u64,
    /// How many parameter tensors those bytes belong to (a weight and a
    /// bias: 2): DDP does some work per tensor
    /// ([`crate::SyncKernels::bucket_tensor_s`]). 0 prices none.
    #[serde(default)]
    pub grad_tensors: u64,
    /// Activation bytes the forward saves for the backward, freed once the
    /// op's backward has run.
    pub saved_bytes: u64,
    /// What issuing the forward costs the host (the framework's Python,
    /// dispatch and launches): the device cannot start the op's kernels
    /// before the host has issued them (0: the host is never behind).
    #[serde(default)]
    pub host_fwd_us: f64,
    /// What issuing the op's backward (both gradients) costs the host.
    #[serde(default)]
    pub host_bwd_us: f64,
}

impl OpCost {
    /// The op on cores shared `share` ways: every time `share` times as long.
    pub fn on_shared_cores(self, share: f64) -> OpCost {
        OpCost {
            fwd_us: self.fwd_us * share,
            input_grad_us: self.input_grad_us * share,
            weight_grad_us: self.weight_grad_us * share,
            host_fwd_us: self.host_fwd_us * share,
            host_bwd_us: self.host_bwd_us * share,
            ..self
        }
    }

    /// An op with forward and input-gradient time and no weights.
    pub fn new(fwd_us: f64, input_grad_us: f64) -> OpCost {
        OpCost { fwd_us, input_grad_us, ..OpCost::default() }
    }

    /// An op with weights: weight-gradient time and gradient bytes too.
    pub fn weighted(fwd_us: f64, input_grad_us: f64, weight_grad_us: f64, grad_bytes: u64) -> OpCost {
        OpCost { fwd_us, input_grad_us, weight_grad_us, grad_bytes, ..OpCost::default() }
    }

    /// The same op, its gradient bytes belonging to `tensors` parameters.
    pub fn with_tensors(mut self, tensors: u64) -> OpCost {
        self.grad_tensors = tensors;
        self
    }

    /// The same op, saving `bytes` of activations for backward.
    pub fn saving(mut self, bytes: u64) -> OpCost {
        self.saved_bytes = bytes;
        self
    }

    /// Forward plus both backward times.
    pub fn total_us(&self) -> f64 {
        self.fwd_us + self.input_grad_us + self.weight_grad_us
    }
}

/// One forward op as the simulator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalOp {
    /// Name in traces (the IR node name, or a cast's name).
    pub name: String,
    /// The IR node it came from, if any.
    #[serde(skip)]
    pub node: Option<NodeId>,
    pub cost: OpCost,
}

impl LocalOp {
    pub fn new(name: impl Into<String>, cost: OpCost) -> LocalOp {
        LocalOp { name: name.into(), node: None, cost }
    }
}

/// Everything one device of a type does in an iteration: forward ops in
/// topological order (the backward runs them in reverse), then the optimizer.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LocalProgram {
    pub ops: Vec<LocalOp>,
    /// Optimizer step, µs.
    pub optimizer_us: f64,
    /// What issuing the optimizer step costs the host, µs (0: never behind).
    #[serde(default)]
    pub optimizer_host_us: f64,
}

/// Where the simulator gets costs from. `qsync-cost` implements this; tests
/// and benches use synthetic sources.
pub trait CostSource {
    /// Cost of `node` of `graph` on one device of type `device`, at its local
    /// batch. Ops that launch nothing (shape arithmetic) return zeros.
    fn op_cost(&self, graph: &Graph, node: NodeId, device: &DeviceType) -> OpCost;

    /// The optimizer step on one device of type `device`, µs.
    fn optimizer_us(&self, graph: &Graph, device: &DeviceType) -> f64;
}

impl LocalProgram {
    /// Build the program of `device` from `graph` in its deterministic
    /// schedule, asking `source` for every node's cost.
    pub fn from_graph(graph: &Graph, device: &DeviceType, source: &(impl CostSource + ?Sized)) -> LocalProgram {
        let ops = graph
            .schedule()
            .into_iter()
            .map(|n| LocalOp {
                name: graph.node(n).name.clone(),
                node: Some(n),
                cost: source.op_cost(graph, n, device),
            })
            .collect();
        LocalProgram { ops, optimizer_us: source.optimizer_us(graph, device), optimizer_host_us: 0.0 }
    }

    /// Weight-gradient bytes per iteration.
    pub fn grad_bytes(&self) -> u64 {
        self.ops.iter().map(|o| o.cost.grad_bytes).sum()
    }
}
