//! The flat schemes' all-reduce as a pipeline of pieces: the 16-bit
//! schemes and one-shot qgZ, bit for bit the same as their whole-tensor
//! forms ([`super::half`], [`super::qgz`]).
//!
//! Both are a reduce-scatter by all-to-all (every rank encodes each of the
//! `P` shards and sends shard `s` to rank `s`, which decodes and sums the
//! `P` encodings in rank order in f32) followed by an all-gather of the
//! re-encoded reduced shards. Here every shard is cut into `C` pieces of
//! [`SyncConfig::pipeline_chunk`](crate::SyncConfig) elements (the same cut
//! on every rank) and piece `c` of all shards travels as one exchange, so
//! while piece `c` is on the wire this rank encodes piece `c + 1`, and
//! reduces piece `c − LAG` and starts its all-gather, and decodes gathered
//! pieces — the kernels run while the link is busy, and the link never
//! waits for a whole tensor's kernels. The exchanges are the communicator's
//! non-blocking ones (pairwise point-to-point messages on MPI), started and
//! completed in the same fixed order on every rank. On an engine whose
//! exchanges block ([`Communicator::overlaps_transfers`] false: gloo
//! through Python, NCCL here) each shard is one piece: nothing would
//! overlap, and every piece would add a call's fixed cost.
//!
//! [`Communicator::overlaps_transfers`]: crate::Communicator::overlaps_transfers
//!
//! **Same bits.** Every kernel of these schemes is element-wise or per
//! quantization group, and pieces are cut at multiples of the group (and of
//! 2, so int4 codes never straddle a piece), starting at each shard's first
//! element as the whole-shard blocks do: every scale, code, sum (rank order)
//! and rounding is the one the whole-tensor form computes. Stochastic
//! rounding draws by index within a block, so with it a shard is one piece
//! (still pipelined across the all-gather). Wire bytes are the same too:
//! per piece the scales of its groups and its codes.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

use qsync_kernels::{Half, QBits, Rounding};

use super::block::{shards, Quantizer};
use super::{GradSync, Hop, Phase};
use crate::comm::Pending;
use crate::error::SyncError;

/// Pieces in flight in each of the two stages before the oldest is
/// completed: enough to keep the link busy while this rank runs kernels.
const LAG: usize = 2;

/// Residual names (shared with the whole-tensor forms).
const RES_HALF: &str = "half";
const RES_HALF_OWNER: &str = "half-owner";
const RES_FIRST: &str = "first";
const RES_GATHER: &str = "gather";

const STAGE_FIRST: u64 = 1;
const STAGE_GATHER: u64 = 3;

/// What travels: 16-bit values, or qgZ blocks (gathered quantized or f32).
#[derive(Copy, Clone, Debug)]
pub(super) enum Codec {
    Half(Half),
    Qgz { first: Quantizer, gather: Option<Quantizer> },
}

impl Codec {
    /// Bytes of a reduce-scatter piece of `m` elements.
    fn rs_len(&self, m: usize) -> usize {
        match self {
            Codec::Half(_) => 2 * m,
            Codec::Qgz { first, .. } => first.block_len(m),
        }
    }

    /// Bytes of an all-gather piece of `m` elements.
    fn ag_len(&self, m: usize) -> usize {
        match self {
            Codec::Half(_) => 2 * m,
            Codec::Qgz { gather: Some(q), .. } => q.block_len(m),
            Codec::Qgz { gather: None, .. } => 4 * m,
        }
    }

    /// Piece lengths must be multiples of this (whole groups, whole int4 bytes).
    fn align(&self) -> usize {
        match self {
            Codec::Half(_) => 1,
            Codec::Qgz { first, gather } => {
                let g = first.group.max(1);
                debug_assert!(gather.is_none_or(|q| q.group == first.group));
                if g % 2 == 0 {
                    g
                } else {
                    2 * g
                }
            }
        }
    }

    fn stochastic(&self) -> bool {
        match self {
            Codec::Half(_) => false,
            Codec::Qgz { first, gather } => {
                first.rounding == Rounding::Stochastic || gather.is_some_and(|q| q.rounding == Rounding::Stochastic)
            }
        }
    }
}

/// The cut of a gradient into `P` shards of `pieces` pieces each.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    shards: Vec<Range<usize>>,
    /// Elements per piece (the last piece of a shard may be shorter or empty).
    piece: usize,
    pieces: usize,
}

impl Layout {
    /// Pieces of about `target` elements, a multiple of `align`; one piece
    /// per shard when `target` is 0.
    pub(super) fn new(n: usize, p: usize, target: usize, align: usize) -> Layout {
        let shards = shards(n, p);
        let longest = shards.iter().map(|s| s.len()).max().unwrap_or(0);
        let align = align.max(1);
        let piece = if target == 0 || target >= longest { longest.max(1) } else { target.div_ceil(align) * align };
        let pieces = longest.div_ceil(piece).max(1);
        Layout { shards, piece, pieces }
    }

    /// Piece `c` of shard `s`, in gradient indices.
    pub(super) fn piece(&self, s: usize, c: usize) -> Range<usize> {
        let sh = &self.shards[s];
        let a = sh.start + (c * self.piece).min(sh.len());
        let b = sh.start + ((c + 1) * self.piece).min(sh.len());
        a..b
    }

    /// Piece `c` of shard `s`, in indices within the shard.
    fn local(&self, s: usize, c: usize) -> Range<usize> {
        let r = self.piece(s, c);
        let start = self.shards[s].start;
        r.start - start..r.end - start
    }
}

/// `x` plus the residual slice (error feedback), or `x`.
fn plus<'x>(x: &'x [f32], r: Option<&[f32]>) -> Cow<'x, [f32]> {
    match r {
        Some(r) => Cow::Owned(x.iter().zip(r).map(|(a, b)| a + b).collect()),
        None => Cow::Borrowed(x),
    }
}

/// `r = x − back` where finite, else 0 (the residual rule of every site).
fn set_residual(r: &mut [f32], x: &[f32], back: &[f32]) {
    for ((r, &v), &d) in r.iter_mut().zip(x).zip(back) {
        let e = v - d;
        *r = if e.is_finite() { e } else { 0.0 };
    }
}

impl GradSync<'_> {
    /// The residual buffer of `stage`, (re)created at `len` (error feedback
    /// only).
    fn ensure_residual(&mut self, stage: &'static str, len: usize) {
        if self.cfg.scheme.error_feedback {
            let r = self.residuals.entry(stage).or_default();
            if r.len() != len {
                *r = vec![0.0; len];
            }
        }
    }

    fn residual_slice(&self, stage: &'static str, range: Range<usize>) -> Option<&[f32]> {
        if self.cfg.scheme.error_feedback {
            self.residuals.get(stage).map(|r| &r[range])
        } else {
            None
        }
    }

    /// One-shot qgZ's codec: `bits` first, gathered as [`Self::gather_bits`] says.
    pub(super) fn one_shot_codec(&self, bits: QBits) -> Codec {
        Codec::Qgz { first: self.quantizer(bits), gather: self.gather_bits().map(|b| self.quantizer(b)) }
    }

    /// The all-reduce of [`Codec`], pipelined (module doc). Advances the step.
    pub(super) fn pipelined_all_reduce(&mut self, grad: &mut [f32], codec: Codec) -> Result<(), SyncError> {
        let (p, me, n) = (self.world().size(), self.world().rank(), grad.len());
        // One piece a shard where nothing would overlap: with stochastic
        // rounding (module doc), and on an engine whose exchanges block
        // (gloo through Python), where every piece would only add the
        // engine's fixed cost per call.
        let target = if codec.stochastic() || !self.world().overlaps_transfers() { 0 } else { self.cfg.pipeline_chunk };
        let lay = Layout::new(n, p, target, codec.align());
        let mine = lay.shards[me].len();
        match codec {
            Codec::Half(_) => {
                self.ensure_residual(RES_HALF, n);
                self.ensure_residual(RES_HALF_OWNER, mine);
            }
            Codec::Qgz { .. } => {
                self.ensure_residual(RES_FIRST, n);
                self.ensure_residual(RES_GATHER, mine);
            }
        }
        let mut rs: VecDeque<(usize, Box<dyn Pending>)> = VecDeque::new();
        let mut ag: VecDeque<(usize, Box<dyn Pending>)> = VecDeque::new();
        for c in 0..lay.pieces {
            let mut send = self.world().send_buffer((0..p).map(|s| codec.rs_len(lay.piece(s, c).len())).sum());
            let mut counts = Vec::with_capacity(p);
            for s in 0..p {
                let t = Instant::now();
                let before = send.len();
                self.encode_piece(codec, grad, s, lay.piece(s, c), &mut send)?;
                counts.push(send.len() - before);
                self.charge(Phase::Quantize, t);
                // Between kernels, let the transfers in flight advance (a
                // receiver's progress is what answers a large message's
                // rendezvous).
                let t = Instant::now();
                for (_, x) in rs.iter_mut().chain(ag.iter_mut()) {
                    x.test()?;
                }
                self.charge(Phase::Exchange, t);
            }
            let t = Instant::now();
            let recv_counts = vec![codec.rs_len(lay.piece(me, c).len()); p];
            let x = self.world().start_all_to_all_v(send, &counts, &recv_counts, self.deadline())?;
            self.count(Hop::World, &recv_counts);
            rs.push_back((c, x));
            for (_, x) in rs.iter_mut().chain(ag.iter_mut()) {
                x.test()?;
            }
            self.charge(Phase::Exchange, t);
            if rs.len() > LAG {
                let (c, x) = rs.pop_front().expect("non-empty");
                ag.push_back((c, self.reduce_piece(codec, &lay, c, x)?));
            }
            if ag.len() > LAG {
                let (c, x) = ag.pop_front().expect("non-empty");
                self.gathered_piece(codec, &lay, c, x, grad)?;
            }
        }
        while let Some((c, x)) = rs.pop_front() {
            ag.push_back((c, self.reduce_piece(codec, &lay, c, x)?));
            if ag.len() > LAG {
                let (c, x) = ag.pop_front().expect("non-empty");
                self.gathered_piece(codec, &lay, c, x, grad)?;
            }
        }
        while let Some((c, x)) = ag.pop_front() {
            self.gathered_piece(codec, &lay, c, x, grad)?;
        }
        self.step += 1;
        Ok(())
    }

    /// Appends `le16(cast(x / div + residual))` to `out` (`div` 1: no
    /// division), one 16-bit quantization site; with error feedback, the
    /// site's residual over `range` becomes what the cast lost.
    fn encode_half(
        &mut self,
        h: Half,
        x: &[f32],
        div: f32,
        stage: &'static str,
        range: Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<(), SyncError> {
        let eng = self.engine.clone();
        let at = out.len();
        out.resize(at + 2 * x.len(), 0);
        let Some(r) = self.residual_slice(stage, range.clone()) else {
            // Scale, narrow and lay out for the wire in one pass.
            eng.cast_to_le(h, x, div, &mut out[at..])?;
            return Ok(());
        };
        let scaled: Cow<'_, [f32]> =
            if div == 1.0 { Cow::Borrowed(x) } else { Cow::Owned(x.iter().map(|v| v / div).collect()) };
        let y = plus(&scaled, Some(r)).into_owned();
        eng.cast_to_le(h, &y, 1.0, &mut out[at..])?;
        let mut back = vec![0f32; y.len()];
        eng.cast_from_le(h, &out[at..], &mut back)?;
        if let Some(r) = self.residual_mut(stage) {
            set_residual(&mut r[range], &y, &back);
        }
        Ok(())
    }

    /// Appends the encoding of `grad[range]` (part of shard `s`) to `out`.
    fn encode_piece(
        &mut self,
        codec: Codec,
        grad: &[f32],
        s: usize,
        range: Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<(), SyncError> {
        if range.is_empty() {
            return Ok(());
        }
        let eng = self.engine.clone();
        match codec {
            Codec::Half(h) => {
                let pf = self.world().size() as f32;
                self.encode_half(h, &grad[range.clone()], pf, RES_HALF, range, out)?;
            }
            Codec::Qgz { first, .. } => {
                let x = plus(&grad[range.clone()], self.residual_slice(RES_FIRST, range.clone()));
                let seed = self.seed(STAGE_FIRST, s);
                let res = self.residual_mut(RES_FIRST).map(|r| &mut r[range]);
                first.encode(&*eng, &x, seed, out, res)?;
            }
        }
        Ok(())
    }

    /// Completes the reduce-scatter of piece `c`: sums this rank's piece
    /// over every rank, re-encodes it and starts its all-gather.
    fn reduce_piece(
        &mut self,
        codec: Codec,
        lay: &Layout,
        c: usize,
        x: Box<dyn Pending>,
    ) -> Result<Box<dyn Pending>, SyncError> {
        let t = Instant::now();
        let recv = x.wait(self.deadline())?;
        self.charge(Phase::Wait, t);
        let eng = self.engine.clone();
        let (p, me) = (self.world().size(), self.world().rank());
        let local = lay.local(me, c);
        let m = local.len();
        let len = codec.rs_len(m);
        let t = Instant::now();
        let mut sum = vec![0f32; m];
        match codec {
            Codec::Half(h) => {
                // Widening is exact; the sum runs in rank order, in f32.
                for r in 0..p {
                    eng.accumulate_le(h, &recv[r * len..(r + 1) * len], &mut sum)?;
                }
            }
            Codec::Qgz { first, .. } => {
                // Decoded, summed in rank order and divided in one pass.
                if m > 0 {
                    let blocks: Vec<&[u8]> = (0..p).map(|r| &recv[r * len..(r + 1) * len]).collect();
                    first.decode_mean(&*eng, &blocks, p as f32, &mut sum).map_err(|e| self.decode_error(p, e))?;
                }
            }
        }
        self.charge(Phase::Dequantize, t);
        let t = Instant::now();
        let mut payload = self.world().send_buffer(codec.ag_len(m));
        if m > 0 {
            match codec {
                // The owner's rounding of the sum is a second quantization site.
                Codec::Half(h) => self.encode_half(h, &sum, 1.0, RES_HALF_OWNER, local.clone(), &mut payload)?,
                Codec::Qgz { gather: None, .. } => {
                    for v in &sum {
                        payload.extend_from_slice(&v.to_le_bytes());
                    }
                }
                Codec::Qgz { gather: Some(q), .. } => {
                    let y = plus(&sum, self.residual_slice(RES_GATHER, local.clone()));
                    let seed = self.seed(STAGE_GATHER, me);
                    let res = self.residual_mut(RES_GATHER).map(|r| &mut r[local]);
                    q.encode(&*eng, &y, seed, &mut payload, res)?;
                }
            }
        }
        self.charge(Phase::Quantize, t);
        let t = Instant::now();
        let counts: Vec<usize> = (0..p).map(|j| codec.ag_len(lay.piece(j, c).len())).collect();
        let x = self.world().start_all_gather_v(payload, &counts, self.deadline())?;
        self.count(Hop::World, &counts);
        self.charge(Phase::Exchange, t);
        // Given back where it would have been freed, after the sum (see
        // qgz.rs's `hierarchical_mean`).
        drop(sum);
        self.world().recycle(recv);
        Ok(x)
    }

    /// Completes the all-gather of piece `c`: decodes every rank's reduced
    /// piece into `grad`.
    fn gathered_piece(
        &mut self,
        codec: Codec,
        lay: &Layout,
        c: usize,
        x: Box<dyn Pending>,
        grad: &mut [f32],
    ) -> Result<(), SyncError> {
        let t = Instant::now();
        let all = x.wait(self.deadline())?;
        self.charge(Phase::Wait, t);
        let t = Instant::now();
        let eng = self.engine.clone();
        let mut at = 0;
        for j in 0..self.world().size() {
            let range = lay.piece(j, c);
            let len = codec.ag_len(range.len());
            let bytes = &all[at..at + len];
            at += len;
            if range.is_empty() {
                continue;
            }
            let out = &mut grad[range];
            match codec {
                Codec::Half(h) => eng.cast_from_le(h, bytes, out)?,
                Codec::Qgz { gather: None, .. } => {
                    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                }
                Codec::Qgz { gather: Some(q), .. } => {
                    q.decode_into(&*eng, bytes, out).map_err(|e| self.decode_error(j, e))?;
                }
            }
        }
        self.world().recycle(all);
        self.charge(Phase::Dequantize, t);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_each_shard_in_aligned_steps() {
        for (n, p, target, align) in
            [(1000, 4, 64, 16), (1001, 3, 100, 7), (5, 8, 1, 2), (0, 2, 10, 4), (4096, 2, 0, 8)]
        {
            let lay = Layout::new(n, p, target, align);
            for s in 0..p {
                let sh = shards(n, p)[s].clone();
                let mut at = sh.start;
                for c in 0..lay.pieces {
                    let r = lay.piece(s, c);
                    assert_eq!(r.start, at, "n {n} p {p} shard {s} piece {c}");
                    assert!(r.end <= sh.end);
                    if r.end < sh.end {
                        assert_eq!((r.end - sh.start) % align, 0);
                    }
                    at = r.end;
                }
                assert_eq!(at, sh.end, "n {n} p {p} shard {s} not covered");
            }
        }
    }
}
