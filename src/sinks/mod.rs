//! Sinks: where output records go. Each sink runs as its own task behind a
//! bounded channel; [`Outputs`] fans records out to the sinks that asked for
//! their stream.
//!
//! A new sink is one new file here plus one line in [`run`].

pub mod file;
pub mod http;
pub mod socket;
pub mod stdout;

use crate::output::OutputRecord;
use crate::pipeline::config::{OutputStream, SinkConfig, WhenFull};
use std::sync::Arc;
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
                        metrics::counter!("fluxpipe_records_dropped_total", "sink" => port.name.to_string(), "reason" => "closed").increment(1);
                    }
                }
                WhenFull::DropNewest => {
                    if port.tx.try_send(record.clone()).is_err() {
                        metrics::counter!("fluxpipe_records_dropped_total", "sink" => port.name.to_string(), "reason" => "full").increment(1);
                    }
                }
            }
        }
    }
}

/// Run one sink until every sender is gone and its buffer is delivered.
pub async fn run(name: String, config: SinkConfig, rx: SinkRx) -> anyhow::Result<()> {
    match config {
        SinkConfig::Stdout(_) => stdout::run(&name, rx).await,
        SinkConfig::File(c) => file::run(&name, c, rx).await,
        SinkConfig::Socket(c) => socket::run(&name, c, rx).await,
        SinkConfig::Http(c) => http::run(&name, c, rx).await,
    }
}

/// Count one delivered record for a sink.
pub fn count_sent(name: &str, n: u64) {
    metrics::counter!("fluxpipe_records_sent_total", "sink" => name.to_string()).increment(n);
}
