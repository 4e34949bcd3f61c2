//! Taps: a live look at chosen output streams of a running pipeline, as
//! `vector tap` gives (`fluxpipe tap`, through the API's `/api/v1/tap`).
//!
//! A tap never slows the pipeline: the fan-out offers it each batch of
//! records with `try_send`, and what a slow reader has no room for is
//! dropped and counted for it (the reader is told how many). With no tap
//! open the fan-out pays one atomic load per batch; a stream that only a
//! tap takes is built only while the tap is open.

use crate::flux::jobid::JobId;
use crate::output::{OutputRecord, StreamSet};
use crate::telemetry::metric;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Taps open at once, at most.
pub const MAX_TAPS: usize = 8;
/// Records queued for one tap's reader before more are dropped.
const CAPACITY: usize = 4096;

/// The pipeline's open taps (cheap to clone; the fan-out and the API
/// share one).
#[derive(Debug, Clone, Default)]
pub struct Taps(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// The streams some open tap takes (a [`StreamSet`]'s bits).
    bits: AtomicU32,
    ports: Mutex<Vec<Port>>,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct Port {
    id: u64,
    streams: StreamSet,
    tx: mpsc::Sender<Arc<OutputRecord>>,
    dropped: Arc<AtomicU64>,
}

impl Taps {
    /// The streams open taps take.
    pub fn streams(&self) -> StreamSet {
        StreamSet::from_bits(self.0.bits.load(Ordering::Relaxed))
    }

    /// Open a tap on `streams`; `None` when [`MAX_TAPS`] are open.
    pub fn open(&self, streams: StreamSet) -> Option<Tap> {
        let (tx, rx) = mpsc::channel(CAPACITY);
        let dropped = Arc::new(AtomicU64::new(0));
        let id = self.0.next_id.fetch_add(1, Ordering::Relaxed);
        let mut ports = self.0.ports.lock().ok()?;
        if ports.len() >= MAX_TAPS {
            return None;
        }
        ports.push(Port {
            id,
            streams,
            tx,
            dropped: dropped.clone(),
        });
        self.0.bits.fetch_or(streams.bits(), Ordering::Relaxed);
        metrics::gauge!(metric::FLUXPIPE_TAPS_OPEN).set(ports.len() as f64);
        Some(Tap {
            id,
            rx,
            dropped,
            taps: self.clone(),
        })
    }

    /// Give every open tap the records of its streams it has room for.
    pub fn offer(&self, records: &[Arc<OutputRecord>]) {
        let Ok(ports) = self.0.ports.lock() else {
            return;
        };
        let mut dropped = 0;
        for port in ports.iter() {
            let mut lost = 0;
            for r in records.iter().filter(|r| port.streams.contains(r.stream)) {
                if port.tx.try_send(r.clone()).is_err() {
                    lost += 1;
                }
            }
            if lost > 0 {
                port.dropped.fetch_add(lost, Ordering::Relaxed);
                dropped += lost;
            }
        }
        drop(ports);
        // Counted once a batch, out of the lock.
        if dropped > 0 {
            metrics::counter!(metric::FLUXPIPE_TAP_RECORDS_DROPPED_TOTAL).increment(dropped);
        }
    }

    fn close(&self, id: u64) {
        if let Ok(mut ports) = self.0.ports.lock() {
            ports.retain(|p| p.id != id);
            let streams = ports
                .iter()
                .fold(StreamSet::EMPTY, |acc, p| acc.union(p.streams));
            self.0.bits.store(streams.bits(), Ordering::Relaxed);
            metrics::gauge!(metric::FLUXPIPE_TAPS_OPEN).set(ports.len() as f64);
        }
    }
}

/// One open tap; closed when dropped.
#[derive(Debug)]
pub struct Tap {
    id: u64,
    rx: mpsc::Receiver<Arc<OutputRecord>>,
    dropped: Arc<AtomicU64>,
    taps: Taps,
}

impl Tap {
    pub async fn recv(&mut self) -> Option<Arc<OutputRecord>> {
        self.rx.recv().await
    }

    /// A record already queued, without waiting.
    pub fn try_recv(&mut self) -> Option<Arc<OutputRecord>> {
        self.rx.try_recv().ok()
    }

    /// Records dropped for this tap since the last call.
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.taps.close(self.id);
    }
}

/// Which records of the tapped streams a reader wants: of one cluster,
/// one job, one node (by host name, `rankN` or rank). Judged on the
/// reader's side, from the record's [`Subject`](crate::output::Subject):
/// no line is read back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TapFilter {
    pub cluster: Option<String>,
    pub job: Option<JobId>,
    pub node: Option<String>,
}

impl TapFilter {
    pub fn is_empty(&self) -> bool {
        self == &TapFilter::default()
    }

    pub fn matches(&self, record: &OutputRecord) -> bool {
        let about = record.subject();
        if let Some(c) = &self.cluster
            && about.cluster != Some(c.as_str())
        {
            return false;
        }
        if let Some(job) = self.job
            && about.id != Some(job.0)
        {
            return false;
        }
        if let Some(node) = &self.node {
            let named = about.node == Some(node.as_str());
            let ranked = about
                .rank
                .is_some_and(|r| node.strip_prefix("rank").unwrap_or(node).parse::<u32>() == Ok(r));
            if !named && !ranked {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::OutputStream;
    use serde_json::json;

    fn record(stream: OutputStream, n: u64) -> Arc<OutputRecord> {
        Arc::new(OutputRecord::raw(stream, &json!({ "n": n })))
    }

    #[tokio::test]
    async fn a_tap_gets_its_streams_and_drops_what_it_has_no_room_for() {
        let taps = Taps::default();
        assert!(taps.streams().is_empty());
        let mut tap = taps
            .open(StreamSet::from_iter([OutputStream::Transitions]))
            .expect("room for a tap");
        assert_eq!(
            taps.streams(),
            StreamSet::from_iter([OutputStream::Transitions])
        );
        taps.offer(&[
            record(OutputStream::Transitions, 1),
            record(OutputStream::Jobs, 2),
        ]);
        let got = tap.recv().await.expect("a record");
        assert_eq!(got.line(), r#"{"n":1}"#);
        // Past its room: dropped and counted, never waited for.
        let many: Vec<_> = (0..CAPACITY as u64 + 10)
            .map(|n| record(OutputStream::Transitions, n))
            .collect();
        taps.offer(&many);
        assert_eq!(tap.take_dropped(), 10);
        assert_eq!(tap.take_dropped(), 0);
        drop(tap);
        assert!(taps.streams().is_empty());
    }

    #[test]
    fn taps_are_capped() {
        let taps = Taps::default();
        let open: Vec<Tap> = (0..MAX_TAPS)
            .map(|_| {
                taps.open(StreamSet::from_iter([OutputStream::Alerts]))
                    .expect("room")
            })
            .collect();
        assert!(
            taps.open(StreamSet::from_iter([OutputStream::Alerts]))
                .is_none()
        );
        drop(open);
        assert!(
            taps.open(StreamSet::from_iter([OutputStream::Alerts]))
                .is_some()
        );
    }

    #[test]
    fn filters_pick_a_cluster_a_job_and_a_node() {
        use crate::flux::job::{JobState, Transition};
        use crate::flux::resource::{RankChange, RankState};
        let job = OutputRecord::transition(
            &crate::keyed::state::KeyedTransition {
                key: crate::keyed::JobKey {
                    cluster: "a".into(),
                    id: JobId(42),
                },
                transition: Transition {
                    from: JobState::Sched,
                    to: JobState::Run,
                    timestamp: 1.0,
                },
            },
            "alloc",
        );
        let n3 = RankState {
            hostname: Some("n3".into()),
            ..RankState::new(3)
        };
        let change = RankChange {
            rank: 3,
            before: None,
            after: Some(n3),
        };
        let node = OutputRecord::rank_change("a", change, None);
        let mut rank7 = crate::output::AlertRecord::of_job("firing", "f1", 1.0, None);
        (rank7.cluster, rank7.id, rank7.node, rank7.rank) =
            ("b".into(), None, Some("rank7".into()), Some(7));
        let alert = OutputRecord::alert(rank7);
        let f = |cluster: Option<&str>, job: Option<u64>, node: Option<&str>| TapFilter {
            cluster: cluster.map(str::to_string),
            job: job.map(JobId),
            node: node.map(str::to_string),
        };
        assert!(f(None, None, None).is_empty());
        assert!(f(Some("a"), None, None).matches(&job));
        assert!(!f(Some("b"), None, None).matches(&job));
        assert!(f(Some("a"), Some(42), None).matches(&job));
        assert!(!f(None, Some(41), None).matches(&job));
        assert!(!f(None, Some(42), None).matches(&node));
        for name in ["n3", "rank3", "3"] {
            assert!(f(None, None, Some(name)).matches(&node), "{name}");
        }
        assert!(!f(None, None, Some("n4")).matches(&node));
        assert!(f(None, None, Some("rank7")).matches(&alert));
        assert!(!f(None, None, Some("n3")).matches(&job));
    }
}
