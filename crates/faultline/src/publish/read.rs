//! Reading stats files (the layout is in the parent module's docs): [`scan`]
//! lists the live managers' files and removes those of processes that are
//! gone; [`prometheus`] renders them in the Prometheus text format.
//!
//! A reader needs no help from the publishing process: it copies the file
//! (plain reads) and keeps the copy if the sequence word was the same even
//! number before and after (the seqlock; it retries otherwise). No locks.

use super::{Kind, HEADER_WORDS, MAGIC, NAME_BYTES, STATS_DIR, VERSION};
use super::{W_FIELDS, W_MAGIC, W_MANAGER, W_PID, W_SEQ, W_START, W_VERSION};
use std::fmt::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One published value.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum FieldValue {
    /// A count, or a level in frames, bytes or nanoseconds.
    Int(u64),
    /// A mean.
    Real(f64),
}

impl FieldValue {
    /// The value as a float.
    pub fn as_f64(self) -> f64 {
        match self {
            FieldValue::Int(v) => v as f64,
            FieldValue::Real(v) => v,
        }
    }
}

/// One manager's published statistics, as read from its file.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// The publishing process.
    pub pid: u32,
    /// The manager's number in its process (0 for the first one built).
    pub manager: u32,
    /// The file read.
    pub path: PathBuf,
    /// The process's start time (clock ticks after boot).
    start: u64,
    /// Name, kind and value of each field, in file order.
    fields: Vec<(String, Kind, FieldValue)>,
}

impl Published {
    /// A record of the fields given (for `Manager::prometheus_text`).
    pub(crate) fn of(pid: u32, manager: u32, fields: Vec<(&'static str, Kind, u64)>) -> Published {
        Published {
            pid,
            manager,
            path: PathBuf::new(),
            start: 0,
            fields: fields
                .into_iter()
                .map(|(n, k, v)| (n.to_string(), k, value(k, v)))
                .collect(),
        }
    }

    /// The value of field `name` (the [`crate::StatsSnapshot`] field names,
    /// nested ones joined with `_`, and a few more: `published_unix_ns`,
    /// `frames_resident`, `frames_parked`, `service_p90_ns`,
    /// `service_p999_ns`, `recent_service_{count,p50_ns,p99_ns}`).
    pub fn get(&self, name: &str) -> Option<FieldValue> {
        self.fields.iter().find(|f| f.0 == name).map(|f| f.2)
    }

    /// Every field, in file order.
    pub fn fields(&self) -> impl Iterator<Item = (&str, FieldValue)> {
        self.fields.iter().map(|(n, _, v)| (n.as_str(), *v))
    }

    /// Whether field `name` is a count that only grows (a rate makes sense).
    pub fn is_counter(&self, name: &str) -> bool {
        self.fields
            .iter()
            .any(|f| f.0 == name && f.1 == Kind::Counter)
    }
}

fn value(kind: Kind, raw: u64) -> FieldValue {
    match kind {
        Kind::Real => FieldValue::Real(f64::from_bits(raw)),
        _ => FieldValue::Int(raw),
    }
}

/// Why a stats file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PublishedError {
    /// Reading it failed.
    #[error("reading the stats file: {0}")]
    Io(#[from] std::io::Error),
    /// It is not a stats file of a version this reader knows.
    #[error("not a faultline stats file (version 1): {0}")]
    Format(&'static str),
    /// Its values kept changing under the reader.
    #[error("the stats file kept changing while read")]
    Busy,
}

fn word(bytes: &[u8], i: usize) -> Option<u64> {
    let b = bytes.get(i * 8..i * 8 + 8)?;
    Some(u64::from_ne_bytes(b.try_into().ok()?))
}

/// Reads one stats file (a consistent copy: see the module docs).
pub fn read_file(path: &Path) -> Result<Published, PublishedError> {
    let file = std::fs::File::open(path)?;
    for _ in 0..1000 {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut bytes)?;
        let w = |i| word(&bytes, i).ok_or(PublishedError::Format("short header"));
        if w(W_MAGIC)? != MAGIC || w(W_VERSION)? != VERSION {
            return Err(PublishedError::Format("bad magic or version"));
        }
        let seq = w(W_SEQ)?;
        let n = usize::try_from(w(W_FIELDS)?).map_err(|_| PublishedError::Format("fields"))?;
        let names_at = HEADER_WORDS * 8;
        let values_at = names_at + n * NAME_BYTES;
        if n > 4096 || bytes.len() < values_at + n * 8 {
            return Err(PublishedError::Format("short file"));
        }
        let mut again = [0u8; 8];
        file.read_exact_at(&mut again, (W_SEQ * 8) as u64)?;
        if seq % 2 == 1 || u64::from_ne_bytes(again) != seq {
            std::thread::yield_now();
            // Read from the start again.
            let mut f = &file;
            std::io::Seek::rewind(&mut f)?;
            continue;
        }
        let mut fields = Vec::with_capacity(n);
        for i in 0..n {
            let slot = &bytes[names_at + i * NAME_BYTES..names_at + (i + 1) * NAME_BYTES];
            let kind = Kind::of(slot[NAME_BYTES - 1]).ok_or(PublishedError::Format("kind"))?;
            let end = slot[..NAME_BYTES - 1]
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(NAME_BYTES - 1);
            let name = std::str::from_utf8(&slot[..end])
                .map_err(|_| PublishedError::Format("name"))?
                .to_string();
            let raw = word(&bytes, values_at / 8 + i).ok_or(PublishedError::Format("value"))?;
            fields.push((name, kind, value(kind, raw)));
        }
        return Ok(Published {
            pid: w(W_PID)? as u32,
            manager: w(W_MANAGER)? as u32,
            path: path.to_path_buf(),
            start: w(W_START)?,
            fields,
        });
    }
    Err(PublishedError::Busy)
}

/// What [`scan`] found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The live managers' statistics, by pid and manager number.
    pub live: Vec<Published>,
    /// Files of processes that are gone, removed.
    pub removed: Vec<PathBuf>,
    /// Files of live processes that could not be read, with why.
    pub unreadable: Vec<(PathBuf, PublishedError)>,
}

/// Reads the stats files of process `pid` (or of every process) in
/// [`STATS_DIR`]; removes those whose process is gone (no such pid, or the
/// pid now names a process started later).
pub fn scan(pid: Option<u32>) -> std::io::Result<Scan> {
    scan_in(Path::new(STATS_DIR), pid)
}

fn scan_in(dir: &Path, pid: Option<u32>) -> std::io::Result<Scan> {
    let mut out = Scan::default();
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        r => r?,
    };
    for e in entries {
        let path = e?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // `<pid>-<n>`, or `.<pid>-<n>.tmp` while being made.
        let tmp = name.starts_with('.') && name.ends_with(".tmp");
        let bare = name.trim_start_matches('.').trim_end_matches(".tmp");
        let Some(owner) = bare.split_once('-').and_then(|(p, n)| {
            n.parse::<u32>().ok()?;
            p.parse::<u32>().ok()
        }) else {
            continue;
        };
        if pid.is_some_and(|p| p != owner) {
            continue;
        }
        let started = faultline_sys::host::process_start_time(owner);
        let gone = |out: &mut Scan| {
            if std::fs::remove_file(&path).is_ok() {
                out.removed.push(path.clone());
            }
        };
        if tmp {
            if started.is_none() {
                gone(&mut out);
            }
            continue;
        }
        match read_file(&path) {
            Ok(p) if started.is_some_and(|s| s == p.start || p.start == 0) && p.pid == owner => {
                out.live.push(p)
            }
            Ok(_) => gone(&mut out),
            Err(_) if started.is_none() => gone(&mut out),
            Err(e) => out.unreadable.push((path.clone(), e)),
        }
    }
    out.live.sort_by_key(|p| (p.pid, p.manager));
    Ok(out)
}

/// How one field appears in the Prometheus text: the sample
/// `<family><suffix>{labels}` of a family of type `ty`, the value times
/// `scale` (to bytes or seconds).
struct Metric {
    family: String,
    suffix: &'static str,
    ty: &'static str,
    label: String,
    scale: f64,
}

const NS: f64 = 1e-9;
const FRAME: f64 = 4096.0;

impl Metric {
    /// A sample of family `family`, unlabelled beyond pid and manager.
    fn plain(family: &str, ty: &'static str, scale: f64) -> Option<Metric> {
        Some(Metric {
            family: family.to_string(),
            suffix: "",
            ty,
            label: String::new(),
            scale,
        })
    }
}

/// The metric of field `name`; `None` for the summaries' means (they go
/// into the `_sum` samples).
fn metric(name: &str, kind: Kind) -> Option<Metric> {
    if let Some(m) = summary_metric(name) {
        return m;
    }
    match name {
        "faults_4k" | "faults_2m" => Some(Metric {
            label: format!("page=\"{}\"", &name[7..]),
            ..Metric::plain("faultline_faults_total", "counter", 1.0)?
        }),
        "recent_service_count" => {
            Metric::plain("faultline_recent_fault_service_count", "gauge", 1.0)
        }
        "published_unix_ns" => Metric::plain("faultline_published_timestamp_seconds", "gauge", NS),
        "locks_wait_ns" => Metric::plain("faultline_lock_wait_seconds_total", "counter", NS),
        "budget_frames" => Metric::plain("faultline_budget_bytes", "gauge", FRAME),
        "frames_total" => Metric::plain("faultline_pool_bytes", "gauge", FRAME),
        n if n.starts_with("frames_") => {
            Metric::plain(&format!("faultline_{}_bytes", &n[7..]), "gauge", FRAME)
        }
        n if n.ends_with("_ns") => Metric::plain(
            &format!("faultline_{}_seconds", &n[..n.len() - 3]),
            "gauge",
            NS,
        ),
        n if kind == Kind::Counter => {
            Metric::plain(&format!("faultline_{n}_total"), "counter", 1.0)
        }
        n => Metric::plain(&format!("faultline_{n}"), "gauge", 1.0),
    }
}

/// The metric of a latency summary's field (`Some(None)`: its mean, which
/// goes into `_sum`); `None` if `name` is not one.
fn summary_metric(name: &str) -> Option<Option<Metric>> {
    let (stat, family) = [
        ("service_", "faultline_fault_service_seconds"),
        ("store_reads_", "faultline_store_read_seconds"),
        ("store_writes_", "faultline_store_write_seconds"),
    ]
    .iter()
    .find_map(|(prefix, family)| Some((name.strip_prefix(prefix)?, *family)))?;
    let q = match stat {
        "p50_ns" => "0.5",
        "p90_ns" => "0.9",
        "p99_ns" => "0.99",
        "p999_ns" => "0.999",
        "count" => {
            return Some(Some(Metric {
                suffix: "_count",
                ..Metric::plain(family, "summary", 1.0)?
            }))
        }
        "max_ns" => {
            let max = family.replace("_seconds", "_max_seconds");
            return Some(Metric::plain(&max, "gauge", NS));
        }
        _ => return Some(None),
    };
    Some(Some(Metric {
        label: format!("quantile=\"{q}\""),
        ..Metric::plain(family, "summary", NS)?
    }))
}

/// The managers' statistics in the Prometheus text format (version 0.0.4):
/// counters `faultline_<name>_total` (`faultline_faults_total` by page
/// size), levels in bytes and seconds, and the latencies as summaries
/// (`faultline_fault_service_seconds`, `faultline_store_read_seconds`,
/// `faultline_store_write_seconds` with `quantile` labels, `_sum` and
/// `_count`). Each sample is labelled with `pid` and `manager`.
pub fn prometheus(list: &[Published]) -> String {
    // family -> (type, samples); in first-seen order.
    let mut families: Vec<(String, &'static str, Vec<String>)> = Vec::new();
    let mut add = |family: String, ty: &'static str, line: String| match families
        .iter_mut()
        .find(|f| f.0 == family)
    {
        Some(f) => f.2.push(line),
        None => families.push((family, ty, vec![line])),
    };
    for p in list {
        let base = format!("pid=\"{}\",manager=\"{}\"", p.pid, p.manager);
        for (name, kind, v) in &p.fields {
            let Some(m) = metric(name, *kind) else {
                continue;
            };
            let labels = if m.label.is_empty() {
                base.clone()
            } else {
                format!("{base},{}", m.label)
            };
            let line = format!(
                "{}{}{{{labels}}} {}",
                m.family,
                m.suffix,
                v.as_f64() * m.scale
            );
            add(m.family, m.ty, line);
        }
        for (summary, prefix) in [
            ("faultline_fault_service_seconds", "service"),
            ("faultline_store_read_seconds", "store_reads"),
            ("faultline_store_write_seconds", "store_writes"),
        ] {
            let count = p
                .get(&format!("{prefix}_count"))
                .map_or(0.0, FieldValue::as_f64);
            let mean = p
                .get(&format!("{prefix}_mean_ns"))
                .map_or(0.0, FieldValue::as_f64);
            add(
                summary.into(),
                "summary",
                format!("{summary}_sum{{{base}}} {}", count * mean * 1e-9),
            );
        }
    }
    let mut out = String::new();
    for (family, ty, lines) in families {
        let _ = writeln!(out, "# TYPE {family} {ty}");
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_names_follow_the_conventions() {
        let p = Published::of(
            7,
            0,
            vec![
                ("faults_4k", Kind::Counter, 3),
                ("faults_2m", Kind::Counter, 2),
                ("frames_free", Kind::Gauge, 2),
                ("service_count", Kind::Counter, 5),
                ("service_p50_ns", Kind::Gauge, 1500),
                ("service_mean_ns", Kind::Real, 2000f64.to_bits()),
            ],
        );
        let t = prometheus(&[p]);
        assert!(t.contains("# TYPE faultline_faults_total counter\n"), "{t}");
        assert!(
            t.contains("faultline_faults_total{pid=\"7\",manager=\"0\",page=\"4k\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("faultline_free_bytes{pid=\"7\",manager=\"0\"} 8192\n"),
            "{t}"
        );
        assert!(t.contains("faultline_fault_service_seconds{pid=\"7\",manager=\"0\",quantile=\"0.5\"} 0.0000015\n"), "{t}");
        assert!(
            t.contains("faultline_fault_service_seconds_count{pid=\"7\",manager=\"0\"} 5\n"),
            "{t}"
        );
        assert!(
            t.contains("faultline_fault_service_seconds_sum{pid=\"7\",manager=\"0\"} 0.00001\n"),
            "{t}"
        );
        assert_eq!(
            t.matches("# TYPE faultline_fault_service_seconds summary")
                .count(),
            1,
            "{t}"
        );
    }

    #[test]
    fn a_file_of_a_dead_process_is_removed() {
        let dir =
            std::env::temp_dir().join(format!("faultline-issue21-scan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A pid above the kernel's pid_max limit (2^22) is never alive.
        let stale = dir.join("4999999-0");
        std::fs::write(&stale, b"whatever").unwrap();
        std::fs::write(dir.join("notes.txt"), b"not ours").unwrap();
        let s = scan_in(&dir, None).unwrap();
        assert!(s.live.is_empty());
        assert_eq!(s.removed, vec![stale.clone()]);
        assert!(!stale.exists());
        assert!(dir.join("notes.txt").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
