//! `faultline bench fault`: the first-touch cost of one page, the kernel's own
//! anonymous fault against faultline's, side by side in one run.
//!
//! For each page size (4 KiB, 2 MiB) and access (write, read), rounds
//! alternate between the kernel and faultline. Each round maps a fresh range
//! and touches pages in a random order, one touch timed at a time:
//! - kernel: an anonymous mapping (`MADV_HUGEPAGE` for 2 MiB, so the kernel
//!   clears a THP; `MADV_NOHUGEPAGE` for 4 KiB), populated and dropped once
//!   before the round so the host has backed it (first touch of guest memory
//!   is slow on this VM, and that is not what is measured);
//! - faultline: a region on a manager whose pool was dirtied by an untimed
//!   warm-up round, so every fault clears its frame (the steady state; the
//!   pre-zeroed case is the clear-order benchmark's). Twice: a manager whose
//!   workers serve the faults (`mode` `workers`, the default), and one whose
//!   faulting threads serve their own in the SIGBUS handler (`in-thread`).

use super::{progress, rng, BenchOpts};
use crate::report::{Report, Summary};
use faultline::store::Zero;
use faultline::{FaultMode, Manager, ManagerBuilder, MapOptions, PageSize};
use faultline_sys::mem::{Advice, Mapping};
use serde_json::json;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Write,
    Read,
}

impl Access {
    fn name(self) -> &'static str {
        match self {
            Access::Write => "write",
            Access::Read => "read",
        }
    }
}

/// Touches one byte at `addr` and returns the time it took, in µs.
fn touch(addr: usize, access: Access) -> f64 {
    let p = addr as *mut u8;
    let t = Instant::now();
    match access {
        // SAFETY: `addr` lies in a live read-write mapping owned by the caller
        // (a kernel mapping or a faultline region), and no reference to it
        // exists.
        Access::Write => unsafe { p.write_volatile(1) },
        // SAFETY: as above.
        Access::Read => unsafe {
            p.read_volatile();
        },
    }
    t.elapsed().as_secs_f64() * 1e6
}

/// Page indices `0..pages` in a random order, `count` of them.
fn order(pages: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut next = rng(seed);
    let mut v: Vec<usize> = (0..pages).collect();
    for i in (1..v.len()).rev() {
        v.swap(i, next() as usize % (i + 1));
    }
    v.truncate(count);
    v
}

fn kernel_round(
    page: PageSize,
    access: Access,
    pages: usize,
    idx: &[usize],
    out: &mut Vec<f64>,
) -> anyhow::Result<()> {
    let ps = page.bytes();
    let m = Mapping::anonymous(pages * ps, ps)?;
    let advice = if page == PageSize::Huge2M {
        Advice::HugePage
    } else {
        Advice::NoHugePage
    };
    m.advise(m.addr(), m.len(), advice)?;
    m.advise(m.addr(), m.len(), Advice::PopulateWrite)?;
    // SAFETY: our own fresh mapping; nothing references it.
    unsafe { m.discard(m.addr(), m.len())? };
    for &p in idx {
        out.push(touch(m.addr() + p * ps + 7 * 64, access));
    }
    Ok(())
}

fn faultline_round(
    mm: &Manager,
    page: PageSize,
    access: Access,
    pages: usize,
    idx: &[usize],
    out: Option<&mut Vec<f64>>,
) -> anyhow::Result<()> {
    let ps = page.bytes();
    let r = mm.map(pages * ps, Zero, MapOptions::new().page_size(page))?;
    let mut local = Vec::with_capacity(idx.len());
    for &p in idx {
        local.push(touch(r.addr() + p * ps + 7 * 64, access));
    }
    if let Some(out) = out {
        out.extend(local);
    }
    Ok(())
}

pub fn run(opts: &BenchOpts) -> anyhow::Result<Report> {
    let (n2m, n4k, rounds) = if opts.quick {
        (32, 1024, 3)
    } else {
        (96, 4096, 7)
    };
    let span4k = 16 * n4k; // the 4 KiB region is 16x larger than what is touched
    let budget = (n2m * PageSize::Huge2M.bytes())
        .max(n4k * 4096)
        .next_multiple_of(2 << 20);
    let mut config = opts.config();
    config.budget = budget;
    let mm = ManagerBuilder::from_config(config.clone()).build()?;
    let mut in_thread = config.clone();
    in_thread.fault_mode = FaultMode::InThread;
    let mm_in = ManagerBuilder::from_config(in_thread).build()?;
    let mut report = Report::new(
        "fault",
        vec![
            "system",
            "mode",
            "page",
            "access",
            "touches",
            "median_us",
            "p10_us",
            "p90_us",
            "p99_us",
            "vs_kernel",
        ],
    );
    report.config = json!({"workers": config.workers, "pin_workers": config.pin_workers,
        "rounds": rounds, "touches_2m": n2m, "touches_4k": n4k, "budget": budget});
    let cases = [
        (PageSize::Base4K, Access::Write),
        (PageSize::Base4K, Access::Read),
        (PageSize::Huge2M, Access::Write),
        (PageSize::Huge2M, Access::Read),
    ];
    let bar = progress((cases.len() * (rounds + 1)) as u64, "fault");
    for (ci, &(page, access)) in cases.iter().enumerate() {
        let (pages, count) = match page {
            PageSize::Base4K => (span4k, n4k),
            PageSize::Huge2M => (n2m, n2m),
        };
        // Warm-up: dirties the pool's frames so every timed fault clears one.
        for m in [&mm, &mm_in] {
            faultline_round(m, page, access, pages, &order(pages, count, 99), None)?;
        }
        bar.inc(1);
        let (mut k, mut f, mut fi) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let idx = order(pages, count, (ci * 1000 + round) as u64 + 1);
            kernel_round(page, access, pages, &idx, &mut k)?;
            faultline_round(&mm, page, access, pages, &idx, Some(&mut f))?;
            faultline_round(&mm_in, page, access, pages, &idx, Some(&mut fi))?;
            bar.inc(1);
        }
        let ks = Summary::of(&mut k);
        let rows = [
            ("kernel", "-", ks),
            ("faultline", "workers", Summary::of(&mut f)),
            ("faultline", "in-thread", Summary::of(&mut fi)),
        ];
        for (system, mode, s) in rows {
            let ratio = s.median / ks.median;
            report.rows.push(json!({
                "system": system, "mode": mode, "page": page.name(), "access": access.name(),
                "median_us": s.median, "p99_us": s.p99, "p10_us": s.p10, "p90_us": s.p90,
                "touches": s.n, "vs_kernel": ratio,
            }));
            report.table.push(vec![
                system.into(),
                mode.into(),
                page.name().into(),
                access.name().into(),
                s.n.to_string(),
                format!("{:.1}", s.median),
                format!("{:.1}", s.p10),
                format!("{:.1}", s.p90),
                format!("{:.1}", s.p99),
                format!("{ratio:.2}x"),
            ]);
        }
    }
    bar.finish_and_clear();
    let st = mm.stats();
    report.notes.push(format!(
        "faultline: {} workers{}, {} faults, {} cleared / {} pre-zeroed fills, worker service p50 {:.1} us p99 {:.1} us",
        config.workers,
        if config.pin_workers { " pinned one per CPU" } else { ", unpinned" },
        st.faults(),
        st.fills_cleared,
        st.fills_prezeroed,
        st.service.p50_ns as f64 / 1e3,
        st.service.p99_ns as f64 / 1e3
    ));
    report.notes.push(
        "vs_kernel: median / the kernel's median for the same page size and access (lower is better). \
         A faultline p10 below the kernel's is a touch that did not fault: fault-around had mapped its page with \
         a neighbour's (4 KiB pages, when a touch lands next to a page already there).".into(),
    );
    Ok(report)
}
