//! Huge-page collapse: the migration protocol (see the parent module) with
//! one order-9 frame as the target of all 512 pages of a 2 MiB block of a
//! 4 KiB region, moved in as one PMD (`MADV_COLLAPSE` first re-forms the
//! pool block's THP if a 4 KiB move had split it).
//!
//! Invariant: as for migration — each page's data is at every moment in
//! exactly one of the region, its old frame's slot, or the huge frame; a
//! failure leaves pages parked, never lost. Locks: the block's fault
//! locks (`FaultLocks::lock_all`), then leaf locks; the target frame is
//! taken and its THP re-formed (`MADV_COLLAPSE`, which may compact memory)
//! before them; if the locks stay held elsewhere for 20 ms it is given
//! back (a fault holding one may be waiting for a frame) and taken again
//! under them.

use super::{move_in, move_out, run_copy, runs, CopyPlan, MigrateError, MigrateReport, Todo};
use crate::config::PageSize;
use crate::core::Core;
use crate::frame::{Frame, FrameAllocator, PoolId, HUGE_ORDER, PAGES_PER_HUGE};
use crate::locks::FaultGuard;
use crate::region::{PageState, RegionInner};
use crate::stats::Stats;
use faultline_sys::{HUGE_PAGE_SIZE, PAGE_SIZE};

/// Collapses the 512 pages of the 2 MiB block at page `first` of a 4 KiB
/// region into one order-9 frame of pool `pool`, mapped as one PMD where the
/// kernel allows. Returns false if the block already sat in one such frame,
/// mapped by one PMD.
pub(crate) fn collapse(
    core: &Core,
    r: &RegionInner,
    first: usize,
    pool: PoolId,
    plan: CopyPlan,
    report: &mut MigrateReport,
) -> Result<bool, MigrateError> {
    let addr = r.page_addr(first);
    check(core, r, first, pool)?;
    let block = first..first + PAGES_PER_HUGE;
    // A first look without the locks (all of it looked at again under
    // them): a block not all in memory, or already one frame mapped by one
    // PMD, needs no frame.
    if in_one_frame(core, &block_pages(r, block.clone())?, pool, addr) {
        return Ok(false);
    }
    let mut idx = r.lock_indices(&core.locks, block.clone());
    let (huge, _guards) = frame_then_locks(core, &mut idx, pool, addr)?;
    let todo = match block_pages(r, block) {
        Ok(todo) if !r.dying() && !in_one_frame(core, &todo, pool, addr) => Ok(todo),
        Ok(_) => Err(None),
        Err(e) => Err(Some(e)),
    };
    let mut todo = match todo {
        Ok(todo) => todo,
        Err(e) => {
            core.alloc.free(huge);
            return e.map_or(Ok(false), Err);
        }
    };
    let t = todo.len();
    report.refused += move_out(core, r, &mut todo);
    if todo.len() < t {
        // Some page would not move out: put back those that did, give up.
        // (A page the kernel will not take back stays parked in its frame.)
        for x in todo.iter().filter(|x| x.resident) {
            move_in(core, r, x.page, x.old, 1, 0);
        }
        core.alloc.free(huge);
        return Err(MigrateError::NotCollapsible {
            addr,
            what: "a page of the block could not be moved out",
        });
    }
    let pairs: Vec<(u32, u32)> = todo
        .iter()
        .enumerate()
        .map(|(i, x)| (x.old, huge.index() + i as u32))
        .collect();
    report.copy_ns += run_copy(core, &runs(core, &pairs, PAGE_SIZE, 1), plan);
    report.bytes += HUGE_PAGE_SIZE;
    let g = huge.index();
    move_in(core, r, first, g, PAGES_PER_HUGE, 0);
    let mut old: Vec<Frame> = todo.iter().map(|x| Frame::from_parts(x.old, 0)).collect();
    for f in &old {
        core.pool.set_zeroed(f, false);
    }
    core.pool.set_zeroed(&huge, false);
    core.alloc.free_bulk(&mut old);
    // The huge frame now belongs to the block's 512 pages (one order-0
    // frame each, as the region records them); `huge` goes out of scope.
    report.pages += PAGES_PER_HUGE;
    Stats::bump(&core.stats.collapses);
    Ok(true)
}

/// The target frame, then the block's fault locks `idx`. Holding 512
/// frames, the locks are waited for only briefly: a fault holding one of
/// them may be waiting for a frame (for a 2 MiB page, for this one), and is
/// refused after 2 s without progress. Past that, the frame goes back while
/// the locks are waited for, and a frame is taken again under them (and
/// re-formed there: a rare, slower path).
fn frame_then_locks<'a>(
    core: &'a Core,
    idx: &mut Vec<usize>,
    pool: PoolId,
    addr: usize,
) -> Result<(Frame, Vec<FaultGuard<'a>>), MigrateError> {
    let full = || MigrateError::PoolFull {
        pool,
        addr,
        pages: PAGES_PER_HUGE,
    };
    let huge = crate::budget::alloc_in(core, pool, HUGE_ORDER).ok_or_else(full)?;
    // Re-form the target's THP if it was split (a copy inside the pool; the
    // frame is ours and holds nothing yet) before the block's fault locks
    // are taken: MADV_COLLAPSE may compact memory for a long while, and
    // every fault that hashes to those locks would wait for it.
    core.pool.make_huge(&huge);
    if let Some(guards) = core.locks.lock_all_within(idx, FRAME_HELD_WAIT) {
        return Ok((huge, guards));
    }
    core.alloc.free(huge);
    let guards = core.locks.lock_all(idx);
    let huge = crate::budget::alloc_in(core, pool, HUGE_ORDER).ok_or_else(full)?;
    core.pool.make_huge(&huge);
    Ok((huge, guards))
}

/// The longest a collapse waits for its block's fault locks while it holds
/// its target frame.
const FRAME_HELD_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Refuses what cannot be collapsed: no such pool, a 2 MiB region, or not a
/// whole block.
fn check(core: &Core, r: &RegionInner, first: usize, pool: PoolId) -> Result<(), MigrateError> {
    let addr = r.page_addr(first);
    if pool >= core.alloc.count() {
        return Err(MigrateError::NoSuchPool {
            pool,
            pools: core.alloc.count(),
        });
    }
    if r.page_size != PageSize::Base4K {
        return Err(MigrateError::NotCollapsible {
            addr,
            what: "the region already has 2 MiB pages",
        });
    }
    if first % PAGES_PER_HUGE != 0 || first + PAGES_PER_HUGE > r.pages() {
        return Err(MigrateError::NotCollapsible {
            addr,
            what: "not a whole 2 MiB block of the region",
        });
    }
    Ok(())
}

/// The block's pages with their frames; every one must hold data.
fn block_pages(r: &RegionInner, block: std::ops::Range<usize>) -> Result<Vec<Todo>, MigrateError> {
    block
        .map(|page| match r.state(page) {
            PageState::Resident(f) => Ok(Todo {
                page,
                old: f,
                resident: true,
            }),
            PageState::Parked(f) => Ok(Todo {
                page,
                old: f,
                resident: false,
            }),
            PageState::Absent | PageState::Poisoned | PageState::Gone => {
                Err(MigrateError::NotResident {
                    addr: r.page_addr(page),
                })
            }
        })
        .collect()
}

/// Whether the block already sits in one huge frame of `pool`, resident
/// and mapped by one PMD.
fn in_one_frame(core: &Core, todo: &[Todo], pool: PoolId, addr: usize) -> bool {
    let base = todo[0].old;
    base % PAGES_PER_HUGE as u32 == 0
        && core.alloc.pool_of(base) == pool
        && todo
            .iter()
            .enumerate()
            .all(|(i, t)| t.resident && t.old == base + i as u32)
        && core.pool.is_huge_mapped(addr)
}
