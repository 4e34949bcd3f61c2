//! Alert rules: what condition, held for how long, and when a condition
//! began for a given job or node. Pure: reads the model, never changes it.

use crate::flux::exec::ExecLog;
use crate::flux::job::{Job, JobState};
use crate::flux::resource::RankState;
use thiserror::Error;

/// What a rule watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// A job in this state.
    JobState(JobState),
    /// A prolog started and not finished.
    Prolog,
    /// An epilog started and not finished.
    Epilog,
    /// A job still in RUN past its expiration (`for` is the grace).
    Overrun,
    /// An exec eventlog with `complete` and no `done`.
    ExecIncomplete,
    NodeDrained,
    /// Offline and not drained (a drained node is expected to be down).
    NodeOffline,
    NodeTorpid,
    /// A feed (a source, for its cluster) that sent neither a record nor
    /// a heartbeat: measured on the wall clock by the feed watch.
    FeedSilent,
    /// The whole instance is down (`instance-down` until `restart`).
    InstanceDown,
}

impl RuleKind {
    pub const NAMES: [&'static str; 10] = [
        "job_state",
        "prolog",
        "epilog",
        "overrun",
        "exec_incomplete",
        "node_drained",
        "node_offline",
        "node_torpid",
        "feed_silent",
        "instance_down",
    ];

    pub fn name(self) -> &'static str {
        match self {
            RuleKind::JobState(_) => "job_state",
            RuleKind::Prolog => "prolog",
            RuleKind::Epilog => "epilog",
            RuleKind::Overrun => "overrun",
            RuleKind::ExecIncomplete => "exec_incomplete",
            RuleKind::NodeDrained => "node_drained",
            RuleKind::NodeOffline => "node_offline",
            RuleKind::NodeTorpid => "node_torpid",
            RuleKind::FeedSilent => "feed_silent",
            RuleKind::InstanceDown => "instance_down",
        }
    }

    /// Whether the rule concerns jobs.
    pub fn is_job(self) -> bool {
        matches!(
            self,
            RuleKind::JobState(_)
                | RuleKind::Prolog
                | RuleKind::Epilog
                | RuleKind::Overrun
                | RuleKind::ExecIncomplete
        )
    }

    /// Whether the rule concerns a whole cluster or its feed: kept by the
    /// feed watch on the wall clock, not by the keyed alert engine.
    pub fn is_cluster(self) -> bool {
        matches!(self, RuleKind::FeedSilent | RuleKind::InstanceDown)
    }

    /// Whether a job rule of this kind can hold for a job in `state`
    /// ([`job_condition`] is `None` for every other).
    pub fn can_hold_in(self, state: JobState) -> bool {
        if state == JobState::Inactive {
            return false;
        }
        match self {
            // A job reverted to PRIORITY is still waiting to be scheduled.
            RuleKind::JobState(JobState::Sched) => {
                matches!(state, JobState::Sched | JobState::Priority)
            }
            RuleKind::JobState(s) => s == state,
            RuleKind::Overrun => state == JobState::Run,
            RuleKind::Prolog | RuleKind::Epilog | RuleKind::ExecIncomplete => true,
            RuleKind::NodeDrained
            | RuleKind::NodeOffline
            | RuleKind::NodeTorpid
            | RuleKind::FeedSilent
            | RuleKind::InstanceDown => false,
        }
    }

    /// Build a kind from its config name and the `state` key.
    pub fn from_parts(kind: &str, state: Option<&str>) -> Result<Self, RuleError> {
        let simple = match kind {
            "job_state" => {
                let s = state.ok_or(RuleError::StateMissing)?;
                let st = JobState::ALL
                    .into_iter()
                    .find(|j| j.as_str().eq_ignore_ascii_case(s))
                    .ok_or_else(|| RuleError::UnknownState(s.to_string()))?;
                if !st.is_active() {
                    return Err(RuleError::UnknownState(s.to_string()));
                }
                return Ok(RuleKind::JobState(st));
            }
            "prolog" => RuleKind::Prolog,
            "epilog" => RuleKind::Epilog,
            "overrun" => RuleKind::Overrun,
            "exec_incomplete" => RuleKind::ExecIncomplete,
            "node_drained" => RuleKind::NodeDrained,
            "node_offline" => RuleKind::NodeOffline,
            "node_torpid" => RuleKind::NodeTorpid,
            "feed_silent" => RuleKind::FeedSilent,
            "instance_down" => RuleKind::InstanceDown,
            other => return Err(RuleError::UnknownKind(other.to_string())),
        };
        if state.is_some() {
            return Err(RuleError::StateNotAllowed(kind.to_string()));
        }
        Ok(simple)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RuleError {
    #[error(
        "unknown kind `{0}`; expected one of job_state, prolog, epilog, overrun, exec_incomplete, node_drained, node_offline, node_torpid, feed_silent, instance_down"
    )]
    UnknownKind(String),
    #[error("kind job_state needs a `state`")]
    StateMissing,
    #[error(
        "state `{0}` is not an active job state; expected DEPEND, PRIORITY, SCHED, RUN or CLEANUP"
    )]
    UnknownState(String),
    #[error("kind {0} takes no `state`")]
    StateNotAllowed(String),
    #[error("`{0}` is not a duration (examples: 90s, 10m, 24h, 7d, 1h30m, or seconds: 90)")]
    Duration(String),
    #[error("kind {0} is not about jobs: it takes no `queue`")]
    QueueNotAllowed(String),
    #[error("kind {0} is not about feeds: it takes no `sources`")]
    SourcesNotAllowed(String),
}

/// One alert rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The alert's name (`alertname`).
    pub name: String,
    pub kind: RuleKind,
    /// How long the condition must hold, in seconds.
    pub hold_secs: f64,
    /// The same, as written in the config, for messages.
    pub hold_text: String,
    pub severity: String,
    /// Job rules: the queues whose jobs it watches (none: every job).
    pub queues: Vec<String>,
    /// `feed_silent`: the sources it watches (none: every source that
    /// can carry heartbeats).
    pub sources: Vec<String>,
}

impl Rule {
    pub fn new(name: &str, kind: RuleKind, hold: &str, severity: &str) -> Result<Self, RuleError> {
        Ok(Rule {
            name: name.to_string(),
            kind,
            hold_secs: parse_duration(hold)?,
            hold_text: hold.trim().to_string(),
            severity: severity.to_string(),
            queues: Vec::new(),
            sources: Vec::new(),
        })
    }

    /// Watch only these sources' feeds (`feed_silent` only).
    pub fn for_sources(mut self, sources: Vec<String>) -> Result<Self, RuleError> {
        if !sources.is_empty() && self.kind != RuleKind::FeedSilent {
            return Err(RuleError::SourcesNotAllowed(self.kind.name().to_string()));
        }
        self.sources = sources;
        Ok(self)
    }

    /// Watch only the jobs of these queues (job rules only).
    pub fn for_queues(mut self, queues: Vec<String>) -> Result<Self, RuleError> {
        if !queues.is_empty() && !self.kind.is_job() {
            return Err(RuleError::QueueNotAllowed(self.kind.name().to_string()));
        }
        self.queues = queues;
        Ok(self)
    }

    /// Whether it watches a job of the queue `queue` reads (`None`: of no
    /// queue). Read only for a rule of some queues: a job's queue is in
    /// another allocation, often not in cache.
    pub fn watches_queue<'q>(&self, queue: impl FnOnce() -> Option<&'q str>) -> bool {
        self.queues.is_empty() || queue().is_some_and(|q| self.queues.iter().any(|w| w == q))
    }
}

/// Parse a duration like `90s`, `10m`, `24h`, `7d` or `1h30m` (a day is 24
/// hours), or plain seconds (`90`, `1.5`), into seconds.
pub fn parse_duration(text: &str) -> Result<f64, RuleError> {
    let err = || RuleError::Duration(text.to_string());
    // Plain seconds, as every `*_secs` key takes them.
    if let Ok(secs) = text.trim().parse::<f64>() {
        return if secs.is_finite() && secs >= 0.0 {
            Ok(secs)
        } else {
            Err(err())
        };
    }
    let span: jiff::Span = text.trim().parse().map_err(|_| err())?;
    let secs = span
        .total((
            jiff::Unit::Second,
            jiff::SpanRelativeTo::days_are_24_hours(),
        ))
        .map_err(|_| err())?;
    if secs.is_finite() && secs >= 0.0 {
        Ok(secs)
    } else {
        Err(err())
    }
}

/// The watchman's rules, on whatever other rules a config names: a feed
/// gone silent and an instance gone down page unless a config says
/// otherwise (a rule of the same kind replaces one of these).
pub fn default_cluster_rules() -> Vec<Rule> {
    [
        ("feed_silent", RuleKind::FeedSilent, "10m", "critical"),
        ("instance_down", RuleKind::InstanceDown, "1m", "critical"),
    ]
    .into_iter()
    .filter_map(|(name, kind, hold, sev)| Rule::new(name, kind, hold, sev).ok())
    .collect()
}

/// The rules a site starts with.
pub fn default_rules() -> Vec<Rule> {
    let table: [(&str, RuleKind, &str, &str); 11] = [
        (
            "depend_too_long",
            RuleKind::JobState(JobState::Depend),
            "7d",
            "warning",
        ),
        (
            "priority_too_long",
            RuleKind::JobState(JobState::Priority),
            "10m",
            "warning",
        ),
        (
            "sched_too_long",
            RuleKind::JobState(JobState::Sched),
            "24h",
            "warning",
        ),
        (
            "cleanup_too_long",
            RuleKind::JobState(JobState::Cleanup),
            "10m",
            "warning",
        ),
        ("prolog_too_long", RuleKind::Prolog, "30m", "warning"),
        ("epilog_too_long", RuleKind::Epilog, "30m", "warning"),
        ("job_overrun", RuleKind::Overrun, "10m", "warning"),
        (
            "exec_incomplete",
            RuleKind::ExecIncomplete,
            "10m",
            "warning",
        ),
        ("node_drained", RuleKind::NodeDrained, "24h", "info"),
        ("node_offline", RuleKind::NodeOffline, "10m", "critical"),
        ("node_torpid", RuleKind::NodeTorpid, "5m", "warning"),
    ];
    table
        .into_iter()
        .filter_map(|(name, kind, hold, sev)| Rule::new(name, kind, hold, sev).ok())
        .collect()
}

/// When `kind`'s condition began for this job, if it holds now.
pub fn job_condition(kind: RuleKind, job: &Job, exec: Option<&ExecLog>) -> Option<f64> {
    job_view(job, exec)?.condition(kind)
}

/// All that the job rules read of a job: where two views are equal,
/// every job rule holds or not alike, so a record that leaves the view as
/// it was need not be shown to the alert engine. Read once per change,
/// then asked by each rule ([`JobView::condition`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobView {
    state: JobState,
    t_state: Option<f64>,
    /// When it first entered SCHED, if it has gone back to PRIORITY since.
    sched_since: Option<f64>,
    prolog: Option<f64>,
    epilog: Option<f64>,
    expiration: Option<f64>,
    exec_complete: Option<f64>,
}

impl JobView {
    /// When `kind`'s condition began, if it holds now.
    pub fn condition(&self, kind: RuleKind) -> Option<f64> {
        match kind {
            RuleKind::JobState(s) if self.state == s => self.t_state,
            // SCHED → PRIORITY → SCHED (urgency, jobspec-update,
            // flux-restart) leaves a job waiting all along: the SCHED rule
            // neither resolves nor starts over (t_sched keeps the first
            // entry).
            RuleKind::JobState(JobState::Sched) => self.sched_since,
            RuleKind::Prolog => self.prolog,
            RuleKind::Epilog => self.epilog,
            // The condition "running past the expiration" begins at the
            // expiration; the rule's duration is the grace after it.
            RuleKind::Overrun if self.state == JobState::Run => self.expiration,
            RuleKind::ExecIncomplete => self.exec_complete,
            _ => None,
        }
    }
}

/// The view of a job the rules can hold for; `None` for one they cannot
/// (not submitted, invalid or INACTIVE).
pub fn job_view(job: &Job, exec: Option<&ExecLog>) -> Option<JobView> {
    if !job.submitted || job.invalidated || job.state == JobState::Inactive {
        return None;
    }
    let (prolog, epilog) = job.perilogs_since();
    Some(JobView {
        state: job.state,
        t_state: job.t_state(),
        sched_since: job
            .reverted_to_priority()
            .then(|| job.t_sched.get())
            .flatten(),
        prolog,
        epilog,
        expiration: job.expiration.get(),
        exec_complete: exec
            .filter(|x| !x.done())
            .and_then(|x| x.complete_timestamp()),
    })
}

/// Whether `kind`'s condition holds for this rank, and since when if the
/// rank says (a drain carries its time; online and torpid do not, so the
/// caller uses the time of the event that changed them).
pub fn node_condition(kind: RuleKind, rank: &RankState) -> Option<Option<f64>> {
    match kind {
        RuleKind::NodeDrained if rank.drained => Some(rank.drain_timestamp),
        RuleKind::NodeOffline if rank.online == Some(false) && !rank.drained && !rank.excluded => {
            Some(None)
        }
        RuleKind::NodeTorpid if rank.torpid => Some(None),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_node_of_unknown_liveness_is_not_offline() {
        let mut r = RankState::new(1);
        assert_eq!(node_condition(RuleKind::NodeOffline, &r), None);
        r.online = Some(false);
        assert_eq!(node_condition(RuleKind::NodeOffline, &r), Some(None));
        r.online = None; // the instance went down
        assert_eq!(node_condition(RuleKind::NodeOffline, &r), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(90.0));
        assert_eq!(parse_duration("10m"), Ok(600.0));
        assert_eq!(parse_duration(" 24h "), Ok(86400.0));
        assert_eq!(parse_duration("7d"), Ok(7.0 * 86400.0));
        assert_eq!(parse_duration("1h30m"), Ok(5400.0));
        assert_eq!(parse_duration("1.5s"), Ok(1.5));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-5m").is_err());
        assert_eq!(parse_duration("90"), Ok(90.0));
        assert_eq!(parse_duration(" 1.5 "), Ok(1.5));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("inf").is_err());
    }

    /// What `Engine` leaves out for a job's state never holds in it: every
    /// condition of a job is set, in every state, and each kind that holds
    /// is one said to be able to.
    #[test]
    fn a_rule_that_cannot_hold_in_a_state_never_does() {
        let kinds = JobState::ALL.map(RuleKind::JobState).into_iter().chain([
            RuleKind::Prolog,
            RuleKind::Epilog,
            RuleKind::Overrun,
            RuleKind::ExecIncomplete,
            RuleKind::NodeDrained,
            RuleKind::NodeOffline,
            RuleKind::NodeTorpid,
            RuleKind::FeedSilent,
            RuleKind::InstanceDown,
        ]);
        let kinds: Vec<RuleKind> = kinds.collect();
        let mut held = 0;
        for state in JobState::ALL {
            let mut entry = crate::keyed::state::JobEntry::default();
            let job = &mut entry.job;
            job.submitted = true;
            job.state = state;
            job.set_every_time(100.0);
            let complete = crate::flux::Event::new(101.0, "complete")
                .with_context(serde_json::json!({"status": 0}));
            entry.exec_log_mut().apply(&complete);
            for &kind in &kinds {
                let holds = job_condition(kind, &entry.job, entry.exec_log()).is_some();
                assert!(!holds || kind.can_hold_in(state), "{kind:?} in {state:?}");
                held += usize::from(holds);
            }
        }
        assert!(held > 20, "conditions were set: {held} held");
    }

    #[test]
    fn kinds_from_config_names() {
        assert_eq!(
            RuleKind::from_parts("job_state", Some("sched")),
            Ok(RuleKind::JobState(JobState::Sched))
        );
        assert_eq!(
            RuleKind::from_parts("job_state", Some("INACTIVE")),
            Err(RuleError::UnknownState("INACTIVE".into()))
        );
        assert_eq!(
            RuleKind::from_parts("job_state", None),
            Err(RuleError::StateMissing)
        );
        assert!(matches!(
            RuleKind::from_parts("prolog", Some("RUN")),
            Err(RuleError::StateNotAllowed(_))
        ));
        for name in RuleKind::NAMES {
            let state = (name == "job_state").then_some("RUN");
            assert_eq!(
                RuleKind::from_parts(name, state).map(|k| k.name()),
                Ok(name)
            );
        }
        assert_eq!(default_rules().len(), 11);
    }

    /// A job's life as flux-core writes it (job and exec events, in
    /// order), with events dropped, repeated out of place and given times
    /// that may go back: what the job rules react to, right and wrong.
    fn job_records() -> impl Strategy<Value = Vec<crate::decode::Record>> {
        use crate::decode::{Body, EventStream, Record};
        use crate::flux::event::Event;
        use crate::flux::jobid::JobId;
        use serde_json::json;
        let life = [
            (
                EventStream::Job,
                "submit",
                json!({"userid": 1, "urgency": 16, "flags": 0, "version": 1}),
            ),
            (EventStream::Job, "validate", json!({})),
            (EventStream::Job, "depend", json!({})),
            (EventStream::Job, "priority", json!({"priority": 5})),
            (EventStream::Job, "alloc", json!({})),
            (
                EventStream::Job,
                "prolog-start",
                json!({"description": "p"}),
            ),
            (EventStream::Exec, "init", json!({})),
            (
                EventStream::Job,
                "prolog-finish",
                json!({"description": "p", "status": 0}),
            ),
            (EventStream::Exec, "starting", json!({})),
            (EventStream::Job, "start", json!({})),
            (
                EventStream::Job,
                "resource-update",
                json!({"expiration": 30.0}),
            ),
            (EventStream::Exec, "complete", json!({"status": 0})),
            (
                EventStream::Job,
                "exception",
                json!({"type": "cancel", "severity": 0, "note": ""}),
            ),
            (EventStream::Job, "finish", json!({"status": 0})),
            (
                EventStream::Job,
                "epilog-start",
                json!({"description": "e"}),
            ),
            (
                EventStream::Job,
                "release",
                json!({"ranks": "all", "final": true}),
            ),
            (
                EventStream::Job,
                "epilog-finish",
                json!({"description": "e", "status": 0}),
            ),
            (EventStream::Exec, "done", json!({})),
            (EventStream::Job, "free", json!({})),
            (EventStream::Job, "clean", json!({})),
        ];
        let n = life.len();
        // Per step of the life: kept or not, and a time offset; then
        // events of the life replayed at random places.
        (
            prop::collection::vec((prop::bool::weighted(0.85), -2i32..3), n),
            prop::collection::vec((0..n, 0..n, 0i32..40), 0..4),
        )
            .prop_map(move |(steps, extra)| {
                let record = |i: usize, t: i32| {
                    let (stream, name, ctx) = &life[i];
                    Record {
                        cluster: None,
                        stream: *stream,
                        id: Some(JobId(7)),
                        body: Body::Event(
                            Event::new(f64::from(t.max(1)), *name).with_context(ctx.clone()),
                        ),
                    }
                };
                let mut out: Vec<Record> = steps
                    .iter()
                    .enumerate()
                    .filter(|(_, (keep, _))| *keep)
                    .map(|(i, (_, dt))| record(i, 10 * (i as i32 + 1) + dt))
                    .collect();
                for (at, which, t) in extra {
                    out.insert(at.min(out.len()), record(which, t));
                }
                out
            })
    }

    proptest! {
        /// The shard skips the alert engine for a record that leaves a job's
        /// view as it was: that is only right if every job rule's condition
        /// is a function of the view.
        #[test]
        fn job_rules_read_nothing_beyond_the_view(records in job_records()) {
            use crate::keyed::JobKey;
            use crate::keyed::state::State;
            use crate::flux::jobid::JobId;
            let key = JobKey { cluster: "c".into(), id: JobId(7) };
            let kinds: Vec<RuleKind> = JobState::ALL
                .iter()
                .map(|s| RuleKind::JobState(*s))
                .chain([RuleKind::Prolog, RuleKind::Epilog, RuleKind::Overrun, RuleKind::ExecIncomplete])
                .collect();
            let conditions = |st: &State| -> Vec<Option<f64>> {
                kinds.iter().map(|k| st.jobs.get(&key).and_then(|e| job_condition(*k, &e.job, e.exec_log()))).collect()
            };
            let mut st = State::new();
            for r in records {
                let view = st.jobs.get(&key).and_then(|e| job_view(&e.job, e.exec_log()));
                let before = conditions(&st);
                let state_before = st.jobs.get(&key).map(|e| e.job.state);
                st.apply("c", r);
                if st.jobs.get(&key).and_then(|e| job_view(&e.job, e.exec_log())) == view {
                    prop_assert_eq!(conditions(&st), before);
                    if view.is_some() {
                        prop_assert_eq!(st.jobs.get(&key).map(|e| e.job.state), state_before);
                    }
                }
            }
        }

        #[test]
        fn duration_parsing_never_panics(s in "\\PC{0,20}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn durations_round_trip(h in 0u32..1000, m in 0u32..60, sec in 0u32..60) {
            let text = format!("{h}h{m}m{sec}s");
            prop_assert_eq!(parse_duration(&text), Ok(f64::from(h * 3600 + m * 60 + sec)));
        }
    }
}
