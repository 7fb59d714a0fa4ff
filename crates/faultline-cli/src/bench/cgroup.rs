//! Running one side of a benchmark as `faultline ooc-child` inside a fresh
//! memory cgroup (v1) with a limit, page cache dropped first: the child
//! waits for "go" on stdin until it is in the cgroup, runs, and prints one
//! JSON line, returned here. Used by `bench out-of-core` and `bench
//! far-memory`. Needs root and the v1 memory controller (the error says
//! so). The cgroup is removed when the run ends.

use anyhow::{bail, Context};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A memory cgroup (v1) with a limit, removed on drop.
struct Cgroup {
    dir: PathBuf,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Cgroup {
    fn new(limit: usize) -> anyhow::Result<Cgroup> {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/memory/faultline-bench-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).with_context(|| {
            format!(
                "creating {} (cgroup v1 memory controller, root)",
                dir.display()
            )
        })?;
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string())?;
        Ok(Cgroup { dir })
    }

    fn add(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())?;
        Ok(())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Writes dirty pages out and drops the page cache (root).
pub fn drop_caches() -> anyhow::Result<()> {
    faultline_sys::host::sync_all();
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping the page cache (root)")
}

/// Runs `faultline ooc-child <args>` in a fresh cgroup of `limit` bytes,
/// caches dropped first; returns the child's JSON line.
pub fn run_child(limit: usize, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    drop_caches()?;
    let cg = Cgroup::new(limit)?;
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("ooc-child")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    cg.add(child.id())?;
    child
        .stdin
        .take()
        .context("child stdin")?
        .write_all(b"go\n")?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last: Vec<&str> = err.lines().rev().take(3).collect();
        bail!(
            "ooc-child {args:?} failed: {}: {}",
            out.status,
            last.join(" | ")
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}
