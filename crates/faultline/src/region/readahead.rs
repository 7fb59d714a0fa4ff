//! A region's read-ahead: the sequential streams it remembers, and the
//! access pattern the program declared for it ([`AccessPattern`]:
//! `MapOptions::access`, `Region::advise`).
//!
//! `Normal` detects streams: a fault after a stream's last fault and within
//! its window continues it and doubles the window, up to the caller's
//! maximum. `Sequential` reads the maximum window from a stream's first
//! fault (what the kernel's `MADV_SEQUENTIAL` does to its read-ahead).
//! `Random` reads the faulting page alone, remembers no stream, and asks
//! the fault path to map no neighbours either (fault-around), as the
//! kernel's `MADV_RANDOM` turns its read-ahead and fault-around off.
//!
//! Locks: `streams` is a leaf mutex, taken only on faults of store-backed
//! 4 KiB regions. The pattern is a `Relaxed` atomic: a hint read once per
//! fault, ordering nothing else (a fault racing `advise` may use either).

use crate::config::AccessPattern;
use std::sync::atomic::{AtomicU8, Ordering};

/// Streams a region remembers at least.
const MIN_STREAMS: usize = 4;

/// The read-ahead state of one region.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    /// `(last faulting page, window)`, most recently continued first, so
    /// that threads each reading sequentially are each recognized — as
    /// many as [`crate::Config::readahead_streams`] (a table smaller than
    /// the streams forgets every one before its next fault: 8 readers
    /// over 4 slots got no read-ahead at all).
    streams: parking_lot::Mutex<Vec<(usize, usize)>>,
    /// The declared [`AccessPattern`], as its `u8`.
    pattern: AtomicU8,
}

impl ReadAhead {
    /// Remembers `n` streams (at least [`MIN_STREAMS`]), `pattern` declared.
    pub(crate) fn new(n: usize, pattern: AccessPattern) -> ReadAhead {
        ReadAhead {
            streams: parking_lot::Mutex::new(vec![(usize::MAX, 1); n.max(MIN_STREAMS)]),
            pattern: AtomicU8::new(pattern as u8),
        }
    }

    /// The declared access pattern.
    pub(crate) fn pattern(&self) -> AccessPattern {
        AccessPattern::from_u8(self.pattern.load(Ordering::Relaxed))
    }

    /// Declares `pattern` (the streams remembered so far are kept).
    pub(crate) fn set_pattern(&self, pattern: AccessPattern) {
        self.pattern.store(pattern as u8, Ordering::Relaxed);
    }

    /// Notes a fault on `page` and returns the read-ahead window for it (1:
    /// none), at most `max`: see the module docs for each pattern. Any
    /// fault that continues no stream starts one in the least recently
    /// continued slot. (A stream remembers the fault's page, not the
    /// window's end: a run shorter than the window — few free frames —
    /// still leads to a fault that continues it.) A window mapped ahead
    /// (`ahead`) only continues a stream: one served late, after the
    /// program's own fault got there first, must not start a stream, or
    /// its slot would push out a live one, whose next fault would start
    /// again from one page.
    pub(crate) fn window(&self, page: usize, max: usize, ahead: bool) -> usize {
        let pattern = self.pattern();
        if pattern == AccessPattern::Random {
            return 1;
        }
        let max = max.max(1);
        let first = if pattern == AccessPattern::Sequential {
            max
        } else {
            1
        };
        let mut streams = self.streams.lock();
        let hit = streams.iter().position(|&(last, win)| {
            last != usize::MAX && page > last && page <= last.saturating_add(win)
        });
        match hit {
            Some(i) => {
                let win = (streams[i].1 * 2).clamp(4.min(max), max).max(first);
                // Most recently continued first.
                streams[..=i].rotate_right(1);
                streams[0] = (page, win);
                win
            }
            None if ahead => 1,
            None => {
                streams.rotate_right(1);
                streams[0] = (page, first);
                first
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The windows of the last of 6 round-robin steps of `streams`
    /// readers, each at its own offset.
    fn windows(ra: &ReadAhead, streams: usize) -> Vec<usize> {
        let mut last = Vec::new();
        for step in 0..6 {
            last = (0..streams)
                .map(|s| ra.window(s * 1_000_000 + step, 256, false))
                .collect();
        }
        last
    }

    #[test]
    fn every_stream_of_a_table_as_large_keeps_its_read_ahead() {
        let ra = ReadAhead::new(1, AccessPattern::Normal);
        assert!(
            windows(&ra, 8).iter().all(|&w| w == 1),
            "4 slots forget 8 streams"
        );
        let ra = ReadAhead::new(8, AccessPattern::Normal);
        let w = windows(&ra, 8);
        assert!(w.iter().all(|&w| w > 1), "8 slots keep 8 streams: {w:?}");
    }

    #[test]
    fn each_pattern_sets_the_window() {
        let walk = |pattern| {
            let ra = ReadAhead::new(4, pattern);
            (0..5).map(|p| ra.window(p, 256, false)).collect::<Vec<_>>()
        };
        assert_eq!(walk(AccessPattern::Normal), [1, 4, 8, 16, 32]);
        assert_eq!(walk(AccessPattern::Sequential), [256; 5]);
        assert_eq!(walk(AccessPattern::Random), [1; 5]);
        let ra = ReadAhead::new(4, AccessPattern::Random);
        ra.set_pattern(AccessPattern::Normal);
        assert_eq!(ra.window(10, 256, false), 1);
        assert_eq!(
            ra.window(11, 256, false),
            4,
            "declared normal: streams again"
        );
        assert_eq!(ra.window(12, 2, false), 2, "never past the maximum");
    }
}
