//! `faultline bench far-memory`: a working set 4x faultline's budget, 4 KiB
//! random and sequential reads and writes from 2 threads, every row in a
//! child inside a memory cgroup with the same limit (budget x 5/4 plus
//! faultline's metadata plus 4 MiB), page cache dropped first:
//! - faultline over a local file (the set written to the file first),
//! - faultline over one Redis server (faults served by workers, and again
//!   in the faulting threads) and over a 3-master + 3-replica Redis
//!   Cluster (servers on 127.0.0.1 the bench starts itself, or `--redis` /
//!   `--cluster`; each write-back acknowledged, on the cluster by a replica
//!   too), the set written through the region first (untimed),
//! - what a user would otherwise do to exceed RAM on one machine: anonymous
//!   memory the kernel swaps, to zram and to a swap file (the set written
//!   first, so it is in swap),
//! - and the raw Redis round trip (`raw.rs`) in the same run, so the Redis
//!   rows can be read against the store's own limit.
//!
//! Every row: `system`, `pattern`, `ops_per_s`, peak RSS, and for faultline
//! the fault service time (median, p99); the rows run by a child (faultline
//! and the kernel's swap) also `cpu_us_per_op`, the child's CPU per op over
//! the timed ops (the report's notes say what it holds), and faultline's
//! Redis rows on servers the bench started `server_cpu_us_per_op`, what those servers
//! used over the same ops; `vs_file` against the faultline-over-a-file row
//! of the same pattern.

mod raw;
mod swap;

use super::cgroup;
use super::out_of_core::run_args;
use super::{progress, BenchOpts};
use crate::report::Report;
use anyhow::Context;
use serde_json::json;
use std::path::PathBuf;

/// Options of `bench far-memory`.
#[derive(Debug, Clone, clap::Args)]
pub struct FarOpts {
    #[command(flatten)]
    pub common: BenchOpts,
    /// faultline's budget in MiB (default 16 with --quick, else 64); the
    /// working set is 4x.
    #[arg(long)]
    pub budget_mib: Option<usize>,
    /// A Redis server to use (default: one the bench starts).
    #[arg(long)]
    pub redis: Option<String>,
    /// A Redis Cluster's node URLs, comma-separated (default: a 3+3 cluster
    /// the bench starts).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Run only these patterns (default: random-read, random-write,
    /// seq-read, seq-write).
    #[arg(long = "pattern", value_parser = ["random-read", "random-write", "seq-read", "seq-write"])]
    pub patterns: Vec<String>,
}

/// Application threads of every run.
const THREADS: usize = 2;

/// Sizes and caps of one run.
struct Setup {
    budget: usize,
    len: usize,
    limit: usize,
    ops: usize,
    secs: f64,
    file: PathBuf,
    /// faultline's servers and CPUs as the command line set them.
    servers: Vec<String>,
}

impl Setup {
    fn new(o: &FarOpts) -> anyhow::Result<Setup> {
        let (mib, ops, secs) = if o.common.quick {
            (16, 20_000, 2.0)
        } else {
            (64, 200_000, 10.0)
        };
        let budget = (o.budget_mib.unwrap_or(mib).max(2) << 20).next_multiple_of(2 << 20);
        let len = 4 * budget;
        // The budget, faultline's metadata, and room for the process
        // itself (the Redis clients' reply buffers: an MGET of a 1 MiB
        // window per connection).
        let limit =
            (budget / 4 * 5 + len / 1024 + budget / 256 + (4 << 20)).next_multiple_of(1 << 20);
        let dir = std::env::var_os("FAULTLINE_BENCH_DIR")
            .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
        let file = dir.join(format!("faultline-far-{}.dat", std::process::id()));
        Ok(Setup {
            budget,
            len,
            limit,
            ops,
            secs,
            file,
            servers: o.common.child_args(),
        })
    }

    /// One row's child, faults served as `sys.mode` says (`workers` or
    /// `in-thread`; the kernel rows ignore it), the CPU of the servers
    /// `sys.pids` counted beside its own: its JSON line.
    fn child(&self, sys: &System, pattern: &str) -> anyhow::Result<serde_json::Value> {
        let (system, url, mode) = (sys.child, sys.url.as_str(), sys.mode);
        let file = self.file.display().to_string();
        let (len, run) = (
            self.len.to_string(),
            run_args(self.budget, THREADS, self.ops, self.secs, &self.servers),
        );
        let pids = sys
            .pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut args = vec![
            "--system",
            system,
            "--file",
            &file,
            "--url",
            url,
            "--pattern",
            pattern,
            "--len",
            &len,
            "--mode",
            mode,
        ];
        if !pids.is_empty() {
            args.extend(["--server-pids", &pids]);
        }
        args.extend(run.iter().map(String::as_str));
        cgroup::run_child(self.limit, &args)
    }
}

/// The servers the Redis rows use: given, or started here (and stopped
/// when this is dropped).
struct Servers {
    redis: String,
    cluster: String,
    /// The servers the bench started (none for a server given by URL,
    /// which may be on another machine): kept running for the rows, and
    /// their process ids counted beside each row's CPU.
    server: Option<redis_harness::Server>,
    cluster_nodes: Option<redis_harness::Cluster>,
}

impl Servers {
    fn new(o: &FarOpts) -> anyhow::Result<Servers> {
        let (server, redis) = match &o.redis {
            Some(u) => (None, u.clone()),
            None => {
                let s = redis_harness::Server::start().context("starting redis-server")?;
                let u = s.url();
                (Some(s), u)
            }
        };
        let (cl, cluster) = match &o.cluster {
            Some(u) => (None, u.clone()),
            None => {
                let c = redis_harness::Cluster::start(3, 1).context("starting a Redis Cluster")?;
                let u = c.urls().join(",");
                (Some(c), u)
            }
        };
        Ok(Servers {
            redis,
            cluster,
            server,
            cluster_nodes: cl,
        })
    }
}

/// One row of every pattern: the name it is reported under, the child's
/// `--system`, its Redis URL(s) and their local servers' process ids, and
/// who serves faultline's faults.
struct System {
    name: &'static str,
    child: &'static str,
    url: String,
    pids: Vec<u32>,
    mode: &'static str,
}

/// The systems of every pattern, in order. faultline's rows serve faults
/// with workers (the default), and the Redis server's row once more in the
/// faulting threads (`FaultMode::InThread`): no hand-off to a worker,
/// which on a guest whose idle vCPUs halt is a wake-up across CPUs.
fn systems(s: &Servers) -> [System; 6] {
    let system = |name, child, (url, pids): (&String, &Vec<u32>), mode| System {
        name,
        child,
        url: url.clone(),
        pids: pids.clone(),
        mode,
    };
    let none = (&String::new(), &Vec::new());
    let redis_pids = s
        .server
        .iter()
        .filter_map(redis_harness::Server::pid)
        .collect();
    let cluster_pids = s
        .cluster_nodes
        .as_ref()
        .map(redis_harness::Cluster::pids)
        .unwrap_or_default();
    let redis = (&s.redis, &redis_pids);
    let cluster = (&s.cluster, &cluster_pids);
    [
        system("faultline-file", "faultline", none, "workers"),
        system("faultline-redis", "redis", redis, "workers"),
        system("faultline-redis-in-thread", "redis", redis, "in-thread"),
        system(
            "faultline-redis-cluster",
            "redis-cluster",
            cluster,
            "workers",
        ),
        system("kernel-swap-zram", "anon", none, "workers"),
        system("kernel-swap-file", "anon", none, "workers"),
    ]
}

/// Runs one row; a kernel row turns its swap on around the child. `None`
/// with a note when it cannot run.
fn row(
    s: &Setup,
    sys: &System,
    pattern: &str,
    notes: &mut Vec<String>,
) -> anyhow::Result<Option<serde_json::Value>> {
    let system = sys.name;
    let swap_on = match system {
        "kernel-swap-zram" | "kernel-swap-file" => {
            match swap::Swap::on(system.ends_with("zram"), 2 * s.len) {
                Ok(sw) => Some(sw),
                Err(why) => {
                    notes.push(format!("{system} {pattern} skipped: {why}"));
                    return Ok(None);
                }
            }
        }
        _ => None,
    };
    match s.child(sys, pattern) {
        Ok(v) => Ok(Some(v)),
        // The kernel's own setup failing (its OOM killer in the cgroup,
        // when swap-out does not keep up) is a result, not a broken bench.
        Err(e) if swap_on.is_some() => {
            notes.push(format!(
                "{system} {pattern}: no figure, the run failed: {e:#}"
            ));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn push(report: &mut Report, system: &str, pattern: &str, v: &serde_json::Value, file_ops: f64) {
    let ops = v["ops_per_s"].as_f64().unwrap_or(0.0);
    let (p50, p99) = (v["fault_p50_us"].as_f64(), v["fault_p99_us"].as_f64());
    let faultline = system.starts_with("faultline");
    let vs = ops / file_ops;
    report.rows.push(
        json!({"system": system, "pattern": pattern, "threads": THREADS,
        "ops_per_s": ops, "cpu_us_per_op": v["cpu_us_per_op"],
        "server_cpu_us_per_op": v["server_cpu_us_per_op"], "max_rss_mib": v["max_rss_mib"],
        "misses_per_op": v["misses_per_op"], "cgroup_peak_mib": v["cgroup_peak_mib"],
        "fault_p50_us": if faultline { p50 } else { None },
        "fault_p99_us": if faultline { p99 } else { None },
        "vs_file": vs}),
    );
    let us = |x: Option<f64>| match (faultline, x) {
        (true, Some(x)) => format!("{x:.1}"),
        _ => "-".into(),
    };
    report.table.push(vec![
        system.into(),
        pattern.into(),
        format!("{ops:.0}"),
        v["misses_per_op"]
            .as_f64()
            .map_or_else(|| "-".into(), |m| format!("{m:.2}")),
        us(p50),
        us(p99),
        format!("{:.0}", v["max_rss_mib"].as_f64().unwrap_or(0.0)),
        format!("{vs:.2}x"),
    ]);
}

fn push_raw(report: &mut Report, r: &raw::RawRow) {
    report.rows.push(
        json!({"system": "redis-raw", "pattern": r.op, "threads": r.clients,
        "ops_per_s": r.pages_per_s, "pages_per_op": r.pages_per_op,
        "p50_us": r.us.median, "p99_us": r.us.p99, "min_us": r.us.min, "max_us": r.us.max}),
    );
    report.table.push(vec![
        "redis-raw".into(),
        r.op.clone(),
        format!("{:.0}", r.pages_per_s),
        format!("{:.1}", r.us.median),
        format!("{:.1}", r.us.p99),
        "-".into(),
        "-".into(),
    ]);
}

pub fn run(o: &FarOpts) -> anyhow::Result<Report> {
    let s = Setup::new(o)?;
    let servers = Servers::new(o)?;
    let mut report = Report::new(
        "far-memory",
        vec![
            "system",
            "pattern",
            "ops_per_s",
            "misses_per_op",
            "fault_p50_us",
            "fault_p99_us",
            "max_rss_mib",
            "vs_file",
        ],
    );
    report.config = json!({"budget_bytes": s.budget, "set_bytes": s.len,
        "memory_limit_bytes": s.limit, "threads": THREADS, "ops_per_thread": s.ops,
        "time_cap_s": s.secs, "redis": servers.redis, "cluster": servers.cluster});
    super::out_of_core::make_dataset(&s.file, s.len)?;
    let all = ["random-read", "random-write", "seq-read", "seq-write"];
    let patterns: Vec<&str> = match o.patterns.is_empty() {
        true => all.to_vec(),
        false => o.patterns.iter().map(String::as_str).collect(),
    };
    let result = run_rows(&s, &servers, &patterns, &mut report);
    let _ = std::fs::remove_file(&s.file);
    result?;
    for r in raw::measure(
        &servers.redis,
        if o.common.quick { 2000 } else { 20000 },
        THREADS,
    )? {
        push_raw(&mut report, &r);
    }
    notes(&s, &mut report);
    Ok(report)
}

fn run_rows(
    s: &Setup,
    servers: &Servers,
    patterns: &[&str],
    report: &mut Report,
) -> anyhow::Result<()> {
    let systems = systems(servers);
    let bar = progress((patterns.len() * systems.len()) as u64, "far-memory");
    for &pattern in patterns {
        let mut file_ops = f64::NAN;
        for system in &systems {
            let v = row(s, system, pattern, &mut report.notes);
            bar.inc(1);
            let Some(v) = v? else { continue };
            if system.name == "faultline-file" {
                file_ops = v["ops_per_s"].as_f64().unwrap_or(f64::NAN);
            }
            push(report, system.name, pattern, &v, file_ops);
        }
    }
    bar.finish_and_clear();
    Ok(())
}

fn notes(s: &Setup, report: &mut Report) {
    report.notes.push(format!(
        "working set {} MiB, faultline budget {} MiB, memory cgroup limit {} MiB for every row ({}, \
         page cache dropped first); {THREADS} threads x up to {} ops of 4 KiB (8 bytes of one page), \
         at most {} s a row; each row's set is written first (untimed): the file, the Redis keys \
         through the region, the anonymous memory into swap.",
        s.len >> 20,
        s.budget >> 20,
        s.limit >> 20,
        cgroup::hierarchy_name(),
        s.ops,
        s.secs
    ));
    report.notes.push(
        "kernel-swap-*: anonymous memory in the same cgroup, swapping to /dev/zram0 or to a swap file \
         (2x the set, priority 100, default swappiness); swap is turned off again after each row. \
         faultline-redis-cluster waits for one replica per write-back (WAIT 1). faultline rows serve \
         faults with workers (the default), faultline-redis-in-thread in the faulting threads \
         (FaultMode::InThread). fault_p50/p99_us: \
         faultline's fault service time. misses_per_op: the pages each row waited for per op, over the \
         timed ops (faultline: frames filled from its store; kernel: the process's major faults, swap-ins \
         from the device): what a row's memory kept resident, the same cgroup limit for all. cpu_us_per_op (JSON, faultline and kernel-swap rows): the row's \
         CPU time per op over the timed ops, every thread of its process with the kernel's work in their \
         system calls and faults (kswapd and the zram compression it does are not in it). \
         server_cpu_us_per_op (JSON, faultline's Redis rows on servers the bench started): the CPU time of the \
         row's Redis server processes (every node of the cluster) over the same ops, per op — on one \
         machine the servers share its CPUs with the program, where the kernel's swap has no such \
         process; a deployment puts them on other machines. redis-raw: \
         GET and MGET from one client thread, and GET from as many client threads at once as the \
         rows' threads (a connection each), in this run."
            .into(),
    );
    goals(report);
}

/// The far-memory goals, computed from this run's rows.
fn goals(report: &mut Report) {
    let find = |sys: &str, pat: &str, field: &str| {
        report
            .rows
            .iter()
            .find(|r| r["system"] == sys && r["pattern"] == pat)
            .and_then(|r| r[field].as_f64())
    };
    if let (Some(fault), Some(get)) = (
        find("faultline-redis", "random-read", "fault_p50_us"),
        find("redis-raw", &raw::get_op(1), "p50_us"),
    ) {
        let beside = find("redis-raw", &raw::get_op(THREADS), "p50_us")
            .map(|g| {
                format!(
                    "; {:.2}x the {g:.1} us of {THREADS} clients at once",
                    fault / g
                )
            })
            .unwrap_or_default();
        report.notes.push(format!(
            "goal: random 4 KiB read fault over Redis, median {fault:.1} us = {:.2}x the raw GET's \
             {get:.1} us from one client (goal <= 2x){beside}",
            fault / get
        ));
    }
    if let (Some(redis), Some(swap)) = (
        find("faultline-redis", "random-read", "ops_per_s"),
        find("kernel-swap-file", "random-read", "ops_per_s"),
    ) {
        let in_thread = find("faultline-redis-in-thread", "random-read", "ops_per_s")
            .map(|t| format!("; in-thread {t:.0} ops/s = {:.2}x", t / swap))
            .unwrap_or_default();
        report.notes.push(format!(
            "goal: random 4 KiB reads over Redis {redis:.0} ops/s = {:.2}x the kernel swapping the \
             same set to a file, {swap:.0} ops/s (goal >= 1.0x){in_thread}",
            redis / swap
        ));
    }
    if let (Some(redis), Some(file)) = (
        find("faultline-redis", "seq-read", "ops_per_s"),
        find("faultline-file", "seq-read", "ops_per_s"),
    ) {
        report.notes.push(format!(
            "goal: sequential read over Redis {redis:.0} ops/s = {:.0}% of the same run over a local \
             file, {file:.0} ops/s (goal >= 50%)",
            100.0 * redis / file
        ));
    }
}
