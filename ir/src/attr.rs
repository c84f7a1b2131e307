//! Node attributes, covering every ONNX attribute kind.

use crate::Tensor;

/// One attribute value. Kinds the IR does not interpret (subgraphs, sparse
/// tensors, type protos) are kept as their encoded protobuf bytes so that
/// they survive a round trip through the IR untouched.
#[derive(Clone, PartialEq, Debug)]
pub enum Attr {
    Int(i64),
    Float(f32),
    /// Bytes: ONNX strings are byte strings, usually UTF-8.
    String(Vec<u8>),
    Tensor(Tensor),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strings(Vec<Vec<u8>>),
    Tensors(Vec<Tensor>),
    /// An attribute the IR keeps opaque, by `AttributeProto.type` code, with
    /// the encoded message(s) (GraphProto, SparseTensorProto, TypeProto).
    Raw {
        kind: RawAttrKind,
        items: Vec<Vec<u8>>,
    },
}

/// The opaque attribute kinds (`AttributeProto.AttributeType`).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub enum RawAttrKind {
    Graph,
    Graphs,
    SparseTensor,
    SparseTensors,
    TypeProto,
    TypeProtos,
}

impl RawAttrKind {
    pub const ALL: [RawAttrKind; 6] = [
        RawAttrKind::Graph,
        RawAttrKind::Graphs,
        RawAttrKind::SparseTensor,
        RawAttrKind::SparseTensors,
        RawAttrKind::TypeProto,
        RawAttrKind::TypeProtos,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RawAttrKind::Graph => "graph",
            RawAttrKind::Graphs => "graphs",
            RawAttrKind::SparseTensor => "sparse_tensor",
            RawAttrKind::SparseTensors => "sparse_tensors",
            RawAttrKind::TypeProto => "type_proto",
            RawAttrKind::TypeProtos => "type_protos",
        }
    }

    pub fn from_name(s: &str) -> Option<RawAttrKind> {
        RawAttrKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Whether the kind holds a list (then `items` may have any length).
    pub fn is_list(self) -> bool {
        matches!(self, RawAttrKind::Graphs | RawAttrKind::SparseTensors | RawAttrKind::TypeProtos)
    }
}

impl Attr {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attr::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn as_float(&self) -> Option<f32> {
        match self {
            Attr::Float(f) => Some(*f),
            Attr::Int(i) => Some(*i as f32),
            _ => None,
        }
    }

    pub fn as_ints(&self) -> Option<&[i64]> {
        match self {
            Attr::Ints(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Attr::String(s) => std::str::from_utf8(s).ok(),
            _ => None,
        }
    }

    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Attr::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// A short name of the kind, for error messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Attr::Int(_) => "int",
            Attr::Float(_) => "float",
            Attr::String(_) => "string",
            Attr::Tensor(_) => "tensor",
            Attr::Ints(_) => "ints",
            Attr::Floats(_) => "floats",
            Attr::Strings(_) => "strings",
            Attr::Tensors(_) => "tensors",
            Attr::Raw { kind, .. } => kind.name(),
        }
    }
}
