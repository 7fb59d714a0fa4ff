//! `Region::pin`: pinned pages of a file region stay in memory while
//! reclaim churns through the rest of a file four times the budget, and
//! read back right; after `unpin` reclaim takes them again. Needs
//! userfaultfd with `UFFDIO_MOVE` (root).

mod common;

use common::{manager, ScratchDir, MIB};
use faultline::store::{File, FileOptions};
use faultline::{FaultError, MapOptions};

#[test]
fn pinned_pages_stay_through_reclaim_until_unpinned() {
    let dir = ScratchDir::new("pin");
    let path = dir.path().join("data");
    let mut data = vec![0u8; 32 * MIB];
    for (i, page) in data.chunks_mut(4096).enumerate() {
        page[..8].copy_from_slice(&(i as u64 ^ 0x9e37).to_le_bytes());
    }
    std::fs::write(&path, &data).expect("file");
    let mm = manager(8 * MIB);
    let file = File::open(&path, FileOptions::new().writable(true)).expect("open");
    let r = mm.map(32 * MIB, file, MapOptions::new()).expect("map");
    let pinned = 0..2 * MIB;
    assert!(matches!(
        r.pin(0..33 * MIB),
        Err(FaultError::BadRange { .. })
    ));
    r.pin(pinned.clone()).expect("pin 2 MiB");
    r.store_u64(4096, 42).expect("write a pinned page");
    let churn = |r: &faultline::Region| {
        for round in 0..3 {
            for page in (pinned.end / 4096..32 * MIB / 4096).step_by(1 + round) {
                let got = r.load_u64(page * 4096).expect("read");
                assert_eq!(got, page as u64 ^ 0x9e37, "page {page}");
            }
        }
    };
    churn(&r);
    assert!(mm.stats().evicted > 0, "no reclaim: {}", mm.stats());
    let resident = |r: &faultline::Region| {
        (pinned.start..pinned.end)
            .step_by(4096)
            .filter(|&off| r.is_resident(r.addr() + off).expect("inside"))
            .count()
    };
    assert_eq!(
        resident(&r),
        512,
        "pinned pages were reclaimed: {}",
        mm.stats()
    );
    assert_eq!(r.load_u64(4096).expect("read"), 42);
    assert_eq!(r.load_u64(8192).expect("read"), 2 ^ 0x9e37);
    r.unpin(pinned.clone()).expect("unpin");
    churn(&r);
    assert!(resident(&r) < 512, "unpinned pages stayed resident");
    assert_eq!(
        r.load_u64(4096).expect("read"),
        42,
        "written back and read again"
    );
}
