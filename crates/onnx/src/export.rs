//! IR → ONNX export.
//!
//! Writes a [`Model`] as a `ModelProto`:
//! - nodes in [`Graph::schedule`] order, with their attributes (sorted by
//!   name), domain and op type; opaque attributes are decoded back from
//!   their stored bytes;
//! - initializers: inline data as `raw_data` (strings as `string_data`),
//!   external data as the same `location`/`offset`/`length` reference; by
//!   [`export_file`], an external data file that exists beside the source
//!   model is copied beside the output (same location name) when the output
//!   directory differs, so the references resolve; a missing one is left as is;
//! - graph inputs and outputs with their types, symbolic dims as `dim_param`
//!   (expressions such as `batch*seq` as their text, which import parses
//!   back); `value_info` for every other node output whose element type is
//!   known (values of unknown type are omitted rather than written wrongly)
//!   — for an imported model only the outputs its file annotated
//!   (`Model::annotated`): runtimes choose shape-dependent fusions from
//!   `value_info`, so annotating more would change a round trip's numerics;
//! - model fields, opset imports and model-local functions.
//!
//! Guarantees: deterministic (the same model gives the same bytes), and
//! import ∘ export ∘ import gives a structurally identical graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use prost::Message;
use qsync_ir::{Attr, Container, Dim, Graph, Model, RawAttrKind, Tensor, TensorData, TensorType, ValueDef, ValueId};

use crate::proto::{self, attr_type, DimValue, TypeValue};
use crate::OnnxError;

/// Serialize `model`.
pub fn export_bytes(model: &Model) -> Result<Vec<u8>, OnnxError> {
    Ok(to_proto(model, "<memory>")?.encode_to_vec())
}

/// Write `model` to `out_path`, copying external data files it references
/// beside the output when they exist and the directory differs.
pub fn export_file(model: &Model, out_path: impl AsRef<Path>) -> Result<(), OnnxError> {
    let out_path = out_path.as_ref();
    let label = out_path.display().to_string();
    let bytes = to_proto(model, &label)?.encode_to_vec();
    let out_dir = match out_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    if let Some(base) = &model.base_dir {
        copy_external_data(model, base, &out_dir, &label)?;
    }
    std::fs::write(out_path, bytes).map_err(|e| OnnxError::io(out_path, e))
}

/// Every external-data location the model references (initializers and
/// tensor attributes), sorted.
fn external_locations(model: &Model) -> BTreeSet<String> {
    let g = &model.graph;
    let mut out = BTreeSet::new();
    let mut add = |t: &Tensor| {
        if let TensorData::External { location, .. } = &t.data {
            out.insert(location.clone());
        }
    };
    for &v in g.inits() {
        if let Some(t) = g.value(v).init() {
            add(t);
        }
    }
    for n in g.node_ids() {
        for a in g.node(n).attrs.values() {
            match a {
                Attr::Tensor(t) => add(t),
                Attr::Tensors(ts) => ts.iter().for_each(&mut add),
                _ => {}
            }
        }
    }
    out
}

/// Copy every external-data file `model` references (and that exists under
/// `base`) into `out_dir` under the same relative location, so references
/// resolve from a model written there. Nothing happens when the directories
/// are the same. A location ONNX does not allow (absolute, with `..`, or
/// resolving outside `base` through a symbolic link) is an error naming it:
/// nothing outside the model's folder is ever read.
pub fn copy_external_data(model: &Model, base: &Path, out_dir: &Path, label: &str) -> Result<(), OnnxError> {
    let locations = external_locations(model);
    let mut sources = Vec::with_capacity(locations.len());
    for loc in locations {
        let src = qsync_ir::tensor::resolve_external(Some(base), &loc).map_err(|msg| OnnxError::Invalid {
            file: label.to_string(),
            place: "external data".into(),
            msg,
        })?;
        if let Some(src) = src {
            sources.push((loc, src));
        }
    }
    let same_dir = match (base.canonicalize(), out_dir.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => base == out_dir,
    };
    if same_dir {
        return Ok(());
    }
    for (loc, src) in sources {
        let dst = out_dir.join(&loc);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(|e| OnnxError::io(parent, e))?;
        }
        std::fs::copy(&src, &dst).map_err(|e| OnnxError::Export {
            file: label.to_string(),
            msg: format!("copying external data `{}` to `{}`: {e}", src.display(), dst.display()),
        })?;
    }
    Ok(())
}

fn export_err(file: &str, msg: impl Into<String>) -> OnnxError {
    OnnxError::Export { file: file.to_string(), msg: msg.into() }
}

/// Build the `ModelProto` for `model`.
pub fn to_proto(model: &Model, label: &str) -> Result<proto::ModelProto, OnnxError> {
    let mut functions = Vec::with_capacity(model.functions.len());
    for (i, f) in model.functions.iter().enumerate() {
        functions.push(
            proto::FunctionProto::decode(f.as_slice())
                .map_err(|e| export_err(label, format!("function #{i} does not decode: {e}")))?,
        );
    }
    Ok(proto::ModelProto {
        ir_version: if model.ir_version > 0 {
            model.ir_version
        } else {
            qsync_ir::upgrade::ir_version_for(model.opset())
        },
        producer_name: model.producer_name.clone(),
        producer_version: model.producer_version.clone(),
        domain: model.domain.clone(),
        model_version: model.model_version,
        doc_string: model.doc_string.clone(),
        graph: Some(graph_proto(&model.graph, model.annotated.as_ref(), label)?),
        opset_import: model
            .opsets
            .iter()
            .map(|(d, v)| proto::OperatorSetIdProto { domain: d.clone(), version: *v })
            .collect(),
        metadata_props: model
            .metadata
            .iter()
            .filter(|(k, _)| !k.starts_with(crate::REFRESH_KEY_PREFIX))
            .map(|(k, v)| entry(k, v))
            .chain(model.graph.refreshed_copies().map(|(c, m)| {
                let g = &model.graph;
                entry(&format!("{}{}", crate::REFRESH_KEY_PREFIX, g.value_name(c)), g.value_name(m))
            }))
            .collect(),
        training_info: Vec::new(),
        functions,
    })
}

fn entry(k: &str, v: &str) -> proto::StringStringEntryProto {
    proto::StringStringEntryProto { key: k.to_string(), value: v.to_string() }
}

/// A dimension as a `TensorShapeProto.Dimension`.
pub fn dim_proto(d: &Dim) -> proto::Dimension {
    let value = match (d.as_const(), d.as_sym()) {
        (Some(c), _) => DimValue::DimValue(c),
        (None, Some(s)) => DimValue::DimParam(s.to_string()),
        (None, None) => DimValue::DimParam(d.to_string()),
    };
    proto::Dimension { value: Some(value), denotation: String::new() }
}

fn type_proto(t: &TensorType) -> proto::TypeProto {
    let boxed = |t: &TensorType| Some(Box::new(type_proto(t)));
    let value = match t.container.as_deref() {
        Some(Container::Sequence(e)) => TypeValue::SequenceType(Box::new(proto::TypeSequence { elem_type: boxed(e) })),
        Some(Container::Optional(e)) => TypeValue::OptionalType(Box::new(proto::TypeOptional { elem_type: boxed(e) })),
        Some(Container::Map(k, v)) => {
            TypeValue::MapType(Box::new(proto::TypeMap { key_type: k.onnx_code(), value_type: boxed(v) }))
        }
        None => return tensor_type_proto(t),
    };
    proto::TypeProto { value: Some(value), denotation: String::new() }
}

fn tensor_type_proto(t: &TensorType) -> proto::TypeProto {
    let tt = proto::TypeTensor {
        elem_type: t.dtype.map_or(0, |d| d.onnx_code()),
        shape: t.shape.as_ref().map(|s| proto::TensorShapeProto { dim: s.iter().map(dim_proto).collect() }),
    };
    proto::TypeProto { value: Some(TypeValue::TensorType(tt)), denotation: String::new() }
}

fn value_info(g: &Graph, v: ValueId) -> proto::ValueInfoProto {
    proto::ValueInfoProto {
        name: g.value_name(v).to_string(),
        r#type: Some(type_proto(g.ty(v))),
        doc_string: String::new(),
        metadata_props: Vec::new(),
    }
}

fn graph_proto(g: &Graph, annotated: Option<&BTreeSet<String>>, label: &str) -> Result<proto::GraphProto, OnnxError> {
    let order = g.schedule();
    let mut nodes = Vec::with_capacity(order.len());
    for &id in &order {
        let n = g.node(id);
        let mut attribute = Vec::with_capacity(n.attrs.len());
        for (k, a) in &n.attrs {
            attribute.push(attr_proto(k, a, label, &n.name)?);
        }
        // Captures a rewrite re-pointed or renamed: the bodies read the
        // value's current name.
        let renamed: BTreeMap<String, String> = n
            .captures()
            .iter()
            .filter(|c| g.value_name(c.value) != c.name)
            .map(|c| (c.name.clone(), g.value_name(c.value).to_string()))
            .collect();
        if !renamed.is_empty() {
            let bodies = attribute.iter().flat_map(|a| a.g.as_deref().into_iter().chain(a.graphs.iter()));
            for body in bodies {
                if let Some(new) = renamed.values().find(|new| crate::subgraph::defines_anywhere(body, new)) {
                    return Err(export_err(
                        label,
                        format!(
                            "node `{}`: a captured value is now named `{new}`, which its subgraph defines itself",
                            n.name
                        ),
                    ));
                }
            }
            for a in &mut attribute {
                if let Some(sub) = a.g.as_deref_mut() {
                    crate::subgraph::rename_free(sub, &renamed);
                }
                for sub in &mut a.graphs {
                    crate::subgraph::rename_free(sub, &renamed);
                }
            }
        }
        nodes.push(proto::NodeProto {
            input: n.inputs().iter().map(|i| i.map(|v| g.value_name(v).to_string()).unwrap_or_default()).collect(),
            output: n.outputs().iter().map(|&v| g.value_name(v).to_string()).collect(),
            name: n.name.clone(),
            op_type: n.op.op_type().to_string(),
            attribute,
            doc_string: String::new(),
            domain: n.op.domain().to_string(),
            overload: String::new(),
            metadata_props: Vec::new(),
        });
    }
    let mut initializer = Vec::with_capacity(g.inits().len());
    for &v in g.inits() {
        if let ValueDef::Init(t) = &g.value(v).def {
            initializer.push(tensor_proto(t, g.value_name(v), label)?);
        }
    }
    let outputs: BTreeSet<ValueId> = g.outputs().iter().copied().collect();
    let mut vinfo = Vec::new();
    for &id in &order {
        for &v in g.node(id).outputs() {
            let data = g.value(v);
            if data.name.is_empty() || outputs.contains(&v) || (data.ty.dtype.is_none() && data.ty.is_tensor()) {
                continue;
            }
            if annotated.is_some_and(|a| !a.contains(&data.name)) {
                continue;
            }
            vinfo.push(value_info(g, v));
        }
    }
    Ok(proto::GraphProto {
        node: nodes,
        name: g.name.clone(),
        initializer,
        doc_string: String::new(),
        input: g.inputs().iter().map(|&v| value_info(g, v)).collect(),
        output: g.outputs().iter().map(|&v| value_info(g, v)).collect(),
        value_info: vinfo,
        quantization_annotation: Vec::new(),
        sparse_initializer: Vec::new(),
        metadata_props: Vec::new(),
    })
}

/// An IR tensor as a `TensorProto` named `name`.
pub fn tensor_proto(t: &Tensor, name: &str, label: &str) -> Result<proto::TensorProto, OnnxError> {
    let mut p = proto::TensorProto {
        dims: t.dims.clone(),
        data_type: t.dtype.onnx_code(),
        name: name.to_string(),
        ..proto::TensorProto::default()
    };
    match &t.data {
        TensorData::Inline(b) if t.dtype == qsync_ir::DType::Str => {
            let mut rest: &[u8] = b;
            while !rest.is_empty() {
                let bad = || export_err(label, format!("tensor `{name}`: malformed inline string data"));
                let len_bytes: [u8; 4] = rest.get(..4).and_then(|s| s.try_into().ok()).ok_or_else(bad)?;
                let len = u32::from_le_bytes(len_bytes) as usize;
                let s = rest.get(4..4 + len).ok_or_else(bad)?;
                p.string_data.push(s.to_vec());
                rest = &rest[4 + len..];
            }
        }
        TensorData::Inline(b) => p.raw_data = b.to_vec(),
        TensorData::External { location, offset, length } => {
            p.data_location = proto::DATA_LOCATION_EXTERNAL;
            p.external_data.push(entry("location", location));
            if *offset != 0 {
                p.external_data.push(entry("offset", &offset.to_string()));
            }
            if let Some(l) = length {
                p.external_data.push(entry("length", &l.to_string()));
            }
        }
        TensorData::Absent => {}
    }
    Ok(p)
}

fn attr_proto(name: &str, a: &Attr, label: &str, node: &str) -> Result<proto::AttributeProto, OnnxError> {
    let mut p = proto::AttributeProto { name: name.to_string(), ..proto::AttributeProto::default() };
    let bad = |what: &str, e: prost::DecodeError| {
        export_err(label, format!("node `{node}`, attribute `{name}`: stored {what} does not decode: {e}"))
    };
    let tname = "";
    match a {
        Attr::Int(i) => {
            p.r#type = attr_type::INT;
            p.i = Some(*i);
        }
        Attr::Float(f) => {
            p.r#type = attr_type::FLOAT;
            p.f = Some(*f);
        }
        Attr::String(s) => {
            p.r#type = attr_type::STRING;
            p.s = Some(s.clone());
        }
        Attr::Tensor(t) => {
            p.r#type = attr_type::TENSOR;
            p.t = Some(tensor_proto(t, tname, label)?);
        }
        Attr::Ints(v) => {
            p.r#type = attr_type::INTS;
            p.ints = v.clone();
        }
        Attr::Floats(v) => {
            p.r#type = attr_type::FLOATS;
            p.floats = v.clone();
        }
        Attr::Strings(v) => {
            p.r#type = attr_type::STRINGS;
            p.strings = v.clone();
        }
        Attr::Tensors(ts) => {
            p.r#type = attr_type::TENSORS;
            for t in ts {
                p.tensors.push(tensor_proto(t, tname, label)?);
            }
        }
        Attr::Raw { kind, items } => match kind {
            RawAttrKind::Graph => {
                p.r#type = attr_type::GRAPH;
                let b = items.first().map(Vec::as_slice).unwrap_or_default();
                p.g = Some(Box::new(proto::GraphProto::decode(b).map_err(|e| bad("graph", e))?));
            }
            RawAttrKind::Graphs => {
                p.r#type = attr_type::GRAPHS;
                for b in items {
                    p.graphs.push(proto::GraphProto::decode(b.as_slice()).map_err(|e| bad("graph", e))?);
                }
            }
            RawAttrKind::SparseTensor => {
                p.r#type = attr_type::SPARSE_TENSOR;
                let b = items.first().map(Vec::as_slice).unwrap_or_default();
                p.sparse_tensor = Some(proto::SparseTensorProto::decode(b).map_err(|e| bad("sparse tensor", e))?);
            }
            RawAttrKind::SparseTensors => {
                p.r#type = attr_type::SPARSE_TENSORS;
                for b in items {
                    p.sparse_tensors
                        .push(proto::SparseTensorProto::decode(b.as_slice()).map_err(|e| bad("sparse tensor", e))?);
                }
            }
            RawAttrKind::TypeProto => {
                p.r#type = attr_type::TYPE_PROTO;
                let b = items.first().map(Vec::as_slice).unwrap_or_default();
                p.tp = Some(proto::TypeProto::decode(b).map_err(|e| bad("type proto", e))?);
            }
            RawAttrKind::TypeProtos => {
                p.r#type = attr_type::TYPE_PROTOS;
                for b in items {
                    p.type_protos.push(proto::TypeProto::decode(b.as_slice()).map_err(|e| bad("type proto", e))?);
                }
            }
        },
    }
    Ok(p)
}
