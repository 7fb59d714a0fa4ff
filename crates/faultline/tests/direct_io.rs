//! File stores with direct I/O on real faults: pages read straight into
//! their frames leave the page cache empty (and buffered ones fill it), an
//! unaligned region offset or a file tail falls back to buffered I/O with
//! the same bytes, write-back through `O_DIRECT` reaches the file, and
//! read-ahead runs staged in a huge page read the same bytes as unstaged,
//! and reads polled for on `io_uring` the same bytes as sleeping ones.
//! Needs userfaultfd (root) and a temporary directory on a file system with
//! `O_DIRECT` (ext4, xfs, btrfs); fails with the reason otherwise.

use faultline::store::{File, FileOptions};
use faultline::{MapOptions, Region};

mod common;
use common::{byte, set_byte, ScratchDir, MIB};

const PAGE: usize = 4096;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ (i >> 12) as u8 ^ seed)
        .collect()
}

/// Opens `path` with `opts`, insisting on direct I/O when asked for.
fn open(path: &std::path::Path, opts: FileOptions) -> File {
    let f = File::open(path, opts).expect("open");
    assert_eq!(
        f.is_direct(),
        opts.direct,
        "this test needs O_DIRECT on the file system of {}",
        path.display()
    );
    f
}

/// Writes `path`'s data to the device and drops it from the page cache.
fn uncache(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("open");
    f.sync_all().expect("fsync");
    // SAFETY: an advisory call on an fd we hold; it touches no memory of ours.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
}

/// How many of `path`'s pages are in the page cache (`mincore` on a
/// mapping of the file, which itself reads nothing).
fn cached_pages(path: &std::path::Path) -> usize {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("open");
    let len = f.metadata().expect("stat").len() as usize;
    // SAFETY: a fresh shared read-only mapping of our own file; only its
    // residency is asked for, nothing is read through it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    let mut vec = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: `p` maps `len` bytes; `vec` has a byte per page of it.
    let rc = unsafe { libc::mincore(p, len, vec.as_mut_ptr()) };
    // SAFETY: unmapping the mapping made above, no references into it.
    unsafe { libc::munmap(p, len) };
    assert_eq!(rc, 0, "mincore");
    vec.iter().filter(|&&b| b & 1 != 0).count()
}

/// Reads every page of `r` (its first and last word) against `data`.
fn check_all(r: &Region<faultline::ReadOnly>, data: &[u8]) {
    for p in (0..r.len()).step_by(PAGE) {
        assert_eq!(byte(r, p), data[p], "page {}", p / PAGE);
        assert_eq!(
            byte(r, p + PAGE - 1),
            data[p + PAGE - 1],
            "page {}",
            p / PAGE
        );
    }
}

#[test]
fn direct_reads_leave_the_page_cache_empty_and_buffered_ones_fill_it() {
    let dir = ScratchDir::new("direct-cache");
    let data = pattern(8 * MIB, 5);
    let path = dir.file("data", &data);
    let mm = common::manager(4 * MIB);
    for direct in [true, false] {
        uncache(&path);
        let r = mm
            .map_read_only(
                8 * MIB,
                open(&path, FileOptions::new().direct(direct)),
                MapOptions::new(),
            )
            .expect("map");
        // Twice the budget: every page read, many of them twice.
        check_all(&r, &data);
        check_all(&r, &data);
        let cached = cached_pages(&path);
        if direct {
            assert_eq!(cached, 0, "direct reads went through the page cache");
        } else {
            assert!(cached >= 1024, "buffered reads cached only {cached} pages");
        }
        drop(r);
    }
    assert!(mm.take_error().is_none());
}

/// A fault's read polled for on the faulting or serving thread's own
/// `io_uring` (the default) or sleeping in `pread` (`poll(0)`), by four
/// threads at once touching random pages, with faults served by workers
/// and in the faulting threads: every byte as in the file, twice through a
/// budget half the file's size.
#[test]
fn polled_and_sleeping_direct_reads_give_every_byte_from_many_threads() {
    let dir = ScratchDir::new("direct-polled");
    let data = pattern(8 * MIB, 11);
    let path = dir.file("data", &data);
    for mode in [
        faultline::FaultMode::Workers,
        faultline::FaultMode::InThread,
    ] {
        for spin in [
            std::time::Duration::from_micros(200),
            std::time::Duration::ZERO,
        ] {
            let mm = common::manager_with({
                let mut c = common::config(4 * MIB);
                c.fault_mode = mode;
                c
            });
            let opts = FileOptions::new().direct(true).poll(spin);
            let r = mm
                .map_read_only(8 * MIB, open(&path, opts), MapOptions::new())
                .expect("map");
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let (r, data) = (&r, &data);
                    s.spawn(move || {
                        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                        for _ in 0..2 * data.len() / PAGE / 4 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let at = (x as usize % (data.len() / PAGE)) * PAGE + (x >> 52) as usize;
                            assert_eq!(byte(r, at), data[at], "{mode:?} poll {spin:?}: byte {at}");
                        }
                    });
                }
            });
            check_all(&r, &data);
            let error = mm.take_error();
            assert!(error.is_none(), "{mode:?} poll {spin:?}: {error:?}");
        }
    }
}

/// Read-ahead runs read directly, staged in a huge page and copied into
/// their frames (the default) or straight into the frames: every byte of
/// the file comes back either way, twice through a budget half its size,
/// and the budget pays for the staging page.
#[test]
fn staged_and_unstaged_direct_reads_give_every_byte() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .expect("reading the THP mode");
    assert!(
        !thp.contains("[never]"),
        "this test needs transparent huge pages (madvise or always) for the staging page"
    );
    let dir = ScratchDir::new("direct-staged");
    let data = pattern(16 * MIB, 9);
    let path = dir.file("data", &data);
    for staged in [true, false] {
        let mm = common::manager(8 * MIB);
        let opts = FileOptions::new().direct(true).staged(staged);
        let r = mm
            .map_read_only(16 * MIB, open(&path, opts), MapOptions::new())
            .expect("map");
        let mut got = vec![0u8; 64 << 10];
        for _ in 0..2 {
            for at in (0..r.len()).step_by(got.len()) {
                r.read_at(at, &mut got).expect("read_at");
                assert!(
                    got == data[at..at + got.len()],
                    "staged {staged}: bytes at {at}"
                );
            }
        }
        // The staging page is paid from the budget once made: a 2 MiB
        // frame withheld (the most a quarter of 8 MiB allows); unstaged,
        // the page tables and leaves alone stay under one frame.
        let want = if staged { 2 * MIB / PAGE } else { 0 };
        let t0 = std::time::Instant::now();
        let mut s = mm.stats();
        while s.frames_overhead != want && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            s = mm.stats();
        }
        assert!(s.readaheads > 0, "no read-ahead run was read: {s}");
        assert_eq!(s.frames_overhead, want, "staged {staged}: {s}");
        assert!(mm.take_error().is_none());
    }
}

#[test]
fn unaligned_offsets_and_file_tails_fall_back_to_buffered_io() {
    let dir = ScratchDir::new("direct-unaligned");
    // Three pages and a tail of 100 bytes after a 100-byte header.
    let data = pattern(100 + 3 * PAGE + 100, 9);
    let path = dir.file("data", &data);
    let mm = common::manager(4 * MIB);
    let r = mm
        .map(
            4 * PAGE,
            open(&path, FileOptions::new().offset(100).writable(true)),
            MapOptions::new(),
        )
        .expect("map");
    for p in 0..3 * PAGE + 100 {
        assert_eq!(byte(&r, p), data[100 + p], "byte {p}");
    }
    for p in 3 * PAGE + 100..4 * PAGE {
        assert_eq!(byte(&r, p), 0, "zeros past the end, byte {p}");
    }
    set_byte(&r, 7, 0xa1);
    set_byte(&r, 4 * PAGE - 1, 0xa2);
    r.flush().expect("flush");
    let on_disk = std::fs::read(&path).expect("read back");
    assert_eq!(
        on_disk.len(),
        100 + 4 * PAGE,
        "the last page extended the file"
    );
    assert_eq!(on_disk[107], 0xa1);
    assert_eq!(on_disk[100 + 4 * PAGE - 1], 0xa2);
    assert_eq!(on_disk[..100], data[..100], "the header is untouched");
    drop(r);
    assert!(mm.take_error().is_none());
}

#[test]
fn direct_write_back_reaches_the_file_and_the_tail_page_extends_it() {
    let dir = ScratchDir::new("direct-write");
    let data = pattern(2 * MIB + 100, 1);
    let path = dir.file("data", &data);
    let mm = common::manager(4 * MIB);
    let pages = (2 * MIB) / PAGE + 1;
    let r = mm
        .map(
            pages * PAGE,
            open(&path, FileOptions::new().writable(true)),
            MapOptions::new(),
        )
        .expect("map");
    assert_eq!(byte(&r, 2 * MIB + 99), data[2 * MIB + 99], "the tail reads");
    assert_eq!(byte(&r, 2 * MIB + 100), 0, "zeros past the end");
    for p in 0..pages {
        set_byte(&r, p * PAGE + 11, p as u8 ^ 0x5a);
    }
    r.flush().expect("flush");
    // A buffered reader sees every direct write (the kernel dropped any
    // cached copy of the range).
    let on_disk = std::fs::read(&path).expect("read back");
    assert_eq!(on_disk.len(), pages * PAGE);
    for p in 0..pages {
        assert_eq!(on_disk[p * PAGE + 11], p as u8 ^ 0x5a, "page {p}");
        assert_eq!(
            on_disk[p * PAGE + 12],
            data.get(p * PAGE + 12).copied().unwrap_or(0)
        );
    }
    drop(r);
    assert!(mm.take_error().is_none());
}
