//! Choosing what one fault maps, taking its frame, and filling it
//! ([`fill_frame`]: zeros, or the store's bytes, fingerprinted as they land
//! unless the fault writes them): the faulting
//! page alone; its fault-around window (zero-filled 4 KiB regions with every
//! page of the window absent and memory plentiful); or, for store-backed 4 KiB
//! regions continuing a sequential stream, a read-ahead run (the window doubles
//! while the stream lasts, up to `readahead_max`) with an asynchronous hint for
//! the next one. A run takes one buddy frame run and one store read and is
//! mapped with one move; a stream's fault reclaims for its run when free
//! memory is short of it, other read-ahead takes only what is free.
//!
//! Invariants: a run is a power of two of pages, all absent, starting at the
//! faulting page (read-ahead) or at its aligned window (fault-around); the
//! frame returned belongs to the caller (in flight). Locks: the caller holds
//! the page's fault lock; a read-ahead run's other locks are only tried,
//! never waited for (no lock order matters), and handed back in `guards`.
//! A stream's reclaim pass runs before they are taken, holding the
//! faulting page's lock alone, as any fault's synchronous reclaim: the
//! run's locks (one a page for a store without an identity) could be every
//! lock of the table, and no page could be stepped.

use super::Fault;
use crate::config::{AccessPattern, PageSize};
use crate::core::Core;
use crate::error::FaultError;
use crate::fill::{self, FillSource};
use crate::frame::{Frame, FrameAllocator};
use crate::locks::FaultGuard;
use crate::reclaim::{self, Shortage};
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use faultline_sys::PAGE_SIZE;

/// What a fault maps: `count` pages from `first`, into `frame`.
#[derive(Debug)]
pub(super) struct Unit {
    pub(super) first: usize,
    pub(super) count: usize,
    pub(super) frame: Frame,
    /// The first page of the window to offer the workers once this unit
    /// is mapped ([`super::ahead`]): a sequential stream's next window.
    pub(super) offer: Option<usize>,
}

/// Chooses the unit for a fault on `page` and takes its frame (reclaiming
/// synchronously if none is free); why not, if no frame can be had.
/// `how.attempt > 0` (a retry after refused moves, a lent serve): the page
/// alone.
pub(super) fn take<'a>(
    core: &'a Core,
    region: &RegionInner,
    page: usize,
    how: &Fault,
    guards: &mut Vec<FaultGuard<'a>>,
) -> Result<Unit, Shortage> {
    let attempt = how.attempt;
    // The fault lock this worker holds: reclaim may step pages under it
    // (none in a lent serve: the stopped lender holds it, in the middle of
    // its own work on them).
    let (domain, key) = region.lock_key(page);
    let held = (!how.lent).then(|| core.locks.index(domain, key));
    let (first, count, stream) = match fault_around(core, region, page, attempt) {
        Some((first, count)) => (first, count, false),
        None if attempt == 0 => readahead(core, region, page, how, held, guards),
        None => (page, 1, false),
    };
    if how.ahead && count == 1 {
        // Mapped ahead, but no longer a stream: not worth a frame.
        return Err(Shortage::NotAsked);
    }
    let order = region.page_size.order() + count.trailing_zeros() as u8;
    let run = if count > 1 && !region.store.is_zero() {
        // Read-ahead: the longest free run up to the window (a stream's
        // fault reclaimed for it in `readahead`); the faulting page is the
        // run's first.
        longest_free_run(core, region, order).ok_or(Shortage::NotAsked)
    } else {
        if count == 1 {
            // The page alone: a lock read-ahead kept for a page it then
            // left out (its re-check failed) would keep reclaim off the
            // pages behind it (see the fallback below).
            guards.clear();
        }
        // A zero-filled 2 MiB page takes a pre-zeroed frame when the zeroing
        // worker has one ready.
        let zeroed = order == crate::frame::HUGE_ORDER && region.store.is_zero();
        let prezeroed = zeroed.then(|| core.take_prezeroed()).flatten();
        prezeroed
            .map_or_else(|| reclaim::alloc(core, order, held), Ok)
            .map(|f| (count, f))
    };
    let offer = |first: usize, count: usize| {
        let next = first + count;
        (stream && next < region.pages()).then_some(next)
    };
    let unit = match run {
        Ok((count, frame)) => Ok(Unit {
            first,
            count,
            frame,
            offer: offer(first, count),
        }),
        // No run that long (read-ahead, fault-around): the page alone —
        // unless nobody asked for it yet. The run's other locks go first:
        // reclaim only tries locks, this worker's own included, and a
        // read-ahead window (up to 128 pages of a store without an
        // identity, one lock key each) can hold every lock of the table
        // but `held`: no page but those under `held` could be reclaimed,
        // by this fault or the background reclaimer, and a small budget
        // ran dry (a fault refused after 2 s without progress: SIGBUS).
        Err(_) if count > 1 && !how.ahead => {
            guards.clear();
            reclaim::alloc(core, region.page_size.order(), held).map(|frame| Unit {
                first: page,
                count: 1,
                frame,
                offer: offer(page, 1),
            })
        }
        Err(why) => Err(why),
    };
    if unit.is_ok() {
        // Below the low watermark now: the background reclaimer starts at
        // once, not at its next tick.
        core.kick.note_free(crate::budget::free_pages(core));
    }
    unit
}

/// Fills the unit's frame (zeros in the configured order, or the store's
/// bytes, fingerprinted for dirty tracking as the store hands each page
/// over: [`crate::dirty`] — unless the
/// fault `dirties` its pages, whose fingerprints would only be hashed to
/// be found stale at write-back); returns where the bytes came from.
pub(super) fn fill_frame(
    core: &Core,
    region: &RegionInner,
    page: usize,
    how: &Fault,
    u: &mut Unit,
) -> Result<FillSource, FaultError> {
    let fault_addr = how.addr;
    let unit = region.page_size.bytes();
    let addr = region.page_addr(u.first);
    let target = fault_addr.saturating_sub(addr).min(u.count * unit - 1);
    // The store may touch another region: this thread lends its locks to
    // that nested fault (`nesting.rs`), except for the unit's own pages.
    let _lend =
        (!region.store.is_zero()).then(|| core.nesting.lend(region.id, u.first..u.first + u.count));
    // Store reads are timed (zero fills are not: no clock on that path).
    let t0 = (!region.store.is_zero()).then(std::time::Instant::now);
    // A write fault's pages (and a writing stream's window) go in without
    // fingerprints: dirty from the fill. Hashing them only for the write
    // to make the hash stale cost a sequential writer 6% of its rate
    // (measurements.md §26).
    // A page that goes in write-protected needs none either: until its
    // first write its protection says it is the store's copy, and after it
    // the page is dirty (`crate::dirty`). Should the copy not end up
    // protected, the page only counts dirty: one needless write, never a
    // lost one.
    let hashed = region.tracks_dirt()
        && !how.dirties
        && !super::protect::goes_in_protected(core, region, u.count, how);
    let filled = if region.store.is_zero() {
        let order = core.config.experiment.fill_order;
        // SAFETY: `u.frame` was just allocated (or taken from the
        // pre-zeroed reserve), so this worker owns it.
        let source = unsafe { fill::fill_zeros(&core.pool, &mut u.frame, target, order) };
        Ok((source, Vec::new()))
    } else {
        read_store(core, region, u, hashed).map(|fps| (FillSource::Store, fps))
    };
    let (source, fps) = filled.map_err(|source| FaultError::Store {
        addr: region.page_addr(page),
        source,
    })?;
    match source {
        FillSource::Cleared => Stats::bump(&core.stats.fills_cleared),
        FillSource::Prezeroed => Stats::bump(&core.stats.fills_prezeroed),
        FillSource::Store => {
            if let Some(t0) = t0 {
                core.stats
                    .store_reads
                    .record(t0.elapsed().as_nanos() as u64);
            }
            Stats::bump(&core.stats.fills_store);
            region.note_store_memory();
            let per_unit = (unit / PAGE_SIZE) as u32;
            let first = u.frame.index();
            for (i, &fp) in (0u32..).zip(&fps).filter(|(_, &fp)| fp != 0) {
                // The pages take these frames in `map_in`; a move that
                // fails clears them again (`set_state`).
                region.fingerprint_frame(first + i * per_unit, fp);
            }
        }
    }
    Ok(source)
}

/// Reads the unit's pages from the store into its frame (which this
/// worker owns, in flight); with `hashed`, the fingerprint of each page as
/// the store hands it over (`Store::read_pages_each`: a page the store
/// just copied is hashed from the cache, measurements.md §27), 0 for a
/// page not handed over. Only a page that is page `i` of this frame is
/// hashed: bytes a store hands over from elsewhere (its own cache) give
/// the page no fingerprint, so it counts dirty.
fn read_store(
    core: &Core,
    region: &RegionInner,
    u: &mut Unit,
    hashed: bool,
) -> Result<Vec<u128>, crate::store::StoreError> {
    let unit = region.page_size.bytes();
    // 0: not handed over (a real fingerprint is never 0).
    let mut fps = vec![0u128; if hashed { u.count } else { 0 }];
    let frame_at = core.pool.addr_of(&u.frame);
    let mut hash_page = |i: usize, page: &[u8]| {
        let this_frame = page.len() == unit && page.as_ptr() as usize == frame_at + i * unit;
        if let (Some(fp), true) = (fps.get_mut(i), this_frame) {
            *fp = crate::dirty::fingerprint(page);
        }
    };
    let (store, first) = (region.store.as_ref(), u.first as u64);
    // SAFETY: the frame is in flight with this worker (the caller's).
    unsafe { fill::fill_from_store(&core.pool, &mut u.frame, store, first, unit, &mut hash_page) }?;
    Ok(fps)
}

/// The fault-around window `(first, count)` if it applies: a zero-filled
/// region, a first attempt, the window wholly absent, memory plentiful
/// (more than a quarter of the pool free: pages mapped ahead of use must
/// not starve pages that are asked for), and the touch looking like part
/// of a walk: the window is the region's first or last, or the page just
/// before or just after it is there. A lone touch far from any other maps
/// its page alone: fault-around costs such a touch half its time (4 KiB
/// in-thread first touch, random order: 10.4 µs with the window against
/// 6.2 µs without, on the 2-vCPU guest; 12-13 µs against 6.0-6.8 on a
/// 16-CPU one) and fills the budget with pages nobody asked for.
fn fault_around(
    core: &Core,
    region: &RegionInner,
    page: usize,
    attempt: u32,
) -> Option<(usize, usize)> {
    if attempt > 0 || !region.store.is_zero() {
        return None;
    }
    if region.read_ahead.pattern() == AccessPattern::Random {
        return None;
    }
    if core.alloc.free_hint() <= core.alloc.pages_in(0) / 4 {
        return None;
    }
    let w = region.fault_around_window(page)?;
    // Neighbours' states are read without their locks: a hint, like the
    // window's own (which its lock makes exact for the pages it covers).
    let there = |p: usize| region.state(p) != PageState::Absent;
    let walked = w.start == 0 || w.end >= region.pages() || there(w.start - 1) || there(w.end);
    (walked && !w.clone().any(there)).then(|| (w.start, w.len()))
}

/// The read-ahead run `(page, n, stream)` for a store-backed 4 KiB region:
/// a fault that continues a sequential stream maps the next `window` pages
/// (those whose locks could be taken and that are absent) from one store
/// read, and the store is told to start on the window after it. Such a
/// fault, finding less than two windows free, first runs one synchronous
/// reclaim pass for its window (before it takes the window's other locks);
/// a window read ahead otherwise takes what is free now, never reclaiming
/// for pages nobody asked for. A stream's next pages will be asked for,
/// and without the pass a sequential writer — whose dirty pages keep free
/// memory scarce while the background reclaimer writes them back — read
/// 32 pages a store read instead of 256, at two thirds of the rate it has
/// with it (docs/measurements.md, "Read-ahead that reclaims for a
/// stream"). `stream`:
/// a fault (not a window mapped ahead itself) will offer that window to the
/// workers once its run is mapped ([`super::ahead`]). `held`: the fault
/// lock the caller holds, if any (as for `take`). Other regions: the page
/// alone.
fn readahead<'a>(
    core: &'a Core,
    region: &RegionInner,
    page: usize,
    how: &Fault,
    held: Option<usize>,
    guards: &mut Vec<FaultGuard<'a>>,
) -> (usize, usize, bool) {
    if region.page_size != PageSize::Base4K || region.store.is_zero() {
        return (page, 1, false);
    }
    // At most an eighth of the pool: in a small pool, a full window (and
    // the one mapped ahead of it) would take most of the frames.
    let pool_cap = 1usize << (core.alloc.pages_in(0) / 8).max(1).ilog2();
    let max = core.config.readahead_max.min(pool_cap);
    let window = region.read_ahead.window(page, max, how.ahead);
    let (d0, k0) = region.lock_key(page);
    let mut mine = vec![core.locks.index(d0, k0)];
    let stream = window > 1 && !how.ahead;
    if stream && core.config.reclaim && core.alloc.free_hint() < 2 * window {
        // A stream's fault reclaims for its window (one pass), holding no
        // lock but its own page's, as any fault's reclaim (see the module
        // docs); with reclaim off, as any fault, it does not.
        reclaim::reclaim(core, window, held, || false);
    }
    let n = region.lock_run(&core.locks, page, window, &mut mine, guards, |p| {
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
    (page, n, stream)
}

/// The longest free frame run of at most `order` and more than one page,
/// with its page count.
fn longest_free_run(core: &Core, region: &RegionInner, order: u8) -> Option<(usize, Frame)> {
    let base = region.page_size.order();
    (base + 1..=order)
        .rev()
        .find_map(|k| core.alloc.alloc(k).map(|f| (1usize << (k - base), f)))
}
