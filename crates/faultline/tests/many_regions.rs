//! Many regions in one manager (issue 17): 10^5 one-page regions — zero
//! store, and one in a thousand over a file — are mapped, a scattered sample
//! is written and read back, and all are dropped. Mapping them all and
//! dropping them all must each take under 2 s in a release build (20 s in a
//! debug build, which CI runs too): the region table's insert and remove are
//! O(log n), and nothing else on the map or drop path walks every region.
//! Before the table became a persistent tree (it copied the whole sorted
//! list on every map and unmap), mapping 10^5 regions took 88 s and dropping
//! them 128 s.
//!
//! Also bounds the process's resident memory per region (the metadata of a
//! mapped, untouched region) and the CPU the idle manager uses with all of
//! them mapped (< 1%). Each region is its own mapping; the kernel
//! merges neighbouring ones into one VMA when their flags agree (on Linux
//! 6.18: 75 mappings in the process with all 10^5 regions mapped), so the
//! default `vm.max_map_count` (65530) suffices; if a map fails anyway, the
//! test raises it (root; it says so if it cannot) and restores it after.
//! Needs userfaultfd with `UFFDIO_MOVE` (root).

mod common;

use common::{config, manager_with, rss, ScratchDir, MIB};
use faultline::store::{File, FileOptions, Zero};
use faultline::{MapError, MapOptions, Region};
use std::time::{Duration, Instant};

const REGIONS: usize = 100_000;
/// Every `FILE_EVERY`-th region is over the file.
const FILE_EVERY: usize = 1000;
const PAGE: usize = 4096;

/// `vm.max_map_count` raised to at least `want` while it lives (restored on
/// drop, also when the test fails).
struct MapCount {
    old: Option<usize>,
}

const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

impl MapCount {
    fn at_least(want: usize, why: &MapError) -> MapCount {
        let now: usize = std::fs::read_to_string(MAX_MAP_COUNT)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .expect("vm.max_map_count");
        if now >= want {
            return MapCount { old: None };
        }
        std::fs::write(MAX_MAP_COUNT, want.to_string()).unwrap_or_else(|e| {
            panic!(
                "a map failed ({why}) with {REGIONS} regions to map, each its own mapping: \
                 this test needs vm.max_map_count >= {want} (it is {now}) and \
                 raising it needs root: {e}"
            )
        });
        MapCount { old: Some(now) }
    }
}

impl Drop for MapCount {
    fn drop(&mut self) {
        if let Some(old) = self.old {
            let _ = std::fs::write(MAX_MAP_COUNT, old.to_string());
        }
    }
}

/// The word region `i` gets written.
fn stamp(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// The bound on map-all and drop-all: the goal is 2 s (measured 1.0-1.4 s
/// to map and 0.55-0.95 s to drop on a quiet machine); the test allows
/// twice that, since other test binaries may share the CPUs, which still
/// catches any return of the quadratic table (88 s and 128 s).
fn limit() -> Duration {
    Duration::from_secs(if cfg!(debug_assertions) { 20 } else { 4 })
}

/// Maps region `i`: zero store, or for every `FILE_EVERY`-th file page
/// `i / FILE_EVERY` (its own object range, so none overlaps another).
fn map_one(mm: &faultline::Manager, file: &std::path::Path, i: usize) -> Result<Region, MapError> {
    if i % FILE_EVERY == 0 {
        let opts = FileOptions::new()
            .offset((i / FILE_EVERY * PAGE) as u64)
            .writable(true);
        let store = File::open(file, opts).expect("open the file");
        mm.map(PAGE, store, MapOptions::new())
    } else {
        mm.map(PAGE, Zero, MapOptions::new())
    }
}

/// Maps the regions. Only if a map fails (the kernel merges neighbouring
/// regions into one VMA, so on Linux 6.18 10^5 regions are a few dozen
/// mappings, but another kernel may keep them apart) is `vm.max_map_count`
/// raised, once, and the map retried.
fn map_all(
    mm: &faultline::Manager,
    file: &std::path::Path,
    raised: &mut Option<MapCount>,
) -> Vec<Region> {
    (0..REGIONS)
        .map(|i| {
            map_one(mm, file, i)
                .or_else(|e| match raised {
                    Some(_) => Err(e),
                    None => {
                        *raised = Some(MapCount::at_least(2 * REGIONS + 65_530, &e));
                        map_one(mm, file, i)
                    }
                })
                .unwrap_or_else(|e| panic!("map region {i} of {REGIONS}: {e}"))
        })
        .collect()
}

#[test]
fn a_hundred_thousand_regions_map_and_drop_fast() {
    let mut raised = None;
    let dir = ScratchDir::new("many-regions");
    let files = REGIONS / FILE_EVERY;
    let bytes: Vec<u8> = (0..files * PAGE).map(|b| (b / PAGE % 251) as u8).collect();
    let path = dir.file("pages", &bytes);
    let mm = manager_with(config(64 * MIB));
    let before = rss();

    let t = Instant::now();
    let regions = map_all(&mm, &path, &mut raised);
    let map_time = t.elapsed();
    let per_region = rss().saturating_sub(before) / REGIONS;
    let vmas = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
    assert_eq!(mm.regions(), REGIONS);

    // A scattered sample (every 97th region and every file region): the
    // file's bytes are there, a write reads back, nothing leaks across.
    let sample = (0..REGIONS)
        .step_by(97)
        .chain((0..REGIONS).step_by(FILE_EVERY));
    for i in sample.clone() {
        let r = &regions[i];
        if i % FILE_EVERY == 0 {
            let want = (i / FILE_EVERY % 251) as u8;
            assert_eq!(common::byte(r, 100), want, "file region {i}");
        } else {
            assert_eq!(r.load_u64(8).expect("read"), 0, "zero region {i}");
        }
        r.store_u64(8, stamp(i)).expect("write");
    }
    for i in sample {
        assert_eq!(
            regions[i].load_u64(8).expect("read"),
            stamp(i),
            "region {i}"
        );
        let found = mm.region_at(regions[i].addr() + 5).expect("region_at");
        assert_eq!(found.0, regions[i].addr(), "region {i}");
    }

    // Nothing the idle manager does may visit every region: before the
    // budget kept a running sum of the regions' page tables and metadata,
    // its settling summed them over every region every 20 ms — 366 ms of
    // CPU in 3 s (12%) at 10^5 regions.
    let idle = common::idle_cpu();

    let t = Instant::now();
    drop(regions);
    let drop_time = t.elapsed();
    assert_eq!(mm.regions(), 0);
    let error = mm.take_error();
    assert!(error.is_none(), "{error:?}");
    // The file regions wrote their word back when they were dropped.
    let after = std::fs::read(&path).expect("read the file");
    for f in 0..files {
        let word = &after[f * PAGE + 8..f * PAGE + 16];
        let want = stamp(f * FILE_EVERY).to_ne_bytes();
        assert_eq!(word, want, "file page {f}");
    }

    eprintln!(
        "{REGIONS} regions: map {map_time:?}, drop {drop_time:?}, \
         {per_region} bytes resident per region, {vmas} mappings in the \
         process, idle CPU {idle:?} in 3 s"
    );
    assert!(
        idle < common::idle_cpu_bound(),
        "the idle manager with {REGIONS} regions used {idle:?} of CPU in 3 s"
    );
    assert!(
        map_time < limit(),
        "mapping {REGIONS} regions took {map_time:?}"
    );
    assert!(
        drop_time < limit(),
        "dropping {REGIONS} regions took {drop_time:?}"
    );
    // A mapped, untouched one-page region costs its `RegionInner` (~250
    // bytes: mapping, store handle, page state, read-ahead streams), the
    // guarded store handle, its handle here, its tree entry (16 bytes, at
    // least a quarter-full node) and the table writer's index entries, and
    // malloc's overhead: well under 2 KiB.
    assert!(per_region < 2048, "{per_region} bytes resident per region");
}
