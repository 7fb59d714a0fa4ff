//! Pages of a region the kernel would not let reclaim move out (`EBUSY`:
//! shared copy-on-write with a child of `fork()` that inherited the region,
//! pinned for I/O): the clock hand passes over such a page for [`HOLD_FOR`]
//! after the refusal instead of asking again on every pass, each ask
//! costing a brief retry under the page's fault lock.
//!
//! [`HOLD_FOR`] is shorter than the 2 s a fault waits for a frame without
//! progress before it is refused (`reclaim::faulting`): a page held only
//! for a moment is reclaimable again before any fault could be refused
//! while it is skipped. A noted page may stop being held at any time (the
//! child exits): the mark only spares work, it is never relied on.
//!
//! Invariant: `any` is false only when `until` is empty, so the check the
//! hand makes per page costs one load for a region with no held page.
//! Locks: `until`'s mutex, a leaf, held only to read or edit the map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the hand passes over a page after the kernel refused it.
pub(crate) const HOLD_FOR: Duration = Duration::from_secs(1);

/// Pages recently refused, each with when its mark ends.
#[derive(Debug, Default)]
pub(crate) struct Held {
    any: AtomicBool,
    until: parking_lot::Mutex<HashMap<usize, Instant>>,
}

impl Held {
    /// Notes that the kernel just refused to move page `page`.
    pub(crate) fn note(&self, page: usize) {
        let now = Instant::now();
        let mut until = self.until.lock();
        until.retain(|_, t| *t > now);
        until.insert(page, now + HOLD_FOR);
        // Release: pairs with the Acquire in `contains` (the map is read
        // under the mutex anyway; the flag only gates taking it).
        self.any.store(true, Ordering::Release);
    }

    /// Whether page `page` was refused less than [`HOLD_FOR`] ago. An
    /// expired mark is dropped.
    pub(crate) fn contains(&self, page: usize) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let mut until = self.until.lock();
        match until.get(&page) {
            Some(&t) if t > Instant::now() => true,
            Some(_) => {
                until.remove(&page);
                self.any.store(!until.is_empty(), Ordering::Release);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_lasts_hold_for_then_goes() {
        let h = Held::default();
        assert!(!h.contains(3));
        h.note(3);
        assert!(h.contains(3) && !h.contains(4));
        // Age the mark past its end.
        h.until
            .lock()
            .insert(3, Instant::now() - Duration::from_millis(1));
        assert!(!h.contains(3));
        assert!(
            !h.any.load(Ordering::Relaxed),
            "the last mark gone clears the flag"
        );
    }
}
