//! Reading events: [`Event`] (a page fault, an unmap or a remove, decoded from the
//! kernel's `struct uffd_msg`) and [`Uffd::read_events`].
//!
//! Invariants: the context is non-blocking, so a read never waits; the
//! kernel hands out whole messages only, each to exactly one reader, so many
//! threads may read one context at once. No locks.

use super::raw;
use super::Uffd;
use crate::{last_errno, SysError};

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
    /// The program dropped `[start, end)`'s pages (`MADV_DONTNEED`,
    /// `MADV_FREE`; with `EVENT_REMOVE`). Read before the kernel zaps them:
    /// the thread that called `madvise` waits only until the event is read.
    Remove {
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
        } else if m.event == raw::UFFD_EVENT_UNMAP || m.event == raw::UFFD_EVENT_REMOVE {
            // `arg.remove` {start, end} sits where a page fault's flags and
            // address do.
            let (start, end) = (m.flags as usize, m.address as usize);
            if m.event == raw::UFFD_EVENT_UNMAP {
                Event::Unmap { start, end }
            } else {
                Event::Remove { start, end }
            }
        } else {
            Event::Other(m.event)
        }
    }
}

impl Uffd {
    /// Reads up to `max` (at most 64, at least 1) pending events into `out`
    /// without blocking; returns how many were read (0 when none are pending).
    pub fn read_events(&self, out: &mut Vec<Event>, max: usize) -> Result<usize, SysError> {
        const BATCH: usize = 64;
        let mut buf = [raw::UffdMsg::default(); BATCH];
        let want = max.clamp(1, BATCH);
        // SAFETY: `buf` is valid for writes of `want` messages, and the kernel
        // writes whole messages only.
        let n = unsafe {
            libc::read(
                self.raw_fd(),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_messages() {
        let fault = raw::UffdMsg {
            event: raw::UFFD_EVENT_PAGEFAULT,
            flags: raw::UFFD_PAGEFAULT_FLAG_WRITE | raw::UFFD_PAGEFAULT_FLAG_WP,
            address: 0x7000,
            ptid: 42,
            ..raw::UffdMsg::default()
        };
        assert_eq!(
            Event::from_raw(&fault),
            Event::PageFault {
                addr: 0x7000,
                write: true,
                wp: true,
                minor: false,
                tid: 42
            }
        );
        let unmap = raw::UffdMsg {
            event: raw::UFFD_EVENT_UNMAP,
            flags: 0x1000,
            address: 0x3000,
            ..raw::UffdMsg::default()
        };
        assert_eq!(
            Event::from_raw(&unmap),
            Event::Unmap {
                start: 0x1000,
                end: 0x3000
            }
        );
        let remove = raw::UffdMsg {
            event: raw::UFFD_EVENT_REMOVE,
            flags: 0x2000,
            address: 0x5000,
            ..raw::UffdMsg::default()
        };
        assert_eq!(
            Event::from_raw(&remove),
            Event::Remove {
                start: 0x2000,
                end: 0x5000
            }
        );
        let other = raw::UffdMsg {
            event: 0x13,
            ..raw::UffdMsg::default()
        };
        assert_eq!(Event::from_raw(&other), Event::Other(0x13));
    }
}
