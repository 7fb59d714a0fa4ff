//! [`Manager`]: the handle a program holds. It maps regions (checking every
//! argument: zero, unaligned and oversized lengths, offsets that would wrap,
//! a read-only store behind a writable region, another region over the same
//! object range, a file range mapped by another manager or process), and
//! reports statistics and fault errors.
//!
//! Mapping a region: check the arguments → claim the store's object range
//! (`objects.rs: claim`) → a fresh anonymous mapping not inside another
//! region's range → `MADV_NOHUGEPAGE` + `MADV_DONTFORK` → register it with
//! the userfaultfd (missing-page faults) → publish it in the region table.
//! From then on its first touches fault into the workers. Locks: the
//! object registry's (and under it the process-wide file registry's) and
//! the region table's.

use super::region::{Access, ReadOnly, ReadWrite, Region};
use super::service::Service;
use super::ManagerBuilder;
use crate::config::{Config, Fixed, LookupCache, MapOptions, PageSize};
use crate::core::Core;
use crate::error::{AddrError, BudgetError, FaultError, MapError};
use crate::frame::PoolId;
use crate::region::RegionInner;
use crate::stats::StatsSnapshot;
use crate::store::{Guarded, ReadOnlyView, Store};
use faultline_sys::mem::{Advice, Mapping};
use faultline_sys::uffd::RegisterMode;
use faultline_sys::SysError;
use std::sync::Arc;
use std::time::Duration;

/// A user-space memory manager: a frame pool under a budget, the threads
/// that serve faults, and the regions mapped over it. Cloning the handle is
/// cheap; the manager lives until the last handle and region are dropped.
#[derive(Debug, Clone)]
pub struct Manager {
    service: Arc<Service>,
    /// This manager's number in the process (its stats file's `<n>`).
    number: u32,
    /// Its stats file, if it publishes one.
    stats_file: Option<Arc<std::path::Path>>,
}

impl Manager {
    pub(super) fn new(
        service: Arc<Service>,
        number: u32,
        stats_file: Option<std::path::PathBuf>,
    ) -> Manager {
        Manager {
            service,
            number,
            stats_file: stats_file.map(Arc::from),
        }
    }

    /// The shared-memory file this manager publishes its statistics in
    /// (`/dev/shm/faultline/<pid>-<n>`, read by `faultline stat`), if it
    /// publishes ([`crate::Config::publish_stats`]). The manager removes it
    /// when it drops; a process that ends without dropping its manager (a
    /// C library's process-wide one, say) removes it at exit itself.
    pub fn stats_file(&self) -> Option<&std::path::Path> {
        self.stats_file.as_deref()
    }

    /// A builder with the default configuration.
    pub fn builder() -> ManagerBuilder {
        ManagerBuilder::default()
    }

    fn core(&self) -> &Core {
        &self.service.core
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.core().config
    }

    /// Maps a writable region of `len` bytes (a multiple of the page size in
    /// `opts`) whose pages are filled from `store` on first touch; its
    /// writes go back to the store (or, for [`crate::store::Zero`], live in
    /// memory).
    ///
    /// # Errors
    /// [`MapError`]: zero, unaligned or too large `len`; 2 MiB pages without
    /// THP; a store that cannot keep writes, unless the region is pinned
    /// ([`MapError::ReadOnlyStore`]: use [`Manager::map_read_only`] or
    /// [`MapOptions::pinned`]); the store's object range mapped
    /// writable by another region of this manager
    /// ([`MapError::Overlaps`]); a file range mapped by a region of another
    /// manager or process, one of the two writable
    /// ([`MapError::FileInUse`]); for an in-thread manager, a calling
    /// thread that blocks SIGBUS ([`MapError::SigbusBlocked`]); a failed
    /// system call, with its errno.
    pub fn map(
        &self,
        len: usize,
        store: impl Store + 'static,
        opts: MapOptions,
    ) -> Result<Region, MapError> {
        self.map_shared(len, Arc::new(store), opts)
    }

    /// Like [`Manager::map`], with a store shared with other regions.
    ///
    /// # Errors
    /// As [`Manager::map`].
    pub fn map_shared(
        &self,
        len: usize,
        store: Arc<dyn Store>,
        opts: MapOptions,
    ) -> Result<Region, MapError> {
        if !store.writable() && !store.is_zero() && !opts.pinned {
            return Err(MapError::ReadOnlyStore);
        }
        self.map_as::<ReadWrite>(len, store, opts)
    }

    /// Maps a region that is only read: its type has no write methods, and
    /// nothing is ever written to `store`.
    ///
    /// # Errors
    /// As [`Manager::map`], except that any store is accepted.
    pub fn map_read_only(
        &self,
        len: usize,
        store: impl Store + 'static,
        opts: MapOptions,
    ) -> Result<Region<ReadOnly>, MapError> {
        let view = ReadOnlyView(Arc::new(store));
        self.map_as::<ReadOnly>(len, Arc::new(view), opts)
    }

    fn map_as<A: Access>(
        &self,
        len: usize,
        store: Arc<dyn Store>,
        opts: MapOptions,
    ) -> Result<Region<A>, MapError> {
        let page = opts.page_size;
        check_len(len, page)?;
        if page == PageSize::Huge2M && !self.core().pool.thp() {
            return Err(MapError::NoHugePages);
        }
        let core = self.core();
        if core.config.fault_mode == crate::config::FaultMode::InThread
            && faultline_sys::signal::sigbus_blocked() == Ok(true)
        {
            return Err(MapError::SigbusBlocked);
        }
        let id = core.next_region_id();
        let claim = core.objects.claim(id, store.as_ref(), len, self.number)?;
        let mapped = self.map_range(id, len, store, opts);
        match &mapped {
            Ok(inner) if claim => core.objects.mapped(id, inner.start()),
            Ok(_) => {}
            Err(_) if claim => core.objects.release(id),
            Err(_) => {}
        }
        mapped.map(|inner| Region::new(inner, Arc::clone(&self.service)))
    }

    /// An anonymous mapping for a new region. Once the program has unmapped
    /// part of a region, the kernel may place a new mapping in that hole,
    /// inside the old region's range (even before faultline has read the
    /// unmap event): such a mapping is held aside (so the kernel picks
    /// another place) and a new one made, a few times.
    fn fresh_mapping(&self, len: usize, opts: &MapOptions) -> Result<Mapping, MapError> {
        let page = opts.page_size;
        if let Some(fixed) = opts.fixed {
            return self.fixed_mapping(len, page, fixed);
        }
        let core = self.core();
        // A region of 2 MiB or more starts on a 2 MiB boundary: its 4 KiB
        // pages then need a page table per 2 MiB, not up to two.
        let huge = faultline_sys::HUGE_PAGE_SIZE;
        let align = if len >= huge {
            page.bytes().max(huge)
        } else {
            page.bytes()
        };
        let mut aside = Vec::new();
        loop {
            let map = Mapping::anonymous(len, align)?;
            if !core.table.overlaps(map.addr(), map.addr() + len) {
                return Ok(map);
            }
            if aside.len() >= 16 {
                return Err(MapError::Sys(SysError {
                    op: "mmap",
                    addr: map.addr(),
                    len,
                    errno: libc::ENOMEM,
                }));
            }
            aside.push(map);
        }
    }

    /// The mapping of a region placed by [`MapOptions::at`].
    fn fixed_mapping(&self, len: usize, page: PageSize, at: Fixed) -> Result<Mapping, MapError> {
        let addr = at.addr;
        if addr % page.bytes() != 0 || addr == 0 {
            return Err(MapError::UnalignedAddress {
                addr,
                page: page.name(),
            });
        }
        let end = addr.checked_add(len).ok_or(MapError::TooLarge { len })?;
        if self.core().table.overlaps(addr, end) {
            return Err(MapError::AddressInUse { addr, len });
        }
        let made = if at.replace {
            // SAFETY: `MapOptions::at_replacing`'s caller vouched that
            // nothing references the range; no managed region is in it
            // (checked above).
            unsafe { Mapping::anonymous_replacing(addr, len) }
        } else {
            Mapping::anonymous_at(addr, len)
        };
        made.map_err(|e| match e.errno {
            libc::EEXIST => MapError::AddressInUse { addr, len },
            _ => MapError::Sys(e),
        })
    }

    /// Maps, registers and publishes region `id` (see [`Manager::map`]).
    fn map_range(
        &self,
        id: u64,
        len: usize,
        store: Arc<dyn Store>,
        opts: MapOptions,
    ) -> Result<Arc<RegionInner>, MapError> {
        let page = opts.page_size;
        let map = self.fresh_mapping(len, &opts)?;
        map.advise(map.addr(), len, Advice::NoHugePage)?;
        map.advise(map.addr(), len, Advice::DontFork)?;
        let core = self.core();
        // Write-protect mode too where fills may go in write-protected
        // (`FillModel::CopyProtected`: `UFFDIO_COPY_MODE_WP` needs it).
        let mode = RegisterMode {
            missing: true,
            wp: core.config.fill_model == crate::config::FillModel::CopyProtected,
        };
        core.uffd.register(map.addr(), len, mode)?;
        let window = lock_window(core, store.as_ref(), page);
        let store: Arc<dyn Store> = Arc::new(Guarded(store));
        let inner = Arc::new(
            RegionInner::new(id, map, page, store, window, opts.pinned)
                .with_read_ahead(core.config.readahead_streams(), opts.access)
                .with_fingerprints(&core.fps)
                .counting_overhead(&core.overhead_sum),
        );
        core.table.insert(Arc::clone(&inner));
        Ok(inner)
    }

    /// Changes the budget to `bytes` while the manager runs: shrinking
    /// reclaims down to it (evicting and writing back as under memory
    /// pressure) and gives the freed memory back to the kernel; growing
    /// (up to [`crate::Config::budget_max`]) populates more pool.
    ///
    /// A shrink returns within about 5 s: it reclaims until the budget is
    /// down or 5 s have passed, finishing only the store call under way
    /// then. That call writes one run of up to 256 pages (1 MiB), so a
    /// slow store adds its time: a store that writes a run page by page
    /// (the default [`crate::Store::write_pages`]) up to 256 of its page
    /// writes, a Redis write waiting out `RedisOptions::retry_for` that
    /// wait. Threads that fault
    /// meanwhile compete for the frames reclaim frees, so under load a
    /// shrink may end `Busy` short of the target even though every page is
    /// evictable; calling again goes on from what was reached.
    ///
    /// # Errors
    /// [`BudgetError`]: not a multiple of 2 MiB, above `budget_max`, or
    /// [`BudgetError::Busy`], a shrink that had not reached `bytes` after
    /// 5 s (pinned, zero-store or busy pages, or frames taken by faulting
    /// threads as reclaim freed them) — the budget is then what was
    /// reached, `reached` bytes, and stays so.
    pub fn set_budget(&self, bytes: usize) -> Result<(), BudgetError> {
        crate::reclaim::set_budget(self.core(), bytes)
    }

    /// Current statistics.
    pub fn stats(&self) -> StatsSnapshot {
        crate::publish::snapshot(self.core()).0
    }

    /// The statistics in the Prometheus text format, computed now (what
    /// `faultline stat --prometheus` shows from the published file; see
    /// [`crate::published::prometheus`] for the names). It walks the pages
    /// in use to count resident and parked ones.
    pub fn prometheus_text(&self) -> String {
        crate::publish::prometheus_of(self.core(), self.number)
    }

    /// The oldest fault error not yet returned, if any (a fault that could not
    /// be served poisons its page, so its thread gets SIGBUS, and queues its
    /// cause here).
    pub fn take_error(&self) -> Option<FaultError> {
        self.core().take_error(|_| true)
    }

    /// [`Manager::take_error`], waiting up to `timeout` for an error to be
    /// queued (for a thread that watches a manager's errors).
    pub fn next_error(&self, timeout: Duration) -> Option<FaultError> {
        self.core().wait_error(|_| true, timeout)
    }

    /// Number of mapped regions.
    pub fn regions(&self) -> usize {
        self.core().table.len()
    }

    /// The range and page size of the region holding `addr`.
    ///
    /// # Errors
    /// [`AddrError::Foreign`] if no region of this manager holds `addr`.
    pub fn region_at(&self, addr: usize) -> Result<(usize, usize, PageSize), AddrError> {
        self.core()
            .table
            .lookup_with(addr, |r| (r.start(), r.end(), r.page_size))
            .ok_or(AddrError::Foreign { addr })
    }

    /// Switches the region table's lookup cache (for experiments; lookups in
    /// flight finish with the old scheme, which is equally correct).
    pub fn set_lookup_cache(&self, cache: LookupCache) {
        self.core().table.set_cache(cache);
    }

    /// The fault addresses recorded so far (with
    /// [`crate::Experiment::trace_faults`]).
    pub fn fault_trace(&self) -> Vec<usize> {
        self.core().trace.lock().clone()
    }

    /// Number of frame pools (1 + [`Config::extra_pools`]).
    pub fn pools(&self) -> usize {
        self.core().alloc.count()
    }

    /// `(size, free)` of pool `pool` in bytes (zero for no such pool).
    pub fn pool_bytes(&self, pool: PoolId) -> (usize, usize) {
        let a = &self.core().alloc;
        let ps = faultline_sys::PAGE_SIZE;
        (a.pages_in(pool) * ps, a.free_pages_in(pool) * ps)
    }

    /// The userfaultfd features in use.
    pub fn features(&self) -> Vec<&'static str> {
        self.core().uffd.features().names()
    }
}

/// Checks a region length: non-zero, a multiple of the page size, and
/// small enough that addresses within it cannot overflow.
fn check_len(len: usize, page: PageSize) -> Result<(), MapError> {
    if len == 0 {
        return Err(MapError::ZeroLength);
    }
    if len % page.bytes() != 0 {
        return Err(MapError::Unaligned {
            len,
            page: page.name(),
        });
    }
    if len > isize::MAX as usize / 2 {
        return Err(MapError::TooLarge { len });
    }
    Ok(())
}

/// The lock window: pages that share a fault lock. Zero-filled 4 KiB
/// regions: the fault-around window (one lock per window mapped at once).
/// 4 KiB regions over a named object (a file): the largest read-ahead
/// window, so a read-ahead run needs one or two locks, not one per page
/// (with one per page, a concurrent read-ahead holds most of the table and
/// every try_lock fails: 3.6x fewer sequential reads per second,
/// docs/design.md); faults inside one window wait for each other, as the
/// kernel's do for pages of a read-ahead in flight. Other stores (remote,
/// slow: seed 003's case) and 2 MiB pages: the page, so a slow fault holds
/// up no other page.
fn lock_window(core: &Core, store: &dyn Store, page: PageSize) -> usize {
    match page {
        PageSize::Base4K if store.is_zero() => core.config.fault_around,
        PageSize::Base4K if store.identity().is_some() => core.config.readahead_max,
        PageSize::Base4K | PageSize::Huge2M => 1,
    }
}
