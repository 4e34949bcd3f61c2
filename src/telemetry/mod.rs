//! The pipeline's metrics: the Prometheus recorder behind the `metrics`
//! macros, the per-node (RAS) view rendered at scrape time, and readiness.
//!
//! Counters, gauges and histograms that only grow or move go through the
//! `metrics` crate. Per-node series are rendered from the current rank
//! state at each scrape instead, so a series that stops being true (a node
//! undrained, a drain reason replaced) disappears rather than sticking at 0.

pub mod ages;
mod entry_times;
pub mod exposition;
pub mod job_metrics;
pub mod shard_metrics;

use crate::flux::resource::RankState;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// Histogram buckets for durations in seconds: 1 s to a week.
const SECONDS_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
    259200.0, 604800.0,
];

/// Buckets for work that takes milliseconds to seconds: a checkpoint, an
/// HTTP request (which may wait for one).
const SHORT_SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The `process_*` series (CPU, memory, file descriptors, start time),
/// read from /proc at each scrape.
static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();

/// Install the Prometheus recorder (once per process) and return its handle.
/// `None` if another recorder was installed first.
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            // A full name wins over the suffix, whatever the order here.
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(metric::FLUXPIPE_CHECKPOINT_DURATION_SECONDS.into()),
                    SHORT_SECONDS_BUCKETS,
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(metric::FLUXPIPE_HTTP_REQUEST_DURATION_SECONDS.into()),
                    SHORT_SECONDS_BUCKETS,
                )
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            describe();
            PROCESS
                .get_or_init(metrics_process::Collector::default)
                .describe();
            metrics::gauge!(
                metric::FLUXPIPE_BUILD_INFO,
                "version" => env!("CARGO_PKG_VERSION"),
                "commit" => env!("FLUXPIPE_COMMIT"),
            )
            .set(1.0);
            Some(handle)
        })
        .as_ref()
}

/// Why a sink drops records (`fluxpipe_records_dropped_total{reason}`).
pub const DROP_REASONS: [&str; 4] = ["full", "closed", "undeliverable", "unstorable"];

/// Why records of jobs are refused (`fluxpipe_jobs_refused_total{reason}`).
pub const REFUSAL_REASONS: [&str; 2] = ["max_jobs", "max_clusters"];

/// Serve every counter whose label set is known at the start at 0: a
/// counter that first appears at its first increment is invisible to
/// `increase()` and `rate()`, so a one-off loss would never trip an alert.
pub fn announce_counters(sources: &[&str], sinks: &[&str], rules: &[&str]) {
    use crate::flux::anomaly::{AnomalyKind, Stream};
    for &source in sources {
        for name in [
            metric::FLUXPIPE_EVENTS_RECEIVED_TOTAL,
            metric::FLUXPIPE_EVENTS_INVALID_TOTAL,
            metric::FLUXPIPE_SOURCE_ERRORS_TOTAL,
            metric::FLUXPIPE_DEAD_LETTERS_SUPPRESSED_TOTAL,
        ] {
            metrics::counter!(name, "source" => source.to_string()).increment(0);
        }
    }
    for &sink in sinks {
        for name in [
            metric::FLUXPIPE_RECORDS_SENT_TOTAL,
            metric::FLUXPIPE_SINK_ERRORS_TOTAL,
        ] {
            metrics::counter!(name, "sink" => sink.to_string()).increment(0);
        }
        for reason in DROP_REASONS {
            metrics::counter!(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL, "sink" => sink.to_string(), "reason" => reason)
                .increment(0);
        }
    }
    for &rule in rules {
        for status in ["firing", "resolved"] {
            metrics::counter!(metric::FLUXPIPE_ALERTS_TOTAL, "rule" => rule.to_string(), "status" => status)
                .increment(0);
        }
    }
    for stream in Stream::ALL {
        for kind in AnomalyKind::ALL {
            metrics::counter!(metric::FLUXPIPE_ANOMALIES_TOTAL, "stream" => stream.as_str(), "kind" => kind.as_str())
                .increment(0);
        }
    }
    for reason in REFUSAL_REASONS {
        metrics::counter!(metric::FLUXPIPE_JOBS_REFUSED_TOTAL, "reason" => reason).increment(0);
    }
    for why in crate::keyed::expiry::Eviction::ALL {
        metrics::counter!(metric::FLUXPIPE_JOBS_EVICTED_TOTAL, "reason" => why.as_str())
            .increment(0);
    }
    for name in [
        metric::FLUXPIPE_CHECKPOINT_FAILURES_TOTAL,
        metric::FLUXPIPE_EVENTS_DUPLICATE_TOTAL,
        metric::FLUXPIPE_FINISHED_JOB_REPEATS_TOTAL,
        metric::FLUXPIPE_TAP_RECORDS_DROPPED_TOTAL,
    ] {
        metrics::counter!(name).increment(0);
    }
}

/// Refresh the `process_*` series; called before each render of /metrics.
pub fn collect_process() {
    if let Some(collector) = PROCESS.get() {
        collector.collect();
    }
}

pub mod metric;

fn describe() {
    use metric::Kind;
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(name, kind, unit, help) in metric::ALL {
        match (kind, unit) {
            (Kind::Counter, Some(u)) => describe_counter!(name, u, help),
            (Kind::Counter, None) => describe_counter!(name, help),
            (Kind::Gauge, Some(u)) => describe_gauge!(name, u, help),
            (Kind::Gauge, None) => describe_gauge!(name, help),
            (Kind::Histogram, Some(u)) => describe_histogram!(name, u, help),
            (Kind::Histogram, None) => describe_histogram!(name, help),
        }
    }
}

/// One node as the board knows it: its state, and the node-seconds it
/// spent drained and offline, from event timestamps.
#[derive(Debug, Clone)]
struct Node {
    state: RankState,
    drained: Lost,
    offline: Lost,
}

/// Seconds lost to one condition: closed intervals plus the open one.
#[derive(Debug, Clone, Copy, Default)]
struct Lost {
    closed: f64,
    since: Option<f64>,
}

impl Lost {
    /// The condition holds (or not) as of `at`.
    fn set(&mut self, holds: bool, at: f64) {
        match (self.since, holds) {
            (None, true) => self.since = Some(at),
            (Some(since), false) => {
                self.closed += (at - since).max(0.0);
                self.since = None;
            }
            _ => {}
        }
    }

    /// The total as of `now`.
    fn total(&self, now: f64) -> f64 {
        self.closed + self.since.map_or(0.0, |s| (now - s).max(0.0))
    }
}

/// A cluster's nodes and the newest event time that changed one.
#[derive(Debug, Clone, Default)]
struct ClusterNodes {
    ranks: BTreeMap<u32, Node>,
    latest: f64,
    /// The whole instance is down (`instance-down`, until a `restart`).
    down: bool,
    /// The ranks of each queue that is not virtual (from the cluster's
    /// `[queues]` table and its R's properties).
    queues: Vec<(String, crate::flux::idset::IdSet)>,
}

/// Rank state per cluster, as the operator shards last saw it, for the
/// per-node series. Written by the shard that owns the cluster's resource
/// log; read at scrape.
#[derive(Debug, Default, Clone)]
pub struct NodeBoard(
    Arc<RwLock<BTreeMap<String, ClusterNodes>>>,
    Arc<
        RwLock<
            Option<(
                crate::keyed::alerts::Clock,
                crate::keyed::alerts::SharedEventClock,
            )>,
        >,
    >,
);

impl NodeBoard {
    /// Record a rank's new state (`None`: the rank left the instance) as of
    /// event time `at`.
    pub fn update(&self, cluster: &str, rank: u32, state: Option<&RankState>, at: f64) {
        let Ok(mut board) = self.0.write() else {
            return;
        };
        let c = board.entry(cluster.to_string()).or_default();
        // Counters never go back: an event older than one already seen
        // counts as of the newest.
        if at.is_finite() {
            c.latest = c.latest.max(at);
        }
        let at = c.latest;
        match state {
            Some(s) => {
                let node = c.ranks.entry(rank).or_insert_with(|| Node {
                    state: s.clone(),
                    drained: Lost::default(),
                    offline: Lost::default(),
                });
                node.state = s.clone();
                node.drained.set(s.drained, at);
                node.offline.set(s.online == Some(false), at);
            }
            None => {
                c.ranks.remove(&rank);
            }
        }
    }

    /// What "now" is for the node-seconds counters: the wall clock, or
    /// each cluster's event clock (its newest event of any stream), as
    /// the alert rules use. Unset (tests, tools): the cluster's newest
    /// resource event.
    pub fn set_clock(
        &self,
        clock: crate::keyed::alerts::Clock,
        shared: crate::keyed::alerts::SharedEventClock,
    ) {
        if let Ok(mut c) = self.1.write() {
            *c = Some((clock, shared));
        }
    }

    /// "Now" for a cluster's counters: never before its newest resource
    /// event.
    fn now(&self, cluster: &str, latest: f64) -> f64 {
        let clock = self.1.read().ok().and_then(|c| c.clone());
        let now = match clock {
            Some((crate::keyed::alerts::Clock::Wall, _)) => crate::keyed::alerts::wall_now(),
            Some((crate::keyed::alerts::Clock::Event, shared)) => {
                shared.now(cluster).unwrap_or(latest)
            }
            None => latest,
        };
        now.max(latest)
    }

    /// The ranks of each of a cluster's queues that is not virtual.
    pub fn set_queues(&self, cluster: &str, queues: Vec<(String, crate::flux::idset::IdSet)>) {
        if let Ok(mut board) = self.0.write() {
            board.entry(cluster.to_string()).or_default().queues = queues;
        }
    }

    /// Whether the cluster's whole instance is down.
    pub fn set_instance_down(&self, cluster: &str, down: bool) {
        if let Ok(mut board) = self.0.write() {
            board.entry(cluster.to_string()).or_default().down = down;
        }
    }

    /// The clusters whose whole instance is down now.
    pub fn down_clusters(&self) -> Vec<String> {
        self.0.read().map_or_else(
            |_| Vec::new(),
            |board| {
                board
                    .iter()
                    .filter(|(_, c)| c.down)
                    .map(|(name, _)| name.clone())
                    .collect()
            },
        )
    }

    /// Forget a cluster's nodes (its state moved to another member).
    pub fn forget(&self, cluster: &str) {
        if let Ok(mut board) = self.0.write() {
            board.remove(cluster);
        }
    }

    /// The node series in the Prometheus text format: the per-cluster
    /// counts, and with `per_node` the series of each node.
    pub fn render(&self, per_node: bool) -> String {
        let Ok(board) = self.0.read() else {
            return String::new();
        };
        let mut out = String::new();
        metric::header(&mut out, metric::FLUX_INSTANCE_UP);
        for (cluster, c) in board.iter() {
            let _ = writeln!(
                out,
                "flux_instance_up{{flux_cluster=\"{}\"}} {}",
                escape(cluster),
                u8::from(!c.down)
            );
        }
        use crate::flux::resource::NodeCount;
        let totals: [(&str, Option<NodeCount>); 7] = [
            (metric::FLUX_NODES, None),
            (metric::FLUX_NODES_ONLINE, Some(NodeCount::Online)),
            (metric::FLUX_NODES_OFFLINE, Some(NodeCount::Offline)),
            (
                metric::FLUX_NODES_LIVENESS_UNKNOWN,
                Some(NodeCount::Unknown),
            ),
            (metric::FLUX_NODES_DRAINED, Some(NodeCount::Drained)),
            (metric::FLUX_NODES_DRAINING, Some(NodeCount::Draining)),
            (metric::FLUX_NODES_TORPID, Some(NodeCount::Torpid)),
        ];
        for (name, count) in totals {
            metric::header(&mut out, name);
            for (cluster, c) in board.iter() {
                let n = c
                    .ranks
                    .values()
                    .filter(|n| count.is_none_or(|k| k.holds(&n.state)))
                    .count();
                let _ = writeln!(out, "{name}{{flux_cluster=\"{}\"}} {n}", escape(cluster));
            }
        }
        metric::header(&mut out, metric::FLUX_QUEUE_NODES);
        for (cluster, c) in board.iter() {
            for (queue, ranks) in &c.queues {
                let states = std::iter::once(("all", None))
                    .chain(NodeCount::ALL.into_iter().map(|k| (k.as_str(), Some(k))));
                for (state, count) in states {
                    let n = ranks
                        .iter()
                        .filter_map(|r| c.ranks.get(&r))
                        .filter(|n| count.is_none_or(|k| k.holds(&n.state)))
                        .count();
                    let _ = writeln!(
                        out,
                        "flux_queue_nodes{{flux_cluster=\"{}\",queue=\"{}\",state=\"{state}\"}} {n}",
                        escape(cluster),
                        escape(queue)
                    );
                }
            }
        }
        if !per_node {
            return out;
        }
        let per_node = [metric::FLUX_NODE_ONLINE, metric::FLUX_NODE_TORPID];
        for (i, name) in per_node.iter().enumerate() {
            metric::header(&mut out, name);
            for (cluster, c) in board.iter() {
                for r in c.ranks.values().map(|n| &n.state) {
                    // No series for a node whose liveness is unknown.
                    let Some(v) = (if i == 0 { r.online } else { Some(r.torpid) }) else {
                        continue;
                    };
                    let _ = writeln!(out, "{name}{{{}}} {}", node_labels(cluster, r), u8::from(v));
                }
            }
        }
        metric::header(&mut out, metric::FLUX_NODE_DRAIN_INFO);
        for (cluster, c) in board.iter() {
            for r in c.ranks.values().map(|n| &n.state).filter(|r| r.drained) {
                let _ = writeln!(
                    out,
                    "flux_node_drain_info{{{},reason=\"{}\",state=\"{}\"}} 1",
                    node_labels(cluster, r),
                    escape(r.drain_reason.as_deref().unwrap_or("")),
                    if r.draining { "draining" } else { "drained" }
                );
            }
        }
        metric::header(&mut out, metric::FLUX_NODE_DRAIN_TIMESTAMP_SECONDS);
        for (cluster, c) in board.iter() {
            for r in c.ranks.values().map(|n| &n.state).filter(|r| r.drained) {
                if let Some(ts) = r.drain_timestamp {
                    let _ = writeln!(
                        out,
                        "flux_node_drain_timestamp_seconds{{{}}} {ts}",
                        node_labels(cluster, r)
                    );
                }
            }
        }
        type LostSeries = (&'static str, fn(&Node) -> Lost);
        let lost: [LostSeries; 2] = [
            (metric::FLUX_NODE_DRAINED_SECONDS_TOTAL, |n| n.drained),
            (metric::FLUX_NODE_OFFLINE_SECONDS_TOTAL, |n| n.offline),
        ];
        for (name, get) in lost {
            metric::header(&mut out, name);
            for (cluster, c) in board.iter() {
                let now = self.now(cluster, c.latest);
                for n in c.ranks.values() {
                    let _ = writeln!(
                        out,
                        "{name}{{{}}} {}",
                        node_labels(cluster, &n.state),
                        get(n).total(now)
                    );
                }
            }
        }
        out
    }
}

/// A rank the instance has not named yet is `node="rankN"`, as in alerts,
/// the query API and the status page.
fn node_labels(cluster: &str, r: &RankState) -> String {
    format!(
        "flux_cluster=\"{}\",node=\"{}\",rank=\"{}\"",
        escape(cluster),
        escape(&r.name()),
        r.rank
    )
}

/// Escape a label value (backslash, quote, newline), as the text format says.
pub(crate) fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The oldest state-entry time of the active jobs per cluster and state,
/// as each shard last published it, for
/// `flux_job_state_oldest_entry_timestamp_seconds`. The minimum over shards
/// is taken at scrape; a (cluster, state) with no job has no series.
#[derive(Debug, Default, Clone)]
pub struct StateAges(Arc<RwLock<AgesInner>>);

#[derive(Debug, Default)]
struct AgesInner {
    shards: usize,
    /// (cluster, state, shard) → oldest entry time.
    oldest: BTreeMap<(String, &'static str, usize), f64>,
}

impl StateAges {
    /// A number for a new shard.
    pub fn register(&self) -> usize {
        match self.0.write() {
            Ok(mut a) => {
                a.shards += 1;
                a.shards - 1
            }
            Err(_) => 0,
        }
    }

    /// A shard's oldest entry time for (cluster, state); `None`: it has no
    /// job in that state.
    pub fn publish(&self, shard: usize, cluster: &str, state: &'static str, oldest: Option<f64>) {
        let Ok(mut a) = self.0.write() else {
            return;
        };
        let key = (cluster.to_string(), state, shard);
        match oldest {
            Some(t) => {
                a.oldest.insert(key, t);
            }
            None => {
                a.oldest.remove(&key);
            }
        }
    }

    /// The series in the Prometheus text format.
    pub fn render(&self) -> String {
        let Ok(a) = self.0.read() else {
            return String::new();
        };
        let mut min: BTreeMap<(&str, &str), f64> = BTreeMap::new();
        for ((cluster, state, _), t) in &a.oldest {
            let e = min.entry((cluster.as_str(), state)).or_insert(*t);
            *e = e.min(*t);
        }
        let name = metric::FLUX_JOB_STATE_OLDEST_ENTRY_TIMESTAMP_SECONDS;
        let mut out = String::new();
        metric::header(&mut out, name);
        for ((cluster, state), t) in min {
            let _ = writeln!(
                out,
                "{name}{{flux_cluster=\"{}\",state=\"{state}\"}} {t}",
                escape(cluster)
            );
        }
        out
    }
}

/// Active jobs per cluster, user and state, for `flux_jobs_by_user`: off
/// unless a `prometheus` sink sets `per_user_jobs` (a series per user).
/// The shards count into it; a series whose count falls to 0 is deleted.
#[derive(Debug, Default, Clone)]
pub struct UserJobs(Option<Arc<Mutex<UserCounts>>>);

/// (cluster, user id, state) → active jobs.
type UserCounts = BTreeMap<(String, i64, &'static str), i64>;

impl UserJobs {
    pub fn enabled() -> Self {
        UserJobs(Some(Arc::default()))
    }

    /// `delta` jobs of `userid` entered (or left, negative) `state`.
    pub fn add(&self, cluster: &str, userid: Option<i64>, state: &'static str, delta: i64) {
        let (Some(counts), Some(userid)) = (&self.0, userid) else {
            return;
        };
        let Ok(mut counts) = counts.lock() else {
            return;
        };
        let key = (cluster.to_string(), userid, state);
        let n = counts.entry(key.clone()).or_insert(0);
        *n += delta;
        if *n <= 0 {
            counts.remove(&key);
        }
    }

    /// The series in the Prometheus text format (nothing when off).
    pub fn render(&self) -> String {
        let Some(counts) = &self.0 else {
            return String::new();
        };
        let Ok(counts) = counts.lock() else {
            return String::new();
        };
        let name = metric::FLUX_JOBS_BY_USER;
        let mut out = String::new();
        metric::header(&mut out, name);
        for ((cluster, userid, state), n) in counts.iter() {
            let _ = writeln!(
                out,
                "{name}{{flux_cluster=\"{}\",userid=\"{userid}\",state=\"{state}\"}} {n}",
                escape(cluster)
            );
        }
        out
    }
}

/// Readiness for `/readyz`: the pipeline is running and not shutting down,
/// and no component has said it cannot do its work (a Kafka source that
/// reaches no broker).
#[derive(Debug, Default, Clone)]
pub struct Readiness {
    running: Arc<AtomicBool>,
    /// Component → why it is not ready.
    blocked: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.running.store(ready, Ordering::Relaxed);
    }

    /// `who` cannot do its work, for `why`, until [`Readiness::clear`].
    pub fn block(&self, who: &str, why: String) {
        if let Ok(mut b) = self.blocked.lock() {
            b.insert(who.to_string(), why);
        }
    }

    pub fn clear(&self, who: &str) {
        if let Ok(mut b) = self.blocked.lock() {
            b.remove(who);
        }
    }

    pub fn get(&self) -> bool {
        self.reasons().is_empty()
    }

    /// Why not ready, one line each; empty when ready.
    pub fn reasons(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.running.load(Ordering::Relaxed) {
            out.push("the pipeline is not running (starting or stopping)".to_string());
        }
        if let Ok(b) = self.blocked.lock() {
            out.extend(b.iter().map(|(who, why)| format!("{who}: {why}")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One entry per name, each as Prometheus names it: counters end in
    /// `_total`, others do not.
    #[test]
    fn the_catalog_names_each_metric_once_and_well() {
        let mut seen = std::collections::HashSet::new();
        for &(name, kind, _, help) in metric::ALL {
            assert!(seen.insert(name), "{name} twice");
            assert!(
                name.starts_with("flux_") || name.starts_with("fluxpipe_"),
                "{name}"
            );
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name}"
            );
            assert_eq!(
                kind == metric::Kind::Counter,
                name.ends_with("_total"),
                "{name}"
            );
            assert!(help.ends_with('.'), "{name}: {help}");
        }
    }

    /// Every series fluxpipe serves is in the manual (docs/metrics.md).
    #[test]
    fn every_metric_is_in_the_manual() {
        let manual = include_str!("../../docs/metrics.md");
        let names = metric::ALL
            .iter()
            .map(|m| m.0)
            .chain(metric::RENDERED.iter().map(|m| m.0));
        let missing: Vec<&str> = names
            .filter(|n| !manual.contains(&format!("`{n}")))
            .collect();
        assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
        let mut seen = std::collections::HashSet::new();
        for &(name, _, help) in metric::RENDERED {
            assert!(seen.insert(name), "{name} twice");
            assert!(metric::ALL.iter().all(|m| m.0 != name), "{name} in both");
            assert!(help.ends_with('.'), "{name}: {help}");
        }
        let mut out = String::new();
        metric::header(&mut out, metric::FLUX_NODE_OFFLINE_SECONDS_TOTAL);
        assert!(
            out.ends_with("# TYPE flux_node_offline_seconds_total counter\n"),
            "{out}"
        );
    }

    /// Metrics are recorded by the catalog's names, never a literal (whose
    /// metric would have no help text, and whose name could drift).
    #[test]
    fn no_metric_is_named_by_a_literal() {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        for entry in walkdir::WalkDir::new(src)
            .into_iter()
            .filter_map(Result::ok)
        {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            for kind in ["counter", "gauge", "histogram"] {
                let call = format!("{kind}!(");
                for (at, _) in text.match_indices(&call) {
                    let rest = text[at + call.len()..].trim_start();
                    assert!(
                        !rest.starts_with('"'),
                        "{}: a metric named by a literal: {}",
                        path.display(),
                        &rest[..rest.len().min(60)]
                    );
                }
            }
        }
    }

    #[test]
    fn node_series_follow_the_current_state() {
        let board = NodeBoard::default();
        let mut r = RankState::new(3);
        r.hostname = Some("node3".into());
        r.online = Some(true);
        r.drained = true;
        r.drain_reason = Some("bad \"DIMM\"".into());
        r.drain_timestamp = Some(1700000000.5);
        board.update("picl", 3, Some(&r), 1700000000.5);
        let text = board.render(true);
        assert!(text.contains(
            "flux_node_drain_info{flux_cluster=\"picl\",node=\"node3\",rank=\"3\",reason=\"bad \\\"DIMM\\\"\",state=\"drained\"} 1"
        ), "{text}");
        assert!(text.contains("flux_nodes_drained{flux_cluster=\"picl\"} 1"));
        assert!(text.contains("flux_nodes_draining{flux_cluster=\"picl\"} 0"));
        // a job still runs on it: draining, not drained (flux resource status)
        r.draining = true;
        board.update("picl", 3, Some(&r), 1700000000.5);
        let text = board.render(true);
        assert!(
            text.contains("flux_nodes_drained{flux_cluster=\"picl\"} 0"),
            "{text}"
        );
        assert!(text.contains("flux_nodes_draining{flux_cluster=\"picl\"} 1"));
        assert!(text.contains(",state=\"draining\"} 1"));
        r.draining = false;
        // a rank nothing said is up or down: no online series, counted apart
        board.update("picl", 5, Some(&RankState::new(5)), 1700000000.5);
        let text = board.render(true);
        assert!(
            text.contains("flux_nodes_liveness_unknown{flux_cluster=\"picl\"} 1"),
            "{text}"
        );
        assert!(text.contains("flux_nodes_offline{flux_cluster=\"picl\"} 0"));
        assert!(
            !text.contains("flux_node_online{flux_cluster=\"picl\",node=\"rank5\",rank=\"5\"}")
        );
        assert!(
            text.contains("flux_node_torpid{flux_cluster=\"picl\",node=\"rank5\",rank=\"5\"} 0")
        );
        board.update("picl", 5, None, 1700000000.5);
        assert!(text.contains("flux_instance_up{flux_cluster=\"picl\"} 1"));
        board.set_instance_down("picl", true);
        assert!(
            board
                .render(true)
                .contains("flux_instance_up{flux_cluster=\"picl\"} 0")
        );
        board.set_instance_down("picl", false);
        assert!(text.contains("flux_node_drain_timestamp_seconds{flux_cluster=\"picl\",node=\"node3\",rank=\"3\"} 1700000000.5"));
        // undrained: the drain series disappear, the count goes to 0
        r.drained = false;
        r.drain_reason = None;
        r.drain_timestamp = None;
        board.update("picl", 3, Some(&r), 1700000100.5);
        let text = board.render(true);
        assert!(text.contains(
            "flux_node_drained_seconds_total{flux_cluster=\"picl\",node=\"node3\",rank=\"3\"} 100\n"
        ), "{text}");
        // offline from t+200: the open interval counts up to the newest event
        r.online = Some(false);
        board.update("picl", 3, Some(&r), 1700000200.5);
        let mut r4 = RankState::new(4);
        r4.online = Some(true);
        board.update("picl", 4, Some(&r4), 1700000260.5);
        let text = board.render(true);
        assert!(text.contains(
            "flux_node_offline_seconds_total{flux_cluster=\"picl\",node=\"node3\",rank=\"3\"} 60\n"
        ), "{text}");
        assert!(!text.contains("flux_node_drain_info{"));
        assert!(text.contains("flux_nodes_drained{flux_cluster=\"picl\"} 0"));
        assert!(
            text.contains("flux_node_online{flux_cluster=\"picl\",node=\"node3\",rank=\"3\"} 0")
        );
    }

    #[test]
    fn node_seconds_count_up_to_the_clusters_clock() {
        let board = NodeBoard::default();
        let mut r = RankState::new(1);
        r.hostname = Some("n1".into());
        r.drained = true;
        board.update("c", 1, Some(&r), 1000.0);
        let series = |text: &str| {
            text.lines()
                .find(|l| l.starts_with("flux_node_drained_seconds_total{"))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        };
        // Without a clock: up to the newest resource event.
        assert_eq!(series(&board.render(true)), Some(0.0));
        // The event clock: job events of the cluster moved it on.
        let shared = crate::keyed::alerts::SharedEventClock::default();
        let mut local = crate::keyed::alerts::EventClock::default();
        local.advance("c", 1060.0);
        shared.sync(&mut local);
        board.set_clock(crate::keyed::alerts::Clock::Event, shared.clone());
        assert_eq!(series(&board.render(true)), Some(60.0));
        // The wall clock: up to now.
        board.set_clock(crate::keyed::alerts::Clock::Wall, shared);
        assert!(
            series(&board.render(true)).unwrap() > crate::keyed::alerts::wall_now() - 1000.0 - 5.0
        );
    }

    #[test]
    fn oldest_entry_is_the_minimum_over_shards_and_vanishes_when_empty() {
        let ages = StateAges::default();
        let (a, b) = (ages.register(), ages.register());
        ages.publish(a, "c", "SCHED", Some(200.0));
        ages.publish(b, "c", "SCHED", Some(100.5));
        ages.publish(b, "c", "RUN", Some(300.0));
        let text = ages.render();
        assert!(text.contains(
            "flux_job_state_oldest_entry_timestamp_seconds{flux_cluster=\"c\",state=\"SCHED\"} 100.5\n"
        ), "{text}");
        ages.publish(b, "c", "SCHED", None);
        ages.publish(b, "c", "RUN", None);
        let text = ages.render();
        assert!(text.contains("state=\"SCHED\"} 200\n"), "{text}");
        assert!(!text.contains("RUN"), "{text}");
    }
}
