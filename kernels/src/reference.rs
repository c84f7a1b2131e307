//! Plain-Rust reference implementations: the specification of every kernel.
//! The LLVM IR in [`crate::emit`] performs exactly these operations, in this
//! order, with the same float operations (an explicit fused multiply-add
//! wherever a product feeds a sum), so results agree bit for bit.
//!
//! Conventions shared by all kernels:
//! - casts round to nearest even; NaN becomes the canonical quiet NaN with
//!   its sign kept (`±0x7e00` in f16, `±0x7fc0` in bf16); widening quiets NaN;
//! - range reductions ignore NaN; an empty or all-NaN range is `[+inf, -inf]`;
//! - a scale that is zero, infinite or NaN is replaced by 1 (zero point 0);
//! - quantizers map NaN to the zero point, saturate ±inf and out-of-range
//!   values, and multiply by `1 / scale` (not divide by `scale`).

use crate::rng;
use crate::spec::{Half, QBits, Rounding, PACK_HEADER_BYTES};

/// f32 → f16 bits, round to nearest even, by integer arithmetic.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return sign | 0x7e00;
    }
    if a >= 0x477f_f000 {
        // ≥ 65520 (half-way above the largest f16) rounds to infinity.
        return sign | 0x7c00;
    }
    if a >= 0x3880_0000 {
        let m = a - 0x3800_0000;
        return sign | ((m + 0x0fff + ((m >> 13) & 1)) >> 13) as u16;
    }
    let e = a >> 23;
    if e < 102 {
        return sign;
    }
    let mant = (a & 0x007f_ffff) | 0x0080_0000;
    let shift = 126 - e;
    let r = mant >> shift;
    let rem = mant & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = rem > half || (rem == half && r & 1 == 1);
    sign | (r + u32::from(up)) as u16
}

/// f16 bits → f32, exact; NaN payloads kept and quieted.
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let e = (h >> 10) & 0x1f;
    let m = h & 0x3ff;
    let bits = if e == 31 {
        if m == 0 {
            sign | 0x7f80_0000
        } else {
            sign | 0x7fc0_0000 | (m << 13)
        }
    } else if e == 0 {
        sign | (m as f32 * (1.0 / 16_777_216.0)).to_bits()
    } else {
        sign | ((e + 112) << 23) | (m << 13)
    };
    f32::from_bits(bits)
}

/// f32 → bf16 bits, round to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) & 0x8000) as u16 | 0x7fc0;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// bf16 bits → f32, exact; NaN quieted.
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    let b = u32::from(h) << 16;
    f32::from_bits(if b & 0x7fff_ffff > 0x7f80_0000 { b | 0x0040_0000 } else { b })
}

pub fn cast_to(fmt: Half, src: &[f32]) -> Vec<u16> {
    let f = match fmt {
        Half::F16 => f32_to_f16,
        Half::BF16 => f32_to_bf16,
    };
    src.iter().map(|&x| f(x)).collect()
}

pub fn cast_from(fmt: Half, src: &[u16]) -> Vec<f32> {
    let f = match fmt {
        Half::F16 => f16_to_f32,
        Half::BF16 => bf16_to_f32,
    };
    src.iter().map(|&x| f(x)).collect()
}

/// NaN-ignoring running min and max, first of equal values kept.
fn min_max(it: impl Iterator<Item = f32>) -> (f32, f32) {
    it.fold((f32::INFINITY, f32::NEG_INFINITY), |(mn, mx), v| {
        (if v < mn { v } else { mn }, if v > mx { v } else { mx })
    })
}

/// Stage one: per-row `(min, max)` over rows of `cols` (the last may be short).
pub fn row_min_max(x: &[f32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    if cols == 0 {
        return (Vec::new(), Vec::new());
    }
    x.chunks(cols).map(|r| min_max(r.iter().copied())).unzip()
}

/// Stage two: `[min, max, absmax]` of the row results.
pub fn tensor_min_max(row_min: &[f32], row_max: &[f32]) -> [f32; 3] {
    let (mn, _) = min_max(row_min.iter().copied());
    let (_, mx) = min_max(row_max.iter().copied());
    [mn, mx, abs_max(mn, mx)]
}

fn abs_max(mn: f32, mx: f32) -> f32 {
    if -mn > mx {
        -mn
    } else {
        mx
    }
}

fn valid_scale(s: f32) -> bool {
    s > 0.0 && s < f32::INFINITY
}

/// Scale and zero point for one group.
pub fn quant_params(mn: f32, mx: f32, bits: QBits, symmetric: bool) -> (f32, i32) {
    if symmetric {
        let s = abs_max(mn, mx) / bits.qmax() as f32;
        return (if valid_scale(s) { s } else { 1.0 }, 0);
    }
    let lo = if mn < 0.0 { mn } else { 0.0 };
    let hi = if mx > 0.0 { mx } else { 0.0 };
    let s = (hi - lo) / 255.0;
    if !valid_scale(s) {
        return (1.0, 0);
    }
    let zp = (-128.0 - (lo / s).round_ties_even()).clamp(-128.0, 127.0);
    (s, zp as i32)
}

/// Per-group parameters from per-group ranges.
pub fn quant_params_all(mins: &[f32], maxs: &[f32], bits: QBits, symmetric: bool) -> (Vec<f32>, Vec<i32>) {
    mins.iter().zip(maxs).map(|(&a, &b)| quant_params(a, b, bits, symmetric)).unzip()
}

/// `t` rounded to an integer-valued float.
#[inline(always)]
fn round(t: f32, rounding: Rounding, seed: u64, index: u64) -> f32 {
    match rounding {
        Rounding::Nearest => t.round_ties_even(),
        Rounding::Stochastic => {
            let f = t.floor();
            if rng::uniform(seed, index) < t - f {
                f + 1.0
            } else {
                f
            }
        }
    }
}

/// One code from the scaled value `t = x · inv`: `clamp(round(t) + zp, lo,
/// hi)`, NaN → `zp`.
#[inline(always)]
pub(crate) fn code(t: f32, zp: f32, lo: f32, hi: f32, rounding: Rounding, seed: u64, index: u64) -> f32 {
    let t = round(t, rounding, seed, index) + zp;
    let t = if t.is_nan() { zp } else { t };
    if t < lo {
        lo
    } else if t > hi {
        hi
    } else {
        t
    }
}

fn group_of(i: usize, group: usize) -> usize {
    i / group.max(1)
}

/// Int8 quantization by groups of `group` elements.
pub fn quantize_i8(
    x: &[f32],
    scale: &[f32],
    zp: &[i32],
    group: usize,
    symmetric: bool,
    rounding: Rounding,
    seed: u64,
) -> Vec<i8> {
    let lo = if symmetric { -127.0 } else { -128.0 };
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let g = group_of(i, group);
            let z = if symmetric { 0.0 } else { zp[g] as f32 };
            code(v * (1.0 / scale[g]), z, lo, 127.0, rounding, seed, i as u64) as i8
        })
        .collect()
}

/// Int8 dequantization: `(q - zp) · scale`.
pub fn dequantize_i8(q: &[i8], scale: &[f32], zp: &[i32], group: usize, symmetric: bool) -> Vec<f32> {
    q.iter()
        .enumerate()
        .map(|(i, &c)| {
            let g = group_of(i, group);
            let z = if symmetric { 0 } else { zp[g] };
            (i32::from(c) - z) as f32 * scale[g]
        })
        .collect()
}

/// Int4 symmetric block quantization, two codes a byte, low nibble first.
pub fn quantize_i4(x: &[f32], scale: &[f32], group: usize, rounding: Rounding, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; x.len().div_ceil(2)];
    for (i, &v) in x.iter().enumerate() {
        let c = code(v * (1.0 / scale[group_of(i, group)]), 0.0, -7.0, 7.0, rounding, seed, i as u64) as i32;
        out[i / 2] |= ((c & 0xf) as u8) << (4 * (i % 2));
    }
    out
}

fn nibble(q: &[u8], i: usize) -> i32 {
    let b = q[i / 2];
    let n = if i.is_multiple_of(2) { b << 4 } else { b & 0xf0 };
    i32::from((n as i8) >> 4)
}

/// Int4 dequantization of `n` codes.
pub fn dequantize_i4(q: &[u8], scale: &[f32], n: usize, group: usize) -> Vec<f32> {
    (0..n).map(|i| nibble(q, i) as f32 * scale[group_of(i, group)]).collect()
}

/// `out[i] = fma(c_j[i], s_j[g], …)` over `k` chunks of `n` codes laid end to
/// end (int8: `n` bytes each, int4: `ceil(n/2)`), scales `ceil(n/group)` each.
pub fn dequant_accumulate(q: &[u8], scale: &[f32], n: usize, group: usize, k: usize, bits: QBits, out: &mut [f32]) {
    let groups = n.div_ceil(group.max(1));
    let chunk = match bits {
        QBits::Int8 => n,
        QBits::Int4 => n.div_ceil(2),
    };
    for (i, o) in out.iter_mut().enumerate().take(n) {
        let mut acc = *o;
        for j in 0..k {
            let c = &q[j * chunk..];
            let code = match bits {
                QBits::Int8 => i32::from(c[i] as i8),
                QBits::Int4 => nibble(c, i),
            };
            acc = (code as f32).mul_add(scale[j * groups + group_of(i, group)], acc);
        }
        *o = acc;
    }
}

/// The packing step `gap = (max - min) / (2^b - 1)`, and its inverse (0 when
/// the gap is not a positive finite number).
pub fn pack_gap(mn: f32, mx: f32, bits: u8) -> (f32, f32) {
    let gap = (mx - mn) / ((1u32 << bits) - 1) as f32;
    (gap, if valid_scale(gap) { 1.0 / gap } else { 0.0 })
}

/// Bytes of a packed buffer for `n` values.
pub fn packed_len(n: usize, bits: u8) -> usize {
    PACK_HEADER_BYTES + n.div_ceil(usize::from(8 / bits))
}

/// n-bit min/max packing: header `[bits][tail][min f32 LE][max f32 LE]`, then
/// codes `round((x - min) / gap)` packed most significant bits first; `tail`
/// counts the unused code slots in the last byte.
pub fn pack(x: &[f32], mn: f32, mx: f32, bits: u8, rounding: Rounding, seed: u64) -> Vec<u8> {
    let per = usize::from(8 / bits);
    let (_, inv) = pack_gap(mn, mx, bits);
    let top = ((1u32 << bits) - 1) as f32;
    let mut out = packed_buffer(x.len(), mn, mx, bits);
    for (i, &v) in x.iter().enumerate() {
        let c = code((v - mn) * inv, 0.0, 0.0, top, rounding, seed, i as u64) as u8;
        out[PACK_HEADER_BYTES + i / per] |= c << (8 - usize::from(bits) * (i % per + 1));
    }
    out
}

/// A zeroed packed buffer for `n` values with its header written.
pub fn packed_buffer(n: usize, mn: f32, mx: f32, bits: u8) -> Vec<u8> {
    let per = usize::from(8 / bits);
    let mut out = vec![0u8; packed_len(n, bits)];
    out[0] = bits;
    out[1] = ((per - n % per) % per) as u8;
    out[2..6].copy_from_slice(&mn.to_le_bytes());
    out[6..10].copy_from_slice(&mx.to_le_bytes());
    out
}

/// Errors the reference unpacker reports (the kernel trusts its caller).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UnpackError {
    #[error("packed buffer of {len} bytes is too short for {n} values of {bits} bits")]
    TooShort { len: usize, n: usize, bits: u8 },
    #[error("packed buffer header says {found} bits, expected {expected}")]
    BitWidth { found: u8, expected: u8 },
}

/// Inverse of [`pack`]: `fma(code, gap, min)`.
pub fn unpack(buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, UnpackError> {
    let (mn, gap) = unpack_header(buf, n, bits)?;
    let per = usize::from(8 / bits);
    let mask = (1u32 << bits) - 1;
    Ok((0..n)
        .map(|i| {
            let b = u32::from(buf[PACK_HEADER_BYTES + i / per]);
            let c = (b >> (8 - usize::from(bits) * (i % per + 1))) & mask;
            (c as f32).mul_add(gap, mn)
        })
        .collect())
}

/// Checks that `buf` holds `n` values of `bits` bits and returns its
/// `(min, gap)`: what every unpacker checks before decoding.
pub fn unpack_header(buf: &[u8], n: usize, bits: u8) -> Result<(f32, f32), UnpackError> {
    if buf.len() < packed_len(n, bits) {
        return Err(UnpackError::TooShort { len: buf.len(), n, bits });
    }
    if buf[0] != bits {
        return Err(UnpackError::BitWidth { found: buf[0], expected: bits });
    }
    let rd = |o: usize| f32::from_le_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
    let (mn, mx) = (rd(2), rd(6));
    Ok((mn, pack_gap(mn, mx, bits).0))
}
