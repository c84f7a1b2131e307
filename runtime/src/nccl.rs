//! The NCCL backend, through `cudarc` 0.19's lower-level `nccl::sys` and
//! `driver::result` modules with dynamic loading: the crate builds, and this
//! module runs, on machines without CUDA. The safe `cudarc::nccl::Comm` is
//! not used: it has no abort, no split, no asynchronous-error query and it
//! panics on drop when NCCL fails.
//!
//! **Libraries.** A missing `libcuda` or `libnccl` is
//! [`CommError::LibraryMissing`] naming what was searched, never cudarc's
//! panic on first use: every sys module's `is_culib_present()` is checked
//! ([`probe`]) before any symbol is touched. The trap: cudarc opens
//! `libnccl.so` or `libnccl.so.{13,12,11,10,9,1}`, while the PyPI wheel
//! `nvidia-nccl-cu13` ships only `libnccl.so.2`. [`probe`] searches the usual
//! places for `libnccl.so.2` (`$QSYNC_NCCL_LIB_DIR`, `$LD_LIBRARY_PATH`, the
//! system library directories, the wheel's directory given by Python's
//! `nvidia.nccl.__path__`) and, when it finds one cudarc cannot open, says
//! how to expose it (a `libnccl.so` symlink in a directory on
//! `LD_LIBRARY_PATH`; `scripts/gpu-sync-check.sh` does this). The bindings
//! are NCCL 2.30's (cudarc feature `cuda-13000`); an NCCL older than 2.18
//! (no `ncclCommSplit`) is refused as [`CommError::Unsupported`] rather than
//! risking cudarc's "Missing symbol" panic.
//!
//! **Bootstrap.** No MPI on the GPU machines: [`spawn_local`] (the launcher)
//! makes the NCCL unique id (`ncclGetUniqueId`; the launcher process hosts
//! NCCL's bootstrap root and outlives the ranks) and starts `N` copies of a
//! program with the id in hex in `$QSYNC_NCCL_ID`, the rank in
//! `$QSYNC_RANK`, the world size in `$QSYNC_WORLD_SIZE` (and
//! `NCCL_MULTI_RANK_GPU_ENABLE=1`, so several ranks may share one GPU: NCCL
//! ≥ 2.30). Each rank calls [`NcclComm::from_env`]. The device is
//! `$QSYNC_CUDA_DEVICE`, else `rank % device count`.
//!
//! **Non-blocking communicators.** Every communicator is created with
//! `ncclCommInitRankConfig` and a hand-filled `ncclConfig_t` (size, magic
//! `0xcafebeef`, version, `blocking = 0`, every other field NCCL's "unset"
//! value `INT_MIN` / null). Each call enqueues its work, then polls
//! `ncclCommGetAsyncError` (7, in progress: keep polling) and, once the
//! work is enqueued, `cuStreamQuery` on the communicator's stream until it
//! completes or the call's [`Deadline`] passes. A deadline that passes
//! aborts every communicator of the process (`ncclCommAbort`: NCCL's kernels
//! stop waiting) and returns [`CommError::Timeout`] naming the operation;
//! NCCL's remote error (6) is [`CommError::PeerFailed`]; any other NCCL or
//! CUDA code is [`CommError::Backend`] with the code and NCCL's own message
//! (`ncclGetErrorString` + `ncclGetLastError`). After any failure the
//! process's communicators are poisoned (later calls fail fast) and dropped
//! with `ncclCommAbort`, never `ncclCommDestroy` (which can wait forever for
//! a dead peer); a healthy communicator is finalized (polled, bounded) and
//! destroyed. A panic hook aborts the communicators and exits, so a
//! panicking rank ends instead of leaving its peers waiting.
//!
//! **Buffers.** The [`Communicator`] trait moves host slices (every scheme
//! quantizes and reduces on the host, with `qsync-kernels`' reference
//! arithmetic, so its results are bit-identical on every backend by
//! construction — the PTX twins of those kernels are not launched here).
//! Each call copies its input to device staging buffers on the
//! communicator's stream (grown on demand, shared by a world and its
//! splits), runs the NCCL operation there, and copies the result back
//! after the stream is idle (a device-to-pageable copy blocks, so it is
//! never issued behind a collective that might hang).
//!
//! **Operations.** All-gather is `ncclAllGather`; all-gather-v and
//! all-to-all(-v) are grouped `ncclSend`/`ncclRecv` of `ncclUint8` (one
//! pair per peer, the rank's own slice copied on the host); all-reduce is
//! `ncclAllReduce` (f32, f16, bf16 sum, in NCCL's order and 16-bit
//! arithmetic); broadcast is in-place `ncclBroadcast`; the barrier is a
//! one-element all-reduce; `split` is `ncclCommSplit` (non-blocking, polled
//! on the new communicator); `abort` aborts every communicator and exits.

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use cudarc::driver::result as cu;
use cudarc::driver::sys as cus;
use cudarc::nccl::sys as nc;

use crate::comm::{check_counts, check_gather_counts, displacements, Communicator, Deadline, ReduceBuf};
use crate::error::CommError;

const BACKEND: &str = "nccl";
/// The NCCL unique id, 256 hex digits.
pub const ENV_ID: &str = "QSYNC_NCCL_ID";
/// This process's rank.
pub const ENV_RANK: &str = "QSYNC_RANK";
/// The number of ranks.
pub const ENV_WORLD: &str = "QSYNC_WORLD_SIZE";
/// The CUDA device ordinal (default: rank modulo the device count).
pub const ENV_DEVICE: &str = "QSYNC_CUDA_DEVICE";
/// `ncclCommSplit` and `ncclCommInitRankConfig` with non-blocking configs.
const MIN_VERSION: i32 = 21800;
/// `NCCL_VERSION(2, 30, 0)`: the `ncclConfig_t` layout of cudarc's bindings.
const CONFIG_VERSION: u32 = 23000;
/// How long a healthy communicator's drop waits for `ncclCommFinalize`
/// before it aborts instead.
const FINALIZE_BUDGET: Duration = Duration::from_secs(10);

/// What [`probe`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclInfo {
    /// `ncclGetVersion`, e.g. 23007 for 2.30.7.
    pub version: i32,
}

/// Directories where a `libnccl.so.2` may live.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["QSYNC_NCCL_LIB_DIR", "LD_LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    dirs.extend(
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/cuda/lib64", "/usr/local/lib"]
            .map(PathBuf::from),
    );
    // The pip wheel: `nvidia.nccl` is a namespace package (no __file__).
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if let Ok(out) = std::process::Command::new(py)
        .args(["-c", "import nvidia.nccl as m; print(list(m.__path__)[0])"])
        .stderr(std::process::Stdio::null())
        .output()
    {
        if out.status.success() {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !p.is_empty() {
                dirs.push(Path::new(&p).join("lib"));
            }
        }
    }
    dirs
}

/// Checks that the CUDA driver and NCCL can be loaded and returns NCCL's
/// version; otherwise a [`CommError::LibraryMissing`] that lists what was
/// searched and, if a wheel's `libnccl.so.2` exists, how to expose it.
pub fn probe() -> Result<NcclInfo, CommError> {
    let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
    let nccl_present = unsafe { cudarc::nccl::sys::is_culib_present() };
    if !nccl_present {
        let candidates = cudarc::get_lib_name_candidates("nccl").join(", ");
        let dirs = search_dirs();
        let found: Vec<PathBuf> = dirs.iter().map(|d| d.join("libnccl.so.2")).filter(|p| p.exists()).collect();
        let hint = match found.first() {
            Some(p) => format!(
                "; found {} but cudarc opens only the names above: link it as libnccl.so in a directory on LD_LIBRARY_PATH",
                p.display()
            ),
            None => String::new(),
        };
        return Err(CommError::LibraryMissing {
            library: "NCCL (libnccl)".into(),
            searched: format!(
                "the loader's path for {candidates}; libnccl.so.2 in {}{hint}",
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":")
            ),
        });
    }
    if !driver_present {
        return Err(CommError::LibraryMissing {
            library: "the CUDA driver (libcuda)".into(),
            searched: format!(
                "the loader's path for {} (no NVIDIA driver on this machine?)",
                cudarc::get_lib_name_candidates("cuda").join(", ")
            ),
        });
    }
    let version = cudarc::nccl::result::get_nccl_version().map_err(|e| CommError::Backend {
        backend: "nccl",
        op: "get_version",
        code: e.0 as i32,
        message: format!("{e:?}"),
    })?;
    Ok(NcclInfo { version })
}

/// Every live NCCL communicator of this process (as addresses), so a
/// failure, `abort` or a panic can abort them all. A handle leaves the list
/// when it is aborted or destroyed, so none is released twice.
static LIVE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static PANIC_HOOK: Once = Once::new();

fn live() -> std::sync::MutexGuard<'static, Vec<usize>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Aborts every live communicator (never blocks on peers).
fn abort_all() {
    let comms: Vec<usize> = std::mem::take(&mut *live());
    for c in comms {
        unsafe { nc::ncclCommAbort(c as nc::ncclComm_t) };
    }
}

fn install_panic_hook(rank: usize) {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            eprintln!("qsync-runtime: rank {rank} panicked; aborting its NCCL communicators and exiting so the job ends instead of hanging");
            abort_all();
            std::process::exit(101);
        }));
    });
}

/// An NCCL unique id (the bootstrap handle every rank of a communicator
/// must share).
#[derive(Copy, Clone)]
pub struct UniqueId(nc::ncclUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}…)", &self.to_hex()[..16])
    }
}

impl UniqueId {
    /// A fresh id (`ncclGetUniqueId`). The calling process hosts NCCL's
    /// bootstrap root: it must live until every rank has initialized.
    pub fn new() -> Result<UniqueId, CommError> {
        nccl_loadable()?;
        let mut id = nc::ncclUniqueId { internal: [0; 128] };
        let r = unsafe { nc::ncclGetUniqueId(&mut id) };
        if r != nc::ncclResult_t::ncclSuccess {
            return Err(nccl_error(std::ptr::null_mut(), r, "get_unique_id", usize::MAX));
        }
        Ok(UniqueId(id))
    }

    pub fn to_hex(&self) -> String {
        self.0.internal.iter().map(|&b| format!("{:02x}", b as u8)).collect()
    }

    pub fn from_hex(s: &str) -> Result<UniqueId, CommError> {
        let bad = |detail: String| CommError::InvalidArgument { op: "init", detail };
        let s = s.trim();
        if s.len() != 256 || !s.is_ascii() {
            return Err(bad(format!("${ENV_ID} must be 256 hex digits, got {} characters", s.len())));
        }
        let mut id = nc::ncclUniqueId { internal: [0; 128] };
        for (i, byte) in id.internal.iter_mut().enumerate() {
            let v = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| bad(format!("${ENV_ID} is not hex at position {}", 2 * i)))?;
            *byte = v as std::os::raw::c_char;
        }
        Ok(UniqueId(id))
    }
}

/// `libnccl` can be opened (no CUDA driver needed).
fn nccl_loadable() -> Result<(), CommError> {
    match probe() {
        Ok(_) => Ok(()),
        // The unique id needs NCCL only: a missing driver is the ranks' error.
        Err(CommError::LibraryMissing { library, .. }) if library.contains("libcuda") => Ok(()),
        Err(e) => Err(e),
    }
}

fn c_str(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// NCCL's code, its name and the communicator's last error message.
/// Whether an NCCL call was accepted: done, or (non-blocking
/// communicators) still in progress, to be polled.
fn accepted(r: nc::ncclResult_t) -> bool {
    matches!(r, nc::ncclResult_t::ncclSuccess | nc::ncclResult_t::ncclInProgress)
}

fn nccl_error(comm: nc::ncclComm_t, r: nc::ncclResult_t, op: &'static str, rank: usize) -> CommError {
    let name = c_str(unsafe { nc::ncclGetErrorString(r) });
    let last = c_str(unsafe { nc::ncclGetLastError(comm) });
    let message = if last.is_empty() { name } else { format!("{name}: {last}") };
    match r {
        nc::ncclResult_t::ncclRemoteError => CommError::PeerFailed { op, rank, detail: message },
        _ => CommError::Backend { backend: BACKEND, op, code: r as i32, message },
    }
}

fn cuda_error(e: cu::DriverError, op: &'static str) -> CommError {
    let message = match e.error_string() {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => format!("{:?}", e.0),
    };
    CommError::Backend { backend: "cuda", op, code: e.0 as i32, message }
}

/// A non-blocking config (see the module doc); NCCL's `INT_MIN` / null mean
/// "unset: use the default".
fn config() -> nc::ncclConfig_t {
    const UNSET: c_int = c_int::MIN;
    nc::ncclConfig_t {
        size: std::mem::size_of::<nc::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: CONFIG_VERSION,
        blocking: 0,
        cgaClusterSize: UNSET,
        minCTAs: UNSET,
        maxCTAs: UNSET,
        netName: std::ptr::null(),
        splitShare: UNSET,
        trafficClass: UNSET,
        commName: std::ptr::null(),
        collnetEnable: UNSET,
        CTAPolicy: UNSET,
        shrinkShare: UNSET,
        nvlsCTAs: UNSET,
        nChannelsPerNetPeer: UNSET,
        nvlinkCentricSched: UNSET,
        graphUsageMode: UNSET,
        numRmaCtx: UNSET,
        maxP2pPeers: UNSET,
    }
}

/// A device staging buffer (grown on demand).
#[derive(Debug, Default)]
struct DevBuf {
    ptr: cus::CUdeviceptr,
    cap: usize,
}

/// A page-locked host staging buffer (grown on demand). Copies between it
/// and the device run at the host link's rate; from pageable memory the
/// driver stages them itself in small pieces, several times slower (on the
/// lent H100 machine about 1 GB/s against tens).
#[derive(Debug, Default)]
struct HostBuf {
    ptr: usize,
    cap: usize,
}

/// The staging buffers of a device (see [`Device::staging`]): the device
/// buffers NCCL reads and writes, and the pinned host buffers every copy
/// to and from them goes through.
#[derive(Debug, Default)]
struct Staging {
    send: DevBuf,
    recv: DevBuf,
    host_send: HostBuf,
    host_recv: HostBuf,
}

/// What a world communicator and its splits share: the device context, one
/// stream, the staging buffers and the poisoned flag. Communicators split
/// from one another may be used from different threads (the Python module
/// gives each DDP bucket its own split), so everything that changes is
/// behind a lock: `staging` is held for the whole of each operation — the
/// stream and the staging buffers serve one operation at a time, whichever
/// communicator of the device runs it.
struct Device {
    ordinal: usize,
    ctx: cus::CUcontext,
    stream: cus::CUstream,
    staging: Mutex<Staging>,
    poisoned: Mutex<Option<String>>,
    world_rank: usize,
}

// SAFETY: `ctx` (a primary context), `stream` and the staging buffers'
// device pointers are CUDA driver handles, which the driver lets any thread
// use; every operation first makes `ctx` current on the calling thread
// (`NcclComm::ensure_usable`). After creation the handles themselves never
// change; what changes — the staging buffers and the work on the stream —
// is only touched while holding `staging` (one operation at a time, on any
// thread), and the poisoned flag is behind its own `Mutex`. So moving a
// `Device` to another thread, or using `&Device` from several, cannot race.
unsafe impl Send for Device {}
// SAFETY: as for `Send` above: every mutation goes through a `Mutex`.
unsafe impl Sync for Device {}

/// A mutex's contents even after a panic while it was held (the state is
/// plain data; a panic poisons the communicators through `poisoned`).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("ordinal", &self.ordinal).field("poisoned", &*lock(&self.poisoned)).finish()
    }
}

impl Device {
    fn open(ordinal: Option<usize>, rank: usize) -> Result<Device, CommError> {
        const OP: &str = "init";
        cu::init().map_err(|e| cuda_error(e, OP))?;
        let count = cu::device::get_count().map_err(|e| cuda_error(e, OP))?;
        if count <= 0 {
            return Err(CommError::Backend {
                backend: "cuda",
                op: OP,
                code: 100,
                message: "no CUDA device is visible".into(),
            });
        }
        let ordinal = ordinal.unwrap_or(rank % count as usize);
        if ordinal >= count as usize {
            return Err(CommError::InvalidArgument {
                op: OP,
                detail: format!("CUDA device {ordinal} requested, {count} visible"),
            });
        }
        let dev = cu::device::get(ordinal as c_int).map_err(|e| cuda_error(e, OP))?;
        let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(|e| cuda_error(e, OP))?;
        unsafe { cu::ctx::set_current(ctx) }.map_err(|e| cuda_error(e, OP))?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(|e| cuda_error(e, OP))?;
        Ok(Device { ordinal, ctx, stream, staging: Mutex::default(), poisoned: Mutex::new(None), world_rank: rank })
    }

    fn nccl_stream(&self) -> nc::cudaStream_t {
        self.stream.cast()
    }

    /// The staging buffers and the stream, for one whole operation.
    fn stage(&self) -> MutexGuard<'_, Staging> {
        lock(&self.staging)
    }

    /// Device pointers to staging buffers of at least `send` and `recv`
    /// bytes. Only called while the stream is idle, with `stage` held.
    fn buffers(stage: &mut Staging, op: &'static str, send: usize, recv: usize) -> Result<(u64, u64), CommError> {
        let grow = |b: &mut DevBuf, len: usize| -> Result<u64, CommError> {
            if b.cap < len.max(1) {
                if b.ptr != 0 {
                    unsafe { cu::free_sync(b.ptr) }.map_err(|e| cuda_error(e, op))?;
                    *b = DevBuf::default();
                }
                let cap = len.max(4096).next_power_of_two();
                b.ptr = unsafe { cu::malloc_sync(cap) }.map_err(|e| cuda_error(e, op))?;
                b.cap = cap;
            }
            Ok(b.ptr)
        };
        Ok((grow(&mut stage.send, send)?, grow(&mut stage.recv, recv)?))
    }

    /// A pinned host buffer of at least `len` bytes. Only called while the
    /// stream is idle, with `stage` held.
    fn host(b: &mut HostBuf, op: &'static str, len: usize) -> Result<*mut u8, CommError> {
        if b.cap < len.max(1) {
            if b.ptr != 0 {
                unsafe { cu::free_host(b.ptr as *mut c_void) }.map_err(|e| cuda_error(e, op))?;
                *b = HostBuf::default();
            }
            let cap = len.max(4096).next_power_of_two();
            b.ptr = unsafe { cu::malloc_host(cap, 0) }.map_err(|e| cuda_error(e, op))? as usize;
            b.cap = cap;
        }
        Ok(b.ptr as *mut u8)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if lock(&self.poisoned).is_some() {
            // Aborted work may still name these buffers: leave them to the
            // process's exit.
            return;
        }
        let stage = lock(&self.staging);
        for b in [&stage.send, &stage.recv] {
            if b.ptr != 0 {
                let _ = unsafe { cu::free_sync(b.ptr) };
            }
        }
        for b in [&stage.host_send, &stage.host_recv] {
            if b.ptr != 0 {
                let _ = unsafe { cu::free_host(b.ptr as *mut c_void) };
            }
        }
        let _ = unsafe { cu::stream::destroy(self.stream) };
    }
}

/// An NCCL communicator (a world made from a unique id, or a split of it).
#[derive(Debug)]
pub struct NcclComm {
    comm: nc::ncclComm_t,
    rank: usize,
    size: usize,
    dev: Arc<Device>,
}

// SAFETY: an NCCL communicator handle may be used from any thread as long
// as calls on it do not overlap. `NcclComm` is not `Sync`, so only one
// thread at a time can reach it; its device state is an `Arc<Device>`
// (`Send + Sync` above), and every operation holds the device's `staging`
// lock, so siblings split from it run one at a time on the shared stream
// and buffers. Its `Drop` (finalize/destroy or abort) is valid on any thread.
unsafe impl Send for NcclComm {}

/// The environment a launched rank reads ([`spawn_local`] sets it).
#[derive(Debug)]
pub struct RankEnv {
    pub id: UniqueId,
    pub rank: usize,
    pub world: usize,
    pub device: Option<usize>,
}

impl RankEnv {
    /// Whether this process was started as a rank (`$QSYNC_NCCL_ID` set).
    pub fn present() -> bool {
        std::env::var_os(ENV_ID).is_some()
    }

    pub fn from_env() -> Result<RankEnv, CommError> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| CommError::InvalidArgument {
                op: "init",
                detail: format!(
                    "${name} is not set: start the ranks with a launcher (qsync_runtime::nccl::spawn_local, `qsync-sync-check --backend nccl --ranks N`)"
                ),
            })
        };
        let num = |name: &str, v: String| {
            v.trim().parse::<usize>().map_err(|_| CommError::InvalidArgument {
                op: "init",
                detail: format!("${name} = `{v}` is not a non-negative integer"),
            })
        };
        let id = UniqueId::from_hex(&var(ENV_ID)?)?;
        let rank = num(ENV_RANK, var(ENV_RANK)?)?;
        let world = num(ENV_WORLD, var(ENV_WORLD)?)?;
        if world == 0 || rank >= world {
            return Err(CommError::InvalidArgument {
                op: "init",
                detail: format!("rank {rank} of a world of {world}"),
            });
        }
        let device = match std::env::var(ENV_DEVICE) {
            Ok(v) => Some(num(ENV_DEVICE, v)?),
            Err(_) => None,
        };
        Ok(RankEnv { id, rank, world, device })
    }
}

impl NcclComm {
    /// The world communicator of a rank started by [`spawn_local`] (or any
    /// launcher setting the same variables); `timeout` bounds the
    /// initialization. A machine without CUDA or NCCL gets
    /// [`CommError::LibraryMissing`] before the environment is read.
    pub fn from_env(timeout: Duration) -> Result<NcclComm, CommError> {
        let info = probe()?;
        let env = RankEnv::from_env()?;
        Self::init(info, &env, Deadline::after(timeout))
    }

    /// Creates rank `env.rank` of `env.world` on the id's communicator.
    pub fn init(info: NcclInfo, env: &RankEnv, deadline: Deadline) -> Result<NcclComm, CommError> {
        const OP: &str = "init";
        if info.version < MIN_VERSION {
            return Err(CommError::Unsupported {
                backend: BACKEND,
                what: format!("NCCL {} (2.18 or later is needed for non-blocking split communicators)", info.version),
            });
        }
        let (rank, world) = (env.rank, env.world);
        let nranks = c_int::try_from(world)
            .map_err(|_| CommError::InvalidArgument { op: OP, detail: format!("{world} ranks") })?;
        let dev = Arc::new(Device::open(env.device, rank)?);
        install_panic_hook(rank);
        let mut cfg = config();
        let mut comm: nc::ncclComm_t = std::ptr::null_mut();
        let r = unsafe { nc::ncclCommInitRankConfig(&mut comm, nranks, env.id.0, rank as c_int, &mut cfg) };
        if !accepted(r) {
            let e = nccl_error(comm, r, OP, rank);
            if !comm.is_null() {
                unsafe { nc::ncclCommAbort(comm) };
            }
            return Err(e);
        }
        if comm.is_null() {
            return Err(CommError::Backend {
                backend: BACKEND,
                op: OP,
                code: r as i32,
                message: "ncclCommInitRankConfig returned no communicator".into(),
            });
        }
        live().push(comm as usize);
        let c = NcclComm { comm, rank, size: world, dev };
        c.wait_ready(OP, deadline)?;
        Ok(c)
    }

    /// The CUDA device this rank runs on.
    pub fn device(&self) -> usize {
        self.dev.ordinal
    }

    fn ensure_usable(&self, op: &'static str) -> Result<(), CommError> {
        if let Some(why) = &*lock(&self.dev.poisoned) {
            return Err(CommError::Poisoned(why.clone()));
        }
        unsafe { cu::ctx::set_current(self.dev.ctx) }.map_err(|e| cuda_error(e, op))
    }

    /// Poisons the process's communicators, aborts them and returns `e`.
    fn fail(&self, e: CommError) -> CommError {
        lock(&self.dev.poisoned).get_or_insert_with(|| e.to_string());
        abort_all();
        e
    }

    fn sleep_between_polls(polls: &mut u32) {
        *polls += 1;
        if *polls < 1000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Polls `ncclCommGetAsyncError` until the communicator's pending
    /// operation (init, split, group end) is no longer in progress.
    fn wait_ready(&self, op: &'static str, deadline: Deadline) -> Result<(), CommError> {
        let mut polls = 0u32;
        loop {
            match self.async_state(op)? {
                nc::ncclResult_t::ncclSuccess => return Ok(()),
                nc::ncclResult_t::ncclInProgress => {}
                e => return Err(self.fail(nccl_error(self.comm, e, op, self.dev.world_rank))),
            }
            if deadline.expired() {
                return Err(self.fail(self.timeout(op, deadline)));
            }
            Self::sleep_between_polls(&mut polls);
        }
    }

    fn async_state(&self, op: &'static str) -> Result<nc::ncclResult_t, CommError> {
        let mut state = nc::ncclResult_t::ncclSuccess;
        let r = unsafe { nc::ncclCommGetAsyncError(self.comm, &mut state) };
        if r != nc::ncclResult_t::ncclSuccess {
            return Err(self.fail(nccl_error(self.comm, r, op, self.dev.world_rank)));
        }
        Ok(state)
    }

    fn timeout(&self, op: &'static str, deadline: Deadline) -> CommError {
        CommError::Timeout { op, rank: self.dev.world_rank, timeout: deadline.budget }
    }

    /// Waits until the enqueued work is on the stream and the stream is
    /// idle, watching for asynchronous errors; aborts at the deadline.
    fn complete(&self, op: &'static str, deadline: Deadline) -> Result<(), CommError> {
        let mut polls = 0u32;
        loop {
            match self.async_state(op)? {
                nc::ncclResult_t::ncclSuccess => match unsafe { cus::cuStreamQuery(self.dev.stream) } {
                    cus::CUresult::CUDA_SUCCESS => return Ok(()),
                    cus::CUresult::CUDA_ERROR_NOT_READY => {}
                    e => return Err(self.fail(cuda_error(cu::DriverError(e), op))),
                },
                nc::ncclResult_t::ncclInProgress => {}
                e => return Err(self.fail(nccl_error(self.comm, e, op, self.dev.world_rank))),
            }
            if deadline.expired() {
                return Err(self.fail(self.timeout(op, deadline)));
            }
            Self::sleep_between_polls(&mut polls);
        }
    }

    /// Runs `enqueue` inside an NCCL group on this communicator's stream and
    /// waits for it ([`Self::complete`]).
    fn grouped(
        &self,
        op: &'static str,
        deadline: Deadline,
        enqueue: impl FnOnce(nc::ncclComm_t, nc::cudaStream_t) -> nc::ncclResult_t,
    ) -> Result<(), CommError> {
        let start = unsafe { nc::ncclGroupStart() };
        if !accepted(start) {
            return Err(self.fail(nccl_error(self.comm, start, op, self.dev.world_rank)));
        }
        let r = enqueue(self.comm, self.dev.nccl_stream());
        let end = unsafe { nc::ncclGroupEnd() };
        for code in [r, end] {
            if !accepted(code) {
                return Err(self.fail(nccl_error(self.comm, code, op, self.dev.world_rank)));
            }
        }
        self.complete(op, deadline)
    }

    /// `src` to device memory `dst`, through the pinned send buffer (the
    /// copy is queued; the operation's `complete` waits for it). `T` is a
    /// plain number type (bytes, f32, 16-bit float storage).
    fn h2d<T: Copy>(&self, stage: &mut Staging, op: &'static str, dst: u64, src: &[T]) -> Result<(), CommError> {
        let bytes = std::mem::size_of_val(src);
        if bytes == 0 {
            return Ok(());
        }
        let pinned = Device::host(&mut stage.host_send, op, bytes)?;
        // SAFETY: `pinned` holds at least `bytes` bytes (just grown), is
        // not `src`, and no copy reads it now: the stream is idle between
        // operations and this is the operation's only upload.
        let pinned = unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), pinned, bytes);
            std::slice::from_raw_parts(pinned.cast_const(), bytes)
        };
        unsafe { cu::memcpy_htod_async(dst, pinned, self.dev.stream) }.map_err(|e| self.fail(cuda_error(e, op)))
    }

    /// Device memory `src` into `dst`, through the pinned receive buffer.
    /// Only after [`Self::complete`]: the stream is idle, so the wait below
    /// cannot hang on a collective. `T` as for [`Self::h2d`]: every bit
    /// pattern is a value.
    fn d2h<T: Copy>(&self, stage: &mut Staging, op: &'static str, dst: &mut [T], src: u64) -> Result<(), CommError> {
        let bytes = std::mem::size_of_val(dst);
        if bytes == 0 {
            return Ok(());
        }
        let pinned = Device::host(&mut stage.host_recv, op, bytes)?;
        // SAFETY: `pinned` holds at least `bytes` bytes and is only read
        // after the stream has finished writing it.
        let view = unsafe { std::slice::from_raw_parts_mut(pinned, bytes) };
        unsafe { cu::memcpy_dtoh_async(view, src, self.dev.stream) }.map_err(|e| self.fail(cuda_error(e, op)))?;
        unsafe { cu::stream::synchronize(self.dev.stream) }.map_err(|e| self.fail(cuda_error(e, op)))?;
        unsafe { std::ptr::copy_nonoverlapping(pinned.cast_const(), dst.as_mut_ptr().cast::<u8>(), bytes) };
        Ok(())
    }

    /// Grouped point-to-point exchange: `send[sd[j]..][..sc[j]]` to rank `j`,
    /// `rc[j]` bytes from rank `j` into `recv[rd[j]..]`; the rank's own slice
    /// is copied on the host. `send_all` sends the whole of `send` to every
    /// peer (all-gather-v).
    #[allow(clippy::too_many_arguments)]
    fn exchange(
        &self,
        op: &'static str,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        send_all: bool,
        deadline: Deadline,
    ) -> Result<(), CommError> {
        let mut stage = self.dev.stage();
        self.ensure_usable(op)?;
        let (sd, rd) = (displacements(send_counts), displacements(recv_counts));
        let me = self.rank;
        let (s, r) = Device::buffers(&mut stage, op, send.len(), recv.len())?;
        self.h2d(&mut stage, op, s, send)?;
        self.grouped(op, deadline, |comm, stream| {
            for j in (0..self.size).filter(|&j| j != me) {
                let (off, len) = if send_all { (0, send.len()) } else { (sd[j], send_counts[j]) };
                if len > 0 {
                    let rc = unsafe {
                        nc::ncclSend(
                            (s + off as u64) as *const c_void,
                            len,
                            nc::ncclDataType_t::ncclUint8,
                            j as c_int,
                            comm,
                            stream,
                        )
                    };
                    if !accepted(rc) {
                        return rc;
                    }
                }
                if recv_counts[j] > 0 {
                    let rc = unsafe {
                        nc::ncclRecv(
                            (r + rd[j] as u64) as *mut c_void,
                            recv_counts[j],
                            nc::ncclDataType_t::ncclUint8,
                            j as c_int,
                            comm,
                            stream,
                        )
                    };
                    if !accepted(rc) {
                        return rc;
                    }
                }
            }
            nc::ncclResult_t::ncclSuccess
        })?;
        // Peers' slices from the device, this rank's own from the host.
        let own = if send_all { 0..send.len() } else { sd[me]..sd[me] + send_counts[me] };
        // The slices tile `recv[..total]` (displacements are prefix sums):
        // copy them all out of the pinned buffer at once, then the own one.
        let total: usize = recv_counts.iter().sum();
        self.d2h(&mut stage, op, &mut recv[..total], r)?;
        recv[rd[me]..rd[me] + recv_counts[me]].copy_from_slice(&send[own]);
        Ok(())
    }

    fn reduce<T: Copy>(&self, buf: &mut [T], dtype: nc::ncclDataType_t, deadline: Deadline) -> Result<(), CommError> {
        const OP: &str = "all_reduce";
        let mut stage = self.dev.stage();
        self.ensure_usable(OP)?;
        if buf.is_empty() {
            return Ok(());
        }
        let (s, _) = Device::buffers(&mut stage, OP, std::mem::size_of_val(buf), 0)?;
        self.h2d(&mut stage, OP, s, buf)?;
        let n = buf.len();
        self.grouped(OP, deadline, |comm, stream| unsafe {
            nc::ncclAllReduce(s as *const c_void, s as *mut c_void, n, dtype, nc::ncclRedOp_t::ncclSum, comm, stream)
        })?;
        self.d2h(&mut stage, OP, buf, s)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let addr = self.comm as usize;
        {
            let mut l = live();
            match l.iter().position(|&c| c == addr) {
                Some(i) => {
                    l.swap_remove(i);
                }
                // Already aborted.
                None => return,
            }
        }
        if lock(&self.dev.poisoned).is_some() {
            unsafe { nc::ncclCommAbort(self.comm) };
            return;
        }
        // Finalize (non-blocking: polled, bounded), then destroy; abort if
        // finalizing fails or outlives its budget.
        let finalized = unsafe { nc::ncclCommFinalize(self.comm) };
        let mut done = accepted(finalized);
        if done {
            let until = Instant::now() + FINALIZE_BUDGET;
            loop {
                let mut state = nc::ncclResult_t::ncclSuccess;
                let r = unsafe { nc::ncclCommGetAsyncError(self.comm, &mut state) };
                if r != nc::ncclResult_t::ncclSuccess || state != nc::ncclResult_t::ncclInProgress {
                    done = r == nc::ncclResult_t::ncclSuccess && state == nc::ncclResult_t::ncclSuccess;
                    break;
                }
                if Instant::now() >= until {
                    done = false;
                    break;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        unsafe {
            if done {
                nc::ncclCommDestroy(self.comm);
            } else {
                nc::ncclCommAbort(self.comm);
            }
        }
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn cuda_device(&self) -> Option<usize> {
        Some(self.dev.ordinal)
    }

    fn split(&self, color: usize, key: usize, deadline: Deadline) -> Result<Box<dyn Communicator>, CommError> {
        const OP: &str = "split";
        let _stage = self.dev.stage();
        self.ensure_usable(OP)?;
        let to_int = |v: usize| {
            c_int::try_from(v).map_err(|_| CommError::InvalidArgument { op: OP, detail: format!("{v} exceeds int") })
        };
        let (color, key) = (to_int(color)?, to_int(key)?);
        let mut cfg = config();
        let mut comm: nc::ncclComm_t = std::ptr::null_mut();
        let r = unsafe { nc::ncclCommSplit(self.comm, color, key, &mut comm, &mut cfg) };
        if !accepted(r) {
            return Err(self.fail(nccl_error(self.comm, r, OP, self.dev.world_rank)));
        }
        // The parent finishes its part of the split, then the child its init.
        self.wait_ready(OP, deadline)?;
        if comm.is_null() {
            return Err(self.fail(CommError::Backend {
                backend: BACKEND,
                op: OP,
                code: r as i32,
                message: "ncclCommSplit returned no communicator".into(),
            }));
        }
        live().push(comm as usize);
        let mut child = NcclComm { comm, rank: 0, size: 0, dev: self.dev.clone() };
        child.wait_ready(OP, deadline)?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        for r in [unsafe { nc::ncclCommUserRank(comm, &mut rank) }, unsafe { nc::ncclCommCount(comm, &mut size) }] {
            if r != nc::ncclResult_t::ncclSuccess {
                return Err(self.fail(nccl_error(comm, r, OP, self.dev.world_rank)));
            }
        }
        child.rank = rank.max(0) as usize;
        child.size = size.max(0) as usize;
        Ok(Box::new(child))
    }

    fn all_gather(&self, send: &[u8], recv: &mut [u8], deadline: Deadline) -> Result<(), CommError> {
        const OP: &str = "all_gather";
        if recv.len() != send.len() * self.size {
            return Err(CommError::InvalidArgument {
                op: OP,
                detail: format!("{} recv bytes for {} ranks × {} bytes", recv.len(), self.size, send.len()),
            });
        }
        let mut stage = self.dev.stage();
        self.ensure_usable(OP)?;
        if send.is_empty() {
            return Ok(());
        }
        let (s, r) = Device::buffers(&mut stage, OP, send.len(), recv.len())?;
        self.h2d(&mut stage, OP, s, send)?;
        let n = send.len();
        self.grouped(OP, deadline, |comm, stream| unsafe {
            nc::ncclAllGather(s as *const c_void, r as *mut c_void, n, nc::ncclDataType_t::ncclUint8, comm, stream)
        })?;
        self.d2h(&mut stage, OP, recv, r)
    }

    fn all_gather_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<(), CommError> {
        const OP: &str = "all_gather_v";
        check_gather_counts(OP, counts, self.size, self.rank, send.len(), recv.len())?;
        let send_counts = vec![send.len(); self.size];
        self.exchange(OP, send, &send_counts, recv, counts, true, deadline)
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
        check_counts(OP, send_counts, self.size, send.len())?;
        check_counts(OP, recv_counts, self.size, recv.len())?;
        if send_counts[self.rank] != recv_counts[self.rank] {
            return Err(CommError::InvalidArgument {
                op: OP,
                detail: format!(
                    "rank {} sends itself {} bytes but expects {}",
                    self.rank, send_counts[self.rank], recv_counts[self.rank]
                ),
            });
        }
        self.exchange(OP, send, send_counts, recv, recv_counts, false, deadline)
    }

    fn all_reduce_sum(&self, buf: ReduceBuf<'_>, deadline: Deadline) -> Result<(), CommError> {
        match buf {
            ReduceBuf::F32(b) => self.reduce(b, nc::ncclDataType_t::ncclFloat32, deadline),
            ReduceBuf::F16(b) => self.reduce(b, nc::ncclDataType_t::ncclFloat16, deadline),
            ReduceBuf::BF16(b) => self.reduce(b, nc::ncclDataType_t::ncclBfloat16, deadline),
        }
    }

    fn broadcast(&self, buf: &mut [u8], root: usize, deadline: Deadline) -> Result<(), CommError> {
        const OP: &str = "broadcast";
        if root >= self.size {
            return Err(CommError::InvalidArgument { op: OP, detail: format!("root {root} of {} ranks", self.size) });
        }
        let mut stage = self.dev.stage();
        self.ensure_usable(OP)?;
        if buf.is_empty() {
            return Ok(());
        }
        let (s, _) = Device::buffers(&mut stage, OP, buf.len(), 0)?;
        self.h2d(&mut stage, OP, s, buf)?;
        let n = buf.len();
        self.grouped(OP, deadline, |comm, stream| unsafe {
            nc::ncclBroadcast(
                s as *const c_void,
                s as *mut c_void,
                n,
                nc::ncclDataType_t::ncclUint8,
                root as c_int,
                comm,
                stream,
            )
        })?;
        self.d2h(&mut stage, OP, buf, s)
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), CommError> {
        let mut one = [0f32];
        self.reduce(&mut one, nc::ncclDataType_t::ncclFloat32, deadline).map_err(|e| match e {
            CommError::Timeout { rank, timeout, .. } => CommError::Timeout { op: "barrier", rank, timeout },
            other => other,
        })
    }

    fn abort(&self, code: i32) -> ! {
        eprintln!("qsync-runtime: rank {}: aborting its NCCL communicators and exiting ({code})", self.dev.world_rank);
        lock(&self.dev.poisoned).get_or_insert_with(|| "aborted".into());
        abort_all();
        std::process::exit(code)
    }
}

/// How one launched rank ended.
#[derive(Debug)]
pub enum RankOutcome {
    Exited(ExitStatus),
    /// Still running after a peer failed and the grace period passed: the
    /// launcher killed it.
    Killed,
}

impl RankOutcome {
    pub fn success(&self) -> bool {
        matches!(self, RankOutcome::Exited(s) if s.success())
    }
}

impl std::fmt::Display for RankOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankOutcome::Exited(s) => write!(f, "{s}"),
            RankOutcome::Killed => write!(f, "killed by the launcher after a peer failed"),
        }
    }
}

/// Starts `ranks` copies of `program args…` on this machine as the ranks of
/// one NCCL world (see the module doc for the environment they get) and
/// waits for them. When a rank fails, the others get `grace` to notice
/// (their own deadlines, NCCL's remote errors) and report it; then the
/// launcher kills those still running. `limit` bounds the whole job.
pub fn spawn_local(
    ranks: usize,
    program: &Path,
    args: &[String],
    grace: Duration,
    limit: Duration,
) -> Result<Vec<RankOutcome>, CommError> {
    if ranks == 0 {
        return Err(CommError::InvalidArgument { op: "launch", detail: "0 ranks".into() });
    }
    let id = UniqueId::new()?.to_hex();
    let mut children: Vec<Option<Child>> = Vec::with_capacity(ranks);
    for r in 0..ranks {
        let mut cmd = Command::new(program);
        cmd.args(args).env(ENV_ID, &id).env(ENV_RANK, r.to_string()).env(ENV_WORLD, ranks.to_string());
        if std::env::var_os("NCCL_MULTI_RANK_GPU_ENABLE").is_none() {
            cmd.env("NCCL_MULTI_RANK_GPU_ENABLE", "1");
        }
        match cmd.spawn() {
            Ok(c) => children.push(Some(c)),
            Err(e) => {
                for c in children.iter_mut().flatten() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(CommError::Backend {
                    backend: "launcher",
                    op: "launch",
                    code: e.raw_os_error().unwrap_or(-1),
                    message: format!("cannot start {}: {e}", program.display()),
                });
            }
        }
    }
    let start = Instant::now();
    let mut outcomes: Vec<Option<RankOutcome>> = (0..ranks).map(|_| None).collect();
    let mut failed_at: Option<Instant> = None;
    loop {
        for (r, slot) in children.iter_mut().enumerate() {
            if let Some(c) = slot {
                if let Ok(Some(status)) = c.try_wait() {
                    if !status.success() && failed_at.is_none() {
                        failed_at = Some(Instant::now());
                    }
                    outcomes[r] = Some(RankOutcome::Exited(status));
                    *slot = None;
                }
            }
        }
        if children.iter().all(Option::is_none) {
            break;
        }
        let give_up = failed_at.is_some_and(|t| t.elapsed() >= grace) || start.elapsed() >= limit;
        if give_up {
            for (r, slot) in children.iter_mut().enumerate() {
                if let Some(c) = slot {
                    let _ = c.kill();
                    let _ = c.wait();
                    eprintln!("qsync-runtime launcher: rank {r} still running; killed it");
                    outcomes[r] = Some(RankOutcome::Killed);
                    *slot = None;
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(outcomes.into_iter().map(|o| o.unwrap_or(RankOutcome::Killed)).collect())
}

/// One rank of a job [`launch_self`] started: the communicator from the
/// environment, or the exit status after printing the error as `name`
/// (2 when NCCL cannot be loaded, 3 for any other failure).
pub fn rank_from_env(name: &str, timeout: Duration) -> Result<NcclComm, u8> {
    NcclComm::from_env(timeout).map_err(|e| {
        let rank = std::env::var(ENV_RANK).unwrap_or_else(|_| "?".into());
        eprintln!("{name}: rank {rank}: {e}");
        if matches!(e, CommError::LibraryMissing { .. }) {
            2
        } else {
            3
        }
    })
}

/// The launcher of a check binary run over NCCL: `ranks` copies of this
/// executable with its own arguments ([`spawn_local`]; survivors of a
/// failure get `timeout` plus 10 s to report it), each failed rank printed
/// as `name`. Returns the exit status: 0, the first failed rank's own
/// non-zero status, 3 for a rank killed or past the hour, 2 when the job
/// could not start.
pub fn launch_self(name: &str, ranks: usize, timeout: Duration) -> u8 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{name}: cannot find its own executable: {e}");
            return 2;
        }
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match spawn_local(ranks, &exe, &argv, timeout + Duration::from_secs(10), Duration::from_secs(3600)) {
        Ok(outcomes) => {
            let failed: Vec<(usize, &RankOutcome)> =
                outcomes.iter().enumerate().filter(|(_, o)| !o.success()).collect();
            for (r, o) in &failed {
                eprintln!("{name} launcher: rank {r}: {o}");
            }
            match failed.first() {
                None => 0,
                Some((_, RankOutcome::Exited(s))) => {
                    s.code().and_then(|c| u8::try_from(c).ok()).filter(|&c| c != 0).unwrap_or(3)
                }
                Some(_) => 3,
            }
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            2
        }
    }
}

#[cfg(test)]
mod thread_tests {
    use super::*;

    // Communicators split from one another may serve different threads:
    // the shared device state must be `Send + Sync` and a communicator
    // `Send`, by their types.
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn communicators_may_move_between_threads() {
        send_sync::<Device>();
        send_sync::<Arc<Device>>();
        send::<NcclComm>();
    }
}
