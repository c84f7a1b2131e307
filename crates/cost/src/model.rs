//! The operator cost model: roofline time per phase of a node at a
//! precision on a device, overridden by calibration profiles.
//!
//! `time = max(flops / (peak · eff), bytes / (bandwidth · eff_mem)) + kernels · launch`.
//! Conv/GEMM phases run on Tensor Cores when the device has them for the
//! precision and every GEMM dimension (channel counts for convolutions) is a
//! multiple of the device's alignment; otherwise at the CUDA-core rate.
//! INT8 Conv/GEMM follow QSync: the forward quantizes activation and weight
//! (min/max, scale, quantize), multiplies in INT8 and dequantizes the INT32
//! result to FP32; the backward runs in FP16 after casting the FP32 output
//! gradient, the weight and the saved INT8 input to FP16.

use std::collections::{BTreeMap, HashMap};

use qsync_ir::NodeId;
use serde::Serialize;

use crate::cast::{CastModel, LinearModel};
use crate::facts::{GraphFacts, Kind, NodeFacts, Work};
use crate::profile::{BatchCurve, CastFit, Measured, Profile, SizeCurve};
use crate::{Bindings, Device, Precision, Result};

/// Seconds charged to host-side shape arithmetic, and to views on a device
/// that does not price their dispatch (`view_op_us`): they launch no
/// kernel, but every node gets a positive cost.
pub const HOST_OP_S: f64 = 1e-7;

/// The cost of one node at one precision.
#[derive(Copy, Clone, PartialEq, Debug, Default, Serialize)]
pub struct OpCost {
    /// Forward seconds, quantization work included.
    pub fwd: f64,
    /// Input-gradient seconds (0 when no input needs a gradient).
    pub bwd_input: f64,
    /// Weight-gradient seconds (0 when the node trains no parameter).
    pub bwd_weight: f64,
    /// Part of `fwd` spent quantizing / dequantizing (INT8 only).
    pub quant: f64,
    pub fwd_flops: f64,
    pub bwd_input_flops: f64,
    pub bwd_weight_flops: f64,
    pub fwd_bytes: f64,
    pub bwd_bytes: f64,
    /// Whether the forward runs on Tensor Cores.
    pub tensor_core: bool,
    /// Whether a profile entry supplied the forward time.
    pub measured: bool,
    /// What issuing the forward costs the host, seconds (0 without a
    /// profile that measured the host: the host taken to be never behind).
    pub host_fwd: f64,
    /// What issuing the backward (both gradients) costs the host, seconds.
    pub host_bwd: f64,
}

impl OpCost {
    /// Forward plus backward seconds.
    pub fn total(&self) -> f64 {
        self.fwd + self.bwd_input + self.bwd_weight
    }
}

/// The fractions of peak a [`CostModel`] costs with: the device file's,
/// or a calibration profile's fitted ones where it has them.
#[derive(Copy, Clone, PartialEq, Debug)]
pub struct Rates {
    /// Tensor Core fraction of peak, per precision.
    pub tensor_core: [f64; 7],
    /// CUDA-core fraction of peak, per precision.
    pub cuda_core: [f64; 7],
    /// Fraction of DRAM bandwidth.
    pub memory: f64,
}

impl Rates {
    /// The device file's fractions, the same for every precision.
    pub fn of(device: &Device) -> Rates {
        let e = &device.efficiency;
        Rates { tensor_core: [e.tensor_core; 7], cuda_core: [e.cuda_core; 7], memory: e.memory }
    }

    /// The device file's, overridden by `profile`'s fitted ones.
    pub fn calibrated(device: &Device, profile: Option<&Profile>) -> Rates {
        let mut r = Rates::of(device);
        if let Some(e) = profile.and_then(|p| p.efficiency.as_ref()) {
            for (p, &v) in &e.tensor_core {
                r.tensor_core[p.index()] = v;
            }
            for (p, &v) in &e.cuda_core {
                r.cuda_core[p.index()] = v;
            }
            if let Some(m) = e.memory {
                r.memory = m;
            }
        }
        r
    }
}

/// Which roofline bound a phase's time comes from.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Bound {
    TensorCore,
    CudaCore,
    Memory,
}

/// One phase's roofline terms on `device` at `rates` (see [`roofline`]).
#[derive(Copy, Clone, PartialEq, Debug)]
pub struct PhaseTime {
    /// `max(compute, memory)`.
    pub body: f64,
    /// Launch overhead (`kernels · launch`).
    pub launch: f64,
    pub bound: Bound,
}

/// The roofline of one phase: `max(flops / (peak · eff), bytes /
/// (bandwidth · eff_mem)) + kernels · launch`, with the term that binds.
/// Shared by the cost model and the calibration fit, so both price a phase
/// the same way.
pub fn roofline(device: &Device, rates: &Rates, w: &Work, gemm_like: bool, p: Precision, tc: bool) -> PhaseTime {
    let (rate, compute_bound) = if tc && gemm_like {
        (device.tensor_peak(p) * rates.tensor_core[p.index()], Bound::TensorCore)
    } else {
        let (peak, at) = if device.cuda_peak(p) > 0.0 {
            (device.cuda_peak(p), p)
        } else {
            (device.cuda_peak(Precision::Fp32), Precision::Fp32)
        };
        (peak * rates.cuda_core[at.index()], Bound::CudaCore)
    };
    let waves = if gemm_like { wave_factor(device, w) } else { 1.0 };
    let compute = if rate > 0.0 { w.flops / rate * waves } else { 0.0 };
    let memory = bytes(w, p) / (device.mem_bytes_per_s() * rates.memory);
    let (body, bound) = if compute >= memory { (compute, compute_bound) } else { (memory, Bound::Memory) };
    PhaseTime { body, launch: w.kernels * device.launch_s(), bound }
}

/// How much longer a GEMM-like phase computes than its FLOPs at the full
/// rate take, because it fills whole waves (`device::Occupancy`):
///
/// ```text
/// slots  = sm_count · tiles_per_sm                      (blocks in one wave)
/// tiles  = ceil(outputs / tile_outputs)
/// splits = clamp(floor(slots / tiles), 1, max(1, floor(K / split_k_min))),  K = flops / (2 · outputs)
/// blocks = tiles · splits
/// factor = ceil(blocks / slots) · slots / blocks        (≥ 1)
/// ```
///
/// Split-K is used only to fill one wave (never to spill into a second),
/// as far as K allows. Below
/// one wave (`blocks < slots`) the factor is `slots / blocks`, so the compute
/// time `flops / rate · factor` stays that of a full wave whatever the work;
/// above, it steps by one wave. 1 when the device has no occupancy figures
/// or the phase names no outputs.
pub fn wave_factor(device: &Device, w: &Work) -> f64 {
    let Some(o) = &device.occupancy else { return 1.0 };
    if w.outputs <= 0.0 || w.flops <= 0.0 {
        return 1.0;
    }
    let slots = f64::from(o.sm_count) * f64::from(o.tiles_per_sm);
    let tiles = (w.outputs / f64::from(o.tile_outputs)).ceil();
    let k = w.flops / (2.0 * w.outputs);
    let max_splits = (k / f64::from(o.split_k_min)).floor().max(1.0);
    let splits = (slots / tiles).floor().clamp(1.0, max_splits);
    let blocks = tiles * splits;
    (blocks / slots).ceil() * slots / blocks
}

/// Whether a GEMM-like node with `align_dims` runs on Tensor Cores at `p`.
pub fn tensor_core_eligible(device: &Device, gemm_like: bool, align_dims: &[i64], p: Precision) -> bool {
    let a = device.alignment(p) as i64;
    gemm_like && device.tensor_peak(p) > 0.0 && a > 0 && align_dims.iter().all(|&d| d % a == 0)
}

/// Costs on one device, optionally calibrated.
#[derive(Clone, Debug)]
pub struct CostModel {
    device: Device,
    rates: Rates,
    casts: CastModel,
    measured: HashMap<String, [Option<Measured>; 7]>,
    /// Measured batch curves, indexed by [`Measured::curve`].
    curves: Vec<BatchCurve>,
    fits: Vec<CastFit>,
    optimizer_fits: BTreeMap<&'static str, LinearModel>,
    optimizer_curves: BTreeMap<&'static str, SizeCurve>,
    host: Option<HostCosts>,
    /// A profile's factor per kind of operator ([`ProfileEfficiency::kinds`]),
    /// on the roofline time of the forward phases of the ops it did not
    /// measure.
    ///
    /// [`ProfileEfficiency::kinds`]: crate::profile::ProfileEfficiency::kinds
    kinds: HashMap<Kind, f64>,
}

/// What issuing work costs the host, from a profile that measured it
/// ([`crate::profile::HostModel`]).
#[derive(Clone, Debug)]
struct HostCosts {
    overhead_fwd: f64,
    overhead_bwd: f64,
    /// An op the profile did not measure: the median of the measured ops
    /// of its type (the key's op name), else of all, seconds (forward,
    /// backward).
    typical_fwd: f64,
    typical_bwd: f64,
    typical_by_op: HashMap<String, (f64, f64)>,
    optimizer_curves: BTreeMap<&'static str, SizeCurve>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl CostModel {
    /// A model for `device`; a profile's measured ops and fitted cast
    /// models replace the analytic ones where they have data.
    pub fn new(device: &Device, profile: Option<&Profile>) -> Result<CostModel> {
        let rates = Rates::calibrated(device, profile);
        // Casts nobody measured stream at the calibrated bandwidth.
        let mut calibrated = device.clone();
        calibrated.efficiency.memory = rates.memory;
        let mut casts = CastModel::analytic(&calibrated);
        let (mut measured, mut fits, mut optimizer_fits) = (HashMap::new(), Vec::new(), BTreeMap::new());
        let mut optimizer_curves = BTreeMap::new();
        let mut curves = Vec::new();
        if let Some(p) = profile {
            (measured, curves) = p.op_table_with_curves();
            fits = p.cast_fits()?;
            for f in &fits {
                casts.set(f.from, f.to, f.fit.model);
            }
            optimizer_fits = p.optimizer_fits()?;
            optimizer_curves = p.optimizer_curves()?;
        }
        let host = match profile.and_then(|p| p.host.as_ref().map(|h| (p, h))) {
            Some((p, h)) => {
                let mut by_op: BTreeMap<&str, Vec<(f64, Option<f64>)>> = BTreeMap::new();
                for (key, t) in &measured {
                    let op = key.split('|').next().unwrap_or("");
                    by_op.entry(op).or_default().extend(t.iter().flatten().filter_map(|m| m.host));
                }
                let typical = |v: &[(f64, Option<f64>)]| {
                    (median(v.iter().map(|x| x.0).collect()), median(v.iter().filter_map(|x| x.1).collect()))
                };
                let all: Vec<(f64, Option<f64>)> = by_op.values().flatten().copied().collect();
                let (typical_fwd, typical_bwd) = typical(&all);
                let typical_by_op = by_op
                    .iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(op, v)| {
                        let (f, b) = typical(v);
                        (op.to_string(), (f, if b > 0.0 { b } else { typical_bwd }))
                    })
                    .collect();
                Some(HostCosts {
                    overhead_fwd: h.overhead_fwd,
                    overhead_bwd: h.overhead_bwd,
                    typical_fwd,
                    typical_bwd,
                    typical_by_op,
                    optimizer_curves: p.optimizer_host_curves()?,
                })
            }
            None => None,
        };
        Ok(CostModel {
            device: device.clone(),
            rates,
            casts,
            measured,
            curves,
            fits,
            optimizer_fits,
            optimizer_curves,
            host,
            kinds: profile
                .and_then(|p| p.efficiency.as_ref())
                .map(|e| e.kinds.iter().filter_map(|(k, &v)| Kind::from_name(k).map(|k| (k, v))).collect())
                .unwrap_or_default(),
        })
    }

    /// What issuing `optimizer`'s step over tensors of `tensors` elements
    /// costs the host, seconds: 0 without a profile that measured it.
    pub fn optimizer_host_step(&self, optimizer: &str, tensors: &[f64]) -> f64 {
        let k = crate::profile::optimizer_key(optimizer);
        match (&self.host, k) {
            (Some(h), Some(k)) => h.optimizer_curves.get(k).map_or(0.0, |c| c.step(tensors)),
            _ => 0.0,
        }
    }

    /// Whether this model prices what issuing the work costs the host.
    pub fn prices_host(&self) -> bool {
        self.host.is_some()
    }

    /// The fractions of peak this model costs with.
    pub fn rates(&self) -> &Rates {
        &self.rates
    }

    /// The measured step of `optimizer` (`sgd`, `momentum`, `adam`) from the
    /// profile, when it has one.
    pub fn optimizer_fit(&self, optimizer: &str) -> Option<LinearModel> {
        crate::profile::optimizer_key(optimizer).and_then(|k| self.optimizer_fits.get(k).copied())
    }

    /// The measured step of `optimizer` over parameter tensors of `tensors`
    /// elements each: the sum of the profile's per-tensor curve
    /// ([`SizeCurve`]) when it has one, else its fit of the step against
    /// the total parameter count; `None` when the profile measured neither.
    pub fn optimizer_step(&self, optimizer: &str, tensors: &[f64]) -> Option<f64> {
        let k = crate::profile::optimizer_key(optimizer)?;
        if let Some(curve) = self.optimizer_curves.get(k) {
            return Some(curve.step(tensors));
        }
        let fit = self.optimizer_fits.get(k)?;
        Some(fit.eval(tensors.iter().sum()).max(0.0))
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn casts(&self) -> &CastModel {
        &self.casts
    }

    /// The cast fits taken from the profile, with their errors.
    pub fn cast_fits(&self) -> &[CastFit] {
        &self.fits
    }

    /// Seconds to cast `elements` values (Campo eq. 1 / QSync's linear models).
    pub fn cast_cost(&self, from: Precision, to: Precision, elements: f64) -> f64 {
        self.casts.cast(from, to, elements)
    }

    /// Whether node facts `f` run on Tensor Cores at `p` on this device.
    pub fn tensor_core_eligible(&self, f: &NodeFacts, p: Precision) -> bool {
        tensor_core_eligible(&self.device, f.kind.is_gemm_like(), &f.align_dims, p)
    }

    /// The cost of node `n` at precision `p`. Pure and allocation-free.
    pub fn op_cost(&self, facts: &GraphFacts, n: NodeId, p: Precision) -> Result<OpCost> {
        self.device.require(p)?;
        self.facts_cost(facts.node(n)?, p)
    }

    /// Convenience for one-off queries: builds the graph facts first (slow;
    /// build a [`GraphFacts`] once and call [`CostModel::op_cost`] in loops).
    pub fn op_cost_in(&self, graph: &qsync_ir::Graph, n: NodeId, p: Precision, bindings: &Bindings) -> Result<OpCost> {
        self.op_cost(&GraphFacts::new(graph, bindings)?, n, p)
    }

    /// The cost of a node given its facts.
    pub fn facts_cost(&self, f: &NodeFacts, p: Precision) -> Result<OpCost> {
        self.facts_cost_at(f, p, 1.0)
    }

    /// The cost of node `n` at precision `p` with its per-sample work
    /// multiplied by `scale` (the node at `scale` times the batch its facts
    /// were built at). See [`CostModel::facts_cost_at`].
    pub fn op_cost_at(&self, facts: &GraphFacts, n: NodeId, p: Precision, scale: f64) -> Result<OpCost> {
        self.device.require(p)?;
        self.facts_cost_at(facts.node(n)?, p, scale)
    }

    /// The cost of a node given its facts, at `scale` times their batch.
    ///
    /// - Analytic phases are priced on the scaled work ([`Work::scaled`]):
    ///   the roofline then sees the weights read once at any batch and the
    ///   wave model ([`wave_factor`]) the scaled outputs, so small batches
    ///   lose efficiency instead of getting linearly cheaper.
    /// - A measured op with a batch curve reads the curve at `batch · scale`
    ///   ([`BatchCurve::at`]).
    /// - A measured op without one scales linearly (all but one launch), never
    ///   below one launch plus streaming its weights once at the compute
    ///   precision when `scale < 1`.
    ///
    /// `scale == 1` is [`CostModel::facts_cost`].
    pub fn facts_cost_at(&self, f: &NodeFacts, p: Precision, scale: f64) -> Result<OpCost> {
        self.device.require(p)?;
        if f.kind == Kind::Host {
            return Ok(OpCost { fwd: HOST_OP_S, ..OpCost::default() });
        }
        if f.kind == Kind::View && self.host.is_some() {
            // No kernel: the view's dispatch is the host's, counted in the
            // overheads fitted to training runs (the isolated ops' host
            // times leave views out).
            return Ok(OpCost { fwd: HOST_OP_S, ..OpCost::default() });
        }
        if f.kind == Kind::View {
            // The framework's dispatch of the view, forward and (when the
            // graph trains through it) its backward; no kernel, no bytes.
            let view = self.device.view_op_s();
            let bwd_input = if f.needs_backward { view } else { 0.0 };
            return Ok(OpCost { fwd: HOST_OP_S.max(view), bwd_input, ..OpCost::default() });
        }
        let v = if scale == 1.0 { Scaled::of(f) } else { Scaled::at(f, scale) };
        let mut c = if p == Precision::Int8 { self.int8_cost(f, &v) } else { self.float_cost(f, &v, p) };
        if let Some(m) = self.measured.get(&f.profile_key).and_then(|t| t[p.index()]) {
            let (fwd, bwd_input, bwd_weight) = match m.curve.and_then(|i| self.curves.get(i)) {
                Some(curve) if scale != 1.0 => curve.at(m.batch * scale),
                _ if scale != 1.0 => {
                    let launch = self.device.launch_s();
                    let weight_s = if scale < 1.0 {
                        f.weight * p.bytes() / (self.device.mem_bytes_per_s() * self.rates.memory)
                    } else {
                        0.0
                    };
                    let lin = |t: f64| {
                        if t <= launch {
                            return t;
                        }
                        (launch + (t - launch) * scale).max((launch + weight_s).min(t))
                    };
                    (lin(m.fwd), m.bwd_input.map(lin), m.bwd_weight.map(lin))
                }
                _ => (m.fwd, m.bwd_input, m.bwd_weight),
            };
            // With the host priced, a phase measured at the host's pace
            // bounds its kernels from above: they run at the fitted rates,
            // at most that long (the host's time is priced apart).
            let priced = self.host.is_some();
            let take = |analytic: f64, measured: f64, bound: bool| {
                if bound && priced {
                    analytic.min(measured)
                } else {
                    measured
                }
            };
            c.fwd = take(c.fwd, fwd, m.host_bound[0]);
            c.quant = c.quant.min(c.fwd);
            c.bwd_input = bwd_input.map_or(c.bwd_input, |t| take(c.bwd_input, t, m.host_bound[1]));
            c.bwd_weight = bwd_weight.map_or(c.bwd_weight, |t| take(c.bwd_weight, t, m.host_bound[2]));
            c.measured = true;
        }
        if let Some(h) = &self.host {
            // What the host pays does not depend on the batch.
            let m = self.measured.get(&f.profile_key).and_then(|t| t[p.index()]).and_then(|m| m.host);
            let op = f.profile_key.split('|').next().unwrap_or("");
            let typical = h.typical_by_op.get(op).copied().unwrap_or((h.typical_fwd, h.typical_bwd));
            let (fwd, bwd) = m.map_or(typical, |(f, b)| (f, b.unwrap_or(typical.1)));
            c.host_fwd = h.overhead_fwd * fwd;
            if c.bwd_input + c.bwd_weight > 0.0 {
                c.host_bwd = h.overhead_bwd * bwd;
            }
        }
        Ok(c)
    }

    fn float_cost(&self, f: &NodeFacts, v: &Scaled, p: Precision) -> OpCost {
        let tc = self.tensor_core_eligible(f, p);
        OpCost {
            fwd: self.forward_phase(&v.fwd, f.kind, p, tc),
            bwd_input: self.phase(&v.bwd_input, f.kind, p, tc),
            bwd_weight: self.phase(&v.bwd_weight, f.kind, p, tc),
            quant: 0.0,
            fwd_flops: v.fwd.flops,
            bwd_input_flops: v.bwd_input.flops,
            bwd_weight_flops: v.bwd_weight.flops,
            fwd_bytes: bytes(&v.fwd, p),
            bwd_bytes: bytes(&v.bwd_input, p) + bytes(&v.bwd_weight, p),
            tensor_core: tc,
            measured: false,
            host_fwd: 0.0,
            host_bwd: 0.0,
        }
    }

    /// QSync INT8: quantized forward, FP16 backward (FP32 where the device
    /// has no FP16).
    fn int8_cost(&self, f: &NodeFacts, v: &Scaled) -> OpCost {
        let bwd_p = if self.device.supports(Precision::Fp16) { Precision::Fp16 } else { Precision::Fp32 };
        let mut c = self.float_cost(f, v, bwd_p);
        let tc = self.tensor_core_eligible(f, Precision::Int8);
        if !f.kind.is_gemm_like() {
            // Not a quantized kernel: the forward just moves 1-byte data.
            c.fwd = self.forward_phase(&v.fwd, f.kind, Precision::Int8, false);
            c.fwd_bytes = bytes(&v.fwd, Precision::Int8);
            c.tensor_core = false;
            return c;
        }
        let cs = &self.casts;
        // Forward: quantize activation and weight, INT8 GEMM writing INT32,
        // dequantize (INT32 read, FP32 written) to the FP32 output.
        let gemm = Work { elems: v.act_in + f.weight, fixed_bytes: v.fwd.fixed_bytes + 4.0 * v.out, ..v.fwd };
        let dequant = 8.0 * v.out / (self.device.mem_bytes_per_s() * self.rates.memory) + self.device.launch_s();
        let quant = cs.quantize(Precision::Fp32, v.act_in) + cs.quantize(Precision::Fp32, f.weight) + dequant;
        c.fwd = self.phase(&gemm, f.kind, Precision::Int8, tc) + quant;
        c.quant = quant;
        c.fwd_bytes = bytes(&gemm, Precision::Int8) + 8.0 * v.out;
        c.tensor_core = tc;
        // Backward in FP16: casts of the output gradient and weight (dgrad),
        // and of the saved INT8 input (wgrad).
        if !f.bwd_input.is_empty() {
            c.bwd_input += cs.cast(Precision::Fp32, bwd_p, v.out) + cs.cast(Precision::Fp32, bwd_p, f.weight);
        }
        if !f.bwd_weight.is_empty() {
            c.bwd_weight += cs.dequantize(bwd_p, v.act_in)
                + if f.bwd_input.is_empty() { cs.cast(Precision::Fp32, bwd_p, v.out) } else { 0.0 };
        }
        c
    }

    /// Roofline time of one phase.
    fn phase(&self, w: &Work, kind: Kind, p: Precision, tc: bool) -> f64 {
        self.phase_times(w, kind, p, tc, 1.0)
    }

    /// A forward phase: its roofline body times the profile's factor for
    /// the kind where it has one (the work the roofline does not count,
    /// dropout's random numbers, is the forward's; the backward applies the
    /// saved mask).
    fn forward_phase(&self, w: &Work, kind: Kind, p: Precision, tc: bool) -> f64 {
        self.phase_times(w, kind, p, tc, self.kinds.get(&kind).copied().unwrap_or(1.0))
    }

    fn phase_times(&self, w: &Work, kind: Kind, p: Precision, tc: bool, factor: f64) -> f64 {
        if w.is_empty() {
            return 0.0;
        }
        let t = roofline(&self.device, &self.rates, w, kind.is_gemm_like(), p, tc);
        t.body * factor + t.launch
    }
}

/// A node's batch-dependent quantities at some multiple of its batch.
struct Scaled {
    fwd: Work,
    bwd_input: Work,
    bwd_weight: Work,
    act_in: f64,
    out: f64,
}

impl Scaled {
    fn of(f: &NodeFacts) -> Scaled {
        Scaled { fwd: f.fwd, bwd_input: f.bwd_input, bwd_weight: f.bwd_weight, act_in: f.act_in, out: f.out }
    }

    fn at(f: &NodeFacts, scale: f64) -> Scaled {
        Scaled {
            fwd: f.fwd.scaled(scale, f.weight, true),
            bwd_input: f.bwd_input.scaled(scale, f.weight, true),
            bwd_weight: f.bwd_weight.scaled(scale, f.weight, false),
            act_in: f.act_in * scale,
            out: f.out * scale,
        }
    }
}

fn bytes(w: &Work, p: Precision) -> f64 {
    w.elems * p.bytes() + w.fixed_bytes
}
