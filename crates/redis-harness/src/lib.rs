//! Real Redis for faultline's tests and benchmarks: a [`Server`] is one
//! `redis-server` process on a free 127.0.0.1 port (`--save ''
//! --appendonly no`, its own scratch directory), a [`Cluster`] is
//! `masters` of them plus `replicas` per master joined with `redis-cli
//! --cluster create`. Both stop their processes and remove their
//! directories on drop, so tests running in parallel share nothing.
//!
//! A missing `redis-server` is installed (`provision.rs`: Debian's package,
//! as root); where it cannot be, the error says so ([`HarnessError::
//! Missing`]): a test that needs Redis fails with that reason, it never
//! passes silently.
//!
//! Ports: the kernel picks a free port (a bound-then-closed listener); the
//! server is then started on it and, if another process took it meanwhile,
//! started again on another. A cluster node also needs `port + 10000` (its
//! bus port) free, so cluster ports are drawn below 55536.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Why a server or cluster could not be started or driven.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A program the harness runs is not installed, and could not be.
    #[error("this needs `{program}`, which is not on PATH: {why}")]
    Missing {
        /// The program.
        program: &'static str,
        /// Why it could not be installed (or what went wrong running it).
        why: String,
    },
    /// An I/O error starting or talking to a process.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A server or cluster did not reach the expected state in time.
    #[error("{0}")]
    NotReady(String),
    /// A Redis command failed.
    #[error("{what}: {source}")]
    Redis {
        /// The command.
        what: String,
        /// The cause.
        #[source]
        source: redis::RedisError,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let what = what.into();
    move |source| HarnessError::Io { what, source }
}

/// The variable naming the directory servers keep their scratch
/// directories in (default: the temporary directory).
pub const DIR_ENV: &str = "REDIS_HARNESS_DIR";

/// How long a server has to answer `PING` after it starts.
const START_WAIT: Duration = Duration::from_secs(10);

/// One `redis-server` process on 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct Server {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// A port the kernel says is free now; with `bus`, `port + 10000` is too.
fn free_port(bus: bool) -> Result<u16, HarnessError> {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(io("binding a probe listener"))?;
        let port = l.local_addr().map_err(io("probe listener address"))?.port();
        if !bus {
            return Ok(port);
        }
        if port < 55536 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return Ok(port);
        }
    }
    Err(HarnessError::NotReady("no free port pair found".into()))
}

impl Server {
    /// Starts a plain server (no persistence) on a free port.
    ///
    /// # Errors
    /// [`HarnessError::Missing`] without `redis-server`; the others if it
    /// does not start.
    pub fn start() -> Result<Server, HarnessError> {
        Server::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g.
    /// `["--maxmemory-policy", "allkeys-lru"]`).
    ///
    /// # Errors
    /// As [`Server::start`].
    pub fn start_with(extra: &[&str]) -> Result<Server, HarnessError> {
        Server::launch(extra.iter().map(|s| s.to_string()).collect(), false)
    }

    fn launch(extra: Vec<String>, bus: bool) -> Result<Server, HarnessError> {
        provision::ensure()?;
        // In the temporary directory, or where the caller's environment
        // says (a test's child process, which may die without dropping its
        // servers, keeps them in a directory its parent removes).
        let base = std::env::var_os(DIR_ENV).map_or_else(std::env::temp_dir, PathBuf::from);
        let dir = base.join(format!(
            "faultline-redis-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        let mut last = None;
        for _ in 0..5 {
            // Made anew for every try: a failed try's server, dropped,
            // removes it (before, the retries after a lost port race all
            // started redis-server in a directory that was gone, and each
            // exited at once).
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
            let mut s = Server {
                port: free_port(bus)?,
                dir: dir.clone(),
                extra: extra.clone(),
                child: None,
            };
            match s.spawn() {
                Ok(()) => return Ok(s),
                Err(e @ HarnessError::Missing { .. }) => return Err(e),
                Err(e) => last = Some(e), // the port was taken meanwhile
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::NotReady("redis-server did not start".into())))
    }

    fn spawn(&mut self) -> Result<(), HarnessError> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => HarnessError::Missing {
                    program: "redis-server",
                    why: "it went away after the harness found it".into(),
                },
                _ => HarnessError::Io {
                    what: "starting redis-server".into(),
                    source: e,
                },
            })?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until this server's own child answers on its port. A child
    /// that exited (its port taken meanwhile) is an error even if the port
    /// answers: the answer is another test's server's. So is an answer
    /// from a server whose process is not the child.
    fn wait_ready(&mut self) -> Result<(), HarnessError> {
        let t = Instant::now();
        while t.elapsed() < START_WAIT {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Err(HarnessError::NotReady(format!(
                        "redis-server on port {} exited at start: {status}",
                        self.port
                    )));
                }
            }
            if let Ok(pid) = self.process_id() {
                let ours = self.child.as_ref().map(|c| c.id());
                if Some(pid) == ours {
                    return Ok(());
                }
                return Err(HarnessError::NotReady(format!(
                    "port {} answers as redis-server process {pid}, not this one ({ours:?}): taken by another server",
                    self.port
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(HarnessError::NotReady(format!(
            "redis-server on port {} did not answer PING within {START_WAIT:?}",
            self.port
        )))
    }

    /// `PING`s the server.
    ///
    /// # Errors
    /// The connection's or the command's.
    pub fn ping(&self) -> Result<(), HarnessError> {
        let mut c = self.connection()?;
        redis::cmd("PING")
            .query::<String>(&mut c)
            .map(drop)
            .map_err(|source| HarnessError::Redis {
                what: format!("PING 127.0.0.1:{}", self.port),
                source,
            })
    }

    /// The process id the server on this port reports (`INFO server`).
    fn process_id(&self) -> Result<u32, HarnessError> {
        let mut c = self.connection()?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut c)
            .map_err(|source| HarnessError::Redis {
                what: format!("INFO server on 127.0.0.1:{}", self.port),
                source,
            })?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                HarnessError::NotReady(format!(
                    "INFO server on 127.0.0.1:{} has no process_id",
                    self.port
                ))
            })
    }

    /// A fresh connection to the server (1 s connect timeout).
    ///
    /// # Errors
    /// If the server does not accept it.
    pub fn connection(&self) -> Result<redis::Connection, HarnessError> {
        let redis_err = |source| HarnessError::Redis {
            what: format!("connecting to {}", self.url()),
            source,
        };
        redis::Client::open(self.url())
            .map_err(redis_err)?
            .get_connection_with_timeout(Duration::from_secs(1))
            .map_err(redis_err)
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its scratch directory (removed with the server): a test may keep
    /// its own files there too.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The process id of the running server (`None` once killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (not killed by [`Server::kill`]).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the process (`SIGKILL`) and reaps it; the port is free after.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the process again on the same port and directory (with no
    /// persistence it comes back empty, unless it is a cluster node, which
    /// keeps its `nodes.conf` and rejoins as a replica of whoever took over).
    ///
    /// # Errors
    /// As [`Server::start`] (the port may have been taken meanwhile).
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill();
        self.spawn()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

mod cluster;
mod provision;

pub use cluster::Cluster;
pub use provision::ensure as ensure_installed;
pub use provision::{ensure_package, find as find_program};
