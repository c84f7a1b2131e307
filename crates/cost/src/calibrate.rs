//! Calibration from measurements: what to measure on a GPU, and how the
//! measurements become a [`Profile`].
//!
//! Three steps, of which only the middle one needs a GPU:
//!
//! 1. [`Worklist::add_graph`] lists each distinct operator of a model —
//!    by [`NodeFacts::profile_key`] (op type and concrete input shapes) — with
//!    what a measuring script needs to run it: attributes, each input's
//!    shape, dtype and role (activation, trained weight, constant, and
//!    whether it needs a gradient), small constant values, and the roofline
//!    work of each phase. Several models share one worklist; every entry
//!    records which models use it and how often (`uses`).
//! 2. A script (`scripts/gpu/profile.py`) times every entry's forward,
//!    input-gradient and weight-gradient at each precision on the GPU, and
//!    casts and optimizer steps by size, and writes [`Measurements`]: the
//!    worklist entries with a `measured` table per precision.
//! 3. [`build_profile`] turns measurements into a calibration profile for
//!    one device, from the models *not* excluded: the measured ops of those
//!    models (exact-key overrides), their cast and optimizer samples, and
//!    fractions of peak ([`ProfileEfficiency`]) fitted to those ops, which is
//!    what carries over to models with shapes the profile never saw. A key
//!    shared by nodes with different attributes (the key names shapes only)
//!    gets no exact override: its measurement would stand for another op.
//!
//! The fit ([`fit_rates`]) prices every measured phase with the same
//! [`roofline`] the cost model uses and scales each rate class (Tensor Cores
//! per precision, CUDA cores per precision, DRAM) until the class's
//! predicted time, summed over its phases weighted by how often the models
//! run them, equals the measured time: the per-iteration total is what the
//! replayer must get right, so a class is calibrated on time, not on a
//! per-op average that small kernels would dominate. A fixed number of
//! rounds in a fixed order: the same measurements give the same bits.
//! INT8 entries are QSync's composite (quantize, INT8 GEMM, dequantize) and
//! are not used to fit rates; they still override their own keys.

use std::collections::{BTreeMap, BTreeSet};

use qsync_ir::{Attr, DType, Graph, Op, ValueDef, ValueId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::facts::{Kind, Work};
use crate::model::{roofline, tensor_core_eligible, Bound, Rates};
use crate::profile::{
    BatchPoint, CastSamples, HostModel, HostTimes, OpSample, OptimizerSamples, ProfileEfficiency, MAX_KIND_FACTOR,
    MAX_PROFILE_EFFICIENCY, MIN_KIND_FACTOR,
};
use crate::{Bindings, CostError, Device, GraphFacts, Precision, Profile, Result};

/// Schema tag of worklists.
pub const WORKLIST_SCHEMA: &str = "qsync-worklist/1";
/// Schema tag of measurement files.
pub const MEASUREMENTS_SCHEMA: &str = "qsync-ops/1";

/// Constant inputs up to this many elements carry their values.
const MAX_CONST_VALUES: u64 = 64;

/// The roofline work of one phase, as [`Work`].
#[derive(Copy, Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct PhaseWork {
    pub flops: f64,
    pub elems: f64,
    pub fixed_bytes: f64,
    pub kernels: f64,
    /// Elements a GEMM-like phase writes (the wave model's parallel work).
    #[serde(default)]
    pub outputs: f64,
}

impl From<Work> for PhaseWork {
    fn from(w: Work) -> PhaseWork {
        PhaseWork { flops: w.flops, elems: w.elems, fixed_bytes: w.fixed_bytes, kernels: w.kernels, outputs: w.outputs }
    }
}

impl From<PhaseWork> for Work {
    fn from(w: PhaseWork) -> Work {
        Work { flops: w.flops, elems: w.elems, fixed_bytes: w.fixed_bytes, kernels: w.kernels, outputs: w.outputs }
    }
}

/// What an input is to the measuring script.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Computed every iteration (random data of its dtype).
    Activation,
    /// A trained parameter (its gradient is the weight gradient).
    Weight,
    /// An initializer or `Constant` that is not trained.
    Constant,
}

/// One input of a worklist entry.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct InputSpec {
    pub shape: Vec<i64>,
    /// IR dtype name (`f32`, `i64`, `bool`, …).
    pub dtype: String,
    pub role: Role,
    /// Whether backward computes a gradient for it.
    pub grad: bool,
    /// Values of a small constant (shapes, axes, split sizes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Vec<f64>>,
}

/// One distinct operator to measure.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct WorkItem {
    /// [`NodeFacts::profile_key`](crate::NodeFacts): `op|shape,shape,…`.
    pub key: String,
    pub op: String,
    /// Attributes of the first node with this key, as JSON.
    pub attrs: BTreeMap<String, Value>,
    /// Inputs in slot order (`None` for an omitted optional input).
    pub inputs: Vec<Option<InputSpec>>,
    /// Output shapes.
    pub outputs: Vec<Vec<i64>>,
    /// The cost model's class of the op (`conv`, `gemm`, `elementwise`, …).
    pub kind: String,
    pub gemm_like: bool,
    /// Dimensions that decide Tensor Core eligibility.
    pub align_dims: Vec<i64>,
    pub fwd: PhaseWork,
    pub bwd_input: PhaseWork,
    pub bwd_weight: PhaseWork,
    /// How many nodes of each model have this key.
    pub uses: BTreeMap<String, u32>,
    /// Nodes with this key whose attributes differ from the first one's
    /// (the key does not name attributes; such nodes share its measurement).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attr_variants: u32,
    /// The same operator at the worklist's other batches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub at_batches: Vec<AtBatch>,
}

/// A worklist entry's shapes and work at another batch.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct AtBatch {
    pub batch: i64,
    /// Input shapes in slot order (`None` where the entry's input is `None`).
    pub inputs: Vec<Option<Vec<i64>>>,
    pub outputs: Vec<Vec<i64>>,
    pub fwd: PhaseWork,
    pub bwd_input: PhaseWork,
    pub bwd_weight: PhaseWork,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A model in a worklist.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct ModelRef {
    pub name: String,
    /// The architecture it belongs to: leave-one-out calibration leaves
    /// out every model of a family (`resnet50` for both ResNet-50 exports).
    pub family: String,
    /// Nodes that launch kernels (not shape arithmetic or views).
    pub nodes: u32,
}

/// Distinct operators of one or more models, for a measuring script.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct Worklist {
    pub schema: String,
    pub batch: i64,
    /// Further batches (of the symbol `batch`) every entry is also measured
    /// at: the points of its batch curve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch_points: Vec<i64>,
    pub dims: BTreeMap<String, i64>,
    pub models: Vec<ModelRef>,
    pub entries: Vec<WorkItem>,
}

impl Worklist {
    pub fn new(batch: i64, dims: BTreeMap<String, i64>) -> Worklist {
        Worklist {
            schema: WORKLIST_SCHEMA.into(),
            batch,
            batch_points: Vec::new(),
            dims,
            models: Vec::new(),
            entries: Vec::new(),
        }
    }

    /// Also list every entry at these batches (sorted, the main batch and
    /// repeats dropped). Set before adding graphs.
    pub fn with_batch_points(mut self, batches: &[i64]) -> Worklist {
        let mut b: Vec<i64> = batches.iter().copied().filter(|&b| b > 0 && b != self.batch).collect();
        b.sort_unstable();
        b.dedup();
        self.batch_points = b;
        self
    }

    /// Add the kernel-launching nodes of `graph` (shapes inferred, every
    /// symbol bound by `bindings`) under model `name` of `family`. Casts are
    /// left out: the cast samples measure them by size.
    ///
    /// With batch points, each entry is also listed at every point with the
    /// graph's symbol `batch` bound to it (see [`Worklist::add_graph_at`]
    /// for graphs whose batch was bound on load).
    pub fn add_graph(&mut self, name: &str, family: &str, graph: &Graph, bindings: &Bindings) -> Result<()> {
        let at: Vec<Bindings> = self.batch_points.iter().map(|&b| bindings.clone().with("batch", b)).collect();
        let at: Vec<(&Graph, &Bindings)> = at.iter().map(|b| (graph, b)).collect();
        self.add_graph_at(name, family, graph, bindings, &at)
    }

    /// [`Worklist::add_graph`] with the same model given at each of the
    /// worklist's batch points (`at[i]` at `batch_points[i]`: the same file
    /// loaded at that batch, so the same nodes by id and name).
    pub fn add_graph_at(
        &mut self,
        name: &str,
        family: &str,
        graph: &Graph,
        bindings: &Bindings,
        at: &[(&Graph, &Bindings)],
    ) -> Result<()> {
        let bad = |message: String| CostError::Profile { file: name.into(), message };
        if self.models.iter().any(|m| m.name == name) {
            return Err(bad("model added to the worklist twice".into()));
        }
        if at.len() != self.batch_points.len() {
            return Err(bad(format!("{} graphs for {} batch points", at.len(), self.batch_points.len())));
        }
        let facts = GraphFacts::new(graph, bindings)?;
        let mut others = Vec::with_capacity(at.len());
        for (&b, &(g, bind)) in self.batch_points.iter().zip(at) {
            others.push((b, g, bind, GraphFacts::new(g, bind)?));
        }
        let mut index: BTreeMap<String, usize> =
            self.entries.iter().enumerate().map(|(i, e)| (e.key.clone(), i)).collect();
        let mut nodes = 0;
        for &n in facts.order() {
            let f = facts.node(n)?;
            if matches!(f.kind, Kind::Host | Kind::View | Kind::Cast) {
                continue;
            }
            nodes += 1;
            let node = graph.node(n);
            let attrs: BTreeMap<String, Value> = node.attrs.iter().map(|(k, a)| (k.clone(), attr_json(a))).collect();
            if let Some(&i) = index.get(&f.profile_key) {
                let e = &mut self.entries[i];
                *e.uses.entry(name.to_string()).or_default() += 1;
                if e.attrs != attrs {
                    e.attr_variants += 1;
                }
                continue;
            }
            let known_shape = |v: ValueId| -> Option<Vec<i64>> {
                graph.ty(v).shape.as_ref()?.iter().map(|d| bindings.eval(d).ok()).collect()
            };
            let shape = |v: ValueId| -> Result<Vec<i64>> {
                let dims = graph.ty(v).shape.as_ref().ok_or_else(|| CostError::UnknownShape {
                    node: node.name.clone(),
                    value: graph.value_name(v).to_string(),
                })?;
                dims.iter()
                    .map(|d| {
                        bindings.eval(d).map_err(|syms| CostError::UnboundSymbol {
                            node: node.name.clone(),
                            value: graph.value_name(v).to_string(),
                            dim: d.to_string(),
                            symbols: syms.join(", "),
                        })
                    })
                    .collect()
            };
            let mut inputs = Vec::with_capacity(node.inputs().len());
            for (slot, &v) in node.inputs().iter().enumerate() {
                let Some(v) = v else {
                    inputs.push(None);
                    continue;
                };
                let float = graph.ty(v).dtype.is_some_and(DType::is_float);
                // The cost facts allow secondary integer inputs of unknown
                // shape (their key says `_`, as an omitted input's does).
                if slot > 0 && !float && known_shape(v).is_none() {
                    inputs.push(None);
                    continue;
                }
                let dtype = graph.ty(v).dtype.map_or("?", DType::name).to_string();
                let constant = constant_tensor(graph, v);
                let role = if facts.is_param(v) {
                    Role::Weight
                } else if constant.is_some() {
                    Role::Constant
                } else {
                    Role::Activation
                };
                let value = constant
                    .filter(|t| t.numel() <= MAX_CONST_VALUES)
                    .and_then(|t| t.as_f64s().or_else(|| t.as_i64s().map(|v| v.iter().map(|&x| x as f64).collect())))
                    // JSON has no infinities (masks hold -inf): such constants are left to the script.
                    .filter(|v| v.iter().all(|x| x.is_finite()));
                inputs.push(Some(InputSpec { shape: shape(v)?, dtype, role, grad: facts.requires_grad(v), value }));
            }
            let outputs = node.outputs().iter().map(|&o| shape(o)).collect::<Result<Vec<_>>>()?;
            let mut at_batches = Vec::with_capacity(others.len());
            for (b, gb, at, fb) in &others {
                let same = gb.contains_node(n) && gb.node(n).name == node.name;
                if !same {
                    return Err(bad(format!("at batch {b}, node {} is not the same node", node.name)));
                }
                let nb = gb.node(n);
                let concrete = |v: ValueId| -> Option<Vec<i64>> {
                    gb.ty(v).shape.as_ref()?.iter().map(|d| at.eval(d).ok()).collect()
                };
                let ins =
                    nb.inputs().iter().zip(&inputs).map(|(v, spec)| spec.as_ref().and(*v).and_then(concrete)).collect();
                let outs = nb.outputs().iter().map(|&o| concrete(o).unwrap_or_default()).collect();
                let fbn = fb.node(n)?;
                at_batches.push(AtBatch {
                    batch: *b,
                    inputs: ins,
                    outputs: outs,
                    fwd: fbn.fwd.into(),
                    bwd_input: fbn.bwd_input.into(),
                    bwd_weight: fbn.bwd_weight.into(),
                });
            }
            index.insert(f.profile_key.clone(), self.entries.len());
            self.entries.push(WorkItem {
                key: f.profile_key.clone(),
                op: node.op.op_type().to_string(),
                attrs,
                inputs,
                outputs,
                kind: f.kind.name().into(),
                gemm_like: f.kind.is_gemm_like(),
                align_dims: f.align_dims.clone(),
                fwd: f.fwd.into(),
                bwd_input: f.bwd_input.into(),
                bwd_weight: f.bwd_weight.into(),
                uses: BTreeMap::from([(name.to_string(), 1)]),
                attr_variants: 0,
                at_batches,
            });
        }
        self.models.push(ModelRef { name: name.into(), family: family.into(), nodes });
        Ok(())
    }
}

/// The tensor behind `v` when it is an initializer or a `Constant`'s output.
fn constant_tensor(graph: &Graph, v: ValueId) -> Option<&qsync_ir::Tensor> {
    if let ValueDef::Init(t) = &graph.value(v).def {
        return Some(t);
    }
    let (p, _) = graph.producer(v)?;
    let node = graph.node(p);
    match (&node.op, node.attr("value")) {
        (Op::Constant, Some(Attr::Tensor(t))) => Some(t),
        _ => None,
    }
}

fn attr_json(a: &Attr) -> Value {
    let floats = |v: &[f32]| Value::from(v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>());
    match a {
        Attr::Int(i) => Value::from(*i),
        Attr::Float(f) => Value::from(f64::from(*f)),
        Attr::String(s) => Value::from(String::from_utf8_lossy(s).into_owned()),
        Attr::Ints(v) => Value::from(v.clone()),
        Attr::Floats(v) => floats(v),
        Attr::Strings(v) => Value::from(v.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect::<Vec<_>>()),
        Attr::Tensor(t) if t.numel() <= MAX_CONST_VALUES => {
            serde_json::json!({ "dtype": t.dtype.name(), "dims": t.dims, "values": t.as_f64s() })
        }
        Attr::Tensor(t) => serde_json::json!({ "dtype": t.dtype.name(), "dims": t.dims }),
        Attr::Tensors(_) | Attr::Raw { .. } => Value::Null,
    }
}

/// Measured microseconds of one entry at one precision.
///
/// On a GPU, `*_host_us` are the host's time per call of the same
/// measurements (what issuing the call cost the CPU: Python, dispatch,
/// launch), which a training step waits for where its kernels are shorter;
/// `bwd_both_us` times both gradients asked for in one call. The harness
/// floor is not taken off them: they are what the host spent.
#[derive(Copy, Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct Times {
    pub fwd_us: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_input_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_weight_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_both_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd_host_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_input_host_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_weight_host_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_both_host_us: Option<f64>,
    /// Per phase (forward, input gradient, weight gradient): whether the
    /// host took at least [`HOST_BOUND`] of the measured time, so the GPU
    /// waited for it and the time bounds the kernels from above without
    /// measuring them. Set by [`Measurements::without_harness_floor`] from
    /// the raw times; a fit for a profile that prices the host leaves such
    /// phases out ([`fit_rates_with`]).
    #[serde(skip)]
    pub host_bound: [bool; 3],
}

/// A worklist entry with its measurements.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct MeasuredItem {
    #[serde(flatten)]
    pub item: WorkItem,
    #[serde(default)]
    pub measured: BTreeMap<Precision, Times>,
    /// Precisions not measured, with the reason.
    #[serde(default)]
    pub skipped: BTreeMap<String, String>,
    /// Times at the entry's `at_batches`, per precision.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub at_batches_measured: BTreeMap<Precision, Vec<BatchTimes>>,
}

/// Measured microseconds at one of the entry's other batches.
#[derive(Copy, Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct BatchTimes {
    pub batch: i64,
    #[serde(flatten)]
    pub times: Times,
}

/// What the measuring script writes (schema [`MEASUREMENTS_SCHEMA`]).
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct Measurements {
    pub schema: String,
    /// The worklist's batch (the batch of every entry's shapes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<i64>,
    /// GPU, driver, framework versions, date.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    pub models: Vec<ModelRef>,
    pub entries: Vec<MeasuredItem>,
    #[serde(default)]
    pub casts: Vec<CastSamples>,
    #[serde(default)]
    pub optimizers: Vec<OptimizerSamples>,
}

impl Measurements {
    /// Parse and check a measurement file; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Measurements> {
        let bad = |message: String| CostError::Profile { file: file.into(), message };
        let m: Measurements = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if m.schema != MEASUREMENTS_SCHEMA {
            return Err(bad(format!("schema `{}` is not `{MEASUREMENTS_SCHEMA}`", m.schema)));
        }
        for e in &m.entries {
            for (p, t) in &e.measured {
                for (what, v) in
                    [("fwd_us", Some(t.fwd_us)), ("bwd_input_us", t.bwd_input_us), ("bwd_weight_us", t.bwd_weight_us)]
                {
                    if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
                        return Err(bad(format!("{} at {p}: {what} must be a non-negative number", e.item.key)));
                    }
                }
            }
            for (p, pts) in &e.at_batches_measured {
                for bt in pts {
                    if !e.item.at_batches.iter().any(|a| a.batch == bt.batch) {
                        return Err(bad(format!(
                            "{} at {p}: batch {} is not among its at_batches",
                            e.item.key, bt.batch
                        )));
                    }
                    let t = &bt.times;
                    for v in [Some(t.fwd_us), t.bwd_input_us, t.bwd_weight_us].into_iter().flatten() {
                        if !(v.is_finite() && v >= 0.0) {
                            return Err(bad(format!(
                                "{} at {p}, batch {}: times must be non-negative",
                                e.item.key, bt.batch
                            )));
                        }
                    }
                }
            }
            if let Some(u) = e.item.uses.keys().find(|u| !m.models.iter().any(|x| &x.name == *u)) {
                return Err(bad(format!("{}: used by `{u}`, which is not among the models", e.item.key)));
            }
        }
        Ok(m)
    }
}

/// The measuring harness's own time per call, per phase (µs): what a call
/// costs the harness beyond the device's work (Python dispatch; for the
/// backward phases a whole `torch.autograd.grad`). On a GPU the host runs
/// ahead of the device in a training loop, so this is not device time.
#[derive(Copy, Clone, PartialEq, Debug, Serialize)]
pub struct HarnessFloor {
    pub fwd_us: f64,
    pub bwd_input_us: f64,
    pub bwd_weight_us: f64,
    /// `measured` (the script timed a call doing almost no work and wrote
    /// `harness_floor_*_us` into `meta`) or `estimated` (the smallest time
    /// measured for that phase over every entry).
    pub source: &'static str,
}

impl Measurements {
    /// How to read the entries' host times ([`HostModel`]), when this is a
    /// GPU's measurement that carries them and the harness's host floors;
    /// overheads 1 until [`fit_host_overhead`] sets them.
    pub fn host_model(&self) -> Option<HostModel> {
        let any = self.entries.iter().any(|e| e.measured.values().any(|t| t.fwd_host_us.is_some()));
        let meta = |k: &str| self.meta.get(&format!("harness_floor_{k}_host_us")).and_then(|v| v.parse::<f64>().ok());
        match (self.on_gpu() && any, meta("fwd"), meta("bwd_input"), meta("bwd_weight")) {
            (true, Some(f), Some(i), Some(w)) => Some(HostModel {
                harness_fwd_us: f,
                harness_bwd_input_us: i,
                harness_bwd_weight_us: w,
                overhead_fwd: 1.0,
                overhead_bwd: 1.0,
                overhead_source: "none fitted: the isolated ops' host times".into(),
            }),
            _ => None,
        }
    }

    /// Whether the times are a GPU's (CUDA events), where the harness floor
    /// is host time the device does not spend (see [`HarnessFloor`]). On a
    /// CPU device the host's dispatch is the device's own time.
    pub fn on_gpu(&self) -> bool {
        self.meta.get("method").is_some_and(|m| m.starts_with("CUDA events"))
    }

    /// The harness floor: from `meta` when the script measured it, else
    /// estimated per phase as the smallest time measured for it. A
    /// measured floor is capped per phase by that smallest time: no call
    /// timed the same way can cost less than the harness itself, so a floor
    /// above it was measured in other conditions (on the H100, a floor
    /// timed before the entries read 15 / 108 / 138 µs while entries went
    /// down to 4.6 / 53 / 65 µs).
    pub fn harness_floor(&self) -> Option<HarnessFloor> {
        let mut min = [f64::INFINITY; 3];
        let mut see = |t: &Times| {
            for (slot, v) in [Some(t.fwd_us), t.bwd_input_us, t.bwd_weight_us].into_iter().enumerate() {
                if let Some(v) = v.filter(|&v| v > 0.0) {
                    min[slot] = min[slot].min(v);
                }
            }
        };
        for e in &self.entries {
            e.measured.values().for_each(&mut see);
            e.at_batches_measured.values().flatten().for_each(|bt| see(&bt.times));
        }
        let meta = |k: &str| self.meta.get(&format!("harness_floor_{k}_us")).and_then(|v| v.parse::<f64>().ok());
        if let (Some(f), Some(i), Some(w)) = (meta("fwd"), meta("bwd_input"), meta("bwd_weight")) {
            let floor = [f, i, w];
            let capped = floor.iter().zip(&min).any(|(f, m)| f > m);
            let at = |slot: usize| floor[slot].min(min[slot]);
            return Some(HarnessFloor {
                fwd_us: at(0),
                bwd_input_us: at(1),
                bwd_weight_us: at(2),
                source: if capped { "measured, capped by the fastest entry" } else { "measured" },
            });
        }
        // A phase nobody measured has nothing to take a floor off.
        let or_zero = |v: f64| if v.is_finite() { v } else { 0.0 };
        min.iter().any(|v| v.is_finite()).then(|| HarnessFloor {
            fwd_us: or_zero(min[0]),
            bwd_input_us: or_zero(min[1]),
            bwd_weight_us: or_zero(min[2]),
            source: "estimated",
        })
    }

    /// Every phase time less the harness floor, plus one kernel launch of
    /// `device` (the floor's own call launched one): `launch + max(t − floor, 0)`.
    pub fn without_harness_floor(&self, floor: &HarnessFloor, launch_us: f64) -> Measurements {
        let fix = |t: &mut Times| {
            let bound = |v: Option<f64>, h: Option<f64>| matches!((v, h), (Some(v), Some(h)) if h >= HOST_BOUND * v);
            t.host_bound = [
                bound(Some(t.fwd_us), t.fwd_host_us),
                bound(t.bwd_input_us, t.bwd_input_host_us),
                bound(t.bwd_weight_us, t.bwd_weight_host_us),
            ];
            let less = |v: f64, f: f64| launch_us + (v - f).max(0.0);
            t.fwd_us = less(t.fwd_us, floor.fwd_us);
            t.bwd_input_us = t.bwd_input_us.map(|v| less(v, floor.bwd_input_us));
            t.bwd_weight_us = t.bwd_weight_us.map(|v| less(v, floor.bwd_weight_us));
        };
        let mut m = self.clone();
        for e in &mut m.entries {
            e.measured.values_mut().for_each(fix);
            e.at_batches_measured.values_mut().flatten().for_each(|bt| fix(&mut bt.times));
        }
        m
    }
}

/// One rate class of the fit.
#[derive(Clone, PartialEq, Debug, Serialize)]
pub struct ClassFit {
    /// `tensor_core.fp16`, `cuda_core.fp32`, `memory`.
    pub class: String,
    pub before: f64,
    pub after: f64,
    /// Measured phases in the class (after the fit).
    pub phases: usize,
    /// Their measured time, weighted by use, in µs.
    pub measured_us: f64,
}

/// What [`fit_rates`] did.
#[derive(Clone, PartialEq, Debug, Serialize)]
pub struct FitReport {
    pub classes: Vec<ClassFit>,
    /// Use-weighted Σ predicted / Σ measured over every fitted phase.
    pub total_ratio_before: f64,
    pub total_ratio_after: f64,
    /// Median of |predicted − measured| / measured over the phases.
    pub median_rel_err_before: f64,
    pub median_rel_err_after: f64,
    pub phases: usize,
}

/// A measured phase for the fit.
struct Sample {
    work: Work,
    kind: Option<Kind>,
    forward: bool,
    gemm_like: bool,
    tc: bool,
    p: Precision,
    seconds: f64,
    weight: f64,
}

impl Sample {
    /// The kind, when this is a forward phase of a kind whose work the
    /// roofline does not count ([`Kind::has_uncounted_work`]): left out of
    /// the rate fit, it sets its kind's factor instead.
    fn uncounted_kind(&self) -> Option<Kind> {
        self.kind.filter(|k| self.forward && k.has_uncounted_work())
    }

    fn uncounted(&self) -> bool {
        self.uncounted_kind().is_some()
    }
}

const FIT_ROUNDS: usize = 40;
/// A kind of operator gets a factor of its own ([`ProfileEfficiency::kinds`])
/// only from at least this many phases.
pub const MIN_KIND_PHASES: usize = 4;
const MIN_EFFICIENCY: f64 = 0.01;
/// Phases whose time beyond launches is at most this fraction of their
/// measurement are left out of the fit.
const LAUNCH_DOMINATED: f64 = 0.2;

fn class_of(device: &Device, s: &Sample, bound: Bound) -> (u8, Precision) {
    match bound {
        Bound::TensorCore => (0, s.p),
        Bound::CudaCore => (1, if device.cuda_peak(s.p) > 0.0 { s.p } else { Precision::Fp32 }),
        Bound::Memory => (2, Precision::Fp32),
    }
}

fn predict(device: &Device, rates: &Rates, s: &Sample) -> (f64, f64, Bound) {
    let t = roofline(device, rates, &s.work, s.gemm_like, s.p, s.tc);
    (t.body, t.launch, t.bound)
}

fn report_stats(device: &Device, rates: &Rates, samples: &[Sample], kinds: &BTreeMap<Kind, f64>) -> (f64, f64) {
    let (mut pred, mut meas) = (0.0, 0.0);
    let mut errs: Vec<f64> = Vec::with_capacity(samples.len());
    for s in samples {
        let (body, launch, _) = predict(device, rates, s);
        let body = body * s.uncounted_kind().and_then(|k| kinds.get(&k)).copied().unwrap_or(1.0);
        pred += (body + launch) * s.weight;
        meas += s.seconds * s.weight;
        errs.push(((body + launch - s.seconds) / s.seconds).abs());
    }
    errs.sort_by(f64::total_cmp);
    let median = if errs.is_empty() { 0.0 } else { errs[errs.len() / 2] };
    (if meas > 0.0 { pred / meas } else { 1.0 }, median)
}

/// Fit the fractions of peak of `device` to the measured phases of the
/// entries used by `models` (see the module doc). Returns the fitted rates
/// as profile efficiencies (only the classes that had data) and a report.
pub fn fit_rates(
    device: &Device,
    entries: &[MeasuredItem],
    models: &BTreeSet<String>,
) -> (ProfileEfficiency, FitReport) {
    fit_rates_with(device, entries, models, false)
}

/// With the host priced, phases measured at the host's pace leave the fit;
/// a class left with fewer phases than this keeps its datasheet rate (on
/// the H200 two or three 16-bit tensor-core phases fitted 0.09–0.17 of
/// peak and priced VGG-16's convolutions several times too slow).
pub const MIN_CLASS_PHASES_HOST: usize = 8;

/// [`fit_rates`], and with `host_model` (the profile prices the host) the
/// phases measured at the host's pace ([`Times::host_bound`]) left out and
/// a class moving off its datasheet rate only with at least
/// [`MIN_CLASS_PHASES_HOST`] phases.
pub fn fit_rates_with(
    device: &Device,
    entries: &[MeasuredItem],
    models: &BTreeSet<String>,
    host_model: bool,
) -> (ProfileEfficiency, FitReport) {
    let min_phases = if host_model { MIN_CLASS_PHASES_HOST } else { 1 };
    let mut samples = Vec::new();
    for e in entries {
        let weight: f64 = e.item.uses.iter().filter(|(m, _)| models.contains(*m)).map(|(_, &n)| f64::from(n)).sum();
        if weight == 0.0 {
            continue;
        }
        for (&p, t) in &e.measured {
            if p == Precision::Int8 || !device.supports(p) {
                continue;
            }
            let tc = tensor_core_eligible(device, e.item.gemm_like, &e.item.align_dims, p);
            // The entry at its main batch, then at its other batches.
            let mut points = vec![(e.item.fwd, e.item.bwd_input, e.item.bwd_weight, *t)];
            for bt in e.at_batches_measured.get(&p).into_iter().flatten() {
                if let Some(a) = e.item.at_batches.iter().find(|a| a.batch == bt.batch) {
                    points.push((a.fwd, a.bwd_input, a.bwd_weight, bt.times));
                }
            }
            for (fwd, bwd_input, bwd_weight, t) in points {
                let phases = [(fwd, Some(t.fwd_us)), (bwd_input, t.bwd_input_us), (bwd_weight, t.bwd_weight_us)];
                for (i, ((w, v), host_bound)) in phases.into_iter().zip(t.host_bound).enumerate() {
                    let work = Work::from(w);
                    // The host's pace says nothing about the device's rates.
                    if host_bound && host_model {
                        continue;
                    }
                    if let Some(us) = v.filter(|&us| us > 0.0 && !work.is_empty()) {
                        samples.push(Sample {
                            work,
                            kind: Kind::from_name(&e.item.kind),
                            forward: i == 0,
                            gemm_like: e.item.gemm_like,
                            tc,
                            p,
                            seconds: us * 1e-6,
                            weight,
                        });
                    }
                }
            }
        }
    }
    let start = Rates::of(device);
    let mut rates = start;
    let get = |r: &Rates, (c, p): (u8, Precision)| match c {
        0 => r.tensor_core[p.index()],
        1 => r.cuda_core[p.index()],
        _ => r.memory,
    };
    let mut seen: BTreeMap<(u8, Precision), (usize, f64)> = BTreeMap::new();
    for _ in 0..FIT_ROUNDS {
        // Per class: Σ predicted body and Σ measured time beyond launches.
        let mut sums: BTreeMap<(u8, Precision), (f64, f64, usize)> = BTreeMap::new();
        // Work the roofline does not count says nothing about the rates.
        for s in samples.iter().filter(|s| !s.uncounted()) {
            let (body, launch, bound) = predict(device, &rates, s);
            // A phase whose measurement is mostly the assumed launch
            // overhead says nothing about rates (and may be below it).
            let target = s.seconds - launch;
            if target <= LAUNCH_DOMINATED * s.seconds {
                continue;
            }
            let e = sums.entry(class_of(device, s, bound)).or_default();
            e.0 += body * s.weight;
            e.1 += target * s.weight;
            e.2 += 1;
        }
        seen = sums.iter().map(|(&k, &(_, m, n))| (k, (n, m))).collect();
        for (&k, &(pred, meas, n)) in &sums {
            if pred <= 0.0 || meas <= 0.0 || n < min_phases {
                continue;
            }
            let v = (get(&rates, k) * pred / meas).clamp(MIN_EFFICIENCY, MAX_PROFILE_EFFICIENCY);
            match k.0 {
                0 => rates.tensor_core[k.1.index()] = v,
                1 => rates.cuda_core[k.1.index()] = v,
                _ => rates.memory = v,
            }
        }
    }
    // Per kind of operator whose work the roofline does not count, at the
    // fitted rates: how much longer its forward phases (where that work is,
    // left out of the rate fit) ran than their roofline (a kind with too
    // few phases keeps 1). Every other kind is priced by its rate class
    // alone: a factor for each moves the memory-bound kinds against one
    // another by what differs between the measured models (on the CPU,
    // ResNet-50's DRAM-bound activations gave elementwise ops 0.55 and
    // BERT-tiny's ran from the caches: docs/validation-compute.md).
    let mut by_kind: BTreeMap<Kind, (f64, f64, usize)> = BTreeMap::new();
    for s in &samples {
        let Some(k) = s.uncounted_kind() else { continue };
        let (body, launch, _) = predict(device, &rates, s);
        let target = s.seconds - launch;
        if target > LAUNCH_DOMINATED * s.seconds && body > 0.0 {
            let e = by_kind.entry(k).or_default();
            e.0 += body * s.weight;
            e.1 += target * s.weight;
            e.2 += 1;
        }
    }
    let kinds: BTreeMap<Kind, f64> = by_kind
        .iter()
        .filter(|(_, &(_, _, n))| n >= MIN_KIND_PHASES.max(min_phases))
        .map(|(&k, &(pred, meas, _))| (k, (meas / pred).clamp(MIN_KIND_FACTOR, MAX_KIND_FACTOR)))
        .collect();
    let (ratio_before, med_before) = report_stats(device, &start, &samples, &BTreeMap::new());
    let (ratio_after, med_after) = report_stats(device, &rates, &samples, &kinds);
    let mut eff = ProfileEfficiency::default();
    let mut classes = Vec::new();
    let mut fitted: BTreeSet<(u8, Precision)> = seen.keys().copied().collect();
    // A class that held phases in an earlier round keeps the rate it was
    // given then, even if the last round moved them all to another bound.
    fitted.extend(
        Precision::ALL.iter().flat_map(|&p| [(0u8, p), (1u8, p)]).filter(|&k| get(&rates, k) != get(&start, k)),
    );
    if rates.memory != start.memory {
        fitted.insert((2, Precision::Fp32));
    }
    for k in fitted {
        let v = get(&rates, k);
        let class = match k.0 {
            0 => {
                eff.tensor_core.insert(k.1, v);
                format!("tensor_core.{}", k.1)
            }
            1 => {
                eff.cuda_core.insert(k.1, v);
                format!("cuda_core.{}", k.1)
            }
            _ => {
                eff.memory = Some(v);
                "memory".to_string()
            }
        };
        let (phases, meas) = seen.get(&k).copied().unwrap_or((0, 0.0));
        classes.push(ClassFit { class, before: get(&start, k), after: v, phases, measured_us: meas * 1e6 });
    }
    for (&k, &v) in &kinds {
        eff.kinds.insert(k.name().to_string(), v);
        let (_, meas, n) = by_kind[&k];
        classes.push(ClassFit {
            class: format!("kind.{}", k.name()),
            before: 1.0,
            after: v,
            phases: n,
            measured_us: meas * 1e6,
        });
    }
    let report = FitReport {
        classes,
        total_ratio_before: ratio_before,
        total_ratio_after: ratio_after,
        median_rel_err_before: med_before,
        median_rel_err_after: med_after,
        phases: samples.len(),
    };
    (eff, report)
}

/// Build the calibration profile of `device` from the measurements of every
/// model whose family is not in `exclude_families`: their measured ops,
/// the cast and optimizer samples, and fitted rates. Errors when nothing is
/// left or a family to exclude is unknown.
pub fn build_profile(m: &Measurements, device: &Device, exclude_families: &[String]) -> Result<(Profile, FitReport)> {
    build_profile_with(m, device, exclude_families, false)
}

/// [`build_profile`], and with `host_model` a profile that prices the host
/// ([`HostModel`], when the measurements timed it): phases measured at the
/// host's pace ([`Times::host_bound`]) leave the rate fit and only cap
/// their kernels; [`fit_host_overhead`] then fits its overheads. Without
/// it the host times are kept as data and nothing reads them.
pub fn build_profile_with(
    m: &Measurements,
    device: &Device,
    exclude_families: &[String],
    host_model: bool,
) -> Result<(Profile, FitReport)> {
    let bad = |message: String| CostError::Profile { file: "measurements".into(), message };
    // A GPU's times lose the harness's own per-call time first (see
    // `HarnessFloor`): the ops and the fit see device time.
    let floor = if m.on_gpu() { m.harness_floor() } else { None };
    let corrected = floor.map(|f| m.without_harness_floor(&f, device.launch_overhead_us));
    let m = corrected.as_ref().unwrap_or(m);
    for f in exclude_families {
        if !m.models.iter().any(|x| &x.family == f) {
            let known: BTreeSet<&str> = m.models.iter().map(|x| x.family.as_str()).collect();
            return Err(bad(format!(
                "no model of family `{f}` was measured (families: {})",
                known.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
    }
    let models: BTreeSet<String> =
        m.models.iter().filter(|x| !exclude_families.contains(&x.family)).map(|x| x.name.clone()).collect();
    if models.is_empty() {
        return Err(bad("every measured model is excluded".into()));
    }
    let mut ops = Vec::new();
    let mut ambiguous = 0;
    for e in &m.entries {
        if !e.item.uses.keys().any(|u| models.contains(u)) {
            continue;
        }
        // The profile key names shapes, not attributes: when nodes with
        // different attributes share it (SqueezeNet's stride-2 and VGG's
        // stride-1 first convolutions), one measurement would stand for
        // both. Such keys get no exact override; the fitted rates cost them.
        if e.item.attr_variants > 0 {
            ambiguous += 1;
            continue;
        }
        for (&p, t) in &e.measured {
            let batch_points: Vec<BatchPoint> = e
                .at_batches_measured
                .get(&p)
                .into_iter()
                .flatten()
                .filter_map(|bt| {
                    let a = e.item.at_batches.iter().find(|a| a.batch == bt.batch)?;
                    Some(BatchPoint {
                        batch: bt.batch,
                        inputs: Some(a.inputs.clone()),
                        fwd_us: bt.times.fwd_us,
                        bwd_input_us: bt.times.bwd_input_us,
                        bwd_weight_us: bt.times.bwd_weight_us,
                    })
                })
                .collect();
            ops.push(OpSample {
                op: e.item.op.clone(),
                inputs: e.item.inputs.iter().map(|i| i.as_ref().map(|i| i.shape.clone())).collect(),
                precision: p,
                fwd_us: t.fwd_us,
                bwd_input_us: t.bwd_input_us,
                bwd_weight_us: t.bwd_weight_us,
                host_us: HostTimes::of(t),
                batch: if batch_points.is_empty() { None } else { m.batch },
                batch_points: if m.batch.is_some() { batch_points } else { Vec::new() },
            });
        }
    }
    let (efficiency, report) = fit_rates_with(device, &m.entries, &models, host_model);
    let mut meta = m.meta.clone();
    meta.insert("profiled_models".into(), models.iter().cloned().collect::<Vec<_>>().join(","));
    if let Some(f) = floor {
        meta.insert(
            "harness_floor_removed".into(),
            format!(
                "{}: fwd {:.1} us, bwd_input {:.1} us, bwd_weight {:.1} us per call, each phase then given one {} us launch",
                f.source, f.fwd_us, f.bwd_input_us, f.bwd_weight_us, device.launch_overhead_us
            ),
        );
    }
    if ambiguous > 0 {
        meta.insert("ambiguous_keys_left_out".into(), ambiguous.to_string());
    }
    if !exclude_families.is_empty() {
        meta.insert("excluded_families".into(), exclude_families.join(","));
    }
    let host = if host_model { m.host_model() } else { None };
    let profile = Profile {
        device: Some(device.name.clone()),
        meta,
        efficiency: Some(efficiency),
        ops,
        casts: m.casts.clone(),
        optimizers: m.optimizers.clone(),
        host,
    };
    // What we write must be what `--calibration` accepts.
    let text = serde_json::to_string(&profile).map_err(|e| bad(e.to_string()))?;
    Profile::from_json(&text, "built profile")?;
    Ok((profile, report))
}

/// One measured training run, as `scripts/gpu/train.py` writes it
/// (`qsync-iterations/1`; the fields the host fit reads).
#[derive(Clone, Debug, Deserialize)]
pub struct TrainingRun {
    pub model: String,
    /// The model file (`resnet50_train.onnx`): its stem names the model in
    /// the measurements' `uses`.
    pub qsync_model: String,
    pub family: String,
    /// `fp32`, `tf32`, `amp_fp16` or `amp_bf16`.
    pub precision: String,
    /// Each phase's GPU time (`forward`, `backward`, `optimizer`).
    #[serde(default)]
    pub phases_ms: BTreeMap<String, f64>,
    /// The host's time issuing each phase.
    #[serde(default)]
    pub host_phases_ms: BTreeMap<String, f64>,
    /// The median iteration.
    #[serde(default)]
    pub median_ms: Option<f64>,
    /// The kernels' time per iteration (torch.profiler).
    #[serde(default)]
    pub kernels: Option<RunKernels>,
}

/// A training run's kernel time (the field the host fit reads).
#[derive(Clone, Debug, Deserialize)]
pub struct RunKernels {
    pub kernels_us: f64,
}

/// A `qsync-iterations/1` file.
#[derive(Clone, Debug, Deserialize)]
pub struct TrainingRuns {
    pub schema: String,
    pub runs: Vec<TrainingRun>,
}

impl TrainingRuns {
    pub fn from_json(text: &str, file: &str) -> Result<TrainingRuns> {
        let bad = |message: String| CostError::Profile { file: file.into(), message };
        let r: TrainingRuns = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if r.schema != "qsync-iterations/1" {
            return Err(bad(format!("schema `{}` is not `qsync-iterations/1`", r.schema)));
        }
        Ok(r)
    }
}

/// A measured phase whose host time is at least this fraction of its GPU
/// time had the GPU waiting for the host: its time is the host's pace.
pub const HOST_BOUND: f64 = 0.9;

/// A training run whose kernels keep the GPU busy less than this fraction
/// of the iteration is host-bound (its phases' host times are the host's
/// own, not time spent blocked behind a full launch queue).
pub const HOST_BOUND_RUN: f64 = 0.75;

/// Fit `profile.host`'s overheads: per phase (forward, backward), the
/// host's time in the host-bound phases of `runs` over what the profile's
/// isolated ops' host times add up to for those models (each op of the
/// model at the run's precision, AMP's at its 16-bit type where measured,
/// else FP32). Runs of `exclude_families` are left out, as their ops are;
/// a phase with no host-bound run keeps 1. Returns what was fitted.
pub fn fit_host_overhead(
    profile: &mut Profile,
    m: &Measurements,
    runs: &TrainingRuns,
    exclude_families: &[String],
) -> Result<String> {
    let Some(mut host) = profile.host.clone() else {
        return Err(CostError::Profile {
            file: "measurements".into(),
            message: "no host times (measured before scripts/gpu/profile.py timed the host): \
                      nothing to fit --iterations to"
                .into(),
        });
    };
    let mut sums = [(0.0f64, 0.0f64, 0usize); 2];
    let mut used = Vec::new();
    for r in &runs.runs {
        if exclude_families.contains(&r.family) {
            continue;
        }
        // Only a run the GPU waited through: elsewhere the host blocks
        // behind the kernels and its time is theirs.
        match (&r.kernels, r.median_ms) {
            (Some(k), Some(it)) if it > 0.0 && k.kernels_us * 1e-3 < HOST_BOUND_RUN * it => {}
            _ => continue,
        }
        let model = r.qsync_model.trim_end_matches(".onnx");
        let p = match r.precision.as_str() {
            "fp32" => Precision::Fp32,
            "tf32" => Precision::Tf32,
            "amp_fp16" => Precision::Fp16,
            "amp_bf16" => Precision::Bf16,
            _ => continue,
        };
        let (mut fwd, mut bwd, mut seen) = (0.0, 0.0, false);
        for e in &m.entries {
            let Some(&n) = e.item.uses.get(model) else { continue };
            let Some(t) = e.measured.get(&p).or_else(|| e.measured.get(&Precision::Fp32)) else { continue };
            let Some(h) = HostTimes::of(t) else { continue };
            let (f, b) = host.isolated_us(&h);
            fwd += f64::from(n) * f;
            bwd += f64::from(n) * b.unwrap_or(0.0);
            seen = true;
        }
        if !seen {
            continue;
        }
        let mut took = Vec::new();
        for (slot, (phase, isolated)) in [("forward", fwd), ("backward", bwd)].into_iter().enumerate() {
            let (Some(&h), Some(&g)) = (r.host_phases_ms.get(phase), r.phases_ms.get(phase)) else { continue };
            if isolated > 0.0 && h >= HOST_BOUND * g {
                sums[slot].0 += h * 1e3;
                sums[slot].1 += isolated;
                sums[slot].2 += 1;
                took.push(phase);
            }
        }
        if !took.is_empty() {
            used.push(format!("{} {} ({})", r.model, r.precision, took.join(", ")));
        }
    }
    let ratio = |(h, i, n): (f64, f64, usize)| if n > 0 && i > 0.0 { h / i } else { 1.0 };
    host.overhead_fwd = ratio(sums[0]);
    host.overhead_bwd = ratio(sums[1]);
    host.overhead_source = if used.is_empty() {
        "no host-bound training run: the isolated ops' host times".into()
    } else {
        format!("host-bound phases of {}", used.join("; "))
    };
    let note = format!(
        "host overhead: forward x{:.2}, backward x{:.2} ({})",
        host.overhead_fwd, host.overhead_bwd, host.overhead_source
    );
    profile.host = Some(host);
    Ok(note)
}
