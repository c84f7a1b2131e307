//! Shard layout and the quantized block, qgZ's unit on the wire.
//!
//! A gradient of `n` elements is cut into `P` shards, the first `n mod P`
//! one element longer ([`shards`]), so any `n` works. Each shard is
//! quantized on its own, in groups of `group` elements starting at the
//! shard's first element (the last group may be short), so a shard's bytes
//! never depend on its neighbours.
//!
//! Block layout: `[scale f32 LE × ceil(m/group)][codes]`, codes being `m`
//! int8 bytes or `ceil(m/2)` int4 bytes (low nibble first). The arithmetic is
//! `qsync-kernels`' (symmetric scales `absmax/qmax`, quantize,
//! dequantize-and-accumulate by `fma` in f32), run by a
//! [`KernelEngine`]: the reference on the CPU or our PTX on a GPU, equal bit
//! for bit.
//!
//! Non-finite values: a group holding a NaN or an infinity travels with a
//! NaN scale, so every element of that group is NaN in every rank's sum — an
//! overflow check (a loss scaler's) sees it, whatever the other ranks sent.

use std::ops::Range;

use qsync_kernels::{QBits, Rounding};

use crate::engine::{accumulate_blocks, lay_out_block, DecodeError, KernelEngine};
use crate::error::CommError;

/// The `p` shards of `n` elements: near-equal, the first `n mod p` longer.
pub fn shards(n: usize, p: usize) -> Vec<Range<usize>> {
    let p = p.max(1);
    let (base, extra) = (n / p, n % p);
    let mut at = 0;
    (0..p)
        .map(|r| {
            let len = base + usize::from(r < extra);
            at += len;
            at - len..at
        })
        .collect()
}

/// Groups in a slice of `m` elements.
pub fn groups(m: usize, group: usize) -> usize {
    m.div_ceil(group.max(1))
}

/// Code bytes of `m` elements.
pub fn code_bytes(m: usize, bits: QBits) -> usize {
    match bits {
        QBits::Int8 => m,
        QBits::Int4 => m.div_ceil(2),
    }
}

/// Bytes of the block of a slice of `m` elements.
pub fn block_len(m: usize, bits: QBits, group: usize) -> usize {
    4 * groups(m, group) + code_bytes(m, bits)
}

/// One quantization stage's parameters.
#[derive(Copy, Clone, Debug)]
pub struct Quantizer {
    pub bits: QBits,
    pub group: usize,
    pub rounding: Rounding,
}

impl Quantizer {
    pub fn block_len(&self, m: usize) -> usize {
        block_len(m, self.bits, self.group)
    }

    /// Appends the block of `x` to `out`. With `residual` (error feedback),
    /// writes `x − dequant(block)` there (0 where that is not finite).
    pub fn encode(
        &self,
        eng: &dyn KernelEngine,
        x: &[f32],
        seed: u64,
        out: &mut Vec<u8>,
        residual: Option<&mut [f32]>,
    ) -> Result<(), CommError> {
        let g = self.group.max(1);
        let Some(res) = residual else {
            // No error feedback: the engine's block encoder, in place.
            let at = out.len();
            out.resize(at + self.block_len(x.len()), 0);
            return eng.encode_block(x, g, self.bits, self.rounding, seed, &mut out[at..]);
        };
        let (mins, maxs) = eng.row_min_max(x, g)?;
        let scales = eng.sym_scales(&mins, &maxs, self.bits)?;
        let codes = eng.quantize(x, &scales, g, self.bits, self.rounding, seed)?;
        let mut deq = vec![0f32; x.len()];
        eng.dequant_accumulate(&codes, &scales, x.len(), g, 1, self.bits, &mut deq)?;
        for ((r, &v), d) in res.iter_mut().zip(x).zip(deq) {
            let e = v - d;
            *r = if e.is_finite() { e } else { 0.0 };
        }
        // A group holding a NaN or an infinity sends a NaN scale.
        let at = out.len();
        out.resize(at + self.block_len(x.len()), 0);
        lay_out_block(x, g, self.bits, &scales, &codes, &mut out[at..])
    }

    /// `out[i] += Σ_j dequant(blocks[j])[i]` in block order (the kernels'
    /// `dequant_accumulate`). Every block must hold `out.len()` elements.
    pub fn accumulate(&self, eng: &dyn KernelEngine, blocks: &[&[u8]], out: &mut [f32]) -> Result<(), DecodeError> {
        accumulate_blocks(eng, blocks, self.group, self.bits, out)
    }

    /// `out[i] = (Σ_j dequant(blocks[j])[i]) / div`, in block order from 0
    /// (no division when `div` is 1): bit for bit a zeroed sum, an
    /// [`Quantizer::accumulate`] and a division, in one pass over `out` on
    /// the host engines ([`KernelEngine::dequant_mean`]). Every block must
    /// hold `out.len()` elements.
    pub fn decode_mean(
        &self,
        eng: &dyn KernelEngine,
        blocks: &[&[u8]],
        div: f32,
        out: &mut [f32],
    ) -> Result<(), DecodeError> {
        eng.dequant_mean(blocks, self.group.max(1), self.bits, div, out)
    }

    /// Writes the values `block` stands for into `out` (`out.len()` of them).
    pub fn decode_into(&self, eng: &dyn KernelEngine, block: &[u8], out: &mut [f32]) -> Result<(), DecodeError> {
        self.decode_mean(eng, &[block], 1.0, out)
    }

    /// The values one block stands for.
    pub fn decode(&self, eng: &dyn KernelEngine, block: &[u8], m: usize) -> Result<Vec<f32>, DecodeError> {
        let mut out = vec![0f32; m];
        self.decode_into(eng, block, &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::HostEngine;

    #[test]
    fn shards_cover_every_size() {
        for n in [0, 1, 7, 8, 9, 1000] {
            for p in [1, 3, 4, 8] {
                let s = shards(n, p);
                assert_eq!(s.len(), p);
                assert_eq!(s[0].start, 0);
                assert_eq!(s[p - 1].end, n);
                assert!(s.windows(2).all(|w| w[0].end == w[1].start && w[0].len() >= w[1].len()));
                assert!(s[0].len() - s[p - 1].len() <= 1);
            }
        }
    }

    #[test]
    fn block_round_trip_error_is_half_a_step() {
        let x: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        for bits in [QBits::Int8, QBits::Int4] {
            let q = Quantizer { bits, group: 64, rounding: Rounding::Nearest };
            let mut block = Vec::new();
            let mut res = vec![0f32; x.len()];
            q.encode(&HostEngine, &x, 1, &mut block, Some(&mut res)).expect("encode");
            assert_eq!(block.len(), q.block_len(x.len()));
            let y = q.decode(&HostEngine, &block, x.len()).expect("decode");
            for (g, (xs, ys)) in x.chunks(64).zip(y.chunks(64)).enumerate() {
                let step = xs.iter().fold(0f32, |a, v| a.max(v.abs())) / bits_qmax(bits);
                for (i, (a, b)) in xs.iter().zip(ys).enumerate() {
                    assert!((a - b).abs() <= step * 0.5001, "group {g} element {i}: {a} vs {b}");
                    assert_eq!(res[g * 64 + i], a - b);
                }
            }
        }
    }

    fn bits_qmax(b: QBits) -> f32 {
        b.qmax() as f32
    }

    #[test]
    fn non_finite_group_decodes_to_nan() {
        let mut x = vec![0.5f32; 10];
        x[7] = f32::INFINITY;
        let q = Quantizer { bits: QBits::Int8, group: 4, rounding: Rounding::Nearest };
        let mut block = Vec::new();
        q.encode(&HostEngine, &x, 0, &mut block, None).expect("encode");
        let y = q.decode(&HostEngine, &block, 10).expect("decode");
        assert!(y[..4].iter().all(|v| *v == 0.5));
        assert!(y[4..8].iter().all(|v| v.is_nan()));
        assert!(y[8..].iter().all(|v| *v == 0.5));
        assert!(matches!(q.decode(&HostEngine, &block[1..], 10), Err(DecodeError::Malformed(_))));
    }
}
