//! The CPU check: every kernel's LLVM IR, JIT-compiled for the host, against
//! the reference — bitwise on edge cases and seeded random inputs (lengths
//! that are not multiples of the vector width or block, misaligned slices),
//! and statistically for stochastic rounding.

#![allow(clippy::excessive_precision)] // tie cases are written out in full

mod common;

use common::edge_f32;
use inkwell::context::Context;
use qsync_kernels::reference as r;
use qsync_kernels::{Half, HostKernels, QBits, Rounding};

/// A small seeded generator for test data (splitmix64).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        qsync_kernels::rng::hash(0x5eed, {
            self.0 += 1;
            self.0
        })
    }
    fn bits_f32(&mut self) -> f32 {
        f32::from_bits(self.next() as u32)
    }
    fn normal_ish(&mut self, scale: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / 16_777_216.0;
        let v = (self.next() >> 40) as f32 / 16_777_216.0;
        (u + v - 1.0) * scale
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn random_f32(g: &mut Gen, n: usize) -> Vec<f32> {
    (0..n).map(|i| if i % 3 == 0 { g.bits_f32() } else { g.normal_ish(100.0) }).collect()
}

#[test]
fn casts_match_reference_bitwise() {
    let ctx = Context::create();
    let k = HostKernels::new(&ctx).expect("kernels compile for the host");
    let mut g = Gen(1);
    let mut inputs = edge_f32();
    inputs.extend(random_f32(&mut g, 20_003));
    for h in [Half::F16, Half::BF16] {
        let want = r::cast_to(h, &inputs);
        assert_eq!(k.cast_to(h, &inputs).expect("cast"), want, "{h:?}");
        // Misaligned source and destination: the scalar path.
        let mut dst = vec![0u16; inputs.len()];
        k.cast_to_into(h, &inputs[1..], &mut dst[1..]).expect("cast");
        assert_eq!(&dst[1..], &want[1..], "{h:?} misaligned");
        // Lengths around the vector width.
        for n in 0..9 {
            assert_eq!(k.cast_to(h, &inputs[..n]).expect("cast"), want[..n], "{h:?} n={n}");
        }
        // Every 16-bit pattern back to f32.
        let all: Vec<u16> = (0..=u16::MAX).collect();
        assert_eq!(bits(&k.cast_from(h, &all).expect("cast")), bits(&r::cast_from(h, &all)), "{h:?} widen");
        assert_eq!(
            bits(&k.cast_from(h, &all[3..]).expect("cast")),
            bits(&r::cast_from(h, &all[3..])),
            "{h:?} widen misaligned"
        );
    }
}

#[test]
fn reference_casts_agree_with_the_half_crate_off_nan() {
    let mut g = Gen(2);
    let mut inputs = edge_f32();
    inputs.extend((0..200_000).map(|_| g.bits_f32()));
    for &x in &inputs {
        if x.is_nan() {
            assert_eq!(r::f32_to_f16(x) & 0x7fff, 0x7e00);
            assert_eq!(r::f32_to_bf16(x) & 0x7fff, 0x7fc0);
            continue;
        }
        assert_eq!(r::f32_to_f16(x), half::f16::from_f32(x).to_bits(), "{x:e} ({:#x})", x.to_bits());
        assert_eq!(r::f32_to_bf16(x), half::bf16::from_f32(x).to_bits(), "{x:e} ({:#x})", x.to_bits());
    }
    for h in 0..=u16::MAX {
        let a = r::f16_to_f32(h);
        let b = half::f16::from_bits(h).to_f32();
        assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{h:#x}");
        let a = r::bf16_to_f32(h);
        let b = half::bf16::from_bits(h).to_f32();
        assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{h:#x}");
    }
}

/// Quantizer inputs: edge values, then seeded random values.
fn quant_inputs(g: &mut Gen, n: usize) -> Vec<f32> {
    let mut x = edge_f32();
    x.extend((0..n).map(|i| if i % 97 == 0 { g.bits_f32() } else { g.normal_ish(3.0) }));
    x
}

#[test]
fn range_reduction_two_stages_matches() {
    let ctx = Context::create();
    let k = HostKernels::new(&ctx).expect("compile");
    let mut g = Gen(3);
    for (n, cols) in [(0, 4), (1, 1), (7, 3), (1000, 64), (1001, 64), (5000, 1), (300, 1000)] {
        let mut x = random_f32(&mut g, n);
        if n > 10 {
            x[3] = f32::NAN;
            x[5] = -0.0;
        }
        let (a, b) = k.row_min_max(&x, cols).expect("rows");
        let (ra, rb) = r::row_min_max(&x, cols);
        assert_eq!((bits(&a), bits(&b)), (bits(&ra), bits(&rb)), "n={n} cols={cols}");
        let t = k.tensor_min_max(&a, &b).expect("tensor");
        assert_eq!(bits(&t), bits(&r::tensor_min_max(&ra, &rb)), "n={n} cols={cols}");
    }
    let all_nan = [f32::NAN; 5];
    let (a, b) = k.row_min_max(&all_nan, 2).expect("rows");
    assert_eq!(k.tensor_min_max(&a, &b).expect("t"), [f32::INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY]);
}

#[test]
fn quant_params_match() {
    let ctx = Context::create();
    let k = HostKernels::new(&ctx).expect("compile");
    let mut g = Gen(4);
    let mut mins = vec![0.0, -0.0, -1.0, f32::NEG_INFINITY, f32::INFINITY, -1e-40, -3.0, 5.0, -1e38, f32::NAN];
    let mut maxs = vec![0.0, 0.0, 1.0, 1.0, f32::NEG_INFINITY, 1e-40, -1.0, 6.0, 3e38, 1.0];
    for _ in 0..1000 {
        let a = g.normal_ish(10.0);
        let b = g.normal_ish(10.0);
        mins.push(a.min(b));
        maxs.push(a.max(b));
    }
    for (bits, sym) in [(QBits::Int8, true), (QBits::Int8, false), (QBits::Int4, true)] {
        let (s, z) = k.quant_params_all(&mins, &maxs, bits, sym).expect("params");
        let (rs, rz) = r::quant_params_all(&mins, &maxs, bits, sym);
        assert_eq!((bits_of(&s), z), (bits_of(&rs), rz), "{bits:?} sym={sym}");
    }
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    bits(v)
}

/// Scales for `x` by groups, computed with the reference.
fn scales(x: &[f32], group: usize, bits: QBits, sym: bool) -> (Vec<f32>, Vec<i32>) {
    let (a, b) = r::row_min_max(x, group.max(1));
    r::quant_params_all(&a, &b, bits, sym)
}

#[test]
fn int8_quantize_dequantize_match_for_every_granularity() {
    let ctx = Context::create();
    let k = HostKernels::new(&ctx).expect("compile");
    let mut g = Gen(5);
    let x = quant_inputs(&mut g, 4099);
    let n = x.len();
    // Per tensor (one group), per channel (8 channels), per block (64, 100).
    for group in [n, n.div_ceil(8), 64, 100, 1] {
        for sym in [true, false] {
            let (s, z) = scales(&x, group, QBits::Int8, sym);
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                let q = k.quantize_i8(&x, &s, &z, group, sym, rounding, 42).expect("quantize");
                assert_eq!(
                    q,
                    r::quantize_i8(&x, &s, &z, group, sym, rounding, 42),
                    "group={group} sym={sym} {rounding:?}"
                );
                let qm = k.quantize_i8(&x[1..], &s, &z, group, sym, rounding, 42).expect("quantize");
                assert_eq!(qm, r::quantize_i8(&x[1..], &s, &z, group, sym, rounding, 42), "misaligned");
            }
            let q = r::quantize_i8(&x, &s, &z, group, sym, Rounding::Nearest, 0);
            let d = k.dequantize_i8(&q, &s, &z, group, sym).expect("dequantize");
            assert_eq!(bits(&d), bits(&r::dequantize_i8(&q, &s, &z, group, sym)), "group={group} sym={sym}");
            let d = k.dequantize_i8(&q[3..], &s, &z, group, sym).expect("dequantize");
            assert_eq!(bits(&d), bits(&r::dequantize_i8(&q[3..], &s, &z, group, sym)), "misaligned");
        }
    }
    // Range ends: ±max map to ±127, out of range saturates, NaN to the zero point.
    let s = [1.0f32];
    let q = k.quantize_i8(
        &[127.0, -127.0, 300.0, -300.0, f32::NAN, 0.5, 1.5, -0.5],
        &s,
        &[0],
        8,
        true,
        Rounding::Nearest,
        0,
    );
    assert_eq!(q.expect("q"), vec![127, -127, 127, -127, 0, 0, 2, 0]);
}

#[test]
fn int4_and_dequant_accumulate_match() {
    let ctx = Context::create();
    let k = HostKernels::new(&ctx).expect("compile");
    let mut g = Gen(6);
    for n in [0usize, 1, 2, 7, 2049] {
        let x = quant_inputs(&mut g, n);
        let n = x.len();
        for group in [32, 100, n] {
            let (s, _) = scales(&x, group, QBits::Int4, true);
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                let q = k.quantize_i4(&x, &s, group, rounding, 9).expect("q4");
                assert_eq!(q, r::quantize_i4(&x, &s, group, rounding, 9), "n={n} group={group} {rounding:?}");
            }
            let q = r::quantize_i4(&x, &s, group, Rounding::Nearest, 0);
            let d = k.dequantize_i4(&q, &s, n, group).expect("dq4");
            assert_eq!(bits(&d), bits(&r::dequantize_i4(&q, &s, n, group)));
        }
    }
    // k chunks, each with its own block scales, summed into an accumulator.
    let (n, group, chunks) = (1003usize, 64usize, 5usize);
    for bits_kind in [QBits::Int8, QBits::Int4] {
        let mut q = Vec::new();
        let mut s = Vec::new();
        for _ in 0..chunks {
            let x: Vec<f32> = (0..n).map(|_| g.normal_ish(2.0)).collect();
            let (sc, z) = scales(&x, group, bits_kind, true);
            match bits_kind {
                QBits::Int8 => {
                    q.extend(r::quantize_i8(&x, &sc, &z, group, true, Rounding::Nearest, 0).iter().map(|&c| c as u8))
                }
                QBits::Int4 => q.extend(r::quantize_i4(&x, &sc, group, Rounding::Nearest, 0)),
            }
            s.extend(sc);
        }
        let init: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
        let mut got = init.clone();
        k.dequant_accumulate(&q, &s, n, group, chunks, bits_kind, &mut got).expect("acc");
        let mut want = init;
        r::dequant_accumulate(&q, &s, n, group, chunks, bits_kind, &mut want);
        assert_eq!(bits(&got), bits(&want), "{bits_kind:?}");
    }
}

#[test]
fn bit_packing_round_trips_and_matches() {
    let ctx = Context::create();
    let k = HostKernels::new(&ctx).expect("compile");
    let mut g = Gen(7);
    for n in [0usize, 1, 3, 5, 8, 9, 1001] {
        let mut x: Vec<f32> = (0..n).map(|_| g.normal_ish(4.0)).collect();
        if n > 4 {
            x[1] = f32::NAN;
            x[2] = f32::INFINITY;
        }
        let (a, b) = r::row_min_max(&x, 16);
        let [mn, mx, _] = r::tensor_min_max(&a, &b);
        let (mn, mx) = if mx.is_finite() { (mn, mx) } else { (-4.0, 4.0) };
        for bits_w in [1u8, 2, 4, 8] {
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                let p = k.pack(&x, mn, mx, bits_w, rounding, 11).expect("pack");
                assert_eq!(p, r::pack(&x, mn, mx, bits_w, rounding, 11), "n={n} bits={bits_w} {rounding:?}");
                let u = k.unpack(&p, n, bits_w).expect("unpack");
                assert_eq!(bits(&u), bits(&r::unpack(&p, n, bits_w).expect("ref unpack")), "n={n} bits={bits_w}");
            }
        }
    }
    // The worked example of the TernGrad report: 2 bits over [-5, 7].
    let x = [-5.0f32, 2.0, -3.0, 7.0, -1.0, 5.0];
    let p = r::pack(&x, -5.0, 7.0, 2, Rounding::Nearest, 0);
    assert_eq!(&p[..2], &[2, 2]);
    assert_eq!(f32::from_le_bytes([p[2], p[3], p[4], p[5]]), -5.0);
    assert_eq!(p[10], 0b00_10_00_11, "-5→0, 2→2 (nearest 3), -3→0 (tie to even), 7→3");
    assert_eq!(r::unpack(&p, 6, 2).expect("unpack"), vec![-5.0, 3.0, -5.0, 7.0, -1.0, 3.0]);
}

#[test]
fn stochastic_rounding_is_unbiased() {
    let ctx = Context::create();
    let k = HostKernels::new(&ctx).expect("compile");
    // 200k copies of each value: the mean code must approach value/scale
    // within a few standard errors (sd of a Bernoulli(frac) ≤ 0.5).
    let n = 200_000usize;
    for v in [0.3f32, -1.7, 2.25, 126.9] {
        let x = vec![v; n];
        let q = k.quantize_i8(&x, &[1.0], &[0], n, true, Rounding::Stochastic, 1234).expect("q");
        let mean = q.iter().map(|&c| f64::from(c)).sum::<f64>() / n as f64;
        let frac = f64::from(v) - f64::from(v).floor();
        let se = (frac * (1.0 - frac) / n as f64).sqrt();
        assert!((mean - f64::from(v)).abs() < 5.0 * se + 1e-6, "v={v}: mean {mean}, se {se}");
        assert!(q.iter().all(|&c| f32::from(c) == v.floor() || f32::from(c) == v.floor() + 1.0));
        // Reproducible: same seed, same codes; another seed, other codes.
        assert_eq!(q, k.quantize_i8(&x, &[1.0], &[0], n, true, Rounding::Stochastic, 1234).expect("q"));
        assert_ne!(q, k.quantize_i8(&x, &[1.0], &[0], n, true, Rounding::Stochastic, 99).expect("q"));
    }
    // Packing: 2 bits over [0, 3] with value 1.4 → codes 1 or 2, mean 1.4.
    let x = vec![1.4f32; n];
    let p = k.pack(&x, 0.0, 3.0, 2, Rounding::Stochastic, 5).expect("pack");
    let u = k.unpack(&p, n, 2).expect("unpack");
    let mean = u.iter().map(|&c| f64::from(c)).sum::<f64>() / n as f64;
    assert!((mean - 1.4).abs() < 5.0 * (0.24f64 / n as f64).sqrt(), "pack mean {mean}");
}

#[test]
fn bad_lengths_are_errors_not_crashes() {
    let ctx = Context::create();
    let k = HostKernels::new(&ctx).expect("compile");
    assert!(k.quantize_i8(&[1.0; 10], &[1.0], &[0], 4, true, Rounding::Nearest, 0).is_err());
    assert!(k.unpack(&[2, 0, 0], 4, 2).is_err());
    assert!(k.pack(&[1.0], 0.0, 1.0, 3, Rounding::Nearest, 0).is_err());
    assert!(k.dequant_accumulate(&[0; 3], &[1.0; 2], 4, 2, 2, QBits::Int8, &mut [0.0; 4]).is_err());
    assert!(r::unpack(&[4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 2, 2).is_err());
}
