//! Memory operations on whole buffers, with the fastest routine measured on
//! this machine: clearing (`rep stosb`, or SSE2 streaming stores for large
//! buffers) and copying (`memcpy`, or streaming stores for large copies).
//!
//! Clearing uses `rep stosb` on x86_64: glibc's `memset` picks a slower path
//! on this VM, which hides the fast-string CPUID flags (docs/measurements.md, "Clearing a
//! 2 MiB frame"). Leaf module: no locks, no state; the caller holds the
//! buffers exclusively.

use faultline_sys::PAGE_SIZE;

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
pub(crate) fn clear_rep_stosb(buf: &mut [u8]) {
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

/// Copies `src` to `dst` as one large copy: SSE2 streaming stores for 64 KiB
/// and more (the destination is not what this thread touches next), else
/// `memcpy`.
pub fn copy_large(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= 64 << 10
        && dst.len() == src.len()
        && dst.len() % 64 == 0
        && (dst.as_ptr() as usize) % 16 == 0
        && (src.as_ptr() as usize) % 16 == 0
    {
        copy_nontemporal(dst, src);
        return;
    }
    dst.copy_from_slice(src);
}

/// The pre-seed baseline: one `memcpy` call per 4 KiB page.
pub fn copy_per_page(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.chunks_mut(PAGE_SIZE).zip(src.chunks(PAGE_SIZE)) {
        d.copy_from_slice(s);
    }
}

#[cfg(target_arch = "x86_64")]
fn copy_nontemporal(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_sfence, _mm_stream_si128};
    debug_assert!(dst.len() == src.len() && dst.len() % 64 == 0);
    let d = dst.as_mut_ptr().cast::<__m128i>();
    let s = src.as_ptr().cast::<__m128i>();
    let mut i = 0;
    while i < dst.len() / 16 {
        // SAFETY: `i..i + 4` lies inside both slices (lengths are equal
        // multiples of 64 and i steps by 4 vectors), both are 16-byte aligned
        // (checked by the caller), `dst` is held exclusively, and SSE2 is
        // part of the x86_64 baseline.
        unsafe {
            let a = _mm_load_si128(s.add(i));
            let b = _mm_load_si128(s.add(i + 1));
            let c = _mm_load_si128(s.add(i + 2));
            let e = _mm_load_si128(s.add(i + 3));
            _mm_stream_si128(d.add(i), a);
            _mm_stream_si128(d.add(i + 1), b);
            _mm_stream_si128(d.add(i + 2), c);
            _mm_stream_si128(d.add(i + 3), e);
        }
        i += 4;
    }
    // SAFETY: sfence only orders stores: the streamed bytes are globally
    // visible before the frame is moved or the piece reported done.
    unsafe { _mm_sfence() };
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

    #[test]
    fn copies_match() {
        let src: Vec<u8> = (0..(256 << 10)).map(|i| (i * 7 + 3) as u8).collect();
        let mut a = vec![0u8; src.len()];
        let mut b = vec![0u8; src.len()];
        copy_large(&mut a, &src);
        copy_per_page(&mut b, &src);
        assert_eq!(a, src);
        assert_eq!(b, src);
    }

    #[test]
    fn copies_are_exact() {
        let src: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7 + 3) as u8).collect();
        // 16-byte aligned buffers: Vec<u128> storage.
        let mut a = vec![0u128; (1 << 20) / 16];
        let mut s = vec![0u128; (1 << 20) / 16];
        // SAFETY: u128 storage viewed as bytes, same length, exclusive.
        let (dst, srcb) = unsafe {
            (
                std::slice::from_raw_parts_mut(a.as_mut_ptr().cast::<u8>(), 1 << 20),
                std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), 1 << 20),
            )
        };
        srcb.copy_from_slice(&src);
        copy_large(dst, srcb);
        assert!(dst == &src[..]);
        dst.fill(0);
        copy_per_page(dst, srcb);
        assert!(dst == &src[..]);
        // Small and unaligned: the memcpy path.
        let mut small = [0u8; 100];
        copy_large(&mut small, &src[1..101]);
        assert_eq!(&small[..], &src[1..101]);
    }
}
