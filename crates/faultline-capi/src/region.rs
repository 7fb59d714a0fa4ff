//! Regions from C: `fl_map_zero`, `fl_map_file`, `fl_map_store` make an
//! `fl_region*`; `fl_region_*` read its address and length, flush,
//! prefetch, discard, migrate and collapse it; `fl_region_free` flushes and
//! unmaps it.
//!
//! Invariant: an `fl_region*` is a `Box<fl_region>` made here, freed only
//! by `fl_region_free`. Locks: none here (the library takes its own).

use crate::error::{guard, status, Failure};
use crate::manager::{fl_manager, manager};
use crate::store::{fl_store_ops, CStore};
use faultline::{
    AccessPattern, Discard, FaultError, MapError, MapOptions, PageSize, ReadOnly, Region, Store,
};
use std::ops::Range;
use std::os::fd::BorrowedFd;

/// A mapped region (opaque).
pub enum fl_region {
    /// Writable: its writes go back to its store.
    Rw(Region),
    /// Read-only store: writes to its memory are never written back.
    Ro(Region<ReadOnly>),
}

/// How to map a region. Start from `fl_map_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fl_map_options {
    /// 4096 or 2097152 (2 MiB pages need THP in madvise or always mode).
    pub page_size: u64,
    /// Keep pages in memory once faulted (never reclaimed).
    pub pinned: bool,
    /// 0: anywhere; otherwise the region's exact address (a multiple of
    /// the page size), refused with -EEXIST if anything is mapped there.
    pub addr: u64,
}

/// 4 KiB pages, not pinned, anywhere.
#[no_mangle]
pub extern "C" fn fl_map_options_default() -> fl_map_options {
    fl_map_options {
        page_size: 4096,
        pinned: false,
        addr: 0,
    }
}

fn to_options(opts: *const fl_map_options) -> Result<MapOptions, Failure> {
    // SAFETY: the callers' contracts: NULL or a valid fl_map_options.
    let o = unsafe { opts.as_ref() }
        .copied()
        .unwrap_or_else(|| fl_map_options_default());
    let size = match o.page_size {
        4096 => PageSize::Base4K,
        0x20_0000 => PageSize::Huge2M,
        other => {
            return Err(Failure::invalid(format!(
                "page_size {other}: 4096 or 2097152"
            )))
        }
    };
    let mut m = MapOptions::new().page_size(size).pinned(o.pinned);
    if o.addr != 0 {
        m = m.at(usize::try_from(o.addr).map_err(|_| Failure::invalid("addr"))?);
    }
    Ok(m)
}

fn map_failure(e: MapError) -> Failure {
    Failure::new(e.errno(), e)
}

fn length(len: u64) -> Result<usize, Failure> {
    usize::try_from(len).map_err(|_| Failure::invalid(format!("len {len} is too large")))
}

/// Maps and boxes a region over `store`, read-only if it cannot keep writes.
pub(crate) fn map_store(
    mm: *mut fl_manager,
    store: impl Store + 'static,
    len: u64,
    opts: *const fl_map_options,
) -> *mut fl_region {
    guard(
        |_| std::ptr::null_mut(),
        || {
            // SAFETY: the callers' contracts: mm is a live manager.
            let m = unsafe { manager(mm) }?;
            let (len, opts) = (length(len)?, to_options(opts)?);
            let r = if store.writable() || store.is_zero() {
                fl_region::Rw(m.map(len, store, opts).map_err(map_failure)?)
            } else {
                fl_region::Ro(m.map_read_only(len, store, opts).map_err(map_failure)?)
            };
            Ok(Box::into_raw(Box::new(r)))
        },
    )
}

/// Maps `len` bytes (a multiple of the page size) of zero-filled memory.
/// NULL on failure (see `fl_last_error()`).
///
/// # Safety
/// `mm` is a live manager; `opts` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fl_map_zero(
    mm: *mut fl_manager,
    len: u64,
    opts: *const fl_map_options,
) -> *mut fl_region {
    map_store(mm, faultline::store::Zero, len, opts)
}

/// Maps `len` bytes of the file open as `fd`, from byte `offset`; writes
/// go back to the file if `writable` (the fd must then be open for
/// writing). faultline keeps its own duplicate of `fd`: the caller may close
/// `fd` at once. NULL on failure.
///
/// # Safety
/// `mm` is a live manager; `opts` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fl_map_file(
    mm: *mut fl_manager,
    fd: i32,
    offset: u64,
    len: u64,
    writable: bool,
    opts: *const fl_map_options,
) -> *mut fl_region {
    let file = guard(
        |_| None,
        || {
            if fd < 0 {
                return Err(Failure::new(libc::EBADF, format!("fd {fd}")));
            }
            // SAFETY: fd >= 0; it is only borrowed for the duplication, and
            // an fd that is not open fails there with EBADF.
            let own = unsafe { BorrowedFd::borrow_raw(fd) }
                .try_clone_to_owned()
                .map_err(|e| Failure::new(e.raw_os_error().unwrap_or(libc::EBADF), e))?;
            let opts = faultline::store::FileOptions::new()
                .offset(offset)
                .writable(writable);
            Ok(Some(faultline::store::File::from_file(own.into(), opts)))
        },
    );
    match file {
        Some(file) => map_store(mm, file, len, opts),
        None => std::ptr::null_mut(),
    }
}

/// Maps `len` bytes over a store defined in C by `ops` (copied; see
/// `fl_store_ops` for the contract). The region is writable if `ops->write`
/// is set. NULL on failure; `ops->release` is then called at once.
///
/// # Safety
/// `mm` is a live manager; `ops` points to a valid `fl_store_ops` whose
/// callbacks keep its contract; `opts` is NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn fl_map_store(
    mm: *mut fl_manager,
    ops: *const fl_store_ops,
    len: u64,
    opts: *const fl_map_options,
) -> *mut fl_region {
    // SAFETY: per the contract.
    match unsafe { ops.as_ref() } {
        // SAFETY: the caller vouches for the callbacks' contract.
        Some(ops) => map_store(mm, unsafe { CStore::new(*ops) }, len, opts),
        None => guard(
            |_| std::ptr::null_mut(),
            || Err(Failure::invalid("ops is NULL")),
        ),
    }
}

/// Borrows the region behind `r`.
///
/// # Safety
/// `r` is NULL or a live region.
unsafe fn region<'a>(r: *const fl_region) -> Result<&'a fl_region, Failure> {
    // SAFETY: per the contract.
    unsafe { r.as_ref() }.ok_or_else(|| Failure::invalid("region is NULL"))
}

/// Runs `f` on the region whichever its access.
macro_rules! either {
    ($r:expr, $x:ident => $body:expr) => {
        match $r {
            fl_region::Rw($x) => $body,
            fl_region::Ro($x) => $body,
        }
    };
}

/// The region's first byte (NULL if `r` is NULL).
///
/// # Safety
/// `r` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_addr(r: *const fl_region) -> *mut u8 {
    // SAFETY: per the contract.
    match unsafe { r.as_ref() } {
        Some(r) => either!(r, x => x.addr() as *mut u8),
        None => std::ptr::null_mut(),
    }
}

/// The region's length in bytes (0 if `r` is NULL).
///
/// # Safety
/// `r` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_len(r: *const fl_region) -> u64 {
    // SAFETY: per the contract.
    match unsafe { r.as_ref() } {
        Some(r) => either!(r, x => x.len() as u64),
        None => 0,
    }
}

/// Pages of the region mapped now (resident), or a negative errno.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_resident_pages(r: *const fl_region) -> i64 {
    guard(
        |e| -i64::from(e),
        // SAFETY: per the contract.
        || Ok(either!(unsafe { region(r) }?, x => x.resident_pages() as i64)),
    )
}

fn fault_failure(e: FaultError) -> Failure {
    let errno = match &e {
        FaultError::BadRange { .. } => libc::EINVAL,
        _ => libc::EIO,
    };
    Failure::new(errno, e)
}

fn byte_range(offset: u64, len: u64) -> Result<Range<usize>, Failure> {
    let start = length(offset)?;
    let end = start
        .checked_add(length(len)?)
        .ok_or_else(|| Failure::invalid("offset + len overflows"))?;
    Ok(start..end)
}

/// Writes the region's dirty pages back to its store and flushes the
/// store. 0, or a negative errno (the store's, or -EIO): pages that could
/// not be written stay dirty, and a later flush tries them again.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_flush(r: *const fl_region) -> i32 {
    status(|| {
        // SAFETY: per the contract.
        either!(unsafe { region(r) }?, x => x.flush())
            .map_err(|e| Failure::new(e.errno().unwrap_or(libc::EIO), e))
    })
}

/// Maps bytes `[offset, offset + len)` of the region now, so touching them
/// does not fault. Returns the pages mapped, or a negative errno.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_prefetch(r: *const fl_region, offset: u64, len: u64) -> i64 {
    guard(
        |e| -i64::from(e),
        || {
            let range = byte_range(offset, len)?;
            // SAFETY: per the contract.
            let n = either!(unsafe { region(r) }?, x => x.prefetch(range));
            n.map(|n| n as i64).map_err(fault_failure)
        },
    )
}

/// Declares how the program will touch the region, with `madvise(2)`'s
/// own values: `MADV_NORMAL` (streams detected), `MADV_RANDOM` (each
/// fault maps its page alone: no read-ahead, no fault-around) or
/// `MADV_SEQUENTIAL` (the largest read-ahead window from a stream's first
/// fault); the whole region takes it. Returns 0, or -EINVAL for any other
/// advice.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_advise(r: *const fl_region, advice: i32) -> i32 {
    status(|| {
        let pattern = AccessPattern::from_madvise(advice).ok_or_else(|| {
            Failure::invalid(format!(
                "advice {advice}: MADV_NORMAL, MADV_RANDOM or MADV_SEQUENTIAL"
            ))
        })?;
        // SAFETY: per the contract.
        either!(unsafe { region(r) }?, x => x.advise(pattern));
        Ok(())
    })
}

/// Maps bytes `[offset, offset + len)` now and pins them: reclaim passes
/// over them until `fl_region_unpin` or the region is freed. Returns the
/// pages mapped, or a negative errno.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_pin(r: *const fl_region, offset: u64, len: u64) -> i64 {
    guard(
        |e| -i64::from(e),
        || {
            let range = byte_range(offset, len)?;
            // SAFETY: per the contract.
            let n = either!(unsafe { region(r) }?, x => x.pin(range));
            n.map(|n| n as i64).map_err(fault_failure)
        },
    )
}

/// Lets reclaim take the pages of bytes `[offset, offset + len)` again.
/// 0, or a negative errno.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_unpin(r: *const fl_region, offset: u64, len: u64) -> i32 {
    status(|| {
        let range = byte_range(offset, len)?;
        // SAFETY: per the contract.
        either!(unsafe { region(r) }?, x => x.unpin(range)).map_err(fault_failure)
    })
}

/// Gives the pages of bytes `[offset, offset + len)` back at once, without
/// write-back: afterwards they read the store's copy (`zero == false`:
/// unwritten changes are dropped) or zeros (`zero == true`: the store's copy
/// is dropped too). Returns the 4 KiB frames freed, or a negative errno.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_discard(
    r: *const fl_region,
    offset: u64,
    len: u64,
    zero: bool,
) -> i64 {
    guard(
        |e| -i64::from(e),
        || {
            let range = byte_range(offset, len)?;
            let how = if zero {
                Discard::Zero
            } else {
                Discard::KeepStore
            };
            // SAFETY: per the contract.
            let n = either!(unsafe { region(r) }?, x => x.discard(range, how));
            n.map(|n| n as i64).map_err(fault_failure)
        },
    )
}

/// Moves the resident pages of bytes `[offset, offset + len)` to pool
/// `pool` (0 is the budget). Returns the pages moved, or a negative errno.
/// Pages the kernel will not move for a move's deadline (shared with a
/// child of `fork()`, pinned for I/O) stay, and the call returns there:
/// fewer pages than expected means call again later.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_migrate(
    r: *const fl_region,
    offset: u64,
    len: u64,
    pool: u32,
) -> i64 {
    guard(
        |e| -i64::from(e),
        || {
            let range = byte_range(offset, len)?;
            // SAFETY: per the contract.
            let rep = either!(unsafe { region(r) }?, x => x.migrate(range, pool as usize));
            rep.map(|rep| rep.pages as i64)
                .map_err(|e| Failure::new(libc::EINVAL, e))
        },
    )
}

/// Collapses each 2 MiB block of bytes `[offset, offset + len)` (all of it
/// resident) into one 2 MiB page. Returns the 4 KiB pages collapsed, or a
/// negative errno.
///
/// # Safety
/// `r` is a live region.
#[no_mangle]
pub unsafe extern "C" fn fl_region_collapse(r: *const fl_region, offset: u64, len: u64) -> i64 {
    guard(
        |e| -i64::from(e),
        || {
            let range = byte_range(offset, len)?;
            // SAFETY: per the contract.
            let rep = either!(unsafe { region(r) }?, x => x.collapse(range));
            rep.map(|rep| rep.pages as i64)
                .map_err(|e| Failure::new(libc::EINVAL, e))
        },
    )
}

/// Flushes the region and unmaps it. If the flush fails, the region is
/// kept (still mapped, its dirty pages in memory) and a negative errno
/// returned: free space or fix the store and call again. NULL: nothing.
///
/// # Safety
/// `r` is NULL or a live region, not used after a 0 return.
#[no_mangle]
pub unsafe extern "C" fn fl_region_free(r: *mut fl_region) -> i32 {
    if r.is_null() {
        return 0;
    }
    status(|| {
        // SAFETY: per the contract, `r` is a live Box allocation made here;
        // its value is moved out and, before this returns, either written
        // back (the handle stays valid) or its allocation freed. (Were
        // `close` to panic, the value would be lost and the handle must not
        // be used again; that would be a faultline bug.)
        let taken = unsafe { std::ptr::read(r) };
        let kept = match taken {
            fl_region::Rw(x) => x.close().map_err(|(x, e)| (fl_region::Rw(x), e)),
            fl_region::Ro(x) => x.close().map_err(|(x, e)| (fl_region::Ro(x), e)),
        };
        match kept {
            Ok(()) => {
                // SAFETY: the value was moved out above; this frees only the
                // allocation (MaybeUninit has no drop).
                drop(unsafe { Box::from_raw(r.cast::<std::mem::MaybeUninit<fl_region>>()) });
                Ok(())
            }
            Err((region, e)) => {
                // SAFETY: the allocation is still live and its value was
                // moved out: writing puts the region back.
                unsafe { r.write(region) };
                Err(Failure::new(e.errno().unwrap_or(libc::EIO), e))
            }
        }
    })
}
