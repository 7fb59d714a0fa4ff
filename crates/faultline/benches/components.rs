//! Component micro-benchmarks (criterion): the frame allocator's hot paths
//! with and without per-CPU lists, bulk allocation, and a region lookup hit
//! per cache scheme. The experiments of BENCHMARKS.md are `faultline bench`;
//! these are for watching one component while changing it. The lookup bench
//! maps real regions, so it needs userfaultfd (root).
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use faultline::frame::{AllocConfig, FrameAlloc, FrameAllocator};
use faultline::store::Zero;
use faultline::{Config, LookupCache, Manager, MapOptions};

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
    let mm = match Manager::builder()
        .config(Config {
            budget: 16 << 20,
            ..Config::default()
        })
        .build()
    {
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

criterion_group!(benches, alloc, lookup);
criterion_main!(benches);
