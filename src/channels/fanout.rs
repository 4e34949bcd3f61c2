//! The fan-out from the shards to the sinks: each sink's bounded channel,
//! the table that sends a record to every sink whose `inputs` name its
//! stream, what a shard holds until the end of a round of work, and the
//! counts of what each sink is done with (the acknowledgements checkpoints
//! wait for).

use crate::channels::tap::Taps;
use crate::output::OutputRecord;
use crate::output::effects::Emit;
use crate::output::{OutputStream, StreamSet};
use crate::telemetry::metric;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

/// What a sink does when its buffer is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Wait: backpressure reaches the sources.
    #[default]
    Block,
    /// Drop the new record and count it.
    DropNewest,
}

/// What the fan-out needs to feed a sink: the streams it takes, and how
/// its channel behaves (from the keys every sink has,
/// [`crate::sinks::config`]).
#[derive(Debug, Clone, Copy)]
pub struct Subscription {
    pub streams: StreamSet,
    pub when_full: WhenFull,
    /// Records buffered before `when_full` applies.
    pub buffer: usize,
}

/// The receiving end of a sink's channel, which also keeps count of the
/// records the sink is done with (delivered, or given up and counted as
/// dropped). A checkpoint waits until every sink is done with what was
/// queued for it before the barrier.
#[derive(Debug)]
pub struct SinkRx {
    name: Arc<str>,
    rx: mpsc::Receiver<Arc<OutputRecord>>,
    done: Arc<AtomicU64>,
    given_up: Arc<AtomicU64>,
    /// Records the sink is done with for checkpoints but still holds
    /// undelivered (the alertmanager sink's alerts).
    held: Arc<AtomicU64>,
}

impl SinkRx {
    /// A sink's end of a channel made elsewhere (tests, tools).
    pub fn new(name: &str, rx: mpsc::Receiver<Arc<OutputRecord>>) -> Self {
        SinkRx {
            name: name.into(),
            rx,
            done: Arc::default(),
            given_up: Arc::default(),
            held: Arc::default(),
        }
    }

    /// Say how many records the sink holds undelivered beyond its queue
    /// (shown in `fluxpipe_sink_buffered_records`).
    pub fn set_held(&self, n: u64) {
        self.held.store(n, Ordering::Release);
    }

    pub async fn recv(&mut self) -> Option<Arc<OutputRecord>> {
        self.rx.recv().await
    }

    pub async fn recv_many(&mut self, buf: &mut Vec<Arc<OutputRecord>>, limit: usize) -> usize {
        self.rx.recv_many(buf, limit).await
    }

    /// A batch: wait as long as it takes for its first record, then at
    /// most `linger` for the rest, up to `max`. 0 when the channel is
    /// closed and empty. Cancel-safe: records taken stay in `buf`, and the
    /// next call goes on with them.
    pub async fn recv_batch(
        &mut self,
        buf: &mut Vec<Arc<OutputRecord>>,
        max: usize,
        linger: std::time::Duration,
    ) -> usize {
        let max = max.max(1);
        // Records already in `buf` (a call cancelled while it waited for
        // more) count as the batch's first: cancel-safe.
        if buf.is_empty() && self.rx.recv_many(buf, max).await == 0 {
            return 0;
        }
        let until = tokio::time::Instant::now() + linger;
        while buf.len() < max {
            let room = max - buf.len();
            match tokio::time::timeout_at(until, self.rx.recv_many(buf, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        buf.len()
    }

    pub fn try_recv(&mut self) -> Result<Arc<OutputRecord>, mpsc::error::TryRecvError> {
        self.rx.try_recv()
    }

    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    pub fn is_closed(&self) -> bool {
        self.rx.is_closed()
    }

    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// `n` records reached their destination.
    pub fn delivered(&self, n: u64) {
        count_sent(&self.name, n);
        self.done_with(n);
    }

    /// The sink is done with `n` more records without delivering them
    /// itself: taken into state of its own that a restart rebuilds.
    pub fn done_with(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Release);
    }

    /// The sink gives up on `held` records in hand and on everything
    /// still to come, until the channel closes; returns how many. Each is
    /// given up as soon as it is seen: a checkpoint round waits for the
    /// sink to be done with them.
    pub async fn give_up_rest(&mut self, held: u64) -> u64 {
        self.given_up(held);
        let mut total = held;
        let mut records = Vec::new();
        while self.rx.recv_many(&mut records, 1024).await > 0 {
            self.given_up(records.len() as u64);
            total += records.len() as u64;
            records.clear();
        }
        total
    }

    /// The sink gave up on `n` records (rejected, or retries exhausted;
    /// counted and logged by the sink). They hold the pipeline's positions
    /// back: no checkpoint is taken past them, so a restart reads them
    /// again rather than skipping them.
    pub fn given_up(&self, n: u64) {
        self.given_up.fetch_add(n, Ordering::Release);
        self.done_with(n);
    }
}

/// One sink's entry in the fan-out table.
#[derive(Debug, Clone)]
struct SinkPort {
    name: Arc<str>,
    streams: StreamSet,
    tx: mpsc::Sender<Arc<OutputRecord>>,
    when_full: WhenFull,
    dropped: Arc<AtomicU64>,
    /// Records queued for the sink, records it is done with, and records
    /// it gave up on.
    queued: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    given_up: Arc<AtomicU64>,
    held: Arc<AtomicU64>,
}

/// Each sink's queued, done and given-up counts.
#[derive(Debug, Clone, Default)]
pub struct SinkCounters(Arc<[SinkCount]>);

#[derive(Debug)]
struct SinkCount {
    name: Arc<str>,
    queued: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    given_up: Arc<AtomicU64>,
    held: Arc<AtomicU64>,
}

impl SinkCounters {
    /// Records sink `name` has been given so far.
    pub fn queued(&self, name: &str) -> Option<u64> {
        self.0
            .iter()
            .find(|c| &*c.name == name)
            .map(|c| c.queued.load(Ordering::Acquire))
    }

    /// What each sink has been given so far.
    pub fn watermarks(&self) -> Watermarks {
        Watermarks(
            self.0
                .iter()
                .map(|c| {
                    (
                        c.name.clone(),
                        c.queued.load(Ordering::Acquire),
                        c.done.clone(),
                    )
                })
                .collect(),
        )
    }

    /// `fluxpipe_sink_buffered_records{sink}`: records queued for each sink
    /// that it is not done with yet, in the Prometheus text format (read
    /// at scrape time from the counters the pipeline keeps anyway).
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let name = crate::telemetry::metric::FLUXPIPE_SINK_BUFFERED_RECORDS;
        let mut out = String::new();
        crate::telemetry::metric::header(&mut out, name);
        for c in self.0.iter() {
            let buffered = c
                .queued
                .load(Ordering::Acquire)
                .saturating_sub(c.done.load(Ordering::Acquire))
                + c.held.load(Ordering::Acquire);
            let sink = crate::telemetry::escape(&c.name);
            let _ = writeln!(out, "{name}{{sink=\"{sink}\"}} {buffered}");
        }
        out
    }

    /// Records the sinks have given up on since the start.
    pub fn given_up(&self) -> u64 {
        self.0
            .iter()
            .map(|c| c.given_up.load(Ordering::Acquire))
            .sum()
    }
}

/// Where each sink stood when a checkpoint's barrier had passed every
/// shard: the records queued for it by then.
#[derive(Debug, Clone)]
pub struct Watermarks(Vec<(Arc<str>, u64, Arc<AtomicU64>)>);

impl Watermarks {
    /// Sinks still busy with records queued before the marks, with how
    /// many they have left.
    pub fn pending(&self) -> Vec<(String, u64)> {
        self.0
            .iter()
            .filter_map(|(name, mark, done)| {
                let done = done.load(Ordering::Acquire);
                (done < *mark).then(|| (name.to_string(), mark - done))
            })
            .collect()
    }
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
    streams: StreamSet,
    /// Readers looking in (`fluxpipe tap`): offered every batch, never
    /// waited for.
    taps: Taps,
}

impl Outputs {
    /// Create a channel for every sink; returns the fan-out table and each
    /// sink's receiver, in the order given.
    pub fn new<'a>(
        sinks: impl IntoIterator<Item = (&'a str, Subscription)>,
    ) -> (Self, Vec<SinkRx>) {
        let mut ports = Vec::new();
        let mut rxs = Vec::new();
        for (name, common) in sinks {
            let (tx, rx) = mpsc::channel(common.buffer.max(1));
            let done = Arc::new(AtomicU64::new(0));
            let given_up = Arc::new(AtomicU64::new(0));
            let held = Arc::new(AtomicU64::new(0));
            ports.push(SinkPort {
                name: name.into(),
                streams: common.streams,
                tx,
                when_full: common.when_full,
                dropped: Arc::default(),
                queued: Arc::default(),
                done: done.clone(),
                given_up: given_up.clone(),
                held: held.clone(),
            });
            rxs.push(SinkRx {
                name: name.into(),
                rx,
                done,
                given_up,
                held,
            });
        }
        let streams = ports
            .iter()
            .fold(StreamSet::EMPTY, |acc, p| acc.union(p.streams));
        (
            Outputs {
                ports: ports.into(),
                streams,
                taps: Taps::default(),
            },
            rxs,
        )
    }

    /// Offer records to these taps too.
    pub fn with_taps(mut self, taps: Taps) -> Self {
        self.taps = taps;
        self
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

    /// The sinks' queued and done counts, without holding their channels
    /// open.
    pub fn counters(&self) -> SinkCounters {
        SinkCounters(
            self.ports
                .iter()
                .map(|p| SinkCount {
                    name: p.name.clone(),
                    queued: p.queued.clone(),
                    done: p.done.clone(),
                    given_up: p.given_up.clone(),
                    held: p.held.clone(),
                })
                .collect(),
        )
    }

    /// Whether any sink takes `stream`: records nobody wants are not built.
    pub fn wants(&self, stream: OutputStream) -> bool {
        self.streams.union(self.taps.streams()).contains(stream)
    }

    /// Deliver one record to every subscribed sink.
    pub async fn emit(&self, record: OutputRecord) {
        if self.wants(record.stream) {
            self.emit_all(&mut vec![Arc::new(record)]).await;
        }
    }

    /// Deliver records to every subscribed sink, each sink's in one go: room
    /// for all of them is reserved at once, and the sink, if it was waiting,
    /// is woken once rather than for every record.
    pub async fn emit_all(&self, records: &mut Vec<Arc<OutputRecord>>) {
        for port in self.ports.iter() {
            let mine = || records.iter().filter(|r| port.streams.contains(r.stream));
            match port.when_full {
                WhenFull::Block => {
                    let mut left = mine().count();
                    let mut sending = mine();
                    while left > 0 {
                        let n = left.min(port.tx.max_capacity());
                        let Ok(permits) = port.tx.reserve_many(n).await else {
                            port.closed(left as u64);
                            break;
                        };
                        for (permit, record) in permits.zip(&mut sending) {
                            permit.send(record.clone());
                        }
                        port.queued.fetch_add(n as u64, Ordering::Release);
                        left -= n;
                    }
                }
                WhenFull::DropNewest => {
                    for record in mine() {
                        port.try_deliver(record);
                    }
                }
            }
        }
        if !self.taps.streams().is_empty() {
            self.taps.offer(records);
        }
        records.clear();
    }
}

impl SinkPort {
    /// The sink has exited (after an error): `n` records dropped.
    fn closed(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => self.name.to_string(), "reason" => "closed").increment(n);
    }

    /// Queue a record if there is room; otherwise drop and count it.
    fn try_deliver(&self, record: &Arc<OutputRecord>) {
        if self.tx.try_send(record.clone()).is_ok() {
            self.queued.fetch_add(1, Ordering::Release);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => self.name.to_string(), "reason" => "full").increment(1);
        }
    }
}

/// Most records an operator holds before handing them on.
const HOLD_MAX: usize = 512;

/// Records an operator has made, held until its round of work is over (or
/// [`HOLD_MAX`] are held) and then handed to the sinks together. Handed
/// over one by one, a caught-up sink was woken for nearly every record: a
/// system call on the operator's thread each time.
#[derive(Debug)]
pub struct OutputBuffer {
    outputs: Outputs,
    held: Vec<Arc<OutputRecord>>,
}

impl OutputBuffer {
    pub fn new(outputs: Outputs) -> Self {
        OutputBuffer {
            outputs,
            held: Vec::new(),
        }
    }

    /// Whether any sink takes `stream`.
    pub fn wants(&self, stream: OutputStream) -> bool {
        self.outputs.wants(stream)
    }

    /// Hold a record for the sinks subscribed to its stream, and hand
    /// what is held on once it is [`HOLD_MAX`] records.
    pub async fn emit(&mut self, record: OutputRecord) {
        Emit::emit(self, record);
        self.flush_if_full().await;
    }

    /// Hand what is held on if it is [`HOLD_MAX`] records or more (the
    /// records of one input record are held together, then this).
    pub async fn flush_if_full(&mut self) {
        if self.held.len() >= HOLD_MAX {
            self.flush().await;
        }
    }

    /// Hand what is held to the sinks (waiting for room at `block` sinks).
    pub async fn flush(&mut self) {
        if !self.held.is_empty() {
            self.outputs.emit_all(&mut self.held).await;
        }
    }

    /// Hand what is held on, then let go of the sinks: they hear the end
    /// from this buffer now, not when its owner is freed.
    pub async fn close(&mut self) {
        self.flush().await;
        let (none, _) = Outputs::new(std::iter::empty());
        self.outputs = none;
    }
}

impl Emit for OutputBuffer {
    fn wants(&self, stream: OutputStream) -> bool {
        self.outputs.wants(stream)
    }

    fn emit(&mut self, record: OutputRecord) {
        if self.outputs.wants(record.stream) {
            self.held.push(Arc::new(record));
        }
    }
}

/// Count delivered records for a sink.
pub fn count_sent(name: &str, n: u64) {
    metrics::counter!(metric::FLUXPIPE_RECORDS_SENT_TOTAL, "sink" => name.to_string()).increment(n);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::config;

    fn outputs(sinks: &str) -> (Outputs, Vec<SinkRx>) {
        let cfg = config::parse(&format!("[sources.s]\ntype = \"stdin\"\n{sinks}")).unwrap();
        Outputs::new(
            cfg.sinks
                .iter()
                .map(|(n, c)| (n.as_str(), c.common().subscription())),
        )
    }

    fn record(stream: OutputStream, n: u64) -> OutputRecord {
        OutputRecord::raw(stream, &serde_json::json!({ "n": n }))
    }

    fn lines(rx: &mut SinkRx) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|r| r.line().to_string())
            .collect()
    }

    #[tokio::test]
    async fn a_batch_cut_short_keeps_its_records_for_the_next_call() {
        let (tx, rx) = mpsc::channel(8);
        let mut rx = SinkRx::new("s", rx);
        tx.send(Arc::new(record(OutputStream::Jobs, 1)))
            .await
            .unwrap();
        let mut buf = Vec::new();
        // Cut while it lingers for more (as the database sink's hourly
        // prune does).
        let linger = std::time::Duration::from_secs(60);
        let cut = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            rx.recv_batch(&mut buf, 10, linger),
        )
        .await;
        assert!(cut.is_err());
        assert_eq!(buf.len(), 1);
        drop(tx);
        assert_eq!(rx.recv_batch(&mut buf, 10, linger).await, 1);
        buf.clear();
        assert_eq!(rx.recv_batch(&mut buf, 10, linger).await, 0);
    }

    #[tokio::test]
    async fn held_records_reach_their_sinks_in_order_only_when_flushed() {
        let (outputs, mut rxs) = outputs(
            "[sinks.a]\ntype = \"blackhole\"\ninputs = [\"transitions\"]\n\
             [sinks.b]\ntype = \"blackhole\"\ninputs = [\"transitions\", \"jobs\"]\n",
        );
        let mut held = OutputBuffer::new(outputs.clone());
        for n in 0..3 {
            held.emit(record(OutputStream::Transitions, n)).await;
            held.emit(record(OutputStream::Jobs, 10 + n)).await;
            // nobody takes alerts: not even held
            held.emit(record(OutputStream::Alerts, 20 + n)).await;
        }
        assert!(rxs.iter_mut().all(|rx| rx.try_recv().is_err()));
        held.flush().await;
        let [a, b] = &mut rxs[..] else { panic!() };
        assert_eq!(lines(a), [r#"{"n":0}"#, r#"{"n":1}"#, r#"{"n":2}"#]);
        let b = lines(b);
        assert_eq!(b.len(), 6);
        assert_eq!(b[..2], [r#"{"n":0}"#, r#"{"n":10}"#]);
        let queued: Vec<u64> = outputs
            .ports
            .iter()
            .map(|p| p.queued.load(Ordering::Acquire))
            .collect();
        assert_eq!(queued, [3, 6]);
    }

    #[tokio::test]
    async fn a_flush_bigger_than_a_block_sinks_buffer_waits_for_room() {
        let (outputs, mut rxs) = outputs(
            "[sinks.a]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\nbuffer = 4\nwhen_full = \"block\"\n",
        );
        let mut rx = rxs.remove(0);
        let taker = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(r) = rx.recv().await {
                got.push(r.line().to_string());
            }
            got
        });
        let mut held = OutputBuffer::new(outputs);
        for n in 0..10 {
            held.emit(record(OutputStream::Jobs, n)).await;
        }
        held.flush().await;
        drop(held);
        let got = taker.await.unwrap();
        let want: Vec<String> = (0..10).map(|n| format!(r#"{{"n":{n}}}"#)).collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn a_full_drop_newest_sink_drops_and_counts_the_rest_of_a_flush() {
        let (outputs, mut rxs) = outputs(
            "[sinks.a]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\nbuffer = 4\nwhen_full = \"drop_newest\"\n",
        );
        let drops = outputs.drop_counts();
        let mut held = OutputBuffer::new(outputs);
        for n in 0..10 {
            held.emit(record(OutputStream::Jobs, n)).await;
        }
        held.flush().await;
        assert_eq!(lines(&mut rxs[0]).len(), 4);
        assert_eq!(drops.nonzero(), [("a".to_string(), 6)]);
    }
}
