//! Store reads in flight at once are not capped by the worker count
//! (issue 42): many threads faulting over a slow store keep
//! `workers + spare_servers` reads going, as the kernel keeps one per
//! faulting thread. Before the spare servers, 2 workers and the standby
//! served at most 3 such faults at once, whatever the threads. Every page
//! read back is checked. Needs userfaultfd with `UFFDIO_MOVE` (root).

mod common;

use common::manager_with;
use faultline::{Config, MapOptions, Store, StoreError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
/// Pages apart the threads fault: each in its own fault-around window and
/// far from the others' (no read-ahead, no shared window).
const STRIDE: usize = 64;
/// How long each read takes: a slow disk or a far server.
const READ: Duration = Duration::from_millis(250);

/// How many reads are in flight, and the most there were at once.
#[derive(Debug, Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// A read-only store whose reads take [`READ`] and count themselves in
/// its [`InFlight`]; page `p` holds `p + 1` in every word.
#[derive(Debug)]
struct SlowStore(Arc<InFlight>);

impl Store for SlowStore {
    fn name(&self) -> &'static str {
        "slow (test)"
    }

    fn writable(&self) -> bool {
        false
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let now = self.0.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.0.most.fetch_max(now, Ordering::SeqCst);
        for word in buf.chunks_exact_mut(8) {
            word.copy_from_slice(&(page + 1).to_ne_bytes());
        }
        std::thread::sleep(READ);
        self.0.now.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    fn write(&self, page: u64, _buf: &[u8]) -> Result<(), StoreError> {
        common::read_only_write(page)
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// `threads` threads each fault one page of a region over a [`SlowStore`]
/// at the same moment; returns the most reads in flight at once and how
/// long the faults took together.
fn fault_at_once(config: Config, threads: usize) -> (usize, Duration) {
    let mm = manager_with(config);
    let counts = Arc::new(InFlight::default());
    let region = mm
        .map_read_only(
            threads * STRIDE * PAGE,
            SlowStore(Arc::clone(&counts)),
            MapOptions::new(),
        )
        .expect("map");
    let go = Barrier::new(threads + 1);
    let took = std::thread::scope(|s| {
        for t in 0..threads {
            let (region, go) = (&region, &go);
            s.spawn(move || {
                go.wait();
                let page = t * STRIDE;
                let got = region.load_u64(page * PAGE).expect("load");
                assert_eq!(got, page as u64 + 1, "page {page} read back wrong");
            });
        }
        go.wait();
        Instant::now()
    })
    .elapsed();
    for t in 0..threads {
        let page = t * STRIDE;
        let last = (page + 1) * PAGE - 8;
        assert_eq!(region.load_u64(last).expect("load"), page as u64 + 1);
    }
    let errors: Vec<String> = std::iter::from_fn(|| mm.take_error())
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "slow reads are not errors: {errors:?}");
    (counts.most.load(Ordering::SeqCst), took)
}

#[test]
fn eight_threads_keep_eight_reads_in_flight_with_two_workers() {
    let mut c = common::config(16 << 20);
    c.size_for_cpus(2); // 2 workers, 8 spares
                        // A lock each (the table so large that 8 windows never share one):
                        // this measures the servers alone. With the 64 locks of a 2-CPU
                        // default, these 8 windows share locks and 5 reads were in flight.
    c.experiment.fault_locks = Some(1 << 16);
    let (most, took) = fault_at_once(c, 8);
    assert_eq!(
        most, 8,
        "8 threads faulting at once over a slow store: {most} reads in flight at most (2 workers, {} spares)",
        Config::default_spare_servers(2)
    );
    // One read's time, not three rounds of them (2 workers + 1 standby).
    assert!(
        took < 3 * READ,
        "8 faults of {READ:?} each took {took:?} together"
    );
}

#[test]
fn servers_bound_the_reads_in_flight() {
    // More threads than servers: the reads in flight stop at the servers'
    // count, and every fault is still served.
    let mut c = common::config(16 << 20);
    c.workers = 1;
    c.spare_servers = 2;
    c.experiment.fault_locks = Some(1 << 16);
    let (most, _) = fault_at_once(c, 6);
    assert_eq!(most, 3, "1 worker + 2 spares: {most} reads in flight");
}
