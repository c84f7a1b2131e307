//! FP16 / BF16 compressed all-reduce (PyTorch's `fp16_compress_hook` /
//! `bf16_compress_hook` semantics: the gradient is divided by the world size
//! before it is cast, so the sum cannot overflow where the mean would not).
//!
//! Algorithm: `h_r = fl16(x_r / P)`; a reduce-scatter of 16-bit shards by
//! all-to-all; the shard owner sums `Σ_r f32(h_r)` in f32 in rank order and
//! rounds once to 16 bits; an all-gather of the 16-bit shards. It runs as a
//! pipeline of pieces of every shard ([`super::pipeline`]): the same
//! operations per element, so the same bits. Wire bytes
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
