//! The page ranges of a region the program pinned (`Region::pin`): reclaim
//! passes over them, so their pages stay in memory (resident, or parked if
//! a pass parked one just before the pin) until unpinned or the region is
//! dropped.
//!
//! Invariant: `any` is false only when `ranges` is empty, so the check
//! reclaim makes per page costs one load for a region without pins.
//! Locks: `ranges`' mutex, a leaf, held only to read or edit the list.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

/// Pinned page ranges (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Pins {
    any: AtomicBool,
    ranges: parking_lot::Mutex<Vec<Range<usize>>>,
}

impl Pins {
    /// Pins pages `pages`.
    pub(crate) fn add(&self, pages: Range<usize>) {
        if pages.is_empty() {
            return;
        }
        let mut r = self.ranges.lock();
        r.push(pages);
        // Release: pairs with the Acquire in `contains` (the list is read
        // under the mutex anyway; the flag only gates taking it).
        self.any.store(true, Ordering::Release);
    }

    /// Unpins pages `pages` (whatever of them was pinned).
    pub(crate) fn remove(&self, pages: Range<usize>) {
        let mut r = self.ranges.lock();
        let old = std::mem::take(&mut *r);
        for p in old {
            // What of `p` lies outside `pages` stays pinned.
            if p.start < pages.start {
                r.push(p.start..p.end.min(pages.start));
            }
            if p.end > pages.end {
                r.push(p.start.max(pages.end)..p.end);
            }
        }
        self.any.store(!r.is_empty(), Ordering::Release);
    }

    /// Whether page `page` is pinned.
    pub(crate) fn contains(&self, page: usize) -> bool {
        self.any.load(Ordering::Acquire) && self.ranges.lock().iter().any(|r| r.contains(&page))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_pin_and_unpin_in_part() {
        let p = Pins::default();
        assert!(!p.contains(5));
        p.add(4..10);
        p.add(20..22);
        assert!(p.contains(4) && p.contains(9) && p.contains(21));
        assert!(!p.contains(10) && !p.contains(3));
        p.remove(6..8);
        assert!(p.contains(5) && !p.contains(6) && !p.contains(7) && p.contains(8));
        p.remove(0..100);
        assert!(!p.contains(5) && !p.contains(21));
        assert!(!p.any.load(Ordering::Relaxed));
    }
}
