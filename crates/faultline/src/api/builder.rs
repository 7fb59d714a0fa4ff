//! Building a manager: [`ManagerBuilder`] collects the configuration (each
//! setter changes one field and never another), `build()` validates it and
//! acquires everything the manager will need — the userfaultfd, the page
//! map, the eventfds, the frame pool (populated, so a budget beyond what the
//! process may take is refused here, not OOM-killed later) and every thread —
//! or returns the error with its errno.
//!
//! Order matters: every fallible step the core needs comes before the pool.
//! Once the pool is registered with the userfaultfd, dropping it before the
//! userfaultfd (as an error return would: locals drop in reverse) would wait
//! forever for a reader of its unmap event. No locks.

use super::manager::Manager;
use super::service::Service;
use crate::config::{Config, Experiment};
use crate::core::Core;
use crate::error::BuildError;
use crate::frame::{AllocConfig, FramePools, PartSpec, Pool};
use faultline_sys::mem::PageMap;
use faultline_sys::uffd::{EventFd, Features, Uffd};
use std::sync::Arc;

/// Builds a [`Manager`]: `Manager::builder().budget(..).workers(..).build()`.
#[derive(Debug, Clone, Default)]
pub struct ManagerBuilder {
    config: Config,
}

impl ManagerBuilder {
    /// A builder starting from `config` (for callers that fill a [`Config`]
    /// themselves, like the CLI); later setters change single fields of it.
    pub fn from_config(config: Config) -> Self {
        ManagerBuilder { config }
    }

    /// Bytes of frames faultline may hold (a multiple of 2 MiB): the memory
    /// budget ([`Config::budget`]).
    pub fn budget(mut self, bytes: usize) -> Self {
        self.config.budget = bytes;
        self
    }

    /// The largest budget [`crate::Manager::set_budget`] may grow to
    /// ([`Config::budget_max`]).
    pub fn budget_max(mut self, bytes: usize) -> Self {
        self.config.budget_max = Some(bytes);
        self
    }

    /// How long free memory above the high watermark idles before it goes
    /// back to the kernel ([`Config::idle_release`]; `None`: never).
    pub fn idle_release(mut self, after: Option<std::time::Duration>) -> Self {
        self.config.idle_release = after;
        self
    }

    /// Number of fault workers ([`Config::workers`]).
    pub fn workers(mut self, n: usize) -> Self {
        self.config.workers = n;
        self
    }

    /// Number of spare servers ([`Config::spare_servers`]): the store
    /// reads in flight at once beyond the workers.
    pub fn spare_servers(mut self, n: usize) -> Self {
        self.config.spare_servers = n;
        self
    }

    /// Who serves missing-page faults: fault workers (the default) or the
    /// faulting thread itself ([`Config::fault_mode`], with its costs).
    pub fn fault_mode(mut self, mode: crate::config::FaultMode) -> Self {
        self.config.fault_mode = mode;
        self
    }

    /// How filled 4 KiB pages go into place ([`Config::fill_model`]).
    pub fn fill_model(mut self, model: crate::config::FillModel) -> Self {
        self.config.fill_model = model;
        self
    }

    /// Sizes the manager for `cpus` CPUs ([`Config::cpus`]) and sets the
    /// worker and spare-server counts to their defaults for them
    /// ([`Config::default_workers`], [`Config::default_spare_servers`]; a
    /// later [`ManagerBuilder::workers`] overrides it). Above the
    /// machine's count it builds the manager a larger machine would get:
    /// more per-CPU frame lists, each with a smaller share of the pool.
    pub fn cpus(mut self, cpus: usize) -> Self {
        self.config.size_for_cpus(cpus);
        self
    }

    /// Whether workers are pinned one per CPU ([`Config::pin_workers`]).
    pub fn pin_workers(mut self, pin: bool) -> Self {
        self.config.pin_workers = pin;
        self
    }

    /// Whether the stats are published for `faultline stat`
    /// ([`Config::publish_stats`]).
    pub fn publish_stats(mut self, on: bool) -> Self {
        self.config.publish_stats = on;
        self
    }

    /// Hear the program's own `MADV_DONTNEED` on region memory and give
    /// the frames back at once ([`Config::program_removals`]).
    pub fn program_removals(mut self, on: bool) -> Self {
        self.config.program_removals = on;
        self
    }

    /// Count faultline's page tables and metadata against the budget
    /// ([`Config::budget_counts_overhead`]).
    pub fn budget_counts_overhead(mut self, on: bool) -> Self {
        self.config.budget_counts_overhead = on;
        self
    }

    /// Whether pages of store-backed regions are reclaimed under the
    /// budget, with the background watermarks in percent of the pool free
    /// ([`Config::reclaim`]).
    pub fn reclaim(mut self, on: bool, low_pct: usize, high_pct: usize) -> Self {
        self.config.reclaim = on;
        self.config.reclaim_low_pct = low_pct;
        self.config.reclaim_high_pct = high_pct;
        self
    }

    /// Largest read-ahead window in 4 KiB pages ([`Config::readahead_max`]).
    pub fn readahead_max(mut self, pages: usize) -> Self {
        self.config.readahead_max = pages;
        self
    }

    /// Fault-around window in 4 KiB pages ([`Config::fault_around`]).
    pub fn fault_around(mut self, pages: usize) -> Self {
        self.config.fault_around = pages;
        self
    }

    /// Share of the budget kept as a small-page zone
    /// ([`Config::small_zone_pct`]).
    pub fn small_zone_pct(mut self, pct: usize) -> Self {
        self.config.small_zone_pct = pct;
        self
    }

    /// Adds a pool of `bytes` with no node binding (a memory tier that
    /// pages reach by migration; [`Config::extra_pools`]).
    pub fn tier(mut self, bytes: usize) -> Self {
        self.config = self.config.with_tier(bytes);
        self
    }

    /// The experiment switches ([`Experiment`]); users leave them alone.
    pub fn experiment(mut self, experiment: Experiment) -> Self {
        self.config.experiment = experiment;
        self
    }

    /// Validates the configuration, opens the userfaultfd, populates the pool
    /// and starts the threads.
    ///
    /// # Errors
    /// [`BuildError::Config`] names the field out of range (or the budget
    /// that does not fit in the memory this process may take);
    /// [`BuildError::Uffd`] when userfaultfd is missing or lacks a feature
    /// faultline needs; [`BuildError::Pool`], [`BuildError::Sys`] and
    /// [`BuildError::Thread`] carry the errno of the step that failed
    /// (`EMFILE` when out of file descriptors); in-thread mode,
    /// [`BuildError::SigbusBlocked`] when the calling thread blocks SIGBUS
    /// and [`BuildError::SigbusTaken`] (see [`crate::in_thread_ready`]).
    pub fn build(self) -> Result<Manager, BuildError> {
        let mut config = self.config;
        // The manager's config says the model in effect, never `Auto`.
        config.fill_model = config.fill_model.under(config.fault_mode);
        config.validate()?;
        if config.fault_mode == crate::config::FaultMode::InThread {
            // A thread that blocks SIGBUS would die of its first fault.
            crate::fault::inthread::ready()?;
        }
        let mut required = Features::MOVE
            .with(Features::POISON)
            .with(Features::EVENT_UNMAP);
        if config.hears_removals() {
            required = required.with(Features::EVENT_REMOVE);
        }
        if config.fault_mode == crate::config::FaultMode::InThread {
            required = required.with(Features::SIGBUS);
        }
        let uffd = Uffd::open(required, Features::THREAD_ID)?;
        // The pool's own context, with no events: a move into a slot
        // needs the slot registered with the context it is issued on, and
        // dropping stale slots (`frame/stale.rs`) on the regions' context
        // would raise a removal event per slot (and refuse every move
        // until it is read).
        let pool_uffd = Uffd::open(Features::MOVE, Features::default())?;
        let parts = pool_parts(&config);
        let pagemap = PageMap::open()?;
        let deferred_fd = EventFd::new()?;
        let pool = Pool::new(&parts, &pool_uffd)?;
        let alloc = FramePools::new(
            &parts,
            AllocConfig {
                pcp: config.experiment.pcp,
                batch: config.experiment.pcp_batch,
                high: config.experiment.pcp_high,
                cpus: config.cpus,
            },
        );
        let uffds = (uffd, pool_uffd);
        let core = Arc::new(Core::new(config, uffds, pool, alloc, pagemap, deferred_fd));
        let number = crate::publish::next_number();
        // Publication is best effort: a machine without /dev/shm still
        // gets its manager.
        let publisher = match core.config.publish_stats {
            false => None,
            true => crate::publish::Publisher::create(&core, number)
                .map_err(|e| tracing::warn!("stats not published ({e})"))
                .ok(),
        };
        let stats_file = publisher.as_ref().map(|p| p.path().to_path_buf());
        let service = Service::start(core, publisher)?;
        Ok(Manager::new(Arc::new(service), number, stats_file))
    }
}

/// The pool's parts: pool 0 (the budget), its small-page zone first if any
/// (so that the THP zone's 2 MiB blocks keep the high addresses), then the
/// extra pools.
fn pool_parts(config: &Config) -> Vec<PartSpec> {
    let huge_unit = faultline_sys::HUGE_PAGE_SIZE;
    let small = (config.budget / 100 * config.small_zone_pct) / huge_unit * huge_unit;
    let mut parts: Vec<PartSpec> = Vec::new();
    if small > 0 {
        parts.push(PartSpec {
            bytes: small,
            node: config.node,
            pool: 0,
            huge: false,
            populate: true,
        });
    }
    if config.budget > small {
        parts.push(PartSpec {
            bytes: config.budget - small,
            node: config.node,
            pool: 0,
            huge: true,
            populate: true,
        });
    }
    // Room to grow (`Manager::set_budget`): not populated; the balloon
    // holds it until the budget grows.
    if config.pool_budget() > config.budget {
        parts.push(PartSpec {
            bytes: config.pool_budget() - config.budget,
            node: config.node,
            pool: 0,
            huge: true,
            populate: false,
        });
    }
    parts.extend(
        config
            .extra_pools
            .iter()
            .enumerate()
            .map(|(i, p)| PartSpec {
                bytes: p.bytes,
                node: p.node,
                pool: i + 1,
                huge: true,
                populate: true,
            }),
    );
    parts
}
