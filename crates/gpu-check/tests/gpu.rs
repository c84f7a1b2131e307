//! The GPU check (run by `scripts/gpu-check.sh`): load this GPU's PTX (from
//! `qsyncc codegen --all-kernels`, see the crate doc) with the CUDA driver, run every kernel on seeded inputs and compare with
//! the CPU reference (bitwise; stochastic rounding is bitwise too, since
//! the generator is counter-based), then measure bandwidth on 256 MiB
//! tensors against the GPU's peak.
//!
//! Gated: without `QSYNC_GPU_TEST=1` it prints why it skipped and passes;
//! with it, a missing driver, device or PTX fails the test. Results go to
//! `$QSYNC_GPU_REPORT` (default `target/gpu-report.json`).

#![allow(unsafe_code)] // kernel launches are `unsafe` in cudarc.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use qsync_kernels::reference as r;
use qsync_kernels::{Half, KernelSpec, QBits, Rounding};

enum A<'a> {
    P(&'a CudaSlice<u8>),
    U(u64),
}

struct Gpu {
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    sms: u32,
}

fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
    let n = std::mem::size_of_val(v);
    // SAFETY: plain-old-data slices (f32, i8, i32, u16, u8) viewed as bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), n) }.to_vec()
}

fn from_bytes<T: Copy + Default>(b: &[u8]) -> Vec<T> {
    let n = b.len() / std::mem::size_of::<T>();
    let mut out = vec![T::default(); n];
    // SAFETY: `out` has room for exactly `n` values of plain-old-data `T`.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.as_mut_ptr().cast::<u8>(), n * std::mem::size_of::<T>()) };
    out
}

impl Gpu {
    fn up<T: Copy>(&self, v: &[T]) -> CudaSlice<u8> {
        let b = bytes(v);
        if b.is_empty() {
            return self.stream.alloc_zeros::<u8>(16).unwrap();
        }
        self.stream.clone_htod(&b).unwrap()
    }
    fn zeros(&self, n: usize) -> CudaSlice<u8> {
        self.stream.alloc_zeros::<u8>(n.max(16)).unwrap()
    }
    fn down<T: Copy + Default>(&self, s: &CudaSlice<u8>, n: usize) -> Vec<T> {
        let b: Vec<u8> = self.stream.clone_dtoh(s).unwrap();
        from_bytes::<T>(&b[..n * std::mem::size_of::<T>()])
    }
    fn func(&self, spec: KernelSpec) -> CudaFunction {
        self.module.load_function(&spec.name()).unwrap()
    }
    /// Launches `spec` and waits for it.
    fn run(&self, spec: KernelSpec, args: &[A]) {
        self.launch(spec, args);
        self.stream.synchronize().unwrap();
    }
    /// Launches `spec` over its domain with a grid-stride-sized grid, without
    /// waiting.
    fn launch(&self, spec: KernelSpec, args: &[A]) {
        let raw: Vec<u64> = args.iter().map(|a| if let A::U(v) = a { *v } else { 0 }).collect();
        let dom = spec.domain(&raw).max(1);
        let blocks = dom.div_ceil(256).min(u64::from(self.sms) * 32) as u32;
        let f = self.func(spec);
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            match a {
                A::P(s) => b.arg(*s),
                A::U(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig { grid_dim: (blocks.max(1), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: argument kinds and order follow `spec.args()`; every buffer
        // was sized by the caller for the kernel's domain.
        unsafe { b.launch(cfg) }.unwrap();
    }
}

fn setup() -> Result<(Gpu, String), String> {
    // SAFETY: only probes whether the driver library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) is not loadable on this machine".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("no CUDA device 0: {e}"))?;
    let (maj, min) = ctx.compute_capability().map_err(|e| e.to_string())?;
    let arch = qsync_gpu_check::sm_name(maj, min);
    let ptx = qsync_gpu_check::read_ptx(&qsync_gpu_check::ptx_dir(), &arch)?;
    for k in KernelSpec::all() {
        if !ptx.contains(&format!(".entry {}(", k.name())) {
            return Err(format!("{arch}/kernels.ptx lacks {k}: generate it with --all-kernels"));
        }
    }
    let module = ctx.load_module(ptx.into()).map_err(|e| format!("PTX for {arch} does not load: {e}"))?;
    let sms = ctx
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| e.to_string())? as u32;
    Ok((Gpu { stream: ctx.default_stream(), module, sms }, arch))
}

struct Gen(u64);
impl Gen {
    fn f(&mut self) -> f32 {
        self.0 += 1;
        let h = qsync_kernels::rng::hash(77, self.0);
        if h.is_multiple_of(53) {
            f32::from_bits(h as u32)
        } else {
            ((h >> 40) as f32 / 16_777_216.0 - 0.5) * 8.0
        }
    }
}

fn check_kernels(g: &Gpu) {
    let mut gen = Gen(0);
    let n = 100_003usize;
    let mut x: Vec<f32> = (0..n).map(|_| gen.f()).collect();
    x[..6].copy_from_slice(&[f32::NAN, f32::INFINITY, -0.0, 65520.0, 1e-45, f32::MAX]);
    let dx = g.up(&x);
    let nn = n as u64;
    for h in [Half::F16, Half::BF16] {
        let out = g.zeros(2 * n);
        g.run(KernelSpec::CastTo(h), &[A::P(&dx), A::P(&out), A::U(nn)]);
        let got: Vec<u16> = g.down(&out, n);
        assert_eq!(got, r::cast_to(h, &x), "cast to {h:?}");
        let back = g.zeros(4 * n);
        g.run(KernelSpec::CastFrom(h), &[A::P(&out), A::P(&back), A::U(nn)]);
        let gb: Vec<u32> = g.down(&back, n);
        let want: Vec<u32> = r::cast_from(h, &got).iter().map(|v| v.to_bits()).collect();
        assert_eq!(gb, want, "cast from {h:?}");
    }
    for group in [n, 1000, 64] {
        let rows = n.div_ceil(group);
        let (rmin, rmax) = (g.zeros(4 * rows), g.zeros(4 * rows));
        g.run(KernelSpec::RowMinMax, &[A::P(&dx), A::U(nn), A::U(group as u64), A::P(&rmin), A::P(&rmax)]);
        let (wmin, wmax) = r::row_min_max(&x, group);
        assert_eq!(
            g.down::<f32>(&rmin, rows).iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            wmin.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            g.down::<f32>(&rmax, rows).iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            wmax.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let t = g.zeros(12);
        g.run(KernelSpec::TensorMinMax, &[A::P(&rmin), A::P(&rmax), A::U(rows as u64), A::P(&t)]);
        assert_eq!(
            g.down::<f32>(&t, 3).iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            r::tensor_min_max(&wmin, &wmax).iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        for (bits, sym) in [(QBits::Int8, true), (QBits::Int8, false), (QBits::Int4, true)] {
            let (s, z) = (g.zeros(4 * rows), g.zeros(4 * rows));
            g.run(
                KernelSpec::QuantParams { bits, symmetric: sym },
                &[A::P(&rmin), A::P(&rmax), A::U(rows as u64), A::P(&s), A::P(&z)],
            );
            let (ws, wz) = r::quant_params_all(&wmin, &wmax, bits, sym);
            assert_eq!(
                g.down::<f32>(&s, rows).iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                ws.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!(g.down::<i32>(&z, rows), wz);
            for rounding in [Rounding::Nearest, Rounding::Stochastic] {
                if bits == QBits::Int8 {
                    let q = g.zeros(n);
                    let spec = KernelSpec::QuantizeInt8 { symmetric: sym, rounding };
                    g.run(spec, &[A::P(&dx), A::P(&s), A::P(&z), A::U(nn), A::U(group as u64), A::U(7), A::P(&q)]);
                    let want = r::quantize_i8(&x, &ws, &wz, group, sym, rounding, 7);
                    let got: Vec<i8> = g.down(&q, n);
                    assert_eq!(got, want, "{spec}");
                    let d = g.zeros(4 * n);
                    g.run(
                        KernelSpec::DequantizeInt8 { symmetric: sym },
                        &[A::P(&q), A::P(&s), A::P(&z), A::U(nn), A::U(group as u64), A::P(&d)],
                    );
                    let wd: Vec<u32> =
                        r::dequantize_i8(&want, &ws, &wz, group, sym).iter().map(|v| v.to_bits()).collect();
                    assert_eq!(g.down::<u32>(&d, n), wd, "dequantize sym={sym}");
                } else {
                    let q = g.zeros(n.div_ceil(2));
                    g.run(
                        KernelSpec::QuantizeInt4 { rounding },
                        &[A::P(&dx), A::P(&s), A::U(nn), A::U(group as u64), A::U(7), A::P(&q)],
                    );
                    let want = r::quantize_i4(&x, &ws, group, rounding, 7);
                    assert_eq!(g.down::<u8>(&q, n.div_ceil(2)), want, "int4 {rounding:?}");
                    let d = g.zeros(4 * n);
                    g.run(KernelSpec::DequantizeInt4, &[A::P(&q), A::P(&s), A::U(nn), A::U(group as u64), A::P(&d)]);
                    let wd: Vec<u32> = r::dequantize_i4(&want, &ws, n, group).iter().map(|v| v.to_bits()).collect();
                    assert_eq!(g.down::<u32>(&d, n), wd, "dequantize int4");
                }
            }
        }
    }
    // Packing over the finite range of x.
    let finite: Vec<f32> = x.iter().map(|v| if v.is_finite() && v.abs() < 1e6 { *v } else { 0.0 }).collect();
    let df = g.up(&finite);
    let (a, b) = r::row_min_max(&finite, 4096);
    let [mn, mx, _] = r::tensor_min_max(&a, &b);
    let range = g.up(&[mn, mx]);
    for bits in [1u8, 2, 4, 8] {
        for rounding in [Rounding::Nearest, Rounding::Stochastic] {
            let len = r::packed_len(n, bits);
            let p = g.zeros(len);
            g.run(KernelSpec::PackBits { bits, rounding }, &[A::P(&df), A::P(&range), A::U(nn), A::U(3), A::P(&p)]);
            let want = r::pack(&finite, mn, mx, bits, rounding, 3);
            assert_eq!(g.down::<u8>(&p, len), want, "pack {bits} {rounding:?}");
            let u = g.zeros(4 * n);
            g.run(KernelSpec::UnpackBits { bits }, &[A::P(&p), A::U(nn), A::P(&u)]);
            let wu: Vec<u32> = r::unpack(&want, n, bits).unwrap().iter().map(|v| v.to_bits()).collect();
            assert_eq!(g.down::<u32>(&u, n), wu, "unpack {bits}");
        }
    }
    // Dequantize-accumulate of k = 4 int8 and int4 chunks.
    let (k, group) = (4usize, 128usize);
    for bits in [QBits::Int8, QBits::Int4] {
        let (mut q, mut s) = (Vec::<u8>::new(), Vec::<f32>::new());
        for j in 0..k {
            let xs: Vec<f32> = finite.iter().map(|v| v * (j as f32 + 1.0)).collect();
            let (a, b) = r::row_min_max(&xs, group);
            let (sc, z) = r::quant_params_all(&a, &b, bits, true);
            match bits {
                QBits::Int8 => {
                    q.extend(r::quantize_i8(&xs, &sc, &z, group, true, Rounding::Nearest, 0).iter().map(|&c| c as u8))
                }
                QBits::Int4 => q.extend(r::quantize_i4(&xs, &sc, group, Rounding::Nearest, 0)),
            }
            s.extend(sc);
        }
        let init: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let (dq, ds, dacc) = (g.up(&q), g.up(&s), g.up(&init));
        g.run(
            KernelSpec::DequantAccumulate { bits },
            &[A::P(&dq), A::P(&ds), A::U(nn), A::U(group as u64), A::U(k as u64), A::P(&dacc)],
        );
        let mut want = init;
        r::dequant_accumulate(&q, &s, n, group, k, bits, &mut want);
        assert_eq!(
            g.down::<u32>(&dacc, n),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "accumulate {bits:?}"
        );
    }
}

/// GB/s of one kernel over 256 MiB of f32 input: the best of 5 after a
/// warm-up, each timed on the GPU between two events around the launch (as
/// PyTorch's comparison is), so host launch and synchronization costs are
/// not counted.
fn bandwidth(g: &Gpu, spec: KernelSpec, bytes_moved: f64, args: &[A]) -> f64 {
    g.run(spec, args);
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = g.stream.record_event(timed).unwrap();
        g.launch(spec, args);
        let end = g.stream.record_event(timed).unwrap();
        best = best.min(f64::from(start.elapsed_ms(&end).unwrap()) / 1e3);
    }
    bytes_moved / best / 1e9
}

#[test]
fn gpu_kernels_match_reference_and_bandwidth() {
    if std::env::var("QSYNC_GPU_TEST").as_deref() != Ok("1") {
        println!("gpu check skipped: QSYNC_GPU_TEST is not 1 (scripts/gpu-check.sh sets it)");
        return;
    }
    // Asked for explicitly: no driver, no device or no PTX is a failure,
    // never a pass.
    let (g, arch) = setup().unwrap_or_else(|why| panic!("gpu check: {why}"));
    check_kernels(&g);
    println!("gpu check: every kernel matches the CPU reference on {arch}");
    let n = 64usize << 20; // 256 MiB of f32
    let nn = n as u64;
    let x = g.up(&(0..n).map(|i| ((i % 1000) as f32 - 500.0) * 0.01).collect::<Vec<f32>>());
    let h = g.zeros(2 * n);
    let q = g.zeros(n);
    let f = g.zeros(4 * n);
    let s = g.up(&[5.0f32 / 127.0]);
    let z = g.up(&[0i32]);
    let mut rows = Vec::new();
    let nf = n as f64;
    rows.push((
        "cast_f32_to_f16",
        bandwidth(&g, KernelSpec::CastTo(Half::F16), 6.0 * nf, &[A::P(&x), A::P(&h), A::U(nn)]),
    ));
    rows.push((
        "cast_f16_to_f32",
        bandwidth(&g, KernelSpec::CastFrom(Half::F16), 6.0 * nf, &[A::P(&h), A::P(&f), A::U(nn)]),
    ));
    rows.push((
        "cast_f32_to_bf16",
        bandwidth(&g, KernelSpec::CastTo(Half::BF16), 6.0 * nf, &[A::P(&x), A::P(&h), A::U(nn)]),
    ));
    let qs = KernelSpec::QuantizeInt8 { symmetric: true, rounding: Rounding::Nearest };
    rows.push((
        "quantize_i8_per_tensor",
        bandwidth(&g, qs, 5.0 * nf, &[A::P(&x), A::P(&s), A::P(&z), A::U(nn), A::U(nn), A::U(1), A::P(&q)]),
    ));
    let qsr = KernelSpec::QuantizeInt8 { symmetric: true, rounding: Rounding::Stochastic };
    rows.push((
        "quantize_i8_stochastic",
        bandwidth(&g, qsr, 5.0 * nf, &[A::P(&x), A::P(&s), A::P(&z), A::U(nn), A::U(nn), A::U(1), A::P(&q)]),
    ));
    let dq = KernelSpec::DequantizeInt8 { symmetric: true };
    rows.push((
        "dequantize_i8",
        bandwidth(&g, dq, 5.0 * nf, &[A::P(&q), A::P(&s), A::P(&z), A::U(nn), A::U(nn), A::P(&f)]),
    ));
    let peak = std::env::var("QSYNC_PEAK_GBS").ok().and_then(|v| v.parse::<f64>().ok());
    let mut json = serde_json::json!({ "arch": arch, "peak_gb_s": peak, "kernels": {} });
    for (name, gbs) in &rows {
        let frac = peak.map(|p| gbs / p);
        println!(
            "bandwidth {name}: {gbs:.1} GB/s{}",
            frac.map(|f| format!(" ({:.0}% of peak)", f * 100.0)).unwrap_or_default()
        );
        json["kernels"][*name] = serde_json::json!({ "gb_s": gbs, "fraction_of_peak": frac });
    }
    let path = std::env::var("QSYNC_GPU_REPORT").unwrap_or_else(|_| "target/gpu-report.json".into());
    let _ = std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap());
    println!("gpu report written to {path}");
}
