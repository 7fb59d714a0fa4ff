//! Page fill: giving an in-flight frame its content before it is moved into a
//! region — zeros for anonymous memory, the store's bytes otherwise.
//!
//! Clearing uses `rep stosb` on x86_64: glibc's `memset` picks a slower path
//! on this VM, which hides the fast-string CPUID flags (DESIGN.md, "Measured
//! on this kernel"). A frame the pool knows to be zero is not cleared again.
//!
//! Invariant: after [`fill`] returns `Ok`, the frame holds exactly the page's
//! content, and the pool's zero bit for it is clear (it is about to be
//! mapped and written). No locks: the caller owns the frame.

use crate::frame::{Frame, Pool};
use crate::store::{Store, StoreError};

/// Where a filled frame's content came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillSource {
    /// Cleared now.
    Cleared,
    /// Already zero (fresh pool memory or a pre-zeroed frame).
    Prezeroed,
    /// Read from the region's store.
    Store,
}

/// Sets every byte of `buf` to zero with the fastest routine measured here.
pub fn clear(buf: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rep stosb` writes exactly rcx = buf.len() bytes of al = 0
        // starting at rdi = buf.as_mut_ptr(), all inside `buf`, which we hold
        // exclusively; the direction flag is clear per the ABI.
        unsafe {
            std::arch::asm!(
                "rep stosb",
                inout("rcx") buf.len() => _,
                inout("rdi") buf.as_mut_ptr() => _,
                in("al") 0u8,
                options(nostack, preserves_flags)
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    buf.fill(0);
}

/// Fills `frame` with the content of page `page` of a region backed by
/// `store`.
///
/// # Safety
/// `frame` is in flight and from `pool`, as [`Pool::bytes_mut`] requires.
pub unsafe fn fill(
    pool: &Pool,
    frame: &mut Frame,
    store: &dyn Store,
    page: u64,
) -> Result<FillSource, StoreError> {
    let zeroed = pool.is_zeroed(frame);
    // SAFETY: the frame is in flight and from this pool (our contract).
    let bytes = unsafe { pool.bytes_mut(frame) };
    let source = if store.is_zero() {
        if zeroed {
            FillSource::Prezeroed
        } else {
            clear(bytes);
            FillSource::Cleared
        }
    } else {
        store.read(page, bytes)?;
        FillSource::Store
    };
    pool.set_zeroed(frame, false);
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clear_clears_exactly() {
        let mut v = vec![0xffu8; 10_000];
        clear(&mut v[3..9_001]);
        assert!(v[..3].iter().all(|&b| b == 0xff));
        assert!(v[3..9_001].iter().all(|&b| b == 0));
        assert!(v[9_001..].iter().all(|&b| b == 0xff));
        clear(&mut []);
    }
}
