//! `ThreadedHostEngine` gives `HostEngine`'s bytes: every kernel, on sizes
//! below and above the threading threshold, odd sizes and odd groups, both
//! widths, both roundings (stochastic stays on one thread), several chunks.
use qsync_kernels::{Half, QBits, Rounding};
use qsync_runtime::engine::encode_block_composed;
use qsync_runtime::{HostEngine, KernelEngine, ThreadedHostEngine};

/// Deterministic values with some spread (and a few large ones).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            if i % 997 == 0 {
                u * 1e3
            } else {
                u
            }
        })
        .collect()
}

const SIZES: [usize; 6] = [0, 7, 513, 65_537, 70_001, 200_003];

#[test]
fn every_kernel_matches_the_single_threaded_engine_bit_for_bit() {
    let one = HostEngine;
    for threads in [2, 3, 8] {
        let many = ThreadedHostEngine::new(threads);
        for &n in &SIZES {
            let x = data(n, n as u64 + threads as u64);
            for group in [1, 7, 512] {
                let (mins, maxs) = one.row_min_max(&x, group).expect("the host kernels do not fail");
                assert_eq!(
                    (mins.clone(), maxs.clone()),
                    many.row_min_max(&x, group).expect("the host kernels do not fail"),
                    "row_min_max n={n} g={group}"
                );
                for bits in [QBits::Int8, QBits::Int4] {
                    let scales = one.sym_scales(&mins, &maxs, bits).expect("the host kernels do not fail");
                    for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                        let a =
                            one.quantize(&x, &scales, group, bits, rounding, 11).expect("the host kernels do not fail");
                        let b = many
                            .quantize(&x, &scales, group, bits, rounding, 11)
                            .expect("the host kernels do not fail");
                        assert_eq!(a, b, "quantize n={n} g={group} {bits:?} {rounding:?} t={threads}");
                        // The fused block encoder: the scales (NaN for a
                        // group with a non-finite value), then these codes.
                        let mut y = x.clone();
                        if n > 600 {
                            y[600] = f32::NAN;
                            y[n - 1] = f32::NEG_INFINITY;
                        }
                        let (ymin, ymax) = one.row_min_max(&y, group).expect("the host kernels do not fail");
                        let ys = one.sym_scales(&ymin, &ymax, bits).expect("the host kernels do not fail");
                        let mut want = Vec::new();
                        for (chunk, s) in y.chunks(group).zip(&ys) {
                            let s = if chunk.iter().all(|v| v.is_finite()) { *s } else { f32::NAN };
                            want.extend_from_slice(&s.to_le_bytes());
                        }
                        want.extend(
                            one.quantize(&y, &ys, group, bits, rounding, 11).expect("the host kernels do not fail"),
                        );
                        let (mut a, mut b, mut c) =
                            (vec![0u8; want.len()], vec![0u8; want.len()], vec![0u8; want.len()]);
                        encode_block_composed(&one, &y, group, bits, rounding, 11, &mut c)
                            .expect("the host kernels do not fail");
                        assert_eq!(c, want, "encode_block_composed n={n} g={group} {bits:?} {rounding:?}");
                        one.encode_block(&y, group, bits, rounding, 11, &mut a).expect("the host kernels do not fail");
                        many.encode_block(&y, group, bits, rounding, 11, &mut b).expect("the host kernels do not fail");
                        assert_eq!(a, want, "encode_block n={n} g={group} {bits:?} {rounding:?}");
                        assert_eq!(b, want, "encode_block n={n} g={group} {bits:?} {rounding:?} t={threads}");
                    }
                    // Three ranks' chunks, each with its own scales.
                    let k = 3;
                    let (mut codes, mut all_scales) = (Vec::new(), Vec::new());
                    for j in 0..k {
                        let y = data(n, 100 + j as u64);
                        let (mn, mx) = one.row_min_max(&y, group).expect("the host kernels do not fail");
                        let s = one.sym_scales(&mn, &mx, bits).expect("the host kernels do not fail");
                        codes.extend(
                            one.quantize(&y, &s, group, bits, Rounding::Nearest, 0)
                                .expect("the host kernels do not fail"),
                        );
                        all_scales.extend(s);
                    }
                    let mut a = data(n, 7);
                    let mut b = a.clone();
                    one.dequant_accumulate(&codes, &all_scales, n, group, k, bits, &mut a)
                        .expect("the host kernels do not fail");
                    many.dequant_accumulate(&codes, &all_scales, n, group, k, bits, &mut b)
                        .expect("the host kernels do not fail");
                    assert_eq!(
                        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "dequant_accumulate n={n} g={group} {bits:?} t={threads}"
                    );
                }
            }
            // n-bit's range in one pass: the two range kernels and a
            // finiteness check, on either engine.
            let mut y = x.clone();
            for bad in [None, Some(f32::NAN), Some(f32::INFINITY)] {
                if let (Some(v), true) = (bad, n > 3) {
                    y[n / 2] = v;
                }
                let (mins, maxs) = one.row_min_max(&y, n.max(1)).expect("the host kernels do not fail");
                let [mn, mx, _] = one.tensor_min_max(&mins, &maxs).expect("the host kernels do not fail");
                let want = (mn.to_bits(), mx.to_bits(), y.iter().all(|v| v.is_finite()));
                for got in [one.range_finite(&y), many.range_finite(&y)] {
                    let (a, b, f) = got.expect("the host kernels do not fail");
                    assert_eq!((a.to_bits(), b.to_bits(), f), want, "range_finite n={n} {bad:?}");
                }
            }
            for h in [Half::F16, Half::BF16] {
                let a = one.cast_to(h, &x).expect("the host kernels do not fail");
                assert_eq!(a, many.cast_to(h, &x).expect("the host kernels do not fail"), "cast_to n={n}");
                let back = one.cast_from(h, &a).expect("the host kernels do not fail");
                assert_eq!(
                    back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    many.cast_from(h, &a)
                        .expect("the host kernels do not fail")
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>()
                );
                for div in [1.0, 3.0] {
                    let (mut a, mut b) = (vec![0u8; 2 * n], vec![0u8; 2 * n]);
                    one.cast_to_le(h, &x, div, &mut a).expect("the host kernels do not fail");
                    many.cast_to_le(h, &x, div, &mut b).expect("the host kernels do not fail");
                    assert_eq!(a, b, "cast_to_le n={n} div={div}");
                    let (mut c, mut d) = (vec![0f32; n], vec![0f32; n]);
                    one.cast_from_le(h, &a, &mut c).expect("the host kernels do not fail");
                    many.cast_from_le(h, &a, &mut d).expect("the host kernels do not fail");
                    assert_eq!(c, d);
                    let (mut e, mut f) = (data(n, 5), data(n, 5));
                    one.accumulate_le(h, &a, &mut e).expect("the host kernels do not fail");
                    many.accumulate_le(h, &a, &mut f).expect("the host kernels do not fail");
                    assert_eq!(
                        e.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        f.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "accumulate_le n={n}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_block_buffer_of_the_wrong_length_is_an_error() {
    let x = data(1000, 3);
    for eng in [&HostEngine as &dyn KernelEngine, &ThreadedHostEngine::new(2)] {
        let mut short = vec![0u8; 4 * 8 + 999];
        let err = eng
            .encode_block(&x, 128, QBits::Int8, Rounding::Nearest, 0, &mut short)
            .expect_err("a block of 1000 int8 elements needs 1032 bytes");
        assert!(err.to_string().contains("needs 1032 bytes, the buffer holds 1031"), "{err}");
    }
}

#[test]
fn a_gpu_ranks_threads_come_from_the_environment_or_the_cores_it_shares() {
    // One test sets the variable (tests in this file run in one process,
    // so no other test reads it meanwhile).
    std::env::set_var("QSYNC_HOST_THREADS", "5");
    assert_eq!(ThreadedHostEngine::for_gpu_rank(8).threads(), 5);
    std::env::remove_var("QSYNC_HOST_THREADS");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(ThreadedHostEngine::for_gpu_rank(1).threads(), cores.clamp(1, 8));
    assert_eq!(ThreadedHostEngine::for_gpu_rank(cores * 2).threads(), 1);
    assert_eq!(ThreadedHostEngine::new(0).threads(), 1);
}

/// n-bit's one-pass decoding gives the bits of its passes one after the
/// other (a zeroed sum, each buffer accumulated in turn, a division) on
/// one thread and on several, at every width, with a rank's NaN minimum
/// among the buffers; a short buffer or too few accumulators are errors.
#[test]
fn nbit_decoding_in_one_pass_is_its_passes_one_after_the_other() {
    let one = HostEngine;
    for &n in &SIZES {
        for bits in [1u8, 2, 4, 8] {
            let bufs: Vec<Vec<u8>> = (0..3u64)
                .map(|j| {
                    let mut x = data(n, 40 + j);
                    if j == 2 && n > 600 {
                        x[600] = f32::INFINITY;
                    }
                    qsync_runtime::sync::nbit::encode(&one, &x, bits, Rounding::Nearest, j).expect("encode")
                })
                .collect();
            let views: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
            let mut want = data(n, 9);
            want.iter_mut().for_each(|v| *v = 0.0);
            for b in &views {
                one.unpack_accumulate(b, n, bits, &mut want).expect("unpack_accumulate");
            }
            want.iter_mut().for_each(|v| *v /= 3.0);
            let canon =
                |v: &[f32]| v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>();
            let engines: [&dyn KernelEngine; 4] =
                [&one, &ThreadedHostEngine::new(2), &ThreadedHostEngine::new(3), &ThreadedHostEngine::new(8)];
            for (i, eng) in engines.into_iter().enumerate() {
                let mut got = data(n + 5, 7);
                eng.unpack_mean(&views, n, bits, 3.0, &mut got).expect("unpack_mean");
                assert_eq!(canon(&got[..n]), canon(&want), "n={n} bits={bits} engine {i}");
                assert_eq!(canon(&got[n..]), canon(&data(n + 5, 7)[n..]), "past n untouched");
                if n > 0 {
                    let mut bad = views.clone();
                    bad[1] = &bufs[1][..bufs[1].len() - 1];
                    assert!(eng.unpack_mean(&bad, n, bits, 3.0, &mut got).is_err(), "short buffer n={n}");
                    assert!(eng.unpack_mean(&views, n, bits, 3.0, &mut got[..n - 1]).is_err(), "n-1 accumulators");
                }
            }
        }
    }
}

/// qgZ's one-pass decoding gives the bits of its passes one after the
/// other (a zeroed sum, each block dequantize-accumulated in turn, a
/// division unless by 1), on one thread and on several, both widths, odd
/// groups, a NaN group; a block of the wrong length is an error naming it.
#[test]
fn qgz_decoding_in_one_pass_is_its_passes_one_after_the_other() {
    use qsync_runtime::sync::block::Quantizer;
    let one = HostEngine;
    for &n in &SIZES {
        for group in [7usize, 512] {
            for bits in [QBits::Int8, QBits::Int4] {
                let q = Quantizer { bits, group, rounding: Rounding::Nearest };
                let blocks: Vec<Vec<u8>> = (0..3u64)
                    .map(|j| {
                        let mut x = data(n, 60 + j);
                        if j == 1 && n > 600 {
                            x[600] = f32::NAN;
                        }
                        let mut b = Vec::new();
                        q.encode(&one, &x, j, &mut b, None).expect("encode");
                        b
                    })
                    .collect();
                let views: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
                let canon =
                    |v: &[f32]| v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>();
                for div in [1.0f32, 3.0] {
                    let mut want = vec![0f32; n];
                    q.accumulate(&one, &views, &mut want).expect("accumulate");
                    if div != 1.0 {
                        want.iter_mut().for_each(|v| *v /= div);
                    }
                    let engines: [&dyn KernelEngine; 3] =
                        [&one, &ThreadedHostEngine::new(2), &ThreadedHostEngine::new(3)];
                    for (i, eng) in engines.into_iter().enumerate() {
                        let mut got = data(n, 8);
                        q.decode_mean(eng, &views, div, &mut got).expect("decode_mean");
                        assert_eq!(canon(&got), canon(&want), "n={n} g={group} {bits:?} div={div} engine {i}");
                        if n > 0 {
                            let mut bad = views.clone();
                            bad[2] = &blocks[2][1..];
                            let err = q.decode_mean(eng, &bad, div, &mut got).expect_err("a short block");
                            assert!(format!("{err:?}").contains("block 2 has"), "{err:?}");
                        }
                    }
                }
            }
        }
    }
}
