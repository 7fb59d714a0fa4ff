//! [`MapOptions`]: the per-region options (page size, pinning, a fixed
//! address). Plain data, no locks.

use super::PageSize;

/// Options of one mapped region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapOptions {
    pub(crate) page_size: PageSize,
    pub(crate) pinned: bool,
    pub(crate) fixed: Option<Fixed>,
}

/// Where a region must be placed ([`MapOptions::at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fixed {
    pub(crate) addr: usize,
    /// Replace what is mapped there (`MAP_FIXED`), not refuse it.
    pub(crate) replace: bool,
}

impl Default for MapOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl MapOptions {
    /// 4 KiB pages.
    pub fn new() -> Self {
        MapOptions {
            page_size: PageSize::Base4K,
            pinned: false,
            fixed: None,
        }
    }

    /// Sets the page size. A region's length must be a multiple of it:
    /// [`crate::Manager::map`] refuses other lengths rather than rounding.
    pub fn page_size(mut self, size: PageSize) -> Self {
        self.page_size = size;
        self
    }

    /// Pins the region's pages in memory once faulted: reclaim never takes
    /// them, so the region's writes live in memory and need no write-back —
    /// any store may back a writable pinned region (the store only fills
    /// pages on first touch). Pinned pages count against the budget until
    /// the region is dropped. Default off.
    pub fn pinned(mut self, pinned: bool) -> Self {
        self.pinned = pinned;
        self
    }

    /// Places the region at exactly `addr` (a multiple of the page size)
    /// instead of where the kernel picks. Mapping fails
    /// ([`crate::MapError::AddressInUse`]) if anything is mapped in the
    /// range: the region never replaces memory (`MAP_FIXED_NOREPLACE`).
    pub fn at(mut self, addr: usize) -> Self {
        self.fixed = Some(Fixed {
            addr,
            replace: false,
        });
        self
    }

    /// Places the region at exactly `addr`, replacing whatever the program
    /// has mapped in the range (`MAP_FIXED`, as `mmap(2)` does; for C
    /// callers such as the Umap layer, which reserve a range and map into
    /// it). Another managed region in the range is still refused.
    ///
    /// # Safety
    /// Nothing in `[addr, addr + len)` of the region mapped with these
    /// options may be referenced or owned by anything else (no Rust object,
    /// no allocator's memory, no other library's mapping): it is unmapped
    /// when the region is made.
    pub unsafe fn at_replacing(mut self, addr: usize) -> Self {
        self.fixed = Some(Fixed {
            addr,
            replace: true,
        });
        self
    }
}
