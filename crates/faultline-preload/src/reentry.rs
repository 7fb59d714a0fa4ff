//! The per-thread "inside faultline" flag. While a thread runs faultline's
//! code on an interposer's behalf, or a store's I/O (`program_file.rs`),
//! every interposed call it makes goes straight to libc: faultline's own
//! mappings, write-backs and reads are never taken for the program's.
//!
//! Invariant: the flag is set only by a live [`Inside`] guard. Locks: none.

use std::cell::Cell;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Holds this thread's flag set; clears it when dropped.
pub(crate) struct Inside(());

impl Inside {
    /// Sets the flag; `None` if it was set already (a nested call, which
    /// goes to libc) or the thread is exiting (its locals are gone).
    pub(crate) fn enter() -> Option<Inside> {
        INSIDE
            // `then`, not `then_some`: a guard made for a nested entry would
            // be dropped at once, and its drop would clear the outer flag.
            .try_with(|f| (!f.replace(true)).then(|| Inside(())))
            .ok()
            .flatten()
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|f| f.set(false));
    }
}

/// Runs `body` with the flag set (nested: it already was).
pub(crate) fn inside<T>(body: impl FnOnce() -> T) -> T {
    let _g = Inside::enter();
    body()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_entries_are_refused_and_the_flag_clears() {
        let g = Inside::enter().expect("first entry");
        assert!(Inside::enter().is_none());
        // The refused entry left the flag set.
        assert!(Inside::enter().is_none());
        inside(|| assert!(Inside::enter().is_none()));
        assert!(
            Inside::enter().is_none(),
            "a nested inside() cleared the flag"
        );
        drop(g);
        assert!(Inside::enter().is_some());
    }
}
