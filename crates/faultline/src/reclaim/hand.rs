//! One pass of the clock hand ([`clock_pass`]): over the store-backed
//! regions that hold frames, from where the last pass stopped, until enough
//! frames are freed or two turns are done. Each page in use is visited
//! under its fault lock: a clean write-protected page joins the batch that
//! is dropped without parking (`drops.rs`), a parked 4 KiB page of a
//! writable store is evicted at once if clean, or joins the batch of dirty
//! ones evicted together (`evictions.rs`), a run
//! of pages is parked or evicted with one call (`runs.rs`), anything else
//! is stepped alone (`mod.rs: step`: park a resident page, evict a parked
//! one).
//!
//! Invariants: both batches go before the hand comes round again (a page
//! in one would be met twice); the clean batch is dropped before a parked
//! page is visited and before the evictions' store calls (a store call
//! must not run under its locks); the pages batched for eviction count
//! toward what the pass frees, so a pass does not park more than it needs
//! while its batch fills; evicted frames go back in batches through
//! `free_bulk`, which merges neighbours into runs.
//!
//! Locks: each page's fault lock, only tried (a held one: the page is
//! busy, skipped) — except those the hand holds already: the reclaiming
//! fault's own (`held`) and its batches'. The hand's mutex, a leaf, to read
//! and store where it stands.

use super::batch::LockedPages;
use super::cursor::UsedPages;
use super::{drops, evictions};
use super::{runs, step, worth_walking};
use crate::core::Core;
use crate::frame::{Frame, FrameAllocator};
use crate::locks::FaultGuard;
use crate::region::{PageState, RegionInner};
use std::sync::Arc;

/// One [`super::reclaim`] pass of the hand; returns pages freed.
pub(super) fn clock_pass(
    core: &Core,
    want: usize,
    held: Option<usize>,
    enough: impl Fn() -> bool,
) -> usize {
    // The snapshot, borrowed (no reference count touched per region). The
    // hand visits only pages in use (`cursor.rs`): two turns are about
    // twice the pages holding frames.
    let snap = core.table.snapshot();
    let regions: Vec<&Arc<RegionInner>> = snap.iter().collect();
    let total: usize = regions
        .iter()
        .filter(|r| worth_walking(r))
        .map(|r| r.holding() + 1)
        .sum();
    if total == 0 {
        return 0;
    }
    let (mut ri, mut page) = hand_start(core, &regions);
    let mut pass = Pass {
        core,
        held,
        freed: 0,
        evicted: Vec::with_capacity(64),
        drops: LockedPages::default(),
        evictions: LockedPages::default(),
    };
    let mut used = UsedPages::default();
    let mut steps = 0;
    while pass.freed + pass.evictions.len() < want && steps < 2 * total + regions.len() && !enough()
    {
        if ri >= regions.len() {
            pass.drop_batch();
            pass.evict_batch();
            ri = 0;
            page = 0;
        }
        let r = &regions[ri];
        let next = worth_walking(r).then(|| used.next(r, page)).flatten();
        let Some(next) = next else {
            ri += 1;
            page = 0;
            steps += 1;
            continue;
        };
        let passed = pass.visit(r, next);
        steps += passed;
        page = next + passed;
    }
    pass.drop_batch();
    pass.evict_batch();
    core.alloc.free_bulk(&mut pass.evicted);
    let mut h = core.hand.lock();
    h.region_start = regions.get(ri).map_or(0, |r| r.start());
    h.page = page;
    pass.freed
}

/// What one pass carries from page to page.
struct Pass<'a> {
    core: &'a Core,
    /// The reclaiming fault's own lock, if any.
    held: Option<usize>,
    freed: usize,
    /// Frames evicted, freed in batches.
    evicted: Vec<Frame>,
    /// Clean pages, with their locks, until their batch is dropped.
    drops: LockedPages<'a>,
    /// Parked pages, with their locks, until their batch is evicted.
    evictions: LockedPages<'a>,
}

impl<'a> Pass<'a> {
    /// Drops the batch of clean pages, counting the frames freed.
    fn drop_batch(&mut self) {
        self.freed += drops::drop_all(&mut self.drops, self.core, &mut self.evicted);
    }

    /// Evicts the batch of parked pages (a store call: the clean batch is
    /// dropped first), counting the frames freed.
    fn evict_batch(&mut self) {
        if !self.evictions.is_empty() {
            self.drop_batch();
            self.freed += evictions::evict_all(&mut self.evictions, self.core, &mut self.evicted);
        }
    }

    /// Visits `page` of `r`, a page in use; returns the pages passed (a
    /// run counts all of its pages).
    fn visit(&mut self, r: &'a RegionInner, page: usize) -> usize {
        let core = self.core;
        if r.pins.contains(page) || r.held.contains(page) {
            return 1;
        }
        if self.evicted.len() >= 64 {
            core.alloc.free_bulk(&mut self.evicted);
        }
        if matches!(r.state(page), PageState::Parked(_)) {
            // An eviction may call the store: not under the batch's locks
            // (dropped before this page's lock is taken: it may be one of
            // them). Read without the lock: a hint, checked again below.
            self.drop_batch();
        }
        let holds = |idx| self.drops.holds(idx) || self.evictions.holds(idx);
        let Some((idx, guard)) = try_page_lock(core, r, page, self.held, holds) else {
            return 1;
        };
        if let Some(f) = drops::protected_frame(core, r, page) {
            self.drops.push(r, page, f, (idx, guard));
            if self.drops.is_full() {
                self.drop_batch();
            }
            return 1;
        }
        if !self.drops.is_empty() && matches!(r.state(page), PageState::Parked(_)) {
            // Parked since the hint: left for the next pass.
            return 1;
        }
        let (run, run_freed) = runs::any_run(core, r, page, idx, self.held, &mut self.evicted);
        if run > 0 {
            self.freed += run_freed;
            return run;
        }
        if let Some(f) = evictions::victim(core, r, page) {
            if evictions::evict_if_clean(core, r, page, f, &mut self.evicted) {
                self.freed += 1;
                return 1;
            }
            self.evictions.push(r, page, f, (idx, guard));
            if self.evictions.is_full() {
                self.evict_batch();
            }
            return 1;
        }
        self.freed += step(core, r, page, &mut self.evicted);
        drop(guard);
        1
    }
}

/// Where the hand stands among `regions`: (region index, page).
fn hand_start(core: &Core, regions: &[&Arc<RegionInner>]) -> (usize, usize) {
    let h = core.hand.lock();
    let ri = regions.partition_point(|r| r.start() < h.region_start);
    let same = regions.get(ri).is_some_and(|r| r.start() == h.region_start);
    (ri, if same { h.page } else { 0 })
}

/// `page`'s fault lock for the hand: its index and guard (`None`: one the
/// hand holds already, the caller's own `held` or one its batches hold:
/// `holds`), or `None` if another holds it (the page is busy).
fn try_page_lock<'a>(
    core: &'a Core,
    r: &RegionInner,
    page: usize,
    held: Option<usize>,
    holds: impl Fn(usize) -> bool,
) -> Option<(usize, Option<FaultGuard<'a>>)> {
    let (domain, key) = r.lock_key(page);
    let idx = core.locks.index(domain, key);
    if held == Some(idx) || holds(idx) {
        return Some((idx, None));
    }
    core.locks.try_lock(domain, key).map(|g| (idx, Some(g)))
}
