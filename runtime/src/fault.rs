//! Failure injection for tests and `sync-bench --kill-rank/--stall-rank`: a
//! [`Communicator`] wrapper that, on one rank, fails at its `n`-th
//! communicator call — in the middle of a synchronization, the case failure
//! handling exists for. Sub-groups split from it inherit the fault and the
//! call count, so a hierarchical scheme fails inside its intra- or
//! inter-node phase. On every other rank it only forwards.

use std::cell::Cell;
use std::fmt;
use std::rc::Rc;
use std::time::Duration;

use crate::comm::{Communicator, Deadline, Pending, ReduceBuf};
use crate::error::CommError;

/// What the failing rank does.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Exit abruptly (`abort`: no unwinding, no MPI_Finalize), as a crash.
    Exit,
    /// Panic (the backend's panic handling must end the job).
    Panic,
    /// Sleep this long, then carry on (peers hit their deadlines).
    Stall(Duration),
}

#[derive(Debug)]
struct State {
    fault: Fault,
    /// 1-based call index at which the fault fires; 0 on healthy ranks.
    at_call: usize,
    calls: Cell<usize>,
    /// Fires at this rank's next `split` instead (splits are not counted
    /// as calls otherwise).
    at_split: Cell<bool>,
    world_rank: usize,
}

enum Inner<'a> {
    Borrowed(&'a dyn Communicator),
    Owned(Box<dyn Communicator>),
}

/// A communicator that fails on one rank at a chosen call.
pub struct FaultyComm<'a> {
    inner: Inner<'a>,
    state: Rc<State>,
}

impl fmt::Debug for FaultyComm<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyComm").field("inner", self.comm()).field("state", &self.state).finish()
    }
}

impl<'a> FaultyComm<'a> {
    /// Wraps `world`; world rank `rank` suffers `fault` at its `at_call`-th
    /// call (counting from 1 over this communicator and its splits).
    pub fn new(world: &'a dyn Communicator, rank: usize, fault: Fault, at_call: usize) -> Self {
        let at_call = if world.rank() == rank { at_call.max(1) } else { 0 };
        FaultyComm {
            inner: Inner::Borrowed(world),
            state: Rc::new(State {
                fault,
                at_call,
                calls: Cell::new(0),
                at_split: Cell::new(false),
                world_rank: world.rank(),
            }),
        }
    }

    /// Wraps `world`; world rank `rank` suffers `fault` at its first
    /// `split` (before entering it), as a rank lost while a hierarchical
    /// scheme makes its node groups.
    pub fn at_split(world: &'a dyn Communicator, rank: usize, fault: Fault) -> Self {
        let c = FaultyComm::new(world, rank, fault, usize::MAX);
        c.state.at_split.set(world.rank() == rank);
        c
    }

    fn comm(&self) -> &dyn Communicator {
        match &self.inner {
            Inner::Borrowed(c) => *c,
            Inner::Owned(c) => c.as_ref(),
        }
    }

    fn tick(&self, op: &str) {
        let s = &self.state;
        s.calls.set(s.calls.get() + 1);
        if s.at_call == 0 || s.calls.get() != s.at_call {
            return;
        }
        self.fire(op);
    }

    fn fire(&self, op: &str) {
        let r = self.state.world_rank;
        match self.state.fault {
            Fault::Exit => {
                eprintln!("qsync-runtime: rank {r}: injected fault: exiting abruptly inside {op}");
                std::process::abort();
            }
            Fault::Panic => panic!("rank {r}: injected panic inside {op}"),
            Fault::Stall(d) => {
                eprintln!("qsync-runtime: rank {r}: injected fault: stalling {d:?} inside {op}");
                std::thread::sleep(d);
            }
        }
    }
}

impl Communicator for FaultyComm<'_> {
    fn rank(&self) -> usize {
        self.comm().rank()
    }

    fn size(&self) -> usize {
        self.comm().size()
    }

    fn backend(&self) -> &'static str {
        self.comm().backend()
    }

    fn cuda_device(&self) -> Option<usize> {
        self.comm().cuda_device()
    }

    fn split(&self, color: usize, key: usize, deadline: Deadline) -> Result<Box<dyn Communicator>, CommError> {
        if self.state.at_split.get() {
            self.state.at_split.set(false);
            self.fire("split");
        }
        let inner = self.comm().split(color, key, deadline)?;
        Ok(Box::new(FaultyComm { inner: Inner::Owned(inner), state: self.state.clone() }))
    }

    fn all_gather(&self, send: &[u8], recv: &mut [u8], deadline: Deadline) -> Result<(), CommError> {
        self.tick("all_gather");
        self.comm().all_gather(send, recv, deadline)
    }

    fn all_gather_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<(), CommError> {
        self.tick("all_gather_v");
        self.comm().all_gather_v(send, recv, counts, deadline)
    }

    fn all_to_all_v(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        deadline: Deadline,
    ) -> Result<(), CommError> {
        self.tick("all_to_all_v");
        self.comm().all_to_all_v(send, send_counts, recv, recv_counts, deadline)
    }

    fn overlaps_transfers(&self) -> bool {
        self.comm().overlaps_transfers()
    }

    fn start_all_to_all_v(
        &self,
        send: Vec<u8>,
        send_counts: &[usize],
        recv_counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        self.tick("all_to_all_v");
        self.comm().start_all_to_all_v(send, send_counts, recv_counts, deadline)
    }

    fn start_all_gather_v(
        &self,
        send: Vec<u8>,
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        self.tick("all_gather_v");
        self.comm().start_all_gather_v(send, counts, deadline)
    }

    fn all_reduce_sum(&self, buf: ReduceBuf<'_>, deadline: Deadline) -> Result<(), CommError> {
        self.tick("all_reduce");
        self.comm().all_reduce_sum(buf, deadline)
    }

    fn broadcast(&self, buf: &mut [u8], root: usize, deadline: Deadline) -> Result<(), CommError> {
        self.tick("broadcast");
        self.comm().broadcast(buf, root, deadline)
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), CommError> {
        self.comm().barrier(deadline)
    }

    fn abort(&self, code: i32) -> ! {
        self.comm().abort(code)
    }
}
