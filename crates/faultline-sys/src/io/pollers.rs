//! Who may poll for a read's completion ([`Poller`]): at most half the
//! CPUs at once (at least one), and only while the machine has a CPU to
//! spare.
//!
//! Why the second rule: a poll keeps its CPU from everyone else. Where the
//! program's threads keep every CPU busy, the threads woken meanwhile (the
//! reclaimer, a fault waiting for a fault lock, a program thread back from
//! its own read) wait for the CPU the poll holds, and the program loses
//! more than the poll saves — although each polled read, timed alone,
//! still waits less than a slept one (the project's 2-vCPU guest, two
//! program threads: random reads 5–25% slower polled, while a polled read
//! waited 52 µs and a slept one 107 µs; one thread: 7–16% faster polled;
//! docs/measurements.md §28). So the rule looks at the machine, not at the
//! read: every [`WINDOW`] the first reader to notice reads how long the
//! CPUs stood idle (`/proc/stat`'s idle, which leaves out a CPU whose task
//! sleeps on I/O: that is a reader's own CPU), and polling is allowed for
//! the next window only if the CPUs left at least [`START`] of a CPU idle
//! on average while reads slept, or still [`KEEP`] while reads polled (a
//! poll takes some of the idle time it found). The first window of a
//! process sleeps; where `/proc/stat` cannot be read, only the first rule
//! applies.
//!
//! The idle time is machine-wide: in a container that sees the host's
//! `/proc/stat`, other tenants' idle CPUs count, and the half-the-CPUs
//! rule is what bounds the polling.
//!
//! No locks: relaxed atomics. They guard no data; a race between two
//! readers closing a window skews one decision at most.

use crate::host;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the machine is watched before polling is allowed or not.
const WINDOW: Duration = Duration::from_millis(200);

/// The idle CPU time, as a share of one CPU, a window of sleeping reads
/// must have had for polling to start: 3/4. On the project's 2-vCPU guest
/// (§28), random reads through a budget: two program threads, where
/// polling does not pay, left 0.32–0.47 of a CPU idle on average while
/// sleeping; one thread, where it does, 0.7–0.94.
const START: (u128, u128) = (3, 4);

/// The idle CPU time a window of polled reads must have had for polling
/// to go on: 1/2 of a CPU. The same runs polled: one thread 0.79, two
/// threads 0.12–0.15.
const KEEP: (u128, u128) = (1, 2);

/// Threads polling right now, process-wide.
static POLLERS: AtomicUsize = AtomicUsize::new(0);

/// The machine's idle time, window by window.
static GATE: Gate = Gate {
    began_ns: AtomicU64::new(0),
    idle_ns: AtomicU64::new(0),
    spare: AtomicBool::new(false),
};

/// A place among the pollers (see the module documentation), left on
/// drop.
pub(super) struct Poller;

impl Poller {
    /// A place, if the machine had a CPU to spare in the last window and
    /// fewer than half the CPUs poll.
    pub(super) fn enter() -> Option<Poller> {
        GATE.refresh();
        // Relaxed: a heuristic flag (module docs).
        if !GATE.spare.load(Ordering::Relaxed) {
            return None;
        }
        static LIMIT: OnceLock<usize> = OnceLock::new();
        let limit = *LIMIT.get_or_init(|| (host::online_cpus() / 2).max(1));
        // Relaxed: a count, guarding no data.
        let mut cur = POLLERS.load(Ordering::Relaxed);
        while cur < limit {
            match POLLERS.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(Poller),
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
        Poller
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        // Relaxed: a count (module docs).
        POLLERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the current window has seen so far.
struct Gate {
    /// When it began, in ns after [`epoch`] (at least 1); 0 before the
    /// first.
    began_ns: AtomicU64,
    /// The machine's idle time when it began ([`host::cpu_idle_time`]).
    idle_ns: AtomicU64,
    /// Whether polling is allowed: the last window had a CPU to spare.
    spare: AtomicBool,
}

impl Gate {
    /// Closes the window if it is [`WINDOW`] old (or opens the first):
    /// the first caller to find it so reads the idle time and decides.
    fn refresh(&self) {
        let now = epoch().elapsed().as_nanos() as u64 + 1;
        // Relaxed throughout: module docs.
        let began = self.began_ns.load(Ordering::Relaxed);
        if began != 0 && now.saturating_sub(began) < WINDOW.as_nanos() as u64 {
            return;
        }
        let won = self
            .began_ns
            .compare_exchange(began, now, Ordering::Relaxed, Ordering::Relaxed);
        if won.is_err() {
            return;
        }
        let Some(idle) = host::cpu_idle_time() else {
            self.spare.store(true, Ordering::Relaxed);
            return;
        };
        let idle = idle.as_nanos() as u64;
        let before = self.idle_ns.swap(idle, Ordering::Relaxed);
        if began != 0 {
            let (wall, idle) = (now - began, idle.saturating_sub(before));
            let polling = self.spare.load(Ordering::Relaxed);
            let spare = spare(
                Duration::from_nanos(wall),
                Duration::from_nanos(idle),
                polling,
            );
            self.spare.store(spare, Ordering::Relaxed);
        }
    }
}

/// The process's reference instant for [`Gate`]'s times.
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

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn polling_starts_at_three_quarters_of_a_cpu_idle_and_stops_under_half() {
        // §28's windows on 2 CPUs, 200 ms: sleeping, then polling.
        assert!(spare(MS(200), MS(188), false), "one thread: 0.94 idle");
        assert!(!spare(MS(200), MS(95), false), "two threads: 0.47 idle");
        assert!(spare(MS(200), MS(158), true), "one thread polled: 0.79");
        assert!(!spare(MS(200), MS(30), true), "two threads polled: 0.15");
        // Between the two: polling goes on, but does not start.
        assert!(spare(MS(200), MS(120), true));
        assert!(!spare(MS(200), MS(120), false));
        // Many CPUs, most idle.
        assert!(spare(MS(200), MS(200 * 8), false));
    }

    #[test]
    fn degenerate_windows_neither_panic_nor_overflow() {
        assert!(spare(Duration::ZERO, Duration::ZERO, false));
        assert!(!spare(MS(200), Duration::ZERO, true));
        assert!(spare(Duration::MAX, Duration::MAX, false));
    }
}
