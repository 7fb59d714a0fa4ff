//! Gives `libfaultline.so` its soname, so programs linked with
//! `-lfaultline` record `libfaultline.so` and find it on `LD_LIBRARY_PATH`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfaultline.so");
}
