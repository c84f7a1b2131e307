//! TernGrad / HiPress min/max n-bit compression (`b` ∈ {1, 2, 4, 8}),
//! all-gathered and reduced in f32.
//!
//! Each rank packs its whole gradient with the kernels' `pack`: header
//! `[bits u8][tail u8][min f32][max f32]`, then codes `round((x − min)/gap)`,
//! `gap = (max − min)/(2^b − 1)`, `8/b` per byte. The packed buffers are
//! all-gathered; every rank unpacks all `P` (`fma(code, gap, min)`) and sums
//! them in rank order in f32, then divides by `P` — on the host in one pass
//! over the sum (`KernelEngine::unpack_mean`: a cache-sized slice at a
//! time, every buffer added into it, then divided). A rank whose gradient
//! holds a NaN or infinity sends a NaN minimum, so the whole result is NaN on
//! every rank.
//!
//! Wire bytes per rank: `(P−1)·(10 + ⌈n·b/8⌉)` — a fraction `P·b/64` of an
//! f32 ring all-reduce, growing with `P` because an all-gather delivers every
//! rank's packed gradient to every rank. A reduce-scatter form (all-to-all of
//! packed shards, reduce, repack, all-gather) would move `2·(P−1)/P·n·b/8`,
//! the fraction `b/16`, independent of `P`: it moves fewer bytes as soon as
//! `P > 4` (equal at 4), at the price of a second quantization.
//!
//! Error bound (per element; `gap_r` of rank `r`'s range, `k = 1/2` for
//! round-to-nearest, `1` for stochastic rounding, `ε` = 2^-24):
//!
//! ```text
//! |result − mean| ≤ (1/P)·Σ_r [ gap_r·(k + 2^-10) + (|min_r| + |max_r|)·2^-21 ]
//!                   + (P+1)·ε·(1/P)·Σ_r max(|min_r|, |max_r|) + |mean|·ε
//! ```
//!
//! (the `2^-10` and `2^-21` terms cover the f32 evaluation of the code and
//! of `fma(code, gap, min)`). One range per tensor makes the gap — and the
//! error — proportional to the tensor's full range, so outliers cost every
//! element; that is the scheme, faithfully.

use std::time::Instant;

use qsync_kernels::Rounding;

use super::{GradSync, Hop, Phase};
use crate::engine::{DecodeError, KernelEngine};
use crate::error::{CommError, SyncError};

const STAGE_PACK: u64 = 4;

/// What a rank sends: `x` packed over its range at `bits`, with a NaN
/// minimum when `x` holds a NaN or an infinity (a pass for the range and
/// finiteness, one to pack). `qsyncc host-kernels` times this.
pub fn encode(
    eng: &dyn KernelEngine,
    x: &[f32],
    bits: u8,
    rounding: Rounding,
    seed: u64,
) -> Result<Vec<u8>, CommError> {
    let (mn, mx, finite) = eng.range_finite(x)?;
    eng.pack(x, if finite { mn } else { f32::NAN }, mx, bits, rounding, seed)
}

/// The passes over a sum besides decoding where they run one after the
/// other over all of it: zeroed before the `P` accumulates, divided by `P`
/// after (an engine without a one-pass decoder, and qgZ's shard sums;
/// `qsyncc host-kernels` times them).
pub fn zero(sum: &mut [f32]) {
    sum.fill(0.0);
}

/// See [`zero`].
pub fn divide(sum: &mut [f32], p: usize) {
    let pf = p as f32;
    sum.iter_mut().for_each(|g| *g /= pf);
}

impl GradSync<'_> {
    pub(super) fn nbit_all_reduce(&mut self, grad: &mut [f32], bits: u8) -> Result<(), SyncError> {
        let eng = self.engine.clone();
        let p = self.world().size();
        let n = grad.len();
        let t = Instant::now();
        let x = self.with_residual("nbit", grad);
        let seed = self.seed(STAGE_PACK, 0);
        let packed = encode(&*eng, &x, bits, self.cfg.scheme.rounding, seed)?;
        let me = self.world().rank();
        let unpack = |s: &Self, buf: &[u8], peer: usize| eng.unpack(buf, n, bits).map_err(|e| s.decode_error(peer, e));
        let own = if self.cfg.scheme.error_feedback { Some(unpack(self, &packed, me)?) } else { None };
        if let (Some(own), Some(r)) = (own, self.residual_mut("nbit")) {
            for ((r, &v), d) in r.iter_mut().zip(x.iter()).zip(own) {
                let e = v - d;
                *r = if e.is_finite() { e } else { 0.0 };
            }
        }
        drop(x);
        let len = packed.len();
        self.charge(Phase::Quantize, t);
        let t = Instant::now();
        let all = self.world().start_all_gather_v(packed, &vec![len; p], self.deadline())?.wait(self.deadline())?;
        self.charge(Phase::Exchange, t);
        self.count(Hop::World, &vec![len; p]);
        let t = Instant::now();
        // Summed in place: the gradient's own buffer is the accumulator (a
        // fresh one the size of the gradient would cost its page faults at
        // every call). Every buffer is checked first, so an error names
        // the rank that sent it.
        if all.len() != p * len {
            let detail = format!("the all-gather returned {} bytes, {p} buffers of {len} expected", all.len());
            return Err(SyncError::BadPayload { rank: me, peer: p, detail });
        }
        let bufs: Vec<&[u8]> = all.chunks(len).collect();
        for (j, b) in bufs.iter().enumerate() {
            qsync_kernels::reference::unpack_header(b, n, bits)
                .map_err(|e| self.decode_error(j, DecodeError::Malformed(e.to_string())))?;
        }
        eng.unpack_mean(&bufs, n, bits, p as f32, grad).map_err(|e| self.decode_error(p, e))?;
        drop(bufs);
        self.world().recycle(all);
        self.charge(Phase::Dequantize, t);
        Ok(())
    }
}
