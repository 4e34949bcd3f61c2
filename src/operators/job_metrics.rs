//! The job series of one cluster as handles, registered once per cluster
//! and label set: the `metrics` macros build, hash and look up a labelled
//! key at every call, which on the per-record path cost more than the
//! state machine itself. A series is registered on first use, as the
//! macros would, except those exported with 0 from the start.

use crate::flux::job::{JobResult, JobState};
use metrics::{Counter, Gauge, Histogram};
use std::sync::OnceLock;

const STATES: usize = JobState::ALL.len();
const RESULTS: [JobResult; 4] = [
    JobResult::Completed,
    JobResult::Failed,
    JobResult::Canceled,
    JobResult::Timeout,
];

pub struct ClusterMetrics {
    cluster: String,
    /// `flux_jobs` per active state (none for INACTIVE).
    jobs: [Option<Gauge>; STATES],
    /// `flux_job_transitions_total` per (from, to).
    transitions: [[OnceLock<Counter>; STATES]; STATES],
    /// `flux_job_state_seconds` per state left.
    state_seconds: [OnceLock<Histogram>; STATES],
    queue_wait: OnceLock<Histogram>,
    run: OnceLock<Histogram>,
    /// `flux_jobs_inactive_total` per result.
    inactive: [Counter; RESULTS.len()],
}

impl ClusterMetrics {
    /// The cluster's series, with every state and result exported as 0.
    pub fn new(cluster: &str) -> Self {
        let c = cluster.to_string();
        let jobs = JobState::ALL.map(|state| {
            (state != JobState::Inactive).then(|| {
                let g = metrics::gauge!("flux_jobs", "flux_cluster" => c.clone(), "state" => state.as_str());
                g.increment(0.0);
                g
            })
        });
        let inactive = RESULTS.map(|r| {
            let counter = metrics::counter!("flux_jobs_inactive_total", "flux_cluster" => c.clone(), "result" => r.as_str());
            counter.increment(0);
            counter
        });
        ClusterMetrics {
            cluster: c,
            jobs,
            transitions: Default::default(),
            state_seconds: Default::default(),
            queue_wait: OnceLock::new(),
            run: OnceLock::new(),
            inactive,
        }
    }

    /// `delta` active jobs into (or out of) `state`.
    pub fn count(&self, state: JobState, delta: i64) {
        if let Some(g) = &self.jobs[state.index()] {
            g.increment(delta as f64);
        }
    }

    pub fn transition(&self, from: JobState, to: JobState) {
        let c = &self.cluster;
        self.transitions[from.index()][to.index()]
            .get_or_init(|| metrics::counter!("flux_job_transitions_total", "flux_cluster" => c.clone(), "from" => from.as_str(), "to" => to.as_str()))
            .increment(1);
    }

    /// Seconds spent in `state`, left now.
    pub fn time_in(&self, state: JobState, secs: f64) {
        let c = &self.cluster;
        self.state_seconds[state.index()]
            .get_or_init(|| metrics::histogram!("flux_job_state_seconds", "flux_cluster" => c.clone(), "state" => state.as_str()))
            .record(secs);
    }

    /// Submit to RUN.
    pub fn queue_wait(&self, secs: f64) {
        let c = &self.cluster;
        self.queue_wait
            .get_or_init(
                || metrics::histogram!("flux_job_queue_wait_seconds", "flux_cluster" => c.clone()),
            )
            .record(secs);
    }

    /// RUN to CLEANUP.
    pub fn run(&self, secs: f64) {
        let c = &self.cluster;
        self.run
            .get_or_init(
                || metrics::histogram!("flux_job_run_seconds", "flux_cluster" => c.clone()),
            )
            .record(secs);
    }

    pub fn ended(&self, result: JobResult) {
        if let Some(i) = RESULTS.iter().position(|r| *r == result) {
            self.inactive[i].increment(1);
        }
    }
}
