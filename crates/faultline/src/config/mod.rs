//! Configuration: the [`Config`] a manager is built from (what users set),
//! its [`Experiment`] switches (the seeds' baselines, in `experiment.rs`),
//! their validation, and the per-region [`MapOptions`].
//!
//! Invariants of a validated config: `budget % 2 MiB == 0`,
//! `2 MiB <= budget <= physical memory` and within what the process may
//! still take (cgroup limit, available memory), `1 <= workers <= 1024`,
//! `1 <= spare_servers <= 1024`,
//! reclaim watermarks `low <= high <= 100`, the lock table a power of two.
//! Plain data, no locks.

mod experiment;
mod fill;
mod map_options;
mod sizing;

pub use experiment::{CopyMethod, Experiment, FillOrder, LockMode, LookupCache};
use faultline_sys::{HUGE_PAGE_SIZE, PAGE_SIZE};
pub use fill::FillModel;
pub(crate) use map_options::Fixed;
pub use map_options::{AccessPattern, MapOptions};

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

/// Configuration of a [`crate::Manager`]. Set it through
/// [`crate::Manager::builder`], or start from `Config::default()`, change
/// fields and pass it to [`crate::ManagerBuilder::from_config`]; every field
/// has a measured default, and `build()` validates the whole.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Config {
    /// Bytes of frames faultline may hold (the pool size), a multiple of
    /// 2 MiB. Default 256 MiB.
    pub budget: usize,
    /// The largest budget [`crate::Manager::set_budget`] may grow to, a
    /// multiple of 2 MiB at least `budget`; `None` (default): `budget`. The
    /// pool's address space is this large, but only `budget` of it is
    /// populated at build; the rest costs no memory until the budget grows
    /// and faults use it.
    pub budget_max: Option<usize>,
    /// Fault-service worker threads. Default [`Config::default_workers`]
    /// of `cpus`: one per CPU up to 4.
    pub workers: usize,
    /// Spare servers: threads called to serve waiting faults while every
    /// worker is inside a store-backed fault (a store read, a write-back).
    /// Parked apart from the userfaultfd, they cost an idle fault nothing,
    /// and let `workers + spare_servers` store reads be in flight at once
    /// (a disk's queue, a network store's round trips). The first also
    /// serves a store's own fault on another region (`nesting.rs`).
    /// Default [`Config::default_spare_servers`] of `cpus`; at least 1.
    pub spare_servers: usize,
    /// The number of CPUs faultline sizes its per-CPU structures for: one
    /// per-CPU frame list each (and their share of the pool, see
    /// [`crate::Experiment::pcp_high`]), the fault-lock table
    /// ([`Config::lock_table`]), and the default worker and spare counts
    /// ([`Config::size_for_cpus`]).
    /// Default: the CPUs this process may run on. A test or a bench sets
    /// it above the machine's count to build a manager sized as it would
    /// be on a larger machine (`ManagerBuilder::cpus`).
    pub cpus: usize,
    /// Pin worker `i` to the `i`-th CPU this process may run on (modulo
    /// their number). On by default: a worker on the faulting thread's CPU
    /// resolves a fault without a cross-CPU wake-up (see docs/design.md,
    /// "Worker placement").
    pub pin_workers: bool,
    /// Fault-around for 4 KiB regions: a fault maps the aligned run of this
    /// many pages around the faulting one (all absent) with one frame run and
    /// one `UFFDIO_MOVE`. A power of two up to 512; 1 turns it off. Default 16
    /// (`faultline bench alloc`, fault rows).
    pub fault_around: usize,
    /// A low-priority zeroing worker keeps `prezero_reserve` zeroed 2 MiB
    /// frames ready, so a 2 MiB fault needs no clearing. Default on.
    pub prezero: bool,
    /// Zeroed 2 MiB frames to keep ready. Default 8 (16 MiB). The reserve
    /// gives its frames back when an allocation finds the pool empty.
    pub prezero_reserve: usize,
    /// Reclaim pages of store-backed regions under the budget (CLOCK with
    /// soft-unmap): synchronously when a fault finds no free frame, and in
    /// the background below `reclaim_low_pct` of the pool free, up to
    /// `reclaim_high_pct`. Default on, 5% / 10%.
    pub reclaim: bool,
    /// Background reclaim starts below this share of the pool free (%).
    pub reclaim_low_pct: usize,
    /// Background reclaim stops at this share of the pool free (%).
    pub reclaim_high_pct: usize,
    /// Free memory above `reclaim_high_pct` that nobody takes for this long
    /// goes back to the kernel, as whole 2 MiB blocks (a program that shrank
    /// shrinks its RSS; taking it back later costs a refill of cold memory,
    /// hence the wait — as an allocator's decay time). `None`: never.
    /// Default 10 s.
    pub idle_release: Option<std::time::Duration>,
    /// Largest read-ahead window for store-backed 4 KiB regions, in pages (a
    /// power of two up to 512; 1 turns read-ahead off). It is also the fault
    /// lock window of 4 KiB regions over a file. Default 256 (1 MiB): a
    /// sequential reader through a budget 5x smaller than its file ran
    /// 70–84 k reads/s at 64, 109–116 k at 256, 93–129 k at 512.
    pub readahead_max: usize,
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
    /// Publish the stats in a shared-memory file,
    /// `/dev/shm/faultline/<pid>-<n>`, refreshed every 250 ms by the
    /// background reclaimer (which then runs even with `reclaim` off) and
    /// removed when the manager drops; `faultline stat` reads it. Nothing
    /// is added to the fault path. Default on.
    pub publish_stats: bool,
    /// Who serves faults: workers (default) or the faulting thread itself.
    pub fault_mode: FaultMode,
    /// How a filled 4 KiB page goes into place: moved (its frame) or
    /// copied (its bytes; units of up to 8 pages — longer runs move), and
    /// whether random misses go in write-protected. 2 MiB pages always
    /// move. Default [`FillModel::Auto`]: `CopyProtected` with workers,
    /// `Copy` in-thread (resolved at build).
    pub fill_model: FillModel,
    /// Hear the program's own `MADV_DONTNEED` / `MADV_FREE` on region memory
    /// (`UFFD_FEATURE_EVENT_REMOVE`) and give those pages' frames back at
    /// once (those the kernel zapped whole). Off, a dropped page keeps its
    /// frame until it is next touched or reclaimed; what it reads is the
    /// same either way. Costs every `MADV_DONTNEED`
    /// faultline makes itself an event round trip — the page-table drop of
    /// each 2 MiB first touch among them (`faultline bench fault`). Default
    /// on.
    pub program_removals: bool,
    /// Count faultline's own memory against the budget: the page tables
    /// the kernel makes for region memory (a 4 KiB table per 2 MiB of
    /// 4 KiB pages touched, kept until the region is unmapped) and the
    /// page-state metadata, so that frames plus overhead stay within the
    /// budget: counted in 2 MiB frames, rounded up, once the overhead
    /// reaches 2 MiB (below that it is not counted), at most a quarter of
    /// the budget; settled by the background reclaimer (so only with
    /// `reclaim` on), from free memory above its low watermark. A random
    /// reader over 2 GiB of 4 KiB pages costs 6.3 MiB this way (4 frames
    /// withheld). A fault that nothing else can serve (zero-store or
    /// pinned pages hold the rest) takes withheld frames back rather than
    /// fail. Default on.
    pub budget_counts_overhead: bool,
    /// The seeds' experiment switches and their pre-seed baselines (lock
    /// table, per-CPU lists, clear order, lookup cache, migration copy).
    /// Users leave it at its default.
    pub experiment: Experiment,
}

/// Who serves a region's missing-page faults ([`Config::fault_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum FaultMode {
    /// Fault workers: the faulting thread waits while a worker reads the
    /// userfaultfd event, serves it and wakes it. Every access works,
    /// including the kernel's own (`read(2)` into region memory).
    #[default]
    Workers,
    /// The faulting thread serves its own fault in faultline's SIGBUS
    /// handler (`UFFD_FEATURE_SIGBUS`): no hand-off, no wake-up. Costs:
    /// the kernel's accesses to a page that is not resident fail with
    /// `EFAULT` (a `read(2)` into region memory: [`crate::Region::prefetch`]
    /// the range first), and the process's SIGBUS action is faultline's
    /// (signals it does not serve go on to the action it replaced).
    ///
    /// Every thread that touches region memory must leave SIGBUS
    /// unblocked: a fault in a thread that blocks it (`pthread_sigmask`
    /// with every signal, common in C servers' worker threads) kills the
    /// process — the kernel forces the signal, unblocking it and resetting
    /// the process's action to the default, so no handler runs and nothing
    /// is printed (`Bus error`, exit status 135). `build` and `map` refuse
    /// a calling thread that blocks it (`SigbusBlocked`), faultline's own
    /// threads unblock it, and [`crate::in_thread_ready`] checks any other
    /// thread; block every signal but SIGBUS, or use workers.
    InThread,
}

/// One pool beyond the first (see [`Config::extra_pools`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PoolSpec {
    /// Its size, a multiple of 2 MiB.
    pub bytes: usize,
    /// The NUMA node it is bound to, if any.
    pub node: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        let cpus = faultline_sys::host::online_cpus().max(1);
        Config {
            budget: 256 << 20,
            budget_max: None,
            workers: Config::default_workers(cpus),
            spare_servers: Config::default_spare_servers(cpus),
            cpus,
            pin_workers: true,
            fault_around: 16,
            prezero: true,
            prezero_reserve: 8,
            readahead_max: 256,
            reclaim: true,
            reclaim_low_pct: 5,
            reclaim_high_pct: 10,
            idle_release: Some(std::time::Duration::from_secs(10)),
            node: None,
            extra_pools: Vec::new(),
            small_zone_pct: 0,
            publish_stats: true,
            fault_mode: FaultMode::Workers,
            fill_model: FillModel::default(),
            program_removals: true,
            budget_counts_overhead: true,
            experiment: Experiment::default(),
        }
    }
}

impl Config {
    /// Whether the regions' userfaultfd reports the program's own drops:
    /// [`Config::program_removals`], except where the fill model in effect
    /// is [`FillModel::CopyProtected`] (see there) — which the default,
    /// [`FillModel::Auto`], is with workers.
    pub fn hears_removals(&self) -> bool {
        self.program_removals && self.fill_model.under(self.fault_mode) != FillModel::CopyProtected
    }

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
#[non_exhaustive]
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
    ///
    /// # Errors
    /// The first [`ConfigError`] found, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        if !(1..=4096).contains(&self.cpus) {
            return Err(ConfigError::OutOfRange {
                field: "cpus",
                value: self.cpus,
                why: "1..=4096",
            });
        }
        self.validate_budget()?;
        self.validate_ranges()?;
        self.validate_nodes()?;
        self.experiment.validate(self.workers, self.lock_table())
    }

    /// The budget and the extra pools: whole 2 MiB frames, within physical
    /// memory and within what this process may still take.
    fn validate_budget(&self) -> Result<(), ConfigError> {
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
        let max = self.pool_budget();
        if max < self.budget || max % HUGE_PAGE_SIZE != 0 {
            return Err(ConfigError::OutOfRange {
                field: "budget_max",
                value: max,
                why: "a multiple of 2 MiB, at least the budget",
            });
        }
        let physical = faultline_sys::host::physical_memory();
        let total = self.extra_pools.iter().try_fold(max, |t, p| {
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
        if total > physical || total / PAGE_SIZE > u32::MAX as usize / 2 {
            return Err(ConfigError::BudgetTooLarge {
                budget: total,
                physical,
            });
        }
        // Only the populated part needs room now.
        let populated = total - (max - self.budget);
        match faultline_sys::host::memory_room() {
            Some((room, limit)) if populated > room => Err(ConfigError::NoRoom {
                bytes: populated,
                room,
                limit,
            }),
            _ => Ok(()),
        }
    }

    /// Bytes of pool 0's address space: [`Config::budget_max`], or the
    /// budget.
    pub fn pool_budget(&self) -> usize {
        self.budget_max.unwrap_or(self.budget)
    }

    /// Every other field's range.
    fn validate_ranges(&self) -> Result<(), ConfigError> {
        let pow2 = |v: usize| v.is_power_of_two() && v <= 512;
        let checks = [
            ("workers", self.workers, self.workers <= 1024, "1..=1024"),
            (
                "spare_servers",
                self.spare_servers,
                (1..=1024).contains(&self.spare_servers),
                "1..=1024",
            ),
            (
                "fault_around",
                self.fault_around,
                pow2(self.fault_around),
                "a power of two from 1 to 512",
            ),
            (
                "reclaim_low_pct",
                self.reclaim_low_pct,
                self.reclaim_low_pct <= self.reclaim_high_pct && self.reclaim_high_pct <= 100,
                "at most reclaim_high_pct, which is at most 100",
            ),
            (
                "small_zone_pct",
                self.small_zone_pct,
                self.small_zone_pct <= 100,
                "0..=100",
            ),
            (
                "readahead_max",
                self.readahead_max,
                pow2(self.readahead_max),
                "a power of two from 1 to 512",
            ),
        ];
        match checks.into_iter().find(|c| !c.2) {
            Some((field, value, _, why)) => Err(ConfigError::OutOfRange { field, value, why }),
            None => Ok(()),
        }
    }

    /// Every node named is online.
    fn validate_nodes(&self) -> Result<(), ConfigError> {
        let online = faultline_sys::host::numa_nodes();
        let nodes = self.extra_pools.iter().filter_map(|p| p.node);
        match nodes.chain(self.node).find(|n| !online.contains(n)) {
            Some(node) => Err(ConfigError::OutOfRange {
                field: "node",
                value: node as usize,
                why: "an online NUMA node (/sys/devices/system/node/online)",
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protected_copy_model_hears_no_removals() {
        let mut c = Config::default();
        assert!(!c.hears_removals(), "the default protects with workers");
        c.fault_mode = FaultMode::InThread;
        assert!(c.hears_removals(), "the default copies in-thread");
        c.fault_mode = FaultMode::Workers;
        c.fill_model = FillModel::Copy;
        assert!(c.hears_removals());
        c.fill_model = FillModel::CopyProtected;
        assert!(!c.hears_removals(), "each clean drop would be an event");
        assert!(c.fill_model.copies() && FillModel::Copy.copies());
        assert!(!FillModel::Move.copies());
        c.fill_model = FillModel::Copy;
        c.program_removals = false;
        assert!(!c.hears_removals());
    }

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
        let mut c = Config::default();
        c.experiment.fault_locks = Some(3);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::OutOfRange {
                field: "fault_locks",
                ..
            })
        ));
        let mut c = Config::default();
        c.experiment.event_batch = 0;
        assert!(c.validate().is_err());
    }
}
