//! Sinks: where output records go. Each sink runs as its own task behind a
//! bounded channel; the fan-out ([`crate::channels::fanout`]) sends each
//! record to the sinks that asked for its stream.
//!
//! A new sink is one new file here plus one line in [`run`].

pub mod alertmanager;
pub mod blackhole;
pub mod file;
pub mod http;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod lines;
pub mod offsets;
pub mod prometheus;
pub mod socket;
pub mod stdout;

pub use crate::channels::fanout::count_sent;
use crate::channels::fanout::{SinkCounters, SinkRx};
use crate::pipeline::config::SinkConfig;

/// What sinks may need beyond their records.
#[derive(Debug, Clone, Default)]
pub struct SinkContext {
    /// Per-node state for the metrics endpoint.
    pub nodes: crate::telemetry::NodeBoard,
    /// Oldest state-entry times, for the metrics endpoint.
    pub ages: crate::telemetry::StateAges,
    /// Whether the pipeline is running, for `/readyz`.
    pub ready: crate::telemetry::Readiness,
    /// Active jobs per user, if a metrics sink asks for them.
    pub users: crate::telemetry::UserJobs,
    /// Every sink's queued and done counts, for the buffered-records gauge.
    pub buffers: SinkCounters,
    /// Where the file sinks stand, for checkpoints.
    pub offsets: offsets::SinkOffsets,
}

/// Run one sink until every sender is gone and its buffer is delivered.
pub async fn run(
    name: String,
    config: SinkConfig,
    rx: SinkRx,
    ctx: SinkContext,
) -> anyhow::Result<()> {
    match config {
        SinkConfig::Stdout(_) => stdout::run(&name, rx).await,
        SinkConfig::Blackhole(_) => blackhole::run(&name, rx).await,
        SinkConfig::File(c) => file::run(&name, c, rx, &ctx.offsets).await,
        SinkConfig::Prometheus(c) => prometheus::run(&name, c, rx, ctx).await,
        SinkConfig::Socket(c) => socket::run(&name, c, rx).await,
        SinkConfig::Http(c) => http::run(&name, c, rx).await,
        SinkConfig::Alertmanager(c) => alertmanager::run(&name, c, rx).await,
        #[cfg(feature = "kafka")]
        SinkConfig::Kafka(c) => kafka::run(&name, c, rx).await,
        #[cfg(not(feature = "kafka"))]
        SinkConfig::Kafka(_) => anyhow::bail!("this fluxpipe was built without Kafka support"),
    }
}
