//! Keeps the program's file I/O and the mappings faultline serves telling
//! the same story, as the kernel's page cache does for its own mappings.
//! A served mapping's pages are faultline's copies of file bytes, so:
//!
//! - a **write** (`write`, `pwrite`, `writev`, `pwritev`) to a range a
//!   read-only mapping holds drops those pages *after* the write is in the
//!   file (`Discard::StoreChanged`), and those that were resident are
//!   mapped again at once (the program was using them, and the page cache
//!   its write filled serves them; measured on an SQLite write transaction,
//!   59 MiB through 16 MiB, release: 6.6-6.9 s before, 5.5-6.4 s after).
//!   A fill already under way holds the page's fault lock from before its
//!   read until the page is mapped, and this drop takes the lock of every
//!   page of the range, in use or not, so a page read before the write
//!   cannot be put in place after the drop. (The plain drop, `KeepStore`,
//!   looks at pages in use only: the coherence oracle caught a fill in
//!   flight slipping past it, under two busy loops.)
//! - a write to a range a writable mapping holds goes into the mapping
//!   *first* (faulting its pages in), then to the file: the mapping's
//!   write-back, whenever it comes, writes the new bytes, never older ones
//!   over them (a write-back in flight takes the page out of the region,
//!   so the copy into it waits for the write-back to finish).
//! - a **read** (`read`, `pread`, `readv`, `preadv`) of a range a writable
//!   mapping holds writes that range's dirty pages back first, so the file
//!   has the program's stores; `fsync`/`fdatasync` write the whole mapping
//!   back and make it durable before syncing.
//! - `ftruncate` drops the pages from the new end of the file on (written
//!   back first if writable: a write-back never writes past the end).
//!
//! faultline's own I/O never comes here (`reentry.rs`). Locks: none of its
//! own (the table's, to look mappings up; faultline's fault locks).

use crate::mappings::{of_file, Mapped, Served};
use faultline::Discard;
use faultline_sys::interpose::{self, FdFacts};
use std::ffi::c_int;
use std::ops::Range;
use std::sync::Arc;

/// The served mappings of the file behind `fd`, with its facts; `None`
/// for a descriptor no served mapping shares a file with.
fn mappings_of(fd: c_int) -> Option<(FdFacts, Vec<Arc<Served>>)> {
    let facts = interpose::fd_facts(fd).ok()?;
    if !facts.regular {
        return None;
    }
    let served = of_file(&facts);
    (!served.is_empty()).then_some((facts, served))
}

/// The part of file bytes `bytes` that `s` holds, as region offsets.
fn held(s: &Served, bytes: &Range<u64>) -> Option<Range<usize>> {
    let f = s.file_range();
    let start = bytes.start.max(f.start);
    let end = bytes.end.min(f.end);
    (start < end).then(|| (start - f.start) as usize..(end - f.start) as usize)
}

/// A write the program is making through a descriptor whose file a
/// served mapping shares.
pub(crate) struct Write {
    served: Vec<Arc<Served>>,
    /// The file byte the write starts at; `None` for an append (known
    /// once it is made).
    at: Option<u64>,
    data: Vec<u8>,
}

impl Write {
    /// Prepares a write through `fd` at file byte `at` (`None`: at the
    /// descriptor's position) of the bytes `copy` returns (called only if
    /// a served mapping shares the file), and copies them into the writable
    /// mappings holding them. `None` when no served mapping shares the file.
    pub(crate) fn before(
        fd: c_int,
        at: Option<u64>,
        copy: impl FnOnce() -> Vec<u8>,
    ) -> Option<Write> {
        let (facts, served) = mappings_of(fd)?;
        let at = match at {
            Some(a) => Some(a),
            None if facts.append => None,
            None => Some(interpose::fd_position(fd).ok()?),
        };
        for s in &served {
            s.program_writes();
        }
        let data = copy();
        if let Some(at) = at {
            into_writable(&served, at, &data);
        }
        Some(Write { served, at, data })
    }

    /// The write put `n` bytes in the file: read-only mappings drop the
    /// pages holding them; an append's bytes go into the writable
    /// mappings now.
    pub(crate) fn after(self, fd: c_int, n: usize) {
        let at = match self.at {
            Some(a) => a,
            None => match interpose::fd_position(fd) {
                Ok(end) => {
                    let at = end.saturating_sub(n as u64);
                    into_writable(&self.served, at, &self.data[..n.min(self.data.len())]);
                    at
                }
                Err(_) => return,
            },
        };
        let bytes = at..at + n as u64;
        for s in self.served.iter().filter(|s| !s.writable()) {
            if let Some(r) = held(s, &bytes) {
                s.refresh(r);
            }
        }
    }
}

/// Copies `data` (file bytes from `at`) into the writable mappings holding
/// them.
fn into_writable(served: &[Arc<Served>], at: u64, data: &[u8]) {
    let bytes = at..at + data.len() as u64;
    for s in served {
        let Mapped::Rw(region) = &s.region else {
            continue;
        };
        if let Some(r) = held(s, &bytes) {
            let from = (s.file_range().start + r.start as u64 - at) as usize;
            if let Err(e) = region.write_at(r.start, &data[from..from + r.len()]) {
                eprintln!(
                    "faultline-preload: {}: a write(2) could not reach the mapping: {e}",
                    s.path.display()
                );
            }
        }
    }
}

/// Before a read of file bytes from `at` (`None`: the descriptor's
/// position), `len` long, through `fd`: the writable mappings holding any
/// of them are written back.
pub(crate) fn before_read(fd: c_int, at: Option<u64>, len: usize) {
    let Some((_, served)) = mappings_of(fd) else {
        return;
    };
    let Some(at) = at.or_else(|| interpose::fd_position(fd).ok()) else {
        return;
    };
    let bytes = at..at + len as u64;
    for s in served.iter().filter(|s| s.writable()) {
        if let Some(r) = held(s, &bytes) {
            if let Err(e) = s.write_back(r) {
                eprintln!(
                    "faultline-preload: {}: write-back before read failed: {e}",
                    s.path.display()
                );
            }
        }
    }
}

/// Before `fsync`/`fdatasync` of `fd`: its file's writable mappings are
/// written back. `Err(EIO)` if one cannot be.
pub(crate) fn before_sync(fd: c_int) -> Result<(), c_int> {
    let Some((_, served)) = mappings_of(fd) else {
        return Ok(());
    };
    for s in served.iter().filter(|s| s.writable()) {
        if let Err(e) = s.flush() {
            eprintln!(
                "faultline-preload: {}: write-back before fsync failed: {e}",
                s.path.display()
            );
            return Err(libc::EIO);
        }
    }
    Ok(())
}

/// After `ftruncate(fd, len)` succeeded: pages from the one holding the
/// new end on are dropped (a writable mapping's written back first).
pub(crate) fn after_truncate(fd: c_int, len: u64) {
    let Some((_, served)) = mappings_of(fd) else {
        return;
    };
    for s in &served {
        let Some(r) = held(s, &(len..u64::MAX)) else {
            continue;
        };
        if let Err(e) = s.write_back(r.clone()) {
            eprintln!(
                "faultline-preload: {}: write-back at ftruncate failed: {e}",
                s.path.display()
            );
            continue;
        }
        let _ = s.discard(r, Discard::StoreChanged);
    }
}
