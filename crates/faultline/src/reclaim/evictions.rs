//! Parked pages evicted in batches: the clock hand collects up to 32
//! (`batch.rs`) dirty parked 4 KiB pages of writable stores, each with its
//! fault lock held, and evicts them together — they go to each region's
//! store in one call (`writeback::put_pages`: a file store has them all in
//! flight at once, a remote store takes them in one round trip), then every
//! frame is freed. Evicted one at a time, a reclaimer kept one write in
//! flight beside the program's reads, and a device serves many at once
//! faster (the project's virtual disk: 15k random 4 KiB writes/s one at a
//! time, 50k eight at a time; docs/measurements.md, "Write-back in
//! batches").
//!
//! A clean parked page (its bytes still hash to the store's copy's
//! fingerprint, `dirty.rs`) has nothing to write, so it is evicted as soon
//! as the hand meets it ([`evict_if_clean`]) and its lock let go. Batched
//! with the dirty ones, it kept its lock while the hand parked further
//! pages (each a `UFFDIO_MOVE` and a TLB shootdown) until 32 had gathered,
//! and a program thread touching it again waited all that while
//! (docs/measurements.md §32).
//!
//! Invariants: a page's frame is freed only after its bytes are safe in
//! the store (a failed write keeps every page of its region's call parked
//! and dirty, retried on a later pass), and a page is evicted only if it is
//! still parked in the same frame when its batch goes — its lock has been
//! held since it was batched, but the hand's own thread may have changed
//! it under a lock it holds (a store call of its own, a run's eviction,
//! whose nested fault on it was served under that lock: `nesting.rs`).
//! Holding up to 32 locks cannot deadlock, as for the clean drops
//! (`drops.rs`): the hand only tries locks, and a nested fault of the
//! batch's own store call on a page under a lock the hand holds is served
//! under it (never for the batch's own pages: a store reading the page it
//! writes has no answer, as for a single write-back).
//!
//! Locks: the batch's fault locks, taken by the hand, released when the
//! batch is evicted (or the pass ends).

use super::batch::{LockedPages, Pending};
use crate::core::Core;
use crate::error::FaultError;
use crate::frame::Frame;
use crate::region::{PageState, RegionInner};
use crate::writeback;
use std::sync::atomic::Ordering;

/// The frame of `page` if the hand evicts it here ([`evict_if_clean`],
/// else the batch): a parked 4 KiB page of pool 0 in a live region whose
/// store is written to. Anything else is stepped alone (`reclaim/mod.rs:
/// step`). The caller holds its fault lock.
pub(super) fn victim(core: &Core, r: &RegionInner, page: usize) -> Option<u32> {
    match r.state(page) {
        PageState::Parked(f)
            if r.page_size.order() == 0
                && !r.dying()
                && r.store.writable()
                && core.alloc.pool_of(f) == 0 =>
        {
            Some(f)
        }
        _ => None,
    }
}

/// Evicts `page` of `r`, parked in frame `f` ([`victim`]), at once if it
/// is clean: its fingerprint is there and its bytes still hash to it. Its
/// frame goes on `evicted`; returns whether it went. A dirty page (or one
/// without a fingerprint: dirty since its fill) is left for the batch,
/// its fingerprint forgotten, so the batch's write-back does not hash it
/// a second time to find what is known. The caller holds its fault lock.
pub(super) fn evict_if_clean(
    core: &Core,
    r: &RegionInner,
    page: usize,
    f: u32,
    evicted: &mut Vec<Frame>,
) -> bool {
    let mut frame = Frame::from_parts(f, 0);
    // SAFETY: the page is parked in `f` (`victim`, under its lock, which
    // the caller holds): nobody else reads or writes the frame, and it is
    // whole in its slot.
    let bytes = unsafe { core.pool.bytes_mut(&mut frame) };
    if !writeback::is_clean(r, page, bytes) {
        r.forget_fingerprint(page);
        return false;
    }
    core.stats.clean_skipped.fetch_add(1, Ordering::Relaxed);
    free_written(core, r, &[(page, f)], evicted);
    true
}

/// Evicts the batch of parked pages `batch`: per region, its dirty pages
/// written with one store call, then every page absent and its frame
/// pushed on `evicted` for the caller to free. The locks are released once
/// every region's call is done. Returns pages freed.
pub(super) fn evict_all(
    batch: &mut LockedPages<'_>,
    core: &Core,
    evicted: &mut Vec<Frame>,
) -> usize {
    batch.by_region(|region, pages| evict_region_pages(core, region, pages, evicted))
}

/// Evicts `pages`, all of one region (see [`evict_all`]).
fn evict_region_pages(
    core: &Core,
    region: &RegionInner,
    pages: &[Pending<'_>],
    evicted: &mut Vec<Frame>,
) -> usize {
    if region.dying() {
        return 0;
    }
    // Still parked in the frame it was batched with (see the module docs).
    let parked: Vec<(usize, u32)> = pages
        .iter()
        .filter(|p| region.state(p.page) == PageState::Parked(p.frame))
        .map(|p| (p.page, p.frame))
        .collect();
    if parked.is_empty() {
        return 0;
    }
    let evicted_after = writeback::AfterWrite::Evicted;
    // SAFETY: each page is parked in its frame, checked just now under its
    // lock, which `pages` holds until the caller drops the batch.
    if let Err(e) = unsafe { writeback::put_parked(core, region, &parked, evicted_after) } {
        // Keep the data: the pages stay parked, tried again next pass.
        core.record(FaultError::Store {
            addr: region.page_addr(parked[0].0),
            source: e,
        });
        return 0;
    }
    free_written(core, region, &parked, evicted)
}

/// Frees the frames of `parked` (each page and its frame), whose bytes
/// the store has: each page becomes absent and its frame goes on
/// `evicted` for the caller to free. Returns pages freed. The caller holds
/// the pages' locks.
pub(super) fn free_written(
    core: &Core,
    r: &RegionInner,
    parked: &[(usize, u32)],
    evicted: &mut Vec<Frame>,
) -> usize {
    for &(page, f) in parked {
        let frame = Frame::from_parts(f, 0);
        core.pool.set_zeroed(&frame, false);
        r.set_state(page, PageState::Absent);
        evicted.push(frame);
    }
    core.stats
        .evicted
        .fetch_add(parked.len() as u64, Ordering::Relaxed);
    parked.len()
}
