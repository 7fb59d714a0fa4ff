//! The context itself: [`Uffd`] — opening it (the `userfaultfd(2)` syscall,
//! else `/dev/userfaultfd`), the `UFFDIO_API` handshake that probes and
//! enables features, and (un)registration and waking of ranges.
//!
//! Invariants: a `Uffd` holds an open, non-blocking, close-on-exec
//! userfaultfd whose handshake succeeded with exactly [`Uffd::features`]
//! enabled; the fd is closed when the value drops. [`Uffd::ioctl`] is the one
//! place the resolving and registering ioctls enter the kernel, and each
//! caller pairs a request number with the structure of its layout (see
//! [`super::raw`]). No locks: ioctls on one fd from many threads are what the
//! kernel expects.

use super::raw;
use super::Features;
use crate::{last_errno, SysError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Why a userfaultfd context could not be had.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Neither the syscall nor `/dev/userfaultfd` gave a context.
    #[error(
        "userfaultfd is unavailable: userfaultfd(2) failed with {} and /dev/userfaultfd with {}. \
         faultline needs kernel-mode fault handling, so either run as root or with CAP_SYS_PTRACE, \
         give this user read-write access to /dev/userfaultfd, or set `sysctl vm.unprivileged_userfaultfd=1`",
         std::io::Error::from_raw_os_error(*syscall_errno), std::io::Error::from_raw_os_error(*device_errno)
    )]
    Unavailable {
        /// errno of `userfaultfd(2)`.
        syscall_errno: i32,
        /// errno of opening `/dev/userfaultfd` (or of its `USERFAULTFD_IOC_NEW`).
        device_errno: i32,
    },
    /// No file descriptor was free for the context: the process is at its
    /// `RLIMIT_NOFILE` (`EMFILE`), or the system at `fs.file-max`
    /// (`ENFILE`). Not a permission problem, whoever runs it.
    #[error(
        "no file descriptor free for the userfaultfd: {} ({}); close descriptors, or raise the limit \
         (`ulimit -n`, RLIMIT_NOFILE; `fs.file-max` for ENFILE)",
        errno_name(*errno), std::io::Error::from_raw_os_error(*errno)
    )]
    NoDescriptors {
        /// `EMFILE` or `ENFILE`.
        errno: i32,
    },
    /// The `UFFDIO_API` handshake failed.
    #[error("UFFDIO_API handshake failed: {0}")]
    Api(#[source] SysError),
    /// The kernel lacks features faultline needs.
    #[error("this kernel's userfaultfd lacks {missing:?} (UFFDIO_MOVE needs Linux 6.8, UFFDIO_POISON 6.6)")]
    MissingFeatures {
        /// Names of the missing `UFFD_FEATURE_*` bits.
        missing: Vec<&'static str>,
    },
}

/// How a range is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterMode {
    /// Missing-page faults are reported.
    pub missing: bool,
    /// Write-protect faults are reported (or resolved by the kernel with
    /// `WP_ASYNC`).
    pub wp: bool,
}

/// An open userfaultfd context (non-blocking, close-on-exec).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: Features,
}

fn open_raw() -> Result<OwnedFd, OpenError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: the userfaultfd syscall takes one integer of flags.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        // SAFETY: the kernel just returned this fd to us; nobody else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    }
    let syscall_errno = last_errno();
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd");
    let device_errno = match dev {
        Ok(dev) => {
            // SAFETY: USERFAULTFD_IOC_NEW takes its flags as the argument
            // and returns a new fd; `dev` is a valid open fd.
            let fd = unsafe {
                libc::ioctl(
                    dev.as_raw_fd(),
                    raw::USERFAULTFD_IOC_NEW as _,
                    flags as libc::c_ulong,
                )
            };
            if fd >= 0 {
                // SAFETY: a fresh fd returned by the kernel, owned by nobody.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            last_errno()
        }
        Err(e) => e.raw_os_error().unwrap_or(libc::ENODEV),
    };
    // Out of descriptors is the cause whatever the privileges: the
    // syscall (or, where it is refused, the device) needed one.
    if let Some(errno) = [syscall_errno, device_errno]
        .into_iter()
        .find(|&e| e == libc::EMFILE || e == libc::ENFILE)
    {
        return Err(OpenError::NoDescriptors { errno });
    }
    Err(OpenError::Unavailable {
        syscall_errno,
        device_errno,
    })
}

/// The symbolic name of the descriptor-shortage errnos.
fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        _ => "errno",
    }
}

fn api(fd: &OwnedFd, features: Features) -> Result<Features, SysError> {
    let mut arg = raw::UffdioApi {
        api: raw::UFFD_API,
        features: features.0,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one UffdioApi, which `arg` is.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), raw::UFFDIO_API as _, &mut arg) };
    if rc != 0 {
        return Err(SysError::last("UFFDIO_API", 0, 0));
    }
    Ok(Features(arg.features))
}

impl Uffd {
    /// The features this kernel supports (a throwaway context, handshake with
    /// no features requested, which reports everything available).
    pub fn probe() -> Result<Features, OpenError> {
        let fd = open_raw()?;
        api(&fd, Features(0)).map_err(OpenError::Api)
    }

    /// Opens a context with every feature in `required` and those of
    /// `optional` the kernel has.
    pub fn open(required: Features, optional: Features) -> Result<Uffd, OpenError> {
        let supported = Self::probe()?;
        let missing = required.without(supported);
        if missing.0 != 0 {
            return Err(OpenError::MissingFeatures {
                missing: missing.names(),
            });
        }
        let want = required.with(Features(optional.0 & supported.0));
        let fd = open_raw()?;
        api(&fd, want).map_err(OpenError::Api)?;
        Ok(Uffd { fd, features: want })
    }

    /// The features enabled on this context.
    pub fn features(&self) -> Features {
        self.features
    }

    /// Issues the ioctl `req` with `arg` on this context; returns its result
    /// (0 on success, -1 with errno set). `req` must be the `raw` request
    /// number whose structure is `T`: only the sibling modules call it, each
    /// with the pair from `raw`.
    pub(super) fn ioctl<T>(&self, req: u64, arg: &mut T) -> i32 {
        // SAFETY: every caller passes the request number that matches T's
        // layout (see `raw`); the kernel reads/writes exactly one T.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) }
    }

    /// Registers `[addr, addr + len)` (page aligned, whole VMAs of anonymous
    /// memory). Returns the mask of ioctls allowed on the range.
    pub fn register(&self, addr: usize, len: usize, mode: RegisterMode) -> Result<u64, SysError> {
        let mut arg = raw::UffdioRegister {
            range: raw::UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if mode.missing {
                raw::UFFDIO_REGISTER_MODE_MISSING
            } else {
                0
            } | if mode.wp {
                raw::UFFDIO_REGISTER_MODE_WP
            } else {
                0
            },
            ioctls: 0,
        };
        if self.ioctl(raw::UFFDIO_REGISTER, &mut arg) != 0 {
            return Err(SysError::last("UFFDIO_REGISTER", addr, len));
        }
        Ok(arg.ioctls)
    }

    /// Unregisters `[addr, addr + len)`; threads blocked on faults there wake
    /// up and retry.
    pub fn unregister(&self, addr: usize, len: usize) -> Result<(), SysError> {
        let mut arg = raw::UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        if self.ioctl(raw::UFFDIO_UNREGISTER, &mut arg) != 0 {
            return Err(SysError::last("UFFDIO_UNREGISTER", addr, len));
        }
        Ok(())
    }

    /// Wakes threads blocked on faults in `[addr, addr + len)`; they retry
    /// their access.
    pub fn wake(&self, addr: usize, len: usize) -> Result<(), SysError> {
        let mut arg = raw::UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        if self.ioctl(raw::UFFDIO_WAKE, &mut arg) != 0 {
            return Err(SysError::last("UFFDIO_WAKE", addr, len));
        }
        Ok(())
    }

    /// The raw fd, for diagnostics.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_move() {
        let f = Uffd::probe().unwrap_or_else(|e| panic!("needs userfaultfd: {e}"));
        assert!(
            f.contains(Features::MOVE),
            "kernel lacks UFFDIO_MOVE: {:?}",
            f.names()
        );
    }
}
