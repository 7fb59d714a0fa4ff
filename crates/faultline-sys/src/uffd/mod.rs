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
//! `EBUSY` (the source page cannot move right now) are outcomes; every other
//! errno is a [`SysError`](crate::SysError) naming the ioctl, the range and
//! the errno. For each `Resolved` variant, `done` bytes from the start of the
//! range were resolved before the ioctl stopped.
//!
//! The context is `Sync`: ioctls and reads on one fd from many threads are
//! what the kernel expects. No locks are taken here.
//!
//! Layout (all submodules but [`raw`] are private; their items are
//! re-exported here, so every path is `faultline_sys::uffd::Item`):
//! - [`raw`]: the ABI's ioctl numbers and structures;
//! - `features`: [`Features`];
//! - `context`: [`Uffd`] itself — open, handshake, (un)register, wake — with
//!   [`OpenError`] and [`RegisterMode`];
//! - `resolve`: [`Resolved`] and `COPY`, `ZEROPAGE`, `POISON`, `WRITEPROTECT`;
//! - `move_pages`: `UFFDIO_MOVE`;
//! - `events`: [`Event`] and [`Uffd::read_events`];
//! - `waiter`: [`Uffd::wait`], [`Waiter`], [`EventFd`], [`Ready`].

pub mod raw;

mod context;
mod events;
mod features;
mod move_pages;
mod resolve;
mod waiter;

pub use context::{OpenError, RegisterMode, Uffd};
pub use events::Event;
pub use features::Features;
pub use resolve::Resolved;
pub use waiter::{EventFd, Ready, Waiter};

/// A context with `MOVE` (and `POISON` and `PAGEFAULT_FLAG_WP` where the
/// kernel has them), for the tests of every submodule.
#[cfg(test)]
fn test_uffd() -> Uffd {
    Uffd::open(
        Features::MOVE,
        Features::POISON.with(Features::PAGEFAULT_FLAG_WP),
    )
    .unwrap_or_else(|e| panic!("these tests need userfaultfd with UFFDIO_MOVE: {e}"))
}
