//! Getting a real `redis-server` and `redis-cli` (and, [`ensure_package`],
//! any other Debian package a test runs: `sqlite3`, LMDB's tools) onto a
//! machine that has none: the tests run on fresh machines (a newcomer's first
//! `cargo test --workspace`, CI), and a test that needs Redis must run
//! against a real server, never skip.
//!
//! [`ensure`] looks for both programs on `PATH`; if one is missing and this
//! process may install packages (root, `apt-get` present), it installs
//! Debian's `redis-server` package (which brings `redis-tools`, holding
//! both binaries), running `apt-get update` first only if the plain install
//! fails (a machine whose package lists were never fetched). Otherwise, or
//! if the install fails, it returns [`HarnessError::Missing`] naming the
//! program and what was tried.
//!
//! Tests run in parallel, in threads of one binary and in several
//! binaries: one install at a time, serialized by a process-wide mutex and
//! an exclusive `flock` on the temporary directory (which the kernel drops
//! when a process dies); whoever waited looks again
//! before installing. A success is remembered for the process.

use crate::HarnessError;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The programs the harness runs.
const PROGRAMS: [&str; 2] = ["redis-server", "redis-cli"];

/// Set once both programs were found.
static READY: OnceLock<()> = OnceLock::new();
/// One install attempt at a time in this process.
static INSTALLING: Mutex<()> = Mutex::new(());

/// Where `program` is on `PATH`, if it is.
pub fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first of `programs` missing from `PATH`.
fn missing(programs: &[&'static str]) -> Option<&'static str> {
    programs.iter().copied().find(|p| find(p).is_none())
}

/// Makes sure `redis-server` and `redis-cli` are on `PATH`, installing
/// them (Debian's `redis-server` package) if they are not and this process
/// is root with `apt-get`.
///
/// # Errors
/// [`HarnessError::Missing`] naming the missing program and why it could
/// not be installed.
pub fn ensure() -> Result<(), HarnessError> {
    if READY.get().is_some() {
        return Ok(());
    }
    ensure_package("redis-server", &PROGRAMS)?;
    let _ = READY.set(());
    Ok(())
}

/// Makes sure every one of `programs` is on `PATH`, installing Debian's
/// `package` if one is not and this process is root with `apt-get` (other
/// tests' programs: `sqlite3`, LMDB's tools). One install at a time, in
/// this process and across processes; whoever waited looks again first.
///
/// # Errors
/// [`HarnessError::Missing`] naming the missing program and why it could
/// not be installed.
pub fn ensure_package(package: &str, programs: &[&'static str]) -> Result<(), HarnessError> {
    if missing(programs).is_none() {
        return Ok(());
    }
    let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let _lock = install_lock();
    // Another thread or process may have installed it while we waited.
    let Some(first) = missing(programs) else {
        return Ok(());
    };
    install(package).map_err(|why| HarnessError::Missing {
        program: first,
        why,
    })?;
    match missing(programs) {
        None => Ok(()),
        Some(p) => Err(HarnessError::Missing {
            program: p,
            why: format!("apt-get installed {package}, and it is still not on PATH"),
        }),
    }
}

/// An exclusive lock on the temporary directory itself (`flock` on its
/// descriptor: nothing is created, so nothing is left behind), held until
/// dropped (`None` if it cannot be taken: the in-process mutex still
/// serializes).
fn install_lock() -> Option<std::fs::File> {
    let f = std::fs::File::open(std::env::temp_dir()).ok()?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function holds open; the lock
    // goes with the descriptor (when the returned file drops).
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    (rc == 0).then_some(f)
}

/// Installs Debian's `package`; `Err` says why it could not.
fn install(package: &str) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "not root, so it cannot be installed here: apt-get install -y {package}"
        ));
    }
    if find("apt-get").is_none() {
        return Err(format!("no apt-get to install it with: install {package}"));
    }
    eprintln!(
        "redis-harness: installing Debian's {package} (a program the tests need is not on PATH)"
    );
    let first = apt(&["install", "-y", "-q", package]);
    if first.is_ok() {
        return Ok(());
    }
    // The package lists may never have been fetched on this machine.
    apt(&["update", "-q"]).map_err(|e| format!("apt-get update failed: {e}"))?;
    apt(&["install", "-y", "-q", package])
        .map_err(|e| format!("apt-get install -y {package} failed: {e}"))
}

/// Runs `apt-get args` non-interactively; `Err` holds the end of its
/// output.
fn apt(args: &[&str]) -> Result<(), String> {
    let out = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running apt-get: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = err.lines().rev().take(3).collect();
    Err(format!("{}: {}", out.status, tail.join(" | ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_programs_on_path_and_not_others() {
        assert!(find("sh").is_some(), "sh on PATH");
        assert!(find("no-such-program-faultline").is_none());
    }

    /// The harness's programs are there after `ensure` (installed if they
    /// were not: root on a Debian machine; else the error says why).
    #[test]
    fn ensure_leaves_both_programs_on_path() {
        ensure().unwrap_or_else(|e| panic!("{e}"));
        for p in PROGRAMS {
            assert!(find(p).is_some(), "{p} on PATH after ensure()");
        }
    }
}
