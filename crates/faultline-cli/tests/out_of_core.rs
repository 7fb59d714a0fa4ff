//! `faultline bench out-of-core` runs end to end on one pattern: every row
//! is there with a rate, the CPU it cost and its misses, within bounds a
//! real run cannot fall outside. Needs root (userfaultfd, the memory cgroup,
//! dropping the page cache); fails saying so. The device rows need a file
//! system with `O_DIRECT` under the bench's directory; where it has none,
//! the report says so in a note and the test checks the other rows.

mod bench_json;

use serde_json::Value;

#[test]
fn bench_out_of_core_gives_every_row_its_rate_and_cpu() {
    let v = bench_json::report(
        "out-of-core",
        &["--threads", "1", "--pattern", "random-read"],
        "root and a memory cgroup controller, v1 or v2",
    );
    let rows = v["rows"].as_array().expect("rows");
    let random: Vec<&Value> = rows
        .iter()
        .filter(|r| r["pattern"] == "random-read")
        .collect();
    // Two device rows (sleeping, polled), two kernel rows, five faultline.
    let notes = v["notes"].to_string();
    let device_rows = if notes.contains("device rows skipped") {
        0
    } else {
        2
    };
    assert_eq!(random.len(), device_rows + 7, "{v}");
    for row in random {
        let ops = row["ops_per_s"].as_f64().unwrap_or(0.0);
        assert!(ops > 0.0, "no rate: {row}");
        // A random 4 KiB read that misses memory enters the kernel and
        // waits for the device at least most of the time: under a
        // microsecond of CPU per op would mean the clock or the count is
        // wrong. (The unhinted kernel row reads ahead a whole window per
        // fault: tens of microseconds or more.)
        let cpu = row["cpu_us_per_op"].as_f64().unwrap_or(0.0);
        assert!((1.0..1e6).contains(&cpu), "CPU per op out of range: {row}");
        // Reads of the device per op (faultline's fills from the file, the
        // kernel's major faults): some, and at most one for an op that
        // reads one word.
        if row["system"] != "device" {
            let misses = row["misses_per_op"].as_f64();
            assert!(
                misses.is_some_and(|m| m > 0.0 && m <= 1.0),
                "misses_per_op out of range: {row}"
            );
        }
    }
    assert!(notes.contains("cpu_us_per_op"), "{notes}");
}
