//! The program dropped pages of a region itself: `UFFD_EVENT_REMOVE`.
//!
//! `MADV_DONTNEED` (or `MADV_FREE`) on region memory: the kernel reports
//! the range before it zaps the pages (with `MADV_FREE` it zaps nothing
//! until memory is short), and the calling thread waits only until the
//! event is read, so the zap runs alongside this handler and the program
//! may write the range again before the handler is done. The fault path
//! alone keeps what the pages read afterwards (a page some of whose 4 KiB
//! parts the kernel zapped is gathered back and its holes refilled from
//! the store when next touched or reclaimed: `pagemove::recollect`); this
//! handler gives back at once the frames that hold nothing any more:
//!
//! - a *resident* page wholly inside the range, once the kernel's zap has
//!   emptied it — under its lock, no 4 KiB of it in the region: nothing of
//!   the page is anywhere, so nothing the program wrote can be lost. Its
//!   slot's holes get zeroed pages, the frame is freed, the page is absent
//!   (its next touch reads the store's copy):
//!   `pagemove::give_back_if_emptied`, which the sweep for drops nobody
//!   heard shares (`reclaim/unheard.rs`). A page still mapped when the
//!   handler looks (the zap has not run yet) is looked at again by the
//!   workers for up to [`PATIENCE`] ([`Retry`]); one still mapped then
//!   (`MADV_FREE`: the program may have written it since) is left as it is.
//! - anything else is left to the fault path as before: a *parked* page
//!   keeps its bytes (the zap does not reach it, and a write the program
//!   made after its call may have been parked there since: telling the two
//!   apart needs more than this handler knows), and a 2 MiB page the range
//!   only cuts is refilled from the store where it was zapped, when next
//!   touched.
//!
//! faultline's own `MADV_DONTNEED` calls are skipped (`own_discards.rs`);
//! handled as the program's they would be harmless by the rule above (the
//! caller holds the page's lock and maps it), only wasted work.
//!
//! Locks: the region table's snapshot (no lock), then each page's fault
//! lock, one at a time (the retry queue's leaf lock apart).

use crate::core::Core;
use crate::drop_rechecks::Retry;
use crate::pagemove::{self, Emptied};
use crate::region::RegionInner;
use std::time::{Duration, Instant};

/// How long the workers look again at pages the kernel has not zapped yet.
const PATIENCE: Duration = Duration::from_millis(100);

/// Between two looks.
const AGAIN: Duration = Duration::from_micros(200);

/// Handles `UFFD_EVENT_REMOVE` for `[start, end)`, read when the next
/// region id was `stamp` (a region mapped after the read is new: left
/// alone, as in `unmap.rs`).
pub(crate) fn removed(core: &Core, start: usize, end: usize, stamp: u64) {
    if core.own_discards.claim(start, end) {
        return;
    }
    let snap = core.table.snapshot();
    for r in snap.overlapping(start, end) {
        if r.id >= stamp {
            continue;
        }
        let (first, last) = (
            r.page_of(start.max(r.start())),
            r.page_of(end.min(r.end()) - 1),
        );
        let mut pages: Vec<usize> = r.used_pages(first..last + 1).collect();
        pages.retain(|&page| !try_page(core, r, page, start, end));
        if !pages.is_empty() {
            let now = Instant::now();
            core.drop_rechecks.push(Retry {
                region: r.id,
                start,
                end,
                pages,
                next: now + AGAIN,
                until: now + PATIENCE,
            });
        }
    }
}

/// Takes one due second look, if any, and makes it (see the module docs).
/// Returns whether there was one.
pub(super) fn retry(core: &Core) -> bool {
    let Some(mut t) = core.drop_rechecks.due() else {
        return false;
    };
    let snap = core.table.snapshot();
    if let Some(r) = snap.iter().find(|r| r.id == t.region) {
        t.pages
            .retain(|&page| !try_page(core, r, page, t.start, t.end));
        if !t.pages.is_empty() && Instant::now() < t.until {
            t.next = Instant::now() + AGAIN;
            core.drop_rechecks.push(t);
        }
    }
    true
}

/// One look at `page` of `r` for the removal of `[start, end)`: true when
/// done with it (its frame given back, or nothing this handler may do),
/// false to look again (resident, still mapped).
fn try_page(core: &Core, r: &RegionInner, page: usize, start: usize, end: usize) -> bool {
    let addr = r.page_addr(page);
    let len = r.page_size.bytes();
    if addr < start || addr + len > end {
        // Cut by the range: the fault path refills the zapped part.
        return true;
    }
    let (domain, key) = r.lock_key(page);
    let _g = core.locks.lock(domain, key);
    pagemove::give_back_if_emptied(core, r, page) != Emptied::HoldsData
}
