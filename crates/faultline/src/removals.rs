//! The program's removals (`MADV_DONTNEED` / `MADV_FREE` on region memory,
//! `UFFD_EVENT_REMOVE`) between the read of their event and the end of its
//! handling (`fault/remove.rs`), and which of their pages are *settled*.
//!
//! Why: the event is read before the kernel zaps the pages, the `madvise`
//! returns right after, and the program may write the range again before a
//! worker has handled the event. A handler that dropped such a page then
//! would drop the program's new write. So a removal is recorded when its
//! event is read ([`Removals::add`], from `Core::read_events`, before the
//! calling thread can return), and each page of it is dropped at most
//! once, by whoever comes first under the page's lock: the handler, a
//! fault on the page (`resolve` settles pending removals before it serves),
//! or a gather of the page's zapped holes (`pagemove::recollect`, which
//! refills them from the store — the same bytes). [`Removal::settle`] is
//! that "first": a page settled is never dropped again for that removal.
//!
//! Invariant: a removal is listed from its event's read until its handler
//! ends ([`Removals::end`]); a page is settled only under its fault lock.
//! Locks: the list's mutex, then a removal's own (both leaves).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One removal of the program's: `[start, end)`, and its settled pages
/// (their addresses).
#[derive(Debug)]
pub(crate) struct Removal {
    pub(crate) start: usize,
    pub(crate) end: usize,
    handling: std::sync::atomic::AtomicBool,
    settled: Mutex<Vec<usize>>,
}

impl Removal {
    /// Marks the page at `addr` settled; true if it was not yet (the caller,
    /// holding the page's lock, drops it now).
    pub(crate) fn settle(&self, addr: usize) -> bool {
        let mut s = self.settled.lock();
        if s.contains(&addr) {
            return false;
        }
        s.push(addr);
        true
    }

    /// Whether the page at `addr` is settled.
    pub(crate) fn is_settled(&self, addr: usize) -> bool {
        self.settled.lock().contains(&addr)
    }

    /// Whether `[addr, addr + len)` overlaps the removed range.
    pub(crate) fn overlaps(&self, addr: usize, len: usize) -> bool {
        addr < self.end && self.start < addr + len
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Removals {
    list: Mutex<Vec<Arc<Removal>>>,
    /// `list.len()`, for the fault path's check without the lock.
    count: AtomicUsize,
}

impl Removals {
    /// Records a removal whose event was just read.
    pub(crate) fn add(&self, start: usize, end: usize) {
        let mut l = self.list.lock();
        l.push(Arc::new(Removal {
            start,
            end,
            handling: false.into(),
            settled: Mutex::new(Vec::new()),
        }));
        // Release: pairs with the Acquire load in `any`, so a fault that
        // sees the count sees the list's entry (it takes the mutex anyway).
        self.count.store(l.len(), Ordering::Release);
    }

    /// Whether any removal is pending (the fault path's fast check).
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// The pending removals overlapping `[addr, addr + len)`.
    pub(crate) fn overlapping(&self, addr: usize, len: usize) -> Vec<Arc<Removal>> {
        if !self.any() {
            return Vec::new();
        }
        let l = self.list.lock();
        l.iter()
            .filter(|r| r.overlaps(addr, len))
            .cloned()
            .collect()
    }

    /// The recorded removal of `[start, end)` that no handler has taken yet,
    /// taken now (`None`: the event was faultline's own, never recorded).
    pub(crate) fn begin(&self, start: usize, end: usize) -> Option<Arc<Removal>> {
        let l = self.list.lock();
        l.iter()
            .find(|r| r.start == start && r.end == end && !r.handling.swap(true, Ordering::Relaxed))
            .cloned()
    }

    /// The handler of `removal` is done: nothing settles it any more.
    pub(crate) fn end(&self, removal: &Arc<Removal>) {
        let mut l = self.list.lock();
        l.retain(|r| !Arc::ptr_eq(r, removal));
        // Release: as in `add`.
        self.count.store(l.len(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_settles_once_and_a_removal_is_handled_once() {
        let rs = Removals::default();
        assert!(!rs.any());
        rs.add(0x1000, 0x3000);
        rs.add(0x1000, 0x3000);
        assert_eq!(rs.overlapping(0x2000, 0x1000).len(), 2);
        assert!(rs.overlapping(0x3000, 0x1000).is_empty());
        let a = rs.begin(0x1000, 0x3000).expect("first");
        let b = rs.begin(0x1000, 0x3000).expect("second");
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(rs.begin(0x1000, 0x3000).is_none(), "both taken");
        assert!(rs.begin(0x5000, 0x6000).is_none(), "never recorded");
        assert!(a.settle(0x2000));
        assert!(!a.settle(0x2000), "settled already");
        assert!(b.settle(0x2000), "each removal on its own");
        rs.end(&a);
        rs.end(&b);
        assert!(!rs.any());
    }
}
