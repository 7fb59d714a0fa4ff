//! The budget pays for faultline's own memory
//! (`Config::budget_counts_overhead`): the kernel's page tables for region
//! memory and the page-state leaves, which grow with the address space
//! touched rather than the data held (`region::OverheadSum`), are
//! matched by frames withheld through the balloon, so that frames plus
//! overhead stay within the budget the user set.
//!
//! - [`settle`] (the background reclaimer, at its checks) moves the
//!   withholding toward the cost, never waiting and never taking free
//!   memory below the reclaim low watermark; frames go back as idle ones.
//!   What it found no room for ([`owed`]) raises the reclaimer's
//!   watermarks until it is withheld.
//! - [`borrow`] (the last step of `reclaim::alloc`) gives withheld frames
//!   to a fault nothing else can serve: the budget is then exceeded by the
//!   overhead, as before it was counted, rather than a fault refused.
//! - [`within`] (`Manager::set_budget`) keeps the withholding within a new
//!   budget's quarter.
//!
//! Invariant: `Core::overhead_withheld` ≤ the ledger's withheld pages,
//! and changes only under `Core::budget_lock`. Locks: `budget_lock`, then
//! the balloon's ledger and the allocator's locks under it; a fault takes
//! it holding its own fault lock ([`borrow`]), so its holders never take a
//! fault lock, call a store or wait for a fault (an inflate's own
//! `MADV_DONTNEED` waits only for the pump, which takes no page lock).

use crate::budget::{self, alloc_in, inflate, withhold_idle};
use crate::core::Core;
use crate::frame::{Frame, PAGES_PER_HUGE};
use std::sync::atomic::Ordering;

/// 4 KiB frames a settling withholds at most when no whole 2 MiB block is
/// free (each is a `MADV_DONTNEED` and an event round trip).
const SMALL_PER_SETTLE: usize = 64;

/// Pages to withhold now: what the regions' page tables and page states
/// cost (their running sum, `Core::overhead_sum`: regions still alive,
/// whose mappings still stand, in or out of the table), counted in 2 MiB
/// frames rounded up once it reaches one (a small cost is left to the
/// process's slack rather than taking a frame of a small budget), at most
/// a quarter of the budget, rounded down.
fn target(core: &Core) -> usize {
    let bytes = core.overhead_sum.bytes();
    let huge = faultline_sys::HUGE_PAGE_SIZE;
    let blocks = if bytes < huge {
        0
    } else {
        bytes.div_ceil(huge)
    };
    blocks.min(cap(budget::user_budget_pages(core))) * PAGES_PER_HUGE
}

/// Pages the overhead costs beyond what is withheld for it (0 with
/// `Config::budget_counts_overhead` off): what [`settle`] will withhold
/// once free memory has room for it above the low watermark.
pub(crate) fn owed(core: &Core) -> usize {
    if !core.config.budget_counts_overhead {
        return 0;
    }
    // Relaxed: a hint for the reclaimer's watermarks.
    target(core).saturating_sub(core.overhead_withheld.load(Ordering::Relaxed))
}

/// The most a budget of `pages` withholds for overhead, in 2 MiB blocks.
fn cap(pages: usize) -> usize {
    pages / 4 / PAGES_PER_HUGE
}

/// Moves the pages withheld toward what the overhead costs now. When it
/// grew: idle frames, then whole free blocks, then up to
/// [`SMALL_PER_SETTLE`] 4 KiB frames — only from free memory above the low
/// watermark `low` (reclaim, whose watermarks follow the smaller budget,
/// frees more for the next call; memory that nothing can reclaim is left
/// to the faults that need it). When it fell by two 2 MiB frames or more
/// (regions dropped): the excess becomes idle, not refilled — faults take
/// it back on demand (refilled at once, it would add memory while a
/// dropped region still holds its page tables). Skipped while the budget
/// changes or a fault borrows.
pub(crate) fn settle(core: &Core, low: usize) {
    let withheld = &core.overhead_withheld;
    let Some(_changing) = core.budget_lock.try_lock() else {
        return;
    };
    let target = target(core);
    // Relaxed: changed only under `budget_lock`, held here.
    let held = withheld.load(Ordering::Relaxed);
    if target > held {
        let room = budget::free_pages(core).saturating_sub(low);
        let need = (target - held).min(room);
        let mut got = withhold_idle(core, need);
        if got < need {
            got += inflate(core, need - got, true, false);
        }
        if got < need {
            got += inflate(core, (need - got).min(SMALL_PER_SETTLE), true, true);
        }
        withheld.store(held + got, Ordering::Relaxed);
    } else if held >= target + 2 * PAGES_PER_HUGE {
        give_back(core, held, held - target);
    }
}

/// Makes `pages` of the `held` pages withheld for overhead idle (faults
/// take them back on demand); returns how many. Caller holds
/// `Core::budget_lock` and read `held` under it.
fn give_back(core: &Core, held: usize, pages: usize) -> usize {
    let n = core.balloon.ledger().unwithhold(pages);
    // Relaxed: changed only under `budget_lock`, which the caller holds.
    core.overhead_withheld.store(held - n, Ordering::Relaxed);
    n
}

/// A frame of `order` for a fault that found none by any other means (no
/// page can be reclaimed: zero-store or pinned pages hold the budget):
/// withheld frames give way, 2 MiB at a time, as idle frames, until one
/// serves it or none is left (other faults may take what one step freed).
/// The caller holds its fault lock (see the module's locks).
pub(crate) fn borrow(core: &Core, order: u8) -> Option<Frame> {
    let withheld = &core.overhead_withheld;
    // Relaxed: a hint — nothing withheld (or the switch off), no lock.
    if withheld.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let _changing = core.budget_lock.lock();
    loop {
        // Relaxed: changed only under `budget_lock`, held here.
        let held = withheld.load(Ordering::Relaxed);
        if held == 0 {
            return None;
        }
        let n = give_back(core, held, held.min(PAGES_PER_HUGE.max(1 << order)));
        if let Some(f) = alloc_in(core, 0, order) {
            return Some(f);
        }
        if n == 0 {
            return None;
        }
    }
}

/// Keeps the withholding within what a budget of `pages` allows (a
/// quarter): any above it becomes idle. Returns the pages still withheld.
/// Caller holds `Core::budget_lock`.
pub(crate) fn within(core: &Core, pages: usize) -> usize {
    let withheld = &core.overhead_withheld;
    // Relaxed: changed only under `budget_lock`, which the caller holds.
    let held = withheld.load(Ordering::Relaxed);
    let cap = cap(pages) * PAGES_PER_HUGE;
    if held > cap {
        give_back(core, held, held - cap);
    }
    withheld.load(Ordering::Relaxed)
}
