//! Gives `libumap.so` the soname `libumap.so`, as Umap's own library has, so
//! a program linked with `-lumap` finds ours on `LD_LIBRARY_PATH`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libumap.so");
}
