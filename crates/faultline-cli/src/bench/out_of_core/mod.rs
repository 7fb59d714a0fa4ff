//! `faultline bench out-of-core`: a dataset file several times the memory
//! limit, random and sequential 4 KiB reads and writes from 2 threads,
//! faultline (a 4 KiB region over the file, budget = limit x 4/5) against
//! the kernel's own `mmap` of the same file, twice: with no hint, and with
//! the hint a user who knows the pattern gives (`MADV_RANDOM` for the random
//! patterns, `MADV_SEQUENTIAL` for the sequential ones) — each run in a
//! child process inside a memory cgroup (v1 or v2) with the same limit, page cache
//! dropped before every run. faultline runs three ways: direct I/O served
//! by workers (its defaults), buffered I/O served by workers, and direct
//! I/O served in the faulting thread (`io`, `mode`). `vs_kernel` is against
//! the unhinted kernel row, `vs_kernel_best` against the faster kernel row
//! of the same pattern.
//! The device's own limit (`O_DIRECT` reads of the file, see `device`) is
//! measured in the same run.
//!
//! The child (`faultline ooc-child`, hidden; `child`) waits for the parent to move it
//! into the cgroup, runs the pattern, and prints one JSON line: ops/s, the
//! CPU its process used per op over the timed ops, and its peak RSS
//! (`VmHWM`). An op touches 8 bytes of one 4 KiB page: reads sum
//! them, writes store a value. Sequential patterns walk the file from each
//! thread's own start; random ones pick uniformly over the whole file. A run
//! stops after its ops or a time cap, whichever comes first.

mod child;
mod device;

pub(crate) use child::run_args;
pub use child::{child, ChildArgs};

use super::cgroup::{self, drop_caches};
use super::{progress, BenchOpts};
use crate::report::Report;
use anyhow::bail;
use child::SMALL_ZONE_PCT;
use device::DeviceRow;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

pub(crate) fn make_dataset(path: &Path, len: usize) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|i: usize| (i as u8).wrapping_mul(7))
        .collect();
    for _ in 0..len >> 20 {
        f.write_all(&chunk)?;
    }
    f.flush()?;
    Ok(())
}

/// Options of `bench out-of-core`: the common ones and the sizes.
#[derive(Debug, Clone, clap::Args)]
pub struct OocOpts {
    #[command(flatten)]
    pub common: BenchOpts,
    /// Dataset file size in MiB (default: 4x the memory limit, or 5x the
    /// budget when --budget-mib is given).
    #[arg(long)]
    pub data_mib: Option<usize>,
    /// faultline's budget in MiB (default: 4/5 of the memory limit).
    #[arg(long)]
    pub budget_mib: Option<usize>,
    /// The memory cgroup limit of every run, kernel and faultline alike, in
    /// MiB (default: 64 with --quick, 256 without; with --budget-mib,
    /// budget x 9/8 — faultline's page tables and page states are paid
    /// from its budget, up to a quarter of it — plus what of them is
    /// beyond that quarter: at most 1/512 of the data for page tables and
    /// 1/1024 for page states).
    #[arg(long)]
    pub memory_mib: Option<usize>,
    /// Program threads of every row (and the random device row's queue
    /// depth).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Run only this pattern (repeat the option for several; default:
    /// all four).
    #[arg(long = "pattern", value_parser = PATTERNS)]
    pub patterns: Vec<String>,
}

/// The patterns the bench runs, in order.
const PATTERNS: [&str; 4] = ["random-read", "random-write", "seq-read", "seq-write"];

/// The patterns `--pattern` names, in the bench's order (each once), or
/// all of them.
fn patterns_to_run(o: &OocOpts) -> Vec<&'static str> {
    PATTERNS
        .into_iter()
        .filter(|p| o.patterns.is_empty() || o.patterns.iter().any(|o| o == p))
        .collect()
}

/// The memory limit, faultline's budget and the dataset size, in bytes.
fn sizes(o: &OocOpts, default_limit: usize) -> anyhow::Result<(usize, usize, usize)> {
    let mib = |v: Option<usize>, what: &str| match v {
        Some(0) => bail!("--{what} must be at least 1"),
        v => Ok(v.map(|m| m << 20)),
    };
    let (data, budget, memory) = (
        mib(o.data_mib, "data-mib")?,
        mib(o.budget_mib, "budget-mib")?,
        mib(o.memory_mib, "memory-mib")?,
    );
    let (limit, budget, len) = match budget.map(|b| b.next_multiple_of(2 << 20)) {
        Some(budget) => {
            let len = data.unwrap_or(5 * budget);
            let limit = budget / 8 * 9 + unpaid(budget, len);
            (
                memory.unwrap_or(limit.next_multiple_of(1 << 20)),
                budget,
                len,
            )
        }
        None => {
            let limit = memory.unwrap_or(default_limit);
            let budget = (limit * 4 / 5).next_multiple_of(2 << 20);
            (limit, budget, data.unwrap_or(limit * 4))
        }
    };
    if budget + unpaid(budget, len) > limit {
        bail!(
            "a {} MiB limit leaves faultline (budget {} MiB) no room for the page tables and page states of a {} MiB file: \
             raise --memory-mib or lower --budget-mib",
            limit >> 20,
            budget >> 20,
            len >> 20
        );
    }
    Ok((limit, budget, len))
}

/// faultline's own memory beyond what its budget pays for
/// (`Config::budget_counts_overhead`: up to a quarter of the budget), at
/// most: a 4 KiB page table and a 2 KiB page-state leaf per 2 MiB of data
/// (all touched).
fn unpaid(budget: usize, len: usize) -> usize {
    (len / 512 + len / 1024).saturating_sub(budget / 4)
}

/// The sizes and caps of one bench run, and the dataset file.
struct Setup {
    file: PathBuf,
    len: usize,
    limit: usize,
    budget: usize,
    ops: usize,
    secs: f64,
    threads: usize,
    /// faultline's servers and CPUs, as the command line set them
    /// (`BenchOpts::child_args`).
    servers: Vec<String>,
}

impl Setup {
    fn new(o: &OocOpts) -> anyhow::Result<Setup> {
        let (limit, ops, secs) = if o.common.quick {
            (64usize << 20, 20_000, 3.0)
        } else {
            (256 << 20, 100_000, 20.0)
        };
        let (limit, budget, len) = sizes(o, limit)?;
        let dir = std::env::var_os("FAULTLINE_BENCH_DIR")
            .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
        let file = dir.join(format!("faultline-ooc-{}.dat", std::process::id()));
        Ok(Setup {
            file,
            len,
            limit,
            budget,
            ops,
            secs,
            threads: o.threads.max(1),
            servers: o.common.child_args(),
        })
    }

    /// Runs one side in a child inside a fresh cgroup: its JSON line.
    fn run_child(&self, m: &Side, pattern: &str) -> anyhow::Result<serde_json::Value> {
        let file = self.file.display().to_string();
        let run = run_args(
            self.budget,
            self.threads,
            self.ops,
            self.secs,
            &self.servers,
        );
        let mut args = vec![
            "--system",
            m.system,
            "--hint",
            m.hint,
            "--io",
            m.io,
            "--mode",
            m.mode,
            "--file",
            &file,
            "--pattern",
            pattern,
        ];
        args.extend(run.iter().map(String::as_str));
        cgroup::run_child(self.limit, &args)
    }
}

/// One side of a pattern: the kernel's mmap with a hint, or faultline with
/// an I/O mode and a fault mode.
struct Side {
    system: &'static str,
    hint: &'static str,
    io: &'static str,
    mode: &'static str,
}

/// One row: which side, and what it measured (`child`'s JSON line; empty
/// for a child that failed).
struct Measured {
    side: Side,
    ops: f64,
    rss: f64,
    child: serde_json::Value,
}

/// Adds a mmap row; ratios against the unhinted and the best kernel row.
fn push_row(report: &mut Report, s: &Setup, pattern: &str, m: &Measured, k_none: f64, k_best: f64) {
    let (vs, vs_best) = (m.ops / k_none, m.ops / k_best);
    let Side {
        system,
        hint,
        io,
        mode,
    } = m.side;
    let c = &m.child;
    report.rows.push(
        json!({"system": system, "hint": hint, "io": io, "mode": mode, "pattern": pattern,
        "threads": s.threads, "ops_per_s": m.ops, "cpu_us_per_op": c["cpu_us_per_op"],
        "max_rss_mib": m.rss,
        "vs_kernel": vs, "vs_kernel_best": vs_best,
        "fault_p50_us": c["fault_p50_us"], "fault_p99_us": c["fault_p99_us"],
        "fault_mean_us": c["fault_mean_us"], "store_read_p50_us": c["store_read_p50_us"],
        "store_read_p99_us": c["store_read_p99_us"],
        "store_read_mean_us": c["store_read_mean_us"], "reclaim_waits": c["reclaim_waits"],
        "lock_contended_pct": c["lock_contended_pct"], "lock_wait_ms": c["lock_wait_ms"],
        "spare_serves": c["spare_serves"], "flush_ms": c["flush_ms"],
        "poll_windows_pct": c["poll_windows_pct"], "misses_per_op": c["misses_per_op"]}),
    );
    // Fault-lock acquisitions that found the lock held, and the time all
    // waited (faultline rows).
    let locks = match (c["lock_contended_pct"].as_f64(), c["lock_wait_ms"].as_f64()) {
        (Some(pct), Some(ms)) if system == "faultline" => format!("{pct:.1}% {ms:.0} ms"),
        _ => "-".into(),
    };
    report.table.push(vec![
        system.into(),
        hint.into(),
        io.into(),
        mode.into(),
        pattern.into(),
        s.threads.to_string(),
        format!("{:.0}", m.ops),
        cpu_cell(c["cpu_us_per_op"].as_f64()),
        "-".into(),
        format!("{:.0}", m.rss),
        format!("{vs:.2}x"),
        format!("{vs_best:.2}x"),
        locks,
        c["flush_ms"]
            .as_f64()
            .map_or_else(|| "-".into(), |ms| format!("{ms:.0}")),
    ]);
}

/// A row's CPU per op for the table: µs with one decimal, `-` if unknown.
fn cpu_cell(us: Option<f64>) -> String {
    us.map_or_else(|| "-".into(), |us| format!("{us:.1}"))
}

/// Adds a device row (`threads` holds the queue depth).
fn push_device(report: &mut Report, d: &DeviceRow) {
    report.rows.push(
        json!({"system": "device", "hint": "-", "mode": "-", "pattern": d.pattern,
        "io": d.io, "queue_depth": d.queue_depth, "ops_per_s": d.pages_per_s,
        "cpu_us_per_op": d.cpu_us_per_page,
        "mib_per_s": d.mib_per_s}),
    );
    let io = if d.io.contains("polled") {
        "o_direct-polled"
    } else {
        "o_direct"
    };
    report.table.push(vec![
        "device".into(),
        "-".into(),
        io.into(),
        "-".into(),
        d.pattern.into(),
        format!("qd {}", d.queue_depth),
        format!("{:.0}", d.pages_per_s),
        cpu_cell(d.cpu_us_per_page),
        format!("{:.0}", d.mib_per_s),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
    ]);
}

/// The runs of one pattern: kernel unhinted, kernel hinted, faultline with
/// direct I/O (its default: reads polled where the pollers' rules allow,
/// and sleeping in `pread`) and with buffered I/O, served by workers (the
/// default), and with direct I/O served in the faulting thread (polled and
/// sleeping).
fn run_pattern(
    s: &Setup,
    report: &mut Report,
    pattern: &str,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<()> {
    let hint = if pattern.starts_with("random") {
        "random"
    } else {
        "sequential"
    };
    let mut rows = Vec::new();
    for side in sides(hint) {
        let child = match s.run_child(&side, pattern) {
            Ok(v) => v,
            // A faultline side that dies (its cgroup's OOM killer, when
            // its memory outgrows the limit) is a finding: a row of 0 and
            // a note. A kernel side that dies breaks the comparison.
            Err(e) if side.system == "faultline" => {
                report.notes.push(format!(
                    "faultline io {} mode {} {pattern}: the child failed, ops_per_s 0: {e:#}",
                    side.io, side.mode
                ));
                serde_json::Value::Null
            }
            Err(e) => return Err(e),
        };
        bar.inc(1);
        rows.push(Measured {
            side,
            ops: child["ops_per_s"].as_f64().unwrap_or(0.0),
            rss: child["max_rss_mib"].as_f64().unwrap_or(0.0),
            child,
        });
    }
    let k_none = rows[0].ops;
    let k_best = rows[0].ops.max(rows[1].ops);
    for m in &rows {
        push_row(report, s, pattern, m, k_none, k_best);
    }
    Ok(())
}

/// The sides of a pattern whose kernel hint is `hint`; the two kernel rows
/// first.
fn sides(hint: &'static str) -> [Side; 7] {
    let side = |system, hint, io, mode| Side {
        system,
        hint,
        io,
        mode,
    };
    [
        side("kernel", "none", "mmap", "-"),
        side("kernel", hint, "mmap", "-"),
        side("faultline", "-", "direct", "workers"),
        side("faultline", "-", "direct-sleeping", "workers"),
        side("faultline", "-", "buffered", "workers"),
        side("faultline", "-", "direct", "in-thread"),
        side("faultline", "-", "direct-sleeping", "in-thread"),
    ]
}

/// The device rows, or a note saying why there are none.
fn run_device(s: &Setup, report: &mut Report) -> anyhow::Result<()> {
    drop_caches()?;
    match device::measure(&s.file, s.threads, s.ops, s.secs)? {
        Ok(rows) => rows.iter().for_each(|d| push_device(report, d)),
        Err(why) => report.notes.push(why),
    }
    Ok(())
}

pub fn run(opts: &OocOpts) -> anyhow::Result<Report> {
    let s = Setup::new(opts)?;
    make_dataset(&s.file, s.len)?;
    let mut report = Report::new(
        "out-of-core",
        vec![
            "system",
            "hint",
            "io",
            "mode",
            "pattern",
            "threads",
            "ops_per_s",
            "cpu_us_per_op",
            "mib_per_s",
            "max_rss_mib",
            "vs_kernel",
            "vs_kernel_best",
            "lock_waits",
            "flush_ms",
        ],
    );
    report.config = json!({"file_bytes": s.len, "memory_limit_bytes": s.limit,
        "faultline_servers": s.servers.join(" "),
        "faultline_budget": s.budget, "faultline_small_zone_pct": SMALL_ZONE_PCT,
        "ops_per_thread": s.ops, "threads": s.threads, "time_cap_s": s.secs});
    let patterns = patterns_to_run(opts);
    let bar = progress(
        (patterns.len() * sides("random").len()) as u64,
        "out-of-core",
    );
    let result = (|| -> anyhow::Result<()> {
        run_device(&s, &mut report)?;
        for pattern in patterns {
            run_pattern(&s, &mut report, pattern, &bar)?;
        }
        Ok(())
    })();
    bar.finish_and_clear();
    let _ = std::fs::remove_file(&s.file);
    result?;
    notes(&s, &mut report);
    Ok(report)
}

fn notes(s: &Setup, report: &mut Report) {
    report.notes.push(format!(
        "file {} MiB, memory cgroup limit {} MiB for every run ({}; faultline budget {} MiB; its page-cache use counts \
         against the same limit); page cache dropped before each run; {} threads x up to {} ops of 4 KiB, \
         at most {} s a run.",
        s.len >> 20,
        s.limit >> 20,
        cgroup::hierarchy_name(),
        s.budget >> 20,
        s.threads,
        s.ops,
        s.secs
    ));
    report.notes.push(
        "faultline rows: a 4 KiB region over the file, pages moved between file and frames with O_DIRECT \
         (io direct, the default: a thread waiting for a fault's read polls for its completion, \
         FileOptions::poll; io direct-sleeping: it sleeps in pread) or through the page cache (io buffered); faults served by workers (mode workers, \
         the default) or in the faulting thread (mode in-thread). \
         kernel rows: mmap(MAP_SHARED) of the file with no hint, and with the hint a user who knows the pattern \
         gives (madvise MADV_RANDOM for random-*, MADV_SEQUENTIAL for seq-*). vs_kernel = ops/s / the unhinted \
         kernel row's; vs_kernel_best = ops/s / the faster kernel row of the same pattern. lock_waits: faultline's \
         fault-lock acquisitions that found the lock held, and the time all waited for them. \
         poll_windows_pct (JSON, faultline rows whose reads may poll): the share of the run's 200 ms windows in \
         which the pollers' rules let a read poll (none: every read slept, as in io direct-sleeping). \
         fault_mean_us and store_read_p50_us / _p99_us / _mean_us (JSON, faultline rows): a fault's service \
         time beside the store's reads it waited for (one per fill from the store: a page or a run); \
         reclaim_waits: faults that found no frame after four reclaim passes and waited for one. \
         misses_per_op (JSON): the reads of the device per op over the timed ops (faultline: frames filled from \
         the file; kernel: the process's major faults). \
         flush_ms (write rows): after the timed ops, the time until every page they dirtied was on the disk \
         (kernel: msync MS_SYNC of the mapping; faultline: the region's flush, which also fsyncs the file); \
         not in ops_per_s. cpu_us_per_op: the run's CPU time per op, every thread of its process (the \
         program's threads with the kernel's work in their system calls and faults; faultline's workers, \
         reclaimer and helpers; an interrupt counts for the thread it interrupted), measured over the \
         timed ops (CLOCK_PROCESS_CPUTIME_ID); kernel threads such as kswapd are not in it. On a machine whose CPUs the run keeps busy, CPU per op sets the rate as much \
         as the device does."
            .into(),
    );
    if !report.rows.iter().any(|r| r["system"] == "device") {
        return;
    }
    report.notes.push(format!(
        "device rows: O_DIRECT reads of the same file in the same run (no page cache, no cgroup): random 4 KiB \
         reads at queue depth {} (one synchronous thread per slot, up to {} reads each; sleeping in pread, then \
         polled on io_uring as faultline's file store reads), and 1 MiB reads \
         of consecutive chunks at queue depth 4 (one pass at most); ops_per_s in 4 KiB pages, mib_per_s in MiB; \
         at most {} s each; cpu_us_per_op: the bench process's CPU per 4 KiB page read. The upper bound \
         for a pattern's faults that miss memory.",
        s.threads, s.ops, s.secs
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        o: OocOpts,
    }

    fn sizes_of(args: &[&str]) -> anyhow::Result<(usize, usize, usize)> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
        sizes(&cli.o, 64 << 20).map(|(l, b, d)| (l >> 20, b >> 20, d >> 20))
    }

    #[test]
    fn pattern_options_pick_patterns_in_the_bench_order() {
        let picked = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
                .map(|cli| patterns_to_run(&cli.o))
        };
        assert_eq!(picked(&[]).expect("no option"), PATTERNS);
        assert_eq!(
            picked(&["--pattern", "seq-write", "--pattern", "random-read"]).expect("two"),
            ["random-read", "seq-write"]
        );
        assert_eq!(
            picked(&["--pattern", "seq-read", "--pattern", "seq-read"]).expect("twice"),
            ["seq-read"]
        );
        let refused = picked(&["--pattern", "random-hot"]).expect_err("not this bench's");
        assert!(refused.to_string().contains("random-read"), "{refused}");
    }

    /// The hidden child command, parsed as `faultline ooc-child` is.
    #[derive(Parser)]
    struct ChildCli {
        #[command(flatten)]
        a: ChildArgs,
    }

    #[test]
    fn a_child_builds_the_manager_its_parent_was_asked_for() {
        let child_config = |parent: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("t").chain(parent.iter().copied()))
                .expect("parent options");
            let passed = cli.o.common.child_args();
            let own = ["t", "--system", "faultline", "--file", "f", "--budget", "1"];
            let more = ["--pattern", "random-read", "--threads", "1", "--ops", "1"];
            let args = own.iter().chain(&more).chain(&["--secs", "1"]);
            let args = args.map(|s| s.to_string()).chain(passed.iter().cloned());
            let child = ChildCli::try_parse_from(args).expect("child options");
            let (p, c) = (cli.o.common.config(), child.a.opts.config());
            (format!("{p:?}"), format!("{c:?}"), passed)
        };
        let every = [
            "--workers",
            "3",
            "--spare-servers",
            "5",
            "--fault-locks",
            "128",
            "--cpus",
            "16",
            "--exclusive-wake",
            "--no-pin",
            "--spin-us",
            "30",
            "--fault-around",
            "1",
            "--no-pcp",
            "--pcp-batch",
            "7",
            "--pcp-high",
            "70",
            "--migrate-chunk",
            "65536",
            "--no-publish",
            "--no-removals",
            "--fill-model",
            "move",
            "--reclaim-low-pct",
            "3",
            "--reclaim-high-pct",
            "9",
            "--quick",
            "--json",
        ];
        let (parent, child, passed) = child_config(&every);
        assert_eq!(parent, child, "every manager option reaches the child");
        assert!(!passed.iter().any(|a| a == "--quick" || a == "--json"));
        let (parent, child, passed) = child_config(&[]);
        assert_eq!(parent, child);
        assert!(passed.is_empty(), "defaults pass nothing: {passed:?}");
    }

    #[test]
    fn sizes_keep_the_defaults_and_fit_the_metadata() {
        assert_eq!(sizes_of(&["--quick"]).ok(), Some((64, 52, 256)));
        assert_eq!(
            sizes_of(&["--data-mib", "2048", "--budget-mib", "64"]).ok(),
            Some((72, 64, 2048))
        );
        assert_eq!(
            sizes_of(&["--memory-mib", "128", "--data-mib", "1024"]).ok(),
            Some((128, 104, 1024))
        );
        assert!(sizes_of(&["--data-mib", "16384"]).is_err(), "no room");
        assert_eq!(
            sizes_of(&["--data-mib", "16384", "--budget-mib", "64"]).ok(),
            Some((104, 64, 16384)),
            "48 MiB of tables and leaves, 16 paid from the budget"
        );
        assert!(sizes_of(&["--budget-mib", "0"]).is_err());
    }
}
