//! A long stress test with a checksum oracle: threads race faults on shared
//! regions — which a migrator moves between two pools and collapses
//! meanwhile — and churn private ones (map, write, verify, unmap) for a while;
//! every word written must read back, every untouched word must be zero, and
//! at the end every frame is back in the pool. Needs userfaultfd (root);
//! fails with the reason otherwise. `FAULTLINE_STRESS_SECS` sets the length
//! (default 8 s).

use faultline::store::Zero;
use faultline::{MapOptions, MigrateError, PageSize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{rng, MIB};

/// The value thread `t` writes into word `w` of a region in round `round`.
fn value(t: usize, round: u64, w: usize) -> u64 {
    ((t as u64) << 56) ^ (round << 32) ^ (w as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1
}

#[test]
fn stress_checksum_oracle() {
    let secs: u64 = std::env::var("FAULTLINE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    // Pool 0 plus a tier the shared regions migrate to and from meanwhile.
    let mm = common::manager_with(
        faultline::Config {
            budget: 128 * MIB,
            workers: 2,
            fault_locks: 4,
            ..faultline::Config::default()
        }
        .with_tier(64 * MIB),
    );
    let threads = 4;
    let stop = AtomicBool::new(false);
    let checked = AtomicU64::new(0);
    // Shared regions: every thread writes its own words (word w belongs to
    // thread w % threads) of random pages, so faults on one page race.
    let shared_4k = mm.map(16 * MIB, Zero, MapOptions::new()).expect("map");
    let shared_2m = mm
        .map(
            32 * MIB,
            Zero,
            MapOptions::new().page_size(PageSize::Huge2M),
        )
        .expect("map");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let migrations = AtomicU64::new(0);
    let oracles: Vec<Vec<std::collections::HashMap<usize, u64>>> = std::thread::scope(|s| {
        // 3. A migrator: moves both shared regions between the pools and
        //    collapses the 4 KiB one's fully touched blocks, while the
        //    threads write them.
        s.spawn(|| {
            let mut to = 1;
            while Instant::now() < deadline {
                for r in [&shared_4k, &shared_2m] {
                    match r.migrate(0..r.len(), to) {
                        Ok(_) | Err(MigrateError::PoolFull { .. }) => {}
                        Err(e) => panic!("migrate: {e}"),
                    }
                }
                match shared_4k.collapse(0..shared_4k.len()) {
                    Ok(_) | Err(MigrateError::NotResident { .. }) => {}
                    Err(e) => panic!("collapse: {e}"),
                }
                to = 1 - to;
                migrations.fetch_add(1, Ordering::Relaxed);
            }
        });
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (mm, stop, checked) = (&mm, &stop, &checked);
                let shared = [&shared_4k, &shared_2m];
                s.spawn(move || {
                    let mut next = rng(t as u64 + 1);
                    let mut round = 0u64;
                    // The oracle: which words this thread wrote in the shared
                    // regions (and with what round).
                    let mut mine: Vec<std::collections::HashMap<usize, u64>> =
                        vec![Default::default(); 2];
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        round += 1;
                        // 1. Race on the shared regions.
                        for (si, r) in shared.iter().enumerate() {
                            let words = r.len() / 8;
                            for _ in 0..64 {
                                let w = (next() as usize % (words / threads)) * threads + t;
                                let p = (r.addr() + w * 8) as *mut u64;
                                // SAFETY: inside a live region; word w is written
                                // only by thread t.
                                unsafe { p.write_volatile(value(t, round, w)) };
                                mine[si].insert(w, round);
                            }
                        }
                        // 2. A private region: map, fill a random subset of pages,
                        // verify every page, unmap.
                        let size = if next() % 2 == 0 {
                            PageSize::Base4K
                        } else {
                            PageSize::Huge2M
                        };
                        let len = if size == PageSize::Base4K {
                            2 * MIB
                        } else {
                            4 * MIB
                        };
                        let mut r = match mm.map(len, Zero, MapOptions::new().page_size(size)) {
                            Ok(r) => r,
                            Err(e) => panic!("map failed: {e}"),
                        };
                        let pages = len / size.bytes();
                        let mut touched = vec![false; pages];
                        {
                            let bytes = r.as_mut_slice();
                            // SAFETY: the region is 8-byte aligned (page aligned)
                            // and its length a multiple of 8.
                            let (_, words, _) = unsafe { bytes.align_to_mut::<u64>() };
                            let per_page = size.bytes() / 8;
                            for _ in 0..pages.min(64) {
                                let p = next() as usize % pages;
                                touched[p] = true;
                                let w = p * per_page + next() as usize % per_page;
                                words[w] = value(t, round, w);
                            }
                        }
                        let bytes = r.as_slice();
                        // SAFETY: as above.
                        let (_, words, _) = unsafe { bytes.align_to::<u64>() };
                        let per_page = size.bytes() / 8;
                        for (p, &was) in touched.iter().enumerate() {
                            for (i, &v) in
                                words[p * per_page..(p + 1) * per_page].iter().enumerate()
                            {
                                let w = p * per_page + i;
                                assert!(
                                    v == 0 || (was && v == value(t, round, w)),
                                    "thread {t} round {round}: private word {w} holds {v:#x}"
                                );
                            }
                        }
                        drop(r);
                        checked.fetch_add(1, Ordering::Relaxed);
                    }
                    // Verify this thread's words of the shared regions.
                    for (si, r) in shared.iter().enumerate() {
                        for (&w, &rd) in &mine[si] {
                            // SAFETY: inside a live region.
                            let v = unsafe { ((r.addr() + w * 8) as *const u64).read_volatile() };
                            if v != value(t, rd, w) { eprintln!("DIAG {:?} page {}", mm.stats(), w*8/(r.len()/ (r.len()>>21).max(1)).max(1)); while let Some(e) = mm.take_error() { eprintln!("DIAGERR {e}"); } }
                            assert_eq!(v, value(t, rd, w), "thread {t}: shared word {w} lost");
                        }
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("stress thread"))
            .collect()
    });
    stop.store(true, Ordering::Relaxed);
    // The whole shared regions against the union of the oracles: every word
    // is its last written value, or zero if nobody wrote it.
    for (si, r) in [&shared_4k, &shared_2m].iter().enumerate() {
        // SAFETY: page aligned, length a multiple of 8.
        let (_, words, _) = unsafe { r.as_slice().align_to::<u64>() };
        for (w, &v) in words.iter().enumerate() {
            let t = w % threads;
            let want = oracles[t][si].get(&w).map_or(0, |&rd| value(t, rd, w));
            assert_eq!(v, want, "shared region {si}, word {w}");
        }
    }
    assert!(checked.load(Ordering::Relaxed) > 0);
    assert!(migrations.load(Ordering::Relaxed) > 0);
    if let Some(e) = mm.take_error() {
        panic!("fault error during the stress run: {e}");
    }
    drop(shared_4k);
    drop(shared_2m);
    let st = mm.stats();
    assert_eq!(st.frames_free, st.frames_total, "frames leaked: {st}");
    assert_eq!(st.poisoned, 0, "{st}");
    println!(
        "stress: {} private regions checked, {} migration rounds\n{st}",
        checked.load(Ordering::Relaxed),
        migrations.load(Ordering::Relaxed)
    );
}
