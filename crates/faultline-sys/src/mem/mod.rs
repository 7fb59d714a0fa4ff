//! Anonymous memory mappings and `madvise`.
//!
//! [`Mapping`] owns one `mmap`ed range and unmaps it on drop. Invariants:
//! `addr % align == 0`, `len % PAGE_SIZE == 0`, and `[addr, addr + len)` is
//! mapped for the whole life of the value. It hands out only the address: how
//! the bytes are accessed (and by whom, given that userfaultfd can move pages
//! in and out underneath) is the owner's business. [`PageMap`] reads the page
//! tables through `/proc/self/pagemap`. No locks but a `Mapping`'s own list
//! of parts the program unmapped (see `mapping`).
//!
//! Layout (private submodules, re-exported here, so every path is
//! `faultline_sys::mem::Item`):
//! - `mapping`: [`Mapping`] — making, splitting, unmapping;
//! - `advise`: [`Advice`] and the calls on a range of a mapping (`madvise`,
//!   `mbind`, `mincore`, `MADV_DONTNEED`);
//! - `pagemap`: [`PageMap`], and [`protection_at`] (`/proc/self/maps`).

mod advise;
mod mapping;
mod pagemap;

pub use advise::Advice;
pub use mapping::Mapping;
pub use pagemap::{protection_at, PageMap};
