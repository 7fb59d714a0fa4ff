//! The C symbols the library defines in place of libc's (`LD_PRELOAD`
//! puts them first). Each is a thin gate: a call that cannot concern a
//! served mapping (an anonymous `mmap`, any call while nothing is served,
//! a call faultline itself makes: `reentry.rs`) goes to libc's definition
//! at once; the rest goes to `mappings.rs` or `coherence.rs`, under
//! `catch_unwind` (nothing unwinds into C: a panic is said on stderr and
//! the call goes to libc), and a refusal sets `errno`.
//!
//! `mremap` is defined with its optional fifth argument as a fixed one:
//! integer arguments travel in the same registers either way on x86_64 and
//! aarch64, and the fifth is only read with `MREMAP_FIXED`, when the
//! caller passes it.
//!
//! Locks: none of its own.

use crate::coherence::{self, Write};
use crate::mappings::{self, any, any_writable, MapCall, Outcome, OFF, PAGE};
use crate::reentry::Inside;
use faultline_sys::host::set_errno;
use faultline_sys::interpose as next;
use libc::{iovec, off_t};
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

/// Runs `body` for an interposed call; `None` if it panicked (said once).
fn caught<T>(body: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(body))
        .map_err(|_| {
            mappings::say_once("internal error (a faultline bug): the call went to libc".into())
        })
        .ok()
}

/// The program's `n` bytes at `buf`, copied out one volatile read at a
/// time (the program may change them meanwhile, as it may during any
/// `write(2)`: never a `&[u8]` over them).
///
/// # Safety
/// `buf..buf + n` is readable (the caller's `write` contract).
unsafe fn copy_from_program(buf: *const c_void, n: usize) -> Vec<u8> {
    let p = buf.cast::<u8>();
    // SAFETY: each byte is inside the readable range (the contract).
    (0..n)
        .map(|i| unsafe { p.add(i).read_volatile() })
        .collect()
}

/// The bytes of `iov` (`count` entries), copied out as
/// [`copy_from_program`] does.
///
/// # Safety
/// `iov` holds `count` entries, each readable for its length.
unsafe fn copy_iov(iov: *const iovec, count: c_int) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count.max(0) as usize {
        // SAFETY: entry i is inside the array (the contract).
        let v = unsafe { *iov.add(i) };
        // SAFETY: the entry's buffer is readable for its length.
        out.extend(unsafe { copy_from_program(v.iov_base, v.iov_len) });
    }
    out
}

/// The total length of `iov`.
///
/// # Safety
/// As [`copy_iov`].
unsafe fn iov_len(iov: *const iovec, count: c_int) -> usize {
    // SAFETY: entry i is inside the array (the contract).
    (0..count.max(0) as usize)
        .map(|i| unsafe { (*iov.add(i)).iov_len })
        .sum()
}

/// `mmap(2)`: a file mapping that `FAULTLINE_FILES` names, and a private
/// anonymous one of at least `FAULTLINE_ANON_MIN` bytes, are served by
/// faultline; anything else is libc's.
///
/// # Safety
/// `mmap(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    // SAFETY: the caller's own arguments, to libc's mmap.
    let libc_mmap = || unsafe { next::next_mmap(addr, len, prot, flags, fd, offset) };
    let anonymous = flags & libc::MAP_ANONYMOUS != 0;
    if OFF.load(Ordering::Relaxed)
        || (anonymous && !mappings::anonymous_served(len))
        || (!anonymous && fd < 0)
    {
        return libc_mmap();
    }
    let Some(_inside) = Inside::enter() else {
        return libc_mmap();
    };
    let call = MapCall {
        addr: addr as usize,
        len,
        prot,
        flags,
        fd,
        offset,
    };
    let served = if anonymous {
        caught(|| mappings::map_anonymous(call))
    } else {
        caught(|| mappings::map_file(call))
    };
    match served {
        Some(Outcome::Done(a)) => a as *mut c_void,
        Some(Outcome::Failed(errno)) => {
            set_errno(errno);
            libc::MAP_FAILED
        }
        Some(Outcome::Kernel) | None => libc_mmap(),
    }
}

/// `mmap64`: the same function as `mmap` on 64-bit Linux.
///
/// # Safety
/// `mmap(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    // SAFETY: the same contract.
    unsafe { mmap(addr, len, prot, flags, fd, offset) }
}

/// Runs an address-range call: `served` if it may touch a served mapping,
/// else `libc`; `failed` is the C return value of a refusal.
fn ranged<T>(
    addr: *mut c_void,
    len: usize,
    libc: impl FnOnce() -> T,
    failed: T,
    served: impl FnOnce(std::ops::Range<usize>) -> Outcome<T>,
) -> T {
    let start = addr as usize;
    if !any() || start % PAGE != 0 {
        return libc();
    }
    let Some(_inside) = Inside::enter() else {
        return libc();
    };
    let range = start..start.saturating_add(mappings::pages_of(len));
    match caught(|| served(range)) {
        Some(Outcome::Done(v)) => v,
        Some(Outcome::Failed(errno)) => {
            set_errno(errno);
            failed
        }
        Some(Outcome::Kernel) | None => libc(),
    }
}

/// `munmap(2)`: a served mapping is written back and closed (a part of
/// one: written back, dropped and kept reserved).
///
/// # Safety
/// `munmap(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: the caller's own arguments, to libc's munmap.
    let libc_munmap = || unsafe { next::next_munmap(addr, len) };
    ranged(addr, len, libc_munmap, -1, |r| {
        mappings::unmap(r).map(|()| 0)
    })
}

/// `mremap(2)` (see the module's note on its fifth argument).
///
/// # Safety
/// `mremap(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let new_addr = if flags & libc::MREMAP_FIXED != 0 {
        new_addr
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: the caller's own arguments, to the system call.
    let libc_mremap = || unsafe { next::next_mremap(old, old_len, new_len, flags, new_addr) };
    ranged(old, old_len, libc_mremap, libc::MAP_FAILED, |r| {
        mappings::remap(r.start, old_len, new_len, flags).map(|a| a as *mut c_void)
    })
}

/// `msync(2)`: served writable mappings in the range are written back
/// and made durable (also for `MS_ASYNC`).
///
/// # Safety
/// `msync(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn msync(addr: *mut c_void, len: usize, flags: c_int) -> c_int {
    // SAFETY: the caller's own arguments, to libc's msync.
    let libc_msync = || unsafe { next::next_msync(addr, len, flags) };
    ranged(addr, len, libc_msync, -1, |r| match mappings::sync(r) {
        Ok(()) => Outcome::Kernel,
        Err(e) => Outcome::Failed(e),
    })
}

/// `madvise(2)` (`mappings.rs` says what each advice does to a served
/// mapping).
///
/// # Safety
/// `madvise(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: the caller's own arguments, to libc's madvise.
    let libc_madvise = || unsafe { next::next_madvise(addr, len, advice) };
    ranged(addr, len, libc_madvise, -1, |r| {
        mappings::advise(r, advice).map(|()| 0)
    })
}

/// `mprotect(2)`: accepted without effect on a served mapping, unless it
/// asks for write on a read-only one (`EACCES`).
///
/// # Safety
/// `mprotect(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    // SAFETY: the caller's own arguments, to libc's mprotect.
    let libc_mprotect = || unsafe { next::next_mprotect(addr, len, prot) };
    ranged(addr, len, libc_mprotect, -1, |r| {
        mappings::protect(r, prot).map(|()| 0)
    })
}

/// Runs a write through `fd` at `at` (`None`: its position) of the bytes
/// `copy` returns, made by `libc`, kept coherent with served mappings.
fn written(
    fd: c_int,
    at: Option<u64>,
    copy: impl FnOnce() -> Vec<u8>,
    libc: impl FnOnce() -> isize,
) -> isize {
    if !any() {
        return libc();
    }
    let Some(_inside) = Inside::enter() else {
        return libc();
    };
    let Some(Some(w)) = caught(|| Write::before(fd, at, copy)) else {
        return libc();
    };
    let n = libc();
    if n > 0 {
        let _ = caught(|| w.after(fd, n as usize));
    }
    n
}

/// `write(2)`, kept coherent with served mappings of the file.
///
/// # Safety
/// `write(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    // SAFETY: `buf` is readable for `n` bytes (write's contract).
    let copy = || unsafe { copy_from_program(buf, n) };
    // SAFETY: the caller's own arguments, to libc's write.
    written(fd, None, copy, || unsafe { next::next_write(fd, buf, n) })
}

/// `pwrite(2)`, kept coherent with served mappings of the file.
///
/// # Safety
/// `pwrite(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: usize, offset: off_t) -> isize {
    // SAFETY: `buf` is readable for `n` bytes (pwrite's contract).
    let copy = || unsafe { copy_from_program(buf, n) };
    let at = u64::try_from(offset).ok();
    // SAFETY: the caller's own arguments, to libc's pwrite.
    let libc_pwrite = || unsafe { next::next_pwrite(fd, buf, n, offset) };
    match at {
        Some(at) => written(fd, Some(at), copy, libc_pwrite),
        None => libc_pwrite(),
    }
}

/// `pwrite64`: the same function as `pwrite` on 64-bit Linux.
///
/// # Safety
/// `pwrite(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: usize, offset: off_t) -> isize {
    // SAFETY: the same contract.
    unsafe { pwrite(fd, buf, n, offset) }
}

/// `writev(2)`, kept coherent with served mappings of the file.
///
/// # Safety
/// `writev(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, count: c_int) -> isize {
    // SAFETY: `iov` holds `count` readable buffers (writev's contract).
    let copy = || unsafe { copy_iov(iov, count) };
    // SAFETY: the caller's own arguments, to libc's writev.
    written(fd, None, copy, || unsafe {
        next::next_writev(fd, iov, count)
    })
}

/// `pwritev(2)`, kept coherent with served mappings of the file.
///
/// # Safety
/// `pwritev(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> isize {
    // SAFETY: `iov` holds `count` readable buffers (pwritev's contract).
    let copy = || unsafe { copy_iov(iov, count) };
    // SAFETY: the caller's own arguments, to libc's pwritev.
    let libc_pwritev = || unsafe { next::next_pwritev(fd, iov, count, offset) };
    match u64::try_from(offset) {
        Ok(at) => written(fd, Some(at), copy, libc_pwritev),
        Err(_) => libc_pwritev(),
    }
}

/// `pwritev64`: the same function as `pwritev` on 64-bit Linux.
///
/// # Safety
/// `pwritev(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> isize {
    // SAFETY: the same contract.
    unsafe { pwritev(fd, iov, count, offset) }
}

/// Before a read of `len` bytes through `fd` at `at` (`None`: its
/// position): served writable mappings of the file are written back.
fn before_read(fd: c_int, at: Option<u64>, len: usize) {
    if !any_writable() {
        return;
    }
    if let Some(_inside) = Inside::enter() {
        let _ = caught(|| coherence::before_read(fd, at, len));
    }
}

/// `read(2)`: served writable mappings of the file are written back first.
///
/// # Safety
/// `read(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    before_read(fd, None, n);
    // SAFETY: the caller's own arguments, to libc's read.
    unsafe { next::next_read(fd, buf, n) }
}

/// `pread(2)`: served writable mappings of the file are written back first.
///
/// # Safety
/// `pread(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: usize, offset: off_t) -> isize {
    if let Ok(at) = u64::try_from(offset) {
        before_read(fd, Some(at), n);
    }
    // SAFETY: the caller's own arguments, to libc's pread.
    unsafe { next::next_pread(fd, buf, n, offset) }
}

/// `pread64`: the same function as `pread` on 64-bit Linux.
///
/// # Safety
/// `pread(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: usize, offset: off_t) -> isize {
    // SAFETY: the same contract.
    unsafe { pread(fd, buf, n, offset) }
}

/// `readv(2)`: served writable mappings of the file are written back first.
///
/// # Safety
/// `readv(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, count: c_int) -> isize {
    if any_writable() {
        // SAFETY: `iov` holds `count` entries (readv's contract).
        before_read(fd, None, unsafe { iov_len(iov, count) });
    }
    // SAFETY: the caller's own arguments, to libc's readv.
    unsafe { next::next_readv(fd, iov, count) }
}

/// `preadv(2)`: served writable mappings of the file are written back first.
///
/// # Safety
/// `preadv(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn preadv(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> isize {
    if any_writable() {
        if let Ok(at) = u64::try_from(offset) {
            // SAFETY: `iov` holds `count` entries (preadv's contract).
            before_read(fd, Some(at), unsafe { iov_len(iov, count) });
        }
    }
    // SAFETY: the caller's own arguments, to libc's preadv.
    unsafe { next::next_preadv(fd, iov, count, offset) }
}

/// `preadv64`: the same function as `preadv` on 64-bit Linux.
///
/// # Safety
/// `preadv(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> isize {
    // SAFETY: the same contract.
    unsafe { preadv(fd, iov, count, offset) }
}

/// `ftruncate(2)`: served mappings drop the pages past the new end.
///
/// # Safety
/// `ftruncate(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    // SAFETY: the caller's own arguments, to libc's ftruncate.
    let rc = unsafe { next::next_ftruncate(fd, len) };
    if rc == 0 && any() {
        if let (Some(_inside), Ok(len)) = (Inside::enter(), u64::try_from(len)) {
            let _ = caught(|| coherence::after_truncate(fd, len));
        }
    }
    rc
}

/// `ftruncate64`: the same function as `ftruncate` on 64-bit Linux.
///
/// # Safety
/// `ftruncate(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    // SAFETY: the same contract.
    unsafe { ftruncate(fd, len) }
}

/// Before an `fsync`/`fdatasync` of `fd`: its served writable mappings are
/// written back; `false` (errno set) if that failed.
fn synced_mappings(fd: c_int) -> bool {
    if !any_writable() {
        return true;
    }
    let Some(_inside) = Inside::enter() else {
        return true;
    };
    match caught(|| coherence::before_sync(fd)) {
        Some(Err(errno)) => {
            set_errno(errno);
            false
        }
        _ => true,
    }
}

/// `fsync(2)`: served writable mappings of the file are written back first.
///
/// # Safety
/// `fsync(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if !synced_mappings(fd) {
        return -1;
    }
    // SAFETY: the caller's own argument, to libc's fsync.
    unsafe { next::next_fsync(fd) }
}

/// `fdatasync(2)`: served writable mappings of the file are written back
/// first.
///
/// # Safety
/// `fdatasync(2)`'s contract.
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if !synced_mappings(fd) {
        return -1;
    }
    // SAFETY: the caller's own argument, to libc's fdatasync.
    unsafe { next::next_fdatasync(fd) }
}
