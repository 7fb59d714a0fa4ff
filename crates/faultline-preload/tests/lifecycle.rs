//! A preloaded program's life around its mappings: `fork()` (a child that
//! execs is unaffected; a child that touches an inherited served mapping
//! gets SIGSEGV, as documented), a normal exit (writable mappings written
//! back, the stats file removed), `madvise` access patterns, and settings that cannot be used (one
//! line on stderr, and the program runs on the kernel's mmap).

mod common;

use common::{compile_c, need_root, preload, run, stats_files_of, Scratch};
use std::process::Command;
use std::time::Duration;

const PAGE: usize = 4096;

#[test]
fn forked_children_and_exit_leave_the_mapping_and_nothing_else() {
    need_root();
    let dir = Scratch::new("fork");
    let exe = compile_c(&dir, "fork");
    let pages = 4096usize;
    let file = dir.join("data.bin");
    std::fs::write(&file, vec![0u8; pages * PAGE]).expect("writing the file");
    let mut cmd = Command::new(&exe);
    cmd.arg(&file).arg(pages.to_string());
    preload(&mut cmd, &file.display().to_string(), "4M");
    let ran = run("fork", &mut cmd, Duration::from_secs(120));
    ran.expect_success("the fork oracle");
    assert!(
        ran.stdout_text().contains("fork ok"),
        "{}",
        ran.stdout_text()
    );
    let report = ran.report("fork");
    assert_eq!(report.regions, 1, "the file was not served: {}", ran.stderr);
    assert!(report.evicted > 0, "the budget never pressed: {report:?}");
    let data = std::fs::read(&file).expect("reading the file back");
    for (i, w) in data.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        assert_eq!(v, i as u64 ^ 0xF00D_F00D, "word {i} of the file");
    }
    assert!(
        stats_files_of(ran.pid).is_empty(),
        "the program left stats files: {:?}",
        stats_files_of(ran.pid)
    );
}

/// `madvise(MADV_RANDOM)` turns a served mapping's read-ahead off (a
/// fault a page), `MADV_SEQUENTIAL` reads the largest window from the
/// first fault: a pass over the file in order with each advice.
#[test]
fn madvise_sets_a_served_mappings_access_pattern() {
    need_root();
    let dir = Scratch::new("advise");
    let exe = compile_c(&dir, "advise");
    let pages = 2048usize;
    let file = dir.join("data.bin");
    let data: Vec<u8> = (0..pages * PAGE)
        .map(|b| ((b / PAGE * 7 + b % PAGE) % 251) as u8)
        .collect();
    std::fs::write(&file, &data).expect("writing the file");
    let faults = |advice: &str| {
        let mut cmd = Command::new(&exe);
        cmd.arg(&file).arg(pages.to_string()).arg(advice);
        preload(&mut cmd, &file.display().to_string(), "64M");
        let ran = run(advice, &mut cmd, Duration::from_secs(120));
        ran.expect_success(advice);
        assert!(
            ran.stdout_text().contains("advise ok"),
            "{advice}: {}",
            ran.stdout_text()
        );
        let report = ran.report(advice);
        assert_eq!(report.regions, 1, "{advice}: not served: {}", ran.stderr);
        report.faults
    };
    let (none, random, sequential) = (faults("none"), faults("random"), faults("sequential"));
    // At least a fault a page (a fault retried after a refused move counts
    // twice).
    assert!(
        random >= pages as u64,
        "MADV_RANDOM: a fault a page ({random})"
    );
    assert!(
        none < pages as u64 / 8,
        "no advice: read-ahead finds the walk ({none} faults)"
    );
    assert!(
        sequential < none,
        "MADV_SEQUENTIAL: the largest window at once ({sequential} faults, {none} without)"
    );
    let normal = faults("normal");
    assert!(
        normal < pages as u64 / 8,
        "MADV_NORMAL: read-ahead as without advice ({normal} faults)"
    );
    println!("faults over {pages} pages: none {none}, random {random}, sequential {sequential}, normal {normal}");
}

#[test]
fn unusable_settings_are_one_line_and_the_kernel_serves() {
    need_root();
    let dir = Scratch::new("bad-settings");
    let exe = compile_c(&dir, "private");
    let pages = 256usize;
    let file = dir.join("data.bin");
    let data: Vec<u8> = (0..pages * PAGE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&file, &data).expect("writing the file");
    for (var, value, says) in [
        (
            "FAULTLINE_BUDGET",
            "lots",
            "FAULTLINE_BUDGET=\"lots\" is not a size",
        ),
        ("FAULTLINE_BUDGET", "1M", "below one 2 MiB frame"),
        (
            "FAULTLINE_FILES",
            "relative/*.bin",
            "is not an absolute path",
        ),
    ] {
        let mut cmd = Command::new(&exe);
        cmd.arg(&file).arg(pages.to_string());
        preload(&mut cmd, &file.display().to_string(), "16M");
        cmd.env(var, value);
        let ran = run(&format!("{var}={value}"), &mut cmd, Duration::from_secs(60));
        ran.expect_success(&format!("the program with {var}={value}"));
        assert!(
            ran.stdout_text().contains("private ok"),
            "{}",
            ran.stdout_text()
        );
        let lines: Vec<&str> = ran
            .stderr
            .lines()
            .filter(|l| l.starts_with("faultline-preload:") && !l.contains("regions="))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "{var}={value}: want one line, got {lines:?}"
        );
        assert!(lines[0].contains(says), "{var}={value}: {}", lines[0]);
        assert!(
            lines[0].contains("go to the kernel"),
            "{var}={value}: {}",
            lines[0]
        );
    }
    assert_eq!(
        std::fs::read(&file).expect("the file"),
        data,
        "the file changed"
    );
}
