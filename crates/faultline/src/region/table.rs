//! The region table: finds the region holding an address, with an optional
//! lookup cache in front (seed 002).
//!
//! Readers take no lock: the table is an immutable [`Snapshot`] — a
//! persistent B+ tree of the regions keyed by start ([`super::tree`]), the
//! largest region, and the sequence number it was published under — behind
//! an `ArcSwap` (RCU-style). A writer (map or unmap) takes the `writer`
//! mutex, derives the next tree from the current one (copying only the
//! nodes on one root-to-leaf path: O(log n), shared with the old snapshot
//! otherwise), bumps `seq` and publishes. The writer's side keeps each
//! region's start by id and the regions by size, so neither `remove` nor
//! finding the largest region scans the table.
//!
//! Invariants of every snapshot: keyed by `start`, ranges pairwise disjoint,
//! `snapshot.seq` = the table's `seq` when it was published, `largest` the
//! largest region in it. A cache entry names a snapshot sequence number and
//! is used only while it equals the current one, so after `remove` returns
//! no lookup that starts afterwards can return the removed region (the `seq`
//! bump is SeqCst and so is its load).
//!
//! Caches ([`LookupCache`], switchable at run time for experiments):
//! - `None`: a search of the snapshot's tree every time.
//! - `Shared`: one last-hit entry for the whole table (the original
//!   `mmap_cache`): an `AtomicU64` packing `(seq, tree position)`, Relaxed (a
//!   hint validated against the snapshot).
//! - `SharedLargest`: that, plus the largest region, checked second.
//! - `Hash4`: four shared entries indexed by address bits 21..23.
//! - `PerThread`: each thread's last 4 hits (like Linux's vmacache).
//!
//! Every scheme reads the snapshot through a thread-local reference to it,
//! revalidated by one load of `seq` per lookup (RCU's read side), so a cache
//! hit touches no shared cache line except `seq`, which only writers change.
//!
//! Counters of hits, misses and search depth are per thread (no shared cache
//! line on the lookup path); [`thread_counters`] reads the calling thread's.
//!
//! Locks: `writer` (a leaf), only by `insert` and `remove`.

use super::tree::{Found, Pos, Tree};
use super::RegionInner;
use crate::config::LookupCache;
use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Lookup counters of one thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LookupCounters {
    /// Lookups answered by the cache.
    pub hits: u64,
    /// Lookups that searched the snapshot.
    pub misses: u64,
    /// Binary-search steps taken on misses, summed.
    pub depth: u64,
}

thread_local! {
    static PER_THREAD: RefCell<ThreadCache> = const {
        RefCell::new(ThreadCache {
            table: 0,
            snap: None,
            next: 0,
            entries: [NO_ENTRY; 4],
            counters: LookupCounters { hits: 0, misses: 0, depth: 0 },
        })
    };
}

/// The calling thread's lookup counters.
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
pub fn thread_counters() -> LookupCounters {
    PER_THREAD.with(|c| c.try_borrow().map(|c| c.counters).unwrap_or_default())
}

/// Resets the calling thread's lookup counters.
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
pub fn reset_thread_counters() {
    PER_THREAD.with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            c.counters = LookupCounters::default();
        }
    });
}

impl LookupCounters {
    #[inline]
    fn count(&mut self, hit: bool, depth: u32) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
            self.depth += u64::from(depth);
        }
    }
}

/// A thread's read side of one table: the snapshot it last used (RCU-style:
/// valid while the table's `seq` equals `snap.seq`), and for the per-thread
/// scheme its last hits as `(start, end, region)`.
///
/// Holding the snapshot here keeps the regions it lists alive until this
/// thread's next lookup after a change (or its exit): a removed region's
/// address range is unmapped a little later, never too early.
///
/// Invariant: every non-empty entry points at an `Arc<RegionInner>` inside a
/// leaf of `snap`'s tree (entries are emptied whenever `snap` changes). A
/// published tree's nodes are never changed (a writer copies every node it
/// changes: each is shared with the published snapshot it derives from),
/// and `snap` keeps them alive, so the pointer stays valid as long as it is
/// in `entries` — a hit is one load, without walking the tree.
struct ThreadCache {
    table: u64,
    snap: Option<Arc<Snapshot>>,
    next: usize,
    entries: [Entry; 4],
    counters: LookupCounters,
}

/// A per-thread cache entry: `(start, end, region)`; see [`ThreadCache`].
type Entry = (usize, usize, *const Arc<RegionInner>);

const NO_ENTRY: Entry = (0, 0, std::ptr::null());

/// One published state of the table.
#[derive(Debug, Default)]
pub struct Snapshot {
    seq: u64,
    tree: Tree<Arc<RegionInner>>,
    largest: Option<Arc<RegionInner>>,
}

impl Snapshot {
    /// The region holding `addr` with its tree position (if the tree gives
    /// positions), and the search steps.
    #[inline]
    fn search(&self, addr: usize) -> (Option<Found<'_, Arc<RegionInner>>>, u32) {
        let (found, steps) = self.tree.find(addr);
        (found.filter(|f| f.val.contains(addr)), steps)
    }

    #[inline]
    fn holds(&self, pos: Pos, addr: usize) -> Option<&Arc<RegionInner>> {
        self.tree.at(pos).filter(|r| r.contains(addr))
    }

    /// The regions in address order (no reference count is touched).
    pub fn iter(&self) -> impl Iterator<Item = &Arc<RegionInner>> {
        self.tree.iter().map(|(_, r)| r)
    }

    /// The regions overlapping `[start, end)`, in address order: O(log n)
    /// plus the number found.
    pub fn overlapping(&self, start: usize, end: usize) -> impl Iterator<Item = &Arc<RegionInner>> {
        self.tree
            .iter_from(start)
            .map(|(_, r)| r)
            .take_while(move |r| r.start() < end)
            .filter(move |r| r.end() > start)
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.tree.len()
    }
}

const EMPTY: u64 = 0;

fn pack(seq: u64, pos: Pos) -> u64 {
    (seq << 32) | (u64::from(pos) + 1)
}

fn unpack(seq: u64, w: u64) -> Option<Pos> {
    (w != EMPTY && w >> 32 == seq & 0xffff_ffff).then(|| (w & 0xffff_ffff) as Pos - 1)
}

static NEXT_TABLE_ID: AtomicU64 = AtomicU64::new(1);

/// The writer's side: what `insert` and `remove` need without a scan.
#[derive(Debug, Default)]
struct Writer {
    /// Each region's start, by id.
    starts: HashMap<u64, usize>,
    /// `(length, start)` of every region: the last is the largest.
    sizes: BTreeSet<(usize, usize)>,
}

/// See the module docs.
#[derive(Debug)]
pub struct RegionTable {
    id: u64,
    snap: ArcSwap<Snapshot>,
    writer: Mutex<Writer>,
    seq: AtomicU64,
    cache: AtomicU8,
    shared: CachePadded<AtomicU64>,
    hash4: CachePadded<[AtomicU64; 4]>,
}

impl Default for RegionTable {
    fn default() -> Self {
        Self::new(LookupCache::PerThread)
    }
}

impl RegionTable {
    /// An empty table with the given cache scheme.
    pub fn new(cache: LookupCache) -> RegionTable {
        RegionTable {
            id: NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed),
            snap: ArcSwap::from_pointee(Snapshot::default()),
            writer: Mutex::new(Writer::default()),
            seq: AtomicU64::new(0),
            cache: AtomicU8::new(cache.to_u8()),
            shared: CachePadded::new(AtomicU64::new(EMPTY)),
            hash4: CachePadded::new([const { AtomicU64::new(EMPTY) }; 4]),
        }
    }

    /// The cache scheme in use.
    pub fn cache(&self) -> LookupCache {
        LookupCache::from_u8(self.cache.load(Ordering::Relaxed))
    }

    /// Switches the cache scheme (experiments); lookups in flight finish
    /// with the old one, which is equally correct.
    pub fn set_cache(&self, cache: LookupCache) {
        self.cache.store(cache.to_u8(), Ordering::Relaxed);
    }

    /// The region holding `addr`, if any.
    pub fn lookup(&self, addr: usize) -> Option<Arc<RegionInner>> {
        self.lookup_with(addr, Arc::clone)
    }

    /// Runs `f` on the region holding `addr`, if any: the one lookup
    /// function every address-taking path goes through. `f` must not look
    /// up in a region table itself (it would take the slow path).
    #[inline]
    pub fn lookup_with<R>(&self, addr: usize, f: impl FnOnce(&Arc<RegionInner>) -> R) -> Option<R> {
        // SeqCst pairs with the SeqCst store in `publish`, which follows the
        // new snapshot's store: seeing the new seq means seeing that snapshot.
        let seq = self.seq.load(Ordering::SeqCst);
        PER_THREAD.with(|c| match c.try_borrow_mut() {
            Ok(mut c) => {
                let c = &mut *c;
                if c.table != self.id || c.snap.as_ref().map(|s| s.seq) != Some(seq) {
                    c.table = self.id;
                    c.snap = Some(self.snap.load_full());
                    c.next = 0;
                    c.entries = [NO_ENTRY; 4];
                }
                let snap = c.snap.as_ref()?;
                self.lookup_in(snap, addr, &mut c.entries, &mut c.next, &mut c.counters, f)
            }
            // Re-entered from `f`: search a fresh snapshot, no cache.
            Err(_) => {
                let snap = self.snap.load_full();
                let (found, _) = snap.search(addr);
                found.map(|found| f(found.val))
            }
        })
    }

    /// The cached and searched lookup in `snap`; `entries` and `next` are
    /// the per-thread entries of the [`ThreadCache`] holding `snap` (their
    /// pointers point into it).
    #[inline]
    fn lookup_in<R>(
        &self,
        snap: &Snapshot,
        addr: usize,
        entries: &mut [Entry; 4],
        next: &mut usize,
        counters: &mut LookupCounters,
        f: impl FnOnce(&Arc<RegionInner>) -> R,
    ) -> Option<R> {
        let scheme = self.cache();
        if scheme == LookupCache::PerThread {
            if let Some(&(_, _, r)) = entries.iter().find(|&&(s, e, _)| addr >= s && addr < e) {
                // SAFETY: a non-empty entry (an empty one contains no
                // address) points into a leaf of `snap`, the snapshot this
                // thread holds; see `ThreadCache`'s invariant.
                let r = unsafe { &*r };
                counters.count(true, 0);
                return Some(f(r));
            }
        }
        let slot = match scheme {
            LookupCache::Shared | LookupCache::SharedLargest => Some(&*self.shared),
            LookupCache::Hash4 => Some(&self.hash4[(addr >> 21) & 3]),
            _ => None,
        };
        if let Some(slot) = slot {
            if let Some(r) =
                unpack(snap.seq, slot.load(Ordering::Relaxed)).and_then(|pos| snap.holds(pos, addr))
            {
                counters.count(true, 0);
                return Some(f(r));
            }
        }
        if scheme == LookupCache::SharedLargest {
            if let Some(r) = snap.largest.as_ref().filter(|r| r.contains(addr)) {
                counters.count(true, 0);
                return Some(f(r));
            }
        }
        let (found, depth) = snap.search(addr);
        counters.count(false, depth);
        let Found { pos, val: r, .. } = found?;
        match (slot, pos) {
            (Some(slot), Some(pos)) => slot.store(pack(snap.seq, pos), Ordering::Relaxed),
            (None, _) if scheme == LookupCache::PerThread => {
                entries[*next] = (r.start(), r.end(), std::ptr::from_ref(r));
                *next = (*next + 1) % 4;
            }
            _ => {}
        }
        Some(f(r))
    }

    /// Publishes `tree` as the next snapshot; caller holds `writer`.
    fn publish(&self, w: &Writer, tree: Tree<Arc<RegionInner>>) {
        let largest = w
            .sizes
            .last()
            .and_then(|&(_, start)| tree.find(start).0)
            .map(|f| Arc::clone(f.val));
        // SeqCst: a lookup that starts after this returns sees the new seq.
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.snap.store(Arc::new(Snapshot { seq, tree, largest }));
    }

    /// Adds a region (its range must overlap none in the table: the kernel
    /// gave it a fresh mapping). O(log n).
    pub fn insert(&self, region: Arc<RegionInner>) {
        let mut w = self.writer.lock();
        let (start, len, id) = (region.start(), region.end() - region.start(), region.id);
        debug_assert!(!self.overlaps(start, start + len));
        let mut tree = self.snap.load().tree.clone();
        tree.insert(start, region);
        w.starts.insert(id, start);
        w.sizes.insert((len, start));
        self.publish(&w, tree);
    }

    /// Removes the region with id `id`; returns whether it was there.
    /// O(log n).
    pub fn remove(&self, id: u64) -> bool {
        let mut w = self.writer.lock();
        let Some(start) = w.starts.remove(&id) else {
            return false;
        };
        let mut tree = self.snap.load().tree.clone();
        let Some(r) = tree.remove(start) else {
            debug_assert!(false, "region {id} known to the writer but not in the tree");
            return false;
        };
        w.sizes.remove(&(r.end() - r.start(), start));
        self.publish(&w, tree);
        true
    }

    /// Whether any region's range overlaps `[start, end)` (regions are
    /// disjoint and sorted by start, so only the last one starting before
    /// `end` can).
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        let Some(last) = end.checked_sub(1) else {
            return false;
        };
        let snap = self.snap.load();
        snap.tree.find(last).0.is_some_and(|f| f.val.end() > start)
    }

    /// The current snapshot: iterate it without copying the table (it keeps
    /// the regions it lists alive while held).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snap.load_full()
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.snap.load().len()
    }

    /// Whether the table is empty.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PageSize;
    use crate::store::Zero;
    use faultline_sys::mem::Mapping;
    use faultline_sys::PAGE_SIZE;
    use proptest::prelude::*;

    /// `n` regions of one page each, carved out of one mapping (no syscall
    /// per region; regions are not registered with any userfaultfd).
    fn regions(n: usize) -> Vec<Arc<RegionInner>> {
        let m = Mapping::anonymous(n * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        m.split(PAGE_SIZE)
            .expect("split")
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                Arc::new(RegionInner::new(
                    i as u64 + 1,
                    m,
                    PageSize::Base4K,
                    Arc::new(Zero),
                    1,
                    false,
                ))
            })
            .collect()
    }

    /// One-page regions, then four of 2..=5 pages (so the largest region
    /// changes as they come and go).
    fn pool() -> Vec<Arc<RegionInner>> {
        let mut pool = regions(POOL);
        for pages in 2..6usize {
            let m = Mapping::anonymous(pages * PAGE_SIZE, PAGE_SIZE).expect("mmap");
            let id = 10_000 + pages as u64;
            pool.push(Arc::new(RegionInner::new(
                id,
                m,
                PageSize::Base4K,
                Arc::new(Zero),
                1,
                false,
            )));
        }
        pool
    }

    /// Enough one-page regions for a three-level tree.
    const POOL: usize = 1200;

    proptest! {
        /// Random inserts, removes and lookups against a Vec oracle, for
        /// every cache scheme; the tables grow to hundreds of regions, so
        /// tree nodes split and merge under the caches.
        #[test]
        fn against_vec_oracle(ops in proptest::collection::vec((0u8..5, 0usize..POOL + 4, 0usize..4 * PAGE_SIZE), 1..3000), cache in 0usize..5) {
            let pool = pool();
            let t = RegionTable::new(LookupCache::ALL[cache]);
            let mut oracle: Vec<Arc<RegionInner>> = Vec::new();
            for (op, i, off) in ops {
                let r = &pool[i];
                match op {
                    0 | 1 if !oracle.iter().any(|o| o.id == r.id) => {
                        t.insert(Arc::clone(r));
                        oracle.push(Arc::clone(r));
                    }
                    2 => {
                        let had = oracle.iter().any(|o| o.id == r.id);
                        prop_assert_eq!(t.remove(r.id), had);
                        oracle.retain(|o| o.id != r.id);
                    }
                    _ => {
                        // Twice: a miss that fills the cache, then its hit.
                        for addr in [r.start() + off, r.start() + off / 2] {
                            let want = oracle.iter().find(|o| o.contains(addr)).map(|o| o.id);
                            prop_assert_eq!(t.lookup_with(addr, |x| x.id), want);
                        }
                        // And an address in no region at all.
                        prop_assert!(t.lookup(8).is_none());
                    }
                }
            }
            prop_assert_eq!(t.len(), oracle.len());
            let snap = t.snapshot();
            oracle.sort_by_key(|o| o.start());
            prop_assert!(snap.iter().map(|r| r.id).eq(oracle.iter().map(|o| o.id)));
            let largest = oracle.iter().map(|o| o.end() - o.start()).max();
            prop_assert_eq!(snap.largest.as_ref().map(|r| r.end() - r.start()), largest);
        }
    }

    #[test]
    fn hundred_thousand_regions() {
        let n = 100_000;
        let all = regions(n);
        for cache in LookupCache::ALL {
            let t = RegionTable::new(cache);
            // One at a time, as map() does: O(log n) each.
            for r in &all {
                t.insert(Arc::clone(r));
            }
            assert_eq!(t.len(), n);
            for (i, r) in all.iter().enumerate().step_by(97) {
                assert_eq!(
                    t.lookup_with(r.start() + 5, |x| x.id),
                    Some(i as u64 + 1),
                    "{cache:?}"
                );
                // Again: a hit for the caching schemes.
                assert_eq!(
                    t.lookup_with(r.start() + 9, |x| x.id),
                    Some(i as u64 + 1),
                    "{cache:?}"
                );
            }
            let c = thread_counters();
            if cache != LookupCache::None {
                assert!(c.hits > 0, "{cache:?}: {c:?}");
            }
            reset_thread_counters();
            let snap = t.snapshot();
            assert!(snap.iter().map(|r| r.id).eq(1..=n as u64), "{cache:?}");
            let mid = all[n / 2].start();
            let near: Vec<u64> = snap
                .overlapping(mid - 1, mid + PAGE_SIZE + 1)
                .map(|r| r.id)
                .collect();
            assert_eq!(near, [n as u64 / 2, n as u64 / 2 + 1, n as u64 / 2 + 2]);
            drop(snap);
            // Every other region, then the rest: the tree shrinks back.
            for r in all.iter().step_by(2).chain(all.iter().skip(1).step_by(2)) {
                assert!(t.remove(r.id));
            }
            assert!(t.is_empty() && t.lookup(all[7].start()).is_none());
        }
    }

    /// Lookups racing with map/unmap never return a region after its
    /// removal completed.
    #[test]
    fn no_stale_region_after_remove() {
        let pool = regions(32);
        for cache in LookupCache::ALL {
            let t = RegionTable::new(cache);
            for r in &pool {
                t.insert(Arc::clone(r));
            }
            let removed: Vec<AtomicU64> = (0..pool.len()).map(|_| AtomicU64::new(0)).collect();
            std::thread::scope(|s| {
                let (t, removed, pool) = (&t, &removed, &pool);
                s.spawn(move || {
                    for (i, r) in pool.iter().enumerate() {
                        t.remove(r.id);
                        removed[i].store(1, Ordering::SeqCst);
                        std::thread::yield_now();
                    }
                });
                for _ in 0..2 {
                    s.spawn(move || {
                        for round in 0..2000 {
                            let i = round % pool.len();
                            let was_removed = removed[i].load(Ordering::SeqCst) == 1;
                            let found = t.lookup_with(pool[i].start(), |x| x.id);
                            if was_removed {
                                assert_eq!(
                                    found, None,
                                    "{cache:?}: region {i} found after its removal"
                                );
                            }
                        }
                    });
                }
            });
            assert!(t.is_empty());
        }
    }
}
