//! `mlockall(MCL_CURRENT | MCL_FUTURE)` before faultline maps anything: the
//! kernel would populate (and lock) every new mapping itself, so faultline
//! would never see a fault — reads returned zeros instead of the file, and
//! writes never reached it (finding 4 of the data-loss issue). faultline's
//! mappings are never locked; the program's own memory stays locked. Runs in
//! a child process (this test binary, re-executed): mlockall is process-wide.
//! Needs userfaultfd (root).

mod common;
use common::{manager, set_byte, ScratchDir, MIB};

const PAGE: usize = 4096;

fn child() {
    // SAFETY: mlockall has no memory-safety preconditions.
    let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    assert_eq!(rc, 0, "mlockall: {}", std::io::Error::last_os_error());
    let dir = ScratchDir::new("mlock");
    let pages = 512;
    let data: Vec<u8> = (0..pages * PAGE).map(|i| (i % 249) as u8 + 1).collect();
    let path = dir.file("data", &data);
    let mm = manager(4 * MIB);
    let r = common::map_file(&mm, &path, pages);
    let mut back = vec![0u8; r.len()];
    r.read_at(0, &mut back).expect("read_at");
    assert!(back == data, "the region reads the file");
    for p in 0..pages {
        set_byte(&r, p * PAGE + 7, 0);
    }
    r.flush().expect("flush");
    let on_disk = std::fs::read(&path).expect("read back");
    for p in 0..pages {
        assert_eq!(
            on_disk[p * PAGE + 7],
            0,
            "page {p}'s write reached the file"
        );
        assert_eq!(on_disk[p * PAGE + 8], data[p * PAGE + 8]);
    }
    let st = mm.stats();
    assert!(st.fills_store > 0, "faultline served the faults: {st}");
    assert!(mm.take_error().is_none());
    println!("mlock child: ok");
}

#[test]
fn mlockall_before_mapping_still_faults_to_faultline() {
    if common::in_child() {
        child();
        return;
    }
    common::run_in_child(
        "mlockall_before_mapping_still_faults_to_faultline",
        "mlock child: ok",
    );
}
