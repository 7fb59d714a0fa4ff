//! Fault locks: serialize the resolution of one page (seed 003).
//!
//! A table of `n` cache-line-padded mutexes, `n` a power of two (by default
//! the next power of two of `2 x workers`, at least 64); the page with key `(domain, page)`
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
//! change only under its lock. Nothing that can fault on a managed region runs
//! under a fault lock — workers never touch region memory, and a worker that
//! faults is reported (see `fault::service`) — so holding one can never wait
//! on another fault. Locks are leaves: while one is held only the allocator's
//! locks, the pool's split lock and the stats histogram lock are taken, and
//! they are leaves too — with two exceptions that cannot wait in a cycle:
//! read-ahead only *tries* further fault locks, and migration takes several
//! with [`FaultLocks::lock_all`], always in ascending index order, while
//! holding none.

use crate::config::LockMode;
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
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

/// A held fault lock.
pub type FaultGuard<'a> = MutexGuard<'a, LockStat>;

/// The table. See the module docs.
#[derive(Debug)]
pub struct FaultLocks {
    locks: Box<[CachePadded<Mutex<LockStat>>]>,
    mask: usize,
    mode: LockMode,
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
            mask: n - 1,
            mode,
        }
    }

    /// The discipline in force.
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// Number of locks.
    pub fn len(&self) -> usize {
        self.locks.len()
    }

    /// Always false: there is at least one lock.
    pub fn is_empty(&self) -> bool {
        false
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

    /// Takes every lock in `indices` (sorted and deduplicated first, so that
    /// takers of several locks all go in ascending order and cannot
    /// deadlock). For migration, which holds a whole 2 MiB block's pages.
    pub fn lock_all(&self, indices: &mut Vec<usize>) -> Vec<FaultGuard<'_>> {
        indices.sort_unstable();
        indices.dedup();
        indices.iter().map(|&i| self.lock_index(i)).collect()
    }

    /// [`FaultLocks::lock_all`], giving up after `limit`: `None` if some
    /// lock stayed held that long (by a worker inside a store call that does
    /// not return). For teardown, which must not hang.
    pub fn lock_all_within(
        &self,
        indices: &mut Vec<usize>,
        limit: std::time::Duration,
    ) -> Option<Vec<FaultGuard<'_>>> {
        indices.sort_unstable();
        indices.dedup();
        let deadline = Instant::now() + limit;
        indices
            .iter()
            .map(|&i| self.lock_index_until(i, deadline))
            .collect()
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
        let mut g = self.locks[index & self.mask].try_lock_until(deadline)?;
        g.acquisitions += 1;
        Some(g)
    }

    fn lock_index(&self, index: usize) -> FaultGuard<'_> {
        let m = &self.locks[index & self.mask];
        let mut g = match m.try_lock() {
            Some(g) => g,
            None => {
                let t = Instant::now();
                let mut g = m.lock();
                g.contentions += 1;
                g.wait_ns += t.elapsed().as_nanos() as u64;
                g
            }
        };
        g.acquisitions += 1;
        g
    }

    /// Takes the lock of `(domain, page)` if it is free right now.
    pub fn try_lock(&self, domain: u64, page: u64) -> Option<FaultGuard<'_>> {
        let mut g = self.locks[self.index(domain, page)].try_lock()?;
        g.acquisitions += 1;
        Some(g)
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
        assert_eq!(l.len(), 1);
        assert_eq!(l.index(3, 99), 0);
    }

    #[test]
    fn hashed_spreads_neighbours() {
        let l = FaultLocks::new(LockMode::Hashed, 16);
        assert_eq!(l.len(), 16);
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
}
