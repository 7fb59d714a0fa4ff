//! The region table: finds the region holding an address, with an optional
//! lookup cache in front (seed 002).
//!
//! Readers take no lock: the table is an immutable [`Snapshot`] — regions
//! sorted by start, the index of the largest, and the sequence number it was
//! published under — behind an `ArcSwap` (RCU-style). A writer (map or unmap)
//! takes the `writer` mutex, copies the snapshot, changes the copy, bumps
//! `seq` and publishes.
//!
//! Invariants of every snapshot: sorted by `start`, ranges pairwise disjoint,
//! `snapshot.seq` = the table's `seq` when it was published. A cache entry
//! names a snapshot sequence number and is used only while it equals the
//! current one, so after `remove` returns no lookup that starts afterwards can
//! return the removed region (the `seq` bump is SeqCst and so is its load).
//!
//! Caches ([`LookupCache`], switchable at run time for experiments):
//! - `None`: binary search of the snapshot every time.
//! - `Shared`: one last-hit entry for the whole table (the original
//!   `mmap_cache`): an `AtomicU64` packing `(seq, index)`, Relaxed (a hint
//!   validated against the snapshot).
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

use super::RegionInner;
use crate::config::LookupCache;
use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::cell::RefCell;
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
            entries: [(0, 0, 0); 4],
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
/// scheme its last hits as `(start, end, index into snap)`.
///
/// Holding the snapshot here keeps the regions it lists alive until this
/// thread's next lookup after a change (or its exit): a removed region's
/// address range is unmapped a little later, never too early.
struct ThreadCache {
    table: u64,
    snap: Option<Arc<Snapshot>>,
    next: usize,
    entries: [(usize, usize, usize); 4],
    counters: LookupCounters,
}

/// One published state of the table.
#[derive(Debug, Default)]
pub struct Snapshot {
    seq: u64,
    regions: Vec<Arc<RegionInner>>,
    largest: Option<usize>,
}

impl Snapshot {
    /// Binary search: the index of the region holding `addr`, and the steps.
    fn search(&self, addr: usize) -> (Option<usize>, u32) {
        let (mut lo, mut hi, mut steps) = (0usize, self.regions.len(), 0u32);
        while lo < hi {
            steps += 1;
            let mid = lo + (hi - lo) / 2;
            if self.regions[mid].start() <= addr {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let i = lo
            .checked_sub(1)
            .filter(|&i| self.regions[i].contains(addr));
        (i, steps)
    }

    fn holds(&self, idx: usize, addr: usize) -> bool {
        self.regions.get(idx).is_some_and(|r| r.contains(addr))
    }
}

const EMPTY: u64 = 0;

fn pack(seq: u64, idx: usize) -> u64 {
    (seq << 32) | (idx as u64 + 1)
}

fn unpack(seq: u64, w: u64) -> Option<usize> {
    (w != EMPTY && w >> 32 == seq & 0xffff_ffff).then(|| (w & 0xffff_ffff) as usize - 1)
}

static NEXT_TABLE_ID: AtomicU64 = AtomicU64::new(1);

/// See the module docs.
#[derive(Debug)]
pub struct RegionTable {
    id: u64,
    snap: ArcSwap<Snapshot>,
    writer: Mutex<()>,
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
            writer: Mutex::new(()),
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
                    c.entries = [(0, 0, 0); 4];
                }
                let snap = c.snap.as_ref()?;
                self.lookup_in(snap, addr, &mut c.entries, &mut c.next, &mut c.counters, f)
            }
            // Re-entered from `f`: search a fresh snapshot, no cache.
            Err(_) => {
                let snap = self.snap.load_full();
                let (found, _) = snap.search(addr);
                found.map(|i| f(&snap.regions[i]))
            }
        })
    }

    #[inline]
    fn lookup_in<R>(
        &self,
        snap: &Snapshot,
        addr: usize,
        entries: &mut [(usize, usize, usize); 4],
        next: &mut usize,
        counters: &mut LookupCounters,
        f: impl FnOnce(&Arc<RegionInner>) -> R,
    ) -> Option<R> {
        let scheme = self.cache();
        if scheme == LookupCache::PerThread {
            if let Some(&(_, _, i)) = entries.iter().find(|&&(s, e, _)| addr >= s && addr < e) {
                counters.count(true, 0);
                return Some(f(&snap.regions[i]));
            }
        }
        let slot = match scheme {
            LookupCache::Shared | LookupCache::SharedLargest => Some(&*self.shared),
            LookupCache::Hash4 => Some(&self.hash4[(addr >> 21) & 3]),
            _ => None,
        };
        if let Some(slot) = slot {
            if let Some(i) = unpack(snap.seq, slot.load(Ordering::Relaxed)) {
                if snap.holds(i, addr) {
                    counters.count(true, 0);
                    return Some(f(&snap.regions[i]));
                }
            }
        }
        if scheme == LookupCache::SharedLargest {
            if let Some(i) = snap.largest.filter(|&i| snap.holds(i, addr)) {
                counters.count(true, 0);
                return Some(f(&snap.regions[i]));
            }
        }
        let (found, depth) = snap.search(addr);
        counters.count(false, depth);
        let i = found?;
        match slot {
            Some(slot) => slot.store(pack(snap.seq, i), Ordering::Relaxed),
            None if scheme == LookupCache::PerThread => {
                let r = &snap.regions[i];
                entries[*next] = (r.start(), r.end(), i);
                *next = (*next + 1) % 4;
            }
            None => {}
        }
        Some(f(&snap.regions[i]))
    }

    fn publish(&self, regions: Vec<Arc<RegionInner>>) {
        // SeqCst: a lookup that starts after this returns sees the new seq.
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let largest = (0..regions.len()).max_by_key(|&i| regions[i].end() - regions[i].start());
        self.snap.store(Arc::new(Snapshot {
            seq,
            regions,
            largest,
        }));
    }

    /// Adds a region (its range must overlap none in the table: the kernel
    /// gave it a fresh mapping).
    pub fn insert(&self, region: Arc<RegionInner>) {
        let _w = self.writer.lock();
        let mut next: Vec<Arc<RegionInner>> = self.snap.load().regions.clone();
        let i = next.partition_point(|r| r.start() < region.start());
        debug_assert!(next.get(i).is_none_or(|r| r.start() >= region.end()));
        next.insert(i, region);
        self.publish(next);
    }

    /// Removes the region with id `id`; returns whether it was there.
    pub fn remove(&self, id: u64) -> bool {
        let _w = self.writer.lock();
        let mut next: Vec<Arc<RegionInner>> = self.snap.load().regions.clone();
        let before = next.len();
        next.retain(|r| r.id != id);
        let removed = next.len() != before;
        self.publish(next);
        removed
    }

    /// Whether any region's range overlaps `[start, end)` (regions are
    /// disjoint and sorted by start, so only the last one starting before
    /// `end` can).
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        let snap = self.snap.load();
        let i = snap.regions.partition_point(|r| r.start() < end);
        i > 0 && snap.regions[i - 1].end() > start
    }

    /// The regions, sorted by start (a copy of the current snapshot's list).
    pub fn regions(&self) -> Vec<Arc<RegionInner>> {
        self.snap.load().regions.clone()
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.snap.load().regions.len()
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

    proptest! {
        /// Random inserts, removes and lookups against a Vec oracle, for
        /// every cache scheme.
        #[test]
        fn against_vec_oracle(ops in proptest::collection::vec((0u8..3, 0usize..64, 0usize..4096), 1..200), cache in 0usize..5) {
            let pool = regions(64);
            let t = RegionTable::new(LookupCache::ALL[cache]);
            let mut oracle: Vec<Arc<RegionInner>> = Vec::new();
            for (op, i, off) in ops {
                let r = &pool[i];
                match op {
                    0 if !oracle.iter().any(|o| o.id == r.id) => {
                        t.insert(Arc::clone(r));
                        oracle.push(Arc::clone(r));
                    }
                    1 => {
                        let had = oracle.iter().any(|o| o.id == r.id);
                        prop_assert_eq!(t.remove(r.id), had);
                        oracle.retain(|o| o.id != r.id);
                    }
                    _ => {
                        let addr = r.start() + off;
                        let want = oracle.iter().find(|o| o.contains(addr)).map(|o| o.id);
                        prop_assert_eq!(t.lookup_with(addr, |x| x.id), want);
                        // And an address in no region at all.
                        prop_assert!(t.lookup(8).is_none());
                    }
                }
            }
            prop_assert_eq!(t.len(), oracle.len());
        }
    }

    #[test]
    fn hundred_thousand_regions() {
        let n = 100_000;
        let all = regions(n);
        for cache in LookupCache::ALL {
            let t = RegionTable::new(cache);
            // Insert in bulk: one snapshot built once, as map() would over
            // time.
            {
                let _w = t.writer.lock();
                t.publish(all.clone());
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
