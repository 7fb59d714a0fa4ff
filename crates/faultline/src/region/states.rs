//! The page-state words of one region, stored sparsely: a slot per span of
//! [`LEAF_PAGES`] pages (2 MiB of 4 KiB pages), holding nothing while no
//! page of the span is in use, the one page in use itself, or a leaf
//! ([`super::leaf`]: a hash table of the pages in use, sized to them). So
//! untouched address space costs the slots (4 KiB per GiB of 4 KiB pages,
//! 8 B per GiB of 2 MiB pages), a lone page in use nothing more, and pages
//! sharing a span at most 32 bytes each.
//!
//! A word is `0` for an absent page, anything else for a page in use (the
//! encoding is the region's: [`super::PageState`]). Each page's word has
//! one writer at a time, the holder of the page's fault lock; pages of one
//! span are under different fault locks, so writers of a span also take
//! the span's lock, a bit of its slot (taken with `fetch_or`, Acquire),
//! and release it by storing the slot's new value (Release): a leaf lock,
//! taken under the page's fault lock, with nothing taken (and no region
//! memory touched) while it is held. Under it a writer changes a leaf
//! entry in place, or builds a new leaf (grown, shrunk, or from the slot's
//! lone page), publishes it with that store, and only then hands the old
//! one to the epoch collector (`crossbeam-epoch`).
//!
//! Readers take no lock: an epoch pin, the slot (Acquire, pairing with the
//! publishing store), the entry (Acquire, pairing with the writer's
//! Release). A reader still on a replaced leaf reads the words it held when
//! it was replaced, which no writer changes afterwards: a value current at
//! some instant of the read. The protocol is model checked with loom
//! (`RUSTFLAGS="--cfg loom" cargo test --release -p faultline --lib loom`),
//! with spans of 4 pages and a collector that never frees
//! (`crate::sync::epoch`).
//!
//! It also counts what the pages in use cost beyond their frames
//! ([`PageStates::overhead_bytes`], counted against the budget): its
//! leaves, and the page tables under the spans in use (noted when a span's
//! first page comes into use, forgotten only when the range is unmapped, as
//! the kernel keeps them: [`super::cost`]), adding each change to the
//! manager's running sums (and its own bytes to the page states' sum).
//! Figures, not part of the protocol.

use super::cost::{OverheadSum, Tables, TABLE_ENTRIES};
pub(crate) use super::leaf::LEAF_PAGES;
use super::leaf::{self, Leaf};
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::epoch;
use std::sync::Arc;

const _: () = assert!(usize::BITS == 64, "a slot holds a word and a key");

/// The span lock's bit of a slot.
const LOCK: usize = 0b10;
/// Set in a slot holding its span's lone page in use: `word << 32 | key
/// << 2 | INLINE`. (A leaf's address is 8-aligned: both bits clear.)
const INLINE: usize = 0b01;

/// What a slot holds.
#[derive(Clone, Copy)]
enum Slot {
    Empty,
    /// One page: its key in the span, and its word.
    One(usize, u32),
    /// A leaf's address.
    Leaf(usize),
}

impl Slot {
    fn decode(s: usize) -> Slot {
        let s = s & !LOCK;
        if s == 0 {
            Slot::Empty
        } else if s & INLINE != 0 {
            Slot::One((s as u32 as usize) >> 2, (s >> 32) as u32)
        } else {
            Slot::Leaf(s)
        }
    }

    fn one(key: usize, word: u32) -> usize {
        (word as usize) << 32 | key << 2 | INLINE
    }
}

/// A writer's change to a span: the slot's new value, the word it
/// replaced, and the leaf it unlinks (to free once it is unlinked).
struct Change {
    slot: usize,
    old: u32,
    retired: Option<usize>,
}

impl Change {
    /// The slot becomes `slot`; no leaf is unlinked.
    fn to(slot: usize, old: u32) -> Change {
        Change {
            slot,
            old,
            retired: None,
        }
    }
}

/// See the module docs.
pub(crate) struct PageStates {
    len: usize,
    slots: Box<[AtomicUsize]>,
    /// Bytes of the leaves linked now.
    leaf_bytes: AtomicUsize,
    tables: Tables,
    /// Bytes the region's store keeps of its own (`Store::own_memory`), as
    /// last noted (`note_store_bytes`), counted with the overhead until
    /// `unmapped` (the store goes with the region, whose last reference
    /// may be released some time later).
    store_bytes: AtomicUsize,
    /// The manager's running sum this region's overhead is added to.
    sum: Option<Arc<OverheadSum>>,
    #[cfg(loom)]
    serial: Box<[crate::sync::Mutex<()>]>,
}

impl std::fmt::Debug for PageStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageStates")
            .field("len", &self.len)
            .field("leaf_bytes", &self.leaf_bytes.load(Ordering::Relaxed))
            .finish()
    }
}

impl PageStates {
    /// `len` pages, all absent; allocates only the slots (and the table
    /// bits). `head`: the first page's index within the span of its page
    /// table (its address / page size, modulo 512).
    pub(crate) fn new(len: usize, head: usize) -> PageStates {
        let n = len.div_ceil(LEAF_PAGES);
        let pointers = n * std::mem::size_of::<AtomicUsize>();
        PageStates {
            len,
            slots: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            leaf_bytes: AtomicUsize::new(0),
            tables: Tables::new(len, head % TABLE_ENTRIES, pointers),
            store_bytes: AtomicUsize::new(0),
            sum: None,
            #[cfg(loom)]
            serial: (0..n.max(1)).map(|_| crate::sync::Mutex::new(())).collect(),
        }
    }

    /// Adds this region's overhead and its page-state bytes, now and as
    /// they grow, to `sum`, until it is dropped. Once per region.
    pub(crate) fn count_into(&mut self, sum: &Arc<OverheadSum>) {
        debug_assert!(self.sum.is_none(), "counted into one sum only");
        self.sum = Some(Arc::clone(sum));
        self.charge((self.overhead_bytes(), 0), (self.bytes(), 0));
    }

    /// Notes what the region's store keeps of its own now (`bytes`), and
    /// charges the change.
    pub(crate) fn note_store_bytes(&self, bytes: usize) {
        // Relaxed: a figure. Called after every store read, where it
        // changes once: a load leaves the line shared; the swap makes each
        // change charged once.
        if self.store_bytes.load(Ordering::Relaxed) == bytes {
            return;
        }
        let was = self.store_bytes.swap(bytes, Ordering::Relaxed);
        if was != bytes {
            self.charge((bytes, was), (0, 0));
        }
    }

    /// The region's range was unmapped: its page tables no longer cost
    /// anything, nor its store's memory, soon dropped (a region being
    /// dropped, before its last reference goes).
    pub(crate) fn unmapped(&self) {
        // Relaxed: a figure, as the tables' count.
        let store = self.store_bytes.swap(0, Ordering::Relaxed);
        self.charge((0, self.tables.forget() + store), (0, 0));
    }

    /// Adds to and takes out of the manager's sums `(more, less)` bytes of
    /// overhead and of page states.
    fn charge(&self, overhead: (usize, usize), states: (usize, usize)) {
        if let Some(sum) = &self.sum {
            sum.charge(overhead, states);
        }
    }

    /// Number of pages.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of metadata held now: the slots and the linked leaves.
    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<AtomicUsize>()
            + self.leaf_bytes.load(Ordering::Relaxed)
    }

    /// Memory the pages in use have cost beyond their frames: the linked
    /// leaves, the pages of the slot array touched (at most one per table
    /// noted) and the page tables noted (4 KiB each) — an upper bound of
    /// the last-level tables; the levels above (one table per 512 of
    /// these) and the table bits themselves are not counted — and what the
    /// store keeps of its own.
    pub(crate) fn overhead_bytes(&self) -> usize {
        self.leaf_bytes.load(Ordering::Relaxed)
            + self.tables.bytes()
            + self.store_bytes.load(Ordering::Relaxed)
    }

    /// The word of `page` (Acquire).
    pub(crate) fn load(&self, page: usize) -> u32 {
        let _guard = epoch::pin();
        let key = page % LEAF_PAGES;
        // Acquire pairs with the writer's publishing store.
        match Slot::decode(self.slots[page / LEAF_PAGES].load(Ordering::Acquire)) {
            Slot::Empty => 0,
            Slot::One(k, w) => {
                if k == key {
                    w
                } else {
                    0
                }
            }
            // SAFETY: a leaf loaded under a pin is freed only after the pin
            // ends (it is unlinked, then retired through the collector).
            Slot::Leaf(addr) => unsafe { Leaf::at(addr) }.get(key),
        }
    }

    /// Stores `v` as the word of `page` and returns the old word. Caller
    /// holds the page's fault lock (the only writer of this word).
    pub(crate) fn swap(&self, page: usize, v: u32) -> u32 {
        let guard = epoch::pin();
        let span = page / LEAF_PAGES;
        let slot = &self.slots[span];
        // loom cannot explore a spin lock's waits (it reruns the spinner
        // until its branch limit), so its models serialize writers of a
        // span with a loom mutex first; the bit is then always free.
        #[cfg(loom)]
        let _serial = self.serial[span % self.serial.len()].lock();
        let lock = SpanLock::take(slot);
        let change = self.change(span, lock.held, page % LEAF_PAGES, v);
        lock.publish(change.slot);
        if let Some(addr) = change.retired {
            debug_assert_ne!(slot.load(Ordering::Relaxed) & !LOCK, addr, "still linked");
            self.forget_leaf(addr);
            // SAFETY: unlinked by `publish`, so no reader can load it any
            // more; readers that did are pinned, and the collector waits.
            unsafe { guard.defer_unchecked(move || Leaf::free(addr)) };
        }
        change.old
    }

    /// The change that stores `v` for `key` in a span whose slot holds
    /// `held` (its lock taken).
    fn change(&self, span: usize, held: usize, key: usize, v: u32) -> Change {
        match Slot::decode(held) {
            Slot::Empty if v == 0 => Change::to(held, 0),
            Slot::Empty => {
                self.note_span(span);
                Change::to(Slot::one(key, v), 0)
            }
            Slot::One(k, w) if k == key => {
                Change::to(if v == 0 { 0 } else { Slot::one(key, v) }, w)
            }
            Slot::One(_, _) if v == 0 => Change::to(held, 0),
            Slot::One(k, w) => Change::to(self.build(&[(k, w), (key, v)]), 0),
            // SAFETY: the slot holds the leaf and its lock is ours, so
            // nobody frees it meanwhile.
            Slot::Leaf(addr) => self.change_leaf(addr, unsafe { Leaf::at(addr) }, key, v),
        }
    }

    /// `change` for a span with a leaf: in place if it fits, else a
    /// rebuilt leaf (or lone page, or nothing) replaces it.
    fn change_leaf(&self, addr: usize, l: Leaf<'_>, key: usize, v: u32) -> Change {
        let probe = l.probe(key);
        let old = probe.hit.map_or(0, |(_, w)| w);
        if old == v {
            return Change::to(addr, old);
        }
        // A page coming (or changing) fits in place unless the leaf is
        // full; one going leaves it in place unless that leaves one page,
        // or a leaf at most a quarter full.
        let at = probe.hit.map(|(at, _)| at).or(probe.vacant);
        let fits = at.is_some_and(|at| l.put(at, key, v));
        if fits && (v != 0 || (l.live() >= 2 && !l.sparse())) {
            return Change::to(addr, old);
        }
        let mut pages: Vec<(usize, u32)> = l.pages().filter(|&(k, _)| k != key).collect();
        if v != 0 {
            pages.push((key, v));
        }
        let slot = match pages[..] {
            [] => 0,
            [(k, w)] => Slot::one(k, w),
            _ => self.build(&pages),
        };
        Change {
            slot,
            old,
            retired: Some(addr),
        }
    }

    /// A new leaf holding `pages` (two or more), counted.
    fn build(&self, pages: &[(usize, u32)]) -> usize {
        let cap = leaf::cap_for(pages.len());
        let bytes = leaf::bytes(cap);
        self.leaf_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.charge((bytes, 0), (bytes, 0));
        Leaf::build(cap, pages)
    }

    /// Uncounts the leaf at `addr` (being unlinked by this thread).
    fn forget_leaf(&self, addr: usize) {
        // SAFETY: the caller unlinked it but has not freed it yet.
        let bytes = leaf::bytes(unsafe { Leaf::at(addr) }.cap());
        self.leaf_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.charge((0, bytes), (0, bytes));
    }

    /// Notes the page tables under `span`, whose first page comes into use.
    fn note_span(&self, span: usize) {
        let from = span * LEAF_PAGES;
        let tables = self.tables.note(from, (from + LEAF_PAGES).min(self.len));
        self.charge((tables, 0), (0, 0));
    }

    /// The first page at or after `from` whose word is non-zero, skipping
    /// empty spans whole (cost: one slot per empty span).
    pub(crate) fn next_used(&self, from: usize) -> Option<usize> {
        self.first_span_with(from, |held, first| match held {
            Held::One(k) => (k >= first).then_some(k),
            Held::Leaf(leaf) => leaf.next_from(first),
        })
        .map(|(base, k)| base + k)
    }

    /// Appends to `out`, in order, the pages in use of the first span at or
    /// after `from`'s that has any at or after `from` (nothing if none):
    /// what [`PageStates::next_used`] would find one call at a time, for
    /// one pass over the span's entries instead of one per page. Each
    /// page was in use at some instant of the read.
    pub(crate) fn used_in_next_span(&self, from: usize, out: &mut Vec<usize>) {
        let start = out.len();
        let found = self.first_span_with(from, |held, first| {
            match held {
                Held::One(k) if k >= first => out.push(k),
                Held::Leaf(leaf) => leaf.keys_from(first, out),
                Held::One(_) => {}
            }
            (out.len() > start).then_some(())
        });
        if let Some((base, ())) = found {
            out[start..].iter_mut().for_each(|k| *k += base);
        }
    }

    /// Walks the spans from `from`'s on, pinned in the epoch, until `look`
    /// finds something in one: `look` is given what a span in use holds
    /// and the first key in it to consider (`from`'s own in its span, 0
    /// past it). Returns the span's first page and what `look` found.
    fn first_span_with<T>(
        &self,
        from: usize,
        mut look: impl FnMut(Held<'_>, usize) -> Option<T>,
    ) -> Option<(usize, T)> {
        let _guard = epoch::pin();
        let mut span = from / LEAF_PAGES;
        while span * LEAF_PAGES < self.len {
            let base = span * LEAF_PAGES;
            // Acquire: as in `load`.
            let held = match Slot::decode(self.slots[span].load(Ordering::Acquire)) {
                Slot::Empty => None,
                Slot::One(k, _) => Some(Held::One(k)),
                // SAFETY: as in `load` (the pin above lasts while `look`
                // runs, and `look` cannot keep the leaf past its call).
                Slot::Leaf(addr) => Some(Held::Leaf(unsafe { Leaf::at(addr) })),
            };
            if let Some(t) = held.and_then(|h| look(h, from.saturating_sub(base))) {
                return Some((base, t));
            }
            span += 1;
        }
        None
    }
}

/// What the slot of a span in use holds, for a reader pinned in the
/// epoch ([`PageStates::first_span_with`]).
enum Held<'a> {
    /// The key of its lone page in use.
    One(usize),
    Leaf(Leaf<'a>),
}

/// A span's lock, held (see the module docs): `held` is the slot's value
/// when it was taken. Publishing the slot's new value releases it; dropped
/// unpublished (a panic while changing the span), it puts `held` back, so
/// the span's other writers do not wait for ever.
struct SpanLock<'a> {
    slot: &'a AtomicUsize,
    held: usize,
    /// The span lock this thread held before (see [`holding`]).
    outer: usize,
}

impl<'a> SpanLock<'a> {
    fn take(slot: &'a AtomicUsize) -> SpanLock<'a> {
        let outer = holding::enter(slot);
        let mut spins = 0u32;
        loop {
            // Acquire pairs with the Release store that released the lock.
            let s = slot.fetch_or(LOCK, Ordering::Acquire);
            if s & LOCK == 0 {
                return SpanLock {
                    slot,
                    held: s,
                    outer,
                };
            }
            while slot.load(Ordering::Relaxed) & LOCK != 0 {
                crate::sync::backoff(&mut spins);
            }
        }
    }

    /// Stores `value` in the slot and releases the lock. Release: pairs
    /// with readers' Acquire and the next writer's `fetch_or`.
    fn publish(self, value: usize) {
        self.slot.store(value, Ordering::Release);
        holding::leave(self.outer);
        std::mem::forget(self);
    }
}

impl Drop for SpanLock<'_> {
    fn drop(&mut self) {
        self.slot.store(self.held, Ordering::Release);
        holding::leave(self.outer);
    }
}

/// The span lock each thread holds, so that a thread that would wait for
/// its own — a signal handler that touched region memory while the thread
/// was changing that span's states, and whose fault is served in the
/// thread (in-thread mode) — ends with a message rather than hanging.
/// (loom runs its threads on one OS thread: nothing is tracked there.)
#[cfg(not(loom))]
mod holding {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;

    thread_local! {
        static HOLDING: Cell<usize> = const { Cell::new(0) };
    }

    /// Notes `slot` as held by this thread; returns what was held before.
    /// Aborts if it is `slot` itself.
    pub(super) fn enter(slot: &AtomicUsize) -> usize {
        let me = slot as *const AtomicUsize as usize;
        let outer = HOLDING.with(|h| h.replace(me));
        if outer == me {
            faultline_sys::signal::report(
                b"faultline: a signal handler touched region memory while its thread \
                  was changing the page states of the same 2 MiB span (slot ",
                me,
                b"); it cannot wait for itself: aborting",
            );
            std::process::abort();
        }
        outer
    }

    /// Restores what [`enter`] returned.
    pub(super) fn leave(outer: usize) {
        HOLDING.with(|h| h.set(outer));
    }
}

#[cfg(loom)]
mod holding {
    pub(super) fn enter(_slot: &crate::sync::atomic::AtomicUsize) -> usize {
        0
    }
    pub(super) fn leave(_outer: usize) {}
}

impl Drop for PageStates {
    fn drop(&mut self) {
        self.charge((0, self.overhead_bytes()), (0, self.bytes()));
        for slot in self.slots.iter() {
            if let Slot::Leaf(addr) = Slot::decode(slot.load(Ordering::Relaxed)) {
                // SAFETY: `&mut self`: no other thread can reach the table,
                // so each linked leaf is owned here, and freed once.
                unsafe { Leaf::free(addr) };
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
        assert_eq!(s.bytes(), base, "a lone page lives in its slot");
        assert_eq!(s.swap(LEAF_PAGES + 4, 10), 0);
        assert_eq!(s.bytes(), base + leaf::bytes(leaf::MIN_CAP));
        assert_eq!(s.next_used(0), Some(LEAF_PAGES + 3));
        assert_eq!(s.next_used(LEAF_PAGES + 4), Some(LEAF_PAGES + 4));
        assert_eq!(s.swap(LEAF_PAGES + 3, 0), 9);
        assert_eq!(s.bytes(), base, "one page left: back in the slot");
        assert_eq!(s.load(LEAF_PAGES + 4), 10);
        assert_eq!(s.swap(LEAF_PAGES + 4, 11), 10);
        assert_eq!(s.swap(LEAF_PAGES + 4, 0), 11);
        assert_eq!(s.bytes(), base);
        assert_eq!(s.next_used(0), None);
        // The short last span.
        assert_eq!(s.swap(3 * LEAF_PAGES + 6, 1), 0);
        assert_eq!(s.next_used(0), Some(3 * LEAF_PAGES + 6));
        assert_eq!(s.next_used(3 * LEAF_PAGES + 7), None);
    }

    /// A span filled page by page grows its leaf up to a full-size one, and
    /// shrinks it as pages go; every word reads back throughout.
    #[test]
    fn a_span_fills_and_empties() {
        let s = PageStates::new(LEAF_PAGES, 0);
        for p in 0..LEAF_PAGES {
            assert_eq!(s.swap(p, p as u32 + 1), 0);
            assert!(s.leaf_bytes.load(Ordering::Relaxed) <= 32 * (p + 1));
        }
        assert_eq!(
            s.leaf_bytes.load(Ordering::Relaxed),
            leaf::bytes(LEAF_PAGES)
        );
        for p in (0..LEAF_PAGES).rev() {
            assert_eq!(s.load(p), p as u32 + 1);
            assert_eq!(s.swap(p, 0), p as u32 + 1);
            let left = p;
            if left >= 2 {
                assert!(
                    s.leaf_bytes.load(Ordering::Relaxed) <= 32 * left,
                    "{left} left"
                );
            }
        }
        assert_eq!(s.bytes(), 8);
    }

    #[test]
    fn page_tables_are_noted_once_per_span() {
        let leaf = leaf::bytes(leaf::MIN_CAP);
        let s = PageStates::new(4 * TABLE_ENTRIES, 0);
        assert_eq!(s.overhead_bytes(), 0, "untouched costs nothing");
        s.swap(3, 1);
        s.swap(4, 1);
        s.swap(TABLE_ENTRIES + 3, 1);
        // One leaf (the other span's page is in its slot), two tables, the
        // slot array's one page (32 bytes).
        assert_eq!(s.overhead_bytes(), leaf + 32 + 2 * PAGE_SIZE);
        s.swap(3, 0);
        s.swap(TABLE_ENTRIES + 3, 0);
        assert_eq!(s.overhead_bytes(), 32 + 2 * PAGE_SIZE, "tables stay");
        s.swap(5, 1);
        assert_eq!(s.overhead_bytes(), leaf + 32 + 2 * PAGE_SIZE, "noted once");
        // A region starting mid-table: a span straddles two tables.
        let t = PageStates::new(4 * TABLE_ENTRIES, TABLE_ENTRIES + 100);
        t.swap(0, 1);
        assert_eq!(t.tables.noted(), 2);
    }

    /// Threads each own a set of pages of the same two spans (as fault
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
                    let mine: Vec<usize> = (t..2 * LEAF_PAGES).step_by(threads * 7).collect();
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
        assert_eq!(sum.state_bytes(), s.bytes(), "the states' sum agrees");
    }

    /// A thread that would wait for the span lock it holds itself (a
    /// signal handler's nested write, in-thread) ends with a message on
    /// stderr and SIGABRT, not a hang. Run in a child process.
    #[test]
    fn waiting_for_its_own_span_lock_aborts_with_a_message() {
        const NAME: &str =
            "region::states::tests::waiting_for_its_own_span_lock_aborts_with_a_message";
        if std::env::var_os("FAULTLINE_NESTED_SPAN_CHILD").is_some() {
            let s = PageStates::new(LEAF_PAGES, 0);
            let _held = SpanLock::take(&s.slots[0]);
            let _nested = SpanLock::take(&s.slots[0]);
            unreachable!("the nested take returned");
        }
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env("FAULTLINE_NESTED_SPAN_CHILD", "1")
            .output()
            .expect("child");
        use std::os::unix::process::ExitStatusExt;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{err}");
        assert!(err.contains("cannot wait for itself: aborting"), "{err}");
    }

    /// Random stores over `len` pages against a Vec oracle: words, the
    /// next page in use, the running sum, and the goal — no leaf for a
    /// lone page, at most 32 bytes of leaf per page in use otherwise.
    fn check_oracle(len: usize, ops: Vec<(usize, u32)>) -> Result<(), TestCaseError> {
        let sum = Arc::new(OverheadSum::default());
        let mut s = PageStates::new(len, 0);
        s.count_into(&sum);
        let mut oracle = vec![0u32; len];
        for (p, v) in ops {
            let p = p % len;
            prop_assert_eq!(s.swap(p, v), oracle[p]);
            prop_assert_eq!(sum.bytes(), s.overhead_bytes(), "the running sum");
            prop_assert_eq!(sum.state_bytes(), s.bytes(), "the states' sum");
            oracle[p] = v;
            for from in [p.saturating_sub(700), p, p / 2] {
                let want = (from..len).find(|&q| oracle[q] != 0);
                prop_assert_eq!(s.next_used(from), want);
            }
            let in_leaves: usize = oracle
                .chunks(LEAF_PAGES)
                .map(|c| c.iter().filter(|&&w| w != 0).count())
                .filter(|&n| n >= 2)
                .sum();
            prop_assert!(s.leaf_bytes.load(Ordering::Relaxed) <= 32 * in_leaves);
        }
        for (p, &v) in oracle.iter().enumerate() {
            prop_assert_eq!(s.load(p), v);
        }
        s.unmapped();
        prop_assert_eq!(
            sum.bytes(),
            s.leaf_bytes.load(Ordering::Relaxed),
            "tables gone"
        );
        drop(s);
        prop_assert_eq!(sum.bytes(), 0, "all taken out");
        prop_assert_eq!(sum.state_bytes(), 0, "the states' too");
        Ok(())
    }

    proptest! {
        /// Pages spread over six spans.
        #[test]
        fn against_vec_oracle(ops in proptest::collection::vec((0usize..3000, 0u32..4), 1..400)) {
            check_oracle(3000, ops)?;
        }

        /// Pages of one span, enough to grow its leaf to full size and
        /// back.
        #[test]
        fn one_span_against_vec_oracle(
            ops in proptest::collection::vec((0usize..LEAF_PAGES, 0u32..3), 1..1500)
        ) {
            check_oracle(LEAF_PAGES, ops)?;
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Two pages of one span under two writers (as two fault locks would
    /// have them), beside a third page in use: one comes and goes, so the
    /// span's leaf is built, changed in place and replaced by a lone page
    /// while the other writer reads the third page (with no lock) and
    /// changes the span. No word is lost or misread. (A Relaxed publishing
    /// store is caught.)
    #[test]
    fn loom_leaves_come_and_go() {
        loom::model(|| {
            let s = Arc::new(PageStates::new(2 * LEAF_PAGES, 0));
            s.swap(2, 5);
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
                    assert_eq!(s.load(2), 5, "read without a lock");
                    assert_eq!(s.swap(1, 9), 0);
                    assert_eq!(s.load(2), 5);
                    assert_eq!(s.load(1), 9);
                })
            };
            a.join().expect("writer a");
            b.join().expect("writer b");
            assert_eq!(s.load(0), 0);
            assert_eq!(s.load(1), 9);
            assert_eq!(s.next_used(0), Some(1));
            assert_eq!(s.swap(1, 0), 9);
            assert_eq!(s.leaf_bytes.load(Ordering::Relaxed), 0, "one page: no leaf");
            assert_eq!(s.swap(2, 0), 5);
            assert_eq!(s.next_used(0), None);
        });
    }

    /// Three pages in one leaf of 4 entries, keys 0 and 4 colliding: one
    /// writer leaves a tombstone at the head of key 4's chain and revives
    /// it; the other reads key 4 past it with no lock, then adds a page
    /// that does not fit, so the leaf is rebuilt twice as large while the
    /// first writes. Every word reads back; one leaf of 8 is left.
    #[test]
    fn loom_tombstones_and_growth() {
        loom::model(|| {
            let s = Arc::new(PageStates::new(LEAF_PAGES, 0));
            s.swap(0, 5);
            s.swap(4, 6);
            s.swap(1, 7);
            let a = {
                let s = Arc::clone(&s);
                loom::thread::spawn(move || {
                    assert_eq!(s.swap(0, 0), 5);
                    assert_eq!(s.swap(0, 8), 0);
                })
            };
            let b = {
                let s = Arc::clone(&s);
                loom::thread::spawn(move || {
                    assert_eq!(s.load(4), 6, "past the tombstone, no lock");
                    assert_eq!(s.swap(2, 9), 0);
                    assert_eq!(s.load(4), 6);
                })
            };
            a.join().expect("writer a");
            b.join().expect("writer b");
            for (p, w) in [(0, 8), (1, 7), (2, 9), (3, 0), (4, 6)] {
                assert_eq!(s.load(p), w, "page {p}");
            }
            assert_eq!(s.leaf_bytes.load(Ordering::Relaxed), leaf::bytes(8));
        });
    }
}
