//! Every argument a user can pass, at its edges, in a debug build (where
//! overflow and `debug_assert!` panic): each call returns `Ok` or an `Err`
//! naming the argument, never panics (issue 14, row 15). Properties over
//! random values biased to the edges (0, 1, page sizes, near `usize::MAX`
//! and `u64::MAX`). Needs userfaultfd with `UFFDIO_MOVE` (root).

mod common;

use common::{manager, ScratchDir};
use faultline::store::{File, FileOptions, Zero};
use faultline::{Config, ManagerBuilder, MapOptions, PageSize};
use proptest::prelude::*;

/// Edge-biased sizes and offsets.
fn edgy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        Just(7),
        Just(8),
        Just(4095),
        Just(4096),
        Just(4097),
        Just(2 << 20),
        Just((2 << 20) + 1),
        Just(usize::MAX),
        Just(usize::MAX - 4095),
        Just(isize::MAX as usize),
        0usize..(16 << 20),
        any::<usize>(),
    ]
}

fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(4096),
        Just(u64::MAX),
        Just(u64::MAX - 4095),
        Just(i64::MAX as u64),
        any::<u64>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Map lengths and page sizes: mapped, or refused with a `MapError`.
    #[test]
    fn map_lengths(len in edgy(), huge in any::<bool>()) {
        let mm = manager(8 << 20);
        let page = if huge { PageSize::Huge2M } else { PageSize::Base4K };
        match mm.map(len, Zero, MapOptions::new().page_size(page)) {
            Ok(r) => prop_assert_eq!(r.len(), len),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// Offsets and lengths of every region call that takes them.
    #[test]
    fn region_offsets(off in edgy(), len in edgy(), end in edgy(), pool in edgy()) {
        let mm = manager(8 << 20);
        let r = mm.map(4 << 20, Zero, MapOptions::new()).expect("map");
        let mut buf = vec![0u8; len.min(1 << 16)];
        let inside = off.checked_add(buf.len()).is_some_and(|e| e <= r.len());
        prop_assert_eq!(r.read_at(off, &mut buf).is_ok(), inside);
        prop_assert_eq!(r.write_at(off, &buf).is_ok(), inside);
        let word = off % 8 == 0 && off.checked_add(8).is_some_and(|e| e <= r.len());
        prop_assert_eq!(r.load_u64(off).is_ok(), word);
        prop_assert_eq!(r.store_u64(off, 1).is_ok(), word);
        let _ = r.prefetch(off..end);
        let _ = r.migrate(off..end, pool);
        let _ = r.collapse(off..end);
        let _ = r.pool_of(off);
        let _ = r.is_resident(off);
        let _ = r.is_resident(r.addr().wrapping_add(off));
        let _ = mm.region_at(off);
        let _ = mm.pool_bytes(pool);
    }

    /// File stores at any offset: mapped, or refused when offset + length
    /// overflows (never wrapping to the file's first bytes).
    #[test]
    fn file_offsets(offset in edgy_u64(), pages in 1usize..64) {
        let dir = ScratchDir::new("inputs-file");
        let path = dir.path().join("f");
        std::fs::write(&path, vec![5u8; 4096]).expect("file");
        let mm = manager(8 << 20);
        let store = File::open(&path, FileOptions::new().offset(offset).writable(true)).expect("open");
        let len = pages * 4096;
        match mm.map(len, store, MapOptions::new()) {
            Ok(r) => {
                prop_assert!(offset.checked_add(len as u64).is_some_and(|e| e <= i64::MAX as u64));
                let mut b = [1u8; 1];
                r.read_at(len - 1, &mut b).expect("read_at");
                let want = if offset == 0 && len <= 4096 { 5 } else { 0 };
                prop_assert_eq!(b[0], want, "past the end of the file: zeros");
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// Configurations: built, or refused with a `ConfigError` naming the
    /// field.
    #[test]
    fn configs(budget in edgy(), workers in edgy(), around in edgy(), ra in edgy(),
               low in 0usize..200, high in 0usize..200, zone in 0usize..200) {
        let mut c = Config::default();
        c.budget = budget;
        c.workers = workers.min(4096);
        c.fault_around = around;
        c.readahead_max = ra;
        c.reclaim_low_pct = low;
        c.reclaim_high_pct = high;
        c.small_zone_pct = zone;
        // A valid budget is kept small so the test does not populate GiBs.
        if c.validate().is_ok() {
            c.budget = c.budget.min(8 << 20);
            c.workers = c.workers.min(4);
        }
        let _ = ManagerBuilder::from_config(c).build();
    }
}
