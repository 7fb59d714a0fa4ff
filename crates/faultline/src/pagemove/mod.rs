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
//! move page run by page run, or undoes it, within a deadline. A move
//! nobody needs (reclaim parking a page it may as well pass over) has a
//! brief patience instead ([`move_back`], [`Patience`]): it gives up at the
//! kernel's first `EBUSY` — a page shared copy-on-write with a child of
//! `fork()`, or pinned for I/O, which may stay so for as long as the
//! holder likes — rather than hold the page's fault lock for the deadline.
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
//! `park.rs`; the copy fill model's install, which falls back to this
//! protocol for anything but a whole copy, in `copy.rs`.
//!
//! Locks: none of its own. Callers hold the fault locks of the pages they
//! move (or own the frames outright, in flight), which is what makes the
//! page tables of both ranges stable apart from the kernel's own transient
//! states.

use crate::core::Core;
use faultline_sys::uffd::Resolved;
use faultline_sys::{SysError, PAGE_SIZE};
use std::time::{Duration, Instant};

mod copy;
mod park;
mod settle;

use settle::{settle, Known};

pub(crate) use copy::{by_copy, copy_in, drop_dead_copies};
pub(crate) use park::{
    drop_empty_page_table, fill_holes, fingerprint_if_protected, free_whole, give_back_if_emptied,
    is_empty, park, park_run, recollect, try_park, unpark, unpark_run, Emptied, TryPark,
};

/// How long a move keeps retrying pages the kernel refuses for the moment
/// (a reference held briefly, a split in progress) before it undoes itself.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);

/// How long a move retries refusals before it undoes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// [`DEADLINE`]: the move is needed (a fault waits for it, a flush
    /// must write the page).
    Deadline,
    /// A move whose pages may stay where they are if another holder has
    /// them ([`move_back`]: a flush, which reports such a page; a teardown,
    /// which writes it from the region): gives up at the first `EBUSY`,
    /// else as [`Patience::Deadline`].
    UntilBusy,
    /// A move nobody needs to complete ([`move_back`]: reclaim
    /// parking a page it may as well pass over): gives up at the first
    /// `EBUSY` (a page held elsewhere), else after [`BRIEFLY`] and at least
    /// [`MIN_ROUNDS`] rounds (enough to tell a hole from a transient state:
    /// see [`settle()`]).
    Brief,
}

/// How long a [`Patience::Brief`] move retries `EAGAIN`.
const BRIEFLY: Duration = Duration::from_millis(1);

/// The rounds a [`Patience::Brief`] move makes at least.
const MIN_ROUNDS: u32 = 10;

impl Patience {
    /// Whether a move that started at `started` and has made `round`
    /// rounds, refused last with `last`, gives up now.
    fn gives_up(self, started: Instant, round: u32, last: &SysError) -> bool {
        let busy = last.errno == libc::EBUSY;
        match self {
            Patience::Deadline => started.elapsed() > DEADLINE,
            Patience::UntilBusy => busy || started.elapsed() > DEADLINE,
            Patience::Brief => busy || (started.elapsed() > BRIEFLY && round >= MIN_ROUNDS),
        }
    }
}

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
    /// The kernel refused the whole move for the move's whole patience
    /// ([`Patience`]) with a refusal it lifts on its own (`EAGAIN`,
    /// `EBUSY`): a page held elsewhere — shared with a child of `fork()`,
    /// pinned for I/O — or an event left unread that long. Nothing moved.
    pub(crate) fn is_held(&self) -> bool {
        matches!(self, MoveError::Refused(e) if matches!(e.errno, libc::EAGAIN | libc::EBUSY))
    }

    /// The kernel's last word was `EBUSY`: a page it will not move while
    /// another holder has it (shared copy-on-write with a child of
    /// `fork()`, pinned for I/O), which may last. Nothing moved.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self, MoveError::Refused(e) if e.errno == libc::EBUSY)
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

/// Moves the pages of `[src, src + len)` that hold data to `[dst, dst +
/// len)`, completely or not at all (see the module docs). `wake`: the move
/// is into a region — from a frame's slot to region pages, whose waiting
/// threads are woken once it is complete, and which the program may drop
/// meanwhile (such a page counts as moved: [`settle()`]).
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
    let req = Req {
        dst,
        src,
        len,
        holes,
        wake,
        patience: Patience::Deadline,
    };
    // SAFETY: the caller's contract.
    unsafe { move_within(core, req) }
}

/// One move as asked: `len` bytes from `src` to `dst`, with what holes
/// and waking mean ([`move_range`]) and how long refusals are retried.
#[derive(Debug, Clone, Copy)]
struct Req {
    dst: usize,
    src: usize,
    len: usize,
    holes: Holes,
    wake: bool,
    patience: Patience,
}

/// [`move_range`], retrying refused pages with `req.patience`.
///
/// # Safety
/// As [`move_range`].
unsafe fn move_within(core: &Core, req: Req) -> Result<(), MoveError> {
    let (dst, src, len) = (req.dst, req.src, req.len);
    let wake = req.wake;
    if !wake && core.pool.contains(dst) {
        // Into pool slots: a slot still holding a dead copy of a page the
        // copy fill model put into a region is dropped first (a move needs
        // a hole there).
        let cleared = core.pool.clear_stale(dst, len);
        let refused = cleared.as_ref().err().copied();
        copy::count_dropped(core, dst, cleared);
        if let Some(e) = refused {
            return Err(MoveError::Refused(e));
        }
    }
    // SAFETY: the caller's contract. The kernel wakes the destination's
    // waiters itself when the move completes (with `wake`); after a partial
    // move it wakes what moved, and a thread woken early refaults onto the
    // page lock the caller holds. Holes stop the ioctl even where they are
    // allowed (the kernel's flag for them can spin forever: see
    // `Uffd::move_pages`): `settle` moves the runs of data around them.
    let first = unsafe { core.uffd_into(dst).move_pages(dst, src, len, !wake) };
    let (last, done) = match first {
        Ok(Resolved::Done) => return Ok(()),
        Ok(
            r @ (Resolved::Retry { done }
            | Resolved::Exists { done }
            | Resolved::SourceHole { done }
            | Resolved::Busy { done }),
        ) => (refusal(r, dst, len), done),
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
    unsafe { settle(core, req, known, last) }
}

/// A move the kernel did not complete as a system error: `EBUSY` stays
/// itself (a page held elsewhere: [`MoveError::is_busy`]); every other
/// partial answer reads as `EAGAIN` (the page tables say the rest).
fn refusal(r: Resolved, addr: usize, len: usize) -> SysError {
    let errno = match r {
        Resolved::Busy { .. } => libc::EBUSY,
        _ => libc::EAGAIN,
    };
    SysError {
        op: "UFFDIO_MOVE",
        addr,
        len,
        errno,
    }
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

/// Moves region pages at `src` back to their frames' slots at `dst` (no
/// wake), retrying refusals with `patience`: [`Patience::Brief`] for
/// reclaim, which may as well pass a page over; [`Patience::UntilBusy`]
/// for a flush or teardown, which must not wait on a page another holder
/// has. `holes` as for [`move_range`].
///
/// # Safety
/// As [`move_range`].
pub(crate) unsafe fn move_back(
    core: &Core,
    dst: usize,
    src: usize,
    len: usize,
    holes: Holes,
    patience: Patience,
) -> Result<(), MoveError> {
    let req = Req {
        dst,
        src,
        len,
        holes,
        wake: false,
        patience,
    };
    // SAFETY: the caller's contract.
    unsafe { move_within(core, req) }
}

/// Rounds of [`while_changing`] before it gives up.
const CHANGING_ROUNDS: u32 = 1000;

/// Runs `call`, a userfaultfd ioctl `op` on `[addr, addr + len)`, until it
/// answers what `done` accepts; any other answer is `EAGAIN` (the address
/// space is changing: an unmap event not read yet), after which the events
/// are pumped and the next try backs off — [`CHANGING_ROUNDS`] times, then
/// `EAGAIN` is `op`'s error. An error ends it at once.
pub(crate) fn while_changing(
    core: &Core,
    (op, addr, len): (&'static str, usize, usize),
    mut call: impl FnMut() -> Result<Resolved, SysError>,
    done: impl Fn(&Resolved) -> bool,
) -> Result<(), SysError> {
    let mut round = 0;
    loop {
        if done(&call()?) {
            return Ok(());
        }
        if round == CHANGING_ROUNDS {
            return Err(SysError {
                op,
                addr,
                len,
                errno: libc::EAGAIN,
            });
        }
        core.pump_events();
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
