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

/// Frames at least this large are cleared with non-temporal stores.
pub const NONTEMPORAL_MIN: usize = 64 << 10;

/// Sets every byte of `buf` to zero with the fastest routine measured here:
/// non-temporal stores for large buffers (a 2 MiB frame: 95 µs against
/// 198 µs for `rep stosb` and 204 µs for glibc's `memset` on this VM, because
/// the frame is not in cache and streaming stores skip the read-for-ownership;
/// they also leave nothing in cache, which suits a page the application will
/// touch sparsely), `rep stosb` for small ones (a 4 KiB page the application
/// is about to touch is better left in cache).
pub fn clear(buf: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if buf.len() >= NONTEMPORAL_MIN && (buf.as_ptr() as usize) % 16 == 0 && buf.len() % 16 == 0 {
        clear_nontemporal(buf);
        return;
    }
    clear_rep_stosb(buf);
}

/// Clears with SSE2 streaming stores (16 bytes each), then `sfence` so the
/// zeros are globally visible before the frame is moved.
#[cfg(target_arch = "x86_64")]
fn clear_nontemporal(buf: &mut [u8]) {
    use std::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_sfence, _mm_stream_si128};
    debug_assert!(buf.as_ptr() as usize % 16 == 0 && buf.len() % 16 == 0);
    let p = buf.as_mut_ptr().cast::<__m128i>();
    // SAFETY: SSE2 is part of the x86_64 baseline; this only makes a value.
    let zero = unsafe { _mm_setzero_si128() };
    for i in 0..buf.len() / 16 {
        // SAFETY: `p + i` lies inside `buf` (i < len / 16), is 16-byte aligned
        // (checked by the caller), and we hold `buf` exclusively. SSE2 is part
        // of the x86_64 baseline.
        unsafe { _mm_stream_si128(p.add(i), zero) };
    }
    // SAFETY: sfence only orders stores.
    unsafe { _mm_sfence() };
}

/// Clears with `rep stosb` (x86_64) or a plain fill.
pub fn clear_rep_stosb(buf: &mut [u8]) {
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
        // Large and aligned: the non-temporal path.
        let mut big = vec![u64::MAX; (NONTEMPORAL_MIN * 2) / 8 + 2];
        // SAFETY: reinterpreting a u64 buffer as bytes; u8 has no invalid values.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(big.as_mut_ptr().cast::<u8>(), big.len() * 8) };
        clear(&mut bytes[16..16 + NONTEMPORAL_MIN * 2]);
        assert_eq!(big[0], u64::MAX);
        assert_eq!(big[1], u64::MAX);
        assert!(big[2..2 + NONTEMPORAL_MIN * 2 / 8].iter().all(|&w| w == 0));
    }
}
