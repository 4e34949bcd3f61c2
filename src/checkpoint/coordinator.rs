//! Checkpoint coordination: a barrier through the operators, as Flink
//! aligns one, so the state saved is exactly the state after the
//! positions saved.
//!
//! One round, every `checkpoint.interval_secs`:
//! 1. Every source that has positions (files, Kafka, and `http` sources
//!    that acknowledge at checkpoints) is asked, stops between two records,
//!    reports its positions and waits.
//! 2. With every such source at rest, a barrier goes into every shard's
//!    queue, behind everything those sources sent; then the sources go on.
//! 3. Each shard, reaching the barrier, has applied exactly the records
//!    before the positions; it encodes its state, answers, and waits until
//!    every shard has (an aligned barrier): then every output of a record
//!    before the barrier is queued at the sinks and none after it, and each
//!    `file` sink's cut is placed there ([`crate::checkpoint::offsets`]).
//! 4. The outputs of those records are queued at the sinks by then; the
//!    round waits until every sink is done with what was queued for it, so
//!    no output of a saved record is lost in a crash. If a sink has given
//!    up on any record (rejected, retries exhausted), no round succeeds
//!    any more: the positions stay before it, and a restart reads it again.
//! 5. Sources that keep a changelog (Kafka) write the state changes of
//!    their partitions, each partition's closed by the offset it stands
//!    at ([`crate::checkpoint::changelog`]), and wait for the broker's acknowledgement.
//! 6. Positions and states are written as one file ([`crate::checkpoint::file`]);
//!    then sources may commit the positions upstream.
//!
//! A round that takes longer than `checkpoint.timeout_secs` at any step is
//! abandoned (logged, counted) and the previous checkpoint stays. Sources
//! without positions (stdin, sockets, `http` sources that acknowledge on
//! receipt) take no part: what they sent is in the state or not, and
//! cannot be asked for again either way.
//!
//! At shutdown no barrier is needed: once the sources have stopped and the
//! shards and sinks have drained, the final state is saved with the
//! sources' final positions ([`crate::pipeline::topology`]).

use crate::channels::fanout::SinkCounters;
use crate::channels::query::WatchFiring;
use crate::channels::router::Router;
use crate::checkpoint::changelog::Change;
use crate::checkpoint::file::{self as checkpoint, Head};
use crate::checkpoint::link::{ChangelogBatch, CheckpointLink, SourceReport};
use crate::checkpoint::offsets::SinkOffsets;
use crate::telemetry::metric;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// How checkpoints are taken.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Between rounds; `None`: only at shutdown.
    pub interval: Option<Duration>,
    /// Longest one round may take.
    pub timeout: Duration,
}

/// The coordinator task's state.
pub struct Coordinator {
    dir: PathBuf,
    schedule: Schedule,
    router: Option<Router>,
    sinks: SinkCounters,
    offsets: SinkOffsets,
    requests: watch::Sender<u64>,
    written: watch::Sender<u64>,
    reports: mpsc::Receiver<SourceReport>,
    report_tx: mpsc::Sender<SourceReport>,
    /// Sources that take part in rounds and have not finished.
    live: HashSet<Arc<str>>,
    /// Sources of any kind still running.
    running: usize,
    positions: BTreeMap<String, String>,
    seq: u64,
    /// Sources that keep a changelog.
    changelogs: HashMap<Arc<str>, mpsc::Sender<ChangelogBatch>>,
    /// A round was asked for while one was under way.
    hurried: bool,
    /// What the pipeline's sources read, kept in each checkpoint.
    identities: BTreeMap<String, String>,
    /// Changes not yet in a changelog (a round failed after the shards
    /// handed them over): they go with the next round.
    carry: HashMap<Arc<str>, Vec<Change>>,
    /// What the feed watch has fired, kept in each checkpoint.
    watch: WatchFiring,
}

/// Why a round was abandoned.
#[derive(Debug, thiserror::Error)]
enum Abandoned {
    #[error("sources did not reach a barrier in {0:?}: {1}")]
    Sources(Duration, String),
    #[error("the shards are gone")]
    Shards,
    #[error("a shard did not answer in {0:?}")]
    ShardTimeout(Duration),
    #[error(transparent)]
    Encode(checkpoint::CheckpointError),
    #[error("sinks still busy after {0:?}: {1}")]
    Sinks(Duration, String),
    #[error(
        "sinks gave up on {0} records: positions stay at the last checkpoint, and a restart reads those records again"
    )]
    GivenUp(u64),
    #[error(transparent)]
    Cut(crate::checkpoint::offsets::NotReached),
    #[error("changelog of source {0}: {1}")]
    Changelog(Arc<str>, String),
    #[error(transparent)]
    Write(checkpoint::CheckpointError),
}

impl Coordinator {
    /// `restored`: the head of the checkpoint restored (its positions stay
    /// until a source reports new ones).
    pub fn new(
        dir: PathBuf,
        schedule: Schedule,
        router: Router,
        sinks: SinkCounters,
        offsets: SinkOffsets,
        restored: Option<&Head>,
    ) -> Self {
        let (requests, _) = watch::channel(0);
        let (written, _) = watch::channel(0);
        let (report_tx, reports) = mpsc::channel(64);
        Coordinator {
            dir,
            schedule,
            router: Some(router),
            sinks,
            offsets,
            requests,
            written,
            reports,
            report_tx,
            live: HashSet::new(),
            running: 0,
            positions: restored.map(|h| h.sources.clone()).unwrap_or_default(),
            seq: restored.map_or(0, |h| h.seq),
            changelogs: HashMap::new(),
            carry: HashMap::new(),
            hurried: false,
            identities: BTreeMap::new(),
            watch: WatchFiring::default(),
        }
    }

    /// Checkpoints keep what the feed watch has fired.
    pub fn with_watch(mut self, watch: WatchFiring) -> Self {
        self.watch = watch;
        self
    }

    /// Checkpoints name what the sources read (see [`Head::identities`]).
    pub fn with_identities(mut self, identities: BTreeMap<String, String>) -> Self {
        self.identities = identities;
        self
    }

    /// The link for a source; `positions`: whether it takes part in rounds;
    /// `changelog`: whether it keeps a changelog.
    pub fn link(&mut self, source: &str, positions: bool, changelog: bool) -> CheckpointLink {
        self.running += 1;
        if positions {
            self.live.insert(source.into());
        }
        let batches = changelog.then(|| {
            let (tx, rx) = mpsc::channel(1);
            self.changelogs.insert(source.into(), tx);
            rx
        });
        CheckpointLink::new(
            self.requests.subscribe(),
            self.written.subscribe(),
            self.report_tx.clone(),
            self.positions.get(source).map(|p| Arc::from(p.as_str())),
            batches,
        )
    }

    /// Take checkpoints until every source has finished; returns the
    /// round count and the sources' final positions for the checkpoint
    /// taken at shutdown.
    pub async fn run(mut self) -> (u64, BTreeMap<String, String>) {
        // Only the links may keep the reports open: a source task that
        // died without reporting still ends the loop.
        self.report_tx = mpsc::channel(1).0;
        let interval = self.schedule.interval;
        // With no checkpoint yet, the first round comes at once: it notes
        // where the file sinks' files stood before this run wrote to them,
        // so a crash before the first interval cuts back to there rather
        // than keeping output the restart writes again.
        let mut next =
            interval.map(|i| Instant::now() + if self.seq == 0 { Duration::ZERO } else { i });
        while self.running > 0 {
            tokio::select! {
                report = self.reports.recv() => match report {
                    Some(SourceReport::Hurry) => next = Some(Instant::now()),
                    Some(r) => self.note(r, None),
                    None => break,
                },
                _ = sleep_until(next) => {
                    self.seq += 1;
                    let started = Instant::now();
                    match self.round().await {
                        Ok(bytes) => {
                            let took = started.elapsed();
                            metrics::histogram!(metric::FLUXPIPE_CHECKPOINT_DURATION_SECONDS)
                                .record(took.as_secs_f64());
                            metrics::gauge!(metric::FLUXPIPE_CHECKPOINT_BYTES).set(bytes as f64);
                            metrics::gauge!(metric::FLUXPIPE_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS)
                                .set(crate::keyed::alerts::wall_now());
                            tracing::debug!(seq = self.seq, bytes, ?took, "checkpoint written");
                            self.written.send_replace(self.seq);
                        }
                        Err(e) => {
                            metrics::counter!(metric::FLUXPIPE_CHECKPOINT_FAILURES_TOTAL).increment(1);
                            if self.offsets.is_reader_gone() {
                                // `fluxpipe run | head`: stopping, as asked.
                                tracing::debug!(seq = self.seq, "checkpoint abandoned, the output's reader is gone: {e}");
                            } else {
                                tracing::error!(seq = self.seq, "checkpoint abandoned (the previous one stays): {e}");
                            }
                        }
                    }
                    next = if std::mem::take(&mut self.hurried) {
                        Some(Instant::now())
                    } else {
                        interval.map(|i| Instant::now() + i)
                    };
                }
            }
        }
        // Every source is done: let the shards drain and end.
        self.router = None;
        (self.seq, self.positions)
    }

    /// Take in a report outside of (or during) a round. A finished source
    /// counts as at rest: it sends nothing more.
    fn note(&mut self, report: SourceReport, round: Option<&mut Round>) {
        match report {
            SourceReport::Finished { source, positions } => {
                self.running = self.running.saturating_sub(1);
                if let Some(p) = positions {
                    self.positions.insert(source.to_string(), p);
                }
                self.live.remove(&source);
                if let Some(r) = round {
                    r.waiting.remove(&source);
                }
            }
            // A round is under way: another one right after it.
            SourceReport::Hurry => self.hurried = true,
            SourceReport::Positions {
                source,
                seq,
                positions,
                resume,
            } => match round {
                Some(r) if seq == self.seq => {
                    r.waiting.remove(&source);
                    r.positions.insert(source.to_string(), positions);
                    r.resume.push(resume);
                }
                // A report for a round given up on: let the source go.
                _ => drop(resume),
            },
        }
    }

    async fn round(&mut self) -> Result<usize, Abandoned> {
        let timeout = self.schedule.timeout;
        let deadline = Instant::now() + timeout;
        let mut round = Round {
            waiting: self.live.clone(),
            positions: BTreeMap::new(),
            resume: Vec::new(),
        };
        self.requests.send_replace(self.seq);
        // 1. Every source with positions at rest.
        while !round.waiting.is_empty() {
            match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                Ok(Some(r)) => self.note(r, Some(&mut round)),
                Ok(None) => break,
                Err(_) => {
                    let names: Vec<&str> = round.waiting.iter().map(|s| &**s).collect();
                    return Err(Abandoned::Sources(timeout, names.join(", ")));
                }
            }
        }
        // 2. The barrier behind them; then they go on.
        let router = self.router.as_ref().ok_or(Abandoned::Shards)?;
        let barrier = tokio::time::timeout_at(deadline, router.barrier())
            .await
            .map_err(|_| Abandoned::ShardTimeout(timeout))?
            .map_err(|_| Abandoned::Shards)?;
        drop(round.resume);
        let (replies, release) = (barrier.replies, barrier.release);
        // 3. Each shard's state, and its changes for the changelogs.
        let mut shards = Vec::with_capacity(replies.len());
        for reply in replies {
            let reply = tokio::time::timeout_at(deadline, reply)
                .await
                .map_err(|_| Abandoned::ShardTimeout(timeout))?
                .map_err(|_| Abandoned::Shards)?
                .map_err(Abandoned::Encode)?;
            for change in reply.changes {
                if self.changelogs.contains_key(&change.owner.source) {
                    self.carry
                        .entry(change.owner.source.clone())
                        .or_default()
                        .push(change);
                }
            }
            shards.push(reply.state);
        }
        // Every shard has answered and waits: every output of a record
        // before the barrier is queued at the sinks, none after it. Each
        // file sink's cut falls after what it has been given; then the
        // shards go on.
        self.offsets.ask_cuts(|name| self.sinks.queued(name));
        let _ = release.send(true);
        // 4. Sinks done with the outputs of what the shards applied.
        let marks = self.sinks.watermarks();
        loop {
            let pending = marks.pending();
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let busy: Vec<String> = pending
                    .iter()
                    .map(|(s, n)| format!("{s} ({n} records)"))
                    .collect();
                return Err(Abandoned::Sinks(timeout, busy.join(", ")));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A record a sink gave up on is never skipped: no position moves
        // past it while this process runs.
        let given_up = self.sinks.given_up();
        if given_up > 0 {
            return Err(Abandoned::GivenUp(given_up));
        }
        // Each file sink's place at the cut (one just started may still be
        // opening its file).
        let sink_cuts = loop {
            match self.offsets.cuts() {
                Ok(cuts) => break cuts,
                Err(e) if Instant::now() >= deadline => return Err(Abandoned::Cut(e)),
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        // 5. The changelogs: their positions are those of this round.
        self.write_changelogs(deadline).await?;
        // 6. One file.
        for (source, p) in round.positions {
            self.positions.insert(source, p);
        }
        let head = Head {
            seq: self.seq,
            written_at: crate::keyed::alerts::wall_now(),
            sources: self.positions.clone(),
            sinks: sink_cuts,
            identities: self.identities.clone(),
            watch: self.watch.saved(),
        };
        write(self.dir.clone(), head, shards)
            .await
            .map_err(Abandoned::Write)
    }

    /// Hand each changelog its changes (a source without any still gets
    /// the round: its offsets may have moved) and wait for them to be
    /// written. What fails stays for the next round.
    async fn write_changelogs(&mut self, deadline: Instant) -> Result<(), Abandoned> {
        let sources: Vec<Arc<str>> = self.changelogs.keys().cloned().collect();
        for source in sources {
            let Some(tx) = self.changelogs.get(&source) else {
                continue;
            };
            let changes = self.carry.remove(&source).unwrap_or_default();
            let (done, reply) = oneshot::channel();
            let batch = ChangelogBatch {
                seq: self.seq,
                changes,
                done,
            };
            let result = match tx.send(batch).await {
                Ok(()) => match tokio::time::timeout_at(deadline, reply).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => Err("the source stopped".to_string()),
                    Err(_) => Err(format!("not written in {:?}", self.schedule.timeout)),
                },
                Err(mpsc::error::SendError(batch)) => {
                    // The source has stopped; its changes wait for a restart
                    // (they are in the local checkpoint either way).
                    self.changelogs.remove(&source);
                    self.carry.insert(source.clone(), batch.changes);
                    continue;
                }
            };
            if let Err(e) = result {
                return Err(Abandoned::Changelog(source, e));
            }
        }
        Ok(())
    }
}

/// What one round has gathered.
struct Round {
    waiting: HashSet<Arc<str>>,
    positions: BTreeMap<String, String>,
    resume: Vec<oneshot::Sender<()>>,
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Encode and store a checkpoint off the async threads; returns its size.
pub async fn write(
    dir: PathBuf,
    head: Head,
    shards: Vec<checkpoint::ShardBytes>,
) -> Result<usize, checkpoint::CheckpointError> {
    let task = tokio::task::spawn_blocking(move || checkpoint::store(&dir, &head, &shards));
    match task.await {
        Ok(r) => r,
        Err(e) => Err(checkpoint::CheckpointError::Write {
            path: PathBuf::from(checkpoint::FILE_NAME),
            source: std::io::Error::other(e.to_string()),
        }),
    }
}
