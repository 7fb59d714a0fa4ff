//! Experiment switches: the pre-seed baselines of the five Linux MM
//! mechanisms faultline carries (seeds 000-004) and the knobs their
//! experiments sweep. A user never needs to set these; `faultline bench`
//! flips one field at a time, never a code path of its own. Plain data, no
//! locks.

use faultline_sys::HUGE_PAGE_SIZE;

/// The switches of the seeds' experiments; every field has the measured
/// default. See [`crate::Config::experiment`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Experiment {
    /// Fault lock discipline (seed 003). Default [`LockMode::Hashed`].
    pub locks: LockMode,
    /// Number of locks in the hashed table (a power of two). `None`
    /// (default): [`super::Config::lock_table`], sized by CPUs and
    /// servers as seed 003 sizes the kernel's by CPUs (`2 x CPUs` there:
    /// a lock that covers one huge page while it is zeroed; here a lock
    /// covers a fault-around window and is held across a store read, so
    /// 16 per CPU), at least 64: a read-ahead run tries the locks of its
    /// pages, and with a table of 4 a concurrent fault holds one of them a
    /// quarter of the time.
    pub fault_locks: Option<usize>,
    /// Per-CPU lists of 4 KiB frames in front of the buddy allocator (seed
    /// 004). `false` is the pre-seed baseline: every allocation and free takes
    /// the zone lock.
    pub pcp: bool,
    /// Frames a per-CPU list takes from, or gives back to, the buddy
    /// allocator at once. Default 128: `faultline bench alloc --quick` with
    /// batch/high 8/64, 32/256 and 128/1024 gave pcp totals at alloc batch 1
    /// of 37.5, 36.5 and 31.0 ns and at batch 1024 (2 threads) of 208, 71
    /// and 27 ns.
    pub pcp_batch: usize,
    /// A per-CPU list holding more than this drains `pcp_batch` frames.
    /// Default 1024 (4 MiB per CPU; an allocation that finds the zone empty
    /// drains every list first).
    pub pcp_high: usize,
    /// Sub-page order for clearing a 2 MiB frame on the fault path (seed
    /// 000). Default `NeighbourhoodLast`: in `faultline bench clear-order`
    /// (64 pages per writer, median of 5) it streamed 4.42 GB/s with 1 writer
    /// and 6.86 with 2, against 3.90 and 6.24 for sequential and 3.34 and
    /// 4.91 for target-last, and left the target sub-page hot (2 cycles per
    /// line against 7). Under cache pressure sequential led (4.53 vs 3.97).
    pub fill_order: FillOrder,
    /// The lookup cache in front of the region table (seed 002). Default
    /// `PerThread` (`faultline bench lookup`).
    pub lookup_cache: LookupCache,
    /// How migration copies a frame (seed 001). Default
    /// [`CopyMethod::ChunkedNt`] (measured fastest when the pages moved
    /// exceed the caches; see docs/measurements.md, "Migration's copy").
    pub migrate_copy: CopyMethod,
    /// Threads that share one migration's copy: the migrating thread plus up
    /// to `migrate_threads - 1` fault workers, which take copy chunks only
    /// while they have no fault to serve. Default 1 (copy alone): on the
    /// 2-vCPU machine this was measured on, one thread already reaches the
    /// memory bandwidth of the 2 MiB copy, and a helper — a thread of this
    /// process — draws TLB-shootdown IPIs to its CPU for every move while it
    /// runs (docs/measurements.md, "Migration's copy").
    pub migrate_threads: usize,
    /// Bytes per copy chunk handed to a worker (a power of two, 4 KiB to
    /// 2 MiB): the longest a worker is away from its fault queue. Default
    /// 64 KiB (about 5 µs of copying).
    pub migrate_chunk: usize,
    /// Events read per `read(2)` on the userfaultfd. Default 16.
    pub event_batch: usize,
    /// Wake one idle worker per event (`EPOLLEXCLUSIVE`) instead of all.
    /// Off by default: on the 2-vCPU guest it was measured slower (4 KiB
    /// first touch 83-115 µs against 28-31 µs), because the one woken is the
    /// first registered, not the one on the faulting CPU.
    pub exclusive_wake: bool,
    /// Busy-poll the userfaultfd this many microseconds after the last event
    /// before blocking in `poll(2)`. Default 0 (block at once).
    pub spin_us: u32,
    /// Record the addresses of up to this many faults (0: off), for replay by
    /// `faultline bench lookup` ([`crate::Manager::fault_trace`]).
    pub trace_faults: usize,
}

impl Default for Experiment {
    fn default() -> Self {
        Experiment {
            locks: LockMode::Hashed,
            fault_locks: None,
            pcp: true,
            pcp_batch: 128,
            pcp_high: 1024,
            fill_order: FillOrder::NeighbourhoodLast,
            lookup_cache: LookupCache::PerThread,
            migrate_copy: CopyMethod::ChunkedNt,
            migrate_threads: 1,
            migrate_chunk: 64 << 10,
            event_batch: 16,
            exclusive_wake: false,
            spin_us: 0,
            trace_faults: 0,
        }
    }
}

impl Experiment {
    /// Checks every field's range; `workers` and `locks` (the lock
    /// table's size, [`super::Config::lock_table`]) are the config's.
    pub(crate) fn validate(&self, workers: usize, locks: usize) -> Result<(), super::ConfigError> {
        use super::ConfigError::OutOfRange;
        if !locks.is_power_of_two() || locks > 1 << 20 {
            return Err(OutOfRange {
                field: "fault_locks",
                value: locks,
                why: "a power of two up to 2^20",
            });
        }
        if self.pcp_batch == 0 || self.pcp_batch > 4096 || self.pcp_high < self.pcp_batch {
            return Err(OutOfRange {
                field: "pcp_batch",
                value: self.pcp_batch,
                why: "1..=4096 and at most pcp_high",
            });
        }
        if self.migrate_threads == 0 || self.migrate_threads > workers + 1 {
            return Err(OutOfRange {
                field: "migrate_threads",
                value: self.migrate_threads,
                why: "1..=workers + 1",
            });
        }
        if !self.migrate_chunk.is_power_of_two()
            || !(faultline_sys::PAGE_SIZE..=HUGE_PAGE_SIZE).contains(&self.migrate_chunk)
        {
            return Err(OutOfRange {
                field: "migrate_chunk",
                value: self.migrate_chunk,
                why: "a power of two from 4 KiB to 2 MiB",
            });
        }
        if self.event_batch == 0 || self.event_batch > 64 {
            return Err(OutOfRange {
                field: "event_batch",
                value: self.event_batch,
                why: "1..=64",
            });
        }
        Ok(())
    }
}

/// How faults on distinct pages are serialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub enum LockMode {
    /// One lock for every fault: the pre-seed baseline (seed 003).
    Global,
    /// A table of [`Experiment::fault_locks`] padded locks indexed by a hash of the page.
    Hashed,
}

/// How migration copies a frame's bytes (seed 001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub enum CopyMethod {
    /// The pre-seed baseline: a loop of 4 KiB copies, one call per page, on
    /// the migrating thread alone.
    PerPage,
    /// One large copy (`memcpy`) per frame, cut into `migrate_chunk` pieces
    /// that up to `migrate_threads` threads share.
    Chunked,
    /// As `Chunked`, with non-temporal (streaming) stores for pieces of
    /// 64 KiB and more: the new frame's bytes do not displace the cache.
    ChunkedNt,
}

impl CopyMethod {
    /// Name as used in benchmark output.
    pub fn name(self) -> &'static str {
        match self {
            CopyMethod::PerPage => "per-page",
            CopyMethod::Chunked => "chunked",
            CopyMethod::ChunkedNt => "chunked-nt",
        }
    }
}

/// In which order the sub-pages of a huge frame are filled (seed 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum FillOrder {
    /// Begin to end, with non-temporal stores (the fastest clear here; the
    /// frame ends up out of cache).
    Sequential,
    /// Huang Ying's order (`process_huge_page`): the sub-pages farthest from
    /// the faulting one first, then converging left-right on it, so it is
    /// filled last and cache hot; cached stores (`rep stosb`).
    TargetLast,
    /// Sequential with non-temporal stores, except a window of
    /// 8 (`NEIGHBOURHOOD`) sub-pages around the faulting one, filled last with
    /// cached stores (the kernel's order for small folios since 2026).
    NeighbourhoodLast,
}

impl FillOrder {
    /// Short name, as in the benchmark's rows.
    pub fn name(self) -> &'static str {
        match self {
            FillOrder::Sequential => "sequential",
            FillOrder::TargetLast => "target-last",
            FillOrder::NeighbourhoodLast => "neighbourhood-last",
        }
    }
}

/// A lookup cache scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum LookupCache {
    /// No cache.
    None,
    /// One shared last-hit entry.
    Shared,
    /// One shared last-hit entry plus the largest region.
    SharedLargest,
    /// Four shared entries indexed by address bits.
    Hash4,
    /// Each thread's last four hits.
    PerThread,
}

impl LookupCache {
    /// Every scheme, in the benchmark's order.
    pub const ALL: [LookupCache; 5] = [
        LookupCache::None,
        LookupCache::Shared,
        LookupCache::SharedLargest,
        LookupCache::Hash4,
        LookupCache::PerThread,
    ];

    /// Name as in the benchmark's rows.
    pub fn name(self) -> &'static str {
        match self {
            LookupCache::None => "none",
            LookupCache::Shared => "shared",
            LookupCache::SharedLargest => "shared+largest",
            LookupCache::Hash4 => "hash4",
            LookupCache::PerThread => "per-thread",
        }
    }

    pub(crate) fn from_u8(v: u8) -> LookupCache {
        LookupCache::ALL
            .get(v as usize)
            .copied()
            .unwrap_or(LookupCache::None)
    }

    pub(crate) fn to_u8(self) -> u8 {
        LookupCache::ALL
            .iter()
            .position(|&c| c == self)
            .unwrap_or(0) as u8
    }
}
