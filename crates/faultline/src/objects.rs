//! The named objects (files) a manager's regions map, and the rule that a
//! range of one may be mapped by one writable region or by any number of
//! read-only ones: within the manager here ([`MapError::Overlaps`]); for
//! files also in the whole process and against other processes, through
//! `exclusive.rs` ([`MapError::FileInUse`]).
//!
//! Locks: `uses`, taken at map and teardown; under it only the
//! process-wide registry of file ranges (`exclusive.rs`, a leaf) is taken.

use crate::error::MapError;
use crate::store::Store;
use parking_lot::Mutex;

/// The object ranges mapped by live regions of one manager.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    uses: Mutex<Vec<ObjectUse>>,
}

impl Objects {
    /// Records that region `id` (of manager number `manager`) maps `len`
    /// bytes of `store`'s object, if it names one; refuses an overlap with
    /// another region's range of the same object when either may write
    /// ([`MapError::Overlaps`]). If the object is a file
    /// ([`Store::file`]), also claims its range in the whole process and
    /// locks it against other processes ([`MapError::FileInUse`],
    /// `exclusive.rs`). Returns whether a use was recorded.
    pub(crate) fn claim(
        &self,
        id: u64,
        store: &dyn Store,
        len: usize,
        manager: u32,
    ) -> Result<bool, MapError> {
        let Some((object, start)) = store.identity() else {
            return Ok(false);
        };
        // Object offsets are `off_t`: past `i64::MAX` every read fails.
        let end = match start.checked_add(len as u64) {
            Some(end) if end <= i64::MAX as u64 => end,
            _ => return Err(MapError::OffsetOverflow { offset: start, len }),
        };
        let writable = store.writable();
        let mut uses = self.uses.lock();
        if let Some(u) = uses.iter().find(|u| {
            u.object == object && u.start < end && start < u.end && (u.writable || writable)
        }) {
            return Err(MapError::Overlaps {
                start,
                end,
                other_start: u.start,
                other_end: u.end,
            });
        }
        let file = match store.file() {
            Some(f) => Some(crate::exclusive::claim(f, start, end, writable, manager)?),
            None => None,
        };
        uses.push(ObjectUse {
            region: id,
            object,
            start,
            end,
            writable,
            file,
        });
        Ok(true)
    }

    /// Forgets region `id`'s object range ([`Objects::claim`]), and
    /// lets its file range go (unlocked, out of the process's registry).
    pub(crate) fn release(&self, id: u64) {
        // Under `objects` (the order `claim` takes them in), so a map
        // of this manager never finds the range free here but still held in
        // the process.
        self.uses.lock().retain(|u| u.region != id);
    }

    /// Records region `id`'s address in its file claim, if it has one (for
    /// errors that name it: [`crate::FileHolder::Region`]).
    pub(crate) fn mapped(&self, id: u64, addr: usize) {
        let uses = self.uses.lock();
        if let Some(claim) = uses
            .iter()
            .find(|u| u.region == id)
            .and_then(|u| u.file.as_ref())
        {
            claim.mapped_at(addr);
        }
    }
}

/// One region's use of a named object (a file): `(region id, object,
/// byte range, writable)`, and for a file its claim in the process and its
/// lock (dropped with the use); see [`MapError::Overlaps`],
/// [`MapError::FileInUse`].
#[derive(Debug)]
struct ObjectUse {
    region: u64,
    object: u64,
    start: u64,
    end: u64,
    writable: bool,
    file: Option<crate::exclusive::FileClaim>,
}
