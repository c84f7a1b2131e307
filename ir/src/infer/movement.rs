//! Data-movement ops: Reshape, Transpose, Concat, Split, Slice, Gather*,
//! Squeeze/Unsqueeze, Expand, Flatten, Pad, Tile, DepthToSpace/SpaceToDepth,
//! Resize/Upsample, OneHot, NonZero, Compress. Shape operands come from the
//! known contents of their inputs, and the ops on small integer tensors
//! propagate known contents (the exporters' `Shape→Gather→Concat` chains).

use super::ctx::{
    broadcast, done, done_known, done_many, norm_axes, norm_axis, product, tt, AxesSrc, Cx, InferResult, Inferred,
    Known, Outcome, MAX_KNOWN,
};
use crate::{DType, Dim, TensorType};

/// Known contents of an output when it is small and its shape constant
/// (any rank: exporters route pad lists through 2-D `Reshape`/`Slice`/
/// `Transpose`, e.g. `[-1, 2]` → reverse rows → transpose → flatten).
fn known_out(dtype: Option<DType>, shape: &[Dim], vals: Vec<Dim>) -> Option<Known> {
    let dt = dtype?;
    if dt.is_float() || vals.len() > MAX_KNOWN {
        return None;
    }
    let dims: Vec<i64> = shape.iter().map(Dim::as_const).collect::<Option<_>>()?;
    (dims.iter().product::<i64>() as usize == vals.len()).then(|| Known::ints(dt, dims, vals))
}

pub fn reshape(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let target: Vec<Dim> = if cx.opset < 5 {
        cx.ints("shape").ok_or("missing shape")?.into_iter().map(Dim::from).collect()
    } else {
        match cx.known_dims(1) {
            Some(t) => t.to_vec(),
            None => return done(tt(x.dtype, None)),
        }
    };
    let allowzero = cx.int("allowzero", 0) != 0;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, d) in target.iter().enumerate() {
        match d.as_const() {
            Some(0) if !allowzero => match x.shape.as_ref() {
                Some(s) => out.push(
                    s.get(i).cloned().ok_or_else(|| format!("shape entry {i} is 0 but input has rank {}", s.len()))?,
                ),
                None => return done(tt(x.dtype, None)),
            },
            Some(-1) => {
                if infer_at.replace(i).is_some() {
                    return Err("more than one -1 in reshape target".into());
                }
                out.push(Dim::from(1));
            }
            Some(c) if c < -1 => return Err(format!("bad reshape target entry {c}")),
            _ => out.push(d.clone()),
        }
    }
    if let Some(i) = infer_at {
        let Some(total) = x.numel() else { return done(tt(x.dtype, None)) };
        let known = product(&out);
        out[i] =
            total.div_exact(&known).ok_or_else(|| format!("cannot infer -1: {total} is not a multiple of {known}"))?;
    } else if let (Some(a), Some(b)) = (x.numel().and_then(|d| d.as_const()), product(&out).as_const()) {
        if a != b {
            return Err(format!("cannot reshape {a} elements into {b}"));
        }
    }
    let known = cx.known(0).and_then(|k| known_out(Some(k.dtype), &out, k.vals.clone()));
    done_known(tt(x.dtype, Some(out)), known)
}

pub fn transpose(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let perm = cx.ints("perm").unwrap_or_else(|| (0..s.len() as i64).rev().collect());
    if perm.len() != s.len() {
        return Err(format!("perm has {} entries for rank {}", perm.len(), s.len()));
    }
    let p = norm_axes(&perm, s.len())?;
    let out: Vec<Dim> = p.iter().map(|&i| s[i].clone()).collect();
    let known = cx.known(0).filter(|k| !k.is_float() && k.dims.len() == p.len()).and_then(|k| {
        let strides = strides_of(&k.dims);
        let odims: Vec<i64> = p.iter().map(|&i| k.dims[i]).collect();
        let vals = for_each_index(&odims, |idx| {
            let flat: i64 = idx.iter().zip(&p).map(|(&j, &a)| j * strides[a]).sum();
            k.vals.get(usize::try_from(flat).ok()?).cloned()
        })?;
        known_out(Some(k.dtype), &out, vals)
    });
    done_known(tt(x.dtype, Some(out)), known)
}

/// Row-major strides of a constant shape.
fn strides_of(dims: &[i64]) -> Vec<i64> {
    let mut st = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * dims[i + 1];
    }
    st
}

/// `f` at every multi-index of `dims`, in row-major order; `None` if any is.
fn for_each_index(dims: &[i64], mut f: impl FnMut(&[i64]) -> Option<Dim>) -> Option<Vec<Dim>> {
    let n: i64 = dims.iter().product();
    if n < 0 || n as usize > MAX_KNOWN {
        return None;
    }
    let mut idx = vec![0i64; dims.len()];
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        out.push(f(&idx)?);
        for a in (0..dims.len()).rev() {
            idx[a] += 1;
            if idx[a] < dims[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    Some(out)
}

pub fn concat(cx: &Cx) -> InferResult {
    let present: Vec<usize> = (0..cx.n_in()).filter(|&i| cx.has(i)).collect();
    let dtype = present.iter().find_map(|&i| cx.dtype(i));
    let shapes: Option<Vec<&[Dim]>> = present.iter().map(|&i| cx.shape(i)).collect();
    let Some(shapes) = shapes else { return done(tt(dtype, None)) };
    let first = shapes.first().ok_or("Concat with no inputs")?;
    let rank = first.len();
    let axis = norm_axis(cx.node.attr_int("axis").ok_or("missing axis")?, rank)?;
    let mut out = first.to_vec();
    for s in &shapes[1..] {
        if s.len() != rank {
            return Err(format!("inputs have ranks {rank} and {}", s.len()));
        }
        for (j, d) in s.iter().enumerate() {
            if j == axis {
                out[j] = out[j].add(d);
            } else if let (Some(a), Some(b)) = (out[j].as_const(), d.as_const()) {
                if a != b {
                    return Err(format!("dimension {j} differs: {a} vs {b}"));
                }
            } else if out[j].as_const().is_some() {
                // keep the constant
            } else if d.as_const().is_some() {
                out[j] = d.clone();
            }
        }
    }
    let known = if rank == 1 {
        let ks: Option<Vec<&Known>> = present.iter().map(|&i| cx.known(i).filter(|k| !k.is_float())).collect();
        ks.and_then(|ks| known_out(dtype, &out, ks.iter().flat_map(|k| k.vals.iter().cloned()).collect()))
    } else {
        None
    };
    done_known(tt(dtype, Some(out)), known)
}

pub fn split(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let n = cx.n_out();
    let Some(s) = x.shape.as_ref() else { return done_many(vec![tt(x.dtype, None); n]) };
    let axis = norm_axis(cx.int("axis", 0), s.len())?;
    let d = &s[axis];
    let sizes: Vec<Dim> = match cx.axes("split", 1, 13) {
        AxesSrc::Known(v) => {
            if v.len() != n {
                return Err(format!("split has {} sizes for {n} outputs", v.len()));
            }
            if let Some(c) = d.as_const() {
                if v.iter().sum::<i64>() != c {
                    return Err(format!("split sizes sum to {} but dimension is {c}", v.iter().sum::<i64>()));
                }
            }
            v.into_iter().map(Dim::from).collect()
        }
        AxesSrc::Unknown => match cx.known_dims(1) {
            Some(v) if v.len() == n => v.to_vec(),
            _ => return done_many(vec![tt(x.dtype, None); n]),
        },
        AxesSrc::Absent => {
            if n == 0 {
                return Err("Split with no outputs".into());
            }
            let k = cx.node.attr_int("num_outputs").unwrap_or(n as i64);
            if k != n as i64 {
                return Err(format!("num_outputs {k} but node has {n} outputs"));
            }
            let nn = Dim::from(n as i64);
            match d.div_exact(&nn) {
                Some(q) => vec![q; n],
                None if cx.opset >= 18 => {
                    let q = d.ceil_div_const(n as i64).ok_or("bad split")?;
                    let last = d.sub(&q.mul(&Dim::from(n as i64 - 1)));
                    let mut v = vec![q; n - 1];
                    v.push(last);
                    v
                }
                None if d.is_const() => return Err(format!("dimension {d} does not split evenly into {n}")),
                None => vec![d.floor_div_const(n as i64).ok_or("bad split")?; n],
            }
        }
    };
    let ts = sizes
        .into_iter()
        .map(|sz| {
            let mut o = s.clone();
            o[axis] = sz;
            tt(x.dtype, Some(o))
        })
        .collect();
    done_many(ts)
}

const BIG: i64 = i32::MAX as i64;

/// Length of `x[start:end:step]` along a dim of size `d`, symbolic where it can be.
pub fn slice_len(d: &Dim, start: &Dim, end: &Dim, step: i64) -> Result<(Dim, Dim), String> {
    if step == 0 {
        return Err("slice step 0".into());
    }
    if let (Some(dc), Some(s), Some(e)) = (d.as_const(), start.as_const(), end.as_const()) {
        let (s, e) = if step > 0 {
            let s = if s < 0 { (s + dc).max(0) } else { s.min(dc) };
            let e = if e < 0 { (e + dc).max(0) } else { e.min(dc) };
            (s, e)
        } else {
            let s = if s < 0 { (s + dc).max(-1) } else { s.min(dc - 1) };
            let e = if e < 0 { (e + dc).max(-1) } else { e.min(dc - 1) };
            (s, e)
        };
        let len = if step > 0 { (e - s + step - 1).div_euclid(step) } else { (s - e - step - 1).div_euclid(-step) };
        return Ok((Dim::from(len.max(0)), Dim::from(s)));
    }
    // Symbolic: assume the in-range reading of each bound.
    let norm = |b: &Dim, big: Dim, small: Dim| -> Dim {
        match b.as_const() {
            Some(c) if c >= BIG => big,
            Some(c) if c <= -BIG => small,
            Some(c) if c < 0 => d.add(&Dim::from(c)),
            _ => b.clone(),
        }
    };
    if step > 0 {
        let s = norm(start, d.clone(), Dim::from(0));
        let e = norm(end, d.clone(), Dim::from(0));
        let e = match (e.as_const(), d.as_const()) {
            (Some(a), Some(b)) => Dim::from(a.min(b)),
            _ => e,
        };
        let len = e.sub(&s).ceil_div_const(step).ok_or("bad step")?;
        Ok((len, s))
    } else {
        let s = norm(start, d.sub(&Dim::from(1)), Dim::from(-1));
        let e = norm(end, d.sub(&Dim::from(1)), Dim::from(-1));
        let len = s.sub(&e).ceil_div_const(-step).ok_or("bad step")?;
        Ok((len, s))
    }
}

/// starts, ends, axes, steps.
type SliceArgs = (Vec<Dim>, Vec<Dim>, Option<Vec<i64>>, Option<Vec<i64>>);

pub fn slice(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let (starts, ends, axes, steps): SliceArgs = if cx.opset < 10 {
        let f = |n: &str| cx.ints(n).map(|v| v.into_iter().map(Dim::from).collect::<Vec<_>>());
        (f("starts").ok_or("missing starts")?, f("ends").ok_or("missing ends")?, cx.ints("axes"), None)
    } else {
        let (Some(st), Some(en)) = (cx.known_dims(1), cx.known_dims(2)) else { return done(tt(x.dtype, None)) };
        let axes = if cx.has(3) {
            match cx.known_ints(3) {
                Some(a) => Some(a),
                None => return done(tt(x.dtype, None)),
            }
        } else {
            None
        };
        let steps = if cx.has(4) {
            match cx.known_ints(4) {
                Some(a) => Some(a),
                None => return done(tt(x.dtype, None)),
            }
        } else {
            None
        };
        (st.to_vec(), en.to_vec(), axes, steps)
    };
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let n = starts.len();
    if ends.len() != n {
        return Err(format!("{n} starts but {} ends", ends.len()));
    }
    let axes = match axes {
        Some(a) if a.len() == n => norm_axes(&a, s.len())?,
        Some(a) => return Err(format!("{} axes for {n} starts", a.len())),
        None if n <= s.len() => (0..n).collect(),
        None => return Err(format!("{n} starts for rank {}", s.len())),
    };
    let steps = steps.unwrap_or_else(|| vec![1; n]);
    if steps.len() != n {
        return Err(format!("{} steps for {n} starts", steps.len()));
    }
    let mut out = s.clone();
    // Per axis: (first index, step) of the selection, when constant.
    let mut sel: Vec<Option<(i64, i64)>> = vec![Some((0, 1)); s.len()];
    for i in 0..n {
        let (len, st) = slice_len(&s[axes[i]], &starts[i], &ends[i], steps[i])?;
        out[axes[i]] = len;
        sel[axes[i]] = st.as_const().map(|c| (c, steps[i]));
    }
    let known = cx.known(0).filter(|k| !k.is_float() && k.dims.len() == s.len()).and_then(|k| {
        let sel: Vec<(i64, i64)> = sel.into_iter().collect::<Option<_>>()?;
        let odims: Vec<i64> = out.iter().map(Dim::as_const).collect::<Option<_>>()?;
        let strides = strides_of(&k.dims);
        let vals = for_each_index(&odims, |idx| {
            let flat: i64 =
                idx.iter().zip(&sel).zip(&strides).map(|((&j, &(st, step)), &stride)| (st + j * step) * stride).sum();
            k.vals.get(usize::try_from(flat).ok()?).cloned()
        })?;
        known_out(Some(k.dtype), &out, vals)
    });
    done_known(tt(x.dtype, Some(out)), known)
}

pub fn gather(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let (Some(s), Some(is)) = (x.shape.as_ref(), cx.shape(1)) else { return done(tt(x.dtype, None)) };
    let axis = norm_axis(cx.int("axis", 0), s.len())?;
    let mut out: Vec<Dim> = s[..axis].to_vec();
    out.extend(is.iter().cloned());
    out.extend(s[axis + 1..].iter().cloned());
    let known = match (cx.known(0), cx.known_ints(1)) {
        (Some(k), Some(idx)) if s.len() == 1 && !k.is_float() => {
            let n = k.vals.len() as i64;
            let vals: Option<Vec<Dim>> = idx
                .iter()
                .map(|&i| {
                    let i = if i < 0 { i + n } else { i };
                    k.vals.get(usize::try_from(i).ok()?).cloned()
                })
                .collect();
            if vals.is_none() {
                return Err(format!("index out of range for {n} elements"));
            }
            vals.and_then(|v| known_out(Some(k.dtype), &out, v))
        }
        _ => None,
    };
    done_known(tt(x.dtype, Some(out)), known)
}

pub fn gather_elements(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let idx = cx.req(1)?;
    if let (Some(s), Some(is)) = (&x.shape, &idx.shape) {
        if s.len() != is.len() {
            return Err(format!("data rank {} but indices rank {}", s.len(), is.len()));
        }
        norm_axis(cx.int("axis", 0), s.len())?;
    }
    done(tt(x.dtype, idx.shape.clone()))
}

pub fn gather_nd(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let (Some(s), Some(is)) = (x.shape.as_ref(), cx.shape(1)) else { return done(tt(x.dtype, None)) };
    let b = usize::try_from(cx.int("batch_dims", 0)).map_err(|_| "negative batch_dims")?;
    let last = is.last().ok_or("indices must have rank ≥ 1")?;
    let Some(k) = last.as_const() else { return done(tt(x.dtype, None)) };
    let k = usize::try_from(k).map_err(|_| "bad index depth")?;
    if b + k > s.len() {
        return Err(format!("index depth {k} with {b} batch dims exceeds data rank {}", s.len()));
    }
    let mut out: Vec<Dim> = is[..is.len() - 1].to_vec();
    out.extend(s[b + k..].iter().cloned());
    done(tt(x.dtype, Some(out)))
}

pub fn squeeze(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let axes: Vec<usize> = match cx.axes("axes", 1, 13) {
        AxesSrc::Known(a) => norm_axes(&a, s.len())?,
        AxesSrc::Unknown => return done(tt(x.dtype, None)),
        AxesSrc::Absent => (0..s.len()).filter(|&i| s[i].as_const() == Some(1)).collect(),
    };
    for &a in &axes {
        if let Some(c) = s[a].as_const() {
            if c != 1 {
                return Err(format!("cannot squeeze axis {a} of size {c}"));
            }
        }
    }
    let out: Vec<Dim> = s.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d.clone()).collect();
    let known = cx.known(0).and_then(|k| known_out(Some(k.dtype), &out, k.vals.clone()));
    done_known(tt(x.dtype, Some(out)), known)
}

pub fn unsqueeze(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let axes = match cx.axes("axes", 1, 13) {
        AxesSrc::Known(a) => a,
        AxesSrc::Unknown => return done(tt(x.dtype, None)),
        AxesSrc::Absent => return Err("missing axes".into()),
    };
    let r = s.len() + axes.len();
    let mut ax = norm_axes(&axes, r)?;
    ax.sort_unstable();
    let mut out = Vec::with_capacity(r);
    let mut it = s.iter();
    for i in 0..r {
        if ax.contains(&i) {
            out.push(Dim::from(1));
        } else {
            out.push(it.next().cloned().ok_or("bad unsqueeze")?);
        }
    }
    let known = cx.known(0).and_then(|k| known_out(Some(k.dtype), &out, k.vals.clone()));
    done_known(tt(x.dtype, Some(out)), known)
}

pub fn expand(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let (Some(s), Some(t)) = (x.shape.as_ref(), cx.known_dims(1)) else { return done(tt(x.dtype, None)) };
    let out = broadcast(s, t)?;
    let known = cx.known(0).and_then(|k| {
        let n = out.iter().map(Dim::as_const).product::<Option<i64>>()?;
        let v = if k.vals.len() == 1 { vec![k.vals[0].clone(); usize::try_from(n).ok()?] } else { k.vals.clone() };
        known_out(Some(k.dtype), &out, v)
    });
    done_known(tt(x.dtype, Some(out)), known)
}

pub fn flatten(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let a = cx.int("axis", 1);
    let a = if a < 0 { a + s.len() as i64 } else { a };
    if a < 0 || a > s.len() as i64 {
        return Err(format!("axis {a} out of range for rank {}", s.len()));
    }
    let a = a as usize;
    done(tt(x.dtype, Some(vec![product(&s[..a]), product(&s[a..])])))
}

pub fn pad(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let pads: Vec<Dim> = if cx.opset < 11 {
        cx.ints("pads").or_else(|| cx.ints("paddings")).ok_or("missing pads")?.into_iter().map(Dim::from).collect()
    } else {
        match cx.known_dims(1) {
            Some(p) => p.to_vec(),
            None => return done(tt(x.dtype, None)),
        }
    };
    let axes: Vec<usize> = if cx.has(3) {
        match cx.known_ints(3) {
            Some(a) => norm_axes(&a, s.len())?,
            None => return done(tt(x.dtype, None)),
        }
    } else {
        (0..s.len()).collect()
    };
    let n = axes.len();
    if pads.len() != 2 * n {
        return Err(format!("{} pads for {n} axes", pads.len()));
    }
    let mut out = s.clone();
    for (i, &a) in axes.iter().enumerate() {
        out[a] = out[a].add(&pads[i]).add(&pads[i + n]);
    }
    done(tt(x.dtype, Some(out)))
}

pub fn tile(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let (Some(s), Some(r)) = (x.shape.as_ref(), cx.known_dims(1)) else { return done(tt(x.dtype, None)) };
    if r.len() != s.len() {
        return Err(format!("{} repeats for rank {}", r.len(), s.len()));
    }
    done(tt(x.dtype, Some(s.iter().zip(r).map(|(a, b)| a.mul(b)).collect())))
}

pub fn depth_space(cx: &Cx, to_space: bool) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    if s.len() != 4 {
        return Err(format!("expected rank 4, got {}", s.len()));
    }
    let b = cx.node.attr_int("blocksize").ok_or("missing blocksize")?;
    if b <= 0 {
        return Err(format!("bad blocksize {b}"));
    }
    let bb = Dim::from(b * b);
    let bd = Dim::from(b);
    let out = if to_space {
        let c = s[1].div_exact(&bb).ok_or_else(|| format!("channels {} not divisible by {}", s[1], b * b))?;
        vec![s[0].clone(), c, s[2].mul(&bd), s[3].mul(&bd)]
    } else {
        let h = s[2].div_exact(&bd).ok_or_else(|| format!("height {} not divisible by {b}", s[2]))?;
        let w = s[3].div_exact(&bd).ok_or_else(|| format!("width {} not divisible by {b}", s[3]))?;
        vec![s[0].clone(), s[1].mul(&bb), h, w]
    };
    done(tt(x.dtype, Some(out)))
}

/// Resize (opset ≥ 11: X, roi, scales, sizes; opset 10: X, scales) and Upsample.
pub fn resize(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let is_resize = matches!(cx.node.op, crate::Op::Resize);
    let (scales_slot, sizes_slot) = if is_resize && cx.opset >= 11 { (2, Some(3)) } else { (1, None) };
    let axes: Vec<usize> = match cx.ints("axes") {
        Some(a) => norm_axes(&a, s.len())?,
        None => (0..s.len()).collect(),
    };
    let mut out = s.clone();
    if let Some(sz) = sizes_slot.filter(|&i| cx.has(i) && cx.known(i).is_some_and(|k| !k.is_empty())) {
        let Some(v) = cx.known_dims(sz) else { return done(tt(x.dtype, None)) };
        if v.len() != axes.len() {
            return Err(format!("{} sizes for {} axes", v.len(), axes.len()));
        }
        let policy = cx.string("keep_aspect_ratio_policy").unwrap_or("stretch");
        if policy != "stretch" {
            return done(tt(x.dtype, None));
        }
        for (i, &a) in axes.iter().enumerate() {
            out[a] = v[i].clone();
        }
        return done(tt(x.dtype, Some(out)));
    }
    let scales: Vec<f64> = if !is_resize && cx.opset < 9 {
        cx.attr("scales")
            .and_then(|a| match a {
                crate::Attr::Floats(f) => Some(f.iter().map(|&x| f64::from(x)).collect()),
                _ => None,
            })
            .ok_or("missing scales")?
    } else {
        match cx.known(scales_slot).and_then(|k| k.as_f64s()) {
            Some(f) => f,
            None => return done(tt(x.dtype, None)),
        }
    };
    if scales.len() != axes.len() {
        return Err(format!("{} scales for {} axes", scales.len(), axes.len()));
    }
    for (i, &a) in axes.iter().enumerate() {
        let sc = scales[i];
        if (sc - 1.0).abs() < f64::EPSILON {
            continue;
        }
        out[a] = match s[a].as_const() {
            Some(c) => Dim::from((c as f64 * sc).floor() as i64),
            None if sc.fract() == 0.0 && sc > 0.0 => s[a].mul(&Dim::from(sc as i64)),
            None if sc > 0.0 && (1.0 / sc).fract() == 0.0 => {
                s[a].floor_div_const((1.0 / sc) as i64).ok_or("bad scale")?
            }
            None => return done(tt(x.dtype, None)),
        };
    }
    done(tt(x.dtype, Some(out)))
}

pub fn one_hot(cx: &Cx) -> InferResult {
    let idx = cx.req(0)?;
    let dtype = cx.dtype(2);
    let (Some(s), Some(depth)) = (idx.shape.as_ref(), cx.known(1)) else { return done(tt(dtype, None)) };
    let depth = if depth.is_float() {
        Dim::from(depth.floats.first().copied().ok_or("empty depth")? as i64)
    } else {
        depth.vals.first().cloned().ok_or("empty depth")?
    };
    let a = cx.int("axis", -1);
    let r = s.len() + 1;
    let a = norm_axis(a, r)?;
    let mut out = s.clone();
    out.insert(a, depth);
    done(tt(dtype, Some(out)))
}

pub fn non_zero(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let shape = x.shape.as_ref().map(|s| vec![Dim::from(s.len() as i64), cx.fresh(0, "nnz")]);
    done(tt(Some(DType::I64), shape))
}

pub fn compress(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(s) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    let shape = match cx.node.attr_int("axis") {
        Some(a) => {
            let a = norm_axis(a, s.len())?;
            let mut o = s.clone();
            o[a] = cx.fresh(0, "n");
            o
        }
        None => vec![cx.fresh(0, "n")],
    };
    done(tt(x.dtype, Some(shape)))
}

pub fn unique(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let n = cx.fresh(0, "n");
    let y = match (cx.node.attr_int("axis"), &x.shape) {
        (Some(a), Some(s)) => {
            let a = norm_axis(a, s.len())?;
            let mut o = s.clone();
            o[a] = n.clone();
            Some(o)
        }
        (Some(_), None) => None,
        (None, _) => Some(vec![n.clone()]),
    };
    let mut ts = vec![tt(x.dtype, y)];
    for i in 1..cx.n_out() {
        let shape = if i == 2 {
            match (cx.node.attr_int("axis"), &x.shape) {
                (Some(a), Some(s)) => Some(vec![s[norm_axis(a, s.len())?].clone()]),
                (None, _) => x.numel().map(|d| vec![d]),
                _ => None,
            }
        } else {
            Some(vec![n.clone()])
        };
        ts.push(tt(Some(DType::I64), shape));
    }
    Ok(Outcome::Done(Inferred::many(ts)))
}

/// NonMaxSuppression: `[n, 3]` i64.
pub fn nms(cx: &Cx) -> InferResult {
    done(TensorType::new(DType::I64, vec![cx.fresh(0, "n"), Dim::from(3)]))
}
