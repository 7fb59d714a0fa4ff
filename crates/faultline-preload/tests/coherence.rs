//! The coherence oracle: an unmodified C program (`tests/c/coherence.c`)
//! whose threads write pages of a file with `write`/`pwrite`/`pwritev` and
//! (writable mode) stores through a shared mapping, and read them back
//! through the mapping and `pread`, while the preload pages the mapping
//! through a budget an eighth of the file (2 MiB of 16). After each write of its own a
//! thread must read it both ways; every word must name its page. At the
//! end the file, read here without the preload, must hold every page's
//! last version (the program's ledger). Run in both modes: a read-only
//! mapping (writes land in the file, the mapping drops its copies) and a
//! writable one (writes reach the mapping first; reads write it back).
//! And a private writable mapping (`tests/c/private.c`): its writes survive
//! eviction and `mremap`, `MADV_DONTNEED` drops them, the file never
//! changes. And anonymous memory (`tests/c/anonymous.c`, served with
//! `FAULTLINE_ANON_MIN`), paged to an overlay file and to a real Redis
//! server, whose keys are gone when the program is.

mod common;

use common::{compile_c, need_root, preload, run, Scratch};
use std::process::Command;
use std::time::Duration;

const PAGE: usize = 4096;

fn oracle(mode: &str) {
    need_root();
    let dir = Scratch::new(&format!("coherence-{mode}"));
    let exe = compile_c(&dir, "coherence");
    let (pages, threads, ops) = (4096usize, 4, 5000);
    let file = dir.join("pages.bin");
    std::fs::write(&file, b"").expect("creating the file");
    let ledger = dir.join("ledger");
    let mut cmd = Command::new(&exe);
    cmd.arg(&file)
        .arg(pages.to_string())
        .arg(threads.to_string())
        .arg(ops.to_string())
        .arg(mode)
        .arg(&ledger);
    preload(&mut cmd, &file.display().to_string(), "2M");
    let ran = run(
        &format!("coherence {mode}"),
        &mut cmd,
        Duration::from_secs(240),
    );
    ran.expect_success(&format!("the coherence oracle ({mode})"));
    let report = ran.report("coherence");
    assert_eq!(report.regions, 1, "the file was not served: {}", ran.stderr);
    assert!(report.evicted > 0, "the budget never pressed: {report:?}");
    if mode == "rw" {
        assert!(report.written_back > 0, "nothing written back: {report:?}");
    }
    let data = std::fs::read(&file).expect("reading the file back");
    let versions = std::fs::read(&ledger).expect("reading the ledger");
    assert_eq!(data.len(), pages * PAGE, "the file's size changed");
    let mut wrong = Vec::new();
    for p in 0..pages {
        let v = u32::from_le_bytes(versions[4 * p..4 * p + 4].try_into().expect("4 bytes"));
        let want = ((p as u64) << 32) | u64::from(v);
        let page = &data[p * PAGE..(p + 1) * PAGE];
        if let Some(w) = page
            .chunks_exact(8)
            .position(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")) != want)
        {
            wrong.push((p, w));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} pages of the file differ from the program's last writes (page, first wrong word): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
}

#[test]
fn writes_reach_a_read_only_mapping_and_the_file() {
    oracle("ro");
}

#[test]
fn writes_reach_a_writable_mapping_and_the_file() {
    oracle("rw");
}

#[test]
fn private_writes_survive_eviction_and_never_reach_the_file() {
    need_root();
    let dir = Scratch::new("private");
    let exe = compile_c(&dir, "private");
    let pages = 4096usize;
    let file = dir.join("data.bin");
    let mut next = common::rng(41);
    let data: Vec<u8> = (0..pages * PAGE / 8)
        .flat_map(|_| next().to_le_bytes())
        .collect();
    std::fs::write(&file, &data).expect("writing the file");
    let mut cmd = Command::new(&exe);
    cmd.arg(&file).arg(pages.to_string());
    preload(&mut cmd, &file.display().to_string(), "2M");
    let ran = run("private", &mut cmd, Duration::from_secs(240));
    ran.expect_success("the private-mapping oracle");
    assert!(
        ran.stdout_text().contains("private ok"),
        "{}",
        ran.stdout_text()
    );
    let report = ran.report("private");
    assert_eq!(
        report.regions, 2,
        "the mapping and its mremap were not served: {}",
        ran.stderr
    );
    assert!(report.evicted > 0, "the budget never pressed: {report:?}");
    let after = std::fs::read(&file).expect("reading the file back");
    assert!(
        after == data,
        "a private mapping's writes reached the file: {}",
        common::first_difference(&data, &after)
    );
}

/// Runs the anonymous-memory oracle over 32 MiB through 8 MiB, its pages
/// going to `store` (`None`: the overlay file); returns its report.
fn anonymous(tag: &str, store: Option<&str>) -> common::Report {
    need_root();
    let dir = Scratch::new(tag);
    let exe = compile_c(&dir, "anonymous");
    let mut cmd = Command::new(&exe);
    cmd.arg("32")
        .env("LD_PRELOAD", common::preload_so())
        .env("FAULTLINE_BUDGET", "8M")
        .env("FAULTLINE_ANON_MIN", "1M")
        .env("FAULTLINE_PRIVATE_DIR", dir.path())
        .env("FAULTLINE_PRELOAD_REPORT", "1")
        .env_remove("FAULTLINE_FILES");
    match store {
        Some(url) => cmd.env("FAULTLINE_STORE", url),
        None => cmd.env_remove("FAULTLINE_STORE"),
    };
    let ran = run(tag, &mut cmd, Duration::from_secs(240));
    ran.expect_success("the anonymous-memory oracle");
    assert!(
        ran.stdout_text().contains("anonymous ok"),
        "{}",
        ran.stdout_text()
    );
    let report = ran.report(tag);
    assert_eq!(
        report.regions, 2,
        "the mapping and its mremap were not served: {}",
        ran.stderr
    );
    assert!(
        report.evicted > 0 && report.written_back > 0,
        "nothing paged out: {report:?}"
    );
    report
}

#[test]
fn anonymous_memory_pages_to_an_overlay_file() {
    anonymous("anonymous-overlay", None);
}

#[test]
fn anonymous_memory_pages_to_redis_and_leaves_no_keys() {
    let server = redis_harness::Server::start().expect("a redis-server of the test's own");
    anonymous("anonymous-redis", Some(&server.url()));
    let mut c = server
        .connection()
        .expect("connecting to the test's redis-server");
    let keys: usize = redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE");
    assert_eq!(keys, 0, "the program's pages were left in Redis");
}
