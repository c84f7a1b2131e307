//! ONNX → IR import.
//!
//! Reads a serialized `ModelProto` (see [`crate::proto`]) and builds a
//! [`Model`]. What it maps:
//! - model fields (IR version, producer, domain, version, doc, metadata) and
//!   the opset imports; the default domain, when imported, must be at opset
//!   7..=25 (a model importing only other domains, such as `ai.onnx.ml`, is
//!   accepted: its nodes are opaque ops, and a default-domain node in such a
//!   model is an error naming the node);
//! - graph inputs (initializers that are also inputs stay one value, marked
//!   as an input too), outputs and `value_info` types (the annotated names
//!   are kept in `Model::annotated`); `dim_param`s become symbols, or dimension expressions when the string is one (`batch*seq`);
//!   unnamed unknown dims get fresh deterministic symbols `unk__0`, `unk__1`, …
//!   (skipping names the file already uses);
//! - initializers: `raw_data`, every typed field (with the 16/8-bit and bool
//!   packing into `int32_data`), `string_data`, and external data, which stays
//!   a reference (a missing data file is not an error: values absent, dims
//!   known);
//! - every node, in file order, including `Constant`s (whose output type is
//!   taken from the attribute when nothing else gives one); empty optional
//!   inputs become `None`; forward references are resolved; unnamed nodes
//!   are named `{OpType}_{index}` (index in the file);
//! - every attribute kind (except Split's `num_outputs` below opset 18,
//!   which the dynamo exporter writes but that opset lacks: dropped with a
//!   warning when it equals the output count); subgraphs, sparse tensors
//!   and type protos are kept as encoded bytes ([`Attr::Raw`]).
//!
//! What it keeps opaque, with a warning in [`ImportReport`]: control flow
//! (`If`/`Loop`/`Scan` bodies stay encoded attributes), model-local functions
//! (encoded `FunctionProto`s in [`Model::functions`]; calls are opaque ops).
//!
//! Guarantees: never panics on any input bytes; every error names the file
//! and, where there is one, the node or value (see [`OnnxError`]).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use prost::Message;
use qsync_ir::infer::{infer_shapes, InferOptions};
use qsync_ir::{
    Attr, Capture, Container, DType, Dim, Graph, Model, NodeSpec, Op, RawAttrKind, Tensor, TensorData, TensorType,
    ValueDef, ValueId, CAPTURE_SLOT,
};

use crate::proto::{self, attr_type, DimValue, TypeValue};
use crate::OnnxError;

/// Supported default-domain opsets.
pub const OPSET_RANGE: std::ops::RangeInclusive<i64> = 7..=25;

/// Largest element count accepted for one tensor (guards size arithmetic).
const MAX_NUMEL: u64 = 1 << 48;

/// Non-fatal findings of an import (kept-opaque parts, dropped extras,
/// shape-inference notes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportReport {
    pub warnings: Vec<String>,
}

/// Import an ONNX file; external data is resolved relative to its directory.
pub fn import_file(path: impl AsRef<Path>) -> Result<Model, OnnxError> {
    import_file_with_report(path).map(|(m, _)| m)
}

/// [`import_file`], also returning the warnings.
pub fn import_file_with_report(path: impl AsRef<Path>) -> Result<(Model, ImportReport), OnnxError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| OnnxError::io(path, e))?;
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    import_bytes_with_report(&bytes, base, &path.display().to_string())
}

/// Import a serialized model. `base_dir` is where external data lives;
/// `file_label` names the source in errors.
pub fn import_bytes(bytes: &[u8], base_dir: Option<&Path>, file_label: &str) -> Result<Model, OnnxError> {
    import_bytes_with_report(bytes, base_dir, file_label).map(|(m, _)| m)
}

/// [`import_bytes`], also returning the warnings.
pub fn import_bytes_with_report(
    bytes: &[u8],
    base_dir: Option<&Path>,
    file_label: &str,
) -> Result<(Model, ImportReport), OnnxError> {
    let file = file_label.to_string();
    if bytes.is_empty() {
        return Err(OnnxError::Empty { file });
    }
    let sniff = sniff_foreign(bytes);
    let mp = match proto::ModelProto::decode(bytes) {
        Ok(mp) => mp,
        Err(e) => {
            return Err(match sniff {
                Some(why) => OnnxError::NotOnnx { file, why },
                None => OnnxError::Decode { file, detail: e.to_string() },
            })
        }
    };
    if let Some(why) = sniff {
        return Err(OnnxError::NotOnnx { file, why });
    }
    if mp.ir_version <= 0 && mp.opset_import.is_empty() {
        return Err(OnnxError::NotOnnx { file, why: "no IR version and no opset imports".into() });
    }
    let mut imp = Importer { file, warnings: Vec::new(), used_params: HashSet::new(), unk: 0, opset: 0 };
    let mut model = imp.model(mp)?;
    model.base_dir = base_dir.map(Path::to_path_buf);
    if base_dir.is_some() {
        // Locations are plain relative names (checked above); here, links
        // that lead out of the folder and sizes beyond the files.
        qsync_ir::tensor::check_model_external_data(&model).map_err(|msg| OnnxError::Invalid {
            file: imp.file.clone(),
            place: "external data".into(),
            msg,
        })?;
    }
    let opset = model.opset();
    let rep = infer_shapes(&mut model.graph, opset, &InferOptions::default());
    for i in rep.errors {
        imp.warnings.push(format!("shape inference: node `{}` ({}): {}", i.node, i.op, i.message));
    }
    for i in rep.warnings {
        imp.warnings.push(format!("shape inference: node `{}` ({}): {}", i.node, i.op, i.message));
    }
    Ok((model, ImportReport { warnings: imp.warnings }))
}

/// A reason the bytes are clearly some other format, if they are.
fn sniff_foreign(bytes: &[u8]) -> Option<String> {
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        return Some("a zip archive (a TorchScript `.pt` or zipped model?)".into());
    }
    if bytes.starts_with(b"\x7fELF") {
        return Some("an ELF binary".into());
    }
    let head = &bytes[..bytes.len().min(512)];
    let texty = head.iter().all(|&b| b == b'\n' || b == b'\r' || b == b'\t' || (0x20..0x7f).contains(&b));
    texty.then(|| "the file is plain text".into())
}

/// Map a `dim_param` string to a dimension: an expression when it contains an
/// operator and parses as one, else a symbol of that name.
pub fn dim_from_param(s: &str) -> Dim {
    if s.len() <= 256 && s.chars().any(|c| "+-*/()".contains(c)) {
        if let Ok(d) = Dim::parse(s) {
            return d;
        }
    }
    Dim::sym(s)
}

struct Importer {
    file: String,
    warnings: Vec<String>,
    /// Every `dim_param` in the file, so fresh symbols do not collide.
    used_params: HashSet<String>,
    unk: usize,
    /// The default-domain opset (set before the graph is read).
    opset: i64,
}

fn node_place(name: &str, op_type: &str) -> String {
    format!("node `{name}` ({op_type})")
}

fn collect_params(t: Option<&proto::TypeProto>, out: &mut HashSet<String>) {
    if let Some(TypeValue::TensorType(tt)) = t.and_then(|t| t.value.as_ref()) {
        for d in tt.shape.iter().flat_map(|s| &s.dim) {
            if let Some(DimValue::DimParam(p)) = &d.value {
                out.insert(p.clone());
            }
        }
    }
}

impl Importer {
    fn invalid(&self, place: impl Into<String>, msg: impl Into<String>) -> OnnxError {
        OnnxError::Invalid { file: self.file.clone(), place: place.into(), msg: msg.into() }
    }

    fn model(&mut self, mp: proto::ModelProto) -> Result<Model, OnnxError> {
        let mut default_seen = false;
        for o in &mp.opset_import {
            if o.domain.is_empty() || o.domain == "ai.onnx" {
                default_seen = true;
                if !OPSET_RANGE.contains(&o.version) {
                    return Err(OnnxError::UnsupportedOpset {
                        file: self.file.clone(),
                        domain: o.domain.clone(),
                        version: o.version,
                    });
                }
                self.opset = o.version;
            }
        }
        if !default_seen && mp.opset_import.is_empty() {
            return Err(OnnxError::UnsupportedOpset { file: self.file.clone(), domain: String::new(), version: 0 });
        }
        let g = mp.graph.ok_or_else(|| OnnxError::MissingGraph { file: self.file.clone() })?;
        let mut functions = Vec::with_capacity(mp.functions.len());
        for f in &mp.functions {
            self.warnings.push(format!(
                "model-local function `{}::{}` kept as encoded bytes; its calls are opaque ops",
                f.domain, f.name
            ));
            functions.push(f.encode_to_vec());
        }
        if !mp.training_info.is_empty() {
            self.warnings
                .push(format!("{} training_info entries dropped (not represented in the IR)", mp.training_info.len()));
        }
        let annotated = Some(g.value_info.iter().map(|vi| vi.name.clone()).collect());
        let mut graph = self.graph(g)?;
        let mut metadata = Vec::with_capacity(mp.metadata_props.len());
        for e in mp.metadata_props {
            let Some(copy) = e.key.strip_prefix(crate::REFRESH_KEY_PREFIX) else {
                metadata.push((e.key, e.value));
                continue;
            };
            let init = |name: &str| graph.value_by_name(name).filter(|&v| graph.value(v).init().is_some());
            let (Some(c), Some(m)) = (init(copy), init(&e.value)) else {
                return Err(OnnxError::Invalid {
                    file: self.file.clone(),
                    place: format!("metadata `{}`", e.key),
                    msg: format!("refreshed copy `{copy}` of `{}`: both must be initializers", e.value),
                });
            };
            graph.link_refreshed_copy(c, m);
        }
        Ok(Model {
            graph,
            ir_version: mp.ir_version,
            opsets: mp.opset_import.into_iter().map(|o| (o.domain, o.version)).collect(),
            producer_name: mp.producer_name,
            producer_version: mp.producer_version,
            domain: mp.domain,
            model_version: mp.model_version,
            doc_string: mp.doc_string,
            metadata,
            functions,
            base_dir: None,
            annotated,
        })
    }

    fn fresh_dim(&mut self) -> Dim {
        loop {
            let name = format!("unk__{}", self.unk);
            self.unk += 1;
            if !self.used_params.contains(&name) {
                return Dim::sym(&name);
            }
        }
    }

    fn dtype(&self, code: i32, place: &str) -> Result<DType, OnnxError> {
        DType::from_onnx_code(code).ok_or_else(|| OnnxError::UnknownElemType {
            file: self.file.clone(),
            place: place.to_string(),
            code,
        })
    }

    /// Sparse-tensor and opaque values at the graph boundary are refused with
    /// the reason (the IR carries tensors and sequence / optional / map
    /// types over them; exporting another kind as a tensor would write a
    /// model the checker rejects).
    fn tensor_boundary(&self, vi: &proto::ValueInfoProto, place: &str) -> Result<(), OnnxError> {
        let kind = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(TypeValue::SparseTensorType(_)) => "a sparse tensor",
            Some(TypeValue::OpaqueType(_)) => "an opaque",
            _ => return Ok(()),
        };
        Err(self.invalid(
            place,
            format!("has {kind} type; sparse tensor and opaque values are not supported at the graph boundary"),
        ))
    }

    /// A value's type: tensors, and sequence / optional / map types over
    /// them (carried unchanged); sparse and opaque types import as unknown.
    fn ty(&mut self, t: Option<&proto::TypeProto>, place: &str) -> Result<TensorType, OnnxError> {
        let Some(value) = t.and_then(|t| t.value.as_ref()) else { return Ok(TensorType::unknown()) };
        // Nesting is bounded by prost's decoding limit (100 messages).
        let container = match value {
            TypeValue::TensorType(_) => None,
            TypeValue::SequenceType(s) => Some(Container::Sequence(self.ty(s.elem_type.as_deref(), place)?)),
            TypeValue::OptionalType(o) => Some(Container::Optional(self.ty(o.elem_type.as_deref(), place)?)),
            TypeValue::MapType(m) => {
                let key = self.dtype(m.key_type, place)?;
                Some(Container::Map(key, self.ty(m.value_type.as_deref(), place)?))
            }
            TypeValue::SparseTensorType(_) | TypeValue::OpaqueType(_) => {
                self.warnings.push(format!("{place}: sparse tensor or opaque type imported as unknown"));
                return Ok(TensorType::unknown());
            }
        };
        if let Some(c) = container {
            return Ok(TensorType::of(c));
        }
        let TypeValue::TensorType(tt) = value else { return Ok(TensorType::unknown()) };
        let dtype = if tt.elem_type == 0 { None } else { Some(self.dtype(tt.elem_type, place)?) };
        let shape = match &tt.shape {
            None => None,
            Some(s) => {
                let mut dims = Vec::with_capacity(s.dim.len());
                for d in &s.dim {
                    dims.push(match &d.value {
                        Some(DimValue::DimValue(v)) if *v >= 0 => Dim::from(*v),
                        Some(DimValue::DimParam(p)) if !p.is_empty() => dim_from_param(p),
                        _ => self.fresh_dim(),
                    });
                }
                Some(dims)
            }
        };
        Ok(TensorType { container: None, dtype, shape })
    }

    fn graph(&mut self, g: proto::GraphProto) -> Result<Graph, OnnxError> {
        for vi in g.input.iter().chain(&g.output).chain(&g.value_info) {
            collect_params(vi.r#type.as_ref(), &mut self.used_params);
        }
        let mut graph = Graph::new(g.name.clone());
        if !g.quantization_annotation.is_empty() {
            self.warnings.push(format!(
                "{} quantization annotations dropped (not represented in the IR)",
                g.quantization_annotation.len()
            ));
        }
        if !g.sparse_initializer.is_empty() {
            return Err(self.invalid("graph", "sparse initializers are not supported"));
        }
        for (i, t) in g.initializer.iter().enumerate() {
            if t.name.is_empty() {
                return Err(self.invalid(format!("initializer #{i}"), "initializer has no name"));
            }
            let place = format!("initializer `{}`", t.name);
            if graph.value_by_name(&t.name).is_some() {
                return Err(OnnxError::DuplicateDefinition { file: self.file.clone(), place, value: t.name.clone() });
            }
            let tensor = self.tensor(t, &place)?;
            graph.add_init(t.name.clone(), tensor);
        }
        for vi in &g.input {
            let place = format!("graph input `{}`", vi.name);
            self.tensor_boundary(vi, &place)?;
            let ty = self.ty(vi.r#type.as_ref(), &place)?;
            match graph.value_by_name(&vi.name) {
                Some(v) if graph.value(v).init().is_some() && !graph.inputs().contains(&v) => graph.push_input(v),
                Some(_) => {
                    return Err(OnnxError::DuplicateDefinition {
                        file: self.file.clone(),
                        place,
                        value: vi.name.clone(),
                    })
                }
                None => {
                    graph.add_input(vi.name.clone(), ty);
                }
            }
        }
        // Forward references (a node using a value defined later) get their
        // edges when the defining node is added: see `Graph::add_node_defining`.
        for (idx, n) in g.node.iter().enumerate() {
            self.node(&mut graph, n, idx)?;
        }
        for id in graph.node_ids() {
            let node = graph.node(id);
            for (slot, v) in node.reads() {
                if matches!(graph.value(v).def, ValueDef::Undefined) {
                    let place = node_place(&node.name, node.op.op_type());
                    let place = if slot >= CAPTURE_SLOT { format!("{place}, read by its subgraph") } else { place };
                    return Err(OnnxError::UndefinedValue {
                        file: self.file.clone(),
                        place,
                        value: graph.value_name(v).to_string(),
                    });
                }
            }
        }
        for vi in &g.value_info {
            let place = format!("value_info `{}`", vi.name);
            let ty = self.ty(vi.r#type.as_ref(), &place)?;
            match graph.value_by_name(&vi.name) {
                Some(v) if graph.producer(v).is_some() => graph.set_ty(v, ty),
                Some(_) => {}
                None => self.warnings.push(format!("{place}: names no value of the graph; ignored")),
            }
        }
        let mut outs = Vec::with_capacity(g.output.len());
        for vi in &g.output {
            let place = format!("graph output `{}`", vi.name);
            self.tensor_boundary(vi, &place)?;
            let ty = self.ty(vi.r#type.as_ref(), &place)?;
            let v = graph.value_by_name(&vi.name).ok_or_else(|| OnnxError::UndefinedValue {
                file: self.file.clone(),
                place: place.clone(),
                value: vi.name.clone(),
            })?;
            if graph.producer(v).is_some() && ty != TensorType::unknown() {
                graph.set_ty(v, ty);
            }
            outs.push(v);
        }
        graph.set_outputs(outs);
        for id in graph.node_ids() {
            if graph.node(id).op == Op::Constant {
                if let (Some(&v), Some(ty)) =
                    (graph.node(id).outputs().first(), constant_type(graph.node(id).attrs.iter()))
                {
                    if graph.ty(v).dtype.is_none() {
                        graph.set_ty(v, ty);
                    }
                }
            }
        }
        Ok(graph)
    }

    fn node(&mut self, graph: &mut Graph, n: &proto::NodeProto, idx: usize) -> Result<(), OnnxError> {
        let name = if n.name.is_empty() { format!("{}_{}", n.op_type, idx) } else { n.name.clone() };
        let place = node_place(&name, &n.op_type);
        if n.op_type.is_empty() {
            return Err(self.invalid(place, "node has no op_type"));
        }
        if self.opset == 0 && (n.domain.is_empty() || n.domain == "ai.onnx") {
            return Err(self.invalid(
                place,
                format!("op `{}` is in the default domain, which the model does not import", n.op_type),
            ));
        }
        let op = Op::from_onnx(&n.domain, &n.op_type);
        let op_is_if = op == Op::If;
        if matches!(op, Op::If | Op::Loop | Op::Scan) {
            self.warnings.push(format!("{place}: control flow kept opaque (subgraph bodies stay encoded attributes)"));
        }
        let mut attrs = BTreeMap::new();
        for a in &n.attribute {
            let attr = self.attr(a, &place)?;
            if let Attr::Raw { kind: RawAttrKind::Graph | RawAttrKind::Graphs, .. } = attr {
                if !matches!(op, Op::If | Op::Loop | Op::Scan) {
                    self.warnings.push(format!("{place}: subgraph attribute `{}` kept as encoded bytes", a.name));
                }
            }
            if attrs.insert(a.name.clone(), attr).is_some() {
                return Err(self.invalid(place, format!("attribute `{}` given twice", a.name)));
            }
        }
        // The dynamo exporter writes Split-18's `num_outputs` at opsets
        // below 18, where Split has no such attribute (the checker rejects
        // the file; runtimes split evenly). With no `split` input and as many
        // outputs it restates what the outputs say: drop it.
        if op == Op::Split && self.opset < 18 && n.input.get(1).is_none_or(String::is_empty) {
            if let Some(Attr::Int(k)) = attrs.get("num_outputs") {
                if *k == n.output.len() as i64 {
                    attrs.remove("num_outputs");
                    self.warnings.push(format!("{place}: `num_outputs` is not a Split attribute before opset 18; dropped (it equals the output count)"));
                }
            }
        }
        let mut inputs = Vec::with_capacity(n.input.len());
        for s in &n.input {
            if s.is_empty() {
                inputs.push(None);
                continue;
            }
            let v = match graph.value_by_name(s) {
                Some(v) => v,
                None => graph.add_undefined(s.clone()),
            };
            inputs.push(Some(v));
        }
        // Outer values the subgraphs read by name are the node's captures.
        let captures: Vec<Capture> = crate::subgraph::attrs_free_names(&n.attribute)
            .into_iter()
            .map(|s| {
                let value = graph.value_by_name(&s).unwrap_or_else(|| graph.add_undefined(s.clone()));
                Capture { name: s, value }
            })
            .collect();
        let mut outs: Vec<ValueId> = Vec::with_capacity(n.output.len());
        for s in &n.output {
            if s.is_empty() {
                outs.push(graph.add_undefined(String::new()));
                continue;
            }
            let v = match graph.value_by_name(s) {
                Some(v) if matches!(graph.value(v).def, ValueDef::Undefined) && !outs.contains(&v) => v,
                Some(_) => {
                    return Err(OnnxError::DuplicateDefinition { file: self.file.clone(), place, value: s.clone() })
                }
                None => graph.add_undefined(s.clone()),
            };
            outs.push(v);
        }
        let spec = NodeSpec {
            name,
            op,
            attrs,
            inputs,
            outputs: outs.iter().map(|_| (String::new(), TensorType::unknown())).collect(),
            precision: None,
            captures,
        };
        let if_types = if op_is_if { self.if_output_types(n, &place)? } else { Vec::new() };
        let id = graph.add_node_defining(spec, outs.clone());
        graph.node_mut(id).scope = source_scope(n);
        // An If's outputs are its branches' outputs: where the outer graph
        // declares no type, the branches' declarations (when they agree)
        // give one, so that precision passes see float values as float.
        for (&v, ty) in outs.iter().zip(if_types) {
            if graph.ty(v).dtype.is_none() {
                graph.set_ty(v, ty);
            }
        }
        Ok(())
    }

    /// The type of each If output that both branches declare alike (the
    /// element type, and the shape when that agrees too).
    fn if_output_types(&mut self, n: &proto::NodeProto, place: &str) -> Result<Vec<TensorType>, OnnxError> {
        let branch = |name: &str| n.attribute.iter().find(|a| a.name == name).and_then(|a| a.g.as_deref());
        let (Some(a), Some(b)) = (branch("then_branch"), branch("else_branch")) else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for (x, y) in a.output.iter().zip(&b.output) {
            let is_tensor = |vi: &proto::ValueInfoProto| {
                matches!(vi.r#type.as_ref().and_then(|t| t.value.as_ref()), Some(TypeValue::TensorType(_)))
            };
            if !is_tensor(x) || !is_tensor(y) {
                out.push(TensorType::unknown());
                continue;
            }
            let (tx, ty) = (self.ty(x.r#type.as_ref(), place)?, self.ty(y.r#type.as_ref(), place)?);
            if tx.dtype != ty.dtype {
                out.push(TensorType::unknown());
            } else if tx.shape == ty.shape {
                out.push(tx);
            } else {
                out.push(TensorType { container: None, dtype: tx.dtype, shape: None });
            }
        }
        Ok(out)
    }

    fn attr(&mut self, a: &proto::AttributeProto, place: &str) -> Result<Attr, OnnxError> {
        let place = format!("{place}, attribute `{}`", a.name);
        if !a.ref_attr_name.is_empty() {
            self.warnings.push(format!("{place}: reference to function attribute `{}` ignored", a.ref_attr_name));
        }
        let kind = if a.r#type != attr_type::UNDEFINED { a.r#type } else { guess_attr_type(a) };
        let raw = |kind: RawAttrKind, items: Vec<Vec<u8>>| Attr::Raw { kind, items };
        Ok(match kind {
            attr_type::FLOAT => Attr::Float(a.f.unwrap_or(0.0)),
            attr_type::INT => Attr::Int(a.i.unwrap_or(0)),
            attr_type::STRING => Attr::String(a.s.clone().unwrap_or_default()),
            attr_type::TENSOR => match &a.t {
                Some(t) => Attr::Tensor(self.tensor(t, &place)?),
                None => return Err(self.invalid(place, "tensor attribute without a tensor")),
            },
            attr_type::GRAPH => {
                raw(RawAttrKind::Graph, vec![a.g.as_ref().map(|g| g.encode_to_vec()).unwrap_or_default()])
            }
            attr_type::SPARSE_TENSOR => raw(
                RawAttrKind::SparseTensor,
                vec![a.sparse_tensor.as_ref().map(Message::encode_to_vec).unwrap_or_default()],
            ),
            attr_type::TYPE_PROTO => {
                raw(RawAttrKind::TypeProto, vec![a.tp.as_ref().map(Message::encode_to_vec).unwrap_or_default()])
            }
            attr_type::FLOATS => Attr::Floats(a.floats.clone()),
            attr_type::INTS => Attr::Ints(a.ints.clone()),
            attr_type::STRINGS => Attr::Strings(a.strings.clone()),
            attr_type::TENSORS => {
                let mut ts = Vec::with_capacity(a.tensors.len());
                for t in &a.tensors {
                    ts.push(self.tensor(t, &place)?);
                }
                Attr::Tensors(ts)
            }
            attr_type::GRAPHS => raw(RawAttrKind::Graphs, a.graphs.iter().map(Message::encode_to_vec).collect()),
            attr_type::SPARSE_TENSORS => {
                raw(RawAttrKind::SparseTensors, a.sparse_tensors.iter().map(Message::encode_to_vec).collect())
            }
            attr_type::TYPE_PROTOS => {
                raw(RawAttrKind::TypeProtos, a.type_protos.iter().map(Message::encode_to_vec).collect())
            }
            attr_type::UNDEFINED => return Err(self.invalid(place, "attribute has neither a type nor a value")),
            other => return Err(self.invalid(place, format!("unknown attribute type code {other}"))),
        })
    }

    /// Convert a `TensorProto` (any storage) to an IR tensor.
    fn tensor(&mut self, t: &proto::TensorProto, place: &str) -> Result<Tensor, OnnxError> {
        let dtype = self.dtype(t.data_type, place)?;
        let mut numel: u64 = 1;
        for &d in &t.dims {
            let d = u64::try_from(d).map_err(|_| self.invalid(place, format!("negative dimension {d}")))?;
            numel = numel
                .checked_mul(d)
                .filter(|&n| n <= MAX_NUMEL)
                .ok_or_else(|| self.invalid(place, "tensor too large"))?;
        }
        if t.segment.is_some() {
            self.warnings.push(format!("{place}: tensor segment information ignored"));
        }
        let dims = t.dims.clone();
        if t.data_location == proto::DATA_LOCATION_EXTERNAL {
            let mut location = None;
            let mut offset = 0u64;
            let mut length = None;
            for e in &t.external_data {
                let num = |v: &str| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| self.invalid(place, format!("bad external_data {} `{v}`", e.key)))
                };
                match e.key.as_str() {
                    "location" => location = Some(e.value.clone()),
                    "offset" => offset = num(&e.value)?,
                    "length" => length = Some(num(&e.value)?),
                    _ => {}
                }
            }
            let location = location.ok_or_else(|| self.invalid(place, "external tensor without a location"))?;
            qsync_ir::tensor::check_external_location(&location).map_err(|e| self.invalid(place, e))?;
            return Ok(Tensor { dtype, dims, data: TensorData::External { location, offset, length } });
        }
        let n = numel as usize;
        let byte_len = dtype.storage_bytes(numel) as usize;
        let count_err = |have: usize, field: &str| {
            self.invalid(place, format!("{field} holds {have} values but the dims say {numel}"))
        };
        if !t.raw_data.is_empty() {
            if dtype == DType::Str {
                return Err(self.invalid(place, "string tensor with raw_data"));
            }
            if t.raw_data.len() != byte_len {
                return Err(self
                    .invalid(place, format!("raw_data has {} bytes but the dims need {byte_len}", t.raw_data.len())));
            }
            return Ok(Tensor { dtype, dims, data: TensorData::Inline(t.raw_data.as_slice().into()) });
        }
        let typed_total = t.float_data.len()
            + t.int32_data.len()
            + t.string_data.len()
            + t.int64_data.len()
            + t.double_data.len()
            + t.uint64_data.len();
        if typed_total == 0 {
            let data = if n == 0 { TensorData::Inline(Vec::new().into()) } else { TensorData::Absent };
            return Ok(Tensor { dtype, dims, data });
        }
        // Reserve from the values present, not the declared dims: a file may
        // declare 2^48 elements and hold one (the count check below refuses it).
        let mut bytes: Vec<u8> = Vec::with_capacity(byte_len.min(typed_total.saturating_mul(8)));
        let (field, have) = match dtype {
            DType::F32 => {
                bytes.extend(t.float_data.iter().flat_map(|v| v.to_le_bytes()));
                ("float_data", t.float_data.len())
            }
            DType::F64 => {
                bytes.extend(t.double_data.iter().flat_map(|v| v.to_le_bytes()));
                ("double_data", t.double_data.len())
            }
            DType::I64 => {
                bytes.extend(t.int64_data.iter().flat_map(|v| v.to_le_bytes()));
                ("int64_data", t.int64_data.len())
            }
            DType::U64 => {
                bytes.extend(t.uint64_data.iter().flat_map(|v| v.to_le_bytes()));
                ("uint64_data", t.uint64_data.len())
            }
            DType::U32 => {
                bytes.extend(t.uint64_data.iter().flat_map(|&v| (v as u32).to_le_bytes()));
                ("uint64_data", t.uint64_data.len())
            }
            DType::I32 => {
                bytes.extend(t.int32_data.iter().flat_map(|v| v.to_le_bytes()));
                ("int32_data", t.int32_data.len())
            }
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => {
                bytes.extend(t.int32_data.iter().flat_map(|&v| (v as u16).to_le_bytes()));
                ("int32_data", t.int32_data.len())
            }
            DType::I8
            | DType::U8
            | DType::Bool
            | DType::F8E4M3
            | DType::F8E5M2
            | DType::F8E4M3Fnuz
            | DType::F8E5M2Fnuz
            | DType::F8E8M0 => {
                bytes.extend(t.int32_data.iter().map(|&v| v as u8));
                ("int32_data", t.int32_data.len())
            }
            DType::I4 | DType::U4 | DType::F4E2M1 | DType::I2 | DType::U2 => {
                // One packed byte (two 4-bit or four 2-bit values, low bits
                // first) per int32 element.
                bytes.extend(t.int32_data.iter().map(|&v| v as u8));
                if t.int32_data.len() != byte_len {
                    return Err(self.invalid(
                        place,
                        format!("int32_data holds {} packed bytes but the dims need {byte_len}", t.int32_data.len()),
                    ));
                }
                return Ok(Tensor { dtype, dims, data: TensorData::Inline(bytes.into()) });
            }
            DType::Str => {
                for s in &t.string_data {
                    let len = u32::try_from(s.len()).map_err(|_| self.invalid(place, "string too long"))?;
                    bytes.extend(len.to_le_bytes());
                    bytes.extend_from_slice(s);
                }
                ("string_data", t.string_data.len())
            }
        };
        if have != n || have != typed_total {
            return Err(count_err(have, field));
        }
        Ok(Tensor { dtype, dims, data: TensorData::Inline(bytes.into()) })
    }
}

/// The attribute type of an attribute written without its `type` field
/// (older exporters): whichever value field is present.
fn guess_attr_type(a: &proto::AttributeProto) -> i32 {
    if a.f.is_some() {
        attr_type::FLOAT
    } else if a.i.is_some() {
        attr_type::INT
    } else if a.s.is_some() {
        attr_type::STRING
    } else if a.t.is_some() {
        attr_type::TENSOR
    } else if a.g.is_some() {
        attr_type::GRAPH
    } else if a.sparse_tensor.is_some() {
        attr_type::SPARSE_TENSOR
    } else if a.tp.is_some() {
        attr_type::TYPE_PROTO
    } else if !a.floats.is_empty() {
        attr_type::FLOATS
    } else if !a.ints.is_empty() {
        attr_type::INTS
    } else if !a.strings.is_empty() {
        attr_type::STRINGS
    } else if !a.tensors.is_empty() {
        attr_type::TENSORS
    } else if !a.graphs.is_empty() {
        attr_type::GRAPHS
    } else if !a.sparse_tensors.is_empty() {
        attr_type::SPARSE_TENSORS
    } else if !a.type_protos.is_empty() {
        attr_type::TYPE_PROTOS
    } else {
        attr_type::UNDEFINED
    }
}

/// The output type of a `Constant` node, from its value attribute.
pub(crate) fn constant_type<'a>(mut attrs: impl Iterator<Item = (&'a String, &'a Attr)>) -> Option<TensorType> {
    attrs.find_map(|(k, a)| match (k.as_str(), a) {
        ("value", Attr::Tensor(t)) => Some(TensorType::new(t.dtype, t.dims.iter().map(|&d| Dim::from(d)).collect())),
        ("value_float", _) => Some(TensorType::new(DType::F32, vec![])),
        ("value_floats", Attr::Floats(v)) => Some(TensorType::new(DType::F32, vec![Dim::from(v.len() as i64)])),
        ("value_int", _) => Some(TensorType::new(DType::I64, vec![])),
        ("value_ints", Attr::Ints(v)) => Some(TensorType::new(DType::I64, vec![Dim::from(v.len() as i64)])),
        ("value_string", _) => Some(TensorType::new(DType::Str, vec![])),
        ("value_strings", Attr::Strings(v)) => Some(TensorType::new(DType::Str, vec![Dim::from(v.len() as i64)])),
        _ => None,
    })
}

/// The PyTorch module and call a node came from: the dynamo exporter's
/// `pkg.torch.onnx.name_scopes` metadata (`['', 'features', 'features.3',
/// 'features.3.squeeze', 'conv2d_1']`: the last entry is the call, the one
/// before it the module), else the legacy exporter's node name
/// (`/layer1/layer1.0/conv1/Conv`: scope components, then the op). Legacy
/// components are relative to the enclosing scope except where a child of a
/// container repeats its parent's name (`layer1` then `layer1.0`), which
/// replaces it.
pub(crate) fn source_scope(n: &proto::NodeProto) -> Option<qsync_ir::Scope> {
    if let Some(p) = n.metadata_props.iter().find(|p| p.key == "pkg.torch.onnx.name_scopes") {
        let items = python_str_list(&p.value)?;
        let (call, rest) = items.split_last()?;
        let module = rest.iter().rev().find(|m| !m.is_empty()).cloned().unwrap_or_default();
        return Some(qsync_ir::Scope { module, call: call.clone() });
    }
    let path = n.name.strip_prefix('/')?;
    let mut parts: Vec<&str> = path.split('/').collect();
    let call = parts.pop()?;
    if call.is_empty() || parts.iter().any(|p| p.is_empty()) {
        return None;
    }
    let mut module: Vec<&str> = Vec::new();
    for p in parts {
        match module.last() {
            Some(last) if p.strip_prefix(*last).is_some_and(|r| r.starts_with('.')) => {
                module.pop();
                module.push(p);
            }
            _ => module.push(p),
        }
    }
    Some(qsync_ir::Scope { module: module.join("."), call: call.to_string() })
}

/// Parses a Python list of string literals as `repr` writes it
/// (`['a', "b'c"]`), or `None` when it is anything else.
fn python_str_list(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let Some(q) = chars.next() else { break };
        if q != '\'' && q != '"' {
            return None;
        }
        let mut item = String::new();
        loop {
            match chars.next()? {
                '\\' => item.push(chars.next()?),
                c if c == q => break,
                c => item.push(c),
            }
        }
        out.push(item);
    }
    Some(out)
}

#[cfg(test)]
mod scope_tests {
    use super::*;

    fn node(name: &str, scopes: Option<&str>) -> proto::NodeProto {
        let mut n = proto::NodeProto { name: name.into(), ..Default::default() };
        if let Some(v) = scopes {
            n.metadata_props
                .push(proto::StringStringEntryProto { key: "pkg.torch.onnx.name_scopes".into(), value: v.into() });
        }
        n
    }

    fn scope(n: &proto::NodeProto) -> Option<(String, String)> {
        source_scope(n).map(|s| (s.module, s.call))
    }

    #[test]
    fn dynamo_name_scopes_give_the_module_and_call() {
        let n = node("node_Conv_8", Some("['', 'features', 'features.3', 'features.3.squeeze', 'conv2d_1']"));
        assert_eq!(scope(&n), Some(("features.3.squeeze".into(), "conv2d_1".into())));
        let root = node("node_MatMul_1", Some("['', 'matmul']"));
        assert_eq!(scope(&root), Some((String::new(), "matmul".into())));
        let quoted = node("n", Some(r#"['', "a'b", 'c\'d', 'call']"#));
        assert_eq!(scope(&quoted), Some(("c'd".into(), "call".into())));
        assert_eq!(scope(&node("n", Some("not a list"))), None);
    }

    #[test]
    fn legacy_names_give_the_module_and_call() {
        let n = node("/m/bert/encoder/layer.0/attention/self/query/MatMul", None);
        assert_eq!(scope(&n), Some(("m.bert.encoder.layer.0.attention.self.query".into(), "MatMul".into())));
        // A container's child repeats the container's name.
        let n = node("/layer1/layer1.0/conv1/Conv", None);
        assert_eq!(scope(&n), Some(("layer1.0.conv1".into(), "Conv".into())));
        assert_eq!(scope(&node("/MatMul_3", None)), Some((String::new(), "MatMul_3".into())));
        assert_eq!(scope(&node("Conv_12", None)), None);
        assert_eq!(scope(&node("//Conv", None)), None);
    }
}
