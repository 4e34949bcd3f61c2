//! The job series of one cluster as handles, registered once per cluster
//! and label set: the `metrics` macros build, hash and look up a labelled
//! key at every call, which on the per-record path cost more than the
//! state machine itself. A series is registered on first use, as the
//! macros would, except those exported with 0 from the start.

use crate::flux::job::{JobResult, JobState};
use crate::telemetry::metric;
use compact_str::CompactString;
use metrics::{Counter, Gauge, Histogram};
use std::sync::OnceLock;

const STATES: usize = JobState::ALL.len();
const RESULTS: [JobResult; 4] = [
    JobResult::Completed,
    JobResult::Failed,
    JobResult::Canceled,
    JobResult::Timeout,
];

/// The most queues one cluster's series are kept apart for: queues are
/// few (a site configures them), but the label comes from input. The
/// queues beyond share the label value `other`.
pub const MAX_QUEUES: usize = 32;

/// The series of one queue of a cluster (`queue` label; `""`, the same
/// as no label, for jobs of no queue).
struct QueueMetrics {
    name: CompactString,
    /// `flux_jobs` per active state (none for INACTIVE).
    jobs: [Option<Gauge>; STATES],
    queue_wait: OnceLock<Histogram>,
    run: OnceLock<Histogram>,
    /// `flux_jobs_inactive_total` per result.
    inactive: [Counter; RESULTS.len()],
}

/// `flux_cluster`, and `queue` unless none.
fn queue_labels(cluster: &str, queue: &str) -> Vec<metrics::Label> {
    let mut l = vec![metrics::Label::new("flux_cluster", cluster.to_string())];
    if !queue.is_empty() {
        l.push(metrics::Label::new("queue", queue.to_string()));
    }
    l
}

impl QueueMetrics {
    fn labels(&self, cluster: &str) -> Vec<metrics::Label> {
        queue_labels(cluster, &self.name)
    }

    /// The queue's series, with every state and result exported as 0.
    /// Jobs of no queue: no `queue` label (as Prometheus reads an empty
    /// one), so a site without queues keeps the series it had.
    fn new(cluster: &str, queue: &str) -> Self {
        let labels = |(k, v): (&'static str, &'static str)| {
            let mut l = queue_labels(cluster, queue);
            l.push(metrics::Label::new(k, v));
            l
        };
        let jobs = JobState::ALL.map(|state| {
            (state != JobState::Inactive).then(|| {
                let g = metrics::gauge!(metric::FLUX_JOBS, labels(("state", state.as_str())));
                g.increment(0.0);
                g
            })
        });
        let inactive = RESULTS.map(|r| {
            let counter = metrics::counter!(
                metric::FLUX_JOBS_INACTIVE_TOTAL,
                labels(("result", r.as_str()))
            );
            counter.increment(0);
            counter
        });
        QueueMetrics {
            name: queue.into(),
            jobs,
            queue_wait: OnceLock::new(),
            run: OnceLock::new(),
            inactive,
        }
    }
}

/// The series of `queue` among a cluster's, made on first sight.
fn queue_of<'q>(
    queues: &'q mut Vec<QueueMetrics>,
    cluster: &str,
    queue: Option<&str>,
) -> &'q QueueMetrics {
    let name = queue.unwrap_or("");
    let i = match queues.iter().position(|q| q.name == name) {
        Some(i) => i,
        None if queues.len() < MAX_QUEUES => {
            queues.push(QueueMetrics::new(cluster, name));
            queues.len() - 1
        }
        None => match queues.iter().position(|q| q.name == "other") {
            Some(i) => i,
            None => {
                tracing::warn!(
                    cluster,
                    max = MAX_QUEUES,
                    "more queues than the metrics keep apart: the rest are counted as queue=\"other\""
                );
                queues.push(QueueMetrics::new(cluster, "other"));
                queues.len() - 1
            }
        },
    };
    &queues[i]
}

pub struct ClusterMetrics {
    cluster: String,
    /// Per queue, in the order first seen (a handful: searched in order).
    queues: Vec<QueueMetrics>,
    /// `flux_job_transitions_total` per (from, to).
    transitions: [[OnceLock<Counter>; STATES]; STATES],
    /// `flux_job_state_seconds` per state left.
    state_seconds: [OnceLock<Histogram>; STATES],
}

impl ClusterMetrics {
    /// The cluster's series, with every state and result of jobs of no
    /// queue exported as 0.
    pub fn new(cluster: &str) -> Self {
        ClusterMetrics {
            cluster: cluster.to_string(),
            queues: vec![QueueMetrics::new(cluster, "")],
            transitions: Default::default(),
            state_seconds: Default::default(),
        }
    }

    /// The series of `queue` (`None`: no queue), made on first sight.
    fn queue(&mut self, queue: Option<&str>) -> &QueueMetrics {
        queue_of(&mut self.queues, &self.cluster, queue)
    }

    /// `delta` active jobs of `queue` into (or out of) `state`.
    pub fn count(&mut self, queue: Option<&str>, state: JobState, delta: i64) {
        if let Some(g) = &self.queue(queue).jobs[state.index()] {
            g.increment(delta as f64);
        }
    }

    pub fn transition(&self, from: JobState, to: JobState) {
        let c = &self.cluster;
        self.transitions[from.index()][to.index()]
            .get_or_init(|| metrics::counter!(metric::FLUX_JOB_TRANSITIONS_TOTAL, "flux_cluster" => c.clone(), "from" => from.as_str(), "to" => to.as_str()))
            .increment(1);
    }

    /// Seconds spent in `state`, left now.
    pub fn time_in(&self, state: JobState, secs: f64) {
        let c = &self.cluster;
        self.state_seconds[state.index()]
            .get_or_init(|| metrics::histogram!(metric::FLUX_JOB_STATE_SECONDS, "flux_cluster" => c.clone(), "state" => state.as_str()))
            .record(secs);
    }

    /// Submit to RUN.
    pub fn queue_wait(&mut self, queue: Option<&str>, secs: f64) {
        let c = &self.cluster;
        let q = queue_of(&mut self.queues, c, queue);
        q.queue_wait
            .get_or_init(|| metrics::histogram!(metric::FLUX_JOB_QUEUE_WAIT_SECONDS, q.labels(c)))
            .record(secs);
    }

    /// RUN to CLEANUP.
    pub fn run(&mut self, queue: Option<&str>, secs: f64) {
        let c = &self.cluster;
        let q = queue_of(&mut self.queues, c, queue);
        q.run
            .get_or_init(|| metrics::histogram!(metric::FLUX_JOB_RUN_SECONDS, q.labels(c)))
            .record(secs);
    }

    pub fn ended(&mut self, queue: Option<&str>, result: JobResult) {
        if let Some(i) = RESULTS.iter().position(|r| *r == result) {
            self.queue(queue).inactive[i].increment(1);
        }
    }
}
