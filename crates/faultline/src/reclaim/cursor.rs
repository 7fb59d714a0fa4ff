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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PageSize;
    use crate::region::PageState;
    use crate::store::Zero;
    use faultline_sys::mem::Mapping;
    use std::sync::Arc;

    /// Walks `r` from `from` as the hand does (each found page, then the
    /// one after it), with the cursor and with `next_used`: the same pages.
    fn walk(r: &RegionInner, from: usize) -> (Vec<usize>, Vec<usize>) {
        let (mut by_cursor, mut by_page) = (Vec::new(), Vec::new());
        let mut used = UsedPages::default();
        let mut p = from;
        while let Some(n) = used.next(r, p) {
            by_cursor.push(n);
            p = n + 1;
        }
        let mut p = from;
        while let Some(n) = r.next_used(p) {
            by_page.push(n);
            p = n + 1;
        }
        (by_cursor, by_page)
    }

    #[test]
    fn the_cursor_finds_what_next_used_finds() {
        let pages = 4 * 512;
        let m = Mapping::anonymous(pages * 4096, 4096).expect("mmap");
        let r = RegionInner::new(1, m, PageSize::Base4K, Arc::new(Zero), 1, false);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        // Sparse spans (an inline page, small leaves) and a dense one.
        for i in 0..600 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let page = if i < 500 {
                1024 + (seed as usize % 512)
            } else {
                seed as usize % pages
            };
            r.set_state(page, PageState::Resident(i));
        }
        r.set_state(5, PageState::Parked(9_999));
        for from in [0, 5, 6, 511, 512, 1024, 1300, 1535, 1536, pages - 1] {
            let (a, b) = walk(&r, from);
            assert_eq!(a, b, "from page {from}");
        }
    }

    #[test]
    fn the_cursor_reads_afresh_when_the_hand_comes_round() {
        let m = Mapping::anonymous(1024 * 4096, 4096).expect("mmap");
        let r = RegionInner::new(1, m, PageSize::Base4K, Arc::new(Zero), 1, false);
        for p in [3, 10, 700] {
            r.set_state(p, PageState::Resident(p as u32));
        }
        let mut used = UsedPages::default();
        assert_eq!(used.next(&r, 4), Some(10));
        r.set_state(2, PageState::Resident(2));
        assert_eq!(used.next(&r, 11), Some(700), "the next span");
        assert_eq!(used.next(&r, 0), Some(2), "round again: read afresh");
        assert_eq!(used.next(&r, 701), None);
    }
}
