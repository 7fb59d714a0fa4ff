//! The program dropped pages of a region itself: `UFFD_EVENT_REMOVE`.
//!
//! `MADV_DONTNEED` (or `MADV_FREE`) on region memory: the kernel reports
//! the range before it zaps the pages (with `MADV_FREE` it zaps nothing
//! until memory is short), and the calling thread waits only until the
//! event is read, so the zap runs alongside this handler and the program
//! may write the range again before the handler is done. What the range
//! reads afterwards is what `Region::discard(.., Discard::KeepStore)`
//! gives: the store's copy (zeros for the zero store); writes not yet
//! written back are dropped, as `MADV_DONTNEED` does to a private file
//! mapping. A page some of whose 4 KiB parts the kernel zapped is gathered
//! back and the holes refilled from the store when next touched or
//! reclaimed (`pagemove::recollect`); this handler gives frames back at
//! once and drops what the zap does not reach, never data the program may
//! have written after its call:
//!
//! - a *parked* page (the zap does not reach it) whose frame was last
//!   moved into the region before the event was read (`removals.rs`: the
//!   map clock) is dropped: wholly inside the range, its frame is freed
//!   and the page is absent; a 2 MiB page the range cuts has the cut part
//!   of its frame reset to the store's bytes (zeros). A fault on such a
//!   page before the handler gets there drops it first ([`settle`]). A
//!   page mapped since may hold a later write: left alone.
//! - a *resident* page once the kernel's zap has emptied the removed part
//!   (nothing of it is anywhere then): the frame is freed (the cut part of
//!   a 2 MiB page is gathered back from the store). Until then it is left;
//!   idle workers look again for up to [`PATIENCE`] ([`Retry`]); a page
//!   still not emptied (`MADV_FREE`, a racing remap) is left to the fault
//!   path.
//!
//! faultline's own `MADV_DONTNEED` calls are skipped (`own_remove.rs`);
//! handled as the program's they would be harmless by the rules above, only
//! wasted work.
//!
//! Locks: the region table's snapshot (no lock), then each page's fault
//! lock, one at a time (the removals' leaf locks under it).

use crate::core::Core;
use crate::error::FaultError;
use crate::frame::{Frame, FrameAllocator};
use crate::pagemove::{self, Holes};
use crate::region::{PageState, RegionInner};
use crate::removals::{Removal, Retry};
use faultline_sys::PAGE_SIZE;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long idle workers look again at resident pages the kernel has not
/// zapped yet.
const PATIENCE: Duration = Duration::from_millis(100);

/// Between two looks.
const AGAIN: Duration = Duration::from_micros(200);

/// Handles `UFFD_EVENT_REMOVE` for `[start, end)`, read when the next
/// region id was `stamp` (a region mapped after the read is new: left
/// alone, as in `unmap.rs`).
pub(crate) fn removed(core: &Core, start: usize, end: usize, stamp: u64) {
    // None: faultline's own call (`own_remove.rs`).
    let Some(rm) = core.removals.begin(start, end) else {
        return;
    };
    let snap = core.table.snapshot();
    let until = Instant::now() + PATIENCE;
    let mut later = Vec::new();
    for r in snap.overlapping(start, end) {
        if r.id >= stamp {
            continue;
        }
        let (first, last) = (
            r.page_of(start.max(r.start())),
            r.page_of(end.min(r.end()) - 1),
        );
        let mut pages: Vec<usize> = r.used_pages(first..last + 1).collect();
        pages.retain(|&page| !try_page(core, r, &rm, page));
        if !pages.is_empty() {
            later.push(Retry {
                removal: Arc::clone(&rm),
                region: r.id,
                pages,
                next: Instant::now() + AGAIN,
                until,
            });
        }
    }
    if later.is_empty() {
        core.removals.end(&rm);
        return;
    }
    // Counted before any is queued: the last to finish ends the removal.
    rm.looks.store(later.len(), Ordering::Relaxed);
    for t in later {
        core.removals.retry_later(t);
    }
}

/// Takes one due second look, if any, and makes it (see the module docs).
/// Returns whether there was one.
pub(super) fn retry(core: &Core) -> bool {
    let Some(mut t) = core.removals.due_retry() else {
        return false;
    };
    let snap = core.table.snapshot();
    let region = snap.iter().find(|r| r.id == t.region);
    if let Some(r) = region {
        t.pages.retain(|&page| !try_page(core, r, &t.removal, page));
    }
    if region.is_none() || t.pages.is_empty() || Instant::now() > t.until {
        // AcqRel: the last look to finish (of all the removal's regions)
        // sees the others' decrements and ends it.
        if t.removal.looks.fetch_sub(1, Ordering::AcqRel) == 1 {
            core.removals.end(&t.removal);
        }
    } else {
        t.next = Instant::now() + AGAIN;
        core.removals.retry_later(t);
    }
    true
}

/// Drops `page` of `r` for the pending removals over it, before a fault
/// serves it: a parked page mapped before their events were read (see the
/// module docs). Caller holds the page's lock.
pub(super) fn settle(core: &Core, r: &RegionInner, page: usize) {
    let addr = r.page_addr(page);
    for rm in core.removals.overlapping(addr, r.page_size.bytes()) {
        if let PageState::Parked(f) = r.state(page) {
            if !core.map_stamps.mapped_since(f as usize, rm.read_at) {
                drop_part(core, r, page, &rm);
            }
        }
    }
}

/// One look at `page` for removal `rm`: true when done with it (dropped, or
/// nothing to drop or to wait for), false to look again (resident, the
/// removed part not zapped yet).
fn try_page(core: &Core, r: &RegionInner, rm: &Removal, page: usize) -> bool {
    let (domain, key) = r.lock_key(page);
    let _g = core.locks.lock(domain, key);
    if r.dying() {
        return true;
    }
    match r.state(page) {
        PageState::Parked(f) => {
            if !core.map_stamps.mapped_since(f as usize, rm.read_at) {
                drop_part(core, r, page, rm);
            }
            true
        }
        PageState::Resident(_) => {
            let (lo, hi) = part(r, page, rm);
            match pagemove::is_empty(core, lo, hi - lo) {
                Ok(true) => {
                    drop_part(core, r, page, rm);
                    true
                }
                Ok(false) => false,
                Err(source) => {
                    core.record(FaultError::Move {
                        addr: r.page_addr(page),
                        source,
                    });
                    true
                }
            }
        }
        PageState::Absent | PageState::Poisoned | PageState::Gone => true,
    }
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
