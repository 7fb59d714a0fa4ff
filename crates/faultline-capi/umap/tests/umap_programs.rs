//! The Umap test programs (`crates/faultline-capi/tests/c/*.c`, written
//! against Umap's documented API only) built against `libumap.so` and run
//! with the buffer as small as one page and as large as the data, with
//! 4 KiB and 2 MiB `UMAP_PAGESIZE`. Needs userfaultfd and `cc`.

#[path = "../../tests/harness/mod.rs"]
mod harness;

/// Data size of every program, MiB.
const MIB: u64 = 16;

/// (page size, buffer pages): one page, and the whole data.
fn configs() -> Vec<(u64, u64)> {
    [4096u64, 2 << 20]
        .iter()
        .flat_map(|&p| [(p, 1), (p, (MIB << 20) / p)])
        .collect()
}

/// Builds `name` and runs it with `args` under every configuration.
fn run_matrix(name: &str, args: &[&str]) {
    harness::require_userfaultfd();
    for (page, buf) in configs() {
        let dir = harness::Scratch::new(&format!("{name}-{page}-{buf}"));
        let exe = harness::compile(name, "umap", &dir.0);
        let mut full = vec![dir.0.to_str().expect("utf-8 path")];
        full.extend_from_slice(args);
        let env = [
            ("UMAP_PAGESIZE", page.to_string()),
            ("UMAP_BUFSIZE", buf.to_string()),
            ("UMAP_PAGE_FILLERS", "2".to_string()),
        ];
        let out = harness::run(&exe, &full, &env);
        println!("{out}");
    }
}

#[test]
fn random_reader() {
    run_matrix("random_reader", &["16", "20000"]);
}

#[test]
fn sort_larger_than_the_buffer() {
    run_matrix("sort", &["16"]);
}

#[test]
fn writer_flush_and_pread() {
    run_matrix("writer", &["16"]);
}

#[test]
fn many_threads_fault_at_once() {
    run_matrix("threads", &["16", "2000"]);
}

#[test]
fn fetch_and_pin_keeps_pages_in_memory() {
    run_matrix("pin", &["16"]);
}

#[test]
fn where_faultline_is_right() {
    run_matrix("semantics", &[]);
}
