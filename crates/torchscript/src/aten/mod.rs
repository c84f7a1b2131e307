//! `aten` and `prim` calls onto IR ops, with ONNX semantics: `linear` is
//! `Gemm` (2-D input) or `MatMul` by the transposed weight plus `Add`;
//! `scaled_dot_product_attention` is `MatMul → Mul → mask → Softmax →
//! MatMul`; sizes are `Shape → Gather` unless the dimension is static;
//! scalars become `Constant`s of the other operand's element type. Anything
//! without a mapping is `Op::Opaque { domain: "aten" }`, keeping its non-tensor
//! arguments as attributes.

use qsync_ir::{Attr, DType, Dim, Op, Tensor, ValueId};

use crate::error::Result;
use crate::lower::{Lowerer, Val};

mod compound;
use compound::{
    adaptive_pool, arange, baddbmm, conv, fill, index, max_min, ones_like, pad, pool, sdpa, split, unflatten,
};

/// Positional-or-keyword argument access.
pub(crate) struct Args {
    pos: Vec<Val>,
    kw: Vec<(String, Val)>,
}

impl Args {
    pub(crate) fn get(&self, i: usize, name: &str) -> Val {
        self.kw
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| self.pos.get(i).cloned())
            .unwrap_or(Val::None)
    }
}

/// The IR dtype of a TorchScript scalar-type code.
pub fn scalar_type(code: i64) -> Option<DType> {
    Some(match code {
        0 => DType::U8,
        1 => DType::I8,
        2 => DType::I16,
        3 => DType::I32,
        4 => DType::I64,
        5 => DType::F16,
        6 => DType::F32,
        7 => DType::F64,
        11 => DType::Bool,
        15 => DType::BF16,
        _ => return None,
    })
}

fn scalar_code(d: DType) -> i64 {
    match d {
        DType::U8 => 0,
        DType::I8 => 1,
        DType::I16 => 2,
        DType::I32 => 3,
        DType::I64 => 4,
        DType::F16 => 5,
        DType::F64 => 7,
        DType::Bool => 11,
        DType::BF16 => 15,
        _ => 6,
    }
}

pub(crate) fn ints(v: &Val) -> Option<Vec<i64>> {
    match v {
        Val::Int(i) => Some(vec![*i]),
        Val::List(x) | Val::Tuple(x) => x.iter().map(|e| if let Val::Int(i) = e { Some(*i) } else { None }).collect(),
        _ => None,
    }
}

pub(crate) fn int(v: &Val) -> Option<i64> {
    match v {
        Val::Int(i) => Some(*i),
        Val::Bool(b) => Some(i64::from(*b)),
        _ => None,
    }
}

pub(crate) fn float(v: &Val) -> Option<f64> {
    match v {
        Val::Int(i) => Some(*i as f64),
        Val::Float(f) => Some(*f),
        _ => None,
    }
}

/// Promote two element types the way torch does for tensor–tensor ops.
fn promote(a: DType, b: DType) -> DType {
    let rank = |d: DType| -> (u8, u32) {
        if d.is_float() {
            (2, d.bits())
        } else if d == DType::Bool {
            (0, 1)
        } else {
            (1, d.bits())
        }
    };
    if rank(a) >= rank(b) {
        a
    } else {
        b
    }
}

impl Lowerer<'_> {
    fn tensor(&self, v: &Val, what: &str) -> Result<ValueId> {
        match v {
            Val::Tensor(t) => Ok(*t),
            other => self.err(format!("{what}: expected a tensor, got {other:?}")),
        }
    }

    fn dtype_of(&self, v: ValueId) -> Option<DType> {
        self.ty(v).dtype
    }

    /// A tensor for `v`; numbers become constants of `like`'s element type
    /// (floats stay float when `like` is an integer tensor).
    fn as_tensor(&mut self, v: &Val, like: Option<DType>) -> Result<ValueId> {
        match v {
            Val::Tensor(t) => Ok(*t),
            Val::Int(i) => self.const_scalar(like.unwrap_or(DType::I64), *i as f64),
            Val::Bool(b) => {
                self.const_scalar(like.filter(|d| *d == DType::Bool).unwrap_or(DType::Bool), f64::from(u8::from(*b)))
            }
            Val::Float(f) => self.const_scalar(like.filter(|d| d.is_float()).unwrap_or(DType::F32), *f),
            Val::List(_) | Val::Tuple(_) => self.shape_tensor(v),
            other => self.err(format!("expected a tensor or number, got {other:?}")),
        }
    }

    fn cast(&mut self, v: ValueId, to: DType) -> Result<ValueId> {
        if self.dtype_of(v) == Some(to) {
            return Ok(v);
        }
        self.node(Op::Cast, vec![v], vec![("to", Attr::Int(i64::from(to.onnx_code())))])
    }

    /// A 1-D i64 tensor from a list of ints and scalar tensors.
    pub fn shape_tensor(&mut self, v: &Val) -> Result<ValueId> {
        let items = match v {
            Val::List(x) | Val::Tuple(x) => x.clone(),
            Val::Tensor(t) => return Ok(*t),
            Val::Int(i) => vec![Val::Int(*i)],
            other => return self.err(format!("expected a list of sizes, got {other:?}")),
        };
        if let Some(c) = ints(v) {
            return self.const_i64s(&c);
        }
        let mut parts = Vec::new();
        for it in &items {
            let p = match it {
                Val::Int(i) => self.const_i64s(&[*i])?,
                Val::Tensor(t) => {
                    let t = self.cast(*t, DType::I64)?;
                    if self.ty(t).rank() == Some(1) {
                        t
                    } else {
                        let ax = self.const_i64s(&[0])?;
                        self.node(Op::Unsqueeze, vec![t, ax], vec![])?
                    }
                }
                other => return self.err(format!("a size list holds {other:?}")),
            };
            parts.push(p);
        }
        self.node(Op::Concat, parts, vec![("axis", Attr::Int(0))])
    }

    /// `x.size(d)`: an int when static, else `Shape → Gather`.
    pub fn size(&mut self, x: ValueId, d: i64) -> Result<Val> {
        let r = self.rank(x)? as i64;
        let d = if d < 0 { d + r } else { d };
        if let Some(c) = self.ty(x).shape.as_ref().and_then(|s| s.get(d as usize)).and_then(Dim::as_const) {
            return Ok(Val::Int(c));
        }
        let s = self.node(Op::Shape, vec![x], vec![])?;
        let i = self.const_scalar(DType::I64, d as f64)?;
        Ok(Val::Tensor(self.node(Op::Gather, vec![s, i], vec![("axis", Attr::Int(0))])?))
    }

    fn binary(&mut self, op: Op, a: &Val, b: &Val) -> Result<ValueId> {
        let (ta, tb) = match (a, b) {
            (Val::Tensor(x), Val::Tensor(y)) => {
                let (x, y) = (*x, *y);
                match (self.dtype_of(x), self.dtype_of(y)) {
                    (Some(p), Some(q)) if p != q => {
                        // A 0-d tensor of a lower category follows the other operand (torch's scalar rule).
                        let t = promote(p, q);
                        (self.cast(x, t)?, self.cast(y, t)?)
                    }
                    _ => (x, y),
                }
            }
            (Val::Tensor(x), s) => {
                let d = self.dtype_of(*x);
                let y = self.as_tensor(s, d)?;
                let x = match (d, s) {
                    (Some(dd), Val::Float(_)) if !dd.is_float() => self.cast(*x, DType::F32)?,
                    _ => *x,
                };
                (x, y)
            }
            (s, Val::Tensor(y)) => {
                let d = self.dtype_of(*y);
                (self.as_tensor(s, d)?, *y)
            }
            _ => (self.as_tensor(a, None)?, self.as_tensor(b, None)?),
        };
        self.node(op, vec![ta, tb], vec![])
    }

    fn opaque(&mut self, name: &str, a: &Args) -> Result<Val> {
        self.warn(format!("aten::{name} has no IR mapping: kept opaque"));
        let mut inputs = Vec::new();
        let mut attrs: Vec<(String, Attr)> = Vec::new();
        let all: Vec<(String, Val)> =
            a.pos.iter().enumerate().map(|(i, v)| (format!("arg{i}"), v.clone())).chain(a.kw.iter().cloned()).collect();
        for (k, v) in all {
            match v {
                Val::Tensor(t) => inputs.push(Some(t)),
                Val::Int(i) => attrs.push((k, Attr::Int(i))),
                Val::Bool(b) => attrs.push((k, Attr::Int(i64::from(b)))),
                Val::Float(f) => attrs.push((k, Attr::Float(f as f32))),
                Val::Str(s) => attrs.push((k, Attr::String(s.into_bytes()))),
                ref l @ (Val::List(_) | Val::Tuple(_)) => {
                    if let Some(x) = ints(l) {
                        attrs.push((k, Attr::Ints(x)));
                    } else if let Val::List(x) | Val::Tuple(x) = l {
                        for e in x {
                            if let Val::Tensor(t) = e {
                                inputs.push(Some(*t));
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        let op = Op::Opaque { domain: "aten".into(), op_type: name.into() };
        let refs: Vec<(&str, Attr)> = attrs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let out = self.node_n(op, inputs, refs, 1)?;
        Ok(out.first().map_or(Val::None, |&v| Val::Tensor(v)))
    }
}

/// Lower `ops.prim.<name>`.
pub fn prim(lw: &mut Lowerer, name: &str, args: Vec<Val>) -> Result<Val> {
    let first = args.first().cloned().unwrap_or(Val::None);
    match name {
        "NumToTensor" => match first {
            Val::Int(_) | Val::Float(_) | Val::Bool(_) | Val::Tensor(_) => Ok(first),
            v => lw.err(format!("NumToTensor of {v:?}")),
        },
        "TupleUnpack" | "unchecked_cast" | "device" => Ok(first),
        "dtype" => {
            let t = lw.tensor(&first, "prim::dtype")?;
            Ok(Val::Int(lw.dtype_of(t).map_or(6, scalar_code)))
        }
        "shape" => {
            let t = lw.tensor(&first, "prim::shape")?;
            let r = lw.rank(t)?;
            let dims = (0..r as i64).map(|d| lw.size(t, d)).collect::<Result<Vec<_>>>()?;
            Ok(Val::List(dims))
        }
        "min" | "max" => match (first, args.get(1)) {
            (Val::Int(a), Some(Val::Int(b))) => Ok(Val::Int(if name == "min" { a.min(*b) } else { a.max(*b) })),
            _ => lw.err(format!("prim::{name} on non-integers is not supported")),
        },
        _ => lw.err(format!("unsupported prim op `prim::{name}`")),
    }
}

fn unary_op(name: &str) -> Option<Op> {
    Some(match name {
        "relu" => Op::Relu,
        "tanh" => Op::Tanh,
        "sigmoid" => Op::Sigmoid,
        "exp" => Op::Exp,
        "log" => Op::Log,
        "sqrt" => Op::Sqrt,
        "neg" => Op::Neg,
        "abs" => Op::Abs,
        "erf" => Op::Erf,
        "floor" => Op::Floor,
        "ceil" => Op::Ceil,
        "sin" => Op::Sin,
        "cos" => Op::Cos,
        "reciprocal" => Op::Reciprocal,
        "logical_not" | "bitwise_not" | "__not__" => Op::Not,
        "hardswish" => Op::HardSwish,
        "softplus" => Op::Softplus,
        "elu" => Op::Elu,
        _ => return None,
    })
}

fn binary_op(name: &str) -> Option<Op> {
    Some(match name {
        "mul" => Op::Mul,
        "pow" => Op::Pow,
        "eq" => Op::Equal,
        "lt" => Op::Less,
        "le" => Op::LessOrEqual,
        "gt" => Op::Greater,
        "ge" => Op::GreaterOrEqual,
        "__and__" | "bitwise_and" | "logical_and" => Op::And,
        "__or__" | "bitwise_or" | "logical_or" => Op::Or,
        "__xor__" | "bitwise_xor" | "logical_xor" => Op::Xor,
        "maximum" => Op::Max,
        "minimum" => Op::Min,
        "remainder" | "fmod" => Op::Mod,
        _ => return None,
    })
}

/// Lower `torch.<name>(…)`. A lowering that needs a rank or size the graph
/// does not know (downstream of an opaque op) degrades to an opaque node.
pub fn lower(lw: &mut Lowerer, name: &str, pos: Vec<Val>, kw: Vec<(String, Val)>) -> Result<Val> {
    let name = if name.ends_with('_') && !name.starts_with("__") { name.trim_end_matches('_') } else { name };
    let a = Args { pos, kw };
    match lower_op(lw, name, &a) {
        Err(crate::TsError::Code { msg, .. }) if msg.contains(UNKNOWN_RANK) => lw.opaque(name, &a),
        r => r,
    }
}

/// The marker of [`Lowerer::rank`]'s error, for the fallback above.
pub(crate) const UNKNOWN_RANK: &str = "rank is unknown";

fn lower_op(lw: &mut Lowerer, name: &str, a: &Args) -> Result<Val> {
    let x0 = a.get(0, "input");
    let t = |v| Ok(Val::Tensor(v));
    if let Some(op) = unary_op(name) {
        let x = lw.tensor(&x0, name)?;
        return t(lw.node(op, vec![x], vec![])?);
    }
    if let Some(op) = binary_op(name) {
        if matches!(op, Op::And | Op::Or | Op::Xor) {
            let (x, y) = (lw.as_tensor(&x0, Some(DType::Bool))?, lw.as_tensor(&a.get(1, "other"), Some(DType::Bool))?);
            let (x, y) = (lw.cast(x, DType::Bool)?, lw.cast(y, DType::Bool)?);
            return t(lw.node(op, vec![x, y], vec![])?);
        }
        return t(lw.binary(op, &x0, &a.get(1, "other"))?);
    }
    match name {
        "add" | "sub" | "rsub" => {
            let (mut x, mut y) = (x0.clone(), a.get(1, "other"));
            if name == "rsub" {
                std::mem::swap(&mut x, &mut y);
            }
            let alpha = float(&a.get(2, "alpha")).unwrap_or(1.0);
            if alpha != 1.0 {
                let yy = if name == "rsub" { &x0 } else { &y };
                let s = Val::Tensor(lw.binary(Op::Mul, yy, &Val::Float(alpha))?);
                if name == "rsub" {
                    x = a.get(1, "other");
                    y = s;
                } else {
                    y = s;
                }
            }
            let op = if name == "add" { Op::Add } else { Op::Sub };
            if let (Val::Int(_) | Val::Float(_), Val::Int(_) | Val::Float(_)) = (&x, &y) {
                let (p, q) = (float(&x).unwrap_or(0.0), float(&y).unwrap_or(0.0));
                let r = if op == Op::Add { p + q } else { p - q };
                return Ok(if matches!((&x, &y), (Val::Int(_), Val::Int(_))) {
                    Val::Int(r as i64)
                } else {
                    Val::Float(r)
                });
            }
            t(lw.binary(op, &x, &y)?)
        }
        "div" | "floor_divide" | "floordiv" | "true_divide" => {
            let mode = match a.get(2, "rounding_mode") {
                Val::Str(s) => Some(s),
                _ if name.starts_with("floor") => Some("floor".to_string()),
                _ => None,
            };
            let q = lw.binary(Op::Div, &x0, &a.get(1, "other"))?;
            let float_out = lw.dtype_of(q).is_some_and(DType::is_float);
            match mode.as_deref() {
                Some("floor") if float_out => t(lw.node(Op::Floor, vec![q], vec![])?),
                _ => t(q),
            }
        }
        "ne" => {
            let e = lw.binary(Op::Equal, &x0, &a.get(1, "other"))?;
            t(lw.node(Op::Not, vec![e], vec![])?)
        }
        "gelu" => {
            let x = lw.tensor(&x0, name)?;
            let attrs = match a.get(1, "approximate") {
                Val::Str(s) if s == "tanh" => vec![("approximate", Attr::String(b"tanh".to_vec()))],
                _ => vec![],
            };
            t(lw.node(Op::Gelu, vec![x], attrs)?)
        }
        "silu" => {
            let x = lw.tensor(&x0, name)?;
            let s = lw.node(Op::Sigmoid, vec![x], vec![])?;
            t(lw.node(Op::Mul, vec![x, s], vec![])?)
        }
        "rsqrt" => {
            let x = lw.tensor(&x0, name)?;
            let s = lw.node(Op::Sqrt, vec![x], vec![])?;
            t(lw.node(Op::Reciprocal, vec![s], vec![])?)
        }
        "leaky_relu" => {
            let x = lw.tensor(&x0, name)?;
            let alpha = float(&a.get(1, "negative_slope")).unwrap_or(0.01) as f32;
            t(lw.node(Op::LeakyRelu, vec![x], vec![("alpha", Attr::Float(alpha))])?)
        }
        "hardtanh" | "relu6" | "clamp" | "clip" => {
            let x = lw.tensor(&x0, name)?;
            let d = lw.dtype_of(x);
            let (lo, hi) = match name {
                "relu6" => (Val::Float(0.0), Val::Float(6.0)),
                "hardtanh" => (
                    if matches!(a.get(1, "min_val"), Val::None) { Val::Float(-1.0) } else { a.get(1, "min_val") },
                    if matches!(a.get(2, "max_val"), Val::None) { Val::Float(1.0) } else { a.get(2, "max_val") },
                ),
                _ => (a.get(1, "min"), a.get(2, "max")),
            };
            let lo = if matches!(lo, Val::None) { None } else { Some(lw.as_tensor(&lo, d)?) };
            let hi = if matches!(hi, Val::None) { None } else { Some(lw.as_tensor(&hi, d)?) };
            let lo = match lo {
                Some(v) => Some(lw.cast(v, d.unwrap_or(DType::F32))?),
                None => None,
            };
            let hi = match hi {
                Some(v) => Some(lw.cast(v, d.unwrap_or(DType::F32))?),
                None => None,
            };
            let out = lw.node_n(Op::Clip, vec![Some(x), lo, hi], vec![], 1)?;
            t(out[0])
        }
        "hardsigmoid" => {
            let x = lw.tensor(&x0, name)?;
            t(lw.node(Op::HardSigmoid, vec![x], vec![("alpha", Attr::Float(1.0 / 6.0)), ("beta", Attr::Float(0.5))])?)
        }
        "softmax" | "log_softmax" => {
            let x = lw.tensor(&x0, name)?;
            let x = match int(&a.get(2, "dtype")).and_then(scalar_type) {
                Some(d) => lw.cast(x, d)?,
                None => x,
            };
            let axis = int(&a.get(1, "dim")).unwrap_or(-1);
            let op = if name == "softmax" { Op::Softmax } else { Op::LogSoftmax };
            t(lw.node(op, vec![x], vec![("axis", Attr::Int(axis))])?)
        }
        "contiguous" | "clone" | "detach" | "alias" | "lift_fresh" => Ok(x0),
        "dropout" | "feature_dropout" | "alpha_dropout" | "feature_alpha_dropout" => {
            let x = lw.tensor(&x0, name)?;
            if !matches!(a.get(2, "train"), Val::Bool(true)) {
                return t(x);
            }
            let p = lw.const_scalar(DType::F32, float(&a.get(1, "p")).unwrap_or(0.5))?;
            let tr = lw.const_scalar(DType::Bool, 1.0)?;
            let out = lw.node_n(Op::Dropout, vec![Some(x), Some(p), Some(tr)], vec![], 1)?;
            t(out[0])
        }
        "size" => {
            let x = lw.tensor(&x0, name)?;
            match a.get(1, "dim") {
                Val::Int(d) => lw.size(x, d),
                _ => {
                    let r = lw.rank(x)? as i64;
                    Ok(Val::List((0..r).map(|d| lw.size(x, d)).collect::<Result<_>>()?))
                }
            }
        }
        "dim" => {
            let x = lw.tensor(&x0, name)?;
            Ok(Val::Int(lw.rank(x)? as i64))
        }
        "view" | "reshape" | "_reshape_alias" => {
            let x = lw.tensor(&x0, name)?;
            let s = lw.shape_tensor(&a.get(1, "shape"))?;
            t(lw.node(Op::Reshape, vec![x, s], vec![])?)
        }
        "flatten" => {
            let x = lw.tensor(&x0, name)?;
            let r = lw.rank(x)? as i64;
            let norm = |d: i64| if d < 0 { d + r } else { d };
            let s = norm(int(&a.get(1, "start_dim")).unwrap_or(0));
            let e = norm(int(&a.get(2, "end_dim")).unwrap_or(-1));
            if r == 0 || s >= e {
                return t(x);
            }
            if s == 1 && e == r - 1 {
                return t(lw.node(Op::Flatten, vec![x], vec![("axis", Attr::Int(1))])?);
            }
            let mut dims = Vec::new();
            for d in 0..s {
                dims.push(lw.size(x, d)?);
            }
            dims.push(Val::Int(-1));
            for d in e + 1..r {
                dims.push(lw.size(x, d)?);
            }
            let sh = lw.shape_tensor(&Val::List(dims))?;
            t(lw.node(Op::Reshape, vec![x, sh], vec![])?)
        }
        "permute" => {
            let x = lw.tensor(&x0, name)?;
            let r = lw.rank(x)? as i64;
            let p = ints(&a.get(1, "dims")).ok_or_else(|| lw.error("permute: dims are not constant"))?;
            let p: Vec<i64> = p.into_iter().map(|d| if d < 0 { d + r } else { d }).collect();
            t(lw.node(Op::Transpose, vec![x], vec![("perm", Attr::Ints(p))])?)
        }
        "transpose" | "t" | "swapaxes" => {
            let x = lw.tensor(&x0, name)?;
            let r = lw.rank(x)? as i64;
            let (d0, d1) = if name == "t" {
                (0, 1)
            } else {
                (int(&a.get(1, "dim0")).unwrap_or(0), int(&a.get(2, "dim1")).unwrap_or(1))
            };
            if r < 2 {
                return t(x);
            }
            let (d0, d1) = ((d0 + r) % r, (d1 + r) % r);
            let mut p: Vec<i64> = (0..r).collect();
            p.swap(d0 as usize, d1 as usize);
            t(lw.node(Op::Transpose, vec![x], vec![("perm", Attr::Ints(p))])?)
        }
        "slice" => {
            let x = lw.tensor(&x0, name)?;
            let dim = int(&a.get(1, "dim")).unwrap_or(0);
            let (start, end, step) = (a.get(2, "start"), a.get(3, "end"), int(&a.get(4, "step")).unwrap_or(1));
            let start = if matches!(start, Val::None) { Val::Int(0) } else { start };
            let end = if matches!(end, Val::None) { Val::Int(i64::MAX) } else { end };
            if matches!(start, Val::Int(0)) && matches!(end, Val::Int(e) if e >= i64::MAX / 2) && step == 1 {
                return t(x);
            }
            let s = lw.shape_tensor(&Val::List(vec![start]))?;
            let e = lw.shape_tensor(&Val::List(vec![end]))?;
            let ax = lw.const_i64s(&[dim])?;
            let st = lw.const_i64s(&[step])?;
            t(lw.node(Op::Slice, vec![x, s, e, ax, st], vec![])?)
        }
        "select" => {
            let x = lw.tensor(&x0, name)?;
            let dim = int(&a.get(1, "dim")).unwrap_or(0);
            let i = lw.as_tensor(&a.get(2, "index"), Some(DType::I64))?;
            t(lw.node(Op::Gather, vec![x, i], vec![("axis", Attr::Int(dim))])?)
        }
        "unsqueeze" | "squeeze" => {
            let x = lw.tensor(&x0, name)?;
            let op = if name == "unsqueeze" { Op::Unsqueeze } else { Op::Squeeze };
            match ints(&a.get(1, "dim")) {
                Some(d) => {
                    let ax = lw.const_i64s(&d)?;
                    t(lw.node(op, vec![x, ax], vec![])?)
                }
                None => t(lw.node(op, vec![x], vec![])?),
            }
        }
        "cat" | "concat" | "stack" => {
            let (Val::List(items) | Val::Tuple(items)) = a.get(0, "tensors") else {
                return lw.err(format!("{name}: expected a list"));
            };
            let dim = int(&a.get(1, "dim")).unwrap_or(0);
            let mut parts = Vec::new();
            for it in &items {
                let v = lw.tensor(it, name)?;
                parts.push(if name == "stack" {
                    let ax = lw.const_i64s(&[dim])?;
                    lw.node(Op::Unsqueeze, vec![v, ax], vec![])?
                } else {
                    v
                });
            }
            t(lw.node(Op::Concat, parts, vec![("axis", Attr::Int(dim))])?)
        }
        "embedding" => {
            let w = lw.tensor(&x0, name)?;
            let i = lw.tensor(&a.get(1, "indices"), name)?;
            t(lw.node(Op::Gather, vec![w, i], vec![("axis", Attr::Int(0))])?)
        }
        "linear" => {
            let x = lw.tensor(&x0, name)?;
            let w = lw.tensor(&a.get(1, "weight"), name)?;
            let b = a.get(2, "bias");
            if lw.rank(x)? == 2 {
                let mut ins = vec![Some(x), Some(w)];
                if let Val::Tensor(b) = b {
                    ins.push(Some(b));
                }
                return t(lw.node_n(Op::Gemm, ins, vec![("transB", Attr::Int(1))], 1)?[0]);
            }
            let wt = lw.node(Op::Transpose, vec![w], vec![("perm", Attr::Ints(vec![1, 0]))])?;
            let y = lw.node(Op::MatMul, vec![x, wt], vec![])?;
            match b {
                Val::Tensor(b) => t(lw.node(Op::Add, vec![y, b], vec![])?),
                _ => t(y),
            }
        }
        "matmul" | "mm" | "bmm" => {
            let (x, y) = (lw.tensor(&x0, name)?, lw.tensor(&a.get(1, "other"), name)?);
            t(lw.node(Op::MatMul, vec![x, y], vec![])?)
        }
        "addmm" => {
            let c = lw.tensor(&x0, name)?;
            let (m1, m2) = (lw.tensor(&a.get(1, "mat1"), name)?, lw.tensor(&a.get(2, "mat2"), name)?);
            let beta = float(&a.get(3, "beta")).unwrap_or(1.0) as f32;
            let alpha = float(&a.get(4, "alpha")).unwrap_or(1.0) as f32;
            t(lw.node(Op::Gemm, vec![m1, m2, c], vec![("alpha", Attr::Float(alpha)), ("beta", Attr::Float(beta))])?)
        }
        "_convolution" | "conv1d" | "conv2d" | "conv3d" | "conv_transpose1d" | "conv_transpose2d" => conv(lw, name, a),
        "batch_norm" => {
            let x = lw.tensor(&x0, name)?;
            let (mean, var) = (lw.tensor(&a.get(3, "running_mean"), name)?, lw.tensor(&a.get(4, "running_var"), name)?);
            let w = match a.get(1, "weight") {
                Val::Tensor(w) => w,
                _ => lw.node(Op::Identity, vec![var], vec![]).and_then(|v| ones_like(lw, v))?,
            };
            let b = match a.get(2, "bias") {
                Val::Tensor(b) => b,
                _ => lw.node(Op::Sub, vec![mean, mean], vec![])?,
            };
            let eps = float(&a.get(7, "eps")).unwrap_or(1e-5) as f32;
            let mom = 1.0 - float(&a.get(6, "momentum")).unwrap_or(0.1) as f32;
            let mut attrs = vec![("epsilon", Attr::Float(eps)), ("momentum", Attr::Float(mom))];
            if matches!(a.get(5, "training"), Val::Bool(true)) {
                attrs.push(("training_mode", Attr::Int(1)));
            }
            t(lw.node(Op::BatchNormalization, vec![x, w, b, mean, var], attrs)?)
        }
        "layer_norm" => {
            let x = lw.tensor(&x0, name)?;
            let shape =
                ints(&a.get(1, "normalized_shape")).ok_or_else(|| lw.error("layer_norm: shape is not constant"))?;
            let w = match a.get(2, "weight") {
                Val::Tensor(w) => w,
                _ => {
                    let n: i64 = shape.iter().product();
                    lw.constant(Tensor::from_f32(shape.clone(), &vec![1.0; n.max(0) as usize]))?
                }
            };
            let eps = float(&a.get(4, "eps")).unwrap_or(1e-5) as f32;
            let mut ins = vec![Some(x), Some(w)];
            if let Val::Tensor(b) = a.get(3, "bias") {
                ins.push(Some(b));
            }
            let attrs = vec![("axis", Attr::Int(-(shape.len() as i64))), ("epsilon", Attr::Float(eps))];
            t(lw.node_n(Op::LayerNormalization, ins, attrs, 1)?[0])
        }
        "max_pool1d" | "max_pool2d" | "avg_pool1d" | "avg_pool2d" => pool(lw, name, a),
        "adaptive_avg_pool1d" | "adaptive_avg_pool2d" | "adaptive_max_pool2d" | "adaptive_avg_pool3d" => {
            adaptive_pool(lw, name, a)
        }
        "split" | "split_with_sizes" | "chunk" | "unbind" => split(lw, name, a),
        "max" | "min" => max_min(lw, name, a),
        "baddbmm" => baddbmm(lw, a),
        "constant_pad_nd" | "pad" => pad(lw, name, a),
        "unflatten" => unflatten(lw, a),
        "repeat" => {
            let x = lw.tensor(&x0, name)?;
            let r = lw.shape_tensor(&a.get(1, "repeats"))?;
            t(lw.node(Op::Tile, vec![x, r], vec![])?)
        }
        "ScalarImplicit" | "Int" | "Float" | "Bool" | "numpy_T" => Ok(x0),
        "mean" | "sum" | "amax" | "amin" => {
            let x = lw.tensor(&x0, name)?;
            let dims = ints(&a.get(1, "dim"));
            let keep = int(&a.get(2, "keepdim")).unwrap_or(0);
            let op = match name {
                "mean" => Op::ReduceMean,
                "sum" => Op::ReduceSum,
                "amax" => Op::ReduceMax,
                _ => Op::ReduceMin,
            };
            let mut ins = vec![Some(x)];
            let mut attrs = vec![("keepdims", Attr::Int(keep))];
            if let Some(d) = dims {
                if op == Op::ReduceSum {
                    ins.push(Some(lw.const_i64s(&d)?));
                } else {
                    attrs.push(("axes", Attr::Ints(d)));
                }
            }
            t(lw.node_n(op, ins, attrs, 1)?[0])
        }
        "to" | "type_as" | "float" | "long" | "int" | "half" | "bool" | "double" => {
            let x = lw.tensor(&x0, name)?;
            let target = match name {
                "float" => Some(DType::F32),
                "long" => Some(DType::I64),
                "int" => Some(DType::I32),
                "half" => Some(DType::F16),
                "bool" => Some(DType::Bool),
                "double" => Some(DType::F64),
                _ => None,
            };
            if let Some(d) = target {
                return t(lw.cast(x, d)?);
            }
            if let Val::Int(code) = a.get(usize::MAX, "dtype") {
                let d = scalar_type(code).ok_or_else(|| lw.error(format!("unknown scalar type {code}")))?;
                return t(lw.cast(x, d)?);
            }
            for v in a.pos.iter().skip(1) {
                match v {
                    Val::Int(code) => {
                        let d = scalar_type(*code).ok_or_else(|| lw.error(format!("unknown scalar type {code}")))?;
                        return t(lw.cast(x, d)?);
                    }
                    Val::Tensor(o) => return t(lw.node(Op::CastLike, vec![x, *o], vec![])?),
                    _ => {}
                }
            }
            t(x)
        }
        "where" => {
            let c = lw.tensor(&x0, name)?;
            let (p, q) = (a.get(1, "self"), a.get(2, "other"));
            let like = match (&p, &q) {
                (Val::Tensor(v), _) | (_, Val::Tensor(v)) => lw.dtype_of(*v),
                _ => None,
            };
            let (p, q) = (lw.as_tensor(&p, like)?, lw.as_tensor(&q, like)?);
            t(lw.node(Op::Where, vec![c, p, q], vec![])?)
        }
        "masked_fill" => {
            let x = lw.tensor(&x0, name)?;
            let m = lw.tensor(&a.get(1, "mask"), name)?;
            let d = lw.dtype_of(x);
            let v = lw.as_tensor(&a.get(2, "value"), d)?;
            let v = lw.cast(v, d.unwrap_or(DType::F32))?;
            let m = lw.cast(m, DType::Bool)?;
            t(lw.node(Op::Where, vec![m, v, x], vec![])?)
        }
        "expand" => {
            let x = lw.tensor(&x0, name)?;
            let sizes = match a.get(1, "size") {
                Val::List(v) | Val::Tuple(v) => {
                    v.into_iter().map(|e| if matches!(e, Val::Int(-1)) { Val::Int(1) } else { e }).collect()
                }
                other => return lw.err(format!("expand: size {other:?}")),
            };
            let s = lw.shape_tensor(&Val::List(sizes))?;
            t(lw.node(Op::Expand, vec![x, s], vec![])?)
        }
        "expand_as" => {
            let x = lw.tensor(&x0, name)?;
            let o = lw.tensor(&a.get(1, "other"), name)?;
            let s = lw.node(Op::Shape, vec![o], vec![])?;
            t(lw.node(Op::Expand, vec![x, s], vec![])?)
        }
        "zeros" | "ones" | "full" | "empty" | "new_empty" | "empty_like" | "new_zeros" | "new_ones" | "new_full"
        | "zeros_like" | "ones_like" | "full_like" => fill(lw, name, a),
        "arange" => arange(lw, a),
        "index" => index(lw, a),
        "gather" => {
            let x = lw.tensor(&x0, name)?;
            let dim = int(&a.get(1, "dim")).unwrap_or(0);
            let i = lw.tensor(&a.get(2, "index"), name)?;
            t(lw.node(Op::GatherElements, vec![x, i], vec![("axis", Attr::Int(dim))])?)
        }
        "scaled_dot_product_attention" => sdpa(lw, a),
        "einsum" => {
            let Val::Str(eq) = x0 else { return lw.err("einsum: equation is not a string") };
            let Val::List(ops) = a.get(1, "tensors") else { return lw.err("einsum: operands are not a list") };
            let ins = ops.iter().map(|o| lw.tensor(o, name)).collect::<Result<Vec<_>>>()?;
            t(lw.node(Op::Einsum, ins, vec![("equation", Attr::String(eq.into_bytes()))])?)
        }
        "tril" | "triu" => {
            let x = lw.tensor(&x0, name)?;
            let k = lw.const_scalar(DType::I64, int(&a.get(1, "diagonal")).unwrap_or(0) as f64)?;
            t(lw.node(Op::Trilu, vec![x, k], vec![("upper", Attr::Int(i64::from(name == "triu")))])?)
        }
        "cumsum" => {
            let x = lw.tensor(&x0, name)?;
            let d = lw.const_scalar(DType::I64, int(&a.get(1, "dim")).unwrap_or(0) as f64)?;
            t(lw.node(Op::CumSum, vec![x, d], vec![])?)
        }
        _ => lw.opaque(name, a),
    }
}
