//! Fault locks: serialize the resolution of one page (seed 003).
//!
//! A table of `n` cache-line-padded mutexes, `n` a power of two (by default
//! [`crate::Config::lock_table`]: by CPUs and servers, at least 64); the
//! page with key `(domain, page)`
//! uses lock `hash(domain, page) & (n - 1)`. The domain is the region, or for
//! a store that names its backing object ([`crate::Store::identity`]) that
//! object, so two regions over one file serialize the same file page. With
//! [`LockMode::Global`] (the pre-seed baseline) `n = 1`: every fault takes one
//! lock.
//!
//! Lockstat: each lock counts its acquisitions, the acquisitions that found
//! it held (contentions), and the time those waited, in counters that live
//! in the lock's own cache line and change only while it is held (so they
//! cost no extra cache-line transfer); [`FaultLocks::stat`] sums them.
//!
//! Invariant: a page's state (absent / resident / poisoned) and its mapping
//! change only under its lock. Workers never touch region memory, but a
//! store called under a fault lock may (a store that reads another region):
//! its thread then faults while holding the lock. Such a fault is served by
//! another worker or a spare server, and if its page needs a lock the faulting
//! worker holds, under that worker's lock — the worker is stopped in the
//! fault, so the lock is as good as the server's ([`FaultLocks::owner`]
//! tells who holds it). Locks are leaves: while one is held only the allocator's
//! locks, the pool's split lock and the stats histogram lock are taken, and
//! they are leaves too — with three exceptions that cannot wait in a cycle:
//! read-ahead only *tries* further fault locks, the reclaim hand only
//! *tries* the locks of the up to 32 clean pages it batches (and holds them
//! until their drop: `reclaim/drops.rs`), and migration and teardown take
//! several with [`FaultLocks::lock_all`], in ascending order, waiting for
//! one while holding others at most 10 ms (then holding none).

use crate::config::LockMode;
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// Counters of one lock (or a sum of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LockStat {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Times it was found held and the taker waited.
    pub contentions: u64,
    /// Total time spent waiting, in nanoseconds.
    pub wait_ns: u64,
}

/// A held fault lock; records its holder's thread while held (see
/// [`FaultLocks::owner`]).
#[derive(Debug)]
pub struct FaultGuard<'a> {
    /// Held for its drop: the unlock.
    _guard: MutexGuard<'a, LockStat>,
    owner: &'a AtomicU32,
}

impl<'a> FaultGuard<'a> {
    fn new(mut guard: MutexGuard<'a, LockStat>, owner: &'a AtomicU32) -> FaultGuard<'a> {
        guard.acquisitions += 1;
        // Relaxed: read only by a server of this thread's own fault, which
        // the kernel delivers after this store (the fault happens later in
        // this thread).
        owner.store(this_thread(), Ordering::Relaxed);
        FaultGuard {
            _guard: guard,
            owner,
        }
    }
}

impl Drop for FaultGuard<'_> {
    fn drop(&mut self) {
        // The mutex itself unlocks after this, when `_guard` drops.
        self.owner.store(0, Ordering::Relaxed);
    }
}

/// Counts a wait that began at `t` and ended with `g` held (lockstat).
fn waited(mut g: MutexGuard<'_, LockStat>, t: Instant) -> MutexGuard<'_, LockStat> {
    g.contentions += 1;
    g.wait_ns += t.elapsed().as_nanos() as u64;
    g
}

/// The longest [`FaultLocks::lock_all`] waits for a lock while it holds
/// others: far below the 2 s after which a fault waiting for a frame
/// without progress is refused, far above a fault's usual hold.
const HOLDING_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// This thread's kernel id, cached (0 never names a thread).
pub(crate) fn this_thread() -> u32 {
    thread_local! {
        static TID: u32 = faultline_sys::host::thread_id();
    }
    TID.with(|t| *t)
}

/// The table. See the module docs.
#[derive(Debug)]
pub struct FaultLocks {
    locks: Box<[CachePadded<Mutex<LockStat>>]>,
    /// The thread holding each lock (0: none).
    owners: Box<[AtomicU32]>,
    mask: usize,
}

impl FaultLocks {
    /// A table for `mode`; `count` (rounded up to a power of two) is used for
    /// `Hashed`.
    pub fn new(mode: LockMode, count: usize) -> FaultLocks {
        let n = match mode {
            LockMode::Global => 1,
            LockMode::Hashed => count.next_power_of_two().max(1),
        };
        FaultLocks {
            locks: (0..n)
                .map(|_| CachePadded::new(Mutex::new(LockStat::default())))
                .collect(),
            owners: (0..n).map(|_| AtomicU32::new(0)).collect(),
            mask: n - 1,
        }
    }

    /// How many locks the table has.
    pub fn count(&self) -> usize {
        self.locks.len()
    }

    /// Index of the lock of `(domain, page)`.
    pub fn index(&self, domain: u64, page: u64) -> usize {
        // A multiplicative hash (Fibonacci hashing) of both keys, so that
        // neighbouring pages of one domain land on different locks.
        let h =
            (domain.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ page).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        (h >> 32) as usize & self.mask
    }

    /// Whether the lock of `(domain, page)` is held right now (a hint).
    pub fn is_locked(&self, domain: u64, page: u64) -> bool {
        self.locks[self.index(domain, page)].is_locked()
    }

    /// Takes the lock of `(domain, page)`, counting the acquisition and any
    /// wait.
    pub fn lock(&self, domain: u64, page: u64) -> FaultGuard<'_> {
        self.lock_index(self.index(domain, page))
    }

    /// Takes every lock in `indices` (masked, sorted and deduplicated
    /// first). For migration, which holds a whole 2 MiB block's pages, and
    /// teardown.
    ///
    /// It goes in ascending order, but waits for a lock held elsewhere
    /// while holding lower ones only up to [`HOLDING_WAIT`]; past that it
    /// lets go of all it took, waits for that lock alone, lets it go and
    /// starts again. A thread holding one fault lock may wait for something
    /// only a page under another lock can give — a fault under a full
    /// budget waits for reclaim to free a frame, and reclaim only *tries*
    /// locks — so a taker that waited for it holding the rest would leave
    /// that fault nothing to reclaim until the fault gave up: with 8 locks,
    /// a migration of a 4 KiB region's block holding 7 and waiting for the
    /// eighth stops a 2 MiB fault holding it from evicting any page under
    /// the 7, and after 2 s without progress the fault is refused. The
    /// bounded waits, not tries, keep a large set going on a busy machine:
    /// teardown may take the whole table, which is never all free at one
    /// instant while faults come and go.
    pub fn lock_all(&self, indices: &mut Vec<usize>) -> Vec<FaultGuard<'_>> {
        let all = self.lock_all_until(indices, None);
        // Without a deadline every wait ends with the lock taken.
        all.unwrap_or_default()
    }

    /// [`FaultLocks::lock_all`], giving up after `limit`: `None`, holding
    /// nothing, if some lock stayed held that long (by a worker inside a
    /// store call that does not return). For teardown, which must not
    /// hang, and collapse, which holds a frame meanwhile.
    pub fn lock_all_within(
        &self,
        indices: &mut Vec<usize>,
        limit: std::time::Duration,
    ) -> Option<Vec<FaultGuard<'_>>> {
        self.lock_all_until(indices, Some(Instant::now() + limit))
    }

    /// [`FaultLocks::lock_all`]; with a deadline, `None` once it passed
    /// while waiting for a lock.
    fn lock_all_until(
        &self,
        indices: &mut Vec<usize>,
        deadline: Option<Instant>,
    ) -> Option<Vec<FaultGuard<'_>>> {
        for i in indices.iter_mut() {
            *i &= self.mask;
        }
        indices.sort_unstable();
        indices.dedup();
        loop {
            let mut held = Vec::with_capacity(indices.len());
            let mut stalled = None;
            for &i in indices.iter() {
                // A free lock is taken without reading the clock.
                if let Some(g) = self.try_lock_index(i) {
                    held.push(g);
                    continue;
                }
                let until = if held.is_empty() {
                    deadline
                } else {
                    let bound = Instant::now() + HOLDING_WAIT;
                    Some(deadline.map_or(bound, |d| d.min(bound)))
                };
                match self.lock_index_by(i, until) {
                    Some(g) => held.push(g),
                    None => {
                        stalled = Some(i);
                        break;
                    }
                }
            }
            let Some(i) = stalled else {
                return Some(held);
            };
            drop(held);
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            // Holding nothing: wait for the stalled lock alone, then again
            // from the lowest.
            drop(self.lock_index_by(i, deadline)?);
        }
    }

    /// Takes lock `index`, waiting until `deadline` (`None`: as long as
    /// it takes); `None` if it passed.
    fn lock_index_by(&self, index: usize, deadline: Option<Instant>) -> Option<FaultGuard<'_>> {
        match deadline {
            None => Some(self.lock_index(index)),
            Some(d) => self.lock_index_until(index, d),
        }
    }

    /// [`FaultLocks::lock`], giving up after `limit` (see
    /// [`FaultLocks::lock_all_within`]).
    pub fn lock_within(
        &self,
        domain: u64,
        page: u64,
        limit: std::time::Duration,
    ) -> Option<FaultGuard<'_>> {
        self.lock_index_until(self.index(domain, page), Instant::now() + limit)
    }

    /// A timed lock queues like any waiter (parking_lot hands the lock on
    /// fairly under contention), so only a holder that never lets go — not
    /// a busy table — makes it give up.
    fn lock_index_until(&self, index: usize, deadline: Instant) -> Option<FaultGuard<'_>> {
        let g = self.locks[index & self.mask].try_lock_until(deadline)?;
        Some(FaultGuard::new(g, &self.owners[index & self.mask]))
    }

    fn lock_index(&self, index: usize) -> FaultGuard<'_> {
        let m = &self.locks[index & self.mask];
        let g = match m.try_lock() {
            Some(g) => g,
            None => {
                let t = Instant::now();
                waited(m.lock(), t)
            }
        };
        FaultGuard::new(g, &self.owners[index & self.mask])
    }

    /// Takes the lock of `(domain, page)` if it is free right now.
    pub fn try_lock(&self, domain: u64, page: u64) -> Option<FaultGuard<'_>> {
        self.try_lock_index(self.index(domain, page))
    }

    /// Takes lock `index` if it is free right now.
    fn try_lock_index(&self, index: usize) -> Option<FaultGuard<'_>> {
        let i = index & self.mask;
        let g = self.locks[i].try_lock()?;
        Some(FaultGuard::new(g, &self.owners[i]))
    }

    /// Takes lock `index`, waiting in steps of `step`; after each step in
    /// which it stayed held, gives up (`None`) if `give_up(owner)` says so.
    /// Counts the acquisition and any wait.
    pub fn lock_index_unless(
        &self,
        index: usize,
        step: std::time::Duration,
        give_up: impl Fn(u32) -> bool,
    ) -> Option<FaultGuard<'_>> {
        let i = index & self.mask;
        if let Some(g) = self.locks[i].try_lock() {
            return Some(FaultGuard::new(g, &self.owners[i]));
        }
        let t = Instant::now();
        loop {
            if let Some(g) = self.locks[i].try_lock_for(step) {
                return Some(FaultGuard::new(waited(g, t), &self.owners[i]));
            }
            if give_up(self.owner(i)) {
                return None;
            }
        }
    }

    /// The thread holding lock `index` right now (0: none). Exact only for
    /// a lock held by a thread that is stopped (in a fault being served).
    pub fn owner(&self, index: usize) -> u32 {
        self.owners[index & self.mask].load(Ordering::Relaxed)
    }

    /// The counters of every lock, summed.
    pub fn stat(&self) -> LockStat {
        self.locks.iter().fold(LockStat::default(), |acc, l| {
            let s = *l.lock();
            LockStat {
                acquisitions: acc.acquisitions + s.acquisitions,
                contentions: acc.contentions + s.contentions,
                wait_ns: acc.wait_ns + s.wait_ns,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_has_one_lock() {
        let l = FaultLocks::new(LockMode::Global, 64);
        assert_eq!(l.locks.len(), 1);
        assert_eq!(l.index(3, 99), 0);
    }

    #[test]
    fn hashed_spreads_neighbours() {
        let l = FaultLocks::new(LockMode::Hashed, 16);
        assert_eq!(l.locks.len(), 16);
        let used: std::collections::HashSet<usize> = (0..64).map(|p| l.index(1, p)).collect();
        assert!(
            used.len() >= 12,
            "64 neighbouring pages hit only {} of 16 locks",
            used.len()
        );
    }

    #[test]
    fn lockstat_counts_waits() {
        let l = FaultLocks::new(LockMode::Global, 1);
        let g = l.lock(1, 1);
        std::thread::scope(|s| {
            s.spawn(|| drop(l.lock(2, 2)));
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(g);
        });
        let st = l.stat();
        assert_eq!(st.acquisitions, 2);
        assert_eq!(st.contentions, 1);
        assert!(st.wait_ns >= 10_000_000, "{st:?}");
    }

    /// A taker of several locks that finds one held waits for it holding
    /// none of the others: a thread holding that one (a fault waiting for a
    /// frame) can still take the pages under the rest.
    #[test]
    fn lock_all_waits_holding_nothing() {
        let l = FaultLocks::new(LockMode::Hashed, 8);
        let held = l.lock_index(5);
        std::thread::scope(|s| {
            let taker = s.spawn(|| l.lock_all(&mut vec![5, 1, 3, 1]).len());
            // The taker takes 1 and 3, waits 10 ms for 5, lets go and
            // waits for 5 alone: locks 1 and 3 are free again within a
            // second (waiting while holding them, it would keep them until
            // 5 is let go).
            let deadline = Instant::now() + std::time::Duration::from_secs(1);
            let mut took_one = false;
            while !took_one && Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
                took_one = l.try_lock_index(1).is_some() && l.try_lock_index(3).is_some();
            }
            assert!(
                took_one,
                "lock_all held locks 1 and 3 while it waited for 5"
            );
            drop(held);
            assert_eq!(taker.join().expect("taker"), 3, "1, 3 and 5, once each");
        });
        for i in [1, 3, 5] {
            assert!(l.try_lock_index(i).is_some(), "lock {i} let go");
        }
    }

    /// A timed taker gives up at its deadline, holding nothing.
    #[test]
    fn lock_all_within_gives_up_holding_nothing() {
        let l = FaultLocks::new(LockMode::Hashed, 8);
        let held = l.lock_index(6);
        let t = Instant::now();
        let all = l.lock_all_within(&mut vec![2, 6], std::time::Duration::from_millis(30));
        assert!(all.is_none(), "took lock 6 while it was held");
        assert!(t.elapsed() >= std::time::Duration::from_millis(30));
        assert!(l.try_lock_index(2).is_some(), "lock 2 let go");
        drop(held);
        let all = l.lock_all_within(&mut vec![2, 6], std::time::Duration::from_millis(30));
        assert_eq!(all.map(|g| g.len()), Some(2));
    }

    /// Takers of overlapping sets and of single locks, all at once: never
    /// two holders of one lock, and every taker gets through.
    #[test]
    fn lock_all_excludes_and_ends() {
        let l = FaultLocks::new(LockMode::Hashed, 8);
        let inside: Vec<AtomicU32> = (0..8).map(|_| AtomicU32::new(0)).collect();
        let enter = |set: &[usize]| {
            for &i in set {
                assert_eq!(
                    inside[i].fetch_add(1, Ordering::Relaxed),
                    0,
                    "lock {i} twice"
                );
            }
            std::thread::yield_now();
            for &i in set {
                inside[i].fetch_sub(1, Ordering::Relaxed);
            }
        };
        std::thread::scope(|s| {
            for t in 0..4usize {
                let (l, enter) = (&l, &enter);
                s.spawn(move || {
                    for n in 0..500usize {
                        let mut set: Vec<usize> =
                            (0..3).map(|k| (t * 3 + n * 5 + k * 7) % 8).collect();
                        let guards = l.lock_all(&mut set);
                        assert_eq!(guards.len(), set.len());
                        enter(&set);
                    }
                });
            }
            let (l, enter) = (&l, &enter);
            s.spawn(move || {
                for n in 0..2_000usize {
                    let _g = l.lock_index(n % 8);
                    enter(&[n % 8]);
                }
            });
        });
    }

    /// The whole table (as teardown takes it) while threads keep taking
    /// and letting go of single locks, each held a while: never all free
    /// at one instant, yet the taker gets through, and soon.
    #[test]
    fn lock_all_of_the_whole_table_gets_through_busy_faults() {
        let l = FaultLocks::new(LockMode::Hashed, 64);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let taken = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..6usize {
                let (l, stop, taken) = (&l, &stop, &taken);
                s.spawn(move || {
                    let mut n = t * 11;
                    while !stop.load(Ordering::Relaxed) {
                        let _g = l.lock_index(n % 64);
                        taken.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        n += 7;
                    }
                });
            }
            // Every thread holding a lock nearly all the time.
            while taken.load(Ordering::Relaxed) < 60 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            for _ in 0..5 {
                let t = Instant::now();
                let all =
                    l.lock_all_within(&mut (0..64).collect(), std::time::Duration::from_secs(5));
                let got = all.map(|g| g.len());
                assert_eq!(got, Some(64), "the whole table within 5 s");
                assert!(
                    t.elapsed() < std::time::Duration::from_secs(2),
                    "{:?}",
                    t.elapsed()
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}
