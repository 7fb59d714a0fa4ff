//! The store's own limit for `bench far-memory`: the raw Redis round trip
//! from this process, in the same run as the rows. `GET` of one 4 KiB key
//! (what a random fault needs) from one client, and from as many clients at
//! once as the rows have program threads (each on its own connection: the
//! concurrency the faults see), and `MGET` of 256 keys (a read-ahead
//! window) from one client, each timed one by one over random keys of a set
//! written first; the keys are deleted after. Median and p99 per operation,
//! and pages/s from the mean.
//!
//! Why both `GET` rows: one client and the server ping-pong, and the
//! scheduler tends to run them on one CPU, where a round trip costs a
//! context switch each way; two clients (and a fault served beside other
//! threads) keep the server on another CPU, and on a virtual machine whose
//! idle vCPUs halt each wake-up across CPUs costs the host's wake of a vCPU
//! (docs/measurements.md, "A Redis round trip across vCPUs").

use crate::report::Summary;
use anyhow::Context;

/// One raw row: the operation, its clients, its latency (µs) and pages per
/// second.
pub struct RawRow {
    pub op: String,
    pub clients: usize,
    pub pages_per_op: usize,
    pub us: Summary,
    pub pages_per_s: f64,
}

const KEYS: usize = 4096;
const RUN: usize = 256;

fn key(i: usize) -> String {
    format!("{{raw{}:{}}}:{i}", std::process::id(), i / RUN)
}

/// Runs `n` calls of `op` (returning the pages it read) one by one and
/// returns each call's µs, the pages read and the seconds taken.
fn time(
    n: usize,
    mut op: impl FnMut(usize) -> anyhow::Result<usize>,
) -> anyhow::Result<(Vec<f64>, usize, f64)> {
    let mut us = Vec::with_capacity(n);
    let mut pages = 0;
    let t = std::time::Instant::now();
    for i in 0..n {
        let t0 = std::time::Instant::now();
        pages += op(i)?;
        us.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok((us, pages, t.elapsed().as_secs_f64()))
}

fn connect(url: &str) -> anyhow::Result<redis::Connection> {
    redis::Client::open(url)?
        .get_connection()
        .with_context(|| format!("connecting to {url}"))
}

/// The name of the `GET` row of `clients` clients at once.
pub fn get_op(clients: usize) -> String {
    match clients {
        1 => "GET 4 KiB".to_string(),
        c => format!("GET 4 KiB, {c} clients"),
    }
}

/// `n` random `GET`s from each of `clients` threads at once, each on its
/// own connection: one row over all their calls.
fn gets(url: &str, n: usize, clients: usize) -> anyhow::Result<RawRow> {
    let t = std::time::Instant::now();
    let per_client = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                s.spawn(move || {
                    let mut conn = connect(url)?;
                    let mut next = crate::bench::rng(7 + c as u64);
                    time(n, |_| {
                        let v: Vec<u8> = redis::cmd("GET")
                            .arg(key(next() as usize % KEYS))
                            .query(&mut conn)?;
                        Ok(usize::from(v.len() == 4096))
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a GET client panicked")))
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let secs = t.elapsed().as_secs_f64();
    let mut us = Vec::with_capacity(n * clients);
    let mut pages = 0;
    for (u, p, _) in per_client {
        us.extend(u);
        pages += p;
    }
    Ok(RawRow {
        op: get_op(clients),
        clients,
        pages_per_op: 1,
        us: Summary::of(&mut us),
        pages_per_s: pages as f64 / secs,
    })
}

/// Measures `GET` (from one client and from `clients` at once) and `MGET`
/// on the server at `url`, `n` calls each per client.
pub fn measure(url: &str, n: usize, clients: usize) -> anyhow::Result<Vec<RawRow>> {
    let mut c = connect(url)?;
    let page = vec![0x5au8; 4096];
    for w in 0..KEYS / RUN {
        let mut mset = redis::cmd("MSET");
        for i in w * RUN..(w + 1) * RUN {
            mset.arg(key(i)).arg(&page[..]);
        }
        mset.exec(&mut c)?;
    }
    let mut rows = vec![gets(url, n, 1)?];
    if clients > 1 {
        rows.push(gets(url, n, clients)?);
    }
    let mut next = crate::bench::rng(7);
    let (mut us, pages, secs) = time(n.div_ceil(16), |_| {
        let w = next() as usize % (KEYS / RUN);
        let keys: Vec<String> = (w * RUN..(w + 1) * RUN).map(key).collect();
        let v: Vec<Vec<u8>> = redis::cmd("MGET").arg(&keys).query(&mut c)?;
        Ok(v.len())
    })?;
    rows.push(RawRow {
        op: format!("MGET {RUN} x 4 KiB"),
        clients: 1,
        pages_per_op: RUN,
        us: Summary::of(&mut us),
        pages_per_s: pages as f64 / secs,
    });
    for w in 0..KEYS / RUN {
        let keys: Vec<String> = (w * RUN..(w + 1) * RUN).map(key).collect();
        redis::cmd("DEL").arg(&keys).exec(&mut c)?;
    }
    Ok(rows)
}
