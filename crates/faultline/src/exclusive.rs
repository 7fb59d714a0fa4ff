//! File ranges mapped anywhere (issue 39): a file range may be mapped by
//! one writable region, or by any number of read-only ones, in the whole
//! machine. Two regions over one range keep two copies of its pages, so one
//! region's write-back overwrites the other's writes (or a read-only one
//! reads stale bytes). A manager refuses that among its own regions
//! (`objects.rs`, [`MapError::Overlaps`]); this module does it
//! across managers and processes, for stores that name their file
//! ([`crate::Store::file`]):
//!
//! - in this process, a registry of the file ranges regions map, keyed by
//!   the file's device and inode and its byte range;
//! - across processes, an open-file-description lock on the byte range
//!   (`fcntl(F_OFD_SETLK)`: a write lock for a writable region, a read lock
//!   for a read-only one), taken through a description of the region's own
//!   (the file reopened through `/proc/self/fd`: a region's lock never
//!   merges with another region's, or with locks of the store's own
//!   description) and held while the region lives.
//!
//! A [`FileClaim`] is both; dropping it (the region's teardown, or a map
//! that failed later) unlocks the range and closes the description, then
//! forgets the entry. The unlock is explicit, so a child of `fork()` that
//! holds a copy of the descriptor does not keep the range locked; a child
//! dropping its copy of a claim does not unlock the parent's range. Where
//! the file cannot be reopened or locked (no `/proc`, a file system without
//! byte-range locks) only the in-process registry applies, and a warning is
//! logged. The locks are advisory: `write(2)` by another program is not
//! stopped.
//!
//! Locks: `USES`, a leaf (taken after a manager's `objects` lock; only
//! `fcntl` calls are made under it).

use crate::error::{FileHolder, MapError};
use faultline_sys::lock::{self, LockKind, Locked};
use faultline_sys::SysError;
use parking_lot::Mutex;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};

/// One region's use of a file range, in the process-wide registry.
#[derive(Debug)]
struct Use {
    /// The claim's number ([`FileClaim::token`]).
    token: u64,
    /// The process that made it: a child of `fork()` has a copy of the
    /// registry whose entries are its parent's, not its own.
    pid: u32,
    dev: u64,
    ino: u64,
    start: u64,
    end: u64,
    writable: bool,
    /// The manager's number in the process.
    manager: u32,
    /// The region's address, once mapped (0 until then).
    addr: usize,
}

/// The file ranges mapped by this process's regions.
static USES: Mutex<Vec<Use>> = parking_lot::const_mutex(Vec::new());

/// The next claim's number.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// How often a lock refused by a conflict that has gone when asked about
/// is tried again before the map is refused anyway.
const LOCK_TRIES: usize = 8;

/// A region's hold on bytes `[start, end)` of a file: its registry entry
/// and its lock. Dropping it lets both go.
#[derive(Debug)]
pub(crate) struct FileClaim {
    token: u64,
    pid: u32,
    start: u64,
    end: u64,
    /// The region's own open file description, holding the lock; `None`
    /// where none could be had (see the module doc).
    lock: Option<std::fs::File>,
}

/// Claims bytes `[start, end)` of `file` for a region of manager `manager`
/// (`writable` or read-only).
///
/// # Errors
/// [`MapError::FileInUse`] naming the region of this process or the lock
/// that holds an overlapping range, with one of the two writable;
/// [`MapError::Sys`] if the file cannot be `fstat`ed.
pub(crate) fn claim(
    file: &std::fs::File,
    start: u64,
    end: u64,
    writable: bool,
    manager: u32,
) -> Result<FileClaim, MapError> {
    let meta = file.metadata().map_err(|e| {
        MapError::Sys(SysError {
            op: "fstat",
            addr: 0,
            len: 0,
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })
    })?;
    let (dev, ino) = (meta.dev(), meta.ino());
    let in_use = |holder| MapError::FileInUse {
        start,
        end,
        writable,
        device: dev,
        inode: ino,
        holder,
    };
    let pid = faultline_sys::host::process_id();
    // Held across the lock, so that a claim and a release in this process
    // never see the registry and the locks disagree.
    let mut uses = USES.lock();
    let other = uses.iter().find(|u| {
        u.pid == pid
            && u.dev == dev
            && u.ino == ino
            && u.start < end
            && start < u.end
            && (u.writable || writable)
    });
    if let Some(u) = other {
        return Err(in_use(FileHolder::Region {
            manager: u.manager,
            addr: u.addr,
            start: u.start,
            end: u.end,
            writable: u.writable,
        }));
    }
    let lock = lock_range(file, start, end, writable).map_err(in_use)?;
    let token = NEXT.fetch_add(1, Ordering::Relaxed);
    uses.push(Use {
        token,
        pid,
        dev,
        ino,
        start,
        end,
        writable,
        manager,
        addr: 0,
    });
    Ok(FileClaim {
        token,
        pid,
        start,
        end,
        lock,
    })
}

/// Locks `[start, end)` of `file` through a new open file description:
/// `Ok(Some(description))` holding the lock, `Ok(None)` where no lock can
/// be had (logged), or the conflicting lock.
fn lock_range(
    file: &std::fs::File,
    start: u64,
    end: u64,
    writable: bool,
) -> Result<Option<std::fs::File>, FileHolder> {
    let kind = if writable {
        LockKind::Write
    } else {
        LockKind::Read
    };
    let own = match faultline_sys::host::reopen(file, writable) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot reopen the file through /proc/self/fd: its range {start}..{end} is \
                 not locked against other processes"
            );
            return Ok(None);
        }
    };
    for _ in 0..LOCK_TRIES {
        match lock::try_lock(own.as_fd(), kind, start, end - start) {
            Ok(Locked::Yes) => return Ok(Some(own)),
            Ok(Locked::Conflict(Some(c))) => {
                return Err(FileHolder::Lock {
                    pid: c.pid,
                    start: c.start,
                    end: c.end,
                    writable: c.kind == LockKind::Write,
                })
            }
            // The conflicting lock went before the kernel was asked about
            // it: try again.
            Ok(Locked::Conflict(None)) => {}
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "the file system refuses byte-range locks: the file's range {start}..{end} \
                     is not locked against other processes"
                );
                return Ok(None);
            }
        }
    }
    // Locks that keep coming and going: refused, naming what is known (a
    // lock over the range; a write lock, since one of the two must be).
    Err(FileHolder::Lock {
        pid: None,
        start,
        end: Some(end),
        writable: true,
    })
}

impl FileClaim {
    /// Records the region's address, for errors that name it.
    pub(crate) fn mapped_at(&self, addr: usize) {
        if let Some(u) = USES.lock().iter_mut().find(|u| u.token == self.token) {
            u.addr = addr;
        }
    }
}

impl Drop for FileClaim {
    fn drop(&mut self) {
        if self.pid != faultline_sys::host::process_id() {
            // A child of fork() dropping its copy: it shares the description
            // with its parent, so unlocking would unlock the parent's
            // region; closing its descriptor leaves the lock to the
            // parent's. Its copy of the registry is left alone too (its
            // entries are the parent's, which the child's claims pass
            // over), and so is the registry's mutex, which another thread
            // of the parent may have held at the fork.
            return;
        }
        let mut uses = USES.lock();
        if let Some(own) = self.lock.take() {
            if let Err(e) = lock::unlock(own.as_fd(), self.start, self.end - self.start) {
                // Closing the description below still drops the lock
                // (unless a child of fork() holds a copy of it).
                tracing::warn!(error = %e, "unlocking a region's file range failed");
            }
            drop(own);
        }
        uses.retain(|u| u.token != self.token);
    }
}
