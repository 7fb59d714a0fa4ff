//! Helpers shared by the integration tests. Every test that builds a manager
//! needs userfaultfd with `UFFDIO_MOVE`; without it, it fails with the reason.
#![allow(dead_code)]

use faultline::{Config, Manager};
use std::path::PathBuf;

pub const MIB: usize = 1 << 20;

/// A manager with `config`, or a panic that says what is missing.
pub fn manager_with(config: Config) -> Manager {
    Manager::builder()
        .config(config)
        .build()
        .unwrap_or_else(|e| panic!("this test needs userfaultfd with UFFDIO_MOVE: {e}"))
}

/// A manager with `budget` bytes and 2 workers, defaults otherwise.
pub fn manager(budget: usize) -> Manager {
    manager_with(Config {
        budget,
        workers: 2,
        fault_locks: 4,
        ..Config::default()
    })
}

/// A small deterministic generator (xorshift), so failures reproduce.
pub fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Stats once the workers' bookkeeping has caught up with the wake-ups it
/// issued (a woken thread may run before its worker counts the move).
pub fn settled(mm: &Manager) -> faultline::StatsSnapshot {
    let mut last = mm.stats();
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        let now = mm.stats();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// Reads one byte at `addr` from kernel mode (`write(2)` into a pipe): a
/// poisoned page gives EFAULT there instead of SIGBUS. Returns the errno, or
/// 0 if the read worked.
pub fn kernel_read(addr: usize) -> i32 {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: reads one byte at `addr` from kernel mode.
    let n = unsafe { libc::write(fds[1], addr as *const libc::c_void, 1) };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: closing the fds we opened.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    if n == 1 {
        0
    } else {
        errno
    }
}

/// Writes `bytes` to a file `name` in this process's scratch directory.
pub fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("faultline-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write scratch file");
    path
}
