//! Faults served in the faulting thread ([`crate::FaultMode::InThread`]).
//! The manager's userfaultfd has `UFFD_FEATURE_SIGBUS`, so a missing-page
//! fault raises SIGBUS in the thread that touched the page; faultline's
//! handler finds the manager whose region holds the address, serves the
//! fault right there (the page's lock, a frame, its fill, `UFFDIO_MOVE`:
//! [`super::resolve`], as a worker would) and returns, and the access
//! retries. A SIGBUS that is not such a fault (a poisoned page, a file
//! mapping past its end, an address no manager holds) goes on to the
//! action installed before faultline's.
//!
//! Why the handler may take locks and allocate: the signal is synchronous,
//! raised by an access to region memory, and no code holding a faultline
//! lock or inside `malloc` touches region memory (workers never do; the
//! API's copies take no lock). A store that reads another faultline region
//! faults inside the handler (`SA_NODEFER`): if that page's lock is the
//! thread's own (a hashed lock it holds), the nested fault is served under
//! it. `errno` is kept across the handler.
//!
//! A thread that blocks SIGBUS cannot be served here: the kernel forces
//! the signal with the default action ([`ready`]), so `build` and `map`
//! refuse such a calling thread and faultline's own threads unblock it.
//!
//! The registry: a fixed table of slots, each holding a leaked
//! `Arc<Core>` and a count of handlers using it. A handler counts itself
//! in, then loads the pointer; unregistering clears the pointer, then
//! waits for the count to drain before releasing the `Arc` (both sides
//! SeqCst: whichever comes first in the single order, the other sees it).
//! No locks of its own.

use super::resolve::resolve;
use super::Fault;
use super::Resolution;
use crate::core::Core;
use crate::error::BuildError;
use faultline_sys::signal::{self, BusInfo, SavedErrno};
use std::borrow::Cow;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// In-thread managers per process at once.
const SLOTS: usize = 64;

struct Slot {
    core: AtomicPtr<Core>,
    users: AtomicUsize,
}

static SLOTS_TABLE: [Slot; SLOTS] = [const {
    Slot {
        core: AtomicPtr::new(std::ptr::null_mut()),
        users: AtomicUsize::new(0),
    }
}; SLOTS];

/// Whether faults served in the faulting thread
/// ([`crate::FaultMode::InThread`]) can reach faultline from the calling
/// thread: `Ok` when this thread does not block SIGBUS and faultline's
/// handler (if installed yet) is still the process's SIGBUS action.
///
/// A thread that blocks SIGBUS (`pthread_sigmask`, as C servers' worker
/// threads often do with every signal) cannot take in-thread faults: the
/// kernel forces a fault's SIGBUS on it — unblocking the signal and
/// resetting the process's action to the default — so the process dies
/// (`Bus error`, exit status 135) before any handler can say why.
/// `Manager::build` and `Manager::map` of an in-thread manager refuse a
/// calling thread that blocks SIGBUS; a thread that touches region memory
/// it did not map can call this first. faultline's own threads unblock
/// SIGBUS when they start.
///
/// # Errors
/// [`BuildError::SigbusBlocked`] when this thread blocks SIGBUS;
/// [`BuildError::SigbusTaken`] when another handler replaced faultline's;
/// [`BuildError::Sys`] if the signal mask cannot be read.
pub fn ready() -> Result<(), BuildError> {
    if signal::sigbus_blocked()? {
        return Err(BuildError::SigbusBlocked);
    }
    if signal::sigbus_installed() && !signal::sigbus_is(on_sigbus)? {
        return Err(BuildError::SigbusTaken);
    }
    Ok(())
}

/// A manager's place in the registry; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Registration(usize);

/// Installs the handler (once per process) and registers `core`.
///
/// # Errors
/// The `sigaction` error; `ENOSPC` when [`SLOTS`] in-thread managers exist
/// already; [`BuildError::SigbusTaken`] when another handler replaced
/// faultline's after it was installed.
pub(crate) fn register(core: &Arc<Core>) -> Result<Registration, BuildError> {
    signal::install_sigbus(on_sigbus)?;
    if !signal::sigbus_is(on_sigbus)? {
        return Err(BuildError::SigbusTaken);
    }
    let raw = Arc::into_raw(Arc::clone(core)).cast_mut();
    for (i, slot) in SLOTS_TABLE.iter().enumerate() {
        // SeqCst: see the module doc.
        if slot
            .core
            .compare_exchange(std::ptr::null_mut(), raw, SeqCst, SeqCst)
            .is_ok()
        {
            return Ok(Registration(i));
        }
    }
    // SAFETY: `raw` came from `Arc::into_raw` above and was not published.
    drop(unsafe { Arc::from_raw(raw) });
    Err(BuildError::Sys(faultline_sys::SysError {
        op: "register an in-thread manager",
        addr: 0,
        len: SLOTS,
        errno: libc::ENOSPC,
    }))
}

impl Drop for Registration {
    fn drop(&mut self) {
        let slot = &SLOTS_TABLE[self.0];
        // SeqCst: see the module doc; after this, no new handler uses it.
        let raw = slot.core.swap(std::ptr::null_mut(), SeqCst);
        while slot.users.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        if !raw.is_null() {
            // SAFETY: `raw` came from `Arc::into_raw` in `register`, and no
            // handler holds it any more (the count drained).
            drop(unsafe { Arc::from_raw(raw) });
        }
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let _errno = SavedErrno::save();
    // SAFETY: the kernel's siginfo for this SA_SIGINFO handler.
    let bus = unsafe { BusInfo::read(info, ctx) };
    // Nothing may unwind out of a signal handler.
    let served =
        bus.is_missing_page() && std::panic::catch_unwind(|| serve_any(&bus)).unwrap_or(false);
    if !served {
        // Only a signal the access raised: another may have interrupted
        // code holding the error queue's lock, or inside `malloc`.
        let why = bus
            .is_synchronous()
            .then(|| std::panic::catch_unwind(|| unserved(bus.addr)).ok())
            .flatten()
            .flatten();
        if let Some(why) = why {
            signal::report(b"faultline: SIGBUS at ", bus.addr, why.as_bytes());
        }
        // SAFETY: called from the SIGBUS handler with its arguments.
        unsafe { signal::pass_on(sig, info, ctx) };
    }
}

/// Runs `f` on each registered manager in turn, counted in while it runs,
/// until it returns `Some`.
fn find_core<T>(mut f: impl FnMut(&Core) -> Option<T>) -> Option<T> {
    SLOTS_TABLE.iter().find_map(|slot| {
        slot.users.fetch_add(1, SeqCst);
        let raw = slot.core.load(SeqCst);
        // SAFETY: a non-null pointer loaded after counting ourselves in is
        // a live `Arc<Core>` until the count drops (see the module doc).
        let found = (!raw.is_null()).then(|| f(unsafe { &*raw })).flatten();
        slot.users.fetch_sub(1, SeqCst);
        found
    })
}

/// Why a SIGBUS at `addr` that a registered manager's region holds was not
/// served (`None`: no manager holds it, the signal is not faultline's):
/// for a page the fault poisoned, the cause queued for it.
fn unserved(addr: usize) -> Option<Cow<'static, str>> {
    find_core(|core| {
        let r = core.table.lookup(addr)?;
        let page = r.page_of(addr);
        if r.state(page) != crate::region::PageState::Poisoned {
            return Some(Cow::Borrowed(
                ": a faultline region's page was not served in this thread \
                 (not a missing-page fault, or the region is going away); \
                 the signal goes on to the previous action",
            ));
        }
        let start = r.page_addr(page);
        let cause = core
            .describe_error(start, start + r.page_size.bytes())
            .unwrap_or_else(|| "its cause is no longer known".to_owned());
        Some(Cow::Owned(format!(
            ": a fault on a faultline region could not be served in this \
             thread ({cause}); the signal goes on to the previous action"
        )))
    })
}

/// Serves the fault `bus` reports if a registered manager holds it.
fn serve_any(bus: &BusInfo) -> bool {
    find_core(|core| serve(core, bus).then_some(())).is_some()
}

/// Serves the fault `bus` reports in this thread, if `core` has a region
/// there: false if it has none.
fn serve(core: &Core, bus: &BusInfo) -> bool {
    let addr = bus.addr;
    let Some(region) = core.table.lookup(addr) else {
        return false;
    };
    let page = region.page_of(addr);
    if region.state(page) == crate::region::PageState::Poisoned {
        // The retried access of a fault that was refused: the kernel
        // reports its poison marker as a missing page too, so the state
        // tells. The thread gets the SIGBUS; a worker clears the marker
        // once its back-off is over (`reread.rs`), and the next access
        // faults afresh and tries the store again.
        return false;
    }
    if !bus.is_write_protect() {
        // A write-protect fault is counted when it lifts the protection.
        super::service::count_fault(core, region.page_size);
    }
    let t0 = Instant::now();
    let me = crate::locks::this_thread();
    let (domain, key) = region.lock_key(page);
    let idx = core.locks.index(domain, key);
    // None: the lock is this thread's own (a store read that faulted on a
    // page whose hashed lock the outer fault holds).
    let guard = core
        .locks
        .lock_index_unless(idx, Duration::from_millis(10), |owner| owner == me);
    // Counted once it holds the lock (see `service::handle`).
    let _serving = (!region.store.is_zero()).then(|| core.nesting.enter_serving());
    let how = Fault {
        addr,
        attempt: u32::from(guard.is_none()),
        lent: guard.is_none(),
        nested: core.nesting.is_lending(me),
        ahead: false,
        write: bus.is_write(),
        dirties: bus.is_write(),
        protection: bus.is_write_protect(),
    };
    let res = resolve(core, &region, page, &how);
    drop(guard);
    if res == Resolution::Dying {
        // Being torn down: let the teardown run before the access retries.
        std::thread::yield_now();
    }
    super::service::count(core, core.config.workers, res, t0);
    true
}
