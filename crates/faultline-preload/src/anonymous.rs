//! Anonymous mappings served by faultline (`FAULTLINE_ANON_MIN`): a
//! private anonymous `mmap` of at least that many bytes, readable and
//! writable, becomes a region over zeros whose evicted pages go to a store
//! — an overlay file on disk (`private_file.rs` over no file: swap of the
//! mapping's own), or a Redis server (`FAULTLINE_STORE=redis://…`: far
//! memory for a program that never heard of it).
//!
//! Left to the kernel: shared anonymous mappings (they are shared with
//! children of `fork()`), `MAP_FIXED`, `MAP_STACK`/`MAP_GROWSDOWN`,
//! reservations (`PROT_NONE`), and any mapping made by one of faultline's
//! own threads.
//!
//! The store outlives a region: `mremap` growing the mapping closes the
//! old region into it and maps the new one over it. Unmapping drops the
//! store's copy (the overlay's pages; the Redis keys, deleted), as does
//! the process's exit for Redis. Locks: none of its own.

use crate::config::AnonStore;
use crate::private_file::{PrivateBacking, PrivateFile};
use faultline::store::{Redis, RedisOptions};
use faultline::Store;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where an anonymous mapping's evicted pages go.
#[derive(Debug, Clone)]
pub(crate) enum AnonKind {
    /// An overlay file of its own.
    Overlay(Arc<PrivateBacking>),
    /// A Redis server, under a key prefix of the mapping's own.
    Redis { url: String, prefix: String },
}

/// Whether a private anonymous `mmap` with these arguments may be served.
pub(crate) fn eligible(len: usize, prot: i32, flags: i32, min: usize) -> bool {
    // The mapping type is a field of its own (MAP_SHARED_VALIDATE is 3).
    let private = flags & 0x0f == libc::MAP_PRIVATE;
    let refused =
        libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_STACK | libc::MAP_GROWSDOWN;
    len >= min
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && private
        && flags & refused == 0
        && !std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("faultline"))
}

impl AnonKind {
    /// The store for a new mapping of `pages` pages.
    pub(crate) fn new(store: &AnonStore, pages: usize) -> Result<AnonKind, String> {
        match store {
            AnonStore::Overlay => PrivateBacking::new(pages)
                .map(|b| AnonKind::Overlay(Arc::new(b)))
                .map_err(|e| format!("no overlay file (FAULTLINE_PRIVATE_DIR): {e}")),
            AnonStore::Redis(url) => {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                // Relaxed: a counter for unique names only.
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                Ok(AnonKind::Redis {
                    url: url.clone(),
                    prefix: format!(
                        "faultline-preload:{}:{}:{n}",
                        std::process::id(),
                        faultline_sys::host::process_start_time(std::process::id()).unwrap_or(0)
                    ),
                })
            }
        }
    }

    /// The same store with room for `pages` pages (a grown mapping).
    pub(crate) fn with_room(&self, pages: usize) -> Result<AnonKind, String> {
        match self {
            AnonKind::Overlay(b) => b
                .with_room(pages)
                .map(AnonKind::Overlay)
                .map_err(|e| e.to_string()),
            AnonKind::Redis { .. } => Ok(self.clone()),
        }
    }

    /// A store over it for a region.
    pub(crate) fn store(&self) -> Result<Arc<dyn Store>, String> {
        match self {
            AnonKind::Overlay(b) => Ok(Arc::new(PrivateFile::new(None, b.clone()))),
            AnonKind::Redis { url, prefix } => crate::reentry::inside(|| {
                Redis::connect(url, RedisOptions::new(prefix.clone()))
                    .map(|r| Arc::new(r) as Arc<dyn Store>)
                    .map_err(|e| format!("{url}: {e}"))
            }),
        }
    }

    /// Whether the store keeps pages outside this process (Redis keys,
    /// which must be deleted when the mapping goes).
    pub(crate) fn remote(&self) -> bool {
        matches!(self, AnonKind::Redis { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_large_private_read_write_mappings_are_eligible() {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        assert!(eligible(64 << 20, rw, anon, 1 << 20));
        assert!(eligible(64 << 20, rw, anon | libc::MAP_NORESERVE, 1 << 20));
        assert!(!eligible(512 << 10, rw, anon, 1 << 20), "below the minimum");
        assert!(
            !eligible(64 << 20, libc::PROT_NONE, anon, 1 << 20),
            "a reservation"
        );
        let shared = libc::MAP_SHARED | libc::MAP_ANONYMOUS;
        assert!(
            !eligible(64 << 20, rw, shared, 1 << 20),
            "shared with children"
        );
        let validate = libc::MAP_SHARED_VALIDATE | libc::MAP_ANONYMOUS;
        assert!(!eligible(64 << 20, rw, validate, 1 << 20));
        assert!(!eligible(64 << 20, rw, anon | libc::MAP_FIXED, 1 << 20));
        assert!(!eligible(64 << 20, rw, anon | libc::MAP_STACK, 1 << 20));
    }
}
