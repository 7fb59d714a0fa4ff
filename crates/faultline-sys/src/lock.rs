//! Open-file-description byte-range locks (`fcntl` `F_OFD_SETLK`,
//! `F_OFD_GETLK`): the locks that keep one file range from being mapped
//! writable by two faultline regions in different processes. An OFD lock
//! belongs to the open file description (not to the process, unlike a
//! classic `F_SETLK` record lock): locks of one description never conflict
//! with each other, two descriptions conflict even within one process, and
//! the lock goes when the description's last descriptor is closed (or on an
//! explicit unlock through any of them). OFD and classic record locks
//! conflict with each other. Both are advisory: `read(2)`/`write(2)` ignore
//! them. Every call is non-blocking; no locks of faultline's are taken.

use std::os::fd::{AsRawFd, BorrowedFd};

/// A shared (read) or exclusive (write) lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// `F_RDLCK`: conflicts only with write locks.
    Read,
    /// `F_WRLCK`: conflicts with every lock (the descriptor must be open
    /// for writing).
    Write,
}

impl LockKind {
    fn raw(self) -> libc::c_short {
        match self {
            LockKind::Read => libc::F_RDLCK as libc::c_short,
            LockKind::Write => libc::F_WRLCK as libc::c_short,
        }
    }
}

/// A lock that stands in the way, as `F_OFD_GETLK` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    /// The conflicting lock's kind.
    pub kind: LockKind,
    /// Its first byte.
    pub start: u64,
    /// Its end (exclusive); `None`: to the end of the file, however far it
    /// grows.
    pub end: Option<u64>,
    /// The process holding it, for a classic record lock; `None` for an
    /// OFD lock (the kernel reports -1: the lock belongs to a description,
    /// which any number of processes may share).
    pub pid: Option<u32>,
}

/// What [`try_lock`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locked {
    /// The range is locked through the descriptor's description.
    Yes,
    /// Another lock conflicts: the first one the kernel names, if it still
    /// stood when asked (`None`: it went in between, try again).
    Conflict(Option<Conflict>),
}

/// A `flock` for `kind` over `[start, start + len)` (`len` 0: to the end
/// of the file).
fn flock(kind: libc::c_short, start: u64, len: u64) -> Result<libc::flock, crate::SysError> {
    let too_far = |_| crate::SysError {
        op: "fcntl(F_OFD_SETLK)",
        addr: 0,
        len: 0,
        errno: libc::EOVERFLOW,
    };
    // SAFETY: flock is plain data; all-zero is a valid value (l_pid must
    // be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = libc::off_t::try_from(start).map_err(too_far)?;
    fl.l_len = libc::off_t::try_from(len).map_err(too_far)?;
    Ok(fl)
}

/// Tries to lock bytes `[start, start + len)` of `fd`'s file for its open
/// file description, without waiting; on a conflict, asks the kernel which
/// lock stands in the way (`F_OFD_GETLK`).
///
/// # Errors
/// Any errno but a conflict's (`EAGAIN`/`EACCES`): `EBADF` (a write lock
/// on a descriptor not open for writing), `ENOLCK` (a file system without
/// byte-range locks, such as some network ones), `EINVAL`, `EOVERFLOW`.
pub fn try_lock(
    fd: BorrowedFd<'_>,
    kind: LockKind,
    start: u64,
    len: u64,
) -> Result<Locked, crate::SysError> {
    let fl = flock(kind.raw(), start, len)?;
    // SAFETY: F_OFD_SETLK on an fd the caller holds open (borrowed for the
    // call), with a valid, initialized flock that the kernel only reads.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc == 0 {
        return Ok(Locked::Yes);
    }
    let errno = crate::last_errno();
    if errno != libc::EAGAIN && errno != libc::EACCES {
        return Err(crate::SysError {
            op: "fcntl(F_OFD_SETLK)",
            addr: 0,
            len: 0,
            errno,
        });
    }
    conflict(fd, kind, start, len).map(Locked::Conflict)
}

/// The first lock that would stand in the way of `kind` over
/// `[start, start + len)` of `fd`'s file (`F_OFD_GETLK`), if any.
///
/// # Errors
/// The errno of `fcntl`.
pub fn conflict(
    fd: BorrowedFd<'_>,
    kind: LockKind,
    start: u64,
    len: u64,
) -> Result<Option<Conflict>, crate::SysError> {
    let mut fl = flock(kind.raw(), start, len)?;
    // SAFETY: F_OFD_GETLK on an fd the caller holds open, with a valid
    // flock the kernel reads and overwrites in place.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if rc != 0 {
        return Err(crate::SysError::last("fcntl(F_OFD_GETLK)", 0, 0));
    }
    if fl.l_type == libc::F_UNLCK as libc::c_short {
        return Ok(None);
    }
    let kind = if fl.l_type == libc::F_WRLCK as libc::c_short {
        LockKind::Write
    } else {
        LockKind::Read
    };
    // The kernel reports the lock's range from SEEK_SET, l_len 0 for "to
    // the end of the file".
    let start = u64::try_from(fl.l_start).unwrap_or(0);
    let end = u64::try_from(fl.l_len)
        .ok()
        .filter(|&l| l > 0)
        .map(|l| start.saturating_add(l));
    let pid = u32::try_from(fl.l_pid).ok().filter(|&p| p > 0);
    Ok(Some(Conflict {
        kind,
        start,
        end,
        pid,
    }))
}

/// Unlocks bytes `[start, start + len)` of `fd`'s open file description
/// (what other descriptors of the description, in this process or a child
/// of `fork()`, see as well).
///
/// # Errors
/// The errno of `fcntl`.
pub fn unlock(fd: BorrowedFd<'_>, start: u64, len: u64) -> Result<(), crate::SysError> {
    let fl = flock(libc::F_UNLCK as libc::c_short, start, len)?;
    // SAFETY: F_OFD_SETLK (an unlock) on an fd the caller holds open, with
    // a valid flock the kernel only reads.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if rc != 0 {
        return Err(crate::SysError::last("fcntl(F_OFD_SETLK unlock)", 0, 0));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Two descriptions of one file conflict (a write lock against a read
    /// one), the kernel names no process for an OFD lock, read locks share,
    /// and an unlock frees the range.
    #[test]
    fn two_descriptions_conflict_and_an_unlock_frees_the_range() {
        /// Removes the test's directory, also when the test fails.
        struct Dir(std::path::PathBuf);
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = Dir(std::env::temp_dir().join(format!("faultline-lock-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).expect("dir");
        let path = dir.0.join("f");
        std::fs::write(&path, [0u8; 8192]).expect("write");
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .expect("open")
        };
        let (a, b) = (open(), open());
        let got = try_lock(a.as_fd(), LockKind::Write, 0, 4096).expect("lock");
        assert_eq!(got, Locked::Yes);
        // The same description again: no conflict with itself.
        let again = try_lock(a.as_fd(), LockKind::Write, 100, 10).expect("relock");
        assert_eq!(again, Locked::Yes);
        let got = try_lock(b.as_fd(), LockKind::Read, 4000, 200).expect("try");
        let Locked::Conflict(Some(c)) = got else {
            panic!("expected a conflict, got {got:?}");
        };
        assert_eq!(
            (c.kind, c.start, c.end, c.pid),
            (LockKind::Write, 0, Some(4096), None)
        );
        let beside = try_lock(b.as_fd(), LockKind::Read, 4096, 4096).expect("lock");
        assert_eq!(beside, Locked::Yes, "a disjoint range");
        unlock(a.as_fd(), 0, 4096).expect("unlock");
        let got = try_lock(b.as_fd(), LockKind::Read, 0, 4096).expect("lock");
        assert_eq!(got, Locked::Yes, "free after the unlock");
        let shared = try_lock(a.as_fd(), LockKind::Read, 0, 8192).expect("lock");
        assert_eq!(shared, Locked::Yes, "read locks share");
    }
}
