//! Pinned regions (`MapOptions::pinned`): a store that keeps no writes may
//! back a writable region only if it is pinned, and a pinned region's pages
//! are never reclaimed — so its writes survive memory pressure from a
//! file-backed region four times the rest of the budget. Without the pin the
//! same store is refused (`MapError::ReadOnlyStore`), never silently
//! dropping writes at eviction. Needs userfaultfd with `UFFDIO_MOVE` (root).

mod common;

use common::{manager, map_file, ScratchDir, MIB};
use faultline::store::{Delayed, Zero};
use faultline::{MapError, MapOptions};
use std::time::Duration;

#[test]
fn a_store_without_writes_needs_a_pin() {
    let mm = manager(8 * MIB);
    let slow = || Delayed::new(Zero, Duration::ZERO);
    let refused = mm.map(MIB, slow(), MapOptions::new());
    assert!(
        matches!(refused, Err(MapError::ReadOnlyStore)),
        "{refused:?}"
    );
    let r = mm
        .map(MIB, slow(), MapOptions::new().pinned(true))
        .expect("pinned map");
    r.store_u64(4096, 7).expect("write");
    assert_eq!(r.load_u64(4096).expect("read"), 7);
}

#[test]
fn pinned_pages_survive_reclaim() {
    let dir = ScratchDir::new("pinned");
    let path = dir.path().join("big");
    std::fs::write(&path, vec![0u8; 16 * MIB]).expect("file");
    let mm = manager(8 * MIB);
    let pinned = mm
        .map(
            4 * MIB,
            Delayed::new(Zero, Duration::ZERO),
            MapOptions::new().pinned(true),
        )
        .expect("pinned map");
    for off in (0..pinned.len()).step_by(4096) {
        pinned.store_u64(off, off as u64 ^ 0x5eed).expect("write");
    }
    // 16 MiB of file through the 4 MiB left: reclaim runs all the time.
    let file = map_file(&mm, &path, 16 * MIB / 4096);
    for round in 0..2u64 {
        for off in (0..file.len()).step_by(4096) {
            file.store_u64(off, round).expect("file write");
        }
    }
    let s = mm.stats();
    assert!(s.evicted > 0, "no reclaim happened: {s}");
    for off in (0..pinned.len()).step_by(4096) {
        assert_eq!(
            pinned.load_u64(off).expect("read"),
            off as u64 ^ 0x5eed,
            "pinned page at {off:#x} lost its write"
        );
    }
    assert_eq!(pinned.resident_pages(), pinned.len() / 4096);
}
