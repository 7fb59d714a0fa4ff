//! Page fill: giving an in-flight frame its content before it is moved into a
//! region — zeros for anonymous memory, the store's bytes otherwise.
//!
//! Clearing uses `rep stosb` on x86_64: glibc's `memset` picks a slower path
//! on this VM, which hides the fast-string CPUID flags (DESIGN.md, "Measured
//! on this kernel"). A frame the pool knows to be zero is not cleared again.
//!
//! Invariant: after [`fill`] returns `Ok`, the frame holds exactly the page's
//! content, and the pool's zero bit for it is clear (it is about to be
//! mapped and written). No locks: the caller owns the frame.

use crate::frame::{Frame, Pool};
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

/// In which order the sub-pages of a huge frame are filled (seed 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum FillOrder {
    /// Begin to end, with non-temporal stores (the fastest clear here; the
    /// frame ends up out of cache).
    Sequential,
    /// Huang Ying's order (`process_huge_page`): the sub-pages farthest from
    /// the faulting one first, then converging left-right on it, so it is
    /// filled last and cache hot; cached stores (`rep stosb`).
    TargetLast,
    /// Sequential with non-temporal stores, except a window of
    /// [`NEIGHBOURHOOD`] sub-pages around the faulting one, filled last with
    /// cached stores (the kernel's order for small folios since 2026).
    NeighbourhoodLast,
}

impl FillOrder {
    /// Short name, as in the benchmark's rows.
    pub fn name(self) -> &'static str {
        match self {
            FillOrder::Sequential => "sequential",
            FillOrder::TargetLast => "target-last",
            FillOrder::NeighbourhoodLast => "neighbourhood-last",
        }
    }
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

/// Frames at least this large are cleared with non-temporal stores.
pub const NONTEMPORAL_MIN: usize = 64 << 10;

/// Sets every byte of `buf` to zero with the fastest routine measured here:
/// non-temporal stores for large buffers (a 2 MiB frame: 95 µs against
/// 198 µs for `rep stosb` and 204 µs for glibc's `memset` on this VM, because
/// the frame is not in cache and streaming stores skip the read-for-ownership;
/// they also leave nothing in cache, which suits a page the application will
/// touch sparsely), `rep stosb` for small ones (a 4 KiB page the application
/// is about to touch is better left in cache).
pub fn clear(buf: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if buf.len() >= NONTEMPORAL_MIN && (buf.as_ptr() as usize) % 16 == 0 && buf.len() % 16 == 0 {
        clear_nontemporal(buf);
        return;
    }
    clear_rep_stosb(buf);
}

/// Clears with SSE2 streaming stores (16 bytes each), then `sfence` so the
/// zeros are globally visible before the frame is moved.
#[cfg(target_arch = "x86_64")]
fn clear_nontemporal(buf: &mut [u8]) {
    use std::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_sfence, _mm_stream_si128};
    debug_assert!(buf.as_ptr() as usize % 16 == 0 && buf.len() % 16 == 0);
    let p = buf.as_mut_ptr().cast::<__m128i>();
    // SAFETY: SSE2 is part of the x86_64 baseline; this only makes a value.
    let zero = unsafe { _mm_setzero_si128() };
    for i in 0..buf.len() / 16 {
        // SAFETY: `p + i` lies inside `buf` (i < len / 16), is 16-byte aligned
        // (checked by the caller), and we hold `buf` exclusively. SSE2 is part
        // of the x86_64 baseline.
        unsafe { _mm_stream_si128(p.add(i), zero) };
    }
    // SAFETY: sfence only orders stores.
    unsafe { _mm_sfence() };
}

/// Clears with `rep stosb` (x86_64) or a plain fill.
pub fn clear_rep_stosb(buf: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rep stosb` writes exactly rcx = buf.len() bytes of al = 0
        // starting at rdi = buf.as_mut_ptr(), all inside `buf`, which we hold
        // exclusively; the direction flag is clear per the ABI.
        unsafe {
            std::arch::asm!(
                "rep stosb",
                inout("rcx") buf.len() => _,
                inout("rdi") buf.as_mut_ptr() => _,
                in("al") 0u8,
                options(nostack, preserves_flags)
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    buf.fill(0);
}

/// Fills `frame` with the content of page `page` of a region backed by
/// `store`; `target` is the byte offset in the frame of the faulting access,
/// and `order` the sub-page order for clearing a huge frame. A frame of
/// several pages (fault-around, read-ahead) holds consecutive pages of
/// `page_bytes` each, from `page` on. (A store fills pages in its own order.)
///
/// # Safety
/// `frame` is in flight and from `pool`, as [`Pool::bytes_mut`] requires.
pub unsafe fn fill(
    pool: &Pool,
    frame: &mut Frame,
    store: &dyn Store,
    page: u64,
    page_bytes: usize,
    target: usize,
    order: FillOrder,
) -> Result<FillSource, StoreError> {
    let zeroed = pool.is_zeroed(frame);
    // SAFETY: the frame is in flight and from this pool (our contract).
    let bytes = unsafe { pool.bytes_mut(frame) };
    let source = if store.is_zero() {
        if zeroed {
            FillSource::Prezeroed
        } else {
            clear_ordered(bytes, target, order);
            FillSource::Cleared
        }
    } else {
        store.read_pages(page, page_bytes, bytes)?;
        FillSource::Store
    };
    pool.set_zeroed(frame, false);
    Ok(source)
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

    #[test]
    fn clear_clears_exactly() {
        let mut v = vec![0xffu8; 10_000];
        clear(&mut v[3..9_001]);
        assert!(v[..3].iter().all(|&b| b == 0xff));
        assert!(v[3..9_001].iter().all(|&b| b == 0));
        assert!(v[9_001..].iter().all(|&b| b == 0xff));
        clear(&mut []);
        // Large and aligned: the non-temporal path.
        let mut big = vec![u64::MAX; (NONTEMPORAL_MIN * 2) / 8 + 2];
        // SAFETY: reinterpreting a u64 buffer as bytes; u8 has no invalid values.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(big.as_mut_ptr().cast::<u8>(), big.len() * 8) };
        clear(&mut bytes[16..16 + NONTEMPORAL_MIN * 2]);
        assert_eq!(big[0], u64::MAX);
        assert_eq!(big[1], u64::MAX);
        assert!(big[2..2 + NONTEMPORAL_MIN * 2 / 8].iter().all(|&w| w == 0));
    }
}
