//! The `faultline` command: drives the library — the demo, and the
//! benchmarks the README lists ("Benchmarks"). It makes no system calls of its own beyond
//! what `faultline-sys` offers for the kernel baselines.

mod bench;
mod demo;
mod plot;
mod report;
mod soak;
mod stat;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "faultline",
    version,
    about = "A user-space virtual memory manager (userfaultfd + UFFDIO_MOVE)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Map a region larger than the touched set, touch it from 2 threads,
    /// print throughput and statistics.
    Demo(demo::DemoOpts),
    /// A long data-integrity run: random page reads and writes over a file
    /// 16x the budget, flushes, then every page checked after reopening.
    Soak(soak::SoakOpts),
    /// Run an experiment (the README's "Benchmarks" says what each measures).
    Bench {
        #[command(subcommand)]
        which: Which,
        /// Also draw the experiment's figure into this PNG file.
        #[arg(long, global = true)]
        plot: Option<std::path::PathBuf>,
    },
    /// Live statistics of the managers of a process (or of every process),
    /// read from the files they publish: `faultline stat [<pid>] [interval] [count]`.
    Stat(stat::StatOpts),
    /// Draw the figure of a saved `faultline bench <name> --json` report.
    Plot(plot::PlotOpts),
    /// One side of `bench out-of-core` or `bench far-memory`, run inside a memory cgroup.
    #[command(hide = true)]
    OocChild(bench::out_of_core::ChildArgs),
}

#[derive(Subcommand)]
enum Which {
    /// First-touch cost of a 4 KiB and a 2 MiB page: kernel vs faultline.
    Fault(bench::BenchOpts),
    /// Frame allocator cost per page for batches 1..16384: global, pcp, bulk.
    Alloc(bench::BenchOpts),
    /// T threads fault a region of 2 MiB pages: one fault lock vs the hashed table.
    ParallelFault(bench::BenchOpts),
    /// anon-w-seq: writers stream through 2 MiB pages faulted on demand, per fill order.
    ClearOrder(bench::BenchOpts),
    /// Region lookup cost and hit rate per cache scheme on build, database and replayed traces.
    Lookup(bench::BenchOpts),
    /// A file 4x the memory limit (or --data-mib), random and sequential reads and writes: faultline vs kernel mmap (unhinted and hinted) and the device's O_DIRECT limit.
    OutOfCore(bench::out_of_core::OocOpts),
    /// Far memory: a set 4x the budget over Redis, a Redis Cluster and a local file vs the kernel swapping to zram and to a swap file, and the raw Redis round trip.
    FarMemory(bench::far_memory::FarOpts),
    /// Migration between pools: 1 x 4 KiB, 512 x 4 KiB, 1 x 2 MiB; 1..N threads; per-page vs chunked copy; memcpy reference.
    Migrate(bench::BenchOpts),
    /// SQLite random point lookups on a database ~30x the budget: the faultline preload (LD_PRELOAD) vs the kernel's mmap and SQLite's own cache in memory cgroups of the same size.
    Preload(bench::preload::PreloadOpts),
}

fn main() -> anyhow::Result<()> {
    // Fault errors are logged as warnings on stderr (RUST_LOG overrides).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Demo(opts) => demo::run(&opts),
        Cmd::Soak(opts) => soak::run(&opts),
        Cmd::OocChild(a) => bench::out_of_core::child(&a),
        Cmd::Stat(o) => stat::run(&o),
        Cmd::Plot(o) => plot::run_file(&o),
        Cmd::Bench { which, plot } => {
            let (report, json) = match which {
                Which::Fault(o) => (bench::fault::run(&o)?, o.json),
                Which::Alloc(o) => (bench::alloc::run(&o)?, o.json),
                Which::ParallelFault(o) => (bench::parallel_fault::run(&o)?, o.json),
                Which::ClearOrder(o) => (bench::clear_order::run(&o)?, o.json),
                Which::Lookup(o) => (bench::lookup::run(&o)?, o.json),
                Which::OutOfCore(o) => (bench::out_of_core::run(&o)?, o.common.json),
                Which::Migrate(o) => (bench::migrate::run(&o)?, o.json),
                Which::FarMemory(o) => (bench::far_memory::run(&o)?, o.common.json),
                Which::Preload(o) => (bench::preload::run(&o)?, o.json),
            };
            report.print(json)?;
            if let Some(file) = plot {
                plot::draw(&report.json(), &file)?;
                eprintln!("figure written to {}", file.display());
            }
            Ok(())
        }
    }
}
