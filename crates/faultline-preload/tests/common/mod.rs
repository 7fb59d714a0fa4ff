//! Helpers for the tests that run real programs under
//! `libfaultline_preload.so`: the library itself (built by `cargo build
//! -p faultline-preload` in the test's own profile, once per process), the
//! programs (installed from Debian's packages where missing, one install
//! at a time), a scratch directory per test (removed on drop, also when
//! the test fails), a child process run with a hang guard, the report line
//! the library prints at exit, and a memory cgroup the child starts in.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One MiB.
pub const MIB: usize = 1 << 20;

/// Fails the test unless this process is root: the preload serves mappings
/// with userfaultfd, which these tests need (never skipped).
pub fn need_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "these tests run programs under libfaultline_preload.so, which needs userfaultfd \
         (with UFFDIO_MOVE): run them as root"
    );
}

/// The preload library of this test's profile, built once per process:
/// integration tests of a cdylib crate do not get the library built for
/// them, so this runs `$CARGO build -p faultline-preload` (`--release`
/// when the test is built without debug assertions) and returns the
/// `.so` beside this test binary's `deps` folder (the same target
/// directory and profile). Cargo's own lock serializes it with other
/// builds; the `OnceLock` makes the threads of this binary wait for one.
pub fn preload_so() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .current_dir(&root)
            .args(["build", "-q", "-p", "faultline-preload"]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let t0 = Instant::now();
        let out = build
            .output()
            .expect("running cargo build -p faultline-preload");
        assert!(
            out.status.success(),
            "cargo build -p faultline-preload failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let exe = std::env::current_exe().expect("this test binary's path");
        // target/<profile>/deps/programs-<hash> -> target/<profile>/
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test binary lives in target/<profile>/deps");
        let so = profile_dir.join("libfaultline_preload.so");
        assert!(
            so.is_file(),
            "cargo build -p faultline-preload succeeded and {} is not there",
            so.display()
        );
        eprintln!(
            "preload library: {} (built or checked in {:.1?})",
            so.display(),
            t0.elapsed()
        );
        so
    })
}

/// Where `program` is on `PATH`, if it is.
pub fn find(program: &str) -> Option<PathBuf> {
    redis_harness::find_program(program)
}

/// Makes sure every one of `programs` is on `PATH`, installing Debian's
/// `package` if one is not (`redis-harness`'s provisioning: root with
/// `apt-get`, one install at a time). Fails the test saying why where it
/// cannot.
pub fn ensure_programs(package: &str, programs: &[&'static str]) {
    redis_harness::ensure_package(package, programs).unwrap_or_else(|e| panic!("{e}"));
}

/// A scratch directory of one test's own, removed when it drops (also
/// when the test fails: a panic unwinds through it). Its path holds no
/// glob metacharacter, so `<dir>/*.db` patterns name its files only.
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// A fresh, empty directory named after `tag` in the temporary
    /// directory.
    pub fn new(tag: &str) -> Scratch {
        let path =
            std::env::temp_dir().join(format!("faultline-preload-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating the scratch directory");
        Scratch { path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The preload's settings on `cmd`: served files `files` (a pattern list),
/// budget `budget`, and the report at exit.
pub fn preload<'c>(cmd: &'c mut Command, files: &str, budget: &str) -> &'c mut Command {
    cmd.env("LD_PRELOAD", preload_so())
        .env("FAULTLINE_FILES", files)
        .env("FAULTLINE_BUDGET", budget)
        .env("FAULTLINE_PRELOAD_REPORT", "1")
}

/// Settings a parent's environment could leak into a child that must run
/// on the kernel's mmap.
pub fn no_preload(cmd: &mut Command) -> &mut Command {
    for v in [
        "LD_PRELOAD",
        "FAULTLINE_FILES",
        "FAULTLINE_BUDGET",
        "FAULTLINE_WORKERS",
        "FAULTLINE_PRELOAD_REPORT",
    ] {
        cmd.env_remove(v);
    }
    cmd
}

/// What a finished child left.
#[derive(Debug)]
pub struct Ran {
    /// How it ended.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error, as text.
    pub stderr: String,
    /// How long it ran (from the spawn, for [`run`] and
    /// [`run_in_cgroup`]; from the wait, for [`wait`]).
    pub took: Duration,
    /// Its pid.
    pub pid: u32,
}

impl Ran {
    /// Its standard output, as text.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Fails (with `what`, the status and stderr) unless it exited 0.
    pub fn expect_success(&self, what: &str) -> &Ran {
        assert!(
            self.status.success(),
            "{what} failed ({}) after {:.1?}; stderr:\n{}",
            self.status,
            self.took,
            self.stderr
        );
        self
    }

    /// The preload's report line on its stderr (fails, quoting stderr, if
    /// there is none: the library must have been loaded and asked for it).
    pub fn report(&self, what: &str) -> Report {
        Report::parse(&self.stderr).unwrap_or_else(|| {
            panic!(
                "{what}: no `faultline-preload: regions=...` report line on stderr \
                 (was the library loaded?); stderr:\n{}",
                self.stderr
            )
        })
    }
}

/// Spawns `cmd` with `stdin` (none: `/dev/null`) and waits up to `limit`
/// for it (then kills it, and fails saying it hung, with its stderr so
/// far). Its stdout and stderr are collected.
pub fn run(what: &str, cmd: &mut Command, limit: Duration) -> Ran {
    cmd.stdin(Stdio::null());
    let t0 = Instant::now();
    let child = spawn(what, cmd);
    let mut ran = wait(what, child, limit);
    ran.took = t0.elapsed();
    ran
}

/// Spawns `cmd` with stdout and stderr piped (stdin as the caller set it).
pub fn spawn(what: &str, cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: spawning {cmd:?}: {e}"))
}

/// Waits up to `limit` for `child` (spawned by [`spawn`]) and collects its
/// output; kills it and fails if it runs longer.
pub fn wait(what: &str, mut child: Child, limit: Duration) -> Ran {
    let t0 = Instant::now();
    let pid = child.id();
    let reader = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let status = loop {
        match child.try_wait().expect("waiting for the child") {
            Some(s) => break s,
            None if t0.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                remove_stats_files(pid);
                let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
                panic!("{what}: still running after {limit:?} (hung?), killed; stderr:\n{stderr}");
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let took = t0.elapsed();
    remove_stats_files(pid);
    Ran {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned(),
        took,
        pid,
    }
}

/// Where faultline publishes its stats files (`/dev/shm/faultline`).
const STATS_DIR: &str = "/dev/shm/faultline";

/// The stats files process `pid` has in faultline's stats directory
/// (`<pid>-<n>`).
pub fn stats_files_of(pid: u32) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(STATS_DIR) else {
        return Vec::new();
    };
    let prefix = format!("{pid}-");
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// Removes the stats files faultline publishes for process `pid`: a child
/// killed by a signal runs no exit handler to remove its own.
pub fn remove_stats_files(pid: u32) {
    for f in stats_files_of(pid) {
        let _ = std::fs::remove_file(f);
    }
}

/// The line the library prints on stderr at exit
/// (`FAULTLINE_PRELOAD_REPORT=1`):
/// `faultline-preload: regions=<n> faults=<f> fills=<s> written_back=<w> evicted=<e> budget=<b>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// File mappings served since start.
    pub regions: u64,
    /// Faults.
    pub faults: u64,
    /// Pages filled from files.
    pub fills: u64,
    /// Pages written back.
    pub written_back: u64,
    /// Pages evicted.
    pub evicted: u64,
    /// The budget, in bytes.
    pub budget: u64,
}

impl Report {
    /// The last report line in `stderr`, if there is one with every field.
    pub fn parse(stderr: &str) -> Option<Report> {
        stderr.lines().rev().find_map(|line| {
            let rest = line.trim().strip_prefix("faultline-preload: ")?;
            if !rest.starts_with("regions=") {
                return None;
            }
            let field = |name: &str| -> Option<u64> {
                rest.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some(Report {
                regions: field("regions")?,
                faults: field("faults")?,
                fills: field("fills")?,
                written_back: field("written_back")?,
                evicted: field("evicted")?,
                budget: field("budget")?,
            })
        })
    }
}

/// The `faultline-preload:` lines of `stderr` other than the report (a
/// configuration error, or a warning): the tests' runs must have none.
pub fn other_preload_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("faultline-preload:") && !l.contains("faultline-preload: regions="))
        .collect()
}

/// Writes back and then drops the page cache of the file at `path`
/// (`fdatasync`, `POSIX_FADV_DONTNEED`), so that a run after this reads it
/// from the device and the memory cgroup it runs in is charged for the
/// page cache it brings in.
pub fn drop_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("opening the file to drop its page cache");
    f.sync_data()
        .expect("fdatasync before dropping the page cache");
    // SAFETY: an advice call on a descriptor held open here.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise(DONTNEED) of {}", path.display());
}

/// Reads the whole file at `path` (its page cache then holds it, charged
/// to this process's memory cgroup, so a run in another cgroup is not).
pub fn warm_page_cache(path: &Path) {
    let mut f = std::fs::File::open(path).expect("opening the file to read it");
    std::io::copy(&mut f, &mut std::io::sink()).expect("reading the file");
}

/// Runs `cmd` in a fresh memory cgroup of its own (limit `limit` bytes,
/// under the machine's memory controller, v1 or v2): the child joins it
/// between fork and exec, so everything the program charges from its first
/// instruction counts. Returns the run and the cgroup's peak usage in
/// bytes; the cgroup is removed before this returns.
pub fn run_in_cgroup(
    what: &str,
    cmd: &mut Command,
    limit: usize,
    timeout: Duration,
) -> (Ran, usize) {
    use faultline_sys::cgroup::Hierarchy;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let h = Hierarchy::find().expect("a memory cgroup controller (v1 or v2)");
    let name = format!(
        "faultline-preload-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let cg = h
        .create(&name, limit)
        .unwrap_or_else(|e| panic!("{what}: making a memory cgroup (needs root): {e}"));
    let procs = std::fs::OpenOptions::new()
        .write(true)
        .open(cg.dir().join("cgroup.procs"))
        .expect("opening the cgroup's cgroup.procs");
    let fd = procs.as_raw_fd();
    // SAFETY: the closure runs in the child between fork and exec and
    // calls write(2) only (async-signal-safe) on a descriptor the parent
    // holds open until the spawn returns; "0" names the writing process
    // on both hierarchies.
    unsafe {
        cmd.pre_exec(move || {
            if libc::write(fd, b"0".as_ptr().cast(), 1) == 1 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    cmd.stdin(Stdio::null());
    let t0 = Instant::now();
    let child = spawn(what, cmd);
    drop(procs);
    let mut ran = wait(what, child, timeout);
    ran.took = t0.elapsed();
    let peak = cg
        .peak()
        .unwrap_or_else(|| panic!("{what}: the cgroup's peak usage cannot be read"));
    assert_eq!(
        cg.oom_kills(),
        Some(0),
        "{what}: the cgroup's OOM killer took a process"
    );
    drop(cg);
    (ran, peak)
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

/// Where two byte strings first differ, for a failure message.
pub fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at byte {i} of {} / {}", a.len(), b.len()),
        None => format!(
            "one is a prefix of the other: {} / {} bytes",
            a.len(),
            b.len()
        ),
    }
}

/// The C program `tests/c/<name>.c`, compiled (`cc -O2 -pthread`) into
/// `dir`; fails the test with the compiler's message.
pub fn compile_c(dir: &Scratch, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("running cc (the C compiler: apt-get install gcc)");
    assert!(
        out.status.success(),
        "cc {} failed: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
