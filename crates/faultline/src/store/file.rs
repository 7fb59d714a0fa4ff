//! The file store: a region backed by a byte range of a file. Pages move
//! between the file and their frames with direct I/O (`O_DIRECT` `pread` /
//! `pwrite` straight into and out of the frame: read once, never copied
//! through the page cache, which would count against the program's memory)
//! where the file system has it and the transfer is 4 KiB aligned, and with
//! buffered `pread`/`pwrite` otherwise (then read-ahead hints go to the
//! kernel, `posix_fadvise(WILLNEED)`). A long direct read (a read-ahead
//! run) lands in a huge page first and is copied into its frames from
//! there (`staging.rs`: one scatter segment instead of hundreds), a page
//! at a time, each handed to [`Store::read_pages_each`]'s caller right
//! after its copy, while it is in the cache. A
//! thread waiting for a short direct read (a fault's page) polls for its
//! completion on its own `io_uring` for up to [`FileOptions::poll`] before
//! it sleeps (`faultline_sys::io`); long reads sleep at once. `fsync`
//! makes writes durable. The kernel keeps the two paths coherent (a direct
//! read writes back dirty cached pages of its range first; a direct write
//! drops them). Its identity (device and inode) lets the manager refuse two
//! writable regions over one range, and its file ([`Store::file`]) lets it
//! refuse a range that another manager or process maps (`exclusive.rs`).
//! Locks: only a staging half's, tried (the kernel orders concurrent
//! `pread`/`pwrite` on one file).

use super::file_options::FileOptions;
use super::staging::Staging;
use super::{Store, StoreError};
use std::time::Duration;

/// A region backed by `[offset, offset + region length)` of a file.
///
/// Page `p` of a region with page size `ps` is the file's bytes
/// `[offset + p * ps, offset + (p + 1) * ps)`. Reads past the end of the file
/// return zeros (a file shorter than its region reads as if zero-padded).
/// A write there extends the file to the end of that page: `pwrite` past the
/// end grows the file, and the gap before it, if any, reads as zeros.
/// `flush` is `fsync`: durable when it returns. A read-only store refuses
/// writes, so a read-only region never changes its file.
#[derive(Debug)]
pub struct File {
    file: std::fs::File,
    /// The same file, opened again with `O_DIRECT`: `Some` when asked for
    /// and the file system has it.
    direct: Option<std::fs::File>,
    offset: u64,
    writable: bool,
    identity: u64,
    /// Where long direct reads land before their frames
    /// ([`FileOptions::staged`]); `None` when off.
    staging: Option<Staging>,
    /// [`FileOptions::poll`].
    poll: Duration,
}

/// The alignment of every direct transfer: buffer, file offset and length
/// (the largest logical block size of common devices).
const DIRECT_ALIGN: usize = 4096;

/// The longest direct read that is polled (see [`File::spin`]).
const POLL_MAX: usize = 32 << 10;

/// The most consecutive pages written with one vectored write
/// ([`Store::write_pages`]): 1 MiB of 4 KiB pages, well under `IOV_MAX`.
const RUN_MAX_PAGES: usize = 256;

impl File {
    /// Opens `path` with `opts`.
    ///
    /// # Errors
    /// The `open(2)` error (`ENOENT`, `EACCES`, ...).
    pub fn open(path: impl AsRef<std::path::Path>, opts: FileOptions) -> std::io::Result<File> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(opts.writable)
            .open(path)?;
        Ok(Self::from_file(file, opts))
    }

    /// Wraps an open file (which must be readable, and writable if
    /// `opts.writable`). With `opts.direct`, the file is opened a second
    /// time with `O_DIRECT` (the flags of `file` stay as they are).
    pub fn from_file(file: std::fs::File, opts: FileOptions) -> File {
        let FileOptions {
            offset,
            writable,
            direct,
            staged,
            poll,
        } = opts;
        let direct = direct
            .then(|| faultline_sys::host::reopen_direct(&file, writable).ok())
            .flatten();
        if direct.is_some() && !poll.is_zero() {
            faultline_sys::io::prepare_polling();
        }
        use std::os::unix::fs::MetadataExt;
        // The object's identity: device and inode, mixed into one word.
        let identity = file
            .metadata()
            .map(|m| m.dev().rotate_left(32) ^ m.ino().wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .unwrap_or(0);
        File {
            file,
            direct,
            offset,
            writable,
            identity,
            staging: staged.then(Staging::default),
            poll,
        }
    }

    /// The byte offset of `page` (pages of `len` bytes) in the file. Cannot
    /// overflow for a page of a region: `Manager::map` refuses a region
    /// whose offset plus length overflows; saturates otherwise (a read there
    /// gets zeros, a write an error from the kernel).
    /// `op` (a write of some kind) is refused on a read-only file.
    fn must_write(&self, op: &'static str) -> Result<(), StoreError> {
        if self.writable {
            return Ok(());
        }
        Err(StoreError::Unsupported {
            store: "read-only file",
            op,
        })
    }

    fn at(&self, page: u64, len: usize) -> u64 {
        page.saturating_mul(len as u64).saturating_add(self.offset)
    }

    /// How long a direct read of `len` bytes is polled for: a short read
    /// (a fault's page, a read-ahead run's first windows) by
    /// [`FileOptions::poll`]; a long one (a read-ahead run, read while the
    /// program works on the previous one) not at all.
    fn spin(&self, len: usize) -> Duration {
        if len <= POLL_MAX {
            self.poll
        } else {
            Duration::ZERO
        }
    }

    /// Whether pages move with direct I/O (see [`FileOptions::direct`]).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The direct fd, if a transfer of `len` bytes at byte `at` from or to
    /// `ptr` may use it.
    fn direct_for(&self, at: u64, ptr: *const u8, len: usize) -> Option<&std::fs::File> {
        let aligned = at % DIRECT_ALIGN as u64 == 0
            && len % DIRECT_ALIGN == 0
            && (ptr as usize) % DIRECT_ALIGN == 0;
        self.direct.as_ref().filter(|_| aligned)
    }

    /// Reads into `buf` from byte `at`; zeros past the end of the file.
    /// Direct where it may be, buffered for the rest (a direct read that
    /// the kernel refuses part-way, `EINVAL` after a short read, is
    /// finished buffered). `page` names the first page, for errors. Each
    /// page of `page_size` bytes goes to `landed` once its bytes are final
    /// ([`Store::read_pages_each`]): a staged page as soon as it is copied
    /// into `buf`, the others at the end.
    fn read_at(
        &self,
        page: u64,
        at: u64,
        buf: &mut [u8],
        page_size: usize,
        landed: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        if buf.is_empty() {
            return Ok(());
        }
        // A page size of 0 (no caller of faultline's passes one): the
        // buffer is one page.
        let page_size = if page_size == 0 { buf.len() } else { page_size };
        let (mut done, mut eof) = (0, false);
        // Pages already handed to `landed`, from the first.
        let mut handed = 0;
        if let Some(d) = self.direct_for(at, buf.as_ptr(), buf.len()) {
            let spin = Some(self.spin(buf.len()));
            let half = self.staging.as_ref().and_then(|s| s.take(buf.len()));
            (done, eof) = match half {
                Some(mut half) => {
                    let staged = half.bytes();
                    let (n, eof) = pread_all(d, page, at, staged, spin)?;
                    // A page at a time, each handed over while its bytes
                    // are in the cache the copy left them in.
                    let whole = n / page_size * page_size;
                    let pages = buf[..whole].chunks_mut(page_size);
                    for (i, (to, from)) in pages.zip(staged.chunks(page_size)).enumerate() {
                        to.copy_from_slice(from);
                        landed(i, to);
                    }
                    handed = whole / page_size;
                    buf[whole..n].copy_from_slice(&staged[whole..n]);
                    (n, eof)
                }
                None => pread_all(d, page, at, buf, spin)?,
            };
        }
        if !eof && done < buf.len() {
            done += pread_all(&self.file, page, at + done as u64, &mut buf[done..], None)?.0;
        }
        // Past the end of the file: zeros.
        crate::memops::clear_rep_stosb(&mut buf[done..]);
        for (i, bytes) in buf.chunks(page_size).enumerate().skip(handed) {
            landed(i, bytes);
        }
        Ok(())
    }
}

/// `pread` into `buf` from byte `at` until it is full or the file ends:
/// (bytes read, whether the file ended). `direct` (`Some`, with how long to
/// poll for each read's completion): an `EINVAL` (the kernel refusing this
/// transfer's alignment) stops the loop early instead of failing it.
fn pread_all(
    f: &std::fs::File,
    page: u64,
    at: u64,
    buf: &mut [u8],
    direct: Option<Duration>,
) -> Result<(usize, bool), StoreError> {
    use std::os::fd::AsFd;
    let spin = direct.unwrap_or(Duration::ZERO);
    let mut done = 0;
    while done < buf.len() {
        match faultline_sys::io::read_at(f.as_fd(), &mut buf[done..], at + done as u64, spin) {
            Ok(0) => return Ok((done, true)),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if direct.is_some() && e.raw_os_error() == Some(libc::EINVAL) => {
                return Ok((done, false))
            }
            Err(source) => {
                return Err(StoreError::Io {
                    op: "read",
                    page,
                    source,
                })
            }
        }
    }
    Ok((done, false))
}

impl Store for File {
    fn name(&self) -> &'static str {
        "file"
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn read_pages(&self, first: u64, page_size: usize, buf: &mut [u8]) -> Result<(), StoreError> {
        self.read_pages_each(first, page_size, buf, &mut |_, _| {})
    }

    fn read_pages_each(
        &self,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
        landed: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        self.read_at(first, self.at(first, page_size), buf, page_size, landed)
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let (at, len) = (self.at(page, buf.len()), buf.len());
        self.read_at(page, at, buf, len, &mut |_, _| {})
    }

    fn will_read(&self, first: u64, pages: usize, page_size: usize) {
        // Direct reads never look in the page cache: filling it would only
        // cost memory and device time.
        if self.direct.is_some() {
            return;
        }
        // Best effort: a hint that fails changes nothing but speed.
        let _ = faultline_sys::host::file_willneed(
            &self.file,
            self.at(first, page_size),
            pages * page_size,
        );
    }

    fn discard(&self, first: u64, pages: u64, page_size: usize) -> Result<(), StoreError> {
        self.must_write("discard")?;
        let len = pages.saturating_mul(page_size as u64);
        match faultline_sys::host::punch_hole(&self.file, self.at(first, page_size), len) {
            Ok(()) => Ok(()),
            // No holes on this file system: write zeros.
            Err(e) if e.errno == libc::EOPNOTSUPP => {
                super::write_zero_pages(self, first, pages, page_size)
            }
            Err(e) => Err(StoreError::Io {
                op: "discard",
                page: first,
                source: std::io::Error::from_raw_os_error(e.errno),
            }),
        }
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        use std::os::unix::fs::FileExt;
        self.must_write("write")?;
        let at = self.at(page, buf.len());
        if let Some(d) = self.direct_for(at, buf.as_ptr(), buf.len()) {
            match d.write_all_at(buf, at) {
                // Refused alignment: the buffered write below (rewriting
                // whatever part went through is harmless).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                result => {
                    return result.map_err(|source| StoreError::Io {
                        op: "write",
                        page,
                        source,
                    })
                }
            }
        }
        self.file
            .write_all_at(buf, at)
            .map_err(|source| StoreError::Io {
                op: "write",
                page,
                source,
            })
    }

    /// Pages all in flight at once where they go direct
    /// (`faultline_sys::io::write_many`): a device takes many writes in
    /// flight faster than one at a time, and consecutive pages go as one
    /// vectored write (up to 1 MiB), as the kernel merges a
    /// run of dirty pages into one request. A page that cannot go direct,
    /// or whose write comes back short or refused, is written alone by
    /// [`Store::write`] (direct, or buffered where the kernel refuses the
    /// alignment); every page is tried, and the first error is returned.
    fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        use std::io::IoSlice;
        use std::os::fd::AsFd;
        self.must_write("write")?;
        let mut alone: Vec<usize> = Vec::new();
        if let Some(d) = self.direct.as_ref().filter(|_| pages.len() > 1) {
            let direct = |&(page, buf): &(u64, &[u8])| {
                self.direct_for(self.at(page, buf.len()), buf.as_ptr(), buf.len())
                    .is_some()
            };
            // Runs of consecutive direct pages, as index ranges of `pages`.
            let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
            for (i, p) in pages.iter().enumerate() {
                if !direct(p) {
                    alone.push(i);
                    continue;
                }
                match runs.last_mut() {
                    Some(run)
                        if run.end == i
                            && pages[i - 1].0 + 1 == p.0
                            && run.len() < RUN_MAX_PAGES =>
                    {
                        run.end += 1
                    }
                    _ => runs.push(i..i + 1),
                }
            }
            let slices: Vec<IoSlice<'_>> = pages.iter().map(|&(_, b)| IoSlice::new(b)).collect();
            let writes: Vec<(u64, &[IoSlice<'_>])> = runs
                .iter()
                .map(|r| {
                    (
                        self.at(pages[r.start].0, pages[r.start].1.len()),
                        &slices[r.clone()],
                    )
                })
                .collect();
            let done = faultline_sys::io::write_many(d.as_fd(), &writes);
            for (run, d) in runs.into_iter().zip(&done) {
                let len: usize = pages[run.clone()].iter().map(|p| p.1.len()).sum();
                if d.as_ref().ok() != Some(&len) {
                    alone.extend(run);
                }
            }
        } else {
            alone.extend(0..pages.len());
        }
        let mut first_err = None;
        for i in alone {
            if let Err(e) = self.write(pages[i].0, pages[i].1) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn flush(&self) -> Result<(), StoreError> {
        if !self.writable {
            return Ok(());
        }
        self.file.sync_all().map_err(|source| StoreError::Io {
            op: "flush",
            page: 0,
            source,
        })
    }

    fn identity(&self) -> Option<(u64, u64)> {
        Some((self.identity, self.offset))
    }

    fn file(&self) -> Option<&std::fs::File> {
        Some(&self.file)
    }

    fn own_memory(&self) -> usize {
        self.staging.as_ref().map_or(0, Staging::bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_reads_zeros_past_the_end_and_writes_back() {
        let dir = std::env::temp_dir().join(format!("faultline-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        std::fs::write(&path, vec![7u8; 4096 + 100]).expect("write");
        let f = File::open(&path, FileOptions::new().writable(true)).expect("open");
        let mut buf = vec![1u8; 4096];
        f.read(1, &mut buf).expect("read");
        assert!(buf[..100].iter().all(|&b| b == 7));
        assert!(buf[100..].iter().all(|&b| b == 0), "zeros past the end");
        f.write(2, &[9u8; 4096]).expect("write past the end");
        f.flush().expect("fsync");
        let bytes = std::fs::read(&path).expect("read back");
        assert_eq!(bytes.len(), 3 * 4096, "the write extended the file");
        assert!(bytes[4096 + 100..2 * 4096].iter().all(|&b| b == 0));
        assert!(bytes[2 * 4096..].iter().all(|&b| b == 9));
        let ro = File::open(&path, FileOptions::new().offset(4096)).expect("open ro");
        assert!(ro.write(0, &buf).is_err());
        let (id_rw, _) = f.identity().expect("id");
        assert_eq!(ro.identity(), Some((id_rw, 4096)), "same file, same object");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Page-aligned buffers (direct I/O needs them), one per page.
    fn aligned_pages(n: usize) -> faultline_sys::mem::Mapping {
        faultline_sys::mem::Mapping::anonymous(n * 4096, 4096).expect("mmap")
    }

    #[test]
    fn write_pages_lands_runs_scattered_and_unaligned_pages() {
        let dir = std::env::temp_dir().join(format!("faultline-wp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        std::fs::write(&path, vec![0u8; 600 * 4096]).expect("create");
        for direct in [true, false] {
            let opts = FileOptions::new().writable(true).direct(direct);
            let f = File::open(&path, opts).expect("open");
            // A run longer than one vectored write, scattered pages, and
            // one buffer that is not page-aligned (written alone).
            let picked: Vec<u64> = (10..10 + RUN_MAX_PAGES as u64 + 20)
                .chain([400, 402, 403, 599])
                .collect();
            let m = aligned_pages(picked.len() + 1);
            // SAFETY: the mapping is this test's own, live for the test.
            let all = unsafe { std::slice::from_raw_parts_mut(m.addr() as *mut u8, m.len()) };
            for (i, &p) in picked.iter().enumerate() {
                all[i * 4096..(i + 1) * 4096].fill(p as u8 ^ direct as u8);
            }
            let mut pages: Vec<(u64, &[u8])> = picked
                .iter()
                .enumerate()
                .map(|(i, &p)| (p, &all[i * 4096..(i + 1) * 4096]))
                .collect();
            let odd = vec![0xAB ^ direct as u8; 4096];
            pages.push((598, &odd[..]));
            pages.sort_by_key(|p| p.0);
            f.write_pages(&pages).expect("write_pages");
            let back = std::fs::read(&path).expect("read back");
            for &(p, bytes) in &pages {
                let at = p as usize * 4096;
                assert!(back[at..at + 4096] == *bytes, "page {p}, direct {direct}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `read_pages_each` hands over every page once, in order, with its
    /// final bytes — staged or not, direct or buffered, and across the end
    /// of the file (a page cut by it, zeros after); an empty read hands
    /// over nothing.
    #[test]
    fn read_pages_each_hands_over_each_page_with_its_final_bytes() {
        let dir = std::env::temp_dir().join(format!("faultline-each-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        let len = 300 * 4096 + 100;
        let content: Vec<u8> = (0..len).map(|i| (i / 4096 * 31 + i % 251) as u8).collect();
        std::fs::write(&path, &content).expect("write");
        let expected = |page: usize| -> Vec<u8> {
            (page * 4096..(page + 1) * 4096)
                .map(|i| content.get(i).copied().unwrap_or(0))
                .collect()
        };
        let m = aligned_pages(256);
        for (direct, staged) in [(true, true), (true, false), (false, false)] {
            let opts = FileOptions::new().direct(direct).staged(staged);
            let f = File::open(&path, opts).expect("open");
            // A staged run across the end of the file, a staged run
            // inside it, and one page.
            for (first, n) in [(100usize, 256usize), (0, 64), (299, 1), (300, 1)] {
                // SAFETY: the mapping is this test's own, live for the test.
                let buf = unsafe { std::slice::from_raw_parts_mut(m.addr() as *mut u8, n * 4096) };
                buf.fill(0xEE);
                let mut seen = Vec::new();
                f.read_pages_each(first as u64, 4096, buf, &mut |i, page| {
                    seen.push((i, crate::dirty::fingerprint(page)));
                })
                .expect("read");
                let want: Vec<_> = (0..n)
                    .map(|i| (i, crate::dirty::fingerprint(&expected(first + i))))
                    .collect();
                let case = format!("direct {direct}, staged {staged}, pages {first}+{n}");
                assert!(seen == want, "{case}: pages handed over");
                // Staged only where huge pages and direct I/O can be had
                // (elsewhere the same checks ran on unstaged reads).
                if staged && n > 1 && f.is_direct() && faultline_sys::host::thp_mode().usable() {
                    assert!(f.own_memory() > 0, "{case}: the run was not staged");
                }
                for i in 0..n {
                    assert!(
                        buf[i * 4096..][..4096] == expected(first + i),
                        "{case}: page {i}"
                    );
                }
            }
            let mut none = true;
            f.read_pages_each(0, 4096, &mut [], &mut |_, _| none = false)
                .expect("an empty read");
            f.read(0, &mut []).expect("an empty read");
            assert!(none, "an empty read handed a page over");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Any ascending set of pages, some in page-aligned buffers and
        /// some not, lands as an oracle of plain writes says.
        #[test]
        fn write_pages_matches_page_by_page_writes(
            picks in proptest::collection::btree_map(
                0u64..300,
                (proptest::prelude::any::<u8>(), proptest::prelude::any::<bool>()),
                1..120,
            ),
        ) {
            let dir = std::env::temp_dir().join(format!(
                "faultline-wpp-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::create_dir_all(&dir).expect("dir");
            let path = dir.join("f");
            std::fs::write(&path, vec![0u8; 300 * 4096]).expect("create");
            let f = File::open(&path, FileOptions::new().writable(true)).expect("open");
            let m = aligned_pages(picks.len());
            // SAFETY: the mapping is this case's own, live for the case.
            let all = unsafe { std::slice::from_raw_parts_mut(m.addr() as *mut u8, m.len()) };
            // Unaligned buffers: one byte into a heap allocation.
            let mut heap = vec![0u8; picks.len() * 4096 + 1];
            let mut oracle = vec![0u8; 300 * 4096];
            let mut pages: Vec<(u64, &[u8])> = Vec::new();
            let (mut aligned, mut unaligned) = (&mut all[..], &mut heap[1..]);
            for (&page, &(byte, is_aligned)) in &picks {
                let src = if is_aligned { &mut aligned } else { &mut unaligned };
                let (buf, rest) = std::mem::take(src).split_at_mut(4096);
                *src = rest;
                buf.fill(byte);
                oracle[page as usize * 4096..][..4096].fill(byte);
                pages.push((page, &*buf));
            }
            f.write_pages(&pages).expect("write_pages");
            let back = std::fs::read(&path).expect("read back");
            let _ = std::fs::remove_dir_all(&dir);
            proptest::prop_assert!(back == oracle);
        }
    }
}
