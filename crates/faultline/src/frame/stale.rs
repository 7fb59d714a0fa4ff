//! Stale slots: pool slots that still hold a copy of a page the copy fill
//! model ([`crate::FillModel::Copy`]) put into a region with `UFFDIO_COPY`.
//!
//! Under the move model a resident page's frame leaves a hole in its slot
//! (the page itself went into the region). A copied page leaves its bytes
//! in the slot too; that copy is dead (the region's page is the live one),
//! and it must go before anything moves into the slot (a move needs a hole)
//! and to keep what faultline holds within its budget. Dropping it at once
//! would cost the TLB flush the copy avoided, so stale slots are queued and
//! dropped many at a time with one `process_madvise(MADV_DONTNEED)` (one
//! flush for the batch): [`BATCH`] pending, a move into a stale slot, or a
//! reclaim pass, whichever comes first.
//!
//! Each 4 KiB slot has a state: `OWNED` (the move model's rules: a hole
//! while its page is in a region, populated otherwise), `STALE` (a dead
//! copy, queued), `DROPPING` (a drainer won it and is dropping it).
//! - only the frame's owner (in flight, or its page's lock) marks a slot
//!   `STALE` ([`StaleSlots::mark`]), right after the copy;
//! - a drainer takes `STALE` → `DROPPING` by compare-and-swap, drops, and
//!   stores `OWNED` (the slot is a hole);
//! - before a move into a slot its owner [`StaleSlots::clear`]s it (drains,
//!   or drops it alone, or waits for a drainer to finish): a hole;
//! - before freeing a frame or filling its holes its owner
//!   [`StaleSlots::keep`]s it: `STALE` → `OWNED` by compare-and-swap
//!   leaves the copy in place (a populated free frame), or it waits for a
//!   drainer and gets the hole, which `fill_holes` then fills.
//!
//! So a slot is dropped only by whoever won it from `STALE`, and after
//! `clear`/`keep` returns nobody else will touch it until its owner marks
//! it again. A queue entry may outlive its mark (kept, then marked again
//! after the frame was reused): the compare-and-swap skips entries that
//! are not `STALE`, and a duplicate entry finds `OWNED`.
//!
//! Locks: `pending` (a leaf, held only to push or to take the queue; the
//! drop runs outside it). The states are atomics: `mark`'s Release store
//! pairs with the Acquire of the compare-and-swaps and loads below; a
//! drainer's Release store of `OWNED` after the drop pairs with the
//! Acquire loads in `clear`/`keep`, so whoever sees `OWNED` sees the hole.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// Stale slots dropped together (one flush each batch).
pub const BATCH: usize = 64;

const OWNED: u8 = 0;
const STALE: u8 = 1;
const DROPPING: u8 = 2;

/// See the module docs.
#[derive(Debug)]
pub struct StaleSlots {
    state: Box<[AtomicU8]>,
    pending: Mutex<Vec<u32>>,
}

impl StaleSlots {
    /// States for `pages` slots, all `OWNED`.
    pub fn new(pages: usize) -> StaleSlots {
        StaleSlots {
            state: (0..pages).map(|_| AtomicU8::new(OWNED)).collect(),
            pending: Mutex::new(Vec::with_capacity(BATCH)),
        }
    }

    /// Slots `first..first + n` hold dead copies now. Returns whether the
    /// queue is a batch long (the caller drains it). The caller owns the
    /// frame.
    pub fn mark(&self, first: u32, n: usize) -> bool {
        let mut q = self.pending.lock();
        for i in first..first + n as u32 {
            // Release: pairs with the drainer's Acquire compare-and-swap.
            self.state[i as usize].store(STALE, Ordering::Release);
            q.push(i);
        }
        q.len() >= BATCH
    }

    /// Drops every queued slot still `STALE` with one call to `drop_slots`
    /// (given the won slots, sorted; it makes each a hole, or returns
    /// false: they stay `STALE` and queued, for the next drain or a
    /// `clear` to drop, or a `keep` to keep).
    /// Returns the slots dropped.
    pub fn drain(&self, drop_slots: impl FnOnce(&[u32]) -> bool) -> usize {
        let taken = std::mem::take(&mut *self.pending.lock());
        let mut won: Vec<u32> = taken.into_iter().filter(|&i| self.win(i)).collect();
        if won.is_empty() {
            return 0;
        }
        won.sort_unstable();
        let dropped = drop_slots(&won);
        self.settle_won(&won, dropped);
        if !dropped {
            // Queued again, for the next drain (or a `clear`) to retry.
            self.pending.lock().extend_from_slice(&won);
            return 0;
        }
        won.len()
    }

    /// After the drop of `won` slots (won from `STALE`): `OWNED` holes, or
    /// `STALE` again if the drop failed.
    fn settle_won(&self, won: &[u32], dropped: bool) {
        let after = if dropped { OWNED } else { STALE };
        for &i in won {
            // Release: pairs with the Acquire loads in `clear` and `keep`.
            self.state[i as usize].store(after, Ordering::Release);
        }
    }

    /// `STALE` → `DROPPING`, if it still is.
    fn win(&self, i: u32) -> bool {
        self.state[i as usize]
            .compare_exchange(STALE, DROPPING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Before a move into slots `first..first + n`: none holds a dead copy
    /// when this returns (each stale one was dropped: the batch it is in,
    /// or alone), or `None` if a drop failed (`drop_slots` returned false;
    /// that slot stays `STALE`). The caller owns the frames. Returns slots
    /// dropped.
    pub fn clear(
        &self,
        first: u32,
        n: usize,
        mut drop_slots: impl FnMut(&[u32]) -> bool,
    ) -> Option<usize> {
        let mut dropped = 0;
        for i in first..first + n as u32 {
            let mut round = 0u32;
            loop {
                match self.state[i as usize].load(Ordering::Acquire) {
                    OWNED => break,
                    STALE if round == 0 => {
                        // Most likely still queued: drop the whole batch.
                        dropped += self.drain(&mut drop_slots);
                    }
                    STALE => {
                        // Taken by a drainer that has not won it yet, or
                        // left by a failed drop: drop it alone.
                        if self.win(i) {
                            let ok = drop_slots(&[i]);
                            self.settle_won(&[i], ok);
                            if !ok {
                                return None;
                            }
                            dropped += 1;
                        }
                    }
                    _ => backoff(round),
                }
                round += 1;
            }
        }
        Some(dropped)
    }

    /// Before slots `first..first + n` are freed or their holes filled:
    /// each dead copy stays where it is (no longer queued for a drop), or,
    /// if a drainer is dropping it, the drop finishes first (a hole). The
    /// caller owns the frames.
    pub fn keep(&self, first: u32, n: usize) {
        for i in first..first + n as u32 {
            let mut round = 0u32;
            loop {
                let s = &self.state[i as usize];
                match s.load(Ordering::Acquire) {
                    OWNED => break,
                    STALE => {
                        if s.compare_exchange(STALE, OWNED, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                        {
                            break;
                        }
                    }
                    _ => backoff(round),
                }
                round += 1;
            }
        }
    }
}

/// A drop takes tens of microseconds: yield, then sleep.
fn backoff(round: u32) {
    if round < 16 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_batch_is_dropped_once_and_kept_slots_are_skipped() {
        let s = StaleSlots::new(256);
        for i in 0..BATCH as u32 - 1 {
            assert!(!s.mark(i, 1));
        }
        s.keep(5, 1);
        assert!(s.mark(100, 1), "the 64th mark fills the batch");
        let mut seen = Vec::new();
        let n = s.drain(|slots| {
            seen.extend_from_slice(slots);
            true
        });
        assert_eq!(n, BATCH - 1);
        assert!(!seen.contains(&5), "a kept slot is not dropped");
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "sorted, no duplicates"
        );
        assert_eq!(s.drain(|_| panic!("nothing left")), 0);
        s.mark(7, 1);
        assert_eq!(s.drain(|_| false), 0, "a failed drop drops nothing");
        assert_eq!(
            s.clear(7, 1, |slots| slots == [7]),
            Some(1),
            "it stayed queued, and clear drops it with that batch"
        );
    }

    #[test]
    fn clear_drops_a_queued_slot_with_its_batch() {
        let s = StaleSlots::new(64);
        s.mark(0, 4);
        let calls = AtomicUsize::new(0);
        let dropped = s.clear(2, 1, |slots| {
            calls.fetch_add(1, Ordering::Relaxed);
            assert_eq!(slots, &[0, 1, 2, 3]);
            true
        });
        assert_eq!((dropped, calls.load(Ordering::Relaxed)), (Some(4), 1));
        assert_eq!(s.clear(0, 4, |_| panic!("all holes already")), Some(0));
    }

    #[test]
    fn a_frame_reused_after_keep_is_dropped_once() {
        let s = StaleSlots::new(8);
        s.mark(3, 1);
        s.keep(3, 1); // freed with its copy; its queue entry stays
        s.mark(3, 1); // reused and copied again: two entries
        let mut seen = Vec::new();
        s.drain(|slots| {
            seen.extend_from_slice(slots);
            true
        });
        assert_eq!(seen, vec![3]);
    }

    #[test]
    fn owners_and_a_drainer_race_without_a_lost_or_double_drop() {
        use std::sync::atomic::AtomicBool;
        const OWNERS: u32 = 4;
        let s = StaleSlots::new(OWNERS as usize);
        // Whether each slot holds a page (a copy or the frame's data).
        let full: Vec<AtomicBool> = (0..OWNERS).map(|_| AtomicBool::new(false)).collect();
        let stop = AtomicBool::new(false);
        let drop_slots = |slots: &[u32]| {
            for &i in slots {
                assert!(
                    full[i as usize].swap(false, Ordering::SeqCst),
                    "slot {i} dropped twice"
                );
            }
            true
        };
        std::thread::scope(|t| {
            t.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    s.drain(drop_slots);
                }
            });
            let owners: Vec<_> = (0..OWNERS)
                .map(|i| {
                    let (s, full, drop_slots) = (&s, &full, drop_slots);
                    t.spawn(move || {
                        for round in 0..5000u32 {
                            // Filled, then copied into a region: stale.
                            full[i as usize].store(true, Ordering::SeqCst);
                            s.mark(i, 1);
                            if round % 2 == 0 {
                                assert!(s.clear(i, 1, drop_slots).is_some());
                                assert!(
                                    !full[i as usize].load(Ordering::SeqCst),
                                    "cleared, yet full"
                                );
                            } else {
                                s.keep(i, 1);
                                let was = full[i as usize].load(Ordering::SeqCst);
                                std::thread::yield_now();
                                assert_eq!(
                                    full[i as usize].load(Ordering::SeqCst),
                                    was,
                                    "dropped after keep"
                                );
                                if !was {
                                    continue; // a hole: the caller fills it
                                }
                                // Freed with its copy; the next fill reuses it.
                                full[i as usize].store(false, Ordering::SeqCst);
                            }
                        }
                    })
                })
                .collect();
            for o in owners {
                o.join().expect("owner");
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
}
