//! Stores defined in C: `fl_store_ops` is a table of callbacks plus a user
//! pointer; [`CStore`] adapts it to the Rust `Store` trait.
//!
//! The contract C code keeps (also in the header): `read` and `write` are
//! called from faultline's fault-serving and reclaim threads, several at
//! once for different pages, so they must be thread-safe; they must not
//! touch any faultline region (that would fault into the threads that are
//! waiting on them); they return 0, or a positive errno that becomes the
//! page's error (a fault that gets it is refused with SIGBUS, and the
//! cause is queued for `fl_manager_take_error`). `release` is called once,
//! when no region uses the store any more. Locks: none.

use faultline::{Store, StoreError};
use std::ffi::{c_int, c_void};

/// A store's callbacks and user pointer. Pages are read and written whole:
/// `len` is the region's page size and `offset` the byte offset of the page
/// in the region (page index × page size).
///
/// Contract: `read` and `write` are called from faultline's own threads,
/// several at once for different pages, so they must be thread-safe; they
/// must not touch any faultline region (that would fault into the threads
/// waiting on them); they return 0, or a positive errno that becomes the
/// page's error (a fault that gets it is refused with SIGBUS and the cause
/// queued for `fl_manager_take_error`). `release` is called once, when no
/// region uses the store any more.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fl_store_ops {
    /// Fills `buf` (`len` bytes) with the page at `offset`. Required.
    pub read: Option<
        unsafe extern "C" fn(user: *mut c_void, offset: u64, buf: *mut u8, len: usize) -> c_int,
    >,
    /// Stores `len` bytes of `buf` as the page at `offset`. NULL: the store
    /// is read-only (its region is too).
    pub write: Option<
        unsafe extern "C" fn(user: *mut c_void, offset: u64, buf: *const u8, len: usize) -> c_int,
    >,
    /// Makes written pages durable (called by flush). NULL: nothing to do.
    pub flush: Option<unsafe extern "C" fn(user: *mut c_void) -> c_int>,
    /// Called once when the store is no longer used. NULL: nothing to do.
    pub release: Option<unsafe extern "C" fn(user: *mut c_void)>,
    /// Passed to every callback.
    pub user: *mut c_void,
}

/// A C store (see the module docs for its contract).
#[derive(Debug)]
pub(crate) struct CStore {
    ops: fl_store_ops,
}

// SAFETY: the C contract makes the callbacks and `user` safe to use from any
// thread, at once.
unsafe impl Send for CStore {}
// SAFETY: as for Send.
unsafe impl Sync for CStore {}

impl CStore {
    /// # Safety
    /// `ops`'s callbacks keep the module's contract for as long as the
    /// store lives (until `release`).
    pub(crate) unsafe fn new(ops: fl_store_ops) -> CStore {
        CStore { ops }
    }
}

fn check(op: &'static str, page: u64, rc: c_int) -> Result<(), StoreError> {
    match rc {
        0 => Ok(()),
        e => Err(StoreError::Io {
            op,
            page,
            source: std::io::Error::from_raw_os_error(if e > 0 { e } else { libc::EIO }),
        }),
    }
}

impl Store for CStore {
    fn name(&self) -> &'static str {
        "C store"
    }

    fn writable(&self) -> bool {
        self.ops.write.is_some()
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let Some(read) = self.ops.read else {
            return check("read", page, libc::ENOSYS);
        };
        let offset = page.saturating_mul(buf.len() as u64);
        // SAFETY: `buf` is valid for `len` writable bytes for the call; the
        // callback keeps the C contract.
        let rc = unsafe { read(self.ops.user, offset, buf.as_mut_ptr(), buf.len()) };
        check("read", page, rc)
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        let Some(write) = self.ops.write else {
            return Err(StoreError::Unsupported {
                store: "C store without write",
                op: "write",
            });
        };
        let offset = page.saturating_mul(buf.len() as u64);
        // SAFETY: `buf` is valid for `len` bytes for the call; the callback
        // keeps the C contract.
        let rc = unsafe { write(self.ops.user, offset, buf.as_ptr(), buf.len()) };
        check("write", page, rc)
    }

    fn flush(&self) -> Result<(), StoreError> {
        match self.ops.flush {
            // SAFETY: the callback keeps the C contract.
            Some(flush) => check("flush", 0, unsafe { flush(self.ops.user) }),
            None => Ok(()),
        }
    }
}

impl Drop for CStore {
    fn drop(&mut self) {
        if let Some(release) = self.ops.release {
            // SAFETY: called once, when the store is no longer used, as the
            // contract says.
            unsafe { release(self.ops.user) };
        }
    }
}
