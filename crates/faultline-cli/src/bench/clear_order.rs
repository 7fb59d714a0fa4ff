//! `faultline bench clear-order`: vm-scalability's anon-w-seq (seed 000) on
//! faultline. W writers each stream 8-byte writes, one per cache line, from
//! the beginning to the end of their own region of 2 MiB pages faulted on
//! demand; GB/s of the whole run, for each fill order of a 2 MiB frame, for
//! pre-zeroed frames, and for the kernel's own THP first touch (`kernel`: the
//! same writers on plain `MADV_HUGEPAGE` memory, warmed once so the host has
//! backed it). Writers 1, 2, 4, ... up to twice the CPUs (`--cpus`), each
//! with a fault worker of its own (workers = writers, as in
//! `parallel-fault`: the experiment is the fill, not the queue); and one
//! writer with a cache-pressure thread streaming over 64 MiB.
//!
//! Besides throughput, for each order: cycles per cache line to read the
//! faulting 4 KiB sub-page right after the fault returns (the fault is a
//! write at a random offset), which says whether the fill left the target
//! hot in cache.
//!
//! Frames are dirtied by an untimed round first, so every non-pre-zeroed
//! fault clears its frame.

use super::{progress, rng, BenchOpts};
use crate::report::{Report, Summary};
use faultline::store::Zero;
use faultline::{Config, FillOrder, Manager, ManagerBuilder, MapOptions, PageSize};
use faultline_sys::host;
use faultline_sys::mem::{Advice, Mapping};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

const HUGE: usize = 2 << 20;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Order(FillOrder),
    Prezeroed,
    Kernel,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Order(o) => o.name(),
            Variant::Prezeroed => "prezeroed",
            Variant::Kernel => "kernel",
        }
    }
}

/// Streams writes over `[addr, addr + len)`, one per cache line.
fn stream(addr: usize, len: usize) {
    for off in (0..len).step_by(64) {
        // SAFETY: inside a live mapping or region owned by the caller, which
        // nobody else references.
        unsafe { ((addr + off) as *mut u64).write_volatile(off as u64 | 1) };
    }
}

/// A thread that streams over 64 MiB until `stop`, evicting others' lines.
fn pressure(stop: &AtomicBool) {
    let mut buf = vec![0u64; (64 << 20) / 8];
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        for w in buf.iter_mut().step_by(8) {
            *w = w.wrapping_add(i as u64);
        }
        i += 1;
    }
    std::hint::black_box(&buf);
}

fn manager_for(
    v: Variant,
    budget: usize,
    writers: usize,
    base: &Config,
) -> anyhow::Result<Manager> {
    let mut config = base.clone();
    config.budget = budget;
    config.workers = config.workers.max(writers);
    config.experiment.fill_order = match v {
        Variant::Order(o) => o,
        _ => FillOrder::Sequential,
    };
    config.prezero = v == Variant::Prezeroed;
    Ok(ManagerBuilder::from_config(config).build()?)
}

/// One run: W writers, `pages` 2 MiB pages each; returns GB/s.
fn run_once(
    v: Variant,
    mm: Option<&Manager>,
    writers: usize,
    pages: usize,
    with_pressure: bool,
) -> anyhow::Result<f64> {
    let len = pages * HUGE;
    // Set up the writers' memory first (not timed).
    let mut kernel_maps = Vec::new();
    let mut regions = Vec::new();
    for _ in 0..writers {
        match (v, mm) {
            (Variant::Kernel, _) | (_, None) => {
                let m = Mapping::anonymous(len, HUGE)?;
                m.advise(m.addr(), len, Advice::HugePage)?;
                m.advise(m.addr(), len, Advice::PopulateWrite)?;
                // SAFETY: our own fresh mapping; nothing references it.
                unsafe { m.discard(m.addr(), len)? };
                kernel_maps.push(m);
            }
            (_, Some(mm)) => {
                regions.push(mm.map(len, Zero, MapOptions::new().page_size(PageSize::Huge2M))?)
            }
        }
    }
    let addrs: Vec<usize> = kernel_maps
        .iter()
        .map(Mapping::addr)
        .chain(regions.iter().map(|r| r.addr()))
        .collect();
    let stop = AtomicBool::new(false);
    let secs = std::thread::scope(|s| {
        if with_pressure {
            s.spawn(|| pressure(&stop));
        }
        let t = Instant::now();
        let hs: Vec<_> = addrs
            .iter()
            .map(|&a| s.spawn(move || stream(a, len)))
            .collect();
        for h in hs {
            let _ = h.join();
        }
        let secs = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        secs
    });
    Ok((writers * len) as f64 / secs / 1e9)
}

/// Cycles per line to read the faulting sub-page right after a write fault
/// at a random offset; median over `pages` faults.
fn target_heat(mm: &Manager, pages: usize) -> anyhow::Result<f64> {
    let r = mm.map(
        pages * HUGE,
        Zero,
        MapOptions::new().page_size(PageSize::Huge2M),
    )?;
    let mut next = rng(11);
    let mut per_line = Vec::with_capacity(pages);
    for p in 0..pages {
        let sub = (next() as usize % 512) * 4096;
        let base = r.addr() + p * HUGE + sub;
        // SAFETY: inside the region, which only this thread touches.
        unsafe { (base as *mut u8).write_volatile(1) };
        let c0 = host::cycles();
        let mut sum = 0u64;
        for line in 1..64 {
            // SAFETY: inside the region (same 4 KiB sub-page).
            sum = sum.wrapping_add(unsafe { ((base + line * 64) as *const u64).read_volatile() });
        }
        let c1 = host::cycles();
        std::hint::black_box(sum);
        per_line.push((c1 - c0) as f64 / 63.0);
    }
    Ok(Summary::of(&mut per_line).median)
}

pub fn run(opts: &BenchOpts) -> anyhow::Result<Report> {
    let (pages, reps) = if opts.quick { (24, 3) } else { (64, 5) };
    let base = opts.config();
    let variants = [
        Variant::Order(FillOrder::Sequential),
        Variant::Order(FillOrder::TargetLast),
        Variant::Order(FillOrder::NeighbourhoodLast),
        Variant::Prezeroed,
        Variant::Kernel,
    ];
    let mut report = Report::new(
        "clear-order",
        vec![
            "order",
            "writers",
            "pressure",
            "gb_per_s",
            "spread",
            "vs_kernel",
            "target_cycles_per_line",
        ],
    );
    report.config = json!({"pages_per_writer": pages, "repetitions": reps, "page": "2m",
        "workers": "at least the writers",
        "neighbourhood_subpages": faultline::internals::NEIGHBOURHOOD});
    let mut cases: Vec<(usize, bool)> = super::thread_sweep(base.cpus)
        .into_iter()
        .map(|w| (w, false))
        .collect();
    cases.push((1, true));
    let bar = progress((cases.len() * variants.len() * reps) as u64, "clear-order");
    for &(writers, with_pressure) in &cases {
        let mut kernel_gbps = f64::NAN;
        let mut rows = Vec::new();
        for &v in &variants {
            // Budget: the writers' pages, plus room for the pre-zeroed reserve.
            let budget = (writers * pages + 32) * HUGE;
            let mm = if v == Variant::Kernel {
                None
            } else {
                Some(manager_for(v, budget, writers, &base)?)
            };
            if let Some(mm) = &mm {
                // Dirty every frame once (untimed).
                run_once(v, Some(mm), writers, pages, false)?;
            }
            let mut gbps = Vec::new();
            for _ in 0..reps {
                if v == Variant::Prezeroed {
                    // Let the zeroing worker fill its reserve between runs,
                    // as it would between bursts of faults.
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                gbps.push(run_once(v, mm.as_ref(), writers, pages, with_pressure)?);
                bar.inc(1);
            }
            let s = Summary::of(&mut gbps);
            if v == Variant::Kernel {
                kernel_gbps = s.median;
            }
            let heat = match (&mm, writers, with_pressure) {
                (Some(mm), 1, false) => Some(target_heat(mm, pages)?),
                _ => None,
            };
            rows.push((v, s, heat));
        }
        for (v, s, heat) in rows {
            let ratio = s.median / kernel_gbps;
            report.rows.push(
                json!({"order": v.name(), "writers": writers, "pressure": with_pressure,
                "gb_per_s": s.median, "gb_per_s_min": s.min, "gb_per_s_max": s.max,
                "vs_kernel": ratio, "target_cycles_per_line": heat}),
            );
            report.table.push(vec![
                v.name().into(),
                writers.to_string(),
                if with_pressure { "on" } else { "off" }.into(),
                format!("{:.2}", s.median),
                format!("{:.2}..{:.2}", s.min, s.max),
                format!("{ratio:.2}x"),
                heat.map_or("-".into(), |h| format!("{h:.0}")),
            ]);
        }
    }
    bar.finish_and_clear();
    report.notes.push(format!(
        "{pages} x 2 MiB pages per writer; vs_kernel: GB/s over the kernel's THP first touch in the same case. \
         target_cycles_per_line: TSC cycles per line reading the faulting 4 KiB sub-page right after the fault (1 writer, no pressure)."
    ));
    Ok(report)
}
