//! A staging buffer for long direct reads: one 2 MiB transparent huge
//! page, physically contiguous, in two 1 MiB halves. A direct read of many
//! pages goes into a free half and is copied into its frames from there.
//!
//! Why a copy pays: the virtio disk of this project's machine costs about
//! as much per scatter segment as per byte. Frames are 4 KiB pages that
//! `UFFDIO_MOVE` scatters in physical memory (a move that splits a huge
//! page makes the rest of it copy-on-write, and the copies land anywhere),
//! so a 1 MiB read into frames is ~100-250 segments; into this buffer it is
//! one. Measured (docs/measurements.md, "Staged direct reads"): 1 MiB `O_DIRECT`
//! reads at 2 at once, 1.3-1.7 GB/s into scattered 4 KiB pages, 2.9 GB/s
//! into a huge page followed by the copy.
//!
//! The buffer is made on first use and only where transparent huge pages
//! can be had; it lives as long as its store, and the budget pays for it
//! from then on (`Store::own_memory`, which the fault path reads after
//! each store read). Invariant: a half is written only by the thread
//! holding its lock (the kernel writes it during that thread's `pread`).
//! Locks: each half's mutex, a leaf, only ever tried.

use faultline_sys::mem::{Advice, Mapping};
use faultline_sys::HUGE_PAGE_SIZE;
use parking_lot::{Mutex, MutexGuard};
use std::sync::OnceLock;

/// Bytes of the staging page.
pub(super) const BYTES: usize = HUGE_PAGE_SIZE;

/// Bytes of one half: the longest read staged.
pub(super) const HALF: usize = BYTES / 2;

/// The shortest read staged: below it a read has few segments anyway.
pub(super) const MIN: usize = 64 << 10;

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Staging {
    /// The huge page, once asked for; `None` inside if it could not be had.
    map: OnceLock<Option<Mapping>>,
    halves: [Mutex<()>; 2],
}

/// A half held for one read: its first `len` bytes.
pub(super) struct Half<'a> {
    ptr: *mut u8,
    len: usize,
    _held: MutexGuard<'a, ()>,
}

impl Staging {
    /// Bytes it holds: the page once made, else nothing.
    pub(super) fn bytes(&self) -> usize {
        match self.map.get() {
            Some(Some(_)) => BYTES,
            _ => 0,
        }
    }

    /// A free half for a read of `len` bytes, if the read is long enough to
    /// gain from one, short enough to fit, and a half is free now.
    pub(super) fn take(&self, len: usize) -> Option<Half<'_>> {
        if !(MIN..=HALF).contains(&len) {
            return None;
        }
        let map = self.map.get_or_init(huge_page).as_ref()?;
        let (i, held) = self
            .halves
            .iter()
            .enumerate()
            .find_map(|(i, h)| h.try_lock().map(|g| (i, g)))?;
        Some(Half {
            // In bounds: the mapping is two halves long.
            ptr: map.as_ptr().wrapping_add(i * HALF),
            len,
            _held: held,
        })
    }
}

impl Half<'_> {
    /// The half's first `len` bytes.
    pub(super) fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr..ptr + len` lies in the staging mapping (len <= HALF),
        // which outlives `self` (borrowed from the `Staging` that owns it);
        // the held lock makes this thread its only user, and no other
        // mapping or reference aliases it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// The 2 MiB staging page: aligned, `MADV_HUGEPAGE`, populated; `None`
/// where huge pages are off or any step fails (reads then go straight into
/// the frames, as without staging).
fn huge_page() -> Option<Mapping> {
    if !faultline_sys::host::thp_mode().usable() {
        return None;
    }
    let map = Mapping::anonymous(BYTES, HUGE_PAGE_SIZE).ok()?;
    map.advise(map.addr(), BYTES, Advice::HugePage).ok()?;
    map.advise(map.addr(), BYTES, Advice::PopulateWrite).ok()?;
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_are_taken_once_and_only_for_long_reads() {
        let s = Staging::default();
        assert!(s.take(MIN - 4096).is_none(), "short read");
        assert!(s.take(HALF + 4096).is_none(), "longer than a half");
        if !faultline_sys::host::thp_mode().usable() {
            assert!(s.take(HALF).is_none(), "no huge page: reads go direct");
            assert_eq!(s.bytes(), 0);
            return;
        }
        assert_eq!(s.bytes(), 0, "nothing made before a long read");
        let mut a = s.take(HALF).expect("first half");
        assert_eq!(s.bytes(), BYTES, "the page, once made");
        let mut b = s.take(MIN).expect("second half");
        assert!(s.take(MIN).is_none(), "both held");
        a.bytes().fill(1);
        b.bytes().fill(2);
        assert!(a.bytes().iter().all(|&x| x == 1), "halves do not overlap");
        drop(a);
        assert_eq!(s.take(HALF).map(|mut h| h.bytes().len()), Some(HALF));
    }
}
