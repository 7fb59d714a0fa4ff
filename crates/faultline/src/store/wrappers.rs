//! The wrappers faultline puts around a region's store: [`Guarded`]
//! (every store: a panic in a call becomes that call's error) and
//! [`ReadOnlyView`] (a region mapped read-only: writes refused, so no
//! fingerprints and no write-back). Each forwards every call it does not
//! change, `read_pages_each` included, so the inner store's own ways
//! (a file store's hashing of staged pages) still apply. No locks.

use super::{Store, StoreError};

/// A store seen read-only (a region from [`crate::Manager::map_read_only`]):
/// `writable()` is false whatever the store says, writes are refused, so
/// no fingerprints are kept, nothing is written back, and two read-only
/// regions may share one object range.
#[derive(Debug)]
pub(crate) struct ReadOnlyView(pub(crate) std::sync::Arc<dyn Store>);

impl Store for ReadOnlyView {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn is_zero(&self) -> bool {
        self.0.is_zero()
    }

    fn writable(&self) -> bool {
        false
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.read(page, buf)
    }

    fn read_pages(&self, first: u64, page_size: usize, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.read_pages(first, page_size, buf)
    }

    fn read_pages_each(
        &self,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
        landed: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        self.0.read_pages_each(first, page_size, buf, landed)
    }

    fn write(&self, _page: u64, _buf: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Unsupported {
            store: self.0.name(),
            op: "write (the region is read-only)",
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn will_read(&self, first: u64, pages: usize, page_size: usize) {
        self.0.will_read(first, pages, page_size);
    }

    fn identity(&self) -> Option<(u64, u64)> {
        self.0.identity()
    }

    fn file(&self) -> Option<&std::fs::File> {
        self.0.file()
    }

    fn own_memory(&self) -> usize {
        self.0.own_memory()
    }
}

/// Every store a region uses is wrapped in this: each call runs under
/// `catch_unwind`, so a store that panics gives an error for that page
/// ([`StoreError::Panicked`]) instead of killing the fault worker (whose
/// faulting thread would then wait forever) or unwinding out of a `Drop`.
#[derive(Debug)]
pub(crate) struct Guarded(pub(crate) std::sync::Arc<dyn Store>);

impl Guarded {
    fn call<T>(
        &self,
        op: &'static str,
        page: u64,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
            let message = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(StoreError::Panicked { op, page, message })
        })
    }

    /// A call that cannot fail, with `fallback` if it panics.
    fn quiet<T>(&self, fallback: T, f: impl FnOnce() -> T) -> T {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(fallback)
    }
}

impl Store for Guarded {
    fn name(&self) -> &'static str {
        self.quiet("store", || self.0.name())
    }
    fn is_zero(&self) -> bool {
        self.quiet(false, || self.0.is_zero())
    }
    fn writable(&self) -> bool {
        self.quiet(false, || self.0.writable())
    }
    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.call("read", page, || self.0.read(page, buf))
    }
    fn read_pages(&self, first: u64, page_size: usize, buf: &mut [u8]) -> Result<(), StoreError> {
        self.call("read", first, || self.0.read_pages(first, page_size, buf))
    }
    fn read_pages_each(
        &self,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
        landed: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        self.call("read", first, || {
            self.0.read_pages_each(first, page_size, buf, landed)
        })
    }
    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.call("write", page, || self.0.write(page, buf))
    }
    fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let first = pages.first().map_or(0, |p| p.0);
        self.call("write", first, || self.0.write_pages(pages))
    }
    fn discard(&self, first: u64, pages: u64, page_size: usize) -> Result<(), StoreError> {
        self.call("discard", first, || self.0.discard(first, pages, page_size))
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.call("flush", 0, || self.0.flush())
    }
    fn will_read(&self, first: u64, pages: usize, page_size: usize) {
        self.quiet((), || self.0.will_read(first, pages, page_size));
    }
    fn identity(&self) -> Option<(u64, u64)> {
        self.quiet(None, || self.0.identity())
    }
    fn file(&self) -> Option<&std::fs::File> {
        self.quiet(None, || self.0.file())
    }
    fn own_memory(&self) -> usize {
        self.quiet(0, || self.0.own_memory())
    }
}
