//! Sources: where lines come from. Every source decodes its lines with the
//! shared decoder ([`crate::decode`]) and routes the records to the
//! operators; what cannot be decoded is counted, logged with where it came
//! from, and sent to `dead_letter`.
//!
//! Each source type is one file here that owns its config (a struct made
//! with [`config::source_config`], and its [`SourceSpec`]) and its `run`;
//! a new source is that file, its `pub mod` line and one line in the
//! list below.

pub mod config;
pub mod lines;

// The source types: a module each, and a line in `source_types!` below.
// Plain `mod` lines, so that rustfmt sees every file.
pub mod file;
pub mod http;
pub mod kafka;
pub mod socket;
pub mod stdin;

use crate::channels::fanout::Outputs;
use crate::channels::feeds::Feed;
use crate::channels::query::Ownership;
use crate::channels::router::{Closed, Routed, Router, Tally};
use crate::checkpoint::link::CheckpointLink;
use crate::component::{Claim, Problem};
use crate::decode::{self, Origin, Record};
use crate::output::OutputStream;
use crate::output::{DeadLetterRecord, OutputRecord};
use crate::telemetry::Readiness;
use crate::telemetry::metric;
use config::DecodeConfig;
use lines::Line;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;

/// Most records a [`RecordBuffer`] holds before handing them on.
const BUFFER_RECORDS: usize = 64;

/// Records decoded but not yet handed to the shards, by shard, in the
/// order read. A source holds the records of the lines it has at hand
/// and hands them on together ([`SourceContext::flush`]) before it waits
/// for more input: one queue message and at most one wake-up of a shard
/// per batch, not per record. What a source holds it has not handed on: a
/// source with positions moves them past held lines only once they are.
pub struct RecordBuffer {
    by_shard: Vec<Vec<Routed>>,
    held: usize,
    /// Where the shards count what became of these records, if the
    /// source wants to know.
    tally: Option<Arc<Tally>>,
}

/// What a source needs to hand its lines on.
#[derive(Clone)]
pub struct SourceContext {
    pub name: Arc<str>,
    /// Its index among the pipeline's sources (what its records carry).
    index: usize,
    pub decode: DecodeConfig,
    cluster: Arc<str>,
    router: Router,
    outputs: Outputs,
    /// Cancelled at shutdown: stop reading, keep what was read.
    pub shutdown: CancellationToken,
    /// This source's part in checkpoints: positions restored, rounds to
    /// take part in.
    pub checkpoint: CheckpointLink,
    invalid: Arc<AtomicU64>,
    /// Dead letters this second, shared by the source's tasks.
    dead_letters: Arc<DeadLetterRate>,
    /// Where a source that reads partitions says which it owns (the
    /// query API's answers carry it).
    pub ownership: Ownership,
    /// Where a source says it cannot do its work (`/readyz`).
    pub readiness: Readiness,
    /// `fluxpipe_events_received_total` of this source, registered once:
    /// the macro would build and look up its labelled key for every line.
    received: metrics::Counter,
    /// When this source's feed was last heard (the feed watch reads it).
    feed: Feed,
}

impl SourceContext {
    pub fn new(
        name: &str,
        index: usize,
        decode: DecodeConfig,
        router: Router,
        outputs: Outputs,
        shutdown: CancellationToken,
        checkpoint: CheckpointLink,
    ) -> Self {
        SourceContext {
            name: name.into(),
            index,
            cluster: decode.cluster.as_str().into(),
            decode,
            router,
            outputs,
            shutdown,
            checkpoint,
            invalid: Arc::new(AtomicU64::new(0)),
            dead_letters: Arc::new(DeadLetterRate::default()),
            ownership: Ownership::default(),
            readiness: Readiness::default(),
            received: metrics::counter!(metric::FLUXPIPE_EVENTS_RECEIVED_TOTAL, "source" => name.to_string()),
            feed: Feed::detached(),
        }
    }

    /// Note what this source hears on `feed` (the pipeline's, read by the
    /// feed watch).
    pub fn with_feed(mut self, feed: Feed) -> Self {
        self.feed = feed;
        self
    }

    /// The feed spoke without a line: a heartbeat (an empty `POST`).
    pub fn heard(&self) {
        self.feed.heartbeat();
    }

    /// Whether this source answers for its feed now (see
    /// [`Feed::set_watched`]).
    pub fn set_feed_watched(&self, watched: bool) {
        self.feed.set_watched(watched);
    }

    /// Report owned partitions to `ownership` (the pipeline's, shared by
    /// its sources and its API).
    pub fn with_ownership(mut self, ownership: Ownership) -> Self {
        self.ownership = ownership;
        self
    }

    /// Report what keeps this source from its work to `readiness` (the
    /// pipeline's, behind `/readyz`).
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// The origin of lines that have no path to tell: the configured
    /// stream and job id.
    pub fn default_origin(&self) -> Origin {
        Origin {
            stream: self.decode.stream,
            id: self.decode.job_id,
        }
    }

    /// Merge what a path says with the configured defaults.
    pub fn origin_with(&self, from_path: Origin) -> Origin {
        Origin {
            stream: from_path.stream.or(self.decode.stream),
            id: from_path.id.or(self.decode.job_id),
        }
    }

    /// An empty record buffer for this source's lines.
    pub fn record_buffer(&self) -> RecordBuffer {
        RecordBuffer {
            by_shard: (0..self.router.len()).map(|_| Vec::new()).collect(),
            held: 0,
            tally: None,
        }
    }

    /// An empty record buffer whose records the shards count in `tally`.
    pub fn tallied_record_buffer(&self, tally: Arc<Tally>) -> RecordBuffer {
        RecordBuffer {
            tally: Some(tally),
            ..self.record_buffer()
        }
    }

    /// Decode one line read at `location` and hold its records in `out`,
    /// handing them on when it is full. Returns whether everything held,
    /// this line's records included, has been handed on.
    pub async fn hold_line(
        &self,
        out: &mut RecordBuffer,
        line: Line<'_>,
        origin: &Origin,
        location: &(dyn Fn() -> String + Sync),
    ) -> Result<bool, Closed> {
        self.hold_line_noting(out, line, origin, location, None)
            .await
    }

    /// [`Self::hold_line`], noting in `errors` why the line (or part of
    /// it) could not be decoded, for a source that answers its client.
    pub async fn hold_line_noting(
        &self,
        out: &mut RecordBuffer,
        line: Line<'_>,
        origin: &Origin,
        location: &(dyn Fn() -> String + Sync),
        errors: Option<&mut Vec<String>>,
    ) -> Result<bool, Closed> {
        let Some(records) = self.decode_line(line, origin, location, errors).await else {
            return Ok(out.held == 0);
        };
        for record in records {
            let shard = self.shard_of(&record);
            let routed = Routed {
                source: self.index,
                partition: None,
                record,
            };
            match out.by_shard.get_mut(shard) {
                Some(batch) => batch.push(routed),
                None => return Err(Closed),
            }
            out.held += 1;
        }
        if out.held >= BUFFER_RECORDS {
            self.flush(out).await?;
        }
        Ok(out.held == 0)
    }

    /// Hand on what `out` holds.
    pub async fn flush(&self, out: &mut RecordBuffer) -> Result<(), Closed> {
        if out.held == 0 {
            return Ok(());
        }
        out.held = 0;
        for (shard, batch) in out.by_shard.iter_mut().enumerate() {
            if !batch.is_empty() {
                let batch = std::mem::replace(batch, Vec::with_capacity(BUFFER_RECORDS));
                self.router
                    .send_batch(shard, batch, out.tally.as_ref())
                    .await?;
            }
        }
        Ok(())
    }

    /// Decode one line read from a partition of a partitioned source and
    /// route its records one by one (the Kafka source, whose offsets move
    /// per message); the state they build belongs to the partition.
    pub async fn partition_line(
        &self,
        line: Line<'_>,
        origin: &Origin,
        location: &(dyn Fn() -> String + Sync),
        partition: Option<i32>,
    ) -> Result<(), Closed> {
        let Some(records) = self.decode_line(line, origin, location, None).await else {
            return Ok(());
        };
        for record in records {
            self.route(record, partition).await?;
        }
        Ok(())
    }

    /// Decode one line: its records (journal sentinels left out), after
    /// what could not be decoded of it went to `dead_letter`.
    async fn decode_line(
        &self,
        line: Line<'_>,
        origin: &Origin,
        location: &(dyn Fn() -> String + Sync),
        mut noted: Option<&mut Vec<String>>,
    ) -> Option<impl Iterator<Item = Record> + use<>> {
        self.received.increment(1);
        // Every line is a sign of life, a blank one (a heartbeat) too.
        self.feed.heard();
        let bytes = match line {
            Line::Full(bytes) => bytes,
            Line::TooLong { prefix, len } => {
                let error = format!(
                    "line of {len} bytes is longer than max_line_bytes ({})",
                    self.decode.max_line_bytes
                );
                self.dead_letter(&location(), &error, prefix).await;
                if let Some(noted) = noted {
                    noted.push(error);
                }
                return None;
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            self.feed.heartbeat();
            return None;
        }
        let decoded = decode::decode_line(bytes, origin, self.decode.format);
        // A cluster the line names is a feed of its own (the source's own
        // was heard above).
        for c in decoded.records.iter().filter_map(|r| r.cluster.as_deref()) {
            if c != &*self.cluster {
                self.feed.heard_for(c);
            }
        }
        for err in &decoded.errors {
            let error = err.to_string();
            self.dead_letter(&location(), &error, bytes).await;
            if let Some(noted) = noted.as_deref_mut() {
                noted.push(error);
            }
        }
        Some(
            decoded
                .records
                .into_iter()
                .filter(|r| r.body != decode::Body::Sentinel),
        )
    }

    fn shard_of(&self, record: &Record) -> usize {
        let cluster = record.cluster.as_deref().unwrap_or(&self.cluster);
        self.router.shard_of(cluster, record.id.map(|id| id.0))
    }

    /// Route one ready-made record (an R document read whole, say): its
    /// own cluster, or this source's.
    pub async fn record(&self, record: Record) -> Result<(), Closed> {
        self.route(record, None).await
    }

    async fn route(&self, record: Record, partition: Option<i32>) -> Result<(), Closed> {
        let shard = self.shard_of(&record);
        let routed = Routed {
            source: self.index,
            partition,
            record,
        };
        self.router.send(shard, routed).await
    }

    /// The router, for partitioned sources that release and adopt state.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Count, log (sparingly) and forward input that could not be decoded.
    pub async fn dead_letter(&self, location: &str, error: &str, line: &[u8]) {
        metrics::counter!(metric::FLUXPIPE_EVENTS_INVALID_TOTAL, "source" => self.name.to_string())
            .increment(1);
        let n = self.invalid.fetch_add(1, Ordering::Relaxed) + 1;
        // The first few, then every power of two: a flood of garbage does
        // not become a flood of log lines.
        if n <= 10 || n.is_power_of_two() {
            tracing::warn!(source = %self.name, %location, %error, count = n, "undecodable input");
        }
        if self.outputs.wants(OutputStream::DeadLetter) {
            if !self
                .dead_letters
                .admit(self.decode.dead_letters_per_sec, std::time::Instant::now())
            {
                metrics::counter!(metric::FLUXPIPE_DEAD_LETTERS_SUPPRESSED_TOTAL, "source" => self.name.to_string())
                    .increment(1);
                return;
            }
            let rec = DeadLetterRecord::new(&self.name, location, error, line);
            self.outputs.emit(OutputRecord::dead_letter(rec)).await;
        }
    }
}

/// Dead letters written in the current second: garbage input must not
/// become several times its size in dead letters.
#[derive(Debug, Default)]
struct DeadLetterRate {
    /// (the second, counted in it), from the first dead letter on.
    window: std::sync::Mutex<Option<(std::time::Instant, u32)>>,
}

impl DeadLetterRate {
    /// Whether one more may be written at `now`, `per_sec` a second (0:
    /// no limit).
    fn admit(&self, per_sec: u32, now: std::time::Instant) -> bool {
        if per_sec == 0 {
            return true;
        }
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *window {
            Some((start, n))
                if now.saturating_duration_since(*start) < std::time::Duration::from_secs(1) =>
            {
                if *n >= per_sec {
                    return false;
                }
                *n += 1;
            }
            _ => *window = Some((now, 1)),
        }
        true
    }
}

/// What the pipeline asks of every source type's config, besides its
/// decoding keys (each has `decode()`, made by [`config::source_config`]).
pub trait SourceSpec {
    /// What is wrong with its own keys (the decoding keys are checked for
    /// every source).
    fn problems(&self) -> Vec<Problem> {
        Vec::new()
    }

    /// What it holds that no other component may.
    fn claims(&self) -> Vec<Claim> {
        Vec::new()
    }

    /// Whether it has positions to checkpoint (and takes part in
    /// checkpoint rounds).
    fn has_positions(&self) -> bool {
        false
    }

    /// Whether it keeps its partitions' state in a changelog.
    fn keeps_changelog(&self) -> bool {
        false
    }

    /// What names its input, beyond its type (file patterns; Kafka topics
    /// and group): kept in checkpoints, so that a checkpoint is not
    /// restored into a pipeline reading something else. Not where it
    /// listens: an address can move and the feed stay the same.
    fn reads(&self) -> String {
        String::new()
    }

    /// Whether a feeder can keep it alive with heartbeats while idle (the
    /// forwarder's blank lines or empty `POST`s): then silence means a
    /// dead feed, and `feed_silent` watches it by default.
    fn heartbeats(&self) -> bool {
        false
    }
}

/// The source types: `type = "NAME"` → module and config. Makes the
/// `[sources.NAME]` config enum and the calls into each type.
macro_rules! source_types {
    ($($variant:ident => $module:ident :: $config:ident,)*) => {

        /// `[sources.NAME]`.
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
        pub enum SourceConfig {
            $($variant($module::$config),)*
        }

        impl SourceConfig {
            /// Every `type = "NAME"`.
            pub const TYPES: &[&str] = &[$(stringify!($module)),*];

            fn spec(&self) -> &dyn SourceSpec {
                match self {
                    $(SourceConfig::$variant(c) => c,)*
                }
            }

            /// Its `type`.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(SourceConfig::$variant(_) => stringify!($module),)*
                }
            }

            /// How its lines are decoded.
            pub fn decode(&self) -> DecodeConfig {
                match self {
                    $(SourceConfig::$variant(c) => c.decode(),)*
                }
            }

            /// The error a table of source type `kind` gives when read as
            /// that type (`None` for an unknown type).
            pub fn table_error<'de, D: serde::Deserializer<'de>>(
                kind: &str,
                de: D,
            ) -> Option<D::Error> {
                $(if kind == stringify!($module) {
                    return <$module::$config as serde::Deserialize>::deserialize(de).err();
                })*
                None
            }
        }

        /// Run one source until its input ends or shutdown; returns its
        /// final positions (in its own JSON form) if it has any.
        pub async fn run(
            config: SourceConfig,
            ctx: SourceContext,
        ) -> anyhow::Result<Option<String>> {
            match config {
                $(SourceConfig::$variant(c) => $module::run(c, ctx).await,)*
            }
        }
    };
}

source_types! {
    File => file::FileSourceConfig,
    Socket => socket::SocketSourceConfig,
    Http => http::HttpSourceConfig,
    Stdin => stdin::StdinSourceConfig,
    Kafka => kafka::KafkaSourceConfig,
}

impl SourceSpec for SourceConfig {
    fn problems(&self) -> Vec<Problem> {
        let mut out = self.decode().problems();
        out.extend(self.spec().problems());
        out
    }

    fn claims(&self) -> Vec<Claim> {
        self.spec().claims()
    }

    fn has_positions(&self) -> bool {
        self.spec().has_positions()
    }

    fn keeps_changelog(&self) -> bool {
        self.spec().keeps_changelog()
    }

    fn reads(&self) -> String {
        self.spec().reads()
    }

    fn heartbeats(&self) -> bool {
        self.spec().heartbeats()
    }
}

impl SourceConfig {
    /// Its type and what it reads, as checkpoints keep it.
    pub fn identity(&self) -> String {
        match self.reads() {
            r if r.is_empty() => self.kind().to_string(),
            r => format!("{} {r}", self.kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DeadLetterRate;
    use std::time::{Duration, Instant};

    #[test]
    fn dead_letters_are_capped_per_second() {
        let rate = DeadLetterRate::default();
        let t = Instant::now();
        assert!((0..3).all(|_| rate.admit(3, t)));
        assert!(!rate.admit(3, t + Duration::from_millis(999)));
        // A new second, a new allowance.
        assert!(rate.admit(3, t + Duration::from_secs(1)));
        // No limit asked.
        assert!((0..100).all(|_| DeadLetterRate::default().admit(0, t)));
    }
}
