//! The report of `bench preload`: the table, the JSON rows and
//! configuration, and the notes that say what was measured and how.

use super::{cgroup, mount_of, Bench, Measured, Sample, Setup, TARGET_S};
use crate::report::{Report, Summary};
use serde_json::json;
use std::path::{Path, PathBuf};

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// A ratio with three significant digits (0.0123, 0.123, 1.23, 12.3).
fn ratio(x: f64) -> String {
    let decimals = match x.abs() {
        x if x >= 10.0 => 1,
        x if x >= 1.0 => 2,
        x if x >= 0.1 => 3,
        _ => 4,
    };
    format!("{x:.decimals$}")
}

fn rate(s: &Sample) -> f64 {
    s.n as f64 / s.query_s.max(1e-3)
}

pub(super) fn report(b: &Bench, m: &Measured) -> Report {
    let mut report = Report::new(
        "preload",
        vec![
            "setup",
            "lookups",
            "lookups_per_s",
            "spread",
            "a_vs_this",
            "a_vs_spread",
            "query_s",
            "process_s",
            "cgroup_peak_mib",
            "cgroup_limit_mib",
        ],
    );
    let mut ratios = Vec::new();
    for (i, setup) in Setup::ALL.into_iter().enumerate() {
        let samples: Vec<&Sample> = m.rounds.iter().map(|r| &r[i]).collect();
        let r = Summary::of(&mut samples.iter().map(|s| rate(s)).collect::<Vec<_>>());
        let vs = Summary::of(
            &mut m
                .rounds
                .iter()
                .map(|r| rate(&r[0]) / rate(&r[i]))
                .collect::<Vec<_>>(),
        );
        let q = Summary::of(&mut samples.iter().map(|s| s.query_s).collect::<Vec<_>>());
        let p = Summary::of(&mut samples.iter().map(|s| s.process_s).collect::<Vec<_>>());
        let peaks: Vec<Option<f64>> = samples.iter().map(|s| s.peak.map(mib)).collect();
        let peak_max = peaks.iter().flatten().copied().fold(f64::NAN, f64::max);
        let reports: Vec<serde_json::Value> = samples
            .iter()
            .filter_map(|s| s.report.as_ref())
            .map(|r| r.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
            .collect();
        let n = samples.first().map_or(0, |s| s.n);
        report.rows.push(json!({
            "setup": setup.name(), "letter": setup.letter(),
            "lookups": n,
            "lookups_per_s": r.median, "lookups_per_s_min": r.min, "lookups_per_s_max": r.max,
            "lookups_per_s_runs": samples.iter().map(|s| rate(s)).collect::<Vec<_>>(),
            "preload_vs_this": vs.median, "preload_vs_this_min": vs.min, "preload_vs_this_max": vs.max,
            "query_s_runs": samples.iter().map(|s| s.query_s).collect::<Vec<_>>(),
            "process_s_runs": samples.iter().map(|s| s.process_s).collect::<Vec<_>>(),
            "cgroup_peak_mib": peak_max, "cgroup_peak_mib_runs": peaks,
            "cgroup_limit_mib": mib(m.limits[i]),
            "result": samples.first().map(|s| s.result.clone()),
            "command": samples.first().map(|s| s.command.clone()),
            "preload_report_runs": reports,
        }));
        report.table.push(vec![
            format!("{}: {}", setup.letter(), setup.name()),
            n.to_string(),
            format!("{:.0}", r.median),
            format!("{:.0}..{:.0}", r.min, r.max),
            format!("{}x", ratio(vs.median)),
            format!("{}..{}", ratio(vs.min), ratio(vs.max)),
            format!("{:.2}", q.median),
            format!("{:.2}", p.median),
            format!("{peak_max:.1}"),
            format!("{:.0}", mib(m.limits[i])),
        ]);
        if i > 0 {
            ratios.push(format!(
                "a/{} = {}x (rounds {}..{})",
                setup.letter(),
                ratio(vs.median),
                ratio(vs.min),
                ratio(vs.max)
            ));
        }
    }
    let ra = read_ahead_kb(&b.dir.0);
    let mount = mount_of(&b.dir.0);
    report.config = json!({
        "db_bytes": b.db_bytes, "db_rows": b.rows, "db_dir": b.dir.0.display().to_string(),
        "db_mount": mount.as_ref().map(|m| format!("{} ({})", m.0, m.1)),
        "read_ahead_kb": ra.as_ref().map(|r| r.1), "block_device": ra.as_ref().map(|r| r.0.clone()),
        "mmap_size": b.mmap_size, "budget_bytes": b.budget,
        "cgroup_limit_bytes": m.limits[0],
        "own_bytes": {"sqlite3": m.base.sqlite3, "sqlite_cache": m.base.sqlite_cache(b.budget),
            "preload": m.base.preload, "common": m.base.common(b.budget)},
        "sqlite_cache_heap_bytes": m.base.cache_heap,
        "preload_probe_peak_bytes": {"at_budget": m.base.at_budget, "at_twice_budget": m.base.at_twice},
        "runs": m.rounds.len(), "target_query_s": TARGET_S,
        "calibration": m.calibration.iter().map(|(s, r)| json!({"setup": s.name(), "lookups_per_s": r})).collect::<Vec<_>>(),
        "reference_results": m.references.iter().map(|(n, r)| json!({"lookups": n, "result": r})).collect::<Vec<_>>(),
        "sqlite3": b.sqlite.bin.display().to_string(), "sqlite3_version": b.sqlite.version,
        "preload": b.so_origin.display().to_string(), "preload_copy": b.so_stripped, "fault_mode": b.fault_mode, "query_plan": m.plan,
        "timing": "lookups_per_s = lookups / the query's `.timer on` real time; process_s: from exec to exit",
    });
    notes(b, m, &ratios, &mut report);
    report
}

fn notes(b: &Bench, m: &Measured, ratios: &[String], report: &mut Report) {
    let ra = read_ahead_kb(&b.dir.0).map_or("read-ahead unknown".into(), |(d, kb)| {
        format!("{d} read_ahead_kb {kb}")
    });
    let fs = mount_of(&b.dir.0).map_or("unknown".into(), |(s, fs)| format!("{s} {fs}"));
    report.notes.push(format!(
        "machine: {} x {} CPUs, kernel {}, {}; database on {fs}, {ra}.",
        faultline_sys::host::cpu_model(),
        faultline_sys::host::online_cpus(),
        faultline_sys::host::kernel_release(),
        cgroup::hierarchy_name(),
    ));
    report.notes.push(format!(
        "database: {} MiB ({} bytes), {} rows of t(k INTEGER PRIMARY KEY, v BLOB of 900..1099 random bytes), 4 KiB pages, \
         built by sqlite3 {} ({}) without the preload; mmap_size {} in a and b (the whole file; SQLite maps at most \
         0x7fff0000 bytes, hence a database just under 2 GiB).",
        b.db_bytes >> 20,
        b.db_bytes,
        b.rows,
        b.sqlite.version,
        b.sqlite.bin.display(),
        b.mmap_size
    ));
    let calib = if m.calibration.is_empty() {
        "the same number in every setup, given with --lookups".to_string()
    } else {
        format!(
            "each setup's number calibrated so that its query lasts about {TARGET_S} s: {}",
            m.calibration
                .iter()
                .map(|(s, r)| format!("{} {r:.0}/s", s.letter()))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    report.notes.push(format!(
        "workload: one sqlite3 process per run looks up n keys ({calib}), key i of 1..n a hash of i over 1..{} \
         (every run of n lookups looks up the same keys, and a run of fewer the first of them); plan: {}. \
         Every run printed the count|sum(length(v))|sum(instr(v, x'00')) that plain sqlite3 (no cgroup, no preload, \
         no mapping) prints for its n: {}. lookups_per_s = n / the query's own time (.timer on, \"Run Time: real\"); \
         process_s: the sqlite3 process from exec to exit (loading, opening, the preload's start and exit included).",
        b.rows,
        m.plan,
        m.references
            .iter()
            .filter(|(n, _)| *n > 1)
            .map(|(n, r)| format!("n={n}: {r}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    report.notes.push(format!(
        "memory: every run in a fresh memory cgroup ({}), page cache dropped before it (sync; echo 3 > drop_caches), \
         all with the same limit, {:.0} MiB: the budget ({} MiB) plus the largest of the setups' own memory beyond it \
         ({:.1} MiB); {} rounds run a, b, c side by side. Measured first, as cgroup peaks in a cgroup that limits nothing \
         (the larger of two tries): sqlite3 alone, one lookup (mmap off, its default cache): {:.1} MiB (b's own); \
         SQLite's heap with c's cache of -{} KiB full (.stats \"Memory Used\" max): {:.1} MiB, so c's own is {:.1} + {:.1} \
         = {:.1} MiB; sqlite3 under the preload, one lookup: {:.1} MiB with FAULTLINE_BUDGET={}M and {:.1} MiB with twice \
         that, so a's own is 2 x {:.1} - {:.1} = {:.1} MiB (the peak less what grows with the budget, which the preload \
         takes at start: its code, read around by the device's read-ahead, its threads and tables). A setup whose own \
         memory is less than the largest has the difference as room for page cache. cgroup_peak_mib: the most each \
         run's cgroup held.",
        cgroup::hierarchy_name(),
        mib(m.limits[0]),
        b.budget >> 20,
        mib(m.base.common(b.budget)),
        m.rounds.len(),
        mib(m.base.sqlite3),
        b.budget >> 10,
        mib(m.base.cache_heap),
        mib(m.base.sqlite3),
        mib(m.base.cache_heap.saturating_sub(b.budget)),
        mib(m.base.sqlite_cache(b.budget)),
        mib(m.base.at_budget),
        b.budget >> 20,
        mib(m.base.at_twice),
        mib(m.base.at_budget),
        mib(m.base.at_twice),
        mib(m.base.preload),
    ));
    report.notes.push(format!(
        "a: LD_PRELOAD={} (copied into the bench directory at the start: one build for every run; {}; \
         fault mode {}) FAULTLINE_FILES=<db> FAULTLINE_BUDGET={}M, mmap_size over the file; b: the same sqlite3 and mapping, \
         the kernel's mmap (SQLite gives no madvise hint: a fault reads around by up to the device's read-ahead), its page \
         cache held to the cgroup limit; c: mmap_size=0, cache_size=-{} ({} MiB of SQLite page cache), pages read with pread \
         through the page cache, the same cgroup limit.",
        b.so_origin.display(),
        b.so_stripped,
        b.fault_mode,
        b.budget >> 20,
        b.budget >> 10,
        b.budget >> 20
    ));
    report.notes.push(format!(
        "ratios (a's lookups/s over the other's, per round): {}.",
        ratios.join(", ")
    ));
    if let Some(r) = m.rounds.last().and_then(|r| r[0].report.as_ref()) {
        report.notes.push(format!(
            "the preload's report, last run: {}.",
            r.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    let short: Vec<String> = m
        .rounds
        .iter()
        .flatten()
        .zip(Setup::ALL.iter().cycle())
        .filter(|(s, _)| s.query_s < 1.5)
        .map(|(s, setup)| format!("{} {:.2} s", setup.letter(), s.query_s))
        .collect();
    if !short.is_empty() {
        report.notes.push(format!(
            "short runs (under 1.5 s, so less steady): {}.",
            short.join(", ")
        ));
    }
}

/// The read-ahead of the block device holding `dir`, in KiB (the
/// kernel's `mmap` reads around a fault by up to this much), and the
/// device's name.
fn read_ahead_kb(dir: &Path) -> Option<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let name = std::fs::canonicalize(&sys)
        .ok()?
        .file_name()?
        .to_string_lossy()
        .into_owned();
    ["queue/read_ahead_kb", "../queue/read_ahead_kb"]
        .iter()
        .find_map(|f| std::fs::read_to_string(sys.join(f)).ok())
        .and_then(|s| s.trim().parse().ok())
        .map(|kb| (name, kb))
}
