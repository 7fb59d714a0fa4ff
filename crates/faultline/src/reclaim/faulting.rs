//! Reclaim for a fault that finds no free frame ([`alloc`]): the
//! pre-zeroed reserve and idle memory first, then synchronous clock passes,
//! then a bounded wait, then frames withheld for faultline's own memory —
//! refused (SIGBUS, cause queued) only when nothing can free a frame: no
//! reclaimable page holds one, no other store-backed fault or reclaim pass
//! is in flight, or no fault at all was served for [`WAIT_STUCK`].
//!
//! Locks: those of [`super::reclaim`] (fault locks by `try_lock`); the
//! caller holds its own page's fault lock (`held`).

use super::{reclaim, reclaimable, worth_walking};
use crate::budget;
use crate::core::Core;
use crate::frame::{Frame, FrameAllocator};
use crate::stats::Stats;
use std::sync::atomic::Ordering;

/// Allocates a frame of `order`; if none is free, gives the pre-zeroed
/// reserve back to the allocator (its frames stay marked zero), then
/// reclaims synchronously, trying again after each step; last, takes
/// frames withheld to pay for faultline's own memory
/// ([`crate::overhead::borrow`]). `held` is the index of the fault lock
/// the caller holds, if any.
pub(crate) fn alloc(core: &Core, order: u8, held: Option<usize>) -> Option<Frame> {
    alloc_within(core, order, held).or_else(|| crate::overhead::borrow(core, order))
}

/// [`alloc`] within the frames of the budget.
fn alloc_within(core: &Core, order: u8, held: Option<usize>) -> Option<Frame> {
    if let Some(f) = core.alloc.alloc(order) {
        return Some(f);
    }
    if core.drain_reserve() > 0 {
        if let Some(f) = core.alloc.alloc(order) {
            return Some(f);
        }
    }
    // Memory given back to the kernel while idle: take it back first.
    if let Some(f) = budget::alloc_in(core, 0, order) {
        return Some(f);
    }
    // The zeroing worker may hold the last free frame while it clears it (a
    // budget exactly the size of what is touched): wait for it to publish.
    if core.await_zeroing() && core.drain_reserve() > 0 {
        if let Some(f) = core.alloc.alloc(order) {
            return Some(f);
        }
    }
    if !core.config.reclaim {
        return None;
    }
    // Each pass parks what it passes and evicts what it parked on the
    // previous one, so a few passes free memory even when every page is
    // resident.
    let want = (1usize << order).max(core.config.experiment.pcp_batch);
    for _ in 0..4 {
        let freed = reclaim(core, want, held, || false);
        if let Some(f) = take_freed(core, order) {
            return Some(f);
        }
        if freed == 0 && nothing_to_wait_for(core) {
            // A pass that ended meanwhile may have freed a frame.
            return take_freed(core, order);
        }
    }
    // Still nothing: the reclaimable pages may be under fault locks other
    // workers hold for a moment (with a budget of a few frames, two
    // concurrent faults can hold every one), or the frames just freed
    // went to other faults (with a budget of one frame and many threads
    // faulting, they take turns). Wait rather than fail the fault: while
    // other faults are being served the wait goes on (up to
    // `WAIT_SERVED`); after `WAIT_STUCK` without any, the fault is
    // refused (SIGBUS, cause queued). Moves being retried count as
    // progress ([`progress_made`]), and store calls too
    // (in flight, or ended either way): a slow store, or one failing
    // while a server restarts or fails over, keeps write-backs and fills
    // going, and the fault waits for them up to `WAIT_SERVED`.
    let start = std::time::Instant::now();
    let (mut seen, mut since) = (progress_made(core) + core.nesting.store_calls().1, start);
    while since.elapsed() < WAIT_STUCK
        && start.elapsed() < WAIT_SERVED
        && !nothing_to_wait_for(core)
    {
        std::thread::sleep(std::time::Duration::from_micros(200));
        reclaim(core, want, held, || false);
        if let Some(f) = take_freed(core, order) {
            Stats::bump(&core.stats.reclaim_waits);
            return Some(f);
        }
        let (in_flight, ended) = core.nesting.store_calls();
        let now = progress_made(core) + ended;
        if now != seen || in_flight > 0 {
            (seen, since) = (now, std::time::Instant::now());
        }
    }
    take_freed(core, order)
}

/// How long a fault waits for a frame while no other fault is served.
const WAIT_STUCK: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a fault waits for a frame while others are served.
const WAIT_SERVED: std::time::Duration = std::time::Duration::from_secs(60);

/// Progress that may free a frame: faults served, and rounds of moves the
/// kernel refuses for a moment (a fault retrying its move holds its frame
/// for up to a few move deadlines: with a budget of one frame, the one the
/// waiting fault will get next).
fn progress_made(core: &Core) -> u64 {
    core.stats.faults_4k.load(Ordering::Relaxed)
        + core.stats.faults_2m.load(Ordering::Relaxed)
        + core.stats.move_retries.load(Ordering::Relaxed)
}

/// A frame of `order` after a reclaim pass. The zeroing worker may have
/// taken the frame just freed to clear it (with a budget of one frame, the
/// only one): wait for it to publish, and take the reserve back.
fn take_freed(core: &Core, order: u8) -> Option<Frame> {
    if let Some(f) = core.alloc.alloc(order) {
        return Some(f);
    }
    core.await_zeroing();
    if core.drain_reserve() > 0 {
        return core.alloc.alloc(order);
    }
    None
}

/// Whether no frame can come: no region may be reclaimed at all, or none
/// holds a frame reclaim could take while no other store-backed fault is in
/// flight (one may be about to record a page reclaim can then take; the
/// standby's count too). An
/// unservable fault is then refused at once (SIGBUS, cause queued), not
/// after the wait.
///
/// A reclaim pass running elsewhere (the background reclaimer, or another
/// fault's) is something to wait for: it may hold the last frame between
/// taking a page out of its region and freeing it (with a budget of one
/// frame, it always does). Acquire pairs with the Release decrement in
/// [`Passing::drop`], made after the pass freed its frames.
fn nothing_to_wait_for(core: &Core) -> bool {
    if core.reclaiming.load(Ordering::Acquire) > 0 {
        return false;
    }
    let regions = core.table.snapshot();
    !regions.iter().any(|r| reclaimable(r))
        || (!regions.iter().any(|r| worth_walking(r)) && core.nesting.serving() <= 1)
}
