//! Second looks of the program's removals (`fault/program_drop.rs`): pages of a
//! region that the handler of a `MADV_DONTNEED` found still mapped (the
//! kernel zaps after the event is read, and with `MADV_FREE` not at all),
//! to be looked at again until a deadline; and, where no removal is heard,
//! when the next sweep for unheard drops may run ([`Sweeps`],
//! `reclaim/unheard.rs`).
//!
//! Invariant: a look is queued at most until its deadline plus one turn of
//! a worker. Locks: the queue's mutex (a leaf); the sweeps' time is an
//! atomic (Relaxed: a hint that publishes no data).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The least time between two sweeps for unheard drops.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_millis(50);

/// When the next sweep for the program's unheard drops may start.
#[derive(Debug)]
pub(crate) struct Sweeps {
    epoch: Instant,
    /// Nanoseconds after `epoch` before which no sweep starts.
    next_ns: AtomicU64,
    /// Sweeps started so far.
    started: AtomicU64,
}

impl Default for Sweeps {
    fn default() -> Self {
        Sweeps {
            epoch: Instant::now(),
            next_ns: AtomicU64::new(0),
            started: AtomicU64::new(0),
        }
    }
}

impl Sweeps {
    /// Whether a sweep may start now; if so, it counts as started and the
    /// next may not start before [`SWEEP_EVERY`] has passed (of callers
    /// racing, one wins).
    pub(crate) fn claim(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let next = self.next_ns.load(Ordering::Relaxed);
        let won = now >= next
            && self
                .next_ns
                .compare_exchange(
                    next,
                    now + SWEEP_EVERY.as_nanos() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if won {
            self.started.fetch_add(1, Ordering::Relaxed);
        }
        won
    }

    /// Counts a sweep that starts whatever [`Sweeps::claim`] says (one a
    /// fault runs before it may be refused).
    pub(crate) fn start_anyway(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    /// Sweeps started so far: a caller that saw it change since it last
    /// looked knows a sweep ran in between.
    pub(crate) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }
}

/// Pages of one region to look at again, not before `next`, until `until`;
/// `[start, end)` is the removed range.
#[derive(Debug)]
pub(crate) struct Retry {
    pub(crate) region: u64,
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) pages: Vec<usize>,
    pub(crate) next: Instant,
    pub(crate) until: Instant,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct DropRechecks {
    queue: Mutex<Vec<Retry>>,
    /// `queue.len()`, for the workers' check without the lock.
    count: AtomicUsize,
}

impl DropRechecks {
    /// Queues a second look.
    pub(crate) fn push(&self, r: Retry) {
        let mut q = self.queue.lock();
        q.push(r);
        // Relaxed: a hint; the mutex orders the queue itself.
        self.count.store(q.len(), Ordering::Relaxed);
    }

    /// Whether second looks are queued (a hint, without the lock).
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// A queued look that is due, taken.
    pub(crate) fn due(&self) -> Option<Retry> {
        if !self.any() {
            return None;
        }
        let mut q = self.queue.lock();
        let now = Instant::now();
        let i = q.iter().position(|r| r.next <= now)?;
        let r = q.swap_remove(i);
        self.count.store(q.len(), Ordering::Relaxed);
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sweep_per_period() {
        let s = Sweeps::default();
        assert!(s.claim(), "the first sweep may run");
        assert!(!s.claim(), "not again within the period");
        assert_eq!(s.started(), 1, "a refused claim starts nothing");
        s.start_anyway();
        assert_eq!(s.started(), 2);
        std::thread::sleep(SWEEP_EVERY + Duration::from_millis(5));
        assert!(s.claim(), "again once the period has passed");
        assert_eq!(s.started(), 3);
    }

    #[test]
    fn a_look_is_taken_once_when_due() {
        let rs = DropRechecks::default();
        assert!(!rs.any() && rs.due().is_none());
        let now = Instant::now();
        let look = |next| Retry {
            region: 1,
            start: 0,
            end: 4096,
            pages: vec![0],
            next,
            until: now + Duration::from_secs(1),
        };
        rs.push(look(now + Duration::from_secs(60)));
        assert!(rs.any());
        assert!(rs.due().is_none(), "not due yet");
        rs.push(look(now));
        assert!(rs.due().is_some());
        assert!(rs.due().is_none(), "taken once");
        assert!(rs.any(), "the later one waits");
    }
}
