//! Dirty tracking for regions of writable stores: which pages must be
//! written back, so clean pages are not.
//!
//! Method: a *fingerprint of the store's copy* of every page that holds data,
//! a 128-bit XXH3 hash. It is taken whenever faultline and the store agree on
//! a page's bytes — when a fault fills the frame from the store, and when a
//! write-back puts the bytes in the store — and a page is clean exactly when
//! its bytes still hash to it:
//!
//! `clean(p) ⇔ xxh3_128(bytes(p)) = fp(p)`, and `fp(p)` is set only from the
//! bytes the store holds.
//!
//! Eviction hashes the parked frame (quiescent in its pool slot: nothing can
//! write it) and writes back only on a mismatch; `Region::flush` copies each
//! page, hashes the copy, and writes only copies that differ. A write that
//! restores a page's old bytes leaves it clean — correctly: the store already
//! holds them. A modified page is taken for clean only on a 128-bit hash
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
//! Storage: two `AtomicU64` per page, changed only under the page's fault
//! lock (Relaxed: the lock orders them). `[0, 0]` means "no fingerprint"
//! (the page is dirty until written back); a real fingerprint has bit 0 of
//! its low word forced to 1 so it is never `[0, 0]`.

use std::sync::atomic::{AtomicU64, Ordering};
use xxhash_rust::xxh3::xxh3_128;

/// The fingerprint of `bytes` (never 0).
#[inline]
pub fn fingerprint(bytes: &[u8]) -> u128 {
    xxh3_128(bytes) | 1
}

/// Per-page fingerprints of one region. See the module docs.
#[derive(Debug)]
pub(crate) struct Fingerprints {
    words: Box<[AtomicU64]>,
}

impl Fingerprints {
    /// `pages` pages, none fingerprinted.
    pub(crate) fn new(pages: usize) -> Fingerprints {
        Fingerprints {
            words: (0..2 * pages).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The fingerprint of the store's copy of `page`, if known. Caller holds
    /// the page's lock.
    pub(crate) fn get(&self, page: usize) -> Option<u128> {
        let lo = self.words[2 * page].load(Ordering::Relaxed);
        let hi = self.words[2 * page + 1].load(Ordering::Relaxed);
        let v = (u128::from(hi) << 64) | u128::from(lo);
        (v != 0).then_some(v)
    }

    /// Records (or forgets) the fingerprint of the store's copy of `page`.
    /// Caller holds the page's lock.
    pub(crate) fn set(&self, page: usize, fp: Option<u128>) {
        let v = fp.unwrap_or(0);
        self.words[2 * page].store(v as u64, Ordering::Relaxed);
        self.words[2 * page + 1].store((v >> 64) as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Fingerprints {
        fn is_clean(&self, page: usize, bytes: &[u8]) -> bool {
            self.get(page) == Some(fingerprint(bytes))
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
        f.set(1, None);
        assert!(!f.is_clean(1, &page));
        assert_ne!(fingerprint(&[0u8; 4096]), 0);
    }
}
