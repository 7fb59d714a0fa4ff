//! The region table: finds the region holding an address.
//!
//! Readers take no lock: the table is an immutable snapshot — a `Vec` of
//! regions sorted by start address — behind an `ArcSwap` (RCU-style). A
//! writer (map or unmap) takes the `writer` mutex, copies the snapshot,
//! changes the copy and publishes it, then bumps `seq`.
//!
//! Invariants of every snapshot: sorted by `start`, ranges pairwise disjoint.
//! Once `remove` returns, no `lookup` that starts afterwards returns the
//! removed region (the store of the new snapshot is SeqCst, as is arc-swap's
//! load). `seq` counts changes (Release on bump, pairs with the Acquire load
//! of anyone caching lookups against it).
//!
//! Every address-taking path (the fault path and the API) goes through
//! [`RegionTable::lookup`].

use super::RegionInner;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct RegionTable {
    snap: ArcSwap<Vec<Arc<RegionInner>>>,
    writer: Mutex<()>,
    seq: AtomicU64,
}

impl Default for RegionTable {
    fn default() -> Self {
        Self::new()
    }
}

impl RegionTable {
    /// An empty table.
    pub fn new() -> RegionTable {
        RegionTable {
            snap: ArcSwap::from_pointee(Vec::new()),
            writer: Mutex::new(()),
            seq: AtomicU64::new(0),
        }
    }

    /// The region holding `addr`, if any.
    pub fn lookup(&self, addr: usize) -> Option<Arc<RegionInner>> {
        let snap = self.snap.load();
        let i = snap.partition_point(|r| r.start() <= addr);
        let r = snap.get(i.checked_sub(1)?)?;
        r.contains(addr).then(|| Arc::clone(r))
    }

    /// Adds a region (its range must overlap none in the table: the kernel
    /// gave it a fresh mapping).
    pub fn insert(&self, region: Arc<RegionInner>) {
        let _w = self.writer.lock();
        let mut next: Vec<Arc<RegionInner>> = Vec::clone(&self.snap.load());
        let i = next.partition_point(|r| r.start() < region.start());
        debug_assert!(next.get(i).is_none_or(|r| r.start() >= region.end()));
        next.insert(i, region);
        self.snap.store(Arc::new(next));
        self.seq.fetch_add(1, Ordering::Release);
    }

    /// Removes the region with id `id`; returns whether it was there.
    pub fn remove(&self, id: u64) -> bool {
        let _w = self.writer.lock();
        let mut next: Vec<Arc<RegionInner>> = Vec::clone(&self.snap.load());
        let before = next.len();
        next.retain(|r| r.id != id);
        let removed = next.len() != before;
        self.snap.store(Arc::new(next));
        self.seq.fetch_add(1, Ordering::Release);
        removed
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.snap.load().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Changes so far (pairs with caches that validate against it).
    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }
}
