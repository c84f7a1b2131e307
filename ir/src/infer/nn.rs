//! Neural-network ops: convolutions, pooling, GEMM/MatMul, normalizations,
//! recurrent layers and losses. Spatial sizes stay symbolic through floor
//! and ceil division by constants.

use super::ctx::{broadcast, done, done_many, norm_axis, tt, Cx, InferResult};
use crate::{DType, Dim, Op, TensorType};

fn dims_of(cx: &Cx, name: &str, n: usize, default: i64) -> Result<Vec<i64>, String> {
    match cx.ints(name) {
        Some(v) if v.len() == n => Ok(v),
        Some(v) => Err(format!("attribute {name} has {} values, expected {n}", v.len())),
        None => Ok(vec![default; n]),
    }
}

fn pads_of(cx: &Cx, n: usize) -> Result<Vec<i64>, String> {
    match cx.ints("pads") {
        Some(v) if v.len() == 2 * n => Ok(v),
        Some(v) => Err(format!("attribute pads has {} values, expected {}", v.len(), 2 * n)),
        None => Ok(vec![0; 2 * n]),
    }
}

/// Output size of a sliding window: `floor_or_ceil((in + pads - dil*(k-1) - 1) / s) + 1`,
/// or `ceil(in / s)` for SAME auto-padding.
#[allow(clippy::too_many_arguments)]
fn window_out(
    input: &Dim,
    k: i64,
    s: i64,
    d: i64,
    pb: i64,
    pe: i64,
    auto_pad: &str,
    ceil: bool,
) -> Result<Dim, String> {
    if s <= 0 || d <= 0 || k <= 0 {
        return Err(format!("bad window: kernel {k}, stride {s}, dilation {d}"));
    }
    let ek = d * (k - 1) + 1;
    let out = match auto_pad {
        "SAME_UPPER" | "SAME_LOWER" => input.ceil_div_const(s),
        "VALID" => input.sub(&Dim::from(ek - 1)).ceil_div_const(s),
        _ => {
            let num = input.add(&Dim::from(pb + pe - ek));
            let q = if ceil { num.ceil_div_const(s) } else { num.floor_div_const(s) };
            let mut q = q.map(|q| q.add(&Dim::from(1)));
            // With ceil_mode the last window must start inside the input or left pad.
            if let (true, Some(o), Some(i)) = (ceil, q.as_ref().and_then(Dim::as_const), input.as_const()) {
                if o > 0 && (o - 1) * s >= i + pb {
                    q = Some(Dim::from(o - 1));
                }
            }
            q
        }
    };
    let out = out.ok_or("bad stride")?;
    if let Some(c) = out.as_const() {
        if c <= 0 {
            return Err(format!("window gives non-positive output size {c}"));
        }
    }
    Ok(out)
}

/// Conv, ConvInteger, QLinearConv, DeformConv.
pub fn conv(cx: &Cx) -> InferResult {
    let (xi, wi) = if matches!(cx.node.op, Op::QLinearConv) { (0, 3) } else { (0, 1) };
    let x = cx.req(xi)?;
    let dtype = match cx.node.op {
        Op::ConvInteger => Some(DType::I32),
        Op::QLinearConv => cx.dtype(7).or(x.dtype),
        _ => x.dtype,
    };
    let (Some(xs), Some(ws)) = (x.shape.as_ref(), cx.shape(wi)) else { return done(tt(dtype, None)) };
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!("X rank {} and W rank {} do not fit a convolution", xs.len(), ws.len()));
    }
    let n = xs.len() - 2;
    let group = cx.int("group", 1);
    if group <= 0 {
        return Err(format!("bad group {group}"));
    }
    if let (Some(c), Some(wc)) = (xs[1].as_const(), ws[1].as_const()) {
        if c != wc * group {
            return Err(format!("X has {c} channels but W expects {wc}*{group}"));
        }
    }
    let ks = match cx.ints("kernel_shape") {
        Some(k) if k.len() == n => k,
        Some(k) => return Err(format!("kernel_shape has {} values, expected {n}", k.len())),
        None => ws[2..].iter().map(|d| d.as_const().ok_or("symbolic kernel size")).collect::<Result<_, _>>()?,
    };
    let s = dims_of(cx, "strides", n, 1)?;
    let d = dims_of(cx, "dilations", n, 1)?;
    let p = pads_of(cx, n)?;
    let ap = cx.string("auto_pad").unwrap_or("NOTSET");
    let mut out = vec![xs[0].clone(), ws[0].clone()];
    for i in 0..n {
        out.push(window_out(&xs[i + 2], ks[i], s[i], d[i], p[i], p[i + n], ap, false)?);
    }
    done(tt(dtype, Some(out)))
}

/// ConvTranspose.
pub fn conv_transpose(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let (Some(xs), Some(ws)) = (x.shape.as_ref(), cx.shape(1)) else { return done(tt(x.dtype, None)) };
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!("X rank {} and W rank {} do not fit a transposed convolution", xs.len(), ws.len()));
    }
    let n = xs.len() - 2;
    let group = cx.int("group", 1);
    let ks = match cx.ints("kernel_shape") {
        Some(k) if k.len() == n => k,
        Some(k) => return Err(format!("kernel_shape has {} values, expected {n}", k.len())),
        None => ws[2..].iter().map(|d| d.as_const().ok_or("symbolic kernel size")).collect::<Result<_, _>>()?,
    };
    let s = dims_of(cx, "strides", n, 1)?;
    let d = dims_of(cx, "dilations", n, 1)?;
    let p = pads_of(cx, n)?;
    let op = dims_of(cx, "output_padding", n, 0)?;
    let ap = cx.string("auto_pad").unwrap_or("NOTSET");
    let mut out = vec![xs[0].clone(), ws[1].mul(&Dim::from(group))];
    if let Some(os) = cx.ints("output_shape") {
        if os.len() < n {
            return Err(format!("output_shape has {} values, expected {n}", os.len()));
        }
        out.extend(os[os.len() - n..].iter().map(|&v| Dim::from(v)));
    } else {
        for i in 0..n {
            let o = match ap {
                "SAME_UPPER" | "SAME_LOWER" => xs[i + 2].mul(&Dim::from(s[i])),
                _ => {
                    let pads = if ap == "VALID" { 0 } else { p[i] + p[i + n] };
                    xs[i + 2]
                        .sub(&Dim::from(1))
                        .mul(&Dim::from(s[i]))
                        .add(&Dim::from(op[i] + (ks[i] - 1) * d[i] + 1 - pads))
                }
            };
            out.push(o);
        }
    }
    done(tt(x.dtype, Some(out)))
}

/// MaxPool, AveragePool, LpPool.
pub fn pool(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let Some(xs) = x.shape.as_ref() else {
        return done_many((0..cx.n_out()).map(|i| tt(if i == 0 { x.dtype } else { Some(DType::I64) }, None)).collect());
    };
    if xs.len() < 3 {
        return Err(format!("pooling needs rank ≥ 3, got {}", xs.len()));
    }
    let n = xs.len() - 2;
    let ks = cx.ints("kernel_shape").ok_or("missing kernel_shape")?;
    if ks.len() != n {
        return Err(format!("kernel_shape has {} values, expected {n}", ks.len()));
    }
    let s = dims_of(cx, "strides", n, 1)?;
    let d = dims_of(cx, "dilations", n, 1)?;
    let p = pads_of(cx, n)?;
    let ap = cx.string("auto_pad").unwrap_or("NOTSET");
    let ceil = cx.int("ceil_mode", 0) != 0;
    let mut out = vec![xs[0].clone(), xs[1].clone()];
    for i in 0..n {
        out.push(window_out(&xs[i + 2], ks[i], s[i], d[i], p[i], p[i + n], ap, ceil)?);
    }
    let mut ts = vec![tt(x.dtype, Some(out.clone()))];
    if cx.n_out() > 1 {
        ts.push(TensorType::new(DType::I64, out));
    }
    done_many(ts)
}

/// GlobalAveragePool, GlobalMaxPool, GlobalLpPool: spatial dims become 1.
pub fn global_pool(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let shape = match &x.shape {
        Some(s) if s.len() >= 2 => {
            Some(s.iter().enumerate().map(|(i, d)| if i < 2 { d.clone() } else { Dim::from(1) }).collect())
        }
        Some(s) => return Err(format!("global pooling needs rank ≥ 2, got {}", s.len())),
        None => None,
    };
    done(tt(x.dtype, shape))
}

/// MaxRoiPool and RoiAlign: `[num_rois, C, h, w]`.
pub fn roi(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let (h, w) = if matches!(cx.node.op, Op::MaxRoiPool) {
        let p = cx.ints("pooled_shape").ok_or("missing pooled_shape")?;
        if p.len() != 2 {
            return Err("pooled_shape must have 2 values".into());
        }
        (p[0], p[1])
    } else {
        (cx.int("output_height", 1), cx.int("output_width", 1))
    };
    let shape = match (&x.shape, cx.shape(1)) {
        (Some(xs), Some(rs)) if xs.len() == 4 && !rs.is_empty() => {
            Some(vec![rs[0].clone(), xs[1].clone(), Dim::from(h), Dim::from(w)])
        }
        (Some(_), Some(_)) => return Err("expected X of rank 4 and rois of rank 2".into()),
        _ => None,
    };
    done(tt(x.dtype, shape))
}

/// MaxUnpool: from output_shape input, else `(in-1)*s + k - pads`.
pub fn max_unpool(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    if cx.has(2) {
        return done(tt(x.dtype, cx.known_dims(2).map(<[Dim]>::to_vec)));
    }
    let Some(xs) = x.shape.as_ref() else { return done(tt(x.dtype, None)) };
    if xs.len() < 3 {
        return Err("MaxUnpool needs rank ≥ 3".into());
    }
    let n = xs.len() - 2;
    let ks = cx.ints("kernel_shape").ok_or("missing kernel_shape")?;
    if ks.len() != n {
        return Err("kernel_shape length mismatch".into());
    }
    let s = dims_of(cx, "strides", n, 1)?;
    let p = pads_of(cx, n)?;
    let mut out = vec![xs[0].clone(), xs[1].clone()];
    for i in 0..n {
        out.push(xs[i + 2].sub(&Dim::from(1)).mul(&Dim::from(s[i])).add(&Dim::from(ks[i] - p[i] - p[i + n])));
    }
    done(tt(x.dtype, Some(out)))
}

/// Gemm with transA/transB.
pub fn gemm(cx: &Cx) -> InferResult {
    let a = cx.req(0)?;
    let (Some(sa), Some(sb)) = (a.shape.as_ref(), cx.shape(1)) else { return done(tt(a.dtype, None)) };
    if sa.len() != 2 || sb.len() != 2 {
        return Err(format!("Gemm needs rank-2 A and B, got {} and {}", sa.len(), sb.len()));
    }
    let (m, ka) = if cx.int("transA", 0) != 0 { (&sa[1], &sa[0]) } else { (&sa[0], &sa[1]) };
    let (kb, n) = if cx.int("transB", 0) != 0 { (&sb[1], &sb[0]) } else { (&sb[0], &sb[1]) };
    check_k(ka, kb)?;
    let out = vec![m.clone(), n.clone()];
    if let Some(c) = cx.shape(2) {
        let b = broadcast(&out, c)?;
        if b != out {
            return Err(format!("C does not broadcast to [{m},{n}]"));
        }
    }
    done(tt(a.dtype, Some(out)))
}

fn check_k(a: &Dim, b: &Dim) -> Result<(), String> {
    match (a.as_const(), b.as_const()) {
        (Some(x), Some(y)) if x != y => Err(format!("inner dimensions differ: {x} vs {y}")),
        _ => Ok(()),
    }
}

/// numpy matmul shape.
pub fn matmul_shape(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    if a.is_empty() || b.is_empty() {
        return Err("MatMul inputs must not be scalars".into());
    }
    let (mut a2, mut b2) = (a.to_vec(), b.to_vec());
    let a1 = a.len() == 1;
    let b1 = b.len() == 1;
    if a1 {
        a2.insert(0, Dim::from(1));
    }
    if b1 {
        b2.push(Dim::from(1));
    }
    check_k(&a2[a2.len() - 1], &b2[b2.len() - 2])?;
    let batch = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    let mut out = batch;
    if !a1 {
        out.push(a2[a2.len() - 2].clone());
    }
    if !b1 {
        out.push(b2[b2.len() - 1].clone());
    }
    Ok(out)
}

/// MatMul, MatMulInteger, QLinearMatMul.
pub fn matmul(cx: &Cx) -> InferResult {
    let (ai, bi) = if matches!(cx.node.op, Op::QLinearMatMul) { (0, 3) } else { (0, 1) };
    let a = cx.req(ai)?;
    let dtype = match cx.node.op {
        Op::MatMulInteger => Some(DType::I32),
        Op::QLinearMatMul => cx.dtype(7).or(a.dtype),
        _ => a.dtype,
    };
    let shape = match (&a.shape, cx.shape(bi)) {
        (Some(sa), Some(sb)) => Some(matmul_shape(sa, sb)?),
        _ => None,
    };
    done(tt(dtype, shape))
}

/// BatchNormalization: Y like X; extra outputs (training) are `[C]`.
pub fn batch_norm(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let c = x.shape.as_ref().and_then(|s| s.get(1).cloned());
    let mut ts = vec![x.clone()];
    let stat_dt = cx.dtype(3).or(x.dtype);
    for _ in 1..cx.n_out() {
        ts.push(tt(stat_dt, c.clone().map(|c| vec![c])));
    }
    done_many(ts)
}

/// LayerNormalization: Y like X; Mean/InvStdDev keep dims before `axis`, 1 after.
pub fn layer_norm(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let mut ts = vec![x.clone()];
    if cx.n_out() > 1 {
        let stash = cx.dtype_attr("stash_type")?.unwrap_or(DType::F32);
        let shape = match &x.shape {
            Some(s) => {
                let ax = norm_axis(cx.int("axis", -1), s.len())?;
                Some(s.iter().enumerate().map(|(i, d)| if i < ax { d.clone() } else { Dim::from(1) }).collect())
            }
            None => None,
        };
        for _ in 1..cx.n_out() {
            ts.push(tt(Some(stash), shape.clone()));
        }
    }
    done_many(ts)
}

/// Attention (opset 23): Q, K, V as `[batch, heads, seq, head_size]`, or
/// 3-D `[batch, seq, heads * head_size]` with the `q_num_heads` /
/// `kv_num_heads` attributes. Outputs: Y (Q's layout, V's head size),
/// present key and value (past sequence + new, 4-D), and the QK product
/// `[batch, q_heads, q_seq, total_seq]`. Y and the present key have Q's and
/// K's dtype (T1), the present value V's (T2).
pub fn attention(cx: &Cx) -> InferResult {
    let q = cx.req(0)?;
    let (dt_q, dt_v) = (q.dtype, cx.dtype(2));
    let unknown = |d: Option<DType>| tt(d, None);
    let (Some(qs), Some(ks), Some(vs)) = (cx.shape(0), cx.shape(1), cx.shape(2)) else {
        return done_many([dt_q, dt_q, dt_v, dt_q].into_iter().take(cx.n_out()).map(unknown).collect());
    };
    let rank = qs.len();
    if !(rank == 3 || rank == 4) || ks.len() != rank || vs.len() != rank {
        return Err(format!(
            "Q, K and V must all have rank 3 or all rank 4, got {}, {} and {}",
            qs.len(),
            ks.len(),
            vs.len()
        ));
    }
    let heads = |name: &str| -> Result<Dim, String> {
        match cx.int(name, 0) {
            h if h > 0 => Ok(Dim::from(h)),
            _ => Err(format!("3-D inputs need a positive `{name}` attribute")),
        }
    };
    let split = |hidden: &Dim, h: &Dim| {
        hidden.div_exact(h).ok_or_else(|| format!("hidden size {hidden} is not a multiple of {h} heads"))
    };
    // (batch, q_heads, q_seq, kv_heads, kv_seq, head_size, v_head_size)
    let (batch, hq, sq, hkv, skv, dk, dv) = if rank == 4 {
        (qs[0].clone(), qs[1].clone(), qs[2].clone(), ks[1].clone(), ks[2].clone(), ks[3].clone(), vs[3].clone())
    } else {
        let (hq, hkv) = (heads("q_num_heads")?, heads("kv_num_heads")?);
        let dk = split(&ks[2], &hkv)?;
        let dv = split(&vs[2], &hkv)?;
        (qs[0].clone(), hq, qs[1].clone(), hkv, ks[1].clone(), dk, dv)
    };
    let total = match cx.shape(4) {
        Some(p) if p.len() == 4 => p[2].add(&skv),
        Some(p) => return Err(format!("past_key must have rank 4, got {}", p.len())),
        None => skv,
    };
    let y = if rank == 4 {
        vec![batch.clone(), hq.clone(), sq.clone(), dv.clone()]
    } else {
        vec![batch.clone(), sq.clone(), hq.mul(&dv)]
    };
    let present = |d: &Dim| vec![batch.clone(), hkv.clone(), total.clone(), d.clone()];
    let ts = vec![
        tt(dt_q, Some(y)),
        tt(dt_q, Some(present(&dk))),
        tt(dt_v, Some(present(&dv))),
        tt(dt_q, Some(vec![batch.clone(), hq.clone(), sq.clone(), total.clone()])),
    ];
    done_many(ts.into_iter().take(cx.n_out()).collect())
}

/// LSTM, GRU, RNN.
pub fn recurrent(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let hidden = Dim::from(cx.int("hidden_size", 0));
    let dirs = Dim::from(if cx.string("direction") == Some("bidirectional") { 2 } else { 1 });
    let layout = cx.int("layout", 0);
    let Some(xs) = x.shape.as_ref() else { return done_many(vec![tt(x.dtype, None); cx.n_out()]) };
    if xs.len() != 3 {
        return Err(format!("X must have rank 3, got {}", xs.len()));
    }
    let (seq, batch) = if layout == 0 { (&xs[0], &xs[1]) } else { (&xs[1], &xs[0]) };
    let y = if layout == 0 {
        vec![seq.clone(), dirs.clone(), batch.clone(), hidden.clone()]
    } else {
        vec![batch.clone(), seq.clone(), dirs.clone(), hidden.clone()]
    };
    let h = if layout == 0 { vec![dirs, batch.clone(), hidden] } else { vec![batch.clone(), dirs, hidden] };
    let mut ts = vec![tt(x.dtype, Some(y))];
    for _ in 1..cx.n_out() {
        ts.push(tt(x.dtype, Some(h.clone())));
    }
    done_many(ts)
}

/// SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss.
pub fn loss(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let red = cx.string("reduction").unwrap_or("mean");
    let shape = if red == "none" { cx.shape(1).map(<[Dim]>::to_vec) } else { Some(vec![]) };
    let mut ts = vec![tt(x.dtype, shape)];
    if cx.n_out() > 1 {
        ts.push(x.clone());
    }
    done_many(ts)
}

/// GridSample: `[N, C, grid spatial...]`.
pub fn grid_sample(cx: &Cx) -> InferResult {
    let x = cx.req(0)?;
    let shape = match (&x.shape, cx.shape(1)) {
        (Some(xs), Some(gs)) if xs.len() >= 3 && gs.len() == xs.len() => {
            let mut s = vec![xs[0].clone(), xs[1].clone()];
            s.extend(gs[1..gs.len() - 1].iter().cloned());
            Some(s)
        }
        (Some(_), Some(_)) => return Err("X and grid ranks do not fit".into()),
        _ => None,
    };
    done(tt(x.dtype, shape))
}

/// Einsum with an explicit or implicit output; `...` broadcasts.
pub fn einsum(cx: &Cx) -> InferResult {
    let eq: String = cx.string("equation").ok_or("missing equation")?.chars().filter(|c| !c.is_whitespace()).collect();
    let dtype = cx.dtype(0);
    let shapes: Option<Vec<&[Dim]>> = (0..cx.n_in()).map(|i| cx.shape(i)).collect();
    let Some(shapes) = shapes else { return done(tt(dtype, None)) };
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != shapes.len() {
        return Err(format!("equation has {} operands, node has {}", terms.len(), shapes.len()));
    }
    let mut letters: std::collections::BTreeMap<char, Dim> = std::collections::BTreeMap::new();
    let mut counts: std::collections::BTreeMap<char, usize> = std::collections::BTreeMap::new();
    let mut ell: Vec<Dim> = Vec::new();
    for (t, s) in terms.iter().zip(&shapes) {
        let has_ell = t.contains("...");
        let labels: Vec<char> = t.replace("...", "").chars().collect();
        if labels.len() > s.len() || (!has_ell && labels.len() != s.len()) {
            return Err(format!("term {t} does not fit rank {}", s.len()));
        }
        let ne = s.len() - labels.len();
        let pos = t.find("...").unwrap_or(t.len());
        let before = t[..pos].chars().count();
        let mut idx = 0;
        for (j, c) in labels.iter().enumerate() {
            if j == before {
                idx += ne;
            }
            let d = s[idx].clone();
            idx += 1;
            *counts.entry(*c).or_default() += 1;
            match letters.get(c) {
                Some(prev) => {
                    let b = super::ctx::broadcast_dim(prev, &d)?;
                    letters.insert(*c, b);
                }
                None => {
                    letters.insert(*c, d);
                }
            }
        }
        if has_ell {
            ell = broadcast(&ell, &s[before..before + ne])?;
        }
    }
    let out_spec = rhs.unwrap_or_else(|| {
        let mut s = if lhs.contains("...") { "...".to_string() } else { String::new() };
        s.extend(counts.iter().filter(|(_, &n)| n == 1).map(|(c, _)| *c));
        s
    });
    let mut out = Vec::new();
    let mut rest = out_spec.as_str();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("...") {
            out.extend(ell.iter().cloned());
            rest = r;
        } else {
            let c = rest.chars().next().ok_or("bad equation")?;
            out.push(letters.get(&c).cloned().ok_or_else(|| format!("output label {c} not in inputs"))?);
            rest = &rest[c.len_utf8()..];
        }
    }
    done(tt(dtype, Some(out)))
}
