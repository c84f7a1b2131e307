//! QSync's allocator (Sec. V) and the baselines it is compared with.
//!
//! Problem (1): per inference device type, minimise the indicator sum over
//! its operators subject to memory ≤ its capacity and global throughput ≥
//! T_min ([`TMin`]: by default the throughput of UP, the fastest uniform
//! level that fits; with [`TMin::Lowest`] the paper's own definition, the
//! throughput of the lowest uniform precision that fits).
//!
//! - **UP**: every inference type at one uniform precision level (FP32,
//!   FP16, INT8 — INT8 only for Conv/GEMM, whose neighbours drop to FP16 at
//!   that level); of the levels that fit memory, the fastest — normally the
//!   lowest precision that fits, QSync's T_min. Where the lowest level that
//!   fits is another plan (INT8 slower than FP16), it is reported too
//!   (`up-lowest`): QSync's UP, which [`Method::Up`] chooses, so that the
//!   baseline is written and trained like any other plan.
//! - **Greedy** (QSync as published): start from UP, then recover precision
//!   from a max-heap of indicator decrements, keeping a step only if memory
//!   fits and throughput stays ≥ T_min.
//! - **Ours**: start from the *fastest* plan under the memory cap instead,
//!   then the same recovery. Operators are grouped into classes of
//!   structurally identical operators (op, attributes, input shapes — the
//!   repeated blocks of ResNets and Transformers collapse into one class
//!   each); a class takes one precision for all its members. The fastest
//!   class assignment under the memory budget (capacity minus what the
//!   candidates do not control) is a multiple-choice knapsack: searched
//!   exhaustively when the combinations are few, by DP over discretised
//!   memory otherwise; the DP's allotment is each class's memory budget.
//!   The start is checked by the predictor (the knapsack's memory is a
//!   linear estimate) and the budget shrunk until it really fits. The result
//!   is kept only if it dominates greedy (throughput ≥, indicator ≤);
//!   otherwise greedy's plan is returned and the outcome says so.
//! - **DBS**: every device at the training precision (AMP by default; FP32,
//!   QSync's definition, with `--train-precision fp32`), the global batch
//!   split so the slowest type finishes first, verified by a full prediction
//!   at that split.
//!
//! Training device types (when the cluster is hybrid, the type predicted
//! fastest on the model at FP32, per sample)
//! stay FP32, or AMP (Conv/GEMM in FP16) when asked.

use std::collections::{BTreeMap, BinaryHeap, HashMap};

use qsync_cost::{is_precision_dependent, CostModel, GraphFacts, Kind, Plan, Precision};
use qsync_ir::{Graph, NodeId, OpClass};
use qsync_sim::{PredictError, PredictOptions, Predictor, SimResult, Target};
use serde::Serialize;

use crate::indicator::Indicator;

/// Why planning failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Predict(#[from] PredictError),
    #[error(transparent)]
    Cost(#[from] qsync_cost::CostError),
    #[error("{0}")]
    Infeasible(String),
}

/// Knobs of the allocator.
#[derive(Clone, Debug)]
pub struct AllocOptions {
    /// Precisions inference devices may use (FP32 is always allowed).
    pub precisions: Vec<Precision>,
    /// Which throughput floor the plan must keep.
    pub t_min: TMin,
    /// What the training device type computes in.
    pub train_precision: TrainPrecision,
    /// Class combinations searched exhaustively (else DP).
    pub exhaustive_limit: u64,
    /// Combinations the optimality-gap search may evaluate with the predictor.
    pub gap_limit: u64,
    /// Which plan is chosen: the joint search (default), QSync's allocator
    /// or UP.
    pub method: Method,
    /// What the joint search optimizes.
    pub objective: Objective,
    /// `Objective::Throughput`: the largest indicator sum allowed (default:
    /// UP's).
    pub indicator_bound: Option<f64>,
    /// Per-type option combinations the joint search splits and estimates.
    pub combination_limit: usize,
    /// The model's default-domain opset: a node is never planned at a
    /// float precision its ONNX schema refuses there (materialization would
    /// keep it FP32, and the prediction would not be the written graph).
    /// `None`: no schema check.
    pub opset: Option<i64>,
    /// The smallest local batch any device may get (PyTorch's training
    /// BatchNorm needs two values per channel: 2 where a BatchNorm sees one
    /// value per sample and channel).
    pub min_local_batch: u32,
    /// Every device runs exactly this local batch (a graph that fixes its
    /// batch): no batch split.
    pub fixed_local_batch: Option<u32>,
    /// The sharded collectives' precisions the sharded search may choose
    /// besides the 16-bit all-gather and the FP32 reduce-scatter.
    pub shard_collectives: qsync_sim::CollectiveChoices,
    /// The relative error each sharded collective may add
    /// ([`qsync_sim::GatherPrecision::relative_error`],
    /// [`qsync_sim::ReducePrecision::relative_error`]).
    pub shard_error_budget: f64,
}

impl Default for AllocOptions {
    fn default() -> Self {
        AllocOptions {
            precisions: vec![Precision::Fp32, Precision::Fp16, Precision::Int8],
            t_min: TMin::Best,
            train_precision: TrainPrecision::Auto,
            exhaustive_limit: 4096,
            gap_limit: 512,
            method: Method::Joint,
            objective: Objective::Indicator,
            indicator_bound: None,
            combination_limit: 4096,
            opset: None,
            min_local_batch: 1,
            fixed_local_batch: None,
            shard_collectives: qsync_sim::CollectiveChoices::default(),
            shard_error_budget: 0.01,
        }
    }
}

/// What the training device type (the fastest type, or the only one)
/// computes in. Its GEMM-like operators (MatMul, Gemm, Conv) run at the
/// precision below, everything else in FP32 — PyTorch autocast's rule —
/// and it counts no indicator: this is the precision people train in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainPrecision {
    /// Mixed precision in the device's best 16-bit type: BF16 where it has
    /// BF16 (A100, H100, A10, L4), else FP16 (V100, T4), else FP32.
    #[default]
    Auto,
    /// Everything in FP32.
    Fp32,
    /// Mixed precision in FP16.
    Fp16,
    /// Mixed precision in BF16.
    Bf16,
    /// GEMM-like operators in FP8 (E4M3) where the device has it
    /// (H100, L4), as Transformer Engine trains.
    Fp8,
}

impl TrainPrecision {
    /// The GEMM precisions this choice accepts, in order of preference.
    fn choices(self) -> &'static [Precision] {
        match self {
            TrainPrecision::Auto => &[Precision::Bf16, Precision::Fp16, Precision::Fp32],
            TrainPrecision::Fp32 => &[Precision::Fp32],
            TrainPrecision::Fp16 => &[Precision::Fp16],
            TrainPrecision::Bf16 => &[Precision::Bf16],
            TrainPrecision::Fp8 => &[Precision::Fp8e4m3],
        }
    }
}

impl std::str::FromStr for TrainPrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<TrainPrecision, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "amp" => Ok(TrainPrecision::Auto),
            "fp32" | "f32" => Ok(TrainPrecision::Fp32),
            "fp16" | "f16" => Ok(TrainPrecision::Fp16),
            "bf16" => Ok(TrainPrecision::Bf16),
            "fp8" | "f8" | "f8e4m3" | "fp8e4m3" => Ok(TrainPrecision::Fp8),
            _ => Err(format!("unknown training precision `{s}` (auto, amp, fp32, fp16, bf16, fp8)")),
        }
    }
}

/// Which allocator's plan is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Batch split and precision searched together ([`crate::joint`]); the
    /// chosen plan is the best of every method computed under the objective.
    #[default]
    Joint,
    /// QSync's allocator at the uniform batch (ours: fastest start, then
    /// recovery; greedy from UP when ours does not dominate it), as the
    /// paper describes it.
    Qsync,
    /// QSync's UP baseline itself: every inference type at the lowest
    /// uniform level that fits ([`Outcome::up_lowest`], `up-lowest` of
    /// [`Outcome::methods`], or `up` when that is the same plan), written as
    /// a plan so that it can be trained and compared with the others.
    Up,
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Method, String> {
        match s {
            "joint" => Ok(Method::Joint),
            "qsync" => Ok(Method::Qsync),
            "up" => Ok(Method::Up),
            _ => Err(format!("unknown method `{s}` (joint, qsync, up)")),
        }
    }
}

/// What the joint search optimizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// QSync's problem (1): the smallest indicator sum whose throughput
    /// keeps the floor ([`TMin`]).
    #[default]
    Indicator,
    /// The fastest plan whose indicator sum stays within a bound.
    Throughput,
}

impl std::str::FromStr for Objective {
    type Err = String;
    fn from_str(s: &str) -> Result<Objective, String> {
        match s {
            "indicator" => Ok(Objective::Indicator),
            "throughput" => Ok(Objective::Throughput),
            _ => Err(format!("unknown objective `{s}` (indicator, throughput)")),
        }
    }
}

/// The throughput floor T_min of problem (1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TMin {
    /// The best baseline computed in the same run: max(UP, DBS). The
    /// chosen plan is never predicted slower than either. (QSync's method,
    /// which keeps the uniform batch, uses UP's.)
    #[default]
    Best,
    /// The fastest uniform level that fits (UP): recovery never makes the
    /// iteration slower than the best uniform plan.
    Fastest,
    /// The lowest uniform precision that fits (the paper's T_min, e.g.
    /// INT8 on a T4): where that level is not the fastest (quantization
    /// overhead), recovery may trade throughput down to it for precision.
    Lowest,
}

impl std::str::FromStr for TMin {
    type Err = String;
    fn from_str(s: &str) -> Result<TMin, String> {
        match s {
            "best" => Ok(TMin::Best),
            "fastest" => Ok(TMin::Fastest),
            "lowest" => Ok(TMin::Lowest),
            _ => Err(format!("unknown T_min rule `{s}` (best, fastest, lowest)")),
        }
    }
}

/// One device type under one method.
#[derive(Clone, Debug, Serialize)]
pub struct TypeEval {
    pub name: String,
    pub count: u32,
    pub local_batch: u32,
    pub role: &'static str,
    #[serde(skip)]
    pub plan: Plan,
    pub peak_memory_bytes: u64,
    pub memory_capacity_bytes: u64,
    pub fits: bool,
    pub indicator: f64,
    pub precision_histogram: BTreeMap<String, usize>,
    pub compute_ms: f64,
    pub forward_end_ms: f64,
    pub backward_end_ms: f64,
    pub finish_ms: f64,
    /// Forward and backward passes per optimizer step (gradient
    /// accumulation; 1 for a plain step). Only "each type alone" accumulates,
    /// to train the cluster's global batch where one step of it does not fit.
    pub accumulation_steps: u32,
}

/// A whole-cluster plan and its predicted figures.
#[derive(Clone, Debug, Serialize)]
pub struct Eval {
    pub method: String,
    pub iteration_ms: f64,
    pub samples_per_s: f64,
    pub indicator_sum: f64,
    pub types: Vec<TypeEval>,
}

/// DBS: the batch split and its predicted figures.
#[derive(Clone, Debug, Serialize)]
pub struct DbsEval {
    pub iteration_ms: f64,
    pub samples_per_s: f64,
    pub indicator_sum: f64,
    /// Device type → local batch.
    pub batch_split: BTreeMap<String, u32>,
    /// Device type → whether it fits at its batch.
    pub fits: BTreeMap<String, bool>,
    /// The whole evaluation (per type: plan, local batch, times).
    #[serde(skip)]
    pub eval: Option<Eval>,
}

impl DbsEval {
    /// DBS where no batch split fits: no time, every type marked as not
    /// fitting.
    fn none_fits(cx: &Ctx<'_>) -> DbsEval {
        DbsEval {
            iteration_ms: f64::INFINITY,
            samples_per_s: 0.0,
            indicator_sum: 0.0,
            batch_split: BTreeMap::new(),
            fits: cx.targets.iter().map(|t| (t.device.name.clone(), false)).collect(),
            eval: None,
        }
    }
}

/// Optimality gap against an exhaustive search over class-uniform plans.
#[derive(Clone, Debug, Serialize)]
pub struct Gap {
    pub combinations: u64,
    pub optimal_indicator_sum: f64,
    pub ours_indicator_sum: f64,
    /// (ours − optimal) / optimal; 0 when the optimum is 0 and ours too.
    pub relative_gap: f64,
}

/// Everything one planning run produces.
#[derive(Debug)]
pub struct Outcome {
    /// The floor the chosen plan keeps (samples/s).
    pub t_min: f64,
    /// How `t_min` was chosen.
    pub t_min_rule: TMin,
    /// The floor QSync's method (uniform batch) kept.
    pub qsync_t_min: f64,
    pub up: Eval,
    /// UP at the lowest uniform level that fits (QSync's UP, the floor of
    /// [`TMin::Lowest`]), when that plan is not `up`'s: the all-INT8 plan
    /// where INT8 is slower than a wider level.
    pub up_lowest: Option<Eval>,
    pub greedy: Eval,
    /// QSync's allocator (ours: fastest start and recovery, or greedy's plan
    /// when ours does not dominate it).
    pub ours: Eval,
    pub dbs: DbsEval,
    /// The joint plan at the floor (`Objective::Indicator`), when found.
    pub joint: Option<Eval>,
    /// The fastest joint plan within the indicator bound, when found.
    pub joint_fastest: Option<Eval>,
    /// The indicator bound of the fastest joint plan.
    pub indicator_bound: f64,
    /// The method whose plan is chosen: a key of [`Outcome::methods`].
    pub chosen: String,
    /// The chosen plan.
    pub chosen_eval: Eval,
    /// Whether QSync's own method fell back to greedy's plan.
    pub qsync_fallback: bool,
    pub method: Method,
    pub objective: Objective,
    pub gap: Option<Gap>,
    pub candidates: usize,
    pub classes: usize,
    /// Recovery steps tried / kept (ours).
    pub steps_tried: usize,
    pub steps_kept: usize,
    /// Joint combinations split and estimated, and how many were verified.
    pub joint_combinations: usize,
    pub joint_verified: usize,
    /// Each device type alone (its own devices at the training precision,
    /// training the same global batch — with gradient accumulation where one
    /// step of it does not fit), in the targets' order: what the cluster
    /// without the other types would do. Empty for a single type. `None`
    /// where the type alone does not fit.
    pub alone: Vec<(String, Option<Eval>)>,
    /// Seconds per phase, in order.
    pub phases: Vec<(String, f64)>,
    /// The sharded methods (FSDP baselines and the sharded search). The
    /// chosen plan is sharded (`chosen` is `fsdp`, `fsdp-dbs` or `sharded`)
    /// where DDP fits nowhere, or where the sharded plan is predicted faster
    /// than the DDP plan chosen, at no larger indicator sum (under
    /// `--objective throughput`: within the indicator bound).
    pub sharded: Option<crate::shard::ShardOutcome>,
}

impl Outcome {
    /// Every method's evaluation, by key: `up`, `dbs`, `qsync-greedy`,
    /// `qsync`, `joint-fastest`, `joint` (the last two when found), then the
    /// sharded ones that fit (`fsdp`, `fsdp-dbs`, `sharded`).
    pub fn methods(&self) -> Vec<(&'static str, &Eval)> {
        let mut v: Vec<(&'static str, &Eval)> = vec![("up", &self.up)];
        if let Some(l) = &self.up_lowest {
            v.push(("up-lowest", l));
        }
        if let Some(d) = &self.dbs.eval {
            v.push(("dbs", d));
        }
        v.push(("qsync-greedy", &self.greedy));
        v.push(("qsync", &self.ours));
        if let Some(j) = &self.joint_fastest {
            v.push(("joint-fastest", j));
        }
        if let Some(j) = &self.joint {
            v.push(("joint", j));
        }
        if let Some(s) = &self.sharded {
            v.extend(s.methods().into_iter().map(|(k, e)| (k, &e.eval)));
        }
        v
    }

    /// The fastest single device type alone, when it is predicted faster
    /// than the chosen plan: leaving the other types out is then the better
    /// answer to "is adding these GPUs worth it".
    pub fn faster_alone(&self) -> Option<&Eval> {
        self.best_alone().filter(|e| e.samples_per_s > self.chosen_eval.samples_per_s * (1.0 + 1e-9))
    }

    /// The fastest device type alone (of those that fit).
    pub fn best_alone(&self) -> Option<&Eval> {
        self.alone.iter().filter_map(|(_, e)| e.as_ref()).max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s))
    }

    /// The global batch every plan keeps.
    pub fn global_batch(&self) -> u64 {
        self.up.types.iter().map(|t| u64::from(t.count) * u64::from(t.local_batch)).sum()
    }
}

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
    /// See [`AllocOptions::opset`].
    pub(crate) opset: Option<i64>,
    /// The graph's analysis, shared by every predictor the planner builds.
    pub(crate) analysis: std::sync::Arc<qsync_sim::GraphAnalysis>,
    /// Each type's local batch bounds in a split (smallest, largest).
    pub(crate) batch_bounds: (u32, u32),
    /// See [`AllocOptions::shard_collectives`].
    pub(crate) shard_collectives: qsync_sim::CollectiveChoices,
    /// See [`AllocOptions::shard_error_budget`].
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
    fn eval_types(&self, method: &str, pred: &mut Predictor<'_>, alone: Option<usize>) -> Eval {
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

    /// Device type `t` alone, trained at the training precision on the
    /// cluster's global batch `B` — so that it is compared with the whole
    /// cluster per sample, paying its synchronization once per `B` samples:
    /// each of its `c` devices takes `⌈B/c⌉` samples a step. Where that does
    /// not fit, gradient accumulation: `k` passes of `⌈⌈B/c⌉/k⌉` samples, the
    /// smallest `k` whose micro-batch fits (the largest fitting micro-batch is
    /// found by bisection: memory grows with the batch). An accumulated step
    /// costs `k − 1` forward-backward passes without synchronization, then
    /// one ordinary iteration. A graph that fixes its batch accumulates at
    /// that batch. `None` when not even the smallest micro-batch fits.
    /// Type `t` alone (`tg`, its batch set) sharded: the fastest fitting
    /// stage (full-shard with and without hpZ, shard-grad-op, hybrid-shard
    /// over several nodes), checkpointing off or on.
    fn alone_sharded(&self, t: usize, tg: Target, name: &str) -> Result<Option<Eval>, PlanError> {
        use qsync_sim::shard::{predict_sharded, ShardSpec, Stage, Units};
        let units = Units::of(self.g, self.facts);
        let mut pred = Predictor::with_analysis(self.g, self.analysis.clone(), vec![tg.clone()], self.popts.clone())?;
        let mut stages = vec![(Stage::FullShard, false), (Stage::FullShard, true), (Stage::ShardGradOp, false)];
        if tg.count > tg.per_node.max(1) {
            stages.push((Stage::HybridShard, false));
        }
        let mut best: Option<qsync_sim::ShardedResult> = None;
        for (stage, hpz) in stages {
            for ck in [false, true] {
                let spec = ShardSpec { hpz, checkpoint: vec![ck], ..ShardSpec::new(stage, 1) };
                let r = predict_sharded(&mut pred, &units, &spec)?;
                if r.fits() && best.as_ref().is_none_or(|b| r.samples_per_s > b.samples_per_s) {
                    best = Some(r);
                }
            }
        }
        Ok(best.map(|r| {
            let mut e = self.eval_types(name, &mut pred, Some(t));
            crate::shard::with_sharded_times(&mut e, &r);
            e
        }))
    }

    pub(crate) fn alone(&self, t: usize) -> Result<Option<Eval>, PlanError> {
        let mut target = self.targets[t].clone();
        target.plan = self.training_plan(t)?;
        let global: u64 = self.targets.iter().map(|x| u64::from(x.count) * u64::from(x.local_batch)).sum();
        let per_device = global.div_ceil(u64::from(target.count.max(1))).min(u64::from(u32::MAX)) as u32;
        let name = format!("alone:{}", self.targets[t].device.name);
        let try_micro = |micro: u32| -> Result<Eval, PlanError> {
            let mut tg = target.clone();
            tg.local_batch = micro;
            let mut pred = Predictor::with_analysis(self.g, self.analysis.clone(), vec![tg], self.popts.clone())?;
            Ok(self.eval_types(&name, &mut pred, Some(t)))
        };
        let fits = |e: &Eval| e.types.iter().all(|d| d.fits);
        let (lo, hi) = self.batch_bounds;
        // The type alone sharded, at the whole per-device batch (where DDP
        // does not hold it, against DDP's accumulation below).
        let mut sharded = None;
        let micro = if lo == hi {
            // The graph fixes its batch: accumulate at it.
            let e = try_micro(lo)?;
            if !fits(&e) {
                return Ok(None);
            }
            lo
        } else {
            let top = per_device.max(lo);
            let e = try_micro(top)?;
            // The type alone may shard too (as the whole cluster may): the
            // faster of the two, so that the comparison is like for like.
            let mut tg = target.clone();
            tg.local_batch = top;
            sharded = self.alone_sharded(t, tg, &name)?;
            if fits(&e) {
                return Ok(Some(match sharded {
                    Some(s) if s.samples_per_s > e.samples_per_s => s,
                    _ => e,
                }));
            }
            // Largest micro-batch in [lo, top) that fits.
            let (mut good, mut bad) = (None, top);
            let mut low = lo;
            while low < bad {
                let mid = low + (bad - low) / 2;
                if fits(&try_micro(mid)?) {
                    good = Some(mid);
                    low = mid + 1;
                } else {
                    bad = mid;
                }
            }
            match good {
                Some(g) => g,
                None => return Ok(sharded),
            }
        };
        let k = per_device.div_ceil(micro.max(1)).max(1);
        let micro = per_device.div_ceil(k).max(lo);
        let mut e = try_micro(micro)?;
        if !fits(&e) {
            return Ok(sharded);
        }
        if k > 1 {
            let extra_ms: f64 = e.types.iter().map(|d| d.backward_end_ms).fold(0.0, f64::max) * f64::from(k - 1);
            let samples = e.samples_per_s * e.iteration_ms / 1e3 * f64::from(k);
            e.iteration_ms += extra_ms;
            e.samples_per_s = samples / (e.iteration_ms / 1e3);
            for d in &mut e.types {
                d.accumulation_steps = k;
                d.finish_ms += extra_ms;
            }
        }
        Ok(Some(match sharded {
            Some(s) if s.samples_per_s > e.samples_per_s => s,
            _ => e,
        }))
    }

    /// Max-heap recovery (QSync Sec. V) on `pred`, in place. Returns (tried, kept).
    pub(crate) fn recover(&self, pred: &mut Predictor<'_>, t_min: f64) -> Result<(usize, usize), PlanError> {
        let mut heaps: Vec<BinaryHeap<Step>> = Vec::new();
        for t in 0..self.targets.len() {
            let mut h = BinaryHeap::new();
            if self.levels[t].is_some() {
                let plan = pred.plan(t).cloned().unwrap_or_default();
                for &n in &self.candidates {
                    if let Some(s) = self.next_step(t, n, plan.get(n).unwrap_or(Precision::Fp32)) {
                        h.push(s);
                    }
                }
            }
            heaps.push(h);
        }
        let (mut tried, mut kept) = (0, 0);
        loop {
            let mut any = false;
            for (t, heap) in heaps.iter_mut().enumerate() {
                let Some(s) = heap.pop() else { continue };
                any = true;
                tried += 1;
                pred.set_precision(t, s.node, s.to)?;
                let r = pred.result();
                let ok = r.devices.iter().all(|d| d.fits) && r.samples_per_s >= t_min * (1.0 - 1e-9);
                if ok {
                    kept += 1;
                    if let Some(next) = self.next_step(t, s.node, s.to) {
                        heap.push(next);
                    }
                } else {
                    pred.set_precision(t, s.node, s.from)?;
                }
            }
            if !any {
                return Ok((tried, kept));
            }
        }
    }

    fn next_step(&self, t: usize, n: NodeId, from: Precision) -> Option<Step> {
        let to = self.allowed(t, n).into_iter().rev().find(|q| q.bits() > from.bits())?;
        let dec = self.ind.omega(n, from) - self.ind.omega(n, to);
        Some(Step { dec, node: n, from, to })
    }
}

#[derive(Debug, Clone, Copy)]
struct Step {
    dec: f64,
    node: NodeId,
    from: Precision,
    to: Precision,
}

impl PartialEq for Step {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Step {}
impl PartialOrd for Step {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Step {
    /// Largest decrement first; ties to the earlier node (determinism).
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.dec.total_cmp(&o.dec).then_with(|| o.node.index().cmp(&self.node.index()))
    }
}

/// A structural signature: op, attributes and input / output types.
fn signature(g: &Graph, n: NodeId) -> String {
    let node = g.node(n);
    let ins: Vec<String> =
        node.inputs().iter().map(|v| v.map_or("-".to_string(), |v| format!("{:?}", g.ty(v)))).collect();
    let outs: Vec<String> = node.outputs().iter().map(|&v| format!("{:?}", g.ty(v))).collect();
    format!("{:?}|{:?}|{}|{}", node.op, node.attrs, ins.join(","), outs.join(","))
}

/// Classes of structurally identical candidates, in first-appearance order.
pub fn classes(g: &Graph, candidates: &[NodeId]) -> Vec<Vec<NodeId>> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<Vec<NodeId>> = Vec::new();
    for &n in candidates {
        let s = signature(g, n);
        let i = *index.entry(s).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[i].push(n);
    }
    out
}

/// Linear memory estimate of a node at `p` (activation copy + weight copy).
fn node_memory(facts: &GraphFacts, n: NodeId, p: Precision) -> f64 {
    let Ok(f) = facts.node(n) else { return 0.0 };
    let low_w = if p.bits() < 32 && p != Precision::Tf32 { f.weight * p.bytes() } else { 0.0 };
    f.act_in * p.bytes() + low_w
}

/// Plan a hybrid cluster. `targets` carry device, count, batch, memory
/// fraction and calibration; their plans are ignored.
pub fn allocate(
    g: &Graph,
    facts: &GraphFacts,
    targets: Vec<Target>,
    popts: PredictOptions,
    ind: &Indicator,
    opts: &AllocOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Outcome, PlanError> {
    let mut popts = popts;
    if popts.reference_batch.is_none() {
        let first = targets.first().map_or(1, |t| t.local_batch);
        if targets.iter().any(|t| t.local_batch != first) {
            return Err(PlanError::Infeasible(
                "targets with different local batches need PredictOptions::reference_batch (the batch the graph is costed at)"
                    .into(),
            ));
        }
        popts.reference_batch = Some(first);
    }
    let mut phases: Vec<(String, f64)> = Vec::new();
    let clock = std::cell::Cell::new(std::time::Instant::now());
    let lap = |name: &str, phases: &mut Vec<(String, f64)>| {
        phases.push((name.to_string(), clock.get().elapsed().as_secs_f64()));
        clock.set(std::time::Instant::now());
    };
    let cands = candidates(g, facts);
    let gemm: HashMap<NodeId, bool> =
        cands.iter().map(|&n| (n, facts.node(n).is_ok_and(|f| f.kind.is_gemm_like()))).collect();
    // The training type, when the cluster is hybrid: the type that runs
    // this model fastest at FP32 (its predicted compute time at the same
    // local batch) — not the highest FP32 peak, which ranks an L4 (30 TFLOPS
    // on CUDA cores, 300 GB/s) above an A100 (19.5 TFLOPS, 1.5 TB/s).
    let analysis = std::sync::Arc::new(qsync_sim::GraphAnalysis::new(g, &popts)?);
    let training = if targets.len() > 1 {
        let mut fp32 = targets.clone();
        for t in &mut fp32 {
            t.plan = Plan::new();
        }
        let r = Predictor::with_analysis(g, analysis.clone(), fp32, popts.clone())?.result().clone();
        (0..targets.len()).min_by(|&a, &b| {
            let per_sample = |t: usize| r.devices[t].compute_us / f64::from(targets[t].local_batch.max(1));
            per_sample(a).total_cmp(&per_sample(b)).then(a.cmp(&b))
        })
    } else {
        // A single device type is a training cluster.
        Some(0)
    };
    let mut levels = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        if Some(i) == training {
            levels.push(None);
            continue;
        }
        let mut l: Vec<Precision> = Vec::new();
        for &p in std::iter::once(&Precision::Fp32).chain(opts.precisions.iter()) {
            if t.device.supports(p) && !l.iter().any(|q| q.bits() == p.bits()) {
                l.push(p);
            }
        }
        l.sort_by_key(|p| std::cmp::Reverse(p.bits()));
        levels.push(Some(l));
    }
    let cx = Ctx {
        g,
        facts,
        targets,
        popts,
        ind,
        candidates: cands,
        gemm,
        levels,
        train: opts.train_precision,
        opset: opts.opset,
        analysis,
        batch_bounds: match opts.fixed_local_batch {
            Some(b) => (b.max(1), b.max(1)),
            None => (opts.min_local_batch.max(1), u32::MAX),
        },
        shard_collectives: opts.shard_collectives.clone(),
        shard_error_budget: opts.shard_error_budget,
    };
    let n_types = cx.targets.len();
    let base: Vec<Plan> = (0..n_types)
        .map(|t| if cx.levels[t].is_none() { cx.training_plan(t) } else { Ok(cx.uniform(t, Precision::Fp32)) })
        .collect::<Result<_, _>>()?;

    // UP: every inference type at one uniform level; of the levels that fit,
    // the fastest (normally the lowest precision: QSync's T_min).
    progress("uniform precision (UP)");
    let mut level_sets: Vec<Precision> = cx.levels.iter().flatten().flatten().copied().collect();
    level_sets.sort_by_key(|p| std::cmp::Reverse(p.bits()));
    level_sets.dedup_by_key(|p| p.bits());
    // A cluster of training types only (one device type) has one uniform
    // plan: every type at its training precision.
    if level_sets.is_empty() {
        level_sets.push(Precision::Fp32);
    }
    let mut best: Option<(f64, Vec<Plan>)> = None;
    // Levels run widest first: the last one that fits is the lowest.
    let mut lowest_fitting: Option<f64> = None;
    let mut lowest_plans: Option<Vec<Plan>> = None;
    let mut lowest_failure = String::new();
    let level_results = crate::par::map(&level_sets, |&p| -> Result<(Vec<Plan>, SimResult), PlanError> {
        let plans: Vec<Plan> =
            (0..n_types).map(|t| if cx.levels[t].is_none() { base[t].clone() } else { cx.uniform(t, p) }).collect();
        let r = cx.predictor(&plans)?.result().clone();
        Ok((plans, r))
    });
    for (&p, level) in level_sets.iter().zip(level_results) {
        let (plans, r) = level?;
        if r.devices.iter().all(|d| d.fits) {
            lowest_fitting = Some(r.samples_per_s);
            lowest_plans = Some(plans.clone());
            if best.as_ref().is_none_or(|(b, _)| r.samples_per_s > *b) {
                best = Some((r.samples_per_s, plans));
            }
        } else {
            lowest_failure = r
                .devices
                .iter()
                .filter(|d| !d.fits)
                .map(|d| {
                    format!(
                        "{} needs {:.2} GiB at {p}, {:.2} GiB available",
                        d.name,
                        d.peak_memory_bytes as f64 / (1u64 << 30) as f64,
                        d.memory_capacity_bytes.unwrap_or(0) as f64 / (1u64 << 30) as f64
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
        }
    }
    let Some((_, up_plans)) = best else {
        if opts.method == Method::Up {
            return Err(PlanError::Infeasible(format!(
                "UP does not fit: every uniform level runs out of memory, even the lowest allowed precision \
                 ({lowest_failure})"
            )));
        }
        // DDP holds the whole model on every device: sharding may still fit.
        progress("sharded training (FSDP, ZeRO++)");
        let s = cx.sharded()?;
        let ddp = format!("even at the lowest allowed precision {lowest_failure}");
        let Some((key, chosen)) = sharded_choice(&s, None) else {
            return Err(PlanError::Infeasible(crate::shard::does_not_fit(&s, &ddp)));
        };
        lap("sharded training (FSDP, ZeRO++)", &mut phases);
        // The DDP methods, as predicted (none fits).
        let plans: Vec<Plan> = (0..n_types).map(|t| cx.dbs_plan(t)).collect();
        let mut pred = cx.predictor(&plans)?;
        let up = cx.eval("up", &mut pred);
        let dbs = DbsEval::none_fits(&cx);
        return Ok(Outcome {
            t_min: 0.0,
            t_min_rule: opts.t_min,
            qsync_t_min: 0.0,
            greedy: Eval { method: "qsync-greedy".into(), ..up.clone() },
            ours: Eval { method: "qsync".into(), ..up.clone() },
            up,
            up_lowest: None,
            dbs,
            joint: None,
            joint_fastest: None,
            indicator_bound: opts.indicator_bound.unwrap_or(0.0),
            chosen: key.to_string(),
            chosen_eval: chosen,
            qsync_fallback: false,
            method: opts.method,
            objective: opts.objective,
            gap: None,
            candidates: cx.candidates.len(),
            classes: classes(g, &cx.candidates).len(),
            steps_tried: 0,
            steps_kept: 0,
            joint_combinations: 0,
            joint_verified: 0,
            alone: Vec::new(),
            phases,
            sharded: Some(s),
        });
    };
    let mut up_pred = cx.predictor(&up_plans)?;
    let up = cx.eval("up", &mut up_pred);
    let up_lowest = match lowest_plans.filter(|p| *p != up_plans) {
        Some(p) => Some(cx.eval("up-lowest", &mut cx.predictor(&p)?)),
        None => None,
    };
    lap("uniform precision (UP)", &mut phases);

    progress("dynamic batch sizing (DBS)");
    let dbs = dbs(&cx)?;
    lap("dynamic batch sizing (DBS)", &mut phases);
    let dbs_sps = dbs.eval.as_ref().map_or(0.0, |e| e.samples_per_s);
    let lowest = lowest_fitting.unwrap_or(up.samples_per_s).min(up.samples_per_s);
    let qsync_t_min = match opts.t_min {
        TMin::Lowest => lowest,
        TMin::Best | TMin::Fastest => up.samples_per_s,
    };
    let t_min = match opts.t_min {
        TMin::Best => up.samples_per_s.max(dbs_sps),
        TMin::Fastest => up.samples_per_s,
        TMin::Lowest => lowest,
    };

    progress("fastest start (class knapsack)");
    let cls = classes(g, &cx.candidates);
    let mut fastest: Vec<Option<Plan>> = vec![None; n_types];
    let mut start = up_plans.clone();
    for t in 0..n_types {
        if cx.levels[t].is_none() {
            continue;
        }
        if let Some(p) = fastest_start(&cx, t, &cls, &start, opts)? {
            fastest[t] = Some(p.clone());
            start[t] = p;
        }
    }
    lap("fastest start (class knapsack)", &mut phases);

    // QSync's two recoveries (from UP, and from the fastest start) and the
    // joint search read the results so far and nothing of each other: they
    // run side by side, each phase timed on its own thread.
    progress("QSync greedy recovery, indicator recovery (max-heap), joint batch split and precision");
    let bound = opts.indicator_bound.unwrap_or(up.indicator_sum);
    type Recovered = (Eval, Eval, bool, (usize, usize), [(String, f64); 2]);
    let qsync_side = |cx: &Ctx<'_>| -> Result<Recovered, PlanError> {
        let clock = std::time::Instant::now();
        // Greedy: recovery from UP.
        let mut gp = cx.predictor(&up_plans)?;
        cx.recover(&mut gp, qsync_t_min)?;
        let greedy = cx.eval("qsync-greedy", &mut gp);
        let greedy_s = clock.elapsed().as_secs_f64();
        // QSync's method: fastest start under memory, then recovery.
        let clock = std::time::Instant::now();
        let mut start = start.clone();
        let mut sp = cx.predictor(&start)?;
        let sr = sp.result().clone();
        if !(sr.devices.iter().all(|d| d.fits) && sr.samples_per_s >= qsync_t_min) {
            start = up_plans.clone();
            sp = cx.predictor(&start)?;
        }
        let steps = cx.recover(&mut sp, qsync_t_min)?;
        let mut ours = cx.eval("qsync", &mut sp);
        let dominates = ours.samples_per_s >= greedy.samples_per_s * (1.0 - 1e-12)
            && ours.indicator_sum <= greedy.indicator_sum * (1.0 + 1e-12);
        if !dominates {
            ours = Eval { method: "qsync".into(), ..greedy.clone() };
        }
        let timed = [
            ("QSync greedy recovery".to_string(), greedy_s),
            ("indicator recovery (max-heap)".to_string(), clock.elapsed().as_secs_f64()),
        ];
        Ok((greedy, ours, dominates, steps, timed))
    };
    let joint_side = |cx: &Ctx<'_>, up_pred: &mut Predictor<'_>| {
        let clock = std::time::Instant::now();
        let found = crate::joint::search(cx, &up_plans, &fastest, &level_sets, t_min, bound, opts, up_pred);
        (found, clock.elapsed().as_secs_f64())
    };
    let (qsync_out, (joint, joint_s)) = if cx.targets.len() > 1 {
        std::thread::scope(|scope| {
            let worker = scope.spawn(|| qsync_side(&cx));
            let j = joint_side(&cx, &mut up_pred);
            let q = worker.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            (q, j)
        })
    } else {
        let q = qsync_side(&cx);
        (q, joint_side(&cx, &mut up_pred))
    };
    let (greedy, ours, dominates, (tried, kept), timed) = qsync_out?;
    let joint = joint?;
    phases.extend(timed);
    phases.push(("joint batch split and precision".to_string(), joint_s));
    clock.set(std::time::Instant::now());

    // Each type alone, for "is adding these GPUs worth it".
    let alone = if n_types > 1 {
        let types: Vec<usize> = (0..n_types).collect();
        crate::par::map(&types, |&t| cx.alone(t).map(|e| (cx.targets[t].device.name.clone(), e)))
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    lap("each device type alone", &mut phases);

    // `--method up` writes QSync's UP: the lowest uniform level that fits.
    let (mut chosen, mut chosen_eval) = match (opts.method, &up_lowest) {
        (Method::Up, Some(l)) => ("up-lowest".to_string(), l.clone()),
        (Method::Up, None) => ("up".to_string(), up.clone()),
        _ => choose(opts, &up, &dbs, &greedy, &ours, &joint, t_min, bound, dominates),
    };
    let gap = optimality_gap(&cx, &cls, &up_plans, qsync_t_min, ours.indicator_sum, opts)?;
    lap("optimality gap", &mut phases);
    // The FSDP baselines join UP and DBS under the floor: where one beats
    // every DDP plan, the plan is sharded. Otherwise sharding replaces the
    // DDP plan only where it is predicted faster at no larger indicator sum
    // (QSync's own method stays as published).
    progress("sharded training (FSDP, ZeRO++)");
    let sharded = cx.sharded()?;
    let fsdp_floor =
        [&sharded.fsdp, &sharded.fsdp_dbs].into_iter().flatten().map(|e| e.eval.samples_per_s).fold(0.0, f64::max);
    let mut t_min = t_min;
    if opts.method == Method::Joint {
        if opts.t_min == TMin::Best {
            t_min = t_min.max(fsdp_floor);
        }
        let below = chosen_eval.samples_per_s < fsdp_floor * (1.0 - 1e-9);
        // Above the floor the sharded plan must be faster than the DDP plan
        // chosen, at no larger indicator sum than the objective allows: the
        // DDP plan's own under `indicator`, the bound under `throughput`.
        let ceiling = match opts.objective {
            Objective::Indicator => chosen_eval.indicator_sum,
            Objective::Throughput => bound.max(chosen_eval.indicator_sum),
        };
        let replace = if below {
            sharded_choice(&sharded, None)
        } else {
            sharded_choice(&sharded, Some((&chosen_eval, ceiling)))
        };
        if let Some((k, e)) = replace {
            chosen = k.to_string();
            chosen_eval = e;
        }
    }
    lap("sharded training (FSDP, ZeRO++)", &mut phases);
    Ok(Outcome {
        t_min: match opts.method {
            Method::Qsync => qsync_t_min,
            Method::Up => up_lowest.as_ref().unwrap_or(&up).samples_per_s,
            Method::Joint => t_min,
        },
        t_min_rule: opts.t_min,
        qsync_t_min,
        up,
        up_lowest: up_lowest.clone(),
        greedy,
        ours,
        dbs,
        joint: joint.at_floor,
        joint_fastest: joint.fastest,
        indicator_bound: bound,
        chosen,
        chosen_eval,
        qsync_fallback: !dominates,
        method: opts.method,
        objective: opts.objective,
        gap,
        candidates: cx.candidates.len(),
        classes: cls.len(),
        steps_tried: tried,
        steps_kept: kept,
        joint_combinations: joint.combinations,
        joint_verified: joint.verified,
        alone,
        phases,
        sharded: Some(sharded),
    })
}

/// The sharded plan to choose: the fastest fitting sharded method
/// (baselines first on ties) — against `ddp`, only if faster at no larger
/// indicator sum.
fn sharded_choice(s: &crate::shard::ShardOutcome, ddp: Option<(&Eval, f64)>) -> Option<(&'static str, Eval)> {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    let mut best: Option<(&'static str, &Eval)> = None;
    for (k, e) in s.methods() {
        let e = &e.eval;
        if best.is_none_or(|(_, b)| e.samples_per_s > b.samples_per_s && !close(e.samples_per_s, b.samples_per_s)) {
            best = Some((k, e));
        }
    }
    let (k, e) = best?;
    if let Some((d, ceiling)) = ddp {
        let faster = e.samples_per_s > d.samples_per_s && !close(e.samples_per_s, d.samples_per_s);
        let no_worse = e.indicator_sum <= ceiling * (1.0 + 1e-9) + f64::MIN_POSITIVE;
        if !(faster && no_worse) {
            return None;
        }
    }
    Some((k, Eval { method: k.to_string(), ..e.clone() }))
}

/// The chosen plan: QSync's method as published, or the best of every
/// method under the objective —
/// `Indicator`: the smallest indicator sum at or above the floor (ties: the
/// faster); `Throughput`: the fastest within the indicator bound (ties: the
/// smaller indicator).
#[allow(clippy::too_many_arguments)]
fn choose(
    opts: &AllocOptions,
    up: &Eval,
    dbs: &DbsEval,
    greedy: &Eval,
    ours: &Eval,
    joint: &crate::joint::Found,
    t_min: f64,
    bound: f64,
    dominates: bool,
) -> (String, Eval) {
    if opts.method == Method::Qsync {
        return if dominates { ("qsync".into(), ours.clone()) } else { ("qsync-greedy".into(), greedy.clone()) };
    }
    // Baselines first: a joint plan that only ties a baseline is reported
    // as that baseline, so the plan never claims what a simpler one does.
    let mut pool: Vec<(&str, &Eval)> = vec![("up", up)];
    if let Some(d) = &dbs.eval {
        pool.push(("dbs", d));
    }
    pool.push(("qsync-greedy", greedy));
    pool.push(("qsync", ours));
    if let Some(j) = &joint.fastest {
        pool.push(("joint-fastest", j));
    }
    if let Some(j) = &joint.at_floor {
        pool.push(("joint", j));
    }
    let fits = |e: &Eval| e.types.iter().all(|t| t.fits);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    let mut best: Option<(&str, &Eval)> = None;
    for &(k, e) in &pool {
        let ok = fits(e)
            && match opts.objective {
                Objective::Indicator => e.samples_per_s >= t_min * (1.0 - 1e-9),
                Objective::Throughput => e.indicator_sum <= bound * (1.0 + 1e-9) + f64::MIN_POSITIVE,
            };
        if !ok {
            continue;
        }
        let better = best.is_none_or(|(_, b)| match opts.objective {
            Objective::Indicator => {
                e.indicator_sum < b.indicator_sum && !close(e.indicator_sum, b.indicator_sum)
                    || close(e.indicator_sum, b.indicator_sum)
                        && e.samples_per_s > b.samples_per_s
                        && !close(e.samples_per_s, b.samples_per_s)
            }
            Objective::Throughput => {
                e.samples_per_s > b.samples_per_s && !close(e.samples_per_s, b.samples_per_s)
                    || close(e.samples_per_s, b.samples_per_s)
                        && e.indicator_sum < b.indicator_sum
                        && !close(e.indicator_sum, b.indicator_sum)
            }
        });
        if better {
            best = Some((k, e));
        }
    }
    // UP fits (the planner stops earlier otherwise), so the pool is never
    // empty of a fitting plan under Throughput with UP's own bound; the
    // floor is met by UP or DBS, whichever set it.
    let (k, e) = best.unwrap_or(("up", up));
    (k.to_string(), Eval { method: k.to_string(), ..e.clone() })
}

/// The fastest class-uniform plan of type `t` under its memory cap.
fn fastest_start(
    cx: &Ctx<'_>,
    t: usize,
    cls: &[Vec<NodeId>],
    current: &[Plan],
    opts: &AllocOptions,
) -> Result<Option<Plan>, PlanError> {
    let Some(levels) = cx.levels[t].clone() else { return Ok(None) };
    let model = CostModel::new(&cx.targets[t].device, cx.targets[t].calibration.as_ref())?;
    // Per class and level: (time, memory) of its members.
    let mut items: Vec<Vec<(Precision, f64, f64)>> = Vec::new();
    for c in cls {
        let mut opts_c = Vec::new();
        for &p in &levels {
            let (mut time, mut mem) = (0.0, 0.0);
            for &n in c {
                let q = cx.at_level(t, n, p);
                time += model.op_cost(cx.facts, n, q)?.total();
                mem += node_memory(cx.facts, n, q);
            }
            if !opts_c.iter().any(|&(_, tt, mm)| tt == time && mm == mem) {
                opts_c.push((p, time, mem));
            }
        }
        items.push(opts_c);
    }
    // Memory the candidates do not control, from the FP32 plan.
    let mut fp32 = current.to_vec();
    fp32[t] = cx.uniform(t, Precision::Fp32);
    let mut pred = cx.predictor(&fp32)?;
    let total_fp32 = pred.memory(t).map_or(0.0, |m| m.total);
    let capacity = pred.memory(t).map_or(0.0, |m| m.capacity);
    let _ = pred.result();
    let cand_fp32: f64 = items.iter().map(|o| o[0].2).sum();
    let fixed = total_fp32 - cand_fp32;
    let mut budget = capacity - fixed;
    for _ in 0..6 {
        let Some(choice) = knapsack(&items, budget, opts.exhaustive_limit) else { return Ok(None) };
        let mut plan = Plan::new();
        for (c, &k) in cls.iter().zip(&choice) {
            for &n in c {
                plan.set(n, cx.at_level(t, n, items_p(&items, c, cls, k)));
            }
        }
        let mut plans = current.to_vec();
        plans[t] = plan.clone();
        let mut pred = cx.predictor(&plans)?;
        let m = pred.memory(t).copied().unwrap_or_default();
        if pred.result().devices[t].fits {
            return Ok(Some(plan));
        }
        budget -= (m.total - m.capacity).max(0.0) * 1.1 + 1.0;
    }
    Ok(None)
}

fn items_p(items: &[Vec<(Precision, f64, f64)>], c: &[NodeId], cls: &[Vec<NodeId>], k: usize) -> Precision {
    let i = cls.iter().position(|x| x.as_slice() == c).unwrap_or(0);
    items[i][k].0
}

/// Multiple-choice knapsack: one option per class, minimise time with
/// memory ≤ budget. Exhaustive when the combinations are few, else DP over
/// memory discretised into 1024 steps (rounded up, so the DP never overshoots
/// its own estimate).
fn knapsack(items: &[Vec<(Precision, f64, f64)>], budget: f64, exhaustive_limit: u64) -> Option<Vec<usize>> {
    if budget < 0.0 {
        return None;
    }
    let combos = items.iter().try_fold(1u64, |a, o| a.checked_mul(o.len() as u64)).unwrap_or(u64::MAX);
    if combos <= exhaustive_limit {
        let mut best: Option<(f64, Vec<usize>)> = None;
        let mut idx = vec![0usize; items.len()];
        for _ in 0..combos {
            let (time, mem): (f64, f64) =
                idx.iter().zip(items).fold((0.0, 0.0), |(a, b), (&k, o)| (a + o[k].1, b + o[k].2));
            if mem <= budget && best.as_ref().is_none_or(|(bt, _)| time < *bt) {
                best = Some((time, idx.clone()));
            }
            for (i, o) in idx.iter_mut().zip(items) {
                *i += 1;
                if *i < o.len() {
                    break;
                }
                *i = 0;
            }
        }
        return best.map(|(_, c)| c);
    }
    const STEPS: usize = 1024;
    let unit = (budget / STEPS as f64).max(1.0);
    let cells = (budget / unit).floor() as usize;
    let inf = f64::INFINITY;
    let mut dp = vec![0.0f64; cells + 1];
    let mut choice: Vec<Vec<u8>> = Vec::with_capacity(items.len());
    for o in items {
        let mut next = vec![inf; cells + 1];
        let mut ch = vec![u8::MAX; cells + 1];
        for (k, &(_, time, mem)) in o.iter().enumerate() {
            let w = (mem / unit).ceil() as usize;
            for m in w..=cells {
                let v = dp[m - w] + time;
                if v < next[m] {
                    next[m] = v;
                    ch[m] = k as u8;
                }
            }
        }
        dp = next;
        choice.push(ch);
    }
    if !dp[cells].is_finite() {
        return None;
    }
    // Walk back.
    let mut m = cells;
    let mut out = vec![0usize; items.len()];
    for i in (0..items.len()).rev() {
        let k = choice[i][m];
        if k == u8::MAX {
            return None;
        }
        out[i] = k as usize;
        m -= (items[i][k as usize].2 / unit).ceil() as usize;
    }
    Some(out)
}

/// DBS: every type trains at the training precision ([`Ctx::dbs_plan`]),
/// the global batch split so that the slowest type finishes first
/// ([`crate::joint::split`] on those plans' lines), verified by a full
/// prediction at that split.
fn dbs(cx: &Ctx<'_>) -> Result<DbsEval, PlanError> {
    let plans: Vec<Plan> = (0..cx.targets.len()).map(|t| cx.dbs_plan(t)).collect();
    let lines = cx.lines(&plans)?;
    let Some((batches, _)) = crate::joint::split(&lines, cx.global_batch()) else {
        return Ok(DbsEval::none_fits(cx));
    };
    let mut pred = cx.predictor_at(&plans, &batches)?;
    let e = cx.eval("dbs", &mut pred);
    Ok(DbsEval {
        iteration_ms: e.iteration_ms,
        samples_per_s: e.samples_per_s,
        indicator_sum: e.indicator_sum,
        batch_split: e.types.iter().map(|t| (t.name.clone(), t.local_batch)).collect(),
        fits: e.types.iter().map(|t| (t.name.clone(), t.fits)).collect(),
        eval: if e.types.iter().all(|t| t.fits) { Some(e) } else { None },
    })
}

/// Exhaustive search over class-uniform plans of the one inference type,
/// when the combinations are few: the best indicator sum under the
/// constraints, against ours.
fn optimality_gap(
    cx: &Ctx<'_>,
    cls: &[Vec<NodeId>],
    up: &[Plan],
    t_min: f64,
    ours: f64,
    opts: &AllocOptions,
) -> Result<Option<Gap>, PlanError> {
    let inf: Vec<usize> = (0..cx.targets.len()).filter(|&t| cx.levels[t].is_some()).collect();
    let [t] = inf.as_slice() else { return Ok(None) };
    let t = *t;
    let levels = cx.levels[t].clone().unwrap_or_default();
    let combos = (levels.len() as u64).checked_pow(cls.len() as u32).unwrap_or(u64::MAX);
    if combos > opts.gap_limit {
        return Ok(None);
    }
    let mut pred = cx.predictor(up)?;
    let mut best = f64::INFINITY;
    let mut idx = vec![0usize; cls.len()];
    for _ in 0..combos {
        let mut plan = Plan::new();
        for (c, &k) in cls.iter().zip(&idx) {
            for &n in c {
                let p = cx.at_level(t, n, levels[k]);
                plan.set(n, p);
                pred.set_precision(t, n, p)?;
            }
        }
        let r = pred.result();
        if r.devices.iter().all(|d| d.fits) && r.samples_per_s >= t_min * (1.0 - 1e-9) {
            best = best.min(cx.indicator_of(&plan));
        }
        for i in idx.iter_mut() {
            *i += 1;
            if *i < levels.len() {
                break;
            }
            *i = 0;
        }
    }
    if !best.is_finite() {
        return Ok(None);
    }
    let rel = if best > 0.0 {
        (ours - best) / best
    } else if ours > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    Ok(Some(Gap { combinations: combos, optimal_indicator_sum: best, ours_indicator_sum: ours, relative_gap: rel }))
}
