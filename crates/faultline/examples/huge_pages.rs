//! 2 MiB pages: a fault maps a whole PMD-mapped 2 MiB frame (pre-zeroed by
//! a background worker when one is ready), so a region touched densely takes
//! 512 times fewer faults. Needs transparent huge pages in `madvise` or
//! `always` mode (`/sys/kernel/mm/transparent_hugepage/enabled`).
//!
//! `cargo run --example huge_pages`

use faultline::{store::Zero, Manager, MapOptions, PageSize};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mm = Manager::builder().budget(64 << 20).workers(2).build()?;
    let region = mm.map(
        32 << 20,
        Zero,
        MapOptions::new().page_size(PageSize::Huge2M),
    )?;
    let t = std::time::Instant::now();
    for offset in (0..region.len()).step_by(4096) {
        region.store_u64(offset, offset as u64)?;
    }
    let took = t.elapsed();
    for offset in (0..region.len()).step_by(4096) {
        assert_eq!(region.load_u64(offset)?, offset as u64);
    }
    let s = mm.stats();
    println!(
        "touched 8192 small pages of a 32 MiB region in {took:?}: {} faults of 2 MiB, {} frames pre-zeroed",
        s.faults_2m, s.fills_prezeroed
    );
    assert_eq!(s.faults_2m, 16);
    Ok(())
}
