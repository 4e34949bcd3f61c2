//! `fluxpipe id`: convert job ids like `flux job id`.

use crate::flux::jobid::{Encoding, JobId};
use anyhow::{Result, anyhow};
use clap::Args;
use std::io::Write;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct IdArgs {
    /// Target encoding: dec, f58, f58plain, hex, dothex, kvs, kvs-path, words.
    #[arg(long, default_value = "dec", value_parser = parse_encoding)]
    pub to: Encoding,
    /// Job ids in any encoding (read from standard input when none are given).
    pub ids: Vec<String>,
}

fn parse_encoding(s: &str) -> Result<Encoding> {
    Encoding::parse(s).ok_or_else(|| anyhow!("unknown encoding `{s}`"))
}

pub fn run(args: IdArgs) -> Result<ExitCode> {
    let inputs: Vec<String> = if args.ids.is_empty() {
        std::io::stdin().lines().collect::<Result<_, _>>()?
    } else {
        args.ids
    };
    let mut out = std::io::stdout().lock();
    let mut code = ExitCode::SUCCESS;
    for input in &inputs {
        match JobId::parse(input) {
            Ok(id) => writeln!(out, "{}", id.encode(args.to))?,
            Err(e) => {
                eprintln!("fluxpipe id: {e}");
                code = ExitCode::FAILURE;
            }
        }
    }
    Ok(code)
}
