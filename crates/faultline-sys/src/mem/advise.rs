//! Advice on a range of a [`Mapping`]: [`Advice`] (`madvise` that changes no
//! data), NUMA binding (`mbind`), residency (`mincore`), and discarding pages
//! (`MADV_DONTNEED`, alone or over many scattered ranges at once with
//! `process_madvise`: the calls here that change content, hence `unsafe`),
//! and writing a shared file mapping's dirty pages back (`msync`).
//!
//! Invariants: every call first checks that the range lies inside the mapping
//! and refuses it with `EINVAL` otherwise, so none of them can touch memory
//! the mapping does not own. Each is one system call, but for a vector's
//! discard on a kernel before `PIDFD_SELF_THREAD` (which also opens and
//! closes a pidfd, after one refused try) and its fallback range by range;
//! no locks.

use super::Mapping;
use crate::{SysError, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, Ordering};

/// Advice that changes no data (safe to give at any time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `MADV_HUGEPAGE`: the range may be backed by transparent huge pages.
    HugePage,
    /// `MADV_NOHUGEPAGE`: never back the range by transparent huge pages.
    NoHugePage,
    /// `MADV_DONTFORK`: a child process does not inherit the range (keeps
    /// pages exclusive to this process, which `UFFDIO_MOVE` requires).
    DontFork,
    /// `MADV_POPULATE_WRITE`: fault the range in for writing now.
    PopulateWrite,
    /// `MADV_COLLAPSE`: back the (populated) range by transparent huge pages
    /// now, copying its pages into a new huge page; content is unchanged.
    Collapse,
    /// `MADV_RANDOM`: expect random access, so read no pages ahead of a
    /// fault (file mappings; the hint a user gives for random patterns).
    Random,
    /// `MADV_SEQUENTIAL`: expect sequential access, so read ahead
    /// aggressively and free pages soon after they are used.
    Sequential,
}

impl Advice {
    fn raw(self) -> libc::c_int {
        match self {
            Advice::HugePage => libc::MADV_HUGEPAGE,
            Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
            Advice::DontFork => libc::MADV_DONTFORK,
            Advice::PopulateWrite => 23, // MADV_POPULATE_WRITE, Linux 5.14
            Advice::Collapse => 25,      // MADV_COLLAPSE, Linux 6.1
            Advice::Random => libc::MADV_RANDOM,
            Advice::Sequential => libc::MADV_SEQUENTIAL,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Advice::HugePage => "madvise(MADV_HUGEPAGE)",
            Advice::NoHugePage => "madvise(MADV_NOHUGEPAGE)",
            Advice::DontFork => "madvise(MADV_DONTFORK)",
            Advice::PopulateWrite => "madvise(MADV_POPULATE_WRITE)",
            Advice::Collapse => "madvise(MADV_COLLAPSE)",
            Advice::Random => "madvise(MADV_RANDOM)",
            Advice::Sequential => "madvise(MADV_SEQUENTIAL)",
        }
    }
}

impl Mapping {
    /// Gives `advice` for the subrange `[addr, addr + len)`, which must lie
    /// inside the mapping.
    pub fn advise(&self, addr: usize, len: usize, advice: Advice) -> Result<(), SysError> {
        if !self.contains(addr, len) {
            return Err(SysError {
                op: advice.name(),
                addr,
                len,
                errno: libc::EINVAL,
            });
        }
        // SAFETY: the range lies inside a mapping we own, and none of these
        // advices changes the content of memory.
        let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice.raw()) };
        if rc != 0 {
            return Err(SysError::last(advice.name(), addr, len));
        }
        Ok(())
    }

    /// Writes the dirty pages of the whole mapping (a shared file mapping)
    /// to its file and waits for the writes (`msync(MS_SYNC)`): the
    /// kernel's counterpart of a faultline region's flush.
    pub fn sync(&self) -> Result<(), SysError> {
        // SAFETY: the range is this mapping's own; `msync` reads its pages
        // and changes nothing in memory.
        let rc =
            unsafe { libc::msync(self.addr() as *mut libc::c_void, self.len(), libc::MS_SYNC) };
        if rc != 0 {
            return Err(SysError::last("msync", self.addr(), self.len()));
        }
        Ok(())
    }

    /// Binds `[addr, addr + len)` (inside the mapping) to NUMA node `node`
    /// (`mbind(MPOL_BIND)`): pages populated there afterwards come from that
    /// node. Call before populating; pages already there are not moved.
    pub fn bind_node(&self, addr: usize, len: usize, node: u32) -> Result<(), SysError> {
        const MPOL_BIND: libc::c_long = 2;
        let einval = SysError {
            op: "mbind",
            addr,
            len,
            errno: libc::EINVAL,
        };
        if !self.contains(addr, len) || node >= 64 {
            return Err(einval);
        }
        let mask: u64 = 1 << node;
        // SAFETY: the range lies inside a mapping we own; `mask` is a valid
        // one-word node mask that outlives the call (maxnode = 64 bits), and
        // a memory policy never changes the content of memory.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                addr,
                len,
                MPOL_BIND,
                &mask as *const u64,
                64usize,
                0usize,
            )
        };
        if rc != 0 {
            return Err(SysError::last("mbind", addr, len));
        }
        Ok(())
    }

    /// Whether every page of `[addr, addr + len)` is mapped in the page
    /// tables right now (`mincore(2)`; `len` at most 64 pages).
    pub fn is_resident(&self, addr: usize, len: usize) -> Result<bool, SysError> {
        let mut vec = [0u8; 64];
        let pages = len.div_ceil(PAGE_SIZE);
        if !self.contains(addr, len) || pages > vec.len() {
            return Err(SysError {
                op: "mincore",
                addr,
                len,
                errno: libc::EINVAL,
            });
        }
        // SAFETY: the range lies inside our mapping and `vec` has room for
        // one byte per page of it.
        let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(SysError::last("mincore", addr, len));
        }
        Ok(vec[..pages].iter().all(|b| b & 1 == 1))
    }

    /// `MADV_DONTNEED` on `[addr, addr + len)`: drops the pages there (a
    /// later touch reads zeros, or faults to userfaultfd on a registered
    /// range) and, with `CONFIG_PT_RECLAIM`, frees page tables left empty.
    ///
    /// # Safety
    /// The range must lie inside the mapping, and no live Rust reference may
    /// point into it: its bytes change without a write through any reference.
    pub unsafe fn discard(&self, addr: usize, len: usize) -> Result<(), SysError> {
        if !self.contains(addr, len) {
            return Err(SysError {
                op: "madvise(MADV_DONTNEED)",
                addr,
                len,
                errno: libc::EINVAL,
            });
        }
        // SAFETY: inside our mapping (checked above); the caller guarantees
        // no reference observes the discarded bytes.
        let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(SysError::last("madvise(MADV_DONTNEED)", addr, len));
        }
        Ok(())
    }

    /// [`Mapping::discard`] of many scattered ranges in one call:
    /// `process_madvise(MADV_DONTNEED)` over an iovec of them (at most
    /// 1024), which Linux 6.18 zaps with one TLB flush for the whole vector
    /// where a call per range flushes once each (measurements.md, "Does
    /// Linux batch the TLB flush"). Falls back to a call per range on a
    /// kernel without it (`ENOSYS`, `EINVAL`: before 5.10, or before
    /// `MADV_DONTNEED` was accepted there, `ESRCH`). The process is named
    /// by the kernel's `PIDFD_SELF_THREAD` (Linux 6.15 and later: no
    /// descriptor at all, and always the calling thread, whose memory is
    /// the process's, also in a child of `fork()`); a kernel that does not
    /// know it refuses it with `EBADF`, and from then on a pidfd is opened
    /// per call (one kept would name the parent in a child of `fork()`).
    ///
    /// # Safety
    /// As [`Mapping::discard`], for every range.
    pub unsafe fn discard_many(&self, ranges: &[(usize, usize)]) -> Result<(), SysError> {
        if let Some(&(addr, len)) = ranges.iter().find(|&&(a, l)| !self.contains(a, l)) {
            return Err(SysError {
                op: "process_madvise(MADV_DONTNEED)",
                addr,
                len,
                errno: libc::EINVAL,
            });
        }
        for chunk in ranges.chunks(1024) {
            // SAFETY: the caller's contract; every range checked above.
            unsafe { self.discard_vector(chunk) }?;
        }
        Ok(())
    }

    /// One `process_madvise` over at most 1024 checked ranges.
    ///
    /// # Safety
    /// As [`Mapping::discard_many`].
    unsafe fn discard_vector(&self, ranges: &[(usize, usize)]) -> Result<(), SysError> {
        let (addr, _) = ranges[0];
        let total: usize = ranges.iter().map(|&(_, l)| l).sum();
        let fallback = || {
            for &(a, l) in ranges {
                // SAFETY: the caller's contract.
                unsafe { self.discard(a, l) }?;
            }
            Ok(())
        };
        let iov: Vec<libc::iovec> = ranges
            .iter()
            .map(|&(a, l)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: l,
            })
            .collect();
        // SAFETY: `iov` describes ranges inside this mapping (checked by
        // the caller) and lives across the call; the caller guarantees no
        // reference observes their bytes.
        let Some(advised) = (unsafe { madvise_self(&iov) }) else {
            return fallback();
        };
        match advised {
            Ok(n) if n == total => Ok(()),
            // A partial advice: the rest one range at a time (DONTNEED of an
            // empty range is harmless, so ranges already done may repeat).
            Ok(_) => fallback(),
            Err(libc::ENOSYS | libc::EINVAL | libc::EPERM | libc::ESRCH) => fallback(),
            Err(errno) => Err(SysError {
                op: "process_madvise(MADV_DONTNEED)",
                addr,
                len: total,
                errno,
            }),
        }
    }
}

/// The kernel's name for the calling thread in pidfd-taking calls
/// (`PIDFD_SELF_THREAD`, `linux/fcntl.h`, Linux 6.15; the C headers here
/// are older). `process_madvise` acts on its memory, which is the
/// process's; unlike the thread-group leader's name, it stays valid after
/// the main thread has exited.
const PIDFD_SELF_THREAD: libc::c_int = -10000;

/// Set once a kernel refused [`PIDFD_SELF_THREAD`] (`EBADF`: it predates
/// the sentinel), so later calls open a pidfd at once. Relaxed: a hint; a
/// call that misses it only tries the sentinel once more.
static SELF_SENTINEL_REFUSED: AtomicBool = AtomicBool::new(false);

/// What `process_madvise` answered: bytes advised, or its `errno`.
type Advised = Result<usize, i32>;

/// `process_madvise(MADV_DONTNEED)` of `iov` in this process, naming it by
/// [`PIDFD_SELF_THREAD`] unless a kernel refused that; `None` if it must
/// be named by a pidfd and none can be opened (out of descriptors, or a
/// seccomp filter).
///
/// # Safety
/// As [`process_madvise`], for this process.
unsafe fn madvise_self(iov: &[libc::iovec]) -> Option<Advised> {
    // SAFETY: the caller's contract.
    unsafe { madvise_naming_self(PIDFD_SELF_THREAD, &SELF_SENTINEL_REFUSED, iov) }
}

/// [`madvise_self`] with the sentinel `sentinel`, and `refused` to
/// remember a kernel's refusal of it (`EBADF`): then, and from then on, a
/// pidfd opened for the call ([`madvise_by_pidfd`]).
///
/// # Safety
/// As [`process_madvise`], for this process.
unsafe fn madvise_naming_self(
    sentinel: libc::c_int,
    refused: &AtomicBool,
    iov: &[libc::iovec],
) -> Option<Advised> {
    if !refused.load(Ordering::Relaxed) {
        // SAFETY: the caller's contract; `sentinel` names this process.
        match unsafe { process_madvise(sentinel, iov) } {
            Err(libc::EBADF) => refused.store(true, Ordering::Relaxed),
            done => return Some(done),
        }
    }
    // SAFETY: the caller's contract.
    unsafe { madvise_by_pidfd(iov) }
}

/// [`madvise_self`] through a pidfd of this process opened for the call
/// (kernels before [`PIDFD_SELF_THREAD`]); `None` if none can be opened.
///
/// # Safety
/// As [`process_madvise`], for this process.
unsafe fn madvise_by_pidfd(iov: &[libc::iovec]) -> Option<Advised> {
    // SAFETY: pidfd_open takes no pointers; the descriptor is owned (closed
    // on every path) by `OwnedFd`.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if raw < 0 {
        return None;
    }
    // SAFETY: a descriptor the call above just opened, owned by nobody else.
    let pidfd =
        unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw as i32) };
    // SAFETY: the caller's contract; `pidfd` names this process. The
    // answer (and its errno) is taken before `pidfd` closes.
    Some(unsafe { process_madvise(std::os::fd::AsRawFd::as_raw_fd(&pidfd), iov) })
}

/// `process_madvise(pidfd, iov, MADV_DONTNEED)`, its `errno` read at once.
///
/// # Safety
/// `iov` describes ranges of the process `pidfd` names whose bytes no
/// reference observes (they read back as zeros afterwards).
unsafe fn process_madvise(pidfd: libc::c_int, iov: &[libc::iovec]) -> Advised {
    // SAFETY: the caller's contract; `iov` is valid for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            pidfd,
            iov.as_ptr(),
            iov.len(),
            libc::MADV_DONTNEED,
            0u32,
        )
    };
    if rc < 0 {
        return Err(crate::last_errno());
    }
    Ok(rc as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HUGE_PAGE_SIZE;

    #[test]
    fn access_pattern_hints_on_a_file_mapping() {
        let path =
            std::env::temp_dir().join(format!("faultline-sys-advise-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("create");
        f.set_len(4 * PAGE_SIZE as u64).expect("set_len");
        let m = Mapping::shared_file(&f, 4 * PAGE_SIZE).expect("mmap");
        let _ = std::fs::remove_file(&path);
        for a in [Advice::Random, Advice::Sequential] {
            m.advise(m.addr(), m.len(), a).expect("madvise");
        }
        assert_eq!(
            m.advise(m.addr(), m.len() + PAGE_SIZE, Advice::Random)
                .map_err(|e| e.op),
            Err("madvise(MADV_RANDOM)"),
            "a range past the mapping is refused"
        );
    }

    #[test]
    fn bind_to_an_online_node() {
        let m = Mapping::anonymous(HUGE_PAGE_SIZE, HUGE_PAGE_SIZE).expect("mmap");
        let node = crate::host::numa_nodes()[0];
        m.bind_node(m.addr(), m.len(), node).expect("mbind");
        m.advise(m.addr(), m.len(), Advice::PopulateWrite)
            .expect("populate");
        assert!(m.is_resident(m.addr(), PAGE_SIZE).expect("mincore"));
        assert_eq!(
            m.bind_node(m.addr(), m.len(), 63).map_err(|e| e.op),
            Err("mbind"),
            "node 63 is not online here"
        );
    }

    #[test]
    fn discard_many_drops_exactly_the_ranges_given() {
        let m = Mapping::anonymous(HUGE_PAGE_SIZE, HUGE_PAGE_SIZE).expect("mmap");
        m.advise(m.addr(), m.len(), Advice::NoHugePage)
            .expect("nohugepage");
        let pages = HUGE_PAGE_SIZE / PAGE_SIZE;
        for i in 0..pages {
            // SAFETY: inside the mapping, which nothing else references.
            unsafe { std::ptr::write_volatile((m.addr() + i * PAGE_SIZE) as *mut u8, 1) };
        }
        let dropped: Vec<(usize, usize)> = (0..pages)
            .filter(|i| i % 7 == 3)
            .map(|i| (m.addr() + i * PAGE_SIZE, PAGE_SIZE))
            .collect();
        // SAFETY: nothing references the mapping's bytes.
        unsafe { m.discard_many(&dropped) }.expect("process_madvise");
        for i in 0..pages {
            // SAFETY: as above.
            let v = unsafe { std::ptr::read_volatile((m.addr() + i * PAGE_SIZE) as *const u8) };
            assert_eq!(v, u8::from(i % 7 != 3), "page {i}");
        }
        let outside = [(m.addr(), PAGE_SIZE), (m.addr() + m.len(), PAGE_SIZE)];
        // SAFETY: refused before anything is dropped.
        let refused = unsafe { m.discard_many(&outside) };
        assert_eq!(refused.map_err(|e| e.errno), Err(libc::EINVAL));
        // SAFETY: as above.
        let first = unsafe { std::ptr::read_volatile(m.addr() as *const u8) };
        assert_eq!(first, 1, "nothing dropped");
    }

    /// Each way of naming this process to `process_madvise` drops exactly
    /// the pages given: the kernel's sentinel (on a kernel before 6.15 it
    /// is refused, and the call goes through a pidfd, remembered), a name
    /// no kernel knows (refused: through a pidfd, remembered), and a pidfd.
    #[test]
    fn every_way_of_naming_this_process_drops_the_same_pages() {
        let sentinel_refused = AtomicBool::new(false);
        let unknown_refused = AtomicBool::new(false);
        for name in ["sentinel", "unknown name", "pidfd"] {
            let pages = 16;
            let m = Mapping::anonymous(pages * PAGE_SIZE, PAGE_SIZE).expect("mmap");
            for i in 0..pages {
                // SAFETY: inside the mapping, which nothing else references.
                unsafe { std::ptr::write_volatile((m.addr() + i * PAGE_SIZE) as *mut u8, 7) };
            }
            let dropped = [1, 4, 5, 11];
            let iov: Vec<libc::iovec> = dropped
                .iter()
                .map(|&i| libc::iovec {
                    iov_base: (m.addr() + i * PAGE_SIZE) as *mut libc::c_void,
                    iov_len: PAGE_SIZE,
                })
                .collect();
            // SAFETY: the ranges are inside the test's own mapping, and
            // nothing references their bytes.
            let advised = unsafe {
                match name {
                    "sentinel" => madvise_naming_self(PIDFD_SELF_THREAD, &sentinel_refused, &iov),
                    "unknown name" => madvise_naming_self(-10_999, &unknown_refused, &iov),
                    _ => madvise_by_pidfd(&iov),
                }
            };
            assert_eq!(advised, Some(Ok(4 * PAGE_SIZE)), "{name}");
            for i in 0..pages {
                // SAFETY: as above.
                let v = unsafe { std::ptr::read_volatile((m.addr() + i * PAGE_SIZE) as *const u8) };
                let want = if dropped.contains(&i) { 0 } else { 7 };
                assert_eq!(v, want, "{name}: page {i}");
            }
        }
        assert!(
            unknown_refused.load(Ordering::Relaxed),
            "an unknown name is remembered as refused"
        );
        // This project's kernel (6.18) knows the sentinel: a refusal there
        // would cost two more system calls per batch.
        let knows = kernel_at_least(6, 15);
        assert_eq!(
            sentinel_refused.load(Ordering::Relaxed),
            !knows,
            "PIDFD_SELF_THREAD refused on a kernel that has it, or taken on one without"
        );
    }

    /// Whether the running kernel's release is at least `major.minor`.
    fn kernel_at_least(major: u32, minor: u32) -> bool {
        let release = crate::host::kernel_release();
        let mut parts = release
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (a, b) >= (major, minor)
    }
}
