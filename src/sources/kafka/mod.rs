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
//! disk, which means every record before it is applied, its outputs are
//! delivered and the changelog holds the state after it, are they
//! committed to the group. A record is never skipped: offsets advance only
//! over what was handed on, in order. On revocation and at shutdown the
//! last checkpointed offsets are committed synchronously.
//!
//! **Scale-out.** Job and node state belongs to the input partition its
//! records come from. A partition assigned is paused until it is taken
//! over: from the local checkpoint if that is not behind the group's
//! committed offset (the fast path), else from the changelog topic
//! (`changelog`), read to its end; reading resumes at the offset that state
//! is the state after. A partition revoked (cooperative rebalancing) stops
//! being read, one more checkpoint round is taken at once (its changes and
//! offset marker go to the changelog, its offset is committed), and only
//! then is it unassigned and its state released from the shards (gauges,
//! alerts) silently: its new owner carries on exactly where this member
//! stopped. After a crash, or if that round does not come within 30 s, the
//! new owner starts from the last round instead and applies the records
//! since again: their outputs repeat, with the same `record_id`.
//!
//! **Backpressure.** When the pipeline is full the assigned partitions are
//! paused (librdkafka stops fetching) until the record goes through.
//!
//! **Lag.** librdkafka's statistics (every 5 s) give
//! `fluxpipe_kafka_consumer_lag{source,topic,partition}`.

use crate::component::Problem;
use crate::sources::config::source_config;
use crate::sources::{SourceContext, SourceSpec};
use std::collections::BTreeMap;

#[cfg(feature = "kafka")]
mod brokers;
#[cfg(feature = "kafka")]
mod changelog;
#[cfg(feature = "kafka")]
mod member;

source_config! {
    /// `type = "kafka"`: a consumer group member (rdkafka, bundled librdkafka).
    KafkaSourceConfig {
        /// `host:port,host:port`.
        bootstrap_servers: String,
        topics: Vec<String>,
        group_id: String,
        /// Keep job and node state in a changelog topic so that members of
        /// the group can take partitions over from each other (scale-out).
        /// Off: one instance per group only.
        #[serde(default = "default_true")]
        changelog: bool,
        /// The changelog topic; default `<group_id>-changelog`. Created
        /// (compacted, as many partitions as the input topic) if missing.
        #[serde(default)]
        changelog_topic: Option<String>,
        /// Passed to librdkafka as they are (SASL, TLS, tuning); they win
        /// over fluxpipe's own settings.
        #[serde(default)]
        librdkafka_options: BTreeMap<String, String>,
    }
}

fn default_true() -> bool {
    true
}

impl KafkaSourceConfig {
    /// The changelog topic, if the source keeps one.
    pub fn changelog_topic(&self) -> Option<String> {
        self.changelog.then(|| {
            self.changelog_topic
                .clone()
                .unwrap_or_else(|| format!("{}-changelog", self.group_id))
        })
    }
}

impl SourceSpec for KafkaSourceConfig {
    fn heartbeats(&self) -> bool {
        true
    }

    fn reads(&self) -> String {
        format!("topics {:?} group {:?}", self.topics, self.group_id)
    }

    fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        for (key, empty) in [
            (
                "bootstrap_servers",
                self.bootstrap_servers.trim().is_empty(),
            ),
            ("topics", self.topics.is_empty()),
            ("group_id", self.group_id.trim().is_empty()),
        ] {
            if empty {
                out.push(Problem::new(key, ": must not be empty"));
            }
        }
        // A job's state is owned by one input partition; across topics,
        // the same partition number would not go to the same member.
        if self.changelog && self.topics.len() > 1 {
            out.push(Problem::new(
                "topics",
                ": a source with a changelog reads one topic (use one source per topic, or set changelog = false for a single instance)",
            ));
        }
        out
    }

    fn has_positions(&self) -> bool {
        true
    }

    fn keeps_changelog(&self) -> bool {
        self.changelog && cfg!(feature = "kafka")
    }
}

/// Be a member of the group until shutdown; returns the offsets reached.
#[cfg(feature = "kafka")]
pub async fn run(config: KafkaSourceConfig, ctx: SourceContext) -> anyhow::Result<Option<String>> {
    // A member answers for the feed only while it owns partitions (a
    // group may have members with none).
    ctx.set_feed_watched(false);
    member::run(config, ctx).await.map(Some)
}

#[cfg(not(feature = "kafka"))]
pub async fn run(
    _config: KafkaSourceConfig,
    _ctx: SourceContext,
) -> anyhow::Result<Option<String>> {
    anyhow::bail!("this fluxpipe was built without Kafka support")
}
