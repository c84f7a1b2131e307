//! `qsync_kernels::cpu` against `qsync_kernels::reference`, bit for bit:
//! casts over a sweep of every bit-pattern region (and all 65,536 16-bit
//! inputs), quantization, dequantize-and-accumulate and n-bit packing on
//! edge values and seeded random inputs, for every length, group and bit
//! width shape the synchronization uses (short last groups, odd int4
//! lengths, empty inputs), both roundings — the run-time dispatched copy
//! (AVX2+FMA on such a processor) and the baseline copy alike.

#![allow(clippy::type_complexity)] // the table of kernel copies is one of function pointers

mod common;

use common::edge_f32;
use qsync_kernels::reference as r;
use qsync_kernels::{cpu, rng, Half, QBits, Rounding};

/// Seeded test data (the kernels' own counter-based hash).
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        rng::hash(0xfa57, self.0)
    }
    fn value(&mut self, i: usize) -> f32 {
        match i % 5 {
            0 => f32::from_bits(self.next() as u32),
            1 => ((self.next() >> 40) as f32 / 16_777_216.0 - 0.5) * 1e-3,
            _ => ((self.next() >> 40) as f32 / 16_777_216.0 - 0.5) * 8.0,
        }
    }
}

type EncodeBlock = fn(&[f32], u64, usize, QBits, Rounding, u64, &mut [u8], &mut [u8]);

/// One copy of the fast kernels: the dispatching functions (AVX2+FMA here
/// when the processor has them) or the baseline ones.
struct Copy {
    name: &'static str,
    row_min_max: fn(&[f32], usize) -> (Vec<f32>, Vec<f32>),
    quantize_sym: fn(&[f32], &[f32], usize, QBits, Rounding, u64) -> Vec<u8>,
    encode_block_sym: EncodeBlock,
    range_finite: fn(&[f32]) -> (f32, f32, bool),
    dequant_accumulate: fn(&[u8], &[f32], usize, usize, usize, QBits, &mut [f32]),
    pack: fn(&[f32], f32, f32, u8, Rounding, u64) -> Vec<u8>,
    unpack: fn(&[u8], usize, u8) -> Result<Vec<f32>, r::UnpackError>,
    unpack_accumulate: fn(&[u8], usize, u8, &mut [f32]) -> Result<(), r::UnpackError>,
    unpack_mean: fn(&[&[u8]], usize, u8, f32, usize, &mut [f32]) -> Result<(), r::UnpackError>,
    dequant_mean: fn(&[&[u8]], &[&[u8]], usize, QBits, f32, usize, &mut [f32]),
    cast_to: fn(Half, &[f32]) -> Vec<u16>,
    cast_from: fn(Half, &[u16]) -> Vec<f32>,
    cast_to_le: fn(Half, &[f32], f32, &mut [u8]),
    cast_from_le: fn(Half, &[u8], &mut [f32]),
    accumulate_le: fn(Half, &[u8], &mut [f32]),
}

const DISPATCHED: Copy = Copy {
    name: "dispatched",
    row_min_max: cpu::row_min_max,
    quantize_sym: cpu::quantize_sym,
    encode_block_sym: cpu::encode_block_sym,
    range_finite: cpu::range_finite,
    dequant_accumulate: cpu::dequant_accumulate,
    pack: cpu::pack,
    unpack: cpu::unpack,
    unpack_accumulate: cpu::unpack_accumulate,
    unpack_mean: cpu::unpack_mean,
    dequant_mean: cpu::dequant_mean,
    cast_to: cpu::cast_to,
    cast_from: cpu::cast_from,
    cast_to_le: cpu::cast_to_le,
    cast_from_le: cpu::cast_from_le,
    accumulate_le: cpu::accumulate_le,
};

const COPIES: [Copy; 3] = [
    DISPATCHED,
    // The dispatching copies of everything but the f16 conversions, which
    // run as selects (what a processor without F16C runs).
    Copy {
        name: "selects",
        cast_to: cpu::cast_to_selects,
        cast_from: cpu::cast_from_selects,
        cast_to_le: cpu::cast_to_le_selects,
        cast_from_le: cpu::cast_from_le_selects,
        accumulate_le: cpu::accumulate_le_selects,
        ..DISPATCHED
    },
    Copy {
        name: "baseline",
        row_min_max: cpu::row_min_max_baseline,
        quantize_sym: cpu::quantize_sym_baseline,
        encode_block_sym: cpu::encode_block_sym_baseline,
        range_finite: cpu::range_finite_baseline,
        dequant_accumulate: cpu::dequant_accumulate_baseline,
        pack: cpu::pack_baseline,
        unpack: cpu::unpack_baseline,
        unpack_accumulate: cpu::unpack_accumulate_baseline,
        unpack_mean: cpu::unpack_mean_baseline,
        dequant_mean: cpu::dequant_mean_baseline,
        cast_to: cpu::cast_to_baseline,
        cast_from: cpu::cast_from_baseline,
        cast_to_le: cpu::cast_to_le_baseline,
        cast_from_le: cpu::cast_from_le_baseline,
        accumulate_le: cpu::accumulate_le_baseline,
    },
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Inputs of `n` elements: random, with the edge values sprinkled in.
fn inputs(g: &mut Gen, n: usize, finite: bool) -> Vec<f32> {
    let e = edge_f32();
    (0..n)
        .map(|i| {
            let v = if i % 7 == 3 { e[(i / 7) % e.len()] } else { g.value(i) };
            if finite && !v.is_finite() {
                1.25
            } else {
                v
            }
        })
        .collect()
}

#[test]
fn casts_match_over_every_region_of_bit_patterns() {
    for imp in &COPIES {
        // Every 16-bit input, and f32 bit patterns in steps that land in every
        // exponent (including subnormal, rounding and overflow boundaries).
        let all16: Vec<u16> = (0..=u16::MAX).collect();
        let mut f: Vec<f32> = (0..=u32::MAX / 4099).map(|i| f32::from_bits(i * 4099)).collect();
        for base in [0x3380_0000u32, 0x3880_0000, 0x477f_f000, 0x7f80_0000] {
            for d in 0..4096u32 {
                f.push(f32::from_bits(base.wrapping_sub(2048).wrapping_add(d)));
                f.push(f32::from_bits((base.wrapping_sub(2048).wrapping_add(d)) | 0x8000_0000));
            }
        }
        f.extend(edge_f32());
        for h in [Half::F16, Half::BF16] {
            let narrow = r::cast_to(h, &f);
            assert_eq!((imp.cast_to)(h, &f), narrow, "{} {h:?} narrowing", imp.name);
            let wide = bits(&r::cast_from(h, &all16));
            assert_eq!(bits(&(imp.cast_from)(h, &all16)), wide, "{} {h:?} widening", imp.name);
            // The wire forms over the same patterns.
            let mut wire = vec![0u8; 2 * f.len()];
            (imp.cast_to_le)(h, &f, 1.0, &mut wire);
            let want: Vec<u8> = narrow.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert!(wire == want, "{} {h:?} narrowing to the wire", imp.name);
            let all16_le: Vec<u8> = all16.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut got = vec![0f32; all16.len()];
            (imp.cast_from_le)(h, &all16_le, &mut got);
            assert!(bits(&got) == wide, "{} {h:?} widening from the wire", imp.name);
        }
    }
}

/// The wire forms: the cast of `x / div` as little-endian bytes, and its
/// widening (or widening-and-adding) straight from them, bit for bit the
/// reference's casts around a separate division, encoding and sum.
#[test]
fn wire_casts_match_the_reference_casts_around_them() {
    for imp in &COPIES {
        let mut g = Gen(11);
        for n in [0usize, 1, 7, 64, 257, 4099] {
            let x = inputs(&mut g, n, false);
            for h in [Half::F16, Half::BF16] {
                for div in [1.0f32, 4.0, 3.0, 8.0, 6.0] {
                    let mut wire = vec![0u8; 2 * n];
                    (imp.cast_to_le)(h, &x, div, &mut wire);
                    let scaled: Vec<f32> = x.iter().map(|v| if div == 1.0 { *v } else { v / div }).collect();
                    let want: Vec<u8> = r::cast_to(h, &scaled).iter().flat_map(|v| v.to_le_bytes()).collect();
                    assert_eq!(wire, want, "{} {h:?} n={n} div={div}: narrowing to the wire", imp.name);
                    let codes: Vec<u16> = wire.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
                    let wide = r::cast_from(h, &codes);
                    let mut got = vec![0f32; n];
                    (imp.cast_from_le)(h, &wire, &mut got);
                    assert_eq!(bits(&got), bits(&wide), "{} {h:?} n={n}: widening from the wire", imp.name);
                    let start = inputs(&mut g, n, true);
                    let mut acc = start.clone();
                    (imp.accumulate_le)(h, &wire, &mut acc);
                    let want: Vec<f32> = start.iter().zip(&wide).map(|(a, b)| a + b).collect();
                    assert_eq!(bits(&acc), bits(&want), "{} {h:?} n={n}: adding from the wire", imp.name);
                }
            }
        }
    }
}

#[test]
fn range_reduction_matches_signed_zeros_and_nan_included() {
    for imp in &COPIES {
        let mut g = Gen(4);
        let mut rows: Vec<Vec<f32>> = vec![
            vec![],
            vec![f32::NAN; 19],
            vec![0.0, -0.0, 1.0],
            vec![-0.0, 0.0, 1.0],
            [vec![3.0; 9], vec![0.0], vec![-0.0; 9]].concat(),
            [vec![-0.0; 9], vec![0.0], vec![-3.0; 9]].concat(),
            [vec![-0.0; 16], vec![0.0; 16]].concat(),
            [vec![0.0; 16], vec![-0.0; 16]].concat(),
        ];
        // Two zeros of opposite sign at every pair of positions (so the first
        // one may sit in any lane of any chunk), among positive and negative
        // values.
        for fill in [1.0f32, -1.0] {
            for i in 0..24 {
                for j in 0..24 {
                    if i != j {
                        let mut x = vec![fill; 24];
                        (x[i], x[j]) = (-0.0, 0.0);
                        rows.push(x);
                    }
                }
            }
        }
        for n in [1usize, 7, 8, 9, 64, 100, 1000] {
            rows.push(inputs(&mut g, n, false));
            rows.push(inputs(&mut g, n, true).iter().map(|v| v.abs()).collect());
        }
        for x in &rows {
            for cols in [1usize, 3, 8, 17, 64, x.len().max(1)] {
                let (a, b) = (imp.row_min_max)(x, cols);
                let (c, d) = r::row_min_max(x, cols);
                assert_eq!((bits(&a), bits(&b)), (bits(&c), bits(&d)), "{} {x:?} cols {cols}", imp.name);
            }
        }
    }
}

#[test]
fn quantization_matches_for_every_shape() {
    for imp in &COPIES {
        let mut g = Gen(1);
        for n in [0usize, 1, 2, 3, 7, 64, 255, 512, 1000, 1537] {
            for group in [1usize, 3, 64, 512] {
                let x = inputs(&mut g, n, false);
                let (mins, maxs) = r::row_min_max(&x, group);
                for bits in [QBits::Int8, QBits::Int4] {
                    let (scales, _) = r::quant_params_all(&mins, &maxs, bits, true);
                    for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                        let seed = g.next();
                        let want: Vec<u8> = match bits {
                            QBits::Int8 => r::quantize_i8(&x, &scales, &[], group, true, rounding, seed)
                                .into_iter()
                                .map(|c| c as u8)
                                .collect(),
                            QBits::Int4 => r::quantize_i4(&x, &scales, group, rounding, seed),
                        };
                        let got = (imp.quantize_sym)(&x, &scales, group, bits, rounding, seed);
                        assert_eq!(got, want, "{} n {n} group {group} {bits:?} {rounding:?}", imp.name);
                    }
                }
            }
        }
    }
}

/// The one-pass range and finiteness against the reference's range of one
/// row and a check of every value.
#[test]
fn range_finite_is_the_reference_range_and_a_finiteness_check() {
    for imp in &COPIES {
        let mut g = Gen(8);
        for n in [0usize, 1, 2, 7, 8, 9, 64, 255, 1000, 1537] {
            for finite in [true, false] {
                for zeros in [false, true] {
                    let mut x = inputs(&mut g, n, finite);
                    if zeros {
                        // Zeros at the extremes, whose sign the reference
                        // takes from the first in order.
                        for (i, v) in x.iter_mut().enumerate() {
                            *v = if i % 3 == 0 {
                                -0.0
                            } else if v.is_finite() {
                                v.abs()
                            } else {
                                *v
                            };
                        }
                    }
                    let (mins, maxs) = r::row_min_max(&x, n.max(1));
                    let [mn, mx, _] = r::tensor_min_max(&mins, &maxs);
                    let all_finite = x.iter().all(|v| v.is_finite());
                    let (a, b, f) = (imp.range_finite)(&x);
                    assert_eq!(
                        (a.to_bits(), b.to_bits(), f),
                        (mn.to_bits(), mx.to_bits(), all_finite),
                        "{} n {n} finite {finite} zeros {zeros}",
                        imp.name
                    );
                }
            }
        }
    }
}

/// The fused block encoder against the reference's three kernels: each
/// group's scale (NaN where the group holds a NaN or an infinity), then
/// the codes, for a tensor whose first element is element `first`.
#[test]
fn the_fused_block_encoder_is_the_three_kernels() {
    for imp in &COPIES {
        let mut g = Gen(7);
        for n in [0usize, 1, 2, 3, 7, 64, 255, 512, 1000, 1537] {
            for group in [1usize, 3, 8, 64, 512] {
                for finite in [true, false] {
                    let mut x = inputs(&mut g, n, finite);
                    // Groups of ±0 only, whose range the reference takes in
                    // order.
                    if n > 2 * group {
                        for v in &mut x[group..2 * group] {
                            *v = if g.next().is_multiple_of(2) { 0.0 } else { -0.0 };
                        }
                    }
                    let (mins, maxs) = r::row_min_max(&x, group);
                    for bits in [QBits::Int8, QBits::Int4] {
                        let (scales, _) = r::quant_params_all(&mins, &maxs, bits, true);
                        for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                            // A tensor cut at a multiple of 2·group, as the
                            // threaded engine cuts it; the reference
                            // quantizes from element 0, so `first` elements
                            // are padded in front.
                            let (seed, first) = (g.next(), (2 * group) as u64 * (g.next() % 8));
                            let mut padded = vec![0.5f32; first as usize];
                            padded.extend_from_slice(&x);
                            let mut pad_scales = vec![0.5f32 / 127.0; first as usize / group];
                            pad_scales.extend_from_slice(&scales);
                            let all = match bits {
                                QBits::Int8 => r::quantize_i8(&padded, &pad_scales, &[], group, true, rounding, seed)
                                    .into_iter()
                                    .map(|c| c as u8)
                                    .collect::<Vec<u8>>(),
                                QBits::Int4 => r::quantize_i4(&padded, &pad_scales, group, rounding, seed),
                            };
                            let skip = if bits == QBits::Int8 { first as usize } else { first as usize / 2 };
                            let codes = &all[skip..];
                            let mut want: Vec<u8> = Vec::new();
                            for (chunk, s) in x.chunks(group).zip(&scales) {
                                let s = if chunk.iter().all(|v| v.is_finite()) { *s } else { f32::NAN };
                                want.extend_from_slice(&s.to_le_bytes());
                            }
                            want.extend_from_slice(codes);
                            let mut got = vec![0xa5u8; want.len()];
                            let (head, tail) = got.split_at_mut(4 * n.div_ceil(group));
                            (imp.encode_block_sym)(&x, first, group, bits, rounding, seed, head, tail);
                            assert_eq!(
                                got, want,
                                "{} n {n} group {group} {bits:?} {rounding:?} first {first}",
                                imp.name
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn dequantize_accumulate_matches_for_every_shape() {
    for imp in &COPIES {
        let mut g = Gen(2);
        for n in [0usize, 1, 3, 64, 511, 1000] {
            for group in [1usize, 5, 64, 512] {
                for k in [1usize, 2, 8] {
                    for width in [QBits::Int8, QBits::Int4] {
                        let groups = n.div_ceil(group);
                        let chunk = if width == QBits::Int8 { n } else { n.div_ceil(2) };
                        let q: Vec<u8> = (0..k * chunk).map(|_| g.next() as u8).collect();
                        // Scales: random, with NaN, infinite and zero ones.
                        let scales: Vec<f32> = (0..k * groups)
                            .map(|i| match i % 11 {
                                4 => f32::NAN,
                                7 => f32::INFINITY,
                                9 => 0.0,
                                _ => g.value(2).abs() + 1e-6,
                            })
                            .collect();
                        let start = inputs(&mut g, n, false);
                        let (mut want, mut got) = (start.clone(), start);
                        r::dequant_accumulate(&q, &scales, n, group, k, width, &mut want);
                        (imp.dequant_accumulate)(&q, &scales, n, group, k, width, &mut got);
                        assert_eq!(bits(&got), bits(&want), "{} n {n} group {group} k {k} {width:?}", imp.name);
                    }
                }
            }
        }
    }
}

#[test]
fn packing_matches_for_every_width() {
    for imp in &COPIES {
        let mut g = Gen(3);
        for n in [0usize, 1, 2, 3, 5, 8, 9, 100, 256, 257, 1001, 4099] {
            for finite in [true, false] {
                let x = inputs(&mut g, n, finite);
                let (mins, maxs) = r::row_min_max(&x, n.max(1));
                let [mn, mx, _] = r::tensor_min_max(&mins, &maxs);
                for b in [1u8, 2, 4, 8] {
                    for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                        let seed = g.next();
                        let want = r::pack(&x, mn, mx, b, rounding, seed);
                        let got = (imp.pack)(&x, mn, mx, b, rounding, seed);
                        assert_eq!(got, want, "{} pack n {n} bits {b} {rounding:?}", imp.name);
                        let (u, v) = ((imp.unpack)(&got, n, b), r::unpack(&want, n, b));
                        assert_eq!(u.map(|u| bits(&u)), v.map(|v| bits(&v)), "{} unpack n {n} bits {b}", imp.name);
                        // Accumulated onto values of every kind: the separate sum's bits
                        // (a NaN as a NaN: which input NaN an addition returns is not
                        // specified, by IEEE 754 or by LLVM, which may swap its operands).
                        let canon = |v: &[f32]| -> Vec<u32> {
                            v.iter().map(|x| if x.is_nan() { f32::NAN.to_bits() } else { x.to_bits() }).collect()
                        };
                        let start = inputs(&mut g, n, false);
                        let mut acc = start.clone();
                        (imp.unpack_accumulate)(&got, n, b, &mut acc).expect("unpack_accumulate");
                        let sum: Vec<f32> = match r::unpack(&want, n, b) {
                            Ok(v) => start.iter().zip(v).map(|(a, v)| a + v).collect(),
                            Err(e) => panic!("{e}"),
                        };
                        assert_eq!(canon(&acc), canon(&sum), "{} unpack_accumulate n {n} bits {b}", imp.name);
                    }
                    // Malformed buffers are the same errors.
                    let buf = r::pack(&x, mn, mx, b, Rounding::Nearest, 0);
                    assert_eq!(
                        (imp.unpack)(&buf[..buf.len() - 1], n, b).err(),
                        r::unpack(&buf[..buf.len() - 1], n, b).err()
                    );
                    let other = if b == 8 { 4 } else { b * 2 };
                    assert_eq!((imp.unpack)(&buf, n, other).err(), r::unpack(&buf, n, other).err());
                    let mut acc = vec![0f32; n];
                    assert_eq!(
                        (imp.unpack_accumulate)(&buf, n, other, &mut acc).err(),
                        r::unpack(&buf, n, other).err()
                    );
                }
            }
        }
    }
}

/// n-bit's fused decoding against its passes one after the other on the
/// reference: a zeroed sum, each buffer's values added in order, a
/// division — for sums shorter and longer than one cache slice
/// (`cpu::MEAN_BLOCK`), every width, buffers of different ranges (a NaN
/// minimum among them), a part of the sum starting past the first element,
/// and malformed buffers refused with the reference's error.
#[test]
fn unpack_mean_is_the_zeroed_sum_of_unpacks_divided() {
    let canon = |v: &[f32]| -> Vec<u32> {
        v.iter().map(|x| if x.is_nan() { f32::NAN.to_bits() } else { x.to_bits() }).collect()
    };
    for imp in &COPIES {
        let mut g = Gen(11);
        for n in [0usize, 1, 7, 255, 2048, 2049, 5000, 3 * cpu::MEAN_BLOCK + 300] {
            for b in [1u8, 2, 4, 8] {
                for p in [1usize, 2, 3, 4] {
                    let bufs: Vec<Vec<u8>> = (0..p)
                        .map(|j| {
                            let x = inputs(&mut g, n, j != 1 || p < 4);
                            let (mins, maxs) = r::row_min_max(&x, n.max(1));
                            let [mn, mx, _] = r::tensor_min_max(&mins, &maxs);
                            let finite = x.iter().all(|v| v.is_finite());
                            r::pack(&x, if finite { mn } else { f32::NAN }, mx, b, Rounding::Nearest, g.next())
                        })
                        .collect();
                    let views: Vec<&[u8]> = bufs.iter().map(|v| v.as_slice()).collect();
                    let mut want = vec![0f32; n];
                    for v in &views {
                        let vals = r::unpack(v, n, b).expect("unpack");
                        want.iter_mut().zip(vals).for_each(|(a, v)| *a += v);
                    }
                    want.iter_mut().for_each(|v| *v /= p as f32);
                    for first in [0usize, 256, 2304] {
                        if first > n {
                            continue;
                        }
                        let mut got = inputs(&mut g, n - first, false);
                        (imp.unpack_mean)(&views, n, b, p as f32, first, &mut got).expect("unpack_mean");
                        assert_eq!(
                            canon(&got),
                            canon(&want[first..]),
                            "{} n {n} bits {b} p {p} first {first}",
                            imp.name
                        );
                    }
                    if n > 0 {
                        let short = &bufs[p - 1][..bufs[p - 1].len() - 1];
                        let mut bad = views.clone();
                        bad[p - 1] = short;
                        let mut got = vec![0f32; n];
                        assert_eq!(
                            (imp.unpack_mean)(&bad, n, b, p as f32, 0, &mut got).err(),
                            r::unpack(short, n, b).err(),
                            "{} n {n} bits {b} p {p}",
                            imp.name
                        );
                    }
                }
            }
        }
    }
}

/// qgZ's fused decoding against its passes one after the other on the
/// reference (a zeroed sum, each block dequantize-accumulated in turn, a
/// division unless by 1): sums shorter and longer than one slice, groups
/// that divide the slice and groups that do not, odd lengths at int4,
/// NaN, infinite and zero scales, and a part of the sum starting at a later
/// slice.
#[test]
fn dequant_mean_is_the_zeroed_sum_of_dequantizations_divided() {
    let canon = |v: &[f32]| -> Vec<u32> {
        v.iter().map(|x| if x.is_nan() { f32::NAN.to_bits() } else { x.to_bits() }).collect()
    };
    for imp in &COPIES {
        let mut g = Gen(12);
        for n in [0usize, 1, 5, 511, 4096, 4097, 9000, 3 * 4096 + 777] {
            for group in [1usize, 5, 512, 3000] {
                for width in [QBits::Int8, QBits::Int4] {
                    for k in [1usize, 2, 3] {
                        let groups = n.div_ceil(group);
                        let chunk = if width == QBits::Int8 { n } else { n.div_ceil(2) };
                        let codes: Vec<Vec<u8>> =
                            (0..k).map(|_| (0..chunk).map(|_| g.next() as u8).collect()).collect();
                        let scales: Vec<Vec<f32>> = (0..k)
                            .map(|j| {
                                (0..groups)
                                    .map(|i| match (i + j) % 13 {
                                        4 => f32::NAN,
                                        7 => f32::INFINITY,
                                        9 => 0.0,
                                        _ => g.value(2).abs() + 1e-6,
                                    })
                                    .collect()
                            })
                            .collect();
                        let heads: Vec<Vec<u8>> =
                            scales.iter().map(|s| s.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
                        for div in [1.0f32, k as f32, 3.0] {
                            let mut want = vec![0f32; n];
                            for j in 0..k {
                                r::dequant_accumulate(&codes[j], &scales[j], n, group, 1, width, &mut want);
                            }
                            if div != 1.0 {
                                want.iter_mut().for_each(|v| *v /= div);
                            }
                            let h: Vec<&[u8]> = heads.iter().map(|v| v.as_slice()).collect();
                            let c: Vec<&[u8]> = codes.iter().map(|v| v.as_slice()).collect();
                            let slice = cpu::dequant_slice(group);
                            for first in [0, slice] {
                                if first > n {
                                    continue;
                                }
                                let mut got = inputs(&mut g, n - first, false);
                                (imp.dequant_mean)(&h, &c, group, width, div, first, &mut got);
                                assert_eq!(
                                    canon(&got),
                                    canon(&want[first..]),
                                    "{} n {n} group {group} {width:?} k {k} div {div} first {first}",
                                    imp.name
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
