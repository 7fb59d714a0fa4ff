//! Statistics: event counters and a fault service-time histogram.
//!
//! Counters are `Relaxed` atomics: each is an independent tally, read only
//! for reporting, and never used to order other memory. The histogram is
//! split per worker (`hist[worker]`, each behind its own uncontended mutex)
//! and merged when a snapshot is taken.
//!
//! Service time is measured in the worker from the moment it picks the event
//! up to the moment the page is resolved; the latency an application thread
//! sees adds the kernel's queueing and the wake-ups (see `faultline bench
//! fault` for that).

use crate::locks::LockStat;
use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Shared counters, updated by the fault path.
#[derive(Debug)]
pub struct Stats {
    pub(crate) faults_4k: AtomicU64,
    pub(crate) faults_2m: AtomicU64,
    pub(crate) moves: AtomicU64,
    pub(crate) copies: AtomicU64,
    pub(crate) stale_dropped: AtomicU64,
    pub(crate) clean_dropped: AtomicU64,
    pub(crate) protection_lifted: AtomicU64,
    pub(crate) already_mapped: AtomicU64,
    pub(crate) refaulted_dropped: AtomicU64,
    pub(crate) stray: AtomicU64,
    pub(crate) poisoned: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) fills_cleared: AtomicU64,
    pub(crate) fills_prezeroed: AtomicU64,
    pub(crate) fills_store: AtomicU64,
    pub(crate) move_retries: AtomicU64,
    pub(crate) move_misreported: AtomicU64,
    pub(crate) move_dropped: AtomicU64,
    pub(crate) pt_discards: AtomicU64,
    pub(crate) fault_around_pages: AtomicU64,
    pub(crate) unmapped_pages: AtomicU64,
    pub(crate) deferrals: AtomicU64,
    pub(crate) prezeroed_made: AtomicU64,
    pub(crate) readaheads: AtomicU64,
    pub(crate) unparked: AtomicU64,
    pub(crate) parked: AtomicU64,
    pub(crate) reclaim_held: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) written_back: AtomicU64,
    pub(crate) clean_skipped: AtomicU64,
    pub(crate) reclaim_waits: AtomicU64,
    pub(crate) migrated_pages: AtomicU64,
    pub(crate) collapses: AtomicU64,
    pub(crate) migrate_left_parked: AtomicU64,
    pub(crate) unmapped_by_program: AtomicU64,
    pub(crate) removed_by_program: AtomicU64,
    pub(crate) discarded: AtomicU64,
    pub(crate) ballooned: AtomicU64,
    pub(crate) unballooned: AtomicU64,
    pub(crate) poison_retries: AtomicU64,
    pub(crate) spare_serves: AtomicU64,
    pub(crate) errors_dropped: AtomicU64,
    pub(crate) copy_chunks_helped: AtomicU64,
    /// Store reads on the fault path (fills), timed, with their pages'
    /// fingerprints.
    pub(crate) store_reads: LogHist,
    /// Store writes (write-back), timed.
    pub(crate) store_writes: LogHist,
    hist: Box<[CachePadded<Mutex<Histogram<u64>>>]>,
}

fn new_hist() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits; the bounds are constants, so
    // this cannot fail.
    Histogram::new_with_bounds(1, 100_000_000_000, 3)
        .unwrap_or_else(|_| unreachable!("constant bounds"))
}

impl Stats {
    /// Counters at zero, with one histogram per worker.
    pub fn new(workers: usize) -> Stats {
        Stats {
            faults_4k: AtomicU64::new(0),
            faults_2m: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            stale_dropped: AtomicU64::new(0),
            clean_dropped: AtomicU64::new(0),
            protection_lifted: AtomicU64::new(0),
            already_mapped: AtomicU64::new(0),
            refaulted_dropped: AtomicU64::new(0),
            stray: AtomicU64::new(0),
            poisoned: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            fills_cleared: AtomicU64::new(0),
            fills_prezeroed: AtomicU64::new(0),
            fills_store: AtomicU64::new(0),
            move_retries: AtomicU64::new(0),
            move_misreported: AtomicU64::new(0),
            move_dropped: AtomicU64::new(0),
            pt_discards: AtomicU64::new(0),
            fault_around_pages: AtomicU64::new(0),
            unmapped_pages: AtomicU64::new(0),
            deferrals: AtomicU64::new(0),
            prezeroed_made: AtomicU64::new(0),
            readaheads: AtomicU64::new(0),
            unparked: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            reclaim_held: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            clean_skipped: AtomicU64::new(0),
            reclaim_waits: AtomicU64::new(0),
            migrated_pages: AtomicU64::new(0),
            collapses: AtomicU64::new(0),
            migrate_left_parked: AtomicU64::new(0),
            unmapped_by_program: AtomicU64::new(0),
            removed_by_program: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            ballooned: AtomicU64::new(0),
            unballooned: AtomicU64::new(0),
            poison_retries: AtomicU64::new(0),
            spare_serves: AtomicU64::new(0),
            errors_dropped: AtomicU64::new(0),
            copy_chunks_helped: AtomicU64::new(0),
            written_back: AtomicU64::new(0),
            store_reads: LogHist::default(),
            store_writes: LogHist::default(),
            hist: (0..workers.max(1))
                .map(|_| CachePadded::new(Mutex::new(new_hist())))
                .collect(),
        }
    }

    /// Adds one to `c`.
    #[inline]
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one fault's service time.
    pub(crate) fn record_service(&self, worker: usize, ns: u64) {
        let mut h = self.hist[worker % self.hist.len()].lock();
        h.saturating_record(ns.max(1));
    }

    /// Service times recorded so far, all workers.
    pub(crate) fn service_count(&self) -> u64 {
        self.hist.iter().map(|h| h.lock().len()).sum()
    }

    /// The workers' service-time histograms, merged.
    pub(crate) fn merged_service(&self) -> Histogram<u64> {
        let mut merged = new_hist();
        for h in self.hist.iter() {
            // Both histograms share bounds; adding cannot fail.
            let _ = merged.add(&*h.lock());
        }
        merged
    }

    /// A consistent-enough copy of every counter (each read individually).
    #[cfg(test)]
    pub fn snapshot(&self, frames_total: usize, frames_free: usize) -> StatsSnapshot {
        let service = LatencySummary::of(&self.merged_service());
        self.snapshot_of(service, frames_total, frames_free)
    }

    /// [`Stats::snapshot`] with the merged service histogram's summary
    /// given.
    pub(crate) fn snapshot_of(
        &self,
        service: LatencySummary,
        frames_total: usize,
        frames_free: usize,
    ) -> StatsSnapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            faults_4k: r(&self.faults_4k),
            faults_2m: r(&self.faults_2m),
            moves: r(&self.moves),
            copies: r(&self.copies),
            stale_dropped: r(&self.stale_dropped),
            clean_dropped: r(&self.clean_dropped),
            protection_lifted: r(&self.protection_lifted),
            already_mapped: r(&self.already_mapped),
            refaulted_dropped: r(&self.refaulted_dropped),
            stray: r(&self.stray),
            poisoned: r(&self.poisoned),
            errors: r(&self.errors),
            fills_cleared: r(&self.fills_cleared),
            fills_prezeroed: r(&self.fills_prezeroed),
            fills_store: r(&self.fills_store),
            move_retries: r(&self.move_retries),
            move_misreported: r(&self.move_misreported),
            move_dropped: r(&self.move_dropped),
            pt_discards: r(&self.pt_discards),
            fault_around_pages: r(&self.fault_around_pages),
            unmapped_pages: r(&self.unmapped_pages),
            deferrals: r(&self.deferrals),
            written_back: r(&self.written_back),
            clean_skipped: r(&self.clean_skipped),
            reclaim_waits: r(&self.reclaim_waits),
            evicted: r(&self.evicted),
            parked: r(&self.parked),
            reclaim_held: r(&self.reclaim_held),
            unparked: r(&self.unparked),
            prezeroed_made: r(&self.prezeroed_made),
            readaheads: r(&self.readaheads),
            migrated_pages: r(&self.migrated_pages),
            collapses: r(&self.collapses),
            migrate_left_parked: r(&self.migrate_left_parked),
            unmapped_by_program: r(&self.unmapped_by_program),
            removed_by_program: r(&self.removed_by_program),
            discarded: r(&self.discarded),
            ballooned: r(&self.ballooned),
            unballooned: r(&self.unballooned),
            poison_retries: r(&self.poison_retries),
            spare_serves: r(&self.spare_serves),
            errors_dropped: r(&self.errors_dropped),
            copy_chunks_helped: r(&self.copy_chunks_helped),
            locks: LockStat::default(),
            frames_prezeroed: 0,
            metadata_bytes: 0,
            budget_frames: 0,
            frames_overhead: 0,
            frames_total,
            frames_free,
            service,
            store_reads: self.store_reads.summary(),
            store_writes: self.store_writes.summary(),
        }
    }
}

/// A lock-free latency histogram for store calls: log-linear buckets (four
/// per power of two, so a percentile is within 12.5%), a count and a sum.
/// Recording is three `Relaxed` adds; summaries read each bucket once (a
/// racy but consistent-enough view, like the counters).
#[derive(Debug)]
pub(crate) struct LogHist {
    buckets: Box<[AtomicU64; LOG_BUCKETS]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
}

const LOG_BUCKETS: usize = 64 * 4;

impl Default for LogHist {
    fn default() -> Self {
        LogHist {
            buckets: Box::new([const { AtomicU64::new(0) }; LOG_BUCKETS]),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl LogHist {
    /// The bucket of `ns`: its power of two and the next two bits.
    fn bucket(ns: u64) -> usize {
        let exp = 63 - (ns | 1).leading_zeros() as usize;
        let sub = if exp >= 2 {
            (ns >> (exp - 2)) & 3
        } else {
            ns & 3
        };
        exp * 4 + sub as usize
    }

    /// The middle of bucket `b`'s range.
    fn value(b: usize) -> u64 {
        let (exp, sub) = (b / 4, (b % 4) as u64);
        if exp < 2 {
            return sub;
        }
        let step = 1u64 << (exp - 2);
        (4 + sub) * step + step / 2
    }

    /// Records one call of `ns` nanoseconds.
    pub(crate) fn record(&self, ns: u64) {
        self.buckets[Self::bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Count, median, 99th percentile, maximum bucket and mean.
    pub(crate) fn summary(&self) -> LatencySummary {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return LatencySummary::default();
        }
        let at = |q: f64| {
            let want = ((total as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (b, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= want {
                    return Self::value(b);
                }
            }
            0
        };
        LatencySummary {
            count: total,
            p50_ns: at(0.5),
            p99_ns: at(0.99),
            max_ns: at(1.0),
            mean_ns: self.sum_ns.load(Ordering::Relaxed) as f64 / total as f64,
        }
    }
}

/// Percentiles of a latency histogram, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Maximum.
    pub max_ns: u64,
    /// Mean.
    pub mean_ns: f64,
}

impl LatencySummary {
    /// Summarizes `h`.
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: h.len(),
            p50_ns: h.value_at_quantile(0.5),
            p99_ns: h.value_at_quantile(0.99),
            max_ns: h.max(),
            mean_ns: h.mean(),
        }
    }
}

/// A copy of the manager's statistics at one moment.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Faults served on 4 KiB-page regions.
    pub faults_4k: u64,
    /// Faults served on 2 MiB-page regions.
    pub faults_2m: u64,
    /// Faults served by putting their page (or run) in place: a
    /// `UFFDIO_MOVE` of its frame, or a `UFFDIO_COPY` of its bytes
    /// (`FillModel::Copy`, counted in `copies` too).
    pub moves: u64,
    /// 4 KiB pages put into place by copy (`FillModel::Copy`): no TLB
    /// flush.
    pub copies: u64,
    /// Pool slots holding dead copies that were dropped (in batches of 64,
    /// one flush each: `frame/stale.rs`).
    pub stale_dropped: u64,
    /// Write-protected, unwritten pages reclaim dropped from their regions
    /// in batches, without parking (`FillModel::CopyProtected`; counted in
    /// `evicted` too).
    pub clean_dropped: u64,
    /// First writes to write-protected pages: a write-protect fault that
    /// lifted the protection (`FillModel::CopyProtected`).
    pub protection_lifted: u64,
    /// Faults that found their page already mapped (a racing thread's fault
    /// was served first): only a wake-up.
    pub already_mapped: u64,
    /// 4 KiB pages the application had dropped (`MADV_DONTNEED`) from a
    /// page faultline maps, refilled (store bytes or zeros) when the page was
    /// gathered back into its frame (`pagemove::recollect`).
    pub refaulted_dropped: u64,
    /// Events for addresses in no region (a region being unmapped).
    pub stray: u64,
    /// Pages poisoned because their fault could not be served (SIGBUS).
    pub poisoned: u64,
    /// Errors recorded (see [`crate::Manager::take_error`]).
    pub errors: u64,
    /// Frames cleared on the fault path.
    pub fills_cleared: u64,
    /// Frames that were already zero.
    pub fills_prezeroed: u64,
    /// Frames filled from a store.
    pub fills_store: u64,
    /// Rounds of the page-move protocol that had to move pages again after
    /// the kernel stopped part way (`pagemove`).
    pub move_retries: u64,
    /// Moves the kernel did not report as done that the page tables show
    /// complete (after the protocol's retries, or misreported outright).
    pub move_misreported: u64,
    /// 4 KiB pages a move into a region found dropped by the program when
    /// it looked again (moved, then zapped by an `MADV_DONTNEED` whose
    /// event was read while the move ran): left as the program's holes.
    pub move_dropped: u64,
    /// Empty page tables dropped before a 2 MiB move.
    pub pt_discards: u64,
    /// Pages mapped ahead of access by fault-around (besides the faulting
    /// page).
    pub fault_around_pages: u64,
    /// Pages moved back to the pool when their region was unmapped.
    pub unmapped_pages: u64,
    /// Batches a worker handed to the others before it blocked.
    pub deferrals: u64,
    /// Pages written back to their store (reclaim, flush, unmap).
    pub written_back: u64,
    /// Pages of writable stores found clean (their bytes are the store's) and
    /// so not written back, at eviction or flush.
    pub clean_skipped: u64,
    /// Faults that found no frame after four reclaim passes and got one by
    /// waiting for other workers to release theirs.
    pub reclaim_waits: u64,
    /// Pages reclaim evicted (frame freed).
    pub evicted: u64,
    /// Pages reclaim soft-unmapped (parked).
    pub parked: u64,
    /// Times reclaim passed over a resident page the kernel would not move
    /// out (`EBUSY`: shared copy-on-write with a child of `fork()` that
    /// inherited the region, or pinned for I/O); the hand skips such a page
    /// for a second after each refusal.
    pub reclaim_held: u64,
    /// Touches of parked pages (minor faults: the frame moved back).
    pub unparked: u64,
    /// 2 MiB frames the zeroing worker put in the reserve.
    pub prezeroed_made: u64,
    /// Faults that read ahead (mapped a run of following pages).
    pub readaheads: u64,
    /// Pages migrated to another pool (in their page size).
    pub migrated_pages: u64,
    /// 2 MiB blocks of 4 KiB pages collapsed into one huge frame.
    pub collapses: u64,
    /// Migrated pages left parked in their new frame because the kernel kept
    /// refusing the move in (the next touch maps them).
    pub migrate_left_parked: u64,
    /// Pages whose frames faultline gave up because the program unmapped
    /// them itself (`munmap`, `mremap` away; `UFFD_EVENT_UNMAP`).
    pub unmapped_by_program: u64,
    /// Pages whose frames went back to the pool because the program dropped
    /// them itself (`MADV_DONTNEED`, `MADV_FREE`; `UFFD_EVENT_REMOVE`).
    pub removed_by_program: u64,
    /// Pages whose frames went back to the pool by `Region::discard`.
    pub discarded: u64,
    /// 4 KiB pages of the pool whose memory went back to the kernel (the
    /// budget shrank, or free memory idled above the high watermark).
    pub ballooned: u64,
    /// Of those, pages taken back (refilled) since.
    pub unballooned: u64,
    /// The budget now, in 4 KiB frames (`Manager::set_budget`).
    pub budget_frames: usize,
    /// Of those, frames withheld to pay for faultline's own memory (page
    /// tables and metadata: `Config::budget_counts_overhead`).
    pub frames_overhead: usize,
    /// Poisoned pages given another try (the store is read again): their
    /// marker cleared after its back-off, or a fault on a dropped marker.
    pub poison_retries: u64,
    /// Events the spare servers handled while every worker was inside a
    /// store-backed fault (a slow store, or a store that reads another
    /// region).
    pub spare_serves: u64,
    /// Fault errors dropped from the full error queue (the oldest go).
    pub errors_dropped: u64,
    /// Migration copy chunks done by idle fault workers.
    pub copy_chunks_helped: u64,
    /// Fault lock statistics (lockstat), summed over the table.
    pub locks: LockStat,
    /// Pool size in 4 KiB frames.
    pub frames_total: usize,
    /// Free 4 KiB frames (including the pre-zeroed reserve).
    pub frames_free: usize,
    /// Of those, 4 KiB frames in the pre-zeroed 2 MiB reserve.
    pub frames_prezeroed: usize,
    /// Bytes of per-page metadata held now: the regions' page states (sparse:
    /// pages in use, plus a pointer per 2 MiB of untouched 4 KiB pages) and
    /// the per-frame fingerprints (16 bytes per pool frame).
    pub metadata_bytes: usize,
    /// Worker service time per fault.
    pub service: LatencySummary,
    /// Store reads on the fault path (fills from the store), per call
    /// (percentiles within 12.5%), with the fill's fingerprint of each
    /// page, taken as the store hands it over (`Store::read_pages_each`).
    pub store_reads: LatencySummary,
    /// Store writes (write-back), per call (percentiles within 12.5%).
    pub store_writes: LatencySummary,
}

impl StatsSnapshot {
    /// Faults of both page sizes.
    pub fn faults(&self) -> u64 {
        self.faults_4k + self.faults_2m
    }
}

/// Plain words, one subject a line: what a person reading a program's
/// output can follow without the source (`faultline demo` prints it).
impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used = self.frames_total - self.frames_free;
        let mib = |frames: usize| (frames * 4096) >> 20;
        writeln!(
            f,
            "faults      {} (4 KiB pages {}, 2 MiB pages {}); {} of them on a page another thread had just mapped, {} outside any region",
            self.faults(),
            self.faults_4k,
            self.faults_2m,
            self.already_mapped,
            self.stray
        )?;
        writeln!(
            f,
            "fills       {} zeroed on the fault, {} from frames zeroed ahead (the zeroing thread made {}), {} read from the store; {} pages mapped around a fault (fault-around)",
            self.fills_cleared,
            self.fills_prezeroed,
            self.prezeroed_made,
            self.fills_store,
            self.fault_around_pages
        )?;
        writeln!(
            f,
            "memory      {} MiB in use ({} of {} 4 KiB frames), {} MiB free ({} MiB zeroed) of a {} MiB budget; {} MiB of it pays for page tables and page states; {} MiB given back to the kernel while idle, {} MiB taken back",
            mib(used),
            used,
            self.frames_total,
            mib(self.frames_free),
            mib(self.frames_prezeroed),
            mib(self.budget_frames),
            mib(self.frames_overhead),
            mib(self.ballooned as usize),
            mib(self.unballooned as usize)
        )?;
        writeln!(
            f,
            "reclaim     {} pages taken out of their regions (kept in memory, \"parked\"), {} of them touched again and put back, {} evicted (frame reused); {} written back to the store, {} clean ones not written; {} read ahead; {} faults waited for a frame; {} pages the kernel would not move passed over",
            self.parked,
            self.unparked,
            self.evicted,
            self.written_back,
            self.clean_skipped,
            self.readaheads,
            self.reclaim_waits,
            self.reclaim_held
        )?;
        writeln!(
            f,
            "migration   {} pages migrated between pools ({} left parked), {} blocks collapsed into 2 MiB pages, {} copy pieces done by idle workers",
            self.migrated_pages, self.migrate_left_parked, self.collapses, self.copy_chunks_helped
        )?;
        writeln!(
            f,
            "locks       page locks taken {} times, {} had to wait ({:.1} ms in all); {} events handed to another server before a slow store call, {} served by spare servers",
            self.locks.acquisitions,
            self.locks.contentions,
            self.locks.wait_ns as f64 / 1e6,
            self.deferrals,
            self.spare_serves
        )?;
        writeln!(
            f,
            "moves       {} faults served by a move or copy, {} pages copied into place ({} dead copies dropped), {} page tables dropped for a 2 MiB page; {} moves retried, {} misreported by the kernel (each checked and completed), {} pages the program dropped during a move; {} clean write-protected pages dropped in batches, {} first writes lifted a protection",
            self.moves, self.copies, self.stale_dropped, self.pt_discards, self.move_retries, self.move_misreported, self.move_dropped, self.clean_dropped, self.protection_lifted
        )?;
        writeln!(
            f,
            "errors      {} ({} pages poisoned: their threads got SIGBUS)",
            self.errors, self.poisoned
        )?;
        write!(
            f,
            "service     a fault took p50 {:.1} us, p99 {:.1} us, max {:.1} us (n={})",
            self.service.p50_ns as f64 / 1e3,
            self.service.p99_ns as f64 / 1e3,
            self.service.max_ns as f64 / 1e3,
            self.service.count
        )?;
        if self.store_reads.count + self.store_writes.count > 0 {
            write!(
                f,
                "\nstore       {} reads (p50 {:.1} us, p99 {:.1} us), {} writes (p50 {:.1} us, p99 {:.1} us)",
                self.store_reads.count,
                self.store_reads.p50_ns as f64 / 1e3,
                self.store_reads.p99_ns as f64 / 1e3,
                self.store_writes.count,
                self.store_writes.p50_ns as f64 / 1e3,
                self.store_writes.p99_ns as f64 / 1e3
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_merges_workers() {
        let s = Stats::new(2);
        s.record_service(0, 1_000);
        s.record_service(1, 3_000);
        s.record_service(7, 2_000);
        Stats::bump(&s.faults_4k);
        let snap = s.snapshot(512, 100);
        assert_eq!(snap.service.count, 3);
        assert!((1_990..=2_010).contains(&snap.service.p50_ns));
        assert_eq!(snap.faults(), 1);
        let text = snap.to_string();
        assert!(text.contains("(412 of 512 4 KiB frames)"), "{text}");
    }

    #[test]
    fn log_hist_percentiles_within_an_eighth() {
        let h = LogHist::default();
        assert_eq!(h.summary(), LatencySummary::default());
        for ns in 1..=1000u64 {
            h.record(ns * 1000);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert!((437_500..=562_500).contains(&s.p50_ns), "{s:?}");
        assert!((866_250..=1_113_750).contains(&s.p99_ns), "{s:?}");
        assert!((s.mean_ns - 500_500.0).abs() < 1.0);
        for b in 8..LOG_BUCKETS - 4 {
            assert_eq!(LogHist::bucket(LogHist::value(b)), b, "bucket {b}");
        }
    }
}
