//! The device's own limit, for `bench out-of-core`: reads of the dataset
//! file with `O_DIRECT` (no page cache), measured in the same run so every
//! row can be read against what the device underneath can give.
//!
//! - random: 4 KiB `pread`s at random 4 KiB-aligned offsets of the whole
//!   file, queue depth = the bench's threads (one thread per queue slot,
//!   each synchronous); twice: sleeping in `pread`, and polled on each
//!   thread's `io_uring` as faultline's file store reads (`FileOptions::poll`);
//! - sequential: 1 MiB reads of consecutive chunks at queue depth 4 (4
//!   threads taking the next chunk in turn), one pass over the file.
//!
//! Each stops at its cap or a time limit, whichever comes first. Rates are
//! given in 4 KiB pages per second (comparable with the mmap rows' ops/s,
//! where an op is a touch of one 4 KiB page) and in MiB/s. A file system
//! without `O_DIRECT` (tmpfs) gives `EINVAL`: the rows are skipped with the
//! reason, not failed.

use crate::bench::{rng, RunClocks};
use anyhow::Context;
use std::alloc::Layout;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One device measurement.
pub struct DeviceRow {
    /// `random-read` or `seq-read`: the mmap pattern it bounds.
    pub pattern: &'static str,
    /// What was read, for the report.
    pub io: &'static str,
    pub queue_depth: usize,
    /// 4 KiB pages per second.
    pub pages_per_s: f64,
    pub mib_per_s: f64,
    /// The bench process's CPU time during the measurement (its reading
    /// threads', the kernel's work in their reads included) per 4 KiB page
    /// read, µs; `None` if the process's CPU clock could not be read or
    /// nothing was read.
    pub cpu_us_per_page: Option<f64>,
}

/// Queue depth of the sequential measurement.
const SEQ_DEPTH: usize = 4;
/// Bytes per sequential read.
const SEQ_CHUNK: usize = 1 << 20;

/// A zeroed heap buffer aligned to 4096 bytes (what `O_DIRECT` needs),
/// freed on drop.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> anyhow::Result<AlignedBuf> {
        let layout = Layout::from_size_align(len.max(1), 4096)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).context("allocating an aligned buffer")?;
        Ok(AlignedBuf { ptr, layout })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `layout.size()` initialized (zeroed) bytes
        // that this value owns alone; the borrow of `self` keeps it unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Whether an I/O error means "no `O_DIRECT` here".
fn unsupported(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(22) // EINVAL
}

/// `threads` threads each doing up to `ops` random 4 KiB reads, each read
/// polled for up to `spin` on the thread's `io_uring` (zero: a sleeping
/// `pread`); returns bytes read.
fn random_reads(
    f: &File,
    len: usize,
    threads: usize,
    ops: usize,
    secs: f64,
    spin: Duration,
) -> std::io::Result<usize> {
    let pages = (len / 4096) as u64;
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || -> std::io::Result<usize> {
                    let mut buf = AlignedBuf::new(4096).map_err(std::io::Error::other)?;
                    let mut next = rng(1000 + th as u64);
                    let mut done = 0;
                    while done < ops && (done % 64 != 0 || t.elapsed().as_secs_f64() < secs) {
                        let off = (next() % pages) * 4096;
                        let n =
                            faultline_sys::io::read_at(f.as_fd(), buf.as_mut_slice(), off, spin)?;
                        if n != 4096 {
                            return Err(std::io::ErrorKind::UnexpectedEof.into());
                        }
                        done += 1;
                    }
                    Ok(done * 4096)
                })
            })
            .collect();
        join_sum(hs)
    })
}

/// `SEQ_DEPTH` threads reading consecutive 1 MiB chunks, one pass over the
/// file at most; returns bytes read.
fn seq_reads(f: &File, len: usize, secs: f64) -> std::io::Result<usize> {
    let chunks = len / SEQ_CHUNK;
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..SEQ_DEPTH)
            .map(|_| {
                s.spawn(|| -> std::io::Result<usize> {
                    let mut buf = AlignedBuf::new(SEQ_CHUNK).map_err(std::io::Error::other)?;
                    let mut bytes = 0;
                    while t.elapsed().as_secs_f64() < secs {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c >= chunks {
                            break;
                        }
                        f.read_exact_at(buf.as_mut_slice(), (c * SEQ_CHUNK) as u64)?;
                        bytes += SEQ_CHUNK;
                    }
                    Ok(bytes)
                })
            })
            .collect();
        join_sum(hs)
    })
}

fn join_sum(
    hs: Vec<std::thread::ScopedJoinHandle<'_, std::io::Result<usize>>>,
) -> std::io::Result<usize> {
    let mut total = 0;
    for h in hs {
        total += h
            .join()
            .map_err(|_| std::io::Error::other("a device thread panicked"))??;
    }
    Ok(total)
}

fn row(
    pattern: &'static str,
    io: &'static str,
    qd: usize,
    bytes: usize,
    t: &RunClocks,
) -> DeviceRow {
    let secs = t.secs();
    let pages = bytes as f64 / 4096.0;
    DeviceRow {
        pattern,
        io,
        queue_depth: qd,
        pages_per_s: pages / secs,
        mib_per_s: bytes as f64 / f64::from(1 << 20) / secs,
        cpu_us_per_page: t.cpu_us_per(pages),
    }
}

/// Measures both rows on `file` (its page cache should be dropped first).
/// `Ok(Err(reason))`: the file system has no `O_DIRECT`, rows skipped.
pub fn measure(
    file: &Path,
    threads: usize,
    ops: usize,
    secs: f64,
) -> anyhow::Result<Result<Vec<DeviceRow>, String>> {
    let skip = |e: &std::io::Error| {
        format!(
            "device rows skipped: the file system of {} refuses O_DIRECT ({e})",
            file.display()
        )
    };
    let f = match faultline_sys::host::open_direct(file) {
        Ok(f) => f,
        Err(e) if unsupported(&e) => return Ok(Err(skip(&e))),
        Err(e) => return Err(e).context("opening the dataset with O_DIRECT"),
    };
    let len = f.metadata()?.len() as usize;
    let mut rows = Vec::new();
    // Sleeping reads, and reads polled as faultline's file store polls them
    // (`FileOptions::poll`'s default).
    for (io, spin) in [
        ("O_DIRECT pread 4 KiB", Duration::ZERO),
        (
            "O_DIRECT 4 KiB, polled",
            faultline::store::FileOptions::new().poll,
        ),
    ] {
        let t = RunClocks::start();
        match random_reads(&f, len, threads, ops, secs, spin) {
            Ok(b) => rows.push(row("random-read", io, threads, b, &t)),
            Err(e) if unsupported(&e) => return Ok(Err(skip(&e))),
            Err(e) => return Err(e).context("O_DIRECT random reads"),
        }
    }
    let t = RunClocks::start();
    let seq = seq_reads(&f, len, secs).context("O_DIRECT sequential reads")?;
    let seq = row("seq-read", "O_DIRECT read 1 MiB", SEQ_DEPTH, seq, &t);
    rows.push(seq);
    Ok(Ok(rows))
}
