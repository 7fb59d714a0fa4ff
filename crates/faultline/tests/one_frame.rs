//! The smallest budget, one 2 MiB frame, serving 2 MiB pages of a file 8
//! times larger: every fault must evict the one resident page (writing it
//! back if dirty) and reuse its frame, from one thread and from several at
//! once — never refuse the fault. (Umap programs run with a buffer of one
//! page.) Needs userfaultfd with `UFFDIO_MOVE` (root).

mod common;

use common::{manager_with, ScratchDir, MIB};
use faultline::store::{File, FileOptions};
use faultline::{MapOptions, PageSize};

fn setup(name: &str) -> (ScratchDir, faultline::Manager, faultline::Region) {
    let dir = ScratchDir::new(name);
    let path = dir.path().join("data");
    let mut data = vec![0u8; 16 * MIB];
    for (i, w) in data.chunks_mut(4096).enumerate() {
        w[..8].copy_from_slice(&(i as u64 ^ 0xabcd).to_le_bytes());
    }
    std::fs::write(&path, &data).expect("file");
    let mut c = common::config(2 * MIB);
    c.workers = 2;
    c.reclaim_low_pct = 10;
    c.reclaim_high_pct = 30;
    let mm = manager_with(c);
    let file = File::open(&path, FileOptions::new().writable(true)).expect("open");
    let r = mm
        .map(
            16 * MIB,
            file,
            MapOptions::new().page_size(PageSize::Huge2M),
        )
        .expect("map");
    (dir, mm, r)
}

#[test]
fn one_frame_serves_random_reads_from_one_thread() {
    let (_dir, mm, r) = setup("one-frame-1");
    let mut seed = 0x5eedu64;
    for i in 0..400 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let block = (seed % 4096) as usize;
        // SAFETY: inside the region; a plain load, as a C program's.
        let got: Result<u64, ()> =
            Ok(unsafe { std::ptr::read_volatile(r.as_ptr().add(block * 4096).cast::<u64>()) });
        assert_eq!(
            got.as_ref().ok(),
            Some(&(block as u64 ^ 0xabcd)),
            "read {i} of block {block}: {got:?}; fault errors: {:?}",
            std::iter::from_fn(|| mm.take_error()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn one_frame_serves_writes_from_four_threads() {
    let (_dir, mm, r) = setup("one-frame-4");
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (r, mm) = (&r, &mm);
            s.spawn(move || {
                for i in 0..100u64 {
                    let block = ((i * 37 + t * 1009) % 4096) as usize;
                    let got = r.store_u64(block * 4096 + 8, t);
                    assert!(
                        got.is_ok(),
                        "write {i} of block {block}: {got:?}; fault errors: {:?}",
                        std::iter::from_fn(|| mm.take_error()).collect::<Vec<_>>()
                    );
                }
            });
        }
    });
    r.flush().expect("flush");
}

/// A writable store with no identity (each page its own lock key, so a
/// 128-page read-ahead window takes the lock of every page it covers) whose
/// reads are instant: zeros until a page was written, then the page.
#[derive(Debug, Default)]
struct Instant4k {
    pages: std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>,
}

impl faultline::Store for Instant4k {
    fn name(&self) -> &'static str {
        "instant (test)"
    }
    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), faultline::StoreError> {
        let pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        match pages.get(&page) {
            Some(p) => buf.copy_from_slice(p),
            None => buf.fill(0),
        }
        Ok(())
    }
    fn write(&self, page: u64, buf: &[u8]) -> Result<(), faultline::StoreError> {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        pages.insert(page, buf.to_vec());
        Ok(())
    }
    fn flush(&self) -> Result<(), faultline::StoreError> {
        Ok(())
    }
}

/// Two 2 MiB frames (4 MiB) serve 32 MiB of 4 KiB pages of an instant
/// store, walked in order: read, written, read back. A read-ahead run that
/// found no free run used to fall back to the page alone still holding
/// the locks of its whole window — every lock of the table but one — so
/// no reclaim could take a page, and the fault was refused after 2 s
/// without progress (SIGBUS: 4 of 6 runs of the preload's anonymous-memory
/// oracle).
#[test]
fn two_frames_serve_an_instant_store_walked_in_order() {
    let mut c = common::config(4 * MIB);
    c.workers = 2;
    let mm = manager_with(c);
    let len = 32 * MIB;
    let r = mm
        .map(len, Instant4k::default(), MapOptions::new())
        .expect("map");
    let mix = |i: usize| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for round in 0..3 {
        for p in 0..len / 4096 {
            assert_eq!(
                r.load_u64(p * 4096).expect("read"),
                if round == 0 { 0 } else { mix(p) }
            );
        }
        for p in 0..len / 4096 {
            r.store_u64(p * 4096, mix(p)).expect("write");
        }
        for p in 0..len / 4096 {
            assert_eq!(r.load_u64(p * 4096).expect("read back"), mix(p), "page {p}");
        }
    }
    let error = mm.take_error();
    assert!(error.is_none(), "a fault failed: {error:?}");
}
