//! The tightest CPU quota over a cgroup and its ancestors, and how much of
//! it the cgroup left unused ([`Quota::read`]): what a process under a
//! quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`;
//! a container's `--cpus`, a Kubernetes CPU limit) may still use, whatever
//! the CPUs it may run on are doing.
//!
//! [`QuotaReading::unused`] is a counter: the binding quota's CPU time up
//! to now (its rate times a monotonic clock) less its cgroup's usage (v2
//! `cpu.stat`'s `usage_usec`, v1 `cpuacct.usage`). Two readings `t` apart
//! with the same [`QuotaReading::binding`] differ by the quota's CPU time
//! in `t` less what the cgroup used: the CPU time it could still have had.
//! Of several quotas along the path to the root, the one with the fewest
//! CPUs per second binds, and its cgroup's usage is the one read. On v1
//! the usage comes from the `cpuacct` controller at the same path as the
//! `cpu` cgroup (one directory where they are mounted together, as systemd
//! and Docker lay them out).
//!
//! Where the files are is found once per process
//! ([`Quota::of_this_process`], at first use: it allocates); what they
//! say is read at every reading, without allocating (stack buffers; a
//! reading may be made in a SIGBUS handler): a quota set, changed or
//! lifted while the process runs (`docker update --cpus`, a Kubernetes
//! in-place resize) counts from the next reading, and a change of which
//! quota binds, or of its rate, changes [`QuotaReading::binding`] (two
//! such readings are not compared). A process moved to another cgroup
//! afterwards keeps reading the first one's files. No locks.

use crate::cgroup::{cgroup_path, Mounts};
use crate::host::read_small_file;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

/// The CPU quota files over a cgroup: its own and its ancestors', where
/// each can hold a quota, and where each one's usage is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// The cgroup's level first, then its ancestors' up to the root (of
    /// the mount: levels not under it are left out).
    levels: Vec<Level>,
}

/// One cgroup on the path: where its quota and its usage are read (C
/// strings, for [`read_small_file`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Level {
    /// v2 `cpu.max`, or v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us`.
    limit: Limit,
    /// v2 `cpu.stat` (µs on a `usage_usec` line) or v1 `cpuacct.usage`
    /// (a number of ns).
    usage: CString,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Limit {
    V2 { cpu_max: CString },
    V1 { quota: CString, period: CString },
}

/// One reading of a [`Quota`]: which quota binds, and the counter of its
/// CPU time left unused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaReading {
    /// CPU time the binding quota allows per second of wall time, ns (2
    /// CPUs: 2e9).
    pub ns_per_sec: u64,
    /// Which quota binds: its level (0: the cgroup's own, 1 the nearest
    /// ancestor under the mount, ...) in the top 8 bits, its rate in ns per
    /// second below (held within 1 ..= 2^56 - 1, so never 0). Two readings' [`unused`](QuotaReading::unused)
    /// compare only where this is the same.
    pub binding: u64,
    /// The binding quota's CPU time up to now less its cgroup's usage, ns,
    /// wrapping (see the module documentation): only differences mean
    /// anything, `a.wrapping_sub(b) as i64` of two readings being the time
    /// left unused between them.
    pub unused: u64,
}

impl QuotaReading {
    /// The quota in CPUs (1.5: one and a half CPUs' time per second).
    pub fn cpus(&self) -> f64 {
        self.ns_per_sec as f64 / 1e9
    }
}

impl Quota {
    /// Where this process's quota is read, found at the first call;
    /// `None` where no CPU controller's files can be read.
    pub fn of_this_process() -> Option<&'static Quota> {
        static QUOTA: OnceLock<Option<Quota>> = OnceLock::new();
        QUOTA
            .get_or_init(|| {
                let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
                Quota::of(&Mounts::of_this_process(), &cgroup)
            })
            .as_ref()
    }

    /// The binding quota of the process whose `/proc/<pid>/cgroup` text is
    /// `proc_cgroup`, on the hierarchies of `mounts`: v1's `cpu`
    /// controller where it is mounted (a controller bound to v1 is absent
    /// from v2), else v2's.
    pub fn of(mounts: &Mounts, proc_cgroup: &str) -> Option<Quota> {
        let path_of = |v1_controller| cgroup_path(proc_cgroup, v1_controller);
        match (&mounts.v1_cpu, &mounts.v1_cpuacct, &mounts.v2) {
            (Some(cpu), Some(cpuacct), _) => {
                let path = path_of(Some("cpu"))?;
                // Mounted apart, the usage is read at the `cpu` cgroup's
                // path: only if the process's `cpuacct` cgroup is there.
                if cpu != cpuacct && path_of(Some("cpuacct"))? != path {
                    return None;
                }
                Quota::under(cpu, path, Some(cpuacct))
            }
            (Some(_), None, _) => None,
            (None, _, Some(v2)) => Quota::under(v2, path_of(None)?, None),
            (None, _, None) => None,
        }
    }

    /// Where the quota over the cgroup `path` (relative) of the hierarchy
    /// mounted at `root` and its ancestors is read: v2 if `v1_cpuacct` is
    /// `None`, else v1 with the usage read in the `cpuacct` hierarchy
    /// mounted at `v1_cpuacct`. Levels missing under `root` are passed
    /// over: in a container without a cgroup namespace `/proc/self/cgroup`
    /// names the container's cgroup from the host's root while the mount
    /// shows it as the root, so the walk ends at the root, the container's
    /// own. Every level whose directory is there is kept, with a quota
    /// now or not (one may be set, or its controller enabled, later).
    /// `None` where no level's directory is there.
    pub fn under(root: &Path, path: &str, v1_cpuacct: Option<&Path>) -> Option<Quota> {
        let c = |p: PathBuf| CString::new(p.into_os_string().into_encoded_bytes()).ok();
        let mut levels = Vec::new();
        let mut rel = PathBuf::from(path);
        loop {
            let dir = root.join(&rel);
            let level = match v1_cpuacct {
                None => Level {
                    limit: Limit::V2 {
                        cpu_max: c(dir.join("cpu.max"))?,
                    },
                    usage: c(dir.join("cpu.stat"))?,
                },
                Some(acct) => Level {
                    limit: Limit::V1 {
                        quota: c(dir.join("cpu.cfs_quota_us"))?,
                        period: c(dir.join("cpu.cfs_period_us"))?,
                    },
                    usage: c(acct.join(&rel).join("cpuacct.usage"))?,
                },
            };
            // Every level there is: a quota file missing now appears
            // where the controller is enabled later (v2's `cpu.max`).
            if dir.is_dir() {
                levels.push(level);
            }
            if !rel.pop() {
                break;
            }
        }
        (!levels.is_empty()).then_some(Quota { levels })
    }

    /// Which quota binds now, and how much of it is left unused; `None`
    /// where no level has a quota now (or its usage cannot be read).
    pub fn read(&self) -> Option<QuotaReading> {
        let (level, ns_per_sec) = self
            .levels
            .iter()
            .enumerate()
            .filter_map(|(i, level)| Some((i, level.rate()?)))
            .min_by_key(|&(i, rate)| (rate, i))?;
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        let wall = EPOCH.get_or_init(Instant::now).elapsed().as_nanos();
        let allowed = wall * u128::from(ns_per_sec) / 1_000_000_000;
        let used = self.levels[level].used()?;
        Some(QuotaReading {
            ns_per_sec,
            binding: ((level.min(255) as u64) << 56) | ns_per_sec.clamp(1, (1 << 56) - 1),
            unused: (allowed as u64).wrapping_sub(used),
        })
    }
}

impl Level {
    /// The level's quota now, ns of CPU per second; `None` without one.
    fn rate(&self) -> Option<u64> {
        let mut buf = [0u8; 64];
        match &self.limit {
            Limit::V2 { cpu_max } => rate_of_cpu_max(read_text(cpu_max, &mut buf)?),
            Limit::V1 { quota, period } => {
                // The period is read only under a quota (-1: none).
                let quota = read_text(quota, &mut buf)?;
                if quota.trim().starts_with('-') {
                    return None;
                }
                let mut period_buf = [0u8; 64];
                rate_of_v1(quota, read_text(period, &mut period_buf)?)
            }
        }
    }

    /// The level's cgroup's CPU usage since it was made, ns.
    fn used(&self) -> Option<u64> {
        let mut buf = [0u8; 1024];
        let text = read_text(&self.usage, &mut buf)?;
        if matches!(self.limit, Limit::V2 { .. }) {
            let usec: u64 = text
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))?
                .trim()
                .parse()
                .ok()?;
            Some(usec.saturating_mul(1000))
        } else {
            text.trim().parse().ok()
        }
    }
}

/// A small text file's contents, read into `buf`.
fn read_text<'b>(path: &CStr, buf: &'b mut [u8]) -> Option<&'b str> {
    std::str::from_utf8(read_small_file(path, buf)?).ok()
}

/// CPU ns per second of a v2 `cpu.max` text (`"150000 100000"`: 1.5
/// CPUs); `None` for `max` (no quota) or text that does not parse.
fn rate_of_cpu_max(text: &str) -> Option<u64> {
    let mut fields = text.split_whitespace();
    let (quota, period) = (fields.next()?, fields.next()?);
    ns_per_sec(quota.parse().ok()?, period.parse().ok()?)
}

/// CPU ns per second of v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`;
/// `None` for a quota of -1 (none).
fn rate_of_v1(quota: &str, period: &str) -> Option<u64> {
    let quota: i64 = quota.trim().parse().ok()?;
    ns_per_sec(u64::try_from(quota).ok()?, period.trim().parse().ok()?)
}

/// `quota` µs of CPU time per `period` µs, as ns per second.
fn ns_per_sec(quota: u64, period: u64) -> Option<u64> {
    (period > 0 && quota > 0).then(|| {
        let ns = u128::from(quota) * 1_000_000_000 / u128::from(period);
        u64::try_from(ns).unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::tests::Scratch;
    use std::time::Duration;

    #[test]
    fn quotas_parse_from_both_files() {
        assert_eq!(rate_of_cpu_max("150000 100000\n"), Some(1_500_000_000));
        assert_eq!(rate_of_cpu_max("max 100000\n"), None);
        assert_eq!(rate_of_cpu_max("0 100000\n"), None);
        assert_eq!(rate_of_cpu_max(""), None);
        assert_eq!(rate_of_v1("-1\n", "100000\n"), None);
        assert_eq!(rate_of_v1("50000\n", "100000\n"), Some(500_000_000));
        assert_eq!(rate_of_v1("50000\n", "0\n"), None);
    }

    /// The v2 files against a directory laid out as a v2 hierarchy: the
    /// tightest quota on the path binds and its cgroup's usage is read.
    #[test]
    fn the_tightest_quota_on_the_path_binds_and_its_usage_is_read() {
        let root = Scratch::new("quota-v2");
        let lay = |dir: &str, max: &str, usec: u64| {
            let d = root.0.join(dir);
            std::fs::create_dir_all(&d).expect("layout");
            std::fs::write(d.join("cpu.max"), max).expect("layout");
            std::fs::write(
                d.join("cpu.stat"),
                format!("usage_usec {usec}\nuser_usec 1\nnr_throttled 0\n"),
            )
            .expect("layout");
        };
        lay("a", "400000 100000\n", 9);
        lay("a/b", "max 100000\n", 5);
        lay("a/b/c", "150000 100000\n", 1000);
        let mounts = Mounts {
            v2: Some(root.0.clone()),
            ..Mounts::default()
        };
        let q = Quota::of(&mounts, "0::/a/b/c\n").expect("a quota");
        let read = |q: &Quota| q.read().expect("a quota binds");
        assert_eq!(read(&q).cpus(), 1.5);
        assert_eq!(read(&q).binding, 1_500_000_000, "level 0 binds");
        // 100 s more used between two readings: 100 s less left unused
        // (less the quota's share of the few µs between them).
        let before = read(&q).unused;
        std::fs::write(root.0.join("a/b/c/cpu.stat"), "usage_usec 100001000\n").expect("layout");
        let left = read(&q).unused.wrapping_sub(before) as i64;
        assert!(
            (-100_000_000_000..-99_000_000_000).contains(&left),
            "{left}"
        );
        // Changed while the process runs, with no new search: a tighter
        // ancestor binds and its cgroup's usage counts; the binding says
        // which.
        lay("a", "50000 100000\n", 9);
        let now = read(&q);
        assert_eq!(now.cpus(), 0.5);
        assert_eq!(now.binding, (2 << 56) | 500_000_000, "level 2 binds");
        let before = now.unused;
        std::fs::write(root.0.join("a/cpu.stat"), "usage_usec 1000009\n").expect("layout");
        let left = read(&q).unused.wrapping_sub(before) as i64;
        assert!((-1_000_000_000..-990_000_000).contains(&left), "{left}");
        // Every quota lifted: no reading, though the files are still
        // known, and a quota set later counts again.
        lay("a", "max 100000\n", 9);
        lay("a/b/c", "max 100000\n", 9);
        assert_eq!(q.read(), None);
        assert_eq!(Quota::of(&mounts, "0::/a/b/c\n"), Some(q.clone()));
        lay("a/b", "200000 100000\n", 9);
        assert_eq!(read(&q).cpus(), 2.0);
        // A hierarchy with no quota files yet (the controller not
        // enabled): the levels there are kept, and a quota set later, with
        // its file, counts.
        let bare = Scratch::new("quota-v2-bare");
        let mounts = Mounts {
            v2: Some(bare.0.clone()),
            ..Mounts::default()
        };
        std::fs::create_dir_all(bare.0.join("a/b")).expect("layout");
        let q = Quota::of(&mounts, "0::/a/b/c\n").expect("levels a/b, a and the root");
        assert_eq!(q.levels.len(), 3, "a/b/c is not there: passed over");
        assert_eq!(q.read(), None);
        std::fs::write(bare.0.join("a/cpu.max"), "300000 100000\n").expect("layout");
        std::fs::write(bare.0.join("a/cpu.stat"), "usage_usec 5\n").expect("layout");
        assert_eq!(q.read().map(|r| r.cpus()), Some(3.0));
    }

    /// v1 layouts: a container's cgroup seen from the host's root (the
    /// levels above it missing under the mount), and `cpuacct` mounted
    /// apart at another path (no quota: its usage would be another
    /// cgroup's).
    #[test]
    fn v1_quotas_are_found_from_a_container_and_not_across_paths() {
        let root = Scratch::new("quota-v1");
        let (cpu, acct) = (root.0.join("cpu"), root.0.join("cpuacct"));
        for dir in [&cpu, &acct] {
            std::fs::create_dir_all(dir).expect("layout");
        }
        std::fs::write(cpu.join("cpu.cfs_quota_us"), "200000\n").expect("layout");
        std::fs::write(cpu.join("cpu.cfs_period_us"), "100000\n").expect("layout");
        std::fs::write(acct.join("cpuacct.usage"), "123456789\n").expect("layout");
        let mounts = Mounts {
            v1_cpu: Some(cpu.clone()),
            v1_cpuacct: Some(acct.clone()),
            ..Mounts::default()
        };
        let container = "3:cpuacct:/docker/abc\n2:cpu:/docker/abc\n0::/\n";
        let q = Quota::of(&mounts, container).expect("the container's quota");
        assert_eq!(q.read().map(|r| r.cpus()), Some(2.0));
        assert_eq!(q.levels[0].used(), Some(123456789));
        let apart = "3:cpuacct:/\n2:cpu:/docker/abc\n0::/\n";
        assert_eq!(Quota::of(&mounts, apart), None);
        let no_quota = Mounts {
            v1_cpuacct: None,
            ..mounts
        };
        assert_eq!(Quota::of(&no_quota, container), None);
    }

    /// A child cgroup of this machine's CPU controller with a quota, a
    /// busy loop in it; removed (the loop killed first) on drop.
    struct Busy {
        loop_: std::process::Child,
        dirs: Vec<PathBuf>,
        quota: Quota,
    }

    impl Busy {
        /// `cpus` of quota, on v1 (a `cpu` and a `cpuacct` cgroup) or v2.
        fn new(tag: &str, cpus: f64) -> Busy {
            let mounts = Mounts::of_this_process();
            let name = format!("faultline-quota-{tag}-{}", std::process::id());
            let mut sh = std::process::Command::new("sh");
            sh.args(["-c", "while :; do :; done"]);
            // SAFETY: prctl is async-signal-safe, as a pre_exec hook must
            // be; it asks for the loop to be killed when this thread ends,
            // so a test killed before its Drop runs leaves no loop behind.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut sh, || {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                })
            };
            let loop_ = sh.spawn().expect("sh for a busy loop");
            let mut busy = Busy {
                loop_,
                dirs: Vec::new(),
                quota: Quota { levels: Vec::new() },
            };
            let pid = busy.loop_.id().to_string();
            let quota_us = (cpus * 100_000.0) as u64;
            let write = |path: PathBuf, text: &str| {
                std::fs::write(&path, text).unwrap_or_else(|e| {
                    panic!("writing {text:?} to {}: {e} (needs root)", path.display())
                })
            };
            let mkdir = |busy: &mut Busy, root: &Path| {
                let dir = root.join(&name);
                std::fs::create_dir(&dir)
                    .unwrap_or_else(|e| panic!("mkdir {}: {e} (needs root)", dir.display()));
                busy.dirs.push(dir.clone());
                dir
            };
            busy.quota = match (&mounts.v1_cpu, &mounts.v1_cpuacct, &mounts.v2) {
                // A high weight, so that the loop gets its quota on a
                // machine busy with other tests.
                (Some(cpu), Some(acct), _) => {
                    let cpu_dir = mkdir(&mut busy, cpu);
                    write(cpu_dir.join("cpu.cfs_period_us"), "100000");
                    write(cpu_dir.join("cpu.cfs_quota_us"), &quota_us.to_string());
                    write(cpu_dir.join("cpu.shares"), "10240");
                    write(cpu_dir.join("cgroup.procs"), &pid);
                    if acct != cpu {
                        let acct_dir = mkdir(&mut busy, acct);
                        write(acct_dir.join("cgroup.procs"), &pid);
                    }
                    Quota::under(cpu, &name, Some(acct))
                }
                (None, _, Some(v2)) => {
                    write(v2.join("cgroup.subtree_control"), "+cpu");
                    let dir = mkdir(&mut busy, v2);
                    write(dir.join("cpu.max"), &format!("{quota_us} 100000"));
                    write(dir.join("cpu.weight"), "10000");
                    write(dir.join("cgroup.procs"), &pid);
                    Quota::under(v2, &name, None)
                }
                _ => panic!("no CPU controller mounted (v1 cpu + cpuacct, or v2): {mounts:?}"),
            }
            .expect("the quota just set");
            busy
        }
    }

    impl Busy {
        /// Sets the quota to `cpus` while the loop runs.
        fn set_cpus(&self, cpus: f64) {
            let (dir, quota_us) = (&self.dirs[0], (cpus * 100_000.0) as u64);
            let (file, text) = match self.quota.levels[0].limit {
                Limit::V2 { .. } => ("cpu.max", format!("{quota_us} 100000")),
                Limit::V1 { .. } => ("cpu.cfs_quota_us", quota_us.to_string()),
            };
            std::fs::write(dir.join(file), &text)
                .unwrap_or_else(|e| panic!("writing {text:?} to {file}: {e}"));
        }
    }

    impl Drop for Busy {
        fn drop(&mut self) {
            let _ = self.loop_.kill();
            let _ = self.loop_.wait();
            for dir in &self.dirs {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    /// A busy loop under 0.3 CPU of quota uses it all; under 2 CPUs it
    /// uses at most one, leaving a CPU of quota unused at least.
    #[test]
    fn a_throttled_cgroup_leaves_no_quota_unused_and_a_roomy_one_does() {
        let tight = Busy::new("tight", 0.3);
        let roomy = Busy::new("roomy", 2.0);
        let cpus = |b: &Busy| b.quota.read().expect("a quota binds").cpus();
        assert_eq!((cpus(&tight), cpus(&roomy)), (0.3, 2.0));
        std::thread::sleep(Duration::from_millis(200));
        let read = |b: &Busy| b.quota.read().expect("usage readable").unused;
        let (t0, r0) = (read(&tight), read(&roomy));
        std::thread::sleep(Duration::from_millis(500));
        let (t1, r1) = (read(&tight), read(&roomy));
        let ms = |a: u64, b: u64| a.wrapping_sub(b) as i64 / 1_000_000;
        // Of 150 ms of quota in 500 ms the loop used over 60 (a period's
        // quota, 30 ms, is the slack at each end).
        assert!(
            ms(t1, t0) < 90,
            "0.3 CPU quota: {} ms of 150 unused",
            ms(t1, t0)
        );
        // Of 1,000 ms, one loop can use 500 at most.
        assert!(
            ms(r1, r0) >= 400,
            "2 CPU quota: {} ms of 1,000 unused",
            ms(r1, r0)
        );
        // Resized while it runs: the next reading binds the new quota.
        let before = tight.quota.read().expect("a quota binds");
        tight.set_cpus(1.5);
        let after = tight.quota.read().expect("a quota binds");
        assert_eq!((before.cpus(), after.cpus()), (0.3, 1.5));
        assert_ne!(before.binding, after.binding);
    }
}
