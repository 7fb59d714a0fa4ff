//! Live stats out of the process: each manager publishes its statistics in a
//! small shared-memory file, `/dev/shm/faultline/<pid>-<n>` ([`STATS_DIR`]),
//! which `faultline stat` reads ([`scan`]) with no help from the process.
//!
//! The file (version 1) is a 64-byte header of eight native-endian `u64`
//! words — magic, version, pid, manager number, the process's start time
//! (clock ticks after boot: with the pid it names one process), the field
//! count, the sequence word and a reserved word — then one 32-byte name per
//! field (NUL-padded; its last byte is the field's kind, see [`Kind`]),
//! then one `u64` value per field (an `f64`'s bits for kind `f`).
//! The names are written once, before the file gets its final name (it is
//! made under a temporary name and renamed), so a reader never sees a
//! partial header.
//!
//! Invariants: the values are written only by [`Publisher::publish`], under
//! a seqlock — the sequence word is odd while they change and even when
//! they are consistent; a reader copies them and keeps the copy only if the
//! sequence was the same even number before and after. The file is removed
//! when the publisher drops (the background reclaimer's thread owns it, so
//! when the manager drops); files whose process is gone are removed by the
//! next [`scan`].
//!
//! Nothing is added to the fault path: the publisher copies the counters
//! the fault path keeps anyway, from the background reclaimer's loop every
//! [`PERIOD`]. Locks: each worker's service-time histogram mutex in turn,
//! briefly (the merge), and those [`snapshot`] takes.

use crate::core::Core;
use crate::stats::{LatencySummary, StatsSnapshot};
use faultline_sys::mem::Mapping;
use faultline_sys::PAGE_SIZE;
use hdrhistogram::Histogram;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod figures;
mod read;

pub(crate) use figures::snapshot;
use figures::{activity, count_states, snapshot_with, Merged};
pub use read::{prometheus, read_file, scan, FieldValue, Published, PublishedError, Scan};

/// Where managers publish their stats files.
pub const STATS_DIR: &str = "/dev/shm/faultline";

/// How often the background reclaimer republishes.
pub(crate) const PERIOD: Duration = Duration::from_millis(250);

/// How often it republishes while nothing happens (no fault, reclaim or
/// write-back since the last publication): an idle manager stays idle.
pub(crate) const IDLE_PERIOD: Duration = Duration::from_secs(1);

const MAGIC: u64 = u64::from_le_bytes(*b"FLSTATS\0");
const VERSION: u64 = 1;
const HEADER_WORDS: usize = 8;
const NAME_BYTES: usize = 32;
/// Header word indices.
const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_PID: usize = 2;
const W_MANAGER: usize = 3;
const W_START: usize = 4;
const W_FIELDS: usize = 5;
const W_SEQ: usize = 6;

/// What a field is, stored in the last byte of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `c`: a count that only grows.
    Counter,
    /// `g`: a level now (frames, bytes, a latency in ns).
    Gauge,
    /// `f`: a level now, as the bits of an `f64`.
    Real,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Counter => b'c',
            Kind::Gauge => b'g',
            Kind::Real => b'f',
        }
    }

    fn of(b: u8) -> Option<Kind> {
        match b {
            b'c' => Some(Kind::Counter),
            b'g' => Some(Kind::Gauge),
            b'f' => Some(Kind::Real),
            _ => None,
        }
    }
}

/// The figures published besides the [`StatsSnapshot`].
#[derive(Debug, Clone, Copy, Default)]
struct Extra {
    published_unix_ns: u64,
    frames_resident: u64,
    frames_parked: u64,
    service_p90_ns: u64,
    service_p999_ns: u64,
    recent: LatencySummary,
}

/// The published fields, in file order: every field of the snapshot
/// (nested ones flattened with `_`, as their serde names), then the extras.
fn fields(s: &StatsSnapshot, x: &Extra) -> Vec<(&'static str, Kind, u64)> {
    use Kind::{Counter as C, Gauge as G};
    let mut v = vec![
        ("faults_4k", C, s.faults_4k),
        ("faults_2m", C, s.faults_2m),
        ("moves", C, s.moves),
        ("copies", C, s.copies),
        ("stale_dropped", C, s.stale_dropped),
        ("clean_dropped", C, s.clean_dropped),
        ("protection_lifted", C, s.protection_lifted),
        ("already_mapped", C, s.already_mapped),
        ("refaulted_dropped", C, s.refaulted_dropped),
        ("stray", C, s.stray),
        ("poisoned", C, s.poisoned),
        ("errors", C, s.errors),
        ("fills_cleared", C, s.fills_cleared),
        ("fills_prezeroed", C, s.fills_prezeroed),
        ("fills_store", C, s.fills_store),
        ("move_retries", C, s.move_retries),
        ("move_misreported", C, s.move_misreported),
        ("move_dropped", C, s.move_dropped),
        ("pt_discards", C, s.pt_discards),
        ("fault_around_pages", C, s.fault_around_pages),
        ("unmapped_pages", C, s.unmapped_pages),
        ("deferrals", C, s.deferrals),
        ("written_back", C, s.written_back),
        ("clean_skipped", C, s.clean_skipped),
        ("reclaim_waits", C, s.reclaim_waits),
        ("evicted", C, s.evicted),
        ("parked", C, s.parked),
        ("reclaim_held", C, s.reclaim_held),
        ("unparked", C, s.unparked),
        ("prezeroed_made", C, s.prezeroed_made),
        ("readaheads", C, s.readaheads),
        ("migrated_pages", C, s.migrated_pages),
        ("collapses", C, s.collapses),
        ("migrate_left_parked", C, s.migrate_left_parked),
        ("unmapped_by_program", C, s.unmapped_by_program),
        ("removed_by_program", C, s.removed_by_program),
        ("discarded", C, s.discarded),
        ("ballooned", C, s.ballooned),
        ("unballooned", C, s.unballooned),
        ("budget_frames", G, s.budget_frames as u64),
        ("frames_overhead", G, s.frames_overhead as u64),
        ("poison_retries", C, s.poison_retries),
        ("spare_serves", C, s.spare_serves),
        ("errors_dropped", C, s.errors_dropped),
        ("copy_chunks_helped", C, s.copy_chunks_helped),
        ("locks_acquisitions", C, s.locks.acquisitions),
        ("locks_contentions", C, s.locks.contentions),
        ("locks_wait_ns", C, s.locks.wait_ns),
        ("frames_total", G, s.frames_total as u64),
        ("frames_free", G, s.frames_free as u64),
        ("frames_prezeroed", G, s.frames_prezeroed as u64),
        ("metadata_bytes", G, s.metadata_bytes as u64),
    ];
    for (names, l) in SUMMARIES
        .iter()
        .zip([&s.service, &s.store_reads, &s.store_writes])
    {
        v.extend(summary_fields(names, l));
    }
    v.extend([
        ("published_unix_ns", G, x.published_unix_ns),
        ("frames_resident", G, x.frames_resident),
        ("frames_parked", G, x.frames_parked),
        ("service_p90_ns", G, x.service_p90_ns),
        ("service_p999_ns", G, x.service_p999_ns),
        ("recent_service_count", G, x.recent.count),
        ("recent_service_p50_ns", G, x.recent.p50_ns),
        ("recent_service_p99_ns", G, x.recent.p99_ns),
    ]);
    v
}

/// The names of the three latency summaries' fields: count, p50, p99,
/// max, mean.
const SUMMARIES: [[&str; 5]; 3] = [
    [
        "service_count",
        "service_p50_ns",
        "service_p99_ns",
        "service_max_ns",
        "service_mean_ns",
    ],
    [
        "store_reads_count",
        "store_reads_p50_ns",
        "store_reads_p99_ns",
        "store_reads_max_ns",
        "store_reads_mean_ns",
    ],
    [
        "store_writes_count",
        "store_writes_p50_ns",
        "store_writes_p99_ns",
        "store_writes_max_ns",
        "store_writes_mean_ns",
    ],
];

/// The five fields of a latency summary, named by `names`.
fn summary_fields(names: &[&'static str; 5], l: &LatencySummary) -> [(&'static str, Kind, u64); 5] {
    [
        (names[0], Kind::Counter, l.count),
        (names[1], Kind::Gauge, l.p50_ns),
        (names[2], Kind::Gauge, l.p99_ns),
        (names[3], Kind::Gauge, l.max_ns),
        (names[4], Kind::Real, l.mean_ns.to_bits()),
    ]
}

/// Managers made by this process so far (the `<n>` of the file name).
static MANAGERS: AtomicU32 = AtomicU32::new(0);

/// A number for a new manager of this process (its stats file's `<n>`).
pub(crate) fn next_number() -> u32 {
    MANAGERS.fetch_add(1, Ordering::Relaxed)
}

/// The manager's statistics in the Prometheus text format, computed now
/// (`Manager::prometheus_text`; labelled as its file would be).
pub(crate) fn prometheus_of(core: &Core, number: u32) -> String {
    let (snap, merged) = snapshot(core);
    let extra = extra_of(
        &Merged::of(0, merged),
        count_states(core),
        LatencySummary::default(),
    );
    let pid = faultline_sys::host::process_id();
    prometheus(&[Published::of(pid, number, fields(&snap, &extra))])
}

/// The figures published beside the snapshot's: tail percentiles of the
/// merged service times, frames `(resident, parked)`, the recent window's
/// summary.
fn extra_of(m: &Merged, states: (u64, u64), recent: LatencySummary) -> Extra {
    Extra {
        published_unix_ns: unix_ns(),
        frames_resident: states.0,
        frames_parked: states.1,
        service_p90_ns: m.p90,
        service_p999_ns: m.p999,
        recent,
    }
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One manager's stats file, mapped; see the module docs.
#[derive(Debug)]
pub(crate) struct Publisher {
    map: Mapping,
    path: PathBuf,
    fields: usize,
    /// The start of the recent window: when, and the merged service
    /// histogram's sample count and copy then.
    window: Option<(Instant, u64, Histogram<u64>)>,
    recent: LatencySummary,
    /// The page walk's result, and when it may run again (it is skipped
    /// while its last run cost more than 0.25% of the time since).
    states: (u64, u64),
    next_walk: Instant,
    /// The merged service times: merged again (and their percentiles
    /// taken) only when the sample count moved — the histograms only grow —
    /// so an idle manager's publication costs no merge.
    merged: Option<Merged>,
    /// [`activity`] at the last publication, and at the last page walk.
    activity: u64,
    walked: u64,
}

impl Publisher {
    /// The file it publishes in.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the file of manager `n` ([`next_number`]) in [`STATS_DIR`] and
    /// publishes once.
    pub(crate) fn create(core: &Core, n: u32) -> std::io::Result<Publisher> {
        use std::os::unix::fs::PermissionsExt;
        let dir = Path::new(STATS_DIR);
        if !dir.is_dir() {
            std::fs::create_dir_all(dir)?;
            // Any user's managers publish here (as in /tmp: sticky). Best
            // effort: another process may have made it first.
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
        }
        let pid = faultline_sys::host::process_id();
        let names = fields(&StatsSnapshot::default(), &Extra::default());
        let mut bytes = Vec::new();
        let start = faultline_sys::host::process_start_time(pid).unwrap_or(0);
        let fcount = names.len() as u64;
        for w in [MAGIC, VERSION, pid.into(), n.into(), start, fcount, 0, 0] {
            bytes.extend_from_slice(&w.to_ne_bytes());
        }
        for (name, kind, _) in &names {
            let mut slot = [0u8; NAME_BYTES];
            slot[..name.len()].copy_from_slice(name.as_bytes());
            slot[NAME_BYTES - 1] = kind.byte();
            bytes.extend_from_slice(&slot);
        }
        bytes.resize(bytes.len() + names.len() * 8, 0);
        let len = bytes.len().next_multiple_of(PAGE_SIZE);
        let path = dir.join(format!("{pid}-{n}"));
        let tmp = dir.join(format!(".{pid}-{n}.tmp"));
        let made = (|| -> std::io::Result<Mapping> {
            let file = std::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            (&file).write_all(&bytes)?;
            file.set_len(len as u64)?;
            let map = Mapping::shared_file(&file, len)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno))?;
            std::fs::rename(&tmp, &path)?;
            Ok(map)
        })();
        let map = made.inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        let mut p = Publisher {
            map,
            path,
            fields: names.len(),
            window: None,
            recent: LatencySummary::default(),
            states: (0, 0),
            next_walk: Instant::now(),
            merged: None,
            activity: u64::MAX,
            walked: u64::MAX,
        };
        p.publish_now(core, activity(core));
        Ok(p)
    }

    /// The mapping as words.
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page aligned (so 8-byte aligned), its
        // length a multiple of 8, and it stays mapped as long as `self`;
        // `AtomicU64` has the layout of `u64`, and every access to these
        // words in this process goes through the atomics (other processes
        // only read; one that wrote would change numbers, never memory
        // safety).
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.map.len() / 8)
        }
    }

    /// Publishes (see [`Publisher::publish_now`]) and returns when to
    /// publish next: [`PERIOD`] from now, or
    /// [`IDLE_PERIOD`] if the manager did nothing since the last time.
    pub(crate) fn publish(&mut self, core: &Core) -> Duration {
        let act = activity(core);
        let idle = act == self.activity;
        self.activity = act;
        self.publish_now(core, act);
        if idle {
            IDLE_PERIOD
        } else {
            PERIOD
        }
    }

    /// Copies the manager's statistics into the file, under the seqlock.
    /// Resident and parked pages are counted again if [`activity`] (`act`)
    /// moved since the last count and the walk's time budget allows: pages
    /// change state only through the counters it sums, so an idle
    /// manager's counts stand without a walk.
    fn publish_now(&mut self, core: &Core, act: u64) {
        // Counted before merging: a sample recorded meanwhile is merged
        // again next time.
        let count = core.stats.service_count();
        let m = match self.merged.take() {
            Some(m) if m.count == count => m,
            _ => Merged::of(count, core.stats.merged_service()),
        };
        let snap = snapshot_with(core, m.summary);
        let now = Instant::now();
        match &self.window {
            Some((at, _, _)) if now.duration_since(*at) < Duration::from_secs(1) => {}
            // Nothing recorded in the window: an empty summary, no copy.
            Some((_, n, _)) if *n == m.count => {
                self.recent = LatencySummary::default();
                self.window = self.window.take().map(|(_, n, h)| (now, n, h));
            }
            Some((_, _, old)) => {
                let mut recent = m.hist.clone();
                // Same bounds, and `old` is an earlier state: cannot fail.
                self.recent = match recent.subtract(old) {
                    Ok(()) => LatencySummary::of(&recent),
                    Err(_) => LatencySummary::default(),
                };
                self.window = Some((now, m.count, m.hist.clone()));
            }
            None => self.window = Some((now, m.count, m.hist.clone())),
        }
        if act != self.walked && now >= self.next_walk {
            self.walked = act;
            let t0 = Instant::now();
            self.states = count_states(core);
            self.next_walk = now + (t0.elapsed() * 400).max(PERIOD);
        }
        let extra = extra_of(&m, self.states, self.recent);
        let values = fields(&snap, &extra);
        self.merged = Some(m);
        let w = self.words();
        let base = HEADER_WORDS + self.fields * NAME_BYTES / 8;
        // Writers: this thread only. Odd while the values change.
        let seq = w[W_SEQ].load(Ordering::Relaxed);
        w[W_SEQ].store(seq.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (i, (_, _, v)) in values.iter().enumerate().take(self.fields) {
            w[base + i].store(*v, Ordering::Relaxed);
        }
        w[W_SEQ].store((seq | 1).wrapping_add(1), Ordering::Release);
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // A child of fork() has no publisher (the thread that owns it is
        // the parent's), so this is the owner: the file goes.
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_fit_their_slots_and_are_unique() {
        let f = fields(&StatsSnapshot::default(), &Extra::default());
        let mut names: Vec<&str> = f.iter().map(|x| x.0).collect();
        assert!(names.iter().all(|n| n.len() < NAME_BYTES), "{names:?}");
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), f.len(), "a name twice");
    }
}
