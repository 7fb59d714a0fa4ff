//! Lock and atomic facade, so the lock-free and per-CPU pieces can be model
//! checked with loom (`RUSTFLAGS="--cfg loom" cargo test --lib loom`), as
//! crossbeam does. In normal builds these are `parking_lot` and `std` types.

#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex;

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
}

#[cfg(loom)]
pub(crate) use loom_mutex::Mutex;
