//! The program's own `MADV_DONTNEED` on region memory (issue 17, giving
//! memory back; `UFFD_EVENT_REMOVE`): the frames of pages it drops return
//! to the pool at once, and the pages read what `Region::discard(..,
//! Discard::KeepStore)` gives — the store's copy, zeros for the zero store —
//! for whole 4 KiB and 2 MiB pages and for a part of a 2 MiB page. Checked
//! on real faults against the file on disk, under the copy fill model;
//! and under the default model with workers, which hears no drops, that a
//! dropped page still reads the same. Needs userfaultfd with
//! `UFFDIO_MOVE` and `EVENT_REMOVE` (root); fails with the reason otherwise.

mod common;

use common::{byte, set_byte, settled, ScratchDir, MIB};
use faultline::store::{File, FileOptions, Zero};
use faultline::{FillModel, MapOptions, PageSize};
use std::time::{Duration, Instant};

/// A manager of `budget` bytes that hears the program's drops: the copy
/// fill model (the default, `FillModel::Auto`, protects random misses
/// with workers and so hears none: `Config::hears_removals`).
fn manager(budget: usize) -> faultline::Manager {
    let mut c = common::config(budget);
    c.experiment.fault_locks = Some(4);
    c.fill_model = FillModel::Copy;
    assert!(c.hears_removals());
    common::manager_with(c)
}

const PAGE: usize = 4096;
const HUGE: usize = 2 * MIB;

/// `MADV_DONTNEED` of `[addr, addr + len)`, as a program would.
fn dontneed(addr: usize, len: usize) {
    // SAFETY: a range of a live region; the caller holds no reference
    // into it.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
}

/// Waits (up to 5 s) until `removed_by_program` reaches `n`: the event is
/// handled by a worker after the `madvise` returned.
fn removed(mm: &faultline::Manager, n: u64) -> faultline::StatsSnapshot {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let st = settled(mm);
        if st.removed_by_program >= n || Instant::now() > until {
            return st;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn pages_the_program_drops_go_back_to_the_pool_and_read_zeros() {
    let mm = manager(8 * MIB);
    let r = mm.map(128 * PAGE, Zero, MapOptions::new()).expect("map");
    for p in 0..64 {
        set_byte(&r, p * PAGE + 9, p as u8 | 1);
    }
    let before = settled(&mm);
    dontneed(r.addr() + 16 * PAGE, 32 * PAGE);
    let after = removed(&mm, 32);
    // Each frame given back by the removal's handler; a page whose zap
    // came after the handler's patience (100 ms: the `madvise` thread
    // descheduled in between) keeps its frame until its next fault
    // gathers it (`fault/program_drop.rs`). Both ways are counted below.
    let given = after.removed_by_program as usize;
    assert_eq!(after.frames_free, before.frames_free + given, "{after}");
    assert_eq!(r.resident_pages(), 64 - given, "{after}");
    for p in 0..64 {
        let want = if (16..48).contains(&p) {
            0
        } else {
            p as u8 | 1
        };
        assert_eq!(byte(&r, p * PAGE + 9), want, "page {p}");
    }
    let st = settled(&mm);
    assert_eq!(st.removed_by_program + st.refaulted_dropped, 32, "{st}");
    // Dropping what holds nothing (never touched) gives nothing back.
    dontneed(r.addr() + 100 * PAGE, 28 * PAGE);
    assert_eq!(settled(&mm).removed_by_program as usize, given);
    assert!(mm.take_error().is_none());
}

#[test]
fn a_dropped_page_of_a_file_reads_the_file_again() {
    let dir = ScratchDir::new("remove");
    let mm = manager(8 * MIB);
    let (r, data, path) = common::written_file(&mm, &dir);
    // Pages 4..8 dropped with their writes unsaved: they read the file.
    dontneed(r.addr() + 4 * PAGE, 4 * PAGE);
    removed(&mm, 4);
    dropped_pages_read_the_file(&mm, &r, &data, &path, |_| {});
}

/// Pages 4..8 of [`common::written_file`]'s region, dropped, read the
/// file's bytes; the rest read their write (0xee), in memory and, after
/// a flush, on disk. `between` runs after the reads, before the flush.
fn dropped_pages_read_the_file(
    mm: &faultline::Manager,
    r: &faultline::Region,
    data: &[u8],
    path: &std::path::Path,
    between: impl FnOnce(&faultline::Manager),
) {
    let want = |p: usize| {
        if (4..8).contains(&p) {
            data[p * PAGE]
        } else {
            0xee
        }
    };
    for p in 0..16 {
        assert_eq!(byte(r, p * PAGE), want(p), "page {p}");
    }
    between(mm);
    r.flush().expect("flush");
    let disk = std::fs::read(path).expect("read back");
    for p in 0..16 {
        assert_eq!(disk[p * PAGE], want(p), "page {p} on disk");
    }
    assert!(mm.take_error().is_none());
}

#[test]
fn a_2m_page_dropped_whole_or_in_part_reads_the_store() {
    let dir = ScratchDir::new("remove-2m");
    let data: Vec<u8> = (0..2 * HUGE).map(|i| (i / PAGE % 251) as u8 | 1).collect();
    let path = dir.file("data", &data);
    let mm = manager(16 * MIB);
    let store = File::open(&path, FileOptions::new().writable(true)).expect("open");
    let r = mm
        .map(
            2 * HUGE,
            store,
            MapOptions::new().page_size(PageSize::Huge2M),
        )
        .expect("map");
    for p in 0..2 * HUGE / PAGE {
        set_byte(&r, p * PAGE + 1, 0xee);
    }
    let before = settled(&mm);
    // The second 2 MiB page whole; 64 KiB in the middle of the first.
    dontneed(r.addr() + HUGE, HUGE);
    let cut = 256 * PAGE..272 * PAGE;
    dontneed(r.addr() + cut.start, cut.len());
    let after = removed(&mm, 512);
    // The whole 2 MiB page given back by the handler, or (its zap late)
    // gathered by its next fault, as in the 4 KiB test above; the cut one
    // is always the fault path's (16 holes refilled).
    assert_eq!(
        after.frames_free,
        before.frames_free + after.removed_by_program as usize,
        "{after}"
    );
    for p in 0..2 * HUGE / PAGE {
        let at = p * PAGE;
        let want = if at >= HUGE || cut.contains(&at) {
            data[at + 1]
        } else {
            0xee
        };
        assert_eq!(byte(&r, at + 1), want, "page {p}");
    }
    let st = settled(&mm);
    assert_eq!(
        st.removed_by_program + st.refaulted_dropped,
        512 + 16,
        "{st}"
    );
    assert!(mm.take_error().is_none());
}

#[test]
fn a_2m_zero_page_dropped_in_part_keeps_the_rest() {
    let mm = manager(16 * MIB);
    let r = mm
        .map(HUGE, Zero, MapOptions::new().page_size(PageSize::Huge2M))
        .expect("map");
    for p in 0..HUGE / PAGE {
        set_byte(&r, p * PAGE + 3, 0x5a);
    }
    dontneed(r.addr() + 8 * PAGE, 8 * PAGE);
    // The page stays in use: nothing is given back; wait for the handler
    // to have parked and reset it (no counter moves for a cut page).
    std::thread::sleep(Duration::from_millis(50));
    for p in 0..HUGE / PAGE {
        let want = if (8..16).contains(&p) { 0 } else { 0x5a };
        assert_eq!(byte(&r, p * PAGE + 3), want, "page {p}");
    }
    assert_eq!(settled(&mm).removed_by_program, 0);
    assert!(mm.take_error().is_none());
}

#[test]
fn with_removals_off_a_dropped_page_reads_zeros_when_touched_again() {
    let mm = common::manager_with({
        let mut c = common::config(8 * MIB);
        c.fill_model = FillModel::Copy;
        c.program_removals = false;
        c
    });
    let r = mm.map(64 * PAGE, Zero, MapOptions::new()).expect("map");
    for p in 0..64 {
        set_byte(&r, p * PAGE + 5, 0x77);
    }
    let before = settled(&mm);
    dontneed(r.addr() + 8 * PAGE, 8 * PAGE);
    std::thread::sleep(Duration::from_millis(20));
    let after = settled(&mm);
    assert_eq!(after.removed_by_program, 0, "{after}");
    assert_eq!(after.frames_free, before.frames_free, "kept until touched");
    for p in 0..64 {
        let want = if (8..16).contains(&p) { 0 } else { 0x77 };
        assert_eq!(byte(&r, p * PAGE + 5), want, "page {p}");
    }
    assert_eq!(settled(&mm).refaulted_dropped, 8);
    assert!(mm.take_error().is_none());
}

/// The program drops 4 KiB pages of 2 MiB pages all the time while another
/// thread's touches map those pages: the kernel zaps after the removal
/// event is read, which can fall while a move is under way (after it
/// waited for that very event), so a page of the move may be on neither
/// side when it is looked at again. That page was moved, then dropped: the
/// move is done, the page is resident with a hole, and the dropped 4 KiB
/// read the store's copy — never an error, a poisoned page or a SIGBUS
/// (before: `UFFDIO_MOVE ... ENOENT`, the page poisoned).
fn drops_racing_faults_on_2m_pages(mode: faultline::FaultMode, model: FillModel) {
    const PAGES: usize = 4;
    let dir = ScratchDir::new("remove-race");
    let data: Vec<u8> = (0..PAGES * HUGE)
        .map(|i| (i / PAGE % 251) as u8 | 1)
        .collect();
    let path = dir.file("data", &data);
    let mut c = common::config(32 * MIB);
    c.fault_mode = mode;
    c.fill_model = model;
    let mm = common::manager_with(c);
    // Writable, but only read: nothing is written back.
    let store = File::open(&path, FileOptions::new().writable(true)).expect("open");
    let opts = MapOptions::new().page_size(PageSize::Huge2M);
    let r = mm.map(PAGES * HUGE, store, opts).expect("map");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut rounds = 0usize;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut next = common::rng(7);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let at = next() as usize % (PAGES * HUGE / PAGE) * PAGE;
                dontneed(r.addr() + at, PAGE);
            }
        });
        let mut next = common::rng(11);
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            for _ in 0..PAGES {
                let at = next() as usize % (PAGES * HUGE);
                assert_eq!(byte(&r, at), data[at], "round {rounds}, byte {at:#x}");
            }
            r.discard(0..PAGES * HUGE, faultline::Discard::KeepStore)
                .expect("discard");
            rounds += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let st = mm.stats();
    println!(
        "{rounds} rounds, {} pages dropped mid-move: {st}",
        st.move_dropped
    );
    let error = mm.take_error();
    assert!(error.is_none(), "{error:?}");
    assert_eq!(st.poisoned, 0, "{st}");
}

#[test]
fn drops_racing_faults_on_2m_pages_lose_nothing() {
    drops_racing_faults_on_2m_pages(faultline::FaultMode::Workers, FillModel::Copy);
}

#[test]
fn drops_racing_faults_on_2m_pages_lose_nothing_in_thread() {
    drops_racing_faults_on_2m_pages(faultline::FaultMode::InThread, FillModel::Auto);
}

/// The default model with workers hears no drops: the race is the fault
/// path's alone.
#[test]
fn drops_racing_faults_on_2m_pages_lose_nothing_unheard() {
    drops_racing_faults_on_2m_pages(faultline::FaultMode::Workers, FillModel::Auto);
}

/// Under the default model with workers (protected copies: the program's
/// drops are not heard) a dropped page of a file still reads the file's
/// copy, its unsaved writes gone as `MADV_DONTNEED` asks; the frames come
/// back when the pages are touched again, and the rest keep their writes
/// through a flush.
#[test]
fn with_the_default_model_a_dropped_file_page_reads_the_file_again() {
    let dir = ScratchDir::new("remove-default");
    let mm = common::manager_with(common::config(8 * MIB));
    assert_eq!(mm.config().fill_model, FillModel::CopyProtected);
    assert!(!mm.config().hears_removals());
    let (r, data, path) = common::written_file(&mm, &dir);
    dontneed(r.addr() + 4 * PAGE, 4 * PAGE);
    dropped_pages_read_the_file(&mm, &r, &data, &path, |mm| {
        let st = settled(mm);
        assert_eq!(st.removed_by_program, 0, "{st}");
        assert_eq!(st.refaulted_dropped, 4, "each dropped page gathered: {st}");
    });
}

/// Zero-store pages the program drops unheard (the default model with
/// workers) hold frames the clock hand never walks; the sweep for such
/// drops gives them back when memory runs short, so a second region fits
/// the budget the dropped pages no longer use — and the pages not dropped
/// keep every byte, the dropped ones read zeros.
#[test]
fn zero_pages_dropped_unheard_give_their_frames_back_under_pressure() {
    let mm = common::manager_with(common::config(16 * MIB));
    assert!(!mm.config().hears_removals());
    let a = mm.map(8 * MIB, Zero, MapOptions::new()).expect("map a");
    for p in 0..8 * MIB / PAGE {
        set_byte(&a, p * PAGE + 3, (p % 251) as u8 | 1);
    }
    // The program gives back three quarters of it; nobody hears.
    dontneed(a.addr(), 6 * MIB);
    let st = settled(&mm);
    assert_eq!(st.removed_by_program, 0, "nothing heard yet: {st}");
    // A second region of 9 MiB: 8 + 9 MiB is more than the budget, 2 + 9
    // is not. Zero-store pages are never reclaimed, so only the sweep can
    // make the room.
    let b = mm.map(9 * MIB, Zero, MapOptions::new()).expect("map b");
    for p in 0..9 * MIB / PAGE {
        set_byte(&b, p * PAGE + 5, (p % 13) as u8 | 0x80);
    }
    let st = settled(&mm);
    assert!(
        st.removed_by_program > 0,
        "the dropped pages' frames were given back: {st}"
    );
    assert!(mm.take_error().is_none(), "no fault refused");
    // Every page kept; a few dropped ones (each read maps a zero page,
    // which takes a frame the budget still has room for).
    for p in (6 * MIB / PAGE..8 * MIB / PAGE).chain((0..6 * MIB / PAGE).step_by(97)) {
        let want = if p < 6 * MIB / PAGE {
            0
        } else {
            (p % 251) as u8 | 1
        };
        assert_eq!(byte(&a, p * PAGE + 3), want, "region a, page {p}");
    }
    for p in 0..9 * MIB / PAGE {
        assert_eq!(
            byte(&b, p * PAGE + 5),
            (p % 13) as u8 | 0x80,
            "region b, page {p}"
        );
    }
}
