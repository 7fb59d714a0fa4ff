//! The first thing to run: a zero-filled region of 64 MiB under a 16 MiB
//! budget, of which only the pages touched take memory. Each first touch of
//! a 4 KiB page faults into faultline, which maps a zeroed frame (16 pages
//! at once: fault-around). Needs root (or `vm.unprivileged_userfaultfd=1`)
//! and a kernel with `UFFDIO_MOVE` (6.8+).
//!
//! `cargo run --example zero_region`

use faultline::{store::Zero, Manager, MapOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mm = Manager::builder().budget(16 << 20).workers(2).build()?;
    let region = mm.map(64 << 20, Zero, MapOptions::new())?;
    // Untouched pages read as zeros (the read faults them in).
    let mut buf = [0xffu8; 8];
    region.read_at(40 << 20, &mut buf)?;
    assert_eq!(buf, [0; 8]);
    // Write one word per 64 KiB page stride, from two threads at once.
    let words = region.atomics();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            s.spawn(move || {
                for i in (t as usize * 8192..words.len()).step_by(8192 * 2) {
                    words[i].store(i as u64 ^ 0xfa17, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    for i in (0..words.len()).step_by(8192) {
        assert_eq!(region.load_u64(i * 8)?, i as u64 ^ 0xfa17);
    }
    println!(
        "{} of {} pages resident after touching one word per 64 KiB",
        region.resident_pages(),
        region.len() / 4096
    );
    println!("{}", mm.stats());
    Ok(())
}
