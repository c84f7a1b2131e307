//! qgZ (ZeRO++): block-quantized reduce-scatter by all-to-all, reduced in
//! f32, one-shot or hierarchical; all-reduce = that reduce-scatter plus an
//! all-gather of the (requantized or f32) shards.
//!
//! **One-shot.** Rank `r` quantizes each of the `P` shards of its gradient
//! ([`super::block`]) and sends shard `s`'s block to rank `s` (one
//! all-to-all with uneven counts); rank `s` dequantizes and accumulates the
//! `P` blocks in rank order in f32 and divides by `P`. Unlike a ring
//! reduce-scatter, nothing is requantized between hops.
//!
//! **Hierarchical** (`N` nodes × `L` ranks; rank `n·L + l`). Intra-node
//! all-to-all with slice reordering: local rank `l` receives, from each rank
//! of its node, the blocks of the `N` final shards `{n·L + l}` — the slices
//! a rank sends to local peer `j` are shards `j, L+j, 2L+j, …`, gathered out
//! of order (DeepSpeed's `a·D+b → b·N+a` permutation) — and sums them
//! (the node partials); each partial is requantized at the inter-node width
//! and sent over the inter-node group (same `l` on every node) to node `n`,
//! so rank `n·L + l` ends with exactly its own shard. Inter-node traffic is
//! `1/L` of the one-shot scheme's. A rank alone on its node (`L_m = 1`)
//! has nothing to exchange inside it: its gradient is its node's partial,
//! never quantized at the intra-node width (the scheme is then one-shot at
//! the inter-node width, but for the stage its rounding seeds come from).
//!
//! **Nodes of any size.** The nodes come from the rank → node map
//! ([`crate::NodeMap`]: `SyncConfig::node_of`, or `nodes` equal node-major
//! nodes), never from `rank / (P / N)`. On node `m` of `L_m` ranks, shard
//! `s` is handled by the rank whose local index is `local(s) mod L_m` (with
//! equal nodes, the description above). When the nodes differ in size no
//! group of one local index spans every node, so the inter-node all-to-all
//! runs over the world, every pair without a partial to exchange sending
//! zero bytes; the owner still sums the `N` node partials in node order.
//! The bound below holds with `L` the size of node `m`.
//!
//! **All-gather.** `Gather::Quantized` requantizes each mean shard (at the
//! scheme's width; the inter-node width when hierarchical) and all-gathers
//! the blocks; every rank, the owner included, decodes the same bytes, so
//! results are bitwise identical. Wire bytes per rank of the all-reduce,
//! `b` bits per code, group `G`: `2·(P−1)/P·M/4·(b/8 + 4/G)`, i.e. a fraction
//! `(b/8 + 4/G)/4` of an f32 ring all-reduce's `2·M·(P−1)/P` (int8, G = 512:
//! 0.252; int4: 0.127).
//!
//! **Error bound** (per element of group `g`; a quantization with scale
//! `s = absmax/qmax` errs by at most `q(s) = s·(k + 2^-10)`, `k = 1/2` for
//! round-to-nearest and `1` for stochastic rounding — the `2^-10` covers the
//! f32 evaluation of `x·(1/s)`, of `s` and of the dequantized product; `ε` =
//! 2^-24; `A_r` = absmax of rank `r`'s group):
//!
//! ```text
//! one-shot sum:  E = Σ_r q(A_r/qmax) + (P+1)·ε·Σ_r (A_r + A_r/qmax)
//! hierarchical:  E1_m = Σ_{r∈m} q(A_r/qmax) + (L+1)·ε·Σ_{r∈m}(A_r + A_r/qmax)
//!                B_m  = absmax_g(exact node partial) + max_g E1_m
//!                E = Σ_m (E1_m + q'(B_m/qmax')) + (N+1)·ε·Σ_m (B_m + B_m/qmax')
//!                (a node of one rank: E1_m = 0, its gradient is its partial)
//! mean:          E_rs = E/P + |mean|·ε
//! all-gather:    E_rs + q''((absmax_g(mean) + max_g E_rs)/qmax'') + ε·(absmax_g(mean) + max_g E_rs)
//! ```
//!
//! (f32 gather: `E_rs`). The bound is `(1/P)·Σ scale/2` per quantization
//! stage up to rounding terms — the form DeepSpeed's analysis uses.

use std::borrow::Cow;
use std::time::Instant;

use qsync_kernels::QBits;

use super::block::{shards, Quantizer};
use super::{f32_bytes, f32_from_bytes, GradSync, Hop, Phase};
use crate::error::SyncError;
use crate::scheme::{Gather, Kind};

const STAGE_FIRST: u64 = 1;
const STAGE_INTER: u64 = 2;
const STAGE_GATHER: u64 = 3;

impl GradSync<'_> {
    pub(super) fn quantizer(&self, bits: QBits) -> Quantizer {
        Quantizer { bits, group: self.cfg.group, rounding: self.cfg.scheme.rounding }
    }

    fn qgz_bits(&self) -> Result<(QBits, Option<QBits>), SyncError> {
        match self.cfg.scheme.kind {
            Kind::Qgz { intra, inter } => Ok((intra, inter)),
            _ => Err(SyncError::BadScheme(format!("{} is not a qgZ scheme", self.cfg.scheme))),
        }
    }

    /// The width the all-gather requantizes at.
    pub(crate) fn gather_bits(&self) -> Option<QBits> {
        match (self.cfg.scheme.kind, self.cfg.gather) {
            (_, Gather::F32) => None,
            (Kind::Qgz { inter: Some(b), .. }, _) | (Kind::Qgz { intra: b, inter: None }, _) => Some(b),
            _ => None,
        }
    }

    /// This rank's shard (`shards(n, P)[rank]`) of the mean gradient.
    pub fn reduce_scatter_mean(&mut self, grad: &[f32]) -> Result<Vec<f32>, SyncError> {
        let (intra, inter) = self.qgz_bits()?;
        // The sums are divided by P as they are decoded.
        let mean = match inter {
            None => self.one_shot_mean(grad, intra)?,
            Some(inter) => self.hierarchical_mean(grad, intra, inter)?,
        };
        self.step += 1;
        Ok(mean)
    }

    fn one_shot_mean(&mut self, grad: &[f32], bits: QBits) -> Result<Vec<f32>, SyncError> {
        let eng = self.engine.clone();
        let p = self.world().size();
        let me = self.world().rank();
        let q = self.quantizer(bits);
        let sh = shards(grad.len(), p);
        let t = Instant::now();
        let x = self.with_residual("first", grad);
        let mut send = self.world().send_buffer(q.block_len(grad.len()) + 4 * p);
        let mut send_counts = Vec::with_capacity(p);
        for (s, range) in sh.iter().enumerate() {
            let before = send.len();
            let seed = self.seed(STAGE_FIRST, s);
            let res = self.residual_mut("first").map(|r| &mut r[range.clone()]);
            q.encode(&*eng, &x[range.clone()], seed, &mut send, res)?;
            send_counts.push(send.len() - before);
        }
        let m = sh[me].len();
        let recv_counts = vec![q.block_len(m); p];
        self.charge(Phase::Quantize, t);
        let t = Instant::now();
        let recv = self
            .world()
            .start_all_to_all_v(send, &send_counts, &recv_counts, self.deadline())?
            .wait(self.deadline())?;
        self.charge(Phase::Exchange, t);
        self.count(Hop::World, &recv_counts);
        let t = Instant::now();
        let blocks: Vec<&[u8]> = recv.chunks(q.block_len(m).max(1)).take(p).collect();
        let mut sum = vec![0f32; m];
        if m > 0 {
            q.decode_mean(&*eng, &blocks, p as f32, &mut sum).map_err(|e| self.decode_error(p, e))?;
        }
        drop(blocks);
        self.world().recycle(recv);
        self.charge(Phase::Dequantize, t);
        Ok(sum)
    }

    fn hierarchical_mean(&mut self, grad: &[f32], intra_bits: QBits, inter_bits: QBits) -> Result<Vec<f32>, SyncError> {
        let eng = self.engine.clone();
        let owned_map = self.nodes.clone();
        let map = &owned_map;
        let nodes = map.nodes();
        let p = self.world().size();
        let me = self.world().rank();
        let (node, local) = (map.node_of(me), map.local_of(me));
        let per_node = map.members(node).len();
        let sh = shards(grad.len(), p);
        // Final shards handled by local rank `j` of this node: those whose
        // owner's local index is `j` modulo the node's size (with equal
        // nodes, n·L + j for every node n).
        let handled_by = |j: usize| (0..p).filter(move |&s| map.local_of(s) % per_node == j);

        // A rank alone on its node is its node's partial: the shards it
        // handles are every shard, in order, so its partial is its gradient,
        // and quantizing it for an exchange with nobody would only add
        // error and time.
        let mine: Vec<usize> = handled_by(local).collect();
        let (partial, first): (Cow<'_, [f32]>, _) = if per_node == 1 {
            (Cow::Borrowed(grad), None)
        } else {
            // Intra-node all-to-all, slices reordered so peer j gets its shards.
            let q1 = self.quantizer(intra_bits);
            let t = Instant::now();
            let x = self.with_residual("first", grad);
            let mut send = self.comm(Hop::Intra).send_buffer(q1.block_len(grad.len()) + 4 * p);
            let mut send_counts = Vec::with_capacity(per_node);
            for j in 0..per_node {
                let before = send.len();
                for s in handled_by(j) {
                    let seed = self.seed(STAGE_FIRST, s);
                    let res = self.residual_mut("first").map(|r| &mut r[sh[s].clone()]);
                    q1.encode(&*eng, &x[sh[s].clone()], seed, &mut send, res)?;
                }
                send_counts.push(send.len() - before);
            }
            let per_peer: usize = mine.iter().map(|&s| q1.block_len(sh[s].len())).sum();
            let recv_counts = vec![per_peer; per_node];
            self.charge(Phase::Quantize, t);
            let t = Instant::now();
            let received = self
                .comm(Hop::Intra)
                .start_all_to_all_v(send, &send_counts, &recv_counts, self.deadline())?
                .wait(self.deadline())?;
            self.charge(Phase::Exchange, t);
            self.count(Hop::Intra, &recv_counts);
            let t = Instant::now();

            // Node partials of the shards this rank handles, concatenated.
            let mut partial = vec![0f32; mine.iter().map(|&s| sh[s].len()).sum()];
            let (mut offset, mut at) = (0, 0);
            for &s in &mine {
                let (m, len) = (sh[s].len(), q1.block_len(sh[s].len()));
                let blocks: Vec<&[u8]> =
                    (0..per_node).map(|i| &received[i * per_peer + offset..i * per_peer + offset + len]).collect();
                if m > 0 {
                    q1.decode_mean(&*eng, &blocks, 1.0, &mut partial[at..at + m])
                        .map_err(|e| self.decode_error(per_node, e))?;
                }
                offset += len;
                at += m;
            }
            self.charge(Phase::Dequantize, t);
            (Cow::Owned(partial), Some(received))
        };
        // Inter-node all-to-all: each partial goes to its shard's owner. With
        // equal nodes over the group of this local index (owner of shard s at
        // group rank node_of(s)); otherwise over the world (owner s itself),
        // every pair that has nothing to exchange sending zero bytes (and
        // so where every rank is alone on its node: `NodeGroups`).
        let equal = self.groups.as_ref().is_some_and(|g| g.inter.is_some());
        let (hop, size) = if equal { (Hop::Inter, nodes) } else { (Hop::World, p) };
        let index = |world_rank: usize| if equal { map.node_of(world_rank) } else { world_rank };
        let t = Instant::now();
        let q2 = self.quantizer(inter_bits);
        let y = self.with_residual("inter", &partial);
        let mut starts = Vec::with_capacity(mine.len());
        let mut at = 0;
        for &s in &mine {
            starts.push(at);
            at += sh[s].len();
        }
        let mut order: Vec<usize> = (0..mine.len()).collect();
        order.sort_by_key(|&i| index(mine[i]));
        let mut send = self.comm(hop).send_buffer(q2.block_len(y.len()) + 4 * nodes);
        let mut send_counts = vec![0; size];
        for i in order {
            let (s, at) = (mine[i], starts[i]);
            let m = sh[s].len();
            let before = send.len();
            let seed = self.seed(STAGE_INTER, s);
            let res = self.residual_mut("inter").map(|r| &mut r[at..at + m]);
            q2.encode(&*eng, &y[at..at + m], seed, &mut send, res)?;
            send_counts[index(s)] = send.len() - before;
        }
        let m = sh[me].len();
        let block = q2.block_len(m);
        // Node n's partial of my shard comes from its handler there.
        let from: Vec<usize> = (0..nodes).map(|n| index(map.handler(n, me))).collect();
        let mut recv_counts = vec![0; size];
        for &f in &from {
            recv_counts[f] = block;
        }
        self.charge(Phase::Quantize, t);
        let t = Instant::now();
        let recv = self
            .comm(hop)
            .start_all_to_all_v(send, &send_counts, &recv_counts, self.deadline())?
            .wait(self.deadline())?;
        self.charge(Phase::Exchange, t);
        self.count(hop, &recv_counts);
        let t = Instant::now();
        // Summed in node order (every rank's shard alike).
        let starts = crate::comm::displacements(&recv_counts);
        let blocks: Vec<&[u8]> = from.iter().map(|&f| &recv[starts[f]..starts[f] + block]).collect();
        let mut sum = vec![0f32; m];
        if m > 0 {
            q2.decode_mean(&*eng, &blocks, p as f32, &mut sum).map_err(|e| self.decode_error(nodes, e))?;
        }
        drop(blocks);
        self.comm(hop).recycle(recv);
        // Given back where it would have been freed: earlier, the Open MPI
        // path's allocations above would reuse it, and a later synchronization
        // then grows the heap into fresh pages (`steady_state_synchronization_touches_no_fresh_memory`).
        if let Some(first) = first {
            self.comm(Hop::Intra).recycle(first);
        }
        self.charge(Phase::Dequantize, t);
        Ok(sum)
    }

    /// All-gathers every rank's mean shard into `out` (the full gradient).
    pub(super) fn gather_shards(&mut self, mean: &[f32], out: &mut [f32]) -> Result<(), SyncError> {
        let eng = self.engine.clone();
        let p = self.world().size();
        let me = self.world().rank();
        let sh = shards(out.len(), p);
        match self.gather_bits() {
            None => {
                let counts: Vec<usize> = sh.iter().map(|s| 4 * s.len()).collect();
                let t = Instant::now();
                let all = self
                    .world()
                    .start_all_gather_v(f32_bytes(mean), &counts, self.deadline())?
                    .wait(self.deadline())?;
                self.charge(Phase::Exchange, t);
                self.count(Hop::World, &counts);
                out.copy_from_slice(&f32_from_bytes(&all));
                self.world().recycle(all);
            }
            Some(bits) => {
                let t = Instant::now();
                let q = self.quantizer(bits);
                let y = self.with_residual("gather", mean);
                let mut block = self.world().send_buffer(q.block_len(y.len()));
                // The seed of the step this shard was reduced in.
                self.step -= 1;
                let seed = self.seed(STAGE_GATHER, me);
                self.step += 1;
                let res = self.residual_mut("gather").map(|r| r.as_mut_slice());
                q.encode(&*eng, &y, seed, &mut block, res)?;
                let counts: Vec<usize> = sh.iter().map(|s| q.block_len(s.len())).collect();
                self.charge(Phase::Quantize, t);
                let t = Instant::now();
                let all = self.world().start_all_gather_v(block, &counts, self.deadline())?.wait(self.deadline())?;
                self.charge(Phase::Exchange, t);
                self.count(Hop::World, &counts);
                let t = Instant::now();
                let mut at = 0;
                for (j, range) in sh.iter().enumerate() {
                    q.decode_into(&*eng, &all[at..at + counts[j]], &mut out[range.clone()])
                        .map_err(|e| self.decode_error(j, e))?;
                    at += counts[j];
                }
                self.world().recycle(all);
                self.charge(Phase::Dequantize, t);
            }
        }
        Ok(())
    }
}
