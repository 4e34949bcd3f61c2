//! `fluxpipe bench`: throughput, memory and latency of the real pipeline
//! on one generated workload, so that a change to the hot path is judged
//! by numbers against a baseline (BENCHMARKS.md keeps them).
//!
//! Every figure is measured in this process or on a `fluxpipe run` child
//! (this same executable) fed the workload, so the pipeline measured is the
//! real one, with its process, channels and sinks:
//!
//! - baselines: `serde_json` parsing of the workload's lines into a typed
//!   struct with every `context` (and R) left raw, and into a `Value`;
//! - end to end: standard input (the workload file) → operators → a
//!   `blackhole` sink, and → a `file` sink, with 1 worker and with one per
//!   core; the run ends when the pipeline has drained and exited at EOF;
//!   the best of three runs, as the baselines are the best of three passes;
//! - memory: K never-finishing jobs fed on standard input (kept open), read
//!   from /proc once every planned transition has come out;
//! - latency: a TCP socket source fed at a fixed rate, transitions read
//!   from the child's standard output, both instants taken here;
//! - queries: the 1-worker blackhole run again, with a client asking the
//!   query API back to back while the input flows.

use crate::workload::{self, Entry, Spec, Workload};
use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Events in the throughput workload (default 1000000; 100000 with --short).
    #[arg(long)]
    pub events: Option<u64>,
    /// Active jobs for the memory figure (default 1000000; 20000 with --short).
    #[arg(long)]
    pub active_jobs: Option<u64>,
    /// Input rate of the latency figure, events/s (default 100000; 10000 with --short).
    #[arg(long)]
    pub rate: Option<u64>,
    /// Seconds of input for the latency figure (default 10; 3 with --short).
    #[arg(long)]
    pub latency_secs: Option<u64>,
    /// Small sizes, to keep the benchmark working in CI (under a minute).
    #[arg(long)]
    pub short: bool,
    /// Seed of the generated workload: the same seed gives the same input.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Nodes in the generated instance.
    #[arg(long, default_value_t = 64)]
    pub nodes: u32,
    /// Only parse FILE's lines with the typed baseline, once, and print how
    /// many: the cost gate counts its instructions beside replay's.
    #[arg(long, hide = true, value_name = "FILE")]
    pub parse_only: Option<PathBuf>,
}

/// A work folder removed when the benchmark ends.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Average events per generated job, to size a workload by events.
const EVENTS_PER_JOB: u64 = 20;

const MIB: f64 = 1024.0 * 1024.0;

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(workload::DEFAULT_START, |d| d.as_secs())
}

pub fn run(args: BenchArgs) -> Result<ExitCode> {
    if let Some(path) = &args.parse_only {
        return parse_only(path);
    }
    let short = args.short;
    let events = args
        .events
        .unwrap_or(if short { 100_000 } else { 1_000_000 });
    let active = args
        .active_jobs
        .unwrap_or(if short { 20_000 } else { 1_000_000 });
    let rate = args
        .rate
        .unwrap_or(if short { 10_000 } else { 100_000 })
        .max(1);
    let latency_secs = args
        .latency_secs
        .unwrap_or(if short { 3 } else { 10 })
        .max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let exe = std::env::current_exe().context("cannot find the fluxpipe executable")?;
    let dir = WorkDir(std::env::temp_dir().join(format!("fluxpipe-bench-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)
        .with_context(|| format!("cannot create {}", dir.0.display()))?;
    let mut out = std::io::stdout().lock();

    // The workload, on disk: the pipeline reads it as a file on stdin.
    let input = dir.0.join("workload.jsonl");
    let spec = Spec {
        seed: args.seed,
        jobs: (events / EVENTS_PER_JOB).max(1),
        nodes: args.nodes.max(1),
        active: false,
        start: now_secs(),
    };
    let jobs = spec.jobs;
    {
        let file = std::fs::File::create(&input)
            .with_context(|| format!("cannot create {}", input.display()))?;
        let mut w = std::io::BufWriter::new(file);
        workload::write_journal(spec, &mut w)?;
        w.flush()?;
    }
    let data = std::fs::read(&input)?;
    let lines = lines_of(&data);
    let n = lines.len() as u64;
    let bytes = data.len() as f64;
    writeln!(
        out,
        "workload: {n} lines, {:.1} MiB, {jobs} jobs, {} nodes, seed {}, {cores} cores, load average {}",
        bytes / MIB,
        args.nodes.max(1),
        args.seed,
        load_average()
    )?;
    out.flush()?;

    let rate_line = |secs: f64| (n as f64 / secs, bytes / MIB / secs);
    let typed = best_of(3, || parse_typed(&lines))?;
    let (typed_eps, typed_mibs) = rate_line(typed);
    writeln!(
        out,
        "baseline serde_json typed (context raw): {typed_eps:.0} events/s, {typed_mibs:.1} MiB/s"
    )?;
    let value = best_of(3, || parse_value(&lines))?;
    let (v_eps, v_mibs) = rate_line(value);
    writeln!(
        out,
        "baseline serde_json Value: {v_eps:.0} events/s, {v_mibs:.1} MiB/s"
    )?;
    out.flush()?;
    drop(lines);
    drop(data);

    let mut worker_counts = vec![1];
    if cores > 1 {
        worker_counts.push(cores);
    }
    // Each pipeline runs PIPELINE_RUNS times, in rounds over all of them
    // (a slow spell of the machine falls on every one alike), and the
    // best run counts, as the baselines' best pass does; the slowest is
    // shown beside it.
    let configs: Vec<(SinkKind, usize)> = [SinkKind::Blackhole, SinkKind::File]
        .into_iter()
        .flat_map(|sink| worker_counts.iter().map(move |&w| (sink, w)))
        .collect();
    let mut times = vec![Vec::new(); configs.len()];
    let mut replays = Vec::new();
    let mut queries: Vec<Queried> = Vec::new();
    for _ in 0..PIPELINE_RUNS {
        for (i, &(sink, workers)) in configs.iter().enumerate() {
            times[i].push(pipeline(&exe, &dir.0, &input, workers, sink, None)?);
        }
        replays.push(replay(&exe, &input)?);
        queries.push(queried(&exe, &dir.0, &input)?);
    }
    for (&(sink, workers), secs) in configs.iter().zip(&times) {
        let best = secs.iter().copied().fold(f64::INFINITY, f64::min);
        let slowest = secs.iter().copied().fold(0.0, f64::max);
        let (eps, mibs) = rate_line(best);
        writeln!(
            out,
            "fluxpipe stdin -> operators -> {}, {workers} worker{}: {eps:.0} events/s, {mibs:.1} MiB/s, {:.3}x typed baseline (best of {PIPELINE_RUNS} runs; slowest {:.0} events/s)",
            sink.name(),
            if workers == 1 { "" } else { "s" },
            eps / typed_eps,
            rate_line(slowest).0,
        )?;
    }
    // The same as the first line, with one client asking the query API
    // back to back while the input flows.
    if let Some(q) = queries.iter().min_by(|a, b| a.secs.total_cmp(&b.secs)) {
        let unqueried = times[0].iter().copied().fold(f64::INFINITY, f64::min);
        let (eps, mibs) = rate_line(q.secs);
        let answers: Vec<String> = QUERIED_PATHS
            .iter()
            .zip(&q.paths)
            .map(|(path, (n, p50, p99))| {
                format!("{path}: {n} answers, p50 {p50:.3} ms, p99 {p99:.3} ms")
            })
            .collect();
        writeln!(
            out,
            "fluxpipe stdin -> operators -> blackhole, 1 worker, queried back to back: {eps:.0} events/s, {mibs:.1} MiB/s, {:.3}x typed baseline, {:.2}x the unqueried run; asked by turns, {} (best of {PIPELINE_RUNS} runs)",
            eps / typed_eps,
            unqueried / q.secs,
            answers.join("; "),
        )?;
    }
    let best = replays.iter().copied().fold(f64::INFINITY, f64::min);
    let slowest = replays.iter().copied().fold(0.0, f64::max);
    let (eps, mibs) = rate_line(best);
    writeln!(
        out,
        "fluxpipe replay (file -> processor -> JSON): {eps:.0} events/s, {mibs:.1} MiB/s, {:.3}x typed baseline (best of {PIPELINE_RUNS} runs; slowest {:.0} events/s)",
        eps / typed_eps,
        rate_line(slowest).0,
    )?;
    out.flush()?;

    let mem = memory(&exe, &dir.0, active, args.seed, args.nodes.max(1))?;
    writeln!(
        out,
        "peak resident memory, {active} active jobs: {:.1} MiB (idle pipeline {:.1} MiB, settled {:.1} MiB)",
        mem.hwm_kib as f64 / 1024.0,
        mem.idle_kib as f64 / 1024.0,
        mem.rss_kib as f64 / 1024.0
    )?;
    let per_job = mem.hwm_kib.saturating_sub(mem.idle_kib) as f64 * 1024.0 / active.max(1) as f64;
    writeln!(
        out,
        "bytes per active job: {per_job:.0} (peak minus idle, over {active} jobs; fed in {:.1} s)",
        mem.fed_secs
    )?;
    out.flush()?;

    let lat = latency(
        &exe,
        &dir.0,
        rate,
        latency_secs,
        args.seed,
        args.nodes.max(1),
    )?;
    writeln!(
        out,
        "latency socket write -> transition out at {rate} events/s: p50 {:.3} ms, p99 {:.3} ms ({} transitions, max {:.3} ms)",
        lat.p50_ms, lat.p99_ms, lat.count, lat.max_ms
    )?;
    // One shard, and as many as the pipeline runs by default (one per
    // core), each taking over its part on a thread of its own.
    let mut shard_counts = vec![1];
    if cores > 1 {
        shard_counts.push(cores);
    }
    for shards in shard_counts {
        let ck = checkpoint_times(&dir.0, active, args.seed, args.nodes.max(1), shards)?;
        let label = if shards == 1 {
            "1 worker".to_string()
        } else {
            format!("{shards} workers")
        };
        writeln!(
            out,
            "checkpoint time, {active} active jobs and {} alert conditions, {label}: {:.3} s ({:.1} MiB, {:.0} bytes per job; encode + fsync'd write)",
            ck.conditions,
            ck.write_secs,
            ck.bytes as f64 / (1024.0 * 1024.0),
            ck.bytes as f64 / active.max(1) as f64
        )?;
        writeln!(
            out,
            "restore time, {active} active jobs, {label}: {:.3} s (read + verify + decode, each part dealt out by key and taken over by the shards while the next are decoded)",
            ck.restore_secs,
        )?;
    }
    writeln!(out, "load average at the end: {}", load_average())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

struct CheckpointTimes {
    write_secs: f64,
    restore_secs: f64,
    bytes: usize,
    /// Alert conditions held with the jobs.
    conditions: usize,
}

/// Save and restore the state of `jobs` active jobs, in process, through
/// `n` shards as the pipeline runs them: their jobs and alert conditions
/// (the default rules) encoded into scratch files side by side and stored;
/// then read, verified, decoded, dealt out by key and taken over by new
/// shards side by side.
fn checkpoint_times(
    dir: &Path,
    jobs: u64,
    seed: u64,
    nodes: u32,
    n: usize,
) -> Result<CheckpointTimes> {
    use crate::channels::router::{Routed, Router, SourceInfo};
    use crate::checkpoint::file::{self as checkpoint, Head};
    use crate::decode::{Format, Origin, decode_line};
    use crate::operators::shard::{self, AlertSetup, Retention, Shard};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let folder = dir.join(format!("checkpoint-{n}"));
    std::fs::create_dir_all(&folder)?;
    let rules = crate::keyed::alerts::rule::default_rules();
    let new_shards = || -> Vec<Shard> {
        (0..n)
            .map(|index| {
                let (outputs, _) = crate::channels::fanout::Outputs::new(std::iter::empty());
                Shard::new(
                    outputs,
                    Retention {
                        inactive_grace: Duration::from_secs(60),
                        orphan_ttl: Duration::from_secs(60),
                        max_jobs: usize::MAX,
                        max_finished: 1_000_000,
                        // A million jobs from now on run hours ahead.
                        max_clock_skew: f64::INFINITY,
                    },
                    Default::default(),
                    Default::default(),
                    AlertSetup {
                        rules: rules.clone(),
                        ..AlertSetup::default()
                    },
                )
                .with_sources(&[SourceInfo::new("bench", "bench")])
                .with_spill(folder.clone(), index, checkpoint::encode_threads(n))
            })
            .collect()
    };
    let mut shards = new_shards();
    let spec = Spec {
        seed,
        jobs,
        nodes,
        active: true,
        start: now_secs(),
    };
    let origin = Origin::default();
    runtime.block_on(async {
        let mut line = Vec::with_capacity(512);
        for entry in Workload::new(spec) {
            line.clear();
            entry.journal_line(&mut line)?;
            for record in decode_line(&line, &origin, Format::Auto).records {
                let i = Router::shard_index(n, "bench", record.id.map(|id| id.0));
                let routed = Routed {
                    source: 0,
                    partition: None,
                    record,
                };
                if let Some(shard) = shards.get_mut(i) {
                    shard.apply(routed).await;
                }
            }
        }
        for shard in &mut shards {
            shard.flush().await;
        }
        anyhow::Ok(())
    })?;
    let conditions: usize = shards.iter().map(Shard::alert_conditions).sum();
    let start = Instant::now();
    let replies = std::thread::scope(|scope| {
        let encoders: Vec<_> = shards
            .iter_mut()
            .map(|shard| scope.spawn(move || shard.snapshot()))
            .collect();
        encoders
            .into_iter()
            .map(|e| {
                e.join()
                    .map_err(|_| anyhow!("a shard's encoder panicked"))?
                    .map_err(anyhow::Error::from)
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let parts: Vec<_> = replies.into_iter().map(|r| r.state).collect();
    let bytes = checkpoint::store(&folder, &Head::default(), &parts)?;
    let write_secs = start.elapsed().as_secs_f64();
    drop(parts);
    drop(shards);
    // Timed as a start does it: the checkpoint opened, then its parts
    // decoded while the shards take them over.
    let start = Instant::now();
    let mut restored = new_shards();
    let opened = checkpoint::open_in(&folder)?.ok_or_else(|| anyhow!("the checkpoint is gone"))?;
    shard::restore_from(&mut restored, opened.parts, |c, id| {
        Router::shard_index(n, c, id)
    })?;
    let restore_secs = start.elapsed().as_secs_f64();
    let held: usize = restored.iter().map(Shard::jobs_tracked).sum();
    let kept: usize = restored.iter().map(Shard::alert_conditions).sum();
    if held as u64 != jobs || kept != conditions {
        bail!("restored {held} jobs of {jobs}, {kept} alert conditions of {conditions}");
    }
    Ok(CheckpointTimes {
        write_secs,
        restore_secs,
        bytes,
        conditions,
    })
}

/// The 1-minute load average: other work on the machine moves every
/// timing, so the figures carry it.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// How many times each pipeline runs for its throughput figure.
const PIPELINE_RUNS: usize = 3;

/// The shortest of `n` timed runs, in seconds.
fn best_of(n: usize, mut f: impl FnMut() -> Result<u64>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..n {
        let t = Instant::now();
        let count = f()?;
        std::hint::black_box(count);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best.max(1e-9))
}

/// An RFC 18 event with its context left unparsed.
#[derive(Deserialize)]
struct TypedEvent<'a> {
    timestamp: f64,
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    context: Option<Box<RawValue>>,
}

/// Every line form the workload has (journals, envelopes), typed.
#[derive(Deserialize)]
struct TypedLine<'a> {
    #[serde(default)]
    id: Option<i64>,
    #[serde(default, borrow)]
    events: Option<Vec<TypedEvent<'a>>>,
    #[serde(default, borrow)]
    stream: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    event: Option<TypedEvent<'a>>,
    #[serde(default, borrow)]
    cluster: Option<Cow<'a, str>>,
    #[serde(default, rename = "R")]
    r: Option<Box<RawValue>>,
    #[serde(default)]
    jobspec: Option<Box<RawValue>>,
}

/// The non-empty lines of `data`, found with memchr as `replay`'s reader
/// finds them: the baseline should not pay more to split than fluxpipe.
fn lines_of(data: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::new();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', data).chain(std::iter::once(data.len())) {
        if end > start {
            lines.push(&data[start..end]);
        }
        start = end + 1;
    }
    lines
}

/// The typed baseline alone, over one file's lines.
fn parse_only(path: &Path) -> Result<ExitCode> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let lines = lines_of(&data);
    let seen = parse_typed(&lines)?;
    println!("{} lines parsed ({seen})", lines.len());
    Ok(ExitCode::SUCCESS)
}

fn parse_typed(lines: &[&[u8]]) -> Result<u64> {
    let mut seen = 0u64;
    for line in lines {
        let l: TypedLine = serde_json::from_slice(line)?;
        let evs = l.events.iter().flatten().chain(l.event.iter());
        for ev in evs {
            seen += ev.name.len() as u64
                + u64::from(ev.timestamp > 0.0)
                + u64::from(ev.context.is_some());
        }
        seen += u64::from(l.id.is_some())
            + u64::from(l.stream.is_some())
            + u64::from(l.cluster.is_some())
            + u64::from(l.r.is_some())
            + u64::from(l.jobspec.is_some());
    }
    Ok(seen)
}

fn parse_value(lines: &[&[u8]]) -> Result<u64> {
    let mut seen = 0u64;
    for line in lines {
        let v: serde_json::Value = serde_json::from_slice(line)?;
        seen += v.as_object().map_or(0, |m| m.len() as u64);
    }
    Ok(seen)
}

#[derive(Debug, Clone, Copy)]
enum SinkKind {
    Blackhole,
    File,
}

impl SinkKind {
    fn name(self) -> &'static str {
        match self {
            SinkKind::Blackhole => "blackhole",
            SinkKind::File => "file",
        }
    }
}

const INPUTS: &str = r#"inputs = ["transitions", "jobs", "resources", "anomalies", "alerts"]"#;

fn write_config(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

fn toml_path(p: &Path) -> String {
    // TOML basic strings take the same escapes as Rust's Debug for paths
    // made of ordinary characters.
    format!("{:?}", p.display().to_string())
}

/// Run the pipeline over `input` on its standard input; seconds until it
/// has drained and exited.
fn pipeline(
    exe: &Path,
    dir: &Path,
    input: &Path,
    workers: usize,
    sink: SinkKind,
    api: Option<u16>,
) -> Result<f64> {
    let name = format!(
        "{}-{workers}{}",
        sink.name(),
        if api.is_some() { "-api" } else { "" }
    );
    let api_text = api.map_or_else(String::new, |port| {
        format!("[api]\naddress = \"127.0.0.1:{port}\"\n")
    });
    let state = dir.join(format!("state-{name}"));
    let records = dir.join(format!("records-{name}.jsonl"));
    let sink_text = match sink {
        SinkKind::Blackhole => format!("[sinks.out]\ntype = \"blackhole\"\n{INPUTS}\n"),
        SinkKind::File => format!(
            "[sinks.out]\ntype = \"file\"\npath = {}\n{INPUTS}\n",
            toml_path(&records)
        ),
    };
    let config = write_config(
        dir,
        &name,
        &format!(
            "data_dir = {}\nworkers = {workers}\n[sources.in]\ntype = \"stdin\"\ncluster = \"bench\"\n{sink_text}{api_text}",
            toml_path(&state)
        ),
    )?;
    let stdin = std::fs::File::open(input)?;
    let start = Instant::now();
    let out = Command::new(exe)
        .arg("run")
        .arg("--config")
        .arg(&config)
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("cannot run the pipeline")?;
    let secs = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "pipeline {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_file(&records);
    Ok(secs.max(1e-9))
}

/// A run of the 1-worker blackhole pipeline with its query API asked.
struct Queried {
    secs: f64,
    /// Per path asked: answers, p50 and p99 in ms.
    paths: Vec<(usize, f64, f64)>,
}

/// What the queried run asks, by turns.
const QUERIED_PATHS: [&str; 4] = [
    "/api/v1/jobs?limit=100",
    "/api/v1/clusters",
    "/api/v1/alerts?limit=100",
    "/",
];

/// The 1-worker blackhole pipeline with the query API on, one client
/// asking it back to back (a page of jobs, the clusters' counts, a page of
/// what fires, the status page) for
/// as long as it runs: does a query stall ingest, and how long does an
/// answer take behind a flood of records.
fn queried(exe: &Path, dir: &Path, input: &Path) -> Result<Queried> {
    let port = free_port()?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asking = {
        let stop = stop.clone();
        std::thread::spawn(move || -> Result<Vec<Vec<f64>>> {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(30))
                    .build()?;
                let paths = QUERIED_PATHS;
                let mut times = vec![Vec::new(); paths.len()];
                let mut turn = 0;
                while !stop.load(Ordering::Relaxed) {
                    let path = turn % paths.len();
                    let url = format!("http://127.0.0.1:{port}{}", paths[path]);
                    let start = Instant::now();
                    let answered = match client.get(&url).send().await {
                        Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                        _ => false,
                    };
                    if answered {
                        times[path].push(start.elapsed().as_secs_f64() * 1e3);
                        turn += 1;
                    } else {
                        // Not listening yet, or gone.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                Ok(times)
            })
        })
    };
    let secs = pipeline(exe, dir, input, 1, SinkKind::Blackhole, Some(port));
    stop.store(true, Ordering::Relaxed);
    let times = asking
        .join()
        .map_err(|_| anyhow!("the querying thread panicked"))??;
    let secs = secs?;
    let paths = times
        .into_iter()
        .map(|mut times| {
            times.sort_by(f64::total_cmp);
            let at = |q: f64| {
                times
                    .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or(0.0)
            };
            (times.len(), at(0.5), at(0.99))
        })
        .collect();
    Ok(Queried { secs, paths })
}

/// `fluxpipe replay` of the workload with the built-in rules, its JSON
/// to nowhere: the time it takes, seconds.
fn replay(exe: &Path, input: &Path) -> Result<f64> {
    let start = Instant::now();
    let out = Command::new(exe)
        .args(["replay", "--format", "json", "--cluster", "bench"])
        .arg(input)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("cannot run replay")?;
    let secs = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("replay failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(secs.max(1e-9))
}

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn spawn_run(exe: &Path, config: &Path, stdin: Stdio) -> Result<Child> {
    Command::new(exe)
        .arg("run")
        .arg("--config")
        .arg(config)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the pipeline")
}

/// Count the transition records on a child's stdout, in a thread.
fn count_transitions(child: &mut Child) -> Result<(Arc<AtomicU64>, std::thread::JoinHandle<()>)> {
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::with_capacity(1 << 20, stdout);
        let mut line = Vec::new();
        while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            c.fetch_add(1, Ordering::Relaxed);
            line.clear();
        }
    });
    Ok((count, reader))
}

struct Memory {
    idle_kib: u64,
    hwm_kib: u64,
    rss_kib: u64,
    fed_secs: f64,
}

fn memory(exe: &Path, dir: &Path, jobs: u64, seed: u64, nodes: u32) -> Result<Memory> {
    let config = write_config(
        dir,
        "memory",
        &format!(
            "data_dir = {}\n[operators]\nmax_jobs = {}\nmax_clock_skew_secs = inf\n\
             [sources.in]\ntype = \"stdin\"\ncluster = \"bench\"\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = [\"transitions\"]\n",
            toml_path(&dir.join("state-memory")),
            // (No limit on event times: a million jobs' events, dated from
            // now on, run hours ahead of the wall clock.)
            // Every job held: the cap is split over the shards, and one
            // shard may get more than its even share.
            jobs.saturating_mul(2).max(1000)
        ),
    )?;
    let mut child = spawn_run(exe, &config, Stdio::piped())?;
    let pid = child.id();
    let (count, reader) = count_transitions(&mut child)?;
    std::thread::sleep(Duration::from_millis(300));
    let idle_kib = status_kib(pid, "VmRSS:");
    let mut stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
    let spec = Spec {
        seed,
        jobs,
        nodes,
        active: true,
        start: now_secs(),
    };
    let start = Instant::now();
    // Feed from a thread; stdin stays open so the pipeline stays up.
    let writer = std::thread::spawn(
        move || -> std::io::Result<(std::process::ChildStdin, u64)> {
            let mut expected = 0u64;
            {
                let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut stdin);
                let mut line = Vec::with_capacity(512);
                for entry in Workload::new(spec) {
                    if let Entry::Event(i) = &entry {
                        expected += u64::from(i.transition);
                    }
                    line.clear();
                    entry.journal_line(&mut line)?;
                    line.push(b'\n');
                    w.write_all(&line)?;
                }
                w.flush()?;
            }
            Ok((stdin, expected))
        },
    );
    let (stdin, expected) = writer
        .join()
        .map_err(|_| anyhow!("the writer thread panicked"))??;
    // Until every transition is out, or none has come for 30 s.
    let (mut last, mut moved) = (0, Instant::now());
    while count.load(Ordering::Relaxed) < expected && moved.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
        let now = count.load(Ordering::Relaxed);
        if now != last {
            (last, moved) = (now, Instant::now());
        }
    }
    let fed_secs = start.elapsed().as_secs_f64();
    let got = count.load(Ordering::Relaxed);
    let hwm_kib = status_kib(pid, "VmHWM:");
    let rss_kib = status_kib(pid, "VmRSS:");
    drop(stdin);
    let status = child.wait()?;
    let _ = reader.join();
    if got < expected {
        bail!("memory run: {got} of {expected} transitions came out");
    }
    if !status.success() {
        bail!("memory run: the pipeline exited with {status}");
    }
    Ok(Memory {
        idle_kib,
        hwm_kib,
        rss_kib,
        fed_secs,
    })
}

struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    count: usize,
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn latency(exe: &Path, dir: &Path, rate: u64, secs: u64, seed: u64, nodes: u32) -> Result<Latency> {
    // The input, laid out in advance: lines, and which carry a transition.
    let spec = Spec {
        seed: seed.wrapping_add(1),
        jobs: (rate * secs / EVENTS_PER_JOB).max(1),
        nodes,
        active: false,
        start: now_secs(),
    };
    let mut buf = Vec::new();
    let mut ends = Vec::new();
    let mut keys: HashMap<(u64, u64), usize> = HashMap::new();
    for entry in Workload::new(spec) {
        if let Entry::Event(i) = &entry
            && i.transition
        {
            keys.insert((i.id.unwrap_or(0), i.timestamp().to_bits()), ends.len());
        }
        entry.journal_line(&mut buf)?;
        buf.push(b'\n');
        ends.push(buf.len());
    }
    let expected = keys.len();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..ends.len()).map(|_| AtomicU64::new(0)).collect());

    let port = free_port()?;
    let config = write_config(
        dir,
        "latency",
        &format!(
            "data_dir = {}\n[sources.in]\ntype = \"socket\"\nmode = \"tcp\"\naddress = \"127.0.0.1:{port}\"\ncluster = \"bench\"\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = [\"transitions\"]\n",
            toml_path(&dir.join("state-latency"))
        ),
    )?;
    let mut child = spawn_run(exe, &config, Stdio::null())?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let connect_by = Instant::now() + Duration::from_secs(10);
    let mut sock = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > connect_by => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).context("cannot connect to the pipeline's socket source");
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    sock.set_nodelay(true)?;

    let t0 = Instant::now();
    #[derive(Deserialize)]
    struct Transition {
        id: u64,
        timestamp: f64,
    }
    let (s2, keys) = (sent.clone(), keys);
    let reader = std::thread::spawn(move || {
        let mut lat = Vec::with_capacity(keys.len());
        let mut r = BufReader::new(stdout);
        let mut line = Vec::new();
        while matches!(r.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let at = t0.elapsed().as_nanos() as u64;
            if let Ok(t) = serde_json::from_slice::<Transition>(&line)
                && let Some(&i) = keys.get(&(t.id, t.timestamp.to_bits()))
            {
                let s = s2[i].load(Ordering::Acquire);
                if s > 0 {
                    lat.push(at.saturating_sub(s));
                }
            }
            line.clear();
            if lat.len() == keys.len() {
                break;
            }
        }
        lat
    });

    // Pace the input: every line goes out when its turn comes at `rate`.
    let total = ends.len();
    let mut next = 0usize;
    while next < total {
        let due = ((t0.elapsed().as_secs_f64() * rate as f64) as usize + 1).min(total);
        if due <= next {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        let now = (t0.elapsed().as_nanos() as u64).max(1);
        for s in &sent[next..due] {
            s.store(now, Ordering::Release);
        }
        let from = if next == 0 { 0 } else { ends[next - 1] };
        sock.write_all(&buf[from..ends[due - 1]])?;
        next = due;
    }
    sock.flush()?;
    let waited = Instant::now();
    while !reader.is_finished() && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(sock);
    // SIGTERM: the pipeline flushes and exits.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let stop_by = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() && Instant::now() < stop_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    if child.try_wait()?.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut lat = reader
        .join()
        .map_err(|_| anyhow!("the reader thread panicked"))?;
    if lat.is_empty() {
        bail!("latency run: no transition came out");
    }
    if lat.len() < expected {
        eprintln!(
            "fluxpipe bench: latency run: {} of {expected} transitions came out",
            lat.len()
        );
    }
    lat.sort_unstable();
    let pct = |p: f64| {
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1e6
    };
    Ok(Latency {
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
        count: lat.len(),
    })
}
