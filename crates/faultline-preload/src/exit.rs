//! The process's end and its forks. At a normal exit (`exit()`, a return
//! from `main`), every writable mapping is written back (made durable),
//! anonymous mappings' pages in Redis are deleted, the counts are printed if `FAULTLINE_PRELOAD_REPORT` asks, and the
//! manager's stats file is removed; from then on every call goes to libc.
//! Mappings stay in place: threads still running may touch them until the
//! process is gone (their stores after the write-back are lost, as a
//! program's unsynced stores are at any exit).
//!
//! In the child of a `fork()` every call goes to libc: the child has no
//! fault workers, and faultline's regions are not in its address space
//! (they are `MADV_DONTFORK`: a child that touches an inherited served
//! address gets SIGSEGV; a child that execs, the common case, is
//! unaffected).
//!
//! Locks: none of its own (the table's, to list the mappings).

use crate::mappings::{all, started_manager, OFF, SERVED_EVER};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

/// The stats file to remove at exit.
static STATS_FILE: OnceLock<std::path::PathBuf> = OnceLock::new();

/// Registers the exit and fork handlers for the manager just started.
pub(crate) fn register(mm: &faultline::Manager) {
    if let Some(p) = mm.stats_file() {
        let _ = STATS_FILE.set(p.to_path_buf());
    }
    if let Err(e) = faultline_sys::interpose::on_fork_and_exit(in_child, at_exit) {
        eprintln!("faultline-preload: {e}: writable mappings are not written back at exit");
    }
}

/// The child side of `fork()`.
///
/// # Safety
/// Called by libc in the child of a fork, before `fork` returns there: it
/// only stores to an atomic (async-signal-safe).
unsafe extern "C" fn in_child() {
    // Relaxed: the child has one thread now; every later read is its own.
    OFF.store(true, Ordering::Relaxed);
}

extern "C" fn at_exit() {
    // Nothing may unwind out of an atexit handler.
    let _ = std::panic::catch_unwind(|| {
        if OFF.load(Ordering::Relaxed) {
            return;
        }
        let _inside = crate::reentry::Inside::enter();
        for s in all() {
            if let Err(e) = s.flush() {
                eprintln!(
                    "faultline-preload: {}: write-back at exit failed: {e}",
                    s.path.display()
                );
            }
            // An anonymous mapping's pages in Redis are the process's
            // alone: deleted.
            s.release_store();
        }
        OFF.store(true, Ordering::Relaxed);
        if crate::config::settings().is_some_and(|s| s.report) {
            eprintln!("{}", report());
        }
        if let Some(p) = STATS_FILE.get() {
            let _ = std::fs::remove_file(p);
        }
    });
}

/// The exit report's line.
fn report() -> String {
    let regions = SERVED_EVER.load(Ordering::Relaxed);
    let Some(mm) = started_manager() else {
        return format!("faultline-preload: regions={regions} faults=0 fills=0 written_back=0 evicted=0 budget=0");
    };
    let s = mm.stats();
    format!(
        "faultline-preload: regions={regions} faults={} fills={} written_back={} evicted={} budget={}",
        s.faults(),
        s.fills_store,
        s.written_back,
        s.evicted,
        s.budget_frames * 4096
    )
}

/// Prints faultline's warnings (each fault error, before the faulting
/// thread's SIGBUS) on stderr; `FAULTLINE_LOG` (a `tracing` filter)
/// changes the level. A program with its own subscriber keeps it.
pub(crate) fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FAULTLINE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
