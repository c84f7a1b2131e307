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

use std::collections::HashSet;

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
    let mut m = MemoryBreakdown::default();
    let params: f64 = facts.params().iter().filter_map(|&v| facts.elements(v)).sum();
    m.master_weights = 4.0 * params;
    m.gradients = 4.0 * params;
    m.optimizer_state = 4.0 * params * optimizer.state_copies();

    let mut weight_copies: HashSet<(ValueId, Precision)> = HashSet::new();
    let mut saved: HashSet<(ValueId, Precision)> = HashSet::new();
    let (mut extra, mut transient) = (0.0f64, 0.0f64);
    for &n in facts.order() {
        let f = facts.node(n)?;
        let p = plan.compute(n);
        let node = graph.node(n);
        let gemm = f.kind.is_gemm_like();
        if gemm && p.bits() < 32 && p != Precision::Tf32 {
            for v in node.inputs().iter().flatten() {
                if facts.is_param(*v) && graph.master_of(*v).is_none() && weight_copies.insert((*v, p)) {
                    m.low_precision_weights +=
                        facts.elements(*v).unwrap_or(0.0) * p.bytes() + if p.is_fixed_point() { 4.0 } else { 0.0 };
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
            if saved.insert((v, at)) {
                m.activations +=
                    facts.elements(v).unwrap_or(0.0) * at.bytes() + if at.is_fixed_point() { 4.0 } else { 0.0 };
            }
        }
        extra += facts.saved_extra_bytes(n);
        if f.needs_backward {
            // Gradient buffers of one node's backward (INT8 runs it in FP16).
            let gb = if p == Precision::Int8 { 2.0 } else { p.bytes() };
            transient = transient.max((f.out + f.act_in) * gb);
        }
    }
    // Refreshed copies are stored: charged whatever reads them.
    for &(c, dt) in facts.copies() {
        m.low_precision_weights += facts.elements(c).unwrap_or(0.0) * f64::from(dt.bits()) / 8.0;
    }
    m.activations += extra;
    m.workspace = device.workspace_bytes as f64 + transient;
    m.total =
        m.master_weights + m.low_precision_weights + m.gradients + m.optimizer_state + m.activations + m.workspace;
    let frac = available_fraction.unwrap_or_else(|| device.default_memory_fraction());
    m.capacity = device.memory_bytes as f64 * frac;
    Ok(m)
}
