//! `type = "database"`: the job archive ([`crate::archive`]) in SQLite or
//! PostgreSQL. Job records (`jobs`), node state changes (`resources`) and
//! transitions (`transitions`) become rows; `fluxpipe history` reads them.
//!
//! A batch (`batch_max_records`, or what came within `batch_timeout_ms`)
//! is one transaction, and its records count as delivered only once it is
//! committed: a checkpoint or Kafka commit never passes a record the
//! database does not hold. Rows are keyed, so a record written again after
//! a restart changes nothing.
//!
//! While the database is down or refuses (busy, too many connections) the
//! batch is retried with backoff (100 ms doubling to 30 s) for as long as
//! it takes; records wait in the sink's buffer meanwhile, and `when_full`
//! applies when it fills. At shutdown a failing batch is retried for
//! [`SHUTDOWN_GRACE`], then given up: no final checkpoint passes it, so
//! the next run writes it. An error no retry mends (a schema this fluxpipe
//! does not know) stops the sink.

use super::{SinkContext, SinkRx};
use crate::archive::rows::Batch;
use crate::archive::{self, Archive, ArchiveError};
use crate::component::Problem;
use crate::output::OutputStream;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

crate::channels::fanout::sink_config! {
    /// `type = "database"`: the job archive.
    DatabaseSinkConfig {
        /// `sqlite://PATH` or `postgres://USER@HOST/DATABASE`.
        url: String,
        /// Most records in one transaction.
        #[serde(default = "default_batch_records")]
        batch_max_records: usize,
        /// Longest wait before a partial batch is written, in milliseconds.
        #[serde(default = "default_batch_timeout")]
        batch_timeout_ms: u64,
        /// Rows older than this many days (by a job's end, an event's time)
        /// are deleted, at start and hourly. Kept for ever without it.
        #[serde(default)]
        retention_days: Option<f64>,
    }
}

fn default_batch_records() -> usize {
    1000
}

fn default_batch_timeout() -> u64 {
    1000
}

/// The streams the archive keeps.
const STORED: [OutputStream; 3] = [
    OutputStream::Jobs,
    OutputStream::Resources,
    OutputStream::Transitions,
];

impl super::SinkSpec for DatabaseSinkConfig {
    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if let Err(e) = archive::check_url(&self.url) {
            out.push(Problem::new("url", format!(": {e}")));
        }
        if self.batch_max_records == 0 {
            out.push(Problem::new("batch_max_records", ": must be at least 1"));
        }
        if let Some(days) = self.retention_days
            && !(days > 0.0 && days.is_finite())
        {
            out.push(Problem::new(
                "retention_days",
                format!(" `{days}`: must be a positive number of days"),
            ));
        }
        for (i, input) in self.inputs.iter().enumerate() {
            if OutputStream::parse(input).is_some_and(|s| !STORED.contains(&s)) {
                out.push(Problem::at(
                    "inputs",
                    i,
                    format!(": the database keeps jobs, resources and transitions, not `{input}`"),
                ));
            }
        }
        out
    }
}

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a batch still failing at shutdown keeps being retried.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Retries of one piece of work against the database, with backoff; logs
/// the start and the end of an outage once each, counts every failure.
struct Retry<'a> {
    name: &'a str,
    backoff: Duration,
    failures: u32,
    deadline: Option<Instant>,
}

impl<'a> Retry<'a> {
    fn new(name: &'a str) -> Self {
        Retry {
            name,
            backoff: BACKOFF_START,
            failures: 0,
            deadline: None,
        }
    }

    /// After a failure: wait and return true to try again, or false to give
    /// up (shutting down, and the grace is over).
    async fn again(&mut self, what: &str, e: &ArchiveError, rx: &SinkRx) -> bool {
        metrics::counter!("fluxpipe_sink_errors_total", "sink" => self.name.to_string())
            .increment(1);
        self.failures += 1;
        if self.failures == 1 {
            tracing::warn!(sink = %self.name, "{what} failed, retrying until the database answers: {e}");
        } else {
            tracing::debug!(sink = %self.name, tries = self.failures, "{what} failed: {e}");
        }
        if rx.is_closed() {
            let deadline = *self
                .deadline
                .get_or_insert_with(|| Instant::now() + SHUTDOWN_GRACE);
            if Instant::now() + self.backoff > deadline {
                return false;
            }
        }
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        true
    }

    fn succeeded(&self, what: &str) {
        if self.failures > 0 {
            tracing::info!(sink = %self.name, tries = self.failures + 1, "{what} succeeded: the database answers again");
        }
    }
}

/// Connect and migrate, for as long as it takes (`None`: shutting down
/// before the database answered).
async fn open(name: &str, url: &str, rx: &SinkRx) -> anyhow::Result<Option<Archive>> {
    let mut retry = Retry::new(name);
    loop {
        let opened = async {
            let archive = Archive::connect(url).await?;
            archive.migrate().await?;
            Ok::<_, ArchiveError>(archive)
        }
        .await;
        match opened {
            Ok(archive) => {
                retry.succeeded("connecting");
                tracing::info!(sink = %name, schema = archive::schema::LATEST, "database ready");
                return Ok(Some(archive));
            }
            Err(e) if !e.is_transient() => return Err(e.into()),
            Err(e) => {
                if !retry.again("connecting", &e, rx).await {
                    return Ok(None);
                }
            }
        }
    }
}

/// Delete rows past the retention, if one is set; a failure waits for the
/// next round.
async fn prune(name: &str, archive: &Archive, days: Option<f64>) {
    let Some(days) = days else { return };
    let cutoff = crate::keyed::alerts::wall_now() - days * 86_400.0;
    match archive.prune(cutoff).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(sink = %name, rows = n, days, "rows past the retention deleted"),
        Err(e) => tracing::warn!(sink = %name, "cannot delete rows past the retention: {e}"),
    }
}

pub async fn run(
    name: &str,
    config: DatabaseSinkConfig,
    mut rx: SinkRx,
    _ctx: &SinkContext,
) -> anyhow::Result<()> {
    let mut records: Vec<Arc<crate::output::OutputRecord>> = Vec::new();
    let Some(archive) = open(name, &config.url, &rx).await? else {
        give_up_rest(name, &mut rx, &mut records).await;
        return Ok(());
    };
    prune(name, &archive, config.retention_days).await;
    let mut next_prune = Instant::now() + PRUNE_EVERY;
    let max = config.batch_max_records.max(1);
    let linger = Duration::from_millis(config.batch_timeout_ms);
    let mut batch = Batch::default();
    loop {
        let n = tokio::select! {
            n = rx.recv_batch(&mut records, max, linger) => n,
            _ = tokio::time::sleep_until(next_prune), if config.retention_days.is_some() => {
                prune(name, &archive, config.retention_days).await;
                next_prune = Instant::now() + PRUNE_EVERY;
                continue;
            }
        };
        if n == 0 {
            break;
        }
        batch.clear();
        for record in &records {
            if let Err(e) = batch.add(record.line()) {
                metrics::counter!("fluxpipe_records_dropped_total", "sink" => name.to_string(), "reason" => "unstorable").increment(1);
                tracing::error!(sink = %name, "record not stored: {e}");
            }
        }
        let mut retry = Retry::new(name);
        loop {
            match archive.store(&batch).await {
                Ok(()) => {
                    retry.succeeded("writing");
                    rx.delivered(n as u64);
                    break;
                }
                Err(e) if e.is_transient() && retry.again("writing", &e, &rx).await => {}
                Err(e) => {
                    tracing::error!(sink = %name, records = n, "batch not stored (the next run writes it again): {e}");
                    rx.given_up(n as u64);
                    if !e.is_transient() {
                        return Err(e.into());
                    }
                    break;
                }
            }
        }
        records.clear();
    }
    archive.close().await;
    Ok(())
}

/// Shutting down with the database away: what is left is given up (held
/// back from the final checkpoint, so the next run writes it).
async fn give_up_rest(
    name: &str,
    rx: &mut SinkRx,
    records: &mut Vec<Arc<crate::output::OutputRecord>>,
) {
    let mut left = 0;
    while rx.recv_many(records, 1024).await > 0 {
        left += records.len() as u64;
        records.clear();
    }
    if left > 0 {
        tracing::error!(sink = %name, records = left, "database unreachable at shutdown: records not stored (the next run writes them again)");
        rx.given_up(left);
    }
}
