//! Migration between pools and huge-page collapse on real faults: pages move
//! while application threads read and write them (checked against a per-word
//! oracle), a full pool fails cleanly and leaves the data where it was, pages
//! the kernel will not move stay put without holding the fault locks for
//! long, and a collapsed block is one huge page. Needs userfaultfd (root);
//! fails with the reason otherwise.

use faultline::store::Zero;
use faultline::{Config, CopyMethod, CopyPlan, MapOptions, MigrateError, PageSize, Region};
use faultline_sys::mem::PageMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{byte, rng, set_byte, MIB};

fn tiered(budget: usize, tier: usize) -> faultline::Manager {
    let mut c = common::config(budget);
    c.experiment.fault_locks = Some(4);
    common::manager_with(c.with_tier(tier))
}

/// The whole region, read through `read_at`.
fn contents(r: &Region) -> Vec<u8> {
    let mut v = vec![0u8; r.len()];
    r.read_at(0, &mut v).expect("read_at inside the region");
    v
}

/// Sets every byte of the region to `v`, through `write_at`.
fn fill(r: &Region, v: u8) {
    r.write_at(0, &vec![v; r.len()])
        .expect("write_at inside the region");
}

/// Two writer threads own alternate words of `regions` and write counters
/// to random ones while `body` runs; then every word must hold its last
/// value (or zero if never written).
fn with_writers(regions: &[&Region], body: impl FnOnce() + Send) {
    let stop = AtomicBool::new(false);
    let oracles = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2usize)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let mut next = rng(t as u64 + 7);
                    let mut mine: Vec<std::collections::HashMap<usize, u64>> =
                        vec![Default::default(); regions.len()];
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for (ri, r) in regions.iter().enumerate() {
                            let words = r.len() / 8;
                            let w = (next() as usize % (words / 2)) * 2 + t;
                            n += 1;
                            let v = (n << 8) | (t as u64 + 1);
                            // Word w is written only by thread t.
                            let word = &r.atomics()[w];
                            let old = word.load(Ordering::Relaxed);
                            assert_eq!(
                                old,
                                mine[ri].get(&w).copied().unwrap_or(0),
                                "word {w} of region {ri} changed under a migration"
                            );
                            word.store(v, Ordering::Relaxed);
                            mine[ri].insert(w, v);
                        }
                    }
                    mine
                })
            })
            .collect();
        body();
        stop.store(true, Ordering::Relaxed);
        writers
            .into_iter()
            .map(|h| h.join().expect("writer"))
            .collect::<Vec<_>>()
    });
    for (ri, r) in regions.iter().enumerate() {
        // The writers are done.
        for (w, word) in r.atomics().iter().enumerate() {
            let got = word.load(Ordering::Relaxed);
            let want = oracles[w % 2][ri].get(&w).copied().unwrap_or(0);
            assert_eq!(got, want, "region {ri} word {w}");
        }
    }
}

#[test]
fn migrate_back_and_forth_under_concurrent_access() {
    let mm = tiered(64 * MIB, 64 * MIB);
    assert_eq!(mm.pools(), 2);
    let small = mm.map(4 * MIB, Zero, MapOptions::new()).expect("map 4k");
    let huge = mm
        .map(8 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
        .expect("map 2m");
    let plans = [
        CopyPlan {
            method: CopyMethod::PerPage,
            threads: 1,
            chunk: 256 << 10,
        },
        CopyPlan {
            method: CopyMethod::Chunked,
            threads: 1,
            chunk: 256 << 10,
        },
        CopyPlan {
            method: CopyMethod::ChunkedNt,
            threads: 3,
            chunk: 64 << 10,
        },
    ];
    let mut rounds = 0;
    with_writers(&[&small, &huge], || {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            for r in [&small, &huge] {
                let plan = plans[rounds % plans.len()];
                let to = 1 - (rounds / plans.len()) % 2;
                let rep = r.migrate_with(0..r.len(), to, plan).expect("migrate");
                assert!(rep.bytes <= r.len());
            }
            rounds += 1;
        }
    });
    assert!(rounds >= 6, "only {rounds} rounds in 3 s");
    let st = mm.stats();
    assert!(st.migrated_pages > 0, "{st}");
    // Everything back in pool 1, then every resident page reports it.
    small.migrate(0..small.len(), 1).expect("to tier");
    huge.migrate(0..huge.len(), 1).expect("to tier");
    for off in (0..small.len()).step_by(4096) {
        if let Some(p) = small.pool_of(off) {
            assert_eq!(p, 1, "4k page at {off:#x}");
        }
    }
    for off in (0..huge.len()).step_by(2 * MIB) {
        if let Some(p) = huge.pool_of(off) {
            assert_eq!(p, 1, "2m page at {off:#x}");
        }
    }
    assert!(mm.pool_bytes(1).1 < 64 * MIB, "tier holds pages now");
    assert!(mm.take_error().is_none());
}

/// A worker helps only from a CPU other than the migrating thread's, and
/// only if it wakes before the owner has claimed every piece (about 1 ms
/// of copy here): so the test migrates until one has helped, for up to
/// 20 s (a busy host may take many tries), and needs two CPUs to run on.
#[test]
fn idle_workers_help_with_the_copy() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "this test needs two CPUs (a worker helps only from another CPU than the copy's owner); this process may run on {cpus}"
    );
    let mm = tiered(32 * MIB, 32 * MIB);
    let r = mm
        .map(8 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
        .expect("map");
    fill(&r, 0x5a);
    let plan = CopyPlan {
        method: CopyMethod::Chunked,
        threads: 2,
        chunk: 32 << 10,
    };
    let mut i = 0;
    let t0 = std::time::Instant::now();
    while mm.stats().copy_chunks_helped == 0 && t0.elapsed() < std::time::Duration::from_secs(20) {
        r.migrate_with(0..r.len(), 1 - i % 2, plan)
            .expect("migrate");
        i += 1;
    }
    assert!(
        mm.stats().copy_chunks_helped > 0,
        "no worker took a copy piece in {i} migrations ({:?})",
        t0.elapsed()
    );
    assert!(contents(&r).iter().all(|&b| b == 0x5a));
}

#[test]
fn collapse_under_concurrent_access_makes_a_huge_page() {
    let mm = tiered(64 * MIB, 16 * MIB);
    let r = mm.map(4 * MIB, Zero, MapOptions::new()).expect("map");
    // Every page resident, scattered over 4 KiB frames.
    for off in (0..r.len()).step_by(4096).rev() {
        set_byte(&r, off, 1);
    }
    r.store_u64(0, 0).expect("store_u64");
    for off in (0..r.len()).step_by(4096).rev() {
        // Word 0 of each page back to zero for the oracle.
        r.store_u64(off, 0).expect("store_u64");
    }
    let mut collapses = 0;
    with_writers(&[&r], || {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let rep = r.collapse(0..r.len()).expect("collapse");
            collapses += rep.pages / 512;
            // Scatter again: to the tier page by page, then back.
            r.migrate(0..r.len(), 1).expect("to tier");
            r.migrate(0..r.len(), 0).expect("back");
        }
    });
    assert!(collapses >= 2, "{collapses}");
    // One page of each block elsewhere: both blocks must collapse again.
    r.migrate(0..4096, 1).expect("one page out");
    r.migrate(2 * MIB + 8192..2 * MIB + 12288, 1)
        .expect("one page out");
    let rep = r.collapse(0..r.len()).expect("collapse");
    assert_eq!(rep.bytes, 4 * MIB, "{rep:?}");
    let pm = PageMap::open().expect("pagemap");
    let huge = pm
        .huge_bytes(r.addr(), r.addr() + r.len())
        .expect("PAGEMAP_SCAN");
    assert_eq!(huge, 4 * MIB, "collapsed blocks are PMD-mapped");
    assert!(mm.stats().collapses >= 2);
    // A second collapse has nothing to do.
    assert_eq!(r.collapse(0..r.len()).expect("again").bytes, 0);
}

#[test]
fn full_pool_fails_cleanly_and_keeps_the_data() {
    let mm = tiered(32 * MIB, 2 * MIB);
    let r = mm.map(4 * MIB, Zero, MapOptions::new()).expect("map");
    let pattern: Vec<u8> = (0..r.len()).map(|i| ((i * 31) >> 12) as u8).collect();
    r.write_at(0, &pattern).expect("write_at");
    let before: Vec<u8> = contents(&r);
    match r.migrate(0..r.len(), 1) {
        Err(MigrateError::PoolFull { pool: 1, addr, .. }) => {
            assert_eq!(addr, r.addr() + 2 * MIB, "the second block did not fit");
        }
        other => panic!("expected PoolFull, got {other:?}"),
    }
    assert!(contents(&r) == before, "data intact");
    assert_eq!(r.pool_of(0), Some(1), "the first block moved");
    assert_eq!(r.pool_of(2 * MIB), Some(0), "the second stayed");
    assert!(matches!(
        r.migrate(0..4096, 7),
        Err(MigrateError::NoSuchPool { pool: 7, pools: 2 })
    ));
    assert!(matches!(
        r.migrate(0..r.len() + 1, 0),
        Err(MigrateError::OutOfRange { .. })
    ));
    // 2 MiB pages: the tier (now full) takes none; then back, and in again.
    let h = mm
        .map(4 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
        .expect("map");
    fill(&h, 9);
    assert!(matches!(
        h.migrate(0..h.len(), 1),
        Err(MigrateError::PoolFull { .. })
    ));
    r.migrate(0..r.len(), 0).expect("back to pool 0");
    assert_eq!(mm.pool_bytes(1), (2 * MIB, 2 * MIB));
    let e = h.migrate(0..h.len(), 1).expect_err("one of two fits");
    assert!(matches!(e, MigrateError::PoolFull { .. }), "{e}");
    assert_eq!(h.pool_of(0), Some(1));
    assert!(contents(&h).iter().all(|&b| b == 9));
    assert!(contents(&r) == before);
    // Collapse needs every page of the block.
    let sparse = mm.map(2 * MIB, Zero, MapOptions::new()).expect("map");
    set_byte(&sparse, 0, 3);
    assert!(matches!(
        sparse.collapse(0..sparse.len()),
        Err(MigrateError::NotResident { .. })
    ));
    assert_eq!(byte(&sparse, 0), 3);
    assert!(matches!(
        h.collapse(0..h.len()),
        Err(MigrateError::NotCollapsible { .. })
    ));
}

#[test]
fn one_pool_per_numa_node() {
    let nodes = faultline_sys::host::numa_nodes();
    let mut c = Config::default();
    c.workers = 2;
    c.experiment.fault_locks = Some(4);
    let mm = common::manager_with(c.with_node_pools(16 * MIB));
    assert_eq!(mm.pools(), nodes.len());
    assert_eq!(mm.config().node, Some(nodes[0]), "pool 0 is bound");
    let r = mm.map(4 * MIB, Zero, MapOptions::new()).expect("map");
    fill(&r, 4);
    let last = nodes.len() - 1;
    r.migrate(0..r.len(), last).expect("to the last node");
    assert_eq!(r.pool_of(0), Some(last));
    assert!(contents(&r).iter().all(|&b| b == 4));
    // A node that is not online is refused.
    let mut bad = Config::default();
    bad.node = Some(63);
    assert!(bad.validate().is_err());
}

#[test]
fn small_page_zone_serves_4k_frames_and_thp_zone_2m() {
    let mut c = common::config(32 * MIB);
    c.experiment.fault_locks = Some(4);
    c.small_zone_pct = 50;
    let mm = common::manager_with(c);
    assert_eq!(mm.pools(), 1);
    let small = mm.map(8 * MIB, Zero, MapOptions::new()).expect("map 4k");
    let huge = mm
        .map(8 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
        .expect("map 2m");
    fill(&small, 3);
    fill(&huge, 4);
    assert!(contents(&small).iter().all(|&b| b == 3));
    assert!(contents(&huge).iter().all(|&b| b == 4));
    let pm = PageMap::open().expect("pagemap");
    assert_eq!(
        pm.huge_bytes(huge.addr(), huge.addr() + huge.len())
            .expect("scan"),
        8 * MIB,
        "2 MiB pages come from the THP zone, PMD-mapped"
    );
    // A collapse takes its 2 MiB frame from the THP zone too.
    small.collapse(0..2 * MIB).expect("collapse");
    assert_eq!(
        pm.huge_bytes(small.addr(), small.addr() + 2 * MIB)
            .expect("scan"),
        2 * MIB
    );
    assert!(contents(&small).iter().all(|&b| b == 3));
    assert!(mm.take_error().is_none());
}

#[test]
fn pages_the_kernel_will_not_move_stay_and_do_not_hold_the_locks() {
    if common::in_child() {
        // The program lets a child inherit the region (MADV_DOFORK) and
        // forks one that lives on: every page of the region is now shared
        // copy-on-write, and UFFDIO_MOVE refuses to move a page that is not
        // the process's alone (EBUSY) for as long as the child lives. A
        // migration must give up on such pages within a move's deadline,
        // not retry each one for a deadline while it holds the fault locks
        // every other fault needs.
        let mm = tiered(16 * MIB, 16 * MIB);
        let r = mm.map(2 * MIB, Zero, MapOptions::new()).expect("map");
        fill(&r, 0x5a);
        let child = common::SharingChild::fork(r.as_mut_ptr(), r.len());
        let t = Instant::now();
        let moved = r.migrate(0..r.len(), 1);
        let took = t.elapsed();
        drop(child);
        let report = moved.expect("migrate");
        assert!(
            took < Duration::from_secs(10),
            "the migration held on for {took:?} ({} of 512 pages moved)",
            report.pages
        );
        assert_eq!(report.pages, 0, "a shared page moved");
        assert_eq!(report.refused, 512, "{report:?}");
        assert!(contents(&r).iter().all(|&b| b == 0x5a), "data changed");
        assert!(mm.take_error().is_none());
        println!("refused pages left in {took:?}, {} moved", report.pages);
        std::process::exit(0);
    }
    common::run_in_child(
        "pages_the_kernel_will_not_move_stay_and_do_not_hold_the_locks",
        "refused pages left in",
    );
}
