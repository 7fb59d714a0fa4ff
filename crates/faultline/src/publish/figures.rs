//! The figures a publication copies: the manager's snapshot (the same as
//! `Manager::stats`), the merged service times with their percentiles, the
//! walk counting resident and parked pages, and the activity sum that tells
//! an idle manager from a working one. Locks: those `snapshot` takes (the
//! reserve, the budget's lock and the balloon's ledger under it, each
//! fault lock and histogram mutex in turn, briefly).

use crate::core::Core;
use crate::frame::FrameAllocator;
use crate::region::PageState;
use crate::stats::{LatencySummary, StatsSnapshot};
use faultline_sys::PAGE_SIZE;
use hdrhistogram::Histogram;
use std::sync::atomic::Ordering;

/// The manager's statistics now (`Manager::stats`), with the workers'
/// merged service-time histogram.
pub(crate) fn snapshot(c: &Core) -> (StatsSnapshot, Histogram<u64>) {
    let merged = c.stats.merged_service();
    (snapshot_with(c, LatencySummary::of(&merged)), merged)
}

/// [`snapshot`] with the summary of the workers' merged service times
/// given.
pub(super) fn snapshot_with(c: &Core, service: LatencySummary) -> StatsSnapshot {
    // Reserve frames are free memory that happens to be zeroed already.
    let reserve = c.reserve.lock().len() * crate::frame::PAGES_PER_HUGE;
    // Frames given back to the kernel: idle ones are free memory (taken
    // back on demand); withheld ones are outside the budget.
    // (Under the ledger's lock, frames in the middle of an inflate or
    // deflate are counted once; under the budget's, the overhead's share
    // of the withheld frames is the ledger's.)
    let changing = c.budget_lock.lock();
    let ledger = c.balloon.ledger();
    let (held, withheld) = ledger.counts();
    let free = c.alloc.free_pages() + reserve + (held - withheld);
    let overhead = c.overhead_withheld.load(Ordering::Relaxed);
    drop(ledger);
    drop(changing);
    let mut snap = c
        .stats
        .snapshot_of(service, c.pool.pages() - withheld, free);
    snap.budget_frames = c.alloc.pages_in(0) - withheld + overhead;
    snap.frames_overhead = overhead;
    snap.locks = c.locks.stat();
    snap.frames_prezeroed = reserve;
    // The running sum (regions still alive), not a walk of every region:
    // an idle manager publishes once a second, and 10^5 regions made
    // that walk 3% of a CPU.
    snap.metadata_bytes = c.overhead_sum.state_bytes() + c.fps.bytes();
    snap
}

/// Resident and parked pages, in 4 KiB frames (a racy walk of the pages in
/// use, exact when no page changes state).
pub(super) fn count_states(c: &Core) -> (u64, u64) {
    let (mut resident, mut parked) = (0u64, 0u64);
    for r in c.table.snapshot().iter() {
        let per = (r.page_size.bytes() / PAGE_SIZE) as u64;
        for p in r.used_pages(0..r.pages()) {
            match r.state(p) {
                PageState::Resident(_) => resident += per,
                PageState::Parked(_) => parked += per,
                _ => {}
            }
        }
    }
    (resident, parked)
}

/// The workers' service times merged, with the figures taken from them,
/// as of `count` samples.
#[derive(Debug)]
pub(super) struct Merged {
    pub(super) count: u64,
    pub(super) hist: Histogram<u64>,
    pub(super) summary: LatencySummary,
    pub(super) p90: u64,
    pub(super) p999: u64,
}

impl Merged {
    pub(super) fn of(count: u64, hist: Histogram<u64>) -> Merged {
        let q = |f: f64| {
            if hist.is_empty() {
                0
            } else {
                hist.value_at_quantile(f)
            }
        };
        Merged {
            count,
            summary: LatencySummary::of(&hist),
            p90: q(0.9),
            p999: q(0.999),
            hist,
        }
    }
}

/// Counters that move whenever the manager works (faults, reclaim,
/// write-back, migration): equal between two publications means idle.
pub(super) fn activity(core: &Core) -> u64 {
    let s = &core.stats;
    [
        &s.faults_4k,
        &s.faults_2m,
        &s.parked,
        &s.unparked,
        &s.evicted,
        &s.written_back,
        &s.migrated_pages,
        &s.discarded,
    ]
    .iter()
    .map(|c| c.load(Ordering::Relaxed))
    .fold(0u64, u64::wrapping_add)
}
