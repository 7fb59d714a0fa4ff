//! Copies between region memory and program buffers without ever forming a
//! `&[u8]` over region memory: every access to the region is an atomic
//! (Relaxed) access of an aligned 8-byte word — the same size as
//! [`super::Region::atomics`] and `load_u64`/`store_u64` use, so concurrent
//! accesses through any of them are races on values, never undefined
//! behaviour (Rust forbids racing atomics of different sizes). The
//! unaligned edges of a range are read from, or merged into, their
//! enclosing words (a compare-exchange loop, so a concurrent writer of the
//! word's other bytes is not undone). The enclosing words lie inside the
//! region: it is page aligned and a whole number of pages long. Relaxed word
//! accesses compile to plain moves on x86_64. A touch of an absent page
//! faults it in, as any access would. No locks.

use std::sync::atomic::{AtomicU64, Ordering};

/// The aligned word holding address `at`.
///
/// # Safety
/// `at` lies inside a live mapping, aligned to 8 bytes and a whole number
/// of words long, that outlives `'a`.
unsafe fn word<'a>(at: usize) -> &'a AtomicU64 {
    // SAFETY: the enclosing aligned word of an address inside such a
    // mapping is inside it (the contract).
    unsafe { AtomicU64::from_ptr((at & !7) as *mut u64) }
}

/// Copies `buf.len()` bytes from region address `src` into `buf`.
///
/// # Safety
/// `src..src + buf.len()` lies inside a live mapping, page aligned and a
/// whole number of pages long, that outlives the call.
pub(super) unsafe fn copy_out(src: usize, buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        let at = src + done;
        let skip = at % 8;
        let n = (8 - skip).min(buf.len() - done);
        // SAFETY: `at` is inside the mapping (the contract).
        let v = unsafe { word(at) }.load(Ordering::Relaxed).to_ne_bytes();
        buf[done..done + n].copy_from_slice(&v[skip..skip + n]);
        done += n;
    }
}

/// Copies `buf` to region address `dst`.
///
/// # Safety
/// `dst..dst + buf.len()` lies inside a live, writable mapping, page
/// aligned and a whole number of pages long, that outlives the call.
pub(super) unsafe fn copy_in(dst: usize, buf: &[u8]) {
    let mut done = 0;
    while done < buf.len() {
        let at = dst + done;
        let skip = at % 8;
        let n = (8 - skip).min(buf.len() - done);
        // SAFETY: `at` is inside the mapping (the contract).
        let w = unsafe { word(at) };
        if n == 8 {
            let mut v = [0u8; 8];
            v.copy_from_slice(&buf[done..done + 8]);
            w.store(u64::from_ne_bytes(v), Ordering::Relaxed);
        } else {
            // Relaxed: the merge orders nothing but this word's bytes.
            let _ = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                let mut v = old.to_ne_bytes();
                v[skip..skip + n].copy_from_slice(&buf[done..done + n]);
                Some(u64::from_ne_bytes(v))
            });
        }
        done += n;
    }
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
                // SAFETY: inside `backing` (start + len <= 116 < 512 bytes),
                // which is 8-byte aligned and a whole number of words.
                unsafe { copy_in(base + start, &data) };
                let mut out = vec![0u8; len];
                // SAFETY: as above.
                unsafe { copy_out(base + start, &mut out) };
                assert_eq!(out, data, "start {start} len {len}");
            }
        }
    }

    #[test]
    fn edges_keep_the_other_bytes_of_their_words() {
        let mut backing = vec![u64::MAX; 4];
        let base = backing.as_mut_ptr() as usize;
        // SAFETY: inside `backing`.
        unsafe { copy_in(base + 3, &[0u8; 10]) };
        let mut out = [0u8; 32];
        // SAFETY: inside `backing`.
        unsafe { copy_out(base, &mut out) };
        assert!(out[..3].iter().all(|&b| b == 0xff));
        assert!(out[3..13].iter().all(|&b| b == 0));
        assert!(out[13..].iter().all(|&b| b == 0xff));
    }
}
