//! The resolving ioctls that fill holes or change protection —
//! `UFFDIO_COPY`, `UFFDIO_ZEROPAGE`, `UFFDIO_POISON`, `UFFDIO_WRITEPROTECT` —
//! and [`Resolved`], the outcome every resolving ioctl (`UFFDIO_MOVE` too)
//! returns.
//!
//! Invariants: `EAGAIN` (partial progress, or the range changed under us),
//! `EEXIST` (the destination is already mapped), and for `MOVE` only `ENOENT`
//! (a hole in the source) and `EBUSY` (the source page cannot move right now)
//! are outcomes; every other errno is a [`SysError`] naming the ioctl, the
//! range and the errno. `done` in each outcome counts the bytes resolved from
//! the start of the range before the ioctl stopped. Each function is one
//! ioctl; no locks.

use super::raw;
use super::Uffd;
use crate::{last_errno, SysError};

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

impl Uffd {
    /// Maps `errno` of a resolving ioctl, with `field` its progress field
    /// (bytes done, or `-errno`), to an outcome.
    pub(super) fn outcome(
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
        let mode = if dontwake {
            raw::UFFDIO_COPY_MODE_DONTWAKE
        } else {
            0
        };
        // SAFETY: the caller's contract.
        unsafe { self.copy_mode(dst, src, len, mode) }
    }

    /// [`Uffd::copy`] in `UFFDIO_COPY_MODE_WP`: the pages are mapped
    /// write-protected, so the first write to each raises a write-protect
    /// fault (an event with [`Event::PageFault`]'s `wp`, or SIGBUS with
    /// `UFFD_FEATURE_SIGBUS`) until [`Uffd::write_protect`] clears it.
    /// Wakes the threads waiting there.
    ///
    /// # Safety
    /// As [`Uffd::copy`]; `dst` must be registered in WP mode as well
    /// (else `EINVAL`).
    ///
    /// [`Event::PageFault`]: super::Event::PageFault
    pub unsafe fn copy_protected(
        &self,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<Resolved, SysError> {
        // SAFETY: the caller's contract.
        unsafe { self.copy_mode(dst, src, len, raw::UFFDIO_COPY_MODE_WP) }
    }

    /// `UFFDIO_COPY` with `mode`.
    ///
    /// # Safety
    /// As [`Uffd::copy`] (and [`Uffd::copy_protected`] for its mode).
    unsafe fn copy_mode(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        mode: u64,
    ) -> Result<Resolved, SysError> {
        let mut arg = raw::UffdioCopy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode,
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
}

#[cfg(test)]
mod tests {
    use super::super::{test_uffd, Features, RegisterMode};
    use super::*;
    use crate::mem::Mapping;
    use crate::PAGE_SIZE;

    #[test]
    fn copy_zeropage_poison_writeprotect() {
        let u = test_uffd();
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

    /// What `FillModel::CopyProtected` relies on, on the real kernel: a
    /// page copied in `UFFDIO_COPY_MODE_WP` reads without a fault; its
    /// first write stops in a write-protect fault (an event with `wp` and
    /// `write`) and lands only once the protection is cleared; a
    /// protected page dropped with `process_madvise(MADV_DONTNEED)` leaves
    /// a hole (a missing fault, no write-protect marker on anonymous
    /// memory); and a protected page moves out with its bytes.
    #[test]
    fn a_page_copied_protected_stops_its_first_write() {
        use crate::uffd::Event;
        let u = test_uffd();
        let dst = Mapping::anonymous(4 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        let mode = RegisterMode {
            missing: true,
            wp: true,
        };
        u.register(dst.addr(), dst.len(), mode).expect("register");
        let src = [0x5au8; PAGE_SIZE];
        for page in 0..3 {
            let at = dst.addr() + page * PAGE_SIZE;
            // SAFETY: holes of our registered mapping; no references into it.
            let r = unsafe { u.copy_protected(at, src.as_ptr() as usize, PAGE_SIZE) };
            assert_eq!(r.expect("copy_protected"), Resolved::Done);
        }
        // SAFETY: page 0 is mapped (the copy); reads need no fault.
        assert_eq!(unsafe { dst.as_ptr().read_volatile() }, 0x5a);
        let base = dst.addr();
        let writer = std::thread::spawn(move || {
            // SAFETY: page 0 of the test's mapping, alive until joined.
            unsafe { (base as *mut u8).write_volatile(0x66) };
        });
        let mut events = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while events.is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "no write-protect fault"
            );
            u.read_events(&mut events, 8).expect("read");
            std::thread::yield_now();
        }
        match events[0] {
            Event::PageFault {
                addr, write, wp, ..
            } => {
                assert_eq!(addr & !(PAGE_SIZE - 1), dst.addr());
                assert!(write && wp, "a write-protect write fault: {:?}", events[0]);
            }
            other => panic!("not a page fault: {other:?}"),
        }
        // SAFETY: as above: the write has not landed while it is stopped.
        assert_eq!(unsafe { dst.as_ptr().read_volatile() }, 0x5a);
        u.write_protect(dst.addr(), PAGE_SIZE, false, false)
            .expect("lift");
        writer.join().expect("writer");
        // SAFETY: as above.
        assert_eq!(unsafe { dst.as_ptr().read_volatile() }, 0x66);
        // Page 1, still protected, dropped: a hole again.
        // SAFETY: page 1 holds only the copy; nothing references it.
        unsafe { dst.discard_many(&[(dst.addr() + PAGE_SIZE, PAGE_SIZE)]) }.expect("drop");
        assert!(!dst
            .is_resident(dst.addr() + PAGE_SIZE, PAGE_SIZE)
            .expect("mincore"));
        // SAFETY: page 1 is a hole again (no marker): the copy fills it.
        let again = unsafe {
            u.copy(
                dst.addr() + PAGE_SIZE,
                src.as_ptr() as usize,
                PAGE_SIZE,
                true,
            )
        };
        assert_eq!(again.expect("copy"), Resolved::Done);
        // Page 2, protected, moves out with its bytes.
        let out = Mapping::anonymous(PAGE_SIZE, PAGE_SIZE).expect("mmap");
        u.register(
            out.addr(),
            out.len(),
            RegisterMode {
                missing: true,
                wp: false,
            },
        )
        .expect("register");
        // SAFETY: page 2 of ours to a hole of ours; no references.
        unsafe { u.move_pages(out.addr(), dst.addr() + 2 * PAGE_SIZE, PAGE_SIZE, true) }
            .expect("move a protected page");
        // SAFETY: the moved page is mapped in `out`.
        assert_eq!(unsafe { out.as_ptr().read_volatile() }, 0x5a);
        u.unregister(out.addr(), out.len()).expect("unregister");
        u.unregister(dst.addr(), dst.len()).expect("unregister");
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
}
