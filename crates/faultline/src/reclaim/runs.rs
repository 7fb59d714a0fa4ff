//! Runs of pages handled with one call, for the clock hand (`clock_pass`
//! in `mod.rs`): [`park_run`] moves a run of resident pages out of their
//! region with one `UFFDIO_MOVE` (one TLB flush), and [`evict_run`] writes a
//! run of parked pages back with one store call (one round trip to a remote
//! store) and frees their frames.
//!
//! Invariant: a page is in a run only if its state satisfies the run's
//! test under its own fault lock, held for the whole run; a failed move or
//! write leaves every page of the run as it was (resident, or parked with
//! its data).
//!
//! Locks: the caller's fault lock for the first page; the others' locks
//! only tried (`RegionInner::lock_run`), never waited for.

use super::RUN_MAX;
use crate::config::PageSize;
use crate::core::Core;
use crate::error::FaultError;
use crate::frame::Frame;
use crate::pagemove;
use crate::region::{PageState, RegionInner};
use crate::writeback;
use std::sync::atomic::Ordering;

/// The run from `page`, if any: resident pages are parked together
/// ([`park_run`]), parked ones evicted together ([`evict_run`]). Returns
/// (pages passed, pages freed); passed 0: step the page alone.
pub(super) fn any_run(
    core: &Core,
    r: &RegionInner,
    page: usize,
    idx: usize,
    held: Option<usize>,
    evicted: &mut Vec<Frame>,
) -> (usize, usize) {
    match park_run(core, r, page, idx, held) {
        0 => evict_run(core, r, page, idx, held, evicted),
        n => (n, 0),
    }
}

/// The run of at most [`RUN_MAX`] pages from `page` that pass `ok`, its
/// pages' locks taken (`RegionInner::lock_run`; the caller holds lock `idx`
/// of `page`, or has it as `held`): the run's length and the guards, which
/// hold the locks until dropped.
fn lock_from<'a>(
    core: &'a Core,
    r: &RegionInner,
    page: usize,
    idx: usize,
    held: Option<usize>,
    ok: impl Fn(usize) -> bool,
) -> (usize, Vec<crate::locks::FaultGuard<'a>>) {
    let mut mine: Vec<usize> = std::iter::once(idx).chain(held).collect();
    let mut guards = Vec::new();
    let n = r.lock_run(&core.locks, page, RUN_MAX, &mut mine, &mut guards, ok);
    (n, guards)
}

/// Parks the run of resident 4 KiB pages of pool 0 from `page` whose
/// frames are consecutive (a read-ahead or fault-around run) with one move
/// ([`pagemove::park_run`]). The caller holds lock `idx` (of `page`) or has
/// it as `held`; the other pages' locks are only tried, and let go once
/// the run is parked. Returns the pages the hand passed (0: not a run,
/// step the page alone).
fn park_run(core: &Core, r: &RegionInner, page: usize, idx: usize, held: Option<usize>) -> usize {
    if !matches!(r.state(page), PageState::Resident(f) if core.alloc.pool_of(f) == 0) {
        return 0;
    }
    let mut mine: Vec<usize> = std::iter::once(idx).chain(held).collect();
    let mut guards = Vec::new();
    let n = pagemove::park_run(core, r, page, RUN_MAX, &mut mine, &mut guards);
    core.stats.parked.fetch_add(n as u64, Ordering::Relaxed);
    n
}

/// Evicts the run of parked 4 KiB pages of pool 0 from `page` (the next
/// pass after [`park_run`] parked them): their dirty pages go to the store
/// in one call (`writeback::put_parked`: one round trip to a remote store, a
/// pipeline of writes), then all leave their frames. Locks as
/// [`park_run`]. Returns (pages passed, pages freed); passed 0: not a run,
/// step the page alone. A failed write keeps every page of the run parked.
fn evict_run(
    core: &Core,
    r: &RegionInner,
    page: usize,
    idx: usize,
    held: Option<usize>,
    evicted: &mut Vec<Frame>,
) -> (usize, usize) {
    let parked_here = |p: usize| {
        matches!(r.state(p), PageState::Parked(f) if core.alloc.pool_of(f) == 0)
            && !r.pins.contains(p)
    };
    if r.page_size != PageSize::Base4K || r.dying() || !r.store.writable() || !parked_here(page) {
        return (0, 0);
    }
    let (n, _guards) = lock_from(core, r, page, idx, held, parked_here);
    if n < 2 {
        return (0, 0);
    }
    // Every page of the run is parked (checked under its lock, held).
    let parked: Option<Vec<(usize, u32)>> = (page..page + n)
        .map(|p| match r.state(p) {
            PageState::Parked(f) => Some((p, f)),
            _ => None,
        })
        .collect();
    let Some(parked) = parked else {
        return (0, 0);
    };
    let evicted_after = writeback::AfterWrite::Evicted;
    // SAFETY: each page is parked in its frame, checked under its lock
    // (`lock_run`), which `_guards` (or the caller) holds.
    if let Err(e) = unsafe { writeback::put_parked(core, r, &parked, evicted_after) } {
        // Keep the data: the pages stay parked, tried again next pass.
        core.record(FaultError::Store {
            addr: r.page_addr(page),
            source: e,
        });
        return (n, 0);
    }
    (n, super::evictions::free_written(core, r, &parked, evicted))
}
