//! Calibration profiles: measured costs that override the analytic model.
//!
//! A profile is JSON. Times are in microseconds; shapes are the concrete
//! shapes of the node's inputs in slot order (`null` for an omitted optional
//! input), exactly as [`NodeFacts::profile_key`](crate::NodeFacts) builds them:
//!
//! ```json
//! {
//!   "device": "t4",
//!   "ops": [
//!     { "op": "Gemm", "inputs": [[128, 768], [3072, 768], [3072]], "precision": "fp16",
//!       "fwd_us": 41.5, "bwd_input_us": 39.0, "bwd_weight_us": 40.2 }
//!   ],
//!   "casts": [
//!     { "from": "fp32", "to": "fp16", "samples": [[1048576, 21.0], [4194304, 74.5]] }
//!   ]
//! }
//! ```
//!
//! `bwd_input_us` / `bwd_weight_us` may be left out (the analytic value is
//! used). An op may carry its batch curve: `batch` (the batch its `inputs`
//! are at) and `batch_points`, the same op timed at other batches (each
//! point's `inputs`, when given, make it an exact-key entry of its own):
//!
//! ```json
//! { "op": "Gemm", "inputs": [[1024, 768], [768, 768], [768]], "precision": "fp32", "fwd_us": 900.0,
//!   "batch": 8, "batch_points": [
//!     { "batch": 1, "inputs": [[128, 768], [768, 768], [768]], "fwd_us": 140.0 },
//!     { "batch": 32, "fwd_us": 3400.0, "bwd_input_us": 3500.0 } ] }
//! ```
//!
//! A node costed at another batch than its graph's (a device type given its
//! own local batch, a graph that fixes its batch) reads the curve at that
//! batch ([`BatchCurve`]) instead of scaling the measurement linearly. Cast samples are `[elements, microseconds]`; a `to` of `int8` is
//! QSync's whole quantization (min/max, scale, quantize), a `from` of `int8`
//! its dequantization. Each (from, to) needs at least two distinct sizes.
//!
//! Three optional sections carry what a measured profile learned beyond
//! single ops, so that it also improves the prediction of models whose exact
//! shapes it never saw (`qsyncc profile build` writes them, see
//! [`crate::calibrate`]):
//!
//! ```json
//! {
//!   "meta": { "gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "torch": "2.11.0", "date": "…" },
//!   "efficiency": { "tensor_core": { "fp16": 0.71, "bf16": 0.70 }, "cuda_core": { "fp32": 0.83 }, "memory": 0.86,
//!                   "kinds": { "dropout": 3.5 } },
//!   "optimizers": [ { "optimizer": "adam", "tensors": [[1024, 40.0], [65536, 95.0], [4194304, 19000.0]] } ]
//! }
//! ```
//!
//! `efficiency` replaces the device file's fractions of peak (per precision
//! for the compute rates; a precision left out keeps the device's). Unlike
//! the device file's they may exceed 1: a fitted "fraction of peak" absorbs
//! what the roofline does not model (Winograd convolutions doing fewer
//! multiplications than counted, activations served from a large L2 rather
//! than DRAM), and is bounded by 4 only to reject nonsense. `kinds` then
//! scales, per kind of operator, the forward roofline time of the ops the
//! profile did not measure by how much longer that kind's measured
//! forwards ran than their fitted roofline (a random number per element of
//! dropout is work the roofline's FLOPs and bytes do not count; only such
//! kinds get a factor from `qsyncc profile build`). `optimizers`
//! time one optimizer step (`sgd`, `momentum`, `adam`). Their `tensors` are
//! `[elements, microseconds per tensor]`: the step over a group of equal
//! tensors of that size, divided by the group's count. A model's step is the
//! sum over its parameter tensors of that curve ([`SizeCurve`]): what a step
//! costs depends on the tensor sizes, not only their total (a loop over
//! tensors pays a fixed host cost per tensor, and a tensor whose parameters,
//! gradients and state stay in cache is swept faster than one that streams
//! from DRAM). Older profiles carry `samples`, `[parameters, microseconds]`
//! of a step over the total, fitted like casts; they are used only when an
//! optimizer has no `tensors`. `meta` is free text: the GPU,
//! driver and framework versions and the date of the measurement.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cast::{fit_linear, LinearFit, LinearModel};
use crate::facts::Kind;
use crate::{CostError, Precision, Result};

/// One measured operator.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpSample {
    pub op: String,
    pub inputs: Vec<Option<Vec<i64>>>,
    pub precision: Precision,
    pub fwd_us: f64,
    #[serde(default)]
    pub bwd_input_us: Option<f64>,
    #[serde(default)]
    pub bwd_weight_us: Option<f64>,
    /// On a GPU, what issuing each phase cost the host ([`HostTimes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_us: Option<HostTimes>,
    /// The batch `inputs` are at (required with `batch_points`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<i64>,
    /// The same operator measured at other batches: with the entry's own
    /// time at `batch`, its batch curve ([`BatchCurve`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch_points: Vec<BatchPoint>,
}

/// The host's time per call of an operator's measured phases on a GPU, in
/// microseconds, as `scripts/gpu/profile.py` timed it around the same
/// back-to-back calls (wall clock before the GPU is waited for). A phase
/// the GPU finishes sooner than the host issues it runs at the host's pace
/// in a training step; the backward phases include the harness's own
/// `torch.autograd.grad` call (the profile's `harness_floor_*_host_us`).
#[derive(Copy, Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostTimes {
    pub fwd_us: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_input_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_weight_us: Option<f64>,
    /// Both gradients asked for in one call (what a training backward does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_both_us: Option<f64>,
    /// Per phase (forward, input gradient, weight gradient): the measured
    /// device time was the host's pace (an upper bound on the kernels); a
    /// profile that prices the host prices those kernels at the fitted
    /// rates, capped by it.
    #[serde(default, skip_serializing_if = "is_none_bound")]
    pub host_bound: [bool; 3],
}

fn is_none_bound(b: &[bool; 3]) -> bool {
    !b.iter().any(|&x| x)
}

impl HostTimes {
    /// The host times a measurement carries (`None` without a forward one).
    pub fn of(t: &crate::calibrate::Times) -> Option<HostTimes> {
        Some(HostTimes {
            fwd_us: t.fwd_host_us?,
            bwd_input_us: t.bwd_input_host_us,
            bwd_weight_us: t.bwd_weight_host_us,
            bwd_both_us: t.bwd_both_host_us,
            host_bound: t.host_bound,
        })
    }
}

/// An operator's times at another batch.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchPoint {
    pub batch: i64,
    /// The input shapes at this batch: when given, the point is also an
    /// exact-key measurement of those shapes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<Option<Vec<i64>>>>,
    pub fwd_us: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_input_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_weight_us: Option<f64>,
}

/// An operator's measured time as a function of its batch, per phase, in
/// seconds: piecewise linear between the measured batches, the first
/// point's time below the first batch (the work no longer fills the device:
/// flat, as below one wave), and beyond the last batch the line through the
/// last two points (never below 0). A phase is read from the points that
/// measured it; with fewer than two such points it is `None` (the caller
/// keeps its own value).
#[derive(Clone, PartialEq, Debug, Default)]
pub struct BatchCurve {
    /// `(batch, fwd, bwd_input, bwd_weight)`, sorted by batch, batches distinct.
    pub points: Vec<(f64, f64, Option<f64>, Option<f64>)>,
}

impl BatchCurve {
    /// Forward, input-gradient and weight-gradient seconds at `batch`.
    pub fn at(&self, batch: f64) -> (f64, Option<f64>, Option<f64>) {
        let fwd: Vec<(f64, f64)> = self.points.iter().map(|p| (p.0, p.1)).collect();
        let bi: Vec<(f64, f64)> = self.points.iter().filter_map(|p| p.2.map(|t| (p.0, t))).collect();
        let bw: Vec<(f64, f64)> = self.points.iter().filter_map(|p| p.3.map(|t| (p.0, t))).collect();
        (piecewise(&fwd, batch).unwrap_or(0.0), piecewise(&bi, batch), piecewise(&bw, batch))
    }
}

/// Piecewise-linear reading of `(x, y)` points sorted by `x` (see
/// [`BatchCurve`]); `None` with fewer than two points.
fn piecewise(pts: &[(f64, f64)], x: f64) -> Option<f64> {
    if pts.len() < 2 {
        return None;
    }
    if x <= pts[0].0 {
        return Some(pts[0].1);
    }
    let i = pts.iter().position(|p| p.0 >= x).unwrap_or(pts.len() - 1).max(1);
    let ((x0, y0), (x1, y1)) = (pts[i - 1], pts[i]);
    Some((y0 + (y1 - y0) * (x - x0) / (x1 - x0)).max(0.0))
}

impl OpSample {
    /// The lookup key, matching `NodeFacts::profile_key`.
    pub fn key(&self) -> String {
        let shapes: Vec<String> = self
            .inputs
            .iter()
            .map(|s| match s {
                Some(s) => s.iter().map(i64::to_string).collect::<Vec<_>>().join("x"),
                None => "_".into(),
            })
            .collect();
        format!("{}|{}", self.op, shapes.join(","))
    }
}

/// Timing samples of one cast pair.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CastSamples {
    pub from: Precision,
    pub to: Precision,
    /// `[elements, microseconds]`.
    pub samples: Vec<(f64, f64)>,
}

/// Timing samples of one optimizer's step.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSamples {
    /// `sgd`, `momentum` or `adam`.
    pub optimizer: String,
    /// `[parameters, microseconds]` of a step over that many parameters in all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<(f64, f64)>,
    /// `[elements, microseconds per tensor]` (see the module doc).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<(f64, f64)>,
    /// On a GPU, `[elements, microseconds per tensor]` the host spent issuing
    /// the same steps (a multi-tensor step's launches and Python, per tensor).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_tensors: Vec<(f64, f64)>,
}

/// An optimizer's step time per parameter tensor as a function of the
/// tensor's elements, in seconds: linear between the measured sizes, the
/// smallest size's time below it (what remains there is the fixed cost per
/// tensor), and beyond the largest the line through the last two points
/// (never below the last time). Samples of one size are averaged.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct SizeCurve {
    /// `(elements, seconds)`, sorted, sizes distinct.
    pub points: Vec<(f64, f64)>,
}

impl SizeCurve {
    /// A curve through `samples` (`(elements, seconds)`); `None` with fewer
    /// than two distinct sizes.
    pub fn new(samples: &[(f64, f64)]) -> Option<SizeCurve> {
        let mut sorted = samples.to_vec();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut points: Vec<(f64, f64, f64)> = Vec::new();
        for (x, y) in sorted {
            match points.last_mut() {
                Some(last) if last.0 == x => {
                    last.1 += y;
                    last.2 += 1.0;
                }
                _ => points.push((x, y, 1.0)),
            }
        }
        (points.len() >= 2).then(|| SizeCurve { points: points.into_iter().map(|(x, y, k)| (x, y / k)).collect() })
    }

    /// Seconds for one tensor of `elements`.
    pub fn at(&self, elements: f64) -> f64 {
        let p = &self.points;
        let line = |a: (f64, f64), b: (f64, f64)| a.1 + (b.1 - a.1) * (elements - a.0) / (b.0 - a.0);
        if elements <= p[0].0 {
            return p[0].1;
        }
        match p.windows(2).find(|w| elements <= w[1].0) {
            Some(w) => line(w[0], w[1]),
            None => {
                let (a, b) = (p[p.len() - 2], p[p.len() - 1]);
                line(a, b).max(b.1)
            }
        }
    }

    /// Seconds for one step over tensors of `elements` each.
    pub fn step(&self, elements: &[f64]) -> f64 {
        elements.iter().map(|&n| self.at(n)).sum()
    }
}

/// Fitted fractions of peak that replace the device file's.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileEfficiency {
    /// Conv/GEMM on Tensor Cores, per precision.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tensor_core: BTreeMap<Precision, f64>,
    /// Conv/GEMM and arithmetic on CUDA cores, per precision.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cuda_core: BTreeMap<Precision, f64>,
    /// DRAM bandwidth reached by memory-bound kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<f64>,
    /// Per kind of operator ([`Kind::name`]), how much longer than the
    /// fitted roofline its measured forward phases ran: the forward time
    /// beyond launches of an op the profile did not measure is the
    /// roofline's times this. The roofline prices work by FLOPs and bytes;
    /// `qsyncc profile build` fits a factor for the kinds whose work those
    /// leave out ([`Kind::has_uncounted_work`]: dropout's random numbers).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kinds: BTreeMap<String, f64>,
}

/// The largest and smallest per-kind factor a profile may carry.
pub const MAX_KIND_FACTOR: f64 = 16.0;
pub const MIN_KIND_FACTOR: f64 = 1.0 / 16.0;

/// The largest fitted efficiency a profile may carry (see the module doc).
pub const MAX_PROFILE_EFFICIENCY: f64 = 4.0;

/// A calibration profile for one device.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    #[serde(default)]
    pub device: Option<String>,
    /// Where and when it was measured (free text).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<ProfileEfficiency>,
    #[serde(default)]
    pub ops: Vec<OpSample>,
    #[serde(default)]
    pub casts: Vec<CastSamples>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub optimizers: Vec<OptimizerSamples>,
    /// On a GPU whose measurements carry host times: how to read them
    /// ([`HostModel`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostModel>,
}

/// How a profile's host times ([`HostTimes`]) become what issuing an op in
/// a training step costs the host.
///
/// Each measured call paid the harness's own Python call once: for a
/// backward phase a whole `torch.autograd.grad` (`harness_bwd_*_us`, its
/// one-element call), of which a training backward pays only the node's
/// share, taken to be a one-element forward's (`harness_fwd_us`). So an
/// op's backward costs the host its measured time less
/// `harness_bwd_* − harness_fwd` (`bwd_both_us` when measured, else the
/// two gradients' calls each so reduced), and its forward its measured
/// time. A training step then issues more than the op itself (module
/// calls, autocast, the autograd engine's bookkeeping): `overhead_fwd` and
/// `overhead_bwd` scale the ops' host times to the host's time per phase
/// in real training runs (`qsyncc profile build --iterations`; 1 without).
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostModel {
    pub harness_fwd_us: f64,
    pub harness_bwd_input_us: f64,
    pub harness_bwd_weight_us: f64,
    pub overhead_fwd: f64,
    pub overhead_bwd: f64,
    /// Where the overheads come from (the runs fitted, or why 1).
    pub overhead_source: String,
}

impl HostModel {
    /// An op's forward and backward host microseconds, as a training step
    /// would pay them before the overheads (see the type's doc).
    pub fn isolated_us(&self, h: &HostTimes) -> (f64, Option<f64>) {
        let call = |t: f64, harness: f64| (t - (harness - self.harness_fwd_us)).max(0.0);
        let bwd = match h.bwd_both_us {
            Some(both) => Some(call(both, self.harness_bwd_input_us)),
            None => match (h.bwd_input_us, h.bwd_weight_us) {
                (None, None) => None,
                (i, w) => Some(
                    i.map_or(0.0, |t| call(t, self.harness_bwd_input_us))
                        + w.map_or(0.0, |t| call(t, self.harness_bwd_weight_us)),
                ),
            },
        };
        (h.fwd_us, bwd)
    }
}

/// Measured seconds of one op at one precision.
#[derive(Copy, Clone, PartialEq, Debug)]
pub struct Measured {
    pub fwd: f64,
    pub bwd_input: Option<f64>,
    pub bwd_weight: Option<f64>,
    /// The batch these times were measured at (1 when the profile does not say).
    pub batch: f64,
    /// Index of the op's batch curve in [`Profile::op_table_with_curves`]'s
    /// curves, when it has one.
    pub curve: Option<usize>,
    /// What issuing the forward and the backward costs the host, seconds
    /// ([`HostModel::isolated_us`], before the overheads), when measured.
    pub host: Option<(f64, Option<f64>)>,
    /// Per phase: the time is the host's pace ([`HostTimes::host_bound`]).
    pub host_bound: [bool; 3],
}

/// A fitted cast model with its error.
#[derive(Copy, Clone, PartialEq, Debug, Serialize)]
pub struct CastFit {
    pub from: Precision,
    pub to: Precision,
    /// The fit in seconds (r: s/element, c: s).
    pub fit: LinearFit,
}

impl Profile {
    /// Parse and check a profile; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Profile> {
        let p: Profile =
            serde_json::from_str(text).map_err(|e| CostError::Profile { file: file.into(), message: e.to_string() })?;
        let bad = |m: String| CostError::Profile { file: file.into(), message: m };
        for (i, o) in p.ops.iter().enumerate() {
            for (what, v) in
                [("fwd_us", Some(o.fwd_us)), ("bwd_input_us", o.bwd_input_us), ("bwd_weight_us", o.bwd_weight_us)]
            {
                if let Some(v) = v {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(bad(format!("ops[{i}] ({}): {what} must be a non-negative number, got {v}", o.op)));
                    }
                }
            }
            if o.inputs.iter().flatten().flatten().any(|&d| d < 0) {
                return Err(bad(format!("ops[{i}] ({}): negative dimension", o.op)));
            }
            if o.batch.is_some_and(|b| b <= 0) {
                return Err(bad(format!("ops[{i}] ({}): batch must be positive", o.op)));
            }
            if !o.batch_points.is_empty() && o.batch.is_none() {
                return Err(bad(format!("ops[{i}] ({}): batch_points need the entry's `batch`", o.op)));
            }
            let mut seen = vec![o.batch.unwrap_or(0)];
            for (j, b) in o.batch_points.iter().enumerate() {
                let at = format!("ops[{i}] ({}): batch_points[{j}]", o.op);
                if b.batch <= 0 || seen.contains(&b.batch) {
                    return Err(bad(format!("{at}: batch {} is not positive or repeats one", b.batch)));
                }
                seen.push(b.batch);
                for (what, v) in
                    [("fwd_us", Some(b.fwd_us)), ("bwd_input_us", b.bwd_input_us), ("bwd_weight_us", b.bwd_weight_us)]
                {
                    if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
                        return Err(bad(format!("{at}: {what} must be a non-negative number")));
                    }
                }
                if b.inputs.as_ref().is_some_and(|ins| ins.len() != o.inputs.len()) {
                    return Err(bad(format!("{at}: inputs must list as many slots as the entry's")));
                }
            }
        }
        for (i, c) in p.casts.iter().enumerate() {
            if c.samples.iter().any(|&(x, y)| !(x.is_finite() && y.is_finite() && x >= 0.0 && y >= 0.0)) {
                return Err(bad(format!(
                    "casts[{i}] ({} -> {}): samples must be non-negative [elements, us] pairs",
                    c.from, c.to
                )));
            }
        }
        if let Some(e) = &p.efficiency {
            let rates = e.tensor_core.iter().map(|(k, v)| (format!("tensor_core.{k}"), *v));
            let rates = rates.chain(e.cuda_core.iter().map(|(k, v)| (format!("cuda_core.{k}"), *v)));
            for (what, v) in rates.chain(e.memory.map(|v| ("memory".to_string(), v))) {
                if !(v.is_finite() && v > 0.0 && v <= MAX_PROFILE_EFFICIENCY) {
                    return Err(bad(format!("efficiency.{what} must be in (0, {MAX_PROFILE_EFFICIENCY}], got {v}")));
                }
            }
            for (kind, &v) in &e.kinds {
                if Kind::from_name(kind).is_none() {
                    return Err(bad(format!("efficiency.kinds: unknown kind of operator `{kind}`")));
                }
                if !(v.is_finite() && (MIN_KIND_FACTOR..=MAX_KIND_FACTOR).contains(&v)) {
                    return Err(bad(format!(
                        "efficiency.kinds.{kind} must be in [{MIN_KIND_FACTOR}, {MAX_KIND_FACTOR}], got {v}"
                    )));
                }
            }
        }
        for (i, o) in p.optimizers.iter().enumerate() {
            if optimizer_key(&o.optimizer).is_none() {
                return Err(bad(format!("optimizers[{i}]: unknown optimizer `{}` (sgd, momentum, adam)", o.optimizer)));
            }
            if o.samples.iter().any(|&(x, y)| !(x.is_finite() && y.is_finite() && x >= 0.0 && y >= 0.0)) {
                return Err(bad(format!(
                    "optimizers[{i}] ({}): samples must be non-negative [parameters, us] pairs",
                    o.optimizer
                )));
            }
            if o.tensors.iter().any(|&(x, y)| !(x.is_finite() && y.is_finite() && x > 0.0 && y >= 0.0)) {
                return Err(bad(format!(
                    "optimizers[{i}] ({}): tensors must be [elements > 0, us >= 0] pairs",
                    o.optimizer
                )));
            }
        }
        Ok(p)
    }

    /// Least-squares fits of each optimizer's step, `seconds = r·params + c`,
    /// by optimizer name (`sgd`, `momentum`, `adam`).
    pub fn optimizer_fits(&self) -> Result<BTreeMap<&'static str, LinearModel>> {
        let mut pooled: BTreeMap<&'static str, Vec<(f64, f64)>> = BTreeMap::new();
        for o in &self.optimizers {
            let Some(k) = optimizer_key(&o.optimizer) else { continue };
            if o.samples.is_empty() {
                continue;
            }
            pooled.entry(k).or_default().extend(o.samples.iter().map(|&(x, us)| (x, us * 1e-6)));
        }
        pooled
            .into_iter()
            .map(|(k, pts)| {
                let fit = fit_linear(&pts).map_err(|e| CostError::Fit(format!("optimizer {k}: {e}")))?;
                Ok((k, fit.model))
            })
            .collect()
    }

    /// Each optimizer's time per tensor ([`SizeCurve`]) from its `tensors`
    /// samples (pooled over entries), by optimizer name. Errors when an
    /// optimizer's samples hold fewer than two distinct sizes.
    pub fn optimizer_curves(&self) -> Result<BTreeMap<&'static str, SizeCurve>> {
        self.curves_of(|o| &o.tensors)
    }

    /// Per optimizer, the host's time per tensor issuing its step (from
    /// `host_tensors`), where measured.
    pub fn optimizer_host_curves(&self) -> Result<BTreeMap<&'static str, SizeCurve>> {
        self.curves_of(|o| &o.host_tensors)
    }

    fn curves_of(
        &self,
        pick: impl Fn(&OptimizerSamples) -> &Vec<(f64, f64)>,
    ) -> Result<BTreeMap<&'static str, SizeCurve>> {
        let mut pooled: BTreeMap<&'static str, Vec<(f64, f64)>> = BTreeMap::new();
        for o in &self.optimizers {
            let Some(k) = optimizer_key(&o.optimizer) else { continue };
            if pick(o).is_empty() {
                continue;
            }
            pooled.entry(k).or_default().extend(pick(o).iter().map(|&(x, us)| (x, us * 1e-6)));
        }
        pooled
            .into_iter()
            .map(|(k, pts)| {
                let curve = SizeCurve::new(&pts)
                    .ok_or_else(|| CostError::Fit(format!("optimizer {k}: tensors need two distinct sizes")))?;
                Ok((k, curve))
            })
            .collect()
    }

    pub fn load_file(path: impl AsRef<Path>) -> Result<Profile> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| CostError::Io { path: path.to_path_buf(), source })?;
        Profile::from_json(&text, &path.display().to_string())
    }

    /// Measured op times by key and precision (later entries win).
    pub fn op_table(&self) -> HashMap<String, [Option<Measured>; 7]> {
        self.op_table_with_curves().0
    }

    /// [`Profile::op_table`] plus the batch curves its entries point to.
    /// A batch point that names its inputs is also an entry of its own key.
    pub fn op_table_with_curves(&self) -> (HashMap<String, [Option<Measured>; 7]>, Vec<BatchCurve>) {
        let mut t: HashMap<String, [Option<Measured>; 7]> = HashMap::new();
        let mut curves = Vec::new();
        let s = |us: f64| us * 1e-6;
        for o in &self.ops {
            let curve = match o.batch {
                Some(b) if !o.batch_points.is_empty() => {
                    let mut points = vec![(b as f64, s(o.fwd_us), o.bwd_input_us.map(s), o.bwd_weight_us.map(s))];
                    points.extend(
                        o.batch_points
                            .iter()
                            .map(|p| (p.batch as f64, s(p.fwd_us), p.bwd_input_us.map(s), p.bwd_weight_us.map(s))),
                    );
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    curves.push(BatchCurve { points });
                    Some(curves.len() - 1)
                }
                _ => None,
            };
            let host = match (&self.host, &o.host_us) {
                (Some(model), Some(h)) => {
                    let (f, b) = model.isolated_us(h);
                    Some((s(f), b.map(s)))
                }
                _ => None,
            };
            let host_bound = o.host_us.map_or([false; 3], |h| h.host_bound);
            let m = Measured {
                fwd: s(o.fwd_us),
                bwd_input: o.bwd_input_us.map(s),
                bwd_weight: o.bwd_weight_us.map(s),
                batch: o.batch.unwrap_or(1) as f64,
                curve,
                host,
                host_bound,
            };
            t.entry(o.key()).or_default()[o.precision.index()] = Some(m);
            for p in &o.batch_points {
                let Some(inputs) = &p.inputs else { continue };
                let key = OpSample { inputs: inputs.clone(), batch_points: Vec::new(), ..o.clone() }.key();
                let m = Measured {
                    fwd: s(p.fwd_us),
                    bwd_input: p.bwd_input_us.map(s),
                    bwd_weight: p.bwd_weight_us.map(s),
                    batch: p.batch as f64,
                    curve,
                    host,
                    host_bound,
                };
                t.entry(key).or_default()[o.precision.index()] = Some(m);
            }
        }
        (t, curves)
    }

    /// Least-squares fits of every cast pair (samples of a pair listed
    /// several times are pooled).
    pub fn cast_fits(&self) -> Result<Vec<CastFit>> {
        // (from, to, samples as (elements, seconds)).
        type Pair = (Precision, Precision, Vec<(f64, f64)>);
        let mut pairs: Vec<Pair> = Vec::new();
        for c in &self.casts {
            let pts = c.samples.iter().map(|&(x, us)| (x, us * 1e-6));
            match pairs.iter_mut().find(|(f, t, _)| *f == c.from && *t == c.to) {
                Some((_, _, v)) => v.extend(pts),
                None => pairs.push((c.from, c.to, pts.collect())),
            }
        }
        pairs
            .into_iter()
            .map(|(from, to, pts)| {
                let fit = fit_linear(&pts).map_err(|e| CostError::Fit(format!("cast {from} -> {to}: {e}")))?;
                Ok(CastFit { from, to, fit })
            })
            .collect()
    }
}

/// The canonical name of an optimizer in profiles (`adamw` is `adam`,
/// `sgd-momentum` is `momentum`), or `None` when unknown.
pub fn optimizer_key(name: &str) -> Option<&'static str> {
    match name.trim().to_ascii_lowercase().as_str() {
        "sgd" => Some("sgd"),
        "momentum" | "sgd-momentum" => Some("momentum"),
        "adam" | "adamw" => Some("adam"),
        _ => None,
    }
}
