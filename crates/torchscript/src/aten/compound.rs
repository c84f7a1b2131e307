//! The compound lowerings: ops that become several IR nodes or need their
//! arguments decoded by position (`_convolution`, pools, `arange`, fills,
//! advanced `index`, `scaled_dot_product_attention`).

use qsync_ir::{Attr, DType, Op, Tensor, ValueId};

use super::{float, int, ints, scalar_type, Args};
use crate::error::Result;
use crate::lower::{Lowerer, Val};

pub(super) fn ones_like(lw: &mut Lowerer, v: ValueId) -> Result<ValueId> {
    let s = lw.node(Op::Shape, vec![v], vec![])?;
    let d = lw.dtype_of(v).unwrap_or(DType::F32);
    let one = Tensor::from_f64s(d, vec![1], &[1.0]).ok_or_else(|| lw.error("bad dtype"))?;
    lw.node(Op::ConstantOfShape, vec![s], vec![("value", Attr::Tensor(one))])
}

pub(super) fn fill(lw: &mut Lowerer, name: &str, a: &Args) -> Result<Val> {
    let (shape, value_idx, dtype_idx, like) = match name {
        "zeros" | "ones" | "empty" => (lw.shape_tensor(&a.get(0, "size"))?, None, 1, None),
        "full" => (lw.shape_tensor(&a.get(0, "size"))?, Some(1), 2, None),
        "new_zeros" | "new_ones" | "new_empty" => {
            (lw.shape_tensor(&a.get(1, "size"))?, None, 2, Some(lw.tensor(&a.get(0, "input"), name)?))
        }
        "new_full" => (lw.shape_tensor(&a.get(1, "size"))?, Some(2), 3, Some(lw.tensor(&a.get(0, "input"), name)?)),
        "full_like" => {
            let x = lw.tensor(&a.get(0, "input"), name)?;
            (lw.node(Op::Shape, vec![x], vec![])?, Some(1), 2, Some(x))
        }
        _ => {
            let x = lw.tensor(&a.get(0, "input"), name)?;
            (lw.node(Op::Shape, vec![x], vec![])?, None, 1, Some(x))
        }
    };
    let value = match value_idx {
        Some(i) => float(&a.get(i, "fill_value")).unwrap_or(0.0),
        None if name.contains("ones") => 1.0,
        None => 0.0,
    };
    let dtype =
        int(&a.get(dtype_idx, "dtype")).and_then(scalar_type).or_else(|| like.and_then(|l| lw.dtype_of(l))).unwrap_or(
            if value_idx.is_some()
                && value.fract() == 0.0
                && matches!(a.get(value_idx.unwrap_or(0), "fill_value"), Val::Int(_))
            {
                DType::I64
            } else {
                DType::F32
            },
        );
    let v = Tensor::from_f64s(dtype, vec![1], &[value]).ok_or_else(|| lw.error("bad fill dtype"))?;
    Ok(Val::Tensor(lw.node(Op::ConstantOfShape, vec![shape], vec![("value", Attr::Tensor(v))])?))
}

pub(super) fn arange(lw: &mut Lowerer, a: &Args) -> Result<Val> {
    // arange(end, dtype, layout, device, pin) | (start, end, dtype, …) | (start, end, step, dtype, …)
    let n = a.pos.len();
    let (start, end, step, dt) = match n {
        0..=5 => (Val::Int(0), a.get(0, "end"), Val::Int(1), a.get(1, "dtype")),
        6 => (a.get(0, "start"), a.get(1, "end"), Val::Int(1), a.get(2, "dtype")),
        _ => (a.get(0, "start"), a.get(1, "end"), a.get(2, "step"), a.get(3, "dtype")),
    };
    let dt = match a.kw.iter().find(|(k, _)| k == "dtype") {
        Some((_, v)) => v.clone(),
        None => dt,
    };
    let any_float = [&start, &end, &step].iter().any(|v| match v {
        Val::Float(_) => true,
        Val::Tensor(t) => lw.dtype_of(*t).is_some_and(DType::is_float),
        _ => false,
    });
    let dtype = int(&dt).and_then(scalar_type).unwrap_or(if any_float { DType::F32 } else { DType::I64 });
    let mut parts = Vec::new();
    for v in [&start, &end, &step] {
        let t = lw.as_tensor(v, Some(dtype))?;
        let t = lw.cast(t, dtype)?;
        parts.push(t);
    }
    Ok(Val::Tensor(lw.node(Op::Range, parts, vec![])?))
}

/// `x[i0, i1, …]` with leading index tensors: flatten the indexed axes and
/// gather by the broadcast flat index `Σ i_k · stride_k`.
pub(super) fn index(lw: &mut Lowerer, a: &Args) -> Result<Val> {
    let x = lw.tensor(&a.get(0, "input"), "index")?;
    let (Val::List(idx) | Val::Tuple(idx)) = a.get(1, "indices") else {
        return lw.err("index: indices are not a list");
    };
    if idx.iter().any(|v| !matches!(v, Val::Tensor(_))) {
        return lw.opaque("index", a);
    }
    let ids: Vec<ValueId> = idx.iter().map(|v| lw.tensor(v, "index")).collect::<Result<_>>()?;
    if ids.iter().any(|&i| lw.dtype_of(i) == Some(DType::Bool)) {
        return lw.opaque("index", a);
    }
    if ids.len() == 1 {
        return Ok(Val::Tensor(lw.node(Op::Gather, vec![x, ids[0]], vec![("axis", Attr::Int(0))])?));
    }
    let r = lw.rank(x)? as i64;
    let k = ids.len() as i64;
    let mut flat: Option<ValueId> = None;
    for (j, &i) in ids.iter().enumerate() {
        let mut stride = Val::Int(1);
        for d in j as i64 + 1..k {
            let s = lw.size(x, d)?;
            stride = match (stride, s) {
                (Val::Int(p), Val::Int(q)) => Val::Int(p * q),
                (p, q) => Val::Tensor(lw.binary(Op::Mul, &p, &q)?),
            };
        }
        let i = lw.cast(i, DType::I64)?;
        let term = if matches!(stride, Val::Int(1)) { i } else { lw.binary(Op::Mul, &Val::Tensor(i), &stride)? };
        flat = Some(match flat {
            None => term,
            Some(f) => lw.node(Op::Add, vec![f, term], vec![])?,
        });
    }
    let flat = flat.ok_or_else(|| lw.error("index: no indices"))?;
    let mut shape = vec![Val::Int(-1)];
    for d in k..r {
        shape.push(lw.size(x, d)?);
    }
    let sh = lw.shape_tensor(&Val::List(shape))?;
    let xf = lw.node(Op::Reshape, vec![x, sh], vec![])?;
    Ok(Val::Tensor(lw.node(Op::Gather, vec![xf, flat], vec![("axis", Attr::Int(0))])?))
}

pub(super) fn sdpa(lw: &mut Lowerer, a: &Args) -> Result<Val> {
    let q = lw.tensor(&a.get(0, "query"), "scaled_dot_product_attention")?;
    let k = lw.tensor(&a.get(1, "key"), "scaled_dot_product_attention")?;
    let v = lw.tensor(&a.get(2, "value"), "scaled_dot_product_attention")?;
    let r = lw.rank(k)? as i64;
    let mut perm: Vec<i64> = (0..r).collect();
    perm.swap(r as usize - 1, r as usize - 2);
    let kt = lw.node(Op::Transpose, vec![k], vec![("perm", Attr::Ints(perm))])?;
    let s = lw.node(Op::MatMul, vec![q, kt], vec![])?;
    let dt = lw.dtype_of(q).unwrap_or(DType::F32);
    let scale = match float(&a.get(6, "scale")) {
        Some(f) => f,
        None => match lw.size(q, -1)? {
            Val::Int(e) => 1.0 / (e as f64).sqrt(),
            _ => return lw.err("scaled_dot_product_attention: head size must be static when no scale is given"),
        },
    };
    let sc = lw.const_scalar(dt, scale)?;
    let mut s = lw.node(Op::Mul, vec![s, sc], vec![])?;
    if matches!(a.get(5, "is_causal"), Val::Bool(true)) {
        lw.warn("scaled_dot_product_attention(is_causal=True): causal mask not materialised");
    }
    if let Val::Tensor(m) = a.get(3, "attn_mask") {
        if lw.dtype_of(m) == Some(DType::Bool) {
            let ninf = lw.const_scalar(dt, f64::NEG_INFINITY)?;
            s = lw.node(Op::Where, vec![m, s, ninf], vec![])?;
        } else {
            s = lw.node(Op::Add, vec![s, m], vec![])?;
        }
    }
    let p = lw.node(Op::Softmax, vec![s], vec![("axis", Attr::Int(-1))])?;
    let p = match float(&a.get(4, "dropout_p")) {
        Some(d) if d > 0.0 => {
            let ratio = lw.const_scalar(DType::F32, d)?;
            lw.node_n(Op::Dropout, vec![Some(p), Some(ratio)], vec![], 1)?[0]
        }
        _ => p,
    };
    Ok(Val::Tensor(lw.node(Op::MatMul, vec![p, v], vec![])?))
}

fn pair(v: &Val, n: usize, default: i64) -> Vec<i64> {
    match ints(v) {
        Some(x) if x.len() == n => x,
        Some(x) if x.len() == 1 => vec![x[0]; n],
        _ => vec![default; n],
    }
}

pub(super) fn conv(lw: &mut Lowerer, name: &str, a: &Args) -> Result<Val> {
    let x = lw.tensor(&a.get(0, "input"), name)?;
    let w = lw.tensor(&a.get(1, "weight"), name)?;
    let b = a.get(2, "bias");
    let n = lw.rank(w)?.saturating_sub(2).max(1);
    let transposed = name.starts_with("conv_transpose") || matches!(a.get(6, "transposed"), Val::Bool(true));
    let (stride, padding, dilation, groups, out_pad) = if name == "_convolution" {
        (a.get(3, "stride"), a.get(4, "padding"), a.get(5, "dilation"), a.get(8, "groups"), a.get(7, "output_padding"))
    } else if transposed {
        (a.get(3, "stride"), a.get(4, "padding"), a.get(7, "dilation"), a.get(6, "groups"), a.get(5, "output_padding"))
    } else {
        (a.get(3, "stride"), a.get(4, "padding"), a.get(5, "dilation"), a.get(6, "groups"), Val::None)
    };
    let mut attrs = vec![
        ("strides", Attr::Ints(pair(&stride, n, 1))),
        ("dilations", Attr::Ints(pair(&dilation, n, 1))),
        ("group", Attr::Int(int(&groups).unwrap_or(1))),
    ];
    match &padding {
        Val::Str(s) if s == "same" => attrs.push(("auto_pad", Attr::String(b"SAME_UPPER".to_vec()))),
        Val::Str(_) => {}
        p => {
            let p = pair(p, n, 0);
            attrs.push(("pads", Attr::Ints(p.iter().chain(&p).copied().collect())));
        }
    }
    if transposed {
        attrs.push(("output_padding", Attr::Ints(pair(&out_pad, n, 0))));
    }
    let mut ins = vec![Some(x), Some(w)];
    if let Val::Tensor(b) = b {
        ins.push(Some(b));
    }
    let op = if transposed { Op::ConvTranspose } else { Op::Conv };
    Ok(Val::Tensor(lw.node_n(op, ins, attrs, 1)?[0]))
}

pub(super) fn pool(lw: &mut Lowerer, name: &str, a: &Args) -> Result<Val> {
    let x = lw.tensor(&a.get(0, "input"), name)?;
    let n = if name.ends_with("1d") { 1 } else { 2 };
    let k = pair(&a.get(1, "kernel_size"), n, 1);
    let stride = match ints(&a.get(2, "stride")) {
        Some(s) if !s.is_empty() => pair(&Val::List(s.into_iter().map(Val::Int).collect()), n, 1),
        _ => k.clone(),
    };
    let p = pair(&a.get(3, "padding"), n, 0);
    let mut attrs = vec![
        ("kernel_shape", Attr::Ints(k)),
        ("strides", Attr::Ints(stride)),
        ("pads", Attr::Ints(p.iter().chain(&p).copied().collect())),
    ];
    let op = if name.starts_with("max") {
        attrs.push(("dilations", Attr::Ints(pair(&a.get(4, "dilation"), n, 1))));
        attrs.push(("ceil_mode", Attr::Int(int(&a.get(5, "ceil_mode")).unwrap_or(0))));
        Op::MaxPool
    } else {
        attrs.push(("ceil_mode", Attr::Int(int(&a.get(4, "ceil_mode")).unwrap_or(0))));
        attrs.push(("count_include_pad", Attr::Int(int(&a.get(5, "count_include_pad")).unwrap_or(1))));
        Op::AveragePool
    };
    Ok(Val::Tensor(lw.node(op, vec![x], attrs)?))
}

/// A static size of `x` along `dim`, when the shape says so.
fn static_dim(lw: &Lowerer, x: ValueId, dim: i64) -> Option<(usize, i64)> {
    let s = lw.ty(x).shape.as_ref()?;
    let r = s.len() as i64;
    let d = if dim < 0 { dim + r } else { dim };
    let c = s.get(usize::try_from(d).ok()?)?.as_const()?;
    Some((d as usize, c))
}

/// `split` / `split_with_sizes` / `chunk` / `unbind`: one `Split` with static sizes.
pub(super) fn split(lw: &mut Lowerer, name: &str, a: &Args) -> Result<Val> {
    let x = lw.tensor(&a.get(0, "input"), name)?;
    let dim = if name == "unbind" { int(&a.get(1, "dim")).unwrap_or(0) } else { int(&a.get(2, "dim")).unwrap_or(0) };
    let Some((axis, len)) = static_dim(lw, x, dim) else { return lw.opaque(name, a) };
    let sizes: Vec<i64> = match name {
        "unbind" => vec![1; len.max(0) as usize],
        "chunk" => {
            let c = int(&a.get(1, "chunks")).unwrap_or(1).max(1);
            let each = (len + c - 1) / c;
            let mut v = Vec::new();
            let mut left = len;
            while left > 0 && each > 0 {
                v.push(each.min(left));
                left -= each;
            }
            v
        }
        _ => match a.get(1, "split_size") {
            Val::Int(s) if s > 0 => {
                let mut v = Vec::new();
                let mut left = len;
                while left > 0 {
                    v.push(s.min(left));
                    left -= s;
                }
                v
            }
            other => match ints(&other) {
                Some(v) => v,
                None => return lw.opaque(name, a),
            },
        },
    };
    if sizes.is_empty() {
        return Ok(Val::List(Vec::new()));
    }
    let s = lw.const_i64s(&sizes)?;
    let outs = lw.node_n(Op::Split, vec![Some(x), Some(s)], vec![("axis", Attr::Int(axis as i64))], sizes.len())?;
    let mut items = Vec::new();
    for o in outs {
        items.push(Val::Tensor(if name == "unbind" {
            let ax = lw.const_i64s(&[axis as i64])?;
            lw.node(Op::Squeeze, vec![o, ax], vec![])?
        } else {
            o
        }));
    }
    Ok(Val::List(items))
}

/// `max`/`min`: of two tensors, over all elements, or along a dim (values, indices).
pub(super) fn max_min(lw: &mut Lowerer, name: &str, a: &Args) -> Result<Val> {
    let x = lw.tensor(&a.get(0, "input"), name)?;
    let is_max = name == "max";
    match a.get(1, "dim") {
        Val::Tensor(y) => Ok(Val::Tensor(lw.node(if is_max { Op::Max } else { Op::Min }, vec![x, y], vec![])?)),
        Val::Int(d) => {
            let keep = int(&a.get(2, "keepdim")).unwrap_or(0);
            let attrs = vec![("axes", Attr::Ints(vec![d])), ("keepdims", Attr::Int(keep))];
            let v = lw.node(if is_max { Op::ReduceMax } else { Op::ReduceMin }, vec![x], attrs)?;
            let attrs = vec![("axis", Attr::Int(d)), ("keepdims", Attr::Int(keep))];
            let i = lw.node(if is_max { Op::ArgMax } else { Op::ArgMin }, vec![x], attrs)?;
            Ok(Val::Tuple(vec![Val::Tensor(v), Val::Tensor(i)]))
        }
        _ => Ok(Val::Tensor(lw.node(
            if is_max { Op::ReduceMax } else { Op::ReduceMin },
            vec![x],
            vec![("keepdims", Attr::Int(0))],
        )?)),
    }
}

/// Adaptive pooling whose input divides evenly into the output: a plain pool.
pub(super) fn adaptive_pool(lw: &mut Lowerer, name: &str, a: &Args) -> Result<Val> {
    let x = lw.tensor(&a.get(0, "input"), name)?;
    let out = ints(&a.get(1, "output_size")).unwrap_or_default();
    let is_max = name.contains("max");
    if !out.is_empty() && out.iter().all(|&o| o == 1) {
        let op = if is_max { Op::GlobalMaxPool } else { Op::GlobalAveragePool };
        return Ok(Val::Tensor(lw.node(op, vec![x], vec![])?));
    }
    let r = lw.rank(x)? as i64;
    let mut k = Vec::new();
    for (i, &o) in out.iter().enumerate() {
        match static_dim(lw, x, r - out.len() as i64 + i as i64) {
            Some((_, n)) if o > 0 && n % o == 0 => k.push(n / o),
            _ => return lw.opaque(name, a),
        }
    }
    if k.iter().all(|&x| x == 1) {
        return Ok(Val::Tensor(x));
    }
    let pads = vec![0; 2 * k.len()];
    let attrs = vec![("kernel_shape", Attr::Ints(k.clone())), ("strides", Attr::Ints(k)), ("pads", Attr::Ints(pads))];
    let op = if is_max { Op::MaxPool } else { Op::AveragePool };
    Ok(Val::Tensor(lw.node(op, vec![x], attrs)?))
}

/// `baddbmm(input, b1, b2, beta, alpha)` = `beta·input + alpha·(b1 @ b2)`.
pub(super) fn baddbmm(lw: &mut Lowerer, a: &Args) -> Result<Val> {
    let c = lw.tensor(&a.get(0, "input"), "baddbmm")?;
    let p = lw.tensor(&a.get(1, "batch1"), "baddbmm")?;
    let q = lw.tensor(&a.get(2, "batch2"), "baddbmm")?;
    let mut m = lw.node(Op::MatMul, vec![p, q], vec![])?;
    let alpha = float(&a.get(4, "alpha")).unwrap_or(1.0);
    if alpha != 1.0 {
        m = lw.binary(Op::Mul, &Val::Tensor(m), &Val::Float(alpha))?;
    }
    let beta = float(&a.get(3, "beta")).unwrap_or(1.0);
    if beta == 0.0 {
        return Ok(Val::Tensor(m));
    }
    let c = if beta == 1.0 { c } else { lw.binary(Op::Mul, &Val::Tensor(c), &Val::Float(beta))? };
    Ok(Val::Tensor(lw.node(Op::Add, vec![c, m], vec![])?))
}

/// `constant_pad_nd(x, pad, value)` / `pad(x, pad, "constant", value)`:
/// torch lists (begin, end) pairs from the last axis backwards.
pub(super) fn pad(lw: &mut Lowerer, name: &str, a: &Args) -> Result<Val> {
    let x = lw.tensor(&a.get(0, "input"), name)?;
    let Some(p) = ints(&a.get(1, "pad")) else { return lw.opaque(name, a) };
    let (mode, value) = if name == "pad" {
        (a.get(2, "mode"), a.get(3, "value"))
    } else {
        (Val::Str("constant".into()), a.get(2, "value"))
    };
    if !matches!(&mode, Val::Str(m) if m == "constant") {
        return lw.opaque(name, a);
    }
    let r = lw.rank(x)?;
    let mut begins = vec![0; r];
    let mut ends = vec![0; r];
    for (i, pair) in p.chunks(2).enumerate() {
        let Some(ax) = r.checked_sub(i + 1) else { return lw.err("pad: more pairs than axes") };
        begins[ax] = pair[0];
        ends[ax] = pair.get(1).copied().unwrap_or(0);
    }
    begins.extend(ends);
    let pads = lw.const_i64s(&begins)?;
    let d = lw.ty(x).dtype;
    let v = lw.as_tensor(&if matches!(value, Val::None) { Val::Float(0.0) } else { value }, d)?;
    let v = lw.cast(v, d.unwrap_or(DType::F32))?;
    Ok(Val::Tensor(lw.node(Op::Pad, vec![x, pads, v], vec![("mode", Attr::String(b"constant".to_vec()))])?))
}

/// `unflatten(x, dim, sizes)`: a reshape that splits one axis.
pub(super) fn unflatten(lw: &mut Lowerer, a: &Args) -> Result<Val> {
    let x = lw.tensor(&a.get(0, "input"), "unflatten")?;
    let r = lw.rank(x)? as i64;
    let d = int(&a.get(1, "dim")).unwrap_or(0);
    let d = if d < 0 { d + r } else { d };
    let (Val::List(sizes) | Val::Tuple(sizes)) = a.get(2, "sizes") else {
        return lw.err("unflatten: sizes are not a list");
    };
    let mut dims = Vec::new();
    for i in 0..d {
        dims.push(lw.size(x, i)?);
    }
    dims.extend(sizes);
    for i in d + 1..r {
        dims.push(lw.size(x, i)?);
    }
    let s = lw.shape_tensor(&Val::List(dims))?;
    Ok(Val::Tensor(lw.node(Op::Reshape, vec![x, s], vec![])?))
}
