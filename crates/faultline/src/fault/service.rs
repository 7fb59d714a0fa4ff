//! The fault service: worker threads that read userfaultfd events and resolve
//! each missing-page fault by moving a filled pool frame into place.
//!
//! One fault, in order (DESIGN.md, "Data flow of one fault"):
//! `lookup(addr)` → lock `(region, page)` → state? (parked: move its frame
//! back, done) → choose the unit (the page; its fault-around window for a
//! zero region; a read-ahead run for a store-backed stream) → `alloc(order)`
//! (a pre-zeroed 2 MiB frame if one is ready; reclaim synchronously if none is
//! free) → `fill` (clear in the configured order, or read from the store) →
//! (2 MiB: drop the empty page table the fault left) → state = resident →
//! `UFFDIO_MOVE frame → page` (wakes the faulting threads) → unlock.
//!
//! Outcomes ([`Resolution`]): `Moved`; `AlreadyMapped` (a racing fault was
//! served first: wake only); `Dying` (the region is being unmapped: wake
//! only); `Poisoned` (no frame, a store or ioctl error: the page is poisoned
//! so the faulting thread gets SIGBUS instead of hanging, and the cause is
//! queued for [`crate::Manager::take_error`]).
//!
//! Frame accounting: a frame taken from the allocator is either moved into the
//! region (and recorded in the page state) or returned before the page lock
//! is released, so `free + mapped + parked = pool pages` holds whenever no
//! fault is in flight.
//!
//! Workers are pinned one per CPU and block in `epoll_wait` on the
//! userfaultfd and a shutdown eventfd. An event wakes every idle worker (unless
//! `exclusive_wake`); the one on the faulting thread's CPU runs first, since
//! that CPU has just gone idle, and takes the event — the others find nothing
//! and sleep again. Workers never touch region memory, so they never fault
//! themselves. An idle worker (no event to read) helps with an offered
//! migration copy, one piece at a time, checking for faults between pieces.

use super::FaultError;
use crate::config::PageSize;
use crate::fill::{self, FillSource};
use crate::frame::{Frame, FrameAllocator};
use crate::manager::Core;
use crate::pagemove::{self, MoveError};
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use faultline_sys::uffd::{Event, Ready, Resolved, Waiter};
use faultline_sys::{host, PAGE_SIZE};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An event as read, with [`Core::region_stamp`] at the time it was read:
/// regions with that id or a higher one were mapped after the event was
/// read (an unmap event concerns none of them).
pub(crate) type Queued = (Event, u64);

/// What happened to one fault event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// A frame was filled and moved into place.
    Moved,
    /// The page was already mapped; the faulting threads were woken.
    AlreadyMapped,
    /// The region is being torn down; the faulting threads were woken.
    Dying,
    /// The page was poisoned; its threads get SIGBUS.
    Poisoned,
    /// No region holds the address.
    Stray,
}

/// The worker loop: runs until the shutdown eventfd becomes readable.
///
/// Intake is never held up by a slow fault: before a worker does anything
/// that may block (a store read, or waiting for a page lock another worker
/// holds), it hands the rest of its batch to the shared deferred queue and
/// signals it, so idle workers take those events at once.
pub(crate) fn run_worker(core: Arc<Core>, worker: usize, waiter: Waiter) {
    if core.config.pin_workers {
        // Best effort: a worker that cannot be pinned still serves faults.
        let _ = host::pin_thread(worker % host::online_cpus());
    }
    core.worker_tids.lock().push(host::thread_id());
    let batch = core.config.event_batch;
    let spin = Duration::from_micros(u64::from(core.config.spin_us));
    let mut read = Vec::with_capacity(batch);
    let mut events: VecDeque<Queued> = VecDeque::with_capacity(batch);
    let mut last_event = Instant::now();
    loop {
        // Deferred events first: they have waited longest.
        let deferred = core.deferred.lock().pop_front();
        if let Some(ev) = deferred {
            handle(&core, worker, ev, &mut events);
            last_event = Instant::now();
            continue;
        }
        read.clear();
        match core.read_events(&mut read, batch) {
            Ok((0, _)) => {
                // Idle: take a piece of an offered migration copy, then look
                // at the userfaultfd again before the next one.
                if crate::migrate::help(&core, worker) {
                    continue;
                }
                if !spin.is_zero() && last_event.elapsed() < spin {
                    // Spinning never reaches the shutdown eventfd: look at
                    // the flag set before it is signalled.
                    if core.is_stopping() {
                        return;
                    }
                    std::hint::spin_loop();
                    continue;
                }
                match waiter.wait(-1) {
                    Ok(Ready::Other(0)) => return,
                    Ok(Ready::Other(_)) => {
                        core.deferred_fd.drain();
                    }
                    Ok(_) => {}
                    Err(e) => {
                        core.record(FaultError::Events(e));
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
            Ok((_, stamp)) => {
                events.extend(read.drain(..).map(|ev| (ev, stamp)));
                while let Some(ev) = events.pop_front() {
                    handle(&core, worker, ev, &mut events);
                }
                last_event = Instant::now();
            }
            Err(e) => {
                core.record(FaultError::Events(e));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Hands `rest` (events this worker read but has not handled) to the other
/// workers, before this one does something that may block.
fn defer(core: &Core, rest: &mut VecDeque<Queued>) {
    if rest.is_empty() {
        return;
    }
    core.deferred.lock().extend(rest.drain(..));
    Stats::bump(&core.stats.deferrals);
    if let Err(e) = core.deferred_fd.signal() {
        core.record(FaultError::Events(e));
    }
}

/// Handles one event; `rest` is the remainder of the worker's batch, handed
/// off (see [`run_worker`]) if this event may block.
pub(crate) fn handle(
    core: &Core,
    worker: usize,
    (ev, stamp): Queued,
    rest: &mut VecDeque<Queued>,
) -> Resolution {
    let (addr, tid) = match ev {
        Event::PageFault { addr, tid, .. } => (addr, tid),
        Event::Unmap { start, end } => {
            super::unmap::unmapped(core, start, end, stamp);
            core.unmap_handled();
            return Resolution::Stray;
        }
        Event::Other(_) => return Resolution::Stray,
    };
    if tid != 0 && core.worker_tids.lock().contains(&tid) {
        // A worker touched region memory: a bug (or a store that reads a
        // managed region), and a deadlock in the making. Say so loudly.
        core.record(FaultError::Inconsistent {
            addr,
            what: "a fault worker faulted on a managed region",
        });
    }
    if core.config.trace_faults > 0 {
        let mut t = core.trace.lock();
        if t.len() < core.config.trace_faults {
            t.push(addr);
        }
    }
    let t0 = Instant::now();
    let Some(region) = core.table.lookup(addr) else {
        Stats::bump(&core.stats.stray);
        // Wake whoever waits there: the range was unregistered (their retry
        // is the kernel's business) or never ours.
        let _ = core.uffd.wake(addr & !(PAGE_SIZE - 1), PAGE_SIZE);
        return Resolution::Stray;
    };
    let page = region.page_of(addr);
    Stats::bump(match region.page_size {
        PageSize::Base4K => &core.stats.faults_4k,
        PageSize::Huge2M => &core.stats.faults_2m,
    });
    let (domain, key) = region.lock_key(page);
    if !region.store.is_zero() || core.locks.is_locked(domain, key) {
        defer(core, rest);
    }
    let res = {
        let _guard = core.locks.lock(domain, key);
        resolve(core, &region, page, addr, 0)
    };
    match res {
        Resolution::Moved => Stats::bump(&core.stats.moves),
        Resolution::AlreadyMapped | Resolution::Dying => Stats::bump(&core.stats.already_mapped),
        Resolution::Poisoned | Resolution::Stray => {}
    }
    core.stats
        .record_service(worker, t0.elapsed().as_nanos() as u64);
    res
}

fn wake(core: &Core, region: &RegionInner, page: usize) {
    // A failed wake leaves nobody stuck that a retry of theirs would not
    // unstick: the range is ours and registered, so this cannot fail short of
    // a bug; record it if it does.
    if let Err(e) = core
        .uffd
        .wake(region.page_addr(page), region.page_size.bytes())
    {
        core.record(FaultError::Move {
            addr: region.page_addr(page),
            source: e,
        });
    }
}

/// Resolves a fault on `page` of `region`. Caller holds the page's lock.
/// `attempt` > 0 after a move that kept failing with `EAGAIN`/`EBUSY`: then
/// without fault-around and with another frame.
fn resolve(
    core: &Core,
    region: &RegionInner,
    page: usize,
    fault_addr: usize,
    attempt: u32,
) -> Resolution {
    if region.dying() {
        wake(core, region, page);
        return Resolution::Dying;
    }
    match region.state(page) {
        PageState::Absent => {}
        PageState::Poisoned => {
            // A fault on a poisoned page: the program dropped the poison
            // marker (MADV_DONTNEED: waking would loop forever), or a thread
            // touches it again after a SIGBUS. Either way the store gets
            // another try (its error may have been transient): the marker
            // goes, and the page is served afresh — or poisoned again.
            let addr = region.page_addr(page);
            // SAFETY: a poisoned page holds no data, only the kernel's
            // poison marker, and nothing references it.
            if let Err(source) = unsafe { region.map.discard(addr, region.page_size.bytes()) } {
                return poison(core, region, page, FaultError::Move { addr, source });
            }
            region.set_state(page, PageState::Absent);
            Stats::bump(&core.stats.poison_retries);
        }
        PageState::Parked(f) => return unpark(core, region, page, f),
        PageState::Gone => return gone(core, region, page, fault_addr),
        PageState::Resident(f) => {
            return match refault(core, region, page, fault_addr, f) {
                Some(res) => res,
                None => unpark(core, region, page, f),
            };
        }
    }
    // The unit to map: the fault-around window if it is wholly absent, its
    // content is free to make (zeros), and memory is plentiful (more than a
    // quarter of the pool free: until reclaim exists, pages mapped ahead of
    // use must not starve pages that are asked for), else just this page.
    let plentiful = core.alloc.free_hint() > core.alloc.pages_in(0) / 4;
    let (first, count) = match region.fault_around_window(page) {
        Some(w)
            if attempt == 0
                && plentiful
                && region.store.is_zero()
                && w.clone().all(|p| region.state(p) == PageState::Absent) =>
        {
            (w.start, w.len())
        }
        _ => (page, 1),
    };
    // Read-ahead for store-backed 4 KiB regions: a fault that continues a
    // sequential stream maps the next `window` pages from one store read and
    // one frame run; the window doubles while the stream lasts. The extra
    // pages' locks are only tried (never waited for), so no lock order
    // matters; `_ra_guards` holds them until the move is done.
    let mut _ra_guards = Vec::new();
    let (first, count) = if count == 1
        && attempt == 0
        && region.page_size == PageSize::Base4K
        && !region.store.is_zero()
    {
        let window = region.readahead(page, core.config.readahead_max);
        let (d0, k0) = region.lock_key(page);
        let mut mine = vec![core.locks.index(d0, k0)];
        let n = region.lock_run(&core.locks, page, window, &mut mine, &mut _ra_guards, |p| {
            region.state(p) == PageState::Absent
        });
        // A power of two: one buddy run.
        let n = 1usize << (usize::BITS - 1 - n.leading_zeros());
        if n > 1 {
            Stats::bump(&core.stats.readaheads);
        }
        if window > 1 {
            // Asynchronous read-ahead: the store starts on the stream's next
            // window while this one is read, filled and mapped.
            let next = page + n;
            let ahead = window.min(region.pages().saturating_sub(next));
            if ahead > 0 {
                region.store.will_read(next as u64, ahead, PAGE_SIZE);
            }
        }
        (page, n)
    } else {
        (first, count)
    };
    let order = region.page_size.order() + count.trailing_zeros() as u8;
    // A zero-filled 2 MiB page takes a pre-zeroed frame when the zeroing
    // worker has one ready.
    let prezeroed = if order == crate::frame::HUGE_ORDER && region.store.is_zero() {
        core.take_prezeroed()
    } else {
        None
    };
    // The fault lock this worker holds: reclaim may step pages under it.
    let (domain, key) = region.lock_key(page);
    let held = Some(core.locks.index(domain, key));
    let run = if count > 1 && !region.store.is_zero() {
        // Read-ahead: the longest free run up to the window, from what is
        // free now (never reclaiming for pages not asked for yet); the
        // faulting page is the run's first.
        let mut k = order;
        loop {
            if let Some(f) = core.alloc.alloc(k) {
                break Some((first, 1usize << (k - region.page_size.order()), f));
            }
            if k == region.page_size.order() + 1 {
                break None;
            }
            k -= 1;
        }
    } else {
        prezeroed
            .or_else(|| core.alloc_or_reclaim_reserve(order, held))
            .map(|f| (first, count, f))
    };
    let (first, count, mut frame) = match run {
        Some(r) => r,
        // No free run that long: the faulting page alone.
        None if count > 1 => match core.alloc_or_reclaim_reserve(region.page_size.order(), held) {
            Some(f) => (page, 1, f),
            None => return no_frame(core, region, page),
        },
        None => return no_frame(core, region, page),
    };
    let addr = region.page_addr(first);
    let len = count * region.page_size.bytes();
    let target = fault_addr.saturating_sub(addr).min(len - 1);
    let fill_order = core.config.fill_order;
    // SAFETY: `frame` was just allocated (or taken from the pre-zeroed
    // reserve), so this worker owns it.
    match unsafe {
        fill::fill(
            &core.pool,
            &mut frame,
            region.store.as_ref(),
            first as u64,
            region.page_size.bytes(),
            target,
            fill_order,
        )
    } {
        Ok(FillSource::Cleared) => Stats::bump(&core.stats.fills_cleared),
        Ok(FillSource::Prezeroed) => Stats::bump(&core.stats.fills_prezeroed),
        Ok(FillSource::Store) => {
            Stats::bump(&core.stats.fills_store);
            if let Some(fps) = &region.fps {
                // The frame holds the store's bytes: fingerprint them, page by
                // page (dirty tracking, crate::dirty).
                // SAFETY: this worker owns the in-flight frame.
                let bytes = unsafe { core.pool.bytes_mut(&mut frame) };
                for (i, page) in bytes.chunks(region.page_size.bytes()).enumerate() {
                    fps.set(first + i, Some(crate::dirty::fingerprint(page)));
                }
            }
        }
        Err(e) => {
            core.alloc.free(frame);
            let addr = region.page_addr(page);
            return poison(core, region, page, FaultError::Store { addr, source: e });
        }
    }
    drop_empty_page_table(core, region, addr, len);
    // Resident before the move: the move wakes the faulting threads, and
    // what they do next (query the region, unmap it) must see the pages
    // resident. No one else can look at the state in between: we hold the
    // window's lock, and teardown takes it too.
    let pages_per_unit = region.page_size.bytes() / PAGE_SIZE;
    for i in 0..count {
        region.set_state(
            first + i,
            PageState::Resident(frame.index() + (i * pages_per_unit) as u32),
        );
    }
    if count > 1 {
        core.stats
            .fault_around_pages
            .fetch_add(count as u64 - 1, std::sync::atomic::Ordering::Relaxed);
    }
    // The first 4 KiB move out of a PMD-mapped pool block splits the block's
    // THP; two such moves at once can make the kernel report EEXIST for a
    // move it did not complete (seen on 6.18), so they take the split lock.
    let split = core.pool.split_guard(&frame);
    // SAFETY: `frame` is in flight with this worker and the window's pages
    // are absent under its locks; nothing references either range.
    let moved = unsafe { pagemove::move_in(core, addr, core.pool.addr_of(&frame), len) };
    if let Some(guard) = split {
        if moved.is_ok() {
            guard.mark_split();
        }
    }
    match moved {
        Ok(()) => Resolution::Moved,
        Err(MoveError::Split { .. }) => {
            // Part of the frame is in the region, part in its slot: the
            // pages keep their frame (recorded resident above), and the
            // next fault on a missing part gathers it (`refault`).
            core.record(FaultError::Inconsistent {
                addr,
                what: "a move into the region was left split; the next touch gathers it",
            });
            wake(core, region, page);
            Resolution::AlreadyMapped
        }
        Err(e) => {
            for i in 0..count {
                region.set_state(first + i, PageState::Absent);
            }
            match e {
                MoveError::Occupied { .. } => {
                    // Mapped behind our back: nothing moved, the frame is
                    // still in its slot. Keep what is there, and say so.
                    core.alloc.free(frame);
                    core.record(FaultError::Inconsistent {
                        addr,
                        what: "page absent in faultline's state but mapped in the page tables",
                    });
                    wake(core, region, page);
                    Resolution::AlreadyMapped
                }
                MoveError::Refused(e)
                    if attempt < 2 && matches!(e.errno, libc::EAGAIN | libc::EBUSY) =>
                {
                    // The kernel kept refusing this frame: try again with the
                    // faulting page alone and another frame before giving up;
                    // keep this frame out of the allocator until then, so the
                    // retry cannot get it back.
                    let res = resolve(core, region, page, fault_addr, attempt + 1);
                    core.alloc.free(frame);
                    res
                }
                e => {
                    core.alloc.free(frame);
                    poison(
                        core,
                        region,
                        page,
                        FaultError::Move {
                            addr,
                            source: e.into_sys(addr, len),
                        },
                    )
                }
            }
        }
    }
}

/// A fault on a page faultline records as resident in frame `f`. Usually a
/// second thread's fault on a page the first one's fault mapped, reported
/// after the move woke it: then `None`'s opposite — wake, done. But if the
/// faulting 4 KiB page holds no data in the page tables, the program dropped
/// it (`MADV_DONTNEED`) or a move was left split: the page is gathered back
/// into its frame, its holes refilled ([`pagemove::recollect`]), and mapped
/// again. Never served afresh: other parts of it may hold data. Returns the
/// resolution, or `None` if the page was gathered and is now parked (the
/// caller then unparks it).
fn refault(
    core: &Core,
    region: &RegionInner,
    page: usize,
    fault_addr: usize,
    f: u32,
) -> Option<Resolution> {
    let at = fault_addr & !(PAGE_SIZE - 1);
    match pagemove::is_empty(core, at, PAGE_SIZE) {
        Ok(false) => {
            wake(core, region, page);
            return Some(Resolution::AlreadyMapped);
        }
        Ok(true) => {}
        Err(e) => {
            let addr = region.page_addr(page);
            return Some(poison(
                core,
                region,
                page,
                FaultError::Move { addr, source: e },
            ));
        }
    }
    match pagemove::recollect(core, region, page, core.pool.slot_addr(f)) {
        Ok(_) => {
            region.set_state(page, PageState::Parked(f));
            None
        }
        Err(e) => {
            // The page stays as it is (its data on one side or the other);
            // the faulting thread gets SIGBUS for its 4 KiB hole rather
            // than refaulting forever.
            core.record(e);
            // SAFETY: `at` holds no data (checked above, under the page's
            // lock): poisoning fills a hole of a region we manage.
            let _ = unsafe { core.uffd.poison(at, PAGE_SIZE, false) };
            Stats::bump(&core.stats.poisoned);
            Some(Resolution::Poisoned)
        }
    }
}

/// Before a move of 2 MiB or more into `[addr, addr + len)`: a fault on this
/// non-THP range allocated a page table under the PMD, and with it there MOVE
/// would split a huge frame into 512 pages. `MADV_DONTNEED` on the (empty)
/// range frees it (`CONFIG_PT_RECLAIM`). The caller holds the range's locks
/// and no page of it is mapped (absent or parked).
pub(crate) fn drop_empty_page_table(core: &Core, region: &RegionInner, addr: usize, len: usize) {
    if len < faultline_sys::HUGE_PAGE_SIZE {
        return;
    }
    // Only over a range with no data: a page-table drop over data would
    // discard it.
    if !pagemove::is_empty(core, addr, len).unwrap_or(false) {
        return;
    }
    // SAFETY: nothing is mapped in the range (just checked, and nothing
    // faultline does maps it while the caller holds its lock): no data and
    // no reference can be in it.
    if unsafe { region.map.discard(addr, len) }.is_ok() {
        Stats::bump(&core.stats.pt_discards);
    }
}

/// Maps `page` of `region` now, from the calling (application) thread: the
/// fault path without a fault, for `Region::prefetch`. Takes the page's lock
/// like a worker; a page already there is left alone.
pub(crate) fn prefetch_page(core: &Core, region: &RegionInner, page: usize) -> Resolution {
    let (domain, key) = region.lock_key(page);
    let _guard = core.locks.lock(domain, key);
    match region.state(page) {
        PageState::Absent | PageState::Parked(_) | PageState::Poisoned => {
            resolve(core, region, page, region.page_addr(page), 0)
        }
        PageState::Resident(_) | PageState::Gone => Resolution::AlreadyMapped,
    }
}

/// A touch of a page reclaim parked: move its frame back from the pool slot
/// (a minor fault; the page is referenced again).
pub(crate) fn unpark(core: &Core, region: &RegionInner, page: usize, f: u32) -> Resolution {
    let addr = region.page_addr(page);
    let len = region.page_size.bytes();
    let frame = Frame::from_parts(f, region.page_size.order());
    drop_empty_page_table(core, region, addr, len);
    region.set_state(page, PageState::Resident(f));
    // SAFETY: a parked page's frame is whole in its slot and the page is a
    // hole, under the page's lock; nothing references either.
    let moved = unsafe { pagemove::move_in(core, addr, core.pool.addr_of(&frame), len) };
    match moved {
        Ok(()) => {
            Stats::bump(&core.stats.unparked);
            Resolution::Moved
        }
        Err(e) => {
            if !matches!(e, MoveError::Split { .. }) {
                // Nothing moved: the data stays safe in its frame; the
                // thread refaults and the next attempt tries again. (Split:
                // it stays recorded resident and the next fault gathers it.)
                region.set_state(page, PageState::Parked(f));
            }
            core.record(FaultError::Move {
                addr,
                source: e.into_sys(addr, len),
            });
            wake(core, region, page);
            Resolution::AlreadyMapped
        }
    }
}

/// A fault on a page the program unmapped (part of) itself. On the part it
/// unmapped, a fault reported before the unmap: wake (the thread retries and
/// gets the kernel's answer, SIGSEGV). On what is left of a 2 MiB page: its
/// frame is gone, so the 4 KiB page is poisoned (SIGBUS) with the cause.
fn gone(core: &Core, region: &RegionInner, page: usize, fault_addr: usize) -> Resolution {
    let at = fault_addr & !(PAGE_SIZE - 1);
    let live = region
        .map
        .live_ranges()
        .iter()
        .any(|&(s, e)| at >= s && at < e);
    if !live {
        let _ = core.uffd.wake(at, PAGE_SIZE);
        return Resolution::Stray;
    }
    core.record(FaultError::Inconsistent {
        addr: region.page_addr(page),
        what: "the program unmapped part of this page (munmap/mremap); the rest of it is gone",
    });
    // SAFETY: `at` is a hole of a live part of a region we manage (its page
    // gave up its frame when the program unmapped the rest).
    let _ = unsafe { core.uffd.poison(at, PAGE_SIZE, false) };
    Stats::bump(&core.stats.poisoned);
    Resolution::Poisoned
}

fn no_frame(core: &Core, region: &RegionInner, page: usize) -> Resolution {
    let cause = FaultError::NoFrame {
        addr: region.page_addr(page),
        page_size: region.page_size.name(),
    };
    poison(core, region, page, cause)
}

/// Poisons `page` so its threads get SIGBUS, and records `cause`.
fn poison(core: &Core, region: &RegionInner, page: usize, cause: FaultError) -> Resolution {
    let addr = region.page_addr(page);
    let len = region.page_size.bytes();
    // Queue the cause first: the poisoned thread, once woken, may ask.
    core.record(cause);
    // SAFETY: the page is absent (under its lock): poisoning fills a hole of
    // a region we manage; no reference into it can exist.
    match unsafe { core.uffd.poison(addr, len, false) } {
        Ok(Resolved::Done) => {
            region.set_state(page, PageState::Poisoned);
            Stats::bump(&core.stats.poisoned);
        }
        Ok(other) => {
            // Partly mapped or raced: wake, and the thread refaults.
            let _ = other;
            wake(core, region, page);
        }
        Err(e) => core.record(FaultError::Poison { addr, source: e }),
    }
    Resolution::Poisoned
}
