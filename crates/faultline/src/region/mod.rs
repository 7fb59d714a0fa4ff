//! Managed regions: the virtual ranges faultline serves faults on, and the
//! table that finds a region by address ([`table`]).
//!
//! A region is one anonymous mapping registered with the manager's
//! userfaultfd in missing mode, with `MADV_NOHUGEPAGE` (so the kernel never
//! allocates and clears a THP of its own before reporting a write fault: the
//! ~120 µs waste in docs/design.md) and `MADV_DONTFORK` (so its frames stay
//! exclusive to this process, which `UFFDIO_MOVE` requires).
//!
//! Per-page state, one `AtomicU32` word per page, stored sparsely
//! ([`states`]: untouched address space costs almost nothing):
//! `0 = absent`, `POISONED = poisoned`, otherwise `frame index + 1`, with
//! bit 31 set while the page is *parked* (soft-unmapped by reclaim: its data
//! sits in its frame's pool slot, and a touch faults it back cheaply). Invariant: a page's state changes
//! only under its fault lock (see [`crate::locks`]). It is set to
//! resident *before* the move that wakes the faulting threads, and stored with
//! Release; readers without the lock (the API, teardown's scan) load with
//! Acquire, so a thread that has seen its page's content also sees the page
//! resident.
//!
//! `dying` goes true (SeqCst) before teardown takes the first fault lock; a
//! worker checks it under the page's lock, so either the worker maps the page
//! before teardown visits it (and teardown moves it back), or it sees `dying`
//! and only wakes.

mod cost;
mod held;
mod leaf;
mod pins;
mod readahead;
mod states;
pub mod table;
mod tree;

use crate::config::{AccessPattern, PageSize};
use crate::dirty::Fingerprints;
use crate::store::Store;
use faultline_sys::mem::Mapping;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) use cost::OverheadSum;
pub use table::RegionTable;

const POISONED: u32 = u32::MAX;
const GONE: u32 = u32::MAX - 1;
const PARKED: u32 = 1 << 31;

/// State of one page of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Never touched (or unmapped): the next touch faults.
    Absent,
    /// Mapped, backed by this pool frame index.
    Resident(u32),
    /// Poisoned after an unservable fault: touches raise SIGBUS.
    Poisoned,
    /// Soft-unmapped by reclaim: the data is in this frame, in its pool slot;
    /// a touch moves it back (a minor fault) and marks it referenced.
    Parked(u32),
    /// The program unmapped (part of) the page itself (`munmap`, `mremap`
    /// away, `mmap(MAP_FIXED)` over it): faultline gave up its frame and
    /// never touches the range again; a fault on what is left of it is
    /// refused (SIGBUS).
    Gone,
}

fn decode(v: u32) -> PageState {
    match v {
        0 => PageState::Absent,
        POISONED => PageState::Poisoned,
        GONE => PageState::Gone,
        f if f & PARKED != 0 => PageState::Parked((f & !PARKED) - 1),
        f => PageState::Resident(f - 1),
    }
}

/// The frame a page in `state` holds, if any.
fn frame_of(state: PageState) -> Option<u32> {
    match state {
        PageState::Resident(f) | PageState::Parked(f) => Some(f),
        PageState::Absent | PageState::Poisoned | PageState::Gone => None,
    }
}

/// The shared part of a region: what the fault path needs.
#[derive(Debug)]
pub struct RegionInner {
    pub(crate) id: u64,
    pub(crate) map: Mapping,
    pub(crate) page_size: PageSize,
    pub(crate) store: Arc<dyn Store>,
    /// log2 of the fault-around window in pages (0: none). A window is also
    /// the unit of fault locking: `lock_key(p) = p >> window_shift`.
    window_shift: u32,
    pages: states::PageStates,
    /// Fingerprints of the store's copy of each page in use, kept by frame
    /// (the manager's table, shared by its regions), for a writable store
    /// (dirty tracking: [`crate::dirty`]). `set_state` moves a page's
    /// fingerprint with its frame and clears it when the page lets its
    /// frame go.
    fps: Option<Arc<Fingerprints>>,
    dying: AtomicBool,
    /// Pages holding a frame (resident or parked), kept by `set_state`:
    /// reclaim skips regions without any.
    holding: AtomicUsize,
    /// Never reclaimed ([`crate::MapOptions::pinned`]).
    pub(crate) pinned: bool,
    /// Page ranges never reclaimed (`Region::pin`).
    pub(crate) pins: pins::Pins,
    /// Pages the kernel recently would not let reclaim move out.
    pub(crate) held: held::Held,
    /// Read-ahead: the streams remembered, the declared access pattern.
    pub(crate) read_ahead: readahead::ReadAhead,
}

impl RegionInner {
    pub(crate) fn new(
        id: u64,
        map: Mapping,
        page_size: PageSize,
        store: Arc<dyn Store>,
        window: usize,
        pinned: bool,
    ) -> RegionInner {
        let n = map.len() / page_size.bytes();
        let head = map.addr() / page_size.bytes();
        RegionInner {
            id,
            map,
            page_size,
            store,
            window_shift: window.max(1).trailing_zeros(),
            pages: states::PageStates::new(n, head),
            fps: None,
            dying: AtomicBool::new(false),
            holding: AtomicUsize::new(0),
            pinned,
            pins: pins::Pins::default(),
            held: held::Held::default(),
            read_ahead: readahead::ReadAhead::new(0, AccessPattern::Normal),
        }
    }

    /// Remembers `n` read-ahead streams, `pattern` declared
    /// ([`readahead::ReadAhead`]).
    pub(crate) fn with_read_ahead(mut self, n: usize, pattern: AccessPattern) -> RegionInner {
        self.read_ahead = readahead::ReadAhead::new(n, pattern);
        self
    }

    /// Tracks dirtiness with `fps`, the manager's per-frame table (a region
    /// of a writable store without one writes every page it evicts).
    pub(crate) fn with_fingerprints(mut self, fps: &Arc<Fingerprints>) -> RegionInner {
        if self.store.writable() {
            self.fps = Some(Arc::clone(fps));
        }
        self
    }

    /// Adds its overhead ([`states`]) and its store's own memory, now and
    /// as it grows, to the manager's running `sum`, until it is dropped.
    pub(crate) fn counting_overhead(mut self, sum: &Arc<OverheadSum>) -> RegionInner {
        self.pages.count_into(sum);
        self.note_store_memory();
        self
    }

    /// Charges what the store keeps of its own now (`Store::own_memory`):
    /// after each store read, which may have made it.
    pub(crate) fn note_store_memory(&self) {
        self.pages.note_store_bytes(self.store.own_memory());
    }

    /// Its range was unmapped (`Mapping::unmap_now`): the page tables
    /// noted are gone with it.
    pub(crate) fn unmapped(&self) {
        self.pages.unmapped();
    }

    /// First byte.
    pub fn start(&self) -> usize {
        self.map.addr()
    }

    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.map.addr() + self.map.len()
    }

    /// Whether `addr` lies inside.
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.start() && addr < self.end()
    }

    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// The first page at or after `from` in any state but absent.
    pub(crate) fn next_used(&self, from: usize) -> Option<usize> {
        self.pages.next_used(from)
    }

    /// Appends the pages in use of the next span that has any at or after
    /// `from` to `out`, in order (see `PageStates::used_in_next_span`).
    pub(crate) fn used_in_next_span(&self, from: usize, out: &mut Vec<usize>) {
        self.pages.used_in_next_span(from, out);
    }

    /// The pages of `range` in any state but absent, in order (each found
    /// when the previous one has been handled; untouched spans skipped).
    pub(crate) fn used_pages(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(self.next_used(range.start), move |&p| self.next_used(p + 1))
            .take_while(move |&p| p < range.end)
    }

    /// Index of the page holding `addr` (which must lie inside).
    pub fn page_of(&self, addr: usize) -> usize {
        (addr - self.start()) / self.page_size.bytes()
    }

    /// Address of page `page`.
    pub fn page_addr(&self, page: usize) -> usize {
        self.start() + page * self.page_size.bytes()
    }

    /// The fault lock key of page `page`: `(domain, window key)`. For a
    /// store that names its object, the object and the object page's window
    /// (object page `>>` window shift), so regions over one object serialize
    /// the same page; otherwise the region and the page's window.
    pub fn lock_key(&self, page: usize) -> (u64, u64) {
        match self.store.identity() {
            Some((object, offset)) => (
                object,
                (offset / self.page_size.bytes() as u64 + page as u64) >> self.window_shift,
            ),
            None => (self.id, (page >> self.window_shift) as u64),
        }
    }

    /// The indices in `locks` of the fault locks of `pages` (in their
    /// order, with repeats: [`crate::locks::FaultLocks::lock_all`] sorts
    /// and dedups them), for a caller that takes a whole set at once.
    pub(crate) fn lock_indices(
        &self,
        locks: &crate::locks::FaultLocks,
        pages: impl IntoIterator<Item = usize>,
    ) -> Vec<usize> {
        pages
            .into_iter()
            .map(|p| {
                let (domain, key) = self.lock_key(p);
                locks.index(domain, key)
            })
            .collect()
    }

    /// The pages of the lock window holding `page`.
    pub fn window(&self, page: usize) -> std::ops::Range<usize> {
        let start = page >> self.window_shift << self.window_shift;
        start..(start + (1 << self.window_shift)).min(self.pages())
    }

    /// The fault-around window of `page`, if the region has one and it lies
    /// wholly inside the region.
    pub fn fault_around_window(&self, page: usize) -> Option<std::ops::Range<usize>> {
        let w = self.window(page);
        (self.window_shift > 0 && w.len() == 1 << self.window_shift).then_some(w)
    }

    /// State of page `page`. Exact under the page's fault lock.
    pub fn state(&self, page: usize) -> PageState {
        decode(self.pages.load(page))
    }

    /// The fingerprint of the store's copy of `page`, which holds a frame.
    /// Caller holds the page's lock.
    pub(crate) fn fingerprint(&self, page: usize) -> Option<u128> {
        let fps = self.fps.as_ref()?;
        frame_of(self.state(page)).and_then(|f| fps.get(f))
    }

    /// Whether the region keeps fingerprints (a writable store).
    pub(crate) fn tracks_dirt(&self) -> bool {
        self.fps.is_some()
    }

    /// Records the fingerprint of the store's copy of the page that is
    /// about to take `frame` (a fill, before the page is recorded in use).
    /// Caller holds the page's lock and owns the in-flight frame.
    pub(crate) fn fingerprint_frame(&self, frame: u32, fp: u128) {
        if let Some(fps) = &self.fps {
            fps.set(frame, Some(fp));
        }
    }

    /// Records the fingerprint of the store's copy of `page`, which holds a
    /// frame. Caller holds the page's lock.
    pub(crate) fn set_fingerprint(&self, page: usize, fp: u128) {
        if let (Some(fps), Some(f)) = (&self.fps, frame_of(self.state(page))) {
            fps.set(f, Some(fp));
        }
    }

    /// Forgets the fingerprint of `page`, which holds a frame and is known
    /// to differ from the store's copy: it counts dirty until written back,
    /// and its write-back needs no hash to tell. Caller holds the page's
    /// lock.
    pub(crate) fn forget_fingerprint(&self, page: usize) {
        if let (Some(fps), Some(f)) = (&self.fps, frame_of(self.state(page))) {
            fps.set(f, None);
        }
    }

    /// Sets the state of page `page`. Caller holds the page's fault lock.
    pub(crate) fn set_state(&self, page: usize, state: PageState) {
        let v = match state {
            PageState::Absent => 0,
            PageState::Poisoned => POISONED,
            PageState::Gone => GONE,
            PageState::Resident(f) => f + 1,
            PageState::Parked(f) => (f + 1) | PARKED,
        };
        // The store's Release pairs with the Acquire load in `state`; the
        // old value keeps `holding` and the fingerprints exact.
        let old = frame_of(decode(self.pages.swap(page, v)));
        let new = frame_of(state);
        // Relaxed: a count read as a hint by reclaim.
        match (old, new) {
            (None, Some(_)) => {
                self.holding.fetch_add(1, Ordering::Relaxed);
            }
            (Some(_), None) => {
                self.holding.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        if let Some(fps) = &self.fps {
            // Any change leaves the page unprotected (`crate::dirty`).
            if let Some(a) = old {
                fps.set_protected(a, false);
            }
            match (old, new) {
                (Some(a), Some(b)) if a != b => fps.moved(a, b),
                (Some(a), None) => fps.set(a, None),
                _ => {}
            }
        }
    }

    /// Whether resident `page` is write-protected and unwritten since its
    /// fill ([`crate::dirty`]): clean without a hash. Caller holds the
    /// page's lock.
    pub(crate) fn is_protected(&self, page: usize) -> bool {
        match (&self.fps, self.state(page)) {
            (Some(fps), PageState::Resident(f)) => fps.is_protected(f),
            _ => false,
        }
    }

    /// Marks resident `page` protected (after its write-protected copy) or
    /// not (before its protection is lifted). Caller holds the page's lock.
    pub(crate) fn set_protected(&self, page: usize, on: bool) {
        if let (Some(fps), PageState::Resident(f)) = (&self.fps, self.state(page)) {
            fps.set_protected(f, on);
        }
    }

    /// Pages holding a frame (resident or parked) right now; exact when no
    /// page changes state.
    pub(crate) fn holding(&self) -> usize {
        self.holding.load(Ordering::Relaxed)
    }

    /// Number of resident pages (a racy count, exact when no fault is in
    /// flight).
    pub fn resident(&self) -> usize {
        self.used_pages(0..self.pages())
            .filter(|&p| matches!(self.state(p), PageState::Resident(_)))
            .count()
    }

    /// Extends a run of pages from `page` (whose lock the caller holds): the
    /// longest run of at most `max` pages, each satisfying `ok`, whose fault
    /// locks the caller holds (`held`, lock indices) or can take right now —
    /// others' locks are only tried, never waited for, so no lock order
    /// matters. Taken locks go to `guards` and their indices to `held`; each
    /// page is re-checked under its lock. Returns the run's length (≥ 1).
    pub(crate) fn lock_run<'a>(
        &self,
        locks: &'a crate::locks::FaultLocks,
        page: usize,
        max: usize,
        held: &mut Vec<usize>,
        guards: &mut Vec<crate::locks::FaultGuard<'a>>,
        ok: impl Fn(usize) -> bool,
    ) -> usize {
        let mut n = 1;
        while n < max && page + n < self.pages() && ok(page + n) {
            let (d, k) = self.lock_key(page + n);
            let idx = locks.index(d, k);
            if !held.contains(&idx) {
                match locks.try_lock(d, k) {
                    Some(g) => {
                        guards.push(g);
                        held.push(idx);
                    }
                    None => break,
                }
            }
            // Re-check under its lock.
            if !ok(page + n) {
                break;
            }
            n += 1;
        }
        n
    }

    /// Whether teardown has begun.
    pub(crate) fn dying(&self) -> bool {
        self.dying.load(Ordering::SeqCst)
    }

    /// Marks teardown begun; pairs with the `dying()` load a worker makes
    /// under a fault lock that teardown takes afterwards.
    pub(crate) fn set_dying(&self) {
        self.dying.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Zero;
    use faultline_sys::mem::Mapping;

    #[test]
    fn holding_counts_pages_with_frames() {
        let m = Mapping::anonymous(8 * 4096, 4096).expect("mmap");
        let r = RegionInner::new(1, m, PageSize::Base4K, Arc::new(Zero), 1, false);
        assert_eq!(r.holding(), 0);
        r.set_state(0, PageState::Resident(5));
        r.set_state(1, PageState::Parked(6));
        r.set_state(2, PageState::Poisoned);
        assert_eq!(r.holding(), 2);
        r.set_state(0, PageState::Parked(5));
        r.set_state(1, PageState::Resident(6));
        assert_eq!(r.holding(), 2, "resident <-> parked keeps the frame");
        r.set_state(0, PageState::Absent);
        r.set_state(1, PageState::Gone);
        r.set_state(2, PageState::Absent);
        assert_eq!(r.holding(), 0);
    }
}
