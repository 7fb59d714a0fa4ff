//! Pages read from one Redis server straight into the caller's frames: a
//! connection of its own that sends `GET` (one page) or `MGET` (a run) and
//! reads the reply's bytes from the socket into the frame, without the
//! `redis` crate's general reply parser. That parser built a value for
//! every reply (a `Vec` per page, copied once more into the frame) and cost
//! a random-read fault over Redis about a fifth of its CPU
//! (docs/measurements.md, "Reading pages without the reply parser"); the
//! crate still encodes every other command and parses its reply
//! (`backend.rs`). A cluster has a reader per master (`slots.rs`).
//!
//! What it accepts (RESP2; the connection never sends `HELLO`): for each
//! page, a bulk string of exactly the page's size (its bytes), a null bulk
//! string (`$-1`, a key that does not exist: zeros), or an error reply
//! (`-…`, parsed by the crate into its error kind). Anything else — a
//! value of another length, another type, a malformed header, a closed
//! connection — is an error, and the connection is not used again (the
//! store's pool keeps only connections whose last call succeeded), so a
//! reply is never read out of step with its request.
//!
//! Invariant: between calls nothing is buffered (one request in flight,
//! its reply read to its last byte). A page's bytes in `buf` are the
//! server's only once the call returns `Ok`; on an error the caller's
//! buffer holds anything and is not used.
//!
//! No locks: a reader belongs to one pooled connection, used by one thread
//! at a time.

use ::redis::{ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::RedisOptions;

/// Bytes of replies read ahead of the parse: a 4 KiB page's whole reply
/// in one read, and the headers of a run's next pages.
const INPUT: usize = 16 * 1024;

/// The longest header or error line accepted.
const LINE_MAX: usize = 4096;

/// The socket under a [`PageReader`].
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.read_exact(buf),
            Stream::Unix(s) => s.read_exact(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(buf),
            Stream::Unix(s) => s.write_all(buf),
        }
    }
}

/// A connection that reads pages into frames (see the module).
pub struct PageReader {
    stream: Stream,
    /// The request being sent.
    request: Vec<u8>,
    /// A key being encoded.
    key: Vec<u8>,
    /// Reply bytes read and not parsed yet: `input[start..end]`.
    input: Box<[u8]>,
    start: usize,
    end: usize,
}

fn protocol(what: &'static str, detail: String) -> RedisError {
    RedisError::from((ErrorKind::Parse, what, detail))
}

fn closed() -> RedisError {
    RedisError::from((ErrorKind::Io, "the server closed the connection"))
}

/// A page's value of `len` bytes where the page has `page_size`: an
/// error that is not retried (`UnexpectedReturnType`).
pub(super) fn wrong_size(page: u64, len: i64, page_size: usize) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "page of the wrong size",
        format!("key for page {page} holds {len} bytes, not {page_size}"),
    ))
}

/// Appends the RESP encoding of one bulk-string argument.
fn push_arg(out: &mut Vec<u8>, arg: &[u8]) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "${}\r\n", arg.len());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

impl PageReader {
    /// Connects to the server `info` names (TCP or a Unix socket), with
    /// `timeout` for the connect and for every read and write, and
    /// authenticates and selects the database as `info` says.
    pub fn connect(info: &ConnectionInfo, timeout: Duration) -> RedisResult<PageReader> {
        let stream = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let mut last = None;
                let mut stream = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, timeout) {
                        Ok(s) => {
                            stream = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let s = match (stream, last) {
                    (Some(s), _) => s,
                    (None, Some(e)) => return Err(e.into()),
                    (None, None) => {
                        return Err(RedisError::from((
                            ErrorKind::InvalidClientConfig,
                            "no address for the server",
                            format!("{host}:{port}"),
                        )))
                    }
                };
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Stream::Tcp(s)
            }
            ConnectionAddr::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Stream::Unix(s)
            }
            other => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "only TCP and Unix sockets are supported",
                    format!("{other}"),
                )))
            }
        };
        let mut r = PageReader {
            stream,
            request: Vec::with_capacity(256),
            key: Vec::with_capacity(64),
            input: vec![0u8; INPUT].into_boxed_slice(),
            start: 0,
            end: 0,
        };
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            r.authenticate(settings.username(), password)?;
        }
        if settings.db() != 0 {
            r.simple_command(&[b"SELECT", settings.db().to_string().as_bytes()])?;
        }
        if r.start != r.end {
            return Err(protocol(
                "bytes after the connection's set-up replies",
                format!("{} bytes", r.end - r.start),
            ));
        }
        Ok(r)
    }

    /// `AUTH [username] password`, as the `redis` crate does it: a server
    /// that refuses the form with a username (before Redis 6) is asked
    /// again without it. Only the server's refusal is an authentication
    /// failure (not retried); a failing socket stays an I/O error.
    fn authenticate(&mut self, username: Option<&str>, password: &str) -> RedisResult<()> {
        let refused = |e: RedisError| {
            if e.code().is_some() {
                RedisError::from((
                    ErrorKind::AuthenticationFailed,
                    "AUTH refused",
                    e.to_string(),
                ))
            } else {
                e
            }
        };
        let Some(user) = username else {
            return self
                .simple_command(&[b"AUTH", password.as_bytes()])
                .map_err(refused);
        };
        match self.simple_command(&[b"AUTH", user.as_bytes(), password.as_bytes()]) {
            Err(e)
                if e.code().is_some()
                    && e.to_string()
                        .contains("wrong number of arguments for 'auth' command") =>
            {
                self.simple_command(&[b"AUTH", password.as_bytes()])
                    .map_err(refused)
            }
            other => other.map_err(refused),
        }
    }

    /// Sends a command whose reply is a status (`+OK`), and checks it.
    fn simple_command(&mut self, args: &[&[u8]]) -> RedisResult<()> {
        self.request.clear();
        let _ = write!(self.request, "*{}\r\n", args.len());
        for a in args {
            push_arg(&mut self.request, a);
        }
        self.stream.write_all(&self.request)?;
        let (kind, line) = self.line()?;
        match kind {
            b'+' => Ok(()),
            b'-' => Err(self.server_error(line)),
            _ => Err(protocol(
                "unexpected reply",
                String::from_utf8_lossy(&self.input[line.0..line.1]).into_owned(),
            )),
        }
    }

    /// Reads pages `[first, first + n)` (`n = buf.len() / page_size`, keys
    /// of one window) into `buf`, `page_size` bytes each: one `GET` or
    /// `MGET`, one round trip. A key that does not exist reads as zeros.
    pub fn read_pages(
        &mut self,
        opts: &RedisOptions,
        first: u64,
        page_size: usize,
        buf: &mut [u8],
    ) -> RedisResult<()> {
        let n = buf.len() / page_size;
        if n == 0 {
            return Ok(());
        }
        debug_assert_eq!(buf.len() % page_size, 0, "whole pages");
        self.request.clear();
        if n == 1 {
            self.request.extend_from_slice(b"*2\r\n$3\r\nGET\r\n");
        } else {
            let _ = write!(self.request, "*{}\r\n$4\r\nMGET\r\n", n + 1);
        }
        for p in first..first + n as u64 {
            self.key.clear();
            opts.write_key(p, &mut self.key);
            push_arg(&mut self.request, &self.key);
        }
        self.stream.write_all(&self.request)?;
        if n > 1 {
            let (kind, line) = self.line()?;
            match kind {
                b'*' if self.integer(line)? == n as i64 => {}
                b'-' => return Err(self.server_error(line)),
                _ => {
                    return Err(protocol(
                        "MGET returned the wrong reply",
                        String::from_utf8_lossy(&self.input[line.0..line.1]).into_owned(),
                    ))
                }
            }
        }
        for (i, page) in buf.chunks_mut(page_size).enumerate() {
            self.bulk_into(first + i as u64, page)?;
        }
        if self.start != self.end {
            return Err(protocol(
                "bytes after the reply",
                format!("{} bytes", self.end - self.start),
            ));
        }
        Ok(())
    }

    /// Reads one page's reply (a bulk string of `dst.len()` bytes, or
    /// null: zeros) into `dst`.
    fn bulk_into(&mut self, page: u64, dst: &mut [u8]) -> RedisResult<()> {
        let (kind, line) = self.line()?;
        let len = match kind {
            b'$' => self.integer(line)?,
            b'_' => -1,
            b'-' => return Err(self.server_error(line)),
            _ => {
                return Err(protocol(
                    "a page's reply is not a string",
                    String::from_utf8_lossy(&self.input[line.0..line.1]).into_owned(),
                ))
            }
        };
        if len == -1 {
            crate::memops::clear(dst);
            return Ok(());
        }
        if len != dst.len() as i64 {
            return Err(wrong_size(page, len, dst.len()));
        }
        // What was read ahead, then the rest straight from the socket.
        let have = (self.end - self.start).min(dst.len());
        dst[..have].copy_from_slice(&self.input[self.start..self.start + have]);
        self.start += have;
        if have < dst.len() {
            self.stream.read_exact(&mut dst[have..]).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    closed()
                } else {
                    e.into()
                }
            })?;
        }
        // The bulk string's closing CRLF.
        while self.end - self.start < 2 {
            self.fill()?;
        }
        if &self.input[self.start..self.start + 2] != b"\r\n" {
            return Err(protocol(
                "a page's bytes are not followed by CRLF",
                format!("page {page}"),
            ));
        }
        self.start += 2;
        Ok(())
    }

    /// Reads more reply bytes into `input` (at least one).
    fn fill(&mut self) -> RedisResult<()> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.end == self.input.len() {
            self.input.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        let n = loop {
            match self.stream.read(&mut self.input[self.end..]) {
                // A signal before anything arrived (a read with a timeout
                // is not restarted): read again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if n == 0 {
            return Err(closed());
        }
        self.end += n;
        Ok(())
    }

    /// The next line of the reply: its type byte and the range of the rest
    /// of it in `input` (without CRLF), consumed.
    fn line(&mut self) -> RedisResult<(u8, (usize, usize))> {
        let mut scanned = self.start;
        loop {
            // Invariant: no '\n' in `input[start..scanned]`.
            if let Some(at) = self.input[scanned..self.end]
                .iter()
                .position(|&b| b == b'\n')
            {
                let nl = scanned + at;
                if nl - self.start >= LINE_MAX {
                    return Err(protocol(
                        "a reply line too long",
                        format!("over {LINE_MAX} bytes"),
                    ));
                }
                // At least a type byte, then CR before the LF.
                if nl < self.start + 2 || self.input[nl - 1] != b'\r' {
                    return Err(protocol("a reply line without CRLF", String::new()));
                }
                let kind = self.input[self.start];
                let range = (self.start + 1, nl - 1);
                self.start = nl + 1;
                return Ok((kind, range));
            }
            if self.end - self.start >= LINE_MAX {
                return Err(protocol(
                    "a reply line too long",
                    format!("over {LINE_MAX} bytes"),
                ));
            }
            // `fill` may move the unread bytes to the front.
            let offset = self.end - self.start;
            self.fill()?;
            scanned = self.start + offset;
        }
    }

    /// The decimal integer in `input[range]`.
    fn integer(&self, (a, b): (usize, usize)) -> RedisResult<i64> {
        std::str::from_utf8(&self.input[a..b])
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| {
                protocol(
                    "a reply header's length is not a number",
                    String::from_utf8_lossy(&self.input[a..b]).into_owned(),
                )
            })
    }

    /// The server's error reply in `input[range]`, as the `redis` crate
    /// names it (its kind says whether a retry may help).
    fn server_error(&self, (a, b): (usize, usize)) -> RedisError {
        let mut line = Vec::with_capacity(b - a + 3);
        line.push(b'-');
        line.extend_from_slice(&self.input[a..b]);
        line.extend_from_slice(b"\r\n");
        match ::redis::parse_redis_value(&line).and_then(|v| v.extract_error()) {
            Err(e) => e,
            Ok(_) => protocol(
                "an error reply the parser did not take",
                String::from_utf8_lossy(&line).into_owned(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: usize = 64;

    fn reader(s: UnixStream) -> PageReader {
        PageReader {
            stream: Stream::Unix(s),
            request: Vec::new(),
            key: Vec::new(),
            input: vec![0u8; INPUT].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Writes of a whole reply before the request is read: the reader
    /// finds it all there at once (its input fills to the end).
    const EARLY: usize = usize::MAX;

    /// A reader whose peer answers each request it reads with the next
    /// of `replies`, `chunk` bytes a write ([`EARLY`]: the first reply
    /// whole, before its request); the peer returns the requests.
    fn serve(
        mut replies: Vec<Vec<u8>>,
        chunk: usize,
    ) -> (PageReader, std::thread::JoinHandle<Vec<Vec<u8>>>) {
        let (a, mut b) = UnixStream::pair().expect("socketpair");
        if chunk == EARLY {
            b.write_all(&replies[0]).expect("reply");
            replies[0].clear();
        }
        let peer = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for reply in replies {
                let mut req = vec![0u8; 1 << 20];
                let got = b.read(&mut req).expect("request");
                req.truncate(got);
                requests.push(req);
                for piece in reply.chunks(chunk.max(1)) {
                    if b.write_all(piece).is_err() {
                        break;
                    }
                }
            }
            requests
        });
        (reader(a), peer)
    }

    /// Runs `read_pages(first, n pages of PS)` against a peer that answers
    /// `reply`, `chunk` bytes a write, and checks the request (for pages 7
    /// and 8).
    fn exchange(first: u64, n: usize, reply: Vec<u8>, chunk: usize) -> RedisResult<Vec<u8>> {
        let (mut r, peer) = serve(vec![reply], chunk);
        let opts = RedisOptions::new("t").window(256);
        let mut buf = vec![0xAAu8; n * PS];
        let got = r.read_pages(&opts, first, PS, &mut buf).map(|()| buf);
        drop(r);
        let req = peer.join().expect("peer").remove(0);
        let want: &[u8] = if n == 1 {
            b"*2\r\n$3\r\nGET\r\n$7\r\n{t:0}:7\r\n"
        } else {
            b"*3\r\n$4\r\nMGET\r\n$7\r\n{t:0}:7\r\n$7\r\n{t:0}:8\r\n"
        };
        assert_eq!(req, want, "the request");
        got
    }

    fn bulk(fill: u8, len: usize) -> Vec<u8> {
        let mut v = format!("${len}\r\n").into_bytes();
        v.extend(std::iter::repeat_n(fill, len));
        v.extend_from_slice(b"\r\n");
        v
    }

    #[test]
    fn a_page_reads_whole_in_any_split() {
        for chunk in [1, 2, 3, 7, 65, 4096] {
            let got = exchange(7, 1, bulk(5, PS), chunk).expect("one page");
            assert!(got.iter().all(|&b| b == 5), "split {chunk}");
        }
    }

    #[test]
    fn a_null_reads_zeros_alone_and_in_resp3_form() {
        for null in [&b"$-1\r\n"[..], b"_\r\n"] {
            let got = exchange(7, 1, null.to_vec(), 1).expect("a null");
            assert!(got.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn a_long_run_of_small_replies_reads_across_refills() {
        // 4,000 replies of 5 or 14 bytes: about 45 KiB through a 16 KiB
        // input. Found there whole (`EARLY`), its 16,384th byte is inside
        // a header and its 32,768th inside a null: each line straddles the
        // input's end, and its start moves to the front.
        const N: usize = 4000;
        const SMALL: usize = 8;
        for chunk in [1, 7, 4096, EARLY] {
            let mut reply = format!("*{N}\r\n").into_bytes();
            for i in 0..N {
                if i % 4 == 0 {
                    reply.extend_from_slice(b"$-1\r\n");
                } else {
                    reply.extend_from_slice(format!("${SMALL}\r\n").as_bytes());
                    reply.extend_from_slice(&(i as u64).to_le_bytes());
                    reply.extend_from_slice(b"\r\n");
                }
            }
            let (mut r, peer) = serve(vec![reply], chunk);
            let opts = RedisOptions::new("t").window(1 << 20);
            let mut buf = vec![0xAAu8; N * SMALL];
            r.read_pages(&opts, 0, SMALL, &mut buf).expect("the run");
            drop(r);
            let req = peer.join().expect("peer").remove(0);
            assert!(req.starts_with(format!("*{}\r\n$4\r\nMGET\r\n", N + 1).as_bytes()));
            for (i, page) in buf.chunks(SMALL).enumerate() {
                let want = if i % 4 == 0 { 0 } else { i as u64 };
                let got = u64::from_le_bytes(page.try_into().expect("8 bytes"));
                assert_eq!(got, want, "page {i}, writes of {chunk}");
            }
        }
    }

    #[test]
    fn a_bad_page_later_in_a_run_fails_the_run() {
        let mut reply = b"*2\r\n".to_vec();
        reply.extend(bulk(3, PS));
        reply.extend(bulk(3, PS + 1));
        let err = exchange(7, 2, reply, 4096).expect_err("page 8 too long");
        assert!(err.to_string().contains("page 8 holds 65 bytes"), "{err}");
        let mut reply = b"*2\r\n".to_vec();
        reply.extend(bulk(3, PS));
        reply.extend_from_slice(b"-ERR later\r\n");
        let err = exchange(7, 2, reply, 3).expect_err("an error for page 8");
        assert!(err.to_string().contains("later"), "{err}");
    }

    #[test]
    fn auth_asks_again_without_a_username_only_where_refused_for_it() {
        let (mut r, peer) = serve(
            vec![
                b"-ERR wrong number of arguments for 'auth' command\r\n".to_vec(),
                b"+OK\r\n".to_vec(),
            ],
            4096,
        );
        r.authenticate(Some("u"), "p").expect("the second form");
        drop(r);
        let reqs = peer.join().expect("peer");
        assert_eq!(reqs[0], b"*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$1\r\np\r\n");
        assert_eq!(reqs[1], b"*2\r\n$4\r\nAUTH\r\n$1\r\np\r\n");

        let (mut r, _peer) = serve(vec![b"-WRONGPASS invalid password\r\n".to_vec()], 4096);
        let err = r.authenticate(None, "p").expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::AuthenticationFailed, "{err}");

        // A socket that fails during AUTH is an I/O error, which the
        // store retries, not a refusal.
        let (mut r, _peer) = serve(vec![Vec::new()], 4096);
        let err = r.authenticate(None, "p").expect_err("closed");
        assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    }

    #[test]
    fn a_run_reads_values_and_nulls_in_order() {
        for chunk in [1, 5, 4096] {
            let mut reply = b"*2\r\n$-1\r\n".to_vec();
            reply.extend(bulk(9, PS));
            let got = exchange(7, 2, reply, chunk).expect("a run");
            assert!(got[..PS].iter().all(|&b| b == 0), "null reads zeros");
            assert!(got[PS..].iter().all(|&b| b == 9));
        }
    }

    #[test]
    fn anything_but_a_page_or_null_is_an_error() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (bulk(1, PS - 1), "holds 63 bytes"),
            (b"-ERR no\r\n".to_vec(), "no"),
            (b":5\r\n".to_vec(), "not a string"),
            (b"$x\r\n".to_vec(), "not a number"),
            (b"$64\n".to_vec(), "without CRLF"),
            (
                {
                    let mut v = bulk(1, PS);
                    v.truncate(v.len() - 2);
                    v.extend_from_slice(b"XY");
                    v
                },
                "not followed by CRLF",
            ),
            (
                {
                    let mut v = bulk(1, PS);
                    v.extend_from_slice(b"+extra\r\n");
                    v
                },
                "after the reply",
            ),
            (b"$64\r\nshort".to_vec(), "closed"),
            (b"\r\n".to_vec(), "without CRLF"),
            (b"\n".to_vec(), "without CRLF"),
        ];
        for (reply, says) in cases {
            let shown = String::from_utf8_lossy(&reply).into_owned();
            let err = exchange(7, 1, reply, 4096).expect_err(&shown);
            assert!(err.to_string().contains(says), "{shown:?}: {err}");
        }
        let err = exchange(7, 2, b"*3\r\n".to_vec(), 4096).expect_err("3 values for 2");
        assert!(err.to_string().contains("wrong reply"), "{err}");
    }

    #[test]
    fn a_line_longer_than_the_limit_is_refused() {
        let mut reply = b"-ERR ".to_vec();
        reply.extend(std::iter::repeat_n(b'x', LINE_MAX + 10));
        reply.extend_from_slice(b"\r\n");
        let err = exchange(7, 1, reply, 1000).expect_err("too long");
        assert!(err.to_string().contains("too long"), "{err}");
    }
}
