//! Pinned regions (`MapOptions::pinned`): a store that keeps no writes may
//! back a writable region only if it is pinned, and a pinned region's pages
//! are never reclaimed — so its writes survive memory pressure from a
//! file-backed region four times the rest of the budget. Without the pin the
//! same store is refused (`MapError::ReadOnlyStore`), never silently
//! dropping writes at eviction. Needs userfaultfd with `UFFDIO_MOVE` (root).

mod common;

use common::{in_child, manager, map_file, run_in_child, ScratchDir, MIB};
use faultline::store::{Delayed, Zero};
use faultline::{MapError, MapOptions, ReadOnly, Region};
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
    let pinned = common::pinned_zero(&mm, 4 * MIB);
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

/// An 8 MiB pool full of pinned pages beside a read-only region over a
/// sparse file of `big` bytes that holds nothing.
fn pool_full_of_pinned_beside(
    big: usize,
) -> (ScratchDir, faultline::Manager, Region<ReadOnly>, Region) {
    let dir = ScratchDir::new("pinned-beside");
    let path = common::sparse_file(dir.path(), big);
    let mm = manager(8 * MIB);
    let file = mm
        .map_read_only(
            big,
            faultline::store::File::open(&path, faultline::store::FileOptions::new())
                .expect("open"),
            MapOptions::new(),
        )
        .expect("map the sparse file");
    let pinned = common::pinned_zero(&mm, 8 * MIB);
    for off in (0..pinned.len()).step_by(4096) {
        pinned.store_u64(off, 1).expect("fill the pool");
    }
    (dir, mm, file, pinned)
}

/// The pool is full of pinned pages (below the reclaim low watermark, with
/// nothing reclaimable) beside a large untouched file region: the
/// background reclaimer backs off instead of walking every page of it 100
/// times a second (issue 17: an idle manager burned 69–100% of a CPU).
/// In a child process: the CPU time read is the whole process's, and the
/// other tests of this binary run beside it.
#[test]
fn an_idle_manager_with_nothing_to_reclaim_stays_idle() {
    if !in_child() {
        return run_in_child(
            "an_idle_manager_with_nothing_to_reclaim_stays_idle",
            "idle ok",
        );
    }
    let (_dir, mm, _file, _pinned) = pool_full_of_pinned_beside(16 << 30);
    std::thread::sleep(Duration::from_secs(2)); // the back-off reaches its cap
    let used = common::idle_cpu();
    println!("idle CPU: {used:?} in 3 s");
    assert!(
        used < common::idle_cpu_bound(),
        "an idle manager used {used:?} of CPU in 3 s (stats: {})",
        mm.stats()
    );
    println!("idle ok");
}

/// The pool is full of pinned pages and a fault comes for a 256 GiB file
/// region that holds nothing: no frame can come, so the fault is refused
/// at once — the toucher gets its error (EFAULT from kernel mode; SIGBUS
/// from user mode) and the cause is queued — in well under 10 ms, not
/// after a walk of the address space or a 2 s wait (issue 17).
#[test]
fn an_unservable_fault_reports_at_once() {
    let (_dir, mm, file, _pinned) = pool_full_of_pinned_beside(256 << 30);
    let mut took = Vec::new();
    for i in 0..5 {
        let addr = file.addr() + (i * 7919 + 13) * (1 << 20);
        let t0 = std::time::Instant::now();
        assert_eq!(common::kernel_read(addr), libc::EFAULT, "no frame: refused");
        took.push(t0.elapsed());
        let err = mm.take_error();
        assert!(
            matches!(&err, Some(faultline::FaultError::NoFrame { why, .. })
                if why.contains("held by pages reclaim cannot take")),
            "the cause is queued, and says why: {err:?}"
        );
    }
    took.sort();
    eprintln!("unservable faults reported in {took:?}");
    assert!(took[2] < Duration::from_millis(10), "median {:?}", took[2]);
}
