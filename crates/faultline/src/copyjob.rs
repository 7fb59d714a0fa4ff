//! A copy shared between threads (seed 001): a migration's bytes cut into
//! pieces of at most `migrate_chunk`, which the migrating thread and up to
//! `threads - 1` idle fault workers claim one at a time ([`Claims`], model
//! checked with loom). The migrating thread owns every frame involved and
//! reads nothing back until [`Claims::all_done`].
//!
//! Invariant: each piece is claimed by exactly one thread; at most
//! `max_helpers` helpers join. No locks (atomics only; each ordering says
//! what it pairs with).

use crate::config::CopyMethod;
use crate::memops::{copy_large, copy_per_page};
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One piece of a copy: `len` bytes from pool address `src` to `dst`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub(crate) src: usize,
    pub(crate) dst: usize,
    pub(crate) len: usize,
}

impl Piece {
    /// Copies the piece by `method`.
    ///
    /// # Safety
    /// `src` and `dst` are the pool slots of frames in flight with the
    /// caller's migration (moved out under their fault locks, or freshly
    /// allocated: populated, so no access faults), the ranges do not overlap,
    /// and no other thread reads `dst` or writes either range meanwhile.
    pub(crate) unsafe fn copy(&self, method: CopyMethod) {
        // SAFETY: valid, disjoint and exclusive for the call (the contract).
        let (dst, src) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.dst as *mut u8, self.len),
                std::slice::from_raw_parts(self.src as *const u8, self.len),
            )
        };
        copy_with(method, dst, src);
    }
}

/// The claim protocol of a shared copy of `n` pieces: each piece is claimed
/// by exactly one thread; at most `max_helpers` helpers join; the owner sees
/// every piece's bytes once [`Claims::all_done`] says so. Model checked with
/// loom (`loom_copy_claims`).
#[derive(Debug)]
pub(crate) struct Claims {
    n: usize,
    /// Next piece to claim (Relaxed: a ticket counter; the pieces themselves
    /// were published with the job under the job list's mutex).
    next: AtomicUsize,
    /// Pieces finished. Release by the finisher, after its stores; pairs
    /// with the Acquire in [`Claims::all_done`].
    done: AtomicUsize,
    /// Bit `w` set once helper `w` joined; at most `max_helpers` bits.
    joined: AtomicU64,
    max_helpers: u32,
}

impl Claims {
    pub(crate) fn new(n: usize, max_helpers: u32) -> Claims {
        Claims {
            n,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            joined: AtomicU64::new(0),
            max_helpers,
        }
    }

    /// The next unclaimed piece, now this thread's.
    pub(crate) fn claim(&self) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.n).then_some(i)
    }

    /// Reports a claimed piece done (after writing its bytes).
    pub(crate) fn finish(&self) {
        self.done.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn has_work(&self) -> bool {
        self.next.load(Ordering::Relaxed) < self.n
    }

    /// Whether helper `w` may take pieces (it joined already, or a helper
    /// slot is free, which it then takes).
    pub(crate) fn may_join(&self, w: usize) -> bool {
        let bit = 1u64 << (w % 64);
        let mut cur = self.joined.load(Ordering::Relaxed);
        loop {
            if cur & bit != 0 {
                return true;
            }
            if cur.count_ones() >= self.max_helpers {
                return false;
            }
            match self.joined.compare_exchange_weak(
                cur,
                cur | bit,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Whether every piece is done; true means their bytes are visible.
    pub(crate) fn all_done(&self) -> bool {
        // Acquire pairs with the Release in `finish`.
        self.done.load(Ordering::Acquire) >= self.n
    }
}

/// A copy shared between the migrating thread and idle workers.
#[derive(Debug)]
pub(crate) struct CopyJob {
    pub(crate) pieces: Vec<Piece>,
    pub(crate) method: CopyMethod,
    pub(crate) claims: Claims,
    /// The CPU the owner ran on when it offered the job: a worker there
    /// would only preempt the owner, not add a CPU.
    pub(crate) owner_cpu: usize,
}

impl CopyJob {
    /// Claims and copies one piece; false when none is left.
    pub(crate) fn run_one(&self) -> bool {
        let Some(p) = self.claims.claim().and_then(|i| self.pieces.get(i)) else {
            return false;
        };
        // SAFETY: the job's owner holds both frames of every piece in flight
        // and does not touch a piece until `all_done`; each piece is claimed
        // by exactly one thread (this one, now) and pieces do not overlap.
        unsafe { p.copy(self.method) };
        self.claims.finish();
        true
    }

    /// Waits until every piece is done (pieces in other threads' hands take
    /// at most one chunk's time).
    pub(crate) fn wait(&self) {
        let mut spins = 0u32;
        while !self.claims.all_done() {
            crate::sync::backoff(&mut spins);
        }
    }
}

fn copy_with(method: CopyMethod, dst: &mut [u8], src: &[u8]) {
    match method {
        CopyMethod::PerPage => copy_per_page(dst, src),
        CopyMethod::Chunked => dst.copy_from_slice(src),
        CopyMethod::ChunkedNt => copy_large(dst, src),
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::Claims;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    struct Shared {
        claims: Claims,
        pieces: [UnsafeCell<usize>; 3],
    }

    // SAFETY: each cell is written only by the thread that claimed its piece
    // and read by the owner only after `all_done` — the property under test;
    // loom reports any access the protocol fails to order.
    unsafe impl Sync for Shared {}

    /// The owner and one helper share three pieces: every piece is written
    /// exactly once, and the owner reads every piece's bytes after
    /// `all_done` without a data race, in every interleaving.
    #[test]
    fn loom_copy_claims() {
        loom::model(|| {
            let s = Arc::new(Shared {
                claims: Claims::new(3, 1),
                pieces: [UnsafeCell::new(0), UnsafeCell::new(0), UnsafeCell::new(0)],
            });
            let helper = {
                let s = Arc::clone(&s);
                loom::thread::spawn(move || {
                    assert!(s.claims.may_join(1));
                    while let Some(i) = s.claims.claim() {
                        s.pieces[i].with_mut(|p| {
                            // SAFETY: piece i is this thread's (claimed).
                            unsafe { *p += i + 1 }
                        });
                        s.claims.finish();
                    }
                })
            };
            while let Some(i) = s.claims.claim() {
                // SAFETY: piece i is this thread's (claimed).
                s.pieces[i].with_mut(|p| unsafe { *p += i + 1 });
                s.claims.finish();
            }
            while !s.claims.all_done() {
                loom::thread::yield_now();
            }
            for (i, c) in s.pieces.iter().enumerate() {
                // SAFETY: all pieces are done; nobody writes them any more.
                assert_eq!(c.with(|p| unsafe { *p }), i + 1);
            }
            helper.join().expect("helper");
            assert!(!s.claims.may_join(2), "one helper at most");
        });
    }
}
