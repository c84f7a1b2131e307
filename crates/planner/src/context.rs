//! The state every search shares ([`Ctx`]): the graph, its facts, the
//! targets, the candidates and each type's precision levels, and what is
//! built from them — per-type plans (uniform, training, DBS), predictors of
//! a set of plans at given batches, and a predictor's evaluation. The
//! allocator, the joint search and the sharded search add their own methods
//! in their own modules.

use std::collections::{BTreeMap, HashMap};

use qsync_cost::{is_precision_dependent, GraphFacts, Kind, Plan, Precision};
use qsync_ir::{Graph, NodeId, OpClass};
use qsync_sim::{PredictOptions, Predictor, Target};

use crate::indicator::Indicator;
use crate::types::{Eval, PlanError, TrainPrecision, TypeEval};

/// The state the search shares.
pub(crate) struct Ctx<'g> {
    pub(crate) g: &'g Graph,
    pub(crate) facts: &'g GraphFacts,
    pub(crate) targets: Vec<Target>,
    pub(crate) popts: PredictOptions,
    pub(crate) ind: &'g Indicator,
    pub(crate) candidates: Vec<NodeId>,
    pub(crate) gemm: HashMap<NodeId, bool>,
    /// Per type: None for training types, else its levels (bits descending).
    pub(crate) levels: Vec<Option<Vec<Precision>>>,
    /// What training types compute in.
    pub(crate) train: TrainPrecision,
    /// See [`crate::AllocOptions::opset`].
    pub(crate) opset: Option<i64>,
    /// The graph's analysis, shared by every predictor the planner builds.
    pub(crate) analysis: std::sync::Arc<qsync_sim::GraphAnalysis>,
    /// Each type's local batch bounds in a split (smallest, largest).
    pub(crate) batch_bounds: (u32, u32),
    /// See [`crate::AllocOptions::shard_collectives`].
    pub(crate) shard_collectives: qsync_sim::CollectiveChoices,
    /// See [`crate::AllocOptions::shard_error_budget`].
    pub(crate) shard_error_budget: f64,
}

/// Nodes the allocator chooses precisions for: lowerable operators that are
/// not precision-dependent and do real work.
pub fn candidates(g: &Graph, facts: &GraphFacts) -> Vec<NodeId> {
    facts
        .order()
        .iter()
        .copied()
        .filter(|&n| {
            let node = g.node(n);
            !is_precision_dependent(&node.op)
                && node.op.class() != OpClass::Shape
                && qsync_passes::precision::lowerable(g, n)
                && facts.node(n).is_ok_and(|f| {
                    matches!(f.kind, Kind::Conv | Kind::Gemm | Kind::Norm | Kind::Softmax | Kind::Reduce)
                })
        })
        .collect()
}

impl<'g> Ctx<'g> {
    pub(crate) fn allowed(&self, t: usize, n: NodeId) -> Vec<Precision> {
        let Some(levels) = &self.levels[t] else { return vec![Precision::Fp32] };
        let gemm = self.gemm.get(&n).copied().unwrap_or(false);
        levels
            .iter()
            .copied()
            .filter(|p| gemm || (!p.is_fixed_point() && p.bits() >= 16))
            // INT8 needs a calibrated scale for every activation it reads.
            .filter(|p| !p.is_fixed_point() || self.ind.int8_allowed(n))
            .filter(|&p| self.schema_allows(n, p))
            .collect()
    }

    /// Whether `n`'s ONNX schema takes float data at `p` (quantized
    /// precisions compute an FP32 op between QDQ pairs, so they are judged
    /// as FP32).
    pub(crate) fn schema_allows(&self, n: NodeId, p: Precision) -> bool {
        let Some(opset) = self.opset else { return true };
        if !matches!(p, Precision::Fp16 | Precision::Bf16) {
            return true;
        }
        let dtype = p.storage_dtype();
        qsync_ir::op::node_float_allowed(self.g, n, opset, dtype) != Some(false)
    }

    /// The node's precision at uniform level `p`: the lowest it allows with at least `p`'s bits.
    pub(crate) fn at_level(&self, t: usize, n: NodeId, p: Precision) -> Precision {
        self.allowed(t, n).into_iter().rev().find(|q| q.bits() >= p.bits()).unwrap_or(Precision::Fp32)
    }

    /// The plan of training type `t` under [`TrainPrecision`]: GEMM-like
    /// candidates at its precision where their schema allows, the rest FP32.
    pub(crate) fn training_plan(&self, t: usize) -> Result<Plan, PlanError> {
        let device = &self.targets[t].device;
        let gemm = |n: &NodeId| self.gemm.get(n).copied().unwrap_or(false);
        // The first choice the device has; `auto` also skips a type the
        // model's opset refuses for some GEMM-like operator (ONNX's Conv
        // takes BF16 from opset 22 only) rather than leave those in FP32.
        let usable = |p: Precision| {
            device.supports(p)
                && (self.train != TrainPrecision::Auto
                    || self.candidates.iter().filter(|n| gemm(n)).all(|&n| self.schema_allows(n, p)))
        };
        let p = self.train.choices().iter().copied().find(|&p| usable(p)).ok_or_else(|| {
            PlanError::Infeasible(format!(
                "{} has no {}: choose another --train-precision (auto picks BF16, else FP16)",
                device.name,
                self.train.choices()[0]
            ))
        })?;
        let mut plan = Plan::new();
        for &n in &self.candidates {
            let q = if gemm(&n) && p != Precision::Fp32 && self.schema_allows(n, p) { p } else { Precision::Fp32 };
            plan.set(n, q);
        }
        Ok(plan)
    }

    /// DBS's plan of type `t`: what a user who only moves samples runs —
    /// the training precision ([`Ctx::training_plan`]: AMP by default, FP32
    /// with `--train-precision fp32`, QSync's own DBS) on every type, the
    /// inference types included; a type without the precision asked for
    /// (a V100 under `bf16`) trains in FP32.
    pub fn dbs_plan(&self, t: usize) -> Plan {
        self.training_plan(t).unwrap_or_else(|_| self.all_fp32())
    }

    /// Every candidate at FP32 (training types too).
    pub(crate) fn all_fp32(&self) -> Plan {
        let mut plan = Plan::new();
        for &n in &self.candidates {
            plan.set(n, Precision::Fp32);
        }
        plan
    }

    pub(crate) fn uniform(&self, t: usize, p: Precision) -> Plan {
        let mut plan = Plan::new();
        for &n in &self.candidates {
            plan.set(n, self.at_level(t, n, p));
        }
        plan
    }

    pub(crate) fn predictor(&self, plans: &[Plan]) -> Result<Predictor<'g>, PlanError> {
        let mut targets = self.targets.clone();
        for (t, p) in targets.iter_mut().zip(plans) {
            t.plan = p.clone();
        }
        Ok(Predictor::with_analysis(self.g, self.analysis.clone(), targets, self.popts.clone())?)
    }

    /// A predictor of `plans` with per-type local batches.
    pub(crate) fn predictor_at(&self, plans: &[Plan], batches: &[u32]) -> Result<Predictor<'g>, PlanError> {
        let mut targets = self.targets.clone();
        for ((t, p), &b) in targets.iter_mut().zip(plans).zip(batches) {
            t.plan = p.clone();
            t.local_batch = b;
        }
        Ok(Predictor::with_analysis(self.g, self.analysis.clone(), targets, self.popts.clone())?)
    }

    /// The batch every type was given (the predictor's reference batch).
    pub(crate) fn reference_batch(&self) -> u32 {
        self.popts.reference_batch.unwrap_or_else(|| self.targets.first().map_or(1, |t| t.local_batch)).max(1)
    }

    /// The global batch of the cluster as given.
    pub(crate) fn global_batch(&self) -> u64 {
        self.targets.iter().map(|t| u64::from(t.count) * u64::from(t.local_batch)).sum()
    }

    pub(crate) fn indicator_of(&self, plan: &Plan) -> f64 {
        self.candidates.iter().map(|&n| self.ind.omega(n, plan.get(n).unwrap_or(Precision::Fp32))).sum()
    }

    pub(crate) fn eval(&self, method: &str, pred: &mut Predictor<'_>) -> Eval {
        self.eval_types(method, pred, None)
    }

    /// [`Ctx::eval`] of a predictor over some of the types: `alone` is the
    /// one type it holds, a training cluster of its own.
    pub(crate) fn eval_types(&self, method: &str, pred: &mut Predictor<'_>, alone: Option<usize>) -> Eval {
        let r = pred.result().clone();
        let batches: Vec<u32> = pred.targets().iter().map(|t| t.local_batch).collect();
        let mut types = Vec::new();
        for (i, d) in r.devices.iter().enumerate() {
            let t = alone.unwrap_or(i);
            let inference = alone.is_none() && self.levels[t].is_some();
            let plan = pred.plan(i).cloned().unwrap_or_default();
            let mut hist = BTreeMap::new();
            for &n in &self.candidates {
                *hist.entry(plan.get(n).unwrap_or(Precision::Fp32).to_string()).or_insert(0) += 1;
            }
            let indicator = if inference { self.indicator_of(&plan) } else { 0.0 };
            let mem = pred.memory(i).copied().unwrap_or_default();
            types.push(TypeEval {
                name: d.name.clone(),
                count: self.targets[t].count,
                local_batch: batches[i],
                role: if inference { "inference" } else { "training" },
                plan,
                peak_memory_bytes: d.peak_memory_bytes,
                memory_capacity_bytes: mem.capacity.max(0.0) as u64,
                fits: d.fits,
                indicator,
                precision_histogram: hist,
                compute_ms: d.compute_us / 1e3,
                forward_end_ms: d.forward_end_us / 1e3,
                backward_end_ms: d.backward_end_us / 1e3,
                finish_ms: d.finish_us / 1e3,
                accumulation_steps: 1,
            });
        }
        Eval {
            method: method.to_string(),
            iteration_ms: r.iteration_us / 1e3,
            samples_per_s: r.samples_per_s,
            indicator_sum: types.iter().map(|t| t.indicator).sum(),
            types,
        }
    }
}
