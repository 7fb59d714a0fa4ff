//! Placing a region at an address (`MapOptions::at`, and `at_replacing` as
//! the Umap layer's `UMAP_FIXED` uses it), and giving the range back at
//! once when a region is dropped: the address is free for a new mapping
//! when the drop returns, even though fault workers may still hold the
//! region in their lookup caches. Needs userfaultfd with `UFFDIO_MOVE`
//! (root).

mod common;

use common::{manager, MIB};
use faultline::store::Zero;
use faultline::{MapError, MapOptions, PageSize};

/// A free, 2 MiB-aligned address range of `len` bytes (reserved, then
/// given back).
fn free_range(len: usize) -> usize {
    // SAFETY: a fresh anonymous reservation that nothing else references;
    // it is unmapped before the address is used.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len + 2 * MIB,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::munmap(p, len + 2 * MIB);
        (p as usize + 2 * MIB - 1) & !(2 * MIB - 1)
    }
}

/// A `PROT_NONE` reservation of `len` bytes at a 2 MiB-aligned address,
/// made in one `mmap` (the unaligned ends trimmed off); left mapped.
fn reserve(len: usize) -> usize {
    // SAFETY: a fresh anonymous mapping (null hint) that nothing else
    // references; only its own unaligned ends are unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len + 2 * MIB,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let start = p as usize;
        let at = (start + 2 * MIB - 1) & !(2 * MIB - 1);
        if at > start {
            libc::munmap(p, at - start);
        }
        let tail = start + len + 2 * MIB - (at + len);
        if tail > 0 {
            libc::munmap((at + len) as *mut libc::c_void, tail);
        }
        at
    }
}

/// Whether anything is mapped in `[addr, addr + len)`.
fn mapped(addr: usize, len: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces; a mapping made here is
    // unmapped at once.
    unsafe {
        let p = libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return true;
        }
        libc::munmap(p, len);
        p as usize != addr
    }
}

/// One test, not three: tests in one file share the process, and another
/// test's mapping could take a range this one has just seen freed.
#[test]
fn placement() {
    let mm = manager(8 * MIB);
    a_misaligned_address_is_refused(&mm);
    a_range_in_use_is_refused_unless_replacing(&mm);
    a_region_goes_where_asked_and_its_range_is_free_after_drop(&mm);
}

fn a_region_goes_where_asked_and_its_range_is_free_after_drop(mm: &faultline::Manager) {
    let at = free_range(4 * MIB);
    let r = mm
        .map(
            4 * MIB,
            Zero,
            MapOptions::new().page_size(PageSize::Huge2M).at(at),
        )
        .expect("map at a free address");
    assert_eq!(r.addr(), at);
    r.store_u64(MIB, 7).expect("write");
    assert_eq!(r.load_u64(MIB).expect("read"), 7);
    drop(r);
    assert!(
        !mapped(at, 4 * MIB),
        "the dropped region's range is still mapped"
    );
    let again = mm
        .map(4 * MIB, Zero, MapOptions::new().at(at))
        .expect("map again at the same address");
    assert_eq!(again.load_u64(MIB).expect("read"), 0, "a fresh region");
}

fn a_range_in_use_is_refused_unless_replacing(mm: &faultline::Manager) {
    // A reservation of the program's own: refused by `at`, replaced by
    // `at_replacing`.
    // Reserved in one call (trimmed to 2 MiB alignment), not freed and
    // mapped again: another thread of this process could take the range in
    // between.
    let at = reserve(2 * MIB);
    let refused = mm.map(2 * MIB, Zero, MapOptions::new().at(at));
    assert!(
        matches!(refused, Err(MapError::AddressInUse { .. })),
        "{refused:?}"
    );
    // SAFETY: the reservation is this test's and nothing references it.
    let r = mm
        .map(2 * MIB, Zero, unsafe { MapOptions::new().at_replacing(at) })
        .expect("replace the reservation");
    r.store_u64(8, 1).expect("write");
    assert_eq!(r.addr(), at);
    // Another managed region is never replaced.
    let on_region = mm.map(2 * MIB, Zero, MapOptions::new().at(at));
    assert!(
        matches!(on_region, Err(MapError::AddressInUse { .. })),
        "{on_region:?}"
    );
    // SAFETY: the range is a managed region: refused before anything is
    // replaced.
    let replacing = mm.map(2 * MIB, Zero, unsafe { MapOptions::new().at_replacing(at) });
    assert!(
        matches!(replacing, Err(MapError::AddressInUse { .. })),
        "{replacing:?}"
    );
    assert_eq!(r.load_u64(8).expect("read"), 1, "the region is untouched");
}

fn a_misaligned_address_is_refused(mm: &faultline::Manager) {
    let at = free_range(4 * MIB) + 4096;
    let r = mm.map(
        2 * MIB,
        Zero,
        MapOptions::new().page_size(PageSize::Huge2M).at(at),
    );
    assert!(matches!(r, Err(MapError::UnalignedAddress { .. })), "{r:?}");
}
