//! Region write-back and teardown: `Region::flush` and `Region::close`
//! (write-back whose error is returned), and `Drop for Region`: write dirty
//! pages back (the error is queued: drop cannot return it; `close` can) → wait
//! until every unmap event read so far is handled → remove the region from
//! the table (no new lookup finds it) → `dying = true` → unregister the
//! parts still ours (blocked threads wake) → for each lock window holding
//! frames, under its locks, move resident runs back to their pool slots
//! and free every frame. The mapping is unmapped when the last
//! `Arc<RegionInner>` (perhaps a worker's) goes.
//!
//! Bounded: a page lock held past [`SHUTDOWN_WAIT`] (a worker stuck in a
//! store call) is reported and its window's frames leaked rather than the
//! drop hung; a page shared copy-on-write with a child that inherited the
//! region, which the kernel will not move, is written back from the region
//! and left to go with the mapping, not waited for. In a child of `fork()`
//! nothing is done (see `Core::in_owner`).
//! Locks: each window's fault locks, one window at a time.

use super::region::{Access, Region};
use super::service::SHUTDOWN_WAIT;
use crate::core::Core;
use crate::error::FaultError;
use crate::frame::{Frame, FrameAllocator};
use crate::pagemove::{self, Holes, Patience};
use crate::region::{PageState, RegionInner};
use crate::store::StoreError;
use crate::writeback;
use std::ops::Range;
use std::sync::atomic::Ordering;

impl<A: Access> Region<A> {
    /// Writes every dirty page back to the region's store, then makes the
    /// store durable (`fsync` for a file). A page is dirty when its bytes
    /// differ from the store's copy (by a 128-bit fingerprint taken when the
    /// page was last read from or written to the store); clean pages are not
    /// written. Regions whose store is not writable have nothing to write.
    ///
    /// Each page is written from its frame, taken out of the region for the
    /// copy: the store gets the page as it was at one instant, never a torn
    /// mix; a write racing with the flush waits for it, and lands either in
    /// what is written or in the page that stays dirty.
    ///
    /// # Errors
    /// The first [`StoreError`]: a page that cannot be written stays dirty
    /// (and in memory); the others are still written. A later flush tries
    /// the failed pages again. A page the kernel will not let faultline
    /// take out of the region because another process shares it
    /// (copy-on-write with a child of `fork()` that inherited the region
    /// through `MADV_DOFORK`) is [`StoreError::Unreadable`] with `EBUSY`, at
    /// once; dropping the region writes such pages from the region itself.
    pub fn flush(&self) -> Result<(), StoreError> {
        let r = &self.inner;
        if !self.service.core.in_owner() {
            return Err(StoreError::Unsupported {
                store: "a faultline region in a child of fork() (the parent flushes it)",
                op: "flush",
            });
        }
        if !r.store.writable() {
            return Ok(());
        }
        let core = &self.service.core;
        writeback::write_back(core, r, 0..r.pages(), None, writeback::OnHeld::Report)?;
        r.store.flush()
    }

    /// Writes the dirty pages of bytes `range` (offsets in the region,
    /// widened to whole pages) back to the store, as [`Region::flush`]
    /// does, without making the store durable: afterwards a reader of the
    /// store (a `pread` of the file) sees every write the program made to
    /// those pages before the call.
    ///
    /// # Errors
    /// As [`Region::flush`]; a range not inside the region is
    /// [`StoreError::Unsupported`] naming it.
    pub fn write_back(&self, range: std::ops::Range<usize>) -> Result<(), StoreError> {
        let r = &self.inner;
        if !self.service.core.in_owner() {
            return Err(StoreError::Unsupported {
                store: "a faultline region in a child of fork() (the parent writes it back)",
                op: "write_back",
            });
        }
        let ps = r.page_size.bytes();
        if range.start > range.end || range.end > r.pages() * ps {
            return Err(StoreError::Unsupported {
                store: "a region",
                op: "write_back of a range not inside it",
            });
        }
        if !r.store.writable() {
            return Ok(());
        }
        let pages = range.start / ps..range.end.div_ceil(ps);
        let core = &self.service.core;
        writeback::write_back(core, r, pages, None, writeback::OnHeld::Report)
    }

    /// Flushes the region and unmaps it, returning the flush's result.
    /// Dropping a region also writes back, but can only queue its error
    /// ([`crate::Manager::take_error`]) and then lets the pages go.
    ///
    /// # Errors
    /// On failure the region is handed back, unchanged and still mapped,
    /// with the error: its dirty pages are still in memory, so the caller
    /// can free space (or let the store recover) and close again.
    #[allow(clippy::result_large_err)] // the region itself comes back
    pub fn close(self) -> Result<(), (Region<A>, StoreError)> {
        match self.flush() {
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }
}

impl<A: Access> Drop for Region<A> {
    fn drop(&mut self) {
        let core = &self.service.core;
        if !core.in_owner() {
            // A child of fork(): the region's range is not in the child
            // (`MADV_DONTFORK`), and every teardown step — write-back,
            // unregister, moving pages out — would act on the parent's
            // address space through the shared userfaultfd. Forget it.
            return;
        }
        teardown(core, &self.inner);
    }
}

fn teardown(core: &Core, r: &RegionInner) {
    // Write back before the frames go: a region's data outlives it in its
    // store. An error cannot be returned from drop; it is queued.
    if r.store.writable() {
        // A page the kernel holds (shared with a child that inherited the
        // region) is written from the region: its handle is gone, so
        // nobody writes it any more.
        // SAFETY: `addr..addr + buf.len()` is a page of this live region
        // (the mapping outlives the teardown), every part of it present
        // (checked by `write_back` under the page's lock).
        let copy = |addr: usize, buf: &mut [u8]| unsafe { super::access::copy_out(addr, buf) };
        let on_held = writeback::OnHeld::Copy(&copy);
        if let Err(e) = writeback::write_back(core, r, 0..r.pages(), Some(SHUTDOWN_WAIT), on_held)
            .and_then(|()| r.store.flush())
        {
            core.record(FaultError::Store {
                addr: r.start(),
                source: e,
            });
        }
    }
    core.await_unmaps();
    core.table.remove(r.id);
    core.objects.release(r.id);
    r.set_dying();
    // Only the parts still ours: a part the program unmapped may hold
    // someone else's mapping now.
    for (s, e) in r.map.live_ranges() {
        if let Err(err) = core.uffd.unregister(s, e - s) {
            core.record(FaultError::Move {
                addr: s,
                source: err,
            });
        }
    }
    let mut freed: Vec<Frame> = Vec::new();
    // Only windows with pages in use (sparse: an untouched terabyte costs
    // a walk of its span slots).
    let mut next = r.next_used(0);
    while let Some(p) = next {
        let w = r.window(p);
        next = r.next_used(w.end);
        free_window(core, r, w, &mut freed);
    }
    core.alloc.free_bulk(&mut freed);
    release_range(core, r);
}

/// Unmaps the region's range now, so that it is free for new mappings when
/// the drop returns (a worker may hold the region for long after, in its
/// lookup cache). First every fault lock of the region is taken and let go
/// once: a worker still inside a fault of this region (begun before
/// `dying` was set) has finished, and any later one sees `dying` and moves
/// nothing in. If a lock stays held (a stuck store call), the range is left
/// to be unmapped with the last reference.
fn release_range(core: &Core, r: &RegionInner) {
    let step = r.window(0).len().max(1);
    let windows = r.pages().div_ceil(step);
    let mut idx: Vec<usize> = if windows >= core.locks.count() {
        (0..core.locks.count()).collect()
    } else {
        r.lock_indices(&core.locks, (0..windows).map(|w| w * step))
    };
    if core
        .locks
        .lock_all_within(&mut idx, SHUTDOWN_WAIT)
        .is_none()
    {
        return;
    }
    // SAFETY: the region is out of the table, unregistered and dying, its
    // frames are freed, and no worker is inside one of its faults (all its
    // locks were taken after `dying` was set): nothing touches the range
    // or moves pages into it any more.
    match unsafe { r.map.unmap_now() } {
        Ok(()) => r.unmapped(),
        Err(e) => core.record(FaultError::Move {
            addr: r.start(),
            source: e,
        }),
    }
}

/// Takes back the frames of window `w` (its pages under its locks), pushing
/// them on `freed`.
fn free_window(core: &Core, r: &RegionInner, w: Range<usize>, freed: &mut Vec<Frame>) {
    let holds = |p| matches!(r.state(p), PageState::Resident(_) | PageState::Parked(_));
    if !w.clone().any(holds) {
        return;
    }
    // The window's locks (one, unless a file offset not aligned to the
    // window splits it between two file windows).
    let mut idx = r.lock_indices(&core.locks, w.clone());
    let Some(_g) = core.locks.lock_all_within(&mut idx, SHUTDOWN_WAIT) else {
        // A worker holds it, stuck in a store call: leave the window's
        // frames (they leak) rather than hang the drop.
        core.record(FaultError::Inconsistent {
            addr: r.page_addr(w.start),
            what: "a fault lock stayed held through teardown (a store call that does not return?); its pages' frames are leaked",
        });
        return;
    };
    let order = r.page_size.order();
    let mut p = w.start;
    while p < w.end {
        match r.state(p) {
            PageState::Resident(f) => p += take_run(core, r, p, f, w.end, freed),
            PageState::Parked(f) => {
                // Its data is in its frame, in its slot: just free it.
                let frame = Frame::from_parts(f, order);
                core.pool.set_zeroed(&frame, false);
                r.set_state(p, PageState::Absent);
                freed.push(frame);
                p += 1;
            }
            PageState::Absent | PageState::Poisoned | PageState::Gone => p += 1,
        }
    }
}

/// Moves the run of resident pages from `p` (frame `f`) backed by
/// consecutive frames (a fault-around run) back with one `UFFDIO_MOVE`, and
/// frees their frames; returns the run's length.
fn take_run(
    core: &Core,
    r: &RegionInner,
    p: usize,
    f: u32,
    end: usize,
    freed: &mut Vec<Frame>,
) -> usize {
    let order = r.page_size.order();
    let unit = r.page_size.bytes();
    let per_unit = (unit / faultline_sys::PAGE_SIZE) as u32;
    let mut n = 1;
    // Within one part of the pool: one move cannot span two (`same_part`).
    while p + n < end
        && r.state(p + n) == PageState::Resident(f + n as u32 * per_unit)
        && core.alloc.same_part(f, f + n as u32 * per_unit)
    {
        n += 1;
    }
    let (slot, addr) = (core.pool.slot_addr(f), r.page_addr(p));
    let (len, until_busy) = (n * unit, Patience::UntilBusy);
    // SAFETY: `slot..+n*unit` are the holes these frames left in the pool
    // and the region pages are resident; after unregistering, nothing but
    // this teardown (holding the window lock) changes either.
    let whole = unsafe { pagemove::move_back(core, slot, addr, len, Holes::Forbid, until_busy) };
    for i in 0..n {
        let frame = Frame::from_parts(f + i as u32 * per_unit, order);
        if whole.is_err() {
            move_back_one(core, &frame, r.page_addr(p + i));
        }
        core.pool.set_zeroed(&frame, false);
        r.set_state(p + i, PageState::Absent);
        freed.push(frame);
    }
    core.stats
        .unmapped_pages
        .fetch_add(n as u64, Ordering::Relaxed);
    n
}

/// Moves one resident page back to its frame's slot after a run move did
/// not complete, skipping 4 KiB pages the program dropped; whatever
/// happens, the slot ends up populated (the frame is about to be freed).
/// The moves give up at the kernel's first `EBUSY`
/// (`pagemove::Patience::UntilBusy`): the page's data is in its store
/// already (written back first), so a page the kernel will not move —
/// shared copy-on-write with a child that inherited the region, pinned —
/// is left to go with the mapping rather than waited for, a move deadline
/// a page.
fn move_back_one(core: &Core, frame: &Frame, page_addr: usize) {
    let slot = core.pool.addr_of(frame);
    // SAFETY: as in `take_run`: the slot holds whatever of the frame is not
    // in the region, and the region page is ours, under its lock.
    let moved = unsafe {
        pagemove::move_back(
            core,
            slot,
            page_addr,
            frame.bytes(),
            Holes::Allow,
            Patience::UntilBusy,
        )
    };
    match moved {
        Ok(()) => {}
        Err(e) if e.is_busy() => {}
        Err(e) => core.record(FaultError::Move {
            addr: page_addr,
            source: e.into_sys(page_addr, frame.bytes()),
        }),
    }
    if let Err(e) = pagemove::fill_holes(core, slot, frame.bytes()) {
        core.record(FaultError::Move {
            addr: slot,
            source: e,
        });
    }
}
