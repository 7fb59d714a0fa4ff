//! The program dropped pages of a region itself: `UFFD_EVENT_REMOVE`.
//!
//! `MADV_DONTNEED` (or `MADV_FREE`) on region memory: the kernel reports
//! the range before it zaps the pages, and the calling thread waits only
//! until the event is read, so the zap runs alongside this handler and the
//! program may write the range again before the handler is done. What the
//! range reads afterwards is what `Region::discard(..,
//! Discard::KeepStore)` gives: the store's copy (zeros for the zero
//! store); writes not yet written back are dropped, as `MADV_DONTNEED`
//! does to a private file mapping. The fault path alone keeps that for
//! pages the kernel zapped (a page some of whose 4 KiB parts are holes is
//! gathered back and the holes refilled from the store when next touched
//! or reclaimed: `pagemove::recollect`); this handler gives the frames
//! back at once, and drops parked pages (the kernel's zap does not reach
//! them). Each page is dropped at most once per removal, by the first of
//! the handler, a fault on it, or a gather (`removals.rs`: settled).
//!
//! The handler, for each page in use, under its lock, unless settled:
//! - parked: dropped — wholly inside the range, its frame is freed and the
//!   page is absent; a 2 MiB page the range cuts has the cut part of its
//!   frame reset to the store's bytes (zeros) and stays parked;
//! - resident: dropped the same way once the kernel's zap has emptied the
//!   removed part of it (what is left moves back to the frame's slot and
//!   the slot's holes get zeroed pages before the frame is freed). Until
//!   then it is left: data there may be a write that came after the
//!   `madvise` returned, through a page faultline mapped again without a
//!   fault (a migration). The handler looks again for up to [`PATIENCE`];
//!   a page still not emptied is left to the fault path.
//!
//! Locks: the region table's snapshot (no lock), then each page's fault
//! lock, one at a time (the removals' leaf locks under it).

use crate::core::Core;
use crate::error::FaultError;
use crate::frame::{Frame, FrameAllocator};
use crate::pagemove::{self, Holes};
use crate::region::{PageState, RegionInner};
use crate::removals::Removal;
use faultline_sys::PAGE_SIZE;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long the handler waits for the kernel's zap of resident pages.
const PATIENCE: Duration = Duration::from_millis(100);

/// Handles `UFFD_EVENT_REMOVE` for `[start, end)`, read when the next
/// region id was `stamp` (a region mapped after the read is new: left
/// alone, as in `unmap.rs`).
pub(crate) fn removed(core: &Core, start: usize, end: usize, stamp: u64) {
    // None: faultline's own call (`own_remove.rs`).
    let Some(rm) = core.removals.begin(start, end) else {
        return;
    };
    let snap = core.table.snapshot();
    for r in snap.overlapping(start, end) {
        if r.id >= stamp {
            continue;
        }
        let (first, last) = (
            r.page_of(start.max(r.start())),
            r.page_of(end.min(r.end()) - 1),
        );
        let mut todo: Vec<usize> = r.used_pages(first..last + 1).collect();
        let until = Instant::now() + PATIENCE;
        loop {
            todo.retain(|&page| !try_page(core, r, &rm, page));
            if todo.is_empty() || Instant::now() > until {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    core.removals.end(&rm);
}

/// Settles the removals pending over `page` of `r` before a fault serves
/// it (see the module docs). Caller holds the page's lock.
pub(super) fn settle(core: &Core, r: &RegionInner, page: usize) {
    let addr = r.page_addr(page);
    for rm in core.removals.overlapping(addr, r.page_size.bytes()) {
        if rm.settle(addr) {
            drop_part(core, r, page, &rm);
        }
    }
}

/// One try at `page` for removal `rm`: true when done with it (dropped, or
/// nothing to drop), false to look again (resident, not yet zapped).
fn try_page(core: &Core, r: &RegionInner, rm: &Removal, page: usize) -> bool {
    let (domain, key) = r.lock_key(page);
    let _g = core.locks.lock(domain, key);
    let addr = r.page_addr(page);
    if r.dying() || rm.is_settled(addr) {
        return true;
    }
    if let PageState::Resident(_) = r.state(page) {
        let (lo, hi) = part(r, page, rm);
        match pagemove::is_empty(core, lo, hi - lo) {
            Ok(true) => {}
            Ok(false) => return false,
            Err(source) => {
                core.record(FaultError::Move { addr, source });
                return true;
            }
        }
    }
    if rm.settle(addr) {
        drop_part(core, r, page, rm);
    }
    true
}

/// The part of `page` of `r` that removal `rm` covers.
fn part(r: &RegionInner, page: usize, rm: &Removal) -> (usize, usize) {
    let addr = r.page_addr(page);
    (rm.start.max(addr), rm.end.min(addr + r.page_size.bytes()))
}

/// Drops the part of `page` that `rm` covers: the whole page's frame, or
/// the cut part of a 2 MiB page's. Caller holds the page's lock.
fn drop_part(core: &Core, r: &RegionInner, page: usize, rm: &Removal) {
    let (lo, hi) = part(r, page, rm);
    if hi - lo == r.page_size.bytes() {
        let n = drop_whole(core, r, page);
        core.stats
            .removed_by_program
            .fetch_add(n as u64, Ordering::Relaxed);
    } else {
        reset_cut(core, r, page, lo, hi);
    }
}

/// Gives back the frame of `page`, wholly inside the removed range; returns
/// the 4 KiB pages freed. Caller holds the page's lock.
fn drop_whole(core: &Core, r: &RegionInner, page: usize) -> usize {
    if r.dying() {
        return 0;
    }
    let f = match r.state(page) {
        PageState::Resident(f) => {
            if !gather(core, r, page, f) {
                return 0;
            }
            f
        }
        PageState::Parked(f) => f,
        PageState::Absent | PageState::Poisoned | PageState::Gone => return 0,
    };
    let frame = Frame::from_parts(f, r.page_size.order());
    core.pool.set_zeroed(&frame, false);
    r.set_state(page, PageState::Absent);
    let n = frame.pages();
    core.alloc.free(frame);
    n
}

/// Moves what of resident `page` (frame `f`) is still in the region back
/// to the frame's slot and gives the slot's holes zeroed pages: the frame
/// is whole again, its bytes no longer the page's. False (the error
/// recorded, the page left resident for the fault path to gather) if the
/// move failed.
fn gather(core: &Core, r: &RegionInner, page: usize, f: u32) -> bool {
    let (addr, len) = (r.page_addr(page), r.page_size.bytes());
    let slot = core.pool.slot_addr(f);
    // SAFETY: the page is resident under its lock (caller) and the slot is
    // its frame's, which only this page owns; nothing references either.
    let moved = unsafe { pagemove::move_range(core, slot, addr, len, Holes::Allow, false) };
    let whole = moved
        .map_err(|e| e.into_sys(addr, len))
        .and_then(|()| pagemove::fill_holes(core, slot, len));
    match whole {
        Ok(()) => true,
        Err(source) => {
            core.record(FaultError::Move { addr, source });
            false
        }
    }
}

/// Parks 2 MiB `page`, which `[s, e)` cuts, and resets the cut part of its
/// frame to the store's bytes. Caller holds the page's lock.
fn reset_cut(core: &Core, r: &RegionInner, page: usize, s: usize, e: usize) {
    if r.dying() {
        return;
    }
    let f = match r.state(page) {
        PageState::Resident(f) => match pagemove::park(core, r, page, f) {
            Ok(()) => f,
            Err(err) => return core.record(err),
        },
        PageState::Parked(f) => f,
        PageState::Absent | PageState::Poisoned | PageState::Gone => return,
    };
    let addr = r.page_addr(page);
    let (lo, hi) = (s.max(addr) - addr, e.min(addr + r.page_size.bytes()) - addr);
    debug_assert!(lo % PAGE_SIZE == 0 && hi % PAGE_SIZE == 0 && lo < hi);
    let slot = core.pool.slot_addr(f);
    let mut buf = vec![0u8; r.page_size.bytes()];
    if !r.store.is_zero() {
        // The store may touch another region (`nesting.rs`).
        let _lend = core.nesting.lend(r.id, page..page + 1);
        if let Err(source) = r.store.read(page as u64, &mut buf) {
            // The page keeps the bytes it had: the program's drop is lost,
            // its data is not.
            return core.record(FaultError::Store { addr, source });
        }
    }
    // SAFETY: the page is parked under its lock: its frame is whole in its
    // slot, which only this page owns and nothing references; `[lo, hi)`
    // lies inside the page, and `buf` is a page long.
    unsafe {
        std::ptr::copy_nonoverlapping(buf[lo..].as_ptr(), (slot + lo) as *mut u8, hi - lo);
    }
}
