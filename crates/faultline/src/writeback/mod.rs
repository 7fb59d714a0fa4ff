//! Write-back: the one place page bytes go to a region's store. A page is
//! written only when dirty — not protected, and its bytes differ from the
//! store's copy by fingerprint ([`crate::dirty`]), or it has none (filled
//! for a write) —
//! and only from its frame while parked
//! (out of the region, under its fault lock), so the store gets the page as
//! it was at one instant. Reclaim writes evicted pages through [`put`],
//! [`put_pages`] and [`put_parked`] (this file); flush, close and teardown
//! write whole regions through [`write_back`] (`flush.rs`;
//! `Region::write_back` a range of one).
//!
//! Invariant: a page whose write fails keeps its data (in the region, or
//! parked in its frame) and stays dirty; a later write-back retries it.
//!
//! Locks: none of its own; the callers of [`put`] and its kin hold the
//! pages' fault locks (`flush.rs` says how it takes them).

use crate::core::Core;
use crate::frame::Frame;
use crate::region::RegionInner;
use crate::store::StoreError;
use std::sync::atomic::Ordering;

mod flush;

pub(crate) use flush::{write_back, OnHeld};

/// What becomes of pages once written back, which decides whether the
/// fingerprint of what was written is worth a hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterWrite {
    /// Evicted: their frames are freed, and their fingerprints with them.
    /// A page without a fingerprint (dirty since its fill, `Fault::dirties`)
    /// is written without hashing it at all.
    Evicted,
    /// Kept in their frames (a flush): fingerprinted, so they count clean
    /// until written again.
    Kept,
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
    after: AfterWrite,
) -> Result<(), StoreError> {
    put_pages(core, r, &[(page, bytes)], after)
}

/// Whether `bytes`, the content of `page` of `r`, are the store's copy:
/// the page has a fingerprint and they hash to it ([`crate::dirty`]).
/// Caller holds the page's lock and `bytes` cannot change meanwhile.
pub(crate) fn is_clean(r: &RegionInner, page: usize, bytes: &[u8]) -> bool {
    r.fingerprint(page)
        .is_some_and(|had| crate::dirty::fingerprint(bytes) == had)
}

/// [`put`] for `pages` of `r` (each page and its content, ascending, not
/// necessarily consecutive: a run, or a batch of scattered victims), their
/// locks held: the dirty ones go to the store in one call
/// ([`crate::store::Store::write_pages`]: one round trip to a remote
/// store, all in flight at once to a file). On success all are clean
/// (fingerprinted if `after` keeps them); on an error none is marked
/// clean, so all are written again later.
pub(crate) fn put_pages(
    core: &Core,
    r: &RegionInner,
    pages: &[(usize, &[u8])],
    after: AfterWrite,
) -> Result<(), StoreError> {
    let stats = &core.stats;
    // Each page's fingerprint now, and whether it is dirty. A page with a
    // fingerprint is hashed to see whether it is clean; one without is
    // dirty (a write fault's fill, or a page never written back), hashed
    // only if its fingerprint is kept after the write.
    let fps: Vec<(Option<u128>, bool)> = pages
        .iter()
        .map(|&(page, b)| {
            let had = r.fingerprint(page);
            let now =
                (after == AfterWrite::Kept || had.is_some()).then(|| crate::dirty::fingerprint(b));
            (now, had.is_none() || had != now)
        })
        .collect();
    let dirty: Vec<(u64, &[u8])> = pages
        .iter()
        .zip(&fps)
        .filter(|&(_, &(_, dirty))| dirty)
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
    if after == AfterWrite::Kept {
        for (&(page, _), &(fp, _)) in pages.iter().zip(&fps) {
            if let Some(fp) = fp {
                r.set_fingerprint(page, fp);
            }
        }
    }
    stats
        .written_back
        .fetch_add(dirty.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// [`put_pages`] for pages parked in their frames: `parked` holds each
/// page and its frame, pages ascending (a run, a batch of victims, a
/// flush's batch).
///
/// # Safety
/// Each page is parked in its frame, checked under its fault lock, which
/// the caller holds until this returns: nobody else reads or writes those
/// frames, and each is whole in its slot. No frame appears twice.
pub(crate) unsafe fn put_parked(
    core: &Core,
    r: &RegionInner,
    parked: &[(usize, u32)],
    after: AfterWrite,
) -> Result<(), StoreError> {
    let order = r.page_size.order();
    let mut frames: Vec<Frame> = parked
        .iter()
        .map(|&(_, f)| Frame::from_parts(f, order))
        .collect();
    let bytes: Vec<(usize, &[u8])> = parked
        .iter()
        .zip(frames.iter_mut())
        // SAFETY: the caller's contract; each `&mut Frame` is distinct, so
        // the slices do not alias.
        .map(|(&(page, _), f)| (page, &*unsafe { core.pool.bytes_mut(f) }))
        .collect();
    put_pages(core, r, &bytes, after)
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
