//! Page fill: giving an in-flight frame its content before it is moved into a
//! region — zeros for anonymous memory, the store's bytes otherwise.
//!
//! Clearing uses `rep stosb` on x86_64: glibc's `memset` picks a slower path
//! on this VM, which hides the fast-string CPUID flags (docs/measurements.md, "Clearing a
//! 2 MiB frame"). A frame the pool knows to be zero is not cleared again.
//!
//! Invariant: after [`fill_zeros`], or [`fill_from_store`] returning `Ok`,
//! the frame holds exactly the page's content, and the pool's zero bit for
//! it is clear (it is about to be mapped and written). No locks: the
//! caller owns the frame.

use crate::config::FillOrder;
use crate::core::Core;
use crate::frame::FrameAllocator;
use crate::frame::{Frame, Pool};
use crate::memops::{clear, clear_rep_stosb};
use crate::stats::Stats;
use crate::store::{Store, StoreError};

/// Where a filled frame's content came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillSource {
    /// Cleared now.
    Cleared,
    /// Already zero (fresh pool memory or a pre-zeroed frame).
    Prezeroed,
    /// Read from the region's store.
    Store,
}

/// Sub-pages (4 KiB) in the window that `NeighbourhoodLast` fills last.
pub const NEIGHBOURHOOD: usize = 8;

/// The sub-page indices of a `n`-sub-page frame in `order`, for faulting
/// sub-page `target`, each with whether it is filled with cached stores.
pub fn sub_page_order(n: usize, target: usize, order: FillOrder) -> Vec<(usize, bool)> {
    let target = target.min(n.saturating_sub(1));
    match order {
        FillOrder::Sequential => (0..n).map(|i| (i, false)).collect(),
        FillOrder::TargetLast => {
            // As the kernel's process_huge_page(): first the sub-pages far
            // from the target on the longer side, then pairs closing in from
            // both sides; the target itself comes last.
            let mut out = Vec::with_capacity(n);
            let (base, l) = if 2 * target <= n {
                out.extend((2 * target..n).rev().map(|i| (i, true)));
                (0, target)
            } else {
                let base = n - 2 * (n - target);
                out.extend((0..base).map(|i| (i, true)));
                (base, n - target)
            };
            for i in 0..l {
                let left = base + i;
                let right = base + 2 * l - 1 - i;
                out.push((left, true));
                if right != left {
                    out.push((right, true));
                }
            }
            // `right` of the last pair is the target: move it last.
            if let Some(pos) = out.iter().position(|&(i, _)| i == target) {
                let t = out.remove(pos);
                out.push(t);
            }
            out
        }
        FillOrder::NeighbourhoodLast => {
            let lo = target
                .saturating_sub(NEIGHBOURHOOD / 2)
                .min(n.saturating_sub(NEIGHBOURHOOD));
            let hi = (lo + NEIGHBOURHOOD).min(n);
            let mut out: Vec<(usize, bool)> = (0..lo).chain(hi..n).map(|i| (i, false)).collect();
            out.extend((lo..hi).filter(|&i| i != target).map(|i| (i, true)));
            out.push((target, true));
            out
        }
    }
}

/// Clears `buf` (a whole number of 4 KiB sub-pages) in `order` around the
/// sub-page holding byte `target`.
pub fn clear_ordered(buf: &mut [u8], target: usize, order: FillOrder) {
    const SUB: usize = 4096;
    if order == FillOrder::Sequential || buf.len() <= SUB || buf.len() % SUB != 0 {
        clear(buf);
        return;
    }
    let n = buf.len() / SUB;
    // Runs of consecutive non-temporal sub-pages are cleared as one range.
    let plan = sub_page_order(n, target / SUB, order);
    let mut i = 0;
    while i < plan.len() {
        let (start, cached) = plan[i];
        let mut end = start + 1;
        while !cached && i + 1 < plan.len() && plan[i + 1] == (end, false) {
            end += 1;
            i += 1;
        }
        let range = &mut buf[start * SUB..end * SUB];
        if cached {
            clear_rep_stosb(range);
        } else {
            clear(range);
        }
        i += 1;
    }
}

/// Fills `frame` with zeros for a fault at byte `target` of it, clearing
/// a huge frame in `order` — unless the pool knows it is zero already.
///
/// # Safety
/// `frame` is in flight and from `pool`, as [`Pool::bytes_mut`] requires.
pub unsafe fn fill_zeros(
    pool: &Pool,
    frame: &mut Frame,
    target: usize,
    order: FillOrder,
) -> FillSource {
    let source = if pool.is_zeroed(frame) {
        FillSource::Prezeroed
    } else {
        // SAFETY: the frame is in flight and from this pool (our contract).
        let bytes = unsafe { pool.bytes_mut(frame) };
        clear_ordered(bytes, target, order);
        FillSource::Cleared
    };
    pool.set_zeroed(frame, false);
    source
}

/// Fills `frame` with pages of `page_bytes` each from page `first` of
/// `store` (a frame of several pages, a read-ahead run, holds consecutive
/// pages; a store fills them in its own order), handing each to `landed`
/// as it lands ([`Store::read_pages_each`]).
///
/// # Safety
/// `frame` is in flight and from `pool`, as [`Pool::bytes_mut`] requires.
pub unsafe fn fill_from_store(
    pool: &Pool,
    frame: &mut Frame,
    store: &dyn Store,
    first: u64,
    page_bytes: usize,
    landed: &mut dyn FnMut(usize, &[u8]),
) -> Result<(), StoreError> {
    // Not zero whatever the read does: a failed read leaves part of it.
    pool.set_zeroed(frame, false);
    // SAFETY: the frame is in flight and from this pool (our contract).
    let bytes = unsafe { pool.bytes_mut(frame) };
    store.read_pages_each(first, page_bytes, bytes, landed)
}

/// The zeroing worker: keeps `prezero_reserve` zeroed 2 MiB frames ready,
/// at the lowest CPU priority, leaving at least twice the reserve free in
/// the pool for faults.
pub(crate) fn run_zeroer(core: &Core) {
    let _ = faultline_sys::host::set_thread_nice(19);
    let want = core.config.prezero_reserve;
    let keep_free = 2 * want * crate::frame::PAGES_PER_HUGE;
    loop {
        {
            let mut r = core.reserve.lock();
            while !core.is_stopping() && (r.len() >= want || core.alloc.free_hint() < keep_free) {
                // Timed: free memory may come back without a notify.
                core.reserve_cv
                    .wait_for(&mut r, std::time::Duration::from_millis(20));
            }
        }
        if core.is_stopping() {
            return;
        }
        // Relaxed: a fault that finds the pool empty because this thread
        // took the frame sees it, through the allocator's zone lock (taken
        // after this store here, before the fault's failed allocation).
        core.zeroing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let Some(mut f) = core.alloc.alloc(crate::frame::HUGE_ORDER) else {
            core.zeroing
                .store(false, std::sync::atomic::Ordering::Release);
            continue;
        };
        if !core.pool.is_zeroed(&f) {
            // SAFETY: `f` was just allocated: this thread owns it.
            crate::memops::clear(unsafe { core.pool.bytes_mut(&mut f) });
            core.pool.set_zeroed(&f, true);
        }
        Stats::bump(&core.stats.prezeroed_made);
        core.reserve.lock().push(f);
        // Release: pairs with the Acquire load in `Core::await_zeroing`.
        core.zeroing
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_cover_every_sub_page_once_target_last() {
        for order in [
            FillOrder::Sequential,
            FillOrder::TargetLast,
            FillOrder::NeighbourhoodLast,
        ] {
            for target in [0, 1, 100, 255, 256, 300, 510, 511] {
                let plan = sub_page_order(512, target, order);
                let mut seen: Vec<usize> = plan.iter().map(|&(i, _)| i).collect();
                seen.sort_unstable();
                assert_eq!(
                    seen,
                    (0..512).collect::<Vec<_>>(),
                    "{order:?} target {target}"
                );
                if order != FillOrder::Sequential {
                    assert_eq!(
                        plan.last().map(|p| p.0),
                        Some(target),
                        "{order:?} target {target}"
                    );
                }
            }
        }
        // Target-last converges: the last few are the target's neighbours.
        let plan = sub_page_order(512, 100, FillOrder::TargetLast);
        let tail: Vec<usize> = plan[plan.len() - 3..].iter().map(|p| p.0).collect();
        assert_eq!(tail, vec![101, 99, 100]);
    }

    #[test]
    fn clear_ordered_clears_everything() {
        for order in [
            FillOrder::Sequential,
            FillOrder::TargetLast,
            FillOrder::NeighbourhoodLast,
        ] {
            let mut v = vec![u64::MAX; 64 * 4096 / 8];
            // SAFETY: reinterpreting u64s as bytes.
            let b =
                unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 8) };
            clear_ordered(b, 17 * 4096 + 5, order);
            assert!(v.iter().all(|&w| w == 0), "{order:?}");
        }
    }
}
