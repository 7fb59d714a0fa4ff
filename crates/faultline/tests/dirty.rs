//! Dirty tracking on real faults: under a budget several times smaller than
//! the file, only pages whose bytes changed are written back — at eviction,
//! at flush and at drop — and every change reaches the file. A store wrapper
//! counts the writes per page. Needs userfaultfd (root); fails with the
//! reason otherwise.

use faultline::store::{File, FileOptions};
use faultline::{FillModel, Manager, MapOptions, PageSize, Region, Store, StoreError};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

mod common;
use common::{byte, rng, set_byte, MIB};

/// A file store that counts writes per page.
#[derive(Debug)]
struct Counting {
    inner: File,
    writes: Mutex<HashMap<u64, usize>>,
}

impl Store for Counting {
    fn name(&self) -> &'static str {
        "counting file"
    }
    fn writable(&self) -> bool {
        self.inner.writable()
    }
    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read(page, buf)
    }
    fn read_pages(&self, first: u64, page_size: usize, buf: &mut [u8]) -> Result<(), StoreError> {
        self.inner.read_pages(first, page_size, buf)
    }
    // Forwarded, so the file store fingerprints its staged read-ahead runs
    // page by page as it copies them, as it does unwrapped.
    fn read_pages_each(
        &self,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
        landed: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        self.inner.read_pages_each(first, page_size, buf, landed)
    }
    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        *self
            .writes
            .lock()
            .expect("counter")
            .entry(page)
            .or_default() += 1;
        self.inner.write(page, buf)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
}

impl Counting {
    fn written(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .writes
            .lock()
            .expect("counter")
            .keys()
            .copied()
            .collect();
        v.sort_unstable();
        v
    }
}

/// The whole region, read through `read_at`: one sequential pass.
fn contents(r: &Region) -> Vec<u8> {
    let mut v = vec![0u8; r.len()];
    r.read_at(0, &mut v).expect("read_at inside the region");
    v
}

/// A manager of `budget` bytes whose store pages all take fingerprints:
/// `FillModel::Copy`. Under `CopyProtected` (the default with workers) a
/// page read alone goes in write-protected and takes none — its protection
/// says it is clean, and a write makes it dirty even if it puts back the
/// store's bytes (`tests/fill_model.rs` tests that model).
fn manager(budget: usize) -> Manager {
    let mut c = common::config(budget);
    c.experiment.fault_locks = Some(4);
    c.fill_model = FillModel::Copy;
    common::manager_with(c)
}

fn scratch(name: &str, len: usize) -> (common::ScratchDir, std::path::PathBuf, Vec<u8>) {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + (i >> 12)) as u8).collect();
    let dir = common::ScratchDir::new("dirty");
    let path = dir.file(name, &data);
    (dir, path, data)
}

/// The file at `path` (`len` bytes) through a counting store, mapped whole
/// in pages of `size` by a manager of `budget` bytes.
fn counted(
    path: &Path,
    len: usize,
    budget: usize,
    size: PageSize,
) -> (Arc<Counting>, Manager, Region) {
    let store = Arc::new(Counting {
        inner: File::open(path, FileOptions::new().writable(true)).expect("open"),
        writes: Mutex::new(HashMap::new()),
    });
    let mm = manager(budget);
    let r = mm
        .map_shared(len, store.clone(), MapOptions::new().page_size(size))
        .expect("map");
    (store, mm, r)
}

fn run(size: PageSize) {
    let ps = size.bytes();
    let file_len = 32 * MIB;
    let (_dir, path, mut oracle) = scratch(&format!("dirty-{}", size.name()), file_len);
    let pages = file_len / ps;
    let (store, mm, r) = counted(&path, file_len, 8 * MIB, size);
    // 1. Two sequential read passes over a file 4x the budget: evictions,
    //    no writes.
    for _ in 0..2 {
        assert!(contents(&r) == oracle, "read pass");
    }
    let st = mm.stats();
    assert!(st.evicted > 0, "{st}");
    assert!(store.written().is_empty(), "clean pages were written: {st}");
    assert!(st.clean_skipped > 0, "{st}");
    // 2. Write some pages (one byte each, two threads), read everything
    //    again (evicting them): exactly those pages reach the file.
    let mut next = rng(5);
    let mut dirty: Vec<usize> = (0..pages / 4).map(|_| next() as usize % pages).collect();
    dirty.sort_unstable();
    dirty.dedup();
    std::thread::scope(|s| {
        for t in 0..2 {
            let (r, dirty, oracle) = (&r, &dirty, &oracle);
            s.spawn(move || {
                for &p in dirty.iter().skip(t).step_by(2) {
                    let off = p * ps + 100;
                    // Page p is written by one thread only.
                    set_byte(r, off, !oracle[off]);
                }
            });
        }
    });
    for &p in &dirty {
        oracle[p * ps + 100] = !oracle[p * ps + 100];
    }
    // A write that puts back the byte the store holds leaves a page clean
    // that a read filled (its fill fingerprinted the store's copy; a page a
    // write fault fills has none: `first_touch_by_a_write_is_written_back`).
    let same = (0..pages)
        .find(|p| !dirty.contains(p))
        .expect("a clean page");
    let off = same * ps + 7;
    assert_eq!(byte(&r, off), oracle[off]);
    set_byte(&r, off, oracle[off]);
    assert!(contents(&r) == oracle, "after writes");
    r.flush().expect("flush");
    let written = store.written();
    let want: Vec<u64> = dirty.iter().map(|&p| p as u64).collect();
    let extra: Vec<_> = written.iter().filter(|p| !want.contains(p)).collect();
    let missing: Vec<_> = want.iter().filter(|p| !written.contains(p)).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "written pages are exactly the dirty ones: extra {extra:?}, missing {missing:?}"
    );
    assert!(
        store
            .writes
            .lock()
            .expect("counter")
            .values()
            .all(|&n| n == 1),
        "each dirty page written once"
    );
    // 3. A second flush writes nothing; the file has every change.
    r.flush().expect("flush again");
    assert_eq!(store.written().len(), want.len());
    assert!(std::fs::read(&path).expect("read") == oracle, "file bytes");
    drop(r);
    assert_eq!(store.written().len(), want.len(), "drop wrote nothing more");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn only_dirty_pages_are_written_back_4k() {
    run(PageSize::Base4K);
}

#[test]
fn only_dirty_pages_are_written_back_2m() {
    run(PageSize::Huge2M);
}

/// A page whose first touch is a write is filled without a fingerprint of
/// the store's copy (the write would make it stale at once): it is dirty
/// from its fill and written back without a hash — even when the write
/// stored the byte the store holds, the one case where a fingerprint would
/// have saved the write. A page read first keeps its fingerprint and stays
/// clean through the same write (`run` above).
fn first_touch_by_a_write(size: PageSize) {
    let ps = size.bytes();
    let file_len = 8 * MIB;
    let (_dir, path, oracle) = scratch(&format!("first-write-{}", size.name()), file_len);
    let (store, mm, r) = counted(&path, file_len, 16 * MIB, size);
    // Page 1: first touched by a write (a whole word: `write_at` of less
    // reads its word first) of the bytes already there. Page 2: read, then
    // the same write. Page 3: first touched by a real change.
    let word = |off: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&oracle[off..off + 8]);
        u64::from_ne_bytes(w)
    };
    let (blind, read_first, changed) = (ps + 8, 2 * ps + 8, 3 * ps + 8);
    r.store_u64(blind, word(blind)).expect("store");
    assert_eq!(byte(&r, read_first), oracle[read_first]);
    r.store_u64(read_first, word(read_first)).expect("store");
    r.store_u64(changed, !word(changed)).expect("store");
    r.flush().expect("flush");
    assert_eq!(store.written(), vec![1, 3], "{}", mm.stats());
    // Each written once, and now clean: a second flush writes nothing.
    r.flush().expect("flush again");
    assert_eq!(store.written(), vec![1, 3]);
    assert!(store
        .writes
        .lock()
        .expect("counter")
        .values()
        .all(|&n| n == 1));
    let mut want = oracle.clone();
    want[changed..changed + 8].copy_from_slice(&(!word(changed)).to_ne_bytes());
    assert!(contents(&r) == want, "region bytes");
    drop(r);
    assert!(std::fs::read(&path).expect("read") == want, "file bytes");
}

#[test]
fn first_touch_by_a_write_is_written_back_4k() {
    first_touch_by_a_write(PageSize::Base4K);
}

#[test]
fn first_touch_by_a_write_is_written_back_2m() {
    first_touch_by_a_write(PageSize::Huge2M);
}

/// A store that hands over copies of its pages (from a buffer of its own,
/// as a store with a cache might) instead of the pages it filled.
#[derive(Debug)]
struct HandsOverCopies(Counting);

impl Store for HandsOverCopies {
    fn name(&self) -> &'static str {
        "hands over copies"
    }
    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.read(page, buf)
    }
    fn read_pages_each(
        &self,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
        landed: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        self.0.read_pages(first, page_size, buf)?;
        // Each page's copy, in a buffer of the store's own.
        let copy = buf.to_vec();
        for (i, page) in copy.chunks(page_size).enumerate() {
            landed(i, page);
        }
        Ok(())
    }
    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.0.write(page, buf)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.0.flush()
    }
}

/// The fill fingerprints only the frame's own pages: bytes a store hands
/// over from anywhere else (here equal ones, in general what its cache
/// holds) give the page no fingerprint, so it counts dirty and a flush
/// writes it — a needless write, where a fingerprint of the wrong bytes
/// could have kept a written page from the store.
#[test]
fn pages_handed_over_from_elsewhere_take_no_fingerprint() {
    let len = 4 * MIB;
    let (_dir, path, oracle) = scratch("elsewhere", len);
    let store = Arc::new(HandsOverCopies(Counting {
        inner: File::open(&path, FileOptions::new().writable(true)).expect("open"),
        writes: Mutex::new(HashMap::new()),
    }));
    let mm = manager(16 * MIB);
    let r = mm
        .map_shared(len, store.clone(), MapOptions::new())
        .expect("map");
    assert!(contents(&r) == oracle, "read");
    r.flush().expect("flush");
    let written = store.0.written();
    assert_eq!(
        written.len(),
        len / 4096,
        "every page written: {}",
        mm.stats()
    );
    assert!(std::fs::read(&path).expect("read") == oracle, "file bytes");
}
