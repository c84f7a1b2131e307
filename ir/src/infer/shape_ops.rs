//! Shape-producing and reducing ops: Shape, Size, Constant, ConstantOfShape,
//! Range, EyeLike, the random generators, reductions, ArgMax/ArgMin, TopK.

use super::ctx::{
    done, done_known, done_many, norm_axes, norm_axis, product, tt, AxesSrc, Cx, InferResult, Known, MAX_KNOWN,
};
use crate::{Attr, DType, Dim, Op, Tensor, TensorType};

pub fn shape(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(Some(DType::I64), None)) };
    let r = s.len() as i64;
    let clamp = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
    let (st, en) = if cx.opset >= 15 { (clamp(cx.int("start", 0)), clamp(cx.int("end", r))) } else { (0, r) };
    let vals: Vec<Dim> = if en > st { s[st as usize..en as usize].to_vec() } else { Vec::new() };
    let t = TensorType::new(DType::I64, vec![Dim::from(vals.len() as i64)]);
    done_known(t, Some(Known::vec(DType::I64, vals)))
}

pub fn size(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let k = x.numel().map(|n| Known::scalar(DType::I64, n));
    done_known(TensorType::new(DType::I64, vec![]), k)
}

/// The tensor a Constant node holds, as a type plus known contents.
pub fn constant_value(cx: &Cx) -> Result<(TensorType, Option<Known>), String> {
    let node = cx.node;
    if let Some(t) = node.attr("value").and_then(Attr::as_tensor) {
        return Ok((TensorType::new(t.dtype, t.dims.iter().map(|&d| Dim::from(d)).collect()), Known::from_tensor(t)));
    }
    if let Some(v) = node.attr_int("value_int") {
        return Ok((TensorType::new(DType::I64, vec![]), Some(Known::scalar(DType::I64, Dim::from(v)))));
    }
    if let Some(v) = node.attr_ints("value_ints") {
        let k = (v.len() <= MAX_KNOWN).then(|| Known::vec(DType::I64, v.iter().map(|&x| Dim::from(x)).collect()));
        return Ok((TensorType::new(DType::I64, vec![Dim::from(v.len() as i64)]), k));
    }
    match node
        .attr("value_float")
        .or_else(|| node.attr("value_floats"))
        .or_else(|| node.attr("value_string"))
        .or_else(|| node.attr("value_strings"))
    {
        Some(Attr::Float(f)) => {
            let t = Tensor::from_f32(vec![], &[*f]);
            Ok((TensorType::new(DType::F32, vec![]), Known::from_tensor(&t)))
        }
        Some(Attr::Floats(f)) => {
            let t = Tensor::from_f32(vec![f.len() as i64], f);
            Ok((TensorType::new(DType::F32, vec![Dim::from(f.len() as i64)]), Known::from_tensor(&t)))
        }
        Some(Attr::String(_)) => Ok((TensorType::new(DType::Str, vec![]), None)),
        Some(Attr::Strings(s)) => Ok((TensorType::new(DType::Str, vec![Dim::from(s.len() as i64)]), None)),
        Some(a) => Err(format!("Constant value of unexpected kind {}", a.kind_name())),
        None if node.attr("sparse_value").is_some() => Err("sparse Constant not supported".into()),
        None => Err("Constant without a value".into()),
    }
}

pub fn constant(cx: &Cx) -> InferResult {
    let (t, k) = constant_value(cx)?;
    done_known(t, k)
}

pub fn constant_of_shape(cx: &Cx) -> InferResult {
    let (dtype, fill) = match cx.attr("value").and_then(Attr::as_tensor) {
        Some(t) => (t.dtype, Known::from_tensor(t)),
        None => (DType::F32, None),
    };
    let Some(s) = cx.known_dims(0) else { return done(tt(Some(dtype), None)) };
    let out = s.to_vec();
    let known = (|| {
        if out.len() > 1 || dtype.is_float() {
            return None;
        }
        let n = product(&out).as_const()?;
        let v = fill.as_ref().and_then(|f| f.vals.first().cloned()).unwrap_or_else(|| Dim::from(0));
        let n = usize::try_from(n).ok().filter(|&n| n <= MAX_KNOWN)?;
        Some(Known::ints(dtype, out.iter().filter_map(Dim::as_const).collect(), vec![v; n]))
    })();
    done_known(TensorType::new(dtype, out), known)
}

pub fn range(cx: &Cx) -> InferResult {
    let dtype = cx.dtype(0).or(cx.dtype(1));
    let (Some(st), Some(li), Some(de)) = (cx.known(0), cx.known(1), cx.known(2)) else {
        return done(tt(dtype, Some(vec![cx.fresh(0, "n")])));
    };
    if st.is_float() || li.is_float() || de.is_float() {
        let (Some(a), Some(b), Some(c)) = (st.floats.first(), li.floats.first(), de.floats.first()) else {
            return Err("empty Range operand".into());
        };
        if *c == 0.0 {
            return Err("Range delta 0".into());
        }
        let n = ((b - a) / c).ceil().max(0.0) as i64;
        return done(tt(dtype, Some(vec![Dim::from(n)])));
    }
    let (Some(a), Some(b), Some(c)) = (st.vals.first(), li.vals.first(), de.vals.first()) else {
        return Err("empty Range operand".into());
    };
    let Some(c) = c.as_const() else { return done(tt(dtype, Some(vec![cx.fresh(0, "n")]))) };
    if c == 0 {
        return Err("Range delta 0".into());
    }
    let len = if let (Some(a), Some(b)) = (a.as_const(), b.as_const()) {
        let n = if c > 0 { (b - a + c - 1).div_euclid(c) } else { (a - b - c - 1).div_euclid(-c) };
        Dim::from(n.max(0))
    } else if c > 0 {
        b.sub(a).ceil_div_const(c).ok_or("bad delta")?
    } else {
        a.sub(b).ceil_div_const(-c).ok_or("bad delta")?
    };
    let known = match (len.as_const(), dtype) {
        (Some(n), Some(dt)) if (0..=MAX_KNOWN as i64).contains(&n) => {
            Some(Known::vec(dt, (0..n).map(|i| a.add(&Dim::from(i * c))).collect()))
        }
        _ => None,
    };
    done_known(tt(dtype, Some(vec![len])), known)
}

pub fn eye_like(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    if let Some(s) = &x.shape {
        if s.len() != 2 {
            return Err(format!("EyeLike needs rank 2, got {}", s.len()));
        }
    }
    done(tt(cx.dtype_attr("dtype")?.or(x.dtype), x.shape.clone()))
}

pub fn random(cx: &Cx) -> InferResult {
    let dt = cx.dtype_attr("dtype")?;
    match cx.node.op {
        Op::RandomNormal | Op::RandomUniform => {
            let s = cx.ints("shape").ok_or("missing shape")?;
            done(TensorType::new(dt.unwrap_or(DType::F32), s.into_iter().map(Dim::from).collect()))
        }
        Op::Multinomial => {
            let x = cx.req(0)?;
            let shape =
                x.shape.as_ref().and_then(|s| s.first().cloned()).map(|b| vec![b, Dim::from(cx.int("sample_size", 1))]);
            done(tt(Some(dt.unwrap_or(DType::I32)), shape))
        }
        _ => {
            let x = cx.req(0)?;
            done(tt(dt.or(x.dtype), x.shape.clone()))
        }
    }
}

/// The opset from which an op's axes come from an input.
fn axes_input_from(op: &Op) -> i64 {
    if matches!(op, Op::ReduceSum) {
        13
    } else {
        18
    }
}

pub fn reduce(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let keep = cx.int("keepdims", 1) != 0;
    let axes = match cx.axes("axes", 1, axes_input_from(&cx.node.op)) {
        AxesSrc::Known(a) if !a.is_empty() => norm_axes(&a, s.len())?,
        AxesSrc::Unknown => {
            return done(tt(x.dtype, None));
        }
        _ => {
            if cx.int("noop_with_empty_axes", 0) != 0 {
                return done(x.clone());
            }
            (0..s.len()).collect()
        }
    };
    let mut out = Vec::with_capacity(s.len());
    for (i, d) in s.iter().enumerate() {
        if axes.contains(&i) {
            if keep {
                out.push(Dim::from(1));
            }
        } else {
            out.push(d.clone());
        }
    }
    let known = match (cx.node.op.clone(), cx.known(0)) {
        (Op::ReduceProd, Some(k)) if !k.is_float() && s.len() <= 1 && out.iter().all(|d| d.as_const() == Some(1)) => {
            Some(Known::ints(k.dtype, out.iter().filter_map(Dim::as_const).collect(), vec![product(&k.vals)]))
        }
        (Op::ReduceSum, Some(k)) if !k.is_float() && s.len() <= 1 && out.iter().all(|d| d.as_const() == Some(1)) => {
            let sum = k.vals.iter().fold(Dim::from(0), |a, b| a.add(b));
            Some(Known::ints(k.dtype, out.iter().filter_map(Dim::as_const).collect(), vec![sum]))
        }
        _ => None,
    };
    done_known(tt(x.dtype, Some(out)), known)
}

pub fn arg_reduce(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(Some(DType::I64), None)) };
    let a = norm_axis(cx.int("axis", 0), s.len().max(1))?;
    let keep = cx.int("keepdims", 1) != 0;
    let mut out = s.clone();
    if a < out.len() {
        if keep {
            out[a] = Dim::from(1);
        } else {
            out.remove(a);
        }
    }
    done(tt(Some(DType::I64), Some(out)))
}

pub fn top_k(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let k: Option<Dim> = if cx.opset < 10 {
        Some(Dim::from(cx.node.attr_int("k").ok_or("missing k")?))
    } else {
        cx.known_dims(1).and_then(|v| v.first().cloned())
    };
    let shape = match (&x.shape, k) {
        (Some(s), Some(k)) => {
            let a = norm_axis(cx.int("axis", -1), s.len())?;
            if let (Some(kc), Some(dc)) = (k.as_const(), s[a].as_const()) {
                if kc > dc || kc < 0 {
                    return Err(format!("k {kc} out of range for dimension {dc}"));
                }
            }
            let mut o = s.clone();
            o[a] = k;
            Some(o)
        }
        (Some(s), None) => {
            let a = norm_axis(cx.int("axis", -1), s.len())?;
            let mut o = s.clone();
            o[a] = cx.fresh(0, "k");
            Some(o)
        }
        _ => None,
    };
    done_many(vec![tt(x.dtype, shape.clone()), tt(Some(DType::I64), shape)])
}
