//! fork(): a child has copies of every faultline handle but none of the
//! worker threads, and shares the userfaultfd and the shutdown eventfd with
//! the parent. Nothing the child does with its copies may touch the parent.
//! Needs userfaultfd (root).

use std::time::{Duration, Instant};

mod common;
use common::{byte, manager, set_byte, ScratchDir, MIB};

const PAGE: usize = 4096;

/// Waits up to `limit` for `pid`; kills it and fails if it does not exit.
fn wait_child(pid: libc::pid_t, limit: Duration) -> i32 {
    let t0 = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return status;
        }
        if t0.elapsed() > limit {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the child did not exit within {limit:?} (deadlocked in its drop?)");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Finding 3 of the data-loss issue: a child that dropped its `Region` and
/// `Manager` signalled the shutdown eventfd it shares with the parent (the
/// parent's workers exited: its next fault hung) and unregistered the
/// parent's range (never-touched file pages read zeros). Now the child's
/// drops do nothing to the parent: the parent keeps faulting, reading the
/// file's bytes, and flushes its writes.
#[test]
fn a_child_dropping_its_copies_leaves_the_parent_alone() {
    let dir = ScratchDir::new("fork");
    let pages = 256;
    let data: Vec<u8> = (0..pages * PAGE).map(|i| (i % 253) as u8 + 1).collect();
    let path = dir.file("data", &data);
    let mm = manager(8 * MIB);
    let r = common::map_file(&mm, &path, pages);
    // Touch (and dirty) the first half before the fork.
    for p in 0..pages / 2 {
        set_byte(&r, p * PAGE, 0xAB);
    }
    for round in 0..3 {
        // SAFETY: fork; the child only drops faultline handles and exits
        // with _exit (no atexit handlers, no unwinding into the harness).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let (r2, mm2) = (r, mm);
            drop(r2);
            drop(mm2);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        let status = wait_child(pid, Duration::from_secs(20));
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "round {round}: the child failed: status {status:#x}"
        );
        // The parent's workers still serve faults, and pages never touched
        // read the file (its registration is intact).
        for p in 0..pages {
            let want = if p < pages / 2 { 0xAB } else { data[p * PAGE] };
            assert_eq!(byte(&r, p * PAGE), want, "round {round}: page {p}");
            assert_eq!(
                byte(&r, p * PAGE + 1),
                data[p * PAGE + 1],
                "round {round}: page {p}"
            );
        }
    }
    r.flush().expect("flush");
    let on_disk = std::fs::read(&path).expect("read back");
    for p in 0..pages {
        let want = if p < pages / 2 { 0xAB } else { data[p * PAGE] };
        assert_eq!(on_disk[p * PAGE], want, "file page {p}");
    }
    assert!(mm.take_error().is_none());
    drop(r);
    let st = common::all_free(&mm);
    assert_eq!(st.frames_free, st.frames_total, "frames leaked: {st}");
}

/// A region dropped while a child that inherited it (`MADV_DOFORK`) still
/// lives: its resident pages are shared copy-on-write with the child and the
/// kernel will not move them (`EBUSY`). The drop must neither hang on them
/// (a move deadline per page) nor lose what the program wrote: the file
/// gets every page. A flush before it reports the shared pages at once.
#[test]
fn a_region_dropped_while_a_child_shares_its_pages_is_written_and_let_go() {
    if common::in_child() {
        let dir = ScratchDir::new("fork-held");
        let len = 4 * MIB;
        let path = dir.file("held", &vec![0u8; len]);
        let mm = manager(16 * MIB);
        let r = mm
            .map(
                len,
                faultline::store::File::open(
                    &path,
                    faultline::store::FileOptions::new().writable(true),
                )
                .expect("open"),
                faultline::MapOptions::new(),
            )
            .expect("map");
        for p in 0..len / PAGE {
            set_byte(&r, p * PAGE + p % PAGE, (p % 251) as u8 + 1);
        }
        let child = common::SharingChild::fork(r.as_mut_ptr(), len);
        // A flush cannot take a shared page out for a snapshot: it says so
        // at once (EBUSY) rather than wait for each.
        let t = Instant::now();
        let flushed = r.flush();
        let flush_took = t.elapsed();
        match &flushed {
            Err(faultline::store::StoreError::Unreadable { source, .. }) => {
                assert_eq!(source.errno, libc::EBUSY, "{flushed:?}")
            }
            other => panic!("a flush of pages shared with a child: {other:?}"),
        }
        assert!(
            flush_took < Duration::from_secs(10),
            "the flush took {flush_took:?}"
        );
        let t = Instant::now();
        drop(r);
        let took = t.elapsed();
        drop(child);
        let file = std::fs::read(&path).expect("read");
        for p in 0..len / PAGE {
            assert_eq!(file[p * PAGE + p % PAGE], (p % 251) as u8 + 1, "page {p}");
        }
        assert!(took < Duration::from_secs(10), "the drop took {took:?}");
        println!(
            "dropped with a sharing child in {took:?} (flush refused in {flush_took:?}); errors: {:?}",
            mm.take_error()
        );
        std::process::exit(0);
    }
    common::run_in_child(
        "a_region_dropped_while_a_child_shares_its_pages_is_written_and_let_go",
        "dropped with a sharing child in",
    );
}

/// `PageMap::shared`, which write-back relies on to tell a page a child
/// shares from a moment's refusal: a page is this process's alone until a
/// child that inherited it is forked.
#[test]
fn pagemap_sees_a_page_shared_with_a_child() {
    use faultline_sys::mem::{Mapping, PageMap};
    let m = Mapping::anonymous(2 * MIB, 2 * MIB).expect("mmap");
    let pm = PageMap::open().expect("pagemap");
    let a = m.addr();
    // SAFETY: a page of our own fresh mapping, no references into it.
    unsafe { ((a + PAGE) as *mut u8).write_volatile(1) };
    let mut v = Vec::new();
    pm.shared(a, 2, &mut v).expect("read");
    assert_eq!(v, [false, false]);
    let child = common::SharingChild::fork(a as *mut u8, 2 * PAGE);
    pm.shared(a, 2, &mut v).expect("read");
    drop(child);
    assert_eq!(v, [false, true]);
}
