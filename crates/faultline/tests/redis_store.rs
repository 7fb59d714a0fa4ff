//! Far memory on a real Redis server (`store::Redis`): pages written through
//! a region under a budget far smaller than the data come back from Redis,
//! missing keys read as zeros, a server that may evict keys is refused, and
//! a server that dies: faults report the cause (or wait for it to come
//! back), dirty pages stay in memory and are written when it returns.
//!
//! Needs userfaultfd and `redis-server` on PATH (each test starts its own
//! on a free port through `redis-harness`, and fails saying so without it).

mod common;

use common::{config, kernel_read, manager, manager_with, MIB};
use faultline::store::{Redis, RedisOptions};
use faultline::MapOptions;
use redis_harness::Server;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;

fn server() -> Server {
    Server::start().unwrap_or_else(|e| panic!("this test needs redis-server: {e}"))
}

fn store(s: &Server, prefix: &str, retry_for: Duration) -> Redis {
    let opts = RedisOptions::new(prefix)
        .retry_for(retry_for)
        .timeout(Duration::from_millis(500));
    Redis::connect(&s.url(), opts).expect("connect to the test's redis-server")
}

/// The word page `p` holds after round `round`.
fn word(p: usize, round: u64) -> u64 {
    (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round
}

fn put(r: &faultline::Region, p: usize, v: u64) {
    r.write_at(p * PAGE + (p % 500) * 8, &v.to_le_bytes())
        .expect("write_at inside the region");
}

fn get(r: &faultline::Region, p: usize) -> u64 {
    let mut b = [0u8; 8];
    r.read_at(p * PAGE + (p % 500) * 8, &mut b)
        .expect("read_at inside the region");
    u64::from_le_bytes(b)
}

/// The `MSET` commands the server has run (`INFO commandstats`).
fn mset_calls(s: &Server) -> u64 {
    let mut c = s.connection().expect("connection");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_mset:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The page as Redis holds it, read directly (`None`: no key).
fn raw_page(s: &Server, prefix: &str, p: usize) -> Option<Vec<u8>> {
    let mut c = s.connection().expect("connection");
    let key = format!("{{{prefix}:{}}}:{p}", p / 256);
    redis::cmd("GET").arg(key).query(&mut c).expect("GET")
}

#[test]
fn pages_round_trip_through_redis_under_a_small_budget() {
    let s = server();
    let mm = manager(4 * MIB);
    let pages = 16 * MIB / PAGE; // 4x the budget
    let r = mm
        .map(
            pages * PAGE,
            store(&s, "rt", Duration::from_secs(2)),
            MapOptions::new(),
        )
        .expect("map");
    for p in 0..pages {
        put(&r, p, word(p, 1));
    }
    for p in (0..pages).rev() {
        assert_eq!(get(&r, p), word(p, 1), "page {p} after eviction to Redis");
    }
    let st = mm.stats();
    // Eviction writes runs of pages with one call (one round trip): a
    // sequential writer's pages leave in runs.
    println!(
        "{} pages written back in {} store calls",
        st.written_back, st.store_writes.count
    );
    assert!(st.written_back as usize >= pages / 2, "{st}");
    assert!(st.store_writes.count * 8 < st.written_back, "{st}");
    r.flush().expect("flush");
    assert!(mm.stats().written_back as usize >= pages - 4 * MIB / PAGE);
    drop(r);
    // Every page is in Redis, whole, with the word where it was written.
    for p in (0..pages).step_by(97) {
        let v = raw_page(&s, "rt", p).expect("key of a written page");
        assert_eq!(v.len(), PAGE);
        let off = (p % 500) * 8;
        let w = u64::from_le_bytes(v[off..off + 8].try_into().expect("8 bytes"));
        assert_eq!(w, word(p, 1));
    }
    // A new region over the same prefix sees them.
    let again = mm
        .map(
            pages * PAGE,
            store(&s, "rt", Duration::from_secs(2)),
            MapOptions::new(),
        )
        .expect("map again");
    for p in 0..pages {
        assert_eq!(get(&again, p), word(p, 1), "page {p} read back from Redis");
    }
    assert!(mm.take_error().is_none());
}

#[test]
fn a_random_writers_scattered_victims_leave_in_batches() {
    // Pages written in random order, one at a time (no fault-around),
    // leave no runs: reclaim batches its scattered victims, and one server
    // takes a batch as one `MSET`, whatever windows its pages are in (8
    // pages a window here: a batch spans several).
    let s = server();
    let mut c = config(4 * MIB);
    c.fault_around = 1;
    let mm = manager_with(c);
    let pages = 16 * MIB / PAGE;
    let opts = RedisOptions::new("scattered")
        .window(8)
        .timeout(Duration::from_millis(500));
    let store = Redis::connect(&s.url(), opts).expect("connect to the test's redis-server");
    let r = mm.map(pages * PAGE, store, MapOptions::new()).expect("map");
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..pages).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, x as usize % (i + 1));
    }
    for &p in &order {
        put(&r, p, word(p, 2));
    }
    let st = mm.stats();
    let msets = mset_calls(&s);
    println!(
        "{} pages written back in {} store calls, {msets} MSETs",
        st.written_back, st.store_writes.count
    );
    assert!(st.written_back as usize >= pages / 2, "{st}");
    assert!(msets * 4 < st.written_back, "{msets} MSETs: {st}");
    for &p in order.iter().rev() {
        assert_eq!(get(&r, p), word(p, 2), "page {p} after eviction to Redis");
    }
    drop(r);
    let mut c = s.connection().expect("connection");
    for p in (0..pages).step_by(89) {
        let key = format!("{{scattered:{}}}:{p}", p / 8);
        let v: Vec<u8> = redis::cmd("GET").arg(key).query(&mut c).expect("GET");
        let off = (p % 500) * 8;
        let w = u64::from_le_bytes(v[off..off + 8].try_into().expect("8 bytes"));
        assert_eq!(w, word(p, 2), "page {p} in Redis");
    }
}

#[test]
fn missing_keys_read_as_zeros() {
    let s = server();
    let mm = manager(4 * MIB);
    let r = mm
        .map(
            2 * MIB,
            store(&s, "zeros", Duration::ZERO),
            MapOptions::new(),
        )
        .expect("map");
    let mut buf = vec![1u8; 3 * PAGE];
    r.read_at(100 * PAGE, &mut buf).expect("read_at");
    assert!(buf.iter().all(|&b| b == 0));
    // Reading wrote nothing.
    r.flush().expect("flush");
    assert_eq!(raw_page(&s, "zeros", 100), None);
}

#[test]
fn a_server_that_may_evict_pages_is_refused() {
    let s = Server::start_with(&["--maxmemory-policy", "allkeys-lru"])
        .unwrap_or_else(|e| panic!("this test needs redis-server: {e}"));
    let err =
        Redis::connect(&s.url(), RedisOptions::new("evict")).expect_err("allkeys-lru refused");
    assert!(err.to_string().contains("allkeys-lru"), "{err}");
    // A policy that only evicts keys with a TTL (pages have none) is fine.
    let s = Server::start_with(&["--maxmemory-policy", "volatile-lru"])
        .unwrap_or_else(|e| panic!("this test needs redis-server: {e}"));
    Redis::connect(&s.url(), RedisOptions::new("evict")).expect("volatile-lru accepted");
}

#[test]
fn a_fault_on_a_dead_server_reports_the_cause() {
    let mut s = server();
    let mm = manager(4 * MIB);
    let r = mm
        .map(
            2 * MIB,
            store(&s, "dead", Duration::from_millis(200)),
            MapOptions::new(),
        )
        .expect("map");
    put(&r, 0, 7);
    s.kill();
    // A page not in memory: its fault cannot be served. Taken from kernel
    // mode, it is EFAULT instead of the SIGBUS a user-mode access gets.
    let t = Instant::now();
    assert_eq!(kernel_read(r.addr() + 9 * PAGE), libc::EFAULT);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let err = r.take_error().expect("the cause is queued");
    let text = err.to_string();
    assert!(text.contains("store read of page 9"), "{text}");
    // The page in memory is still there.
    assert_eq!(get(&r, 0), 7);
}

#[test]
fn a_touch_on_a_dead_server_raises_sigbus() {
    if common::in_child() {
        let mut s = server();
        let mm = manager(4 * MIB);
        let r = mm
            .map(
                2 * MIB,
                store(&s, "sigbus", Duration::from_millis(100)),
                MapOptions::new(),
            )
            .expect("map");
        s.kill();
        // SAFETY: inside the region; this access is the one that must SIGBUS.
        let v = unsafe { r.as_ptr().add(5 * PAGE).read_volatile() };
        println!("touch returned {v}: no SIGBUS");
        std::process::exit(0);
    }
    assert_eq!(
        common::child_signal("a_touch_on_a_dead_server_raises_sigbus"),
        Some(libc::SIGBUS)
    );
}

#[test]
fn a_fault_waits_for_a_server_that_comes_back() {
    let mut s = server();
    let mm = manager(4 * MIB);
    let r = mm
        .map(
            2 * MIB,
            store(&s, "back", Duration::from_secs(10)),
            MapOptions::new(),
        )
        .expect("map");
    s.kill();
    let t = Instant::now();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            s.restart().expect("restart on the same port");
        });
        // Blocks in the store's retries until the server is back.
        assert_eq!(get(&r, 3), 0);
    });
    assert!(t.elapsed() >= Duration::from_millis(400));
    assert!(r.take_error().is_none());
}

#[test]
fn dirty_pages_stay_until_the_server_returns() {
    let mut s = server();
    let mm = manager(4 * MIB);
    let pages = 200;
    let r = mm
        .map(
            2 * MIB,
            store(&s, "dirty", Duration::from_millis(200)),
            MapOptions::new(),
        )
        .expect("map");
    for p in 0..pages {
        put(&r, p, word(p, 2));
    }
    s.kill();
    let err = r.flush().expect_err("no server to write to");
    assert!(err.to_string().contains("store write"), "{err}");
    // Nothing was lost: the pages are in memory, still dirty.
    assert!((0..pages).all(|p| get(&r, p) == word(p, 2)));
    s.restart().expect("restart on the same port");
    r.flush().expect("flush once the server is back");
    for p in 0..pages {
        let v = raw_page(&s, "dirty", p).expect("written when the server came back");
        let off = (p % 500) * 8;
        assert_eq!(
            u64::from_le_bytes(v[off..off + 8].try_into().expect("8 bytes")),
            word(p, 2)
        );
    }
}
