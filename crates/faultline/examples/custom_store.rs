//! A store of your own: pages computed on demand (here, every 8-byte word
//! holds its own byte offset), kept in a `HashMap` when written. Implement
//! [`Store`]: `read` fills a page, `write` takes a dirty page back, `flush`
//! makes writes durable, `writable` says whether writes are kept. A store's
//! error becomes the faulting thread's SIGBUS and a queued `FaultError`;
//! a panic in it is caught and reported the same way.
//!
//! `cargo run --example custom_store`

use faultline::{Manager, MapOptions, Store, StoreError};
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
struct Computed {
    written: Mutex<HashMap<u64, Vec<u8>>>,
}

impl Store for Computed {
    fn name(&self) -> &'static str {
        "computed"
    }

    fn writable(&self) -> bool {
        true
    }

    fn read(&self, page: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if let Some(bytes) = self.written.lock().map_err(|_| poisoned(page))?.get(&page) {
            buf.copy_from_slice(bytes);
            return Ok(());
        }
        let base = page * buf.len() as u64;
        for (i, word) in buf.chunks_mut(8).enumerate() {
            word.copy_from_slice(&(base + 8 * i as u64).to_le_bytes());
        }
        Ok(())
    }

    fn write(&self, page: u64, buf: &[u8]) -> Result<(), StoreError> {
        let mut w = self.written.lock().map_err(|_| poisoned(page))?;
        w.insert(page, buf.to_vec());
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

fn poisoned(page: u64) -> StoreError {
    StoreError::Io {
        op: "read",
        page,
        source: std::io::Error::other("a thread panicked holding the page map"),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mm = Manager::builder().budget(8 << 20).workers(2).build()?;
    let region = mm.map(32 << 20, Computed::default(), MapOptions::new())?;
    for offset in [0, 8, 4096, 1 << 20, (32 << 20) - 8] {
        assert_eq!(region.load_u64(offset)?, offset as u64);
    }
    region.store_u64(4096, 42)?;
    region.flush()?;
    assert_eq!(region.load_u64(4096)?, 42);
    println!(
        "computed store: reads are computed, writes kept; {}",
        mm.stats().faults()
    );
    Ok(())
}
