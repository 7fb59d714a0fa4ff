//! The mappings faultline serves for the program, and the process-wide
//! manager that serves them (started by the first mapping it serves).
//!
//! A served mapping is one faultline region over a file range: read-only
//! (`PROT_READ`, shared or private), writable and shared (`MAP_SHARED`
//! with `PROT_WRITE`: written back), or writable and private (`MAP_PRIVATE`
//! with `PROT_WRITE`: the program's versions of pages go to an overlay of
//! its own, never to the file: `private_file.rs`; no coherence with the
//! program's writes to the file, which POSIX leaves unspecified for a
//! private mapping). The program's `munmap`, `mremap`,
//! `msync`, `madvise` and `mprotect` on it are carried out here with the
//! kernel's meaning where faultline can give it, and refused with the
//! kernel's errno where it cannot (each refusal said once on stderr):
//!
//! - `munmap` of a whole mapping writes it back and closes the region; of a
//!   part, writes the region back and drops that part's pages, and the part
//!   stays reserved (touching it reads the file again) until the whole
//!   mapping is unmapped.
//! - `mremap` shrinks in place (the tail as with `munmap`), grows only with
//!   `MREMAP_MAYMOVE` (a new region over the longer range; the old one is
//!   written back and closed), and refuses `MREMAP_FIXED`/`DONTUNMAP`.
//! - `msync` writes back; `madvise(WILLNEED)` maps pages now, `DONTNEED`
//!   drops a read-only mapping's pages (a writable one keeps them, as the
//!   page cache keeps a shared mapping's data), `REMOVE` punches a hole;
//!   other advice is a hint faultline does not need (its read-ahead finds
//!   walks itself) and is accepted.
//! - `mprotect` is accepted without effect when it asks for no more than
//!   the mapping has; asking for write on a read-only one is `EACCES`.
//!
//! Invariant: every region in the table is mapped and registered; a
//! mapping leaves the table before it is closed, and goes back if closing
//! fails (its write-back failed: nothing is lost). Locks: the table's
//! `RwLock`, held only to look up, insert or remove — never while faultline
//! works (a fault worker may call `munmap`, which looks the table up);
//! each mapping's `gone` mutex, a leaf.

use crate::anonymous::AnonKind;
use crate::config::settings;
use crate::private_file::{PrivateBacking, PrivateFile};
use crate::program_file::ProgramFile;
use faultline::{
    AccessPattern, Discard, FaultError, Manager, MapOptions, ReadOnly, Region, StoreError,
};
use faultline_sys::interpose::{self, FdFacts};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// faultline's page: every served mapping uses 4 KiB pages (a file offset
/// must be a multiple of the page, as the kernel's mmap asks).
pub(crate) const PAGE: usize = 4096;

/// `len` rounded up to whole pages.
pub(crate) fn pages_of(len: usize) -> usize {
    len.div_ceil(PAGE) * PAGE
}

/// A region, writable or not.
pub(crate) enum Mapped {
    /// Shared and writable: written back to the file.
    Rw(Region),
    /// Read-only.
    Ro(Region<ReadOnly>),
}

/// One served mapping.
pub(crate) struct Served {
    pub(crate) region: Mapped,
    /// The file's device and inode.
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// The file offset of the region's first byte.
    pub(crate) offset: u64,
    /// A description of the file of the preload's own (for remapping);
    /// `None` for an anonymous mapping.
    file: Option<std::fs::File>,
    pub(crate) path: PathBuf,
    /// Address ranges the program unmapped (`munmap` of a part).
    gone: Mutex<Vec<Range<usize>>>,
    /// The store's flag: the program wrote the file with `write(2)`.
    program_writes: Arc<AtomicBool>,
    /// A private writable mapping's overlay (`private_file.rs`); `None`
    /// for a shared or read-only one.
    private: Option<Arc<PrivateBacking>>,
    /// An anonymous mapping's store (`anonymous.rs`).
    anon: Option<AnonKind>,
}

impl Served {
    pub(crate) fn addr(&self) -> usize {
        match &self.region {
            Mapped::Rw(r) => r.addr(),
            Mapped::Ro(r) => r.addr(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match &self.region {
            Mapped::Rw(r) => r.len(),
            Mapped::Ro(r) => r.len(),
        }
    }

    pub(crate) fn range(&self) -> Range<usize> {
        self.addr()..self.addr() + self.len()
    }

    /// Shared and writable: its writes go to the file.
    pub(crate) fn writable(&self) -> bool {
        matches!(self.region, Mapped::Rw(_)) && self.private.is_none()
    }

    /// Private and writable (a file's, or anonymous): its writes stay the
    /// process's.
    pub(crate) fn private(&self) -> bool {
        self.private.is_some() || self.anon.is_some()
    }

    /// Drops what the store keeps of the mapping outside this process (an
    /// anonymous mapping's Redis keys): when it goes, and at exit.
    pub(crate) fn release_store(&self) {
        if self.anon.as_ref().is_some_and(AnonKind::remote) {
            if let Err(e) = self.discard(0..self.len(), Discard::Zero) {
                eprintln!(
                    "faultline-preload: {}: cannot delete its pages from the store: {e}",
                    self.path.display()
                );
            }
        }
    }

    /// The file bytes the region holds.
    pub(crate) fn file_range(&self) -> Range<u64> {
        self.offset..self.offset + self.len() as u64
    }

    /// Writes every dirty page back and makes the file durable.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        match &self.region {
            Mapped::Rw(r) if self.writable() => r.flush(),
            _ => Ok(()),
        }
    }

    /// Writes the dirty pages of region bytes `range` back (not durable).
    pub(crate) fn write_back(&self, range: Range<usize>) -> Result<(), StoreError> {
        match &self.region {
            Mapped::Rw(r) if self.writable() => {
                r.write_back(range.start..range.end.min(self.len()))
            }
            _ => Ok(()),
        }
    }

    /// Writes the dirty pages of region bytes `range` back and makes the
    /// file durable (`msync`).
    fn sync(&self, range: Range<usize>) -> Result<(), StoreError> {
        if !self.writable() {
            return Ok(());
        }
        self.write_back(range)?;
        let Some(file) = &self.file else {
            return Ok(());
        };
        file.sync_data().map_err(|e| StoreError::Io {
            op: "flush",
            page: 0,
            source: e,
        })
    }

    /// Region bytes `range` widened to whole pages, inside the region.
    fn whole_pages(&self, range: Range<usize>) -> Range<usize> {
        range.start / PAGE * PAGE..pages_of(range.end).min(self.len())
    }

    /// Drops the pages of region bytes `range` (offsets, widened to whole
    /// pages), as `how` says.
    pub(crate) fn discard(&self, range: Range<usize>, how: Discard) -> Result<usize, FaultError> {
        let r = self.whole_pages(range);
        if r.is_empty() {
            return Ok(0);
        }
        match &self.region {
            Mapped::Rw(reg) => reg.discard(r, how),
            Mapped::Ro(reg) => reg.discard(r, how),
        }
    }

    /// Drops the pages of region bytes `range` because another writer
    /// changed the file (`Discard::StoreChanged`), and maps again at once
    /// those that were resident: the program was using them, and reading
    /// them now (from the page cache its write just filled) is cheaper
    /// than its next fault.
    pub(crate) fn refresh(&self, range: Range<usize>) {
        let r = self.whole_pages(range);
        let resident: Vec<usize> = r
            .clone()
            .step_by(PAGE)
            .filter(|&at| self.is_resident(at))
            .collect();
        let _ = self.discard(r, Discard::StoreChanged);
        for at in resident {
            let _ = self.prefetch(at..at + PAGE);
        }
    }

    fn is_resident(&self, offset: usize) -> bool {
        let at = self.addr() + offset;
        match &self.region {
            Mapped::Rw(r) => r.is_resident(at),
            Mapped::Ro(r) => r.is_resident(at),
        }
        .unwrap_or(false)
    }

    /// Declares the whole mapping's access pattern (`MADV_RANDOM`,
    /// `MADV_SEQUENTIAL`, `MADV_NORMAL`): a region keeps one, where the
    /// kernel would split the mapping at the advised range.
    pub(crate) fn advise(&self, pattern: AccessPattern) {
        match &self.region {
            Mapped::Rw(r) => r.advise(pattern),
            Mapped::Ro(r) => r.advise(pattern),
        }
    }

    pub(crate) fn prefetch(&self, range: Range<usize>) -> Result<usize, FaultError> {
        match &self.region {
            Mapped::Rw(r) => r.prefetch(range),
            Mapped::Ro(r) => r.prefetch(range),
        }
    }

    fn close(self) -> Result<(), Box<(Served, StoreError)>> {
        let Served {
            region,
            dev,
            ino,
            offset,
            file,
            path,
            gone,
            program_writes,
            private,
            anon,
        } = self;
        let back = |region| Served {
            region,
            dev,
            ino,
            offset,
            file,
            path,
            gone,
            program_writes,
            private,
            anon,
        };
        match region {
            Mapped::Rw(r) => r
                .close()
                .map_err(|(r, e)| Box::new((back(Mapped::Rw(r)), e))),
            Mapped::Ro(r) => r
                .close()
                .map_err(|(r, e)| Box::new((back(Mapped::Ro(r)), e))),
        }
    }

    /// Notes that the program writes the file with `write(2)` and its kind.
    pub(crate) fn program_writes(&self) {
        // Relaxed: a hint to the store (see `ProgramFile`).
        self.program_writes.store(true, Ordering::Relaxed);
    }

    /// Whether every byte of the region was unmapped by the program.
    fn all_gone(&self, gone: &[Range<usize>]) -> bool {
        let mut covered = 0;
        let mut sorted = gone.to_vec();
        sorted.sort_by_key(|r| r.start);
        let mut end = self.addr();
        for r in sorted {
            let start = r.start.max(end);
            if r.end > start {
                covered += r.end - start;
                end = r.end;
            }
        }
        covered >= self.len()
    }
}

/// The served mappings, by start address.
static TABLE: RwLock<BTreeMap<usize, Arc<Served>>> = RwLock::new(BTreeMap::new());
/// How many are in the table: the interposers' fast path.
static SERVED: AtomicUsize = AtomicUsize::new(0);
/// How many of them are writable.
static WRITABLE: AtomicUsize = AtomicUsize::new(0);
/// Mappings served since the start (the exit report).
pub(crate) static SERVED_EVER: AtomicUsize = AtomicUsize::new(0);
/// Set in the child of a `fork()` and once the process is exiting: from
/// then on every call goes to libc.
pub(crate) static OFF: AtomicBool = AtomicBool::new(false);

/// Whether any mapping is served now (Relaxed: a mapping being made on
/// another thread is not the program's to use until its mmap returns, and
/// the table itself is read under its lock).
pub(crate) fn any() -> bool {
    SERVED.load(Ordering::Relaxed) > 0 && !OFF.load(Ordering::Relaxed)
}

/// Whether any writable mapping is served now (Relaxed, as [`any`]).
pub(crate) fn any_writable() -> bool {
    WRITABLE.load(Ordering::Relaxed) > 0 && !OFF.load(Ordering::Relaxed)
}

/// The served mappings overlapping addresses `range`.
pub(crate) fn overlapping(range: &Range<usize>) -> Vec<Arc<Served>> {
    let t = TABLE.read();
    let before = t.range(..range.start).next_back().map(|(_, s)| s);
    before
        .into_iter()
        .chain(t.range(range.start..range.end).map(|(_, s)| s))
        .filter(|s| s.range().start < range.end && range.start < s.range().end)
        .cloned()
        .collect()
}

/// The served mappings of the file `facts` describes.
pub(crate) fn of_file(facts: &FdFacts) -> Vec<Arc<Served>> {
    TABLE
        .read()
        .values()
        .filter(|s| s.dev == facts.dev && s.ino == facts.ino && !s.private())
        .cloned()
        .collect()
}

/// Every served mapping (the exit handler's write-back).
pub(crate) fn all() -> Vec<Arc<Served>> {
    TABLE.read().values().cloned().collect()
}

fn insert(s: Served) -> Arc<Served> {
    let s = Arc::new(s);
    let writable = s.writable();
    TABLE.write().insert(s.addr(), s.clone());
    SERVED.fetch_add(1, Ordering::Relaxed);
    if writable {
        WRITABLE.fetch_add(1, Ordering::Relaxed);
    }
    SERVED_EVER.fetch_add(1, Ordering::Relaxed);
    s
}

/// How a mapping is closed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// The program unmapped it: a private mapping's pages are dropped
    /// unwritten (and its store's copy with them).
    Unmapped,
    /// It is being remapped: every page goes to its store first.
    Remapped,
}

/// Takes `s` out of the table and closes it (written back, unmapped);
/// `EIO` if the write-back failed (the mapping stays, nothing lost).
fn close(s: Arc<Served>, how: Closing) -> Result<(), c_int> {
    {
        let mut t = TABLE.write();
        match t.get(&s.addr()) {
            Some(cur) if Arc::ptr_eq(cur, &s) => {
                t.remove(&s.addr());
            }
            // Another thread closed it meanwhile.
            _ => return Ok(()),
        }
    }
    SERVED.fetch_sub(1, Ordering::Relaxed);
    if s.writable() {
        WRITABLE.fetch_sub(1, Ordering::Relaxed);
    }
    // Other threads hold a clone only for the length of one call (a
    // write's coherence, a lookup): wait for them to let go.
    let mut s = s;
    let owned = loop {
        match Arc::try_unwrap(s) {
            Ok(owned) => break owned,
            Err(shared) => {
                s = shared;
                std::thread::yield_now();
            }
        }
    };
    if how == Closing::Unmapped && owned.private() {
        // Nothing of a private mapping outlives it: no write-back.
        let _ = owned.discard(0..owned.len(), Discard::KeepStore);
        owned.release_store();
    }
    match owned.close() {
        Ok(()) => Ok(()),
        Err(failed) => {
            let (back, e) = *failed;
            eprintln!(
                "faultline-preload: {} stays mapped: its write-back failed: {e}",
                back.path.display()
            );
            insert(back);
            SERVED_EVER.fetch_sub(1, Ordering::Relaxed);
            Err(libc::EIO)
        }
    }
}

/// What an interposed call does.
pub(crate) enum Outcome<T> {
    /// Done here: return this.
    Done(T),
    /// Not faultline's: the call goes to libc unchanged.
    Kernel,
    /// Refused with this errno.
    Failed(c_int),
}

impl<T> Outcome<T> {
    /// The same outcome with `f` applied to what is returned.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Done(v) => Outcome::Done(f(v)),
            Outcome::Kernel => Outcome::Kernel,
            Outcome::Failed(e) => Outcome::Failed(e),
        }
    }
}

static MANAGER: OnceLock<Option<Manager>> = OnceLock::new();

/// The process's manager, started on first use; `None` if it cannot start
/// (said once on stderr: the program runs on the kernel's mmap).
fn manager() -> Option<&'static Manager> {
    MANAGER
        .get_or_init(|| {
            let s = settings()?;
            crate::exit::log_to_stderr();
            let mut b = Manager::builder();
            if let Some(budget) = s.budget {
                b = b.budget(budget);
            }
            if let Some(w) = s.workers {
                b = b.workers(w);
            }
            if s.in_thread {
                b = b.fault_mode(faultline::FaultMode::InThread);
            }
            match b.build() {
                Ok(mm) => {
                    crate::exit::register(&mm);
                    Some(mm)
                }
                Err(e) => {
                    eprintln!(
                        "faultline-preload: cannot start faultline ({e}); file mappings go to the kernel"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// The started manager, if any (the exit report).
pub(crate) fn started_manager() -> Option<&'static Manager> {
    MANAGER.get().and_then(Option::as_ref)
}

/// Says `what` on stderr, once per process for each distinct text.
pub(crate) fn say_once(what: String) {
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock();
    if !said.contains(&what) {
        eprintln!("faultline-preload: {what}");
        said.push(what);
    }
}

/// An `mmap` call's arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MapCall {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) prot: c_int,
    pub(crate) flags: c_int,
    pub(crate) fd: c_int,
    pub(crate) offset: i64,
}

/// `mmap` of a file: served if its path matches `FAULTLINE_FILES`.
pub(crate) fn map_file(c: MapCall) -> Outcome<usize> {
    let Some(settings) = settings() else {
        return Outcome::Kernel;
    };
    let Ok(facts) = interpose::fd_facts(c.fd) else {
        return Outcome::Kernel;
    };
    if !facts.regular || c.len == 0 || c.offset < 0 || c.offset as usize % PAGE != 0 {
        return Outcome::Kernel;
    }
    let Ok(path) = interpose::fd_path(c.fd) else {
        return Outcome::Kernel;
    };
    if !settings.serves(&path) {
        return Outcome::Kernel;
    }
    let shared = matches!(c.flags & 0x0f, libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE);
    let writable = c.prot & libc::PROT_WRITE != 0;
    let private = writable && !shared;
    if writable && shared && !facts.writable {
        return Outcome::Failed(libc::EACCES);
    }
    let len = pages_of(c.len);
    let fixed = c.flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    if fixed {
        if c.addr % PAGE != 0 {
            return Outcome::Failed(libc::EINVAL);
        }
        if c.flags & libc::MAP_FIXED != 0 {
            if let Err(errno) = replace_whole(&(c.addr..c.addr + len), &path) {
                return Outcome::Failed(errno);
            }
        }
    }
    let Some(mm) = manager() else {
        return Outcome::Kernel;
    };
    let file = match interpose::reopen_fd(c.fd, writable && shared) {
        Ok(f) => f,
        Err(e) => return Outcome::Failed(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let mut opts = MapOptions::new();
    if fixed {
        opts = if c.flags & libc::MAP_FIXED != 0 {
            // SAFETY: the program asked for MAP_FIXED: as the kernel's
            // mmap would, the region replaces whatever the program had
            // there, which is the program's to give up (faultline's own
            // regions there were closed above; another manager's are
            // refused by faultline).
            unsafe { opts.at_replacing(c.addr) }
        } else {
            opts.at(c.addr)
        };
    }
    let at = Target {
        facts: &facts,
        path,
        offset: c.offset as u64,
        len,
        writable: writable && shared,
        program_writes: false,
        private: None,
    };
    let at = if private {
        match PrivateBacking::new(len / PAGE) {
            Ok(b) => Target {
                private: Some(Arc::new(b)),
                ..at
            },
            Err(e) => {
                say_once(format!(
                    "{}: no overlay for a private writable mapping ({e}; FAULTLINE_PRIVATE_DIR \
                     names its directory): left to the kernel",
                    at.path.display()
                ));
                return Outcome::Kernel;
            }
        }
    } else {
        at
    };
    match serve(mm, file, at, opts) {
        Ok(s) => Outcome::Done(s.addr()),
        Err(errno) => Outcome::Failed(errno),
    }
}

/// Whether an anonymous mapping of `len` bytes may be served (the gate's
/// fast check: `FAULTLINE_ANON_MIN` is set and `len` reaches it).
pub(crate) fn anonymous_served(len: usize) -> bool {
    settings()
        .and_then(|s| s.anon_min)
        .is_some_and(|min| len >= min)
}

/// A private anonymous `mmap` of at least `FAULTLINE_ANON_MIN` bytes:
/// served over zeros and a store (`anonymous.rs`).
pub(crate) fn map_anonymous(c: MapCall) -> Outcome<usize> {
    let Some(settings) = settings() else {
        return Outcome::Kernel;
    };
    let Some(min) = settings.anon_min else {
        return Outcome::Kernel;
    };
    if !crate::anonymous::eligible(c.len, c.prot, c.flags, min) {
        return Outcome::Kernel;
    }
    let Some(mm) = manager() else {
        return Outcome::Kernel;
    };
    let len = pages_of(c.len);
    let kind = match AnonKind::new(&settings.anon_store, len / PAGE) {
        Ok(k) => k,
        Err(e) => {
            say_once(format!("anonymous memory left to the kernel: {e}"));
            return Outcome::Kernel;
        }
    };
    match serve_anonymous(mm, kind, len, MapOptions::new()) {
        Ok(s) => Outcome::Done(s.addr()),
        Err(errno) => Outcome::Failed(errno),
    }
}

/// Maps `len` bytes of anonymous memory over `kind`'s store and enters
/// it in the table.
fn serve_anonymous(
    mm: &Manager,
    kind: AnonKind,
    len: usize,
    opts: MapOptions,
) -> Result<Arc<Served>, c_int> {
    let store = kind.store().map_err(|e| {
        eprintln!("faultline-preload: anonymous memory: {e}");
        libc::ENOMEM
    })?;
    let region = crate::reentry::inside(|| mm.map_shared(len, store, opts)).map_err(|e| {
        eprintln!("faultline-preload: cannot serve {len} bytes of anonymous memory: {e}");
        e.errno()
    })?;
    Ok(insert(Served {
        region: Mapped::Rw(region),
        dev: 0,
        ino: 0,
        offset: 0,
        file: None,
        path: PathBuf::from("anonymous memory"),
        gone: Mutex::new(Vec::new()),
        program_writes: Arc::new(AtomicBool::new(false)),
        private: None,
        anon: Some(kind),
    }))
}

/// What to serve: a file range.
struct Target<'a> {
    facts: &'a FdFacts,
    path: PathBuf,
    offset: u64,
    len: usize,
    writable: bool,
    /// The program has written the file with `write(2)` already.
    program_writes: bool,
    /// A private writable mapping's overlay.
    private: Option<Arc<PrivateBacking>>,
}

/// Maps `t` through `mm` and enters it in the table; the errno on failure
/// (said on stderr).
fn serve(
    mm: &Manager,
    file: std::fs::File,
    t: Target<'_>,
    opts: MapOptions,
) -> Result<Arc<Served>, c_int> {
    let store_file = file
        .try_clone()
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let program_writes = Arc::new(AtomicBool::new(t.program_writes));
    let store = ProgramFile::new(store_file, t.offset, t.writable, program_writes.clone());
    let mapped = crate::reentry::inside(|| match &t.private {
        Some(backing) => {
            let private = PrivateFile::new(Some(store), backing.clone());
            mm.map(t.len, private, opts).map(Mapped::Rw)
        }
        None if t.writable => mm.map(t.len, store, opts).map(Mapped::Rw),
        None => mm.map_read_only(t.len, store, opts).map(Mapped::Ro),
    });
    let region = mapped.map_err(|e| {
        eprintln!(
            "faultline-preload: cannot serve {} (bytes {}..{}): {e}",
            t.path.display(),
            t.offset,
            t.offset + t.len as u64
        );
        e.errno()
    })?;
    Ok(insert(Served {
        region,
        dev: t.facts.dev,
        ino: t.facts.ino,
        offset: t.offset,
        file: Some(file),
        path: t.path,
        gone: Mutex::new(Vec::new()),
        program_writes,
        private: t.private,
        anon: None,
    }))
}

/// Before a `MAP_FIXED` mapping over `range`: served mappings wholly inside
/// it are closed (the kernel would replace them); one only partly inside is
/// refused with `EINVAL`.
fn replace_whole(range: &Range<usize>, path: &std::path::Path) -> Result<(), c_int> {
    for s in overlapping(range) {
        let r = s.range();
        if r.start < range.start || r.end > range.end {
            say_once(format!(
                "{}: MAP_FIXED over part of a mapping faultline serves is refused (EINVAL)",
                path.display()
            ));
            return Err(libc::EINVAL);
        }
        close(s, Closing::Unmapped)?;
    }
    Ok(())
}

/// `munmap(range)` where it touches served mappings (the rest goes to
/// libc, piece by piece).
pub(crate) fn unmap(range: Range<usize>) -> Outcome<()> {
    let served = overlapping(&range);
    if served.is_empty() {
        return Outcome::Kernel;
    }
    let mut at = range.start;
    for s in served {
        let r = s.range();
        if at < r.start {
            if let Err(errno) = kernel_unmap(at..r.start) {
                return Outcome::Failed(errno);
            }
        }
        let cut = r.start.max(range.start)..r.end.min(range.end);
        at = cut.end;
        let done = if cut == r {
            close(s, Closing::Unmapped)
        } else {
            unmap_part(s, cut)
        };
        if let Err(errno) = done {
            return Outcome::Failed(errno);
        }
    }
    if at < range.end {
        if let Err(errno) = kernel_unmap(at..range.end) {
            return Outcome::Failed(errno);
        }
    }
    Outcome::Done(())
}

fn kernel_unmap(r: Range<usize>) -> Result<(), c_int> {
    // SAFETY: a piece of the program's own munmap call, not served by
    // faultline: the program gave it up.
    let rc = unsafe { interpose::next_munmap(r.start as *mut _, r.end - r.start) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL))
    }
}

/// The program unmaps addresses `cut` of `s`: written back, their pages
/// dropped, recorded as gone; the whole region closes once all is gone.
fn unmap_part(s: Arc<Served>, cut: Range<usize>) -> Result<(), c_int> {
    if let Err(e) = s.flush() {
        eprintln!(
            "faultline-preload: {}: write-back before munmap failed: {e}",
            s.path.display()
        );
        return Err(libc::EIO);
    }
    let base = s.addr();
    let _ = s.discard(cut.start - base..cut.end - base, Discard::KeepStore);
    let all_gone = {
        let mut gone = s.gone.lock();
        gone.push(cut);
        s.all_gone(&gone)
    };
    if all_gone {
        close(s, Closing::Unmapped)?;
    }
    Ok(())
}

/// `mremap(old, old_len, new_len, flags)` of a served mapping.
pub(crate) fn remap(old: usize, old_len: usize, new_len: usize, flags: c_int) -> Outcome<usize> {
    let mut served = overlapping(&(old..old + old_len.max(1)));
    let many = served.len() > 1;
    // The only clone of the mapping this call keeps (closing it waits for
    // every other to go).
    let Some(s) = served.pop() else {
        return Outcome::Kernel;
    };
    drop(served);
    if s.addr() != old || many {
        say_once("mremap of part of a mapping faultline serves is refused (EINVAL)".into());
        return Outcome::Failed(libc::EINVAL);
    }
    if flags & !libc::MREMAP_MAYMOVE != 0 {
        say_once("mremap with MREMAP_FIXED or MREMAP_DONTUNMAP of a mapping faultline serves is refused (EINVAL)".into());
        return Outcome::Failed(libc::EINVAL);
    }
    let new = pages_of(new_len);
    if new == 0 {
        return Outcome::Failed(libc::EINVAL);
    }
    if s.gone
        .lock()
        .iter()
        .any(|g| g.start < old + new.min(s.len()))
    {
        // The kernel refuses to remap a range with holes.
        return Outcome::Failed(libc::EFAULT);
    }
    if new <= s.len() {
        if new < s.len() {
            let end = old + s.len();
            if let Err(errno) = unmap_part(s, old + new..end) {
                return Outcome::Failed(errno);
            }
        }
        return Outcome::Done(old);
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        return Outcome::Failed(libc::ENOMEM);
    }
    match grow(s, new) {
        Ok(addr) => Outcome::Done(addr),
        Err(errno) => Outcome::Failed(errno),
    }
}

/// A new region over `new` bytes from the same file offset as `s`, which
/// is closed: a read-only one after the new one is made (a failure leaves
/// it as it was), a writable one first (two writable regions over one file
/// range are refused).
fn grow(s: Arc<Served>, new: usize) -> Result<usize, c_int> {
    let Some(mm) = manager() else {
        return Err(libc::ENOMEM);
    };
    if let Some(kind) = s.anon.clone() {
        // Closed into its store first, then a new region over the store.
        close(s, Closing::Remapped)?;
        let kind = kind.with_room(new / PAGE).map_err(|e| {
            say_once(format!("mremap of anonymous memory: {e}"));
            libc::ENOMEM
        })?;
        return serve_anonymous(mm, kind, new, MapOptions::new()).map(|n| n.addr());
    }
    let Some(own_file) = &s.file else {
        return Err(libc::EINVAL);
    };
    let facts = FdFacts {
        dev: s.dev,
        ino: s.ino,
        size: 0,
        regular: true,
        writable: s.writable(),
        append: false,
    };
    let file = own_file
        .try_clone()
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let target = Target {
        facts: &facts,
        path: s.path.clone(),
        offset: s.offset,
        len: new,
        writable: s.writable(),
        program_writes: s.program_writes.load(Ordering::Relaxed),
        private: None,
    };
    if let Some(backing) = s.private.clone() {
        // Closed first: its dirty pages go to the overlay (and their bits
        // are set) before the bits are carried over.
        close(s, Closing::Remapped)?;
        let backing = backing
            .with_room(new / PAGE)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let target = Target {
            private: Some(backing),
            ..target
        };
        serve(mm, file, target, MapOptions::new()).map(|n| n.addr())
    } else if s.writable() {
        close(s, Closing::Remapped)?;
        serve(mm, file, target, MapOptions::new()).map(|n| n.addr())
    } else {
        let n = serve(mm, file, target, MapOptions::new())?;
        close(s, Closing::Remapped)?;
        Ok(n.addr())
    }
}

/// `msync(range)`: the part of each served writable mapping in it is
/// written back and made durable; `EIO` if that fails.
pub(crate) fn sync(range: Range<usize>) -> Result<(), c_int> {
    for s in overlapping(&range) {
        let base = s.addr();
        let cut = range.start.max(base) - base..range.end.min(base + s.len()) - base;
        if let Err(e) = s.sync(cut) {
            eprintln!(
                "faultline-preload: {}: msync: write-back failed: {e}",
                s.path.display()
            );
            return Err(libc::EIO);
        }
    }
    Ok(())
}

/// `madvise(range, advice)` where it touches served mappings; `Kernel`
/// when it touches none. The parts outside served mappings get the advice
/// from libc.
pub(crate) fn advise(range: Range<usize>, advice: c_int) -> Outcome<()> {
    let served = overlapping(&range);
    if served.is_empty() {
        return Outcome::Kernel;
    }
    let mut at = range.start;
    for s in &served {
        let r = s.range();
        if at < r.start {
            kernel_advise(at..r.start, advice);
        }
        let cut = r.start.max(range.start) - r.start..r.end.min(range.end) - r.start;
        at = r.end.min(range.end);
        if let Err(errno) = advise_served(s, cut, advice) {
            return Outcome::Failed(errno);
        }
    }
    if at < range.end {
        kernel_advise(at..range.end, advice);
    }
    Outcome::Done(())
}

fn kernel_advise(r: Range<usize>, advice: c_int) {
    // SAFETY: a piece of the program's own madvise call outside the
    // mappings faultline serves.
    let _ = unsafe { interpose::next_madvise(r.start as *mut _, r.end - r.start, advice) };
}

/// The advice for region bytes `cut` of `s`.
fn advise_served(s: &Served, cut: Range<usize>, advice: c_int) -> Result<(), c_int> {
    if let Some(pattern) = AccessPattern::from_madvise(advice) {
        s.advise(pattern);
        return Ok(());
    }
    match advice {
        libc::MADV_WILLNEED => {
            let _ = s.prefetch(cut);
            Ok(())
        }
        libc::MADV_DONTNEED if !s.writable() => {
            let pages = cut.start / PAGE..pages_of(cut.end) / PAGE;
            let _ = s.discard(cut, Discard::KeepStore);
            if let Some(b) = &s.private {
                // The kernel drops a private mapping's own copies: the
                // pages read the file again.
                b.forget(pages.start as u64..pages.end as u64);
            }
            Ok(())
        }
        libc::MADV_REMOVE if s.writable() => s
            .discard(cut, Discard::Zero)
            .map(|_| ())
            .map_err(|_| libc::EIO),
        libc::MADV_REMOVE if s.private() => Err(libc::EINVAL),
        libc::MADV_REMOVE => Err(libc::EACCES),
        libc::MADV_FREE => Err(libc::EINVAL),
        _ => Ok(()),
    }
}

/// `mprotect(range, prot)` over served mappings: accepted without effect,
/// except write on a read-only one (`EACCES`).
pub(crate) fn protect(range: Range<usize>, prot: c_int) -> Outcome<()> {
    match protect_parts(range, prot) {
        Ok(o) => o,
        Err(errno) => Outcome::Failed(errno),
    }
}

fn kernel_protect(r: Range<usize>, prot: c_int) -> Result<(), c_int> {
    // SAFETY: a piece of the program's own mprotect call outside the
    // mappings faultline serves.
    let rc = unsafe { interpose::next_mprotect(r.start as *mut _, r.end - r.start, prot) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL))
    }
}

fn protect_parts(range: Range<usize>, prot: c_int) -> Result<Outcome<()>, c_int> {
    let served = overlapping(&range);
    if served.is_empty() {
        return Ok(Outcome::Kernel);
    }
    if prot & libc::PROT_WRITE != 0 && served.iter().any(|s| !s.writable() && !s.private()) {
        return Err(libc::EACCES);
    }
    if prot != libc::PROT_READ | libc::PROT_WRITE && prot != libc::PROT_READ {
        say_once(format!(
            "mprotect({prot:#x}) of a mapping faultline serves is accepted without effect"
        ));
    }
    let mut at = range.start;
    for s in &served {
        let r = s.range();
        if at < r.start {
            kernel_protect(at..r.start, prot)?;
        }
        at = r.end.min(range.end);
    }
    if at < range.end {
        kernel_protect(at..range.end, prot)?;
    }
    Ok(Outcome::Done(()))
}
