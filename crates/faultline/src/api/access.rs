//! Copies between region memory and program buffers without ever forming a
//! `&[u8]` over region memory: every access to the region is an atomic
//! (Relaxed) load or store — aligned 8-byte words in the middle, single
//! bytes at the unaligned edges — so a concurrent writer is a race on the
//! values, never undefined behaviour. Relaxed word accesses compile to
//! plain moves on x86_64. A touch of an absent page faults it in, as any
//! access would. No locks.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Copies `buf.len()` bytes from region address `src` into `buf`.
///
/// # Safety
/// `src..src + buf.len()` lies inside a live mapping that outlives the call.
pub(super) unsafe fn copy_out(src: usize, buf: &mut [u8]) {
    let (head, words, tail) = split(src, buf.len());
    for (i, b) in buf[..head].iter_mut().enumerate() {
        // SAFETY: inside the mapping (the contract); any address is aligned
        // for a byte.
        *b = unsafe { AtomicU8::from_ptr((src + i) as *mut u8) }.load(Ordering::Relaxed);
    }
    for w in 0..words {
        let at = head + w * 8;
        // SAFETY: 8-byte aligned (`split`) and inside the mapping.
        let v = unsafe { AtomicU64::from_ptr((src + at) as *mut u64) }.load(Ordering::Relaxed);
        buf[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
    let from = head + words * 8;
    for i in 0..tail {
        // SAFETY: inside the mapping.
        buf[from + i] =
            unsafe { AtomicU8::from_ptr((src + from + i) as *mut u8) }.load(Ordering::Relaxed);
    }
}

/// Copies `buf` to region address `dst`.
///
/// # Safety
/// `dst..dst + buf.len()` lies inside a live, writable mapping that
/// outlives the call.
pub(super) unsafe fn copy_in(dst: usize, buf: &[u8]) {
    let (head, words, tail) = split(dst, buf.len());
    for (i, &b) in buf[..head].iter().enumerate() {
        // SAFETY: inside the mapping (the contract).
        unsafe { AtomicU8::from_ptr((dst + i) as *mut u8) }.store(b, Ordering::Relaxed);
    }
    for w in 0..words {
        let at = head + w * 8;
        let mut v = [0u8; 8];
        v.copy_from_slice(&buf[at..at + 8]);
        // SAFETY: 8-byte aligned (`split`) and inside the mapping.
        unsafe { AtomicU64::from_ptr((dst + at) as *mut u64) }
            .store(u64::from_ne_bytes(v), Ordering::Relaxed);
    }
    let from = head + words * 8;
    for i in 0..tail {
        // SAFETY: inside the mapping.
        unsafe { AtomicU8::from_ptr((dst + from + i) as *mut u8) }
            .store(buf[from + i], Ordering::Relaxed);
    }
}

/// Splits `len` bytes at `addr` into a head up to 8-byte alignment, whole
/// words, and a tail: `(head, words, tail)`.
fn split(addr: usize, len: usize) -> (usize, usize, usize) {
    let head = ((8 - addr % 8) % 8).min(len);
    let words = (len - head) / 8;
    (head, words, len - head - words * 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_round_trip_at_every_alignment() {
        let mut backing = vec![0u64; 64];
        let base = backing.as_mut_ptr() as usize;
        for start in 0..16 {
            for len in [0, 1, 7, 8, 9, 23, 64, 100] {
                let data: Vec<u8> = (0..len).map(|i| (i * 31 + start) as u8).collect();
                // SAFETY: inside `backing` (start + len <= 116 < 512 bytes).
                unsafe { copy_in(base + start, &data) };
                let mut out = vec![0u8; len];
                // SAFETY: as above.
                unsafe { copy_out(base + start, &mut out) };
                assert_eq!(out, data, "start {start} len {len}");
            }
        }
    }

    #[test]
    fn split_covers_the_range() {
        for addr in 0..16 {
            for len in 0..40 {
                let (h, w, t) = split(addr, len);
                assert_eq!(h + w * 8 + t, len);
                assert!(h < 8 && t < 8);
                assert!(w == 0 || (addr + h) % 8 == 0);
            }
        }
    }
}
