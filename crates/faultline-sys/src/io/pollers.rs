//! Who may poll for a read's completion ([`Poller`]): at most half the
//! CPUs at once (at least one), and only while the process's CPUs have one
//! to spare.
//!
//! Why the second rule: a poll keeps its CPU from everyone else. Where the
//! program's threads keep every CPU busy, the threads woken meanwhile (the
//! reclaimer, a fault waiting for a fault lock, a program thread back from
//! its own read) wait for the CPU the poll holds, and the program loses
//! more than the poll saves — although each polled read, timed alone,
//! still waits less than a slept one (the project's 2-vCPU guest, two
//! program threads: random reads 2–18% slower polled, while a polled read
//! waited 52 µs and a slept one 107 µs; one thread: 7–16% faster polled;
//! docs/measurements.md §28). So the rule looks at the CPUs, not at the
//! read: a window closes at the first read [`WINDOW`] or more after it
//! began, and that reader reads how long the process's CPUs stood idle
//! ([`cpu_idle_time_of`] [`readers_cpus`]: the mask of the thread that
//! prepared polling — the whole machine unless `taskset` or a cpuset
//! narrows it — for a reader pinned within it, as faultline's workers
//! are by default, else the reader's own mask; idle without iowait, which
//! is the idle time of a CPU whose task sleeps on I/O: a reader's own
//! CPU).
//! Polling starts after two windows in a row in which those CPUs left at
//! least [`START`] of a CPU idle on average while reads slept (one such
//! window is often a burst: two program threads' runs opened on it 3
//! windows in 51, and lost 7% to them), and goes on while a window of
//! polled reads still leaves [`KEEP`] (a poll takes some of the idle time
//! it found). The first window of a process sleeps, and so does the first
//! after a pause of more than two windows without reads (what a quiet
//! spell left idle says nothing of the burst after it). So does the window
//! after one whose two readings sum different CPU sets (the thread that
//! closed it runs under another mask than the one that opened it). Where the
//! idle time cannot be read, only the first rule applies until it can.
//!
//! Where the process has a CPU quota (cgroup `cpu.max`, v1's CFS quota),
//! what is to spare is also bounded by the quota's CPU time the cgroup left
//! unused in the window ([`IdleTime::quota`]): a process throttled
//! by its quota while its CPUs stand idle sleeps. Why the process's CPUs
//! for a pinned reader: its own CPU alone is busy or in iowait whenever it
//! reads, so pinned workers reading their own never polled (0% of windows
//! in every workers row, docs/measurements.md §29), and two of them,
//! pinned to two CPUs, read two sets, which stops polling by itself.
//! [`windows`] counts the windows and those that allowed polling, for a
//! bench to say whether its reads could poll at all.
//!
//! Invariant: [`POLLERS`] counts the live [`Poller`]s, and only
//! [`Poller::enter`] (or `ungated`, in tests) makes one. No locks: relaxed
//! atomics. They guard no data; a race between two readers closing a
//! window skews one decision at most.

use crate::cpu_idle::{cpu_idle_time_of, IdleTime};
use crate::cpu_quota::Quota;
use crate::host;
use crate::host::CpuSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the machine is watched before polling is allowed or not.
const WINDOW: Duration = Duration::from_millis(200);

/// The idle CPU time, as a share of one CPU, a window of sleeping reads
/// must have had for polling to start: 2/3. On the project's 2-vCPU guest
/// (§28), random reads through a budget with sleeping reads: two program
/// threads, where polling does not pay, left 0.32 and 0.47 of a CPU idle
/// (per-window averages of two runs) and 0.58 (a whole run); one thread,
/// where it does, 0.70 and 0.94.
const START: (u128, u128) = (2, 3);

/// The idle CPU time a window of polled reads must have had for polling
/// to go on: 1/2 of a CPU. The same runs polled: one thread 0.79, two
/// threads 0.12–0.15.
const KEEP: (u128, u128) = (1, 2);

/// Threads polling right now, process-wide.
static POLLERS: AtomicUsize = AtomicUsize::new(0);

/// The machine's idle time, window by window.
static GATE: Gate = Gate::new();

/// A place among the pollers (see the module documentation), left on
/// drop. Made only here, so that [`POLLERS`] counts every one.
pub(super) struct Poller(());

/// Finds now what the rules read once per process (the CPU quota's cgroup,
/// the cap, the clock's origin), so that a first read served in a SIGBUS
/// handler allocates nothing for them.
pub(super) fn prepare() {
    // A first quota reading sets its clock's origin here, not in a
    // SIGBUS handler.
    let _ = (
        Quota::of_this_process().map(Quota::read),
        limit(),
        epoch(),
        process_cpus(),
    );
}

/// The process's CPUs: the affinity mask of the thread that first
/// prepared polled reads ([`prepare`]: the thread that made the first
/// store that polls, before the manager's workers pinned themselves
/// within that mask), read once; `None` inside where it could not be read.
static PROCESS_CPUS: OnceLock<Option<CpuSet>> = OnceLock::new();

/// [`PROCESS_CPUS`], read now if it was not yet.
fn process_cpus() -> Option<&'static CpuSet> {
    PROCESS_CPUS.get_or_init(CpuSet::of_this_thread).as_ref()
}

/// The CPUs whose idle time a reader on a thread whose mask is `own`
/// reads: the process's (`process`) where its own mask lies within them —
/// a worker pinned to one CPU, a program thread pinned likewise: its poll
/// keeps its CPU from every thread of the process, which may run on any of
/// the process's CPUs, so what is to spare is theirs (its own CPU, in
/// iowait while it sleeps on a read, never is) — and its own mask where it
/// runs elsewhere (moved by `taskset -p` since) or the process's is not
/// known.
fn readers_cpus(own: Option<CpuSet>, process: Option<&CpuSet>) -> Option<CpuSet> {
    match (own, process) {
        (Some(own), Some(process)) if own.is_within(process) => Some(*process),
        (own, _) => own,
    }
}

/// [`IdleTime`] of the CPUs [`readers_cpus`] picks for the calling
/// thread. A process that never prepared knows no process's CPUs: its
/// readers read their own masks (a reader never reads the process's mask
/// itself, which would be its own if it is a pinned worker's).
fn readers_idle_time() -> Option<IdleTime> {
    let process = PROCESS_CPUS.get().and_then(Option::as_ref);
    match readers_cpus(CpuSet::of_this_thread(), process) {
        Some(cpus) => cpu_idle_time_of(&cpus),
        None => crate::cpu_idle::cpu_idle_time(),
    }
}

/// The most pollers at once: half the CPUs this process may use, at least
/// one.
fn limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| (host::online_cpus() / 2).max(1))
}

impl Poller {
    /// A place, if the reader's CPUs had one to spare in the last window and
    /// fewer than half the CPUs poll.
    pub(super) fn enter() -> Option<Poller> {
        let now = epoch().elapsed().as_nanos() as u64;
        if !GATE.allows(now, readers_idle_time) {
            return None;
        }
        let limit = limit();
        // Relaxed: a count, guarding no data.
        let mut cur = POLLERS.load(Ordering::Relaxed);
        while cur < limit {
            match POLLERS.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(Poller(())),
                Err(now) => cur = now,
            }
        }
        None
    }
}

#[cfg(test)]
impl Poller {
    /// A place whatever the rules say (tests of the ring's reads).
    pub(super) fn ungated() -> Poller {
        POLLERS.fetch_add(1, Ordering::Relaxed);
        Poller(())
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        // Relaxed: a count (module docs).
        POLLERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the current window has seen so far. Times are ns after a fixed
/// instant ([`epoch`] for [`GATE`]).
struct Gate {
    /// When the window began, plus 1 (0: no window open).
    began: AtomicU64,
    /// The CPUs' idle time when it began, ns, wrapping (0: none read:
    /// the window decides nothing when it closes).
    idle_then: AtomicU64,
    /// Which CPUs `idle_then` sums ([`IdleTime::cpus`]).
    cpus_then: AtomicU64,
    /// The CPU quota left unused when it began
    /// ([`QuotaReading::unused`], wrapping), and which quota bound then
    /// ([`QuotaReading::binding`]; 0: the reading had no quota).
    quota_then: AtomicU64,
    quota_binding_then: AtomicU64,
    /// Whether polling is allowed: the last window had a CPU to spare.
    allowed: AtomicBool,
    /// Whether the last window, its reads sleeping, had a CPU to spare
    /// (a second such window in a row starts polling).
    primed: AtomicBool,
    /// Whether the idle time was ever read.
    ever_read: AtomicBool,
    /// Windows closed so far, and how many of them let the next one poll
    /// ([`windows`]).
    closed: AtomicU64,
    allowing: AtomicU64,
}

impl Gate {
    const fn new() -> Gate {
        Gate {
            began: AtomicU64::new(0),
            idle_then: AtomicU64::new(0),
            cpus_then: AtomicU64::new(0),
            quota_then: AtomicU64::new(0),
            quota_binding_then: AtomicU64::new(0),
            allowed: AtomicBool::new(false),
            primed: AtomicBool::new(false),
            ever_read: AtomicBool::new(false),
            closed: AtomicU64::new(0),
            allowing: AtomicU64::new(0),
        }
    }

    /// Whether a read at `now` may poll. Closes the window first if it is
    /// [`WINDOW`] old (or opens the first): the one caller that wins it
    /// reads the idle time (`idle`) and decides for the next window.
    fn allows(&self, now: u64, idle: impl FnOnce() -> Option<IdleTime>) -> bool {
        // Relaxed throughout: module docs.
        let began = self.began.load(Ordering::Relaxed);
        let age = now.saturating_sub(began.saturating_sub(1));
        if began == 0 || age >= WINDOW.as_nanos() as u64 {
            let won =
                self.began
                    .compare_exchange(began, now + 1, Ordering::Relaxed, Ordering::Relaxed);
            if won.is_ok() {
                self.close(
                    began != 0 && age <= 2 * WINDOW.as_nanos() as u64,
                    age,
                    idle(),
                );
                self.closed.fetch_add(1, Ordering::Relaxed);
                if self.allowed.load(Ordering::Relaxed) {
                    self.allowing.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.allowed.load(Ordering::Relaxed)
    }

    /// Ends a window `age` ns long, the CPUs' idle time now being `idle`:
    /// decides for the next one if `decide` (a window of reads, not a
    /// pause) and the idle time of the same CPUs was read at both ends;
    /// after a pause, or readings that cannot be compared (two CPU sets, a
    /// quota's usage read at one end only, two quotas binding: one set or
    /// changed between them), the reads sleep.
    fn close(&self, decide: bool, age: u64, idle: Option<IdleTime>) {
        let Some(IdleTime { cpus, idle, quota }) = idle else {
            // Unreadable: polling as the cap allows if it never was
            // readable, else as last decided; the next reading starts a
            // fresh window.
            self.idle_then.store(0, Ordering::Relaxed);
            if !self.ever_read.load(Ordering::Relaxed) {
                self.allowed.store(true, Ordering::Relaxed);
            }
            return;
        };
        self.ever_read.store(true, Ordering::Relaxed);
        // Wrapping: only the difference counts (it wraps after 584 years
        // of CPU time idle, which a machine reaches in years, not windows).
        let idle = (idle.as_nanos() as u64).max(1);
        let then = self.idle_then.swap(idle, Ordering::Relaxed);
        let same_cpus = self.cpus_then.swap(cpus, Ordering::Relaxed) == cpus;
        let binding = quota.map_or(0, |q| q.binding);
        let same_quota = self.quota_binding_then.swap(binding, Ordering::Relaxed) == binding;
        let quota_then = self
            .quota_then
            .swap(quota.map_or(0, |q| q.unused), Ordering::Relaxed);
        let comparable = same_cpus && same_quota;
        if decide && then != 0 && comparable {
            let polling = self.allowed.load(Ordering::Relaxed);
            let mut idle = Duration::from_nanos(idle.wrapping_sub(then));
            if let Some(now) = quota.map(|q| q.unused) {
                // The quota's time left unused bounds what is to spare.
                let left = now.wrapping_sub(quota_then) as i64;
                idle = idle.min(Duration::from_nanos(left.max(0) as u64));
            }
            let spare_now = spare(Duration::from_nanos(age), idle, polling);
            // Sleeping, it takes two spare windows in a row to start.
            let primed = self.primed.swap(spare_now && !polling, Ordering::Relaxed);
            self.allowed
                .store(spare_now && (polling || primed), Ordering::Relaxed);
        } else if !decide || !comparable {
            self.allowed.store(false, Ordering::Relaxed);
            self.primed.store(false, Ordering::Relaxed);
        }
    }
}

/// The windows of this process so far, and how many of them allowed
/// polling: (allowing, all). What a bench reports beside a row of polled
/// reads, so that a row whose reads never polled says so.
pub(super) fn windows() -> (u64, u64) {
    // Relaxed: counts (module docs).
    (
        GATE.allowing.load(Ordering::Relaxed),
        GATE.closed.load(Ordering::Relaxed),
    )
}

/// The process's reference instant for [`GATE`]'s times.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Whether a window `wall` long, in which the CPUs stood idle for `idle`
/// (summed over them), with reads `polling` or not, had a CPU to spare:
/// idle at least [`KEEP`] of `wall` if polling, else [`START`].
fn spare(wall: Duration, idle: Duration, polling: bool) -> bool {
    let (part, of) = if polling { KEEP } else { START };
    idle.as_nanos().saturating_mul(of) >= wall.as_nanos().saturating_mul(part)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_quota::QuotaReading;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn polling_starts_at_two_thirds_of_a_cpu_idle_and_stops_under_half() {
        // §28's figures on 2 CPUs, 200 ms windows: sleeping, then polling.
        assert!(spare(MS(200), MS(140), false), "one thread: 0.70 idle");
        assert!(!spare(MS(200), MS(116), false), "two threads: 0.58 idle");
        assert!(spare(MS(200), MS(158), true), "one thread polled: 0.79");
        assert!(!spare(MS(200), MS(30), true), "two threads polled: 0.15");
        // Between the two: polling goes on, but does not start.
        assert!(spare(MS(200), MS(110), true));
        assert!(!spare(MS(200), MS(110), false));
        // Many CPUs, most idle.
        assert!(spare(MS(200), MS(200 * 8), false));
    }

    #[test]
    fn degenerate_windows_neither_panic_nor_overflow() {
        assert!(spare(Duration::ZERO, Duration::ZERO, false));
        assert!(!spare(MS(200), Duration::ZERO, true));
        assert!(spare(Duration::MAX, Duration::MAX, false));
    }

    /// A machine whose clock and idle time the tests move; its readings
    /// sum the CPU set `cpus`.
    struct Machine {
        ms: u64,
        idle: Duration,
        cpus: u64,
        /// The CPU quota's unused time (`None`: no quota), how much of
        /// each ms of it goes unused, and which quota binds
        /// ([`QuotaReading::binding`]).
        quota: Option<u64>,
        quota_left_per_ms: Duration,
        binding: u64,
    }

    /// A reading of the whole machine.
    fn whole(idle: Duration) -> Option<IdleTime> {
        Some(IdleTime {
            cpus: crate::cpu_idle::WHOLE_MACHINE,
            idle,
            quota: None,
        })
    }

    impl Machine {
        /// A gate, and a machine with readings of set `cpus` and quota
        /// counter `quota`; the gate's first window opened at 0 by a
        /// reading of the whole machine.
        fn started(cpus: u64, quota: Option<u64>) -> (Gate, Machine) {
            let gate = Gate::new();
            assert!(!gate.allows(0, || whole(MS(5))), "the first window sleeps");
            let m = Machine {
                ms: 0,
                idle: MS(5),
                cpus,
                quota,
                quota_left_per_ms: Duration::ZERO,
                binding: 1_000_000_000,
            };
            (gate, m)
        }

        /// A read every ms for `ms` ms, the CPUs idle `idle_per_ms`
        /// (summed over them) each ms: whether the last read could poll.
        fn reads(&mut self, gate: &Gate, ms: u64, idle_per_ms: Duration) -> bool {
            let mut allowed = false;
            for _ in 0..ms {
                self.ms += 1;
                self.idle += idle_per_ms;
                let left = self.quota_left_per_ms.as_nanos() as u64;
                self.quota = self.quota.map(|q| q.wrapping_add(left));
                let reading = IdleTime {
                    cpus: self.cpus,
                    idle: self.idle,
                    quota: self.quota.map(|unused| QuotaReading {
                        ns_per_sec: self.binding,
                        binding: self.binding,
                        unused,
                    }),
                };
                allowed = gate.allows(self.ms * 1_000_000, || Some(reading));
            }
            allowed
        }
    }

    #[test]
    fn the_gate_opens_after_two_spare_windows_and_closes_after_a_busy_one() {
        // Each `reads(200, ..)` is one window; its last read sees the
        // decision the window made. The first read opens the first window.
        let (gate, mut m) = Machine::started(0, None);
        let us = Duration::from_micros;
        // Two windows with 0.9 of a CPU idle open it (one does not), one
        // with 0.3 closes it.
        assert!(!m.reads(&gate, 200, us(900)));
        assert!(m.reads(&gate, 200, us(900)));
        assert!(!m.reads(&gate, 200, us(300)));
        // A burst: one spare window between busy ones opens nothing.
        assert!(!m.reads(&gate, 200, us(900)));
        assert!(!m.reads(&gate, 200, us(300)));
        assert!(!m.reads(&gate, 200, us(900)));
        // 0.55 of a CPU idle does not open it, but keeps it open.
        assert!(!m.reads(&gate, 200, us(550)));
        assert!(!m.reads(&gate, 200, us(900)));
        assert!(m.reads(&gate, 200, us(900)));
        assert!(m.reads(&gate, 200, us(550)));
        // The counts a bench reports: the first read's opening and the 10
        // windows closed (one per `reads`), 3 of which let the next poll.
        let counts = |g: &Gate| {
            (
                g.allowing.load(Ordering::Relaxed),
                g.closed.load(Ordering::Relaxed),
            )
        };
        assert_eq!(counts(&gate), (3, 11));
    }

    #[test]
    fn a_pause_starts_afresh_and_an_unreadable_machine_is_left_to_the_cap() {
        let (gate, mut m) = Machine::started(0, None);
        let spare = Duration::from_micros(900);
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
        // No read for a second, then one: that window decides nothing and
        // the reads sleep until two windows of reads say otherwise.
        m.ms += 1000;
        m.idle += MS(1800);
        assert!(!m.reads(&gate, 1, Duration::ZERO));
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
        // Never readable: the cap alone decides (allowed).
        let blind = Gate::new();
        assert!(blind.allows(0, || None));
        assert!(blind.allows(300_000_000, || None));
    }

    #[test]
    fn readings_of_different_cpu_sets_stop_polling() {
        let (gate, mut m) = Machine::started(7, None);
        let spare = Duration::from_micros(900);
        // The first window began on the whole machine and ends on set 7:
        // no decision; then two spare windows of set 7 open the gate.
        assert!(!m.reads(&gate, 200, spare));
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
        // Set 8's since-boot idle time is far below set 7's: read as a
        // difference it would wrap to centuries idle. A change of set
        // closes the gate instead, whatever the sums, and it takes two
        // spare windows of one set to open it again.
        m.cpus = 8;
        m.idle = MS(1);
        assert!(!m.reads(&gate, 200, spare));
        m.cpus = 7;
        m.idle = Duration::from_secs(1 << 40);
        assert!(!m.reads(&gate, 200, spare));
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
        // Readers of two sets closing windows in turn never poll.
        for cpus in [8, 7, 8, 7, 8, 7] {
            m.cpus = cpus;
            assert!(!m.reads(&gate, 200, spare));
        }
    }

    #[test]
    fn a_reader_pinned_within_the_process_reads_the_process_cpus() {
        let process = CpuSet::of(&[0, 1, 2, 3]);
        let cpus = |own: Option<CpuSet>, process: Option<&CpuSet>| {
            format!("{:?}", readers_cpus(own, process))
        };
        // A worker pinned to CPU 2 of 0-3, and one allowed 1-3: the
        // process's four.
        assert_eq!(
            cpus(Some(CpuSet::of(&[2])), Some(&process)),
            "Some({0, 1, 2, 3})"
        );
        assert_eq!(
            cpus(Some(CpuSet::of(&[1, 2, 3])), Some(&process)),
            "Some({0, 1, 2, 3})"
        );
        // Moved outside the process's CPUs (taskset -p): its own.
        assert_eq!(
            cpus(Some(CpuSet::of(&[3, 4])), Some(&process)),
            "Some({3, 4})"
        );
        // Not prepared: its own; its own unreadable: none (the caller
        // reads its own mask's idle time the usual way).
        assert_eq!(cpus(Some(CpuSet::of(&[2])), None), "Some({2})");
        assert_eq!(cpus(None, Some(&process)), "None");
        // Two workers pinned to two CPUs read one set: their windows
        // compare (readings of two sets would stop polling).
        let a = readers_cpus(Some(CpuSet::of(&[0])), Some(&process));
        let b = readers_cpus(Some(CpuSet::of(&[3])), Some(&process));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn a_thread_pinned_to_one_cpu_reads_the_whole_process_once_prepared() {
        // This test binary's threads all run under the process's mask (no
        // test narrows its own before it prepares), so whichever prepared
        // first read that mask.
        prepare();
        let process = PROCESS_CPUS
            .get()
            .and_then(Option::as_ref)
            .copied()
            .expect("prepare read no mask");
        let whole = cpu_idle_time_of(&process).expect("idle time unreadable");
        let cpu = crate::host::allowed_cpus()[0];
        let pinned = std::thread::spawn(move || {
            crate::host::pin_thread(cpu).expect("pin to an allowed CPU");
            let own = CpuSet::of_this_thread().expect("sched_getaffinity");
            (own.count(), readers_idle_time())
        })
        .join()
        .expect("pinned reader");
        assert_eq!(pinned.0, 1, "pinned to CPU {cpu}");
        let reading = pinned.1.expect("idle time unreadable");
        assert_eq!(
            reading.cpus, whole.cpus,
            "a reader pinned to CPU {cpu} reads the process's CPUs {process:?}"
        );
    }

    #[test]
    fn a_cpu_quota_used_up_leaves_nothing_to_spare() {
        // The CPUs idle, the quota used to the last ns.
        let (gate, mut m) = Machine::started(0, Some(3));
        let spare = Duration::from_micros(900);
        // Quota or none differ like two CPU sets: no decision.
        assert!(!m.reads(&gate, 200, spare));
        for _ in 0..3 {
            assert!(!m.reads(&gate, 200, spare), "no quota left");
        }
        // The quota leaves 0.8 of a CPU unused, the CPUs 0.9: open.
        m.quota_left_per_ms = Duration::from_micros(800);
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
        // Under 1/2 of a CPU of quota unused closes it, CPUs idle or not;
        // so does more used than the quota (a burst the period allowed,
        // the counter wrapping below where it was).
        m.quota_left_per_ms = Duration::from_micros(400);
        assert!(!m.reads(&gate, 200, spare));
        m.quota_left_per_ms = Duration::from_micros(800);
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
        m.quota = m.quota.map(|q| q.wrapping_sub(1_000_000_000));
        assert!(!m.reads(&gate, 200, spare));
    }

    #[test]
    fn a_quota_changed_while_reading_decides_nothing_in_its_window() {
        let (gate, mut m) = Machine::started(0, Some(3));
        m.quota_left_per_ms = Duration::from_micros(800);
        let spare = Duration::from_micros(900);
        assert!(!m.reads(&gate, 200, spare), "quota or none: no decision");
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
        // Resized to 4 CPUs (`docker update --cpus 4`): its counter runs
        // at another rate from another origin, so the window across the
        // change compares nothing and sleeps, whatever the counters say;
        // two windows under the new quota open it again.
        m.binding = 4_000_000_000;
        m.quota = m.quota.map(|q| q.wrapping_add(1 << 40));
        assert!(!m.reads(&gate, 200, spare));
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
        // The quota lifted: no quota at one end, no decision.
        m.quota = None;
        assert!(!m.reads(&gate, 200, spare));
        assert!(!m.reads(&gate, 200, spare));
        assert!(m.reads(&gate, 200, spare));
    }
}
