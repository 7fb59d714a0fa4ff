//! The core: the state every worker and handle shares — the userfaultfd,
//! the frame pool and its allocator, the region table, the fault locks, the
//! stats, the error queue, the event intake bookkeeping and the registry of
//! mapped objects. It owns no policy: filling, moving, reclaiming and
//! migrating pages are the modules above it, which take a `&Core`.
//!
//! Invariants: `uffd` is declared (so dropped) before `pool` (see the
//! field); `unmaps_pending` counts unmap events read and not yet handled;
//! region ids grow monotonically (`next_id`), so an event's stamp tells
//! which regions were mapped after it was read.
//!
//! Locks: `errors`, `deferred`, `worker_tids`, `reserve`, `trace`,
//! `copy_jobs`, `hand` and the `kick`'s mutex are leaf mutexes (nothing
//! else is taken while one is held); `objects` is `objects.rs`'s.

use crate::config::Config;
use crate::copyjob::CopyJob;
use crate::dirty::Fingerprints;
use crate::drop_rechecks::DropRechecks;
use crate::error::FaultError;
use crate::frame::{Balloon, Frame, FrameAllocator, FramePools, Pool};
use crate::locks::FaultLocks;
use crate::nesting::Nesting;
use crate::objects::Objects;
use crate::own_discards::OwnDiscards;
use crate::region::{OverheadSum, RegionTable};
use crate::stats::Stats;
use faultline_sys::mem::PageMap;
use faultline_sys::uffd::{Event, EventFd, Uffd};
use faultline_sys::SysError;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// At most this many fault errors are queued; older ones are dropped (and
/// still counted in the stats).
const ERROR_QUEUE: usize = 1024;

/// Causes of recent errors kept for the in-thread handler's message
/// ([`Core::describe_error`]), whether or not the queue still has them.
const RECENT_CAUSES: usize = 16;

/// An event as read, with [`Core::region_stamp`] at the time it was read:
/// regions with that id or a higher one were mapped after the event was
/// read (an unmap event concerns none of them).
pub(crate) type Queued = (Event, u64);

/// Where the reclaim clock's hand stands: the start address of a region
/// and a page (see `reclaim`).
#[derive(Debug, Default)]
pub(crate) struct Hand {
    pub(crate) region_start: usize,
    pub(crate) page: usize,
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
    /// The pool's context (no events; declared before `pool` too): moves
    /// into pool slots and fills of their holes go through it
    /// ([`Core::uffd_into`]).
    pub(crate) pool_uffd: Uffd,
    pub(crate) pool: Pool,
    pub(crate) alloc: FramePools,
    /// Frames of pool 0 given back to the kernel (`budget.rs`).
    pub(crate) balloon: Balloon,
    pub(crate) table: RegionTable,
    /// Fingerprints of the pages in frames, by frame (`dirty`), shared by
    /// the regions of writable stores.
    pub(crate) fps: Arc<Fingerprints>,
    pub(crate) locks: FaultLocks,
    pub(crate) stats: Stats,
    /// This process's page tables, read by the page-move protocol
    /// ([`crate::pagemove`]).
    pub(crate) pagemap: PageMap,
    /// The process that built the manager. A child of `fork()` has copies of
    /// every handle but none of the threads, and shares the userfaultfd and
    /// the shutdown eventfd with this process (ioctls on the userfaultfd act
    /// on *this* process's address space): in a child, dropping a handle
    /// must do nothing but forget it ([`Core::in_owner`]).
    pid: u32,
    errors: Mutex<VecDeque<FaultError>>,
    /// Signalled when an error is queued ([`Core::wait_error`]).
    errors_cv: parking_lot::Condvar,
    /// The newest errors that name an address, as `(address, text)`: a
    /// program (or the Python binding's watcher) may take an error off the
    /// queue before the poisoned access's SIGBUS asks for its cause. A
    /// leaf lock.
    causes: Mutex<VecDeque<(usize, String)>>,
    /// The object ranges mapped by live regions (taken at map and
    /// teardown; the process-wide file registry is taken under it).
    pub(crate) objects: Objects,
    /// Unmap events read but not yet handled (see [`Core::await_unmaps`]).
    unmaps_pending: AtomicUsize,
    /// Threads inside [`Core::read_events`] (their unmap events are not
    /// counted in `unmaps_pending` yet).
    readers: AtomicUsize,
    next_id: AtomicU64,
    /// Events handed off by a worker about to block; see `fault::service`.
    pub(crate) deferred: Mutex<VecDeque<Queued>>,
    /// Signalled when `deferred` gets events.
    pub(crate) deferred_fd: EventFd,
    /// Read-ahead windows offered to idle workers (`fault::ahead`).
    pub(crate) ahead: Mutex<VecDeque<Ahead>>,
    /// Kernel thread ids of the workers (a fault from one is a bug).
    pub(crate) worker_tids: Mutex<Vec<u32>>,
    /// Zeroed 2 MiB frames ready for faults (filled by the zeroing worker).
    pub(crate) reserve: Mutex<Vec<Frame>>,
    /// Wakes the zeroing worker (a frame was taken, or shutdown).
    pub(crate) reserve_cv: parking_lot::Condvar,
    /// The zeroing worker holds a frame it has not put in `reserve` yet.
    pub(crate) zeroing: AtomicBool,
    /// Wakes the background reclaimer early (`crate::kick`).
    pub(crate) kick: crate::kick::Kick,
    /// Reclaim passes running now (`reclaim::reclaim`): a fault that finds
    /// no frame waits for them rather than being refused.
    pub(crate) reclaiming: AtomicUsize,
    stopping: AtomicBool,
    /// Nested faults and spare servers: lenders, who is busy, the spares'
    /// duty (`nesting.rs`).
    pub(crate) nesting: Nesting,
    /// faultline's own `MADV_DONTNEED` calls on registered memory, told
    /// apart from the program's (`own_discards.rs`).
    pub(crate) own_discards: OwnDiscards,
    /// Second looks of the program's removals (`drop_rechecks.rs`).
    pub(crate) drop_rechecks: DropRechecks,
    /// When the next sweep for unheard drops may run (`reclaim/unheard.rs`).
    pub(crate) sweeps: crate::drop_rechecks::Sweeps,
    /// Poisoned pages to give another try (`rereads.rs`).
    pub(crate) rereads: crate::rereads::Rereads,
    /// Fault addresses, when `config.experiment.trace_faults > 0`.
    pub(crate) trace: Mutex<Vec<usize>>,
    /// The reclaim clock's hand.
    pub(crate) hand: Mutex<Hand>,
    /// Migration copies offered to idle workers (see `migrate`).
    pub(crate) copy_jobs: Mutex<Vec<Arc<CopyJob>>>,
    /// Number of offered copies; workers look at the list only when > 0.
    pub(crate) copy_pending: AtomicUsize,
    /// What the page tables and page states of every region alive cost
    /// (kept by the regions as they grow; read by `overhead.rs`).
    pub(crate) overhead_sum: Arc<OverheadSum>,
    /// Pages of the budget withheld to pay for faultline's own memory
    /// (`overhead.rs`); changed only under `budget_lock`.
    pub(crate) overhead_withheld: AtomicUsize,
    /// Held while the budget's share of withheld frames changes
    /// (`Manager::set_budget`'s balloon moves, `overhead.rs`) and by the
    /// stats to read it. Order: a fault lock, then this, then the ledger
    /// and the allocator's locks; its holders never take a fault lock,
    /// call a store or wait for a fault.
    pub(crate) budget_lock: Mutex<()>,
}

/// A read-ahead window offered to the workers (`fault::ahead`): its first
/// page's address, its region's id (the address may be another region's
/// by the time a worker looks), and whether the stream that offered it
/// writes (its fault was a write: the window is filled without
/// fingerprints, as that fault's own pages were).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ahead {
    pub(crate) addr: usize,
    pub(crate) region: u64,
    pub(crate) dirties: bool,
}

impl Core {
    /// A core over the parts `build()` made (in the order that keeps an
    /// error return from hanging: see the `uffd` field).
    pub(crate) fn new(
        config: Config,
        (uffd, pool_uffd): (Uffd, Uffd),
        pool: Pool,
        alloc: FramePools,
        pagemap: PageMap,
        deferred_fd: EventFd,
    ) -> Core {
        Core {
            locks: FaultLocks::new(config.experiment.locks, config.lock_table()),
            // One service-time histogram per worker and one more (in-thread
            // faults); spares record into these by index, modulo.
            stats: Stats::new(config.workers + 1),
            pagemap,
            pid: faultline_sys::host::process_id(),
            table: RegionTable::new(config.experiment.lookup_cache),
            fps: Arc::new(Fingerprints::new(pool.pages())),
            errors: Mutex::new(VecDeque::new()),
            errors_cv: parking_lot::Condvar::new(),
            causes: Mutex::new(VecDeque::new()),
            objects: Objects::default(),
            unmaps_pending: AtomicUsize::new(0),
            readers: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            deferred: Mutex::new(VecDeque::new()),
            deferred_fd,
            ahead: Mutex::new(VecDeque::new()),
            worker_tids: Mutex::new(Vec::new()),
            reserve: Mutex::new(Vec::new()),
            reserve_cv: parking_lot::Condvar::new(),
            zeroing: AtomicBool::new(false),
            kick: crate::kick::Kick::default(),
            reclaiming: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            nesting: Nesting::new(config.workers, config.spare_servers),
            own_discards: OwnDiscards::new(config.hears_removals()),
            drop_rechecks: DropRechecks::default(),
            sweeps: crate::drop_rechecks::Sweeps::default(),
            rereads: crate::rereads::Rereads::default(),
            trace: Mutex::new(Vec::new()),
            hand: Mutex::new(Hand::default()),
            copy_jobs: Mutex::new(Vec::new()),
            copy_pending: AtomicUsize::new(0),
            overhead_sum: Arc::default(),
            overhead_withheld: AtomicUsize::new(0),
            budget_lock: Mutex::new(()),
            config,
            uffd,
            pool_uffd,
            pool,
            balloon: {
                // The parts not populated at build (room to grow) start
                // out withheld.
                let b = Balloon::default();
                b.ledger().put(alloc.take_unpopulated(), true);
                b
            },
            alloc,
        }
    }

    /// A new region id. AcqRel pairs with the Acquire load in
    /// [`Core::region_stamp`].
    pub(crate) fn next_region_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::AcqRel)
    }

    /// Starts shutdown: background threads see [`Core::is_stopping`].
    /// Release pairs with its Acquire load.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.reserve_cv.notify_all();
        self.kick.wake();
        self.nesting.wake_spares();
        self.own_discards.stop();
    }

    /// Gives the pre-zeroed reserve back to the allocator (at shutdown, or
    /// when memory is short); returns how many frames it held.
    pub(crate) fn drain_reserve(&self) -> usize {
        let mut back: Vec<Frame> = std::mem::take(&mut *self.reserve.lock());
        let n = back.len();
        if n > 0 {
            self.alloc.free_bulk(&mut back);
        }
        n
    }

    /// Waits (up to 1 s: the worker runs at the lowest priority) while the
    /// zeroing worker holds a frame it has not published; returns whether it
    /// held one. Acquire pairs with the Release store in `fill::run_zeroer`
    /// (the frame is in `reserve` by then).
    pub(crate) fn await_zeroing(&self) -> bool {
        if !self.zeroing.load(Ordering::Acquire) {
            return false;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while self.zeroing.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        true
    }

    /// The context an ioctl placing pages at `dst` is issued on: a move or
    /// copy needs its destination registered with that context — pool
    /// slots with `pool_uffd`, regions with `uffd`.
    pub(crate) fn uffd_into(&self, dst: usize) -> &Uffd {
        if self.pool.contains(dst) {
            &self.pool_uffd
        } else {
            &self.uffd
        }
    }

    /// Wakes the threads waiting on `[addr, addr + len)`; a failure (a bug:
    /// the range is registered) is recorded.
    pub(crate) fn wake(&self, addr: usize, len: usize) {
        if let Err(e) = self.uffd.wake(addr, len) {
            self.record(FaultError::Move { addr, source: e });
        }
    }
    /// A pre-zeroed 2 MiB frame, if the reserve has one.
    pub(crate) fn take_prezeroed(&self) -> Option<Frame> {
        let f = self.reserve.lock().pop();
        if f.is_some() {
            self.reserve_cv.notify_one();
        }
        f
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
        out: &mut Vec<Event>,
        max: usize,
    ) -> Result<(usize, u64), SysError> {
        let stamp = self.region_stamp();
        // AcqRel: pairs with the Acquire loads in `await_unmaps`.
        self.readers.fetch_add(1, Ordering::AcqRel);
        let before = out.len();
        let r = self.uffd.read_events(out, max);
        let unmaps = out[before..]
            .iter()
            .filter(|e| matches!(e, Event::Unmap { .. }))
            .count();
        if unmaps > 0 {
            self.unmaps_pending.fetch_add(unmaps, Ordering::AcqRel);
        }
        self.readers.fetch_sub(1, Ordering::AcqRel);
        r.map(|n| (n, stamp))
    }

    /// Marks one unmap event handled. AcqRel (its Release half pairs with
    /// the Acquire load in [`Core::await_unmaps`]): the region's gone ranges
    /// are recorded first.
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
    /// a region with this id or higher was mapped after the events' unmaps.
    /// Acquire pairs with the increment in [`Core::next_region_id`] (AcqRel).
    pub(crate) fn region_stamp(&self) -> u64 {
        self.next_id.load(Ordering::Acquire)
    }

    /// Whether the manager is shutting down (set before the workers'
    /// shutdown eventfd is signalled). Acquire pairs with the Release store
    /// in [`Core::stop`].
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
        if let Some(addr) = e.addr() {
            let mut c = self.causes.lock();
            if c.len() == RECENT_CAUSES {
                c.pop_front();
            }
            c.push_back((addr, e.to_string()));
        }
        let mut q = self.errors.lock();
        if q.len() == ERROR_QUEUE {
            q.pop_front();
            Stats::bump(&self.stats.errors_dropped);
        }
        q.push_back(e);
        self.errors_cv.notify_all();
    }

    /// Removes and returns the oldest queued error that `pick` accepts.
    pub(crate) fn take_error(&self, pick: impl Fn(&FaultError) -> bool) -> Option<FaultError> {
        let mut q = self.errors.lock();
        let i = q.iter().position(pick)?;
        q.remove(i)
    }

    /// The newest recent error about an address in `[start, end)`,
    /// formatted (whether or not it is still queued).
    pub(crate) fn describe_error(&self, start: usize, end: usize) -> Option<String> {
        let c = self.causes.lock();
        c.iter()
            .rev()
            .find(|(a, _)| (start..end).contains(a))
            .map(|(_, text)| text.clone())
    }

    /// [`Core::take_error`], waiting up to `timeout` for one to be queued.
    pub(crate) fn wait_error(
        &self,
        pick: impl Fn(&FaultError) -> bool,
        timeout: std::time::Duration,
    ) -> Option<FaultError> {
        let deadline = std::time::Instant::now() + timeout;
        let mut q = self.errors.lock();
        loop {
            if let Some(i) = q.iter().position(&pick) {
                return q.remove(i);
            }
            if self.errors_cv.wait_until(&mut q, deadline).timed_out() {
                return None;
            }
        }
    }
}
