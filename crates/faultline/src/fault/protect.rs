//! Write-protect faults ([`crate::FillModel::CopyProtected`]): a write to
//! a page copied in write-protected. The page is no longer the store's copy
//! once the write lands, so its *protected* mark ([`crate::dirty`]) goes
//! first, then the kernel's protection (`UFFDIO_WRITEPROTECT`), which lets
//! the write retry. Nothing is filled. Reached from a fault event with the
//! WP flag, from the SIGBUS context's error code in-thread, or in-thread
//! from a SIGBUS on a mapped page (`resolve.rs: refault`).
//!
//! Locks: the caller holds the page's fault lock (the mark and the
//! protection change under it; the reclaimer drops protected pages under
//! it too, `reclaim/drops.rs`).

use super::{Fault, Resolution};
use crate::config::{FaultMode, FillModel};
use crate::core::Core;
use crate::error::FaultError;
use crate::fill::FillSource;
use crate::pagemove::{self, Patience};
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use faultline_sys::uffd::Resolved;
use faultline_sys::{SysError, PAGE_SIZE};

/// Whether a unit of `count` pages filled from `source` for fault `how`
/// goes in write-protected: under [`FillModel::CopyProtected`], the
/// store's bytes, for a read, in a region that tracks dirt, and a page
/// alone — a random miss, whose park would cost a flush of its own. A
/// read-ahead or fault-around run is a stream's: its pages are parked
/// together (`reclaim/runs.rs`, one flush per run) and left so (protected
/// runs, dropped in batches, read 30% slower in order in-thread:
/// measurements.md §20). Only where it is copied in, too
/// (`pagemove::copy_in` says).
pub(super) fn fills_protected(
    core: &Core,
    region: &RegionInner,
    (source, count): (FillSource, usize),
    how: &Fault,
) -> bool {
    core.config.fill_model == FillModel::CopyProtected
        && source == FillSource::Store
        && count == 1
        && !how.write
        && region.tracks_dirt()
}

/// Whether a unit of `count` pages the store fills for fault `how` will go
/// in write-protected ([`fills_protected`], and copied in:
/// [`pagemove::by_copy`]) with workers serving faults; its fill then takes
/// no fingerprint (`unit::fill_frame`). In-thread it still does: there a
/// racing read fault on a page just mapped lifts the protection without a
/// write ([`lift`], from `resolve.rs: refault`), and the fingerprint keeps
/// such a page clean.
pub(super) fn goes_in_protected(
    core: &Core,
    region: &RegionInner,
    count: usize,
    how: &Fault,
) -> bool {
    core.config.fault_mode == FaultMode::Workers
        && fills_protected(core, region, (FillSource::Store, count), how)
        && pagemove::by_copy(core, region, count * region.page_size.bytes())
}

/// Marks `pages`, just copied in write-protected, protected. Called after
/// the copy that woke the faulting threads, under the unit's locks: a
/// write of theirs meanwhile waits for a lock (its write-protect fault),
/// then finds the mark and lifts it.
pub(super) fn mark(region: &RegionInner, pages: std::ops::Range<usize>) {
    for page in pages {
        region.set_protected(page, true);
    }
}

/// Faults served in the faulting thread, of pages that may be mapped
/// write-protected.
pub(super) fn in_thread(core: &Core) -> bool {
    core.config.fault_mode == FaultMode::InThread
        && core.config.fill_model == FillModel::CopyProtected
}

/// A write to `page` mapped write-protected ([`Fault::protection`]): the
/// page is no longer the store's copy once it lands, so its mark goes
/// first ([`crate::dirty`]), then the protection, which lets the write
/// retry (woken, for a waiting thread). A page that is no longer resident
/// (dropped or parked since) only wakes: the retried write faults afresh.
/// A protection the kernel will not lift (a bug) parks the page instead,
/// so the retried write finds it missing and unparks it writable.
pub(super) fn lift(core: &Core, region: &RegionInner, page: usize, how: &Fault) -> Resolution {
    let PageState::Resident(f) = region.state(page) else {
        core.wake(region.page_addr(page), region.page_size.bytes());
        return Resolution::AlreadyMapped;
    };
    region.set_protected(page, false);
    let at = how.addr & !(PAGE_SIZE - 1);
    // In-thread, nobody waits on the userfaultfd: the thread retries when
    // its handler returns.
    let dontwake = core.config.fault_mode == FaultMode::InThread;
    match unprotect(core, at, dontwake) {
        Ok(()) => {
            Stats::bump(&core.stats.protection_lifted);
            Resolution::AlreadyMapped
        }
        Err(source) => {
            core.record(FaultError::Move { addr: at, source });
            if let Err(e) = pagemove::try_park(core, region, page, f, Patience::Brief) {
                core.record(e);
            }
            core.wake(region.page_addr(page), region.page_size.bytes());
            Resolution::AlreadyMapped
        }
    }
}

/// Clears the kernel's write protection of the 4 KiB page at `at` (waking
/// its waiters unless `dontwake`). `EAGAIN` — an unmap event not read yet
/// (`mmap_changing`), which also leaves the waiters asleep — is retried
/// after pumping the events (`pagemove::while_changing`); an error, or
/// `EAGAIN` for ever, is returned.
fn unprotect(core: &Core, at: usize, dontwake: bool) -> Result<(), SysError> {
    pagemove::while_changing(
        core,
        ("UFFDIO_WRITEPROTECT", at, PAGE_SIZE),
        || core.uffd.write_protect(at, PAGE_SIZE, false, dontwake),
        |r| *r == Resolved::Done,
    )
}
