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

/// A page's bytes: every byte says which page it is.
fn page_bytes(p: u64) -> Vec<u8> {
    (0..PAGE as u64)
        .map(|i| (p.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8)
        .collect()
}

#[test]
fn runs_read_exact_bytes_across_windows_holes_and_wrong_values() {
    use faultline::store::Store;
    let s = server();
    // A 4-page window: a 10-page run crosses three windows (three MGETs).
    let opts = RedisOptions::new("runs")
        .window(4)
        .retry_for(Duration::from_secs(5))
        .timeout(Duration::from_millis(500));
    let st = Redis::connect(&s.url(), opts).expect("connect");
    let mut c = s.connection().expect("connection");
    let key = |p: u64| format!("{{runs:{}}}:{p}", p / 4);
    // Pages 2..12 present but 5 and 9 (no key: zeros).
    for p in (2..12u64).filter(|p| *p != 5 && *p != 9) {
        let _: () = redis::cmd("SET")
            .arg(key(p))
            .arg(page_bytes(p))
            .query(&mut c)
            .expect("SET");
    }
    let mut buf = vec![0xAAu8; 10 * PAGE];
    st.read_pages(2, PAGE, &mut buf).expect("a run of pages");
    for (i, got) in buf.chunks(PAGE).enumerate() {
        let p = 2 + i as u64;
        if p == 5 || p == 9 {
            assert!(got.iter().all(|&b| b == 0), "page {p}: no key reads zeros");
        } else {
            assert!(got == page_bytes(p).as_slice(), "page {p}'s bytes");
        }
    }
    // One page (GET), present and absent.
    let mut one = vec![0xAAu8; PAGE];
    st.read(7, &mut one).expect("one page");
    assert!(one == page_bytes(7));
    st.read(9, &mut one).expect("a page with no key");
    assert!(one.iter().all(|&b| b == 0));

    // A value of another size is an error naming the page, alone and
    // inside a run, and never data; the store goes on reading after it.
    let _: () = redis::cmd("SET")
        .arg(key(20))
        .arg(&b"short"[..])
        .query(&mut c)
        .expect("SET");
    let t = Instant::now();
    let err = st.read(20, &mut one).expect_err("a 5-byte page");
    assert!(err.to_string().contains("page 20 holds 5 bytes"), "{err}");
    let mut run = vec![0u8; 4 * PAGE];
    let err = st
        .read_pages(20, PAGE, &mut run)
        .expect_err("a run with it");
    assert!(err.to_string().contains("page 20 holds 5 bytes"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a wrong value is not retried: {:?}",
        t.elapsed()
    );
    st.read(7, &mut one).expect("the next read");
    assert!(one == page_bytes(7), "the reply after an error is in step");

    // A key holding another type: the server's error, not zeros.
    let _: () = redis::cmd("RPUSH")
        .arg(key(30))
        .arg("x")
        .query(&mut c)
        .expect("RPUSH");
    let t = Instant::now();
    let err = st.read(30, &mut one).expect_err("a list is not a page");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "WRONGTYPE is not retried: {:?}",
        t.elapsed()
    );
    st.read(7, &mut one).expect("the next read");
    assert!(one == page_bytes(7));
}

#[test]
fn a_password_and_a_database_reach_the_same_pages() {
    let s = server();
    let mut c = s.connection().expect("connection");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query(&mut c)
        .expect("CONFIG SET requirepass");
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", s.port());
    let opts = RedisOptions::new("authdb").timeout(Duration::from_millis(500));
    let mm = manager(4 * MIB);
    let pages = 8 * MIB / PAGE; // 2x the budget
    let r = mm
        .map(
            pages * PAGE,
            Redis::connect(&url, opts).expect("connect with the password"),
            MapOptions::new(),
        )
        .expect("map");
    // More than the budget: pages leave for db 3 and come back from it.
    for p in 0..pages {
        put(&r, p, word(p, 5));
    }
    for p in 0..pages {
        assert_eq!(get(&r, p), word(p, 5), "page {p}");
    }
    assert!(mm.stats().fills_store > 0, "pages came back from Redis");
    r.flush().expect("flush");
    // The pages are in database 3, none in 0.
    let mut admin = redis::Client::open(url.as_str())
        .expect("url")
        .get_connection()
        .expect("connection to db 3");
    let n: u64 = redis::cmd("DBSIZE").query(&mut admin).expect("DBSIZE");
    assert_eq!(n, pages as u64);
    let _: () = redis::cmd("SELECT")
        .arg(0)
        .query(&mut admin)
        .expect("SELECT");
    let n: u64 = redis::cmd("DBSIZE").query(&mut admin).expect("DBSIZE");
    assert_eq!(n, 0);
    // A wrong password is refused at connect, saying so.
    let bad = format!("redis://:nope@127.0.0.1:{}/3", s.port());
    let err = Redis::connect(&bad, RedisOptions::new("authdb").retry_for(Duration::ZERO))
        .expect_err("a wrong password");
    let text = err.to_string().to_lowercase();
    assert!(text.contains("auth") || text.contains("password"), "{text}");
}

/// Threads each own a block of a region 4x the budget and, op after op,
/// write a page's word, read one back against their oracle, or scan a run
/// of their pages (read-ahead: `MGET`s); then the region is flushed and a
/// second region on the same keys reads every word back. Both fault modes.
fn random_ops_keep_every_word(mode: faultline::FaultMode) {
    const PAGES: usize = 4096; // 16 MiB
    const THREADS: usize = 4;
    let s = server();
    let mut c = config(4 * MIB);
    c.fault_mode = mode;
    let mm = manager_with(c);
    let prefix = format!("ops{mode:?}");
    let r = mm
        .map(
            PAGES * PAGE,
            store(&s, &prefix, Duration::from_secs(5)),
            MapOptions::new(),
        )
        .expect("map");
    let block = PAGES / THREADS;
    let oracles: Vec<Vec<u64>> = std::thread::scope(|t| {
        let handles: Vec<_> = (0..THREADS)
            .map(|me| {
                let r = &r;
                t.spawn(move || {
                    let mut next = common::rng(11 + me as u64);
                    let mut last = vec![0u64; block];
                    let deadline = Instant::now() + Duration::from_secs(3);
                    let mut round = 0u64;
                    while Instant::now() < deadline {
                        round += 1;
                        let i = next() as usize % block;
                        let p = me * block + i;
                        match next() % 8 {
                            0..=3 => {
                                put(r, p, word(p, round));
                                last[i] = word(p, round);
                            }
                            4..=6 => assert_eq!(get(r, p), last[i], "page {p}"),
                            _ => {
                                let end = (i + 64).min(block);
                                for (j, &w) in last.iter().enumerate().take(end).skip(i) {
                                    let q = me * block + j;
                                    assert_eq!(get(r, q), w, "page {q}");
                                }
                            }
                        }
                    }
                    last
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a thread's words"))
            .collect()
    });
    let st = mm.stats();
    assert!(st.fills_store > 1000 && st.written_back > 1000, "{st}");
    r.flush().expect("flush");
    drop(r);
    let again = mm
        .map(
            PAGES * PAGE,
            store(&s, &prefix, Duration::from_secs(5)),
            MapOptions::new(),
        )
        .expect("map again");
    for (me, last) in oracles.iter().enumerate() {
        for (i, &w) in last.iter().enumerate() {
            let p = me * block + i;
            assert_eq!(get(&again, p), w, "page {p} read back");
        }
    }
}

#[test]
fn random_ops_over_redis_keep_every_word_with_workers() {
    random_ops_keep_every_word(faultline::FaultMode::Workers);
}

#[test]
fn random_ops_over_redis_keep_every_word_in_thread() {
    random_ops_keep_every_word(faultline::FaultMode::InThread);
}
