//! Several frame pools over one pool mapping: one per NUMA node, or memory
//! tiers on a one-node machine (issue 8, seed 001).
//!
//! The pool mapping ([`super::Pool`]) is cut into consecutive *pools*, each a
//! multiple of 2 MiB and, where it names a node, bound to that node with
//! `mbind` before it is populated. Pool `p` owns the frame indices
//! `[base(p), base(p) + pages(p))` and has its own [`FrameAlloc`] (buddy and
//! per-CPU lists) over them, working in pool-local indices:
//! `global index = base(p) + local index`. Since every base is a multiple of
//! 512, a frame's natural alignment is the same in both.
//!
//! Pool 0 is the budget: faults, fault-around, read-ahead and the pre-zeroed
//! reserve take frames from it ([`FrameAllocator::alloc`] means pool 0), and
//! reclaim's watermarks are about it. Pages reach another pool only by
//! migration (`Region::migrate`). Every free goes to the pool that owns the
//! frame, found from its index; pool 0 has base 0, so the fault path's
//! alloc and free pay one comparison for this.
//!
//! A pool may have two *zones* (parts with the same pool id): THP-backed
//! blocks, and a small-page zone mapped `MADV_NOHUGEPAGE`
//! (`Config::small_zone_pct`). Order-9 frames come from the THP zone first
//! (they move as one PMD), smaller ones from the small-page zone first: a
//! 4 KiB move out of a THP splits its folio (~1 ms) and leaves the block's
//! other pages write-protected, so each one's first write takes a
//! copy-on-write fault with a TLB flush (docs/measurements.md, "The first write after a THP split, and the small-page zone"); a small-page zone
//! has neither.
//!
//! Invariant, for each pool: `free(p) + outstanding(p) = pages(p)` (each
//! allocator checks its own), and so `sum free + outstanding = pool pages`.
//!
//! Locks: only those of the per-pool allocators, never two pools' at once.

use super::alloc::{AllocConfig, FrameAlloc, FrameAllocator};
use super::pool::{Frame, PartSpec, PoolId};

#[derive(Debug)]
struct Part {
    base: u32,
    pages: usize,
    pool: PoolId,
    huge: bool,
    populate: bool,
    alloc: FrameAlloc,
}

/// The allocators of every pool. See the module docs.
#[derive(Debug)]
pub struct FramePools {
    parts: Vec<Part>,
    pools: usize,
}

impl FramePools {
    /// Parts laid out in order from index 0 (sizes multiples of 2 MiB), all
    /// free. Pool ids must start at 0 and be contiguous.
    pub fn new(specs: &[PartSpec], config: AllocConfig) -> FramePools {
        let mut base = 0usize;
        let parts = specs
            .iter()
            .map(|s| {
                let n = s.bytes / faultline_sys::PAGE_SIZE;
                debug_assert!(n % super::PAGES_PER_HUGE == 0 && n > 0);
                let p = Part {
                    base: base as u32,
                    pages: n,
                    pool: s.pool,
                    huge: s.huge,
                    populate: s.populate,
                    // A part not populated starts out all taken: the
                    // balloon holds its frames (`take_unpopulated`).
                    alloc: if s.populate {
                        FrameAlloc::new(n, config)
                    } else {
                        FrameAlloc::new_taken(n, config)
                    },
                };
                base += n;
                p
            })
            .collect();
        FramePools {
            parts,
            pools: specs.iter().map(|s| s.pool + 1).max().unwrap_or(1),
        }
    }

    /// The parts of `pool`, in the order an allocation of `order` tries them.
    fn zones(&self, pool: PoolId, order: u8) -> impl Iterator<Item = &Part> {
        let want_huge = order >= super::HUGE_ORDER;
        let preferred = self
            .parts
            .iter()
            .filter(move |p| p.pool == pool && p.huge == want_huge);
        let other = self
            .parts
            .iter()
            .filter(move |p| p.pool == pool && p.huge != want_huge);
        preferred.chain(other)
    }

    /// The position of the part that owns frame index `index` (parts are
    /// few: a scan from the top; the first part has base 0).
    fn part_index(&self, index: u32) -> usize {
        self.parts
            .iter()
            .rposition(|p| p.base <= index)
            .unwrap_or(0)
    }

    fn part_of(&self, index: u32) -> &Part {
        &self.parts[self.part_index(index)]
    }

    /// Whether frames `a` and `b` lie in one part. Parts differ in THP
    /// advice or NUMA policy, so a part boundary may be a boundary between
    /// two VMAs of the pool mapping, which one `UFFDIO_MOVE` cannot span
    /// (`EINVAL`): consecutive frames make one run for a move only within a
    /// part.
    pub fn same_part(&self, a: u32, b: u32) -> bool {
        self.part_index(a) == self.part_index(b)
    }

    /// Number of pools.
    pub fn count(&self) -> usize {
        self.pools
    }

    /// The pool that owns frame index `index`.
    pub fn pool_of(&self, index: u32) -> PoolId {
        self.part_of(index).pool
    }

    /// Pages of pool `pool`.
    pub fn pages_in(&self, pool: PoolId) -> usize {
        self.parts
            .iter()
            .filter(|p| p.pool == pool)
            .map(|p| p.pages)
            .sum()
    }

    /// Free pages of pool `pool`.
    pub fn free_pages_in(&self, pool: PoolId) -> usize {
        self.parts
            .iter()
            .filter(|p| p.pool == pool)
            .map(|p| p.alloc.free_pages())
            .sum()
    }

    /// The frames of the parts not populated at build (their allocators
    /// start out with all of them taken), as 2 MiB frames, for the balloon
    /// to hold. Call once.
    pub fn take_unpopulated(&self) -> Vec<Frame> {
        let per = super::PAGES_PER_HUGE as u32;
        self.parts
            .iter()
            .filter(|p| !p.populate)
            .flat_map(|p| {
                let blocks = (p.pages / super::PAGES_PER_HUGE) as u32;
                (0..blocks).map(move |b| Frame::from_parts(p.base + b * per, super::HUGE_ORDER))
            })
            .collect()
    }

    /// A frame of `order` from pool `pool`, or `None` if it has no free run
    /// that large (or there is no such pool).
    pub fn alloc_in(&self, pool: PoolId, order: u8) -> Option<Frame> {
        self.zones(pool, order)
            .find_map(|p| p.alloc.alloc(order).map(|f| globalize(p.base, f)))
    }

    /// Up to `n` frames of `order` from pool `pool`, appended to `out`
    /// (contiguous runs preferred); returns how many.
    pub fn alloc_bulk_in(&self, pool: PoolId, order: u8, n: usize, out: &mut Vec<Frame>) -> usize {
        let mut got = 0;
        for p in self.zones(pool, order) {
            if got == n {
                break;
            }
            let start = out.len();
            got += p.alloc.alloc_bulk(order, n - got, out);
            if p.base != 0 {
                for f in &mut out[start..] {
                    let g = Frame::from_parts(f.index() + p.base, f.order());
                    *f = g;
                }
            }
        }
        got
    }
}

fn globalize(base: u32, f: Frame) -> Frame {
    if base == 0 {
        f
    } else {
        Frame::from_parts(f.index() + base, f.order())
    }
}

impl FrameAllocator for FramePools {
    #[inline]
    fn alloc(&self, order: u8) -> Option<Frame> {
        self.alloc_in(0, order)
    }

    #[inline]
    fn free(&self, frame: Frame) {
        let p = self.part_of(frame.index());
        if p.base == 0 {
            return p.alloc.free(frame);
        }
        p.alloc
            .free(Frame::from_parts(frame.index() - p.base, frame.order()));
    }

    fn alloc_bulk(&self, order: u8, n: usize, out: &mut Vec<Frame>) -> usize {
        self.alloc_bulk_in(0, order, n, out)
    }

    fn free_bulk(&self, frames: &mut Vec<Frame>) {
        if self.parts.len() == 1 {
            return self.parts[0].alloc.free_bulk(frames);
        }
        let mut by_part: Vec<Vec<Frame>> = (0..self.parts.len()).map(|_| Vec::new()).collect();
        for f in frames.drain(..) {
            let i = self.part_index(f.index());
            let base = self.parts[i].base;
            by_part[i].push(Frame::from_parts(f.index() - base, f.order()));
        }
        for (p, mut v) in self.parts.iter().zip(by_part) {
            if !v.is_empty() {
                p.alloc.free_bulk(&mut v);
            }
        }
    }

    fn free_pages(&self) -> usize {
        self.parts.iter().map(|p| p.alloc.free_pages()).sum()
    }

    fn free_hint(&self) -> usize {
        self.parts
            .iter()
            .filter(|p| p.pool == 0)
            .map(|p| p.alloc.free_hint())
            .sum()
    }

    fn check(&self) {
        for p in &self.parts {
            p.alloc.check();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pools(sizes: &[usize]) -> FramePools {
        let specs: Vec<PartSpec> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| PartSpec {
                bytes: n * faultline_sys::PAGE_SIZE,
                node: None,
                pool: i,
                huge: true,
                populate: true,
            })
            .collect();
        FramePools::new(
            &specs,
            AllocConfig {
                pcp: true,
                batch: 8,
                high: 32,
                cpus: 2,
            },
        )
    }

    /// Two zones of one pool are two parts (two VMAs of the pool mapping
    /// when their THP advice differs), and so are two pools: frames on
    /// either side of a boundary are never one run for a move.
    #[test]
    fn a_part_boundary_ends_a_run_of_frames() {
        let zone = |pages: usize, huge: bool| PartSpec {
            bytes: pages * faultline_sys::PAGE_SIZE,
            node: None,
            pool: 0,
            huge,
            populate: true,
        };
        let specs = [zone(512, false), zone(1024, true)];
        let cfg = AllocConfig {
            pcp: false,
            batch: 8,
            high: 32,
            cpus: 2,
        };
        let p = FramePools::new(&specs, cfg);
        assert!(p.same_part(0, 511) && p.same_part(512, 1535));
        assert!(!p.same_part(511, 512) && !p.same_part(0, 1535));
        assert_eq!(p.pool_of(511), p.pool_of(512), "one pool, two zones");
        let two = pools(&[512, 512]);
        assert!(!two.same_part(511, 512) && two.same_part(512, 1023));
    }

    #[test]
    fn frames_come_from_and_return_to_their_pool() {
        let p = pools(&[512, 1024]);
        let a = p.alloc(0).expect("pool 0 frame");
        assert_eq!(p.pool_of(a.index()), 0);
        let b = p.alloc_in(1, 9).expect("pool 1 huge frame");
        assert!(b.index() >= 512 && b.index() % 512 == 0);
        assert_eq!(p.pool_of(b.index()), 1);
        assert_eq!(p.free_pages_in(1), 512);
        p.free(b);
        p.free(a);
        assert_eq!(p.free_pages_in(1), 1024);
        assert_eq!(p.free_pages(), 1536);
        assert!(p.alloc_in(2, 0).is_none(), "no pool 2");
        p.check();
    }

    #[test]
    fn zones_serve_their_orders_first() {
        let z = |huge| PartSpec {
            bytes: 2 << 20,
            node: None,
            pool: 0,
            huge,
            populate: true,
        };
        let p = FramePools::new(
            &[z(true), z(false)],
            AllocConfig {
                pcp: false,
                batch: 8,
                high: 32,
                cpus: 2,
            },
        );
        assert_eq!(p.count(), 1);
        assert_eq!(p.pages_in(0), 1024);
        let small = p.alloc(0).expect("4 KiB frame");
        assert!(
            small.index() >= 512,
            "4 KiB frames come from the small zone"
        );
        let huge = p.alloc(9).expect("2 MiB frame");
        assert_eq!(huge.index(), 0, "2 MiB frames from the THP zone");
        // The THP zone is used up: a 4 KiB frame still comes (small zone),
        // and when that is full too, from wherever is left.
        let mut rest = Vec::new();
        assert_eq!(p.alloc_bulk(0, 1000, &mut rest), 511);
        assert!(p.alloc(0).is_none());
        p.free(huge);
        assert!(p.alloc(0).is_some_and(|f| {
            let lo = f.index() < 512;
            p.free(f);
            lo
        }));
        p.free(small);
        p.free_bulk(&mut rest);
        assert_eq!(p.free_pages(), 1024);
        p.check();
    }

    #[test]
    fn a_full_pool_does_not_borrow_from_another() {
        let p = pools(&[512, 512]);
        let mut got = Vec::new();
        assert_eq!(p.alloc_bulk_in(1, 0, 600, &mut got), 512);
        assert!(p.alloc_in(1, 0).is_none());
        assert!(got.iter().all(|f| p.pool_of(f.index()) == 1));
        assert!(p.alloc(0).is_some_and(|f| {
            p.free(f);
            true
        }));
        p.free_bulk(&mut got);
        assert_eq!(p.free_pages(), 1024);
        p.check();
    }

    proptest! {
        /// Against an oracle (a set of held global indices per pool): frames
        /// never overlap, always lie in the pool asked for, and every page
        /// comes back.
        #[test]
        fn pools_oracle(ops in proptest::collection::vec((0usize..3, 0u8..4, any::<bool>()), 1..200)) {
            let sizes = [512usize, 1024, 512];
            let p = pools(&sizes);
            let bases = [0u32, 512, 1536];
            let mut held: Vec<Frame> = Vec::new();
            let mut owned = std::collections::HashSet::new();
            for (pool, order, free) in ops {
                if free && !held.is_empty() {
                    let f = held.swap_remove(pool % held.len());
                    for i in 0..f.pages() as u32 {
                        prop_assert!(owned.remove(&(f.index() + i)));
                    }
                    p.free(f);
                } else if let Some(f) = p.alloc_in(pool, order) {
                    prop_assert_eq!(p.pool_of(f.index()), pool);
                    prop_assert!(f.index() >= bases[pool]);
                    prop_assert!((f.index() as usize + f.pages()) <= bases[pool] as usize + sizes[pool]);
                    for i in 0..f.pages() as u32 {
                        prop_assert!(owned.insert(f.index() + i), "frame handed out twice");
                    }
                    held.push(f);
                }
            }
            let out: usize = held.iter().map(|f| f.pages()).sum();
            prop_assert_eq!(p.free_pages() + out, 2048);
            p.free_bulk(&mut held);
            prop_assert_eq!(p.free_pages(), 2048);
            p.check();
        }
    }
}
