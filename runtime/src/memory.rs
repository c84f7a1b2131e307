//! Keeping freed memory in the process, so a synchronization's buffers are
//! not page-faulted anew at every call.
//!
//! Each scheme allocates buffers the size of the gradient, or a fraction of
//! it (codes, received blocks, partial sums). glibc's allocator serves
//! blocks of 32 MiB and more with a fresh `mmap` each time and returns the
//! top of its heap to the kernel when it frees more than a threshold; either
//! way the next call touches new pages, and on a virtual machine a page
//! fault costs microseconds (2.9 µs a 4 KiB page measured on the build
//! machine: 47 ms for a 64 MiB buffer, against 4.5 ms to write it once its
//! pages are there). `qsyncc sync-bench` reports the faults a
//! synchronization takes (`page_faults_per_sync`).
//!
//! [`retain_freed_memory`] tells glibc to serve every block from its heap
//! and never trim it, as MPI libraries do for registered memory: a
//! process's synchronization buffers are then faulted in once and reused.
//! It changes the whole process's allocator, so only a program that owns
//! its process calls it (`qsyncc`'s benchmarks). Inside a PyTorch process
//! the DDP hook's buffers follow PyTorch's allocator settings (DDP's default
//! 25 MiB buckets stay under glibc's 32 MiB `mmap` limit).

#![allow(unsafe_code)]

/// Makes glibc keep freed memory in the process (no `mmap` for large
/// blocks, no trimming of the heap). Returns whether both settings took
/// effect (`false` off glibc, where it does nothing).
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes allocator parameters; it is safe
        // to call at any time, and the values are within its documented
        // ranges (0 blocks served by mmap; a trim threshold of INT_MAX).
        let mmap = unsafe { libc::mallopt(libc::M_MMAP_MAX, 0) };
        let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) };
        mmap == 1 && trim == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
