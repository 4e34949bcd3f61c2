//! The producer behind the `kafka` sink (librdkafka).

use super::KafkaSinkConfig;
use crate::channels::fanout::SinkRx;
use crate::output::OutputRecord;
use crate::output::OutputStream;
use crate::sinks::retry::{Failure, Retry, SHUTDOWN_GRACE};
use crate::telemetry::metric;
use anyhow::{Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};
use rdkafka::util::Timeout;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Records sent and not yet acknowledged, at most.
pub const MAX_IN_FLIGHT: usize = 10_000;

/// How long shutdown waits for the last acknowledgements.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

fn producer(config: &KafkaSinkConfig) -> Result<FutureProducer> {
    let timeout_ms = (config.message_timeout_secs.clamp(0.001, 1e7) * 1000.0) as u64;
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("compression.type", &config.compression)
        .set("message.timeout.ms", timeout_ms.to_string())
        .set("linger.ms", "5");
    for (k, v) in &config.librdkafka_options {
        c.set(k, v);
    }
    c.create().context("cannot create the Kafka producer")
}

/// The topic of each output stream.
struct Topics(Vec<(OutputStream, String)>);

impl Topics {
    fn new(config: &KafkaSinkConfig) -> Self {
        let of = |s: &OutputStream| config.topics.get(s.as_str()).unwrap_or(&config.topic);
        Topics(
            OutputStream::ALL
                .iter()
                .map(|s| (*s, of(s).clone()))
                .collect(),
        )
    }

    fn of(&self, stream: OutputStream) -> &str {
        self.0
            .iter()
            .find(|(s, _)| *s == stream)
            .map_or("", |(_, t)| t.as_str())
    }
}

/// A record the broker did not acknowledge, with its place in the order
/// the sink took records in.
struct Unacked {
    seq: u64,
    record: Arc<OutputRecord>,
    error: KafkaError,
}

/// What became of one record handed to librdkafka: acknowledged (true),
/// refused for what it is (false: dropped and counted), or not
/// acknowledged (to be sent again).
type Ack = Result<bool, Unacked>;

/// Records not acknowledged, as the retry logs them.
struct NotAcknowledged {
    records: usize,
    error: String,
}

impl std::fmt::Display for NotAcknowledged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "records not acknowledged: {} ({})",
            self.records, self.error
        )
    }
}

impl Failure for NotAcknowledged {
    /// A broker away, or back without the producer's state: it passes.
    fn is_outage(&self) -> bool {
        true
    }
}

/// Errors no other try mends: the record itself is refused.
fn hopeless(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidRecord
        )
    )
}

/// Deliver records until every sender is gone and nothing is left
/// unacknowledged. A record librdkafka gives up on (after
/// `message_timeout_secs`) is not dropped: once every record sent has an
/// answer, those not acknowledged are sent again, in the order they were
/// taken, by a new producer (a broker that came back empty does not know
/// the old one's producer id, and refuses it for ever), with backoff. At
/// the first failure the old producer's queue is purged, so that no record
/// sent after it is delivered before it, and no new record is taken until
/// the failed ones are delivered: a key's records keep their order. Once
/// the pipeline stops, [`SHUTDOWN_GRACE`] bounds it all.
pub async fn run(
    name: &str,
    config: KafkaSinkConfig,
    mut rx: SinkRx,
    shutdown: &CancellationToken,
) -> Result<()> {
    let mut producer = producer(&config)?;
    let topics = Topics::new(&config);
    let mut retry = Retry::new(name, shutdown, "Kafka acknowledges records");
    let mut in_flight: JoinSet<Ack> = JoinSet::new();
    // Not acknowledged, by the order they were taken in.
    let mut unacked: BTreeMap<u64, Arc<OutputRecord>> = BTreeMap::new();
    let mut last_error = String::new();
    let mut sent_again = 0u64;
    let mut taken = 0u64;
    let mut open = true;
    let mut purged = false;
    // When the broker last acknowledged something.
    let mut last_ack = tokio::time::Instant::now();
    loop {
        // Stopping, and the broker silent for the grace: what is in flight
        // is not waited for to its timeout.
        let stalled = retry
            .deadline(&rx)
            .map(|at| at.max(last_ack + SHUTDOWN_GRACE));
        if in_flight.is_empty() && !unacked.is_empty() {
            let failure = NotAcknowledged {
                records: unacked.len(),
                error: std::mem::take(&mut last_error),
            };
            if !retry.failed("sending", &failure, &rx).await {
                let held = unacked.len() as u64;
                let left = rx.give_up_rest(held).await;
                metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => name.to_string(), "reason" => "undeliverable").increment(left);
                anyhow::bail!(
                    "records Kafka did not acknowledge: {left}, given up {} s after the stop",
                    SHUTDOWN_GRACE.as_secs()
                );
            }
            let old = std::mem::replace(&mut producer, self::producer(&config)?);
            // Its drop waits for librdkafka's threads.
            tokio::task::spawn_blocking(move || drop(old));
            purged = false;
            sent_again += unacked.len() as u64;
            for (seq, record) in std::mem::take(&mut unacked) {
                let topic = topics.of(record.stream);
                send(&producer, topic, seq, record, &mut in_flight, name, &rx).await;
            }
            continue;
        }
        if !open && in_flight.is_empty() && unacked.is_empty() {
            break;
        }
        tokio::select! {
            rec = rx.recv(), if open && unacked.is_empty() && in_flight.len() < MAX_IN_FLIGHT => match rec {
                Some(record) => {
                    taken += 1;
                    let topic = topics.of(record.stream);
                    // Handed to librdkafka here, in order: a key's records
                    // keep their order in its partition.
                    send(&producer, topic, taken, record, &mut in_flight, name, &rx).await;
                }
                None => open = false,
            },
            Some(done) = in_flight.join_next() => match done {
                Ok(Ok(true)) => {
                    last_ack = tokio::time::Instant::now();
                    rx.delivered(1);
                    if sent_again > 0 {
                        retry.succeeded("sending");
                        tracing::info!(sink = name, records = sent_again, "records not acknowledged before were sent again");
                        sent_again = 0;
                    }
                }
                Ok(Ok(false)) | Err(_) => rx.given_up(1),
                Ok(Err(u)) => {
                    if !purged {
                        // What was sent after it fails now too, and goes
                        // again after it.
                        producer.purge(PurgeConfig::default().queue().inflight());
                        purged = true;
                    }
                    last_error = u.error.to_string();
                    unacked.insert(u.seq, u.record);
                }
            },
            // Stopping: the deadline is set on the next turn.
            _ = shutdown.cancelled(), if stalled.is_none() => {}
            _ = tokio::time::sleep_until(stalled.unwrap_or_else(tokio::time::Instant::now)), if stalled.is_some() && !purged && !in_flight.is_empty() => {
                producer.purge(PurgeConfig::default().queue().inflight());
                purged = true;
            }
        }
    }
    producer
        .flush(Timeout::After(FLUSH_TIMEOUT))
        .context("Kafka producer flush at shutdown")?;
    Ok(())
}

/// Hand one record to librdkafka (waiting while its queue is full) and
/// follow its acknowledgement in `in_flight`. A record refused for what it
/// is (too large) is dropped and counted; any other refusal is an answer
/// like a failed delivery, tried again.
async fn send(
    producer: &FutureProducer,
    topic: &str,
    seq: u64,
    record: Arc<OutputRecord>,
    in_flight: &mut JoinSet<Ack>,
    sink: &str,
    rx: &SinkRx,
) {
    let key = record.key();
    loop {
        let headers = OwnedHeaders::new().insert(Header {
            key: "fluxpipe-stream",
            value: Some(record.stream.as_str()),
        });
        let message = FutureRecord::to(topic)
            .key(&key)
            .payload(record.line())
            .headers(headers);
        let error = match producer.send_result(message) {
            Ok(delivery) => {
                let sink = sink.to_string();
                in_flight.spawn(async move {
                    let error = match delivery.await {
                        Ok(Ok(_)) => return Ok(true),
                        Ok(Err((e, _))) => e,
                        Err(_) => KafkaError::Canceled,
                    };
                    if hopeless(&error) {
                        dropped(&sink, &error);
                        return Ok(false);
                    }
                    Err(Unacked { seq, record, error })
                });
                return;
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                // Let acknowledgements come back, then try again.
                let pause = if in_flight.is_empty() { 10 } else { 1 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
            Err((e, _)) => e,
        };
        if hopeless(&error) {
            dropped(sink, &error);
            rx.given_up(1);
        } else {
            in_flight.spawn(async move { Err(Unacked { seq, record, error }) });
        }
        return;
    }
}

/// A record the broker refuses for what it is.
fn dropped(sink: &str, error: &KafkaError) {
    metrics::counter!(metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink" => sink.to_string()).increment(1);
    metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => sink.to_string(), "reason" => "undeliverable").increment(1);
    tracing::error!(%sink, "record dropped, the broker refuses it: {error}");
}
