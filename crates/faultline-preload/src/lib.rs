//! `libfaultline_preload.so`: runs an unmodified, dynamically linked
//! program on faultline. Preloaded (`LD_PRELOAD`), it defines `mmap` and
//! its companions in place of libc's; a mapping of a file whose path
//! matches `FAULTLINE_FILES` becomes a faultline region over that file
//! range, paged through faultline's own frames under `FAULTLINE_BUDGET`,
//! and everything else goes to libc untouched:
//!
//! ```sh
//! FAULTLINE_BUDGET=64M FAULTLINE_FILES='/data/*.db' \
//!   LD_PRELOAD=target/release/libfaultline_preload.so sqlite3 /data/big.db
//! ```
//!
//! The parts, each owning one rule:
//! - `config.rs`: the settings, read once from the environment;
//! - `symbols.rs`: the C symbols — thin gates that send every call that
//!   cannot concern a served mapping straight to libc;
//! - `mappings.rs`: the served mappings and the process's manager, and
//!   what `munmap`, `mremap`, `msync`, `madvise`, `mprotect` do to them;
//! - `coherence.rs`: `write`/`read`/`ftruncate`/`fsync` through a
//!   descriptor kept coherent with the mappings of the same file;
//! - `program_file.rs`: the store (faultline's file store, cut at the end
//!   of the file as the kernel's mapping is);
//! - `anonymous.rs`: large private anonymous mappings (`FAULTLINE_ANON_MIN`)
//!   over zeros, paged to an overlay file or a Redis server;
//! - `private_file.rs`: a private writable mapping's store (the file under
//!   an overlay of the process's own versions of its pages);
//! - `reentry.rs`: the per-thread flag that sends faultline's own calls to
//!   libc;
//! - `exit.rs`: write-back and the report at exit; the child of a fork.
//!
//! Only the library drives faultline here; the raw calls (the next
//! definitions of libc's functions, descriptor facts) are in
//! `faultline_sys::interpose`.

mod anonymous;
mod coherence;
mod config;
mod exit;
mod mappings;
mod private_file;
mod program_file;
mod reentry;
mod symbols;
