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

    fn pack(&self, x: &[f32], mn: f32, mx: f32, bits: u8, rounding: Rounding, seed: u64) -> Result<Vec<u8>, CommError> {
        Ok(cpu::pack(x, mn, mx, bits, rounding, seed))
    }

    fn unpack(&self, buf: &[u8], n: usize, bits: u8) -> Result<Vec<f32>, DecodeError> {
        cpu::unpack(buf, n, bits).map_err(|e| DecodeError::Malformed(e.to_string()))
    }

    fn unpack_accumulate(&self, buf: &[u8], n: usize, bits: u8, out: &mut [f32]) -> Result<(), DecodeError> {
        if out.len() < n {
            return Err(DecodeError::Malformed(format!("{n} values into {} accumulators", out.len())));
        }
        cpu::unpack_accumulate(buf, n, bits, out).map_err(|e| DecodeError::Malformed(e.to_string()))
    }
}

/// Little-endian 16-bit words of `bytes` (an even count).
fn le16(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
}
