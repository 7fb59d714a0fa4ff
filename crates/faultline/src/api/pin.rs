//! Pinning part of a region: [`Region::pin`] maps a range now and keeps it
//! in memory (reclaim passes over it) until [`Region::unpin`] or the
//! region's drop — Umap's `umap_fetch_and_pin`. The rule lives in
//! `region/pins.rs` (the ranges) and `reclaim` (which skips them).

use super::region::{Access, Region};
use crate::error::FaultError;
use std::ops::Range;

impl<A: Access> Region<A> {
    /// Maps the pages of bytes `range` now (as [`Region::prefetch`]) and
    /// keeps them in memory: reclaim never takes them until they are
    /// unpinned or the region is dropped. Pinned pages count against the
    /// budget: pinning more than it holds fails once no frame is left.
    /// Returns how many pages were mapped.
    ///
    /// # Errors
    /// As [`Region::prefetch`]: a range not inside the region (nothing is
    /// pinned), or a page that could not be mapped (the range stays
    /// pinned; pages mapped before it stay in memory — unpin to let them go).
    pub fn pin(&self, range: Range<usize>) -> Result<usize, FaultError> {
        let pages = self.page_range(&range)?;
        // Pinned before it is mapped: a reclaim pass between the two would
        // otherwise take the pages just mapped.
        self.inner.pins.add(pages);
        self.prefetch(range)
    }

    /// Lets reclaim take the pages of bytes `range` again.
    ///
    /// # Errors
    /// [`FaultError::BadRange`] for a range not inside the region.
    pub fn unpin(&self, range: Range<usize>) -> Result<(), FaultError> {
        let pages = self.page_range(&range)?;
        self.inner.pins.remove(pages);
        Ok(())
    }

    /// The pages covering bytes `range`, which must lie inside the region.
    fn page_range(&self, range: &Range<usize>) -> Result<Range<usize>, FaultError> {
        if range.start > range.end || range.end > self.len() {
            return Err(FaultError::BadRange {
                start: range.start,
                end: range.end,
                len: self.len(),
            });
        }
        let ps = self.inner.page_size.bytes();
        Ok(range.start / ps..range.end.div_ceil(ps))
    }
}
