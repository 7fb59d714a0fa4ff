//! Frames of zero-store pages the program dropped itself when nobody heard
//! it: no removal event reports the program's `MADV_DONTNEED` (or an
//! `MADV_FREE` the kernel acted on) where `Config::hears_removals` is false
//! — the default with workers (`FillModel::CopyProtected`), or
//! `program_removals` off. A store-backed page with such a hole is found by
//! the clock hand when it parks the page. The hand never walks the zero
//! store's regions (there is nothing to write them to), so a dropped zero
//! page would keep its frame until the program touched it again: forever,
//! for memory a program gave back, and a budget of such frames would fail
//! the next fault. When a reclaim pass frees less than it wants, and before
//! a fault that found no frame could be refused, [`sweep`]
//! looks for resident pages of zero-store regions with nothing in the page
//! tables ([`faultline_sys::mem::PageMap::has_data`]: not mapped, not in
//! swap, not migrating) and gives their frames back as the removal event's
//! handler does (`pagemove::give_back_if_emptied`: under the page's lock,
//! checked again there; the page reads zeros when next touched).
//!
//! A sweep runs at most once per `drop_rechecks::SWEEP_EVERY` (50 ms): a
//! budget full of zero pages the program still uses would otherwise pay a
//! sweep per fault.
//!
//! Locks: each candidate page's fault lock, only tried (a reclaiming worker
//! holds the lock of the page it faults on: such a page is skipped).

use crate::core::Core;
use crate::pagemove::{self, Emptied};
use crate::region::RegionInner;
use faultline_sys::PAGE_SIZE;

/// 4 KiB pages whose page-table entries one read covers.
const WINDOW: usize = 512;

/// When a sweep runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum When {
    /// Unless one ran within `SWEEP_EVERY` (a reclaim pass that fell
    /// short).
    Due,
    /// Now (a fault that found no frame after a pass and saw no sweep
    /// since it began looking, before it would be refused).
    Now,
}

/// Gives back the frames of resident zero-store pages the program emptied
/// unheard, until `want` 4 KiB frames are free of them or every such page
/// was looked at; returns the 4 KiB frames given back. Does nothing where
/// removals are heard, or (`When::Due`) within `SWEEP_EVERY` of the last
/// sweep.
pub(super) fn sweep(core: &Core, want: usize, when: When) -> usize {
    if want == 0 || core.config.hears_removals() {
        return 0;
    }
    if !core.sweeps.claim() {
        if when == When::Due {
            return 0;
        }
        core.sweeps.start_anyway();
    }
    let snap = core.table.snapshot();
    let mut freed = 0;
    let mut data = Vec::new();
    for r in snap.iter() {
        if !r.store.is_zero() || r.dying() {
            continue;
        }
        let per_page = r.page_size.bytes() / PAGE_SIZE;
        // Windows of `WINDOW` 4 KiB pages (one 2 MiB page, or 512 small
        // ones): one read of the page tables for the pages in use there.
        let pages_per_window = (WINDOW / per_page).max(1);
        let mut next = r.next_used(0);
        while let Some(first) = next {
            if freed >= want || core.is_stopping() {
                return freed;
            }
            let window = first / pages_per_window * pages_per_window;
            let end = (window + pages_per_window).min(r.pages());
            let start_addr = r.page_addr(window);
            let small = (end - window) * per_page;
            if core.pagemap.has_data(start_addr, small, &mut data).is_err() {
                // The page tables cannot be read: nothing to go on.
                return freed;
            }
            for page in r.used_pages(window..end) {
                let at = (page - window) * per_page;
                if data[at..at + per_page].iter().any(|&d| d) {
                    continue;
                }
                freed += give_back_unheard(core, r, page);
            }
            next = r.next_used(end);
        }
    }
    freed
}

/// Gives back `page`'s frame if it is resident and the kernel holds
/// nothing of it, under its lock (only tried); returns the 4 KiB frames
/// given back.
fn give_back_unheard(core: &Core, r: &RegionInner, page: usize) -> usize {
    let (domain, key) = r.lock_key(page);
    let Some(_guard) = core.locks.try_lock(domain, key) else {
        return 0;
    };
    match pagemove::give_back_if_emptied(core, r, page) {
        Emptied::GaveBack(n) => n,
        Emptied::HoldsData | Emptied::Nothing => 0,
    }
}
