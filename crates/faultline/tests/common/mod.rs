//! Helpers shared by the integration tests. Every test that builds a manager
//! needs userfaultfd with `UFFDIO_MOVE`; without it, it fails with the reason.
#![allow(dead_code)]

use faultline::{Config, Manager, ManagerBuilder};
use std::path::PathBuf;

pub const MIB: usize = 1 << 20;

/// A manager with `config`, or a panic that says what is missing.
pub fn manager_with(config: Config) -> Manager {
    ManagerBuilder::from_config(config)
        .build()
        .unwrap_or_else(|e| panic!("this test needs userfaultfd with UFFDIO_MOVE: {e}"))
}

/// A manager with `budget` bytes and 2 workers, defaults otherwise.
pub fn manager(budget: usize) -> Manager {
    let mut c = Config::default();
    c.budget = budget;
    c.workers = 2;
    c.experiment.fault_locks = Some(4);
    manager_with(c)
}

/// A config with `budget` bytes and 2 workers, defaults otherwise (change
/// fields, then [`manager_with`]).
pub fn config(budget: usize) -> Config {
    let mut c = Config::default();
    c.budget = budget;
    c.workers = 2;
    c
}

/// The error a test's read-only store gives a write of `page`.
pub fn read_only_write(page: u64) -> Result<(), faultline::StoreError> {
    Err(faultline::StoreError::Io {
        op: "write",
        page,
        source: std::io::Error::other("read-only"),
    })
}

/// Reads the byte at `offset` of `r` (safe: through `read_at`).
pub fn byte<A: faultline::Access>(r: &faultline::Region<A>, offset: usize) -> u8 {
    let mut b = [0u8];
    r.read_at(offset, &mut b)
        .expect("read_at inside the region");
    b[0]
}

/// Writes `v` at byte `offset` of `r` (safe: through `write_at`).
pub fn set_byte(r: &faultline::Region, offset: usize, v: u8) {
    r.write_at(offset, &[v])
        .expect("write_at inside the region");
}

/// A small deterministic generator (xorshift), so failures reproduce.
pub fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Stats once the workers' bookkeeping has caught up with the wake-ups it
/// issued (a woken thread may run before its worker counts the move).
pub fn settled(mm: &Manager) -> faultline::StatsSnapshot {
    let mut last = mm.stats();
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        let now = mm.stats();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// Waits (up to 5 s) until every frame of the pool is free, and returns the
/// stats then: the zeroing worker may hold a frame it is clearing for a
/// moment after the last region goes, so a leak is only a frame that never
/// comes back.
pub fn all_free(mm: &Manager) -> faultline::StatsSnapshot {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let st = mm.stats();
        if st.frames_free == st.frames_total || std::time::Instant::now() >= deadline {
            return st;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Reads one byte at `addr` from kernel mode (`write(2)` into a pipe): a
/// poisoned page gives EFAULT there instead of SIGBUS. Returns the errno, or
/// 0 if the read worked.
pub fn kernel_read(addr: usize) -> i32 {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: reads one byte at `addr` from kernel mode.
    let n = unsafe { libc::write(fds[1], addr as *const libc::c_void, 1) };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: closing the fds we opened.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    if n == 1 {
        0
    } else {
        errno
    }
}

/// Whether this process is the child of [`run_in_child`].
pub fn in_child() -> bool {
    std::env::var_os("FAULTLINE_CHILD").is_some()
}

/// Where a child's [`ScratchDir`]s go (a directory its parent removes).
const CHILD_DIR: &str = "FAULTLINE_CHILD_DIR";

/// Runs test `test` of this test binary in a child process, its scratch
/// directories inside one of the parent's (removed when this returns, also
/// if the child died without cleaning up).
fn spawn_child(test: &str) -> std::process::Output {
    let dir = ScratchDir::new("child");
    let exe = std::env::current_exe().expect("current exe");
    std::process::Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("FAULTLINE_CHILD", "1")
        .env(CHILD_DIR, dir.path())
        // Its Redis servers' directories too (redis-harness).
        .env("REDIS_HARNESS_DIR", dir.path())
        .output()
        .expect("spawn child")
}

/// Re-runs test `name` of this test binary in a child process (for tests
/// that change process-wide state: limits, mlockall) and fails unless it
/// exits cleanly having printed `marker`.
pub fn run_in_child(name: &str, marker: &str) {
    let out = spawn_child(name);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The child's figures, for `--nocapture` runs.
    for line in stdout.lines().filter(|l| !l.is_empty()) {
        println!("child: {line}");
    }
    assert!(
        out.status.success() && stdout.contains(marker),
        "child failed ({}): {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `scenario` in a child process (this test binary, re-executed) and
/// returns the signal that ended it, if any.
pub fn child_signal(test: &str) -> Option<i32> {
    child_signal_and_stderr(test).0
}

/// [`child_signal`], with what the child wrote to stderr.
pub fn child_signal_and_stderr(test: &str) -> (Option<i32>, String) {
    use std::os::unix::process::ExitStatusExt;
    let out = spawn_child(test);
    let status = out.status;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if status.signal().is_none() {
        panic!(
            "child exited normally ({status}); stdout: {} stderr: {stderr}",
            String::from_utf8_lossy(&out.stdout),
        );
    }
    (status.signal(), stderr)
}

/// `MADV_DONTNEED` of the 4 KiB page at `addr`, as a program would.
pub fn drop_page(addr: usize) {
    // SAFETY: one page of a live region; the caller holds no reference
    // into it.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, 4096, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
}

/// A scratch directory of one test's own (unique per process and call), removed
/// when it drops — also when the test fails, since a panic unwinds through it.
/// Tests run in parallel: none may share a file with another.
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// A fresh directory named after `tag`, in the temporary directory —
    /// or, in a child of [`run_in_child`] / [`child_signal`], inside the
    /// directory its parent made for it, which the parent removes: a child
    /// that ends by `exit` or a signal runs no destructor.
    pub fn new(tag: &str) -> ScratchDir {
        match std::env::var_os(CHILD_DIR) {
            Some(d) if in_child() => ScratchDir::new_in(std::path::Path::new(&d), tag),
            _ => ScratchDir::new_in(&std::env::temp_dir(), tag),
        }
    }

    /// A fresh directory named after `tag`, in `base` (e.g. `/dev/shm` for
    /// tmpfs).
    pub fn new_in(base: &std::path::Path, tag: &str) -> ScratchDir {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = base.join(format!("faultline-test-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).expect("scratch dir");
        ScratchDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Writes `bytes` to file `name` in the directory.
    pub fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.path.join(name);
        std::fs::write(&path, bytes).expect("write scratch file");
        path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A sparse file `sparse` of `len` bytes in `dir` (nothing allocated).
pub fn sparse_file(dir: &std::path::Path, len: usize) -> PathBuf {
    let path = dir.join("sparse");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(len as u64))
        .expect("sparse file");
    path
}

/// A writable region of `bytes` over a store that keeps no writes, pinned
/// (never reclaimed, so its pages hold their frames).
pub fn pinned_zero(mm: &Manager, bytes: usize) -> faultline::Region {
    mm.map(
        bytes,
        faultline::store::Delayed::new(faultline::store::Zero, std::time::Duration::ZERO),
        faultline::MapOptions::new().pinned(true),
    )
    .expect("pinned map")
}

/// A writable region of `pages` 4 KiB pages over the file at `path`.
pub fn map_file(mm: &Manager, path: &std::path::Path, pages: usize) -> faultline::Region {
    mm.map(
        pages * 4096,
        faultline::store::File::open(path, faultline::store::FileOptions::new().writable(true))
            .expect("open"),
        faultline::MapOptions::new(),
    )
    .expect("map")
}

/// A read-only region of `pages` 4 KiB pages over the file at `path`.
pub fn map_file_read_only(
    mm: &Manager,
    path: &std::path::Path,
    pages: usize,
) -> faultline::Region<faultline::ReadOnly> {
    mm.map_read_only(
        pages * 4096,
        faultline::store::File::open(path, faultline::store::FileOptions::new()).expect("open"),
        faultline::MapOptions::new(),
    )
    .expect("map")
}

/// A 16-page file in `dir` (its bytes returned), mapped writable in `mm`,
/// with the first byte of every page then written `0xee` through the
/// region (dirty, not written back).
pub fn written_file(mm: &Manager, dir: &ScratchDir) -> (faultline::Region, Vec<u8>, PathBuf) {
    let data: Vec<u8> = (0..16 * 4096).map(|i| (i % 251) as u8 | 1).collect();
    let path = dir.file("data", &data);
    let r = map_file(mm, &path, 16);
    for p in 0..16 {
        set_byte(&r, p * 4096, 0xee);
    }
    (r, data, path)
}

/// Swap on the zram device for the life of the value; `swapoff` and a zram
/// reset when it drops. Panics with the reason if swap cannot be set up
/// (a test that needs swap never passes without it).
pub struct ZramSwap;

impl ZramSwap {
    /// Sizes `/dev/zram0` to `bytes`, formats it as swap and turns it on.
    pub fn on(bytes: usize) -> ZramSwap {
        let run = |cmd: &str, args: &[&str]| {
            let out = std::process::Command::new(cmd)
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("this test needs swap: cannot run {cmd}: {e}"));
            assert!(
                out.status.success(),
                "this test needs swap on /dev/zram0 (root): {cmd} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let _ = run_quiet("swapoff", &["/dev/zram0"]);
        let _ = std::fs::write("/sys/block/zram0/reset", "1");
        std::fs::write("/sys/block/zram0/disksize", bytes.to_string())
            .unwrap_or_else(|e| panic!("this test needs the zram device /dev/zram0 (root): {e}"));
        run("mkswap", &["/dev/zram0"]);
        run("swapon", &["/dev/zram0"]);
        ZramSwap
    }
}

fn run_quiet(cmd: &str, args: &[&str]) -> std::io::Result<std::process::ExitStatus> {
    std::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
}

impl Drop for ZramSwap {
    fn drop(&mut self) {
        let _ = run_quiet("swapoff", &["/dev/zram0"]);
        let _ = std::fs::write("/sys/block/zram0/reset", "1");
    }
}

/// How many of the `pages` 4 KiB pages from `addr` are swapped out
/// (`/proc/self/pagemap` bit 62).
pub fn swapped_pages(addr: usize, pages: usize) -> usize {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
    let mut buf = vec![0u8; pages * 8];
    f.read_exact_at(&mut buf, (addr / 4096 * 8) as u64)
        .expect("read pagemap");
    buf.chunks_exact(8)
        .filter(|c| {
            let mut e = [0u8; 8];
            e.copy_from_slice(c);
            u64::from_ne_bytes(e) & (1 << 62) != 0
        })
        .count()
}

/// A `kB` figure from a `/proc` file (`field` with its colon), in bytes.
pub fn proc_bytes(file: &str, field: &str) -> usize {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let kib: usize = text
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in {file}"));
    kib << 10
}

/// This process's resident set (`VmRSS`), in bytes.
pub fn rss() -> usize {
    proc_bytes("/proc/self/status", "VmRSS:")
}

/// The CPU this process uses in 3 s with nothing to do: the least of three
/// windows (a window in which the test harness or the machine did
/// something else only adds).
pub fn idle_cpu() -> std::time::Duration {
    (0..3)
        .map(|_| {
            let t0 = cpu_time();
            std::thread::sleep(std::time::Duration::from_secs(3));
            cpu_time() - t0
        })
        .min()
        .unwrap_or_default()
}

/// The bound on [`idle_cpu`] of an idle manager: 2% of a CPU for the
/// optimized build; unoptimized code gets three times the room. (It was 1%:
/// on 2026-11-27 an idle manager with 10^5 regions measured 20–37 ms in 3 s
/// on the project's VM, the old code as well — the reclaimer's check every
/// 10 ms and the zeroing worker's every 20 ms cost what a VM wake-up costs
/// — failing half its runs; the regressions this guards, walks of every
/// region, cost 12%.)
pub fn idle_cpu_bound() -> std::time::Duration {
    std::time::Duration::from_millis(if cfg!(debug_assertions) { 180 } else { 60 })
}

/// This process's CPU time (user + system).
pub fn cpu_time() -> std::time::Duration {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage for the call.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
    let t = |v: libc::timeval| std::time::Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

/// A child of `fork()` that inherited `[addr, addr + len)` (`MADV_DOFORK`)
/// and sleeps until dropped: every page of the range that was resident at
/// the fork is shared copy-on-write with it, and the kernel refuses to
/// move such a page (`UFFDIO_MOVE`: `EBUSY`) while the child lives. The
/// child, a fork of a multi-threaded process, only reads a pipe and
/// `_exit`s (async-signal-safe calls).
pub struct SharingChild {
    pid: libc::pid_t,
    release: libc::c_int,
}

impl SharingChild {
    pub fn fork(addr: *mut u8, len: usize) -> SharingChild {
        // SAFETY: madvise on the caller's region; it changes only what
        // fork() copies.
        let rc = unsafe { libc::madvise(addr.cast(), len, libc::MADV_DOFORK) };
        assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
        let mut fds = [0; 2];
        // SAFETY: a pipe for the child to wait on.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only reads the pipe and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let mut b = 0u8;
            // SAFETY: blocks until the parent closes its end (or dies).
            unsafe {
                libc::close(fds[1]);
                libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
                libc::_exit(0);
            }
        }
        // SAFETY: the parent's copy of the read end.
        unsafe { libc::close(fds[0]) };
        SharingChild {
            pid,
            release: fds[1],
        }
    }
}

impl Drop for SharingChild {
    fn drop(&mut self) {
        // SAFETY: lets the child go, then reaps it.
        unsafe {
            libc::close(self.release);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}
