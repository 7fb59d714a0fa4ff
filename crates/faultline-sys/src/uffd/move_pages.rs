//! `UFFDIO_MOVE` (Linux 6.8): moving pages between anonymous ranges without
//! copying, the way faultline fills a faulting hole from its pool and takes
//! pages back out of a region. The tests beside it also pin down kernel
//! behaviour that shapes the design (THP splitting, written state).
//!
//! Invariants: see [`Uffd::move_pages`] — both ranges are anonymous memory the
//! caller manages, with no Rust reference into either. Outcomes are
//! [`super::Resolved`] as for every resolving ioctl. One ioctl; no locks.

use super::raw;
use super::{Resolved, Uffd};
use crate::SysError;

impl Uffd {
    /// `UFFDIO_MOVE`: moves the pages of `[src, src + len)` to the holes at
    /// `[dst, dst + len)` without copying, and (unless `dontwake`) wakes the
    /// threads waiting there. A PMD-mapped huge page moves whole when both
    /// sides are 2 MiB aligned and the destination PMD is empty. A source
    /// page with no data stops the move there: [`Resolved::SourceHole`]
    /// when nothing moved before it, else `Retry` with the bytes moved.
    ///
    /// `UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES` is not offered: Linux 6.18's
    /// `move_pages()` does not reset its error after a transient `EAGAIN`
    /// (a large folio locked or split elsewhere, a page table changing), so
    /// no later step advances: each pass retries the same address. Where
    /// it just moved a page the destination is now occupied and the call
    /// ends (`EEXIST`, a short count); but where the source has a hole there
    /// (a page the program dropped — what the moves that allow holes are
    /// for), that flag counts the hole as a success, the destination stays
    /// empty, and the ioctl spins in the kernel forever, holding both VMAs'
    /// read locks (khugepaged then waits for them holding the mmap lock for
    /// writing, and every `madvise` and page fault of the process waits
    /// behind it). Without the flag the hole ends the call with `ENOENT`
    /// or `EAGAIN` and a count that may be short of what moved, which
    /// callers check against the page tables anyway.
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
    ) -> Result<Resolved, SysError> {
        let mut arg = raw::UffdioMove {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if dontwake {
                raw::UFFDIO_MOVE_MODE_DONTWAKE
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
}

#[cfg(test)]
mod tests {
    use super::super::{test_uffd, Features, RegisterMode};
    use super::*;
    use crate::mem::Mapping;
    use crate::PAGE_SIZE;

    #[test]
    fn move_into_registered_hole_and_outcomes() {
        let u = test_uffd();
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
        let r = unsafe { u.move_pages(dst.addr(), src.addr(), PAGE_SIZE, false) }.expect("move");
        assert_eq!(r, Resolved::Done);
        // SAFETY: dst page is now mapped with the moved content.
        assert_eq!(unsafe { *dst.as_ptr() }, 0x5a);
        // The source is a hole now: moving again finds ENOENT.
        // SAFETY: as above.
        let r = unsafe { u.move_pages(dst.addr() + PAGE_SIZE, src.addr(), PAGE_SIZE, false) }
            .expect("move");
        assert_eq!(r, Resolved::SourceHole { done: 0 });
        // Moving a populated page onto a mapped destination is EEXIST.
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(src.as_ptr().add(PAGE_SIZE), 1, PAGE_SIZE) };
        // SAFETY: as above.
        let r = unsafe { u.move_pages(dst.addr(), src.addr() + PAGE_SIZE, PAGE_SIZE, false) }
            .expect("move");
        assert_eq!(r, Resolved::Exists { done: 0 });
        u.unregister(dst.addr(), dst.len()).expect("unregister");
    }

    /// Documents Linux 6.18: when `UFFDIO_MOVE` takes a 4 KiB page out of a
    /// PMD-mapped THP it splits the THP, and the first write to each other
    /// page of the block then takes a write fault (a copy-on-write with a
    /// TLB flush) — a one-time cost per pool frame (docs/design.md).
    #[test]
    fn first_write_after_a_move_split_faults_once() {
        use crate::mem::Advice;
        use crate::HUGE_PAGE_SIZE;
        let u = test_uffd();
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
        unsafe { u.move_pages(reg.addr(), pool.addr(), PAGE_SIZE, true) }.expect("move");
        assert_eq!(write(3), 1, "first write after the split");
        assert_eq!(write(3), 0, "second write to the same page");
        assert_eq!(write(5), 1, "first write to another page of the block");
    }

    /// A finding that shapes reclaim: `UFFDIO_MOVE` does not carry a page's
    /// write-protect (written) state to its destination — a moved page always
    /// reads as written — so write tracking cannot be read after a page is
    /// moved out, only before, which leaves a window for writes.
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
            unsafe { u.move_pages(r, p, PAGE_SIZE, true) }.expect("in");
            u.write_protect(r, PAGE_SIZE, true, false).expect("wp");
            if write {
                // SAFETY: our page.
                unsafe { (r as *mut u8).write_volatile(5) };
            }
            // SAFETY: as above.
            unsafe { u.move_pages(p, r, PAGE_SIZE, true) }.expect("out");
            let mut w = Vec::new();
            pm.written(p, p + PAGE_SIZE, false, &mut w).expect("scan");
            assert!(
                !w.is_empty(),
                "write={write}: the moved page reads as written"
            );
        }
    }
}
