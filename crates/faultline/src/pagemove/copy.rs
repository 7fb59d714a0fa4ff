//! The copy fill model's install ([`crate::FillModel::Copy`]): a filled
//! frame's bytes go into region pages with `UFFDIO_COPY`, which maps fresh
//! pages (nothing is unmapped, so no TLB flush) and wakes the faulting
//! threads. The frame stays the page's (the budget counts it, reclaim parks
//! the page back into its slot as under the move model); its slots now
//! hold dead copies, dropped in batches (`frame/stale.rs`).
//!
//! Anything but a whole copy falls back to the move protocol
//! ([`super::move_in`]) for the pages not copied, so every outcome the
//! kernel can give (an event not yet read, a destination occupied) is
//! handled by the one protocol that already handles it. Pages copied before
//! a refusal are in place (and were woken); if the move of the rest fails
//! too, the unit is reported [`MoveError::Split`]: the caller keeps every
//! page resident, and the next touch of a missing part gathers it
//! ([`super::recollect`]).
//!
//! Locks: none of its own; the caller holds the unit's fault locks and
//! owns the frame.

use super::{move_in, MoveError};
use crate::config::PageSize;
use crate::core::Core;
use crate::frame::Frame;
use crate::region::RegionInner;
use faultline_sys::uffd::Resolved;
use faultline_sys::{SysError, PAGE_SIZE};
use std::sync::atomic::Ordering;

/// The longest unit copied in: a longer run (read-ahead, fault-around)
/// moves, its one flush shared by all its pages, where a copy would cost a
/// `memcpy` per page (sequential reads of 256-page runs: 0.90x by copy).
pub(crate) const COPY_MAX: usize = 8 * PAGE_SIZE;

/// Whether a unit of `len` bytes of `r`'s filled pages goes in by copy
/// ([`crate::FillModel`]): 4 KiB pages under the copy model, units up to
/// [`COPY_MAX`], no pool bound to a NUMA node.
pub(crate) fn by_copy(core: &Core, r: &RegionInner, len: usize) -> bool {
    let c = &core.config;
    c.fill_model.copies() && r.page_size == PageSize::Base4K && len <= COPY_MAX && !binds_nodes(c)
}

/// Whether any pool is bound to a NUMA node: then pages move, keeping the
/// node of their frame — a copy's page comes from the kernel wherever the
/// program's memory policy places it, not from the pool's node.
fn binds_nodes(c: &crate::config::Config) -> bool {
    c.node.is_some() || c.extra_pools.iter().any(|p| p.node.is_some())
}

/// Copies `frame` (whole in its slot) into the region pages at `dst`,
/// `len` bytes, waking the threads waiting there; see the module docs.
/// `protect`: in `UFFDIO_COPY_MODE_WP` (the region is registered for it:
/// [`crate::FillModel::CopyProtected`]). Returns whether every page went in
/// write-protected (a whole protected copy).
///
/// # Safety
/// `[dst, dst + len)` are region pages the caller holds the locks of, all
/// absent; the caller owns `frame`; no Rust reference points into either.
pub(crate) unsafe fn copy_in(
    core: &Core,
    dst: usize,
    frame: &Frame,
    len: usize,
    protect: bool,
) -> Result<bool, MoveError> {
    let src = core.pool.addr_of(frame);
    // SAFETY: the caller's contract; the source slots are populated (a
    // frame in flight or parked is whole in its slot).
    let first = unsafe {
        if protect {
            core.uffd.copy_protected(dst, src, len)
        } else {
            core.uffd.copy(dst, src, len, false)
        }
    };
    let done = match first {
        Ok(Resolved::Done) => len,
        Ok(
            Resolved::Retry { done }
            | Resolved::Exists { done }
            | Resolved::SourceHole { done }
            | Resolved::Busy { done },
        ) => done,
        Err(_) => 0,
    };
    if done > 0 {
        let pages = done / PAGE_SIZE;
        core.stats.copies.fetch_add(pages as u64, Ordering::Relaxed);
        let dropped = core.pool.mark_stale(frame.index(), pages);
        count_dropped(core, src, dropped);
    }
    if done == len {
        return Ok(protect);
    }
    // The first 4 KiB move out of a PMD-mapped pool block splits it, under
    // the split lock (as `fault/resolve.rs: move_unit`; a unit this small
    // lies in one block). Taken after the mark above, whose drop takes
    // that lock too.
    let split = core.pool.split_guard(frame);
    // SAFETY: the caller's contract, for the pages not copied (their
    // frames' slots untouched, the region pages still absent).
    let moved = unsafe { move_in(core, dst + done, src + done, len - done) };
    if let (Some(guard), true) = (split, moved.is_ok()) {
        guard.mark_split();
    }
    match moved {
        Ok(()) => Ok(false),
        Err(e) if done == 0 => Err(e),
        Err(e) => Err(MoveError::Split {
            dst,
            src,
            last: e.into_sys(dst + done, len - done),
        }),
    }
}

/// Drops the dead copies queued so far: the background reclaimer's every
/// check, so a manager that stops filling gives them back too, not only
/// when a batch fills (`frame/stale.rs`).
pub(crate) fn drop_dead_copies(core: &Core) {
    let dropped = core.pool.drop_stale();
    count_dropped(core, 0, dropped);
}

/// Counts dead copies dropped, or records why a drop failed (the slots
/// stay stale: a move into one drops it alone first, or fails).
pub(crate) fn count_dropped(core: &Core, addr: usize, dropped: Result<usize, SysError>) {
    match dropped {
        // Nothing to count: most moves into the pool (every park) find no
        // dead copy, and need not touch the shared counter.
        Ok(0) => {}
        Ok(n) => {
            core.stats
                .stale_dropped
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        Err(source) => core.record(crate::error::FaultError::Move { addr, source }),
    }
}
