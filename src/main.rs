//! The `fluxpipe` command: argument parsing only; each command lives in `cli/`.

use clap::{Parser, Subcommand};
use fluxpipe::cli;
use std::process::ExitCode;

// jemalloc, as Vector runs on: millions of small, long-lived job entries
// made and freed by different threads fragment the system allocator's
// per-thread arenas (measured by `fluxpipe bench`, README "Benchmark").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "fluxpipe",
    version,
    about = "A streaming processor for Flux eventlogs"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Replay eventlogs and journals and print every job, rank and anomaly.
    Replay(cli::replay::ReplayArgs),
    /// Convert job ids between encodings, like `flux job id`.
    Id(cli::id::IdArgs),
    /// Run a streaming pipeline (a config file, or the built-in default).
    Run(cli::run::RunArgs),
    /// Check a pipeline config file and exit non-zero on any problem.
    Validate(cli::run::ValidateArgs),
    /// Write synthetic Flux traffic (journal JSON Lines or a KVS dump tree).
    Generate(cli::generate::GenerateArgs),
    /// Measure throughput, memory and latency on a generated workload.
    Bench(cli::bench::BenchArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Some(Command::Replay(a)) => cli::replay::run(a),
        Some(Command::Id(a)) => cli::id::run(a),
        Some(Command::Run(a)) => cli::run::run(a),
        Some(Command::Validate(a)) => cli::run::validate(a),
        Some(Command::Generate(a)) => cli::generate::run(a),
        Some(Command::Bench(a)) => cli::bench::run(a),
        // The embedded default: the default pipeline over the sample corpus.
        None => cli::run::run(cli::run::RunArgs::embedded_default()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fluxpipe: {e:#}");
            ExitCode::FAILURE
        }
    }
}
