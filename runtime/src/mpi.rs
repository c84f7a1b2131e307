//! The MPI backend: the CPU engine, over the `mpi` crate (rsmpi) and the
//! system's Open MPI.
//!
//! Every collective is MPI's non-blocking form (`MPI_Iallgatherv`,
//! `MPI_Ialltoallv`, …) polled with `MPI_Test` against the call's deadline,
//! because a blocking collective with a dead or stalled peer never returns.
//! The buffers handed to MPI are owned by the call; when a deadline passes
//! they are leaked with the request (MPI may still write into them), the
//! communicator is poisoned and [`CommError::Timeout`] names the operation.
//! No ULFM: after any failure the only sound recovery is ending the job,
//! which [`Communicator::abort`] (`MPI_Abort`) does.
//!
//! Failure handling installed by [`MpiComm::init`]:
//! - errors return codes (`MPI_ERRORS_RETURN`) so they become
//!   [`CommError::Backend`] with MPI's message, instead of MPI killing the job;
//! - a panic hook prints the panic and calls `MPI_Abort`: an unwinding panic
//!   would otherwise reach `MPI_Finalize` and hang the whole job;
//! - a watchdog thread aborts the job if an operation outlives its deadline
//!   by the grace period without returning (the poll loop is the first line;
//!   the watchdog covers an engine call that itself blocks);
//! - a SIGTERM/SIGINT handler: when one rank dies or aborts, `mpirun` ends
//!   the others with SIGTERM before their own deadlines can fire; each then
//!   prints `rank R: terminated by signal S during OP: another rank failed
//!   …` (preformatted at init, written with the async-signal-safe `write`)
//!   and exits `128 + S`, so every surviving rank says what ended it.
//!
//! 16-bit sums: Open MPI 4 has no f16/bf16 type, so they are an all-gather
//! and a sum in f32 in rank order, rounded once (the same on every rank).
//! Counts are C `int`: a single slice above 2^31−1 bytes is refused.

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::os::raw::c_int;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, Instant};

use mpi::environment::Universe;
use mpi::ffi;
use mpi::Threading;

use crate::comm::{check_counts, check_gather_counts, displacements, Communicator, Deadline, ReduceBuf};
use crate::error::CommError;

const BACKEND: &str = "mpi";
/// How long past its deadline an operation may stay inside MPI before the
/// watchdog ends the job.
const WATCHDOG_GRACE: Duration = Duration::from_secs(2);

static WORLD_RANK: AtomicUsize = AtomicUsize::new(usize::MAX);
static PANIC_HOOK: Once = Once::new();

/// The operations a rank can be inside when the launcher ends it (index 0:
/// none). [`CURRENT_OP`] holds the index; the signal handler reads it.
const OPS: [&str; 8] =
    ["no operation", "all_gather_v", "all_to_all_v", "all_reduce", "broadcast", "barrier", "split", "an MPI operation"];
static CURRENT_OP: AtomicUsize = AtomicUsize::new(0);
/// One message per entry of [`OPS`], formatted before the handler exists.
static TERM_MESSAGES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();

/// Marks this rank as inside `op` until dropped.
struct InOp;

impl InOp {
    fn enter(op: &str) -> InOp {
        let i = OPS.iter().position(|o| *o == op).unwrap_or(OPS.len() - 1);
        CURRENT_OP.store(i, Ordering::SeqCst);
        InOp
    }
}

impl Drop for InOp {
    fn drop(&mut self) {
        CURRENT_OP.store(0, Ordering::SeqCst);
    }
}

extern "C" fn on_termination(sig: c_int) {
    // Async-signal-safe only: atomic loads, write(2), _exit.
    if let Some(msgs) = TERM_MESSAGES.get() {
        let i = CURRENT_OP.load(Ordering::SeqCst).min(OPS.len() - 1);
        let m = &msgs[i];
        let sig_name: &[u8] = if sig == libc::SIGINT { b" (SIGINT)\n" } else { b" (SIGTERM)\n" };
        unsafe {
            libc::write(2, m.as_ptr().cast(), m.len());
            libc::write(2, sig_name.as_ptr().cast(), sig_name.len());
        }
    }
    unsafe { libc::_exit(128 + sig) }
}

fn install_termination_handler(rank: usize) {
    let msgs = OPS
        .iter()
        .map(|op| {
            format!(
                "qsync-runtime: rank {rank}: terminated by the launcher during {op}: another rank failed (exited, aborted or timed out) and the job is being ended"
            )
            .into_bytes()
        })
        .collect();
    if TERM_MESSAGES.set(msgs).is_err() {
        return;
    }
    for sig in [libc::SIGTERM, libc::SIGINT] {
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_termination as extern "C" fn(c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// The watchdog's view of the operation in flight: milliseconds since
/// `epoch` after which it aborts the job (0: idle).
#[derive(Debug)]
struct Watch {
    epoch: Instant,
    abort_after_ms: AtomicU64,
}

impl Watch {
    fn arm(&self, deadline: Deadline) {
        let at = deadline.at.saturating_duration_since(self.epoch) + WATCHDOG_GRACE;
        self.abort_after_ms.store(at.as_millis().max(1) as u64, Ordering::SeqCst);
    }

    fn disarm(&self) {
        self.abort_after_ms.store(0, Ordering::SeqCst);
    }
}

/// State shared by the world communicator and its splits.
struct Shared {
    /// Finalizes MPI when the last communicator goes (unless poisoned).
    universe: RefCell<Option<Universe>>,
    poisoned: RefCell<Option<String>>,
    watch: Arc<Watch>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("poisoned", &self.poisoned.borrow()).finish()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.poisoned.borrow().is_some() {
            // MPI_Finalize would wait for peers that are gone or stalled: exit
            // without it, and the launcher reports the failure.
            if let Some(u) = self.universe.borrow_mut().take() {
                std::mem::forget(u);
            }
        }
    }
}

/// An MPI communicator (the world or a split of it).
#[derive(Debug)]
pub struct MpiComm {
    comm: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    /// For messages: errors name the world rank, whatever the group.
    world_rank: usize,
    /// Split communicators are freed on drop; the world is not.
    owned: bool,
    shared: Rc<Shared>,
}

impl MpiComm {
    /// Initializes MPI (thread level `MPI_THREAD_MULTIPLE`, so the watchdog
    /// may call `MPI_Abort`), installs the failure handling described in the
    /// module doc and returns the world communicator.
    pub fn init() -> Result<MpiComm, CommError> {
        let (universe, level) = mpi::initialize_with_threading(Threading::Multiple).ok_or(CommError::Backend {
            backend: BACKEND,
            op: "init",
            code: -1,
            message: "MPI is already initialized in this process".into(),
        })?;
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        check(unsafe { ffi::MPI_Comm_set_errhandler(world, ffi::RSMPI_ERRORS_RETURN) }, "init")?;
        let (rank, size) = rank_size(world)?;
        WORLD_RANK.store(rank, Ordering::SeqCst);
        install_panic_hook();
        install_termination_handler(rank);
        let watch = Arc::new(Watch { epoch: Instant::now(), abort_after_ms: AtomicU64::new(0) });
        if level == Threading::Multiple {
            spawn_watchdog(watch.clone(), rank);
        }
        Ok(MpiComm {
            comm: world,
            rank,
            size,
            world_rank: rank,
            owned: false,
            shared: Rc::new(Shared { universe: RefCell::new(Some(universe)), poisoned: RefCell::new(None), watch }),
        })
    }

    fn ensure_usable(&self) -> Result<(), CommError> {
        match &*self.shared.poisoned.borrow() {
            Some(why) => Err(CommError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    fn poison(&self, why: &CommError) {
        self.shared.poisoned.borrow_mut().get_or_insert_with(|| why.to_string());
    }

    /// Polls `req` until it completes or `deadline` passes. On timeout the
    /// `keep` buffers are leaked: MPI may still access them.
    fn wait<K>(
        &self,
        op: &'static str,
        mut req: ffi::MPI_Request,
        keep: K,
        deadline: Deadline,
    ) -> Result<K, CommError> {
        self.shared.watch.arm(deadline);
        let _in_op = InOp::enter(op);
        let mut polls = 0u32;
        let result = loop {
            let mut flag: c_int = 0;
            let rc = unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if rc != 0 {
                break Err(backend_error(rc, op));
            }
            if flag != 0 {
                break Ok(());
            }
            if deadline.expired() {
                break Err(CommError::Timeout { op, rank: self.world_rank, timeout: deadline.budget });
            }
            // Oversubscribed ranks must yield the core to the peers they
            // wait for; past the first polls, sleep briefly.
            polls += 1;
            if polls < 200 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        };
        self.shared.watch.disarm();
        match result {
            Ok(()) => Ok(keep),
            Err(e) => {
                std::mem::forget(keep);
                self.poison(&e);
                Err(e)
            }
        }
    }

    fn start(&self, op: &'static str, rc: c_int) -> Result<(), CommError> {
        check(rc, op).inspect_err(|e| self.poison(e))
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if self.owned && self.shared.poisoned.borrow().is_none() {
            unsafe { ffi::MPI_Comm_free(&mut self.comm) };
        }
    }
}

/// A zeroed buffer that MPI may own. Never an empty `Vec`'s dangling
/// pointer: an empty `Vec<u8>` points at address 1, which is Open MPI's
/// `MPI_IN_PLACE`.
fn owned<T: Copy + Default>(len: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(len.max(1));
    v.resize(len, T::default());
    v
}

fn owned_copy<T: Copy + Default>(src: &[T]) -> Vec<T> {
    let mut v = owned(0);
    v.extend_from_slice(src);
    v
}

fn rank_size(comm: ffi::MPI_Comm) -> Result<(usize, usize), CommError> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    check(unsafe { ffi::MPI_Comm_rank(comm, &mut rank) }, "comm_rank")?;
    check(unsafe { ffi::MPI_Comm_size(comm, &mut size) }, "comm_size")?;
    Ok((rank as usize, size as usize))
}

fn check(rc: c_int, op: &'static str) -> Result<(), CommError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(backend_error(rc, op))
    }
}

fn backend_error(code: c_int, op: &'static str) -> CommError {
    let mut buf = vec![0u8; 512];
    let mut len: c_int = 0;
    let message = if unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) } == 0 {
        buf.truncate((len.max(0) as usize).min(512));
        String::from_utf8_lossy(&buf).into_owned()
    } else {
        "unknown MPI error".into()
    };
    CommError::Backend { backend: BACKEND, op, code, message }
}

fn to_int(op: &'static str, n: usize) -> Result<c_int, CommError> {
    c_int::try_from(n).map_err(|_| CommError::Unsupported {
        backend: BACKEND,
        what: format!("{op}: {n} bytes exceed MPI's int count (2^31−1) in one slice"),
    })
}

fn to_ints(op: &'static str, v: &[usize]) -> Result<Vec<c_int>, CommError> {
    v.iter().map(|&n| to_int(op, n)).collect()
}

fn abort_world(code: c_int) -> ! {
    unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code) };
    std::process::exit(code)
}

fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let rank = WORLD_RANK.load(Ordering::SeqCst);
            eprintln!("qsync-runtime: rank {rank} panicked; calling MPI_Abort so the job ends instead of hanging");
            abort_world(101);
        }));
    });
}

fn spawn_watchdog(watch: Arc<Watch>, rank: usize) {
    let spawned = std::thread::Builder::new().name("qsync-mpi-watchdog".into()).spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        let at = watch.abort_after_ms.load(Ordering::SeqCst);
        if at != 0 && watch.epoch.elapsed().as_millis() as u64 > at {
            eprintln!("qsync-runtime: rank {rank}: an MPI operation outlived its deadline by {WATCHDOG_GRACE:?}; aborting the job");
            abort_world(124);
        }
    });
    // Without the thread the poll loop still enforces deadlines.
    drop(spawned);
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn split(&self, color: usize, key: usize, deadline: Deadline) -> Result<Box<dyn Communicator>, CommError> {
        // MPI_Comm_split blocks; once every rank has passed a barrier it
        // cannot wait on an absent peer.
        self.barrier(deadline)?;
        let (color, key) = (to_int("split", color)?, to_int("split", key)?);
        let mut comm: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        let _in_op = InOp::enter("split");
        self.start("split", unsafe { ffi::MPI_Comm_split(self.comm, color, key, &mut comm) })?;
        check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) }, "split")?;
        let (rank, size) = rank_size(comm)?;
        Ok(Box::new(MpiComm {
            comm,
            rank,
            size,
            world_rank: self.world_rank,
            owned: true,
            shared: self.shared.clone(),
        }))
    }

    fn all_gather(&self, send: &[u8], recv: &mut [u8], deadline: Deadline) -> Result<(), CommError> {
        if recv.len() != send.len() * self.size {
            return Err(CommError::InvalidArgument {
                op: "all_gather",
                detail: format!("{} recv bytes for {} ranks × {} bytes", recv.len(), self.size, send.len()),
            });
        }
        self.all_gather_v(send, recv, &vec![send.len(); self.size], deadline)
    }

    fn all_gather_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<(), CommError> {
        const OP: &str = "all_gather_v";
        self.ensure_usable()?;
        check_gather_counts(OP, counts, self.size, self.rank, send.len(), recv.len())?;
        let keep =
            (owned_copy(send), owned::<u8>(recv.len()), to_ints(OP, counts)?, to_ints(OP, &displacements(counts))?);
        let dt = unsafe { ffi::RSMPI_UINT8_T };
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let (s, mut r, c, d) = keep;
        self.start(OP, unsafe {
            ffi::MPI_Iallgatherv(
                s.as_ptr().cast(),
                to_int(OP, s.len())?,
                dt,
                r.as_mut_ptr().cast(),
                c.as_ptr(),
                d.as_ptr(),
                dt,
                self.comm,
                &mut req,
            )
        })?;
        let (_, r, _, _) = self.wait(OP, req, (s, r, c, d), deadline)?;
        recv.copy_from_slice(&r);
        Ok(())
    }

    fn all_to_all_v(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        deadline: Deadline,
    ) -> Result<(), CommError> {
        const OP: &str = "all_to_all_v";
        self.ensure_usable()?;
        check_counts(OP, send_counts, self.size, send.len())?;
        check_counts(OP, recv_counts, self.size, recv.len())?;
        let s = owned_copy(send);
        let mut r = owned::<u8>(recv.len());
        let sc = to_ints(OP, send_counts)?;
        let sd = to_ints(OP, &displacements(send_counts))?;
        let rc = to_ints(OP, recv_counts)?;
        let rd = to_ints(OP, &displacements(recv_counts))?;
        let dt = unsafe { ffi::RSMPI_UINT8_T };
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        self.start(OP, unsafe {
            ffi::MPI_Ialltoallv(
                s.as_ptr().cast(),
                sc.as_ptr(),
                sd.as_ptr(),
                dt,
                r.as_mut_ptr().cast(),
                rc.as_ptr(),
                rd.as_ptr(),
                dt,
                self.comm,
                &mut req,
            )
        })?;
        let (_, r, ..) = self.wait(OP, req, (s, r, sc, sd, rc, rd), deadline)?;
        recv.copy_from_slice(&r);
        Ok(())
    }

    fn all_reduce_sum(&self, buf: ReduceBuf<'_>, deadline: Deadline) -> Result<(), CommError> {
        const OP: &str = "all_reduce";
        self.ensure_usable()?;
        match buf {
            ReduceBuf::F32(b) => {
                let s = owned_copy(b);
                let mut r = owned::<f32>(b.len());
                let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
                self.start(OP, unsafe {
                    ffi::MPI_Iallreduce(
                        s.as_ptr().cast(),
                        r.as_mut_ptr().cast(),
                        to_int(OP, b.len())?,
                        ffi::RSMPI_FLOAT,
                        ffi::RSMPI_SUM,
                        self.comm,
                        &mut req,
                    )
                })?;
                let (_, r) = self.wait(OP, req, (s, r), deadline)?;
                b.copy_from_slice(&r);
                Ok(())
            }
            ReduceBuf::F16(b) => self.sum16(b, qsync_kernels::Half::F16, deadline),
            ReduceBuf::BF16(b) => self.sum16(b, qsync_kernels::Half::BF16, deadline),
        }
    }

    fn broadcast(&self, buf: &mut [u8], root: usize, deadline: Deadline) -> Result<(), CommError> {
        const OP: &str = "broadcast";
        self.ensure_usable()?;
        if root >= self.size {
            return Err(CommError::InvalidArgument { op: OP, detail: format!("root {root} of {} ranks", self.size) });
        }
        let mut b = owned_copy(buf);
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        self.start(OP, unsafe {
            ffi::MPI_Ibcast(
                b.as_mut_ptr().cast(),
                to_int(OP, b.len())?,
                ffi::RSMPI_UINT8_T,
                root as c_int,
                self.comm,
                &mut req,
            )
        })?;
        let b = self.wait(OP, req, b, deadline)?;
        buf.copy_from_slice(&b);
        Ok(())
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), CommError> {
        self.ensure_usable()?;
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        self.start("barrier", unsafe { ffi::MPI_Ibarrier(self.comm, &mut req) })?;
        self.wait("barrier", req, (), deadline)
    }

    fn abort(&self, code: i32) -> ! {
        abort_world(code)
    }
}

impl MpiComm {
    /// 16-bit sum: all-gather, then f32 accumulation in rank order and one
    /// rounding, so every rank computes the same bits.
    fn sum16(&self, b: &mut [u16], fmt: qsync_kernels::Half, deadline: Deadline) -> Result<(), CommError> {
        let send: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut all = vec![0u8; send.len() * self.size];
        self.all_gather(&send, &mut all, deadline)?;
        let (to, from) = match fmt {
            qsync_kernels::Half::F16 => (
                qsync_kernels::reference::f32_to_f16 as fn(f32) -> u16,
                qsync_kernels::reference::f16_to_f32 as fn(u16) -> f32,
            ),
            qsync_kernels::Half::BF16 => (
                qsync_kernels::reference::f32_to_bf16 as fn(f32) -> u16,
                qsync_kernels::reference::bf16_to_f32 as fn(u16) -> f32,
            ),
        };
        for (i, v) in b.iter_mut().enumerate() {
            let mut acc = 0f32;
            for r in 0..self.size {
                let o = r * send.len() + 2 * i;
                acc += from(u16::from_le_bytes([all[o], all[o + 1]]));
            }
            *v = to(acc);
        }
        Ok(())
    }
}
