//! The balloon's ledger: frames of pool 0 taken out of its allocator with
//! their memory given back to the kernel ([`super::Pool::release`]). Of the
//! pages it holds, `withheld` are beyond the budget (the budget shrank, or
//! the pool's room to grow above the initial budget) and the rest are
//! *idle*: within the budget, given back because the pool idled above its
//! high watermark, and taken back when a fault needs a frame. The policy —
//! when to inflate or deflate, and refilling frames — is `budget.rs`.
//!
//! Invariant: `withheld <= pages held`; frames held are neither free nor
//! mapped, and their slots may be holes. Locks: `inner`, held through a
//! whole inflate or deflate ([`Ledger`]) — frames move between the
//! allocator and the ledger under it, so whoever holds it (the stats) sees
//! every frame in one place; the allocator's locks are taken under it,
//! never the other way round.

use super::pool::{Frame, HUGE_ORDER, PAGES_PER_HUGE};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, Default)]
struct Inner {
    frames: Vec<Frame>,
    held: usize,
    withheld: usize,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Balloon {
    inner: Mutex<Inner>,
    /// `held - withheld`, readable without the lock (a hint: exact when
    /// nobody inflates or deflates).
    idle: AtomicUsize,
}

impl Balloon {
    /// The ledger, locked.
    pub fn ledger(&self) -> Ledger<'_> {
        Ledger {
            inner: self.inner.lock(),
            idle: &self.idle,
        }
    }

    /// Idle pages held (a hint, without the lock).
    pub fn idle(&self) -> usize {
        self.idle.load(Ordering::Relaxed)
    }

    /// `(pages held, of which withheld)`.
    pub fn counts(&self) -> (usize, usize) {
        self.ledger().counts()
    }
}

/// The balloon's ledger, locked: see the module docs.
#[derive(Debug)]
pub struct Ledger<'a> {
    inner: MutexGuard<'a, Inner>,
    idle: &'a AtomicUsize,
}

impl Drop for Ledger<'_> {
    fn drop(&mut self) {
        // Relaxed: a hint; the mutex orders the ledger itself.
        self.idle
            .store(self.inner.held - self.inner.withheld, Ordering::Relaxed);
    }
}

impl Ledger<'_> {
    /// Takes `frames` in, counted as withheld (beyond the budget) or idle.
    pub fn put(&mut self, frames: Vec<Frame>, withheld: bool) {
        let i = &mut *self.inner;
        let pages: usize = frames.iter().map(Frame::pages).sum();
        i.held += pages;
        if withheld {
            i.withheld += pages;
        }
        i.frames.extend(frames);
    }

    /// Hands out idle frames worth at least `pages` 4 KiB pages (a 2 MiB
    /// frame is split when less is asked for), or fewer if fewer are idle.
    /// For `pages` of a 2 MiB frame or more, whole 2 MiB frames go first
    /// (a run of 4 KiB frames from different blocks would not make one).
    pub fn take_idle(&mut self, pages: usize) -> Vec<Frame> {
        let i = &mut *self.inner;
        let mut out = Vec::new();
        let mut got = 0;
        if pages >= PAGES_PER_HUGE {
            // Whole blocks to the top of the stack.
            i.frames.sort_by_key(|f| f.order());
        }
        while got < pages {
            let idle = i.held - i.withheld;
            let Some(f) = i.frames.pop() else { break };
            if f.pages() <= idle && f.pages() <= (pages - got).max(1) {
                got += f.pages();
                i.held -= f.pages();
                out.push(f);
                continue;
            }
            if f.order() != HUGE_ORDER || idle == 0 {
                i.frames.push(f);
                break;
            }
            // Split a 2 MiB frame: its 4 KiB frames go back, but for the
            // ones asked for (the buddy merges them again when freed).
            let want = (pages - got).min(idle).min(f.pages());
            let base = f.index();
            i.frames
                .extend((want as u32..f.pages() as u32).map(|k| Frame::from_parts(base + k, 0)));
            out.extend((0..want as u32).map(|k| Frame::from_parts(base + k, 0)));
            got += want;
            i.held -= want;
        }
        out
    }

    /// Moves up to `pages` idle pages to withheld; returns how many moved.
    pub fn withhold(&mut self, pages: usize) -> usize {
        let i = &mut *self.inner;
        let n = pages.min(i.held - i.withheld);
        i.withheld += n;
        n
    }

    /// Moves up to `pages` withheld pages to idle (the budget grew);
    /// returns how many moved.
    pub fn unwithhold(&mut self, pages: usize) -> usize {
        let i = &mut *self.inner;
        let n = pages.min(i.withheld);
        i.withheld -= n;
        n
    }

    /// `(pages held, of which withheld)`.
    pub fn counts(&self) -> (usize, usize) {
        (self.inner.held, self.inner.withheld)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_taken_withheld_is_kept() {
        let balloon = Balloon::default();
        let mut b = balloon.ledger();
        b.put(
            vec![Frame::from_parts(0, 9), Frame::from_parts(512, 9)],
            true,
        );
        assert_eq!(b.counts(), (1024, 1024));
        assert!(b.take_idle(1).is_empty(), "nothing idle");
        assert_eq!(b.unwithhold(600), 600);
        assert_eq!(b.counts(), (1024, 424));
        let one = b.take_idle(1);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].order(), 0, "a 2 MiB frame split for one page");
        assert_eq!(b.counts(), (1023, 424));
        let rest = b.take_idle(10_000);
        let got: usize = rest.iter().map(Frame::pages).sum();
        assert_eq!(got, 599, "no more than the idle pages");
        assert_eq!(b.counts(), (424, 424));
        assert_eq!(b.withhold(10), 0);
        b.put(vec![Frame::from_parts(2048, 0)], false);
        assert_eq!(b.withhold(10), 1);
        assert_eq!(b.counts(), (425, 425));
        drop(b);
        assert_eq!(balloon.idle(), 0);
        assert_eq!(balloon.ledger().unwithhold(5), 5);
        assert_eq!(balloon.idle(), 5, "published when the ledger drops");
    }
}
