//! Materialization: turn a plan (each node's `precision` annotation) into
//! the casts that make the graph compute it.
//!
//! **Reads:** `Node::precision` (a node without one, or one that
//! [`lowerable`] rejects, computes in the dtypes the graph already has), value
//! dtypes and shapes, initializer data (inference mode and INT8 weight scales).
//! **Guarantees:**
//! - every float input of a node planned at float precision `p` has dtype `p`
//!   (except [`pinned_input`] slots, which keep their dtype), and its float
//!   outputs have dtype `p` (except [`pinned_output`] slots);
//! - one Cast per (value, target dtype), shared by every consumer, named
//!   `{value}.cast_{dtype}` (node and output alike); a cast of a cast is
//!   never made — casts always read the original value;
//! - graph inputs and outputs keep their dtypes: an output produced at another
//!   precision is renamed `{value}.{dtype}` and a Cast back writes the
//!   original name;
//! - a value captured by a node's subgraphs is read at its original dtype
//!   (a cast back when its producer computes at another precision), as the
//!   bodies are not rewritten;
//! - integer and bool values are never cast; Shape / Size / Cast read any dtype;
//! - training mode ([`Mode::Training`]): initializers stay FP32 masters, cast
//!   once per (initializer, dtype) per iteration — visible to the cost model;
//!   inference mode stores the converted weights instead (round to nearest
//!   even via `half`), reusing the original name when no FP32 use remains;
//! - INT8 / FP8 compute is a QuantizeLinear → DequantizeLinear pair on each
//!   float input with the op itself in FP32 — runnable in onnxruntime, and the
//!   op's output is FP32 as QSync's INT8 kernels' is. Scales are symmetric
//!   per tensor, `absmax / qmax` ([`super::qscale`]): a weight's from its
//!   initializer's values, an activation's from the calibrated
//!   [`ActivationRanges`] ([`materialize_with`]). A node planned INT8 that
//!   reads an activation without a calibrated range computes in f32 instead
//!   (counted in [`MaterializeStats::kept_uncalibrated`]): no scale is ever
//!   guessed for an INT8 activation. FP8 activations without a range keep
//!   scale 1 (the format's own range). An initializer whose data is absent
//!   has no values to scale by: its scale is 1/qmax (INT8) or 1 (FP8), to be
//!   recomputed by whoever supplies the weights.
//!
//! **Requires:** `infer-shapes` has run (dtypes known); the graph is acyclic.

use std::collections::HashMap;

use super::qscale::{self, ActivationRanges};
use qsync_ir::{
    Attr, DType, Graph, Model, NodeId, NodeSpec, Op, OpClass, Tensor, TensorData, TensorType, ValueDef, ValueId,
    CAPTURE_SLOT,
};

/// Whether weights keep FP32 master copies.
#[derive(Copy, Clone, PartialEq, Eq, Debug, Default)]
pub enum Mode {
    /// FP32 master weights, cast per use each iteration.
    #[default]
    Training,
    /// Weights stored in the low precision.
    Inference,
}

/// What materialization added.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaterializeStats {
    pub casts: usize,
    /// Of `casts`, those reading an initializer (per-iteration weight casts).
    pub weight_casts: usize,
    pub qdq_pairs: usize,
    pub converted_weights: usize,
    /// Nodes planned at a float precision their ONNX schema refuses at the
    /// model's opset (the raised one, if raised), computed in f32 instead
    /// (see [`respect_type_constraints`]).
    pub kept_by_schema: usize,
    /// The opset was raised `(from, to)` so that this many planned nodes
    /// compute in their precision (see [`respect_type_constraints`]).
    pub opset_raised: Option<(i64, i64, usize)>,
    /// Why the opset could not be raised for the nodes that would have
    /// needed it (they are in `kept_by_schema`).
    pub opset_blocked: Option<String>,
    /// Nodes planned INT8 that read an activation without a calibrated
    /// range, computed in f32 instead.
    pub kept_uncalibrated: usize,
    /// The first of them (schedule order) and the value it lacks a range
    /// for, to name in a warning.
    pub first_uncalibrated: Option<(String, String)>,
}

impl MaterializeStats {
    /// The warning for [`Self::kept_uncalibrated`], said once; `None` when
    /// every INT8 node was calibrated.
    pub fn uncalibrated_warning(&self, calibrated_values: usize) -> Option<String> {
        let (node, value) = self.first_uncalibrated.as_ref()?;
        let n = self.kept_uncalibrated;
        let what = if n == 1 { "1 node".to_string() } else { format!("{n} nodes") };
        Some(if calibrated_values == 0 {
            format!(
                "no calibration statistics: activations kept out of INT8 ({what} planned i8 computed in f32, first \
                 `{node}` reading `{value}`); pass --stats"
            )
        } else {
            format!(
                "{what} planned i8 read an activation the calibration statistics have no range for (first: `{node}` \
                 reading `{value}`): computed in f32, not INT8"
            )
        })
    }
}

/// What [`respect_type_constraints`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchemaOutcome {
    /// Nodes moved to f32.
    pub kept: usize,
    /// `(from, to, nodes)`: the opset was raised so that `nodes` planned
    /// nodes keep their precision.
    pub raised: Option<(i64, i64, usize)>,
    /// Why the opset was not raised although some nodes needed it.
    pub blocked: Option<String>,
}

/// Every plan is materialized here, so this is where it meets the ONNX
/// schemas. A node planned at a float precision that one of the inputs a
/// plan casts (every float input but the pinned ones) does not accept at
/// the model's opset (`Celu` is f32-only; `Conv` and `MaxPool` take bf16
/// only from opset 22; most ops lack bf16 before 13) either gets the opset
/// it needs — the model's opset is raised to the lowest one (at most
/// [`qsync_ir::upgrade::UPGRADE_TO`]) at which every such node that some
/// opset accepts is accepted, when [`qsync_ir::upgrade::upgrade_opset`]
/// can rewrite the model — or computes in f32, and materialization casts
/// around it like any f32 node. PyTorch's autocast runs convolutions in
/// bf16, so an AMP BF16 plan priced with them at f32 was several times
/// too slow for a CNN.
pub fn respect_type_constraints(model: &mut Model) -> SchemaOutcome {
    let opset = model.opset();
    let refused = |m: &Model, at: i64| -> Vec<(NodeId, DType)> {
        let g = &m.graph;
        g.node_ids()
            .into_iter()
            .filter_map(|n| {
                let p = g.node(n).precision.filter(|p| p.is_float())?;
                (qsync_ir::op::node_float_allowed(g, n, at, p) == Some(false)).then_some((n, p))
            })
            .collect()
    };
    let mut out = SchemaOutcome::default();
    let now = refused(model, opset);
    // The lowest opset at which each refused node is accepted, if any is.
    let needs: Vec<i64> = now
        .iter()
        .filter_map(|&(n, p)| {
            (opset + 1..=qsync_ir::upgrade::UPGRADE_TO)
                .find(|&v| qsync_ir::op::node_float_allowed(&model.graph, n, v, p) != Some(false))
        })
        .collect();
    if let Some(&to) = needs.iter().max() {
        match qsync_ir::upgrade::upgrade_opset(model, to) {
            Ok(_) => out.raised = Some((opset, to, needs.len())),
            Err(why) => out.blocked = Some(why),
        }
    }
    let still = if out.raised.is_some() { refused(model, model.opset()) } else { now };
    for (n, _) in still {
        model.graph.node_mut(n).precision = Some(DType::F32);
        out.kept += 1;
    }
    out
}

/// Whether a precision means quantized compute (QDQ around an FP32 op).
pub fn is_quantized(p: DType) -> bool {
    matches!(p, DType::I8 | DType::F8E4M3)
}

/// Whether a node may compute below FP32 at all: known ops with float data,
/// excluding shape computation, casts and quantization, control flow,
/// random generators (Dropout aside), nodes reading a value of unknown
/// dtype, and ops whose type constraints pin
/// FP32 (Range, ConstantOfShape, …) or that the IR keeps opaque.
pub fn lowerable(g: &Graph, n: NodeId) -> bool {
    let node = g.node(n);
    let class_ok = match node.op.class() {
        OpClass::Shape | OpClass::Cast | OpClass::Control | OpClass::Other | OpClass::Opaque => false,
        OpClass::Random => node.op == Op::Dropout,
        _ => true,
    };
    let is_float = |v: &ValueId| g.ty(*v).dtype.is_some_and(DType::is_float);
    // An input of unknown dtype (an untyped control-flow output) cannot be
    // cast to the plan's precision, so the node could not be made to read it.
    let typed = node.inputs().iter().flatten().all(|v| g.ty(*v).dtype.is_some());
    class_ok && typed && (node.inputs().iter().flatten().any(is_float) || node.outputs().iter().any(is_float))
}

/// Float input slots that keep their dtype whatever the node's precision
/// (ONNX gives them their own type variable, or they are FP32 by convention).
pub fn pinned_input(op: &Op, slot: usize) -> bool {
    op.pins_input_dtype(slot)
}

/// Float output slots that keep their dtype (LayerNormalization's mean and
/// inverse std-dev follow `stash_type`, FP32).
pub fn pinned_output(op: &Op, slot: usize) -> bool {
    matches!(op, Op::LayerNormalization) && slot > 0
}

/// Ops that accept an input of any dtype in slot 0.
pub(crate) fn any_dtype_input(op: &Op) -> bool {
    matches!(op, Op::Shape | Op::Size | Op::Cast | Op::CastLike)
}

/// The precision a node computes in after planning, `None` = as the graph is.
pub fn planned_precision(g: &Graph, n: NodeId) -> Option<DType> {
    g.node(n).precision.filter(|&p| (p.is_float() || is_quantized(p)) && lowerable(g, n))
}

struct Materializer<'a> {
    g: &'a mut Graph,
    base_dir: Option<std::path::PathBuf>,
    orig: Vec<Option<DType>>,
    cur: Vec<Option<DType>>,
    casts: HashMap<(ValueId, DType), ValueId>,
    ranges: &'a ActivationRanges,
    stats: MaterializeStats,
}

/// Insert the casts (and QDQ pairs) a plan needs, without calibrated
/// activation ranges: [`materialize_with`] and no ranges, so no node
/// reading an activation is INT8. Errors name the node.
pub fn materialize(model: &mut Model, mode: Mode) -> Result<MaterializeStats, String> {
    materialize_with(model, mode, &ActivationRanges::default())
}

/// Nodes planned INT8 that read an activation `ranges` has no range for
/// compute in f32 instead; returns how many, and the first with the value
/// it lacks a range for (schedule order).
pub fn keep_uncalibrated_out(g: &mut Graph, ranges: &ActivationRanges) -> (usize, Option<(String, String)>) {
    let mut kept = 0;
    let mut first = None;
    for n in g.schedule() {
        if planned_precision(g, n) != Some(DType::I8) {
            continue;
        }
        if let Some(v) = qscale::uncalibrated_input(g, n, ranges) {
            first.get_or_insert_with(|| (g.node(n).name.clone(), g.value_name(v).to_string()));
            g.node_mut(n).precision = Some(DType::F32);
            kept += 1;
        }
    }
    (kept, first)
}

/// Insert the casts (and QDQ pairs) a plan needs; INT8 and FP8 activations
/// are scaled by their calibrated `ranges` (see the module doc). Errors
/// name the node.
pub fn materialize_with(model: &mut Model, mode: Mode, ranges: &ActivationRanges) -> Result<MaterializeStats, String> {
    let schema = respect_type_constraints(model);
    let (kept_uncalibrated, first_uncalibrated) = keep_uncalibrated_out(&mut model.graph, ranges);
    let base_dir = model.base_dir.clone();
    let g = &mut model.graph;
    let order =
        g.topo_order().map_err(|rest| format!("the graph has a cycle through node `{}`", g.node(rest[0]).name))?;
    let orig: Vec<Option<DType>> = g.all_values().map(|v| g.ty(v).dtype).collect();
    let mut m = Materializer {
        cur: orig.clone(),
        orig,
        g,
        base_dir,
        casts: HashMap::new(),
        ranges,
        stats: MaterializeStats {
            kept_by_schema: schema.kept,
            opset_raised: schema.raised,
            opset_blocked: schema.blocked,
            kept_uncalibrated,
            first_uncalibrated,
            ..MaterializeStats::default()
        },
    };
    for n in order {
        m.node(n)?;
    }
    m.outputs();
    if mode == Mode::Inference {
        m.store_weights_low();
    }
    Ok(m.stats)
}

impl Materializer<'_> {
    fn node(&mut self, n: NodeId) -> Result<(), String> {
        let prec = planned_precision(self.g, n);
        let op = self.g.node(n).op.clone();
        let inputs: Vec<Option<ValueId>> = self.g.node(n).inputs().to_vec();
        for (slot, v) in inputs.into_iter().enumerate() {
            let Some(v) = v else { continue };
            let Some(orig) = self.orig.get(v.index()).copied().flatten() else { continue };
            if !orig.is_float() || (slot == 0 && any_dtype_input(&op)) {
                continue;
            }
            let new = match prec {
                Some(p) if is_quantized(p) && !pinned_input(&op, slot) => {
                    self.qdq(v, p).map_err(|e| format!("node `{}`: {e}", self.g.node(n).name))?
                }
                Some(p) if !pinned_input(&op, slot) => self.cast_to(v, p),
                _ => self.cast_to(v, orig),
            };
            if new != v {
                self.g.set_input(n, slot, Some(new));
            }
        }
        // Subgraphs read captured values at the dtype they were built for,
        // whatever the node's plan (their bodies are not rewritten).
        let captured: Vec<ValueId> = self.g.node(n).captures().iter().map(|c| c.value).collect();
        for (i, v) in captured.into_iter().enumerate() {
            let Some(orig) = self.orig.get(v.index()).copied().flatten().filter(|d| d.is_float()) else { continue };
            let new = self.cast_to(v, orig);
            if new != v {
                self.g.set_input(n, CAPTURE_SLOT + i, Some(new));
            }
        }
        // A quantized node is an FP32 op between QDQ pairs: its float outputs
        // are FP32 (a node whose graph dtype is another float, e.g. F64,
        // reads FP32 and so writes FP32).
        if let Some(p) = prec.map(|p| if is_quantized(p) { DType::F32 } else { p }) {
            let outs = self.g.node(n).outputs().to_vec();
            for (slot, v) in outs.into_iter().enumerate() {
                if self.orig[v.index()].is_some_and(DType::is_float) && !pinned_output(&op, slot) {
                    let shape = self.g.ty(v).shape.clone();
                    self.g.set_ty(v, TensorType { container: None, dtype: Some(p), shape });
                    self.cur[v.index()] = Some(p);
                }
            }
        }
        Ok(())
    }

    fn track(&mut self, v: ValueId, d: DType) {
        if self.cur.len() <= v.index() {
            self.cur.resize(v.index() + 1, None);
            self.orig.resize(v.index() + 1, None);
        }
        self.cur[v.index()] = Some(d);
        self.orig[v.index()] = Some(d);
    }

    /// `v` as dtype `to`: itself, or the shared cast of it.
    fn cast_to(&mut self, v: ValueId, to: DType) -> ValueId {
        if self.cur[v.index()] == Some(to) {
            return v;
        }
        if let Some(&c) = self.casts.get(&(v, to)) {
            return c;
        }
        let name = self.g.fresh_value_name(&format!("{}.cast_{to}", self.g.value_name(v)));
        let ty = TensorType { container: None, dtype: Some(to), shape: self.g.ty(v).shape.clone() };
        let spec = NodeSpec::new(name.clone(), Op::Cast)
            .input(v)
            .attr("to", Attr::Int(i64::from(to.onnx_code())))
            .output(name, ty);
        let n = self.g.add_node(spec);
        let out = self.g.node(n).outputs()[0];
        self.track(out, to);
        self.casts.insert((v, to), out);
        self.stats.casts += 1;
        if matches!(self.g.value(v).def, ValueDef::Init(_)) {
            self.stats.weight_casts += 1;
        }
        out
    }

    /// `v` through QuantizeLinear → DequantizeLinear at `q`, as FP32.
    fn qdq(&mut self, v: ValueId, q: DType) -> Result<ValueId, String> {
        if let Some(&c) = self.casts.get(&(v, q)) {
            return Ok(c);
        }
        let src = self.cast_to(v, DType::F32);
        let base = self.g.value_name(v).to_string();
        let scale = if qscale::needs_range(self.g, v) {
            match self.ranges.get(&base).and_then(|a| qscale::scale_for(a, q)) {
                Some(s) => s,
                // FP8's own range; INT8 nodes without ranges were kept out.
                None if q != DType::I8 => 1.0,
                None => return Err(format!("no calibrated range for the INT8 activation `{base}`")),
            }
        } else {
            // A weight: its own values (all zeros, or absent, give no
            // range: any scale represents zeros exactly).
            let absmax = self.init_values(v).map(|vals| qscale::absmax(&vals));
            let fallback = if q == DType::I8 { 1.0 / qscale::qmax(q) } else { 1.0 };
            absmax.and_then(|a| qscale::scale_for(a, q)).unwrap_or(fallback)
        };
        let scale_name = self.g.fresh_value_name(&format!("{base}.qscale"));
        let scale_v = self.g.add_init(scale_name, Tensor::from_f32(vec![], &[scale as f32]));
        let zp_name = self.g.fresh_value_name(&format!("{base}.qzero"));
        let zp = Tensor { dtype: q, dims: vec![], data: TensorData::Inline(vec![0u8].into()) };
        let zp_v = self.g.add_init(zp_name, zp);
        let shape = self.g.ty(src).shape.clone();
        let qname = self.g.fresh_value_name(&format!("{base}.quant_{q}"));
        let qspec = NodeSpec::new(qname.clone(), Op::QuantizeLinear)
            .input(src)
            .input(scale_v)
            .input(zp_v)
            .output(qname, TensorType { container: None, dtype: Some(q), shape: shape.clone() });
        let qn = self.g.add_node(qspec);
        let qv = self.g.node(qn).outputs()[0];
        let dname = self.g.fresh_value_name(&format!("{base}.dequant_{q}"));
        let dspec = NodeSpec::new(dname.clone(), Op::DequantizeLinear)
            .input(qv)
            .input(scale_v)
            .input(zp_v)
            .output(dname, TensorType { container: None, dtype: Some(DType::F32), shape });
        let dn = self.g.add_node(dspec);
        let dv = self.g.node(dn).outputs()[0];
        self.track(qv, q);
        self.track(dv, DType::F32);
        self.casts.insert((v, q), dv);
        self.stats.qdq_pairs += 1;
        Ok(dv)
    }

    fn init_values(&self, v: ValueId) -> Option<Vec<f64>> {
        let t = self.g.value(v).init()?;
        let bytes = t.load(self.base_dir.as_deref()).ok()??;
        Tensor { dtype: t.dtype, dims: t.dims.clone(), data: TensorData::Inline(bytes) }.as_f64s()
    }

    fn outputs(&mut self) {
        let mut outs = self.g.outputs().to_vec();
        let mut done: HashMap<ValueId, ValueId> = HashMap::new();
        for o in &mut outs {
            if let Some(&c) = done.get(o) {
                *o = c;
                continue;
            }
            let (Some(orig), Some(cur)) = (self.orig[o.index()], self.cur[o.index()]) else { continue };
            if orig == cur || !orig.is_float() {
                continue;
            }
            let name = self.g.value_name(*o).to_string();
            let renamed = self.g.fresh_value_name(&format!("{name}.{cur}"));
            self.g.rename_value(*o, renamed);
            let c = self.cast_to(*o, orig);
            let (cn, _) = self.g.producer(c).expect("a cast output");
            self.g.rename_value(c, name.clone());
            self.g.node_mut(cn).name = format!("{name}.cast_{orig}");
            done.insert(*o, c);
            *o = c;
        }
        self.g.set_outputs(outs);
    }

    /// Replace casts of FP32 initializers by converted initializers.
    fn store_weights_low(&mut self) {
        let mut cast_nodes: Vec<(ValueId, DType, ValueId)> = self
            .casts
            .iter()
            .filter(|(&(v, _), _)| self.g.value(v).init().is_some())
            .map(|(&(v, d), &c)| (v, d, c))
            .collect();
        cast_nodes.sort();
        for (w, to, c) in cast_nodes {
            if !matches!(to, DType::F16 | DType::BF16 | DType::F32) {
                continue;
            }
            let Some(t) = self.g.value(w).init().cloned() else { continue };
            let converted = match self.init_values(w) {
                Some(vals) => Tensor::from_f64s(to, t.dims.clone(), &vals),
                // Absent like its master: external data stays a reference.
                None => Some(t.absent_converted(to)),
            };
            let Some(converted) = converted else { continue };
            let Some((cn, _)) = self.g.producer(c) else { continue };
            let cname = self.g.value_name(c).to_string();
            self.g.rename_value(c, format!("{cname}.removed"));
            let nw = self.g.add_init(cname, converted);
            self.g.replace_all_uses(c, nw);
            self.g.remove_node(cn);
            self.stats.casts -= 1;
            self.stats.weight_casts -= 1;
            self.stats.converted_weights += 1;
            let still_used =
                !self.g.users(w).is_empty() || self.g.outputs().contains(&w) || self.g.inputs().contains(&w);
            if !still_used {
                let wname = self.g.value_name(w).to_string();
                self.g.remove_source(w);
                self.g.rename_value(nw, wname);
            }
        }
    }
}

/// The inverse of materialization's QDQ pairs, for costing a written plan:
/// every lowerable node all of whose float data inputs are
/// `DequantizeLinear(QuantizeLinear(x))` pairs to one quantized dtype (INT8
/// or FP8) reads the `x`s directly and is annotated with that dtype, and
/// the pairs no longer read are removed. The cost model then charges the
/// quantization inside the op (QSync's INT8 kernels) instead of as separate
/// FP32 nodes. Returns the number of nodes re-annotated.
pub fn unmaterialize_qdq(g: &mut Graph) -> usize {
    // `DequantizeLinear(QuantizeLinear(x))` → (x, quantized dtype).
    let pair = |g: &Graph, v: ValueId| -> Option<(ValueId, DType)> {
        let (dq, _) = g.producer(v)?;
        let dqn = g.node(dq);
        if dqn.op != Op::DequantizeLinear {
            return None;
        }
        let q = dqn.input(0)?;
        let (qn, _) = g.producer(q)?;
        let qnode = g.node(qn);
        let dt = g.ty(q).dtype.filter(|&d| is_quantized(d))?;
        (qnode.op == Op::QuantizeLinear).then_some(())?;
        Some((qnode.input(0)?, dt))
    };
    let mut changed = 0;
    let mut dead = Vec::new();
    for n in g.node_ids() {
        if !lowerable(g, n) {
            continue;
        }
        let node = g.node(n);
        let data: Vec<(usize, ValueId)> = node
            .inputs()
            .iter()
            .enumerate()
            .filter(|(slot, v)| {
                !pinned_input(&node.op, *slot) && v.is_some_and(|v| g.ty(v).dtype.is_some_and(DType::is_float))
            })
            .filter_map(|(slot, v)| v.map(|v| (slot, v)))
            .collect();
        let pairs: Vec<Option<(ValueId, DType)>> = data.iter().map(|&(_, v)| pair(g, v)).collect();
        let Some(Some((_, dt))) = pairs.first().copied() else { continue };
        if pairs.iter().any(|p| p.is_none_or(|(_, d)| d != dt)) {
            continue;
        }
        for (&(slot, v), p) in data.iter().zip(&pairs) {
            if let Some((x, _)) = p {
                g.set_input(n, slot, Some(*x));
                dead.push(v);
            }
        }
        g.node_mut(n).precision = Some(dt);
        changed += 1;
    }
    // Remove the pairs nothing reads any more (a pair may still feed another
    // reader, e.g. a graph output).
    for v in dead {
        let Some((dq, _)) = g.producer(v) else { continue };
        if g.users(v).is_empty() && !g.outputs().contains(&v) {
            let q = g.node(dq).input(0);
            g.remove_node(dq);
            if let Some(q) = q {
                if let Some((qn, _)) = g.producer(q) {
                    if g.users(q).is_empty() && !g.outputs().contains(&q) {
                        g.remove_node(qn);
                    }
                }
            }
        }
    }
    changed
}
