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

/// A failed store operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error on a page.
    #[error("store {op} of page {page} failed: {source}")]
    Io {
        /// `"read"`, `"write"` or `"flush"`.
        op: &'static str,
        /// Page index within the region.
        page: u64,
        /// The cause (carries the errno).
        #[source]
        source: std::io::Error,
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
            StoreError::Unsupported { .. } => None,
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

    /// Fills `buf` (exactly one page) with page `page`.
    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError>;

    /// Stores `buf` (exactly one page) as page `page`.
    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError>;

    /// Makes every completed `write` durable.
    fn flush(&self) -> Result<(), StoreError>;

    /// The backing object this store reads, and the object page that the
    /// region's page 0 is: `(object id, first page)`. Regions whose stores
    /// name the same object serialize faults on the same object page under one
    /// fault lock. `None` (the default): the region is its own object.
    fn identity(&self) -> Option<(u64, u64)> {
        None
    }
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

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if !self.latency.is_zero() {
            std::thread::sleep(self.latency);
        }
        self.inner.read(page, buf)
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.inner.write(page, buf)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn identity(&self) -> Option<(u64, u64)> {
        self.inner.identity()
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

    fn read(&self, _page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        crate::fill::clear(buf);
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
