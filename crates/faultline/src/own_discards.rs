//! faultline's own `MADV_DONTNEED` on memory registered with its
//! userfaultfd, told apart from the program's.
//!
//! With `UFFD_FEATURE_EVENT_REMOVE` the kernel reports every
//! `MADV_DONTNEED` / `MADV_FREE` on a registered range, and the calling
//! thread waits until some thread has read the event. The program's calls
//! are what `fault/program_drop.rs` handles (their pages' frames go back to the
//! pool); faultline makes such calls too — a pool frame given back to the
//! kernel (the balloon), an empty page table dropped before a 2 MiB move, a
//! poison marker cleared — and two rules follow for those:
//!
//! 1. Each goes through [`OwnDiscards::run`], which records its range
//!    before the call. An event read that lies inside a recorded range is
//!    claimed ([`OwnDiscards::claim`], from `Core::read_events`) and never
//!    recorded as the program's: handled as the program's, it would drop
//!    the very page the caller is about to map. A record goes
//!    when the event for its range's end is claimed (a range over several
//!    mappings gets one event per mapping), or [`KEEP`] after its call
//!    returned (a call that failed may have sent none).
//! 2. The caller may hold page locks the workers wait for, or be the only
//!    worker: the pump ([`OwnDiscards::run_pump`]), woken as an own call
//!    starts, reads pending events into the deferred queue until no own
//!    call is in flight, so the call always completes. The pump takes no
//!    page lock.
//!
//! Invariant: a record exists from before its call's event can be read
//! until that event is claimed (or [`KEEP`] has passed). Locks: the
//! ledger's mutex (a leaf; the condition variable waits on it).

use faultline_sys::SysError;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a record outlives its call when no event claimed it.
const KEEP: Duration = Duration::from_secs(5);

/// How long the pump reads back to back for a call, and then how often.
const PUMP_AFTER: Duration = Duration::from_micros(500);

/// How long the pump stays awake for the next call after one ends.
const LINGER: Duration = Duration::from_millis(1);

#[derive(Debug)]
struct Own {
    id: u64,
    start: usize,
    end: usize,
    /// When its call returned.
    returned: Option<Instant>,
}

#[derive(Debug, Default)]
struct Ledger {
    list: Vec<Own>,
    next_id: u64,
    stopping: bool,
    /// The pump has returned: no own call may start (nobody would read
    /// its event).
    gone: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct OwnDiscards {
    /// Whether the kernel reports removals at all (`Config::program_removals`):
    /// off, calls are run as they are.
    on: bool,
    ledger: Mutex<Ledger>,
    /// Signalled when a call starts, and at shutdown.
    cv: Condvar,
    /// Own calls inside `madvise` now.
    in_flight: AtomicUsize,
}

impl OwnDiscards {
    /// The ledger, `on` when the kernel reports removals.
    pub(crate) fn new(on: bool) -> OwnDiscards {
        OwnDiscards {
            on,
            ..OwnDiscards::default()
        }
    }

    /// Runs `call` — faultline's own `MADV_DONTNEED` of `[start, end)` —
    /// with its range recorded (rule 1) and the pump watching (rule 2).
    ///
    /// # Errors
    /// `call`'s; `ESHUTDOWN` without calling it once the pump has returned
    /// (the manager is shutting down: the call would wait forever).
    pub(crate) fn run(
        &self,
        start: usize,
        end: usize,
        call: impl FnOnce() -> Result<(), SysError>,
    ) -> Result<(), SysError> {
        if !self.on {
            return call();
        }
        let id = {
            let mut l = self.ledger.lock();
            if l.gone {
                return Err(SysError {
                    op: "madvise(MADV_DONTNEED)",
                    addr: start,
                    len: end - start,
                    errno: libc::ESHUTDOWN,
                });
            }
            let id = l.next_id;
            l.next_id += 1;
            l.list.push(Own {
                id,
                start,
                end,
                returned: None,
            });
            // Under the mutex the pump checks it under before it waits or
            // leaves: it either sees the count or is waiting when notified
            // below. (Relaxed: the mutex orders it.)
            self.in_flight.fetch_add(1, Ordering::Relaxed);
            id
        };
        self.cv.notify_one();
        let out = call();
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let mut l = self.ledger.lock();
        if let Some(o) = l.list.iter_mut().find(|o| o.id == id) {
            o.returned = Some(Instant::now());
        }
        out
    }

    /// Whether the removal of `[start, end)` is one of faultline's own
    /// calls (its record is dropped with the event for its range's end).
    pub(crate) fn claim(&self, start: usize, end: usize) -> bool {
        let mut l = self.ledger.lock();
        let now = Instant::now();
        l.list
            .retain(|o| o.returned.is_none_or(|t| now.duration_since(t) < KEEP));
        let Some(i) = l.list.iter().position(|o| o.start <= start && end <= o.end) else {
            return false;
        };
        if l.list[i].end == end {
            l.list.swap_remove(i);
        }
        true
    }

    /// Asks the pump to stop: it leaves once no own call is in flight, and
    /// refuses later ones.
    pub(crate) fn stop(&self) {
        self.ledger.lock().stopping = true;
        self.cv.notify_all();
    }

    /// Own calls inside `madvise` now.
    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

impl OwnDiscards {
    /// The pump thread's loop (rule 2 of the module docs): sleeps until an
    /// own call starts; while any is in flight, calls `pump` (which reads
    /// pending events into the deferred queue) — back to back for
    /// [`PUMP_AFTER`], then every [`PUMP_AFTER`]. Returns at shutdown, once
    /// no own call is in flight; later calls are refused.
    pub(crate) fn run_pump(&self, pump: impl Fn()) {
        let mut linger_until = Instant::now();
        loop {
            if Instant::now() >= linger_until {
                let mut l = self.ledger.lock();
                while self.in_flight() == 0 && !l.stopping {
                    self.cv.wait(&mut l);
                }
            }
            {
                // Leaves only with no call in flight, and closes the door
                // under the same lock (`run` checks `gone` under it).
                let mut l = self.ledger.lock();
                if l.stopping && self.in_flight() == 0 {
                    l.gone = true;
                    return;
                }
            }
            // A call is entering `madvise`, or one came before: read the
            // event as soon as it is queued — the caller then never sleeps
            // for it (a worker woken by the kernel, and the caller woken
            // back, cost two wake-ups) — and stay ready for the next call
            // of a burst (2 MiB faults back to back) for [`LINGER`].
            let slow = Instant::now() + PUMP_AFTER;
            while self.in_flight() > 0 {
                pump();
                if Instant::now() < slow {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(PUMP_AFTER);
                }
            }
            linger_until = Instant::now() + LINGER;
            while self.in_flight() == 0 && Instant::now() < linger_until {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_own_range_is_claimed_once_and_whole() {
        let own = OwnDiscards::new(true);
        // The call itself claims nothing; events come while it runs.
        let r = own.run(0x1000, 0x5000, || {
            assert!(!own.claim(0x0, 0x2000), "reaches outside the record");
            assert!(own.claim(0x1000, 0x3000), "first mapping's part");
            assert!(own.claim(0x3000, 0x5000), "last part: the record goes");
            assert!(!own.claim(0x3000, 0x5000), "the program's, now");
            Ok(())
        });
        assert!(r.is_ok());
    }

    #[test]
    fn an_unclaimed_record_outlives_its_call_then_goes() {
        let own = OwnDiscards::new(true);
        let _ = own.run(0x1000, 0x2000, || Ok(()));
        // Its event may be handled after the call returned.
        assert!(own.claim(0x1000, 0x2000));
        let _ = own.run(0x1000, 0x2000, || Ok(()));
        {
            let mut l = own.ledger.lock();
            l.list[0].returned = Some(Instant::now() - KEEP - Duration::from_secs(1));
        }
        assert!(!own.claim(0x1000, 0x2000), "expired");
        assert!(own.ledger.lock().list.is_empty());
    }

    #[test]
    fn after_the_pump_leaves_own_calls_are_refused_not_hung() {
        let own = OwnDiscards::new(true);
        own.stop();
        own.run_pump(|| {});
        let r = own.run(0x1000, 0x2000, || panic!("must not be called"));
        assert_eq!(r.map_err(|e| e.errno), Err(libc::ESHUTDOWN));
    }
}
