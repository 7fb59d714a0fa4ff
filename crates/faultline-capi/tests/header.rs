//! `include/faultline.h` is cbindgen's output for the current sources: this
//! test regenerates it and fails if the checked-in header is stale (run it
//! with `FAULTLINE_BLESS_HEADER=1` to rewrite the header).

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut fresh);
    let path = dir.join("include/faultline.h");
    if std::env::var_os("FAULTLINE_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write the header");
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "include/faultline.h is stale: regenerate it with \
         `FAULTLINE_BLESS_HEADER=1 cargo test -p faultline-capi --test header`"
    );
}
