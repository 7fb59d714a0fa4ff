//! Facts about the machine: physical memory, the transparent huge page mode,
//! the CPU the calling thread runs on, and a cycle counter; plus the few
//! file calls the benchmarks' baselines need (read-ahead, `O_DIRECT`), and
//! a read of a short kernel file that allocates nothing.
//! Read-only, no locks, no state.

/// Transparent huge page mode, from `/sys/kernel/mm/transparent_hugepage/enabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThpMode {
    /// `[always]`: every eligible anonymous range.
    Always,
    /// `[madvise]`: ranges with `MADV_HUGEPAGE` only.
    Madvise,
    /// `[never]`, or the file is missing (kernel without THP).
    Never,
}

impl ThpMode {
    /// Whether a range with `MADV_HUGEPAGE` can get huge pages.
    pub fn usable(self) -> bool {
        self != ThpMode::Never
    }
}

/// The current THP mode.
pub fn thp_mode() -> ThpMode {
    match std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled") {
        Ok(s) if s.contains("[always]") => ThpMode::Always,
        Ok(s) if s.contains("[madvise]") => ThpMode::Madvise,
        _ => ThpMode::Never,
    }
}

/// The kernel release (`uname -r`).
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; all-zero is a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid utsname to fill.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::from("unknown");
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The CPU model name, from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| String::from("unknown"))
}

/// Bytes of physical memory (`sysconf(_SC_PHYS_PAGES) * page size`).
pub fn physical_memory() -> usize {
    // SAFETY: sysconf has no preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(pages).unwrap_or(0) * usize::try_from(size).unwrap_or(0)
}

/// How much more memory this process may take before the kernel's limit
/// for it (`(limit, what)`): the room left under its memory cgroup's limit
/// (v1 `memory.limit_in_bytes - memory.usage_in_bytes`, v2 `memory.max -
/// memory.current`, each plus the cgroup's clean inactive file pages:
/// page cache the kernel drops before it refuses anyone memory, as the
/// kubelet's "working set" counts it) and the machine's `MemAvailable`,
/// whichever is less. `None` if none of them can be read.
pub fn memory_room() -> Option<(usize, &'static str)> {
    let mut best: Option<(usize, &'static str)> = None;
    let mut consider = |room: usize, what: &'static str| {
        if best.is_none_or(|(b, _)| room < b) {
            best = Some((room, what));
        }
    };
    if let Some((room, version)) = crate::cgroup::process_room() {
        let what = match version {
            crate::cgroup::Version::V1 => "the memory cgroup (v1) limit",
            crate::cgroup::Version::V2 => "the memory cgroup (v2) limit",
        };
        consider(room, what);
    }
    if let Ok(mi) = std::fs::read_to_string("/proc/meminfo") {
        if let Some(kb) = mi
            .lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<usize>().ok())
        {
            consider(kb.saturating_mul(1024), "available memory (MemAvailable)");
        }
    }
    best
}

/// The base page size the kernel uses.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(crate::PAGE_SIZE)
}

/// The CPU the calling thread runs on now (`sched_getcpu`, served from rseq
/// by current glibc, so it costs a few nanoseconds). 0 if it fails.
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

/// Writes all dirty file data to disk (`sync(2)`).
pub fn sync_all() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

/// This process's id (changes in a child of `fork()`).
pub fn process_id() -> u32 {
    std::process::id()
}

/// When process `pid` started, in clock ticks after boot (field 22 of
/// `/proc/<pid>/stat`); `None` if there is no such process. With the pid it
/// names one process: a pid reused later has another start time.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // fields after its closing parenthesis, which is field 3 onwards.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The calling thread's kernel thread id.
pub fn thread_id() -> u32 {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    u32::try_from(tid).unwrap_or(0)
}

/// Number of CPUs this process may run on.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPUs the calling thread may run on (its affinity mask,
/// `sched_getaffinity`), ascending: a process confined by `taskset` or a
/// cpuset gets only those. `[0]` if the mask cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    let cpus: Vec<usize> = CpuSet::of_this_thread()
        .map(|set| set.cpus().collect())
        .unwrap_or_default();
    if cpus.is_empty() {
        vec![0]
    } else {
        cpus
    }
}

/// A set of CPUs: an affinity mask.
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// The calling thread's affinity mask; `None` where it cannot be read.
    pub fn of_this_thread() -> Option<CpuSet> {
        // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of
        // the size passed, written by the kernel.
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        (rc == 0).then_some(CpuSet(set))
    }

    /// Makes this set the calling thread's affinity mask
    /// (`sched_setaffinity`); the error names the set's lowest CPU.
    pub fn set_for_this_thread(&self) -> Result<(), crate::SysError> {
        // SAFETY: pid 0 is the calling thread; `self.0` is a valid cpu_set_t
        // of the size passed.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
        if rc != 0 {
            let first = self.cpus().next().unwrap_or(0);
            return Err(crate::SysError::last("sched_setaffinity", first, 0));
        }
        Ok(())
    }

    /// The set of the CPUs listed (those at or past `CPU_SETSIZE` left out).
    pub fn of(cpus: &[usize]) -> CpuSet {
        // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &cpu in cpus.iter().filter(|&&cpu| cpu < libc::CPU_SETSIZE as usize) {
            // SAFETY: `cpu` < CPU_SETSIZE, checked above.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        CpuSet(set)
    }

    /// Whether CPU `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        // SAFETY: `cpu` < CPU_SETSIZE is checked before the bit is read.
        cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    /// How many CPUs the set holds.
    pub fn count(&self) -> usize {
        // SAFETY: `self.0` is a valid, initialised cpu_set_t.
        usize::try_from(unsafe { libc::CPU_COUNT(&self.0) }).unwrap_or(0)
    }

    /// Whether every CPU of this set is in `other` too.
    pub fn is_within(&self, other: &CpuSet) -> bool {
        self.cpus().all(|cpu| other.contains(cpu))
    }

    /// The set's CPUs, ascending.
    pub fn cpus(&self) -> impl Iterator<Item = usize> + '_ {
        (0..libc::CPU_SETSIZE as usize).filter(|&cpu| self.contains(cpu))
    }
}

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.cpus()).finish()
    }
}

/// Asks the kernel to start reading `[offset, offset + len)` of the open
/// file `file` into the page cache in the background
/// (`posix_fadvise(POSIX_FADV_WILLNEED)`): an asynchronous read-ahead.
pub fn file_willneed(file: &std::fs::File, offset: u64, len: usize) -> Result<(), crate::SysError> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain advisory call on an fd we hold open; it reads no
    // memory of ours.
    let rc = unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_WILLNEED,
        )
    };
    if rc != 0 {
        return Err(crate::SysError {
            op: "posix_fadvise(WILLNEED)",
            addr: offset as usize,
            len,
            errno: rc,
        });
    }
    Ok(())
}

/// Deallocates `[offset, offset + len)` of `file` (`fallocate` with
/// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`): the range reads as zeros
/// and its blocks are freed; the file keeps its size.
///
/// # Errors
/// The `fallocate` errno (`EOPNOTSUPP` on a file system without holes).
pub fn punch_hole(file: &std::fs::File, offset: u64, len: u64) -> Result<(), crate::SysError> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain call on an fd we hold open; it reads no memory of ours.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc != 0 {
        return Err(crate::SysError {
            op: "fallocate(PUNCH_HOLE)",
            addr: offset as usize,
            len: len as usize,
            errno: crate::last_errno(),
        });
    }
    Ok(())
}

/// Opens `path` read-only with `O_DIRECT`: reads bypass the page cache and
/// go to the device (buffers, offsets and lengths must be aligned to the
/// logical block size; 4096 always is). A file system without `O_DIRECT`
/// (tmpfs) fails here or at the first read with `EINVAL`.
pub fn open_direct(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Opens the file behind `file` again, as a new open file description with
/// `O_DIRECT` (through `/proc/self/fd`, so it works for a file that was
/// renamed or deleted, and leaves the flags of `file`, which a caller may
/// share, untouched); read-write if `writable`. The same alignment rules as
/// [`open_direct`]; a file system without `O_DIRECT` fails with `EINVAL`.
pub fn reopen_direct(file: &std::fs::File, writable: bool) -> std::io::Result<std::fs::File> {
    reopen_with(file, writable, libc::O_DIRECT)
}

/// `file` opened again (`/proc/self/fd/N`, close-on-exec): a new open file
/// description of the same file (it works for a deleted file too), for
/// reading, and for writing if `writable`.
pub fn reopen(file: &std::fs::File, writable: bool) -> std::io::Result<std::fs::File> {
    reopen_with(file, writable, 0)
}

/// [`reopen`] with `flags` added to `O_CLOEXEC`.
fn reopen_with(
    file: &std::fs::File,
    writable: bool,
    flags: libc::c_int,
) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(flags | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// CPU time all threads of this process have used so far, user and system
/// (`CLOCK_PROCESS_CPUTIME_ID`); `None` where the clock cannot be read.
/// Benches take it before and after a timed run to give the CPU a run cost
/// beside its rate.
pub fn process_cpu_time() -> Option<std::time::Duration> {
    cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// [`process_cpu_time`] of process `pid` (`clock_getcpuclockid`), for a
/// local server's share of a run; `None` once it has been reaped.
pub fn other_process_cpu_time(pid: u32) -> Option<std::time::Duration> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    let mut id: libc::clockid_t = 0;
    // SAFETY: `id` is a valid, writable clockid_t for the call.
    if unsafe { libc::clock_getcpuclockid(pid, &mut id) } != 0 {
        return None;
    }
    cpu_clock(id)
}

/// The CPU-time clock `id` (`clock_gettime`), `None` where it cannot be read.
fn cpu_clock(id: libc::clockid_t) -> Option<std::time::Duration> {
    // SAFETY: timespec is plain data; all-zero is a valid value.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid, writable timespec for the call.
    if unsafe { libc::clock_gettime(id, &mut t) } != 0 {
        return None;
    }
    Some(std::time::Duration::new(
        u64::try_from(t.tv_sec).ok()?,
        u32::try_from(t.tv_nsec).ok()?,
    ))
}

/// Minor page faults the calling thread has taken (`getrusage`).
pub fn thread_minor_faults() -> i64 {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } != 0 {
        return 0;
    }
    u.ru_minflt
}

/// Major page faults all threads of this process have taken so far
/// (`getrusage(RUSAGE_SELF)`: faults that waited for a read — a page-cache
/// miss of a file mapping, a swap-in from the device); `None` where it
/// cannot be read. Benches take it before and after a timed run to count
/// the kernel's misses.
pub fn process_major_faults() -> Option<u64> {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return None;
    }
    u64::try_from(u.ru_majflt).ok()
}

/// The online NUMA nodes (`/sys/devices/system/node/online`, e.g. `0-1`);
/// `[0]` where the kernel has no NUMA support.
pub fn numa_nodes() -> Vec<u32> {
    let Ok(s) = std::fs::read_to_string("/sys/devices/system/node/online") else {
        return vec![0];
    };
    let mut nodes = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|n| n.trim().parse::<u32>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => nodes.push(a),
            (Some(Ok(a)), Some(Ok(b))) if a <= b => nodes.extend(a..=b),
            _ => return vec![0],
        }
    }
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// The time-stamp counter (cycles at the invariant TSC rate), or 0 where the
/// architecture has none.
#[inline]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC exists on every x86_64 CPU and only reads a counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// Sets the calling thread's nice value (Linux: per thread). Used to make
/// background workers yield to the fault path.
pub fn set_thread_nice(nice: i32) -> Result<(), crate::SysError> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // SAFETY: setpriority on our own thread id; plain integers.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc != 0 {
        return Err(crate::SysError::last("setpriority", 0, 0));
    }
    Ok(())
}

/// Pins the calling thread to `cpu` (`sched_setaffinity`).
pub fn pin_thread(cpu: usize) -> Result<(), crate::SysError> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(crate::SysError {
            op: "sched_setaffinity",
            addr: cpu,
            len: 0,
            errno: libc::EINVAL,
        });
    }
    CpuSet::of(&[cpu]).set_for_this_thread()
}

/// Whether the open file `file` was opened for writing (its access mode,
/// `fcntl(F_GETFL)`, is `O_WRONLY` or `O_RDWR`).
pub fn opened_for_writing(file: &std::fs::File) -> Result<bool, crate::SysError> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL only reads the flags of an fd we hold open.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(crate::SysError::last("fcntl(F_GETFL)", 0, 0));
    }
    Ok(flags & libc::O_ACCMODE != libc::O_RDONLY)
}

/// What one `read(2)` of the file at `path` gives, into `buf`: a short
/// `/proc`, `/sys` or cgroup file comes whole. Allocates nothing, however
/// long the path (a caller may be a fault served in a SIGBUS handler that
/// interrupted `malloc`). `None` if it cannot be opened or read.
pub fn read_small_file<'b>(path: &std::ffi::CStr, buf: &'b mut [u8]) -> Option<&'b [u8]> {
    // SAFETY: `path` is NUL-terminated; the flags ask for a read-only
    // descriptor, closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is the descriptor just opened, read into `buf` of the
    // length passed, and closed once.
    let n = unsafe {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    Some(&buf[..usize::try_from(n).ok()?])
}

/// Sets the calling thread's `errno` (for C APIs that report through it).
pub fn set_errno(errno: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's life.
    unsafe { *libc::__errno_location() = errno };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_sets_count_contain_and_nest() {
        let set = CpuSet::of(&[0, 3, 64, 1023, 5000]);
        assert_eq!(set.count(), 4, "5000 is past CPU_SETSIZE");
        assert!(set.contains(64) && !set.contains(1) && !set.contains(5000));
        assert_eq!(format!("{set:?}"), "{0, 3, 64, 1023}");
        assert!(CpuSet::of(&[3, 64]).is_within(&set));
        assert!(CpuSet::of(&[]).is_within(&set));
        assert!(!CpuSet::of(&[3, 65]).is_within(&set));
        assert!(set.is_within(&set));
        let own = CpuSet::of_this_thread().expect("sched_getaffinity");
        assert_eq!(own.count(), allowed_cpus().len());
    }

    #[test]
    fn process_cpu_time_counts_other_threads_work() {
        // The calling thread's own CPU clock.
        let thread_cpu =
            || cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID).expect("CLOCK_THREAD_CPUTIME_ID");
        let burn = std::time::Duration::from_millis(30);
        let before = process_cpu_time().expect("CLOCK_PROCESS_CPUTIME_ID");
        // Another thread burns 30 ms of its own CPU (however long that
        // takes on a busy machine): the process's clock counts all of it.
        std::thread::spawn(move || {
            let mut x = 1u64;
            while thread_cpu() < burn {
                x = std::hint::black_box(x.wrapping_mul(3).wrapping_add(1));
            }
        })
        .join()
        .expect("the burning thread");
        let used = process_cpu_time().expect("CLOCK_PROCESS_CPUTIME_ID") - before;
        assert!(used >= burn, "the process's CPU clock moved only {used:?}");
    }

    #[test]
    fn major_faults_count_another_threads_read_of_a_dropped_page() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        // A file of this test's own, its page written, synced and dropped
        // from the page cache: the first read of its mapping waits for
        // the disk, a major fault, taken here by another thread.
        let path = std::env::temp_dir().join(format!(
            "faultline-sys-majflt-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        struct Remove(std::path::PathBuf);
        impl Drop for Remove {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let _remove = Remove(path.clone());
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("a file in the temp directory");
        f.write_all(&[7u8; 4096]).expect("write");
        f.sync_all().expect("fsync");
        // SAFETY: plain call on an open descriptor.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 4096, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
        let m = crate::mem::Mapping::shared_file(&f, 4096).expect("mmap");
        let before = process_major_faults().expect("getrusage");
        let addr = m.addr();
        // SAFETY: the mapping is 4096 readable bytes and outlives the thread.
        let v = std::thread::spawn(move || unsafe { (addr as *const u8).read_volatile() })
            .join()
            .expect("the reading thread");
        assert_eq!(v, 7);
        let after = process_major_faults().expect("getrusage");
        assert!(
            after > before,
            "no major fault counted ({before} -> {after}); a temp directory on tmpfs \
             keeps the page in memory, set TMPDIR to a disk"
        );
    }

    #[test]
    fn facts_are_sane() {
        assert!(physical_memory() > 64 << 20);
        assert_eq!(page_size(), crate::PAGE_SIZE);
        assert!(current_cpu() < 4096);
        assert!(online_cpus() >= 1);
        let allowed = allowed_cpus();
        assert!(!allowed.is_empty() && allowed.is_sorted());
        assert!(allowed.contains(&current_cpu()), "{allowed:?}");
        let a = cycles();
        let b = cycles();
        assert!(b >= a);
        let nodes = numa_nodes();
        assert!(!nodes.is_empty() && nodes.windows(2).all(|w| w[0] < w[1]));
    }
}
