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
//! into reshape targets) is scaled by `local batch / fixed batch`: each op is
//! priced by the cost model at the scaled batch (`CostModel::op_cost_at`:
//! the roofline of the scaled work, with weights read once and the wave
//! model's loss of efficiency when the work no longer fills the device, or a
//! profile's measured batch curve); casts of activations, saved activations
//! and the per-node gradient buffers of the workspace scale linearly;
//! weights, their gradients and optimizer state do not.

use qsync_cost::{
    Bindings, CostModel, Device, GraphFacts, MemoryBreakdown, MemoryTracker, Optimizer, Plan, Precision, Profile,
    ResolvedPlan, SharedBytes,
};
use qsync_ir::{DType, Graph, NodeId, Op};
use std::sync::Arc;

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
    /// The network of this type's nodes (`None`: one NIC of the device
    /// file's `network_gbit_s`, its `intra_node` link, default latencies).
    pub network: Option<crate::topology::NodeNetwork>,
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
            network: None,
        }
    }

    /// The node network this target is priced with.
    pub fn node_network(&self) -> crate::topology::NodeNetwork {
        self.network.clone().unwrap_or_else(|| crate::topology::NodeNetwork::single_nic(self.device.network_gbit_s))
    }

    /// How many ways a device that is the host's own cores (`arch` `cpu`)
    /// shares them: its node's ranks each compute on the cores its device
    /// file describes (`occupancy.sm_count`, 1 without), and where the node
    /// has fewer (`host_cores_per_node`), every rank computes at
    /// `cores / (ranks · device cores)` of the file's speed. 1 for GPUs
    /// and where the node's cores are not given.
    pub fn compute_share(&self) -> f64 {
        if self.device.arch != "cpu" {
            return 1.0;
        }
        match self.node_network().host_cores {
            Some(c) if c > 0 => {
                let device_cores = self.device.occupancy.as_ref().map_or(1, |o| o.sm_count.max(1));
                (self.per_node.max(1) as f64 * f64::from(device_cores) / f64::from(c)).max(1.0)
            }
            _ => 1.0,
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
    /// The local batch the graph's work is costed at (the batch bound in
    /// `bindings`, times `work_scale`). When set, a target whose
    /// `local_batch` differs has its per-sample work, activations and
    /// per-node buffers scaled by `local_batch / reference_batch` — the
    /// same rule as `work_scale` (ops priced at the scaled batch; kernel
    /// launches, weights, their gradients and optimizer state do not
    /// scale). This is how a joint plan gives each device type its own
    /// batch. `None`: every target is costed at the bound batch whatever
    /// its `local_batch` (which then only counts its samples).
    pub reference_batch: Option<u32>,
    /// The link between device types on different networks.
    pub fabric: Option<crate::Fabric>,
    /// The synchronization kernels on the hosts (the host paths' rates).
    pub host_kernels: crate::SyncKernels,
    /// Pageable GPU↔host copies, GB/s each way (the staged paths).
    pub host_link_gb_per_s: f64,
}

impl Default for PredictOptions {
    fn default() -> Self {
        PredictOptions {
            bindings: Bindings::new(),
            work_scale: 1.0,
            optimizer: Optimizer::default(),
            config: SimConfig::default(),
            weight_copies: false,
            reference_batch: None,
            fabric: None,
            host_kernels: crate::SyncKernels::host(),
            host_link_gb_per_s: crate::sync::HOST_LINK_GB_PER_S,
        }
    }
}

impl PredictOptions {
    /// The work scale of `target`: `work_scale`, times its batch over the
    /// reference batch when one is set.
    pub fn scale_of(&self, target: &Target) -> f64 {
        match self.reference_batch {
            Some(r) if r > 0 => self.work_scale * f64::from(target.local_batch) / f64::from(r),
            _ => self.work_scale,
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
    /// The memory, updated node by node as precisions change.
    tracker: MemoryTracker,
    /// Refreshed copies `egraph-casts` will store, per (parameter,
    /// precision), and each node's claim on them.
    copies: SharedBytes,
    copy_claims: Vec<Vec<((qsync_ir::ValueId, Precision), f64)>>,
}

/// Cost model + simulator for one graph on one cluster.
#[derive(Debug)]
pub struct Predictor<'g> {
    graph: &'g Graph,
    shared: Arc<GraphAnalysis>,
    opts: PredictOptions,
    types: Vec<TypeState>,
    targets: Vec<Target>,
    sim: Simulator,
}

/// What every prediction of one graph under one set of bindings shares,
/// whatever the targets and plans: the graph's facts, the schedule and the
/// cast accounting's per-value classes. A planner that builds many
/// predictors of the same graph computes it once ([`GraphAnalysis::new`])
/// and hands it to [`Predictor::with_analysis`].
#[derive(Debug)]
pub struct GraphAnalysis {
    bindings: Bindings,
    weight_copies: bool,
    facts: GraphFacts,
    /// [`Static`] of every value (for the cast accounting).
    statics: Vec<Static>,
    /// Node → position in the local program.
    index: Vec<Option<usize>>,
    /// Trained parameter tensors (elements of each) and the bytes of
    /// refreshed copies the graph already stores: fixed per graph, read by
    /// every optimizer-step update.
    param_tensors: Vec<f64>,
    stored_copies: f64,
}

impl GraphAnalysis {
    /// Analyse `graph` with `opts`' bindings and weight-copy rule.
    pub fn new(graph: &Graph, opts: &PredictOptions) -> Result<GraphAnalysis, PredictError> {
        let facts = GraphFacts::new(graph, &opts.bindings)?;
        let statics = statics(graph, &facts);
        let bound = graph.node_ids().iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let mut index = vec![None; bound];
        for (i, &n) in facts.order().iter().enumerate() {
            index[n.index()] = Some(i);
        }
        let param_tensors: Vec<f64> = facts.params().iter().filter_map(|&v| facts.elements(v)).collect();
        let stored_copies =
            CastCx { graph, facts: &facts, statics: &statics, index: &[], weight_copies: opts.weight_copies }
                .stored_copy_bytes();
        Ok(GraphAnalysis {
            bindings: opts.bindings.clone(),
            weight_copies: opts.weight_copies,
            facts,
            statics,
            index,
            param_tensors,
            stored_copies,
        })
    }

    /// The graph's facts under the analysed bindings.
    pub fn facts(&self) -> &GraphFacts {
        &self.facts
    }

    fn cast_cx<'a>(&'a self, graph: &'a Graph, weight_copies: bool) -> CastCx<'a> {
        CastCx { graph, facts: &self.facts, statics: &self.statics, index: &self.index, weight_copies }
    }
}

/// The synchronization kernels' costs from the device's cast model:
/// quantizing is QSync's f32 → int8 cast (range reduction, scale, codes),
/// dequantize-accumulate its int8 → f32 cast, 16-bit casts f32 → f16.
/// The synchronization paths that exist for every device of `targets`: a
/// GPU (`sm_XX`) synchronizes CUDA buckets through the hook, staged, with
/// host or device kernels; a CPU device synchronizes on the host.
pub fn sync_paths(targets: &[Target]) -> Vec<crate::SyncPath> {
    use crate::SyncPath;
    let gpus = targets.iter().filter(|t| t.device.arch.starts_with("sm_")).count();
    if gpus == 0 {
        vec![SyncPath::Host]
    } else if gpus == targets.len() {
        vec![SyncPath::HostStaged, SyncPath::Device]
    } else {
        vec![SyncPath::HostStaged]
    }
}

/// Whether `path` exists for every device of `targets`: the paths of
/// [`sync_paths`], and on CPUs also the runtime over Open MPI (not a DDP
/// hook, so `auto` does not offer it; `sync-bench` and MPI jobs run it).
pub fn path_exists(targets: &[Target], path: crate::SyncPath) -> bool {
    sync_paths(targets).contains(&path)
        || (path == crate::SyncPath::Mpi && targets.iter().all(|t| !t.device.arch.starts_with("sm_")))
}

/// The simulator's view of one target: its nodes and their network, its
/// synchronization kernels (the device's, and its host's), no memory.
fn device_type(t: &Target, model: &CostModel, opts: &PredictOptions) -> DeviceType {
    let net = t.node_network();
    let intra = net.intra_node_gb_s.unwrap_or(t.device.intra_node_bytes_per_s() / 1e9);
    DeviceType::new(t.device.name.clone(), t.count, t.per_node.max(1), t.local_batch)
        .with_bandwidth(intra, net.node_gb_per_s())
        .with_nics(net.nics_per_node)
        .with_latency(net.intra_node_latency_us, net.nic_latency_us)
        .with_sync_kernels(sync_kernels(model))
        .with_host(opts.host_kernels, opts.host_link_gb_per_s)
        .with_host_cores(net.host_cores)
        .with_nic_cpu(net.nic_cpu_ns_per_byte * 1e-9)
        .with_compute_on_host(t.device.arch == "cpu")
        .with_fsdp_fixed(
            t.device.fsdp_unit_host_us.unwrap_or(crate::shard::FSDP_UNIT_HOST_US),
            t.device.collective_launch_us.unwrap_or(crate::shard::COLLECTIVE_LAUNCH_US),
        )
}

/// The cluster of `targets` without a model — devices, nodes, networks,
/// synchronization kernels, the fabric — for predicting a synchronization
/// alone ([`Cluster::sync_us`]), as `qsyncc simulate --gradient` does.
pub fn cluster_of(targets: &[Target], opts: &PredictOptions) -> Result<Cluster, PredictError> {
    let mut types = Vec::with_capacity(targets.len());
    for t in targets {
        let model = CostModel::new(&t.device, t.calibration.as_ref())?;
        types.push(device_type(t, &model, opts));
    }
    let c = Cluster::new(types).with_fabric(opts.fabric);
    c.validate()?;
    Ok(c)
}

fn sync_kernels(model: &CostModel) -> crate::SyncKernels {
    use qsync_cost::Precision as P;
    let c = model.casts();
    let (q, d, h) = (c.model(P::Fp32, P::Int8), c.model(P::Int8, P::Fp32), c.model(P::Fp32, P::Fp16));
    crate::SyncKernels {
        quantize_r: q.r,
        quantize_c: q.c,
        dequantize_r: d.r,
        dequantize_c: d.c,
        cast16_r: h.r,
        cast16_c: h.c,
        bf16_r: Some(c.model(P::Fp32, P::Bf16).r),
        // The cast model has one quantize and one dequantize rate, and a
        // GPU's own transport (NCCL) spends no host CPU on its bytes: every
        // other figure stays unset, as the default leaves it.
        ..crate::SyncKernels::default()
    }
}

fn us(seconds: f64) -> f64 {
    seconds * 1e6
}

/// Seconds for one optimizer step over FP32 parameter tensors of
/// `tensors` elements each, from the device file alone: a memory-bound
/// sweep reading and writing parameters, gradients and state, plus its
/// operator launches. A GPU runs the step as PyTorch's multi-tensor kernels
/// (one launch for the step); a CPU (`arch` `cpu`) loops over the tensors
/// and launches the optimizer's operators once per tensor (SGD `add_`;
/// momentum `mul_`, `add_` on the buffer and the update; AdamW the decay,
/// the two moment updates (3), `sqrt`, `div`, `add_` eps, `addcdiv_` and
/// the step count: 9), which dominates a step over many small tensors.
pub fn optimizer_seconds(device: &Device, tensors: &[f64], optimizer: Optimizer) -> f64 {
    // Bytes touched per parameter: read p, g (+ state), write p (+ state);
    // operators per tensor of the CPU loop.
    let (touched, ops_per_tensor) = match optimizer {
        Optimizer::Sgd { momentum: false } => (12.0, 1.0),
        Optimizer::Sgd { momentum: true } => (20.0, 3.0),
        Optimizer::Adam => (28.0, 9.0),
    };
    let params: f64 = tensors.iter().sum();
    let launches = if device.arch == "cpu" { ops_per_tensor * tensors.len() as f64 } else { 1.0 };
    params * touched / (device.mem_bytes_per_s() * device.efficiency.memory) + launches * device.launch_s()
}

/// The optimizer step on a cost model's device: the profile's measured
/// per-tensor curve (or older fit against the total) of this optimizer
/// when its calibration has one ([`CostModel::optimizer_step`]), else
/// [`optimizer_seconds`].
fn step_seconds(model: &CostModel, tensors: &[f64], optimizer: Optimizer) -> f64 {
    let analytic = || optimizer_seconds(model.device(), tensors, optimizer);
    match model.optimizer_step(optimizer_name(optimizer), tensors) {
        // Measured back to back, a step's time is the host's pace where
        // the host is the slower (small tensors): with the host priced
        // apart, the device's share is at most the memory-bound step.
        Some(measured) if model.prices_host() => measured.min(analytic()),
        Some(measured) => measured,
        None => analytic(),
    }
}

fn optimizer_name(optimizer: Optimizer) -> &'static str {
    match optimizer {
        Optimizer::Sgd { momentum: false } => "sgd",
        Optimizer::Sgd { momentum: true } => "momentum",
        Optimizer::Adam => "adam",
    }
}

/// Seconds the optimizer step adds to rewrite refreshed copies of
/// `copy_bytes` in all: the step already reads each master, so a copy costs
/// only its write, fused into the step's sweep (no launch of its own).
pub fn refresh_seconds(device: &Device, copy_bytes: f64) -> f64 {
    copy_bytes / (device.mem_bytes_per_s() * device.efficiency.memory)
}

/// What a value is to the cast accounting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Static {
    /// Computed from the inputs every iteration.
    Activation,
    /// Fixed: an initializer without a gradient, a Constant node, or
    /// computed from those alone. Stored at the precision it is read in
    /// (`egraph-casts` folds its casts), so it costs no cast.
    Constant,
    /// A trained parameter, or a view of one (`Identity(W)`,
    /// `Transpose(W)`): cast every iteration when read below FP32, or
    /// stored as a refreshed copy.
    Param,
}

/// [`Static`] of every value, in one pass over the schedule.
fn statics(graph: &Graph, facts: &GraphFacts) -> Vec<Static> {
    let mut out = vec![Static::Activation; graph.value_capacity()];
    for v in graph.all_values() {
        if graph.value(v).init().is_some() {
            out[v.index()] = if facts.is_param(v) { Static::Param } else { Static::Constant };
        }
    }
    for &n in facts.order() {
        let node = graph.node(n);
        let kind = if node.op == Op::Constant {
            Some(Static::Constant)
        } else if node.op.class() == qsync_ir::OpClass::Random || node.inputs().iter().flatten().next().is_none() {
            None
        } else {
            node.inputs().iter().flatten().try_fold(Static::Constant, |k, v| match out[v.index()] {
                Static::Activation => None,
                Static::Param => Some(Static::Param),
                Static::Constant => Some(k),
            })
        };
        if let Some(k) = kind {
            for &o in node.outputs() {
                out[o.index()] = k;
            }
        }
    }
    out
}

/// What the cast accounting of one graph needs.
struct CastCx<'a> {
    graph: &'a Graph,
    facts: &'a GraphFacts,
    statics: &'a [Static],
    /// Node → position in the local program.
    index: &'a [Option<usize>],
    weight_copies: bool,
}

impl CastCx<'_> {
    /// Whether `n` reads slot `slot` as data of its own precision (not a
    /// Cast, a shape query or one of the op's parameters). Mixed-precision
    /// BatchNormalization reads its scale, bias and statistics in FP32
    /// whatever its data's precision (cuDNN; ONNX types them apart from the
    /// data since opset 15, and `egraph-casts` reads them uncast).
    fn converts(&self, n: NodeId, slot: usize) -> bool {
        let op = &self.graph.node(n).op;
        let own_dtype = op.pins_input_dtype(slot)
            || matches!(op, Op::Cast | Op::CastLike | Op::Shape | Op::Size)
            || (*op == Op::BatchNormalization && slot > 0);
        !own_dtype
    }

    /// The float data inputs of `n` that a materialized plan casts: those
    /// held at another precision than `n` reads in, as (value, held, read),
    /// skipping constants (folded) and, with `weight_copies`, parameters
    /// read below FP32 (refreshed copies).
    fn casted_inputs(&self, resolved: &ResolvedPlan, n: NodeId) -> Vec<(qsync_ir::ValueId, Precision, Precision)> {
        let g = self.graph;
        let Some(to) = reads_in(resolved.compute(n)) else { return Vec::new() };
        let mut out = Vec::new();
        for (slot, v) in g.node(n).inputs().iter().enumerate() {
            let Some(v) = *v else { continue };
            if !g.ty(v).dtype.is_some_and(DType::is_float) || !self.converts(n, slot) {
                continue;
            }
            let from = match self.statics.get(v.index()).copied().unwrap_or(Static::Activation) {
                Static::Constant => continue,
                Static::Param if self.weight_copies && to != Precision::Fp32 => continue,
                Static::Param => g.ty(v).dtype.and_then(Precision::from_dtype),
                Static::Activation => held_in(g, resolved, v),
            };
            if let Some(from) = from.filter(|&f| f != to) {
                out.push((v, from, to));
            }
        }
        out
    }

    /// Casting work node `n` adds under `resolved` (QSync Alg. 1's cost
    /// mapping): each input of [`Self::casted_inputs`] is cast in the
    /// forward and its gradient cast back in the backward. Materialization
    /// makes one cast per (value, precision), so a cast several readers
    /// share is charged to the first of them in program order.
    /// Activation casts grow with the work (`scale`: graphs with a fixed
    /// batch), each but its launch, like any kernel; weight casts do not.
    fn work(&self, model: &CostModel, resolved: &ResolvedPlan, n: NodeId, scale: f64) -> CastWork {
        let g = self.graph;
        let casts = model.casts();
        let scaled = |t: f64| scaled_work(t, model.device().launch_s(), scale);
        let pos = |m: NodeId| self.index.get(m.index()).copied().flatten();
        let mut w = CastWork::default();
        for (v, from, to) in self.casted_inputs(resolved, n) {
            let earlier = g.users(v).into_iter().any(|(u, slot)| {
                u != n
                    && pos(u).zip(pos(n)).is_some_and(|(a, b)| a < b)
                    && self.converts(u, slot)
                    && reads_in(resolved.compute(u)) == Some(to)
            });
            if earlier {
                continue;
            }
            let e = self.facts.elements(v).unwrap_or(0.0);
            let (there, back) = (casts.cast(from, to, e), casts.cast(to, from, e));
            if self.statics.get(v.index()) == Some(&Static::Param) {
                w.weight_fwd += there;
                w.weight_grad += back;
            } else {
                w.fwd += scaled(there);
                if self.facts.requires_grad(v) {
                    w.input_grad += scaled(back);
                }
            }
        }
        // Graph outputs keep their dtype: one held at another precision is
        // cast back (by its producer, here).
        for &o in g.node(n).outputs() {
            if !g.outputs().contains(&o) || self.statics.get(o.index()) != Some(&Static::Activation) {
                continue;
            }
            let Some(dtype) = g.ty(o).dtype.filter(|d| d.is_float()).and_then(Precision::from_dtype) else { continue };
            let Some(held) = held_in(g, resolved, o).filter(|&h| h != dtype) else { continue };
            let e = self.facts.elements(o).unwrap_or(0.0);
            w.fwd += scaled(casts.cast(held, dtype, e));
            if self.facts.requires_grad(o) {
                w.input_grad += scaled(casts.cast(dtype, held, e));
            }
        }
        w
    }

    /// A float-to-float Cast node costs what the cast model says, like the
    /// casts [`Self::work`] charges for a plan: its conversion, and its
    /// gradient's conversion back when the input carries one (a weight
    /// cast's, unscaled). `None` for other nodes.
    fn cast_node(&self, model: &CostModel, n: NodeId, scale: f64) -> Option<CastWork> {
        let g = self.graph;
        let node = g.node(n);
        if node.op != Op::Cast {
            return None;
        }
        let (x, y) = (node.input(0)?, *node.outputs().first()?);
        let precision = |v: qsync_ir::ValueId| g.ty(v).dtype.filter(|d| d.is_float()).and_then(Precision::from_dtype);
        let (from, to) = (precision(x)?, precision(y)?);
        let e = self.facts.elements(x).unwrap_or(0.0);
        let casts = model.casts();
        let scaled = |t: f64| scaled_work(t, model.device().launch_s(), scale);
        let (there, back) = (casts.cast(from, to, e), casts.cast(to, from, e));
        let mut w = CastWork::default();
        match self.statics.get(x.index()).copied().unwrap_or(Static::Activation) {
            Static::Param => (w.weight_fwd, w.weight_grad) = (there, back),
            // A constant's cast left in the graph runs every iteration; no
            // gradient flows back through it.
            Static::Constant => w.weight_fwd = there,
            Static::Activation => {
                w.fwd = scaled(there);
                if self.facts.requires_grad(x) {
                    w.input_grad = scaled(back);
                }
            }
        }
        Some(w)
    }

    /// Bytes of refreshed copies the graph already stores: rewritten by
    /// every optimizer step whatever the plan.
    fn stored_copy_bytes(&self) -> f64 {
        let facts = self.facts;
        facts.copies().iter().map(|&(c, dt)| facts.elements(c).unwrap_or(0.0) * f64::from(dt.bits()) / 8.0).sum()
    }

    /// With `weight_copies`, the refreshed copies node `n` needs under
    /// `resolved`: one per FP32 parameter it reads at FP16/BF16, as
    /// ((parameter, precision), bytes). Shared between readers through
    /// [`SharedBytes`].
    fn copy_claims(&self, resolved: &ResolvedPlan, n: NodeId) -> Vec<((qsync_ir::ValueId, Precision), f64)> {
        let (g, facts) = (self.graph, self.facts);
        let p = resolved.compute(n);
        if !self.weight_copies || !matches!(p, Precision::Fp16 | Precision::Bf16) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (slot, v) in g.node(n).inputs().iter().enumerate() {
            let Some(v) = *v else { continue };
            if self.statics.get(v.index()) == Some(&Static::Param)
                && g.ty(v).dtype == Some(DType::F32)
                && self.converts(n, slot)
            {
                out.push(((v, p), facts.elements(v).unwrap_or(0.0) * p.bytes()));
            }
        }
        out
    }
}

/// `t` seconds of per-sample work scaled by `scale` (a graph with a fixed
/// batch run at another local batch): all of it but one kernel launch.
fn scaled_work(t: f64, launch: f64, scale: f64) -> f64 {
    if t > launch {
        launch + (t - launch) * scale
    } else {
        t
    }
}

/// Seconds of casting work one node adds, already scaled to the local
/// batch.
#[derive(Clone, Copy, Debug, Default)]
struct CastWork {
    /// Activation casts in the forward.
    fwd: f64,
    /// Their gradients' casts back.
    input_grad: f64,
    /// Per-iteration weight casts in the forward.
    weight_fwd: f64,
    /// The weight gradients' casts back.
    weight_grad: f64,
}

/// The float precision a node computing at `p` reads its float inputs in,
/// where it is a float one: INT8 and FP8 work quantizes its FP32 inputs
/// inside the op's own cost.
fn reads_in(p: Precision) -> Option<Precision> {
    match p {
        Precision::Fp32 | Precision::Tf32 => Some(Precision::Fp32),
        Precision::Fp16 | Precision::Bf16 => Some(p),
        Precision::Int8 | Precision::Fp8e4m3 | Precision::Fp8e5m2 => None,
    }
}

/// The precision value `v` holds under `resolved`: its producer's output
/// precision (a Cast's is the dtype it names), or its dtype for graph
/// inputs. Quantized outputs count as FP32.
fn held_in(graph: &Graph, resolved: &ResolvedPlan, v: qsync_ir::ValueId) -> Option<Precision> {
    let p = match graph.producer(v) {
        Some((p, _)) => resolved.output(p),
        None => graph.ty(v).dtype.and_then(Precision::from_dtype)?,
    };
    Some(reads_in(p).unwrap_or(Precision::Fp32))
}

/// `m` with its batch-proportional parts scaled by the target's work scale
/// ([`PredictOptions::scale_of`]).
fn scaled_memory(mut m: MemoryBreakdown, target: &Target, opts: &PredictOptions) -> MemoryBreakdown {
    let s = opts.scale_of(target);
    if s != 1.0 {
        let buffers = (m.workspace - target.device.workspace_bytes as f64).max(0.0);
        m.activations *= s;
        m.workspace = target.device.workspace_bytes as f64 + buffers * s;
        m.total =
            m.master_weights + m.low_precision_weights + m.gradients + m.optimizer_state + m.activations + m.workspace;
    }
    m
}

impl<'g> Predictor<'g> {
    /// Cost every node for every target and simulate once.
    pub fn new(graph: &'g Graph, targets: Vec<Target>, opts: PredictOptions) -> Result<Predictor<'g>, PredictError> {
        let shared = Arc::new(GraphAnalysis::new(graph, &opts)?);
        Predictor::with_analysis(graph, shared, targets, opts)
    }

    /// [`Predictor::new`] with the graph's analysis already made (by
    /// [`GraphAnalysis::new`] on the same graph; its bindings must be
    /// `opts.bindings`).
    pub fn with_analysis(
        graph: &'g Graph,
        shared: Arc<GraphAnalysis>,
        targets: Vec<Target>,
        opts: PredictOptions,
    ) -> Result<Predictor<'g>, PredictError> {
        if shared.bindings != opts.bindings || shared.weight_copies != opts.weight_copies {
            return Err(PredictError::Target {
                device: String::new(),
                reason: "the graph analysis was made with other dim bindings or weight-copy rule".into(),
            });
        }
        let facts = &shared.facts;
        let order = facts.order();
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
            let resolved = t.plan.resolve_in(graph, order);
            for n in order {
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
            let tracker = MemoryTracker::new(graph, facts, &resolved, &t.device, opts.optimizer, t.memory_fraction)?;
            let memory = scaled_memory(tracker.breakdown(), t, &opts);
            let cx = shared.cast_cx(graph, opts.weight_copies);
            let mut ops = Vec::with_capacity(order.len());
            let scale = opts.scale_of(t);
            let share = t.compute_share();
            for &n in order {
                let cost = Self::sim_cost(&cx, &model, &resolved, n, scale)?.on_shared_cores(share);
                ops.push(LocalOp { name: graph.node(n).name.clone(), node: Some(n), cost });
            }
            let mut copies = SharedBytes::default();
            let mut copy_claims = vec![Vec::new(); shared.index.len()];
            for &n in order {
                let claims = cx.copy_claims(&resolved, n);
                for &(k, b) in &claims {
                    copies.add(k, b);
                }
                copy_claims[n.index()] = claims;
            }
            let copy_bytes = shared.stored_copies + copies.total();
            let step =
                step_seconds(&model, &shared.param_tensors, opts.optimizer) + refresh_seconds(&t.device, copy_bytes);
            let optimizer_host_us =
                us(model.optimizer_host_step(optimizer_name(opts.optimizer), &shared.param_tensors));
            programs.push(LocalProgram {
                ops,
                optimizer_us: us(step) * share,
                optimizer_host_us: optimizer_host_us * share,
            });
            let dt = device_type(t, &model, &opts)
                .with_memory(memory.total.max(0.0) as u64, Some(memory.capacity.max(0.0) as u64));
            cluster_types.push(dt);
            types.push(TypeState { model, plan: t.plan.clone(), resolved, memory, tracker, copies, copy_claims });
        }
        let sim = Simulator::new(Cluster::new(cluster_types).with_fabric(opts.fabric), programs, opts.config)?;
        Ok(Predictor { graph, shared, opts, types, targets, sim })
    }

    fn sim_cost(
        cx: &CastCx<'_>,
        model: &CostModel,
        resolved: &ResolvedPlan,
        n: NodeId,
        scale: f64,
    ) -> Result<OpCost, PredictError> {
        let (graph, facts) = (cx.graph, cx.facts);
        // An op on weights alone (`Transpose(W)`, a weight's cast) does the
        // same work at any batch.
        let outputs = graph.node(n).outputs();
        let on_weights = !outputs.is_empty()
            && outputs.iter().all(|o| matches!(cx.statics.get(o.index()), Some(Static::Param | Static::Constant)));
        let op_scale = if on_weights { 1.0 } else { scale };
        // The cost model prices the node at the scaled batch itself
        // (`CostModel::op_cost_at`): analytic phases on the scaled work, with
        // weights read once and the wave model's loss of efficiency at small
        // work; measured ones from their batch curve, or linearly.
        let (c, w) = match cx.cast_node(model, n, scale) {
            Some(w) => (qsync_cost::OpCost::default(), w),
            None => (model.op_cost_at(facts, n, resolved.compute(n), op_scale)?, cx.work(model, resolved, n, scale)),
        };
        let params: Vec<_> = graph.node(n).inputs().iter().flatten().filter(|v| facts.is_param(**v)).collect();
        let weight_elems: f64 = params.iter().filter_map(|&&v| facts.elements(v)).sum();
        // Weight gradients are all-reduced in FP32, whatever the compute precision.
        let grad_bytes = 4.0 * weight_elems;
        Ok(OpCost {
            fwd_us: us(c.fwd) + us(w.fwd + w.weight_fwd),
            input_grad_us: us(c.bwd_input) + us(w.input_grad),
            weight_grad_us: us(c.bwd_weight) + us(w.weight_grad),
            grad_bytes: grad_bytes as u64,
            grad_tensors: params.len() as u64,
            saved_bytes: 0,
            host_fwd_us: us(c.host_fwd),
            host_bwd_us: us(c.host_bwd),
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
        let shared = &*self.shared;
        if shared.index.get(n.index()).copied().flatten().is_none() {
            return Err(PredictError::Cost(qsync_cost::CostError::NoSuchNode(n.index())));
        }
        if ts.plan.get(n) == Some(p) {
            return Ok(());
        }
        ts.plan.set(n, p);
        let changed = ts.resolved.update(self.graph, &ts.plan, n);
        // Casts live between a node and its neighbours: re-cost the changed
        // nodes, the readers of their outputs, and the other readers of
        // their inputs (who pays for a shared cast may move).
        let g = self.graph;
        let mut recost: std::collections::BTreeSet<NodeId> = changed.iter().copied().collect();
        // An input that is never cast (not float, or a folded constant) ties
        // its readers' costs to nothing: its other readers stay as they are.
        let statics = &self.shared.statics;
        let castable = |v: qsync_ir::ValueId| {
            g.ty(v).dtype.is_some_and(DType::is_float) && statics.get(v.index()) != Some(&Static::Constant)
        };
        for &m in &changed {
            let node = g.node(m);
            for &v in node.outputs().iter().chain(node.inputs().iter().flatten().filter(|&&v| castable(v))) {
                recost.extend(g.users(v).into_iter().map(|(u, _)| u));
            }
        }
        let cx = shared.cast_cx(g, self.opts.weight_copies);
        let scale = self.opts.scale_of(target);
        let share = target.compute_share();
        for &m in &recost {
            let Some(i) = shared.index.get(m.index()).copied().flatten() else { continue };
            let cost = Self::sim_cost(&cx, &ts.model, &ts.resolved, m, scale)?.on_shared_cores(share);
            self.sim.set_op_cost(t, i, cost)?;
        }
        if !changed.is_empty() {
            ts.tracker.update(self.graph, &shared.facts, &ts.resolved, recost.iter().copied())?;
            let memory = scaled_memory(ts.tracker.breakdown(), target, &self.opts);
            self.sim.set_static_memory(t, memory.total.max(0.0) as u64)?;
            if self.opts.weight_copies {
                for &m in &changed {
                    let Some(old) = ts.copy_claims.get_mut(m.index()) else { continue };
                    for &(k, _) in old.iter() {
                        ts.copies.remove(k);
                    }
                    let claims = cx.copy_claims(&ts.resolved, m);
                    for &(k, b) in &claims {
                        ts.copies.add(k, b);
                    }
                    ts.copy_claims[m.index()] = claims;
                }
                let copies = shared.stored_copies + ts.copies.total();
                let step = step_seconds(&ts.model, &shared.param_tensors, self.opts.optimizer)
                    + refresh_seconds(&target.device, copies);
                self.sim.set_optimizer_us(t, us(step) * share)?;
            }
            ts.memory = memory;
        }
        Ok(())
    }

    /// The local program of device type `t`: per node (in schedule order)
    /// its forward, input-gradient and weight-gradient times as simulated,
    /// the casts its precision needs and the batch scaling included.
    pub fn program(&self, t: usize) -> Option<&crate::LocalProgram> {
        self.sim.program(t)
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

    /// The options the predictor was built with.
    pub fn options(&self) -> &PredictOptions {
        &self.opts
    }

    /// The simulated cluster (device types with their links and the sync
    /// kernels' costs), e.g. for [`crate::sync::choose`].
    pub fn cluster(&self) -> &crate::Cluster {
        self.sim.cluster()
    }

    /// The iteration as a Chrome trace (opens in Perfetto).
    pub fn chrome_trace_json(&mut self) -> String {
        self.sim.chrome_trace_json()
    }

    /// [`Predictor::chrome_trace_json`] through `&self`, once
    /// [`Predictor::result`] has simulated every change (else `None`).
    pub fn chrome_trace_json_cached(&self) -> Option<String> {
        self.sim.chrome_trace_json_cached()
    }
}
