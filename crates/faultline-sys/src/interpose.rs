//! For a library that interposes libc's memory and file calls
//! (`LD_PRELOAD`, `faultline-preload`): the *next* definition of each call,
//! the one the program would have reached without the interposer
//! (`dlsym(RTLD_NEXT)`, normally libc's), and the few facts about a
//! descriptor the interposer asks before it decides (`fstat`, the access
//! mode, the file position, the path).
//!
//! Every `next_*` function has the C function's contract and returns what
//! it returns (and leaves `errno` as it does); where the symbol cannot be
//! resolved, it fails with `ENOSYS`. `mremap` is made as a raw system call
//! instead: libc's is variadic, and a variadic function cannot be called
//! through a fixed prototype. Resolution happens once per symbol; the
//! address is kept in an atomic (a race resolves the same address twice).
//!
//! No locks.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `dlsym(RTLD_NEXT, name)`, kept in `slot`; 0 if there is none.
fn resolve(slot: &AtomicUsize, name: &CStr) -> usize {
    // Relaxed: the slot holds a code address that every thread resolves to
    // the same value; nothing else is published through it.
    let addr = slot.load(Ordering::Relaxed);
    if addr != 0 {
        return addr;
    }
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name only looks
    // the symbol up.
    let found = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    slot.store(found, Ordering::Relaxed);
    found
}

/// Defines `next_<name>`: the next definition of the C function `name`.
macro_rules! next_fn {
    ($(#[$doc:meta])* $next:ident = $sym:literal ($($arg:ident: $ty:ty),*) -> $ret:ty, failed $fail:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The C function's own contract: every pointer argument is what
        /// the function expects (valid for its length, or a range the
        /// caller may unmap or change).
        pub unsafe fn $next($($arg: $ty),*) -> $ret {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let addr = resolve(&SLOT, $sym);
            if addr == 0 {
                crate::host::set_errno(libc::ENOSYS);
                return $fail;
            }
            // SAFETY: `addr` is the dynamic linker's definition of this C
            // function, whose prototype is the one written here.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(addr) };
            // SAFETY: the caller keeps the function's contract.
            unsafe { f($($arg),*) }
        }
    };
}

next_fn!(
    /// The next `mmap`.
    next_mmap = c"mmap" (addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: libc::off_t) -> *mut c_void,
    failed libc::MAP_FAILED
);
next_fn!(
    /// The next `munmap`.
    next_munmap = c"munmap" (addr: *mut c_void, len: usize) -> c_int, failed -1
);
next_fn!(
    /// The next `msync`.
    next_msync = c"msync" (addr: *mut c_void, len: usize, flags: c_int) -> c_int, failed -1
);
next_fn!(
    /// The next `madvise`.
    next_madvise = c"madvise" (addr: *mut c_void, len: usize, advice: c_int) -> c_int, failed -1
);
next_fn!(
    /// The next `mprotect`.
    next_mprotect = c"mprotect" (addr: *mut c_void, len: usize, prot: c_int) -> c_int, failed -1
);
next_fn!(
    /// The next `write`.
    next_write = c"write" (fd: c_int, buf: *const c_void, n: usize) -> isize, failed -1
);
next_fn!(
    /// The next `pwrite` (`pwrite64` is the same function on 64-bit Linux).
    next_pwrite = c"pwrite" (fd: c_int, buf: *const c_void, n: usize, offset: libc::off_t) -> isize, failed -1
);
next_fn!(
    /// The next `writev`.
    next_writev = c"writev" (fd: c_int, iov: *const libc::iovec, count: c_int) -> isize, failed -1
);
next_fn!(
    /// The next `pwritev` (`pwritev64` is the same function on 64-bit Linux).
    next_pwritev = c"pwritev" (fd: c_int, iov: *const libc::iovec, count: c_int, offset: libc::off_t) -> isize, failed -1
);
next_fn!(
    /// The next `read`.
    next_read = c"read" (fd: c_int, buf: *mut c_void, n: usize) -> isize, failed -1
);
next_fn!(
    /// The next `pread` (`pread64` is the same function on 64-bit Linux).
    next_pread = c"pread" (fd: c_int, buf: *mut c_void, n: usize, offset: libc::off_t) -> isize, failed -1
);
next_fn!(
    /// The next `readv`.
    next_readv = c"readv" (fd: c_int, iov: *const libc::iovec, count: c_int) -> isize, failed -1
);
next_fn!(
    /// The next `preadv` (`preadv64` is the same function on 64-bit Linux).
    next_preadv = c"preadv" (fd: c_int, iov: *const libc::iovec, count: c_int, offset: libc::off_t) -> isize, failed -1
);
next_fn!(
    /// The next `ftruncate`.
    next_ftruncate = c"ftruncate" (fd: c_int, len: libc::off_t) -> c_int, failed -1
);
next_fn!(
    /// The next `fsync`.
    next_fsync = c"fsync" (fd: c_int) -> c_int, failed -1
);
next_fn!(
    /// The next `fdatasync`.
    next_fdatasync = c"fdatasync" (fd: c_int) -> c_int, failed -1
);

/// `mremap(2)`, as the system call (libc's `mremap` is variadic: its fifth
/// argument, `new_addr`, is read only with `MREMAP_FIXED`).
///
/// # Safety
/// The system call's contract: `old..old + old_len` is a mapping the caller
/// may move or resize, and nothing refers to it afterwards at its old place
/// if it moved.
pub unsafe fn next_mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller keeps mremap's contract; the raw system call sets
    // errno and returns -1 (MAP_FAILED) on failure.
    unsafe {
        libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
    }
}

/// What an interposer asks of a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdFacts {
    /// The file's device.
    pub dev: u64,
    /// The file's inode.
    pub ino: u64,
    /// Its size in bytes.
    pub size: u64,
    /// A regular file (not a pipe, socket or device).
    pub regular: bool,
    /// Opened for writing (`O_WRONLY` or `O_RDWR`).
    pub writable: bool,
    /// Opened with `O_APPEND`.
    pub append: bool,
}

/// The facts of descriptor `fd` (`fstat` and `fcntl(F_GETFL)`).
///
/// # Errors
/// The failed call (`EBADF` for a descriptor that is not open).
pub fn fd_facts(fd: c_int) -> Result<FdFacts, crate::SysError> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `struct stat` into memory we own.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(crate::SysError::last("fstat", 0, 0));
    }
    // SAFETY: fstat succeeded, so it filled the struct.
    let st = unsafe { st.assume_init() };
    // SAFETY: F_GETFL only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(crate::SysError::last("fcntl(F_GETFL)", 0, 0));
    }
    Ok(FdFacts {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        regular: st.st_mode & libc::S_IFMT == libc::S_IFREG,
        writable: flags & libc::O_ACCMODE != libc::O_RDONLY,
        append: flags & libc::O_APPEND != 0,
    })
}

/// The file position of `fd` (`lseek(fd, 0, SEEK_CUR)`).
///
/// # Errors
/// The failed call (`ESPIPE` for a pipe).
pub fn fd_position(fd: c_int) -> Result<u64, crate::SysError> {
    // SAFETY: lseek with SEEK_CUR and offset 0 only reads the position.
    let at = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
    if at < 0 {
        return Err(crate::SysError::last("lseek", 0, 0));
    }
    Ok(at as u64)
}

/// The path `fd` was opened by, as the kernel knows it now
/// (`/proc/self/fd/N`; a deleted file's ends in ` (deleted)`).
///
/// # Errors
/// The failed `readlink` (no `/proc`, a descriptor that is not open).
pub fn fd_path(fd: c_int) -> std::io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
}

/// A descriptor of the process's own for the file behind `fd`: a new open
/// file description (`/proc/self/fd/N`, close-on-exec), read-write if
/// `writable`. Its offset and flags are its own, never the program's.
///
/// # Errors
/// The `open(2)` error.
pub fn reopen_fd(fd: c_int, writable: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{fd}"))
}

/// Reads into `buf` the bytes of `file` from `offset` that the page cache
/// holds, without waiting for the device (`preadv2` with `RWF_NOWAIT`):
/// the count read (short, or `EAGAIN`, where the cache does not hold them).
///
/// # Errors
/// The failed call; `EAGAIN` when nothing of the range is cached.
pub fn read_cached(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: one iovec over `buf`, which we hold mutably for the call.
    let n = unsafe {
        libc::preadv2(
            file.as_raw_fd(),
            &iov,
            1,
            offset as libc::off_t,
            libc::RWF_NOWAIT,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Registers `child` to run in the child of every `fork()`, and `at_exit`
/// to run when the process exits normally (`exit()`, a return from
/// `main`).
///
/// # Errors
/// The failed registration (`ENOMEM`).
pub fn on_fork_and_exit(
    child: unsafe extern "C" fn(),
    at_exit: extern "C" fn(),
) -> Result<(), crate::SysError> {
    // SAFETY: registers a handler for the child side only; the handler is
    // a plain function that stays valid for the process's life (it lives
    // in a library that is never unloaded: a preloaded one).
    let rc = unsafe { libc::pthread_atfork(None, None, Some(child)) };
    if rc != 0 {
        return Err(crate::SysError {
            op: "pthread_atfork",
            addr: 0,
            len: 0,
            errno: rc,
        });
    }
    // SAFETY: as above, for exit.
    if unsafe { libc::atexit(at_exit) } != 0 {
        return Err(crate::SysError {
            op: "atexit",
            addr: 0,
            len: 0,
            errno: libc::ENOMEM,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn next_calls_reach_libc() {
        let mut f = tempfile_in_tmp();
        f.write_all(b"hello").expect("write");
        let fd = f.as_raw_fd();
        let mut buf = [0u8; 5];
        // SAFETY: a buffer of 5 bytes we own, an fd we hold open.
        let n = unsafe { next_pread(fd, buf.as_mut_ptr().cast(), 5, 0) };
        assert_eq!(n, 5);
        assert_eq!(&buf, b"hello");
        let facts = fd_facts(fd).expect("fstat");
        assert!(facts.regular && facts.writable && !facts.append);
        assert_eq!(facts.size, 5);
        assert_eq!(fd_position(fd).expect("lseek"), 5);
        // Just written: in the page cache.
        let mut cached = [0u8; 5];
        assert_eq!(read_cached(&f, &mut cached, 0).expect("cached"), 5);
        assert_eq!(&cached, b"hello");
        assert!(fd_facts(-1).is_err());
        // SAFETY: an anonymous mapping of one page, unmapped below.
        let p = unsafe {
            next_mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: grows the page we mapped; it may move, nothing refers to it.
        let q = unsafe { next_mremap(p, 4096, 8192, libc::MREMAP_MAYMOVE, std::ptr::null_mut()) };
        assert_ne!(q, libc::MAP_FAILED);
        // SAFETY: the mapping we made.
        assert_eq!(unsafe { next_munmap(q, 8192) }, 0);
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "faultline-sys-interpose-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("create");
        std::fs::remove_file(&path).expect("unlink");
        f
    }
}
