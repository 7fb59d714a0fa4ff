//! A userfaultfd context: open, `UFFDIO_API` handshake, registration, the
//! resolving ioctls, and event reads.
//!
//! The ioctl numbers and structures are written out by hand from
//! `include/uapi/linux/userfaultfd.h` (Linux 6.18), because the system C headers
//! predate `UFFDIO_MOVE` and `UFFDIO_POISON`. Features are probed at run time
//! ([`Uffd::probe`]); nothing is chosen by kernel version.
//!
//! Outcomes: a resolving ioctl returns [`Resolved`]. `EAGAIN` (partial
//! progress, or the range changed under us), `EEXIST` (the destination is
//! already mapped), and for `MOVE` `ENOENT` (a hole in the source) and
//! `EBUSY` (the source page cannot move right now) are outcomes; every other errno is a [`SysError`] naming the ioctl, the range
//! and the errno. For each `Resolved` variant, `done` bytes from the start of
//! the range were resolved before the ioctl stopped.
//!
//! The context is `Sync`: ioctls and reads on one fd from many threads are
//! what the kernel expects. No locks are taken here.

use crate::{last_errno, SysError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Raw constants and structures of the userfaultfd ABI.
pub mod raw {
    #![allow(missing_docs)]

    pub const UFFD_API: u64 = 0xAA;
    const UFFDIO: u64 = 0xAA;

    const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
        (dir << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
    }
    const READ: u64 = 2;
    const RW: u64 = 3;

    /// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`: `_IO(0xAA, 0x00)`.
    pub const USERFAULTFD_IOC_NEW: u64 = UFFDIO << 8;

    pub const UFFDIO_REGISTER: u64 = ioc(RW, 0x00, std::mem::size_of::<UffdioRegister>());
    pub const UFFDIO_UNREGISTER: u64 = ioc(READ, 0x01, std::mem::size_of::<UffdioRange>());
    pub const UFFDIO_WAKE: u64 = ioc(READ, 0x02, std::mem::size_of::<UffdioRange>());
    pub const UFFDIO_COPY: u64 = ioc(RW, 0x03, std::mem::size_of::<UffdioCopy>());
    pub const UFFDIO_ZEROPAGE: u64 = ioc(RW, 0x04, std::mem::size_of::<UffdioZeropage>());
    pub const UFFDIO_MOVE: u64 = ioc(RW, 0x05, std::mem::size_of::<UffdioMove>());
    pub const UFFDIO_WRITEPROTECT: u64 = ioc(RW, 0x06, std::mem::size_of::<UffdioWriteprotect>());
    pub const UFFDIO_POISON: u64 = ioc(RW, 0x08, std::mem::size_of::<UffdioPoison>());
    pub const UFFDIO_API: u64 = ioc(RW, 0x3F, std::mem::size_of::<UffdioApi>());

    pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
    pub const UFFD_EVENT_UNMAP: u8 = 0x16;

    pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
    pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
    pub const UFFD_PAGEFAULT_FLAG_MINOR: u64 = 1 << 2;

    pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
    pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
    pub const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;

    pub const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1 << 0;
    pub const UFFDIO_ZEROPAGE_MODE_DONTWAKE: u64 = 1 << 0;
    pub const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
    pub const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;
    pub const UFFDIO_POISON_MODE_DONTWAKE: u64 = 1 << 0;
    pub const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1 << 0;
    pub const UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES: u64 = 1 << 1;

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdioApi {
        pub api: u64,
        pub features: u64,
        pub ioctls: u64,
    }

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdioRange {
        pub start: u64,
        pub len: u64,
    }

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdioRegister {
        pub range: UffdioRange,
        pub mode: u64,
        pub ioctls: u64,
    }

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdioCopy {
        pub dst: u64,
        pub src: u64,
        pub len: u64,
        pub mode: u64,
        pub copy: i64,
    }

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdioZeropage {
        pub range: UffdioRange,
        pub mode: u64,
        pub zeropage: i64,
    }

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdioMove {
        pub dst: u64,
        pub src: u64,
        pub len: u64,
        pub mode: u64,
        pub moved: i64,
    }

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdioWriteprotect {
        pub range: UffdioRange,
        pub mode: u64,
    }

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdioPoison {
        pub range: UffdioRange,
        pub mode: u64,
        pub updated: i64,
    }

    /// `struct uffd_msg`, 32 bytes, the pagefault arm of the union spelled out.
    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct UffdMsg {
        pub event: u8,
        pub reserved1: u8,
        pub reserved2: u16,
        pub reserved3: u32,
        pub flags: u64,
        pub address: u64,
        pub ptid: u32,
        pub pad: u32,
    }

    const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);
    const _: () = assert!(UFFDIO_API == 0xc018_aa3f);
    const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00);
    const _: () = assert!(UFFDIO_MOVE == 0xc028_aa05);
}

/// A set of `UFFD_FEATURE_*` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features(pub u64);

impl Features {
    /// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`.
    pub const PAGEFAULT_FLAG_WP: Features = Features(1 << 0);
    /// `UFFD_FEATURE_THREAD_ID`: events carry the faulting thread's id.
    pub const THREAD_ID: Features = Features(1 << 8);
    /// `UFFD_FEATURE_WP_UNPOPULATED`.
    pub const WP_UNPOPULATED: Features = Features(1 << 13);
    /// `UFFD_FEATURE_POISON`: `UFFDIO_POISON` (SIGBUS for one page).
    pub const POISON: Features = Features(1 << 14);
    /// `UFFD_FEATURE_WP_ASYNC`: the kernel resolves WP faults itself.
    pub const WP_ASYNC: Features = Features(1 << 15);
    /// `UFFD_FEATURE_MOVE`: `UFFDIO_MOVE` (Linux 6.8).
    pub const MOVE: Features = Features(1 << 16);
    /// `UFFD_EVENT_UNMAP`: an unmap of a registered range (`munmap`, `mremap`
    /// away, `mmap(MAP_FIXED)` over it) is reported, and the unmapping
    /// thread waits until the event is read.
    pub const EVENT_UNMAP: Features = Features(1 << 6);

    const NAMES: [(u64, &'static str); 17] = [
        (1 << 0, "PAGEFAULT_FLAG_WP"),
        (1 << 1, "EVENT_FORK"),
        (1 << 2, "EVENT_REMAP"),
        (1 << 3, "EVENT_REMOVE"),
        (1 << 4, "MISSING_HUGETLBFS"),
        (1 << 5, "MISSING_SHMEM"),
        (1 << 6, "EVENT_UNMAP"),
        (1 << 7, "SIGBUS"),
        (1 << 8, "THREAD_ID"),
        (1 << 9, "MINOR_HUGETLBFS"),
        (1 << 10, "MINOR_SHMEM"),
        (1 << 11, "EXACT_ADDRESS"),
        (1 << 12, "WP_HUGETLBFS_SHMEM"),
        (1 << 13, "WP_UNPOPULATED"),
        (1 << 14, "POISON"),
        (1 << 15, "WP_ASYNC"),
        (1 << 16, "MOVE"),
    ];

    /// Whether every bit of `other` is in `self`.
    pub fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    pub fn with(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }

    /// The bits of `self` not in `other`.
    pub fn without(self, other: Features) -> Features {
        Features(self.0 & !other.0)
    }

    /// Names of the bits set, e.g. `["MOVE", "POISON"]`.
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(bit, _)| self.0 & bit != 0)
            .map(|&(_, n)| n)
            .collect()
    }
}

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

/// Outcome of a resolving ioctl that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// The whole range was resolved.
    Done,
    /// `EAGAIN`: stopped after `done` bytes; retry the rest.
    Retry {
        /// Bytes resolved before stopping.
        done: usize,
    },
    /// `EEXIST`: the destination page at `dst + done` is already mapped.
    Exists {
        /// Bytes resolved before stopping.
        done: usize,
    },
    /// `ENOENT` (MOVE only): the source page at `src + done` is a hole.
    SourceHole {
        /// Bytes resolved before stopping.
        done: usize,
    },
    /// `EBUSY` (MOVE only): the source page is pinned, shared, or its large
    /// folio could not be split right now (e.g. an extra reference held
    /// briefly elsewhere); retry later.
    Busy {
        /// Bytes resolved before stopping.
        done: usize,
    },
}

/// One event read from the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A thread faulted on a registered range.
    PageFault {
        /// The faulting address (not page aligned without `EXACT_ADDRESS`... it
        /// is rounded to the base page by the kernel by default).
        addr: usize,
        /// A write access.
        write: bool,
        /// A write-protect fault (page present, write-protected).
        wp: bool,
        /// A minor fault.
        minor: bool,
        /// Faulting thread id, with `THREAD_ID`; 0 otherwise.
        tid: u32,
    },
    /// `[start, end)` was unmapped by the program (with `EVENT_UNMAP`).
    Unmap {
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
    },
    /// Any other event (only arrives if such a feature was requested).
    Other(u8),
}

impl Event {
    fn from_raw(m: &raw::UffdMsg) -> Event {
        if m.event == raw::UFFD_EVENT_PAGEFAULT {
            Event::PageFault {
                addr: m.address as usize,
                write: m.flags & raw::UFFD_PAGEFAULT_FLAG_WRITE != 0,
                wp: m.flags & raw::UFFD_PAGEFAULT_FLAG_WP != 0,
                minor: m.flags & raw::UFFD_PAGEFAULT_FLAG_MINOR != 0,
                tid: m.ptid,
            }
        } else if m.event == raw::UFFD_EVENT_UNMAP {
            // `arg.remove` {start, end} sits where a page fault's flags and
            // address do.
            Event::Unmap {
                start: m.flags as usize,
                end: m.address as usize,
            }
        } else {
            Event::Other(m.event)
        }
    }
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

/// What [`Uffd::wait`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Events may be read.
    Events,
    /// Another fd is readable: for [`Uffd::wait`] the one it was given, for
    /// [`Waiter::wait`] the one with this index.
    Other(usize),
    /// The timeout passed.
    Timeout,
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
    Err(OpenError::Unavailable {
        syscall_errno,
        device_errno,
    })
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

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> i32 {
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

    /// Maps `errno` of a resolving ioctl, with `field` its progress field
    /// (bytes done, or `-errno`), to an outcome.
    fn outcome(
        op: &'static str,
        addr: usize,
        len: usize,
        field: i64,
    ) -> Result<Resolved, SysError> {
        let errno = last_errno();
        let done = usize::try_from(field).unwrap_or(0);
        match errno {
            libc::EAGAIN => Ok(Resolved::Retry { done }),
            libc::EEXIST => Ok(Resolved::Exists { done }),
            libc::ENOENT if op == "UFFDIO_MOVE" => Ok(Resolved::SourceHole { done }),
            libc::EBUSY if op == "UFFDIO_MOVE" => Ok(Resolved::Busy { done }),
            _ => Err(SysError {
                op,
                addr,
                len,
                errno,
            }),
        }
    }

    /// `UFFDIO_MOVE`: moves the pages of `[src, src + len)` to the holes at
    /// `[dst, dst + len)` without copying, and (unless `dontwake`) wakes the
    /// threads waiting there. A PMD-mapped huge page moves whole when both
    /// sides are 2 MiB aligned and the destination PMD is empty.
    ///
    /// # Safety
    /// Both ranges must be anonymous memory that the caller manages: after the
    /// call the source reads as a hole and the destination has new content, so
    /// no Rust reference may point into either range.
    pub unsafe fn move_pages(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        dontwake: bool,
        allow_src_holes: bool,
    ) -> Result<Resolved, SysError> {
        let mut arg = raw::UffdioMove {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if dontwake {
                raw::UFFDIO_MOVE_MODE_DONTWAKE
            } else {
                0
            } | if allow_src_holes {
                raw::UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES
            } else {
                0
            },
            moved: 0,
        };
        if self.ioctl(raw::UFFDIO_MOVE, &mut arg) == 0 {
            return Ok(Resolved::Done);
        }
        Self::outcome("UFFDIO_MOVE", dst, len, arg.moved)
    }

    /// `UFFDIO_COPY`: copies `[src, src + len)` into the holes at `dst`.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes; `dst` must be a registered
    /// range the caller manages, with no Rust reference into it.
    pub unsafe fn copy(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        dontwake: bool,
    ) -> Result<Resolved, SysError> {
        let mut arg = raw::UffdioCopy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if dontwake {
                raw::UFFDIO_COPY_MODE_DONTWAKE
            } else {
                0
            },
            copy: 0,
        };
        if self.ioctl(raw::UFFDIO_COPY, &mut arg) == 0 {
            return Ok(Resolved::Done);
        }
        Self::outcome("UFFDIO_COPY", dst, len, arg.copy)
    }

    /// `UFFDIO_ZEROPAGE`: maps the zero page into the holes at `dst`.
    ///
    /// # Safety
    /// `dst` must be a registered range the caller manages, with no Rust
    /// reference into it.
    pub unsafe fn zeropage(
        &self,
        dst: usize,
        len: usize,
        dontwake: bool,
    ) -> Result<Resolved, SysError> {
        let mut arg = raw::UffdioZeropage {
            range: raw::UffdioRange {
                start: dst as u64,
                len: len as u64,
            },
            mode: if dontwake {
                raw::UFFDIO_ZEROPAGE_MODE_DONTWAKE
            } else {
                0
            },
            zeropage: 0,
        };
        if self.ioctl(raw::UFFDIO_ZEROPAGE, &mut arg) == 0 {
            return Ok(Resolved::Done);
        }
        Self::outcome("UFFDIO_ZEROPAGE", dst, len, arg.zeropage)
    }

    /// `UFFDIO_WRITEPROTECT`: sets (`protect`) or clears write protection on a
    /// range registered in WP mode. Changes no data. `dontwake` is only valid
    /// when clearing (the kernel refuses `WP | DONTWAKE` with `EINVAL`).
    pub fn write_protect(
        &self,
        addr: usize,
        len: usize,
        protect: bool,
        dontwake: bool,
    ) -> Result<Resolved, SysError> {
        let mut arg = raw::UffdioWriteprotect {
            range: raw::UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if protect {
                raw::UFFDIO_WRITEPROTECT_MODE_WP
            } else {
                0
            } | if dontwake {
                raw::UFFDIO_WRITEPROTECT_MODE_DONTWAKE
            } else {
                0
            },
        };
        if self.ioctl(raw::UFFDIO_WRITEPROTECT, &mut arg) == 0 {
            return Ok(Resolved::Done);
        }
        Self::outcome("UFFDIO_WRITEPROTECT", addr, len, 0)
    }

    /// `UFFDIO_POISON`: marks the holes at `dst` poisoned, so an access there
    /// (now or later) raises SIGBUS in the accessing thread, and wakes it.
    ///
    /// # Safety
    /// `dst` must be a registered range the caller manages, with no Rust
    /// reference into it.
    pub unsafe fn poison(
        &self,
        dst: usize,
        len: usize,
        dontwake: bool,
    ) -> Result<Resolved, SysError> {
        let mut arg = raw::UffdioPoison {
            range: raw::UffdioRange {
                start: dst as u64,
                len: len as u64,
            },
            mode: if dontwake {
                raw::UFFDIO_POISON_MODE_DONTWAKE
            } else {
                0
            },
            updated: 0,
        };
        if self.ioctl(raw::UFFDIO_POISON, &mut arg) == 0 {
            return Ok(Resolved::Done);
        }
        Self::outcome("UFFDIO_POISON", dst, len, arg.updated)
    }

    /// Reads up to `out.len()` pending events without blocking; returns how
    /// many were read (0 when none are pending).
    pub fn read_events(&self, out: &mut Vec<Event>, max: usize) -> Result<usize, SysError> {
        const BATCH: usize = 64;
        let mut buf = [raw::UffdMsg::default(); BATCH];
        let want = max.clamp(1, BATCH);
        // SAFETY: `buf` is valid for writes of `want` messages, and the kernel
        // writes whole messages only.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                want * std::mem::size_of::<raw::UffdMsg>(),
            )
        };
        if n < 0 {
            let errno = last_errno();
            if errno == libc::EAGAIN || errno == libc::EINTR {
                return Ok(0);
            }
            return Err(SysError {
                op: "read(userfaultfd)",
                addr: 0,
                len: 0,
                errno,
            });
        }
        let count = n as usize / std::mem::size_of::<raw::UffdMsg>();
        out.extend(buf[..count].iter().map(Event::from_raw));
        Ok(count)
    }

    /// Blocks until events are pending, `other` is readable, or `timeout_ms`
    /// passes (-1: forever).
    pub fn wait(&self, other: RawFd, timeout_ms: i32) -> Result<Ready, SysError> {
        let mut fds = [
            libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: other,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: `fds` is a valid array of two pollfd.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
            if rc < 0 {
                if last_errno() == libc::EINTR {
                    continue;
                }
                return Err(SysError::last("poll(userfaultfd)", 0, 0));
            }
            if rc == 0 {
                return Ok(Ready::Timeout);
            }
            if fds[1].revents != 0 {
                return Ok(Ready::Other(0));
            }
            return Ok(Ready::Events);
        }
    }

    /// The raw fd, for diagnostics.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An epoll instance watching a userfaultfd and other fds (a shutdown
/// eventfd, a work-queue eventfd); with `exclusive`, the userfaultfd is added
/// with `EPOLLEXCLUSIVE`, so an event wakes one waiting worker, not all.
#[derive(Debug)]
pub struct Waiter {
    ep: OwnedFd,
}

impl Waiter {
    /// Watches `uffd` and each of `others` (reported as `Ready::Other(i)`).
    pub fn new(uffd: &Uffd, others: &[RawFd], exclusive: bool) -> Result<Waiter, SysError> {
        // SAFETY: epoll_create1 takes a flag word and returns a new fd.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(SysError::last("epoll_create1", 0, 0));
        }
        // SAFETY: a fresh fd from the kernel, owned by nobody else.
        let ep = unsafe { OwnedFd::from_raw_fd(fd) };
        let excl = if exclusive {
            libc::EPOLLEXCLUSIVE as u32
        } else {
            0
        };
        let watch = std::iter::once((uffd.raw_fd(), u64::MAX, libc::EPOLLIN as u32 | excl)).chain(
            others
                .iter()
                .enumerate()
                .map(|(i, &fd)| (fd, i as u64, libc::EPOLLIN as u32)),
        );
        for (target, token, flags) in watch {
            let mut ev = libc::epoll_event {
                events: flags,
                u64: token,
            };
            // SAFETY: `ep` and `target` are open fds; `ev` is a valid event.
            let rc =
                unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, target, &mut ev) };
            if rc != 0 {
                return Err(SysError::last("epoll_ctl", 0, 0));
            }
        }
        Ok(Waiter { ep })
    }

    /// Blocks until something is readable or `timeout_ms` passes (-1:
    /// forever). Another fd wins over the userfaultfd when both are ready
    /// (the lowest index first).
    pub fn wait(&self, timeout_ms: i32) -> Result<Ready, SysError> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        loop {
            // SAFETY: `evs` has room for the 4 events asked for.
            let n =
                unsafe { libc::epoll_wait(self.ep.as_raw_fd(), evs.as_mut_ptr(), 4, timeout_ms) };
            if n < 0 {
                if last_errno() == libc::EINTR {
                    continue;
                }
                return Err(SysError::last("epoll_wait", 0, 0));
            }
            if n == 0 {
                return Ok(Ready::Timeout);
            }
            let other = evs[..n as usize]
                .iter()
                .map(|e| e.u64)
                .filter(|&t| t != u64::MAX)
                .min();
            return Ok(match other {
                Some(i) => Ready::Other(i as usize),
                None => Ready::Events,
            });
        }
    }
}

/// An `eventfd`, used to wake workers blocked in [`Uffd::wait`] at shutdown.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new non-blocking, close-on-exec eventfd.
    pub fn new() -> Result<EventFd, SysError> {
        // SAFETY: eventfd takes two integers and returns a new fd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(SysError::last("eventfd", 0, 0));
        }
        // SAFETY: a fresh fd from the kernel, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Resets the counter to zero (a non-blocking read); returns what it was.
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN (zero) leaves it 0.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        v
    }

    /// Adds one to the counter, making the eventfd readable.
    pub fn signal(&self) -> Result<(), SysError> {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if n != 8 {
            return Err(SysError::last("write(eventfd)", 0, 0));
        }
        Ok(())
    }

    /// The raw fd, for [`Uffd::wait`].
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Mapping;
    use crate::PAGE_SIZE;

    fn uffd() -> Uffd {
        Uffd::open(
            Features::MOVE,
            Features::POISON.with(Features::PAGEFAULT_FLAG_WP),
        )
        .unwrap_or_else(|e| panic!("these tests need userfaultfd with UFFDIO_MOVE: {e}"))
    }

    #[test]
    fn probe_reports_move() {
        let f = Uffd::probe().unwrap_or_else(|e| panic!("needs userfaultfd: {e}"));
        assert!(
            f.contains(Features::MOVE),
            "kernel lacks UFFDIO_MOVE: {:?}",
            f.names()
        );
    }

    #[test]
    fn move_into_registered_hole_and_outcomes() {
        let u = uffd();
        let src = Mapping::anonymous(4 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        let dst = Mapping::anonymous(4 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        // SAFETY: src is ours and no reference points into it.
        unsafe { std::ptr::write_bytes(src.as_ptr(), 0x5a, PAGE_SIZE) };
        let mode = RegisterMode {
            missing: true,
            wp: false,
        };
        u.register(dst.addr(), dst.len(), mode).expect("register");
        u.register(
            src.addr(),
            src.len(),
            RegisterMode {
                missing: false,
                wp: true,
            },
        )
        .expect("register src");
        // SAFETY: both mappings are ours; no references into them.
        let r =
            unsafe { u.move_pages(dst.addr(), src.addr(), PAGE_SIZE, false, false) }.expect("move");
        assert_eq!(r, Resolved::Done);
        // SAFETY: dst page is now mapped with the moved content.
        assert_eq!(unsafe { *dst.as_ptr() }, 0x5a);
        // The source is a hole now: moving again finds ENOENT.
        // SAFETY: as above.
        let r =
            unsafe { u.move_pages(dst.addr() + PAGE_SIZE, src.addr(), PAGE_SIZE, false, false) }
                .expect("move");
        assert_eq!(r, Resolved::SourceHole { done: 0 });
        // Moving a populated page onto a mapped destination is EEXIST.
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(src.as_ptr().add(PAGE_SIZE), 1, PAGE_SIZE) };
        // SAFETY: as above.
        let r =
            unsafe { u.move_pages(dst.addr(), src.addr() + PAGE_SIZE, PAGE_SIZE, false, false) }
                .expect("move");
        assert_eq!(r, Resolved::Exists { done: 0 });
        u.unregister(dst.addr(), dst.len()).expect("unregister");
    }

    #[test]
    fn copy_zeropage_poison_writeprotect() {
        let u = uffd();
        let dst = Mapping::anonymous(4 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        let src = [0x77u8; PAGE_SIZE];
        let mode = RegisterMode {
            missing: true,
            wp: true,
        };
        u.register(dst.addr(), dst.len(), mode).expect("register");
        // SAFETY: dst is ours, registered, no references into it.
        let r =
            unsafe { u.copy(dst.addr(), src.as_ptr() as usize, PAGE_SIZE, true) }.expect("copy");
        assert_eq!(r, Resolved::Done);
        // SAFETY: as above.
        // SAFETY: as above.
        let again = unsafe { u.copy(dst.addr(), src.as_ptr() as usize, PAGE_SIZE, true) };
        assert_eq!(again.expect("copy"), Resolved::Exists { done: 0 });
        // SAFETY: as above.
        let r = unsafe { u.zeropage(dst.addr() + PAGE_SIZE, PAGE_SIZE, true) }.expect("zeropage");
        assert_eq!(r, Resolved::Done);
        // SAFETY: page 2 is a hole of our registered mapping.
        let r = unsafe { u.poison(dst.addr() + 2 * PAGE_SIZE, PAGE_SIZE, true) }.expect("poison");
        assert_eq!(r, Resolved::Done);
        // SAFETY: the poisoned page is mapped (by a marker) now.
        // SAFETY: as above.
        let again = unsafe { u.poison(dst.addr() + 2 * PAGE_SIZE, PAGE_SIZE, true) };
        assert_eq!(again.expect("poison"), Resolved::Exists { done: 0 });
        assert_eq!(
            u.write_protect(dst.addr(), PAGE_SIZE, true, false)
                .expect("wp"),
            Resolved::Done
        );
        assert_eq!(
            u.write_protect(dst.addr(), PAGE_SIZE, false, false)
                .expect("un-wp"),
            Resolved::Done
        );
        u.wake(dst.addr(), dst.len()).expect("wake");
        // SAFETY: pages 0 and 1 are mapped: the copy and the zero page.
        unsafe {
            assert_eq!(*dst.as_ptr(), 0x77);
            assert_eq!(*dst.as_ptr().add(PAGE_SIZE), 0);
        }
        assert!(dst.is_resident(dst.addr(), 2 * PAGE_SIZE).expect("mincore"));
        assert!(!dst
            .is_resident(dst.addr() + 3 * PAGE_SIZE, PAGE_SIZE)
            .expect("mincore"));
        u.unregister(dst.addr(), dst.len()).expect("unregister");
        let err = u
            .register(dst.addr() + 1, PAGE_SIZE, mode)
            .expect_err("unaligned");
        assert_eq!((err.op, err.errno), ("UFFDIO_REGISTER", libc::EINVAL));
    }

    #[test]
    fn wp_async_tracks_writes() {
        use crate::mem::PageMap;
        let u = Uffd::open(Features::WP_ASYNC, Features::PAGEFAULT_FLAG_WP)
            .unwrap_or_else(|e| panic!("this test needs userfaultfd with WP_ASYNC: {e}"));
        let m = Mapping::anonymous(4 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        // SAFETY: our mapping; populate all four pages.
        unsafe { std::ptr::write_bytes(m.as_ptr(), 1, 4 * PAGE_SIZE) };
        u.register(
            m.addr(),
            m.len(),
            RegisterMode {
                missing: false,
                wp: true,
            },
        )
        .expect("register");
        u.write_protect(m.addr(), m.len(), true, false).expect("wp");
        let pm = PageMap::open().expect("pagemap");
        let mut w = Vec::new();
        pm.written(m.addr(), m.addr() + m.len(), true, &mut w)
            .expect("scan");
        assert!(w.is_empty(), "{w:?}");
        // SAFETY: page 2 of our mapping; the kernel resolves the WP fault.
        unsafe { m.as_ptr().add(2 * PAGE_SIZE).write_volatile(9) };
        pm.written(m.addr(), m.addr() + m.len(), true, &mut w)
            .expect("scan");
        assert_eq!(
            w,
            vec![(m.addr() + 2 * PAGE_SIZE, m.addr() + 3 * PAGE_SIZE)]
        );
        w.clear();
        pm.written(m.addr(), m.addr() + m.len(), true, &mut w)
            .expect("scan");
        assert!(w.is_empty(), "re-protected by the first scan: {w:?}");
    }

    /// A finding that shapes reclaim: `UFFDIO_MOVE` does not carry a page's
    /// write-protect (written) state to its destination — a moved page always
    /// reads as written — so write tracking cannot be read after a page is
    /// moved out, only before, which leaves a window for writes.
    /// Documents Linux 6.18: when `UFFDIO_MOVE` takes a 4 KiB page out of a
    /// PMD-mapped THP it splits the THP, and the first write to each other
    /// page of the block then takes a write fault (a copy-on-write with a
    /// TLB flush) — a one-time cost per pool frame (docs/design.md).
    #[test]
    fn first_write_after_a_move_split_faults_once() {
        use crate::mem::Advice;
        use crate::HUGE_PAGE_SIZE;
        let u = uffd();
        let pool = Mapping::anonymous(HUGE_PAGE_SIZE, HUGE_PAGE_SIZE).expect("mmap");
        pool.advise(pool.addr(), pool.len(), Advice::HugePage)
            .expect("madvise");
        pool.advise(pool.addr(), pool.len(), Advice::PopulateWrite)
            .expect("populate");
        let reg = Mapping::anonymous(HUGE_PAGE_SIZE, PAGE_SIZE).expect("mmap");
        u.register(
            reg.addr(),
            reg.len(),
            RegisterMode {
                missing: true,
                wp: false,
            },
        )
        .expect("register");
        let write = |page: usize| {
            let f0 = crate::host::thread_minor_faults();
            // SAFETY: inside our own populated mapping; nothing else uses it.
            unsafe { (pool.as_ptr().add(page * PAGE_SIZE)).write_volatile(1) };
            crate::host::thread_minor_faults() - f0
        };
        assert_eq!(write(2), 0, "a populated THP takes writes without faults");
        // SAFETY: moving page 0 of our pool into our registered region.
        unsafe { u.move_pages(reg.addr(), pool.addr(), PAGE_SIZE, true, false) }.expect("move");
        assert_eq!(write(3), 1, "first write after the split");
        assert_eq!(write(3), 0, "second write to the same page");
        assert_eq!(write(5), 1, "first write to another page of the block");
    }

    #[test]
    fn move_does_not_carry_written_state() {
        use crate::mem::PageMap;
        let u = Uffd::open(
            Features::WP_ASYNC.with(Features::MOVE),
            Features::PAGEFAULT_FLAG_WP,
        )
        .expect("uffd");
        let pool = Mapping::anonymous(2 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        // SAFETY: our mapping.
        unsafe { std::ptr::write_bytes(pool.as_ptr(), 1, 2 * PAGE_SIZE) };
        let reg = Mapping::anonymous(2 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        u.register(
            pool.addr(),
            pool.len(),
            RegisterMode {
                missing: false,
                wp: true,
            },
        )
        .expect("reg pool");
        u.register(
            reg.addr(),
            reg.len(),
            RegisterMode {
                missing: true,
                wp: true,
            },
        )
        .expect("reg region");
        let pm = PageMap::open().expect("pagemap");
        for (i, write) in [(0usize, false), (1usize, true)] {
            let (p, r) = (pool.addr() + i * PAGE_SIZE, reg.addr() + i * PAGE_SIZE);
            // SAFETY: moving between our own mappings.
            unsafe { u.move_pages(r, p, PAGE_SIZE, true, false) }.expect("in");
            u.write_protect(r, PAGE_SIZE, true, false).expect("wp");
            if write {
                // SAFETY: our page.
                unsafe { (r as *mut u8).write_volatile(5) };
            }
            // SAFETY: as above.
            unsafe { u.move_pages(p, r, PAGE_SIZE, true, false) }.expect("out");
            let mut w = Vec::new();
            pm.written(p, p + PAGE_SIZE, false, &mut w).expect("scan");
            assert!(
                !w.is_empty(),
                "write={write}: the moved page reads as written"
            );
        }
    }

    #[test]
    fn features_names() {
        let f = Features::MOVE.with(Features::POISON);
        assert_eq!(f.names(), vec!["POISON", "MOVE"]);
        assert!(f.contains(Features::MOVE));
        assert_eq!(f.without(Features::MOVE), Features::POISON);
    }

    #[test]
    fn no_events_when_idle() {
        let u = uffd();
        let mut v = Vec::new();
        assert_eq!(u.read_events(&mut v, 8).expect("read"), 0);
        let e = EventFd::new().expect("eventfd");
        assert_eq!(u.wait(e.raw_fd(), 0).expect("poll"), Ready::Timeout);
        e.signal().expect("signal");
        assert_eq!(u.wait(e.raw_fd(), 0).expect("poll"), Ready::Other(0));
        let w = Waiter::new(&u, &[e.raw_fd()], false).expect("epoll");
        assert_eq!(w.wait(0).expect("epoll"), Ready::Other(0));
    }
}
