//! The `sqlite3` side of `bench preload`: finding the CLI, building the
//! database, the lookup query, one `sqlite3` run inside a fresh memory
//! cgroup, and reading what it printed.

use super::super::cgroup;
use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bytes of database per row: a 900..1099-byte blob (1000 on average)
/// and its cell, at 3.6 rows to a 4 KiB page (measured with SQLite 3.40).
pub const BYTES_PER_ROW: u64 = 1138;

/// The largest mapping SQLite makes (the default `SQLITE_MAX_MMAP_SIZE`,
/// 0x7fff0000, which Debian keeps): a larger file is read partly with
/// `read`, so the database must stay below it.
pub const MAX_MMAP: u64 = 0x7fff_0000;

/// The `sqlite3` command-line program.
pub struct Sqlite {
    pub bin: PathBuf,
    pub version: String,
}

impl Sqlite {
    /// `/usr/bin/sqlite3`, else `sqlite3` on `PATH`; its version.
    pub fn find() -> anyhow::Result<Sqlite> {
        let on_path = std::env::var_os("PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("sqlite3"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let Some(bin) = std::iter::once(PathBuf::from("/usr/bin/sqlite3"))
            .chain(on_path)
            .find(|p| p.is_file())
        else {
            bail!(
                "sqlite3 not found (not /usr/bin/sqlite3, not on PATH): the bench runs the real \
                 sqlite3 command-line program; install it with `apt-get install sqlite3`"
            );
        };
        let out = Command::new(&bin)
            .arg("-version")
            .env_remove("LD_PRELOAD")
            .output()
            .with_context(|| format!("running {} -version", bin.display()))?;
        let version = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("unknown")
            .to_string();
        Ok(Sqlite { bin, version })
    }

    /// Runs `sqlite3 <args>` here (no cgroup, no preload); its stdout.
    pub fn run_plain(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.bin)
            .args(args)
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.bin.display()))?;
        if !out.status.success() || !out.stderr.is_empty() {
            bail!(
                "{} {}: {}: {}",
                self.bin.display(),
                shell_words(args),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Builds `db`: table `t(k INTEGER PRIMARY KEY, v BLOB)`, keys
    /// 1..=`rows`, each value `randomblob` of 900..1099 bytes; 4 KiB pages,
    /// no journal. Returns the file's size.
    pub fn build(&self, db: &Path, rows: u64) -> anyhow::Result<u64> {
        let path = db.display().to_string();
        let insert = format!(
            "INSERT INTO t(k, v) SELECT value, randomblob(900 + abs(random()) % 200) \
             FROM generate_series(1, {rows})"
        );
        self.run_plain(&[
            &path,
            "PRAGMA page_size=4096",
            "PRAGMA journal_mode=OFF",
            "PRAGMA synchronous=OFF",
            "CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB)",
            &insert,
        ])
        .context("building the database")?;
        Ok(std::fs::metadata(db)?.len())
    }

    /// Checks with `EXPLAIN QUERY PLAN` that `sql` is a scan of the key
    /// generator and one rowid lookup in `t` per key, not a scan of `t`.
    pub fn check_plan(&self, db: &Path, sql: &str) -> anyhow::Result<String> {
        let plan = self.run_plain(&[
            &db.display().to_string(),
            &format!("EXPLAIN QUERY PLAN {sql}"),
        ])?;
        let lookup = plan
            .lines()
            .any(|l| l.contains("SEARCH t USING INTEGER PRIMARY KEY (rowid=?)"));
        let scan_t = plan.lines().any(|l| l.contains("SCAN t"));
        let materialized = plan.contains("MATERIALIZE");
        if !lookup || scan_t || materialized {
            bail!(
                "the lookup query is not one rowid lookup per generated key (sqlite3 {}):\n{plan}",
                self.version
            );
        }
        Ok(plan
            .lines()
            .filter(|l| !l.starts_with("QUERY PLAN"))
            .map(|l| l.trim_start_matches(['|', '`', '-', ' ']))
            .collect::<Vec<_>>()
            .join("; "))
    }
}

/// The lookup query: `n` keys, each a hash of 1..=n (deterministic, so
/// every setup must print the same sums), spread over 1..=`rows`, each
/// joined against `t`'s INTEGER PRIMARY KEY. Prints the rows found, the
/// bytes of their values and the offsets of each value's first zero byte
/// (reads the value itself). `generate_series` makes the keys one at a time
/// (a recursive CTE would be materialized first, into memory the setups
/// share). The hash: Fibonacci hashing, then xorshift-multiply
/// (`lowbias32`'s first rounds) with XOR as `(a|b)-(a&b)`; every product
/// stays below 2^63 (SQLite turns an overflowing product into a float).
pub fn lookup_sql(n: u64, rows: u64) -> String {
    let a = "value * 2654435761 % 4294967296";
    format!(
        "SELECT count(*), sum(length(v)), sum(instr(v, x'00')) FROM \
         (SELECT 1 + ((b | (b >> 15)) - (b & (b >> 15))) % {rows} AS key FROM \
         (SELECT ((a | (a >> 16)) - (a & (a >> 16))) * 2146121005 % 4294967296 AS b FROM \
         (SELECT {a} AS a FROM generate_series(1, {n})))) \
         JOIN t ON t.k = key"
    )
}

/// One `sqlite3` invocation: the environment it adds, whether it runs
/// under the preload, and its arguments.
pub struct Invocation {
    pub preload: Option<PathBuf>,
    pub env: Vec<(&'static str, String)>,
    pub args: Vec<String>,
}

/// What a finished run printed, and what its cgroup saw.
pub struct RunOut {
    pub stdout: String,
    pub stderr: String,
    /// From "go" (just before `exec sqlite3`) to its exit.
    pub process_s: f64,
    pub peak: Option<usize>,
}

/// Environment variables a run must not inherit from the bench.
const CLEARED: [&str; 8] = [
    "LD_PRELOAD",
    "FAULTLINE_FILES",
    "FAULTLINE_BUDGET",
    "FAULTLINE_PRELOAD_REPORT",
    "FAULTLINE_BENCH_PRELOAD",
    "FAULTLINE_FAULT_MODE",
    "FAULTLINE_WORKERS",
    "FAULTLINE_ANON_MIN",
];

/// The shell that holds the run until it is in its cgroup: it waits for
/// "go" on stdin, then sets `LD_PRELOAD` (only now, so the shell itself
/// runs without the preload) and becomes `sqlite3`.
const WRAPPER: &str = "read -r go || exit 97; \
    if [ -n \"$FAULTLINE_BENCH_PRELOAD\" ]; then LD_PRELOAD=$FAULTLINE_BENCH_PRELOAD; export LD_PRELOAD; fi; \
    unset FAULTLINE_BENCH_PRELOAD; exec \"$@\"";

impl Invocation {
    /// The command line as a shell would take it.
    pub fn display(&self, sqlite: &Sqlite) -> String {
        let mut words: Vec<String> = Vec::new();
        if let Some(p) = &self.preload {
            words.push(format!("LD_PRELOAD={}", quote(&p.display().to_string())));
        }
        for (k, v) in &self.env {
            words.push(format!("{k}={}", quote(v)));
        }
        words.push(quote(&sqlite.bin.display().to_string()));
        words.extend(self.args.iter().map(|a| quote(a)));
        words.join(" ")
    }

    /// Runs it in a fresh memory cgroup of `limit` bytes, page cache
    /// dropped first; fails if it exits with an error, is killed, or runs
    /// past `timeout` (then killed), naming the command and its stderr.
    pub fn run(&self, sqlite: &Sqlite, limit: usize, timeout: Duration) -> anyhow::Result<RunOut> {
        cgroup::drop_caches()?;
        let cg = cgroup::new_cgroup(limit)?;
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(WRAPPER)
            .arg("faultline-bench-preload")
            .arg(&sqlite.bin)
            .args(&self.args);
        for k in CLEARED {
            cmd.env_remove(k);
        }
        if let Some(p) = &self.preload {
            cmd.env("FAULTLINE_BENCH_PRELOAD", p);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting /bin/sh")?;
        if let Err(e) = cg.add(child.id()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.into());
        }
        let drain = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut s = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut s);
                }
                String::from_utf8_lossy(&s).into_owned()
            })
        };
        let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
        let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
        let start = Instant::now();
        child
            .stdin
            .take()
            .context("the run's stdin")?
            .write_all(b"go\n")?;
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break Some(s);
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let process_s = start.elapsed().as_secs_f64();
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        let oom_kills = cg.oom_kills().unwrap_or(0);
        let what = || {
            format!(
                "{} (in a {} MiB {} memory cgroup, page cache dropped first)",
                self.display(sqlite),
                limit >> 20,
                cg.version()
            )
        };
        let Some(status) = status else {
            bail!(
                "hung: still running after {:.0} s, killed: {}\nstderr: {}",
                timeout.as_secs_f64(),
                what(),
                tail(&stderr)
            );
        };
        if !status.success() {
            let oom = match oom_kills {
                0 => String::new(),
                n => format!(" ({n} OOM kill(s) in its cgroup)"),
            };
            bail!(
                "failed: {status}{oom}: {}\nstderr: {}",
                what(),
                tail(&stderr)
            );
        }
        Ok(RunOut {
            stdout,
            stderr,
            process_s,
            peak: cg.peak(),
        })
    }
}

/// The last lines of `text` (at most 20), for an error.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(20);
    match lines[from..].join("\n") {
        s if s.is_empty() => "(empty)".into(),
        s => s,
    }
}

/// `s` quoted for a POSIX shell where it needs to be.
fn quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+%@".contains(&b));
    if plain {
        s.into()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn shell_words(args: &[&str]) -> String {
    args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

/// What a lookup run printed: `PRAGMA mmap_size`'s answer (the mapping
/// size SQLite will use), the query's result line, and `.timer`'s real
/// seconds for the query.
#[derive(Debug, PartialEq)]
pub struct Printed {
    pub mmap_size: Option<u64>,
    pub result: String,
    pub query_s: f64,
}

/// Reads a lookup run's stdout (see [`Printed`]).
pub fn parse_stdout(stdout: &str) -> anyhow::Result<Printed> {
    let mut lines = stdout.lines();
    let mmap_size = lines.next().and_then(|l| l.trim().parse().ok());
    let result = stdout
        .lines()
        .find(|l| l.matches('|').count() == 2)
        .map(str::to_string);
    let query_s = stdout.lines().find_map(|l| {
        l.strip_prefix("Run Time: real ")?
            .split_whitespace()
            .next()?
            .parse::<f64>()
            .ok()
    });
    match (result, query_s) {
        (Some(result), Some(query_s)) => Ok(Printed {
            mmap_size,
            result,
            query_s,
        }),
        _ => bail!("sqlite3 printed no result line and .timer line: {stdout:?}"),
    }
}

/// The most heap SQLite held, from `.stats on`'s last `Memory Used: <now>
/// (max <max>) bytes` line.
pub fn parse_heap_max(stdout: &str) -> Option<usize> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Memory Used:"))?;
    line.split_once("(max ")?
        .1
        .split(')')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The preload's exit report, `faultline-preload: regions=<n> faults=<f>
/// ...`, as (key, value) pairs; `None` if stderr has no such line.
pub fn parse_report(stderr: &str) -> Option<Vec<(String, String)>> {
    let line = stderr
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("faultline-preload: "))?;
    let pairs: Vec<(String, String)> = line
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    pairs.iter().any(|(k, _)| k == "regions").then_some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_sqlite3_prints() {
        let out = "2097152000\n1000|999632526|230786497\nRun Time: real 2.533 user 1.759303 sys 0.007705\n";
        assert_eq!(
            parse_stdout(out).ok(),
            Some(Printed {
                mmap_size: Some(2_097_152_000),
                result: "1000|999632526|230786497".into(),
                query_s: 2.533
            })
        );
        let no_mmap = "0\n5|10|20\nRun Time: real 0.5 user 0.1 sys 0.1\n";
        assert_eq!(
            parse_stdout(no_mmap).ok().and_then(|p| p.mmap_size),
            Some(0)
        );
        assert!(parse_stdout("0\n").is_err());
    }

    #[test]
    fn reads_the_heap_high_water() {
        let out = "0\n5|10|20\nMemory Used:                         69290216 (max 69293192) bytes\n\
                   Number of Outstanding Allocations:   15893 (max 15894)\nRun Time: real 1.0 user 0 sys 0\n";
        assert_eq!(parse_heap_max(out), Some(69_293_192));
        assert_eq!(parse_heap_max("0\n"), None);
    }

    #[test]
    fn reads_the_preload_report() {
        let err = "warning: x\nfaultline-preload: regions=1 faults=10 fills=9 written_back=0 evicted=3 budget=64M\n";
        let r = parse_report(err).unwrap_or_default();
        assert_eq!(r.len(), 6);
        assert_eq!(r[0], ("regions".into(), "1".into()));
        assert_eq!(r[5], ("budget".into(), "64M".into()));
        assert!(parse_report("faultline-preload: loaded\n").is_none());
        assert!(parse_report("").is_none());
    }

    #[test]
    fn quotes_for_a_shell() {
        assert_eq!(quote("/var/tmp/a.db"), "/var/tmp/a.db");
        assert_eq!(quote("PRAGMA mmap_size=1"), "'PRAGMA mmap_size=1'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_query_stays_in_integers() {
        // SQLite's integers are i64: key i (up to 10^9) times the first
        // multiplier, a 32-bit value times the second.
        let max_i: i64 = 1_000_000_000;
        assert!(max_i.checked_mul(2_654_435_761).is_some());
        assert!(((1i64 << 32) - 1).checked_mul(2_146_121_005).is_some());
        let q = lookup_sql(1000, 500);
        assert!(q.contains("generate_series(1, 1000)") && q.contains("% 500 AS key"));
    }
}
