//! The preload README's shell blocks, run as written (bash, from the
//! repository root, `-euo pipefail`): a block that no longer works fails
//! here. The example must show the query's answer and the library's report
//! of a served mapping.

mod common;

use common::{ensure_programs, need_root, no_preload, run};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The fenced blocks of `lang` in `text`.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let open = format!("```{lang}\n");
    text.split(&open)
        .skip(1)
        .filter_map(|rest| rest.split("```").next().map(str::to_string))
        .collect()
}

#[test]
fn readme_shell_blocks_run_as_written() {
    need_root();
    ensure_programs("sqlite3", &["sqlite3"]);
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(crate_dir.join("README.md")).expect("README.md");
    let shell = blocks(&readme, "sh");
    assert!(!shell.is_empty(), "the README has no sh block");
    for block in shell {
        let mut cmd = Command::new("bash");
        cmd.args(["-euo", "pipefail", "-c", &block])
            .current_dir(crate_dir.join("../.."));
        no_preload(&mut cmd);
        if let Some(cargo) = std::env::var_os("CARGO") {
            // The block's `cargo` is the one running this test.
            let bin = Path::new(&cargo).parent().map(|p| p.as_os_str().to_owned());
            if let (Some(bin), Some(path)) = (bin, std::env::var_os("PATH")) {
                let mut paths = vec![std::path::PathBuf::from(bin)];
                paths.extend(std::env::split_paths(&path));
                cmd.env("PATH", std::env::join_paths(paths).expect("PATH"));
            }
        }
        let ran = run("the README block", &mut cmd, Duration::from_secs(600));
        ran.expect_success(&format!("the README block\n{block}"));
        let out = ran.stdout_text();
        assert!(
            out.contains("60000|60000000"),
            "the query's answer is missing: {out}"
        );
        let report = ran.report("the README block");
        assert_eq!(
            report.regions, 1,
            "the database was not served: {}",
            ran.stderr
        );
        assert!(
            report.evicted > 0,
            "a 60 MiB database through 16 MiB evicted nothing"
        );
    }
}
