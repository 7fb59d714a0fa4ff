//! The threads of one manager and their shutdown: the fault workers, the
//! spare servers, the reclaimer, the zeroing worker and the pump of
//! faultline's own removal events (`own_discards.rs`), all holding an
//! `Arc<Core>`. The [`Manager`](super::Manager) and every
//! [`Region`](super::Region) hold an `Arc<Service>`; when the last one is
//! dropped, the core is told to stop, the shutdown eventfd is signalled and
//! the threads are joined — within [`SHUTDOWN_WAIT`], so a store call that
//! never returns cannot hang the program's drop (such a thread is detached,
//! with an error logged, and keeps the core alive until it returns).
//!
//! Invariant: every thread a manager needs is started, and every fd it
//! needs opened, in `build()` ([`Service::start`]): nothing is acquired
//! later on the fault path. Locks: none of its own.

use crate::core::Core;
use crate::error::BuildError;
use crate::fault::inthread::{self, Registration};
use crate::fault::service::{run_spare, run_worker};
use crate::frame::FrameAllocator;
use crate::publish::Publisher;
use faultline_sys::uffd::{EventFd, Waiter};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long dropping the manager (or a region's teardown) waits for its
/// threads or a page lock.
pub(crate) const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Owns the manager's threads; see the module docs.
#[derive(Debug)]
pub(crate) struct Service {
    pub(crate) core: Arc<Core>,
    shutdown: EventFd,
    threads: Vec<JoinHandle<()>>,
    /// The manager's place in the SIGBUS handler's registry
    /// ([`crate::config::FaultMode::InThread`]).
    in_thread: Option<Registration>,
}

impl Service {
    /// Starts every thread of `core`. The epoll sets are made first, so
    /// running out of file descriptors is `build()`'s error, not a worker
    /// that quietly exits (and a first touch that then waits forever).
    pub(crate) fn start(
        core: Arc<Core>,
        publisher: Option<Publisher>,
    ) -> Result<Service, BuildError> {
        let shutdown = EventFd::new()?;
        let others: [RawFd; 2] = [shutdown.raw_fd(), core.deferred_fd.raw_fd()];
        let wake_one = core.config.experiment.exclusive_wake;
        let workers = core.config.workers;
        let waiters = (0..workers)
            .map(|_| Waiter::new(&core.uffd, &others, wake_one))
            .collect::<Result<Vec<_>, _>>()?;
        let in_thread = match core.config.fault_mode {
            crate::config::FaultMode::InThread => Some(inthread::register(&core)?),
            crate::config::FaultMode::Workers => None,
        };
        let mut service = Service {
            core,
            shutdown,
            threads: Vec::new(),
            in_thread,
        };
        for (i, waiter) in waiters.into_iter().enumerate() {
            service.spawn(format!("faultline-w{i}"), move |c| run_worker(c, i, waiter))?;
        }
        for rank in 0..service.core.config.spare_servers {
            service.spawn(format!("faultline-s{rank}"), move |c| {
                run_spare(c, workers + rank, rank)
            })?;
        }
        // The reclaimer also publishes the stats (so it runs for that alone
        // when reclaim is off).
        if service.core.config.reclaim || publisher.is_some() {
            service.spawn("faultline-reclaim".into(), move |c| {
                crate::reclaim::run(&c, publisher)
            })?;
        }
        if service.core.config.hears_removals() {
            service.spawn("faultline-pump".into(), |c| {
                c.own_discards.run_pump(|| c.pump_events())
            })?;
        }
        if service.core.config.prezero && service.core.pool.thp() {
            service.spawn("faultline-zero".into(), |c| crate::fill::run_zeroer(&c))?;
        }
        Ok(service)
    }

    fn spawn(
        &mut self,
        name: String,
        run: impl FnOnce(Arc<Core>) + Send + 'static,
    ) -> Result<(), BuildError> {
        let c = Arc::clone(&self.core);
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                // A thread inherits its creator's mask: one that blocks
                // SIGBUS would die of an in-thread fault (a store that
                // reads another manager's in-thread region).
                if let Err(e) = faultline_sys::signal::unblock_sigbus() {
                    tracing::warn!("faultline thread keeps SIGBUS blocked: {e}");
                }
                run(c)
            })
            .map_err(BuildError::Thread)?;
        self.threads.push(h);
        Ok(())
    }

    /// Joins the threads that finish within [`SHUTDOWN_WAIT`]; the others
    /// are detached with an error logged. Returns whether all joined.
    fn join_bounded(&mut self) -> bool {
        // The last handle may drop on one of these threads (a store that
        // holds a region, dropped by a worker): it cannot join itself.
        let me = std::thread::current().id();
        let n = self.threads.len();
        self.threads.retain(|w| w.thread().id() != me);
        let mut all = self.threads.len() == n;
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        while self.threads.iter().any(|w| !w.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        for w in self.threads.drain(..) {
            if w.is_finished() {
                let _ = w.join();
            } else {
                all = false;
                tracing::error!(
                    thread = w.thread().name().unwrap_or("?"),
                    "a faultline thread did not stop within {SHUTDOWN_WAIT:?} (a store call that does not return?); detached"
                );
            }
        }
        all
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // Every region is gone: no fault of this manager's can come.
        drop(self.in_thread.take());
        if !self.core.in_owner() {
            // A child of fork(): the threads are the parent's (none run
            // here), and the shutdown eventfd is shared with the parent —
            // signalling it would stop the parent's workers.
            return;
        }
        // If signalling fails the workers would block forever; there is no
        // way to report it from drop, and joining would hang, so detach then.
        self.core.stop();
        if self.shutdown.signal().is_ok() && self.join_bounded() {
            self.core.drain_reserve();
            // Every region is gone (each held this service), so every frame
            // is free again or in the balloon: `free + in flight + mapped +
            // ballooned = pool pages` with the middle two zero. Checked in
            // debug builds (the tests).
            if cfg!(debug_assertions) && !std::thread::panicking() {
                self.core.alloc.check();
                debug_assert_eq!(
                    self.core.alloc.free_pages() + self.core.balloon.counts().0,
                    self.core.pool.pages(),
                    "frames leaked at shutdown"
                );
            }
        }
    }
}
