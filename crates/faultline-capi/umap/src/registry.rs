//! The process-wide manager and its regions, as Umap has one region
//! manager per process: started by the first `umap()`, it lives until the
//! process exits. Regions are kept by start address.
//!
//! Invariant: every region in the map is mapped and registered; a region
//! leaves the map only once it is closed (written back and unmapped), or
//! goes back in if closing failed. Locks: the one registry mutex, held for
//! each call's whole work (write-back and prefetch included: Umap callers
//! expect calls to be serialized); faults never take it.

use crate::config::UmapConfig;
use faultline::{FaultError, Manager, ReadOnly, Region, StoreError};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

/// A region, writable or not.
pub(crate) enum Mapped {
    /// `PROT_WRITE`: writes go back to the file.
    Rw(Region),
    /// Read-only.
    Ro(Region<ReadOnly>),
}

impl Mapped {
    pub(crate) fn range(&self) -> Range<usize> {
        let (a, l) = match self {
            Mapped::Rw(r) => (r.addr(), r.len()),
            Mapped::Ro(r) => (r.addr(), r.len()),
        };
        a..a + l
    }

    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        match self {
            Mapped::Rw(r) => r.flush(),
            Mapped::Ro(r) => r.flush(),
        }
    }

    /// Maps bytes `range` (offsets in the region) now.
    pub(crate) fn prefetch(&self, range: Range<usize>) -> Result<usize, FaultError> {
        match self {
            Mapped::Rw(r) => r.prefetch(range),
            Mapped::Ro(r) => r.prefetch(range),
        }
    }

    /// Maps bytes `range` now and keeps them in memory.
    pub(crate) fn pin(&self, range: Range<usize>) -> Result<usize, FaultError> {
        match self {
            Mapped::Rw(r) => r.pin(range),
            Mapped::Ro(r) => r.pin(range),
        }
    }

    /// Flushes and unmaps; hands the region back if the flush failed.
    pub(crate) fn close(self) -> Result<(), (Mapped, StoreError)> {
        match self {
            Mapped::Rw(r) => r.close().map_err(|(r, e)| (Mapped::Rw(r), e)),
            Mapped::Ro(r) => r.close().map_err(|(r, e)| (Mapped::Ro(r), e)),
        }
    }
}

/// The manager and its regions.
pub(crate) struct Registry {
    pub(crate) mm: Manager,
    pub(crate) regions: BTreeMap<usize, Mapped>,
}

impl Registry {
    /// The region holding `addr`, if any.
    pub(crate) fn find(&self, addr: usize) -> Option<&Mapped> {
        let (_, m) = self.regions.range(..=addr).next_back()?;
        m.range().contains(&addr).then_some(m)
    }
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// The registry, locked (a panic while it was held leaves it usable: its
/// map only changes by whole inserts and removes).
pub(crate) fn lock() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// The registry, starting the manager on first use (and the stats monitor
/// if `UMAP_MONITOR_FREQ` is set).
pub(crate) fn started<'g>(
    guard: &'g mut MutexGuard<'static, Option<Registry>>,
) -> Result<&'g mut Registry, String> {
    if guard.is_none() {
        let cfg = UmapConfig::get();
        log_to_stderr();
        let mm = faultline::ManagerBuilder::from_config(cfg.manager_config()?)
            .build()
            .map_err(|e| format!("cannot start faultline: {e}"))?;
        if cfg.monitor_secs > 0 {
            spawn_monitor(mm.clone(), cfg.monitor_secs);
        }
        remove_stats_at_exit(&mm);
        **guard = Some(Registry {
            mm,
            regions: BTreeMap::new(),
        });
    }
    guard
        .as_mut()
        .ok_or_else(|| "faultline did not start".into())
}

/// The process-wide manager's stats file, removed at exit.
static STATS_FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Removes the process-wide manager's stats file when the process exits
/// normally (`exit()` or a return from `main`): the manager lives until
/// then and is never dropped, so without this every Umap program left its
/// `/dev/shm/faultline/<pid>-0` behind. (Mappings are not written back at
/// exit, as with Umap: the program calls `uunmap` or `umap_flush`.)
fn remove_stats_at_exit(mm: &Manager) {
    let Some(path) = mm.stats_file() else {
        return;
    };
    if STATS_FILE.set(path.to_path_buf()).is_err() {
        return;
    }
    extern "C" fn at_exit() {
        // Nothing may unwind out of an atexit handler.
        let _ = std::panic::catch_unwind(|| {
            if let Some(p) = STATS_FILE.get() {
                let _ = std::fs::remove_file(p);
            }
        });
    }
    // SAFETY: registers a plain `extern "C" fn()` that touches only a
    // static and the file system; atexit has no other preconditions.
    if unsafe { libc::atexit(at_exit) } != 0 {
        eprintln!(
            "faultline: cannot remove {} at exit (atexit failed)",
            path.display()
        );
    }
}

/// Prints faultline's warnings (each fault error, as it is recorded: before
/// the faulting thread gets its SIGBUS) on stderr, as Umap prints its
/// errors; `FAULTLINE_LOG` (a `tracing` filter) changes the level. A
/// program that installed its own subscriber keeps it.
fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FAULTLINE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Prints the manager's stats on stderr every `secs` seconds, as Umap's
/// `UMAP_MONITOR_FREQ` does.
fn spawn_monitor(mm: Manager, secs: u64) {
    let period = std::time::Duration::from_secs(secs);
    let spawned = std::thread::Builder::new()
        .name("umap-monitor".into())
        .spawn(move || loop {
            std::thread::sleep(period);
            let s = mm.stats();
            eprintln!(
                "umap monitor (faultline): faults {} fills {} written back {} evicted {} \
                 frames free {}/{} service p50 {} ns p99 {} ns",
                s.faults(),
                s.fills_store,
                s.written_back,
                s.evicted,
                s.frames_free,
                s.frames_total,
                s.service.p50_ns,
                s.service.p99_ns
            );
            while let Some(e) = mm.take_error() {
                eprintln!("umap monitor (faultline): fault error: {e}");
            }
        });
    if let Err(e) = spawned {
        eprintln!("umap (faultline): UMAP_MONITOR_FREQ: no monitor thread: {e}");
    }
}
