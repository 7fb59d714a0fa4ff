//! The Rust side of `crates/faultline-capi/bench/umap_vs_rust.sh`: the same
//! random 4 KiB-block reads as `bench/umap_random.c`, through the Rust API
//! with the manager libumap.so would build from the same `UMAP_*`
//! settings (budget `UMAP_BUFSIZE` pages rounded up to 2 MiB, workers
//! `UMAP_PAGE_FILLERS`, reclaim at 10% / 30% free). Prints one JSON row.
//! Usage: rust_random_reader FILE READS

use faultline::store::{File, FileOptions};
use faultline::{ManagerBuilder, MapOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, reads] = args.as_slice() else {
        return Err("usage: rust_random_reader FILE READS".into());
    };
    let reads: u64 = reads.parse()?;
    let num = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let mut c = faultline::Config::default();
    c.budget = (num("UMAP_BUFSIZE", 16384) * 4096).div_ceil(2 << 20) * (2 << 20);
    c.workers = num("UMAP_PAGE_FILLERS", 2);
    c.reclaim_low_pct = 10;
    c.reclaim_high_pct = 30;
    let mm = ManagerBuilder::from_config(c).build()?;
    let file = File::open(path, FileOptions::new())?;
    let len = std::fs::metadata(path)?.len() as usize;
    let r = mm.map_read_only(len, file, MapOptions::new())?;
    let blocks = (len / 4096) as u64;
    let mut seed = 0x5eedu64;
    let t0 = std::time::Instant::now();
    for _ in 0..reads {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let b = seed % blocks;
        // SAFETY: inside the region; a plain load, as the C program's.
        let w = unsafe { std::ptr::read_volatile(r.as_ptr().add(b as usize * 4096).cast::<u64>()) };
        let want = b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x0123_4567_89AB_CDEF;
        if w != want {
            return Err(format!("block {b} reads {w:#x}").into());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{{\"system\":\"faultline via the Rust API\",\"pattern\":\"random 4k reads\",\
         \"reads\":{reads},\"secs\":{secs:.4},\"reads_per_s\":{:.0}}}",
        reads as f64 / secs
    );
    Ok(())
}
