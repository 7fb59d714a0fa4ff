//! A batch of pages the clock hand keeps with their fault locks until it
//! acts on all of them at once: clean write-protected pages to drop with
//! one call (`drops.rs`), parked pages to evict with one store call per
//! region (`evictions.rs`). What each batch does, and why its locks may be
//! held together, is in those modules.
//!
//! Invariants: a page is in a batch at most once (the hand empties its
//! batches before it comes round; a second push is refused, or its frame
//! would be freed twice); each entry's lock is held from its push until
//! the batch is taken and the entries dropped.
//!
//! Locks: the fault locks of its pages, held by the guards it keeps (a
//! page under a lock the hand already holds is kept without one).

use crate::locks::FaultGuard;
use crate::region::RegionInner;

/// Pages in one batch at most: the kernel's own reclaim batch
/// (`SWAP_CLUSTER_MAX`). Each holds its fault lock until the batch goes.
pub(super) const BATCH: usize = 32;

/// One page waiting in a batch.
pub(super) struct Pending<'a> {
    pub(super) region: &'a RegionInner,
    pub(super) page: usize,
    /// Its frame when it was batched.
    pub(super) frame: u32,
    /// The index of the fault lock its guard holds, if it has one.
    lock: Option<usize>,
    /// Its fault lock (`None`: one the hand holds already — the reclaiming
    /// fault's own, or another batched page's).
    _guard: Option<FaultGuard<'a>>,
}

/// The pages of one batch, with their locks.
#[derive(Default)]
pub(super) struct LockedPages<'a> {
    pending: Vec<Pending<'a>>,
}

impl<'a> LockedPages<'a> {
    /// Adds `page` of `region` (frame `frame`), whose lock `guard` holds
    /// (lock `idx`), or the caller does (`guard` `None`). A page already in
    /// the batch is not added again (its frame would be freed twice: the
    /// hand empties the batch before it comes round, so this is a second
    /// line).
    pub(super) fn push(
        &mut self,
        region: &'a RegionInner,
        page: usize,
        frame: u32,
        (idx, guard): (usize, Option<FaultGuard<'a>>),
    ) {
        let again = self
            .pending
            .iter()
            .any(|p| std::ptr::eq(p.region, region) && p.page == page);
        debug_assert!(!again, "page {page} pushed twice");
        if again {
            return;
        }
        self.pending.push(Pending {
            region,
            page,
            frame,
            lock: guard.as_ref().map(|_| idx),
            _guard: guard,
        });
    }

    /// Pages in the batch.
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether the batch is empty.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether the batch is full.
    pub(super) fn is_full(&self) -> bool {
        self.pending.len() >= BATCH
    }

    /// Whether the batch holds fault lock `idx`: a page under it is the
    /// hand's to step as it is (as under the reclaiming fault's own lock),
    /// or with one lock for every page (`LockMode::Global`) the first
    /// page batched would stop the hand for the rest of its walk.
    pub(super) fn holds(&self, idx: usize) -> bool {
        self.pending.iter().any(|p| p.lock == Some(idx))
    }

    /// Empties the batch region by region: `each` gets one region's pages,
    /// ascending (what `Store::write_pages` takes), and returns the pages
    /// it freed; their sum is returned. Every lock is held until all the
    /// regions are done (a page of one region may be under the lock a page
    /// of another holds).
    pub(super) fn by_region(
        &mut self,
        mut each: impl FnMut(&'a RegionInner, &[Pending<'a>]) -> usize,
    ) -> usize {
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|p| (p.region.id, p.page));
        let freed = pending
            .chunk_by(|a, b| std::ptr::eq(a.region, b.region))
            .map(|group| each(group[0].region, group))
            .sum();
        drop(pending);
        freed
    }
}
