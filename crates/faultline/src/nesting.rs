//! Nested faults and spare servers. A store called under a fault lock (a
//! fill's read, a write-back's write, a gather's read) may touch a
//! faultline region — a store that reads another region — and its thread
//! then faults while it holds the lock. Two rules keep that from
//! deadlocking:
//!
//! 1. **Lending.** A thread inside such a store call is a *lender*
//!    ([`Nesting::lend`]: its thread id, the region and the pages its call is
//!    for). Its own fault, on a page whose lock it holds, is served under
//!    that lock ([`Nesting::lent_to`]): the thread is stopped in the fault
//!    until it is served, so the lock is as good as the server's. Never for a
//!    page of the lender's own call (that store reads its own page: no
//!    answer exists). A server never waits for a lock a stopped lender holds
//!    ([`Nesting::is_lending`]): it puts the event back and serves others.
//! 2. **Spare servers.** Workers and spares mark themselves busy around
//!    store-backed faults ([`Nesting::enter_busy`]); spare `r` is on duty
//!    while at least `workers + r` servers are busy ([`Nesting::on_duty`]),
//!    and serves when events wait for a server, so while every worker
//!    waits in a store call — slow, or stuck on a fault of its own store —
//!    another server takes the next event. The same rule lets many store
//!    reads be in flight at once (issue 42). A spare sleeps apart from the
//!    userfaultfd (parked; it polls the descriptor only while it serves),
//!    so it costs an idle fault nothing. A server that becomes busy with
//!    every worker busy reads what is pending on the descriptor and, if
//!    events wait, *calls* spare `busy - workers`
//!    ([`Nesting::call_spare`]), which serves them. A spare on duty naps
//!    [`STUCK`] at a time (the rise of `busy` to its duty wakes it from a
//!    longer doze), and after a whole [`STUCK`] on duty with no
//!    store-backed fault finishing it serves anyway: a worker stuck on
//!    its store's own fault, whose event no busy server reads. Serving
//!    only when called or stuck matters on few CPUs: a spare that served
//!    whenever both of 2 workers were busy took 20% of 2 threads' random
//!    reads (docs/design.md, "Spare servers").
//!
//! Invariant: a lender's entry lives exactly as long as its store call (a
//! guard); `busy` counts the [`Busy`] guards alive. Locks: `lenders` is a
//! leaf; the spares' parking takes none.

use crate::locks::{this_thread, FaultLocks};
use parking_lot::Mutex;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Duration;

/// A thread inside a store call made under a fault lock.
#[derive(Debug, Clone)]
struct Lender {
    tid: u32,
    region: u64,
    /// The runs of pages its call is for (one, or a batch's scattered
    /// pages).
    pages: Vec<Range<usize>>,
}

/// The nested-fault state of one manager; see the module docs.
#[derive(Debug)]
pub(crate) struct Nesting {
    workers: usize,
    lenders: Mutex<Vec<Lender>>,
    /// `lenders.len()`, readable without the mutex: every fault asks
    /// whether its thread lends, and almost always none does.
    lending: AtomicUsize,
    /// Servers (workers and spares) inside a store-backed fault.
    busy: AtomicUsize,
    /// Store-backed faults being served, by any server or in-thread.
    serving: AtomicUsize,
    /// Store calls made under a fault lock that have ended, either way.
    calls_ended: AtomicU64,
    /// Store-backed faults finished so far (busy guards dropped).
    busy_exits: AtomicU64,
    /// Each spare by rank.
    spares: Box<[Spare]>,
    /// How long a parked spare naps ([`SPARE_NAP`]; longer in a test).
    nap: Duration,
}

/// How long a parked spare sleeps before it looks for work again without
/// being called (a backstop: a server that finds work waiting while every
/// worker is busy calls the next spare).
const SPARE_NAP: Duration = Duration::from_millis(100);

/// How long a spare on duty naps at a time: a worker whose store faulted
/// on a region is stuck until some server reads that fault, and no busy
/// server reads.
const STUCK: Duration = Duration::from_millis(5);

impl Nesting {
    /// The state of a manager with `workers` workers and `spares` spare
    /// servers.
    pub(crate) fn new(workers: usize, spares: usize) -> Nesting {
        Nesting {
            workers,
            lenders: Mutex::new(Vec::new()),
            lending: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            serving: AtomicUsize::new(0),
            calls_ended: AtomicU64::new(0),
            busy_exits: AtomicU64::new(0),
            spares: (0..spares).map(|_| Spare::default()).collect(),
            nap: SPARE_NAP,
        }
    }

    /// Registers the calling thread as a lender for a store call about
    /// `pages` of region `region`, until the guard drops.
    pub(crate) fn lend(&self, region: u64, pages: Range<usize>) -> Lend<'_> {
        self.lend_runs(region, vec![pages])
    }

    /// [`Nesting::lend`] for a call about several runs of pages of
    /// `region` (a batch of scattered pages written back at once).
    pub(crate) fn lend_runs(&self, region: u64, pages: Vec<Range<usize>>) -> Lend<'_> {
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
        mine.peek().is_some()
            && !mine.any(|l| l.region == region && l.pages.iter().any(|run| run.contains(&page)))
    }

    /// Marks a server busy (inside a store-backed fault, or waiting for a
    /// page lock to serve one) until the guard drops. When that makes `n`
    /// servers busy with `n >= workers`, wakes spare `n - workers` if it
    /// dozes (a long nap, off duty), so that it naps [`STUCK`] at a time
    /// from now on and can tell a stuck worker (the standby's old rule).
    pub(crate) fn enter_busy(&self) -> Busy<'_> {
        // SeqCst, with this SeqCst load of `Spare::dozing` and, in `nap`,
        // the SeqCst store of `dozing` then SeqCst load of `busy`: either
        // this sees the spare dozing and unparks it, or the spare's look
        // after it set `dozing` sees this count.
        let n = self.busy.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(spare) = n.checked_sub(self.workers).and_then(|r| self.spares.get(r)) {
            if spare.dozing.load(Ordering::SeqCst) {
                spare.unpark();
            }
        }
        Busy { nesting: self }
    }

    /// The rank of the spare whose duty the busy count says has begun, if
    /// every worker is busy: `busy - workers`.
    pub(crate) fn next_spare(&self) -> Option<usize> {
        self.busy
            .load(Ordering::Relaxed)
            .checked_sub(self.workers)
            .filter(|&rank| rank < self.spares.len())
    }

    /// Calls spare `rank` to serve events that wait (found by the caller).
    pub(crate) fn call_spare(&self, rank: usize) {
        if let Some(spare) = self.spares.get(rank) {
            // Relaxed: the unpark below happens-before the spare's `park`
            // returns, so the spare sees the flag after it wakes; a flag
            // seen without a wake (it was awake) is a call all the same.
            spare.called.store(true, Ordering::Relaxed);
            spare.unpark();
        }
    }

    /// Whether spare `rank` was called since it last looked (and clears it).
    pub(crate) fn take_call(&self, rank: usize) -> bool {
        self.spares
            .get(rank)
            // Relaxed: see `call_spare`.
            .is_some_and(|s| s.called.swap(false, Ordering::Relaxed))
    }

    /// Records the calling thread as spare `rank` (to be unparked).
    pub(crate) fn register_spare(&self, rank: usize) {
        if let Some(spare) = self.spares.get(rank) {
            let _ = spare.thread.set(std::thread::current());
        }
    }

    /// Whether spare `rank` is on duty: every worker and every spare
    /// ranked before it busy (as far as the count tells: busy spares
    /// ranked after it count too, and keep it on duty while a worker is
    /// free — it then only looks, every [`STUCK`], for events nobody
    /// reads).
    pub(crate) fn on_duty(&self, rank: usize) -> bool {
        // SeqCst: the dozing handshake's load of `busy` (see `enter_busy`);
        // elsewhere a hint, where it costs a plain load on x86 all the same.
        self.busy.load(Ordering::SeqCst) >= self.workers + rank
    }

    /// Parks spare `rank` (the calling thread) until it is unparked or a
    /// nap ends: [`STUCK`] while it is on duty, [`SPARE_NAP`] (dozing)
    /// otherwise. Returns whether it is stuck: on duty for the whole
    /// [`STUCK`] with no store-backed fault finishing meanwhile — a worker
    /// whose store faulted on a region waits for a server, and no busy
    /// server reads that fault's event (the old standby's rule).
    pub(crate) fn nap(&self, rank: usize) -> bool {
        let Some(spare) = self.spares.get(rank) else {
            return false;
        };
        if self.on_duty(rank) {
            // Relaxed: a counter compared with itself.
            let exits = self.busy_exits.load(Ordering::Relaxed);
            // A nap cut short (a call, a leftover unpark token) is no
            // evidence of a stuck worker: only a whole one counts.
            let t = std::time::Instant::now();
            std::thread::park_timeout(STUCK);
            return t.elapsed() >= STUCK
                && self.on_duty(rank)
                && self.busy_exits.load(Ordering::Relaxed) == exits;
        }
        // SeqCst: see `enter_busy`.
        spare.dozing.store(true, Ordering::SeqCst);
        if !self.on_duty(rank) {
            std::thread::park_timeout(self.nap);
        }
        spare.dozing.store(false, Ordering::Relaxed);
        false
    }

    /// Counts a store-backed fault being served (by a server or the
    /// faulting thread itself) until the guard drops; entered once the
    /// fault holds its page's lock (or is served under a stopped lender's),
    /// never while it waits for one.
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

    /// Store-backed faults being served now, by any server (a hint).
    pub(crate) fn serving(&self) -> usize {
        self.serving.load(Ordering::Relaxed)
    }

    /// Unparks every spare, for shutdown (the caller has set the stop
    /// flag).
    pub(crate) fn wake_spares(&self) {
        self.spares.iter().for_each(Spare::unpark);
    }
}

/// One spare server's parking place.
#[derive(Debug, Default)]
struct Spare {
    /// Its thread, set when it starts.
    thread: OnceLock<Thread>,
    /// Called for events that wait ([`Nesting::call_spare`]).
    called: std::sync::atomic::AtomicBool,
    /// In a long nap, off duty: the next rise of `busy` to its duty wakes
    /// it ([`Nesting::enter_busy`]).
    dozing: std::sync::atomic::AtomicBool,
}

impl Spare {
    fn unpark(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
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
        let n = Nesting::new(1, 1);
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
        {
            // A batch's scattered pages: each is its own; those between
            // them are lent.
            let _l = n.lend_runs(7, vec![2..3, 10..11, 40..42]);
            assert!(!n.lent_to(&locks, me, 0, 7, 10), "a page of the batch");
            assert!(!n.lent_to(&locks, me, 0, 7, 41), "a page of the batch");
            assert!(n.lent_to(&locks, me, 0, 7, 5), "between the batch's pages");
        }
        assert!(!n.is_lending(me));
    }

    #[test]
    fn spares_go_on_duty_in_rank_order() {
        let n = Nesting::new(2, 3);
        assert!(!n.on_duty(0));
        let a = n.enter_busy();
        assert!(!n.on_duty(0), "a worker is free");
        let b = n.enter_busy();
        assert!(n.on_duty(0) && !n.on_duty(1));
        let c = n.enter_busy();
        assert!(n.on_duty(1) && !n.on_duty(2));
        drop((a, b));
        assert!(!n.on_duty(0), "two workers free again");
        drop(c);
    }

    #[test]
    fn the_busy_count_unparks_the_spare_whose_duty_begins() {
        let n = std::sync::Arc::new(Nesting {
            nap: Duration::from_secs(30),
            ..Nesting::new(1, 2)
        });
        let spare = {
            let n = n.clone();
            std::thread::spawn(move || {
                n.register_spare(1);
                let t = std::time::Instant::now();
                while !n.on_duty(1) {
                    n.nap(1);
                }
                t.elapsed()
            })
        };
        // Let the spare park (its registration is all it needs).
        while n.spares[1].thread.get().is_none() {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(20));
        let _a = n.enter_busy();
        let _b = n.enter_busy();
        let waited = spare.join().expect("spare thread");
        assert!(
            waited < Duration::from_secs(10),
            "woken by the second busy server, not by its 30 s nap: {waited:?}"
        );
    }
}
