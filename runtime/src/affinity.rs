//! The cores a process may run on, and pinning it to one: what
//! `qsyncc host-kernels --corun` needs to time the kernels in one process
//! a core, as a machine's ranks run them.

#![allow(unsafe_code)]

use std::io;

/// The cores the calling process may run on (its CPU affinity), in
/// increasing order. Linux only.
#[cfg(target_os = "linux")]
pub fn allowed_cores() -> io::Result<Vec<usize>> {
    // SAFETY: `set` is a plain bit set owned here; `sched_getaffinity`
    // writes at most `size_of::<cpu_set_t>()` bytes into it, and `CPU_ISSET`
    // reads a bit below `CPU_SETSIZE`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// Pins the calling thread, and the threads it starts afterwards, to
/// `core` (called first thing in a process: the whole process). Linux
/// only.
#[cfg(target_os = "linux")]
pub fn pin_to_core(core: usize) -> io::Result<()> {
    if core >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("core {core} is beyond the CPU set")));
    }
    // SAFETY: as above; `CPU_SET` sets a bit below `CPU_SETSIZE` (checked).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pinned_to_an_allowed_core_runs_there_only() {
        let cores = allowed_cores().expect("affinity");
        assert!(!cores.is_empty());
        // On a thread of its own, so the test harness's threads keep theirs.
        let last = *cores.last().expect("a core");
        let got = std::thread::spawn(move || {
            pin_to_core(last).expect("pin");
            allowed_cores().expect("affinity")
        })
        .join()
        .expect("thread");
        assert_eq!(got, vec![last]);
        assert!(pin_to_core(libc::CPU_SETSIZE as usize).is_err());
    }
}
