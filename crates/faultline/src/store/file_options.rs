//! How a file store is opened ([`FileOptions`]): the region's offset in
//! the file, whether it is written back, direct I/O, staged direct reads
//! and how long a short direct read is polled. Plain values, no locks.

#[cfg(doc)]
use super::{File, Store};
use std::time::Duration;

/// How a [`File`] store is opened: `FileOptions::new().offset(o).writable(true)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileOptions {
    /// Byte offset in the file of the region's first page. Default 0.
    pub offset: u64,
    /// Open read-write (write-back allowed); default read-only (map such a
    /// store with [`crate::Manager::map_read_only`]).
    pub writable: bool,
    /// Direct I/O (`O_DIRECT`) between the file and the frames: default on.
    /// See [`FileOptions::direct`].
    pub direct: bool,
    /// Long direct reads staged in a huge page: default on. See
    /// [`FileOptions::staged`].
    pub staged: bool,
    /// How long a thread waiting for a direct read polls for its
    /// completion before it sleeps: default 200 µs. See
    /// [`FileOptions::poll`].
    pub poll: Duration,
}

/// The default of [`FileOptions::poll`]: past nearly every 4 KiB direct
/// read of the project's machine (p99 ~110 µs).
const DEFAULT_POLL: Duration = Duration::from_micros(200);

impl Default for FileOptions {
    fn default() -> FileOptions {
        FileOptions {
            offset: 0,
            writable: false,
            direct: true,
            staged: true,
            poll: DEFAULT_POLL,
        }
    }
}

impl FileOptions {
    /// Offset 0, read-only, direct I/O.
    pub fn new() -> FileOptions {
        FileOptions::default()
    }

    /// Direct I/O (the default): a page is read from the device straight
    /// into its frame and written back from it, so the file's data is in
    /// memory once, in faultline's budget, and not a second time in the
    /// page cache (which counts against the program's memory cgroup). Where
    /// the file system has no `O_DIRECT`, or a transfer is not 4 KiB
    /// aligned (a region offset that is not a multiple of 4 KiB), the store
    /// uses buffered I/O instead; [`File::is_direct`] says which it got.
    /// Off (`false`): buffered I/O, with the kernel's own read-ahead started
    /// ahead of a sequential stream, and file pages cached by the kernel as
    /// well as by faultline.
    pub fn direct(mut self, direct: bool) -> FileOptions {
        self.direct = direct;
        self
    }

    /// Staged direct reads (the default): a direct read of 64 KiB to 1 MiB
    /// (a read-ahead run) lands in a 2 MiB huge page of the store's, made
    /// on first use, and is copied into the frames from there; other reads
    /// go straight into the frames. A disk that pays per scatter segment
    /// (virtio) reads a physically contiguous buffer about twice as fast as
    /// frames, which are scattered 4 KiB pages; the copy costs far less.
    /// The budget pays for the 2 MiB once it is made
    /// ([`Store::own_memory`]). Off (`false`): every direct read goes
    /// straight into the frames.
    pub fn staged(mut self, staged: bool) -> FileOptions {
        self.staged = staged;
        self
    }

    /// Polled direct reads: a thread waiting for a short direct read (up
    /// to 32 KiB: a fault's page; read-ahead runs sleep) submits it on its
    /// own `io_uring` and polls for the
    /// completion for up to `spin` before it sleeps, instead of sleeping in
    /// `pread` at once. On a virtual machine whose idle vCPUs halt, waking a
    /// sleeping reader costs tens of µs of the host's; polling keeps the
    /// vCPU running (random 4 KiB faults 7–36% faster measured on the
    /// project's machines where a CPU was to spare), and costs the CPU the
    /// poll burns: at most `spin` per read. Where the program's threads
    /// keep every CPU busy that CPU is worth more than the wake-up (2–18%
    /// slower measured), so a read polls only while the process's CPUs (the
    /// affinity mask of the thread that made the first polling store — for
    /// a reader pinned within it, as the workers are; else the reader's
    /// own — and the CPU quota) have had one to spare,
    /// and at most half the CPUs poll at once; other reads sleep in `pread`
    /// (docs/design.md, "Polled reads").
    /// `Duration::ZERO`: plain `pread`, sleeping, always. Buffered reads
    /// are never polled.
    pub fn poll(mut self, spin: Duration) -> FileOptions {
        self.poll = spin;
        self
    }

    /// Sets the byte offset of the region's first page in the file.
    pub fn offset(mut self, offset: u64) -> FileOptions {
        self.offset = offset;
        self
    }

    /// Opens read-write, so the region's writes go back to the file.
    pub fn writable(mut self, writable: bool) -> FileOptions {
        self.writable = writable;
        self
    }
}
