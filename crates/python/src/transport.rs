//! [`PyTransport`]: a [`Communicator`] whose bytes travel through a Python
//! object — in the `qsync` package, `torch.distributed` process groups
//! (gloo on CPU) — so that every scheme of [`qsync_runtime::GradSync`] runs
//! unchanged inside a PyTorch job.
//!
//! The Python object (`qsync._transport.TorchTransport`) provides byte
//! collectives only: `all_gather(send, recv, counts)`,
//! `all_to_all_v(send, send_counts, recv, recv_counts)`,
//! `all_reduce_f32(buf)`, `broadcast(buf, root)`, `barrier()`,
//! `split(color, key)`, `abort(code)`, each taking the seconds left before
//! the deadline as its last argument and raising `TimeoutError` when they
//! run out, `ConnectionError` when a peer is gone. Every buffer is a
//! writable `memoryview` the transport fills or reads in place; it returns
//! nothing but `split`'s new transport. 16-bit sums are done here (an
//! all-gather, then an f32 sum in rank order rounded once), the same
//! arithmetic as the MPI backend, so no transport needs 16-bit reductions
//! and every rank gets the same bits.
//!
//! Where the runtime hands over its buffers ([`Communicator::start_all_to_all_v`],
//! [`Communicator::start_all_gather_v`]: every synchronization scheme's
//! exchanges), the transport reads and writes them in place, through
//! `memoryview`s of the runtime's own memory: nothing is copied on either
//! side. A call that fails leaks both buffers, as a [`Pending`] dropped
//! unfinished does: the engine may still be moving their bytes. Calls on
//! borrowed buffers go through two `bytearray`s kept here.

use std::sync::Mutex;
use std::time::Instant;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyConnectionError, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyFloat, PyList, PyMemoryView, PySlice, PyTuple};
use qsync_kernels::reference::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use qsync_runtime::comm::{check_counts, check_gather_counts};
use qsync_runtime::sync::{f32_bytes, f32_from_bytes, u16_bytes};
use qsync_runtime::{CommError, Communicator, Deadline, Done, Pending, ReduceBuf};

const BACKEND: &str = "torch.distributed";

/// A communicator over a Python transport object.
#[derive(Debug)]
pub struct PyTransport {
    obj: Py<PyAny>,
    rank: usize,
    size: usize,
    /// The first failure; every later call fails fast with it.
    poisoned: Mutex<Option<String>>,
    /// The `bytearray`s a call on borrowed buffers sends from and receives
    /// into, kept while large enough: a fresh one a call would touch new
    /// pages, and a page fault costs microseconds on a virtual machine (a
    /// 16 MiB all-to-all through gloo took 37 ms into a fresh buffer, 13 ms
    /// reusing one; 4 ranks on 2 cores). They grow to the largest exchange.
    send: Mutex<Option<Py<PyByteArray>>>,
    recv: Mutex<Option<Py<PyByteArray>>>,
}

/// Vectors kept for the next exchanges ([`Communicator::send_buffer`],
/// [`Communicator::recycle`], and every exchange's send vector once it
/// has crossed), shared by every `PyTransport` of the process: a DDP job
/// synchronizes its buckets one after another, each on a transport of its
/// own, so one pool serves them all and holds at most [`SPARE_KEPT`]
/// vectors (the largest it was given). A new vector of a few MiB costs a
/// page fault every 4 KiB as gloo first writes it: one all-to-all of 16 MiB
/// a rank (4 ranks, 2 cores, `scripts/validate/gloo_probe.py`) took 29-30 ms
/// into new vectors, 12.5-14 ms with every vector's pages mapped already.
static SPARE: Mutex<Spare> = Mutex::new(Spare(Vec::new()));
const SPARE_KEPT: usize = 4;

/// Kept vectors (`SPARE`).
#[derive(Debug)]
struct Spare(Vec<Vec<u8>>);

impl Spare {
    /// The kept vector of the least capacity that holds `n` bytes, if any.
    fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        let v = &mut self.0;
        let i = (0..v.len()).filter(|&i| v[i].capacity() >= n).min_by_key(|&i| v[i].capacity())?;
        Some(v.swap_remove(i))
    }

    /// Keeps `v`, dropping the kept vector of the least capacity past
    /// [`SPARE_KEPT`].
    fn keep(&mut self, v: Vec<u8>) {
        if v.capacity() == 0 {
            return;
        }
        self.0.push(v);
        if self.0.len() > SPARE_KEPT {
            let i = (0..self.0.len()).min_by_key(|&i| self.0[i].capacity()).unwrap_or(0);
            self.0.swap_remove(i);
        }
    }
}

fn take_spare(n: usize) -> Option<Vec<u8>> {
    SPARE.lock().unwrap_or_else(|e| e.into_inner()).take(n)
}

fn keep_spare(v: Vec<u8>) {
    SPARE.lock().unwrap_or_else(|e| e.into_inner()).keep(v);
}

/// A writable `memoryview` of `len` bytes at `ptr`, owned by the caller.
///
/// # Safety
/// The memory must stay valid and unaliased while Python may read or write
/// it: until the call it is passed to has completed (the transport's calls
/// return only once their transfers have), or for ever where the call
/// failed (the caller leaks it).
#[allow(unsafe_code)]
unsafe fn raw_view<'py>(py: Python<'py>, ptr: *mut u8, len: usize) -> PyResult<Bound<'py, PyAny>> {
    let len = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err(format!("a buffer of {len} bytes")))?;
    // SAFETY: `ptr` points to `len` bytes valid for the view's use (above);
    // the view does not own them.
    unsafe {
        let view = pyo3::ffi::PyMemoryView_FromMemory(ptr.cast(), len, pyo3::ffi::PyBUF_WRITE);
        Bound::from_owned_ptr_or_err(py, view)
    }
}

impl PyTransport {
    /// Wraps `obj`, reading its `rank` and `size` attributes.
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let rank: usize = obj.getattr("rank")?.extract()?;
        let size: usize = obj.getattr("size")?.extract()?;
        if size == 0 || rank >= size {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("transport says rank {rank} of {size} ranks")));
        }
        Ok(PyTransport {
            obj: obj.clone().unbind(),
            rank,
            size,
            poisoned: Mutex::new(None),
            send: Mutex::new(None),
            recv: Mutex::new(None),
        })
    }

    /// A writable `memoryview` of the first `n` bytes of the `bytearray`
    /// kept in `slot` (a new, zeroed one where it is too small). The
    /// transport's calls are sequential and each is over (or the
    /// communicator poisoned) before the next one uses it.
    fn kept<'py>(py: Python<'py>, slot: &Mutex<Option<Py<PyByteArray>>>, n: usize) -> PyResult<Bound<'py, PyAny>> {
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        let buf = match slot.as_ref().map(|a| a.bind(py).clone()).filter(|a| a.len() >= n) {
            Some(a) => a,
            None => {
                let a = PyByteArray::new_with(py, n, |_| Ok(()))?;
                *slot = Some(a.clone().unbind());
                a
            }
        };
        PyMemoryView::from(buf.as_any())?.get_item(PySlice::new(py, 0, n as isize, 1))
    }

    /// `b` copied into the kept send `bytearray`, as a view of its first
    /// `b.len()` bytes, which torch views without another copy.
    fn staged<'py>(&self, py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let view = Self::kept(py, &self.send, b.len())?;
        // Through the buffer protocol: Python views of the bytearray (a
        // finished call's) see new contents in valid memory, as a bytearray
        // with exports cannot be resized.
        PyBuffer::<u8>::get(&view)?.copy_from_slice(py, b)?;
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

    /// Calls `method(*args, seconds_left)` on the transport; `args` builds
    /// the arguments and may return a value the caller reads after the
    /// call (the view its result was written to).
    fn call<T, F>(
        &self,
        op: &'static str,
        deadline: Deadline,
        method: &str,
        args: F,
    ) -> Result<(Py<PyAny>, T), CommError>
    where
        F: for<'py> FnOnce(Python<'py>) -> PyResult<(Vec<Bound<'py, PyAny>>, T)>,
    {
        self.check()?;
        let left = deadline.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.poison(CommError::Timeout { op, rank: self.rank, timeout: deadline.budget }));
        }
        Python::attach(|py| {
            let run = || -> PyResult<(Py<PyAny>, T)> {
                let (mut a, keep) = args(py)?;
                a.push(PyFloat::new(py, left.as_secs_f64()).into_any());
                let tuple = PyTuple::new(py, a)?;
                Ok((self.obj.bind(py).call_method1(method, tuple)?.unbind(), keep))
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

    /// Copies a kept view the transport filled into `out`.
    fn read_back(&self, op: &'static str, view: Py<PyAny>, out: &mut [u8]) -> Result<(), CommError> {
        Python::attach(|py| {
            PyBuffer::<u8>::get(view.bind(py)).and_then(|b| b.copy_to_slice(py, out)).map_err(|e| {
                self.poison(CommError::Backend {
                    backend: BACKEND,
                    op,
                    code: -1,
                    message: format!("reading back: {e}"),
                })
            })
        })
    }

    /// An all-gather of borrowed buffers, through the kept `bytearray`s.
    fn gather_kept(
        &self,
        op: &'static str,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        d: Deadline,
    ) -> Result<(), CommError> {
        let (_, view) = self.call(op, d, "all_gather", |py| {
            let r = Self::kept(py, &self.recv, recv.len())?;
            Ok((vec![self.staged(py, send)?, r.clone(), ints(py, counts)?], r.unbind()))
        })?;
        self.read_back(op, view, recv)
    }

    /// `method` on the runtime's own buffers, in place (module doc): `send`
    /// is read and a vector of `recv_len` bytes (a kept one where one is
    /// large enough, `SPARE`) filled, returned once the call completed,
    /// when `send` is kept; where it failed both are leaked.
    #[allow(unsafe_code)]
    fn owned<F>(
        &self,
        op: &'static str,
        d: Deadline,
        method: &str,
        send: Vec<u8>,
        recv_len: usize,
        extra: F,
    ) -> Result<Vec<u8>, CommError>
    where
        F: for<'py> FnOnce(Python<'py>, Bound<'py, PyAny>, Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>>,
    {
        let mut send = std::mem::ManuallyDrop::new(send);
        // Every byte of a kept vector is written by the call (each rank's
        // block); `resize` only zeroes what it grows.
        let recv = take_spare(recv_len).map(|mut v| {
            v.resize(recv_len, 0);
            v
        });
        let mut recv = std::mem::ManuallyDrop::new(recv.unwrap_or_else(|| vec![0u8; recv_len]));
        let (s, r) = ((send.as_mut_ptr(), send.len()), (recv.as_mut_ptr(), recv.len()));
        // Where the call fails, `?` leaves both leaked: a transfer the call
        // gave up on may still use them.
        self.call(op, d, method, |py| {
            // SAFETY: both vectors are neither read, moved nor freed until the
            // call returns, and are leaked where it fails.
            let (sv, rv) = unsafe { (raw_view(py, s.0, s.1)?, raw_view(py, r.0, r.1)?) };
            Ok((extra(py, sv, rv)?, ()))
        })?;
        keep_spare(std::mem::ManuallyDrop::into_inner(send));
        Ok(std::mem::ManuallyDrop::into_inner(recv))
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
        let all = self.start_all_gather_v(send, &vec![2 * buf.len(); self.size], deadline)?.wait(deadline)?;
        let n = buf.len();
        for (i, out) in buf.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for r in 0..self.size {
                let at = 2 * (r * n + i);
                acc += up(u16::from_le_bytes([all[at], all[at + 1]]));
            }
            *out = down(acc);
        }
        self.recycle(all);
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
        let (obj, ()) = self.call("split", deadline, "split", |py| Ok((vec![int(py, color)?, int(py, key)?], ())))?;
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
        if send.is_empty() {
            return Ok(());
        }
        self.gather_kept("all_gather", send, recv, &vec![send.len(); self.size], deadline)
    }

    fn all_gather_v(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<(), CommError> {
        check_gather_counts("all_gather_v", counts, self.size, self.rank, send.len(), recv.len())?;
        if recv.is_empty() {
            return Ok(());
        }
        self.gather_kept("all_gather_v", send, recv, counts, deadline)
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
        let (_, view) = self.call("all_to_all_v", deadline, "all_to_all_v", |py| {
            let r = Self::kept(py, &self.recv, recv.len())?;
            Ok((vec![self.staged(py, send)?, ints(py, send_counts)?, r.clone(), ints(py, recv_counts)?], r.unbind()))
        })?;
        self.read_back("all_to_all_v", view, recv)
    }

    fn start_all_to_all_v(
        &self,
        send: Vec<u8>,
        send_counts: &[usize],
        recv_counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        check_counts("all_to_all_v", send_counts, self.size, send.len())?;
        let total = recv_counts.iter().sum();
        check_counts("all_to_all_v", recv_counts, self.size, total)?;
        let recv = self.owned("all_to_all_v", deadline, "all_to_all_v", send, total, |py, s, r| {
            Ok(vec![s, ints(py, send_counts)?, r, ints(py, recv_counts)?])
        })?;
        Ok(Box::new(Done(recv)))
    }

    fn start_all_gather_v(
        &self,
        send: Vec<u8>,
        counts: &[usize],
        deadline: Deadline,
    ) -> Result<Box<dyn Pending>, CommError> {
        let total = counts.iter().sum();
        check_gather_counts("all_gather_v", counts, self.size, self.rank, send.len(), total)?;
        if total == 0 {
            return Ok(Box::new(Done(Vec::new())));
        }
        let recv = self
            .owned("all_gather_v", deadline, "all_gather", send, total, |py, s, r| Ok(vec![s, r, ints(py, counts)?]))?;
        Ok(Box::new(Done(recv)))
    }

    fn send_buffer(&self, capacity: usize) -> Vec<u8> {
        match take_spare(capacity) {
            Some(mut v) => {
                v.clear();
                v
            }
            None => Vec::with_capacity(capacity),
        }
    }

    fn recycle(&self, buf: Vec<u8>) {
        keep_spare(buf);
    }

    fn all_reduce_sum(&self, buf: ReduceBuf<'_>, deadline: Deadline) -> Result<(), CommError> {
        match buf {
            ReduceBuf::F32(b) => {
                if b.is_empty() {
                    return Ok(());
                }
                let (_, view) = self.call("all_reduce", deadline, "all_reduce_f32", |py| {
                    let v = self.staged(py, &f32_bytes(b))?;
                    Ok((vec![v.clone()], v.unbind()))
                })?;
                let mut out = vec![0u8; 4 * b.len()];
                self.read_back("all_reduce", view, &mut out)?;
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
        if buf.is_empty() {
            return Ok(());
        }
        let (_, view) = self.call("broadcast", deadline, "broadcast", |py| {
            let v = self.staged(py, buf)?;
            Ok((vec![v.clone(), int(py, root)?], v.unbind()))
        })?;
        self.read_back("broadcast", view, buf)
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), CommError> {
        self.call("barrier", deadline, "barrier", |_| Ok((Vec::new(), ()))).map(drop)
    }

    fn abort(&self, code: i32) -> ! {
        let _ = Python::attach(|py| self.obj.bind(py).call_method1("abort", (code,)).map(drop));
        std::process::exit(if code == 0 { 1 } else { code })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_hands_out_the_tightest_fit_and_keeps_the_largest() {
        let mut pool = Spare(Vec::new());
        pool.keep(Vec::new()); // nothing to keep
        assert!(pool.0.is_empty());
        for kib in [3, 1, 5, 2, 4] {
            pool.keep(Vec::with_capacity(kib << 10));
        }
        // Five given, four kept: the 1 KiB one went.
        let mut caps: Vec<usize> = pool.0.iter().map(|v| v.capacity() >> 10).collect();
        caps.sort();
        assert_eq!(caps, [2, 3, 4, 5]);
        // The least capacity that holds 2.5 KiB is 3 KiB; then 4 KiB.
        assert_eq!(pool.take(2560).map(|v| v.capacity() >> 10), Some(3));
        assert_eq!(pool.take(2560).map(|v| v.capacity() >> 10), Some(4));
        assert!(pool.take(6 << 10).is_none(), "no kept vector holds 6 KiB");
        assert_eq!(pool.0.len(), 2);
    }
}
