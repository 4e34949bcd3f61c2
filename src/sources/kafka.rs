//! `type = "kafka"`: a member of a Kafka consumer group (rdkafka with its
//! bundled librdkafka; cooperative-sticky assignment).
//!
//! Every message is one line for the shared decoder (fluxpipe's own
//! `events` records, journal lines, eventlog lines). For plain RFC 18
//! events the job comes from the message key (`<cluster>/<jobid>`, or just
//! `<jobid>`; any job id encoding) and the stream from the `stream` header
//! (`job`, `exec`, `resource`), else from the source's `stream` and
//! `job_id` keys.
//!
//! **Positions and commits.** The source's positions are, per partition,
//! the offset after the last message handed on. They go into the
//! pipeline's checkpoint at its barrier; only once that checkpoint is on
//! disk, which means every record before it is applied and its outputs are
//! delivered, are they committed to the group. A record is never skipped:
//! offsets advance only over what was handed on, in order. On revocation
//! and at shutdown the last checkpointed offsets are committed
//! synchronously. At assignment a partition starts at the offset the local
//! checkpoint holds for it (the state restored is exactly the state after
//! it), else at the group's committed offset.
//!
//! **Backpressure.** When the pipeline is full the assigned partitions are
//! paused (librdkafka stops fetching) until the record goes through.
//!
//! **Lag.** librdkafka's statistics (every 5 s) give
//! `fluxpipe_kafka_consumer_lag{source,topic,partition}`.

use super::SourceContext;
use super::lines::Line;
use crate::decode::{EventStream, Origin};
use crate::flux::jobid::JobId;
use crate::pipeline::config::KafkaSourceConfig;
use anyhow::{Context, Result, anyhow};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaResult;
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientContext, Statistics};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Partition → next offset to read.
type Offsets = BTreeMap<(String, i32), i64>;

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
    /// Offsets covered by a checkpoint on disk: where a partition starts
    /// when assigned, and what is committed when it is revoked.
    checkpointed: Offsets,
}

struct GroupContext {
    source: String,
    shared: Arc<Mutex<Shared>>,
}

impl ClientContext for GroupContext {
    fn stats(&self, stats: Statistics) {
        for (topic, t) in &stats.topics {
            for (p, part) in &t.partitions {
                if *p < 0 || part.consumer_lag < 0 {
                    continue;
                }
                metrics::gauge!("fluxpipe_kafka_consumer_lag", "source" => self.source.clone(), "topic" => topic.clone(), "partition" => p.to_string())
                    .set(part.consumer_lag as f64);
            }
        }
    }
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
        let checkpointed = self
            .shared
            .lock()
            .map(|s| s.checkpointed.clone())
            .unwrap_or_default();
        let result = match err {
            E::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                // Start where the local checkpoint stands.
                for e in tpl.elements() {
                    let key = (e.topic().to_string(), e.partition());
                    if let Some(o) = checkpointed.get(&key) {
                        tracing::info!(source = %self.source, topic = e.topic(), partition = e.partition(), offset = o, "assigned: resuming at the checkpoint");
                    } else {
                        tracing::info!(source = %self.source, topic = e.topic(), partition = e.partition(), "assigned: resuming at the committed offset");
                    }
                }
                let mut with_offsets = tpl.clone();
                for ((topic, p), o) in &checkpointed {
                    if tpl.find_partition(topic, *p).is_some() {
                        let _ = with_offsets.set_partition_offset(topic, *p, Offset::Offset(*o));
                    }
                }
                if cooperative {
                    consumer.incremental_assign(&with_offsets)
                } else {
                    consumer.assign(&with_offsets)
                }
            }
            E::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // Commit what the checkpoint covers before another member
                // takes the partitions over.
                let mut commit = TopicPartitionList::new();
                for e in tpl.elements() {
                    let key = (e.topic().to_string(), e.partition());
                    if let Some(o) = checkpointed.get(&key) {
                        let _ = commit.add_partition_offset(&key.0, key.1, Offset::Offset(*o));
                    }
                }
                if commit.count() > 0
                    && let Err(e) = consumer.commit(&commit, CommitMode::Sync)
                {
                    tracing::warn!(source = %self.source, "commit at revocation failed: {e}");
                }
                tracing::info!(source = %self.source, partitions = tpl.count(), "partitions revoked");
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::error!(source = %self.source, "rebalance error: {other:?}");
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            tracing::error!(source = %self.source, "cannot apply the assignment: {e}");
        }
    }

    fn pre_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {}
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

/// Run until shutdown; returns the final positions.
pub async fn run(config: KafkaSourceConfig, ctx: SourceContext) -> Result<String> {
    let restored = parse_positions(ctx.checkpoint.restored())
        .with_context(|| format!("source {}: the positions in the checkpoint", ctx.name))?;
    let shared = Arc::new(Mutex::new(Shared {
        checkpointed: restored.clone(),
    }));
    let context = GroupContext {
        source: ctx.name.to_string(),
        shared: shared.clone(),
    };
    let consumer: StreamConsumer<GroupContext> = client_config(&config)
        .create_with_context(context)
        .context("cannot create the Kafka consumer")?;
    let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .context("cannot subscribe to the topics")?;
    tracing::info!(source = %ctx.name, topics = ?config.topics, group = %config.group_id, "consumer started");

    // Offsets handed on, and those reported per round awaiting their
    // checkpoint.
    let mut offsets = restored;
    let mut reported: BTreeMap<u64, Offsets> = BTreeMap::new();
    let mut errors = 0u64;
    // One handle waits for rounds, the other for checkpoints on disk.
    let mut rounds = ctx.checkpoint.clone();
    let mut disk = ctx.checkpoint.clone();
    loop {
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => break,
            seq = disk.next_written() => {
                commit_checkpointed(&consumer, &shared, &mut reported, seq, CommitMode::Async, &ctx.name);
            }
            // A checkpoint round: `biased` puts it before the next message.
            seq = rounds.requested() => {
                reported.insert(seq, offsets.clone());
                let text = serde_json::to_string(&Positions::from_offsets(&offsets))?;
                ctx.checkpoint.report(&ctx.name, seq, text).await;
            }
            msg = consumer.recv() => {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        metrics::counter!("fluxpipe_source_errors_total", "source" => ctx.name.to_string()).increment(1);
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
                let origin = ctx.origin_with(origin_of(&msg));
                let (topic, partition, offset) = (msg.topic().to_string(), msg.partition(), msg.offset());
                let payload = msg.payload().unwrap_or_default();
                let line = if payload.len() > ctx.decode.max_line_bytes {
                    Line::TooLong { prefix: payload[..ctx.decode.max_line_bytes].to_vec(), len: payload.len() }
                } else {
                    Line::Full(payload.to_vec())
                };
                drop(msg);
                let location = || format!("{topic}/{partition}@{offset}");
                let sent = {
                    let send = ctx.line(line, &origin, &location);
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
                            if let Some(tpl) = &paused { let _ = consumer.resume(tpl); }
                            match r { Some(r) => r, None => break }
                        }
                    }
                };
                if sent.is_err() {
                    break;
                }
                offsets.insert((topic, partition), offset + 1);
            }
        }
    }
    // What the last checkpoint on disk covers goes to the group now; the
    // final checkpoint (written after the pipeline drains) holds the rest,
    // and a restart of this instance resumes from it.
    let seq = ctx.checkpoint.written();
    commit_checkpointed(
        &consumer,
        &shared,
        &mut reported,
        seq,
        CommitMode::Sync,
        &ctx.name,
    );
    Ok(serde_json::to_string(&Positions::from_offsets(&offsets))?)
}

/// Commit the offsets reported for round `seq` (now on disk) and forget
/// older rounds.
fn commit_checkpointed(
    consumer: &StreamConsumer<GroupContext>,
    shared: &Mutex<Shared>,
    reported: &mut BTreeMap<u64, Offsets>,
    seq: u64,
    mode: CommitMode,
    source: &str,
) {
    let Some(offsets) = reported.remove(&seq) else {
        reported.retain(|s, _| *s > seq);
        return;
    };
    reported.retain(|s, _| *s > seq);
    if let Ok(mut s) = shared.lock() {
        s.checkpointed
            .extend(offsets.iter().map(|(k, v)| (k.clone(), *v)));
    }
    let result: KafkaResult<()> = (|| {
        let mut tpl = TopicPartitionList::new();
        let assigned = consumer.assignment()?;
        for ((topic, p), o) in &offsets {
            // Only partitions still ours: another member owns the rest now.
            if assigned.find_partition(topic, *p).is_some() {
                tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
            }
        }
        if tpl.count() > 0 {
            consumer.commit(&tpl, mode)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        metrics::counter!("fluxpipe_source_errors_total", "source" => source.to_string())
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
