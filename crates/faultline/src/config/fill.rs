//! How a filled 4 KiB page goes into its region ([`FillModel`],
//! `Config::fill_model`): the models and what each costs, and the default
//! ([`FillModel::Auto`]: chosen by the fault mode, resolved when the
//! manager is built); the rules are `pagemove/copy.rs` (copy),
//! `fault/protect.rs` and `reclaim/drops.rs` (copy-protected). No state,
//! no locks.

#[cfg(doc)]
use super::Config;
use super::FaultMode;

/// How a filled 4 KiB page is put into a region (`Config::fill_model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum FillModel {
    /// The default: [`FillModel::CopyProtected`] where workers serve the
    /// faults ([`FaultMode::Workers`]), [`FillModel::Copy`] where the
    /// faulting threads do ([`FaultMode::InThread`], where a protected page
    /// would turn the kernel's own writes into it, a `read(2)`, into
    /// `EFAULT`). Resolved when the manager is built: its
    /// `config().fill_model` is the model in effect. Chosen by measurement:
    /// docs/measurements.md §34.
    #[default]
    Auto,
    /// `UFFDIO_MOVE` of the frame: no copy, but clearing the frame's pool
    /// slot flushes the TLB of every CPU the program runs on.
    Move,
    /// `UFFDIO_COPY` of the frame's bytes into a fresh page: no flush; the
    /// slot's dead copy is dropped later with 63 others, one flush for all
    /// (`frame/stale.rs`). A 4 KiB miss under a full budget costs 1.0
    /// shootdowns instead of 1.9 (docs/measurements.md, "Fill by copy").
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
    /// The model in effect under fault mode `mode`: [`FillModel::Auto`]
    /// resolved, any other model as it is.
    pub fn under(self, mode: FaultMode) -> FillModel {
        match (self, mode) {
            (FillModel::Auto, FaultMode::Workers) => FillModel::CopyProtected,
            (FillModel::Auto, FaultMode::InThread) => FillModel::Copy,
            (model, _) => model,
        }
    }

    /// Whether filled 4 KiB pages go in by copy (`Copy`, `CopyProtected`,
    /// and `Auto`, which is one of the two).
    pub fn copies(self) -> bool {
        matches!(
            self,
            FillModel::Auto | FillModel::Copy | FillModel::CopyProtected
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_protects_with_workers_and_copies_in_thread() {
        assert_eq!(FillModel::default(), FillModel::Auto);
        assert_eq!(
            FillModel::Auto.under(FaultMode::Workers),
            FillModel::CopyProtected
        );
        assert_eq!(FillModel::Auto.under(FaultMode::InThread), FillModel::Copy);
        for m in [FillModel::Move, FillModel::Copy, FillModel::CopyProtected] {
            for mode in [FaultMode::Workers, FaultMode::InThread] {
                assert_eq!(m.under(mode), m, "an explicit model is kept");
            }
        }
        assert!(FillModel::Auto.copies() && !FillModel::Move.copies());
    }
}
