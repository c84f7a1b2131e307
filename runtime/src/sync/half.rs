//! FP16 / BF16 compressed all-reduce (PyTorch's `fp16_compress_hook` /
//! `bf16_compress_hook` semantics: the gradient is divided by the world size
//! before it is cast, so the sum cannot overflow where the mean would not).
//!
//! Algorithm: `h_r = fl16(x_r / P)`; a reduce-scatter of 16-bit shards by
//! all-to-all; the shard owner sums `Σ_r f32(h_r)` in f32 in rank order and
//! rounds once to 16 bits; an all-gather of the 16-bit shards. Wire bytes
//! per rank: `2·(2M/4)·(P−1)/P` — half of an f32 ring all-reduce of `M`
//! bytes. Unlike NCCL's in-network 16-bit sum, the accumulation is f32 and
//! ordered, so ranks and backends agree bit for bit.
//!
//! Error bound (per element, `u` = 2^-11 for f16 and 2^-8 for bf16, `η` =
//! half the smallest subnormal: 2^-25 for f16, 2^-134 for bf16, `ε` = 2^-24):
//!
//! ```text
//! E1 = Σ_r ( |x_r|/P · (u + ε) + η )          casting each rank's share
//! E2 = (P+1)·ε · Σ_r |x_r|/P · (1 + u)         f32 accumulation
//! |result − mean| ≤ E1 + E2 + (|mean| + E1 + E2)·u + η
//! ```
//!
//! valid while no `|x_r|/P` nor the sum exceeds the format's range (f16:
//! 65504 — beyond it the result is ±inf, which is what a loss scaler's
//! overflow check exists to catch).

use qsync_kernels::Half;

use super::block::shards;
use super::{u16_bytes, u16_from_bytes, GradSync, Hop};
use crate::error::SyncError;

impl GradSync<'_> {
    pub(super) fn half_all_reduce(&mut self, grad: &mut [f32], h: Half) -> Result<(), SyncError> {
        let eng = self.engine.clone();
        let p = self.world().size();
        let me = self.world().rank();
        let pf = p as f32;
        let scaled: Vec<f32> = grad.iter().map(|v| v / pf).collect();
        let x = self.with_residual("half", &scaled);
        let h16 = eng.cast_to(h, &x)?;
        if let Some(r) = self.residual_mut("half") {
            let back = eng.cast_from(h, &h16)?;
            for ((r, &v), d) in r.iter_mut().zip(x.iter()).zip(back) {
                let e = v - d;
                *r = if e.is_finite() { e } else { 0.0 };
            }
        }
        let sh = shards(grad.len(), p);
        let send_counts: Vec<usize> = sh.iter().map(|s| 2 * s.len()).collect();
        let mine = sh[me].len();
        let recv_counts = vec![2 * mine; p];
        let mut recv = vec![0u8; 2 * mine * p];
        self.world().all_to_all_v(&u16_bytes(&h16), &send_counts, &mut recv, &recv_counts, self.deadline())?;
        self.count(Hop::World, &recv_counts);
        // Widening is exact; the sum runs in rank order, in f32.
        let wide = eng.cast_from(h, &u16_from_bytes(&recv))?;
        let mut sums = vec![0f32; mine];
        for r in 0..p {
            sums.iter_mut().zip(&wide[r * mine..(r + 1) * mine]).for_each(|(a, v)| *a += v);
        }
        // The owner's rounding of the sum is a second quantization site.
        let sums = self.with_residual("half-owner", &sums);
        let reduced = eng.cast_to(h, &sums)?;
        if let Some(r) = self.residual_mut("half-owner") {
            let back = eng.cast_from(h, &reduced)?;
            for ((r, &v), d) in r.iter_mut().zip(sums.iter()).zip(back) {
                let e = v - d;
                *r = if e.is_finite() { e } else { 0.0 };
            }
        }
        let mut all = vec![0u8; 2 * grad.len()];
        self.world().all_gather_v(&u16_bytes(&reduced), &mut all, &send_counts, self.deadline())?;
        self.count(Hop::World, &send_counts);
        grad.copy_from_slice(&eng.cast_from(h, &u16_from_bytes(&all))?);
        Ok(())
    }
}
