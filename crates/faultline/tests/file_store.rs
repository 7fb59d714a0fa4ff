//! File-backed regions on real faults: read-through, write-back on flush and
//! on drop, read-only regions, files shorter than their region. Needs
//! userfaultfd (root); fails with the reason otherwise.

use faultline::store::{File, FileOptions};
use faultline::{Access, MapOptions, PageSize, ReadOnly, Region};

mod common;
use common::{byte, set_byte, ScratchDir, MIB};

/// `bytes` in file `name` of a scratch directory of the caller's own.
fn scratch(name: &str, bytes: &[u8]) -> (ScratchDir, std::path::PathBuf) {
    let dir = ScratchDir::new("file-store");
    let path = dir.file(name, bytes);
    (dir, path)
}

fn manager() -> faultline::Manager {
    common::manager(64 * MIB)
}

/// Bytes `start..end` of the region, read through `read_at`.
fn read<A: Access>(r: &Region<A>, start: usize, end: usize) -> Vec<u8> {
    let mut v = vec![0u8; end - start];
    r.read_at(start, &mut v).expect("read_at inside the region");
    v
}

/// The whole region, read through `read_at`.
fn contents<A: Access>(r: &Region<A>) -> Vec<u8> {
    read(r, 0, r.len())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 12) as u8 ^ seed)
        .collect()
}

#[test]
fn read_through_flush_and_reopen() {
    for size in [PageSize::Base4K, PageSize::Huge2M] {
        let data = pattern(8 * MIB, 3);
        let (_dir, path) = scratch(&format!("rw-{}", size.name()), &data);
        {
            let mm = manager();
            let r = mm
                .map(
                    8 * MIB,
                    File::open(&path, FileOptions::new().writable(true)).expect("open"),
                    MapOptions::new().page_size(size),
                )
                .expect("map");
            // Read-through: the region shows the file.
            assert_eq!(read(&r, 0, 64 * 1024)[..], data[..64 * 1024]);
            assert_eq!(byte(&r, 5 * MIB + 7), data[5 * MIB + 7]);
            // Write, flush: the file has the bytes, durably.
            set_byte(&r, MIB + 1, 0xee);
            set_byte(&r, 7 * MIB, 0xdd);
            r.flush().expect("flush");
            let on_disk = std::fs::read(&path).expect("read file");
            assert_eq!(on_disk[MIB + 1], 0xee);
            assert_eq!(on_disk[7 * MIB], 0xdd);
            // More writes, then drop everything: write-back on drop.
            set_byte(&r, 3 * MIB + 5, 0xcc);
            if let Some(e) = mm.take_error() {
                panic!("fault error: {e}");
            }
        }
        // A fresh manager over the same file sees every write.
        let mm = manager();
        let r = mm
            .map_read_only(
                8 * MIB,
                File::open(&path, FileOptions::new()).expect("open"),
                MapOptions::new().page_size(size),
            )
            .expect("map");
        let mut want = data.clone();
        want[MIB + 1] = 0xee;
        want[7 * MIB] = 0xdd;
        want[3 * MIB + 5] = 0xcc;
        assert!(
            contents(&r) == want,
            "{size:?}: region differs from the file's expected bytes"
        );
        drop(r);
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn read_only_region_never_changes_the_file() {
    let mm = manager();
    let (r, data, path, _dir) = read_only_region(&mm, "ro", 4 * MIB, 9);
    // The misuse the type forbids, done anyway: writes into the read-only
    // region's memory must still never reach the file.
    let p = r.as_ptr() as *mut u8;
    for off in [100, 3 * MIB] {
        // SAFETY: inside the live region (4 MiB); this thread is the only
        // one touching it, and no reference into it is held.
        unsafe {
            let b = p.add(off);
            b.write(b.read() ^ 0xff);
        }
    }
    r.flush().expect("a read-only flush is a no-op");
    // Dropping the region and the manager writes nothing back either.
    drop(r);
    drop(mm);
    assert!(
        std::fs::read(&path).expect("read") == data,
        "the read-only region wrote its file"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn short_file_reads_zeros_past_its_end_and_offsets_work() {
    let data = pattern(MIB + 1000, 5);
    let (_dir, path) = scratch("short", &data);
    let mm = manager();
    // The region starts 64 KiB into the file and runs 2 MiB: past the end of
    // the file it reads zeros.
    let r = mm
        .map_read_only(
            2 * MIB,
            File::open(&path, FileOptions::new().offset(64 << 10)).expect("open"),
            MapOptions::new(),
        )
        .expect("map");
    let s = contents(&r);
    let file_left = data.len() - (64 << 10);
    assert_eq!(s[..file_left], data[64 << 10..]);
    assert!(s[file_left..].iter().all(|&b| b == 0));
    drop(r);
    let _ = std::fs::remove_file(&path);
}

/// A read-only 4 KiB region over a new scratch file of `len` pattern bytes.
fn read_only_region(
    mm: &faultline::Manager,
    name: &str,
    len: usize,
    seed: u8,
) -> (Region<ReadOnly>, Vec<u8>, std::path::PathBuf, ScratchDir) {
    let data = pattern(len, seed);
    let (dir, path) = scratch(name, &data);
    let r = common::map_file_read_only(mm, &path, len / 4096);
    (r, data, path, dir)
}

#[test]
fn sequential_reads_read_ahead() {
    let mm = manager();
    let (r, data, path, _dir) = read_only_region(&mm, "ra", 4 * MIB, 11);
    for p in 0..1024 {
        assert_eq!(byte(&r, p * 4096 + 3), data[p * 4096 + 3], "page {p}");
    }
    let st = mm.stats();
    assert!(st.readaheads > 0, "{st}");
    assert!(
        st.faults() < 256,
        "a sequential pass over 1024 pages took {} faults: {st}",
        st.faults()
    );
    assert!(contents(&r) == data);
    drop(r);
    let _ = std::fs::remove_file(&path);
}

/// A sequential pass over a 4 MiB file region with each declared access
/// pattern (one manager each): its faults and read-ahead runs. Also a walk
/// over a zero-filled region: the pages mapped around its faults.
#[test]
fn the_declared_access_pattern_sets_read_ahead_and_fault_around() {
    use faultline::AccessPattern;
    let data = pattern(4 * MIB, 17);
    let (_dir, path) = scratch("access", &data);
    let pass = |pattern: AccessPattern, advise_later: bool| {
        let mm = manager();
        let opts = MapOptions::new().access(if advise_later {
            AccessPattern::Normal
        } else {
            pattern
        });
        let file = File::open(&path, FileOptions::new()).expect("open");
        let r = mm.map_read_only(4 * MIB, file, opts).expect("map");
        if advise_later {
            r.advise(pattern);
        }
        assert_eq!(r.access_pattern(), pattern);
        for p in 0..1024 {
            assert_eq!(
                byte(&r, p * 4096 + 5),
                data[p * 4096 + 5],
                "{pattern:?} page {p}"
            );
        }
        let file_stats = mm.stats();
        let zero = mm
            .map(
                MIB,
                faultline::store::Zero,
                MapOptions::new().access(pattern),
            )
            .expect("map zero");
        for p in 0..256 {
            set_byte(&zero, p * 4096, 1);
        }
        let around = mm.stats().fault_around_pages;
        (file_stats, around)
    };
    let (random, random_around) = pass(AccessPattern::Random, false);
    assert_eq!(random.readaheads, 0, "{random}");
    // At least a fault a page (a fault retried after a refused move counts
    // twice).
    assert!(random.faults() >= 1024, "each page its own fault: {random}");
    assert_eq!(random_around, 0, "no fault-around: {random}");
    let (advised, _) = pass(AccessPattern::Random, true);
    assert_eq!(advised.readaheads, 0, "advise() after the map: {advised}");
    assert!(
        advised.faults() >= 1024,
        "advise() after the map: {advised}"
    );
    let (normal, normal_around) = pass(AccessPattern::Normal, false);
    assert!(normal.readaheads > 0 && normal.faults() < 256, "{normal}");
    assert!(normal_around > 0, "a walk maps around its faults: {normal}");
    let (sequential, _) = pass(AccessPattern::Sequential, false);
    assert!(
        sequential.faults() < normal.faults(),
        "the largest window from the first fault: {} faults against {} unhinted: {sequential}",
        sequential.faults(),
        normal.faults()
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_next_window_is_mapped_before_the_stream_reaches_it() {
    for mode in [
        faultline::FaultMode::Workers,
        faultline::FaultMode::InThread,
    ] {
        let mut c = common::config(64 * MIB);
        c.fault_mode = mode;
        let mm = common::manager_with(c);
        let (r, data, path, _dir) = read_only_region(&mm, "ahead", 4 * MIB, 13);
        // Page 0 starts a stream and page 1 continues it: a window of 4,
        // pages 1..5 read at once, and 5..13 offered to the workers.
        assert_eq!(byte(&r, 3), data[3]);
        assert_eq!(byte(&r, 4096 + 3), data[4096 + 3]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while r.is_resident(r.addr() + 12 * 4096) != Ok(true) {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: the window after the stream's run was not mapped ahead: {}",
                mm.stats()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let faults = mm.stats().faults();
        for p in 5..13 {
            assert_eq!(byte(&r, p * 4096 + 3), data[p * 4096 + 3], "page {p}");
        }
        assert_eq!(
            mm.stats().faults(),
            faults,
            "{mode:?}: the window mapped ahead faulted"
        );
        assert!(mm.take_error().is_none());
        drop(r);
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn prefetch_maps_a_range_without_faults() {
    let mm = manager();
    let (r, data, path, _dir) = read_only_region(&mm, "prefetch", 4 * MIB, 21);
    let mapped = r.prefetch(MIB..2 * MIB + 100).expect("prefetch");
    assert!(mapped >= 1, "nothing mapped");
    for p in (MIB..2 * MIB + 100).step_by(4096) {
        assert_eq!(r.is_resident(r.addr() + p), Ok(true), "offset {p}");
    }
    // Read-ahead may map a little past the range; never before it.
    assert_eq!(r.is_resident(r.addr() + MIB - 4096), Ok(false));
    let before = mm.stats().faults();
    assert!(read(&r, MIB, 2 * MIB + 100)[..] == data[MIB..2 * MIB + 100]);
    assert_eq!(
        mm.stats().faults(),
        before,
        "reading a prefetched range faulted"
    );
    assert_eq!(r.prefetch(MIB..2 * MIB).expect("again"), 0, "already there");
    drop(r);
    let _ = std::fs::remove_file(&path);
}

/// Finding 6 of the data-loss issue: two regions over one file range were
/// separate copies, and the second region's flush overwrote what the first
/// wrote. Now the second map of an overlapping range is refused when either
/// region may write; read-only views and disjoint ranges are fine, and the
/// range is free again once the first region is gone.
#[test]
fn two_writable_regions_over_one_file_range_are_refused() {
    let data = pattern(4 * MIB, 3);
    let (_dir, path) = scratch("overlap", &data);
    let mm = manager();
    let open = |offset: u64, writable: bool| {
        File::open(&path, FileOptions::new().offset(offset).writable(writable)).expect("open")
    };
    let first = mm
        .map(2 * MIB, open(0, true), MapOptions::new())
        .expect("map");
    let err = mm
        .map(2 * MIB, open(MIB as u64, true), MapOptions::new())
        .expect_err("overlapping writable range");
    assert!(
        matches!(err, faultline::MapError::Overlaps { start, other_start: 0, .. } if start == MIB as u64),
        "{err}"
    );
    let err = mm
        .map_read_only(MIB, open(0, false), MapOptions::new())
        .expect_err("a read-only view of a range another region writes");
    assert!(matches!(err, faultline::MapError::Overlaps { .. }), "{err}");
    // Disjoint: fine. Two read-only views of one range: fine.
    let _disjoint = mm
        .map_read_only(2 * MIB, open(2 * MIB as u64, false), MapOptions::new())
        .expect("disjoint range");
    let _also = mm
        .map_read_only(MIB, open(2 * MIB as u64, false), MapOptions::new())
        .expect("two read-only views");
    drop(first);
    let again = mm
        .map(2 * MIB, open(0, true), MapOptions::new())
        .expect("the range is free once the first region is gone");
    assert_eq!(byte(&again, MIB), data[MIB]);
}
