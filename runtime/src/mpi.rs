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

use std::cell::{Cell, RefCell};
use std::os::raw::c_int;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, Instant};

use mpi::environment::Universe;
use mpi::ffi;
use mpi::Threading;

use crate::comm::{check_counts, check_gather_counts, displacements, Communicator, Deadline, Pending, ReduceBuf};
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
/// The last operation entered or started (a pipelined scheme runs kernels
/// while its exchanges are in flight, inside no call): what the handler
/// names when [`CURRENT_OP`] is 0.
static LAST_OP: AtomicUsize = AtomicUsize::new(0);
/// One message per entry of [`OPS`], formatted before the handler exists.
static TERM_MESSAGES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();

/// Marks this rank as inside `op` until dropped.
struct InOp;

impl InOp {
    fn enter(op: &str) -> InOp {
        let i = op_index(op);
        CURRENT_OP.store(i, Ordering::SeqCst);
        LAST_OP.store(i, Ordering::SeqCst);
        InOp
    }
}

fn op_index(op: &str) -> usize {
    OPS.iter().position(|o| *o == op).unwrap_or(OPS.len() - 1)
}

impl Drop for InOp {
    fn drop(&mut self) {
        CURRENT_OP.store(0, Ordering::SeqCst);
    }
}

extern "C" fn on_termination(sig: c_int) {
    // Async-signal-safe only: atomic loads, write(2), _exit.
    if let Some(msgs) = TERM_MESSAGES.get() {
        let (during, last) = (CURRENT_OP.load(Ordering::SeqCst), LAST_OP.load(Ordering::SeqCst));
        // Entries past OPS.len(): OP started, the rank between calls.
        let i = if during == 0 && last != 0 { OPS.len() + last.min(OPS.len() - 1) } else { during.min(OPS.len() - 1) };
        let m = &msgs[i.min(msgs.len() - 1)];
        let sig_name: &[u8] = if sig == libc::SIGINT { b" (SIGINT)\n" } else { b" (SIGTERM)\n" };
        unsafe {
            libc::write(2, m.as_ptr().cast(), m.len());
            libc::write(2, sig_name.as_ptr().cast(), sig_name.len());
        }
    }
    unsafe { libc::_exit(128 + sig) }
}

fn install_termination_handler(rank: usize) {
    let ended = "another rank failed (exited, aborted or timed out) and the job is being ended";
    let msgs = OPS
        .iter()
        .map(|op| format!("qsync-runtime: rank {rank}: terminated by the launcher during {op}: {ended}"))
        .chain(OPS.iter().map(|op| {
            format!("qsync-runtime: rank {rank}: terminated by the launcher during {op} (started and in flight while the rank ran kernels): {ended}")
        }))
        .map(String::into_bytes)
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
    /// Started exchanges, for their point-to-point tags (every rank starts
    /// the same sequence, so the counters agree).
    exchanges: Cell<u32>,
}

impl MpiComm {
    /// Initializes MPI (thread level `MPI_THREAD_MULTIPLE`, so the watchdog
    /// may call `MPI_Abort`), installs the failure handling described in the
    /// module doc and returns the world communicator. Before `MPI_Init` it
    /// sets [`TCP_EAGER_LIMIT_VAR`] in the process environment unless the
    /// user did: call it before starting threads that read the environment.
    pub fn init() -> Result<MpiComm, CommError> {
        raise_tcp_eager_limit();
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
            exchanges: Cell::new(0),
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
            backoff();
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

/// Open MPI's TCP transport sends a message larger than its eager limit
/// (`btl_tcp_eager_limit`, 64 KiB by default) in two phases: a first
/// fragment, then the rest once the receiver has matched it and answered.
/// Both ends act only inside MPI calls, so a pipelined scheme's piece
/// (512 KiB of 16-bit values a peer) waits for the peer to leave its
/// kernels before its bulk may leave, and the wire idles while both ranks
/// compute: on a 1 Gbit/s emulated link, fp16 at 64 MiB took 0.321 s with
/// the default against 0.281 s with pieces sent eagerly, its link time
/// (docs/runtime.md). Eager pieces go straight into the sockets, whose
/// buffers carry them while the ranks compute. The limit covers a piece of
/// the default pipeline in 16-bit values or qgZ blocks, with room for
/// headers, and no more: at 1 MiB and above, n-bit's 4 MiB all-gather at
/// 40 Gbit/s took 30% longer (qgZ gathered in f32, 1 MiB pieces, keeps the
/// two phases).
pub const TCP_EAGER_LIMIT: usize = 2 * crate::scheme::DEFAULT_PIPELINE_CHUNK + 65536;

/// The environment variable Open MPI reads `btl_tcp_eager_limit` from
/// (`mpirun --mca btl_tcp_eager_limit N` sets it too).
pub const TCP_EAGER_LIMIT_VAR: &str = "OMPI_MCA_btl_tcp_eager_limit";

/// Sets [`TCP_EAGER_LIMIT_VAR`] to [`TCP_EAGER_LIMIT`] unless the user set
/// it (in the environment or with `mpirun --mca`), before `MPI_Init`
/// reads it. Other MPI libraries ignore the variable.
fn raise_tcp_eager_limit() {
    if std::env::var_os(TCP_EAGER_LIMIT_VAR).is_none() {
        std::env::set_var(TCP_EAGER_LIMIT_VAR, TCP_EAGER_LIMIT.to_string());
    }
}

/// The value of an integer MPI control variable (`MPI_T`), as the library
/// holds it after `MPI_Init`; `None` where the library has no such variable
/// (another MPI, or a transport not loaded) or it is not an integer.
pub fn control_variable(name: &str) -> Option<u64> {
    let cname = std::ffi::CString::new(name).ok()?;
    let mut provided: c_int = 0;
    // SAFETY: MPI_T may be initialized any number of times, each paired
    // with a finalize; every out-pointer is a live local.
    if unsafe { ffi::MPI_T_init_thread(ffi::MPI_THREAD_MULTIPLE as c_int, &mut provided) } != 0 {
        return None;
    }
    let value = (|| {
        let mut index: c_int = 0;
        if unsafe { ffi::MPI_T_cvar_get_index(cname.as_ptr(), &mut index) } != 0 {
            return None;
        }
        let mut handle: ffi::MPI_T_cvar_handle = std::ptr::null_mut();
        let mut count: c_int = 0;
        if unsafe { ffi::MPI_T_cvar_handle_alloc(index, std::ptr::null_mut(), &mut handle, &mut count) } != 0 {
            return None;
        }
        // Room for any integer type; the variable's own size says which.
        let mut buf = [0u8; 16];
        let ok = count == 1 && unsafe { ffi::MPI_T_cvar_read(handle, buf.as_mut_ptr().cast()) } == 0;
        unsafe { ffi::MPI_T_cvar_handle_free(&mut handle) };
        if !ok {
            return None;
        }
        let mut name_len: c_int = 0;
        let mut desc_len: c_int = 0;
        let (mut verbosity, mut bind, mut scope): (c_int, c_int, c_int) = (0, 0, 0);
        let mut dt: ffi::MPI_Datatype = unsafe { ffi::RSMPI_UINT8_T };
        let mut en: ffi::MPI_T_enum = std::ptr::null_mut();
        let rc = unsafe {
            ffi::MPI_T_cvar_get_info(
                index,
                std::ptr::null_mut(),
                &mut name_len,
                &mut verbosity,
                &mut dt,
                &mut en,
                std::ptr::null_mut(),
                &mut desc_len,
                &mut bind,
                &mut scope,
            )
        };
        if rc != 0 {
            return None;
        }
        let mut size: c_int = 0;
        if unsafe { ffi::MPI_Type_size(dt, &mut size) } != 0 {
            return None;
        }
        match size {
            4 => Some(u64::from(u32::from_ne_bytes(buf[..4].try_into().ok()?))),
            8 => Some(u64::from_ne_bytes(buf[..8].try_into().ok()?)),
            _ => None,
        }
    })();
    unsafe { ffi::MPI_T_finalize() };
    value
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

/// How long a rank whose operation failed waits before it aborts the job
/// ([`Communicator::abort`]). The ranks of a failed collective fail within
/// moments of each other (its deadline passes for all of them), and once an
/// abort is under way Open MPI may drop what the other ranks write: waiting
/// lets each report its own operation first (an emulated link cut mid-job
/// once lost rank 0's message, 1 run in 15). The panic hook and the
/// watchdog abort at once: a panic is one rank's, and the watchdog has
/// already waited [`WATCHDOG_GRACE`] past the deadline.
const REPORT_WINDOW: Duration = Duration::from_secs(2);

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
            let op = OPS[CURRENT_OP.load(Ordering::SeqCst).min(OPS.len() - 1)];
            eprintln!("qsync-runtime: rank {rank}: {op} (inside MPI) outlived its deadline by {WATCHDOG_GRACE:?}; aborting the job");
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
        const OP: &str = "split";
        self.ensure_usable()?;
        let (color, key) = (to_int(OP, color)?, to_int(OP, key)?);
        // MPI has no non-blocking split. A rendezvous polled against the
        // deadline comes first (a rank that is gone or stalled before the
        // split is a timeout naming `split`), then the blocking call runs
        // with the watchdog armed: a rank lost between the two ends the job
        // with a message naming `split` once the deadline has passed,
        // instead of leaving every other rank blocked in MPI forever.
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        self.start(OP, unsafe { ffi::MPI_Ibarrier(self.comm, &mut req) })?;
        self.wait(OP, req, (), deadline)?;
        let mut comm: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        self.shared.watch.arm(deadline);
        let rc = {
            let _in_op = InOp::enter(OP);
            unsafe { ffi::MPI_Comm_split(self.comm, color, key, &mut comm) }
        };
        self.shared.watch.disarm();
        self.start(OP, rc)?;
        check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) }, OP)?;
        let (rank, size) = rank_size(comm)?;
        Ok(Box::new(MpiComm {
            comm,
            rank,
            size,
            world_rank: self.world_rank,
            owned: true,
            shared: self.shared.clone(),
            exchanges: Cell::new(0),
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

    fn overlaps_transfers(&self) -> bool {
        true
    }

    fn start_all_to_all_v(
        &self,
        send: Vec<u8>,
        send_counts: &[usize],
        recv_counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        const OP: &str = "all_to_all_v";
        self.ensure_usable()?;
        check_counts(OP, send_counts, self.size, send.len())?;
        check_counts(OP, recv_counts, self.size, recv_counts.iter().sum())?;
        let send_at = displacements(send_counts);
        self.start_pairwise(OP, send, &send_at, send_counts, recv_counts, deadline)
    }

    fn start_all_gather_v(
        &self,
        send: Vec<u8>,
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        const OP: &str = "all_gather_v";
        self.ensure_usable()?;
        let total = counts.iter().sum();
        check_gather_counts(OP, counts, self.size, self.rank, send.len(), total)?;
        // The same bytes to every peer.
        let send_counts = vec![send.len(); self.size];
        let send_at = vec![0; self.size];
        self.start_pairwise(OP, send, &send_at, &send_counts, counts, deadline)
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
        std::thread::sleep(REPORT_WINDOW);
        abort_world(code)
    }
}

/// An exchange in flight: one `MPI_Isend` / `MPI_Irecv` per peer (pairwise
/// point-to-point messages, which Open MPI's PML streams straight to each
/// peer's socket, rather than a non-blocking collective's schedule of
/// rounds). Owns its buffers until every request completed.
pub struct MpiPending {
    op: &'static str,
    reqs: Vec<ffi::MPI_Request>,
    send: Vec<u8>,
    recv: Vec<u8>,
    shared: Rc<Shared>,
    world_rank: usize,
    finished: bool,
}

impl std::fmt::Debug for MpiPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiPending")
            .field("op", &self.op)
            .field("requests", &self.reqs.len())
            .field("send", &self.send.len())
            .field("recv", &self.recv.len())
            .field("finished", &self.finished)
            .finish()
    }
}

impl MpiPending {
    fn poll(&mut self) -> Result<bool, CommError> {
        if self.finished || self.reqs.is_empty() {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        let n = self.reqs.len() as c_int;
        let rc = unsafe { ffi::MPI_Testall(n, self.reqs.as_mut_ptr(), &mut flag, ffi::RSMPI_STATUSES_IGNORE) };
        if rc != 0 {
            return Err(backend_error(rc, self.op));
        }
        Ok(flag != 0)
    }

    fn fail(&mut self, e: CommError) -> CommError {
        self.shared.poisoned.borrow_mut().get_or_insert_with(|| e.to_string());
        e
    }
}

impl Pending for MpiPending {
    fn test(&mut self) -> Result<bool, CommError> {
        self.poll().map_err(|e| self.fail(e))
    }

    fn wait(mut self: Box<Self>, deadline: Deadline) -> Result<Vec<u8>, CommError> {
        self.shared.watch.arm(deadline);
        let _in_op = InOp::enter(self.op);
        let result = loop {
            match self.poll() {
                Err(e) => break Err(e),
                Ok(true) => break Ok(()),
                Ok(false) => {}
            }
            if deadline.expired() {
                break Err(CommError::Timeout { op: self.op, rank: self.world_rank, timeout: deadline.budget });
            }
            backoff();
        };
        self.shared.watch.disarm();
        match result {
            Ok(()) => {
                self.finished = true;
                Ok(std::mem::take(&mut self.recv))
            }
            // Unfinished: the drop leaks the buffers MPI may still touch.
            Err(e) => Err(self.fail(e)),
        }
    }
}

impl Drop for MpiPending {
    fn drop(&mut self) {
        if !self.finished && !self.reqs.is_empty() && self.poll().ok() != Some(true) {
            std::mem::forget(std::mem::take(&mut self.send));
            std::mem::forget(std::mem::take(&mut self.recv));
            let why = format!("rank {}: an {} exchange was abandoned in flight", self.world_rank, self.op);
            self.shared.poisoned.borrow_mut().get_or_insert(why);
        }
    }
}

/// Between polls of a request: yield the core, never sleep. Open MPI's TCP
/// transport moves bytes only inside `MPI_Test`, so a rank asleep between
/// polls leaves its sockets idle: sleeping 100 µs after 200 polls made
/// qgz-int4 over a 10 Gbit/s emulated link 1.6× slower (0.344 s against
/// 0.216 s at 64 MiB, 2 nodes × 2 ranks, `scripts/validate/sync.py`). A
/// yield still hands an oversubscribed core to the peer being waited for;
/// on a core of its own the rank polls as MPI's own blocking calls do. The
/// deadline bounds a wait on a dead peer.
fn backoff() {
    std::thread::yield_now();
}

impl MpiComm {
    /// The next exchange's tag (MPI guarantees tags up to 32767).
    fn next_tag(&self) -> c_int {
        let n = self.exchanges.get();
        self.exchanges.set(n.wrapping_add(1));
        (n % 32_000) as c_int
    }

    /// Posts one receive per peer with bytes for this rank, then one send
    /// per peer it has bytes for (peers in a rotated order, so the ranks
    /// do not all start with rank 0); copies its own slice locally.
    #[allow(clippy::too_many_arguments)]
    fn start_pairwise(
        &self,
        op: &'static str,
        send: Vec<u8>,
        send_at: &[usize],
        send_counts: &[usize],
        recv_counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        let (p, me) = (self.size, self.rank);
        if send_counts[me] != recv_counts[me] {
            return Err(CommError::InvalidArgument {
                op,
                detail: format!("rank {me} sends itself {} bytes but expects {}", send_counts[me], recv_counts[me]),
            });
        }
        let recv_at = displacements(recv_counts);
        let tag = self.next_tag();
        LAST_OP.store(op_index(op), Ordering::SeqCst);
        let mut x = MpiPending {
            op,
            reqs: Vec::with_capacity(2 * p),
            send: if send.is_empty() { owned(0) } else { send },
            recv: owned(recv_counts.iter().sum()),
            shared: self.shared.clone(),
            world_rank: self.world_rank,
            finished: false,
        };
        x.recv[recv_at[me]..recv_at[me] + recv_counts[me]]
            .copy_from_slice(&x.send[send_at[me]..send_at[me] + send_counts[me]]);
        let dt = unsafe { ffi::RSMPI_UINT8_T };
        let posted = (|| {
            for k in 1..p {
                let j = (me + p - k) % p;
                if recv_counts[j] == 0 {
                    continue;
                }
                let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
                let buf = unsafe { x.recv.as_mut_ptr().add(recv_at[j]) };
                let n = to_int(op, recv_counts[j])?;
                check(unsafe { ffi::MPI_Irecv(buf.cast(), n, dt, j as c_int, tag, self.comm, &mut req) }, op)?;
                x.reqs.push(req);
            }
            for k in 1..p {
                let j = (me + k) % p;
                if send_counts[j] == 0 {
                    continue;
                }
                let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
                let buf = unsafe { x.send.as_ptr().add(send_at[j]) };
                let n = to_int(op, send_counts[j])?;
                check(unsafe { ffi::MPI_Isend(buf.cast(), n, dt, j as c_int, tag, self.comm, &mut req) }, op)?;
                x.reqs.push(req);
            }
            Ok(())
        })();
        // A deadline only bounds the wait; starting never blocks.
        let _ = deadline;
        match posted {
            Ok(()) => Ok(Box::new(x)),
            Err(e) => {
                self.poison(&e);
                // Dropping `x` unfinished leaks what was posted.
                Err(e)
            }
        }
    }

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
