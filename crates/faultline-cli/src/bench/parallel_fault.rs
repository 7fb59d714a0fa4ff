//! `faultline bench parallel-fault`: Anton Blanchard's parallel_fault (seed
//! 003) on faultline. T application threads fault a region of 2 MiB pages
//! (thread t touches pages t, t + T, t + 2T, ...), with T fault workers, one
//! lock for every fault (`global`, the pre-seed baseline) or the hashed table
//! (`hashed`), behind a store that sleeps 0 or 100 µs per read (a stand-in
//! for a remote store; the read also fills the 2 MiB frame, the work the
//! seed's hugetlb faults did by clearing). Threads 1, 2, 4, ... up to twice
//! the CPUs (`--cpus`), and 64 (the seed's) in the full run. A run faults
//! the region `rounds` times (its pages given back between rounds, untimed),
//! so that the highest thread count still faults 256 pages per thread and
//! fixed costs do not decide the ratio. Reports wall seconds of the fault
//! rounds (median of the repetitions, with min..max) and the lockstat
//! counters of the median run.

use super::{progress, BenchOpts};
use crate::report::{Report, Summary};
use faultline::store::{Delayed, Zero};
use faultline::{Config, Discard, LockMode, ManagerBuilder, MapOptions, PageSize};
use serde_json::json;
use std::sync::Barrier;
use std::time::{Duration, Instant};

struct Run {
    seconds: f64,
    acquisitions: u64,
    contentions: u64,
    wait_us: f64,
}

fn one(
    locks: LockMode,
    threads: usize,
    latency_us: u64,
    (bytes, rounds): (usize, usize),
    base: &Config,
) -> anyhow::Result<Run> {
    let mut config = base.clone();
    config.budget = bytes;
    config.workers = threads;
    config.experiment.fault_locks = Some((2 * threads).next_power_of_two());
    config.experiment.locks = locks;
    let mm = ManagerBuilder::from_config(config).build()?;
    let store = Delayed::new(Zero, Duration::from_micros(latency_us));
    // `Delayed` is never a zero store (every fault calls its read, which
    // sleeps) and `Zero` keeps no writes: the region is pinned (never
    // reclaimed; the budget holds all of it), so its writes live in memory.
    let opts = MapOptions::new().page_size(PageSize::Huge2M).pinned(true);
    let r = mm.map(bytes, store, opts)?;
    let pages = bytes / PageSize::Huge2M.bytes();
    let base_addr = r.as_mut_ptr() as usize;
    let mut seconds = 0.0;
    for round in 0..rounds {
        if round > 0 {
            r.discard(0..bytes, Discard::KeepStore)?;
        }
        seconds += fault_round(base_addr, pages, threads)?;
    }
    let st = mm.stats();
    if let Some(e) = mm.take_error() {
        anyhow::bail!("fault error during the run: {e}");
    }
    Ok(Run {
        seconds,
        acquisitions: st.locks.acquisitions,
        contentions: st.locks.contentions,
        wait_us: st.locks.wait_ns as f64 / 1e3,
    })
}

/// One round: `threads` threads fault the `pages` 2 MiB pages from
/// `base_addr`, thread t pages t, t + T, ...; seconds from the first start
/// to the last finish.
fn fault_round(base_addr: usize, pages: usize, threads: usize) -> anyhow::Result<f64> {
    let barrier = Barrier::new(threads);
    // Each thread notes when it started (after the barrier) and finished;
    // the round lasts from the first start to the last finish. (Timing from
    // the spawning thread would start late when it is not scheduled at once
    // among 2 x T runnable threads.)
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for p in (t..pages).step_by(threads) {
                        // Raw access: the run times write faults, not an
                        // API call.
                        // SAFETY: page p lies inside the writable region,
                        // which outlives this round, and thread t alone
                        // touches pages t, t + T, t + 2T, ...
                        unsafe {
                            ((base_addr + p * PageSize::Huge2M.bytes()) as *mut u8)
                                .write_volatile(1)
                        };
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let first = spans
        .iter()
        .map(|s| s.0)
        .min()
        .ok_or_else(|| anyhow::anyhow!("no thread finished"))?;
    let last = spans
        .iter()
        .map(|s| s.1)
        .max()
        .ok_or_else(|| anyhow::anyhow!("no thread finished"))?;
    Ok((last - first).as_secs_f64())
}

pub fn run(opts: &BenchOpts) -> anyhow::Result<Report> {
    let base = opts.config();
    let mut threads = super::thread_sweep(base.cpus);
    let (bytes, reps) = if opts.quick {
        (128 << 20, 1)
    } else {
        if !threads.contains(&64) {
            threads.push(64);
        }
        (512 << 20, 3)
    };
    let pages = bytes / PageSize::Huge2M.bytes();
    let most = threads.iter().copied().max().unwrap_or(1);
    let per_thread = if opts.quick { 32 } else { 256 };
    let rounds = (most * per_thread).div_ceil(pages).max(1);
    let mut report = Report::new(
        "parallel-fault",
        vec![
            "locks",
            "threads",
            "latency_us",
            "seconds",
            "spread",
            "acquisitions",
            "contentions",
            "wait_us",
            "speedup",
        ],
    );
    report.config = json!({"region_bytes": bytes, "rounds": rounds, "faults_per_run": rounds * pages,
        "page": "2m", "repetitions": reps, "workers": "= threads", "threads": threads});
    let modes = [(LockMode::Global, "global"), (LockMode::Hashed, "hashed")];
    let configs: Vec<(u64, usize, (LockMode, &str))> = [0u64, 100]
        .iter()
        .flat_map(|&l| threads.iter().flat_map(move |&t| modes.map(|m| (l, t, m))))
        .collect();
    let bar = progress((configs.len() * reps) as u64, "parallel");
    let mut global_secs = std::collections::HashMap::new();
    for (latency, t, (mode, name)) in configs {
        let mut runs = Vec::new();
        for _ in 0..reps {
            runs.push(one(mode, t, latency, (bytes, rounds), &base)?);
            bar.inc(1);
        }
        runs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        let mut secs: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
        let s = Summary::of(&mut secs);
        let mid = &runs[runs.len() / 2];
        if mode == LockMode::Global {
            global_secs.insert((latency, t), s.median);
        }
        let speedup = global_secs.get(&(latency, t)).map_or(1.0, |g| g / s.median);
        report.rows.push(json!({"locks": name, "threads": t, "store_latency_us": latency,
            "seconds": s.median, "seconds_min": s.min, "seconds_max": s.max,
            "contentions": mid.contentions, "acquisitions": mid.acquisitions, "wait_us": mid.wait_us,
            "speedup_vs_global": speedup}));
        report.table.push(vec![
            name.into(),
            t.to_string(),
            latency.to_string(),
            format!("{:.4}", s.median),
            format!("{:.4}..{:.4}", s.min, s.max),
            mid.acquisitions.to_string(),
            mid.contentions.to_string(),
            format!("{:.0}", mid.wait_us),
            format!("{speedup:.2}x"),
        ]);
    }
    bar.finish_and_clear();
    report.notes.push(format!(
        "{} MiB of 2 MiB pages faulted {rounds} times per run ({} faults; seconds are the fault rounds only, \
         the pages given back between them untimed); workers = threads; speedup = global seconds / this row's.",
        bytes >> 20,
        rounds * pages
    ));
    Ok(report)
}
