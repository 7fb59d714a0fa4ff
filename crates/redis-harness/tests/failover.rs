//! The harness itself: a cluster forms, and after a master is killed its
//! replica takes over and the cluster is ok again. Needs `redis-server`
//! and `redis-cli` (fails saying so without them).

use redis_harness::Cluster;

#[test]
fn a_killed_master_is_replaced() {
    let mut c =
        Cluster::start(3, 1).unwrap_or_else(|e| panic!("needs redis-server and redis-cli: {e}"));
    let port = c.kill_master().expect("kill");
    let t = std::time::Instant::now();
    c.wait_ok().expect("failover");
    println!("failover after killing {port}: {:?}", t.elapsed());
    c.restart(port).expect("restart");
    c.wait_ok().expect("rejoined");
    println!("rejoined: {:?}", t.elapsed());
}
