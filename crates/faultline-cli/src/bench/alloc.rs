//! `faultline bench alloc`: Mel Gorman's page allocator table (seed 004) on
//! faultline's frame allocator, plus the 4 KiB first-touch cost with the
//! per-CPU lists and fault-around switched on and off.
//!
//! Table: for batch sizes 1, 2, 4 ... 16384, a thread allocates `batch` 4 KiB
//! frames, then frees them, over and over (about 2^20 pages per measurement);
//! alloc and free are timed separately with the TSC, in ns per page. Modes:
//! `global` (`pcp = false`: every call takes the zone lock), `pcp` (per-CPU
//! lists), `bulk` (`alloc_bulk`/`free_bulk`: one zone-lock acquisition per
//! batch). The TSC read pair's own cost (its median, measured first) is
//! taken off every timed phase, as a kernel microbenchmark's loop overhead
//! would be. With 2 threads, each is pinned to its own CPU and both run at once
//! on one allocator. Each figure is the median of several repetitions; the
//! spread is their min..max.

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
/// overhead, subtracted from every timed phase).
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

/// One thread's loop: returns (alloc cycles, free cycles, pages), the
/// timer's overhead already taken off.
fn run_loop(
    a: &FrameAlloc,
    mode: Mode,
    batch: usize,
    pages_total: usize,
    cpu: usize,
) -> (u64, u64, usize) {
    let iters = (pages_total / batch).max(1);
    let overhead = timer_overhead();
    let mut held: Vec<Frame> = Vec::with_capacity(batch);
    let (mut ca, mut cf) = (0u64, 0u64);
    for _ in 0..iters {
        let t0 = host::cycles();
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
        let t1 = host::cycles();
        match mode {
            Mode::Bulk => a.free_bulk(&mut held),
            _ => {
                for f in held.drain(..) {
                    a.free_on(cpu, f);
                }
            }
        }
        let t2 = host::cycles();
        ca += (t1 - t0).saturating_sub(overhead);
        cf += (t2 - t1).saturating_sub(overhead);
    }
    (ca, cf, iters * batch)
}

/// One measurement: `threads` threads at once; ns per page (alloc, free),
/// averaged over the threads.
fn measure(
    mode: Mode,
    threads: usize,
    batch: usize,
    pages_total: usize,
    cfg: AllocConfig,
    tpn: f64,
) -> (f64, f64) {
    let a = FrameAlloc::new(
        cfg.cpus.max(threads) * 32768,
        AllocConfig {
            pcp: mode == Mode::Pcp,
            ..cfg
        },
    );
    let barrier = Barrier::new(threads);
    let per_thread: Vec<(u64, u64, usize)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (a, barrier) = (&a, &barrier);
                s.spawn(move || {
                    let cpu = t % host::online_cpus();
                    let _ = host::pin_thread(cpu);
                    // Warm-up: touches the lists and the zone once.
                    run_loop(a, mode, batch, batch.max(1024), cpu);
                    barrier.wait();
                    run_loop(a, mode, batch, pages_total, cpu)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or((0, 0, 1)))
            .collect()
    });
    a.check();
    let n = per_thread.len() as f64;
    let alloc = per_thread
        .iter()
        .map(|&(ca, _, p)| ca as f64 / tpn / p as f64)
        .sum::<f64>()
        / n;
    let free = per_thread
        .iter()
        .map(|&(_, cf, p)| cf as f64 / tpn / p as f64)
        .sum::<f64>()
        / n;
    (alloc, free)
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
        cpus: host::online_cpus(),
    };
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
    report.config = json!({"pcp_batch": cfg.batch, "pcp_high": cfg.high, "pages_per_measurement": pages_total,
        "repetitions": reps, "tsc_per_ns": tpn});
    let batches: Vec<usize> = (0..)
        .map(|i| 1usize << i)
        .take_while(|&b| b <= max_batch)
        .collect();
    let modes = [Mode::Global, Mode::Pcp, Mode::Bulk];
    let thread_counts = [1usize, 2];
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
                    let (x, y) = measure(mode, threads, batch, pages_total, cfg, tpn);
                    a.push(x);
                    f.push(y);
                    t.push(x + y);
                }
                let (a, f, t) = (
                    Summary::of(&mut a),
                    Summary::of(&mut f),
                    Summary::of(&mut t),
                );
                at_one.push((mode, threads, batch, t.median));
                report.rows.push(
                    json!({"kind": "alloc", "mode": mode.name(), "threads": threads, "batch": batch,
                    "alloc_ns": a.median, "free_ns": f.median, "total_ns": t.median,
                    "total_min_ns": t.min, "total_max_ns": t.max}),
                );
                report.table.push(vec![
                    mode.name().into(),
                    threads.to_string(),
                    batch.to_string(),
                    format!("{:.1}", a.median),
                    format!("{:.1}", f.median),
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
    report.notes.push(format!(
        "\nbatch 1: pcp {:.1} ns vs global {:.1} ns per page (1 thread); 2 threads: pcp {:.1} vs global {:.1} ({:.1}x); bulk at 64: {:.1} ns",
        find(Mode::Pcp, 1, 1),
        find(Mode::Global, 1, 1),
        find(Mode::Pcp, 2, 1),
        find(Mode::Global, 2, 1),
        find(Mode::Global, 2, 1) / find(Mode::Pcp, 2, 1),
        find(Mode::Bulk, 1, 64)
    ));
    Ok(report)
}
