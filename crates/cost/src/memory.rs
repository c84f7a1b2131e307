//! Training memory of one device under a plan.
//!
//! - master weights: every trained parameter in FP32 (the masters of
//!   refreshed copies included);
//! - low-precision weights: one copy per (parameter, precision) for nodes
//!   computing below FP32 (INT8 copies carry a 4-byte scale), kept for the
//!   backward; and every refreshed copy the graph stores (`refresh`
//!   initializers: persistent, so charged whatever reads them);
//! - gradients: FP32 per parameter (QSync writes weight gradients in FP32);
//! - optimizer state: SGD with momentum one FP32 copy, Adam two;
//! - activations: every value some node keeps for backward, once per
//!   precision it is kept at. A Conv/GEMM keeps its input at its compute
//!   precision (the cast copy; INT8 with its scale); other nodes keep values
//!   at the precision their producer runs in. Plus indices / masks. What
//!   a node keeps follows PyTorch autograd (`GraphFacts::saved`): Mul /
//!   MatMul / Div keep an operand only when the other one's gradient needs
//!   it, and an exporter's decomposed erf-GELU keeps only its input, as the
//!   fused `GeluBackward` does. (Counting every float input of the
//!   decomposition over-counted BERT-base at batch 32 × 128 by ~2 GiB:
//!   FP32 activations 5.3 → 3.3 GiB, in line with published AMP figures of
//!   ~5–7 GB total for BERT-base fine-tuning at this size.);
//! - workspace: the device's reserved bytes plus the largest per-node
//!   gradient buffers of the backward.
//!
//! Lowering every node together never raises the total; lowering one node
//! can, honestly, when its FP32 input stays alive for another consumer and
//! a low-precision copy is added (see tests/memory.rs).

use std::collections::{BTreeMap, HashMap};

use qsync_ir::{Graph, ValueId};
use serde::Serialize;

use crate::facts::GraphFacts;
use crate::plan::ResolvedPlan;
use crate::{Device, Precision, Result};

/// The optimizer, for its state.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub enum Optimizer {
    /// SGD; with momentum keeps one buffer per parameter.
    Sgd { momentum: bool },
    /// Adam / AdamW: two buffers per parameter.
    #[default]
    Adam,
}

impl Optimizer {
    fn state_copies(self) -> f64 {
        match self {
            Optimizer::Sgd { momentum: false } => 0.0,
            Optimizer::Sgd { momentum: true } => 1.0,
            Optimizer::Adam => 2.0,
        }
    }
}

/// Memory of one training iteration, in bytes.
#[derive(Copy, Clone, PartialEq, Debug, Default, Serialize)]
pub struct MemoryBreakdown {
    pub master_weights: f64,
    pub low_precision_weights: f64,
    pub gradients: f64,
    pub optimizer_state: f64,
    pub activations: f64,
    pub workspace: f64,
    pub total: f64,
    /// Bytes available: device memory times the available fraction.
    pub capacity: f64,
}

impl MemoryBreakdown {
    /// Whether the plan fits in the available memory.
    pub fn fits(&self) -> bool {
        self.total <= self.capacity
    }
}

/// Bytes held once per key however many nodes ask for it: a weight copy
/// per (parameter, precision), a saved activation per (value, precision).
/// Reference-counted, so a node's share can be withdrawn and re-added when
/// its precision changes. Byte counts are integers, so the total is exact
/// in any order of updates.
#[derive(Clone, Debug, Default)]
pub struct SharedBytes {
    counts: HashMap<(ValueId, Precision), (u32, f64)>,
    total: f64,
}

impl SharedBytes {
    pub fn add(&mut self, key: (ValueId, Precision), bytes: f64) {
        let e = self.counts.entry(key).or_insert((0, bytes));
        if e.0 == 0 {
            self.total += bytes;
        }
        e.0 += 1;
    }

    pub fn remove(&mut self, key: (ValueId, Precision)) {
        if let Some(e) = self.counts.get_mut(&key) {
            e.0 = e.0.saturating_sub(1);
            if e.0 == 0 {
                self.total -= e.1;
                self.counts.remove(&key);
            }
        }
    }

    pub fn total(&self) -> f64 {
        self.total
    }
}

/// One node's plan-dependent share of the memory.
#[derive(Clone, Debug, Default)]
struct Share {
    weights: Vec<((ValueId, Precision), f64)>,
    saved: Vec<((ValueId, Precision), f64)>,
    /// Its backward's gradient buffers (0 without a backward).
    transient: f64,
}

fn share(graph: &Graph, facts: &GraphFacts, plan: &ResolvedPlan, n: qsync_ir::NodeId) -> Result<Share> {
    let f = facts.node(n)?;
    let p = plan.compute(n);
    let node = graph.node(n);
    let gemm = f.kind.is_gemm_like();
    let mut sh = Share::default();
    if gemm && p.bits() < 32 && p != Precision::Tf32 {
        for v in node.inputs().iter().flatten() {
            if facts.is_param(*v) && graph.master_of(*v).is_none() {
                let bytes = facts.elements(*v).unwrap_or(0.0) * p.bytes() + if p.is_fixed_point() { 4.0 } else { 0.0 };
                sh.weights.push(((*v, p), bytes));
            }
        }
    }
    for &v in facts.saved(n) {
        let at = if gemm {
            p.storage_dtype()
        } else {
            match graph.producer(v) {
                Some((pn, _)) => plan.output(pn).storage_dtype(),
                None => Precision::Fp32.storage_dtype(),
            }
        };
        let at = Precision::from_dtype(at).unwrap_or(Precision::Fp32);
        let bytes = facts.elements(v).unwrap_or(0.0) * at.bytes() + if at.is_fixed_point() { 4.0 } else { 0.0 };
        sh.saved.push(((v, at), bytes));
    }
    if f.needs_backward {
        // Gradient buffers of one node's backward (INT8 runs it in FP16).
        let gb = if p == Precision::Int8 { 2.0 } else { p.bytes() };
        sh.transient = (f.out + f.act_in) * gb;
    }
    Ok(sh)
}

/// The memory of one device under a plan, kept up to date as single nodes
/// change precision ([`MemoryTracker::update`]) at the cost of those nodes
/// only — what the planners' inner loops need. [`estimate_memory`] is a
/// fresh tracker's breakdown, so both agree exactly.
#[derive(Clone, Debug)]
pub struct MemoryTracker {
    /// Everything the plan does not change: masters, gradients, optimizer
    /// state, stored refreshed copies, indices and masks, the workspace
    /// reserve, the capacity.
    master_weights: f64,
    gradients: f64,
    optimizer_state: f64,
    stored_copies: f64,
    extra: f64,
    workspace_base: f64,
    capacity: f64,
    shares: Vec<Option<Share>>,
    weights: SharedBytes,
    saved: SharedBytes,
    /// Multiset of per-node transient bytes (bit patterns of non-negative
    /// floats order as the floats do).
    transient: BTreeMap<u64, u32>,
}

impl MemoryTracker {
    /// The memory of `graph` under `plan` on `device`.
    /// `available_fraction` overrides the device default (ClusterB's T4s: 0.3).
    pub fn new(
        graph: &Graph,
        facts: &GraphFacts,
        plan: &ResolvedPlan,
        device: &Device,
        optimizer: Optimizer,
        available_fraction: Option<f64>,
    ) -> Result<MemoryTracker> {
        let params: f64 = facts.params().iter().filter_map(|&v| facts.elements(v)).sum();
        let stored_copies =
            facts.copies().iter().map(|&(c, dt)| facts.elements(c).unwrap_or(0.0) * f64::from(dt.bits()) / 8.0).sum();
        let extra = facts.order().iter().map(|&n| facts.saved_extra_bytes(n)).sum();
        let frac = available_fraction.unwrap_or_else(|| device.default_memory_fraction());
        let bound = graph.node_ids().iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let mut t = MemoryTracker {
            master_weights: 4.0 * params,
            gradients: 4.0 * params,
            optimizer_state: 4.0 * params * optimizer.state_copies(),
            stored_copies,
            extra,
            workspace_base: device.workspace_bytes as f64,
            capacity: device.memory_bytes as f64 * frac,
            shares: vec![None; bound],
            weights: SharedBytes::default(),
            saved: SharedBytes::default(),
            transient: BTreeMap::new(),
        };
        for &n in facts.order() {
            t.put(n, share(graph, facts, plan, n)?);
        }
        Ok(t)
    }

    fn put(&mut self, n: qsync_ir::NodeId, sh: Share) {
        for &(k, b) in &sh.weights {
            self.weights.add(k, b);
        }
        for &(k, b) in &sh.saved {
            self.saved.add(k, b);
        }
        *self.transient.entry(sh.transient.max(0.0).to_bits()).or_insert(0) += 1;
        if let Some(slot) = self.shares.get_mut(n.index()) {
            *slot = Some(sh);
        }
    }

    fn take(&mut self, n: qsync_ir::NodeId) {
        let Some(sh) = self.shares.get_mut(n.index()).and_then(Option::take) else { return };
        for &(k, _) in &sh.weights {
            self.weights.remove(k);
        }
        for &(k, _) in &sh.saved {
            self.saved.remove(k);
        }
        let key = sh.transient.max(0.0).to_bits();
        if let Some(c) = self.transient.get_mut(&key) {
            *c -= 1;
            if *c == 0 {
                self.transient.remove(&key);
            }
        }
    }

    /// Re-derive the shares of `nodes` under `plan`: every node whose
    /// precision changed, and the readers of their outputs (which keep
    /// those outputs at the producer's precision).
    pub fn update(
        &mut self,
        graph: &Graph,
        facts: &GraphFacts,
        plan: &ResolvedPlan,
        nodes: impl IntoIterator<Item = qsync_ir::NodeId>,
    ) -> Result<()> {
        for n in nodes {
            if self.shares.get(n.index()).is_some_and(Option::is_some) {
                self.take(n);
                self.put(n, share(graph, facts, plan, n)?);
            }
        }
        Ok(())
    }

    /// The breakdown under the current plan.
    pub fn breakdown(&self) -> MemoryBreakdown {
        let transient = self.transient.keys().next_back().map_or(0.0, |&b| f64::from_bits(b));
        let mut m = MemoryBreakdown {
            master_weights: self.master_weights,
            low_precision_weights: self.weights.total() + self.stored_copies,
            gradients: self.gradients,
            optimizer_state: self.optimizer_state,
            activations: self.saved.total() + self.extra,
            workspace: self.workspace_base + transient,
            total: 0.0,
            capacity: self.capacity,
        };
        m.total =
            m.master_weights + m.low_precision_weights + m.gradients + m.optimizer_state + m.activations + m.workspace;
        m
    }
}

/// Estimate the memory of `graph` under `plan` on `device`.
/// `available_fraction` overrides the device default (ClusterB's T4s: 0.3).
pub fn estimate_memory(
    graph: &Graph,
    facts: &GraphFacts,
    plan: &ResolvedPlan,
    device: &Device,
    optimizer: Optimizer,
    available_fraction: Option<f64>,
) -> Result<MemoryBreakdown> {
    Ok(MemoryTracker::new(graph, facts, plan, device, optimizer, available_fraction)?.breakdown())
}
