//! `faultline stat [<pid>] [interval] [count]`: a `vmstat`-style line per
//! interval for every manager of a process (or of every process), read from
//! the stats files the managers publish (`faultline::published`); `--json`
//! and `--prometheus` for machines. Files of processes that are gone are
//! removed on the way.

use anyhow::bail;
use faultline::published::{self, FieldValue, Published};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct StatOpts {
    /// The process to watch (default: every process with a manager).
    pub pid: Option<u32>,
    /// Seconds between reports (default: one report).
    pub interval: Option<f64>,
    /// Reports to print (default: until interrupted, with an interval).
    pub count: Option<u64>,
    /// One JSON object per report: every field of every manager, and the
    /// rates over the interval.
    #[arg(long)]
    pub json: bool,
    /// The Prometheus text format.
    #[arg(long, conflicts_with = "json")]
    pub prometheus: bool,
}

fn f(p: &Published, name: &str) -> f64 {
    p.get(name).map_or(0.0, FieldValue::as_f64)
}

/// Reads the managers' files now (removing stale ones).
fn sample(pid: Option<u32>) -> anyhow::Result<Vec<Published>> {
    let s = published::scan(pid)?;
    // One line, however many: a crashed program's files are housekeeping.
    match s.removed.as_slice() {
        [] => {}
        [one] => eprintln!(
            "faultline stat: removed {} (its process is gone)",
            one.display()
        ),
        many => eprintln!(
            "faultline stat: removed {} stats files of processes that are gone",
            many.len()
        ),
    }
    for (path, e) in &s.unreadable {
        eprintln!("faultline stat: {}: {e}", path.display());
    }
    Ok(s.live)
}

/// Per-second rates of `now` against `then`, by the publisher's clock.
struct Rates<'a> {
    now: &'a Published,
    then: Option<&'a Published>,
    secs: f64,
}

impl<'a> Rates<'a> {
    fn new(now: &'a Published, then: Option<&'a Published>) -> Rates<'a> {
        let secs = then.map_or(0.0, |t| {
            (f(now, "published_unix_ns") - f(t, "published_unix_ns")) / 1e9
        });
        Rates { now, then, secs }
    }

    fn delta(&self, name: &str) -> f64 {
        f(self.now, name) - self.then.map_or(0.0, |t| f(t, name))
    }

    /// Per second over the interval (0 when nothing was published since).
    fn per_s(&self, name: &str) -> f64 {
        if self.secs > 0.0 {
            self.delta(name) / self.secs
        } else {
            0.0
        }
    }

    /// Mean latency (µs) of the calls summarized as `<prefix>_*` during the
    /// interval (over the whole run without a previous sample).
    fn mean_us(&self, prefix: &str) -> Option<f64> {
        let sum =
            |p: &Published| f(p, &format!("{prefix}_mean_ns")) * f(p, &format!("{prefix}_count"));
        let n = self.delta(&format!("{prefix}_count"));
        let s = sum(self.now) - self.then.map_or(0.0, sum);
        (n > 0.0).then(|| s / n / 1e3)
    }
}

const HEADER: [&str; 18] = [
    "manager",
    "faults/s",
    "p50us",
    "p99us",
    "resMiB",
    "parkMiB",
    "freeMiB",
    "budgetMiB",
    "park/s",
    "evict/s",
    "wback/s",
    "rahead/s",
    "sread/s",
    "sread-us",
    "swrite/s",
    "swrite-us",
    "migr/s",
    "errors",
];

fn line(r: &Rates) -> Vec<String> {
    let p = r.now;
    let mib = |name: &str| format!("{:.0}", f(p, name) * 4096.0 / (1 << 20) as f64);
    let rate = |name: &str| format!("{:.0}", r.per_s(name));
    let recent = f(p, "recent_service_count") > 0.0;
    let lat = |name: &str| {
        if recent {
            format!("{:.1}", f(p, name) / 1e3)
        } else {
            "-".into()
        }
    };
    let mean = |prefix: &str| r.mean_us(prefix).map_or("-".into(), |v| format!("{v:.1}"));
    let faults = r.per_s("faults_4k") + r.per_s("faults_2m");
    vec![
        format!("{}-{}", p.pid, p.manager),
        format!("{faults:.0}"),
        lat("recent_service_p50_ns"),
        lat("recent_service_p99_ns"),
        mib("frames_resident"),
        mib("frames_parked"),
        mib("frames_free"),
        mib("budget_frames"),
        rate("parked"),
        rate("evicted"),
        rate("written_back"),
        rate("readaheads"),
        rate("store_reads_count"),
        mean("store_reads"),
        rate("store_writes_count"),
        mean("store_writes"),
        rate("migrated_pages"),
        format!("{:.0}", f(p, "errors")),
    ]
}

/// Cells right-aligned in fixed widths, so lines of every interval align.
fn fixed(cells: Vec<String>) -> String {
    cells
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let w = if i == 0 { 12 } else { HEADER[i].len().max(7) };
            format!("{c:>w$}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn json_of(r: &Rates) -> Value {
    let p = r.now;
    let fields: Map<String, Value> = p
        .fields()
        .map(|(n, v)| {
            (
                n.to_string(),
                serde_json::to_value(v).unwrap_or(Value::Null),
            )
        })
        .collect();
    let mut rates = Map::new();
    if r.then.is_some() {
        for (n, _) in p.fields().filter(|(n, _)| p.is_counter(n)) {
            rates.insert(format!("{n}_per_s"), json!(r.per_s(n)));
        }
    }
    json!({"pid": p.pid, "manager": p.manager, "interval_s": r.secs,
        "fields": fields, "rates": rates})
}

pub fn run(o: &StatOpts) -> anyhow::Result<()> {
    let interval = o.interval.map(Duration::from_secs_f64);
    let count = match (o.count, interval) {
        (Some(c), _) => c,
        (None, None) => 1,
        (None, Some(_)) => u64::MAX,
    };
    let mut prev: HashMap<std::path::PathBuf, Published> = HashMap::new();
    // A one-shot table shows rates over one second.
    let table_once = interval.is_none() && !o.json && !o.prometheus;
    if table_once {
        prev = sample(o.pid)?
            .into_iter()
            .map(|p| (p.path.clone(), p))
            .collect();
        std::thread::sleep(Duration::from_secs(1));
    } else if !o.json && !o.prometheus {
        // The first line covers the first interval.
        prev = sample(o.pid)?
            .into_iter()
            .map(|p| (p.path.clone(), p))
            .collect();
        std::thread::sleep(interval.unwrap_or_default());
    }
    let mut printed = 0u64;
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(interval.unwrap_or_default());
        }
        let now = sample(o.pid)?;
        if now.is_empty() {
            match o.pid {
                Some(p) => bail!(
                    "process {p} publishes no faultline stats (no manager, or publish_stats off)"
                ),
                None => bail!(
                    "no process publishes faultline stats in {}",
                    published::STATS_DIR
                ),
            }
        }
        if o.prometheus {
            print!("{}", published::prometheus(&now));
        } else if o.json {
            let managers: Vec<Value> = now
                .iter()
                .map(|p| json_of(&Rates::new(p, prev.get(&p.path))))
                .collect();
            println!("{}", json!({ "managers": managers }));
        } else {
            if printed % 20 == 0 {
                println!("{}", fixed(HEADER.iter().map(|h| h.to_string()).collect()));
            }
            for p in &now {
                println!("{}", fixed(line(&Rates::new(p, prev.get(&p.path)))));
                printed += 1;
            }
        }
        prev = now.into_iter().map(|p| (p.path.clone(), p)).collect();
    }
    Ok(())
}
