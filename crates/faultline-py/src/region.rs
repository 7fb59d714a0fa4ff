//! `faultline.Region`: one mapped region, exporting the buffer protocol
//! over its memory (zero-copy: `np.frombuffer(region, dtype)` and
//! `memoryview(region)` point at the region's pages), writable only when
//! the region is.
//!
//! Invariants: the mapping stays mapped while any buffer view is exported
//! (`close` raises `BufferError` then, as `mmap.close` does, and the view
//! holds a reference to the region object, so it is not deallocated
//! either); the Python region holds its Python manager. A file region whose
//! last page runs past the end of the file cuts the file back to its length
//! after every flush and at close (a write-back writes whole pages).
//!
//! Locks: `state` (an `RwLock`): read to take a clone of the mapping or to
//! export a view (counted in `exports` under it), write to close. No call
//! that can block on faults, I/O or the GIL runs under it: long calls run
//! on a clone of the `Arc` with the GIL released.

use crate::manager::PyManager;
use crate::{err, sigbus};
use faultline::{AccessPattern, ReadOnly, Region};
use parking_lot::RwLock;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// `True`/`False`, as Python spells them.
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// A faultline region of either access mode.
pub(crate) enum Mapped {
    /// Read-write (a writable file, or zeros).
    Rw(Region),
    /// Read-only (a file opened with mode "r").
    Ro(Region<ReadOnly>),
}

/// Runs `$body` with `$r` bound to the region, whatever its mode.
macro_rules! with {
    ($m:expr, $r:ident => $body:expr) => {
        match $m {
            Mapped::Rw($r) => $body,
            Mapped::Ro($r) => $body,
        }
    };
}

/// A mapped region: `mm.map_file(..)`, `mm.map_zero(..)`.
#[pyclass(frozen, name = "Region", module = "faultline")]
pub struct PyRegion {
    state: RwLock<Option<Arc<Mapped>>>,
    exports: AtomicUsize,
    manager: Py<PyManager>,
    /// Bytes the program sees (the region itself is whole pages).
    len: usize,
    addr: usize,
    writable: bool,
    slot: Option<usize>,
    /// The file and the length to cut it back to (see the module doc).
    trim: Option<(std::fs::File, u64)>,
}

impl PyRegion {
    pub(crate) fn new(
        manager: Py<PyManager>,
        mapped: Mapped,
        len: usize,
        trim: Option<(std::fs::File, u64)>,
    ) -> PyRegion {
        let (addr, span) = with!(&mapped, r => (r.addr(), r.len()));
        let writable = matches!(mapped, Mapped::Rw(_));
        // In-thread managers' unserved faults are reported by faultline's
        // own handler, which runs first: the reporter speaks for the
        // others only (one line per fault, not two).
        let in_thread = manager.get().in_thread();
        let slot = if in_thread {
            None
        } else {
            sigbus::register(addr, addr + span)
        };
        PyRegion {
            state: RwLock::new(Some(Arc::new(mapped))),
            exports: AtomicUsize::new(0),
            manager,
            len,
            addr,
            writable,
            slot,
            trim,
        }
    }

    /// The mapping, or `ValueError` once closed.
    fn mapped(&self) -> PyResult<Arc<Mapped>> {
        self.state
            .read()
            .clone()
            .ok_or_else(|| PyValueError::new_err("the region is closed"))
    }

    /// Cuts the file back to its length (see the module doc).
    fn trim(&self) -> PyResult<()> {
        if let Some((f, end)) = &self.trim {
            let now = f
                .metadata()
                .map_err(|e| err("cannot stat the region's file", e))?
                .len();
            if now > *end {
                f.set_len(*end)
                    .map_err(|e| err("cannot cut the region's file back", e))?;
            }
        }
        Ok(())
    }

    /// Checks `start..stop` against the visible length.
    fn range(&self, start: usize, stop: Option<usize>) -> PyResult<std::ops::Range<usize>> {
        let stop = stop.unwrap_or(self.len);
        if start > stop || stop > self.len {
            return Err(PyValueError::new_err(format!(
                "range {start}..{stop} is not inside the region's {} bytes",
                self.len
            )));
        }
        Ok(start..stop)
    }
}

impl Drop for PyRegion {
    fn drop(&mut self) {
        // Dropping the last handle writes back (errors queued to the
        // manager: Manager.errors()) and unmaps.
        drop(self.state.write().take());
        if let Some(slot) = self.slot {
            sigbus::unregister(slot);
        }
        let _ = self.trim();
    }
}

#[pymethods]
impl PyRegion {
    /// Writes dirty pages back to the file and `fsync`s it.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let m = self.mapped()?;
        py.allow_threads(|| with!(&*m, r => r.flush()))
            .map_err(|e| err("flush failed", e))?;
        self.trim()
    }

    /// Maps the pages of bytes `start..stop` now (read-ahead applies), so
    /// touching them does not fault; returns the number of pages mapped.
    #[pyo3(signature = (start = 0, stop = None))]
    fn prefetch(&self, py: Python<'_>, start: usize, stop: Option<usize>) -> PyResult<usize> {
        let range = self.range(start, stop)?;
        let m = self.mapped()?;
        py.allow_threads(|| with!(&*m, r => r.prefetch(range)))
            .map_err(|e| err("prefetch failed", e))
    }

    /// Declares how the program will touch the region, as `madvise(2)`
    /// (or `numpy.memmap`'s `madvise`) tells the kernel: `"random"` maps
    /// each faulting page alone (no read-ahead), `"sequential"` reads the
    /// largest window from a stream's first fault, `"normal"` finds
    /// streams itself (the default). The whole region takes it.
    fn advise(&self, pattern: &str) -> PyResult<()> {
        let pattern = match pattern {
            "normal" => AccessPattern::Normal,
            "random" => AccessPattern::Random,
            "sequential" => AccessPattern::Sequential,
            other => {
                return Err(PyValueError::new_err(format!(
                    "advise({other:?}): \"normal\", \"random\" or \"sequential\""
                )))
            }
        };
        let m = self.mapped()?;
        with!(&*m, r => r.advise(pattern));
        Ok(())
    }

    /// Flushes and unmaps. Raises `BufferError` while a view (a NumPy
    /// array, a memoryview) of the region exists; a no-op once closed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(m) = self.state.read().clone() else {
            return Ok(());
        };
        let busy = || {
            PyBufferError::new_err(format!(
                "cannot close a region with {} exported view(s): delete the arrays and memoryviews of it first",
                self.exports.load(Ordering::Acquire)
            ))
        };
        if self.exports.load(Ordering::Acquire) > 0 {
            return Err(busy());
        }
        py.allow_threads(|| with!(&*m, r => r.flush()))
            .map_err(|e| err("close: flush failed (the region stays mapped)", e))?;
        let taken = {
            let mut st = self.state.write();
            if self.exports.load(Ordering::Acquire) > 0 {
                return Err(busy());
            }
            st.take()
        };
        drop(m);
        // The last handle unmaps (a concurrent call may hold a clone: then
        // it unmaps when that call returns).
        py.allow_threads(move || drop(taken));
        if let Some(slot) = self.slot {
            sigbus::unregister(slot);
        }
        self.trim()
    }

    /// Copies `n` bytes from `offset` out of the region (through faultline's
    /// own read path, not the buffer).
    fn read<'py>(&self, py: Python<'py>, offset: usize, n: usize) -> PyResult<Bound<'py, PyBytes>> {
        let range = self.range(offset, Some(offset.saturating_add(n)))?;
        let m = self.mapped()?;
        let mut buf = vec![0u8; range.len()];
        py.allow_threads(|| with!(&*m, r => r.read_at(range.start, &mut buf)))
            .map_err(|e| err("read failed", e))?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Copies `data` into the region at `offset` (a writable region).
    fn write(&self, py: Python<'_>, offset: usize, data: Vec<u8>) -> PyResult<()> {
        let range = self.range(offset, Some(offset.saturating_add(data.len())))?;
        let m = self.mapped()?;
        match &*m {
            Mapped::Rw(r) => py
                .allow_threads(|| r.write_at(range.start, &data))
                .map_err(|e| err("write failed", e)),
            Mapped::Ro(_) => Err(PyTypeError::new_err("the region is read-only (mode \"r\")")),
        }
    }

    /// Resident pages now.
    #[getter]
    fn resident_pages(&self) -> PyResult<usize> {
        Ok(with!(&*self.mapped()?, r => r.resident_pages()))
    }

    /// The page size in bytes (4096 or 2097152).
    #[getter]
    fn page_size(&self) -> PyResult<usize> {
        Ok(with!(&*self.mapped()?, r => r.page_size().bytes()))
    }

    /// Whether the region (and its buffer) is writable.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    /// Whether the region was closed.
    #[getter]
    fn closed(&self) -> bool {
        self.state.read().is_none()
    }

    /// The address of its first byte.
    #[getter]
    fn addr(&self) -> usize {
        self.addr
    }

    /// The manager that mapped it.
    #[getter]
    fn manager(&self, py: Python<'_>) -> Py<PyManager> {
        self.manager.clone_ref(py)
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "faultline.Region(addr={:#x}, len={}, writable={}, closed={})",
            self.addr,
            self.len,
            py_bool(self.writable),
            py_bool(self.closed())
        )
    }

    /// The buffer protocol: one-dimensional unsigned bytes over the
    /// region's memory, read-only unless the region is writable.
    ///
    /// # Safety
    /// `view` is the `Py_buffer` CPython passes (valid for writes).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no Py_buffer to fill"));
        }
        let me = slf.get();
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE && !me.writable {
            return Err(PyBufferError::new_err(
                "the region is read-only (mode \"r\"): no writable buffer",
            ));
        }
        let st = me.state.read();
        if st.is_none() {
            return Err(PyValueError::new_err("the region is closed"));
        }
        me.exports.fetch_add(1, Ordering::AcqRel);
        drop(st);
        // SAFETY: `view` is non-null and CPython's to fill (the contract);
        // the region stays mapped while the export is counted (close
        // refuses), and `obj` keeps a reference to the region object, so the
        // pointers stay valid until `__releasebuffer__`. `shape` and
        // `strides` point into the view itself, as CPython allows.
        unsafe {
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).buf = me.addr as *mut c_void;
            (*view).len = me.len as isize;
            (*view).readonly = c_int::from(!me.writable);
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    /// Ends one export (CPython releases `obj` itself).
    ///
    /// # Safety
    /// Called by CPython once per successful `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }
}
