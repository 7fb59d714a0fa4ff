//! The store of a private writable mapping (`MAP_PRIVATE` with
//! `PROT_WRITE`): the program's writes never reach its file. A page reads
//! the file until the program's version of it is evicted; from then on it
//! reads that version from an overlay — an unlinked file of the preload's
//! own in `FAULTLINE_PRIVATE_DIR` (default `/var/tmp`: a disk, as swap
//! would be; not `/dev/shm`, whose pages are memory), sparse, one page per
//! page of the mapping. A bitmap says which pages the overlay holds.
//!
//! The overlay outlives the region: `mremap` growing a private mapping
//! makes a new region over the same overlay, so no private page is lost.
//! `madvise(DONTNEED)` forgets the dropped pages' private versions
//! ([`PrivateBacking::forget`]), as the kernel does. Over no file, it is
//! an anonymous mapping's store: zeros until a page was evicted
//! (`anonymous.rs`).
//!
//! Invariant: a page's bit is set only after its overlay write completed
//! (Release; a read loads it with Acquire), and reads and writes of one
//! page are serialized by its fault lock. Locks: none of its own.

use crate::program_file::ProgramFile;
use crate::reentry::inside;
use faultline::store::{File, FileOptions};
use faultline::{Store, StoreError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The overlay and its bitmap, shared by the regions of one private
/// mapping (before and after an `mremap`).
#[derive(Debug)]
pub(crate) struct PrivateBacking {
    overlay: File,
    /// Bit `p`: the overlay holds page `p`.
    held: Vec<AtomicU64>,
}

impl PrivateBacking {
    /// An overlay for a mapping of up to `pages` pages (grows as needed:
    /// see [`PrivateBacking::with_room`]).
    pub(crate) fn new(pages: usize) -> std::io::Result<PrivateBacking> {
        let dir = std::env::var_os("FAULTLINE_PRIVATE_DIR").unwrap_or_else(|| "/var/tmp".into());
        let file = inside(|| {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
                .open(&dir)
        })?;
        let opts = FileOptions::new().writable(true);
        Ok(PrivateBacking {
            overlay: inside(|| File::from_file(file, opts)),
            held: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// This backing, or a copy with room for `pages` (the bits carried
    /// over; the overlay file is shared: it grows by itself).
    pub(crate) fn with_room(
        self: &Arc<Self>,
        pages: usize,
    ) -> std::io::Result<Arc<PrivateBacking>> {
        if pages.div_ceil(64) <= self.held.len() {
            return Ok(self.clone());
        }
        let file = self
            .overlay
            .file()
            .ok_or_else(|| std::io::Error::other("the overlay has no file"))?
            .try_clone()?;
        let held = (0..pages.div_ceil(64))
            .map(|i| AtomicU64::new(self.held.get(i).map_or(0, |w| w.load(Ordering::Acquire))))
            .collect();
        Ok(Arc::new(PrivateBacking {
            overlay: inside(|| File::from_file(file, FileOptions::new().writable(true))),
            held,
        }))
    }

    fn holds(&self, page: u64) -> bool {
        let (w, b) = (page as usize / 64, page % 64);
        // Acquire: pairs with the Release in `mark`, so the overlay write
        // is complete before the page is read from it.
        self.held
            .get(w)
            .is_some_and(|x| x.load(Ordering::Acquire) & (1 << b) != 0)
    }

    fn mark(&self, page: u64) {
        if let Some(x) = self.held.get(page as usize / 64) {
            // Release: pairs with the Acquire in `holds`.
            x.fetch_or(1 << (page % 64), Ordering::Release);
        }
    }

    /// Forgets the private versions of pages `pages` (they read the file
    /// again).
    pub(crate) fn forget(&self, pages: std::ops::Range<u64>) {
        for p in pages {
            if let Some(x) = self.held.get(p as usize / 64) {
                // Release: as `mark`.
                x.fetch_and(!(1 << (p % 64)), Ordering::Release);
            }
        }
    }
}

/// A private writable mapping's store: the file, read-only, under the
/// overlay; or zeros under it (an anonymous mapping: `anonymous.rs`).
#[derive(Debug)]
pub(crate) struct PrivateFile {
    file: Option<ProgramFile>,
    backing: Arc<PrivateBacking>,
}

impl PrivateFile {
    /// The overlay over `file` (`None`: over zeros).
    pub(crate) fn new(file: Option<ProgramFile>, backing: Arc<PrivateBacking>) -> PrivateFile {
        PrivateFile { file, backing }
    }
}

impl Store for PrivateFile {
    fn name(&self) -> &'static str {
        "private file (preload)"
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if self.backing.holds(page) {
            return inside(|| self.backing.overlay.read(page, buf));
        }
        match &self.file {
            Some(f) => f.read(page, buf),
            None => {
                buf.fill(0);
                Ok(())
            }
        }
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
        let n = (buf.len() / page_size) as u64;
        if let Some(f) = self
            .file
            .as_ref()
            .filter(|_| !(first..first + n).any(|p| self.backing.holds(p)))
        {
            return f.read_pages_each(first, page_size, buf, landed);
        }
        // Some page is the overlay's: page by page.
        for (i, chunk) in buf.chunks_mut(page_size).enumerate() {
            self.read(first + i as u64, chunk)?;
            landed(i, chunk);
        }
        Ok(())
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        inside(|| self.backing.overlay.write(page, buf))?;
        self.backing.mark(page);
        Ok(())
    }

    fn discard(&self, first: u64, pages: u64, page_size: usize) -> Result<(), StoreError> {
        let zero = vec![0u8; page_size];
        for p in first..first + pages {
            self.write(p, &zero)?;
        }
        Ok(())
    }

    /// Nothing to make durable: a private mapping's writes are the
    /// process's alone.
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn will_read(&self, first: u64, pages: usize, page_size: usize) {
        if let Some(f) = &self.file {
            f.will_read(first, pages, page_size);
        }
    }
}
