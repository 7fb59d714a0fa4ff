//! The fault service: worker threads that read userfaultfd events and
//! resolve each missing-page fault by moving a filled pool frame into place.
//!
//! One fault, in order (file: function):
//! `service.rs: run_worker` reads the event → `service.rs: handle` looks up
//! the region (`region/table.rs: lookup`) and takes the page's fault lock
//! (`locks.rs`) → `resolve.rs: resolve` dispatches on the page's state →
//! `unit.rs: take` chooses the unit (page, fault-around window, read-ahead
//! run) and takes its frame (`reclaim.rs: alloc`, reclaiming if none is
//! free) → `unit.rs: fill_frame` (`fill.rs: fill_zeros` in the configured
//! order, or `fill_from_store`: the store's bytes, each page fingerprinted
//! as the store hands it over) → `resolve.rs: map_in` records
//! the pages resident and moves the frame in (`pagemove: move_in`, which
//! wakes the faulting threads) → unlock.
//!
//! Intake is never held up by a slow fault: before a worker does anything
//! that may block (a store read, or waiting for a page lock another worker
//! holds), it hands the rest of its batch to the core's deferred queue.
//! Workers are pinned one per CPU and block in `epoll_wait` on the
//! userfaultfd, the deferred queue's eventfd and a shutdown eventfd. An idle
//! worker (no event to read) helps with an offered migration copy, one piece
//! at a time, checking for faults between pieces. Workers never touch region
//! memory, so they never fault themselves; a store that does (reads another
//! region) is served by the others, and while every worker is inside a
//! store-backed fault the spare servers serve faults, in rank order
//! ([`service::run_spare`]): the same rule keeps a slow store's reads in
//! flight many at once.
//!
//! With [`crate::FaultMode::InThread`] the faulting thread serves its own
//! fault in faultline's SIGBUS handler ([`inthread`]), through the same
//! `resolve`; the workers then only read the other events (unmaps,
//! removals).
//!
//! Errors of the fault path are [`crate::FaultError`] values queued in the
//! core; the faulting thread itself gets SIGBUS.

pub(crate) mod ahead;
pub(crate) mod inthread;
mod offers;
mod prefetch;
mod program_drop;
mod protect;
mod reread;
mod resolve;
pub(crate) mod service;
mod unit;
pub(crate) mod unmap;

pub(crate) use prefetch::prefetch_page;

/// What happened to one fault event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// A frame was filled and moved into place.
    Moved,
    /// The page was already mapped; the faulting threads were woken.
    AlreadyMapped,
    /// The region is being torn down; the faulting threads were woken.
    Dying,
    /// The page was poisoned; its threads get SIGBUS.
    Poisoned,
    /// No region holds the address.
    Stray,
    /// Not served now: the page's lock is held by a thread stopped in a
    /// store call; the event went back on the deferred queue (or, for a
    /// nested fault that could not be served, the thread was woken to retry).
    Retry,
}

/// How one fault is being served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fault {
    /// The faulting address.
    pub(crate) addr: usize,
    /// Positive after a move that kept failing with `EAGAIN`/`EBUSY`, and
    /// for a lent serve: the page alone (no fault-around, no read-ahead),
    /// another frame.
    pub(crate) attempt: u32,
    /// Served under the lock of the stopped thread that faulted
    /// (`nesting.rs`): this server holds no lock, so reclaim must not step
    /// pages as if it did.
    pub(crate) lent: bool,
    /// The faulting thread is inside a store call (a faultline thread):
    /// never poisoned — a SIGBUS there would kill the process — but woken to
    /// retry, with the cause queued.
    pub(crate) nested: bool,
    /// A read-ahead window mapped ahead of its stream ([`ahead`]):
    /// nobody waits for it, so a failure is dropped (the page stays absent,
    /// nothing is poisoned or queued), no frame is reclaimed for it, and it
    /// offers no window of its own.
    pub(crate) ahead: bool,
    /// The access was a write (as far as the kernel said: a read is
    /// assumed where it did not). Such a fill is never write-protected.
    pub(crate) write: bool,
    /// The access will change the page: a write fault (not a prefetch,
    /// which maps writable for writes that may never come), or a window a
    /// stream of write faults offered ([`ahead`]). Its fill takes no
    /// fingerprint of the store's copy ([`crate::dirty`]): the page is
    /// dirty from its fill, and write-back needs no hash to know it.
    pub(crate) dirties: bool,
    /// A write to a page mapped write-protected
    /// ([`crate::FillModel::CopyProtected`]): the protection is lifted,
    /// nothing is filled.
    pub(crate) protection: bool,
}

impl Fault {
    /// A fault at `addr` from an application thread.
    pub(crate) fn at(addr: usize) -> Fault {
        Fault {
            addr,
            attempt: 0,
            lent: false,
            nested: false,
            ahead: false,
            write: false,
            dirties: false,
            protection: false,
        }
    }
}

/// Takes fault lock `idx`, unless its holder is a thread stopped inside a
/// store call (a lender): waiting for it could wait for the very fault
/// this server would serve next. Checked every 10 ms of waiting.
fn lock_unless_lent(core: &crate::core::Core, idx: usize) -> Option<crate::locks::FaultGuard<'_>> {
    core.locks
        .lock_index_unless(idx, std::time::Duration::from_millis(10), |owner| {
            core.nesting.is_lending(owner)
        })
}
