//! Far memory on a real Redis Cluster (`store::RedisCluster`): 3 masters
//! and 3 replicas started by `redis-harness` on free ports. Pages written
//! under a small budget come back after eviction, spread over every master;
//! and a master killed in the middle of a write-heavy run loses no page:
//! each write-back waited for a replica (`WAIT 1`), the replica is promoted,
//! faults go on, and every page reads back as last written.
//!
//! Needs userfaultfd, `redis-server` and `redis-cli` on PATH (fails saying
//! so without them).

mod common;

use common::{manager, MIB};
use faultline::store::{RedisCluster, RedisOptions};
use faultline::MapOptions;
use redis_harness::Cluster;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGE: usize = 4096;

fn cluster() -> Cluster {
    Cluster::start(3, 1)
        .unwrap_or_else(|e| panic!("this test needs redis-server and redis-cli: {e}"))
}

fn store(c: &Cluster, prefix: &str) -> RedisCluster {
    let urls = c.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    // Windows of 16 pages: a small region still spans many slots.
    let opts = RedisOptions::new(prefix)
        .window(16)
        .timeout(Duration::from_secs(1))
        .retry_for(Duration::from_secs(20));
    RedisCluster::connect(&nodes, opts).expect("connect to the test's cluster")
}

fn put(r: &faultline::Region, p: usize, v: u64) {
    r.write_at(p * PAGE + (p % 64) * 8, &v.to_le_bytes())
        .expect("write_at inside the region");
}

fn get(r: &faultline::Region, p: usize) -> u64 {
    let mut b = [0u8; 8];
    r.read_at(p * PAGE + (p % 64) * 8, &mut b)
        .expect("read_at inside the region");
    u64::from_le_bytes(b)
}

/// Keys each live master holds (`DBSIZE` over every node that is a master).
fn keys_per_master(c: &Cluster) -> Vec<u64> {
    c.urls()
        .iter()
        .filter_map(|u| redis::Client::open(u.as_str()).ok()?.get_connection().ok())
        .filter_map(|mut conn| {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn).ok()?;
            let master =
                matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master");
            master.then(|| redis::cmd("DBSIZE").query(&mut conn).ok())?
        })
        .collect()
}

#[test]
fn cluster_pages_round_trip_over_every_master() {
    let c = cluster();
    let mm = manager(4 * MIB);
    let pages = 16 * MIB / PAGE;
    let r = mm
        .map(pages * PAGE, store(&c, "crt"), MapOptions::new())
        .expect("map");
    for p in 0..pages {
        put(&r, p, p as u64 ^ 0xabcd);
    }
    r.flush().expect("flush");
    for p in 0..pages {
        assert_eq!(get(&r, p), p as u64 ^ 0xabcd, "page {p}");
    }
    let keys = keys_per_master(&c);
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(
        keys.iter().all(|&k| k > 0),
        "pages spread over every master: {keys:?}"
    );
    assert_eq!(keys.iter().sum::<u64>(), pages as u64, "{keys:?}");
    assert!(mm.take_error().is_none());
}

/// Writers rewrite random pages (4x the budget: most writes evict a dirty
/// page to the cluster) while a master is killed; the last value of each
/// page is kept in `oracle`.
fn write_heavy(r: &faultline::Region, oracle: &[AtomicU64], stop: &AtomicBool, seed: u64) -> u64 {
    let mut next = common::rng(seed);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        // Threads own disjoint pages (even / odd), so the oracle is exact.
        let p = (next() as usize % (oracle.len() / 2)) * 2 + seed as usize % 2;
        let v = next() | 1;
        put(r, p, v);
        oracle[p].store(v, Ordering::Relaxed);
        n += 1;
    }
    n
}

#[test]
fn a_master_killed_mid_run_loses_no_page() {
    let mut c = cluster();
    let mm = manager(4 * MIB);
    let pages = 16 * MIB / PAGE;
    let r = mm
        .map(pages * PAGE, store(&c, "fo"), MapOptions::new())
        .expect("map");
    let oracle: Vec<AtomicU64> = (0..pages).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let writes: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u64)
            .map(|seed| {
                let (r, oracle, stop) = (&r, &oracle, &stop);
                s.spawn(move || write_heavy(r, oracle, stop, seed))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        let killed = c.kill_master().expect("kill a master");
        c.wait_ok().expect("a replica takes over");
        let failed_over = t.elapsed();
        // The old master comes back as the new master's replica, so writes
        // to its slots can be acknowledged by a replica again.
        c.restart(killed).expect("restart the killed node");
        c.wait_ok().expect("the killed node rejoins");
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        println!("master on port {killed} killed; failover done at {failed_over:?}");
        hs.into_iter().map(|h| h.join().expect("writer")).sum()
    });
    r.flush().expect("flush after the failover");
    drop(r);
    // Read every page back from the cluster through a fresh region.
    let again = mm
        .map(pages * PAGE, store(&c, "fo"), MapOptions::new())
        .expect("map again");
    let lost: Vec<usize> = (0..pages)
        .filter(|&p| get(&again, p) != oracle[p].load(Ordering::Relaxed))
        .collect();
    println!("{writes} writes, {} pages lost", lost.len());
    assert!(writes > 1000, "the run wrote: {writes}");
    assert!(lost.is_empty(), "pages lost across the failover: {lost:?}");
    // Write-backs failed while the shard had no master (or no replica to
    // acknowledge them): those are the only errors, and no fault was
    // refused for want of a frame.
    let mut errors = 0;
    while let Some(e) = mm.take_error() {
        assert!(matches!(e, faultline::FaultError::Store { .. }), "{e}");
        errors += 1;
    }
    println!("{errors} write-backs failed and were retried");
}
