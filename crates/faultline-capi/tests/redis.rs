//! The far-memory C program (`tests/c/redis.c`): `fl_map_redis` over a real
//! redis-server this test starts on a free port. Needs userfaultfd, `cc`
//! and `redis-server` (fails saying so without them).

#[path = "harness/mod.rs"]
mod harness;

#[test]
fn c_program_pages_through_redis() {
    harness::require_userfaultfd();
    let server = redis_harness::Server::start()
        .unwrap_or_else(|e| panic!("this test needs redis-server: {e}"));
    let dir = harness::Scratch::new("redis");
    let exe = harness::compile("redis", "faultline", &dir.0);
    let out = harness::run(&exe, &[&server.url()], &[]);
    assert!(out.contains("blocks round-tripped"), "{out}");
}
