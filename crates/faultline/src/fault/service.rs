//! The worker loop: read userfaultfd events, hand the rest of a batch to
//! the deferred queue before anything that may block, and handle each event
//! (a page fault: look up the region, take the page's lock, resolve; an
//! unmap: [`super::unmap`]). Also the spare servers, which serve faults
//! only while every worker (and every spare ranked before them) is inside
//! a store-backed fault (`nesting.rs`).
//!
//! Workers block in `epoll_wait` on the userfaultfd, the deferred queue's
//! eventfd and the shutdown eventfd. An event wakes every idle worker (unless
//! `exclusive_wake`); the one on the faulting thread's CPU runs first, since
//! that CPU has just gone idle, and takes the event — the others find nothing
//! and sleep again. Locks: the deferred queue's mutex (leaf), then the
//! page's fault lock while resolving.

use super::resolve::resolve;
use super::Resolution;
use super::{lock_unless_lent, Fault};
use crate::config::PageSize;
use crate::core::{Core, Queued};
use crate::error::FaultError;
use crate::stats::Stats;
use faultline_sys::uffd::{Event, Ready, Waiter};
use faultline_sys::{host, PAGE_SIZE};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The worker loop: runs until the shutdown eventfd becomes readable.
///
/// Intake is never held up by a slow fault: before a worker does anything
/// that may block (a store read, or waiting for a page lock another worker
/// holds), it hands the rest of its batch to the shared deferred queue and
/// signals it, so idle workers take those events at once.
pub(crate) fn run_worker(core: Arc<Core>, worker: usize, waiter: Waiter) {
    if core.config.pin_workers {
        // Best effort: a worker that cannot be pinned still serves faults.
        // Only CPUs this process may run on (a cpuset or `taskset` may
        // leave it CPUs 8-15, say).
        let allowed = host::allowed_cpus();
        let _ = host::pin_thread(allowed[worker % allowed.len()]);
    }
    core.worker_tids.lock().push(host::thread_id());
    let mut intake = Intake::new(&core);
    let spin = Duration::from_micros(u64::from(core.config.experiment.spin_us));
    let mut last_event = Instant::now();
    loop {
        match intake.turn(&core, worker) {
            Turn::Handled(_) => {
                last_event = Instant::now();
                // Second looks of removals, and poison markers to clear,
                // come due under load too.
                let _ = super::program_drop::retry(&core);
                let _ = super::reread::retry(&core);
            }
            Turn::Failed => {}
            Turn::Idle => {
                // Idle: map a read-ahead window ahead of its stream, or take
                // a piece of an offered migration copy, then look at the
                // userfaultfd again before the next one.
                if let Some(a) = super::offers::next(&core) {
                    super::ahead::serve(&core, worker, a);
                    continue;
                }
                if crate::migrate::help(&core, worker) {
                    continue;
                }
                if super::program_drop::retry(&core) || super::reread::retry(&core) {
                    continue;
                }
                if !spin.is_zero() && last_event.elapsed() < spin {
                    // Spinning never reaches the shutdown eventfd: look at
                    // the flag set before it is signalled.
                    if core.is_stopping() {
                        return;
                    }
                    std::hint::spin_loop();
                    continue;
                }
                // Second looks of a removal are due within a millisecond;
                // a poison marker when its back-off ends.
                let timeout = if core.drop_rechecks.any() {
                    1
                } else {
                    super::reread::wait_ms(&core)
                };
                match waiter.wait(timeout) {
                    Ok(Ready::Other(0)) => return,
                    Ok(Ready::Other(_)) => {
                        core.deferred_fd.drain();
                    }
                    Ok(_) => {}
                    Err(e) => {
                        core.record(FaultError::Events(e));
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        }
    }
}

/// What one [`Intake::turn`] did.
enum Turn {
    /// Handled this many events.
    Handled(usize),
    /// Nothing was pending.
    Idle,
    /// Reading events failed (recorded; the caller goes on).
    Failed,
}

/// A server's event intake: the read buffer and the batch being handled.
struct Intake {
    batch: usize,
    read: Vec<Event>,
    events: VecDeque<Queued>,
}

impl Intake {
    fn new(core: &Core) -> Intake {
        let batch = core.config.experiment.event_batch;
        Intake {
            batch,
            read: Vec::with_capacity(batch),
            events: VecDeque::with_capacity(batch),
        }
    }

    /// Handles one deferred event (they have waited longest) or, if there is
    /// none, a batch read from the userfaultfd without blocking.
    fn turn(&mut self, core: &Core, worker: usize) -> Turn {
        let (deferred, more) = {
            let mut q = core.deferred.lock();
            (q.pop_front(), !q.is_empty())
        };
        if let Some(ev) = deferred {
            // The queue's one signal may have been drained by this server
            // for several events: signal the rest for an idle server
            // before this one may block in the event.
            if more {
                if let Err(e) = core.deferred_fd.signal() {
                    core.record(FaultError::Events(e));
                }
            }
            handle(core, worker, ev, &mut self.events);
            return Turn::Handled(1);
        }
        self.read.clear();
        match core.read_events(&mut self.read, self.batch) {
            Ok((0, _)) => Turn::Idle,
            Ok((_, stamp)) => {
                self.events
                    .extend(self.read.drain(..).map(|ev| (ev, stamp)));
                // Counts what this server handled: `handle` may hand the
                // rest of the batch to the others.
                let mut n = 0;
                while let Some(ev) = self.events.pop_front() {
                    handle(core, worker, ev, &mut self.events);
                    n += 1;
                }
                Turn::Handled(n)
            }
            Err(e) => {
                core.record(FaultError::Events(e));
                std::thread::sleep(Duration::from_millis(10));
                Turn::Failed
            }
        }
    }
}

/// Hands `rest` (events this worker read but has not handled) to the other
/// workers, before this one does something that may block.
fn defer(core: &Core, rest: &mut VecDeque<Queued>) {
    if rest.is_empty() {
        return;
    }
    core.deferred.lock().extend(rest.drain(..));
    Stats::bump(&core.stats.deferrals);
    if let Err(e) = core.deferred_fd.signal() {
        core.record(FaultError::Events(e));
    }
}

/// Handles one event; `rest` is the remainder of the worker's batch, handed
/// off (see [`run_worker`]) if this event may block.
pub(crate) fn handle(
    core: &Core,
    worker: usize,
    (ev, stamp): Queued,
    rest: &mut VecDeque<Queued>,
) -> Resolution {
    let Event::PageFault {
        addr,
        tid,
        write,
        wp,
        ..
    } = ev
    else {
        return not_a_fault(core, (ev, stamp), rest);
    };
    // A fault by a thread inside a store call made under a fault lock: its
    // store touched a region (`nesting.rs`).
    let nested = core.nesting.is_lending(tid);
    if !nested && tid != 0 && core.worker_tids.lock().contains(&tid) {
        // A worker touched region memory outside a store call: a bug.
        core.record(FaultError::Inconsistent {
            addr,
            what: "a fault worker faulted on a managed region",
        });
    }
    trace(core, addr);
    let t0 = Instant::now();
    let Some(region) = core.table.lookup(addr) else {
        Stats::bump(&core.stats.stray);
        // Wake whoever waits there: the range was unregistered (their retry
        // is the kernel's business) or never ours.
        let _ = core.uffd.wake(addr & !(PAGE_SIZE - 1), PAGE_SIZE);
        return Resolution::Stray;
    };
    let page = region.page_of(addr);
    if !wp {
        // A write-protect fault is counted when it lifts the protection.
        count_fault(core, region.page_size);
    }
    let (domain, key) = region.lock_key(page);
    if !region.store.is_zero() || core.locks.is_locked(domain, key) {
        defer(core, rest);
    }
    let idx = core.locks.index(domain, key);
    let lent = nested && core.nesting.lent_to(&core.locks, tid, idx, region.id, page);
    let how = Fault {
        addr,
        attempt: u32::from(lent),
        lent,
        nested,
        ahead: false,
        write,
        dirties: write,
        protection: wp,
    };
    let res = {
        // A store call may block (or fault on another region): while every
        // worker is in one, spares serve the events that wait.
        let _busy = (!region.store.is_zero()).then(|| enter_busy(core));
        let guard = if lent {
            None
        } else {
            match lock_unless_lent(core, idx) {
                Some(g) => Some(g),
                None => return requeue(core, (ev, stamp)),
            }
        };
        // Counted once it holds the lock: a fault waiting for another's
        // lock frees no frame, and counted it would keep that other one
        // waiting for it (`reclaim::nothing_to_wait_for`).
        let _serving = (!region.store.is_zero()).then(|| core.nesting.enter_serving());
        let res = resolve(core, &region, page, &how);
        drop(guard);
        res
    };
    count(core, worker, res, t0);
    res
}

/// An event other than a page fault: an unmap, a removal (which waits for
/// page locks: the rest of the batch is deferred first), or one not asked
/// for.
fn not_a_fault(core: &Core, (ev, stamp): Queued, rest: &mut VecDeque<Queued>) -> Resolution {
    match ev {
        Event::Unmap { start, end } => {
            super::unmap::unmapped(core, start, end, stamp);
            core.unmap_handled();
        }
        Event::Remove { start, end } => {
            defer(core, rest);
            super::program_drop::removed(core, start, end, stamp);
        }
        Event::PageFault { .. } | Event::Other(_) => {}
    }
    Resolution::Stray
}

/// Counts a served fault: its page size, its outcome, its service time
/// (`worker` is the server's index in the stats).
pub(super) fn count(core: &Core, worker: usize, res: Resolution, t0: Instant) {
    match res {
        Resolution::Moved => Stats::bump(&core.stats.moves),
        Resolution::AlreadyMapped | Resolution::Dying => Stats::bump(&core.stats.already_mapped),
        Resolution::Poisoned | Resolution::Stray | Resolution::Retry => {}
    }
    core.stats
        .record_service(worker, t0.elapsed().as_nanos() as u64);
}

/// Counts a fault on `size` pages.
pub(super) fn count_fault(core: &Core, size: PageSize) {
    Stats::bump(match size {
        PageSize::Base4K => &core.stats.faults_4k,
        PageSize::Huge2M => &core.stats.faults_2m,
    });
}

/// Records the fault address, when tracing (`Experiment::trace_faults`).
fn trace(core: &Core, addr: usize) {
    let max = core.config.experiment.trace_faults;
    if max > 0 {
        let mut t = core.trace.lock();
        if t.len() < max {
            t.push(addr);
        }
    }
}

/// Puts an event whose lock a lender holds back at the end of the deferred
/// queue, after the events pending on the userfaultfd (the lender's own
/// nested fault among them), and serves on.
fn requeue(core: &Core, ev: Queued) -> Resolution {
    core.pump_events();
    core.deferred.lock().push_back(ev);
    Stats::bump(&core.stats.deferrals);
    if let Err(e) = core.deferred_fd.signal() {
        core.record(FaultError::Events(e));
    }
    Resolution::Retry
}

/// How long a spare on duty with nothing to serve waits for an event
/// before it looks at its duty again, in milliseconds.
const SPARE_WAIT_MS: i32 = 2;

/// Whether events wait for a server: read what is pending on the
/// userfaultfd into the deferred queue, then look there.
fn events_wait(core: &Core) -> bool {
    core.pump_events();
    !core.deferred.lock().is_empty()
}

/// Marks this server busy with a store-backed fault; then, if every
/// worker is busy and events wait, calls the spare whose duty that begins
/// (`nesting.rs`).
fn enter_busy(core: &Core) -> crate::nesting::Busy<'_> {
    let busy = core.nesting.enter_busy();
    if let Some(rank) = core.nesting.next_spare() {
        if events_wait(core) {
            core.nesting.call_spare(rank);
        }
    }
    busy
}

/// Spare server `rank`: parked until it is on duty (every worker and
/// every spare ranked before it inside a store-backed fault) and called
/// for events that wait, or stuck — a whole `STUCK` nap on duty
/// (`nesting.rs`) — then serves events until it is not on duty
/// (`nesting.rs`). That last rule is what serves the fault a store makes
/// on another region while every worker waits in such a store call: with
/// one worker the worker's own nested fault would otherwise wait for the
/// worker, a deadlock. It waits on the userfaultfd with `poll(2)` only
/// while serving (an epoll set per spare would cost every fault a
/// callback per spare). `index` is its stats index.
pub(crate) fn run_spare(core: Arc<Core>, index: usize, rank: usize) {
    core.worker_tids.lock().push(host::thread_id());
    core.nesting.register_spare(rank);
    let mut intake = Intake::new(&core);
    let mut stuck = false;
    loop {
        // Checked first on every round: at shutdown workers may still be
        // busy (a store call that does not return) with events pending.
        if core.is_stopping() {
            return;
        }
        let called = core.nesting.take_call(rank);
        if !(core.nesting.on_duty(rank) && (called || stuck)) {
            stuck = core.nesting.nap(rank);
            continue;
        }
        stuck = false;
        while core.nesting.on_duty(rank) && !core.is_stopping() {
            match intake.turn(&core, index) {
                Turn::Handled(n) => {
                    core.stats
                        .spare_serves
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                }
                Turn::Failed => {}
                Turn::Idle => match core.uffd.wait(core.deferred_fd.raw_fd(), SPARE_WAIT_MS) {
                    Ok(Ready::Other(_)) => {
                        core.deferred_fd.drain();
                    }
                    Ok(_) => {}
                    Err(e) => {
                        core.record(FaultError::Events(e));
                        std::thread::sleep(Duration::from_millis(10));
                    }
                },
            }
        }
    }
}
