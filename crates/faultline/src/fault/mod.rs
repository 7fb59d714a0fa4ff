//! The fault service: worker threads that read userfaultfd events and
//! resolve each missing-page fault by moving a filled pool frame into place.
//!
//! One fault, in order (file: function):
//! `service.rs: run_worker` reads the event → `service.rs: handle` looks up
//! the region (`region/table.rs: lookup`) and takes the page's fault lock
//! (`locks.rs`) → `resolve.rs: resolve` dispatches on the page's state →
//! `unit.rs: take` chooses the unit (page, fault-around window, read-ahead
//! run) and takes its frame (`reclaim.rs: alloc`, reclaiming if none is
//! free) → `resolve.rs: fill_unit` (`fill.rs: fill`: zeros in the
//! configured order, or the store's bytes) → `resolve.rs: map_in` records
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
//! region) is served by the others, and if every worker is inside a store
//! call the standby worker serves faults until one returns
//! ([`service::run_standby`]).
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
mod remove;
mod reread;
mod resolve;
pub(crate) mod service;
mod unit;
pub(crate) mod unmap;

pub(crate) use resolve::prefetch_page;

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
