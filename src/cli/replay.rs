//! `fluxpipe replay`: read eventlogs and journals from files and folders,
//! replay them through the Flux model and print jobs, ranks and anomalies.

use super::format::Format as JobsFormat;
use super::jobs::{DEFAULT_FORMAT, Hostnames, Users, format_lines, heading};
use super::listing::counted;
use super::resource::{ByCluster, Node, print_rank_tables};
use crate::decode::{self, EventStream, Format, Origin, PathKind, Record};
use crate::flux::anomaly::{Anomaly, AnomalyKind, Stream};
use crate::flux::job::{JobState, SummaryView};
use crate::flux::jobid::JobId;
use crate::keyed::JobKey;
use crate::keyed::alerts::Clock;
use crate::keyed::alerts::engine::AlertEvent;
use crate::keyed::alerts::rule::default_rules;
use crate::keyed::processor::{Processed, Processor};
use crate::keyed::query::{JobFilter, select_jobs};
use crate::keyed::state::{JobEntry, KeyedAnomaly, State};
use crate::output::effects::{self, Emit};
use crate::output::{
    self, AlertRecord, AlertStatus, AnomalyRecord, JobRecord, OutputRecord, OutputStream,
    RankStateRecord, StreamSet, json_line,
};
use crate::sources::file::rotation;
use crate::sources::lines::{BlockingLineReader, Buffered, Line, READ_BYTES};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use serde_json::Value;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The longest line read; longer lines are reported and skipped.
const MAX_LINE: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Output: a table for people, or JSON Lines.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
    /// Cluster name for inputs that do not name one.
    #[arg(long, default_value = "default")]
    pub cluster: String,
    /// Line format: auto, event (plain RFC 18 eventlog lines), job-journal,
    /// resource-journal, exec-protocol or envelope; `auto` tells the forms
    /// apart per line.
    #[arg(long, default_value = "auto", value_parser = parse_format)]
    pub input_format: Format,
    /// Alert rules from this pipeline config's `[alerts]` table (default:
    /// the built-in rules). Replay measures them against event time.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Report no alerts.
    #[arg(long)]
    pub no_alerts: bool,
    /// The job a bare eventlog named on the command line (or `-`) belongs
    /// to, any id encoding (`flux job eventlog ƒ2GeDKtT` printed it): its
    /// lines name no job. Paths inside folders still say theirs.
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    /// The stream of a bare eventlog named on the command line: job, exec
    /// or resource (default: job with --job-id).
    #[arg(long, value_name = "STREAM", value_parser = parse_stream)]
    pub stream: Option<EventStream>,
    /// Jobs to list, as `flux jobs --filter`: state names or pending,
    /// running, active, inactive, comma-separated; listed then in `flux
    /// jobs` order (pending, running, inactive newest first).
    #[arg(short = 'f', long, value_name = "STATES")]
    pub filter: Option<String>,
    /// Only this user's jobs (a name or a uid).
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    /// Only jobs active at or after this time: still active, or ended
    /// since. Seconds since the epoch, a date or time (RFC 3339; without
    /// an offset, local), `today`, `yesterday`, or a duration meaning that
    /// long ago (`2h`, `7d`), as `fluxpipe history --since`.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// At most this many jobs (in `flux jobs` order).
    #[arg(short = 'c', long)]
    pub count: Option<usize>,
    /// Only the jobs, with columns by a `flux jobs` format string, e.g.
    /// `{id.f58:>12} {username:<8} {status_abbrev:>2} {runtime!F:>8h}
    /// {nodelist}` (flux's fields the job records carry, its conversions,
    /// suffixes and `?:`/`+:` prefixes). Running times count to the last
    /// event read.
    #[arg(
        short = 'o',
        long = "jobs-format",
        value_name = "FORMAT",
        conflicts_with = "format"
    )]
    pub jobs_format: Option<String>,
    /// Print the records of these output streams as JSON Lines while
    /// replaying, as `fluxpipe run` sends them to a sink taking them
    /// (comma-separated: events, transitions, jobs, job_updates,
    /// resources, alerts, anomalies), instead of the jobs and ranks at the
    /// end. Lines that cannot be read are anomalies here (`run` sends
    /// them to dead_letter).
    #[arg(
        long,
        value_name = "STREAMS",
        value_parser = parse_streams,
        conflicts_with_all = ["format", "jobs_format", "filter", "user", "since", "count"]
    )]
    pub emit: Option<StreamSet>,
    /// Files and folders (read recursively, in sorted path order; the
    /// rotated files of a journal or eventlog oldest first, before it);
    /// `-` for standard input; `.gz` and `.zst` files are read decompressed.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// Which jobs to list and how many, when filters or a count are given
/// (`None`: every job, by key).
fn listing(args: &ReplayArgs) -> Result<Option<(JobFilter, usize)>> {
    if args.filter.is_none() && args.user.is_none() && args.since.is_none() && args.count.is_none()
    {
        return Ok(None);
    }
    let states = args
        .filter
        .as_deref()
        .map(JobFilter::parse_states)
        .transpose()?;
    let filter = JobFilter {
        cluster: None,
        states,
        user: args.user.as_deref().map(super::jobs::user_match),
        since: args
            .since
            .as_deref()
            .map(|t| super::history::when(t, crate::keyed::alerts::wall_now()))
            .transpose()?,
        id: None,
        queue: None,
    };
    Ok(Some((filter, args.count.unwrap_or(usize::MAX))))
}

/// The jobs to print: every job by key, or those `listing` takes in `flux
/// jobs` order.
fn jobs_listed<'a>(
    state: &'a State,
    listing: Option<&(JobFilter, usize)>,
) -> Vec<(JobKey, &'a JobEntry)> {
    let Some((filter, count)) = listing else {
        return state.listed_jobs();
    };
    // Every job taken, in order, then those listed: the count is of
    // listed jobs.
    select_jobs(state, filter, None, state.jobs.len(), usize::MAX)
        .jobs
        .into_iter()
        .filter_map(|(_, key)| state.jobs.get(&key).map(|e| (key, e)))
        .filter(|(_, e)| e.job.submitted && !e.job.invalidated)
        .take(*count)
        .collect()
}

fn parse_stream(s: &str) -> Result<EventStream> {
    EventStream::parse(s).with_context(|| format!("unknown stream `{s}` (job, exec or resource)"))
}

fn parse_streams(s: &str) -> Result<StreamSet> {
    s.split(',')
        .filter(|s| !s.is_empty())
        .map(|name| match OutputStream::parse(name) {
            Some(OutputStream::DeadLetter) | None => {
                // Bad lines are anomalies here: there is no dead_letter.
                let known: Vec<&str> = OutputStream::ALL
                    .iter()
                    .filter(|s| **s != OutputStream::DeadLetter)
                    .map(|s| s.as_str())
                    .collect();
                anyhow::bail!("no stream {name:?} (the streams are {})", known.join(", "))
            }
            Some(s) => Ok(s),
        })
        .collect()
}

fn parse_format(s: &str) -> Result<Format> {
    Format::parse(s).with_context(|| format!("unknown input format `{s}`"))
}

/// Undecodable lines at the start of an input after which it is taken
/// for something else than an eventlog or a journal (a binary file).
const BINARY_AFTER: u64 = 10;

/// How a file is compressed, by its name: `.gz` (gzip) and `.zst`
/// (zstd) are read decompressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

fn compression(path: &Path) -> Compression {
    match path.extension().and_then(|e| e.to_str()) {
        Some("gz") => Compression::Gzip,
        Some("zst") => Compression::Zstd,
        _ => Compression::None,
    }
}

/// Records and bad lines a batch carries from the reading thread.
const READ_BATCH: usize = 512;

/// What the reading thread hands the processor, in input order.
enum Item {
    Record(Record),
    /// A line that could not be read or decoded.
    Bad(KeyedAnomaly),
}

/// Reads and decodes the input on a thread of its own, as the pipeline's
/// sources do, while the processor applies what was read before.
struct Reader {
    cluster: String,
    format: Format,
    /// What a path named on the command line is, when told (`--job-id`,
    /// `--stream`): its lines name no job.
    told: Option<Origin>,
    lines: u64,
    /// Records decoded.
    records: u64,
    batch: Vec<Item>,
    tx: std::sync::mpsc::SyncSender<Vec<Item>>,
}

/// The processor's side.
struct Replay {
    /// The same per-record core as the pipeline's shards, its alerts
    /// measured against event time. Never dropped: a replay ends with the
    /// process, which gives its memory back at once, where freeing every
    /// job one by one was 5% of a replay's time on its busier thread.
    processor: std::mem::ManuallyDrop<Processor>,
    cluster: String,
    anomalies: Vec<KeyedAnomaly>,
    fired: Vec<AlertEvent>,
    /// `--emit`: records printed as they are made.
    printer: Option<Printer<std::io::BufWriter<std::io::Stdout>>>,
}

/// The `source` of `events` records replay prints (in `run`, the name of
/// the source that read them).
const SOURCE: &str = "replay";

/// Output records as JSON Lines: `--emit`. The first write error is kept
/// and said at the end (a reader gone: nothing more is written).
struct Printer<W> {
    streams: StreamSet,
    out: W,
    error: Option<std::io::Error>,
}

impl<W: Write> Emit for Printer<W> {
    fn wants(&self, stream: OutputStream) -> bool {
        self.streams.contains(stream)
    }

    fn emit(&mut self, record: OutputRecord) {
        if self.error.is_none()
            && let Err(e) = writeln!(self.out, "{}", record.line())
        {
            self.error = Some(e);
        }
    }
}

pub fn run(args: ReplayArgs) -> Result<ExitCode> {
    // A wrong format is said before the input is read, not after.
    let jobs_format = args
        .jobs_format
        .as_deref()
        .map(|f| if f == "default" { DEFAULT_FORMAT } else { f });
    if let Some(format) = jobs_format {
        JobsFormat::parse(format, heading).with_context(|| format!("format `{format}`"))?;
    }
    let config = match &args.config {
        None => None,
        Some(path) => Some(crate::pipeline::config::load(path).map_err(|errors| {
            let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            anyhow::anyhow!("{}: {}", path.display(), text.join("; "))
        })?),
    };
    let rules = match (&config, args.no_alerts) {
        (_, true) => Vec::new(),
        (None, false) => default_rules(),
        (Some(config), false) => config
            .alerts
            .rules()
            .map_err(|(rule, key, e)| anyhow::anyhow!("alerts.rules.{rule}.{key}: {e}"))?,
    };
    // The pipeline's own limit on event times, where its config is given.
    let skew = config
        .as_ref()
        .map_or(crate::keyed::processor::DEFAULT_MAX_CLOCK_SKEW_SECS, |c| {
            c.operators.max_clock_skew_secs
        });
    let max_clusters = config
        .as_ref()
        .map_or(usize::MAX, |c| c.operators.max_clusters);
    let mut replay = Replay {
        processor: std::mem::ManuallyDrop::new(
            Processor::new(rules, Clock::Event)
                .with_max_clock_skew(skew)
                .with_max_clusters(max_clusters),
        ),
        cluster: args.cluster.clone(),
        anomalies: Vec::new(),
        fired: Vec::new(),
        printer: args.emit.map(|streams| Printer {
            streams,
            out: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout()),
            error: None,
        }),
    };
    // A few batches in flight: the reader runs ahead, never far.
    let (tx, rx) = std::sync::mpsc::sync_channel(16);
    let job_id = args
        .job_id
        .as_deref()
        .map(JobId::parse)
        .transpose()
        .with_context(|| "--job-id")?;
    let told = (job_id.is_some() || args.stream.is_some()).then(|| Origin {
        stream: Some(args.stream.unwrap_or(EventStream::Job)),
        id: job_id,
    });
    let listing = listing(&args)?;
    let mut reader = Reader {
        cluster: args.cluster.clone(),
        format: args.input_format,
        told,
        lines: 0,
        records: 0,
        batch: Vec::with_capacity(READ_BATCH),
        tx,
    };
    let (lines, records) = std::thread::scope(|scope| {
        let reading = scope.spawn(move || -> Result<(u64, u64)> {
            for path in &args.paths {
                reader.path(path)?;
            }
            reader.flush();
            Ok((reader.lines, reader.records))
        });
        for batch in rx {
            for item in batch {
                match item {
                    Item::Record(rec) => replay.apply(rec),
                    Item::Bad(anomaly) => replay.bad(anomaly),
                }
            }
        }
        reading
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the reading thread failed")))
    })?;
    let fired = replay.fired.len();
    replay.processor.finish(&mut replay.fired);
    if let Some(mut printer) = replay.printer.take() {
        let rules = replay.processor.alerts().rules();
        effects::alerts(&mut printer, rules, &replay.fired[fired..], false);
        effects::anomalies(&mut printer, replay.processor.state().finish());
        if let Some(e) = printer.error {
            return Err(e).context("cannot write the records");
        }
        printer.out.flush().context("cannot write the records")?;
        return Ok(if records == 0 {
            eprintln!(
                "fluxpipe replay: nothing read: {lines} lines, no event or document among them"
            );
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        });
    }
    let alerts: Vec<AlertRecord> = replay
        .fired
        .iter()
        .filter_map(|a| {
            let rule = replay.processor.alerts().rules().get(a.rule)?;
            Some(output::alert(rule, a))
        })
        .collect();
    let mut anomalies = replay.anomalies;
    anomalies.extend(replay.processor.state().finish());
    let stdout = std::io::stdout();
    // Written in blocks of 64 KiB, as `--emit` is: 8 KiB (the default)
    // took a system call per 14 jobs' lines.
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let state = replay.processor.state();
    let jobs = jobs_listed(state, listing.as_ref());
    match (jobs_format, args.format) {
        (Some(format), _) => {
            let records: Vec<Value> = jobs
                .iter()
                .map(|(k, e)| serde_json::to_value(JobRecord::new(k, e)).unwrap_or_default())
                .collect();
            // The last event read: a replay of an old log is not "now"
            // (the listing keeps it, alerts or not).
            let now = state
                .listing()
                .clusters()
                .filter_map(|(_, jobs)| jobs.newest_event)
                .fold(0.0, f64::max);
            let (hosts, users) = (Hostnames::default(), Users::default());
            for line in format_lines(format, &records, &hosts, &users, now, true)? {
                writeln!(out, "{line}")?;
            }
        }
        (None, OutputFormat::Json) => print_json(&mut out, state, &jobs, &anomalies, &alerts)?,
        (None, OutputFormat::Table) => {
            print_table(&mut out, state, &jobs, &anomalies, &alerts, lines)?
        }
    }
    out.flush()?;
    // Said, and a failure: a replay that found nothing is a wrong path or
    // a wrong file more often than an empty log.
    if records == 0 {
        eprintln!(
            "fluxpipe replay: nothing read: {lines} lines, no event or document among them ({} anomalies)",
            anomalies.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    if state.jobs.is_empty() && state.resources.is_empty() {
        eprintln!(
            "fluxpipe replay: nothing placed: {records} records read, none made a job or a node ({} anomalies say why)",
            anomalies.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

impl Replay {
    fn apply(&mut self, mut rec: Record) {
        let own = rec.cluster.take();
        let cluster = own.as_deref().unwrap_or(&self.cluster);
        let Some(printer) = &mut self.printer else {
            let mut done = Processed::default();
            self.processor
                .process_into(cluster, rec, &mut self.fired, &mut done);
            self.anomalies.extend(done.fx.anomalies);
            return;
        };
        // As a shard of `run` sends them: the alerts the record's time
        // fired, then what the record did.
        let input = effects::input(printer, cluster, rec.stream, rec.id, &rec.body, SOURCE);
        let stream = rec.stream;
        let mut done = Processed::default();
        let outcome = self
            .processor
            .process_into(cluster, rec, &mut self.fired, &mut done);
        let rules = self.processor.alerts().rules();
        effects::alerts(printer, rules, &self.fired, false);
        // Printed: not kept for an end that prints none.
        self.fired.clear();
        let state = self.processor.state();
        let job = done.key.as_ref().and_then(|k| state.jobs.get(k));
        effects::effects(printer, job, stream, outcome, &mut done, input);
    }

    /// A line that could not be read or decoded.
    fn bad(&mut self, anomaly: KeyedAnomaly) {
        match &mut self.printer {
            Some(printer) => effects::anomalies(printer, [anomaly]),
            None => self.anomalies.push(anomaly),
        }
    }
}

impl Reader {
    /// Hand a record or bad line on, in batches.
    fn send(&mut self, item: Item) {
        self.batch.push(item);
        if self.batch.len() >= READ_BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.batch.is_empty() {
            let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(READ_BATCH));
            // The processor's side is gone only if it failed: nothing more
            // to hand it.
            let _ = self.tx.send(batch);
        }
    }

    fn apply(&mut self, rec: Record) {
        self.records += 1;
        self.send(Item::Record(rec));
    }

    fn path(&mut self, path: &Path) -> Result<()> {
        if path == Path::new("-") {
            let stdin = std::io::stdin();
            let origin = self.told.clone().unwrap_or_default();
            let stdin = BufReader::with_capacity(READ_BYTES, stdin.lock());
            return self.lines(stdin, path, &origin);
        }
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            let mut files = Vec::new();
            for entry in walkdir::WalkDir::new(path).sort_by_file_name() {
                let entry = entry.with_context(|| format!("cannot walk {}", path.display()))?;
                if entry.file_type().is_file() {
                    files.push(entry.into_path());
                }
            }
            // As the file source reads them: a feed's rotated files
            // oldest first, before its live file.
            rotation::in_read_order(&mut files);
            for file in &files {
                if rotation::is_compressed_log(file) && compression(file) == Compression::None {
                    eprintln!(
                        "fluxpipe replay: {}: compressed, not read (decompress it to replay it; gzip and zstd are read)",
                        file.display()
                    );
                    continue;
                }
                self.file(file, false)?;
            }
            Ok(())
        } else {
            self.file(path, true)
        }
    }

    /// Read one file; `named` is true when the user named it, so even a
    /// file whose path says nothing is read (its lines must name their keys).
    fn file(&mut self, path: &Path, named: bool) -> Result<()> {
        // A compressed file reads as the name it had before
        // (`journal.jsonl.2.gz`).
        let compressed = compression(path);
        let named_as = match compressed {
            Compression::None => path.to_path_buf(),
            _ => path.with_extension(""),
        };
        // A rotated name reads as its live name (`journal.jsonl.1`).
        let origin = match (rotation::classify(&named_as), &self.told) {
            // Told on the command line what a named file is.
            // (Not a path that names its own job: `jobs/ID/eventlog`.)
            (PathKind::Lines | PathKind::Other, Some(told)) if named => told.clone(),
            (kind, _) => match kind {
                PathKind::Eventlog(origin) => origin,
                PathKind::Lines => Origin::default(),
                PathKind::Other if named => Origin::default(),
                PathKind::Other => return Ok(()),
                PathKind::JobR(id) => return self.document(path, Some(id), false),
                PathKind::JobSpec(id) => return self.document(path, Some(id), true),
                PathKind::ResourceR => return self.document(path, None, false),
            },
        };
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        match compressed {
            Compression::Gzip => {
                let decoded = flate2::read::MultiGzDecoder::new(BufReader::new(file));
                self.lines(BufReader::with_capacity(READ_BYTES, decoded), path, &origin)
            }
            Compression::Zstd => {
                let decoded = zstd::stream::read::Decoder::new(file)
                    .with_context(|| format!("cannot read {} as zstd", path.display()))?;
                self.lines(BufReader::with_capacity(READ_BYTES, decoded), path, &origin)
            }
            Compression::None => {
                self.lines(BufReader::with_capacity(READ_BYTES, file), path, &origin)
            }
        }
    }

    /// A document in a file of its own: a job's R or jobspec (`id`), or an
    /// instance's R. Read as the file source reads it; an R that is not
    /// JSON is an anomaly, not applied.
    fn document(&mut self, path: &Path, id: Option<JobId>, jobspec: bool) -> Result<()> {
        let content =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        match decode::document_file(&content, jobspec) {
            Ok(body) => self.apply(Record {
                cluster: None,
                stream: if id.is_some() {
                    EventStream::Job
                } else {
                    EventStream::Resource
                },
                id,
                body,
            }),
            Err(e) => self.input_anomaly(path, 1, e.to_string()),
        }
        Ok(())
    }

    /// Read and decode the lines of one input. An input whose first
    /// [`BINARY_AFTER`] lines are all undecodable is not an eventlog or a
    /// journal: it is left with one anomaly, not one per line.
    fn lines(
        &mut self,
        reader: impl BufRead + Buffered,
        path: &Path,
        origin: &Origin,
    ) -> Result<()> {
        let mut reader = BlockingLineReader::new(reader, MAX_LINE);
        let mut lineno = 0u64;
        let mut good = 0u64;
        loop {
            let text = match reader.next_line() {
                Ok(Some(Line::Full(text))) => text,
                Ok(Some(Line::TooLong { .. })) => {
                    lineno += 1;
                    self.lines += 1;
                    self.input_anomaly(path, lineno, format!("line longer than {MAX_LINE} bytes"));
                    continue;
                }
                Ok(None) => break,
                // A damaged file (a gzip cut short) is said, and the rest
                // of the input is still read.
                Err(e) => {
                    self.input_anomaly(path, lineno + 1, format!("cannot read on: {e}"));
                    break;
                }
            };
            lineno += 1;
            self.lines += 1;
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let decoded = decode::decode_line(text, origin, self.format);
            if decoded.errors.is_empty() {
                good += 1;
            } else if good == 0 && lineno >= BINARY_AFTER {
                self.input_anomaly(
                    path,
                    lineno,
                    format!(
                        "none of the first {lineno} lines could be decoded: not an eventlog or a journal; the rest is not read"
                    ),
                );
                break;
            }
            for err in decoded.errors {
                self.input_anomaly(path, lineno, err.to_string());
            }
            for rec in decoded.records {
                self.apply(rec);
            }
        }
        Ok(())
    }

    fn input_anomaly(&mut self, path: &Path, lineno: u64, message: String) {
        self.send(Item::Bad(KeyedAnomaly {
            cluster: self.cluster.clone(),
            id: None,
            anomaly: Anomaly::new(
                Stream::Input,
                AnomalyKind::Malformed,
                format!("{}:{lineno}: {message}", path.display()),
            ),
        }));
    }
}

fn print_json(
    out: &mut impl Write,
    state: &State,
    jobs: &[(JobKey, &JobEntry)],
    anomalies: &[KeyedAnomaly],
    alerts: &[AlertRecord],
) -> Result<()> {
    for (key, entry) in jobs {
        writeln!(out, "{}", json_line(&JobRecord::new(key, entry)))?;
    }
    for (cluster, res) in state.clusters() {
        for state in res.ranks() {
            writeln!(out, "{}", json_line(&RankStateRecord { cluster, state }))?;
        }
    }
    for a in anomalies {
        writeln!(out, "{}", json_line(&AnomalyRecord(a.clone())))?;
    }
    for a in alerts {
        writeln!(out, "{}", json_line(a))?;
    }
    Ok(())
}

/// A job row's cells that need formatting, rewritten in place for each row
/// (a table of many jobs allocates them once).
#[derive(Default)]
struct RowCells {
    userid: String,
    returncode: String,
    submitted: String,
    runtime: String,
    exception: String,
    jobid: String,
    /// The row, written whole (padded here: the same as `{:<10}` and
    /// `{:>14}`, in a tenth of the work of formatting each cell).
    line: String,
}

/// `text` padded with spaces to `width` characters (as `format!` counts
/// them), after it if `left`, else before it.
fn pad(out: &mut String, text: &str, width: usize, left: bool) {
    let chars = match text.is_ascii() {
        true => text.len(),
        false => text.chars().count(),
    };
    let fill = width.saturating_sub(chars);
    if !left {
        out.extend(std::iter::repeat_n(' ', fill));
    }
    out.push_str(text);
    if left {
        out.extend(std::iter::repeat_n(' ', fill));
    }
}

impl RowCells {
    /// The table row of a job, as the heading's columns lay it out.
    fn row(&mut self, key: &JobKey, s: &SummaryView<'_>) -> &str {
        let line = &mut self.line;
        line.clear();
        let cells: [(&str, usize, bool); 8] = [
            (&key.cluster, 10, true),
            (&self.jobid, 14, false),
            (&self.userid, 6, false),
            (s.state.as_str(), 8, true),
            (s.result.map_or("-", |r| r.as_str()), 9, true),
            (&self.returncode, 4, false),
            (&self.submitted, 20, true),
            (&self.runtime, 8, false),
        ];
        for (i, (text, width, left)) in cells.into_iter().enumerate() {
            if i > 0 {
                line.push(' ');
            }
            pad(line, text, width, left);
        }
        line.push_str("  ");
        line.push_str(&self.exception);
        line.push('\n');
        line
    }

    fn fill(&mut self, key: &JobKey, s: &SummaryView<'_>) {
        use std::fmt::Write as _;
        self.jobid.clear();
        _ = write!(self.jobid, "{}", key.id.f58());
        let number = |cell: &mut String, n: Option<i64>| {
            cell.clear();
            match n {
                Some(n) => _ = write!(cell, "{n}"),
                None => cell.push('-'),
            }
        };
        number(&mut self.userid, s.userid);
        number(&mut self.returncode, s.returncode);
        self.submitted.clear();
        match s.t_submit {
            Some(ts) => clock(&mut self.submitted, ts),
            None => self.submitted.push('-'),
        }
        self.runtime.clear();
        match (s.t_run, s.t_cleanup) {
            (Some(r), Some(c)) => crate::flux::fsd::write(&mut self.runtime, c - r),
            _ => self.runtime.push('-'),
        }
        self.exception.clear();
        if let Some(e) = s.ended_exception() {
            _ = write!(self.exception, "{} (sev {}) {}", e.kind, e.severity, e.note);
            self.exception.truncate(self.exception.trim_end().len());
        }
    }
}

/// `ts` as a UTC time to the second, `2026-11-30T08:54:00Z`.
fn clock(out: &mut String, ts: f64) {
    use std::fmt::Write as _;
    // From 1970 on, a timestamp of whole seconds displays in exactly this
    // form, with less work than strftime. Times jiff cannot hold (beyond
    // the years -9999 and 9999) print as the number given.
    _ = match jiff::Timestamp::from_second(ts.floor() as i64) {
        Ok(t) if ts >= 0.0 => write!(out, "{t}"),
        Ok(t) => write!(out, "{}", t.strftime("%Y-%m-%dT%H:%M:%SZ")),
        Err(_) => write!(out, "{ts}"),
    };
}

fn print_table(
    out: &mut impl Write,
    state: &State,
    jobs: &[(JobKey, &JobEntry)],
    anomalies: &[KeyedAnomaly],
    alerts: &[AlertRecord],
    lines: u64,
) -> Result<()> {
    writeln!(
        out,
        "{:<10} {:>14} {:>6} {:<8} {:<9} {:>4} {:<20} {:>8}  EXCEPTION",
        "CLUSTER", "JOBID", "UID", "STATE", "RESULT", "RC", "SUBMITTED", "RUNTIME"
    )?;
    let mut cells = RowCells::default();
    for (key, entry) in jobs {
        let s = entry.job.summary_view();
        cells.fill(key, &s);
        out.write_all(cells.row(key, &s).as_bytes())?;
    }
    let mut clusters = ByCluster::new();
    let mut nranks = 0;
    for (cluster, res) in state.clusters() {
        let nodes: Vec<Node> = res.ranks().map(|r| Node::of_rank(cluster, r)).collect();
        nranks += nodes.len();
        if !nodes.is_empty() {
            clusters.insert(cluster.to_string(), nodes);
        }
    }
    if !clusters.is_empty() {
        writeln!(out)?;
        print_rank_tables(out, &clusters)?;
    }
    if !anomalies.is_empty() {
        writeln!(out)?;
        writeln!(out, "ANOMALIES")?;
        for a in anomalies {
            let who = match (a.id, a.anomaly.rank) {
                (Some(id), _) => format!("job {}", id.to_f58()),
                (None, Some(r)) => format!("rank {r}"),
                _ => String::new(),
            };
            writeln!(out, "{} {} {}", a.cluster, who, a.anomaly)?;
        }
    }
    if !alerts.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "ALERTS (event time)\n{:<9} {:<20} {:<20} {:<20}  SUMMARY",
            "STATUS", "ALERT", "STARTS", "ENDS"
        )?;
        let time = |t: Option<&str>| t.and_then(|t| t.get(..19)).unwrap_or("-").to_string();
        for a in alerts {
            writeln!(
                out,
                "{:<9} {:<20} {:<20} {:<20}  {}",
                a.status.as_str(),
                a.alertname,
                time(Some(&a.starts_at)),
                time(a.ends_at.as_deref()),
                a.annotations.get("summary").map_or("", String::as_str)
            )?;
        }
    }
    let count = |s| alerts.iter().filter(|a| a.status == s).count();
    let firing = count(AlertStatus::Firing) - count(AlertStatus::Resolved);
    let mut states = [0usize; 7];
    for (_, e) in jobs {
        states[JobState::ALL
            .iter()
            .position(|s| *s == e.job.state)
            .unwrap_or(0)] += 1;
    }
    let by_state: Vec<String> = JobState::ALL
        .iter()
        .zip(states)
        .filter(|(_, n)| *n > 0)
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    writeln!(out)?;
    let jobs_part = match by_state.is_empty() {
        true => counted(jobs.len(), "job", "jobs"),
        false => format!(
            "{} ({})",
            counted(jobs.len(), "job", "jobs"),
            by_state.join(", ")
        ),
    };
    writeln!(
        out,
        "{}, {jobs_part}, {}, {}, {} skipped, {} still firing",
        counted(lines as usize, "line", "lines"),
        counted(nranks, "rank", "ranks"),
        counted(anomalies.len(), "anomaly", "anomalies"),
        counted(state.counts.duplicates as usize, "repeat", "repeats"),
        counted(firing, "alert", "alerts"),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn clock_of(ts: f64) -> String {
        let mut out = String::new();
        clock(&mut out, ts);
        out
    }

    #[test]
    fn clock_prints_utc_to_the_second() {
        assert_eq!(clock_of(0.0), "1970-01-01T00:00:00Z");
        assert_eq!(clock_of(1_764_492_840.75), "2025-11-30T08:54:00Z");
        assert_eq!(clock_of(-1.5), "1969-12-31T23:59:58Z");
        // Beyond the year 9999: the number as given.
        assert_eq!(clock_of(1e15), "1000000000000000");
    }

    proptest! {
        /// The short way from 1970 on prints what strftime prints.
        #[test]
        fn clock_matches_strftime(secs in 0i64..253_402_300_799, frac in 0.0f64..1.0) {
            let ts = secs as f64 + frac;
            let t = jiff::Timestamp::from_second(ts.floor() as i64).unwrap();
            prop_assert_eq!(clock_of(ts), t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        }
    }
}
