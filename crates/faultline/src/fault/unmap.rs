//! The program unmapped part of a region itself: `UFFD_EVENT_UNMAP`.
//!
//! `munmap`, `mremap` moving pages away, or `mmap(MAP_FIXED)` over a region
//! take the range away from faultline; the kernel reports it
//! (`UFFD_FEATURE_EVENT_UNMAP`) and the unmapping thread waits until a
//! worker has read the event. From then on the range may hold another
//! mapping, the program's or another region's: faultline must never touch
//! it again (before this, dropping the `Region` later moved pages out of it
//! and unmapped it, wiping the new mapping).
//!
//! For each region page in use that the range touches (and each page it
//! cuts), under its fault lock, faultline gives up the page's frame: the slot is repopulated (the frame's physical
//! pages went with the range, were freed, or — for what is left of a 2 MiB
//! page the program unmapped only part of — stay in the region as the
//! program's own memory) and the frame freed. A parked page's data in the
//! unmapped part is thrown away with it; its part left in the region is
//! moved back there first, so what the program kept still reads its data.
//! The page becomes [`PageState::Gone`] for good: no longer reclaimed,
//! migrated or written back, and a fault on a hole left in it is refused
//! (SIGBUS, with the cause). The range is recorded in the region's mapping,
//! which never unmaps or unregisters it.
//!
//! Locks: the region table's snapshot (no lock), then each page's fault
//! lock, one at a time.

use crate::core::Core;
use crate::frame::Frame;
use crate::pagemove::{self, Holes};
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use faultline_sys::PAGE_SIZE;

/// Handles `UFFD_EVENT_UNMAP` for `[start, end)`, read when the next
/// region id was `stamp`. Regions mapped after the read (id ≥ `stamp`) are
/// left alone: the unmapping thread was blocked until the read, so a region
/// it maps afterwards in the freed range (after dropping the old one) is
/// new, not what was unmapped. (A region mapped by another thread *before*
/// the read cannot lie in the range: the old region still covers it, and
/// `Manager::map` never places a region over another.)
pub(crate) fn unmapped(core: &Core, start: usize, end: usize, stamp: u64) {
    // Only the regions the range overlaps: O(log n) to find, not a walk of
    // the table per event.
    let snap = core.table.snapshot();
    for r in snap.overlapping(start, end) {
        if r.id >= stamp {
            continue;
        }
        let (s, e) = (start.max(r.start()), end.min(r.end()));
        r.map.mark_gone(s, e);
        for page in pages_to_give_up(r, s, e) {
            let (domain, key) = r.lock_key(page);
            let _g = core.locks.lock(domain, key);
            give_up(core, r, page, s, e);
        }
        // Threads that faulted in the range before it went retry and get
        // the kernel's answer for an unmapped address.
        let _ = core.uffd.wake(s, e - s);
    }
}

/// The pages of `r` that `[s, e)` concerns: those in use, and the pages it
/// cuts (a hole in a 2 MiB page). An absent page wholly inside stays
/// absent: its range is registered no more, so no fault can come for it,
/// and marking it would cost page-state memory for address space nobody
/// uses (a terabyte region unmapped whole).
fn pages_to_give_up(r: &RegionInner, s: usize, e: usize) -> Vec<usize> {
    let (first, last) = (r.page_of(s), r.page_of(e - 1));
    let mut pages: Vec<usize> = r.used_pages(first..last + 1).collect();
    let cut = |p: usize| r.page_addr(p) < s || r.page_addr(p) + r.page_size.bytes() > e;
    for p in [first, last] {
        if cut(p) && !pages.contains(&p) {
            pages.push(p);
        }
    }
    pages
}

/// Gives up `page`'s frame (see the module docs); caller holds its lock.
fn give_up(core: &Core, r: &RegionInner, page: usize, s: usize, e: usize) {
    let f = match r.state(page) {
        PageState::Resident(f) => f,
        PageState::Parked(f) => {
            hand_back_rest(core, r, page, f, s, e);
            f
        }
        PageState::Absent | PageState::Poisoned | PageState::Gone => {
            r.set_state(page, PageState::Gone);
            return;
        }
    };
    // Gone first: the state change clears the frame's fingerprint and
    // protection mark, which must not reach the frame once another page
    // may have it (freed, it can be taken and filled at once).
    r.set_state(page, PageState::Gone);
    pagemove::free_whole(core, Frame::from_parts(f, r.page_size.order()));
    Stats::bump(&core.stats.unmapped_by_program);
}

/// Moves the 4 KiB pages of parked `page` (frame `f`) that lie outside the
/// unmapped `[s, e)` from the frame's slot back into the region, where the
/// program keeps them as its own memory.
fn hand_back_rest(core: &Core, r: &RegionInner, page: usize, f: u32, s: usize, e: usize) {
    let addr = r.page_addr(page);
    let slot = core.pool.slot_addr(f);
    for (lo, hi) in [(addr, s), (e, addr + r.page_size.bytes())] {
        if lo >= hi {
            continue;
        }
        let off = lo - addr;
        // SAFETY: `[lo, hi)` is the part of the page still mapped in the
        // region (a hole: the page is parked), under the page's lock; the
        // slot range holds the frame's data. Nothing references either.
        let moved =
            unsafe { pagemove::move_range(core, lo, slot + off, hi - lo, Holes::Forbid, true) };
        if let Err(err) = moved {
            core.record(crate::error::FaultError::Move {
                addr: lo,
                source: err.into_sys(lo, hi - lo),
            });
        }
    }
    debug_assert!(s % PAGE_SIZE == 0 && e % PAGE_SIZE == 0);
}
