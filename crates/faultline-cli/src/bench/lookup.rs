//! `faultline bench lookup`: Davidlohr Bueso's mmap_cache experiment (seed
//! 002) on faultline's region table, answering Ingo Molnar's questions: hit
//! rate, cost of a hit and of a miss (ns and TSC cycles), number of lookups,
//! and the search depth of a miss.
//!
//! Every lookup goes through `Manager::region_at`, i.e. the table's one
//! lookup function, with the cache scheme switched at run time. Traces:
//! - `build`: a compiler-like process: 24 regions from 64 KiB to 8 MiB; each
//!   step stays in the current region (85%), returns to one of the 4 most
//!   recently used (12%) or jumps to a random one (3%); one thread.
//! - `database`: 4000 regions of 64 KiB; 2 threads, each with its own working
//!   set of 100 regions; lookups come in runs of 4..64 on one region (a query
//!   scanning a segment), the region drawn from the working set 95% of the
//!   time and from all regions 5%.
//! - `replay`: the fault addresses of a real run (2 threads touching random
//!   pages of 2 regions of 2 MiB pages and 6 of 4 KiB pages, recorded by the
//!   fault service), replayed on one thread.
//!
//! Hit cost: one address looked up over and over (every scheme but `none`
//! hits). Miss cost: the `none` scheme on the same trace is all misses; a
//! scheme's own misses are reported through its hit rate.

use super::{progress, rng, BenchOpts};
use crate::report::Report;
use faultline::internals::{reset_thread_counters, thread_counters};
use faultline::store::Zero;
use faultline::{Config, LookupCache, Manager, ManagerBuilder, MapOptions, PageSize, Region};
use faultline_sys::host;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// TSC cycles per nanosecond.
fn tsc_per_ns() -> f64 {
    let (c0, t0) = (host::cycles(), Instant::now());
    std::thread::sleep(Duration::from_millis(50));
    (host::cycles() - c0) as f64 / t0.elapsed().as_nanos() as f64
}

struct Outcome {
    ns: f64,
    hits: u64,
    misses: u64,
    depth: u64,
}

/// Looks up every address of `trace` on this thread.
fn replay(mm: &Manager, trace: &[usize]) -> Outcome {
    reset_thread_counters();
    let t = Instant::now();
    let mut found = 0usize;
    for &a in trace {
        found += usize::from(mm.region_at(std::hint::black_box(a)).is_ok());
    }
    let ns = t.elapsed().as_nanos() as f64 / trace.len().max(1) as f64;
    std::hint::black_box(found);
    let c = thread_counters();
    Outcome {
        ns,
        hits: c.hits,
        misses: c.misses,
        depth: c.depth,
    }
}

/// Runs each thread's trace on its own thread at once; sums the counters,
/// averages ns per lookup.
fn run_threads(mm: &Manager, traces: &[Vec<usize>]) -> Outcome {
    let outs: Vec<Outcome> = std::thread::scope(|s| {
        let hs: Vec<_> = traces
            .iter()
            .enumerate()
            .map(|(i, t)| {
                s.spawn(move || {
                    let _ = host::pin_thread(i % host::online_cpus());
                    replay(mm, t)
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let n = outs.len().max(1) as f64;
    Outcome {
        ns: outs.iter().map(|o| o.ns).sum::<f64>() / n,
        hits: outs.iter().map(|o| o.hits).sum(),
        misses: outs.iter().map(|o| o.misses).sum(),
        depth: outs.iter().map(|o| o.depth).sum(),
    }
}

fn build_trace(regions: &[Region], n: usize) -> Vec<usize> {
    let mut next = rng(21);
    let mut recent: Vec<usize> = vec![0];
    let mut cur = 0;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let roll = next() % 100;
        if roll >= 97 {
            cur = next() as usize % regions.len();
        } else if roll >= 85 {
            cur = recent[next() as usize % recent.len()];
        }
        if recent.last() != Some(&cur) {
            recent.retain(|&r| r != cur);
            recent.push(cur);
            if recent.len() > 4 {
                recent.remove(0);
            }
        }
        let r = &regions[cur];
        out.push(r.addr() + (next() as usize % r.len()));
    }
    out
}

fn database_traces(regions: &[Region], threads: usize, n: usize) -> Vec<Vec<usize>> {
    (0..threads)
        .map(|t| {
            let mut next = rng(100 + t as u64);
            let set: Vec<usize> = (0..100)
                .map(|i| (t * 1000 + i * 7) % regions.len())
                .collect();
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                // A query touches one region (a table or index segment) for a
                // run of 4..64 lookups: 95% from the thread's working set.
                let i = if next() % 100 < 95 {
                    set[next() as usize % set.len()]
                } else {
                    next() as usize % regions.len()
                };
                let r = &regions[i];
                let run = 4 + next() as usize % 61;
                for _ in 0..run.min(n - out.len()) {
                    out.push(r.addr() + (next() as usize % r.len()));
                }
            }
            out
        })
        .collect()
}

/// A real run: 2 threads touch random pages of 8 regions; returns the
/// recorded fault addresses (and keeps the manager and regions alive).
fn real_run(base: &Config) -> anyhow::Result<(Manager, Vec<Region>, Vec<usize>)> {
    let mut config = base.clone();
    config.budget = 192 << 20;
    config.experiment.trace_faults = 1 << 20;
    let mm = ManagerBuilder::from_config(config).build()?;
    let mut regions = Vec::new();
    for i in 0..8 {
        let (len, ps) = if i < 2 {
            (64 << 20, PageSize::Huge2M)
        } else {
            (16 << 20, PageSize::Base4K)
        };
        regions.push(mm.map(len, Zero, MapOptions::new().page_size(ps))?);
    }
    std::thread::scope(|s| {
        for t in 0..2usize {
            let regions = &regions;
            s.spawn(move || {
                let mut next = rng(300 + t as u64);
                for _ in 0..3000 {
                    let r = &regions[next() as usize % regions.len()];
                    let ps = r.page_size().bytes();
                    let p = next() as usize % (r.len() / ps);
                    // Word t of page p: each thread its own word.
                    r.atomics()[(p * ps) / 8 + t].store(1, Ordering::Relaxed);
                }
            });
        }
    });
    let trace = mm.fault_trace();
    Ok((mm, regions, trace))
}

pub fn run(opts: &BenchOpts) -> anyhow::Result<Report> {
    let n = if opts.quick { 200_000 } else { 2_000_000 };
    let tpn = tsc_per_ns();
    let mut base = opts.config();
    base.budget = 64 << 20;
    let mut report = Report::new(
        "lookup",
        vec![
            "trace",
            "cache",
            "hit_rate",
            "ns_per_lookup",
            "cycles",
            "hit_ns",
            "depth_on_miss",
            "lookups",
            "vs_none",
        ],
    );
    report.config = json!({"lookups_per_thread": n, "tsc_per_ns": tpn});
    let bar = progress(3 * LookupCache::ALL.len() as u64, "lookup");

    // Build-like and database-like traces on one manager.
    let mm = ManagerBuilder::from_config(base.clone()).build()?;
    let mut build_regions = Vec::new();
    for i in 0..24usize {
        let len = (64usize << 10) << (i % 8);
        build_regions.push(mm.map(len, Zero, MapOptions::new())?);
    }
    let mut db_regions = Vec::new();
    for _ in 0..4000 {
        db_regions.push(mm.map(64 << 10, Zero, MapOptions::new())?);
    }
    let build = vec![build_trace(&build_regions, n)];
    let db = database_traces(&db_regions, 2, n);
    let (real_mm, _real_regions, real) = real_run(&base)?;
    let real_trace: Vec<usize> = real
        .iter()
        .copied()
        .cycle()
        .take(n.max(real.len()))
        .collect();

    let traces: [(&str, &Manager, Vec<Vec<usize>>); 3] = [
        ("build", &mm, build),
        ("database", &mm, db),
        ("replay", &real_mm, vec![real_trace]),
    ];
    for (name, m, t) in &traces {
        let mut none_ns = f64::NAN;
        for cache in LookupCache::ALL {
            m.set_lookup_cache(cache);
            // Warm once, then measure.
            run_threads(m, t);
            let o = run_threads(m, t);
            // Hit cost: one address, over and over.
            let one = vec![vec![t[0][0]; 200_000]];
            let hit = run_threads(m, &one);
            if cache == LookupCache::None {
                none_ns = o.ns;
            }
            let lookups = o.hits + o.misses;
            let hit_rate = o.hits as f64 / lookups.max(1) as f64;
            let depth = o.depth as f64 / o.misses.max(1) as f64;
            report.rows.push(json!({"trace": name, "cache": cache.name(), "hit_rate": hit_rate,
                "ns_per_lookup": o.ns, "cycles_per_lookup": o.ns * tpn, "hit_ns": hit.ns,
                "hit_cycles": hit.ns * tpn, "miss_ns": none_ns, "depth_on_miss": depth,
                "lookups": lookups, "vs_none": none_ns / o.ns, "distinct_addresses": t.iter().map(Vec::len).sum::<usize>()}));
            report.table.push(vec![
                name.to_string(),
                cache.name().into(),
                format!("{:.1}%", hit_rate * 100.0),
                format!("{:.2}", o.ns),
                format!("{:.0}", o.ns * tpn),
                format!("{:.2}", hit.ns),
                format!("{depth:.1}"),
                lookups.to_string(),
                format!("{:.2}x", none_ns / o.ns),
            ]);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    report.notes.push(format!(
        "replay trace: {} recorded fault addresses, cycled to {} lookups. Miss cost = the `none` row \
         (every lookup a binary search); vs_none = none's ns / this row's.",
        real.len(),
        n.max(real.len())
    ));
    Ok(report)
}
