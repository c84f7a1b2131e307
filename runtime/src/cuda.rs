//! [`CudaEngine`]: the schemes' kernels as our PTX on a GPU.
//!
//! The PTX is what `qsyncc codegen MODEL --target sm_XX --emit ptx
//! --all-kernels -o DIR/sm_XX` writes (`kernels.ptx`, every kernel of
//! `qsync_kernels::KernelSpec::all`), read for the device's compute
//! capability from a directory ([`CudaEngine::from_dir`]; `$QSYNC_PTX_DIR`
//! for [`CudaEngine::from_env`]). The driver JIT-compiles it for the device
//! when the module loads.
//!
//! Each call stages its host inputs into device memory, launches the kernel
//! on the engine's stream with a grid-stride-sized grid (256 threads a
//! block, at most 32 blocks per SM), and copies the outputs back after the
//! stream is idle. Every copy goes through one page-locked host buffer of
//! the engine: from pageable memory the driver stages copies itself in
//! small pieces, which ran at about 1 GB/s on the lent H100 machine. Errors are the runtime's [`CommError`]s (backend
//! `cuda`): a missing driver is [`CommError::LibraryMissing`], a missing or
//! incomplete PTX file names the file and how to make it.
//!
//! The driver is loaded at run time (cudarc's dynamic loading): this
//! builds everywhere and fails with a clear error where there is no GPU.

// Kernel launches and the driver's library probe are `unsafe` in cudarc.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::result as cu;
use cudarc::driver::{
    CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, LaunchConfig, PushKernelArg,
};
use qsync_kernels::reference::{packed_len, unpack_header};
use qsync_kernels::{Half, KernelSpec, QBits, Rounding};

use crate::engine::{DecodeError, KernelEngine};
use crate::error::CommError;
use crate::sync::{f32_from_bytes, u16_from_bytes};

/// The environment variable naming the PTX directory.
pub const ENV_PTX_DIR: &str = "QSYNC_PTX_DIR";

const BACKEND: &str = "cuda";
const THREADS: u32 = 256;

fn driver_err(op: &'static str) -> impl Fn(DriverError) -> CommError {
    move |e| CommError::Backend { backend: BACKEND, op, code: e.0 as i32, message: e.to_string() }
}

/// `sm_75` for compute capability 7.5.
pub fn sm_name(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// Our kernels loaded on one GPU.
pub struct CudaEngine {
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    sms: u32,
    arch: String,
    pinned: Mutex<Pinned>,
}

/// The engine's page-locked staging buffer (grown on demand, freed with
/// the engine). Held locked from the host copy into it until the stream
/// has finished the device copy out of it (or the other way round).
#[derive(Debug, Default)]
struct Pinned {
    ptr: usize,
    cap: usize,
}

impl Pinned {
    /// The first `len` bytes of the buffer, grown to hold them.
    fn get(&mut self, ctx: &Arc<CudaContext>, len: usize, op: &'static str) -> Result<&mut [u8], CommError> {
        if self.cap < len {
            ctx.bind_to_thread().map_err(driver_err(op))?;
            if self.ptr != 0 {
                // SAFETY: allocated below by `malloc_host`; no copy names it
                // (the stream is idle whenever the lock is free).
                unsafe { cu::free_host(self.ptr as *mut std::ffi::c_void) }.map_err(driver_err(op))?;
                *self = Pinned::default();
            }
            let cap = len.max(1 << 16).next_power_of_two();
            // SAFETY: a plain page-locked allocation (flags 0: cached, so the
            // host reads it back at full speed, unlike write-combined memory).
            self.ptr = unsafe { cu::malloc_host(cap, 0) }.map_err(driver_err(op))? as usize;
            self.cap = cap;
        }
        // SAFETY: `ptr` holds `cap >= len` bytes owned by this buffer, and the
        // `&mut self` borrow makes this the only view of them.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, len) })
    }
}

fn lock(m: &Mutex<Pinned>) -> MutexGuard<'_, Pinned> {
    // A panic while holding it left at worst stale bytes, which every use
    // overwrites before reading.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        let p = lock(&self.pinned);
        if p.ptr != 0 && self.stream.context().bind_to_thread().is_ok() {
            // SAFETY: every copy through it was waited for before the lock was
            // released.
            let _ = unsafe { cu::free_host(p.ptr as *mut std::ffi::c_void) };
        }
    }
}

impl std::fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaEngine").field("arch", &self.arch).field("sms", &self.sms).finish()
    }
}

/// The quantize kernel reads `scales[i / group]` for every element `i` of
/// `n`: the group must be positive and every group must have its scale.
/// Checked before anything reaches the GPU (the kernel trusts its input).
pub fn check_quantize(n: usize, scales: usize, group: usize) -> Result<(), CommError> {
    const OP: &str = "quantize";
    if group == 0 {
        return Err(CommError::InvalidArgument { op: OP, detail: "quantization group size 0".into() });
    }
    let groups = n.div_ceil(group);
    if scales < groups {
        return Err(CommError::InvalidArgument {
            op: OP,
            detail: format!("{scales} scales for {n} values in {groups} groups of {group}"),
        });
    }
    Ok(())
}

/// The dequantize-accumulate kernel reads `k` chunks of codes (`n` int8
/// bytes or `ceil(n/2)` int4 bytes each) and of scales (`ceil(n/group)`
/// each) and adds into `n` accumulators: every buffer must hold that much.
/// Checked before anything reaches the GPU (the kernel trusts its input).
pub fn check_dequant_accumulate(
    codes: usize,
    scales: usize,
    n: usize,
    group: usize,
    k: usize,
    bits: QBits,
    out: usize,
) -> Result<(), CommError> {
    const OP: &str = "dequantize-accumulate";
    let bad = |detail: String| Err(CommError::InvalidArgument { op: OP, detail });
    if group == 0 {
        return bad("quantization group size 0".into());
    }
    let chunk = match bits {
        QBits::Int8 => n,
        QBits::Int4 => n.div_ceil(2),
    };
    let groups = n.div_ceil(group);
    let (Some(need_codes), Some(need_scales)) = (chunk.checked_mul(k), groups.checked_mul(k)) else {
        return bad(format!("{k} chunks of {n} values overflow"));
    };
    if codes < need_codes {
        return bad(format!("{codes} code bytes for {k} chunks of {chunk}"));
    }
    if scales < need_scales {
        return bad(format!("{scales} scales for {k} chunks of {groups} groups"));
    }
    if out < n {
        return bad(format!("{n} values into {out} accumulators"));
    }
    Ok(())
}

/// One kernel argument: a device buffer or a 64-bit integer.
enum A<'a> {
    P(&'a CudaSlice<u8>),
    U(u64),
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain-old-data slices (f32, u16, u8) viewed as their bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The primary context of CUDA device `ordinal`, with its architecture;
/// `LibraryMissing` without a driver.
fn open(ordinal: usize) -> Result<(Arc<CudaContext>, String), CommError> {
    // SAFETY: only probes whether the driver library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CommError::LibraryMissing {
            library: "the CUDA driver (libcuda)".into(),
            searched: "the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache)".into(),
        });
    }
    let ctx = CudaContext::new(ordinal).map_err(driver_err("init"))?;
    let (maj, min) = ctx.compute_capability().map_err(driver_err("init"))?;
    Ok((ctx, sm_name(maj, min)))
}

impl CudaEngine {
    /// Loads `ptx` on CUDA device `ordinal`. Every kernel of
    /// `KernelSpec::all()` must be in it.
    pub fn new(ordinal: usize, ptx: &str) -> Result<CudaEngine, CommError> {
        let (ctx, arch) = open(ordinal)?;
        CudaEngine::load(ctx, arch, ptx)
    }

    /// [`CudaEngine::new`] with `<dir>/sm_XX/kernels.ptx` for the device's
    /// compute capability.
    pub fn from_dir(ordinal: usize, dir: &Path) -> Result<CudaEngine, CommError> {
        let (ctx, arch) = open(ordinal)?;
        let path = dir.join(&arch).join("kernels.ptx");
        let ptx = std::fs::read_to_string(&path).map_err(|e| CommError::Unsupported {
            backend: BACKEND,
            what: format!(
                "{}: {e} (generate it with `qsyncc codegen MODEL --target {arch} --emit ptx --all-kernels -o {}`)",
                path.display(),
                dir.join(&arch).display()
            ),
        })?;
        CudaEngine::load(ctx, arch, &ptx)
    }

    /// [`CudaEngine::from_dir`] with `$QSYNC_PTX_DIR` (default
    /// `target/gpu-check`, where `scripts/gpu-check.sh prepare` writes it).
    pub fn from_env(ordinal: usize) -> Result<CudaEngine, CommError> {
        let dir = std::env::var_os(ENV_PTX_DIR).map_or_else(|| PathBuf::from("target/gpu-check"), PathBuf::from);
        CudaEngine::from_dir(ordinal, &dir)
    }

    fn load(ctx: Arc<CudaContext>, arch: String, ptx: &str) -> Result<CudaEngine, CommError> {
        if let Some(k) = KernelSpec::all().into_iter().find(|k| !ptx.contains(&format!(".entry {}(", k.name()))) {
            return Err(CommError::Unsupported {
                backend: BACKEND,
                what: format!("the PTX for {arch} lacks kernel {k} (generate it with --all-kernels)"),
            });
        }
        let module = ctx.load_module(ptx.to_string().into()).map_err(driver_err("module load"))?;
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("init"))? as u32;
        Ok(CudaEngine { stream: ctx.default_stream(), module, sms, arch, pinned: Mutex::default() })
    }

    /// The device architecture the PTX was loaded for (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// `v` in a new device buffer of its size, copied through the pinned
    /// buffer.
    fn up<T: Copy>(&self, v: &[T], op: &'static str) -> Result<CudaSlice<u8>, CommError> {
        let b = as_bytes(v);
        if b.is_empty() {
            return self.zeros(0, op);
        }
        // SAFETY: every byte is written by the copy below before any kernel
        // reads it.
        let mut d = unsafe { self.stream.alloc::<u8>(b.len()) }.map_err(driver_err(op))?;
        let mut pinned = lock(&self.pinned);
        let host = pinned.get(self.stream.context(), b.len(), op)?;
        host.copy_from_slice(b);
        {
            let (dst, _record) = d.device_ptr_mut(&self.stream);
            // SAFETY: `dst` holds `host.len()` bytes; `host` stays untouched
            // (the lock is held) until the stream is idle below.
            unsafe { cu::memcpy_htod_async(dst, &*host, self.stream.cu_stream()) }.map_err(driver_err(op))?;
        }
        self.stream.synchronize().map_err(driver_err(op))?;
        Ok(d)
    }

    fn zeros(&self, n: usize, op: &'static str) -> Result<CudaSlice<u8>, CommError> {
        self.stream.alloc_zeros::<u8>(n.max(16)).map_err(driver_err(op))
    }

    /// The first `out.len()` bytes of `s` into `out`, through the pinned
    /// buffer.
    fn down_into(&self, s: &CudaSlice<u8>, out: &mut [u8], op: &'static str) -> Result<(), CommError> {
        if out.is_empty() {
            return Ok(());
        }
        let mut pinned = lock(&self.pinned);
        let host = pinned.get(self.stream.context(), out.len(), op)?;
        {
            let (src, _record) = s.device_ptr(&self.stream);
            // SAFETY: `s` holds at least `host.len()` bytes (every output
            // buffer is sized for its kernel); the stream is waited for
            // before `host` is read.
            unsafe { cu::memcpy_dtoh_async(&mut *host, src, self.stream.cu_stream()) }.map_err(driver_err(op))?;
        }
        self.stream.synchronize().map_err(driver_err(op))?;
        out.copy_from_slice(host);
        Ok(())
    }

    fn down(&self, s: &CudaSlice<u8>, bytes: usize, op: &'static str) -> Result<Vec<u8>, CommError> {
        let mut b = vec![0u8; bytes];
        self.down_into(s, &mut b, op)?;
        Ok(b)
    }

    /// Launches `spec` over its domain and waits for the stream.
    fn run(&self, spec: KernelSpec, args: &[A], op: &'static str) -> Result<(), CommError> {
        let raw: Vec<u64> = args.iter().map(|a| if let A::U(v) = a { *v } else { 0 }).collect();
        let dom = spec.domain(&raw).max(1);
        let blocks = dom.div_ceil(u64::from(THREADS)).min(u64::from(self.sms.max(1)) * 32).max(1) as u32;
        let f = self.module.load_function(&spec.name()).map_err(driver_err(op))?;
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            match a {
                A::P(s) => b.arg(*s),
                A::U(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments follow `spec.args()` in kind and order, and
        // every buffer was sized above for the kernel's domain.
        unsafe { b.launch(cfg) }.map_err(driver_err(op))?;
        self.stream.synchronize().map_err(driver_err(op))
    }
}

impl KernelEngine for CudaEngine {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn row_min_max(&self, x: &[f32], cols: usize) -> Result<(Vec<f32>, Vec<f32>), CommError> {
        const OP: &str = "row min/max";
        let cols = cols.max(1);
        let rows = x.len().div_ceil(cols);
        let dx = self.up(x, OP)?;
        let (mn, mx) = (self.zeros(4 * rows, OP)?, self.zeros(4 * rows, OP)?);
        let args = [A::P(&dx), A::U(x.len() as u64), A::U(cols as u64), A::P(&mn), A::P(&mx)];
        self.run(KernelSpec::RowMinMax, &args, OP)?;
        Ok((f32_from_bytes(&self.down(&mn, 4 * rows, OP)?), f32_from_bytes(&self.down(&mx, 4 * rows, OP)?)))
    }

    fn tensor_min_max(&self, mins: &[f32], maxs: &[f32]) -> Result<[f32; 3], CommError> {
        const OP: &str = "tensor min/max";
        let (a, b, out) = (self.up(mins, OP)?, self.up(maxs, OP)?, self.zeros(12, OP)?);
        self.run(KernelSpec::TensorMinMax, &[A::P(&a), A::P(&b), A::U(mins.len() as u64), A::P(&out)], OP)?;
        let v = f32_from_bytes(&self.down(&out, 12, OP)?);
        Ok([v[0], v[1], v[2]])
    }

    fn sym_scales(&self, mins: &[f32], maxs: &[f32], bits: QBits) -> Result<Vec<f32>, CommError> {
        const OP: &str = "quantization scales";
        let g = mins.len();
        let (a, b) = (self.up(mins, OP)?, self.up(maxs, OP)?);
        let (s, z) = (self.zeros(4 * g, OP)?, self.zeros(4 * g, OP)?);
        let spec = KernelSpec::QuantParams { bits, symmetric: true };
        self.run(spec, &[A::P(&a), A::P(&b), A::U(g as u64), A::P(&s), A::P(&z)], OP)?;
        Ok(f32_from_bytes(&self.down(&s, 4 * g, OP)?))
    }

    fn quantize(
        &self,
        x: &[f32],
        scales: &[f32],
        group: usize,
        bits: QBits,
        rounding: Rounding,
        seed: u64,
    ) -> Result<Vec<u8>, CommError> {
        const OP: &str = "quantize";
        check_quantize(x.len(), scales.len(), group)?;
        let n = x.len() as u64;
        let (dx, ds) = (self.up(x, OP)?, self.up(scales, OP)?);
        match bits {
            QBits::Int8 => {
                let zp = self.zeros(4 * scales.len(), OP)?;
                let q = self.zeros(x.len(), OP)?;
                let spec = KernelSpec::QuantizeInt8 { symmetric: true, rounding };
                let args = [A::P(&dx), A::P(&ds), A::P(&zp), A::U(n), A::U(group as u64), A::U(seed), A::P(&q)];
                self.run(spec, &args, OP)?;
                self.down(&q, x.len(), OP)
            }
            QBits::Int4 => {
                let len = x.len().div_ceil(2);
                let q = self.zeros(len, OP)?;
                let args = [A::P(&dx), A::P(&ds), A::U(n), A::U(group as u64), A::U(seed), A::P(&q)];
                self.run(KernelSpec::QuantizeInt4 { rounding }, &args, OP)?;
                self.down(&q, len, OP)
            }
        }
    }

    fn dequant_accumulate(
        &self,
        codes: &[u8],
        scales: &[f32],
        n: usize,
        group: usize,
        k: usize,
        bits: QBits,
        out: &mut [f32],
    ) -> Result<(), CommError> {
        const OP: &str = "dequantize-accumulate";
        check_dequant_accumulate(codes.len(), scales.len(), n, group, k, bits, out.len())?;
        let (dq, ds, acc) = (self.up(codes, OP)?, self.up(scales, OP)?, self.up(out, OP)?);
        let args = [A::P(&dq), A::P(&ds), A::U(n as u64), A::U(group as u64), A::U(k as u64), A::P(&acc)];
        self.run(KernelSpec::DequantAccumulate { bits }, &args, OP)?;
        // SAFETY: f32s viewed as their (little-endian, as uploaded) bytes;
        // every bit pattern is a valid f32.
        let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), 4 * out.len()) };
        self.down_into(&acc, bytes, OP)
    }

    fn cast_to(&self, h: Half, x: &[f32]) -> Result<Vec<u16>, CommError> {
        const OP: &str = "cast";
        let (dx, out) = (self.up(x, OP)?, self.zeros(2 * x.len(), OP)?);
        self.run(KernelSpec::CastTo(h), &[A::P(&dx), A::P(&out), A::U(x.len() as u64)], OP)?;
        Ok(u16_from_bytes(&self.down(&out, 2 * x.len(), OP)?))
    }

    fn cast_from(&self, h: Half, x: &[u16]) -> Result<Vec<f32>, CommError> {
        const OP: &str = "cast";
        let (dx, out) = (self.up(x, OP)?, self.zeros(4 * x.len(), OP)?);
        self.run(KernelSpec::CastFrom(h), &[A::P(&dx), A::P(&out), A::U(x.len() as u64)], OP)?;
        Ok(f32_from_bytes(&self.down(&out, 4 * x.len(), OP)?))
    }

    fn pack(&self, x: &[f32], mn: f32, mx: f32, bits: u8, rounding: Rounding, seed: u64) -> Result<Vec<u8>, CommError> {
        const OP: &str = "pack";
        let len = packed_len(x.len(), bits);
        let (dx, range, out) = (self.up(x, OP)?, self.up(&[mn, mx], OP)?, self.zeros(len, OP)?);
        let args = [A::P(&dx), A::P(&range), A::U(x.len() as u64), A::U(seed), A::P(&out)];
        self.run(KernelSpec::PackBits { bits, rounding }, &args, OP)?;
        self.down(&out, len, OP)
    }

    fn unpack(&self, buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, DecodeError> {
        const OP: &str = "unpack";
        // The kernel trusts its input: the header is checked here, as the
        // reference unpacker checks it.
        unpack_header(buf, n, bits).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        let (db, out) = (self.up(buf, OP)?, self.zeros(4 * n, OP)?);
        self.run(KernelSpec::UnpackBits { bits }, &[A::P(&db), A::U(n as u64), A::P(&out)], OP)?;
        Ok(f32_from_bytes(&self.down(&out, 4 * n, OP)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(r: Result<(), CommError>) -> String {
        match r {
            Err(CommError::InvalidArgument { detail, .. }) => detail,
            other => panic!("expected an invalid-argument error, got {other:?}"),
        }
    }

    #[test]
    fn quantize_lengths_are_checked_before_the_launch() {
        assert!(check_quantize(1000, 2, 512).is_ok());
        assert!(check_quantize(0, 0, 512).is_ok());
        assert_eq!(detail(check_quantize(1025, 2, 512)), "2 scales for 1025 values in 3 groups of 512");
        assert_eq!(detail(check_quantize(10, 1, 0)), "quantization group size 0");
    }

    #[test]
    fn dequant_accumulate_lengths_are_checked_before_the_launch() {
        // Three int4 chunks of 5 values: 3 bytes and 1 scale each.
        assert!(check_dequant_accumulate(9, 3, 5, 8, 3, QBits::Int4, 5).is_ok());
        assert_eq!(detail(check_dequant_accumulate(8, 3, 5, 8, 3, QBits::Int4, 5)), "8 code bytes for 3 chunks of 3");
        assert_eq!(
            detail(check_dequant_accumulate(15, 2, 5, 8, 3, QBits::Int8, 5)),
            "2 scales for 3 chunks of 1 groups"
        );
        assert_eq!(detail(check_dequant_accumulate(15, 3, 5, 8, 3, QBits::Int8, 4)), "5 values into 4 accumulators");
        assert_eq!(detail(check_dequant_accumulate(15, 3, 5, 0, 3, QBits::Int8, 5)), "quantization group size 0");
        assert!(check_dequant_accumulate(0, 0, usize::MAX, 1, 3, QBits::Int8, 0).is_err());
    }
}
