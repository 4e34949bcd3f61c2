//! The per-record core of fluxpipe, as Flink's keyed `processElement` and
//! `onTimer`: apply a record to the keyed state, move the event clock, fire
//! the alerts that came due, and show the alert engine what the record
//! changed. `fluxpipe replay` and every shard of `fluxpipe run` drive this
//! one processor, so the two cannot drift apart. No I/O, no async: what a
//! record did comes back as values for the caller to emit.

use super::alerts::engine::{AlertEvent, Detail, Drain, Engine, Holds, HoldsLent, NodeKey};
use super::alerts::rule::{Rule, RuleKind, job_condition, job_view, node_condition};
use super::alerts::{Clock, EventClock, JobView, wall_now};
use super::key::JobKey;
use super::state::{Effects, JobEntry, State};
use crate::decode::{Body, Record};
use crate::flux::job::JobState;
use crate::flux::resource::RankChange;
use smallvec::SmallVec;

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
    /// The queue it was counted in before (inline: no allocation).
    pub queue_before: Option<compact_str::CompactString>,
    /// The record made the job's state (it was not held before).
    pub new_job: bool,
    pub fx: Effects,
}

/// A rank whose draining flipped because jobs elsewhere took or gave back
/// its ranks, with the time it is stamped with.
#[derive(Debug)]
pub struct DrainFlip {
    pub cluster: String,
    pub change: RankChange,
    pub at: f64,
}

/// The keyed processor: state, alert engine and event clock.
pub struct Processor {
    pub state: State,
    pub alerts: Engine,
    /// Newest event timestamp per cluster, as this processor knows it.
    pub event_clock: EventClock,
    clock: Clock,
    /// Most alerts fired in one go (a replay fires everything due at once;
    /// a shard fires in batches so input keeps flowing).
    fire_batch: usize,
    /// More alerts are due than the last batch fired.
    due: bool,
    /// Most jobs held; records of new jobs beyond it are refused.
    max_jobs: usize,
    /// "Now" on the wall clock (a function, so tests can set the time).
    wall: fn() -> f64,
}

impl Processor {
    /// A processor with these alert rules, timed by `clock`.
    pub fn new(rules: Vec<Rule>, clock: Clock) -> Self {
        Processor {
            state: State::new(),
            alerts: Engine::new(rules),
            event_clock: EventClock::default(),
            clock,
            fire_batch: usize::MAX,
            due: false,
            max_jobs: usize::MAX,
            wall: wall_now,
        }
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
    #[inline(always)]
    pub fn process(
        &mut self,
        cluster: &str,
        mut record: Record,
        alerts: &mut Vec<AlertEvent>,
    ) -> (Outcome, Processed) {
        record.cluster = None;
        // The processor's own copy of the name: no reference count shared
        // with another thread in a million long-lived keys.
        let key = record.id.map(|id| JobKey {
            cluster: self.state.intern(cluster),
            id,
        });
        let prior = key.as_ref().and_then(|k| self.state.jobs.get(k));
        let new_job = key.is_some() && prior.is_none();
        if new_job && self.state.jobs.len() >= self.max_jobs {
            return (Outcome::Refused, Processed::default());
        }
        let counted = prior.filter(|e| e.job.submitted && !e.job.invalidated);
        let before = counted.map(|e| (e.job.state, e.job.t_state()));
        let queue_before = counted.and_then(|e| e.job.queue()).map(Into::into);
        // What the job rules see of the job: a record that leaves it as it
        // was need not be shown to the engine.
        let view = (key.is_some() && self.alerting())
            .then(|| prior.and_then(|e| job_view(&e.job, e.exec_log())));
        let event_ts = match &record.body {
            Body::Event(ev) if ev.timestamp.is_finite() => Some(ev.timestamp),
            _ => None,
        };
        let fx = self.state.apply(cluster, record);
        if !fx.duplicate && self.alerting() {
            self.alert_on(cluster, key.as_ref(), view, event_ts, &fx, alerts);
        }
        let outcome = if fx.duplicate {
            Outcome::Repeat
        } else {
            Outcome::Applied
        };
        (
            outcome,
            Processed {
                key,
                before,
                queue_before,
                new_job,
                fx,
            },
        )
    }

    /// Show the engine what this record changed, after what came due
    /// before it.
    fn alert_on(
        &mut self,
        cluster: &str,
        key: Option<&JobKey>,
        view: Option<Option<JobView>>,
        event_ts: Option<f64>,
        fx: &Effects,
        out: &mut Vec<AlertEvent>,
    ) {
        // How far this record runs behind the cluster's event clock.
        let lag = match (self.clock, event_ts) {
            (Clock::Event, Some(ts)) => self.event_clock.advance(cluster, ts),
            _ => 0.0,
        };
        // What came due before this record goes first, in time order.
        if self.clock == Clock::Event {
            self.fire_due(out);
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
            && view != Some(job_view(&entry.job, entry.exec_log()))
        {
            observe_job(&mut self.alerts, entry, key, at, lag, out);
        }
        for (c, change) in &fx.rank_changes {
            observe_rank(&mut self.alerts, c, change, at, lag, out);
        }
    }

    /// Fire a batch of the alerts that are due.
    pub fn fire_due(&mut self, out: &mut Vec<AlertEvent>) {
        let jobs = &mut self.state.jobs;
        self.due = match self.clock {
            Clock::Wall => {
                let now = (self.wall)();
                self.alerts
                    .advance(|_| Some(now), self.fire_batch, jobs, out)
            }
            Clock::Event => {
                let clocks = &self.event_clock;
                self.alerts
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
            flips.push(DrainFlip {
                cluster,
                change,
                at,
            });
        }
        flips
    }

    /// At the end of a finite input: fire every alert whose condition has
    /// held its duration by its cluster's event clock.
    pub fn finish(&mut self, out: &mut Vec<AlertEvent>) {
        let clock = &self.event_clock;
        self.alerts
            .flush(|c| clock.now(c), &mut self.state.jobs, out);
    }
}

/// Tell the engine where a job stands now, from its entry (which keeps
/// its conditions). `at` is the time of the record just applied.
fn observe_job(
    engine: &mut Engine,
    entry: &mut JobEntry,
    key: &JobKey,
    at: f64,
    lag: f64,
    out: &mut Vec<AlertEvent>,
) {
    // One detail for every rule of the job, lent rather than copied into
    // each, and made only if one holds: this runs for every change of a
    // job's state.
    let detail = std::cell::OnceCell::new();
    let queue = entry.job.queue();
    // Only the rules that hold (one or two at a time): the others clear.
    // Those about other states, or other queues, cannot, and are not
    // looked at.
    let exec = entry.exec.as_deref();
    let holds: SmallVec<[(usize, HoldsLent); 2]> = engine
        .job_rules_in(entry.job.state)
        .filter(|(_, rule)| rule.watches_queue(queue))
        .filter_map(|(i, rule)| {
            job_condition(rule.kind, &entry.job, exec).map(|since| {
                let detail = detail.get_or_init(|| Detail::of_job(entry.job.state, queue));
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
                _ => Detail::Host(host),
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
}
