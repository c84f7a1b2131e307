//! The CPU check: every kernel's LLVM IR, JIT-compiled for the host, against
//! the reference — bitwise on edge cases and seeded random inputs (lengths
//! that are not multiples of the vector width or block, misaligned slices),
//! and statistically for stochastic rounding.

use inkwell::context::Context;
use qsync_kernels::reference as r;
use qsync_kernels::{HostKernels, Half, QBits, Rounding};

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

/// Every special f32: zeros, ±inf, NaNs (quiet, signalling, payloads),
/// subnormals, extremes, f16/bf16 range ends and rounding ties.
fn edge_f32() -> Vec<f32> {
    let mut v: Vec<f32> = vec![
        0.0, -0.0, 1.0, -1.0, 0.5, -0.5, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN,
        f32::MIN_POSITIVE, -f32::MIN_POSITIVE, f32::MAX, f32::MIN, f32::EPSILON,
        65504.0, 65519.99, 65520.0, 65536.0, -65520.0, 6.1035156e-5, 5.9604645e-8, 2.9802322e-8, 2.98e-8,
        8.940697e-8, 1.0009765625, 1.00048828125, 1.00146484375, 3.3895314e38, 3.3961775e38,
        127.0, 127.5, -127.5, 128.0, -128.5, 254.5, 255.5, 0.49999997, 2.5, 3.5, -2.5,
    ];
    for b in [0x7f80_0001u32, 0xff80_0001, 0x7fbf_ffff, 0x7fc0_0001, 0x0000_0001, 0x8000_0001, 0x007f_ffff, 0x0040_0000,
        0x3380_0000, 0x3380_0001, 0x337f_ffff, 0x3880_0000, 0x387f_ffff, 0x3f80_1000, 0x3f80_3000, 0x3f80_8000, 0x3f81_8000,
        0x477f_efff, 0x477f_f000, 0x7f7f_8000, 0x7f7f_7fff, 0x7f7f_ffff]
    {
        v.push(f32::from_bits(b));
    }
    v
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
        assert_eq!(bits(&k.cast_from(h, &all[3..]).expect("cast")), bits(&r::cast_from(h, &all[3..])), "{h:?} widen misaligned");
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
