//! How a filled 4 KiB page goes into its region ([`FillModel`],
//! `Config::fill_model`): the models and what each costs; the rules are
//! `pagemove/copy.rs` (copy), `fault/protect.rs` and `reclaim/drops.rs`
//! (copy-protected). No state, no locks.

#[cfg(doc)]
use super::{Config, FaultMode};

/// How a filled 4 KiB page is put into a region (`Config::fill_model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum FillModel {
    /// `UFFDIO_MOVE` of the frame: no copy, but clearing the frame's pool
    /// slot flushes the TLB of every CPU the program runs on.
    Move,
    /// `UFFDIO_COPY` of the frame's bytes into a fresh page: no flush; the
    /// slot's dead copy is dropped later with 63 others, one flush for all
    /// (`frame/stale.rs`). A 4 KiB miss under a full budget costs 1.0
    /// shootdowns instead of 1.9 (docs/measurements.md, "Fill by copy").
    #[default]
    Copy,
    /// `Copy`, and a 4 KiB page read from its store for a read fault goes
    /// in write-protected (`UFFDIO_COPY_MODE_WP`): until its first write —
    /// a write-protect fault, which lifts the protection — the kernel
    /// keeps it exactly the store's copy, so reclaim drops it from the
    /// region with up to 31 others in one `process_madvise` (one TLB flush
    /// for the batch) instead of parking it (a flush each). Costs: a first
    /// write after a read takes a write-protect fault (a round trip and a
    /// flush); a dropped page gets no second chance (its next touch reads
    /// the store); and the program's own `MADV_DONTNEED` is not heard
    /// ([`Config::program_removals`] is ignored in this model,
    /// [`Config::hears_removals`]: each of faultline's drops would be a
    /// removal event to wait for). With
    /// [`FaultMode::InThread`], the kernel's own writes into a page read
    /// but not written yet (a `read(2)` into it) fail with `EFAULT`, as
    /// into an absent page: [`crate::Region::prefetch`] maps pages
    /// writable.
    CopyProtected,
}

impl FillModel {
    /// Whether filled 4 KiB pages go in by copy (`Copy`, `CopyProtected`).
    pub fn copies(self) -> bool {
        matches!(self, FillModel::Copy | FillModel::CopyProtected)
    }
}
