//! `Region::discard` (issue 17, giving memory back): discarded pages' frames
//! return to the pool at once, and the pages read the store's copy
//! (`KeepStore`) or zeros (`Zero`, which also clears the store's copy: a
//! file gets a hole) — checked on real faults, against the file on disk,
//! and against an oracle while reclaim runs beside. Needs userfaultfd with
//! `UFFDIO_MOVE` (root); fails with the reason otherwise.

mod common;

use common::{byte, manager, map_file, set_byte, settled, ScratchDir, MIB};
use faultline::store::{File, FileOptions, Zero};
use faultline::{Discard, FaultError, MapOptions};

const PAGE: usize = 4096;

#[test]
fn discarded_frames_return_to_the_pool() {
    let mm = manager(8 * MIB);
    let r = mm.map(128 * PAGE, Zero, MapOptions::new()).expect("map");
    for p in 0..64 {
        set_byte(&r, p * PAGE + 9, p as u8 | 1);
    }
    let before = settled(&mm);
    let freed = r
        .discard(16 * PAGE..48 * PAGE, Discard::KeepStore)
        .expect("discard");
    assert_eq!(freed, 32);
    let after = settled(&mm);
    assert_eq!(after.frames_free, before.frames_free + 32, "{after}");
    assert_eq!(after.discarded, 32);
    assert_eq!(r.resident_pages(), 32);
    for p in 0..64 {
        let want = if (16..48).contains(&p) {
            0
        } else {
            p as u8 | 1
        };
        assert_eq!(byte(&r, p * PAGE + 9), want, "page {p}");
    }
    // Discarding what holds nothing (never touched) frees nothing.
    let again = r.discard(100 * PAGE..128 * PAGE, Discard::Zero);
    assert_eq!(again.expect("discard"), 0);
}

#[test]
fn keep_store_rereads_the_file_and_zero_punches_a_hole() {
    let dir = ScratchDir::new("discard");
    let mm = manager(8 * MIB);
    let (r, data, path) = common::written_file(&mm, &dir);
    r.discard(4 * PAGE..8 * PAGE, Discard::KeepStore)
        .expect("keep");
    r.discard(8 * PAGE..12 * PAGE, Discard::Zero).expect("zero");
    for p in 0..16 {
        let want = match p {
            4..8 => data[p * PAGE],
            8..12 => 0,
            _ => 0xee,
        };
        assert_eq!(byte(&r, p * PAGE), want, "page {p}");
        assert_eq!(
            byte(&r, p * PAGE + 1),
            if (8..12).contains(&p) {
                0
            } else {
                data[p * PAGE + 1]
            }
        );
    }
    r.flush().expect("flush");
    let disk = std::fs::read(&path).expect("read file");
    assert_eq!(disk.len(), data.len(), "the file keeps its size");
    for p in 0..16 {
        let want = match p {
            4..8 => data[p * PAGE],
            8..12 => 0,
            _ => 0xee,
        };
        assert_eq!(disk[p * PAGE], want, "file page {p}");
    }
    assert!(disk[8 * PAGE..12 * PAGE].iter().all(|&b| b == 0));
}

#[test]
fn bad_ranges_and_read_only_stores_are_refused() {
    let dir = ScratchDir::new("discard-bad");
    let path = dir.file("data", &vec![7u8; 8 * PAGE]);
    let mm = manager(8 * MIB);
    let r = map_file(&mm, &path, 8);
    for bad in [1..PAGE, 0..PAGE + 1, 0..9 * PAGE] {
        assert!(
            matches!(
                r.discard(bad.clone(), Discard::Zero),
                Err(FaultError::BadRange { .. })
            ),
            "{bad:?}"
        );
    }
    // Another file: a read-only region may not share a writable one's.
    let ro_path = dir.file("ro", &vec![7u8; 8 * PAGE]);
    let ro = mm
        .map_read_only(
            8 * PAGE,
            File::open(&ro_path, FileOptions::new()).expect("open"),
            MapOptions::new(),
        )
        .expect("map read-only");
    assert_eq!(common::byte(&ro, 0), 7);
    assert!(matches!(
        ro.discard(0..PAGE, Discard::Zero),
        Err(FaultError::Store { .. })
    ));
    let kept = ro.discard(0..PAGE, Discard::KeepStore);
    assert_eq!(kept.expect("discard a read-only page"), 1);
    assert_eq!(common::byte(&ro, 0), 7);
}

/// Threads write stamps into their own pages of one file region through a
/// budget a quarter of it (reclaim parks, evicts and writes back all the
/// while), discard half of their pages each round by one policy or the
/// other, and check every page reads exactly what the oracle says.
#[test]
fn discard_under_reclaim_matches_an_oracle() {
    let dir = ScratchDir::new("discard-oracle");
    let pages = 4096;
    let path = dir.file("data", &vec![0u8; pages * PAGE]);
    let mm = manager(4 * MIB);
    let r = map_file(&mm, &path, pages);
    std::thread::scope(|s| {
        for t in 0..2usize {
            let r = &r;
            s.spawn(move || {
                let mine: Vec<usize> = (t..pages).step_by(2).collect();
                let mut oracle = vec![0u64; pages];
                let mut next = common::rng(t as u64 + 1);
                for round in 1..=6u64 {
                    for &p in &mine {
                        let v = round << 32 | p as u64;
                        r.store_u64(p * PAGE, v).expect("write");
                        oracle[p] = v;
                    }
                    for _ in 0..8 {
                        let p = mine[next() as usize % mine.len()];
                        let how = if next() % 2 == 0 {
                            Discard::Zero
                        } else {
                            Discard::KeepStore
                        };
                        r.discard(p * PAGE..(p + 1) * PAGE, how).expect("discard");
                        if how == Discard::Zero {
                            oracle[p] = 0;
                        } else {
                            // The store's copy: the last write-back, which
                            // an eviction may or may not have made.
                            let got = r.load_u64(p * PAGE).expect("read");
                            assert!(got == oracle[p] || got < round << 32, "page {p}: {got:#x}");
                            oracle[p] = got;
                        }
                    }
                    for &p in &mine {
                        assert_eq!(
                            r.load_u64(p * PAGE).expect("read"),
                            oracle[p],
                            "page {p} round {round}"
                        );
                    }
                }
            });
        }
    });
    let s = mm.stats();
    assert!(s.evicted > 0 && s.discarded > 0, "{s}");
    assert!(mm.take_error().is_none());
}

/// A store that answers a read 20 ms after it read its inner store: a
/// fill holds the old bytes for that long before it maps them.
#[derive(Debug)]
struct SlowReply(File);

impl faultline::Store for SlowReply {
    fn name(&self) -> &'static str {
        "slow reply (test)"
    }
    fn writable(&self) -> bool {
        false
    }
    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), faultline::StoreError> {
        self.0.read(page, buf)?;
        std::thread::sleep(std::time::Duration::from_millis(20));
        Ok(())
    }
    fn write(&self, page: u64, buf: &[u8]) -> Result<(), faultline::StoreError> {
        self.0.write(page, buf)
    }
    fn flush(&self) -> Result<(), faultline::StoreError> {
        self.0.flush()
    }
}

/// Another writer changes the file under a read-only region while a fault
/// of the page is in flight (its fill read the old bytes and has not mapped
/// them yet): after the write and a `StoreChanged` discard, the page must
/// read the new bytes. `Discard::KeepStore` visits only pages in use, and a
/// page being filled is not yet: with it, every round here fails.
#[test]
fn store_changed_drops_fills_in_flight() {
    use std::os::unix::fs::FileExt;
    let dir = ScratchDir::new("discard-store-changed");
    let mm = manager(8 * MIB);
    let pages = 32;
    let path = dir.path().join("changing.bin");
    std::fs::write(&path, vec![0u8; pages * PAGE]).expect("write file");
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing");
    let store = SlowReply(File::open(&path, FileOptions::new()).expect("open"));
    let r = mm
        .map_read_only(pages * PAGE, store, MapOptions::new())
        .expect("map");
    for round in 1..=16u64 {
        // A fresh page each round, so the racing touch starts a fill.
        let p = round as usize;
        std::thread::scope(|s| {
            let racer = s.spawn(|| r.load_u64(p * PAGE).expect("racing read"));
            // The racer's fill has read the old bytes by now.
            std::thread::sleep(std::time::Duration::from_millis(8));
            writer
                .write_all_at(&round.to_le_bytes(), (p * PAGE) as u64)
                .expect("write the file");
            r.discard(p * PAGE..(p + 1) * PAGE, Discard::StoreChanged)
                .expect("discard");
            let got = r.load_u64(p * PAGE).expect("read back");
            assert_eq!(got, round, "page {p} after the write of round {round}");
            // The racer may see either: it raced the write.
            let raced = racer.join().expect("racer");
            assert!(
                raced == 0 || raced == round,
                "page {p}: the racer read {raced}"
            );
        });
    }
}
