//! The child side of `bench out-of-core` and `bench far-memory`
//! (`faultline ooc-child`, hidden): waits for the parent to move it into the
//! cgroup, maps the data — the file (the kernel's `mmap`, with the row's
//! `madvise` hint, or a faultline region), anonymous memory the kernel
//! swaps (`anon`), or a faultline region over Redis (`redis`,
//! `redis-cluster`: `--url`) — fills it first where it starts empty
//! (untimed), runs the pattern, and prints one JSON line: ops/s, the CPU
//! its process used per op over the timed ops (`cpu_us_per_op`; beside it,
//! with `--server-pids`, what the local Redis servers used,
//! `server_cpu_us_per_op`), its
//! misses per op (`misses_per_op`: frames faultline filled from its store,
//! or the kernel's major faults — reads it waited for), its peak
//! RSS (`VmHWM`), after a pattern that writes to the file the time its
//! dirty pages took to reach the disk (`flush_ms`: `msync`, or the region's
//! `flush`), and for faultline its fault service time, its fault
//! locks' waits and the events its spare servers served. faultline's
//! manager takes every manager option the parent bench was given
//! ([`crate::bench::BenchOpts::child_args`]).

use crate::bench::{rng, RunClocks};
use anyhow::bail;
use faultline::store::{File, FileOptions, Redis, RedisCluster, RedisOptions};
use faultline::{FaultMode, ManagerBuilder, MapOptions};
use faultline::{Manager, Store};
use faultline_sys::mem::Advice;
use serde_json::json;
use std::io::BufRead;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of the hidden child command.
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    #[arg(long)]
    pub system: String,
    #[arg(long)]
    pub file: PathBuf,
    #[arg(long)]
    pub budget: usize,
    /// `random-read`, `random-write`, `random-mixed` (reads, one in four
    /// written back), `random-hot` (reads, nine in ten in a hot tenth of
    /// the pages), `seq-read`, `seq-write`.
    #[arg(long)]
    pub pattern: String,
    /// Kernel side: `none`, `random` or `sequential` (`madvise`).
    #[arg(long, default_value = "none")]
    pub hint: String,
    #[arg(long)]
    pub threads: usize,
    #[arg(long)]
    pub ops: usize,
    #[arg(long)]
    pub secs: f64,
    /// Data size for systems without a file (`anon`, `redis*`), bytes.
    #[arg(long, default_value_t = 0)]
    pub len: usize,
    /// faultline over the file: `direct` (`O_DIRECT`, long reads staged in
    /// a huge page, each read polled: the default), `direct-sleeping` (the
    /// same, sleeping in `pread`), `direct-unstaged` (every read straight
    /// into the frames) or `buffered` I/O between the file and the frames.
    #[arg(long, default_value = "direct")]
    pub io: String,
    /// Who serves faultline's faults: `workers` (default) or `in-thread`.
    #[arg(long, default_value = "workers")]
    pub mode: String,
    /// Redis URL (`redis`) or comma-separated node URLs (`redis-cluster`).
    #[arg(long, default_value = "")]
    pub url: String,
    /// Processes beside this one whose CPU time over the timed ops is
    /// reported per op (`server_cpu_us_per_op`): the local Redis servers a
    /// row's store talks to, comma-separated process ids.
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// faultline's manager: the parent bench's options
    /// ([`crate::bench::BenchOpts::child_args`]).
    #[command(flatten)]
    pub opts: crate::bench::BenchOpts,
}

/// The arguments a parent gives every child of its run besides the row's
/// own: faultline's budget, the threads, the caps on ops and seconds, and
/// `servers` (the parent's manager options, [`crate::bench::BenchOpts::child_args`]).
pub(crate) fn run_args(
    budget: usize,
    threads: usize,
    ops: usize,
    secs: f64,
    servers: &[String],
) -> Vec<String> {
    let mut args = vec![
        "--budget".to_string(),
        budget.to_string(),
        "--threads".into(),
        threads.to_string(),
        "--ops".into(),
        ops.to_string(),
        "--secs".into(),
        secs.to_string(),
    ];
    args.extend(servers.iter().cloned());
    args
}

/// What a faultline row measured besides its ops/s.
#[derive(Debug, Default)]
struct Served {
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
    /// The store's reads (one per fill from the store, a run or a page):
    /// median, 99th percentile and mean, µs. What of a fault's time the
    /// device (or the server) took, beside the fault's own.
    store_read_p50_us: f64,
    store_read_p99_us: f64,
    store_read_mean_us: f64,
    /// Faults that found no frame after four reclaim passes and waited.
    reclaim_waits: u64,
    /// Fault-lock acquisitions that found the lock held, in percent.
    lock_contended_pct: f64,
    /// Time spent waiting for fault locks, all threads, in ms.
    lock_wait_ms: f64,
    /// Events served by spare servers.
    spare_serves: u64,
    /// The write-back after a pattern that writes ([`flush_ms`]).
    flush_ms: Option<f64>,
    /// Misses during the timed ops: frames faultline filled from its
    /// store; the kernel's major faults on its side.
    misses: Option<u64>,
}

/// Times `flush` after a pattern that dirties pages (`None` for one that
/// reads): every page the pattern wrote goes to the file and the file is
/// made durable — the kernel's `msync(MS_SYNC)`, a region's `flush` — so
/// that write rows can be compared with their data on the disk, not only
/// in memory.
fn flush_ms(
    pattern: &str,
    flush: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Option<f64>> {
    if !(pattern.ends_with("write") || pattern.ends_with("mixed")) {
        return Ok(None);
    }
    let t = Instant::now();
    flush()?;
    Ok(Some(t.elapsed().as_secs_f64() * 1e3))
}

fn vm_hwm_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// What a timed run gave: its rate, and the CPU it cost.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Driven {
    pub ops_per_s: f64,
    /// CPU time of the whole process (every thread: the program's, and a
    /// faultline manager's workers and helpers, with the kernel's work in
    /// their system calls and faults; an interrupt's time counts for
    /// whichever thread it interrupted) during the run, per op done, µs.
    /// `None` if the process's CPU clock could not be read or no op was
    /// done.
    pub cpu_us_per_op: Option<f64>,
    /// CPU time of the processes named by `--server-pids` during the run,
    /// per op done, µs (`None` without any, if one's clock could not be
    /// read, or if no op was done): on one machine a local Redis server
    /// shares the CPUs with the program, where the kernel's swap has no
    /// such process.
    pub server_cpu_us_per_op: Option<f64>,
    /// Ops done.
    pub ops: usize,
    /// The process's major faults during the run (the kernel's misses:
    /// reads of the device it waited for); `None` if not counted. Of no
    /// use for a faultline region, whose faults the kernel counts as major
    /// only in workers mode.
    pub major_faults: Option<u64>,
}

/// Runs `a`'s pattern, up to `a.ops` ops per thread from `a.threads`
/// threads, on `[base, base + len)`, stopping early at `a.secs` seconds;
/// returns ops/s over the ops done, and their CPU (the process's, and that
/// of `a.server_pids`). A write stores a word
/// that differs from run to run (salted with [`run_salt`]): every row
/// writes the same pages in the same order, and a row that stored the
/// words an earlier row left in the file would find its pages clean and
/// skip their write-back, which the kernel never does (a write dirties its
/// page whatever it stores).
pub(crate) fn drive(base: usize, len: usize, a: &ChildArgs) -> Driven {
    let (pattern, threads, ops, secs) = (a.pattern.as_str(), a.threads, a.ops, a.secs);
    let servers = &a.server_pids;
    let pages = len / 4096;
    let write = pattern.ends_with("write");
    // `random-mixed`: every op reads its word, and one op in four writes
    // it back changed (a read-modify-write: the write finds its page
    // mapped by the read).
    let mixed = pattern.ends_with("mixed");
    // `random-hot`: nine reads in ten go to the first tenth of the pages
    // (a hot set that fits a budget of a fifth), the rest anywhere.
    let hot = pattern.ends_with("hot");
    let random = pattern.starts_with("random");
    let salt = run_salt();
    let servers_before = servers_cpu(servers);
    let clocks = RunClocks::start();
    let t = &clocks;
    let done: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || {
                    let mut next = rng(th as u64 + 1);
                    let start = th * pages / threads;
                    let mut sum = 0u64;
                    let mut i = 0;
                    while i < ops {
                        if i % 256 == 0 && t.secs() > secs {
                            break;
                        }
                        let p = if hot && next() % 10 < 9 {
                            next() as usize % (pages / 10).max(1)
                        } else if random {
                            next() as usize % pages
                        } else {
                            (start + i) % pages
                        };
                        let a = (base + p * 4096 + (th * 64) % 4096) as *mut u64;
                        if write {
                            // SAFETY: inside the mapping/region, which outlives
                            // the scope; threads write distinct words of a page.
                            unsafe { a.write_volatile(i as u64 ^ salt) };
                        } else {
                            // SAFETY: as above.
                            let v = unsafe { a.read_volatile() };
                            sum = sum.wrapping_add(v);
                            if mixed && i % 4 == 0 {
                                // SAFETY: as above.
                                unsafe { a.write_volatile(v.wrapping_add(1)) };
                            }
                        }
                        i += 1;
                    }
                    std::hint::black_box(sum);
                    i
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    let server_cpu_us_per_op = match (servers_before, servers_cpu(servers)) {
        (Some(before), Some(after)) if done > 0 => {
            Some(after.saturating_sub(before).as_secs_f64() * 1e6 / done as f64)
        }
        _ => None,
    };
    Driven {
        ops_per_s: done as f64 / clocks.secs(),
        cpu_us_per_op: clocks.cpu_us_per(done as f64),
        server_cpu_us_per_op,
        ops: done,
        major_faults: clocks.major_faults(),
    }
}

/// The CPU time the processes `pids` have used so far, summed; `None`
/// for no process, or if one's clock could not be read (it was reaped).
fn servers_cpu(pids: &[u32]) -> Option<std::time::Duration> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|&pid| faultline_sys::host::other_process_cpu_time(pid))
        .sum()
}

/// A word no earlier run stored: the clock's nanoseconds and this
/// process's id, mixed (64 bits: two runs collide with probability 2^-64).
fn run_salt() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut next = rng(nanos ^ u64::from(std::process::id()) << 32);
    next()
}

/// `Config::small_zone_pct` of faultline's side: the workload is 4 KiB
/// pages only.
pub(super) const SMALL_ZONE_PCT: usize = 100;

/// The `madvise` advice of a kernel row's hint (`None` for `none`).
fn advice(hint: &str) -> anyhow::Result<Option<Advice>> {
    Ok(match hint {
        "none" => None,
        "random" => Some(Advice::Random),
        "sequential" => Some(Advice::Sequential),
        _ => bail!("unknown hint {hint:?} (none, random, sequential)"),
    })
}

/// Writes one word into every 4 KiB page of `[base, base + len)`: the data
/// of a set that starts empty (anonymous memory, a fresh Redis prefix) is
/// all there, in swap or in the store, before the pattern is timed.
fn fill(base: usize, len: usize) {
    for p in 0..len / 4096 {
        // SAFETY: inside the caller's mapping or region, which outlives this.
        unsafe { ((base + p * 4096) as *mut u64).write_volatile(p as u64 | 1) };
    }
}

/// A faultline manager with the budget, 4 KiB pages only, faults served
/// as `a.mode` says, with `a`'s servers and CPUs.
fn manager(a: &ChildArgs) -> anyhow::Result<Manager> {
    let (budget, mode) = (a.budget, a.mode.as_str());
    // 4 KiB pages only: the whole budget as a small-page zone (no THP
    // splits on the way; docs/design.md measures both).
    let mut config = a.opts.config();
    config.budget = budget;
    config.small_zone_pct = SMALL_ZONE_PCT;
    config.fault_mode = match mode {
        "workers" => FaultMode::Workers,
        "in-thread" => FaultMode::InThread,
        other => bail!("--mode {other}: workers or in-thread"),
    };
    Ok(ManagerBuilder::from_config(config).build()?)
}

/// What a faultline row does around the timed pattern.
#[derive(Clone, Copy, PartialEq)]
enum Set {
    /// The file's data as it is (out-of-core).
    AsIs,
    /// Written through the region first (far-memory: every row fills its
    /// set, which also warms the pool's fresh memory).
    Fill,
    /// Written first, and dropped from the store after (a Redis prefix
    /// made for this run).
    FillAndDrop,
}

/// Runs the pattern on a faultline region over `store`: its rate and CPU,
/// and what its faults cost.
fn faultline_side(
    a: &ChildArgs,
    len: usize,
    store: impl Store + 'static,
    set: Set,
) -> anyhow::Result<(Driven, Served)> {
    let mm = manager(a)?;
    let r = mm.map(len, store, MapOptions::new())?;
    if set != Set::AsIs {
        fill(r.addr(), len);
    }
    let fills_before = mm.stats().fills_store;
    let ops = drive(r.addr(), len, a);
    let misses = mm.stats().fills_store.saturating_sub(fills_before);
    let flush_ms = match set {
        Set::AsIs => flush_ms(&a.pattern, || Ok(r.flush()?))?,
        _ => None,
    };
    if let Some(e) = mm.take_error() {
        bail!("fault error: {e}");
    }
    let st = mm.stats();
    eprintln!("{st}");
    if set == Set::FillAndDrop {
        // A set made for this run (a fresh Redis prefix): drop it from the
        // store, so runs do not pile up in the server's memory.
        r.discard(0..len, faultline::Discard::Zero)?;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    let locks = st.locks;
    Ok((
        ops,
        Served {
            p50_us: us(st.service.p50_ns),
            p99_us: us(st.service.p99_ns),
            mean_us: st.service.mean_ns / 1000.0,
            store_read_p50_us: us(st.store_reads.p50_ns),
            store_read_p99_us: us(st.store_reads.p99_ns),
            store_read_mean_us: st.store_reads.mean_ns / 1000.0,
            reclaim_waits: st.reclaim_waits,
            lock_contended_pct: 100.0 * locks.contentions as f64 / locks.acquisitions.max(1) as f64,
            lock_wait_ms: locks.wait_ns as f64 / 1e6,
            spare_serves: st.spare_serves,
            flush_ms,
            misses: Some(misses),
        },
    ))
}

/// The child: waits for "go" on stdin, runs, prints JSON.
pub fn child(a: &ChildArgs) -> anyhow::Result<()> {
    let file_len = || Ok::<_, std::io::Error>(std::fs::metadata(&a.file)?.len() as usize);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let redis_opts = || RedisOptions::new(format!("bench{}", std::process::id()));
    let (driven, served) = match a.system.as_str() {
        "kernel" => kernel_file(a, file_len()?)?,
        "anon" => {
            // Anonymous memory: past the cgroup's limit the kernel swaps.
            let m = faultline_sys::mem::Mapping::anonymous(a.len, 4096)?;
            fill(m.addr(), a.len);
            let ops = drive(m.addr(), a.len, a);
            let served = Served {
                misses: ops.major_faults,
                ..Served::default()
            };
            (ops, served)
        }
        "redis" => faultline_side(
            a,
            a.len,
            Redis::connect(&a.url, redis_opts())?,
            Set::FillAndDrop,
        )?,
        "redis-cluster" => {
            let nodes: Vec<&str> = a.url.split(',').collect();
            faultline_side(
                a,
                a.len,
                RedisCluster::connect(&nodes, redis_opts())?,
                Set::FillAndDrop,
            )?
        }
        _ => {
            // Writable for every pattern, the read ones too, like the
            // kernel side's read-write shared mapping: a read-only store
            // would skip dirty tracking (fill fingerprints, the check at
            // eviction) and measure a cheaper path than the kernel's.
            let (direct, staged, poll) = match a.io.as_str() {
                "direct" => (true, true, true),
                "direct-unstaged" => (true, false, true),
                "direct-sleeping" => (true, true, false),
                "buffered" => (false, false, false),
                other => {
                    bail!("--io {other}: direct, direct-unstaged, direct-sleeping or buffered")
                }
            };
            let mut opts = FileOptions::new()
                .writable(true)
                .direct(direct)
                .staged(staged);
            if !poll {
                opts = opts.poll(std::time::Duration::ZERO);
            }
            let store = File::open(&a.file, opts)?;
            let set = if a.len > 0 { Set::Fill } else { Set::AsIs };
            faultline_side(a, file_len()?, store, set)?
        }
    };
    println!(
        "{}",
        json!({"ops_per_s": driven.ops_per_s, "cpu_us_per_op": driven.cpu_us_per_op,
            "server_cpu_us_per_op": driven.server_cpu_us_per_op,
            "max_rss_mib": vm_hwm_mib(),
            "fault_p50_us": served.p50_us, "fault_p99_us": served.p99_us,
            "fault_mean_us": served.mean_us,
            "store_read_p50_us": served.store_read_p50_us,
            "store_read_p99_us": served.store_read_p99_us,
            "store_read_mean_us": served.store_read_mean_us,
            "reclaim_waits": served.reclaim_waits,
            "lock_contended_pct": served.lock_contended_pct,
            "lock_wait_ms": served.lock_wait_ms, "spare_serves": served.spare_serves,
            "flush_ms": served.flush_ms, "poll_windows_pct": poll_windows_pct(),
            "misses_per_op": served.misses.filter(|_| driven.ops > 0)
                .map(|m| m as f64 / driven.ops as f64)})
    );
    Ok(())
}

/// The share of this process's 200 ms windows in which its reads were
/// allowed to poll (`faultline_sys::io::polling_windows`), in percent;
/// `None` where no read asked to poll.
fn poll_windows_pct() -> Option<f64> {
    let (allowing, all) = faultline_sys::io::polling_windows();
    (all > 0).then(|| 100.0 * allowing as f64 / all as f64)
}

/// The kernel's `mmap` of the file, with the row's hint: its rate and CPU,
/// and the time its `msync` took after a pattern that writes.
fn kernel_file(a: &ChildArgs, len: usize) -> anyhow::Result<(Driven, Served)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&a.file)?;
    let m = faultline_sys::mem::Mapping::shared_file(&f, len)?;
    if let Some(advice) = advice(&a.hint)? {
        m.advise(m.addr(), len, advice)?;
    }
    let ops = drive(m.addr(), len, a);
    let flush_ms = flush_ms(&a.pattern, || Ok(m.sync()?))?;
    Ok((
        ops,
        Served {
            flush_ms,
            misses: ops.major_faults,
            ..Served::default()
        },
    ))
}
