//! `faultline bench preload`: random point lookups in a SQLite database
//! many times the memory, by the real `sqlite3` program, three ways (issue
//! 41):
//! - a, `preload`: `sqlite3` with `PRAGMA mmap_size` covering the file,
//!   its mapping served by faultline through `libfaultline_preload.so`
//!   (`LD_PRELOAD`, `FAULTLINE_FILES` = the database, `FAULTLINE_BUDGET`);
//! - b, `kernel-mmap`: the same `sqlite3` and mapping, the kernel's own
//!   `mmap`, no preload;
//! - c, `sqlite-cache`: no mapping (`mmap_size=0`), SQLite's own page cache
//!   of the budget's size (`cache_size=-<budget KiB>`), reads with `pread`.
//!
//! Every run is one `sqlite3` process in a fresh memory cgroup (v1 or v2,
//! `bench::cgroup`), page cache dropped before it, all with the same
//! limit: the budget plus the largest of the setups' own memory beyond it,
//! measured first (`Base`: cgroup peaks of one lookup, for the preload
//! less what grows with the budget; SQLite's heap with c's cache full).
//! The runs are interleaved a, b, c, a, b, c, ... so that the ratios a/b
//! and a/c of each round are measured side by side. A run's
//! rate is its lookups over the query's own time (`.timer on`: "Run Time:
//! real"); the process's time from start to exit is kept beside it in the
//! JSON. Each setup's number of lookups is calibrated so that its query
//! lasts about `TARGET_S` (the setups' rates differ by orders of
//! magnitude). The keys are a fixed sequence, so the result of n lookups
//! is known: every run must print what plain `sqlite3` (no cgroup, no
//! preload, no mapping) prints for its n (a mismatch is an error), and the
//! preload's exit report must show it served the database (`regions>=1`).
//!
//! The database is built once per bench run by `sqlite3` itself (without
//! the preload) in a temporary directory under `FAULTLINE_BENCH_DIR`
//! (default `/var/tmp`), removed at the end, on error and on Ctrl-C.

mod results;
mod sqlite;

use super::{cgroup, progress};
use crate::report::Report;
use anyhow::{bail, Context};
use sqlite::{Invocation, Sqlite, BYTES_PER_ROW, MAX_MMAP};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Options of `bench preload` (the manager's own options come from the
/// preload's environment, so `BenchOpts`' tuning flags have no place here).
#[derive(Debug, Clone, clap::Args)]
pub struct PreloadOpts {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Smaller sizes: a 256 MiB database through 16 MiB, 2 runs (about 30 s).
    #[arg(long)]
    pub quick: bool,
    /// The preload library (default: libfaultline_preload.so next to this
    /// `faultline` binary, as `cargo build --release -p faultline-preload`
    /// leaves it in target/release/).
    #[arg(long)]
    pub preload: Option<PathBuf>,
    /// Database size in MiB (default 1950, 256 with --quick; at most 2007:
    /// SQLite maps at most 0x7fff0000 bytes).
    #[arg(long)]
    pub db_mib: Option<u64>,
    /// The budget in MiB: the preload's FAULTLINE_BUDGET, SQLite's cache in
    /// setup c, and the memory cgroup limit less the setups' own memory
    /// (default 64, 16 with --quick).
    #[arg(long)]
    pub budget_mib: Option<usize>,
    /// Runs of each setup (default 3, 2 with --quick).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Lookups per run, in every setup (default: each setup's calibrated
    /// so that its query lasts about 3 s).
    #[arg(long)]
    pub lookups: Option<u64>,
    /// How the preload serves faults (FAULTLINE_FAULT_MODE): `workers`
    /// (the library's default: kernel-mode accesses to mapped pages work)
    /// or `in-thread` (the faulting thread serves its own fault: faster).
    #[arg(long, default_value = "workers", value_parser = ["workers", "in-thread"])]
    pub fault_mode: String,
}

/// The three setups, in the order each round runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Preload,
    KernelMmap,
    SqliteCache,
}

impl Setup {
    const ALL: [Setup; 3] = [Setup::Preload, Setup::KernelMmap, Setup::SqliteCache];

    fn name(self) -> &'static str {
        match self {
            Setup::Preload => "preload",
            Setup::KernelMmap => "kernel-mmap",
            Setup::SqliteCache => "sqlite-cache",
        }
    }

    fn letter(self) -> &'static str {
        match self {
            Setup::Preload => "a",
            Setup::KernelMmap => "b",
            Setup::SqliteCache => "c",
        }
    }
}

/// Lookups of a setup's first calibration run.
fn calibration_lookups(quick: bool) -> u64 {
    if quick {
        500
    } else {
        1_000
    }
}

/// Seconds a setup's query should last once calibrated.
const TARGET_S: f64 = 3.0;

/// A calibration run shorter than this is repeated with more lookups.
const CALIBRATION_MIN_S: f64 = 1.0;

/// A directory removed with everything in it when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The database, the preload and the sizes of one bench run.
struct Bench {
    sqlite: Sqlite,
    /// The preload every run of a loads: a copy of `so_origin` made at the
    /// start, so that a rebuild during the bench changes no run, and
    /// stripped of its debug sections where `strip` is at hand.
    so: PathBuf,
    so_origin: PathBuf,
    /// What stripping the copy did, for the report.
    so_stripped: String,
    dir: TempDir,
    db: PathBuf,
    rows: u64,
    db_bytes: u64,
    budget: usize,
    mmap_size: u64,
    /// FAULTLINE_FAULT_MODE for a.
    fault_mode: String,
}

/// What a run is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// A measured run.
    No,
    /// A base-memory probe with this budget: setup c without its cache
    /// size (SQLite's default cache, nothing mapped), or setup a with this
    /// `FAULTLINE_BUDGET`.
    Base(usize),
    /// Setup c with `.stats on`: SQLite's heap with its cache full.
    CacheHeap,
}

/// What one run measured.
struct Sample {
    n: u64,
    /// SQLite's heap at most (`Probe::CacheHeap` runs only).
    heap: Option<usize>,
    command: String,
    result: String,
    query_s: f64,
    process_s: f64,
    peak: Option<usize>,
    report: Option<Vec<(String, String)>>,
}

impl Bench {
    /// The file of the lookup query with `n` keys (written once).
    fn sql_file(&self, n: u64) -> anyhow::Result<PathBuf> {
        let path = self.dir.0.join(format!("lookups-{n}.sql"));
        if !path.exists() {
            std::fs::write(&path, format!("{};\n", sqlite::lookup_sql(n, self.rows)))?;
        }
        Ok(path)
    }

    /// The `sqlite3` command of `setup` running the query in `sql`, for
    /// `probe`.
    fn invocation(&self, setup: Setup, sql: &Path, probe: Probe) -> Invocation {
        let db = self.db.display().to_string();
        let mmap = format!("PRAGMA mmap_size={}", self.mmap_size);
        let mut args: Vec<String> = match setup {
            Setup::Preload | Setup::KernelMmap => vec!["-cmd".into(), mmap],
            Setup::SqliteCache => vec!["-cmd".into(), "PRAGMA mmap_size=0".into()],
        };
        if setup == Setup::SqliteCache && !matches!(probe, Probe::Base(_)) {
            args.push("-cmd".into());
            args.push(format!("PRAGMA cache_size=-{}", self.budget >> 10));
        }
        if probe == Probe::CacheHeap {
            args.push("-cmd".into());
            args.push(".stats on".into());
        }
        args.extend([
            "-cmd".into(),
            ".timer on".into(),
            db.clone(),
            format!(".read {}", sql.display()),
        ]);
        let budget = match probe {
            Probe::Base(budget) => budget,
            _ => self.budget,
        };
        let (preload, env) = match setup {
            Setup::Preload => (
                Some(self.so.clone()),
                vec![
                    ("FAULTLINE_FILES", db),
                    ("FAULTLINE_BUDGET", format!("{}M", budget >> 20)),
                    ("FAULTLINE_PRELOAD_REPORT", "1".into()),
                    ("FAULTLINE_FAULT_MODE", self.fault_mode.clone()),
                ],
            ),
            _ => (None, Vec::new()),
        };
        Invocation { preload, env, args }
    }

    /// One run of `setup` with `n` lookups in a cgroup of `limit` bytes,
    /// checked: the whole file mapped (a, b), every key found, and for a
    /// the preload's report showing it served the database.
    fn run(
        &self,
        setup: Setup,
        n: u64,
        limit: usize,
        timeout: Duration,
        probe: Probe,
    ) -> anyhow::Result<Sample> {
        let inv = self.invocation(setup, &self.sql_file(n)?, probe);
        let out = inv.run(&self.sqlite, limit, timeout)?;
        let cmd = || inv.display(&self.sqlite);
        let printed = sqlite::parse_stdout(&out.stdout)
            .with_context(|| format!("{}\nstderr: {}", cmd(), out.stderr.trim()))?;
        if setup != Setup::SqliteCache && printed.mmap_size.unwrap_or(0) < self.db_bytes {
            bail!(
                "SQLite maps {:?} bytes of the {}-byte database (mmap_size is capped by its SQLITE_MAX_MMAP_SIZE): {}",
                printed.mmap_size,
                self.db_bytes,
                cmd()
            );
        }
        let found = printed.result.split('|').next().unwrap_or("");
        if found != n.to_string() {
            bail!(
                "{found} of {n} keys found ({}): {}\nstderr: {}",
                printed.result,
                cmd(),
                out.stderr.trim()
            );
        }
        let report = match setup {
            Setup::Preload => {
                let Some(r) = sqlite::parse_report(&out.stderr) else {
                    bail!(
                        "the preload printed no `faultline-preload: regions=...` report at exit \
                         (did it load? FAULTLINE_PRELOAD_REPORT=1 is set): {}\nstderr: {}",
                        cmd(),
                        out.stderr.trim()
                    );
                };
                let regions = r
                    .iter()
                    .find(|(k, _)| k == "regions")
                    .and_then(|(_, v)| v.parse::<u64>().ok())
                    .unwrap_or(0);
                if regions < 1 {
                    bail!(
                        "the preload did not serve the database (regions={regions}): {}\nstderr: {}",
                        cmd(),
                        out.stderr.trim()
                    );
                }
                Some(r)
            }
            _ => None,
        };
        Ok(Sample {
            n,
            heap: sqlite::parse_heap_max(&out.stdout),
            command: cmd(),
            result: printed.result,
            query_s: printed.query_s,
            process_s: out.process_s,
            peak: out.peak,
            report,
        })
    }
}

/// `libfaultline_preload.so`: `--preload`, else next to this binary, else
/// in target/release/ beside a target/debug/ binary.
fn find_preload(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    const SO: &str = "libfaultline_preload.so";
    let looked: Vec<PathBuf> = match given {
        Some(p) => vec![p.to_path_buf()],
        None => {
            let exe = std::env::current_exe()?;
            let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
            vec![dir.join(SO), dir.join("../release").join(SO)]
        }
    };
    match looked.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.canonicalize()?),
        None => bail!(
            "the preload library is missing ({}): build it with `cargo build --release -p faultline-preload`, \
             or name it with --preload PATH",
            looked
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The mount holding `dir` (its source and file system type), from
/// `/proc/self/mounts`.
fn mount_of(dir: &Path) -> Option<(String, String)> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && dir.starts_with(f[1])).then(|| (f[1].len(), f[0], f[2]))
        })
        .max_by_key(|m| m.0)
        .map(|(_, src, fs)| (src.to_string(), fs.to_string()))
}

/// The bench directory: a fresh one under `FAULTLINE_BENCH_DIR` (default
/// `/var/tmp`), on a disk (a tmpfs's pages cannot be dropped).
fn make_dir() -> anyhow::Result<TempDir> {
    let parent = std::env::var_os("FAULTLINE_BENCH_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let parent = parent
        .canonicalize()
        .with_context(|| format!("the bench directory {}", parent.display()))?;
    if let Some((_, fs)) = mount_of(&parent) {
        if fs == "tmpfs" || fs == "ramfs" {
            bail!(
                "{} is on {fs}: the database must be on a disk (its page cache is dropped before every run); \
                 set FAULTLINE_BENCH_DIR to a directory on one",
                parent.display()
            );
        }
    }
    let dir = parent.join(format!("faultline-preload-bench-{}", std::process::id()));
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(TempDir(dir))
}

/// Removes `dir` if the bench is interrupted (SIGINT, SIGTERM, SIGHUP);
/// the process then exits 130. Best effort.
fn remove_on_interrupt(dir: PathBuf) {
    let set = ctrlc::set_handler(move || {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("\ninterrupted: removed {}", dir.display());
        std::process::exit(130);
    });
    if let Err(e) = set {
        eprintln!("the database is not removed if the bench is interrupted: {e}");
    }
}

/// The sizes `--quick` and the options ask for: (database bytes, rows,
/// budget bytes, runs).
fn sizes(o: &PreloadOpts) -> anyhow::Result<(u64, u64, usize, usize)> {
    let quick = o.quick;
    let db_mib = o.db_mib.unwrap_or(if quick { 256 } else { 1950 });
    let budget_mib = o.budget_mib.unwrap_or(if quick { 16 } else { 64 });
    let runs = o.runs.unwrap_or(if quick { 2 } else { 3 });
    if db_mib == 0 || budget_mib == 0 || runs == 0 || o.lookups == Some(0) {
        bail!("--db-mib, --budget-mib, --runs and --lookups must be at least 1");
    }
    if (db_mib << 20) + (db_mib << 20) / 50 > MAX_MMAP {
        bail!(
            "--db-mib {db_mib}: SQLite maps at most {MAX_MMAP:#x} bytes (SQLITE_MAX_MMAP_SIZE), \
             so the database must stay below 2007 MiB"
        );
    }
    Ok((
        db_mib << 20,
        ((db_mib << 20) / BYTES_PER_ROW).max(1),
        budget_mib << 20,
        runs,
    ))
}

/// Strips the debug sections of the preload's copy (`strip --strip-debug`):
/// a release build carries ~23 MB of them (the workspace builds with
/// `debug = 1`), which no program loads, but which the device's read-ahead
/// around the library's code pulls into the page cache of a's cgroup once
/// the caches are dropped — measured as a's own memory, 21.7 MiB unstripped
/// and 7-8 MiB stripped. What it did, for the report.
fn strip_debug(so: &Path) -> String {
    let before = std::fs::metadata(so).map(|m| m.len()).unwrap_or(0);
    match std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg(so)
        .status()
    {
        Ok(s) if s.success() => {
            let after = std::fs::metadata(so).map(|m| m.len()).unwrap_or(0);
            format!(
                "stripped of debug sections, {} -> {} KiB",
                before >> 10,
                after >> 10
            )
        }
        Ok(s) => format!(
            "not stripped (strip --strip-debug: {s}), {} KiB",
            before >> 10
        ),
        Err(e) => format!("not stripped (no strip: {e}), {} KiB", before >> 10),
    }
}

pub fn run(opts: &PreloadOpts) -> anyhow::Result<Report> {
    let (target_bytes, rows, budget, runs) = sizes(opts)?;
    let sqlite = Sqlite::find()?;
    let so = find_preload(opts.preload.as_deref())?;
    let dir = make_dir()?;
    remove_on_interrupt(dir.0.clone());
    let so_copy = dir.0.join("libfaultline_preload.so");
    std::fs::copy(&so, &so_copy).with_context(|| format!("copying {}", so.display()))?;
    let so_stripped = strip_debug(&so_copy);
    let db = dir.0.join("lookups.db");
    eprintln!(
        "building a {} MiB database ({rows} rows) in {} ...",
        target_bytes >> 20,
        dir.0.display()
    );
    let db_bytes = sqlite.build(&db, rows)?;
    let b = Bench {
        sqlite,
        so: so_copy,
        so_origin: so,
        so_stripped,
        dir,
        db,
        rows,
        db_bytes,
        budget,
        mmap_size: db_bytes.next_multiple_of(1 << 20).min(MAX_MMAP),
        fault_mode: opts.fault_mode.clone(),
    };
    let load_before = load_average();
    let mut report = measure(&b, opts, runs)?;
    report.notes.push(format!(
        "load average (1, 5, 15 min) at the start: {load_before}; at the end: {} (other work on the machine \
         shows here and in the spread).",
        load_average()
    ));
    Ok(report)
    // `b` drops here: the directory and the database go.
}

/// `/proc/loadavg`'s first three fields.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".into(),
        |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// Everything the report is made of.
struct Measured {
    base: Base,
    limits: [usize; 3],
    calibration: Vec<(Setup, f64)>,
    rounds: Rounds,
    plan: String,
    references: Vec<(u64, String)>,
}

/// The per-setup samples of every round.
type Rounds = Vec<[Sample; 3]>;

/// The result line each number of lookups must print, from plain
/// `sqlite3` (no cgroup, no preload, no mapping), computed once per number.
#[derive(Default)]
struct References(Vec<(u64, String)>);

impl References {
    fn of(&mut self, b: &Bench, n: u64) -> anyhow::Result<String> {
        if let Some((_, r)) = self.0.iter().find(|(m, _)| *m == n) {
            return Ok(r.clone());
        }
        let sql = b.sql_file(n)?;
        let out = b.sqlite.run_plain(&[
            "-cmd",
            ".timer on",
            &b.db.display().to_string(),
            &format!(".read {}", sql.display()),
        ])?;
        let r = sqlite::parse_stdout(&out)?.result;
        self.0.push((n, r.clone()));
        Ok(r)
    }

    /// `s` printed what plain `sqlite3` prints for its lookups.
    fn check(&mut self, b: &Bench, setup: Setup, s: &Sample) -> anyhow::Result<()> {
        let want = self.of(b, s.n)?;
        if s.result != want {
            bail!(
                "wrong result: {} ({}) printed {} for {} lookups, plain sqlite3 prints {want} \
                 (count|sum(length(v))|sum(instr(v, x'00'))): {}",
                setup.letter(),
                setup.name(),
                s.result,
                s.n,
                s.command
            );
        }
        Ok(())
    }
}

/// The lookups a setup's runs make: its rate from calibration runs (the
/// first of `first` lookups, then more until one lasts
/// `CALIBRATION_MIN_S`), times `TARGET_S`. Returns (lookups, rate).
fn calibrate(
    b: &Bench,
    setup: Setup,
    first: u64,
    limit: usize,
    refs: &mut References,
) -> anyhow::Result<(u64, f64)> {
    let mut n = first;
    loop {
        let s = b.run(setup, n, limit, Duration::from_secs(600), Probe::No)?;
        refs.check(b, setup, &s)?;
        let rate = n as f64 / s.query_s.max(1e-3);
        if s.query_s >= CALIBRATION_MIN_S || n >= 100_000_000 {
            let lookups = ((rate * TARGET_S) as u64).next_multiple_of(100).max(100);
            return Ok((lookups, rate));
        }
        n = (n * 4).max((rate * CALIBRATION_MIN_S * 2.0) as u64 + 1);
    }
}

/// The memory each setup takes beyond the budget, in bytes: cgroup peaks
/// in a cgroup that limits nothing, page cache dropped first, each the
/// larger of two tries.
struct Base {
    /// `sqlite3` alone, one lookup (mmap off, its default cache).
    sqlite3: usize,
    /// SQLite's heap at most, setup c with its cache full (`.stats on`).
    cache_heap: usize,
    /// `sqlite3` under the preload: `2 x at_budget - at_twice`, the peak
    /// of one lookup less what of it grows with the budget (the preload
    /// takes its budget at start).
    preload: usize,
    /// The preload's probe peaks at the budget and at twice the budget.
    at_budget: usize,
    at_twice: usize,
}

impl Base {
    /// Setup c's: sqlite3's own, and what its cache of `budget` bytes
    /// takes beyond them (page headers, allocation slots).
    fn sqlite_cache(&self, budget: usize) -> usize {
        self.sqlite3 + self.cache_heap.saturating_sub(budget)
    }

    /// The largest: what every setup's cgroup gets beyond the budget.
    fn common(&self, budget: usize) -> usize {
        self.sqlite_cache(budget).max(self.preload)
    }
}

fn measure_base(
    b: &Bench,
    refs: &mut References,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Base> {
    let unlimited = faultline_sys::host::physical_memory();
    let probe = |setup: Setup, budget: usize, refs: &mut References| -> anyhow::Result<usize> {
        let mut peak = 0;
        for _ in 0..2 {
            let s = b.run(
                setup,
                1,
                unlimited,
                Duration::from_secs(120),
                Probe::Base(budget),
            )?;
            refs.check(b, setup, &s)?;
            peak = peak.max(s.peak.context("the cgroup keeps no peak")?);
        }
        bar.inc(1);
        Ok(peak)
    };
    let sqlite3 = probe(Setup::SqliteCache, b.budget, refs)?;
    let at_budget = probe(Setup::Preload, b.budget, refs)?;
    let at_twice = probe(Setup::Preload, 2 * b.budget, refs)?;
    // Enough lookups to fill the cache: most of them miss it.
    let fill = (2 * b.budget as u64 / 4096).next_multiple_of(100);
    let s = b.run(
        Setup::SqliteCache,
        fill,
        unlimited,
        Duration::from_secs(600),
        Probe::CacheHeap,
    )?;
    refs.check(b, Setup::SqliteCache, &s)?;
    let cache_heap = s
        .heap
        .context("sqlite3 printed no .stats \"Memory Used\" line")?;
    bar.inc(1);
    Ok(Base {
        sqlite3,
        cache_heap,
        preload: (2 * at_budget).saturating_sub(at_twice).max(sqlite3),
        at_budget,
        at_twice,
    })
}

fn measure(b: &Bench, opts: &PreloadOpts, runs: usize) -> anyhow::Result<Report> {
    let plan = b
        .sqlite
        .check_plan(&b.db, &sqlite::lookup_sql(1000, b.rows))?;
    let mut refs = References::default();
    let calibrating = opts.lookups.is_none();
    let steps = 4 + 3 * runs + if calibrating { 3 } else { 0 };
    let bar = progress(steps as u64, "preload");
    let result = (|| -> anyhow::Result<_> {
        let base = measure_base(b, &mut refs, &bar)?;
        let limits = [(b.budget + base.common(b.budget)).next_multiple_of(1 << 20); 3];
        // The lookups of each setup's runs.
        let mut lookups = [0u64; 3];
        let mut calibration = Vec::new();
        for (i, setup) in Setup::ALL.into_iter().enumerate() {
            lookups[i] = match opts.lookups {
                Some(n) => n,
                None => {
                    let first = calibration_lookups(opts.quick);
                    let (n, rate) = calibrate(b, setup, first, limits[i], &mut refs)?;
                    calibration.push((setup, rate));
                    bar.inc(1);
                    n
                }
            };
        }
        let mut rounds: Rounds = Vec::new();
        for _ in 0..runs {
            let mut one = Vec::new();
            for (i, setup) in Setup::ALL.into_iter().enumerate() {
                let expected = calibration.get(i).map_or(60.0, |c| lookups[i] as f64 / c.1);
                let timeout = Duration::from_secs_f64(120.0 + 10.0 * expected);
                let s = b.run(setup, lookups[i], limits[i], timeout, Probe::No)?;
                refs.check(b, setup, &s)?;
                one.push(s);
                bar.inc(1);
            }
            if let Ok(r) = <[Sample; 3]>::try_from(one) {
                rounds.push(r);
            }
        }
        Ok((base, limits, calibration, rounds))
    })();
    bar.finish_and_clear();
    let (base, limits, calibration, rounds) = result?;
    Ok(results::report(
        b,
        &Measured {
            base,
            limits,
            calibration,
            rounds,
            plan,
            references: refs.0,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        o: PreloadOpts,
    }

    fn sizes_of(args: &[&str]) -> anyhow::Result<(u64, u64, usize, usize)> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
        sizes(&cli.o).map(|(d, r, b, n)| (d >> 20, r, b >> 20, n))
    }

    #[test]
    fn sizes_default_and_stay_mappable() {
        assert_eq!(sizes_of(&["--quick"]).ok(), Some((256, 235_883, 16, 2)));
        assert_eq!(sizes_of(&[]).ok(), Some((1950, 1_796_769, 64, 3)));
        assert!(
            sizes_of(&["--db-mib", "2048"]).is_err(),
            "beyond SQLite's mapping"
        );
        assert!(sizes_of(&["--runs", "0"]).is_err());
    }

    #[test]
    fn finds_the_named_preload_or_says_how_to_build_it() {
        let missing = find_preload(Some(Path::new("/nonexistent/libfaultline_preload.so")));
        let msg = format!(
            "{:#}",
            missing.err().map(|e| e.to_string()).unwrap_or_default()
        );
        assert!(
            msg.contains("cargo build --release -p faultline-preload"),
            "{msg}"
        );
    }
}
