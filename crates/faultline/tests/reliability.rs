//! Every fault and every bad input gets a clear error: no hang, no crash, no
//! silent loss (issue "Every fault and every bad input gets a clear error";
//! the table in docs/reliability.md names the test of each row). Needs
//! userfaultfd (root); fails with the reason otherwise.

use faultline::store::{File, FileOptions, Zero};
use faultline::{
    Config, ConfigError, FaultError, ManagerBuilder, MapError, MapOptions, Store, StoreError,
};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{byte, drop_page, kernel_read, manager, manager_with, set_byte, ScratchDir, MIB};

const PAGE: usize = 4096;

/// A store whose reads and writes misbehave on demand.
#[derive(Debug, Default)]
struct Wild {
    /// Reads panic while set.
    panic_reads: AtomicBool,
    /// Writes and flushes panic while set.
    panic_writes: AtomicBool,
    /// Reads fail with EIO this many more times.
    fail_reads: AtomicU32,
    /// Reads block while set (until released).
    block: Mutex<bool>,
    released: Condvar,
}

impl Store for Wild {
    fn name(&self) -> &'static str {
        "wild"
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if self.panic_reads.load(Ordering::Relaxed) {
            panic!("wild store: read of page {page}");
        }
        let mut blocked = self.block.lock().expect("lock");
        while *blocked {
            blocked = self.released.wait(blocked).expect("wait");
        }
        drop(blocked);
        if self
            .fail_reads
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::Io {
                op: "read",
                page,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        buf.fill(page as u8 | 1);
        Ok(())
    }

    fn write(&self, page: u64, _buf: &[u8]) -> Result<(), StoreError> {
        if self.panic_writes.load(Ordering::Relaxed) {
            panic!("wild store: write of page {page}");
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        if self.panic_writes.load(Ordering::Relaxed) {
            panic!("wild store: flush");
        }
        Ok(())
    }
}

/// Row 2: a store that panics in `read` — the access got no answer and no
/// error. Now the panic is caught: the page is poisoned (EFAULT for a
/// kernel-mode access, SIGBUS for a user one), the cause queued, and the
/// worker lives on to serve the next page.
#[test]
fn a_store_that_panics_in_read_is_an_error_for_that_page() {
    let mm = manager(8 * MIB);
    let store = Arc::new(Wild::default());
    let r = mm
        .map_shared(16 * PAGE, store.clone(), MapOptions::new())
        .expect("map");
    store.panic_reads.store(true, Ordering::Relaxed);
    assert_eq!(kernel_read(r.addr()), libc::EFAULT);
    match r.take_error().expect("the cause is queued") {
        FaultError::Store {
            source: StoreError::Panicked { op: "read", .. },
            ..
        } => {}
        other => panic!("unexpected error {other}"),
    }
    store.panic_reads.store(false, Ordering::Relaxed);
    assert_eq!(
        kernel_read(r.addr() + 5 * PAGE),
        0,
        "the workers still serve"
    );
    assert_eq!(byte(&r, 5 * PAGE), 5 | 1);
}

/// Row 3: a store that panics during write-back and flush — the panic
/// escaped `Drop`. Now flush returns the error and drop queues it.
#[test]
fn a_store_that_panics_in_write_back_is_an_error_not_an_unwind() {
    let mm = manager(8 * MIB);
    let store = Arc::new(Wild::default());
    let r = mm
        .map_shared(16 * PAGE, store.clone(), MapOptions::new())
        .expect("map");
    set_byte(&r, 0, 0xEE);
    store.panic_writes.store(true, Ordering::Relaxed);
    let err = r.flush().expect_err("write-back panicked");
    assert!(
        matches!(err, StoreError::Panicked { op: "write", .. }),
        "{err}"
    );
    drop(r);
    let queued = mm
        .take_error()
        .expect("the drop's write-back error is queued");
    assert!(
        matches!(
            queued,
            FaultError::Store {
                source: StoreError::Panicked { .. },
                ..
            }
        ),
        "{queued}"
    );
}

/// Row 4: a store that fails once, then works — the page stayed poisoned
/// for good and `prefetch` of it returned `Ok(0)`. Now `prefetch` (or any
/// touch once the poison marker is gone) tries the store again.
#[test]
fn a_transient_store_error_can_be_retried() {
    let mm = manager(8 * MIB);
    let store = Arc::new(Wild::default());
    let r = mm
        .map_shared(16 * PAGE, store.clone(), MapOptions::new())
        .expect("map");
    store.fail_reads.store(1, Ordering::Relaxed);
    assert_eq!(kernel_read(r.addr() + 3 * PAGE), libc::EFAULT);
    assert!(r.take_error().is_some());
    assert_eq!(
        r.prefetch(3 * PAGE..4 * PAGE)
            .expect("the store works again"),
        1
    );
    assert_eq!(byte(&r, 3 * PAGE), 3 | 1);
    assert!(mm.stats().poison_retries >= 1);
}

/// Row 5: a poisoned page the program then `MADV_DONTNEED`s — the fault
/// loop spun forever (the poison marker was gone, faultline only woke).
/// Now the fault is served again: a working store fills it, a failing one
/// poisons it again.
#[test]
fn a_dropped_poisoned_page_is_served_again_not_a_livelock() {
    let mm = manager(8 * MIB);
    let store = Arc::new(Wild::default());
    let r = mm
        .map_shared(16 * PAGE, store.clone(), MapOptions::new())
        .expect("map");
    store.fail_reads.store(2, Ordering::Relaxed);
    let page = r.addr() + 7 * PAGE;
    assert_eq!(kernel_read(page), libc::EFAULT);
    drop_page(page);
    assert_eq!(
        kernel_read(page),
        libc::EFAULT,
        "still failing: poisoned again"
    );
    drop_page(page);
    assert_eq!(kernel_read(page), 0, "the store works now");
    assert_eq!(byte(&r, 7 * PAGE), 7 | 1);
}

/// Row 6: a store that blocks forever — dropping the manager hung. Now the
/// drop gives up on the stuck page after a bounded wait (its frame leaks,
/// an error is logged) and returns.
#[test]
fn a_store_that_blocks_forever_cannot_hang_the_drop() {
    let mm = manager(8 * MIB);
    let store = Arc::new(Wild::default());
    let r = mm
        .map_shared(16 * PAGE, store.clone(), MapOptions::new())
        .expect("map");
    *store.block.lock().expect("lock") = true;
    let addr = r.addr();
    // A thread touches the page and is stuck with the store (kernel-mode,
    // so it gets EFAULT once the range is unregistered, not SIGSEGV).
    let toucher = std::thread::spawn(move || kernel_read(addr));
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    drop(r);
    drop(mm);
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(30), "the drop took {took:?}");
    // Let the store return, so the worker and the toucher finish.
    *store.block.lock().expect("lock") = false;
    store.released.notify_all();
    let _ = toucher.join();
}

/// Row 10: a file offset near `u64::MAX` wrapped silently (pages 1–3 read
/// file pages 0–2). Now the map is refused.
#[test]
fn a_file_offset_that_overflows_is_refused() {
    let dir = ScratchDir::new("overflow");
    let path = dir.file("f", &[1u8; PAGE]);
    let mm = manager(8 * MIB);
    let err = mm
        .map_read_only(
            4 * PAGE,
            File::open(&path, FileOptions::new().offset(u64::MAX - PAGE as u64)).expect("open"),
            MapOptions::new(),
        )
        .expect_err("offset + length overflows");
    assert!(matches!(err, MapError::OffsetOverflow { .. }), "{err}");
}

/// Row 11: `prefetch` with start > end returned `Ok(1)` and mapped 16
/// pages. Now a range not inside the region is an error naming it.
#[test]
fn prefetch_of_a_bad_range_is_an_error() {
    let mm = manager(8 * MIB);
    let r = mm.map(16 * PAGE, Zero, MapOptions::new()).expect("map");
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = 5 * PAGE..PAGE;
    for bad in [backwards, 0..17 * PAGE] {
        let err = r.prefetch(bad.clone()).expect_err("bad range");
        assert!(
            matches!(err, FaultError::BadRange { start, end, len } if start == bad.start && end == bad.end && len == 16 * PAGE),
            "{err}"
        );
    }
    assert_eq!(r.resident_pages(), 0, "nothing was mapped");
}

/// Row 12: reclaim watermarks low > high were accepted.
#[test]
fn crossed_reclaim_watermarks_are_refused() {
    let err = ManagerBuilder::from_config({
        let mut c = Config::default();
        c.budget = 8 * MIB;
        c.reclaim_low_pct = 30;
        c.reclaim_high_pct = 10;
        c
    })
    .build()
    .expect_err("low above high");
    assert!(
        matches!(
            err,
            faultline::BuildError::Config(ConfigError::OutOfRange {
                field: "reclaim_low_pct",
                ..
            })
        ),
        "{err}"
    );
}

/// Row 9: a budget above the memory the process may still take got it
/// OOM-killed inside `build()`. Now it is refused, naming the limit.
#[test]
fn a_budget_above_available_memory_is_refused() {
    let (room, _) = faultline_sys::host::memory_room().expect("this test needs /proc/meminfo");
    let physical = faultline_sys::host::physical_memory();
    let budget = (room + 64 * MIB).next_multiple_of(2 * MIB);
    if budget > physical {
        // Everything is free: above physical memory is refused before.
        return;
    }
    let err = faultline::Manager::builder()
        .budget(budget)
        .build()
        .expect_err("budget above the room left");
    assert!(
        matches!(
            err,
            faultline::BuildError::Config(ConfigError::NoRoom { .. })
        ),
        "{err}"
    );
}

/// Row 13: with `spin_us` set, workers kept spinning past shutdown (the
/// drop waited for the spin to run out). Now they see the stop flag.
#[test]
fn spinning_workers_stop_at_shutdown() {
    let mm = manager_with({
        let mut c = common::config(8 * MIB);
        c.experiment.fault_locks = Some(4);
        c.experiment.spin_us = 20_000_000;
        c
    });
    let r = mm.map(16 * PAGE, Zero, MapOptions::new()).expect("map");
    set_byte(&r, 0, 1);
    drop(r);
    let t0 = Instant::now();
    drop(mm);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "shutdown took {:?} (20 s of spinning)",
        t0.elapsed()
    );
}

/// Row 14: many failing faults grew the error queue without bound. It
/// holds the newest 1024 and counts what it dropped.
#[test]
fn the_error_queue_is_bounded_and_counts_what_it_drops() {
    let mm = manager(8 * MIB);
    let store = Arc::new(Wild::default());
    let pages = 1100;
    let r = mm
        .map_shared(pages * PAGE, store.clone(), MapOptions::new())
        .expect("map");
    store.fail_reads.store(u32::MAX, Ordering::Relaxed);
    for p in 0..pages {
        assert_eq!(kernel_read(r.addr() + p * PAGE), libc::EFAULT, "page {p}");
    }
    let st = common::settled(&mm);
    assert!(st.errors >= pages as u64, "{st}");
    assert!(st.errors_dropped >= (pages - 1024) as u64, "{st}");
    let mut n = 0;
    while mm.take_error().is_some() {
        n += 1;
    }
    assert_eq!(n, 1024);
}

/// A small tmpfs of our own, unmounted when dropped.
struct Tmpfs {
    dir: ScratchDir,
}

impl Tmpfs {
    fn mount(bytes: usize) -> Tmpfs {
        let dir = ScratchDir::new("tmpfs");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test needs to mount a tmpfs (root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// Row 1: write-back that runs out of space (`ENOSPC`) stopped at the first
/// page that needed space: flush wrote 8 of the 40 pages that fit. Now it
/// writes every page that fits, returns the error, keeps the rest dirty;
/// `close` hands the region back on failure and succeeds once there is room.
#[test]
fn write_back_out_of_space_writes_what_fits_and_keeps_the_rest() {
    let fs = Tmpfs::mount(64 * PAGE);
    let path = fs.dir.path().join("data");
    // 64 pages long, the first 32 allocated, the rest a hole.
    std::fs::write(&path, vec![1u8; 32 * PAGE]).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(64 * PAGE as u64))
        .expect("extend");
    // Ballast fills the filesystem but for 8 pages.
    let ballast = fs.dir.path().join("ballast");
    std::fs::write(&ballast, vec![0u8; 24 * PAGE]).expect("ballast");
    let mm = manager(8 * MIB);
    let r = mm
        .map(
            64 * PAGE,
            File::open(&path, FileOptions::new().writable(true)).expect("open"),
            MapOptions::new(),
        )
        .expect("map");
    for p in 0..64 {
        r.write_at(p * PAGE, &[p as u8 + 2; PAGE])
            .expect("write_at");
    }
    let err = r.flush().expect_err("out of space");
    assert_eq!(err.errno(), Some(libc::ENOSPC), "{err}");
    let on_disk = std::fs::read(&path).expect("read");
    let written = (0..64)
        .filter(|&p| {
            on_disk[p * PAGE..(p + 1) * PAGE]
                .iter()
                .all(|&b| b == p as u8 + 2)
        })
        .count();
    assert_eq!(
        written, 40,
        "every page that fits is written (32 in place + 8 new)"
    );
    // Close fails too, and hands the region back with its data.
    let (r, err) = match r.close() {
        Ok(()) => panic!("close succeeded with no room"),
        Err(back) => back,
    };
    assert_eq!(err.errno(), Some(libc::ENOSPC));
    assert!(
        (0..64).all(|p| byte(&r, p * PAGE) == p as u8 + 2),
        "nothing lost"
    );
    std::fs::remove_file(&ballast).expect("free space");
    if r.close().is_err() {
        panic!("close with room again failed");
    }
    let on_disk = std::fs::read(&path).expect("read");
    for p in 0..64 {
        assert!(
            on_disk[p * PAGE..(p + 1) * PAGE]
                .iter()
                .all(|&b| b == p as u8 + 2),
            "page {p} reached the file"
        );
    }
}

/// Row 8: out of file descriptors while the manager starts — with exactly
/// 4 free, `build()` returned `Ok` and the first touch hung (a worker could
/// not make its epoll set and quietly exited). Now every descriptor is
/// taken in `build()`: for each number of free descriptors, the manager is
/// either refused with the errno or serves faults. In a child process
/// (this test binary, re-executed): the limit is process-wide.
#[test]
fn running_out_of_file_descriptors_is_builds_error() {
    if common::in_child() {
        // The limit bounds descriptor numbers: below the lowest free one
        // every number is taken, so a limit of that many leaves none.
        // SAFETY: duplicates stdin to the lowest free number, closed at once.
        let used = unsafe {
            let fd = libc::dup(0);
            assert!(fd >= 0, "dup: {}", std::io::Error::last_os_error());
            libc::close(fd);
            fd as u64
        };
        let mut hard = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: reads this process's limit into `hard`.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) };
        assert_eq!(rc, 0);
        let mut refused = 0;
        for free in 0..16u64 {
            let lim = libc::rlimit {
                rlim_cur: used + free,
                rlim_max: hard.rlim_max,
            };
            // SAFETY: sets this (child) process's own limit.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
            let mm = match faultline::Manager::builder()
                .budget(8 * MIB)
                .workers(2)
                .build()
            {
                Ok(mm) => mm,
                Err(e) => {
                    println!("{free} free: refused: {e}");
                    // The cause is the descriptor shortage, named as such
                    // (not "run as root": this runs as root), and a step on
                    // no address range names none ("on 0x0+0x0").
                    let text = e.to_string();
                    assert!(
                        text.contains("Too many open files")
                            && !text.contains("run as root")
                            && !text.contains("0x0+0x0"),
                        "{free} free: the error does not name EMFILE alone: {text}"
                    );
                    if free == 0 {
                        assert!(text.contains("EMFILE"), "{text}");
                    }
                    refused += 1;
                    continue;
                }
            };
            let r = mm.map(16 * PAGE, Zero, MapOptions::new()).expect("map");
            let addr = r.addr();
            let (tx, rx) = std::sync::mpsc::channel();
            // A user-mode touch (a kernel-mode one would need a pipe, and
            // there are no descriptors to spare).
            std::thread::spawn(move || {
                // SAFETY: the first byte of the live region.
                let _ = tx.send(unsafe { (addr as *const u8).read_volatile() });
            });
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(0) => println!("{free} free: serves faults"),
                Ok(b) => panic!("{free} free: the first touch read {b}"),
                Err(_) => panic!("{free} free: build() succeeded and the first touch hangs"),
            }
        }
        assert!(refused > 0, "no limit was low enough to refuse the build");
        println!("fd child: ok");
        return;
    }
    common::run_in_child(
        "running_out_of_file_descriptors_is_builds_error",
        "fd child: ok",
    );
}
