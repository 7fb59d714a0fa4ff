//! A store whose `read` touches another faultline region of the same
//! manager: the worker serving the outer fault faults itself. With one
//! worker this deadlocked (issue 14, row 7); the first spare server serves
//! the nested fault, under the worker's own fault lock when the two pages
//! share one (forced here with the single global lock). Each run is bounded:
//! a hang fails the test with a message instead of hanging the suite.
//! Needs userfaultfd with `UFFDIO_MOVE` (root).

mod common;

use common::{manager_with, ScratchDir};
use faultline::store::{File, FileOptions};
use faultline::{LockMode, MapOptions, ReadOnly, Region, Store, StoreError};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const PAGES: usize = 64;
const PAGE: usize = 4096;

/// Pages come from another region: page `p` is that region's page `p`.
#[derive(Debug)]
struct ViaRegion(Arc<Region<ReadOnly>>);

impl Store for ViaRegion {
    fn name(&self) -> &'static str {
        "via-region"
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let at = page as usize * buf.len();
        self.0.read_at(at, buf).map_err(|e| StoreError::Io {
            op: "read",
            page,
            source: std::io::Error::other(e.to_string()),
        })
    }

    fn write(&self, page: u64, _buf: &[u8]) -> Result<(), StoreError> {
        common::read_only_write(page)
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The byte at `i` of the backing file.
fn pattern(i: usize) -> u8 {
    (i / PAGE * 7 + i % 251) as u8
}

/// How region B is read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Via {
    /// `read_at`: faults served by the workers.
    Faults,
    /// `prefetch` first: the application thread calls the store itself,
    /// holding the page's lock, and its nested faults borrow it.
    Prefetch,
    /// `read_at` while another thread faults on a zero region under the
    /// same (global) lock: that fault must not block the server.
    BesideOthers,
}

/// Maps region A over a patterned file and region B whose store reads A,
/// then reads all of B from another thread; fails if that takes over 30 s.
fn nested(workers: usize, locks: LockMode, name: &str) {
    nested_via(workers, locks, name, Via::Faults);
}

fn nested_via(workers: usize, locks: LockMode, name: &str, via: Via) {
    let dir = ScratchDir::new(name);
    let path = dir.path().join("a");
    let bytes: Vec<u8> = (0..PAGES * PAGE).map(pattern).collect();
    std::fs::write(&path, &bytes).expect("write file");
    let mut c = common::config(16 << 20);
    c.workers = workers;
    c.experiment.locks = locks;
    let mm = manager_with(c);
    let a = mm
        .map_read_only(
            PAGES * PAGE,
            File::open(&path, FileOptions::new()).expect("open"),
            MapOptions::new(),
        )
        .expect("map a");
    let b = mm
        .map_read_only(PAGES * PAGE, ViaRegion(Arc::new(a)), MapOptions::new())
        .expect("map b");
    let other = mm
        .map(PAGES * PAGE, faultline::store::Zero, MapOptions::new())
        .expect("map other");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        if via == Via::Prefetch {
            b.prefetch(0..PAGES * PAGE).expect("prefetch");
        }
        let mut got = vec![0u8; PAGES * PAGE];
        let r = b.read_at(0, &mut got);
        let _ = tx.send(());
        (r, got, b)
    });
    if via == Via::BesideOthers {
        for off in (0..other.len()).step_by(PAGE) {
            other.store_u64(off, off as u64).expect("other write");
        }
    }
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        panic!("{name}: reading a region whose store reads another region hung ({workers} worker(s), {locks:?} locks)");
    }
    let (r, got, b) = reader.join().expect("reader");
    r.expect("read_at");
    assert!(
        got == bytes,
        "{name}: the nested reads returned wrong bytes"
    );
    let errors: Vec<String> = std::iter::from_fn(|| mm.take_error())
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{name}: nested faults are not errors: {errors:?}"
    );
    drop(b);
    let s = mm.stats();
    if workers == 1 && via == Via::Faults {
        assert!(s.spare_serves > 0, "{name}: no spare server served: {s}");
    }
}

#[test]
fn one_worker_store_reading_a_region_is_served_by_a_spare() {
    nested(1, LockMode::Hashed, "nested-1-hashed");
}

#[test]
fn one_worker_and_one_lock_the_nested_fault_borrows_it() {
    nested(1, LockMode::Global, "nested-1-global");
}

#[test]
fn two_workers_and_one_lock_the_nested_fault_borrows_it() {
    nested(2, LockMode::Global, "nested-2-global");
}

#[test]
fn prefetch_whose_store_reads_a_region_lends_its_lock() {
    nested_via(1, LockMode::Global, "nested-prefetch", Via::Prefetch);
}

#[test]
fn other_faults_under_a_lent_lock_do_not_block_the_server() {
    nested_via(1, LockMode::Global, "nested-beside", Via::BesideOthers);
}
