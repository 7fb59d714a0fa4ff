//! The buddy allocator: free lists of naturally aligned runs of `2^k` pages,
//! `k = 0 ..= 9` (4 KiB .. 2 MiB), split on demand and merged with their
//! buddy on free. Not thread-safe by itself: the frame allocator keeps it
//! behind the "zone lock" (see [`super::alloc`]).
//!
//! Representation: intrusive doubly linked lists threaded through per-page
//! arrays (`next`, `prev`), so a buddy can be unlinked in O(1) when it merges;
//! `head[p] = k + 1` marks page `p` as the first page of a free block of order
//! `k` (0 means "not a free block head").
//!
//! Invariants (checked by [`Buddy::check`]):
//! - every free block of order `k` starts at a multiple of `2^k` and lies in
//!   the pool; free blocks are pairwise disjoint;
//! - no free block has a free buddy of the same order (merging is eager),
//!   except order 9, which has no buddy;
//! - `free == sum over free blocks of 2^k`.

/// Largest order: one 2 MiB block.
pub const MAX_ORDER: u8 = 9;
const NIL: u32 = u32::MAX;

/// See the module docs.
#[derive(Debug)]
pub struct Buddy {
    pages: usize,
    first: [u32; MAX_ORDER as usize + 1],
    count: [usize; MAX_ORDER as usize + 1],
    next: Vec<u32>,
    prev: Vec<u32>,
    head: Vec<u8>,
    free: usize,
}

impl Buddy {
    /// A buddy allocator over `pages` pages (a multiple of 512), all free.
    pub fn new(pages: usize) -> Buddy {
        let mut b = Buddy::new_taken(pages);
        // Push in reverse so the lowest addresses come out first.
        for block in (0..pages >> MAX_ORDER).rev() {
            b.push((block << MAX_ORDER) as u32, MAX_ORDER);
        }
        b.free = pages;
        b
    }

    /// A buddy allocator over `pages` pages (a multiple of 512), none free
    /// (all handed out; they come in by `free`). Its per-page arrays stay
    /// untouched zero pages until frees reach them.
    pub fn new_taken(pages: usize) -> Buddy {
        debug_assert!(pages % (1 << MAX_ORDER) == 0);
        Buddy {
            pages,
            first: [NIL; MAX_ORDER as usize + 1],
            count: [0; MAX_ORDER as usize + 1],
            next: vec![0; pages],
            prev: vec![0; pages],
            head: vec![0; pages],
            free: 0,
        }
    }

    /// Pages managed.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Free pages.
    pub fn free_pages(&self) -> usize {
        self.free
    }

    /// Free blocks of `order`.
    #[cfg(test)]
    pub fn free_blocks(&self, order: u8) -> usize {
        self.count[order as usize]
    }

    fn push(&mut self, p: u32, k: u8) {
        let old = self.first[k as usize];
        self.next[p as usize] = old;
        self.prev[p as usize] = NIL;
        if old != NIL {
            self.prev[old as usize] = p;
        }
        self.first[k as usize] = p;
        self.head[p as usize] = k + 1;
        self.count[k as usize] += 1;
    }

    fn unlink(&mut self, p: u32, k: u8) {
        let (n, pr) = (self.next[p as usize], self.prev[p as usize]);
        if pr == NIL {
            self.first[k as usize] = n;
        } else {
            self.next[pr as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = pr;
        }
        self.head[p as usize] = 0;
        self.count[k as usize] -= 1;
    }

    /// One block of `order` (its first page), or `None`.
    pub fn alloc(&mut self, order: u8) -> Option<u32> {
        if order > MAX_ORDER {
            return None;
        }
        let k = (order..=MAX_ORDER).find(|&k| self.first[k as usize] != NIL)?;
        let p = self.first[k as usize];
        self.unlink(p, k);
        // Split down, keeping the lower half, freeing the upper halves.
        let mut k = k;
        while k > order {
            k -= 1;
            self.push(p + (1 << k), k);
        }
        self.free -= 1 << order;
        Some(p)
    }

    /// Returns the block of `order` starting at page `p`, merging it with its
    /// free buddies.
    pub fn free(&mut self, p: u32, order: u8) {
        debug_assert!(p as usize % (1 << order) == 0 && (p as usize) < self.pages);
        debug_assert!(self.head[p as usize] == 0, "double free of page {p}");
        self.free += 1 << order;
        let (mut p, mut k) = (p, order);
        while k < MAX_ORDER {
            let buddy = p ^ (1 << k);
            if self.head[buddy as usize] != k + 1 {
                break;
            }
            self.unlink(buddy, k);
            p = p.min(buddy);
            k += 1;
        }
        self.push(p, k);
    }

    /// Appends up to `n` blocks of `order` to `out`, preferring contiguous
    /// runs: it takes the largest blocks it can and splits them in address
    /// order. Returns how many were appended.
    pub fn alloc_bulk(&mut self, order: u8, n: usize, out: &mut Vec<u32>) -> usize {
        let mut left = n;
        while left > 0 {
            // The largest order whose block fits in what is left to allocate.
            let fit = (usize::BITS - 1 - left.leading_zeros()) as u8;
            let want = (order + fit).min(MAX_ORDER);
            // Prefer a free block of exactly `want`..MAX (split), else the
            // largest smaller one available.
            let k = if (want..=MAX_ORDER).any(|k| self.first[k as usize] != NIL) {
                want
            } else {
                match (order..want).rev().find(|&k| self.first[k as usize] != NIL) {
                    Some(k) => k,
                    None => break,
                }
            };
            let Some(p) = self.alloc(k) else { break };
            let pieces = 1usize << (k - order);
            for i in 0..pieces {
                out.push(p + ((i as u32) << order));
            }
            left -= pieces;
        }
        n - left
    }

    /// Checks the invariants of the module docs; panics naming the broken one.
    pub fn check(&self) {
        let mut seen = vec![false; self.pages];
        let mut total = 0;
        for k in 0..=MAX_ORDER {
            let mut p = self.first[k as usize];
            let mut prev = NIL;
            let mut n = 0;
            while p != NIL {
                assert_eq!(self.prev[p as usize], prev, "list {k} back link at {p}");
                assert_eq!(self.head[p as usize], k + 1, "head mark of {p}");
                assert_eq!(
                    p as usize % (1 << k),
                    0,
                    "block {p} misaligned for order {k}"
                );
                for (q, s) in seen.iter_mut().enumerate().skip(p as usize).take(1 << k) {
                    assert!(!*s, "page {q} in two free blocks");
                    *s = true;
                }
                if k < MAX_ORDER {
                    let buddy = p ^ (1 << k);
                    assert_ne!(
                        self.head[buddy as usize],
                        k + 1,
                        "unmerged buddies {p} and {buddy}"
                    );
                }
                total += 1 << k;
                n += 1;
                prev = p;
                p = self.next[p as usize];
            }
            assert_eq!(n, self.count[k as usize], "count of order {k}");
        }
        assert_eq!(total, self.free, "free page count");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn split_and_merge_restore_a_huge_block() {
        let mut b = Buddy::new(1024);
        let small: Vec<u32> = (0..512).map(|_| b.alloc(0).expect("4k")).collect();
        assert_eq!(
            small[..4],
            [0, 1, 2, 3],
            "lowest addresses first, contiguous"
        );
        assert_eq!(b.free_blocks(MAX_ORDER), 1);
        for p in small {
            b.free(p, 0);
        }
        b.check();
        assert_eq!(b.free_blocks(MAX_ORDER), 2);
    }

    #[test]
    fn bulk_prefers_contiguous_runs() {
        let mut b = Buddy::new(512);
        let _hole = b.alloc(0);
        let mut out = Vec::new();
        assert_eq!(b.alloc_bulk(0, 64, &mut out), 64);
        // 64 pages from one aligned order-6 block: consecutive.
        assert!(out.windows(2).all(|w| w[1] == w[0] + 1), "{out:?}");
        assert_eq!(out[0] % 64, 0);
        b.check();
    }

    proptest! {
        /// Random alloc/free of random orders against an oracle of handed-out
        /// blocks: nothing handed out twice, nothing lost, invariants hold.
        #[test]
        fn oracle(ops in proptest::collection::vec((any::<bool>(), 0u8..=MAX_ORDER, any::<u16>()), 1..300)) {
            let pages = 2048;
            let mut b = Buddy::new(pages);
            let mut held: BTreeMap<u32, u8> = BTreeMap::new();
            for (alloc, order, pick) in ops {
                if alloc || held.is_empty() {
                    if let Some(p) = b.alloc(order) {
                        prop_assert_eq!(p as usize % (1 << order), 0);
                        // Disjoint from every held block.
                        if let Some((&q, &k)) = held.range(..=p).next_back() {
                            prop_assert!(q as usize + (1 << k) <= p as usize, "overlap {} {}", q, p);
                        }
                        if let Some((&q, _)) = held.range(p..).next() {
                            prop_assert!(p as usize + (1 << order) <= q as usize, "overlap {} {}", p, q);
                        }
                        held.insert(p, order);
                    }
                } else {
                    let key = *held.keys().nth(pick as usize % held.len()).expect("non-empty");
                    let k = held.remove(&key).expect("held");
                    b.free(key, k);
                }
                let out: usize = held.values().map(|&k| 1usize << k).sum();
                prop_assert_eq!(b.free_pages() + out, pages);
            }
            b.check();
        }
    }
}
