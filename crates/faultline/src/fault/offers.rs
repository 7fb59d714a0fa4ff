//! The queue of read-ahead windows offered to the workers: a fault that
//! continues a sequential stream offers the window after its run
//! ([`offer`]), and an idle worker takes one ([`next`]) to map it ahead of
//! the program (`ahead.rs`). Bounded ([`QUEUE`]): an offer to a full queue
//! is dropped. Locks: the queue's mutex (a leaf).

use crate::core::{Ahead, Core};
use crate::region::RegionInner;

/// Windows waiting for a worker, at most.
const QUEUE: usize = 16;

/// Offers the window from `page` of `region` to the workers; `dirties`:
/// the offering fault was a write (`Fault::dirties`).
pub(super) fn offer(core: &Core, region: &RegionInner, page: usize, dirties: bool) {
    {
        let mut q = core.ahead.lock();
        if q.len() >= QUEUE {
            return;
        }
        q.push_back(Ahead {
            addr: region.page_addr(page),
            region: region.id,
            dirties,
        });
    }
    // Best effort: a worker that is not woken finds it at its next turn.
    let _ = core.deferred_fd.signal();
}

/// Takes one offered window, if any.
pub(super) fn next(core: &Core) -> Option<Ahead> {
    core.ahead.lock().pop_front()
}
