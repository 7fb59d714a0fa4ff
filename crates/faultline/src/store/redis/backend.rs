//! The two ways to reach Redis: one server ([`Server`]) or a cluster
//! ([`Cluster`]). A backend opens connections with response timeouts set,
//! reads pages into frames (a server: its own connection for that,
//! `page_reader.rs`; a cluster: one per master, `slots.rs`, and `MGET`
//! through the `redis` crate's cluster routing where the slot map cannot
//! route) and reads every node's `maxmemory-policy`. No locks.

use ::redis::cluster::{ClusterClient, ClusterConnection};
use ::redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use ::redis::{ErrorKind, RedisError, RedisResult, Value};
use std::time::Duration;

use super::page_reader::{wrong_size, PageReader};
use super::slots::{Routed, Slots};
use super::RedisOptions;
use crate::store::StoreError;

mod sealed {
    pub trait Sealed {}
}

/// How a [`super::RedisStore`] reaches Redis (sealed: [`Server`] or
/// [`Cluster`]).
pub trait Backend: sealed::Sealed + Send + Sync + 'static {
    /// A connection.
    #[doc(hidden)]
    type Conn: Send;
    /// The store's name.
    #[doc(hidden)]
    const NAME: &'static str;
    /// Replicas each write waits for unless the options say.
    #[doc(hidden)]
    const DEFAULT_REPLICAS: usize;
    /// Whether one command may name keys of any hash slots (one server:
    /// a write-back batch's scattered pages are one `MSET`); on a
    /// cluster a command stays within one slot (one window of pages).
    #[doc(hidden)]
    const ANY_SLOTS: bool;
    /// A new connection, timeouts set.
    #[doc(hidden)]
    fn connect(&self) -> RedisResult<Self::Conn>;
    /// Reads pages `[first, first + n)` (`n = buf.len() / page_size`,
    /// inside one window: one hash slot) into `buf`, `page_size` bytes
    /// each, in one round trip; a key that does not exist reads as zeros,
    /// a value of another size is an `UnexpectedReturnType` error.
    #[doc(hidden)]
    fn read_pages(
        c: &mut Self::Conn,
        opts: &RedisOptions,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
    ) -> RedisResult<()>;
    /// Sends `cmd` (a write to keys of one hash slot, `key` one of them),
    /// then `WAIT replicas timeout_ms` on the connection that carried it if
    /// `replicas > 0`: the replicas that acknowledged (`replicas` when 0).
    #[doc(hidden)]
    fn write(
        c: &mut Self::Conn,
        cmd: &::redis::Cmd,
        key: &str,
        replicas: usize,
        timeout_ms: u64,
    ) -> RedisResult<usize>;
    /// Every node's `maxmemory-policy`.
    #[doc(hidden)]
    fn eviction_policies(&self, c: &mut Self::Conn) -> RedisResult<Vec<String>>;
    /// Where it connects, for messages.
    #[doc(hidden)]
    fn describe(&self) -> String;
}

fn bad_url(e: ::redis::RedisError, what: &str) -> StoreError {
    StoreError::Refused {
        store: "redis",
        reason: format!("{what}: {e}"),
    }
}

/// Bulk strings anywhere in `v` (replies of `CONFIG GET` from one node or
/// many), lower-cased.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).to_lowercase()),
        Value::SimpleString(s) => out.push(s.to_lowercase()),
        Value::Array(a) | Value::Set(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Map(m) => m.iter().for_each(|(k, x)| {
            strings(k, out);
            strings(x, out);
        }),
        _ => {}
    }
}

fn config_get_policy() -> ::redis::Cmd {
    let mut c = ::redis::cmd("CONFIG");
    c.arg("GET").arg("maxmemory-policy");
    c
}

/// One Redis server.
pub struct Server {
    client: ::redis::Client,
    timeout: Duration,
}

/// A connection to one server: the `redis` crate's for writes and
/// queries, and a [`PageReader`] of its own for reads.
pub struct ServerConn {
    commands: ::redis::Connection,
    pages: PageReader,
}

impl Server {
    pub(super) fn new(url: &str, timeout: Duration) -> Result<Server, StoreError> {
        let client = ::redis::Client::open(url).map_err(|e| bad_url(e, url))?;
        Ok(Server { client, timeout })
    }
}

impl sealed::Sealed for Server {}

impl Backend for Server {
    type Conn = ServerConn;
    const NAME: &'static str = "redis";
    const DEFAULT_REPLICAS: usize = 0;
    const ANY_SLOTS: bool = true;

    fn connect(&self) -> RedisResult<Self::Conn> {
        let commands = self.client.get_connection_with_timeout(self.timeout)?;
        commands.set_read_timeout(Some(self.timeout))?;
        commands.set_write_timeout(Some(self.timeout))?;
        let pages = PageReader::connect(self.client.get_connection_info(), self.timeout)?;
        Ok(ServerConn { commands, pages })
    }

    fn read_pages(
        c: &mut Self::Conn,
        opts: &RedisOptions,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
    ) -> RedisResult<()> {
        c.pages.read_pages(opts, first, page_size, buf)
    }

    /// The write and its `WAIT` pipelined: one round trip.
    fn write(
        c: &mut Self::Conn,
        cmd: &::redis::Cmd,
        _key: &str,
        replicas: usize,
        timeout_ms: u64,
    ) -> RedisResult<usize> {
        let c = &mut c.commands;
        if replicas == 0 {
            cmd.exec(c)?;
            return Ok(0);
        }
        let mut p = ::redis::pipe();
        p.add_command(cmd.clone()).ignore();
        p.cmd("WAIT").arg(replicas).arg(timeout_ms);
        let (acked,): (usize,) = p.query(c)?;
        Ok(acked)
    }

    fn eviction_policies(&self, c: &mut Self::Conn) -> RedisResult<Vec<String>> {
        let v: Value = config_get_policy().query(&mut c.commands)?;
        let mut out = Vec::new();
        strings(&v, &mut out);
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("redis server {}", self.client.get_connection_info().addr())
    }
}

/// A Redis Cluster.
pub struct Cluster {
    client: ClusterClient,
    nodes: Vec<String>,
    /// The first node's settings (credentials), for the page readers
    /// (boxed: a store's size stays that of the crate's client).
    template: Box<::redis::ConnectionInfo>,
    timeout: Duration,
}

/// A connection to a cluster: the `redis` crate's, for writes, queries
/// and reads the slot map cannot route, and a page reader per master.
pub struct ClusterConn {
    pub(super) commands: ClusterConnection,
    pub(super) pages: Slots,
}

impl Cluster {
    pub(super) fn new(nodes: &[&str], timeout: Duration) -> Result<Cluster, StoreError> {
        let joined = nodes.join(",");
        let client = ClusterClient::builder(nodes.iter().copied())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()
            .map_err(|e| bad_url(e, &joined))?;
        let first = nodes.first().ok_or_else(|| StoreError::Refused {
            store: "redis-cluster",
            reason: "no node to connect to".into(),
        })?;
        let template = Box::new(
            ::redis::Client::open(*first)
                .map_err(|e| bad_url(e, first))?
                .get_connection_info()
                .clone(),
        );
        Ok(Cluster {
            client,
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            template,
            timeout,
        })
    }
}

impl sealed::Sealed for Cluster {}

impl Backend for Cluster {
    type Conn = ClusterConn;
    const NAME: &'static str = "redis-cluster";
    const DEFAULT_REPLICAS: usize = 1;
    const ANY_SLOTS: bool = false;

    fn connect(&self) -> RedisResult<Self::Conn> {
        let mut commands = self.client.get_connection()?;
        let pages = Slots::new((*self.template).clone(), self.timeout, &mut commands)?;
        Ok(ClusterConn { commands, pages })
    }

    /// From the slot's master through its page reader; through the
    /// crate's cluster connection (which follows `MOVED` and `ASK`) when
    /// the master answers that it does not serve the slot.
    fn read_pages(
        c: &mut Self::Conn,
        opts: &RedisOptions,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
    ) -> RedisResult<()> {
        match c
            .pages
            .read_pages(&mut c.commands, opts, first, page_size, buf)?
        {
            Routed::Read => Ok(()),
            Routed::Redirected => mget_routed(&mut c.commands, opts, first, page_size, buf),
        }
    }

    /// A cluster connection has no pipelines: the write (routed by its
    /// keys' slot to its master), then `WAIT` routed to the same master,
    /// over the same per-node connection — two round trips.
    fn write(
        c: &mut Self::Conn,
        cmd: &::redis::Cmd,
        key: &str,
        replicas: usize,
        timeout_ms: u64,
    ) -> RedisResult<usize> {
        let c = &mut c.commands;
        cmd.exec(c)?;
        if replicas == 0 {
            return Ok(0);
        }
        let mut wait = ::redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout_ms);
        let route = Route::with_key(key, SlotAddr::Master);
        let v = c.route_command(
            &wait,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
        )?;
        Ok(::redis::from_redis_value(v)?)
    }

    fn eviction_policies(&self, c: &mut Self::Conn) -> RedisResult<Vec<String>> {
        let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
        let v = c.commands.route_command(&config_get_policy(), routing)?;
        let mut out = Vec::new();
        strings(&v, &mut out);
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("redis cluster {}", self.nodes.join(","))
    }
}

/// `MGET` of pages `[first, first + n)` (one slot) through the cluster
/// connection, into `buf`.
fn mget_routed(
    c: &mut ClusterConnection,
    opts: &RedisOptions,
    first: u64,
    page_size: usize,
    buf: &mut [u8],
) -> RedisResult<()> {
    let n = buf.len() / page_size;
    let keys: Vec<String> = (first..first + n as u64).map(|p| opts.key(p)).collect();
    let values: Vec<Option<Vec<u8>>> = ::redis::cmd("MGET").arg(&keys).query(c)?;
    if values.len() != n {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "MGET returned the wrong number of values",
        )));
    }
    for ((page, value), dst) in (first..).zip(values).zip(buf.chunks_mut(page_size)) {
        match value {
            None => crate::memops::clear(dst),
            Some(v) if v.len() == dst.len() => dst.copy_from_slice(&v),
            Some(v) => return Err(wrong_size(page, v.len() as i64, dst.len())),
        }
    }
    Ok(())
}
