//! [`Mapping`]: one owned `mmap`ed range, unmapped on drop — making it
//! (anonymous and aligned, or a shared file mapping), splitting ownership,
//! and tracking the parts the program unmapped itself.
//!
//! Invariants: `addr % align == 0`, `len % PAGE_SIZE == 0`, and `[addr, addr +
//! len)` is mapped for the whole life of the value, except for the sub-ranges
//! recorded by [`Mapping::mark_gone`], which are never unmapped by it; only
//! the process that made it unmaps anything. It hands out only the address:
//! how the bytes are accessed (and by whom, given that userfaultfd can move
//! pages in and out underneath) is the owner's business.
//!
//! Locks: the `gone` list's mutex, taken briefly by [`Mapping::mark_gone`]
//! and [`Mapping::live_ranges`] (so also on drop), with no other lock taken
//! while it is held and no system call under it.

use crate::{SysError, PAGE_SIZE};
use std::ptr::NonNull;

/// An owned anonymous private mapping, read-write.
///
/// Owned by the process that made it: in a child of `fork()` (which has a
/// copy of the value, and of the range unless it is `MADV_DONTFORK`, in
/// which case something else of the child's may live there) dropping it
/// unmaps nothing.
#[derive(Debug)]
pub struct Mapping {
    addr: NonNull<u8>,
    len: usize,
    pid: u32,
    /// Sub-ranges the program unmapped itself ([`Mapping::mark_gone`]):
    /// they may hold someone else's mapping now, and are never unmapped.
    gone: std::sync::Mutex<Vec<(usize, usize)>>,
}

// SAFETY: a Mapping is an address range plus the duty to unmap it; it holds no
// thread-affine state, and access to the bytes is governed by its owner.
unsafe impl Send for Mapping {}
// SAFETY: shared references only read `addr`/`len`, which never change.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of anonymous private memory (`MAP_NORESERVE`) whose
    /// start is a multiple of `align` (a power of two, at least the page size).
    ///
    /// Never locked, even after `mlockall(MCL_FUTURE)`: a locked mapping
    /// would be populated by the kernel at once (a managed region's pages
    /// must fault to faultline, and a terabyte region must not be touched)
    /// and `UFFDIO_MOVE` refuses locked memory. So the range is mapped
    /// `PROT_NONE` (which the kernel does not populate), unlocked, and only
    /// then made read-write.
    pub fn anonymous(len: usize, align: usize) -> Result<Mapping, SysError> {
        let einval = SysError {
            op: "mmap",
            addr: 0,
            len,
            errno: libc::EINVAL,
        };
        if len == 0 || len % PAGE_SIZE != 0 || !align.is_power_of_two() || align < PAGE_SIZE {
            return Err(einval);
        }
        let total = len.checked_add(align - PAGE_SIZE).ok_or(einval)?;
        // SAFETY: a fresh anonymous mapping with a null hint overlaps nothing
        // that exists; the arguments are plain integers.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(SysError::last("mmap", 0, total));
        }
        let start = raw as usize;
        let aligned = (start + align - 1) & !(align - 1);
        let head = aligned - start;
        let tail = total - head - len;
        // SAFETY: [start, start+head) and [aligned+len, start+total) lie inside
        // the mapping just created, which nothing else knows about yet.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        // SAFETY: [aligned, aligned+len) is the mapping just made; nothing
        // references it.
        unsafe { Self::make_usable(aligned, len) }
    }

    /// Maps `len` bytes of anonymous private memory at exactly `addr` (a
    /// multiple of the page size), as [`Mapping::anonymous`] does; fails
    /// with `EEXIST` if anything is mapped in the range
    /// (`MAP_FIXED_NOREPLACE`), so it never replaces a mapping.
    pub fn anonymous_at(addr: usize, len: usize) -> Result<Mapping, SysError> {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        unsafe { Self::fixed(addr, len, libc::MAP_FIXED_NOREPLACE) }
    }

    /// Like [`Mapping::anonymous_at`], but replaces whatever is mapped in
    /// `[addr, addr + len)` (`MAP_FIXED`, as `mmap(2)` does).
    ///
    /// # Safety
    /// Nothing in the range may be referenced or owned by anyone else (no
    /// Rust object, no other `Mapping`, no allocator's memory): the old
    /// mapping is gone when this returns.
    pub unsafe fn anonymous_replacing(addr: usize, len: usize) -> Result<Mapping, SysError> {
        // SAFETY: the caller vouches that the range may be replaced.
        unsafe { Self::fixed(addr, len, libc::MAP_FIXED) }
    }

    /// # Safety
    /// With `MAP_FIXED`, as [`Mapping::anonymous_replacing`].
    unsafe fn fixed(addr: usize, len: usize, how: libc::c_int) -> Result<Mapping, SysError> {
        let einval = SysError {
            op: "mmap",
            addr,
            len,
            errno: libc::EINVAL,
        };
        if addr == 0 || addr % PAGE_SIZE != 0 || len == 0 || len % PAGE_SIZE != 0 {
            return Err(einval);
        }
        addr.checked_add(len).ok_or(einval)?;
        // SAFETY: with MAP_FIXED_NOREPLACE the kernel refuses a range in
        // use; with MAP_FIXED the caller vouches for the range.
        let raw = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | how,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(SysError::last("mmap(MAP_FIXED)", addr, len));
        }
        if raw as usize != addr {
            // A kernel without MAP_FIXED_NOREPLACE takes it as a hint.
            // SAFETY: `raw` is the mapping just made, elsewhere.
            unsafe { libc::munmap(raw, len) };
            return Err(SysError {
                op: "mmap(MAP_FIXED_NOREPLACE)",
                addr,
                len,
                errno: libc::EEXIST,
            });
        }
        // SAFETY: the range is the mapping just made; nothing references it.
        unsafe { Self::make_usable(addr, len) }
    }

    /// Unlocks and makes read-write a fresh `PROT_NONE` mapping (see
    /// [`Mapping::anonymous`]), or unmaps it on failure.
    ///
    /// # Safety
    /// `[addr, addr + len)` is a mapping just made that nothing references.
    unsafe fn make_usable(addr: usize, len: usize) -> Result<Mapping, SysError> {
        let ptr = addr as *mut libc::c_void;
        // SAFETY: per the contract, the range is ours alone. munlock of an
        // unlocked range is a no-op; mprotect only changes the protection of
        // pages nobody has touched.
        unsafe {
            if libc::munlock(ptr, len) != 0
                || libc::mprotect(ptr, len, libc::PROT_READ | libc::PROT_WRITE) != 0
            {
                let e = SysError::last("munlock/mprotect", addr, len);
                libc::munmap(ptr, len);
                return Err(e);
            }
        }
        let addr = NonNull::new(ptr.cast::<u8>()).ok_or(SysError {
            op: "mmap",
            addr,
            len,
            errno: libc::EINVAL,
        })?;
        Ok(Mapping {
            addr,
            len,
            pid: crate::host::process_id(),
            gone: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Maps `len` bytes of `file` shared and read-write (`MAP_SHARED`): the
    /// kernel's own file mapping, for baselines.
    pub fn shared_file(file: &std::fs::File, len: usize) -> Result<Mapping, SysError> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh mapping (null hint) of an open fd; overlaps nothing.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(SysError::last("mmap(MAP_SHARED)", 0, len));
        }
        let addr = NonNull::new(raw.cast::<u8>()).ok_or(SysError {
            op: "mmap(MAP_SHARED)",
            addr: 0,
            len,
            errno: libc::EINVAL,
        })?;
        Ok(Mapping {
            addr,
            len,
            pid: crate::host::process_id(),
            gone: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Splits ownership of a mapping: gives up `self` and returns one
    /// `Mapping` per consecutive piece of `piece` bytes (which must divide the
    /// length and be a multiple of the page size). Each piece unmaps itself.
    pub fn split(self, piece: usize) -> Result<Vec<Mapping>, SysError> {
        if piece == 0 || piece % PAGE_SIZE != 0 || self.len % piece != 0 {
            return Err(SysError {
                op: "split",
                addr: self.addr(),
                len: piece,
                errno: libc::EINVAL,
            });
        }
        let (addr, len, self_pid) = (self.addr(), self.len, self.pid);
        std::mem::forget(self);
        Ok((0..len / piece)
            .filter_map(|i| NonNull::new((addr + i * piece) as *mut u8))
            .map(|addr| Mapping {
                addr,
                len: piece,
                pid: self_pid,
                gone: std::sync::Mutex::new(Vec::new()),
            })
            .collect())
    }

    /// Records that the program unmapped `[start, end)` (clipped to the
    /// mapping): it is no longer this mapping's, and dropping the mapping
    /// leaves it alone.
    pub fn mark_gone(&self, start: usize, end: usize) {
        let (s, e) = (start.max(self.addr()), end.min(self.addr() + self.len));
        if s < e {
            let mut g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
            g.push((s, e));
            g.sort_unstable();
        }
    }

    /// Unmaps the parts still this mapping's now, rather than when it is
    /// dropped (which then unmaps nothing): the address range is free for
    /// new mappings when this returns. Nothing in a child of `fork()`.
    ///
    /// # Safety
    /// Nothing may access the range, or move pages into it, afterwards.
    pub unsafe fn unmap_now(&self) -> Result<(), SysError> {
        if self.pid != crate::host::process_id() {
            return Ok(());
        }
        let mut first = Ok(());
        for (s, e) in self.live_ranges() {
            // SAFETY: a range this mapping owns; the caller vouches that
            // nothing uses it any more.
            if unsafe { libc::munmap(s as *mut libc::c_void, e - s) } != 0 && first.is_ok() {
                first = Err(SysError::last("munmap", s, e - s));
            }
        }
        self.mark_gone(self.addr(), self.addr() + self.len);
        first
    }

    /// The sub-ranges still this mapping's (all of it unless the program
    /// unmapped parts), in address order.
    pub fn live_ranges(&self) -> Vec<(usize, usize)> {
        let g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut at = self.addr();
        for &(s, e) in g.iter() {
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
        }
        let end = self.addr() + self.len;
        if at < end {
            out.push((at, end));
        }
        out
    }

    /// First byte of the mapping.
    pub fn addr(&self) -> usize {
        self.addr.as_ptr() as usize
    }

    /// First byte of the mapping as a raw pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping is never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether `[addr, addr + len)` lies inside this mapping.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr() + self.len)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.pid != crate::host::process_id() {
            // A child of fork(): the range is not ours to unmap.
            return;
        }
        for (s, e) in self.live_ranges() {
            // SAFETY: we own [s, e) (a part of the mapping the program did
            // not unmap itself) and unmap it exactly once; the owner
            // guarantees nothing references it any more.
            unsafe {
                libc::munmap(s as *mut libc::c_void, e - s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Advice;
    use crate::HUGE_PAGE_SIZE;

    #[test]
    fn aligned_mapping() {
        let m = Mapping::anonymous(3 * HUGE_PAGE_SIZE, HUGE_PAGE_SIZE).expect("mmap");
        assert_eq!(m.addr() % HUGE_PAGE_SIZE, 0);
        assert_eq!(m.len(), 3 * HUGE_PAGE_SIZE);
        m.advise(m.addr(), m.len(), Advice::HugePage)
            .expect("madvise");
        assert!(m
            .advise(m.addr() + m.len(), PAGE_SIZE, Advice::HugePage)
            .is_err());
    }

    #[test]
    fn split_pieces_own_their_pages() {
        let m = Mapping::anonymous(4 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        let base = m.addr();
        let parts = m.split(PAGE_SIZE).expect("split");
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[3].addr(), base + 3 * PAGE_SIZE);
        let bad = Mapping::anonymous(3 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        assert!(bad.split(2 * PAGE_SIZE).is_err());
    }

    #[test]
    fn bad_sizes_refused() {
        assert_eq!(
            Mapping::anonymous(0, PAGE_SIZE)
                .map(|_| ())
                .unwrap_err()
                .errno,
            libc::EINVAL
        );
        assert!(Mapping::anonymous(100, PAGE_SIZE).is_err());
        assert!(Mapping::anonymous(PAGE_SIZE, 3000).is_err());
    }
}
