//! `fluxpipe generate`: write synthetic Flux traffic (see [`crate::workload`]).

use crate::workload::{self, DEFAULT_START, Spec};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GenFormat {
    /// JSON Lines as a live feed carries them: job-manager and resource
    /// journal messages, exec events as envelopes.
    Journal,
    /// A `flux dump`-style KVS tree: job/…/eventlog, R, guest/exec/eventlog
    /// and resource/eventlog.
    Kvs,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Seed: the same seed and sizes give the same output.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of jobs.
    #[arg(long, default_value_t = 1000)]
    pub jobs: u64,
    /// Number of nodes (ranks) in the instance.
    #[arg(long, default_value_t = 16)]
    pub nodes: u32,
    #[arg(long, value_enum, default_value_t = GenFormat::Journal)]
    pub format: GenFormat,
    /// Output file (journal; `-` for standard output) or folder (kvs).
    #[arg(long)]
    pub out: PathBuf,
    /// Jobs that stop part way (DEPEND, SCHED, RUN) and never finish.
    #[arg(long)]
    pub active: bool,
    /// Seconds since the epoch of the first event.
    #[arg(long, default_value_t = DEFAULT_START)]
    pub start: u64,
}

pub fn run(args: GenerateArgs) -> Result<ExitCode> {
    let spec = Spec {
        seed: args.seed,
        jobs: args.jobs,
        nodes: args.nodes.max(1),
        active: args.active,
        start: args.start,
    };
    match args.format {
        GenFormat::Journal => {
            let (lines, bytes) = if args.out.as_os_str() == "-" {
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                let n = workload::write_journal(spec, &mut out)?;
                out.flush()?;
                n
            } else {
                let file = std::fs::File::create(&args.out)
                    .with_context(|| format!("cannot create {}", args.out.display()))?;
                let mut out = std::io::BufWriter::new(file);
                let n = workload::write_journal(spec, &mut out)
                    .with_context(|| format!("cannot write {}", args.out.display()))?;
                out.flush()?;
                n
            };
            eprintln!("fluxpipe generate: {lines} lines, {bytes} bytes");
        }
        GenFormat::Kvs => {
            let events = workload::write_kvs(spec, &args.out)
                .with_context(|| format!("cannot write {}", args.out.display()))?;
            eprintln!(
                "fluxpipe generate: {events} events under {}",
                args.out.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
