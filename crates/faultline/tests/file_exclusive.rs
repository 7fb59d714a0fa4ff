//! One file range, mapped writable once anywhere: two managers of one
//! process, or two processes, each mapping a range of one file writable
//! would keep two copies of its pages, and the second write-back would
//! overwrite the first's writes (issue 39). The second map is refused
//! (`MapError::FileInUse`, naming the holder where it can be known), as is a
//! read-only map of a range mapped writable elsewhere and vice versa; two
//! read-only maps share a range. Within one process a registry keyed by the
//! file's device and inode refuses it; across processes an
//! open-file-description lock on the byte range (`F_OFD_SETLK`), held while
//! the region lives. Needs userfaultfd (root).

use faultline::store::{File, FileOptions};
use faultline::{Manager, MapError, MapOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

mod common;
use common::{byte, set_byte, ScratchDir};

const PAGE: usize = 4096;
const PAGES: usize = 16;

/// The child of [`a_range_another_process_maps_writable_is_refused_until_it_exits`]
/// finds the file's path here.
const CHILD_ENV: &str = "FAULTLINE_EXCLUSIVE_CHILD";

/// What the child prints once its region is mapped (the harness may print
/// the test's name on the same line before it).
const MAPPED: &str = "faultline-exclusive-child: mapped";

/// A manager as in the reproduction.
fn manager() -> Manager {
    Manager::builder()
        .budget(16 << 20)
        .workers(2)
        .build()
        .unwrap_or_else(|e| panic!("this test needs userfaultfd with UFFDIO_MOVE: {e}"))
}

/// A file store over `path` from page `page`, writable or not.
fn open(path: &Path, page: usize, writable: bool) -> File {
    let opts = FileOptions::new()
        .offset((page * PAGE) as u64)
        .writable(writable);
    File::open(path, opts).expect("open")
}

/// The error of a map that must be refused (a short panic otherwise: a
/// region's `Debug` is long).
fn refused<T>(mapped: Result<T, MapError>, what: &str) -> MapError {
    match mapped {
        Ok(_) => panic!("mapped, but must be refused: {what}"),
        Err(e) => e,
    }
}

/// A 2 * 16-page file of its own in `dir`.
fn data_file(dir: &ScratchDir) -> std::path::PathBuf {
    let data: Vec<u8> = (0..2 * PAGES * PAGE).map(|i| (i % 249) as u8 | 1).collect();
    dir.file("data", &data)
}

/// The reproduction: two managers, one file opened writable for
/// each, one 16-page region through each. Both maps used to succeed, and
/// flushing region 1 then region 2 left 0xB2 at byte 300 and lost the 0xA1
/// written at byte 200. Now the second map is refused, naming the first
/// region; a disjoint range is fine; once the first region is dropped (its
/// write-back done) the range maps again and holds its writes.
#[test]
fn two_managers_in_one_process_cannot_map_one_range_writable() {
    let dir = ScratchDir::new("exclusive-managers");
    let path = data_file(&dir);
    let (mm1, mm2) = (manager(), manager());
    let r1 = mm1
        .map(PAGES * PAGE, open(&path, 0, true), MapOptions::new())
        .expect("first map");
    let err = refused(
        mm2.map(PAGES * PAGE, open(&path, 0, true), MapOptions::new()),
        "a second writable map of the range, through another manager",
    );
    let text = err.to_string();
    assert!(matches!(err, MapError::FileInUse { .. }), "{text}");
    assert!(
        text.contains(&format!("{}..{}", 0, PAGES * PAGE))
            && text.contains(&format!(
                "mapped writable by the region at {:#x}",
                r1.addr()
            ))
            && text.contains("in this process"),
        "the error names the range and the other region: {text}"
    );
    // Half of it, from the middle: refused too.
    let err = refused(
        mm2.map(
            PAGES * PAGE,
            open(&path, PAGES / 2, true),
            MapOptions::new(),
        ),
        "an overlapping range",
    );
    assert!(matches!(err, MapError::FileInUse { .. }), "{err}");
    // The next 16 pages: another range, fine.
    let beside = mm2
        .map(PAGES * PAGE, open(&path, PAGES, true), MapOptions::new())
        .expect("a disjoint range of the file");
    set_byte(&r1, 200, 0xA1);
    drop(r1);
    let r2 = mm2
        .map(PAGES * PAGE, open(&path, 0, true), MapOptions::new())
        .expect("the range maps again once the first region is gone");
    assert_eq!(byte(&r2, 200), 0xA1, "the first region's write-back");
    set_byte(&r2, 300, 0xB2);
    r2.close().map_err(|(_, e)| e).expect("close");
    drop(beside);
    let bytes = std::fs::read(&path).expect("read back");
    assert_eq!((bytes[200], bytes[300]), (0xA1, 0xB2), "both writes kept");
}

/// Two read-only maps of one range (two managers) share it; a writable map
/// of it is refused while they live, and a read-only map of a range mapped
/// writable is refused too (it would read stale bytes). Within one manager
/// the refusal is still `Overlaps`.
#[test]
fn read_only_maps_share_a_range_but_not_with_a_writable_one() {
    let dir = ScratchDir::new("exclusive-readers");
    let path = data_file(&dir);
    let (mm1, mm2) = (manager(), manager());
    let ro1 = mm1
        .map_read_only(PAGES * PAGE, open(&path, 0, false), MapOptions::new())
        .expect("first read-only map");
    let ro2 = mm2
        .map_read_only(PAGES * PAGE, open(&path, 4, false), MapOptions::new())
        .expect("a second read-only map of an overlapping range");
    assert_eq!(byte(&ro2, 0), byte(&ro1, 4 * PAGE));
    // Pages 0..4: only `ro1` (of the other manager) maps them.
    let err = refused(
        mm2.map(4 * PAGE, open(&path, 0, true), MapOptions::new()),
        "a writable map of a range mapped read-only",
    );
    let text = err.to_string();
    assert!(matches!(err, MapError::FileInUse { .. }), "{text}");
    assert!(
        text.contains("cannot be mapped writable")
            && text.contains(&format!(
                "mapped read-only by the region at {:#x}",
                ro1.addr()
            )),
        "{text}"
    );
    drop((ro1, ro2));
    let w = mm1
        .map(PAGES * PAGE, open(&path, 0, true), MapOptions::new())
        .expect("writable once the readers are gone");
    let err = refused(
        mm2.map_read_only(PAGES * PAGE, open(&path, 8, false), MapOptions::new()),
        "a read-only map of a range mapped writable",
    );
    let text = err.to_string();
    assert!(matches!(err, MapError::FileInUse { .. }), "{text}");
    assert!(
        text.contains("cannot be mapped read-only")
            && text.contains(&format!("mapped writable by the region at {:#x}", w.addr())),
        "{text}"
    );
    // The same manager still says `Overlaps`, as before.
    let err = refused(
        mm1.map_read_only(PAGES * PAGE, open(&path, 8, false), MapOptions::new()),
        "a read-only map of a range the same manager maps writable",
    );
    assert!(matches!(err, MapError::Overlaps { .. }), "{err}");
}

/// A child process of this test binary holding a writable region of the
/// file's first 16 pages, killed (and waited for) when dropped.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The child's stdout, read to its end before the child is waited for
    /// (a closed pipe would fail the child's harness).
    stdout: BufReader<ChildStdout>,
}

impl Holder {
    /// Starts the child and waits until it says its region is mapped.
    fn start(path: &Path) -> Holder {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "a_range_another_process_maps_writable_is_refused_until_it_exits",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the child");
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("child stdout");
        let mut holder = Holder {
            child,
            stdin,
            stdout: BufReader::new(out),
        };
        let mapped = (&mut holder.stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains(MAPPED));
        assert!(mapped, "the child did not map its region");
        holder
    }

    /// Lets the child drop its region and exit; returns whether it exited
    /// cleanly.
    fn finish(mut self) -> bool {
        drop(self.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        let ok = self.child.wait().map(|s| s.success()).unwrap_or(false);
        if !ok {
            eprintln!("the child's output: {rest}");
        }
        ok
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // A parent that failed before `finish`: do not leave the child.
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child's side: a writable region of the file's first 16 pages, held
/// until the parent closes our stdin.
fn hold_in_child(path: &Path) {
    let mm = manager();
    let r = mm
        .map(PAGES * PAGE, open(path, 0, true), MapOptions::new())
        .expect("the child's map");
    set_byte(&r, 100, 0xC3);
    let mut out = std::io::stdout();
    writeln!(out, "{MAPPED}").expect("stdout");
    out.flush().expect("stdout");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
    r.close().map_err(|(_, e)| e).expect("the child's close");
}

/// Two processes: another process holds a writable region of the file's
/// first 16 pages. This process's writable map of an overlapping range is
/// refused, naming another process (the kernel does not say which one for
/// an open-file-description lock); so is a read-only one; the next 16
/// pages map. Once the child has exited the range maps, and holds the
/// child's write.
#[test]
fn a_range_another_process_maps_writable_is_refused_until_it_exits() {
    if let Some(path) = std::env::var_os(CHILD_ENV) {
        hold_in_child(Path::new(&path));
        return;
    }
    let dir = ScratchDir::new("exclusive-processes");
    let path = data_file(&dir);
    let holder = Holder::start(&path);
    let mm = manager();
    let err = refused(
        mm.map(
            PAGES * PAGE,
            open(&path, PAGES / 2, true),
            MapOptions::new(),
        ),
        "a writable map of a range another process maps writable",
    );
    let text = err.to_string();
    assert!(matches!(err, MapError::FileInUse { .. }), "{text}");
    assert!(
        text.contains("locked for writing by another process")
            && text.contains(&format!("bytes 0..{} are locked", PAGES * PAGE)),
        "the error names another process and its range: {text}"
    );
    let err = refused(
        mm.map_read_only(PAGE, open(&path, PAGES - 1, false), MapOptions::new()),
        "a read-only map of a range another process maps writable",
    );
    assert!(matches!(err, MapError::FileInUse { .. }), "{err}");
    let beside = mm
        .map(PAGES * PAGE, open(&path, PAGES, true), MapOptions::new())
        .expect("a disjoint range of the file");
    assert!(holder.finish(), "the child failed");
    let r = mm
        .map(PAGES * PAGE, open(&path, 0, true), MapOptions::new())
        .expect("the range maps once the other process has exited");
    assert_eq!(byte(&r, 100), 0xC3, "the child's write-back");
    drop((r, beside));
}

/// A classic record lock (`fcntl(F_SETLK)`, this process's own) on the
/// range: the kernel names its process, and so does the error.
#[test]
fn a_record_lock_on_the_range_is_named_by_its_process() {
    use std::os::fd::AsRawFd;
    let dir = ScratchDir::new("exclusive-record-lock");
    let path = data_file(&dir);
    let locker = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    // SAFETY: flock is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = (2 * PAGE) as libc::off_t;
    fl.l_len = PAGE as libc::off_t;
    // SAFETY: F_SETLK on an fd we hold open, with a valid flock.
    let rc = unsafe { libc::fcntl(locker.as_raw_fd(), libc::F_SETLK, &fl) };
    assert_eq!(rc, 0, "F_SETLK: {}", std::io::Error::last_os_error());
    let mm = manager();
    let err = refused(
        mm.map(PAGES * PAGE, open(&path, 0, true), MapOptions::new()),
        "a record lock on the range",
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "bytes {}..{} are locked for writing by process {}",
            2 * PAGE,
            3 * PAGE,
            std::process::id()
        )),
        "{text}"
    );
    // Closing any descriptor of the file drops this process's record locks
    // on it (the refused map's store already did).
    drop(locker);
    let _r = mm
        .map(PAGES * PAGE, open(&path, 0, true), MapOptions::new())
        .expect("no lock any more");
}

/// Whether some lock stands in the way of a write lock on bytes
/// `[start, end)` of `path`, asked through a description of the test's own
/// (`F_OFD_GETLK`).
fn locked(path: &Path, start: usize, end: usize) -> bool {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    // SAFETY: flock is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = (end - start) as libc::off_t;
    // SAFETY: F_OFD_GETLK on an fd we hold open, with a valid flock.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    assert_eq!(rc, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
    fl.l_type != libc::F_UNLCK as libc::c_short
}

/// A pipe, both ends closed when dropped.
fn pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: both fds were just opened, and nothing else owns them.
    unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    }
}

/// A child of `fork()` has copies of every descriptor, the region's lock
/// description included. Its dropping its copies of the region and the
/// manager unlocks nothing (the range stays locked against other
/// processes); the parent's drop unlocks the range while the child still
/// holds its copy of the descriptor (an explicit unlock: closing the
/// parent's descriptor alone would leave the lock to the child's copy).
#[test]
fn a_child_of_fork_neither_drops_nor_keeps_the_lock() {
    use std::os::fd::AsRawFd;
    let dir = ScratchDir::new("exclusive-fork");
    let path = data_file(&dir);
    let (mm1, mm2) = (manager(), manager());
    let r = mm1
        .map(PAGES * PAGE, open(&path, 0, true), MapOptions::new())
        .expect("map");
    assert!(locked(&path, 0, PAGES * PAGE), "the region locks its range");
    let (dropped_r, dropped_w) = pipe();
    let (release_r, release_w) = pipe();
    // SAFETY: fork; the child drops its copies of faultline handles (as
    // tests/fork.rs does), writes and reads a pipe, and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let (r_child, mm_child) = (r, mm1);
        drop(r_child);
        drop(mm_child);
        let mut b = 0u8;
        // SAFETY: plain reads and writes of pipes this child holds; _exit
        // ends it without unwinding into the harness.
        unsafe {
            libc::close(release_w.as_raw_fd());
            libc::write(dropped_w.as_raw_fd(), b"d".as_ptr().cast(), 1);
            libc::read(release_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    /// Lets the child go and waits for it (also when the test fails).
    struct Reap(libc::pid_t, Option<std::os::fd::OwnedFd>);
    impl Drop for Reap {
        fn drop(&mut self) {
            drop(self.1.take());
            let mut status = 0;
            // SAFETY: waits for our own child, released by the close above
            // (it exits once its read returns).
            unsafe { libc::waitpid(self.0, &mut status, 0) };
        }
    }
    drop((dropped_w, release_r));
    let reap = Reap(pid, Some(release_w));
    let mut b = 0u8;
    // SAFETY: reads one byte from the pipe we hold into `b`.
    let n = unsafe { libc::read(dropped_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1) };
    assert_eq!(n, 1, "the child dropped its copies");
    assert!(
        locked(&path, 0, PAGES * PAGE),
        "a child dropping its copy of the region unlocked the parent's range"
    );
    drop(r);
    assert!(
        !locked(&path, 0, PAGES * PAGE),
        "the range stayed locked after the region was dropped (the child's copy of the descriptor?)"
    );
    let _again = mm2
        .map(PAGES * PAGE, open(&path, 0, true), MapOptions::new())
        .expect("the range maps again");
    drop(reap);
}
