//! `fluxpipe tap STREAM...`: the records of chosen output streams of one or
//! several running pipelines, live, as `vector tap` shows a running
//! Vector's events: JSON Lines on standard output, from the query API's
//! `/api/v1/tap`, without reconfiguring anything.

use super::ask::{Client, Servers};
use crate::output::OutputStream;
use anyhow::{Result, bail};
use clap::Args;
use std::io::Write;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct TapArgs {
    /// Output streams to show: events, transitions, jobs, job_updates,
    /// resources, alerts, anomalies, dead_letter.
    #[arg(required = true, value_name = "STREAM")]
    pub streams: Vec<String>,
    /// Only records of this cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only records of this job (any id encoding).
    #[arg(long)]
    pub job: Option<String>,
    /// Only records of this node (host name, rankN or rank).
    #[arg(long)]
    pub node: Option<String>,
    /// Stop after this many records.
    #[arg(long, short = 'n')]
    pub count: Option<u64>,
    #[command(flatten)]
    pub servers: Servers,
}

pub fn run(args: TapArgs) -> Result<ExitCode> {
    for s in &args.streams {
        if OutputStream::parse(s).is_none() {
            let known: Vec<&str> = OutputStream::ALL.iter().map(|s| s.as_str()).collect();
            bail!("no stream {s:?} (the streams are {})", known.join(", "));
        }
    }
    let mut query = vec![("stream", args.streams.join(","))];
    for (key, value) in [
        ("cluster", &args.cluster),
        ("job", &args.job),
        ("node", &args.node),
    ] {
        if let Some(v) = value {
            query.push((key, v.clone()));
        }
    }
    let client = Client::new(&args.servers)?;
    let stdout = std::io::stdout();
    let mut shown = 0u64;
    let want = args.count.unwrap_or(u64::MAX);
    let mut out = stdout.lock();
    client.stream_lines("/api/v1/tap", &query, |line| {
        // A closed standard output (`| head`) ends the tap.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return false;
        }
        // A notice of records lost is not one of them.
        if !line.starts_with(r#"{"kind":"tap_dropped""#) {
            shown += 1;
        }
        shown < want
    })?;
    Ok(ExitCode::SUCCESS)
}
