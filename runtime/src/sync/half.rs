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

use qsync_kernels::{reference, Half};

use super::block::shards;
use super::{GradSync, Hop};
use crate::error::SyncError;

/// Narrowing and widening conversions of one 16-bit format.
type Converters = (fn(f32) -> u16, fn(u16) -> f32);

fn converters(h: Half) -> Converters {
    match h {
        Half::F16 => (reference::f32_to_f16, reference::f16_to_f32),
        Half::BF16 => (reference::f32_to_bf16, reference::bf16_to_f32),
    }
}

fn to_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read16(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

impl GradSync<'_> {
    pub(super) fn half_all_reduce(&mut self, grad: &mut [f32], h: Half) -> Result<(), SyncError> {
        let (to, from) = converters(h);
        let p = self.world().size();
        let me = self.world().rank();
        let pf = p as f32;
        let scaled: Vec<f32> = grad.iter().map(|v| v / pf).collect();
        let x = self.with_residual("half", &scaled);
        let h16: Vec<u16> = x.iter().map(|&v| to(v)).collect();
        if let Some(r) = self.residual_mut("half") {
            for ((r, &v), &c) in r.iter_mut().zip(&x).zip(&h16) {
                let e = v - from(c);
                *r = if e.is_finite() { e } else { 0.0 };
            }
        }
        let sh = shards(grad.len(), p);
        let send_counts: Vec<usize> = sh.iter().map(|s| 2 * s.len()).collect();
        let mine = sh[me].len();
        let recv_counts = vec![2 * mine; p];
        let mut recv = vec![0u8; 2 * mine * p];
        self.world().all_to_all_v(&to_bytes(&h16), &send_counts, &mut recv, &recv_counts, self.deadline())?;
        self.count(Hop::World, &recv_counts);
        let sums: Vec<f32> = (0..mine)
            .map(|i| {
                let mut acc = 0f32;
                for r in 0..p {
                    acc += from(read16(&recv[2 * mine * r..], i));
                }
                acc
            })
            .collect();
        // The owner's rounding of the sum is a second quantization site.
        let sums = self.with_residual("half-owner", &sums);
        let reduced: Vec<u16> = sums.iter().map(|&v| to(v)).collect();
        if let Some(r) = self.residual_mut("half-owner") {
            for ((r, &v), &c) in r.iter_mut().zip(&sums).zip(&reduced) {
                let e = v - from(c);
                *r = if e.is_finite() { e } else { 0.0 };
            }
        }
        let mut all = vec![0u8; 2 * grad.len()];
        self.world().all_gather_v(&to_bytes(&reduced), &mut all, &send_counts, self.deadline())?;
        self.count(Hop::World, &send_counts);
        for (i, v) in grad.iter_mut().enumerate() {
            *v = from(read16(&all, i));
        }
        Ok(())
    }
}
