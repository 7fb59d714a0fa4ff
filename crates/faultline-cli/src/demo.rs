//! `faultline demo`: faultline's main job on built-in defaults. Maps regions
//! larger than what it touches, touches them from 2 threads (writing a
//! pattern, then reading it back to check), and prints throughput and stats.

use crate::bench::{progress, rng};
use anyhow::{bail, Context};
use faultline::store::Zero;
use faultline::{Manager, MapOptions, PageSize};
use std::time::Instant;

#[derive(Debug, Clone, clap::Args)]
pub struct DemoOpts {
    /// Frame budget in MiB.
    #[arg(long, default_value_t = 256)]
    pub budget_mib: usize,
    /// Application threads touching the regions.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

fn stamp(page: usize) -> u64 {
    (page as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// Touches `pages` distinct random pages of `region` from `threads`
/// threads, each writing a stamp; returns the seconds it took.
fn touch_region(
    region: &faultline::Region,
    pages: usize,
    threads: usize,
    what: &str,
) -> anyhow::Result<f64> {
    let ps = region.page_size().bytes();
    let total = region.len() / ps;
    let mut next = rng(7);
    let mut order: Vec<usize> = (0..total).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, next() as usize % (i + 1));
    }
    order.truncate(pages);
    let bar = progress(pages as u64, what);
    let base = region.addr();
    let t = Instant::now();
    std::thread::scope(|s| {
        for chunk in order.chunks(pages.div_ceil(threads)) {
            let bar = &bar;
            s.spawn(move || {
                for (i, &p) in chunk.iter().enumerate() {
                    // SAFETY: page p lies inside the region, which outlives
                    // this scope; each page belongs to one thread's chunk.
                    unsafe { ((base + p * ps) as *mut u64).write_volatile(stamp(p)) };
                    if i % 64 == 63 {
                        bar.inc(64);
                    }
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let bytes = region.as_slice();
    for &p in &order {
        let got = u64::from_ne_bytes(bytes[p * ps..p * ps + 8].try_into().context("8 bytes")?);
        if got != stamp(p) {
            bail!("page {p} of the {what} region lost its data: {got:#x}");
        }
    }
    Ok(secs)
}

pub fn run(opts: &DemoOpts) -> anyhow::Result<()> {
    let budget = opts.budget_mib << 20;
    let mm = Manager::builder().budget(budget).build()?;
    println!(
        "faultline demo: budget {} MiB, {} workers, {} app threads, kernel {}",
        opts.budget_mib,
        mm.config().workers,
        opts.threads,
        faultline_sys::host::kernel_release()
    );
    // 2 MiB pages: a region 4x the budget; touch half the budget's worth.
    let huge = mm.map(
        4 * budget,
        Zero,
        MapOptions::new().page_size(PageSize::Huge2M),
    )?;
    let n = budget / 2 / PageSize::Huge2M.bytes();
    let secs = touch_region(&huge, n, opts.threads, "2 MiB pages")?;
    println!(
        "2 MiB pages: region {} MiB, touched {} pages ({} MiB) in {:.3} s: {:.0} faults/s, {:.2} GB/s of first touch",
        huge.len() >> 20,
        n,
        n * 2,
        secs,
        n as f64 / secs,
        (n * PageSize::Huge2M.bytes()) as f64 / secs / 1e9
    );
    // 4 KiB pages: a region 4x the budget; touch a quarter of the budget.
    let small = mm.map(4 * budget, Zero, MapOptions::new())?;
    let n = budget / 4 / 4096;
    let secs = touch_region(&small, n, opts.threads, "4 KiB pages")?;
    println!(
        "4 KiB pages: region {} MiB, touched {} random pages ({} MiB) in {:.3} s: {:.0} faults/s",
        small.len() >> 20,
        n,
        (n * 4096) >> 20,
        secs,
        n as f64 / secs
    );
    println!("all touched pages verified.\n{}", mm.stats());
    if let Some(e) = mm.take_error() {
        bail!("a fault went wrong: {e}");
    }
    Ok(())
}
