//! The program's removals (`MADV_DONTNEED` / `MADV_FREE` on region memory,
//! `UFFD_EVENT_REMOVE`) between the read of their event and the end of its
//! handling (`fault/remove.rs`), and the map clock that tells which pages
//! hold only data from before an event was read.
//!
//! Why a clock: the event is read before the kernel zaps the pages, the
//! `madvise` returns right after, and the program may write the range
//! again before a worker handles the event (and with `MADV_FREE` nothing is
//! zapped at all: a later write lands in the page still mapped). A page
//! faultline had parked is not reached by the zap, so dropping it is the
//! handler's job — but it must not drop data the program wrote after the
//! call. Such data needs the page mapped after the zap, so [`MapStamps`]
//! stamps every frame moved into a region (`pagemove::move_in`) with a
//! clock that ticks at every such move, and the reader takes the clock's
//! time *before* its `read` ([`Removal::read_at`]): a frame stamped later
//! may hold a write from after the call and is left alone; one stamped
//! earlier holds nothing the program wrote since.
//!
//! Invariant: a removal is listed from its event's read until its handler
//! ends ([`Removals::end`]); a frame's stamp is written after its move,
//! under the page's lock. Locks: the list's mutex (a leaf). The clock is
//! one atomic (SeqCst): its read before the `read` syscall and its tick
//! after a move that followed the zap are ordered by the syscalls between
//! them, and one atomic's values follow that order. A slot's stamp is
//! written and read under the page's lock (Relaxed).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One removal of the program's: `[start, end)`, and the map clock's time
/// before its event was read.
#[derive(Debug)]
pub(crate) struct Removal {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) read_at: u32,
    handling: AtomicBool,
    /// Second looks queued and not finished ([`Retry`]).
    pub(crate) looks: AtomicUsize,
}

impl Removal {
    /// Whether `[addr, addr + len)` overlaps the removed range.
    pub(crate) fn overlaps(&self, addr: usize, len: usize) -> bool {
        addr < self.end && self.start < addr + len
    }
}

/// When each pool slot's frame was last moved into a region (see the
/// module docs).
#[derive(Debug)]
pub(crate) struct MapStamps {
    clock: AtomicU32,
    slots: Box<[AtomicU32]>,
}

impl MapStamps {
    /// Stamps for a pool of `slots` 4 KiB slots, all "never mapped".
    pub(crate) fn new(slots: usize) -> MapStamps {
        MapStamps {
            clock: AtomicU32::new(0),
            slots: (0..slots).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// The clock's time: taken before a read of events.
    pub(crate) fn now(&self) -> u32 {
        self.clock.load(Ordering::SeqCst)
    }

    /// The frames of slots `first..first + n` were just moved into a
    /// region (called after the move).
    pub(crate) fn stamp(&self, first: usize, n: usize) {
        let t = self.clock.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        for s in self.slots.iter().skip(first).take(n) {
            // Relaxed: read under the page's lock, which this thread holds.
            s.store(t, Ordering::Relaxed);
        }
    }

    /// Whether the frame at slot `index` was moved into a region after
    /// the clock read `then` (a wrapped clock errs toward "after").
    pub(crate) fn mapped_since(&self, index: usize, then: u32) -> bool {
        self.slots
            .get(index)
            // Relaxed: the caller holds the page's lock (see `stamp`).
            .is_none_or(|s| s.load(Ordering::Relaxed).wrapping_sub(then) as i32 > 0)
    }
}

/// Pages of one region a removal's handler has to look at again (resident
/// pages the kernel had not zapped yet), not before `next`, until `until`.
#[derive(Debug)]
pub(crate) struct Retry {
    pub(crate) removal: Arc<Removal>,
    pub(crate) region: u64,
    pub(crate) pages: Vec<usize>,
    pub(crate) next: Instant,
    pub(crate) until: Instant,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Removals {
    list: Mutex<Vec<Arc<Removal>>>,
    /// `list.len()`, for the fault path's check without the lock.
    count: AtomicUsize,
    /// Handlers' second looks, for idle workers.
    retries: Mutex<Vec<Retry>>,
}

impl Removals {
    /// Records a removal whose event was just read.
    pub(crate) fn add(&self, start: usize, end: usize, read_at: u32) {
        let mut l = self.list.lock();
        l.push(Arc::new(Removal {
            start,
            end,
            read_at,
            handling: false.into(),
            looks: AtomicUsize::new(0),
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

    /// Queues a second look.
    pub(crate) fn retry_later(&self, r: Retry) {
        self.retries.lock().push(r);
    }

    /// Whether second looks are queued (a worker then waits with a timeout).
    pub(crate) fn has_retries(&self) -> bool {
        !self.retries.lock().is_empty()
    }

    /// A queued second look that is due, taken.
    pub(crate) fn due_retry(&self) -> Option<Retry> {
        let mut q = self.retries.lock();
        let now = Instant::now();
        let i = q.iter().position(|r| r.next <= now)?;
        Some(q.swap_remove(i))
    }

    /// The handler of `removal` is done: no fault looks at it any more.
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
    fn a_removal_is_handled_once() {
        let rs = Removals::default();
        assert!(!rs.any());
        rs.add(0x1000, 0x3000, 7);
        rs.add(0x1000, 0x3000, 8);
        assert_eq!(rs.overlapping(0x2000, 0x1000).len(), 2);
        assert!(rs.overlapping(0x3000, 0x1000).is_empty());
        let a = rs.begin(0x1000, 0x3000).expect("first");
        let b = rs.begin(0x1000, 0x3000).expect("second");
        assert_eq!((a.read_at, b.read_at), (7, 8));
        assert!(rs.begin(0x1000, 0x3000).is_none(), "both taken");
        assert!(rs.begin(0x5000, 0x6000).is_none(), "never recorded");
        rs.end(&a);
        rs.end(&b);
        assert!(!rs.any());
    }

    #[test]
    fn a_frame_mapped_after_the_read_is_told_apart() {
        let st = MapStamps::new(1024);
        st.stamp(0, 512);
        let then = st.now();
        assert!(!st.mapped_since(0, then), "mapped before");
        assert!(!st.mapped_since(600, then), "never mapped");
        st.stamp(512, 1);
        assert!(st.mapped_since(512, then));
        assert!(!st.mapped_since(513, then), "only the slots moved");
        assert!(st.mapped_since(4096, then), "outside the pool: after");
    }
}
