//! [`Features`]: a set of `UFFD_FEATURE_*` bits, as requested from and
//! reported by the `UFFDIO_API` handshake, with their names for messages.
//!
//! Plain data (a `u64` of bits exactly as the kernel spells them); no system
//! calls, no locks.

/// A set of `UFFD_FEATURE_*` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features(pub u64);

impl Features {
    /// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`.
    pub const PAGEFAULT_FLAG_WP: Features = Features(1 << 0);
    /// `UFFD_FEATURE_THREAD_ID`: events carry the faulting thread's id.
    pub const THREAD_ID: Features = Features(1 << 8);
    /// `UFFD_FEATURE_WP_UNPOPULATED`.
    pub const WP_UNPOPULATED: Features = Features(1 << 13);
    /// `UFFD_FEATURE_SIGBUS`: a missing-page fault raises SIGBUS in the
    /// faulting thread instead of queueing an event (`signal.rs`).
    pub const SIGBUS: Features = Features(1 << 7);
    /// `UFFD_FEATURE_POISON`: `UFFDIO_POISON` (SIGBUS for one page).
    pub const POISON: Features = Features(1 << 14);
    /// `UFFD_FEATURE_WP_ASYNC`: the kernel resolves WP faults itself.
    pub const WP_ASYNC: Features = Features(1 << 15);
    /// `UFFD_FEATURE_MOVE`: `UFFDIO_MOVE` (Linux 6.8).
    pub const MOVE: Features = Features(1 << 16);
    /// `UFFD_EVENT_UNMAP`: an unmap of a registered range (`munmap`, `mremap`
    /// away, `mmap(MAP_FIXED)` over it) is reported, and the unmapping
    /// thread waits until the event is read.
    pub const EVENT_UNMAP: Features = Features(1 << 6);
    /// `UFFD_EVENT_REMOVE`: `MADV_DONTNEED` / `MADV_FREE` on a registered
    /// range is reported before the pages go, and the calling thread waits
    /// until the event is read.
    pub const EVENT_REMOVE: Features = Features(1 << 3);

    const NAMES: [(u64, &'static str); 17] = [
        (1 << 0, "PAGEFAULT_FLAG_WP"),
        (1 << 1, "EVENT_FORK"),
        (1 << 2, "EVENT_REMAP"),
        (1 << 3, "EVENT_REMOVE"),
        (1 << 4, "MISSING_HUGETLBFS"),
        (1 << 5, "MISSING_SHMEM"),
        (1 << 6, "EVENT_UNMAP"),
        (1 << 7, "SIGBUS"),
        (1 << 8, "THREAD_ID"),
        (1 << 9, "MINOR_HUGETLBFS"),
        (1 << 10, "MINOR_SHMEM"),
        (1 << 11, "EXACT_ADDRESS"),
        (1 << 12, "WP_HUGETLBFS_SHMEM"),
        (1 << 13, "WP_UNPOPULATED"),
        (1 << 14, "POISON"),
        (1 << 15, "WP_ASYNC"),
        (1 << 16, "MOVE"),
    ];

    /// Whether every bit of `other` is in `self`.
    pub fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    pub fn with(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }

    /// The bits of `self` not in `other`.
    pub fn without(self, other: Features) -> Features {
        Features(self.0 & !other.0)
    }

    /// Names of the bits set, e.g. `["MOVE", "POISON"]`.
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(bit, _)| self.0 & bit != 0)
            .map(|&(_, n)| n)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_names() {
        let f = Features::MOVE.with(Features::POISON);
        assert_eq!(f.names(), vec!["POISON", "MOVE"]);
        assert!(f.contains(Features::MOVE));
        assert_eq!(f.without(Features::MOVE), Features::POISON);
    }
}
