//! Backing stores: where a page's data comes from on its first touch and
//! goes to when it is written back.
//!
//! A [`Store`] reads and writes whole pages, addressed by page index within
//! the region (`page * page_size` is the byte offset). Errors carry the page
//! and the cause. [`Zero`] is anonymous memory: every page reads as zeros
//! (the fault path clears the frame, or skips that for a pre-zeroed one).
//!
//! Stores are called from fault workers with the page's fault lock held and
//! must not touch any faultline region (that would fault into the workers
//! and could deadlock); they take no faultline locks themselves.

use std::fmt::Debug;

mod file;
mod file_options;
#[cfg(feature = "redis")]
mod redis;
mod staging;
mod wrappers;

pub use file::File;
pub use file_options::FileOptions;
#[cfg(feature = "redis")]
pub use redis::{Backend, Cluster, Redis, RedisCluster, RedisOptions, RedisStore, Server};
pub(crate) use wrappers::{Guarded, ReadOnlyView};

/// A failed store operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An I/O error on a page.
    #[error("store {op} of page {page} failed: {source}")]
    Io {
        /// `"read"`, `"write"`, `"flush"` or `"discard"`.
        op: &'static str,
        /// Page index within the region.
        page: u64,
        /// The cause (carries the errno).
        #[source]
        source: std::io::Error,
    },
    /// A page could not be taken out of the region to be written back (the
    /// program changed its protection with `mprotect`, or the kernel refused
    /// the move); it stays dirty, and a later flush tries again.
    #[error("page {page} could not be taken for write-back: {source}")]
    Unreadable {
        /// Page index within the region.
        page: u64,
        /// The refused move, with errno.
        #[source]
        source: faultline_sys::SysError,
    },
    /// A dirty page the program changed the protection of (`mprotect`, e.g.
    /// to `PROT_NONE`): the kernel will not move it out of the region
    /// (`UFFDIO_MOVE` answers `EINVAL` for a page whose protection differs
    /// from faultline's frames), so it cannot be written back. It stays
    /// dirty; once the program makes it `PROT_READ|PROT_WRITE` again, a
    /// flush writes it.
    #[error(
        "page {page} at {addr:#x} is {prot} (protected by the program with mprotect), so it \
         cannot be taken out of the region to be written back; it stays dirty: make it \
         PROT_READ|PROT_WRITE again and flush"
    )]
    Protected {
        /// Page index within the region.
        page: u64,
        /// The page's address.
        addr: usize,
        /// Its protection, as `PROT_*` names (`"PROT_NONE"`).
        prot: &'static str,
    },
    /// The store panicked (a bug in it); faultline caught the panic, so the
    /// worker that called it lives on and the page gets this error.
    #[error("store {op} of page {page} panicked: {message}")]
    Panicked {
        /// `"read"`, `"write"`, `"flush"` or `"discard"`.
        op: &'static str,
        /// Page index within the region (0 for `flush`).
        page: u64,
        /// The panic's message, if it was a string.
        message: String,
    },
    /// A remote store (Redis) failed: unreachable after its retries, a
    /// timeout, too few replicas acknowledged a write, or a reply that is
    /// not a page.
    #[error("store {op} of page {page} failed: {source}")]
    Remote {
        /// `"connect"`, `"read"`, `"write"` or `"discard"`.
        op: &'static str,
        /// Page index within the region (0 for `connect`).
        page: u64,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store refused to be used: it cannot keep pages safely (a Redis
    /// server that may evict keys) or its address is malformed.
    #[error("store {store} refused: {reason}")]
    Refused {
        /// The store's name.
        store: &'static str,
        /// Why.
        reason: String,
    },
    /// The store cannot do this operation (e.g. writing back to [`Zero`]).
    #[error("store {store} does not support {op}")]
    Unsupported {
        /// The store's name.
        store: &'static str,
        /// The operation.
        op: &'static str,
    },
}

impl StoreError {
    /// The errno behind the error, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            StoreError::Io { source, .. } => source.raw_os_error(),
            StoreError::Unreadable { source, .. } => Some(source.errno),
            StoreError::Protected { .. } => Some(libc::EACCES),
            StoreError::Remote { source, .. } => source
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error),
            StoreError::Unsupported { .. }
            | StoreError::Panicked { .. }
            | StoreError::Refused { .. } => None,
        }
    }
}

/// A backing store of whole pages.
pub trait Store: Send + Sync + Debug {
    /// Short name, for stats and errors.
    fn name(&self) -> &'static str;

    /// True if every page reads as zeros and writes are never needed; the
    /// fault path then clears frames itself instead of calling `read`.
    fn is_zero(&self) -> bool {
        false
    }

    /// Whether pages are written back (false for [`Zero`] and read-only
    /// files: their regions never write).
    fn writable(&self) -> bool {
        true
    }

    /// Fills `buf` (exactly one page) with page `page`. Called by a fault
    /// worker holding the page's fault lock; it may block (the other
    /// workers, and the spare servers, go on serving).
    ///
    /// # Errors
    /// Any [`StoreError`]: the page is poisoned (its faulting thread gets
    /// SIGBUS), the error is queued, and the first touch after a back-off
    /// (50 ms, doubling with each failure in a row, at most 5 s) tries
    /// again.
    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError>;

    /// Fills `buf` (a whole number of pages of `page_size` bytes) with the
    /// consecutive pages from `first`: read-ahead reads a run at once. The
    /// default reads page by page.
    ///
    /// # Errors
    /// As [`Store::read`].
    fn read_pages(&self, first: u64, page_size: usize, buf: &mut [u8]) -> Result<(), StoreError> {
        for (i, chunk) in buf.chunks_mut(page_size).enumerate() {
            self.read(first + i as u64, chunk)?;
        }
        Ok(())
    }

    /// As [`Store::read_pages`], and hands each page to `landed` (its
    /// index in the run and its bytes in `buf`) once its bytes are final —
    /// for a store that copies pages into `buf` one by one, right after
    /// each copy, while the bytes are still in the CPU's cache. faultline
    /// reads every clean fill of a writable region this way and takes each
    /// page's fingerprint (what tells a written page from a clean one) as
    /// it lands; the file store hands over its staged pages as it copies
    /// them, where a hash after the whole run would read them back from
    /// memory. A store must not change a page after handing it over, and
    /// should hand over every page (one it skips counts as written, and is
    /// written back at its eviction). Pages handed over before an error
    /// count for nothing: the read failed. The default reads the run with
    /// [`Store::read_pages`], then hands over its pages in order.
    ///
    /// # Errors
    /// As [`Store::read`].
    fn read_pages_each(
        &self,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
        landed: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        self.read_pages(first, page_size, buf)?;
        for (i, page) in buf.chunks(page_size).enumerate() {
            landed(i, page);
        }
        Ok(())
    }

    /// Stores `buf` (exactly one page) as page `page`.
    ///
    /// # Errors
    /// Any [`StoreError`]: the page stays dirty, in memory, and the error is
    /// returned by the flush (or queued, for eviction and drop).
    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError>;

    /// Stores several pages in one call (each page's index and its bytes,
    /// one page each, ascending, not necessarily consecutive): the
    /// write-back of a run of evicted pages, or of a batch of scattered
    /// ones. The default writes them one by one; a file store has them all
    /// in flight at once, a remote store sends them in one round trip.
    ///
    /// # Errors
    /// Any [`StoreError`]: none of the pages counts as written (all stay
    /// dirty and are written again later, so a store may have taken some).
    fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        pages
            .iter()
            .try_for_each(|&(page, buf)| self.write(page, buf))
    }

    /// Drops the store's copy of pages `[first, first + pages)` (of
    /// `page_size` bytes): they read as zeros afterwards
    /// ([`crate::Discard::Zero`]). The default writes zero pages; a store
    /// with a cheaper way (a file punches a hole) overrides it.
    ///
    /// # Errors
    /// Any [`StoreError`] (a store that cannot be written refuses).
    fn discard(&self, first: u64, pages: u64, page_size: usize) -> Result<(), StoreError> {
        write_zero_pages(self, first, pages, page_size)
    }

    /// Makes every completed `write` durable.
    ///
    /// # Errors
    /// Any [`StoreError`], returned by [`crate::Region::flush`].
    fn flush(&self) -> Result<(), StoreError>;

    /// A hint that pages `[first, first + pages)` (of `page_size` bytes) will
    /// be read soon: a store may start fetching them in the background
    /// (asynchronous read-ahead). The default does nothing.
    fn will_read(&self, first: u64, pages: usize, page_size: usize) {
        let _ = (first, pages, page_size);
    }

    /// The backing object this store reads, and the byte offset in it of the
    /// region's first byte: `(object id, offset)`. Regions whose stores name
    /// the same object serialize faults on the same object page under one
    /// fault lock. `None` (the default): the region is its own object.
    fn identity(&self) -> Option<(u64, u64)> {
        None
    }

    /// The file whose bytes `[identity().1, identity().1 + region length)`
    /// the store's pages are, if its object is a file: the manager then
    /// refuses to map that range while a region of another manager of this
    /// process, or another process, maps it with one of the two writable,
    /// and locks it for the region's life (an open-file-description lock on
    /// a description of its own: [`crate::MapError::FileInUse`]). `None`
    /// (the default): no file, or a store that keeps its own coherence.
    fn file(&self) -> Option<&std::fs::File> {
        None
    }

    /// Bytes of memory the store keeps for its region beyond the frames now
    /// (a file store's staging page, once made: [`FileOptions::staged`]).
    /// The budget pays for them as for the region's page tables
    /// (`Config::budget_counts_overhead`); the fault path reads this after
    /// each store read. The default is 0.
    fn own_memory(&self) -> usize {
        0
    }
}

/// Writes zero pages `[first, first + pages)` to `store`: the default
/// [`Store::discard`], and a store's fallback where its own way fails.
///
/// # Errors
/// The first write's error.
pub(crate) fn write_zero_pages<S: Store + ?Sized>(
    store: &S,
    first: u64,
    pages: u64,
    page_size: usize,
) -> Result<(), StoreError> {
    let zeros = vec![0u8; page_size];
    (first..first + pages).try_for_each(|p| store.write(p, &zeros))
}

/// A store wrapper that sleeps a fixed time before every read: a stand-in
/// for a remote or slow store (seed 003's experiment). Its pages are the
/// inner store's, so it is never `is_zero`: every fault calls `read`.
#[derive(Debug, Clone)]
pub struct Delayed<S> {
    inner: S,
    latency: std::time::Duration,
}

impl<S: Store> Delayed<S> {
    /// Wraps `inner`, adding `latency` to each read.
    pub fn new(inner: S, latency: std::time::Duration) -> Self {
        Delayed { inner, latency }
    }
}

impl<S: Store> Store for Delayed<S> {
    fn name(&self) -> &'static str {
        "delayed"
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if !self.latency.is_zero() {
            std::thread::sleep(self.latency);
        }
        self.inner.read(page, buf)
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
        // One latency for the run, as one request to a remote store.
        if !self.latency.is_zero() {
            std::thread::sleep(self.latency);
        }
        self.inner.read_pages_each(first, page_size, buf, landed)
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(page, buf)
    }

    fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        self.inner.write_pages(pages)
    }

    fn discard(&self, first: u64, pages: u64, page_size: usize) -> Result<(), StoreError> {
        self.inner.discard(first, pages, page_size)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
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

    fn will_read(&self, first: u64, pages: usize, page_size: usize) {
        self.inner.will_read(first, pages, page_size);
    }
}

/// Anonymous memory: pages read as zeros.
#[derive(Debug, Clone, Copy, Default)]
pub struct Zero;

impl Store for Zero {
    fn name(&self) -> &'static str {
        "zero"
    }

    fn is_zero(&self) -> bool {
        true
    }

    fn writable(&self) -> bool {
        false
    }

    fn read(&self, _page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        crate::memops::clear(buf);
        Ok(())
    }

    fn write(&self, _page: u64, _buf: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Unsupported {
            store: "zero",
            op: "write",
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delayed_sleeps_and_is_not_zero() {
        let d = Delayed::new(Zero, std::time::Duration::from_millis(5));
        assert!(!d.is_zero());
        let mut buf = vec![1u8; 4096];
        let t = std::time::Instant::now();
        d.read(0, &mut buf).expect("read");
        assert!(t.elapsed() >= std::time::Duration::from_millis(5));
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(d.identity(), None);
    }

    #[test]
    fn zero_reads_zeros_and_refuses_writes() {
        let mut buf = vec![7u8; 4096];
        Zero.read(3, &mut buf).expect("read");
        assert!(buf.iter().all(|&b| b == 0));
        let err = Zero
            .write(3, &buf)
            .expect_err("zero store has nowhere to write");
        assert!(err.to_string().contains("does not support write"));
        assert_eq!(err.errno(), None);
        Zero.flush().expect("flush");
    }
}
