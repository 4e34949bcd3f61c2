//! `type = "kafka"`: one message per record (its JSON line), keyed
//! `<cluster>/<job id>` (job records) or `<cluster>` (rank and other
//! cluster records), so one job's records stay in one partition and in
//! order, and one cluster's resource records land on one partition.
//!
//! The producer is idempotent and partitions with `murmur2_random`, the
//! Java client's partitioner, so every client agrees on where a key goes.
//! A record counts as delivered when the broker acknowledges it (that is
//! what a checkpoint waits for); one librdkafka gives up on after
//! `message_timeout_secs` is sent again, with backoff, by a new producer
//! (one outage, one warning with counts). At most [`MAX_IN_FLIGHT`]
//! records await their acknowledgement; beyond that the sink stops taking
//! records and its buffer's `when_full` applies.
//!
//! Each message carries a `fluxpipe-stream` header with its output stream.

use super::{SinkContext, SinkRx};
use crate::component::Problem;
use crate::output::OutputStream;
use std::collections::BTreeMap;

#[cfg(feature = "kafka")]
mod producer;
#[cfg(feature = "kafka")]
pub use producer::MAX_IN_FLIGHT;

crate::sinks::config::sink_config! {
    /// `type = "kafka"`: one message per record, keyed by cluster and job.
    KafkaSinkConfig {
        bootstrap_servers: String,
        /// The topic of every stream not named in `topics`.
        topic: String,
        /// A topic per output stream, e.g. `{ jobs = "flux-jobs" }`.
        #[serde(default)]
        topics: BTreeMap<String, String>,
        /// none | gzip | snappy | lz4 | zstd
        #[serde(default = "default_compression")]
        compression: String,
        /// Seconds librdkafka keeps retrying a message before the sink
        /// starts a new producer and sends it again (`message.timeout.ms`).
        #[serde(deserialize_with = "crate::component::seconds", default = "default_kafka_timeout")]
        message_timeout_secs: f64,
        /// Passed to librdkafka as they are; they win over fluxpipe's own.
        #[serde(default)]
        librdkafka_options: BTreeMap<String, String>,
    }
}

fn default_compression() -> String {
    "lz4".into()
}

/// Short enough that a broker back empty (which refuses the producer it
/// no longer knows until the records time out) is got over in under a
/// minute.
fn default_kafka_timeout() -> f64 {
    30.0
}

impl super::SinkSpec for KafkaSinkConfig {
    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.bootstrap_servers.trim().is_empty() {
            out.push(Problem::new("bootstrap_servers", ": must not be empty"));
        }
        for stream in self.topics.keys() {
            if OutputStream::parse(stream).is_none() {
                out.push(Problem::new(
                    "topics",
                    format!(": `{stream}` is not an output stream"),
                ));
            }
        }
        if !["none", "gzip", "snappy", "lz4", "zstd"].contains(&self.compression.as_str()) {
            out.push(Problem::new(
                "compression",
                format!(
                    " `{}`: expected none, gzip, snappy, lz4 or zstd",
                    self.compression
                ),
            ));
        }
        out
    }
}

/// Run the sink until every sender is gone and its buffer is delivered.
pub async fn run(
    name: &str,
    config: KafkaSinkConfig,
    rx: SinkRx,
    ctx: &SinkContext,
) -> anyhow::Result<()> {
    #[cfg(feature = "kafka")]
    return producer::run(name, config, rx, &ctx.shutdown).await;
    #[cfg(not(feature = "kafka"))]
    {
        let _ = (name, config, rx, ctx);
        anyhow::bail!("this fluxpipe was built without Kafka support")
    }
}
