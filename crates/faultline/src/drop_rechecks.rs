//! Second looks of the program's removals (`fault/program_drop.rs`): pages of a
//! region that the handler of a `MADV_DONTNEED` found still mapped (the
//! kernel zaps after the event is read, and with `MADV_FREE` not at all),
//! to be looked at again until a deadline.
//!
//! Invariant: a look is queued at most until its deadline plus one turn of
//! a worker. Locks: the queue's mutex (a leaf).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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
    use std::time::Duration;

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
