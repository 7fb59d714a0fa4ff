//! `faultline.Manager`: a faultline manager (frame pool under a budget,
//! fault workers) and the regions it maps — over a file (`map_file`, modes
//! `r`, `r+`, `w+` as `numpy.memmap`'s), zeros (`map_zero`), or pages kept
//! in Redis or a Redis Cluster (`map_redis`: far memory).
//!
//! Each manager runs an error watcher thread: it takes the manager's fault
//! errors as they are queued, keeps them for `errors()`, and publishes the
//! last one for the SIGBUS reporter (`sigbus.rs`). The thread holds a clone
//! of the manager; it stops within 100 ms once the Python object is
//! dropped. Locks: the error list's mutex (a leaf).

use crate::region::{Mapped, PyRegion};
use crate::{err, sigbus, size};
use faultline::store::{File, FileOptions, Redis, RedisCluster, RedisOptions, Zero};
use faultline::{MapOptions, PageSize};
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Removes the stats files of this process's managers that are still
/// there (`/dev/shm/faultline/<pid>-<n>`): run at interpreter exit
/// (`atexit`, registered by the package), since Python does not finalize
/// every object then and a manager that is never dropped never removes its
/// file (`faultline stat` would find it stale later). A manager still
/// alive keeps working; only its file goes.
#[pyfunction]
#[pyo3(name = "_remove_stats_files")]
pub(crate) fn remove_stats_files() {
    let ours = format!("{}-", std::process::id());
    let Ok(entries) = std::fs::read_dir(faultline::published::STATS_DIR) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&ours) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A faultline memory manager: `Manager(budget="256M", workers=2)`.
#[pyclass(frozen, name = "Manager", module = "faultline")]
pub struct PyManager {
    pub(crate) mm: faultline::Manager,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for PyManager {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// A new region's page size (default 4 KiB), its length (bytes or "64M",
/// not 0), and its span (the length rounded up to whole pages).
fn sized(
    length: &Bound<'_, PyAny>,
    page_size: Option<&Bound<'_, PyAny>>,
) -> PyResult<(PageSize, usize, usize)> {
    let page = match page_size {
        Some(p) => self::page_size(p)?,
        None => PageSize::Base4K,
    };
    let length = size::from_py(length)?;
    if length == 0 {
        return Err(PyValueError::new_err("cannot map 0 bytes"));
    }
    Ok((page, length, length.div_ceil(page.bytes()) * page.bytes()))
}

/// Parses a page size: `"4K"` (4096) or `"2M"`.
fn page_size(v: &Bound<'_, PyAny>) -> PyResult<PageSize> {
    match size::from_py(v)? {
        4096 => Ok(PageSize::Base4K),
        n if n == 2 << 20 => Ok(PageSize::Huge2M),
        n => Err(PyValueError::new_err(format!(
            "page_size is \"4K\" or \"2M\", not {n} bytes"
        ))),
    }
}

impl PyManager {
    /// Whether faults are served in the faulting thread.
    pub(crate) fn in_thread(&self) -> bool {
        self.mm.config().fault_mode == faultline::FaultMode::InThread
    }
}

/// Watches `mm`'s fault errors until `stop` (see the module doc).
fn watch(mm: faultline::Manager, errors: Arc<Mutex<Vec<String>>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        if let Some(e) = mm.next_error(Duration::from_millis(100)) {
            let msg = e.to_string();
            sigbus::record(e.addr().unwrap_or(0), &msg);
            errors.lock().push(msg);
        }
    }
}

#[pymethods]
impl PyManager {
    /// Starts a manager: `budget` bytes of frames (a multiple of 2 MiB; an
    /// int or "256M"), `workers` fault threads, and optionally the
    /// read-ahead window (`readahead_max`, 4 KiB pages), the share of the
    /// budget in 4 KiB frames without huge pages (`small_zone_pct`), and
    /// who serves faults (`fault_mode`): `"workers"` (the default: every
    /// access works, the kernel's own included) or `"in-thread"` (the
    /// faulting thread serves its own fault in faultline's SIGBUS handler:
    /// no hand-off to a worker, faster random access; the kernel's accesses
    /// to pages not yet in memory, such as `file.readinto(array)` or
    /// `array.tofile(file)`, fail with `EFAULT` unless the range is
    /// prefetched first).
    #[new]
    #[pyo3(signature = (budget = None, workers = 2, readahead_max = None, small_zone_pct = None, fault_mode = "workers"))]
    fn new(
        py: Python<'_>,
        budget: Option<&Bound<'_, PyAny>>,
        workers: usize,
        readahead_max: Option<usize>,
        small_zone_pct: Option<usize>,
        fault_mode: &str,
    ) -> PyResult<Self> {
        let budget = match budget {
            Some(b) => size::from_py(b)?,
            None => 256 << 20,
        };
        let mode = match fault_mode {
            "workers" => faultline::FaultMode::Workers,
            "in-thread" => faultline::FaultMode::InThread,
            m => {
                return Err(PyValueError::new_err(format!(
                    "fault_mode is \"workers\" or \"in-thread\", not {m:?}"
                )))
            }
        };
        let mut b = faultline::Manager::builder()
            .budget(budget)
            .workers(workers)
            .fault_mode(mode);
        if let Some(r) = readahead_max {
            b = b.readahead_max(r);
        }
        if let Some(p) = small_zone_pct {
            b = b.small_zone_pct(p);
        }
        let mm = py
            .allow_threads(move || b.build())
            .map_err(|e| err("cannot start a faultline manager", e))?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, e, s) = (mm.clone(), Arc::clone(&errors), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("faultline-py-errors".into())
            .spawn(move || watch(m, e, s))
            .map_err(|e| err("cannot start the error watcher thread", e))?;
        Ok(PyManager { mm, errors, stop })
    }

    /// Maps `length` bytes (default: to the end of the file) of the file at
    /// `path` from byte `offset`. `mode`: "r" read-only, "r+" read-write,
    /// "w+" create or truncate to `offset + length` bytes, read-write.
    /// `poll_us`: how long a thread waiting for a fault's read from the
    /// file polls for it before it sleeps (default: the library's, 200;
    /// 0: sleep at once).
    #[pyo3(signature = (path, mode = "r", offset = 0, length = None, page_size = None, poll_us = None))]
    fn map_file(
        slf: &Bound<'_, Self>,
        path: std::path::PathBuf,
        mode: &str,
        offset: u64,
        length: Option<&Bound<'_, PyAny>>,
        page_size: Option<&Bound<'_, PyAny>>,
        poll_us: Option<u64>,
    ) -> PyResult<PyRegion> {
        let page = match page_size {
            Some(p) => self::page_size(p)?,
            None => PageSize::Base4K,
        };
        let length = length.map(size::from_py).transpose()?;
        let shown = path.display();
        let (file, writable) = match mode {
            "r" | "r+" => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(mode == "r+")
                    .open(&path)
                    .map_err(|e| err(&format!("cannot open {shown}"), e))?;
                (f, mode == "r+")
            }
            "w+" => {
                let Some(len) = length else {
                    return Err(PyValueError::new_err("mode \"w+\" needs a length"));
                };
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)
                    .map_err(|e| err(&format!("cannot create {shown}"), e))?;
                f.set_len(offset + len as u64)
                    .map_err(|e| err(&format!("cannot size {shown}"), e))?;
                (f, true)
            }
            m => {
                return Err(PyValueError::new_err(format!(
                    "mode is \"r\", \"r+\" or \"w+\", not {m:?}"
                )))
            }
        };
        let file_len = file
            .metadata()
            .map_err(|e| err(&format!("cannot stat {shown}"), e))?
            .len();
        let length = match length {
            Some(l) => l,
            None if file_len > offset => (file_len - offset) as usize,
            None => {
                return Err(PyValueError::new_err(format!(
                    "{shown}: nothing to map at offset {offset} (the file has {file_len} bytes)"
                )))
            }
        };
        if length == 0 {
            return Err(PyValueError::new_err("cannot map 0 bytes"));
        }
        let span = length.div_ceil(page.bytes()) * page.bytes();
        // Pages past the end of the file read as zeros and a write-back
        // there would grow the file: cut it back to its length after each
        // write-back (region.rs).
        let end = file_len.max(offset + length as u64);
        let trim = if writable && end < offset + span as u64 {
            let keep = file
                .try_clone()
                .map_err(|e| err(&format!("cannot reopen {shown}"), e))?;
            Some((keep, end))
        } else {
            None
        };
        let mut file_opts = FileOptions::new().offset(offset).writable(writable);
        if let Some(us) = poll_us {
            file_opts = file_opts.poll(Duration::from_micros(us));
        }
        let store = File::from_file(file, file_opts);
        let opts = MapOptions::new().page_size(page);
        let me = slf.get();
        let what = format!("cannot map {shown}");
        let mapped = if writable {
            Mapped::Rw(me.mm.map(span, store, opts).map_err(|e| err(&what, e))?)
        } else {
            Mapped::Ro(
                me.mm
                    .map_read_only(span, store, opts)
                    .map_err(|e| err(&what, e))?,
            )
        };
        Ok(PyRegion::new(slf.clone().unbind(), mapped, length, trim))
    }

    /// Maps `length` bytes of zeros (memory under the budget; its pages are
    /// never written to a store, so they are not reclaimed).
    #[pyo3(signature = (length, page_size = None))]
    fn map_zero(
        slf: &Bound<'_, Self>,
        length: &Bound<'_, PyAny>,
        page_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRegion> {
        let (page, length, span) = sized(length, page_size)?;
        let r = slf
            .get()
            .mm
            .map(span, Zero, MapOptions::new().page_size(page))
            .map_err(|e| err("cannot map zeros", e))?;
        Ok(PyRegion::new(
            slf.clone().unbind(),
            Mapped::Rw(r),
            length,
            None,
        ))
    }

    /// Maps `length` bytes whose pages live in Redis, one key per page
    /// under `prefix` (missing keys read as zeros): `url` is one server's
    /// (`"redis://127.0.0.1:6379/"`) or a list of a cluster's nodes. A
    /// write-back counts once the server acknowledged it (on a cluster,
    /// once `replicas` replicas have it, default 1); a fault waits up to
    /// `retry_for` seconds for an unreachable server.
    #[pyo3(signature = (url, length, prefix, page_size = None, retry_for = 5.0, replicas = None))]
    fn map_redis(
        slf: &Bound<'_, Self>,
        url: &Bound<'_, PyAny>,
        length: &Bound<'_, PyAny>,
        prefix: &str,
        page_size: Option<&Bound<'_, PyAny>>,
        retry_for: f64,
        replicas: Option<usize>,
    ) -> PyResult<PyRegion> {
        let (page, length, span) = sized(length, page_size)?;
        if !(0.0..=86_400.0).contains(&retry_for) {
            return Err(PyValueError::new_err("retry_for is seconds, 0 to 86400"));
        }
        let mut opts = RedisOptions::new(prefix).retry_for(Duration::from_secs_f64(retry_for));
        if let Some(n) = replicas {
            opts = opts.replicas(n);
        }
        let map = MapOptions::new().page_size(page);
        let mm = &slf.get().mm;
        let what = "cannot map a region over Redis";
        let r = if let Ok(one) = url.extract::<String>() {
            let store = Redis::connect(&one, opts).map_err(|e| err(what, e))?;
            mm.map(span, store, map)
        } else {
            let nodes: Vec<String> = url.extract().map_err(|_| {
                PyValueError::new_err("url is a redis:// URL or a list of a cluster's node URLs")
            })?;
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
            let store = RedisCluster::connect(&nodes, opts).map_err(|e| err(what, e))?;
            mm.map(span, store, map)
        };
        let r = r.map_err(|e| err(what, e))?;
        Ok(PyRegion::new(
            slf.clone().unbind(),
            Mapped::Rw(r),
            length,
            None,
        ))
    }

    /// The manager's statistics as a dict (faults, evictions, write-backs,
    /// frames free, fault service latency, ...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let json = serde_json::to_string(&self.mm.stats())
            .map_err(|e| err("cannot encode the statistics", e))?;
        let v = py.import("json")?.call_method1("loads", (json,))?;
        Ok(v.downcast_into::<PyDict>()?)
    }

    /// The fault errors seen so far (messages, oldest first): faults that
    /// could not be served, whose threads got SIGBUS.
    fn errors(&self) -> Vec<String> {
        self.errors.lock().clone()
    }

    /// Changes the budget while the manager runs (bytes or "128M").
    fn set_budget(&self, py: Python<'_>, budget: &Bound<'_, PyAny>) -> PyResult<()> {
        let b = size::from_py(budget)?;
        py.allow_threads(|| self.mm.set_budget(b))
            .map_err(|e| err("cannot change the budget", e))
    }

    /// The budget in bytes.
    #[getter]
    fn budget(&self) -> usize {
        self.mm.stats().budget_frames * 4096
    }

    /// Who serves faults: `"workers"` or `"in-thread"`.
    #[getter]
    fn fault_mode(&self) -> &'static str {
        match self.mm.config().fault_mode {
            faultline::FaultMode::InThread => "in-thread",
            _ => "workers",
        }
    }

    /// The number of regions mapped.
    #[getter]
    fn regions(&self) -> usize {
        self.mm.regions()
    }

    fn __repr__(&self) -> String {
        format!(
            "faultline.Manager(budget={}, workers={}, fault_mode='{}', regions={})",
            self.budget(),
            self.mm.config().workers,
            self.fault_mode(),
            self.mm.regions()
        )
    }
}
