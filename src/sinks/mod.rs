//! Sinks: where output records go. Each sink runs as its own task behind a
//! bounded channel; [`Outputs`] fans records out to the sinks that asked for
//! their stream.
//!
//! A new sink is one new file here plus one line in [`run`].

pub mod alertmanager;
pub mod blackhole;
pub mod file;
pub mod http;
pub mod prometheus;
pub mod socket;
pub mod stdout;

use crate::output::OutputRecord;
use crate::pipeline::config::{OutputStream, SinkConfig, WhenFull};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

/// The receiving end of a sink's channel.
pub type SinkRx = mpsc::Receiver<Arc<OutputRecord>>;

/// One sink's entry in the fan-out table.
#[derive(Debug, Clone)]
struct SinkPort {
    name: Arc<str>,
    streams: u8,
    tx: mpsc::Sender<Arc<OutputRecord>>,
    when_full: WhenFull,
    dropped: Arc<AtomicU64>,
}

/// Records a sink dropped (buffer full, or the sink gone), by sink name.
#[derive(Debug, Clone, Default)]
pub struct DropCounts(Vec<(Arc<str>, Arc<AtomicU64>)>);

impl DropCounts {
    /// (sink, dropped) for every sink that dropped something.
    pub fn nonzero(&self) -> Vec<(String, u64)> {
        self.0
            .iter()
            .map(|(n, c)| (n.to_string(), c.load(Ordering::Relaxed)))
            .filter(|(_, c)| *c > 0)
            .collect()
    }
}

/// Sends each record to every sink subscribed to its stream. Bounded: a
/// `block` sink that is full makes the sender wait (backpressure reaches
/// the sources); a `drop_newest` sink drops and counts.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    ports: Arc<[SinkPort]>,
    streams: u8,
}

impl Outputs {
    /// Create a channel for every sink; returns the fan-out table and each
    /// sink's receiver, in the order given.
    pub fn new<'a>(
        sinks: impl IntoIterator<Item = (&'a str, &'a SinkConfig)>,
    ) -> (Self, Vec<SinkRx>) {
        let mut ports = Vec::new();
        let mut rxs = Vec::new();
        for (name, config) in sinks {
            let common = config.common();
            let (tx, rx) = mpsc::channel(common.buffer.max(1));
            ports.push(SinkPort {
                name: name.into(),
                streams: common.stream_bits(),
                tx,
                when_full: common.when_full,
                dropped: Arc::default(),
            });
            rxs.push(rx);
        }
        let streams = ports.iter().fold(0, |acc, p| acc | p.streams);
        (
            Outputs {
                ports: ports.into(),
                streams,
            },
            rxs,
        )
    }

    /// Counters of dropped records, which outlive the fan-out table.
    pub fn drop_counts(&self) -> DropCounts {
        DropCounts(
            self.ports
                .iter()
                .map(|p| (p.name.clone(), p.dropped.clone()))
                .collect(),
        )
    }

    /// Whether any sink takes `stream`: records nobody wants are not built.
    pub fn wants(&self, stream: OutputStream) -> bool {
        self.streams & stream.bit() != 0
    }

    /// Deliver one record to every subscribed sink.
    pub async fn emit(&self, record: OutputRecord) {
        if !self.wants(record.stream) {
            return;
        }
        let bit = record.stream.bit();
        let record = Arc::new(record);
        for port in self.ports.iter().filter(|p| p.streams & bit != 0) {
            match port.when_full {
                WhenFull::Block => {
                    // A sink that has exited (after an error) drops records.
                    if port.tx.send(record.clone()).await.is_err() {
                        port.dropped.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("fluxpipe_records_dropped_total", "sink" => port.name.to_string(), "reason" => "closed").increment(1);
                    }
                }
                WhenFull::DropNewest => {
                    if port.tx.try_send(record.clone()).is_err() {
                        port.dropped.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("fluxpipe_records_dropped_total", "sink" => port.name.to_string(), "reason" => "full").increment(1);
                    }
                }
            }
        }
    }
}

/// What sinks may need beyond their records.
#[derive(Debug, Clone, Default)]
pub struct SinkContext {
    /// Per-node state for the metrics endpoint.
    pub nodes: crate::telemetry::NodeBoard,
    /// Oldest state-entry times, for the metrics endpoint.
    pub ages: crate::telemetry::StateAges,
    /// Whether the pipeline is running, for `/readyz`.
    pub ready: crate::telemetry::Readiness,
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
        SinkConfig::File(c) => file::run(&name, c, rx).await,
        SinkConfig::Prometheus(c) => prometheus::run(&name, c, rx, ctx).await,
        SinkConfig::Socket(c) => socket::run(&name, c, rx).await,
        SinkConfig::Http(c) => http::run(&name, c, rx).await,
        SinkConfig::Alertmanager(c) => alertmanager::run(&name, c, rx).await,
    }
}

/// Count one delivered record for a sink.
pub fn count_sent(name: &str, n: u64) {
    metrics::counter!("fluxpipe_records_sent_total", "sink" => name.to_string()).increment(n);
}
