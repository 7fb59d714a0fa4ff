//! Managers from C: `fl_config` (plain fields, defaults from
//! `fl_config_default`), `fl_manager_new` / `fl_manager_free`, the budget,
//! stats as a plain struct, and fault errors (the causes of SIGBUS).
//!
//! Invariant: an `fl_manager*` is a `Box<fl_manager>` made here, freed only
//! by `fl_manager_free`. Regions keep the manager's service alive on their
//! own, so a manager may be freed before its regions. Locks: none here.

use crate::error::{guard, status, Failure};
use faultline::Manager;
use std::ffi::c_char;

/// A manager (opaque).
pub struct fl_manager {
    pub(crate) mm: Manager,
}

/// A manager's configuration. Start from `fl_config_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fl_config {
    /// Bytes of memory for pages (the pool), a multiple of 2 MiB.
    pub budget: u64,
    /// Largest budget `fl_manager_set_budget` may grow to (0: the budget).
    pub budget_max: u64,
    /// Fault-serving threads.
    pub workers: u32,
    /// Largest read-ahead run, in pages (a power of two, at most 512).
    pub readahead_max: u32,
    /// Pages mapped around a faulting 4 KiB page of a zero region.
    pub fault_around: u32,
    /// Reclaim starts below this percent of the pool free...
    pub reclaim_low_pct: u32,
    /// ...and stops above this one.
    pub reclaim_high_pct: u32,
}

/// The default configuration (the Rust `Config::default()`).
#[no_mangle]
pub extern "C" fn fl_config_default() -> fl_config {
    let c = faultline::Config::default();
    let narrow = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    fl_config {
        budget: c.budget as u64,
        budget_max: c.budget_max.unwrap_or(0) as u64,
        workers: narrow(c.workers),
        readahead_max: narrow(c.readahead_max),
        fault_around: narrow(c.fault_around),
        reclaim_low_pct: narrow(c.reclaim_low_pct),
        reclaim_high_pct: narrow(c.reclaim_high_pct),
    }
}

fn to_config(c: &fl_config) -> Result<faultline::Config, Failure> {
    let size = |v: u64, name: &str| {
        usize::try_from(v).map_err(|_| Failure::invalid(format!("{name} {v} is too large")))
    };
    let mut config = faultline::Config::default();
    config.budget = size(c.budget, "budget")?;
    config.workers = c.workers as usize;
    config.readahead_max = c.readahead_max as usize;
    config.fault_around = c.fault_around as usize;
    config.reclaim_low_pct = c.reclaim_low_pct as usize;
    config.reclaim_high_pct = c.reclaim_high_pct as usize;
    if c.budget_max != 0 {
        config.budget_max = Some(size(c.budget_max, "budget_max")?);
    }
    Ok(config)
}

/// Starts a manager (its pool, fault workers and reclaim thread) with
/// `config` (NULL: the defaults). Returns NULL on failure: invalid config,
/// no userfaultfd access, no memory; see `fl_last_error()`.
///
/// # Safety
/// `config` is NULL or points to a valid `fl_config`.
#[no_mangle]
pub unsafe extern "C" fn fl_manager_new(config: *const fl_config) -> *mut fl_manager {
    guard(
        |_| std::ptr::null_mut(),
        || {
            // SAFETY: the caller passes NULL or a valid fl_config.
            let c = unsafe { config.as_ref() }
                .copied()
                .unwrap_or_else(|| fl_config_default());
            let mm = faultline::ManagerBuilder::from_config(to_config(&c)?)
                .build()
                .map_err(|e| Failure::new(libc::EINVAL, e))?;
            Ok(Box::into_raw(Box::new(fl_manager { mm })))
        },
    )
}

/// Stops a manager made by `fl_manager_new` (NULL: nothing). Its regions
/// stay usable until each is freed.
///
/// # Safety
/// `mm` is NULL or a manager from `fl_manager_new`, not used after this.
#[no_mangle]
pub unsafe extern "C" fn fl_manager_free(mm: *mut fl_manager) {
    if !mm.is_null() {
        guard(
            |_| (),
            || {
                // SAFETY: per the contract, a Box made by fl_manager_new and
                // given up by the caller.
                drop(unsafe { Box::from_raw(mm) });
                Ok(())
            },
        )
    }
}

/// Borrows the manager behind `mm`.
///
/// # Safety
/// `mm` is NULL or a live manager from `fl_manager_new`.
pub(crate) unsafe fn manager<'a>(mm: *const fl_manager) -> Result<&'a Manager, Failure> {
    // SAFETY: per the contract.
    unsafe { mm.as_ref() }
        .map(|m| &m.mm)
        .ok_or_else(|| Failure::invalid("mm is NULL"))
}

/// Changes the budget while the manager runs (a multiple of 2 MiB, at most
/// `budget_max`). Returns 0 or a negative errno (-EINVAL, -EBUSY when a
/// shrink could not free enough).
///
/// # Safety
/// `mm` is a live manager from `fl_manager_new`.
#[no_mangle]
pub unsafe extern "C" fn fl_manager_set_budget(mm: *mut fl_manager, bytes: u64) -> i32 {
    status(|| {
        // SAFETY: per the contract.
        let m = unsafe { manager(mm) }?;
        let bytes = usize::try_from(bytes).map_err(|_| Failure::invalid("bytes too large"))?;
        m.set_budget(bytes).map_err(|e| {
            let errno = match e {
                faultline::BudgetError::Busy { .. } => libc::EBUSY,
                _ => libc::EINVAL,
            };
            Failure::new(errno, e)
        })
    })
}

/// A manager's counters (`fl_manager_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fl_stats {
    /// Faults served (4 KiB and 2 MiB).
    pub faults: u64,
    /// Pages filled from a store.
    pub fills_store: u64,
    /// Pages written back to a store.
    pub written_back: u64,
    /// Pages evicted by reclaim.
    pub evicted: u64,
    /// Read-ahead runs issued.
    pub readaheads: u64,
    /// Pages migrated between pools.
    pub migrated_pages: u64,
    /// 2 MiB collapses.
    pub collapses: u64,
    /// Pages poisoned because their fault could not be served (SIGBUS).
    pub poisoned: u64,
    /// Fault errors recorded.
    pub errors: u64,
    /// Pool frames in all.
    pub frames_total: u64,
    /// Pool frames free.
    pub frames_free: u64,
    /// Fault service time, median, ns.
    pub service_p50_ns: u64,
    /// Fault service time, 99th percentile, ns.
    pub service_p99_ns: u64,
}

/// Fills `*out` with `mm`'s counters. Returns 0 or -EINVAL.
///
/// # Safety
/// `mm` is a live manager; `out` points to writable `fl_stats`.
#[no_mangle]
pub unsafe extern "C" fn fl_manager_stats(mm: *const fl_manager, out: *mut fl_stats) -> i32 {
    status(|| {
        // SAFETY: per the contract.
        let s = unsafe { manager(mm) }?.stats();
        let stats = fl_stats {
            faults: s.faults(),
            fills_store: s.fills_store,
            written_back: s.written_back,
            evicted: s.evicted,
            readaheads: s.readaheads,
            migrated_pages: s.migrated_pages,
            collapses: s.collapses,
            poisoned: s.poisoned,
            errors: s.errors,
            frames_total: s.frames_total as u64,
            frames_free: s.frames_free as u64,
            service_p50_ns: s.service.p50_ns,
            service_p99_ns: s.service.p99_ns,
        };
        // SAFETY: per the contract, `out` is NULL or writable.
        let out = unsafe { out.as_mut() }.ok_or_else(|| Failure::invalid("out is NULL"))?;
        *out = stats;
        Ok(())
    })
}

/// Takes the oldest fault error (why a thread got SIGBUS) and copies its
/// text, NUL-terminated and truncated to `len`, into `buf`. Returns 1 if
/// there was one, 0 if none, or a negative errno.
///
/// # Safety
/// `mm` is a live manager; `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn fl_manager_take_error(
    mm: *const fl_manager,
    buf: *mut c_char,
    len: usize,
) -> i32 {
    guard(
        |e| -e,
        || {
            // SAFETY: per the contract.
            let Some(err) = unsafe { manager(mm) }?.take_error() else {
                return Ok(0);
            };
            // SAFETY: per the contract.
            unsafe { copy_text(&err.to_string(), buf, len) }?;
            Ok(1)
        },
    )
}

/// Copies `text` into `buf` (`len` bytes), truncated and NUL-terminated.
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes.
unsafe fn copy_text(text: &str, buf: *mut c_char, len: usize) -> Result<(), Failure> {
    if buf.is_null() || len == 0 {
        return Err(Failure::invalid("buf is NULL or len is 0"));
    }
    let n = text.len().min(len - 1);
    // SAFETY: n + 1 <= len bytes of `buf` are writable; `text` is valid for
    // n bytes and does not overlap a caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
    Ok(())
}
