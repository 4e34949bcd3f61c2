//! The consumer group member behind `type = "kafka"` (see the module
//! above for what it promises).

use super::KafkaSourceConfig;
use super::brokers::{self, BrokerHealth};
use super::changelog;
use crate::channels::router::Closed;
use crate::decode::{EventStream, Origin};
use crate::flux::jobid::JobId;
use crate::keyed::Owner;
use crate::sources::SourceContext;
use crate::sources::lines::Line;
use crate::telemetry::metric;
use anyhow::{Context, Result, anyhow, bail};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaResult;
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientContext, Statistics};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// Partition → next offset to read.
pub(super) type Offsets = BTreeMap<(String, i32), i64>;

/// The positions, in the JSON form kept in a checkpoint.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Positions {
    version: u32,
    /// `topic` → partition → next offset.
    offsets: BTreeMap<String, BTreeMap<i32, i64>>,
}

const POSITIONS_VERSION: u32 = 1;

impl Positions {
    fn from_offsets(offsets: &Offsets) -> Self {
        let mut out = Positions {
            version: POSITIONS_VERSION,
            offsets: BTreeMap::new(),
        };
        for ((topic, p), o) in offsets {
            out.offsets.entry(topic.clone()).or_default().insert(*p, *o);
        }
        out
    }

    fn offsets(&self) -> Offsets {
        self.offsets
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(move |(p, o)| ((t.clone(), *p), *o)))
            .collect()
    }
}

fn parse_positions(text: Option<&str>) -> Result<Offsets> {
    let Some(text) = text else {
        return Ok(Offsets::new());
    };
    let p: Positions = serde_json::from_str(text).map_err(|e| anyhow!("corrupt: {e}"))?;
    if p.version != POSITIONS_VERSION {
        return Err(anyhow!(
            "corrupt: version {} (this fluxpipe writes {POSITIONS_VERSION})",
            p.version
        ));
    }
    Ok(p.offsets())
}

/// What the rebalance callbacks share with the source task.
#[derive(Default)]
struct Shared {
    /// Offsets of partitions taken over, covered by a checkpoint on disk:
    /// what is committed when a partition is revoked.
    checkpointed: Offsets,
    /// Assigned (and paused) since the task last looked: to take over.
    assigned: Vec<(String, i32)>,
    /// An assignment (possibly empty) came since the task last looked.
    assignment_seen: bool,
    /// Revoked since the task last looked, not unassigned yet: to hand
    /// over after one more checkpoint.
    revoking: Vec<(String, i32)>,
    /// Revoked and unassigned since the task last looked: to release.
    revoked: Vec<(String, i32)>,
    /// The consumer is closing: revocations are immediate.
    closing: bool,
}

struct GroupContext {
    source: String,
    shared: Arc<Mutex<Shared>>,
    /// Wakes the task after a rebalance.
    rebalanced: Arc<Notify>,
    /// Orders changelog writes and revocations.
    fence: Arc<Mutex<changelog::Fence>>,
    /// Offsets reported per round, until committed.
    reported: Arc<Mutex<BTreeMap<u64, Offsets>>>,
    /// Whether a broker is reachable, for `/readyz`.
    health: BrokerHealth,
}

impl ClientContext for GroupContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.health.error(&error, reason);
    }

    fn stats(&self, stats: Statistics) {
        self.health.stats(&stats);
        for (topic, t) in &stats.topics {
            for (p, part) in &t.partitions {
                if *p < 0 || part.consumer_lag < 0 {
                    continue;
                }
                metrics::gauge!(metric::FLUXPIPE_KAFKA_CONSUMER_LAG, "source" => self.source.clone(), "topic" => topic.clone(), "partition" => p.to_string())
                    .set(part.consumer_lag as f64);
            }
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

impl ConsumerContext for GroupContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: rdkafka::types::RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        use rdkafka::consumer::RebalanceProtocol;
        use rdkafka::types::RDKafkaRespErr as E;
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let partitions = partitions_of(tpl);
        let result = match err {
            E::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                // Paused until the task has taken the partitions over
                // (their state restored, their start offset chosen).
                let r = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                if let Err(e) = consumer.pause(tpl) {
                    tracing::error!(source = %self.source, "cannot pause assigned partitions: {e}");
                }
                tracing::info!(source = %self.source, partitions = ?partitions, "partitions assigned");
                if let Ok(mut s) = self.shared.lock() {
                    s.assigned.extend(partitions);
                    s.assignment_seen = true;
                }
                r
            }
            E::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let closing = consumer.closed() || self.shared.lock().map_or(true, |s| s.closing);
                if cooperative && !closing {
                    // Handed over after one more checkpoint round, so the
                    // next owner starts exactly where this one stopped: the
                    // task unassigns them then (librdkafka waits for it).
                    if let Err(e) = consumer.pause(tpl) {
                        tracing::error!(source = %self.source, "cannot pause revoked partitions: {e}");
                    }
                    tracing::info!(source = %self.source, partitions = ?partitions, "partitions revoked: handing them over after a last checkpoint");
                    if let Ok(mut s) = self.shared.lock() {
                        s.revoking.extend(partitions);
                    }
                    self.rebalanced.notify_one();
                    return;
                }
                self.hand_over(consumer, &partitions, cooperative)
            }
            other => {
                tracing::error!(source = %self.source, "rebalance error: {other:?}");
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            tracing::error!(source = %self.source, "cannot apply the assignment: {e}");
        }
        self.rebalanced.notify_one();
    }

    fn pre_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {}
}

impl GroupContext {
    /// Let revoked partitions go: no changelog write for them from now on
    /// (one in flight finishes first: their next owner may read the
    /// changelog any time), what the checkpoint covers committed, then
    /// unassigned; the task releases their state.
    fn hand_over<C: Consumer<GroupContext>>(
        &self,
        consumer: &C,
        partitions: &[(String, i32)],
        cooperative: bool,
    ) -> KafkaResult<()> {
        if let Ok(mut f) = self.fence.lock() {
            for (_, p) in partitions {
                f.owned.remove(p);
            }
        }
        let checkpointed = self
            .shared
            .lock()
            .map(|s| s.checkpointed.clone())
            .unwrap_or_default();
        let mut commit = TopicPartitionList::new();
        let mut unassign = TopicPartitionList::new();
        for key in partitions {
            unassign.add_partition(&key.0, key.1);
            if let Some(o) = checkpointed.get(key) {
                let _ = commit.add_partition_offset(&key.0, key.1, Offset::Offset(*o));
            }
        }
        if commit.count() > 0
            && let Err(e) = consumer.commit(&commit, CommitMode::Sync)
        {
            tracing::warn!(source = %self.source, "commit at revocation failed (the changelog still tells the next owner where to start): {e}");
        }
        tracing::info!(source = %self.source, partitions = ?partitions, "partitions handed over");
        // Offsets of rounds not yet on disk are not ours to commit or
        // write any more (the partition may even come back, further on).
        if let Ok(mut r) = self.reported.lock() {
            for offsets in r.values_mut() {
                for key in partitions {
                    offsets.remove(key);
                }
            }
        }
        if let Ok(mut s) = self.shared.lock() {
            for key in partitions {
                s.checkpointed.remove(key);
            }
            s.revoked.extend(partitions.iter().cloned());
        }
        if cooperative {
            consumer.incremental_unassign(&unassign)
        } else {
            consumer.unassign()
        }
    }
}

/// The consumer's settings: fluxpipe's, then the user's on top.
fn client_config(config: &KafkaSourceConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &config.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("statistics.interval.ms", "5000")
        // Bounded prefetch: with the pipeline full and partitions paused,
        // at most this much waits in librdkafka.
        .set("queued.max.messages.kbytes", "16384");
    for (k, v) in &config.librdkafka_options {
        c.set(k, v);
    }
    c
}

/// Job and stream of a message, from its key and `stream` header.
fn origin_of(msg: &impl Message) -> Origin {
    let id = msg
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .map(|k| k.rsplit('/').next().unwrap_or(k))
        .and_then(|k| JobId::parse(k).ok());
    let stream = msg.headers().and_then(|h| {
        h.iter()
            .find(|h| h.key == "stream")
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(EventStream::parse)
    });
    Origin { stream, id }
}

/// Partitions to release, as one message per source.
fn partition_set(keys: &[(String, i32)]) -> BTreeSet<i32> {
    keys.iter().map(|(_, p)| *p).collect()
}

/// The source task's view of its partitions.
struct Member {
    ctx: SourceContext,
    config: KafkaSourceConfig,
    consumer: Arc<StreamConsumer<GroupContext>>,
    shared: Arc<Mutex<Shared>>,
    /// The changelog topic, if the source keeps one.
    changelog: Option<String>,
    /// Partitions taken over: their records are handed on, their offsets
    /// committed.
    owned: BTreeSet<(String, i32)>,
    /// The same partitions, for the changelog writer.
    fence: Arc<Mutex<changelog::Fence>>,
    /// Next offset to hand on, per partition with a known position.
    offsets: Offsets,
    /// Assigned, not yet taken over, with the first offset of any of
    /// their messages dropped meanwhile.
    taking_over: BTreeMap<(String, i32), Option<i64>>,
    /// Partitions whose state the local checkpoint brought and no
    /// assignment has claimed yet (until the first assignment; without a
    /// changelog, until `unclaimed_until`).
    unclaimed: Option<BTreeSet<(String, i32)>>,
    /// Without a changelog, how long the unclaimed partitions' state waits
    /// for them (a killed instance of this member holds them until its
    /// session times out; nothing else could restore their state).
    unclaimed_until: Option<tokio::time::Instant>,
    /// Revoked partitions waiting for a checkpoint round reported after
    /// their last record (the round's number, exclusive) to hand over.
    leaving: BTreeMap<(String, i32), u64>,
    /// Hand over by then even without that round.
    leave_by: Option<tokio::time::Instant>,
    /// The last round this source reported positions for.
    last_reported: u64,
}

/// Longest a revoked partition waits for its last checkpoint.
const HAND_OVER_WAIT: Duration = Duration::from_secs(30);

impl Member {
    /// Drop the state of partitions this member no longer has.
    async fn release(&self, keys: &[(String, i32)]) -> Result<(), Closed> {
        if keys.is_empty() {
            return Ok(());
        }
        self.ctx
            .router()
            .release(&self.ctx.name, partition_set(keys))
            .await
    }

    /// Hand the leaving partitions over once a round reported after
    /// their last record is on disk (or `now`, when waiting is over).
    async fn hand_over(&mut self, now: bool) -> Result<()> {
        if self.leaving.is_empty() {
            return Ok(());
        }
        let written = self.ctx.checkpoint.written();
        if !now && !self.leaving.values().all(|after| written > *after) {
            return Ok(());
        }
        let keys: Vec<(String, i32)> = std::mem::take(&mut self.leaving).into_keys().collect();
        self.leave_by = None;
        let consumer = self.consumer.clone();
        let done = tokio::task::spawn_blocking(move || {
            consumer.context().hand_over(&*consumer, &keys, true)
        })
        .await
        .context("partition hand-over")?;
        if let Err(e) = done {
            tracing::error!(source = %self.ctx.name, "cannot unassign revoked partitions: {e}");
        }
        self.rebalanced().await
    }

    /// Act on what the rebalance callbacks noted.
    async fn rebalanced(&mut self) -> Result<()> {
        let (assigned, revoking, revoked, seen) = match self.shared.lock() {
            Ok(mut s) => (
                std::mem::take(&mut s.assigned),
                std::mem::take(&mut s.revoking),
                std::mem::take(&mut s.revoked),
                std::mem::take(&mut s.assignment_seen),
            ),
            Err(_) => return Ok(()),
        };
        if !revoking.is_empty() {
            // Their records stop here; the next round saves the state
            // after them, then they go.
            for key in revoking {
                // Not taken over yet: nothing to save, nothing to restore.
                self.taking_over.remove(&key);
                self.leaving.insert(key, self.last_reported);
            }
            self.leave_by = Some(tokio::time::Instant::now() + HAND_OVER_WAIT);
            self.ctx.checkpoint.hurry();
        }
        for key in &revoked {
            self.owned.remove(key);
            self.offsets.remove(key);
            self.taking_over.remove(key);
            if let Some(u) = &mut self.unclaimed {
                u.remove(key);
            }
        }
        self.release(&revoked).await?;
        self.count_owned();
        if !seen {
            return Ok(());
        }
        // The first assignment settles which partitions the local
        // checkpoint's state is still good for: the rest would count twice
        // in the group's gauges (if one comes back later, it is taken over
        // from the changelog).
        if let Some(mut unclaimed) = self.unclaimed.take() {
            unclaimed.retain(|k| !assigned.contains(k));
            let waiting = self
                .unclaimed_until
                .is_none_or(|t| tokio::time::Instant::now() < t);
            if self.changelog.is_none() && !unclaimed.is_empty() && waiting {
                if self.unclaimed_until.is_none() {
                    let wait = unclaimed_wait(&self.config);
                    tracing::info!(source = %self.ctx.name, partitions = ?unclaimed, ?wait, "partitions of the checkpoint not assigned yet (a killed instance holds them until its session times out): their state waits for them");
                    self.unclaimed_until = Some(tokio::time::Instant::now() + wait);
                }
                self.unclaimed = Some(unclaimed);
            } else {
                self.unclaimed_until = None;
                self.release_unclaimed(unclaimed).await?;
            }
        }
        for key in assigned {
            self.taking_over.insert(key, None);
        }
        let pending: Vec<(String, i32)> = self.taking_over.keys().cloned().collect();
        for key in pending {
            self.take_over(key).await?;
        }
        Ok(())
    }

    /// Drop the state of checkpointed partitions that were not assigned to
    /// this member.
    async fn release_unclaimed(
        &mut self,
        unclaimed: BTreeSet<(String, i32)>,
    ) -> Result<(), Closed> {
        let stale: Vec<(String, i32)> = unclaimed.into_iter().collect();
        for key in &stale {
            self.offsets.remove(key);
            if let Ok(mut s) = self.shared.lock() {
                s.checkpointed.remove(key);
            }
        }
        self.release(&stale).await
    }

    /// Take an assigned partition over: its state (the local checkpoint's
    /// if that is not behind the group, else the changelog's), then its
    /// records from where that state stands.
    async fn take_over(&mut self, key: (String, i32)) -> Result<()> {
        let (topic, partition) = key.clone();
        let committed = self.committed(&key).await;
        let local = self.offsets.get(&key).copied();
        let mut from = "changelog";
        let start = match local {
            Some(l) if committed.is_none_or(|c| l >= c) => {
                tracing::info!(source = %self.ctx.name, %topic, partition, offset = l, "taking over from the local checkpoint");
                from = "checkpoint";
                Some(l)
            }
            _ => {
                if let Some(l) = local {
                    tracing::info!(source = %self.ctx.name, %topic, partition, local = l, ?committed, "local checkpoint is behind the group: its state for the partition is dropped");
                    self.offsets.remove(&key);
                    self.release(std::slice::from_ref(&key)).await?;
                }
                let restored = match &self.changelog {
                    Some(log) => self.restore(log.clone(), partition).await?,
                    None => {
                        from = "none";
                        None
                    }
                };
                restored.or(committed)
            }
        };
        let dropped = self.taking_over.remove(&key).flatten();
        let start = start.or(dropped);
        let consumer = self.consumer.clone();
        let (t, p) = (topic.clone(), partition);
        let resumed = tokio::task::spawn_blocking(move || -> KafkaResult<()> {
            if let Some(o) = start {
                consumer.seek(&t, p, Offset::Offset(o), Duration::from_secs(10))?;
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&t, p);
            consumer.resume(&tpl)
        })
        .await
        .context("partition takeover")?;
        if let Err(e) = resumed {
            bail!("cannot start reading {topic}/{partition}: {e}");
        }
        if let Ok(mut s) = self.shared.lock() {
            s.checkpointed.remove(&key);
            if let Some(o) = start {
                s.checkpointed.insert(key.clone(), o);
            }
        }
        if let Some(o) = start {
            self.offsets.insert(key.clone(), o);
        }
        tracing::info!(source = %self.ctx.name, %topic, partition, offset = ?start, "partition taken over");
        if let Ok(mut f) = self.fence.lock() {
            f.owned.insert(partition);
        }
        self.owned.insert(key);
        self.count_owned();
        metrics::counter!(metric::FLUXPIPE_KAFKA_PARTITIONS_TAKEN_OVER_TOTAL, "source" => self.ctx.name.to_string(), "from" => from)
            .increment(1);
        Ok(())
    }

    fn count_owned(&self) {
        metrics::gauge!(metric::FLUXPIPE_KAFKA_PARTITIONS_OWNED, "source" => self.ctx.name.to_string())
            .set(self.owned.len() as f64);
        self.ctx.set_feed_watched(!self.owned.is_empty());
        self.ctx
            .ownership
            .set_owned(&self.ctx.name, &self.config.topics, &self.owned);
    }

    /// The group's committed offset of a partition.
    async fn committed(&self, key: &(String, i32)) -> Option<i64> {
        let consumer = self.consumer.clone();
        let (topic, partition) = key.clone();
        let looked_up = tokio::task::spawn_blocking(move || -> KafkaResult<Option<i64>> {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, partition);
            let got = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
            let offset = got
                .find_partition(&topic, partition)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
            Ok(offset)
        })
        .await;
        match looked_up {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => {
                tracing::warn!(source = %self.ctx.name, "cannot read the committed offset of {}/{}: {e}", key.0, key.1);
                None
            }
            Err(_) => None,
        }
    }

    /// Rebuild a partition's state from the changelog and hand it to the
    /// shards; returns the input offset it is the state after.
    async fn restore(&self, log: String, partition: i32) -> Result<Option<i64>> {
        let owner = Owner {
            source: self.ctx.name.clone(),
            partition,
        };
        // A broker that lost its data lost this topic too: made again at
        // once (the state it held is gone), not waited for partition by
        // partition while the group waits for this member.
        match changelog::ensure_topic(&self.config, &log).await {
            Ok(true) => {
                tracing::warn!(source = %self.ctx.name, topic = %log, "the changelog topic was gone (a broker that lost its data?): made again, empty; the state it held is lost")
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(source = %self.ctx.name, topic = %log, "{e:#}"),
        }
        let config = self.config.clone();
        let started = std::time::Instant::now();
        let restored =
            tokio::task::spawn_blocking(move || changelog::read_partition(&config, &log, &owner))
                .await
                .context("changelog restore")?
                .with_context(|| {
                    format!("cannot restore partition {partition} from the changelog")
                })?;
        if restored.skipped > 0 {
            metrics::counter!(metric::FLUXPIPE_SOURCE_ERRORS_TOTAL, "source" => self.ctx.name.to_string())
                .increment(restored.skipped);
            tracing::warn!(source = %self.ctx.name, partition, skipped = restored.skipped, "changelog records that could not be read were skipped");
        }
        tracing::info!(
            source = %self.ctx.name,
            partition,
            jobs = restored.state.jobs.len(),
            clusters = restored.state.resources.len(),
            offset = ?restored.offset,
            unfinished = restored.unfinished,
            took = ?started.elapsed(),
            "partition state restored from the changelog"
        );
        self.ctx.router().adopt(restored.state).await?;
        Ok(restored.offset)
    }
}

/// Run until shutdown; returns the final positions.
pub async fn run(config: KafkaSourceConfig, ctx: SourceContext) -> Result<String> {
    let restored = parse_positions(ctx.checkpoint.restored())
        .with_context(|| format!("source {}: the positions in the checkpoint", ctx.name))?;
    let changelog_topic = config.changelog_topic();
    // Stopped before a broker answered: nothing read, the positions stay.
    let unchanged = || Ok(serde_json::to_string(&Positions::from_offsets(&restored))?);
    if !brokers::wait_for_one(&config, &ctx).await? {
        return unchanged();
    }
    if let Some(topic) = &changelog_topic {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return unchanged(),
            made = changelog::ensure_topic(&config, topic) => {
                made.with_context(|| format!("source {}: changelog topic {topic}", ctx.name))?;
            }
        }
    }
    // Nothing is committed for a partition before it is taken over.
    let shared = Arc::new(Mutex::new(Shared::default()));
    let rebalanced = Arc::new(Notify::new());
    let fence = Arc::new(Mutex::new(changelog::Fence::default()));
    let reported: Arc<Mutex<BTreeMap<u64, Offsets>>> = Arc::default();
    let context = GroupContext {
        source: ctx.name.to_string(),
        shared: shared.clone(),
        rebalanced: rebalanced.clone(),
        fence: fence.clone(),
        reported: reported.clone(),
        health: BrokerHealth::new(&ctx, &config),
    };
    let consumer: StreamConsumer<GroupContext> = client_config(&config)
        .create_with_context(context)
        .context("cannot create the Kafka consumer")?;
    let consumer = Arc::new(consumer);
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .context("cannot subscribe to the topics")?;
    tracing::info!(source = %ctx.name, topics = ?config.topics, group = %config.group_id, changelog = ?changelog_topic, "consumer started");
    // How many partitions each topic has, for the query API's answers
    // (a member says which it owns; the asker, which had none).
    for topic in &config.topics {
        let (probe, t) = (consumer.clone(), topic.clone());
        let (ownership, name) = (ctx.ownership.clone(), ctx.name.clone());
        tokio::task::spawn_blocking(move || {
            if let Ok(Some(n)) = changelog::partition_count(probe.client(), &t, true) {
                ownership.set_partitions(&name, &t, n);
            }
        });
    }
    let mut writer_stopping = None;
    if let Some(topic) = &changelog_topic
        && let Some(batches) = ctx.checkpoint.take_changelog()
    {
        let writer = changelog::Writer::new(
            &config,
            ctx.name.clone(),
            topic.clone(),
            fence.clone(),
            reported.clone(),
        )?;
        writer_stopping = Some(writer.stopping());
        tokio::spawn(writer.run(batches));
    }

    let mut member = Member {
        unclaimed: Some(restored.keys().cloned().collect()),
        unclaimed_until: None,
        offsets: restored,
        ctx: ctx.clone(),
        config,
        consumer: consumer.clone(),
        shared: shared.clone(),
        changelog: changelog_topic,
        owned: BTreeSet::new(),
        fence,
        taking_over: BTreeMap::new(),
        leaving: BTreeMap::new(),
        leave_by: None,
        last_reported: 0,
    };
    let mut errors = 0u64;
    // One handle waits for rounds, the other for checkpoints on disk.
    let mut rounds = ctx.checkpoint.clone();
    let mut disk = ctx.checkpoint.clone();
    loop {
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => break,
            seq = disk.next_written() => {
                commit_checkpointed(&consumer, &shared, &reported, &member.owned, seq, CommitMode::Async, &ctx.name);
                if !going_on(member.hand_over(false).await)? {
                    break;
                }
            }
            _ = sleep_until(member.unclaimed_until), if member.unclaimed_until.is_some() => {
                member.unclaimed_until = None;
                if let Some(unclaimed) = member.unclaimed.take() {
                    tracing::warn!(source = %ctx.name, partitions = ?unclaimed, "partitions of the checkpoint never assigned to this member: their state is dropped (another instance reads them: without a changelog, run one instance per group)");
                    if member.release_unclaimed(unclaimed).await.is_err() {
                        break;
                    }
                }
            }
            _ = sleep_until(member.leave_by), if member.leave_by.is_some() => {
                tracing::warn!(source = %ctx.name, "no checkpoint of the revoked partitions in time: handing them over as of the last one (their next owner re-reads the rest)");
                if !going_on(member.hand_over(true).await)? {
                    break;
                }
            }
            // A checkpoint round: `biased` puts it before the next message.
            seq = rounds.requested() => {
                if let Ok(mut r) = reported.lock() {
                    r.insert(seq, member.offsets.clone());
                }
                member.last_reported = seq;
                let text = serde_json::to_string(&Positions::from_offsets(&member.offsets))?;
                ctx.checkpoint.report(&ctx.name, seq, text).await;
            }
            _ = rebalanced.notified() => {
                if !going_on(member.rebalanced().await)? {
                    break;
                }
            }
            msg = consumer.recv() => {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        metrics::counter!(metric::FLUXPIPE_SOURCE_ERRORS_TOTAL, "source" => ctx.name.to_string()).increment(1);
                        errors += 1;
                        // The first few, then every power of two: a broker
                        // that stays down does not flood the log.
                        if errors <= 10 || errors.is_power_of_two() {
                            tracing::warn!(source = %ctx.name, count = errors, "Kafka: {e}");
                        }
                        continue;
                    }
                };
                tracing::trace!(source = %ctx.name, topic = msg.topic(), partition = msg.partition(), offset = msg.offset(), "message");
                let key = (msg.topic().to_string(), msg.partition());
                if member.leaving.contains_key(&key) {
                    // Revoked: its next owner reads it.
                    continue;
                }
                if !member.owned.contains(&key) {
                    // Not taken over yet: read again from where the
                    // takeover starts (or from here).
                    if let Some(first) = member.taking_over.get_mut(&key) {
                        first.get_or_insert(msg.offset());
                    }
                    continue;
                }
                let origin = ctx.origin_with(origin_of(&msg));
                let offset = msg.offset();
                // Copied: the message borrows the consumer, and is let go
                // before the wait for room at the shards.
                let payload = msg.payload().unwrap_or_default().to_vec();
                drop(msg);
                let line = if payload.len() > ctx.decode.max_line_bytes {
                    Line::TooLong { prefix: &payload[..ctx.decode.max_line_bytes], len: payload.len() }
                } else {
                    Line::Full(&payload)
                };
                let location = || format!("{}/{}@{offset}", key.0, key.1);
                let sent = {
                    let send = ctx.partition_line(line, &origin, &location, Some(key.1));
                    tokio::pin!(send);
                    tokio::select! {
                        biased;
                        r = &mut send => r,
                        // The pipeline is full: stop fetching until it takes this one.
                        _ = std::future::ready(()) => {
                            let paused = consumer.assignment().ok();
                            if let Some(tpl) = &paused { let _ = consumer.pause(tpl); }
                            let r = tokio::select! {
                                r = &mut send => Some(r),
                                _ = ctx.shutdown.cancelled() => None,
                            };
                            // Partitions still being taken over stay paused.
                            if let Some(tpl) = &paused {
                                let mut resume = TopicPartitionList::new();
                                for (t, p) in partitions_of(tpl) {
                                    if !member.taking_over.contains_key(&(t.clone(), p)) {
                                        resume.add_partition(&t, p);
                                    }
                                }
                                let _ = consumer.resume(&resume);
                            }
                            match r { Some(r) => r, None => break }
                        }
                    }
                };
                if sent.is_err() {
                    break;
                }
                member.offsets.insert(key, offset + 1);
            }
        }
    }
    // From here on revocations (the consumer closing) are immediate, and
    // librdkafka must not wait for partitions still to hand over.
    if let Ok(mut s) = shared.lock() {
        s.closing = true;
    }
    // The hand-over waits for a changelog write in flight: one the broker
    // does not acknowledge is given up soon (a broker back empty refuses
    // the writer's producer for good), not after a minute.
    if let Some(stopping) = &writer_stopping {
        let _ = stopping.set(std::time::Instant::now());
    }
    if let Err(e) = member.hand_over(true).await
        && !e.is::<Closed>()
    {
        tracing::warn!(source = %ctx.name, "handing partitions over at shutdown: {e:#}");
    }
    // What the last checkpoint on disk covers goes to the group now; the
    // final checkpoint (written after the pipeline drains) holds the rest,
    // and a restart of this instance resumes from it.
    let seq = ctx.checkpoint.written();
    commit_checkpointed(
        &consumer,
        &shared,
        &reported,
        &member.owned,
        seq,
        CommitMode::Sync,
        &ctx.name,
    );
    Ok(serde_json::to_string(&Positions::from_offsets(
        &member.offsets,
    ))?)
}

/// How long, without a changelog, checkpointed partitions not assigned at
/// the first assignment keep their state: the group's session timeout (a
/// killed instance holds its partitions that long) and time to rebalance.
fn unclaimed_wait(config: &KafkaSourceConfig) -> Duration {
    let session_ms = config
        .librdkafka_options
        .get("session.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(45_000);
    Duration::from_millis(session_ms) + Duration::from_secs(15)
}

/// `Ok(false)`: the pipeline is shutting down (its operators are gone).
fn going_on(r: Result<()>) -> Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.is::<Closed>() => Ok(false),
        Err(e) => Err(e),
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Commit the offsets reported for round `seq` (now on disk) and forget
/// older rounds.
fn commit_checkpointed(
    consumer: &StreamConsumer<GroupContext>,
    shared: &Mutex<Shared>,
    reported: &Mutex<BTreeMap<u64, Offsets>>,
    owned: &BTreeSet<(String, i32)>,
    seq: u64,
    mode: CommitMode,
    source: &str,
) {
    let offsets = match reported.lock() {
        Ok(mut r) => {
            let o = r.remove(&seq);
            r.retain(|s, _| *s > seq);
            o
        }
        Err(_) => None,
    };
    let Some(offsets) = offsets else {
        return;
    };
    if let Ok(mut s) = shared.lock() {
        s.checkpointed.extend(
            offsets
                .iter()
                .filter(|(k, _)| owned.contains(*k))
                .map(|(k, v)| (k.clone(), *v)),
        );
    }
    let result: KafkaResult<()> = (|| {
        let mut tpl = TopicPartitionList::new();
        for (key, o) in &offsets {
            // Only partitions taken over: another member owns the others,
            // or the offsets saved for them are older than the group's.
            if owned.contains(key) {
                tpl.add_partition_offset(&key.0, key.1, Offset::Offset(*o))?;
            }
        }
        if tpl.count() > 0 {
            consumer.commit(&tpl, mode)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        metrics::counter!(metric::FLUXPIPE_SOURCE_ERRORS_TOTAL, "source" => source.to_string())
            .increment(1);
        tracing::warn!(%source, "cannot commit offsets: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn positions_round_trip_and_refuse_garbage() {
        let mut o = Offsets::new();
        o.insert(("a".into(), 0), 5);
        o.insert(("a".into(), 3), 9);
        o.insert(("b".into(), 1), 0);
        let text = serde_json::to_string(&Positions::from_offsets(&o)).unwrap();
        assert_eq!(parse_positions(Some(&text)).unwrap(), o);
        assert!(parse_positions(None).unwrap().is_empty());
        assert!(parse_positions(Some("{\"version\":1,\"offsets\":{\"a\":")).is_err());
        assert!(parse_positions(Some("{\"version\":9,\"offsets\":{}}")).is_err());
    }

    proptest! {
        #[test]
        fn any_positions_round_trip(v in proptest::collection::btree_map(("[a-z.]{1,8}", 0i32..64), 0i64..i64::MAX, 0..20)) {
            let text = serde_json::to_string(&Positions::from_offsets(&v)).unwrap();
            prop_assert_eq!(parse_positions(Some(&text)).unwrap(), v);
        }

        #[test]
        fn parsing_any_text_never_panics(s in ".{0,200}") {
            let _ = parse_positions(Some(&s));
        }
    }
}
