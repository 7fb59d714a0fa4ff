//! Waiting for events: [`Uffd::wait`] (`poll` on the context and one other
//! fd), [`Waiter`] (an epoll set of the context and several fds, optionally
//! `EPOLLEXCLUSIVE` so one event wakes one worker), [`EventFd`] (to wake
//! waiters, e.g. at shutdown), and [`Ready`], what a wait saw.
//!
//! Invariants: a wait retries on `EINTR` and never reads an event itself;
//! when another fd and the context are both ready, the other fd is reported
//! (so shutdown wins over work). No locks: each `Waiter` and `EventFd` owns
//! its fd and closes it on drop.

use super::Uffd;
use crate::{last_errno, SysError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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

impl Uffd {
    /// Blocks until events are pending, `other` is readable, or `timeout_ms`
    /// passes (-1: forever).
    pub fn wait(&self, other: RawFd, timeout_ms: i32) -> Result<Ready, SysError> {
        let mut fds = [
            libc::pollfd {
                fd: self.raw_fd(),
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
    use super::super::test_uffd;
    use super::*;

    #[test]
    fn no_events_when_idle() {
        let u = test_uffd();
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
