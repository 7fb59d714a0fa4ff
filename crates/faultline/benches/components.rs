//! Component micro-benchmarks (criterion): the frame allocator's hot paths
//! with and without per-CPU lists, bulk allocation, a region lookup hit
//! per cache scheme, migration's 2 MiB copy per method, and the page
//! fingerprint of dirty tracking. The experiments (README, "Benchmarks") are `faultline bench`;
//! these are for watching one component while changing it. The lookup bench
//! maps real regions, so it needs userfaultfd (root).
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use faultline::internals::{AllocConfig, FrameAlloc, FrameAllocator};
use faultline::store::Zero;
use faultline::{LookupCache, Manager, MapOptions};

fn alloc(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc");
    for pcp in [false, true] {
        let a = FrameAlloc::new(
            1 << 16,
            AllocConfig {
                pcp,
                batch: 128,
                high: 1024,
                cpus: 2,
            },
        );
        let name = if pcp {
            "alloc+free/pcp"
        } else {
            "alloc+free/global"
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                if let Some(f) = a.alloc_on(0, 0) {
                    a.free_on(0, black_box(f));
                }
            })
        });
    }
    let a = FrameAlloc::new(
        1 << 16,
        AllocConfig {
            pcp: true,
            batch: 128,
            high: 1024,
            cpus: 2,
        },
    );
    let mut v = Vec::with_capacity(64);
    g.bench_function("bulk64", |b| {
        b.iter(|| {
            a.alloc_bulk(0, 64, &mut v);
            a.free_bulk(&mut v);
        })
    });
    g.finish();
}

fn lookup(c: &mut Criterion) {
    let mm = match Manager::builder().budget(16 << 20).build() {
        Ok(mm) => mm,
        Err(e) => panic!("the lookup bench needs userfaultfd: {e}"),
    };
    let regions: Vec<_> = (0..1000)
        .filter_map(|_| mm.map(64 << 10, Zero, MapOptions::new()).ok())
        .collect();
    let addr = regions[500].addr() + 100;
    let mut g = c.benchmark_group("lookup-hit");
    for cache in LookupCache::ALL {
        mm.set_lookup_cache(cache);
        g.bench_function(cache.name(), |b| b.iter(|| mm.region_at(black_box(addr))));
    }
    g.finish();
}

/// The 2 MiB copy of migration: the per-4 KiB loop (the baseline), one
/// `memcpy`, and streaming stores, over THP-backed buffers larger than the
/// caches (each iteration a different 2 MiB pair).
fn copy(c: &mut Criterion) {
    use faultline_sys::mem::{Advice, Mapping};
    const SPAN: usize = 64 << 20;
    const HUGE: usize = 2 << 20;
    let map = |fill: u8| {
        let m = Mapping::anonymous(SPAN, HUGE).expect("mmap");
        let _ = m.advise(m.addr(), SPAN, Advice::HugePage);
        // SAFETY: our own fresh mapping, written through this slice only.
        unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), SPAN) }.fill(fill);
        m
    };
    let (src, dst) = (map(7), map(0));
    // SAFETY: two distinct live mappings of SPAN bytes, used only here.
    let (s, d) = unsafe {
        (
            std::slice::from_raw_parts(src.as_ptr(), SPAN),
            std::slice::from_raw_parts_mut(dst.as_ptr(), SPAN),
        )
    };
    let mut g = c.benchmark_group("copy-2m");
    g.throughput(criterion::Throughput::Bytes(HUGE as u64));
    type CopyFn = fn(&mut [u8], &[u8]);
    let kinds: [(&str, CopyFn); 3] = [
        ("per-page", faultline::internals::copy_per_page),
        ("memcpy", |d, s| d.copy_from_slice(s)),
        ("nontemporal", faultline::internals::copy_large),
    ];
    for (name, f) in kinds {
        let mut at = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                f(&mut d[at..at + HUGE], &s[at..at + HUGE]);
                at = (at + HUGE) % SPAN;
            })
        });
    }
    g.finish();
}

/// Dirty tracking's cost: the fingerprint of one page (taken at each store
/// fill, checked at each eviction and flush).
fn fingerprint(c: &mut Criterion) {
    let mut g = c.benchmark_group("fingerprint");
    for (name, len) in [("4k", 4096usize), ("2m", 2 << 20)] {
        let page: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
        g.throughput(criterion::Throughput::Bytes(len as u64));
        g.bench_function(name, |b| {
            b.iter(|| faultline::internals::fingerprint(black_box(&page)))
        });
    }
    g.finish();
}

criterion_group!(benches, alloc, lookup, copy, fingerprint);
criterion_main!(benches);
