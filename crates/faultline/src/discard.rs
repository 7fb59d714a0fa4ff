//! Discard: the program says it no longer needs some pages of a region
//! (`Region::discard`). Their frames go back to the pool at once, without
//! a write-back; what the pages read afterwards is chosen by [`Discard`]:
//! the store's copy (unsaved writes are dropped, as `MADV_DONTNEED` does to
//! a private file mapping) or zeros (the store's copy is dropped too: a
//! file gets a hole punched).
//!
//! Invariant: when `discard` returns, every page of the range reads what
//! the policy says, unless the program wrote to it meanwhile (a write that
//! races the call is ordered before or after it as a whole). For
//! [`Discard::Zero`] this needs care, since the store is cleared without
//! the pages' locks: (1) pages in use are dropped, each under its lock, and
//! (2) the store's copy of the whole range is cleared; a fault between (1)
//! and (2) may have filled a page from the old copy, so (3) pages in use
//! are dropped again, under their locks. A fault after (2) reads zeros.
//!
//! [`Discard::StoreChanged`] is for a store whose copy another writer
//! changed: a fault may have read the old copy and not yet mapped it (the
//! page is not in use until mapped), so every page's lock is taken, in use
//! or not, and what a fill in flight mapped is dropped after it.
//!
//! Locks: each page's fault lock, one at a time.

use crate::core::Core;
use crate::error::FaultError;
use crate::frame::{Frame, FrameAllocator};
use crate::pagemove;
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use std::ops::Range;

/// What discarded pages read afterwards ([`crate::Region::discard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Discard {
    /// The store keeps its copy: the pages read back what the store holds
    /// (writes not yet written back are dropped).
    KeepStore,
    /// The store's copy goes too (a file's range becomes a hole): the pages
    /// read back as zeros. Refused for a store that cannot be written.
    Zero,
    /// The store's copy was changed by someone else (another writer of the
    /// file): as [`Discard::KeepStore`], and a fill of a page of the range
    /// in flight when the call is made — which may have read the old copy
    /// — is waited for and dropped too, so every page reads the new copy
    /// afterwards. Costs a lock per page of the range, in use or not.
    StoreChanged,
}

/// Discards `pages` of `r` by `how`; returns the frames freed (in 4 KiB
/// pages).
pub(crate) fn discard(
    core: &Core,
    r: &RegionInner,
    pages: Range<usize>,
    how: Discard,
) -> Result<usize, FaultError> {
    let zero = how == Discard::Zero && !r.store.is_zero();
    if zero && !r.store.writable() {
        return Err(FaultError::Store {
            addr: r.page_addr(pages.start),
            source: crate::store::StoreError::Unsupported {
                store: r.store.name(),
                op: "discard to zeros",
            },
        });
    }
    if how == Discard::StoreChanged {
        return drop_every(core, r, &pages);
    }
    let mut freed = drop_in_use(core, r, &pages)?;
    if zero {
        let len = pages.len() as u64;
        // No lock is held here: a store that touches a region is served
        // as any thread is.
        r.store
            .discard(pages.start as u64, len, r.page_size.bytes())
            .map_err(|source| FaultError::Store {
                addr: r.page_addr(pages.start),
                source,
            })?;
        freed += drop_in_use(core, r, &pages)?;
    }
    Ok(freed)
}

/// Drops every page of `pages` holding a frame (a poisoned page stays so:
/// its next touch asks the store again anyway). Returns 4 KiB pages freed.
fn drop_in_use(core: &Core, r: &RegionInner, pages: &Range<usize>) -> Result<usize, FaultError> {
    let mut freed = 0;
    for page in r.used_pages(pages.clone()) {
        let (domain, key) = r.lock_key(page);
        let _g = core.locks.lock(domain, key);
        freed += drop_page(core, r, page)?;
    }
    Ok(freed)
}

/// Drops every page of `pages` holding a frame, taking every page's lock,
/// in use or not: a fill in flight holds its page's lock from before its
/// store read until the page is mapped, so it is waited for (and what it
/// mapped dropped). Returns 4 KiB pages freed.
fn drop_every(core: &Core, r: &RegionInner, pages: &Range<usize>) -> Result<usize, FaultError> {
    let mut freed = 0;
    for page in pages.clone() {
        let (domain, key) = r.lock_key(page);
        let _g = core.locks.lock(domain, key);
        freed += drop_page(core, r, page)?;
    }
    Ok(freed)
}

/// Drops `page`: a resident page is moved out first (its slot takes the
/// data back, so the frame is whole to free), a parked one is freed where
/// it is. Caller holds the page's lock.
fn drop_page(core: &Core, r: &RegionInner, page: usize) -> Result<usize, FaultError> {
    if r.dying() {
        return Ok(0);
    }
    let f = match r.state(page) {
        PageState::Resident(f) => {
            pagemove::park(core, r, page, f)?;
            f
        }
        PageState::Parked(f) => f,
        PageState::Absent | PageState::Poisoned | PageState::Gone => return Ok(0),
    };
    let frame = Frame::from_parts(f, r.page_size.order());
    core.pool.set_zeroed(&frame, false);
    r.set_state(page, PageState::Absent);
    let n = frame.pages();
    core.alloc.free(frame);
    Stats::bump(&core.stats.discarded);
    Ok(n)
}
