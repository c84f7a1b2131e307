//! The performance oracle precision planners ask: how long an op takes at a
//! precision, how long a cast takes, and which precisions the target has.
//!
//! **Reads:** value types (shapes, dtypes) and op attributes.
//! **Guarantees:** every method is pure and deterministic; times are seconds
//! of forward + backward (training semantics, as the cost model uses).
//! **Requires:** `infer-shapes` has run, so shapes are known; unknown or
//! symbolic dims are costed at [`SYMBOLIC_DIM`].
//!
//! [`CostOracle`] is the seam between planning and costing: the cost model
//! crate (device database, profiled op and cast costs) implements it later,
//! measured batch times may implement it too (CoMP's performance oracle), and
//! the planners here — and Campo / CoMP when they arrive — only see the trait.
//! [`AnalyticOracle`] is a small documented stand-in used by tests and as the
//! default until then.

use qsync_ir::{DType, Dim, Graph, NodeId, Op, OpClass, TensorType, ValueId};

/// The size assumed for a symbolic or unknown dimension when costing.
pub const SYMBOLIC_DIM: i64 = 8;

/// Costs for a planner.
pub trait CostOracle {
    /// Forward + backward seconds of node `n` computing in precision `p`,
    /// excluding any casts around it.
    fn op_time(&self, g: &Graph, n: NodeId, p: DType) -> f64;
    /// Seconds to cast `elements` values from `from` to `to` (Campo eq. 1:
    /// a per-element rate plus a fixed launch cost).
    fn cast_time(&self, from: DType, to: DType, elements: u64) -> f64;
    /// Seconds the optimizer step spends rewriting a *refreshed copy* of a
    /// trained FP32 parameter at `to` ([`qsync_ir::Graph::add_refreshed_copy`]).
    /// The step already reads the master, so the copy costs only its write
    /// (fused into the step's sweep: no launch): the share of a cast's
    /// per-element time that writes `to`, from this oracle's own cast costs.
    fn refresh_time(&self, to: DType, elements: u64) -> f64 {
        if to == DType::F32 || elements == 0 {
            return 0.0;
        }
        let per_elem = (self.cast_time(DType::F32, to, elements) - self.cast_time(DType::F32, to, 0)).max(0.0);
        let (w, r) = (f64::from(to.bits()), f64::from(DType::F32.bits()));
        per_elem * w / (w + r)
    }
    /// Bytes of device memory left over when training `g` as it stands, by
    /// the oracle's memory model; `None` when it has none (then nothing may
    /// raise the memory peak).
    fn memory_headroom(&self, _g: &Graph) -> Option<f64> {
        None
    }
    /// Whether the target has kernels at precision `p` at all. A planner never
    /// chooses a precision for which this is false.
    fn supports(&self, p: DType) -> bool;
    /// Whether node `n` at precision `p` would run on Tensor Cores (GEMM dims
    /// multiples of 8 for 16-bit floats, 16 for 8-bit types).
    fn tensor_core_eligible(&self, g: &Graph, n: NodeId, p: DType) -> bool {
        tensor_core_shapes(g, n, p)
    }
    /// Elements of value `v` as this oracle sizes it (symbolic dims bound).
    fn elements(&self, _g: &Graph, v: ValueId) -> u64 {
        numel(_g.ty(v))
    }
    /// Predicted forward, backward and copy-refresh seconds of a materialized graph: every
    /// node at the precision it computes in ([`compute_precision`]), every
    /// Cast as a cast (and, in backward, the gradient's cast back unless the
    /// cast reads a graph input). This default splits op time 1 : 2 between
    /// forward and backward, as [`CostOracle::op_time`]'s training semantics
    /// assume.
    fn predict(&self, g: &Graph) -> Prediction {
        let mut pr = Prediction::default();
        for n in g.node_ids() {
            let node = g.node(n);
            if node.op == Op::Cast {
                let (Some(i), Some(o)) = (node.input(0), node.outputs().first().copied()) else { continue };
                let (Some(a), Some(b)) = (g.ty(i).dtype, g.ty(o).dtype) else { continue };
                let e = self.elements(g, i);
                pr.forward += self.cast_time(a, b, e);
                if !g.inputs().contains(&i) && a.is_float() {
                    pr.backward += self.cast_time(b, a, e);
                }
                continue;
            }
            let t = self.op_time(g, n, compute_precision(g, n));
            pr.forward += t / 3.0;
            pr.backward += 2.0 * t / 3.0;
        }
        pr.refresh = refresh_total(self, g);
        pr
    }
}

/// Predicted seconds of one training iteration, by phase.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Prediction {
    pub forward: f64,
    pub backward: f64,
    /// Optimizer-step time spent rewriting the graph's refreshed weight
    /// copies ([`CostOracle::refresh_time`]); the rest of the step is the
    /// same for every plan and not counted.
    pub refresh: f64,
}

impl Prediction {
    pub fn total(&self) -> f64 {
        self.forward + self.backward + self.refresh
    }
}

/// [`CostOracle::refresh_time`] summed over `g`'s refreshed copies.
pub fn refresh_total<O: CostOracle + ?Sized>(oracle: &O, g: &Graph) -> f64 {
    g.refreshed_copies().fold(0.0, |acc, (c, _)| {
        let dt = g.ty(c).dtype.unwrap_or(DType::F16);
        acc + oracle.refresh_time(dt, oracle.elements(g, c))
    })
}

/// The precision node `n` computes in: its plan when it has one the node
/// can use, else the dtype of its first float output (f32 without one).
pub fn compute_precision(g: &Graph, n: NodeId) -> DType {
    if let Some(p) = super::materialize::planned_precision(g, n) {
        return p;
    }
    g.node(n).outputs().iter().filter_map(|&v| g.ty(v).dtype).find(|d| d.is_float()).unwrap_or(DType::F32)
}

/// Precisions a planner may pick for float compute, widest first.
pub const PLAN_PRECISIONS: [DType; 5] = [DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::I8];

/// Targets the analytic oracle (and the CLI's `--target`) know.
pub const KNOWN_TARGETS: [&str; 10] =
    ["v100", "t4", "a10", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "l4", "rtx2080ti", "rtx4090"];

/// A FLOP- and byte-proportional model. Op time is
/// `3 · flops / peak(p) + 3 · bytes(p) / bandwidth` (backward ≈ 2× forward),
/// where the 16-bit and 8-bit peaks apply only to Tensor-Core-eligible GEMMs
/// and other ops gain only from moving fewer bytes. A cast costs
/// `elements · (bytes(from) + bytes(to)) / bandwidth + launch`.
#[derive(Clone, Debug, PartialEq)]
pub struct AnalyticOracle {
    /// Peak FLOP/s by precision for Tensor-Core-eligible work; absent = unsupported.
    pub peak: Vec<(DType, f64)>,
    /// FP32 peak for everything else (CUDA cores).
    pub fp32_peak: f64,
    /// Memory bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Fixed per-kernel cost of a cast (C_I in Campo's eq. 1), seconds.
    pub launch: f64,
}

impl Default for AnalyticOracle {
    /// A generic target supporting every plan precision.
    fn default() -> Self {
        AnalyticOracle {
            peak: vec![
                (DType::F32, 15e12),
                (DType::F16, 120e12),
                (DType::BF16, 120e12),
                (DType::I8, 240e12),
                (DType::F8E4M3, 240e12),
            ],
            fp32_peak: 15e12,
            bandwidth: 900e9,
            launch: 5e-6,
        }
    }
}

impl AnalyticOracle {
    /// Rough datasheet figures for a known target (see [`KNOWN_TARGETS`]);
    /// what matters here is which precisions exist (V100: no BF16 or INT8
    /// Tensor Cores; T4: no BF16; FP8 only on Hopper / Ada).
    pub fn for_target(name: &str) -> Option<AnalyticOracle> {
        let (f32p, f16p, bf16, i8p, f8, bw) = match name {
            "v100" => (15.7e12, 125e12, None, None, None, 900e9),
            "t4" => (8.1e12, 65e12, None, Some(130e12), None, 320e9),
            "rtx2080ti" => (13.4e12, 107e12, None, Some(215e12), None, 616e9),
            "a10" => (31.2e12, 125e12, Some(125e12), Some(250e12), None, 600e9),
            "a100-40gb" => (19.5e12, 312e12, Some(312e12), Some(624e12), None, 1555e9),
            "a100-80gb" => (19.5e12, 312e12, Some(312e12), Some(624e12), None, 2039e9),
            "l4" => (30.3e12, 121e12, Some(121e12), Some(242e12), Some(242e12), 300e9),
            "rtx4090" => (82.6e12, 165e12, Some(165e12), Some(330e12), Some(330e12), 1008e9),
            "h100-sxm" => (67e12, 989e12, Some(989e12), Some(1979e12), Some(1979e12), 3350e9),
            "h200" => (67e12, 989e12, Some(989e12), Some(1979e12), Some(1979e12), 4800e9),
            _ => return None,
        };
        let mut peak = vec![(DType::F32, f32p), (DType::F16, f16p)];
        peak.extend(bf16.map(|v| (DType::BF16, v)));
        peak.extend(i8p.map(|v| (DType::I8, v)));
        peak.extend(f8.map(|v| (DType::F8E4M3, v)));
        Some(AnalyticOracle { peak, fp32_peak: f32p, bandwidth: bw, launch: 5e-6 })
    }

    fn peak_of(&self, p: DType) -> Option<f64> {
        self.peak.iter().find(|(d, _)| *d == p).map(|(_, v)| *v)
    }
}

impl CostOracle for AnalyticOracle {
    fn op_time(&self, g: &Graph, n: NodeId, p: DType) -> f64 {
        let flops = node_flops(g, n);
        let rate =
            if self.tensor_core_eligible(g, n, p) { self.peak_of(p).unwrap_or(self.fp32_peak) } else { self.fp32_peak };
        let elems: u64 = g
            .node(n)
            .inputs()
            .iter()
            .flatten()
            .chain(g.node(n).outputs())
            .filter(|&&v| g.ty(v).dtype.is_some_and(DType::is_float))
            .map(|&v| numel(g.ty(v)))
            .sum();
        // INT8 kernels output FP32 and run backward in FP16 (QSync Sec. II).
        let bytes = elems as f64 * f64::from(p.bits()) / 8.0;
        3.0 * (flops / rate + bytes / self.bandwidth)
    }

    fn cast_time(&self, from: DType, to: DType, elements: u64) -> f64 {
        if from == to {
            return 0.0;
        }
        elements as f64 * f64::from(from.bits() + to.bits()) / 8.0 / self.bandwidth + self.launch
    }

    fn supports(&self, p: DType) -> bool {
        self.peak_of(p).is_some()
    }
}

/// Elements of a value, symbolic dims at [`SYMBOLIC_DIM`].
pub fn numel(t: &TensorType) -> u64 {
    t.shape.as_ref().map_or(1, |s| s.iter().map(|d| dim_value(d).max(0) as u64).product())
}

fn dim_value(d: &Dim) -> i64 {
    d.substitute(&|_| Some(Dim::from(SYMBOLIC_DIM))).as_const().unwrap_or(SYMBOLIC_DIM)
}

fn dims(t: &TensorType) -> Option<Vec<i64>> {
    t.shape.as_ref().map(|s| s.iter().map(dim_value).collect())
}

/// Forward FLOPs of a node (a multiply-add is 2; elementwise 1 per output
/// element; data movement 0), symbolic dims at [`SYMBOLIC_DIM`].
pub fn node_flops(g: &Graph, n: NodeId) -> f64 {
    let node = g.node(n);
    let Some(out) = node.outputs().first().map(|&v| numel(g.ty(v)) as f64) else { return 0.0 };
    let in_dims = |i: usize| node.input(i).and_then(|v| dims(g.ty(v)));
    match node.op.class() {
        OpClass::Conv => in_dims(1).map_or(out, |w| 2.0 * out * w.iter().skip(1).product::<i64>() as f64),
        OpClass::MatMul => {
            let k = match node.op {
                Op::Gemm if node.attr_int("transA").unwrap_or(0) != 0 => in_dims(0).and_then(|a| a.first().copied()),
                _ => in_dims(0).and_then(|a| a.last().copied()),
            };
            2.0 * out * k.unwrap_or(1) as f64
        }
        OpClass::Movement | OpClass::Shape | OpClass::Cast | OpClass::Random => 0.0,
        OpClass::Norm | OpClass::Softmax => 5.0 * out,
        _ => out,
    }
}

/// GEMM-like ops whose dims suit Tensor Cores at `p`: 16-bit floats want
/// multiples of 8, 8-bit types multiples of 16 (Campo Sec. 4.4; NOTES.md).
pub fn tensor_core_shapes(g: &Graph, n: NodeId, p: DType) -> bool {
    let node = g.node(n);
    let multiple = match p {
        DType::F16 | DType::BF16 => 8,
        DType::I8 | DType::F8E4M3 => 16,
        _ => return false,
    };
    let ok = |d: i64| d % multiple == 0;
    match node.op.class() {
        OpClass::Conv => {
            node.input(1).and_then(|w| dims(g.ty(w))).is_some_and(|w| w.len() >= 2 && ok(w[0]) && ok(w[1]))
        }
        OpClass::MatMul => {
            let (Some(a), Some(b)) =
                (node.input(0).and_then(|v| dims(g.ty(v))), node.input(1).and_then(|v| dims(g.ty(v))))
            else {
                return false;
            };
            a.last().is_some_and(|&k| ok(k)) && b.last().is_some_and(|&m| ok(m))
        }
        _ => false,
    }
}
