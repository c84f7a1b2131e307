//! [`PyTransport`]: a [`Communicator`] whose bytes travel through a Python
//! object — in the `qsync` package, `torch.distributed` process groups
//! (gloo on CPU) — so that every scheme of [`qsync_runtime::GradSync`] runs
//! unchanged inside a PyTorch job.
//!
//! The Python object (`qsync._transport.TorchTransport`) provides byte
//! collectives only: `all_gather`, `all_to_all_v`,
//! `all_reduce_f32`, `broadcast`, `barrier`, `split`, `abort`, each taking
//! the seconds left before the deadline as its last argument and raising
//! `TimeoutError` when they run out, `ConnectionError` when a peer is gone.
//! 16-bit sums are done here (an all-gather, then an f32 sum in rank order
//! rounded once), the same arithmetic as the MPI backend, so no transport
//! needs 16-bit reductions and every rank gets the same bits.

use std::sync::Mutex;
use std::time::Instant;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyConnectionError, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyFloat, PyList, PyMemoryView, PySlice, PyTuple};
use qsync_kernels::reference::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use qsync_runtime::comm::{check_counts, check_gather_counts};
use qsync_runtime::sync::{f32_bytes, f32_from_bytes, u16_bytes};
use qsync_runtime::{CommError, Communicator, Deadline, ReduceBuf};

const BACKEND: &str = "torch.distributed";

/// A communicator over a Python transport object.
#[derive(Debug)]
pub struct PyTransport {
    obj: Py<PyAny>,
    rank: usize,
    size: usize,
    /// The first failure; every later call fails fast with it.
    poisoned: Mutex<Option<String>>,
    /// The `bytearray` every call's send bytes are copied into, kept while
    /// large enough: a fresh one a call would touch new pages, and a page
    /// fault costs microseconds on a virtual machine (a 16 MiB all-to-all
    /// through gloo took 37 ms with a fresh output tensor, 13 ms reusing
    /// one; 4 ranks on 2 cores). It grows to the largest exchange.
    send: Mutex<Option<Py<PyByteArray>>>,
}

impl PyTransport {
    /// Wraps `obj`, reading its `rank` and `size` attributes.
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let rank: usize = obj.getattr("rank")?.extract()?;
        let size: usize = obj.getattr("size")?.extract()?;
        if size == 0 || rank >= size {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("transport says rank {rank} of {size} ranks")));
        }
        Ok(PyTransport { obj: obj.clone().unbind(), rank, size, poisoned: Mutex::new(None), send: Mutex::new(None) })
    }

    /// `b` handed to the transport: copied into the kept `bytearray` (a new
    /// one where it is too small) and passed as a writable `memoryview` of
    /// its first `b.len()` bytes, which torch views without another copy.
    /// The transport's calls are sequential and each is over (or the
    /// communicator poisoned) before the next one writes here.
    fn staged<'py>(&self, py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let mut slot = self.send.lock().unwrap_or_else(|e| e.into_inner());
        let kept = slot.as_ref().map(|a| a.bind(py).clone()).filter(|a| a.len() >= b.len());
        let (buf, fresh) = match kept {
            Some(a) => (a, false),
            None => {
                let a = PyByteArray::new(py, b);
                *slot = Some(a.clone().unbind());
                (a, true)
            }
        };
        let view = PyMemoryView::from(buf.as_any())?.get_item(PySlice::new(py, 0, b.len() as isize, 1))?;
        if !fresh {
            // Through the buffer protocol: Python views of the bytearray
            // (a finished call's) see new contents in valid memory, as a
            // bytearray with exports cannot be resized.
            PyBuffer::<u8>::get(&view)?.copy_from_slice(py, b)?;
        }
        Ok(view)
    }

    fn check(&self) -> Result<(), CommError> {
        match self.poisoned.lock().map(|g| g.clone()) {
            Ok(None) => Ok(()),
            Ok(Some(why)) => Err(CommError::Poisoned(why)),
            Err(_) => Err(CommError::Poisoned("a thread panicked inside the transport".into())),
        }
    }

    fn poison(&self, e: CommError) -> CommError {
        if let Ok(mut g) = self.poisoned.lock() {
            g.get_or_insert_with(|| e.to_string());
        }
        e
    }

    /// Calls `method(*args, seconds_left)` on the transport.
    fn call<F>(&self, op: &'static str, deadline: Deadline, method: &str, args: F) -> Result<Py<PyAny>, CommError>
    where
        F: for<'py> FnOnce(Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>>,
    {
        self.check()?;
        let left = deadline.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.poison(CommError::Timeout { op, rank: self.rank, timeout: deadline.budget }));
        }
        Python::attach(|py| {
            let run = || -> PyResult<Py<PyAny>> {
                let mut a = args(py)?;
                a.push(PyFloat::new(py, left.as_secs_f64()).into_any());
                let tuple = PyTuple::new(py, a)?;
                Ok(self.obj.bind(py).call_method1(method, tuple)?.unbind())
            };
            run().map_err(|e| self.comm_error(py, op, deadline, e))
        })
    }

    fn comm_error(&self, py: Python<'_>, op: &'static str, deadline: Deadline, e: PyErr) -> CommError {
        let err = if e.is_instance_of::<PyTimeoutError>(py) {
            CommError::Timeout { op, rank: self.rank, timeout: deadline.budget }
        } else if e.is_instance_of::<PyConnectionError>(py) {
            CommError::PeerFailed { op, rank: self.rank, detail: e.value(py).to_string() }
        } else {
            CommError::Backend { backend: BACKEND, op, code: -1, message: e.to_string() }
        };
        self.poison(err)
    }

    /// Copies what a transport method returned — any contiguous buffer of
    /// bytes: `bytes`, or a uint8 array viewing the received tensor — of
    /// exactly `out.len()` bytes into `out`.
    fn take_bytes(&self, op: &'static str, obj: Py<PyAny>, out: &mut [u8]) -> Result<(), CommError> {
        Python::attach(|py| {
            let bad = |message: String| self.poison(CommError::Backend { backend: BACKEND, op, code: -1, message });
            let buf = PyBuffer::<u8>::get(obj.bind(py)).map_err(|e| {
                bad(format!("the transport returned something other than bytes or a byte buffer ({e})"))
            })?;
            if buf.item_count() != out.len() {
                return Err(bad(format!(
                    "the transport returned {} bytes, {} were expected",
                    buf.item_count(),
                    out.len()
                )));
            }
            buf.copy_to_slice(py, out).map_err(|e| bad(format!("reading the returned buffer: {e}")))
        })
    }

    /// Sums 16-bit values across ranks: all-gather, f32 sum in rank order,
    /// one rounding.
    fn sum16(
        &self,
        buf: &mut [u16],
        up: fn(u16) -> f32,
        down: fn(f32) -> u16,
        deadline: Deadline,
    ) -> Result<(), CommError> {
        let send = u16_bytes(buf);
        let mut all = vec![0u8; send.len() * self.size];
        self.all_gather(&send, &mut all, deadline)?;
        let n = buf.len();
        for (i, out) in buf.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for r in 0..self.size {
                let at = 2 * (r * n + i);
                acc += up(u16::from_le_bytes([all[at], all[at + 1]]));
            }
            *out = down(acc);
        }
        Ok(())
    }
}

fn ints<'py>(py: Python<'py>, v: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyList::new(py, v)?.into_any())
}

fn int<'py>(py: Python<'py>, v: usize) -> PyResult<Bound<'py, PyAny>> {
    Ok(v.into_pyobject(py)?.into_any())
}

impl Communicator for PyTransport {
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
        let obj = self.call("split", deadline, "split", |py| Ok(vec![int(py, color)?, int(py, key)?]))?;
        Python::attach(|py| PyTransport::new(obj.bind(py))).map(|t| Box::new(t) as Box<dyn Communicator>).map_err(|e| {
            self.poison(CommError::Backend { backend: BACKEND, op: "split", code: -1, message: e.to_string() })
        })
    }

    fn all_gather(&self, send: &[u8], recv: &mut [u8], deadline: Deadline) -> Result<(), CommError> {
        if recv.len() != send.len() * self.size {
            return Err(CommError::InvalidArgument {
                op: "all_gather",
                detail: format!("{} send and {} recv bytes for {} ranks", send.len(), recv.len(), self.size),
            });
        }
        let out = self.call("all_gather", deadline, "all_gather", |py| Ok(vec![self.staged(py, send)?]))?;
        self.take_bytes("all_gather", out, recv)
    }

    fn all_gather_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<(), CommError> {
        check_gather_counts("all_gather_v", counts, self.size, self.rank, send.len(), recv.len())?;
        // An all-gather of equal slices, each rank's padded to the longest,
        // then unpadded here (torch's gloo all-gather takes equal sizes).
        let width = counts.iter().copied().max().unwrap_or(0);
        if width == 0 {
            return Ok(());
        }
        if counts.iter().all(|&c| c == width) {
            let out = self.call("all_gather_v", deadline, "all_gather", |py| Ok(vec![self.staged(py, send)?]))?;
            return self.take_bytes("all_gather_v", out, recv);
        }
        let mut padded = send.to_vec();
        padded.resize(width, 0);
        let out = self.call("all_gather_v", deadline, "all_gather", |py| Ok(vec![self.staged(py, &padded)?]))?;
        let mut all = vec![0u8; width * self.size];
        self.take_bytes("all_gather_v", out, &mut all)?;
        let mut at = 0;
        for (r, &c) in counts.iter().enumerate() {
            recv[at..at + c].copy_from_slice(&all[r * width..r * width + c]);
            at += c;
        }
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
        check_counts("all_to_all_v", send_counts, self.size, send.len())?;
        check_counts("all_to_all_v", recv_counts, self.size, recv.len())?;
        let out = self.call("all_to_all_v", deadline, "all_to_all_v", |py| {
            Ok(vec![self.staged(py, send)?, ints(py, send_counts)?, ints(py, recv_counts)?])
        })?;
        self.take_bytes("all_to_all_v", out, recv)
    }

    fn all_reduce_sum(&self, buf: ReduceBuf<'_>, deadline: Deadline) -> Result<(), CommError> {
        match buf {
            ReduceBuf::F32(b) => {
                let send = f32_bytes(b);
                let mut out = vec![0u8; send.len()];
                let got =
                    self.call("all_reduce", deadline, "all_reduce_f32", |py| Ok(vec![self.staged(py, &send)?]))?;
                self.take_bytes("all_reduce", got, &mut out)?;
                b.copy_from_slice(&f32_from_bytes(&out));
                Ok(())
            }
            ReduceBuf::F16(b) => self.sum16(b, f16_to_f32, f32_to_f16, deadline),
            ReduceBuf::BF16(b) => self.sum16(b, bf16_to_f32, f32_to_bf16, deadline),
        }
    }

    fn broadcast(&self, buf: &mut [u8], root: usize, deadline: Deadline) -> Result<(), CommError> {
        if root >= self.size {
            return Err(CommError::InvalidArgument {
                op: "broadcast",
                detail: format!("root {root} of {} ranks", self.size),
            });
        }
        let got =
            self.call("broadcast", deadline, "broadcast", |py| Ok(vec![self.staged(py, buf)?, int(py, root)?]))?;
        self.take_bytes("broadcast", got, buf)
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), CommError> {
        self.call("barrier", deadline, "barrier", |_| Ok(Vec::new())).map(drop)
    }

    fn abort(&self, code: i32) -> ! {
        let _ = Python::attach(|py| self.obj.bind(py).call_method1("abort", (code,)).map(drop));
        std::process::exit(if code == 0 { 1 } else { code })
    }
}
