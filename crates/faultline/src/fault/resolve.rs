//! Resolving one fault, under the page's lock: what the page's state asks
//! for (absent: serve it; parked: move its frame back; resident: a racing
//! fault's wake-up, or a dropped part to gather; poisoned: retry the store
//! (a poisoned page's marker is also cleared after a back-off, `reread.rs`);
//! gone: the program unmapped it), and for an absent page the steps in
//! order: choose the unit, take its frame and fill it ([`super::unit`],
//! [`crate::fill`]) → record the pages resident → move it in
//! ([`crate::pagemove`], which wakes the faulting threads).
//!
//! Outcomes ([`Resolution`]): see its docs. Frame accounting: a frame
//! taken from the allocator is either moved into the region (and recorded
//! in the page state) or returned before the page lock is released.
//! Locks: the caller holds the page's fault lock (and the unit's, for
//! fault-around and read-ahead runs).

use super::unit::{self, Unit};
use super::Fault;
use super::Resolution;
use crate::core::Core;
use crate::error::FaultError;
use crate::frame::{Frame, FrameAllocator};
use crate::pagemove::{self, MoveError};
use crate::reclaim::Shortage;
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use faultline_sys::uffd::Resolved;
use faultline_sys::PAGE_SIZE;

/// Resolves a fault on `page` of `region`. Caller holds the page's lock
/// (or, for a lent serve, the stopped faulting thread does).
pub(super) fn resolve(core: &Core, region: &RegionInner, page: usize, how: &Fault) -> Resolution {
    if region.dying() {
        wake(core, region, page);
        return Resolution::Dying;
    }
    if how.protection {
        return super::protect::lift(core, region, page, how);
    }
    match region.state(page) {
        PageState::Absent => serve(core, region, page, how),
        PageState::Poisoned => {
            // A fault on a poisoned page: the program dropped the poison
            // marker (MADV_DONTNEED: waking would loop forever), or
            // `prefetch` asks for it. Either way the store gets another
            // try (its error may have been transient): the marker goes,
            // and the page is served afresh — or poisoned again.
            if let Err(source) = clear_poison(core, region, page) {
                let addr = region.page_addr(page);
                return poison(core, region, page, FaultError::Move { addr, source }, how);
            }
            serve(core, region, page, how)
        }
        PageState::Parked(f) => unpark(core, region, page, f),
        PageState::Gone => gone(core, region, page, how),
        PageState::Resident(f) => match refault(core, region, page, how, f) {
            Some(res) => res,
            None => unpark(core, region, page, f),
        },
    }
}

/// Serves absent `page`: chooses the unit, takes, fills and maps its frame.
fn serve(core: &Core, region: &RegionInner, page: usize, how: &Fault) -> Resolution {
    // `_guards` holds the read-ahead run's extra locks until the move is done.
    let mut _guards = Vec::new();
    let mut u = match unit::take(core, region, page, how, &mut _guards) {
        Ok(u) => u,
        Err(why) => return no_frame(core, region, page, how, why),
    };
    let source = match unit::fill_frame(core, region, page, how, &mut u) {
        Ok(source) => source,
        Err(e) => {
            core.alloc.free(u.frame);
            return poison(core, region, page, e, how);
        }
    };
    let protect = super::protect::fills_protected(core, region, (source, u.count), how);
    let offer = u.offer;
    let res = map_in(core, region, page, u, how, protect);
    if let (Resolution::Moved, Some(next)) = (res, offer) {
        // Read while the program works through the run just mapped.
        super::offers::offer(core, region, next, how.dirties);
    }
    res
}

/// Records the unit's pages resident and moves its filled frame in (which
/// wakes the faulting threads); on a refused move, undoes the record.
/// `protect`: copy the pages in write-protected where they go by copy, and
/// mark them protected ([`crate::dirty`]) once they are in.
fn map_in(
    core: &Core,
    region: &RegionInner,
    page: usize,
    u: Unit,
    how: &Fault,
    protect: bool,
) -> Resolution {
    let (first, count, frame) = (u.first, u.count, u.frame);
    let addr = region.page_addr(first);
    let len = count * region.page_size.bytes();
    // Resident before the move: the move wakes the faulting threads, and
    // what they do next (query the region, unmap it) must see the pages
    // resident. No one else can look at the state in between: we hold the
    // window's lock, and teardown takes it too.
    let pages_per_unit = region.page_size.bytes() / PAGE_SIZE;
    for i in 0..count {
        region.set_state(
            first + i,
            PageState::Resident(frame.index() + (i * pages_per_unit) as u32),
        );
    }
    if count > 1 {
        core.stats
            .fault_around_pages
            .fetch_add(count as u64 - 1, std::sync::atomic::Ordering::Relaxed);
    }
    let mut tries = 1;
    let moved = loop {
        let moved = move_unit(core, region, addr, len, &frame, protect);
        match &moved {
            // The kernel refused this frame for a whole move deadline
            // (`pagemove`): nothing moved. Try the same frame again — the
            // range's page table is dropped afresh (a thread that touched
            // the range meanwhile made one, and with it the move goes page
            // by page, splitting the frame) — once, and once more while no
            // other frame is free (a budget of one frame: another would
            // never come, and the fault would be refused). Then `refused`.
            // Not for a window mapped ahead: nobody waits for it.
            Err(MoveError::Refused(e))
                if transient(e)
                    && !how.ahead
                    && (tries == 1
                        || (tries < SAME_FRAME_TRIES
                            && core.alloc.free_pages() < pages_per_unit)) =>
            {
                tries += 1;
            }
            _ => break moved,
        }
    };
    match moved {
        Ok(protected) => {
            if protected {
                super::protect::mark(region, first..first + count);
            }
            Resolution::Moved
        }
        Err(MoveError::Split { .. }) => {
            // Part of the frame is in the region, part in its slot: the
            // pages keep their frame (recorded resident above), and the
            // next fault on a missing part gathers it (`refault`).
            core.record(FaultError::Inconsistent {
                addr,
                what: "a move into the region was left split; the next touch gathers it",
            });
            wake(core, region, page);
            Resolution::AlreadyMapped
        }
        Err(e) => {
            for i in 0..count {
                region.set_state(first + i, PageState::Absent);
            }
            refused(core, region, page, frame, e, how)
        }
    }
}

/// How many times [`map_in`] moves a frame the kernel keeps refusing.
const SAME_FRAME_TRIES: u32 = 3;

/// Moves the filled `frame` into `[addr, addr + len)`, after dropping the
/// range's empty page table (a 2 MiB move then moves the PMD whole), or
/// copies it in (`pagemove::by_copy`; write-protected if `protect`).
/// Returns whether every page went in write-protected.
fn move_unit(
    core: &Core,
    region: &RegionInner,
    addr: usize,
    len: usize,
    frame: &Frame,
    protect: bool,
) -> Result<bool, MoveError> {
    if pagemove::by_copy(core, region, len) {
        // SAFETY: as for the move below.
        return unsafe { pagemove::copy_in(core, addr, frame, len, protect) };
    }
    pagemove::drop_empty_page_table(core, region, addr, len);
    // The first 4 KiB move out of a PMD-mapped pool block splits the block's
    // THP; two such moves at once can make the kernel report EEXIST for a
    // move it did not complete (seen on 6.18), so they take the split lock.
    let split = core.pool.split_guard(frame);
    // SAFETY: `frame` is in flight with this worker and the window's pages
    // are absent under its locks; nothing references either range.
    let moved = unsafe { pagemove::move_in(core, addr, core.pool.addr_of(frame), len) };
    if let Some(guard) = split {
        if moved.is_ok() {
            guard.mark_split();
        }
    }
    moved.map(|()| false)
}

/// A refusal the kernel may lift (a reference held for a moment, a split
/// in progress, a removal event not read yet).
fn transient(e: &faultline_sys::SysError) -> bool {
    matches!(e.errno, libc::EAGAIN | libc::EBUSY)
}

/// A move of `frame` into the unit at `page` that moved nothing: `e` says
/// why. Frees the frame (after a retry, for a transient refusal).
fn refused(
    core: &Core,
    region: &RegionInner,
    page: usize,
    frame: Frame,
    e: MoveError,
    how: &Fault,
) -> Resolution {
    let addr = region.page_addr(page);
    // The frame goes back whole (`pagemove::free_whole`): a page of it the
    // program dropped on arrival, before the move was undone, left a hole
    // in its slot.
    match e {
        MoveError::Occupied { .. } => {
            // Mapped behind our back: nothing moved, the frame is still in
            // its slot. Keep what is there, and say so.
            pagemove::free_whole(core, frame);
            core.record(FaultError::Inconsistent {
                addr,
                what: "page absent in faultline's state but mapped in the page tables",
            });
            wake(core, region, page);
            Resolution::AlreadyMapped
        }
        MoveError::Refused(e) if how.attempt < 2 && transient(&e) => {
            // The kernel kept refusing this frame: try again with the
            // faulting page alone and another frame before giving up; keep
            // this frame out of the allocator until then, so the retry
            // cannot get it back — while another is free. With none free
            // (a budget of one frame: this is the only one), kept out it
            // would leave the retry nothing to take and nothing to reclaim
            // (the fault refused: SIGBUS), so it goes back first.
            let retry = Fault {
                attempt: how.attempt + 1,
                ..*how
            };
            if core.alloc.free_pages() < frame.pages() {
                pagemove::free_whole(core, frame);
                return resolve(core, region, page, &retry);
            }
            let res = resolve(core, region, page, &retry);
            pagemove::free_whole(core, frame);
            res
        }
        e => {
            let len = frame.bytes();
            pagemove::free_whole(core, frame);
            let source = e.into_sys(addr, len);
            poison(core, region, page, FaultError::Move { addr, source }, how)
        }
    }
}

/// Wakes the threads waiting on `page` (a failure, a bug since the range
/// is registered, is recorded).
pub(super) fn wake(core: &Core, region: &RegionInner, page: usize) {
    core.wake(region.page_addr(page), region.page_size.bytes());
}

/// Unparks `page` for a fault: the thread refaults if nothing moved (the
/// data stays safe in its frame, and the next attempt tries again).
fn unpark(core: &Core, region: &RegionInner, page: usize, f: u32) -> Resolution {
    match pagemove::unpark(core, region, page, f) {
        Ok(()) => {
            // Counted here, not in `pagemove::unpark`: a write-back's
            // snapshot moves its pages out and back too, and is no touch.
            Stats::bump(&core.stats.unparked);
            Resolution::Moved
        }
        Err(e) => {
            core.record(e);
            wake(core, region, page);
            Resolution::AlreadyMapped
        }
    }
}

/// A fault on a page faultline records as resident in frame `f`. Usually a
/// second thread's fault on a page the first one's fault mapped, reported
/// after the move woke it: then `None`'s opposite — wake, done. But if the
/// faulting 4 KiB page holds no data in the page tables, the program dropped
/// it (`MADV_DONTNEED`) or a move was left split: the page is gathered back
/// into its frame, its holes refilled ([`pagemove::recollect`]), and mapped
/// again. Never served afresh: other parts of it may hold data. Returns the
/// resolution, or `None` if the page was gathered and is now parked (the
/// caller then unparks it).
fn refault(
    core: &Core,
    region: &RegionInner,
    page: usize,
    how: &Fault,
    f: u32,
) -> Option<Resolution> {
    let at = how.addr & !(PAGE_SIZE - 1);
    match pagemove::is_empty(core, at, PAGE_SIZE) {
        Ok(false) if super::protect::in_thread(core) => {
            // In-thread, a SIGBUS on a mapped page is a write-protect fault
            // whose signal context did not say so (an architecture without
            // x86's error code), or a racing fault that was served first:
            // lifting the protection serves the one and costs the other
            // only its clean drop.
            return Some(super::protect::lift(core, region, page, how));
        }
        Ok(false) => {
            wake(core, region, page);
            return Some(Resolution::AlreadyMapped);
        }
        Ok(true) => {}
        Err(e) => {
            let addr = region.page_addr(page);
            let cause = FaultError::Move { addr, source: e };
            return Some(poison(core, region, page, cause, how));
        }
    }
    match pagemove::recollect(core, region, page, core.pool.slot_addr(f)) {
        Ok(_) => {
            pagemove::fingerprint_if_protected(core, region, page, f);
            region.set_state(page, PageState::Parked(f));
            None
        }
        Err(e) => {
            // The page stays as it is (its data on one side or the other);
            // the faulting thread gets SIGBUS for its 4 KiB hole rather
            // than refaulting forever.
            Some(poison_hole(core, region, page, at, e, how))
        }
    }
}

/// A fault on a page the program unmapped (part of) itself. On the part it
/// unmapped, a fault reported before the unmap: wake (the thread retries and
/// gets the kernel's answer, SIGSEGV). On what is left of a 2 MiB page: its
/// frame is gone, so the 4 KiB page is poisoned (SIGBUS) with the cause.
fn gone(core: &Core, region: &RegionInner, page: usize, how: &Fault) -> Resolution {
    let at = how.addr & !(PAGE_SIZE - 1);
    let live = region
        .map
        .live_ranges()
        .iter()
        .any(|&(s, e)| at >= s && at < e);
    if !live {
        let _ = core.uffd.wake(at, PAGE_SIZE);
        return Resolution::Stray;
    }
    let cause = FaultError::Inconsistent {
        addr: region.page_addr(page),
        what: "the program unmapped part of this page (munmap/mremap); the rest of it is gone",
    };
    // `at` is a hole of a live part of a region we manage (its page gave up
    // its frame when the program unmapped the rest).
    poison_hole(core, region, page, at, cause, how)
}

fn no_frame(
    core: &Core,
    region: &RegionInner,
    page: usize,
    how: &Fault,
    why: Shortage,
) -> Resolution {
    let cause = FaultError::NoFrame {
        addr: region.page_addr(page),
        page_size: region.page_size.name(),
        why: why.why(),
    };
    poison(core, region, page, cause, how)
}

/// A nested fault (by a thread inside a store call) that cannot be served:
/// a SIGBUS in that thread would kill the process, so the cause is queued
/// and the thread woken after a pause to fault again (the frame shortage
/// or store error may pass; the page stays as it was).
fn retry_later(core: &Core, region: &RegionInner, page: usize, cause: FaultError) -> Resolution {
    core.record(cause);
    std::thread::sleep(std::time::Duration::from_millis(10));
    wake(core, region, page);
    Resolution::Retry
}

/// Poisons the 4 KiB hole `at` of `page` (the faulting thread gets SIGBUS)
/// and records `cause`; a nested fault is retried instead. The caller has
/// checked `at` holds no data.
fn poison_hole(
    core: &Core,
    region: &RegionInner,
    page: usize,
    at: usize,
    cause: FaultError,
    how: &Fault,
) -> Resolution {
    if how.ahead {
        return Resolution::Retry;
    }
    if how.nested {
        return retry_later(core, region, page, cause);
    }
    core.record(cause);
    // SAFETY: `at` holds no data (the caller's check, under the page's
    // lock): poisoning fills a hole of a region we manage.
    let _ = unsafe { core.uffd.poison(at, PAGE_SIZE, false) };
    Stats::bump(&core.stats.poisoned);
    Resolution::Poisoned
}

/// Clears poisoned `page`'s marker, so that its next access faults again
/// (and reads the store afresh): the page is absent after. Caller holds
/// the page's lock and has seen it `Poisoned`.
pub(super) fn clear_poison(
    core: &Core,
    region: &RegionInner,
    page: usize,
) -> Result<(), faultline_sys::SysError> {
    let addr = region.page_addr(page);
    let len = region.page_size.bytes();
    // SAFETY: a poisoned page holds no data, only the kernel's poison
    // marker, and nothing references it.
    core.own_discards.run(addr, addr + len, || unsafe {
        region.map.discard(addr, len)
    })?;
    region.set_state(page, PageState::Absent);
    Stats::bump(&core.stats.poison_retries);
    Ok(())
}

/// Poisons `page` so its threads get SIGBUS, and records `cause`; a nested
/// fault is retried instead ([`retry_later`]). The marker is cleared after
/// a back-off (`rereads.rs`), so a later access tries the store again.
fn poison(
    core: &Core,
    region: &RegionInner,
    page: usize,
    cause: FaultError,
    how: &Fault,
) -> Resolution {
    if how.ahead {
        return Resolution::Retry;
    }
    if how.nested {
        return retry_later(core, region, page, cause);
    }
    if region.dying() {
        // Unmapped while this fault was served (it waited for a frame, or
        // its move found the range gone): its threads wake to the unmap,
        // and a cause nobody can act on is not queued.
        wake(core, region, page);
        return Resolution::Dying;
    }
    let addr = region.page_addr(page);
    let len = region.page_size.bytes();
    // Queue the cause first: the poisoned thread, once woken, may ask.
    core.record(cause);
    // SAFETY: the page is absent (under its lock): poisoning fills a hole of
    // a region we manage; no reference into it can exist.
    match unsafe { core.uffd.poison(addr, len, false) } {
        Ok(Resolved::Done) => {
            region.set_state(page, PageState::Poisoned);
            Stats::bump(&core.stats.poisoned);
            core.rereads.failed(region.id, page);
            // Wake a worker to time the clearing (in-thread mode poisons
            // from a signal handler: an eventfd write is safe there).
            let _ = core.deferred_fd.signal();
        }
        Ok(other) => {
            // Partly mapped or raced: wake, and the thread refaults.
            let _ = other;
            wake(core, region, page);
        }
        Err(e) => core.record(FaultError::Poison { addr, source: e }),
    }
    Resolution::Poisoned
}
