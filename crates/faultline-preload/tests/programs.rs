//! Issue 41's proof on real, unmodified programs: `sqlite3` and LMDB's
//! `mdb_load` / `mdb_dump` / `mdb_stat` run under
//! `LD_PRELOAD=libfaultline_preload.so`, their database files served by
//! faultline under a 16 MiB budget, each file several times the budget.
//! Every run's answer is checked against the same program on the kernel's
//! mmap (or against the input it loaded), and every preloaded run's report
//! line must show that the library served the mapping (`regions>0`: a test
//! never passes because everything silently went to the kernel) and, where
//! the data is larger than the budget, evicted pages. sqlite3 also writes
//! through the preload (the result, a fresh process's view and
//! `PRAGMA integrity_check` checked, the file compared with the kernel's),
//! and runs in a memory cgroup whose peak must stay near the budget. LMDB's
//! commits are checked after a clean exit and after `kill -9`.
//!
//! Each scenario runs the program in child processes, in a scratch
//! directory of its own; the programs are installed from Debian's
//! packages where missing. The tests need root (userfaultfd, memory
//! cgroups) and fail without it.

mod common;

use common::{
    ensure_programs, need_root, no_preload, preload, run, run_in_cgroup, Ran, Report, Scratch, MIB,
};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The budget every preloaded run gets.
const BUDGET: usize = 16 * MIB;
const BUDGET_ENV: &str = "16M";
/// A hang guard for one program run (a debug-build library included).
const LIMIT: Duration = Duration::from_secs(120);

/// The checks every preloaded run's report must pass: the mapping was
/// served (`regions >= 1`, pages filled), the budget is the one asked
/// for, and no other `faultline-preload:` line (a configuration error
/// would send the program to the kernel's mmap) was printed.
fn served(ran: &Ran, what: &str) -> Report {
    let r = ran.report(what);
    println!("{what}: {r:?} in {:.2?}", ran.took);
    assert!(
        r.regions >= 1,
        "{what}: the preload served no mapping: {r:?}; stderr:\n{}",
        ran.stderr
    );
    assert!(
        r.fills > 0,
        "{what}: no page was filled from the file: {r:?}"
    );
    assert_eq!(
        r.budget, BUDGET as u64,
        "{what}: the budget asked for: {r:?}"
    );
    let other = common::other_preload_lines(&ran.stderr);
    assert!(
        other.is_empty(),
        "{what}: the preload complained: {other:?}"
    );
    r
}

// ---------------------------------------------------------------- sqlite3

/// `PRAGMA mmap_size` large enough to map every database here whole.
const MMAP_ON: &str = "PRAGMA mmap_size=1073741824";

/// Rows of the table: 1,000-byte blobs, about 136 MB of file (8.1 times
/// the budget).
const ROWS: usize = 133_000;

/// The read-only queries: point lookups, a count, sums over columns (one
/// of them reading every byte of every blob) and range scans: two full
/// scans of the table.
const READ_QUERIES: &str = "\
SELECT k, hex(substr(v, 1, 8)), n FROM t WHERE k IN (1, 777, 4242, 65536, 100003, 132999);
SELECT count(*) FROM t;
SELECT sum(n), sum(length(v)), sum(instr(hex(v), 'ABC')) FROM t;
SELECT k, n, hex(substr(v, 993, 8)) FROM t WHERE k BETWEEN 90000 AND 90040;
SELECT count(*), sum(n), hex(max(v)) FROM t WHERE k BETWEEN 20000 AND 30000;";

/// `sqlite3 -batch -bail -cmd <pragma>... <db> <sql>`, on the kernel's
/// mmap unless the caller adds the preload.
fn sqlite3(pragmas: &[&str], db: &Path, sql: &str) -> Command {
    let mut cmd = Command::new("sqlite3");
    cmd.args(["-batch", "-bail"]);
    for p in pragmas {
        cmd.args(["-cmd", p]);
    }
    cmd.arg(db).arg(sql);
    no_preload(&mut cmd);
    cmd
}

/// Builds the table `t(k INTEGER PRIMARY KEY, v BLOB, n INTEGER)` of
/// [`ROWS`] rows at `db` on the kernel's mmap (random 1,000-byte blobs,
/// `n = k*7919 mod 1000`), and checks that the file is at least 8 times
/// the budget.
fn build_database(db: &Path) {
    ensure_programs("sqlite3", &["sqlite3"]);
    let sql = format!(
        "PRAGMA page_size=4096;
         CREATE TABLE t(k INTEGER PRIMARY KEY, v BLOB, n INTEGER);
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < {ROWS})
         INSERT INTO t SELECT i, randomblob(1000), (i * 7919) % 1000 FROM c;"
    );
    let t0 = Instant::now();
    run("building the database", &mut sqlite3(&[], db, &sql), LIMIT)
        .expect_success("building the database (sqlite3, no preload)");
    let size = std::fs::metadata(db).expect("the database file").len() as usize;
    assert!(
        size >= 8 * BUDGET,
        "the database is {size} bytes, less than 8 times the budget"
    );
    println!(
        "database: {:.1} MiB built in {:.2?}",
        size as f64 / MIB as f64,
        t0.elapsed()
    );
}

/// The pattern that serves the `.db` files of `dir` (and nothing else:
/// not the `-journal` beside them).
fn db_pattern(dir: &Scratch) -> String {
    format!("{}/*.db", dir.path().display())
}

/// sqlite3 reads a database 8 times the budget through its mmap: the same
/// queries give the same output on the kernel's mmap and under the
/// preload, and the preload evicted pages.
#[test]
fn sqlite3_reads_a_database_eight_times_the_budget() {
    need_root();
    let dir = Scratch::new("sqlite-read");
    let db = dir.join("big.db");
    build_database(&db);
    let kernel = run(
        "sqlite3 queries on the kernel's mmap",
        &mut sqlite3(&[MMAP_ON], &db, READ_QUERIES),
        LIMIT,
    );
    kernel.expect_success("sqlite3 queries on the kernel's mmap");
    let text = kernel.stdout_text();
    assert!(
        text.lines().any(|l| l == ROWS.to_string()),
        "count(*) is {ROWS}: {text}"
    );
    let mut cmd = sqlite3(&[MMAP_ON], &db, READ_QUERIES);
    preload(&mut cmd, &db_pattern(&dir), BUDGET_ENV);
    let ran = run("sqlite3 queries under the preload", &mut cmd, LIMIT);
    ran.expect_success("sqlite3 queries under the preload");
    println!("kernel: {:.2?}, preload: {:.2?}", kernel.took, ran.took);
    assert!(
        ran.stdout == kernel.stdout,
        "the preloaded sqlite3 answered differently ({}):\nkernel:\n{text}\npreload:\n{}",
        common::first_difference(&kernel.stdout, &ran.stdout),
        ran.stdout_text()
    );
    let r = served(&ran, "sqlite3 queries under the preload");
    assert!(
        r.evicted > 0,
        "136 MB through a 16 MiB budget evicted nothing: {r:?}"
    );
}

/// Inserts (the file grows, sqlite remaps it), updates scattered over the
/// whole table and deletes, in one transaction.
const WRITES: &str = "\
BEGIN;
WITH RECURSIVE c(i) AS (SELECT 200001 UNION ALL SELECT i + 1 FROM c WHERE i < 215000)
INSERT INTO t SELECT i, CAST(printf('%.*c', 900, char(65 + i % 26)) AS BLOB), i % 1000 FROM c;
UPDATE t SET n = n + 1000000, v = CAST(printf('%.*c', 1000, 'u') AS BLOB) WHERE k % 97 = 0;
DELETE FROM t WHERE k % 1009 = 0;
COMMIT;";

/// What the writes are checked with.
const CHECKS: &str = "\
SELECT count(*), sum(n), sum(length(v)) FROM t;
SELECT k, n, hex(substr(v, 1, 4)) FROM t WHERE k IN (97, 970, 1009, 2018, 133000, 200001, 207777, 215000);
SELECT sum(instr(hex(v), 'ABC')) FROM t;
SELECT count(*), sum(n) FROM t WHERE k BETWEEN 199000 AND 216000;
PRAGMA integrity_check;";

/// sqlite3 writes through the preload (its mapping on, its writes by
/// `pwrite` into the mapped file, which grows and is remapped): the
/// queries in the same process, after the commit, answer as the same
/// writes and queries do on the kernel's mmap over a copy of the
/// database; a fresh process without the preload answers the same;
/// `PRAGMA integrity_check` says ok; and the two files are byte for byte
/// the same. The preloaded run opens the database by a relative path
/// (from its directory): the library matches the resolved path.
#[test]
fn sqlite3_writes_through_the_preload() {
    need_root();
    let dir = Scratch::new("sqlite-write");
    let db = dir.join("w.db");
    build_database(&db);
    let oracle_db = dir.join("oracle.sqlite");
    std::fs::copy(&db, &oracle_db).expect("copying the database for the oracle");
    let sql = format!("{WRITES}\n{CHECKS}");
    let oracle = run(
        "sqlite3 writes on the kernel's mmap",
        &mut sqlite3(&[MMAP_ON], &oracle_db, &sql),
        LIMIT,
    );
    oracle.expect_success("sqlite3 writes on the kernel's mmap (the oracle)");
    let oracle_text = oracle.stdout_text();
    assert!(
        oracle_text.lines().any(|l| l == "ok"),
        "integrity_check of the oracle: {oracle_text}"
    );

    let mut cmd = sqlite3(&[MMAP_ON], Path::new("w.db"), &sql);
    cmd.current_dir(dir.path());
    preload(&mut cmd, &db_pattern(&dir), BUDGET_ENV);
    let ran = run("sqlite3 writes under the preload", &mut cmd, LIMIT);
    ran.expect_success("sqlite3 writes under the preload");
    assert!(
        ran.stdout == oracle.stdout,
        "after its writes, the preloaded sqlite3 answered differently ({}):\n\
         kernel:\n{oracle_text}\npreload:\n{}",
        common::first_difference(&oracle.stdout, &ran.stdout),
        ran.stdout_text()
    );
    let r = served(&ran, "sqlite3 writes under the preload");
    assert!(
        r.evicted > 0,
        "136 MB through a 16 MiB budget evicted nothing: {r:?}"
    );

    let fresh = run(
        "sqlite3 checks in a fresh process without the preload",
        &mut sqlite3(&[MMAP_ON], &db, CHECKS),
        LIMIT,
    );
    fresh.expect_success("sqlite3 checks in a fresh process without the preload");
    assert!(
        fresh.stdout == oracle.stdout,
        "a fresh sqlite3 without the preload sees other data ({}):\nkernel:\n{oracle_text}\n\
         fresh:\n{}",
        common::first_difference(&oracle.stdout, &fresh.stdout),
        fresh.stdout_text()
    );
    let written = std::fs::read(&db).expect("reading the written database");
    let expected = std::fs::read(&oracle_db).expect("reading the oracle database");
    assert!(
        written == expected,
        "the database written under the preload differs from the one written on the \
         kernel's mmap by the same statements ({})",
        common::first_difference(&expected, &written)
    );
    println!(
        "writes: kernel {:.2?}, preload {:.2?}",
        oracle.took, ran.took
    );
}

/// What the library may use besides the budget and the program's own
/// memory: its fault workers' stacks, the region's page tables and the
/// fault path's tables, its statics. Measured on this machine (2 vCPU,
/// Linux 6.18, cgroup v1, the debug library; five runs): the preloaded
/// run peaked at 19.5 to 20.0 MiB where the program alone, in the same
/// run, peaked at 2.5 to 2.8 MiB, so budget and library together took
/// 16.7 to 17.2 MiB: about 1 MiB above the budget, inside its 15 %; this
/// allowance is 2 MiB more.
const LIBRARY_ALLOWANCE: usize = 2 * MIB;

/// The preloaded sqlite3 scanning a database 8 times the budget runs in
/// a memory cgroup of its own whose peak (`memory.max_usage_in_bytes` on
/// v1, `memory.peak` on v2: anonymous memory and page cache alike) must
/// stay within budget * 1.15 + the program's own memory +
/// [`LIBRARY_ALLOWANCE`]. The program's own memory is measured in the same
/// test, in a cgroup of its own: the same queries with `mmap_size=0` and a
/// 2 MB page cache (`cache_size=-2000`), the file's page cache warm and
/// charged to this process's cgroup, so that only the program's heap,
/// stack and private pages count (measured: 2.5 to 2.8 MiB). The file's
/// page cache is dropped before the mapped runs, so that page cache the
/// library brings in is charged to it. The same mapped queries on the
/// kernel's mmap must peak above the line (measured: 133.2 MiB): the
/// method sees a mapped file's pages. Figures print with `--nocapture`.
#[test]
fn sqlite3_peak_memory_stays_near_the_budget() {
    need_root();
    let dir = Scratch::new("sqlite-peak");
    let db = dir.join("peak.db");
    build_database(&db);
    let limit = 1 << 30;

    common::warm_page_cache(&db);
    let (base, base_peak) = run_in_cgroup(
        "sqlite3 without mmap (the program's own memory)",
        &mut sqlite3(
            &["PRAGMA mmap_size=0", "PRAGMA cache_size=-2000"],
            &db,
            READ_QUERIES,
        ),
        limit,
        LIMIT,
    );
    base.expect_success("sqlite3 without mmap");

    common::drop_page_cache(&db);
    let (kernel, kernel_peak) = run_in_cgroup(
        "sqlite3 on the kernel's mmap",
        &mut sqlite3(&[MMAP_ON], &db, READ_QUERIES),
        limit,
        LIMIT,
    );
    kernel.expect_success("sqlite3 on the kernel's mmap");

    common::drop_page_cache(&db);
    let mut cmd = sqlite3(&[MMAP_ON], &db, READ_QUERIES);
    preload(&mut cmd, &db_pattern(&dir), BUDGET_ENV);
    let (ran, peak) = run_in_cgroup("sqlite3 under the preload", &mut cmd, limit, LIMIT);
    ran.expect_success("sqlite3 under the preload");
    assert!(
        ran.stdout == kernel.stdout,
        "the preloaded sqlite3 answered differently ({})",
        common::first_difference(&kernel.stdout, &ran.stdout)
    );
    // The mmap-less run prints its own pragma's value first; the answers
    // after it are the same.
    let tail = |s: &[u8]| -> Vec<u8> {
        let at = s.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
        s[at..].to_vec()
    };
    assert!(
        tail(&base.stdout) == tail(&kernel.stdout),
        "sqlite3 without mmap answered differently"
    );
    let r = served(&ran, "sqlite3 under the preload (in a memory cgroup)");
    assert!(
        r.evicted > 0,
        "136 MB through a 16 MiB budget evicted nothing: {r:?}"
    );

    let line = BUDGET + BUDGET * 15 / 100 + base_peak + LIBRARY_ALLOWANCE;
    let mib = |b: usize| b as f64 / MIB as f64;
    println!(
        "peaks: program alone (no mmap) {:.1} MiB, kernel mmap {:.1} MiB, preload {:.1} MiB; \
         line = 16 MiB * 1.15 + program {:.1} MiB + library {:.1} MiB = {:.1} MiB",
        mib(base_peak),
        mib(kernel_peak),
        mib(peak),
        mib(base_peak),
        mib(LIBRARY_ALLOWANCE),
        mib(line)
    );
    assert!(
        peak <= line,
        "the preloaded sqlite3 peaked at {:.1} MiB, above budget * 1.15 + its own memory + \
         the library's allowance ({:.1} MiB)",
        mib(peak),
        mib(line)
    );
    assert!(
        kernel_peak > line,
        "the kernel's mmap peaked at {:.1} MiB, not above the line ({:.1} MiB): the \
         measurement does not see the mapped file's pages",
        mib(kernel_peak),
        mib(line)
    );
}

// ------------------------------------------------------------------- LMDB

/// The map size every environment here gets (the file grows as pages are
/// written; the mapping is this long from the start).
const MAP_SIZE: usize = 256 * MIB;
/// Bytes of a value.
const VALUE: usize = 1000;

/// The header `mdb_dump` prints for the environments here (and
/// `mdb_load` reads: `mapsize` sets the map size; it ignores
/// `db_pagesize`, with a warning).
fn dump_header() -> String {
    format!(
        "VERSION=3\nformat=bytevalue\ntype=btree\nmapsize={MAP_SIZE}\nmaxreaders=126\n\
         db_pagesize=4096\nHEADER=END\n"
    )
}

/// Records `range` in `mdb_dump`'s format (one space, the hex bytes, per
/// line; key then value): key `key<i, 8 digits>`, value [`VALUE`]
/// pseudo-random bytes of seed `i`. Keys sort as their numbers do, so a
/// dump lists them in this order.
fn records(range: std::ops::Range<usize>) -> Vec<u8> {
    use std::fmt::Write;
    let mut out = String::with_capacity(range.len() * (2 * VALUE + 32));
    for i in range {
        out.push(' ');
        for b in format!("key{i:08}").bytes() {
            let _ = write!(out, "{b:02x}");
        }
        out.push_str("\n ");
        let mut next = common::rng(i as u64 + 1);
        for _ in 0..VALUE / 8 {
            for b in next().to_le_bytes() {
                let _ = write!(out, "{b:02x}");
            }
        }
        out.push('\n');
    }
    out.into_bytes()
}

/// A whole dump: header, records `range`, end.
fn dump_of(range: std::ops::Range<usize>) -> Vec<u8> {
    let mut d = dump_header().into_bytes();
    d.extend(records(range));
    d.extend_from_slice(b"DATA=END\n");
    d
}

/// The pattern that serves the data files of `dir`'s environments only:
/// `lock.mdb` is shared between processes and stays the kernel's.
fn data_pattern(dir: &Scratch) -> String {
    format!("{}/*/data.mdb", dir.path().display())
}

fn lmdb_tool(tool: &str) -> Command {
    ensure_programs("lmdb-utils", &["mdb_load", "mdb_dump", "mdb_stat"]);
    let mut cmd = Command::new(tool);
    no_preload(&mut cmd);
    cmd
}

/// How many records a dump holds (its lines between the header and the
/// end, in pairs), for failure messages.
fn records_in(dump: &[u8]) -> usize {
    let text = String::from_utf8_lossy(dump);
    text.lines().filter(|l| l.starts_with(' ')).count() / 2
}

/// `mdb_dump env`, with or without the preload; checks it against
/// `expected` and, preloaded, its report.
fn dump_matches(dir: &Scratch, env: &Path, expected: &[u8], preloaded: bool) -> Option<Report> {
    let what = if preloaded {
        "mdb_dump under the preload"
    } else {
        "mdb_dump without the preload"
    };
    let mut cmd = lmdb_tool("mdb_dump");
    cmd.arg(env);
    if preloaded {
        preload(&mut cmd, &data_pattern(dir), BUDGET_ENV);
    }
    let ran = run(what, &mut cmd, LIMIT);
    ran.expect_success(what);
    assert!(
        ran.stdout == expected,
        "{what}: the dump is not what was loaded ({}; {} records, {} expected)",
        common::first_difference(expected, &ran.stdout),
        records_in(&ran.stdout),
        records_in(expected)
    );
    preloaded.then(|| served(&ran, what))
}

/// LMDB's tools under the preload over a data file 5 times the budget:
/// `mdb_load` (its writes by `pwrite`, its reads through the mapping)
/// loads 40,000 records, `mdb_dump` under the preload gives back the
/// input byte for byte, `mdb_stat` counts the entries, and `mdb_dump`
/// without the preload — a process after the loader committed and exited
/// — gives back the input too.
#[test]
fn lmdb_loads_and_dumps_a_data_file_five_times_the_budget() {
    need_root();
    let dir = Scratch::new("lmdb");
    let env = dir.join("env");
    std::fs::create_dir(&env).expect("the environment's directory");
    let n = 40_000;
    let input = dump_of(0..n);
    let input_file = dir.join("input.txt");
    std::fs::write(&input_file, &input).expect("writing the input");

    let mut cmd = lmdb_tool("mdb_load");
    cmd.arg("-f").arg(&input_file).arg(&env);
    preload(&mut cmd, &data_pattern(&dir), BUDGET_ENV);
    let ran = run("mdb_load under the preload", &mut cmd, LIMIT);
    ran.expect_success("mdb_load under the preload");
    let load = served(&ran, "mdb_load under the preload");
    let size = std::fs::metadata(env.join("data.mdb"))
        .expect("data.mdb")
        .len() as usize;
    println!("data.mdb: {:.1} MiB", size as f64 / MIB as f64);
    assert!(
        size >= 4 * BUDGET,
        "data.mdb is {size} bytes, less than 4 times the budget"
    );
    println!("mdb_load evicted {} pages", load.evicted);

    let r = dump_matches(&dir, &env, &input, true).expect("a report");
    assert!(
        r.evicted > 0,
        "dumping {size} bytes through 16 MiB evicted nothing: {r:?}"
    );

    let mut cmd = lmdb_tool("mdb_stat");
    cmd.arg(&env);
    preload(&mut cmd, &data_pattern(&dir), BUDGET_ENV);
    let stat = run("mdb_stat under the preload", &mut cmd, LIMIT);
    stat.expect_success("mdb_stat under the preload");
    let text = stat.stdout_text();
    assert!(
        text.lines().any(|l| l.trim() == format!("Entries: {n}")),
        "mdb_stat under the preload: {text}"
    );
    served(&stat, "mdb_stat under the preload");

    dump_matches(&dir, &env, &input, false);
}

/// LMDB's commits survive `kill -9` of a preloaded writer: `mdb_load`
/// (under the preload) loads 20,000 records and exits; a second one
/// (under the preload) reads 10,000 more from a pipe — it commits every
/// 100 records — and, once it has read them all and waits in `read` for
/// more, is killed with SIGKILL. Without the preload, `mdb_dump` must then
/// give exactly the first 30,000 records: every transaction the killed
/// writer committed, and nothing torn.
#[test]
fn lmdb_commits_survive_kill_9_of_a_preloaded_writer() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::ExitStatusExt;
    need_root();
    let dir = Scratch::new("lmdb-kill");
    let env = dir.join("env");
    std::fs::create_dir(&env).expect("the environment's directory");
    let (first, second) = (20_000, 10_000);
    let input_file = dir.join("first.txt");
    std::fs::write(&input_file, dump_of(0..first)).expect("writing the input");
    let mut cmd = lmdb_tool("mdb_load");
    cmd.arg("-f").arg(&input_file).arg(&env);
    preload(&mut cmd, &data_pattern(&dir), BUDGET_ENV);
    let ran = run("the first mdb_load under the preload", &mut cmd, LIMIT);
    ran.expect_success("the first mdb_load under the preload");
    served(&ran, "the first mdb_load under the preload");

    let mut cmd = lmdb_tool("mdb_load");
    cmd.arg(&env).stdin(std::process::Stdio::piped());
    preload(&mut cmd, &data_pattern(&dir), BUDGET_ENV);
    let mut child = common::spawn("the second mdb_load under the preload", &mut cmd);
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("the loader's stdin");
    let mut feed = dump_header().into_bytes();
    feed.extend(records(first..first + second));
    let t0 = Instant::now();
    if let Err(e) = stdin.write_all(&feed) {
        let _ = child.kill();
        let ran = common::wait("the second mdb_load", child, LIMIT);
        panic!(
            "feeding the second mdb_load: {e} ({}); stderr:\n{}",
            ran.status, ran.stderr
        );
    }
    // Wait until the pipe is empty and the loader sleeps reading it (twice
    // in a row): every record fed was read, every full batch committed.
    let mut quiet = 0;
    while quiet < 2 {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, through a pointer to one.
        let rc = unsafe { libc::ioctl(stdin.as_raw_fd(), libc::FIONREAD, &mut unread) };
        assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let sleeping = state
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('S'));
        quiet = if unread == 0 && sleeping && wchan.contains("pipe_read") {
            quiet + 1
        } else {
            0
        };
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            let ran = common::wait("the second mdb_load", child, LIMIT);
            panic!(
                "the second mdb_load did not read all its input in {LIMIT:?} ({unread} bytes \
                 unread, wchan {wchan:?}); stderr:\n{}",
                ran.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "the second mdb_load read {second} records in {:.2?}; kill -9",
        t0.elapsed()
    );
    // It dies without a report: its maps say that faultline served its
    // data file (the kernel's mapping of data.mdb would be listed there,
    // as that of lock.mdb is).
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let kernel_maps = |file: &str| maps.lines().any(|l| l.ends_with(file));
    assert!(
        kernel_maps("/lock.mdb") && !kernel_maps("/data.mdb"),
        "the second mdb_load's data.mdb is not served by the preload:\n{maps}"
    );
    child.kill().expect("SIGKILL to the second mdb_load");
    let killed = common::wait("the second mdb_load", child, LIMIT);
    drop(stdin);
    assert_eq!(
        killed.status.signal(),
        Some(libc::SIGKILL),
        "the second mdb_load ended otherwise ({}); stderr:\n{}",
        killed.status,
        killed.stderr
    );
    let expected = dump_of(0..first + second);
    dump_matches(&dir, &env, &expected, false);
    let r = dump_matches(&dir, &env, &expected, true).expect("a report");
    assert!(
        r.evicted > 0,
        "dumping 60 MB through 16 MiB evicted nothing: {r:?}"
    );
}
