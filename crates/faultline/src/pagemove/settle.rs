//! The slow path of the move protocol (see the parent module's docs):
//! after any outcome of `UFFDIO_MOVE` but `Done`, read where each page of
//! both ranges stands from the page tables ([`places`]), move what is left
//! run by run until done or the move's patience runs out, and otherwise
//! undo it ([`undo`]), leaving each page wholly on one side.
//!
//! Invariant: a page is never on both sides after a call returns (a
//! `Both` at any look ends the move as `Occupied`, undone), and a page that
//! held data is never reported moved unless the page tables show it at the
//! destination (or dropped there by the program: [`mark_dropped`]).
//! Locks: none; the caller's fault locks or frame ownership (see
//! `move_range`).

use super::{backoff, refusal, Holes, MoveError, Req, DEADLINE};
use crate::core::Core;
use crate::stats::Stats;
use faultline_sys::uffd::Resolved;
use faultline_sys::{SysError, PAGE_SIZE};
use std::sync::atomic::Ordering;
use std::time::Instant;

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
pub(super) enum Known {
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

/// Moves each run `(first page, pages)` from `src` to `dst`; returns the
/// last refusal, if any (the caller re-reads the page tables either way).
///
/// # Safety
/// As [`super::move_range`]; each run is at `src` only.
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
            core.uffd_into(dst + off)
                .move_pages(dst + off, src + off, k * PAGE_SIZE, true)
        } {
            Ok(Resolved::Done) => {}
            Ok(r) => last = Some(refusal(r, dst + off, k * PAGE_SIZE)),
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

/// The slow path of [`super::move_range`]: ask the page tables, move what is left
/// run by run, until done or the deadline; then undo. A move into a region
/// (`wake`) counts a page the program dropped on arrival as done
/// ([`mark_dropped`]): the page is resident with the program's hole, which
/// its next touch refills from the store (`recollect`); such a move, if it
/// must be undone, is left [`MoveError::Split`].
///
/// # Safety
/// As [`super::move_range`].
pub(super) unsafe fn settle(
    core: &Core,
    req: Req,
    mut known: Vec<Known>,
    mut last: SysError,
) -> Result<(), MoveError> {
    let (dst, src, len) = (req.dst, req.src, req.len);
    let (holes, wake, patience) = (req.holes, req.wake, req.patience);
    let n = len / PAGE_SIZE;
    let started = Instant::now();
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
            // Where holes are allowed the first ioctl stops at the first
            // one (`Uffd::move_pages`): ending here is the routine path,
            // not a misreport.
            if holes == Holes::Forbid {
                Stats::bump(&core.stats.move_misreported);
            }
            return finish(core, dst, len, wake);
        }
        // A refusal that is not a transient state (EINVAL: the two ranges'
        // protections differ after an mprotect, a range is not mapped) is
        // final once it repeats: no point waiting for the deadline.
        let hard = !matches!(
            last.errno,
            libc::EAGAIN | libc::EBUSY | libc::EEXIST | libc::ENOENT
        );
        if patience.gives_up(started, round, &last) || (hard && round > 1) {
            // SAFETY: the caller's contract.
            unsafe { undo(core, dst, src, &at)? };
            return Err(MoveError::Refused(last));
        }
        // The first moves of the runs around allowed holes are the
        // routine path; anything after them is a retry.
        if holes == Holes::Forbid || round > 0 {
            Stats::bump(&core.stats.move_retries);
            core.pump_events();
            backoff(round);
        }
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
/// As [`super::move_range`].
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
