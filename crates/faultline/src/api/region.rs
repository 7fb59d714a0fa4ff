//! [`Region`]: one managed region, as the program sees it. Its memory can
//! change underneath any reference — other threads write it, reclaim parks
//! and refills its pages, the program may `MADV_DONTNEED` it — so it is
//! never handed out as `&[u8]` by safe code: reads and writes go through
//! [`Region::read_at`]/[`Region::write_at`] and atomic views
//! ([`Region::atomics`]), the way rust-vmm's `VolatileSlice` treats guest
//! memory; [`Region::as_slice`] is `unsafe`, with its contract.
//!
//! The access mode is a type parameter: a [`Region<ReadOnly>`] (from
//! [`crate::Manager::map_read_only`]) has no write methods, so a write to a
//! read-only mapping is a compile error, not a silent drop.
//!
//! Locks: none of its own; `prefetch`, `migrate`, `collapse` and `flush`
//! take the fault locks of the pages they touch (see their modules).

use super::access;
use super::service::Service;
use crate::config::{AccessPattern, PageSize};
use crate::discard::Discard;
use crate::error::{AddrError, FaultError};
use crate::fault::{prefetch_page, Resolution};
use crate::frame::PoolId;
use crate::migrate::{CopyPlan, MigrateError, MigrateReport};
use crate::region::{PageState, RegionInner};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

mod sealed {
    pub trait Sealed {}
}

/// The access mode of a [`Region`]: [`ReadWrite`] or [`ReadOnly`].
pub trait Access: sealed::Sealed + Send + Sync + 'static {}

/// A region the program reads and writes (the default).
#[derive(Debug)]
pub enum ReadWrite {}

/// A region the program only reads: no write methods.
#[derive(Debug)]
pub enum ReadOnly {}

impl sealed::Sealed for ReadWrite {}
impl sealed::Sealed for ReadOnly {}
impl Access for ReadWrite {}
impl Access for ReadOnly {}

/// A managed region. Its pages fault into faultline on first touch;
/// dropping it writes dirty pages back (errors queued), moves its frames
/// back to the pool and unmaps it — [`Region::close`] does the same and
/// returns the write-back's result.
#[derive(Debug)]
pub struct Region<A: Access = ReadWrite> {
    pub(super) inner: Arc<RegionInner>,
    pub(super) service: Arc<Service>,
    _mode: PhantomData<A>,
}

impl<A: Access> Region<A> {
    pub(super) fn new(inner: Arc<RegionInner>, service: Arc<Service>) -> Region<A> {
        Region {
            inner,
            service,
            _mode: PhantomData,
        }
    }

    /// Address of the first byte, for handing to code that takes a pointer
    /// (C, `read(2)`); the memory is valid while the region lives.
    pub fn as_ptr(&self) -> *const u8 {
        self.inner.map.as_ptr()
    }

    /// Address of the first byte.
    pub fn addr(&self) -> usize {
        self.inner.start()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Page size.
    pub fn page_size(&self) -> PageSize {
        self.inner.page_size
    }

    /// Copies `buf.len()` bytes from byte `offset` of the region into `buf`
    /// (faulting pages in as needed). Concurrent writers are fine: each
    /// aligned 8-byte word is read atomically.
    ///
    /// # Errors
    /// [`FaultError::BadRange`] if the range is not inside the region.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<(), FaultError> {
        self.check(offset, buf.len())?;
        // SAFETY: the range is inside the mapping (checked), which lives as
        // long as `self`.
        unsafe { access::copy_out(self.addr() + offset, buf) };
        Ok(())
    }

    /// The aligned 8-byte word at byte `offset`, read atomically.
    ///
    /// # Errors
    /// [`FaultError::BadRange`] if `offset` is unaligned or the word is not
    /// inside the region.
    pub fn load_u64(&self, offset: usize) -> Result<u64, FaultError> {
        Ok(self
            .word(offset)?
            .load(std::sync::atomic::Ordering::Acquire))
    }

    /// # Safety
    /// The caller treats the slice as a snapshot that may change: no other
    /// thread writes the region while it is borrowed, and the program does
    /// not `MADV_DONTNEED` or unmap it meanwhile (faultline itself only ever
    /// changes a page's bytes to what they logically hold). Otherwise the
    /// `&[u8]` aliases memory written underneath it, which is undefined
    /// behaviour; [`Region::read_at`] has no such contract.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is valid for `len` bytes while `self` lives;
        // the caller promises no concurrent writes (the contract).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// Number of resident pages.
    pub fn resident_pages(&self) -> usize {
        self.inner.resident()
    }

    /// Whether the page at `addr` (page aligned, inside this region) is
    /// resident.
    ///
    /// # Errors
    /// [`AddrError`] if `addr` is outside the region or unaligned.
    pub fn is_resident(&self, addr: usize) -> Result<bool, AddrError> {
        if !self.inner.contains(addr) {
            return Err(AddrError::Foreign { addr });
        }
        if addr % self.inner.page_size.bytes() != 0 {
            return Err(AddrError::Unaligned {
                addr,
                page: self.inner.page_size.name(),
            });
        }
        Ok(matches!(
            self.inner.state(self.inner.page_of(addr)),
            PageState::Resident(_)
        ))
    }

    /// Maps the pages of bytes `range` of the region (offsets from its
    /// start) now, so that touching them does not fault: each absent page
    /// is filled (fault-around and read-ahead apply) and moved in from this
    /// thread, writable (under [`crate::FillModel::CopyProtected`] a page
    /// mapped write-protected has its protection lifted), so the kernel's
    /// own accesses to it work in any fault mode. Returns how many pages
    /// were mapped.
    ///
    /// # Errors
    /// [`FaultError::BadRange`] for a range not inside the region; a page
    /// that cannot be mapped (no frame, store error) is poisoned as a fault
    /// would be, and its error returned.
    pub fn prefetch(&self, range: Range<usize>) -> Result<usize, FaultError> {
        let r = &self.inner;
        let core = &self.service.core;
        let ps = r.page_size.bytes();
        if range.start > range.end {
            return Err(self.bad_range(range.start, range.end));
        }
        self.check(range.start, range.end - range.start)?;
        let mut mapped = 0;
        for page in range.start / ps..range.end.div_ceil(ps) {
            match prefetch_page(core, r, page) {
                Resolution::Moved => mapped += 1,
                Resolution::Poisoned => {
                    let addr = r.page_addr(page);
                    let err = core.take_error(|e| e.addr() == Some(addr)).unwrap_or(
                        FaultError::Inconsistent {
                            addr,
                            what: "prefetch poisoned the page without a recorded cause",
                        },
                    );
                    return Err(err);
                }
                _ => {}
            }
        }
        Ok(mapped)
    }

    /// Declares how the program will touch the region from now on, as
    /// `madvise(2)` with `MADV_RANDOM`, `MADV_SEQUENTIAL` or `MADV_NORMAL`
    /// tells the kernel ([`AccessPattern`]: `Random` maps each faulting
    /// page alone; `Sequential` reads the largest window ahead from a
    /// stream's first fault). The whole region takes the pattern; faults
    /// already being served finish as they began.
    pub fn advise(&self, pattern: AccessPattern) {
        self.inner.read_ahead.set_pattern(pattern);
    }

    /// The access pattern declared ([`MapOptions::access`](crate::MapOptions::access),
    /// [`Region::advise`]).
    pub fn access_pattern(&self) -> AccessPattern {
        self.inner.read_ahead.pattern()
    }

    /// Gives the pages of bytes `range` back: their frames return to the
    /// pool now, without a write-back, and the pages read afterwards what
    /// `how` says — the store's copy ([`Discard::KeepStore`]: writes not
    /// yet written back are dropped; [`Discard::StoreChanged`] when
    /// another writer changed it, which also waits for fills in flight) or
    /// zeros ([`Discard::Zero`]: the
    /// store's copy is dropped too). Returns the 4 KiB frames freed.
    ///
    /// # Errors
    /// [`FaultError::BadRange`] for a range not inside the region or not
    /// aligned to its pages; [`FaultError::Store`] if the store cannot drop
    /// its copy (a read-only store, for `Zero`), after the frames were
    /// freed; [`FaultError::Move`] if a page could not be taken out.
    pub fn discard(&self, range: Range<usize>, how: Discard) -> Result<usize, FaultError> {
        let ps = self.inner.page_size.bytes();
        if range.start > range.end || range.start % ps != 0 || range.end % ps != 0 {
            return Err(self.bad_range(range.start, range.end));
        }
        self.check(range.start, range.end - range.start)?;
        let pages = range.start / ps..range.end / ps;
        crate::discard::discard(&self.service.core, &self.inner, pages, how)
    }

    /// The copy plan of the config: `migrate_copy`, `migrate_threads`,
    /// `migrate_chunk` of [`crate::Experiment`].
    pub fn copy_plan(&self) -> CopyPlan {
        let e = &self.service.core.config.experiment;
        CopyPlan {
            method: e.migrate_copy,
            threads: e.migrate_threads,
            chunk: e.migrate_chunk,
        }
    }

    /// Moves the pages of bytes `range` (offsets, inside the region) that
    /// hold data — resident or parked — into frames of pool `pool`, while
    /// the application may keep using them: a touch during a page's move
    /// waits for it (docs/design.md, "Pools and migration"). Pages already there are left
    /// alone. Pages the kernel will not move for a whole move deadline (2 s:
    /// a page shared with a child of `fork()` after `MADV_DOFORK`, or pinned
    /// for I/O) stay where they are, counted in [`MigrateReport::refused`],
    /// and the call returns there, the rest of the range untried: it never
    /// holds the fault locks of a batch for much longer than that deadline.
    ///
    /// # Errors
    /// [`MigrateError`]: a range outside the region, no such pool, or a
    /// pool without room — that batch (one 2 MiB block) fails before any of
    /// it moved; batches before it stay migrated.
    pub fn migrate(
        &self,
        range: Range<usize>,
        pool: PoolId,
    ) -> Result<MigrateReport, MigrateError> {
        self.migrate_with(range, pool, self.copy_plan())
    }

    /// [`Region::migrate`] with an explicit copy plan (for experiments).
    ///
    /// # Errors
    /// As [`Region::migrate`].
    pub fn migrate_with(
        &self,
        range: Range<usize>,
        pool: PoolId,
        plan: CopyPlan,
    ) -> Result<MigrateReport, MigrateError> {
        let (pages, plan) = self.prepare(&range, plan)?;
        crate::migrate::migrate(&self.service.core, &self.inner, pages, pool, plan)
    }

    /// Collapses every 2 MiB block of bytes `range` (rounded out to whole
    /// blocks, inside the region; a 4 KiB-page region) into one 2 MiB frame
    /// of pool 0, mapped as one huge page. Blocks already in one frame are
    /// skipped.
    ///
    /// # Errors
    /// [`MigrateError`]: a range outside the region, a 2 MiB-page region,
    /// a block whose 512 pages are not all resident (or parked), or no free
    /// 2 MiB frame.
    pub fn collapse(&self, range: Range<usize>) -> Result<MigrateReport, MigrateError> {
        self.collapse_with(range, 0, self.copy_plan())
    }

    /// [`Region::collapse`] into pool `pool` with an explicit copy plan.
    ///
    /// # Errors
    /// As [`Region::collapse`].
    pub fn collapse_with(
        &self,
        range: Range<usize>,
        pool: PoolId,
        plan: CopyPlan,
    ) -> Result<MigrateReport, MigrateError> {
        let (pages, plan) = self.prepare(&range, plan)?;
        let t0 = std::time::Instant::now();
        let mut report = MigrateReport::default();
        let per = crate::frame::PAGES_PER_HUGE;
        let core = &self.service.core;
        for first in (pages.start / per * per..pages.end).step_by(per) {
            crate::migrate::collapse(core, &self.inner, first, pool, plan, &mut report)?;
        }
        report.total_ns = t0.elapsed().as_nanos() as u64;
        Ok(report)
    }

    /// The pool holding the page at byte `offset`, if the page holds data
    /// (resident or parked).
    pub fn pool_of(&self, offset: usize) -> Option<PoolId> {
        if offset >= self.len() {
            return None;
        }
        match self.inner.state(offset / self.inner.page_size.bytes()) {
            PageState::Resident(f) | PageState::Parked(f) => {
                Some(self.service.core.alloc.pool_of(f))
            }
            PageState::Absent | PageState::Poisoned | PageState::Gone => None,
        }
    }

    /// The oldest queued fault error concerning this region, if any.
    pub fn take_error(&self) -> Option<FaultError> {
        let r = &self.inner;
        self.service
            .core
            .take_error(|e| e.addr().is_some_and(|a| r.contains(a)))
    }

    /// [`Region::take_error`], waiting up to `timeout` for one.
    pub fn next_error(&self, timeout: Duration) -> Option<FaultError> {
        let r = &self.inner;
        self.service
            .core
            .wait_error(|e| e.addr().is_some_and(|a| r.contains(a)), timeout)
    }

    /// The atomic word at `offset` (8-byte aligned, inside the region).
    fn word(&self, offset: usize) -> Result<&AtomicU64, FaultError> {
        if offset % 8 != 0 {
            return Err(self.bad_range(offset, offset.saturating_add(8)));
        }
        self.check(offset, 8)?;
        // SAFETY: aligned, inside the mapping (checked), which lives as long
        // as the returned reference's borrow of `self`; every access faultline
        // offers to this memory is atomic or raw.
        Ok(unsafe { AtomicU64::from_ptr((self.addr() + offset) as *mut u64) })
    }

    /// Checks that `len` bytes from `offset` lie inside the region, and
    /// that this is the process that mapped it.
    fn check(&self, offset: usize, len: usize) -> Result<(), FaultError> {
        if !self.service.core.in_owner() {
            return Err(FaultError::Forked { addr: self.addr() });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(self.bad_range(offset, offset.saturating_add(len))),
        }
    }

    fn bad_range(&self, start: usize, end: usize) -> FaultError {
        FaultError::BadRange {
            start,
            end,
            len: self.len(),
        }
    }

    /// The page range covering bytes `range` (which must lie inside the
    /// region), and `plan` clamped to what this manager can do.
    fn prepare(
        &self,
        range: &Range<usize>,
        plan: CopyPlan,
    ) -> Result<(Range<usize>, CopyPlan), MigrateError> {
        if !self.service.core.in_owner() {
            return Err(MigrateError::Forked { addr: self.addr() });
        }
        if range.start > range.end || range.end > self.len() {
            return Err(MigrateError::OutOfRange {
                start: range.start,
                end: range.end,
            });
        }
        let ps = self.inner.page_size.bytes();
        let workers = self.service.core.config.workers;
        let plan = CopyPlan {
            threads: plan.threads.clamp(1, workers + 1),
            chunk: plan
                .chunk
                .next_power_of_two()
                .clamp(faultline_sys::PAGE_SIZE, faultline_sys::HUGE_PAGE_SIZE),
            ..plan
        };
        Ok((range.start / ps..range.end.div_ceil(ps), plan))
    }
}

impl Region<ReadWrite> {
    /// Address of the first byte, writable (see [`Region::as_ptr`]).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.inner.map.as_ptr()
    }

    /// Copies `buf` to byte `offset` of the region (faulting pages in as
    /// needed); each aligned 8-byte word is written atomically.
    ///
    /// # Errors
    /// [`FaultError::BadRange`] if the range is not inside the region.
    pub fn write_at(&self, offset: usize, buf: &[u8]) -> Result<(), FaultError> {
        self.check(offset, buf.len())?;
        // SAFETY: the range is inside the mapping (checked), which lives as
        // long as `self`.
        unsafe { access::copy_in(self.addr() + offset, buf) };
        Ok(())
    }

    /// Stores `value` atomically in the aligned 8-byte word at `offset`.
    ///
    /// # Errors
    /// [`FaultError::BadRange`] if `offset` is unaligned or the word is not
    /// inside the region.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), FaultError> {
        self.word(offset)?
            .store(value, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The region as atomic 8-byte words, shared by any number of threads:
    /// the safe way to read and write region memory in place.
    ///
    /// # Panics
    /// In a child of `fork()`: the region is not mapped there
    /// (`MADV_DONTFORK`).
    pub fn atomics(&self) -> &[AtomicU64] {
        assert!(
            self.service.core.in_owner(),
            "faultline region used in a child of fork(): it is not mapped there"
        );
        // SAFETY: the mapping is page aligned and `len` a multiple of 4 KiB,
        // valid while `self` lives (and mapped: this is its process);
        // atomics may alias memory other threads (and the kernel's page
        // moves) change.
        unsafe { std::slice::from_raw_parts(self.as_ptr().cast::<AtomicU64>(), self.len() / 8) }
    }

    /// # Safety
    /// As [`Region::as_slice`], and more strictly: no other thread reads or
    /// writes the region while the slice is borrowed (`&mut self` only
    /// excludes this handle's other borrows, not raw pointers or other
    /// threads' views through [`Region::atomics`]).
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: valid for `len` bytes while `self` lives; exclusive by the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) }
    }
}
