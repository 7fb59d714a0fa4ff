//! What a region's use costs beyond its frames, apart from its page
//! states: the page-table pages the kernel has made for its mapping
//! ([`Tables`]: a bit per 512-entry table span, set when a page-state leaf
//! is first linked over it, and a count; kept until the range is unmapped,
//! as the kernel keeps them), and the manager's running sums of every
//! region's cost and of its page states' bytes ([`OverheadSum`]: regions
//! add as they grow and take their share out when unmapped or dropped),
//! which the budget (`overhead.rs`) and the published stats read without
//! visiting each region.
//!
//! Figures, not part of any protocol: std atomics, Relaxed, outside loom's
//! model. Locks: none.

use faultline_sys::PAGE_SIZE;
use std::sync::atomic::{AtomicU64 as StdU64, AtomicUsize as StdUsize};

/// Entries of a page-table page: the span of one PTE table (4 KiB pages)
/// or one PMD table (2 MiB pages), in pages.
pub(super) const TABLE_ENTRIES: usize = 512;

/// The overhead (`PageStates::overhead_bytes`) of every region of a
/// manager still alive, in bytes: each region adds its cost as it grows
/// and takes its whole share out when it is dropped (and unmapped). Beside
/// it, the same regions' page-state bytes (`PageStates::bytes`: slots and
/// leaves, held until the region is dropped), for the stats.
#[derive(Debug, Default)]
pub(crate) struct OverheadSum {
    overhead: StdUsize,
    states: StdUsize,
}

impl OverheadSum {
    /// The overhead sum now.
    pub(crate) fn bytes(&self) -> usize {
        // Relaxed: a figure; nothing is ordered by it.
        self.overhead.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The page-state bytes sum now.
    pub(crate) fn state_bytes(&self) -> usize {
        // Relaxed: as in `bytes`.
        self.states.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Adds `more` and takes `less` bytes of overhead and of page states.
    pub(super) fn charge(&self, overhead: (usize, usize), states: (usize, usize)) {
        // Relaxed: as in `bytes`.
        let ord = std::sync::atomic::Ordering::Relaxed;
        for (sum, (more, less)) in [(&self.overhead, overhead), (&self.states, states)] {
            if more != less {
                sum.fetch_add(more, ord);
                sum.fetch_sub(less, ord);
            }
        }
    }
}

/// The page-table pages noted so far: a bit per table span of the
/// region's address space, and their count.
pub(super) struct Tables {
    /// The region's first page's index within its table's span.
    head: usize,
    bits: Box<[StdU64]>,
    noted: StdUsize,
    /// Bytes of the leaf-pointer array (its pages are counted as touched).
    pointers: usize,
}

impl Tables {
    pub(super) fn new(len: usize, head: usize, pointers: usize) -> Tables {
        let spans = (head + len).div_ceil(TABLE_ENTRIES);
        Tables {
            head,
            bits: crate::dirty::zeroed_vec(spans.div_ceil(64)).into_boxed_slice(),
            noted: StdUsize::new(0),
            pointers,
        }
    }

    /// Notes the tables under pages `from..to` (non-empty); returns the
    /// bytes they add to [`Tables::bytes`].
    pub(super) fn note(&self, from: usize, to: usize) -> usize {
        let first = (self.head + from) / TABLE_ENTRIES;
        let last = (self.head + to - 1) / TABLE_ENTRIES;
        let mut added = 0;
        for t in first..=last {
            let (word, bit) = (&self.bits[t / 64], 1u64 << (t % 64));
            // Relaxed: a figure; nothing is ordered by it.
            let ord = std::sync::atomic::Ordering::Relaxed;
            if word.load(ord) & bit == 0 && word.fetch_or(bit, ord) & bit == 0 {
                let k = self.noted.fetch_add(1, ord);
                added += Self::cost(k + 1, self.pointers) - Self::cost(k, self.pointers);
            }
        }
        added
    }

    /// What `tables` noted tables cost: themselves (4 KiB each) and at
    /// most a page each of the pointer array (`pointers` bytes).
    fn cost(tables: usize, pointers: usize) -> usize {
        tables * PAGE_SIZE + pointers.min(tables * PAGE_SIZE)
    }

    /// Forgets every table noted (the range was unmapped, and the tables
    /// with it); returns the bytes that takes out of [`Tables::bytes`].
    pub(super) fn forget(&self) -> usize {
        // Relaxed: a figure. The bits stay set: nothing maps the range
        // again (a late note of a span never noted is counted, and taken
        // out at drop).
        Self::cost(
            self.noted.swap(0, std::sync::atomic::Ordering::Relaxed),
            self.pointers,
        )
    }

    /// What the tables noted so far cost.
    pub(super) fn bytes(&self) -> usize {
        Self::cost(self.noted(), self.pointers)
    }

    pub(super) fn noted(&self) -> usize {
        self.noted.load(std::sync::atomic::Ordering::Relaxed)
    }
}
