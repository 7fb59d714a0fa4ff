//! faultline: a user-space virtual memory manager for Linux.
//!
//! Programs map *managed regions*; the first touch of a page faults
//! (userfaultfd) into faultline's worker threads, which take a frame from
//! faultline's own pool, fill it (zeros, or the page's data from the region's
//! store) and move it into place with `UFFDIO_MOVE`, without copying. Under
//! the memory budget, reclaim parks cold pages, writes dirty ones back and
//! reuses their frames.
//!
//! ```no_run
//! use faultline::{store::Zero, Manager, MapOptions, PageSize};
//! let mm = Manager::builder().budget(256 << 20).workers(2).build()?;
//! let r = mm.map(64 << 20, Zero, MapOptions::new().page_size(PageSize::Huge2M))?;
//! r.write_at(12345, b"hello")?; // faults one 2 MiB page in
//! let mut buf = [0u8; 5];
//! r.read_at(12345, &mut buf)?;
//! assert_eq!(&buf, b"hello");
//! println!("{}", mm.stats());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The public API is [`Manager`], [`ManagerBuilder`], [`Region`], the
//! [`Store`] trait with its stores in [`store`], [`Config`] and the errors.
//! The modules behind it are layered, each importing only from the layers
//! below it (the order is `LAYERS` in `tests/layers.rs`, which checks it,
//! and the map in docs/design.md says which file owns which rule), with no
//! import cycle inside a folder either. Only `faultline-sys` makes system
//! calls.

mod api;
mod budget;
mod config;
mod copyjob;
mod core;
mod dirty;
mod discard;
mod drop_rechecks;
mod error;
mod exclusive;
mod fault;
mod fill;
mod frame;
mod kick;
mod locks;
mod memops;
mod migrate;
mod nesting;
mod objects;
mod overhead;
mod own_discards;
mod pagemove;
mod publish;
mod reclaim;
mod region;
mod rereads;
mod stats;
pub mod store;
mod sync;
mod writeback;

pub use api::{Access, Manager, ManagerBuilder, ReadOnly, ReadWrite, Region};
pub use config::{
    AccessPattern, Config, ConfigError, CopyMethod, Experiment, FaultMode, FillModel, FillOrder,
    LockMode, LookupCache, MapOptions, PageSize, PoolSpec,
};
pub use discard::Discard;
pub use error::{AddrError, BudgetError, BuildError, FaultError, FileHolder, MapError};
pub use fault::inthread::ready as in_thread_ready;
pub use frame::PoolId;
pub use locks::LockStat;
pub use migrate::{CopyPlan, MigrateError, MigrateReport};
pub use stats::StatsSnapshot;

/// Live stats out of the process: every manager (unless
/// [`Config::publish_stats`] is off) publishes its statistics in a
/// shared-memory file under [`published::STATS_DIR`], refreshed every
/// 250 ms; [`published::scan`] reads them from any process (`faultline
/// stat` does), [`published::prometheus`] renders them for Prometheus.
pub mod published {
    pub use crate::publish::{
        prometheus, read_file, scan, FieldValue, Published, PublishedError, Scan, STATS_DIR,
    };
}
pub use store::{Store, StoreError};

/// Internals for faultline's own benchmarks (`faultline bench`, criterion):
/// the frame allocator, the copy and fingerprint routines, the region
/// table's lookup counters, a delaying store. Not part of the API: behind
/// the `bench-internals` feature and hidden from the docs.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::dirty::fingerprint;
    pub use crate::fill::NEIGHBOURHOOD;
    pub use crate::frame::{AllocConfig, Frame, FrameAlloc, FrameAllocator};
    pub use crate::memops::{copy_large, copy_per_page};
    pub use crate::region::table::{reset_thread_counters, thread_counters, LookupCounters};
}

/// The README's Rust examples, compiled and run as doctests (a snippet
/// that no longer builds or runs fails the tests). Not part of the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
