//! Frame allocation: the [`FrameAllocator`] interface, and [`FrameAlloc`] —
//! a buddy allocator under one "zone lock" with per-CPU lists of 4 KiB frames
//! in front of it, like the kernel's pcp lists (seed 004).
//!
//! - `alloc(0)` / `free(order 0)` use the list of the CPU the caller runs on
//!   (`sched_getcpu`, served by rseq), under that list's own lock, which is
//!   uncontended unless a thread migrates between reading the CPU number and
//!   locking. An empty list is refilled with `batch` frames from the buddy
//!   allocator under one zone-lock acquisition; a list above `high` frames
//!   drains `batch` of its oldest back the same way.
//! - Other orders, `alloc_bulk` and `free_bulk` go to the buddy allocator, one
//!   zone-lock acquisition per call, and get contiguous runs where there are
//!   any (fault-around and read-ahead move a run with one `UFFDIO_MOVE`).
//! - `pcp = false` (the pre-seed baseline): every call takes the zone lock.
//! - The lists together hold at most an eighth of the pool: `high` is cut to
//!   `pages / (8 x lists)` (and `batch` to `high`), as the kernel sizes
//!   `pcp->high` from the zone and the CPU count. Without it, 64 lists of
//!   1024 frames would hide a 256 MiB pool from the buddy allocator, its
//!   2 MiB runs and the reclaimer's free count.
//!
//! Invariant (checked by [`FrameAlloc::check`]):
//! `buddy.free + sum(pcp[c].len) + outstanding = pages`, where `outstanding`
//! (frames handed out and not yet returned: in flight with a worker, or mapped
//! in a region) is kept as per-list signed counters, so the hot path touches
//! no shared cache line. The manager checks the other half:
//! `outstanding = in flight + mapped`.
//!
//! Lock order: a pcp lock, then the zone lock; never the other way round.

use super::buddy::Buddy;
use super::pool::Frame;
use crate::sync::{Mutex, SpinLock};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The per-CPU lists together hold at most `1 / LISTS_SHARE` of the pool.
const LISTS_SHARE: usize = 8;

/// What the fault path needs from an allocator.
pub trait FrameAllocator: Send + Sync + std::fmt::Debug {
    /// One frame of `order`, or `None` when no free run that large is left.
    fn alloc(&self, order: u8) -> Option<Frame>;
    /// Returns a frame.
    fn free(&self, frame: Frame);
    /// Up to `n` frames of `order` appended to `out`, under one lock
    /// acquisition, preferring contiguous runs; returns how many.
    fn alloc_bulk(&self, order: u8, n: usize, out: &mut Vec<Frame>) -> usize;
    /// Returns every frame in `frames` (which is left empty) under one lock
    /// acquisition.
    fn free_bulk(&self, frames: &mut Vec<Frame>);
    /// Free memory, in 4 KiB pages (buddy plus per-CPU lists).
    fn free_pages(&self) -> usize;
    /// A cheap, lock-free estimate of free memory in 4 KiB pages (the buddy
    /// allocator's count as of its last change; per-CPU lists not included),
    /// for policy decisions such as whether to fault around.
    fn free_hint(&self) -> usize;
    /// Panics if an invariant is broken (tests and debug builds).
    fn check(&self);
}

/// How the allocator is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocConfig {
    /// Per-CPU lists in front of the buddy allocator.
    pub pcp: bool,
    /// Frames moved per refill or drain.
    pub batch: usize,
    /// A list above this many frames drains `batch`.
    pub high: usize,
    /// Number of per-CPU lists (CPUs).
    pub cpus: usize,
}

#[derive(Debug, Default)]
struct Pcp {
    /// Free 4 KiB frames, hottest (most recently freed) last.
    frames: Vec<u32>,
    /// Frames handed out through this list minus frames returned to it.
    outstanding: isize,
}

#[derive(Debug)]
struct Zone {
    buddy: Buddy,
    /// Pages handed out by the zone directly minus pages returned directly.
    outstanding: isize,
    /// Reused by `free_bulk` to sort frames (no allocation under the lock).
    scratch: Vec<u32>,
}

/// The frame allocator. See the module docs.
#[derive(Debug)]
pub struct FrameAlloc {
    zone: CachePadded<Mutex<Zone>>,
    pcp: Box<[CachePadded<SpinLock<Pcp>>]>,
    config: AllocConfig,
    pages: usize,
    /// `buddy.free_pages()` as of the last zone change (Relaxed: a hint).
    zone_free: AtomicUsize,
}

impl FrameAlloc {
    /// An allocator over `pages` pages (a multiple of 512), all free.
    pub fn new(pages: usize, config: AllocConfig) -> FrameAlloc {
        Self::with_buddy(Buddy::new(pages), 0, config)
    }

    /// An allocator over `pages` pages, all handed out (the caller owns
    /// every 2 MiB frame and frees them in when it will); its bookkeeping
    /// costs no memory until then.
    pub fn new_taken(pages: usize, config: AllocConfig) -> FrameAlloc {
        Self::with_buddy(Buddy::new_taken(pages), pages as isize, config)
    }

    fn with_buddy(buddy: Buddy, outstanding: isize, config: AllocConfig) -> FrameAlloc {
        let lists = if config.pcp { config.cpus.max(1) } else { 0 };
        let pages = buddy.pages();
        let free = buddy.free_pages();
        // The lists' share of the pool: an eighth, split between them.
        let share = (pages / (LISTS_SHARE * lists.max(1))).max(1);
        let high = config.high.max(config.batch.max(1)).min(share);
        FrameAlloc {
            zone: CachePadded::new(Mutex::new(Zone {
                buddy,
                outstanding,
                scratch: Vec::new(),
            })),
            pcp: (0..lists)
                .map(|_| CachePadded::new(SpinLock::new(Pcp::default())))
                .collect(),
            config: AllocConfig {
                batch: config.batch.clamp(1, high),
                high,
                ..config
            },
            pages,
            zone_free: AtomicUsize::new(free),
        }
    }

    /// The list of CPU `cpu` (no division on the hot path: CPU numbers are
    /// below the list count unless CPUs were hot-added).
    #[inline]
    fn list(&self, cpu: usize) -> &SpinLock<Pcp> {
        let n = self.pcp.len();
        &self.pcp[if cpu < n { cpu } else { cpu % n }]
    }

    fn note(&self, z: &Zone) {
        self.zone_free
            .store(z.buddy.free_pages(), Ordering::Relaxed);
    }

    /// The configuration in force (`high` and `batch` as cut to the
    /// lists' share of the pool).
    #[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
    pub fn config(&self) -> AllocConfig {
        self.config
    }

    /// `alloc` on behalf of CPU `cpu` (tests and loom models pick the CPU).
    pub fn alloc_on(&self, cpu: usize, order: u8) -> Option<Frame> {
        if order == 0 && !self.pcp.is_empty() {
            let mut l = self.list(cpu).lock();
            if l.frames.is_empty() {
                let mut z = self.zone.lock();
                z.buddy.alloc_bulk(0, self.config.batch, &mut l.frames);
                self.note(&z);
                // Hand out the lowest address first.
                l.frames.reverse();
            }
            if let Some(p) = l.frames.pop() {
                l.outstanding += 1;
                return Some(Frame::from_parts(p, 0));
            }
        }
        if let Some(f) = self.alloc_zone(order) {
            return Some(f);
        }
        // Out of memory in the zone: the other CPUs' lists may hold what we
        // need (or buddies that merge into it). Drain them all and retry once,
        // as the kernel's drain_all_pages() does.
        if self.drain_all() > 0 {
            return self.alloc_zone(order);
        }
        None
    }

    fn alloc_bulk_zone(&self, order: u8, n: usize, out: &mut Vec<Frame>) -> usize {
        let mut z = self.zone.lock();
        let mut idx = Vec::with_capacity(n);
        let got = z.buddy.alloc_bulk(order, n, &mut idx);
        z.outstanding += (got << order) as isize;
        self.note(&z);
        out.extend(idx.into_iter().map(|p| Frame::from_parts(p, order)));
        got
    }

    fn alloc_zone(&self, order: u8) -> Option<Frame> {
        let mut z = self.zone.lock();
        let p = z.buddy.alloc(order)?;
        z.outstanding += 1 << order;
        self.note(&z);
        Some(Frame::from_parts(p, order))
    }

    /// Returns every per-CPU list's frames to the buddy allocator; returns
    /// how many. Takes each list's lock in turn (never two at once).
    pub fn drain_all(&self) -> usize {
        let mut n = 0;
        for l in self.pcp.iter() {
            let mut l = l.lock();
            if l.frames.is_empty() {
                continue;
            }
            let mut z = self.zone.lock();
            n += l.frames.len();
            for p in l.frames.drain(..) {
                z.buddy.free(p, 0);
            }
            self.note(&z);
        }
        n
    }

    /// `free` on behalf of CPU `cpu`.
    pub fn free_on(&self, cpu: usize, frame: Frame) {
        if frame.order() != 0 || self.pcp.is_empty() {
            let mut z = self.zone.lock();
            z.buddy.free(frame.index(), frame.order());
            z.outstanding -= 1 << frame.order();
            self.note(&z);
            return;
        }
        let mut l = self.list(cpu).lock();
        l.frames.push(frame.index());
        l.outstanding -= 1;
        if l.frames.len() > self.config.high {
            let mut z = self.zone.lock();
            // The oldest (coldest) frames go back.
            for p in l.frames.drain(..self.config.batch) {
                z.buddy.free(p, 0);
            }
            self.note(&z);
        }
    }
}

impl FrameAllocator for FrameAlloc {
    fn alloc(&self, order: u8) -> Option<Frame> {
        self.alloc_on(faultline_sys::host::current_cpu(), order)
    }

    fn free(&self, frame: Frame) {
        self.free_on(faultline_sys::host::current_cpu(), frame);
    }

    fn alloc_bulk(&self, order: u8, n: usize, out: &mut Vec<Frame>) -> usize {
        let got = self.alloc_bulk_zone(order, n, out);
        // Short: the per-CPU lists may hold the rest (or buddies that merge
        // into it), as in `alloc_on`.
        if got < n && self.drain_all() > 0 {
            return got + self.alloc_bulk_zone(order, n - got, out);
        }
        got
    }

    fn free_bulk(&self, frames: &mut Vec<Frame>) {
        if frames.is_empty() {
            return;
        }
        // Coalesce 4 KiB frames into the largest aligned runs first, so a run
        // handed out by `alloc_bulk` goes back as a few blocks, not as many
        // single pages merging one by one.
        let mut z = self.zone.lock();
        let mut small = std::mem::take(&mut z.scratch);
        small.clear();
        for f in frames.drain(..) {
            z.outstanding -= 1 << f.order();
            if f.order() == 0 {
                small.push(f.index());
            } else {
                z.buddy.free(f.index(), f.order());
            }
        }
        if !small.is_sorted() {
            small.sort_unstable();
        }
        let mut i = 0;
        while i < small.len() {
            let p = small[i];
            let mut run = 1;
            while i + run < small.len() && small[i + run] == p + run as u32 {
                run += 1;
            }
            let (mut q, mut left) = (p, run);
            while left > 0 {
                let k = (q.trailing_zeros() as usize)
                    .min(usize::BITS as usize - 1 - left.leading_zeros() as usize)
                    .min(super::buddy::MAX_ORDER as usize);
                z.buddy.free(q, k as u8);
                q += 1 << k;
                left -= 1 << k;
            }
            i += run;
        }
        z.scratch = small;
        self.note(&z);
    }

    fn free_pages(&self) -> usize {
        let in_lists: usize = self.pcp.iter().map(|l| l.lock().frames.len()).sum();
        in_lists + self.zone.lock().buddy.free_pages()
    }

    fn free_hint(&self) -> usize {
        self.zone_free.load(Ordering::Relaxed)
    }

    fn check(&self) {
        let guards: Vec<_> = self.pcp.iter().map(|l| l.lock()).collect();
        let z = self.zone.lock();
        z.buddy.check();
        let in_lists: usize = guards.iter().map(|g| g.frames.len()).sum();
        let outstanding: isize =
            z.outstanding + guards.iter().map(|g| g.outstanding).sum::<isize>();
        assert_eq!(
            z.buddy.free_pages() as isize + in_lists as isize + outstanding,
            self.pages as isize,
            "free + per-CPU + outstanding = pool pages"
        );
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn cfg(pcp: bool) -> AllocConfig {
        AllocConfig {
            pcp,
            batch: 8,
            high: 32,
            cpus: 2,
        }
    }

    #[test]
    fn pcp_refills_and_drains_in_batches() {
        let a = FrameAlloc::new(512, cfg(true));
        let f = a.alloc_on(0, 0).expect("frame");
        // One refill moved a batch to CPU 0's list.
        assert_eq!(a.pcp[0].lock().frames.len(), 7);
        assert_eq!(a.free_pages(), 511);
        a.free_on(1, f);
        a.check();
        let many: Vec<Frame> = (0..40).map(|_| a.alloc_on(0, 0).expect("frame")).collect();
        for f in many {
            a.free_on(1, f);
        }
        assert!(a.pcp[1].lock().frames.len() <= 32, "drained above high");
        a.check();
        assert_eq!(a.free_pages(), 512);
    }

    /// Sized for 64 CPUs (on any machine): the lists together never hold
    /// more than an eighth of the pool, and a bulk or 2 MiB allocation that
    /// the zone alone cannot serve gets the frames the lists hold.
    #[test]
    fn many_cpu_lists_keep_to_their_share_and_give_frames_back() {
        let pages = 8192;
        let a = FrameAlloc::new(
            pages,
            AllocConfig {
                pcp: true,
                batch: 128,
                high: 1024,
                cpus: 64,
            },
        );
        assert_eq!(a.config().high, pages / (8 * 64));
        assert!(a.config().batch <= a.config().high);
        let mut held: Vec<Frame> = Vec::new();
        for i in 0..pages {
            held.push(a.alloc_on(i % 64, 0).expect("a free frame"));
        }
        assert!(a.alloc_on(0, 0).is_none());
        for (i, f) in held.drain(..).enumerate() {
            a.free_on((i * 7) % 64, f);
        }
        let in_lists: usize = a.pcp.iter().map(|l| l.lock().frames.len()).sum();
        assert!(
            in_lists <= pages / 8,
            "{in_lists} of {pages} frames in the lists"
        );
        a.check();
        // Every free frame is reachable by a bulk request.
        let mut all = Vec::new();
        assert_eq!(a.alloc_bulk(0, pages, &mut all), pages);
        a.free_bulk(&mut all);
        for i in 0..pages {
            held.push(a.alloc_on(i % 64, 0).expect("a free frame"));
        }
        for (i, f) in held.drain(..).enumerate() {
            a.free_on(i % 64, f);
        }
        // And a 2 MiB run, whose pages may sit in the lists.
        let huge: Vec<Frame> = (0..pages / 512)
            .map(|_| a.alloc(9).expect("a 2 MiB run"))
            .collect();
        for f in huge {
            a.free(f);
        }
        a.check();
        assert_eq!(a.free_pages(), pages);
    }

    #[test]
    fn bulk_is_contiguous_and_orders_work() {
        let a = FrameAlloc::new(1024, cfg(true));
        let mut v = Vec::new();
        assert_eq!(a.alloc_bulk(0, 16, &mut v), 16);
        assert!(v.windows(2).all(|w| w[1].index() == w[0].index() + 1));
        let run = a.alloc(4).expect("order-4 run");
        assert_eq!(run.pages(), 16);
        let huge = a.alloc(9).expect("2 MiB");
        a.free(run);
        a.free(huge);
        a.free_bulk(&mut v);
        a.check();
        assert_eq!(a.free_pages(), 1024);
    }

    proptest! {
        /// Random alloc/free (single and bulk, any CPU, pcp on and off)
        /// against an oracle: no page handed out twice, none lost.
        #[test]
        fn no_loss_no_double(pcp: bool, ops in proptest::collection::vec((0u8..4, 0usize..2, any::<u16>()), 1..300)) {
            let pages = 2048;
            let a = FrameAlloc::new(pages, cfg(pcp));
            let mut held: Vec<Frame> = Vec::new();
            let mut used: HashSet<u32> = HashSet::new();
            for (op, cpu, pick) in ops {
                let mut got = Vec::new();
                match op {
                    0 => got.extend(a.alloc_on(cpu, 0)),
                    1 => got.extend(a.alloc_on(cpu, (pick % 10) as u8)),
                    2 => { a.alloc_bulk(0, (pick % 70) as usize, &mut got); }
                    _ => {
                        for _ in 0..(pick % 5) {
                            if held.is_empty() { break; }
                            let f = held.swap_remove(pick as usize % held.len());
                            for p in f.index()..f.index() + f.pages() as u32 { used.remove(&p); }
                            if pick % 2 == 0 { a.free_on(cpu, f) } else { a.free_bulk(&mut vec![f]) }
                        }
                    }
                }
                for f in got {
                    for p in f.index()..f.index() + f.pages() as u32 {
                        prop_assert!(used.insert(p), "page {} handed out twice", p);
                    }
                    held.push(f);
                }
                prop_assert_eq!(a.free_pages() + used.len(), pages);
            }
            a.check();
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Two CPUs allocate and free across each other's lists while refills and
    /// drains hand frames to and from the zone: no frame is lost or handed
    /// out twice, in every interleaving.
    #[test]
    fn loom_pcp_handoff() {
        loom::model(|| {
            let a = Arc::new(FrameAlloc::new(
                512,
                AllocConfig {
                    pcp: true,
                    batch: 2,
                    high: 2,
                    cpus: 2,
                },
            ));
            let handles: Vec<_> = (0..2)
                .map(|cpu| {
                    let a = Arc::clone(&a);
                    loom::thread::spawn(move || {
                        let f1 = a.alloc_on(cpu, 0).expect("frame");
                        let f2 = a.alloc_on(cpu, 0).expect("frame");
                        assert_ne!(f1.index(), f2.index());
                        // Free on the other CPU's list: crosses the handoff.
                        a.free_on(1 - cpu, f1);
                        a.free_on(cpu, f2);
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("model thread");
            }
            a.check();
            assert_eq!(a.free_pages(), 512);
        });
    }
}
