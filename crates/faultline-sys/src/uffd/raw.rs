//! Raw constants and structures of the userfaultfd ABI, written out by hand
//! from `include/uapi/linux/userfaultfd.h` (Linux 6.18), because the system C
//! headers predate `UFFDIO_MOVE` and `UFFDIO_POISON`.
//!
//! Invariants: every structure is `#[repr(C)]` with the kernel's layout, and
//! every ioctl number encodes the size of the structure it passes; the
//! compile-time assertions at the end pin a few of them to the kernel's
//! values. Plain data: no system calls, no locks.

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
pub const UFFD_EVENT_REMOVE: u8 = 0x15;
pub const UFFD_EVENT_UNMAP: u8 = 0x16;

pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
pub const UFFD_PAGEFAULT_FLAG_MINOR: u64 = 1 << 2;

pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
pub const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;

pub const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_COPY_MODE_WP`: map the copied pages write-protected (the range
/// must be registered in WP mode).
pub const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;
pub const UFFDIO_ZEROPAGE_MODE_DONTWAKE: u64 = 1 << 0;
pub const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;
pub const UFFDIO_POISON_MODE_DONTWAKE: u64 = 1 << 0;
pub const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1 << 0;
/// Never passed: on Linux 6.18 (and earlier kernels with `UFFDIO_MOVE`) a
/// move that met a transient `EAGAIN` keeps that error while it retries,
/// so it stops advancing; with this flag a source hole at the retried
/// address counts as a success, and the ioctl loops in the kernel forever,
/// holding the VMAs' read locks (see [`super::Uffd::move_pages`]).
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
