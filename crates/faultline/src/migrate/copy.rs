//! The migration copy (seed 001): old frames into new ones, one `memcpy`
//! per run of consecutive frames ([`runs`]), cut into pieces that idle
//! fault workers may help with ([`run_copy`], [`help`]; `copyjob.rs` holds
//! the claims). A worker helps only when it found no fault to serve, and
//! never on the owner's CPU.
//!
//! Locks: the copy-job list's mutex (a leaf); the caller of [`run_copy`]
//! holds the frames of every run in flight.

use super::CopyPlan;
use crate::copyjob::{Claims, CopyJob, Piece};
use crate::core::Core;
use crate::stats::Stats;
use crate::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Called by a fault worker that found no event: copies one piece of an
/// offered job, if any may be taken. Returns whether it did.
pub(crate) fn help(core: &Core, worker: usize) -> bool {
    // Acquire pairs with the Release increment in `run_copy`; a stale zero
    // just means this worker sleeps and the owner copies alone.
    if core.copy_pending.load(Ordering::Acquire) == 0 {
        return false;
    }
    let job = core
        .copy_jobs
        .lock()
        .iter()
        .find(|j| {
            j.claims.has_work()
                && j.owner_cpu != faultline_sys::host::current_cpu()
                && j.claims.may_join(worker)
        })
        .cloned();
    match job {
        Some(j) if j.run_one() => {
            Stats::bump(&core.stats.copy_chunks_helped);
            true
        }
        _ => false,
    }
}

/// Copies `runs` (pool address pairs and lengths) by `plan`; returns the
/// nanoseconds it took.
pub(super) fn run_copy(core: &Core, runs: &[Piece], plan: CopyPlan) -> u64 {
    let t = Instant::now();
    let total: usize = runs.iter().map(|r| r.len).sum();
    // A copy of one chunk or less is not worth a helper's wake-up.
    if plan.threads <= 1 || total <= plan.chunk {
        for r in runs {
            // SAFETY: the caller holds both frames of every run in flight, and
            // this thread alone copies them.
            unsafe { r.copy(plan.method) };
        }
        return t.elapsed().as_nanos() as u64;
    }
    let mut pieces = Vec::new();
    for r in runs {
        let mut off = 0;
        while off < r.len {
            let len = plan.chunk.min(r.len - off);
            pieces.push(Piece {
                src: r.src + off,
                dst: r.dst + off,
                len,
            });
            off += len;
        }
    }
    let job = Arc::new(CopyJob {
        claims: Claims::new(pieces.len(), (plan.threads - 1) as u32),
        pieces,
        method: plan.method,
        owner_cpu: faultline_sys::host::current_cpu(),
    });
    core.copy_jobs.lock().push(Arc::clone(&job));
    // Release pairs with the Acquire in `help`.
    core.copy_pending.fetch_add(1, Ordering::Release);
    if let Err(e) = core.deferred_fd.signal() {
        // No helper will come; the owner copies alone.
        core.record(crate::error::FaultError::Events(e));
    }
    while job.run_one() {}
    job.wait();
    core.copy_jobs.lock().retain(|j| !Arc::ptr_eq(j, &job));
    core.copy_pending.fetch_sub(1, Ordering::Relaxed);
    t.elapsed().as_nanos() as u64
}

/// Copy runs for `(old, new)` frame index pairs: consecutive pairs whose old
/// and new frames both continue a run are merged (fault-around runs and
/// collapsed blocks copy as one piece).
pub(super) fn runs(core: &Core, pairs: &[(u32, u32)], unit: usize, per_unit: u32) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    let mut last: Option<(u32, u32)> = None;
    for &(o, n) in pairs {
        match (last, out.last_mut()) {
            (Some((lo, ln)), Some(run)) if o == lo + per_unit && n == ln + per_unit => {
                run.len += unit;
            }
            _ => out.push(Piece {
                src: core.pool.slot_addr(o),
                dst: core.pool.slot_addr(n),
                len: unit,
            }),
        }
        last = Some((o, n));
    }
    out
}
