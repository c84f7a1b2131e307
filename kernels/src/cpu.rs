//! Fast CPU implementations of the kernels the gradient synchronization runs
//! most (what the runtime's host engine calls), equal bit for bit to
//! [`crate::reference`].
//!
//! They compute the reference's operations on each element, in the same
//! order, and differ only in how the loops are laid out:
//! - per-group values (`1 / scale`, the scale itself) are loaded once per
//!   group instead of once per element, and loops run over contiguous
//!   group-sized runs the compiler vectorizes;
//! - dequantize-and-accumulate runs chunk by chunk (`j` outer): each
//!   element still receives `fma(c_j, s_j, acc)` for `j = 0, 1, …` in that
//!   order, so the sums are the reference's;
//! - casts are branch-free selects over the reference's cases;
//! - on x86-64 with AVX2 and FMA (detected at run time), each kernel runs
//!   in a copy compiled for those features: `mul_add` becomes one fused
//!   instruction and `round_ties_even` one rounding instruction, both
//!   exactly rounded as IEEE 754 defines them, so the bits do not change —
//!   only the speed (without them, `mul_add` is a library call).
//! - f32 ↔ f16 on x86-64 with F16C (detected at run time) use the
//!   conversion instructions, 8 elements at a time: `vcvtps2ph` rounds to
//!   nearest even and `vcvtph2ps` widens exactly, as the reference does; a
//!   run of 8 that holds a NaN (whose payload the instructions keep where
//!   the reference gives one quiet NaN) goes through the selects instead.
//!
//! `tests/cpu_fast.rs` holds every function here to the reference on edge
//! cases, random inputs and every group, length and bit width shape.

// Calling a `#[target_feature]` copy is `unsafe`; each call is guarded by
// run-time feature detection.
#![allow(unsafe_code)]

use crate::reference::{self, pack_gap};
use crate::spec::{Half, QBits, Rounding, PACK_HEADER_BYTES};

/// Defines `pub fn $name` that runs `$body` in an AVX2+FMA copy where the
/// processor has those features, else in the baseline copy, and
/// `pub fn $base`, always the baseline copy (what a processor without them
/// runs; public so that tests hold it to the reference too).
macro_rules! multiversion {
    ($(#[$m:meta])* pub fn $name:ident / $base:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? => $body:ident) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name($($a: $t),*) $(-> $r)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                fn fast($($a: $t),*) $(-> $r)? {
                    $body($($a),*)
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the features `fast` was compiled for are present.
                    return unsafe { fast($($a),*) };
                }
            }
            $body($($a),*)
        }

        #[doc = concat!("[`", stringify!($name), "`] compiled for the baseline target only.")]
        #[allow(clippy::too_many_arguments)]
        pub fn $base($($a: $t),*) $(-> $r)? {
            $body($($a),*)
        }
    };
}

/// The elements of group `g`: `[g·group, min((g+1)·group, n))`.
#[inline(always)]
fn group_range(g: usize, group: usize, n: usize) -> std::ops::Range<usize> {
    g * group..((g + 1) * group).min(n)
}

/// Lanes of the vectorized range reduction.
const LANES: usize = 8;

#[inline(always)]
fn row_min_max_body(x: &[f32], cols: usize) -> (Vec<f32>, Vec<f32>) {
    if cols == 0 {
        return (Vec::new(), Vec::new());
    }
    x.chunks(cols)
        .map(|row| {
            let (a, b, _) = row_range(row);
            (a, b)
        })
        .unzip()
}

/// The reference's min and max of `row`, and whether every value of it is
/// finite.
#[inline(always)]
fn row_range(row: &[f32]) -> (f32, f32, bool) {
    // Lane-wise `if v < m { v } else { m }`: the reference's comparison, so
    // NaN is skipped the same way. Values that compare equal have equal bits
    // except ±0, where the reference keeps the first in row order: a row
    // whose extreme is a zero is redone in order. `v · 0` is ±0 for a finite
    // `v` and NaN for a NaN or an infinity, so the lanes' ORs of its bits
    // (an OR, unlike a sum, adds no chain of latency to the loop) say
    // whether the row is finite in the same pass.
    let (mut mn, mut mx, mut bad) = ([f32::INFINITY; LANES], [f32::NEG_INFINITY; LANES], [0u32; LANES]);
    let mut it = row.chunks_exact(LANES);
    for c in &mut it {
        for l in 0..LANES {
            mn[l] = if c[l] < mn[l] { c[l] } else { mn[l] };
            mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
            bad[l] |= (c[l] * 0.0).to_bits();
        }
    }
    let (mut a, mut b) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in mn.iter().chain(it.remainder()) {
        a = if v < a { v } else { a };
    }
    for &v in mx.iter().chain(it.remainder()) {
        b = if v > b { v } else { b };
    }
    let bad = it.remainder().iter().fold(bad.iter().fold(0, |o, &v| o | v), |o, &v| o | (v * 0.0).to_bits());
    let finite = bad & 0x7fff_ffff == 0;
    if a == 0.0 || b == 0.0 {
        let (r, s) = reference::row_min_max(row, row.len());
        return (r[0], s[0], finite);
    }
    (a, b, finite)
}

multiversion! {
    /// [`reference::row_min_max`].
    pub fn row_min_max / row_min_max_baseline(x: &[f32], cols: usize) -> (Vec<f32>, Vec<f32>) => row_min_max_body
}

#[inline(always)]
fn range_finite_body(x: &[f32]) -> (f32, f32, bool) {
    row_range(x)
}

multiversion! {
    /// The min and max of `x` as one row ([`reference::row_min_max`] with
    /// `cols = x.len()`: `(inf, -inf)` for an empty or all-NaN `x`), and
    /// whether every value of `x` is finite, in one pass.
    pub fn range_finite / range_finite_baseline(x: &[f32]) -> (f32, f32, bool) => range_finite_body
}

/// The reference's `code(t, 0, lo, hi, …)` as an integer: `t` rounded,
/// NaN to 0, clamped to `[lo, hi]`.
#[inline(always)]
fn code_int(t: f32, lo: f32, hi: f32, rounding: Rounding, seed: u64, index: u64) -> i32 {
    let t = match rounding {
        // The reference's `round_ties_even` and `+ zp` with zp = 0, written
        // out so the loop vectorizes.
        Rounding::Nearest => {
            let t = t.round_ties_even() + 0.0;
            let t = if t.is_nan() { 0.0 } else { t };
            if t < lo {
                lo
            } else if t > hi {
                hi
            } else {
                t
            }
        }
        Rounding::Stochastic => reference::code(t, 0.0, lo, hi, rounding, seed, index),
    };
    // SAFETY: `t` is an integer in `[lo, hi]` ⊂ [-128, 255], never NaN.
    unsafe { t.to_int_unchecked::<i32>() }
}

/// Codes of `x` by groups, as bytes (two's complement).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn quantize_codes(
    x: &[f32],
    scales: &[f32],
    group: usize,
    lo: f32,
    hi: f32,
    rounding: Rounding,
    seed: u64,
    out: &mut [u8],
) {
    let group = group.max(1);
    for (g, &s) in scales.iter().enumerate().take(x.len().div_ceil(group)) {
        let r = group_range(g, group, x.len());
        code_run(&x[r.clone()], 1.0 / s, lo, hi, rounding, seed, r.start as u64, &mut out[r]);
    }
}

/// The codes of one run of a group (`inv` = 1 / its scale), its first
/// element being element `first` of the tensor.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn code_run(xs: &[f32], inv: f32, lo: f32, hi: f32, rounding: Rounding, seed: u64, first: u64, os: &mut [u8]) {
    for ((o, &v), i) in os.iter_mut().zip(xs).zip(first..) {
        *o = code_int(v * inv, lo, hi, rounding, seed, i) as i8 as u8;
    }
}

#[inline(always)]
fn quantize_sym_body(x: &[f32], scales: &[f32], group: usize, bits: QBits, rounding: Rounding, seed: u64) -> Vec<u8> {
    let mut codes = vec![0u8; x.len()];
    match bits {
        QBits::Int8 => {
            quantize_codes(x, scales, group, -127.0, 127.0, rounding, seed, &mut codes);
            codes
        }
        QBits::Int4 => {
            quantize_codes(x, scales, group, -7.0, 7.0, rounding, seed, &mut codes);
            // Two codes a byte, low nibble first: a loop over whole pairs
            // (it vectorizes), then the odd last code with a zero nibble.
            let mut out = vec![0u8; x.len().div_ceil(2)];
            let pairs = codes.chunks_exact(2);
            let last = pairs.remainder().first().copied();
            for (o, p) in out.iter_mut().zip(pairs) {
                *o = (p[0] & 0xf) | (p[1] << 4);
            }
            if let Some(c) = last {
                out[x.len() / 2] = c & 0xf;
            }
            out
        }
    }
}

multiversion! {
    /// Symmetric block quantization: [`reference::quantize_i8`] with
    /// `symmetric = true` (codes as bytes), or [`reference::quantize_i4`].
    pub fn quantize_sym / quantize_sym_baseline(x: &[f32], scales: &[f32], group: usize, bits: QBits, rounding: Rounding, seed: u64) -> Vec<u8>
        => quantize_sym_body
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn encode_block_sym_body(
    x: &[f32],
    first: u64,
    group: usize,
    bits: QBits,
    rounding: Rounding,
    seed: u64,
    scales_out: &mut [u8],
    codes_out: &mut [u8],
) {
    let group = group.max(1);
    let (lo, hi) = match bits {
        QBits::Int8 => (-127.0, 127.0),
        QBits::Int4 => (-7.0, 7.0),
    };
    // Int4: a group's codes go through `tmp`, then two a byte; a code left
    // over (an odd group) waits for the next group's first.
    let mut tmp = vec![0u8; if bits == QBits::Int4 { group.min(x.len()) } else { 0 }];
    let (mut at, mut pending) = (0usize, None::<u8>);
    for (g, head) in scales_out.chunks_exact_mut(4).enumerate().take(x.len().div_ceil(group)) {
        let r = group_range(g, group, x.len());
        let xs = &x[r.clone()];
        let (mn, mx, finite) = row_range(xs);
        let s = reference::quant_params(mn, mx, bits, true).0;
        head.copy_from_slice(&if finite { s } else { f32::NAN }.to_le_bytes());
        let start = first + r.start as u64;
        match bits {
            QBits::Int8 => code_run(xs, 1.0 / s, lo, hi, rounding, seed, start, &mut codes_out[r]),
            QBits::Int4 => {
                let cs = &mut tmp[..xs.len()];
                code_run(xs, 1.0 / s, lo, hi, rounding, seed, start, cs);
                let mut cs: &[u8] = cs;
                if let Some(low) = pending.take() {
                    if let Some((&c, rest)) = cs.split_first() {
                        codes_out[at] = (low & 0xf) | (c << 4);
                        at += 1;
                        cs = rest;
                    }
                }
                let pairs = cs.chunks_exact(2);
                pending = pairs.remainder().first().copied();
                for (o, p) in codes_out[at..].iter_mut().zip(pairs) {
                    *o = (p[0] & 0xf) | (p[1] << 4);
                }
                at += cs.len() / 2;
            }
        }
    }
    if let Some(low) = pending {
        codes_out[at] = low & 0xf;
    }
}

multiversion! {
    /// One pass of qgZ's block encoder over `x`, group by group while the
    /// group is in the caches: per group of `group` its range
    /// ([`reference::row_min_max`]), its symmetric scale
    /// ([`reference::quant_params`]) written to `scales_out` as 4
    /// little-endian bytes — NaN instead where the group holds a NaN or an
    /// infinity — and its codes ([`quantize_sym`]'s bytes) to `codes_out`.
    /// `x[0]` is element `first` of the tensor (stochastic rounding's
    /// counter). `scales_out` holds `4·ceil(n/group)` bytes, `codes_out` `n`
    /// (int8) or `ceil(n/2)` (int4).
    pub fn encode_block_sym / encode_block_sym_baseline(x: &[f32], first: u64, group: usize, bits: QBits, rounding: Rounding, seed: u64, scales_out: &mut [u8], codes_out: &mut [u8])
        => encode_block_sym_body
}

#[inline(always)]
fn dequant_accumulate_body(q: &[u8], scale: &[f32], n: usize, group: usize, k: usize, bits: QBits, out: &mut [f32]) {
    let group = group.max(1);
    let groups = n.div_ceil(group);
    let chunk = match bits {
        QBits::Int8 => n,
        QBits::Int4 => n.div_ceil(2),
    };
    let n = n.min(out.len());
    for j in 0..k {
        let codes = &q[j * chunk..j * chunk + chunk];
        for (g, &s) in scale[j * groups..(j + 1) * groups].iter().enumerate() {
            let r = group_range(g, group, n);
            if r.is_empty() {
                break;
            }
            match bits {
                QBits::Int8 => {
                    for (o, &c) in out[r.clone()].iter_mut().zip(&codes[r]) {
                        *o = f32::from(c as i8).mul_add(s, *o);
                    }
                }
                QBits::Int4 => dequant_accumulate_nibbles(codes, r, s, out),
            }
        }
    }
}

/// Elements of the sum [`dequant_mean`] finishes at a time, at least:
/// 16 KiB of f32, rounded up to an even number of whole groups.
pub const DEQUANT_SLICE: usize = 4096;

/// [`dequant_mean`]'s slice for `group`: whole groups, an even number of
/// them (so int4 codes start on a byte), at least [`DEQUANT_SLICE`]
/// elements.
pub fn dequant_slice(group: usize) -> usize {
    let group = group.max(1);
    DEQUANT_SLICE.div_ceil(group).max(2).next_multiple_of(2) * group
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dequant_mean_body(
    heads: &[&[u8]],
    codes: &[&[u8]],
    group: usize,
    bits: QBits,
    div: f32,
    first: usize,
    out: &mut [f32],
) {
    let group = group.max(1);
    let slice = dequant_slice(group);
    let mut scales = Vec::with_capacity(slice / group);
    for (k, sum) in out.chunks_mut(slice).enumerate() {
        // Elements `at..` of every block: whole groups, and a whole byte of
        // int4 codes (`first` is a multiple of the slice in the fast path).
        let at = first + k * slice;
        let (g0, ng) = (at / group, sum.len().div_ceil(group));
        let c0 = match bits {
            QBits::Int8 => at,
            QBits::Int4 => at / 2,
        };
        sum.fill(0.0);
        for (h, c) in heads.iter().zip(codes) {
            scales.clear();
            scales
                .extend(h[4 * g0..4 * (g0 + ng)].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
            dequant_accumulate_body(&c[c0..], &scales, sum.len(), group, 1, bits, sum);
        }
        if div != 1.0 {
            sum.iter_mut().for_each(|v| *v /= div);
        }
    }
}

multiversion! {
    /// qgZ's decoding of `k` blocks of one slice: `out[i] = (Σ_j
    /// dequant(block_j)[first + i]) / div`, the sum taken in block order
    /// starting from 0 (no division when `div` is 1) — bit for bit a zeroed
    /// sum, a [`dequant_accumulate`] of each block in turn and a division,
    /// in one pass over `out`: a slice of [`dequant_slice`] elements at a
    /// time, every block added into it while it is in the cache. Block `j`
    /// is its scales as little-endian f32 bytes (`heads[j]`, one a group of
    /// the whole slice) and its codes (`codes[j]`, int8 bytes or int4
    /// nibbles, low first). `first` is a multiple of `dequant_slice(group)`
    /// and every block holds `first + out.len()` elements; the caller
    /// checks the lengths (the runtime's engines do), as for
    /// [`dequant_accumulate`].
    pub fn dequant_mean / dequant_mean_baseline(heads: &[&[u8]], codes: &[&[u8]], group: usize, bits: QBits, div: f32, first: usize, out: &mut [f32])
        => dequant_mean_body
}

/// The signed code of element `i` of int4 `codes` (low nibble first).
#[inline(always)]
fn nibble(codes: &[u8], i: usize) -> f32 {
    let b = codes[i / 2];
    let nib = if i.is_multiple_of(2) { b << 4 } else { b & 0xf0 };
    f32::from((nib as i8) >> 4)
}

/// `out[i] = fma(code_i, s, out[i])` over the int4 codes of `r`: an odd first
/// element alone, then whole bytes (two elements each, a loop that
/// vectorizes), then an odd last element.
#[inline(always)]
fn dequant_accumulate_nibbles(codes: &[u8], r: std::ops::Range<usize>, s: f32, out: &mut [f32]) {
    let (mut a, b) = (r.start, r.end);
    if a % 2 == 1 && a < b {
        out[a] = nibble(codes, a).mul_add(s, out[a]);
        a += 1;
    }
    let whole = (b - a) / 2;
    let bytes = &codes[a / 2..a / 2 + whole];
    for (o, &c) in out[a..a + 2 * whole].chunks_exact_mut(2).zip(bytes) {
        o[0] = f32::from(((c << 4) as i8) >> 4).mul_add(s, o[0]);
        o[1] = f32::from((c as i8) >> 4).mul_add(s, o[1]);
    }
    if a + 2 * whole < b {
        let i = b - 1;
        out[i] = nibble(codes, i).mul_add(s, out[i]);
    }
}

multiversion! {
    /// [`reference::dequant_accumulate`].
    pub fn dequant_accumulate / dequant_accumulate_baseline(q: &[u8], scale: &[f32], n: usize, group: usize, k: usize, bits: QBits, out: &mut [f32])
        => dequant_accumulate_body
}

/// Elements a packing or unpacking loop handles at once: their codes, one
/// byte each, sit in a stack array between a loop that vectorizes as the
/// 8-bit one does and the (cheap) combining of codes into bytes, instead of
/// one loop over bytes whose inner loop of `8/B` shifts does not vectorize.
const PACK_BLOCK: usize = 256;

#[inline(always)]
fn pack_codes<const B: usize>(x: &[f32], mn: f32, inv: f32, rounding: Rounding, seed: u64, out: &mut [u8]) {
    let per = 8 / B;
    let top = ((1u32 << B) - 1) as f32;
    // Codes are packed as they are computed: no intermediate buffer the
    // size of `x` (a fresh one per call costs its page faults).
    let mut codes = [0u8; PACK_BLOCK];
    for ((xs, o), k) in x.chunks(PACK_BLOCK).zip(out.chunks_mut(PACK_BLOCK / per)).zip(0u64..) {
        let first = k * PACK_BLOCK as u64;
        for ((c, &v), i) in codes.iter_mut().zip(xs).zip(first..) {
            *c = code_int((v - mn) * inv, 0.0, top, rounding, seed, i) as u8;
        }
        if B == 8 {
            o.copy_from_slice(&codes[..xs.len()]);
            continue;
        }
        // The last block's tail: codes past the end are zero, as the
        // reference leaves a partial byte's unused low bits.
        codes[xs.len()..].fill(0);
        for (byte, cs) in o.iter_mut().zip(codes.chunks_exact(per)) {
            let mut acc = 0u8;
            for (l, &c) in cs.iter().enumerate() {
                acc |= c << (8 - B * (l + 1));
            }
            *byte = acc;
        }
    }
}

#[inline(always)]
fn pack_body(x: &[f32], mn: f32, mx: f32, bits: u8, rounding: Rounding, seed: u64) -> Vec<u8> {
    let (_, inv) = pack_gap(mn, mx, bits);
    let mut out = reference::packed_buffer(x.len(), mn, mx, bits);
    let body = &mut out[PACK_HEADER_BYTES..];
    match bits {
        1 => pack_codes::<1>(x, mn, inv, rounding, seed, body),
        2 => pack_codes::<2>(x, mn, inv, rounding, seed, body),
        4 => pack_codes::<4>(x, mn, inv, rounding, seed, body),
        8 => pack_codes::<8>(x, mn, inv, rounding, seed, body),
        _ => return reference::pack(x, mn, mx, bits, rounding, seed),
    }
    out
}

multiversion! {
    /// [`reference::pack`] (`bits` ∈ {1, 2, 4, 8}).
    pub fn pack / pack_baseline(x: &[f32], mn: f32, mx: f32, bits: u8, rounding: Rounding, seed: u64) -> Vec<u8> => pack_body
}

#[inline(always)]
fn unpack_codes<const B: usize, const ADD: bool>(codes: &[u8], gap: f32, mn: f32, out: &mut [f32]) {
    let per = 8 / B;
    let mask = ((1u32 << B) - 1) as u8;
    let mut block = [0u8; PACK_BLOCK];
    for (o, bytes) in out.chunks_mut(PACK_BLOCK).zip(codes.chunks(PACK_BLOCK / per)) {
        let cs: &[u8] = if B == 8 {
            bytes
        } else {
            for (b, c) in bytes.iter().zip(block.chunks_exact_mut(per)) {
                for (l, c) in c.iter_mut().enumerate() {
                    *c = (b >> (8 - B * (l + 1))) & mask;
                }
            }
            &block
        };
        for (v, &c) in o.iter_mut().zip(cs) {
            let x = f32::from(c).mul_add(gap, mn);
            *v = if ADD { *v + x } else { x };
        }
    }
}

/// Checks a packed buffer's length and width as the reference does, then
/// decodes its `n` values into `out` (`out[i] += value` with `ADD`).
#[inline(always)]
fn unpack_into<const ADD: bool>(buf: &[u8], n: usize, bits: u8, out: &mut [f32]) -> Result<(), reference::UnpackError> {
    let (mn, gap) = reference::unpack_header(buf, n, bits)?;
    let codes = &buf[PACK_HEADER_BYTES..];
    let out = &mut out[..n];
    match bits {
        1 => unpack_codes::<1, ADD>(codes, gap, mn, out),
        2 => unpack_codes::<2, ADD>(codes, gap, mn, out),
        4 => unpack_codes::<4, ADD>(codes, gap, mn, out),
        8 => unpack_codes::<8, ADD>(codes, gap, mn, out),
        _ => {
            for (o, v) in out.iter_mut().zip(reference::unpack(buf, n, bits)?) {
                *o = if ADD { *o + v } else { v };
            }
        }
    }
    Ok(())
}

#[inline(always)]
fn unpack_body(buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, reference::UnpackError> {
    let mut out = vec![0f32; n];
    unpack_into::<false>(buf, n, bits, &mut out)?;
    Ok(out)
}

multiversion! {
    /// [`reference::unpack`], its errors included.
    pub fn unpack / unpack_baseline(buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, reference::UnpackError> => unpack_body
}

#[inline(always)]
fn unpack_accumulate_body(buf: &[u8], n: usize, bits: u8, out: &mut [f32]) -> Result<(), reference::UnpackError> {
    unpack_into::<true>(buf, n, bits, out)
}

multiversion! {
    /// `out[i] += reference::unpack(buf, n, bits)[i]` (one f32 addition per
    /// element, as a separate unpack and sum would do) without the
    /// intermediate vector; `out` holds at least `n` values.
    pub fn unpack_accumulate / unpack_accumulate_baseline(buf: &[u8], n: usize, bits: u8, out: &mut [f32]) -> Result<(), reference::UnpackError>
        => unpack_accumulate_body
}

/// Elements of the sum [`unpack_mean`] finishes at a time: 8 KiB of f32,
/// which stay in the first-level cache while every buffer is added into
/// them (a multiple of [`PACK_BLOCK`], so each slice starts on a byte of
/// codes at every width).
pub const MEAN_BLOCK: usize = 2048;

#[inline(always)]
fn unpack_mean_body(
    bufs: &[&[u8]],
    n: usize,
    bits: u8,
    div: f32,
    first: usize,
    out: &mut [f32],
) -> Result<(), reference::UnpackError> {
    let heads = bufs.iter().map(|b| reference::unpack_header(b, n, bits)).collect::<Result<Vec<_>, _>>()?;
    let len = out.len().min(n.saturating_sub(first));
    let out = &mut out[..len];
    if !matches!(bits, 1 | 2 | 4 | 8) || !first.is_multiple_of(PACK_BLOCK) {
        // Widths the reference alone knows, or a start inside a byte: the
        // passes one after the other.
        out.fill(0.0);
        for b in bufs {
            let vals = reference::unpack(b, n, bits)?;
            out.iter_mut().zip(&vals[first..]).for_each(|(o, v)| *o += v);
        }
        out.iter_mut().for_each(|v| *v /= div);
        return Ok(());
    }
    for (k, sum) in out.chunks_mut(MEAN_BLOCK).enumerate() {
        // Codes of elements `at..`: `at` is a multiple of 8, so a whole byte.
        let at = first + k * MEAN_BLOCK;
        let byte = PACK_HEADER_BYTES + at * usize::from(bits) / 8;
        sum.fill(0.0);
        for (b, &(mn, gap)) in bufs.iter().zip(&heads) {
            let codes = &b[byte..];
            match bits {
                1 => unpack_codes::<1, true>(codes, gap, mn, sum),
                2 => unpack_codes::<2, true>(codes, gap, mn, sum),
                4 => unpack_codes::<4, true>(codes, gap, mn, sum),
                _ => unpack_codes::<8, true>(codes, gap, mn, sum),
            }
        }
        sum.iter_mut().for_each(|v| *v /= div);
    }
    Ok(())
}

multiversion! {
    /// n-bit's decoding: `out[i] = (Σ_j reference::unpack(bufs[j], n,
    /// bits)[first + i]) / div`, the sum taken in buffer order starting from
    /// 0 — bit for bit a zeroed sum, an [`unpack_accumulate`] of each buffer
    /// in turn and a division, in one pass over `out`: [`MEAN_BLOCK`]
    /// elements at a time, every buffer added into them while they are in
    /// the cache (the passes one after the other stream the whole sum from
    /// memory `P + 2` times). `out` holds elements `first..` (at most up to
    /// `n`); `first` is a multiple of 256 for the fast path. Every buffer's
    /// length and width are checked first, as [`reference::unpack`] does.
    pub fn unpack_mean / unpack_mean_baseline(bufs: &[&[u8]], n: usize, bits: u8, div: f32, first: usize, out: &mut [f32]) -> Result<(), reference::UnpackError>
        => unpack_mean_body
}

/// `if c { a } else { b }` without a branch.
#[inline(always)]
fn sel(c: bool, a: u32, b: u32) -> u32 {
    let m = 0u32.wrapping_sub(u32::from(c));
    (a & m) | (b & !m)
}

/// [`reference::f32_to_f16`] as selects over its four cases.
#[inline(always)]
fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = (b >> 16) & 0x8000;
    let a = b & 0x7fff_ffff;
    // Normal results: round the mantissa to 10 bits, ties to even.
    let m = a.wrapping_sub(0x3800_0000);
    let normal = (m.wrapping_add(0x0fff).wrapping_add((m >> 13) & 1)) >> 13;
    // Subnormal results: shift the full mantissa right by 126 − e (14..=24
    // where used; clamped so the unused lanes stay defined).
    let e = a >> 23;
    let shift = 126u32.wrapping_sub(e).clamp(1, 31);
    let mant = (a & 0x007f_ffff) | 0x0080_0000;
    let r = mant >> shift;
    let rem = mant & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = u32::from((rem > half) | ((rem == half) & (r & 1 == 1)));
    let sub = (r + up) & 0u32.wrapping_sub(u32::from(e >= 102));
    let v = sel(a >= 0x3880_0000, normal, sub);
    let v = sel(a >= 0x477f_f000, 0x7c00, v);
    let v = sel(a > 0x7f80_0000, 0x7e00, v);
    (sign | v) as u16
}

/// [`reference::f16_to_f32`] as selects over its three cases.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let e = (h >> 10) & 0x1f;
    let m = h & 0x3ff;
    let special = sel(m == 0, 0x7f80_0000, 0x7fc0_0000 | (m << 13));
    let sub = (m as f32 * (1.0 / 16_777_216.0)).to_bits();
    let normal = ((e + 112) << 23) | (m << 13);
    let bits = sel(e == 31, special, sel(e == 0, sub, normal));
    f32::from_bits(sign | bits)
}

/// `out[i] = f(src[i])` as a plain indexed loop (which vectorizes where an
/// iterator `collect` of the same map does not).
#[inline(always)]
fn map_into<A: Copy, B: Copy + Default>(src: &[A], f: impl Fn(A) -> B) -> Vec<B> {
    let mut out = vec![B::default(); src.len()];
    for (o, &x) in out.iter_mut().zip(src) {
        *o = f(x);
    }
    out
}

#[inline(always)]
fn cast_to_body(fmt: Half, src: &[f32]) -> Vec<u16> {
    match fmt {
        Half::F16 => map_into(src, f32_to_f16),
        Half::BF16 => map_into(src, reference::f32_to_bf16),
    }
}

#[inline(always)]
fn cast_from_body(fmt: Half, src: &[u16]) -> Vec<f32> {
    match fmt {
        Half::F16 => map_into(src, f16_to_f32),
        Half::BF16 => map_into(src, reference::bf16_to_f32),
    }
}

multiversion! {
    /// [`reference::cast_to`] without the conversion instructions (what
    /// [`cast_to`] runs where the processor lacks F16C, and for bf16).
    pub fn cast_to_selects / cast_to_baseline(fmt: Half, src: &[f32]) -> Vec<u16> => cast_to_body
}

multiversion! {
    /// [`reference::cast_from`] without the conversion instructions.
    pub fn cast_from_selects / cast_from_baseline(fmt: Half, src: &[u16]) -> Vec<f32> => cast_from_body
}

/// [`reference::cast_to`].
pub fn cast_to(fmt: Half, src: &[f32]) -> Vec<u16> {
    #[cfg(target_arch = "x86_64")]
    if fmt == Half::F16 && f16c::available() {
        let mut out = vec![0u16; src.len()];
        // SAFETY: x86-64 is little-endian, so the u16s' bytes are their
        // wire form, and bytes have no alignment; `available` checked the
        // features `to_le` was compiled for.
        unsafe {
            let bytes = std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), 2 * src.len());
            f16c::to_le(src, 1.0, bytes);
        }
        return out;
    }
    cast_to_selects(fmt, src)
}

/// [`reference::cast_from`].
pub fn cast_from(fmt: Half, src: &[u16]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if fmt == Half::F16 && f16c::available() {
        let mut out = vec![0f32; src.len()];
        // SAFETY: as in `cast_to`.
        unsafe {
            let bytes = std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), 2 * src.len());
            f16c::from_le::<false>(bytes, &mut out);
        }
        return out;
    }
    cast_from_selects(fmt, src)
}

/// `f(x / div)` (`f(x)` when `div` is 1) into 2 little-endian bytes an
/// element.
#[inline(always)]
fn to_le_with(src: &[f32], div: f32, out: &mut [u8], f: impl Fn(f32) -> u16) {
    assert_eq!(out.len(), 2 * src.len(), "cast_to_le: 2 bytes an element");
    if div == 1.0 {
        for (o, &x) in out.chunks_exact_mut(2).zip(src) {
            o.copy_from_slice(&f(x).to_le_bytes());
        }
    } else {
        for (o, &x) in out.chunks_exact_mut(2).zip(src) {
            o.copy_from_slice(&f(x / div).to_le_bytes());
        }
    }
}

#[inline(always)]
fn cast_to_le_body(fmt: Half, src: &[f32], div: f32, out: &mut [u8]) {
    match fmt {
        Half::F16 => to_le_with(src, div, out, f32_to_f16),
        Half::BF16 => to_le_with(src, div, out, reference::f32_to_bf16),
    }
}

/// `out[i] (+)= f(le16(src[2i..]))`: decoded, or added to what `out` holds.
#[inline(always)]
fn from_le_with<const ADD: bool>(src: &[u8], out: &mut [f32], f: impl Fn(u16) -> f32) {
    assert_eq!(src.len(), 2 * out.len(), "cast_from_le: 2 bytes an element");
    for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
        let v = f(u16::from_le_bytes([b[0], b[1]]));
        if ADD {
            *o += v;
        } else {
            *o = v;
        }
    }
}

#[inline(always)]
fn cast_from_le_body(fmt: Half, src: &[u8], out: &mut [f32]) {
    match fmt {
        Half::F16 => from_le_with::<false>(src, out, f16_to_f32),
        Half::BF16 => from_le_with::<false>(src, out, reference::bf16_to_f32),
    }
}

#[inline(always)]
fn accumulate_le_body(fmt: Half, src: &[u8], out: &mut [f32]) {
    match fmt {
        Half::F16 => from_le_with::<true>(src, out, f16_to_f32),
        Half::BF16 => from_le_with::<true>(src, out, reference::bf16_to_f32),
    }
}

multiversion! {
    /// [`cast_to_le`] without the conversion instructions.
    pub fn cast_to_le_selects / cast_to_le_baseline(fmt: Half, src: &[f32], div: f32, out: &mut [u8]) => cast_to_le_body
}

multiversion! {
    /// [`cast_from_le`] without the conversion instructions.
    pub fn cast_from_le_selects / cast_from_le_baseline(fmt: Half, src: &[u8], out: &mut [f32]) => cast_from_le_body
}

multiversion! {
    /// [`accumulate_le`] without the conversion instructions.
    pub fn accumulate_le_selects / accumulate_le_baseline(fmt: Half, src: &[u8], out: &mut [f32]) => accumulate_le_body
}

/// `out = le_bytes(cast(src[i] / div))`: [`reference::cast_to`] of the
/// scaled values, written as the wire carries them, in one pass (`out` is
/// `2·src.len()` bytes).
pub fn cast_to_le(fmt: Half, src: &[f32], div: f32, out: &mut [u8]) {
    assert_eq!(out.len(), 2 * src.len(), "cast_to_le: 2 bytes an element");
    #[cfg(target_arch = "x86_64")]
    if fmt == Half::F16 && f16c::available() {
        // SAFETY: `available` checked the features `to_le` was compiled for.
        return unsafe { f16c::to_le(src, div, out) };
    }
    cast_to_le_selects(fmt, src, div, out)
}

/// `out[i] = widen(le16(src))`: [`reference::cast_from`] of wire bytes.
pub fn cast_from_le(fmt: Half, src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), 2 * out.len(), "cast_from_le: 2 bytes an element");
    #[cfg(target_arch = "x86_64")]
    if fmt == Half::F16 && f16c::available() {
        // SAFETY: as in `cast_to_le`.
        return unsafe { f16c::from_le::<false>(src, out) };
    }
    cast_from_le_selects(fmt, src, out)
}

/// `out[i] += widen(le16(src))`, in one pass.
pub fn accumulate_le(fmt: Half, src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), 2 * out.len(), "accumulate_le: 2 bytes an element");
    #[cfg(target_arch = "x86_64")]
    if fmt == Half::F16 && f16c::available() {
        // SAFETY: as in `cast_to_le`.
        return unsafe { f16c::from_le::<true>(src, out) };
    }
    accumulate_le_selects(fmt, src, out)
}

/// f32 ↔ f16 with the F16C conversion instructions (module doc).
#[cfg(target_arch = "x86_64")]
mod f16c {
    use std::arch::x86_64::*;

    /// Whether this processor runs [`to_le`] and [`from_le`].
    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
    }

    /// `out = le_bytes(f16(src[i] / div))` (`src[i]` itself when `div` is
    /// 1); `out` is `2·src.len()` bytes.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn to_le(src: &[f32], div: f32, out: &mut [u8]) {
        debug_assert_eq!(out.len(), 2 * src.len());
        let whole = src.len() / 8 * 8;
        // Dividing by a power of two is multiplying by its reciprocal, which
        // is exact: both are the correctly rounded `x · 2^-k`.
        let recip = 1.0 / div;
        let by_recip = div.is_normal() && div.to_bits() & 0x007f_ffff == 0 && recip.is_normal();
        let (d, r) = (_mm256_set1_ps(div), _mm256_set1_ps(recip));
        for i in (0..whole).step_by(8) {
            // SAFETY: `i + 8 <= src.len()` and `2(i + 8) <= out.len()`;
            // both accesses are unaligned ones.
            unsafe {
                let mut v = _mm256_loadu_ps(src.as_ptr().add(i));
                if by_recip {
                    v = _mm256_mul_ps(v, r);
                } else {
                    v = _mm256_div_ps(v, d);
                }
                if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v)) == 0 {
                    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                    _mm_storeu_si128(out.as_mut_ptr().add(2 * i).cast(), h);
                    continue;
                }
            }
            super::to_le_with(&src[i..i + 8], div, &mut out[2 * i..2 * i + 16], super::f32_to_f16);
        }
        super::to_le_with(&src[whole..], div, &mut out[2 * whole..], super::f32_to_f16);
    }

    /// `out[i] = f32(le16(src))`, or `out[i] += …` with `ADD`; `src` is
    /// `2·out.len()` bytes.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn from_le<const ADD: bool>(src: &[u8], out: &mut [f32]) {
        debug_assert_eq!(src.len(), 2 * out.len());
        let whole = out.len() / 8 * 8;
        let magnitude = _mm_set1_epi16(0x7fff);
        let inf = _mm_set1_epi16(0x7c00);
        for i in (0..whole).step_by(8) {
            // SAFETY: `2(i + 8) <= src.len()` and `i + 8 <= out.len()`;
            // unaligned accesses.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(2 * i).cast());
                // NaN: magnitude above infinity's (a signed compare; both
                // sides are below 0x8000).
                if _mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, magnitude), inf)) == 0 {
                    let mut v = _mm256_cvtph_ps(h);
                    if ADD {
                        v = _mm256_add_ps(_mm256_loadu_ps(out.as_ptr().add(i)), v);
                    }
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
                    continue;
                }
            }
            super::from_le_with::<ADD>(&src[2 * i..2 * i + 16], &mut out[i..i + 8], super::f16_to_f32);
        }
        super::from_le_with::<ADD>(&src[2 * whole..], &mut out[whole..], super::f16_to_f32);
    }
}
