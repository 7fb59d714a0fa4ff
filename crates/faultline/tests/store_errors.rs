//! Store errors reach the caller as errors, the faulting thread gets SIGBUS
//! (EFAULT for a kernel-mode access) instead of hanging, and no dirty data is
//! dropped when write-back fails. Needs userfaultfd (root); fails with the
//! reason otherwise.

use faultline::store::{File, FileOptions};
use faultline::{FaultError, MapOptions, Store, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};

mod common;
use common::{byte, kernel_read, manager, set_byte, MIB};

/// A store of zeros that fails reads of chosen pages, or every write, on
/// demand.
#[derive(Debug)]
struct Flaky {
    bad_page: u64,
    fail_writes: AtomicBool,
}

impl Store for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if page == self.bad_page {
            return Err(StoreError::Io {
                op: "read",
                page,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        buf.fill(page as u8);
        Ok(())
    }

    fn write(&self, page: u64, _buf: &[u8]) -> Result<(), StoreError> {
        if self.fail_writes.load(Ordering::Relaxed) {
            return Err(StoreError::Io {
                op: "write",
                page,
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[test]
fn a_failing_read_poisons_the_page_and_reports_the_cause() {
    let mm = manager(8 * MIB);
    let r = mm
        .map(
            MIB,
            Flaky {
                bad_page: 3,
                fail_writes: AtomicBool::new(false),
            },
            MapOptions::new(),
        )
        .expect("map");
    assert_eq!(kernel_read(r.addr() + 2 * 4096), 0, "a good page reads");
    assert_eq!(byte(&r, 2 * 4096), 2);
    assert_eq!(
        kernel_read(r.addr() + 3 * 4096),
        libc::EFAULT,
        "the bad page is poisoned"
    );
    let err = r.take_error().expect("the cause is queued");
    match err {
        FaultError::Store { addr, ref source } => {
            assert_eq!(addr, r.addr() + 3 * 4096);
            assert_eq!(source.errno(), Some(libc::EIO));
        }
        other => panic!("unexpected error {other}"),
    }
}

#[test]
fn an_unreadable_file_is_an_error_not_a_hang() {
    // A directory opens read-only but every read fails with EISDIR.
    let scratch = common::ScratchDir::new("unreadable");
    let dir = scratch.path();
    let mm = manager(8 * MIB);
    let r = mm
        .map_read_only(
            MIB,
            File::open(dir, FileOptions::new()).expect("open dir"),
            MapOptions::new(),
        )
        .expect("map");
    assert_eq!(kernel_read(r.addr()), libc::EFAULT);
    let err = r.take_error().expect("queued");
    assert!(
        matches!(&err, FaultError::Store { source, .. } if source.errno() == Some(libc::EISDIR)),
        "{err}"
    );
    drop(r);
}

#[test]
fn failing_write_back_keeps_the_data() {
    // 2 MiB of budget (512 frames) and a 4 MiB region: filling the first
    // 512 pages uses every frame; the next page needs reclaim, whose
    // write-back fails (ENOSPC), so nothing may be evicted. Every page is
    // made dirty (its byte differs from the store's), or reclaim could
    // evict it without writing.
    let mm = manager(2 * MIB);
    let store = std::sync::Arc::new(Flaky {
        bad_page: u64::MAX,
        fail_writes: AtomicBool::new(true),
    });
    let r = mm
        .map_shared(4 * MIB, store.clone(), MapOptions::new())
        .expect("map");
    for p in 0..512 {
        set_byte(&r, p * 4096 + 1, !(p as u8));
    }
    // No frame can be freed: the fault is refused (EFAULT from kernel mode).
    assert_eq!(kernel_read(r.addr() + 600 * 4096), libc::EFAULT);
    assert!(r.flush().is_err(), "flush reports the failing write-back");
    // Every written page still holds its data (parked pages come back).
    for p in 0..512 {
        assert_eq!(byte(&r, p * 4096 + 1), !(p as u8), "page {p} lost its data");
    }
    let mut saw_enospc = false;
    while let Some(e) = mm.take_error() {
        if let FaultError::Store { source, .. } = &e {
            saw_enospc |= source.errno() == Some(libc::ENOSPC);
        }
    }
    assert!(saw_enospc, "the write-back error was reported");
    // Let the teardown's write-back succeed.
    store.fail_writes.store(false, Ordering::Relaxed);
}
