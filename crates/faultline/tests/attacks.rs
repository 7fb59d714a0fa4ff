//! The attack table of docs/reliability.md: what a program may do to or
//! with faultline's memory, and what it gets — a clear error or correct
//! handling, never a crash, a hang or lost data. Needs userfaultfd (root).

use faultline::store::{File, FileOptions, Zero};
use faultline::{MapOptions, PageSize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{byte, kernel_read, manager, set_byte, ScratchDir, MIB};

const PAGE: usize = 4096;

/// 10^4 regions in one manager: each mapped, touched, checked, unmapped.
#[test]
fn ten_thousand_regions() {
    let mm = manager(64 * MIB);
    let t0 = Instant::now();
    let regions: Vec<_> = (0..10_000)
        .map(|_| mm.map(PAGE, Zero, MapOptions::new()).expect("map"))
        .collect();
    for (i, r) in regions.iter().enumerate() {
        set_byte(r, 0, (i % 251) as u8 + 1);
    }
    for (i, r) in regions.iter().enumerate() {
        assert_eq!(byte(r, 0), (i % 251) as u8 + 1, "region {i}");
    }
    assert_eq!(mm.regions(), 10_000);
    drop(regions);
    assert_eq!(mm.regions(), 0);
    assert!(
        t0.elapsed() < Duration::from_secs(120),
        "took {:?}",
        t0.elapsed()
    );
    let st = common::all_free(&mm);
    assert_eq!(st.frames_free, st.frames_total, "frames leaked: {st}");
}

/// Several managers in one process, each with its own regions, touched from
/// threads at once.
#[test]
fn several_managers_in_one_process() {
    let managers: Vec<_> = (0..3).map(|_| manager(8 * MIB)).collect();
    std::thread::scope(|s| {
        for (m, mm) in managers.iter().enumerate() {
            s.spawn(move || {
                let r = mm.map(MIB, Zero, MapOptions::new()).expect("map");
                for i in (0..r.len()).step_by(PAGE) {
                    set_byte(&r, i, (i / PAGE + m) as u8);
                }
                for i in (0..r.len()).step_by(PAGE) {
                    assert_eq!(byte(&r, i), (i / PAGE + m) as u8);
                }
            });
        }
    });
    for mm in &managers {
        assert!(mm.take_error().is_none());
    }
}

/// A `Region` dropped while another thread keeps touching it (kernel-mode,
/// so an access after the unmap is EFAULT, not SIGSEGV): every access
/// either reads the data or fails cleanly; nothing hangs.
#[test]
fn dropping_a_region_while_another_thread_touches_it() {
    let mm = manager(8 * MIB);
    for round in 0..20 {
        let r = mm.map(64 * PAGE, Zero, MapOptions::new()).expect("map");
        r.write_at(0, &[9; PAGE]).expect("write_at");
        let addr = r.addr();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut p = 0;
                while !stop.load(Ordering::Relaxed) {
                    let e = kernel_read(addr + (p % 64) * PAGE);
                    assert!(e == 0 || e == libc::EFAULT, "round {round}: errno {e}");
                    p += 1;
                }
            });
            std::thread::sleep(Duration::from_millis(2));
            drop(r);
            stop.store(true, Ordering::Relaxed);
        });
    }
    let st = common::all_free(&mm);
    assert_eq!(st.frames_free, st.frames_total, "frames leaked: {st}");
}

/// The `Manager` handle dropped while regions live: the regions keep their
/// workers and work on; the last region's drop shuts everything down.
#[test]
fn dropping_the_manager_while_regions_live() {
    let mm = manager(8 * MIB);
    let a = mm.map(MIB, Zero, MapOptions::new()).expect("map");
    let b = mm
        .map(4 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
        .expect("map");
    drop(mm);
    set_byte(&a, 12345, 7);
    set_byte(&b, 3 * MIB, 8);
    assert_eq!(byte(&a, 12345), 7);
    assert_eq!(byte(&b, 3 * MIB), 8);
    drop(a);
    drop(b);
}

/// The file truncated, extended and deleted under a mapped region: pages
/// past a truncation read zeros (as the file does), an extension reads the
/// new bytes, a deleted file's region keeps working (the store holds it
/// open).
#[test]
fn the_file_changes_under_a_mapped_region() {
    let dir = ScratchDir::new("file-changes");
    let path = dir.file("f", &vec![5u8; 16 * PAGE]);
    let mm = manager(8 * MIB);
    let r = mm
        .map_read_only(
            32 * PAGE,
            File::open(&path, FileOptions::new()).expect("open"),
            MapOptions::new(),
        )
        .expect("map");
    assert_eq!(byte(&r, PAGE), 5);
    let f = std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open for write");
    f.set_len(8 * PAGE as u64).expect("truncate");
    assert_eq!(byte(&r, 12 * PAGE), 0, "past the truncation: zeros");
    std::fs::write(&path, vec![6u8; 32 * PAGE]).expect("extend");
    assert_eq!(byte(&r, 20 * PAGE), 6, "the extension's bytes");
    std::fs::remove_file(&path).expect("delete");
    assert_eq!(byte(&r, 30 * PAGE), 6, "still readable once deleted");
    assert!(mm.take_error().is_none());
}

/// Region memory as the buffer of `read(2)` and `write(2)`: the kernel's
/// own accesses fault into faultline and are served.
#[test]
fn region_memory_as_a_syscall_buffer() {
    let dir = ScratchDir::new("syscall-buffer");
    let data: Vec<u8> = (0..64 * PAGE).map(|i| (i % 241) as u8).collect();
    let src = dir.file("src", &data);
    let mm = manager(8 * MIB);
    let mut r = mm.map(64 * PAGE, Zero, MapOptions::new()).expect("map");
    use std::io::{Read, Write};
    // SAFETY: only this thread uses the region, and only through this
    // slice (the buffer of read(2)) while it is borrowed.
    let buf = unsafe { r.as_mut_slice() };
    std::fs::File::open(&src)
        .expect("open")
        .read_exact(buf)
        .expect("read(2) into the region");
    let mut back = vec![0u8; r.len()];
    r.read_at(0, &mut back).expect("read_at");
    assert!(back == data);
    let dst = dir.path().join("dst");
    let r2 = mm
        .map_read_only(
            64 * PAGE,
            File::open(&src, FileOptions::new()).expect("open"),
            MapOptions::new(),
        )
        .expect("map");
    // SAFETY: a read-only region nobody writes; the slice is only the
    // buffer of write(2), and dropped before the region.
    let buf = unsafe { r2.as_slice() };
    std::fs::File::create(&dst)
        .expect("create")
        .write_all(buf)
        .expect("write(2) from a region never touched");
    assert!(std::fs::read(&dst).expect("read back") == data);
}

/// `O_DIRECT` reads into region memory: the device's DMA target is a page
/// faultline maps (pinned for the I/O); the data arrives whole.
#[test]
fn o_direct_reads_into_region_memory() {
    use std::os::unix::fs::OpenOptionsExt;
    // On the disk's own filesystem (tmpfs has no O_DIRECT).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("faultline-odirect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _guard = Remove(dir.clone());
    let data: Vec<u8> = (0..256 * PAGE).map(|i| (i * 7 % 253) as u8).collect();
    let path = dir.join("f");
    std::fs::write(&path, &data).expect("write");
    let f = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("O_DIRECT open");
    // A small budget: reclaim runs while the reads pin pages.
    let mm = manager(4 * MIB);
    let mut r = mm.map(256 * PAGE, Zero, MapOptions::new()).expect("map");
    use std::os::unix::fs::FileExt;
    {
        // SAFETY: only this thread uses the region, and only through this
        // slice (the buffers of the reads) while it is borrowed; reclaim
        // only ever changes a page's bytes to what they logically hold.
        let buf = unsafe { r.as_mut_slice() };
        for chunk in 0..8 {
            let at = chunk * 32 * PAGE;
            f.read_exact_at(&mut buf[at..at + 32 * PAGE], at as u64)
                .expect("O_DIRECT read into the region");
        }
    }
    let mut back = vec![0u8; r.len()];
    r.read_at(0, &mut back).expect("read_at");
    assert!(back == data, "the data arrived whole");
    assert!(mm.take_error().is_none());
}

/// kill -9 in the middle of a flush: every page of the file is either its
/// old or its new content, never a torn mix (writes are whole pages from a
/// frame nobody writes during the copy). The flushing process is this test
/// binary, re-executed.
#[test]
fn kill_9_during_a_flush_tears_no_page() {
    let pages = 4096;
    if let Some(path) = std::env::var_os("FAULTLINE_FLUSH_CHILD") {
        let mm = manager(64 * MIB);
        let r = mm
            .map(
                pages * PAGE,
                File::open(
                    std::path::Path::new(&path),
                    FileOptions::new().writable(true),
                )
                .expect("open"),
                MapOptions::new(),
            )
            .expect("map");
        for round in 1u8.. {
            for p in 0..pages {
                r.write_at(p * PAGE, &[round; PAGE]).expect("write_at");
            }
            println!("flushing {round}");
            let _ = r.flush();
        }
        return;
    }
    let dir = ScratchDir::new("kill9");
    let path = dir.file("f", &vec![0u8; pages * PAGE]);
    let exe = std::env::current_exe().expect("current exe");
    for kill_after_ms in [0u64, 3, 17] {
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "kill_9_during_a_flush_tears_no_page",
                "--nocapture",
            ])
            .env("FAULTLINE_FLUSH_CHILD", &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // Kill it during its second flush (the first one completed).
        let out = child.stdout.take().expect("stdout");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out));
        while let Some(Ok(line)) = lines.next() {
            if line == "flushing 2" {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(kill_after_ms));
        child.kill().expect("kill -9");
        let _ = child.wait();
        let bytes = std::fs::read(&path).expect("read");
        for (p, page) in bytes.chunks(PAGE).enumerate() {
            assert!(
                page.iter().all(|&b| b == page[0]),
                "page {p} is torn after kill -9 at {kill_after_ms} ms"
            );
            assert!(page[0] >= 1, "page {p}: the first flush completed");
        }
    }
}
