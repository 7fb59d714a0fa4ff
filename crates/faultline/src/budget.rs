//! The budget at run time: the balloon ([`crate::frame::Balloon`]) inflates
//! by taking free frames of pool 0 and giving their memory back to the
//! kernel, and deflates by refilling frames' holes with zero pages and
//! freeing them. Two uses:
//!
//! - `Manager::set_budget`: shrinking withholds frames (reclaim frees them
//!   first if none are free); growing makes withheld frames idle, and a
//!   fault that finds no free frame takes idle ones back before it reclaims
//!   (`reclaim::alloc`). The pool's room above the initial budget
//!   (`Config::budget_max`) starts out withheld, never populated.
//! - Idle memory: when free frames stay above the reclaim high watermark,
//!   the reclaimer gives the excess back ([`release_idle`]), so a program
//!   that shrinks (drops regions, discards pages) shrinks its RSS. Only
//!   whole free 2 MiB blocks go back this way. A shrinking budget also
//!   releases 4 KiB frames inside populated blocks; those are refilled with
//!   `UFFDIO_COPY`, never by a fault (`pagemove::fill_holes`).
//!
//! Migration and collapse into pool 0 take idle frames back too
//! ([`deflate`]) before they report the pool full.
//!
//! Part of the budget may pay for faultline's own memory instead of
//! frames (`crate::overhead`): [`user_budget_pages`] is the budget as set,
//! [`budget_pages`] the frames within it.
//!
//! Invariant: a frame is refilled (all its slots populated, zero) before it
//! is freed to the allocator. Locks: the balloon's ledger, held across each
//! inflate or deflate, with the allocator's locks taken under it (never the
//! other way round); no fault lock is taken here (a fault may hold its own
//! while it deflates).

use crate::core::Core;
use crate::error::FaultError;
use crate::frame::{Frame, FrameAllocator, Ledger, PoolId, HUGE_ORDER, PAGES_PER_HUGE};
use crate::pagemove;
use faultline_sys::SysError;
use std::sync::atomic::Ordering;

/// Pages of pool 0 within the budget now: frames faults can have.
pub(crate) fn budget_pages(core: &Core) -> usize {
    core.alloc.pages_in(0) - core.balloon.counts().1
}

/// The budget the user set, in pages: [`budget_pages`] plus the pages
/// withheld to pay for faultline's own memory.
pub(crate) fn user_budget_pages(core: &Core) -> usize {
    budget_pages(core) + core.overhead_withheld.load(Ordering::Relaxed)
}

/// Free pages of pool 0 faults can have: free in the allocator, plus idle
/// frames of the balloon (taken back on demand). A hint.
pub(crate) fn free_pages(core: &Core) -> usize {
    core.alloc.free_hint() + core.balloon.idle()
}

/// Gives the memory of up to `pages` free 4 KiB pages of pool 0 back to
/// the kernel, counted as `withheld` or idle: whole 2 MiB frames, and with
/// `small` 4 KiB frames for the rest (a shrinking budget needs the pages
/// wherever they are; idle memory goes back only as whole blocks, so that
/// taking it back can serve a 2 MiB fault). Returns the pages released.
/// Holds the ledger throughout (see `frame::balloon`).
pub(crate) fn inflate(core: &Core, pages: usize, withheld: bool, small: bool) -> usize {
    let mut ledger = core.balloon.ledger();
    let mut frames: Vec<Frame> = Vec::new();
    core.alloc
        .alloc_bulk(HUGE_ORDER, pages / PAGES_PER_HUGE, &mut frames);
    let got: usize = frames.iter().map(Frame::pages).sum();
    if small {
        core.alloc.alloc_bulk(0, pages - got, &mut frames);
    }
    // The pool's own userfaultfd asks for no events: a release raises no
    // removal event to tell apart from the program's.
    let (released, mut back) = each_frame(core, frames, |f| core.pool.release(f));
    // Not released: still populated, still free memory.
    core.alloc.free_bulk(&mut back);
    let n: usize = released.iter().map(Frame::pages).sum();
    core.stats.ballooned.fetch_add(n as u64, Ordering::Relaxed);
    ledger.put(released, withheld);
    n
}

/// Takes back idle frames worth at least `pages` pages: refills them and
/// frees them to pool 0. Returns the pages freed. Holds the ledger
/// throughout.
pub(crate) fn deflate(core: &Core, pages: usize) -> usize {
    let mut ledger = core.balloon.ledger();
    deflate_in(core, &mut ledger, pages)
}

/// [`deflate`] with the ledger held.
fn deflate_in(core: &Core, ledger: &mut Ledger<'_>, pages: usize) -> usize {
    let (mut refilled, keep) = each_frame(core, ledger.take_idle(pages), |f| {
        pagemove::fill_holes(core, core.pool.addr_of(f), f.bytes())?;
        core.pool.refilled(f);
        Ok(())
    });
    // A frame that could not be refilled stays in the balloon, idle.
    ledger.put(keep, false);
    let freed: usize = refilled.iter().map(Frame::pages).sum();
    core.alloc.free_bulk(&mut refilled);
    core.stats
        .unballooned
        .fetch_add(freed as u64, Ordering::Relaxed);
    freed
}

/// Runs `op` on each frame: returns the frames it did, and those it
/// failed on (each failure queued as an error at the frame's slot).
fn each_frame(
    core: &Core,
    frames: Vec<Frame>,
    op: impl Fn(&Frame) -> Result<(), SysError>,
) -> (Vec<Frame>, Vec<Frame>) {
    let (mut done, mut failed) = (Vec::with_capacity(frames.len()), Vec::new());
    for f in frames {
        match op(&f) {
            Ok(()) => done.push(f),
            Err(source) => {
                let addr = core.pool.addr_of(&f);
                core.record(FaultError::Move { addr, source });
                failed.push(f);
            }
        }
    }
    (done, failed)
}

/// Grows the budget by up to `pages`: withheld frames become the budget's,
/// populated now. Returns the pages it grew by.
pub(crate) fn grow(core: &Core, pages: usize) -> usize {
    let mut ledger = core.balloon.ledger();
    let n = ledger.unwithhold(pages);
    deflate_in(core, &mut ledger, n);
    n
}

/// Shrinks the budget by up to `pages` of the balloon's idle frames (no
/// memory moves). Returns the pages it shrank by.
pub(crate) fn withhold_idle(core: &Core, pages: usize) -> usize {
    core.balloon.ledger().withhold(pages)
}

/// A frame of `order` from pool `pool`; for pool 0, idle frames of the
/// balloon are taken back when no free one is left.
pub(crate) fn alloc_in(core: &Core, pool: PoolId, order: u8) -> Option<Frame> {
    core.alloc.alloc_in(pool, order).or_else(|| {
        let short = pool == 0 && core.balloon.idle() > 0;
        (short && deflate(core, 1 << order) > 0)
            .then(|| core.alloc.alloc_in(pool, order))
            .flatten()
    })
}

/// Up to `n` frames of `order` from pool `pool` into `out`; for pool 0,
/// idle frames of the balloon are taken back when free ones run short.
/// Returns how many.
pub(crate) fn alloc_bulk_in(
    core: &Core,
    pool: PoolId,
    order: u8,
    n: usize,
    out: &mut Vec<Frame>,
) -> usize {
    let got = core.alloc.alloc_bulk_in(pool, order, n, out);
    if got == n || pool != 0 || core.balloon.idle() == 0 {
        return got;
    }
    deflate(core, (n - got) << order);
    got + core.alloc.alloc_bulk_in(pool, order, n - got, out)
}

/// Gives free pages above `high` back to the kernel, as idle frames.
pub(crate) fn release_idle(core: &Core, high: usize) -> usize {
    let free = core.alloc.free_hint();
    if free <= high {
        return 0;
    }
    inflate(core, free - high, false, false)
}
