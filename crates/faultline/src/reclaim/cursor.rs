//! The hand's way through a region's pages in use: a span's pages are read
//! in one pass over its entries (`RegionInner::used_in_next_span`) and
//! handed out in order, where asking for each next page alone costs a pass
//! over a hashed leaf's entries per page (found: 20% of the reclaimer's
//! CPU when clean pages are dropped without parking).
//!
//! A page that comes into use in a span after its pages were read is seen
//! on the hand's next turn, as a clock may. Locks: none (the reads are
//! `PageStates`' lock-free ones).

use crate::region::RegionInner;

/// The pages in use of one span, read ahead of the hand.
#[derive(Debug, Default)]
pub(super) struct UsedPages {
    /// The region they belong to.
    region: u64,
    /// The page the read started at: a later ask from before it reads
    /// afresh (the hand came round again).
    from: usize,
    pages: Vec<usize>,
    next: usize,
}

impl UsedPages {
    /// The first page in use of `r` at or after `from`, as
    /// `RegionInner::next_used` would find it.
    pub(super) fn next(&mut self, r: &RegionInner, from: usize) -> Option<usize> {
        if r.id == self.region && from >= self.from {
            while self.pages.get(self.next).is_some_and(|&p| p < from) {
                self.next += 1;
            }
            if let Some(&p) = self.pages.get(self.next) {
                return Some(p);
            }
        }
        self.region = r.id;
        self.from = from;
        self.pages.clear();
        self.next = 0;
        r.used_in_next_span(from, &mut self.pages);
        self.pages.first().copied()
    }
}
