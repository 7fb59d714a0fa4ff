//! A real Redis Cluster: `masters x (1 + replicas)` servers started with
//! `--cluster-enabled yes` (node timeout 1 s, so a failover takes about two
//! seconds), joined by `redis-cli --cluster create`, and waited on until
//! every slot is served and every replica is attached. Killing a master
//! ([`Cluster::kill_master`]) and waiting for its replica to take over
//! ([`Cluster::wait_ok`]) is what the failover tests drive.

use crate::{HarnessError, Server};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the cluster has to form, or to recover after a failover.
const FORM_WAIT: Duration = Duration::from_secs(30);

/// A running cluster; every node is stopped on drop.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<Server>,
    masters: usize,
    replicas: usize,
}

/// One line of `CLUSTER NODES`: port, master or not, and flags.
#[derive(Debug, Clone)]
struct NodeLine {
    port: u16,
    master: bool,
    failing: bool,
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let addr = f.get(1)?;
            let port = addr.split([':', '@']).nth(1)?.parse().ok()?;
            let flags = f.get(2)?;
            Some(NodeLine {
                port,
                master: flags.contains("master"),
                failing: flags.contains("fail"),
            })
        })
        .collect()
}

impl Cluster {
    /// Starts `masters` masters with `replicas` replicas each.
    ///
    /// # Errors
    /// [`HarnessError::Missing`] without `redis-server` or `redis-cli`;
    /// the others if the cluster does not form in time.
    pub fn start(masters: usize, replicas: usize) -> Result<Cluster, HarnessError> {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
        ];
        let nodes = (0..masters * (1 + replicas))
            .map(|_| Server::launch(args.iter().map(|s| s.to_string()).collect(), true))
            .collect::<Result<Vec<_>, _>>()?;
        let c = Cluster {
            nodes,
            masters,
            replicas,
        };
        c.create()?;
        c.wait_ok()?;
        Ok(c)
    }

    fn create(&self) -> Result<(), HarnessError> {
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())))
            .args(["--cluster-replicas", &self.replicas.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => HarnessError::Missing {
                    program: "redis-cli",
                    why: "it went away after the harness found it".into(),
                },
                _ => HarnessError::Io {
                    what: "running redis-cli --cluster create".into(),
                    source: e,
                },
            })?;
        if !out.status.success() {
            return Err(HarnessError::NotReady(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        Ok(())
    }

    /// `redis://127.0.0.1:<port>/` of every node (killed ones too).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// The process ids of the running nodes, masters and replicas.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(Server::pid).collect()
    }

    fn node_lines(&self) -> Result<Vec<NodeLine>, HarnessError> {
        let mut last = None;
        for n in self.nodes.iter().filter(|n| n.running()) {
            let got = n.connection().and_then(|mut c| {
                redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query::<String>(&mut c)
                    .map_err(|source| HarnessError::Redis {
                        what: "CLUSTER NODES".into(),
                        source,
                    })
            });
            match got {
                Ok(text) => return Ok(parse_nodes(&text)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::NotReady("no node is running".into())))
    }

    /// Whether every running node says `cluster_state:ok` and, if it is a
    /// replica, that its link to its master is up (a replica that has not
    /// finished its first sync would never be promoted: its data is too
    /// old), and the masters are `masters` live nodes.
    fn healthy(&self) -> bool {
        let info = |n: &Server, what: &[&str]| {
            n.connection().ok().and_then(|mut c| {
                redis::cmd(what[0])
                    .arg(&what[1..])
                    .query::<String>(&mut c)
                    .ok()
            })
        };
        let states_ok = self.nodes.iter().filter(|n| n.running()).all(|n| {
            info(n, &["CLUSTER", "INFO"]).is_some_and(|s| s.contains("cluster_state:ok"))
                && info(n, &["INFO", "replication"]).is_some_and(|s| {
                    s.contains("role:master") || s.contains("master_link_status:up")
                })
        });
        let Ok(lines) = self.node_lines() else {
            return false;
        };
        let live = |l: &&NodeLine| {
            !l.failing && self.nodes.iter().any(|n| n.port() == l.port && n.running())
        };
        let masters = lines.iter().filter(|l| l.master).filter(live).count();
        let replicas = lines.iter().filter(|l| !l.master).filter(live).count();
        states_ok && masters == self.masters && replicas >= self.running_replicas_wanted()
    }

    fn running_replicas_wanted(&self) -> usize {
        let running = self.nodes.iter().filter(|n| n.running()).count();
        running.saturating_sub(self.masters)
    }

    /// Waits until every slot is served by a live master and every running
    /// node agrees the cluster is ok (after start, or after a failover).
    ///
    /// # Errors
    /// [`HarnessError::NotReady`] after 30 s.
    pub fn wait_ok(&self) -> Result<(), HarnessError> {
        let t = Instant::now();
        while t.elapsed() < FORM_WAIT {
            if self.healthy() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(HarnessError::NotReady(format!(
            "the cluster was not ok within {FORM_WAIT:?}"
        )))
    }

    /// Kills one live master (`SIGKILL`); its replica is promoted within a
    /// few seconds ([`Cluster::wait_ok`]). Returns the killed node's port.
    ///
    /// # Errors
    /// If no node answers `CLUSTER NODES`.
    pub fn kill_master(&mut self) -> Result<u16, HarnessError> {
        let lines = self.node_lines()?;
        let port = lines
            .iter()
            .find(|l| l.master && !l.failing)
            .map(|l| l.port)
            .ok_or_else(|| HarnessError::NotReady("no live master".into()))?;
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port() == port) {
            n.kill();
        }
        Ok(port)
    }

    /// Starts a killed node again; it rejoins as a replica.
    ///
    /// # Errors
    /// As [`Server::restart`].
    pub fn restart(&mut self, port: u16) -> Result<(), HarnessError> {
        match self.nodes.iter_mut().find(|n| n.port() == port) {
            Some(n) => n.restart(),
            None => Err(HarnessError::NotReady(format!("no node on port {port}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes() {
        let text = "07c3 127.0.0.1:30004@40004 slave e7d1 0 1 4 connected\n\
                    67ed 127.0.0.1:30002@40002 master - 0 1 2 connected 5461-10922\n\
                    292f 127.0.0.1:30003@40003 master,fail - 0 1 3 disconnected\n";
        let l = parse_nodes(text);
        assert_eq!(l.len(), 3);
        assert_eq!(
            (l[0].port, l[0].master, l[0].failing),
            (30004, false, false)
        );
        assert_eq!((l[1].port, l[1].master, l[1].failing), (30002, true, false));
        assert_eq!((l[2].port, l[2].master, l[2].failing), (30003, true, true));
    }
}
