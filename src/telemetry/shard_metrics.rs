//! The series one shard keeps up to date: active jobs per cluster, state
//! and user, the oldest entry into each state, transitions, queue wait and
//! run times, results, the jobs tracked, and the per-node board. Fed from
//! what the processor reports a record did; the shard owns one.

use super::ages::OldestEntries;
use super::job_metrics::ClusterMetrics;
use crate::decode::{Body, EventStream, Record};
use crate::flux::job::{Job, JobState};
use crate::flux::resource::ResourceState;
use crate::keyed::alerts::engine::{AlertEvent, Status};
use crate::keyed::alerts::rule::Rule;
use crate::keyed::processor::{Processed, QueueBefore};
use crate::keyed::state::{JobEntry, State};
use crate::keyed::state::{KeyedAnomaly, KeyedTransition};
use crate::telemetry::metric;
use crate::telemetry::{NodeBoard, StateAges, UserJobs};
use foldhash::HashMap;
use std::sync::Arc;

pub struct ShardMetrics {
    /// This shard's share of the `fluxpipe_jobs_tracked` gauge.
    reported: usize,
    /// Finished jobs remembered, as last added to the shared gauge.
    finished_reported: usize,
    /// The cluster whose series [`ShardMetrics::register_cluster`] saw last.
    last_seen: Option<Arc<str>>,
    /// Per-node state for the metrics endpoint.
    pub nodes: NodeBoard,
    /// State-entry times of this shard's active jobs.
    pub ages: OldestEntries,
    /// The job series of each cluster seen (every label value exported,
    /// 0 until it happens).
    series: HashMap<String, ClusterMetrics>,
    /// Active jobs per user, when exported.
    pub users: UserJobs,
}

impl ShardMetrics {
    pub fn new(nodes: NodeBoard, ages: StateAges) -> Self {
        ShardMetrics {
            reported: 0,
            finished_reported: 0,
            last_seen: None,
            nodes,
            ages: OldestEntries::new(ages),
            series: HashMap::default(),
            users: UserJobs::default(),
        }
    }

    /// Count `delta` active jobs of a user and queue into or out of
    /// `state`.
    pub fn count_active(
        &mut self,
        cluster: &str,
        queue: Option<&str>,
        state: JobState,
        userid: Option<i64>,
        delta: i64,
    ) {
        if let Some(m) = self.series.get_mut(cluster) {
            m.count(queue, state, delta);
        }
        self.users.add(cluster, userid, state.as_str(), delta);
    }

    /// Count an active job into (`delta` 1) or out of (-1) the job gauges
    /// and the state-entry ages, in the state it is in.
    pub fn count_job(&mut self, cluster: &str, job: &Job, delta: i64) {
        self.count_active(cluster, job.queue(), job.state, job.userid(), delta);
        if delta > 0 {
            self.ages.add(cluster, job.state, job.t_state());
        } else {
            self.ages.remove(cluster, job.state, job.t_state());
        }
    }

    /// Every known label value of the job series is exported, with 0 until
    /// it happens; so is each job rule's stuck-jobs gauge.
    pub fn register_cluster<'r>(
        &mut self,
        cluster: &Arc<str>,
        job_rules: impl Iterator<Item = &'r Rule>,
    ) {
        // The cluster of the record before, most of the time: known.
        if self
            .last_seen
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, cluster))
        {
            return;
        }
        if self.series.contains_key(&**cluster) {
            self.last_seen = Some(cluster.clone());
            return;
        }
        self.series
            .insert(cluster.to_string(), ClusterMetrics::new(cluster));
        let c = cluster.to_string();
        for rule in job_rules {
            Self::stuck(&c, rule, 0.0);
        }
    }

    /// Jobs for which a job rule fires: `delta` more (or fewer).
    pub fn stuck(cluster: &str, rule: &Rule, delta: f64) {
        metrics::gauge!(metric::FLUX_JOBS_STUCK, "flux_cluster" => cluster.to_string(), "rule" => rule.name.clone())
            .increment(delta);
    }

    /// An alert fired or resolved: the alerts counted, and the stuck jobs
    /// of a job rule.
    pub fn alerted(rule: &Rule, a: &AlertEvent) {
        if rule.kind.is_job() {
            let delta = match a.status {
                Status::Firing => 1.0,
                Status::Resolved => -1.0,
            };
            Self::stuck(a.subject.cluster(), rule, delta);
        }
        metrics::counter!(metric::FLUXPIPE_ALERTS_TOTAL, "rule" => rule.name.clone(), "status" => a.status.as_str()).increment(1);
    }

    /// Anomalies found, by stream and kind.
    pub fn anomalies(anomalies: &[KeyedAnomaly]) {
        for a in anomalies {
            metrics::counter!(
                metric::FLUXPIPE_ANOMALIES_TOTAL,
                "stream" => a.anomaly.stream.as_str(),
                "kind" => a.anomaly.kind.as_str()
            )
            .increment(1);
        }
    }

    /// What a record applied did to the job and node series; `job`: the
    /// record's job as it stands now.
    pub fn applied(
        &mut self,
        cluster: &str,
        stream: EventStream,
        done: &Processed,
        exception: Option<(String, i64)>,
        job: Option<&JobEntry>,
        state: &State,
    ) {
        let fx = &done.fx;
        let key = done.key.as_ref();
        let event = fx.event.as_ref().map(|(n, _)| n.as_str());
        if key.is_none()
            && let Some(res) = state.resources.get(cluster)
        {
            if event.is_some_and(|n| matches!(n, "instance-down" | "restart" | "resource-init")) {
                self.nodes
                    .set_instance_down(cluster, res.down_since().is_some());
            }
            // A queue table, or the instance's ranks and properties (R, a
            // restart), changed: the queues' nodes as they are now.
            if stream == EventStream::Resource
                && !fx.duplicate
                && event.is_none_or(|n| matches!(n, "queue-config" | "restart" | "resource-init"))
            {
                self.nodes.set_queues(cluster, res.queue_slices());
            }
        }
        if fx.duplicate {
            metrics::counter!(metric::FLUXPIPE_EVENTS_DUPLICATE_TOTAL).increment(1);
        } else {
            if let Some(entry) = job {
                self.job_changed(
                    cluster,
                    &entry.job,
                    done.before,
                    &done.queue_before,
                    &fx.transitions,
                );
            }
            if let Some((kind, severity)) = exception {
                metrics::counter!(metric::FLUX_JOB_EXCEPTIONS_TOTAL, "flux_cluster" => cluster.to_string(), "type" => kind, "severity" => severity.to_string()).increment(1);
            }
            if let Some(name) = event.filter(|_| stream == EventStream::Resource) {
                metrics::counter!(metric::FLUX_RESOURCE_EVENTS_TOTAL, "flux_cluster" => cluster.to_string(), "event" => name.to_string()).increment(1);
            }
        }
        let at = fx.event.as_ref().map_or(f64::NAN, |(_, ts)| *ts);
        for (cluster, change) in &fx.rank_changes {
            self.nodes
                .update(cluster, change.rank, change.after.as_ref(), at);
        }
    }

    /// A cluster's nodes as restored: the instance up or down, the
    /// queues' nodes, and each rank.
    pub fn restored_nodes(&mut self, cluster: &str, res: &ResourceState) {
        self.nodes
            .set_instance_down(cluster, res.down_since().is_some());
        self.nodes.set_queues(cluster, res.queue_slices());
        for rank in res.ranks() {
            let at = rank.drain_timestamp.or(res.last_timestamp());
            self.nodes
                .update(cluster, rank.rank, Some(rank), at.unwrap_or(f64::NAN));
        }
    }

    /// Shards share one gauge: each adds the change in its own count of
    /// jobs held, `now`.
    pub fn report_tracked(&mut self, now: usize) {
        report_share(metric::FLUXPIPE_JOBS_TRACKED, &mut self.reported, now);
    }

    /// As [`ShardMetrics::report_tracked`], for the finished jobs
    /// remembered.
    pub fn report_finished(&mut self, now: usize) {
        report_share(
            metric::FLUXPIPE_FINISHED_JOBS_REMEMBERED,
            &mut self.finished_reported,
            now,
        );
    }

    /// A record changed `job` (as it is now; `before`: its state and since
    /// when, if it was counted, in the queue `queue_before` says): active
    /// jobs per state and queue, transitions, results and the time spent
    /// in each state. The queue is read only when a count moves: most
    /// records move none, and the job's texts are another allocation.
    pub fn job_changed(
        &mut self,
        cluster: &str,
        job: &Job,
        before: Option<(JobState, Option<f64>)>,
        queue_before: &QueueBefore,
        transitions: &[KeyedTransition],
    ) {
        let counted = job.submitted && !job.invalidated;
        let moved = matches!(queue_before, QueueBefore::Was(_));
        if before.is_none() || !counted || moved || !transitions.is_empty() {
            self.job_counts_changed(cluster, job, before, queue_before, transitions);
        }
    }

    /// [`ShardMetrics::job_changed`] for a record that may move a count.
    fn job_counts_changed(
        &mut self,
        cluster: &str,
        job: &Job,
        before: Option<(JobState, Option<f64>)>,
        queue_before: &QueueBefore,
        transitions: &[KeyedTransition],
    ) {
        let counted = job.submitted && !job.invalidated;
        let queue = job.queue();
        let queue_before = queue_before.or_now(queue);
        match (before, counted) {
            // A new job (or one whose submit came after other events).
            (None, true) if job.state != JobState::Inactive => {
                self.count_active(cluster, queue, job.state, job.userid(), 1);
                self.ages.add(cluster, job.state, job.t_state());
            }
            // Invalidated: flux-core removes it.
            (Some((state, entered)), false) if state != JobState::Inactive => {
                self.count_active(cluster, queue_before, state, job.userid(), -1);
                self.ages.remove(cluster, state, entered);
            }
            // Its queue changed (an update, or a jobspec read after its
            // eventlog) with no transition: counted in the new one.
            (Some((state, _)), true)
                if transitions.is_empty()
                    && state != JobState::Inactive
                    && queue != queue_before =>
            {
                self.count_active(cluster, queue_before, state, job.userid(), -1);
                self.count_active(cluster, queue, state, job.userid(), 1);
            }
            _ => {}
        }
        let mut entered = before.and_then(|b| b.1);
        let mut counted_in = queue_before;
        for t in transitions {
            let (from, to) = (t.transition.from, t.transition.to);
            if before.is_some() {
                if from != JobState::Inactive {
                    self.count_active(cluster, counted_in, from, job.userid(), -1);
                    self.ages.remove(cluster, from, entered);
                }
                // SCHED keeps its first entry time (a job reverted to
                // PRIORITY and back has waited since then): the time the
                // job itself says, so its removal finds the same entry.
                let at = if to == JobState::Sched {
                    job.t_sched.get().or(Some(t.transition.timestamp))
                } else {
                    Some(t.transition.timestamp)
                };
                if to != JobState::Inactive {
                    self.count_active(cluster, queue, to, job.userid(), 1);
                    self.ages.add(cluster, to, at);
                }
                entered = at;
                counted_in = queue;
            }
            let Some(m) = self.series.get_mut(cluster) else {
                continue;
            };
            m.transition(from, to);
            if let Some((_, Some(entered))) = before {
                m.time_in(from, (t.transition.timestamp - entered).max(0.0));
            }
            match to {
                JobState::Run => {
                    if let Some(submit) = job.t_submit.get() {
                        m.queue_wait(queue, (t.transition.timestamp - submit).max(0.0));
                    }
                }
                JobState::Cleanup => {
                    if let Some(run) = job.t_run.get() {
                        m.run(queue, (t.transition.timestamp - run).max(0.0));
                    }
                }
                JobState::Inactive => {
                    if let Some(result) = job.result() {
                        m.ended(queue, result);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Add the change of this shard's count to a gauge all shards share.
fn report_share(gauge: &'static str, reported: &mut usize, now: usize) {
    // Most records neither add nor drop one: no shared counter written.
    if now == *reported {
        return;
    }
    let gauge = metrics::gauge!(gauge);
    if now > *reported {
        gauge.increment((now - *reported) as f64);
    } else {
        gauge.decrement((*reported - now) as f64);
    }
    *reported = now;
}

/// The type and severity of a job's `exception` event, for its counter
/// (read before the record is applied, which takes it).
pub fn exception_of(record: &Record) -> Option<(String, i64)> {
    match &record.body {
        Body::Event(ev) if record.stream == EventStream::Job && ev.name == "exception" => {
            let values = ev.values(["type", "severity"]);
            match (values.str("type"), values.int("severity")) {
                (Ok(t), Ok(sev)) => Some((t.to_string(), sev)),
                _ => None,
            }
        }
        _ => None,
    }
}
