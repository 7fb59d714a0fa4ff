//! `faultline bench far-memory` and `faultline demo --store redis://` run
//! end to end against real Redis servers: the bench starts its own server
//! and cluster, the demo uses one this test starts. Needs root (userfaultfd,
//! the memory cgroup, swap on zram) and `redis-server`; fails saying so.

mod bench_json;

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_faultline");

#[test]
fn bench_far_memory_has_every_row() {
    let v: Value = bench_json::report(
        "far-memory",
        &["--pattern", "random-read"],
        "root, a memory cgroup controller (v1 or v2), redis-server",
    );
    let rows = v["rows"].as_array().expect("rows");
    for system in [
        "faultline-file",
        "faultline-redis",
        "faultline-redis-in-thread",
        "faultline-redis-cluster",
        "redis-raw",
    ] {
        let row = rows
            .iter()
            .find(|r| r["system"] == system)
            .unwrap_or_else(|| panic!("no {system} row: {v}"));
        assert!(row["pattern"].is_string(), "{row}");
        assert!(row["ops_per_s"].as_f64().is_some_and(|x| x > 0.0), "{row}");
        if system.starts_with("faultline") {
            // Its child's CPU per op: a fault on data that is not in
            // memory enters the kernel and reads the file or a socket, so
            // at least a microsecond.
            assert!(
                row["cpu_us_per_op"].as_f64().is_some_and(|x| x >= 1.0),
                "{row}"
            );
        }
        if system.starts_with("faultline-redis") {
            // The servers the bench started answered a GET per miss (or
            // an MGET per window): on their side too a socket's receive
            // and send, a microsecond at least per op that missed — and
            // most did (misses per op, below).
            assert!(
                row["server_cpu_us_per_op"]
                    .as_f64()
                    .is_some_and(|x| x >= 0.3),
                "server_cpu_us_per_op: {row}"
            );
        } else {
            // No server beside the file row: no figure (a server's pids
            // passed to the wrong row would show here).
            assert!(
                row["server_cpu_us_per_op"].is_null(),
                "server_cpu_us_per_op of a row without a server: {row}"
            );
        }
    }
    // Misses per op: random reads over a set 4x the budget miss on most
    // ops, and an op of one word misses at most once; a kernel row counts
    // its major faults (swap-ins). Each row's cgroup peak is within its
    // limit.
    let limit_mib = v["config"]["memory_limit_bytes"].as_f64().expect("limit") / 1048576.0;
    for row in rows.iter().filter(|r| r["system"] != "redis-raw") {
        let misses = row["misses_per_op"].as_f64();
        assert!(
            misses.is_some_and(|m| (0.3..=1.0).contains(&m)),
            "misses_per_op: {row}"
        );
        let peak = row["cgroup_peak_mib"].as_f64();
        assert!(
            peak.is_some_and(|p| p > 0.0 && p <= limit_mib + 0.01),
            "cgroup_peak_mib, limit {limit_mib} MiB: {row}"
        );
    }
    // The swap rows ran, or say why not.
    let notes = v["notes"].to_string();
    for system in ["kernel-swap-zram", "kernel-swap-file"] {
        assert!(
            rows.iter().any(|r| r["system"] == system) || notes.contains(system),
            "{system}: neither a row nor a note: {v}"
        );
    }
    assert!(
        notes.contains("goal: random 4 KiB read fault over Redis"),
        "{notes}"
    );
    // The raw GET from one client and from as many at once as the rows'
    // threads, each with its latency; the fault's ratio to both.
    for (pattern, clients) in [("GET 4 KiB", 1), ("GET 4 KiB, 2 clients", 2)] {
        let row = rows
            .iter()
            .find(|r| r["system"] == "redis-raw" && r["pattern"] == pattern)
            .unwrap_or_else(|| panic!("no raw {pattern:?} row: {v}"));
        assert_eq!(row["threads"], clients, "{row}");
        assert!(row["p50_us"].as_f64().is_some_and(|x| x > 0.0), "{row}");
    }
    assert!(notes.contains("us of 2 clients at once"), "{notes}");
    if rows.iter().any(|r| r["system"] == "kernel-swap-file") {
        assert!(
            notes.contains("goal: random 4 KiB reads over Redis"),
            "{notes}"
        );
    }
}

#[test]
fn demo_runs_its_out_of_core_job_over_redis() {
    let server = redis_harness::Server::start()
        .unwrap_or_else(|e| panic!("this test needs redis-server: {e}"));
    // The demo's figure goes to the server's scratch directory (removed
    // with it), not the temporary directory's top.
    let plot = server.dir().join("demo.png");
    let out = Command::new(BIN)
        .args([
            "demo",
            "--seconds",
            "1",
            "--budget-mib",
            "16",
            "--store",
            &server.url(),
        ])
        .arg("--plot")
        .arg(&plot)
        .output()
        .expect("run faultline");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("every written page verified"),
        "demo over Redis failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&server.url()), "{text}");
    // The demo drops its pages from Redis when it is done.
    let mut c = server.connection().expect("connection");
    let keys: usize = redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE");
    assert_eq!(keys, 0);
}
