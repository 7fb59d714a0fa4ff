//! The store's own limit for `bench far-memory`: the raw Redis round trip
//! from this process, in the same run as the rows. `GET` of one 4 KiB key
//! (what a random fault needs) and `MGET` of 256 keys (a read-ahead
//! window), each timed one by one over random keys of a set written first;
//! the keys are deleted after. Median and p99 per operation, and pages/s
//! from the mean.

use crate::report::Summary;
use anyhow::Context;

/// One raw row: the operation, its latency (µs) and pages per second.
pub struct RawRow {
    pub op: &'static str,
    pub pages_per_op: usize,
    pub us: Summary,
    pub pages_per_s: f64,
}

const KEYS: usize = 4096;
const RUN: usize = 256;

fn key(i: usize) -> String {
    format!("{{raw{}:{}}}:{i}", std::process::id(), i / RUN)
}

/// Times `n` calls of `op` (returning the pages it read), one by one.
fn time(
    n: usize,
    mut op: impl FnMut(usize) -> anyhow::Result<usize>,
) -> anyhow::Result<(Summary, f64)> {
    let mut us = Vec::with_capacity(n);
    let mut pages = 0;
    let t = std::time::Instant::now();
    for i in 0..n {
        let t0 = std::time::Instant::now();
        pages += op(i)?;
        us.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok((
        Summary::of(&mut us),
        pages as f64 / t.elapsed().as_secs_f64(),
    ))
}

/// Measures `GET` and `MGET` on the server at `url`, `n` calls each.
pub fn measure(url: &str, n: usize) -> anyhow::Result<Vec<RawRow>> {
    let mut c = redis::Client::open(url)?
        .get_connection()
        .with_context(|| format!("connecting to {url}"))?;
    let page = vec![0x5au8; 4096];
    for w in 0..KEYS / RUN {
        let mut mset = redis::cmd("MSET");
        for i in w * RUN..(w + 1) * RUN {
            mset.arg(key(i)).arg(&page[..]);
        }
        mset.exec(&mut c)?;
    }
    let mut next = crate::bench::rng(7);
    let (get, get_rate) = time(n, |_| {
        let v: Vec<u8> = redis::cmd("GET")
            .arg(key(next() as usize % KEYS))
            .query(&mut c)?;
        Ok(usize::from(v.len() == 4096))
    })?;
    let (mget, mget_rate) = time(n.div_ceil(16), |_| {
        let w = next() as usize % (KEYS / RUN);
        let keys: Vec<String> = (w * RUN..(w + 1) * RUN).map(key).collect();
        let v: Vec<Vec<u8>> = redis::cmd("MGET").arg(&keys).query(&mut c)?;
        Ok(v.len())
    })?;
    for w in 0..KEYS / RUN {
        let keys: Vec<String> = (w * RUN..(w + 1) * RUN).map(key).collect();
        redis::cmd("DEL").arg(&keys).exec(&mut c)?;
    }
    Ok(vec![
        RawRow {
            op: "GET 4 KiB",
            pages_per_op: 1,
            us: get,
            pages_per_s: get_rate,
        },
        RawRow {
            op: "MGET 256 x 4 KiB",
            pages_per_op: RUN,
            us: mget,
            pages_per_s: mget_rate,
        },
    ])
}
