//! How long the CPUs the calling thread may run on ([`cpu_idle_time`]), or
//! a given set of CPUs ([`cpu_idle_time_of`], a [`CpuSet`]), have stood
//! idle: the measure behind the rule that lets a read poll only while a
//! CPU is to spare (`io/pollers.rs`, which reads the process's CPUs for a
//! reader pinned within them).
//!
//! Which CPUs: an affinity mask, which `taskset`, a cpuset and a
//! container's `--cpuset-cpus` all narrow (the kernel keeps a task's mask
//! inside its cpuset). Where the mask holds every online CPU
//! the whole machine's idle time is read from `/proc/uptime` (one short
//! line, in ns summed over the CPUs and shown to 10 ms); where it holds
//! fewer, the idle ticks of those CPUs alone are summed from `/proc/stat`'s
//! `cpuN` lines — dearer (the kernel renders the whole file, every
//! interrupt's counts included, on the first read), so read only then.
//! Either way idle means idle without iowait: a CPU whose task sleeps on
//! I/O counts as iowait, so a reader's own CPU is not counted as one to
//! spare while it sleeps.
//!
//! Each reading also carries, where the process has a CPU quota (cgroup
//! v2 `cpu.max`, v1's CFS quota; `crate::cpu_quota`), how much of the
//! quota went unused: a process throttled by its quota has no CPU to spare
//! however idle the machine stands.
//!
//! Each reading carries [`IdleTime::cpus`], a fingerprint of the set it
//! sums: two readings are comparable only when their sets match (a thread
//! moved by `taskset -p` between them, or two threads pinned to different
//! CPUs, give readings of different sets).
//!
//! No allocation (a read may be a fault served in a SIGBUS handler that
//! interrupted `malloc`): the files are read through stack buffers. No
//! locks, no state kept between calls.

use crate::cpu_quota::{Quota, QuotaReading};
use crate::host::{read_small_file, CpuSet};
use std::io::Read;
use std::time::Duration;

/// The idle time of a set of CPUs, summed over them, since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleTime {
    /// Which CPUs were summed: [`WHOLE_MACHINE`], or a fingerprint of the
    /// calling thread's affinity mask.
    pub cpus: u64,
    /// Their idle time since boot. Two comparable readings `t` apart
    /// differ by `t` times the CPUs of the set that stood idle on average
    /// between them.
    pub idle: Duration,
    /// Where the process has a CPU quota: which binds and how much of it
    /// went unused ([`QuotaReading`]; two readings with the same
    /// `binding` differ, as the `i64` of their `unused` counters' wrapping
    /// difference, by the quota's CPU time left unused between them).
    /// `None` without a quota (or where its usage cannot be read).
    pub quota: Option<QuotaReading>,
}

/// [`IdleTime::cpus`] of a reading of every online CPU.
pub const WHOLE_MACHINE: u64 = 0;

/// The idle time of the CPUs the calling thread may run on (see the
/// module documentation); `None` where the files cannot be read.
pub fn cpu_idle_time() -> Option<IdleTime> {
    match CpuSet::of_this_thread() {
        Some(set) => cpu_idle_time_of(&set),
        None => whole_machine_idle_time(),
    }
}

/// The idle time of the CPUs of `set` (the whole machine's, read more
/// cheaply, where it holds every online CPU); `None` where the files
/// cannot be read.
pub fn cpu_idle_time_of(set: &CpuSet) -> Option<IdleTime> {
    let allowed = set.count();
    let narrower = allowed > 0 && machine_online_cpus().is_some_and(|online| allowed < online);
    // A narrower set whose CPUs `/proc/stat` does not show (a container's
    // `/proc` renumbered by LXCFS) is read as the whole machine.
    match narrower.then(|| idle_of_set(set)).flatten() {
        Some(idle) => Some(IdleTime {
            cpus: fingerprint(set),
            idle,
            quota: quota_reading(),
        }),
        None => whole_machine_idle_time(),
    }
}

/// The whole machine's [`IdleTime`].
fn whole_machine_idle_time() -> Option<IdleTime> {
    Some(IdleTime {
        cpus: WHOLE_MACHINE,
        idle: idle_of_machine()?,
        quota: quota_reading(),
    })
}

/// The whole machine's idle time, from `/proc/uptime`.
fn idle_of_machine() -> Option<Duration> {
    let mut line = [0u8; 64];
    idle_of_uptime(read_small_file(c"/proc/uptime", &mut line)?)
}

/// The idle time of the CPUs in `set`, from `/proc/stat`.
fn idle_of_set(set: &CpuSet) -> Option<Duration> {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks_per_sec = u64::try_from(ticks_per_sec).ok().filter(|&t| t > 0)?;
    let stat = std::fs::File::open("/proc/stat").ok()?;
    let ticks = idle_ticks_of_stat(stat, |cpu| set.contains(cpu))?;
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(ticks_per_sec);
    Some(Duration::from_nanos(
        u64::try_from(nanos).unwrap_or(u64::MAX),
    ))
}

/// How many CPUs the machine has online, from
/// `/sys/devices/system/cpu/online` (not `host::online_cpus`, the CPUs
/// this process may use)
/// (`sysconf(_SC_NPROCESSORS_ONLN)` counts the affinity mask instead on
/// some C libraries, which would make every mask look whole).
fn machine_online_cpus() -> Option<usize> {
    let mut list = [0u8; 256];
    count_of_cpu_list(read_small_file(
        c"/sys/devices/system/cpu/online",
        &mut list,
    )?)
}

/// The number of CPUs in a kernel CPU list (`"0-3,8,10-11\n"`: 7).
fn count_of_cpu_list(list: &[u8]) -> Option<usize> {
    let list = std::str::from_utf8(list).ok()?.trim();
    list.split(',').try_fold(0usize, |count, range| {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
        count.checked_add(last.checked_sub(first)? + 1)
    })
}

/// [`IdleTime::quota`] now.
fn quota_reading() -> Option<QuotaReading> {
    Quota::of_this_process().and_then(Quota::read)
}

/// The second figure of a `/proc/uptime` line (`"350735.47 234388.90"`:
/// seconds, two decimals).
fn idle_of_uptime(line: &[u8]) -> Option<Duration> {
    let field = std::str::from_utf8(line).ok()?.split_whitespace().nth(1)?;
    let (secs, centis) = field.split_once('.')?;
    if centis.len() != 2 {
        return None;
    }
    let (secs, centis): (u64, u64) = (secs.parse().ok()?, centis.parse().ok()?);
    Some(Duration::from_secs(secs) + Duration::from_millis(centis * 10))
}

/// The idle ticks (the fourth figure of a `cpuN` line: user, nice, system,
/// idle, iowait, ...) summed over the CPUs `in_set` picks, from a
/// `/proc/stat` read in 4 KiB pieces. Stops at the first line after the
/// `cpu` lines (the interrupt counts, which can be long). `None` if no
/// CPU of the set was found or a `cpu` line does not parse.
fn idle_ticks_of_stat(mut stat: impl Read, in_set: impl Fn(usize) -> bool) -> Option<u64> {
    let mut buf = [0u8; 4096];
    let (mut held, mut sum, mut found) = (0usize, 0u64, false);
    loop {
        let n = stat.read(&mut buf[held..]).ok()?;
        let end = held + n;
        let mut start = 0;
        while let Some(nl) = buf[start..end].iter().position(|&b| b == b'\n') {
            let line = &buf[start..start + nl];
            start += nl + 1;
            match line_idle(line)? {
                Line::Other => return found.then_some(sum),
                Line::Total => {}
                Line::Cpu(cpu, idle) if in_set(cpu) => {
                    sum = sum.saturating_add(idle);
                    found = true;
                }
                Line::Cpu(..) => {}
            }
        }
        // The unfinished line moves to the front; one that fills the
        // buffer is the interrupt line or not a `cpu` line we know.
        buf.copy_within(start..end, 0);
        held = end - start;
        if n == 0 || held == buf.len() {
            return found.then_some(sum);
        }
    }
}

/// One line of `/proc/stat`, as far as [`idle_ticks_of_stat`] cares.
enum Line {
    /// `cpu  ...`: the machine's total.
    Total,
    /// `cpuN ...`: CPU N's idle ticks.
    Cpu(usize, u64),
    /// Any other line: the `cpu` lines are over.
    Other,
}

/// Parses one line (`None`: a `cpu` line that does not parse).
fn line_idle(line: &[u8]) -> Option<Line> {
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split_ascii_whitespace();
    let Some(number) = fields.next().and_then(|name| name.strip_prefix("cpu")) else {
        return Some(Line::Other);
    };
    if number.is_empty() {
        return Some(Line::Total);
    }
    let cpu = number.parse().ok()?;
    let idle = fields.nth(3)?.parse().ok()?;
    Some(Line::Cpu(cpu, idle))
}

/// A fingerprint of a CPU set (FNV-1a over its bits), never
/// [`WHOLE_MACHINE`].
fn fingerprint(set: &CpuSet) -> u64 {
    let words = (0..libc::CPU_SETSIZE as usize / 64).map(|word| {
        (0..64).fold(0u64, |bits, bit| {
            bits | (u64::from(set.contains(word * 64 + bit)) << bit)
        })
    });
    let hash = words.fold(0xcbf2_9ce4_8422_2325u64, |hash, word| {
        (hash ^ word).wrapping_mul(0x0100_0000_01b3)
    });
    hash.max(WHOLE_MACHINE + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: u64, ms: u64) -> Duration {
        Duration::from_secs(s) + Duration::from_millis(ms)
    }

    #[test]
    fn idle_time_is_the_second_figure_of_uptime() {
        assert_eq!(
            idle_of_uptime(b"350735.47 234388.90\n"),
            Some(d(234388, 900))
        );
        assert_eq!(idle_of_uptime(b"1.00 0.05\n"), Some(d(0, 50)));
        // Past what a u64 of nanoseconds holds (584 years): still exact.
        assert_eq!(
            idle_of_uptime(b"1.00 99999999999.99\n"),
            Some(d(99_999_999_999, 990))
        );
        assert_eq!(idle_of_uptime(b"350735.47\n"), None);
        assert_eq!(idle_of_uptime(b"1.00 2.5\n"), None);
        assert_eq!(idle_of_uptime(b""), None);
    }

    #[test]
    fn cpu_lists_count() {
        assert_eq!(count_of_cpu_list(b"0-1\n"), Some(2));
        assert_eq!(count_of_cpu_list(b"0-3,8,10-11\n"), Some(7));
        assert_eq!(count_of_cpu_list(b"0\n"), Some(1));
        assert_eq!(count_of_cpu_list(b"3-1\n"), None);
        assert_eq!(count_of_cpu_list(b""), None);
        assert!(
            machine_online_cpus().is_some_and(|n| n >= 1),
            "/sys/devices/system/cpu/online"
        );
    }

    const STAT: &str = "cpu  8388194 8702 2485078 4430249 703915 0 228160 7231 0 0\n\
                        cpu0 4096033 4243 1189592 2531863 277460 0 17042 3530 0 0\n\
                        cpu1 4292160 4458 1295486 1898386 426454 0 211117 3700 0 0\n\
                        cpu3 1 2 3 1000 5 0 0 0 0 0\n\
                        intr 1 2 3\n\
                        cpu9 1 2 3 777 5 0 0 0 0 0\n";

    #[test]
    fn idle_ticks_are_summed_over_the_set_only() {
        let ticks = |set: &[usize]| idle_ticks_of_stat(STAT.as_bytes(), |c| set.contains(&c));
        assert_eq!(ticks(&[0]), Some(2531863));
        assert_eq!(ticks(&[1, 3]), Some(1898386 + 1000));
        // Nothing after the interrupt line counts; a set found nowhere
        // is no reading.
        assert_eq!(ticks(&[9]), None);
        assert_eq!(ticks(&[]), None);
        assert_eq!(
            idle_ticks_of_stat(&b"cpu0 1 2\n"[..], |_| true),
            None,
            "a short cpu line"
        );
    }

    #[test]
    fn lines_longer_than_the_buffer_and_reads_cut_anywhere_still_parse() {
        // 300 CPUs (past one 4 KiB buffer), then an interrupt line longer
        // than the buffer, handed over 7 bytes per read.
        let mut text = String::from("cpu  1 1 1 1 1 1 1 1 1 1\n");
        for cpu in 0..300 {
            text += &format!(
                "cpu{cpu} 11111111 2222 333333 {} 55555 0 777 0 0 0\n",
                cpu + 1
            );
        }
        text += &format!("intr {}\n", "12345 ".repeat(2000));
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(buf.len()).min(7);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let all: u64 = (1..=300).sum();
        assert_eq!(
            idle_ticks_of_stat(Trickle(text.as_bytes()), |_| true),
            Some(all)
        );
        assert_eq!(
            idle_ticks_of_stat(text.as_bytes(), |c| c >= 290),
            Some((291..=300).sum())
        );
    }

    #[test]
    fn a_set_of_every_online_cpu_reads_the_whole_machine() {
        let online = machine_online_cpus().expect("/sys/devices/system/cpu/online");
        let all = CpuSet::of(&(0..online).collect::<Vec<_>>());
        let reading = cpu_idle_time_of(&all).expect("/proc/uptime unreadable");
        assert_eq!(reading.cpus, WHOLE_MACHINE);
        if online > 1 {
            let one = cpu_idle_time_of(&CpuSet::of(&[0])).expect("/proc/stat unreadable");
            assert_ne!(one.cpus, WHOLE_MACHINE);
            assert!(one.idle < reading.idle, "one CPU idled less than all");
        }
    }

    /// Pins the calling thread to `cpus` for the life of the guard.
    struct Pinned(CpuSet);

    impl Pinned {
        fn to(cpus: &[usize]) -> Pinned {
            let old = CpuSet::of_this_thread().expect("sched_getaffinity");
            CpuSet::of(cpus)
                .set_for_this_thread()
                .unwrap_or_else(|e| panic!("sched_setaffinity({cpus:?}): {e}"));
            Pinned(old)
        }
    }

    impl Drop for Pinned {
        fn drop(&mut self) {
            let _ = self.0.set_for_this_thread();
        }
    }

    #[test]
    fn a_thread_confined_to_a_cpu_it_keeps_busy_finds_it_not_idle() {
        let whole = cpu_idle_time().expect("/proc/uptime or /proc/stat unreadable");
        let online = machine_online_cpus().expect("/sys/devices/system/cpu/online");
        let allowed = crate::host::allowed_cpus();
        if allowed.len() == online {
            assert_eq!(whole.cpus, WHOLE_MACHINE, "the test may run anywhere");
        }
        let cpu = allowed[0];
        let _pinned = Pinned::to(&[cpu]);
        let before = cpu_idle_time().expect("/proc/stat unreadable");
        // Busy on the CPU for 300 ms: it stands idle for none of it, so
        // its idle time grows by at most the ticks' rounding (10 ms each
        // end).
        let began = std::time::Instant::now();
        while began.elapsed() < Duration::from_millis(300) {
            std::hint::spin_loop();
        }
        let after = cpu_idle_time().expect("/proc/stat unreadable");
        assert_eq!(before.cpus, after.cpus);
        let grew = after.idle.saturating_sub(before.idle);
        assert!(
            grew <= Duration::from_millis(60),
            "CPU {cpu} idle {grew:?} of 300 ms busy"
        );
        if allowed.len() > 1 {
            assert_ne!(
                after.cpus, whole.cpus,
                "one CPU of {allowed:?} is another set"
            );
            assert!(
                after.idle < whole.idle,
                "one CPU idled less than all of them"
            );
        }
    }
}
