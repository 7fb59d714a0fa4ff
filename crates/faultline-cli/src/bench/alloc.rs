//! `faultline bench alloc`: Mel Gorman's page allocator table (seed 004) on
//! faultline's frame allocator, plus the 4 KiB first-touch cost with the
//! per-CPU lists and fault-around switched on and off.
//!
//! Table: for batch sizes 1, 2, 4 ... 16384, a thread allocates `batch` 4 KiB
//! frames, then frees them, over and over (about 2^20 pages per measurement),
//! in ns per page. Modes: `global` (`pcp = false`: every call takes the zone
//! lock), `pcp` (per-CPU lists), `bulk` (`alloc_bulk`/`free_bulk`: one
//! zone-lock acquisition per batch). Threads 1, 2, 4, ... up to twice the
//! CPUs (`--cpus`), all at once on one allocator, each pinned to a CPU in
//! turn. Each figure is the median of several repetitions; the spread is
//! their min..max.
//!
//! Timing: the total (alloc + free) is one TSC stretch around the whole
//! loop, so no timer cost is in it or taken off it. Alloc and free apart
//! need a timer read between the phases: they are given from batch 64 up
//! only, where a phase is hundreds of times the cost of a TSC read pair
//! (measured and reported); below that a phase is within the timer's own
//! noise (a batch-1 alloc is a few ns) and the split is left out.

use super::{progress, rng, BenchOpts};
use crate::report::{Report, Summary};
use faultline::internals::{AllocConfig, Frame, FrameAlloc, FrameAllocator};
use faultline::store::Zero;
use faultline::{Config, ManagerBuilder, MapOptions};
use faultline_sys::host;
use serde_json::json;
use std::sync::Barrier;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Global,
    Pcp,
    Bulk,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Global => "global",
            Mode::Pcp => "pcp",
            Mode::Bulk => "bulk",
        }
    }
}

/// TSC cycles per nanosecond, measured against the monotonic clock.
fn tsc_per_ns() -> f64 {
    let (c0, t0) = (host::cycles(), Instant::now());
    std::thread::sleep(Duration::from_millis(50));
    let (c1, t1) = (host::cycles(), Instant::now());
    (c1 - c0) as f64 / (t1 - t0).as_nanos() as f64
}

/// Cycles one back-to-back pair of TSC reads costs (the timer's own
/// overhead), for the notes.
fn timer_overhead() -> u64 {
    let mut v: Vec<u64> = (0..10_000)
        .map(|_| {
            let a = host::cycles();
            let b = host::cycles();
            b - a
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}

/// The smallest batch whose alloc and free phases are timed apart.
const SPLIT_FROM_BATCH: usize = 64;

/// What one thread's loop measured, in TSC cycles.
#[derive(Clone, Copy, Default)]
struct Looped {
    /// The whole loop, one stretch.
    total: u64,
    /// The alloc phases, summed (0 below `SPLIT_FROM_BATCH`).
    alloc: u64,
    /// The free phases, summed (0 below `SPLIT_FROM_BATCH`).
    free: u64,
    pages: usize,
}

/// One thread's loop of alloc-`batch`-then-free-`batch` rounds.
fn run_loop(a: &FrameAlloc, mode: Mode, batch: usize, pages_total: usize, cpu: usize) -> Looped {
    let iters = (pages_total / batch).max(1);
    let split = batch >= SPLIT_FROM_BATCH;
    let mut held: Vec<Frame> = Vec::with_capacity(batch);
    let (mut ca, mut cf) = (0u64, 0u64);
    let start = host::cycles();
    for _ in 0..iters {
        let t0 = if split { host::cycles() } else { 0 };
        match mode {
            Mode::Bulk => {
                a.alloc_bulk(0, batch, &mut held);
            }
            _ => {
                for _ in 0..batch {
                    if let Some(f) = a.alloc_on(cpu, 0) {
                        held.push(f);
                    }
                }
            }
        }
        let t1 = if split { host::cycles() } else { 0 };
        match mode {
            Mode::Bulk => a.free_bulk(&mut held),
            _ => {
                for f in held.drain(..) {
                    a.free_on(cpu, f);
                }
            }
        }
        if split {
            let t2 = host::cycles();
            ca += t1 - t0;
            cf += t2 - t1;
        }
    }
    Looped {
        total: host::cycles() - start,
        alloc: ca,
        free: cf,
        pages: iters * batch,
    }
}

/// One measurement: `threads` threads at once; ns per page (alloc, free,
/// total), averaged over the threads (alloc and free NaN below
/// `SPLIT_FROM_BATCH`).
fn measure(
    mode: Mode,
    threads: usize,
    batch: usize,
    pages_total: usize,
    cfg: AllocConfig,
    tpn: f64,
) -> (f64, f64, f64) {
    let a = FrameAlloc::new(
        cfg.cpus.max(threads) * 32768,
        AllocConfig {
            pcp: mode == Mode::Pcp,
            ..cfg
        },
    );
    let barrier = Barrier::new(threads);
    let allowed = host::allowed_cpus();
    let per_thread: Vec<Looped> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (a, barrier) = (&a, &barrier);
                // Pinned to a real CPU in turn; its list is the one of "CPU"
                // t (of the CPUs the allocator is sized for), as a thread
                // per CPU would use on a machine of that many.
                let cpu = allowed[t % allowed.len()];
                s.spawn(move || {
                    let _ = host::pin_thread(cpu);
                    let list = t % cfg.cpus.max(1);
                    // Warm-up: touches the lists and the zone once.
                    run_loop(a, mode, batch, batch.max(1024), list);
                    barrier.wait();
                    run_loop(a, mode, batch, pages_total, list)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    a.check();
    let n = per_thread.len() as f64;
    let per_page = |f: fn(&Looped) -> u64| {
        per_thread
            .iter()
            .map(|l| f(l) as f64 / tpn / l.pages.max(1) as f64)
            .sum::<f64>()
            / n
    };
    let total = per_page(|l| l.total);
    if batch < SPLIT_FROM_BATCH {
        return (f64::NAN, f64::NAN, total);
    }
    (per_page(|l| l.alloc), per_page(|l| l.free), total)
}

/// Mean and median µs per 4 KiB page of first touches on a fresh region.
fn fault_run(config: &Config, sequential: bool, pages: usize) -> anyhow::Result<(f64, Summary)> {
    let mm = ManagerBuilder::from_config(config.clone()).build()?;
    let span = pages * 4;
    let r = mm.map(span * 4096, Zero, MapOptions::new())?;
    let mut order: Vec<usize> = if sequential {
        (0..pages).collect()
    } else {
        let mut next = rng(5);
        let mut v: Vec<usize> = (0..span).collect();
        for i in (1..v.len()).rev() {
            v.swap(i, next() as usize % (i + 1));
        }
        v.truncate(pages);
        v
    };
    let mut lat = Vec::with_capacity(pages);
    let t = Instant::now();
    for p in order.drain(..) {
        let ptr = (r.addr() + p * 4096) as *mut u8;
        let t0 = Instant::now();
        // Raw access: this times the fault, not an API call.
        // SAFETY: inside the region, which lives until this function returns
        // and which only this thread touches.
        unsafe { ptr.write_volatile(1) };
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let mean = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    Ok((mean, Summary::of(&mut lat)))
}

pub fn run(opts: &BenchOpts) -> anyhow::Result<Report> {
    let (pages_total, reps, max_batch) = if opts.quick {
        (1 << 17, 3, 4096)
    } else {
        (1 << 20, 5, 16384)
    };
    let tpn = tsc_per_ns();
    let base = opts.config();
    let cfg = AllocConfig {
        pcp: true,
        batch: base.experiment.pcp_batch,
        high: base.experiment.pcp_high,
        cpus: base.cpus,
    };
    let overhead = timer_overhead();
    let mut report = Report::new(
        "alloc",
        vec![
            "mode",
            "threads",
            "batch",
            "alloc_ns",
            "free_ns",
            "total_ns",
            "total_spread",
        ],
    );
    let thread_counts = super::thread_sweep(base.cpus);
    report.config = json!({"pcp_batch": cfg.batch, "pcp_high": cfg.high, "pages_per_measurement": pages_total,
        "repetitions": reps, "tsc_per_ns": tpn, "timer_pair_cycles": overhead,
        "split_from_batch": SPLIT_FROM_BATCH, "cpus_sized_for": base.cpus, "threads": thread_counts});
    let batches: Vec<usize> = (0..)
        .map(|i| 1usize << i)
        .take_while(|&b| b <= max_batch)
        .collect();
    let modes = [Mode::Global, Mode::Pcp, Mode::Bulk];
    let bar = progress(
        (batches.len() * modes.len() * thread_counts.len() + 4) as u64,
        "alloc",
    );
    let mut at_one: Vec<(Mode, usize, usize, f64)> = Vec::new();
    for &threads in &thread_counts {
        for &mode in &modes {
            for &batch in &batches {
                let mut a = Vec::new();
                let mut f = Vec::new();
                let mut t = Vec::new();
                for _ in 0..reps {
                    let (x, y, z) = measure(mode, threads, batch, pages_total, cfg, tpn);
                    a.push(x);
                    f.push(y);
                    t.push(z);
                }
                let (a, f, t) = (
                    Summary::of(&mut a),
                    Summary::of(&mut f),
                    Summary::of(&mut t),
                );
                at_one.push((mode, threads, batch, t.median));
                // NaN (the split not measured) is null in JSON, "-" here.
                let split = |v: f64| {
                    if v.is_nan() {
                        "-".to_string()
                    } else {
                        format!("{v:.1}")
                    }
                };
                report.rows.push(
                    json!({"kind": "alloc", "mode": mode.name(), "threads": threads, "batch": batch,
                    "alloc_ns": a.median, "free_ns": f.median, "total_ns": t.median,
                    "total_min_ns": t.min, "total_max_ns": t.max}),
                );
                report.table.push(vec![
                    mode.name().into(),
                    threads.to_string(),
                    batch.to_string(),
                    split(a.median),
                    split(f.median),
                    format!("{:.1}", t.median),
                    format!("{:.1}..{:.1}", t.min, t.max),
                ]);
                bar.inc(1);
            }
        }
    }
    // The 4 KiB first-touch cost with pcp and fault-around on and off.
    let pages: usize = if opts.quick { 2048 } else { 8192 };
    let mut fault_rows = Vec::new();
    for (pcp, fa) in [
        (false, 1),
        (true, 1),
        (false, base.fault_around.max(16)),
        (true, base.fault_around.max(16)),
    ] {
        let mut config = base.clone();
        config.budget = (pages * 4096 * 8).next_multiple_of(2 << 20);
        config.experiment.pcp = pcp;
        config.fault_around = fa;
        for sequential in [true, false] {
            let (mean, s) = fault_run(&config, sequential, pages)?;
            let pattern = if sequential { "seq" } else { "random" };
            report.rows.push(
                json!({"kind": "fault", "pcp": pcp, "fault_around": fa, "pattern": pattern,
                "us_per_page": mean, "median_us": s.median, "p99_us": s.p99, "pages": pages}),
            );
            fault_rows.push(vec![
                if pcp { "pcp" } else { "global" }.to_string(),
                fa.to_string(),
                pattern.into(),
                format!("{mean:.2}"),
                format!("{:.2}", s.median),
                format!("{:.1}", s.p99),
            ]);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let find = |m: Mode, th: usize, b: usize| {
        at_one
            .iter()
            .find(|&&(mm, t, bb, _)| mm == m && t == th && bb == b)
            .map_or(f64::NAN, |x| x.3)
    };
    report.notes.push(format!(
        "\n4 KiB first touch ({pages} pages, {} region), lists and fault-around switched:\n{}",
        "4x larger",
        crate::report::render_table(
            &[
                "alloc",
                "fault_around",
                "pattern",
                "us_per_page",
                "median_us",
                "p99_us"
            ],
            &fault_rows
        )
    ));
    let ratios: Vec<String> = thread_counts
        .iter()
        .map(|&th| {
            let (p, g) = (find(Mode::Pcp, th, 1), find(Mode::Global, th, 1));
            format!("threads {th}: pcp {p:.1} vs global {g:.1} ({:.1}x)", g / p)
        })
        .collect();
    report.notes.push(format!(
        "\nbatch 1, alloc + free per page: {}; bulk at 64, 1 thread: {:.1} ns",
        ratios.join("; "),
        find(Mode::Bulk, 1, 64)
    ));
    report.notes.push(format!(
        "totals are one timed stretch per thread; alloc_ns and free_ns are timed per phase from batch {SPLIT_FROM_BATCH} \
         up ('-' below: a phase there is within the timer's noise); a TSC read pair costs {overhead} cycles \
         ({:.1} ns) here; {} threads on {} CPUs (sized for {})",
        overhead as f64 / tpn,
        thread_counts.last().copied().unwrap_or(1),
        host::online_cpus(),
        base.cpus
    ));
    Ok(report)
}
