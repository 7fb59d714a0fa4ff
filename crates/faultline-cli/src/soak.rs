//! `faultline soak`: a long data-integrity run. A file `--data-x` times the
//! budget, mapped with 4 KiB pages; `--threads` threads do random page
//! operations (reads that check, writes that stamp; one in 256 a sweep
//! over the next 64 x `--threads` pages in order, a sequential stream,
//! checking and stamping the thread's own) until `--ops` operations
//! or `--secs` seconds, while a flusher flushes every second; then the
//! region is dropped (write-back), a fresh manager reopens the file, and
//! every page is checked against the oracle. Any wrong word ends the run
//! with an error (exit status 1). Prints the figures (`--json` for a row).

use crate::bench::rng;
use anyhow::{bail, Context};
use faultline::store::{File, FileOptions};
use faultline::{Access, Manager, MapOptions, Region};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, clap::Args)]
pub struct SoakOpts {
    /// Seconds at most.
    #[arg(long, default_value_t = 60.0)]
    pub secs: f64,
    /// Page operations at most (reads + writes, all threads).
    #[arg(long, default_value_t = 10_000_000)]
    pub ops: u64,
    /// Frame budget in MiB.
    #[arg(long, default_value_t = 64)]
    pub budget_mib: usize,
    /// Data size as a multiple of the budget.
    #[arg(long, default_value_t = 16)]
    pub data_x: usize,
    /// Application threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Seed of the random choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON row instead of text.
    #[arg(long)]
    pub json: bool,
    /// How filled 4 KiB pages go into place (`Config::fill_model`):
    /// `auto` (the default: `copy-protected` with workers, `copy`
    /// in-thread), `copy`, `copy-protected` or `move`.
    #[arg(long, value_enum, default_value = "auto")]
    pub fill_model: crate::bench::FillModelArg,
}

const PAGE: usize = 4096;

/// The stamp of `page` at `version` (0: the file's initial content).
fn stamp(page: usize, version: u32) -> u64 {
    (((page as u64) << 32) | u64::from(version)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Reads the first and last word of `page` of `r`.
fn words<A: Access>(r: &Region<A>, page: usize) -> anyhow::Result<(u64, u64)> {
    let p = page * PAGE;
    Ok((r.load_u64(p)?, r.load_u64(p + PAGE - 8)?))
}

/// Checks `page` of `r` holds `version`'s stamp in its first and last word.
fn check<A: Access>(r: &Region<A>, page: usize, version: u32, what: &str) -> anyhow::Result<()> {
    let want = stamp(page, version);
    let (a, b) = words(r, page)?;
    if a != want || b != want {
        bail!("{what}: page {page} holds {a:#x}/{b:#x}, want version {version} ({want:#x}): data lost");
    }
    Ok(())
}

/// One random operation in this many is a sweep instead.
const SWEEP_EVERY: u64 = 256;

/// Pages of its own a sweep writes, in order.
const SWEEP: usize = 64;

pub fn run(o: &SoakOpts) -> anyhow::Result<()> {
    if o.threads == 0 || o.data_x == 0 {
        bail!("--threads and --data-x must be at least 1");
    }
    let budget = o.budget_mib << 20;
    let len = budget * o.data_x;
    let pages = len / PAGE;
    let dir = std::env::temp_dir().join(format!("faultline-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("scratch directory")?;
    let path = dir.join("data");
    let result = soak(o, budget, &path, pages);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn initial_file(path: &std::path::Path, pages: usize) -> anyhow::Result<()> {
    use std::io::Write;
    let f = std::fs::File::create(path).context("create data file")?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let mut buf = vec![0u8; PAGE];
    for p in 0..pages {
        let s = stamp(p, 0).to_ne_bytes();
        buf[..8].copy_from_slice(&s);
        buf[PAGE - 8..].copy_from_slice(&s);
        w.write_all(&buf).context("write data file")?;
    }
    w.flush().context("write data file")?;
    Ok(())
}

fn soak(o: &SoakOpts, budget: usize, path: &std::path::Path, pages: usize) -> anyhow::Result<()> {
    initial_file(path, pages)?;
    // The oracle: each page's version; page p belongs to thread p % threads.
    let versions: Vec<AtomicU64> = (0..pages).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let flushes = AtomicUsize::new(0);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(o.secs);
    let stats = {
        let mm = Manager::builder()
            .budget(budget)
            .workers(2)
            .fill_model(o.fill_model.into())
            .build()?;
        let store = File::open(path, FileOptions::new().writable(true))?;
        let r = mm.map(pages * PAGE, store, MapOptions::new())?;
        let outcome: anyhow::Result<()> = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_secs(1));
                    if r.flush().is_ok() {
                        flushes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            let workers: Vec<_> = (0..o.threads)
                .map(|t| {
                    let (r, versions, done, stop) = (&r, &versions, &done, &stop);
                    s.spawn(move || -> anyhow::Result<()> {
                        let mut next = rng(o.seed.wrapping_mul(31) + t as u64 + 1);
                        let mine = pages.div_ceil(o.threads);
                        // One page operation on page p (this thread's):
                        // check it, and stamp it if `write`.
                        let op = |p: usize, write: bool| -> anyhow::Result<()> {
                            let v = versions[p].load(Ordering::Relaxed) as u32;
                            check(r, p, v, "soak read")?;
                            if write {
                                // Page p belongs to this thread alone.
                                let s = stamp(p, v + 1);
                                r.store_u64(p * PAGE, s)?;
                                r.store_u64(p * PAGE + PAGE - 8, s)?;
                                versions[p].store(u64::from(v + 1), Ordering::Relaxed);
                            }
                            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                            if n >= o.ops || Instant::now() >= deadline {
                                stop.store(true, Ordering::Relaxed);
                            }
                            Ok(())
                        };
                        while !stop.load(Ordering::Relaxed) {
                            let p = (next() as usize % mine) * o.threads + t;
                            if p >= pages {
                                continue;
                            }
                            if next() % SWEEP_EVERY == 0 {
                                // A sweep: the next pages in order, a
                                // sequential stream (read ahead, and
                                // reclaimed for); this thread's are
                                // checked and written, the others' only
                                // read (their owners may be changing them).
                                for q in p..(p + SWEEP * o.threads).min(pages) {
                                    if q % o.threads == t {
                                        op(q, true)?;
                                    } else {
                                        words(r, q)?;
                                    }
                                }
                                continue;
                            }
                            op(p, next() % 2 == 0)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            let mut res = Ok(());
            for w in workers {
                let r = w.join().unwrap_or_else(|_| bail!("a soak thread panicked"));
                if res.is_ok() {
                    res = r;
                }
            }
            stop.store(true, Ordering::Relaxed);
            res
        });
        outcome?;
        if let Some(e) = mm.take_error() {
            bail!("a fault error during the soak: {e}");
        }
        r.flush().context("final flush")?;
        let st = mm.stats();
        drop(r);
        // The model in effect (`auto` resolved at build).
        (st, mm.config().fill_model)
    };
    let (stats, model) = stats;
    let secs = t0.elapsed().as_secs_f64();
    // A fresh manager reads the file back: every page its last version.
    let mm = Manager::builder()
        .budget(budget)
        .workers(2)
        .fill_model(o.fill_model.into())
        .build()?;
    let r = mm.map_read_only(
        pages * PAGE,
        File::open(path, FileOptions::new())?,
        MapOptions::new(),
    )?;
    for (p, v) in versions.iter().enumerate() {
        check(&r, p, v.load(Ordering::Relaxed) as u32, "after reopening")?;
    }
    let ops = done.load(Ordering::Relaxed);
    if o.json {
        println!(
            "{}",
            serde_json::json!({
                "system": "faultline", "pattern": "soak-random-rw", "ops": ops,
                "ops_per_s": ops as f64 / secs, "secs": secs, "pages": pages,
                "budget_mib": o.budget_mib, "data_x": o.data_x, "threads": o.threads,
                "evicted": stats.evicted, "written_back": stats.written_back,
                "read_aheads": stats.readaheads,
                "flushes": flushes.load(Ordering::Relaxed), "pages_verified": pages,
                "words_lost": 0, "fill_model": format!("{model:?}"),
                "clean_dropped": stats.clean_dropped,
                "protection_lifted": stats.protection_lifted,
            })
        );
    } else {
        println!(
            "soak: {ops} page operations in {secs:.1} s ({:.0}/s) over {} MiB through a {} MiB budget, {} threads, fill model {model:?}; \
             {} evictions ({} clean protected pages dropped in batches, {} protections lifted by a write), {} pages written back, {} read-ahead runs, {} flushes; all {pages} pages verified after reopening: 0 words lost",
            ops as f64 / secs,
            (pages * PAGE) >> 20,
            o.budget_mib,
            o.threads,
            stats.evicted,
            stats.clean_dropped,
            stats.protection_lifted,
            stats.written_back,
            stats.readaheads,
            flushes.load(Ordering::Relaxed),
        );
    }
    Ok(())
}
