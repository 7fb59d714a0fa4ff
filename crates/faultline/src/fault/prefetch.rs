//! Faults without a fault: `Region::prefetch` maps pages from the calling
//! (application) thread through the fault path ([`super::resolve`]), taking
//! each page's lock as a worker would, and maps them writable (see
//! [`prefetch_page`]).
//!
//! Locks: the page's fault lock, waited for.

use super::resolve::resolve;
use super::{Fault, Resolution};
use crate::core::Core;
use crate::region::{PageState, RegionInner};

/// Maps `page` of `region` now, from the calling (application) thread: the
/// fault path without a fault, for `Region::prefetch`. Takes the page's lock
/// like a worker; a page already there is left alone.
pub(crate) fn prefetch_page(core: &Core, region: &RegionInner, page: usize) -> Resolution {
    let (domain, key) = region.lock_key(page);
    let _guard = core.locks.lock(domain, key);
    // Mapped writable: a prefetch is how a program readies region memory
    // for the kernel's own accesses (in-thread, a write-protect fault in a
    // `read(2)` into it is `EFAULT`, as a missing page is).
    let how = Fault {
        write: true,
        ..Fault::at(region.page_addr(page))
    };
    match region.state(page) {
        PageState::Absent | PageState::Parked(_) | PageState::Poisoned => {
            resolve(core, region, page, &how)
        }
        PageState::Resident(_) if region.is_protected(page) => {
            super::protect::lift(core, region, page, &how)
        }
        PageState::Resident(_) | PageState::Gone => Resolution::AlreadyMapped,
    }
}
