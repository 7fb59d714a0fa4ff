//! Fault locks: serialize the resolution of one page.
//!
//! A table of `n` cache-line-padded mutexes (`n` a power of two); page `p` of
//! region `r` uses lock `hash(r, p) & (n - 1)`. With [`LockMode::Global`]
//! (the pre-seed baseline of seed 003) `n = 1`: every fault takes one lock.
//!
//! Invariant: a page's state (absent / resident / poisoned) and its mapping
//! change only under its lock. Nothing that can fault on a managed region runs
//! under a fault lock — workers never touch region memory — so holding one
//! can never wait on another fault. Locks are leaves: no other faultline lock
//! is taken while one is held except the allocator's zone lock and the
//! stats histogram lock, which are themselves leaves.

use crate::config::LockMode;
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

/// The table. See the module docs.
#[derive(Debug)]
pub struct FaultLocks {
    locks: Box<[CachePadded<Mutex<()>>]>,
    mask: usize,
}

impl FaultLocks {
    /// A table for `mode`; `count` (a power of two) is used for `Hashed`.
    pub fn new(mode: LockMode, count: usize) -> FaultLocks {
        let n = match mode {
            LockMode::Global => 1,
            LockMode::Hashed => count.next_power_of_two().max(1),
        };
        FaultLocks {
            locks: (0..n).map(|_| CachePadded::new(Mutex::new(()))).collect(),
            mask: n - 1,
        }
    }

    /// Number of locks.
    pub fn len(&self) -> usize {
        self.locks.len()
    }

    /// Always false: there is at least one lock.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Index of the lock of page `page` of region `region`.
    pub fn index(&self, region: u64, page: u64) -> usize {
        // A multiplicative hash (Fibonacci hashing) of both keys, so that
        // neighbouring pages of one region land on different locks.
        let h =
            (region.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ page).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        (h >> 32) as usize & self.mask
    }

    /// Takes the lock of `(region, page)`.
    pub fn lock(&self, region: u64, page: u64) -> MutexGuard<'_, ()> {
        self.locks[self.index(region, page)].lock()
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
}
