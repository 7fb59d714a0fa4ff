//! The errors of the fault path and of the API calls that take addresses,
//! lengths and offsets: [`FaultError`] (queued by the core, returned by
//! `take_error`/`next_error`; the faulting thread itself gets SIGBUS),
//! [`MapError`], [`AddrError`] and [`BuildError`]. Each names the argument
//! or address it concerns and carries the errno of a failed call. Plain
//! data, no locks.

use crate::config::ConfigError;
use crate::frame::PoolError;
use crate::store::StoreError;
use faultline_sys::uffd::OpenError;
use faultline_sys::SysError;

/// Why a fault could not be served (or went wrong).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FaultError {
    /// The pool had no free frame of the page's size.
    #[error("no free {page_size} frame for the page at {addr:#x}: {why}")]
    NoFrame {
        /// Page address.
        addr: usize,
        /// `"4k"` or `"2m"`.
        page_size: &'static str,
        /// Why none could be had (every frame held by pages reclaim cannot
        /// take, no frame freed for a while, reclaim off).
        why: &'static str,
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
    /// The region was used in a child of `fork()`: it is not mapped there
    /// (`MADV_DONTFORK`), and faultline's threads serve only the parent.
    #[error("the region at {addr:#x} belongs to the parent process: it is not mapped in a child of fork()")]
    Forked {
        /// The region's address.
        addr: usize,
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
            FaultError::Events(_) | FaultError::BadRange { .. } | FaultError::Forked { .. } => None,
        }
    }
}
/// Why a manager could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// In-thread faults ([`crate::FaultMode::InThread`]) need faultline's
    /// SIGBUS handler, and another handler has replaced it since the first
    /// in-thread manager installed it: faults would go to that one.
    #[error(
        "another SIGBUS handler was installed over faultline's since the first in-thread manager \
         started, so in-thread faults would not reach faultline; install other SIGBUS handlers \
         (e.g. Python's faulthandler) before the first in-thread manager, or use fault workers"
    )]
    SigbusTaken,
}

/// Why a region could not be mapped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// The store's offset plus the region's length does not fit in a file
    /// offset (`off_t`, 63 bits): it would wrap around to the object's
    /// first bytes, or every read would fail.
    #[error("store offset {offset} + region length {len} overflows a file offset")]
    OffsetOverflow {
        /// The store's offset in its object.
        offset: u64,
        /// The region's length.
        len: usize,
    },
    /// [`crate::Manager::map`] with a store that cannot keep writes (a
    /// read-only file): the region's writes would be dropped when reclaim
    /// evicts their pages. Map it with [`crate::Manager::map_read_only`],
    /// pin the region ([`crate::MapOptions::pinned`]), or open the store
    /// writable.
    #[error("the store is read-only: map it with map_read_only, pin the region, or open the store writable")]
    ReadOnlyStore,
    /// [`crate::MapOptions::at`] with an address that is not a multiple of
    /// the region's page size.
    #[error("address {addr:#x} is not a multiple of the {page} page size")]
    UnalignedAddress {
        /// The address asked for.
        addr: usize,
        /// The region's page size.
        page: &'static str,
    },
    /// [`crate::MapOptions::at`] with a range that something is mapped in
    /// (another managed region, or, without replacing, any mapping).
    #[error("bytes {addr:#x}..+{len:#x} are in use (a managed region or another mapping)")]
    AddressInUse {
        /// The address asked for.
        addr: usize,
        /// The region's length.
        len: usize,
    },
    /// A system call failed.
    #[error("{0}")]
    Sys(#[from] SysError),
}

/// A bad address passed to an API call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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

/// Why [`crate::Manager::set_budget`] could not set the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// The budget is not a non-zero multiple of 2 MiB.
    #[error("budget of {bytes} bytes is not a non-zero multiple of 2 MiB")]
    Unaligned {
        /// The budget asked for.
        bytes: usize,
    },
    /// The budget is above the pool's room (`Config::budget_max`).
    #[error(
        "budget of {bytes} bytes is above budget_max ({max} bytes): the pool cannot grow past it"
    )]
    AboveMax {
        /// The budget asked for.
        bytes: usize,
        /// The largest budget this manager allows.
        max: usize,
    },
    /// Shrinking stopped short: what is left holds pinned, zero-store or
    /// busy pages that reclaim cannot free.
    #[error("budget shrank only to {reached} bytes of the {bytes} asked for: the rest holds pages reclaim cannot free (pinned, zero-store or busy)")]
    Busy {
        /// The budget asked for.
        bytes: usize,
        /// The budget now.
        reached: usize,
    },
}
