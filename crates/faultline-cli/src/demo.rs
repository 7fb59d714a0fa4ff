//! `faultline demo`: faultline's main job on built-in defaults. Maps regions
//! larger than what it touches, touches them from 2 threads (writing a
//! pattern, then reading it back to check); then runs an out-of-core job: a
//! dataset 4x the budget under random reads and writes, every written page
//! verified after evictions; prints throughput and stats. The dataset is a
//! file (`--store file`, the default) or pages in Redis (`--store
//! redis://host:port/`, or a Redis Cluster's node URLs comma-separated).

use crate::bench::{progress, rng};
use anyhow::bail;
use faultline::store::{File, FileOptions, Redis, RedisCluster, RedisOptions, Zero};
use faultline::{Manager, MapOptions, PageSize, Store};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, clap::Args)]
pub struct DemoOpts {
    /// Frame budget in MiB.
    #[arg(long, default_value_t = 256)]
    pub budget_mib: usize,
    /// Application threads touching the regions.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Seconds of the out-of-core workload.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Where the out-of-core job's dataset lives: `file` (a file under
    /// /var/tmp, or $FAULTLINE_DEMO_DIR), `redis://host:port/` (one Redis
    /// server), or several `redis://` URLs comma-separated (a Redis
    /// Cluster's nodes).
    #[arg(long, default_value = "file")]
    pub store: String,
    /// Where to draw the out-of-core job's ops/s over time (default:
    /// `/tmp/faultline-demo-<pid>.png`).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

/// Rounds of the 2 MiB first-touch phase.
const HUGE_ROUNDS: usize = 5;

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
    for &p in &order {
        let got = region.load_u64(p * ps)?;
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
    println!(
        "live statistics meanwhile: faultline stat {} 1",
        std::process::id()
    );
    // 2 MiB pages: a region 4x the budget; touch half the budget's worth.
    let huge = mm.map(
        4 * budget,
        Zero,
        MapOptions::new().page_size(PageSize::Huge2M),
    )?;
    // Five rounds (the pages given back between them, untimed): one round
    // of 64 pages lasts tens of ms, and its rate swung 4-23 GB/s run to run.
    let n = budget / 2 / PageSize::Huge2M.bytes();
    let mut rates = Vec::new();
    for round in 0..HUGE_ROUNDS {
        if round > 0 {
            huge.discard(0..huge.len(), faultline::Discard::KeepStore)?;
        }
        let secs = touch_region(&huge, n, opts.threads, "2 MiB pages")?;
        rates.push((n * PageSize::Huge2M.bytes()) as f64 / secs / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "2 MiB pages: region {} MiB, {} random pages ({} MiB) touched {HUGE_ROUNDS} times: first touch {:.2} GB/s \
         (median of the rounds; {:.2}-{:.2}), {:.0} faults/s",
        huge.len() >> 20,
        n,
        n * 2,
        rates[rates.len() / 2],
        rates[0],
        rates[rates.len() - 1],
        rates[rates.len() / 2] * 1e9 / PageSize::Huge2M.bytes() as f64
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
    println!("all touched pages verified.");
    drop(huge);
    drop(small);
    let timeline = out_of_core(&mm, budget, opts)?;
    println!(
        "\nTotals of the whole run (both touch phases, the out-of-core job and its flush), \
         read after every region was unmapped, so no memory is in use:\n{}",
        mm.stats()
    );
    if let Some(e) = mm.take_error() {
        bail!("a fault went wrong: {e}");
    }
    let plot = opts.plot.clone().unwrap_or_else(|| {
        std::path::PathBuf::from(format!("/tmp/faultline-demo-{}.png", std::process::id()))
    });
    let rows: Vec<serde_json::Value> = timeline
        .iter()
        .map(|(t, r)| serde_json::json!({"phase": "out-of-core (random 4 KiB, 25% writes)", "t_s": t, "ops_per_s": r}))
        .collect();
    let report =
        serde_json::json!({"bench": "demo", "machine": crate::report::machine(), "rows": rows});
    match crate::plot::draw(&report, &plot) {
        Ok(()) => println!(
            "\nplot of the out-of-core run (ops/s over time): {}",
            plot.display()
        ),
        Err(e) => println!("\n(no plot of the run: {e})"),
    }
    println!(
        "to watch a running program's managers live: faultline stat [<pid>] [interval] [count] (--json, --prometheus)"
    );
    Ok(())
}

/// Removes the dataset at `path` (hundreds of MiB) if the demo is
/// interrupted (SIGINT, SIGTERM, SIGHUP) before it removes it itself; the
/// process then exits 130, as after Ctrl-C. Best effort: a handler that
/// cannot be installed leaves the dataset to be removed at the normal end.
fn remove_on_interrupt(path: std::path::PathBuf) {
    let set = ctrlc::set_handler(move || {
        let _ = std::fs::remove_file(&path);
        eprintln!("\ninterrupted: removed the dataset {}", path.display());
        std::process::exit(130);
    });
    if let Err(e) = set {
        eprintln!("the dataset is not removed if the demo is interrupted: {e}");
    }
}

/// The out-of-core job: a dataset file 4x the budget, random 4 KiB reads and
/// writes from the app threads for a few seconds, then every written page
/// checked (through evictions and write-backs) and the file flushed.
/// Returns the ops/s over time (seconds since the start, rate over the last
/// quarter second).
fn out_of_core(mm: &Manager, budget: usize, opts: &DemoOpts) -> anyhow::Result<Vec<(f64, f64)>> {
    // A quarter of the budget (set_budget gives the rest back to the
    // kernel), so that the few seconds of the job cycle the budget many
    // times: at the full budget, 5 s of random 4 KiB operations touched
    // less than the budget holds and nothing was ever evicted.
    let budget = (budget / 4).max(8 << 20) / (2 << 20) * (2 << 20);
    mm.set_budget(budget)?;
    let len = 4 * budget;
    let (store, path) = dataset(&opts.store, len)?;
    let result = (|| -> anyhow::Result<Vec<(f64, f64)>> {
        let region = mm.map_shared(len, store, MapOptions::new())?;
        let pages = len / 4096;
        let base = region.addr();
        let secs = opts.seconds;
        let bar = indicatif::ProgressBar::new((secs * 10.0) as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:40}] {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix("out-of-core");
        let before = mm.stats();
        let done = std::sync::atomic::AtomicU64::new(0);
        let done = &done;
        let mut timeline = Vec::new();
        let t = Instant::now();
        let (ops, written): (u64, Vec<Vec<usize>>) = std::thread::scope(|s| {
            let hs: Vec<_> = (0..opts.threads)
                .map(|th| {
                    s.spawn(move || {
                        let mut next = rng(40 + th as u64);
                        let mut mine = Vec::new();
                        let mut ops = 0u64;
                        while t.elapsed().as_secs_f64() < secs {
                            for _ in 0..64 {
                                // Thread th owns pages p with p % threads == th.
                                let p =
                                    (next() as usize % (pages / opts.threads)) * opts.threads + th;
                                let a = (base + p * 4096) as *mut u64;
                                if next() % 4 == 0 {
                                    // SAFETY: inside the region; only thread th writes page p.
                                    unsafe { a.write_volatile(stamp(p)) };
                                    mine.push(p);
                                } else {
                                    // SAFETY: inside the region; page p is this
                                    // thread's, so no other thread writes it.
                                    let v = unsafe { a.read_volatile() };
                                    std::hint::black_box(v);
                                }
                                ops += 1;
                            }
                            done.fetch_add(64, std::sync::atomic::Ordering::Relaxed);
                        }
                        (ops, mine)
                    })
                })
                .collect();
            let mut last = 0;
            let mut sampled = (0.0, 0u64);
            while hs.iter().any(|h| !h.is_finished()) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let (at, n) = (
                    t.elapsed().as_secs_f64(),
                    done.load(std::sync::atomic::Ordering::Relaxed),
                );
                if at - sampled.0 >= 0.25 {
                    timeline.push((at, (n - sampled.1) as f64 / (at - sampled.0)));
                    sampled = (at, n);
                }
                let now = (t.elapsed().as_secs_f64() * 10.0) as u64;
                bar.inc(now.saturating_sub(last));
                bar.set_message(format!(
                    "{:.1} of {secs:.1} s, {:.0} ops/s",
                    at,
                    timeline.last().map_or(0.0, |x| x.1)
                ));
                last = now;
            }
            let mut total = 0;
            let mut all = Vec::new();
            for h in hs {
                let (o, w) = h
                    .join()
                    .map_err(|_| anyhow::anyhow!("a demo thread panicked"))?;
                total += o;
                all.push(w);
            }
            Ok::<_, anyhow::Error>((total, all))
        })?;
        let elapsed = t.elapsed().as_secs_f64();
        bar.finish_and_clear();
        let after = mm.stats();
        for p in written.iter().flatten() {
            let got = region.load_u64(p * 4096)?;
            if got != stamp(*p) {
                bail!("page {p} of the dataset lost its data: {got:#x}");
            }
        }
        region.flush()?;
        if path.is_none() {
            // The demo's own prefix: leave nothing behind in Redis.
            region.discard(0..len, faultline::Discard::Zero)?;
        }
        println!(
            "out-of-core: dataset {} MiB ({}) through a {} MiB budget (set_budget: a quarter of the demo's), {} threads, \
             {:.1} s: {:.0} ops/s (4 KiB, 25% writes); in those seconds {} faults, {} evictions, {} write-backs \
             ({} evicted pages were clean, not written); fault locks taken {} times, {} waited ({:.0} ms in all); {} faults \
             served by spare servers; resident at the end {} MiB; every written page verified, then flushed",
            len >> 20,
            opts.store,
            budget >> 20,
            opts.threads,
            elapsed,
            ops as f64 / elapsed,
            after.faults() - before.faults(),
            after.evicted - before.evicted,
            after.written_back - before.written_back,
            after.clean_skipped - before.clean_skipped,
            after.locks.acquisitions - before.locks.acquisitions,
            after.locks.contentions - before.locks.contentions,
            (after.locks.wait_ns - before.locks.wait_ns) as f64 / 1e6,
            after.spare_serves - before.spare_serves,
            ((after.frames_total - after.frames_free) * 4096) >> 20,
        );
        Ok(timeline)
    })();
    if let Some(path) = path {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// The out-of-core job's store: a file of `len` zero bytes (and its path,
/// to remove), or Redis under a prefix of this process's own.
fn dataset(
    store: &str,
    len: usize,
) -> anyhow::Result<(Arc<dyn Store>, Option<std::path::PathBuf>)> {
    if store.starts_with("redis://") {
        let opts = RedisOptions::new(format!("faultline-demo-{}", std::process::id()));
        let nodes: Vec<&str> = store.split(',').map(str::trim).collect();
        let s: Arc<dyn Store> = match nodes.as_slice() {
            [one] => Arc::new(Redis::connect(one, opts)?),
            many => Arc::new(RedisCluster::connect(many, opts)?),
        };
        return Ok((s, None));
    }
    if store != "file" {
        bail!("--store is `file` or redis:// URL(s), not {store:?}");
    }
    let dir = std::env::var_os("FAULTLINE_DEMO_DIR")
        .map_or_else(|| std::path::PathBuf::from("/var/tmp"), Into::into);
    let path = dir.join(format!("faultline-demo-{}.dat", std::process::id()));
    remove_on_interrupt(path.clone());
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..len >> 20 {
            std::io::Write::write_all(&mut f, &chunk)?;
        }
        std::io::Write::flush(&mut f)?;
    }
    let file = File::open(&path, FileOptions::new().writable(true))?;
    Ok((Arc::new(file), Some(path)))
}
