//! Constant evaluation of single nodes on inline tensors (for constant
//! folding), with ONNX semantics: integer `Div` truncates toward zero,
//! integer arithmetic wraps in the tensor's width, float arithmetic rounds
//! to the tensor's dtype.

use super::ctx::{Cx, Known, Outcome};
use crate::{Attr, DType, Dim, Graph, NodeId, Op, Tensor, TensorType};

#[derive(Clone, Debug)]
enum Data {
    I(Vec<i64>),
    F(Vec<f64>),
}

#[derive(Clone, Debug)]
struct V {
    dtype: DType,
    dims: Vec<i64>,
    data: Data,
}

impl V {
    fn from_tensor(t: &Tensor) -> Option<V> {
        let data = if t.dtype.is_float() { Data::F(t.as_f64s()?) } else { Data::I(t.as_i64s()?) };
        Some(V { dtype: t.dtype, dims: t.dims.clone(), data })
    }

    fn to_tensor(&self) -> Option<Tensor> {
        match &self.data {
            Data::I(v) => Tensor::from_i64s(self.dtype, self.dims.clone(), v),
            Data::F(v) => Tensor::from_f64s(self.dtype, self.dims.clone(), v),
        }
    }

    fn len(&self) -> usize {
        match &self.data {
            Data::I(v) => v.len(),
            Data::F(v) => v.len(),
        }
    }

    /// Select elements by flat index.
    fn pick(&self, dtype: DType, dims: Vec<i64>, idx: &[usize]) -> Option<V> {
        let data = match &self.data {
            Data::I(v) => Data::I(idx.iter().map(|&i| v.get(i).copied()).collect::<Option<_>>()?),
            Data::F(v) => Data::F(idx.iter().map(|&i| v.get(i).copied()).collect::<Option<_>>()?),
        };
        Some(V { dtype, dims, data })
    }

    fn ints(&self) -> Option<&[i64]> {
        match &self.data {
            Data::I(v) => Some(v),
            Data::F(_) => None,
        }
    }
}

fn udims(d: &[i64]) -> Option<Vec<usize>> {
    d.iter().map(|&x| usize::try_from(x).ok()).collect()
}

fn strides(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
}

/// For every output multi-index (row-major), call `f` to get a flat input index.
fn map_indices(out: &[usize], mut f: impl FnMut(&[usize]) -> Option<usize>) -> Option<Vec<usize>> {
    let n: usize = out.iter().product();
    if n > 1 << 26 {
        return None;
    }
    let mut res = Vec::with_capacity(n);
    let mut idx = vec![0usize; out.len()];
    for _ in 0..n {
        res.push(f(&idx)?);
        for a in (0..out.len()).rev() {
            idx[a] += 1;
            if idx[a] < out[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    Some(res)
}

fn broadcast_shape(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            match (x, y) {
                _ if x == y => Some(x),
                (1, _) => Some(y),
                (_, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// Flat index into a tensor of `dims` broadcast to `out` for output index `idx`.
fn bidx(dims: &[usize], out_rank: usize, idx: &[usize]) -> usize {
    let st = strides(dims);
    let off = out_rank - dims.len();
    dims.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { idx[i + off] * st[i] }).sum()
}

fn broadcast_to(v: &V, out: &[i64]) -> Option<V> {
    let od = udims(out)?;
    let vd = udims(&v.dims)?;
    let idx = map_indices(&od, |i| Some(bidx(&vd, od.len(), i)))?;
    v.pick(v.dtype, out.to_vec(), &idx)
}

fn binary(op: &Op, a: &V, b: &V) -> Option<V> {
    let out = broadcast_shape(&a.dims, &b.dims)?;
    let (a, b) = (broadcast_to(a, &out)?, broadcast_to(b, &out)?);
    let cmp = matches!(op, Op::Equal | Op::Less | Op::Greater | Op::LessOrEqual | Op::GreaterOrEqual);
    let data = match (&a.data, &b.data) {
        (Data::I(x), Data::I(y)) => {
            let r: Option<Vec<i64>> = x
                .iter()
                .zip(y)
                .map(|(&p, &q)| match op {
                    Op::Add => Some(p.wrapping_add(q)),
                    Op::Sub => Some(p.wrapping_sub(q)),
                    Op::Mul => Some(p.wrapping_mul(q)),
                    Op::Div => (q != 0).then(|| p.wrapping_div(q)),
                    Op::Equal => Some(i64::from(p == q)),
                    Op::Less => Some(i64::from(p < q)),
                    Op::Greater => Some(i64::from(p > q)),
                    Op::LessOrEqual => Some(i64::from(p <= q)),
                    Op::GreaterOrEqual => Some(i64::from(p >= q)),
                    Op::And => Some(i64::from(p != 0 && q != 0)),
                    Op::Or => Some(i64::from(p != 0 || q != 0)),
                    _ => None,
                })
                .collect();
            Data::I(r?)
        }
        (Data::F(x), Data::F(y)) => {
            if cmp {
                let r: Option<Vec<i64>> = x
                    .iter()
                    .zip(y)
                    .map(|(&p, &q)| match op {
                        Op::Equal => Some(i64::from(p == q)),
                        Op::Less => Some(i64::from(p < q)),
                        Op::Greater => Some(i64::from(p > q)),
                        Op::LessOrEqual => Some(i64::from(p <= q)),
                        Op::GreaterOrEqual => Some(i64::from(p >= q)),
                        _ => None,
                    })
                    .collect();
                Data::I(r?)
            } else {
                let r: Option<Vec<f64>> = x
                    .iter()
                    .zip(y)
                    .map(|(&p, &q)| match op {
                        Op::Add => Some(p + q),
                        Op::Sub => Some(p - q),
                        Op::Mul => Some(p * q),
                        Op::Div => Some(p / q),
                        _ => None,
                    })
                    .collect();
                Data::F(r?)
            }
        }
        _ => return None,
    };
    let dtype = if cmp { DType::Bool } else { a.dtype };
    // Round float results to the dtype (f32 arithmetic done in f64 then rounded is exact).
    V { dtype, dims: out, data }.to_tensor().and_then(|t| V::from_tensor(&t))
}

fn cast(v: &V, to: DType) -> Option<V> {
    let data = match (&v.data, to.is_float()) {
        (Data::I(x), true) => Data::F(x.iter().map(|&i| i as f64).collect()),
        (Data::F(x), true) => Data::F(x.clone()),
        (Data::I(x), false) => {
            Data::I(if to == DType::Bool { x.iter().map(|&i| i64::from(i != 0)).collect() } else { x.clone() })
        }
        (Data::F(x), false) => Data::I(if to == DType::Bool {
            x.iter().map(|&f| i64::from(f != 0.0)).collect()
        } else {
            x.iter().map(|&f| f as i64).collect()
        }),
    };
    V { dtype: to, dims: v.dims.clone(), data }.to_tensor().and_then(|t| V::from_tensor(&t))
}

fn norm(a: i64, r: usize) -> Option<usize> {
    let a = if a < 0 { a + r as i64 } else { a };
    usize::try_from(a).ok().filter(|&x| x < r)
}

/// Output shapes by running inference on the constant inputs' types.
fn infer_dims(graph: &Graph, node: NodeId, ins: &[Option<V>], opset: i64) -> Option<Vec<Vec<i64>>> {
    let n = graph.node(node);
    let tys = ins
        .iter()
        .map(|v| v.as_ref().map(|v| TensorType::new(v.dtype, v.dims.iter().map(|&d| Dim::from(d)).collect())))
        .collect();
    let known =
        ins.iter().map(|v| v.as_ref().and_then(|v| v.to_tensor()).and_then(|t| Known::from_tensor(&t))).collect();
    let out_names = n.outputs().iter().map(|&v| graph.value_name(v).to_string()).collect();
    let cx = Cx { node: n, opset, tys, known, out_names };
    match super::infer_op(&cx).ok()? {
        Outcome::Done(inf) => inf.types.iter().map(TensorType::concrete_shape).collect(),
        Outcome::Skip(_) => None,
    }
}

pub(super) fn eval(graph: &Graph, node: NodeId, inputs: &[Option<&Tensor>], opset: i64) -> Option<Vec<Tensor>> {
    let n = graph.node(node);
    let ins: Vec<Option<V>> = inputs.iter().map(|t| t.and_then(V::from_tensor)).collect();
    let get = |i: usize| ins.get(i).and_then(Option::as_ref);
    let out: Vec<V> = match &n.op {
        Op::Identity => vec![get(0)?.clone()],
        Op::Constant => {
            let t = match (
                n.attr("value"),
                n.attr("value_int"),
                n.attr("value_ints"),
                n.attr("value_float"),
                n.attr("value_floats"),
            ) {
                (Some(Attr::Tensor(t)), ..) => t.clone(),
                (_, Some(Attr::Int(i)), ..) => Tensor::from_i64(vec![], &[*i]),
                (_, _, Some(Attr::Ints(v)), ..) => Tensor::from_i64(vec![v.len() as i64], v),
                (_, _, _, Some(Attr::Float(f)), _) => Tensor::from_f32(vec![], &[*f]),
                (_, _, _, _, Some(Attr::Floats(f))) => Tensor::from_f32(vec![f.len() as i64], f),
                _ => return None,
            };
            return Some(vec![t]);
        }
        Op::Shape | Op::Size => {
            let v = n.input(0)?;
            let s = match get(0) {
                Some(t) => t.dims.clone(),
                None => graph.ty(v).concrete_shape()?,
            };
            if matches!(n.op, Op::Size) {
                let size = s.iter().try_fold(1i64, |n, &d| n.checked_mul(d))?;
                return Some(vec![Tensor::from_i64(vec![], &[size])]);
            }
            let r = s.len() as i64;
            let clamp = |x: i64| if x < 0 { (x + r).max(0) } else { x.min(r) };
            let (a, b) = if opset >= 15 {
                (clamp(n.attr_int("start").unwrap_or(0)), clamp(n.attr_int("end").unwrap_or(r)))
            } else {
                (0, r)
            };
            let vals: Vec<i64> = if b > a { s[a as usize..b as usize].to_vec() } else { vec![] };
            return Some(vec![Tensor::from_i64(vec![vals.len() as i64], &vals)]);
        }
        Op::Cast => {
            let to = DType::from_onnx_code(i32::try_from(n.attr_int("to")?).ok()?)?;
            vec![cast(get(0)?, to)?]
        }
        Op::CastLike => vec![cast(get(0)?, get(1)?.dtype)?],
        Op::Neg => {
            let v = get(0)?;
            let data = match &v.data {
                Data::I(x) => Data::I(x.iter().map(|i| i.wrapping_neg()).collect()),
                Data::F(x) => Data::F(x.iter().map(|f| -f).collect()),
            };
            vec![V { data, ..v.clone() }.to_tensor().and_then(|t| V::from_tensor(&t))?]
        }
        // Correctly rounded in IEEE arithmetic: computed in f64 and rounded
        // once to the dtype, which gives the same bits (f64 has more than
        // twice the precision of f32 plus two bits).
        Op::Sqrt | Op::Reciprocal => {
            let v = get(0)?;
            let Data::F(x) = &v.data else { return None };
            let f: fn(f64) -> f64 = if n.op == Op::Sqrt { f64::sqrt } else { |a| 1.0 / a };
            let data = Data::F(x.iter().map(|&a| f(a)).collect());
            vec![V { data, ..v.clone() }.to_tensor().and_then(|t| V::from_tensor(&t))?]
        }
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Equal
        | Op::Less
        | Op::Greater
        | Op::LessOrEqual
        | Op::GreaterOrEqual
        | Op::And
        | Op::Or => {
            vec![binary(&n.op, get(0)?, get(1)?)?]
        }
        Op::Where => {
            let (c, x, y) = (get(0)?, get(1)?, get(2)?);
            let out = broadcast_shape(&broadcast_shape(&c.dims, &x.dims)?, &y.dims)?;
            let (c, x, y) = (broadcast_to(c, &out)?, broadcast_to(x, &out)?, broadcast_to(y, &out)?);
            let cv = c.ints()?;
            let data = match (&x.data, &y.data) {
                (Data::I(a), Data::I(b)) => {
                    Data::I(cv.iter().enumerate().map(|(i, &k)| if k != 0 { a[i] } else { b[i] }).collect())
                }
                (Data::F(a), Data::F(b)) => {
                    Data::F(cv.iter().enumerate().map(|(i, &k)| if k != 0 { a[i] } else { b[i] }).collect())
                }
                _ => return None,
            };
            vec![V { dtype: x.dtype, dims: out, data }]
        }
        Op::Reshape | Op::Squeeze | Op::Unsqueeze | Op::Flatten => {
            let x = get(0)?;
            let dims = infer_dims(graph, node, &ins, opset)?.into_iter().next()?;
            vec![V { dims, ..x.clone() }]
        }
        Op::Transpose => {
            let x = get(0)?;
            let r = x.dims.len();
            let perm: Vec<usize> = match n.attr_ints("perm") {
                Some(p) => p.iter().map(|&a| norm(a, r)).collect::<Option<_>>()?,
                None => (0..r).rev().collect(),
            };
            if perm.len() != r {
                return None;
            }
            let xd = udims(&x.dims)?;
            let st = strides(&xd);
            let od: Vec<usize> = perm.iter().map(|&p| xd[p]).collect();
            let idx = map_indices(&od, |i| Some(i.iter().zip(&perm).map(|(&k, &p)| k * st[p]).sum()))?;
            vec![x.pick(x.dtype, od.iter().map(|&d| d as i64).collect(), &idx)?]
        }
        Op::Concat => {
            let parts: Vec<&V> = ins.iter().flatten().collect();
            let first = parts.first()?;
            let r = first.dims.len();
            let axis = norm(n.attr_int("axis")?, r)?;
            let outer: usize = udims(&first.dims[..axis])?.iter().product();
            let mut dims = first.dims.clone();
            dims[axis] = parts.iter().map(|p| p.dims.get(axis).copied().unwrap_or(0)).sum();
            let mut data_i = Vec::new();
            let mut data_f = Vec::new();
            for o in 0..outer {
                for p in &parts {
                    if p.dims.len() != r || p.dtype != first.dtype {
                        return None;
                    }
                    let inner: usize = udims(&p.dims[axis..])?.iter().product();
                    match &p.data {
                        Data::I(v) => data_i.extend_from_slice(v.get(o * inner..(o + 1) * inner)?),
                        Data::F(v) => data_f.extend_from_slice(v.get(o * inner..(o + 1) * inner)?),
                    }
                }
            }
            let data = if first.dtype.is_float() { Data::F(data_f) } else { Data::I(data_i) };
            vec![V { dtype: first.dtype, dims, data }]
        }
        Op::Gather => {
            let (x, ix) = (get(0)?, get(1)?);
            let r = x.dims.len();
            let axis = norm(n.attr_int("axis").unwrap_or(0), r)?;
            let xd = udims(&x.dims)?;
            let st = strides(&xd);
            let ivals = ix.ints()?;
            let mut od: Vec<usize> = xd[..axis].to_vec();
            let id = udims(&ix.dims)?;
            od.extend(&id);
            od.extend(&xd[axis + 1..]);
            let q = id.len();
            let ist = strides(&id);
            let idx = map_indices(&od, |i| {
                let flat: usize = i[axis..axis + q].iter().zip(&ist).map(|(a, b)| a * b).sum();
                let mut k = *ivals.get(flat)?;
                if k < 0 {
                    k += xd[axis] as i64;
                }
                let k = usize::try_from(k).ok().filter(|&k| k < xd[axis])?;
                let mut off = k * st[axis];
                for a in 0..axis {
                    off += i[a] * st[a];
                }
                for a in axis + 1..r {
                    off += i[a + q - 1] * st[a];
                }
                Some(off)
            })?;
            vec![x.pick(x.dtype, od.iter().map(|&d| d as i64).collect(), &idx)?]
        }
        Op::Slice => {
            let x = get(0)?;
            let r = x.dims.len();
            let (starts, ends, axes, steps) = if opset < 10 {
                (
                    n.attr_ints("starts")?.to_vec(),
                    n.attr_ints("ends")?.to_vec(),
                    n.attr_ints("axes").map(<[i64]>::to_vec),
                    None,
                )
            } else {
                (
                    get(1)?.ints()?.to_vec(),
                    get(2)?.ints()?.to_vec(),
                    get(3).and_then(|v| v.ints().map(<[i64]>::to_vec)),
                    get(4).and_then(|v| v.ints().map(<[i64]>::to_vec)),
                )
            };
            let k = starts.len();
            let axes: Vec<usize> = match axes {
                Some(a) => a.iter().map(|&a| norm(a, r)).collect::<Option<_>>()?,
                None => (0..k).collect(),
            };
            let steps = steps.unwrap_or_else(|| vec![1; k]);
            if ends.len() != k || axes.len() != k || steps.len() != k {
                return None;
            }
            let xd = udims(&x.dims)?;
            let mut start = vec![0i64; r];
            let mut step = vec![1i64; r];
            let mut od = xd.clone();
            for i in 0..k {
                let a = axes[i];
                let (len, s0) = super::movement::slice_len(
                    &Dim::from(x.dims[a]),
                    &Dim::from(starts[i]),
                    &Dim::from(ends[i]),
                    steps[i],
                )
                .ok()?;
                od[a] = usize::try_from(len.as_const()?).ok()?;
                start[a] = s0.as_const()?;
                step[a] = steps[i];
            }
            let st = strides(&xd);
            let idx = map_indices(&od, |i| {
                let mut off = 0usize;
                for a in 0..r {
                    off += usize::try_from(start[a] + i[a] as i64 * step[a]).ok()? * st[a];
                }
                Some(off)
            })?;
            vec![x.pick(x.dtype, od.iter().map(|&d| d as i64).collect(), &idx)?]
        }
        Op::ConstantOfShape => {
            let s = get(0)?.ints()?.to_vec();
            let fill = match n.attr("value") {
                Some(Attr::Tensor(t)) => V::from_tensor(t)?,
                _ => V { dtype: DType::F32, dims: vec![1], data: Data::F(vec![0.0]) },
            };
            if fill.len() != 1 {
                return None;
            }
            let cnt = usize::try_from(s.iter().product::<i64>()).ok().filter(|&c| c <= 1 << 26)?;
            vec![fill.pick(fill.dtype, s, &vec![0; cnt])?]
        }
        Op::Range => {
            let (a, b, c) = (get(0)?, get(1)?, get(2)?);
            match (&a.data, &b.data, &c.data) {
                (Data::I(x), Data::I(y), Data::I(z)) => {
                    let (s, l, d) = (*x.first()?, *y.first()?, *z.first()?);
                    if d == 0 {
                        return None;
                    }
                    let n = if d > 0 { (l - s + d - 1).div_euclid(d) } else { (s - l - d - 1).div_euclid(-d) }.max(0);
                    if n > 1 << 26 {
                        return None;
                    }
                    let v: Vec<i64> = (0..n).map(|i| s + i * d).collect();
                    vec![V { dtype: a.dtype, dims: vec![n], data: Data::I(v) }]
                }
                (Data::F(x), Data::F(y), Data::F(z)) => {
                    let (s, l, d) = (*x.first()?, *y.first()?, *z.first()?);
                    if d == 0.0 {
                        return None;
                    }
                    let n = ((l - s) / d).ceil().max(0.0) as i64;
                    if n > 1 << 26 {
                        return None;
                    }
                    let v: Vec<f64> = (0..n).map(|i| s + i as f64 * d).collect();
                    vec![V { dtype: a.dtype, dims: vec![n], data: Data::F(v) }]
                }
                _ => return None,
            }
        }
        Op::Expand => {
            let x = get(0)?;
            let s = get(1)?.ints()?.to_vec();
            let out = broadcast_shape(&x.dims, &s)?;
            vec![broadcast_to(x, &out)?]
        }
        _ => return None,
    };
    out.iter().map(V::to_tensor).collect()
}
