//! One leaf of a region's page-state table ([`super::states`]): the words
//! of the pages in use within one span of [`LEAF_PAGES`] pages, as an
//! open-addressing hash table sized to those pages, so a page in use costs
//! 8 bytes of entry at 25–75% occupancy (at most 32 bytes), whatever the
//! density of its span.
//!
//! A leaf is one allocation of `cap + 1` `AtomicU64`s: a header (`cap`,
//! and the counts of entries holding a page in use, `live`, and of entries
//! ever claimed, `used`), then `cap` entries (`cap` a power of two, at most
//! `LEAF_PAGES`). An entry is `0` (empty) or `word << 32 | key + 1`, `key`
//! the page's index in its span; an entry whose word is 0 is a tombstone,
//! kept so that probe chains stay whole, and reused for the next key whose
//! chain reaches it. A key's chain starts at `key & (cap - 1)` (linear
//! probing); a full-size leaf (`cap = LEAF_PAGES`) is a plain array.
//!
//! Invariants: `cap` never changes; entries change one atomic store at a
//! time, so a reader sees an entry either before or after a change, never
//! a mix, and a tombstone taken over by another key reads as absent for
//! the old key (its chain continues) — which it is. Only the holder of the
//! leaf's span lock writes (`states` holds it); readers take no lock.
//! Locks: none of its own.

use crate::sync::atomic::{AtomicU64, Ordering};

/// Pages per leaf span.
#[cfg(not(loom))]
pub(crate) const LEAF_PAGES: usize = 512;
/// Pages per leaf span (small, so a loom model stays small, but above
/// [`MIN_CAP`], so its leaves hash, grow and shrink).
#[cfg(loom)]
pub(crate) const LEAF_PAGES: usize = 8;

/// The smallest leaf's entries (two pages in use; one lives in the slot).
pub(super) const MIN_CAP: usize = 4;

/// Bytes a leaf of `cap` entries allocates.
pub(super) fn bytes(cap: usize) -> usize {
    (cap + 1) * std::mem::size_of::<AtomicU64>()
}

/// Entries a leaf of `cap` may claim before it is rebuilt larger: 3/4
/// (chains stay short), all of a full-size leaf (no two keys collide).
fn max_used(cap: usize) -> usize {
    if cap >= LEAF_PAGES {
        cap
    } else {
        cap - cap / 4
    }
}

/// The size of leaf that holds `n` pages in use at 37.5–75% occupancy.
pub(super) fn cap_for(n: usize) -> usize {
    let mut cap = MIN_CAP;
    while max_used(cap) < n {
        cap *= 2;
    }
    cap
}

fn entry(key: usize, word: u32) -> u64 {
    (u64::from(word) << 32) | (key as u64 + 1)
}

fn key_of(e: u64) -> usize {
    (e as u32 as usize).wrapping_sub(1)
}

fn word_of(e: u64) -> u32 {
    (e >> 32) as u32
}

fn header(cap: usize, live: usize, used: usize) -> u64 {
    cap as u64 | (live as u64) << 16 | (used as u64) << 32
}

/// Where `key` is, or may go, in a leaf.
pub(super) struct Probe {
    /// The entry holding `key`, and its word (0: a tombstone).
    pub(super) hit: Option<(usize, u32)>,
    /// The first entry on `key`'s chain that it may take: a tombstone, or
    /// the empty entry that ends the chain.
    pub(super) vacant: Option<usize>,
}

/// A leaf, borrowed from its slot (see [`Leaf::at`]).
#[derive(Clone, Copy)]
pub(super) struct Leaf<'a> {
    all: &'a [AtomicU64],
}

impl<'a> Leaf<'a> {
    /// Allocates a leaf of `cap` entries holding `pages` (keys distinct,
    /// words non-zero, at most `max_used(cap)` of them) and returns its
    /// address, owned by the caller until [`Leaf::free`].
    pub(super) fn build(cap: usize, pages: &[(usize, u32)]) -> usize {
        debug_assert!(cap.is_power_of_two() && pages.len() <= max_used(cap));
        let all: Box<[AtomicU64]> = (0..=cap).map(|_| AtomicU64::new(0)).collect();
        let leaf = Leaf { all: &all };
        for &(key, word) in pages {
            // Fewer pages than entries: every chain ends in an empty one.
            let vacant = leaf.probe(key).vacant;
            debug_assert!(vacant.is_some(), "a leaf of {cap} for {}", pages.len());
            if let Some(at) = vacant {
                leaf.all[1 + at].store(entry(key, word), Ordering::Relaxed);
            }
        }
        leaf.all[0].store(header(cap, pages.len(), pages.len()), Ordering::Relaxed);
        Box::into_raw(all) as *mut AtomicU64 as usize
    }

    /// The leaf at `addr`.
    ///
    /// # Safety
    /// `addr` came from [`Leaf::build`] and is not freed for `'a` (its slot
    /// holds it, or an epoch pin taken before it was unlinked lasts).
    pub(super) unsafe fn at(addr: usize) -> Leaf<'a> {
        let head = addr as *const AtomicU64;
        // SAFETY: `addr` points at a live header (caller); `cap` never
        // changes after `build`.
        let cap = unsafe { (*head).load(Ordering::Relaxed) } as u16 as usize;
        // SAFETY: `build` allocated `cap + 1` entries at `addr`.
        let all = unsafe { std::slice::from_raw_parts(head, cap + 1) };
        Leaf { all }
    }

    /// Frees the leaf at `addr`.
    ///
    /// # Safety
    /// `addr` came from [`Leaf::build`], is no longer reachable from any
    /// slot, and no reader can still hold it (`&mut` to the table, or the
    /// epoch collector's deferral).
    pub(super) unsafe fn free(addr: usize) {
        // SAFETY: live until now (caller).
        let cap = unsafe { Leaf::at(addr) }.cap();
        let raw = std::ptr::slice_from_raw_parts_mut(addr as *mut AtomicU64, cap + 1);
        // SAFETY: `raw` is the `Box<[AtomicU64]>` that `build` leaked.
        drop(unsafe { Box::from_raw(raw) });
    }

    pub(super) fn cap(self) -> usize {
        self.all.len() - 1
    }

    /// Entries holding a page in use.
    pub(super) fn live(self) -> usize {
        (self.all[0].load(Ordering::Relaxed) >> 16) as u16 as usize
    }

    fn used(self) -> usize {
        (self.all[0].load(Ordering::Relaxed) >> 32) as u16 as usize
    }

    /// The word of `key` (Acquire), 0 if it has no entry.
    pub(super) fn get(self, key: usize) -> u32 {
        self.probe_with(key, Ordering::Acquire)
            .hit
            .map_or(0, |(_, w)| w)
    }

    /// Where `key` is and where it could go (writer side: Relaxed, under
    /// the span lock).
    pub(super) fn probe(self, key: usize) -> Probe {
        self.probe_with(key, Ordering::Relaxed)
    }

    fn probe_with(self, key: usize, order: Ordering) -> Probe {
        let cap = self.cap();
        let mut vacant = None;
        for i in 0..cap {
            let at = (key + i) & (cap - 1);
            let e = self.all[1 + at].load(order);
            if e == 0 {
                return Probe {
                    hit: None,
                    vacant: vacant.or(Some(at)),
                };
            }
            if key_of(e) == key {
                return Probe {
                    hit: Some((at, word_of(e))),
                    vacant,
                };
            }
            if word_of(e) == 0 && vacant.is_none() {
                vacant = Some(at);
            }
        }
        Probe { hit: None, vacant }
    }

    /// Stores `word` for `key` at entry `at` (from [`Leaf::probe`]) and
    /// keeps the counts; `false` if the leaf is too full to take a new
    /// entry there (rebuild it). Release pairs with readers' Acquire.
    pub(super) fn put(self, at: usize, key: usize, word: u32) -> bool {
        let old = self.all[1 + at].load(Ordering::Relaxed);
        let claims = old == 0;
        let (mut live, mut used) = (self.live(), self.used());
        if claims && used >= max_used(self.cap()) {
            return false;
        }
        let was_live = old != 0 && key_of(old) == key && word_of(old) != 0;
        used += usize::from(claims);
        live = live + usize::from(word != 0) - usize::from(was_live);
        self.all[1 + at].store(entry(key, word), Ordering::Release);
        self.all[0].store(header(self.cap(), live, used), Ordering::Relaxed);
        true
    }

    /// The pages in use, as `(key, word)`.
    pub(super) fn pages(self) -> impl Iterator<Item = (usize, u32)> + 'a {
        self.all[1..].iter().filter_map(|e| {
            let e = e.load(Ordering::Acquire);
            (e != 0 && word_of(e) != 0).then(|| (key_of(e), word_of(e)))
        })
    }

    /// The keys at or after `first` of the pages in use, appended to `out`
    /// in order: one pass over the entries.
    pub(super) fn keys_from(self, first: usize, out: &mut Vec<usize>) {
        let start = out.len();
        out.extend(self.pages().map(|(k, _)| k).filter(|&k| k >= first));
        out[start..].sort_unstable();
    }

    /// The least key at or after `first` of a page in use: in key order
    /// for a full-size leaf (entry `i` holds key `i`), so a walk of its
    /// span costs its entries once; a min over the entries otherwise.
    pub(super) fn next_from(self, first: usize) -> Option<usize> {
        if self.cap() < LEAF_PAGES {
            return self.pages().map(|(k, _)| k).filter(|&k| k >= first).min();
        }
        (first..LEAF_PAGES).find(|&k| {
            let e = self.all[1 + k].load(Ordering::Acquire);
            debug_assert!(
                e == 0 || key_of(e) == k,
                "entry {k} holds key {}",
                key_of(e)
            );
            e != 0 && word_of(e) != 0
        })
    }

    /// Whether the leaf is at most a quarter full and could be smaller.
    pub(super) fn sparse(self) -> bool {
        self.cap() > MIN_CAP && self.live() * 4 <= self.cap()
    }
}
