//! The [`Communicator`] abstraction: what a backend (MPI, NCCL) must provide
//! for gradient synchronization, and nothing more.
//!
//! A communicator moves bytes (all-gather, all-to-all with equal or uneven
//! counts, broadcast) and sums f32 / f16 / bf16 values (all-reduce). It never
//! sums integers: NCCL has no int4 type and its int8 sums wrap, so every
//! quantized reduction happens in this crate's code, in f32, where it is the
//! same on every backend.
//!
//! Guarantees every backend gives:
//! - every call takes a [`Deadline`]; a call that cannot finish by then
//!   returns [`CommError::Timeout`] naming the operation instead of hanging,
//!   and the communicator is poisoned (every later call fails fast);
//! - failures are [`CommError`] values, never panics;
//! - buffer sizes are checked before anything is sent, so a caller's
//!   mistake is [`CommError::InvalidArgument`], not a corrupted peer.
//!
//! Rank layout of a cluster ([`NodeMap`]): the node of every world rank,
//! given explicitly, so nodes may hold different numbers of ranks; a rank's
//! local index is its position on its node. [`ClusterShape`] /
//! [`NodeMap::even`] are the equal-node convenience: world rank `r` is local
//! rank `r % L` on node `r / L` for `L` ranks per node — the order `mpirun`
//! and `torchrun` give when every node runs `L` ranks. The map is a
//! setting, so one machine can emulate several nodes.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{CommError, SyncError};

/// The instant by which an operation must complete, and the budget it was
/// given (for the error message).
#[derive(Copy, Clone, Debug)]
pub struct Deadline {
    pub at: Instant,
    pub budget: Duration,
}

impl Deadline {
    pub fn after(budget: Duration) -> Self {
        Deadline { at: Instant::now() + budget, budget }
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.at
    }
}

/// A buffer summed element-wise across ranks, in place.
#[derive(Debug)]
pub enum ReduceBuf<'a> {
    F32(&'a mut [f32]),
    /// IEEE binary16 bit patterns.
    F16(&'a mut [u16]),
    /// bfloat16 bit patterns.
    BF16(&'a mut [u16]),
}

impl ReduceBuf<'_> {
    pub fn len(&self) -> usize {
        match self {
            ReduceBuf::F32(b) => b.len(),
            ReduceBuf::F16(b) | ReduceBuf::BF16(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An exchange started by [`Communicator::start_all_to_all_v`] or
/// [`Communicator::start_all_gather_v`], in flight until [`Pending::wait`]
/// returns. Dropping one unfinished abandons it: its buffers are leaked
/// (the engine may still write them) and the communicator is poisoned.
pub trait Pending: fmt::Debug {
    /// Drives the transfers without blocking; `true` once all completed.
    fn test(&mut self) -> Result<bool, CommError>;
    /// Blocks until every transfer completed and returns the receive
    /// buffer, or fails with [`CommError::Timeout`] naming the operation
    /// once `deadline` passes.
    fn wait(self: Box<Self>, deadline: Deadline) -> Result<Vec<u8>, CommError>;
}

/// An exchange that completed when it was started (what a backend without
/// non-blocking exchanges returns).
#[derive(Debug)]
pub struct Done(pub Vec<u8>);

impl Pending for Done {
    fn test(&mut self) -> Result<bool, CommError> {
        Ok(true)
    }

    fn wait(self: Box<Self>, _: Deadline) -> Result<Vec<u8>, CommError> {
        Ok(self.0)
    }
}

/// A group of ranks that can exchange data.
///
/// Buffer conventions: `all_gather` receives `size × send.len()` bytes in rank
/// order; `all_to_all` sends the `j`-th of `size` equal slices of `send` to
/// rank `j` and receives rank `j`'s slice at position `j`; the `_v` forms take
/// per-rank byte counts (slices laid end to end in rank order).
pub trait Communicator: fmt::Debug {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// The number of ranks in the group.
    fn size(&self) -> usize;
    /// The engine's name, for messages (`"mpi"`, `"nccl"`).
    fn backend(&self) -> &'static str;
    /// The CUDA device this communicator's buffers live on (NCCL), where
    /// device kernels run; `None` for host engines.
    fn cuda_device(&self) -> Option<usize> {
        None
    }

    /// A sub-group of the ranks that pass the same `color`, ordered by `key`
    /// (ties by rank). Collective: every rank of this group must call it.
    fn split(&self, color: usize, key: usize, deadline: Deadline) -> Result<Box<dyn Communicator>, CommError>;

    /// Every rank's `send` (all the same length), concatenated in rank order.
    fn all_gather(&self, send: &[u8], recv: &mut [u8], deadline: Deadline) -> Result<(), CommError>;

    /// Every rank's `send`, of `counts[rank]` bytes, concatenated in rank order.
    fn all_gather_v(&self, send: &[u8], recv: &mut [u8], counts: &[usize], deadline: Deadline)
        -> Result<(), CommError>;

    /// Uneven personalized exchange: `send_counts[j]` bytes to rank `j`,
    /// `recv_counts[j]` bytes from rank `j`.
    fn all_to_all_v(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        deadline: Deadline,
    ) -> Result<(), CommError>;

    /// Equal personalized exchange: slice `j` of `size` equal slices to rank `j`.
    fn all_to_all(&self, send: &[u8], recv: &mut [u8], deadline: Deadline) -> Result<(), CommError> {
        let p = self.size();
        if p == 0 || !send.len().is_multiple_of(p) || recv.len() != send.len() {
            return Err(CommError::InvalidArgument {
                op: "all_to_all",
                detail: format!("{} send and {} recv bytes for {p} ranks", send.len(), recv.len()),
            });
        }
        let counts = vec![send.len() / p; p];
        self.all_to_all_v(send, &counts, recv, &counts, deadline)
    }

    /// Whether [`Communicator::start_all_to_all_v`] and
    /// [`Communicator::start_all_gather_v`] return while the bytes are still
    /// moving, so the caller computes beside the transfer. `false` (the
    /// default): they run the blocking call, and cutting a synchronization
    /// into pieces only adds calls, each paying the engine's fixed cost.
    fn overlaps_transfers(&self) -> bool {
        false
    }

    /// [`Communicator::all_to_all_v`] started without waiting for it: the
    /// transfers proceed (driven by [`Pending::test`] on engines that need
    /// it) while the caller computes, and several may be in flight at once.
    /// Every rank of the group must start the same sequence of exchanges.
    /// The default runs the blocking call and returns it completed.
    fn start_all_to_all_v(
        &self,
        send: Vec<u8>,
        send_counts: &[usize],
        recv_counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        let mut recv = vec![0u8; recv_counts.iter().sum()];
        self.all_to_all_v(&send, send_counts, &mut recv, recv_counts, deadline)?;
        Ok(Box::new(Done(recv)))
    }

    /// [`Communicator::all_gather_v`] started without waiting for it (see
    /// [`Communicator::start_all_to_all_v`]).
    fn start_all_gather_v(
        &self,
        send: Vec<u8>,
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        let mut recv = vec![0u8; counts.iter().sum()];
        self.all_gather_v(&send, &mut recv, counts, deadline)?;
        Ok(Box::new(Done(recv)))
    }

    /// An empty vector with room for `capacity` bytes, for the caller to
    /// fill and hand to [`Communicator::start_all_to_all_v`] or
    /// [`Communicator::start_all_gather_v`]. An engine that keeps vectors
    /// between exchanges ([`Communicator::recycle`]) returns one of those:
    /// its pages are mapped already, where a new vector of a few MiB costs a
    /// page fault every 4 KiB as it is first written (half of a 16 MiB
    /// all-to-all's time through the DDP hook's transport, measured on 4
    /// ranks on 2 cores). The default: a new vector.
    fn send_buffer(&self, capacity: usize) -> Vec<u8> {
        Vec::with_capacity(capacity)
    }

    /// A vector a started exchange returned, once the caller has read it,
    /// for the engine to reuse ([`Communicator::send_buffer`]). The default
    /// frees it.
    fn recycle(&self, buf: Vec<u8>) {
        drop(buf);
    }

    /// Element-wise sum across ranks, in place. 16-bit sums are the engine's
    /// own (NCCL sums in the 16-bit type; the MPI backend accumulates in f32
    /// in rank order and rounds once).
    fn all_reduce_sum(&self, buf: ReduceBuf<'_>, deadline: Deadline) -> Result<(), CommError>;

    /// `root`'s buffer to every rank.
    fn broadcast(&self, buf: &mut [u8], root: usize, deadline: Deadline) -> Result<(), CommError>;

    /// Returns once every rank has entered it.
    fn barrier(&self, deadline: Deadline) -> Result<(), CommError>;

    /// Ends the whole job (every rank, every group) with `code`. For MPI this
    /// is `MPI_Abort`; for NCCL, the communicators are aborted and the
    /// process exits, so its launcher sees the failure.
    fn abort(&self, code: i32) -> !;
}

/// Checks that byte counts match a buffer and the group size.
pub fn check_counts(op: &'static str, counts: &[usize], size: usize, buf_len: usize) -> Result<(), CommError> {
    if counts.len() != size {
        return Err(CommError::InvalidArgument { op, detail: format!("{} counts for {size} ranks", counts.len()) });
    }
    let total: usize = counts.iter().sum();
    if total != buf_len {
        return Err(CommError::InvalidArgument {
            op,
            detail: format!("counts sum to {total}, buffer holds {buf_len}"),
        });
    }
    Ok(())
}

/// Checks an all-gather-v's counts: one per rank, summing to the receive
/// buffer, and `rank`'s own equal to what it sends.
pub fn check_gather_counts(
    op: &'static str,
    counts: &[usize],
    size: usize,
    rank: usize,
    send_len: usize,
    recv_len: usize,
) -> Result<(), CommError> {
    check_counts(op, counts, size, recv_len)?;
    if counts[rank] != send_len {
        return Err(CommError::InvalidArgument {
            op,
            detail: format!("rank {rank} sends {send_len} bytes, counts say {}", counts[rank]),
        });
    }
    Ok(())
}

/// Byte offsets of slices of the given lengths laid end to end.
pub(crate) fn displacements(counts: &[usize]) -> Vec<usize> {
    let mut d = Vec::with_capacity(counts.len());
    let mut at = 0;
    for &c in counts {
        d.push(at);
        at += c;
    }
    d
}

/// How world ranks map onto nodes: `nodes × ranks_per_node`, node-major.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ClusterShape {
    pub nodes: usize,
    pub ranks_per_node: usize,
}

impl ClusterShape {
    /// `nodes` nodes over `world` ranks; `world` must be a multiple of `nodes`.
    pub fn new(world: usize, nodes: usize) -> Result<Self, SyncError> {
        if nodes == 0 || world == 0 || !world.is_multiple_of(nodes) {
            return Err(SyncError::BadShape(format!("{world} ranks cannot form {nodes} equal nodes")));
        }
        Ok(ClusterShape { nodes, ranks_per_node: world / nodes })
    }

    pub fn world(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    pub fn local_of(&self, rank: usize) -> usize {
        rank % self.ranks_per_node
    }
}

/// Which node every world rank runs on: an explicit rank → node map, so
/// nodes may hold different numbers of ranks (4 A100s on one machine, 8 T4s
/// on another) and ranks need not be node-major. A rank's local index is its
/// position among its node's ranks in world-rank order. Node ids are
/// `0..nodes`, each with at least one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMap {
    node: Vec<usize>,
    local: Vec<usize>,
    members: Vec<Vec<usize>>,
}

impl NodeMap {
    /// `node_of[r]` is world rank `r`'s node.
    pub fn new(node_of: Vec<usize>) -> Result<Self, SyncError> {
        if node_of.is_empty() {
            return Err(SyncError::BadShape("a node map of no ranks".into()));
        }
        let nodes = node_of.iter().max().map_or(0, |m| m + 1);
        let mut members = vec![Vec::new(); nodes];
        let mut local = Vec::with_capacity(node_of.len());
        for (r, &n) in node_of.iter().enumerate() {
            local.push(members[n].len());
            members[n].push(r);
        }
        if let Some(empty) = members.iter().position(Vec::is_empty) {
            return Err(SyncError::BadShape(format!(
                "node map {node_of:?}: node {empty} has no rank (nodes are numbered 0..{nodes})"
            )));
        }
        Ok(NodeMap { node: node_of, local, members })
    }

    /// `nodes` equal nodes over `world` ranks, node-major (rank `r` on node
    /// `r / (world / nodes)`): the layout `mpirun` and `torchrun` give when
    /// every node runs the same number of ranks.
    pub fn even(world: usize, nodes: usize) -> Result<Self, SyncError> {
        let shape = ClusterShape::new(world, nodes)?;
        Ok(NodeMap::from(shape))
    }

    pub fn world(&self) -> usize {
        self.node.len()
    }

    pub fn nodes(&self) -> usize {
        self.members.len()
    }

    pub fn node_of(&self, rank: usize) -> usize {
        self.node[rank]
    }

    pub fn local_of(&self, rank: usize) -> usize {
        self.local[rank]
    }

    /// The world ranks on `node`, in rank order.
    pub fn members(&self, node: usize) -> &[usize] {
        &self.members[node]
    }

    /// The node of every rank, in rank order.
    pub fn node_ids(&self) -> &[usize] {
        &self.node
    }

    /// Whether every node runs the same number of ranks.
    pub fn is_uniform(&self) -> bool {
        self.members.iter().all(|m| m.len() == self.members[0].len())
    }

    /// The rank on `node` that handles final shard `shard` in a
    /// hierarchical reduction: the one whose local index is the shard
    /// owner's, modulo the node's size.
    pub fn handler(&self, node: usize, shard: usize) -> usize {
        let m = &self.members[node];
        m[self.local[shard] % m.len()]
    }
}

impl From<ClusterShape> for NodeMap {
    fn from(shape: ClusterShape) -> Self {
        let node = (0..shape.world()).map(|r| shape.node_of(r)).collect();
        let local = (0..shape.world()).map(|r| shape.local_of(r)).collect();
        let members =
            (0..shape.nodes).map(|n| (n * shape.ranks_per_node..(n + 1) * shape.ranks_per_node).collect()).collect();
        NodeMap { node, local, members }
    }
}

/// The sub-groups of a hierarchical scheme: this rank's node (ranked by
/// local index) and, when every node has the same number of ranks, the
/// ranks with its local index on every node (ranked by node). With nodes of
/// different sizes no such group covers every node, and with every rank
/// alone on its node that group would be the world again (on gloo, with
/// connections of its own: about 2 ms a step more across emulated nodes):
/// then `inter` is `None` and the inter-node stage runs over the world.
#[derive(Debug)]
pub struct NodeGroups {
    pub intra: Box<dyn Communicator>,
    pub inter: Option<Box<dyn Communicator>>,
}

impl NodeGroups {
    /// Splits `world` by `shape` (equal nodes, node-major). Collective over `world`.
    pub fn split(world: &dyn Communicator, shape: ClusterShape, deadline: Deadline) -> Result<Self, SyncError> {
        if shape.world() != world.size() {
            return Err(SyncError::BadShape(format!(
                "{} nodes × {} ranks per node ≠ {} ranks",
                shape.nodes,
                shape.ranks_per_node,
                world.size()
            )));
        }
        Self::split_map(world, &NodeMap::from(shape), deadline)
    }

    /// Splits `world` by the node of every rank. Collective over `world`.
    pub fn split_map(world: &dyn Communicator, map: &NodeMap, deadline: Deadline) -> Result<Self, SyncError> {
        if map.world() != world.size() {
            return Err(SyncError::BadShape(format!(
                "a node map of {} ranks for a group of {}",
                map.world(),
                world.size()
            )));
        }
        let r = world.rank();
        let (node, local) = (map.node_of(r), map.local_of(r));
        let intra = world.split(node, local, deadline)?;
        let here = map.members(node).len();
        let inter = if map.is_uniform() && map.nodes() < map.world() {
            Some(world.split(local, node, deadline)?)
        } else {
            None
        };
        let inter_size = inter.as_ref().map_or(map.nodes(), |c| c.size());
        if intra.size() != here || inter_size != map.nodes() {
            return Err(SyncError::BadShape(format!(
                "split gave groups of {} and {inter_size} ranks, expected {here} and {}",
                intra.size(),
                map.nodes()
            )));
        }
        Ok(NodeGroups { intra, inter })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_counts_must_fit_the_buffers_and_the_sender() {
        assert!(check_gather_counts("g", &[3, 2, 2], 3, 1, 2, 7).is_ok());
        let err = |r: Result<(), CommError>| match r {
            Err(CommError::InvalidArgument { detail, .. }) => detail,
            other => panic!("{other:?}"),
        };
        assert_eq!(err(check_gather_counts("g", &[3, 2, 2], 3, 0, 2, 7)), "rank 0 sends 2 bytes, counts say 3");
        assert_eq!(err(check_gather_counts("g", &[3, 2], 3, 0, 3, 5)), "2 counts for 3 ranks");
        assert_eq!(err(check_gather_counts("g", &[3, 2, 2], 3, 0, 3, 8)), "counts sum to 7, buffer holds 8");
    }

    #[test]
    fn node_maps_take_nodes_of_any_size_and_the_even_case_is_node_major() {
        // 4 A100s and 8 T4s: two nodes, not two halves of six.
        let m = NodeMap::new([vec![0; 4], vec![1; 8]].concat()).expect("map");
        assert_eq!((m.nodes(), m.members(0).len(), m.members(1).len()), (2, 4, 8));
        assert_eq!((m.node_of(5), m.local_of(5)), (1, 1));
        assert!(!m.is_uniform());
        // Shard 11 (T4 local 7) is handled on the A100 node by local 7 % 4 = 3.
        assert_eq!(m.handler(0, 11), 3);
        assert_eq!(m.handler(1, 11), 11);
        let e = NodeMap::even(8, 2).expect("even");
        assert_eq!(e, NodeMap::new(vec![0, 0, 0, 0, 1, 1, 1, 1]).expect("map"));
        assert!(e.is_uniform());
        assert!(NodeMap::new(vec![0, 2]).is_err());
        assert!(NodeMap::even(12, 5).is_err());
    }
}
