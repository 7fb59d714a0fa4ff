//! Reads whose completion the reading thread polls for: one `io_uring` per
//! thread, a read submitted on it, and the thread spinning on the
//! completion queue for up to a bound before it sleeps in `io_uring_enter`.
//! And writes in batches ([`write_many`]): a batch's writes (each one
//! buffer or a vector of them, as `pwritev`) all in flight on the same
//! ring at once, waited for together.
//!
//! Why: on a KVM guest whose idle vCPUs halt, a thread that sleeps in
//! `pread` is woken by an interrupt to a halted vCPU — the host must run
//! that vCPU again — and the device's own completion interrupt costs the
//! same when it lands on a halted vCPU. A thread that polls keeps its vCPU
//! running: random 4 KiB `O_DIRECT` reads measured 41 µs polled against
//! 57–72 µs slept on this project's machine (docs/measurements.md, "Polled
//! reads"). The cost is the CPU the poll burns while the read is in flight,
//! bounded by the caller's `spin` — and, where the program's threads keep
//! every CPU busy, more than the poll saves: so a read polls only with a
//! place among the pollers (`pollers.rs`: at most half the CPUs, and only
//! while the process's CPUs have had one to spare), and
//! otherwise is a plain `pread`.
//!
//! Why batches: a device serves many requests in flight faster than one at
//! a time (the project's virtual disk: 15k random 4 KiB writes/s one at a
//! time, 50k with eight in flight), and a reclaimer writing its victims
//! back one by one held the device at one write in flight beside the
//! program's reads.
//!
//! Invariant: [`read_at`] never returns while its read is in flight (the
//! kernel writes `buf` until the completion is reaped), nor [`write_many`]
//! while any of its writes is (the kernel reads their buffers). A thread whose ring
//! cannot be made (io_uring disabled, no file descriptors left) or is in use
//! further up its own stack reads with plain `pread`. No locks: the ring is
//! the thread's own.

use std::cell::RefCell;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

mod pollers;
use pollers::Poller;

/// This thread's ring: not tried yet, made, or refused by the kernel.
enum Ring {
    Untried,
    Ready(Box<io_uring::IoUring>),
    Unavailable,
}

thread_local! {
    static RING: RefCell<Ring> = const { RefCell::new(Ring::Untried) };
}

/// Entries of each thread's ring: one read at a time is in flight, or up
/// to this many writes of a batch.
const ENTRIES: u32 = 32;

/// Prepares polled reads: finds what the rule that allows a poll reads
/// once per process (the CPU quota's cgroup, from `/proc/self/cgroup` and
/// the mount table), so that a first read served in a SIGBUS handler does
/// not allocate for it. Optional; a store that polls calls it when made.
pub fn prepare_polling() {
    pollers::prepare();
}

/// The pollers' decisions so far in this process: (windows that allowed
/// polling, windows in all), one window per 200 ms of reads
/// (`pollers.rs`). A program (or a bench) that asked for polled reads
/// learns from it whether its reads could poll at all: where the CPUs the
/// readers may run on had none to spare, every read slept.
pub fn polling_windows() -> (u64, u64) {
    pollers::windows()
}

/// Reads up to `buf.len()` bytes of `fd` from byte `offset` into `buf`, like
/// `pread(2)`: returns the bytes read (0 at the end of the file) or the
/// read's error. With `spin > 0` the read goes through this thread's
/// `io_uring`, polled for up to `spin` before the thread sleeps; with
/// `spin == 0`, where polling is not allowed now (at most half the CPUs
/// poll, and only while the process's CPUs have one to
/// spare: `pollers.rs`), or where no ring can be had, it is a plain
/// `pread`.
///
/// # Errors
/// The read's own error (`EIO`, `EINVAL` for a direct read the kernel
/// refuses, ...), as `pread` would return it.
pub fn read_at(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    offset: u64,
    spin: Duration,
) -> std::io::Result<usize> {
    if spin.is_zero() {
        return pread(fd, buf, offset);
    }
    read_on_ring(fd, buf, offset, spin, Poller::enter)
}

/// [`read_at`] with `spin > 0`: on this thread's ring if it has one and
/// `place` gives a place among the pollers, else with `pread`.
fn read_on_ring(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    offset: u64,
    spin: Duration,
    place: impl FnOnce() -> Option<Poller>,
) -> std::io::Result<usize> {
    RING.with(|cell| {
        let Ok(mut ring) = cell.try_borrow_mut() else {
            return pread(fd, buf, offset);
        };
        make(&mut ring);
        let Ring::Ready(r) = &mut *ring else {
            return pread(fd, buf, offset);
        };
        // No place among the pollers (`pollers.rs`): a plain read,
        // sleeping.
        let Some(poller) = place() else {
            return pread(fd, buf, offset);
        };
        match polled(r, fd, buf, offset, spin, poller) {
            Some(done) => done,
            None => {
                // It failed to submit: plain reads from now on (dropping
                // the ring closes it; nothing of ours is in flight).
                *ring = Ring::Unavailable;
                pread(fd, buf, offset)
            }
        }
    })
}

/// Makes this thread's ring on its first use.
fn make(ring: &mut Ring) {
    if matches!(*ring, Ring::Untried) {
        *ring =
            io_uring::IoUring::new(ENTRIES).map_or(Ring::Unavailable, |r| Ring::Ready(Box::new(r)));
    }
}

/// Writes each `(offset, buffers)` of `writes` to `fd`, like `pwritev(2)`
/// (the buffers one after the other from the offset; at most `IOV_MAX`),
/// with the whole batch in flight at once on this thread's ring (32 at a
/// time) and waited for (sleeping: a batch takes long). Returns each
/// write's bytes written (a short count is the caller's to finish) or its
/// error, in the order given. Where no ring can be had, or the calling
/// thread's is in use further up its stack, each is a plain `pwritev`.
pub fn write_many(
    fd: BorrowedFd<'_>,
    writes: &[(u64, &[IoSlice<'_>])],
) -> Vec<std::io::Result<usize>> {
    let mut done: Vec<Option<std::io::Result<usize>>> = writes.iter().map(|_| None).collect();
    RING.with(|cell| {
        let Ok(mut ring) = cell.try_borrow_mut() else {
            return;
        };
        make(&mut ring);
        let Ring::Ready(r) = &mut *ring else {
            return;
        };
        let whole = writes
            .chunks(ENTRIES as usize)
            .zip(done.chunks_mut(ENTRIES as usize))
            .all(|(batch, out)| in_flight(r, fd, batch, out));
        if !whole {
            // The kernel refused a submission: plain writes from now on
            // (dropping the ring drops what it never took; nothing it
            // took is in flight, every such write was reaped).
            *ring = Ring::Unavailable;
        }
    });
    writes
        .iter()
        .zip(done)
        .map(|(&(offset, bufs), d)| d.unwrap_or_else(|| pwritev(fd, bufs, offset)))
        .collect()
}

/// Submits `batch` (at most [`ENTRIES`] writes) on `ring` and reaps every
/// write the kernel took, its result in `out` at the same index. False if
/// the kernel refused some (their `out` stays `None`: never submitted).
fn in_flight(
    ring: &mut io_uring::IoUring,
    fd: BorrowedFd<'_>,
    batch: &[(u64, &[IoSlice<'_>])],
    out: &mut [Option<std::io::Result<usize>>],
) -> bool {
    let mut pushed = 0;
    for (i, &(offset, bufs)) in batch.iter().enumerate() {
        let fd = io_uring::types::Fd(fd.as_raw_fd());
        // `IoSlice` is ABI-compatible with `iovec` (std guarantees it on
        // Unix).
        let iov = bufs.as_ptr().cast::<libc::iovec>();
        let sqe = io_uring::opcode::Writev::new(fd, iov, bufs.len() as u32)
            .offset(offset)
            .build()
            .user_data(i as u64);
        // SAFETY: the vector `bufs` and the buffers it names stay valid and
        // unchanged until the entry's completion is reaped below, before
        // this function returns (every submitted entry is reaped), and `fd`
        // stays open for the call. The queue is empty on entry and holds
        // `ENTRIES`.
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            break;
        }
        pushed += 1;
    }
    let taken = submit_all(ring, pushed);
    let mut reaped = 0;
    while reaped < taken {
        for cqe in ring.completion() {
            let res = cqe.result();
            out[cqe.user_data() as usize] = Some(if res < 0 {
                Err(std::io::Error::from_raw_os_error(-res))
            } else {
                Ok(res as usize)
            });
            reaped += 1;
        }
        if reaped < taken {
            wait_one(ring);
        }
    }
    taken == pushed
}

/// Submits the `pushed` entries queued on `ring`, retried while the kernel
/// is short of resources for a moment or interrupted: how many it took.
fn submit_all(ring: &mut io_uring::IoUring, pushed: usize) -> usize {
    let mut taken = 0;
    let mut tries = 0;
    while taken < pushed && tries < 1000 {
        match ring.submit() {
            Ok(n) if n > 0 => taken += n,
            Ok(_) => tries += 1,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::EINTR)
                ) =>
            {
                tries += 1;
                std::hint::spin_loop()
            }
            Err(_) => break,
        }
    }
    taken
}

/// Sleeps until a completion arrives on `ring`, submitting nothing (an
/// entry the kernel refused stays unsubmitted).
fn wait_one(ring: &mut io_uring::IoUring) {
    // SAFETY: `io_uring_enter(fd, 0, 1, GETEVENTS)` on the ring's own fd
    // submits nothing and passes no argument: it only waits.
    let waited = unsafe {
        ring.submitter()
            .enter::<libc::sigset_t>(0, 1, io_uring::EnterFlags::GETEVENTS.bits(), None)
    };
    if waited.is_err() {
        // Interrupted: look again shortly.
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// `pwritev(2)`, retried on `EINTR`.
fn pwritev(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>], offset: u64) -> std::io::Result<usize> {
    retried(|| {
        // SAFETY: `bufs` (ABI-compatible with `iovec`) and the buffers it
        // names are valid for reads for the call, and `fd` is open
        // (borrowed for the call).
        unsafe {
            libc::pwritev(
                fd.as_raw_fd(),
                bufs.as_ptr().cast(),
                bufs.len() as libc::c_int,
                offset as libc::off_t,
            )
        }
    })
}

/// `pread(2)`, retried on `EINTR`.
fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    retried(|| {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the
        // call, and `fd` is open (borrowed for the call).
        unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                offset as libc::off_t,
            )
        }
    })
}

/// A transfer `call` (a byte count, or -1 with `errno`), made again while
/// a signal interrupts it.
fn retried(mut call: impl FnMut() -> isize) -> std::io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One read on `ring`, polled for up to `spin` holding `poller`'s place,
/// then waited for; `None` when the ring would not take it (nothing is in
/// flight then).
fn polled(
    ring: &mut io_uring::IoUring,
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    offset: u64,
    spin: Duration,
    poller: Poller,
) -> Option<std::io::Result<usize>> {
    // Read at most what one request may carry (u32 bytes); the caller loops.
    let len = buf.len().min(u32::MAX as usize & !4095) as u32;
    let sqe =
        io_uring::opcode::Read::new(io_uring::types::Fd(fd.as_raw_fd()), buf.as_mut_ptr(), len)
            .offset(offset)
            .build();
    // SAFETY: the entry's buffer (`buf`, `len` bytes) stays valid and is not
    // otherwise accessed until its completion is reaped below, which happens
    // before this function returns (`reap` never gives up), and `fd` stays
    // open for the call. The queue is empty: every read is reaped before
    // the next is pushed.
    if unsafe { ring.submission().push(&sqe) }.is_err() || !submit(ring) {
        return None;
    }
    let res = reap(ring, spin, poller);
    Some(if res < 0 {
        Err(std::io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    })
}

/// Submits the pushed entry, retried while interrupted or short of
/// resources for a moment; false when the kernel will not take it (the
/// caller then drops the ring, entry and all: unsubmitted, it never runs).
fn submit(ring: &mut io_uring::IoUring) -> bool {
    for _ in 0..1000 {
        match ring.submit() {
            Ok(n) if n > 0 => return true,
            // EAGAIN/EBUSY: resources for a moment; EINTR: a signal.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::EINTR)
                ) =>
            {
                std::hint::spin_loop()
            }
            _ => return false,
        }
    }
    false
}

/// Waits for the one completion: spins on the queue for up to `spin`, then
/// sleeps in the kernel. Returns its result (bytes, or a negated errno).
fn reap(ring: &mut io_uring::IoUring, spin: Duration, poller: Poller) -> i32 {
    let mut poller = Some(poller);
    let started = Instant::now();
    let mut polls = 0u32;
    loop {
        if let Some(cqe) = ring.completion().next() {
            return cqe.result();
        }
        polls = polls.wrapping_add(1);
        if polls % 64 != 0 || started.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        drop(poller.take());
        // Past the spin: sleep until it completes. An interrupted or
        // failed wait is waited again — the read is in flight and must be
        // reaped before its buffer is given back.
        if ring.submit_and_wait(1).is_err() {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn polled_and_plain_reads_agree_and_stop_at_the_end() {
        let path = std::env::temp_dir().join(format!("faultline-sys-io-{}", std::process::id()));
        let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&data))
            .expect("write");
        let f = std::fs::File::open(&path).expect("open");
        // Plain, as the gate allows, and on the ring whatever it says.
        let spin = Duration::from_micros(200);
        type Read<'a> = &'a dyn Fn(&mut [u8], u64) -> std::io::Result<usize>;
        let ways: [Read; 3] = [
            &|buf, at| read_at(f.as_fd(), buf, at, Duration::ZERO),
            &|buf, at| read_at(f.as_fd(), buf, at, spin),
            &|buf, at| read_on_ring(f.as_fd(), buf, at, spin, || Some(Poller::ungated())),
        ];
        for (way, read) in ways.iter().enumerate() {
            let mut buf = vec![0u8; 4096];
            let n = read(&mut buf, 4096).expect("read");
            assert_eq!((n, &buf[..]), (4096, &data[4096..8192]), "way {way}");
            let n = read(&mut buf, 3 * 4096).expect("tail");
            assert_eq!((n, &buf[..n]), (100, &data[3 * 4096..]), "way {way}");
            let n = read(&mut buf, 1 << 20).expect("past the end");
            assert_eq!(n, 0, "way {way}");
        }
        let _ = std::fs::remove_file(&path);
    }

    /// A thread without a ring (the kernel refused one: io_uring disabled,
    /// no descriptors left) reads with `pread`, polling asked for or not.
    #[test]
    fn a_thread_without_a_ring_reads_with_pread() {
        let path = std::env::temp_dir().join(format!("faultline-sys-io-nr-{}", std::process::id()));
        let data: Vec<u8> = (0..8192).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).expect("write");
        let f = std::fs::File::open(&path).expect("open");
        std::thread::scope(|s| {
            s.spawn(|| {
                RING.with(|r| *r.borrow_mut() = Ring::Unavailable);
                let mut buf = vec![0u8; 4096];
                let n =
                    read_at(f.as_fd(), &mut buf, 4096, Duration::from_micros(200)).expect("read");
                assert_eq!((n, &buf[..]), (4096, &data[4096..]));
                RING.with(|r| assert!(matches!(*r.borrow(), Ring::Unavailable)));
            });
        });
        let _ = std::fs::remove_file(&path);
    }

    /// Eight threads at once, each with its own ring, every other read
    /// polled on it whatever the pollers' rules say, the others as they
    /// allow: every read gets its own bytes.
    #[test]
    fn concurrent_polled_reads_get_their_own_bytes() {
        let path = std::env::temp_dir().join(format!("faultline-sys-io-cc-{}", std::process::id()));
        let pages = 64usize;
        let data: Vec<u8> = (0..pages * 4096)
            .map(|i| (i / 4096) as u8 ^ (i as u8))
            .collect();
        std::fs::write(&path, &data).expect("write");
        let f = std::fs::File::open(&path).expect("open");
        std::thread::scope(|s| {
            for t in 0..8usize {
                let (f, data) = (&f, &data);
                s.spawn(move || {
                    let mut buf = vec![0u8; 4096];
                    for i in 0..200 {
                        let p = (t * 7 + i * 13) % pages;
                        let (at, spin) = ((p * 4096) as u64, Duration::from_micros(200));
                        let n = if i % 2 == 0 {
                            read_on_ring(f.as_fd(), &mut buf, at, spin, || Some(Poller::ungated()))
                        } else {
                            read_at(f.as_fd(), &mut buf, at, spin)
                        }
                        .expect("read");
                        assert_eq!(n, 4096);
                        assert!(
                            buf[..] == data[p * 4096..(p + 1) * 4096],
                            "thread {t} page {p}"
                        );
                    }
                });
            }
        });
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_batch_of_writes_lands_whole_in_any_order_of_offsets() {
        let path = std::env::temp_dir().join(format!("faultline-sys-wm-{}", std::process::id()));
        let pages = 100;
        std::fs::write(&path, vec![0u8; pages * 4096]).expect("create");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        // More writes than the ring holds (two batches and a part), in
        // scattered order, and one past the end (the file grows).
        let order: Vec<usize> = (0..70).map(|i| (i * 37) % pages).collect();
        let bufs: Vec<Vec<u8>> = order.iter().map(|&p| vec![p as u8 + 1; 4096]).collect();
        let slices: Vec<[IoSlice<'_>; 1]> = bufs.iter().map(|b| [IoSlice::new(b)]).collect();
        let mut writes: Vec<(u64, &[IoSlice<'_>])> = order
            .iter()
            .zip(&slices)
            .map(|(&p, b)| ((p * 4096) as u64, &b[..]))
            .collect();
        // A vectored write: three buffers, one after the other, past the
        // end of the file (it grows).
        let tail = [vec![0xEEu8; 100], vec![0xEF; 50], vec![0xF0; 10]];
        let tail_slices: Vec<IoSlice<'_>> = tail.iter().map(|b| IoSlice::new(b)).collect();
        writes.push(((pages * 4096) as u64, &tail_slices));
        let done = write_many(f.as_fd(), &writes);
        assert_eq!(done.len(), writes.len());
        for (d, w) in done.iter().zip(&writes) {
            let len: usize = w.1.iter().map(|b| b.len()).sum();
            assert_eq!(d.as_ref().ok(), Some(&len), "write at {}", w.0);
        }
        let back = std::fs::read(&path).expect("read back");
        assert_eq!(back.len(), pages * 4096 + 160);
        for p in 0..pages {
            let want = if order.contains(&p) { p as u8 + 1 } else { 0 };
            assert!(
                back[p * 4096..(p + 1) * 4096].iter().all(|&b| b == want),
                "page {p}"
            );
        }
        let tail_back = &back[pages * 4096..];
        assert!(tail_back[..100].iter().all(|&b| b == 0xEE));
        assert!(tail_back[100..150].iter().all(|&b| b == 0xEF));
        assert!(tail_back[150..].iter().all(|&b| b == 0xF0));
        // A read-only descriptor: every write fails, each with its error.
        let ro = std::fs::File::open(&path).expect("open read-only");
        let failed = write_many(ro.as_fd(), &writes[..3]);
        assert!(failed
            .iter()
            .all(|d| d.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::EBADF)));
        let _ = std::fs::remove_file(&path);
    }
}
