//! The page-state words of one region, stored sparsely: a two-level table
//! whose leaves (one per [`LEAF_PAGES`] pages: 2 MiB of 4 KiB pages) exist
//! only while some page of theirs is in use, so untouched address space
//! costs one pointer per leaf span (4 KiB per GiB of 4 KiB pages, 8 B per
//! GiB of 2 MiB pages) and a page in use about 4 bytes (2 KiB per leaf).
//!
//! A word is `0` for an absent page, anything else for a page in use (the
//! encoding is the region's: [`super::PageState`]). Each page's word has
//! one writer at a time — the holder of the page's fault lock — but pages
//! of one leaf are under different locks, so leaves are created and
//! retired lock-free:
//!
//! - `live` counts the leaf's non-zero words. A writer making a word
//!   non-zero first raises `live` (refused once it is [`DEAD`]), then
//!   stores; a writer zeroing a word stores, then lowers `live`.
//! - The writer that lowers `live` to 0 tries `0 → DEAD`; if that wins, no
//!   word can become non-zero again, so it unlinks the leaf and hands it to
//!   the epoch collector (`crossbeam-epoch`): readers that still hold it see
//!   zeros — absent, which every page of it then is.
//! - A writer that finds its leaf dead waits for the unlink (a few
//!   instructions away) and installs a fresh leaf (CAS from null; a loser
//!   drops its own).
//!
//! Readers take no lock: an epoch pin, the leaf pointer (Acquire, pairing
//! with the installing CAS), the word (Acquire, pairing with the writer's
//! Release store). Locks: none of its own. The protocol is model checked
//! with loom (`RUSTFLAGS="--cfg loom" cargo test --release -p faultline
//! --lib loom`), with leaves of 4 pages and the collector replaced by a
//! shim that never frees (`crate::sync::epoch`).
//!
//! It also counts what the pages in use cost beyond their frames
//! ([`PageStates::overhead_bytes`], counted against the budget): its
//! linked leaves, and the page tables under them (noted when a leaf is
//! linked over their span, forgotten only when the range is unmapped, as
//! the kernel keeps them: [`super::cost`]), adding each change to the
//! manager's running sum. Figures, not part of the protocol.

use super::cost::{OverheadSum, Tables, TABLE_ENTRIES};
use crate::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use crate::sync::epoch::{self, Atomic, Guard, Owned, Shared};
use std::sync::Arc;

/// Pages per leaf.
#[cfg(not(loom))]
pub(crate) const LEAF_PAGES: usize = 512;
/// Pages per leaf (small, so a loom model stays small).
#[cfg(loom)]
pub(crate) const LEAF_PAGES: usize = 4;

/// `live` of a retired leaf.
const DEAD: u32 = u32::MAX;

struct Leaf {
    live: AtomicU32,
    words: [AtomicU32; LEAF_PAGES],
}

impl Leaf {
    fn empty() -> Leaf {
        Leaf {
            live: AtomicU32::new(0),
            words: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Raises `live` unless the leaf is retired.
    fn enter(&self) -> bool {
        // AcqRel: pairs with the retiring CAS (a leaf raised here is not
        // retired; one retired is never raised).
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n != DEAD).then(|| n + 1)
            })
            .is_ok()
    }
}

/// See the module docs.
pub(crate) struct PageStates {
    len: usize,
    leaves: Box<[Atomic<Leaf>]>,
    /// Leaves linked now (for the metadata figure).
    linked: AtomicUsize,
    tables: Tables,
    /// The manager's running sum this region's overhead is added to.
    sum: Option<Arc<OverheadSum>>,
}

impl std::fmt::Debug for PageStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageStates")
            .field("len", &self.len)
            .field("leaves", &self.linked.load(Ordering::Relaxed))
            .finish()
    }
}

impl PageStates {
    /// `len` pages, all absent; allocates only the leaf pointers (and the
    /// table bits). `head`: the first page's index within the span of its
    /// page table (its address / page size, modulo 512).
    pub(crate) fn new(len: usize, head: usize) -> PageStates {
        let n = len.div_ceil(LEAF_PAGES);
        let pointers = n * std::mem::size_of::<Atomic<Leaf>>();
        PageStates {
            len,
            leaves: (0..n).map(|_| Atomic::null()).collect(),
            linked: AtomicUsize::new(0),
            tables: Tables::new(len, head % TABLE_ENTRIES, pointers),
            sum: None,
        }
    }

    /// Adds this region's overhead, now and as it grows, to `sum`, until
    /// it is dropped. Once per region.
    pub(crate) fn count_into(&mut self, sum: &Arc<OverheadSum>) {
        debug_assert!(self.sum.is_none(), "counted into one sum only");
        self.sum = Some(Arc::clone(sum));
        self.charge(self.overhead_bytes(), 0);
    }

    /// The region's range was unmapped: its page tables no longer cost
    /// anything (a region being dropped, before its last reference goes).
    pub(crate) fn unmapped(&self) {
        self.charge(0, self.tables.forget());
    }

    /// Adds `more` and takes `less` bytes out of the manager's sum.
    fn charge(&self, more: usize, less: usize) {
        if let Some(sum) = &self.sum {
            sum.add(more);
            sum.sub(less);
        }
    }

    /// Number of pages.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of metadata held now: the leaf pointers and the linked leaves.
    pub(crate) fn bytes(&self) -> usize {
        self.leaves.len() * std::mem::size_of::<Atomic<Leaf>>()
            + self.linked.load(Ordering::Relaxed) * std::mem::size_of::<Leaf>()
    }

    /// Memory the pages in use have cost beyond their frames: the linked
    /// leaves, the pages of the pointer array touched (at most one per
    /// table noted) and the page tables noted (4 KiB each) — an upper
    /// bound of the last-level tables; the levels above (one table per
    /// 512 of these) and the table bits themselves are not counted.
    pub(crate) fn overhead_bytes(&self) -> usize {
        self.linked.load(Ordering::Relaxed) * std::mem::size_of::<Leaf>() + self.tables.bytes()
    }

    /// The word of `page` (Acquire).
    pub(crate) fn load(&self, page: usize) -> u32 {
        let guard = epoch::pin();
        let leaf = self.leaves[page / LEAF_PAGES].load(Ordering::Acquire, &guard);
        // SAFETY: a leaf loaded under a pin is freed only after the pin
        // ends (it is retired through the collector).
        match unsafe { leaf.as_ref() } {
            None => 0,
            // Acquire pairs with the Release half of `swap`'s store.
            Some(l) => l.words[page % LEAF_PAGES].load(Ordering::Acquire),
        }
    }

    /// Stores `v` as the word of `page` and returns the old word. Caller
    /// holds the page's fault lock (the only writer of this word).
    pub(crate) fn swap(&self, page: usize, v: u32) -> u32 {
        let guard = epoch::pin();
        let slot = &self.leaves[page / LEAF_PAGES];
        let j = page % LEAF_PAGES;
        loop {
            let leaf = slot.load(Ordering::Acquire, &guard);
            // SAFETY: as in `load`.
            let Some(l) = (unsafe { leaf.as_ref() }) else {
                if v == 0 {
                    return 0;
                }
                self.install(page / LEAF_PAGES, &guard);
                continue;
            };
            // Relaxed: this thread is the word's only writer.
            let old = l.words[j].load(Ordering::Relaxed);
            if old == 0 && v != 0 && !l.enter() {
                // Retired: its retirer unlinks it next.
                crate::sync::yield_now();
                continue;
            }
            // AcqRel: Release pairs with `load`'s Acquire.
            l.words[j].swap(v, Ordering::AcqRel);
            // AcqRel: the last leaver sees every word's zeroing.
            if old != 0 && v == 0 && l.live.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.retire(slot, leaf, &guard);
            }
            return old;
        }
    }

    /// Links a fresh leaf at slot `i` unless another writer did, and
    /// notes the page tables under its span (a page of it is mapped next).
    /// The leaf is counted before it is linked (and uncounted if another
    /// won), so that its retiring, which may follow at once, never takes
    /// out what was not yet added.
    fn install(&self, i: usize, guard: &Guard) {
        let slot = &self.leaves[i];
        let leaf = std::mem::size_of::<Leaf>();
        let tables = self
            .tables
            .note(i * LEAF_PAGES, ((i + 1) * LEAF_PAGES).min(self.len));
        self.linked.fetch_add(1, Ordering::Relaxed);
        self.charge(tables + leaf, 0);
        let fresh = Owned::new(Leaf::empty());
        // Release pairs with the Acquire loads of the slot; a loser's leaf
        // is dropped with the error.
        if slot
            .compare_exchange(
                Shared::null(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
                guard,
            )
            .is_err()
        {
            self.linked.fetch_sub(1, Ordering::Relaxed);
            self.charge(0, leaf);
        }
    }

    /// Retires `leaf` (at `slot`) if it is still empty.
    fn retire(&self, slot: &Atomic<Leaf>, leaf: Shared<'_, Leaf>, guard: &Guard) {
        // SAFETY: pinned by `guard` (see `load`).
        let Some(l) = (unsafe { leaf.as_ref() }) else {
            return;
        };
        // AcqRel pairs with `enter`: after DEAD no word becomes non-zero.
        if l.live
            .compare_exchange(0, DEAD, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // Only the retirer unlinks, and nobody links over a linked leaf, so
        // this succeeds.
        if slot
            .compare_exchange(
                leaf,
                Shared::null(),
                Ordering::AcqRel,
                Ordering::Acquire,
                guard,
            )
            .is_ok()
        {
            self.linked.fetch_sub(1, Ordering::Relaxed);
            self.charge(0, std::mem::size_of::<Leaf>());
            // SAFETY: unlinked, so no reader can load it any more; readers
            // that did are pinned, and the collector waits for them.
            unsafe { guard.defer_destroy(leaf) };
        }
    }

    /// The first page at or after `from` whose word is non-zero, skipping
    /// unlinked leaves whole (cost: one pointer per empty leaf span).
    pub(crate) fn next_used(&self, from: usize) -> Option<usize> {
        let guard = epoch::pin();
        let mut page = from;
        while page < self.len {
            let leaf = self.leaves[page / LEAF_PAGES].load(Ordering::Acquire, &guard);
            let next_leaf = (page / LEAF_PAGES + 1) * LEAF_PAGES;
            // SAFETY: as in `load`.
            if let Some(l) = unsafe { leaf.as_ref() } {
                let end = next_leaf.min(self.len);
                if let Some(p) =
                    (page..end).find(|&p| l.words[p % LEAF_PAGES].load(Ordering::Acquire) != 0)
                {
                    return Some(p);
                }
            }
            page = next_leaf;
        }
        None
    }
}

impl Drop for PageStates {
    fn drop(&mut self) {
        self.charge(0, self.overhead_bytes());
        for slot in self.leaves.iter() {
            // SAFETY: `&mut self`: no other thread can reach the table, so
            // no pin is needed and each linked leaf is owned here.
            unsafe {
                let leaf = slot.load(Ordering::Relaxed, epoch::unprotected());
                if !leaf.is_null() {
                    drop(leaf.into_owned());
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use faultline_sys::PAGE_SIZE;
    use proptest::prelude::*;

    #[test]
    fn untouched_costs_pointers_only() {
        // 1 TiB of 4 KiB pages.
        let s = PageStates::new(1 << 28, 0);
        assert_eq!(s.bytes(), (1 << 28) / LEAF_PAGES * 8);
        assert_eq!(s.load(123_456_789), 0);
        assert_eq!(s.next_used(0), None);
        assert_eq!(s.swap(5, 0), 0, "clearing an absent page links nothing");
        assert_eq!(s.bytes(), (1 << 28) / LEAF_PAGES * 8);
    }

    #[test]
    fn leaves_come_and_go() {
        let s = PageStates::new(3 * LEAF_PAGES + 7, 0);
        let base = s.bytes();
        assert_eq!(s.swap(LEAF_PAGES + 3, 9), 0);
        assert_eq!(s.swap(LEAF_PAGES + 4, 10), 0);
        assert_eq!(s.bytes(), base + std::mem::size_of::<Leaf>());
        assert_eq!(s.next_used(0), Some(LEAF_PAGES + 3));
        assert_eq!(s.next_used(LEAF_PAGES + 4), Some(LEAF_PAGES + 4));
        assert_eq!(s.swap(LEAF_PAGES + 3, 0), 9);
        assert_eq!(s.bytes(), base + std::mem::size_of::<Leaf>());
        assert_eq!(s.swap(LEAF_PAGES + 4, 11), 10);
        assert_eq!(s.swap(LEAF_PAGES + 4, 0), 11);
        assert_eq!(s.bytes(), base, "the last page out retires the leaf");
        // The short last leaf.
        assert_eq!(s.swap(3 * LEAF_PAGES + 6, 1), 0);
        assert_eq!(s.next_used(0), Some(3 * LEAF_PAGES + 6));
        assert_eq!(s.next_used(3 * LEAF_PAGES + 7), None);
    }

    #[test]
    fn page_tables_are_noted_once_per_span() {
        let leaf = std::mem::size_of::<Leaf>();
        let s = PageStates::new(4 * TABLE_ENTRIES, 0);
        assert_eq!(s.overhead_bytes(), 0, "untouched costs nothing");
        s.swap(3, 1);
        s.swap(TABLE_ENTRIES + 3, 1);
        // Two leaves, two tables, the pointer array's one page (32 bytes).
        assert_eq!(s.overhead_bytes(), 2 * leaf + 32 + 2 * PAGE_SIZE);
        s.swap(3, 0);
        assert_eq!(s.overhead_bytes(), leaf + 32 + 2 * PAGE_SIZE, "tables stay");
        s.swap(5, 1);
        assert_eq!(
            s.overhead_bytes(),
            2 * leaf + 32 + 2 * PAGE_SIZE,
            "noted once"
        );
        // A region starting mid-table: a leaf's span straddles two tables.
        let t = PageStates::new(4 * TABLE_ENTRIES, TABLE_ENTRIES + 100);
        t.swap(0, 1);
        assert_eq!(t.tables.noted(), 2);
    }

    /// Threads each own a set of pages of the same two leaves (as fault
    /// locks would) and flip them between absent and in use; every word
    /// reads back as its owner left it, and the leaves go when all pages do.
    #[test]
    fn concurrent_writers_share_leaves() {
        let sum = Arc::new(OverheadSum::default());
        let mut s = PageStates::new(2 * LEAF_PAGES, 0);
        s.count_into(&sum);
        let threads = 4;
        std::thread::scope(|sc| {
            for t in 0..threads {
                let s = &s;
                sc.spawn(move || {
                    let mine: Vec<usize> = (t..2 * LEAF_PAGES).step_by(threads * 37).collect();
                    for round in 1..2000u32 {
                        for &p in &mine {
                            let v = if round % 3 == 0 { 0 } else { round };
                            let want = if (round - 1) % 3 == 0 { 0 } else { round - 1 };
                            assert_eq!(s.swap(p, v), want, "page {p} round {round}");
                            assert_eq!(s.load(p), v);
                        }
                    }
                    for &p in &mine {
                        s.swap(p, 0);
                    }
                });
            }
        });
        assert_eq!(s.next_used(0), None);
        assert_eq!(s.bytes(), 2 * 8, "every leaf retired");
        assert_eq!(sum.bytes(), s.overhead_bytes(), "the running sum agrees");
    }

    proptest! {
        /// Random stores against a Vec oracle.
        #[test]
        fn against_vec_oracle(ops in proptest::collection::vec((0usize..3000, 0u32..4), 1..400)) {
            let sum = Arc::new(OverheadSum::default());
            let mut s = PageStates::new(3000, 0);
            s.count_into(&sum);
            let mut oracle = vec![0u32; 3000];
            for (p, v) in ops {
                prop_assert_eq!(s.swap(p, v), oracle[p]);
                prop_assert_eq!(sum.bytes(), s.overhead_bytes(), "the running sum");
                oracle[p] = v;
                let from = p.saturating_sub(700);
                let want = (from..3000).find(|&q| oracle[q] != 0);
                prop_assert_eq!(s.next_used(from), want);
            }
            for (p, &v) in oracle.iter().enumerate() {
                prop_assert_eq!(s.load(p), v);
            }
            let leaves = (0..3000usize.div_ceil(LEAF_PAGES))
                .filter(|l| oracle[l * LEAF_PAGES..((l + 1) * LEAF_PAGES).min(3000)].iter().any(|&v| v != 0))
                .count();
            prop_assert_eq!(s.bytes(), 3000usize.div_ceil(LEAF_PAGES) * 8 + leaves * std::mem::size_of::<Leaf>());
            s.unmapped();
            prop_assert_eq!(sum.bytes(), leaves * std::mem::size_of::<Leaf>(), "tables gone");
            drop(s);
            prop_assert_eq!(sum.bytes(), 0, "all taken out");
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Two pages of one leaf under two writers (as two fault locks would
    /// have them): one comes and goes, so the leaf may retire while the
    /// other installs or enters it. No word is lost, and a leaf is linked
    /// exactly while a page of it is in use.
    #[test]
    fn loom_leaves_come_and_go() {
        loom::model(|| {
            let s = Arc::new(PageStates::new(2 * LEAF_PAGES, 0));
            let a = {
                let s = Arc::clone(&s);
                loom::thread::spawn(move || {
                    assert_eq!(s.swap(0, 7), 0);
                    assert_eq!(s.swap(0, 0), 7);
                })
            };
            let b = {
                let s = Arc::clone(&s);
                loom::thread::spawn(move || {
                    assert_eq!(s.swap(1, 9), 0);
                    assert_eq!(s.load(1), 9);
                })
            };
            a.join().expect("writer a");
            b.join().expect("writer b");
            assert_eq!(s.load(0), 0);
            assert_eq!(s.load(1), 9);
            assert_eq!(s.next_used(0), Some(1));
            assert_eq!(s.linked.load(Ordering::Relaxed), 1, "one leaf linked");
            assert_eq!(s.swap(1, 0), 9);
            assert_eq!(s.linked.load(Ordering::Relaxed), 0, "and retired");
        });
    }
}
