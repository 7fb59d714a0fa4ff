//! The SIGBUS reporter. A fault faultline cannot serve (the budget is
//! exhausted, the file cannot be read) poisons the page, so the access —
//! inside NumPy's C code, where no Python exception can be raised — gets
//! SIGBUS. Without a word the interpreter would just die; this handler
//! first writes one line to stderr naming the address and the cause, then
//! puts the previous action back (`SIG_DFL`, or e.g. `faulthandler`'s) and
//! returns: the access faults again and the process dies of SIGBUS as it
//! would have (after the previous handler, if any, ran).
//!
//! Async-signal safety: the handler only loads atomics, formats into a
//! stack buffer, and calls `write(2)`, `nanosleep(2)` and `sigaction(2)`.
//! Regions register their address ranges in a fixed table of atomic slots
//! (the handler speaks only for faults inside one); each manager's error
//! watcher (a thread, see `manager.rs`) publishes the last fault error as
//! a leaked, immutable message behind an atomic pointer (leaked so that the
//! handler never reads freed memory; one small string per failed fault).
//! No locks.
//!
//! Regions of in-thread managers are not registered: faultline's own
//! handler, installed after this one (at the first in-thread manager), runs
//! first, names the cause itself and passes the signal on to this one,
//! which then only puts the previous action back.
//!
//! Why libc here: installing a signal handler and writing from it are
//! process-level FFI glue the library does not offer (faultline-sys holds
//! the library's own system calls; a binding's signal disposition is the
//! binding's business).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Region ranges the handler speaks for: `(start, end)`, `0, 0` when free.
const SLOTS: usize = 256;
static RANGES: [(AtomicUsize, AtomicUsize); SLOTS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; SLOTS];

/// The last fault error: its page address and message.
struct LastError {
    addr: usize,
    msg: Box<[u8]>,
}
static LAST: AtomicPtr<LastError> = AtomicPtr::new(std::ptr::null_mut());

/// The action SIGBUS had before [`install`].
static OLD: OnceLock<libc::sigaction> = OnceLock::new();

/// Records `[start, end)` as a faultline region; returns its slot (or
/// `None` when the table is full: faults there get no message).
pub(crate) fn register(start: usize, end: usize) -> Option<usize> {
    for (i, (s, e)) in RANGES.iter().enumerate() {
        if s.compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            e.store(end, Ordering::Release);
            return Some(i);
        }
    }
    None
}

/// Frees slot `i` (the region is unmapped).
pub(crate) fn unregister(i: usize) {
    if let Some((s, e)) = RANGES.get(i) {
        e.store(0, Ordering::Release);
        s.store(0, Ordering::Release);
    }
}

/// Publishes a fault error (page address `addr`) for the handler.
pub(crate) fn record(addr: usize, msg: &str) {
    let last = Box::new(LastError {
        addr,
        msg: msg.as_bytes().into(),
    });
    // Leaked on purpose (see the module doc): the handler may be reading
    // the previous one.
    LAST.store(Box::into_raw(last), Ordering::Release);
}

/// Installs the handler once per process, keeping the previous action.
pub(crate) fn install() {
    if OLD.get().is_some() {
        return;
    }
    // SAFETY: an all-zero sigaction is a valid value (no handler, empty
    // mask, no flags) to be filled in.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction =
        handler as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live sigaction values; `handler` only
    // does async-signal-safe work. The old action is saved before the
    // handler could need it: OLD is set right after, and the handler falls
    // back to SIG_DFL when it is not set yet.
    let rc = unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) };
    if rc == 0 {
        let _ = OLD.set(old);
    }
}

/// Whether `addr` lies in a registered region.
fn in_region(addr: usize) -> bool {
    RANGES.iter().any(|(s, e)| {
        let s = s.load(Ordering::Acquire);
        s != 0 && s <= addr && addr < e.load(Ordering::Acquire)
    })
}

/// A stack buffer for the message (no allocation in the handler).
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn hex(&mut self, v: usize) {
        let mut d = [0u8; 18];
        d[0] = b'0';
        d[1] = b'x';
        for i in 0..16 {
            let nib = (v >> ((15 - i) * 4)) & 0xf;
            d[2 + i] = b"0123456789abcdef"[nib];
        }
        self.push(&d);
    }
}

/// The cause recorded for a fault at `addr` (its page: within 2 MiB
/// below), waiting up to 200 ms for the watcher to publish it.
fn cause_of(addr: usize) -> Option<&'static [u8]> {
    for _ in 0..100 {
        let p = LAST.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published LastErrors are leaked, never freed or
            // changed, so a non-null pointer is valid for the program's life.
            let last: &'static LastError = unsafe { &*p };
            if last.addr <= addr && addr - last.addr < (2 << 20) {
                return Some(&last.msg);
            }
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 2_000_000,
        };
        // SAFETY: nanosleep is async-signal-safe; `ts` is a live value.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
    None
}

extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    if in_region(addr) {
        let mut line = Line {
            buf: [0; 512],
            len: 0,
        };
        line.push(b"faultline: SIGBUS at ");
        line.hex(addr);
        line.push(b": a fault on a faultline region could not be served: ");
        match cause_of(addr) {
            Some(msg) => line.push(msg),
            None => line.push(b"cause not recorded"),
        }
        line.push(b"; the process dies with SIGBUS\n");
        // SAFETY: write(2) is async-signal-safe; the buffer is live for
        // `len` bytes. A failed write changes nothing we could act on.
        unsafe { libc::write(2, line.buf.as_ptr().cast(), line.len) };
    }
    // Put the previous action back (SIG_DFL if none was saved) and return:
    // the access faults again and gets it.
    // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    let old = OLD.get().unwrap_or(&dfl);
    // SAFETY: sigaction is async-signal-safe; `old` is a valid action.
    unsafe { libc::sigaction(libc::SIGBUS, old, std::ptr::null_mut()) };
}
