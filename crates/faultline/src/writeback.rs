//! Write-back: the one place page bytes go to a region's store. A page is
//! written only when dirty — its bytes differ from the store's copy, by
//! fingerprint ([`crate::dirty`]) — and only from its frame while parked
//! (out of the region, under its fault lock), so the store gets the page as
//! it was at one instant. Reclaim writes evicted pages through [`put`];
//! flush, close and teardown write whole regions through [`write_back`]
//! (`Region::write_back` a range of one).
//!
//! Invariant: a page whose write fails keeps its data (in the region, or
//! parked in its frame) and stays dirty; a later write-back retries it.
//!
//! Locks: the fault locks of a batch of up to [`FLUSH_BATCH_PAGES`] pages
//! ([`write_back`]), only tried while others are held, waited for (bounded
//! with `limit` at teardown, so a worker stuck in a store call cannot hang
//! a drop) only with none held.

use crate::core::Core;
use crate::error::FaultError;
use crate::frame::Frame;
use crate::locks::FaultGuard;
use crate::pagemove;
use crate::region::{PageState, RegionInner};
use crate::store::StoreError;
use faultline_sys::SysError;
use std::sync::atomic::Ordering;

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
    /// Its fault lock (`None`: an earlier entry's guard holds the same
    /// lock).
    _guard: Option<FaultGuard<'a>>,
}

/// Writes every dirty page of `pages` of `r` back. A resident page is written from
/// its frame: parked first (moved out of the region, so no thread can write
/// it during the copy: the store gets the page as it was at one instant,
/// never a torn mix), written, and moved back in. This also reaches pages
/// the kernel swapped out (the move takes the swap entry) and pages the
/// program made unreadable (`mprotect`): those cannot be moved and are
/// reported ([`StoreError::Protected`]), not faulted on. A page shared with another process is not
/// waited for: `on_held` reports it or writes it from the region. A page
/// that fails stays dirty; the others are still written, and the first
/// error is returned. With `limit`, a page whose lock stays held longer (a
/// worker stuck in the store) is skipped and reported.
///
/// Pages go to the store in batches (up to [`FLUSH_BATCH_PAGES`], one
/// `write_pages` call each: for a file, runs of consecutive pages as one
/// vectored write and all of a batch's writes in flight together), each
/// page out of its region with its lock held until its batch is written.
/// Written one by one, a region's 47,000 dirty pages took 3.0 s to write
/// back on the project's virtual disk, which takes 1 MiB writes at 2.8
/// GB/s; in batches 0.18 s (docs/measurements.md §23). Locks: a page's lock is only tried while the batch holds others;
/// one that is held is waited for only after the batch is written and its
/// locks let go — the fault path and reclaim wait for a lock holding none
/// (and migration takes its locks in ascending order), so waiting while
/// holding none cannot close a cycle.
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
    for page in r.used_pages(pages) {
        if matches!(
            r.state(page),
            PageState::Absent | PageState::Poisoned | PageState::Gone
        ) {
            continue;
        }
        let (domain, key) = r.lock_key(page);
        let lock = core.locks.index(domain, key);
        let guard = if batch.iter().any(|t| t.lock == lock) {
            None
        } else if let Some(g) = core.locks.try_lock(domain, key) {
            Some(g)
        } else {
            // Held elsewhere: wait for it holding no other (see above).
            put_batch(core, r, &mut batch, &mut first_err);
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
                continue;
            }
            waited
        };
        let Some((frame, resident)) = park_for_write(core, r, page, on_held, &mut first_err) else {
            continue;
        };
        batch.push(Taken {
            page,
            frame,
            resident,
            lock,
            _guard: guard,
        });
        if batch.len() >= cap {
            put_batch(core, r, &mut batch, &mut first_err);
        }
    }
    put_batch(core, r, &mut batch, &mut first_err);
    first_err.map_or(Ok(()), Err)
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
    let order = r.page_size.order();
    let mut frames: Vec<(&Taken<'_>, Frame)> = taken
        .iter()
        .filter(|t| r.state(t.page) == PageState::Parked(t.frame))
        .map(|t| (t, Frame::from_parts(t.frame, order)))
        .collect();
    {
        // SAFETY: parked frames belong to their pages, whose locks the
        // batch holds and whose states were checked under them just now:
        // nobody else reads or writes them, and they are whole in their
        // slots. Each `&mut Frame` is distinct, so the slices do not alias.
        let bytes: Vec<(usize, &[u8])> = frames
            .iter_mut()
            .map(|(t, f)| (t.page, &*unsafe { core.pool.bytes_mut(f) }))
            .collect();
        if let Err(e) = put_pages(core, r, &bytes) {
            if bytes.len() == 1 {
                first_err.get_or_insert(e);
            } else {
                for &(page, b) in &bytes {
                    if let Err(e) = put(core, r, page, b) {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
    }
    for (t, _) in frames.iter().filter(|(t, _)| t.resident) {
        if let Err(e) = pagemove::unpark(core, r, t.page, t.frame) {
            // Its data stays safe in its frame (parked); the next touch
            // moves it back in.
            core.record(e);
        }
    }
    drop(frames);
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
    put(core, r, page, &buf)
}

/// Writes `bytes`, the content of `page`, to the store unless they are
/// the store's already ([`crate::dirty`]); on success the page is clean.
/// Caller holds the page's lock and `bytes` cannot change meanwhile (a
/// parked frame).
pub(crate) fn put(
    core: &Core,
    r: &RegionInner,
    page: usize,
    bytes: &[u8],
) -> Result<(), StoreError> {
    put_run(core, r, page, &[bytes])
}

/// [`put`] for the consecutive pages from `first` (`bytes[i]` is page
/// `first + i`'s content), their locks held: see [`put_pages`].
pub(crate) fn put_run(
    core: &Core,
    r: &RegionInner,
    first: usize,
    bytes: &[&[u8]],
) -> Result<(), StoreError> {
    let pages: Vec<(usize, &[u8])> = bytes
        .iter()
        .enumerate()
        .map(|(i, &b)| (first + i, b))
        .collect();
    put_pages(core, r, &pages)
}

/// [`put`] for `pages` of `r` (each page and its content, ascending, not
/// necessarily consecutive: a run, or a batch of scattered victims), their
/// locks held: the dirty ones go to the store in one call
/// ([`crate::store::Store::write_pages`]: one round trip to a remote
/// store, all in flight at once to a file). On success all are clean; on
/// an error none is marked clean, so all are written again later.
pub(crate) fn put_pages(
    core: &Core,
    r: &RegionInner,
    pages: &[(usize, &[u8])],
) -> Result<(), StoreError> {
    let stats = &core.stats;
    let fps: Vec<u128> = pages
        .iter()
        .map(|&(_, b)| crate::dirty::fingerprint(b))
        .collect();
    let dirty: Vec<(u64, &[u8])> = pages
        .iter()
        .zip(&fps)
        .filter(|&(&(page, _), &fp)| r.fingerprint(page) != Some(fp))
        .map(|(&(page, b), _)| (page as u64, b))
        .collect();
    let clean = (pages.len() - dirty.len()) as u64;
    stats.clean_skipped.fetch_add(clean, Ordering::Relaxed);
    if !dirty.is_empty() {
        // The store may touch another region (`nesting.rs`): lent for
        // every page but these.
        let _lend = core
            .nesting
            .lend_runs(r.id, runs_of(pages.iter().map(|&(p, _)| p)));
        let t0 = std::time::Instant::now();
        r.store.write_pages(&dirty)?;
        stats.store_writes.record(t0.elapsed().as_nanos() as u64);
    }
    for (&(page, _), &fp) in pages.iter().zip(&fps) {
        r.set_fingerprint(page, fp);
    }
    stats
        .written_back
        .fetch_add(dirty.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// The runs of consecutive pages of an ascending sequence.
fn runs_of(pages: impl Iterator<Item = usize>) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for p in pages {
        match runs.last_mut() {
            Some(run) if run.end == p => run.end += 1,
            _ => runs.push(p..p + 1),
        }
    }
    runs
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
