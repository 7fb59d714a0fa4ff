//! The child side of `bench out-of-core` (`faultline ooc-child`, hidden):
//! waits for the parent to move it into the cgroup, maps the file (the
//! kernel's `mmap`, with the row's `madvise` hint, or a faultline region),
//! runs the pattern, and prints one JSON line: ops/s and its peak RSS
//! (`VmHWM`).

use crate::bench::rng;
use anyhow::bail;
use faultline::store::{File, FileOptions};
use faultline::{Config, ManagerBuilder, MapOptions};
use faultline_sys::mem::Advice;
use serde_json::json;
use std::io::BufRead;
use std::path::PathBuf;
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
    /// Kernel side: `none`, `random` or `sequential` (`madvise`).
    #[arg(long, default_value = "none")]
    pub hint: String,
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
pub(super) const SMALL_ZONE_PCT: usize = 100;

/// The `madvise` advice of a kernel row's hint (`None` for `none`).
fn advice(hint: &str) -> anyhow::Result<Option<Advice>> {
    Ok(match hint {
        "none" => None,
        "random" => Some(Advice::Random),
        "sequential" => Some(Advice::Sequential),
        _ => bail!("unknown hint {hint:?} (none, random, sequential)"),
    })
}

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
            if let Some(advice) = advice(&a.hint)? {
                m.advise(m.addr(), len, advice)?;
            }
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
