//! Migration between pools and huge-page collapse, with a parallel copy
//! (seed 001: Zi Yan's multi-threaded page migration, and Mel Gorman's review
//! — make the serial copy fast first, and do not take CPUs from others).
//!
//! Protocol for a batch of pages (one page of a 2 MiB region, or up to 512
//! pages of one 2 MiB block of a 4 KiB region), as in the kernel:
//! 1. take every fault lock of the batch ([`FaultLocks::lock_all`]: ascending,
//!    waiting at most 10 ms for a held one while holding others);
//! 2. allocate every new frame in the target pool first — a pool without room
//!    fails the batch before anything moved ([`MigrateError::PoolFull`]);
//! 3. move each resident page out of the region into its old frame's pool
//!    slot (`UFFDIO_MOVE`, runs of consecutive frames in one call): from now
//!    on a touch faults and its worker waits on the lock;
//! 4. copy old → new frame ([`copy`]);
//! 5. record the new frame, move it in (waking the waiters) — a parked page
//!    just stays parked in its new frame;
//! 6. free the old frames.
//!
//! Collapse is the same protocol with one order-9 frame as the target of all
//! 512 pages of a block, moved in as one PMD (`MADV_COLLAPSE` first re-forms
//! the pool block's THP if a 4 KiB move had split it).
//!
//! Invariants: a page's data is at every moment in exactly one of: the
//! region (resident), its old frame's slot (moved out), its new frame's slot
//! (copied, not yet moved in); `free + in flight + mapped + parked = pool
//! pages` holds at every lock release. A failure after step 3 leaves the page
//! *parked* in whichever frame holds its data, a state the fault path already
//! serves; nothing is lost.
//!
//! The copy ([`CopyJob`]): pieces of at most `migrate_chunk` bytes. The
//! migrating thread copies pieces itself; with `threads > 1` it also offers
//! the job to the fault workers, and up to `threads - 1` of them take a piece
//! whenever they find no fault to serve (`fault::service::run_worker` checks
//! the userfaultfd before every piece), so a fault waits at most one piece.
//!
//! Locks: the fault locks of the batch, then leaf locks (allocator, copy-job
//! list, the pool's split lock). The job list's mutex is a leaf.

use crate::config::{CopyMethod, PageSize};
use crate::core::Core;
use crate::frame::{Frame, FrameAllocator, PoolId, PAGES_PER_HUGE};
use crate::pagemove::{self, MoveError};
use crate::region::{PageState, RegionInner};
use crate::sync::atomic::Ordering;
use faultline_sys::{HUGE_PAGE_SIZE, PAGE_SIZE};
use std::time::Instant;

mod collapse;
mod copy;

pub(crate) use collapse::collapse;
pub(crate) use copy::help;
use copy::{run_copy, runs};

/// Why a migration or collapse did not (wholly) happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// The target pool does not exist.
    #[error("no pool {pool}: this manager has {pools}")]
    NoSuchPool {
        /// The pool asked for.
        pool: PoolId,
        /// How many pools there are.
        pools: usize,
    },
    /// The target pool has no room; nothing of this batch was moved.
    #[error("pool {pool} has no room for {pages} more 4 KiB pages (batch at {addr:#x}); the data stays where it was")]
    PoolFull {
        /// The target pool.
        pool: PoolId,
        /// First address of the batch that did not fit.
        addr: usize,
        /// 4 KiB pages the batch needed.
        pages: usize,
    },
    /// The byte range is not inside the region.
    #[error("range {start:#x}..{end:#x} is not inside the region")]
    OutOfRange {
        /// Start offset.
        start: usize,
        /// End offset.
        end: usize,
    },
    /// The region was used in a child of `fork()`, where it is not mapped.
    #[error("the region at {addr:#x} belongs to the parent process (a child of fork())")]
    Forked {
        /// The region's address.
        addr: usize,
    },
    /// Collapse needs a 4 KiB-page region and whole 2 MiB blocks, every
    /// page of which it can move out (the kernel may refuse one for a
    /// move's deadline: a page shared with a child of `fork()`, pinned).
    #[error("cannot collapse at {addr:#x}: {what}")]
    NotCollapsible {
        /// The block's address.
        addr: usize,
        /// Why.
        what: &'static str,
    },
    /// A page of a block to collapse is not resident.
    #[error("page {addr:#x} is not resident: collapse needs all 512 pages of its block")]
    NotResident {
        /// The page.
        addr: usize,
    },
}

/// How a migration copies (defaults from the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyPlan {
    /// The copy instruction granularity.
    pub method: CopyMethod,
    /// Threads sharing the copy (the caller plus idle workers).
    pub threads: usize,
    /// Bytes per piece handed to a worker.
    pub chunk: usize,
}

/// What a call did, and how long its parts took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrateReport {
    /// Pages (of the region's page size) now in the target pool that were
    /// not before.
    pub pages: usize,
    /// Bytes copied.
    pub bytes: usize,
    /// Nanoseconds spent copying (the parallel part).
    pub copy_ns: u64,
    /// Nanoseconds in total.
    pub total_ns: u64,
    /// Pages left where they were because the kernel would not move them
    /// for a whole move deadline (a page shared with a child of `fork()`,
    /// or pinned for I/O). The call stops at the first such batch: the rest
    /// of the range is not tried (call again later).
    pub refused: usize,
}

// --------------------------------------------------------------- protocol --

/// One page to move: its index, its old frame, whether it was resident
/// (else parked).
#[derive(Debug, Clone, Copy)]
struct Todo {
    page: usize,
    old: u32,
    resident: bool,
}

/// Migrates the pages `pages` of `r` to pool `pool`.
pub(crate) fn migrate(
    core: &Core,
    r: &RegionInner,
    pages: std::ops::Range<usize>,
    pool: PoolId,
    plan: CopyPlan,
) -> Result<MigrateReport, MigrateError> {
    if pool >= core.alloc.count() {
        return Err(MigrateError::NoSuchPool {
            pool,
            pools: core.alloc.count(),
        });
    }
    let t0 = Instant::now();
    let mut report = MigrateReport::default();
    let per_batch = match r.page_size {
        PageSize::Huge2M => 1,
        PageSize::Base4K => PAGES_PER_HUGE,
    };
    let mut p = pages.start;
    while p < pages.end && report.refused == 0 {
        let end = ((p / per_batch + 1) * per_batch).min(pages.end);
        migrate_batch(core, r, p..end, pool, plan, &mut report)?;
        p = end;
    }
    report.total_ns = t0.elapsed().as_nanos() as u64;
    Ok(report)
}

fn lock_batch<'a>(
    core: &'a Core,
    r: &RegionInner,
    batch: std::ops::Range<usize>,
) -> Vec<crate::locks::FaultGuard<'a>> {
    core.locks.lock_all(&mut r.lock_indices(&core.locks, batch))
}

fn migrate_batch(
    core: &Core,
    r: &RegionInner,
    batch: std::ops::Range<usize>,
    pool: PoolId,
    plan: CopyPlan,
    report: &mut MigrateReport,
) -> Result<(), MigrateError> {
    let _guards = lock_batch(core, r, batch.clone());
    if r.dying() {
        return Ok(());
    }
    let mut todo = to_move(core, r, batch, pool);
    if todo.is_empty() {
        return Ok(());
    }
    let order = r.page_size.order();
    let mut new = Vec::with_capacity(todo.len());
    if crate::budget::alloc_bulk_in(core, pool, order, todo.len(), &mut new) < todo.len() {
        let pages = todo.len() << order;
        core.alloc.free_bulk(&mut new);
        return Err(MigrateError::PoolFull {
            pool,
            addr: r.page_addr(todo[0].page),
            pages,
        });
    }
    new.sort_unstable_by_key(Frame::index);
    report.refused += move_out(core, r, &mut todo);
    if todo.len() < new.len() {
        // Pages that could not be moved out stay where they are.
        let mut spare = new.split_off(todo.len());
        core.alloc.free_bulk(&mut spare);
    }
    let unit = r.page_size.bytes();
    let per_unit = (unit / PAGE_SIZE) as u32;
    let pairs: Vec<(u32, u32)> = todo
        .iter()
        .zip(&new)
        .map(|(t, f)| (t.old, f.index()))
        .collect();
    report.copy_ns += run_copy(core, &runs(core, &pairs, unit, per_unit), plan);
    report.bytes += todo.len() * unit;
    place_new(core, r, &todo, &new);
    report.pages += todo.len();
    core.stats
        .migrated_pages
        .fetch_add(todo.len() as u64, Ordering::Relaxed);
    let mut old: Vec<Frame> = todo
        .iter()
        .map(|t| Frame::from_parts(t.old, order))
        .collect();
    for f in old.iter().chain(&new) {
        core.pool.set_zeroed(f, false);
    }
    core.alloc.free_bulk(&mut old);
    // The `new` frames now belong to their pages (resident or parked): the
    // region's page states record them.
    Ok(())
}

/// The batch's pages that hold data outside `pool`, with their frames.
fn to_move(core: &Core, r: &RegionInner, batch: std::ops::Range<usize>, pool: PoolId) -> Vec<Todo> {
    batch
        .filter_map(|page| match r.state(page) {
            PageState::Resident(f) if core.alloc.pool_of(f) != pool => Some(Todo {
                page,
                old: f,
                resident: true,
            }),
            PageState::Parked(f) if core.alloc.pool_of(f) != pool => Some(Todo {
                page,
                old: f,
                resident: false,
            }),
            _ => None,
        })
        .collect()
}

/// Puts the copied pages in their `new` frames: a parked page just stays
/// parked in its new frame; resident ones are moved in, runs of consecutive
/// resident pages whose new frames are consecutive in one move.
fn place_new(core: &Core, r: &RegionInner, todo: &[Todo], new: &[Frame]) {
    let order = r.page_size.order();
    let per_unit = (r.page_size.bytes() / PAGE_SIZE) as u32;
    let mut i = 0;
    while i < todo.len() {
        let t = todo[i];
        if !t.resident {
            r.set_state(t.page, PageState::Parked(new[i].index()));
            i += 1;
            continue;
        }
        let n = run_at(core, todo, i, per_unit, |j| new[j].index());
        move_in(core, r, t.page, new[i].index(), n, order);
        i += n;
    }
}

/// Length of the run of resident pages starting at `todo[i]`: consecutive
/// pages whose frames (`frame(j)` for entry `j`) are consecutive too, in
/// one part of the pool (`FramePools::same_part`), so one move takes them
/// all.
fn run_at(
    core: &Core,
    todo: &[Todo],
    i: usize,
    per_unit: u32,
    frame: impl Fn(usize) -> u32,
) -> usize {
    let mut n = 1;
    while i + n < todo.len()
        && todo[i + n].resident
        && todo[i + n].page == todo[i].page + n
        && frame(i + n) == frame(i) + n as u32 * per_unit
        && core.alloc.same_part(frame(i), frame(i + n))
    {
        n += 1;
    }
    n
}

/// Moves the resident pages of `todo` out of the region into their old
/// frames' slots (runs of consecutive pages with consecutive frames in one
/// move; a run that does not move whole is parked page by page, which
/// gathers a page the program dropped part of). A page that cannot be moved
/// out is dropped from `todo`: it stays resident in its old frame. Caller
/// holds the pages' locks.
///
/// Bounded: once the kernel has refused a run for a whole move deadline (a
/// page held elsewhere: shared with a child of `fork()`, pinned for I/O),
/// or the batch has taken that long, the resident pages left stay where
/// they are — trying each would wait out a deadline per page while the
/// batch's fault locks, which every fault hashing to them needs, are held.
/// Returns how many were left so.
fn move_out(core: &Core, r: &RegionInner, todo: &mut Vec<Todo>) -> usize {
    let unit = r.page_size.bytes();
    let per_unit = (unit / PAGE_SIZE) as u32;
    let mut keep = vec![true; todo.len()];
    let started = Instant::now();
    let mut held = false;
    let mut refused = 0;
    let mut i = 0;
    while i < todo.len() {
        let t = todo[i];
        if !t.resident {
            i += 1;
            continue;
        }
        let n = run_at(core, todo, i, per_unit, |j| todo[j].old);
        held = held || started.elapsed() > pagemove::DEADLINE;
        if held {
            keep[i..i + n].fill(false);
            refused += n;
            i += n;
            continue;
        }
        let slot = core.pool.slot_addr(t.old);
        // SAFETY: the pages are resident under their locks and their frames'
        // slots are the holes they left; faultline holds no reference into
        // either range.
        let whole = unsafe { pagemove::move_out(core, slot, r.page_addr(t.page), n * unit) };
        match whole {
            Ok(()) => {
                // Out of the region whole, each in its old frame: a page
                // protected until now gets the fingerprint its fill did not
                // take, before its move to the new frame unprotects it.
                for t in &todo[i..i + n] {
                    pagemove::fingerprint_if_protected(core, r, t.page, t.old);
                }
            }
            Err(e) => {
                // A run that did not move whole was put back by moves
                // (`pagemove::settle`), which map its pages writable: none
                // is protected now, whatever its mark said, and a write may
                // land before its park below — so the marks go (a page left
                // with neither mark nor fingerprint counts dirty), and the
                // park takes no fingerprint of bytes it cannot vouch for.
                for t in &todo[i..i + n] {
                    r.set_protected(t.page, false);
                }
                if e.is_held() {
                    held = true;
                    keep[i..i + n].fill(false);
                    refused += n;
                    i += n;
                    continue;
                }
                for j in i..i + n {
                    // Parked now (or, if it cannot be, left resident).
                    keep[j] = pagemove::park(core, r, todo[j].page, todo[j].old)
                        .map_err(|e| core.record(e))
                        .is_ok();
                }
            }
        }
        i += n;
    }
    let mut k = keep.iter();
    todo.retain(|_| k.next().copied().unwrap_or(false));
    refused
}

/// Records `n` pages from `page` as resident in the frames from `first` and
/// moves them in (waking their waiters). If the kernel refuses the move
/// (seen once in two minutes of the release-mode stress test: a 2 MiB move
/// answering `EAGAIN` for 50 ms), they are recorded as *parked* in those
/// frames instead — their data is there, in the target pool, and the next
/// touch maps it (an unpark) — and false is returned. A move left split
/// stays recorded resident: the next fault on a missing part gathers it.
fn move_in(core: &Core, r: &RegionInner, page: usize, first: u32, n: usize, order: u8) -> bool {
    let unit = r.page_size.bytes();
    let per_unit = (unit / PAGE_SIZE) as u32;
    let addr = r.page_addr(page);
    let len = n * unit;
    for i in 0..n {
        r.set_state(page + i, PageState::Resident(first + i as u32 * per_unit));
    }
    pagemove::drop_empty_page_table(core, r, addr, len);
    let lead = Frame::from_parts(first, order);
    let split = if len < HUGE_PAGE_SIZE {
        core.pool.split_guard(&lead)
    } else {
        None
    };
    // SAFETY: the new frames are whole in their slots (copied, in flight
    // with this migration) and the pages are holes under their locks.
    let moved = unsafe { pagemove::move_in(core, addr, core.pool.slot_addr(first), len) };
    match moved {
        Ok(()) => {
            if let Some(g) = split {
                g.mark_split();
            }
            true
        }
        Err(e) => {
            if !matches!(e, MoveError::Split { .. }) {
                for i in 0..n {
                    r.set_state(page + i, PageState::Parked(first + i as u32 * per_unit));
                }
            }
            // The waiters refault and unpark (or gather).
            let _ = core.uffd.wake(addr, len);
            tracing::warn!(addr, len, error = %e, "migration left pages parked");
            core.stats
                .migrate_left_parked
                .fetch_add(n as u64, Ordering::Relaxed);
            false
        }
    }
}
