//! Elementwise ops: unary and activation ops, binary arithmetic and logic
//! with multidirectional broadcasting, comparisons (bool output), variadic
//! Max/Min/Sum/Mean, `Where`, casts and quantization — plus the partial
//! evaluation of integer arithmetic over known (possibly symbolic) contents.

use super::ctx::{broadcast, broadcast_all, done, done_known, done_many, tt, zip_known, Cx, InferResult, Known};
use crate::{DType, Dim, Op, TensorType};

/// Same type as input 0 (unary ops, activations, normalizations that keep shape).
pub fn same_as_input(cx: &Cx) -> InferResult {
    let t = cx.req(0)?.clone();
    let k = if matches!(cx.node.op, Op::Identity) { cx.known(0).cloned() } else { None };
    done_known(t, k)
}

/// Bool output of input 0's shape (IsNaN, IsInf).
pub fn bool_like(cx: &Cx) -> InferResult {
    let t = cx.req(0)?;
    done(tt(Some(DType::Bool), t.shape.clone()))
}

fn div_dim(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a.as_const(), b.as_const()) {
        (Some(x), Some(y)) => (y != 0).then(|| Dim::from(x.wrapping_div(y))),
        (None, Some(y)) if y > 0 && a.is_nonneg() => a.div_exact(b).or_else(|| a.floor_div_const(y)),
        _ => a.div_exact(b),
    }
}

/// `Mod` of two constants: the sign of the divisor (`fmod=0`) or of the
/// dividend (`fmod=1`, C `fmod`).
fn mod_dim(a: &Dim, b: &Dim, fmod: bool) -> Option<Dim> {
    let (x, y) = (a.as_const()?, b.as_const()?);
    if y == 0 {
        return None;
    }
    let r = x.wrapping_rem(y);
    Some(Dim::from(if !fmod && r != 0 && (r < 0) != (y < 0) { r + y } else { r }))
}

fn cmp_dim(op: &Op, a: &Dim, b: &Dim) -> Option<Dim> {
    let bit = |x: bool| Some(Dim::from(i64::from(x)));
    if let (Some(x), Some(y)) = (a.as_const(), b.as_const()) {
        return match op {
            Op::Equal => bit(x == y),
            Op::Less => bit(x < y),
            Op::LessOrEqual => bit(x <= y),
            Op::Greater => bit(x > y),
            Op::GreaterOrEqual => bit(x >= y),
            _ => None,
        };
    }
    if matches!(op, Op::Equal) {
        if a == b {
            return bit(true);
        }
        // A size (non-negative) never equals a negative constant such as -1.
        let neg = |d: &Dim| d.as_const().is_some_and(|c| c < 0);
        if (a.is_nonneg() && neg(b)) || (b.is_nonneg() && neg(a)) {
            return bit(false);
        }
    }
    None
}

/// Binary arithmetic and logic ops with broadcasting.
pub fn binary(cx: &Cx) -> InferResult {
    let (a, b) = (cx.req(0)?, cx.req(1)?);
    let shape = match (&a.shape, &b.shape) {
        (Some(x), Some(y)) => Some(broadcast(x, y)?),
        _ => None,
    };
    let cmp = matches!(cx.node.op, Op::Equal | Op::Less | Op::LessOrEqual | Op::Greater | Op::GreaterOrEqual);
    let dtype =
        if cmp { Some(DType::Bool) } else { a.dtype.or(if matches!(cx.node.op, Op::Pow) { None } else { b.dtype }) };
    let known = match (cx.known(0), cx.known(1)) {
        (Some(ka), Some(kb)) => {
            let op = cx.node.op.clone();
            let fmod = cx.int("fmod", 0) != 0;
            let f = move |x: &Dim, y: &Dim| -> Option<Dim> {
                match op {
                    Op::Add => Some(x.add(y)),
                    Op::Sub => Some(x.sub(y)),
                    Op::Mul => Some(x.mul(y)),
                    Op::Div => div_dim(x, y),
                    Op::Mod => mod_dim(x, y, fmod),
                    Op::And => Some(Dim::from(i64::from(x.as_const()? != 0 && y.as_const()? != 0))),
                    Op::Or => Some(Dim::from(i64::from(x.as_const()? != 0 || y.as_const()? != 0))),
                    _ => cmp_dim(&op, x, y),
                }
            };
            zip_known(ka, kb, &f).and_then(|(dims, vals)| {
                let dt = dtype?;
                (!dt.is_float()).then(|| Known::ints(dt, dims, vals))
            })
        }
        _ => None,
    };
    done_known(tt(dtype, shape), known)
}

/// PRelu: unidirectional broadcast of the slope to X: X's type.
pub fn prelu(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    if let (Some(xs), Some(ss)) = (&x.shape, cx.shape(1)) {
        let b = broadcast(xs, ss)?;
        if b.len() != xs.len() {
            return Err(format!("slope of rank {} does not broadcast to X of rank {}", ss.len(), xs.len()));
        }
    }
    done(x.clone())
}

/// Max/Min/Sum/Mean over any number of inputs.
pub fn variadic(cx: &Cx) -> InferResult {
    let present: Vec<&TensorType> = cx.tys.iter().flatten().collect();
    if present.is_empty() {
        return Err("needs at least one input".into());
    }
    let shapes: Vec<Option<&[crate::Dim]>> = present.iter().map(|t| t.shape.as_deref()).collect();
    let shape = broadcast_all(&shapes)?;
    let dtype = present.iter().find_map(|t| t.dtype);
    // Max/Min of known integers (exporters clamp sizes this way).
    let known = match (&cx.node.op, dtype) {
        (Op::Max | Op::Min, Some(dt)) if !dt.is_float() => {
            let is_max = matches!(cx.node.op, Op::Max);
            let pick = move |x: &Dim, y: &Dim| -> Option<Dim> {
                let (a, b) = (x.as_const()?, y.as_const()?);
                Some(Dim::from(if is_max { a.max(b) } else { a.min(b) }))
            };
            let mut acc: Option<Known> = None;
            for i in (0..cx.n_in()).filter(|&i| cx.has(i)) {
                let k = cx.known(i).filter(|k| !k.is_float()).cloned();
                acc = match (acc, k) {
                    (None, Some(k)) if i == 0 || !cx.has(0) => Some(k),
                    (Some(a), Some(k)) => zip_known(&a, &k, &pick).map(|(dims, vals)| Known::ints(dt, dims, vals)),
                    _ => None,
                };
                if acc.is_none() {
                    break;
                }
            }
            acc
        }
        _ => None,
    };
    done_known(tt(dtype, shape), known)
}

/// Where(cond, x, y): broadcast all three; dtype of x (or y).
pub fn where_op(cx: &Cx) -> InferResult {
    let (c, x, y) = (cx.req(0)?, cx.req(1)?, cx.req(2)?);
    let shape = broadcast_all(&[c.shape.as_deref(), x.shape.as_deref(), y.shape.as_deref()])?;
    let dtype = x.dtype.or(y.dtype);
    let known = match (cx.known_ints(0), cx.known(1), cx.known(2)) {
        (Some(cond), Some(kx), Some(ky)) if !kx.is_float() && !ky.is_float() => {
            let n = cond.len().max(kx.vals.len()).max(ky.vals.len());
            let pick = |v: &[Dim], i: usize| -> Option<Dim> {
                match v.len() {
                    1 => Some(v[0].clone()),
                    l if l == n => Some(v[i].clone()),
                    _ => None,
                }
            };
            let vals: Option<Vec<Dim>> = (0..n)
                .map(|i| {
                    let c = match cond.len() {
                        1 => cond[0],
                        l if l == n => cond[i],
                        _ => return None,
                    };
                    if c != 0 {
                        pick(&kx.vals, i)
                    } else {
                        pick(&ky.vals, i)
                    }
                })
                .collect();
            match (vals, dtype, &shape) {
                (Some(v), Some(dt), Some(s)) if s.len() <= 1 => {
                    Some(Known::ints(dt, s.iter().filter_map(Dim::as_const).collect(), v))
                }
                _ => None,
            }
        }
        _ => None,
    };
    done_known(tt(dtype, shape), known)
}

/// Cast (dtype from `to`), CastLike (dtype of input 1).
pub fn cast(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let to = if matches!(cx.node.op, Op::CastLike) {
        cx.dtype(1)
    } else {
        Some(cx.dtype_attr("to")?.ok_or("Cast without `to`")?)
    };
    let known = match (cx.known(0), to) {
        (Some(k), Some(to)) if !to.is_float() && to != DType::Str => {
            if k.is_float() {
                let v: Vec<Dim> = k.floats.iter().map(|&f| Dim::from(f as i64)).collect();
                Some(Known::ints(to, k.dims.clone(), v))
            } else if to == DType::Bool {
                k.consts().map(|c| {
                    Known::ints(to, k.dims.clone(), c.into_iter().map(|x| Dim::from(i64::from(x != 0))).collect())
                })
            } else {
                Some(Known::ints(to, k.dims.clone(), k.vals.clone()))
            }
        }
        (Some(k), Some(to)) if to.is_float() => {
            k.as_f64s().map(|f| Known { dtype: to, dims: k.dims.clone(), vals: Vec::new(), floats: f })
        }
        _ => None,
    };
    done_known(tt(to, x.shape.clone()), known)
}

/// QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear.
pub fn quant(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    match cx.node.op {
        Op::QuantizeLinear => {
            let dt = match cx.dtype(2) {
                Some(d) => Some(d),
                None => Some(cx.dtype_attr("output_dtype")?.unwrap_or(DType::U8)),
            };
            done(tt(dt, x.shape.clone()))
        }
        Op::DequantizeLinear => {
            let dt = cx.dtype_attr("output_dtype")?.or(cx.dtype(1));
            done(tt(dt, x.shape.clone()))
        }
        _ => done_many(vec![
            tt(Some(DType::U8), x.shape.clone()),
            TensorType::new(DType::F32, vec![]),
            TensorType::new(DType::U8, vec![]),
        ]),
    }
}

/// Dropout: output like X, mask bool.
pub fn dropout(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let mut ts = vec![x.clone()];
    if cx.n_out() > 1 {
        let mask = if cx.opset >= 10 { Some(DType::Bool) } else { x.dtype };
        ts.push(tt(mask, x.shape.clone()));
    }
    done_many(ts)
}

/// Clip: like input 0.
pub fn clip(cx: &Cx) -> InferResult {
    done(cx.req(0)?.clone())
}
