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
//! While the database is down, refuses (busy, too many connections) or
//! fails otherwise (a wrong password, a schema this fluxpipe does not
//! know), the batch is retried with backoff (100 ms doubling to 30 s) for
//! as long as it takes; records wait in the sink's buffer meanwhile, and
//! `when_full` applies when it fills. Once the pipeline shuts down, the
//! sink tries for [`SHUTDOWN_GRACE`] at most, then gives up what it has
//! not stored: no final checkpoint passes it, so the next run writes it.

use super::retry::{Failure, Retry, Tried};
use super::{SinkContext, SinkRx};
use crate::archive::rows::Batch;
use crate::archive::{self, Access, Archive, ArchiveError};
use crate::component::Problem;
use crate::output::OutputStream;
use crate::telemetry::metric;
use std::time::Duration;
use tokio::time::Instant;

crate::sinks::config::sink_config! {
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
const STORED: [OutputStream; 4] = [
    OutputStream::Jobs,
    OutputStream::JobUpdates,
    OutputStream::Resources,
    OutputStream::Transitions,
];

impl super::SinkSpec for DatabaseSinkConfig {
    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if let Err(e) = archive::check_url(&self.url) {
            out.push(Problem::new("url", format!(": {e}")));
        }
        if self.batch_timeout_ms > MAX_BATCH_TIMEOUT_MS {
            out.push(Problem::new(
                "batch_timeout_ms",
                format!(": at most {MAX_BATCH_TIMEOUT_MS} (an hour)"),
            ));
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
        let takes = |s: OutputStream| {
            self.inputs
                .iter()
                .any(|i| OutputStream::parse(i) == Some(s))
        };
        for (i, input) in self.inputs.iter().enumerate() {
            if OutputStream::parse(input).is_some_and(|s| !STORED.contains(&s)) {
                out.push(Problem::at(
                    "inputs",
                    i,
                    format!(
                        ": the database keeps jobs, job_updates, resources and transitions, not `{input}`"
                    ),
                ));
            }
        }
        // Updates alone would leave every row active: never final, never
        // deleted by the retention.
        if takes(OutputStream::JobUpdates) && !takes(OutputStream::Jobs) {
            out.push(Problem::new(
                "inputs",
                ": `job_updates` needs `jobs` beside it (a job's final row comes from `jobs`)",
            ));
        }
        out
    }
}

pub use super::retry::SHUTDOWN_GRACE;
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Longest `batch_timeout_ms` taken.
const MAX_BATCH_TIMEOUT_MS: u64 = 3_600_000;

/// The time before which rows are past the retention, if one is set.
fn retention_cutoff(days: Option<f64>) -> Option<f64> {
    days.map(|days| crate::keyed::alerts::wall_now() - days * 86_400.0)
}

/// Delete rows past the retention, if one is set; a failure waits for the
/// next round.
async fn prune(name: &str, archive: &Archive, days: Option<f64>) {
    let Some(cutoff) = retention_cutoff(days) else {
        return;
    };
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
    ctx: &SinkContext,
) -> anyhow::Result<()> {
    let mut retry = Retry::new(name, &ctx.shutdown, "the database answers");
    let url = config.url.as_str();
    let opened = retry
        .until_done("connecting", &rx, || async {
            let archive = Archive::connect(url, Access::Write).await?;
            archive.migrate().await?;
            Ok::<_, ArchiveError>(archive)
        })
        .await;
    let Tried::Done(archive) = opened else {
        give_up_rest(name, &mut rx, 0).await;
        return Ok(());
    };
    tracing::info!(sink = %name, schema = archive::schema::LATEST, "database ready");
    // The jobs an older archive holds are counted in the daily rollups
    // beside the batches, not before them (10M jobs take ~16 minutes on
    // PostgreSQL here): each chunk is a transaction of its own.
    let counting = tokio::spawn({
        let (archive, name) = (archive.clone(), name.to_string());
        let not_before = retention_cutoff(config.retention_days);
        async move {
            match archive.roll_up_pending(not_before).await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(sink = %name, jobs = n, "finished jobs counted in the daily rollups")
                }
                Err(e) => {
                    // Counted as the sink's error, so its default alert
                    // says what the log alone would keep quiet.
                    metrics::counter!(metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink" => name.to_string())
                        .increment(1);
                    tracing::warn!(sink = %name, "cannot count the archive's jobs in its rollups (next start tries again): {e}")
                }
            }
        }
    });
    prune(name, &archive, config.retention_days).await;
    let mut next_prune = Instant::now() + PRUNE_EVERY;
    let max = config.batch_max_records.max(1);
    let linger = Duration::from_millis(config.batch_timeout_ms.min(MAX_BATCH_TIMEOUT_MS));
    let mut records = Vec::new();
    let mut batch = Batch::default();
    loop {
        // `recv_batch` keeps what it took when the prune interrupts it.
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
        let mut refused = 0;
        for record in &records {
            if let Err(e) = batch.add(record) {
                refused += 1;
                metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => name.to_string(), "reason" => "unstorable").increment(1);
                tracing::error!(sink = %name, "record not stored: {e}");
            }
        }
        records.clear();
        rx.done_with(refused);
        let stored = n as u64 - refused;
        match retry
            .until_done("writing", &rx, || {
                archive.store(&batch, retention_cutoff(config.retention_days))
            })
            .await
        {
            Tried::Done(()) => rx.delivered(stored),
            Tried::GaveUp => {
                give_up_rest(name, &mut rx, stored).await;
                break;
            }
        }
    }
    counting.abort();
    archive.close().await;
    Ok(())
}

/// Shutting down with the database away: `held` records in hand and what
/// is left in the channel are given up (held back from the final
/// checkpoint, so the next run writes them).
async fn give_up_rest(name: &str, rx: &mut SinkRx, held: u64) {
    let left = rx.give_up_rest(held).await;
    if left > 0 {
        tracing::error!(sink = %name, records = left, "database unreachable at shutdown: records not stored (the next run writes them again)");
    }
}

impl Failure for ArchiveError {
    fn is_outage(&self) -> bool {
        ArchiveError::is_outage(self)
    }
}
