//! Reclaim: CLOCK (second chance) over the pages of regions backed by a
//! store, under the memory budget (the pool).
//!
//! Access information comes from the faults themselves: the clock hand
//! *parks* a resident page — moves it out of the region back into its frame's
//! pool slot (`UFFDIO_MOVE`, no copy, no write-back) — and a touch before the
//! hand comes round again faults it back cheaply (`fault::service` unparks:
//! one move). A page still parked when the hand returns was not referenced:
//! it is *evicted* — written back if its store is writable and the page is
//! dirty (its bytes differ from the store's copy: [`crate::dirty`]), then
//! its frame freed. A page's frame is freed only after its data is safe in the store;
//! if the write fails the page stays parked and the error is queued. Runs
//! of consecutive pages are parked with one move and evicted with one store
//! call (`runs.rs`); a scattered parked page is evicted as soon as the hand
//! finds it clean, and dirty ones 32 at a time, their writes in flight
//! together (`evictions.rs`).
//!
//! Only pages in pool 0 (the budget) are reclaimed; pages migrated to
//! another pool stay there until migrated back or unmapped.
//!
//! Regions of the zero store have no backing to write to and are never
//! reclaimed (a swap store would change that). Pages of a read-only store
//! are dropped without write-back: writes to such a region are not kept.
//!
//! Driven two ways: a fault that finds no free frame reclaims synchronously
//! ([`alloc`], `faulting.rs`), and a background thread keeps free memory
//! between the low and high watermarks of the config. That thread also
//! settles the frames withheld to pay for faultline's own memory
//! (`overhead::settle`) after its checks' passes, every 20 ms at most.
//!
//! A resident page the kernel will not move out (`EBUSY`: shared
//! copy-on-write with a child of `fork()` that inherited the region, or
//! pinned for I/O) is passed over after one brief try, and for a second
//! after that (`RegionInner::held`): never retried for a move deadline
//! under its lock on every pass (a found stall: a quarter of the budget
//! shared with a child stopped a sequential reader for minutes).
//!
//! Locks: each page is stepped under its fault lock, taken with `try_lock`
//! (a held lock is skipped: its page is busy, and a worker that reclaims while
//! holding its own page's lock must not wait on another) — except pages under
//! the lock the reclaiming worker itself holds, which it may step as they are,
//! and pages under a lock one of its batches holds (`drops.rs`: the clean
//! pages' locks are kept until the batch is dropped, which happens before any
//! eviction that may call a store and before the hand comes round;
//! `evictions.rs`: the victims' locks until their write-back is done). The page
//! being faulted is absent, so the worker never steps it. The hand's mutex
//! is a leaf held only to read and store the hand.

use crate::budget;
use crate::core::Core;
use crate::error::{BudgetError, FaultError};
use crate::frame::{Frame, FrameAllocator};
use crate::pagemove::{self, Patience, TryPark};
use crate::publish::{self, Publisher};
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use crate::writeback;
use faultline_sys::PAGE_SIZE;
use std::sync::atomic::Ordering;
use std::time::Instant;

mod batch;
mod cursor;
mod drops;
mod evictions;
mod faulting;
mod hand;
mod runs;
mod unheard;

/// Longest run of pages parked with one move, or written back with one
/// store call: 1 MiB of 4 KiB pages, one vectored write to a file (a
/// sequential writer through a budget ran 1.36x with 256 against 64:
/// measurements.md §22).
const RUN_MAX: usize = 256;

pub(crate) use faulting::{alloc, Shortage};

/// The background reclaimer's period.
const TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// Its longest sleep while there is nothing it can reclaim.
const IDLE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the overhead counted against the budget is settled.
const SETTLE_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// The shortest time from the end of one pass to a pass a fault's kick
/// starts.
const KICK_GAP: std::time::Duration = std::time::Duration::from_millis(1);

/// When the background reclaimer's last pass ended, and how long it took.
struct LastPass {
    ended: Instant,
    took: std::time::Duration,
}

impl LastPass {
    /// A pass that started at `started` and ends now.
    fn since(started: Instant) -> LastPass {
        LastPass {
            ended: Instant::now(),
            took: started.elapsed(),
        }
    }

    /// Sleeps out what is left of the gap a kicked pass keeps after this
    /// one: as long as this one took, and at least [`KICK_GAP`] — so
    /// faults that keep kicking passes which barely help take at most
    /// half a CPU, not all of it.
    fn keep_gap(&self, core: &Core) {
        let gap = self.took.max(KICK_GAP).saturating_sub(self.ended.elapsed());
        if !gap.is_zero() && !core.is_stopping() {
            std::thread::sleep(gap);
        }
    }
}

/// The background reclaimer: wakes every [`TICK`], or as soon as a fault
/// takes free memory below the low watermark (`crate::kick`), and when
/// free memory is below that watermark, reclaims up to the high one;
/// while a pass frees nothing it sleeps longer, up to [`IDLE_MAX`]. It
/// also refreshes the stats file, if any, every [`publish::PERIOD`]
/// (every [`publish::IDLE_PERIOD`] while the manager does nothing; with
/// `Config::reclaim` off, that is all it does).
pub(crate) fn run(core: &Core, mut publisher: Option<Publisher>) {
    let mut idle = TICK;
    let mut above = Above::default();
    // The next reclaim check and the next publication. The wait ends at
    // the earlier; a kick makes the reclaim check due at once (as before
    // publication shared this thread: it does not shorten the backoff).
    let mut check_at = Instant::now() + idle;
    let mut publish_at = Instant::now() + publish::PERIOD;
    let mut settle_at = Instant::now();
    let mut last_pass = LastPass::since(Instant::now());
    loop {
        // The budget may change at run time (`Manager::set_budget`).
        let pages = budget::budget_pages(core);
        let low = pages * core.config.reclaim_low_pct / 100;
        let high = pages * core.config.reclaim_high_pct / 100;
        core.kick.set_low(low);
        let until = match (&publisher, core.config.reclaim) {
            (Some(_), true) => check_at.min(publish_at),
            (Some(_), false) => publish_at,
            (None, _) => check_at,
        };
        let wait = until.saturating_duration_since(Instant::now());
        if core.kick.sleep(wait, || core.is_stopping()) {
            last_pass.keep_gap(core);
            check_at = Instant::now();
        }
        if core.is_stopping() {
            return;
        }
        publish_due(core, publisher.as_mut(), &mut publish_at);
        if Instant::now() < check_at {
            continue;
        }
        crate::pagemove::drop_dead_copies(core);
        if !core.config.reclaim {
            check_at = Instant::now() + idle;
            continue;
        }
        above.note(core, high);
        // Overhead a settle found no room for above `low`: freed on top of
        // the watermarks, or it would wait for faults to start a pass.
        let owed = crate::overhead::owed(core);
        let (start, stop) = (low + owed, high + owed);
        let mut free = budget::free_pages(core);
        if free < start {
            // Pre-zeroed frames are free memory first (the zeroing
            // worker makes more once memory is plentiful again).
            if core.drain_reserve() > 0 {
                free = budget::free_pages(core);
            }
        }
        if free < start {
            // Faults do not kick while the pass runs (re-armed below).
            core.kick.arm(false);
            let started = Instant::now();
            let freed = reclaim(core, stop - free, None, || budget::free_pages(core) >= stop);
            last_pass = LastPass::since(started);
            // Nothing to take (pinned, zero-filled or busy pages): back off (doubling, up to IDLE_MAX)
            // instead of burning a CPU while the program idles. Faults
            // still reclaim synchronously when they need a frame.
            idle = if freed == 0 {
                (idle * 2).min(IDLE_MAX)
            } else {
                TICK
            };
        } else {
            idle = TICK;
        }
        // After the pass, when free memory is at its highest: a stream of
        // faults kicks the pass below the low watermark, and settled there
        // the overhead would never find free memory above it to withhold.
        if core.config.budget_counts_overhead && Instant::now() >= settle_at {
            crate::overhead::settle(core, low);
            settle_at = Instant::now() + SETTLE_EVERY;
        }
        // Faults may wake this thread early unless it is backing off.
        core.kick.arm(idle == TICK);
        check_at = Instant::now() + idle;
    }
}

/// Publishes the stats if `publish_at` has come, and sets the next time.
fn publish_due(core: &Core, publisher: Option<&mut Publisher>, publish_at: &mut Instant) {
    if let Some(p) = publisher {
        if Instant::now() >= *publish_at {
            *publish_at = Instant::now() + p.publish(core);
        }
    }
}

/// Free memory above the high watermark that nobody takes: after
/// `Config::idle_release` of it, the excess goes back to the kernel (a
/// program that shrank shrinks its RSS). Free memory that falls meanwhile
/// (faults are using it) restarts the wait.
#[derive(Debug, Default)]
struct Above {
    since: Option<(std::time::Instant, usize)>,
}

impl Above {
    fn note(&mut self, core: &Core, high: usize) {
        let Some(wait) = core.config.idle_release else {
            return;
        };
        let free = core.alloc.free_hint();
        let slack = crate::frame::PAGES_PER_HUGE;
        self.since = match self.since {
            _ if free <= high + slack => None,
            Some((t, was)) if free + slack >= was => {
                if t.elapsed() < wait {
                    Some((t, was))
                } else {
                    budget::release_idle(core, high);
                    None
                }
            }
            _ => Some((std::time::Instant::now(), free)),
        };
    }
}

fn reclaimable(r: &RegionInner) -> bool {
    !r.store.is_zero() && !r.pinned && !r.dying()
}

/// Reclaimable and holding frames now: the hand walks only these (an
/// untouched terabyte region costs a pass nothing).
fn worth_walking(r: &RegionInner) -> bool {
    reclaimable(r) && r.holding() > 0
}

/// Counts a reclaim pass in `Core::reclaiming` for as long as it runs.
struct Passing<'a>(&'a Core);

impl<'a> Passing<'a> {
    fn new(core: &'a Core) -> Passing<'a> {
        core.reclaiming.fetch_add(1, Ordering::Relaxed);
        // Release: every page this pass changes is changed after it is
        // counted (the Acquire fence in `faulting::nothing_to_wait_for`,
        // which reads the regions before the count).
        std::sync::atomic::fence(Ordering::Release);
        Passing(core)
    }
}

impl Drop for Passing<'_> {
    fn drop(&mut self) {
        // Release: the pass's frees happen-before a waiter that sees the
        // count drop (Acquire in `nothing_to_wait_for`).
        self.0.reclaiming.fetch_sub(1, Ordering::Release);
    }
}

/// Advances the clock until `want` 4 KiB pages' worth of frames were freed,
/// `enough()` says stop, or two full turns passed. Returns pages freed.
/// `held`: the index of a fault lock the caller already holds (a worker
/// reclaiming for its own fault); pages under it are stepped without locking,
/// since holding it already excludes everyone else from them.
pub(crate) fn reclaim(
    core: &Core,
    want: usize,
    held: Option<usize>,
    enough: impl Fn() -> bool,
) -> usize {
    let _passing = Passing::new(core);
    let freed = hand::clock_pass(core, want, held, &enough);
    if freed >= want || enough() {
        return freed;
    }
    // Zero-store pages the program dropped unheard hold frames the hand
    // never walks (`unheard.rs`).
    freed + unheard::sweep(core, want - freed, unheard::When::Due)
}

/// One page under the hand; the caller holds its fault lock. Returns pages
/// freed; an evicted page's frame is pushed on `evicted` for the caller to
/// free.
fn step(core: &Core, r: &RegionInner, page: usize, evicted: &mut Vec<Frame>) -> usize {
    if r.dying() {
        return 0;
    }
    let order = r.page_size.order();
    let len = r.page_size.bytes();
    // Only pool 0 is under the budget: pages migrated to another pool stay
    // there (evicting them would free nothing faults can use).
    if let PageState::Resident(f) | PageState::Parked(f) = r.state(page) {
        if core.alloc.pool_of(f) != 0 {
            return 0;
        }
    }
    match r.state(page) {
        PageState::Resident(f) => {
            match pagemove::try_park(core, r, page, f, Patience::Brief) {
                Ok(TryPark::Parked) => Stats::bump(&core.stats.parked),
                Ok(TryPark::Held) => {
                    r.held.note(page);
                    Stats::bump(&core.stats.reclaim_held);
                }
                Ok(TryPark::Busy) => {}
                Err(e) => core.record(e),
            }
            0
        }
        PageState::Parked(f) => {
            let mut frame = Frame::from_parts(f, order);
            if r.store.writable() {
                // SAFETY: a parked frame belongs to its page, whose lock we
                // hold: nobody else reads or writes it, and it is populated.
                let bytes = unsafe { core.pool.bytes_mut(&mut frame) };
                if let Err(e) = writeback::put(core, r, page, bytes, writeback::AfterWrite::Evicted)
                {
                    // Keep the data: the page stays parked.
                    core.record(FaultError::Store {
                        addr: r.page_addr(page),
                        source: e,
                    });
                    return 0;
                }
            }
            core.pool.set_zeroed(&frame, false);
            r.set_state(page, PageState::Absent);
            if frame.order() == 0 {
                evicted.push(frame);
            } else {
                // Nothing to merge: free it now, for whoever waits for it.
                core.alloc.free(frame);
            }
            Stats::bump(&core.stats.evicted);
            len / PAGE_SIZE
        }
        PageState::Absent | PageState::Poisoned | PageState::Gone => 0,
    }
}

/// How long shrinking waits for reclaim to free what it needs.
const SHRINK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Sets the budget to `bytes` (see `Manager::set_budget`): growing gives
/// withheld frames back to the budget, populated; shrinking withholds idle
/// frames, then free ones, reclaiming until enough are free — for at most
/// [`SHRINK_WAIT`]: a reclaim pass stops at the deadline (after the store
/// write under way), and the shrink then ends `Busy` with what it reached,
/// whether the last pass freed pages or not (faulting threads may take the
/// freed frames as fast as reclaim frees them).
pub(crate) fn set_budget(core: &Core, bytes: usize) -> Result<(), BudgetError> {
    let huge = faultline_sys::HUGE_PAGE_SIZE;
    if bytes < huge || bytes % huge != 0 {
        return Err(BudgetError::Unaligned { bytes });
    }
    let max = core.alloc.pages_in(0) * PAGE_SIZE;
    if bytes > max {
        return Err(BudgetError::AboveMax { bytes, max });
    }
    // The frames for faultline's own memory stay withheld, as many as the
    // new budget allows; the rest of it is frames. `budget_lock` is held
    // around the balloon's moves, never across reclaim (a store call; a
    // fault may wait for the lock: see `overhead`).
    let changing = core.budget_lock.lock();
    let want = bytes / PAGE_SIZE - crate::overhead::within(core, bytes / PAGE_SIZE);
    let now = budget::budget_pages(core);
    if want >= now {
        // Grow: withheld frames become the budget's, populated now.
        budget::grow(core, want - now);
        return Ok(());
    }
    let mut need = now - want;
    need -= budget::withhold_idle(core, need);
    drop(changing);
    let deadline = std::time::Instant::now() + SHRINK_WAIT;
    while need > 0 {
        need -= {
            let _changing = core.budget_lock.lock();
            budget::inflate(core, need, true, true)
        };
        if need == 0 {
            break;
        }
        if std::time::Instant::now() >= deadline {
            return Err(BudgetError::Busy {
                bytes,
                reached: budget::user_budget_pages(core) * PAGE_SIZE,
            });
        }
        reclaim(core, need, None, || std::time::Instant::now() >= deadline);
    }
    Ok(())
}
