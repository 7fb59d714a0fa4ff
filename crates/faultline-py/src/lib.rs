//! The Python binding of faultline (`faultline._faultline`, wrapped by the
//! pure-Python package `faultline`): a `Manager` (`manager.rs`) maps regions
//! over files or zeros, and each `Region` (`region.rs`) exports the buffer
//! protocol over its memory, so NumPy views it without a copy.
//!
//! Invariants: nothing panics across the FFI boundary (every fallible call
//! becomes a Python exception carrying its cause); a region is never
//! unmapped while a buffer view of it is exported; a Python region keeps
//! its Python manager alive. Faults on region memory are served by
//! faultline's own worker threads, or (`fault_mode="in-thread"`) by its
//! SIGBUS handler in the faulting thread; neither takes the GIL, so NumPy
//! code that touches region memory with or without the GIL held cannot
//! deadlock on faultline. Locks: each region's state lock (a leaf, never held while
//! waiting for the GIL); the SIGBUS reporter's error slot (atomics only).

mod manager;
mod region;
mod sigbus;
mod size;

use pyo3::prelude::*;

pyo3::create_exception!(
    _faultline,
    FaultlineError,
    pyo3::exceptions::PyOSError,
    "An error from faultline (mapping, fault service, store I/O); the message names the cause."
);

/// The extension module: `Manager`, `Region`, `FaultlineError`, `parse_size`.
#[pymodule]
fn _faultline(m: &Bound<'_, PyModule>) -> PyResult<()> {
    sigbus::install();
    m.add_class::<manager::PyManager>()?;
    m.add_class::<region::PyRegion>()?;
    m.add("FaultlineError", m.py().get_type::<FaultlineError>())?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(manager::remove_stats_files, m)?)?;
    Ok(())
}

/// Parses a size: an int, or a string like `"256M"`, `"2M"`, `"4K"`, `"1G"`
/// (powers of 1024), `"4096"`.
#[pyfunction]
fn parse_size(size: &Bound<'_, PyAny>) -> PyResult<usize> {
    size::from_py(size)
}

/// Turns any displayable error into a [`FaultlineError`] naming `what`
/// failed and the cause.
pub(crate) fn err(what: &str, cause: impl std::fmt::Display) -> PyErr {
    FaultlineError::new_err(format!("{what}: {cause}"))
}
