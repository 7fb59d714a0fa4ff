//! A cluster's page reads straight into the frames: which master serves a
//! key's hash slot (the map `CLUSTER SLOTS` gave when the connection was
//! made), and a [`PageReader`] per master, opened when first needed with
//! the URL's credentials.
//!
//! The map only chooses where to ask; it never decides what a page holds.
//! A master that no longer serves the slot (a failover, a slot moved)
//! answers `MOVED` or `ASK` instead of data, and a node mid-failover
//! `TRYAGAIN`, `CLUSTERDOWN` or `MASTERDOWN`: [`Slots::read_pages`] then says
//! [`Routed::Redirected`], the caller reads through the `redis` crate's
//! cluster connection (which follows redirections), and the map is read
//! again before the next read. A reader whose socket failed is dropped
//! with its error, which the store's retry loop answers with a fresh
//! connection, and so a fresh map.
//!
//! Only plain TCP: with TLS every read goes through the crate. A master
//! listed without an address of its own (empty, `?`, a wildcard) is not
//! mapped, and its slots' reads go through the crate too.
//!
//! No locks: a `Slots` belongs to one pooled connection, used by one thread
//! at a time.

use ::redis::cluster::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{ConnectionAddr, ConnectionInfo, RedisResult, Value};
use std::collections::HashMap;
use std::time::Duration;

use super::page_reader::PageReader;
use super::RedisOptions;

/// The hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag — the bytes
/// between its first `{` and the first `}` after it, if any — or of the
/// whole key, modulo 16384 (the cluster specification's rule).
pub(super) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = key[open + 1..].iter().position(|&b| b == b'}')?;
            let tag = &key[open + 1..open + 1 + close];
            (!tag.is_empty()).then_some(tag)
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS
}

/// How a read went.
#[derive(Debug)]
pub(super) enum Routed {
    /// The pages are in the buffer.
    Read,
    /// The node asked did not serve the slot (or the cluster was changing):
    /// read through the cluster connection instead.
    Redirected,
}

/// A master's address.
type Node = (String, u16);

/// Where each slot's master is, and a page reader per master.
pub(super) struct Slots {
    /// The first node's connection settings (credentials, database),
    /// given each master's address.
    template: ConnectionInfo,
    timeout: Duration,
    /// `(first slot, last slot, master)`, sorted by first slot; empty
    /// when the map must be read again.
    ranges: Vec<(u16, u16, Node)>,
    readers: HashMap<Node, PageReader>,
    key: Vec<u8>,
    /// Whether the nodes are reached over plain TCP, which a page reader
    /// speaks; otherwise (TLS) every read goes through the crate.
    plain: bool,
}

impl Slots {
    /// A map read from the cluster through `c`.
    pub(super) fn new(
        template: ConnectionInfo,
        timeout: Duration,
        c: &mut ClusterConnection,
    ) -> RedisResult<Slots> {
        let plain = matches!(template.addr(), ConnectionAddr::Tcp(..));
        let mut s = Slots {
            template,
            timeout,
            ranges: Vec::new(),
            readers: HashMap::new(),
            key: Vec::with_capacity(64),
            plain,
        };
        if plain {
            s.refresh(c)?;
        }
        Ok(s)
    }

    /// Reads the map again (`CLUSTER SLOTS`, from any node), and closes the
    /// readers of nodes that are no longer a listed master (a demoted or
    /// removed one): a long-lived connection through failovers keeps a
    /// socket per current master, not one per master it ever had.
    fn refresh(&mut self, c: &mut ClusterConnection) -> RedisResult<()> {
        let mut cmd = ::redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let v = c.route_command(&cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))?;
        let ranges = parse_slots(&v);
        self.readers
            .retain(|node, _| ranges.iter().any(|(_, _, master)| master == node));
        self.ranges = ranges;
        Ok(())
    }

    /// Reads pages `[first, first + n)` (one window: one slot) into `buf`
    /// from the slot's master, as [`PageReader::read_pages`].
    pub(super) fn read_pages(
        &mut self,
        c: &mut ClusterConnection,
        opts: &RedisOptions,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
    ) -> RedisResult<Routed> {
        if !self.plain {
            return Ok(Routed::Redirected);
        }
        if self.ranges.is_empty() {
            self.refresh(c)?;
        }
        self.key.clear();
        opts.write_key(first, &mut self.key);
        let slot = slot_of(&self.key);
        let Some((_, _, node)) = self
            .ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
        else {
            // No master listed for the slot with an address of its own (the
            // cluster was changing, or the node gave none: see
            // `parse_slots`): the crate knows where to ask. The map stays;
            // a failing or redirecting master makes it be read again.
            return Ok(Routed::Redirected);
        };
        // Looked up by reference: a read allocates nothing once its
        // master's reader is open.
        let reader = match self.readers.get_mut(node) {
            Some(reader) => reader,
            None => {
                let (host, port) = node.clone();
                let info = self
                    .template
                    .clone()
                    .set_addr(ConnectionAddr::Tcp(host, port));
                let reader = PageReader::connect(&info, self.timeout)?;
                self.readers.entry(node.clone()).or_insert(reader)
            }
        };
        match reader.read_pages(opts, first, page_size, buf) {
            Ok(()) => Ok(Routed::Read),
            Err(e)
                if matches!(
                    e.code(),
                    Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN")
                ) =>
            {
                // The node answered in step (an error reply, read whole):
                // its reader stays; the map is read again next time.
                self.ranges.clear();
                Ok(Routed::Redirected)
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether `host` is an address that means "any" (`0.0.0.0`, `::`).
fn is_wildcard(host: &str) -> bool {
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
}

/// The masters' slot ranges in a `CLUSTER SLOTS` reply: entries of
/// `[first, last, [host, port, ...], replicas...]`; entries it cannot read,
/// or whose master has no address of its own, are left out (their slots
/// are then read through the crate).
fn parse_slots(v: &Value) -> Vec<(u16, u16, Node)> {
    let Value::Array(entries) = v else {
        return Vec::new();
    };
    let mut out: Vec<(u16, u16, Node)> = entries
        .iter()
        .filter_map(|e| {
            let Value::Array(e) = e else { return None };
            let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(master))) =
                (e.first(), e.get(1), e.get(2))
            else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            // An empty host, a wildcard or none (the node that answered;
            // which one that was, a randomly routed query does not say) and
            // "?" (unknown): no address to read from, so the crate's
            // connection, which knows, serves these slots.
            if host.is_empty() || host == "?" || is_wildcard(&host) {
                return None;
            }
            let Some(Value::Int(port)) = master.get(1) else {
                return None;
            };
            Some((
                u16::try_from(*lo).ok()?,
                u16::try_from(*hi).ok()?,
                (host, u16::try_from(*port).ok()?),
            ))
        })
        .collect();
    out.sort_by_key(|r| r.0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // Examples from the Redis Cluster specification and redis-cli.
        assert_eq!(slot_of(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(
            slot_of(b"foo{}{bar}"),
            slot_of(b"bar"),
            "an empty tag hashes the key"
        );
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"foo{bar}{zap}"), slot_of(b"bar"));
        // A region's keys: the window's tag.
        assert_eq!(slot_of(b"{r1:0}:3"), slot_of(b"r1:0"));
    }

    /// On a real cluster, a map that sends every slot to one master: the
    /// others' pages (one page, `GET`, or a window of 4, `MGET`) come back
    /// `Redirected` and are then read right through the crate, that
    /// master's are read, and the map is read again after a redirection.
    #[test]
    fn a_wrong_map_is_redirected_never_read() {
        use super::super::backend::{Backend, Cluster};
        const PS: usize = 64;
        let cluster = redis_harness::Cluster::start(3, 0)
            .unwrap_or_else(|e| panic!("this test needs redis-server: {e}"));
        let urls = cluster.urls();
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        let backend = Cluster::new(&nodes, Duration::from_secs(2)).expect("cluster");
        let mut conn = backend.connect().expect("cluster connection");
        assert_eq!(conn.pages.ranges.len(), 3, "{:?}", conn.pages.ranges);
        let opts = RedisOptions::new("wrong").window(4);
        let page = |p: u64| vec![(p as u8) ^ 0x5A; PS];
        for p in 0..64u64 {
            let _: () = ::redis::cmd("SET")
                .arg(opts.key(p))
                .arg(page(p))
                .query(&mut conn.commands)
                .expect("SET");
        }
        let true_map = conn.pages.ranges.clone();
        let first_master = true_map[0].2.clone();
        let owner = |p: u64| {
            let slot = slot_of(opts.key(p).as_bytes());
            true_map
                .iter()
                .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
                .map(|r| r.2.clone())
                .expect("every slot has a master")
        };
        let wrong = vec![(0, SLOTS - 1, first_master.clone())];
        let (mut read, mut redirected) = (0, 0);
        // Windows of 4 pages: `MGET`s; then single pages: `GET`s.
        for (first, n) in (0..16u64)
            .map(|w| (w * 4, 4))
            .chain((0..64u64).map(|p| (p, 1)))
        {
            conn.pages.ranges = wrong.clone();
            let mut buf = vec![0xEEu8; n * PS];
            match conn
                .pages
                .read_pages(&mut conn.commands, &opts, first, PS, &mut buf)
                .expect("read")
            {
                Routed::Read => {
                    assert_eq!(
                        owner(first),
                        first_master,
                        "page {first} read from its master"
                    );
                    read += 1;
                }
                Routed::Redirected => {
                    assert_ne!(owner(first), first_master, "page {first}");
                    assert!(conn.pages.ranges.is_empty(), "the map is read again");
                    redirected += 1;
                }
            }
            // The store's read, through the backend: right either way.
            conn.pages.ranges = wrong.clone();
            let mut buf = vec![0xEEu8; n * PS];
            Cluster::read_pages(&mut conn, &opts, first, PS, &mut buf).expect("read");
            for (i, got) in buf.chunks(PS).enumerate() {
                assert_eq!(got, page(first + i as u64), "page {}", first + i as u64);
            }
        }
        assert!(
            read > 0 && redirected > 0,
            "read {read}, redirected {redirected}"
        );
        // A reader of a node that is no longer a master (here one that
        // never was) is closed when the map is read again.
        let stale = ("127.0.0.1".to_string(), 1);
        let (host, port) = first_master.clone();
        let info = conn
            .pages
            .template
            .clone()
            .set_addr(ConnectionAddr::Tcp(host, port));
        let reader = PageReader::connect(&info, Duration::from_secs(2)).expect("connect");
        conn.pages.readers.insert(stale.clone(), reader);
        conn.pages
            .refresh(&mut conn.commands)
            .expect("CLUSTER SLOTS");
        assert!(!conn.pages.readers.contains_key(&stale));
        assert!(conn.pages.readers.contains_key(&first_master));
        // With the map read again, every page is read from its master.
        conn.pages.ranges.clear();
        for p in 0..64u64 {
            let mut buf = vec![0u8; PS];
            let routed = conn
                .pages
                .read_pages(&mut conn.commands, &opts, p, PS, &mut buf)
                .expect("read");
            assert!(matches!(routed, Routed::Read), "page {p}: {routed:?}");
            assert_eq!(buf, page(p), "page {p}");
        }
    }

    #[test]
    fn a_slots_reply_gives_each_range_its_master() {
        let node = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let v = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                node("127.0.0.1", 7001),
                node("127.0.0.1", 7004),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
            ]),
            Value::Array(vec![Value::Int(10923)]),
            Value::Array(vec![Value::Int(11000), Value::Int(11100), node("", 7002)]),
            Value::Array(vec![Value::Int(11101), Value::Int(11200), node("?", 7002)]),
            Value::Array(vec![
                Value::Int(11201),
                Value::Int(11300),
                node("0.0.0.0", 7002),
            ]),
            Value::Array(vec![Value::Int(11301), Value::Int(11400), node("::", 7002)]),
            Value::Array(vec![
                Value::Int(11401),
                Value::Int(11500),
                Value::Array(vec![Value::Nil, Value::Int(7002)]),
            ]),
        ]);
        assert_eq!(
            parse_slots(&v),
            vec![
                (0, 5460, ("127.0.0.1".to_string(), 7000)),
                (5461, 10922, ("127.0.0.1".to_string(), 7001)),
            ]
        );
        assert!(parse_slots(&Value::Nil).is_empty());
    }
}
