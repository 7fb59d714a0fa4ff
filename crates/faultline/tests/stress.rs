//! Long stress tests with a checksum oracle. Needs userfaultfd (root); fails
//! with the reason otherwise. `FAULTLINE_STRESS_SECS` sets each test's
//! length (default 8 s), `FAULTLINE_STRESS_SEED` the seed of every random
//! choice (default 1; printed on failure). CI runs them under load (two CPU
//! hogs beside them) with several seeds.
//!
//! 1. [`stress_checksum_oracle`]: threads race faults on shared zero-filled
//!    regions — which a migrator moves between two pools and collapses
//!    meanwhile, a dropper `MADV_DONTNEED`s pages nobody writes inside the
//!    same 2 MiB pages others write, and a forker forks children that exit —
//!    and churn private ones (map, write, verify, unmap).
//! 2. [`stress_store_backed_oracle`]: the same writers over file-backed
//!    regions (4 KiB and 2 MiB pages) four times the budget, with
//!    sequential sweeps of the 4 KiB one (streams that read ahead), so reclaim
//!    parks, evicts and writes back all the time, with a flusher, the
//!    dropper, the forker, a migrator (to a tier and back, and collapses),
//!    a budget that shrinks and grows (`set_budget`: the balloon) and
//!    map/unmap churn of private file regions checked on disk; at the
//!    end a fresh manager reopens the files and every byte must match the
//!    oracle.
//!
//! Every word written must read back, every word nobody wrote must read its
//! initial value, and at the end every frame is back in the pool. Each runs
//! twice: faults served by workers, and in the faulting threads (`_in_thread`).
//! `FAULTLINE_STRESS_FILL` (`auto`, the default: `copy-protected` with
//! workers and `copy` in-thread; or `copy`, `copy-protected`, `move`)
//! chooses the fill model of every manager (`Config::fill_model`); CI runs
//! seeds in each.

use faultline::store::{FileOptions, Zero};
use faultline::{FaultMode, FillModel, MapOptions, MigrateError, PageSize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{rng, ScratchDir, MIB};

/// The value thread `t` writes into word `w` of a region in round `round`.
fn value(t: usize, round: u64, w: usize) -> u64 {
    ((t as u64) << 56) ^ (round << 32) ^ (w as u64).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1
}

/// The run's seed (`FAULTLINE_STRESS_SEED`, default 1).
fn seed() -> u64 {
    std::env::var("FAULTLINE_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// The fill model every manager uses (`FAULTLINE_STRESS_FILL`).
fn fill_model() -> FillModel {
    match std::env::var("FAULTLINE_STRESS_FILL").as_deref() {
        Ok("move") => FillModel::Move,
        Ok("copy-protected") => FillModel::CopyProtected,
        Ok("copy") => FillModel::Copy,
        Ok("auto") | Err(_) => FillModel::Auto,
        Ok(other) => {
            panic!("FAULTLINE_STRESS_FILL={other}: auto, copy, copy-protected or move")
        }
    }
}

fn secs() -> u64 {
    std::env::var("FAULTLINE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

/// Every 8th 4 KiB page is the dropper's: nobody writes it, and the dropper
/// `MADV_DONTNEED`s it while the threads write the other pages of the same
/// 2 MiB page (the partial drop that used to lose the rest of the page).
fn dropper_page(word: usize) -> bool {
    (word * 8 / 4096) % 8 == 7
}

/// A word of thread `t` (of `threads`) in a region of `words` words that
/// is not on a dropper page.
fn pick_word(next: &mut impl FnMut() -> u64, words: usize, threads: usize, t: usize) -> usize {
    loop {
        let w = (next() as usize % (words / threads)) * threads + t;
        if !dropper_page(w) {
            return w;
        }
    }
}

/// Drops random dropper pages of `regions` until `deadline`, checking each
/// reads its initial value (`initial(region, offset)`) afterwards.
fn run_dropper(
    regions: &[&faultline::Region],
    deadline: Instant,
    initial: impl Fn(usize, usize) -> u8,
) -> u64 {
    let mut next = rng(seed() ^ 0xD209);
    let mut drops = 0;
    while Instant::now() < deadline {
        let ri = next() as usize % regions.len();
        let r = regions[ri];
        let pages = r.len() / 4096;
        let p = (next() as usize % (pages / 8)) * 8 + 7;
        let page = r.as_mut_ptr().wrapping_add(p * 4096);
        // SAFETY: a page of a live region that only this thread touches.
        let rc = unsafe { libc::madvise(page.cast(), 4096, libc::MADV_DONTNEED) };
        assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
        let b = common::byte(r, p * 4096 + 100);
        assert_eq!(
            b,
            initial(ri, p * 4096 + 100),
            "dropped page {p} of region {ri}"
        );
        drops += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    drops
}

/// Forks children that touch their own memory and exit, until `deadline`.
fn run_forker(deadline: Instant) -> u64 {
    let mut forks = 0;
    while Instant::now() < deadline {
        // SAFETY: the child writes a stack buffer and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let mut buf = [0u8; 4096];
            for (i, b) in buf.iter_mut().enumerate() {
                // SAFETY: a local buffer.
                unsafe { std::ptr::write_volatile(b, i as u8) };
            }
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        forks += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    forks
}

#[test]
fn stress_checksum_oracle() {
    checksum_oracle(FaultMode::Workers);
}

#[test]
fn stress_checksum_oracle_in_thread() {
    checksum_oracle(FaultMode::InThread);
}

fn checksum_oracle(mode: FaultMode) {
    let secs = secs();
    let seed = seed();
    // Pool 0 plus a tier the shared regions migrate to and from meanwhile.
    let mm = common::manager_with({
        let mut c = common::config(128 * MIB);
        c.fill_model = fill_model();
        c.fault_mode = mode;
        c.experiment.fault_locks = Some(4);
        // Free memory goes back to the kernel after 0.2 s of disuse and is
        // taken back by faults and migrations all through the run.
        c.idle_release = Some(Duration::from_millis(200));
        c.with_tier(64 * MIB)
    });
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
    let drops = AtomicU64::new(0);
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
                        Err(e) => {
                            let queued: Vec<String> =
                                std::iter::from_fn(|| mm.take_error().map(|e| e.to_string()))
                                    .collect();
                            panic!("migrate: {e}; queued errors: {queued:?}")
                        }
                    }
                }
                match shared_4k.collapse(0..shared_4k.len()) {
                    // No free 2 MiB frame in a fragmented pool, or a page
                    // the kernel would not move out for a move's deadline
                    // (the whole region is 4 KiB pages in whole blocks, so
                    // that is the only NotCollapsible here): nothing moved,
                    // as for a migration.
                    Ok(_)
                    | Err(MigrateError::NotResident { .. })
                    | Err(MigrateError::NotCollapsible { .. })
                    | Err(MigrateError::PoolFull { .. }) => {}
                    Err(e) => {
                        let queued: Vec<String> =
                            std::iter::from_fn(|| mm.take_error().map(|e| e.to_string())).collect();
                        panic!("collapse: {e}; queued errors: {queued:?}")
                    }
                }
                to = 1 - to;
                migrations.fetch_add(1, Ordering::Relaxed);
            }
        });
        s.spawn(|| {
            let n = run_dropper(&[&shared_4k, &shared_2m], deadline, |_, _| 0);
            drops.fetch_add(n, Ordering::Relaxed);
        });
        s.spawn(|| run_forker(deadline));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (mm, stop, checked) = (&mm, &stop, &checked);
                let shared = [&shared_4k, &shared_2m];
                s.spawn(move || {
                    let mut next = rng((t as u64 + 1) ^ seed.wrapping_mul(0x9E37_79B9));
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
                                let w = pick_word(&mut next, words, threads, t);
                                // Word w is written only by thread t.
                                r.atomics()[w].store(value(t, round, w), Ordering::Relaxed);
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
                        let r = match mm.map(len, Zero, MapOptions::new().page_size(size)) {
                            Ok(r) => r,
                            Err(e) => panic!("map failed: {e}"),
                        };
                        let pages = len / size.bytes();
                        let mut touched = vec![false; pages];
                        {
                            let words = r.atomics();
                            let per_page = size.bytes() / 8;
                            for _ in 0..pages.min(64) {
                                let p = next() as usize % pages;
                                touched[p] = true;
                                let w = p * per_page + next() as usize % per_page;
                                words[w].store(value(t, round, w), Ordering::Relaxed);
                            }
                        }
                        // Now and then the program unmaps the region's
                        // second half itself before dropping it
                        // (UFFD_EVENT_UNMAP while everything else runs).
                        let keep = if next() % 4 == 0 {
                            let half = r.len() / 2;
                            // SAFETY: the second half of this thread's own
                            // region; only its first half is read below.
                            let rc = unsafe {
                                libc::munmap(r.as_mut_ptr().wrapping_add(half).cast(), half)
                            };
                            assert_eq!(rc, 0, "munmap: {}", std::io::Error::last_os_error());
                            pages / 2
                        } else {
                            pages
                        };
                        // Read what is left of the region (its mapped first
                        // `keep` pages only) word by word.
                        let mut bytes = vec![0u8; keep * size.bytes()];
                        r.read_at(0, &mut bytes).expect("read_at");
                        let words: Vec<u64> = bytes
                            .chunks_exact(8)
                            .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")))
                            .collect();
                        let per_page = size.bytes() / 8;
                        for (p, &was) in touched.iter().enumerate().take(keep) {
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
                            let v = r.atomics()[w].load(Ordering::Relaxed);
                            assert_eq!(
                                v,
                                value(t, rd, w),
                                "seed {seed}: thread {t}: shared word {w} lost"
                            );
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
        for (w, word) in r.atomics().iter().enumerate() {
            let v = word.load(Ordering::Relaxed);
            let t = w % threads;
            let want = oracles[t][si].get(&w).map_or(0, |&rd| value(t, rd, w));
            assert_eq!(v, want, "seed {seed}: shared region {si}, word {w}");
        }
    }
    assert!(checked.load(Ordering::Relaxed) > 0);
    assert!(migrations.load(Ordering::Relaxed) > 0);
    if let Some(e) = mm.take_error() {
        panic!("fault error during the stress run: {e}");
    }
    drop(shared_4k);
    drop(shared_2m);
    let st = common::all_free(&mm);
    assert_eq!(st.frames_free, st.frames_total, "frames leaked: {st}");
    assert_eq!(st.poisoned, 0, "{st}");
    assert!(drops.load(Ordering::Relaxed) > 0);
    println!(
        "stress (seed {seed}): {} private regions checked, {} migration rounds, {} pages dropped\n{st}",
        checked.load(Ordering::Relaxed),
        migrations.load(Ordering::Relaxed),
        drops.load(Ordering::Relaxed)
    );
}

/// File-backed regions four times the budget: writers, a flusher, the
/// dropper and the forker at once; then the file, reopened by a fresh
/// manager, must match the oracle byte for byte.
#[test]
fn stress_store_backed_oracle() {
    store_backed_oracle(FaultMode::Workers);
}

#[test]
fn stress_store_backed_oracle_in_thread() {
    store_backed_oracle(FaultMode::InThread);
}

fn store_backed_oracle(mode: FaultMode) {
    let secs = secs();
    let seed = seed();
    let dir = ScratchDir::new("stress-file");
    let len = 32 * MIB;
    // The initial content of file `i` at byte `o`.
    let initial = |i: usize, o: usize| ((o / 4096) as u8).wrapping_mul(31) ^ (i as u8 + 1);
    let paths: Vec<_> = (0..2)
        .map(|i| {
            let data: Vec<u8> = (0..len).map(|o| initial(i, o)).collect();
            dir.file(&format!("region-{i}"), &data)
        })
        .collect();
    let threads = 3;
    let oracles: Vec<Vec<std::collections::HashMap<usize, u64>>> = {
        let mm = common::manager_with({
            let mut c = common::config(16 * MIB);
            c.fill_model = fill_model();
            c.fault_mode = mode;
            c.experiment.fault_locks = Some(8);
            c.with_tier(8 * MIB)
        });
        let open = |i: usize, size: PageSize| {
            mm.map(
                len,
                // Region 0 moves pages with direct I/O, region 1 through
                // the page cache: both paths under the oracle.
                faultline::store::File::open(
                    &paths[i],
                    FileOptions::new().writable(true).direct(i == 0),
                )
                .expect("open"),
                MapOptions::new().page_size(size),
            )
            .expect("map")
        };
        let regions = [open(0, PageSize::Base4K), open(1, PageSize::Huge2M)];
        let deadline = Instant::now() + Duration::from_secs(secs);
        let flushes = AtomicU64::new(0);
        let oracles = std::thread::scope(|s| {
            s.spawn(|| {
                while Instant::now() < deadline {
                    for r in &regions {
                        r.flush().expect("flush");
                    }
                    flushes.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            s.spawn(|| run_dropper(&[&regions[0], &regions[1]], deadline, initial));
            s.spawn(|| run_forker(deadline));
            // A migrator: ranges of both regions to the tier and back, and
            // collapses of the 4 KiB region's blocks (most are refused:
            // reclaim keeps evicting their pages), while everything runs.
            s.spawn(|| {
                let mut next = rng(seed ^ 0x316);
                let mut to = 1;
                while Instant::now() < deadline {
                    for r in &regions {
                        let start = (next() as usize % (r.len() / (2 * MIB))) * 2 * MIB;
                        match r.migrate(start..start + 2 * MIB, to) {
                            Ok(_) | Err(MigrateError::PoolFull { .. }) => {}
                            Err(e) => panic!("seed {seed}: migrate: {e}"),
                        }
                    }
                    let b = (next() as usize % (len / (2 * MIB))) * 2 * MIB;
                    match regions[0].collapse(b..b + 2 * MIB) {
                        Ok(_)
                        | Err(MigrateError::NotResident { .. })
                        | Err(MigrateError::PoolFull { .. })
                        | Err(MigrateError::NotCollapsible { .. }) => {}
                        Err(e) => panic!("seed {seed}: collapse: {e}"),
                    }
                    to = 1 - to;
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            // A budget that changes all the while: shrinks (reclaim, then
            // the balloon takes the memory back to the kernel) and grows
            // back (refilled frames).
            s.spawn(|| {
                let mut small = true;
                while Instant::now() < deadline {
                    let to = if small { 10 * MIB } else { 16 * MIB };
                    match mm.set_budget(to) {
                        Ok(()) | Err(faultline::BudgetError::Busy { .. }) => {}
                        Err(e) => panic!("seed {seed}: set_budget({to}): {e}"),
                    }
                    small = !small;
                    std::thread::sleep(Duration::from_millis(50));
                }
                mm.set_budget(16 * MIB).expect("budget back");
            });
            // Map/unmap churn: private file regions of their own, written,
            // flushed, dropped and checked on disk.
            s.spawn(|| {
                let mut next = rng(seed ^ 0xC0DE);
                let mut n = 0;
                while Instant::now() < deadline {
                    let f = dir.file(&format!("churn-{}", n % 2), &vec![0u8; MIB]);
                    {
                        let r = mm
                            .map(
                                MIB,
                                faultline::store::File::open(
                                    &f,
                                    FileOptions::new().writable(true).direct(n % 2 == 0),
                                )
                                .expect("open"),
                                MapOptions::new(),
                            )
                            .expect("map");
                        let v = (next() % 250) as u8 + 1;
                        for p in (0..MIB / 4096).step_by(3) {
                            common::set_byte(&r, p * 4096, v);
                        }
                        if next() % 2 == 0 {
                            r.flush().expect("flush");
                        }
                    }
                    let bytes = std::fs::read(&f).expect("read back");
                    for p in 0..MIB / 4096 {
                        let b = bytes[p * 4096];
                        assert!(
                            if p % 3 == 0 { b != 0 } else { b == 0 },
                            "seed {seed}: churn region page {p} reads {b} after drop"
                        );
                    }
                    n += 1;
                }
            });
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let regions = &regions;
                    s.spawn(move || {
                        let mut next = rng((t as u64 + 7) ^ seed.wrapping_mul(0x9E37_79B9));
                        let mut mine: Vec<std::collections::HashMap<usize, u64>> =
                            vec![Default::default(); 2];
                        let mut round = 0u64;
                        while Instant::now() < deadline {
                            round += 1;
                            for (ri, r) in regions.iter().enumerate() {
                                for _ in 0..32 {
                                    let w = pick_word(&mut next, r.len() / 8, threads, t);
                                    // Word w is written only by thread t.
                                    r.atomics()[w].store(value(t, round, w), Ordering::Relaxed);
                                    mine[ri].insert(w, round);
                                }
                                if ri == 0 && round % 4 == 0 {
                                    // A sequential sweep of 64 pages (one
                                    // word of this thread's on each): a
                                    // stream, whose faults read ahead and
                                    // reclaim for their windows.
                                    let pages = r.len() / 4096;
                                    let start = next() as usize % (pages - 64);
                                    for page in start..start + 64 {
                                        let w0 = page * 512;
                                        let w = w0 + (t + threads - w0 % threads) % threads;
                                        if !dropper_page(w) {
                                            r.atomics()[w]
                                                .store(value(t, round, w), Ordering::Relaxed);
                                            mine[ri].insert(w, round);
                                        }
                                    }
                                }
                                // Read back a word written earlier (it may
                                // have been evicted and read from the file).
                                if let Some((&w, &rd)) = mine[ri].iter().next() {
                                    let v = r.atomics()[w].load(Ordering::Relaxed);
                                    assert_eq!(
                                        v,
                                        value(t, rd, w),
                                        "seed {seed}: region {ri} word {w}"
                                    );
                                }
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("stress thread"))
                .collect::<Vec<_>>()
        });
        if let Some(e) = mm.take_error() {
            panic!("seed {seed}: fault error during the run: {e}");
        }
        let st = mm.stats();
        assert!(
            st.evicted > 0 && st.written_back > 0,
            "reclaim did not run: {st}"
        );
        assert!(st.ballooned > 0, "the budget never shrank: {st}");
        assert!(flushes.load(Ordering::Relaxed) > 0);
        println!("stress, store-backed (seed {seed}): {st}");
        oracles
        // The regions drop here: write-back of what is still dirty.
    };
    // A fresh manager reads the files back: every word a thread wrote is its
    // last value, every other byte the file's initial content.
    let mm = common::manager(8 * MIB);
    for (ri, path) in paths.iter().enumerate() {
        let r = mm
            .map_read_only(
                len,
                faultline::store::File::open(path, FileOptions::new()).expect("open"),
                MapOptions::new(),
            )
            .expect("map");
        let mut bytes = vec![0u8; len];
        r.read_at(0, &mut bytes).expect("read_at");
        for (w, c) in bytes.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(c.try_into().expect("8 bytes"));
            let t = w % threads;
            let want = match oracles[t][ri].get(&w) {
                Some(&rd) => value(t, rd, w),
                None => {
                    let mut b = [0u8; 8];
                    for (k, x) in b.iter_mut().enumerate() {
                        *x = initial(ri, w * 8 + k);
                    }
                    u64::from_ne_bytes(b)
                }
            };
            assert_eq!(v, want, "seed {seed}: file {ri}, word {w} after reopening");
        }
    }
}
