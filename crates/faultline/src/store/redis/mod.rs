//! Far memory: pages kept in Redis ([`Redis`], one server) or spread over a
//! Redis Cluster ([`RedisCluster`]), one key per page under the region's
//! key prefix, through the `redis` crate's synchronous API — except page
//! reads, which a connection of their own (on a cluster, one per master,
//! `slots.rs`) reads straight into the frames (`page_reader.rs`).
//!
//! Keys: page `p` of a region with prefix `P` is `{P:w}:p`, `w = p /
//! window` (decimal). The braces are a cluster hash tag: all pages of one
//! window live in one hash slot, so a read-ahead run inside a window is one
//! `MGET`, one round trip, on the cluster too. The window defaults to 256
//! pages, [`crate::Config::readahead_max`]'s default: the largest run the
//! fault path reads at once, aligned to the window, is then one slot (a
//! smaller window splits runs into several `MGET`s; a larger one
//! concentrates a region's hot range on fewer masters). The same keys work
//! on a single server, where the tag is just part of the name.
//!
//! Invariants (what makes the store safe to page to):
//! - A key that does not exist reads as a page of zeros (a fresh region).
//!   A value of any other length than the page is an error that is not
//!   retried, never data. The keys under a region's prefix are its own: a
//!   key of another type put there by someone else is an error read
//!   alone (`GET`: `WRONGTYPE`, not retried), but inside a run `MGET`
//!   answers null for it, which reads as zeros.
//! - A write-back run or batch is one `MSET` with its `WAIT` on a server
//!   (one round trip, pipelined), one per window on a cluster (two round
//!   trips each: see `backend.rs`), at most 64 pages a command.
//! - `write` returns only after the server acknowledged the `MSET` and, if
//!   [`RedisOptions::replicas`] > 0, after `WAIT` saw that many replicas
//!   take it; until then the page stays dirty in its frame (write-back
//!   keeps a page whose write fails, `writeback/`), so a frame is reused
//!   only for acknowledged data. `flush` is durable in that sense.
//! - A server whose `maxmemory-policy` is an `allkeys-*` policy may evict
//!   pages: connecting refuses it ([`StoreError::Refused`]).
//! - A failing call (connection refused or dropped, a timeout, a cluster
//!   mid-failover, too few replicas) is retried with a fresh connection
//!   until [`RedisOptions::retry_for`] has passed, then returned as
//!   [`StoreError::Remote`]: the faulting thread gets SIGBUS with that cause,
//!   a page being written back stays parked and is written on a later pass.
//!   A call that used up its retries marks the store down: until a call
//!   succeeds again, each call makes one attempt (a flush of many dirty
//!   pages to a dead server fails in one timeout per page, not `retry_for`
//!   per page). Every command has a response timeout: nothing waits forever.
//!
//! Locks: the connection pool's mutex, held only to take or return a
//! connection (never across a command).

mod backend;
mod page_reader;
mod slots;

pub use backend::{Backend, Cluster, Server};

use super::{Store, StoreError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How a Redis store connects and pages.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    prefix: String,
    timeout: Duration,
    retry_for: Duration,
    replicas: Option<usize>,
    window: u64,
}

impl RedisOptions {
    /// Options with key prefix `prefix` (one region's pages: two regions
    /// with the same prefix on the same server see the same pages).
    pub fn new(prefix: impl Into<String>) -> Self {
        RedisOptions {
            prefix: prefix.into(),
            timeout: Duration::from_secs(2),
            retry_for: Duration::from_secs(5),
            replicas: None,
            window: 256,
        }
    }

    /// Connect and per-command response timeout (default 2 s).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t.max(Duration::from_millis(1));
        self
    }

    /// How long a failing call retries, reconnecting, before its error is
    /// returned (default 5 s; zero: one try). A fault on a page waits this
    /// long for a server to come back before its thread gets SIGBUS.
    pub fn retry_for(mut self, t: Duration) -> Self {
        self.retry_for = t;
        self
    }

    /// Replicas that must acknowledge each write (`WAIT`) before it
    /// counts: default 0 for a single server, 1 for a cluster.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = Some(n);
        self
    }

    /// Pages per hash-slot window (default 256, at least 1).
    pub fn window(mut self, pages: u64) -> Self {
        self.window = pages.max(1);
        self
    }

    fn key(&self, page: u64) -> String {
        Key(self, page).to_string()
    }

    /// Appends [`RedisOptions::key`]'s bytes to `out` (no allocation).
    fn write_key(&self, page: u64, out: &mut Vec<u8>) {
        use std::io::Write;
        // Writing into a Vec cannot fail.
        let _ = write!(out, "{}", Key(self, page));
    }
}

/// Page `.1`'s key under options `.0`: `{prefix:window}:page`, the one
/// place the format is written.
struct Key<'a>(&'a RedisOptions, u64);

impl std::fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Key(o, page) = self;
        write!(f, "{{{}:{}}}:{page}", o.prefix, page / o.window)
    }
}

/// Most idle connections kept for reuse.
const POOL_MAX: usize = 16;

/// Pause between retries of a failing call.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Pages in Redis: [`Redis`] (one server) or [`RedisCluster`].
pub struct RedisStore<B: Backend> {
    backend: B,
    opts: RedisOptions,
    replicas: usize,
    pool: Mutex<Vec<B::Conn>>,
    identity: u64,
    /// Set when a call used up its retries, cleared by a success: only a
    /// hint for how long to retry (Relaxed; no data is published by it).
    down: AtomicBool,
}

/// Pages on one Redis server.
pub type Redis = RedisStore<Server>;

/// The most pages one `MSET` carries (256 KiB of 4 KiB pages): a write-back
/// run may be 1 MiB, and the `redis` crate copies a command's arguments
/// and then encodes them, so a longer command costs the process that much
/// more memory outside the budget for its round trip (a 1 MiB `MSET` had
/// the far-memory bench's 25 MiB cgroup kill its child).
const MSET_MAX_PAGES: usize = 64;

/// Pages spread over a Redis Cluster, a hash slot per window of pages.
pub type RedisCluster = RedisStore<Cluster>;

impl<B: Backend> std::fmt::Debug for RedisStore<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(B::NAME)
            .field("where", &self.backend.describe())
            .field("opts", &self.opts)
            .finish()
    }
}

impl Redis {
    /// Connects to the server at `url` (`redis://host:port/db`), checks it
    /// answers and cannot evict pages.
    ///
    /// # Errors
    /// [`StoreError::Remote`] if it cannot be reached (after
    /// `retry_for`), [`StoreError::Refused`] for an `allkeys-*` eviction
    /// policy or a bad URL.
    pub fn connect(url: &str, opts: RedisOptions) -> Result<Redis, StoreError> {
        RedisStore::with_backend(Server::new(url, opts.timeout)?, opts)
    }
}

impl RedisCluster {
    /// Connects to the cluster through `nodes` (any of its nodes' URLs),
    /// checks every node answers and none can evict pages.
    ///
    /// # Errors
    /// As [`Redis::connect`].
    pub fn connect(nodes: &[&str], opts: RedisOptions) -> Result<RedisCluster, StoreError> {
        RedisStore::with_backend(Cluster::new(nodes, opts.timeout)?, opts)
    }
}

fn remote(
    op: &'static str,
    page: u64,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> StoreError {
    StoreError::Remote {
        op,
        page,
        source: e.into(),
    }
}

/// Why a reply is unusable, and whether trying again may help.
struct Failure {
    error: ::redis::RedisError,
    retry: bool,
}

impl From<::redis::RedisError> for Failure {
    fn from(error: ::redis::RedisError) -> Self {
        let retry = !matches!(
            error.kind(),
            ::redis::ErrorKind::UnexpectedReturnType
                | ::redis::ErrorKind::InvalidClientConfig
                | ::redis::ErrorKind::Client
                | ::redis::ErrorKind::AuthenticationFailed
        ) && error.code() != Some("WRONGTYPE");
        Failure { error, retry }
    }
}

impl<B: Backend> RedisStore<B> {
    fn with_backend(backend: B, opts: RedisOptions) -> Result<Self, StoreError> {
        let identity = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (backend.describe(), &opts.prefix).hash(&mut h);
            h.finish()
        };
        let s = RedisStore {
            replicas: opts.replicas.unwrap_or(B::DEFAULT_REPLICAS),
            backend,
            opts,
            pool: Mutex::new(Vec::new()),
            identity,
            down: AtomicBool::new(false),
        };
        let policies = s.call("connect", 0, |b, c| Ok(b.eviction_policies(c)?))?;
        if let Some(p) = policies.iter().find(|p| p.starts_with("allkeys")) {
            return Err(StoreError::Refused {
                store: B::NAME,
                reason: format!(
                    "{} has maxmemory-policy {p}: it may evict pages (use noeviction, or a volatile-* policy)",
                    s.backend.describe()
                ),
            });
        }
        Ok(s)
    }

    /// Runs `f` on a pooled (or new) connection, retrying with a fresh one
    /// while the failure may pass and `retry_for` has not; the connection
    /// goes back to the pool only after a success.
    fn call<T>(
        &self,
        op: &'static str,
        page: u64,
        mut f: impl FnMut(&B, &mut B::Conn) -> Result<T, Failure>,
    ) -> Result<T, StoreError> {
        let retry_for = if self.down.load(Ordering::Relaxed) {
            Duration::ZERO
        } else {
            self.opts.retry_for
        };
        let deadline = Instant::now() + retry_for;
        loop {
            let conn = self.pool.lock().pop();
            let pooled = conn.is_some();
            let got = match conn {
                Some(c) => Ok(c),
                None => self.backend.connect().map_err(Failure::from),
            };
            let failure = match got {
                Ok(mut c) => match f(&self.backend, &mut c) {
                    Ok(v) => {
                        self.down.store(false, Ordering::Relaxed);
                        let mut pool = self.pool.lock();
                        if pool.len() < POOL_MAX {
                            pool.push(c);
                        }
                        return Ok(v);
                    }
                    Err(e) => e,
                },
                Err(e) => e,
            };
            if failure.retry && pooled {
                // An idle connection the server dropped (it restarted, or
                // timed out clients): so may the others be. Try a fresh one
                // at once, whatever `retry_for` says.
                self.pool.lock().clear();
                continue;
            }
            if !failure.retry || Instant::now() + RETRY_PAUSE > deadline {
                if failure.retry {
                    self.down.store(true, Ordering::Relaxed);
                }
                return Err(remote(op, page, failure.error));
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// Sends `cmd` (a write to keys of one window: one hash slot; `key`
    /// one of them) and, if the options ask for replicas, waits for them
    /// (`WAIT`, on the connection that carried `cmd`: see `Backend::write`).
    fn write_acked(&self, c: &mut B::Conn, cmd: &::redis::Cmd, key: &str) -> Result<(), Failure> {
        let timeout_ms = self.opts.timeout.as_millis() as u64;
        let acked = B::write(c, cmd, key, self.replicas, timeout_ms)?;
        if acked < self.replicas {
            return Err(Failure::from(::redis::RedisError::from((
                ::redis::ErrorKind::Io,
                "too few replicas acknowledged the write",
                format!(
                    "WAIT: {acked} of {} replicas within {timeout_ms} ms",
                    self.replicas
                ),
            ))));
        }
        Ok(())
    }
}

impl<B: Backend> Store for RedisStore<B> {
    fn name(&self) -> &'static str {
        B::NAME
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let size = buf.len();
        self.read_pages(page, size, buf)
    }

    fn read_pages(&self, first: u64, page_size: usize, buf: &mut [u8]) -> Result<(), StoreError> {
        let window = self.opts.window;
        let mut page = first;
        for chunk in split_at_windows(first, buf.len() / page_size, window) {
            let bytes = &mut buf[((page - first) as usize) * page_size..][..chunk * page_size];
            self.call("read", page, |_, c| {
                Ok(B::read_pages(c, &self.opts, page, page_size, bytes)?)
            })?;
            page += chunk as u64;
        }
        Ok(())
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.write_pages(&[(page, buf)])
    }

    fn write_pages(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        // One `MSET` per window (a hash slot) on a cluster; on one server
        // one for all: a reclaim batch's scattered pages in one round trip.
        // At most `MSET_MAX_PAGES` a command: the command is built and sent
        // from copies of the pages, memory the budget does not hold.
        let window = self.opts.window;
        let groups = pages.chunk_by(|a, b| B::ANY_SLOTS || a.0 / window == b.0 / window);
        for group in groups.flat_map(|g| g.chunks(MSET_MAX_PAGES)) {
            let mut mset = ::redis::cmd("MSET");
            for &(page, bytes) in group {
                mset.arg(self.opts.key(page)).arg(bytes);
            }
            let key = self.opts.key(group[0].0);
            self.call("write", group[0].0, |_, c| self.write_acked(c, &mset, &key))?;
        }
        Ok(())
    }

    fn discard(&self, first: u64, pages: u64, _page_size: usize) -> Result<(), StoreError> {
        let mut page = first;
        for chunk in split_at_windows(first, pages as usize, self.opts.window) {
            let keys: Vec<String> = (page..page + chunk as u64)
                .map(|p| self.opts.key(p))
                .collect();
            let mut del = ::redis::cmd("DEL");
            del.arg(&keys);
            self.call("discard", page, |_, c| self.write_acked(c, &del, &keys[0]))?;
            page += chunk as u64;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Every write was acknowledged (and replicated, per the options)
        // before it returned: there is nothing in flight.
        Ok(())
    }

    fn identity(&self) -> Option<(u64, u64)> {
        Some((self.identity, 0))
    }
}

/// Lengths of the pieces of `[first, first + pages)` cut at multiples of
/// `window`.
fn split_at_windows(first: u64, pages: usize, window: u64) -> impl Iterator<Item = usize> {
    let end = first + pages as u64;
    let mut at = first;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let next = ((at / window) + 1) * window;
        let n = next.min(end) - at;
        at += n;
        Some(n as usize)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_a_hash_tag_per_window() {
        let o = RedisOptions::new("r1").window(4);
        assert_eq!(o.key(0), "{r1:0}:0");
        assert_eq!(o.key(3), "{r1:0}:3");
        assert_eq!(o.key(4), "{r1:1}:4");
        let mut out = b"x".to_vec();
        o.write_key(4, &mut out);
        assert_eq!(out, b"x{r1:1}:4");
    }

    #[test]
    fn runs_split_at_window_edges() {
        let v: Vec<usize> = split_at_windows(6, 12, 4).collect();
        assert_eq!(v, vec![2, 4, 4, 2]);
        let v: Vec<usize> = split_at_windows(8, 4, 4).collect();
        assert_eq!(v, vec![4]);
        assert_eq!(split_at_windows(3, 0, 4).count(), 0);
    }
}
