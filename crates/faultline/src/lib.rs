//! faultline: a user-space virtual memory manager for Linux.
//!
//! Programs map *managed regions*; the first touch of a page faults
//! (userfaultfd) into faultline's worker threads, which take a frame from
//! faultline's own pool, fill it (zeros, or the page's data from the region's
//! store) and move it into place with `UFFDIO_MOVE`, without copying.
//!
//! ```no_run
//! use faultline::{Manager, MapOptions, PageSize, store::Zero};
//! let mm = Manager::builder().budget(256 << 20).workers(2).build()?;
//! let mut r = mm.map(64 << 20, Zero, MapOptions::new().page_size(PageSize::Huge2M))?;
//! r.as_mut_slice()[12345] = 7; // faults one 2 MiB page in
//! println!("{}", mm.stats());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Components, one module each: [`config`], [`region`] (the region table),
//! [`frame`] (pool and allocator), [`fault`] (service and its locks),
//! [`fill`], [`store`], [`dirty`], [`migrate`], [`stats`]; [`manager`] ties them together. Only
//! `faultline-sys` makes system calls.

pub mod config;
pub mod dirty;
pub mod fault;
pub mod fill;
pub mod frame;
pub mod manager;
pub mod migrate;
mod pagemove;
mod reclaim;
pub mod region;
pub mod stats;
pub mod store;
mod sync;

pub use config::{Config, ConfigError, CopyMethod, LockMode, MapOptions, PageSize, PoolSpec};
pub use fault::FaultError;
pub use frame::PoolId;
pub use manager::{AddrError, BuildError, Manager, ManagerBuilder, MapError, Region};
pub use migrate::{CopyPlan, MigrateError, MigrateReport};
pub use region::table::LookupCache;
pub use stats::StatsSnapshot;
pub use store::{Store, StoreError};
