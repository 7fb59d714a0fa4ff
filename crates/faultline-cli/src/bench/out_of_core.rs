//! `faultline bench out-of-core`: a dataset file several times the memory
//! limit, random and sequential 4 KiB reads and writes from 2 threads,
//! faultline (a 4 KiB region over the file, budget = limit x 4/5) against
//! the kernel's own `mmap` of the same file — each run in a child process
//! inside a memory cgroup (v1) with the same limit, page cache dropped
//! before every run.
//!
//! The child (`faultline ooc-child`, hidden) waits for the parent to move it
//! into the cgroup, runs the pattern, and prints one JSON line: ops/s and its
//! peak RSS (`VmHWM`). An op touches 8 bytes of one 4 KiB page: reads sum
//! them, writes store a value. Sequential patterns walk the file from each
//! thread's own start; random ones pick uniformly over the whole file. A run
//! stops after its ops or a time cap, whichever comes first.

use super::{progress, rng, BenchOpts};
use crate::report::Report;
use anyhow::{bail, Context};
use faultline::store::{File, FileOptions};
use faultline::{Config, ManagerBuilder, MapOptions};
use serde_json::json;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Arguments of the hidden child command.
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    #[arg(long)]
    pub system: String,
    #[arg(long)]
    pub file: PathBuf,
    #[arg(long)]
    pub budget: usize,
    #[arg(long)]
    pub pattern: String,
    #[arg(long)]
    pub threads: usize,
    #[arg(long)]
    pub ops: usize,
    #[arg(long)]
    pub secs: f64,
}

fn vm_hwm_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Runs up to `ops` ops per thread on `[base, base + len)`, stopping early at
/// `secs` seconds; returns ops/s over the ops done.
fn drive(base: usize, len: usize, pattern: &str, threads: usize, ops: usize, secs: f64) -> f64 {
    let pages = len / 4096;
    let write = pattern.ends_with("write");
    let random = pattern.starts_with("random");
    let t = Instant::now();
    let done: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || {
                    let mut next = rng(th as u64 + 1);
                    let start = th * pages / threads;
                    let mut sum = 0u64;
                    let mut i = 0;
                    while i < ops {
                        if i % 256 == 0 && t.elapsed().as_secs_f64() > secs {
                            break;
                        }
                        let p = if random {
                            next() as usize % pages
                        } else {
                            (start + i) % pages
                        };
                        let a = (base + p * 4096 + (th * 64) % 4096) as *mut u64;
                        if write {
                            // SAFETY: inside the mapping/region, which outlives
                            // the scope; threads write distinct words of a page.
                            unsafe { a.write_volatile(i as u64) };
                        } else {
                            // SAFETY: as above.
                            sum = sum.wrapping_add(unsafe { a.read_volatile() });
                        }
                        i += 1;
                    }
                    std::hint::black_box(sum);
                    i
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    done as f64 / t.elapsed().as_secs_f64()
}

/// `Config::small_zone_pct` of faultline's side: the workload is 4 KiB
/// pages only.
const SMALL_ZONE_PCT: usize = 100;

/// The child: waits for "go" on stdin, runs, prints JSON.
pub fn child(a: &ChildArgs) -> anyhow::Result<()> {
    let len = std::fs::metadata(&a.file)?.len() as usize;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let ops_per_s = match a.system.as_str() {
        "kernel" => {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&a.file)?;
            let m = faultline_sys::mem::Mapping::shared_file(&f, len)?;
            drive(m.addr(), len, &a.pattern, a.threads, a.ops, a.secs)
        }
        _ => {
            // 4 KiB pages only: the whole budget as a small-page zone (no
            // THP splits on the way; docs/design.md measures both).
            let mut config = Config::default();
            config.budget = a.budget;
            config.small_zone_pct = SMALL_ZONE_PCT;
            let mm = ManagerBuilder::from_config(config).build()?;
            // Writable for every pattern, the read ones too, like the
            // kernel side's read-write shared mapping: a read-only store
            // would skip dirty tracking (fill fingerprints, the check at
            // eviction) and measure a cheaper path than the kernel's.
            let store = File::open(&a.file, FileOptions::new().writable(true))?;
            let r = mm.map(len, store, MapOptions::new())?;
            let ops = drive(r.addr(), len, &a.pattern, a.threads, a.ops, a.secs);
            if let Some(e) = mm.take_error() {
                bail!("fault error: {e}");
            }
            let st = mm.stats();
            eprintln!("{st}");
            ops
        }
    };
    println!(
        "{}",
        json!({"ops_per_s": ops_per_s, "max_rss_mib": vm_hwm_mib()})
    );
    Ok(())
}

/// A memory cgroup (v1) with a limit, removed on drop.
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    fn new(limit: usize) -> anyhow::Result<Cgroup> {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/memory/faultline-bench-{}",
            std::process::id()
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

fn drop_caches() -> anyhow::Result<()> {
    faultline_sys::host::sync_all();
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping the page cache (root)")
}

fn make_dataset(path: &Path, len: usize) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|i: usize| (i as u8).wrapping_mul(7))
        .collect();
    for _ in 0..len >> 20 {
        f.write_all(&chunk)?;
    }
    f.flush()?;
    Ok(())
}

fn run_child(
    system: &str,
    file: &Path,
    budget: usize,
    limit: usize,
    pattern: &str,
    ops: usize,
    secs: f64,
) -> anyhow::Result<(f64, f64)> {
    drop_caches()?;
    let cg = Cgroup::new(limit)?;
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["ooc-child", "--system", system, "--file"])
        .arg(file)
        .args([
            "--budget",
            &budget.to_string(),
            "--pattern",
            pattern,
            "--threads",
            "2",
            "--ops",
            &ops.to_string(),
        ])
        .args(["--secs", &secs.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    cg.add(child.id())?;
    child
        .stdin
        .take()
        .context("child stdin")?
        .write_all(b"go\n")?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{system} {pattern} child failed: {}", out.status);
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok((
        v["ops_per_s"].as_f64().unwrap_or(0.0),
        v["max_rss_mib"].as_f64().unwrap_or(0.0),
    ))
}

pub fn run(opts: &BenchOpts) -> anyhow::Result<Report> {
    let (limit, factor, ops, secs) = if opts.quick {
        (64usize << 20, 4, 20_000, 3.0)
    } else {
        (256 << 20, 4, 100_000, 20.0)
    };
    let budget = (limit * 4 / 5).next_multiple_of(2 << 20);
    let len = limit * factor;
    let dir = std::env::var_os("FAULTLINE_BENCH_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let file = dir.join(format!("faultline-ooc-{}.dat", std::process::id()));
    make_dataset(&file, len)?;
    let mut report = Report::new(
        "out-of-core",
        vec![
            "system",
            "pattern",
            "threads",
            "ops_per_s",
            "max_rss_mib",
            "vs_kernel",
        ],
    );
    report.config = json!({"file_bytes": len, "memory_limit_bytes": limit, "faultline_budget": budget,
        "faultline_small_zone_pct": SMALL_ZONE_PCT,
        "ops_per_thread": ops, "threads": 2});
    let patterns = ["random-read", "random-write", "seq-read", "seq-write"];
    let bar = progress((patterns.len() * 2) as u64, "out-of-core");
    let result = (|| -> anyhow::Result<()> {
        for pattern in patterns {
            let (k_ops, k_rss) = run_child("kernel", &file, budget, limit, pattern, ops, secs)?;
            bar.inc(1);
            let (f_ops, f_rss) = run_child("faultline", &file, budget, limit, pattern, ops, secs)?;
            bar.inc(1);
            for (system, o, rss) in [("kernel", k_ops, k_rss), ("faultline", f_ops, f_rss)] {
                let ratio = o / k_ops;
                report
                    .rows
                    .push(json!({"system": system, "pattern": pattern, "threads": 2,
                    "ops_per_s": o, "max_rss_mib": rss, "vs_kernel": ratio}));
                report.table.push(vec![
                    system.into(),
                    pattern.into(),
                    "2".into(),
                    format!("{o:.0}"),
                    format!("{rss:.0}"),
                    format!("{ratio:.2}x"),
                ]);
            }
        }
        Ok(())
    })();
    bar.finish_and_clear();
    let _ = std::fs::remove_file(&file);
    result?;
    report.notes.push(format!(
        "file {} MiB, memory cgroup limit {} MiB for both (faultline budget {} MiB; its page-cache use counts \
         against the same limit); page cache dropped before each run; 2 threads x up to {ops} ops of 4 KiB, at most {secs} s a run.",
        len >> 20,
        limit >> 20,
        budget >> 20
    ));
    Ok(report)
}
