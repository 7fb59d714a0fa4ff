//! Clean pages dropped in batches ([`crate::FillModel::CopyProtected`]).
//!
//! A page that is *protected* ([`crate::dirty`]: copied in write-protected
//! from its store and unwritten since) is the store's copy, and the kernel
//! stops any write to it until faultline, under the page's lock, lifts the
//! protection. So under that lock the page can leave its region without
//! being parked, hashed or written: the hand collects up to 32 such pages
//! (`batch.rs`), each with its lock held, and drops them all with one
//! `process_madvise(MADV_DONTNEED)` — one TLB flush for the batch where
//! parking flushes once per page (measurements.md, "Does Linux batch the
//! TLB flush"). Each page is then absent (its next touch reads the store)
//! and its frame, its slot made whole ([`pagemove::fill_holes`]), goes back
//! to the allocator.
//!
//! Why the locks are held across the drop: a write to a protected page
//! stops in a write-protect fault whose handler needs the page's lock; it
//! runs only after the page is gone, finds it absent, and the write
//! retries into a fresh fill. Holding up to 32 locks cannot deadlock: the
//! hand only ever *tries* locks (`reclaim/mod.rs`), and the
//! drop waits for nothing a lock holder may be waiting on (faulting
//! threads wait for the lock in user space, holding no kernel lock). The
//! hand drops its batch before anything that may call a store (a parked
//! page's eviction: a store that touches a region would fault under the
//! batch's locks) and before it comes round again; meanwhile pages under a
//! lock the batch holds are the hand's to step ([`LockedPages::holds`]).
//! At the drop each page is checked again (still resident in its frame,
//! protected, its range still mapped by the region): the hand's own thread
//! may have changed it under a lock it holds, and an unmap may be waiting
//! for one.
//! Regions' userfaultfd asks for no removal events in this model
//! (`Config::hears_removals`), so the drop is not stopped by one.
//!
//! If the drop fails, each page is looked at in the page tables: one that
//! is gone is recorded absent, one still there stays resident (and
//! protected: nothing lifted it).
//!
//! Locks: the batch's fault locks, taken by the hand, released when the
//! batch is dropped (or the pass ends).

use super::batch::{LockedPages, Pending};
use crate::core::Core;
use crate::error::FaultError;
use crate::frame::Frame;
use crate::pagemove;
use crate::region::{PageState, RegionInner};
use faultline_sys::PAGE_SIZE;
use std::sync::atomic::Ordering;

/// The frame of `page` if it is resident and protected in pool 0 (the
/// budget's): dropped in a batch, not stepped. The caller
/// holds its fault lock.
pub(super) fn protected_frame(core: &Core, r: &RegionInner, page: usize) -> Option<u32> {
    match r.state(page) {
        PageState::Resident(f)
            if !r.dying() && r.is_protected(page) && core.alloc.pool_of(f) == 0 =>
        {
            Some(f)
        }
        _ => None,
    }
}

/// Drops the batch of clean pages `batch` (see the module docs), releasing
/// its locks only once every page of it is dropped (a page of one region
/// may be under the lock a page of another holds); frames freed are pushed
/// on `evicted` for the caller to free. Returns pages freed.
pub(super) fn drop_all(
    batch: &mut LockedPages<'_>,
    core: &Core,
    evicted: &mut Vec<Frame>,
) -> usize {
    // One call per region (a batch usually holds one).
    batch.by_region(|region, pages| drop_region_pages(core, region, pages, evicted))
}

/// Whether pending `p` is still what it was when batched: resident in its
/// frame, protected, its region live there. Its lock has been held since,
/// but the hand's own thread may have changed it meanwhile (a park of a
/// run it reached under a lock it holds, or a store call of its own whose
/// fault on this page was served under that lock, lifting the mark); and
/// the program may have unmapped the range (and mapped something else
/// there) while the unmap's handler waits for this lock. `live`: the
/// region's live ranges (`Mapping::live_ranges`), read once per drop.
fn still_protected(region: &RegionInner, p: &Pending<'_>, live: &[(usize, usize)]) -> bool {
    let addr = region.page_addr(p.page);
    region.state(p.page) == PageState::Resident(p.frame)
        && region.is_protected(p.page)
        && live
            .iter()
            .any(|&(s, e)| addr >= s && addr + PAGE_SIZE <= e)
}

fn drop_region_pages(
    core: &Core,
    region: &RegionInner,
    pages: &[Pending<'_>],
    evicted: &mut Vec<Frame>,
) -> usize {
    if region.dying() {
        return 0;
    }
    let live = region.map.live_ranges();
    let pages: Vec<&Pending<'_>> = pages
        .iter()
        .filter(|p| still_protected(region, p, &live))
        .collect();
    if pages.is_empty() {
        return 0;
    }
    let ranges: Vec<(usize, usize)> = pages
        .iter()
        .map(|p| (region.page_addr(p.page), PAGE_SIZE))
        .collect();
    // SAFETY: each page is resident and protected under its lock (held in
    // `pages`): its bytes are the store's, the kernel stops any write to
    // it until that lock's holder lifts the protection, and faultline
    // holds no reference into region memory.
    let dropped = unsafe { region.map.discard_many(&ranges) };
    let all = match dropped {
        Ok(()) => true,
        Err(source) => {
            core.record(FaultError::Move {
                addr: ranges[0].0,
                source,
            });
            false
        }
    };
    let mut freed = 0;
    for p in pages {
        let addr = region.page_addr(p.page);
        if !all && !pagemove::is_empty(core, addr, PAGE_SIZE).unwrap_or(false) {
            // Not dropped: still resident, still protected.
            continue;
        }
        region.set_state(p.page, PageState::Absent);
        let slot = core.pool.slot_addr(p.frame);
        // A free frame's slot is whole (`pagemove::free_whole`); one that
        // cannot be made so stays out of the allocator, recorded.
        if let Err(source) = pagemove::fill_holes(core, slot, PAGE_SIZE) {
            core.record(FaultError::Move { addr: slot, source });
            continue;
        }
        let frame = Frame::from_parts(p.frame, 0);
        core.pool.set_zeroed(&frame, false);
        evicted.push(frame);
        freed += 1;
    }
    core.stats
        .clean_dropped
        .fetch_add(freed as u64, Ordering::Relaxed);
    core.stats
        .evicted
        .fetch_add(freed as u64, Ordering::Relaxed);
    freed
}
