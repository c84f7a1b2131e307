//! Structured lowerings of constants, shape computations and indexing:
//! `Constant`, `ConstantOfShape`, `Shape`, `Range`, `Expand`, `Slice`,
//! `Split`, `GatherElements` and `GatherND`.

use qsync_ir::{Attr, DType, Dim, Node, Op, Tensor, ValueId};

use super::build::{float_lit, ranked, Operand};
use super::{axis_index, elem, is_float, Emitter};

/// `[[a, b], [c, d]]` from row-major items and dims.
fn nest(items: &[String], dims: &[usize]) -> String {
    match dims {
        [] => items.first().cloned().unwrap_or_default(),
        [_, rest @ ..] => {
            let inner: usize = rest.iter().product::<usize>().max(1);
            let parts: Vec<String> = items.chunks(inner).map(|c| nest(c, rest)).collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

/// `dense<…>` of a tensor held inline (numbers or bools; a splat when every
/// element is equal).
fn dense(t: &Tensor) -> Option<String> {
    let items: Vec<String> = match t.dtype {
        DType::Bool => t.as_i64s()?.iter().map(|&v| if v != 0 { "true" } else { "false" }.to_string()).collect(),
        d if is_float(d) => t.as_f64s()?.iter().map(|&v| float_lit(v, d)).collect(),
        DType::Str => return None,
        _ => t.as_i64s()?.iter().map(i64::to_string).collect(),
    };
    let dims: Vec<usize> = t.dims.iter().map(|&d| usize::try_from(d).ok()).collect::<Option<_>>()?;
    if items.len() != dims.iter().product::<usize>() {
        return None;
    }
    if items.is_empty() {
        return Some("dense<>".into());
    }
    if items.len() > 1 && items.iter().all(|i| *i == items[0]) {
        return Some(format!("dense<{}>", items[0]));
    }
    Some(format!("dense<{}>", nest(&items, &dims)))
}

impl Emitter<'_> {
    /// Integer values of a constant: an initializer or a `Constant` node's,
    /// possibly reshaped (`Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`,
    /// `Identity` keep the row-major values).
    pub(super) fn const_ints(&self, v: ValueId) -> Option<Vec<i64>> {
        if let Some(t) = self.g.value(v).init() {
            return t.as_i64s();
        }
        let (n, _) = self.g.producer(v)?;
        let node = self.g.node(n);
        if matches!(node.op, Op::Reshape | Op::Squeeze | Op::Unsqueeze | Op::Flatten | Op::Identity) {
            return self.const_ints(node.input(0)?);
        }
        if node.op != Op::Constant {
            return None;
        }
        match (node.attr("value"), node.attr("value_ints"), node.attr_int("value_int")) {
            (Some(a), _, _) => a.as_tensor()?.as_i64s(),
            (_, Some(a), _) => a.as_ints().map(<[i64]>::to_vec),
            (_, _, Some(i)) => Some(vec![i]),
            _ => None,
        }
    }

    pub(super) fn lower_shapes(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        match node.op {
            Op::Constant => self.constant(node, outs),
            Op::ConstantOfShape => self.constant_of_shape(node, outs),
            Op::Shape => self.shape_of(node, outs),
            Op::Range => self.range(node, outs),
            Op::Expand => {
                let x = self.operand(node.input(0)?)?;
                let (shape, dt) = self.out_type(*outs.first()?)?;
                (dt == x.dt && outs.len() == 1).then_some(())?;
                Some(vec![self.ewise(&[&x], &shape, dt, |_, a| a[0].clone())?.name])
            }
            Op::Slice => self.slice(node, outs),
            Op::Split => self.split(node, outs),
            Op::GatherElements => self.gather_elements(node, outs),
            Op::GatherND => self.gather_nd(node, outs),
            _ => None,
        }
    }

    fn constant(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let t = match node.attrs.iter().next()? {
            (k, Attr::Tensor(t)) if k == "value" => t.clone(),
            (k, Attr::Float(f)) if k == "value_float" => Tensor::from_f32(vec![], &[*f]),
            (k, Attr::Floats(v)) if k == "value_floats" => Tensor::from_f32(vec![v.len() as i64], v),
            (k, Attr::Int(i)) if k == "value_int" => Tensor::from_i64(vec![], &[*i]),
            (k, Attr::Ints(v)) if k == "value_ints" => Tensor::from_i64(vec![v.len() as i64], v),
            _ => return None,
        };
        let want: Option<Vec<i64>> = shape.iter().map(Dim::as_const).collect();
        if node.attrs.len() != 1 || t.dtype != dt || want? != t.dims {
            return None;
        }
        Some(vec![self.line(format!("arith.constant {} : {}", dense(&t)?, ranked(&shape, dt)))])
    }

    fn constant_of_shape(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let lit = match node.attr("value") {
            None => "0.0".to_string(),
            Some(a) => {
                let t = a.as_tensor()?;
                if t.dtype != dt || t.numel() != 1 {
                    return None;
                }
                let d = dense(t)?;
                d.strip_prefix("dense<")?.strip_suffix('>')?.trim_matches(|c| c == '[' || c == ']').to_string()
            }
        };
        if dt == DType::Str || (node.attr("value").is_none() && dt != DType::F32) {
            return None;
        }
        if shape.iter().all(|d| d.as_const().is_some_and(|c| c > 0)) {
            return Some(vec![self.line(format!("arith.constant dense<{lit}> : {}", ranked(&shape, dt)))]);
        }
        Some(vec![self.filled(&lit, &shape, dt, &[])?.name])
    }

    fn shape_of(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let r = x.rank() as i64;
        let norm = |a: i64| (if a < 0 { a + r } else { a }).clamp(0, r) as usize;
        let start = norm(node.attr_int("start").unwrap_or(0));
        let end = norm(node.attr_int("end").unwrap_or(r));
        let dims: Vec<Dim> = x.shape[start..end.max(start)].to_vec();
        if dt != DType::I64 || shape != [Dim::from(dims.len() as i64)] || dims.is_empty() {
            return None;
        }
        let ty = ranked(&shape, dt);
        if let Some(c) = dims.iter().map(Dim::as_const).collect::<Option<Vec<i64>>>() {
            let t = Tensor::from_i64(vec![c.len() as i64], &c);
            return Some(vec![self.line(format!("arith.constant {} : {ty}", dense(&t)?))]);
        }
        let mut items = Vec::new();
        for (i, d) in dims.iter().enumerate() {
            items.push(match d.as_const() {
                Some(c) => self.scalar(&c.to_string(), "i64"),
                None => {
                    let ax = self.scalar(&(start + i).to_string(), "index");
                    let v = self.line(format!("tensor.dim {}, {ax} : {}", x.name, x.ty()));
                    self.line(format!("arith.index_cast {v} : index to i64"))
                }
            });
        }
        Some(vec![self.line(format!("tensor.from_elements {} : {ty}", items.join(", ")))])
    }

    fn range(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let xs: Vec<Operand> = (0..3).map(|i| self.operand(node.input(i)?)).collect::<Option<_>>()?;
        let int = matches!(dt, DType::I64 | DType::I32 | DType::I16);
        if shape.len() != 1 || xs.iter().any(|x| x.rank() != 0 || x.dt != dt) || !(int || is_float(dt)) {
            return None;
        }
        let e = elem(dt);
        let start = self.line(format!("tensor.extract {}[] : {}", xs[0].name, xs[0].ty()));
        let delta = self.line(format!("tensor.extract {}[] : {}", xs[2].name, xs[2].ty()));
        let init = match shape[0].as_const() {
            Some(_) => self.empty(&shape, dt, &[])?,
            None => {
                // max(ceil((limit − start) / delta), 0) elements.
                let limit = self.line(format!("tensor.extract {}[] : {}", xs[1].name, xs[1].ty()));
                let n = if int {
                    let span = self.line(format!("arith.subi {limit}, {start} : {e}"));
                    let q = self.line(format!("arith.ceildivsi {span}, {delta} : {e}"));
                    self.line(format!("arith.index_cast {q} : {e} to index"))
                } else {
                    let span = self.line(format!("arith.subf {limit}, {start} : {e}"));
                    let q = self.line(format!("arith.divf {span}, {delta} : {e}"));
                    let c = self.line(format!("math.ceil {q} : {e}"));
                    let i = self.line(format!("arith.fptosi {c} : {e} to i64"));
                    self.line(format!("arith.index_cast {i} : i64 to index"))
                };
                let zero = self.scalar("0", "index");
                let n = self.line(format!("arith.maxsi {n}, {zero} : index"));
                let name = self.line(format!("tensor.empty({n}) : {}", ranked(&shape, dt)));
                Operand { name, shape: shape.clone(), dt }
            }
        };
        let r = self.generic_op(&[], &init, &["d0".to_string()], &["parallel"], |b, _| {
            let i = b.op("linalg.index 0 : index");
            if int {
                let k = b.op(format!("arith.index_cast {i} : index to {e}"));
                let m = b.op(format!("arith.muli {k}, {delta} : {e}"));
                b.op(format!("arith.addi {start}, {m} : {e}"))
            } else {
                let k = b.op(format!("arith.index_cast {i} : index to i64"));
                let f = b.op(format!("arith.sitofp {k} : i64 to {e}"));
                let m = b.bin("mulf", &f, &delta, dt);
                b.bin("addf", &start, &m, dt)
            }
        });
        Some(vec![r.name])
    }

    /// `tensor.extract_slice` of `x` at `offsets` (index values or
    /// literals) with sizes `shape` and `strides`.
    fn slice_of(&mut self, x: &Operand, offsets: &[String], shape: &[Dim], strides: &[i64]) -> Option<String> {
        // An empty result may start at the end of an axis, which
        // `tensor.extract_slice` rejects: it is just an empty tensor.
        if shape.iter().any(|d| d.as_const() == Some(0)) {
            return self.empty(shape, x.dt, &[x]).map(|o| o.name);
        }
        let sizes = self.sizes(shape, &[x])?;
        let st: Vec<String> = strides.iter().map(i64::to_string).collect();
        Some(self.line(format!(
            "tensor.extract_slice {}[{}] [{}] [{}] : {} to {}",
            x.name,
            offsets.join(", "),
            sizes.join(", "),
            st.join(", "),
            x.ty(),
            ranked(shape, x.dt)
        )))
    }

    /// `Slice` with constant nonzero steps and constant (or absent) axes;
    /// starts may be computed. Starts are wrapped and clamped as ONNX does —
    /// into `[0, n]` for a positive step, `[0, n − 1]` for a negative one —
    /// in `index` arithmetic when not constant; sizes are the inferred
    /// output's. Positive steps → `tensor.extract_slice`; with a negative
    /// step (exporters reverse an axis that way) → a `linalg.generic` over
    /// the output reading `start + i·step` of each axis with `tensor.extract`.
    fn slice(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let starts = self.operand(node.input(1)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let (k, r) = (starts.size(0)? as usize, x.rank());
        if outs.len() != 1 || dt != x.dt || shape.len() != r || starts.rank() != 1 || r == 0 {
            return None;
        }
        let axes: Vec<i64> = match node.input(3) {
            Some(v) => self.const_ints(v)?,
            None => (0..k as i64).collect(),
        };
        let steps: Vec<i64> = match node.input(4) {
            Some(v) => self.const_ints(v)?,
            None => vec![1; k],
        };
        if axes.len() != k || steps.len() != k || steps.contains(&0) {
            return None;
        }
        if shape.iter().any(|d| d.as_const() == Some(0)) {
            return Some(vec![self.empty(&shape, dt, &[&x])?.name]);
        }
        let known = self.const_ints(node.input(1)?).filter(|s| s.len() == k);
        let mut offsets = vec!["0".to_string(); r];
        let mut strides = vec![1i64; r];
        let mut seen = vec![false; r];
        for j in 0..k {
            let a = axis_index(axes[j], r)?;
            if std::mem::replace(&mut seen[a], true) {
                return None;
            }
            strides[a] = steps[j];
            // The last valid start: one past the end only when stepping forward.
            let back = i64::from(steps[j] < 0);
            let n = x.shape[a].clone();
            offsets[a] = match (known.as_ref().map(|s| s[j]), n.as_const()) {
                (Some(s), Some(n)) => (if s < 0 { s + n } else { s }).min(n - back).max(0).to_string(),
                _ => {
                    let size = self.dim(&n, &[&x])?;
                    let cj = self.scalar(&j.to_string(), "index");
                    let v = self.line(format!("tensor.extract {}[{cj}] : {}", starts.name, starts.ty()));
                    let s = self.wrap_index(&v, starts.dt, &size);
                    let zero = self.scalar("0", "index");
                    let lo = self.line(format!("arith.maxsi {s}, {zero} : index"));
                    let hi = match back {
                        0 => size,
                        _ => {
                            let one = self.scalar("1", "index");
                            self.line(format!("arith.subi {size}, {one} : index"))
                        }
                    };
                    self.line(format!("arith.minsi {lo}, {hi} : index"))
                }
            };
        }
        if strides.iter().all(|&s| s > 0) {
            return Some(vec![self.slice_of(&x, &offsets, &shape, &strides)?]);
        }
        // Axes read other than one to one: their start and step as index values.
        let mut moved: Vec<Option<(String, String)>> = Vec::new();
        for (off, &st) in offsets.iter().zip(&strides) {
            moved.push(match (off.as_str(), st) {
                ("0", 1) => None,
                _ => {
                    let start = if off.starts_with('%') { off.clone() } else { self.scalar(off, "index") };
                    Some((start, self.scalar(&st.to_string(), "index")))
                }
            });
        }
        let init = self.empty(&shape, dt, &[&x])?;
        let id: Vec<String> = (0..r).map(|i| format!("d{i}")).collect();
        let (xname, xty) = (x.name.clone(), x.ty());
        let out = self.generic_op(&[], &init, &id, &vec!["parallel"; r], |b, _| {
            let mut coords = Vec::new();
            for (a, m) in moved.iter().enumerate() {
                let i = b.op(format!("linalg.index {a} : index"));
                coords.push(match m {
                    None => i,
                    Some((start, step)) => {
                        let t = b.op(format!("arith.muli {i}, {step} : index"));
                        b.op(format!("arith.addi {start}, {t} : index"))
                    }
                });
            }
            b.op(format!("tensor.extract {xname}[{}] : {xty}", coords.join(", ")))
        });
        Some(vec![out.name])
    }

    /// `Split` into the inferred output shapes: one `tensor.extract_slice` each.
    fn split(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        if x.rank() == 0 {
            return None;
        }
        let axis = axis_index(node.attr_int("axis").unwrap_or(0), x.rank())?;
        let mut at = Dim::from(0);
        let mut names = Vec::new();
        for &o in outs {
            let (shape, dt) = self.out_type(o)?;
            if dt != x.dt || shape.len() != x.rank() {
                return None;
            }
            let mut offsets = vec!["0".to_string(); x.rank()];
            offsets[axis] = match at.as_const() {
                Some(c) => c.to_string(),
                None => self.dim(&at, &[&x])?,
            };
            names.push(self.slice_of(&x, &offsets, &shape, &vec![1; x.rank()])?);
            at = at.add(&shape[axis]);
        }
        (at == x.shape[axis]).then_some(names)
    }

    fn gather_elements(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let data = self.operand(node.input(0)?)?;
        let idx = self.operand(node.input(1)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let r = data.rank();
        if outs.len() != 1 || dt != data.dt || shape != idx.shape || idx.rank() != r || r == 0 {
            return None;
        }
        if !matches!(idx.dt, DType::I64 | DType::I32) {
            return None;
        }
        let axis = axis_index(node.attr_int("axis").unwrap_or(0), r)?;
        let size = self.dim(&data.shape[axis].clone(), &[&data])?;
        let init = self.empty(&shape, dt, &[&idx])?;
        let id: Vec<String> = (0..r).map(|i| format!("d{i}")).collect();
        let (ie, dty, dname) = (elem(idx.dt), data.ty(), data.name.clone());
        let out = self.generic_op(&[(&idx, id.clone())], &init, &id, &vec!["parallel"; r], |b, a| {
            let j = b.wrapped(&a[0], ie, &size);
            let coords: Vec<String> =
                (0..r).map(|k| if k == axis { j.clone() } else { b.op(format!("linalg.index {k} : index")) }).collect();
            b.op(format!("tensor.extract {dname}[{}] : {dty}", coords.join(", ")))
        });
        Some(vec![out.name])
    }

    /// `GatherND` with `batch_dims = 0`.
    fn gather_nd(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let data = self.operand(node.input(0)?)?;
        let idx = self.operand(node.input(1)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let m = idx.rank().checked_sub(1)?;
        let k = idx.size(m)? as usize;
        if outs.len() != 1 || dt != data.dt || node.attr_int("batch_dims").unwrap_or(0) != 0 || k > data.rank() {
            return None;
        }
        let mut want = idx.shape[..m].to_vec();
        want.extend(data.shape[k..].iter().cloned());
        if want != shape || !matches!(idx.dt, DType::I64 | DType::I32) {
            return None;
        }
        let mut sizes = Vec::new();
        for j in 0..k {
            sizes.push(self.dim(&data.shape[j].clone(), &[&data])?);
        }
        let init = self.empty(&shape, dt, &[&data, &idx])?;
        let id: Vec<String> = (0..shape.len()).map(|i| format!("d{i}")).collect();
        let (ie, ity, iname, dty, dname) = (elem(idx.dt), idx.ty(), idx.name.clone(), data.ty(), data.name.clone());
        let rest = data.rank() - k;
        let out = self.generic_op(&[], &init, &id, &vec!["parallel"; shape.len()], |b, _| {
            let li: Vec<String> = (0..shape.len()).map(|i| b.op(format!("linalg.index {i} : index"))).collect();
            let mut coords = Vec::new();
            for (j, size) in sizes.iter().enumerate() {
                let cj = b.op(format!("arith.constant {j} : index"));
                let mut at: Vec<String> = li[..m].to_vec();
                at.push(cj);
                let v = b.op(format!("tensor.extract {iname}[{}] : {ity}", at.join(", ")));
                coords.push(b.wrapped(&v, ie, size));
            }
            coords.extend(li[m..m + rest].iter().cloned());
            b.op(format!("tensor.extract {dname}[{}] : {dty}", coords.join(", ")))
        });
        Some(vec![out.name])
    }
}
