//! Waking the background reclaimer as free memory falls below its low
//! watermark (Linux wakes `kswapd` the same way), rather than at its next
//! tick: a sequential reader takes a tenth of the pool in a few
//! milliseconds, and read-ahead runs come only from what is free. Below
//! `core` in the layers: the core holds one, faults fire it, the
//! reclaimer (`reclaim::run`) sleeps on it.
//!
//! The reclaimer publishes its low watermark ([`Kick::set_low`]) and
//! *arms* the kick while its passes free memory; a fault that takes a
//! frame below the watermark fires it once ([`Kick::note_free`]). While
//! passes free nothing (nothing reclaimable: zero-filled regions, pinned
//! pages) it stays disarmed and the reclaimer keeps its backoff; it is
//! disarmed during a pass too, and a kicked pass starts no sooner after
//! the previous one ended than that one took (at least 1 ms), so faults
//! cannot make the reclaimer spin.
//!
//! Ordering: `low` and `armed` are hints, read and written Relaxed (a
//! stale value costs one early or one missed wake-up, and the reclaimer's
//! tick covers a missed one); the wake-up itself goes through the mutex.
//!
//! Locks: the kick's mutex (a leaf), held only to set or take the
//! `pending` flag and to wait on the condition variable.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Kick {
    /// The reclaimer's low watermark, in free pages.
    low: AtomicUsize,
    /// A fault may fire the kick.
    armed: AtomicBool,
    /// Fired and not yet taken by the reclaimer.
    pending: Mutex<bool>,
    cv: Condvar,
}

impl Kick {
    /// The reclaimer's low watermark is now `pages` free pages.
    pub(crate) fn set_low(&self, pages: usize) {
        self.low.store(pages, Ordering::Relaxed);
    }

    /// Lets (`true`) or stops (`false`) faults wake the reclaimer;
    /// stopping also drops a wake-up not yet taken (it would cut a
    /// backoff short).
    pub(crate) fn arm(&self, on: bool) {
        self.armed.store(on, Ordering::Relaxed);
        if !on {
            *self.pending.lock() = false;
        }
    }

    /// A fault took a frame and `free` pages are left: fires the kick
    /// when that is below the low watermark and the kick is armed. Two
    /// relaxed loads when it does not fire.
    pub(crate) fn note_free(&self, free: usize) {
        if free >= self.low.load(Ordering::Relaxed) || !self.armed.load(Ordering::Relaxed) {
            return;
        }
        // One fault fires it; the reclaimer re-arms after its pass.
        if self.armed.swap(false, Ordering::Relaxed) {
            self.wake();
        }
    }

    /// Wakes the reclaimer now (a fired kick, or shutdown: the flag it
    /// checks is set before this call).
    pub(crate) fn wake(&self) {
        *self.pending.lock() = true;
        self.cv.notify_all();
    }

    /// The reclaimer's sleep: up to `wait`, or until woken; `stopping`
    /// is checked under the lock, so a shutdown's wake is never lost.
    /// Returns whether it was woken (the flag is taken).
    pub(crate) fn sleep(&self, wait: Duration, stopping: impl Fn() -> bool) -> bool {
        let mut pending = self.pending.lock();
        if !*pending && !stopping() {
            let _ = self.cv.wait_for(&mut pending, wait);
        }
        std::mem::take(&mut *pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn fires_once_below_the_watermark_while_armed() {
        let k = Kick::default();
        k.set_low(100);
        k.arm(true);
        k.note_free(100);
        assert!(!*k.pending.lock(), "at the watermark: not below");
        k.note_free(99);
        assert!(*k.pending.lock(), "below while armed: fired");
        assert!(!k.armed.load(Ordering::Relaxed), "fired once, disarmed");
        assert!(k.sleep(Duration::from_secs(5), || false), "taken at once");
        k.note_free(0);
        assert!(!*k.pending.lock(), "disarmed: a fault cannot fire it");
    }

    #[test]
    fn a_wake_from_another_thread_ends_the_sleep() {
        let k = std::sync::Arc::new(Kick::default());
        k.set_low(10);
        k.arm(true);
        let t0 = Instant::now();
        let k2 = k.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            k2.note_free(3);
        });
        assert!(k.sleep(Duration::from_secs(10), || false));
        assert!(t0.elapsed() < Duration::from_secs(5));
        h.join().expect("waker");
    }

    #[test]
    fn an_unwoken_sleep_times_out() {
        let k = Kick::default();
        let t0 = Instant::now();
        assert!(!k.sleep(Duration::from_millis(10), || false));
        assert!(t0.elapsed() >= Duration::from_millis(10));
        assert!(!k.sleep(Duration::from_secs(10), || true), "stopping");
    }

    #[test]
    fn disarming_drops_a_wake_not_yet_taken() {
        let k = Kick::default();
        k.set_low(10);
        k.arm(true);
        k.note_free(0);
        k.arm(false);
        assert!(!k.sleep(Duration::from_millis(1), || false));
    }
}
