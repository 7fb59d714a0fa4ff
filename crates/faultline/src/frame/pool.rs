//! The frame pool: faultline's "physical memory".
//!
//! One anonymous private mapping, 2 MiB aligned, `MADV_HUGEPAGE`, populated up
//! front and registered in write-protect mode only (so `UFFDIO_MOVE` may
//! move pages back into it, while ordinary faults in it stay with the
//! kernel) with a userfaultfd of its own that asks for no events: dropping
//! slots (the balloon's releases, the copy fill model's dead copies) then
//! raises no removal event for a worker to read. Frame `i` is the 4 KiB slot at
//! `base + i * 4096`; a frame of order `k` is the naturally aligned run of
//! `2^k` slots starting at a multiple of `2^k`.
//!
//! Invariants:
//! - `pages * 4096 == len(mapping)`, `pages % 512 == 0`.
//! - A slot is populated unless its frame is mapped in a region or held by
//!   the balloon (released to the kernel: `budget.rs`): moving a frame into
//!   a region leaves a hole, moving it back fills the hole; the balloon
//!   refills a frame's holes before it frees it. Free and in-flight frames
//!   are therefore always populated, and only their owner writes them. A
//!   frame whose page was *copied* into a region keeps a dead copy in its
//!   slot until `stale.rs` drops it (or keeps it, when the frame is freed).
//! - `zeroed[i]` is set only while slot `i` is populated and all zero: the
//!   pool starts zeroed; a frame returned from a region is not.
//!
//! The pool is never unmapped while the manager lives, and `MADV_DONTNEED`
//! reaches only frames the balloon owns: freed guest memory goes cold on
//! this VM (10-20x slower to touch again), so memory goes back to the kernel
//! only when the budget shrinks or the pool idles above its watermark.
//! - `pmd_mapped[b]` is true while block `b`'s pages are one PMD-mapped THP
//!   in the pool (or in a region, for a 2 MiB frame); the first 4 KiB move
//!   out of such a block splits it for good, under `split_lock`.
//!
//! Locks: `split_lock` (a leaf, taken by a worker for the first 4 KiB move
//! out of a PMD-mapped block). The zero and PMD bits are atomics: zero bits
//! are Relaxed hints that only the frame's owner reads or writes (ordered by
//! the allocator's lock handoff); a PMD bit is cleared (Release) under
//! `split_lock` after the split and read (Acquire) before taking it.

use super::stale::StaleSlots;
use faultline_sys::host;
use faultline_sys::mem::{Advice, Mapping, PageMap};
use faultline_sys::uffd::{RegisterMode, Uffd};
use faultline_sys::{SysError, HUGE_PAGE_SIZE, PAGE_SIZE};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A pool's number: 0 is the budget (the pool faults allocate from).
pub type PoolId = usize;

/// One part of the pool mapping: its size, node binding, pool and zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSpec {
    /// Bytes, a multiple of 2 MiB.
    pub bytes: usize,
    /// NUMA node the part is bound to, if any.
    pub node: Option<u32>,
    /// The pool it belongs to.
    pub pool: PoolId,
    /// Backed by transparent huge pages (false: the small-page zone).
    pub huge: bool,
    /// Populated at build; if not, every frame of the part starts out held
    /// by the balloon ([`super::FramePools::take_unpopulated`]).
    pub populate: bool,
}

/// Pages per 2 MiB block.
pub const PAGES_PER_HUGE: usize = HUGE_PAGE_SIZE / PAGE_SIZE;
/// Buddy order of a 2 MiB frame.
pub const HUGE_ORDER: u8 = 9;

/// How many times [`Pool::make_huge`] asks for a collapse the kernel
/// refuses for a temporary condition.
const COLLAPSE_TRIES: usize = 3;

/// A frame: a naturally aligned run of `2^order` pool slots starting at slot
/// `index`. Owning a `Frame` value means owning the frame (it is not `Clone`):
/// it is in flight with its holder, and goes back through the allocator.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    index: u32,
    order: u8,
}

impl Frame {
    /// Makes a frame from its parts. Only the allocator and the region's
    /// resident-page bookkeeping create frames.
    pub(crate) fn from_parts(index: u32, order: u8) -> Frame {
        debug_assert!(
            index % (1 << order) == 0,
            "frame {index} not aligned to order {order}"
        );
        Frame { index, order }
    }

    /// First 4 KiB slot of the frame.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Buddy order (0: 4 KiB, 9: 2 MiB).
    pub fn order(&self) -> u8 {
        self.order
    }

    /// Number of 4 KiB pages.
    pub fn pages(&self) -> usize {
        1 << self.order
    }

    /// Bytes.
    pub fn bytes(&self) -> usize {
        self.pages() * PAGE_SIZE
    }
}

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A system call failed.
    #[error("frame pool: {0}")]
    Sys(#[from] SysError),
}

/// The frame pool. See the module docs.
#[derive(Debug)]
pub struct Pool {
    map: Mapping,
    pages: usize,
    thp: bool,
    zeroed: Box<[AtomicU64]>,
    pmd_mapped: Box<[AtomicBool]>,
    split_lock: Mutex<()>,
    /// This process's pagemap, opened once, to ask the page tables whether
    /// a block is PMD-mapped (`None` if it could not be opened).
    pagemap: Option<PageMap>,
    /// Slots holding dead copies of pages copied into regions.
    stale: StaleSlots,
}

/// Held for the first 4 KiB move out of a PMD-mapped block; see
/// [`Pool::split_guard`].
#[derive(Debug)]
pub struct SplitGuard<'a> {
    flag: &'a AtomicBool,
    _lock: MutexGuard<'a, ()>,
}

impl SplitGuard<'_> {
    /// Records that the move happened, so the block is split now.
    pub fn mark_split(self) {
        self.flag.store(false, Ordering::Release);
    }
}

impl Pool {
    /// Maps, populates and registers a pool mapping made of consecutive
    /// parts (see [`super::pools`]): `bytes` each (multiples of 2 MiB), bound
    /// to NUMA node `node` if one is named, and backed by transparent huge
    /// pages unless `huge` is false (a small-page zone: 4 KiB pages that
    /// move out without splitting a THP).
    pub fn new(parts: &[PartSpec], uffd: &Uffd) -> Result<Pool, PoolError> {
        let bytes: usize = parts.iter().map(|p| p.bytes).sum();
        debug_assert!(bytes % HUGE_PAGE_SIZE == 0 && bytes > 0);
        let map = Mapping::anonymous(bytes, HUGE_PAGE_SIZE)?;
        let mut at = map.addr();
        for p in parts {
            if let Some(node) = p.node {
                // Before populating: the policy decides where pages come from.
                map.bind_node(at, p.bytes, node)?;
            }
            at += p.bytes;
        }
        let thp =
            host::thp_mode().usable() && map.advise(map.addr(), bytes, Advice::HugePage).is_ok();
        // Frames must stay exclusive to this process for UFFDIO_MOVE: a child
        // of fork() must not share them copy-on-write.
        map.advise(map.addr(), bytes, Advice::DontFork)?;
        // Small-page zones: no THP, so their 4 KiB frames are small folios
        // from the start.
        let mut at = map.addr();
        let mut huge_blocks = Vec::with_capacity(bytes / HUGE_PAGE_SIZE);
        for p in parts {
            if thp && !p.huge {
                map.advise(at, p.bytes, Advice::NoHugePage)?;
            }
            huge_blocks.extend((0..p.bytes / HUGE_PAGE_SIZE).map(|_| thp && p.huge));
            at += p.bytes;
        }
        // Populate what is in use from the start (parts left out are the
        // balloon's: `budget.rs`).
        let mut at = map.addr();
        for p in parts {
            if p.populate {
                map.advise(at, p.bytes, Advice::PopulateWrite)?;
            }
            at += p.bytes;
        }
        uffd.register(
            map.addr(),
            bytes,
            RegisterMode {
                missing: false,
                wp: true,
            },
        )?;
        let pages = bytes / PAGE_SIZE;
        // Populated parts start zeroed; holes are not "zeroed" (a zeroed
        // frame may be moved without being written).
        let zeroed = parts
            .iter()
            .flat_map(|p| {
                let words = p.bytes / PAGE_SIZE / 64;
                let v = if p.populate { u64::MAX } else { 0 };
                (0..words).map(move |_| AtomicU64::new(v))
            })
            .collect();
        let pmd_mapped = huge_blocks.into_iter().map(AtomicBool::new).collect();
        Ok(Pool {
            map,
            pages,
            thp,
            zeroed,
            pmd_mapped,
            split_lock: Mutex::new(()),
            pagemap: PageMap::open().ok(),
            stale: StaleSlots::new(pages),
        })
    }

    /// Number of 4 KiB slots.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Whether the pool is backed by transparent huge pages (2 MiB frames
    /// move as one PMD).
    pub fn thp(&self) -> bool {
        self.thp
    }

    /// Address of a frame's first byte.
    pub fn addr_of(&self, frame: &Frame) -> usize {
        self.map.addr() + frame.index as usize * PAGE_SIZE
    }

    /// Address of slot `index`.
    pub fn slot_addr(&self, index: u32) -> usize {
        self.map.addr() + index as usize * PAGE_SIZE
    }

    /// Whether every page of the frame is known to be zero.
    pub fn is_zeroed(&self, frame: &Frame) -> bool {
        let first = frame.index as usize;
        let n = frame.pages();
        if n >= 64 {
            self.zeroed[first / 64..(first + n) / 64]
                .iter()
                .all(|w| w.load(Ordering::Relaxed) == u64::MAX)
        } else {
            let mask = (u64::MAX >> (64 - n)) << (first % 64);
            self.zeroed[first / 64].load(Ordering::Relaxed) & mask == mask
        }
    }

    /// Records whether the frame's pages are all zero.
    pub fn set_zeroed(&self, frame: &Frame, zero: bool) {
        let first = frame.index as usize;
        let n = frame.pages();
        if n >= 64 {
            for w in &self.zeroed[first / 64..(first + n) / 64] {
                w.store(if zero { u64::MAX } else { 0 }, Ordering::Relaxed);
            }
        } else {
            let mask = (u64::MAX >> (64 - n)) << (first % 64);
            if zero {
                self.zeroed[first / 64].fetch_or(mask, Ordering::Relaxed);
            } else {
                self.zeroed[first / 64].fetch_and(!mask, Ordering::Relaxed);
            }
        }
    }

    /// The bytes of a frame, for filling it. The `&mut Frame` borrow stands
    /// for ownership of the frame for as long as the slice lives.
    ///
    /// # Safety
    /// `frame` is in flight (neither free nor mapped in a region), so its
    /// slots are populated, and it was allocated from this pool.
    pub unsafe fn bytes_mut<'a>(&'a self, frame: &'a mut Frame) -> &'a mut [u8] {
        debug_assert!(frame.index as usize + frame.pages() <= self.pages);
        // SAFETY: the frame lies inside the pool mapping (allocator invariant),
        // its slots are populated (pool invariant for in-flight frames), and
        // only the holder of the unique `&mut Frame` may access its bytes.
        unsafe { std::slice::from_raw_parts_mut(self.addr_of(frame) as *mut u8, frame.bytes()) }
    }

    /// For a frame smaller than 2 MiB from a block that is still one
    /// PMD-mapped THP: the split lock, to be held across the move that splits
    /// the block.
    pub fn split_guard(&self, frame: &Frame) -> Option<SplitGuard<'_>> {
        if frame.order() >= HUGE_ORDER {
            return None;
        }
        let flag = &self.pmd_mapped[frame.index() as usize / PAGES_PER_HUGE];
        if !flag.load(Ordering::Acquire) {
            return None;
        }
        let lock = self.split_lock.lock();
        // Re-check: the holder before us may have split it.
        flag.load(Ordering::Acquire)
            .then_some(SplitGuard { flag, _lock: lock })
    }

    /// Makes the 2 MiB block of `frame` (an in-flight order-9 frame) one
    /// PMD-mapped THP if it is not (`MADV_COLLAPSE`, which copies the block
    /// into a new huge page), so that it moves into a region as one PMD.
    /// Asks the page tables (`PAGEMAP_SCAN`), not `pmd_mapped`: that bit can
    /// stay set for a block that went into a region whole and came back page
    /// by page. Returns whether the block is PMD-mapped now.
    pub fn make_huge(&self, frame: &Frame) -> bool {
        if frame.order() != HUGE_ORDER || !self.thp {
            return false;
        }
        let addr = self.addr_of(frame);
        let flag = &self.pmd_mapped[frame.index() as usize / PAGES_PER_HUGE];
        let ok = self.is_huge_mapped(addr) || self.collapse_block(addr);
        // Release pairs with the Acquire loads in `split_guard`.
        flag.store(ok, Ordering::Release);
        ok
    }

    /// `MADV_COLLAPSE` of the pool block at `addr`, tried again while the
    /// kernel reports a temporary condition (`EAGAIN`: a page lock, a page
    /// not yet on its LRU list), up to [`COLLAPSE_TRIES`] times; then
    /// whether the block is PMD-mapped.
    fn collapse_block(&self, addr: usize) -> bool {
        for _ in 0..COLLAPSE_TRIES {
            match self.map.advise(addr, HUGE_PAGE_SIZE, Advice::Collapse) {
                Ok(()) => return self.is_huge_mapped(addr),
                Err(e) if e.errno == libc::EAGAIN => std::thread::yield_now(),
                Err(_) => return false,
            }
        }
        false
    }

    /// Whether the 2 MiB at `addr` (aligned; any address of this process,
    /// pool or region) are mapped by one PMD right now (`PAGEMAP_SCAN`);
    /// false if the pagemap could not be opened.
    pub fn is_huge_mapped(&self, addr: usize) -> bool {
        self.pagemap.as_ref().is_some_and(|pm| {
            pm.huge_bytes(addr, addr + HUGE_PAGE_SIZE)
                .is_ok_and(|b| b == HUGE_PAGE_SIZE)
        })
    }

    /// Gives the frame's memory back to the kernel (`MADV_DONTNEED`): its
    /// slots become holes, so the frame is neither free nor usable until
    /// [`Pool::refilled`] (after `pagemove::fill_holes`). For the balloon
    /// (`budget.rs`), which owns the frame.
    pub fn release(&self, frame: &Frame) -> Result<(), SysError> {
        self.set_zeroed(frame, false);
        // SAFETY: the caller owns the frame (taken from the allocator):
        // nobody reads, writes or moves its slots, and nothing references
        // them; dropping their content is the point.
        unsafe { self.map.discard(self.addr_of(frame), frame.bytes()) }
    }

    /// A released frame's slots were refilled with zero pages: it is whole
    /// and zero again. A 2 MiB block asks the page tables whether it came
    /// back as one THP (the split lock's bit; see [`Pool::split_guard`]).
    pub fn refilled(&self, frame: &Frame) {
        self.set_zeroed(frame, true);
        if frame.order() >= HUGE_ORDER {
            let huge = self.thp && self.is_huge_mapped(self.addr_of(frame));
            // Release pairs with the Acquire loads in `split_guard`.
            self.pmd_mapped[frame.index() as usize / PAGES_PER_HUGE].store(huge, Ordering::Release);
        }
    }

    /// Populates the holes of a whole 2 MiB block of slots at `addr`
    /// (`MADV_POPULATE_WRITE`: one THP if the block is empty). Only for a
    /// block one frame owns: a fault anywhere in an empty block of this
    /// `MADV_HUGEPAGE` mapping populates all of it, including the slots of
    /// other frames that are mapped in regions — use
    /// [`crate::pagemove::fill_holes`] for anything smaller.
    pub fn populate_block(&self, addr: usize) -> Result<(), SysError> {
        debug_assert!(addr % HUGE_PAGE_SIZE == 0);
        self.map.advise(addr, HUGE_PAGE_SIZE, Advice::PopulateWrite)
    }

    /// Whether `addr` is inside the pool mapping.
    pub fn contains(&self, addr: usize) -> bool {
        self.map.contains(addr, 1)
    }

    /// Slots `first..first + pages` hold dead copies now: their pages were
    /// copied into a region (`frame/stale.rs`). Drops the queue if it is a
    /// batch long; returns the slots dropped. The caller owns the frame.
    pub fn mark_stale(&self, first: u32, pages: usize) -> Result<usize, SysError> {
        // The copy may be zeros, but a slot about to be dropped is not
        // "populated and zero".
        for index in first..first + pages as u32 {
            self.set_zeroed(&Frame { index, order: 0 }, false);
        }
        if self.stale.mark(first, pages) {
            return self.drop_stale();
        }
        Ok(0)
    }

    /// Drops every queued stale slot with one `process_madvise`; returns
    /// how many.
    pub fn drop_stale(&self) -> Result<usize, SysError> {
        let mut result = Ok(());
        let n = self.stale.drain(|slots| {
            result = self.discard_slots(slots);
            result.is_ok()
        });
        result.map(|()| n)
    }

    /// Before a move into `[addr, addr + len)` of the pool: no slot there
    /// holds a dead copy when this returns (dropped: with its batch, or
    /// alone). Returns the slots dropped. The caller owns the frames.
    pub fn clear_stale(&self, addr: usize, len: usize) -> Result<usize, SysError> {
        let mut result = Ok(());
        let n = self
            .stale
            .clear(self.slot_index(addr), len.div_ceil(PAGE_SIZE), |slots| {
                result = self.discard_slots(slots);
                result.is_ok()
            });
        result.map(|()| n.unwrap_or(0))
    }

    /// Before the frames of `[addr, addr + len)` are freed or their holes
    /// filled: dead copies stay (no longer queued), or a drop in progress
    /// finishes first (leaving holes). The caller owns the frames.
    pub fn keep_stale(&self, addr: usize, len: usize) {
        self.stale
            .keep(self.slot_index(addr), len.div_ceil(PAGE_SIZE));
    }

    /// The slot `addr` (inside the pool) lies in: [`Pool::slot_addr`]'s
    /// inverse.
    fn slot_index(&self, addr: usize) -> u32 {
        ((addr - self.map.addr()) / PAGE_SIZE) as u32
    }

    /// Drops the given slots (sorted) with one call, runs of consecutive
    /// slots as one range. A slot in a PMD-mapped block splits it, under
    /// the split lock (see [`Pool::split_guard`]).
    fn discard_slots(&self, slots: &[u32]) -> Result<(), SysError> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for &i in slots {
            let addr = self.slot_addr(i);
            match ranges.last_mut() {
                Some((a, l)) if *a + *l == addr => *l += PAGE_SIZE,
                _ => ranges.push((addr, PAGE_SIZE)),
            }
        }
        let huge: Vec<usize> = slots
            .iter()
            .map(|&i| i as usize / PAGES_PER_HUGE)
            .filter(|&b| self.pmd_mapped[b].load(Ordering::Acquire))
            .collect();
        let _split = (!huge.is_empty()).then(|| self.split_lock.lock());
        // SAFETY: each slot holds a dead copy its drainer won (`stale.rs`):
        // nobody reads, writes or moves it, and nothing references it.
        let r = unsafe { self.map.discard_many(&ranges) };
        if r.is_ok() {
            for b in huge {
                // Release pairs with the Acquire loads in `split_guard`.
                self.pmd_mapped[b].store(false, Ordering::Release);
            }
        }
        r
    }
}
