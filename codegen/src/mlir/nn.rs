//! Structured lowerings of the network ops (see the list in the parent
//! module's documentation). Each returns the SSA names of the node's outputs,
//! or `None` to leave the node generic.

use qsync_ir::{DType, Dim, Node, Op, ValueId};

use super::build::{acc_type, float_lit, map, ranked, Body, Operand};
use super::{axis_index, elem, is_float, quote, Emitter};

/// Window attributes beyond this are refused (keeps the arithmetic exact).
pub(super) const WINDOW_LIMIT: i64 = 1 << 20;

/// An attribute with one value per spatial axis (`strides`, `dilations`,
/// `kernel_shape`) or its default; each at least 1.
pub(super) fn window(node: &Node, name: &str, n: usize, default: Option<i64>) -> Option<Vec<i64>> {
    let v = match node.attr_ints(name) {
        Some(v) if v.len() == n => v.to_vec(),
        Some(_) => return None,
        None => vec![default?; n],
    };
    v.iter().all(|x| (1..=WINDOW_LIMIT).contains(x)).then_some(v)
}

/// The windows of a pooling op over its trailing spatial axes (see
/// `Emitter::pool_windows`).
struct PoolWindows {
    k: Vec<i64>,
    s: Vec<i64>,
    d: Vec<i64>,
    lo: Vec<i64>,
    hi: Vec<i64>,
    extra: Vec<i64>,
}

impl PoolWindows {
    /// End padding: the pads plus what ceil mode needs.
    fn high(&self) -> Vec<i64> {
        self.hi.iter().zip(&self.extra).map(|(h, e)| h + e).collect()
    }
}

/// Inside a pooling `linalg.generic` over N×C×out×window (n spatial axes):
/// each spatial position read, as i64, `out·s + k·d − begin pad`.
fn window_positions(b: &mut Body, s: &[i64], d: &[i64], lo: &[i64]) -> Vec<String> {
    let n = s.len();
    let cst = |b: &mut Body, v: i64| b.op(format!("arith.constant {v} : i64"));
    (0..n)
        .map(|i| {
            let o = b.op(format!("linalg.index {} : index", 2 + i));
            let o = b.op(format!("arith.index_cast {o} : index to i64"));
            let w = b.op(format!("linalg.index {} : index", 2 + n + i));
            let w = b.op(format!("arith.index_cast {w} : index to i64"));
            let (sv, dv, lv) = (cst(b, s[i]), cst(b, d[i]), cst(b, lo[i]));
            let a = b.bin("muli", &o, &sv, DType::I64);
            let m = b.bin("muli", &w, &dv, DType::I64);
            let p = b.bin("addi", &a, &m, DType::I64);
            b.bin("subi", &p, &lv, DType::I64)
        })
        .collect()
}

/// Whether every position lies in `[from, to)` (an i1).
fn inside(b: &mut Body, pos: &[String], from: &[i64], to: &[i64]) -> String {
    let mut all = b.op("arith.constant true");
    for ((p, &f), &t) in pos.iter().zip(from).zip(to) {
        let fc = b.op(format!("arith.constant {f} : i64"));
        let tc = b.op(format!("arith.constant {t} : i64"));
        let ge = b.op(format!("arith.cmpi sge, {p}, {fc} : i64"));
        let lt = b.op(format!("arith.cmpi slt, {p}, {tc} : i64"));
        let both = b.bin("andi", &ge, &lt, DType::Bool);
        all = b.bin("andi", &all, &both, DType::Bool);
    }
    all
}

/// `dense<[1, 2]> : tensor<2xi64>` (a splat when the values agree).
pub(super) fn dense_i64(v: &[i64]) -> String {
    let n = v.len();
    match v {
        [a, rest @ ..] if rest.iter().all(|b| b == a) => format!("dense<{a}> : tensor<{n}xi64>"),
        _ => {
            let items: Vec<String> = v.iter().map(i64::to_string).collect();
            format!("dense<[{}]> : tensor<{n}xi64>", items.join(", "))
        }
    }
}

/// Axes normalised against `rank`, sorted and distinct.
fn axes_of(raw: &[i64], rank: usize) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for &a in raw {
        out.push(axis_index(a, rank)?);
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

impl Emitter<'_> {
    /// Dispatch for ops lowered to several linalg/tensor operations.
    pub(super) fn lower_structured(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        match node.op {
            Op::Conv | Op::ConvTranspose => self.conv(node, outs),
            Op::MaxPool | Op::AveragePool | Op::LpPool => self.pool(node, outs),
            Op::GlobalAveragePool | Op::GlobalMaxPool => self.global_pool(node, outs),
            Op::Gemm => self.gemm(node, outs),
            Op::Flatten | Op::Reshape | Op::Squeeze | Op::Unsqueeze => {
                let x = self.input(node, 0)?;
                let (shape, dt) = self.out_type(*outs.first()?)?;
                (dt == x.dt && outs.len() == 1).then_some(())?;
                Some(vec![self.reshape(&x, &shape)?.name])
            }
            Op::Concat => self.concat(node, outs),
            Op::Pad => self.onnx_pad(node, outs),
            Op::ReduceMean | Op::ReduceSum | Op::ReduceMax | Op::ReduceMin => self.reduce_node(node, outs),
            Op::BatchNormalization => self.batch_norm(node, outs),
            Op::MatMul => self.matmul(node, outs),
            Op::Softmax => self.softmax(node, outs),
            Op::LogSoftmax => self.log_softmax(node, outs),
            Op::LayerNormalization => self.layer_norm(node, outs),
            Op::Gather => self.gather(node, outs),
            Op::CumSum => self.cumsum(node, outs),
            Op::ScatterND => self.scatter_nd(node, outs),
            Op::Dropout
            | Op::RandomUniformLike
            | Op::RandomUniform
            | Op::RandomNormalLike
            | Op::RandomNormal
            | Op::Bernoulli
            | Op::Multinomial => self.random(node, outs),
            Op::Constant
            | Op::ConstantOfShape
            | Op::Shape
            | Op::Range
            | Op::Expand
            | Op::Slice
            | Op::Split
            | Op::GatherElements
            | Op::GatherND => self.lower_shapes(node, outs),
            _ => self.elementwise(node, outs),
        }
    }

    fn input(&self, node: &Node, slot: usize) -> Option<Operand> {
        self.operand(node.input(slot)?)
    }

    /// `qsync.name`/`qsync.precision` of the node, for its main operation.
    pub(super) fn tags(&self, node: &Node) -> String {
        let mut t = format!("qsync.name = {}", quote(node.name.as_bytes()));
        if let Some(p) = node.precision {
            t.push_str(&format!(", qsync.precision = {}", quote(p.name().as_bytes())));
        }
        t
    }

    /// Begin/end padding of a window op over the trailing `k.len()` axes:
    /// `pads`, or what `auto_pad` asks for (`SAME_*` needs static spatial
    /// sizes).
    pub(super) fn pads_nd(node: &Node, x: &Operand, k: &[i64], s: &[i64], d: &[i64]) -> Option<(Vec<i64>, Vec<i64>)> {
        let n = k.len();
        match node.attr_str("auto_pad").unwrap_or("NOTSET") {
            "NOTSET" | "" => match node.attr_ints("pads") {
                None => Some((vec![0; n], vec![0; n])),
                Some(p) if p.len() == 2 * n && p.iter().all(|p| (0..=WINDOW_LIMIT).contains(p)) => {
                    Some((p[..n].to_vec(), p[n..].to_vec()))
                }
                Some(_) => None,
            },
            "VALID" => Some((vec![0; n], vec![0; n])),
            mode @ ("SAME_UPPER" | "SAME_LOWER") => {
                let (mut lo, mut hi) = (vec![0; n], vec![0; n]);
                for i in 0..n {
                    let size = x.size(x.rank() - n + i).filter(|&v| v <= WINDOW_LIMIT)?;
                    let out = (size + s[i] - 1) / s[i];
                    let total = ((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - size).max(0);
                    let small = total / 2;
                    (lo[i], hi[i]) = if mode == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                }
                Some((lo, hi))
            }
            _ => None,
        }
    }

    /// Float NCHW checks of pooling: rank 4 in and out, one element type.
    fn nchw(&self, node: &Node, outs: &[ValueId]) -> Option<(Operand, Vec<Dim>)> {
        let x = self.input(node, 0)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        (outs.len() == 1 && x.rank() == 4 && shape.len() == 4 && dt == x.dt && is_float(dt)).then_some((x, shape))
    }

    /// The windows of a pooling op over the spatial axes of `x` (all but
    /// N and C) into `oshape`: kernel, strides, dilations, begin and end
    /// pads, and the extra end padding that makes every output window
    /// (ceil mode) fit.
    fn pool_windows(node: &Node, x: &Operand, oshape: &[Dim]) -> Option<PoolWindows> {
        let n = x.rank().checked_sub(2).filter(|&n| n >= 1 && oshape.len() == n + 2)?;
        let k = window(node, "kernel_shape", n, None)?;
        let s = window(node, "strides", n, Some(1))?;
        let d = window(node, "dilations", n, Some(1))?;
        let (lo, hi) = Self::pads_nd(node, x, &k, &s, &d)?;
        let ceil = node.attr_int("ceil_mode").unwrap_or(0) == 1;
        let mut extra = vec![0i64; n];
        for i in 0..n {
            match (x.size(2 + i), oshape[2 + i].as_const()) {
                (Some(n), Some(o)) if n <= WINDOW_LIMIT && (1..=WINDOW_LIMIT).contains(&o) => {
                    let need = (o - 1) * s[i] + (k[i] - 1) * d[i] + 1;
                    extra[i] = (need - (n + lo[i] + hi[i])).max(0);
                }
                _ if ceil => return None,
                _ => {}
            }
        }
        Some(PoolWindows { k, s, d, lo, hi, extra })
    }

    fn pool(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        if node.op == Op::MaxPool && outs.len() == 2 {
            return self.max_pool_indices(node, outs);
        }
        if node.op == Op::LpPool || matches!(self.input(node, 0)?.rank(), 3 | 5) {
            return self.pool_nd(node, outs);
        }
        let (x, oshape) = self.nchw(node, outs)?;
        let win_nd = Self::pool_windows(node, &x, &oshape)?;
        let high = win_nd.high();
        let PoolWindows { k, s, d, lo, hi, extra } = win_nd;
        let dt = x.dt;
        let max = node.op == Op::MaxPool;
        let (pad_lit, init_lit) = if max {
            (float_lit(f64::NEG_INFINITY, dt), float_lit(f64::NEG_INFINITY, dt))
        } else {
            ("0.0".into(), "0.0".into())
        };
        let xp = self.pad_spatial(&x, &lo, &high, &pad_lit)?;
        // Window sums of 16-bit floats add up in f32 and round once, after
        // the division; a maximum is exact in any type.
        let acc = if max { dt } else { acc_type(dt) };
        let init = self.filled(&init_lit, &oshape, acc, &[&x])?;
        let win = self.line(format!("tensor.empty() : tensor<{}x{}x{}>", k[0], k[1], elem(dt)));
        let attrs = format!("{{dilations = {}, strides = {}, {}}}", dense_i64(&d), dense_i64(&s), self.tags(node));
        let op = if max { "linalg.pooling_nchw_max" } else { "linalg.pooling_nchw_sum" };
        let ty = init.ty();
        let name = self.line(format!(
            "{op} {attrs} ins({}, {win} : {}, tensor<{}x{}x{}>) outs({} : {ty}) -> {ty}",
            xp.name,
            xp.ty(),
            k[0],
            k[1],
            elem(dt),
            init.name
        ));
        let pooled = Operand { name, ..init };
        if max {
            return Some(vec![pooled.name]);
        }
        let include_pad = node.attr_int("count_include_pad").unwrap_or(0) == 1;
        let zero = |v: &[i64]| v.iter().all(|&e| e == 0);
        let uniform = zero(&extra) && (include_pad || (zero(&lo) && zero(&hi)));
        let out = if uniform {
            let n = self.scalar(&float_lit((k[0] * k[1]) as f64, acc), elem(acc));
            self.ewise(&[&pooled], &oshape, dt, |b, a| {
                let q = b.bin("divf", &a[0], &n, acc);
                b.convert(&q, acc, dt)
            })?
        } else {
            // Per-window divisors: the window sums of a ones tensor padded
            // like the input (ones on explicit pads when they count).
            let (h, w) = (x.size(2)?, x.size(3)?);
            let ones = Operand {
                name: self.line(format!("arith.constant dense<1.0> : tensor<1x1x{h}x{w}x{}>", elem(acc))),
                shape: vec![Dim::from(1), Dim::from(1), Dim::from(h), Dim::from(w)],
                dt: acc,
            };
            let ones = match include_pad {
                true => self.pad_spatial(&ones, &lo, &hi, "1.0")?,
                false => self.pad_spatial(&ones, &lo, &hi, "0.0")?,
            };
            let ones = self.pad_spatial(&ones, &[0, 0], &extra, "0.0")?;
            let cshape = vec![Dim::from(1), Dim::from(1), oshape[2].clone(), oshape[3].clone()];
            let cinit = self.filled("0.0", &cshape, acc, &[])?;
            let cty = cinit.ty();
            let counts = Operand {
                name: self.line(format!(
                    "linalg.pooling_nchw_sum {{dilations = {}, strides = {}}} ins({}, {win} : {}, tensor<{}x{}x{}>) outs({} : {cty}) -> {cty}",
                    dense_i64(&d),
                    dense_i64(&s),
                    ones.name,
                    ones.ty(),
                    k[0],
                    k[1],
                    elem(dt),
                    cinit.name
                )),
                ..cinit
            };
            self.ewise(&[&pooled, &counts], &oshape, dt, |b, a| {
                let q = b.bin("divf", &a[0], &a[1], acc);
                b.convert(&q, acc, dt)
            })?
        };
        Some(vec![out.name])
    }

    /// `MaxPool` with its `Indices` output: one `linalg.generic` over
    /// N×C×out×window (any number of spatial axes) reducing into (value,
    /// index) pairs. Each window position inside the input (padding is
    /// never chosen) replaces the pair when the pair is still empty, when
    /// its value is greater, when it equals the value and comes first in
    /// row-major order (so ties go to the first maximum in window order, as
    /// onnxruntime scans, whatever order the reduction runs in), or when the
    /// held value is NaN (NaNs are passed over as onnxruntime's `>` does).
    /// The index is row-major into the unpadded input; with
    /// `storage_order = 1` (2-D only, as ONNX defines it) an elementwise
    /// `linalg.generic` turns it into `(n·C + c)·H·W + w·H + h`, as
    /// onnxruntime does.
    fn max_pool_indices(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.input(node, 0)?;
        let (oshape, dt) = self.out_type(outs[0])?;
        let (ishape, it) = self.out_type(outs[1])?;
        let r = x.rank();
        if r < 3 || oshape.len() != r || dt != x.dt || !is_float(dt) || it != DType::I64 || ishape != oshape {
            return None;
        }
        let n = r - 2;
        let order = node.attr_int("storage_order").unwrap_or(0);
        let sizes: Vec<i64> = (1..r).map(|a| x.size(a)).collect::<Option<_>>()?;
        if !(0..=1).contains(&order) || (order == 1 && n != 2) || sizes.iter().any(|&v| v > WINDOW_LIMIT) {
            return None;
        }
        let (c, spatial) = (sizes[0], &sizes[1..]);
        let win_nd = Self::pool_windows(node, &x, &oshape)?;
        let ninf = float_lit(f64::NEG_INFINITY, dt);
        let xp = self.pad_spatial(&x, &win_nd.lo, &win_nd.high(), &ninf)?;
        let PoolWindows { k, s, d, lo, .. } = win_nd;
        let vinit = self.filled(&ninf, &oshape, dt, &[&x])?;
        let iinit = self.filled("-1", &oshape, DType::I64, &[&x])?;
        let (win, xmap, wmap, omap, iters) = self.window_maps(&k, &s, &d, dt);
        let prefix = format!("b{}_{}_", self.base, self.tmp);
        // Block arguments: the input element, the window (unused), and the best
        // value and index so far.
        let (elt, best, best_at) = (format!("%{prefix}a0"), format!("%{prefix}a2"), format!("%{prefix}a3"));
        let unused = format!("%{prefix}a1");
        let mut b = Body::named(&prefix);
        let pos = window_positions(&mut b, &s, &d, &lo);
        let cst = |b: &mut Body, v: i64| b.op(format!("arith.constant {v} : i64"));
        let zero = cst(&mut b, 0);
        let inb = inside(&mut b, &pos, &vec![0; n], spatial);
        // Row-major index into the unpadded input: ((n·C + c)·S₁ + p₁)·S₂ + p₂ …
        let i0 = b.op("linalg.index 0 : index");
        let i0 = b.op(format!("arith.index_cast {i0} : index to i64"));
        let i1 = b.op("linalg.index 1 : index");
        let i1 = b.op(format!("arith.index_cast {i1} : index to i64"));
        let cc = cst(&mut b, c);
        let nc = b.bin("muli", &i0, &cc, DType::I64);
        let mut flat = b.bin("addi", &nc, &i1, DType::I64);
        for (p, &sz) in pos.iter().zip(spatial) {
            let szc = cst(&mut b, sz);
            let t = b.bin("muli", &flat, &szc, DType::I64);
            flat = b.bin("addi", &t, p, DType::I64);
        }
        let empty = b.op(format!("arith.cmpi slt, {best_at}, {zero} : i64"));
        let e = elem(dt);
        let greater = b.op(format!("arith.cmpf ogt, {elt}, {best} : {e}"));
        let equal = b.op(format!("arith.cmpf oeq, {elt}, {best} : {e}"));
        let before = b.op(format!("arith.cmpi slt, {flat}, {best_at} : i64"));
        let tie = b.bin("andi", &equal, &before, DType::Bool);
        let nan = b.op(format!("arith.cmpf uno, {best}, {best} : {e}"));
        let better = b.bin("ori", &greater, &tie, DType::Bool);
        let better = b.bin("ori", &better, &nan, DType::Bool);
        let better = b.bin("ori", &better, &empty, DType::Bool);
        let take = b.bin("andi", &better, &inb, DType::Bool);
        let v = b.op(format!("arith.select {take}, {elt}, {best} : {e}"));
        let i = b.op(format!("arith.select {take}, {flat}, {best_at} : i64"));
        let (vty, ity) = (vinit.ty(), iinit.ty());
        let attrs = self.tags(node);
        let res = self.line_results(
            format!(
                "linalg.generic {{indexing_maps = [{xmap}, {wmap}, {omap}, {omap}], iterator_types = [{iters}]}} ins({}, {} : {}, {}) outs({}, {} : {vty}, {ity}) attrs = {{{attrs}}} {{\n    ^bb0({elt}: {e}, {unused}: {e}, {best}: {e}, {best_at}: i64):\n{}\n      linalg.yield {v}, {i} : {e}, i64\n    }} -> ({vty}, {ity})",
                xp.name,
                win.name,
                xp.ty(),
                win.ty(),
                vinit.name,
                iinit.name,
                b.into_lines().join("\n"),
            ),
            2,
        );
        let (values, rows) = (format!("{res}#0"), format!("{res}#1"));
        if order == 0 {
            return Some(vec![values, rows]);
        }
        // Column-major within each (n, c) plane: (n·C + c)·H·W + w·H + h.
        let (h, w) = (spatial[0], spatial[1]);
        let rm = Operand { name: rows, shape: oshape.clone(), dt: DType::I64 };
        let cm = self.ewise(&[&rm], &oshape, DType::I64, |b, a| {
            let (hc, wc, hw) = (cst(b, h), cst(b, w), cst(b, h * w));
            let local = b.bin("remsi", &a[0], &hw, DType::I64);
            let base = b.bin("subi", &a[0], &local, DType::I64);
            let row = b.bin("divsi", &local, &wc, DType::I64);
            let col = b.bin("remsi", &local, &wc, DType::I64);
            let t = b.bin("muli", &col, &hc, DType::I64);
            let t = b.bin("addi", &base, &t, DType::I64);
            b.bin("addi", &t, &row, DType::I64)
        })?;
        Some(vec![values, cm.name])
    }

    /// The window tensor (its extent gives the reduction loops their
    /// bounds, as the pooling ops take it) and the indexing maps of a
    /// pooling `linalg.generic` over N×C×out×window: the input read at
    /// `out·s + k·d` (padded), the window, and the output; the iterator
    /// types.
    fn window_maps(&mut self, k: &[i64], s: &[i64], d: &[i64], dt: DType) -> (Operand, String, String, String, String) {
        let n = k.len();
        let loops = 2 + 2 * n;
        let win = Operand { name: String::new(), shape: k.iter().map(|&v| Dim::from(v)).collect(), dt };
        let win = Operand { name: self.line(format!("tensor.empty() : {}", win.ty())), ..win };
        let wmap = map(loops, &(0..n).map(|i| format!("d{}", 2 + n + i)).collect::<Vec<_>>());
        let mut xs = vec!["d0".to_string(), "d1".to_string()];
        xs.extend((0..n).map(|i| format!("d{} * {} + d{} * {}", 2 + i, s[i], 2 + n + i, d[i])));
        let xmap = map(loops, &xs);
        let omap = map(loops, &(0..2 + n).map(|i| format!("d{i}")).collect::<Vec<_>>());
        let iters: Vec<String> =
            (0..loops).map(|i| if i < 2 + n { "\"parallel\"" } else { "\"reduction\"" }.to_string()).collect();
        (win, xmap, wmap, omap, iters.join(", "))
    }

    /// `MaxPool` / `AveragePool` over 1 or 3 spatial axes (the 2-D ones use
    /// the named linalg pooling ops), and `LpPool` over any: one
    /// `linalg.generic` over N×C×out×window. MaxPool keeps the maximum
    /// (`arith.maximumf`, as the named op; padding reads −inf); AveragePool
    /// sums in f32 for 16-bit floats and counts the window positions inside
    /// the input — or inside the explicitly padded extent with
    /// `count_include_pad` (ceil mode's extra positions never count) — then
    /// divides and rounds once; LpPool sums `|x|^p` (padding reads 0; `p`
    /// an integer ≥ 1, default 2) in the same accumulator type and takes the
    /// `p`-th root (`math.sqrt` for 2, `math.powf` otherwise).
    fn pool_nd(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.input(node, 0)?;
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        let r = x.rank();
        if outs.len() != 1 || oshape.len() != r || dt != x.dt || !is_float(dt) {
            return None;
        }
        let spatial: Vec<i64> = (2..r).map(|a| x.size(a)).collect::<Option<_>>()?;
        if spatial.iter().any(|&v| v > WINDOW_LIMIT) {
            return None;
        }
        let max = node.op == Op::MaxPool;
        let win_nd = Self::pool_windows(node, &x, &oshape)?;
        let pad_lit = if max { float_lit(f64::NEG_INFINITY, dt) } else { "0.0".into() };
        let xp = self.pad_spatial(&x, &win_nd.lo, &win_nd.high(), &pad_lit)?;
        let PoolWindows { k, s, d, lo, hi, .. } = win_nd;
        let (win, xmap, wmap, omap, iters) = self.window_maps(&k, &s, &d, dt);
        let attrs = self.tags(node);
        let e = elem(dt);
        let prefix = format!("b{}_{}_", self.base, self.tmp);
        let (elt, unused) = (format!("%{prefix}a0"), format!("%{prefix}a1"));
        // One accumulator: `step(body, element, accumulator)` folds the
        // window into `init`.
        let fold = |this: &mut Self, init: &Operand, step: &dyn Fn(&mut Body, &str, &str) -> String| {
            let acc = format!("%{prefix}a2");
            let mut b = Body::named(&prefix);
            let y = step(&mut b, &elt, &acc);
            let (ty, a) = (init.ty(), elem(init.dt));
            let name = this.line(format!(
                "linalg.generic {{indexing_maps = [{xmap}, {wmap}, {omap}], iterator_types = [{iters}]}} ins({}, {} : {}, {}) outs({} : {ty}) attrs = {{{attrs}}} {{\n    ^bb0({elt}: {e}, {unused}: {e}, {acc}: {a}):\n{}\n      linalg.yield {y} : {a}\n    }} -> {ty}",
                xp.name,
                win.name,
                xp.ty(),
                win.ty(),
                init.name,
                b.into_lines().join("\n"),
            ));
            Operand { name, ..init.clone() }
        };
        if max {
            let init = self.filled(&pad_lit, &oshape, dt, &[&x])?;
            let m = fold(self, &init, &|b, elt, acc| b.op(format!("arith.maximumf {elt}, {acc} : {e}")));
            return Some(vec![m.name]);
        }
        let at = acc_type(dt);
        let a = elem(at);
        if node.op == Op::LpPool {
            let pw = node.attr_int("p").unwrap_or(2);
            if !(1..=64).contains(&pw) {
                return None;
            }
            let init = self.filled("0.0", &oshape, at, &[&x])?;
            let sums = fold(self, &init, &|b, elt, acc| {
                let v = b.convert(elt, dt, at);
                let m = b.op(format!("math.absf {v} : {a}"));
                let term = match pw {
                    1 => m,
                    2 => b.bin("mulf", &m, &m, at),
                    _ => {
                        let pc = b.cst(&float_lit(pw as f64, at), at);
                        b.op(format!("math.powf {m}, {pc} : {a}"))
                    }
                };
                b.bin("addf", acc, &term, at)
            });
            let out = self.ewise(&[&sums], &oshape, dt, |b, v| {
                let r = match pw {
                    1 => v[0].clone(),
                    2 => b.op(format!("math.sqrt {} : {a}", v[0])),
                    _ => {
                        let inv = b.cst(&float_lit(1.0 / pw as f64, at), at);
                        b.op(format!("math.powf {}, {inv} : {a}", v[0]))
                    }
                };
                b.convert(&r, at, dt)
            })?;
            return Some(vec![out.name]);
        }
        let mut b = Body::named(&prefix);
        let sum0 = self.filled("0.0", &oshape, at, &[&x])?;
        let cnt0 = self.filled("0.0", &oshape, at, &[&x])?;
        let (sum, cnt) = (format!("%{prefix}a2"), format!("%{prefix}a3"));
        let include_pad = node.attr_int("count_include_pad").unwrap_or(0) == 1;
        let pos = window_positions(&mut b, &s, &d, &lo);
        // The counted extent: the input, or the input and its explicit pads.
        let (from, to): (Vec<i64>, Vec<i64>) = match include_pad {
            true => (lo.iter().map(|l| -l).collect(), spatial.iter().zip(&hi).map(|(n, h)| n + h).collect()),
            false => (vec![0; spatial.len()], spatial.clone()),
        };
        let counted = inside(&mut b, &pos, &from, &to);
        let v = b.convert(&elt, dt, at);
        let s2 = b.bin("addf", &sum, &v, at);
        let (one, zero) = (b.cst("1.0", at), b.cst("0.0", at));
        let inc = b.op(format!("arith.select {counted}, {one}, {zero} : {a}"));
        let c2 = b.bin("addf", &cnt, &inc, at);
        let ty = sum0.ty();
        let res = self.line_results(
            format!(
                "linalg.generic {{indexing_maps = [{xmap}, {wmap}, {omap}, {omap}], iterator_types = [{iters}]}} ins({}, {} : {}, {}) outs({}, {} : {ty}, {ty}) attrs = {{{attrs}}} {{\n    ^bb0({elt}: {e}, {unused}: {e}, {sum}: {a}, {cnt}: {a}):\n{}\n      linalg.yield {s2}, {c2} : {a}, {a}\n    }} -> ({ty}, {ty})",
                xp.name,
                win.name,
                xp.ty(),
                win.ty(),
                sum0.name,
                cnt0.name,
                b.into_lines().join("\n"),
            ),
            2,
        );
        let sums = Operand { name: format!("{res}#0"), shape: oshape.clone(), dt: at };
        let counts = Operand { name: format!("{res}#1"), shape: oshape.clone(), dt: at };
        let out = self.ewise(&[&sums, &counts], &oshape, dt, |b, v| {
            let q = b.bin("divf", &v[0], &v[1], at);
            b.convert(&q, at, dt)
        })?;
        Some(vec![out.name])
    }

    fn global_pool(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.input(node, 0)?;
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        if outs.len() != 1 || x.rank() < 3 || dt != x.dt || !is_float(dt) {
            return None;
        }
        let axes: Vec<usize> = (2..x.rank()).collect();
        let r =
            self.reduce_kind(&x, &axes, true, node.op == Op::GlobalMaxPool, !matches!(node.op, Op::GlobalMaxPool))?;
        (r.shape == oshape).then_some(vec![r.name])
    }

    /// Sum, mean (`mean`) or max (`max`) over `axes`; sums of 16-bit
    /// floats accumulate in f32 and round once.
    fn reduce_kind(&mut self, x: &Operand, axes: &[usize], keep: bool, max: bool, mean: bool) -> Option<Operand> {
        let dt = x.dt;
        if max {
            let lit = float_lit(f64::NEG_INFINITY, dt);
            return self.reduce(x, axes, keep, &lit, dt, |b, e, acc| b.bin("maximumf", e, acc, dt));
        }
        let acc = acc_type(dt);
        let s = self.reduce(x, axes, keep, "0.0", acc, |b, e, a| {
            let e = b.convert(e, dt, acc);
            b.bin("addf", &e, a, acc)
        })?;
        if !mean && acc == dt {
            return Some(s);
        }
        let n = if mean { Some(self.count(x, axes, acc)?) } else { None };
        let shape = s.shape.clone();
        self.ewise(&[&s], &shape, dt, |b, a| {
            let v = match &n {
                Some(n) => b.bin("divf", &a[0], n, acc),
                None => a[0].clone(),
            };
            b.convert(&v, acc, dt)
        })
    }

    fn reduce_node(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.input(node, 0)?;
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        if outs.len() != 1 || dt != x.dt || !is_float(dt) {
            return None;
        }
        let raw: Vec<i64> = match (node.attr_ints("axes"), node.input(1)) {
            (Some(a), _) => a.to_vec(),
            (None, Some(v)) => self.const_ints(v)?,
            (None, None) => Vec::new(),
        };
        let axes = match axes_of(&raw, x.rank())? {
            a if a.is_empty() && node.attr_int("noop_with_empty_axes").unwrap_or(0) == 1 => {
                return (x.shape == oshape).then_some(vec![x.name]);
            }
            a if a.is_empty() => (0..x.rank()).collect(),
            a => a,
        };
        let keep = node.attr_int("keepdims").unwrap_or(1) == 1;
        let r = match node.op {
            Op::ReduceMax | Op::ReduceMin => {
                let (lit, op) = match node.op {
                    Op::ReduceMax => (float_lit(f64::NEG_INFINITY, dt), "maximumf"),
                    _ => (float_lit(f64::INFINITY, dt), "minimumf"),
                };
                self.reduce(&x, &axes, keep, &lit, dt, |b, e, acc| b.bin(op, e, acc, dt))?
            }
            _ => self.reduce_kind(&x, &axes, keep, false, node.op == Op::ReduceMean)?,
        };
        (r.shape == oshape).then_some(vec![r.name])
    }

    /// `Gemm` → `linalg.matmul` into β·C (or zeros), α applied after; for
    /// 16-bit floats all of it in f32, rounded once.
    fn gemm(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let a = self.input(node, 0)?;
        let b = self.input(node, 1)?;
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        if outs.len() != 1 || a.rank() != 2 || b.rank() != 2 || oshape.len() != 2 || !is_float(dt) {
            return None;
        }
        if a.dt != dt || b.dt != dt {
            return None;
        }
        let ta = node.attr_int("transA").unwrap_or(0) == 1;
        let tb = node.attr_int("transB").unwrap_or(0) == 1;
        let alpha = f64::from(node.attr_float("alpha").unwrap_or(1.0));
        let beta = f64::from(node.attr_float("beta").unwrap_or(1.0));
        let c = match node.input(2) {
            Some(v) if beta != 0.0 => Some(self.operand(v)?),
            _ => None,
        };
        if c.as_ref().is_some_and(|c| c.dt != dt) {
            return None;
        }
        // The accumulator, in f32 for 16-bit floats: beta·C broadcast to the
        // output, or zeros.
        let at = acc_type(dt);
        let acc = match &c {
            Some(c) if beta == 1.0 && c.shape == oshape && at == dt => c.clone(),
            Some(c) => {
                let bl = float_lit(beta, at);
                self.ewise(&[c], &oshape, at, |b, x| {
                    let v = b.convert(&x[0], dt, at);
                    match beta == 1.0 {
                        true => v,
                        false => {
                            let k = b.cst(&bl, at);
                            b.bin("mulf", &v, &k, at)
                        }
                    }
                })?
            }
            None => self.filled("0.0", &oshape, at, &[&a, &b])?,
        };
        let init = if alpha == 1.0 { acc.clone() } else { self.filled("0.0", &oshape, at, &[&a, &b])? };
        let maps = if ta || tb {
            let am = if ta { "(d2, d0)" } else { "(d0, d2)" };
            let bm = if tb { "(d1, d2)" } else { "(d2, d1)" };
            format!(
                " indexing_maps = [affine_map<(d0, d1, d2) -> {am}>, affine_map<(d0, d1, d2) -> {bm}>, affine_map<(d0, d1, d2) -> (d0, d1)>]"
            )
        } else {
            String::new()
        };
        let ty = init.ty();
        let name = self.line(format!(
            "linalg.matmul{maps} {{{}}} ins({}, {} : {}, {}) outs({} : {ty}) -> {ty}",
            self.tags(node),
            a.name,
            b.name,
            a.ty(),
            b.ty(),
            init.name
        ));
        let ab = Operand { name, ..init };
        if alpha == 1.0 {
            return Some(vec![self.converted(&ab, dt)?.name]);
        }
        // alpha·AB + beta·C in the accumulator's type, rounded once.
        let al = float_lit(alpha, at);
        let r = self.ewise(&[&ab, &acc], &oshape, dt, |b, x| {
            let k = b.cst(&al, at);
            let m = b.bin("mulf", &x[0], &k, at);
            let s = b.bin("addf", &m, &x[1], at);
            b.convert(&s, at, dt)
        })?;
        Some(vec![r.name])
    }

    fn concat(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        let xs: Vec<Operand> = node.inputs().iter().map(|v| self.operand((*v)?)).collect::<Option<_>>()?;
        let axis = node.attr_int("axis")?;
        let axis = axes_of(&[axis], oshape.len())?[0];
        if outs.len() != 1 || xs.is_empty() || xs.iter().any(|x| x.dt != dt || x.rank() != oshape.len()) {
            return None;
        }
        let names: Vec<&str> = xs.iter().map(|x| x.name.as_str()).collect();
        let tys: Vec<String> = xs.iter().map(Operand::ty).collect();
        let name = self.line(format!(
            "tensor.concat dim({axis}) {} : ({}) -> {}",
            names.join(", "),
            tys.join(", "),
            ranked(&oshape, dt)
        ));
        Some(vec![name])
    }

    /// `(x − mean) / sqrt(var + eps) · scale + bias`, the parameters read
    /// along axis 1.
    /// `(x - mean) / sqrt(var + eps) * scale + bias` per channel, in `x`'s
    /// type when every operand has it; otherwise (opset-15 BatchNormalization
    /// with FP32 parameters over f16 data) computed in the widest type and
    /// rounded once to `x`'s.
    fn normalize(&mut self, x: &Operand, p: [&Operand; 4], eps: f64) -> Option<Operand> {
        let dt = x.dt;
        let ct = compute_type(std::iter::once(dt).chain(p.iter().map(|o| o.dt)));
        let pdt: Vec<DType> = p.iter().map(|o| o.dt).collect();
        let id: Vec<String> = (0..x.rank()).map(|i| format!("d{i}")).collect();
        let ch = vec!["d1".to_string()];
        let init = self.empty(&x.shape, dt, &[x])?;
        let iters = vec!["parallel"; x.rank()];
        let el = float_lit(eps, ct);
        let ins: Vec<(&Operand, Vec<String>)> =
            std::iter::once((x, id.clone())).chain(p.iter().map(|&o| (o, ch.clone()))).collect();
        Some(self.generic_op(&ins, &init, &id, &iters, |b: &mut Body, a: &[String]| {
            let v = widen(b, &a[0], dt, ct);
            let [scale, bias, mean, var] = [1, 2, 3, 4].map(|i| widen(b, &a[i], pdt[i - 1], ct));
            let e = b.cst(&el, ct);
            let t = b.bin("subf", &v, &mean, ct);
            let ve = b.bin("addf", &var, &e, ct);
            let sd = b.op(format!("math.sqrt {ve} : {}", elem(ct)));
            let n = b.bin("divf", &t, &sd, ct);
            let m = b.bin("mulf", &n, &scale, ct);
            let r = b.bin("addf", &m, &bias, ct);
            widen(b, &r, ct, dt)
        }))
    }

    fn batch_norm(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.input(node, 0)?;
        let p: Vec<Operand> = (1..5).map(|i| self.input(node, i)).collect::<Option<_>>()?;
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        let c = x.shape.get(1)?.clone();
        if x.rank() < 2 || oshape != x.shape || dt != x.dt || !is_float(dt) {
            return None;
        }
        // Scale and bias share a type (T1), mean and var another (T2); both
        // may differ from the data's (T) from opset 15 on.
        let (t1, t2) = (p[0].dt, p[2].dt);
        if p[1].dt != t1 || p[3].dt != t2 || !is_float(t1) || !is_float(t2) {
            return None;
        }
        if p.iter().any(|o| o.shape != [c.clone()]) {
            return None;
        }
        let eps = f64::from(node.attr_float("epsilon").unwrap_or(1e-5));
        let training = node.attr_int("training_mode").unwrap_or(0) == 1;
        if !training {
            if outs.len() != 1 {
                return None;
            }
            return Some(vec![self.normalize(&x, [&p[0], &p[1], &p[2], &p[3]], eps)?.name]);
        }
        if outs.len() != 1 && outs.len() != 3 {
            return None;
        }
        // Batch statistics over every axis but the channels.
        let axes: Vec<usize> = (0..x.rank()).filter(|&i| i != 1).collect();
        let mean = self.reduce_kind(&x, &axes, false, false, true)?;
        let id: Vec<String> = (0..x.rank()).map(|i| format!("d{i}")).collect();
        let acc = acc_type(dt);
        let sq0 = self.filled("0.0", &mean.shape, acc, &[&x])?;
        let iters: Vec<&str> = (0..x.rank()).map(|i| if i == 1 { "parallel" } else { "reduction" }).collect();
        let ch = vec!["d1".to_string()];
        let sq = self.generic_op(&[(&x, id), (&mean, ch.clone())], &sq0, &ch, &iters, |b, a| {
            let t = b.bin("subf", &a[0], &a[1], dt);
            let t = b.convert(&t, dt, acc);
            let t2 = b.bin("mulf", &t, &t, acc);
            b.bin("addf", &t2, &a[2], acc)
        });
        let n = self.count(&x, &axes, acc)?;
        let cs = mean.shape.clone();
        let var = self.ewise(&[&sq], &cs, dt, |b, a| {
            let v = b.bin("divf", &a[0], &n, acc);
            b.convert(&v, acc, dt)
        })?;
        let y = self.normalize(&x, [&p[0], &p[1], &mean, &var], eps)?;
        if outs.len() == 1 {
            return Some(vec![y.name]);
        }
        // Running statistics have the mean/var type (T2): the batch
        // statistic (in T) is converted before the update.
        if outs[1..].iter().any(|&o| self.out_type(o).map(|(_, d)| d) != Some(t2)) {
            return None;
        }
        let mom = f64::from(node.attr_float("momentum").unwrap_or(0.9));
        let (ml, rl) = (float_lit(mom, t2), float_lit(1.0 - mom, t2));
        let running = |this: &mut Self, old: &Operand, cur: &Operand| {
            let (ml, rl) = (ml.clone(), rl.clone());
            this.ewise(&[old, cur], &cs, t2, move |b, a| {
                let m = b.cst(&ml, t2);
                let r = b.cst(&rl, t2);
                let cur = widen(b, &a[1], dt, t2);
                let u = b.bin("mulf", &a[0], &m, t2);
                let v = b.bin("mulf", &cur, &r, t2);
                b.bin("addf", &u, &v, t2)
            })
        };
        let rm = running(self, &p[2], &mean)?;
        let rv = running(self, &p[3], &var)?;
        Some(vec![y.name, rm.name, rv.name])
    }
}

/// The type a computation over operands of `dts` runs in: their common type,
/// else the widest (f32 when two different 16-bit types meet).
fn compute_type(dts: impl Iterator<Item = DType>) -> DType {
    let dts: Vec<DType> = dts.collect();
    let first = dts[0];
    if dts.iter().all(|&d| d == first) {
        return first;
    }
    let widest = dts.iter().copied().max_by_key(|&d| super::float_width(d)).unwrap_or(first);
    if super::float_width(widest) <= 16 {
        DType::F32
    } else {
        widest
    }
}

/// `v` of `from` as `to` (through f32 between the two 16-bit types).
fn widen(b: &mut Body, v: &str, from: DType, to: DType) -> String {
    if from != to && super::float_width(from) == 16 && super::float_width(to) == 16 {
        let w = b.convert(v, from, DType::F32);
        return b.convert(&w, DType::F32, to);
    }
    b.convert(v, from, to)
}
