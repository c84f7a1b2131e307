//! A planned graph as MLIR: one `func.func @<graph>` whose results are the
//! graph outputs.
//!
//! Function signature: the arguments are the graph inputs, then the
//! initializers (weights stay outside the module), each tagged
//! `{qsync.name = "<value name>"}`; then, only when the module draws random
//! numbers (a lowered training-mode `Dropout`, `RandomUniform(Like)`,
//! `RandomNormal(Like)`, `Bernoulli` or `Multinomial`), one trailing `%rng_offset: tensor<i64>` tagged
//! `{qsync.name = "rng_offset", qsync.rng_offset}` ([`MlirOutput::rng_offset`]
//! says whether it is there). It selects the random streams of the call: a
//! training loop passes a different value each step (the step number, say)
//! so that dropout masks change, and the same value draws the same numbers
//! again; how it enters each node's stream is documented in `random.rs`.
//!
//! Lowering, node by node in schedule order:
//! - `Cast` between float types → `arith.extf`/`arith.truncf`, float ↔ int →
//!   `arith.sitofp`/`uitofp`/`fptosi`/`fptoui`, other casts → `tosa.cast`;
//! - `Add`/`Sub`/`Mul`/`Div` on float tensors of one type → `arith.*f`;
//!   `Add`/`Sub` that broadcast at equal rank → `tosa.add`/`tosa.sub`;
//! - unary ops with a one-operand tosa twin (`Relu` as `tosa.clamp`, `Tanh`,
//!   `Sigmoid`, `Exp`, `Log`, `Abs`, `Erf`, `Reciprocal`, `Identity`,
//!   `Transpose`) → that tosa op;
//! - `Conv` (1 to 3 spatial axes, NC…, float) → `tensor.pad` (explicit
//!   `pads` or `SAME_*`) and `linalg.conv_1d_ncw_fcw` /
//!   `conv_2d_nchw_fchw` / `conv_3d_ncdhw_fcdhw` with `strides`/`dilations`,
//!   accumulating into the bias (`linalg.broadcast`) or zeros
//!   (`linalg.fill`); grouped (`group > 1`,
//!   depthwise included) → `tensor.expand_shape` to N×G×C/G×… and
//!   G×F/G×C/G×k…, `linalg.conv_2d_ngchw_gfchw` (2-D) or a contracting
//!   `linalg.generic` (1-D, 3-D: no named op), `tensor.collapse_shape` back;
//!   like every contraction below, f16/bf16 operands accumulate in f32 (see
//!   the note after this list);
//! - `ConvTranspose` (explicit `pads`, `VALID`, or pads split from the total
//!   padding `s·(in − 1) + output_padding + (k − 1)·d + 1 − out` for
//!   `output_shape` or `SAME_*` — where `out` is `in·s` — with
//!   `SAME_UPPER` putting the odd one at the end, `SAME_LOWER` and `NOTSET`
//!   at the beginning, as ONNX defines; static spatial sizes; any
//!   strides, dilations, `output_padding`, group) → the input inserted with
//!   strides into zeros that hold the padding (`tensor.insert_slice`), the
//!   kernel flipped with its channel axes swapped (a copying
//!   `linalg.generic`), and a contracting `linalg.generic` over the groups
//!   (accumulating like `Conv`);
//! - `MaxPool` → `tensor.pad` with −∞ (explicit pads plus what `ceil_mode`
//!   needs) and `linalg.pooling_nchw_max` over a `tensor.empty` window;
//!   with its `Indices` output (int64, row-major into the unpadded input,
//!   or column-major per plane for `storage_order = 1`) → one reducing
//!   `linalg.generic` carrying (value, index), ties going to the first
//!   maximum in window order as in onnxruntime (see `nn.rs`);
//!   `AveragePool` → `linalg.pooling_nchw_sum` divided by the window size,
//!   or, when pads do not count or `ceil_mode` adds some, by the window sums
//!   of a padded ones tensor (a second `linalg.pooling_nchw_sum`); windows
//!   of f16/bf16 sum in f32 and the mean rounds once. Over 1 or 3 spatial
//!   axes (N×C×L, N×C×D×H×W) both, and MaxPool's `Indices` over any number,
//!   are one reducing `linalg.generic` over N×C×out×window instead (MaxPool
//!   by `arith.maximumf`; AveragePool carrying the sum and the count of
//!   counted window positions, then dividing); `LpPool` (any rank) → the
//!   same form summing `|x|^p`, then the `p`-th root;
//! - `GlobalAveragePool`/`GlobalMaxPool`, `ReduceSum`/`ReduceMean`/
//!   `ReduceMax`/`ReduceMin` (float; axes from the attribute or a constant
//!   input) → a reducing `linalg.generic` (keepdims through a constant
//!   index in the output map); sums of f16/bf16 accumulate in f32 and round
//!   once, means divide by the element count (`tensor.dim` when symbolic);
//! - `Gemm` → `linalg.matmul` (transposes as `indexing_maps`) accumulating
//!   into β·C broadcast by a `linalg.generic`, `alpha` applied after (in
//!   f32 for f16/bf16, rounded once in the same `linalg.generic`);
//! - `Flatten`/`Reshape`/`Squeeze`/`Unsqueeze` (to the inferred output
//!   shape) → one `tensor.collapse_shape` or `tensor.expand_shape` when the
//!   axes group, else a collapse to one axis and an expand;
//! - `Concat` → `tensor.concat`;
//! - `Pad` (axes constant or absent) in constant mode → `tensor.pad`, its
//!   amounts and fill value constants or computed at run time (read with
//!   `tensor.extract`; negative amounts crop, by a `tensor.extract_slice`
//!   after padding by the positive parts); `edge`/`reflect`/`wrap` → a
//!   `linalg.generic` over the output reading the input with
//!   `tensor.extract` at a clamped, mirrored or wrapped index;
//! - `BatchNormalization` → one elementwise `linalg.generic` computing
//!   `(x − mean)/sqrt(var + ε)·scale + B` (`math.sqrt`); with
//!   `training_mode = 1` the batch mean and variance are reductions first and
//!   the running statistics, when asked for, are momentum updates;
//! - `MatMul` (float, rank ≥ 2) → `linalg.matmul` when the right operand is
//!   2-D (the left one's leading axes folded into rows by
//!   `tensor.collapse_shape`, unfolded after), `linalg.batch_matmul` when the
//!   batch axes are equal (folded into one), else a contracting
//!   `linalg.generic` that broadcasts the batch axes; all accumulate in f32
//!   for f16/bf16 operands;
//! - `Softmax` → `linalg.softmax` over its axis (from opset 13, any
//!   axis); before opset 13, over the block from `axis` (default 1) on,
//!   collapsed into one axis around it (`tensor.collapse_shape`/
//!   `expand_shape`); `LogSoftmax` over the same axes → reductions
//!   (`x − max`, minus the log of the sum of its exponentials); both
//!   compute in f32 for 16-bit floats and round once. The opset comes from the model ([`emit_mlir_model`]);
//!   where it is unknown ([`emit_mlir`]) only the axes on which every opset
//!   agrees lower: an `axis` naming the last axis, or none at rank ≤ 2;
//! - `LayerNormalization` → mean and variance as reducing `linalg.generic`s
//!   (in f32 for 16-bit inputs unless `stash_type = 0`), then one
//!   elementwise `linalg.generic` applying `math.sqrt`, scale and bias;
//! - `Gather` (i32/i64 indices, negative ones wrapped) → a `linalg.generic`
//!   over the output reading the data with `tensor.extract`;
//! - other elementwise ops under numpy broadcasting → one `linalg.generic`
//!   with an `arith`/`math` body: `Add`/`Sub`/`Mul`/`Div` (float or int),
//!   `Pow` (`math.powf`), `Max`/`Min` (float or int), `Abs` on signed
//!   ints, `Mod` (integers with `fmod = 0`: `arith.remsi` plus the divisor
//!   when the signs differ, so the result has the divisor's sign; with
//!   `fmod = 1` the dividend's: `arith.remsi`, or `arith.remf` on floats;
//!   unsigned: `arith.remui`; a zero divisor is undefined, as in ONNX),
//!   `And`/`Or`/`Xor`/`Not` on bools,
//!   `Equal`/`Less`/`LessOrEqual`/`Greater`/`GreaterOrEqual` (`arith.cmpf`/
//!   `cmpi`), `Where` (`arith.select`), `IsNaN`, and the float unaries
//!   `Sqrt`, `Erf`, `Exp`, `Log`, `Tanh`, `Abs`, `Floor`, `Ceil`, `Sin`,
//!   `Cos`, `Neg`, `Reciprocal`, `Sigmoid`, `Relu` when the tosa forms above
//!   do not apply, `Gelu` (exact with `math.erf`, or the tanh form), and
//!   `HardSigmoid` / `HardSwish` (clamps of `αx + β`); `Identity`
//!   forwards its input;
//! - `Dropout` whose `training_mode` is absent or a constant false (or whose
//!   ratio is a constant 0) forwards its input, its mask an all-true
//!   constant; in training (`training_mode` a constant true, or a flag read
//!   at run time) → a `linalg.generic` drawing each element's uniform
//!   number from a counter-based hash (SplitMix64 over the `linalg.index`
//!   linear index, the `seed` and the `rng_offset` argument) for the mask
//!   `u ≥ ratio`, and one selecting `x / (1 − ratio)` or 0;
//!   `RandomUniformLike`/`RandomUniform` → `low + u·(high − low)` from the
//!   same stream, `RandomNormalLike`/`RandomNormal` → Box–Muller on one
//!   draw split in two uniforms, `Bernoulli` → `u < p`, `Multinomial` →
//!   per row the first class whose running sum of `exp(x − max)` exceeds
//!   `u·Σ` (see `random.rs`);
//! - `Constant` (inline `value`/`value_*`) → `arith.constant dense<…>`;
//!   `ConstantOfShape` → a splat constant, or `tensor.empty` + `linalg.fill`
//!   for dynamic shapes; `Shape` → a constant, or `tensor.dim`s gathered by
//!   `tensor.from_elements`; `Range` → a `linalg.generic` of `linalg.index`
//!   (its length computed when symbolic); `Expand` → a broadcasting
//!   `linalg.generic`;
//! - `Slice` (constant nonzero steps, constant axes; starts constant or
//!   computed, wrapped and clamped in `index` arithmetic) and `Split` →
//!   `tensor.extract_slice` sized by the inferred outputs; a `Slice` with a
//!   negative step → a `linalg.generic` reading `start + i·step` with
//!   `tensor.extract`;
//!   `GatherElements` and `GatherND` (`batch_dims = 0`) → a
//!   `linalg.generic` reading with `tensor.extract`;
//! - `CumSum` (constant axis, negative allowed; `exclusive`, `reverse`) →
//!   an `scf.for` along the axis carrying the output and the running sum (a
//!   slice of size 1 on the axis): per step a `tensor.extract_slice` of the
//!   input, an adding `linalg.generic` and a `tensor.insert_slice`, O(n)
//!   per scan line; sums accumulate in the element type, f16/bf16
//!   included, as ONNX does;
//! - `ScatterND` (any `reduction`) → an `scf.for` over the update rows
//!   carrying the data: each row's index tuple read with `tensor.extract`
//!   and wrapped, its update written with `tensor.insert` (whole tuples) or
//!   `tensor.insert_slice`, combined first with the old value or slice
//!   (`arith` op, `linalg.generic`) for `add`/`mul`/`max`/`min`;
//! - anything else (e.g. `Softmax`/`LogSoftmax` over an inner axis when
//!   the opset is unknown) — or any node whose
//!   types are not fully known, or whose shape or attributes a lowering
//!   above does not cover — → a
//!   generic `"qsync.<op>"` operation carrying the ONNX op type, the node
//!   name, its precision and its scalar/list attributes. Those are listed
//!   in [`MlirOutput::generic_ops`], and the module then verifies only with
//!   unregistered dialects allowed (`mlir-opt --allow-unregistered-dialect`).
//!
//! Contractions (`Conv`, `ConvTranspose`, `Gemm`, `MatMul`) over f16/bf16
//! accumulate in f32 and round once to the output type, as GPU libraries do
//! (cuBLAS/cuDNN with an f32 compute type, Tensor Cores): the accumulator —
//! zeros from `linalg.fill`, the broadcast bias, β·C — is an f32 tensor, the
//! named ops extend their 16-bit inputs to it, the contracting
//! `linalg.generic`s do so with `arith.extf` in the body, and the sum (with
//! Gemm's α applied) is rounded by one elementwise `linalg.generic` of
//! `arith.truncf`. f32/f64 operands accumulate in their own type.
//!
//! Symbolic sizes (`batch`) are dynamic (`?`) dims; where an op needs their
//! values (`tensor.empty`, `tensor.expand_shape`, counts) they are read with
//! `tensor.dim` from an operand of that size or from the argument the symbol
//! comes from. The named convolution, pooling and matmul ops carry the
//! node's `qsync.name` and `qsync.precision` as discardable attributes.
//!
//! The text is built here and handed to MLIR through melior, which parses
//! and verifies it in-process; the printed module is what MLIR printed.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use melior::ir::operation::OperationLike;
use melior::ir::Module;
use melior::utility::register_all_dialects;
use melior::Context;
use qsync_ir::{Attr, DType, Graph, Model, Op, TensorType, ValueId};

use crate::CodegenError;

mod build;
mod conv;
mod nn;
mod pad;
mod random;
mod scatter;
mod shapeops;
mod tensorops;

/// The emitted module and what it needed.
#[derive(Debug, Clone)]
pub struct MlirOutput {
    /// The verified module as MLIR printed it.
    pub text: String,
    /// Op types emitted as generic `qsync.*` operations, with counts.
    pub generic_ops: BTreeMap<String, usize>,
    /// Whether the function takes the trailing `rng_offset: tensor<i64>`
    /// argument (some node draws random numbers).
    pub rng_offset: bool,
}

impl MlirOutput {
    /// Whether the module verifies without `--allow-unregistered-dialect`.
    pub fn all_ops_mapped(&self) -> bool {
        self.generic_ops.is_empty()
    }

    /// A one-line warning naming the generic ops, if any.
    pub fn warning(&self) -> Option<String> {
        if self.generic_ops.is_empty() {
            return None;
        }
        let list: Vec<String> = self.generic_ops.iter().map(|(k, v)| format!("{k}×{v}")).collect();
        Some(format!(
            "{} op type(s) have no linalg/tosa/arith lowering and were emitted as generic qsync.* operations: {}",
            list.len(),
            list.join(", ")
        ))
    }
}

fn elem(d: DType) -> &'static str {
    match d {
        DType::F64 => "f64",
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F8E4M3 => "f8E4M3FN",
        DType::F8E5M2 => "f8E5M2",
        DType::F8E4M3Fnuz => "f8E4M3FNUZ",
        DType::F8E5M2Fnuz => "f8E5M2FNUZ",
        DType::F4E2M1 => "f4E2M1FN",
        DType::F8E8M0 => "f8E8M0FNU",
        DType::I64 | DType::U64 => "i64",
        DType::I32 | DType::U32 => "i32",
        DType::I16 | DType::U16 => "i16",
        DType::I8 | DType::U8 => "i8",
        DType::I4 | DType::U4 => "i4",
        DType::I2 | DType::U2 => "i2",
        DType::Bool => "i1",
        DType::Str => "!qsync.string",
    }
}

/// `tensor<?x4xf32>`; unknown rank `tensor<*x…>`; unknown dtype `!qsync.unknown`.
fn tensor_type(t: &TensorType) -> String {
    let Some(d) = t.dtype else { return "!qsync.unknown".into() };
    match &t.shape {
        None => format!("tensor<*x{}>", elem(d)),
        Some(s) => build::ranked(s, d),
    }
}

/// Fully typed: known dtype (not a string) and known rank.
fn plain(t: &TensorType) -> bool {
    t.shape.is_some() && t.dtype.is_some_and(|d| d != DType::Str)
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
}

fn float_width(d: DType) -> u32 {
    match d {
        DType::F64 => 64,
        DType::F32 => 32,
        _ => 16,
    }
}

/// An MLIR string literal.
/// An ONNX axis (negative counts from the end) as an index into `rank`
/// axes; `None` when out of range.
fn axis_index(axis: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    (-r..r).contains(&axis).then(|| axis.rem_euclid(r) as usize)
}

fn quote(s: &[u8]) -> String {
    let mut out = String::from("\"");
    for &b in s {
        match b {
            b'"' | b'\\' => write!(out, "\\{b:02X}").ok(),
            0x20..=0x7e => write!(out, "{}", b as char).ok(),
            _ => write!(out, "\\{b:02X}").ok(),
        };
    }
    out.push('"');
    out
}

fn float_attr(f: f32) -> String {
    if f.is_finite() {
        // MLIR float literals need a decimal point: `1.0e-12`, not `1e-12`.
        let e = format!("{f:e}");
        let e = match e.split_once('e') {
            Some((m, x)) if !m.contains('.') => format!("{m}.0e{x}"),
            _ => e,
        };
        format!("{e} : f32")
    } else {
        format!("0x{:08X} : f32", f.to_bits())
    }
}

fn attr_text(a: &Attr) -> Option<String> {
    Some(match a {
        Attr::Int(i) => format!("{i} : i64"),
        Attr::Float(f) => float_attr(*f),
        Attr::String(s) => quote(s),
        Attr::Ints(v) => format!(
            "array<i64{}>",
            v.iter().map(|i| format!(" {i}")).collect::<Vec<_>>().join(",").replacen(' ', ": ", 1)
        ),
        Attr::Floats(v) => format!("[{}]", v.iter().map(|f| float_attr(*f)).collect::<Vec<_>>().join(", ")),
        Attr::Strings(v) => format!("[{}]", v.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", ")),
        Attr::Tensor(_) | Attr::Tensors(_) | Attr::Raw { .. } => return None,
    })
}

/// `BatchNormalization` → `batch_normalization`.
fn snake(s: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev_lower = i > 0 && (chars[i - 1].is_ascii_lowercase() || chars[i - 1].is_ascii_digit());
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if i > 0 && (prev_lower || (next_lower && chars[i - 1].is_ascii_uppercase())) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_alphanumeric() {
            out.push(c);
        } else {
            out.push('_');
        }
    }
    out
}

struct Emitter<'g> {
    g: &'g Graph,
    names: HashMap<ValueId, String>,
    body: String,
    generic: BTreeMap<String, usize>,
    next: usize,
    /// Symbol → a function argument and axis whose size it is.
    syms: BTreeMap<String, (String, usize, String)>,
    /// Lines of the node being lowered; dropped if its lowering gives up.
    frag: Vec<String>,
    /// Index values and scalar constants already defined in `frag`.
    local: HashMap<String, String>,
    /// The node's number and the next temporary of it.
    base: usize,
    tmp: usize,
    /// The random-stream offset argument, and whether a node reads it.
    rng: random::Offset,
    /// The model's default-domain opset, when known: ops whose meaning
    /// changed between opsets (`Softmax`'s axis) lower only where every
    /// version agrees when it is not.
    opset: Option<i64>,
}

impl Emitter<'_> {
    fn name(&self, v: ValueId) -> String {
        self.names.get(&v).cloned().unwrap_or_else(|| "%undef".into())
    }
    fn ty(&self, v: ValueId) -> String {
        tensor_type(self.g.ty(v))
    }

    /// The structured lowering of a node, or `None` for the generic form.
    fn lower(&self, node: &qsync_ir::Node, ins: &[ValueId], outs: &[ValueId]) -> Option<String> {
        if outs.len() != 1 || ins.iter().chain(outs).any(|&v| !plain(self.g.ty(v))) {
            return None;
        }
        let (o, ot) = (outs[0], self.g.ty(outs[0]));
        let od = ot.dtype?;
        let one = |op: &str, attrs: &str| -> Option<String> {
            (ins.len() == 1)
                .then(|| format!("{op} {}{attrs} : ({}) -> {}", self.name(ins[0]), self.ty(ins[0]), self.ty(o)))
        };
        let same_float = ins.iter().all(|&v| self.g.ty(v) == ot) && is_float(od);
        match node.op {
            Op::Cast if ins.len() == 1 => {
                let id = self.g.ty(ins[0]).dtype?;
                let same_shape = self.g.ty(ins[0]).shape == ot.shape;
                let op = match (is_float(id), is_float(od)) {
                    _ if !same_shape => return None,
                    (true, true)
                        if float_width(od) < float_width(id) || (id != od && float_width(id) == float_width(od)) =>
                    {
                        if float_width(id) == float_width(od) {
                            return one("tosa.cast", "");
                        }
                        "arith.truncf"
                    }
                    (true, true) if id == od => return one("tosa.identity", ""),
                    (true, true) => "arith.extf",
                    (false, true) if id == DType::Bool => return one("tosa.cast", ""),
                    (false, true) if matches!(id, DType::U8 | DType::U16 | DType::U32 | DType::U64) => "arith.uitofp",
                    (false, true) => "arith.sitofp",
                    (true, false) if od == DType::Bool => return one("tosa.cast", ""),
                    (true, false) if matches!(od, DType::U8 | DType::U16 | DType::U32 | DType::U64) => "arith.fptoui",
                    (true, false) => "arith.fptosi",
                    (false, false) => return one("tosa.cast", ""),
                };
                Some(format!("{op} {} : {} to {}", self.name(ins[0]), self.ty(ins[0]), self.ty(o)))
            }
            Op::Add | Op::Sub | Op::Mul | Op::Div if ins.len() == 2 && same_float => {
                let op = match node.op {
                    Op::Add => "arith.addf",
                    Op::Sub => "arith.subf",
                    Op::Mul => "arith.mulf",
                    _ => "arith.divf",
                };
                Some(format!("{op} {}, {} : {}", self.name(ins[0]), self.name(ins[1]), self.ty(o)))
            }
            Op::Add | Op::Sub if ins.len() == 2 && self.broadcasts(ins, ot) => {
                let op = if node.op == Op::Add { "tosa.add" } else { "tosa.sub" };
                Some(format!(
                    "{op} {}, {} : ({}, {}) -> {}",
                    self.name(ins[0]),
                    self.name(ins[1]),
                    self.ty(ins[0]),
                    self.ty(ins[1]),
                    self.ty(o)
                ))
            }
            Op::Relu if same_float => {
                let e = elem(od);
                one("tosa.clamp", &format!(" {{max_val = {} : {e}, min_val = 0.0 : {e}}}", inf_of(od)))
            }
            Op::Tanh | Op::Sigmoid | Op::Exp | Op::Log | Op::Abs | Op::Erf | Op::Reciprocal | Op::Identity
                if same_float =>
            {
                one(&format!("tosa.{}", snake(node.op.op_type())), "")
            }
            Op::Transpose if ins.len() == 1 => {
                let rank = self.g.ty(ins[0]).rank()? as i64;
                let perm: Vec<i64> =
                    node.attr_ints("perm").map(<[i64]>::to_vec).unwrap_or_else(|| (0..rank).rev().collect());
                if perm.len() as i64 != rank || self.g.ty(ins[0]).dtype != Some(od) {
                    return None;
                }
                let p: Vec<String> = perm.iter().map(i64::to_string).collect();
                one("tosa.transpose", &format!(" {{perms = array<i32: {}>}}", p.join(", ")))
            }
            _ => None,
        }
    }

    /// Equal-rank operands whose static dims equal the result's or are 1,
    /// all of one float or integer type (tosa's broadcasting rule).
    fn broadcasts(&self, ins: &[ValueId], ot: &TensorType) -> bool {
        let (Some(os), Some(od)) = (&ot.shape, ot.dtype) else { return false };
        ins.iter().all(|&v| {
            let t = self.g.ty(v);
            let Some(s) = &t.shape else { return false };
            t.dtype == Some(od)
                && s.len() == os.len()
                && s.iter().zip(os).all(|(a, b)| a == b || a.as_const() == Some(1))
        }) && !matches!(od, DType::Bool | DType::Str)
    }

    fn generic(&mut self, node: &qsync_ir::Node, ins: &[ValueId], outs: &[ValueId]) -> String {
        let op_name = match &node.op {
            Op::Opaque { .. } => "qsync.opaque".to_string(),
            op => format!("qsync.{}", snake(op.op_type())),
        };
        *self.generic.entry(node.op.to_string()).or_default() += 1;
        let mut attrs = vec![
            format!("onnx.op = {}", quote(node.op.op_type().as_bytes())),
            format!("onnx.name = {}", quote(node.name.as_bytes())),
        ];
        if !node.op.domain().is_empty() {
            attrs.push(format!("onnx.domain = {}", quote(node.op.domain().as_bytes())));
        }
        if let Some(p) = node.precision {
            attrs.push(format!("qsync.precision = {}", quote(p.name().as_bytes())));
        }
        let absent: Vec<String> =
            node.inputs().iter().enumerate().filter(|(_, v)| v.is_none()).map(|(i, _)| i.to_string()).collect();
        if !absent.is_empty() {
            attrs.push(format!("onnx.absent_inputs = array<i64: {}>", absent.join(", ")));
        }
        for (k, a) in &node.attrs {
            if let Some(t) = attr_text(a) {
                attrs.push(format!("{} = {t}", quote(k.as_bytes())));
            }
        }
        let ops: Vec<String> = ins.iter().map(|&v| self.name(v)).collect();
        let its: Vec<String> = ins.iter().map(|&v| self.ty(v)).collect();
        let ots: Vec<String> = outs.iter().map(|&v| self.ty(v)).collect();
        format!(
            "\"{op_name}\"({}) {{{}}} : ({}) -> ({})",
            ops.join(", "),
            attrs.join(", "),
            its.join(", "),
            ots.join(", ")
        )
    }

    fn node(&mut self, id: qsync_ir::NodeId) {
        let node = self.g.node(id);
        let ins: Vec<ValueId> = node.inputs().iter().flatten().copied().collect();
        let outs: Vec<ValueId> = node.outputs().to_vec();
        let base = self.next;
        self.next += 1;
        self.base = base;
        self.tmp = 0;
        self.frag.clear();
        self.local.clear();
        self.rng.pending = false;
        let lowered = match self.lower(node, &ins, &outs) {
            Some(rhs) => Some(vec![self.line(rhs)]),
            None if outs.iter().all(|&v| plain(self.g.ty(v))) && ins.iter().all(|&v| plain(self.g.ty(v))) => {
                let r = self.lower_structured(node, &outs);
                if r.is_none() {
                    self.frag.clear();
                }
                r
            }
            None => None,
        };
        if let Some(results) = lowered.filter(|r| r.len() == outs.len()) {
            self.rng.used |= self.rng.pending;
            for line in self.frag.drain(..) {
                self.body.push_str(&line);
                self.body.push('\n');
            }
            for (&o, n) in outs.iter().zip(results) {
                self.names.insert(o, n);
            }
            return;
        }
        let rhs = self.generic(node, &ins, &outs);
        let lhs = match outs.len() {
            0 => String::new(),
            1 => format!("%{base} = "),
            k => format!("%{base}:{k} = "),
        };
        for (i, &o) in outs.iter().enumerate() {
            let n = if outs.len() == 1 { format!("%{base}") } else { format!("%{base}#{i}") };
            self.names.insert(o, n);
        }
        let _ = writeln!(self.body, "    {lhs}{rhs}");
    }
}

fn inf_of(d: DType) -> String {
    match d {
        DType::F16 => "0x7C00".into(),
        DType::BF16 => "0x7F80".into(),
        DType::F64 => "0x7FF0000000000000".into(),
        _ => "0x7F800000".into(),
    }
}

/// A valid MLIR symbol for the function.
fn symbol(name: &str) -> String {
    let s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        format!("g_{s}")
    } else {
        s
    }
}

/// The MLIR module text for `graph`, before verification, and the op types
/// emitted as generic operations. The function's signature is as the module
/// doc says: a caller passes the trailing `rng_offset` argument when the
/// text declares it (`qsync.rng_offset`).
///
/// The graph's opset is not known here: ops whose meaning depends on it
/// lower only where every opset agrees ([`mlir_text_model`] knows it).
pub fn mlir_text(graph: &Graph, name: &str) -> (String, BTreeMap<String, usize>) {
    mlir_text_opset(graph, name, None)
}

/// [`mlir_text`] for a graph of the default-domain `opset` (`None` when
/// unknown).
fn mlir_text_opset(graph: &Graph, name: &str, opset: Option<i64>) -> (String, BTreeMap<String, usize>) {
    let (text, generic, _) = module_text(graph, name, opset);
    (text, generic)
}

/// [`mlir_text`] for a model's graph, knowing the model's opset.
pub fn mlir_text_model(model: &Model, name: &str) -> (String, BTreeMap<String, usize>) {
    mlir_text_opset(&model.graph, name, known_opset(model))
}

/// The default-domain opset of `model`, if it declares one.
fn known_opset(model: &Model) -> Option<i64> {
    Some(model.opset()).filter(|&v| v > 0)
}

/// The module text, the generic op types, and whether the function takes
/// the `rng_offset` argument.
fn module_text(graph: &Graph, name: &str, opset: Option<i64>) -> (String, BTreeMap<String, usize>, bool) {
    let mut e = Emitter {
        g: graph,
        names: HashMap::new(),
        body: String::new(),
        generic: BTreeMap::new(),
        next: 0,
        syms: BTreeMap::new(),
        frag: Vec::new(),
        local: HashMap::new(),
        base: 0,
        tmp: 0,
        rng: random::Offset::new(),
        opset,
    };
    let mut args = Vec::new();
    for (i, &v) in graph.inputs().iter().chain(graph.inits()).enumerate() {
        e.names.insert(v, format!("%arg{i}"));
        args.push(format!("%arg{i}: {} {{qsync.name = {}}}", e.ty(v), quote(graph.value_name(v).as_bytes())));
        if plain(graph.ty(v)) {
            for (axis, d) in graph.ty(v).shape.iter().flatten().enumerate() {
                if let Some(s) = d.as_sym() {
                    let ty = e.ty(v);
                    e.syms.entry(s.to_string()).or_insert_with(|| (format!("%arg{i}"), axis, ty));
                }
            }
        }
    }
    for id in graph.schedule() {
        e.node(id);
    }
    let outs: Vec<ValueId> = graph.outputs().to_vec();
    let rets: Vec<String> = outs.iter().map(|&v| e.name(v)).collect();
    let rtys: Vec<String> = outs.iter().map(|&v| e.ty(v)).collect();
    if e.rng.used {
        args.push(random::offset_param());
    }
    let mut text = String::from("module {\n");
    let _ = writeln!(text, "  func.func @{}({}) -> ({}) {{", symbol(name), args.join(", "), rtys.join(", "));
    if e.rng.used {
        for line in e.rng.prologue() {
            text.push_str(line);
            text.push('\n');
        }
    }
    text.push_str(&e.body);
    let _ = writeln!(
        text,
        "    func.return {}{}",
        rets.join(", "),
        if rets.is_empty() { String::new() } else { format!(" : {}", rtys.join(", ")) }
    );
    text.push_str("  }\n}\n");
    (text, e.generic, e.rng.used)
}

/// Emits `graph` as MLIR and verifies it in-process (unregistered dialects
/// allowed exactly when generic `qsync.*` operations were needed).
///
/// The graph's opset is not known here: ops whose meaning depends on it
/// (`Softmax`/`LogSoftmax` on an inner axis) lower only where every opset
/// agrees and stay generic otherwise. [`emit_mlir_model`] knows the opset.
pub fn emit_mlir(graph: &Graph, name: &str) -> Result<MlirOutput, CodegenError> {
    emit_mlir_opset(graph, name, None)
}

/// [`emit_mlir`] for a model's graph, lowering by the model's default-domain
/// opset.
pub fn emit_mlir_model(model: &Model, name: &str) -> Result<MlirOutput, CodegenError> {
    emit_mlir_opset(&model.graph, name, known_opset(model))
}

/// [`emit_mlir`] for a graph of the default-domain `opset` (`None` when
/// unknown).
fn emit_mlir_opset(graph: &Graph, name: &str, opset: Option<i64>) -> Result<MlirOutput, CodegenError> {
    let (text, generic_ops, rng_offset) = module_text(graph, name, opset);
    let printed = verify_text(&text, !generic_ops.is_empty())
        .map_err(|message| CodegenError::Mlir { graph: name.to_string(), message })?;
    Ok(MlirOutput { text: printed, generic_ops, rng_offset })
}

/// Parses and verifies MLIR text; returns MLIR's own printing of it.
pub fn verify_text(text: &str, allow_unregistered: bool) -> Result<String, String> {
    let ctx = Context::new();
    let registry = melior::dialect::DialectRegistry::new();
    register_all_dialects(&registry);
    ctx.append_dialect_registry(&registry);
    ctx.load_all_available_dialects();
    ctx.set_allow_unregistered_dialects(allow_unregistered);
    let diags = std::rc::Rc::new(std::cell::RefCell::new(Vec::<String>::new()));
    let sink = diags.clone();
    let handler = ctx.attach_diagnostic_handler(move |d| {
        sink.borrow_mut().push(format!("{}: {d}", d.location()));
        true
    });
    let result = match Module::parse(&ctx, text) {
        None => Err(format!("does not parse: {}", diags.borrow().join("; "))),
        Some(m) if !m.as_operation().verify() => Err(format!("verifier: {}", diags.borrow().join("; "))),
        Some(m) => Ok(m.as_operation().to_string()),
    };
    ctx.detach_diagnostic_handler(handler);
    result
}
