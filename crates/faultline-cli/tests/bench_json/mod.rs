//! Runs a `faultline bench` with `--json` and returns its report, failing
//! the test with the bench's stderr and what it needs if it did not
//! succeed. Shared by the end-to-end bench tests.

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_faultline");

/// `faultline bench NAME --quick --json ARGS...`'s report; `needs` says
/// what the bench needs, for the failure's message.
pub fn report(name: &str, args: &[&str], needs: &str) -> Value {
    let out = Command::new(BIN)
        .args(["bench", name, "--quick", "--json"])
        .args(args)
        .output()
        .expect("run faultline");
    assert!(
        out.status.success(),
        "bench {name} failed (needs {needs}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}
