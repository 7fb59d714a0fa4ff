//! Integration tests of the fault path: real userfaultfd faults served from
//! the frame pool. Every test here needs userfaultfd with `UFFDIO_MOVE`
//! (Linux 6.8+, root or `/dev/userfaultfd` access); without it they fail with
//! the reason, never pass silently.

use faultline::store::Zero;
use faultline::{AddrError, BuildError, ConfigError, Manager, MapError, MapOptions, PageSize};
use std::sync::atomic::Ordering;
use std::sync::Barrier;

mod common;
use common::{byte, kernel_read, rng, set_byte, settled, MIB};

fn manager(budget: usize) -> Manager {
    let mut c = faultline::Config::default();
    c.budget = budget;
    c.workers = std::env::var("FL_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    common::manager_with(c)
}

fn pattern(page: usize, thread: usize) -> u8 {
    (page.wrapping_mul(31) ^ thread.wrapping_mul(7)) as u8 | 1
}

/// Two threads touch random pages: each page reads zeros first, then holds
/// the pattern its writer wrote.
fn random_touch(page_size: PageSize, len: usize) {
    let mm = manager(64 * MIB);
    let r = mm
        .map(len, Zero, MapOptions::new().page_size(page_size))
        .expect("map");
    let ps = page_size.bytes();
    let pages = len / ps;
    std::thread::scope(|s| {
        for t in 0..2usize {
            let r = &r;
            s.spawn(move || {
                let mut next = rng(0x1234 + t as u64);
                let mut written = vec![false; pages];
                // Thread t owns the pages p with p % 2 == t (so writes do not
                // race), but reads anywhere.
                for _ in 0..pages * 2 {
                    let p = next() as usize % pages;
                    let off = (next() as usize % (ps / 8)) * 8;
                    let v = r.atomics()[(p * ps + off) / 8].load(Ordering::Relaxed);
                    assert!(
                        v == 0 || p % 2 != t || written[p],
                        "page {p} of thread {t} not zero before first write"
                    );
                    if p % 2 == t {
                        written[p] = true;
                        let pat = pattern(p, t);
                        // Only thread t writes page p.
                        set_byte(r, p * ps, pat);
                        let back = byte(r, p * ps);
                        assert_eq!(back, pat);
                    }
                }
            });
        }
    });
    let st = settled(&mm);
    assert!(st.moves > 0);
    assert_eq!(st.poisoned, 0, "{st}");
    if let Some(e) = mm.take_error() {
        panic!("unexpected fault error: {e}");
    }
    // One move maps a page, or a fault-around run of pages.
    assert_eq!(r.resident_pages() as u64, st.moves + st.fault_around_pages);
    // Every page written holds its pattern; every other page that was
    // touched holds zeros.
    for p in 0..pages {
        let b = byte(&r, p * ps);
        assert!(b == 0 || b == pattern(p, p % 2), "page {p} holds {b}");
    }
}

#[test]
fn two_threads_random_4k() {
    random_touch(PageSize::Base4K, 16 * MIB);
}

#[test]
fn two_threads_random_2m() {
    random_touch(PageSize::Huge2M, 48 * MIB);
}

#[test]
fn two_threads_race_on_one_page() {
    let mm = manager(16 * MIB);
    for size in [PageSize::Base4K, PageSize::Huge2M] {
        for round in 0..50 {
            let r = mm
                .map(size.bytes(), Zero, MapOptions::new().page_size(size))
                .expect("map");
            let barrier = Barrier::new(2);
            std::thread::scope(|s| {
                for t in 0..2usize {
                    let (barrier, r) = (&barrier, &r);
                    s.spawn(move || {
                        barrier.wait();
                        // Each thread its own byte.
                        set_byte(r, t * 64, t as u8 + 1);
                    });
                }
            });
            assert_eq!(
                (byte(&r, 0), byte(&r, 64)),
                (1, 2),
                "round {round}, {size:?}: both writes land in one page"
            );
            assert_eq!(r.resident_pages(), 1);
        }
    }
    let st = settled(&mm);
    assert_eq!(st.moves, 100, "{st}");
    assert!(mm.take_error().is_none());
}

#[test]
fn thousand_regions_at_once() {
    let mm = manager(16 * MIB);
    let regions: Vec<_> = (0..1000)
        .map(|_| mm.map(64 << 10, Zero, MapOptions::new()).expect("map"))
        .collect();
    assert_eq!(mm.regions(), 1000);
    for (i, r) in regions.iter().enumerate() {
        r.write_at((i % 16) * 4096, &(i as u32).to_ne_bytes())
            .expect("write_at");
    }
    for (i, r) in regions.iter().enumerate() {
        let mut v = [0u8; 4];
        r.read_at((i % 16) * 4096, &mut v).expect("read_at");
        assert_eq!(u32::from_ne_bytes(v), i as u32);
        assert_eq!(mm.region_at(r.addr() + 100).expect("lookup").0, r.addr());
    }
    assert_eq!(settled(&mm).moves, 1000);
    drop(regions);
    assert_eq!(mm.regions(), 0);
    let st = common::all_free(&mm);
    assert_eq!(st.frames_free, st.frames_total, "{st}");
}

#[test]
fn map_unmap_loop_returns_every_frame() {
    let mm = manager(16 * MIB);
    let start = mm.stats().frames_free;
    for i in 0..200 {
        let size = if i % 2 == 0 {
            PageSize::Base4K
        } else {
            PageSize::Huge2M
        };
        let r = mm
            .map(4 * MIB, Zero, MapOptions::new().page_size(size))
            .expect("map");
        for p in (0..r.len()).step_by(size.bytes() * 3 + 4096) {
            set_byte(&r, p, 0xa5);
        }
        assert!((0..r.len())
            .step_by(4096)
            .all(|p| matches!(byte(&r, p), 0 | 0xa5)));
        assert!(mm.stats().frames_free < start);
    }
    let st = mm.stats();
    assert_eq!(st.frames_free, start, "{st}");
    assert_eq!(st.poisoned, 0);
    assert!(mm.take_error().is_none());
}

#[test]
fn reused_frames_are_cleared() {
    // A budget of one 2 MiB frame: every region after the first reuses the
    // frame the previous one dirtied, and must still read zeros.
    let mm = manager(2 * MIB);
    for i in 0..20u8 {
        let r = mm
            .map(2 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
            .expect("map");
        let mut s = vec![0xffu8; r.len()];
        r.read_at(0, &mut s).expect("read_at");
        assert!(
            s.iter().all(|&b| b == 0),
            "round {i}: stale data in a fresh page"
        );
        s.fill(i + 1);
        r.write_at(0, &s).expect("write_at");
    }
    let st = settled(&mm);
    assert_eq!(st.fills_prezeroed, 1, "{st}");
    assert_eq!(st.fills_cleared, 19, "{st}");
}

#[test]
fn dropped_page_is_served_again() {
    let mm = manager(8 * MIB);
    let r = mm.map(64 << 10, Zero, MapOptions::new()).expect("map");
    set_byte(&r, 0, 9);
    let before = mm.stats().frames_free;
    // SAFETY: the region's first page, no references into it live.
    let rc = unsafe { libc::madvise(r.as_mut_ptr().cast(), 4096, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0);
    assert_eq!(byte(&r, 0), 0, "a dropped anonymous page reads zeros again");
    let st = settled(&mm);
    // Given back by the removal's handler, or gathered by the refault if
    // the handler came late (`fault/program_drop.rs`).
    assert_eq!(st.removed_by_program + st.refaulted_dropped, 1, "{st}");
    assert_eq!(
        st.frames_free, before,
        "the lost frame was refilled and reused"
    );
    drop(r);
    let st = common::all_free(&mm);
    assert_eq!(st.frames_free, st.frames_total);
}

#[test]
fn bad_inputs_are_errors() {
    let err = Manager::builder()
        .budget(MIB)
        .build()
        .expect_err("budget below 2 MiB");
    assert!(
        matches!(err, BuildError::Config(ConfigError::BudgetTooSmall { .. })),
        "{err}"
    );
    let err = Manager::builder()
        .budget(3 * MIB)
        .build()
        .expect_err("unaligned budget");
    assert!(
        matches!(err, BuildError::Config(ConfigError::BudgetUnaligned { .. })),
        "{err}"
    );
    let err = Manager::builder()
        .budget(1 << 50)
        .build()
        .expect_err("huge budget");
    assert!(
        matches!(err, BuildError::Config(ConfigError::BudgetTooLarge { .. })),
        "{err}"
    );
    let err = Manager::builder()
        .workers(0)
        .build()
        .expect_err("no workers");
    assert!(
        matches!(err, BuildError::Config(ConfigError::NoWorkers)),
        "{err}"
    );

    let mm = manager(4 * MIB);
    assert!(matches!(
        mm.map(0, Zero, MapOptions::new()),
        Err(MapError::ZeroLength)
    ));
    assert!(matches!(
        mm.map(4097, Zero, MapOptions::new()),
        Err(MapError::Unaligned { len: 4097, .. })
    ));
    assert!(matches!(
        mm.map(
            4 * MIB + 4096,
            Zero,
            MapOptions::new().page_size(PageSize::Huge2M)
        ),
        Err(MapError::Unaligned { .. })
    ));
    assert!(matches!(
        mm.map(usize::MAX & !4095, Zero, MapOptions::new()),
        Err(MapError::TooLarge { .. })
    ));

    let r = mm
        .map(4 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
        .expect("map");
    assert_eq!(r.is_resident(r.addr()), Ok(false));
    assert_eq!(
        r.is_resident(r.addr() + 4096),
        Err(AddrError::Unaligned {
            addr: r.addr() + 4096,
            page: "2m"
        })
    );
    assert_eq!(
        r.is_resident(r.addr() + r.len()),
        Err(AddrError::Foreign {
            addr: r.addr() + r.len()
        })
    );
    let local = 0u64;
    let foreign = &local as *const u64 as usize;
    assert_eq!(
        mm.region_at(foreign),
        Err(AddrError::Foreign { addr: foreign })
    );
}

#[test]
fn unservable_fault_raises_sigbus_not_a_hang() {
    if std::env::var_os("FAULTLINE_CHILD").is_some() {
        // Child: one 2 MiB frame of budget, two 2 MiB pages touched. The
        // second fault finds no frame: the page is poisoned and this thread
        // gets SIGBUS.
        let mm = manager(2 * MIB);
        let r = mm
            .map(4 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
            .expect("map");
        // SAFETY: inside the region.
        unsafe { r.as_mut_ptr().write_volatile(1) };
        // SAFETY: inside the region; this access is the one that must SIGBUS.
        unsafe { r.as_mut_ptr().add(2 * MIB).write_volatile(1) };
        println!("second touch returned: no SIGBUS");
        std::process::exit(0);
    }
    assert_eq!(
        common::child_signal("unservable_fault_raises_sigbus_not_a_hang"),
        Some(libc::SIGBUS)
    );
}

#[test]
fn unservable_fault_is_reported() {
    // The same unservable fault taken in kernel mode: write(2) from the
    // poisoned page fails with EFAULT instead of raising SIGBUS, so this
    // process survives to check the report.
    let mm = manager(2 * MIB);
    let r = mm
        .map(4 * MIB, Zero, MapOptions::new().page_size(PageSize::Huge2M))
        .expect("map");
    set_byte(&r, 0, 1);
    assert_eq!(mm.stats().frames_free, 0);
    let second = r.addr() + 2 * MIB;
    assert_eq!(kernel_read(second), libc::EFAULT);
    let err = r.take_error().expect("the cause is queued");
    assert!(
        matches!(err, faultline::FaultError::NoFrame { addr, page_size: "2m", .. } if addr == second),
        "{err}"
    );
    assert!(mm.take_error().is_none(), "returned once");
    let st = settled(&mm);
    assert_eq!((st.poisoned, st.errors), (1, 1), "{st}");
    assert_eq!(r.resident_pages(), 1);
}

/// Fault-around is for walks: a lone touch far from any other page maps
/// its page alone; a touch next to a mapped page maps its whole window.
#[test]
fn fault_around_serves_walks_not_lone_touches() {
    let mut config = faultline::Config::default();
    config.budget = 16 * MIB;
    config.fault_around = 16;
    let mm = common::manager_with(config);
    let r = mm.map(MIB, Zero, MapOptions::new()).expect("map");
    set_byte(&r, 100 * 4096, 1);
    assert_eq!(r.resident_pages(), 1, "a lone touch in window 96..112");
    set_byte(&r, 200 * 4096, 2);
    assert_eq!(r.resident_pages(), 2, "another, in window 192..208");
    // A walk from page 100 up: the rest of window 96..112 one page at a
    // time (the window is no longer wholly absent), then window 112..128,
    // whose neighbour below (page 111) is mapped: the whole window.
    for p in 101..112 {
        set_byte(&r, p * 4096, 3);
    }
    assert_eq!(r.resident_pages(), 13);
    set_byte(&r, 112 * 4096, 4);
    assert_eq!(
        r.resident_pages(),
        29,
        "a walk into window 112..128 maps it whole"
    );
    // The region's first and last windows are walks' starts.
    set_byte(&r, 0, 5);
    set_byte(&r, MIB - 1, 6);
    assert_eq!(r.resident_pages(), 61);
    for (off, v) in [
        (100 * 4096, 1),
        (200 * 4096, 2),
        (112 * 4096, 4),
        (0, 5),
        (MIB - 1, 6),
    ] {
        assert_eq!(byte(&r, off), v);
    }
    assert_eq!(byte(&r, 113 * 4096), 0);
}

#[test]
fn fault_around_maps_aligned_runs() {
    for (fa, pcp) in [(16, true), (1, true), (16, false), (64, false)] {
        let mut config = faultline::Config::default();
        config.budget = 16 * MIB;
        config.fault_around = fa;
        config.experiment.pcp = pcp;
        let mm = common::manager_with(config);
        let r = mm.map(MIB, Zero, MapOptions::new()).expect("map");
        for p in 0..256 {
            assert_eq!(byte(&r, p * 4096 + 5), 0);
            set_byte(&r, p * 4096 + 5, p as u8 | 1);
        }
        for p in 0..256 {
            assert_eq!(byte(&r, p * 4096 + 5), p as u8 | 1);
        }
        let st = settled(&mm);
        assert_eq!(st.moves, 256 / fa as u64, "fault_around {fa}: {st}");
        assert_eq!(st.fault_around_pages, 256 - 256 / fa as u64);
        assert_eq!(r.resident_pages(), 256);
        drop(r);
        let st = common::all_free(&mm);
        assert_eq!(st.frames_free, st.frames_total, "{st}");
        assert_eq!(st.unmapped_pages, 256);
    }
}

#[test]
fn prezeroed_frames_serve_huge_faults_and_give_way_under_pressure() {
    // 40 MiB: the zeroing worker may hold up to 4 frames (it leaves twice
    // its reserve of 8 free), and touching all 20 pages needs them back.
    let mm = manager(40 * MIB);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while mm.stats().prezeroed_made == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the zeroing worker made no frame"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let r = mm
        .map(
            40 * MIB,
            Zero,
            MapOptions::new().page_size(PageSize::Huge2M),
        )
        .expect("map");
    // All 20 pages: the first faults take pre-zeroed frames, the last ones
    // need the reserve's frames given back to the allocator.
    for p in 0..20 {
        assert_eq!(byte(&r, p * 2 * MIB + 9), 0);
        set_byte(&r, p * 2 * MIB + 9, 1);
    }
    let st = settled(&mm);
    assert_eq!(st.poisoned, 0, "{st}");
    assert!(st.fills_prezeroed >= 1, "{st}");
    assert_eq!(st.frames_free, st.frames_prezeroed, "{st}");
    drop(r);
    let st = common::all_free(&mm);
    assert_eq!(st.frames_free, st.frames_total, "{st}");
}
