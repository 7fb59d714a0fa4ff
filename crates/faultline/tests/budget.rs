//! The budget at run time (issue 17): `Manager::set_budget` shrinks (reclaim
//! evicts down to it and the memory goes back to the kernel) and grows (up
//! to `budget_max`, populating more pool), with every byte of a file region
//! still right; free memory that idles above the high watermark goes back
//! to the kernel, so a program that shrinks shrinks its RSS. RSS is
//! measured in a child process per test. Needs userfaultfd with
//! `UFFDIO_MOVE` (root); fails with the reason otherwise.

mod common;

use common::{config, in_child, manager_with, map_file, rss, run_in_child, ScratchDir, MIB};
use faultline::store::Zero;
use faultline::{BudgetError, MapOptions, Region};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGE: usize = 4096;

fn stamp(p: usize, round: u64) -> u64 {
    (p as u64) << 8 | round
}

fn write_all(r: &Region, round: u64) {
    for p in 0..r.len() / PAGE {
        r.store_u64(p * PAGE, stamp(p, round)).expect("write");
    }
}

fn check_all(r: &Region, round: u64) {
    for p in 0..r.len() / PAGE {
        assert_eq!(
            r.load_u64(p * PAGE).expect("read"),
            stamp(p, round),
            "page {p}"
        );
    }
}

#[test]
fn shrink_and_grow_keep_every_byte() {
    if !in_child() {
        return run_in_child("shrink_and_grow_keep_every_byte", "budget ok");
    }
    let dir = ScratchDir::new("budget");
    let path = dir.file("data", &vec![0u8; 96 * MIB]);
    let mut c = config(64 * MIB);
    c.budget_max = Some(128 * MIB);
    let mm = manager_with(c);
    let r = map_file(&mm, &path, 96 * MIB / PAGE);
    write_all(&r, 1);
    let before = rss();
    let t0 = Instant::now();
    mm.set_budget(32 * MIB).expect("shrink");
    let s = mm.stats();
    println!(
        "shrink 64 -> 32 MiB: {:?}, RSS {} -> {} MiB, resident {} pages",
        t0.elapsed(),
        before >> 20,
        rss() >> 20,
        r.resident_pages()
    );
    assert_eq!(s.budget_frames, 32 * MIB / PAGE, "{s}");
    assert!(r.resident_pages() <= 32 * MIB / PAGE);
    assert!(
        rss() + 24 * MIB <= before,
        "RSS {} -> {} MiB",
        before >> 20,
        rss() >> 20
    );
    check_all(&r, 1);
    write_all(&r, 2);
    assert!(r.resident_pages() <= 32 * MIB / PAGE);
    let t0 = Instant::now();
    mm.set_budget(128 * MIB).expect("grow");
    println!("grow 32 -> 128 MiB: {:?}", t0.elapsed());
    check_all(&r, 2);
    assert_eq!(r.resident_pages(), 96 * MIB / PAGE, "all of it fits now");
    assert_eq!(mm.stats().budget_frames, 128 * MIB / PAGE);
    assert!(matches!(
        mm.set_budget(130 * MIB),
        Err(BudgetError::AboveMax { max, .. }) if max == 128 * MIB
    ));
    assert!(matches!(
        mm.set_budget(3 * MIB),
        Err(BudgetError::Unaligned { .. })
    ));
    r.flush().expect("flush");
    assert!(mm.take_error().is_none());
    println!("budget ok");
}

#[test]
fn a_shrink_that_cannot_free_enough_says_so() {
    let mm = manager_with(config(40 * MIB));
    let pinned = common::pinned_zero(&mm, 32 * MIB);
    for off in (0..pinned.len()).step_by(PAGE) {
        pinned.store_u64(off, off as u64).expect("write");
    }
    match mm.set_budget(16 * MIB) {
        Err(BudgetError::Busy { bytes, reached }) => {
            assert_eq!(bytes, 16 * MIB);
            assert!(
                (32 * MIB..=40 * MIB).contains(&reached),
                "reached {reached}"
            );
        }
        other => panic!("pinned pages cannot be reclaimed: {other:?}"),
    }
    for off in (0..pinned.len()).step_by(PAGE) {
        assert_eq!(pinned.load_u64(off).expect("read"), off as u64);
    }
}

#[test]
fn idle_free_memory_goes_back_to_the_kernel() {
    if !in_child() {
        return run_in_child("idle_free_memory_goes_back_to_the_kernel", "idle ok");
    }
    let mut c = config(64 * MIB);
    c.idle_release = Some(Duration::from_secs(1));
    let mm = manager_with(c);
    let r = mm.map(48 * MIB, Zero, MapOptions::new()).expect("map");
    write_all(&r, 3);
    let used = rss();
    drop(r);
    // Released after 1 s of disuse; the disuse starts again each time the
    // zeroing thread (nice 19) takes frames to refill its reserve, so a
    // busy machine can delay it: waited for up to 10 s.
    let t0 = Instant::now();
    let (after, s) = loop {
        std::thread::sleep(Duration::from_millis(100));
        let (after, s) = (rss(), mm.stats());
        let released = s.ballooned > 0 && after + 32 * MIB <= used;
        if released || t0.elapsed() > Duration::from_secs(10) {
            break (after, s);
        }
    };
    println!(
        "RSS {} MiB in use, {} MiB {:?} after the drop; {s}",
        used >> 20,
        after >> 20,
        t0.elapsed()
    );
    assert!(s.ballooned > 0, "{s}");
    assert!(
        after + 32 * MIB <= used,
        "RSS {} -> {} MiB",
        used >> 20,
        after >> 20
    );
    assert_eq!(s.frames_free, s.frames_total, "nothing leaked: {s}");
    // And the memory comes back when wanted.
    let r = mm
        .map(48 * MIB, Zero, MapOptions::new())
        .expect("map again");
    write_all(&r, 4);
    check_all(&r, 4);
    assert!(mm.stats().unballooned > 0);
    println!("idle ok");
}

/// A budget that may grow to most of the machine (`budget_max`) costs only
/// address space until it grows: the pool's room above the budget is never
/// populated, and the per-frame tables stay untouched zero pages.
#[test]
fn room_to_grow_costs_nothing_until_used() {
    if !in_child() {
        return run_in_child("room_to_grow_costs_nothing_until_used", "room ok");
    }
    let physical = common::proc_bytes("/proc/meminfo", "MemTotal:");
    let max = (physical / 2) / (2 * MIB) * (2 * MIB);
    let before = rss();
    let t0 = Instant::now();
    let mut c = config(64 * MIB);
    c.budget_max = Some(max);
    let mm = manager_with(c);
    let built = (t0.elapsed(), rss().saturating_sub(before));
    println!(
        "budget 64 MiB, budget_max {} MiB: built in {:?}, RSS +{} MiB",
        max >> 20,
        built.0,
        built.1 >> 20
    );
    // The pool's budget part, and no per-frame cost for the room above it
    // (16 B of fingerprint and 9 B of allocator per frame, were they
    // written: ~75 MiB for 12 GiB).
    assert!(
        built.1 < 64 * MIB + 16 * MIB,
        "RSS grew {} MiB",
        built.1 >> 20
    );
    mm.set_budget(256 * MIB).expect("grow");
    let r = mm.map(192 * MIB, Zero, MapOptions::new()).expect("map");
    write_all(&r, 5);
    check_all(&r, 5);
    drop(r);
    mm.set_budget(64 * MIB).expect("shrink back");
    assert_eq!(mm.stats().budget_frames, 64 * MIB / PAGE);
    println!("room ok");
}

/// Polls `mm`'s stats until `done` holds (the reclaimer settles the
/// overhead every 20 ms), for up to 3 s.
fn settle_until(
    mm: &faultline::Manager,
    done: impl Fn(&faultline::StatsSnapshot) -> bool,
) -> faultline::StatsSnapshot {
    let t0 = Instant::now();
    loop {
        let s = mm.stats();
        if done(&s) || t0.elapsed() > Duration::from_secs(3) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One word in every 2 MiB block of a 4 GiB file region of 4 KiB pages
/// makes the kernel build 2,048 page tables (8 MiB); faultline keeps each
/// block's lone page in the block's slot, with no leaf (it linked 4 MiB of
/// leaves before). The budget pays for them with frames withheld (8 MiB
/// and a little: 5 frames of 2 MiB), at most a quarter of it; they come
/// back when the region goes. Every word reads back. With the switch off
/// nothing is withheld.
#[test]
fn page_tables_and_metadata_are_paid_from_the_budget() {
    if !in_child() {
        return run_in_child(
            "page_tables_and_metadata_are_paid_from_the_budget",
            "overhead ok",
        );
    }
    let dir = ScratchDir::new("budget-overhead");
    let path = common::sparse_file(dir.path(), 4 << 30);
    let blocks = (4 << 30) / (2 * MIB);
    for (budget, counts, want) in [
        (64 * MIB, true, 10 * MIB),
        (32 * MIB, true, 8 * MIB),
        (32 * MIB, false, 0),
    ] {
        let mut c = config(budget);
        c.budget_counts_overhead = counts;
        let mm = manager_with(c);
        let r = map_file(&mm, &path, (4 << 30) / PAGE);
        for b in 0..blocks {
            r.store_u64(b * 2 * MIB + 8, stamp(b, 7)).expect("write");
        }
        let s = settle_until(&mm, |s| s.frames_overhead == want / PAGE);
        let tables = common::proc_bytes("/proc/self/status", "VmPTE:");
        println!(
            "budget {} MiB, counts {counts}: VmPTE {} MiB; {s}",
            budget >> 20,
            tables >> 20
        );
        assert_eq!(s.frames_overhead, want / PAGE, "{s}");
        assert_eq!(s.budget_frames, budget / PAGE, "{s}");
        assert!(tables >= blocks * PAGE, "a table per block: {tables}");
        for b in 0..blocks {
            let got = r.load_u64(b * 2 * MIB + 8).expect("read");
            assert_eq!(got, stamp(b, 7), "block {b}");
        }
        let in_use = s.frames_total - s.frames_free;
        assert!(in_use <= (budget - want) / PAGE, "{s}");
        if budget == 64 * MIB {
            // A budget set at run time keeps paying, within its quarter.
            mm.set_budget(32 * MIB).expect("shrink");
            let s = mm.stats();
            assert_eq!(
                (s.budget_frames, s.frames_overhead),
                (32 * MIB / PAGE, 8 * MIB / PAGE),
                "{s}"
            );
            // Growing back lifts the cap; the cost itself fell a little
            // (the shrink evicted pages, and their leaves went).
            mm.set_budget(64 * MIB).expect("grow");
            let s = settle_until(&mm, |s| s.frames_overhead > 8 * MIB / PAGE);
            assert_eq!(s.budget_frames, 64 * MIB / PAGE, "{s}");
            assert!(s.frames_overhead > 8 * MIB / PAGE, "{s}");
            assert!(s.frames_overhead <= want / PAGE, "{s}");
        }
        drop(r);
        let s = settle_until(&mm, |s| s.frames_overhead == 0);
        assert_eq!(s.frames_overhead, 0, "given back with the region: {s}");
        assert!(mm.take_error().is_none());
    }
    println!("overhead ok");
}

/// The overhead is paid under a stream of faults too: the reclaimer is
/// kicked below its low watermark again and again, and once settled only
/// then it never found free memory above that mark to withhold (a 64 MiB
/// budget streaming a 2 GiB file ran 6 MiB over and was OOM-killed in a
/// cgroup of 72 MiB). A reader streams a 1 GiB sparse file through a
/// 16 MiB budget; its page tables (2 MiB) and leaves are paid while it
/// streams, and every word reads back zero.
#[test]
fn overhead_is_paid_while_faults_stream() {
    let dir = ScratchDir::new("budget-stream");
    let path = common::sparse_file(dir.path(), 1 << 30);
    let budget = 16 * MIB;
    let mm = manager_with(config(budget));
    let r = map_file(&mm, &path, (1 << 30) / PAGE);
    let t0 = Instant::now();
    let mut s = mm.stats();
    'stream: while t0.elapsed() < Duration::from_secs(30) {
        for p in 0..r.len() / PAGE {
            assert_eq!(r.load_u64(p * PAGE).expect("read"), 0, "page {p}");
            if p % 4096 == 0 {
                s = mm.stats();
                if s.frames_overhead >= 2 * MIB / PAGE {
                    break 'stream;
                }
            }
        }
    }
    println!("{s}");
    assert!(s.frames_overhead >= 2 * MIB / PAGE, "withheld: {s}");
    assert_eq!(s.budget_frames, budget / PAGE, "{s}");
    assert!(mm.take_error().is_none());
}

/// Frames withheld for overhead give way to a fault nothing else can
/// serve: zero-store pages (never reclaimed) filling what the budget had
/// room for before the overhead was counted are all served, and read
/// back.
#[test]
fn overhead_frames_give_way_to_faults_that_fit_the_budget() {
    let dir = ScratchDir::new("budget-borrow");
    let path = common::sparse_file(dir.path(), 4 << 30);
    let mm = manager_with(config(32 * MIB));
    let sparse = map_file(&mm, &path, (4 << 30) / PAGE);
    for b in 0..(4 << 30) / (2 * MIB) {
        sparse.store_u64(b * 2 * MIB, 1).expect("write");
    }
    let s = settle_until(&mm, |s| s.frames_overhead == 8 * MIB / PAGE);
    assert_eq!(s.frames_overhead, 8 * MIB / PAGE, "{s}");
    // 28 MiB of zero-store pages: more than the 24 MiB of frames left.
    let zero = mm.map(28 * MIB, Zero, MapOptions::new()).expect("map");
    write_all(&zero, 9);
    check_all(&zero, 9);
    let s = mm.stats();
    println!("{s}");
    assert!(s.frames_overhead <= 4 * MIB / PAGE, "{s}");
    assert!(mm.take_error().is_none());
}

/// Pages kept in memory, each write taking `write_ms` (a slow remote
/// store; the test may lower it once it has measured what it needs, so
/// the rest of the test does not wait); pages never written read as zeros.
#[derive(Debug, Default)]
struct SlowWrites {
    pages: std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>,
    write_ms: AtomicU64,
}

impl faultline::Store for SlowWrites {
    fn name(&self) -> &'static str {
        "slow-writes"
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), faultline::StoreError> {
        let pages = self.pages.lock().expect("pages");
        match pages.get(&page) {
            Some(p) => buf.copy_from_slice(p),
            None => buf.fill(0),
        }
        Ok(())
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), faultline::StoreError> {
        let ms = self.write_ms.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(ms));
        self.pages.lock().expect("pages").insert(page, buf.to_vec());
        Ok(())
    }

    fn flush(&self) -> Result<(), faultline::StoreError> {
        Ok(())
    }
}

/// Issue 39 item 3d: the doc promised `Busy` after 5 s, but a shrink went
/// on as long as each reclaim pass freed something (7.8 s under faulting
/// threads). Here every eviction is a 10 ms store write and the shrink
/// needs about 3,600 of them: 36 s page by page, 18 s with the background
/// reclaimer writing beside it. It must stop at 5 s plus the store call
/// under way — one run of up to 256 pages, which this store writes page
/// by page (2.56 s) — `Busy` with what it reached, every byte kept. (A
/// first version needed a thousand writes and allowed 7 s: two writers
/// finished them in 5 s once, and a run under way at the deadline took a
/// shrink to 7.6 s another time, both in CI, both within the promise.)
#[test]
fn a_shrink_ends_within_its_five_seconds() {
    let mut c = config(20 * MIB);
    c.budget_max = Some(20 * MIB);
    let mm = manager_with(c);
    let store = std::sync::Arc::new(SlowWrites {
        write_ms: 10.into(),
        ..SlowWrites::default()
    });
    let r = mm
        .map_shared(16 * MIB, store.clone(), MapOptions::new())
        .expect("map");
    for off in (0..r.len()).step_by(PAGE) {
        r.store_u64(off, off as u64 | 1).expect("write");
    }
    let t0 = Instant::now();
    let res = mm.set_budget(2 * MIB);
    let took = t0.elapsed();
    println!("shrink: {took:?}, {res:?}, {}", mm.stats());
    // 5 s, one run of 256 pages written page by page, and slack for a
    // loaded machine.
    let promise = Duration::from_secs(5) + 256 * Duration::from_millis(10);
    assert!(
        took < promise + Duration::from_secs(2),
        "the shrink took {took:?}"
    );
    match res {
        Err(BudgetError::Busy { bytes, reached }) => {
            assert_eq!(bytes, 2 * MIB);
            assert!((2 * MIB..20 * MIB).contains(&reached), "reached {reached}");
            let text = BudgetError::Busy { bytes, reached }.to_string();
            assert!(text.contains("within 5 s"), "{text}");
        }
        other => panic!("3,600 writes of 10 ms cannot fit in 7.6 s: {other:?}"),
    }
    // Writes fast again (what is left to check is the bytes, not the
    // time: the background reclaimer may still be finishing a run, and
    // close writes back every dirty page), and the budget back, so reading
    // every page back evicts nothing.
    store.write_ms.store(0, Ordering::Relaxed);
    mm.set_budget(20 * MIB).expect("grow");
    for off in (0..r.len()).step_by(PAGE) {
        assert_eq!(r.load_u64(off).expect("read"), off as u64 | 1, "{off}");
    }
}
