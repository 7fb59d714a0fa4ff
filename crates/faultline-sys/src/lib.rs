//! Raw Linux interfaces for faultline, and the only crate in the workspace that
//! makes system calls or ioctls.
//!
//! Its modules:
//! - [`uffd`]: a `userfaultfd` context — opening it, the `UFFDIO_API` handshake
//!   that probes features at run time, (un)registration and the resolving
//!   ioctls (`MOVE`, `COPY`, `ZEROPAGE`, `WRITEPROTECT`, `WAKE`, `POISON`).
//!   The system C headers are older than the kernel, so every ioctl number and
//!   structure is defined here by hand from `include/uapi/linux/userfaultfd.h`.
//! - [`mem`]: anonymous mappings (an owning [`mem::Mapping`]), `madvise`.
//! - [`host`]: facts about the machine (page size, physical memory, THP mode,
//!   current CPU and the CPUs this process may use, cycle counter).
//! - [`cpu_idle`]: how long the CPUs the calling thread may run on (or a given
//!   set) stood idle.
//! - [`cpu_quota`]: the CPU quota over this process's cgroup, and how much of
//!   it went unused.
//! - [`cgroup`]: memory cgroups on v1 and v2 (where mounted, this process's,
//!   a child with a limit for the benches).
//! - [`interpose`]: for a library interposing libc's memory and file calls
//!   (`LD_PRELOAD`): the next definition of each, and facts of a descriptor.
//! - [`io`]: reads polled on a per-thread `io_uring` (the file store's direct reads).
//! - [`lock`]: open-file-description byte-range locks (`F_OFD_SETLK`), which
//!   keep a file range mapped writable by one process only.
//! - [`signal`]: the SIGBUS handler's plumbing for faults served in the
//!   faulting thread (install, read the siginfo, pass a signal on).
//!
//! Every error carries the errno and the address range it concerned. Results
//! that are part of normal operation (`EAGAIN`, `EEXIST`, `ENOENT` from a
//! resolving ioctl) are outcome enums the caller matches, never errors.
//!
//! No locks are taken here; every function is a thin wrapper around one
//! system call.

pub mod cgroup;
pub mod cpu_idle;
pub mod cpu_quota;
pub mod host;
pub mod interpose;
pub mod io;
pub mod lock;
pub mod mem;
pub mod signal;
pub mod uffd;

/// Size of a base page on x86_64 and aarch64-4k: 4 KiB.
pub const PAGE_SIZE: usize = 4096;
/// Size of a PMD-mapped transparent huge page: 2 MiB.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// The `errno` of the last failed system call on this thread.
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A failed system call: which one, on what range, and the errno. Its text
/// names the range only when there is one (`addr` or `len` non-zero): a
/// call on no range (an `eventfd`, a `sigaction`) reads `{op} failed: ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{op}{} failed: {} (errno {errno})", range_text(*addr, *len), std::io::Error::from_raw_os_error(*errno))]
pub struct SysError {
    /// The operation, e.g. `"mmap"` or `"UFFDIO_MOVE"`.
    pub op: &'static str,
    /// Start of the address range the call concerned (0 if none).
    pub addr: usize,
    /// Length of the range (0 if none).
    pub len: usize,
    /// The raw errno.
    pub errno: i32,
}

/// ` on ADDR+LEN` for a call on a range, nothing for one on none.
fn range_text(addr: usize, len: usize) -> String {
    if addr == 0 && len == 0 {
        String::new()
    } else {
        format!(" on {addr:#x}+{len:#x}")
    }
}

impl SysError {
    pub(crate) fn last(op: &'static str, addr: usize, len: usize) -> Self {
        Self {
            op,
            addr,
            len,
            errno: last_errno(),
        }
    }
}
