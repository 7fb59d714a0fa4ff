//! Read-ahead mapped ahead of a sequential stream: a fault that continues a
//! stream of a store-backed 4 KiB region offers the window after its own
//! run (`offers.rs`); an idle worker reads that window and moves it in
//! ([`serve`]) before the program gets there, so a sequential reader faults
//! once per two windows and its next window is read while it works through
//! the current one.
//!
//! Speculative: a window is served only while more than a sixteenth of the
//! pool is free, and it never poisons a page, never reclaims for
//! its frames (a run from what is free now, or nothing), never offers a
//! window of its own (no chain to the end of the file), and skips a page
//! that is not absent or whose lock a thread stopped in a store call
//! holds. Locks: the page's fault lock (waited for).

use super::resolve::resolve;
use super::{lock_unless_lent, Fault};
use crate::core::{Ahead, Core};
use crate::frame::FrameAllocator;
use crate::region::PageState;

/// Reads and maps offered window `a` (see the module doc). `worker` is the
/// serving worker's index.
pub(super) fn serve(core: &Core, worker: usize, a: Ahead) {
    // Pages mapped ahead of use must not starve pages that are asked for:
    // only while more than a sixteenth of the pool is free (about the
    // background reclaimer's low watermark, which keeps it so).
    if core.alloc.free_hint() <= core.alloc.pages_in(0) / 16 {
        return;
    }
    let Some(region) = core.table.lookup(a.addr) else {
        return;
    };
    if region.id != a.region || region.dying() {
        return;
    }
    let page = region.page_of(a.addr);
    let (domain, key) = region.lock_key(page);
    // The offering fault may still hold this lock (a file region's lock
    // covers a whole read-ahead window): wait for it, unless its holder
    // is a thread stopped in a store call.
    let idx = core.locks.index(domain, key);
    let Some(guard) = lock_unless_lent(core, idx) else {
        return;
    };
    if region.state(page) != PageState::Absent {
        return;
    }
    let _busy = (worker < core.config.workers).then(|| core.nesting.enter_busy());
    let _serving = core.nesting.enter_serving();
    let how = Fault {
        ahead: true,
        dirties: a.dirties,
        ..Fault::at(a.addr)
    };
    let _ = resolve(core, &region, page, &how);
    drop(guard);
}
