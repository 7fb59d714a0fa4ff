//! The page rules built on the move protocol ([`super::move_range`]):
//! park a resident page into its frame's pool slot and unpark it back,
//! gather a page whose 4 KiB parts the program dropped back into its frame
//! ([`recollect`]: never serve such a page afresh), fill pool holes with
//! zeroed pages without a fault ([`fill_holes`]), free a frame with its
//! slot whole ([`free_whole`]), and drop an empty page table before a
//! 2 MiB move ([`drop_empty_page_table`]).
//!
//! Invariant: no frame is freed or refilled while any of its data is
//! elsewhere, nor freed with a hole in its slot; a page is recorded parked
//! only once its data is whole in its slot. Locks: none; callers hold the
//! page's fault lock (a run's other locks [`park_run`] only tries).

use super::{move_back, move_in, move_out, move_range, while_changing, Holes, MoveError, Patience};
use crate::core::Core;
use crate::error::FaultError;
use crate::frame::{Frame, FrameAllocator};
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use faultline_sys::uffd::Resolved;
use faultline_sys::{SysError, HUGE_PAGE_SIZE, PAGE_SIZE};

/// A zeroed, page-aligned page: the source of [`fill_holes`].
#[repr(C, align(4096))]
struct ZeroPage([u8; PAGE_SIZE]);
static ZERO_PAGE: ZeroPage = ZeroPage([0; PAGE_SIZE]);

/// Gives every hole in the pool slots `[addr, addr + len)` a fresh zeroed
/// page; pages already there are left alone. A whole 2 MiB block (one
/// frame's) is populated at once; anything smaller goes page by page with
/// `UFFDIO_COPY` of a zero page, never by a fault: in an empty block of the
/// `MADV_HUGEPAGE` pool a fault would populate the whole block with a THP —
/// the slots of other frames too, while their pages are mapped in regions
/// (a found bug: every later move of those pages back out failed with
/// `EEXIST`).
pub(crate) fn fill_holes(core: &Core, addr: usize, len: usize) -> Result<(), SysError> {
    // A dead copy left by the copy fill model stays (it is not a hole, and
    // no drop may take it once this frame is free), or a drop in progress
    // finishes first and its holes are filled below.
    core.pool.keep_stale(addr, len);
    if len % HUGE_PAGE_SIZE == 0 && addr % HUGE_PAGE_SIZE == 0 {
        for block in (addr..addr + len).step_by(HUGE_PAGE_SIZE) {
            core.pool.populate_block(block)?;
        }
        return Ok(());
    }
    let zero = ZERO_PAGE.0.as_ptr() as usize;
    for page in (addr..addr + len).step_by(PAGE_SIZE) {
        while_changing(
            core,
            ("UFFDIO_COPY", page, PAGE_SIZE),
            // SAFETY: `page` is a pool slot of a frame the caller owns (in
            // flight, or under its page's lock); UFFDIO_COPY fills it only
            // if it is a hole. The source is a static zeroed page.
            || unsafe { core.uffd_into(page).copy(page, zero, PAGE_SIZE, true) },
            |r| matches!(r, Resolved::Done | Resolved::Exists { .. }),
        )?;
    }
    Ok(())
}

/// Frees `frame`, whose data nobody wants any more, with its slot whole: a
/// free frame's slot is populated (a move out of a slot with a hole fails
/// with `ENOENT`), so holes get zeroed pages first. If they cannot be
/// filled, the frame stays out of the allocator (leaked) and the failure
/// is recorded. The caller owns the frame (in flight, or its page's lock).
pub(crate) fn free_whole(core: &Core, frame: Frame) {
    let slot = core.pool.addr_of(&frame);
    if let Err(source) = fill_holes(core, slot, frame.bytes()) {
        return core.record(FaultError::Move { addr: slot, source });
    }
    core.pool.set_zeroed(&frame, false);
    core.alloc.free(frame);
}

/// Whether no page of `[addr, addr + len)` holds data (mapped, swapped or
/// migrating).
pub(crate) fn is_empty(core: &Core, addr: usize, len: usize) -> Result<bool, SysError> {
    core.pagemap.any_data(addr, addr + len).map(|any| !any)
}

/// What [`give_back_if_emptied`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Emptied {
    /// The page was resident and the kernel held nothing of it: its frame
    /// went back (the 4 KiB frames given back; 0 if a move failed — the
    /// failure is recorded, the page stays resident and the fault path
    /// gathers it).
    GaveBack(usize),
    /// The page holds data in the region: nothing changed.
    HoldsData,
    /// Nothing to do: the page is not resident, its region is dying, or
    /// its page tables could not be read (recorded).
    Nothing,
}

/// Gives back the frame of `page` if it is resident and the kernel holds
/// nothing of it (the program dropped it: a removal event said so, or a
/// sweep found its page-table entries empty, `reclaim/unheard.rs`): its
/// slot's holes get zeroed pages (nothing of the page is anywhere), the
/// frame is freed, the page is absent, counted in `removed_by_program`.
/// The caller holds the page's lock, so the checks and the give-back see
/// one state.
pub(crate) fn give_back_if_emptied(core: &Core, r: &RegionInner, page: usize) -> Emptied {
    let PageState::Resident(f) = r.state(page) else {
        return Emptied::Nothing;
    };
    if r.dying() {
        return Emptied::Nothing;
    }
    let (addr, len) = (r.page_addr(page), r.page_size.bytes());
    match is_empty(core, addr, len) {
        Ok(true) => {}
        Ok(false) => return Emptied::HoldsData,
        Err(source) => {
            core.record(FaultError::Move { addr, source });
            return Emptied::Nothing;
        }
    }
    let slot = core.pool.slot_addr(f);
    // SAFETY: the page is resident under its lock (caller) and its frame's
    // slot is the frame's alone; the region range holds nothing (just
    // checked under the lock), so the move has nothing to carry: it only
    // makes sure, as for any gather, that no page of the frame is left
    // behind. Nothing references either range.
    let moved = unsafe { move_range(core, slot, addr, len, Holes::Allow, false) };
    let whole = moved
        .map_err(|e| e.into_sys(addr, len))
        .and_then(|()| fill_holes(core, slot, len));
    if let Err(source) = whole {
        core.record(FaultError::Move { addr, source });
        return Emptied::GaveBack(0);
    }
    let frame = Frame::from_parts(f, r.page_size.order());
    core.pool.set_zeroed(&frame, false);
    r.set_state(page, PageState::Absent);
    let n = frame.pages();
    core.alloc.free(frame);
    core.stats
        .removed_by_program
        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    Emptied::GaveBack(n)
}

/// Gathers page `page` of `r`, recorded in frame slot `slot`, back into the
/// slot: every 4 KiB page still in the region moves to the slot; slot pages
/// that hold nothing — the program dropped them (`MADV_DONTNEED`) after they
/// were mapped, so the kernel freed them — are refilled with the store's
/// bytes for that page (zeros for the zero store). Afterwards the frame is
/// whole in its slot, as if parked. Returns how many 4 KiB pages had to be
/// refilled. Caller holds the page's fault lock.
pub(crate) fn recollect(
    core: &Core,
    r: &RegionInner,
    page: usize,
    slot: usize,
) -> Result<usize, FaultError> {
    let addr = r.page_addr(page);
    let len = r.page_size.bytes();
    let err = |source: SysError| FaultError::Move { addr, source };
    // SAFETY: the page's lock is held (caller) and the slot belongs to its
    // frame, which only this page owns; nothing references either.
    unsafe { move_range(core, slot, addr, len, Holes::Allow, false) }
        .map_err(|e| err(e.into_sys(addr, len)))?;
    let mut has = Vec::new();
    core.pagemap
        .has_data(slot, len / PAGE_SIZE, &mut has)
        .map_err(err)?;
    let holes: Vec<usize> = (0..has.len()).filter(|&i| !has[i]).collect();
    if holes.is_empty() {
        return Ok(0);
    }
    // Fresh zeroed pages in the holes (populating touches no present page),
    // then the store's bytes over them where the store has any.
    fill_holes(core, slot, len).map_err(err)?;
    if !r.store.is_zero() {
        let mut buf = vec![0u8; len];
        // The store may touch another region (`nesting.rs`).
        let _lend = core.nesting.lend(r.id, page..page + 1);
        r.store
            .read(page as u64, &mut buf)
            .map_err(|source| FaultError::Store { addr, source })?;
        for &i in &holes {
            let at = i * PAGE_SIZE;
            // SAFETY: `slot + at` is a populated page of the frame this
            // page owns under its lock; nobody else reads or writes it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    buf[at..].as_ptr(),
                    (slot + at) as *mut u8,
                    PAGE_SIZE,
                );
            }
        }
    }
    core.stats
        .refaulted_dropped
        .fetch_add(holes.len() as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(holes.len())
}

/// Parks resident `page` of `r` (frame `f`): moves it out to its frame's
/// slot; if the program dropped part of it, gathers what is left and refills
/// the holes ([`recollect`]). On success the page is recorded parked; on
/// failure it stays resident and the cause is returned. The caller holds
/// the page's lock.
pub(crate) fn park(core: &Core, r: &RegionInner, page: usize, f: u32) -> Result<(), FaultError> {
    let slot = core.pool.slot_addr(f);
    let addr = r.page_addr(page);
    // SAFETY: the page is resident under its lock and its frame's slot is
    // the hole it left; faultline holds no reference into either.
    if unsafe { move_out(core, slot, addr, r.page_size.bytes()) }.is_err() {
        // Whatever the refusal, gather: reporting a move refused with
        // `EAGAIN` for the whole deadline without trying this made the
        // in-thread store-backed oracle's flush fail (seed 5109 of a loaded
        // loop, 2026-11-27); with it, 102 loaded runs passed before.
        recollect(core, r, page, slot)?;
    }
    fingerprint_if_protected(core, r, page, f);
    r.set_state(page, PageState::Parked(f));
    Ok(())
}

/// Gives `page`, just moved out of the region into frame `f`'s slot (whole
/// there) and still recorded resident in `f`, the fingerprint its
/// write-protected fill did not take (`fault/unit.rs`), if it is marked
/// protected: its bytes are then the store's copy — a first write waits for
/// the page's lock, which the caller has held throughout, and a part the
/// program dropped was refilled from the store ([`recollect`]). Called
/// before the state change that clears the mark (`RegionInner::set_state`:
/// parked or moved to another frame, the page is unprotected); with the
/// fingerprint it still counts clean (`crate::dirty`). The caller holds the
/// page's lock.
pub(crate) fn fingerprint_if_protected(core: &Core, r: &RegionInner, page: usize, f: u32) {
    if !r.is_protected(page) || r.fingerprint(page).is_some() {
        return;
    }
    let mut frame = Frame::from_parts(f, r.page_size.order());
    // SAFETY: the page is out of the region in `f`'s slot, whole, under its
    // lock (the caller's): nobody else reads or writes the frame.
    let bytes = unsafe { core.pool.bytes_mut(&mut frame) };
    r.set_fingerprint(page, crate::dirty::fingerprint(bytes));
}

/// Parks the run of resident 4 KiB pages from `page` whose frames follow
/// its own in the same part of the pool (a read-ahead or fault-around run:
/// [`crate::frame::FramePools::same_part`]) with one
/// move: one TLB flush for the run where parking each flushes once a page
/// (on this VM a flush that reaches another CPU costs an IPI, ~25 µs). At
/// most `max` pages; `page`'s lock is held (its index in `held`), the
/// others' are only tried (`RegionInner::lock_run`: each page checked again
/// under its lock; the locks taken go to `guards`, their indices to
/// `held`). Pinned pages and pages the kernel holds end the run. Returns
/// the pages parked: 0 if there is no run of two, or the move failed
/// (nothing moved, or the run was left split: the caller takes the page
/// alone, which gathers whatever is where).
pub(crate) fn park_run<'a>(
    core: &'a Core,
    r: &RegionInner,
    page: usize,
    max: usize,
    held: &mut Vec<usize>,
    guards: &mut Vec<crate::locks::FaultGuard<'a>>,
) -> usize {
    if r.page_size != crate::config::PageSize::Base4K || r.dying() {
        return 0;
    }
    let PageState::Resident(f) = r.state(page) else {
        return 0;
    };
    let n = r.lock_run(&core.locks, page, max, held, guards, |p| {
        let fp = f + (p - page) as u32;
        r.state(p) == PageState::Resident(fp)
            && core.alloc.same_part(f, fp)
            && !r.pins.contains(p)
            && !r.held.contains(p)
            // A protected page is the store's copy (`crate::dirty`): reclaim
            // drops it and write-back passes it over; parked it would lose
            // its protection, and with it (it has no fingerprint) count
            // dirty.
            && !r.is_protected(p)
    });
    if n < 2 {
        return 0;
    }
    let (slot, addr) = (core.pool.slot_addr(f), r.page_addr(page));
    // SAFETY: the pages are resident in consecutive frames under their
    // locks (held, each checked under its own), their frames' slots are
    // the holes they left, and faultline holds no reference into either
    // range.
    let moved = unsafe {
        move_back(
            core,
            slot,
            addr,
            n * PAGE_SIZE,
            Holes::Forbid,
            Patience::Brief,
        )
    };
    if moved.is_err() {
        return 0;
    }
    for i in 0..n {
        r.set_state(page + i, PageState::Parked(f + i as u32));
    }
    n
}

/// [`park`] that leaves a page the kernel will not move out where it is,
/// retrying with `patience` ([`Patience::Brief`] for reclaim, which may
/// as well pass the page over; [`Patience::UntilBusy`] for write-back):
/// [`TryPark::Held`] when the kernel's word was `EBUSY` (the page is
/// shared or pinned elsewhere: [`MoveError::is_busy`]), [`TryPark::Busy`]
/// when it kept answering `EAGAIN` for a brief patience (otherwise the page
/// is gathered, as [`park`] does). The caller holds the page's lock.
pub(crate) fn try_park(
    core: &Core,
    r: &RegionInner,
    page: usize,
    f: u32,
    patience: Patience,
) -> Result<TryPark, FaultError> {
    let slot = core.pool.slot_addr(f);
    let addr = r.page_addr(page);
    let len = r.page_size.bytes();
    // SAFETY: as in `park`.
    match unsafe { move_back(core, slot, addr, len, Holes::Forbid, patience) } {
        Ok(()) => {}
        Err(e) if e.is_busy() => return Ok(TryPark::Held),
        Err(e) if e.is_held() && patience == Patience::Brief => return Ok(TryPark::Busy),
        // As `park`: gather, whatever the refusal.
        Err(_) => {
            recollect(core, r, page, slot)?;
        }
    }
    fingerprint_if_protected(core, r, page, f);
    r.set_state(page, PageState::Parked(f));
    Ok(TryPark::Parked)
}

/// How a [`try_park`] ended when nothing failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TryPark {
    /// The page is parked.
    Parked,
    /// The kernel answered `EBUSY` (the move gives up at the first): the
    /// page is held elsewhere (shared with a child, pinned) and may stay
    /// so, or for a moment (a large folio not split just then); it is
    /// resident.
    Held,
    /// The kernel refused for the moment; the page is resident.
    Busy,
}

/// Moves parked `page` of `r` (frame `f`) back into the region: the
/// inverse of [`park`]. On success the page is recorded resident. If
/// nothing moved, it stays parked (its data safe in its frame) and the
/// error is returned; if the move was left split, it is recorded resident
/// and the next fault gathers it ([`recollect`]). The caller holds the
/// page's lock.
pub(crate) fn unpark(core: &Core, r: &RegionInner, page: usize, f: u32) -> Result<(), FaultError> {
    unpark_run(core, r, page, f, 1)
}

/// [`unpark`] for the `n` parked pages from `page`, in consecutive frames
/// from `f` (4 KiB pages when `n > 1`): one move for the run — one TLB
/// flush where unparking each costs a copy or a move a page. A run short
/// enough to go in by copy under the copy fill models ([`super::by_copy`],
/// as a fault's unit that short does) is unparked page by page: every page
/// is tried, and the first error returned. The caller holds every page's
/// lock.
pub(crate) fn unpark_run(
    core: &Core,
    r: &RegionInner,
    page: usize,
    f: u32,
    n: usize,
) -> Result<(), FaultError> {
    debug_assert!(
        n == 1 || r.page_size.order() == 0,
        "runs are of 4 KiB pages"
    );
    let addr = r.page_addr(page);
    let len = n * r.page_size.bytes();
    if n > 1 && super::by_copy(core, r, len) {
        let mut first = Ok(());
        for i in 0..n {
            let one = unpark_run(core, r, page + i, f + i as u32, 1);
            first = first.and(one);
        }
        return first;
    }
    let frame = Frame::from_parts(f, r.page_size.order());
    drop_empty_page_table(core, r, addr, len);
    let set = |state: fn(u32) -> PageState| {
        (0..n).for_each(|i| r.set_state(page + i, state(f + i as u32)));
    };
    set(PageState::Resident);
    // SAFETY: parked pages' frames are whole in their slots and the pages
    // are holes, under the pages' locks; nothing references either.
    let put = unsafe {
        if super::by_copy(core, r, len) {
            // Unprotected: a parked page's bytes may differ from the
            // store's (only its hash at eviction tells).
            super::copy_in(core, addr, &frame, len, false).map(|_| ())
        } else {
            move_in(core, addr, core.pool.slot_addr(f), len)
        }
    };
    match put {
        Ok(()) => Ok(()),
        Err(e) => {
            if !matches!(e, MoveError::Split { .. }) {
                set(PageState::Parked);
            }
            Err(FaultError::Move {
                addr,
                source: e.into_sys(addr, len),
            })
        }
    }
}

/// Before a move of 2 MiB or more into `[addr, addr + len)`: a fault on this
/// non-THP range allocated a page table under the PMD, and with it there MOVE
/// would split a huge frame into 512 pages. `MADV_DONTNEED` on the (empty)
/// range frees it (`CONFIG_PT_RECLAIM`). The caller holds the range's locks
/// and no page of it is mapped (absent or parked).
pub(crate) fn drop_empty_page_table(core: &Core, r: &RegionInner, addr: usize, len: usize) {
    if len < HUGE_PAGE_SIZE {
        return;
    }
    // Only over a range with no data: a page-table drop over data would
    // discard it.
    if !is_empty(core, addr, len).unwrap_or(false) {
        return;
    }
    // SAFETY: nothing is mapped in the range (just checked, and nothing
    // faultline does maps it while the caller holds its lock): no data and
    // no reference can be in it.
    let dropped = core
        .own_discards
        .run(addr, addr + len, || unsafe { r.map.discard(addr, len) });
    if dropped.is_ok() {
        Stats::bump(&core.stats.pt_discards);
    }
}
