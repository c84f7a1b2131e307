//! Structured lowerings of the ops transformers use: broadcasting
//! elementwise ops (`Mod` among them), `MatMul`, `Softmax`,
//! `LayerNormalization`, `Gather` and `CumSum` (position ids).

use qsync_ir::{DType, Dim, Node, Op, ValueId};

use super::build::{acc_type, float_lit, scf_for, Body, Carried, Operand};
use super::{axis_index, elem, is_float, Emitter};

/// The scalar body of an elementwise op on arguments of type `dt`, or `None`
/// when the op has none for that type.
fn scalar_body(op: &Op, b: &mut Body, a: &[String], dt: DType) -> Option<String> {
    let e = elem(dt);
    let f = is_float(dt);
    let int = !f && dt != DType::Bool;
    let unsigned = matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64);
    let bin = |b: &mut Body, name: &str| b.op(format!("{name} {}, {} : {e}", a[0], a[1]));
    let un = |b: &mut Body, name: &str| b.op(format!("{name} {} : {e}", a[0]));
    Some(match (op, a.len()) {
        (Op::Add, 2) if f => bin(b, "arith.addf"),
        (Op::Sub, 2) if f => bin(b, "arith.subf"),
        (Op::Mul, 2) if f => bin(b, "arith.mulf"),
        (Op::Div, 2) if f => bin(b, "arith.divf"),
        (Op::Pow, 2) if f => bin(b, "math.powf"),
        (Op::Max, 2) if f => bin(b, "arith.maximumf"),
        (Op::Min, 2) if f => bin(b, "arith.minimumf"),
        (Op::Max, 2) if int => bin(b, if unsigned { "arith.maxui" } else { "arith.maxsi" }),
        (Op::Min, 2) if int => bin(b, if unsigned { "arith.minui" } else { "arith.minsi" }),
        (Op::Add, 2) if int => bin(b, "arith.addi"),
        (Op::Sub, 2) if int => bin(b, "arith.subi"),
        (Op::Mul, 2) if int => bin(b, "arith.muli"),
        (Op::Div, 2) if int => bin(b, if unsigned { "arith.divui" } else { "arith.divsi" }),
        (Op::And, 2) if dt == DType::Bool => bin(b, "arith.andi"),
        (Op::Or, 2) if dt == DType::Bool => bin(b, "arith.ori"),
        (Op::Xor, 2) if dt == DType::Bool => bin(b, "arith.xori"),
        (Op::Equal | Op::Less | Op::LessOrEqual | Op::Greater | Op::GreaterOrEqual, 2) => {
            let (fp, si, ui) = match op {
                Op::Equal => ("oeq", "eq", "eq"),
                Op::Less => ("olt", "slt", "ult"),
                Op::LessOrEqual => ("ole", "sle", "ule"),
                Op::Greater => ("ogt", "sgt", "ugt"),
                _ => ("oge", "sge", "uge"),
            };
            match f {
                true => b.op(format!("arith.cmpf {fp}, {}, {} : {e}", a[0], a[1])),
                false => b.op(format!("arith.cmpi {}, {}, {} : {e}", if unsigned { ui } else { si }, a[0], a[1])),
            }
        }
        (Op::Sqrt, 1) if f => un(b, "math.sqrt"),
        (Op::Erf, 1) if f => un(b, "math.erf"),
        (Op::Exp, 1) if f => un(b, "math.exp"),
        (Op::Log, 1) if f => un(b, "math.log"),
        (Op::Tanh, 1) if f => un(b, "math.tanh"),
        (Op::Abs, 1) if f => un(b, "math.absf"),
        (Op::Abs, 1) if int && !unsigned => un(b, "math.absi"),
        (Op::Floor, 1) if f => un(b, "math.floor"),
        (Op::Ceil, 1) if f => un(b, "math.ceil"),
        (Op::Sin, 1) if f => un(b, "math.sin"),
        (Op::Cos, 1) if f => un(b, "math.cos"),
        (Op::Neg, 1) if f => un(b, "arith.negf"),
        (Op::Reciprocal, 1) if f => {
            let one = b.cst("1.0", dt);
            b.bin("divf", &one, &a[0], dt)
        }
        (Op::Sigmoid, 1) if f => {
            let one = b.cst("1.0", dt);
            let n = un(b, "arith.negf");
            let x = b.op(format!("math.exp {n} : {e}"));
            let d = b.bin("addf", &one, &x, dt);
            b.bin("divf", &one, &d, dt)
        }
        (Op::Relu, 1) if f => {
            let zero = b.cst("0.0", dt);
            b.bin("maximumf", &a[0], &zero, dt)
        }
        (Op::IsNaN, 1) if f => b.op(format!("arith.cmpf uno, {}, {} : {e}", a[0], a[0])),
        (Op::Not, 1) if dt == DType::Bool => {
            let t = b.op("arith.constant true");
            b.op(format!("arith.xori {}, {t} : i1", a[0]))
        }
        _ => return None,
    })
}

/// ONNX `Mod` of scalars of type `dt`: with `fmod` the remainder takes the
/// dividend's sign (C `fmod`, `arith.remf`/`remsi`), otherwise the divisor's
/// (Python `%`: a nonzero `remsi` whose sign differs from the divisor's gets
/// the divisor added). Unsigned remainders agree in both modes. `None` for
/// floats without `fmod`, which ONNX does not define.
fn mod_body(b: &mut Body, x: &str, y: &str, dt: DType, fmod: bool) -> Option<String> {
    let e = elem(dt);
    let unsigned = matches!(dt, DType::U8 | DType::U16 | DType::U32 | DType::U64);
    Some(match (is_float(dt), unsigned, fmod) {
        (true, _, true) => b.op(format!("arith.remf {x}, {y} : {e}")),
        (true, _, false) => return None,
        (false, true, _) => b.op(format!("arith.remui {x}, {y} : {e}")),
        (false, false, true) => b.op(format!("arith.remsi {x}, {y} : {e}")),
        (false, false, false) => {
            let r = b.op(format!("arith.remsi {x}, {y} : {e}"));
            let zero = b.cst("0", dt);
            let nonzero = b.op(format!("arith.cmpi ne, {r}, {zero} : {e}"));
            let r_neg = b.op(format!("arith.cmpi slt, {r}, {zero} : {e}"));
            let y_neg = b.op(format!("arith.cmpi slt, {y}, {zero} : {e}"));
            let differ = b.op(format!("arith.xori {r_neg}, {y_neg} : i1"));
            let fix = b.op(format!("arith.andi {nonzero}, {differ} : i1"));
            let shifted = b.bin("addi", &r, y, dt);
            b.op(format!("arith.select {fix}, {shifted}, {r} : {e}"))
        }
    })
}

impl Emitter<'_> {
    /// Elementwise ops under numpy broadcasting → one `linalg.generic`.
    pub(super) fn elementwise(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let (shape, odt) = self.out_type(*outs.first()?)?;
        let xs: Vec<Operand> = node.inputs().iter().map(|v| self.operand((*v)?)).collect::<Option<_>>()?;
        if outs.len() != 1 || xs.is_empty() {
            return None;
        }
        match node.op {
            Op::Identity if xs[0].shape == shape && xs[0].dt == odt => return Some(vec![xs[0].name.clone()]),
            // HardSigmoid = max(0, min(1, αx + β)); HardSwish = x · HardSigmoid(α = 1/6, β = ½).
            Op::HardSigmoid | Op::HardSwish if xs.len() == 1 && xs[0].dt == odt && is_float(odt) => {
                let swish = node.op == Op::HardSwish;
                let (alpha, beta) = match swish {
                    true => (1.0 / 6.0, 0.5),
                    false => (
                        f64::from(node.attr_float("alpha").unwrap_or(0.2)),
                        f64::from(node.attr_float("beta").unwrap_or(0.5)),
                    ),
                };
                let (al, bl, dt) = (float_lit(alpha, odt), float_lit(beta, odt), odt);
                let r = self.ewise(&[&xs[0]], &shape, dt, |b, a| {
                    let (ca, cb) = (b.cst(&al, dt), b.cst(&bl, dt));
                    let (zero, one) = (b.cst("0.0", dt), b.cst("1.0", dt));
                    let t = b.bin("mulf", &a[0], &ca, dt);
                    let u = b.bin("addf", &t, &cb, dt);
                    let v = b.bin("minimumf", &u, &one, dt);
                    let h = b.bin("maximumf", &v, &zero, dt);
                    if swish {
                        b.bin("mulf", &a[0], &h, dt)
                    } else {
                        h
                    }
                })?;
                return Some(vec![r.name]);
            }
            Op::Gelu if xs.len() == 1 && xs[0].dt == odt && is_float(odt) => {
                let tanh = match node.attr_str("approximate").unwrap_or("none") {
                    "none" => false,
                    "tanh" => true,
                    _ => return None,
                };
                let (dt, e) = (odt, elem(odt));
                let r = self.ewise(&[&xs[0]], &shape, dt, |b, a| {
                    let x = &a[0];
                    let half = b.cst("0.5", dt);
                    let one = b.cst("1.0", dt);
                    let inner = if tanh {
                        // tanh(√(2/π)·(x + 0.044715·x³))
                        let c = b.cst("0.7978845608028654", dt);
                        let k = b.cst("0.044715", dt);
                        let x2 = b.bin("mulf", x, x, dt);
                        let x3 = b.bin("mulf", &x2, x, dt);
                        let t = b.bin("mulf", &x3, &k, dt);
                        let u = b.bin("addf", x, &t, dt);
                        let v = b.bin("mulf", &u, &c, dt);
                        b.op(format!("math.tanh {v} : {e}"))
                    } else {
                        // erf(x/√2)
                        let r = b.cst("0.7071067811865476", dt);
                        let v = b.bin("mulf", x, &r, dt);
                        b.op(format!("math.erf {v} : {e}"))
                    };
                    let p = b.bin("addf", &one, &inner, dt);
                    let h = b.bin("mulf", x, &half, dt);
                    b.bin("mulf", &h, &p, dt)
                })?;
                return Some(vec![r.name]);
            }
            Op::Mod if xs.len() == 2 && xs.iter().all(|x| x.dt == odt) && !matches!(odt, DType::Bool | DType::Str) => {
                let fmod = match node.attr_int("fmod").unwrap_or(0) {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                mod_body(&mut Body::probe(), "%x", "%y", odt, fmod)?;
                let r = self.ewise(&[&xs[0], &xs[1]], &shape, odt, |b, a| {
                    mod_body(b, &a[0], &a[1], odt, fmod).unwrap_or_default()
                })?;
                return Some(vec![r.name]);
            }
            Op::Where => {
                if xs.len() != 3 {
                    return None;
                }
                let (c, x, y) = (&xs[0], &xs[1], &xs[2]);
                if c.dt != DType::Bool || x.dt != odt || y.dt != odt {
                    return None;
                }
                let e = elem(odt);
                let r = self.ewise(&[c, x, y], &shape, odt, |b, a| {
                    b.op(format!("arith.select {}, {}, {} : {e}", a[0], a[1], a[2]))
                })?;
                return Some(vec![r.name]);
            }
            _ => {}
        }
        let dt = xs[0].dt;
        if xs.iter().any(|x| x.dt != dt) {
            return None;
        }
        // Check the op has a body for this type before emitting anything.
        let mut probe = Body::probe();
        let args: Vec<String> = (0..xs.len()).map(|i| format!("%x{i}")).collect();
        scalar_body(&node.op, &mut probe, &args, dt)?;
        let is_cmp =
            matches!(node.op, Op::Equal | Op::Less | Op::LessOrEqual | Op::Greater | Op::GreaterOrEqual | Op::IsNaN);
        if odt != if is_cmp { DType::Bool } else { dt } {
            return None;
        }
        let refs: Vec<&Operand> = xs.iter().collect();
        let op = node.op.clone();
        let r =
            self.ewise(&refs, &shape, odt, |b, a| scalar_body(&op, b, &a[..a.len() - 1], dt).unwrap_or_default())?;
        Some(vec![r.name])
    }

    /// `MatMul` (operands of rank ≥ 2, one element type): `linalg.matmul`
    /// (leading axes of the left operand folded into its rows when the right
    /// one is 2-D), `linalg.batch_matmul` for equal batch axes (folded into
    /// one), else a contracting `linalg.generic` with broadcast batch axes;
    /// 16-bit floats accumulate in f32 and round once.
    pub(super) fn matmul(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let a = self.operand(node.input(0)?)?;
        let b = self.operand(node.input(1)?)?;
        let (oshape, dt) = self.out_type(*outs.first()?)?;
        let (ra, rb, r) = (a.rank(), b.rank(), oshape.len());
        if outs.len() != 1 || ra < 2 || rb < 2 || a.dt != dt || b.dt != dt || !is_float(dt) || r != ra.max(rb) {
            return None;
        }
        let prod = |s: &[Dim]| s.iter().fold(Dim::from(1), |p, d| p.mul(d));
        let tags = self.tags(node);
        // Sums accumulate in f32 for 16-bit floats (the named ops extend
        // their inputs to the accumulator's type) and round once at the end.
        let at = acc_type(dt);
        let named = |this: &mut Self, op: &str, x: &Operand, y: &Operand, shape: Vec<Dim>| -> Option<Operand> {
            let init = this.filled("0.0", &shape, at, &[x, y])?;
            let ty = init.ty();
            let name = this.line(format!(
                "{op} {{{tags}}} ins({}, {} : {}, {}) outs({} : {ty}) -> {ty}",
                x.name,
                y.name,
                x.ty(),
                y.ty(),
                init.name
            ));
            Some(Operand { name, ..init })
        };
        let (m, k, n) = (&a.shape[ra - 2], &a.shape[ra - 1], &b.shape[rb - 1]);
        let res = if rb == 2 {
            let rows = prod(&a.shape[..ra - 1]);
            let a2 = self.reshape(&a, &[rows.clone(), k.clone()])?;
            let y = named(self, "linalg.matmul", &a2, &b, vec![rows, n.clone()])?;
            self.reshape(&y, &oshape)?
        } else if ra == rb && a.shape[..ra - 2] == b.shape[..rb - 2] {
            let bt = prod(&a.shape[..ra - 2]);
            let a3 = self.reshape(&a, &[bt.clone(), m.clone(), k.clone()])?;
            let b3 = self.reshape(&b, &[bt.clone(), k.clone(), n.clone()])?;
            let y = named(self, "linalg.batch_matmul", &a3, &b3, vec![bt, m.clone(), n.clone()])?;
            self.reshape(&y, &oshape)?
        } else {
            let batch = &oshape[..r - 2];
            let side = |x: &Operand, last: [String; 2]| -> Option<Vec<String>> {
                let bx = Operand { name: String::new(), shape: x.shape[..x.rank() - 2].to_vec(), dt };
                let mut v = Self::bcast_map(&bx, batch)?;
                v.extend(last);
                Some(v)
            };
            let (dm, dn, dk) = (format!("d{}", r - 2), format!("d{}", r - 1), format!("d{r}"));
            let am = side(&a, [dm.clone(), dk.clone()])?;
            let bm = side(&b, [dk, dn])?;
            let init = self.filled("0.0", &oshape, at, &[&a, &b])?;
            let id: Vec<String> = (0..r).map(|i| format!("d{i}")).collect();
            let mut iters = vec!["parallel"; r];
            iters.push("reduction");
            self.generic_op(&[(&a, am), (&b, bm)], &init, &id, &iters, |bd, x| {
                let xa = bd.convert(&x[0], dt, at);
                let xb = bd.convert(&x[1], dt, at);
                let p = bd.bin("mulf", &xa, &xb, at);
                bd.bin("addf", &p, &x[2], at)
            })
        };
        Some(vec![self.converted(&res, dt)?.name])
    }

    /// The axes `Softmax`/`LogSoftmax` normalize over: from opset 13 the
    /// one axis `axis` (default −1); before, the trailing block from `axis`
    /// (default 1) that the input is coerced to 2-D at. With the opset
    /// unknown only the cases where both definitions agree: an `axis`
    /// naming the last axis, or none at rank ≤ 2.
    fn softmax_axes(&self, node: &Node, rank: usize) -> Option<Vec<usize>> {
        let norm = |a: i64| axis_index(a, rank);
        let last = rank.checked_sub(1)?;
        match self.opset {
            Some(v) if v >= 13 => Some(vec![norm(node.attr_int("axis").unwrap_or(-1))?]),
            Some(_) => Some((norm(node.attr_int("axis").unwrap_or(1))?..rank).collect()),
            None => match node.attr_int("axis") {
                Some(a) if norm(a)? == last => Some(vec![last]),
                None if rank <= 2 => Some(vec![last]),
                _ => None,
            },
        }
    }

    /// `Softmax` → `linalg.softmax` over its axis (in f32 for 16-bit floats,
    /// rounded once); over a trailing block
    /// (before opset 13) the block is collapsed into one axis first
    /// (`tensor.collapse_shape`) and expanded back after.
    pub(super) fn softmax(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        if outs.len() != 1 || shape != x.shape || dt != x.dt || !is_float(dt) || x.rank() == 0 {
            return None;
        }
        let axes = self.softmax_axes(node, x.rank())?;
        let axis = axes[0];
        let mut flat: Vec<Dim> = x.shape[..axis].to_vec();
        flat.push(axes.iter().fold(Dim::from(1), |p, &i| p.mul(&x.shape[i])));
        flat.extend(x.shape[axes[axes.len() - 1] + 1..].iter().cloned());
        // 16-bit floats normalize in f32 (the sum of exponentials is a
        // reduction) and round once, like LogSoftmax below.
        let xf = self.reshape(&x, &flat)?;
        let xf = self.converted(&xf, acc_type(dt))?;
        let init = self.empty(&flat, xf.dt, &[&xf, &x])?;
        let ty = init.ty();
        let name = self.line(format!(
            "linalg.softmax dimension({axis}) ins({} : {}) outs({} : {ty}) -> {ty}",
            xf.name,
            xf.ty(),
            init.name
        ));
        let y = self.converted(&Operand { name, ..init }, dt)?;
        Some(vec![self.reshape(&y, &shape)?.name])
    }

    /// `LogSoftmax` over the axes of [`Self::softmax_axes`] as reductions:
    /// `t = x − max`, `y = t − log Σ exp t`, in f32 for 16-bit floats and
    /// rounded once.
    pub(super) fn log_softmax(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        if outs.len() != 1 || shape != x.shape || dt != x.dt || !is_float(dt) || x.rank() == 0 {
            return None;
        }
        let axes = self.softmax_axes(node, x.rank())?;
        let acc = acc_type(dt);
        let ninf = float_lit(f64::NEG_INFINITY, acc);
        let top = self.reduce(&x, &axes, true, &ninf, acc, |b, e, a| {
            let e = b.convert(e, dt, acc);
            b.bin("maximumf", &e, a, acc)
        })?;
        let t = self.ewise(&[&x, &top], &shape, acc, |b, a| {
            let e = b.convert(&a[0], dt, acc);
            b.bin("subf", &e, &a[1], acc)
        })?;
        let sum = self.reduce(&t, &axes, true, "0.0", acc, |b, e, a| {
            let ex = b.op(format!("math.exp {e} : {}", elem(acc)));
            b.bin("addf", &ex, a, acc)
        })?;
        let y = self.ewise(&[&t, &sum], &shape, dt, |b, a| {
            let l = b.op(format!("math.log {} : {}", a[1], elem(acc)));
            let d = b.bin("subf", &a[0], &l, acc);
            b.convert(&d, acc, dt)
        })?;
        Some(vec![y.name])
    }

    /// `LayerNormalization` over the axes from `axis` on, decomposed: mean
    /// and variance as reductions in f32 for 16-bit inputs (`stash_type`),
    /// then one elementwise `linalg.generic` with scale and bias.
    pub(super) fn layer_norm(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let scale = self.operand(node.input(1)?)?;
        let bias = self.optional_operand(node.input(2))?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        if outs.len() != 1 || shape != x.shape || dt != x.dt || !is_float(dt) || scale.dt != dt {
            return None;
        }
        if bias.as_ref().is_some_and(|b| b.dt != dt) {
            return None;
        }
        let rank = x.rank() as i64;
        let axis = node.attr_int("axis").unwrap_or(-1);
        let axis = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&axis) {
            return None;
        }
        let axes: Vec<usize> = (axis as usize..x.rank()).collect();
        let eps = f64::from(node.attr_float("epsilon").unwrap_or(1e-5));
        let acc = if node.attr_int("stash_type").unwrap_or(1) == 1 { acc_type(dt) } else { dt };
        let s = self.reduce(&x, &axes, true, "0.0", acc, |b, e, a| {
            let e = b.convert(e, dt, acc);
            b.bin("addf", &e, a, acc)
        })?;
        let n = self.count(&x, &axes, acc)?;
        let kshape = s.shape.clone();
        let mean = self.ewise(&[&s], &kshape, acc, |b, a| b.bin("divf", &a[0], &n, acc))?;
        // Σ (x − mean)² into the kept shape.
        let id: Vec<String> = (0..x.rank()).map(|i| format!("d{i}")).collect();
        let out_map: Vec<String> =
            (0..x.rank()).map(|i| if axes.contains(&i) { "0".into() } else { format!("d{i}") }).collect();
        let iters: Vec<&str> =
            (0..x.rank()).map(|i| if axes.contains(&i) { "reduction" } else { "parallel" }).collect();
        let sq0 = self.filled("0.0", &kshape, acc, &[&x])?;
        let sq = self.generic_op(&[(&x, id), (&mean, out_map.clone())], &sq0, &out_map, &iters, |b, a| {
            let e = b.convert(&a[0], dt, acc);
            let t = b.bin("subf", &e, &a[1], acc);
            let t2 = b.bin("mulf", &t, &t, acc);
            b.bin("addf", &t2, &a[2], acc)
        });
        let el = float_lit(eps, acc);
        let mut ins: Vec<&Operand> = vec![&x, &mean, &sq, &scale];
        if let Some(b) = &bias {
            ins.push(b);
        }
        let has_bias = bias.is_some();
        let y = self.ewise(&ins, &shape, dt, |b, a| {
            let e = b.convert(&a[0], dt, acc);
            let t = b.bin("subf", &e, &a[1], acc);
            let var = b.bin("divf", &a[2], &n, acc);
            let c = b.cst(&el, acc);
            let ve = b.bin("addf", &var, &c, acc);
            let sd = b.op(format!("math.sqrt {ve} : {}", elem(acc)));
            let q = b.bin("divf", &t, &sd, acc);
            let q = b.convert(&q, acc, dt);
            let m = b.bin("mulf", &q, &a[3], dt);
            match has_bias {
                true => b.bin("addf", &m, &a[4], dt),
                false => m,
            }
        })?;
        Some(vec![y.name])
    }

    /// `Gather` → a `linalg.generic` over the output whose body reads the
    /// data with `tensor.extract` at the (wrapped) index.
    pub(super) fn gather(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let data = self.operand(node.input(0)?)?;
        let idx = self.operand(node.input(1)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let ok_idx = matches!(idx.dt, DType::I64 | DType::I32);
        if outs.len() != 1 || dt != data.dt || !ok_idx || data.rank() == 0 || dt == DType::Str {
            return None;
        }
        let axis = axis_index(node.attr_int("axis").unwrap_or(0), data.rank())?;
        let q = idx.rank();
        let mut want = data.shape[..axis].to_vec();
        want.extend(idx.shape.iter().cloned());
        want.extend(data.shape[axis + 1..].iter().cloned());
        if want != shape {
            return None;
        }
        let size = self.dim(&data.shape[axis].clone(), &[&data])?;
        let init = self.empty(&shape, dt, &[&data, &idx])?;
        let imap: Vec<String> = (axis..axis + q).map(|i| format!("d{i}")).collect();
        let id: Vec<String> = (0..shape.len()).map(|i| format!("d{i}")).collect();
        let iters = vec!["parallel"; shape.len()];
        let (ie, dty, dname) = (elem(idx.dt), data.ty(), data.name.clone());
        let r = self.generic_op(&[(&idx, imap)], &init, &id, &iters, |b, a| {
            let j = b.wrapped(&a[0], ie, &size);
            let mut coords = Vec::new();
            for k in 0..data.rank() {
                coords.push(match k.cmp(&axis) {
                    std::cmp::Ordering::Less => b.op(format!("linalg.index {k} : index")),
                    std::cmp::Ordering::Equal => j.clone(),
                    std::cmp::Ordering::Greater => b.op(format!("linalg.index {} : index", k - 1 + q)),
                });
            }
            b.op(format!("tensor.extract {dname}[{}] : {dty}", coords.join(", ")))
        });
        Some(vec![r.name])
    }

    /// `CumSum` → one `scf.for` along the axis (from its end when `reverse`)
    /// carrying the output and the running sum, a slice of the input's
    /// shape with the axis of size 1: each step adds one slice of the input
    /// to the sum (a `linalg.generic`) and inserts the sum — the one before
    /// the addition when `exclusive` — at that position. O(n) additions per
    /// scan line; sums accumulate in the element type, as ONNX does (f16
    /// and bf16 too). The axis is a constant input, possibly negative.
    pub(super) fn cumsum(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let flag = |name: &str| match node.attr_int(name).unwrap_or(0) {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        };
        let (exclusive, reverse) = (flag("exclusive")?, flag("reverse")?);
        let r = x.rank();
        if outs.len() != 1 || shape != x.shape || dt != x.dt || matches!(dt, DType::Bool | DType::Str) || r == 0 {
            return None;
        }
        let axis = match self.const_ints(node.input(1)?)?.as_slice() {
            &[a] => axis_index(a, r)?,
            _ => return None,
        };
        Some(vec![self.scan(&x, axis, exclusive, reverse)?.name])
    }

    /// The running sums of `x` along `axis` (see [`Self::cumsum`]).
    pub(super) fn scan(&mut self, x: &Operand, axis: usize, exclusive: bool, reverse: bool) -> Option<Operand> {
        let (shape, dt, r) = (x.shape.clone(), x.dt, x.rank());
        let (zero, add) = if is_float(dt) { ("0.0", "addf") } else { ("0", "addi") };
        let mut line = x.shape.clone();
        line[axis] = Dim::from(1);
        let line_sizes = self.sizes(&line, &[x])?;
        let n = self.dim(&x.shape[axis].clone(), &[x])?;
        let init = self.empty(&shape, dt, &[x])?;
        let sum0 = self.filled(zero, &line, dt, &[x])?;
        let (c0, c1) = (self.scalar("0", "index"), self.scalar("1", "index"));
        let last = match reverse {
            true => Some(self.line(format!("arith.subi {n}, {c1} : index"))),
            false => None,
        };
        let (ty, line_ty) = (init.ty(), sum0.ty());
        let (iv, out, sum) = (self.block_arg("i"), self.block_arg("out"), self.block_arg("sum"));
        let running = Operand { name: sum.clone(), shape: line.clone(), dt };
        let ones = vec!["1"; r].join(", ");
        let (body, (out2, sum2)) = self.region(|e| {
            let at = match &last {
                Some(l) => e.line(format!("arith.subi {l}, {iv} : index")),
                None => iv.clone(),
            };
            let mut offsets = vec!["0".to_string(); r];
            offsets[axis] = at;
            let place = format!("[{}] [{}] [{ones}]", offsets.join(", "), line_sizes.join(", "));
            let name = e.line(format!("tensor.extract_slice {}{place} : {} to {line_ty}", x.name, x.ty()));
            let slice = Operand { name, shape: line.clone(), dt };
            let id: Vec<String> = (0..r).map(|i| format!("d{i}")).collect();
            let insert = |e: &mut Self, v: &str| {
                e.line(format!("tensor.insert_slice {v} into {out}{place} : {line_ty} into {ty}"))
            };
            // Exclusive: the old sum is inserted before the addition updates
            // it in place; in the other order one-shot bufferization would
            // need a copy of a loop-carried value, which it rejects.
            let before = exclusive.then(|| insert(e, &sum));
            let next = e.generic_op(&[(&slice, id.clone())], &running, &id, &vec!["parallel"; r], |b, a| {
                b.bin(add, &a[0], &a[1], dt)
            });
            let out2 = before.unwrap_or_else(|| insert(e, &next.name));
            Some((out2, next.name))
        })?;
        let carried =
            [Carried { name: &out, init: &init.name, ty: &ty }, Carried { name: &sum, init: &sum0.name, ty: &line_ty }];
        let name = self.line_results(scf_for(&iv, [&c0, &n, &c1], &carried, &body, &[&out2, &sum2]), 2);
        Some(Operand { name: format!("{name}#0"), shape, dt })
    }
}
