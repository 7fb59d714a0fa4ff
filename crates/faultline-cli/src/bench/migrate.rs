//! `faultline bench migrate`: Zi Yan's table (seed 001) on faultline's
//! migration path. Pages of a region move between pool 0 and a second pool
//! (another NUMA node where the machine has two, else a tier of the same
//! node) with `Region::migrate_with`: one 4 KiB page, 512 x 4 KiB pages (one
//! 2 MiB block), and one 2 MiB page; copy threads 1, 2, 4, ... up to twice
//! the CPUs (`--cpus`), the caller plus idle fault workers (the bench starts
//! workers enough); the per-4 KiB copy loop (the pre-seed baseline) vs the
//! chunked large copy. A plain `memcpy` of the same bytes between two warm
//! buffers, on 1, 2, 4, ... threads up to the CPUs, is the reference row.
//!
//! Then the cost to the fault path: a probe thread faults fresh 4 KiB pages
//! of another region every 200 µs and times each fault, while nothing runs,
//! and while 2 MiB migrations run back to back with each thread count.
//!
//! Every region is touched and migrated once untimed first (this VM backs
//! fresh memory lazily).

use super::{progress, BenchOpts};
use crate::report::{Report, Summary};
use faultline::store::Zero;
use faultline::{
    Config, CopyMethod, CopyPlan, Manager, ManagerBuilder, MapOptions, PageSize, Region,
};
use faultline_sys::mem::{Advice, Mapping};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const HUGE: usize = 2 * MIB;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    /// One 4 KiB page per call.
    One4k,
    /// 512 x 4 KiB (one 2 MiB block) per call.
    Block4k,
    /// One 2 MiB page per call.
    Huge2m,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::One4k => "1 x 4k",
            Case::Block4k => "512 x 4k",
            Case::Huge2m => "1 x 2m",
        }
    }

    fn page(self) -> &'static str {
        match self {
            Case::One4k | Case::Block4k => "4k",
            Case::Huge2m => "2m",
        }
    }

    fn unit(self) -> usize {
        match self {
            Case::One4k => 4096,
            Case::Block4k | Case::Huge2m => HUGE,
        }
    }
}

/// Touches every page of `r` (writes a pattern; untimed).
fn touch(r: &Region) {
    let words = r.atomics();
    for off in (0..r.len()).step_by(4096) {
        words[off / 8].store(off as u64 | 1, Ordering::Relaxed);
    }
}

/// One timed pass: every unit of `r` migrates to `to`, one call each.
/// Returns (µs per unit, µs of copy per unit) samples.
fn pass(
    r: &Region,
    case: Case,
    to: usize,
    plan: CopyPlan,
    out: &mut Vec<f64>,
    copy: &mut Vec<f64>,
) -> anyhow::Result<()> {
    let unit = case.unit();
    for off in (0..r.len()).step_by(unit) {
        let rep = r.migrate_with(off..off + unit, to, plan)?;
        anyhow::ensure!(rep.bytes == unit, "migrated {} of {unit} bytes", rep.bytes);
        out.push(rep.total_ns as f64 / 1e3);
        copy.push(rep.copy_ns as f64 / 1e3);
    }
    Ok(())
}

/// One reference copy: streaming stores (`nt`) or `memcpy`.
fn copy(nt: bool, d: &mut [u8], s: &[u8]) {
    if nt {
        faultline::internals::copy_large(d, s);
    } else {
        d.copy_from_slice(s);
    }
    std::hint::black_box(&d[0]);
}

/// Plain copies of 2 MiB between two buffers of `span` bytes (warm, but
/// larger than the caches, as the migrated frames are), each copy a different
/// 2 MiB pair, on `threads` threads (each a share); µs per 2 MiB, `reps`
/// samples. `nt`: faultline's large copy (non-temporal stores) instead of
/// `memcpy`.
fn memcpy_row(span: usize, threads: usize, reps: usize, nt: bool) -> Vec<f64> {
    // THP-backed like the pool, so both sides pay the same TLB misses.
    let thp = |fill: u8| -> Option<Mapping> {
        let m = Mapping::anonymous(span, HUGE).ok()?;
        let _ = m.advise(m.addr(), span, Advice::HugePage);
        m.advise(m.addr(), span, Advice::PopulateWrite).ok()?;
        // SAFETY: our own fresh mapping, written through this slice only.
        unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), span) }.fill(fill);
        Some(m)
    };
    let (Some(src_map), Some(dst_map)) = (thp(7), thp(0)) else {
        return Vec::new();
    };
    // SAFETY: two distinct live mappings of `span` bytes, used only here.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts(src_map.as_ptr(), span),
            std::slice::from_raw_parts_mut(dst_map.as_ptr(), span),
        )
    };
    let mut samples = Vec::with_capacity(reps);
    for i in 0..reps {
        let at = (i * HUGE) % span;
        let (d, sr) = (&mut dst[at..at + HUGE], &src[at..at + HUGE]);
        if threads == 1 {
            // On this thread: no spawn, no hand-off.
            let t0 = Instant::now();
            copy(nt, d, sr);
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
            continue;
        }
        let share = HUGE / threads;
        // A spinning barrier: every thread is on a CPU when the copy starts
        // (a sleeping one would add its wake-up to the time).
        let arrived = AtomicUsize::new(0);
        let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
            let hs: Vec<_> = d
                .chunks_mut(share)
                .zip(sr.chunks(share))
                .map(|(d, sr)| {
                    let arrived = &arrived;
                    s.spawn(move || {
                        arrived.fetch_add(1, Ordering::AcqRel);
                        while arrived.load(Ordering::Acquire) < threads {
                            std::hint::spin_loop();
                        }
                        let t0 = Instant::now();
                        copy(nt, d, sr);
                        (t0, Instant::now())
                    })
                })
                .collect();
            hs.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let start = spans.iter().map(|s| s.0).min();
        let end = spans.iter().map(|s| s.1).max();
        if let (Some(a), Some(b)) = (start, end) {
            samples.push((b - a).as_secs_f64() * 1e6);
        }
    }
    samples
}

/// Fault latency (µs) of a probe faulting fresh 4 KiB pages every 200 µs
/// for `dur`, while `load` runs (until the probe is done).
fn probe(
    mm: &Manager,
    dur: Duration,
    load: impl FnOnce(&AtomicBool) + Send,
) -> anyhow::Result<Vec<f64>> {
    let region = mm.map(256 * MIB, Zero, MapOptions::new())?;
    let stop = AtomicBool::new(false);
    let lat = std::thread::scope(|s| {
        let stop = &stop;
        let r = &region;
        let h = s.spawn(move || {
            let mut lat = Vec::new();
            let t_end = Instant::now() + dur;
            // Pages 64 KiB apart: each touch is a fresh fault (fault-around
            // maps 16 pages).
            let mut off = 0;
            while Instant::now() < t_end && off < r.len() {
                let t = Instant::now();
                // Raw access: this loop times the fault, not an API call.
                // SAFETY: inside the live region; only this thread touches
                // it (the migrations run on another region).
                unsafe { ((r.addr() + off) as *mut u8).write_volatile(1) };
                lat.push(t.elapsed().as_secs_f64() * 1e6);
                off += 64 << 10;
                std::thread::sleep(Duration::from_micros(200));
            }
            stop.store(true, Ordering::Relaxed);
            lat
        });
        load(stop);
        h.join().unwrap_or_default()
    });
    Ok(lat)
}

pub fn run(opts: &BenchOpts) -> anyhow::Result<Report> {
    let (region_len, reps) = if opts.quick {
        (16 * MIB, 3)
    } else {
        (64 * MIB, 5)
    };
    let nodes = faultline_sys::host::numa_nodes();
    let cross_node = nodes.len() >= 2;
    let mut base = opts.config();
    // Copy threads 1, 2, 4, ... up to twice the CPUs: the caller plus idle
    // workers, so there must be workers enough (a --workers below that
    // caps the sweep instead).
    let mut thread_counts = super::thread_sweep(base.cpus);
    match opts.workers {
        Some(w) => thread_counts.retain(|&t| t <= w + 1),
        None => {
            base.workers = base
                .workers
                .max(thread_counts.last().copied().unwrap_or(1) - 1)
        }
    }
    let workers = base.workers;
    let budget = 2 * region_len + 256 * MIB + 64 * MIB;
    let config = if cross_node {
        base.clone().with_node_pools(budget)
    } else {
        let mut c = base.clone();
        c.budget = budget;
        c.with_tier(2 * region_len)
    };
    let mm = ManagerBuilder::from_config(config).build()?;
    let mut report = Report::new(
        "migrate",
        vec![
            "case",
            "page",
            "threads",
            "copy",
            "us_per_2mib",
            "spread",
            "gb_per_s",
            "copy_gb_per_s",
            "vs_memcpy",
        ],
    );
    report.config = json!({"region_bytes": region_len, "repetitions": reps, "workers": workers,
        "cpus_sized_for": base.cpus, "copy_threads": thread_counts,
        "pools": if cross_node { "one per NUMA node" } else { "pool 0 + a tier on the same node" },
        "chunk_bytes": base.experiment.migrate_chunk});
    let mut rows: Vec<(String, &'static str, usize, &'static str, Summary, Summary)> = Vec::new();
    // The memcpy reference, on as many threads as there are CPUs to run
    // them (a spinning start barrier with more would time the scheduler).
    let cpus = faultline_sys::host::online_cpus();
    let memcpy_threads: Vec<usize> = thread_counts
        .iter()
        .copied()
        .filter(|&t| t <= cpus)
        .collect();
    let mut memcpy_gbps = std::collections::BTreeMap::new();
    for &t in &memcpy_threads {
        for nt in [false, true] {
            let mut s = memcpy_row(region_len, t, 20 * reps, nt);
            let s = Summary::of(&mut s);
            if !nt {
                memcpy_gbps.insert(t, HUGE as f64 / s.median / 1e3);
            }
            let name = if nt { "memcpy-nt" } else { "memcpy" };
            rows.push((name.into(), "2m", t, name, s, s));
        }
    }
    let cases = [Case::One4k, Case::Block4k, Case::Huge2m];
    let methods = [
        CopyMethod::PerPage,
        CopyMethod::Chunked,
        CopyMethod::ChunkedNt,
    ];
    let bar = progress(
        (cases.len() * methods.len() * thread_counts.len()) as u64,
        "migrate",
    );
    for case in cases {
        let size = if case.page() == "2m" {
            PageSize::Huge2M
        } else {
            PageSize::Base4K
        };
        // One 4 KiB page per call is slow per byte: fewer of them.
        let len = if case == Case::One4k {
            region_len / 16
        } else {
            region_len
        };
        let r = mm.map(len, Zero, MapOptions::new().page_size(size))?;
        touch(&r);
        let warm = CopyPlan {
            method: CopyMethod::Chunked,
            threads: 1,
            chunk: base.experiment.migrate_chunk,
        };
        r.migrate_with(0..len, 1, warm)?;
        r.migrate_with(0..len, 0, warm)?;
        // Every page is in pool 0 now: the first pass goes to pool 1, and
        // each pass after it back the other way. (Carried over from the
        // previous case, `to` pointed at pool 0 whenever that case ran an
        // odd number of passes — 3 thread counts, as on 16 CPUs — and the
        // first pass found nothing to move.)
        let mut to = 1;
        for &method in &methods {
            for &threads in &thread_counts {
                let plan = CopyPlan {
                    method,
                    threads,
                    chunk: base.experiment.migrate_chunk,
                };
                let (mut total, mut copy) = (Vec::new(), Vec::new());
                for _ in 0..reps {
                    pass(&r, case, to, plan, &mut total, &mut copy)?;
                    to = 1 - to;
                }
                // Per 2 MiB.
                let scale = (HUGE / case.unit()) as f64;
                for v in total.iter_mut().chain(copy.iter_mut()) {
                    *v *= scale;
                }
                rows.push((
                    case.name().into(),
                    case.page(),
                    threads,
                    method.name(),
                    Summary::of(&mut total),
                    Summary::of(&mut copy),
                ));
                bar.inc(1);
            }
        }
        // Everything back in pool 0 before the region goes.
        r.migrate_with(0..len, 0, warm)?;
    }
    bar.finish_and_clear();
    for (case, page, threads, copy, s, c) in &rows {
        let gbps = HUGE as f64 / s.median / 1e3;
        let copy_gbps = HUGE as f64 / c.median / 1e3;
        // The memcpy row with the most threads up to this row's.
        let reference = memcpy_gbps
            .range(..=*threads)
            .next_back()
            .map_or(f64::NAN, |(_, &g)| g);
        let vs = gbps / reference;
        report.rows.push(
            json!({"case": case, "page": page, "threads": threads, "copy": copy,
            "us_per_2mib": s.median, "us_per_2mib_p10": s.p10, "us_per_2mib_p90": s.p90,
            "gb_per_s": gbps, "copy_gb_per_s": copy_gbps, "vs_memcpy": vs, "samples": s.n}),
        );
        report.table.push(vec![
            case.clone(),
            (*page).into(),
            threads.to_string(),
            (*copy).into(),
            format!("{:.1}", s.median),
            format!("{:.1}..{:.1}", s.p10, s.p90),
            format!("{gbps:.2}"),
            format!("{copy_gbps:.2}"),
            format!("{:.0}%", vs * 100.0),
        ]);
    }
    // Fault latency while migrations run.
    let r = mm.map(
        region_len,
        Zero,
        MapOptions::new().page_size(PageSize::Huge2M),
    )?;
    touch(&r);
    let probe_dur = Duration::from_millis(if opts.quick { 400 } else { 1500 });
    let mut probes = Vec::new();
    let idle = probe(&mm, probe_dur, |_| {})?;
    probes.push(("idle".to_string(), idle));
    for &threads in &thread_counts {
        let plan = CopyPlan {
            method: CopyMethod::Chunked,
            threads,
            chunk: base.experiment.migrate_chunk,
        };
        let lat = probe(&mm, probe_dur, |stop| {
            let mut to = 1;
            while !stop.load(Ordering::Relaxed) {
                for off in (0..r.len()).step_by(HUGE) {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let _ = r.migrate_with(off..off + HUGE, to, plan);
                }
                to = 1 - to;
            }
        })?;
        probes.push((format!("migrating, {threads} copy threads"), lat));
    }
    r.migrate_with(
        0..r.len(),
        0,
        CopyPlan {
            threads: 1,
            ..mm_plan(&base)
        },
    )?;
    for (what, mut lat) in probes {
        let s = Summary::of(&mut lat);
        report.rows.push(
            json!({"probe": what, "fault_us_p50": s.median, "fault_us_p90": s.p90,
            "fault_us_p99": s.p99, "fault_us_max": s.max, "faults": s.n}),
        );
        report.notes.push(format!(
            "4 KiB fault latency, {what}: p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us (n={})",
            s.median, s.p90, s.p99, s.max, s.n
        ));
    }
    let st = mm.stats();
    report.notes.push(format!(
        "us_per_2mib: whole migration (move out, copy, move in, free) per 2 MiB, median (p10..p90); gb_per_s from it; \
         copy_gb_per_s: the copy alone; vs_memcpy: gb_per_s over the memcpy row with the most threads up to this row's (memcpy runs on at most the CPUs). \
         {} copy chunks were taken by idle workers.",
        st.copy_chunks_helped
    ));
    Ok(report)
}

fn mm_plan(c: &Config) -> CopyPlan {
    CopyPlan {
        method: c.experiment.migrate_copy,
        threads: c.experiment.migrate_threads,
        chunk: c.experiment.migrate_chunk,
    }
}
