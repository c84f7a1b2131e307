//! # qsync-python — the `qsync._native` extension module
//!
//! The native half of the `qsync` Python package (`python/qsync/`): it runs
//! the runtime's gradient synchronization ([`qsync_runtime::GradSync`], every
//! scheme, bit for bit the same code the MPI and NCCL jobs run) on buffers
//! PyTorch hands over in a DistributedDataParallel communication hook.
//!
//! - On CPU the bytes travel through `torch.distributed` (gloo):
//!   [`transport::PyTransport`] is a [`qsync_runtime::Communicator`] over the
//!   package's `TorchTransport` object.
//! - On CUDA the runtime's own NCCL communicator is used
//!   ([`GradSync::nccl`](PyGradSync::nccl)): its unique id comes from
//!   [`nccl_unique_id`] on rank 0 and is shared through torch's store.
//!
//! Python sees `GradSync(transport, scheme, *, nodes, node_of, group, seed,
//! timeout_s, gather_f32)` (`node_of`: the node of every rank, for nodes of
//! any size; `nodes`: that many equal nodes) with `all_reduce_mean(buffer)` (a writable,
//! C-contiguous float32 buffer: a NumPy view of a DDP bucket), `fork()` (an
//! independent state for another bucket, over a duplicate of the same
//! group) and `wire_bytes`; `schemes()`; `nccl_unique_id()`;
//! `transport_all_to_all_s(transport, bytes_per_peer, messages)` (the
//! transport timed as the runtime drives it); and the exception `SyncError`.
//!
//! [`compiler`] carries the compiler: the `qsyncc` command line
//! (`qsyncc_main(argv)`, the wheel's `qsyncc` console command),
//! `plan(flags)` and `run_passes(…)`, which `qsync.plan` and
//! `qsync.passes.run` wrap.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use qsync_runtime::{Communicator, Deadline, Gather, GradSync, Scheme, SyncConfig};

pub mod compiler;
pub mod transport;

pyo3::create_exception!(
    _native,
    SyncError,
    PyRuntimeError,
    "A gradient synchronization failed (timeout, dead peer, engine error)."
);

/// One bucket's synchronization state.
struct Owned(GradSync<'static>);

// What `Owned`'s `Send` below rests on, checked by the compiler: the only
// communicators this module makes are `PyTransport`s and `NcclComm`s, and
// their `split`s (which `GradSync` makes for hierarchical schemes and
// `fork` for another bucket) return the same types again; the kernel
// engines are `Send + Sync` by their trait.
const _: () = {
    const fn send<T: Send>() {}
    send::<transport::PyTransport>();
    send::<qsync_runtime::nccl::NcclComm>();
    send::<std::sync::Arc<dyn qsync_runtime::KernelEngine>>();
};

// SAFETY: `GradSync` is `!Send` only because it holds its communicators as
// `Box<dyn Communicator>`, a trait object without a `Send` bound. Every
// communicator in an `Owned` is one of the `Send` types checked above: the
// world is a `PyTransport` (`new`) or an `NcclComm` (`nccl`), and every
// other communicator is a split of one, of the same type — `PyTransport`
// splits are new `PyTransport`s over new torch process groups; `NcclComm`
// splits are `NcclComm`s that share their device state through an `Arc`
// whose contents are `Send + Sync` (behind mutexes, one operation at a
// time per device). So moving an `Owned` to another thread — or dropping
// it there — moves only `Send` values, whatever sibling states other
// threads hold.
#[allow(unsafe_code)]
unsafe impl Send for Owned {}

impl Owned {
    fn mean(&mut self, grad: &mut [f32]) -> Result<(), qsync_runtime::SyncError> {
        self.0.all_reduce_mean(grad)
    }
}

/// Gradient synchronization for one DDP bucket (see the module docs).
#[pyclass(name = "GradSync", module = "qsync._native")]
struct PyGradSync {
    state: Mutex<Owned>,
    name: String,
    timeout: Duration,
}

fn sync_err(e: impl std::fmt::Display) -> PyErr {
    SyncError::new_err(e.to_string())
}

#[allow(clippy::too_many_arguments)]
fn config(
    scheme: &str,
    nodes: usize,
    node_of: Option<Vec<usize>>,
    group: usize,
    seed: u64,
    timeout_s: f64,
    gather_f32: bool,
) -> PyResult<SyncConfig> {
    let scheme: Scheme = scheme.parse().map_err(|e| PyValueError::new_err(format!("{e}")))?;
    if !(timeout_s.is_finite() && timeout_s > 0.0) {
        return Err(PyValueError::new_err(format!("timeout_s must be a positive number of seconds, not {timeout_s}")));
    }
    let mut cfg = SyncConfig::new(scheme);
    cfg.nodes = nodes;
    cfg.node_of = node_of;
    cfg.group = group;
    cfg.seed = seed;
    cfg.timeout = Duration::from_secs_f64(timeout_s);
    cfg.gather = if gather_f32 { Gather::F32 } else { Gather::Quantized };
    Ok(cfg)
}

impl PyGradSync {
    fn make(py: Python<'_>, world: Box<dyn Communicator>, cfg: SyncConfig) -> PyResult<Self> {
        let name = cfg.scheme.name();
        let timeout = cfg.timeout;
        // Hierarchical schemes split the world here (a collective; the GIL
        // stays held: a Python transport needs it anyway).
        let _ = py;
        let sync = GradSync::owning(world, cfg).map(Owned).map_err(sync_err)?;
        Ok(PyGradSync { state: Mutex::new(sync), name, timeout })
    }

    /// The state, waited for without holding the GIL: the thread that holds
    /// it may need the GIL to finish (a Python transport's calls).
    fn lock(&self, py: Python<'_>) -> PyResult<std::sync::MutexGuard<'_, Owned>> {
        loop {
            match self.state.try_lock() {
                Ok(g) => return Ok(g),
                Err(std::sync::TryLockError::WouldBlock) => {
                    py.detach(|| std::thread::sleep(Duration::from_micros(100)));
                }
                Err(std::sync::TryLockError::Poisoned(_)) => {
                    return Err(SyncError::new_err("an earlier synchronization panicked"));
                }
            }
        }
    }
}

#[pymethods]
impl PyGradSync {
    /// Synchronization over a Python transport (`qsync.TorchTransport`).
    #[new]
    #[pyo3(signature = (transport, scheme, *, nodes=1, node_of=None, group=512, seed=0, timeout_s=60.0, gather_f32=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        transport: &Bound<'_, PyAny>,
        scheme: &str,
        nodes: usize,
        node_of: Option<Vec<usize>>,
        group: usize,
        seed: u64,
        timeout_s: f64,
        gather_f32: bool,
    ) -> PyResult<Self> {
        let cfg = config(scheme, nodes, node_of, group, seed, timeout_s, gather_f32)?;
        let world = transport::PyTransport::new(transport)?;
        Self::make(py, Box::new(world), cfg)
    }

    /// Synchronization over the runtime's NCCL communicator: rank `rank` of
    /// `world` on CUDA device `device`, joined through `unique_id` (the hex
    /// string [`nccl_unique_id`] made on rank 0). `kernels="device"` runs
    /// the quantization kernels as qsync's PTX on that GPU (the PTX from
    /// `$QSYNC_PTX_DIR`); `"host"` (default) on the CPU.
    #[staticmethod]
    #[pyo3(signature = (rank, world, unique_id, device, scheme, *, nodes=1, node_of=None, group=512, seed=0, timeout_s=60.0, gather_f32=false, kernels="host"))]
    #[allow(clippy::too_many_arguments)]
    fn nccl(
        py: Python<'_>,
        rank: usize,
        world: usize,
        unique_id: &str,
        device: usize,
        scheme: &str,
        nodes: usize,
        node_of: Option<Vec<usize>>,
        group: usize,
        seed: u64,
        timeout_s: f64,
        gather_f32: bool,
        kernels: &str,
    ) -> PyResult<Self> {
        use qsync_runtime::nccl::{probe, NcclComm, RankEnv, UniqueId};
        let mut cfg = config(scheme, nodes, node_of, group, seed, timeout_s, gather_f32)?;
        cfg.kernels = kernels.parse().map_err(PyValueError::new_err)?;
        let id = UniqueId::from_hex(unique_id).map_err(sync_err)?;
        let env = RankEnv { id, rank, world, device: Some(device) };
        let deadline = Deadline::after(cfg.timeout);
        let comm = py.detach(|| probe().and_then(|info| NcclComm::init(info, &env, deadline))).map_err(sync_err)?;
        Self::make(py, Box::new(comm), cfg)
    }

    /// An independent state for another bucket: the same scheme over a
    /// duplicate of this group (a collective: every rank calls it).
    fn fork(&self, py: Python<'_>) -> PyResult<Self> {
        let guard = self.lock(py)?;
        let deadline = Deadline::after(self.timeout);
        let cfg = guard.0.config().clone();
        let world = guard.0.world();
        let dup = world.split(0, world.rank(), deadline).map_err(sync_err)?;
        drop(guard);
        Self::make(py, dup, cfg)
    }

    /// Replaces the float32 values of `buffer` (writable, C-contiguous) by
    /// their mean over every rank, in place, with the GIL released: the
    /// caller must leave the buffer alone until the call returns (as a DDP
    /// hook does with its bucket). Every rank calls it with the same length.
    #[allow(unsafe_code)]
    fn all_reduce_mean(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let buf: PyBuffer<f32> = PyBuffer::get(buffer)?;
        if buf.readonly() || !buf.is_c_contiguous() {
            return Err(PyValueError::new_err("all_reduce_mean needs a writable, C-contiguous float32 buffer"));
        }
        let (ptr, len) = (buf.buf_ptr() as usize, buf.item_count());
        let mut guard = self.lock(py)?;
        let state = &mut *guard;
        py.detach(|| {
            // SAFETY: `buf` holds the buffer export for the whole call, so the
            // exporter can neither free nor resize the memory; pyo3 checked
            // that it holds `len` f32 items, suitably aligned, and we checked
            // that it is writable and contiguous. The one alias this creates
            // is exclusive by the contract above (the caller does not touch
            // the buffer during the call); it ends before `buf` is released.
            let values = unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, len) };
            state.mean(values)
        })
        .map_err(sync_err)
    }

    /// Seconds spent per phase since creation or [`reset_phases`]: a dict of
    /// `quantize_s`, `exchange_s`, `wait_s` and `dequantize_s` (see the
    /// runtime's `Phases`; copies and allocations are the rest of a call).
    #[getter]
    fn phases(&self, py: Python<'_>) -> PyResult<std::collections::BTreeMap<&'static str, f64>> {
        let p = self.lock(py)?.0.phases();
        Ok([
            ("quantize_s", p.quantize_s),
            ("exchange_s", p.exchange_s),
            ("wait_s", p.wait_s),
            ("dequantize_s", p.dequantize_s),
        ]
        .into_iter()
        .collect())
    }

    /// Starts [`phases`] over from zero.
    fn reset_phases(&self, py: Python<'_>) -> PyResult<()> {
        self.lock(py)?.0.reset_phases();
        Ok(())
    }

    /// The scheme's canonical name.
    #[getter]
    fn scheme(&self) -> String {
        self.name.clone()
    }

    /// Bytes this rank received from others so far: `(intra_node, inter_node)`.
    #[getter]
    fn wire_bytes(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        let w = self.lock(py)?.0.wire_bytes();
        Ok((w.intra_node, w.inter_node))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let g = self.lock(py)?;
        let w = g.0.world();
        Ok(format!("GradSync({}, rank {} of {} over {})", self.name, w.rank(), w.size(), w.backend()))
    }
}

/// The synchronization schemes (base names; add `-sr` for stochastic
/// rounding and `-ef` for error feedback where they apply).
#[pyfunction]
fn schemes() -> Vec<&'static str> {
    Scheme::BASE_NAMES.to_vec()
}

/// The canonical name of `scheme`, or `ValueError` naming the known ones.
#[pyfunction]
fn parse_scheme(scheme: &str) -> PyResult<String> {
    scheme.parse::<Scheme>().map(|s| s.name()).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A fresh NCCL unique id (hex), made on rank 0 and shared with the others.
#[pyfunction]
fn nccl_unique_id() -> PyResult<String> {
    qsync_runtime::nccl::probe().map_err(sync_err)?;
    qsync_runtime::nccl::UniqueId::new().map(|id| id.to_hex()).map_err(sync_err)
}

/// Seconds that `messages` all-to-alls of `bytes_per_peer` bytes to every
/// rank take through `transport` as the runtime drives it (a collective:
/// every rank calls it): each written into a send vector and received into
/// a vector as a synchronization's exchanges are (the transport's kept
/// vectors, `Communicator::send_buffer` and `recycle`), which gloo reads
/// and fills in place, started and waited on
/// (`Communicator::start_all_to_all_v`). What a model of the hook's
/// transport is fitted to (`scripts/validate/gloo_probe.py`); timing the
/// Python transport alone would leave out the vectors and the calls'
/// crossing into Python.
#[pyfunction]
#[pyo3(signature = (transport, bytes_per_peer, messages, timeout_s = 120.0))]
fn transport_all_to_all_s(
    py: Python<'_>,
    transport: &Bound<'_, PyAny>,
    bytes_per_peer: usize,
    messages: usize,
    timeout_s: f64,
) -> PyResult<f64> {
    let comm = transport::PyTransport::new(transport)?;
    let p = comm.size();
    let counts = vec![bytes_per_peer; p];
    let budget =
        Duration::try_from_secs_f64(timeout_s).map_err(|e| PyValueError::new_err(format!("timeout_s: {e}")))?;
    py.detach(|| {
        let t = std::time::Instant::now();
        for m in 0..messages {
            let deadline = Deadline::after(budget);
            let mut send = comm.send_buffer(bytes_per_peer * p);
            send.resize(bytes_per_peer * p, (m % 251) as u8);
            let x = comm.start_all_to_all_v(send, &counts, &counts, deadline)?;
            comm.recycle(std::hint::black_box(x.wait(deadline)?));
        }
        Ok::<f64, qsync_runtime::CommError>(t.elapsed().as_secs_f64())
    })
    .map_err(sync_err)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGradSync>()?;
    m.add_function(wrap_pyfunction!(schemes, m)?)?;
    m.add_function(wrap_pyfunction!(parse_scheme, m)?)?;
    m.add_function(wrap_pyfunction!(nccl_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(transport_all_to_all_s, m)?)?;
    m.add_function(wrap_pyfunction!(compiler::qsyncc_main, m)?)?;
    m.add_function(wrap_pyfunction!(compiler::plan, m)?)?;
    m.add_function(wrap_pyfunction!(compiler::run_passes, m)?)?;
    m.add_function(wrap_pyfunction!(compiler::available_passes, m)?)?;
    m.add("SyncError", m.py().get_type::<SyncError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
