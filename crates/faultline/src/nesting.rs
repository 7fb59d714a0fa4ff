//! Nested faults: a store called under a fault lock (a fill's read, a
//! write-back's write, a gather's read) may touch a faultline region — a
//! store that reads another region — and its thread then faults while it
//! holds the lock. Two rules keep that from deadlocking:
//!
//! 1. **Lending.** A thread inside such a store call is a *lender*
//!    ([`Nesting::lend`]: its thread id, the region and the pages its call is
//!    for). Its own fault, on a page whose lock it holds, is served under
//!    that lock ([`Nesting::lent_to`]): the thread is stopped in the fault
//!    until it is served, so the lock is as good as the server's. Never for a
//!    page of the lender's own call (that store reads its own page: no
//!    answer exists). A server never waits for a lock a stopped lender holds
//!    ([`Nesting::is_lending`]): it puts the event back and serves others.
//! 2. **The standby.** Workers mark themselves busy around store-backed
//!    faults ([`Nesting::enter_busy`]); when every worker stays busy with
//!    none finishing a call for a while ([`Nesting::all_stuck`]), the
//!    standby worker serves events until one finishes.
//!
//! Invariant: a lender's entry lives exactly as long as its store call (a
//! guard). Locks: `lenders` and `standby_mx` are leaves.

use crate::locks::{this_thread, FaultLocks};
use parking_lot::{Condvar, Mutex};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// A thread inside a store call made under a fault lock.
#[derive(Debug, Clone)]
struct Lender {
    tid: u32,
    region: u64,
    pages: Range<usize>,
}

/// The nested-fault state of one manager; see the module docs.
#[derive(Debug)]
pub(crate) struct Nesting {
    workers: usize,
    lenders: Mutex<Vec<Lender>>,
    /// `lenders.len()`, readable without the mutex: every fault asks
    /// whether its thread lends, and almost always none does.
    lending: AtomicUsize,
    /// Workers inside a store-backed fault.
    busy: AtomicUsize,
    /// Store-backed faults being served, by workers and the standby.
    serving: AtomicUsize,
    /// Store-backed faults finished so far.
    busy_exits: AtomicU64,
    /// Store calls made under a fault lock that have ended, either way.
    calls_ended: AtomicU64,
    /// Wakes the standby when every worker is busy, or at shutdown.
    standby_cv: Condvar,
    /// The standby's condvar mutex (guards nothing but the wait).
    standby_mx: Mutex<()>,
}

impl Nesting {
    pub(crate) fn new(workers: usize) -> Nesting {
        Nesting {
            workers,
            lenders: Mutex::new(Vec::new()),
            lending: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            serving: AtomicUsize::new(0),
            busy_exits: AtomicU64::new(0),
            calls_ended: AtomicU64::new(0),
            standby_cv: Condvar::new(),
            standby_mx: Mutex::new(()),
        }
    }

    /// Registers the calling thread as a lender for a store call about
    /// `pages` of region `region`, until the guard drops.
    pub(crate) fn lend(&self, region: u64, pages: Range<usize>) -> Lend<'_> {
        let tid = this_thread();
        self.lenders.lock().push(Lender { tid, region, pages });
        // SeqCst, like the load in `is_lending`: the count is raised before
        // this thread's store call can touch a region, so a server of that
        // fault finds it non-zero.
        self.lending.fetch_add(1, Ordering::SeqCst);
        Lend { nesting: self, tid }
    }

    /// Whether thread `tid` is inside a store call made under a fault lock.
    pub(crate) fn is_lending(&self, tid: u32) -> bool {
        tid != 0
            && self.lending.load(Ordering::SeqCst) > 0
            && self.lenders.lock().iter().any(|l| l.tid == tid)
    }

    /// Whether a fault by `tid` on `page` of region `region`, under lock
    /// `idx`, is served under the lock `tid` holds (see the module docs).
    pub(crate) fn lent_to(
        &self,
        locks: &FaultLocks,
        tid: u32,
        idx: usize,
        region: u64,
        page: usize,
    ) -> bool {
        if tid == 0 || locks.owner(idx) != tid {
            return false;
        }
        let lenders = self.lenders.lock();
        let mut mine = lenders.iter().filter(|l| l.tid == tid).peekable();
        mine.peek().is_some() && !mine.any(|l| l.region == region && l.pages.contains(&page))
    }

    /// Marks a worker busy (inside a store-backed fault) until the guard
    /// drops; when every worker is busy, wakes the standby.
    pub(crate) fn enter_busy(&self) -> Busy<'_> {
        // Relaxed: a heuristic count; the wake-up below goes through the
        // standby's mutex.
        let n = self.busy.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.workers {
            let _g = self.standby_mx.lock();
            self.standby_cv.notify_one();
        }
        Busy { nesting: self }
    }

    /// Counts a store-backed fault being served (by a worker, the standby
    /// or the faulting thread itself) until the guard drops; entered once
    /// the fault holds its page's lock (or is served under a stopped
    /// lender's), never while it waits for one.
    pub(crate) fn enter_serving(&self) -> Serving<'_> {
        // Relaxed: read by `reclaim::nothing_to_wait_for`. A refusal needs
        // it seen again after a failed allocation (`faulting::settle`),
        // which an allocation this fault makes after this increment
        // precedes through the allocator's lock.
        self.serving.fetch_add(1, Ordering::Relaxed);
        Serving { nesting: self }
    }

    /// Store calls made under a fault lock (fills, write-backs): in flight
    /// now, and ended so far. A fault waiting for a frame takes either as
    /// progress: a slow or failing store (a server failing over) is not a
    /// stuck manager. Relaxed: counters compared with themselves.
    pub(crate) fn store_calls(&self) -> (usize, u64) {
        (
            self.lending.load(Ordering::Relaxed),
            self.calls_ended.load(Ordering::Relaxed),
        )
    }

    /// Store-backed faults being served now, the standby's included (a
    /// hint).
    pub(crate) fn serving(&self) -> usize {
        self.serving.load(Ordering::Relaxed)
    }

    fn all_busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed) >= self.workers
    }

    /// Store-backed faults finished so far. Relaxed: a counter compared
    /// with itself; a stale value only delays or repeats a check.
    pub(crate) fn busy_exits(&self) -> u64 {
        self.busy_exits.load(Ordering::Relaxed)
    }

    /// Blocks the standby until every worker is busy or `stopping()`.
    pub(crate) fn await_all_busy(&self, stopping: impl Fn() -> bool) {
        let mut g = self.standby_mx.lock();
        while !stopping() && !self.all_busy() {
            self.standby_cv.wait(&mut g);
        }
    }

    /// Whether every worker stays busy with none finishing for `window`:
    /// stuck (a store that faults on a region waits for a server), not just
    /// busy with slow stores — a standby joining busy workers would only
    /// take CPU from them.
    pub(crate) fn all_stuck(&self, window: Duration) -> bool {
        let seen = self.busy_exits();
        std::thread::sleep(window);
        self.all_busy() && self.busy_exits() == seen
    }

    /// Whether the standby should go on serving: every worker still busy
    /// and none finished since `seen`.
    pub(crate) fn still_stuck(&self, seen: u64) -> bool {
        self.all_busy() && self.busy_exits() == seen
    }

    /// Wakes the standby for shutdown (the caller has set the stop flag).
    pub(crate) fn wake_standby(&self) {
        let _g = self.standby_mx.lock();
        self.standby_cv.notify_all();
    }
}

/// A lender's registration ([`Nesting::lend`]).
#[derive(Debug)]
pub(crate) struct Lend<'a> {
    nesting: &'a Nesting,
    tid: u32,
}

impl Drop for Lend<'_> {
    fn drop(&mut self) {
        let mut l = self.nesting.lenders.lock();
        // The latest of this thread's entries (calls nest in a thread).
        if let Some(i) = l.iter().rposition(|x| x.tid == self.tid) {
            l.remove(i);
            // SeqCst: see `Nesting::lend`.
            self.nesting.lending.fetch_sub(1, Ordering::SeqCst);
        }
        self.nesting.calls_ended.fetch_add(1, Ordering::Relaxed);
    }
}

/// A worker's busy mark ([`Nesting::enter_busy`]).
#[derive(Debug)]
pub(crate) struct Busy<'a> {
    nesting: &'a Nesting,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.nesting.busy_exits.fetch_add(1, Ordering::Relaxed);
        self.nesting.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A store-backed fault being served ([`Nesting::enter_serving`]).
pub(crate) struct Serving<'a> {
    nesting: &'a Nesting,
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.nesting.serving.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LockMode;

    #[test]
    fn a_lender_lends_its_locks_but_not_for_its_own_pages() {
        let n = Nesting::new(1);
        let locks = FaultLocks::new(LockMode::Global, 1);
        let me = this_thread();
        let _g = locks.lock(0, 0);
        assert!(!n.lent_to(&locks, me, 0, 7, 3), "not lending yet");
        {
            let _l = n.lend(7, 0..4);
            assert!(n.is_lending(me));
            assert!(n.lent_to(&locks, me, 0, 9, 3), "another region's page");
            assert!(n.lent_to(&locks, me, 0, 7, 4), "outside its call");
            assert!(!n.lent_to(&locks, me, 0, 7, 3), "its own call's page");
            assert!(!n.lent_to(&locks, me + 1, 0, 9, 3), "another thread");
        }
        assert!(!n.is_lending(me));
    }

    #[test]
    fn stuck_only_without_exits() {
        let n = Nesting::new(1);
        let b = n.enter_busy();
        assert!(n.all_stuck(Duration::from_millis(1)));
        let seen = n.busy_exits();
        drop(b);
        assert!(!n.still_stuck(seen));
    }
}
