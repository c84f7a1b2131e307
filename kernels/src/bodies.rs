//! The kernel bodies, one per [`KernelSpec`], each the IR transcription of
//! its function in [`crate::reference`] (read that first: it is the spec).
//! A body is `void name.body(args…, i64 index)`; [`crate::emit`] wraps it.

use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::{FloatPredicate as F, IntPredicate as I};

use crate::emit::{body_params, mark_body, Cx, R};
use crate::rng;
use crate::spec::{Half, KernelSpec, QBits, Rounding, PACK_HEADER_BYTES, VECTOR_WIDTH};

/// Emits `spec`'s body into `m`.
pub(crate) fn emit_body<'ctx>(ctx: &'ctx Context, m: &Module<'ctx>, spec: &KernelSpec) -> R<FunctionValue<'ctx>> {
    let params = body_params(ctx, spec);
    let cx = Cx::function(ctx, m, &format!("{}.body", spec.name()), &params, Some(Linkage::Internal));
    mark_body(ctx, cx.f);
    let idx = cx.param_int(spec.args().len() as u32)?;
    match *spec {
        KernelSpec::CastTo(h) => cast_to(&cx, h, idx)?,
        KernelSpec::CastFrom(h) => cast_from(&cx, h, idx)?,
        KernelSpec::RowMinMax => row_min_max(&cx, idx)?,
        KernelSpec::TensorMinMax => tensor_min_max(&cx)?,
        KernelSpec::QuantParams { bits, symmetric } => quant_params(&cx, bits, symmetric, idx)?,
        KernelSpec::QuantizeInt8 { symmetric, rounding } => quantize_i8(&cx, symmetric, rounding, idx)?,
        KernelSpec::DequantizeInt8 { symmetric } => dequantize_i8(&cx, symmetric, idx)?,
        KernelSpec::QuantizeInt4 { rounding } => quantize_i4(&cx, rounding, idx)?,
        KernelSpec::DequantizeInt4 => dequantize_i4(&cx, idx)?,
        KernelSpec::PackBits { bits, rounding } => pack(&cx, bits, rounding, idx)?,
        KernelSpec::UnpackBits { bits } => unpack(&cx, bits, idx)?,
        KernelSpec::DequantAccumulate { bits } => dequant_accumulate(&cx, bits, idx)?,
    }
    cx.ret()?;
    Ok(cx.f)
}

/// The per-element function of [`chunked`]: `(index, inputs) → outputs`.
type Lane<'c, 'ctx> = dyn Fn(&Cx<'_, 'ctx>, IntValue<'ctx>, &[IntValue<'ctx>]) -> R<Vec<IntValue<'ctx>>> + 'c;

/// One stream of a chunked element-wise kernel: a pointer and its element width.
struct Stream<'ctx> {
    ptr: PointerValue<'ctx>,
    bits: u32,
}

/// The element-wise skeleton: chunk `c` covers elements `4c .. 4c+4`; a full
/// chunk whose streams are all 16-byte aligned moves as one vector per stream,
/// anything else (a short tail, an unaligned slice) element by element. `lane`
/// maps `(element index, input values)` to output values.
fn chunked<'ctx>(
    cx: &Cx<'_, 'ctx>,
    n: IntValue<'ctx>,
    c: IntValue<'ctx>,
    ins: &[Stream<'ctx>],
    outs: &[Stream<'ctx>],
    lane: &Lane<'_, 'ctx>,
) -> R<()> {
    let w = VECTOR_WIDTH;
    let base = cx.mul(c, cx.i64c(w))?;
    let full = cx.icmp(I::ULE, cx.add(base, cx.i64c(w))?, n)?;
    let mut addr_bits = cx.i64c(0);
    for s in ins.iter().chain(outs) {
        addr_bits = cx.or(addr_bits, cx.addr(s.ptr)?)?;
    }
    let aligned = cx.icmp(I::EQ, cx.and(addr_bits, cx.i64c(15))?, cx.i64c(0))?;
    let fast = cx.and(full, aligned)?;
    let vec_ty = |bits: u32| -> BasicTypeEnum<'ctx> { cx.int_ty(bits).vec_type(w as u32).into() };
    let then = cx.ctx.append_basic_block(cx.f, "vector");
    let other = cx.ctx.append_basic_block(cx.f, "scalar");
    let join = cx.ctx.append_basic_block(cx.f, "done");
    cx.b.build_conditional_branch(fast, then, other)?;

    cx.b.position_at_end(then);
    let vin: Vec<_> = ins
        .iter()
        .map(|s| Ok(cx.load(vec_ty(s.bits), s.ptr, c, s.bits * w as u32 / 8)?.into_vector_value()))
        .collect::<R<_>>()?;
    let mut vout: Vec<_> = outs.iter().map(|s| vec_ty(s.bits).into_vector_type().get_poison()).collect();
    for l in 0..w {
        let li = cx.i32c(l);
        let vals: Vec<IntValue> =
            vin.iter().map(|v| Ok(cx.b.build_extract_element(*v, li, "")?.into_int_value())).collect::<R<_>>()?;
        let res = lane(cx, cx.add(base, cx.i64c(l))?, &vals)?;
        for (o, r) in vout.iter_mut().zip(res) {
            *o = cx.b.build_insert_element(*o, r, li, "")?;
        }
    }
    for (s, v) in outs.iter().zip(vout) {
        cx.store(vec_ty(s.bits), s.ptr, c, v.into(), s.bits * w as u32 / 8)?;
    }
    cx.b.build_unconditional_branch(join)?;

    cx.b.position_at_end(other);
    for l in 0..w {
        let i = cx.add(base, cx.i64c(l))?;
        cx.if_then(cx.icmp(I::ULT, i, n)?, |cx| {
            let vals: Vec<IntValue> = ins.iter().map(|s| cx.load_i(s.bits, s.ptr, i)).collect::<R<_>>()?;
            for (s, r) in outs.iter().zip(lane(cx, i, &vals)?) {
                cx.store_i(s.ptr, i, r)?;
            }
            Ok(())
        })?;
    }
    cx.b.build_unconditional_branch(join)?;
    cx.b.position_at_end(join);
    Ok(())
}

fn f32_to_f16<'ctx>(cx: &Cx<'_, 'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let k = |v: u64| cx.i32c(v);
    let sign = cx.and(cx.lshr(b, k(16))?, k(0x8000))?;
    let a = cx.and(b, k(0x7fff_ffff))?;
    let nan = cx.icmp(I::UGT, a, k(0x7f80_0000))?;
    let inf = cx.icmp(I::UGE, a, k(0x477f_f000))?;
    let normal = cx.icmp(I::UGE, a, k(0x3880_0000))?;
    let m = cx.sub(a, k(0x3800_0000))?;
    let odd = cx.and(cx.lshr(m, k(13))?, k(1))?;
    let rn = cx.lshr(cx.add(cx.add(m, k(0x0fff))?, odd)?, k(13))?;
    let e = cx.lshr(a, k(23))?;
    let tiny = cx.icmp(I::ULT, e, k(102))?;
    let big = cx.icmp(I::UGT, e, k(112))?;
    let sh = cx.sel_i(tiny, k(24), cx.sel_i(big, k(14), cx.sub(k(126), e)?)?)?;
    let mant = cx.or(cx.and(a, k(0x007f_ffff))?, k(0x0080_0000))?;
    let r = cx.lshr(mant, sh)?;
    let rem = cx.and(mant, cx.sub(cx.shl(k(1), sh)?, k(1))?)?;
    let half = cx.shl(k(1), cx.sub(sh, k(1))?)?;
    let tie_odd = cx.and(cx.icmp(I::EQ, rem, half)?, cx.trunc(cx.and(r, k(1))?, 1)?)?;
    let up = cx.or(cx.icmp(I::UGT, rem, half)?, tie_odd)?;
    let sub = cx.sel_i(tiny, k(0), cx.add(r, cx.zext(up, 32)?)?)?;
    let v = cx.sel_i(nan, k(0x7e00), cx.sel_i(inf, k(0x7c00), cx.sel_i(normal, rn, sub)?)?)?;
    cx.trunc(cx.or(v, sign)?, 16)
}

fn f16_to_f32<'ctx>(cx: &Cx<'_, 'ctx>, h: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let k = |v: u64| cx.i32c(v);
    let h = cx.zext(h, 32)?;
    let sign = cx.shl(cx.and(h, k(0x8000))?, k(16))?;
    let e = cx.and(cx.lshr(h, k(10))?, k(0x1f))?;
    let m = cx.and(h, k(0x3ff))?;
    let m13 = cx.shl(m, k(13))?;
    let special = cx.sel_i(cx.icmp(I::EQ, m, k(0))?, k(0x7f80_0000), cx.or(k(0x7fc0_0000), m13)?)?;
    let sub = cx.f2bits(cx.fmul(cx.uitofp(m)?, cx.f32c(1.0 / 16_777_216.0))?)?;
    let norm = cx.or(cx.shl(cx.add(e, k(112))?, k(23))?, m13)?;
    let v = cx.sel_i(cx.icmp(I::EQ, e, k(31))?, special, cx.sel_i(cx.icmp(I::EQ, e, k(0))?, sub, norm)?)?;
    cx.or(sign, v)
}

fn f32_to_bf16<'ctx>(cx: &Cx<'_, 'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let k = |v: u64| cx.i32c(v);
    let nan = cx.icmp(I::UGT, cx.and(b, k(0x7fff_ffff))?, k(0x7f80_0000))?;
    let qnan = cx.or(cx.and(cx.lshr(b, k(16))?, k(0x8000))?, k(0x7fc0))?;
    let odd = cx.and(cx.lshr(b, k(16))?, k(1))?;
    let rn = cx.lshr(cx.add(b, cx.add(k(0x7fff), odd)?)?, k(16))?;
    cx.trunc(cx.sel_i(nan, qnan, rn)?, 16)
}

fn bf16_to_f32<'ctx>(cx: &Cx<'_, 'ctx>, h: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let k = |v: u64| cx.i32c(v);
    let b = cx.shl(cx.zext(h, 32)?, k(16))?;
    let nan = cx.icmp(I::UGT, cx.and(b, k(0x7fff_ffff))?, k(0x7f80_0000))?;
    cx.sel_i(nan, cx.or(b, k(0x0040_0000))?, b)
}

fn cast_to<'ctx>(cx: &Cx<'_, 'ctx>, h: Half, c: IntValue<'ctx>) -> R<()> {
    let (src, dst, n) = (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_int(2)?);
    let conv = match h {
        Half::F16 => f32_to_f16,
        Half::BF16 => f32_to_bf16,
    };
    chunked(cx, n, c, &[Stream { ptr: src, bits: 32 }], &[Stream { ptr: dst, bits: 16 }], &|cx, _, v| {
        Ok(vec![conv(cx, v[0])?])
    })
}

fn cast_from<'ctx>(cx: &Cx<'_, 'ctx>, h: Half, c: IntValue<'ctx>) -> R<()> {
    let (src, dst, n) = (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_int(2)?);
    let conv = match h {
        Half::F16 => f16_to_f32,
        Half::BF16 => bf16_to_f32,
    };
    chunked(cx, n, c, &[Stream { ptr: src, bits: 16 }], &[Stream { ptr: dst, bits: 32 }], &|cx, _, v| {
        Ok(vec![conv(cx, v[0])?])
    })
}

/// NaN-ignoring `(min, max)` update: the first of equal values stays.
fn min_max_step<'ctx>(
    cx: &Cx<'_, 'ctx>,
    v: FloatValue<'ctx>,
    mn: FloatValue<'ctx>,
    mx: FloatValue<'ctx>,
) -> R<[FloatValue<'ctx>; 2]> {
    Ok([cx.sel_f(cx.fcmp(F::OLT, v, mn)?, v, mn)?, cx.sel_f(cx.fcmp(F::OGT, v, mx)?, v, mx)?])
}

fn reduce<'ctx>(
    cx: &Cx<'_, 'ctx>,
    start: IntValue<'ctx>,
    end: IntValue<'ctx>,
    load: &dyn Fn(&Cx<'_, 'ctx>, IntValue<'ctx>) -> R<[FloatValue<'ctx>; 2]>,
) -> R<[FloatValue<'ctx>; 2]> {
    let init: [BasicValueEnum; 2] = [cx.f32c(f32::INFINITY).into(), cx.f32c(f32::NEG_INFINITY).into()];
    let out = cx.for_range(start, end, cx.i64c(1), &init, |cx, i, acc| {
        let [a, b] = load(cx, i)?;
        let [mn, _] = min_max_step(cx, a, acc[0].into_float_value(), acc[1].into_float_value())?;
        let [_, mx] = min_max_step(cx, b, acc[0].into_float_value(), acc[1].into_float_value())?;
        Ok(vec![mn.into(), mx.into()])
    })?;
    Ok([out[0].into_float_value(), out[1].into_float_value()])
}

fn row_min_max<'ctx>(cx: &Cx<'_, 'ctx>, r: IntValue<'ctx>) -> R<()> {
    let (x, n, cols, rmin, rmax) =
        (cx.param_ptr(0)?, cx.param_int(1)?, cx.param_int(2)?, cx.param_ptr(3)?, cx.param_ptr(4)?);
    let start = cx.mul(r, cols)?;
    let end = cx.umin(cx.add(start, cols)?, n)?;
    let [mn, mx] = reduce(cx, start, end, &|cx, i| {
        let v = cx.load_f(x, i)?;
        Ok([v, v])
    })?;
    cx.store_f(rmin, r, mn)?;
    cx.store_f(rmax, r, mx)
}

fn abs_max<'ctx>(cx: &Cx<'_, 'ctx>, mn: FloatValue<'ctx>, mx: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    let neg = cx.fneg(mn)?;
    cx.sel_f(cx.fcmp(F::OGT, neg, mx)?, neg, mx)
}

fn tensor_min_max<'ctx>(cx: &Cx<'_, 'ctx>) -> R<()> {
    let (rmin, rmax, rows, out) = (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_int(2)?, cx.param_ptr(3)?);
    let [mn, mx] = reduce(cx, cx.i64c(0), rows, &|cx, i| Ok([cx.load_f(rmin, i)?, cx.load_f(rmax, i)?]))?;
    cx.store_f(out, cx.i64c(0), mn)?;
    cx.store_f(out, cx.i64c(1), mx)?;
    cx.store_f(out, cx.i64c(2), abs_max(cx, mn, mx)?)
}

fn valid_scale<'ctx>(cx: &Cx<'_, 'ctx>, s: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
    cx.and(cx.fcmp(F::OGT, s, cx.f32c(0.0))?, cx.fcmp(F::OLT, s, cx.f32c(f32::INFINITY))?)
}

/// `lo` if `t < lo`, `hi` if `t > hi`, else `t`.
fn clamp<'ctx>(cx: &Cx<'_, 'ctx>, t: FloatValue<'ctx>, lo: f32, hi: f32) -> R<FloatValue<'ctx>> {
    let t2 = cx.sel_f(cx.fcmp(F::OGT, t, cx.f32c(hi))?, cx.f32c(hi), t)?;
    cx.sel_f(cx.fcmp(F::OLT, t, cx.f32c(lo))?, cx.f32c(lo), t2)
}

fn quant_params<'ctx>(cx: &Cx<'_, 'ctx>, bits: QBits, symmetric: bool, g: IntValue<'ctx>) -> R<()> {
    let (pmin, pmax, scale, zp) = (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_ptr(3)?, cx.param_ptr(4)?);
    let (mn, mx) = (cx.load_f(pmin, g)?, cx.load_f(pmax, g)?);
    let one = cx.f32c(1.0);
    if symmetric {
        let s = cx.fdiv(abs_max(cx, mn, mx)?, cx.f32c(bits.qmax() as f32))?;
        cx.store_f(scale, g, cx.sel_f(valid_scale(cx, s)?, s, one)?)?;
        return cx.store_i(zp, g, cx.i32c(0));
    }
    let zero = cx.f32c(0.0);
    let lo = cx.sel_f(cx.fcmp(F::OLT, mn, zero)?, mn, zero)?;
    let hi = cx.sel_f(cx.fcmp(F::OGT, mx, zero)?, mx, zero)?;
    let s = cx.fdiv(cx.fsub(hi, lo)?, cx.f32c(255.0))?;
    let ok = valid_scale(cx, s)?;
    let safe = cx.sel_f(ok, s, one)?;
    let z = clamp(cx, cx.fsub(cx.f32c(-128.0), cx.roundeven(cx.fdiv(lo, safe)?)?)?, -128.0, 127.0)?;
    cx.store_f(scale, g, safe)?;
    cx.store_i(zp, g, cx.sel_i(ok, cx.fptosi(z)?, cx.i32c(0))?)
}

/// The generator of [`crate::rng::uniform`].
fn uniform<'ctx>(cx: &Cx<'_, 'ctx>, seed: IntValue<'ctx>, i: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
    let k = |v: u64| cx.i64c(v);
    let mut z = cx.add(seed, cx.mul(cx.add(i, k(1))?, k(rng::GOLDEN))?)?;
    z = cx.mul(cx.xor(z, cx.lshr(z, k(30))?)?, k(rng::MIX1))?;
    z = cx.mul(cx.xor(z, cx.lshr(z, k(27))?)?, k(rng::MIX2))?;
    z = cx.xor(z, cx.lshr(z, k(31))?)?;
    cx.fmul(cx.uitofp(cx.lshr(z, k(40))?)?, cx.f32c(1.0 / 16_777_216.0))
}

/// [`crate::reference`]'s `code`: the clamped integer-valued code of `t`.
#[allow(clippy::too_many_arguments)]
fn code<'ctx>(
    cx: &Cx<'_, 'ctx>,
    t: FloatValue<'ctx>,
    zp: FloatValue<'ctx>,
    lo: f32,
    hi: f32,
    rounding: Rounding,
    seed: IntValue<'ctx>,
    i: IntValue<'ctx>,
) -> R<FloatValue<'ctx>> {
    let r = match rounding {
        Rounding::Nearest => cx.roundeven(t)?,
        Rounding::Stochastic => {
            let f = cx.floor(t)?;
            let up = cx.fcmp(F::OLT, uniform(cx, seed, i)?, cx.fsub(t, f)?)?;
            cx.sel_f(up, cx.fadd(f, cx.f32c(1.0))?, f)?
        }
    };
    let r = cx.fadd(r, zp)?;
    let r = cx.sel_f(cx.fcmp(F::UNO, r, r)?, zp, r)?;
    clamp(cx, r, lo, hi)
}

fn group_index<'ctx>(cx: &Cx<'_, 'ctx>, i: IntValue<'ctx>, group: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    cx.udiv(i, cx.umax(group, cx.i64c(1))?)
}

fn quantize_i8<'ctx>(cx: &Cx<'_, 'ctx>, symmetric: bool, rounding: Rounding, c: IntValue<'ctx>) -> R<()> {
    let (x, scale, zp) = (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_ptr(2)?);
    let (n, group, seed, q) = (cx.param_int(3)?, cx.param_int(4)?, cx.param_int(5)?, cx.param_ptr(6)?);
    let lo = if symmetric { -127.0 } else { -128.0 };
    chunked(cx, n, c, &[Stream { ptr: x, bits: 32 }], &[Stream { ptr: q, bits: 8 }], &|cx, i, v| {
        let g = group_index(cx, i, group)?;
        let inv = cx.fdiv(cx.f32c(1.0), cx.load_f(scale, g)?)?;
        let z = if symmetric { cx.f32c(0.0) } else { cx.sitofp(cx.load_i(32, zp, g)?)? };
        let t = cx.fmul(cx.bits2f(v[0])?, inv)?;
        Ok(vec![cx.trunc(cx.fptosi(code(cx, t, z, lo, 127.0, rounding, seed, i)?)?, 8)?])
    })
}

fn dequantize_i8<'ctx>(cx: &Cx<'_, 'ctx>, symmetric: bool, c: IntValue<'ctx>) -> R<()> {
    let (q, scale, zp) = (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_ptr(2)?);
    let (n, group, out) = (cx.param_int(3)?, cx.param_int(4)?, cx.param_ptr(5)?);
    chunked(cx, n, c, &[Stream { ptr: q, bits: 8 }], &[Stream { ptr: out, bits: 32 }], &|cx, i, v| {
        let g = group_index(cx, i, group)?;
        let mut code = cx.sext(v[0], 32)?;
        if !symmetric {
            code = cx.sub(code, cx.load_i(32, zp, g)?)?;
        }
        Ok(vec![cx.f2bits(cx.fmul(cx.sitofp(code)?, cx.load_f(scale, g)?)?)?])
    })
}

fn quantize_i4<'ctx>(cx: &Cx<'_, 'ctx>, rounding: Rounding, byte: IntValue<'ctx>) -> R<()> {
    let (x, scale, n, group, seed, q) =
        (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_int(2)?, cx.param_int(3)?, cx.param_int(4)?, cx.param_ptr(5)?);
    let nib = |cx: &Cx<'_, 'ctx>, i: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let inv = cx.fdiv(cx.f32c(1.0), cx.load_f(scale, group_index(cx, i, group)?)?)?;
        let t = cx.fmul(cx.load_f(x, i)?, inv)?;
        let c = cx.fptosi(code(cx, t, cx.f32c(0.0), -7.0, 7.0, rounding, seed, i)?)?;
        cx.trunc(cx.and(c, cx.i32c(0xf))?, 8)
    };
    let i0 = cx.mul(byte, cx.i64c(2))?;
    let i1 = cx.add(i0, cx.i64c(1))?;
    let lo = nib(cx, i0)?;
    let hi = cx.if_value(cx.ctx.i8_type(), cx.icmp(I::ULT, i1, n)?, |cx| Ok(nib(cx, i1)?.into()), cx.i8c(0).into())?;
    cx.store_i(q, byte, cx.or(lo, cx.shl(hi.into_int_value(), cx.i8c(4))?)?)
}

/// The signed nibble `i` of the int4 array at `q`, as i32.
fn nibble<'ctx>(cx: &Cx<'_, 'ctx>, q: PointerValue<'ctx>, i: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let b = cx.load_i(8, q, cx.lshr(i, cx.i64c(1))?)?;
    let odd = cx.trunc(cx.and(i, cx.i64c(1))?, 1)?;
    let n = cx.sel_i(odd, cx.and(b, cx.i8c(0xf0))?, cx.shl(b, cx.i8c(4))?)?;
    cx.sext(cx.ashr(n, cx.i8c(4))?, 32)
}

fn dequantize_i4<'ctx>(cx: &Cx<'_, 'ctx>, byte: IntValue<'ctx>) -> R<()> {
    let (q, scale, n, group, out) =
        (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_int(2)?, cx.param_int(3)?, cx.param_ptr(4)?);
    for e in 0..2 {
        let i = cx.add(cx.mul(byte, cx.i64c(2))?, cx.i64c(e))?;
        cx.if_then(cx.icmp(I::ULT, i, n)?, |cx| {
            let v = cx.fmul(cx.sitofp(nibble(cx, q, i)?)?, cx.load_f(scale, group_index(cx, i, group)?)?)?;
            cx.store_f(out, i, v)
        })?;
    }
    Ok(())
}

fn dequant_accumulate<'ctx>(cx: &Cx<'_, 'ctx>, bits: QBits, i: IntValue<'ctx>) -> R<()> {
    let (q, scale, n, group) = (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_int(2)?, cx.param_int(3)?);
    let (k, out) = (cx.param_int(4)?, cx.param_ptr(5)?);
    let groups = cx.ceil_div(n, cx.umax(group, cx.i64c(1))?)?;
    let chunk = match bits {
        QBits::Int8 => n,
        QBits::Int4 => cx.ceil_div(n, cx.i64c(2))?,
    };
    let g = group_index(cx, i, group)?;
    let acc0: BasicValueEnum = cx.load_f(out, i)?.into();
    let acc = cx.for_range(cx.i64c(0), k, cx.i64c(1), &[acc0], |cx, j, acc| {
        let base = cx.gep(cx.ctx.i8_type().into(), q, cx.mul(j, chunk)?)?;
        let c = match bits {
            QBits::Int8 => cx.sext(cx.load_i(8, base, i)?, 32)?,
            QBits::Int4 => nibble(cx, base, i)?,
        };
        let s = cx.load_f(scale, cx.add(cx.mul(j, groups)?, g)?)?;
        Ok(vec![cx.fma(cx.sitofp(c)?, s, acc[0].into_float_value())?.into()])
    })?;
    cx.store_f(out, i, acc[0].into_float_value())
}

/// `(gap, 1/gap or 0)` as in [`crate::reference::pack_gap`].
fn pack_gap<'ctx>(
    cx: &Cx<'_, 'ctx>,
    mn: FloatValue<'ctx>,
    mx: FloatValue<'ctx>,
    bits: u8,
) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
    let gap = cx.fdiv(cx.fsub(mx, mn)?, cx.f32c(((1u32 << bits) - 1) as f32))?;
    let inv = cx.sel_f(valid_scale(cx, gap)?, cx.fdiv(cx.f32c(1.0), gap)?, cx.f32c(0.0))?;
    Ok((gap, inv))
}

fn pack<'ctx>(cx: &Cx<'_, 'ctx>, bits: u8, rounding: Rounding, byte: IntValue<'ctx>) -> R<()> {
    let (x, range, n, seed, out) =
        (cx.param_ptr(0)?, cx.param_ptr(1)?, cx.param_int(2)?, cx.param_int(3)?, cx.param_ptr(4)?);
    let per = u64::from(8 / bits);
    let (mn, mx) = (cx.load_f(range, cx.i64c(0))?, cx.load_f(range, cx.i64c(1))?);
    let (_, inv) = pack_gap(cx, mn, mx, bits)?;
    cx.if_then(cx.icmp(I::EQ, byte, cx.i64c(0))?, |cx| {
        let tail = cx.urem(cx.sub(cx.i64c(per), cx.urem(n, cx.i64c(per))?)?, cx.i64c(per))?;
        cx.store_i(out, cx.i64c(0), cx.i8c(u64::from(bits)))?;
        cx.store_i(out, cx.i64c(1), cx.trunc(tail, 8)?)?;
        cx.store_f_unaligned(out, 2, mn)?;
        cx.store_f_unaligned(out, 6, mx)
    })?;
    let packed = cx.ceil_div(n, cx.i64c(per))?;
    cx.if_then(cx.icmp(I::ULT, byte, packed)?, |cx| {
        let top = ((1u32 << bits) - 1) as f32;
        let mut acc = cx.i8c(0);
        for k in 0..per {
            let i = cx.add(cx.mul(byte, cx.i64c(per))?, cx.i64c(k))?;
            let c = cx.if_value(
                cx.ctx.i8_type(),
                cx.icmp(I::ULT, i, n)?,
                |cx| {
                    let t = cx.fmul(cx.fsub(cx.load_f(x, i)?, mn)?, inv)?;
                    let c = code(cx, t, cx.f32c(0.0), 0.0, top, rounding, seed, i)?;
                    Ok(cx.trunc(cx.fptosi(c)?, 8)?.into())
                },
                cx.i8c(0).into(),
            )?;
            let sh = 8 - u64::from(bits) * (k + 1);
            acc = cx.or(acc, cx.shl(c.into_int_value(), cx.i8c(sh))?)?;
        }
        let dst = cx.gep(cx.ctx.i8_type().into(), out, cx.i64c(PACK_HEADER_BYTES as u64))?;
        cx.store_i(dst, byte, acc)
    })
}

fn unpack<'ctx>(cx: &Cx<'_, 'ctx>, bits: u8, i: IntValue<'ctx>) -> R<()> {
    let (buf, out) = (cx.param_ptr(0)?, cx.param_ptr(2)?);
    let per = cx.i64c(u64::from(8 / bits));
    let (mn, mx) = (cx.load_f_unaligned(buf, 2)?, cx.load_f_unaligned(buf, 6)?);
    let (gap, _) = pack_gap(cx, mn, mx, bits)?;
    let data = cx.gep(cx.ctx.i8_type().into(), buf, cx.i64c(PACK_HEADER_BYTES as u64))?;
    let b = cx.zext(cx.load_i(8, data, cx.udiv(i, per)?)?, 32)?;
    let slot = cx.trunc(cx.add(cx.urem(i, per)?, cx.i64c(1))?, 32)?;
    let sh = cx.sub(cx.i32c(8), cx.mul(cx.i32c(u64::from(bits)), slot)?)?;
    let c = cx.and(cx.lshr(b, sh)?, cx.i32c((1 << bits) - 1))?;
    cx.store_f(out, i, cx.fma(cx.uitofp(c)?, gap, mn)?)
}
