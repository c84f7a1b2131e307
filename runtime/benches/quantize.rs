//! CPU throughput of the synchronization kernels as the runtime calls them
//! (the host engine: `qsync_kernels::cpu`, bit for bit the reference), in bytes of f32 input
//! per second: block quantization (int8/int4, group 512, round-to-nearest
//! and stochastic; int8 also unfused, the three kernels one after the other), dequantize-and-accumulate of 8 blocks (one-shot qgZ's
//! reduction on 8 ranks), n-bit packing and unpacking, n-bit's decoding of
//! 4 ranks' buffers in one pass against its passes one after the other,
//! qgZ's decoding of 4 blocks the same way, the f16 cast; and
//! `threaded/`: the same quantize, dequantize-accumulate and cast on one
//! thread against `ThreadedHostEngine` on every core (what a GPU rank's
//! host-staged buckets use), in the same run.
//!
//! `cargo bench -p qsync-runtime --bench quantize`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use qsync_kernels::{reference, QBits, Rounding};
use qsync_runtime::engine::encode_block_composed;
use qsync_runtime::sync::block::{self, Quantizer};
use qsync_runtime::testdata::{gradient, GradKind};
use qsync_runtime::{HostEngine, KernelEngine, ThreadedHostEngine};

const N: usize = 1 << 22; // 16 MiB of f32

fn quantize(c: &mut Criterion) {
    let x = gradient(GradKind::Normal, N, 1, 0);
    let mut g = c.benchmark_group("quantize");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(4 * N as u64));
    for (bits, rounding, name) in [
        (QBits::Int8, Rounding::Nearest, "int8-rn"),
        (QBits::Int4, Rounding::Nearest, "int4-rn"),
        (QBits::Int8, Rounding::Stochastic, "int8-sr"),
    ] {
        let q = Quantizer { bits, group: 512, rounding };
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                let mut out = Vec::with_capacity(q.block_len(N));
                q.encode(&HostEngine, black_box(&x), 7, &mut out, None).map(|()| out)
            })
        });
    }
    // The same block from the three kernels and a finiteness pass, one
    // after the other over the whole buffer (what the encoder did before
    // it had a fused kernel): the fused encoder's gain, in the same run.
    g.bench_function(BenchmarkId::from_parameter("int8-rn-unfused"), |b| {
        b.iter(|| {
            let mut out = vec![0u8; block::block_len(N, QBits::Int8, 512)];
            encode_block_composed(&HostEngine, black_box(&x), 512, QBits::Int8, Rounding::Nearest, 7, &mut out)
                .map(|()| out)
        })
    });
    g.finish();
}

fn dequantize_accumulate(c: &mut Criterion) {
    let k = 8;
    let m = N / k;
    let mut g = c.benchmark_group("dequant-accumulate");
    g.sample_size(10);
    // k blocks of m elements stand for k·m f32 values.
    g.throughput(Throughput::Bytes(4 * (k * m) as u64));
    for (bits, name) in [(QBits::Int8, "int8x8"), (QBits::Int4, "int4x8")] {
        let q = Quantizer { bits, group: 512, rounding: Rounding::Nearest };
        let Ok(blocks) = (0..k)
            .map(|r| {
                let mut b = Vec::new();
                q.encode(&HostEngine, &gradient(GradKind::Normal, m, 2, r), 0, &mut b, None).map(|()| b)
            })
            .collect::<Result<Vec<Vec<u8>>, _>>()
        else {
            return;
        };
        let refs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                let mut out = vec![0f32; m];
                q.accumulate(&HostEngine, black_box(&refs), &mut out).map(|()| out)
            })
        });
    }
    g.finish();
}

fn nbit_and_cast(c: &mut Criterion) {
    let x = gradient(GradKind::Normal, N, 3, 0);
    let (mins, maxs) = reference::row_min_max(&x, N);
    let [mn, mx, _] = reference::tensor_min_max(&mins, &maxs);
    let mut g = c.benchmark_group("nbit-and-cast");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(4 * N as u64));
    let e = HostEngine;
    // Every width n-bit offers: the codes a byte holds decide how the
    // loops vectorize, so each width has its own rate.
    let mut out = vec![0f32; N];
    for bits in [1u8, 2, 4, 8] {
        g.bench_function(format!("pack-{bits}bit"), |b| {
            b.iter(|| e.pack(black_box(&x), mn, mx, bits, Rounding::Nearest, 0))
        });
        let packed = reference::pack(&x, mn, mx, bits, Rounding::Nearest, 0);
        g.bench_function(format!("unpack-accumulate-{bits}bit"), |b| {
            b.iter(|| e.unpack_accumulate(black_box(&packed), N, bits, &mut out).map_err(|e| format!("{e:?}")))
        });
    }
    g.bench_function("cast-f16", |b| b.iter(|| e.cast_to(qsync_kernels::Half::F16, black_box(&x))));
    g.finish();
}

/// n-bit's decoding of 4 ranks' 2-bit buffers into a 64 MiB sum (larger
/// than the caches, as a model's gradient is): in one pass (`unpack_mean`, a cache slice at a time) against the passes one
/// after the other over the whole sum (zero, 4 unpack-accumulates,
/// divide: what the runtime ran before, and what an engine without the
/// fused kernel runs), in the same run.
fn nbit_decode(c: &mut Criterion) {
    const N: usize = 1 << 24;
    let bufs: Vec<Vec<u8>> = (0..4)
        .map(|r| {
            let x = gradient(GradKind::Normal, N, 5, r);
            let (mins, maxs) = reference::row_min_max(&x, N);
            let [mn, mx, _] = reference::tensor_min_max(&mins, &maxs);
            reference::pack(&x, mn, mx, 2, Rounding::Nearest, 0)
        })
        .collect();
    let refs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
    let mut g = c.benchmark_group("nbit-decode");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(4 * N as u64));
    let e = HostEngine;
    let mut out = vec![0f32; N];
    g.bench_function("2bit-x4/one-pass", |b| {
        b.iter(|| e.unpack_mean(black_box(&refs), N, 2, 4.0, &mut out).map_err(|e| format!("{e:?}")))
    });
    g.bench_function("2bit-x4/passes", |b| {
        b.iter(|| -> Result<(), String> {
            qsync_runtime::sync::nbit::zero(&mut out);
            for r in &refs {
                e.unpack_accumulate(black_box(r), N, 2, &mut out).map_err(|e| format!("{e:?}"))?;
            }
            qsync_runtime::sync::nbit::divide(&mut out, 4);
            Ok(())
        })
    });
    g.finish();
}

/// qgZ's decoding of 4 ranks' int8 blocks (group 512) into a 64 MiB sum,
/// divided by 4: in one pass (`Quantizer::decode_mean`, a cache slice at a
/// time) against the passes one after the other over the whole sum (zero,
/// dequantize-accumulate each block, divide), in the same run.
fn qgz_decode(c: &mut Criterion) {
    const N: usize = 1 << 24;
    let q = Quantizer { bits: QBits::Int8, group: 512, rounding: Rounding::Nearest };
    let Ok(blocks) = (0..4)
        .map(|r| {
            let mut b = Vec::new();
            q.encode(&HostEngine, &gradient(GradKind::Normal, N, 6, r), 0, &mut b, None).map(|()| b)
        })
        .collect::<Result<Vec<Vec<u8>>, _>>()
    else {
        return;
    };
    let refs: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
    let mut g = c.benchmark_group("qgz-decode");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(4 * N as u64));
    let mut out = vec![0f32; N];
    g.bench_function("int8-x4/one-pass", |b| b.iter(|| q.decode_mean(&HostEngine, black_box(&refs), 4.0, &mut out)));
    g.bench_function("int8-x4/passes", |b| {
        b.iter(|| {
            out.fill(0.0);
            let r = q.accumulate(&HostEngine, black_box(&refs), &mut out);
            out.iter_mut().for_each(|v| *v /= 4.0);
            r
        })
    });
    g.finish();
}

fn threaded(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let x = gradient(GradKind::Normal, N, 4, 0);
    let mut g = c.benchmark_group("threaded");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(4 * N as u64));
    let engines: [(&str, &dyn KernelEngine); 2] =
        [("1-thread", &HostEngine), (&*format!("{cores}-threads").leak(), &ThreadedHostEngine::new(cores))];
    let q = Quantizer { bits: QBits::Int8, group: 512, rounding: Rounding::Nearest };
    let Ok(block) = ({
        let mut b = Vec::new();
        q.encode(&HostEngine, &x, 0, &mut b, None).map(|()| b)
    }) else {
        return;
    };
    let refs: Vec<&[u8]> = (0..4).map(|_| block.as_slice()).collect();
    for (name, e) in engines {
        g.bench_function(format!("quantize-int8-rn/{name}"), |b| {
            b.iter(|| {
                let mut out = Vec::with_capacity(q.block_len(N));
                q.encode(e, black_box(&x), 7, &mut out, None).map(|()| out)
            })
        });
        let mut out = vec![0f32; N];
        g.bench_function(format!("dequant-accumulate-int8x4/{name}"), |b| {
            b.iter(|| q.accumulate(e, black_box(&refs), &mut out))
        });
        let mut bytes = vec![0u8; 2 * N];
        g.bench_function(format!("cast-f16-le/{name}"), |b| {
            b.iter(|| e.cast_to_le(qsync_kernels::Half::F16, black_box(&x), 4.0, &mut bytes))
        });
    }
    g.finish();
}

criterion_group!(benches, quantize, dequantize_accumulate, nbit_and_cast, nbit_decode, qgz_decode, threaded);
criterion_main!(benches);
