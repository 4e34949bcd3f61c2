//! The changelog topic on the broker ([`crate::checkpoint::changelog`] has
//! its format): created if missing, written at each checkpoint round, read
//! back when a partition is assigned.
//!
//! **Fencing.** A member must not write a partition's state once the
//! partition has been revoked: its new owner may already have read the
//! changelog. Writes hold the [`Fence`] lock from the first record to the
//! broker's last acknowledgement; revocation takes the same lock before it
//! lets the partition go, and writes skip partitions no longer owned.

use super::KafkaSourceConfig;
use super::member::Offsets;
use crate::checkpoint::changelog::{self, Change, Restored, Restorer};
use crate::checkpoint::link::ChangelogRx;
use crate::keyed::Owner;
use crate::telemetry::metric;
use anyhow::{Context, Result, anyhow, bail};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext, PurgeConfig};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Longest a changelog partition may take to read back.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest one round's writes may take to be acknowledged.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a write may still wait for the broker once the source stops:
/// the hand-over at the stop waits for the write in flight, and a broker
/// that acknowledges nothing must not hold the stop for `WRITE_TIMEOUT`.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often a write waiting for acknowledgements looks at the stop.
const SETTLE_SLICE: Duration = Duration::from_millis(200);
const METADATA_TIMEOUT: Duration = Duration::from_secs(30);

/// The partitions this member owns, under the lock that orders changelog
/// writes and revocations.
#[derive(Debug, Default)]
pub struct Fence {
    pub owned: BTreeSet<i32>,
}

/// Broker connection settings shared by the changelog's clients: the
/// user's options minus those that only a group member may have.
pub(super) fn base_config(config: &KafkaSourceConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers);
    for (k, v) in &config.librdkafka_options {
        if !k.starts_with("group.") && k != "partition.assignment.strategy" {
            c.set(k, v);
        }
    }
    c
}

/// Make sure the changelog topic exists with as many partitions as the
/// input topic (compacted: only the last value per key matters); true if
/// it had to be made.
pub async fn ensure_topic(config: &KafkaSourceConfig, changelog: &str) -> Result<bool> {
    let input = config
        .topics
        .first()
        .ok_or_else(|| anyhow!("no input topic"))?
        .clone();
    // Metadata through a consumer handle: it never creates a topic by
    // asking for it.
    let probe: BaseConsumer = base_config(config)
        .create()
        .context("cannot create the Kafka metadata client")?;
    let probe = Arc::new(probe);
    let count = |topic: String, wait: bool| {
        let probe = probe.clone();
        tokio::task::spawn_blocking(move || partition_count(probe.client(), &topic, wait))
    };
    let partitions = count(input.clone(), true)
        .await??
        .ok_or_else(|| anyhow!("input topic {input} does not exist"))?;
    let mut made = false;
    let have = match count(changelog.to_string(), false).await?? {
        Some(n) => n,
        None => {
            let admin: AdminClient<DefaultClientContext> = base_config(config)
                .create()
                .context("cannot create the Kafka admin client")?;
            let topic = NewTopic::new(changelog, partitions, TopicReplication::Fixed(-1))
                .set("cleanup.policy", "compact");
            let opts = AdminOptions::new()
                .operation_timeout(Some(METADATA_TIMEOUT))
                .request_timeout(Some(METADATA_TIMEOUT));
            let results = admin
                .create_topics([&topic], &opts)
                .await
                .context("cannot create the changelog topic")?;
            for r in results {
                match r {
                    Ok(_) => {
                        made = true;
                        tracing::info!(topic = changelog, partitions, "changelog topic created")
                    }
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((t, e)) => bail!("cannot create the changelog topic {t}: {e}"),
                }
            }
            count(changelog.to_string(), true)
                .await??
                .ok_or_else(|| anyhow!("changelog topic {changelog} created but not visible"))?
        }
    };
    if have < partitions {
        bail!(
            "changelog topic {changelog} has {have} partitions, input topic {input} has {partitions}: it needs as many"
        );
    }
    Ok(made)
}

/// A topic's partition count; `None`: no such topic (after waiting a
/// while for it if `wait`: a topic just created takes a moment to show).
pub(super) fn partition_count<C: ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    wait: bool,
) -> Result<Option<i32>> {
    let deadline = Instant::now() + METADATA_TIMEOUT;
    loop {
        let md = client
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)
            .with_context(|| format!("cannot read the metadata of topic {topic}"))?;
        if let Some(t) = md.topics().iter().find(|t| t.name() == topic)
            && t.error().is_none()
            && !t.partitions().is_empty()
        {
            return Ok(Some(t.partitions().len() as i32));
        }
        if !wait || Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Counts failed deliveries.
#[derive(Default)]
struct Deliveries {
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut last) = self.last_error.lock() {
                *last = Some(e.to_string());
            }
        }
    }
}

/// Writes each round's changes, then each partition's offset marker.
pub struct Writer {
    config: KafkaSourceConfig,
    source: Arc<str>,
    topic: String,
    marker_key: String,
    producer: BaseProducer<Deliveries>,
    fence: Arc<Mutex<Fence>>,
    /// Offsets reported per round, shared with the source.
    reported: Arc<Mutex<BTreeMap<u64, Offsets>>>,
    /// The last marker written per partition.
    marked: HashMap<i32, i64>,
    /// Changes of a round whose writes failed: written again first.
    carry: Vec<Change>,
    /// When the source began to stop.
    stopping: Arc<OnceLock<Instant>>,
}

impl Writer {
    pub fn new(
        config: &KafkaSourceConfig,
        source: Arc<str>,
        topic: String,
        fence: Arc<Mutex<Fence>>,
        reported: Arc<Mutex<BTreeMap<u64, Offsets>>>,
    ) -> Result<Self> {
        let producer = Self::producer(config)?;
        let input = config.topics.first().cloned().unwrap_or_default();
        Ok(Writer {
            config: config.clone(),
            source,
            topic,
            marker_key: changelog::marker_key(&input),
            producer,
            fence,
            reported,
            marked: HashMap::new(),
            carry: Vec::new(),
            stopping: Arc::default(),
        })
    }

    /// Set (to the time) when the source stops: a write not acknowledged
    /// within `STOP_GRACE` of it is given up.
    pub fn stopping(&self) -> Arc<OnceLock<Instant>> {
        self.stopping.clone()
    }

    /// `deadline`, or sooner once the source is stopping.
    fn give_up_at(&self, deadline: Instant) -> Instant {
        match self.stopping.get() {
            Some(t) => deadline.min(*t + STOP_GRACE),
            None => deadline,
        }
    }

    fn producer(config: &KafkaSourceConfig) -> Result<BaseProducer<Deliveries>> {
        base_config(config)
            .set("enable.idempotence", "true")
            .set("compression.type", "lz4")
            .set("linger.ms", "5")
            .create_with_context(Deliveries::default())
            .context("cannot create the changelog producer")
    }

    /// After a failed round: a producer in a fatal state (an idempotent
    /// one whose broker came back without its state) is replaced, and the
    /// topic made again if the broker lost it. Otherwise every later round
    /// would fail the same way and no checkpoint would be taken again.
    async fn mend(&mut self) {
        if let Some((code, reason)) = self.producer.client().fatal_error() {
            match Self::producer(&self.config) {
                Ok(fresh) => {
                    let old = std::mem::replace(&mut self.producer, fresh);
                    // Its drop waits for librdkafka's threads.
                    tokio::task::spawn_blocking(move || drop(old));
                    tracing::warn!(source = %self.source, "changelog producer started again after a fatal error: {code:?}: {reason}");
                }
                Err(e) => tracing::warn!(source = %self.source, "{e:#}"),
            }
        }
        match tokio::time::timeout(METADATA_TIMEOUT, ensure_topic(&self.config, &self.topic)).await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(source = %self.source, "changelog topic: {e:#}"),
            Err(_) => tracing::debug!(source = %self.source, "changelog topic: no answer"),
        }
    }

    /// Serve the coordinator's batches until it is gone.
    pub async fn run(mut self, mut batches: ChangelogRx) {
        while let Some(batch) = batches.recv().await {
            let offsets = self
                .reported
                .lock()
                .ok()
                .and_then(|r| r.get(&batch.seq).cloned())
                .unwrap_or_default();
            let mut changes = std::mem::take(&mut self.carry);
            changes.extend(batch.changes);
            let (writer, result) = match tokio::task::spawn_blocking(move || {
                let r = self.write(&changes, &offsets);
                if r.is_err() {
                    self.carry = changes;
                }
                (self, r)
            })
            .await
            {
                Ok(done) => done,
                Err(e) => {
                    // The writer is lost with the task; the coordinator's
                    // rounds fail from now on, and say so.
                    let _ = batch.done.send(Err(format!("changelog writer: {e}")));
                    return;
                }
            };
            self = writer;
            if let Err(e) = &result {
                metrics::counter!(metric::FLUXPIPE_SOURCE_ERRORS_TOTAL, "source" => self.source.to_string())
                    .increment(1);
                tracing::warn!(source = %self.source, "changelog not written (kept for the next round): {e}");
            }
            let failed = result.is_err();
            let _ = batch.done.send(result);
            if failed {
                self.mend().await;
            }
        }
    }

    /// Write changes, wait for all of them, then the markers of the
    /// partitions whose offsets moved: a marker is only ever written after
    /// every change before it is acknowledged.
    fn write(&mut self, changes: &[Change], offsets: &Offsets) -> Result<(), String> {
        let fence = self
            .fence
            .lock()
            .map_err(|_| "fence poisoned".to_string())?;
        let owned = |p: i32| fence.owned.contains(&p);
        // Reports of an earlier round's records (purged, or late) are not
        // this round's: that round already failed, and its changes are
        // among these.
        self.producer.poll(Duration::ZERO);
        self.producer.context().failed.store(0, Ordering::Relaxed);
        if let Ok(mut last) = self.producer.context().last_error.lock() {
            *last = None;
        }
        let (mut sent, mut dropped) = (0usize, 0usize);
        for c in changes.iter().filter(|c| owned(c.owner.partition)) {
            let record = BaseRecord::<str, [u8]>::to(&self.topic)
                .partition(c.owner.partition)
                .key(&c.key);
            let record = match &c.value {
                Some(v) => record.payload(v),
                None => record,
            };
            if self.send(record)? {
                sent += 1;
            } else {
                dropped += 1;
            }
        }
        self.settle()?;
        if dropped > 0 {
            tracing::error!(source = %self.source, dropped, "changelog records refused by the broker (too large?): their keys keep their previous values");
        }
        let mut markers = Vec::new();
        for ((_, p), o) in offsets {
            if owned(*p) && self.marked.get(p) != Some(o) {
                let value = changelog::encode_marker(*o).map_err(|e| e.to_string())?;
                markers.push((*p, *o, value));
            }
        }
        for (p, _, value) in &markers {
            let record = BaseRecord::<str, [u8]>::to(&self.topic)
                .partition(*p)
                .key(&self.marker_key)
                .payload(value);
            self.send(record)?;
        }
        self.settle()?;
        let written = sent + markers.len();
        metrics::counter!(metric::FLUXPIPE_CHANGELOG_RECORDS_TOTAL, "source" => self.source.to_string())
            .increment(written as u64);
        for (p, o, _) in markers {
            self.marked.insert(p, o);
        }
        drop(fence);
        Ok(())
    }

    /// Hand one record to librdkafka, waiting while its queue is full.
    /// `Ok(false)`: refused for good (e.g. too large).
    fn send(&self, mut record: BaseRecord<'_, str, [u8]>) -> Result<bool, String> {
        let deadline = Instant::now() + WRITE_TIMEOUT;
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(true),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    if Instant::now() >= self.give_up_at(deadline) {
                        self.producer
                            .purge(PurgeConfig::default().queue().inflight());
                        return Err("the producer queue stays full".into());
                    }
                    record = r;
                    self.producer.poll(Duration::from_millis(50));
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
                    return Ok(false);
                }
                Err((e, _)) => return Err(e.to_string()),
            }
        }
    }

    /// Wait until everything sent is acknowledged; fail if anything was not.
    fn settle(&self) -> Result<(), String> {
        let deadline = Instant::now() + WRITE_TIMEOUT;
        // In slices, so that a stop meanwhile cuts the wait short.
        while let Err(e) = self.producer.flush(SETTLE_SLICE) {
            if Instant::now() >= self.give_up_at(deadline) {
                // Nothing of this write is sent again later, after the
                // next owner of its partitions has begun to write (a request
                // already on the wire may still land; without its round's
                // marker, a restore does not apply it).
                self.producer
                    .purge(PurgeConfig::default().queue().inflight());
                return Err(format!("not acknowledged: {e}"));
            }
        }
        let failed = self.producer.context().failed.swap(0, Ordering::Relaxed);
        if failed > 0 {
            let last = self
                .producer
                .context()
                .last_error
                .lock()
                .ok()
                .and_then(|l| l.clone())
                .unwrap_or_default();
            return Err(format!("{failed} records not delivered: {last}"));
        }
        Ok(())
    }
}

/// Read one changelog partition from its start to its end (a blocking
/// call: run it off the async threads).
pub fn read_partition(config: &KafkaSourceConfig, topic: &str, owner: &Owner) -> Result<Restored> {
    let input = config.topics.first().cloned().unwrap_or_default();
    let consumer: BaseConsumer = base_config(config)
        .set("group.id", format!("{}-restore", config.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create()
        .context("cannot create the changelog reader")?;
    let partition = owner.partition;
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, METADATA_TIMEOUT)
        .with_context(|| format!("cannot read the offsets of {topic}/{partition}"))?;
    let mut restorer = Restorer::new(&input);
    if high > low {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Beginning)
            .context("changelog partition")?;
        consumer.assign(&tpl).context("cannot read the changelog")?;
        drop(tpl);
        let deadline = Instant::now() + RESTORE_TIMEOUT;
        loop {
            if Instant::now() >= deadline {
                bail!("{topic}/{partition} not read to its end in {RESTORE_TIMEOUT:?}");
            }
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    restorer.push(m.key().unwrap_or_default(), m.payload());
                    if m.offset() >= high - 1 {
                        break;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => bail!("cannot read {topic}/{partition}: {e}"),
                None => {}
            }
        }
        let _ = consumer.unassign();
    }
    Ok(restorer.finish(owner))
}
