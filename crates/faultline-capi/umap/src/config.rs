//! Umap's configuration, read once from the environment as Umap reads it
//! (a variable that is unset, not a number, or 0 keeps the default) and
//! turned into a faultline manager's configuration.
//!
//! | variable | Umap's meaning | faultline |
//! |---|---|---|
//! | `UMAP_PAGESIZE` | page size (default: the system's) | 4096 or 2097152 |
//! | `UMAP_BUFSIZE` | buffer, in pages (default: 90% of free memory) | the budget, rounded up to 2 MiB; default capped at 1 GiB (the pool is real memory) |
//! | `UMAP_PAGE_FILLERS` | fill threads (default: CPUs) | fault workers |
//! | `UMAP_PAGE_EVICTORS` | evict threads (default: CPUs) | reported only: one reclaim thread evicts |
//! | `UMAP_EVICT_HIGH_WATER_THRESHOLD` | evict above this % full (90) | reclaim below 100 − it % free |
//! | `UMAP_EVICT_LOW_WATER_THRESHOLD` | evict down to this % full (70) | reclaim up to 100 − it % free |
//! | `UMAP_MAX_FAULT_EVENTS` | events read at once (256) | reported only: each worker reads its own |
//! | `UMAP_READ_AHEAD` | pages read ahead | largest read-ahead run (power of two ≤ 512) |
//! | `UMAP_MONITOR_FREQ` | print stats every N s (0: never) | the same, on stderr |
//! | `UMAP_LOG_LEVEL` | Umap's log level | ignored: faultline's warnings (every fault error, before its SIGBUS) go to stderr; `FAULTLINE_LOG` (a `tracing` filter, e.g. `info`, `off`) changes that |
//!
//! Invariant: read once per process (a `OnceLock`). Locks: none.

use std::sync::OnceLock;

/// The process's Umap settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UmapConfig {
    pub(crate) page_size: u64,
    pub(crate) buf_pages: u64,
    pub(crate) fillers: u64,
    pub(crate) evictors: u64,
    pub(crate) high_water: i32,
    pub(crate) low_water: i32,
    pub(crate) max_fault_events: u64,
    pub(crate) read_ahead: u64,
    pub(crate) monitor_secs: u64,
}

/// The default buffer's ceiling: faultline's pool is real memory, taken
/// when the manager starts.
const DEFAULT_BUF_MAX: u64 = 1 << 30;

fn env(name: &str) -> Option<u64> {
    let v: u64 = std::env::var(name).ok()?.trim().parse().ok()?;
    (v != 0).then_some(v)
}

/// `MemFree` from /proc/meminfo, in bytes (Umap's default buffer is 90%
/// of it).
fn mem_free() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("MemFree:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(DEFAULT_BUF_MAX, |kib| kib * 1024)
}

impl UmapConfig {
    fn from_env() -> UmapConfig {
        let cpus = faultline_sys::host::online_cpus() as u64;
        let page_size = env("UMAP_PAGESIZE").unwrap_or(faultline_sys::host::page_size() as u64);
        let default_buf = (mem_free() / 10 * 9).min(DEFAULT_BUF_MAX) / page_size.max(1);
        UmapConfig {
            page_size,
            buf_pages: env("UMAP_BUFSIZE").unwrap_or(default_buf.max(1)),
            fillers: env("UMAP_PAGE_FILLERS").unwrap_or(cpus),
            evictors: env("UMAP_PAGE_EVICTORS").unwrap_or(cpus),
            high_water: env("UMAP_EVICT_HIGH_WATER_THRESHOLD").map_or(90, |v| v.min(100) as i32),
            low_water: env("UMAP_EVICT_LOW_WATER_THRESHOLD").map_or(70, |v| v.min(100) as i32),
            max_fault_events: env("UMAP_MAX_FAULT_EVENTS").unwrap_or(256),
            read_ahead: env("UMAP_READ_AHEAD").unwrap_or(0),
            monitor_secs: env("UMAP_MONITOR_FREQ").unwrap_or(0),
        }
    }

    /// The process's settings (read from the environment on first use).
    pub(crate) fn get() -> &'static UmapConfig {
        static CONFIG: OnceLock<UmapConfig> = OnceLock::new();
        CONFIG.get_or_init(UmapConfig::from_env)
    }

    /// The page size as faultline's, or why it is not one.
    pub(crate) fn faultline_page(&self) -> Result<faultline::PageSize, String> {
        match self.page_size {
            4096 => Ok(faultline::PageSize::Base4K),
            0x20_0000 => Ok(faultline::PageSize::Huge2M),
            other => Err(format!(
                "UMAP_PAGESIZE={other}: faultline serves 4096 or 2097152-byte pages"
            )),
        }
    }

    /// The manager's configuration, or why there is none.
    pub(crate) fn manager_config(&self) -> Result<faultline::Config, String> {
        const HUGE: u64 = 0x20_0000;
        if !(0..=100).contains(&self.low_water) || self.low_water > self.high_water {
            return Err(format!(
                "UMAP_EVICT_LOW_WATER_THRESHOLD={} must be at most UMAP_EVICT_HIGH_WATER_THRESHOLD={}",
                self.low_water, self.high_water
            ));
        }
        let buffer = self
            .buf_pages
            .checked_mul(self.page_size)
            .ok_or_else(|| format!("UMAP_BUFSIZE={} pages is too large", self.buf_pages))?;
        let mut c = faultline::Config::default();
        c.budget = usize::try_from(buffer.div_ceil(HUGE).max(1) * HUGE)
            .map_err(|_| format!("UMAP_BUFSIZE={} pages is too large", self.buf_pages))?;
        c.workers = self.fillers.clamp(1, 1024) as usize;
        c.reclaim_low_pct = (100 - self.high_water) as usize;
        c.reclaim_high_pct = (100 - self.low_water) as usize;
        if self.read_ahead > 0 {
            c.readahead_max = (self.read_ahead.min(512) as usize)
                .next_power_of_two()
                .min(512);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(page_size: u64, buf_pages: u64) -> UmapConfig {
        UmapConfig {
            page_size,
            buf_pages,
            fillers: 2,
            evictors: 2,
            high_water: 90,
            low_water: 70,
            max_fault_events: 256,
            read_ahead: 0,
            monitor_secs: 0,
        }
    }

    #[test]
    fn any_buffer_size_becomes_whole_frames() {
        let one_page = config(4096, 1).manager_config().unwrap();
        assert_eq!(one_page.budget, 2 << 20);
        let big = config(4096, 1025).manager_config().unwrap();
        assert_eq!(big.budget, 6 << 20);
        assert_eq!((big.reclaim_low_pct, big.reclaim_high_pct), (10, 30));
    }

    #[test]
    fn bad_settings_are_refused_with_the_variable_named() {
        let e = config(65536, 1).faultline_page().unwrap_err();
        assert!(e.contains("UMAP_PAGESIZE=65536"), "{e}");
        let mut c = config(4096, 1);
        c.low_water = 95;
        let e = c.manager_config().unwrap_err();
        assert!(e.contains("UMAP_EVICT_LOW_WATER_THRESHOLD=95"), "{e}");
    }
}
