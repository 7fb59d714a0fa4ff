//! The fill models on real faults (issue 40): a file four times the
//! budget, read and written from 2 threads against an oracle, then flushed
//! and read back by a fresh manager — under `FillModel::Copy` (pages copied
//! in; dead copies in pool slots dropped in batches), `FillModel::Move`,
//! and `FillModel::CopyProtected` (pages read copied in write-protected,
//! dropped clean in batches; a first write lifts the protection), the last
//! with workers and in-thread faults, and the default, `FillModel::Auto`
//! (one of the two copies, by fault mode). The stats tell which model ran.
//! Needs userfaultfd (root); fails with the reason otherwise.

use faultline::store::{File, FileOptions};
use faultline::{FaultMode, FillModel, MapOptions, Region};

mod common;
use common::{config, manager_with, rng, ScratchDir, MIB};

const PAGE: usize = 4096;
const PAGES: usize = 4096; // 16 MiB
const BUDGET: usize = 4 * MIB;

fn map(mm: &faultline::Manager, path: &std::path::Path) -> Region {
    let store = File::open(path, FileOptions::new().writable(true)).expect("open");
    mm.map(PAGES * PAGE, store, MapOptions::new()).expect("map")
}

fn manager(model: FillModel) -> faultline::Manager {
    manager_in(model, FaultMode::Workers)
}

fn manager_in(model: FillModel, mode: FaultMode) -> faultline::Manager {
    let mut c = config(BUDGET);
    c.fill_model = model;
    c.fault_mode = mode;
    manager_with(c)
}

/// Words written: the oracle's word at `word` of `page` after round `r`.
fn word(page: usize, w: usize, round: u64) -> u64 {
    ((page as u64) << 32) ^ ((w as u64) << 8) ^ round.wrapping_mul(0x9E37_79B9)
}

/// What word `w` of `page` holds after round `round` last wrote it (0:
/// never, so the file's initial bytes).
fn expected(initial: &[u8], page: usize, w: usize, round: u64) -> u64 {
    match round {
        0 => {
            let at = page * PAGE + w * 8;
            u64::from_le_bytes(initial[at..at + 8].try_into().expect("8 bytes"))
        }
        k => word(page, w, k),
    }
}

fn run(model: FillModel) {
    run_in(model, FaultMode::Workers)
}

fn run_in(model: FillModel, mode: FaultMode) {
    run_with(manager_in(model, mode), model)
}

fn run_with(mm: faultline::Manager, model: FillModel) {
    let dir = ScratchDir::new("fill-model");
    let initial: Vec<u8> = (0..PAGES * PAGE).map(|i| (i % 253) as u8).collect();
    let path = dir.file("data", &initial);
    let r = map(&mm, &path);
    // Each of 2 threads owns the pages of one parity, and writes the first
    // 8 words of random pages of its own, round after round; every page's
    // latest round is its oracle.
    let rounds: Vec<Vec<u64>> = std::thread::scope(|t| {
        let workers: Vec<_> = (0..2usize)
            .map(|parity| {
                let (r, initial) = (&r, &initial);
                t.spawn(move || {
                    let mut next = rng(7 + parity as u64);
                    let mut last = vec![0u64; PAGES];
                    for round in 1..=6000u64 {
                        let page = (next() as usize % (PAGES / 2)) * 2 + parity;
                        if next() % 3 == 0 {
                            for w in 0..8 {
                                r.store_u64(page * PAGE + w * 8, word(page, w, round))
                                    .expect("store");
                            }
                            last[page] = round;
                        } else {
                            let got = r.load_u64(page * PAGE).expect("load");
                            let want = expected(initial, page, 0, last[page]);
                            assert_eq!(got, want, "{model:?}: page {page} round {round}");
                        }
                    }
                    last
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("thread"))
            .collect()
    });
    let s = mm.stats();
    // The model in effect (`Auto` resolved at build).
    let in_effect = mm.config().fill_model;
    assert_eq!(in_effect, model.under(mm.config().fault_mode));
    match in_effect {
        FillModel::Copy => {
            assert!(s.copies > 0, "{model:?}: nothing copied in: {s}");
            assert!(s.stale_dropped > 0, "{model:?}: no dead copy dropped: {s}");
        }
        FillModel::CopyProtected => {
            assert!(s.copies > 0, "{model:?}: nothing copied in: {s}");
            // Pages read first and evicted unwritten: dropped, not parked.
            assert!(s.clean_dropped > 0, "{model:?}: no clean page dropped: {s}");
            // Pages read, then written: the write lifted the protection.
            assert!(
                s.protection_lifted > 0,
                "{model:?}: no protection lifted: {s}"
            );
        }
        FillModel::Move => assert_eq!(s.copies, 0, "{model:?}: {s}"),
        FillModel::Auto => panic!("the manager's config says Auto, not the model in effect"),
    }
    assert!(s.evicted > 0, "{model:?}: the budget never filled: {s}");
    r.flush().expect("flush");
    drop(r);
    drop(mm);
    // A fresh manager reads what the first wrote back.
    let mm = manager(model);
    let r = map(&mm, &path);
    for page in 0..PAGES {
        let k = rounds[page % 2][page];
        for w in 0..8 {
            let got = r.load_u64(page * PAGE + w * 8).expect("load");
            let want = expected(&initial, page, w, k);
            assert_eq!(
                got, want,
                "{model:?}: page {page} word {w} after a fresh map"
            );
        }
    }
}

#[test]
fn copy_fill_keeps_every_word_through_reclaim_and_write_back() {
    run(FillModel::Copy);
}

#[test]
fn move_fill_keeps_every_word_through_reclaim_and_write_back() {
    run(FillModel::Move);
}

#[test]
fn protected_copy_keeps_every_word_through_clean_drops_and_write_back() {
    run(FillModel::CopyProtected);
}

/// The default model: protected copies with workers, plain copies
/// in-thread (the stats check which ran).
#[test]
fn default_fill_keeps_every_word_with_workers_and_in_thread() {
    run(FillModel::default());
    run_in(FillModel::default(), FaultMode::InThread);
}

#[test]
fn protected_copy_in_thread_keeps_every_word() {
    run_in(FillModel::CopyProtected, FaultMode::InThread);
}

/// One fault lock for every page (the seed's baseline): the hand's batch
/// holds it from the first clean page on, and must still step the rest
/// (under the lock it holds) rather than pass every page over.
#[test]
fn protected_copy_with_one_fault_lock_keeps_every_word() {
    let mut c = config(BUDGET);
    c.fill_model = FillModel::CopyProtected;
    c.experiment.locks = faultline::LockMode::Global;
    run_with(manager_with(c), FillModel::CopyProtected);
}

/// Dead copies do not outlive a quiet moment: the background reclaimer
/// drops the queue at its next check, so a manager that stops filling
/// holds no more than its budget.
#[test]
fn dead_copies_are_dropped_when_faults_stop() {
    let mm = manager(FillModel::Copy);
    let dir = ScratchDir::new("fill-model-idle");
    let path = dir.file("data", &vec![5u8; 64 * PAGE]);
    let r = map(&mm, &path);
    // Fewer than a batch, and no reclaim: only the idle drop can take them.
    // Pages 5 apart: no read-ahead stream (whose longer runs move).
    for page in (0..10).map(|i| i * 5) {
        assert_eq!(
            r.load_u64(page * PAGE).expect("load"),
            0x0505_0505_0505_0505
        );
    }
    // The worker counts a copy after the copy wakes the faulting thread:
    // wait for the count too.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let s = mm.stats();
        if s.copies >= 10 && s.stale_dropped >= s.copies {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after 5 s, 10 copies not counted or dead copies still queued: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // And the pages are still right.
    for page in (0..10).map(|i| i * 5) {
        assert_eq!(
            r.load_u64(page * PAGE).expect("load"),
            0x0505_0505_0505_0505
        );
    }
}

/// Pages read under `CopyProtected` go in write-protected and take no
/// fingerprint: their protection says they are the store's copy. A flush
/// passes them over (no park, no write); a page written since is written
/// (also one whose write put back the bytes it held: the cost of taking no
/// fingerprint); and a page the program dropped, read again (gathered from
/// the store, parked and put back unprotected), is fingerprinted on the way
/// and counts clean — never skipped when written.
#[test]
fn protected_pages_are_flushed_without_a_park_or_a_write() {
    let mm = manager(FillModel::CopyProtected);
    let dir = ScratchDir::new("fill-model-flush-protected");
    let path = dir.file("data", &vec![7u8; 64 * PAGE]);
    let r = map(&mm, &path);
    let pages: Vec<usize> = (0..10).map(|i| i * 5).collect();
    // Pages 5 apart: lone misses, each copied in write-protected.
    for &page in &pages {
        assert_eq!(
            r.load_u64(page * PAGE).expect("load"),
            0x0707_0707_0707_0707
        );
    }
    let before = common::settled(&mm);
    r.flush().expect("flush");
    let after = mm.stats();
    assert_eq!(
        after.written_back, before.written_back,
        "a read page written: {after}"
    );
    assert_eq!(
        after.parked, before.parked,
        "a protected page parked: {after}"
    );
    assert_eq!(
        after.clean_skipped,
        before.clean_skipped + pages.len() as u64,
        "{after}"
    );

    // Written: the first write lifts the protection; the flush writes it.
    r.store_u64(5 * PAGE + 8, 0xfeed).expect("store");
    // Written with the bytes it holds: dirty all the same (no fingerprint
    // says otherwise), one needless write.
    r.store_u64(15 * PAGE, 0x0707_0707_0707_0707)
        .expect("store");
    // Dropped by the program (unheard in this model) and read again.
    common::drop_page(r.as_ptr() as usize + 10 * PAGE);
    assert_eq!(r.load_u64(10 * PAGE).expect("load"), 0x0707_0707_0707_0707);
    let before = common::settled(&mm);
    r.flush().expect("flush");
    let after = mm.stats();
    assert_eq!(
        after.written_back,
        before.written_back + 2,
        "pages 5 and 15: {after}"
    );
    let on_disk = std::fs::read(&path).expect("read back");
    let at = 5 * PAGE + 8;
    assert_eq!(
        u64::from_le_bytes(on_disk[at..at + 8].try_into().expect("8 bytes")),
        0xfeed
    );
    assert!(on_disk[..5 * PAGE].iter().all(|&b| b == 7));
    assert!(on_disk[at + 8..].iter().all(|&b| b == 7));
}

/// Protected pages migrated to another pool (moved out of the region in
/// runs, which ends their protection) are fingerprinted on the way: a flush
/// after the migration writes none of them, and a page written after it
/// is written.
#[test]
fn protected_pages_migrated_stay_clean() {
    let mut c = common::config(BUDGET);
    c.fill_model = FillModel::CopyProtected;
    let mm = common::manager_with(c.with_tier(4 * MIB));
    let dir = ScratchDir::new("fill-model-migrate-protected");
    let path = dir.file("data", &vec![9u8; 64 * PAGE]);
    let r = map(&mm, &path);
    // Lone misses, each copied in write-protected (two pairs of neighbours,
    // whose frames may follow each other: a run of one move).
    let pages = [3usize, 4, 20, 21, 40];
    for &page in &pages {
        assert_eq!(
            r.load_u64(page * PAGE).expect("load"),
            0x0909_0909_0909_0909
        );
    }
    let report = r.migrate(0..64 * PAGE, 1).expect("migrate");
    let before = common::settled(&mm);
    assert!(
        before.migrated_pages >= pages.len() as u64,
        "{report:?}: {before}"
    );
    r.flush().expect("flush");
    let after = mm.stats();
    assert_eq!(
        after.written_back, before.written_back,
        "a migrated page written: {after}"
    );
    r.store_u64(20 * PAGE, 1).expect("store");
    r.flush().expect("flush");
    assert_eq!(mm.stats().written_back, before.written_back + 1);
    let on_disk = std::fs::read(&path).expect("read back");
    assert_eq!(on_disk[20 * PAGE], 1);
    assert!(on_disk[..20 * PAGE].iter().all(|&b| b == 9));
}

/// In-thread, a page read (so mapped write-protected) is not yet writable
/// by the kernel: a `read(2)` into it fails with `EFAULT`, as into an
/// absent page. `Region::prefetch` lifts the protection, and the kernel's
/// write then lands; the page's store bytes elsewhere are intact.
#[test]
fn protected_copy_in_thread_prefetch_readies_pages_for_the_kernel() {
    let dir = ScratchDir::new("fill-model-prefetch");
    let path = dir.file("data", &vec![7u8; 64 * PAGE]);
    let mut src = tempfile_in(&dir, &[0x42u8; PAGE]);
    let mm = manager_in(FillModel::CopyProtected, FaultMode::InThread);
    let r = map(&mm, &path);
    // Page 9 (no read-ahead: a lone read) read, so mapped protected.
    assert_eq!(r.load_u64(9 * PAGE).expect("load"), 0x0707_0707_0707_0707);
    let into = |r: &Region, src: &mut std::fs::File| {
        use std::io::Seek;
        src.seek(std::io::SeekFrom::Start(0)).expect("seek");
        // SAFETY: page 9 of the region, which outlives the call; the
        // kernel writes it (or fails) and no Rust reference points there.
        let n = unsafe {
            libc::read(
                std::os::fd::AsRawFd::as_raw_fd(&*src),
                r.as_ptr().add(9 * PAGE).cast_mut().cast(),
                PAGE,
            )
        };
        (n, std::io::Error::last_os_error().raw_os_error())
    };
    let (n, errno) = into(&r, &mut src);
    assert_eq!((n, errno), (-1, Some(libc::EFAULT)), "a protected page");
    assert_eq!(r.prefetch(9 * PAGE..10 * PAGE).expect("prefetch"), 0);
    let (n, _) = into(&r, &mut src);
    assert_eq!(n, PAGE as isize, "after prefetch");
    assert_eq!(r.load_u64(9 * PAGE).expect("load"), 0x4242_4242_4242_4242);
    assert_eq!(r.load_u64(10 * PAGE).expect("load"), 0x0707_0707_0707_0707);
}

/// A file under `dir` holding `bytes`, open for reading.
fn tempfile_in(dir: &ScratchDir, bytes: &[u8]) -> std::fs::File {
    let path = dir.file("source", bytes);
    std::fs::File::open(path).expect("open")
}
