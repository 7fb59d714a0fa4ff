//! Reclaim for a fault that finds no free frame ([`alloc`]): the
//! pre-zeroed reserve and idle memory first, then synchronous clock passes
//! (and, after one that freed nothing, a sweep for zero-store pages the
//! program dropped unheard, unless one ran since the fault began looking:
//! `unheard.rs`),
//! then a bounded wait, then frames withheld for faultline's own memory —
//! refused (SIGBUS, cause queued, [`Shortage`] says which) only when
//! nothing can free a frame: no reclaimable page holds one, no other
//! store-backed fault or reclaim pass is in flight (seen so on both sides
//! of a failed take, and again after a pause: [`settle`]), or nothing made
//! progress for [`WAIT_STUCK`] (no fault served, page evicted, move retried
//! or store call made: [`progress_made`]).
//!
//! Locks: those of [`super::reclaim`] (fault locks by `try_lock`); the
//! caller holds its own page's fault lock (`held`).

use super::{reclaim, reclaimable, worth_walking};
use crate::budget;
use crate::core::Core;
use crate::frame::{Frame, FrameAllocator};
use crate::stats::Stats;
use std::sync::atomic::{fence, Ordering};

/// Allocates a frame of `order`; if none is free, gives the pre-zeroed
/// reserve back to the allocator (its frames stay marked zero), then
/// reclaims synchronously, trying again after each step; last, takes
/// frames withheld to pay for faultline's own memory
/// ([`crate::overhead::borrow`]). `held` is the index of the fault lock
/// the caller holds, if any.
pub(crate) fn alloc(core: &Core, order: u8, held: Option<usize>) -> Result<Frame, Shortage> {
    alloc_within(core, order, held).or_else(|why| crate::overhead::borrow(core, order).ok_or(why))
}

/// Why [`alloc`] found no frame (the cause a refused fault's error names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shortage {
    /// No frame is free and reclaim is off (`Config::reclaim`).
    ReclaimOff,
    /// No page reclaim can take holds a frame, and nothing in flight may
    /// free one ([`nothing_to_wait_for`]).
    Unreclaimable,
    /// No frame was freed, and no other fault served, for [`WAIT_STUCK`].
    Stuck,
    /// No frame came in [`WAIT_SERVED`] of waiting while others were served.
    Starved,
    /// A window read ahead, which takes only frames free now
    /// (`fault::unit::take`): never a program's fault.
    NotAsked,
}

impl Shortage {
    /// The cause, as the fault's error states it.
    pub(crate) fn why(self) -> &'static str {
        match self {
            Shortage::ReclaimOff => "the budget is exhausted and reclaim is off",
            Shortage::Unreclaimable => {
                "the budget is exhausted: every frame is held by pages reclaim cannot take (pinned, zero-filled, or being unmapped)"
            }
            Shortage::Stuck => {
                "the budget is exhausted: no frame was freed, and no fault or store call made progress, for 2 s"
            }
            Shortage::Starved => "no frame came in 60 s of waiting while other faults were served",
            Shortage::NotAsked => "read ahead takes only a free frame",
        }
    }
}

/// [`alloc`] within the frames of the budget.
fn alloc_within(core: &Core, order: u8, held: Option<usize>) -> Result<Frame, Shortage> {
    if let Some(f) = take_free(core, order) {
        return Ok(f);
    }
    if !core.config.reclaim {
        return Err(Shortage::ReclaimOff);
    }
    // Each pass parks what it passes and evicts what it parked on the
    // previous one, so a few passes free memory even when every page is
    // resident.
    let want = (1usize << order).max(core.config.experiment.pcp_batch);
    let sweeps_before = core.sweeps.started();
    for _ in 0..4 {
        let mut freed = reclaim(core, want, held, || false);
        if freed == 0 && core.sweeps.started() == sweeps_before {
            // Before the fault may be refused: zero-store pages the
            // program dropped unheard, whenever the last sweep was — once,
            // and not if a sweep ran since this fault began (its own pass's,
            // or another thread's: the wait below sweeps again as they
            // fall due).
            freed = super::unheard::sweep(core, want, super::unheard::When::Now);
        }
        if let Some(f) = take_free(core, order) {
            return Ok(f);
        }
        if freed == 0 {
            if let Some(answer) = settle(core, order) {
                return answer;
            }
        }
    }
    wait_for_frame(core, order, held, want)
}

/// Still nothing after the passes: the reclaimable pages may be under fault
/// locks other workers hold for a moment (with a budget of a few frames,
/// two concurrent faults can hold every one), or the frames just freed
/// went to other faults (with a budget of one frame and many threads
/// faulting, they take turns). Waits rather than fail the fault: while
/// other faults are being served the wait goes on (up to `WAIT_SERVED`);
/// after `WAIT_STUCK` without any, the fault is refused (SIGBUS, cause
/// queued). Pages evicted and moves being retried count as progress
/// ([`progress_made`]), and store calls too (in flight, or ended either
/// way): a slow store, or one failing while a server restarts or fails
/// over, keeps write-backs and fills going, and the fault waits for them
/// up to `WAIT_SERVED`.
fn wait_for_frame(
    core: &Core,
    order: u8,
    held: Option<usize>,
    want: usize,
) -> Result<Frame, Shortage> {
    let start = std::time::Instant::now();
    let (mut seen, mut since) = (progress_made(core) + core.nesting.store_calls().1, start);
    while since.elapsed() < WAIT_STUCK && start.elapsed() < WAIT_SERVED {
        if let Some(answer) = settle(core, order) {
            return answer;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
        reclaim(core, want, held, || false);
        if let Some(f) = take_free(core, order) {
            Stats::bump(&core.stats.reclaim_waits);
            return Ok(f);
        }
        let (in_flight, ended) = core.nesting.store_calls();
        let now = progress_made(core) + ended;
        if now != seen || in_flight > 0 {
            (seen, since) = (now, std::time::Instant::now());
        }
    }
    take_free(core, order).ok_or(if since.elapsed() >= WAIT_STUCK {
        Shortage::Stuck
    } else {
        Shortage::Starved
    })
}

/// How long a fault waits for a frame while no other fault is served.
const WAIT_STUCK: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a fault waits for a frame while others are served.
const WAIT_SERVED: std::time::Duration = std::time::Duration::from_secs(60);

/// Progress that may free a frame: faults served; pages evicted, by any
/// pass (frames freed that someone else took: a shrinking budget withholds
/// what reclaim frees for up to 5 s, and a 2 MiB fault waits while 4 KiB
/// frames are freed until a whole block is); and rounds of moves the
/// kernel refuses for a moment (a fault retrying its move holds its frame
/// for up to a few move deadlines: with a budget of one frame, the one the
/// waiting fault will get next).
fn progress_made(core: &Core) -> u64 {
    core.stats.faults_4k.load(Ordering::Relaxed)
        + core.stats.faults_2m.load(Ordering::Relaxed)
        + core.stats.evicted.load(Ordering::Relaxed)
        + core.stats.move_retries.load(Ordering::Relaxed)
}

/// A free frame of `order`, wherever free memory is: the allocator; the
/// pre-zeroed reserve, given back (its frames stay marked zero) — the
/// zeroing worker may hold the last free frame while it clears it (with a
/// budget of one frame, the only one): it is waited for to publish; and
/// idle memory given back to the kernel, taken back.
fn take_free(core: &Core, order: u8) -> Option<Frame> {
    if let Some(f) = core.alloc.alloc(order) {
        return Some(f);
    }
    core.await_zeroing();
    if core.drain_reserve() > 0 {
        if let Some(f) = core.alloc.alloc(order) {
            return Some(f);
        }
    }
    budget::alloc_in(core, 0, order)
}

/// For a fault whose reclaim freed nothing: its answer — a frame freed
/// meanwhile, or refused when no frame can come ([`nothing_to_wait_for`])
/// — or `None` to go on waiting. "Nothing to wait for" is believed only
/// when it holds on both sides of a failed take: a fault that took the
/// frame just freed raised the serving count before its allocation, and
/// the failed take follows that allocation through the allocator's lock,
/// so the second look counts it (the first may have been made before it
/// started). A refusal kills the faulting program, so it is believed
/// only once it holds again after [`CONFIRM_PAUSE`] with still no frame
/// to take, as the kernel retries reclaim before it declares OOM: any
/// frame in flight between two owners for less than that is waited for.
fn settle(core: &Core, order: u8) -> Option<Result<Frame, Shortage>> {
    for look in 0..2 {
        if look > 0 {
            std::thread::sleep(CONFIRM_PAUSE);
        }
        if !nothing_to_wait_for(core) {
            return None;
        }
        if let Some(f) = take_free(core, order) {
            return Some(Ok(f));
        }
        if !nothing_to_wait_for(core) {
            return None;
        }
    }
    Some(Err(Shortage::Unreclaimable))
}

/// How long "nothing can free a frame" must go on holding before a fault
/// is refused for it ([`settle`]): well under the 10 ms in which an
/// unservable fault reports (`tests/pinned.rs`).
const CONFIRM_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Whether no frame can come: no region may be reclaimed at all, or none
/// holds a frame reclaim could take while no other store-backed fault is in
/// flight (one may be about to record a page reclaim can then take; the
/// spares' count too). An
/// unservable fault is then refused at once (SIGBUS, cause queued), not
/// after the wait.
///
/// A reclaim pass running elsewhere (the background reclaimer, or another
/// fault's) is something to wait for: it may hold the last frame between
/// taking a page out of its region and freeing it (with a budget of one
/// frame, it always does). The regions are read first and the pass count
/// last: a page seen gone because a pass took it was taken after that
/// pass was counted (the Acquire fence pairs with the Release fence in
/// [`super::Passing::new`], made before the pass changes any page), and a
/// count seen back at zero (Acquire, pairing with the Release decrement in
/// `Passing::drop`) comes after the pass freed its frames.
fn nothing_to_wait_for(core: &Core) -> bool {
    let regions = core.table.snapshot();
    let none_reclaimable = !regions.iter().any(|r| reclaimable(r));
    let none_held = !regions.iter().any(|r| worth_walking(r)) && core.nesting.serving() <= 1;
    fence(Ordering::Acquire);
    if core.reclaiming.load(Ordering::Acquire) > 0 {
        return false;
    }
    none_reclaimable || none_held
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The causes name the waits they follow (the error text is a
    /// `&'static str`, so the figures are written out: a change to either
    /// constant must change its message too).
    #[test]
    fn causes_name_the_waits_as_they_are() {
        let stuck = format!("for {} s", WAIT_STUCK.as_secs());
        assert!(Shortage::Stuck.why().contains(&stuck), "{stuck}");
        let served = format!("in {} s", WAIT_SERVED.as_secs());
        assert!(Shortage::Starved.why().contains(&served), "{served}");
    }
}
