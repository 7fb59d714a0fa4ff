//! Configuration: the [`Config`] a manager is built from, its validation, and
//! the per-region [`MapOptions`].
//!
//! Invariants of a validated config: `budget % 2 MiB == 0`,
//! `2 MiB <= budget <= physical memory`, `workers >= 1`,
//! `fault_locks` is a power of two. Every baseline switch of the experiments
//! (`locks = global`, ...) lives here, so a benchmark flips a field, never a
//! code path of its own. Plain data, no locks.

use faultline_sys::{HUGE_PAGE_SIZE, PAGE_SIZE};

/// Size of the pages of one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PageSize {
    /// 4 KiB base pages; each fault maps one 4 KiB frame.
    Base4K,
    /// 2 MiB huge pages; each fault maps one PMD-mapped 2 MiB frame.
    Huge2M,
}

impl PageSize {
    /// Bytes in one page.
    pub const fn bytes(self) -> usize {
        match self {
            PageSize::Base4K => PAGE_SIZE,
            PageSize::Huge2M => HUGE_PAGE_SIZE,
        }
    }

    /// Buddy order of one page: 0 for 4 KiB, 9 for 2 MiB.
    pub const fn order(self) -> u8 {
        match self {
            PageSize::Base4K => 0,
            PageSize::Huge2M => 9,
        }
    }

    /// Short name: `"4k"` or `"2m"`.
    pub const fn name(self) -> &'static str {
        match self {
            PageSize::Base4K => "4k",
            PageSize::Huge2M => "2m",
        }
    }
}

/// How faults on distinct pages are serialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum LockMode {
    /// One lock for every fault: the pre-seed baseline (seed 003).
    Global,
    /// A table of `fault_locks` padded locks indexed by a hash of the page.
    Hashed,
}

/// Configuration of a [`crate::Manager`]. Build one with
/// [`crate::Manager::builder`]; every field has a measured default.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    /// Bytes of frames faultline may hold (the pool size), a multiple of
    /// 2 MiB. Default 256 MiB.
    pub budget: usize,
    /// Fault-service worker threads. Default: one per online CPU.
    pub workers: usize,
    /// Pin worker `i` to CPU `i % cpus`. On by default: a worker on the
    /// faulting thread's CPU resolves a fault without a cross-CPU wake-up
    /// (see docs/design.md, "Worker placement").
    pub pin_workers: bool,
    /// Fault lock discipline. Default [`LockMode::Hashed`].
    pub locks: LockMode,
    /// Number of locks in the hashed table (power of two). Default: the next
    /// power of two of `2 * workers` (seed 003's sizing), at least 64: a
    /// read-ahead run tries the locks of its pages, and with a table of 4 a
    /// concurrent fault holds one of them a quarter of the time.
    pub fault_locks: usize,
    /// Events read per `read(2)` on the userfaultfd. Default 16.
    pub event_batch: usize,
    /// Wake one idle worker per event (`EPOLLEXCLUSIVE`) instead of all.
    /// Off by default: on the 2-vCPU guest it was measured slower (4 KiB
    /// first touch 83-115 µs against 28-31 µs), because the one woken is the
    /// first registered, not the one on the faulting CPU.
    pub exclusive_wake: bool,
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
    /// Fault-around for 4 KiB regions: a fault maps the aligned run of this
    /// many pages around the faulting one (all absent) with one frame run and
    /// one `UFFDIO_MOVE`. A power of two up to 512; 1 turns it off. Default 16
    /// (`faultline bench alloc`, fault rows).
    pub fault_around: usize,
    /// Sub-page order for clearing a 2 MiB frame on the fault path (seed
    /// 000). Default `NeighbourhoodLast`: in `faultline bench clear-order`
    /// (64 pages per writer, median of 5) it streamed 4.42 GB/s with 1 writer
    /// and 6.86 with 2, against 3.90 and 6.24 for sequential and 3.34 and
    /// 4.91 for target-last, and left the target sub-page hot (2 cycles per
    /// line against 7). Under cache pressure sequential led (4.53 vs 3.97).
    pub fill_order: crate::fill::FillOrder,
    /// A low-priority zeroing worker keeps `prezero_reserve` zeroed 2 MiB
    /// frames ready, so a 2 MiB fault needs no clearing. Default on.
    pub prezero: bool,
    /// Zeroed 2 MiB frames to keep ready. Default 8 (16 MiB). The reserve
    /// gives its frames back when an allocation finds the pool empty.
    pub prezero_reserve: usize,
    /// The lookup cache in front of the region table (seed 002). Default
    /// `PerThread` (`faultline bench lookup`).
    pub lookup_cache: crate::region::table::LookupCache,
    /// Reclaim pages of store-backed regions under the budget (CLOCK with
    /// soft-unmap): synchronously when a fault finds no free frame, and in
    /// the background below `reclaim_low_pct` of the pool free, up to
    /// `reclaim_high_pct`. Default on, 5% / 10%.
    pub reclaim: bool,
    /// Background reclaim starts below this share of the pool free (%).
    pub reclaim_low_pct: usize,
    /// Background reclaim stops at this share of the pool free (%).
    pub reclaim_high_pct: usize,
    /// Largest read-ahead window for store-backed 4 KiB regions, in pages (a
    /// power of two up to 512; 1 turns read-ahead off). It is also the fault
    /// lock window of 4 KiB regions over a file. Default 256 (1 MiB): a
    /// sequential reader through a budget 5x smaller than its file ran
    /// 70–84 k reads/s at 64, 109–116 k at 256, 93–129 k at 512.
    pub readahead_max: usize,
    /// Record the addresses of up to this many faults (0: off), for replay by
    /// `faultline bench lookup` ([`crate::Manager::fault_trace`]).
    pub trace_faults: usize,
    /// Busy-poll the userfaultfd this many microseconds after the last event
    /// before blocking in `poll(2)`. Default 0 (block at once).
    pub spin_us: u32,
    /// The NUMA node pool 0 (the budget) is bound to; `None` (default): no
    /// binding, the kernel's policy.
    pub node: Option<u32>,
    /// Pools beyond pool 0: other NUMA nodes, or memory tiers on a one-node
    /// machine. Faults never take frames from them; pages get there by
    /// `Region::migrate`. Default none. See [`Config::with_node_pools`].
    pub extra_pools: Vec<PoolSpec>,
    /// Share of the budget (%) kept as a small-page zone: mapped without
    /// transparent huge pages, it gives 4 KiB frames that move out without
    /// splitting a THP (a ~1 ms split, and a copy-on-write fault with a TLB
    /// flush on the first write to each other page of the block). 2 MiB
    /// frames come from the rest first. Default 0.
    pub small_zone_pct: usize,
    /// How migration copies a frame. Default [`CopyMethod::ChunkedNt`]
    /// (measured fastest when the pages moved exceed the caches; see
    /// docs/design.md, "Migration").
    pub migrate_copy: CopyMethod,
    /// Threads that share one migration's copy: the migrating thread plus up
    /// to `migrate_threads - 1` fault workers, which take copy chunks only
    /// while they have no fault to serve. Default 1 (copy alone): on the
    /// 2-vCPU machine this was measured on, one thread already reaches the
    /// memory bandwidth of the 2 MiB copy, and a helper — a thread of this
    /// process — draws TLB-shootdown IPIs to its CPU for every move while it
    /// runs (docs/design.md, "Migration").
    pub migrate_threads: usize,
    /// Bytes per copy chunk handed to a worker (a power of two, 4 KiB to
    /// 2 MiB): the longest a worker is away from its fault queue. Default
    /// 64 KiB (about 5 µs of copying).
    pub migrate_chunk: usize,
}

/// One pool beyond the first (see [`Config::extra_pools`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PoolSpec {
    /// Its size, a multiple of 2 MiB.
    pub bytes: usize,
    /// The NUMA node it is bound to, if any.
    pub node: Option<u32>,
}

/// How migration copies a frame's bytes (seed 001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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

impl Default for Config {
    fn default() -> Self {
        let workers = faultline_sys::host::online_cpus().max(1);
        Config {
            budget: 256 << 20,
            workers,
            pin_workers: true,
            locks: LockMode::Hashed,
            fault_locks: (2 * workers).next_power_of_two().max(64),
            event_batch: 16,
            exclusive_wake: false,
            pcp: true,
            pcp_batch: 128,
            pcp_high: 1024,
            fault_around: 16,
            fill_order: crate::fill::FillOrder::NeighbourhoodLast,
            prezero: true,
            prezero_reserve: 8,
            lookup_cache: crate::region::table::LookupCache::PerThread,
            trace_faults: 0,
            readahead_max: 256,
            reclaim: true,
            reclaim_low_pct: 5,
            reclaim_high_pct: 10,
            spin_us: 0,
            node: None,
            extra_pools: Vec::new(),
            small_zone_pct: 0,
            migrate_copy: CopyMethod::ChunkedNt,
            migrate_threads: 1,
            migrate_chunk: 64 << 10,
        }
    }
}

impl Config {
    /// One pool per online NUMA node, `bytes` each: pool 0 (the budget) on
    /// the first node, the others as extra pools. On a one-node machine this
    /// is just the budget, bound to node 0.
    pub fn with_node_pools(mut self, bytes: usize) -> Config {
        let nodes = faultline_sys::host::numa_nodes();
        self.budget = bytes;
        self.node = nodes.first().copied();
        self.extra_pools = nodes[1..]
            .iter()
            .map(|&n| PoolSpec {
                bytes,
                node: Some(n),
            })
            .collect();
        self
    }

    /// Adds a pool of `bytes` with no node binding (a tier).
    pub fn with_tier(mut self, bytes: usize) -> Config {
        self.extra_pools.push(PoolSpec { bytes, node: None });
        self
    }
}

/// A configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The budget is below one 2 MiB frame.
    #[error("budget of {budget} bytes is below one 2 MiB frame")]
    BudgetTooSmall {
        /// The budget asked for.
        budget: usize,
    },
    /// The budget is above the machine's physical memory.
    #[error("budget of {budget} bytes exceeds physical memory ({physical} bytes)")]
    BudgetTooLarge {
        /// The budget asked for.
        budget: usize,
        /// Physical memory of the machine.
        physical: usize,
    },
    /// The pools would not fit in the memory this process may still take:
    /// populating them would get it OOM-killed (or push the machine into
    /// swap) while the manager is built.
    #[error("pools of {bytes} bytes exceed the {room} bytes left under {limit}")]
    NoRoom {
        /// Bytes of all pools.
        bytes: usize,
        /// Bytes the process may still take.
        room: usize,
        /// Which limit.
        limit: &'static str,
    },
    /// The budget is not a multiple of 2 MiB.
    #[error("budget of {budget} bytes is not a multiple of 2 MiB")]
    BudgetUnaligned {
        /// The budget asked for.
        budget: usize,
    },
    /// Zero workers.
    #[error("at least one fault worker is needed")]
    NoWorkers,
    /// A field out of its range.
    #[error("{field} = {value} is out of range: {why}")]
    OutOfRange {
        /// The field's name.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The accepted range.
        why: &'static str,
    },
}

impl Config {
    /// Checks the invariants listed in the module docs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.budget < HUGE_PAGE_SIZE {
            return Err(ConfigError::BudgetTooSmall {
                budget: self.budget,
            });
        }
        if self.budget % HUGE_PAGE_SIZE != 0 {
            return Err(ConfigError::BudgetUnaligned {
                budget: self.budget,
            });
        }
        let physical = faultline_sys::host::physical_memory();
        if self.budget > physical {
            return Err(ConfigError::BudgetTooLarge {
                budget: self.budget,
                physical,
            });
        }
        if self.workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        if self.workers > 1024 {
            return Err(ConfigError::OutOfRange {
                field: "workers",
                value: self.workers,
                why: "1..=1024",
            });
        }
        if !self.fault_locks.is_power_of_two() || self.fault_locks > 1 << 20 {
            return Err(ConfigError::OutOfRange {
                field: "fault_locks",
                value: self.fault_locks,
                why: "a power of two up to 2^20",
            });
        }
        if !self.fault_around.is_power_of_two() || self.fault_around > 512 {
            return Err(ConfigError::OutOfRange {
                field: "fault_around",
                value: self.fault_around,
                why: "a power of two from 1 to 512",
            });
        }
        if self.pcp_batch == 0 || self.pcp_batch > 4096 || self.pcp_high < self.pcp_batch {
            return Err(ConfigError::OutOfRange {
                field: "pcp_batch",
                value: self.pcp_batch,
                why: "1..=4096 and at most pcp_high",
            });
        }
        let total = self.extra_pools.iter().try_fold(self.budget, |t, p| {
            if p.bytes < HUGE_PAGE_SIZE || p.bytes % HUGE_PAGE_SIZE != 0 {
                Err(ConfigError::OutOfRange {
                    field: "extra_pools.bytes",
                    value: p.bytes,
                    why: "a non-zero multiple of 2 MiB",
                })
            } else {
                Ok(t.saturating_add(p.bytes))
            }
        })?;
        if total > physical || total / faultline_sys::PAGE_SIZE > u32::MAX as usize / 2 {
            return Err(ConfigError::BudgetTooLarge {
                budget: total,
                physical,
            });
        }
        if let Some((room, limit)) = faultline_sys::host::memory_room() {
            if total > room {
                return Err(ConfigError::NoRoom {
                    bytes: total,
                    room,
                    limit,
                });
            }
        }
        if self.reclaim_low_pct > self.reclaim_high_pct || self.reclaim_high_pct > 100 {
            return Err(ConfigError::OutOfRange {
                field: "reclaim_low_pct",
                value: self.reclaim_low_pct,
                why: "at most reclaim_high_pct, which is at most 100",
            });
        }
        let online = faultline_sys::host::numa_nodes();
        for node in self
            .extra_pools
            .iter()
            .filter_map(|p| p.node)
            .chain(self.node)
        {
            if !online.contains(&node) {
                return Err(ConfigError::OutOfRange {
                    field: "node",
                    value: node as usize,
                    why: "an online NUMA node (/sys/devices/system/node/online)",
                });
            }
        }
        if self.migrate_threads == 0 || self.migrate_threads > self.workers + 1 {
            return Err(ConfigError::OutOfRange {
                field: "migrate_threads",
                value: self.migrate_threads,
                why: "1..=workers + 1",
            });
        }
        if !self.migrate_chunk.is_power_of_two()
            || !(faultline_sys::PAGE_SIZE..=HUGE_PAGE_SIZE).contains(&self.migrate_chunk)
        {
            return Err(ConfigError::OutOfRange {
                field: "migrate_chunk",
                value: self.migrate_chunk,
                why: "a power of two from 4 KiB to 2 MiB",
            });
        }
        if self.small_zone_pct > 100 {
            return Err(ConfigError::OutOfRange {
                field: "small_zone_pct",
                value: self.small_zone_pct,
                why: "0..=100",
            });
        }
        if !self.readahead_max.is_power_of_two() || self.readahead_max > 512 {
            return Err(ConfigError::OutOfRange {
                field: "readahead_max",
                value: self.readahead_max,
                why: "a power of two from 1 to 512",
            });
        }
        if self.event_batch == 0 || self.event_batch > 64 {
            return Err(ConfigError::OutOfRange {
                field: "event_batch",
                value: self.event_batch,
                why: "1..=64",
            });
        }
        Ok(())
    }
}

/// Options of one mapped region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapOptions {
    pub(crate) page_size: PageSize,
}

impl Default for MapOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl MapOptions {
    /// 4 KiB pages.
    pub fn new() -> Self {
        MapOptions {
            page_size: PageSize::Base4K,
        }
    }

    /// Sets the page size. A region's length must be a multiple of it:
    /// [`crate::Manager::map`] refuses other lengths rather than rounding.
    pub fn page_size(mut self, size: PageSize) -> Self {
        self.page_size = size;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        Config::default().validate().expect("default config");
    }

    #[test]
    fn bad_budgets() {
        let c = |budget| Config {
            budget,
            ..Config::default()
        };
        assert_eq!(
            c(0).validate(),
            Err(ConfigError::BudgetTooSmall { budget: 0 })
        );
        assert_eq!(
            c(HUGE_PAGE_SIZE + PAGE_SIZE).validate(),
            Err(ConfigError::BudgetUnaligned {
                budget: HUGE_PAGE_SIZE + PAGE_SIZE
            })
        );
        assert!(matches!(
            c(1 << 50).validate(),
            Err(ConfigError::BudgetTooLarge { .. })
        ));
    }

    #[test]
    fn bad_fields() {
        let c = Config {
            workers: 0,
            ..Config::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::NoWorkers));
        let c = Config {
            fault_locks: 3,
            ..Config::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::OutOfRange {
                field: "fault_locks",
                ..
            })
        ));
        let c = Config {
            event_batch: 0,
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
