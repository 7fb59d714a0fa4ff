//! The C store program (`tests/c/c_store.c`): a store written in C, through
//! `faultline.h` and `libfaultline.so`. Needs userfaultfd and `cc`.

#[path = "harness/mod.rs"]
mod harness;

#[test]
fn c_store_through_faultline_h() {
    harness::require_userfaultfd();
    let dir = harness::Scratch::new("c_store");
    let exe = harness::compile("c_store", "faultline", &dir.0);
    let out = harness::run(&exe, &[], &[]);
    assert!(out.contains("c_store:"), "{out}");
}
