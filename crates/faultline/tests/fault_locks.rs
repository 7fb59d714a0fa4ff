//! Fault locks and the parallel fault service (seed 003), on real faults.
//! Needs userfaultfd (root); fails with the reason otherwise.

use faultline::store::{Delayed, Zero};
use faultline::{Config, LockMode, Manager, MapOptions, PageSize, Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{byte, MIB};

fn manager(workers: usize, locks: LockMode, budget: usize) -> Manager {
    let mut config = Config::default();
    config.budget = budget;
    config.workers = workers;
    config.experiment.fault_locks = Some((2 * workers).next_power_of_two());
    config.experiment.locks = locks;
    common::manager_with(config)
}

/// A store of zeros that counts reads per page, flags two reads of one
/// object page at once, and may sleep in each read.
#[derive(Debug)]
struct Counting {
    reads: Mutex<HashMap<u64, u64>>,
    in_flight: Mutex<HashMap<u64, u32>>,
    overlaps: AtomicU64,
    latency: Duration,
    object: Option<u64>,
}

impl Counting {
    fn new(latency: Duration, object: Option<u64>) -> Counting {
        Counting {
            reads: Mutex::default(),
            in_flight: Mutex::default(),
            overlaps: AtomicU64::new(0),
            latency,
            object,
        }
    }
}

impl Store for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }

    // Read-only: two regions over one object range may share it only so.
    fn writable(&self) -> bool {
        false
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        {
            let mut f = self.in_flight.lock().expect("lock");
            let n = f.entry(page).or_insert(0);
            *n += 1;
            if *n > 1 {
                self.overlaps.fetch_add(1, Ordering::Relaxed);
            }
        }
        *self.reads.lock().expect("lock").entry(page).or_insert(0) += 1;
        std::thread::sleep(self.latency);
        buf.fill(0);
        buf[..8].copy_from_slice(&(page + 1).to_ne_bytes());
        *self
            .in_flight
            .lock()
            .expect("lock")
            .get_mut(&page)
            .expect("in flight") -= 1;
        Ok(())
    }

    fn write(&self, _page: u64, _buf: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn identity(&self) -> Option<(u64, u64)> {
        self.object.map(|o| (o, 0))
    }
}

/// A handle on a shared [`Counting`] store, so that regions can map it
/// read-only (`map_read_only` takes the store by value) while the test keeps
/// its counters: every call goes to the shared store.
#[derive(Debug)]
struct Shared(Arc<Counting>);

impl Store for Shared {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn is_zero(&self) -> bool {
        self.0.is_zero()
    }

    fn writable(&self) -> bool {
        self.0.writable()
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.read(page, buf)
    }

    fn read_pages(&self, first: u64, page_size: usize, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.read_pages(first, page_size, buf)
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.0.write(page, buf)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.0.flush()
    }

    fn will_read(&self, first: u64, pages: usize, page_size: usize) {
        self.0.will_read(first, pages, page_size);
    }

    fn identity(&self) -> Option<(u64, u64)> {
        self.0.identity()
    }
}

/// Many threads fault the same pages and their neighbours at once: every
/// page is read from the store exactly once, and every thread sees its data.
#[test]
fn each_page_filled_exactly_once() {
    for (locks, size) in [
        (LockMode::Hashed, PageSize::Huge2M),
        (LockMode::Global, PageSize::Huge2M),
        (LockMode::Hashed, PageSize::Base4K),
    ] {
        let mm = manager(8, locks, 32 * MIB);
        let store = Arc::new(Counting::new(Duration::from_micros(500), None));
        let pages = 8;
        let r = mm
            .map_read_only(
                pages * size.bytes(),
                Shared(store.clone()),
                MapOptions::new().page_size(size),
            )
            .expect("map");
        let threads = 16;
        let barrier = Barrier::new(threads);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (r, barrier) = (&r, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..pages {
                        // Half the threads walk forwards, half backwards.
                        let p = if t % 2 == 0 { i } else { pages - 1 - i };
                        let v = r.load_u64(p * size.bytes()).expect("load_u64");
                        assert_eq!(v, p as u64 + 1, "thread {t}, page {p}");
                    }
                });
            }
        });
        let reads = store.reads.lock().expect("lock").clone();
        assert_eq!(reads.len(), pages, "{locks:?} {size:?}");
        assert!(
            reads.values().all(|&n| n == 1),
            "{locks:?} {size:?}: {reads:?}"
        );
        assert_eq!(store.overlaps.load(Ordering::Relaxed), 0);
        let st = mm.stats();
        assert!(st.locks.acquisitions >= pages as u64, "{st}");
        if let Some(e) = mm.take_error() {
            panic!("fault error (a worker faulting would show here): {e}");
        }
    }
}

/// Two regions over one object (same store identity) serialize faults on the
/// same object page: the store never sees two reads of one page at once.
#[test]
fn regions_over_one_object_share_page_locks() {
    let mm = manager(8, LockMode::Hashed, 32 * MIB);
    let store = Arc::new(Counting::new(Duration::from_millis(2), Some(0xfeed)));
    let a = mm
        .map_read_only(4 * 4096, Shared(store.clone()), MapOptions::new())
        .expect("map");
    let b = mm
        .map_read_only(4 * 4096, Shared(store.clone()), MapOptions::new())
        .expect("map");
    let barrier = Barrier::new(8);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (a, b, barrier) = (&a, &b, &barrier);
            s.spawn(move || {
                barrier.wait();
                let r = if t % 2 == 0 { a } else { b };
                for p in 0..4 {
                    let v = r.load_u64(p * 4096).expect("load_u64");
                    assert_eq!(v, p as u64 + 1);
                }
            });
        }
    });
    assert_eq!(
        store.overlaps.load(Ordering::Relaxed),
        0,
        "two reads of one object page at once"
    );
    // Each region fills its own copy of each page: 2 reads per object page.
    assert!(store.reads.lock().expect("lock").values().all(|&n| n == 2));
}

/// A fault waiting on a slow store does not hold up faults on other pages:
/// with 8 workers, 8 threads faulting 8 different slow pages take about one
/// store latency, not eight.
#[test]
fn slow_store_does_not_serialize_other_pages() {
    // Long enough that the bound (4 latencies, half of 8 in series) leaves
    // a loaded machine 600 ms for the faults' own work.
    let latency = Duration::from_millis(200);
    let mm = manager(8, LockMode::Hashed, 64 * MIB);
    // `Delayed` is never a zero store and `Zero` keeps no writes: a
    // read-only region (the test only reads).
    let r = mm
        .map_read_only(8 * 4096, Delayed::new(Zero, latency), MapOptions::new())
        .expect("map");
    let barrier = Barrier::new(8);
    let t = Instant::now();
    std::thread::scope(|s| {
        for i in 0..8 {
            let (r, barrier) = (&r, &barrier);
            s.spawn(move || {
                barrier.wait();
                byte(r, i * 4096);
            });
        }
    });
    let took = t.elapsed();
    assert!(
        took < latency * 4,
        "8 slow faults took {took:?} (one is {latency:?})"
    );
    if let Some(e) = mm.take_error() {
        panic!("fault error: {e}");
    }
}
