//! `faultline bench <name>`: the experiments the README lists, each on the
//! real fault path with its baseline chosen through `Config`, in one run.

pub mod alloc;
mod cgroup;
pub mod clear_order;
pub mod far_memory;
pub mod fault;
pub mod lookup;
pub mod migrate;
pub mod out_of_core;
pub mod parallel_fault;
pub mod preload;

use faultline::Config;
use indicatif::{ProgressBar, ProgressStyle};

/// Options every benchmark takes.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchOpts {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Smaller sizes: the whole run takes well under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Fault workers (default: one per CPU, at most 4).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Spare servers: store-backed faults served at once beyond the
    /// workers (default: four per CPU, 8 to 64).
    #[arg(long)]
    pub spare_servers: Option<usize>,
    /// Fault locks in the hashed table, a power of two (default: 16 per
    /// CPU and 4 per server, at least 64: `Config::lock_table`).
    #[arg(long)]
    pub fault_locks: Option<usize>,
    /// Size the manager, and the bench's thread counts, for this many CPUs
    /// (default: the CPUs this process may run on): a run on a small
    /// machine shaped as it would be on a large one.
    #[arg(long)]
    pub cpus: Option<usize>,
    /// Wake one idle worker per fault event (`EPOLLEXCLUSIVE`) instead of
    /// every idle worker.
    #[arg(long)]
    pub exclusive_wake: bool,
    /// Do not pin workers to CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Workers busy-poll this many µs for the next event before blocking.
    #[arg(long)]
    pub spin_us: Option<u32>,
    /// Fault-around window for 4 KiB regions, in pages (1: off).
    #[arg(long)]
    pub fault_around: Option<usize>,
    /// Turn the per-CPU frame lists off (every alloc/free takes the zone lock).
    #[arg(long)]
    pub no_pcp: bool,
    /// Frames a per-CPU list refills or drains at once.
    #[arg(long)]
    pub pcp_batch: Option<usize>,
    /// Frames above which a per-CPU list drains.
    #[arg(long)]
    pub pcp_high: Option<usize>,
    /// Bytes per migration copy piece handed to a worker.
    #[arg(long)]
    pub migrate_chunk: Option<usize>,
    /// Do not publish the stats for `faultline stat` (to measure its cost).
    #[arg(long)]
    pub no_publish: bool,
    /// Do not hear the program's MADV_DONTNEED (`Config::program_removals`
    /// off: to measure its cost).
    #[arg(long)]
    pub no_removals: bool,
    /// How filled 4 KiB pages go into place (`Config::fill_model`):
    /// `auto` (the default: `copy-protected` with workers, `copy`
    /// in-thread), `copy`, `copy-protected` or `move`.
    #[arg(long, value_enum)]
    pub fill_model: Option<FillModelArg>,
    /// Free memory, in % of the pool, below which the background
    /// reclaimer starts (`Config::reclaim_low_pct`).
    #[arg(long)]
    pub reclaim_low_pct: Option<usize>,
    /// Free memory, in % of the pool, the background reclaimer frees up
    /// to (`Config::reclaim_high_pct`).
    #[arg(long)]
    pub reclaim_high_pct: Option<usize>,
}

/// `--fill-model`: [`faultline::FillModel`] on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FillModelArg {
    /// `FillModel::Auto`: copy-protected with workers, copy in-thread.
    Auto,
    /// `FillModel::Copy`.
    Copy,
    /// `FillModel::Move`.
    Move,
    /// `FillModel::CopyProtected`.
    CopyProtected,
}

impl From<FillModelArg> for faultline::FillModel {
    fn from(a: FillModelArg) -> Self {
        match a {
            FillModelArg::Auto => faultline::FillModel::Auto,
            FillModelArg::Copy => faultline::FillModel::Copy,
            FillModelArg::Move => faultline::FillModel::Move,
            FillModelArg::CopyProtected => faultline::FillModel::CopyProtected,
        }
    }
}

impl BenchOpts {
    /// The manager configuration these options ask for.
    pub fn config(&self) -> Config {
        let mut c = Config::default();
        // The CPUs first, with the worker and spare counts they default
        // to, then each count given. A lock table not given stays `None`,
        // sized by CPUs and servers at build (`Config::lock_table`).
        if let Some(n) = self.cpus {
            c.size_for_cpus(n);
        }
        if let Some(n) = self.workers {
            c.workers = n;
        }
        if let Some(n) = self.spare_servers {
            c.spare_servers = n;
        }
        if self.fault_locks.is_some() {
            c.experiment.fault_locks = self.fault_locks;
        }
        c.experiment.exclusive_wake = self.exclusive_wake;
        c.pin_workers = !self.no_pin;
        c.publish_stats = !self.no_publish;
        c.program_removals = !self.no_removals;
        if let Some(m) = self.fill_model {
            c.fill_model = m.into();
        }
        if let Some(s) = self.spin_us {
            c.experiment.spin_us = s;
        }
        if let Some(f) = self.fault_around {
            c.fault_around = f;
        }
        c.experiment.pcp = !self.no_pcp;
        if let Some(b) = self.pcp_batch {
            c.experiment.pcp_batch = b;
        }
        if let Some(h) = self.pcp_high {
            c.experiment.pcp_high = h;
        }
        if let Some(m) = self.migrate_chunk {
            c.experiment.migrate_chunk = m;
        }
        if let Some(p) = self.reclaim_low_pct {
            c.reclaim_low_pct = p;
        }
        if let Some(p) = self.reclaim_high_pct {
            c.reclaim_high_pct = p;
        }
        c
    }

    /// These options as a child's command line (`faultline ooc-child`
    /// flattens `BenchOpts` too), every one the parent set but `--json`
    /// and `--quick`: a child builds the manager the parent's options ask
    /// for. Destructured whole, so an option added here and not passed on
    /// does not compile.
    pub(crate) fn child_args(&self) -> Vec<String> {
        let BenchOpts {
            json: _,
            quick: _,
            workers,
            spare_servers,
            fault_locks,
            cpus,
            exclusive_wake,
            no_pin,
            spin_us,
            fault_around,
            no_pcp,
            pcp_batch,
            pcp_high,
            migrate_chunk,
            no_publish,
            no_removals,
            fill_model,
            reclaim_low_pct,
            reclaim_high_pct,
        } = self;
        let counts = [
            ("--workers", *workers),
            ("--spare-servers", *spare_servers),
            ("--fault-locks", *fault_locks),
            ("--cpus", *cpus),
            ("--spin-us", spin_us.map(|n| n as usize)),
            ("--fault-around", *fault_around),
            ("--pcp-batch", *pcp_batch),
            ("--pcp-high", *pcp_high),
            ("--migrate-chunk", *migrate_chunk),
            ("--reclaim-low-pct", *reclaim_low_pct),
            ("--reclaim-high-pct", *reclaim_high_pct),
        ];
        let switches = [
            ("--exclusive-wake", *exclusive_wake),
            ("--no-pin", *no_pin),
            ("--no-pcp", *no_pcp),
            ("--no-publish", *no_publish),
            ("--no-removals", *no_removals),
        ];
        let model = fill_model.map(|m| {
            let name = clap::ValueEnum::to_possible_value(&m)
                .map(|v| v.get_name().to_string())
                .unwrap_or_default();
            ["--fill-model".to_string(), name]
        });
        counts
            .into_iter()
            .filter_map(|(flag, v)| v.map(|n| [flag.to_string(), n.to_string()]))
            .flatten()
            .chain(
                switches
                    .into_iter()
                    .filter(|&(_, on)| on)
                    .map(|(flag, _)| flag.to_string()),
            )
            .chain(model.into_iter().flatten())
            .collect()
    }
}

/// Thread counts for a sweep on `cpus` CPUs: 1, 2, 4, ... up to twice the
/// CPUs (the last one `2 x cpus` even when that is not a power of two).
pub fn thread_sweep(cpus: usize) -> Vec<usize> {
    let top = 2 * cpus.max(1);
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |&t| Some(t * 2))
        .take_while(|&t| t < top)
        .collect();
    v.push(top);
    v
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what.to_string());
    bar
}

/// The clocks of a timed run, read at its start: wall time, the
/// process's CPU time (every thread, with the kernel's work in their
/// system calls and faults) and its major faults. Read again at its end
/// for a rate, the CPU per item done and the kernel's misses.
pub struct RunClocks {
    at: std::time::Instant,
    cpu: Option<std::time::Duration>,
    major_faults: Option<u64>,
}

impl RunClocks {
    pub fn start() -> RunClocks {
        RunClocks {
            cpu: faultline_sys::host::process_cpu_time(),
            major_faults: faultline_sys::host::process_major_faults(),
            at: std::time::Instant::now(),
        }
    }

    /// The process's major faults since the start (every thread): the
    /// kernel's misses, each a wait for the device. `None` if they could
    /// not be counted.
    pub fn major_faults(&self) -> Option<u64> {
        let now = faultline_sys::host::process_major_faults()?;
        Some(now.saturating_sub(self.major_faults?))
    }

    /// Seconds since the start.
    pub fn secs(&self) -> f64 {
        self.at.elapsed().as_secs_f64()
    }

    /// The process's CPU time since the start per item of `items`, µs;
    /// `None` if the CPU clock could not be read or nothing was done.
    pub fn cpu_us_per(&self, items: f64) -> Option<f64> {
        let now = faultline_sys::host::process_cpu_time()?;
        let used = now.saturating_sub(self.cpu?);
        (items > 0.0).then(|| used.as_secs_f64() * 1e6 / items)
    }
}

/// A small deterministic generator (xorshift64), so runs are repeatable.
pub fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::thread_sweep;

    #[test]
    fn sweeps_reach_twice_the_cpus() {
        assert_eq!(thread_sweep(1), vec![1, 2]);
        assert_eq!(thread_sweep(2), vec![1, 2, 4]);
        assert_eq!(thread_sweep(16), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(thread_sweep(12), vec![1, 2, 4, 8, 16, 24]);
    }
}
