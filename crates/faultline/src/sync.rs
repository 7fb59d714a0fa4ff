//! Lock facade, so the per-CPU pieces can be model checked with loom
//! (`RUSTFLAGS="--cfg loom" cargo test --release -p faultline --lib loom`), as
//! crossbeam does. In normal builds [`Mutex`] is `parking_lot`'s and
//! [`SpinLock`] is the small test-and-set lock below; under loom both are
//! loom's mutex.
//!
//! `SpinLock` exists because a lock that is almost never contended should
//! cost one atomic read-modify-write, not two: on this VM an atomic RMW costs
//! 8.4 ns and `parking_lot`'s lock + unlock 20.8 ns (its unlock is a CAS that
//! checks for parked waiters), which alone would put a per-CPU allocation
//! plus free above the 40 ns goal of seed 004. Acquire is a `swap` (Acquire),
//! release a plain `store` (Release, pairs with the next holder's swap).
//! Contention (a thread that migrated between reading its CPU number and
//! locking) spins briefly, then yields.

#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex;

#[cfg(not(loom))]
pub(crate) use spin::SpinLock;

#[cfg(not(loom))]
mod spin {
    use std::cell::UnsafeCell;
    use std::ops::{Deref, DerefMut};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A test-and-set lock for data that is almost never contended.
    #[derive(Debug, Default)]
    pub(crate) struct SpinLock<T> {
        locked: AtomicBool,
        value: UnsafeCell<T>,
    }

    // SAFETY: the lock hands out `&mut T` to one holder at a time, so sharing
    // the lock between threads is as safe as sending `T` between them.
    unsafe impl<T: Send> Sync for SpinLock<T> {}
    // SAFETY: owning the lock is owning the `T`.
    unsafe impl<T: Send> Send for SpinLock<T> {}

    /// Holding the lock; releases it on drop.
    pub(crate) struct SpinGuard<'a, T> {
        lock: &'a SpinLock<T>,
    }

    impl<T> SpinLock<T> {
        pub(crate) fn new(value: T) -> Self {
            SpinLock {
                locked: AtomicBool::new(false),
                value: UnsafeCell::new(value),
            }
        }

        #[inline]
        pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
            let mut spins = 0u32;
            // Acquire pairs with the Release store in `SpinGuard::drop`.
            while self.locked.swap(true, Ordering::Acquire) {
                while self.locked.load(Ordering::Relaxed) {
                    super::backoff(&mut spins);
                }
            }
            SpinGuard { lock: self }
        }
    }

    impl<T> Deref for SpinGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: the guard exists only while `locked` is held by us, so
            // no other reference to the value exists.
            unsafe { &*self.lock.value.get() }
        }
    }

    impl<T> DerefMut for SpinGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: as in `deref`; `&mut self` makes this the only access.
            unsafe { &mut *self.lock.value.get() }
        }
    }

    impl<T> Drop for SpinGuard<'_, T> {
        fn drop(&mut self) {
            // Release pairs with the Acquire swap of the next holder.
            self.lock.locked.store(false, Ordering::Release);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn excludes() {
            let l = SpinLock::new(0u64);
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..100_000 {
                            *l.lock() += 1;
                        }
                    });
                }
            });
            assert_eq!(*l.lock(), 400_000);
        }
    }
}

#[cfg(loom)]
mod loom_mutex {
    /// A loom mutex with parking_lot's panic-free `lock()`.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);
    type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(v: T) -> Self {
            Mutex(loom::sync::Mutex::new(v))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // A poisoned loom mutex means a panicking model thread; the model
            // fails anyway, so take the guard.
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    pub(crate) type SpinLock<T> = Mutex<T>;
}

#[cfg(loom)]
pub(crate) use loom_mutex::{Mutex, SpinLock};

/// Atomics: loom's under `--cfg loom` (so the migration copy's claim
/// protocol and the page-state leaves are model checked), the standard
/// library's otherwise.
pub(crate) mod atomic {
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
}

/// One wait of a spin loop on a lock held elsewhere: the first 64 are
/// CPU spin hints, then each yields (the holder may have been preempted).
pub(crate) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        yield_now();
    }
}

/// Yields the thread (loom's yield under `--cfg loom`, so a model's spin
/// loop lets the others run).
pub(crate) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// Epoch-based reclamation: `crossbeam-epoch`'s pin and deferred free, or
/// under `--cfg loom` a shim with the same calls that never frees a retired
/// object (loom checks the protocol around it, not the collector).
#[cfg(not(loom))]
pub(crate) mod epoch {
    pub(crate) use crossbeam_epoch::pin;
}

#[cfg(loom)]
pub(crate) mod epoch {
    /// A pin (nothing to do: nothing is freed).
    pub(crate) struct Guard;

    pub(crate) fn pin() -> Guard {
        Guard
    }

    impl Guard {
        /// # Safety
        /// As crossbeam's; here `f` never runs (the object is leaked).
        pub(crate) unsafe fn defer_unchecked<F: FnOnce()>(&self, f: F) {
            drop(f);
        }
    }
}
