//! The `faultline` binary against a live manager: `faultline stat --json`
//! reads back every counter this process's manager publishes (equal to
//! `Manager::stats`), a stale stats file of a dead process is ignored and
//! removed, `--prometheus` is well formed, and plots are PNGs of the
//! expected size. Needs userfaultfd (root); fails with the reason otherwise.

use faultline::store::{File, FileOptions, Zero};
use faultline::{Config, Manager, ManagerBuilder, MapOptions};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_faultline");

fn quiet_manager() -> Manager {
    let mut c = Config::default();
    c.budget = 64 << 20;
    c.workers = 1;
    c.pin_workers = false;
    c.prezero = false; // the reserve would change frames_free meanwhile
    c.idle_release = None;
    ManagerBuilder::from_config(c)
        .build()
        .expect("building a manager (needs root and /dev/userfaultfd)")
}

/// A file of `len` zero bytes in the system temp dir, unique to this test.
fn scratch_file(tag: &str, len: u64) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "faultline-issue21-{tag}-{}.dat",
        std::process::id()
    ));
    let f = std::fs::File::create(&p).expect("create the scratch file");
    f.set_len(len).expect("size the scratch file");
    p
}

/// This manager's stats file (named by the `manager` label of its
/// Prometheus text).
fn file_of(mm: &Manager) -> PathBuf {
    let text = mm.prometheus_text();
    let at = text.find("manager=\"").expect("a manager label") + "manager=\"".len();
    let n: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Path::new(faultline::published::STATS_DIR).join(format!("{}-{n}", std::process::id()))
}

fn stat_json(args: &[&str]) -> (bool, Value, String) {
    let out = Command::new(BIN)
        .arg("stat")
        .args(args)
        .arg("--json")
        .output()
        .expect("run faultline stat");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v = serde_json::from_str(text.trim()).unwrap_or(Value::Null);
    (
        out.status.success(),
        v,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `v`'s fields flattened with `_` (`service.p50_ns` -> `service_p50_ns`).
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let name = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}_{k}")
                };
                flatten(&name, v, out);
            }
        }
        v => out.push((prefix.to_string(), v.clone())),
    }
}

/// The mismatches between the snapshot and manager `n` of this process in
/// `faultline stat --json` output.
fn mismatches(snap: &Value, stat: &Value, n: u64) -> Vec<String> {
    let Some(m) = stat["managers"]
        .as_array()
        .and_then(|a| a.iter().find(|m| m["manager"] == n))
    else {
        return vec![format!("manager {n} not listed: {stat}")];
    };
    let mut want = Vec::new();
    flatten("", snap, &mut want);
    // serde_json parses floats to within an ulp (not exactly, without its
    // `float_roundtrip` feature): equal means equal to 1e-12.
    let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs()),
        _ => false,
    };
    want.iter()
        .filter(|(k, v)| !same(m["fields"].get(k).and_then(Value::as_f64), v.as_f64()))
        .map(|(k, v)| format!("{k}: stats() {v}, file {}", m["fields"][k]))
        .collect()
}

#[test]
fn stat_json_reads_back_every_counter() {
    let mm = quiet_manager();
    let zero = mm.map(8 << 20, Zero, MapOptions::new()).unwrap();
    for p in 0..100 {
        zero.write_at(p * 4096, b"x").unwrap();
    }
    let path = scratch_file("roundtrip", 4 << 20);
    let file = mm
        .map(
            4 << 20,
            File::open(&path, FileOptions::new().writable(true)).unwrap(),
            MapOptions::new(),
        )
        .unwrap();
    let mut buf = [0u8; 8];
    for p in 0..64 {
        file.read_at(p * 4096, &mut buf).unwrap();
    }
    file.write_at(0, b"written").unwrap();
    file.flush().unwrap();
    let snap = serde_json::to_value(mm.stats()).unwrap();
    assert!(snap["store_reads"]["count"].as_u64().unwrap() > 0, "{snap}");
    assert!(
        snap["store_writes"]["count"].as_u64().unwrap() > 0,
        "{snap}"
    );
    let pid = std::process::id().to_string();
    // Other tests of this binary may have managers listed too: ours is the
    // one whose published counters match `Manager::stats`.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (last, ours) = loop {
        let (ok, stat, err) = stat_json(&[&pid]);
        assert!(ok, "faultline stat failed: {err}");
        let snap = serde_json::to_value(mm.stats()).unwrap();
        let listed: Vec<u64> = stat["managers"]
            .as_array()
            .map(|a| a.iter().filter_map(|m| m["manager"].as_u64()).collect())
            .unwrap_or_default();
        let bad: Vec<Vec<String>> = listed
            .iter()
            .map(|&n| mismatches(&snap, &stat, n))
            .collect();
        if let Some(i) = bad.iter().position(Vec::is_empty) {
            break (stat, listed[i]);
        }
        assert!(
            Instant::now() <= deadline,
            "published stats differ from Manager::stats:\n{}\n{stat}",
            bad.concat().join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The extras: the page walk sees the touched pages.
    let m = &last["managers"]
        .as_array()
        .and_then(|a| a.iter().find(|m| m["manager"].as_u64() == Some(ours)))
        .expect("this test's manager, found above")["fields"];
    assert!(m["frames_resident"].as_u64().unwrap() >= 100, "{m}");
    assert!(m["published_unix_ns"].as_u64().unwrap() > 0, "{m}");
    drop((zero, file));
    drop(mm);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_file_goes_with_the_manager_and_stale_files_are_removed() {
    let mm = quiet_manager();
    let dir = Path::new(faultline::published::STATS_DIR);
    let pid = std::process::id();
    let ours = file_of(&mm);
    assert!(ours.exists(), "no stats file {}", ours.display());
    // A file of a process that has exited: a copy of a real one, named
    // after the pid of a child that ran and was reaped.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = dir.join(format!("{dead}-0"));
    std::fs::copy(&ours, &stale).unwrap();
    let (ok, v, err) = stat_json(&[]);
    assert!(ok, "faultline stat failed: {err}");
    let pids: Vec<u64> = v["managers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["pid"].as_u64())
        .collect();
    assert!(
        !pids.contains(&u64::from(dead)),
        "the dead process is listed: {v}"
    );
    assert!(
        pids.contains(&u64::from(pid)),
        "this process is not listed: {v}"
    );
    assert!(!stale.exists(), "the stale file was not removed");
    // Asking for the dead process: nothing to show, an error.
    let (ok, _, err) = stat_json(&[&dead.to_string()]);
    assert!(!ok && err.contains("publishes no faultline stats"), "{err}");
    // Prometheus text: one TYPE line per family, samples labelled.
    let out = Command::new(BIN)
        .args(["stat", &pid.to_string(), "--prometheus"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("# TYPE faultline_faults_total counter"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "faultline_fault_service_seconds_count{{pid=\"{pid}\""
        )),
        "{text}"
    );
    assert!(mm
        .prometheus_text()
        .contains("# TYPE faultline_fault_service_seconds summary"));
    // The manager's file goes when it drops.
    drop(mm);
    assert!(
        !ours.exists(),
        "{} still there after the drop",
        ours.display()
    );
}

/// The README's `faultline stat` lines, run as written against this
/// process's manager (`1234` is this process, `faultline` this binary).
#[test]
fn the_readmes_stat_lines_run() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    let block = readme
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("faultline stat"))
        .expect("the README's faultline stat block");
    let mm = quiet_manager();
    assert!(mm.stats_file().is_some_and(Path::exists));
    let pid = std::process::id().to_string();
    let mut ran = 0;
    for line in block.lines() {
        let cmd = line.split('#').next().unwrap_or("").trim();
        if cmd.is_empty() {
            continue;
        }
        let mut words = cmd.split_whitespace();
        assert_eq!(words.next(), Some("faultline"), "{line}");
        let args: Vec<String> = words
            .map(|w| {
                if w == "1234" {
                    pid.clone()
                } else {
                    w.to_string()
                }
            })
            .collect();
        let out = Command::new(BIN)
            .args(&args)
            .output()
            .expect("run faultline");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(&pid),
            "README line {line:?} failed ({}): {text} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    assert_eq!(ran, 4, "{block}");
    drop(mm);
}

#[test]
fn no_file_when_publication_is_off() {
    let mm = ManagerBuilder::from_config(Config::default())
        .budget(8 << 20)
        .workers(1)
        .publish_stats(false)
        .build()
        .expect("building a manager (needs root and /dev/userfaultfd)");
    let text = mm.prometheus_text();
    assert!(text.contains("faultline_budget_bytes{"), "{text}");
    let f = file_of(&mm);
    assert!(
        !f.exists(),
        "{} published with publish_stats off",
        f.display()
    );
}

/// Width and height from a PNG's IHDR, after checking the signature.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).expect("read the PNG");
    assert_eq!(
        &b[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(&b[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (be(16), be(20))
}

/// `faultline plot JSON -o PNG`, checked to succeed with a 1280x720 PNG.
fn plot_checked(json: &Path, png: &Path) {
    let out = Command::new(BIN)
        .arg("plot")
        .arg(json)
        .arg("-o")
        .arg(png)
        .output()
        .expect("run faultline plot");
    assert!(
        out.status.success(),
        "{}: {}",
        json.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(png_size(png), (1280, 720), "{}", json.display());
}

#[test]
fn plots_are_pngs_of_the_expected_size() {
    let dir = std::env::temp_dir().join(format!("faultline-issue21-plots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A real run, drawn as it finishes.
    let png = dir.join("fault.png");
    let out = Command::new(BIN)
        .args(["bench", "fault", "--quick", "--json", "--plot"])
        .arg(&png)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(png_size(&png), (1280, 720));
    // Its saved JSON through `faultline plot`, and one report of each other
    // experiment's shape (rows as the benches write them).
    let json = dir.join("fault.json");
    std::fs::write(&json, &out.stdout).unwrap();
    let machine = serde_json::json!({"cpu": "test", "cpus": 2, "kernel": "6"});
    let reports = [
        (
            "alloc",
            serde_json::json!([{"kind": "alloc", "mode": "pcp", "threads": 1, "batch": 1, "total_ns": 40.0},
            {"kind": "alloc", "mode": "pcp", "threads": 1, "batch": 64, "total_ns": 12.0}]),
        ),
        (
            "clear-order",
            serde_json::json!([{"order": "sequential", "writers": 1, "pressure": false, "gb_per_s": 3.1}]),
        ),
        (
            "lookup",
            serde_json::json!([{"trace": "build", "cache": "none", "ns_per_lookup": 20.0, "hit_rate": 0.0}]),
        ),
        (
            "parallel-fault",
            serde_json::json!([{"locks": "global", "threads": 1, "store_latency_us": 0, "seconds": 0.1},
            {"locks": "global", "threads": 2, "store_latency_us": 0, "seconds": 0.2}]),
        ),
        (
            "migrate",
            serde_json::json!([{"case": "1x2m", "copy": "chunked", "threads": 1, "gb_per_s": 5.0}]),
        ),
        (
            "out-of-core",
            serde_json::json!([{"system": "kernel", "hint": "none", "pattern": "random-read", "ops_per_s": 1e5}]),
        ),
    ];
    for (bench, rows) in reports {
        let f = dir.join(format!("{bench}.json"));
        std::fs::write(
            &f,
            serde_json::json!({"bench": bench, "machine": machine, "rows": rows}).to_string(),
        )
        .unwrap();
        plot_checked(&f, &dir.join(format!("{bench}.png")));
    }
    plot_checked(&json, &dir.join("fault-again.png"));
    std::fs::remove_dir_all(&dir).unwrap();
}
