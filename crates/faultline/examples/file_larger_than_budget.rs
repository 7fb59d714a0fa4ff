//! A file four times larger than the memory budget, read and written
//! through a region: reclaim parks cold pages, writes dirty ones back and
//! reuses their frames, so the program sees all 64 MiB through 16 MiB of
//! memory. `close()` writes the last dirty pages back and says whether it
//! worked. Needs root (userfaultfd with `UFFDIO_MOVE`).
//!
//! `cargo run --example file_larger_than_budget`

use faultline::store::{File, FileOptions};
use faultline::{Manager, MapOptions};

const LEN: usize = 64 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("faultline-example-{}", std::process::id()));
    std::fs::write(&path, vec![0u8; LEN])?;
    let mm = Manager::builder().budget(16 << 20).workers(2).build()?;
    let store = File::open(&path, FileOptions::new().writable(true))?;
    let region = mm.map(LEN, store, MapOptions::new())?;
    // Stamp every page with its number, sequentially (read-ahead kicks in).
    for page in 0..LEN / 4096 {
        region.write_at(page * 4096, &(page as u64).to_le_bytes())?;
    }
    // Read them all back: most were evicted and come back from the file.
    for page in 0..LEN / 4096 {
        assert_eq!(region.load_u64(page * 4096)?, page as u64);
    }
    let stats = mm.stats();
    region.close().map_err(|(_, e)| e)?;
    // The file holds every stamp.
    let bytes = std::fs::read(&path)?;
    for page in 0..LEN / 4096 {
        let at = page * 4096;
        assert_eq!(bytes[at..at + 8], (page as u64).to_le_bytes());
    }
    std::fs::remove_file(&path)?;
    println!(
        "64 MiB file through a 16 MiB budget: {} pages evicted, {} written back, all {} stamps on disk",
        stats.evicted,
        stats.written_back,
        LEN / 4096
    );
    Ok(())
}
