//! `libumap.so`: LLNL Umap's C API (`include/umap/umap.h`) served by
//! faultline, so programs written for Umap run unchanged: `umap()` maps a
//! file (through the process-wide faultline manager, started on the first
//! call and configured by Umap's `UMAP_*` variables, see `config.rs`),
//! `uunmap()` writes back and unmaps, `umap_flush()` writes every region
//! back, `umap_prefetch()` maps pages ahead of use, `umap_fetch_and_pin()`
//! maps and pins them,
//! and the `umapcfg_get_*` getters report the settings.
//!
//! Where Umap is wrong, this layer is right (and says so in the header):
//! `offset` is honoured, `len == 0` sets `errno = EINVAL` (positive), any
//! length works (rounded up to the page, as mmap does), any buffer size
//! works, and no error aborts the process: each entry point catches panics
//! and reports failures through its return value and `errno` (plus one line
//! on stderr naming the cause, as Umap's log does).
//!
//! Locks: the registry's mutex (`registry.rs`) per call; faults take none.

mod config;
mod registry;

use config::UmapConfig;
use faultline::{MapError, MapOptions};
use registry::{lock, started, Mapped};
use std::ffi::{c_char, c_int, c_void};
use std::os::fd::BorrowedFd;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failed call: errno and cause.
struct Failure(c_int, String);

/// Runs `body`; on failure (or a caught panic) prints the cause, sets
/// `errno` and returns `failed`.
fn guard<T>(name: &str, failed: T, body: impl FnOnce() -> Result<T, Failure>) -> T {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        Err(Failure(
            libc::EFAULT,
            "internal error (a faultline bug)".into(),
        ))
    });
    match outcome {
        Ok(v) => v,
        Err(Failure(errno, why)) => {
            eprintln!("umap (faultline): {name}: {why}");
            faultline_sys::host::set_errno(errno);
            failed
        }
    }
}

fn invalid(why: impl Into<String>) -> Failure {
    Failure(libc::EINVAL, why.into())
}

/// Maps `length` bytes of the file open as `fd`, from byte `offset`, as
/// Umap does: `prot` is `PROT_READ` and/or `PROT_WRITE` (with `PROT_WRITE`,
/// writes go back to the file, which must be open for writing), `flags`
/// must include `UMAP_PRIVATE` and may include `UMAP_FIXED` (the region is
/// placed at `addr`, replacing what is mapped there). Returns the region's
/// address, or `UMAP_FAILED` with `errno` set.
///
/// # Safety
/// With `UMAP_FIXED`, nothing the program still uses may be mapped in
/// `[addr, addr + length)` (mmap's own contract for `MAP_FIXED`).
#[no_mangle]
pub unsafe extern "C" fn umap(
    addr: *mut c_void,
    length: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: libc::off_t,
) -> *mut c_void {
    guard("umap", libc::MAP_FAILED, || {
        // SAFETY: the caller keeps mmap's contract for UMAP_FIXED.
        unsafe { map(addr as usize, length, prot, flags, fd, offset) }.map(|a| a as *mut c_void)
    })
}

/// # Safety
/// As [`umap`].
unsafe fn map(
    addr: usize,
    length: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: libc::off_t,
) -> Result<usize, Failure> {
    let cfg = UmapConfig::get();
    if length == 0 {
        return Err(invalid("length is 0"));
    }
    if prot & !(libc::PROT_READ | libc::PROT_WRITE) != 0 {
        return Err(invalid(format!(
            "prot {prot:#x}: PROT_READ and/or PROT_WRITE only"
        )));
    }
    if flags & libc::MAP_PRIVATE == 0 || flags & !(libc::MAP_PRIVATE | libc::MAP_FIXED) != 0 {
        return Err(invalid(format!(
            "flags {flags:#x}: UMAP_PRIVATE, optionally | UMAP_FIXED"
        )));
    }
    let sys_page = faultline_sys::host::page_size() as i64;
    if offset < 0 || offset % sys_page != 0 {
        return Err(invalid(format!(
            "offset {offset} is not a multiple of {sys_page}"
        )));
    }
    let page = cfg.faultline_page().map_err(invalid)?;
    let len = length
        .checked_next_multiple_of(page.bytes())
        .ok_or_else(|| invalid(format!("length {length} is too large")))?;
    let writable = prot & libc::PROT_WRITE != 0;
    let file = open_store(fd, offset as u64, writable)?;
    let mut opts = MapOptions::new().page_size(page);
    if flags & libc::MAP_FIXED != 0 {
        // SAFETY: the caller asked for MAP_FIXED and keeps its contract.
        opts = unsafe { opts.at_replacing(addr) };
    }
    let mut guard = lock();
    let reg = started(&mut guard).map_err(|why| Failure(libc::ENOMEM, why))?;
    let region = if writable {
        Mapped::Rw(reg.mm.map(len, file, opts).map_err(map_failure)?)
    } else {
        Mapped::Ro(reg.mm.map_read_only(len, file, opts).map_err(map_failure)?)
    };
    let start = region.range().start;
    reg.regions.insert(start, region);
    Ok(start)
}

/// faultline's own handle on `fd` (a duplicate: the program may close
/// its fd), checked to be writable if the region is.
fn open_store(fd: c_int, offset: u64, writable: bool) -> Result<faultline::store::File, Failure> {
    if fd < 0 {
        return Err(Failure(libc::EBADF, format!("fd {fd}")));
    }
    // SAFETY: fd >= 0 and only borrowed for the duplication; an fd that is
    // not open fails there with EBADF.
    let own = unsafe { BorrowedFd::borrow_raw(fd) }
        .try_clone_to_owned()
        .map_err(|e| {
            Failure(
                e.raw_os_error().unwrap_or(libc::EBADF),
                format!("fd {fd}: {e}"),
            )
        })?;
    let file = std::fs::File::from(own);
    if writable && !faultline_sys::host::opened_for_writing(&file).unwrap_or(false) {
        return Err(Failure(
            libc::EACCES,
            format!("PROT_WRITE, but fd {fd} is not open for writing"),
        ));
    }
    let opts = faultline::store::FileOptions::new()
        .offset(offset)
        .writable(writable);
    Ok(faultline::store::File::from_file(file, opts))
}

fn map_failure(e: MapError) -> Failure {
    Failure(e.errno(), e.to_string())
}

/// Writes the region holding `addr` back to its file and unmaps it (the
/// whole region, as Umap does, whatever `length`). 0, or -1 with `errno`:
/// `EINVAL` if no region holds `addr`, `EIO` if the write-back failed (the
/// region is then kept, with its dirty pages, and may be unmapped again).
#[no_mangle]
pub extern "C" fn uunmap(addr: *mut c_void, length: usize) -> c_int {
    let _ = length;
    guard("uunmap", -1, || {
        let mut guard = lock();
        let reg = guard
            .as_mut()
            .ok_or_else(|| invalid(format!("{addr:?}: no umap region")))?;
        let start = reg
            .find(addr as usize)
            .map(|m| m.range().start)
            .ok_or_else(|| invalid(format!("{addr:?}: no umap region")))?;
        let region = reg
            .regions
            .remove(&start)
            .ok_or_else(|| invalid("vanished"))?;
        region.close().map(|()| 0).map_err(|(region, e)| {
            reg.regions.insert(start, region);
            Failure(
                e.errno().unwrap_or(libc::EIO),
                format!("write-back failed: {e}"),
            )
        })
    })
}

/// Writes every region's dirty pages back to its file. 0, or -1 with
/// `errno` (the first failure; the other regions are still flushed).
#[no_mangle]
pub extern "C" fn umap_flush() -> c_int {
    guard("umap_flush", -1, || {
        let guard = lock();
        let mut first = None;
        for m in guard.iter().flat_map(|r| r.regions.values()) {
            if let Err(e) = m.flush() {
                first.get_or_insert(e);
            }
        }
        match first {
            None => Ok(0),
            Some(e) => Err(Failure(e.errno().unwrap_or(libc::EIO), e.to_string())),
        }
    })
}

/// 1: regions mapped with `PROT_WRITE` write back to their files.
#[no_mangle]
pub extern "C" fn umap_has_write_support() -> c_int {
    1
}

/// Maps each page named in `page_array` now (pages of any umap region).
/// A page that cannot be mapped sets `errno` (the others are still mapped).
///
/// # Safety
/// `page_array` points to `npages` items (or `npages <= 0`).
#[no_mangle]
pub unsafe extern "C" fn umap_prefetch(npages: c_int, page_array: *mut umap_prefetch_item) {
    let n = usize::try_from(npages).unwrap_or(0);
    if n == 0 || page_array.is_null() {
        return;
    }
    // SAFETY: per the contract, `n` readable items.
    let items = unsafe { std::slice::from_raw_parts(page_array, n) };
    let page = UmapConfig::get().page_size as usize;
    guard("umap_prefetch", (), || {
        for item in items {
            let start = item.page_base_addr as usize;
            fetch(start, start.saturating_add(page), false)?;
        }
        Ok(())
    })
}

/// Maps bytes `[paddr, paddr + size)` of a umap region now and pins them:
/// reclaim never takes them until the region is unmapped.
#[no_mangle]
pub extern "C" fn umap_fetch_and_pin(paddr: *mut c_char, size: u64) {
    guard("umap_fetch_and_pin", (), || {
        let start = paddr as usize;
        fetch(start, start.saturating_add(size as usize), true)
    })
}

/// Prefetches (and with `pin`, pins) bytes `[start, end)`, clipped to the
/// region holding `start`.
fn fetch(start: usize, end: usize, pin: bool) -> Result<(), Failure> {
    let guard = lock();
    let m = guard
        .as_ref()
        .and_then(|r| r.find(start))
        .ok_or_else(|| invalid(format!("{start:#x}: no umap region")))?;
    let r = m.range();
    let range = start - r.start..end.min(r.end) - r.start;
    let done = if pin { m.pin(range) } else { m.prefetch(range) };
    done.map(|_| ())
        .map_err(|e| Failure(libc::EIO, e.to_string()))
}

/// One page to prefetch (Umap's `struct umap_prefetch_item`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct umap_prefetch_item {
    /// The page's first byte.
    pub page_base_addr: *mut c_void,
}

/// `UMAP_PAGESIZE`: the page size, bytes.
#[no_mangle]
pub extern "C" fn umapcfg_get_umap_page_size() -> u64 {
    UmapConfig::get().page_size
}

/// `UMAP_MAX_FAULT_EVENTS`.
#[no_mangle]
pub extern "C" fn umapcfg_get_max_fault_events() -> u64 {
    UmapConfig::get().max_fault_events
}

/// `UMAP_PAGE_FILLERS`: fault workers.
#[no_mangle]
pub extern "C" fn umapcfg_get_num_fillers() -> u64 {
    UmapConfig::get().fillers
}

/// `UMAP_PAGE_EVICTORS`.
#[no_mangle]
pub extern "C" fn umapcfg_get_num_evictors() -> u64 {
    UmapConfig::get().evictors
}

/// `UMAP_BUFSIZE`: the buffer, in pages.
#[no_mangle]
pub extern "C" fn umapcfg_get_max_pages_in_buffer() -> u64 {
    UmapConfig::get().buf_pages
}

/// `UMAP_READ_AHEAD`: pages read ahead (0: faultline's adaptive default).
#[no_mangle]
pub extern "C" fn umapcfg_get_read_ahead() -> u64 {
    UmapConfig::get().read_ahead
}

/// `UMAP_EVICT_LOW_WATER_THRESHOLD`, percent full.
#[no_mangle]
pub extern "C" fn umapcfg_get_evict_low_water_threshold() -> c_int {
    UmapConfig::get().low_water
}

/// `UMAP_EVICT_HIGH_WATER_THRESHOLD`, percent full.
#[no_mangle]
pub extern "C" fn umapcfg_get_evict_high_water_threshold() -> c_int {
    UmapConfig::get().high_water
}
