//! The manager: builds the pool, the userfaultfd context and the workers from
//! a [`Config`], maps regions, and tears everything down in order.
//!
//! Ownership: workers — and the zeroing and reclaim threads — hold an
//! `Arc<Core>` (userfaultfd, pool, allocator, region table, locks, stats). The [`Manager`] and every [`Region`] hold an
//! `Arc<Service>`, which owns the worker threads; when the last of them is
//! dropped, `Service::drop` signals the shutdown eventfd and joins the
//! workers. A region therefore keeps its workers alive even if the
//! `Manager` handle is dropped first, and the pool outlives every region.
//!
//! Region teardown (`Region::drop`): remove from the table (no new lookup
//! finds it) → `dying = true` → unregister (blocked threads wake) → for each
//! resident page, under its fault lock, move the frame back to its pool slot
//! and free it → the mapping is unmapped when the last `Arc<RegionInner>`
//! (perhaps a worker's) goes.
//!
//! Locks: the error queue mutex (leaf), plus those of the table, allocator
//! and fault locks described in their modules.

use crate::config::{Config, ConfigError, LockMode, MapOptions, PageSize};
use crate::fault::{service, FaultError, FaultLocks};
use crate::frame::pools::PartSpec;
use crate::frame::{AllocConfig, Frame, FrameAllocator, FramePools, Pool, PoolError, PoolId};
use crate::migrate::{CopyPlan, MigrateError, MigrateReport};
use crate::pagemove::{self, Holes};
use crate::region::{PageState, RegionInner, RegionTable};
use crate::stats::{Stats, StatsSnapshot};
use crate::store::{Store, StoreError};
use faultline_sys::mem::{Advice, Mapping};
use faultline_sys::uffd::{EventFd, Features, OpenError, RegisterMode, Uffd, Waiter};
use faultline_sys::SysError;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// At most this many fault errors are queued; older ones are dropped (and
/// still counted in the stats).
const ERROR_QUEUE: usize = 1024;

/// Why a manager could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// No usable userfaultfd.
    #[error(transparent)]
    Uffd(#[from] OpenError),
    /// The frame pool could not be set up.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Another system call failed.
    #[error("{0}")]
    Sys(#[from] SysError),
    /// A worker thread could not be started.
    #[error("starting fault worker: {0}")]
    Thread(#[source] std::io::Error),
}

/// Why a region could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// Zero length.
    #[error("a region cannot be empty")]
    ZeroLength,
    /// Length not a multiple of the page size (refused, not rounded).
    #[error("length {len} is not a multiple of the {page} page size")]
    Unaligned {
        /// The length asked for.
        len: usize,
        /// The region's page size.
        page: &'static str,
    },
    /// 2 MiB pages without transparent huge pages.
    #[error(
        "2 MiB pages need transparent huge pages, which this kernel has disabled \
         (/sys/kernel/mm/transparent_hugepage/enabled is [never]); use 4 KiB pages or enable THP (madvise or always)"
    )]
    NoHugePages,
    /// The region is larger than the address space allows.
    #[error("length {len} is too large")]
    TooLarge {
        /// The length asked for.
        len: usize,
    },
    /// Another region of this manager maps an overlapping range of the same
    /// object (file), and one of the two may write it: their pages would
    /// be separate copies, and one region's write-back would overwrite the
    /// other's writes. Map the object once and share the region, or map
    /// both read-only.
    #[error(
        "bytes {start}..{end} of this store's object overlap bytes {other_start}..{other_end} \
         mapped writable by another region; two regions over one object range are not coherent"
    )]
    Overlaps {
        /// Object bytes asked for.
        start: u64,
        /// End of the object bytes asked for.
        end: u64,
        /// The other region's object bytes.
        other_start: u64,
        /// End of the other region's object bytes.
        other_end: u64,
    },
    /// The store's offset plus the region's length does not fit in 64 bits
    /// (it would wrap around to the object's first bytes).
    #[error("store offset {offset} + region length {len} overflows")]
    OffsetOverflow {
        /// The store's offset in its object.
        offset: u64,
        /// The region's length.
        len: usize,
    },
    /// A system call failed.
    #[error("{0}")]
    Sys(#[from] SysError),
}

/// One region's use of a named object (a file): `(region id, object,
/// byte range, writable)`; see [`MapError::Overlaps`].
#[derive(Debug, Clone, Copy)]
struct ObjectUse {
    region: u64,
    object: u64,
    start: u64,
    end: u64,
    writable: bool,
}

/// A bad address passed to an API call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// The address lies in no region of this manager (or not in this region).
    #[error("address {addr:#x} is not in a faultline region")]
    Foreign {
        /// The address.
        addr: usize,
    },
    /// The address is not aligned to the region's page size.
    #[error("address {addr:#x} is not aligned to the {page} page size")]
    Unaligned {
        /// The address.
        addr: usize,
        /// The region's page size.
        page: &'static str,
    },
}

/// State shared by the workers and the handles.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) config: Config,
    /// Declared (so dropped) before `pool`: the pool is registered with it,
    /// and with `UFFD_FEATURE_EVENT_UNMAP` unmapping a registered range
    /// waits for a reader of the event — closing the userfaultfd first
    /// unregisters everything.
    pub(crate) uffd: Uffd,
    pub(crate) pool: Pool,
    pub(crate) alloc: FramePools,
    pub(crate) table: RegionTable,
    pub(crate) locks: FaultLocks,
    pub(crate) stats: Stats,
    /// This process's page tables, read by the page-move protocol
    /// ([`crate::pagemove`]).
    pub(crate) pagemap: faultline_sys::mem::PageMap,
    /// The process that built the manager. A child of `fork()` has copies of
    /// every handle but none of the threads, and shares the userfaultfd and
    /// the shutdown eventfd with this process (ioctls on the userfaultfd act
    /// on *this* process's address space): in a child, dropping a handle
    /// must do nothing but forget it ([`Core::in_owner`]).
    pid: u32,
    errors: Mutex<VecDeque<FaultError>>,
    /// The object ranges mapped by live regions (a leaf lock, taken at map
    /// and teardown).
    objects: Mutex<Vec<ObjectUse>>,
    /// Unmap events read but not yet handled (see [`Core::await_unmaps`]).
    unmaps_pending: std::sync::atomic::AtomicUsize,
    /// Threads inside [`Core::read_events`] (their unmap events are not
    /// counted in `unmaps_pending` yet).
    readers: std::sync::atomic::AtomicUsize,
    next_id: AtomicU64,
    /// Events handed off by a worker about to block; see `fault::service`.
    pub(crate) deferred: Mutex<VecDeque<service::Queued>>,
    /// Signalled when `deferred` gets events.
    pub(crate) deferred_fd: EventFd,
    /// Kernel thread ids of the workers (a fault from one is a bug).
    pub(crate) worker_tids: Mutex<Vec<u32>>,
    /// Zeroed 2 MiB frames ready for faults (filled by the zeroing worker).
    reserve: Mutex<Vec<Frame>>,
    /// Wakes the zeroing worker (a frame was taken, or shutdown).
    reserve_cv: parking_lot::Condvar,
    stopping: std::sync::atomic::AtomicBool,
    /// Fault addresses, when `config.trace_faults > 0`.
    pub(crate) trace: Mutex<Vec<usize>>,
    /// The reclaim clock's hand.
    pub(crate) hand: Mutex<crate::reclaim::Hand>,
    /// Migration copies offered to idle workers (see `migrate`).
    pub(crate) copy_jobs: Mutex<Vec<Arc<crate::migrate::CopyJob>>>,
    /// Number of offered copies; workers look at the list only when > 0.
    pub(crate) copy_pending: std::sync::atomic::AtomicUsize,
}

impl Core {
    /// A pre-zeroed 2 MiB frame, if the reserve has one.
    pub(crate) fn take_prezeroed(&self) -> Option<Frame> {
        let f = self.reserve.lock().pop();
        if f.is_some() {
            self.reserve_cv.notify_one();
        }
        f
    }

    /// Allocates a frame of `order`; if none is free, gives the pre-zeroed
    /// reserve back to the allocator (its frames stay marked zero), then
    /// reclaims synchronously, trying again after each step. `held` is the
    /// index of the fault lock the caller holds, if any.
    pub(crate) fn alloc_or_reclaim_reserve(&self, order: u8, held: Option<usize>) -> Option<Frame> {
        if let Some(f) = self.alloc.alloc(order) {
            return Some(f);
        }
        let mut back: Vec<Frame> = std::mem::take(&mut *self.reserve.lock());
        if !back.is_empty() {
            self.alloc.free_bulk(&mut back);
            if let Some(f) = self.alloc.alloc(order) {
                return Some(f);
            }
        }
        if !self.config.reclaim {
            return None;
        }
        // Each pass parks what it passes and evicts what it parked on the
        // previous one, so a few passes free memory even when every page is
        // resident.
        let want = (1usize << order).max(self.config.pcp_batch);
        for _ in 0..4 {
            let freed = crate::reclaim::reclaim(self, want, held, || false);
            if let Some(f) = self.alloc.alloc(order) {
                return Some(f);
            }
            if freed == 0 && self.table.regions().iter().all(|r| r.store.is_zero()) {
                return None;
            }
        }
        // Still nothing: the reclaimable pages may be under fault locks other
        // workers hold for a moment (with a budget of a few frames, two
        // concurrent faults can hold every one), or the frames just freed
        // went to another fault. Wait for them rather than fail the fault —
        // up to 2 s, then the fault is refused (SIGBUS, cause queued).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(200));
            crate::reclaim::reclaim(self, want, held, || false);
            if let Some(f) = self.alloc.alloc(order) {
                Stats::bump(&self.stats.reclaim_waits);
                return Some(f);
            }
        }
        None
    }

    /// The background reclaimer: wakes every 10 ms and, when free memory is
    /// below the low watermark, reclaims up to the high one.
    fn run_reclaimer(&self) {
        let pages = self.alloc.pages_in(0);
        let low = pages * self.config.reclaim_low_pct / 100;
        let high = pages * self.config.reclaim_high_pct / 100;
        loop {
            {
                let mut r = self.reserve.lock();
                if !self.stopping.load(Ordering::Acquire) {
                    self.reserve_cv
                        .wait_for(&mut r, std::time::Duration::from_millis(10));
                }
            }
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let mut free = self.alloc.free_hint();
            if free < low {
                // Pre-zeroed frames are free memory first (the zeroing
                // worker makes more once memory is plentiful again).
                let mut back: Vec<Frame> = std::mem::take(&mut *self.reserve.lock());
                if !back.is_empty() {
                    self.alloc.free_bulk(&mut back);
                    free = self.alloc.free_hint();
                }
            }
            if free < low {
                crate::reclaim::reclaim(self, high - free, None, || self.alloc.free_hint() >= high);
            }
        }
    }

    /// The zeroing worker: keeps `prezero_reserve` zeroed 2 MiB frames ready,
    /// at the lowest CPU priority, leaving at least twice the reserve free in
    /// the pool for faults.
    fn run_zeroer(&self) {
        let _ = faultline_sys::host::set_thread_nice(19);
        let want = self.config.prezero_reserve;
        let keep_free = 2 * want * crate::frame::PAGES_PER_HUGE;
        loop {
            {
                let mut r = self.reserve.lock();
                while !self.stopping.load(Ordering::Acquire)
                    && (r.len() >= want || self.alloc.free_hint() < keep_free)
                {
                    // Timed: free memory may come back without a notify.
                    self.reserve_cv
                        .wait_for(&mut r, std::time::Duration::from_millis(20));
                }
            }
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let Some(mut f) = self.alloc.alloc(crate::frame::HUGE_ORDER) else {
                continue;
            };
            if !self.pool.is_zeroed(&f) {
                // SAFETY: `f` was just allocated: this thread owns it.
                crate::fill::clear(unsafe { self.pool.bytes_mut(&mut f) });
                self.pool.set_zeroed(&f, true);
            }
            Stats::bump(&self.stats.prezeroed_made);
            self.reserve.lock().push(f);
        }
    }

    /// Records that region `id` maps `len` bytes of `store`'s object, if it
    /// names one; refuses an overlap with another region's range of the same
    /// object when either may write. Returns whether a use was recorded.
    fn claim_object(&self, id: u64, store: &dyn Store, len: usize) -> Result<bool, MapError> {
        let Some((object, start)) = store.identity() else {
            return Ok(false);
        };
        let Some(end) = start.checked_add(len as u64) else {
            return Err(MapError::OffsetOverflow { offset: start, len });
        };
        let writable = store.writable();
        let mut uses = self.objects.lock();
        if let Some(u) = uses.iter().find(|u| {
            u.object == object && u.start < end && start < u.end && (u.writable || writable)
        }) {
            return Err(MapError::Overlaps {
                start,
                end,
                other_start: u.start,
                other_end: u.end,
            });
        }
        uses.push(ObjectUse {
            region: id,
            object,
            start,
            end,
            writable,
        });
        Ok(true)
    }

    /// Reads pending userfaultfd events into the deferred queue for the
    /// workers. Called by a thread waiting for a move the kernel refuses
    /// with `EAGAIN`: while a `UFFD_EVENT_UNMAP` is unread, the kernel
    /// refuses every move (`mmap_changing`), and the workers that would read
    /// it may be waiting for a lock this thread holds.
    pub(crate) fn pump_events(&self) {
        let mut evs = Vec::new();
        if let Ok((n, stamp)) = self.read_events(&mut evs, 64) {
            if n == 0 {
                return;
            }
            self.deferred
                .lock()
                .extend(evs.into_iter().map(|ev| (ev, stamp)));
            if let Err(e) = self.deferred_fd.signal() {
                self.record(FaultError::Events(e));
            }
        }
    }

    /// Reads up to `max` pending userfaultfd events (without blocking) into
    /// `out`; returns how many, and the stamp for them: the next region id
    /// *before* the read ([`Core::region_stamp`]). A thread that unmapped
    /// part of a region is released only once its event is read, so every
    /// region it maps afterwards has an id at or above the stamp. Unmap
    /// events read are counted pending until handled.
    pub(crate) fn read_events(
        &self,
        out: &mut Vec<faultline_sys::uffd::Event>,
        max: usize,
    ) -> Result<(usize, u64), SysError> {
        let stamp = self.region_stamp();
        // AcqRel: pairs with the Acquire loads in `await_unmaps`.
        self.readers.fetch_add(1, Ordering::AcqRel);
        let before = out.len();
        let r = self.uffd.read_events(out, max);
        let unmaps = out[before..]
            .iter()
            .filter(|e| matches!(e, faultline_sys::uffd::Event::Unmap { .. }))
            .count();
        if unmaps > 0 {
            self.unmaps_pending.fetch_add(unmaps, Ordering::AcqRel);
        }
        self.readers.fetch_sub(1, Ordering::AcqRel);
        r.map(|n| (n, stamp))
    }

    /// Marks one unmap event handled. Release pairs with the Acquire load in
    /// [`Core::await_unmaps`]: the region's gone ranges are recorded first.
    pub(crate) fn unmap_handled(&self) {
        self.unmaps_pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// Before a region is torn down: reads pending events and waits (up to
    /// 5 s) until every unmap event read so far is handled, so the region
    /// knows every range the program unmapped before dropping it (a
    /// program that unmaps part of a region and then drops it has been
    /// released from `munmap` only once the event was read, not handled).
    pub(crate) fn await_unmaps(&self) {
        self.pump_events();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while (self.readers.load(Ordering::Acquire) > 0
            || self.unmaps_pending.load(Ordering::Acquire) > 0)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// The id the next region will get. Read just before events are read:
    /// a region with this id or higher was mapped after the events' unmaps. Acquire pairs
    /// with the increment in `map_shared` (AcqRel).
    pub(crate) fn region_stamp(&self) -> u64 {
        self.next_id.load(Ordering::Acquire)
    }

    /// Whether the manager is shutting down (set before the workers'
    /// shutdown eventfd is signalled). Acquire pairs with the Release store
    /// in `Service::drop`.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Whether this is the process that built the manager (not a child of
    /// `fork()`); see `pid`.
    pub(crate) fn in_owner(&self) -> bool {
        self.pid == faultline_sys::host::process_id()
    }

    /// Queues a fault error for the API to return.
    pub(crate) fn record(&self, e: FaultError) {
        tracing::warn!(error = %e, "fault error");
        Stats::bump(&self.stats.errors);
        let mut q = self.errors.lock();
        if q.len() == ERROR_QUEUE {
            q.pop_front();
            Stats::bump(&self.stats.errors_dropped);
        }
        q.push_back(e);
    }

    /// Removes and returns the oldest queued error that `pick` accepts.
    fn take_error(&self, pick: impl Fn(&FaultError) -> bool) -> Option<FaultError> {
        let mut q = self.errors.lock();
        let i = q.iter().position(pick)?;
        q.remove(i)
    }
}

/// Owns the worker threads; see the module docs.
#[derive(Debug)]
struct Service {
    core: Arc<Core>,
    shutdown: EventFd,
    workers: Vec<JoinHandle<()>>,
}

impl Drop for Service {
    fn drop(&mut self) {
        if !self.core.in_owner() {
            // A child of fork(): the workers are the parent's (none run
            // here), and the shutdown eventfd is shared with the parent —
            // signalling it would stop the parent's workers.
            return;
        }
        // If signalling fails the workers would block forever; there is no
        // way to report it from drop, and joining would hang, so detach then.
        // Release pairs with the zeroing worker's Acquire load.
        self.core.stopping.store(true, Ordering::Release);
        self.core.reserve_cv.notify_all();
        if self.shutdown.signal().is_ok() && self.join_bounded() {
            let mut reserve = std::mem::take(&mut *self.core.reserve.lock());
            self.core.alloc.free_bulk(&mut reserve);
            // Every region is gone (each held this service), so every frame
            // is free again: `free + in flight + mapped = pool pages` with the
            // last two zero. Checked in debug builds (the tests).
            if cfg!(debug_assertions) && !std::thread::panicking() {
                self.core.alloc.check();
                debug_assert_eq!(
                    self.core.alloc.free_pages(),
                    self.core.pool.pages(),
                    "frames leaked at shutdown"
                );
            }
        }
    }
}

/// How long dropping the manager waits for its threads: a worker inside a
/// store call that never returns (a hung remote store) must not hang the
/// program's drop.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Service {
    /// Joins the threads that finish within [`SHUTDOWN_WAIT`]; the others
    /// are detached with an error logged (they keep the core, and with it
    /// the pool, alive until they return). Returns whether all joined.
    fn join_bounded(&mut self) -> bool {
        let deadline = std::time::Instant::now() + SHUTDOWN_WAIT;
        while self.workers.iter().any(|w| !w.is_finished()) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut all = true;
        for w in self.workers.drain(..) {
            if w.is_finished() {
                let _ = w.join();
            } else {
                all = false;
                tracing::error!(
                    thread = w.thread().name().unwrap_or("?"),
                    "a faultline thread did not stop within {SHUTDOWN_WAIT:?} (a store call that does not return?); detached"
                );
            }
        }
        all
    }
}

/// Builds a [`Manager`].
#[derive(Debug, Clone, Default)]
pub struct ManagerBuilder {
    config: Config,
}

impl ManagerBuilder {
    /// Bytes of frames faultline may hold (a multiple of 2 MiB).
    pub fn budget(mut self, bytes: usize) -> Self {
        self.config.budget = bytes;
        self
    }

    /// Number of fault workers (the lock table follows: `2 x workers`, at least 64,
    /// rounded up to a power of two).
    pub fn workers(mut self, n: usize) -> Self {
        self.config.workers = n;
        self.config.fault_locks = (2 * n).next_power_of_two().max(64);
        self
    }

    /// Whether workers are pinned one per CPU.
    pub fn pin_workers(mut self, pin: bool) -> Self {
        self.config.pin_workers = pin;
        self
    }

    /// Fault lock discipline.
    pub fn locks(mut self, mode: LockMode) -> Self {
        self.config.locks = mode;
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Validates the configuration, opens the userfaultfd, populates the pool
    /// and starts the workers.
    pub fn build(self) -> Result<Manager, BuildError> {
        let config = self.config;
        config.validate()?;
        let uffd = Uffd::open(
            Features::MOVE
                .with(Features::POISON)
                .with(Features::EVENT_UNMAP),
            Features::THREAD_ID,
        )?;
        // Pool 0 (the budget), its small-page zone first if any (so that the
        // THP zone's 2 MiB blocks keep the high addresses), then the others.
        let huge_unit = faultline_sys::HUGE_PAGE_SIZE;
        let small = (config.budget / 100 * config.small_zone_pct) / huge_unit * huge_unit;
        let mut parts: Vec<PartSpec> = Vec::new();
        if small > 0 {
            parts.push(PartSpec {
                bytes: small,
                node: config.node,
                pool: 0,
                huge: false,
            });
        }
        if config.budget > small {
            parts.push(PartSpec {
                bytes: config.budget - small,
                node: config.node,
                pool: 0,
                huge: true,
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
                }),
        );
        // Everything fallible that the core needs comes before the pool: once
        // the pool is registered, dropping it before the userfaultfd (as an
        // error return here would: locals drop in reverse) would wait forever
        // for a reader of its unmap event.
        let pagemap = faultline_sys::mem::PageMap::open()?;
        let deferred_fd = EventFd::new()?;
        let pool = Pool::new(&parts, &uffd)?;
        let alloc = FramePools::new(
            &parts,
            AllocConfig {
                pcp: config.pcp,
                batch: config.pcp_batch,
                high: config.pcp_high,
                cpus: faultline_sys::host::online_cpus(),
            },
        );
        let core = Arc::new(Core {
            locks: FaultLocks::new(config.locks, config.fault_locks),
            stats: Stats::new(config.workers),
            pagemap,
            pid: faultline_sys::host::process_id(),
            table: RegionTable::new(config.lookup_cache),
            errors: Mutex::new(VecDeque::new()),
            objects: Mutex::new(Vec::new()),
            unmaps_pending: std::sync::atomic::AtomicUsize::new(0),
            readers: std::sync::atomic::AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            deferred: Mutex::new(VecDeque::new()),
            deferred_fd,
            worker_tids: Mutex::new(Vec::new()),
            reserve: Mutex::new(Vec::new()),
            reserve_cv: parking_lot::Condvar::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            trace: Mutex::new(Vec::new()),
            hand: Mutex::new(crate::reclaim::Hand::default()),
            copy_jobs: Mutex::new(Vec::new()),
            copy_pending: std::sync::atomic::AtomicUsize::new(0),
            config,
            uffd,
            pool,
            alloc,
        });
        let shutdown = EventFd::new()?;
        let mut service = Service {
            core: Arc::clone(&core),
            shutdown,
            workers: Vec::new(),
        };
        let fd: RawFd = service.shutdown.raw_fd();
        // Every worker's epoll set is made here, so running out of file
        // descriptors is build()'s error, not a worker that quietly exits
        // (and a first touch that then waits forever).
        let others = [fd, core.deferred_fd.raw_fd()];
        let waiters = (0..core.config.workers)
            .map(|_| Waiter::new(&core.uffd, &others, core.config.exclusive_wake))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, waiter) in waiters.into_iter().enumerate() {
            let c = Arc::clone(&core);
            let h = std::thread::Builder::new()
                .name(format!("faultline-w{i}"))
                .spawn(move || service::run_worker(c, i, waiter))
                .map_err(BuildError::Thread)?;
            service.workers.push(h);
        }
        let mut background = |name: &str, run: fn(&Core)| -> Result<(), BuildError> {
            let c = Arc::clone(&core);
            let h = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || run(&c))
                .map_err(BuildError::Thread)?;
            service.workers.push(h);
            Ok(())
        };
        if core.config.reclaim {
            background("faultline-reclaim", Core::run_reclaimer)?;
        }
        if core.config.prezero && core.pool.thp() {
            background("faultline-zero", Core::run_zeroer)?;
        }
        Ok(Manager {
            service: Arc::new(service),
        })
    }
}

/// A user-space memory manager. See the crate docs.
#[derive(Debug, Clone)]
pub struct Manager {
    service: Arc<Service>,
}

impl Manager {
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

    /// Maps a region of `len` bytes (a multiple of the page size in `opts`)
    /// whose pages are filled from `store` on first touch.
    pub fn map(
        &self,
        len: usize,
        store: impl Store + 'static,
        opts: MapOptions,
    ) -> Result<Region, MapError> {
        self.map_shared(len, Arc::new(store), opts)
    }

    /// Like [`Manager::map`], with a store shared with other regions.
    pub fn map_shared(
        &self,
        len: usize,
        store: Arc<dyn Store>,
        opts: MapOptions,
    ) -> Result<Region, MapError> {
        let page = opts.page_size;
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
        if page == PageSize::Huge2M && !self.core().pool.thp() {
            return Err(MapError::NoHugePages);
        }
        let core = self.core();
        let id = core.next_id.fetch_add(1, Ordering::AcqRel);
        let claim = core.claim_object(id, store.as_ref(), len)?;
        let mapped = self.map_range(id, len, store, page);
        if mapped.is_err() && claim {
            core.objects.lock().retain(|u| u.region != id);
        }
        mapped
    }

    /// An anonymous mapping for a new region. Once the program has unmapped
    /// part of a region, the kernel may place a new mapping in that hole,
    /// inside the old region's range (even before faultline has read the
    /// unmap event): such a mapping is held aside (so the kernel picks
    /// another place) and a new one made, a few times.
    fn fresh_mapping(&self, len: usize, page: PageSize) -> Result<Mapping, MapError> {
        let core = self.core();
        let mut aside = Vec::new();
        loop {
            let map = Mapping::anonymous(len, page.bytes())?;
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

    /// Maps, registers and publishes region `id` (see [`Manager::map`]).
    fn map_range(
        &self,
        id: u64,
        len: usize,
        store: Arc<dyn Store>,
        page: PageSize,
    ) -> Result<Region, MapError> {
        let map = self.fresh_mapping(len, page)?;
        map.advise(map.addr(), len, Advice::NoHugePage)?;
        map.advise(map.addr(), len, Advice::DontFork)?;
        let core = self.core();
        core.uffd.register(
            map.addr(),
            len,
            RegisterMode {
                missing: true,
                wp: false,
            },
        )?;
        // The lock window: pages that share a fault lock. Zero-filled 4 KiB
        // regions: the fault-around window (one lock per window mapped at
        // once). 4 KiB regions over a named object (a file): the largest
        // read-ahead window, so a read-ahead run needs one or two locks, not
        // one per page (with one per page, a concurrent read-ahead holds most
        // of the table and every try_lock fails: 3.6x fewer sequential reads
        // per second, docs/design.md); faults inside one window wait for each
        // other, as the kernel's do for pages of a read-ahead in flight.
        // Other stores (remote, slow: seed 003's case) and 2 MiB pages: the
        // page, so a slow fault holds up no other page.
        let window = match page {
            PageSize::Base4K if store.is_zero() => core.config.fault_around,
            PageSize::Base4K if store.identity().is_some() => core.config.readahead_max,
            PageSize::Base4K | PageSize::Huge2M => 1,
        };
        let store: Arc<dyn Store> = Arc::new(crate::store::Guarded(store));
        let inner = Arc::new(RegionInner::new(id, map, page, store, window));
        core.table.insert(Arc::clone(&inner));
        Ok(Region {
            inner,
            service: Arc::clone(&self.service),
        })
    }

    /// Current statistics.
    pub fn stats(&self) -> StatsSnapshot {
        let c = self.core();
        // Reserve frames are free memory that happens to be zeroed already.
        let reserve = c.reserve.lock().len() * crate::frame::PAGES_PER_HUGE;
        let mut snap = c
            .stats
            .snapshot(c.pool.pages(), c.alloc.free_pages() + reserve);
        snap.locks = c.locks.stat();
        snap.frames_prezeroed = reserve;
        snap
    }

    /// The oldest fault error not yet returned, if any (a fault that could not
    /// be served poisons its page and queues its cause here).
    pub fn take_error(&self) -> Option<FaultError> {
        self.core().take_error(|_| true)
    }

    /// Number of mapped regions.
    pub fn regions(&self) -> usize {
        self.core().table.len()
    }

    /// The range and page size of the region holding `addr`.
    pub fn region_at(&self, addr: usize) -> Result<(usize, usize, PageSize), AddrError> {
        self.core()
            .table
            .lookup_with(addr, |r| (r.start(), r.end(), r.page_size))
            .ok_or(AddrError::Foreign { addr })
    }

    /// Switches the region table's lookup cache (for experiments; lookups in
    /// flight finish with the old scheme, which is equally correct).
    pub fn set_lookup_cache(&self, cache: crate::region::table::LookupCache) {
        self.core().table.set_cache(cache);
    }

    /// The fault addresses recorded so far (with `Config::trace_faults`).
    pub fn fault_trace(&self) -> Vec<usize> {
        self.core().trace.lock().clone()
    }

    /// Number of frame pools (1 + `Config::extra_pools`).
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

/// A managed region. Its pages fault into faultline on first touch; dropping
/// it moves its frames back to the pool and unmaps it.
#[derive(Debug)]
pub struct Region {
    inner: Arc<RegionInner>,
    service: Arc<Service>,
}

impl Region {
    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.map.as_ptr()
    }

    /// Address of the first byte.
    pub fn addr(&self) -> usize {
        self.inner.start()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Page size.
    pub fn page_size(&self) -> PageSize {
        self.inner.page_size
    }

    /// The region's bytes. Reading an untouched page faults it in.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is valid for `len` bytes for as long as `self`
        // lives (it is unmapped only after teardown in drop), and faultline
        // only ever changes a page's content by filling a hole with the data
        // it logically holds (zeros, or the store's bytes), which a reader
        // cannot tell from the page having been there all along.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The region's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }

    /// Number of resident pages.
    pub fn resident_pages(&self) -> usize {
        self.inner.resident()
    }

    /// Whether the page at `addr` (page aligned, inside this region) is
    /// resident.
    pub fn is_resident(&self, addr: usize) -> Result<bool, AddrError> {
        if !self.inner.contains(addr) {
            return Err(AddrError::Foreign { addr });
        }
        if addr % self.inner.page_size.bytes() != 0 {
            return Err(AddrError::Unaligned {
                addr,
                page: self.inner.page_size.name(),
            });
        }
        Ok(matches!(
            self.inner.state(self.inner.page_of(addr)),
            PageState::Resident(_)
        ))
    }

    /// Maps the pages of bytes `range` of the region (offsets from its start;
    /// a range not inside the region is [`FaultError::BadRange`]) now, so
    /// that touching them does not fault:
    /// each absent page is filled (fault-around and read-ahead apply) and
    /// moved in from this thread. Returns how many pages were mapped; a page
    /// that cannot be (no frame, store error) is poisoned as a fault would
    /// be, and its error returned.
    pub fn prefetch(&self, range: std::ops::Range<usize>) -> Result<usize, FaultError> {
        let r = &self.inner;
        let core = &self.service.core;
        let ps = r.page_size.bytes();
        if range.start > range.end || range.end > self.len() {
            return Err(FaultError::BadRange {
                start: range.start,
                end: range.end,
                len: self.len(),
            });
        }
        let end = range.end;
        let mut mapped = 0;
        let mut offset = range.start - range.start % ps;
        while offset < end {
            let page = offset / ps;
            match service::prefetch_page(core, r, page) {
                service::Resolution::Moved => mapped += 1,
                service::Resolution::Poisoned => {
                    let addr = r.page_addr(page);
                    let err = core.take_error(|e| e.addr() == Some(addr)).unwrap_or(
                        FaultError::Inconsistent {
                            addr,
                            what: "prefetch poisoned the page without a recorded cause",
                        },
                    );
                    return Err(err);
                }
                _ => {}
            }
            offset += ps;
        }
        Ok(mapped)
    }

    /// The copy plan of the config: `migrate_copy`, `migrate_threads`,
    /// `migrate_chunk`.
    pub fn copy_plan(&self) -> CopyPlan {
        let c = &self.service.core.config;
        CopyPlan {
            method: c.migrate_copy,
            threads: c.migrate_threads,
            chunk: c.migrate_chunk,
        }
    }

    /// The page range covering bytes `range`, which must lie inside the
    /// region.
    fn page_range(
        &self,
        range: &std::ops::Range<usize>,
    ) -> Result<std::ops::Range<usize>, MigrateError> {
        if range.start > range.end || range.end > self.len() {
            return Err(MigrateError::OutOfRange {
                start: range.start,
                end: range.end,
            });
        }
        let ps = self.inner.page_size.bytes();
        Ok(range.start / ps..range.end.div_ceil(ps))
    }

    /// Moves the pages of bytes `range` (offsets, inside the region) that
    /// hold data — resident or parked — into frames of pool `pool`, while
    /// the application may keep using them: a touch during a page's move
    /// waits for it (DESIGN.md, "Migration"). Pages already there are left
    /// alone. A pool without room fails the batch (one 2 MiB block) that did
    /// not fit, before any of it moved; batches before it stay migrated.
    pub fn migrate(
        &self,
        range: std::ops::Range<usize>,
        pool: PoolId,
    ) -> Result<MigrateReport, MigrateError> {
        self.migrate_with(range, pool, self.copy_plan())
    }

    /// [`Region::migrate`] with an explicit copy plan (for experiments).
    pub fn migrate_with(
        &self,
        range: std::ops::Range<usize>,
        pool: PoolId,
        plan: CopyPlan,
    ) -> Result<MigrateReport, MigrateError> {
        let pages = self.page_range(&range)?;
        let plan = self.clamp(plan);
        crate::migrate::migrate(&self.service.core, &self.inner, pages, pool, plan)
    }

    /// Collapses every 2 MiB block of bytes `range` (rounded out to whole
    /// blocks, inside the region; a 4 KiB-page region) into one 2 MiB frame
    /// of pool 0, mapped as one huge page: each block's 512 pages must be
    /// resident (or parked). Returns what was done; blocks already in one
    /// frame are skipped.
    pub fn collapse(&self, range: std::ops::Range<usize>) -> Result<MigrateReport, MigrateError> {
        self.collapse_with(range, 0, self.copy_plan())
    }

    /// [`Region::collapse`] into pool `pool` with an explicit copy plan.
    pub fn collapse_with(
        &self,
        range: std::ops::Range<usize>,
        pool: PoolId,
        plan: CopyPlan,
    ) -> Result<MigrateReport, MigrateError> {
        let pages = self.page_range(&range)?;
        let plan = self.clamp(plan);
        let t0 = std::time::Instant::now();
        let mut report = MigrateReport::default();
        let per = crate::frame::PAGES_PER_HUGE;
        let mut first = pages.start / per * per;
        while first < pages.end {
            crate::migrate::collapse(
                &self.service.core,
                &self.inner,
                first,
                pool,
                plan,
                &mut report,
            )?;
            first += per;
        }
        report.total_ns = t0.elapsed().as_nanos() as u64;
        Ok(report)
    }

    fn clamp(&self, plan: CopyPlan) -> CopyPlan {
        let workers = self.service.core.config.workers;
        CopyPlan {
            threads: plan.threads.clamp(1, workers + 1),
            chunk: plan
                .chunk
                .next_power_of_two()
                .clamp(faultline_sys::PAGE_SIZE, faultline_sys::HUGE_PAGE_SIZE),
            ..plan
        }
    }

    /// The pool holding the page at byte `offset`, if the page holds data
    /// (resident or parked).
    pub fn pool_of(&self, offset: usize) -> Option<PoolId> {
        if offset >= self.len() {
            return None;
        }
        match self.inner.state(offset / self.inner.page_size.bytes()) {
            PageState::Resident(f) | PageState::Parked(f) => {
                Some(self.service.core.alloc.pool_of(f))
            }
            PageState::Absent | PageState::Poisoned | PageState::Gone => None,
        }
    }

    /// The oldest queued fault error concerning this region, if any.
    pub fn take_error(&self) -> Option<FaultError> {
        let r = &self.inner;
        self.service
            .core
            .take_error(|e| e.addr().is_some_and(|a| r.contains(a)))
    }

    /// Writes every dirty page back to the region's store, then makes the
    /// store durable (`fsync` for a file). A page is dirty when its bytes
    /// differ from the store's copy ([`crate::dirty`]); clean pages are not
    /// written. Regions whose store is not writable (zero-filled, read-only
    /// files) have nothing to write.
    ///
    /// Each page is written from its frame, taken out of the region for the
    /// copy: the store gets the page as it was at one instant, never a torn
    /// mix; a write racing with the flush waits for it, and lands either in
    /// what is written or in the page that stays dirty. A page that cannot
    /// be written stays dirty (and in memory); the others are still
    /// written, and the first error is returned. A later flush tries the
    /// failed pages again.
    pub fn flush(&self) -> Result<(), StoreError> {
        let r = &self.inner;
        if !r.store.writable() {
            return Ok(());
        }
        self.write_back()?;
        r.store.flush()
    }

    /// Flushes the region and unmaps it, returning the flush's result. On
    /// failure the region is handed back, unchanged and still mapped, with
    /// the error: its dirty pages are still in memory, so the caller can
    /// free space (or let the store recover) and close again. Dropping a
    /// region also writes back, but can only queue its error
    /// ([`Manager::take_error`]) and then lets the pages go.
    pub fn close(self) -> Result<(), (Region, StoreError)> {
        match self.flush() {
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }

    /// Writes every dirty page back. A resident page is written from its
    /// frame: parked first (moved out of the region, so no thread can write
    /// it during the copy: the store gets the page as it was at one instant,
    /// never a torn mix), written, and moved back in. This also reaches
    /// pages the kernel swapped out (the move takes the swap entry) and
    /// pages the program made unreadable (`mprotect`): those cannot be moved
    /// and are reported, not faulted on. A page that fails stays dirty;
    /// the others are still written, and the first error is returned.
    fn write_back(&self) -> Result<(), StoreError> {
        self.write_back_within(None)
    }

    /// [`Region::write_back`]; with `limit`, a page whose lock stays held
    /// longer (a worker stuck in the store) is skipped and reported.
    fn write_back_within(&self, limit: Option<std::time::Duration>) -> Result<(), StoreError> {
        let r = &self.inner;
        let core = &self.service.core;
        let mut first_err = None;
        for page in 0..r.pages() {
            if matches!(
                r.state(page),
                PageState::Absent | PageState::Poisoned | PageState::Gone
            ) {
                continue;
            }
            let (domain, key) = r.lock_key(page);
            let guard = match limit {
                None => Some(core.locks.lock(domain, key)),
                Some(limit) => core.locks.lock_within(domain, key, limit),
            };
            let Some(_g) = guard else {
                first_err.get_or_insert(StoreError::Unreadable {
                    page: page as u64,
                    source: SysError {
                        op: "fault lock",
                        addr: r.page_addr(page),
                        len: r.page_size.bytes(),
                        errno: libc::ETIMEDOUT,
                    },
                });
                continue;
            };
            let (f, resident) = match r.state(page) {
                PageState::Absent | PageState::Poisoned | PageState::Gone => continue,
                PageState::Resident(f) => (f, true),
                PageState::Parked(f) => (f, false),
            };
            if resident {
                if let Err(e) = pagemove::park(core, r, page, f) {
                    // Not moved out (e.g. mprotect'ed): the page stays
                    // resident and dirty.
                    first_err.get_or_insert(unparkable(r, page, e));
                    continue;
                }
            }
            let mut frame = Frame::from_parts(f, r.page_size.order());
            // SAFETY: a parked frame belongs to its page, whose lock we hold;
            // it is whole in its slot and nobody else touches it.
            let bytes = unsafe { core.pool.bytes_mut(&mut frame) };
            if let Err(e) = self.put(page, bytes) {
                first_err.get_or_insert(e);
            }
            if resident {
                service::unpark(core, r, page, f);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Writes `bytes`, the content of `page`, to the store unless they are
    /// the store's already. Caller holds the page's lock.
    fn put(&self, page: usize, bytes: &[u8]) -> Result<(), StoreError> {
        let r = &self.inner;
        let stats = &self.service.core.stats;
        let fp = crate::dirty::fingerprint(bytes);
        if r.fps.as_ref().and_then(|f| f.get(page)) == Some(fp) {
            Stats::bump(&stats.clean_skipped);
            return Ok(());
        }
        r.store.write(page as u64, bytes)?;
        if let Some(f) = &r.fps {
            f.set(page, Some(fp));
        }
        Stats::bump(&stats.written_back);
        Ok(())
    }

    fn teardown(&self) {
        let core = &self.service.core;
        let r = &self.inner;
        // Write back before the frames go: a region's data outlives it in its
        // store. An error cannot be returned from drop; it is queued.
        if r.store.writable() {
            if let Err(e) = self
                .write_back_within(Some(SHUTDOWN_WAIT))
                .and_then(|()| r.store.flush())
            {
                core.record(FaultError::Store {
                    addr: r.start(),
                    source: e,
                });
            }
        }
        core.await_unmaps();
        core.table.remove(r.id);
        core.objects.lock().retain(|u| u.region != r.id);
        r.set_dying();
        // Only the parts still ours: a part the program unmapped may hold
        // someone else's mapping now.
        for (s, e) in r.map.live_ranges() {
            if let Err(err) = core.uffd.unregister(s, e - s) {
                core.record(FaultError::Move {
                    addr: s,
                    source: err,
                });
            }
        }
        let order = r.page_size.order();
        let unit = r.page_size.bytes();
        let per_unit = (unit / faultline_sys::PAGE_SIZE) as u32;
        let mut freed: Vec<Frame> = Vec::new();
        let mut next = 0;
        while next < r.pages() {
            let w = r.window(next);
            next = w.end;
            if !w
                .clone()
                .any(|p| matches!(r.state(p), PageState::Resident(_) | PageState::Parked(_)))
            {
                continue;
            }
            // The window's locks (one, unless a file offset not aligned to
            // the window splits it between two file windows).
            let mut idx: Vec<usize> = w
                .clone()
                .map(|p| {
                    let (domain, key) = r.lock_key(p);
                    core.locks.index(domain, key)
                })
                .collect();
            let Some(_g) = core.locks.lock_all_within(&mut idx, SHUTDOWN_WAIT) else {
                // A worker holds it, stuck in a store call: leave the
                // window's frames (they leak) rather than hang the drop.
                core.record(FaultError::Inconsistent {
                    addr: r.page_addr(w.start),
                    what: "a fault lock stayed held through teardown (a store call that does not return?); its pages' frames are leaked",
                });
                continue;
            };
            // Runs of resident pages backed by consecutive frames (a
            // fault-around run) go back with one UFFDIO_MOVE.
            let mut p = w.start;
            while p < w.end {
                let f = match r.state(p) {
                    PageState::Resident(f) => f,
                    PageState::Parked(f) => {
                        // Its data is in its frame, in its slot: just free it.
                        let frame = Frame::from_parts(f, order);
                        core.pool.set_zeroed(&frame, false);
                        r.set_state(p, PageState::Absent);
                        freed.push(frame);
                        p += 1;
                        continue;
                    }
                    PageState::Absent | PageState::Poisoned | PageState::Gone => {
                        p += 1;
                        continue;
                    }
                };
                let mut n = 1;
                while p + n < w.end
                    && r.state(p + n) == PageState::Resident(f + n as u32 * per_unit)
                {
                    n += 1;
                }
                let slot = core.pool.slot_addr(f);
                // SAFETY: `slot..+n*unit` are the holes these frames left in
                // the pool and the region pages are resident; after
                // unregistering, nothing but this teardown (holding the window
                // lock) changes either.
                let whole = unsafe { pagemove::move_out(core, slot, r.page_addr(p), n * unit) };
                for i in 0..n {
                    let frame = Frame::from_parts(f + i as u32 * per_unit, order);
                    if whole.is_err() {
                        self.move_back_one(&frame, r.page_addr(p + i));
                    }
                    core.pool.set_zeroed(&frame, false);
                    r.set_state(p + i, PageState::Absent);
                    freed.push(frame);
                }
                core.stats
                    .unmapped_pages
                    .fetch_add(n as u64, Ordering::Relaxed);
                p += n;
            }
        }
        core.alloc.free_bulk(&mut freed);
    }
}

impl Region {
    /// Moves one resident page back to its frame's slot after a run move
    /// did not complete, skipping 4 KiB pages the program dropped; whatever
    /// happens, the slot ends up populated (the frame is about to be freed).
    fn move_back_one(&self, frame: &Frame, page_addr: usize) {
        let core = &self.service.core;
        let slot = core.pool.addr_of(frame);
        // SAFETY: as in `teardown`: the slot holds whatever of the frame is
        // not in the region, and the region page is ours, under its lock.
        let moved = unsafe {
            pagemove::move_range(core, slot, page_addr, frame.bytes(), Holes::Allow, false)
        };
        if let Err(e) = moved {
            core.record(FaultError::Move {
                addr: page_addr,
                source: e.into_sys(page_addr, frame.bytes()),
            });
        }
        if let Err(e) = pagemove::fill_holes(core, slot, frame.bytes()) {
            core.record(FaultError::Move {
                addr: slot,
                source: e,
            });
        }
    }
}

/// The write-back error for `page`, which could not be taken out of the
/// region: `park` fails with the refused move, or with the store's error
/// while refilling a part the program dropped.
fn unparkable(r: &RegionInner, page: usize, e: FaultError) -> StoreError {
    let source = match e {
        FaultError::Store { source, .. } => return source,
        FaultError::Move { source, .. } => source,
        _ => SysError {
            op: "UFFDIO_MOVE",
            addr: r.page_addr(page),
            len: r.page_size.bytes(),
            errno: libc::EIO,
        },
    };
    StoreError::Unreadable {
        page: page as u64,
        source,
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if !self.service.core.in_owner() {
            // A child of fork(): the region's range is not in the child
            // (`MADV_DONTFORK`), and every teardown step — write-back,
            // unregister, moving pages out — would act on the parent's
            // address space through the shared userfaultfd. Forget it.
            return;
        }
        self.teardown();
    }
}
