//! Faults served in the faulting thread (`FaultMode::InThread`) on real
//! faults: zero and file regions from several threads against an oracle,
//! under a budget smaller than the data (reclaim and write-back run beside
//! the in-thread faults); the kernel's own accesses get `EFAULT` until the
//! range is prefetched; an unservable fault still ends in SIGBUS (its cause
//! named even when a watcher took the error off the queue first), a SIGBUS
//! that is not faultline's goes on to the previous action, and a handler
//! installed over faultline's makes the next in-thread manager refuse to
//! start. Needs userfaultfd with `UFFD_FEATURE_SIGBUS` (root); fails with
//! the reason otherwise.

use faultline::store::{File, FileOptions, Zero};
use faultline::{FaultMode, MapOptions, PageSize};

mod common;
use common::{byte, kernel_read, rng, set_byte, ScratchDir, MIB};

const PAGE: usize = 4096;

fn manager(budget: usize) -> faultline::Manager {
    let mut c = common::config(budget);
    c.fault_mode = FaultMode::InThread;
    common::manager_with(c)
}

#[test]
fn zero_regions_from_two_threads() {
    let mm = manager(16 * MIB);
    for size in [PageSize::Base4K, PageSize::Huge2M] {
        let r = mm
            .map(8 * MIB, Zero, MapOptions::new().page_size(size))
            .expect("map");
        std::thread::scope(|s| {
            for t in 0..2usize {
                let r = &r;
                s.spawn(move || {
                    for p in (t..8 * MIB / PAGE).step_by(2) {
                        assert_eq!(byte(r, p * PAGE + 3), 0, "fresh page {p}");
                        set_byte(r, p * PAGE + 3, p as u8 | 1);
                    }
                });
            }
        });
        for p in 0..8 * MIB / PAGE {
            assert_eq!(byte(&r, p * PAGE + 3), p as u8 | 1, "page {p}");
        }
    }
    let st = mm.stats();
    assert!(st.faults_4k + st.faults_2m > 0, "{st}");
    assert!(mm.take_error().is_none());
}

#[test]
fn a_file_four_times_the_budget_reads_and_writes_back_every_word() {
    let dir = ScratchDir::new("in-thread-file");
    let len = 32 * MIB;
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ (i >> 12) as u8)
        .collect();
    let path = dir.file("data", &data);
    let mm = manager(8 * MIB);
    let r = mm
        .map(
            len,
            File::open(&path, FileOptions::new().writable(true)).expect("open"),
            MapOptions::new(),
        )
        .expect("map");
    let pages = len / PAGE;
    // Each thread owns the pages p % 2 == t: its oracle is exact.
    let written: Vec<Vec<(usize, u8)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2usize)
            .map(|t| {
                let (r, data) = (&r, &data);
                s.spawn(move || {
                    let mut next = rng(t as u64 + 7);
                    let mut mine = std::collections::HashMap::new();
                    for _ in 0..20_000 {
                        let p = (next() as usize % (pages / 2)) * 2 + t;
                        let off = p * PAGE + 100;
                        let want = mine.get(&p).copied().unwrap_or(data[off]);
                        assert_eq!(byte(r, off), want, "page {p}");
                        if next() % 4 == 0 {
                            let v = (next() % 250) as u8 + 1;
                            set_byte(r, off, v);
                            mine.insert(p, v);
                        }
                    }
                    mine.into_iter().collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    r.flush().expect("flush");
    let st = mm.stats();
    assert!(st.evicted > 0, "the budget forced reclaim: {st}");
    drop(r);
    let on_disk = std::fs::read(&path).expect("read back");
    let mut want = data;
    for (p, v) in written.into_iter().flatten() {
        want[p * PAGE + 100] = v;
    }
    assert!(on_disk == want, "the file differs from the oracle");
    assert!(mm.take_error().is_none());
}

#[test]
fn kernel_accesses_get_efault_until_the_range_is_prefetched() {
    let mm = manager(8 * MIB);
    let r = mm.map(MIB, Zero, MapOptions::new()).expect("map");
    let addr = r.addr() + 5 * PAGE;
    assert_eq!(
        kernel_read(addr),
        libc::EFAULT,
        "a non-resident page in kernel mode"
    );
    r.prefetch(5 * PAGE..6 * PAGE).expect("prefetch");
    assert_eq!(kernel_read(addr), 0, "resident after prefetch");
    assert!(mm.take_error().is_none(), "EFAULT is not a fault error");
}

#[test]
fn an_unservable_fault_still_ends_in_sigbus() {
    if common::in_child() {
        // One 2 MiB frame of budget, two 2 MiB pages touched: the second
        // finds no frame, its page is poisoned, and the retried access gets
        // SIGBUS (which the handler passes on, having said why: SIG_DFL
        // kills).
        let mm = manager(2 * MIB);
        // A watcher takes errors off the queue as they come (as the Python
        // binding's does): the handler still knows the cause.
        let watcher = mm.clone();
        std::thread::spawn(move || loop {
            let _ = watcher.next_error(std::time::Duration::from_millis(100));
        });
        let r = mm
            .map(4 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
            .expect("map");
        set_byte(&r, 0, 1);
        set_byte(&r, 2 * MIB, 1);
        println!("second touch returned: no SIGBUS");
        std::process::exit(0);
    }
    let (signal, stderr) =
        common::child_signal_and_stderr("an_unservable_fault_still_ends_in_sigbus");
    assert_eq!(signal, Some(libc::SIGBUS), "{stderr}");
    // The handler names the cause before the signal goes on.
    assert!(
        stderr.contains("faultline: SIGBUS at 0x") && stderr.contains("no free 2m frame"),
        "{stderr}"
    );
}

#[test]
fn a_sigbus_that_is_not_faultlines_goes_on() {
    if common::in_child() {
        // faultline's handler is installed; then a file mapping touched
        // past the file's end raises a SIGBUS no manager holds.
        let mm = manager(4 * MIB);
        let r = mm.map(MIB, Zero, MapOptions::new()).expect("map");
        set_byte(&r, 0, 1);
        let dir = ScratchDir::new("in-thread-foreign");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.file("short", &[1u8; 10]))
            .expect("open");
        let m = faultline_sys::mem::Mapping::shared_file(&f, 4 * PAGE).expect("mmap");
        // SAFETY: inside the mapping; past the file's end: SIGBUS.
        let v = unsafe { ((m.addr() + 2 * PAGE) as *const u8).read_volatile() };
        println!("read {v} past the end: no SIGBUS");
        std::process::exit(0);
    }
    assert_eq!(
        common::child_signal("a_sigbus_that_is_not_faultlines_goes_on"),
        Some(libc::SIGBUS)
    );
}

#[test]
fn a_handler_installed_over_faultlines_is_refused_by_the_next_manager() {
    if common::in_child() {
        // The first in-thread manager installs faultline's handler; the
        // program then installs its own over it (as Python's
        // `faulthandler.enable()` would). A second in-thread manager must
        // say so, not start and leave its faults to the other handler.
        let first = manager(4 * MIB);
        extern "C" fn other(_: libc::c_int) {}
        // SAFETY: all-zero is a valid sigaction (SIG_DFL, empty mask),
        // then `other` as a plain handler; only this child process uses it.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = other as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut())
        };
        assert_eq!(rc, 0);
        let mut c = common::config(4 * MIB);
        c.fault_mode = FaultMode::InThread;
        match faultline::ManagerBuilder::from_config(c).build() {
            Err(faultline::BuildError::SigbusTaken) => println!("refused: SigbusTaken"),
            Err(e) => println!("another error: {e}"),
            Ok(_) => println!("built"),
        }
        drop(first);
        std::process::exit(0);
    }
    common::run_in_child(
        "a_handler_installed_over_faultlines_is_refused_by_the_next_manager",
        "refused: SigbusTaken",
    );
}

/// Blocks every signal in the calling thread, as C servers' worker threads
/// often do (`pthread_sigmask(SIG_BLOCK, <all>)`).
fn block_all_signals() {
    // SAFETY: an all-zero sigset_t is valid; sigfillset initialises it.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `all` is a live sigset_t; a null old set is allowed.
    let rc = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut())
    };
    assert_eq!(rc, 0, "pthread_sigmask");
}

/// Issue 39 item 2: a thread that blocks SIGBUS and touches a page that is
/// not resident. The kernel forces the SIGBUS (unblocking it and resetting
/// the action to the default): the process dies of SIGBUS, and no handler
/// can say why — the documented limit. What faultline does: the thread can
/// ask first (`in_thread_ready`), and `map` from it is refused.
#[test]
fn a_thread_that_blocks_sigbus_dies_of_its_fault_and_is_told_first() {
    if common::in_child() {
        let mm = manager(4 * MIB);
        let r = mm.map(MIB, Zero, MapOptions::new()).expect("map");
        set_byte(&r, 0, 1);
        std::thread::scope(|s| {
            s.spawn(|| {
                block_all_signals();
                match faultline::in_thread_ready() {
                    Err(e @ faultline::BuildError::SigbusBlocked) => eprintln!("ready: {e}"),
                    other => eprintln!("ready said {other:?}"),
                }
                match mm.map(MIB, Zero, MapOptions::new()) {
                    Err(e @ faultline::MapError::SigbusBlocked) => eprintln!("map: {e}"),
                    Err(e) => eprintln!("map: another error: {e}"),
                    Ok(_) => eprintln!("map: mapped"),
                }
                set_byte(&r, MIB - PAGE, 1);
                eprintln!("the touch returned: no SIGBUS");
            });
        });
        std::process::exit(0);
    }
    let (signal, stderr) = common::child_signal_and_stderr(
        "a_thread_that_blocks_sigbus_dies_of_its_fault_and_is_told_first",
    );
    assert_eq!(signal, Some(libc::SIGBUS), "{stderr}");
    assert!(
        stderr.contains("ready: this thread blocks SIGBUS")
            && stderr.contains("map: this thread blocks SIGBUS"),
        "the thread is told before it touches: {stderr}"
    );
    assert!(
        !stderr.contains("faultline: SIGBUS at"),
        "no handler runs for a forced SIGBUS: {stderr}"
    );
}

#[test]
fn a_thread_that_blocks_sigbus_cannot_build_an_in_thread_manager() {
    let res = std::thread::spawn(|| {
        block_all_signals();
        let mut c = common::config(4 * MIB);
        c.fault_mode = FaultMode::InThread;
        faultline::ManagerBuilder::from_config(c).build().err()
    })
    .join()
    .expect("builder thread");
    match res {
        Some(e @ faultline::BuildError::SigbusBlocked) => {
            let text = e.to_string();
            assert!(
                text.contains("this thread blocks SIGBUS")
                    && text.contains("kills the process")
                    && text.contains("unblock SIGBUS"),
                "{text}"
            );
        }
        Some(e) => panic!("another error: {e}"),
        None => panic!("built: its faults in this thread would kill the process"),
    }
}

/// faultline's threads inherit the mask of the thread that builds the
/// manager; one that blocked SIGBUS would die of an in-thread fault (a
/// store reading another manager's in-thread region). They unblock it.
#[test]
fn faultlines_threads_take_sigbus_even_when_their_creator_blocks_it() {
    let mm = std::thread::spawn(|| {
        block_all_signals();
        // Workers: building from a blocking thread is allowed.
        common::manager_with(common::config(4 * MIB))
    })
    .join()
    .expect("builder thread");
    // A new thread names itself and unblocks SIGBUS first thing, once it
    // runs: give each a moment to start (on a loaded machine none may
    // have run yet when the build returns).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (seen, blocking) = faultline_threads_blocking_sigbus();
        if seen > 0 && blocking.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after 5 s: {seen} faultline threads in /proc/self/task, these block SIGBUS: {blocking:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(mm);
}

/// The faultline threads of this process, and those of them (name, SigBlk)
/// that block SIGBUS.
fn faultline_threads_blocking_sigbus() -> (usize, Vec<(String, String)>) {
    let (mut seen, mut blocking) = (0, Vec::new());
    for task in std::fs::read_dir("/proc/self/task").expect("tasks") {
        let dir = task.expect("task").path();
        // A thread that exits meanwhile reads as empty.
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("faultline-") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let Some(blk) = status.lines().find_map(|l| l.strip_prefix("SigBlk:")) else {
            continue;
        };
        let mask = u64::from_str_radix(blk.trim(), 16).expect("SigBlk");
        seen += 1;
        if mask & (1 << (libc::SIGBUS - 1)) != 0 {
            blocking.push((comm.trim().to_owned(), blk.trim().to_owned()));
        }
    }
    (seen, blocking)
}
