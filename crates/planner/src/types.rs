//! What the planner takes and gives: its options, its errors, and the
//! evaluations every method reports. The allocator, the joint search and the
//! sharded search all read these; this module reads none of them.

use std::collections::BTreeMap;

use qsync_cost::{Plan, Precision};
use qsync_sim::PredictError;
use serde::Serialize;

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
    pub(crate) fn choices(self) -> &'static [Precision] {
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
    /// uniform level that fits ([`crate::Outcome::up_lowest`], `up-lowest` of
    /// [`crate::Outcome::methods`], or `up` when that is the same plan), written as
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

/// Optimality gap against an exhaustive search over class-uniform plans.
#[derive(Clone, Debug, Serialize)]
pub struct Gap {
    pub combinations: u64,
    pub optimal_indicator_sum: f64,
    pub ours_indicator_sum: f64,
    /// (ours − optimal) / optimal; 0 when the optimum is 0 and ours too.
    pub relative_gap: f64,
}
