//! Anonymous memory mappings and `madvise`.
//!
//! [`Mapping`] owns one `mmap`ed range and unmaps it on drop. Invariants:
//! `addr % align == 0`, `len % PAGE_SIZE == 0`, and `[addr, addr + len)` is
//! mapped for the whole life of the value. It hands out only the address: how
//! the bytes are accessed (and by whom, given that userfaultfd can move pages
//! in and out underneath) is the owner's business. No locks.

use crate::{SysError, PAGE_SIZE};
use std::ptr::NonNull;

/// Advice that changes no data (safe to give at any time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `MADV_HUGEPAGE`: the range may be backed by transparent huge pages.
    HugePage,
    /// `MADV_NOHUGEPAGE`: never back the range by transparent huge pages.
    NoHugePage,
    /// `MADV_DONTFORK`: a child process does not inherit the range (keeps
    /// pages exclusive to this process, which `UFFDIO_MOVE` requires).
    DontFork,
    /// `MADV_POPULATE_WRITE`: fault the range in for writing now.
    PopulateWrite,
    /// `MADV_COLLAPSE`: back the (populated) range by transparent huge pages
    /// now, copying its pages into a new huge page; content is unchanged.
    Collapse,
}

impl Advice {
    fn raw(self) -> libc::c_int {
        match self {
            Advice::HugePage => libc::MADV_HUGEPAGE,
            Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
            Advice::DontFork => libc::MADV_DONTFORK,
            Advice::PopulateWrite => 23, // MADV_POPULATE_WRITE, Linux 5.14
            Advice::Collapse => 25,      // MADV_COLLAPSE, Linux 6.1
        }
    }

    fn name(self) -> &'static str {
        match self {
            Advice::HugePage => "madvise(MADV_HUGEPAGE)",
            Advice::NoHugePage => "madvise(MADV_NOHUGEPAGE)",
            Advice::DontFork => "madvise(MADV_DONTFORK)",
            Advice::PopulateWrite => "madvise(MADV_POPULATE_WRITE)",
            Advice::Collapse => "madvise(MADV_COLLAPSE)",
        }
    }
}

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
        let addr = NonNull::new(aligned as *mut u8).ok_or(einval)?;
        let ptr = addr.as_ptr().cast::<libc::c_void>();
        // SAFETY: the range is the mapping just made; nothing references it.
        // munlock of an unlocked range is a no-op; mprotect only changes the
        // protection of pages nobody has touched.
        unsafe {
            if libc::munlock(ptr, len) != 0
                || libc::mprotect(ptr, len, libc::PROT_READ | libc::PROT_WRITE) != 0
            {
                let e = SysError::last("munlock/mprotect", aligned, len);
                libc::munmap(ptr, len);
                return Err(e);
            }
        }
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

    /// Gives `advice` for the subrange `[addr, addr + len)`, which must lie
    /// inside the mapping.
    pub fn advise(&self, addr: usize, len: usize, advice: Advice) -> Result<(), SysError> {
        if !self.contains(addr, len) {
            return Err(SysError {
                op: advice.name(),
                addr,
                len,
                errno: libc::EINVAL,
            });
        }
        // SAFETY: the range lies inside a mapping we own, and none of these
        // advices changes the content of memory.
        let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice.raw()) };
        if rc != 0 {
            return Err(SysError::last(advice.name(), addr, len));
        }
        Ok(())
    }

    /// Binds `[addr, addr + len)` (inside the mapping) to NUMA node `node`
    /// (`mbind(MPOL_BIND)`): pages populated there afterwards come from that
    /// node. Call before populating; pages already there are not moved.
    pub fn bind_node(&self, addr: usize, len: usize, node: u32) -> Result<(), SysError> {
        const MPOL_BIND: libc::c_long = 2;
        let einval = SysError {
            op: "mbind",
            addr,
            len,
            errno: libc::EINVAL,
        };
        if !self.contains(addr, len) || node >= 64 {
            return Err(einval);
        }
        let mask: u64 = 1 << node;
        // SAFETY: the range lies inside a mapping we own; `mask` is a valid
        // one-word node mask that outlives the call (maxnode = 64 bits), and
        // a memory policy never changes the content of memory.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                addr,
                len,
                MPOL_BIND,
                &mask as *const u64,
                64usize,
                0usize,
            )
        };
        if rc != 0 {
            return Err(SysError::last("mbind", addr, len));
        }
        Ok(())
    }

    /// Whether every page of `[addr, addr + len)` is mapped in the page
    /// tables right now (`mincore(2)`; `len` at most 64 pages).
    pub fn is_resident(&self, addr: usize, len: usize) -> Result<bool, SysError> {
        let mut vec = [0u8; 64];
        let pages = len.div_ceil(PAGE_SIZE);
        if !self.contains(addr, len) || pages > vec.len() {
            return Err(SysError {
                op: "mincore",
                addr,
                len,
                errno: libc::EINVAL,
            });
        }
        // SAFETY: the range lies inside our mapping and `vec` has room for
        // one byte per page of it.
        let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(SysError::last("mincore", addr, len));
        }
        Ok(vec[..pages].iter().all(|b| b & 1 == 1))
    }

    /// `MADV_DONTNEED` on `[addr, addr + len)`: drops the pages there (a
    /// later touch reads zeros, or faults to userfaultfd on a registered
    /// range) and, with `CONFIG_PT_RECLAIM`, frees page tables left empty.
    ///
    /// # Safety
    /// The range must lie inside the mapping, and no live Rust reference may
    /// point into it: its bytes change without a write through any reference.
    pub unsafe fn discard(&self, addr: usize, len: usize) -> Result<(), SysError> {
        if !self.contains(addr, len) {
            return Err(SysError {
                op: "madvise(MADV_DONTNEED)",
                addr,
                len,
                errno: libc::EINVAL,
            });
        }
        // SAFETY: inside our mapping (checked above); the caller guarantees
        // no reference observes the discarded bytes.
        let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(SysError::last("madvise(MADV_DONTNEED)", addr, len));
        }
        Ok(())
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
    fn bind_to_an_online_node() {
        let m = Mapping::anonymous(HUGE_PAGE_SIZE, HUGE_PAGE_SIZE).expect("mmap");
        let node = crate::host::numa_nodes()[0];
        m.bind_node(m.addr(), m.len(), node).expect("mbind");
        m.advise(m.addr(), m.len(), Advice::PopulateWrite)
            .expect("populate");
        assert!(m.is_resident(m.addr(), PAGE_SIZE).expect("mincore"));
        assert_eq!(
            m.bind_node(m.addr(), m.len(), 63).map_err(|e| e.op),
            Err("mbind"),
            "node 63 is not online here"
        );
    }

    #[test]
    fn pagemap_sees_which_pages_hold_data() {
        let m = Mapping::anonymous(HUGE_PAGE_SIZE, HUGE_PAGE_SIZE).expect("mmap");
        let pm = PageMap::open().expect("pagemap");
        let a = m.addr();
        assert!(!pm.any_data(a, a + HUGE_PAGE_SIZE).expect("scan"));
        // SAFETY: a page of our own fresh mapping, no references into it.
        unsafe { ((a + 5 * PAGE_SIZE) as *mut u8).write_volatile(1) };
        assert!(pm.any_data(a, a + HUGE_PAGE_SIZE).expect("scan"));
        assert!(!pm.any_data(a, a + 5 * PAGE_SIZE).expect("scan"));
        let mut v = Vec::new();
        pm.has_data(a, 8, &mut v).expect("read");
        assert_eq!(v, [false, false, false, false, false, true, false, false]);
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

/// `/proc/self/pagemap`, for `PAGEMAP_SCAN` (Linux 6.7): which pages of a
/// range were written since they were last write-protected (with
/// `UFFD_FEATURE_WP_ASYNC`), optionally write-protecting them again in the
/// same walk.
#[derive(Debug)]
pub struct PageMap {
    file: std::fs::File,
}

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
#[derive(Debug, Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | ((b'f' as u64) << 8) | 16;
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_WRITTEN: u64 = 1 << 1;
const PAGE_IS_HUGE: u64 = 1 << 6;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_SWAPPED: u64 = 1 << 4;

impl PageMap {
    /// Opens this process's pagemap.
    pub fn open() -> Result<PageMap, SysError> {
        std::fs::File::open("/proc/self/pagemap")
            .map(|file| PageMap { file })
            .map_err(|e| SysError {
                op: "open(/proc/self/pagemap)",
                addr: 0,
                len: 0,
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            })
    }

    /// The written page ranges of `[start, end)`, appended to `out` as
    /// `(start, end)`; with `reprotect`, those pages are write-protected again
    /// in the same walk (so no write between the scan and the protection is
    /// missed).
    pub fn written(
        &self,
        start: usize,
        end: usize,
        reprotect: bool,
        out: &mut Vec<(usize, usize)>,
    ) -> Result<(), SysError> {
        let flags = PM_SCAN_CHECK_WPASYNC | if reprotect { PM_SCAN_WP_MATCHING } else { 0 };
        self.scan(start, end, flags, PAGE_IS_WRITTEN, out)
    }

    /// Whether each 4 KiB page of `[addr, addr + pages * 4096)` holds data
    /// in the page tables right now: mapped (`PM_PRESENT`) or in swap or
    /// under migration (`PM_SWAP`, which pagemap also reports for a page the
    /// kernel is migrating). Unlike `mincore`, a swapped-out page counts: its
    /// data is still the program's. Results go to `out` (cleared first), one
    /// per page. The kernel takes each page table's lock to read it, so an
    /// entry is never seen half-changed by a concurrent `UFFDIO_MOVE`.
    pub fn has_data(&self, addr: usize, pages: usize, out: &mut Vec<bool>) -> Result<(), SysError> {
        use std::os::unix::fs::FileExt;
        const PM_PRESENT: u64 = 1 << 63;
        const PM_SWAP: u64 = 1 << 62;
        out.clear();
        let mut buf = [0u8; 8 * 512];
        let mut done = 0;
        while done < pages {
            let n = (pages - done).min(512);
            let at = addr + done * PAGE_SIZE;
            let off = (at / PAGE_SIZE * 8) as u64;
            let bytes = &mut buf[..n * 8];
            self.file.read_exact_at(bytes, off).map_err(|e| SysError {
                op: "pread(/proc/self/pagemap)",
                addr: at,
                len: n * PAGE_SIZE,
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            })?;
            out.extend(bytes.chunks_exact(8).map(|c| {
                let mut e = [0u8; 8];
                e.copy_from_slice(c);
                u64::from_ne_bytes(e) & (PM_PRESENT | PM_SWAP) != 0
            }));
            done += n;
        }
        Ok(())
    }

    /// Whether any page of `[start, end)` holds data (present, or swapped
    /// out): one `PAGEMAP_SCAN` that stops at the first such page — cheaper
    /// than reading every entry when the answer is usually no.
    pub fn any_data(&self, start: usize, end: usize) -> Result<bool, SysError> {
        use std::os::fd::AsRawFd;
        let mut buf = [PageRegion::default(); 1];
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: start as u64,
            end: end as u64,
            vec: buf.as_mut_ptr() as u64,
            vec_len: 1,
            max_pages: 1,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            ..PmScanArg::default()
        };
        // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most one PageRegion
        // into `buf`, plus `walk_end` in `arg`; it changes nothing.
        let n = unsafe { libc::ioctl(self.file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            return Err(SysError::last("PAGEMAP_SCAN", start, end - start));
        }
        Ok(n > 0)
    }

    /// Bytes of `[start, end)` mapped by huge (PMD) page-table entries.
    pub fn huge_bytes(&self, start: usize, end: usize) -> Result<usize, SysError> {
        let mut out = Vec::new();
        self.scan(start, end, 0, PAGE_IS_HUGE, &mut out)?;
        Ok(out.iter().map(|(a, b)| b - a).sum())
    }

    fn scan(
        &self,
        start: usize,
        end: usize,
        flags: u64,
        category: u64,
        out: &mut Vec<(usize, usize)>,
    ) -> Result<(), SysError> {
        use std::os::fd::AsRawFd;
        let mut buf = [PageRegion::default(); 64];
        let mut at = start;
        while at < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags,
                start: at as u64,
                end: end as u64,
                vec: buf.as_mut_ptr() as u64,
                vec_len: buf.len() as u64,
                category_mask: category,
                return_mask: category,
                ..PmScanArg::default()
            };
            // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most `vec_len`
            // PageRegion entries into `buf`, plus `walk_end` in `arg`; with
            // WP_MATCHING it only changes write protection, not data.
            let n = unsafe { libc::ioctl(self.file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
            if n < 0 {
                return Err(SysError::last("PAGEMAP_SCAN", at, end - at));
            }
            out.extend(
                buf[..n as usize]
                    .iter()
                    .map(|r| (r.start as usize, r.end as usize)),
            );
            let walked = arg.walk_end as usize;
            if walked <= at {
                break;
            }
            at = walked;
        }
        Ok(())
    }
}
