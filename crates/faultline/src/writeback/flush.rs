//! A region's write-back (`Region::flush`, `close`, `write_back` of a
//! range, and the drop's): every dirty page of a range goes to the store
//! (a protected one, [`crate::dirty`], is passed over under its lock),
//! in batches of up to [`FLUSH_BATCH_PAGES`], each page taken out of the
//! region (parked; a run of consecutive frames with one move) with its
//! fault lock held until its batch is written, then moved back in.
//!
//! Invariant: a page is written only from its frame while parked under its
//! lock, so the store gets it as it was at one instant; a page whose write
//! fails stays dirty (in the region, or parked) and is named in the error.
//!
//! Locks: the fault locks of one batch, only tried while others are held,
//! waited for (bounded with `limit` at teardown, so a worker stuck in a
//! store call cannot hang a drop) only with none held.

use super::{put, put_parked, AfterWrite};
use crate::config::PageSize;
use crate::core::Core;
use crate::error::FaultError;
use crate::locks::FaultGuard;
use crate::pagemove;
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use crate::store::StoreError;
use faultline_sys::SysError;

/// Pages one write-back call of [`write_back`] takes at most: 1 MiB of 4
/// KiB pages, one vectored write to a file when they are consecutive (the
/// longest the file store makes), all in flight at once when they are not.
const FLUSH_BATCH_PAGES: usize = 256;

/// Bytes one such call takes at most (2 MiB pages: 4 a call).
const FLUSH_BATCH_BYTES: usize = 8 << 20;

/// A page taken out of its region for [`write_back`]: parked in `frame`,
/// its fault lock held until the entry drops.
struct Taken<'a> {
    page: usize,
    frame: u32,
    /// It was resident: it goes back in after its write.
    resident: bool,
    /// The index of its fault lock.
    lock: usize,
    /// Fault locks: its own (none if an earlier entry's guard holds the
    /// same lock), and for a run's first page those of the run's others.
    _guards: Vec<FaultGuard<'a>>,
}

/// Writes every dirty page of `pages` of `r` back. A resident page is
/// written from its frame: parked first (moved out of the region, so no
/// thread can write it during the copy: the store gets the page as it was
/// at one instant, never a torn mix), written, and moved back in. This
/// also reaches pages the kernel swapped out (the move takes the swap
/// entry) and pages the program made unreadable (`mprotect`): those cannot
/// be moved and are reported ([`StoreError::Protected`]), not faulted on.
/// A page shared with another process is not waited for: `on_held`
/// reports it or writes it from the region. A page that fails stays dirty;
/// the others are still written, and the first error is returned. With
/// `limit`, a page whose lock stays held longer (a worker stuck in the
/// store) is skipped and reported.
///
/// Pages go to the store in batches (up to [`FLUSH_BATCH_PAGES`], one
/// `write_pages` call each: for a file, runs of consecutive pages as one
/// vectored write and all of a batch's writes in flight together), each
/// page out of its region with its lock held until its batch is written.
/// Written one by one, a region's 47,000 dirty pages took 3.0 s to write
/// back on the project's virtual disk, which takes 1 MiB writes at 2.8
/// GB/s; in batches 0.18 s (docs/measurements.md §23).
///
/// Locks: a page's lock is only tried while the batch holds others; one
/// that is held is waited for only after the batch is written and its
/// locks let go — the fault path and reclaim wait for a lock holding none,
/// and migration waits holding others at most 10 ms, so no wait closes a
/// cycle for good.
pub(crate) fn write_back(
    core: &Core,
    r: &RegionInner,
    pages: std::ops::Range<usize>,
    limit: Option<std::time::Duration>,
    on_held: OnHeld<'_>,
) -> Result<(), StoreError> {
    let mut first_err = None;
    let cap = (FLUSH_BATCH_BYTES / r.page_size.bytes()).clamp(1, FLUSH_BATCH_PAGES);
    let mut batch: Vec<Taken<'_>> = Vec::with_capacity(cap);
    // Pages below this were parked with an earlier page's run.
    let mut past_run = 0;
    for page in r.used_pages(pages) {
        if page < past_run
            || matches!(
                r.state(page),
                PageState::Absent | PageState::Poisoned | PageState::Gone
            )
        {
            continue;
        }
        let Some((lock, guard)) = lock_for_write(core, r, page, limit, &mut batch, &mut first_err)
        else {
            continue;
        };
        if r.is_protected(page) {
            // The store's copy, unwritten since (`crate::dirty`; checked
            // under its lock, which a first write's protect fault takes
            // before the write lands): nothing to write, and no park.
            Stats::bump(&core.stats.clean_skipped);
            continue;
        }
        let mut guards: Vec<FaultGuard<'_>> = guard.into_iter().collect();
        if let Some(run) = park_run(core, r, page, lock, cap - batch.len(), &batch) {
            guards.extend(run.guards);
            past_run = page + run.locks.len();
            for (i, lock) in run.locks.into_iter().enumerate() {
                batch.push(Taken {
                    page: page + i,
                    frame: run.frame + i as u32,
                    resident: true,
                    lock,
                    _guards: std::mem::take(&mut guards),
                });
            }
        } else if let Some((frame, resident)) =
            park_for_write(core, r, page, on_held, &mut first_err)
        {
            batch.push(Taken {
                page,
                frame,
                resident,
                lock,
                _guards: guards,
            });
        }
        if batch.len() >= cap {
            put_batch(core, r, &mut batch, &mut first_err);
        }
    }
    put_batch(core, r, &mut batch, &mut first_err);
    first_err.map_or(Ok(()), Err)
}

/// Takes the fault lock of `page` for [`write_back`]: its index, and the
/// guard (`None`: an entry of `batch` holds the same lock). A lock held
/// elsewhere is waited for only after `batch` is written and its locks let
/// go (see [`write_back`]); `None` if it stayed held past `limit` (the
/// error goes to `first_err`).
fn lock_for_write<'a>(
    core: &'a Core,
    r: &RegionInner,
    page: usize,
    limit: Option<std::time::Duration>,
    batch: &mut Vec<Taken<'a>>,
    first_err: &mut Option<StoreError>,
) -> Option<(usize, Option<FaultGuard<'a>>)> {
    let (domain, key) = r.lock_key(page);
    let lock = core.locks.index(domain, key);
    if batch.iter().any(|t| t.lock == lock) {
        return Some((lock, None));
    }
    if let Some(g) = core.locks.try_lock(domain, key) {
        return Some((lock, Some(g)));
    }
    put_batch(core, r, batch, first_err);
    let waited = match limit {
        None => Some(core.locks.lock(domain, key)),
        Some(limit) => core.locks.lock_within(domain, key, limit),
    };
    if waited.is_none() {
        first_err.get_or_insert(StoreError::Unreadable {
            page: page as u64,
            source: SysError {
                op: "fault lock",
                addr: r.page_addr(page),
                len: r.page_size.bytes(),
                errno: libc::ETIMEDOUT,
            },
        });
    }
    waited.map(|g| (lock, Some(g)))
}

/// A run of resident pages parked together for [`write_back`].
struct ParkedRun<'a> {
    /// The first page's frame; page `i` of the run is in frame `frame + i`.
    frame: u32,
    /// Each page's fault-lock index.
    locks: Vec<usize>,
    /// The locks the run took for its pages after the first.
    guards: Vec<FaultGuard<'a>>,
}

/// Parks the run of resident pages from `page` (its lock `lock` held) in
/// consecutive frames — a read-ahead run — with one move, as reclaim parks
/// runs ([`pagemove::park_run`]; up to `room` pages, the other pages' locks
/// only tried, those `batch` holds being its own). `None`: no run of two,
/// or the move failed (the page goes alone: [`park_for_write`] gathers
/// whatever a failed move left where).
fn park_run<'a>(
    core: &'a Core,
    r: &RegionInner,
    page: usize,
    lock: usize,
    room: usize,
    batch: &[Taken<'a>],
) -> Option<ParkedRun<'a>> {
    let PageState::Resident(frame) = r.state(page) else {
        return None;
    };
    let mut held: Vec<usize> = batch.iter().map(|t| t.lock).chain([lock]).collect();
    let mut guards = Vec::new();
    let n = pagemove::park_run(core, r, page, room, &mut held, &mut guards);
    if n == 0 {
        return None;
    }
    let locks = r.lock_indices(&core.locks, page..page + n);
    Some(ParkedRun {
        frame,
        locks,
        guards,
    })
}

/// Takes `page` out of its region for [`write_back`], its lock held:
/// `(frame, was resident)` if it is parked now. `None` if there is nothing
/// to write from a frame: no data, or a shared page (written from the
/// region or reported, `on_held`), or one that cannot be moved out (its
/// error goes to `first_err`; it stays resident and dirty).
fn park_for_write(
    core: &Core,
    r: &RegionInner,
    page: usize,
    on_held: OnHeld<'_>,
    first_err: &mut Option<StoreError>,
) -> Option<(u32, bool)> {
    let frame = match r.state(page) {
        PageState::Absent | PageState::Poisoned | PageState::Gone => return None,
        PageState::Parked(f) => return Some((f, false)),
        PageState::Resident(f) => f,
    };
    match take_out(core, r, page, frame) {
        Ok(true) => Some((frame, true)),
        Ok(false) => {
            if let Err(e) = put_held(core, r, page, on_held) {
                first_err.get_or_insert(e);
            }
            None
        }
        Err(e) => {
            first_err.get_or_insert(unparkable(r, page, e));
            None
        }
    }
}

/// Writes the pages of `batch` to the store with one call ([`put_pages`];
/// if it fails, page by page, so that the pages that can be written are
/// and the error names one that cannot), moves the resident ones back in,
/// and lets their locks go. A page no longer parked in its frame — served
/// under a lock the batch holds by a nested fault of this thread's own
/// store call (`nesting.rs`) — is left as it is now: whoever moved it took
/// it over. The first error goes to `first_err`.
fn put_batch(
    core: &Core,
    r: &RegionInner,
    batch: &mut Vec<Taken<'_>>,
    first_err: &mut Option<StoreError>,
) {
    let taken = std::mem::take(batch);
    let parked: Vec<(usize, u32)> = taken
        .iter()
        .filter(|t| r.state(t.page) == PageState::Parked(t.frame))
        .map(|t| (t.page, t.frame))
        .collect();
    // SAFETY: the pages are parked in their frames, checked just now under
    // their locks, which `taken` holds until the end.
    if let Err(e) = unsafe { put_parked(core, r, &parked, AfterWrite::Kept) } {
        if parked.len() == 1 {
            first_err.get_or_insert(e);
        } else {
            for &(page, frame) in &parked {
                if r.state(page) != PageState::Parked(frame) {
                    continue;
                }
                // SAFETY: parked in its frame, checked just now under its
                // lock, which `taken` holds.
                if let Err(e) = unsafe { put_parked(core, r, &[(page, frame)], AfterWrite::Kept) } {
                    first_err.get_or_insert(e);
                }
            }
        }
    }
    // The resident ones back in, runs of consecutive pages in consecutive
    // frames with one move each.
    let back: Vec<(usize, u32)> = taken
        .iter()
        .filter(|t| t.resident && r.state(t.page) == PageState::Parked(t.frame))
        .map(|t| (t.page, t.frame))
        .collect();
    let base = r.page_size == PageSize::Base4K;
    // Within one part of the pool: one move cannot span two (`same_part`).
    let run = |a: &(usize, u32), b: &(usize, u32)| {
        base && b.0 == a.0 + 1 && b.1 == a.1 + 1 && core.alloc.same_part(a.1, b.1)
    };
    for run in back.chunk_by(run) {
        if let Err(e) = pagemove::unpark_run(core, r, run[0].0, run[0].1, run.len()) {
            // Its data stays safe in its frames (parked); the next touch
            // moves it back in.
            core.record(e);
        }
    }
    // The locks go last, after every page is back.
    drop(taken);
}

/// What [`write_back`] does with a resident page the kernel will not move
/// out of the region because another process shares it (copy-on-write
/// with a child of `fork()` that inherited the region: `EBUSY` for as long
/// as the child lives).
#[derive(Clone, Copy)]
pub(crate) enum OnHeld<'a> {
    /// Reports it (`EBUSY`; it stays dirty): a flush, whose program may be
    /// writing the page, so only a page out of the region is a snapshot.
    Report,
    /// Writes it from the region itself, read by `copy(addr, buf)` (a
    /// teardown: the region's handle is gone, nobody writes it any more,
    /// and a shared page only changes by leaving for a private copy).
    Copy(&'a dyn Fn(usize, &mut [u8])),
}

/// Takes resident `page` (frame `f`) out of the region for its write:
/// `Ok(true)` parked; `Ok(false)` it is shared with another process (a
/// child of `fork()` that inherited it: the kernel answers `EBUSY` for as
/// long as the child lives), for [`put_held`]. A page refused otherwise —
/// `EBUSY` for a large folio the kernel could not split just then, or a
/// pin — is waited for as long as any move ([`pagemove::park`]). Caller
/// holds the page's lock.
fn take_out(core: &Core, r: &RegionInner, page: usize, f: u32) -> Result<bool, FaultError> {
    let until_busy = pagemove::Patience::UntilBusy;
    if pagemove::try_park(core, r, page, f, until_busy)? == pagemove::TryPark::Parked {
        return Ok(true);
    }
    let (addr, len) = (r.page_addr(page), r.page_size.bytes());
    let mut shared = Vec::new();
    core.pagemap
        .shared(addr, len / faultline_sys::PAGE_SIZE, &mut shared)
        .map_err(|source| FaultError::Move { addr, source })?;
    if shared.contains(&true) {
        return Ok(false);
    }
    pagemove::park(core, r, page, f).map(|()| true)
}

/// Writes resident `page`, which the kernel holds, from the region
/// ([`OnHeld::Copy`]) if every 4 KiB part of it is there (a part on
/// neither side would fault, under the lock this thread holds). Caller
/// holds the page's lock.
fn put_held(
    core: &Core,
    r: &RegionInner,
    page: usize,
    on_held: OnHeld<'_>,
) -> Result<(), StoreError> {
    let (addr, len) = (r.page_addr(page), r.page_size.bytes());
    let refused = |errno| StoreError::Unreadable {
        page: page as u64,
        source: SysError {
            op: "UFFDIO_MOVE",
            addr,
            len,
            errno,
        },
    };
    let OnHeld::Copy(copy) = on_held else {
        return Err(refused(libc::EBUSY));
    };
    let mut has = Vec::new();
    core.pagemap
        .has_data(addr, len / faultline_sys::PAGE_SIZE, &mut has)
        .map_err(|source| StoreError::Unreadable {
            page: page as u64,
            source,
        })?;
    if has.contains(&false) {
        return Err(refused(libc::EBUSY));
    }
    let mut buf = vec![0u8; len];
    copy(addr, &mut buf);
    put(core, r, page, &buf, AfterWrite::Kept)
}

/// The write-back error for `page`, which could not be taken out of the
/// region: `park` fails with the refused move, or with the store's error
/// while refilling a part the program dropped. A move refused with
/// `EINVAL` is looked into: a page whose protection the program changed
/// (`mprotect`) is [`StoreError::Protected`], naming it.
fn unparkable(r: &RegionInner, page: usize, e: FaultError) -> StoreError {
    let addr = r.page_addr(page);
    let source = match e {
        FaultError::Store { source, .. } => return source,
        FaultError::Move { source, .. } => source,
        _ => SysError {
            op: "UFFDIO_MOVE",
            addr,
            len: r.page_size.bytes(),
            errno: libc::EIO,
        },
    };
    if source.errno == libc::EINVAL {
        // Read-write is how faultline maps regions; anything else is the
        // program's doing.
        if let Ok(Some(prot)) = faultline_sys::mem::protection_at(addr) {
            if prot != "PROT_READ|PROT_WRITE" {
                return StoreError::Protected {
                    page: page as u64,
                    addr,
                    prot,
                };
            }
        }
    }
    StoreError::Unreadable {
        page: page as u64,
        source,
    }
}
