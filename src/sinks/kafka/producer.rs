//! The producer behind the `kafka` sink (librdkafka).

use super::KafkaSinkConfig;
use crate::channels::fanout::SinkRx;
use crate::output::OutputRecord;
use crate::output::OutputStream;
use anyhow::{Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use serde::Deserialize;
use std::borrow::Cow;
use std::time::Duration;
use tokio::task::JoinSet;

/// Records sent and not yet acknowledged, at most.
pub const MAX_IN_FLIGHT: usize = 10_000;

/// How long shutdown waits for the last acknowledgements.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// The key of a record: `<cluster>/<id>`, `<cluster>`, or the source name
/// for records of no cluster (dead letters).
pub fn record_key(line: &str) -> String {
    #[derive(Deserialize)]
    struct Fields<'a> {
        #[serde(borrow, default)]
        cluster: Option<Cow<'a, str>>,
        #[serde(default)]
        id: Option<u64>,
        #[serde(borrow, default)]
        source: Option<Cow<'a, str>>,
    }
    match serde_json::from_str::<Fields>(line) {
        Ok(Fields {
            cluster: Some(c),
            id: Some(id),
            ..
        }) => format!("{c}/{id}"),
        Ok(Fields {
            cluster: Some(c), ..
        }) => c.into_owned(),
        Ok(Fields {
            source: Some(s), ..
        }) => s.into_owned(),
        _ => String::new(),
    }
}

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

pub async fn run(name: &str, config: KafkaSinkConfig, mut rx: SinkRx) -> Result<()> {
    let producer = producer(&config)?;
    let topics: Vec<(OutputStream, String)> = OutputStream::ALL
        .iter()
        .map(|s| {
            let t = config.topics.get(s.as_str()).unwrap_or(&config.topic);
            (*s, t.clone())
        })
        .collect();
    let mut in_flight: JoinSet<bool> = JoinSet::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            rec = rx.recv(), if open && in_flight.len() < MAX_IN_FLIGHT => match rec {
                Some(rec) => {
                    let topic = topics
                        .iter()
                        .find(|(s, _)| *s == rec.stream)
                        .map_or(config.topic.as_str(), |(_, t)| t.as_str());
                    // Handed to librdkafka here, in order: a key's records
                    // keep their order in its partition.
                    match enqueue(&producer, topic, &rec, &mut in_flight, name).await {
                        Some(delivery) => {
                            in_flight.spawn(delivery);
                        }
                        None => rx.given_up(1),
                    }
                }
                None => open = false,
            },
            Some(done) = in_flight.join_next() => match done {
                Ok(true) => rx.delivered(1),
                Ok(false) | Err(_) => rx.given_up(1),
            },
        }
    }
    producer
        .flush(Timeout::After(FLUSH_TIMEOUT))
        .context("Kafka producer flush at shutdown")?;
    Ok(())
}

/// Hand one record to librdkafka (waiting while its queue is full); the
/// future of its acknowledgement, or `None` if it was refused (counted).
async fn enqueue(
    producer: &FutureProducer,
    topic: &str,
    rec: &OutputRecord,
    in_flight: &mut JoinSet<bool>,
    sink: &str,
) -> Option<impl std::future::Future<Output = bool> + Send + 'static> {
    let key = record_key(rec.line());
    loop {
        let headers = OwnedHeaders::new().insert(Header {
            key: "fluxpipe-stream",
            value: Some(rec.stream.as_str()),
        });
        let message = FutureRecord::to(topic)
            .key(&key)
            .payload(rec.line())
            .headers(headers);
        match producer.send_result(message) {
            Ok(delivery) => {
                let (sink, topic) = (sink.to_string(), topic.to_string());
                return Some(async move {
                    match delivery.await {
                        Ok(Ok(_)) => true,
                        Ok(Err((e, _))) => {
                            dropped(&sink, &topic, &e.to_string());
                            false
                        }
                        Err(_) => {
                            dropped(&sink, &topic, "the producer is gone");
                            false
                        }
                    }
                });
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                // Let acknowledgements come back, then try again.
                if in_flight.is_empty() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Err((e, _)) => {
                dropped(sink, topic, &e.to_string());
                return None;
            }
        }
    }
}

fn dropped(sink: &str, topic: &str, error: &str) {
    metrics::counter!("fluxpipe_sink_errors_total", "sink" => sink.to_string()).increment(1);
    metrics::counter!("fluxpipe_records_dropped_total", "sink" => sink.to_string(), "reason" => "undeliverable").increment(1);
    tracing::error!(%sink, %topic, "record dropped: {error}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_follow_the_record() {
        assert_eq!(
            record_key(r#"{"kind":"job","cluster":"picl","id":42,"x":[1,{"id":7}]}"#),
            "picl/42"
        );
        assert_eq!(
            record_key(r#"{"kind":"rank","cluster":"picl","rank":3}"#),
            "picl"
        );
        assert_eq!(
            record_key(r#"{"kind":"dead_letter","source":"files"}"#),
            "files"
        );
        assert_eq!(record_key("not json"), "");
    }

    proptest! {
        #[test]
        fn a_key_is_found_in_any_job_record(cluster in "[a-zA-Z0-9_-]{1,12}", id in any::<u64>()) {
            let line = serde_json::json!({"kind": "transition", "cluster": cluster, "id": id, "from": "RUN"}).to_string();
            prop_assert_eq!(record_key(&line), format!("{cluster}/{id}"));
        }

        #[test]
        fn any_line_gives_a_key_without_panicking(s in ".{0,200}") {
            let _ = record_key(&s);
        }
    }
}
