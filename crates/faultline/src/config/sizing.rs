//! What a [`Config`] sizes by the CPUs it is built for: the default
//! workers and spare servers ([`Config::size_for_cpus`]), the fault-lock
//! table ([`Config::lock_table`]) and the read-ahead streams a region
//! remembers ([`Config::readahead_streams`]). Plain arithmetic, no locks.

use super::Config;

impl Config {
    /// Most workers a default configuration starts, whatever the CPUs.
    pub const DEFAULT_WORKERS_MAX: usize = 4;

    /// The default worker count for a machine of `cpus` CPUs: one per CPU,
    /// at most [`Config::DEFAULT_WORKERS_MAX`]. Every idle worker waits on
    /// the one userfaultfd, and the kernel wakes every waiter for each
    /// fault: on a 16-CPU guest a 4 KiB first touch took 56–62 µs with 16
    /// workers and 28–34 µs with 2 or 4 (docs/measurements.md, "Workers on
    /// many CPUs"). Store reads in flight beyond the workers are the
    /// spares' ([`Config::spare_servers`]).
    pub fn default_workers(cpus: usize) -> usize {
        cpus.clamp(1, Self::DEFAULT_WORKERS_MAX)
    }

    /// The default spare-server count for `cpus` CPUs: four per CPU,
    /// between 8 and 64. Store reads in flight are what a slow store's
    /// throughput follows (the kernel lets every faulting thread wait in
    /// its own read): 16 program threads on 16 CPUs get 68 servers, not
    /// the 5 of before (docs/design.md, "Spare servers"). A spare that is
    /// never called is a parked thread.
    pub fn default_spare_servers(cpus: usize) -> usize {
        (4 * cpus).clamp(8, 64)
    }

    /// Sequential streams a region recognizes at once: four per CPU, 16
    /// to 128 (program threads each reading their own part of a file;
    /// with fewer slots than streams each is forgotten before its next
    /// fault and none reads ahead). Searched on every store-backed fault
    /// under the region's stream lock, most recent first.
    pub fn readahead_streams(&self) -> usize {
        (4 * self.cpus).clamp(16, 128)
    }

    /// Sizes this config for `cpus` CPUs: [`Config::cpus`], and the worker
    /// and spare-server counts at their defaults for them (set either
    /// after this to override it).
    pub fn size_for_cpus(&mut self, cpus: usize) {
        self.cpus = cpus;
        self.workers = Config::default_workers(cpus);
        self.spare_servers = Config::default_spare_servers(cpus);
    }

    /// Every thread that serves faults from the userfaultfd: workers and
    /// spares.
    pub fn servers(&self) -> usize {
        self.workers + self.spare_servers
    }

    /// The fault lock table's size: [`crate::Experiment::fault_locks`] if set,
    /// else the next power of two of the largest of 64, 16 per CPU and 4
    /// per server (docs/design.md, "Spare servers"). Seed 003 sizes the kernel's
    /// table by CPUs: the locks are hashed, so two faults on distinct
    /// pages collide with a chance of about holders / locks, and a holder
    /// may wait in a store read (tens of µs to ms). Measured with 16
    /// threads and a manager sized for 16 CPUs (docs/measurements.md
    /// §15): 1.3% of lock takes waited with this table's 512 locks,
    /// 3.7–3.9% with 64.
    pub fn lock_table(&self) -> usize {
        self.experiment.fault_locks.unwrap_or_else(|| {
            64.max(16 * self.cpus)
                .max(4 * self.servers())
                .next_power_of_two()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigError;

    #[test]
    fn servers_and_locks_follow_the_cpus() {
        let on = |cpus: usize| {
            let mut c = Config::default();
            c.size_for_cpus(cpus);
            c
        };
        assert_eq!(on(1).servers(), 1 + 8);
        assert_eq!(on(2).servers(), 2 + 8);
        assert_eq!(on(16).servers(), 4 + 64);
        assert_eq!(on(200).servers(), 4 + 64);
        assert_eq!(on(2).lock_table(), 64);
        assert_eq!(on(16).lock_table(), 512, "16 x 16 CPUs < 4 x 68 servers");
        assert_eq!(on(64).lock_table(), 1024);
        assert_eq!(on(200).lock_table(), 4096);
        let mut c = on(16);
        c.experiment.fault_locks = Some(8);
        assert_eq!(c.lock_table(), 8, "an explicit size wins");
        c.spare_servers = 0;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::OutOfRange {
                field: "spare_servers",
                ..
            })
        ));
    }
}
