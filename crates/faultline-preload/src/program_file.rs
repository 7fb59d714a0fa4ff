//! The store of a served mapping: faultline's file store over the mapped
//! file range, with the kernel's rules for a mapping that reaches past the
//! end of its file, and every I/O call marked as faultline's own
//! (`reentry.rs`), so the interposed `pwrite`/`pread`/`fsync` pass it
//! straight to libc.
//!
//! The kernel's rule: bytes of a shared mapping past the end of the file
//! never reach the file (they read as zeros, and writes there are lost).
//! faultline's file store would extend the file to the end of a page
//! written back; here a write-back is cut at the file's size *at the time
//! of the write* (a program that grows the file first, with `ftruncate`,
//! then writes through the mapping, keeps every byte).
//!
//! Locks: none of its own (the file store's).

use crate::reentry::inside;
use faultline::store::{File, FileOptions};
use faultline::{Store, StoreError};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A served mapping's file range.
#[derive(Debug)]
pub(crate) struct ProgramFile {
    inner: File,
    offset: u64,
    /// Set once the program wrote the file with `write(2)` and its kind
    /// (`coherence.rs`): from then on a page is read from the page cache
    /// where the cache holds it (the program's writes put it there, likely
    /// dirty; a direct read would first wait for the device to write it),
    /// and with direct I/O otherwise.
    program_writes: Arc<AtomicBool>,
}

impl ProgramFile {
    /// The store over `file` (a description of the preload's own) from
    /// byte `offset`, written back if `writable`.
    /// `program_writes` is the mapping's flag (see the field).
    pub(crate) fn new(
        file: std::fs::File,
        offset: u64,
        writable: bool,
        program_writes: Arc<AtomicBool>,
    ) -> ProgramFile {
        let opts = FileOptions::new().offset(offset).writable(writable);
        ProgramFile {
            inner: inside(|| File::from_file(file, opts)),
            offset,
            program_writes,
        }
    }

    /// Fills `buf` with file bytes from `at` from the page cache, if the
    /// program wrote the file and the cache holds all of them.
    fn read_cached(&self, at: u64, buf: &mut [u8]) -> bool {
        // Relaxed: a hint; a page read directly is as correct, only slower.
        if !self.program_writes.load(Ordering::Relaxed) {
            return false;
        }
        let Some(file) = self.inner.file() else {
            return false;
        };
        matches!(faultline_sys::interpose::read_cached(file, buf, at), Ok(n) if n == buf.len())
    }

    /// The file's size now (`page`: the page being written, for the error).
    fn file_size(&self, page: u64) -> Result<u64, StoreError> {
        let file = self.inner.file().ok_or(StoreError::Unsupported {
            store: "preload file",
            op: "size",
        })?;
        file.metadata()
            .map(|m| m.len())
            .map_err(|e| StoreError::Io {
                op: "write",
                page,
                source: e,
            })
    }

    /// Writes page `page` (`buf`, one page) cut at the file's end.
    fn write_cut(&self, page: u64, buf: &[u8], size: u64) -> Result<(), StoreError> {
        let at = self.offset + page * buf.len() as u64;
        if at + buf.len() as u64 <= size {
            return self.inner.write(page, buf);
        }
        if at >= size {
            return Ok(());
        }
        let keep = (size - at) as usize;
        let file = self.inner.file().ok_or(StoreError::Unsupported {
            store: "preload file",
            op: "write",
        })?;
        file.write_all_at(&buf[..keep], at)
            .map_err(|e| StoreError::Io {
                op: "write",
                page,
                source: e,
            })
    }
}

impl Store for ProgramFile {
    fn name(&self) -> &'static str {
        "file (preload)"
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        inside(|| {
            let at = self.offset + page * buf.len() as u64;
            if self.read_cached(at, buf) {
                return Ok(());
            }
            self.inner.read(page, buf)
        })
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
        inside(|| {
            let at = self.offset + first * page_size as u64;
            if self.read_cached(at, buf) {
                buf.chunks(page_size)
                    .enumerate()
                    .for_each(|(i, page)| landed(i, page));
                return Ok(());
            }
            self.inner.read_pages_each(first, page_size, buf, landed)
        })
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        inside(|| self.write_cut(page, buf, self.file_size(page)?))
    }

    fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        inside(|| {
            let size = self.file_size(pages.first().map_or(0, |p| p.0))?;
            let inside_file = pages
                .iter()
                .take_while(|(p, b)| self.offset + (p + 1) * b.len() as u64 <= size)
                .count();
            self.inner.write_pages(&pages[..inside_file])?;
            pages[inside_file..]
                .iter()
                .try_for_each(|&(p, b)| self.write_cut(p, b, size))
        })
    }

    fn discard(&self, first: u64, pages: u64, page_size: usize) -> Result<(), StoreError> {
        inside(|| self.inner.discard(first, pages, page_size))
    }

    fn flush(&self) -> Result<(), StoreError> {
        inside(|| self.inner.flush())
    }

    fn will_read(&self, first: u64, pages: usize, page_size: usize) {
        inside(|| self.inner.will_read(first, pages, page_size))
    }

    fn identity(&self) -> Option<(u64, u64)> {
        self.inner.identity()
    }

    fn file(&self) -> Option<&std::fs::File> {
        self.inner.file()
    }

    fn own_memory(&self) -> usize {
        self.inner.own_memory()
    }
}
