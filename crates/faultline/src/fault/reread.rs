//! Clearing the poison markers of pages whose fault could not be served,
//! once their back-off is over (`crate::rereads` keeps the queue): without
//! it, a poisoned page answered every later access with SIGBUS in the
//! kernel, and a program that retried the access never reached the store
//! again, even once the store was fine. Workers clear due markers between
//! events, timing their wait by the earliest one.
//!
//! Invariant: a marker is cleared only under its page's lock and only while
//! the page is still `Poisoned`; the page is then absent, and its next
//! access is served like a first touch — filled only by a store read that
//! succeeds. Locks: the queue's mutex (leaf), then one page's fault lock.

use crate::core::Core;
use crate::error::FaultError;
use crate::region::PageState;
use std::time::{Duration, Instant};

/// How long a worker waits for a page's lock before queuing it again.
const LOCK_WAIT: Duration = Duration::from_millis(10);

/// Clears one due marker, if any. Returns whether there was one.
pub(super) fn retry(core: &Core) -> bool {
    let Some((id, page)) = core.rereads.take_due() else {
        return false;
    };
    let snap = core.table.snapshot();
    let Some(r) = snap.iter().find(|r| r.id == id) else {
        return true;
    };
    if r.dying() || page >= r.pages() || r.state(page) != PageState::Poisoned {
        return true;
    }
    let (domain, key) = r.lock_key(page);
    let Some(_guard) = core.locks.lock_within(domain, key, LOCK_WAIT) else {
        core.rereads.later(id, page, LOCK_WAIT);
        return true;
    };
    if r.state(page) == PageState::Poisoned {
        if let Err(source) = super::resolve::clear_poison(core, r, page) {
            let addr = r.page_addr(page);
            core.record(FaultError::Move { addr, source });
        }
    }
    true
}

/// The `epoll_wait` timeout (ms) until the earliest marker is due: -1 when
/// none is queued.
pub(super) fn wait_ms(core: &Core) -> i32 {
    match core.rereads.next_due() {
        None => -1,
        Some(t) => {
            let left = t.saturating_duration_since(Instant::now());
            // Rounded up, so the wake finds it due.
            let ms = left.as_micros().div_ceil(1000);
            i32::try_from(ms).unwrap_or(i32::MAX)
        }
    }
}
