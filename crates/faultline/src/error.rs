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
    /// In-thread faults ([`crate::FaultMode::InThread`]) are SIGBUS, and
    /// the calling thread blocks it (`pthread_sigmask`): a fault in such a
    /// thread kills the process, the kernel forcing the signal with the
    /// default action. Threads inherit the mask of the thread that
    /// creates them, so a program that blocks every signal before starting
    /// its threads would lose them all.
    #[error(
        "this thread blocks SIGBUS (pthread_sigmask), and in-thread faults (FaultMode::InThread) \
         are SIGBUS: a fault in a thread that blocks it kills the process (the kernel unblocks \
         it and resets its action to the default: \"Bus error\", no message); unblock SIGBUS in \
         every thread that touches region memory (block all signals but SIGBUS), or use fault \
         workers"
    )]
    SigbusBlocked,
}

/// Why a region could not be mapped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// The manager serves faults in the faulting thread
    /// ([`crate::FaultMode::InThread`]) and the calling thread blocks
    /// SIGBUS: its touches would kill the process ([`BuildError::SigbusBlocked`]).
    #[error(
        "this thread blocks SIGBUS (pthread_sigmask), and the manager serves faults in the \
         faulting thread (FaultMode::InThread): a touch of a page that is not resident from a \
         thread that blocks SIGBUS kills the process (\"Bus error\", no message); unblock SIGBUS \
         in every thread that touches region memory, or use fault workers"
    )]
    SigbusBlocked,
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
    /// object (a file, or a store's named object), and one of the two may
    /// write it: their pages would be separate copies, and one region's
    /// write-back would overwrite the other's writes. Map the object once
    /// and share the region, or map both read-only. A file range that a
    /// region of *another* manager, or another process, maps is
    /// [`MapError::FileInUse`].
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
    /// A file range that is mapped elsewhere, with one of the two mappings
    /// writable: by a region of another manager of this process, or by
    /// another process (or anything else holding a byte-range lock on it).
    /// Two mappings of one file range keep two copies of its pages: one
    /// region's write-back overwrites the other's writes, or a read-only
    /// region reads stale bytes. Two read-only regions may share a range.
    ///
    /// Within a process, faultline keeps a registry of the file ranges its
    /// regions map (keyed by the file's device and inode); across processes,
    /// each file region holds an open-file-description lock on its range
    /// (`fcntl(F_OFD_SETLK)`: a write lock for a writable region, a read
    /// lock for a read-only one) from the map until the region is dropped
    /// (or closed). The locks are advisory: a program that writes the file
    /// with `write(2)` is not stopped (docs/reliability.md). Regions of one
    /// manager get [`MapError::Overlaps`] instead.
    #[error(
        "bytes {start}..{end} of the file (device {}, inode {inode}) cannot be mapped {}: \
         {holder}; two mappings of one file range, one of them writable, are not coherent \
         (each keeps its own copy of the pages: one's write-back overwrites the other's \
         writes, or the other reads stale bytes)",
        DeviceNumber(*.device),
        if *.writable { "writable" } else { "read-only" }
    )]
    FileInUse {
        /// File bytes asked for.
        start: u64,
        /// End of the file bytes asked for.
        end: u64,
        /// Whether the region asked for was writable.
        writable: bool,
        /// The file's device (`st_dev`).
        device: u64,
        /// The file's inode number (`st_ino`).
        inode: u64,
        /// Who maps (or locks) the range.
        holder: FileHolder,
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

impl MapError {
    /// The errno a C caller gets for this error — where `mmap(2)` has the
    /// same cause, what it sets: `EINVAL` for a bad argument (and for a
    /// calling thread that blocks SIGBUS in in-thread mode), `EOVERFLOW`
    /// for an offset past what a file offset holds, `ENOMEM` for a length
    /// the address space cannot hold, `EEXIST` for an address in use,
    /// `EACCES` for a store that cannot keep writes, the call's own for a
    /// failed system call; and `EBUSY` for an object range mapped
    /// elsewhere, `EOPNOTSUPP` for 2 MiB pages without transparent huge
    /// pages (causes `mmap(2)` does not have). The C API, the Umap drop-in and
    /// the preload library all report this one.
    pub fn errno(&self) -> i32 {
        match self {
            MapError::Sys(s) => s.errno,
            MapError::AddressInUse { .. } => libc::EEXIST,
            MapError::TooLarge { .. } => libc::ENOMEM,
            MapError::ReadOnlyStore => libc::EACCES,
            MapError::FileInUse { .. } | MapError::Overlaps { .. } => libc::EBUSY,
            MapError::OffsetOverflow { .. } => libc::EOVERFLOW,
            MapError::NoHugePages => libc::EOPNOTSUPP,
            MapError::SigbusBlocked
            | MapError::ZeroLength
            | MapError::Unaligned { .. }
            | MapError::UnalignedAddress { .. } => libc::EINVAL,
        }
    }
}

/// Who holds a file range that [`MapError::FileInUse`] refuses to map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileHolder {
    /// A region of another manager of this process.
    Region {
        /// The manager's number in the process (the `<n>` of its stats
        /// file, `/dev/shm/faultline/<pid>-<n>`).
        manager: u32,
        /// The region's address (0 while that region is still being
        /// mapped).
        addr: usize,
        /// The file bytes it maps.
        start: u64,
        /// End of the file bytes it maps.
        end: u64,
        /// Whether it is writable.
        writable: bool,
    },
    /// A byte-range lock on the file that conflicts: another process's
    /// faultline region, or any other holder of an `fcntl` lock.
    Lock {
        /// The process holding it, where the kernel names one (a classic
        /// `F_SETLK` record lock); `None` for an open-file-description lock
        /// (`F_OFD_GETLK` reports -1: such a lock belongs to an open file
        /// description, which several processes may share — a faultline
        /// region in another process, or a description this process opened
        /// outside faultline).
        pid: Option<u32>,
        /// The locked bytes.
        start: u64,
        /// Their end; `None`: to the end of the file, however far it grows.
        end: Option<u64>,
        /// A write lock (else a read lock).
        writable: bool,
    },
}

impl std::fmt::Display for FileHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            FileHolder::Region {
                manager,
                addr,
                start,
                end,
                writable,
            } => {
                let mode = if writable { "writable" } else { "read-only" };
                write!(f, "bytes {start}..{end} are mapped {mode} by ")?;
                if addr == 0 {
                    write!(
                        f,
                        "a region being mapped by manager {manager} in this process"
                    )
                } else {
                    write!(
                        f,
                        "the region at {addr:#x} of manager {manager} in this process"
                    )
                }
            }
            FileHolder::Lock {
                pid,
                start,
                end,
                writable,
            } => {
                match end {
                    Some(end) => write!(f, "bytes {start}..{end}")?,
                    None => write!(f, "bytes {start}.. (to the end of the file)")?,
                }
                let kind = if writable { "writing" } else { "reading" };
                match pid {
                    Some(pid) => write!(
                        f,
                        " are locked for {kind} by process {pid} (a record lock, fcntl F_SETLK)"
                    ),
                    None => write!(
                        f,
                        " are locked for {kind} by another process (or by another open file \
                         description of this process: the kernel does not name the owner of an \
                         open-file-description lock, the kind a faultline region holds)"
                    ),
                }
            }
        }
    }
}

/// A device number (`st_dev`) shown as `major:minor`.
struct DeviceNumber(u64);

impl std::fmt::Display for DeviceNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // glibc's encoding (`gnu_dev_major`/`gnu_dev_minor`).
        let d = self.0;
        let major = ((d >> 8) & 0xfff) | ((d >> 32) & 0xffff_f000);
        let minor = (d & 0xff) | ((d >> 12) & 0xffff_ff00);
        write!(f, "{major}:{minor}")
    }
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
    /// Shrinking stopped short after its 5 s: what is left holds pinned,
    /// zero-store or busy pages that reclaim cannot free, or faulting
    /// threads took the frames reclaim freed before the shrink could.
    #[error("budget shrank only to {reached} bytes of the {bytes} asked for within 5 s: reclaim could not free the rest in time (pinned, zero-store or busy pages, a slow store, or faulting threads taking the freed frames); the budget stays at {reached} bytes, and calling again goes on")]
    Busy {
        /// The budget asked for.
        bytes: usize,
        /// The budget now.
        reached: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_error_reports_the_errno_mmap_would() {
        let in_use = MapError::FileInUse {
            start: 0,
            end: 4096,
            writable: true,
            device: 1,
            inode: 2,
            holder: FileHolder::Lock {
                pid: None,
                start: 0,
                end: None,
                writable: true,
            },
        };
        let overlaps = MapError::Overlaps {
            start: 0,
            end: 1,
            other_start: 0,
            other_end: 1,
        };
        let cases = [
            (in_use, libc::EBUSY),
            (overlaps, libc::EBUSY),
            (MapError::ZeroLength, libc::EINVAL),
            (MapError::ReadOnlyStore, libc::EACCES),
            (MapError::TooLarge { len: usize::MAX }, libc::ENOMEM),
            (MapError::AddressInUse { addr: 0, len: 1 }, libc::EEXIST),
            (
                MapError::OffsetOverflow {
                    offset: u64::MAX,
                    len: 1,
                },
                libc::EOVERFLOW,
            ),
            (MapError::NoHugePages, libc::EOPNOTSUPP),
            (MapError::SigbusBlocked, libc::EINVAL),
            (
                MapError::Unaligned {
                    len: 1,
                    page: "4 KiB",
                },
                libc::EINVAL,
            ),
            (
                MapError::Sys(SysError {
                    op: "mmap",
                    addr: 0,
                    len: 1,
                    errno: libc::EPERM,
                }),
                libc::EPERM,
            ),
        ];
        for (e, errno) in cases {
            assert_eq!(e.errno(), errno, "{e}");
        }
    }
}
