//! Padding: the borders of the window ops and ONNX `Pad`.
//!
//! `Pad` in `constant` mode is one `tensor.pad` when its amounts are
//! constants and non-negative. Amounts computed at run time (exporters'
//! shape arithmetic: Swin pads its windows by `(−n) mod 7`) are read with
//! `tensor.extract`; the input is padded by their positive parts and the
//! negative parts — ONNX crops there — are cut off by a
//! `tensor.extract_slice` sized by the inferred output, so any sign is
//! right. `edge`, `reflect` and `wrap` are a `linalg.generic` over the output
//! reading the input (`tensor.extract`) at an index clamped, mirrored or
//! wrapped into range, which covers negative amounts as well.

use qsync_ir::{DType, Dim, Node, Op, ValueId};

use super::build::{float_lit, ranked, Body, Operand};
use super::{axis_index, elem, is_float, Emitter};

/// An amount of padding: a constant or an `index` value.
#[derive(Clone, Debug)]
enum Amount {
    Const(i64),
    Index(String),
}

impl Amount {
    fn as_const(&self) -> Option<i64> {
        match self {
            Amount::Const(c) => Some(*c),
            Amount::Index(_) => None,
        }
    }
    fn is_zero(&self) -> bool {
        self.as_const() == Some(0)
    }
    /// The operand text of `tensor.pad`/`tensor.extract_slice` lists.
    fn text(&self) -> String {
        match self {
            Amount::Const(c) => c.to_string(),
            Amount::Index(v) => v.clone(),
        }
    }
}

/// `Pad`'s `axes` normalised against `rank` in their given order (the pads
/// follow it); `None` when one is out of range or repeated.
fn axes_in_order(raw: &[i64], rank: usize) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for &a in raw {
        let a = axis_index(a, rank)?;
        if out.contains(&a) {
            return None;
        }
        out.push(a);
    }
    Some(out)
}

impl Emitter<'_> {
    /// `tensor.pad` of the trailing (spatial) axes of an NC… tensor.
    pub(super) fn pad_spatial(&mut self, x: &Operand, low: &[i64], high: &[i64], lit: &str) -> Option<Operand> {
        let (r, n) = (x.rank(), low.len());
        if high.len() != n || n > r {
            return None;
        }
        let (mut lo, mut hi) = (vec![0; r], vec![0; r]);
        lo[r - n..].copy_from_slice(low);
        hi[r - n..].copy_from_slice(high);
        self.pad_axes(x, &lo, &hi, lit)
    }

    /// `tensor.pad` of every axis by constant, non-negative amounts, filling
    /// with the literal `lit`.
    pub(super) fn pad_axes(&mut self, x: &Operand, low: &[i64], high: &[i64], lit: &str) -> Option<Operand> {
        let r = x.rank();
        if low.len() != r || high.len() != r || low.iter().chain(high).any(|&p| p < 0) {
            return None;
        }
        let fill = self.scalar(lit, elem(x.dt));
        let amounts = |v: &[i64]| v.iter().map(|&p| Amount::Const(p)).collect::<Vec<_>>();
        Some(self.tensor_pad(x, &amounts(low), &amounts(high), &fill))
    }

    /// `tensor.pad` of `x` by non-negative amounts, yielding the scalar
    /// `fill`; `x` itself when every amount is zero. Axes padded by a
    /// run-time amount are dynamic in the result.
    fn tensor_pad(&mut self, x: &Operand, low: &[Amount], high: &[Amount], fill: &str) -> Operand {
        if low.iter().chain(high).all(Amount::is_zero) {
            return x.clone();
        }
        let shape: Vec<Dim> = (0..x.rank())
            .map(|i| match (low[i].as_const(), high[i].as_const()) {
                (Some(a), Some(b)) => x.shape[i].add(&Dim::from(a + b)),
                _ => Dim::sym("?"),
            })
            .collect();
        let prefix = format!("p{}_{}_", self.base, self.tmp);
        let args: Vec<String> = (0..x.rank()).map(|i| format!("%{prefix}{i}: index")).collect();
        let list = |v: &[Amount]| v.iter().map(Amount::text).collect::<Vec<_>>().join(", ");
        let ty = ranked(&shape, x.dt);
        let name = self.line(format!(
            "tensor.pad {} low[{}] high[{}] {{\n    ^bb0({}):\n      tensor.yield {fill} : {}\n    }} : {} to {ty}",
            x.name,
            list(low),
            list(high),
            args.join(", "),
            elem(x.dt),
            x.ty()
        ));
        Operand { name, shape, dt: x.dt }
    }

    /// ONNX `Pad` on numeric data: pads from the attribute (before opset
    /// 11), a constant or a computed tensor; axes constant or absent; in
    /// `constant` mode the fill value from the attribute, a constant or a
    /// computed scalar.
    pub(super) fn onnx_pad(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        let r = x.rank();
        if outs.len() != 1 || dt != x.dt || oshape.len() != r || matches!(dt, DType::Bool | DType::Str) {
            return None;
        }
        let axes: Vec<usize> = match node.input(3) {
            Some(v) => axes_in_order(&self.const_ints(v)?, r)?,
            None => (0..r).collect(),
        };
        let amounts = self.pad_amounts(node, 2 * axes.len())?;
        let (mut low, mut high) = (vec![Amount::Const(0); r], vec![Amount::Const(0); r]);
        for (k, &a) in axes.iter().enumerate() {
            low[a] = amounts[k].clone();
            high[a] = amounts[k + axes.len()].clone();
        }
        // Where the amounts are known the inferred shape must agree, and no
        // axis may be cropped below nothing.
        for i in 0..r {
            if let (Some(a), Some(b)) = (low[i].as_const(), high[i].as_const()) {
                let size = x.shape[i].add(&Dim::from(a.checked_add(b)?));
                if size != oshape[i] || size.as_const().is_some_and(|c| c < 0) {
                    return None;
                }
            }
        }
        let mode = node.attr_str("mode").unwrap_or("constant");
        if matches!(mode, "edge" | "reflect" | "wrap") {
            return self.pad_by_reading(&x, [&low, &high], &oshape, mode);
        }
        if mode != "constant" {
            return None;
        }
        let fill = self.pad_fill(node, dt)?;
        if low.iter().chain(&high).all(|a| a.as_const().is_some_and(|c| c >= 0)) {
            return Some(vec![self.tensor_pad(&x, &low, &high, &fill).name]);
        }
        // Pad by the positive parts, then cut the negative ones off.
        let (mut pos_low, mut pos_high, mut crop) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..r {
            let (p, c) = self.split_amount(&low[i]);
            pos_low.push(p);
            crop.push(c.text());
            pos_high.push(self.split_amount(&high[i]).0);
        }
        let padded = self.tensor_pad(&x, &pos_low, &pos_high, &fill);
        let mut sizes = Vec::new();
        for i in 0..r {
            sizes.push(self.padded_size(&x, i, &low[i], &high[i], &oshape[i])?);
        }
        let name = self.line(format!(
            "tensor.extract_slice {}[{}] [{}] [{}] : {} to {}",
            padded.name,
            crop.join(", "),
            sizes.join(", "),
            vec!["1"; r].join(", "),
            padded.ty(),
            ranked(&oshape, dt)
        ));
        Some(vec![name])
    }

    /// The `2·axes` pad amounts: constants, or `index` values read from the
    /// pads tensor.
    fn pad_amounts(&mut self, node: &Node, n: usize) -> Option<Vec<Amount>> {
        let known = match (node.attr_ints("pads"), node.input(1)) {
            (Some(p), _) => Some(p.to_vec()),
            (None, Some(v)) => self.const_ints(v),
            (None, None) => return None,
        };
        if let Some(p) = known {
            return (p.len() == n).then(|| p.into_iter().map(Amount::Const).collect());
        }
        let p = self.operand(node.input(1)?)?;
        if p.rank() != 1 || p.size(0)? != n as i64 || !matches!(p.dt, DType::I64 | DType::I32) {
            return None;
        }
        let mut out = Vec::new();
        for j in 0..n {
            let cj = self.scalar(&j.to_string(), "index");
            let v = self.line(format!("tensor.extract {}[{cj}] : {}", p.name, p.ty()));
            out.push(Amount::Index(self.line(format!("arith.index_cast {v} : {} to index", elem(p.dt)))));
        }
        Some(out)
    }

    /// `(max(a, 0), max(−a, 0))`: what to pad and what to crop.
    fn split_amount(&mut self, a: &Amount) -> (Amount, Amount) {
        match a {
            Amount::Const(c) => (Amount::Const((*c).max(0)), Amount::Const((-*c).max(0))),
            Amount::Index(v) => {
                let zero = self.scalar("0", "index");
                let pos = self.line(format!("arith.maxsi {v}, {zero} : index"));
                let crop = self.line(format!("arith.subi {pos}, {v} : index"));
                (Amount::Index(pos), Amount::Index(crop))
            }
        }
    }

    /// The size of padded axis `i`: the inferred one when static, else
    /// `dim(x, i) + low + high`.
    fn padded_size(&mut self, x: &Operand, i: usize, low: &Amount, high: &Amount, want: &Dim) -> Option<String> {
        if let Some(c) = want.as_const().filter(|&c| c >= 0) {
            return Some(c.to_string());
        }
        let mut size = self.dim(&x.shape[i].clone(), &[x])?;
        for a in [low, high] {
            let v = match a {
                Amount::Const(0) => continue,
                Amount::Const(c) => self.scalar(&c.to_string(), "index"),
                Amount::Index(v) => v.clone(),
            };
            size = self.line(format!("arith.addi {size}, {v} : index"));
        }
        Some(size)
    }

    /// The fill value of a constant-mode `Pad` as a scalar of `dt`.
    fn pad_fill(&mut self, node: &Node, dt: DType) -> Option<String> {
        let known = match node.input(2) {
            // Before opset 11 the value is an attribute (a float).
            None => {
                let v = node.attr_float("value").map_or(0.0, f64::from);
                Some(if is_float(dt) { float_lit(v, dt) } else { (v as i64).to_string() })
            }
            Some(v) if is_float(dt) => self.const_f64(v).map(|f| float_lit(f, dt)),
            Some(v) => self.const_ints(v).filter(|c| c.len() == 1).map(|c| c[0].to_string()),
        };
        if let Some(lit) = known {
            return Some(self.scalar(&lit, elem(dt)));
        }
        let v = self.operand(node.input(2)?)?;
        if v.dt != dt || v.shape.iter().any(|d| d.as_const() != Some(1)) {
            return None;
        }
        let zero = self.scalar("0", "index");
        let at = vec![zero; v.rank()].join(", ");
        Some(self.line(format!("tensor.extract {}[{at}] : {}", v.name, v.ty())))
    }

    /// A constant scalar float input (an initializer or a `Constant`).
    pub(super) fn const_f64(&self, v: ValueId) -> Option<f64> {
        let t = match self.g.value(v).init() {
            Some(t) => t.clone(),
            None => {
                let (n, _) = self.g.producer(v)?;
                let node = self.g.node(n);
                (node.op == Op::Constant).then_some(())?;
                node.attr("value")?.as_tensor()?.clone()
            }
        };
        match t.as_f64s()?.as_slice() {
            [x] => Some(*x),
            _ => None,
        }
    }

    /// `edge`/`reflect`/`wrap` padding: a `linalg.generic` over the output
    /// reading `x` at `j = i − low` brought into `[0, n)` — clamped
    /// (`edge`), mirrored about the borders without repeating them with
    /// period `2(n − 1)` (`reflect`, as numpy's), or modulo `n` (`wrap`).
    fn pad_by_reading(&mut self, x: &Operand, pads: [&[Amount]; 2], oshape: &[Dim], mode: &str) -> Option<Vec<String>> {
        let [low, high] = pads;
        let r = x.rank();
        // Per padded axis: the low amount, the input size, and the clamp
        // bound (`edge`) or period (`reflect`).
        let mut moved: Vec<Option<[String; 3]>> = Vec::new();
        let mut sizes = Vec::new();
        for i in 0..r {
            if oshape[i].as_const().is_none_or(|c| c < 0) {
                sizes.push(self.padded_size(x, i, &low[i], &high[i], &oshape[i])?);
            }
            if low[i].is_zero() && high[i].is_zero() {
                moved.push(None);
                continue;
            }
            if x.shape[i].as_const() == Some(0) {
                return None;
            }
            let lo = match &low[i] {
                Amount::Const(c) => self.scalar(&c.to_string(), "index"),
                Amount::Index(v) => v.clone(),
            };
            let n = self.dim(&x.shape[i].clone(), &[x])?;
            let k = match (mode, x.shape[i].as_const()) {
                ("edge", Some(c)) => self.scalar(&(c - 1).to_string(), "index"),
                ("reflect", Some(c)) => self.scalar(&(2 * (c - 1)).max(1).to_string(), "index"),
                ("edge", None) => {
                    let one = self.scalar("1", "index");
                    self.line(format!("arith.subi {n}, {one} : index"))
                }
                ("reflect", None) => {
                    let one = self.scalar("1", "index");
                    let m = self.line(format!("arith.subi {n}, {one} : index"));
                    let p = self.line(format!("arith.addi {m}, {m} : index"));
                    self.line(format!("arith.maxsi {p}, {one} : index"))
                }
                _ => n.clone(),
            };
            moved.push(Some([lo, n, k]));
        }
        let ty = ranked(oshape, x.dt);
        let name = self.line(format!("tensor.empty({}) : {ty}", sizes.join(", ")));
        let init = Operand { name, shape: oshape.to_vec(), dt: x.dt };
        let id: Vec<String> = (0..r).map(|i| format!("d{i}")).collect();
        let (xname, xty, mode) = (x.name.clone(), x.ty(), mode.to_string());
        let out = self.generic_op(&[], &init, &id, &vec!["parallel"; r], |b, _| {
            let mut coords = Vec::new();
            for (a, m) in moved.iter().enumerate() {
                let i = b.op(format!("linalg.index {a} : index"));
                let Some([lo, n, k]) = m else {
                    coords.push(i);
                    continue;
                };
                let j = b.op(format!("arith.subi {i}, {lo} : index"));
                // `j mod q` in [0, q).
                let modulo = |b: &mut Body, q: &str| {
                    let m = b.op(format!("arith.remsi {j}, {q} : index"));
                    let s = b.op(format!("arith.addi {m}, {q} : index"));
                    b.op(format!("arith.remsi {s}, {q} : index"))
                };
                coords.push(match mode.as_str() {
                    "edge" => {
                        let zero = b.op("arith.constant 0 : index");
                        let c = b.op(format!("arith.maxsi {j}, {zero} : index"));
                        b.op(format!("arith.minsi {c}, {k} : index"))
                    }
                    "reflect" => {
                        let m = modulo(b, k);
                        let back = b.op(format!("arith.subi {k}, {m} : index"));
                        let inside = b.op(format!("arith.cmpi slt, {m}, {n} : index"));
                        b.op(format!("arith.select {inside}, {m}, {back} : index"))
                    }
                    _ => modulo(b, n),
                });
            }
            b.op(format!("tensor.extract {xname}[{}] : {xty}", coords.join(", ")))
        });
        Some(vec![out.name])
    }
}
