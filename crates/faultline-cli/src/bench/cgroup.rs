//! Running one side of a benchmark as `faultline ooc-child` inside a fresh
//! memory cgroup with a limit (cgroup v1 or v2, whichever has the memory
//! controller: `faultline_sys::cgroup`), page cache dropped first: the
//! child waits for "go" on stdin until it is in the cgroup, runs, and
//! prints one JSON line, returned here with the cgroup's peak and OOM kills
//! added. Used by `bench out-of-core` and `bench far-memory`. Needs root
//! (the error names the file and the hierarchy). The cgroup is removed
//! when the run ends.

use anyhow::{bail, Context};
use faultline_sys::cgroup::{Hierarchy, MemoryCgroup};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A fresh memory cgroup of `limit` bytes, removed on drop.
pub(super) fn new_cgroup(limit: usize) -> anyhow::Result<MemoryCgroup> {
    let h = Hierarchy::find()?;
    let name = format!(
        "faultline-bench-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    Ok(h.create(&name, limit)?)
}

/// The hierarchy the benches' cgroups are made in, for their notes
/// (`"cgroup v1"`, `"cgroup v2"`, or why there is none).
pub fn hierarchy_name() -> String {
    match Hierarchy::find() {
        Ok(h) => h.version().to_string(),
        Err(e) => e.to_string(),
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
    let cg = new_cgroup(limit)?;
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("ooc-child")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Err(e) = cg.add(child.id()) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e.into());
    }
    child
        .stdin
        .take()
        .context("child stdin")?
        .write_all(b"go\n")?;
    let out = child.wait_with_output()?;
    let oom_kills = cg.oom_kills().unwrap_or(0);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last: Vec<&str> = err.lines().rev().take(3).collect();
        let oom = match oom_kills {
            0 => String::new(),
            n => format!(
                " ({n} OOM kill(s) in its {} MiB {} cgroup)",
                limit >> 20,
                cg.version()
            ),
        };
        bail!(
            "ooc-child {args:?} failed: {}{oom}: {}",
            out.status,
            last.join(" | ")
        );
    }
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    if let Some(o) = v.as_object_mut() {
        if let Some(peak) = cg.peak() {
            o.insert(
                "cgroup_peak_mib".into(),
                (peak as f64 / (1 << 20) as f64).into(),
            );
        }
        o.insert("cgroup_oom_kills".into(), oom_kills.into());
        o.insert("cgroup".into(), cg.version().to_string().into());
    }
    Ok(v)
}
