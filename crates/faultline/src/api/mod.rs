//! The public API: [`Manager`] (built by [`ManagerBuilder`]) and
//! [`Region`]. This layer only drives the modules below it; it owns the
//! lifecycle rules — what `build()` acquires, what mapping checks, what a
//! region's drop does — and nothing of the fault path.

mod access;
mod builder;
mod manager;
mod pin;
mod region;
mod service;
mod teardown;

pub use builder::ManagerBuilder;
pub use manager::Manager;
pub use region::{Access, ReadOnly, ReadWrite, Region};
