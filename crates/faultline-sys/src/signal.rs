//! SIGBUS plumbing for faults served in the faulting thread
//! (`UFFD_FEATURE_SIGBUS`: a missing-page fault on a registered range raises
//! SIGBUS with `BUS_ADRERR` in the thread that touched it, instead of
//! queueing an event). Installs a process-wide handler once, keeping the
//! action it replaces; reads the faulting address and cause from a
//! `siginfo_t`; passes a signal the handler does not serve on to that
//! previous action; keeps `errno` across a handler; reads and clears a
//! thread's blocking of SIGBUS (a thread that blocks it cannot take
//! in-thread faults: the kernel force-delivers a fault's SIGBUS with the
//! default action, see [`sigbus_blocked`]).
//!
//! The handler is installed with `SA_SIGINFO | SA_NODEFER | SA_RESTART` and
//! without `SA_ONSTACK`: serving a fault needs a real stack (a thread's
//! alternate signal stack is a few KiB), and a store's read may fault on
//! another region inside the handler (`SA_NODEFER` lets that nest). No
//! locks; the previous action is written once, before the handler can run.

use std::sync::OnceLock;

/// A SIGBUS handler: `(signal, siginfo, ucontext)`.
pub type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// `si_code` of a SIGBUS from a userfaultfd with `UFFD_FEATURE_SIGBUS`
/// (the kernel's `VM_FAULT_SIGBUS`: "nonexistent physical address").
const BUS_ADRERR: libc::c_int = 2;
/// `si_code` of a poisoned page (`UFFDIO_POISON`, or memory failure).
const BUS_MCEERR_AR: libc::c_int = 4;

/// The action SIGBUS had before [`install_sigbus`].
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Installs `handler` for SIGBUS in the whole process, once: later calls
/// (with any handler) change nothing and succeed.
///
/// # Errors
/// The `sigaction(2)` error.
pub fn install_sigbus(handler: Handler) -> Result<(), crate::SysError> {
    let mut result = Ok(());
    PREVIOUS.get_or_init(|| {
        // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, empty
        // mask, no flags), filled in below.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = handler as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to live sigaction values; `handler` is
        // an `extern "C"` function of the SA_SIGINFO signature.
        if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } != 0 {
            result = Err(crate::SysError::last("sigaction(SIGBUS)", 0, 0));
            // Nothing was installed: pass everything on as before.
            old.sa_sigaction = libc::SIG_DFL;
        }
        old
    });
    result
}

/// Whether `handler` is SIGBUS's action now (another may have been
/// installed over it since [`install_sigbus`]).
///
/// # Errors
/// The `sigaction(2)` error.
pub fn sigbus_is(handler: Handler) -> Result<bool, crate::SysError> {
    // SAFETY: an all-zero sigaction is a valid value, filled in below.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `cur`,
    // a live sigaction value.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) } != 0 {
        return Err(crate::SysError::last("sigaction(SIGBUS)", 0, 0));
    }
    Ok(cur.sa_sigaction == handler as usize)
}

/// Whether SIGBUS is installed by [`install_sigbus`] in this process.
pub fn sigbus_installed() -> bool {
    PREVIOUS.get().is_some()
}

/// Whether the calling thread blocks SIGBUS (`pthread_sigmask`). A SIGBUS
/// a fault raises in such a thread is forced by the kernel
/// (`force_sig_info_to_task`): it unblocks the signal and resets the
/// process's SIGBUS action to the default, so the process dies (`Bus
/// error`) without any handler running.
///
/// # Errors
/// The `pthread_sigmask(3)` error.
pub fn sigbus_blocked() -> Result<bool, crate::SysError> {
    // SAFETY: an all-zero sigset_t is a valid value, filled in below.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a null new set only reads this thread's mask into `old`, a
    // live sigset_t.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut old) };
    sigmask_result("pthread_sigmask", rc)?;
    // SAFETY: `old` is an initialised sigset_t.
    Ok(unsafe { libc::sigismember(&old, libc::SIGBUS) } == 1)
}

/// Unblocks SIGBUS in the calling thread (the rest of its mask is kept).
///
/// # Errors
/// The `pthread_sigmask(3)` error.
pub fn unblock_sigbus() -> Result<(), crate::SysError> {
    // SAFETY: an all-zero sigset_t is a valid value; sigemptyset and
    // sigaddset initialise it to {SIGBUS}.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live sigset_t; SIGBUS is a valid signal.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGBUS);
    }
    // SAFETY: `set` is initialised; a null old set is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    sigmask_result("pthread_sigmask(SIG_UNBLOCK, SIGBUS)", rc)
}

/// `pthread_sigmask` returns its error number instead of setting `errno`.
fn sigmask_result(op: &'static str, rc: libc::c_int) -> Result<(), crate::SysError> {
    match rc {
        0 => Ok(()),
        errno => Err(crate::SysError {
            op,
            addr: 0,
            len: 0,
            errno,
        }),
    }
}

/// What a SIGBUS says: the address touched, why, and (from the signal
/// context, on x86-64) whether the access was a write to a present page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusInfo {
    /// The faulting address.
    pub addr: usize,
    code: libc::c_int,
    /// The page-fault error code the kernel saved in the signal context
    /// (`X86_PF_*`): 0 where the architecture has none.
    error_code: u64,
}

/// `X86_PF_PROT`: the page was present (a protection fault).
const PF_PROT: u64 = 1 << 0;
/// `X86_PF_WRITE`: the access was a write.
const PF_WRITE: u64 = 1 << 1;

impl BusInfo {
    /// Reads a SIGBUS's siginfo and, on x86-64, the fault's error code.
    ///
    /// # Safety
    /// `info` and `ctx` are the `siginfo_t` and `ucontext_t` the kernel
    /// passed to an `SA_SIGINFO` handler of SIGBUS (valid for reads for the
    /// handler's duration); `ctx` may be null.
    pub unsafe fn read(info: *const libc::siginfo_t, ctx: *const libc::c_void) -> BusInfo {
        // SAFETY: valid for reads (the caller's contract); a SIGBUS
        // siginfo carries `si_addr`.
        let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
        // SAFETY: the caller's contract: a live ucontext_t, or null.
        let error_code = unsafe { error_code(ctx) };
        BusInfo {
            addr,
            code,
            error_code,
        }
    }

    /// The access was a write (x86-64; elsewhere always false, and a
    /// write is then served as a read would be).
    pub fn is_write(&self) -> bool {
        self.error_code & PF_WRITE != 0
    }

    /// A write to a present page under a userfaultfd with
    /// `UFFD_FEATURE_SIGBUS`: a write-protect fault (x86-64; elsewhere
    /// always false).
    pub fn is_write_protect(&self) -> bool {
        self.code == BUS_ADRERR && self.error_code & (PF_PROT | PF_WRITE) == PF_PROT | PF_WRITE
    }

    /// A missing page under a userfaultfd with `UFFD_FEATURE_SIGBUS` (or
    /// another `BUS_ADRERR`, e.g. a file mapping past its end: the caller
    /// checks the address is its own).
    pub fn is_missing_page(&self) -> bool {
        self.code == BUS_ADRERR
    }

    /// A poisoned page (`UFFDIO_POISON`): the access can never succeed.
    pub fn is_poisoned(&self) -> bool {
        self.code == BUS_MCEERR_AR
    }

    /// Raised by the faulting access itself (the kernel's `BUS_ADRALN`,
    /// `BUS_ADRERR`, `BUS_OBJERR` or `BUS_MCEERR_AR`), not sent by another
    /// process nor reported asynchronously (`BUS_MCEERR_AO`): the
    /// interrupted code was making that access, so it holds no lock of
    /// the handler's and is not inside `malloc`.
    pub fn is_synchronous(&self) -> bool {
        (1..=BUS_MCEERR_AR).contains(&self.code)
    }
}

/// The page-fault error code the kernel saved in a signal context: Linux
/// x86-64 puts it in `uc_mcontext.gregs[REG_ERR]` for a fault's SIGBUS
/// (`do_sigbus` → `set_signal_archinfo`). 0 on other architectures.
///
/// # Safety
/// `ctx` is null or a live `ucontext_t` a signal handler was passed.
#[cfg(target_arch = "x86_64")]
unsafe fn error_code(ctx: *const libc::c_void) -> u64 {
    if ctx.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract: a live ucontext_t.
    unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_ERR as usize] as u64 }
}

/// See the x86-64 version: no error code here.
///
/// # Safety
/// None needed; `unsafe` to match the x86-64 version.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn error_code(_ctx: *const libc::c_void) -> u64 {
    0
}

/// Passes a SIGBUS the handler does not serve on to the action installed
/// before it: calls that handler, or for `SIG_DFL`/`SIG_IGN` puts the
/// default action back, so that the access, retried when the handler
/// returns, kills the process with SIGBUS as it would have.
///
/// # Safety
/// Called from the SIGBUS handler with the arguments the kernel passed it.
pub unsafe fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(prev) = PREVIOUS.get() else {
        return;
    };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // SAFETY: as in `install_sigbus`: all-zero is SIG_DFL.
        let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: sigaction is async-signal-safe; `dfl` is a valid action.
        unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous action was installed as an SA_SIGINFO
        // handler, so `h` is such a function; the arguments are the
        // kernel's.
        let f: Handler = unsafe { std::mem::transmute::<usize, Handler>(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler `void (*)(int)` (not DFL/IGN).
        let f: extern "C" fn(libc::c_int) =
            unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(h) };
        f(sig);
    }
}

/// Writes one line to stderr from a signal handler: `parts`, then `addr`
/// in hex, then `rest`, from a stack buffer (1024 bytes at most) with one
/// `write(2)` (async-signal-safe; a failed write changes nothing).
pub fn report(head: &[u8], addr: usize, rest: &[u8]) {
    let mut buf = [0u8; 1024];
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        let n = bytes.len().min(buf.len() - len);
        buf[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    };
    push(head);
    let mut hex = *b"0x0000000000000000";
    for (i, d) in hex[2..].iter_mut().enumerate() {
        *d = b"0123456789abcdef"[(addr >> ((15 - i) * 4)) & 0xf];
    }
    push(&hex);
    push(rest);
    push(b"\n");
    // SAFETY: write(2) is async-signal-safe; `buf` is live for `len` bytes.
    unsafe { libc::write(2, buf.as_ptr().cast(), len) };
}

/// Keeps the thread's `errno` across a signal handler: restored on drop
/// (the interrupted code may be between a call and its `errno` check).
#[derive(Debug)]
pub struct SavedErrno(libc::c_int);

impl SavedErrno {
    /// Saves the current `errno`.
    pub fn save() -> SavedErrno {
        // SAFETY: `__errno_location` returns this thread's errno slot.
        SavedErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for SavedErrno {
    fn drop(&mut self) {
        // SAFETY: as in `save`.
        unsafe { *libc::__errno_location() = self.0 };
    }
}
