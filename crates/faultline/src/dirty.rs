//! Dirty tracking for regions of writable stores: which pages must be
//! written back, so clean pages are not.
//!
//! Method: a *fingerprint of the store's copy* of every page that holds data,
//! a 128-bit XXH3 hash. It is taken when faultline and the store agree on
//! a page's bytes — when a fault fills the frame from the store, and when a
//! flush puts the bytes in the store — and a page is clean exactly when
//! its bytes still hash to it:
//!
//! `clean(p) ⇔ xxh3_128(bytes(p)) = fp(p)`, and `fp(p)` is set only from the
//! bytes the store holds.
//!
//! Three fills and one write take none, since it could only be hashed to be
//! found stale or thrown away, or is not needed: a *write fault's* fill
//! (`Fault::dirties`: the write lands as soon as the page is in; a stream
//! of write faults' read-ahead windows too, whose pages its writer reaches
//! next), a fill that goes in *write-protected* with workers serving faults
//! (below: its protection says clean until its first write, which makes it
//! dirty; a move out of the region that ends the protection otherwise
//! first fingerprints the page's frame,
//! `pagemove::fingerprint_if_protected`), and an *eviction's*
//! write-back (the frame is freed with its fingerprint). A page without
//! one is dirty, and its eviction writes it without a hash. The cost of a
//! wrong guess — a writer's window page that is only read, a copy that
//! was to go in protected and did not — is one needless write of that
//! page, never a lost one.
//!
//! Eviction hashes the parked frame (quiescent in its pool slot: nothing can
//! write it) and writes back only on a mismatch (the clock hand drops the
//! fingerprint of a victim so found dirty, which then waits in a batch for
//! its write without a second hash: `reclaim/evictions.rs`); `Region::flush` copies each
//! page, hashes the copy, and writes only copies that differ. A write that
//! restores a page's old bytes leaves it clean — correctly: the store already
//! holds them (if the page has a fingerprint: a protected page, below, has
//! none, and its first write makes it dirty whatever it wrote). A modified page is taken for clean only on a 128-bit hash
//! collision (probability 2^-128 per check).
//!
//! Why not `UFFD_FEATURE_WP_ASYNC` + `PAGEMAP_SCAN` alone (the method the
//! design suggests; `faultline-sys` has both, tested): faultline maps and
//! parks pages with `UFFDIO_MOVE`, and the kernel builds the moved PTE afresh
//! — writable, no uffd-wp bit (`move_present_pte`, Linux 6.18; test
//! `move_does_not_carry_written_state`). So a write between the scan that
//! re-protects a page and the move that parks it leaves no trace, and a page
//! installed by a move is writable before any `UFFDIO_WRITEPROTECT` can reach
//! it: another thread's first write in that window is invisible too. A
//! content check is needed for exactness either way, and with it the
//! write-protect bookkeeping (an ioctl per install and per park, a fault per
//! first write) would only cost; docs/design.md has the measurements.
//!
//! **Write protection** ([`crate::FillModel::CopyProtected`]): a page
//! copied in from the store with `UFFDIO_COPY_MODE_WP` for a read is, until
//! its first write, exactly the store's copy — the kernel stops that write
//! and reports it (a write-protect fault) before it lands. Such a page is
//! *protected* here, one bit per frame beside its fingerprint, and clean
//! without a hash: reclaim drops it from the region (no park, no hash, no
//! write), a flush passes it over (no park, no write), and neither parks
//! it in a run of others (`pagemove::park_run`). The bit is set only after the protected copy, under the page's
//! lock (`RegionInner::set_protected`), and cleared before the
//! write-protect fault lifts the protection (under the lock too) and on
//! every change of the page's state (`RegionInner::set_state`: a move,
//! park, unpark or drop leaves the page unprotected or gone), and when a
//! run moved out of the region by migration is put back by moves, which
//! map it writable (`migrate::move_out`). So a set bit
//! implies the kernel holds the page write-protected — the one direction
//! that matters: a page protected in the kernel but not here is parked
//! as any other, and written once if it has no fingerprint (a needless
//! write, never a lost one).
//!
//! Storage: by *frame*, not by page — a fingerprint is needed only while
//! its page holds a frame (an evicted page is refilled, and fingerprinted,
//! from the store on its next fault), so the table is sized by the frame
//! pool (16 bytes per 4 KiB frame) and address space costs nothing. The
//! region moves a page's fingerprint with its frame (migration, collapse)
//! and clears it when the page lets the frame go
//! (`RegionInner::set_state`), so a free frame has none: invariant, a
//! non-zero entry belongs to the page holding that frame. Two `AtomicU64`
//! per frame, changed only under the fault lock of the page holding it
//! (Relaxed: the lock orders them; a frame changes hands through the
//! allocator, which orders the rest). `[0, 0]` means "no fingerprint" (the
//! page is dirty until written back); a real fingerprint has bit 0 of its
//! low word forced to 1 so it is never `[0, 0]`.

use std::sync::atomic::{AtomicU64, Ordering};
use xxhash_rust::xxh3::xxh3_128;

/// The fingerprint of `bytes` (never 0).
#[inline]
pub fn fingerprint(bytes: &[u8]) -> u128 {
    xxh3_128(bytes) | 1
}

/// Per-frame fingerprints of a manager's pool. See the module docs.
#[derive(Debug)]
pub(crate) struct Fingerprints {
    words: Box<[AtomicU64]>,
    /// One bit per frame: its page is protected (see the module docs).
    protected: Box<[AtomicU64]>,
}

impl Fingerprints {
    /// `frames` frames (4 KiB frame indices), none fingerprinted. The table
    /// is allocated zeroed, so a large one (a pool with room to grow) costs
    /// untouched zero pages until frames are used.
    pub(crate) fn new(frames: usize) -> Fingerprints {
        let words: Vec<AtomicU64> = zeroed_vec(2 * frames);
        let protected: Vec<AtomicU64> = zeroed_vec(frames.div_ceil(64));
        Fingerprints {
            words: words.into_boxed_slice(),
            protected: protected.into_boxed_slice(),
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        (self.words.len() + self.protected.len()) * std::mem::size_of::<AtomicU64>()
    }

    /// Whether the page holding `frame` is write-protected and unwritten
    /// since its fill. Caller holds that page's lock.
    pub(crate) fn is_protected(&self, frame: u32) -> bool {
        let (w, bit) = (frame as usize / 64, 1u64 << (frame % 64));
        self.protected[w].load(Ordering::Relaxed) & bit != 0
    }

    /// Marks (or unmarks) the page holding `frame` protected. Caller holds
    /// that page's lock. Other frames' bits share the word: a read-modify-
    /// write (Relaxed: each bit has one writer at a time, ordered by its
    /// page's lock).
    pub(crate) fn set_protected(&self, frame: u32, on: bool) {
        let (w, bit) = (frame as usize / 64, 1u64 << (frame % 64));
        if on {
            self.protected[w].fetch_or(bit, Ordering::Relaxed);
        } else if self.protected[w].load(Ordering::Relaxed) & bit != 0 {
            self.protected[w].fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// The fingerprint of the store's copy of the page holding `frame`, if
    /// known. Caller holds that page's lock.
    pub(crate) fn get(&self, frame: u32) -> Option<u128> {
        let i = 2 * frame as usize;
        let lo = self.words[i].load(Ordering::Relaxed);
        let hi = self.words[i + 1].load(Ordering::Relaxed);
        let v = (u128::from(hi) << 64) | u128::from(lo);
        (v != 0).then_some(v)
    }

    /// Records (or forgets) the fingerprint of the store's copy of the page
    /// holding (or about to hold) `frame`. Caller holds that page's lock.
    pub(crate) fn set(&self, frame: u32, fp: Option<u128>) {
        let i = 2 * frame as usize;
        let v = fp.unwrap_or(0);
        self.words[i].store(v as u64, Ordering::Relaxed);
        self.words[i + 1].store((v >> 64) as u64, Ordering::Relaxed);
    }

    /// The page's data moved from frame `from` to frame `to`: so does its
    /// fingerprint. Caller holds the page's lock.
    pub(crate) fn moved(&self, from: u32, to: u32) {
        let fp = self.get(from);
        self.set(to, fp);
        self.set(from, None);
    }
}

/// `n` zero words from a zeroed allocation (`calloc`: fresh zero pages
/// that cost no memory until written), not a loop writing zeros.
pub(crate) fn zeroed_vec(n: usize) -> Vec<AtomicU64> {
    // `vec![0u64; n]` is allocated zeroed; `AtomicU64` has the same size,
    // alignment and bit validity as `u64`.
    let mut plain = std::mem::ManuallyDrop::new(vec![0u64; n]);
    let (ptr, len, cap) = (plain.as_mut_ptr(), plain.len(), plain.capacity());
    // SAFETY: `ptr`, `len`, `cap` come from a live `Vec<u64>` that is never
    // dropped (ManuallyDrop); `AtomicU64` has the same layout as `u64` and
    // every `u64` bit pattern is a valid `AtomicU64`, so the allocation is
    // a valid `Vec<AtomicU64>` with the same allocator layout.
    unsafe { Vec::from_raw_parts(ptr.cast::<AtomicU64>(), len, cap) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_protected_mark_is_one_frames_alone() {
        let fps = Fingerprints::new(200);
        for f in [0, 63, 64, 130, 199] {
            fps.set_protected(f, true);
        }
        for f in 0..200 {
            let want = [0, 63, 64, 130, 199].contains(&f);
            assert_eq!(fps.is_protected(f), want, "frame {f}");
        }
        fps.set_protected(64, false);
        fps.set_protected(65, false);
        assert!(!fps.is_protected(64) && !fps.is_protected(65));
        assert!(fps.is_protected(63) && fps.is_protected(130));
        assert_eq!(fps.bytes(), (400 + 4) * 8);
    }

    impl Fingerprints {
        fn is_clean(&self, frame: u32, bytes: &[u8]) -> bool {
            self.get(frame) == Some(fingerprint(bytes))
        }
    }

    #[test]
    fn clean_until_a_byte_changes() {
        let f = Fingerprints::new(4);
        let mut page = vec![7u8; 4096];
        assert!(!f.is_clean(1, &page), "no fingerprint: dirty");
        f.set(1, Some(fingerprint(&page)));
        assert!(f.is_clean(1, &page));
        assert!(!f.is_clean(2, &page), "per page");
        page[4095] ^= 1;
        assert!(!f.is_clean(1, &page));
        page[4095] ^= 1;
        assert!(f.is_clean(1, &page), "old bytes restored: clean again");
        f.moved(1, 3);
        assert!(f.is_clean(3, &page), "moves with the frame");
        assert!(!f.is_clean(1, &page));
        f.set(3, None);
        assert!(!f.is_clean(3, &page));
        assert_ne!(fingerprint(&[0u8; 4096]), 0);
    }
}
