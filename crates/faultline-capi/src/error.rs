//! Errors across the C boundary: each entry point runs its body in
//! [`guard`], which turns an `Err` (and a caught panic) into the entry
//! point's failure value, stores the cause as text in a thread-local slot
//! that `fl_last_error` returns, and sets `errno` to the error (as libc
//! does: a constructor's NULL says only that it failed, `errno` says why).
//!
//! Invariant: no panic unwinds out of an `extern "C"` function of this
//! crate. Locks: none (the slot is per thread).

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// A failed call: the negative errno it returns, and its cause.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) errno: i32,
    pub(crate) message: String,
}

impl Failure {
    /// A failure with `errno` (positive) and `cause`'s text.
    pub(crate) fn new(errno: i32, cause: impl std::fmt::Display) -> Failure {
        Failure {
            errno,
            message: cause.to_string(),
        }
    }

    /// `EINVAL`, naming the bad argument.
    pub(crate) fn invalid(what: impl std::fmt::Display) -> Failure {
        Failure::new(libc::EINVAL, what)
    }
}

fn set_last(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = text);
}

/// Sets this thread's `errno`.
fn set_errno(errno: i32) {
    // SAFETY: __errno_location returns a valid pointer to the calling
    // thread's errno, which lives as long as the thread.
    unsafe { *libc::__errno_location() = errno };
}

/// Runs `body`; on `Err` or a panic, records the cause, sets `errno` and
/// returns `on_error(errno)`. Clears the last error on success (`errno` is
/// left alone then, as libc leaves it).
pub(crate) fn guard<T>(
    on_error: impl FnOnce(i32) -> T,
    body: impl FnOnce() -> Result<T, Failure>,
) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => {
            set_last("");
            v
        }
        Ok(Err(f)) => {
            set_last(&f.message);
            set_errno(f.errno);
            on_error(f.errno)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            set_last(&format!(
                "internal error (a faultline bug): panicked: {what}"
            ));
            set_errno(libc::EFAULT);
            on_error(libc::EFAULT)
        }
    }
}

/// [`guard`] for calls returning a status: 0, or the negative errno.
pub(crate) fn status(body: impl FnOnce() -> Result<(), Failure>) -> i32 {
    guard(|e| -e, || body().map(|()| 0))
}

/// The cause of this thread's last failed `fl_*` call, as text (empty if
/// the last call succeeded). The pointer is valid until this thread's next
/// `fl_*` call; never NULL.
#[no_mangle]
pub extern "C" fn fl_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: fl_last_error returns a valid NUL-terminated string that
        // lives until this thread's next fl_* call.
        unsafe { CStr::from_ptr(fl_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn errors_and_panics_become_codes_and_text() {
        let errno = || std::io::Error::last_os_error().raw_os_error();
        assert_eq!(status(|| Err(Failure::invalid("len is 0"))), -libc::EINVAL);
        assert_eq!(last(), "len is 0");
        assert_eq!(errno(), Some(libc::EINVAL));
        assert_eq!(status(|| panic!("boom")), -libc::EFAULT);
        assert!(last().contains("boom"), "{}", last());
        assert_eq!(errno(), Some(libc::EFAULT));
        let null: *mut u8 = guard(
            |_| std::ptr::null_mut(),
            || Err(Failure::new(libc::ENOMEM, "no memory")),
        );
        assert!(null.is_null());
        assert_eq!(errno(), Some(libc::ENOMEM));
        assert_eq!(status(|| Ok(())), 0);
        assert_eq!(last(), "");
    }
}
