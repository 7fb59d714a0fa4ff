//! Pages whose fault could not be served, waiting for another try. A
//! poisoned page's marker (`UFFDIO_POISON`) answers every later access
//! with SIGBUS in the kernel, without a fault faultline could see, so a
//! program that retries the access would never reach the store again. Each
//! poisoning is queued here with a back-off; when it is due, a worker
//! clears the marker (`fault/reread.rs`) and the next access faults again
//! and reads the store afresh — filling the page only from a read that
//! succeeds, or poisoning it again with a longer back-off.
//!
//! Invariants: the back-off of a page's n-th failure in a row is
//! [`FIRST`] x 2^(n-1), at most [`MAX`]; a page whose last failure is
//! [`FORGET`] old starts again from [`FIRST`]. The count map holds pages
//! that failed within [`FORGET`] (pruned as it grows). Locks: the queue's
//! mutex, a leaf.

use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The back-off after a page's first failure.
pub(crate) const FIRST: Duration = Duration::from_millis(50);
/// The longest back-off: a store that comes back is tried within it.
pub(crate) const MAX: Duration = Duration::from_secs(5);
/// A page that has not failed for this long starts again from [`FIRST`].
const FORGET: Duration = Duration::from_secs(60);
/// Pages whose counts are kept before a prune is considered.
const PRUNE_AT: usize = 4096;

/// A region id and a page index in it.
type Key = (u64, usize);

#[derive(Debug, Default)]
struct Inner {
    /// Markers to clear, earliest first.
    due: BinaryHeap<Reverse<(Instant, Key)>>,
    /// Failures in a row of each page, and when the last one was.
    fails: HashMap<Key, (u32, Instant)>,
    last_prune: Option<Instant>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Rereads {
    inner: Mutex<Inner>,
    /// `due.len()`, for the workers' check without the lock.
    count: AtomicUsize,
}

/// The back-off after `fails` failures in a row.
pub(crate) fn backoff(fails: u32) -> Duration {
    let doubled = FIRST.saturating_mul(1u32 << fails.saturating_sub(1).min(16));
    doubled.min(MAX)
}

impl Rereads {
    /// Notes that `page` of region `region` was poisoned: its marker is
    /// cleared after the returned back-off.
    pub(crate) fn failed(&self, region: u64, page: usize) -> Duration {
        let now = Instant::now();
        let mut g = self.inner.lock();
        if g.fails.len() >= PRUNE_AT
            && g.last_prune
                .is_none_or(|t| now - t > Duration::from_secs(1))
        {
            g.fails
                .retain(|_, (_, last)| now.duration_since(*last) < FORGET);
            g.last_prune = Some(now);
        }
        let e = g.fails.entry((region, page)).or_insert((0, now));
        if now.duration_since(e.1) >= FORGET {
            e.0 = 0;
        }
        e.0 = e.0.saturating_add(1);
        e.1 = now;
        let wait = backoff(e.0);
        g.due.push(Reverse((now + wait, (region, page))));
        // Relaxed: a hint; the mutex orders the queue itself.
        self.count.store(g.due.len(), Ordering::Relaxed);
        wait
    }

    /// Queues `page` of `region` again in `wait` (its lock was busy),
    /// without counting a failure.
    pub(crate) fn later(&self, region: u64, page: usize, wait: Duration) {
        let mut g = self.inner.lock();
        g.due.push(Reverse((Instant::now() + wait, (region, page))));
        self.count.store(g.due.len(), Ordering::Relaxed);
    }

    /// When the earliest marker is due, if any is queued.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.inner.lock().due.peek().map(|Reverse((t, _))| *t)
    }

    /// A page whose marker is due, taken off the queue.
    pub(crate) fn take_due(&self) -> Option<(u64, usize)> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut g = self.inner.lock();
        let Reverse((t, _)) = g.due.peek()?;
        if *t > Instant::now() {
            return None;
        }
        let Reverse((_, key)) = g.due.pop()?;
        self.count.store(g.due.len(), Ordering::Relaxed);
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_up_to_its_bound() {
        assert_eq!(backoff(1), FIRST);
        assert_eq!(backoff(2), FIRST * 2);
        assert_eq!(backoff(4), FIRST * 8);
        assert_eq!(backoff(40), MAX);
    }

    #[test]
    fn a_failure_is_due_after_its_back_off_and_counts_in_a_row() {
        let q = Rereads::default();
        assert_eq!(q.failed(1, 7), FIRST);
        assert!(q.take_due().is_none(), "not due yet");
        assert!(q.next_due().is_some());
        std::thread::sleep(FIRST);
        assert_eq!(q.take_due(), Some((1, 7)));
        assert!(q.take_due().is_none() && q.next_due().is_none());
        assert_eq!(q.failed(1, 7), FIRST * 2, "a second failure in a row");
        assert_eq!(q.failed(2, 7), FIRST, "another page counts alone");
    }
}
