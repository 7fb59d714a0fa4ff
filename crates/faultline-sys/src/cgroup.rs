//! Memory cgroups on both hierarchies: v1 (a `memory` controller mount,
//! `memory.limit_in_bytes`) and v2 (the unified hierarchy, `memory.max`).
//!
//! [`Hierarchy::find`] reads `/proc/self/mountinfo` for where the memory
//! controller is: a v1 mount whose options name `memory` wins (a controller
//! bound to v1 is absent from v2, as on a hybrid systemd layout), else a
//! `cgroup2` mount whose `cgroup.controllers` lists `memory`. Nothing is
//! assumed at a fixed path (`/sys/fs/cgroup/memory` is v1's usual place,
//! `/sys/fs/cgroup` v2's, `/sys/fs/cgroup/unified` a hybrid's).
//!
//! [`Hierarchy::create`] makes a child cgroup with a memory limit (the
//! benches run each side of a comparison in one); on v2 it first enables
//! the memory controller for the root's children
//! (`cgroup.subtree_control`), which needs root and a hierarchy root that
//! the kernel lets delegate (in a container, one whose root holds no
//! process). [`MemoryCgroup`] reads its peak (`memory.max_usage_in_bytes` /
//! `memory.peak`) and OOM kills (`memory.oom_control` / `memory.events`)
//! and removes the directory on drop.
//!
//! [`process_memory`] finds the memory cgroup of this process (both
//! hierarchies), for the room a budget may take. Plain file I/O on
//! cgroupfs: no locks, no state kept between calls.

use std::path::{Path, PathBuf};

/// Which cgroup hierarchy a memory cgroup belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The v1 `memory` controller's own hierarchy.
    V1,
    /// The unified hierarchy.
    V2,
}

impl Version {
    /// The file holding the limit.
    pub fn limit_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        }
    }

    /// The file holding the current usage.
    pub fn usage_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }
    }

    /// The file holding the peak usage.
    pub fn peak_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        }
    }

    /// The file whose `oom_kill` line counts the processes the cgroup's
    /// OOM killer took.
    pub fn oom_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        }
    }

    /// The `memory.stat` fields of page cache a limit drops at once
    /// (`[inactive, dirty, writeback]`): v1 names the hierarchical totals.
    pub fn droppable_fields(self) -> [&'static str; 3] {
        match self {
            Version::V1 => ["total_inactive_file", "total_dirty", "total_writeback"],
            Version::V2 => ["inactive_file", "file_dirty", "file_writeback"],
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V1 => "cgroup v1",
            Version::V2 => "cgroup v2",
        })
    }
}

/// Why a memory cgroup could not be found, made or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    /// No mounted hierarchy has the memory controller.
    #[error("no memory cgroup controller is mounted: neither a cgroup v1 `memory` mount nor a cgroup2 mount listing `memory` in cgroup.controllers ({seen})")]
    NoMemoryController {
        /// What the mount table held.
        seen: String,
    },
    /// A file or directory of the hierarchy could not be read or written.
    #[error("{what} {}: {source} ({version}; needs root)", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The hierarchy.
        version: Version,
        /// The cause.
        source: std::io::Error,
    },
    /// On v2, the memory controller could not be enabled for the root's
    /// children.
    #[error("cannot enable the memory controller for the children of {} (writing `+memory` to cgroup.subtree_control): {source} (cgroup v2: needs root, and a hierarchy root that holds no process of its own, e.g. not the root of a container's cgroup namespace)", root.display())]
    Delegation {
        /// The hierarchy's root.
        root: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Where the memory controller's hierarchy is mounted, and which one it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    version: Version,
    root: PathBuf,
}

/// Mount points of cgroup hierarchies in a mount table: the v1 `memory`,
/// `cpu` and `cpuacct` controllers', and the unified (v2) hierarchy's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mounts {
    /// The v1 memory controller's mount point.
    pub v1_memory: Option<PathBuf>,
    /// The v1 `cpu` controller's mount point (CPU quotas).
    pub v1_cpu: Option<PathBuf>,
    /// The v1 `cpuacct` controller's mount point (CPU usage; often the
    /// same as `v1_cpu`'s).
    pub v1_cpuacct: Option<PathBuf>,
    /// The cgroup2 mount point.
    pub v2: Option<PathBuf>,
}

impl Mounts {
    /// This process's view (`/proc/self/mountinfo`); empty if unreadable.
    pub fn of_this_process() -> Mounts {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|t| Mounts::parse(&t))
            .unwrap_or_default()
    }

    /// Parses the text of a `mountinfo` file: field 5 is the mount point,
    /// and after the ` - ` separator come the file system type, the source
    /// and the super-block options (v1 lists its controllers there).
    pub fn parse(mountinfo: &str) -> Mounts {
        let mut m = Mounts::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(point) = left.split(' ').nth(4) else {
                continue;
            };
            let mut r = right.split(' ');
            let (fstype, _source, options) = (r.next(), r.next(), r.next().unwrap_or(""));
            let point = PathBuf::from(unescape(point));
            match fstype {
                Some("cgroup2") if m.v2.is_none() => m.v2 = Some(point),
                Some("cgroup") => {
                    for (controller, slot) in [
                        ("memory", &mut m.v1_memory),
                        ("cpu", &mut m.v1_cpu),
                        ("cpuacct", &mut m.v1_cpuacct),
                    ] {
                        if slot.is_none() && options.split(',').any(|o| o == controller) {
                            *slot = Some(point.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        m
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Hierarchy {
    /// The hierarchy that has the memory controller on this machine.
    ///
    /// # Errors
    /// [`CgroupError::NoMemoryController`] if neither has it.
    pub fn find() -> Result<Hierarchy, CgroupError> {
        Hierarchy::choose(&Mounts::of_this_process())
    }

    /// The hierarchy with the memory controller among `mounts`: v1's
    /// `memory` mount, else a v2 mount listing `memory` as available.
    ///
    /// # Errors
    /// [`CgroupError::NoMemoryController`] if neither has it.
    pub fn choose(mounts: &Mounts) -> Result<Hierarchy, CgroupError> {
        if let Some(root) = &mounts.v1_memory {
            return Ok(Hierarchy::at(Version::V1, root));
        }
        if let Some(root) = &mounts.v2 {
            let controllers =
                std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "memory") {
                return Ok(Hierarchy::at(Version::V2, root));
            }
        }
        Err(CgroupError::NoMemoryController {
            seen: format!(
                "v1 memory mount: {}, cgroup2 mount: {}",
                mounts
                    .v1_memory
                    .as_ref()
                    .map_or("none".into(), |p| p.display().to_string()),
                mounts.v2.as_ref().map_or("none".into(), |p| format!(
                    "{} without the memory controller",
                    p.display()
                )),
            ),
        })
    }

    /// A hierarchy of `version` mounted at `root` (tests lay one out in a
    /// directory of their own).
    pub fn at(version: Version, root: &Path) -> Hierarchy {
        Hierarchy {
            version,
            root: root.to_path_buf(),
        }
    }

    /// v1 or v2.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Where it is mounted.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Makes the child cgroup `name` of the hierarchy's root with a memory
    /// limit of `limit` bytes (on v2, enabling the memory controller for
    /// the root's children first, if it is not). It is removed when the
    /// returned value drops.
    ///
    /// # Errors
    /// [`CgroupError::Delegation`] if v2 will not enable the controller,
    /// [`CgroupError::Io`] naming the path that failed.
    pub fn create(&self, name: &str, limit: usize) -> Result<MemoryCgroup, CgroupError> {
        let version = self.version;
        let io = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| CgroupError::Io {
                what,
                path,
                version,
                source,
            }
        };
        if version == Version::V2 {
            let control = self.root.join("cgroup.subtree_control");
            let enabled = std::fs::read_to_string(&control).map_err(io("reading", &control))?;
            if !enabled.split_whitespace().any(|c| c == "memory") {
                std::fs::write(&control, "+memory").map_err(|source| CgroupError::Delegation {
                    root: self.root.clone(),
                    source,
                })?;
            }
        }
        let dir = self.root.join(name);
        std::fs::create_dir(&dir).map_err(io("creating", &dir))?;
        // From here on, a failure removes the directory (on drop).
        let cg = MemoryCgroup { dir, version };
        let file = cg.dir.join(version.limit_file());
        std::fs::write(&file, limit.to_string()).map_err(io("writing the limit to", &file))?;
        Ok(cg)
    }
}

/// A memory cgroup made by [`Hierarchy::create`], removed on drop.
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
    version: Version,
}

impl MemoryCgroup {
    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its hierarchy.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Moves process `pid` into it.
    ///
    /// # Errors
    /// [`CgroupError::Io`] if `cgroup.procs` refuses it.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        let file = self.dir.join("cgroup.procs");
        std::fs::write(&file, pid.to_string()).map_err(|source| CgroupError::Io {
            what: "adding a process to",
            path: file,
            version: self.version,
            source,
        })
    }

    /// Its limit in bytes (`None` for no limit, or if unreadable).
    pub fn limit(&self) -> Option<usize> {
        read_bytes(&self.dir.join(self.version.limit_file()))
    }

    /// The most memory it has held, in bytes (`None` if the kernel does
    /// not keep it: `memory.peak` is 5.19+).
    pub fn peak(&self) -> Option<usize> {
        read_bytes(&self.dir.join(self.version.peak_file()))
    }

    /// Processes its OOM killer has killed (`None` if unreadable).
    pub fn oom_kills(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.dir.join(self.version.oom_file())).ok()?;
        keyed(&text, "oom_kill").map(|n| n as u64)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // A process that just exited may still be counted for a moment
        // (EBUSY): try again briefly. A directory laid out by a test holds
        // plain files, which a cgroupfs directory lists but cannot lose.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(_) => break,
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The value of `key` in the text of a flat keyed cgroup file
/// (`memory.stat`, `memory.events`, `memory.oom_control`: `key value`
/// lines).
fn keyed(text: &str, key: &str) -> Option<usize> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// How much more memory this process may take under its memory cgroup's
/// limit, and the hierarchy: the limit less the usage, plus the cgroup's
/// clean inactive file pages (page cache the kernel drops before it
/// refuses anyone memory, as the kubelet's "working set" counts it).
/// `None` without a memory cgroup or a limit.
pub fn process_room() -> Option<(usize, Version)> {
    let (version, dir) = process_memory()?;
    let limit = read_bytes(&dir.join(version.limit_file()))?;
    let usage = read_bytes(&dir.join(version.usage_file()))?;
    Some((
        limit.saturating_sub(usage.saturating_sub(droppable(version, &dir))),
        version,
    ))
}

/// The page cache a cgroup's limit can drop at once: its inactive file
/// pages less the dirty and writeback ones, which the limit can only wait
/// for (`memory.stat`, read once). 0 if the file cannot be read.
fn droppable(version: Version, dir: &Path) -> usize {
    let Ok(stat) = std::fs::read_to_string(dir.join("memory.stat")) else {
        return 0;
    };
    let [inactive, dirty, writeback] = version
        .droppable_fields()
        .map(|f| keyed(&stat, f).unwrap_or(0));
    inactive.saturating_sub(dirty + writeback)
}

/// A byte count in a cgroup file: a number, or `max` (no limit: `None`).
fn read_bytes(path: &Path) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The memory cgroup of this process: its hierarchy and directory (the
/// hierarchy's mount point joined with the path `/proc/self/cgroup` gives).
/// `None` if there is none (no memory controller, or the file is
/// unreadable).
pub fn process_memory() -> Option<(Version, PathBuf)> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let h = Hierarchy::find().ok()?;
    Some((h.version, memory_dir(&h, &cgroup)?))
}

/// The directory of the memory cgroup a `/proc/<pid>/cgroup` text names in
/// hierarchy `h`: the `memory` line on v1, the `0::` line on v2.
pub fn memory_dir(h: &Hierarchy, proc_cgroup: &str) -> Option<PathBuf> {
    let v1_controller = match h.version {
        Version::V1 => Some("memory"),
        Version::V2 => None,
    };
    Some(h.root.join(cgroup_path(proc_cgroup, v1_controller)?))
}

/// The path, relative to its hierarchy's root, of the cgroup a
/// `/proc/<pid>/cgroup` text names for the v1 controller `v1_controller`
/// (its line lists it), or on v2 (`None`: the `0::` line).
pub fn cgroup_path<'t>(proc_cgroup: &'t str, v1_controller: Option<&str>) -> Option<&'t str> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let ours = match v1_controller {
            Some(c) => ctrl.split(',').any(|x| x == c),
            None => ctrl.is_empty(),
        };
        ours.then(|| path.trim_start_matches('/'))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A hybrid systemd layout (this project's usual machine), and a
    /// v2-only one, as `/proc/self/mountinfo` shows them.
    const HYBRID: &str = "\
24 30 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const V2_ONLY: &str = "\
24 30 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
29 24 0:25 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn mount_tables_of_both_layouts_parse() {
        let m = Mounts::parse(HYBRID);
        assert_eq!(
            m.v1_memory.as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(m.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert_eq!(m.v1_cpu.as_deref(), Some(Path::new("/sys/fs/cgroup/cpu")));
        assert_eq!(m.v1_cpuacct, None);
        let together =
            "33 31 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let m = Mounts::parse(together);
        assert_eq!(m.v1_cpu, m.v1_cpuacct);
        assert_eq!(
            m.v1_cpu.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
        );
        let m = Mounts::parse(V2_ONLY);
        assert_eq!(m.v1_memory, None);
        assert_eq!(m.v2.as_deref(), Some(Path::new("/sys/fs/cgroup")));
        assert_eq!(
            Hierarchy::choose(&Mounts::parse(HYBRID))
                .map(|h| h.version())
                .ok(),
            Some(Version::V1)
        );
        assert_eq!(unescape(r"/mnt/my\040cgroups"), "/mnt/my cgroups");
        assert_eq!(Mounts::parse("garbage\n\n1 2"), Mounts::default());
    }

    #[test]
    fn the_process_cgroup_file_names_the_directory_on_either_hierarchy() {
        let text = "12:memory:/user.slice/a\n1:name=systemd:/x\n0::/user.slice/b\n";
        let v1 = Hierarchy::at(Version::V1, Path::new("/sys/fs/cgroup/memory"));
        let v2 = Hierarchy::at(Version::V2, Path::new("/sys/fs/cgroup"));
        assert_eq!(
            memory_dir(&v1, text).as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory/user.slice/a"))
        );
        assert_eq!(
            memory_dir(&v2, text).as_deref(),
            Some(Path::new("/sys/fs/cgroup/user.slice/b"))
        );
        assert_eq!(memory_dir(&v2, "12:memory:/a\n"), None);
    }

    #[test]
    fn stat_fields_are_read_by_exact_name() {
        let stat = "inactive_file 4096\ntotal_inactive_file 81920\ncache 12\n";
        assert_eq!(keyed(stat, "total_inactive_file"), Some(81920));
        assert_eq!(keyed(stat, "inactive_file"), Some(4096));
        assert_eq!(keyed(stat, "active_file"), None, "absent");
        assert_eq!(
            droppable(Version::V1, Path::new("/nonexistent-faultline")),
            0
        );
        let dir = Scratch::new("stat");
        let stat = "total_inactive_file 81920\ntotal_dirty 4096\ntotal_writeback 8192\n";
        std::fs::write(dir.0.join("memory.stat"), stat).expect("memory.stat");
        assert_eq!(
            droppable(Version::V1, &dir.0),
            81920 - 4096 - 8192,
            "dirty pages wait"
        );
    }

    /// A scratch directory removed on drop, also when the test fails.
    /// A directory of a test's own under the temporary directory, laid
    /// out as a cgroup hierarchy; removed on drop.
    pub(crate) struct Scratch(pub(crate) PathBuf);

    impl Scratch {
        pub(crate) fn new(tag: &str) -> Scratch {
            let p = std::env::temp_dir()
                .join(format!("faultline-sys-cgroup-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("scratch directory");
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The v2 file handling against a directory laid out as a v2 root:
    /// the controller is enabled for the children, the limit goes to
    /// `memory.max`, peak and OOM kills come from v2's files.
    #[test]
    fn a_v2_layout_gets_memory_max_and_the_controller_enabled() {
        let root = Scratch::new("v2");
        std::fs::write(
            root.0.join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .expect("layout");
        std::fs::write(root.0.join("cgroup.subtree_control"), "cpu\n").expect("layout");
        let mounts = Mounts {
            v2: Some(root.0.clone()),
            ..Mounts::default()
        };
        let h = Hierarchy::choose(&mounts).expect("v2 with memory");
        assert_eq!(h.version(), Version::V2);
        let cg = h.create("bench-1", 72 << 20).expect("created");
        assert_eq!(
            std::fs::read_to_string(root.0.join("cgroup.subtree_control"))
                .ok()
                .as_deref(),
            Some("+memory")
        );
        assert_eq!(cg.limit(), Some(72 << 20));
        std::fs::write(cg.dir().join("memory.peak"), "5242880\n").expect("layout");
        std::fs::write(
            cg.dir().join("memory.events"),
            "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n",
        )
        .expect("layout");
        assert_eq!(cg.peak(), Some(5 << 20));
        assert_eq!(cg.oom_kills(), Some(1));
        let dir = cg.dir().to_path_buf();
        drop(cg);
        assert!(!dir.exists(), "removed on drop");
        // A v2 root without the controller says which mounts it saw.
        std::fs::write(root.0.join("cgroup.controllers"), "cpu io\n").expect("layout");
        let err = Hierarchy::choose(&mounts).expect_err("no memory controller");
        assert!(
            err.to_string().contains("without the memory controller"),
            "{err}"
        );
    }

    #[test]
    fn a_v1_layout_gets_limit_in_bytes() {
        let root = Scratch::new("v1");
        let h = Hierarchy::at(Version::V1, &root.0);
        let cg = h.create("bench-1", 8 << 20).expect("created");
        assert!(cg.dir().join("memory.limit_in_bytes").exists());
        assert_eq!(cg.limit(), Some(8 << 20));
        std::fs::write(
            cg.dir().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .expect("layout");
        assert_eq!(cg.oom_kills(), Some(3));
        // A name taken fails naming the path.
        let err = h.create("bench-1", 8 << 20).expect_err("exists");
        assert!(err.to_string().contains("bench-1"), "{err}");
    }

    /// The machine's own hierarchy, for real (root): a cgroup with a limit,
    /// a process moved in, the limit read back, the directory removed.
    #[test]
    fn a_real_memory_cgroup_on_this_machine() {
        let h = Hierarchy::find().expect("a memory cgroup controller (v1 or v2)");
        let name = format!("faultline-sys-test-{}", std::process::id());
        let cg = h
            .create(&name, 64 << 20)
            .unwrap_or_else(|e| panic!("making a memory cgroup needs root: {e}"));
        assert_eq!(cg.limit(), Some(64 << 20));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let moved = cg.add(child.id());
        let _ = child.kill();
        let _ = child.wait();
        moved.expect("moved into the cgroup");
        assert_eq!(cg.oom_kills(), Some(0));
        let dir = cg.dir().to_path_buf();
        drop(cg);
        assert!(!dir.exists(), "{} removed", dir.display());
        assert!(process_memory().is_some());
    }
}
