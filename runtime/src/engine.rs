//! Where the schemes' element-wise kernels run: [`KernelEngine`].
//!
//! Every scheme of [`crate::GradSync`] reduces, quantizes, packs and casts
//! through one engine, so the arithmetic has one definition — the kernels
//! of `qsync-kernels` — and two places to run:
//! - [`HostEngine`] (the default): the kernels on the CPU
//!   (`qsync_kernels::cpu`, held bit for bit to `qsync_kernels::reference`);
//! - `CudaEngine` (feature `nccl`, [`crate::cuda`]): the same kernels as
//!   our PTX (`qsyncc codegen --all-kernels`), loaded and launched with the
//!   CUDA driver through cudarc.
//!
//! The PTX kernels equal the reference bit for bit (the GPU check holds them
//! to it, stochastic rounding included: its generator is counter-based), so
//! a synchronization gives the same bytes on either engine, and an NCCL job
//! quantizing on the GPU can be checked against an MPI job quantizing on the
//! CPU digest for digest.
//!
//! Buffers are host slices on both engines: the device engine stages them
//! through device memory around each launch.

use qsync_kernels::{cpu, reference, Half, QBits, Rounding};

use crate::error::CommError;
use crate::sync::block;

/// Why received bytes could not be decoded.
#[derive(Debug)]
pub enum DecodeError {
    /// The bytes do not fit what they should hold (a peer ran another
    /// scheme or gradient size): a payload error.
    Malformed(String),
    /// The kernel engine failed.
    Engine(CommError),
}

impl From<CommError> for DecodeError {
    fn from(e: CommError) -> Self {
        DecodeError::Engine(e)
    }
}

/// Which engine a [`crate::SyncConfig`] asks for.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Kernels {
    /// The reference kernels on the CPU.
    #[default]
    Host,
    /// Our PTX kernels on the communicator's GPU (an NCCL communicator).
    Device,
}

impl std::str::FromStr for Kernels {
    type Err = String;
    fn from_str(s: &str) -> Result<Kernels, String> {
        match s {
            "host" => Ok(Kernels::Host),
            "device" => Ok(Kernels::Device),
            _ => Err(format!("unknown kernels `{s}` (host, device)")),
        }
    }
}

/// The element-wise kernels the schemes use, with the meaning of
/// `qsync_kernels::reference` (see each function there).
pub trait KernelEngine: std::fmt::Debug + Send + Sync {
    /// `"host"` or `"cuda"`, for messages.
    fn name(&self) -> &'static str;
    /// Min and max of each row of `cols` (NaN ignored).
    fn row_min_max(&self, x: &[f32], cols: usize) -> Result<(Vec<f32>, Vec<f32>), CommError>;
    /// `[min, max, absmax]` of the row results.
    fn tensor_min_max(&self, mins: &[f32], maxs: &[f32]) -> Result<[f32; 3], CommError>;
    /// Symmetric scales per group from its min and max.
    fn sym_scales(&self, mins: &[f32], maxs: &[f32], bits: QBits) -> Result<Vec<f32>, CommError>;
    /// Symmetric codes of `x` per group of `group`: `x.len()` int8 bytes, or
    /// `ceil(len/2)` int4 bytes (low nibble first).
    fn quantize(
        &self,
        x: &[f32],
        scales: &[f32],
        group: usize,
        bits: QBits,
        rounding: Rounding,
        seed: u64,
    ) -> Result<Vec<u8>, CommError>;
    /// `out[i] += Σ_j dequant(chunk_j)[i]` over `k` chunks of `n` elements.
    #[allow(clippy::too_many_arguments)]
    fn dequant_accumulate(
        &self,
        codes: &[u8],
        scales: &[f32],
        n: usize,
        group: usize,
        k: usize,
        bits: QBits,
        out: &mut [f32],
    ) -> Result<(), CommError>;
    /// `f32 → f16/bf16`, round to nearest even.
    fn cast_to(&self, h: Half, x: &[f32]) -> Result<Vec<u16>, CommError>;
    /// `f16/bf16 → f32` (exact).
    fn cast_from(&self, h: Half, x: &[u16]) -> Result<Vec<f32>, CommError>;
    /// `out = le_bytes(cast_to(x[i] / div))` (no division when `div` is 1),
    /// `out` being `2·x.len()` bytes: what the 16-bit schemes send. An
    /// engine with a fused kernel does it in one pass.
    fn cast_to_le(&self, h: Half, x: &[f32], div: f32, out: &mut [u8]) -> Result<(), CommError> {
        let scaled: Vec<f32> = if div == 1.0 { x.to_vec() } else { x.iter().map(|v| v / div).collect() };
        for (o, v) in out.chunks_exact_mut(2).zip(self.cast_to(h, &scaled)?) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }
    /// `out[i] = cast_from(le16(bytes))`.
    fn cast_from_le(&self, h: Half, bytes: &[u8], out: &mut [f32]) -> Result<(), CommError> {
        out.copy_from_slice(&self.cast_from(h, &le16(bytes))?);
        Ok(())
    }
    /// `out[i] += cast_from(le16(bytes))`.
    fn accumulate_le(&self, h: Half, bytes: &[u8], out: &mut [f32]) -> Result<(), CommError> {
        out.iter_mut().zip(self.cast_from(h, &le16(bytes))?).for_each(|(a, v)| *a += v);
        Ok(())
    }
    /// qgZ's block of `x` (see [`crate::sync::block`]) written into `out`:
    /// per group of `group` its symmetric scale as 4 little-endian bytes,
    /// NaN where the group holds a NaN or an infinity, then the codes.
    /// `out` holds `block_len(x.len(), bits, group)` bytes. An engine with
    /// a fused kernel makes one pass over `x`; this one composes the
    /// range, scale and quantize kernels and a finiteness check.
    fn encode_block(
        &self,
        x: &[f32],
        group: usize,
        bits: QBits,
        rounding: Rounding,
        seed: u64,
        out: &mut [u8],
    ) -> Result<(), CommError> {
        encode_block_composed(self, x, group, bits, rounding, seed, out)
    }
    /// The min and max of `x` as one row (`(inf, -inf)` when it holds no
    /// number) and whether every value of it is finite: n-bit's range. An
    /// engine with a fused kernel makes one pass.
    fn range_finite(&self, x: &[f32]) -> Result<(f32, f32, bool), CommError> {
        let (mins, maxs) = self.row_min_max(x, x.len().max(1))?;
        let [mn, mx, _] = self.tensor_min_max(&mins, &maxs)?;
        // A fold without an early exit: it vectorizes, where `all` scans
        // element by element.
        Ok((mn, mx, x.iter().fold(true, |ok, v| ok & v.is_finite())))
    }
    /// Min/max n-bit packing, header included.
    fn pack(&self, x: &[f32], mn: f32, mx: f32, bits: u8, rounding: Rounding, seed: u64) -> Result<Vec<u8>, CommError>;
    /// The values a packed buffer of `n` elements stands for.
    fn unpack(&self, buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, DecodeError>;
    /// `out[i] += unpack(buf, n, bits)[i]` (one f32 addition per element).
    fn unpack_accumulate(&self, buf: &[u8], n: usize, bits: u8, out: &mut [f32]) -> Result<(), DecodeError> {
        let vals = self.unpack(buf, n, bits)?;
        out.iter_mut().zip(vals).for_each(|(a, v)| *a += v);
        Ok(())
    }
    /// qgZ's decoding of `blocks` ([`crate::sync::block`]'s layout, each
    /// of `out.len()` elements): `out[i] = (Σ_j dequant(blocks[j])[i]) /
    /// div`, summed in block order starting from 0, no division when `div`
    /// is 1. A block of the wrong length is an error naming it. An engine
    /// with a fused kernel makes one pass over `out`; this one zeroes it,
    /// dequantize-accumulates each block in turn and divides.
    fn dequant_mean(
        &self,
        blocks: &[&[u8]],
        group: usize,
        bits: QBits,
        div: f32,
        out: &mut [f32],
    ) -> Result<(), DecodeError> {
        out.fill(0.0);
        accumulate_blocks(self, blocks, group, bits, out)?;
        if div != 1.0 {
            out.iter_mut().for_each(|v| *v /= div);
        }
        Ok(())
    }
    /// n-bit's decoding: `out[i] = (Σ_j unpack(bufs[j], n, bits)[i]) /
    /// div`, summed in buffer order starting from 0; `out` holds at least
    /// `n` values. An engine with a fused kernel makes one pass over `out`;
    /// this one zeroes it, accumulates each buffer in turn and divides.
    fn unpack_mean(&self, bufs: &[&[u8]], n: usize, bits: u8, div: f32, out: &mut [f32]) -> Result<(), DecodeError> {
        let out = accumulators(out, n)?;
        out.fill(0.0);
        for b in bufs {
            self.unpack_accumulate(b, n, bits, out)?;
        }
        out.iter_mut().for_each(|v| *v /= div);
        Ok(())
    }
}

/// `out[i] += Σ_j dequant(blocks[j])[i]` in block order, each block of
/// `out.len()` elements ([`crate::sync::block`]'s layout) checked first and
/// its scales read from its bytes: one `dequant_accumulate` a block, which
/// adds block after block element by element — the same sum as one call
/// over all of them, without copying every block's codes into one buffer.
pub fn accumulate_blocks<E: KernelEngine + ?Sized>(
    eng: &E,
    blocks: &[&[u8]],
    group: usize,
    bits: QBits,
    out: &mut [f32],
) -> Result<(), DecodeError> {
    let m = out.len();
    let (heads, codes) = split_blocks(blocks, m, group, bits)?;
    let mut scales = Vec::with_capacity(block::groups(m, group));
    for (head, codes) in heads.into_iter().zip(codes) {
        scales.clear();
        scales.extend(head.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        eng.dequant_accumulate(codes, &scales, m, group.max(1), 1, bits, out)?;
    }
    Ok(())
}

/// The scale bytes of every block, and the codes.
type SplitBlocks<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>);

/// Each block of `m` elements split into its scale bytes and its codes, or
/// the error naming the first block of the wrong length.
fn split_blocks<'a>(blocks: &[&'a [u8]], m: usize, group: usize, bits: QBits) -> Result<SplitBlocks<'a>, DecodeError> {
    let (ng, nc) = (block::groups(m, group), block::code_bytes(m, bits));
    let mut split = (Vec::with_capacity(blocks.len()), Vec::with_capacity(blocks.len()));
    for (j, b) in blocks.iter().enumerate() {
        if b.len() != 4 * ng + nc {
            let detail = format!("block {j} has {} bytes, {m} elements need {}", b.len(), 4 * ng + nc);
            return Err(DecodeError::Malformed(detail));
        }
        let (head, codes) = b.split_at(4 * ng);
        split.0.push(head);
        split.1.push(codes);
    }
    Ok(split)
}

/// The first `n` of `out`, or the error of a sum too short for them.
fn accumulators(out: &mut [f32], n: usize) -> Result<&mut [f32], DecodeError> {
    let len = out.len();
    out.get_mut(..n).ok_or_else(|| DecodeError::Malformed(format!("{n} values into {len} accumulators")))
}

/// The kernels on the CPU: `qsync_kernels::cpu` where it has a fast copy
/// (row min/max, quantize, dequantize-accumulate, casts, n-bit packing),
/// the reference elsewhere — bit for bit the reference either way. Never
/// fails.
#[derive(Copy, Clone, Debug, Default)]
pub struct HostEngine;

impl KernelEngine for HostEngine {
    fn name(&self) -> &'static str {
        "host"
    }

    fn row_min_max(&self, x: &[f32], cols: usize) -> Result<(Vec<f32>, Vec<f32>), CommError> {
        Ok(cpu::row_min_max(x, cols))
    }

    fn tensor_min_max(&self, mins: &[f32], maxs: &[f32]) -> Result<[f32; 3], CommError> {
        Ok(reference::tensor_min_max(mins, maxs))
    }

    fn sym_scales(&self, mins: &[f32], maxs: &[f32], bits: QBits) -> Result<Vec<f32>, CommError> {
        Ok(reference::quant_params_all(mins, maxs, bits, true).0)
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
        Ok(cpu::quantize_sym(x, scales, group, bits, rounding, seed))
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
        cpu::dequant_accumulate(codes, scales, n, group, k, bits, out);
        Ok(())
    }

    fn cast_to(&self, h: Half, x: &[f32]) -> Result<Vec<u16>, CommError> {
        Ok(cpu::cast_to(h, x))
    }

    fn cast_from(&self, h: Half, x: &[u16]) -> Result<Vec<f32>, CommError> {
        Ok(cpu::cast_from(h, x))
    }

    fn cast_to_le(&self, h: Half, x: &[f32], div: f32, out: &mut [u8]) -> Result<(), CommError> {
        cpu::cast_to_le(h, x, div, out);
        Ok(())
    }

    fn cast_from_le(&self, h: Half, bytes: &[u8], out: &mut [f32]) -> Result<(), CommError> {
        cpu::cast_from_le(h, bytes, out);
        Ok(())
    }

    fn accumulate_le(&self, h: Half, bytes: &[u8], out: &mut [f32]) -> Result<(), CommError> {
        cpu::accumulate_le(h, bytes, out);
        Ok(())
    }

    fn encode_block(
        &self,
        x: &[f32],
        group: usize,
        bits: QBits,
        rounding: Rounding,
        seed: u64,
        out: &mut [u8],
    ) -> Result<(), CommError> {
        let (head, codes) = block_parts(out, x.len(), group, bits)?;
        cpu::encode_block_sym(x, 0, group.max(1), bits, rounding, seed, head, codes);
        Ok(())
    }

    fn range_finite(&self, x: &[f32]) -> Result<(f32, f32, bool), CommError> {
        Ok(cpu::range_finite(x))
    }

    fn pack(&self, x: &[f32], mn: f32, mx: f32, bits: u8, rounding: Rounding, seed: u64) -> Result<Vec<u8>, CommError> {
        Ok(cpu::pack(x, mn, mx, bits, rounding, seed))
    }

    fn unpack(&self, buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, DecodeError> {
        cpu::unpack(buf, n, bits).map_err(|e| DecodeError::Malformed(e.to_string()))
    }

    fn unpack_accumulate(&self, buf: &[u8], n: usize, bits: u8, out: &mut [f32]) -> Result<(), DecodeError> {
        let out = accumulators(out, n)?;
        cpu::unpack_accumulate(buf, n, bits, out).map_err(|e| DecodeError::Malformed(e.to_string()))
    }

    fn unpack_mean(&self, bufs: &[&[u8]], n: usize, bits: u8, div: f32, out: &mut [f32]) -> Result<(), DecodeError> {
        let out = accumulators(out, n)?;
        cpu::unpack_mean(bufs, n, bits, div, 0, out).map_err(|e| DecodeError::Malformed(e.to_string()))
    }

    fn dequant_mean(
        &self,
        blocks: &[&[u8]],
        group: usize,
        bits: QBits,
        div: f32,
        out: &mut [f32],
    ) -> Result<(), DecodeError> {
        let (heads, codes) = split_blocks(blocks, out.len(), group, bits)?;
        cpu::dequant_mean(&heads, &codes, group.max(1), bits, div, 0, out);
        Ok(())
    }
}

/// qgZ's block of `x` made of the plain kernels one after the other
/// (range, scales, codes, then a finiteness check as the block is laid
/// out): [`KernelEngine::encode_block`]'s default, and what an engine's
/// fused kernel must equal.
pub fn encode_block_composed<E: KernelEngine + ?Sized>(
    eng: &E,
    x: &[f32],
    group: usize,
    bits: QBits,
    rounding: Rounding,
    seed: u64,
    out: &mut [u8],
) -> Result<(), CommError> {
    let g = group.max(1);
    let (mins, maxs) = eng.row_min_max(x, g)?;
    let scales = eng.sym_scales(&mins, &maxs, bits)?;
    let codes = eng.quantize(x, &scales, g, bits, rounding, seed)?;
    lay_out_block(x, g, bits, &scales, &codes, out)
}

/// Writes the block of `x` from its groups' `scales` and its `codes` into
/// `out`: each scale as 4 little-endian bytes, NaN for a group that holds a
/// NaN or an infinity, then the codes.
pub(crate) fn lay_out_block(
    x: &[f32],
    group: usize,
    bits: QBits,
    scales: &[f32],
    codes: &[u8],
    out: &mut [u8],
) -> Result<(), CommError> {
    let (head, tail) = block_parts(out, x.len(), group, bits)?;
    if codes.len() != tail.len() || scales.len() * 4 != head.len() {
        return Err(CommError::InvalidArgument {
            op: "encode_block",
            detail: format!(
                "{} scales and {} code bytes for {} elements in groups of {group}",
                scales.len(),
                codes.len(),
                x.len()
            ),
        });
    }
    // One pass that vectorizes answers for the whole buffer first; only a
    // buffer with a non-finite value is looked at group by group.
    let all_finite = x.iter().fold(true, |ok, v| ok & v.is_finite());
    for ((h, chunk), s) in head.chunks_exact_mut(4).zip(x.chunks(group.max(1))).zip(scales) {
        let s = if all_finite || chunk.iter().all(|v| v.is_finite()) { *s } else { f32::NAN };
        h.copy_from_slice(&s.to_le_bytes());
    }
    tail.copy_from_slice(codes);
    Ok(())
}

/// The scales and codes parts of the block of `n` elements, checked
/// against the block's length.
fn block_parts(out: &mut [u8], n: usize, group: usize, bits: QBits) -> Result<(&mut [u8], &mut [u8]), CommError> {
    let (head, len) = (4 * block::groups(n, group), block::block_len(n, bits, group));
    if out.len() != len {
        return Err(CommError::InvalidArgument {
            op: "encode_block",
            detail: format!("a block of {n} elements needs {len} bytes, the buffer holds {}", out.len()),
        });
    }
    Ok(out.split_at_mut(head))
}

/// Little-endian 16-bit words of `bytes` (an even count).
fn le16(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
}

/// Elements below which [`ThreadedHostEngine`] stays on the calling thread
/// (starting a thread costs tens of microseconds).
const THREADED_MIN: usize = 1 << 16;

/// [`HostEngine`]'s kernels split over threads, bit for bit the same: each
/// thread takes a contiguous range of elements that starts on a group
/// boundary (and on a byte of int4 codes), and every element is computed
/// exactly as on one thread — the same operations in the same order (a
/// dequantize-accumulate adds the chunks in their order). Stochastic
/// rounding and n-bit packing, whose random draws and bit streams run over
/// the whole buffer, stay on one thread (but for the block encoder, whose
/// ranges count their draws from the tensor's first element), as do
/// buffers under 64 Ki elements. For GPU buckets staged through the host ([`Kernels::Host`] on
/// an NCCL communicator), whose host cores are otherwise idle while the
/// GPU computes; a CPU rank's cores compute the backward pass, so it keeps
/// [`HostEngine`].
#[derive(Copy, Clone, Debug)]
pub struct ThreadedHostEngine {
    threads: usize,
}

impl ThreadedHostEngine {
    pub fn new(threads: usize) -> ThreadedHostEngine {
        ThreadedHostEngine { threads: threads.max(1) }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The threads for a GPU rank of `local_ranks` on its node:
    /// `$QSYNC_HOST_THREADS` when set, else the machine's cores shared
    /// among the node's ranks, at most 8.
    pub fn for_gpu_rank(local_ranks: usize) -> ThreadedHostEngine {
        let set = std::env::var("QSYNC_HOST_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ThreadedHostEngine::new(set.unwrap_or((cores / local_ranks.max(1)).clamp(1, 8)))
    }

    /// Contiguous ranges covering `0..n`, one a thread, each starting at a
    /// multiple of `align`.
    fn ranges(&self, n: usize, align: usize) -> Vec<std::ops::Range<usize>> {
        let align = align.max(1);
        let units = n.div_ceil(align);
        let t = if n < THREADED_MIN { 1 } else { self.threads.min(units).max(1) };
        let per = units.div_ceil(t).max(1) * align;
        (0..t).map(|i| (i * per).min(n)..((i + 1) * per).min(n)).filter(|r| !r.is_empty()).collect()
    }
}

/// `f(range, part)` for each range with its own part of `out` (the
/// range scaled by `per` items of `out` an element), the first on the
/// calling thread and the others on scoped threads.
fn each_part<T: Send>(
    ranges: &[std::ops::Range<usize>],
    out: &mut [T],
    per: usize,
    f: &(dyn Fn(std::ops::Range<usize>, &mut [T]) + Sync),
) {
    let mut parts = Vec::with_capacity(ranges.len());
    let mut rest = out;
    for r in ranges {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(r.len() * per);
        parts.push((r.clone(), part));
        rest = tail;
    }
    on_threads(parts, &|(r, part)| f(r, part));
}

/// `f(p)` for each of `parts`, the first on the calling thread and the
/// others on scoped threads; a panic in any is resumed here.
fn on_threads<P: Send>(parts: Vec<P>, f: &(dyn Fn(P) + Sync)) {
    std::thread::scope(|s| {
        let mut parts = parts.into_iter();
        let first = parts.next();
        let handles: Vec<_> = parts.map(|p| s.spawn(move || f(p))).collect();
        if let Some(p) = first {
            f(p);
        }
        for h in handles {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
}

/// `f(range)` for each range, results in order (the first on the calling
/// thread).
fn each_range<R: Send>(ranges: &[std::ops::Range<usize>], f: &(dyn Fn(std::ops::Range<usize>) -> R + Sync)) -> Vec<R> {
    if ranges.len() <= 1 {
        return ranges.iter().cloned().map(f).collect();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = ranges[1..].iter().cloned().map(|r| s.spawn(move || f(r))).collect();
        let mut out = vec![f(ranges[0].clone())];
        for h in handles {
            out.push(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
        out
    })
}

impl KernelEngine for ThreadedHostEngine {
    fn name(&self) -> &'static str {
        "host"
    }

    fn row_min_max(&self, x: &[f32], cols: usize) -> Result<(Vec<f32>, Vec<f32>), CommError> {
        if cols == 0 {
            return HostEngine.row_min_max(x, cols);
        }
        let parts = each_range(&self.ranges(x.len(), cols), &|r| cpu::row_min_max(&x[r], cols));
        let (mut mins, mut maxs) = (Vec::new(), Vec::new());
        for (a, b) in parts {
            mins.extend(a);
            maxs.extend(b);
        }
        Ok((mins, maxs))
    }

    fn tensor_min_max(&self, mins: &[f32], maxs: &[f32]) -> Result<[f32; 3], CommError> {
        HostEngine.tensor_min_max(mins, maxs)
    }

    fn sym_scales(&self, mins: &[f32], maxs: &[f32], bits: QBits) -> Result<Vec<f32>, CommError> {
        HostEngine.sym_scales(mins, maxs, bits)
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
        let group = group.max(1);
        if rounding == Rounding::Stochastic || scales.len() < x.len().div_ceil(group) {
            return HostEngine.quantize(x, scales, group, bits, rounding, seed);
        }
        let parts = each_range(&self.ranges(x.len(), 2 * group), &|r| {
            let s = &scales[r.start / group..r.end.div_ceil(group)];
            cpu::quantize_sym(&x[r], s, group, bits, rounding, seed)
        });
        Ok(parts.concat())
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
        let group = group.max(1);
        let groups = n.div_ceil(group);
        let chunk = match bits {
            QBits::Int8 => n,
            QBits::Int4 => n.div_ceil(2),
        };
        if out.len() < n || codes.len() < k * chunk || scales.len() < k * groups {
            return HostEngine.dequant_accumulate(codes, scales, n, group, k, bits, out);
        }
        let ranges = self.ranges(n, 2 * group);
        each_part(&ranges, &mut out[..n], 1, &|r, part| {
            for j in 0..k {
                let c = &codes[j * chunk..(j + 1) * chunk];
                let c = match bits {
                    QBits::Int8 => &c[r.clone()],
                    QBits::Int4 => &c[r.start / 2..r.end.div_ceil(2)],
                };
                let s = &scales[j * groups + r.start / group..j * groups + r.end.div_ceil(group)];
                cpu::dequant_accumulate(c, s, r.len(), group, 1, bits, part);
            }
        });
        Ok(())
    }

    fn cast_to(&self, h: Half, x: &[f32]) -> Result<Vec<u16>, CommError> {
        Ok(each_range(&self.ranges(x.len(), 1), &|r| cpu::cast_to(h, &x[r])).concat())
    }

    fn cast_from(&self, h: Half, x: &[u16]) -> Result<Vec<f32>, CommError> {
        Ok(each_range(&self.ranges(x.len(), 1), &|r| cpu::cast_from(h, &x[r])).concat())
    }

    fn cast_to_le(&self, h: Half, x: &[f32], div: f32, out: &mut [u8]) -> Result<(), CommError> {
        if out.len() != 2 * x.len() {
            return HostEngine.cast_to_le(h, x, div, out);
        }
        each_part(&self.ranges(x.len(), 1), out, 2, &|r, part| cpu::cast_to_le(h, &x[r], div, part));
        Ok(())
    }

    fn cast_from_le(&self, h: Half, bytes: &[u8], out: &mut [f32]) -> Result<(), CommError> {
        if bytes.len() != 2 * out.len() {
            return HostEngine.cast_from_le(h, bytes, out);
        }
        let ranges = self.ranges(out.len(), 1);
        each_part(&ranges, out, 1, &|r, part| cpu::cast_from_le(h, &bytes[2 * r.start..2 * r.end], part));
        Ok(())
    }

    fn accumulate_le(&self, h: Half, bytes: &[u8], out: &mut [f32]) -> Result<(), CommError> {
        if bytes.len() != 2 * out.len() {
            return HostEngine.accumulate_le(h, bytes, out);
        }
        let ranges = self.ranges(out.len(), 1);
        each_part(&ranges, out, 1, &|r, part| cpu::accumulate_le(h, &bytes[2 * r.start..2 * r.end], part));
        Ok(())
    }

    fn encode_block(
        &self,
        x: &[f32],
        group: usize,
        bits: QBits,
        rounding: Rounding,
        seed: u64,
        out: &mut [u8],
    ) -> Result<(), CommError> {
        let group = group.max(1);
        let (head, codes) = block_parts(out, x.len(), group, bits)?;
        // Ranges of whole pairs of groups: each writes its own run of
        // scales and of codes (whole bytes of int4 codes).
        let ranges = self.ranges(x.len(), 2 * group);
        let mut parts = Vec::with_capacity(ranges.len());
        let (mut heads, mut tails) = (head, codes);
        for r in &ranges {
            let (h, hs) = std::mem::take(&mut heads).split_at_mut(4 * block::groups(r.len(), group));
            let (c, cs) = std::mem::take(&mut tails).split_at_mut(block::code_bytes(r.len(), bits));
            parts.push((r.clone(), h, c));
            (heads, tails) = (hs, cs);
        }
        on_threads(parts, &|(r, h, c): (std::ops::Range<usize>, &mut [u8], &mut [u8])| {
            cpu::encode_block_sym(&x[r.clone()], r.start as u64, group, bits, rounding, seed, h, c)
        });
        Ok(())
    }

    fn range_finite(&self, x: &[f32]) -> Result<(f32, f32, bool), CommError> {
        HostEngine.range_finite(x)
    }

    fn pack(&self, x: &[f32], mn: f32, mx: f32, bits: u8, rounding: Rounding, seed: u64) -> Result<Vec<u8>, CommError> {
        HostEngine.pack(x, mn, mx, bits, rounding, seed)
    }

    fn unpack(&self, buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, DecodeError> {
        HostEngine.unpack(buf, n, bits)
    }

    fn unpack_accumulate(&self, buf: &[u8], n: usize, bits: u8, out: &mut [f32]) -> Result<(), DecodeError> {
        HostEngine.unpack_accumulate(buf, n, bits, out)
    }

    /// Ranges of whole slices (`cpu::dequant_slice`: whole groups, whole
    /// bytes of int4 codes), each summing every block's part of them.
    fn dequant_mean(
        &self,
        blocks: &[&[u8]],
        group: usize,
        bits: QBits,
        div: f32,
        out: &mut [f32],
    ) -> Result<(), DecodeError> {
        let group = group.max(1);
        let (heads, codes) = split_blocks(blocks, out.len(), group, bits)?;
        let ranges = self.ranges(out.len(), cpu::dequant_slice(group));
        each_part(&ranges, out, 1, &|r, part| cpu::dequant_mean(&heads, &codes, group, bits, div, r.start, part));
        Ok(())
    }

    /// Ranges of whole cache slices (`cpu::MEAN_BLOCK`, whole bytes of codes
    /// at every width), each decoding every buffer's codes of its elements.
    fn unpack_mean(&self, bufs: &[&[u8]], n: usize, bits: u8, div: f32, out: &mut [f32]) -> Result<(), DecodeError> {
        let out = accumulators(out, n)?;
        let failed = std::sync::Mutex::new(None);
        each_part(&self.ranges(n, cpu::MEAN_BLOCK), out, 1, &|r, part| {
            if let Err(e) = cpu::unpack_mean(bufs, n, bits, div, r.start, part) {
                if let Ok(mut f) = failed.lock() {
                    f.get_or_insert(e);
                }
            }
        });
        match failed.into_inner().ok().flatten() {
            Some(e) => Err(DecodeError::Malformed(e.to_string())),
            None => Ok(()),
        }
    }
}
