//! Fault service: the worker threads that resolve faults ([`service`]) and
//! the locks that serialize them per page ([`locks`]).
//!
//! Errors of the fault path are [`FaultError`] values, queued by the manager
//! and returned by the next call that asks ([`crate::Manager::take_error`],
//! [`crate::Region::take_error`]); the faulting thread itself gets SIGBUS.

pub mod locks;
pub mod service;
pub(crate) mod unmap;

use crate::store::StoreError;
use faultline_sys::SysError;

pub use locks::FaultLocks;
pub use service::Resolution;

/// Why a fault could not be served (or went wrong).
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The pool had no free frame of the page's size.
    #[error("no free {page_size} frame for the page at {addr:#x}: the budget is exhausted")]
    NoFrame {
        /// Page address.
        addr: usize,
        /// `"4k"` or `"2m"`.
        page_size: &'static str,
    },
    /// The region's store could not supply the page.
    #[error("filling the page at {addr:#x} failed: {source}")]
    Store {
        /// Page address.
        addr: usize,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// An ioctl resolving the page failed.
    #[error("resolving the page at {addr:#x} failed: {source}")]
    Move {
        /// Page address.
        addr: usize,
        /// The failed call, with errno.
        #[source]
        source: SysError,
    },
    /// Poisoning failed: the faulting thread may refault.
    #[error("poisoning the page at {addr:#x} failed: {source}")]
    Poison {
        /// Page address.
        addr: usize,
        /// The failed call, with errno.
        #[source]
        source: SysError,
    },
    /// faultline's state and the page tables disagree.
    #[error("page at {addr:#x}: {what}")]
    Inconsistent {
        /// Page address.
        addr: usize,
        /// What disagreed.
        what: &'static str,
    },
    /// A byte range passed to the API is not a range inside the region.
    #[error("range {start}..{end} is not inside the region of {len} bytes")]
    BadRange {
        /// Start offset asked for.
        start: usize,
        /// End offset asked for.
        end: usize,
        /// The region's length.
        len: usize,
    },
    /// Reading events from the userfaultfd failed.
    #[error("reading fault events failed: {0}")]
    Events(#[source] SysError),
}

impl FaultError {
    /// The page address the error concerns, if any.
    pub fn addr(&self) -> Option<usize> {
        match self {
            FaultError::NoFrame { addr, .. }
            | FaultError::Store { addr, .. }
            | FaultError::Move { addr, .. }
            | FaultError::Poison { addr, .. }
            | FaultError::Inconsistent { addr, .. } => Some(*addr),
            FaultError::Events(_) | FaultError::BadRange { .. } => None,
        }
    }
}
