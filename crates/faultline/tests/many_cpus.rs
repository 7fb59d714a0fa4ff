//! Managers sized for many CPUs, on whatever machine runs the tests
//! (`Config::cpus` / `ManagerBuilder::cpus`): 64 per-CPU frame lists, each
//! with its share of the pool, and the default worker count for 64 CPUs.
//! Threads fault, write and read back; pages migrate to a tier and back
//! with as many copy threads as the plan allows; a file four times the
//! budget is written and read through reclaim. Every byte is checked.
//! Needs userfaultfd (root); fails with the reason otherwise.

use faultline::store::Zero;
use faultline::{Config, CopyMethod, CopyPlan, ManagerBuilder, MapOptions, PageSize, Region};

mod common;
use common::{ScratchDir, MIB};

/// A manager sized for `cpus` CPUs: `budget` bytes, a tier of `tier`.
fn sized_for(cpus: usize, budget: usize, tier: usize) -> faultline::Manager {
    let mut c = Config::default();
    c.budget = budget;
    c.size_for_cpus(cpus);
    let c = if tier > 0 { c.with_tier(tier) } else { c };
    common::manager_with(c)
}

/// The word every 8 bytes of the region should hold after `write_words`.
fn word(off: usize, round: u64) -> u64 {
    (off as u64).wrapping_mul(0x9E37_79B9) ^ round
}

/// Four threads each write their quarter of the region, word by word
/// (first touches fault, concurrently).
fn write_words(r: &Region, round: u64) {
    let quarter = r.len() / 4;
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                let words = r.atomics();
                for off in (t * quarter..(t + 1) * quarter).step_by(8) {
                    words[off / 8].store(word(off, round), std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
}

fn check_words(r: &Region, round: u64, what: &str) {
    let words = r.atomics();
    for off in (0..r.len()).step_by(8) {
        let got = words[off / 8].load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(got, word(off, round), "{what}: word at {off:#x}");
    }
}

#[test]
fn the_default_worker_count_stops_at_four() {
    assert_eq!(Config::default_workers(1), 1);
    assert_eq!(Config::default_workers(2), 2);
    assert_eq!(Config::default_workers(16), 4);
    assert_eq!(Config::default_workers(200), 4);
    let mm = faultline::Manager::builder()
        .budget(16 * MIB)
        .cpus(64)
        .build()
        .unwrap_or_else(|e| panic!("this test needs userfaultfd with UFFDIO_MOVE: {e}"));
    assert_eq!(mm.config().cpus, 64);
    assert_eq!(mm.config().workers, 4);
    let mut c = Config::default();
    c.cpus = 0;
    let err = ManagerBuilder::from_config(c).build().expect_err("0 CPUs");
    assert!(err.to_string().contains("cpus = 0"), "{err}");
}

/// Seed 001's mechanism on a manager sized for 64 CPUs: 4 KiB and 2 MiB
/// pages go to the tier and back with 1 and with `workers + 1` copy
/// threads (each method), every word intact.
#[test]
fn a_manager_sized_for_64_cpus_faults_and_migrates() {
    let mm = sized_for(64, 64 * MIB, 64 * MIB);
    let small = mm.map(8 * MIB, Zero, MapOptions::new()).expect("map 4k");
    let huge = mm
        .map(
            16 * MIB,
            Zero,
            MapOptions::new().page_size(PageSize::Huge2M),
        )
        .expect("map 2m");
    let most = mm.config().workers + 1;
    let mut round = 1;
    for r in [&small, &huge] {
        write_words(r, round);
        check_words(r, round, "after first touch");
    }
    for method in [
        CopyMethod::PerPage,
        CopyMethod::Chunked,
        CopyMethod::ChunkedNt,
    ] {
        for threads in [1, most] {
            let plan = CopyPlan {
                method,
                threads,
                chunk: 64 << 10,
            };
            for (to, r) in [(1, &small), (1, &huge), (0, &small), (0, &huge)] {
                let rep = r.migrate_with(0..r.len(), to, plan).expect("migrate");
                assert_eq!(
                    rep.bytes,
                    r.len(),
                    "{method:?} x{threads} to pool {to}: {rep:?}"
                );
                check_words(r, round, "after a migration");
            }
            round += 1;
            for r in [&small, &huge] {
                write_words(r, round);
            }
        }
    }
    assert!(mm.take_error().is_none());
}

/// Reclaim through 64 per-CPU lists: a file four times the budget is
/// written whole and read back, page by page from four threads.
#[test]
fn a_manager_sized_for_64_cpus_pages_a_file_through_its_budget() {
    let dir = ScratchDir::new("many-cpus");
    let len = 32 * MIB;
    let path = dir.file("data", &vec![0u8; len]);
    let mm = sized_for(64, 8 * MIB, 0);
    let r = common::map_file(&mm, &path, len / 4096);
    write_words(&r, 7);
    check_words(&r, 7, "through reclaim");
    r.flush().expect("flush");
    drop(r);
    let on_disk = std::fs::read(&path).expect("read the file back");
    for off in (0..len).step_by(8) {
        let got = u64::from_ne_bytes(on_disk[off..off + 8].try_into().expect("8 bytes"));
        assert_eq!(got, word(off, 7), "file word at {off:#x}");
    }
    assert!(mm.stats().evicted > 0, "{}", mm.stats());
    assert!(mm.take_error().is_none());
}
