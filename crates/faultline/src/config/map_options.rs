//! [`MapOptions`]: the per-region options (page size, pinning, a fixed
//! address, the access pattern). Plain data, no locks.

use super::PageSize;

/// Options of one mapped region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapOptions {
    pub(crate) page_size: PageSize,
    pub(crate) pinned: bool,
    pub(crate) fixed: Option<Fixed>,
    pub(crate) access: AccessPattern,
}

/// How a program will touch a region, as it would tell the kernel with
/// `madvise(2)`: what read-ahead and fault-around do on its faults
/// ([`MapOptions::access`], [`crate::Region::advise`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum AccessPattern {
    /// No hint (the default): a fault that continues a sequential stream
    /// reads ahead, its window doubling with each fault of the stream up
    /// to [`crate::Config::readahead_max`]; a touch that continues a walk
    /// of a zero-filled region maps its neighbours too (fault-around).
    #[default]
    Normal = 0,
    /// Random touches (`MADV_RANDOM`): each fault maps its page alone —
    /// no read-ahead, no fault-around — so no frame is spent on pages the
    /// program will not touch soon.
    Random = 1,
    /// Sequential touches (`MADV_SEQUENTIAL`): a stream of a store-backed
    /// 4 KiB region reads the largest window
    /// ([`crate::Config::readahead_max`], at most an eighth of the pool)
    /// from its first fault. Other regions read no ahead, as with `Normal`.
    Sequential = 2,
}

impl AccessPattern {
    /// The pattern `madvise(2)`'s `advice` asks for (`MADV_NORMAL`,
    /// `MADV_RANDOM`, `MADV_SEQUENTIAL`); `None` for any other advice.
    pub fn from_madvise(advice: i32) -> Option<AccessPattern> {
        match advice {
            libc::MADV_NORMAL => Some(AccessPattern::Normal),
            libc::MADV_RANDOM => Some(AccessPattern::Random),
            libc::MADV_SEQUENTIAL => Some(AccessPattern::Sequential),
            _ => None,
        }
    }

    /// The pattern stored as `v` (`as u8`); anything else is `Normal`.
    pub(crate) fn from_u8(v: u8) -> AccessPattern {
        match v {
            1 => AccessPattern::Random,
            2 => AccessPattern::Sequential,
            _ => AccessPattern::Normal,
        }
    }
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
            access: AccessPattern::Normal,
        }
    }

    /// Declares how the program will touch the region
    /// ([`AccessPattern`]; default `Normal`); [`crate::Region::advise`]
    /// changes it later.
    pub fn access(mut self, pattern: AccessPattern) -> Self {
        self.access = pattern;
        self
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

#[cfg(test)]
mod tests {
    use super::AccessPattern;

    #[test]
    fn madvise_values_name_their_patterns() {
        assert_eq!(
            AccessPattern::from_madvise(libc::MADV_RANDOM),
            Some(AccessPattern::Random)
        );
        assert_eq!(
            AccessPattern::from_madvise(libc::MADV_SEQUENTIAL),
            Some(AccessPattern::Sequential)
        );
        assert_eq!(
            AccessPattern::from_madvise(libc::MADV_NORMAL),
            Some(AccessPattern::Normal)
        );
        assert_eq!(AccessPattern::from_madvise(libc::MADV_DONTNEED), None);
        for p in [
            AccessPattern::Normal,
            AccessPattern::Random,
            AccessPattern::Sequential,
        ] {
            assert_eq!(AccessPattern::from_u8(p as u8), p);
        }
    }
}
