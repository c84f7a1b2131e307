//! The per-node inference context: the input types and *known contents* of a
//! node's inputs, attribute helpers, and the shared shape algebra
//! (multidirectional broadcasting, axis normalization).
//!
//! Known contents are the values of small tensors (≤ [`MAX_KNOWN`] elements)
//! that inference tracks on the side: integer tensors hold [`Dim`]s, so that
//! `Shape(x)` of `x: f32[batch,seq,768]` is known to be `[batch, seq, 768]`;
//! float tensors hold `f64`s (used for `Resize` scales and the like).

use crate::{Attr, DType, Dim, Node, Tensor, TensorType};

/// The largest tensor whose contents are tracked.
pub const MAX_KNOWN: usize = 64;

/// Contents of a small tensor known during inference.
#[derive(Clone, Debug, PartialEq)]
pub struct Known {
    pub dtype: DType,
    pub dims: Vec<i64>,
    /// Elements of an integer or bool tensor (possibly symbolic).
    pub vals: Vec<Dim>,
    /// Elements of a float tensor.
    pub floats: Vec<f64>,
}

impl Known {
    pub fn ints(dtype: DType, dims: Vec<i64>, vals: Vec<Dim>) -> Known {
        Known { dtype, dims, vals, floats: Vec::new() }
    }

    pub fn vec(dtype: DType, vals: Vec<Dim>) -> Known {
        Known::ints(dtype, vec![vals.len() as i64], vals)
    }

    pub fn scalar(dtype: DType, v: Dim) -> Known {
        Known::ints(dtype, Vec::new(), vec![v])
    }

    pub fn is_float(&self) -> bool {
        self.dtype.is_float()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        if self.is_float() {
            self.floats.len()
        } else {
            self.vals.len()
        }
    }

    /// Integer contents when every element is a known integer.
    pub fn consts(&self) -> Option<Vec<i64>> {
        if self.is_float() {
            return None;
        }
        self.vals.iter().map(Dim::as_const).collect()
    }

    /// Contents as f64 (ints converted) when all are constants.
    pub fn as_f64s(&self) -> Option<Vec<f64>> {
        if self.is_float() {
            Some(self.floats.clone())
        } else {
            self.consts().map(|v| v.into_iter().map(|x| x as f64).collect())
        }
    }

    /// The type of the tensor.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.dims.iter().map(|&d| Dim::from(d)).collect())
    }

    /// Contents of a small inline tensor.
    pub fn from_tensor(t: &Tensor) -> Option<Known> {
        if t.numel() as usize > MAX_KNOWN || t.dims.iter().any(|&d| d < 0) {
            return None;
        }
        if t.dtype.is_float() {
            let f = t.as_f64s()?;
            return Some(Known { dtype: t.dtype, dims: t.dims.clone(), vals: Vec::new(), floats: f });
        }
        let v = t.as_i64s()?;
        Some(Known::ints(t.dtype, t.dims.clone(), v.into_iter().map(Dim::from).collect()))
    }

    /// An inline tensor when every element is constant.
    pub fn to_tensor(&self) -> Option<Tensor> {
        if self.is_float() {
            Tensor::from_f64s(self.dtype, self.dims.clone(), &self.floats)
        } else {
            Tensor::from_i64s(self.dtype, self.dims.clone(), &self.consts()?)
        }
    }
}

/// What inference produced for one node.
#[derive(Clone, Debug, Default)]
pub struct Inferred {
    pub types: Vec<TensorType>,
    pub known: Vec<Option<Known>>,
}

impl Inferred {
    pub fn one(t: TensorType) -> Inferred {
        Inferred { types: vec![t], known: vec![None] }
    }

    pub fn many(ts: Vec<TensorType>) -> Inferred {
        let n = ts.len();
        Inferred { types: ts, known: vec![None; n] }
    }

    pub fn with_known(t: TensorType, k: Option<Known>) -> Inferred {
        Inferred { types: vec![t], known: vec![k] }
    }
}

/// Outcome of per-node inference.
#[derive(Clone, Debug)]
pub enum Outcome {
    Done(Inferred),
    /// The op has no inference here (opaque, control flow): keep declared types.
    Skip(String),
}

pub type InferResult = Result<Outcome, String>;

/// Everything per-node inference looks at.
#[derive(Debug)]
pub struct Cx<'a> {
    pub node: &'a Node,
    pub opset: i64,
    /// Input types by slot; `None` for an omitted optional input.
    pub tys: Vec<Option<TensorType>>,
    /// Known contents by slot.
    pub known: Vec<Option<Known>>,
    /// Output value names (for fresh, data-dependent symbols).
    pub out_names: Vec<String>,
}

impl<'a> Cx<'a> {
    pub fn n_in(&self) -> usize {
        self.tys.len()
    }

    pub fn n_out(&self) -> usize {
        self.out_names.len()
    }

    pub fn has(&self, i: usize) -> bool {
        matches!(self.tys.get(i), Some(Some(_)))
    }

    pub fn ty(&self, i: usize) -> Option<&TensorType> {
        self.tys.get(i).and_then(Option::as_ref)
    }

    pub fn dtype(&self, i: usize) -> Option<DType> {
        self.ty(i).and_then(|t| t.dtype)
    }

    pub fn shape(&self, i: usize) -> Option<&[Dim]> {
        self.ty(i).and_then(|t| t.shape.as_deref())
    }

    /// Input `i`'s type; error if the input is missing.
    pub fn req(&self, i: usize) -> Result<&TensorType, String> {
        self.ty(i).ok_or_else(|| format!("missing required input {i}"))
    }

    pub fn known(&self, i: usize) -> Option<&Known> {
        self.known.get(i).and_then(Option::as_ref)
    }

    /// Integer contents of input `i` as Dims.
    pub fn known_dims(&self, i: usize) -> Option<&[Dim]> {
        self.known(i).filter(|k| !k.is_float()).map(|k| k.vals.as_slice())
    }

    pub fn known_ints(&self, i: usize) -> Option<Vec<i64>> {
        self.known(i)?.consts()
    }

    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.node.attr(name)
    }

    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.node.attr_int(name).unwrap_or(default)
    }

    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.node.attr_ints(name).map(<[i64]>::to_vec)
    }

    pub fn string(&self, name: &str) -> Option<&str> {
        self.node.attr_str(name)
    }

    /// A dtype attribute (ONNX code) such as Cast's `to`.
    pub fn dtype_attr(&self, name: &str) -> Result<Option<DType>, String> {
        match self.node.attr_int(name) {
            None => Ok(None),
            Some(c) => {
                let c32 = i32::try_from(c).map_err(|_| format!("attribute {name}: bad dtype code {c}"))?;
                DType::from_onnx_code(c32).map(Some).ok_or_else(|| format!("attribute {name}: unknown dtype code {c}"))
            }
        }
    }

    /// A fresh symbol for a data-dependent dimension of output `slot`.
    pub fn fresh(&self, slot: usize, what: &str) -> Dim {
        let base = self.out_names.get(slot).map_or("out", String::as_str);
        Dim::sym(&format!("{base}:{what}"))
    }

    /// Axes from the attribute (before `input_from`) or from input `slot`.
    /// `Ok(None)` when absent; `Err(())`-like `None` contents → `Unknown`.
    pub fn axes(&self, attr: &str, slot: usize, input_from: i64) -> AxesSrc {
        if self.opset < input_from {
            match self.ints(attr) {
                Some(v) => AxesSrc::Known(v),
                None => AxesSrc::Absent,
            }
        } else if !self.has(slot) {
            // Some exporters still write the attribute; accept it.
            match self.ints(attr) {
                Some(v) => AxesSrc::Known(v),
                None => AxesSrc::Absent,
            }
        } else {
            match self.known_ints(slot) {
                Some(v) => AxesSrc::Known(v),
                None => AxesSrc::Unknown,
            }
        }
    }
}

/// Where a list of axes came from.
#[derive(Clone, Debug, PartialEq)]
pub enum AxesSrc {
    Known(Vec<i64>),
    Absent,
    /// Given as an input whose contents are not known.
    Unknown,
}

/// Normalize a possibly negative axis against `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        Err(format!("axis {axis} out of range for rank {rank}"))
    } else {
        Ok(a as usize)
    }
}

/// Normalize a list of axes; duplicates are an error.
pub fn norm_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(a, rank)?;
        if out.contains(&n) {
            return Err(format!("axis {a} repeated"));
        }
        out.push(n);
    }
    Ok(out)
}

/// Broadcast two dims: `1` vs `d` is `d`; equal dims stay; two different
/// known integers ≠ 1 are an error; differing symbols pick the non-constant
/// one (the runtime must make them agree).
pub fn broadcast_dim(a: &Dim, b: &Dim) -> Result<Dim, String> {
    if a == b {
        return Ok(a.clone());
    }
    match (a.as_const(), b.as_const()) {
        (Some(1), _) => Ok(b.clone()),
        (_, Some(1)) => Ok(a.clone()),
        (Some(x), Some(y)) => Err(format!("cannot broadcast dimension {x} with {y}")),
        // A symbol against a constant ≠ 1: the symbol must equal the constant.
        (Some(_), None) => Ok(a.clone()),
        (None, Some(_)) => Ok(b.clone()),
        (None, None) => Ok(a.clone()),
    }
}

/// Multidirectional (numpy) broadcasting of two shapes.
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    let n = a.len().max(b.len());
    let one = Dim::from(1);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n { &a[i + a.len() - n] } else { &one };
        let db = if i + b.len() >= n { &b[i + b.len() - n] } else { &one };
        out.push(broadcast_dim(da, db).map_err(|e| format!("{e} (shapes [{}] and [{}])", join(a), join(b)))?);
    }
    Ok(out)
}

/// Broadcast many shapes; `None` if any is unknown.
pub fn broadcast_all(shapes: &[Option<&[Dim]>]) -> Result<Option<Vec<Dim>>, String> {
    let mut acc: Vec<Dim> = Vec::new();
    for s in shapes {
        match s {
            Some(s) => acc = broadcast(&acc, s)?,
            None => return Ok(None),
        }
    }
    Ok(Some(acc))
}

pub fn join(s: &[Dim]) -> String {
    s.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// Product of dims.
pub fn product(s: &[Dim]) -> Dim {
    s.iter().fold(Dim::from(1), |a, d| a.mul(d))
}

/// Build a type from optional parts.
pub fn tt(dtype: Option<DType>, shape: Option<Vec<Dim>>) -> TensorType {
    TensorType { container: None, dtype, shape }
}

pub fn done(t: TensorType) -> InferResult {
    Ok(Outcome::Done(Inferred::one(t)))
}

pub fn done_many(ts: Vec<TensorType>) -> InferResult {
    Ok(Outcome::Done(Inferred::many(ts)))
}

pub fn done_known(t: TensorType, k: Option<Known>) -> InferResult {
    Ok(Outcome::Done(Inferred::with_known(t, k)))
}

/// Elementwise op on known integer contents with broadcasting (scalars and
/// equal-length vectors, or one side of length 1).
pub fn zip_known(a: &Known, b: &Known, f: &dyn Fn(&Dim, &Dim) -> Option<Dim>) -> Option<(Vec<i64>, Vec<Dim>)> {
    if a.is_float() || b.is_float() {
        return None;
    }
    let (la, lb) = (a.vals.len(), b.vals.len());
    let n = if la == lb {
        la
    } else if la == 1 {
        lb
    } else if lb == 1 {
        la
    } else {
        return None;
    };
    if (a.dims.len() > 1 || b.dims.len() > 1) && a.dims != b.dims {
        return None;
    }
    let dims = if a.dims.len() >= b.dims.len() && la == n { a.dims.clone() } else { b.dims.clone() };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let x = &a.vals[if la == 1 { 0 } else { i }];
        let y = &b.vals[if lb == 1 { 0 } else { i }];
        out.push(f(x, y)?);
    }
    Some((dims, out))
}
