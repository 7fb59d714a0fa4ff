//! Frame allocation: the [`FrameAllocator`] interface and a simple locked
//! allocator of 4 KiB and 2 MiB frames behind it.
//!
//! [`LockedAllocator`] keeps free 2 MiB blocks on a stack and splits one into
//! 512 4 KiB frames when no partly used block has a free 4 KiB frame; a block
//! whose 512 frames are all free again is merged back into a 2 MiB frame.
//! 4 KiB allocations prefer partly used blocks, so whole blocks stay whole
//! for 2 MiB regions.
//!
//! Invariants (checked by [`LockedAllocator::check`] in tests and debug builds):
//! - `free_pages == 512 * huge.len() + sum(split[b].len())`
//! - a block is in `partial` iff `0 < split[b].len() < 512`
//! - a block is either in `huge`, split, or wholly allocated; never two.
//!
//! Lock: one `parking_lot::Mutex` (the "zone lock") around all of it; every
//! operation, bulk or single, takes it once.

use super::pool::{Frame, HUGE_ORDER, PAGES_PER_HUGE};
use parking_lot::Mutex;

/// What the fault path needs from an allocator.
pub trait FrameAllocator: Send + Sync + std::fmt::Debug {
    /// One frame of `order`, or `None` when no free memory is left.
    fn alloc(&self, order: u8) -> Option<Frame>;
    /// Returns a frame.
    fn free(&self, frame: Frame);
    /// Up to `n` frames of `order` appended to `out`, under one lock
    /// acquisition; returns how many.
    fn alloc_bulk(&self, order: u8, n: usize, out: &mut Vec<Frame>) -> usize;
    /// Returns every frame in `frames` (which is left empty) under one lock
    /// acquisition.
    fn free_bulk(&self, frames: &mut Vec<Frame>);
    /// Free memory, in 4 KiB pages.
    fn free_pages(&self) -> usize;
}

const NOT_PARTIAL: u32 = u32::MAX;

#[derive(Debug)]
struct Inner {
    /// Free whole 2 MiB blocks.
    huge: Vec<u32>,
    /// Free 4 KiB offsets of each split block.
    split: Vec<Vec<u16>>,
    /// Blocks with some but not all 4 KiB frames free.
    partial: Vec<u32>,
    /// Position of each block in `partial`, or `NOT_PARTIAL`.
    partial_pos: Vec<u32>,
    free_pages: usize,
}

impl Inner {
    fn add_partial(&mut self, b: u32) {
        self.partial_pos[b as usize] = self.partial.len() as u32;
        self.partial.push(b);
    }

    fn remove_partial(&mut self, b: u32) {
        let pos = self.partial_pos[b as usize] as usize;
        self.partial.swap_remove(pos);
        if let Some(&moved) = self.partial.get(pos) {
            self.partial_pos[moved as usize] = pos as u32;
        }
        self.partial_pos[b as usize] = NOT_PARTIAL;
    }

    fn alloc(&mut self, order: u8) -> Option<Frame> {
        match order {
            HUGE_ORDER => {
                let b = self.huge.pop()?;
                self.free_pages -= PAGES_PER_HUGE;
                Some(Frame::from_parts(b * PAGES_PER_HUGE as u32, HUGE_ORDER))
            }
            0 => {
                let b = match self.partial.last() {
                    Some(&b) => b,
                    None => {
                        let b = self.huge.pop()?;
                        self.split[b as usize] = (0..PAGES_PER_HUGE as u16).rev().collect();
                        self.add_partial(b);
                        b
                    }
                };
                let list = &mut self.split[b as usize];
                let off = list.pop()?;
                if list.is_empty() {
                    self.remove_partial(b);
                }
                self.free_pages -= 1;
                Some(Frame::from_parts(
                    b * PAGES_PER_HUGE as u32 + u32::from(off),
                    0,
                ))
            }
            _ => None,
        }
    }

    fn free(&mut self, frame: Frame) {
        let b = frame.index() / PAGES_PER_HUGE as u32;
        match frame.order() {
            HUGE_ORDER => {
                self.huge.push(b);
                self.free_pages += PAGES_PER_HUGE;
            }
            _ => {
                debug_assert_eq!(frame.order(), 0, "only orders 0 and 9 exist here");
                let off = (frame.index() % PAGES_PER_HUGE as u32) as u16;
                let list = &mut self.split[b as usize];
                debug_assert!(
                    !list.contains(&off),
                    "double free of frame {}",
                    frame.index()
                );
                list.push(off);
                let len = list.len();
                if len == PAGES_PER_HUGE {
                    self.remove_partial(b);
                    self.split[b as usize] = Vec::new();
                    self.huge.push(b);
                } else if len == 1 {
                    self.add_partial(b);
                }
                self.free_pages += 1;
            }
        }
    }
}

/// One lock, two orders. See the module docs.
#[derive(Debug)]
pub struct LockedAllocator {
    inner: Mutex<Inner>,
}

impl LockedAllocator {
    /// An allocator over a pool of `pages` 4 KiB pages (a multiple of 512),
    /// all free.
    pub fn new(pages: usize) -> LockedAllocator {
        let blocks = pages / PAGES_PER_HUGE;
        LockedAllocator {
            inner: Mutex::new(Inner {
                huge: (0..blocks as u32).rev().collect(),
                split: (0..blocks).map(|_| Vec::new()).collect(),
                partial: Vec::new(),
                partial_pos: vec![NOT_PARTIAL; blocks],
                free_pages: blocks * PAGES_PER_HUGE,
            }),
        }
    }

    /// Checks the invariants of the module docs; panics naming the broken one.
    pub fn check(&self) {
        let g = self.inner.lock();
        let split: usize = g.split.iter().map(Vec::len).sum();
        assert_eq!(
            g.free_pages,
            PAGES_PER_HUGE * g.huge.len() + split,
            "free page count"
        );
        for (b, list) in g.split.iter().enumerate() {
            let partial = g.partial_pos[b] != NOT_PARTIAL;
            assert_eq!(
                partial,
                !list.is_empty() && list.len() < PAGES_PER_HUGE,
                "block {b} partial"
            );
            assert!(
                !g.huge.contains(&(b as u32)) || list.is_empty(),
                "block {b} both huge and split"
            );
        }
    }
}

impl FrameAllocator for LockedAllocator {
    fn alloc(&self, order: u8) -> Option<Frame> {
        self.inner.lock().alloc(order)
    }

    fn free(&self, frame: Frame) {
        self.inner.lock().free(frame);
    }

    fn alloc_bulk(&self, order: u8, n: usize, out: &mut Vec<Frame>) -> usize {
        let mut g = self.inner.lock();
        let start = out.len();
        while out.len() - start < n {
            match g.alloc(order) {
                Some(f) => out.push(f),
                None => break,
            }
        }
        out.len() - start
    }

    fn free_bulk(&self, frames: &mut Vec<Frame>) {
        let mut g = self.inner.lock();
        for f in frames.drain(..) {
            g.free(f);
        }
    }

    fn free_pages(&self) -> usize {
        self.inner.lock().free_pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn split_and_merge() {
        let a = LockedAllocator::new(2 * PAGES_PER_HUGE);
        let h = a.alloc(HUGE_ORDER).expect("huge");
        let small: Vec<Frame> = (0..PAGES_PER_HUGE)
            .map(|_| a.alloc(0).expect("4k"))
            .collect();
        assert!(a.alloc(0).is_none());
        assert!(a.alloc(HUGE_ORDER).is_none());
        assert_eq!(a.free_pages(), 0);
        a.check();
        for f in small {
            a.free(f);
        }
        a.check();
        // The split block merged back: a 2 MiB frame is available again.
        let h2 = a.alloc(HUGE_ORDER).expect("merged");
        a.free(h);
        a.free(h2);
        assert_eq!(a.free_pages(), 2 * PAGES_PER_HUGE);
        a.check();
    }

    #[test]
    fn bulk() {
        let a = LockedAllocator::new(PAGES_PER_HUGE);
        let mut v = Vec::new();
        assert_eq!(a.alloc_bulk(0, 600, &mut v), PAGES_PER_HUGE);
        a.free_bulk(&mut v);
        assert!(v.is_empty());
        assert_eq!(a.free_pages(), PAGES_PER_HUGE);
        a.check();
    }

    proptest! {
        /// Random alloc/free sequences against an oracle set of handed-out
        /// pages: no page is handed out twice, none is lost.
        #[test]
        fn no_loss_no_double(ops in proptest::collection::vec((any::<bool>(), any::<bool>(), any::<u16>()), 1..400)) {
            let blocks = 4;
            let a = LockedAllocator::new(blocks * PAGES_PER_HUGE);
            let mut held: Vec<Frame> = Vec::new();
            let mut pages: HashSet<u32> = HashSet::new();
            for (is_alloc, huge, pick) in ops {
                if is_alloc || held.is_empty() {
                    let order = if huge { HUGE_ORDER } else { 0 };
                    if let Some(f) = a.alloc(order) {
                        for p in f.index()..f.index() + f.pages() as u32 {
                            prop_assert!(pages.insert(p), "page {} handed out twice", p);
                        }
                        held.push(f);
                    } else if !huge {
                        prop_assert_eq!(a.free_pages(), 0);
                    }
                } else {
                    let f = held.swap_remove(pick as usize % held.len());
                    for p in f.index()..f.index() + f.pages() as u32 {
                        pages.remove(&p);
                    }
                    a.free(f);
                }
                prop_assert_eq!(a.free_pages() + pages.len(), blocks * PAGES_PER_HUGE);
            }
            a.check();
        }
    }
}
