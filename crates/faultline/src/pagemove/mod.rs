//! The page-move protocol: the only caller of `UFFDIO_MOVE`.
//!
//! Every page faultline maps, parks, migrates or takes back moves through
//! [`move_range`], which gives one guarantee: when it returns, each 4 KiB
//! page of the range is wholly on one side, and the caller is told which.
//! `Ok` — every page that held data at the source is at the destination;
//! `Err(Occupied | Refused)` — nothing moved (what had moved was moved
//! back); `Err(Split)` — the kernel would not finish nor undo the move, and
//! the range's pages are split between both sides (never lost: each page is
//! on exactly one side, and [`recollect`] reunites them). One exception, by
//! the program's own hand: in a move into a region, a page the program
//! drops (`MADV_DONTNEED`) as it arrives is on neither side, as after any
//! drop of a resident page; it counts as moved (or, if the move must be
//! undone, the range is left split), and the next touch refills it.
//!
//! Why this module exists: Linux 6.18's `UFFDIO_MOVE` may stop part way
//! (a PTE-by-PTE move of a 2 MiB page whose destination had a page table,
//! a folio split that fails for a moment) and then reports `EAGAIN` with the
//! bytes moved so far, or an error for a move that did happen. Callers that
//! believed the ioctl, or checked only the first and last page with
//! `mincore`, lost data: a 2 MiB page half moved, its first 4 KiB absent,
//! was taken for a page the program had dropped and served afresh with
//! zeros over the other half (the stress test's "shared word lost").
//! So after any outcome but `Done` the protocol reads the page tables of
//! both ranges from `/proc/self/pagemap` (each page table's lock is taken
//! for the read, so an entry is never seen mid-move; swapped-out and
//! migrating pages count as data, which `mincore` missed) and finishes the
//! move page run by page run, or undoes it, within a deadline.
//!
//! [`recollect`] is the other rule kept here: a region page whose frame
//! faultline records but whose 4 KiB pages are not all in the region (the
//! program dropped some with `MADV_DONTNEED`, or a move was left split) is
//! never "served afresh": its pages are moved back into the frame's slot,
//! only the holes nobody holds are refilled (from the store, or zeros), and
//! the frame goes on. No frame is freed while any of its data is elsewhere.
//!
//! The rules for one page built on it — park, unpark, gather a page back
//! into its frame, fill pool holes, drop an empty page table — are in
//! `park.rs`.
//!
//! Locks: none of its own. Callers hold the fault locks of the pages they
//! move (or own the frames outright, in flight), which is what makes the
//! page tables of both ranges stable apart from the kernel's own transient
//! states.

use crate::core::Core;
use crate::stats::Stats;
use faultline_sys::uffd::Resolved;
use faultline_sys::{SysError, PAGE_SIZE};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod park;

pub(crate) use park::{
    drop_empty_page_table, fill_holes, free_whole, is_empty, park, recollect, unpark,
};

/// How long a move keeps retrying pages the kernel refuses for the moment
/// (a reference held briefly, a split in progress) before it undoes itself.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);

/// Whether source pages with no data are an error or skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holes {
    /// Every source page must hold data (a frame in its slot, a resident
    /// page under its lock): a hole is an error ([`MoveError::Refused`]).
    Forbid,
    /// Holes are skipped: gathering a page some of whose 4 KiB pages the
    /// program dropped (see [`recollect`]).
    Allow,
}

/// How a move ended when it did not complete.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MoveError {
    /// A destination page already held data; nothing moved.
    #[error("UFFDIO_MOVE to {addr:#x}: the destination page is occupied")]
    Occupied {
        /// First occupied destination page.
        addr: usize,
    },
    /// The kernel kept refusing (or the call was invalid); nothing moved.
    #[error("{0}")]
    Refused(SysError),
    /// Part of the range moved and could not be moved back in time; each
    /// page is on exactly one side.
    #[error("UFFDIO_MOVE {src:#x} -> {dst:#x}: left split between both sides ({0})", .last)]
    Split {
        /// Destination start.
        dst: usize,
        /// Source start.
        src: usize,
        /// The last refusal.
        last: SysError,
    },
}

impl MoveError {
    /// The kernel refused the whole move for a whole [`DEADLINE`] with a
    /// refusal it lifts on its own (`EAGAIN`, `EBUSY`): a page held
    /// elsewhere — shared with a child of `fork()`, pinned for I/O — or an
    /// event left unread that long. Nothing moved.
    pub(crate) fn is_held(&self) -> bool {
        matches!(self, MoveError::Refused(e) if matches!(e.errno, libc::EAGAIN | libc::EBUSY))
    }

    /// The failure as a system error, for [`crate::FaultError::Move`].
    pub(crate) fn into_sys(self, addr: usize, len: usize) -> SysError {
        let errno = match &self {
            MoveError::Occupied { .. } => libc::EEXIST,
            MoveError::Refused(e) => return *e,
            MoveError::Split { last, .. } => last.errno,
        };
        SysError {
            op: "UFFDIO_MOVE",
            addr,
            len,
            errno,
        }
    }
}

/// Where each page of a move stands, from the page tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// At the source only: still to move.
    Src,
    /// At the destination only: moved.
    Dst,
    /// On both sides: the destination was occupied.
    Both,
    /// On neither: a hole at the source.
    Neither,
    /// On neither, having held data at an earlier look (or moved by the
    /// first call), in a move into a region: moved, then dropped there by
    /// the program ([`mark_dropped`]). Done; nothing to move back.
    Dropped,
}

/// What a move into a region learnt of a page over its looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Never seen holding data.
    Nothing,
    /// Held data, on one side or the other.
    HeldData,
    /// Held data, then was on neither side: dropped by the program.
    Dropped,
}

/// Reads where each page of `dst`/`src` (`n` pages each) stands.
fn places(core: &Core, dst: usize, src: usize, n: usize) -> Result<Vec<Place>, SysError> {
    let (mut d, mut s) = (Vec::with_capacity(n), Vec::with_capacity(n));
    core.pagemap.has_data(dst, n, &mut d)?;
    core.pagemap.has_data(src, n, &mut s)?;
    Ok(d.iter()
        .zip(&s)
        .map(|(&d, &s)| match (d, s) {
            (false, true) => Place::Src,
            (true, false) => Place::Dst,
            (true, true) => Place::Both,
            (false, false) => Place::Neither,
        })
        .collect())
}

/// Runs `(first page, pages)` of consecutive entries equal to `want`.
fn runs_of(places: &[Place], want: Place) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, &p) in places.iter().enumerate() {
        if p != want {
            continue;
        }
        match out.last_mut() {
            Some((s, n)) if *s + *n == i => *n += 1,
            _ => out.push((i, 1)),
        }
    }
    out
}

/// Moves the pages of `[src, src + len)` that hold data to `[dst, dst +
/// len)`, completely or not at all (see the module docs). `wake`: the move
/// is into a region — from a frame's slot to region pages, whose waiting
/// threads are woken once it is complete, and which the program may drop
/// meanwhile (such a page counts as moved: [`settle`]).
///
/// # Safety
/// Both ranges are anonymous memory faultline manages — pool slots of frames
/// the caller owns, region pages whose fault locks the caller holds — and
/// no Rust reference points into either: their contents change places.
pub(crate) unsafe fn move_range(
    core: &Core,
    dst: usize,
    src: usize,
    len: usize,
    holes: Holes,
    wake: bool,
) -> Result<(), MoveError> {
    // SAFETY: the caller's contract. The kernel wakes the destination's
    // waiters itself when the move completes (with `wake`); after a partial
    // move it wakes what moved, and a thread woken early refaults onto the
    // page lock the caller holds.
    let first = unsafe {
        core.uffd
            .move_pages(dst, src, len, !wake, holes == Holes::Allow)
    };
    let (last, done) = match first {
        Ok(Resolved::Done) => return Ok(()),
        Ok(
            Resolved::Retry { done }
            | Resolved::Exists { done }
            | Resolved::SourceHole { done }
            | Resolved::Busy { done },
        ) => {
            let e = SysError {
                op: "UFFDIO_MOVE",
                addr: dst,
                len,
                errno: libc::EAGAIN,
            };
            (e, done)
        }
        Err(e) => (e, 0),
    };
    // The pages the kernel says it moved held data.
    let known = (0..len / PAGE_SIZE)
        .map(|i| {
            if i * PAGE_SIZE < done {
                Known::HeldData
            } else {
                Known::Nothing
            }
        })
        .collect();
    // SAFETY: the caller's contract.
    unsafe { settle(core, dst, src, len, holes, wake, known, last) }
}

/// Moves a frame (or run of frames) at `src` into region pages at `dst`
/// and wakes the threads waiting there: [`move_range`] with every source
/// page required.
///
/// # Safety
/// As [`move_range`].
pub(crate) unsafe fn move_in(
    core: &Core,
    dst: usize,
    src: usize,
    len: usize,
) -> Result<(), MoveError> {
    // SAFETY: the caller's contract.
    unsafe { move_range(core, dst, src, len, Holes::Forbid, true) }
}

/// Moves resident region pages at `src` out to their frames' slots at
/// `dst` (nobody waits on a slot): [`move_range`] with every source page
/// required.
///
/// # Safety
/// As [`move_range`].
pub(crate) unsafe fn move_out(
    core: &Core,
    dst: usize,
    src: usize,
    len: usize,
) -> Result<(), MoveError> {
    // SAFETY: the caller's contract.
    unsafe { move_range(core, dst, src, len, Holes::Forbid, false) }
}

/// Moves each run `(first page, pages)` from `src` to `dst`; returns the
/// last refusal, if any (the caller re-reads the page tables either way).
///
/// # Safety
/// As [`move_range`]; each run is at `src` only.
unsafe fn move_runs(
    core: &Core,
    dst: usize,
    src: usize,
    runs: &[(usize, usize)],
) -> Option<SysError> {
    let mut last = None;
    for &(i, k) in runs {
        let off = i * PAGE_SIZE;
        // SAFETY: the caller's contract.
        match unsafe {
            core.uffd
                .move_pages(dst + off, src + off, k * PAGE_SIZE, true, false)
        } {
            Ok(Resolved::Done) => {}
            Ok(_) => {
                last = Some(SysError {
                    op: "UFFDIO_MOVE",
                    addr: dst + off,
                    len: k * PAGE_SIZE,
                    errno: libc::EAGAIN,
                })
            }
            Err(e) => last = Some(e),
        }
    }
    last
}

fn finish(core: &Core, dst: usize, len: usize, wake: bool) -> Result<(), MoveError> {
    if wake {
        core.uffd.wake(dst, len).map_err(MoveError::Refused)?;
    }
    Ok(())
}

/// In a move into a region: marks `Dropped` the pages on neither side
/// that held data at an earlier look, and notes in `known` what each page
/// held. The program's `MADV_DONTNEED` reports its range, waits until the
/// event is read — which a move waiting out `mmap_changing` does itself
/// ([`Core::pump_events`]) — and zaps afterwards, so it can zap a page
/// this move has just put in. The source is a frame's slot, which only
/// faultline empties, and only for a frame it owns: a page that held data
/// and is now on neither side was moved, then dropped. Returns how many
/// pages were found dropped at this look.
fn mark_dropped(at: &mut [Place], known: &mut [Known]) -> u64 {
    let mut found = 0;
    for (p, k) in at.iter_mut().zip(known.iter_mut()) {
        *k = match (*p, *k) {
            (Place::Neither, Known::HeldData) => {
                found += 1;
                Known::Dropped
            }
            (Place::Neither | Place::Dropped, k) => k,
            (Place::Src | Place::Dst | Place::Both, _) => Known::HeldData,
        };
        if *k == Known::Dropped {
            *p = Place::Dropped;
        }
    }
    found
}

/// The slow path of [`move_range`]: ask the page tables, move what is left
/// run by run, until done or the deadline; then undo. A move into a region
/// (`wake`) counts a page the program dropped on arrival as done
/// ([`mark_dropped`]): the page is resident with the program's hole, which
/// its next touch refills from the store (`recollect`); such a move, if it
/// must be undone, is left [`MoveError::Split`].
///
/// # Safety
/// As [`move_range`].
#[allow(clippy::too_many_arguments)]
unsafe fn settle(
    core: &Core,
    dst: usize,
    src: usize,
    len: usize,
    holes: Holes,
    wake: bool,
    mut known: Vec<Known>,
    mut last: SysError,
) -> Result<(), MoveError> {
    let n = len / PAGE_SIZE;
    let deadline = Instant::now() + DEADLINE;
    let mut round = 0u32;
    loop {
        let mut at = places(core, dst, src, n).map_err(MoveError::Refused)?;
        if wake {
            let found = mark_dropped(&mut at, &mut known);
            core.stats.move_dropped.fetch_add(found, Ordering::Relaxed);
        }
        if let Some(i) = at.iter().position(|&p| p == Place::Both) {
            // SAFETY: the caller's contract.
            unsafe { undo(core, dst, src, &at)? };
            return Err(MoveError::Occupied {
                addr: dst + i * PAGE_SIZE,
            });
        }
        if holes == Holes::Forbid && at.contains(&Place::Neither) && round > 8 {
            // A source page with no data, and no transient state explains
            // it: the caller's belief was wrong. Put back what moved.
            // SAFETY: the caller's contract.
            unsafe { undo(core, dst, src, &at)? };
            return Err(MoveError::Refused(SysError {
                op: "UFFDIO_MOVE",
                addr: src,
                len,
                errno: libc::ENOENT,
            }));
        }
        let pending = runs_of(&at, Place::Src);
        if pending.is_empty() && (holes == Holes::Allow || !at.contains(&Place::Neither)) {
            Stats::bump(&core.stats.move_misreported);
            return finish(core, dst, len, wake);
        }
        // A refusal that is not a transient state (EINVAL: the two ranges'
        // protections differ after an mprotect, a range is not mapped) is
        // final once it repeats: no point waiting for the deadline.
        let hard = !matches!(
            last.errno,
            libc::EAGAIN | libc::EBUSY | libc::EEXIST | libc::ENOENT
        );
        if Instant::now() > deadline || (hard && round > 1) {
            // SAFETY: the caller's contract.
            unsafe { undo(core, dst, src, &at)? };
            return Err(MoveError::Refused(last));
        }
        Stats::bump(&core.stats.move_retries);
        core.pump_events();
        backoff(round);
        round += 1;
        // SAFETY: the caller's contract; the runs are at the source only.
        if let Some(e) = unsafe { move_runs(core, dst, src, &pending) } {
            last = e;
        }
    }
}

/// Moves every page that reached the destination back to the source. On
/// failure the range stays split: [`MoveError::Split`] — also when a page
/// cannot go back because the program dropped it in the region (marked
/// `Dropped` by the caller, or at the destination at one look and on
/// neither side at the next).
///
/// # Safety
/// As [`move_range`].
unsafe fn undo(core: &Core, dst: usize, src: usize, at: &[Place]) -> Result<(), MoveError> {
    let n = at.len();
    let deadline = Instant::now() + DEADLINE;
    let mut at = at.to_vec();
    let mut round = 0u32;
    loop {
        let moved = runs_of(&at, Place::Dst);
        let lost = at.contains(&Place::Dropped);
        if moved.is_empty() && !lost {
            return Ok(());
        }
        // SAFETY: the caller's contract; the runs are at the destination
        // only, where this move put them.
        let last = unsafe { move_runs(core, src, dst, &moved) };
        let now = places(core, dst, src, n).map_err(MoveError::Refused)?;
        // A page left at the destination and now on neither side was
        // dropped there: it cannot go back.
        at = at
            .iter()
            .zip(now)
            .map(|(&was, p)| match (was, p) {
                (Place::Dst | Place::Dropped, Place::Neither) => Place::Dropped,
                (_, p) => p,
            })
            .collect();
        let lost = at.contains(&Place::Dropped);
        if !at.contains(&Place::Dst) && !lost {
            return Ok(());
        }
        if Instant::now() > deadline || !at.contains(&Place::Dst) {
            // Or only dropped pages are left: the range is split (the
            // next touch gathers it).
            return Err(MoveError::Split {
                dst,
                src,
                last: last.unwrap_or(SysError {
                    op: "UFFDIO_MOVE",
                    addr: src,
                    len: n * PAGE_SIZE,
                    errno: libc::EAGAIN,
                }),
            });
        }
        backoff(round);
        round += 1;
    }
}

/// A few quick retries, then back off: a source the kernel holds for a
/// moment (a per-CPU LRU batch, a split in progress) needs time, not spin.
pub(super) fn backoff(round: u32) {
    if round < 8 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_group_consecutive_pages() {
        use Place::*;
        let at = [Src, Src, Dst, Src, Neither, Src, Src, Src];
        assert_eq!(runs_of(&at, Src), vec![(0, 2), (3, 1), (5, 3)]);
        assert_eq!(runs_of(&at, Dst), vec![(2, 1)]);
        assert!(runs_of(&at, Both).is_empty());
    }

    /// A page that held data and is then on neither side was dropped on
    /// arrival, and stays done; a page never seen holding data is a hole.
    #[test]
    fn a_page_that_held_data_then_none_was_dropped() {
        use Place::*;
        let mut known = vec![Known::Nothing, Known::HeldData, Known::Nothing];
        let mut at = [Neither, Neither, Src];
        assert_eq!(mark_dropped(&mut at, &mut known), 1);
        assert_eq!(at, [Neither, Dropped, Src]);
        // The next look: the source page moved in and was dropped too.
        let mut at = [Neither, Neither, Neither];
        assert_eq!(mark_dropped(&mut at, &mut known), 1);
        assert_eq!(at, [Neither, Dropped, Dropped]);
        assert_eq!(known, [Known::Nothing, Known::Dropped, Known::Dropped]);
        // Data again (written after the drop): held data once more.
        let mut at = [Dst, Dst, Neither];
        assert_eq!(mark_dropped(&mut at, &mut known), 0);
        assert_eq!(at, [Dst, Dst, Dropped]);
    }
}
