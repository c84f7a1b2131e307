//! Random ops as counter-based streams: the numbers are a pure function of
//! a key and the element, computed per element inside a `linalg.generic`.
//!
//! With the 64-bit SplitMix64 finalizer
//! `fin(z) = z₃`, where `z₁ = (z ^ z >> 30)·0xBF58476D1CE4E5B9`,
//! `z₂ = (z₁ ^ z₁ >> 27)·0x94D049BB133111EB`, `z₃ = z₂ ^ z₂ >> 31`
//! (logical shifts, products mod 2⁶⁴), and `γ = 0x9E3779B97F4A7C15`:
//!
//! 1. the node key `k` is the node's `seed` attribute (`Dropout`'s integer,
//!    as its two's-complement bits; a float seed by its value when it is an
//!    integer, else by its f32 bits). Without one it is [`DEFAULT_SEED`]
//!    xor the FNV-1a hash (64-bit) of the node name (of its first output's
//!    name for an unnamed node), so that two unseeded nodes draw different
//!    numbers;
//! 2. the function takes the offset `o` as its last argument,
//!    `%rng_offset: tensor<i64>` (a 0-d tensor like every other argument,
//!    read once with `tensor.extract` at the top of the function), added
//!    exactly when some node lowers to a draw below (a `Dropout` whose
//!    `training_mode` is a flag read at run time included); the stream key
//!    is `K = k ^ fin(o)`, `o` taken as its 64 bits (two's complement);
//! 3. element `n` of the output (its row-major index, from `linalg.index`)
//!    draws `z = fin(K + (n + 1)·γ)` — the `n`-th output of SplitMix64
//!    started at `K` — and its top `b` bits scaled by 2⁻ᵇ are the uniform
//!    draw `u` in [0, 1).
//!
//! All of it is `arith` on i64 in the module, so a runtime that must
//! reproduce the numbers (e.g. a hand-written backward pass) computes the
//! same three steps. The offset is the per-call stream selector: a
//! training loop passes the step number (or anything that differs between
//! the calls that must draw afresh); the same offset draws the same numbers
//! again. `fin` is a bijection with full avalanche, so distinct offsets give
//! keys that differ in about half their bits, and their streams are
//! unrelated stretches of SplitMix64's sequence, far apart (`K` is not
//! finalized again: step 3 finalizes `K + (n + 1)·γ`). `fin(0) = 0`, so
//! offset 0 draws the node key's own stream, `K = k`.
//!
//! Seeded nodes mix the offset too. ONNX calls a seeded random op
//! deterministic (one output per seed); here the output is determined by
//! the seed and the offset together, so a caller that holds the offset
//! fixed (0, say) gets ONNX's behaviour, while a training loop that
//! advances it does not repeat its dropout masks from step to step.
//!
//! - `Dropout` with `training_mode` true (a constant, or a flag read at run
//!   time with `tensor.extract`): mask = u ≥ ratio (u with 24 bits, compared
//!   in f32; the ratio a constant in [0, 1) or read at run time, default
//!   0.5), output = mask ? x / (1 − ratio) : 0. With `training_mode` absent
//!   or a constant false, or a constant ratio of 0, the output is the input
//!   and the mask (when asked for) all true.
//! - `RandomUniformLike` / `RandomUniform`: `low + u·(high − low)` computed
//!   in f32 (f64 for f64 outputs) and rounded to the output type, `u` with
//!   as many bits as that type's significand so that it is exact there.
//! - `RandomNormalLike` / `RandomNormal`: Box–Muller on one draw `z` per
//!   element, split into two uniforms exact in the compute type (f32, f64
//!   for f64 outputs): `u₁ = (z ≫ (64 − b) + 1)·2⁻ᵇ` in (0, 1] from the top
//!   `b` bits and `u₂ = ((z ≫ (32 − b)) & (2ᵇ − 1))·2⁻ᵇ` in [0, 1) from bits
//!   `32 − b … 31`, with `b` = 24 (f32) or 32 (f64); the value is
//!   `mean + scale·√(−2 ln u₁)·cos(2π u₂)`, rounded to the output type.
//! - `Bernoulli`: element `n` is 1 when `u < p[n]` (the input's
//!   probability; `u` with 24 bits compared in f32, 53 in f64 for f64
//!   inputs), else 0, in the output type (the `dtype` attribute, else the
//!   input's).
//! - `Multinomial`: sample `s` of batch row `b` inverts the row's CDF.
//!   The row's weights are `e_c = exp(x_c − max x)` and its running sums
//!   `S_c = e_0 + … + e_c` (an `scf.for` scan, as `CumSum`), computed in
//!   f32 (f64 for f64 inputs); with `u` the draw of output element
//!   `n = b·sample_size + s` (24 bits, 53 for f64) and `T = u·Σ e` (a
//!   separate reduction), the sample is the number of classes whose `S_c
//!   ≤ T` — the first class whose running sum exceeds `T` — capped at the
//!   last class, in the `dtype` attribute's type (int32 by default).

use qsync_ir::{Attr, DType, Node, Op, ValueId};

use super::build::{float_lit, Body, Operand};
use super::{elem, float_width, is_float, Emitter};

/// The key of an unseeded node, before its name is mixed in.
const DEFAULT_SEED: u64 = 0x5153_594E_435F_524E;

/// SplitMix64's increment and finalizer multipliers.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const MIX: [u64; 2] = [0xBF58_476D_1CE4_E5B9, 0x94D0_49BB_1331_11EB];

/// The stream key of a node: its seed, or the default mixed with `label`
/// (its name, unique in the graph where the model names its nodes).
fn key(node: &Node, label: &str) -> u64 {
    match node.attr("seed") {
        Some(Attr::Int(i)) => *i as u64,
        Some(Attr::Float(f)) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e18 => *f as i64 as u64,
        Some(Attr::Float(f)) => u64::from(f.to_bits()),
        _ => {
            let fnv = label
                .bytes()
                .fold(0xCBF2_9CE4_8422_2325u64, |h, c| (h ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01B3));
            DEFAULT_SEED ^ fnv
        }
    }
}

/// An i64 literal of the bits of `v`.
fn i64_lit(v: u64) -> String {
    (v as i64).to_string()
}

/// SplitMix64's finalizer `fin` on the i64 value `z`.
fn finalize(b: &mut Body, mut z: String) -> String {
    for (shift, mul) in [(30, Some(MIX[0])), (27, Some(MIX[1])), (31, None)] {
        let s = b.cst(&i64_lit(shift), DType::I64);
        let h = b.bin("shrui", &z, &s, DType::I64);
        z = b.bin("xori", &z, &h, DType::I64);
        if let Some(m) = mul {
            let m = b.cst(&i64_lit(m), DType::I64);
            z = b.bin("muli", &z, &m, DType::I64);
        }
    }
    z
}

/// The function argument that selects the streams of a call.
pub(super) const OFFSET_ARG: &str = "%rng_offset";

/// The offset argument's declaration in the function signature.
pub(super) fn offset_param() -> String {
    format!("{OFFSET_ARG}: tensor<i64> {{qsync.name = \"rng_offset\", qsync.rng_offset}}")
}

/// The offset argument as the lowerings use it: read and mixed once at the
/// top of the function (`fin(o)`), when some lowered node draws.
pub(super) struct Offset {
    /// Lines computing `mixed` from the argument.
    prologue: Vec<String>,
    /// The i64 value `fin(o)`.
    mixed: String,
    /// Whether a node kept in the module reads `mixed`.
    pub used: bool,
    /// Whether the node being lowered reads it.
    pub pending: bool,
}

impl Offset {
    pub fn new() -> Offset {
        let mut b = Body::named("rng");
        let o = b.op(format!("tensor.extract {OFFSET_ARG}[] : tensor<i64>"));
        let mixed = finalize(&mut b, o);
        Offset { prologue: b.into_lines(), mixed, used: false, pending: false }
    }

    /// The lines that read and mix the offset.
    pub fn prologue(&self) -> &[String] {
        &self.prologue
    }
}

/// The row-major index of the loop point over axes of `sizes` (index
/// values), as i64.
fn linear_index(b: &mut Body, sizes: &[String]) -> String {
    let mut at = match sizes.is_empty() {
        true => b.op("arith.constant 0 : index"),
        false => b.op("linalg.index 0 : index"),
    };
    for (i, s) in sizes.iter().enumerate().skip(1) {
        let li = b.op(format!("linalg.index {i} : index"));
        let t = b.op(format!("arith.muli {at}, {s} : index"));
        at = b.op(format!("arith.addi {t}, {li} : index"));
    }
    b.op(format!("arith.index_cast {at} : index to i64"))
}

/// The 64-bit draw of element `n` (i64) under the stream key `key` (an i64
/// value defined outside the body): `fin(K + (n + 1)·γ)`.
fn draw(b: &mut Body, n: &str, key: &str) -> String {
    let one = b.cst("1", DType::I64);
    let n1 = b.bin("addi", n, &one, DType::I64);
    let g = b.cst(&i64_lit(GAMMA), DType::I64);
    let step = b.bin("muli", &n1, &g, DType::I64);
    let z = b.bin("addi", &step, key, DType::I64);
    finalize(b, z)
}

/// `v` (a non-negative i64 below 2^`bits`) scaled by 2^−`bits`, as `ft`.
fn scaled(b: &mut Body, v: &str, bits: u32, ft: DType) -> String {
    let f = b.op(format!("arith.uitofp {v} : i64 to {}", elem(ft)));
    let scale = b.cst(&float_lit(2f64.powi(-(bits as i32)), ft), ft);
    b.bin("mulf", &f, &scale, ft)
}

/// The uniform draw in [0, 1) of element `n` (i64) under the stream key
/// `key`: the top `bits` bits of its draw as float type `ft`.
fn uniform(b: &mut Body, n: &str, key: &str, bits: u32, ft: DType) -> String {
    let z = draw(b, n, key);
    let s = b.cst(&i64_lit(u64::from(64 - bits)), DType::I64);
    let top = b.bin("shrui", &z, &s, DType::I64);
    scaled(b, &top, bits, ft)
}

/// Two uniforms from the draw of element `n` (see the module doc):
/// `(u₁ ∈ (0, 1], u₂ ∈ [0, 1))` as `ft`, `bits` each.
fn uniform_pair(b: &mut Body, n: &str, key: &str, bits: u32, ft: DType) -> (String, String) {
    let z = draw(b, n, key);
    let s = b.cst(&i64_lit(u64::from(64 - bits)), DType::I64);
    let top = b.bin("shrui", &z, &s, DType::I64);
    let one = b.cst("1", DType::I64);
    let top1 = b.bin("addi", &top, &one, DType::I64);
    let u1 = scaled(b, &top1, bits, ft);
    let s2 = b.cst(&i64_lit(u64::from(32 - bits)), DType::I64);
    let mid = b.bin("shrui", &z, &s2, DType::I64);
    let mask = b.cst(&i64_lit((1u64 << bits) - 1), DType::I64);
    let low = b.bin("andi", &mid, &mask, DType::I64);
    let u2 = scaled(b, &low, bits, ft);
    (u1, u2)
}

/// Significand bits of a float type (the implicit one included).
fn significand(dt: DType) -> u32 {
    match dt {
        DType::F64 => 53,
        DType::F32 => 24,
        DType::F16 => 11,
        _ => 8,
    }
}

/// How `Dropout` runs: decided when emitting, or by a flag read at run time.
enum Mode {
    Inference,
    Training,
    Flag(String),
}

/// `Dropout`'s ratio: a constant, or a scalar of a float type read at run time.
enum Ratio {
    Const(f64),
    Read(String, DType),
}

impl Emitter<'_> {
    pub(super) fn random(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        match node.op {
            Op::Dropout => self.dropout(node, outs),
            Op::RandomNormal | Op::RandomNormalLike => self.normal_op(node, outs),
            Op::Bernoulli => self.bernoulli(node, outs),
            Op::Multinomial => self.multinomial(node, outs),
            _ => self.uniform_op(node, outs),
        }
    }

    fn dropout(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        if shape != x.shape || dt != x.dt || !is_float(dt) || outs.len() > 2 {
            return None;
        }
        let mask_dt = match outs.get(1) {
            Some(&o) => {
                let (s, d) = self.out_type(o)?;
                (s == shape).then_some(Some(d))?
            }
            None => None,
        };
        let mode = match node.input(2) {
            None => Mode::Inference,
            Some(v) => match self.const_ints(v).as_deref() {
                Some([0]) => Mode::Inference,
                Some([_]) => Mode::Training,
                Some(_) => return None,
                None => {
                    let t = self.operand(v)?;
                    (t.rank() == 0 && t.dt == DType::Bool).then_some(())?;
                    Mode::Flag(self.line(format!("tensor.extract {}[] : {}", t.name, t.ty())))
                }
            },
        };
        if matches!(mode, Mode::Inference) {
            return self.forward(&x, mask_dt);
        }
        let ratio = match node.input(1) {
            None => Ratio::Const(0.5),
            Some(v) => match self.const_f64(v) {
                Some(0.0) => return self.forward(&x, mask_dt),
                Some(r) if (0.0..1.0).contains(&r) => Ratio::Const(r),
                Some(_) => return None,
                None => {
                    let t = self.operand(v)?;
                    (t.rank() == 0 && is_float(t.dt)).then_some(())?;
                    Ratio::Read(self.line(format!("tensor.extract {}[] : {}", t.name, t.ty())), t.dt)
                }
            },
        };
        if mask_dt.is_some_and(|d| d != DType::Bool) {
            return None;
        }
        // The ratio as f32 for the comparison, and 1 − ratio in x's type: as
        // literals, or computed once from the value read.
        let (r32, den) = match &ratio {
            Ratio::Const(r) => (float_lit(f64::from(*r as f32), DType::F32), float_lit(1.0 - r, dt)),
            Ratio::Read(r, rt) => {
                let r32 = self.convert(r, *rt, DType::F32);
                let one = self.scalar("1.0", elem(*rt));
                let d = self.line(format!("arith.subf {one}, {r} : {}", elem(*rt)));
                (r32, self.convert(&d, *rt, dt))
            }
        };
        let read = matches!(ratio, Ratio::Read(..));
        let flag = match &mode {
            Mode::Flag(f) => {
                let t = self.scalar("true", "i1");
                Some((f.clone(), self.line(format!("arith.xori {f}, {t} : i1"))))
            }
            _ => None,
        };
        let sizes = shape.iter().map(|d| self.dim(d, &[&x])).collect::<Option<Vec<_>>>()?;
        let init = self.empty(&shape, DType::Bool, &[&x])?;
        let id: Vec<String> = (0..shape.len()).map(|i| format!("d{i}")).collect();
        let iters = vec!["parallel"; shape.len()];
        let k = self.stream_key(node, outs);
        let off = flag.as_ref().map(|(_, off)| off.clone());
        let mask = self.generic_op(&[], &init, &id, &iters, |b, _| {
            let n = linear_index(b, &sizes);
            let u = uniform(b, &n, &k, 24, DType::F32);
            let r = if read { r32.clone() } else { b.cst(&r32, DType::F32) };
            let keep = b.op(format!("arith.cmpf oge, {u}, {r} : f32"));
            match &off {
                Some(off) => b.bin("ori", &keep, off, DType::Bool),
                None => keep,
            }
        });
        let on = flag.map(|(on, _)| on);
        let y = self.ewise(&[&x, &mask], &shape, dt, |b, a| {
            let s = if read { den.clone() } else { b.cst(&den, dt) };
            let kept = b.bin("divf", &a[0], &s, dt);
            let kept = match &on {
                Some(on) => b.op(format!("arith.select {on}, {kept}, {} : {}", a[0], elem(dt))),
                None => kept,
            };
            let zero = b.cst("0.0", dt);
            b.op(format!("arith.select {}, {kept}, {zero} : {}", a[1], elem(dt)))
        })?;
        let mut names = vec![y.name];
        if mask_dt.is_some() {
            names.push(mask.name);
        }
        Some(names)
    }

    /// Dropout that keeps everything: the input, and an all-true mask when
    /// one is asked for (of the mask's type, which was `T` before opset 10).
    fn forward(&mut self, x: &Operand, mask_dt: Option<DType>) -> Option<Vec<String>> {
        let mut names = vec![x.name.clone()];
        if let Some(md) = mask_dt {
            let lit = match md {
                DType::Bool => "true",
                d if is_float(d) => "1.0",
                _ => "1",
            };
            names.push(self.filled(lit, &x.shape, md, &[x])?.name);
        }
        Some(names)
    }

    /// The draws of `RandomXLike` (the shape of its input) and `RandomX`
    /// (a static `shape`): one float output of any float type, each element
    /// `value(body, n, K)` from its linear index `n` and the stream key `K`
    /// (i64 values), computed in `ct` (f64 for f64 outputs, else f32) and
    /// rounded to the output type.
    fn draws(
        &mut self,
        node: &Node,
        outs: &[ValueId],
        value: impl FnOnce(&mut Body, &str, &str, DType, DType) -> String,
    ) -> Option<Vec<String>> {
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let like = self.optional_operand(node.input(0))?;
        if outs.len() != 1 || !is_float(dt) || like.as_ref().is_some_and(|x| x.shape != shape) {
            return None;
        }
        let hints: Vec<&Operand> = like.iter().collect();
        let ct = if dt == DType::F64 { DType::F64 } else { DType::F32 };
        let sizes = shape.iter().map(|d| self.dim(d, &hints)).collect::<Option<Vec<_>>>()?;
        let init = self.empty(&shape, dt, &hints)?;
        let id: Vec<String> = (0..shape.len()).map(|i| format!("d{i}")).collect();
        let iters = vec!["parallel"; shape.len()];
        let k = self.stream_key(node, outs);
        let out = self.generic_op(&[], &init, &id, &iters, |b, _| {
            let n = linear_index(b, &sizes);
            let v = value(b, &n, &k, ct, dt);
            b.convert(&v, ct, dt)
        });
        Some(vec![out.name])
    }

    /// `RandomUniformLike` / `RandomUniform`: `low + u·(high − low)`.
    fn uniform_op(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let low = f64::from(node.attr_float("low").unwrap_or(0.0));
        let high = f64::from(node.attr_float("high").unwrap_or(1.0));
        self.draws(node, outs, |b, n, k, ct, dt| {
            let u = uniform(b, n, k, significand(dt), ct);
            let span = b.cst(&float_lit(high - low, ct), ct);
            let lo = b.cst(&float_lit(low, ct), ct);
            let m = b.bin("mulf", &u, &span, ct);
            b.bin("addf", &m, &lo, ct)
        })
    }

    /// `RandomNormalLike` / `RandomNormal`: Box–Muller, see the module doc.
    fn normal_op(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let mean = f64::from(node.attr_float("mean").unwrap_or(0.0));
        let scale = f64::from(node.attr_float("scale").unwrap_or(1.0));
        self.draws(node, outs, |b, n, k, ct, _| {
            let t = elem(ct);
            let bits = if ct == DType::F64 { 32 } else { 24 };
            let (u1, u2) = uniform_pair(b, n, k, bits, ct);
            let ln = b.op(format!("math.log {u1} : {t}"));
            let m2 = b.cst(&float_lit(-2.0, ct), ct);
            let r2 = b.bin("mulf", &ln, &m2, ct);
            let r = b.op(format!("math.sqrt {r2} : {t}"));
            let tau = b.cst(&float_lit(std::f64::consts::TAU, ct), ct);
            let angle = b.bin("mulf", &u2, &tau, ct);
            let c = b.op(format!("math.cos {angle} : {t}"));
            let g = b.bin("mulf", &r, &c, ct);
            let sc = b.cst(&float_lit(scale, ct), ct);
            let mu = b.cst(&float_lit(mean, ct), ct);
            let v = b.bin("mulf", &g, &sc, ct);
            b.bin("addf", &v, &mu, ct)
        })
    }

    /// `Bernoulli`: 1 where a uniform draw falls below the input's
    /// probability, else 0, in the output's type.
    fn bernoulli(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let p = self.operand(node.input(0)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        if outs.len() != 1 || !is_float(p.dt) || p.shape != shape {
            return None;
        }
        let (one, zero) = match dt {
            DType::Bool => ("true", "false"),
            d if is_float(d) => ("1.0", "0.0"),
            d if d.is_int() => ("1", "0"),
            _ => return None,
        };
        let (ct, bits) = if p.dt == DType::F64 { (DType::F64, 53) } else { (DType::F32, 24) };
        let sizes = shape.iter().map(|d| self.dim(d, &[&p])).collect::<Option<Vec<_>>>()?;
        let init = self.empty(&shape, dt, &[&p])?;
        let id: Vec<String> = (0..shape.len()).map(|i| format!("d{i}")).collect();
        let iters = vec!["parallel"; shape.len()];
        let k = self.stream_key(node, outs);
        let pdt = p.dt;
        let out = self.generic_op(&[(&p, id.clone())], &init, &id, &iters, |b, a| {
            let n = linear_index(b, &sizes);
            let u = uniform(b, &n, &k, bits, ct);
            let pc = b.convert(&a[0], pdt, ct);
            let hit = b.op(format!("arith.cmpf olt, {u}, {pc} : {}", elem(ct)));
            let (o, z) = (b.cst(one, dt), b.cst(zero, dt));
            b.op(format!("arith.select {hit}, {o}, {z} : {}", elem(dt)))
        });
        Some(vec![out.name])
    }

    /// `Multinomial`: inverse-CDF sampling per row, see the module doc.
    fn multinomial(&mut self, node: &Node, outs: &[ValueId]) -> Option<Vec<String>> {
        let x = self.operand(node.input(0)?)?;
        let (shape, dt) = self.out_type(*outs.first()?)?;
        let samples = node.attr_int("sample_size").unwrap_or(1);
        if outs.len() != 1
            || x.rank() != 2
            || !is_float(x.dt)
            || !matches!(dt, DType::I32 | DType::I64)
            || shape.len() != 2
            || shape[0] != x.shape[0]
            || shape[1].as_const() != Some(samples)
        {
            return None;
        }
        let (ct, bits) = if x.dt == DType::F64 { (DType::F64, 53) } else { (DType::F32, 24) };
        let t = elem(ct);
        let xc = self.converted(&x, ct)?;
        let ninf = float_lit(f64::NEG_INFINITY, ct);
        let max =
            self.reduce(&xc, &[1], true, &ninf, ct, |b, e, acc| b.op(format!("arith.maximumf {e}, {acc} : {t}")))?;
        let row = xc.shape.clone();
        let weights = self.ewise(&[&xc, &max], &row, ct, |b, a| {
            let d = b.bin("subf", &a[0], &a[1], ct);
            b.op(format!("math.exp {d} : {t}"))
        })?;
        let cdf = self.scan(&weights, 1, false, false)?;
        let total = self.reduce(&weights, &[1], true, "0.0", ct, |b, e, acc| b.bin("addf", e, acc, ct))?;
        let sizes = shape.iter().map(|d| self.dim(d, &[&x])).collect::<Option<Vec<_>>>()?;
        let classes = self.dim(&x.shape[1].clone(), &[&x])?;
        let classes = self.line(format!("arith.index_cast {classes} : index to i64"));
        let one = self.scalar("1", "i64");
        let last = self.line(format!("arith.subi {classes}, {one} : i64"));
        let k = self.stream_key(node, outs);
        let id = vec!["d0".to_string(), "d1".to_string()];
        let init = self.empty(&shape, ct, &[&x])?;
        let target = self.generic_op(
            &[(&total, vec!["d0".into(), "0".into()])],
            &init,
            &id,
            &["parallel", "parallel"],
            |b, a| {
                let n = linear_index(b, &sizes);
                let u = uniform(b, &n, &k, bits, ct);
                b.bin("mulf", &u, &a[0], ct)
            },
        );
        let zeros = self.filled("0", &shape, DType::I64, &[&x])?;
        let below = self.generic_op(
            &[(&cdf, vec!["d0".into(), "d2".into()]), (&target, id.clone())],
            &zeros,
            &id,
            &["parallel", "parallel", "reduction"],
            |b, a| {
                let le = b.op(format!("arith.cmpf ole, {}, {} : {t}", a[0], a[1]));
                let (one, zero) = (b.cst("1", DType::I64), b.cst("0", DType::I64));
                let inc = b.op(format!("arith.select {le}, {one}, {zero} : i64"));
                b.bin("addi", &a[2], &inc, DType::I64)
            },
        );
        let out = self.ewise(&[&below], &shape, dt, |b, a| {
            let capped = b.op(format!("arith.minsi {}, {last} : i64", a[0]));
            match dt {
                DType::I32 => b.op(format!("arith.trunci {capped} : i64 to i32")),
                _ => capped,
            }
        })?;
        Some(vec![out.name])
    }

    /// The stream key of `node`; an unnamed node is told apart by the name
    /// of its first output.
    fn key(&self, node: &Node, outs: &[ValueId]) -> u64 {
        match (node.name.is_empty(), outs.first()) {
            (true, Some(&o)) => key(node, self.g.value_name(o)),
            _ => key(node, &node.name),
        }
    }

    /// The stream key `K = k ^ fin(o)` of `node` at run time (the node's
    /// key xor the mixed offset); the function then takes the offset.
    fn stream_key(&mut self, node: &Node, outs: &[ValueId]) -> String {
        let k = self.key(node, outs);
        let c = self.scalar(&i64_lit(k), "i64");
        self.rng.pending = true;
        let mixed = self.rng.mixed.clone();
        self.line(format!("arith.xori {c}, {mixed} : i64"))
    }

    /// A float scalar converted between types (through f32 between the
    /// two 16-bit types).
    fn convert(&mut self, v: &str, from: DType, to: DType) -> String {
        if from == to {
            return v.to_string();
        }
        if float_width(from) == 16 && float_width(to) == 16 {
            let w = self.convert(v, from, DType::F32);
            return self.convert(&w, DType::F32, to);
        }
        let op = if float_width(to) > float_width(from) { "arith.extf" } else { "arith.truncf" };
        self.line(format!("{op} {v} : {} to {}", elem(from), elem(to)))
    }
}
