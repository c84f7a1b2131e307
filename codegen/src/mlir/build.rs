//! Building blocks of the structured lowerings: typed operands, constants,
//! dynamic sizes, `tensor.empty`/`linalg.fill`, `linalg.generic` (elementwise
//! with broadcasting, reductions), reshapes, and `scf.for` loops whose bodies
//! are emitted by the same helpers (`Emitter::region`).
//!
//! Every helper writes lines into the node's fragment and returns `None` when
//! the lowering cannot be expressed (e.g. a symbolic size with no source); the
//! caller then falls back to the generic form and the fragment is dropped.

use std::fmt::Write as _;

use qsync_ir::{DType, Dim, ValueId};

use super::{elem, is_float, plain, Emitter};

/// A ranked tensor value of a lowering: its SSA name, shape and element type.
#[derive(Clone, Debug)]
pub(super) struct Operand {
    pub name: String,
    pub shape: Vec<Dim>,
    pub dt: DType,
}

impl Operand {
    pub fn ty(&self) -> String {
        ranked(&self.shape, self.dt)
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// A static size of axis `i`.
    pub fn size(&self, i: usize) -> Option<i64> {
        self.shape.get(i)?.as_const().filter(|&c| c >= 0)
    }
}

/// `tensor<?x4xf32>` for a shape of dims.
pub(super) fn ranked(shape: &[Dim], dt: DType) -> String {
    let mut out = String::from("tensor<");
    for d in shape {
        match d.as_const() {
            Some(c) if c >= 0 => write!(out, "{c}x").ok(),
            _ => write!(out, "?x").ok(),
        };
    }
    format!("{out}{}>", elem(dt))
}

/// An MLIR float literal of `v` for element type `dt` (infinities in hex).
pub(super) fn float_lit(v: f64, dt: DType) -> String {
    if v.is_finite() {
        let e = format!("{v:e}");
        match e.split_once('e') {
            Some((m, x)) if !m.contains('.') => format!("{m}.0e{x}"),
            _ => e,
        }
    } else {
        let neg = v < 0.0;
        match (dt, neg) {
            (DType::F16, false) => "0x7C00".into(),
            (DType::F16, true) => "0xFC00".into(),
            (DType::BF16, false) => "0x7F80".into(),
            (DType::BF16, true) => "0xFF80".into(),
            (DType::F64, false) => "0x7FF0000000000000".into(),
            (DType::F64, true) => "0xFFF0000000000000".into(),
            (_, false) => "0x7F800000".into(),
            (_, true) => "0xFF800000".into(),
        }
    }
}

/// `affine_map<(d0, d1) -> (d0, 0)>` from the loop count and result list.
pub(super) fn map(loops: usize, results: &[String]) -> String {
    let ds: Vec<String> = (0..loops).map(|i| format!("d{i}")).collect();
    format!("affine_map<({}) -> ({})>", ds.join(", "), results.join(", "))
}

/// `[[0], [1, 2, 3]]`.
pub(super) fn reassoc(groups: &[Vec<usize>]) -> String {
    let gs: Vec<String> =
        groups.iter().map(|g| format!("[{}]", g.iter().map(usize::to_string).collect::<Vec<_>>().join(", "))).collect();
    format!("[{}]", gs.join(", "))
}

/// Groups of consecutive `big` axes whose sizes multiply to each `small`
/// axis (unit axes joining a neighbouring group), if there are such groups.
fn groups(big: &[Dim], small: &[Dim]) -> Option<Vec<Vec<usize>>> {
    let one = Dim::from(1);
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut i = 0;
    for d in small {
        let mut g = Vec::new();
        let mut p = Dim::from(1);
        loop {
            let b = big.get(i)?;
            p = p.mul(b);
            g.push(i);
            i += 1;
            if p == *d {
                break;
            }
        }
        out.push(g);
    }
    while i < big.len() {
        if big[i] != one {
            return None;
        }
        if let Some(last) = out.last_mut() {
            last.push(i);
        }
        i += 1;
    }
    (!small.is_empty() || big.iter().all(|d| *d == one)).then_some(out)
}

/// A value an `scf.for` carries: its name in the body, initial value, type.
pub(super) struct Carried<'a> {
    pub name: &'a str,
    pub init: &'a str,
    pub ty: &'a str,
}

/// `scf.for %iv = lo to hi step step iter_args(…) -> (…) { body; scf.yield }`
/// (the right-hand side; one result per carried value).
pub(super) fn scf_for(iv: &str, bounds: [&str; 3], carried: &[Carried], body: &[String], yields: &[&str]) -> String {
    let args: Vec<String> = carried.iter().map(|c| format!("{} = {}", c.name, c.init)).collect();
    let tys: Vec<&str> = carried.iter().map(|c| c.ty).collect();
    format!(
        "scf.for {iv} = {} to {} step {} iter_args({}) -> ({}) {{\n{}\n      scf.yield {} : {}\n    }}",
        bounds[0],
        bounds[1],
        bounds[2],
        args.join(", "),
        tys.join(", "),
        body.join("\n"),
        yields.join(", "),
        tys.join(", ")
    )
}

/// The body of a `linalg.generic`: scalar lines with names unique in the
/// function.
pub(super) struct Body {
    lines: Vec<String>,
    prefix: String,
    n: usize,
}

/// The type sums over `dt` accumulate in: f32 for 16-bit floats.
pub(super) fn acc_type(dt: DType) -> DType {
    match dt {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

impl Body {
    /// A body whose lines are thrown away (to ask whether one exists).
    pub fn probe() -> Body {
        Body { lines: Vec::new(), prefix: "probe".into(), n: 0 }
    }
    /// Lines outside any region, their values named `%<prefix>N`.
    pub fn named(prefix: &str) -> Body {
        Body { lines: Vec::new(), prefix: prefix.into(), n: 0 }
    }
    /// The lines emitted so far.
    pub fn into_lines(self) -> Vec<String> {
        self.lines
    }
    /// An i32/i64 index wrapped like ONNX negative indices (`+ size` when
    /// negative), as `index`.
    pub fn wrapped(&mut self, v: &str, ie: &str, size: &str) -> String {
        let i = self.op(format!("arith.index_cast {v} : {ie} to index"));
        let zero = self.op("arith.constant 0 : index");
        let neg = self.op(format!("arith.cmpi slt, {i}, {zero} : index"));
        let w = self.op(format!("arith.addi {i}, {size} : index"));
        self.op(format!("arith.select {neg}, {w}, {i} : index"))
    }
    /// `v` converted between float types (`arith.extf`/`truncf`), if they differ.
    pub fn convert(&mut self, v: &str, from: DType, to: DType) -> String {
        match from == to {
            true => v.to_string(),
            false if super::float_width(to) > super::float_width(from) => {
                self.op(format!("arith.extf {v} : {} to {}", elem(from), elem(to)))
            }
            false => self.op(format!("arith.truncf {v} : {} to {}", elem(from), elem(to))),
        }
    }

    /// `%name = rhs`; returns the name.
    pub fn op(&mut self, rhs: impl AsRef<str>) -> String {
        let name = format!("%{}{}", self.prefix, self.n);
        self.n += 1;
        self.lines.push(format!("      {name} = {}", rhs.as_ref()));
        name
    }
    /// A scalar constant inside the body.
    pub fn cst(&mut self, lit: &str, dt: DType) -> String {
        // A bool literal carries its type (`arith.constant true`).
        match lit {
            "true" | "false" => self.op(format!("arith.constant {lit}")),
            _ => self.op(format!("arith.constant {lit} : {}", elem(dt))),
        }
    }
    /// `a <op> b` on scalars of `dt` (`addf`, `mulf`, …).
    pub fn bin(&mut self, op: &str, a: &str, b: &str, dt: DType) -> String {
        self.op(format!("arith.{op} {a}, {b} : {}", elem(dt)))
    }
}

impl Emitter<'_> {
    /// `%nB_K = rhs` in the fragment; returns the name.
    pub(super) fn line(&mut self, rhs: impl AsRef<str>) -> String {
        let name = format!("%n{}_{}", self.base, self.tmp);
        self.tmp += 1;
        self.frag.push(format!("    {name} = {}", rhs.as_ref()));
        name
    }

    /// `%nB_K:n = rhs` in the fragment for an op with `n` results; returns
    /// the name, whose results are `name#0` … `name#(n−1)`.
    pub(super) fn line_results(&mut self, rhs: impl AsRef<str>, n: usize) -> String {
        let name = format!("%n{}_{}", self.base, self.tmp);
        self.tmp += 1;
        self.frag.push(format!("    {name}:{n} = {}", rhs.as_ref()));
        name
    }

    /// Runs `f` and takes the lines it emitted out of the fragment, to be
    /// nested in a region (a loop body). Index values and constants `f`
    /// defines are forgotten afterwards: they do not dominate what follows
    /// the region, so sizes the region needs are best computed before it.
    pub(super) fn region<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<(Vec<String>, T)> {
        let start = self.frag.len();
        let cached = self.local.clone();
        let r = f(self);
        let lines = self.frag.split_off(start);
        self.local = cached;
        Some((lines, r?))
    }

    /// Index operands for `shape`: literals where static, else `index`
    /// values (as [`Emitter::dim`] finds them).
    pub(super) fn sizes(&mut self, shape: &[Dim], hints: &[&Operand]) -> Option<Vec<String>> {
        shape
            .iter()
            .map(|d| match d.as_const() {
                Some(c) if c >= 0 => Some(c.to_string()),
                _ => self.dim(d, hints),
            })
            .collect()
    }

    /// A name for a region's block argument, unique in the function.
    pub(super) fn block_arg(&mut self, what: &str) -> String {
        let name = format!("%r{}_{}_{what}", self.base, self.tmp);
        self.tmp += 1;
        name
    }

    /// [`Body::wrapped`] in the fragment: an i32/i64 scalar index as
    /// `index`, `+ size` when negative.
    pub(super) fn wrap_index(&mut self, v: &str, dt: DType, size: &str) -> String {
        let i = self.line(format!("arith.index_cast {v} : {} to index", elem(dt)));
        let zero = self.scalar("0", "index");
        let neg = self.line(format!("arith.cmpi slt, {i}, {zero} : index"));
        let w = self.line(format!("arith.addi {i}, {size} : index"));
        self.line(format!("arith.select {neg}, {w}, {i} : index"))
    }

    /// An optional input as an operand: `Some(None)` when it is omitted,
    /// `None` when it is there but not fully typed.
    pub(super) fn optional_operand(&self, v: Option<ValueId>) -> Option<Option<Operand>> {
        match v {
            Some(v) => Some(Some(self.operand(v)?)),
            None => Some(None),
        }
    }

    /// A graph value as an operand (fully typed values only).
    pub(super) fn operand(&self, v: ValueId) -> Option<Operand> {
        let t = self.g.ty(v);
        if !plain(t) {
            return None;
        }
        Some(Operand { name: self.names.get(&v)?.clone(), shape: t.shape.clone()?, dt: t.dtype? })
    }

    /// The operand describing output `v` under a name still to be chosen.
    pub(super) fn out_type(&self, v: ValueId) -> Option<(Vec<Dim>, DType)> {
        let t = self.g.ty(v);
        plain(t).then(|| (t.shape.clone().unwrap_or_default(), t.dtype.unwrap_or(DType::F32)))
    }

    /// A scalar `arith.constant`, once per node.
    pub(super) fn scalar(&mut self, lit: &str, ty: &str) -> String {
        let key = format!("c {lit} : {ty}");
        if let Some(n) = self.local.get(&key) {
            return n.clone();
        }
        // A bool literal carries its type (`arith.constant true`).
        let n = match lit {
            "true" | "false" => self.line(format!("arith.constant {lit}")),
            _ => self.line(format!("arith.constant {lit} : {ty}")),
        };
        self.local.insert(key, n.clone());
        n
    }

    /// An `index` value of size `d`: a constant, a `tensor.dim` of an
    /// operand with that size or of the argument a symbol comes from, or a
    /// product of those.
    pub(super) fn dim(&mut self, d: &Dim, hints: &[&Operand]) -> Option<String> {
        self.dim_at(d, hints, 0)
    }

    fn dim_at(&mut self, d: &Dim, hints: &[&Operand], depth: usize) -> Option<String> {
        if depth > 8 {
            return None;
        }
        if let Some(c) = d.as_const() {
            return (c >= 0).then(|| self.scalar(&c.to_string(), "index"));
        }
        let key = format!("d {d}");
        if let Some(n) = self.local.get(&key) {
            return Some(n.clone());
        }
        let mut source: Option<(String, usize, String)> =
            hints.iter().find_map(|h| h.shape.iter().position(|x| x == d).map(|i| (h.name.clone(), i, h.ty())));
        if source.is_none() {
            if let Some(s) = d.as_sym() {
                source = self.syms.get(s).cloned();
            }
        }
        let n = match source {
            Some((v, axis, ty)) => {
                let i = self.scalar(&axis.to_string(), "index");
                self.line(format!("tensor.dim {v}, {i} : {ty}"))
            }
            None => {
                let (q, s) = d.symbols().iter().find_map(|s| {
                    let sd = Dim::sym(s);
                    d.div_exact(&sd).filter(|q| q != d).map(|q| (q, sd))
                })?;
                let a = self.dim_at(&s, hints, depth + 1)?;
                let b = self.dim_at(&q, hints, depth + 1)?;
                self.line(format!("arith.muli {a}, {b} : index"))
            }
        };
        self.local.insert(key, n.clone());
        Some(n)
    }

    /// The dynamic sizes of `shape`, in order.
    fn dyn_sizes(&mut self, shape: &[Dim], hints: &[&Operand]) -> Option<Vec<String>> {
        shape.iter().filter(|d| d.as_const().is_none_or(|c| c < 0)).map(|d| self.dim(d, hints)).collect()
    }

    /// `tensor.empty` of a shape.
    pub(super) fn empty(&mut self, shape: &[Dim], dt: DType, hints: &[&Operand]) -> Option<Operand> {
        let sizes = self.dyn_sizes(shape, hints)?;
        let name = self.line(format!("tensor.empty({}) : {}", sizes.join(", "), ranked(shape, dt)));
        Some(Operand { name, shape: shape.to_vec(), dt })
    }

    /// A tensor of one value (`lit`, an MLIR literal of `dt`).
    pub(super) fn filled(&mut self, lit: &str, shape: &[Dim], dt: DType, hints: &[&Operand]) -> Option<Operand> {
        let e = self.empty(shape, dt, hints)?;
        let c = self.scalar(lit, elem(dt));
        let ty = e.ty();
        let name = self.line(format!("linalg.fill ins({c} : {}) outs({} : {ty}) -> {ty}", elem(dt), e.name));
        Some(Operand { name, ..e })
    }

    /// A `linalg.generic` over `iters.len()` loops: inputs with their map
    /// results, the init `out` with its map results; `body` gets the block
    /// arguments (inputs then the output) and returns the yielded value.
    pub(super) fn generic_op(
        &mut self,
        ins: &[(&Operand, Vec<String>)],
        out: &Operand,
        out_map: &[String],
        iters: &[&str],
        body: impl FnOnce(&mut Body, &[String]) -> String,
    ) -> Operand {
        let loops = iters.len();
        let mut maps: Vec<String> = ins.iter().map(|(_, m)| map(loops, m)).collect();
        maps.push(map(loops, out_map));
        let its: Vec<String> = iters.iter().map(|i| format!("\"{i}\"")).collect();
        let prefix = format!("b{}_{}_", self.base, self.tmp);
        let args: Vec<String> = (0..=ins.len()).map(|i| format!("%{prefix}a{i}")).collect();
        let mut b = Body { lines: Vec::new(), prefix, n: 0 };
        let y = body(&mut b, &args);
        let mut block: Vec<String> =
            ins.iter().map(|(o, _)| elem(o.dt)).chain([elem(out.dt)]).map(String::from).collect();
        for (a, t) in args.iter().zip(block.iter_mut()) {
            *t = format!("{a}: {t}");
        }
        let ty = out.ty();
        let ins_text = if ins.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = ins.iter().map(|(o, _)| o.name.as_str()).collect();
            let tys: Vec<String> = ins.iter().map(|(o, _)| o.ty()).collect();
            format!(" ins({} : {})", names.join(", "), tys.join(", "))
        };
        let rhs = format!(
            "linalg.generic {{indexing_maps = [{}], iterator_types = [{}]}}{ins_text} outs({} : {ty}) {{\n    ^bb0({}):\n{}\n      linalg.yield {y} : {}\n    }} -> {ty}",
            maps.join(", "),
            its.join(", "),
            out.name,
            block.join(", "),
            b.lines.join("\n"),
            elem(out.dt),
        );
        let name = self.line(rhs);
        Operand { name, shape: out.shape.clone(), dt: out.dt }
    }

    /// Map results reading `x` inside loops over `shape` under numpy
    /// broadcasting (`x` right-aligned; a unit axis against a larger one
    /// reads index 0). `None` when the sizes may not broadcast.
    pub(super) fn bcast_map(x: &Operand, shape: &[Dim]) -> Option<Vec<String>> {
        let off = shape.len().checked_sub(x.rank())?;
        let one = Dim::from(1);
        x.shape
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let o = &shape[off + i];
                if d == o {
                    Some(format!("d{}", off + i))
                } else if *d == one {
                    Some("0".to_string())
                } else {
                    None
                }
            })
            .collect()
    }

    /// An elementwise `linalg.generic` producing `shape` × `dt` from
    /// broadcast inputs.
    pub(super) fn ewise(
        &mut self,
        ins: &[&Operand],
        shape: &[Dim],
        dt: DType,
        body: impl FnOnce(&mut Body, &[String]) -> String,
    ) -> Option<Operand> {
        let mut with_maps = Vec::new();
        for &x in ins {
            with_maps.push((x, Self::bcast_map(x, shape)?));
        }
        let init = self.empty(shape, dt, ins)?;
        let id: Vec<String> = (0..shape.len()).map(|i| format!("d{i}")).collect();
        let iters = vec!["parallel"; shape.len()];
        Some(self.generic_op(&with_maps, &init, &id, &iters, body))
    }

    /// `x` with element type `dt`: itself when it has it, else one
    /// elementwise `linalg.generic` extending or rounding each element
    /// (`arith.extf`/`arith.truncf`).
    pub(super) fn converted(&mut self, x: &Operand, dt: DType) -> Option<Operand> {
        if x.dt == dt {
            return Some(x.clone());
        }
        let from = x.dt;
        let shape = x.shape.clone();
        self.ewise(&[x], &shape, dt, |b, a| b.convert(&a[0], from, dt))
    }

    /// A reduction of `x` over `axes` (sorted, distinct) into an
    /// accumulator of type `dt` starting from the literal `init`;
    /// `combine(body, element, accumulator)`. The result keeps the reduced
    /// axes as size 1 when `keep`.
    pub(super) fn reduce(
        &mut self,
        x: &Operand,
        axes: &[usize],
        keep: bool,
        init: &str,
        dt: DType,
        combine: impl FnOnce(&mut Body, &str, &str) -> String,
    ) -> Option<Operand> {
        let one = Dim::from(1);
        let shape: Vec<Dim> = x
            .shape
            .iter()
            .enumerate()
            .filter_map(|(i, d)| match axes.contains(&i) {
                true => keep.then(|| one.clone()),
                false => Some(d.clone()),
            })
            .collect();
        let out_map: Vec<String> = (0..x.rank())
            .filter_map(|i| match axes.contains(&i) {
                true => keep.then(|| "0".to_string()),
                false => Some(format!("d{i}")),
            })
            .collect();
        let iters: Vec<&str> =
            (0..x.rank()).map(|i| if axes.contains(&i) { "reduction" } else { "parallel" }).collect();
        let acc = self.filled(init, &shape, dt, &[x])?;
        let id: Vec<String> = (0..x.rank()).map(|i| format!("d{i}")).collect();
        Some(self.generic_op(&[(x, id)], &acc, &out_map, &iters, |b, a| combine(b, &a[0], &a[1])))
    }

    /// The number of elements `x` has along `axes`, as a scalar of float
    /// type `dt` (through `index` when sizes are symbolic).
    pub(super) fn count(&mut self, x: &Operand, axes: &[usize], dt: DType) -> Option<String> {
        let n = axes.iter().fold(Dim::from(1), |p, &i| p.mul(&x.shape[i]));
        if let Some(c) = n.as_const() {
            return Some(self.scalar(&float_lit(c as f64, dt), elem(dt)));
        }
        if !is_float(dt) {
            return None;
        }
        // A product of per-axis sizes, so that each has a source.
        let mut acc: Option<String> = None;
        for &i in axes {
            let d = self.dim(&x.shape[i].clone(), &[x])?;
            acc = Some(match acc {
                None => d,
                Some(a) => self.line(format!("arith.muli {a}, {d} : index")),
            });
        }
        let i = self.line(format!("arith.index_cast {} : index to i64", acc?));
        Some(self.line(format!("arith.sitofp {i} : i64 to {}", elem(dt))))
    }

    /// `x` with shape `to` (same element count, row-major): one
    /// `tensor.collapse_shape` or `tensor.expand_shape` when the axes group,
    /// else a collapse to one axis and an expand.
    pub(super) fn reshape(&mut self, x: &Operand, to: &[Dim]) -> Option<Operand> {
        if x.shape == to {
            return Some(x.clone());
        }
        if let Some(g) = groups(&x.shape, to) {
            return Some(self.collapse(x, &g, to));
        }
        if let Some(g) = groups(to, &x.shape) {
            return self.expand(x, &g, to);
        }
        if x.rank() == 0 || to.is_empty() {
            return None;
        }
        let n = x.shape.iter().fold(Dim::from(1), |p, d| p.mul(d));
        let flat = if x.rank() == 1 {
            x.clone()
        } else {
            self.collapse(x, &[(0..x.rank()).collect()], std::slice::from_ref(&n))
        };
        self.expand(&flat, &[(0..to.len()).collect()], to)
    }

    /// `tensor.collapse_shape` into `to`. MLIR types a collapsed axis static
    /// exactly when every axis it collapses is; where the IR's symbolic dims
    /// say otherwise (a reshape target baked in by a tracer), the result is
    /// collapsed into MLIR's type and `tensor.cast` to `to`.
    fn collapse(&mut self, x: &Operand, g: &[Vec<usize>], to: &[Dim]) -> Operand {
        let natural: Vec<Dim> = g
            .iter()
            .zip(to)
            .map(|(grp, d)| {
                let dims: Option<Vec<i64>> = grp.iter().map(|&i| x.shape[i].as_const().filter(|&c| c >= 0)).collect();
                match dims {
                    Some(ds) => Dim::from(ds.iter().product::<i64>()),
                    None if d.as_const().is_some() => Dim::sym("?"),
                    None => d.clone(),
                }
            })
            .collect();
        let nty = ranked(&natural, x.dt);
        let name = self.line(format!("tensor.collapse_shape {} {} : {} into {nty}", x.name, reassoc(g), x.ty()));
        let ty = ranked(to, x.dt);
        let name = if nty == ty { name } else { self.line(format!("tensor.cast {name} : {nty} to {ty}")) };
        Operand { name, shape: to.to_vec(), dt: x.dt }
    }

    fn expand(&mut self, x: &Operand, g: &[Vec<usize>], to: &[Dim]) -> Option<Operand> {
        // MLIR wants each source axis static exactly when its group of
        // result axes is: cast the source to that first where it differs.
        let want: Vec<Dim> = g
            .iter()
            .zip(&x.shape)
            .map(|(grp, d)| {
                let dims: Option<Vec<i64>> = grp.iter().map(|&i| to[i].as_const().filter(|&c| c >= 0)).collect();
                match dims {
                    Some(ds) => Dim::from(ds.iter().product::<i64>()),
                    None if d.as_const().is_some() => Dim::sym("?"),
                    None => d.clone(),
                }
            })
            .collect();
        let src = if ranked(&want, x.dt) == x.ty() {
            x.clone()
        } else {
            let name = self.line(format!("tensor.cast {} : {} to {}", x.name, x.ty(), ranked(&want, x.dt)));
            Operand { name, shape: want, dt: x.dt }
        };
        // Dynamic sizes are computed from the original's symbolic dims.
        let sizes = self.sizes(to, &[x])?;
        let x = &src;
        let ty = ranked(to, x.dt);
        let name = self.line(format!(
            "tensor.expand_shape {} {} output_shape [{}] : {} into {ty}",
            x.name,
            reassoc(g),
            sizes.join(", "),
            x.ty()
        ));
        Some(Operand { name, shape: to.to_vec(), dt: x.dt })
    }
}
