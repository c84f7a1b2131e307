//! The predictor: the cost model (`qsync-cost`) feeding the replayer.
//!
//! Given a graph whose batch is bound, and per device type a device from the
//! database, a count, a precision plan and a memory fraction, [`Predictor`]
//! costs every node on every type once, estimates memory, and simulates the
//! data-parallel iteration. [`Predictor::set_precision`] re-costs one node on
//! one type and re-simulates incrementally — what the planners call in their
//! inner loops.
//!
//! Each target may carry a calibration [`Profile`] for its device: measured
//! operator times and cast fits replace the analytic ones wherever the
//! profile has data (`qsync_cost::profile` documents the format). A profile
//! that names a different device is refused.
//!
//! Work of graphs with a batch fixed inside them (dynamo exports bake batch 1
//! into reshape targets) is scaled by `local batch / fixed batch`: op times
//! and saved activations (and the per-node gradient buffers of the workspace)
//! scale linearly; weights, their gradients and optimizer state do not.

use qsync_cost::{
    estimate_memory, Bindings, CostModel, Device, GraphFacts, MemoryBreakdown, Optimizer, Plan, Precision, Profile,
    ResolvedPlan,
};
use qsync_ir::{Graph, NodeId};

use crate::{Cluster, DeviceType, LocalOp, LocalProgram, OpCost, SimConfig, SimError, SimResult, Simulator};

/// Why a prediction could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error(transparent)]
    Cost(#[from] qsync_cost::CostError),
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("device {device}: {reason}")]
    Target { device: String, reason: String },
}

/// One device type of the cluster.
#[derive(Clone, Debug)]
pub struct Target {
    pub device: Device,
    pub count: u32,
    /// Devices per node (the last node may hold fewer).
    pub per_node: u32,
    /// Samples each device processes per iteration.
    pub local_batch: u32,
    pub plan: Plan,
    /// Available fraction of device memory (`None`: the device's default).
    pub memory_fraction: Option<f64>,
    /// Measured costs of this device (its `device`, when named, must match).
    pub calibration: Option<Profile>,
}

impl Target {
    /// `count` devices, up to 8 a node, full memory, uncalibrated.
    pub fn new(device: Device, count: u32, local_batch: u32, plan: Plan) -> Target {
        Target {
            device,
            count,
            per_node: count.clamp(1, 8),
            local_batch,
            plan,
            memory_fraction: None,
            calibration: None,
        }
    }
}

/// Everything the predictor needs besides the targets.
#[derive(Clone, Debug)]
pub struct PredictOptions {
    /// Values of symbolic dims other than the batch.
    pub bindings: Bindings,
    /// `local batch / batch in the graph` when the graph fixes its batch.
    pub work_scale: f64,
    pub optimizer: Optimizer,
    pub config: SimConfig,
    /// Whether the weights that GEMM-like nodes read at FP16/BF16 will be
    /// stored as refreshed copies (what `egraph-casts` does in training):
    /// the optimizer step then also rewrites those copies
    /// ([`refresh_seconds`]). Copies already in the graph are always
    /// counted.
    pub weight_copies: bool,
}

impl Default for PredictOptions {
    fn default() -> Self {
        PredictOptions {
            bindings: Bindings::new(),
            work_scale: 1.0,
            optimizer: Optimizer::default(),
            config: SimConfig::default(),
            weight_copies: false,
        }
    }
}

/// Per-type state kept for incremental updates.
#[derive(Debug)]
struct TypeState {
    model: CostModel,
    plan: Plan,
    resolved: ResolvedPlan,
    memory: MemoryBreakdown,
    /// Node → position in the local program.
    index: Vec<Option<usize>>,
}

/// Cost model + simulator for one graph on one cluster.
#[derive(Debug)]
pub struct Predictor<'g> {
    graph: &'g Graph,
    facts: GraphFacts,
    opts: PredictOptions,
    types: Vec<TypeState>,
    targets: Vec<Target>,
    sim: Simulator,
}

fn us(seconds: f64) -> f64 {
    seconds * 1e6
}

/// Seconds for one optimizer step over `params` FP32 parameters: a
/// memory-bound sweep reading and writing parameters, gradients and state.
pub fn optimizer_seconds(device: &Device, params: f64, optimizer: Optimizer) -> f64 {
    // Bytes touched per parameter: read p, g (+ state), write p (+ state).
    let touched = match optimizer {
        Optimizer::Sgd { momentum: false } => 12.0,
        Optimizer::Sgd { momentum: true } => 20.0,
        Optimizer::Adam => 28.0,
    };
    params * touched / (device.mem_bytes_per_s() * device.efficiency.memory) + device.launch_s()
}

/// Seconds the optimizer step adds to rewrite refreshed copies of
/// `copy_bytes` in all: the step already reads each master, so a copy costs
/// only its write, fused into the step's sweep (no launch of its own).
pub fn refresh_seconds(device: &Device, copy_bytes: f64) -> f64 {
    copy_bytes / (device.mem_bytes_per_s() * device.efficiency.memory)
}

/// Bytes of refreshed copies the optimizer step rewrites under `resolved`:
/// the graph's own copies, and with `planned` one per (weight, precision)
/// that a GEMM-like node reads at FP16/BF16 (the copies `egraph-casts`
/// will store).
fn copy_bytes(graph: &Graph, facts: &GraphFacts, resolved: &ResolvedPlan, planned: bool) -> Result<f64, PredictError> {
    let mut bytes: f64 =
        facts.copies().iter().map(|&(c, dt)| facts.elements(c).unwrap_or(0.0) * f64::from(dt.bits()) / 8.0).sum();
    if planned {
        let mut seen = std::collections::HashSet::new();
        for &n in facts.order() {
            let p = resolved.compute(n);
            if !matches!(p, Precision::Fp16 | Precision::Bf16) || !facts.node(n)?.kind.is_gemm_like() {
                continue;
            }
            for &v in graph.node(n).inputs().iter().flatten() {
                if facts.is_param(v) && graph.master_of(v).is_none() && seen.insert((v, p)) {
                    bytes += facts.elements(v).unwrap_or(0.0) * p.bytes();
                }
            }
        }
    }
    Ok(bytes)
}

/// Memory of `target` under `resolved`, with batch-proportional parts
/// scaled by `opts.work_scale` (graphs with a fixed batch).
fn scaled_memory(
    graph: &Graph,
    facts: &GraphFacts,
    resolved: &ResolvedPlan,
    target: &Target,
    opts: &PredictOptions,
) -> Result<MemoryBreakdown, PredictError> {
    let mut m = estimate_memory(graph, facts, resolved, &target.device, opts.optimizer, target.memory_fraction)?;
    let s = opts.work_scale;
    if s != 1.0 {
        let buffers = (m.workspace - target.device.workspace_bytes as f64).max(0.0);
        m.activations *= s;
        m.workspace = target.device.workspace_bytes as f64 + buffers * s;
        m.total =
            m.master_weights + m.low_precision_weights + m.gradients + m.optimizer_state + m.activations + m.workspace;
    }
    Ok(m)
}

impl<'g> Predictor<'g> {
    /// Cost every node for every target and simulate once.
    pub fn new(graph: &'g Graph, targets: Vec<Target>, opts: PredictOptions) -> Result<Predictor<'g>, PredictError> {
        let facts = GraphFacts::new(graph, &opts.bindings)?;
        let order = facts.order().to_vec();
        let bound = graph.node_ids().iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let params: f64 = facts.params().iter().filter_map(|&v| facts.elements(v)).sum();
        let mut types = Vec::with_capacity(targets.len());
        let mut programs = Vec::with_capacity(targets.len());
        let mut cluster_types = Vec::with_capacity(targets.len());
        for t in &targets {
            if let Some(named) = t.calibration.as_ref().and_then(|p| p.device.as_deref()) {
                if !named.eq_ignore_ascii_case(&t.device.name) {
                    return Err(PredictError::Target {
                        device: t.device.name.clone(),
                        reason: format!("the calibration profile is for device `{named}`"),
                    });
                }
            }
            let model = CostModel::new(&t.device, t.calibration.as_ref())?;
            let resolved = t.plan.resolve(graph);
            for n in &order {
                let p = resolved.compute(*n);
                if !t.device.supports(p) {
                    return Err(PredictError::Target {
                        device: t.device.name.clone(),
                        reason: format!(
                            "node {:?} is planned in {p}, which the device does not support",
                            graph.node(*n).name
                        ),
                    });
                }
            }
            let memory = scaled_memory(graph, &facts, &resolved, t, &opts)?;
            let mut index = vec![None; bound];
            let mut ops = Vec::with_capacity(order.len());
            for (i, &n) in order.iter().enumerate() {
                index[n.index()] = Some(i);
                let cost = Self::sim_cost(graph, &facts, &model, n, resolved.compute(n), opts.work_scale)?;
                ops.push(LocalOp { name: graph.node(n).name.clone(), node: Some(n), cost });
            }
            let copies = copy_bytes(graph, &facts, &resolved, opts.weight_copies)?;
            let step = optimizer_seconds(&t.device, params, opts.optimizer) + refresh_seconds(&t.device, copies);
            programs.push(LocalProgram { ops, optimizer_us: us(step) });
            let dt = DeviceType::new(t.device.name.clone(), t.count, t.per_node.max(1), t.local_batch)
                .with_bandwidth(t.device.intra_node_bytes_per_s() / 1e9, t.device.network_bytes_per_s() / 1e9)
                .with_memory(memory.total.max(0.0) as u64, Some(memory.capacity.max(0.0) as u64));
            cluster_types.push(dt);
            types.push(TypeState { model, plan: t.plan.clone(), resolved, memory, index });
        }
        let sim = Simulator::new(Cluster::new(cluster_types), programs, opts.config)?;
        Ok(Predictor { graph, facts, opts, types, targets, sim })
    }

    fn sim_cost(
        graph: &Graph,
        facts: &GraphFacts,
        model: &CostModel,
        n: NodeId,
        p: Precision,
        scale: f64,
    ) -> Result<OpCost, PredictError> {
        let c = model.op_cost(facts, n, p)?;
        // Weight gradients are all-reduced in FP32, whatever the compute precision.
        let grad_bytes: f64 = graph
            .node(n)
            .inputs()
            .iter()
            .flatten()
            .filter(|v| facts.is_param(**v))
            .filter_map(|&v| facts.elements(v))
            .map(|e| 4.0 * e)
            .sum();
        // Per-sample work scales; the kernel launch does not.
        let launch = model.device().launch_s();
        let scaled = |t: f64| if t > launch { us(launch + (t - launch) * scale) } else { us(t) };
        Ok(OpCost {
            fwd_us: scaled(c.fwd),
            input_grad_us: scaled(c.bwd_input),
            weight_grad_us: scaled(c.bwd_weight),
            grad_bytes: grad_bytes as u64,
            saved_bytes: 0,
        })
    }

    /// Change one node's precision on device type `t` (an index into the
    /// targets) and re-simulate what changed: the node and the
    /// precision-dependent successors whose effective precision follows it
    /// are re-resolved breadth-first and re-costed; memory is re-estimated
    /// only when some precision changed. The result equals a fresh
    /// [`Predictor::new`] with the changed plan.
    pub fn set_precision(&mut self, t: usize, n: NodeId, p: Precision) -> Result<(), PredictError> {
        let ts = self.types.get_mut(t).ok_or(SimError::NoDevice(t))?;
        let target = &self.targets[t];
        if !target.device.supports(p) {
            return Err(PredictError::Target {
                device: target.device.name.clone(),
                reason: format!("does not support {p}"),
            });
        }
        if ts.index.get(n.index()).copied().flatten().is_none() {
            return Err(PredictError::Cost(qsync_cost::CostError::NoSuchNode(n.index())));
        }
        if ts.plan.get(n) == Some(p) {
            return Ok(());
        }
        ts.plan.set(n, p);
        let changed = ts.resolved.update(self.graph, &ts.plan, n);
        for &m in &changed {
            let Some(i) = ts.index.get(m.index()).copied().flatten() else { continue };
            let cost =
                Self::sim_cost(self.graph, &self.facts, &ts.model, m, ts.resolved.compute(m), self.opts.work_scale)?;
            self.sim.set_op_cost(t, i, cost)?;
        }
        if !changed.is_empty() {
            let memory = scaled_memory(self.graph, &self.facts, &ts.resolved, target, &self.opts)?;
            self.sim.set_static_memory(t, memory.total.max(0.0) as u64)?;
            ts.memory = memory;
            if self.opts.weight_copies {
                let params: f64 = self.facts.params().iter().filter_map(|&v| self.facts.elements(v)).sum();
                let copies = copy_bytes(self.graph, &self.facts, &ts.resolved, true)?;
                let step = optimizer_seconds(&target.device, params, self.opts.optimizer)
                    + refresh_seconds(&target.device, copies);
                self.sim.set_optimizer_us(t, us(step))?;
            }
        }
        Ok(())
    }

    /// The explicit plan of device type `t`.
    pub fn plan(&self, t: usize) -> Option<&Plan> {
        self.types.get(t).map(|s| &s.plan)
    }

    /// The simulated iteration.
    pub fn result(&mut self) -> &SimResult {
        self.sim.result()
    }

    /// Memory of device type `t` under its plan.
    pub fn memory(&self, t: usize) -> Option<&MemoryBreakdown> {
        self.types.get(t).map(|s| &s.memory)
    }

    /// The effective plan of device type `t`.
    pub fn resolved(&self, t: usize) -> Option<&ResolvedPlan> {
        self.types.get(t).map(|s| &s.resolved)
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// The iteration as a Chrome trace (opens in Perfetto).
    pub fn chrome_trace_json(&mut self) -> String {
        self.sim.chrome_trace_json()
    }
}
