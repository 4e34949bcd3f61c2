//! The per-record core of fluxpipe, as Flink's keyed `processElement` and
//! `onTimer`: apply a record to the keyed state, move the event clock, fire
//! the alerts that came due, and show the alert engine what the record
//! changed. `fluxpipe replay` and every shard of `fluxpipe run` drive this
//! one processor, so the two cannot drift apart. No I/O, no async: what a
//! record did is written into a `Processed` the caller keeps and emits.

use super::alerts::engine::{AlertEvent, Detail, Drain, Engine, Holds, HoldsRef, NodeKey, Subject};
use super::alerts::rule::{Rule, RuleKind, job_view, node_condition};
use super::alerts::{Clock, EventClock, JobView, wall_now};
use super::expiry::{Eviction, Expiry, StateTtl};
use super::finished::FinishedJobs;
use super::key::{JobKey, Owner};
use super::owners::{Dirty, Owners};
use super::state::{Effects, JobEntry, KeyedAnomaly, State};
use crate::decode::{Body, EventStream, Record};
use crate::flux::anomaly::{Anomaly, AnomalyKind, Stream};
use crate::flux::job::JobState;
use crate::flux::jobid::JobId;
use crate::flux::resource::RankChange;
use smallvec::SmallVec;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What became of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied to the state (anomalies included).
    Applied,
    /// It repeated something already applied and was skipped.
    Repeat,
    /// Refused: the most jobs the processor may hold are held, and the
    /// record is of a job not yet among them.
    Refused,
}

/// What one record did, for the caller to emit and count.
#[derive(Debug, Default)]
pub struct Processed {
    /// Its job's key (with the processor's copy of the cluster name), if
    /// it is a job's record.
    pub key: Option<JobKey>,
    /// The job as it was before, if it was counted as active or inactive
    /// (submitted and valid): its state and since when.
    pub before: Option<(JobState, Option<f64>)>,
    /// The queue it was counted in before.
    pub queue_before: QueueBefore,
    /// The record made the job's state (it was not held before).
    pub new_job: bool,
    /// It is of a job that ended and was dropped (a backlog sent again):
    /// skipped, as a repeat.
    pub of_finished_job: bool,
    /// Its time is implausible (see [`Processor::with_max_clock_skew`]):
    /// not applied, an anomaly, not passed on.
    pub refused_time: bool,
    /// Refused because it names a cluster beyond the most followed.
    pub refused_cluster: bool,
    pub fx: Effects,
}

/// The queue a job was counted in before a record.
#[derive(Debug, Default, Clone, PartialEq)]
pub enum QueueBefore {
    /// The record cannot move a job to another queue: its queue before is
    /// its queue now (nearly every record; nothing copied).
    #[default]
    Same,
    /// A jobspec, or an update of one: the queue it was in (inline: no
    /// allocation).
    Was(Option<compact_str::CompactString>),
}

impl QueueBefore {
    /// The queue before, given the job's queue now.
    pub fn or_now<'a>(&'a self, now: Option<&'a str>) -> Option<&'a str> {
        match self {
            QueueBefore::Same => now,
            QueueBefore::Was(q) => q.as_deref(),
        }
    }
}

/// How far ahead of the wall clock an event may be dated, by default.
pub const DEFAULT_MAX_CLOCK_SKEW_SECS: f64 = 3600.0;

/// A rank whose draining flipped because jobs elsewhere took or gave back
/// its ranks, with the time it is stamped with.
#[derive(Debug)]
pub struct DrainFlip {
    pub cluster: String,
    pub change: RankChange,
    pub at: f64,
}

/// The keyed processor: state, alert engine and event clock, its own:
/// read through [`Processor::state`] and the like, changed only by
/// applying records, by its timers, and by taking over saved state or
/// giving back what revoked partitions owned ([`super::restore`]).
pub struct Processor {
    pub(super) state: State,
    pub(super) alerts: Engine,
    /// Newest event timestamp per cluster, as this processor knows it.
    pub(super) event_clock: EventClock,
    /// The partitions state belongs to, and what changed for changelogs.
    pub(super) owners: Owners,
    clock: Clock,
    /// Most alerts fired in one go (a replay fires everything due at once;
    /// a shard fires in batches so input keeps flowing).
    fire_batch: usize,
    /// More alerts are due than the last batch fired.
    due: bool,
    /// Most jobs held; records of new jobs beyond it are refused.
    max_jobs: usize,
    /// Jobs that ended and were dropped, so their records sent again are
    /// recognised (empty unless the caller drops jobs: replay keeps all).
    pub(super) finished: FinishedJobs,
    /// Events dated more than this ahead of the wall clock are refused.
    max_clock_skew: f64,
    /// The latest time an event may carry, as last read from the wall
    /// clock: read again only for an event past it (no clock read per
    /// record).
    time_limit: f64,
    /// "Now" on the wall clock (a function, so tests can set the time).
    wall: fn() -> f64,
    /// When ended and never-submitted jobs are dropped; none in a replay.
    expiry: Option<Expiry>,
    /// "Now" on a monotonic clock, for [`Processor::expiry`].
    monotonic: fn() -> Instant,
}

/// What [`Processor::expire`] dropped, for the caller to emit and count.
#[derive(Debug, Default)]
pub struct Expired {
    /// The jobs dropped, their last entries, and why.
    pub dropped: Vec<(JobKey, Box<JobEntry>, Eviction)>,
    /// Alerts resolved by it (none should hold for an ended job; one left
    /// resolves rather than lingers).
    pub alerts: Vec<AlertEvent>,
    /// One per job dropped without ever having been submitted.
    pub anomalies: Vec<KeyedAnomaly>,
}

impl Processor {
    /// A processor with these alert rules, timed by `clock`.
    pub fn new(rules: Vec<Rule>, clock: Clock) -> Self {
        Processor {
            state: State::new(),
            alerts: Engine::new(rules),
            event_clock: EventClock::default(),
            owners: Owners::default(),
            clock,
            fire_batch: usize::MAX,
            due: false,
            max_jobs: usize::MAX,
            finished: FinishedJobs::default(),
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW_SECS,
            time_limit: f64::NEG_INFINITY,
            wall: wall_now,
            expiry: None,
            monotonic: Instant::now,
        }
    }

    /// Drop an INACTIVE job `ttl.inactive_grace` after it ended, and a job
    /// never submitted `ttl.orphan_ttl` after it was first seen, at the
    /// next [`Processor::expire`] after that. Without it (a replay) every
    /// job is held to the end.
    pub fn with_state_ttl(mut self, ttl: StateTtl) -> Self {
        self.expiry = Some(Expiry::new(ttl));
        self
    }

    /// Follow at most `n` clusters.
    pub fn with_max_clusters(mut self, n: usize) -> Self {
        self.state
            .share_cluster_budget(super::state::ClusterBudget::new(n));
        self
    }

    /// Remember at most `n` jobs dropped after they ended.
    pub fn with_max_finished(mut self, n: usize) -> Self {
        self.finished = FinishedJobs::with_cap(n);
        self
    }

    /// Refuse events dated more than `secs` ahead of the wall clock (and
    /// before 1970): one such event would move a cluster's event clock by
    /// years and fire every timed alert at once.
    pub fn with_max_clock_skew(mut self, secs: f64) -> Self {
        self.max_clock_skew = if secs.is_nan() {
            f64::INFINITY
        } else {
            secs.max(0.0)
        };
        self.time_limit = f64::NEG_INFINITY;
        self
    }

    /// Whether an event time is beyond belief: before 1970, or further
    /// ahead of the wall clock than the skew allowed.
    fn implausible(&mut self, t: f64) -> bool {
        if t < 0.0 {
            return true;
        }
        if t <= self.time_limit {
            return false;
        }
        self.time_limit = (self.wall)() + self.max_clock_skew;
        t > self.time_limit
    }

    /// The most the wall clock allows an event time to be, now.
    pub fn latest_plausible(&self) -> f64 {
        (self.wall)() + self.max_clock_skew
    }

    /// Share the ranks jobs hold with the other processors, so the one
    /// keeping a cluster's resource state knows which drained ranks still
    /// run a job.
    pub fn with_allocations(mut self, allocations: super::state::SharedAllocations) -> Self {
        self.state.share_allocations(allocations);
        self
    }

    /// Share the clusters followed with the other processors.
    pub fn with_cluster_budget(mut self, budget: super::state::ClusterBudget) -> Self {
        self.state.share_cluster_budget(budget);
        self
    }

    /// Share the budget of ranks with the other processors.
    pub fn with_rank_budget(mut self, budget: super::state::RankBudget) -> Self {
        self.state.share_rank_budget(budget);
        self
    }

    /// Note the changes to state these sources own, for their changelogs
    /// ([`Processor::take_changes`]).
    pub fn with_changelog(mut self, sources: impl IntoIterator<Item = Arc<str>>) -> Self {
        self.owners.log(sources);
        self
    }

    /// Every job and rank held.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The alert rules and their conditions.
    pub fn alerts(&self) -> &Engine {
        &self.alerts
    }

    /// Newest event timestamp per cluster.
    pub fn event_clock(&self) -> &EventClock {
        &self.event_clock
    }

    /// Jobs remembered after they were dropped.
    pub fn finished(&self) -> &FinishedJobs {
        &self.finished
    }

    /// The partitions clusters' resource state belongs to.
    pub fn resource_owners(&self) -> &foldhash::HashMap<String, Owner> {
        self.owners.resources()
    }

    /// Ask for the memory of a record's job ahead of applying it: a
    /// batch's jobs looked up in one tight loop overlap their misses,
    /// where applying them one by one waits for each in turn.
    #[inline]
    pub fn prefetch(&self, cluster: &str, id: Option<JobId>) {
        if let Some(id) = id {
            self.state.jobs.prefetch(cluster, id);
        }
    }

    /// The processor's copy of a cluster's name (keys share it).
    pub fn intern(&mut self, cluster: &str) -> Arc<str> {
        self.state.intern(cluster)
    }

    /// Merge this processor's event clock into one shared with others,
    /// and take theirs.
    pub fn sync_event_clock(&mut self, shared: &super::alerts::SharedEventClock) {
        shared.sync(&mut self.event_clock);
    }

    /// What changed since the last call, for the changelogs: the keys,
    /// with the partition each belongs to (read each one's value from
    /// [`Processor::state`]; one no longer there is a tombstone).
    pub fn take_changes(&mut self) -> foldhash::HashMap<Dirty, Owner> {
        self.owners.take_dirty()
    }

    /// Fire at most `n` alerts per call of [`Processor::fire_due`].
    pub fn with_fire_batch(mut self, n: usize) -> Self {
        self.fire_batch = n.max(1);
        self
    }

    /// Hold at most `n` jobs.
    pub fn with_max_jobs(mut self, n: usize) -> Self {
        self.max_jobs = n;
        self
    }

    /// The clock alert durations are measured against.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// More alerts are due than the last batch fired.
    pub fn alerts_due(&self) -> bool {
        self.due
    }

    /// Whether any alert rule is set.
    pub fn alerting(&self) -> bool {
        !self.alerts.rules().is_empty()
    }

    /// Apply one record of `cluster` (the record's own, or its source's);
    /// alerts it fired or resolved, and those that came due before it, go
    /// to `alerts` in time order.
    pub fn process(
        &mut self,
        cluster: &str,
        record: Record,
        alerts: &mut Vec<AlertEvent>,
    ) -> (Outcome, Processed) {
        let mut done = Processed::default();
        let outcome = self.process_into(cluster, record, alerts, &mut done);
        (outcome, done)
    }

    /// [`Processor::process`], what the record did written into `done`
    /// (as made by `Processed::default()`) where the caller keeps it: a
    /// `Processed` is 216 bytes, copied at every return.
    #[inline(always)]
    pub fn process_into(
        &mut self,
        cluster: &str,
        mut record: Record,
        alerts: &mut Vec<AlertEvent>,
        done: &mut Processed,
    ) -> Outcome {
        debug_assert!(
            done.key.is_none() && !done.of_finished_job && done.fx.transitions.is_empty(),
            "a fresh Processed"
        );
        record.cluster = None;
        // The processor's own copy of the name: no reference count shared
        // with another thread in a million long-lived keys. A cluster new
        // here past the most followed is refused.
        let Some(interned) = self.state.intern_admitted(cluster) else {
            done.refused_cluster = true;
            return Outcome::Refused;
        };
        let key = record.id.map(|id| JobKey {
            cluster: interned.clone(),
            id,
        });
        if let Body::Event(ev) = &record.body
            && self.implausible(ev.timestamp)
        {
            let outcome;
            (outcome, *done) = self.refuse_time(cluster, &record);
            return outcome;
        }
        let prior = key.as_ref().and_then(|k| self.state.jobs.get(k));
        let new_job = key.is_some() && prior.is_none();
        if new_job
            && !self.finished.is_empty()
            && let Some(k) = &key
        {
            let submit = match &record.body {
                Body::Event(ev) if record.stream == EventStream::Job && ev.name == "submit" => {
                    Some(ev.timestamp)
                }
                _ => None,
            };
            if self.finished.is_repeat(&k.cluster, k.id.0, submit) {
                done.of_finished_job = true;
                done.fx.duplicate = true;
                return Outcome::Repeat;
            }
        }
        if new_job && self.state.jobs.len() >= self.max_jobs {
            return Outcome::Refused;
        }
        let counted = prior.filter(|e| e.job.submitted && !e.job.invalidated);
        let before = counted.map(|e| (e.job.state, e.job.t_state()));
        // Only a jobspec, or an update of one, can move a job to another
        // queue.
        let may_move = match &record.body {
            Body::JobSpec(_) => true,
            Body::Event(ev) => ev.name == "jobspec-update",
            _ => false,
        };
        let queue_before = if may_move {
            QueueBefore::Was(counted.and_then(|e| e.job.queue()).map(Into::into))
        } else {
            QueueBefore::Same
        };
        // What the job rules see of the job: a record that leaves it as it
        // was need not be shown to the engine.
        let view = (key.is_some() && self.alerting())
            .then(|| prior.and_then(|e| job_view(&e.job, e.exec_log())));
        let event_ts = match &record.body {
            Body::Event(ev) if ev.timestamp.is_finite() => Some(ev.timestamp),
            _ => None,
        };
        // Its effects are filled in place: nothing copied.
        done.key = key;
        done.before = before;
        done.queue_before = queue_before;
        done.new_job = new_job;
        let key = done.key.as_ref();
        self.state
            .apply_keyed_into(&interned, key, record, &mut done.fx);
        let fx = &done.fx;
        if let Some(expiry) = &mut self.expiry {
            note_expiry(
                expiry,
                Clocks {
                    monotonic: self.monotonic,
                    wall: self.wall,
                },
                &mut self.state,
                key,
                new_job,
                fx,
            );
        }
        if !fx.duplicate && self.alerting() {
            self.alert_on(&interned, key, view, event_ts, fx, alerts);
        }
        if fx.duplicate {
            Outcome::Repeat
        } else {
            Outcome::Applied
        }
    }

    /// [`Processor::process`] for a record read from partition `owner` (a
    /// partitioned source's): the state it changed is owned by it, and
    /// noted for its changelog, as is whatever its alerts changed.
    /// What the record did is written into `done` (as made by
    /// `Processed::default()`).
    #[inline(always)]
    pub fn process_from(
        &mut self,
        owner: Option<&Owner>,
        cluster: &str,
        record: Record,
        alerts: &mut Vec<AlertEvent>,
        done: &mut Processed,
    ) -> Outcome {
        let stream = record.stream;
        let fired = alerts.len();
        let outcome = self.process_into(cluster, record, alerts, done);
        if outcome == Outcome::Refused || done.of_finished_job {
            return outcome;
        }
        let fx = &done.fx;
        if !fx.duplicate {
            match &done.key {
                Some(key) => self.owners.job_changed(&mut self.state, key, owner),
                None if stream == EventStream::Resource => {
                    self.owners.resource_changed(&self.state, cluster, owner);
                }
                None => {}
            }
        }
        // A job took or gave back drained ranks of a cluster kept here.
        if done.key.is_some() && !fx.rank_changes.is_empty() {
            self.owners.resource_changed(&self.state, cluster, None);
        }
        self.alerted(&alerts[fired..]);
        outcome
    }

    /// Fired or resolved: the subjects' saved conditions changed.
    pub(super) fn alerted(&mut self, events: &[AlertEvent]) {
        for a in events {
            match &a.subject {
                Subject::Job(k) => self.owners.job_changed(&mut self.state, k, None),
                Subject::Node(n) => self.owners.resource_changed(&self.state, &n.cluster, None),
            }
        }
    }

    /// An event of implausible time: an anomaly, nothing applied.
    fn refuse_time(&self, cluster: &str, record: &Record) -> (Outcome, Processed) {
        let (name, t) = match &record.body {
            Body::Event(ev) => (ev.name.as_str(), ev.timestamp),
            _ => ("", f64::NAN),
        };
        let stream = match record.stream {
            EventStream::Job => Stream::Job,
            EventStream::Exec => Stream::Exec,
            EventStream::Resource => Stream::Resource,
        };
        let why = if t < 0.0 {
            "dated before 1970: not applied".to_string()
        } else {
            format!(
                "dated more than {} s ahead of this host's clock: not applied \
                 (operators.max_clock_skew_secs)",
                self.max_clock_skew
            )
        };
        let mut fx = Effects::default();
        fx.anomalies.push(KeyedAnomaly {
            cluster: cluster.to_string(),
            id: record.id,
            anomaly: Anomaly::new(stream, AnomalyKind::BadTimestamp, why).at(name, t),
        });
        (
            Outcome::Applied,
            Processed {
                refused_time: true,
                fx,
                ..Processed::default()
            },
        )
    }

    /// Show the engine what this record changed, after what came due
    /// before it.
    fn alert_on(
        &mut self,
        cluster: &Arc<str>,
        key: Option<&JobKey>,
        view: Option<Option<JobView>>,
        event_ts: Option<f64>,
        fx: &Effects,
        out: &mut Vec<AlertEvent>,
    ) {
        // How far this record runs behind the cluster's event clock.
        let lag = match (self.clock, event_ts) {
            (Clock::Event, Some(ts)) => self.event_clock.advance_shared(cluster, ts),
            _ => 0.0,
        };
        // What came due before this record goes first, in time order.
        if self.clock == Clock::Event {
            self.fire_due_now(out);
        }
        let known = event_ts.or_else(|| self.event_clock.now(cluster));
        let at = match (known, self.clock) {
            (Some(at), _) => at,
            (None, Clock::Wall) => (self.wall)(),
            // No time at all yet for this cluster on the event clock: the
            // next event shows the engine where things stand.
            (None, Clock::Event) => return,
        };
        if let Some(key) = key
            && let Some(entry) = self.state.jobs.get_mut(key)
        {
            let now = job_view(&entry.job, entry.exec_log());
            if view != Some(now) {
                observe_job(&mut self.alerts, entry, now, key, at, lag, out);
            }
        }
        for (c, change) in &fx.rank_changes {
            observe_rank(&mut self.alerts, c, change, at, lag, out);
        }
    }

    /// Fire a batch of the alerts that are due.
    pub fn fire_due(&mut self, out: &mut Vec<AlertEvent>) {
        let fired = out.len();
        self.fire_due_now(out);
        self.alerted(&out[fired..]);
    }

    /// Fire every alert due at `now`, on any clock (for tests).
    #[cfg(test)]
    pub fn fire_due_at(&mut self, now: f64, out: &mut Vec<AlertEvent>) {
        let jobs = &mut self.state.jobs;
        self.alerts.advance(|_| Some(now), usize::MAX, jobs, out);
    }

    fn fire_due_now(&mut self, out: &mut Vec<AlertEvent>) {
        let jobs = &mut self.state.jobs;
        // Nothing can be due while every clock is short of the earliest
        // deadline: the common case, settled without a look at the timers.
        let earliest = self.alerts.earliest_deadline();
        self.due = match self.clock {
            Clock::Wall => {
                let now = (self.wall)();
                now >= earliest
                    && self
                        .alerts
                        .advance(|_| Some(now), self.fire_batch, jobs, out)
            }
            Clock::Event => {
                let clocks = &self.event_clock;
                clocks.newest() >= earliest
                    && self
                        .alerts
                        .advance(|c| clocks.now(c), self.fire_batch, jobs, out)
            }
        };
    }

    /// Ranks whose draining flipped because jobs elsewhere (other
    /// processors sharing the allocations) took or gave them back, shown to
    /// the engine. Stamped with the cluster's event time, else `fallback`'s,
    /// else the wall clock.
    pub fn refresh_draining(
        &mut self,
        fallback: impl Fn(&str) -> Option<f64>,
        out: &mut Vec<AlertEvent>,
    ) -> Vec<DrainFlip> {
        let fired = out.len();
        let changes = self.state.refresh_draining();
        let mut flips = Vec::with_capacity(changes.len());
        for (cluster, change) in changes {
            let at = self
                .event_clock
                .now(&cluster)
                .or_else(|| fallback(&cluster))
                .unwrap_or_else(self.wall);
            if self.alerting() {
                observe_rank(&mut self.alerts, &cluster, &change, at, 0.0, out);
            }
            self.owners.resource_changed(&self.state, &cluster, None);
            flips.push(DrainFlip {
                cluster,
                change,
                at,
            });
        }
        self.alerted(&out[fired..]);
        flips
    }

    /// Drop the jobs whose time is up at `now` (see
    /// [`Processor::with_state_ttl`]): an ended job is remembered as
    /// finished, a job never submitted leaves an anomaly, and any alert
    /// condition left on either resolves.
    pub fn expire(&mut self, now: Instant) -> Expired {
        let mut out = Expired::default();
        let Some(expiry) = &mut self.expiry else {
            return out;
        };
        while let Some((key, why)) = expiry.pop_due(now) {
            // Its timer still applies only if the job is as it was then.
            let applies = self.state.jobs.get(&key).is_some_and(|e| match why {
                Eviction::Inactive => e.job.state == JobState::Inactive,
                Eviction::Orphan => !e.job.submitted,
            });
            if !applies {
                continue;
            }
            let Some(mut entry) = self.state.remove_job(&key) else {
                continue;
            };
            match why {
                Eviction::Inactive => {
                    self.finished
                        .remember(&key.cluster, key.id.0, entry.job.t_submit.get());
                }
                Eviction::Orphan => out.anomalies.push(KeyedAnomaly {
                    cluster: key.cluster.to_string(),
                    id: Some(key.id),
                    anomaly: Anomaly::new(
                        Stream::Job,
                        AnomalyKind::UnknownTarget,
                        "no submit event arrived for this job; its state was dropped",
                    ),
                }),
            }
            let at = entry.job.last_timestamp().unwrap_or(0.0);
            let conditions = std::mem::take(&mut entry.alerts);
            self.alerts
                .forget_job(conditions, &key, at, &mut out.alerts);
            self.owners.job_dropped(&key, &entry);
            out.dropped.push((key, entry, why));
        }
        let alerts = std::mem::take(&mut out.alerts);
        self.alerted(&alerts);
        out.alerts = alerts;
        out
    }

    /// A job taken over from a checkpoint or changelog: an ended one keeps
    /// what was left of its grace when it was saved (its end is saved with
    /// it; one saved without it starts its grace again); a job never
    /// submitted starts its time to live now.
    pub fn track_restored(&mut self, key: &JobKey, entry: &JobEntry) {
        let Some(expiry) = &mut self.expiry else {
            return;
        };
        let now = (self.monotonic)();
        let job = &entry.job;
        if job.state == JobState::Inactive {
            let grace = expiry.inactive_grace();
            let left = if entry.ended_at == 0 {
                grace
            } else {
                let gone = ((self.wall)() - f64::from(entry.ended_at)).max(0.0);
                grace.saturating_sub(Duration::try_from_secs_f64(gone).unwrap_or(Duration::MAX))
            };
            expiry.restored(key.clone(), now + left);
        } else if !job.submitted {
            expiry.unsubmitted(key.clone(), now);
        }
    }

    /// At the end of a finite input: fire every alert whose condition has
    /// held its duration by its cluster's event clock.
    pub fn finish(&mut self, out: &mut Vec<AlertEvent>) {
        let clock = &self.event_clock;
        self.alerts
            .flush(|c| clock.now(c), &mut self.state.jobs, out);
    }
}

/// A wall-clock time as whole Unix seconds (0 for none before 1970 or
/// past 2106: the job is then timed as if saved without its end).
fn unix_seconds(t: f64) -> u32 {
    if t.is_finite() && t >= 1.0 && t < f64::from(u32::MAX) {
        t as u32
    } else {
        0
    }
}

/// Start the time to live of what a record made: a job first seen without
/// its submit, a job that ended.
/// The clocks a time to live reads: the monotonic one for deadlines, the
/// wall one for the end saved with a job.
struct Clocks {
    monotonic: fn() -> Instant,
    wall: fn() -> f64,
}

fn note_expiry(
    expiry: &mut Expiry,
    Clocks { monotonic, wall }: Clocks,
    state: &mut State,
    key: Option<&JobKey>,
    new_job: bool,
    fx: &Effects,
) {
    if new_job
        && let Some(key) = key
        && state.jobs.get(key).is_some_and(|e| !e.job.submitted)
    {
        expiry.unsubmitted(key.clone(), monotonic());
    }
    for t in &fx.transitions {
        if t.transition.to == JobState::Inactive {
            expiry.ended(t.key.clone(), monotonic());
            // Saved with the job: a restart keeps what is left of its grace.
            if let Some(e) = state.jobs.get_mut(&t.key) {
                e.ended_at = unix_seconds(wall());
            }
        }
    }
}

/// Tell the engine where a job stands now (`now`, its view), from its
/// entry (which keeps its conditions). `at` is the time of the record just
/// applied.
fn observe_job(
    engine: &mut Engine,
    entry: &mut JobEntry,
    now: Option<JobView>,
    key: &JobKey,
    at: f64,
    lag: f64,
    out: &mut Vec<AlertEvent>,
) {
    // One detail for every rule of the job, lent rather than copied into
    // each, and made only if one holds: this runs for every change of a
    // job's state.
    let detail = std::cell::OnceCell::new();
    // The queue too is read once, and only when needed (a rule of some
    // queues, a detail made).
    let queue_read = std::cell::OnceCell::new();
    let queue = || *queue_read.get_or_init(|| entry.job.queue());
    // Only the rules that hold (one or two at a time): the others clear.
    // Those about other states, or other queues, cannot, and are not
    // looked at.
    let (rules, details) = engine.job_rules_and_details(entry.job.state);
    let holds: SmallVec<[(usize, HoldsRef); 2]> = rules
        .filter(|(_, rule)| rule.watches_queue(queue))
        .filter_map(|(i, rule)| {
            now?.condition(rule.kind).map(|since| {
                let detail = detail.get_or_init(|| details.of_job(entry.job.state, queue()));
                (i, Some((since, detail)))
            })
        })
        .collect();
    engine.observe_job(&mut entry.alerts, key, &holds, at, lag, out);
}

/// Tell the engine where a changed rank stands now.
fn observe_rank(
    engine: &mut Engine,
    cluster: &str,
    change: &RankChange,
    at: f64,
    lag: f64,
    out: &mut Vec<AlertEvent>,
) {
    let key = NodeKey {
        cluster: cluster.to_string(),
        rank: change.rank,
    };
    let Some(rank) = &change.after else {
        engine.forget_node(&key, at, out);
        return;
    };
    let holds: SmallVec<[(usize, Holds); 4]> = engine
        .rules_for(false)
        .filter_map(|(i, rule)| {
            let since = node_condition(rule.kind, rank)?;
            let host = rank.hostname.clone();
            let detail = match rule.kind {
                RuleKind::NodeDrained => Detail::Drained(Box::new(Drain {
                    host,
                    reason: rank.drain_reason.clone(),
                    draining: rank.draining,
                })),
                _ => Detail::Host(host.map(Box::new)),
            };
            Some((i, Some((since.unwrap_or(at), detail))))
        })
        .collect();
    engine.observe_node(&key, &holds, at, lag, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::EventStream;
    use crate::flux::Event;
    use crate::flux::jobid::JobId;
    use serde_json::json;

    fn record(id: u64, ev: Event) -> Record {
        Record {
            cluster: None,
            stream: EventStream::Job,
            id: Some(JobId(id)),
            body: Body::Event(ev),
        }
    }

    fn submit(t: f64) -> Event {
        Event::new(t, "submit").with_context(json!({"userid": 1, "urgency": 16, "flags": 0}))
    }

    fn sched_rule() -> Vec<Rule> {
        vec![
            Rule::new(
                "sched",
                RuleKind::JobState(JobState::Sched),
                "100s",
                "warning",
            )
            .unwrap(),
        ]
    }

    fn to_sched(p: &mut Processor, id: u64, t: f64, out: &mut Vec<AlertEvent>) {
        for (i, (name, ctx)) in [
            ("validate", None),
            ("depend", None),
            ("priority", Some(json!({"priority": 1}))),
        ]
        .into_iter()
        .enumerate()
        {
            let mut ev = Event::new(t + 1.0 + i as f64, name);
            if let Some(c) = ctx {
                ev = ev.with_context(c);
            }
            p.process("c", record(id, ev), out);
        }
    }

    use crate::flux::anomaly::AnomalyKind;

    #[test]
    fn a_restore_in_parts_holds_every_entry_under_its_id() {
        let c: Arc<str> = Arc::from("c");
        let part = |from: u64| super::super::saved::SavedState {
            jobs: (from..from + 1000)
                .map(|id| {
                    let key = JobKey {
                        cluster: c.clone(),
                        id: JobId(id),
                    };
                    (key, Box::default())
                })
                .collect(),
            ..Default::default()
        };
        let mut p = Processor::new(Vec::new(), Clock::Event);
        let mut restoring = super::super::restore::Restoring::default();
        for from in [0, 1000, 2000] {
            p.restore_part(&mut restoring, part(from));
        }
        p.end_restore(restoring);
        // Each entry holds the id it was restored under.
        assert_eq!(p.state.jobs.len(), 3000);
        assert!(p.state.jobs.iter().all(|(k, e)| k.id == e.id));
        let key = JobKey {
            cluster: c,
            id: JobId(2500),
        };
        assert!(p.state.jobs.get(&key).is_some());
    }

    #[test]
    fn a_record_of_a_job_past_the_limit_is_refused_and_changes_nothing() {
        let mut p = Processor::new(Vec::new(), Clock::Event).with_max_jobs(1);
        let mut out = Vec::new();
        let (o, done) = p.process("c", record(1, submit(1.0)), &mut out);
        assert_eq!(o, Outcome::Applied);
        assert!(done.new_job && done.before.is_none());
        let (o, _) = p.process("c", record(2, submit(2.0)), &mut out);
        assert_eq!(o, Outcome::Refused);
        assert_eq!(p.state.jobs.len(), 1);
        // A held job's records still apply; a repeat is told apart.
        let (o, done) = p.process("c", record(1, Event::new(3.0, "validate")), &mut out);
        assert_eq!(o, Outcome::Applied);
        assert_eq!(done.before.map(|b| b.0), Some(JobState::New));
        let (o, _) = p.process("c", record(1, Event::new(3.0, "validate")), &mut out);
        assert_eq!(o, Outcome::Repeat);
    }

    #[test]
    fn alerts_fire_on_the_event_clock_before_the_record_that_passes_them() {
        let mut p = Processor::new(sched_rule(), Clock::Event);
        let mut out = Vec::new();
        p.process("c", record(1, submit(0.0)), &mut out);
        to_sched(&mut p, 1, 0.0, &mut out);
        assert!(out.is_empty());
        // Another job's submit 200 s later moves the clock past the hold.
        p.process("c", record(2, submit(200.0)), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].subject.cluster(), "c");
    }

    #[test]
    fn at_the_end_of_input_what_held_long_enough_fires() {
        let mut p = Processor::new(sched_rule(), Clock::Event);
        let mut out = Vec::new();
        p.process("c", record(1, submit(0.0)), &mut out);
        to_sched(&mut p, 1, 0.0, &mut out);
        p.process("c", record(2, submit(150.0)), &mut out);
        // Job 1 entered SCHED at 3 s; 150 s is past its 100 s: fired.
        assert_eq!(out.len(), 1);
        out.clear();
        to_sched(&mut p, 2, 150.0, &mut out);
        p.finish(&mut out);
        // Job 2 entered SCHED at 153 s and the clock stopped there.
        assert!(out.is_empty());
    }

    #[test]
    fn fired_in_batches_when_asked() {
        let mut p = Processor::new(sched_rule(), Clock::Event).with_fire_batch(2);
        let mut out = Vec::new();
        for id in 1..=5 {
            p.process("c", record(id, submit(0.0)), &mut out);
            to_sched(&mut p, id, 0.0, &mut out);
        }
        p.process("c", record(99, submit(500.0)), &mut out);
        assert_eq!(out.len(), 2);
        assert!(p.alerts_due());
        while p.alerts_due() {
            p.fire_due(&mut out);
        }
        assert_eq!(out.len(), 5);
    }

    #[test]
    fn on_the_wall_clock_a_record_with_no_time_is_seen_at_the_wall_time() {
        let mut p = Processor::new(sched_rule(), Clock::Wall);
        p.wall = || 1000.0;
        let mut out = Vec::new();
        p.process("c", record(1, submit(0.0)), &mut out);
        to_sched(&mut p, 1, 0.0, &mut out);
        p.fire_due(&mut out);
        // In SCHED since 3 s; the wall clock says 1000 s.
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn an_event_dated_years_ahead_is_refused_and_moves_no_clock() {
        let mut p = Processor::new(sched_rule(), Clock::Event);
        p.wall = || 1000.0;
        let mut out = Vec::new();
        p.process("c", record(1, submit(0.0)), &mut out);
        to_sched(&mut p, 1, 0.0, &mut out);
        for (id, t) in [(2, 1e300), (3, 1000.0 + 3601.0), (4, -5.0)] {
            let (o, done) = p.process("c", record(id, submit(t)), &mut out);
            assert_eq!(o, Outcome::Applied);
            assert!(done.refused_time && done.key.is_none());
            assert_eq!(done.fx.anomalies.len(), 1);
            let a = &done.fx.anomalies[0];
            assert_eq!(a.anomaly.kind, AnomalyKind::BadTimestamp);
            assert_eq!(
                (a.id.map(|i| i.0), a.anomaly.timestamp),
                (Some(id), Some(t))
            );
        }
        // Nothing applied, no clock moved, nothing fired.
        assert_eq!(p.state.jobs.len(), 1);
        assert!(out.is_empty());
        assert_eq!(p.event_clock.now("c"), Some(3.0));
        // Within the skew: applied.
        let (_, done) = p.process("c", record(5, submit(1000.0 + 3599.0)), &mut out);
        assert!(!done.refused_time && done.new_job);
        // No limit asked: anything not negative goes.
        let mut p = Processor::new(Vec::new(), Clock::Event).with_max_clock_skew(f64::INFINITY);
        let (_, done) = p.process("c", record(1, submit(1e300)), &mut out);
        assert!(!done.refused_time);
    }

    #[test]
    fn records_of_a_finished_job_that_was_dropped_are_repeats() {
        let mut p = Processor::new(Vec::new(), Clock::Event).with_max_finished(10);
        let mut out = Vec::new();
        p.process("c", record(1, submit(100.0)), &mut out);
        let key = JobKey {
            cluster: p.state.intern("c"),
            id: crate::flux::jobid::JobId(1),
        };
        assert!(p.state.remove_job(&key).is_some());
        p.finished.remember(&key.cluster, 1, Some(100.0));
        for ev in [submit(100.0), Event::new(101.0, "validate")] {
            let (o, done) = p.process("c", record(1, ev), &mut out);
            assert_eq!(o, Outcome::Repeat);
            assert!(done.of_finished_job && done.fx.duplicate);
        }
        assert!(p.state.jobs.is_empty());
        // The same id submitted at another time: a new job.
        let (o, done) = p.process("c", record(1, submit(5000.0)), &mut out);
        assert_eq!(o, Outcome::Applied);
        assert!(done.new_job);
        // Another cluster's job 1 is its own.
        let (o, _) = p.process("d", record(1, submit(100.0)), &mut out);
        assert_eq!(o, Outcome::Applied);
    }

    #[test]
    fn with_a_time_to_live_ended_and_orphan_jobs_are_dropped_when_due() {
        use crate::keyed::expiry::{Eviction, StateTtl};
        use std::time::Duration;
        let ttl = StateTtl {
            inactive_grace: Duration::from_secs(60),
            orphan_ttl: Duration::from_secs(600),
        };
        let mut p = Processor::new(sched_rule(), Clock::Event)
            .with_max_finished(10)
            .with_state_ttl(ttl);
        let mut out = Vec::new();
        let t0 = Instant::now();
        p.process("c", record(1, submit(100.0)), &mut out);
        let cancel = json!({"type": "cancel", "severity": 0, "userid": 1, "note": ""});
        for ev in [
            Event::new(101.0, "validate"),
            Event::new(102.0, "exception").with_context(cancel),
            Event::new(103.0, "clean"),
        ] {
            p.process("c", record(1, ev), &mut out);
        }
        // Exec events of a job whose submit never comes.
        let mut orphan = record(2, Event::new(100.0, "init"));
        orphan.stream = EventStream::Exec;
        p.process("c", orphan, &mut out);
        // A job still pending stays however long it waits.
        p.process("c", record(3, submit(100.0)), &mut out);
        assert_eq!(p.state.jobs.len(), 3);
        let ids = |e: &Expired| -> Vec<(u64, Eviction)> {
            e.dropped.iter().map(|(k, _, why)| (k.id.0, *why)).collect()
        };
        assert!(p.expire(t0).dropped.is_empty());
        let gone = p.expire(Instant::now() + Duration::from_secs(61));
        assert_eq!(ids(&gone), [(1, Eviction::Inactive)]);
        assert!(gone.anomalies.is_empty());
        // Remembered: its records sent again are repeats, not a new job.
        let (o, _) = p.process("c", record(1, submit(100.0)), &mut out);
        assert_eq!(o, Outcome::Repeat);
        let gone = p.expire(Instant::now() + Duration::from_secs(601));
        assert_eq!(ids(&gone), [(2, Eviction::Orphan)]);
        assert_eq!(gone.anomalies.len(), 1);
        assert_eq!(gone.anomalies[0].anomaly.kind, AnomalyKind::UnknownTarget);
        assert_eq!(p.state.jobs.len(), 1);
        // A replay's processor (no time to live) holds everything.
        let mut replay = Processor::new(Vec::new(), Clock::Event);
        replay.process("c", record(1, submit(100.0)), &mut out);
        assert!(
            replay
                .expire(Instant::now() + Duration::from_secs(1 << 30))
                .dropped
                .is_empty()
        );
        assert_eq!(replay.state.jobs.len(), 1);
    }

    #[test]
    fn records_of_clusters_past_the_most_followed_are_refused() {
        let mut p = Processor::new(Vec::new(), Clock::Event).with_max_clusters(2);
        let mut out = Vec::new();
        for c in ["a", "b"] {
            let (o, _) = p.process(c, record(1, submit(1.0)), &mut out);
            assert_eq!(o, Outcome::Applied);
        }
        let (o, done) = p.process("c", record(1, submit(1.0)), &mut out);
        assert_eq!(o, Outcome::Refused);
        assert!(done.refused_cluster);
        // The clusters followed go on.
        let (o, _) = p.process("a", record(2, submit(2.0)), &mut out);
        assert_eq!(o, Outcome::Applied);
        assert_eq!(p.state.jobs.len(), 3);
    }

    #[test]
    fn ranks_past_the_budget_are_refused_with_one_summary() {
        use crate::keyed::state::RankBudget;
        let budget = RankBudget::new(100);
        let mut p = Processor::new(Vec::new(), Clock::Event);
        p.state.share_rank_budget(budget.clone());
        let mut out = Vec::new();
        let drain = |t: f64| Record {
            cluster: None,
            stream: EventStream::Resource,
            id: None,
            body: Body::Event(
                Event::new(t, "drain")
                    .with_context(json!({"idset": "0-131071", "reason": "x", "overwrite": 0})),
            ),
        };
        let (_, a) = p.process("x", drain(1.0), &mut out);
        assert_eq!(budget.held(), 100);
        // 8 anomalies naming a rank, then one for the rest.
        assert_eq!(a.fx.anomalies.len(), 9, "{:?}", a.fx.anomalies);
        let (_, b) = p.process("y", drain(1.0), &mut out);
        assert_eq!(budget.held(), 100, "no room left for another cluster");
        assert!(b.fx.rank_changes.is_empty());
    }
}
