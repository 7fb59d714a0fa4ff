//! [`PageMap`]: this process's `/proc/self/pagemap`, read entry by entry
//! (`pread`) or walked with the `PAGEMAP_SCAN` ioctl (Linux 6.7): which pages
//! hold data, which were written since they were last write-protected, and
//! how much of a range is mapped by huge pages; and from `/proc/self/maps`,
//! the protection of the mapping holding an address ([`protection_at`]).
//!
//! Invariants: `PmScanArg` and `PageRegion` have the kernel's layout
//! (`include/uapi/linux/fs.h`), and `PAGEMAP_SCAN` encodes the size of
//! `PmScanArg`. Reads change nothing; a scan with `PM_SCAN_WP_MATCHING`
//! changes only write protection, never data. No locks of ours: the kernel
//! takes each page table's lock while it reads it.

use crate::{SysError, PAGE_SIZE};

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

/// A pagemap entry's bits (`Documentation/admin-guide/mm/pagemap.rst`).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAP: u64 = 1 << 62;
const PM_MMAP_EXCLUSIVE: u64 = 1 << 56;

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
        self.entries(addr, pages, out, |e| e & (PM_PRESENT | PM_SWAP) != 0)
    }

    /// Whether each 4 KiB page of `[addr, addr + pages * 4096)` is mapped
    /// and shared with another mapping (present without
    /// `PM_MMAP_EXCLUSIVE`): copy-on-write with a child of `fork()` that
    /// inherited it, which `UFFDIO_MOVE` refuses (`EBUSY`) for as long as
    /// the other holder lives. Results go to `out` (cleared first).
    pub fn shared(&self, addr: usize, pages: usize, out: &mut Vec<bool>) -> Result<(), SysError> {
        self.entries(addr, pages, out, |e| {
            e & PM_PRESENT != 0 && e & PM_MMAP_EXCLUSIVE == 0
        })
    }

    /// `test` of each page's pagemap entry, for the pages of `[addr, addr +
    /// pages * 4096)`, into `out` (cleared first).
    fn entries(
        &self,
        addr: usize,
        pages: usize,
        out: &mut Vec<bool>,
        test: impl Fn(u64) -> bool,
    ) -> Result<(), SysError> {
        use std::os::unix::fs::FileExt;
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
                test(u64::from_ne_bytes(e))
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

/// The protection of the mapping holding `addr`, as `/proc/self/maps`
/// gives it (`"PROT_NONE"`, `"PROT_READ"`, `"PROT_READ|PROT_WRITE"`, ...),
/// or `None` when nothing is mapped there. Reads the whole file: for error
/// paths (why a page could not be moved), not for hot ones.
///
/// # Errors
/// Reading `/proc/self/maps` failed (`addr` 0: no range concerned).
pub fn protection_at(addr: usize) -> Result<Option<&'static str>, SysError> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| SysError {
        op: "read /proc/self/maps",
        addr: 0,
        len: 0,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    })?;
    Ok(maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let (start, end) = (
            usize::from_str_radix(start, 16).ok()?,
            usize::from_str_radix(end, 16).ok()?,
        );
        let perms = fields.next()?.as_bytes();
        (start..end).contains(&addr).then(|| prot_name(perms))
    }))
}

/// `PROT_*` names for the `rwx` of a `/proc/self/maps` line.
fn prot_name(perms: &[u8]) -> &'static str {
    let bit = |i: usize, c: u8| perms.get(i) == Some(&c);
    match (bit(0, b'r'), bit(1, b'w'), bit(2, b'x')) {
        (false, false, false) => "PROT_NONE",
        (true, false, false) => "PROT_READ",
        (true, true, false) => "PROT_READ|PROT_WRITE",
        (true, false, true) => "PROT_READ|PROT_EXEC",
        (true, true, true) => "PROT_READ|PROT_WRITE|PROT_EXEC",
        (false, true, false) => "PROT_WRITE",
        (false, false, true) => "PROT_EXEC",
        (false, true, true) => "PROT_WRITE|PROT_EXEC",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Mapping;
    use crate::HUGE_PAGE_SIZE;

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
    fn protection_at_reads_what_mprotect_set() {
        let m = Mapping::anonymous(4 * PAGE_SIZE, PAGE_SIZE).expect("mmap");
        let a = m.addr() + PAGE_SIZE;
        // SAFETY: one page of our own mapping, no references into it.
        let rc = unsafe { libc::mprotect(a as *mut libc::c_void, PAGE_SIZE, libc::PROT_NONE) };
        assert_eq!(rc, 0);
        assert_eq!(protection_at(a).expect("maps"), Some("PROT_NONE"));
        assert_eq!(
            protection_at(m.addr()).expect("maps"),
            Some("PROT_READ|PROT_WRITE")
        );
    }
}
