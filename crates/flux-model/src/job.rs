//! RFC 21: the job state machine, with flux-core's semantics
//! (job-manager `event.c` for transitions, job-list `job_state.c` for the
//! summary that `flux jobs` shows).

use super::anomaly::{Anomaly, AnomalyKind, Stream};
use super::event::{ContextError, Event};
use super::hostlist::Hostlist;
use super::idset::{IdSet, Ranks};
use super::jobspec::{JobSpec, Text};
use super::object::{self, JsonObject};
use super::packed::{OptInt, Stamp};
use super::resource::bounded_idset;
use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use thin_vec::ThinVec;

/// RFC 21 job states.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum JobState {
    #[default]
    New,
    Depend,
    Priority,
    Sched,
    Run,
    Cleanup,
    Inactive,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::New,
        JobState::Depend,
        JobState::Priority,
        JobState::Sched,
        JobState::Run,
        JobState::Cleanup,
        JobState::Inactive,
    ];

    /// The state's place in [`JobState::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::New => "NEW",
            JobState::Depend => "DEPEND",
            JobState::Priority => "PRIORITY",
            JobState::Sched => "SCHED",
            JobState::Run => "RUN",
            JobState::Cleanup => "CLEANUP",
            JobState::Inactive => "INACTIVE",
        }
    }

    /// RFC 21 virtual state ACTIVE: DEPEND through CLEANUP.
    pub fn is_active(self) -> bool {
        !matches!(self, JobState::New | JobState::Inactive)
    }

    /// RFC 21 virtual state PENDING: DEPEND, PRIORITY or SCHED.
    pub fn is_pending(self) -> bool {
        matches!(
            self,
            JobState::Depend | JobState::Priority | JobState::Sched
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of an inactive job, as job-list computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum JobResult {
    Completed,
    Failed,
    Canceled,
    Timeout,
}

impl JobResult {
    pub fn as_str(self) -> &'static str {
        match self {
            JobResult::Completed => "COMPLETED",
            JobResult::Failed => "FAILED",
            JobResult::Canceled => "CANCELED",
            JobResult::Timeout => "TIMEOUT",
        }
    }
}

impl fmt::Display for JobResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The job's recorded exception: the most severe one seen (the first wins
/// ties), as job-list keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobException {
    pub kind: String,
    pub severity: i64,
    pub note: String,
}

/// A state change caused by one event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    pub from: JobState,
    pub to: JobState,
    pub timestamp: f64,
}

/// What applying one event did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    pub transition: Option<Transition>,
    pub anomalies: Vec<Anomaly>,
    /// The event was already applied (an at-least-once repeat) and was skipped.
    pub duplicate: bool,
}

/// One job, rebuilt from its primary eventlog (RFC 21).
///
/// Saved as it was before [`Rare`] moved out ([`JobWire`]): checkpoints of
/// either layout read alike.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Job {
    pub state: JobState,
    /// A `submit` event has been applied: before it, the job does not exist.
    pub submitted: bool,
    /// The submission was invalidated: flux-core removes such a job entirely.
    pub invalidated: bool,
    /// A severity-0 exception was raised.
    pub fatal_exception: bool,
    pub started: bool,
    pub released_final: bool,
    pub freed: bool,
    /// The submit event had no `version` (flux-core before 0.41).
    pub unversioned: bool,
    /// The three optional integers in 8 bytes each ([`OptInt`]), read
    /// through [`Job::userid`] and the like: a million jobs, 24 MB.
    userid: OptInt,
    urgency: OptInt,
    /// Known while the job has been in SCHED since its last fall back to
    /// PRIORITY, as job-list reports it.
    priority: OptInt,
    pub t_submit: Stamp,
    pub t_depend: Stamp,
    pub t_priority: Stamp,
    pub t_sched: Stamp,
    pub t_run: Stamp,
    /// From R (`execution.expiration`) and `resource-update` events.
    pub expiration: Stamp,
    /// Timestamps of applied events, to skip repeats (Flux timestamps are
    /// unique and increasing within one eventlog), but for those a state
    /// time holds: each state time is the timestamp of the event that
    /// entered the state, so a job that has only entered its states (most
    /// pending jobs) keeps none here. Kept sorted.
    /// Thin: one pointer in the entry, no allocation while empty.
    applied: ThinVec<f64>,
    /// The ranks R allocated to it (`execution.R_lite[].rank`), as the
    /// ranges of an idset: what it holds from `alloc` to `free`. Thin: no
    /// allocation for jobs without R.
    ranks: ThinVec<(u32, u32)>,
    /// What it asked for and was given (jobspec and R): boxed, one
    /// allocation of the values kept, not the jobspec.
    pub spec: Option<Box<JobSpec>>,
    /// What few jobs hold, or hold only near their end: none while all of
    /// it is unset ([`Job::apply`] gives the box back once it is).
    rare: Option<Box<Rare>>,
}

/// What a job holds only sometimes: submit flags, an exception,
/// dependencies, prologs and epilogs running, and what its end leaves (the
/// wait status, the CLEANUP and INACTIVE times). Apart from [`Job`], so
/// that a pending or running job's entry keeps to a smaller allocation
/// class (72 bytes here, in the 80-byte class, against 64 in every entry).
#[derive(Debug, Clone, Default, PartialEq)]
struct Rare {
    flags: i64,
    t_cleanup: Stamp,
    t_inactive: Stamp,
    /// The `finish` wait status.
    waitstatus: OptInt,
    /// Boxed: most jobs that hold a `Rare` have none.
    exception: Option<Box<JobException>>,
    /// Outstanding dependencies, in the order they were added.
    dependencies: ThinVec<String>,
    /// Prolog and epilog actions started and not yet finished.
    prologs_active: u32,
    epilogs_active: u32,
    /// When the oldest prolog (epilog) still running started.
    prolog_since: Stamp,
    epilog_since: Stamp,
}

/// The size of a job's rare parts when it holds them (for the README's
/// table of what a job costs).
pub const RARE_BYTES: usize = std::mem::size_of::<Rare>();

/// Whether a state time is this timestamp, bit for bit (as
/// `f64::total_cmp` tells timestamps apart).
fn same_time(time: Stamp, ts: f64) -> bool {
    time.get().is_some_and(|t| t.to_bits() == ts.to_bits())
}

/// What a job without a [`Rare`] reads: nothing set.
static NO_RARE: Rare = Rare {
    flags: 0,
    t_cleanup: Stamp::NONE,
    t_inactive: Stamp::NONE,
    waitstatus: OptInt::NONE,
    exception: None,
    dependencies: ThinVec::new(),
    prologs_active: 0,
    epilogs_active: 0,
    prolog_since: Stamp::NONE,
    epilog_since: Stamp::NONE,
};

/// A job as checkpoints and changelogs hold it: the fields in the order
/// they had while [`Job`] held them all, read back into the split layout.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize, Clone))]
#[serde(rename = "Job")]
struct JobWire {
    state: JobState,
    submitted: bool,
    invalidated: bool,
    userid: OptInt,
    urgency: OptInt,
    priority: OptInt,
    flags: i64,
    t_submit: Stamp,
    t_depend: Stamp,
    t_priority: Stamp,
    t_sched: Stamp,
    t_run: Stamp,
    t_cleanup: Stamp,
    t_inactive: Stamp,
    waitstatus: OptInt,
    exception: Option<Box<JobException>>,
    fatal_exception: bool,
    dependencies: ThinVec<String>,
    expiration: Stamp,
    prologs_active: u32,
    epilogs_active: u32,
    prolog_since: Stamp,
    epilog_since: Stamp,
    started: bool,
    released_final: bool,
    freed: bool,
    unversioned: bool,
    applied: ThinVec<f64>,
    /// Added later, with a default: older checkpoints read as before.
    #[serde(default)]
    ranks: ThinVec<(u32, u32)>,
    #[serde(default)]
    spec: Option<Box<JobSpec>>,
}

/// [`JobWire`] lent from a job, to save it without a copy.
#[derive(Serialize)]
#[serde(rename = "Job")]
struct JobWireRef<'a> {
    state: JobState,
    submitted: bool,
    invalidated: bool,
    userid: OptInt,
    urgency: OptInt,
    priority: OptInt,
    flags: i64,
    t_submit: Stamp,
    t_depend: Stamp,
    t_priority: Stamp,
    t_sched: Stamp,
    t_run: Stamp,
    t_cleanup: Stamp,
    t_inactive: Stamp,
    waitstatus: OptInt,
    exception: Option<&'a JobException>,
    fatal_exception: bool,
    dependencies: &'a [String],
    expiration: Stamp,
    prologs_active: u32,
    epilogs_active: u32,
    prolog_since: Stamp,
    epilog_since: Stamp,
    started: bool,
    released_final: bool,
    freed: bool,
    unversioned: bool,
    applied: AppliedWire<'a>,
    ranks: &'a [(u32, u32)],
    spec: Option<&'a JobSpec>,
}

/// Every applied event's timestamp, ascending, as checkpoints hold them:
/// the state times and the others kept apart ([`Job::applied`]), merged.
struct AppliedWire<'a> {
    /// The state times set, ascending, each once (an unversioned job's
    /// DEPEND time is its submit time).
    times: [f64; 7],
    set: usize,
    rest: &'a [f64],
}

impl AppliedWire<'_> {
    /// No timestamp is in both lists: the others never hold what a state
    /// time does (an event's is kept only if no state time holds it, and a
    /// restore takes them out). Were one in both, it would be written
    /// twice, and the count would still match.
    fn len(&self) -> usize {
        self.set + self.rest.len()
    }

    fn merged(&self) -> impl Iterator<Item = f64> + '_ {
        let mut a = self.times[..self.set].iter().copied().peekable();
        let mut b = self.rest.iter().copied().peekable();
        std::iter::from_fn(move || match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.total_cmp(y).is_le() => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, _) => b.next(),
        })
    }
}

impl Serialize for AppliedWire<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        // Counted first: MessagePack writes the length ahead.
        let mut seq = s.serialize_seq(Some(self.len()))?;
        if self.rest.is_empty() {
            // Nothing kept apart (most pending jobs): the state times alone.
            for t in &self.times[..self.set] {
                seq.serialize_element(t)?;
            }
        } else {
            for t in self.merged() {
                seq.serialize_element(&t)?;
            }
        }
        seq.end()
    }
}

impl Serialize for Job {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.rare();
        JobWireRef {
            state: self.state,
            submitted: self.submitted,
            invalidated: self.invalidated,
            userid: self.userid,
            urgency: self.urgency,
            priority: self.priority,
            flags: r.flags,
            t_submit: self.t_submit,
            t_depend: self.t_depend,
            t_priority: self.t_priority,
            t_sched: self.t_sched,
            t_run: self.t_run,
            t_cleanup: r.t_cleanup,
            t_inactive: r.t_inactive,
            waitstatus: r.waitstatus,
            exception: r.exception.as_deref(),
            fatal_exception: self.fatal_exception,
            dependencies: &r.dependencies,
            expiration: self.expiration,
            prologs_active: r.prologs_active,
            epilogs_active: r.epilogs_active,
            prolog_since: r.prolog_since,
            epilog_since: r.epilog_since,
            started: self.started,
            released_final: self.released_final,
            freed: self.freed,
            unversioned: self.unversioned,
            applied: self.applied_wire(),
            ranks: &self.ranks,
            spec: self.spec.as_deref(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Job {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = JobWire::deserialize(d)?;
        let mut job = Job {
            state: w.state,
            submitted: w.submitted,
            invalidated: w.invalidated,
            fatal_exception: w.fatal_exception,
            started: w.started,
            released_final: w.released_final,
            freed: w.freed,
            unversioned: w.unversioned,
            userid: w.userid,
            urgency: w.urgency,
            priority: w.priority,
            t_submit: w.t_submit,
            t_depend: w.t_depend,
            t_priority: w.t_priority,
            t_sched: w.t_sched,
            t_run: w.t_run,
            expiration: w.expiration,
            applied: ThinVec::new(),
            ranks: w.ranks,
            spec: w.spec,
            rare: None,
        };
        let rare = Rare {
            flags: w.flags,
            t_cleanup: w.t_cleanup,
            t_inactive: w.t_inactive,
            waitstatus: w.waitstatus,
            exception: w.exception,
            dependencies: w.dependencies,
            prologs_active: w.prologs_active,
            epilogs_active: w.epilogs_active,
            prolog_since: w.prolog_since,
            epilog_since: w.epilog_since,
        };
        if rare != NO_RARE {
            job.rare = Some(Box::new(rare));
        }
        // What a state time holds is not kept twice (checkpoints hold
        // every applied timestamp).
        let times = job.state_times();
        let apart = |t: &f64| !times.iter().any(|s| same_time(*s, *t));
        job.applied = if w.applied.iter().all(apart) {
            w.applied
        } else {
            w.applied.into_iter().filter(apart).collect()
        };
        Ok(job)
    }
}

fn anomaly(kind: AnomalyKind, ev: &Event, message: impl Into<String>) -> Anomaly {
    Anomaly::new(Stream::Job, kind, message).at(&ev.name, ev.timestamp)
}

fn context_anomaly(ev: &Event, err: ContextError) -> Anomaly {
    let kind = match err {
        ContextError::Missing(_) => AnomalyKind::MissingContext,
        ContextError::WrongType { .. } => AnomalyKind::InvalidContext,
    };
    anomaly(kind, ev, format!("{} event: {err}", ev.name))
}

/// A `prolog-finish` or `epilog-finish`: it needs a description and a
/// status, and closes one started action.
fn finish_action(ev: &Event, active: &mut u32, what: &str, anomalies: &mut Vec<Anomaly>) {
    let values = ev.values(["description", "status"]);
    for err in [values.str("description").err(), values.int("status").err()]
        .into_iter()
        .flatten()
    {
        anomalies.push(context_anomaly(ev, err));
    }
    if *active == 0 {
        anomalies.push(anomaly(
            AnomalyKind::UnexpectedEvent,
            ev,
            format!("{what}-finish with no {what} started"),
        ));
    } else {
        *active -= 1;
    }
}

impl Job {
    pub fn new() -> Self {
        Job::default()
    }

    #[inline]
    fn rare(&self) -> &Rare {
        self.rare.as_deref().unwrap_or(&NO_RARE)
    }

    #[inline]
    fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_default()
    }

    /// Give back the [`Rare`] box once nothing in it is set (a prolog or an
    /// epilog finished, a dependency removed: the only events that unset
    /// what they set): a job compares equal to its saved and restored
    /// copy, which keeps none.
    fn tidy_rare(&mut self) {
        if self.rare.as_deref().is_some_and(|r| *r == NO_RARE) {
            self.rare = None;
        }
    }

    /// The submit event's flags.
    #[inline]
    pub fn flags(&self) -> i64 {
        self.rare().flags
    }

    /// When it entered CLEANUP.
    #[inline]
    pub fn t_cleanup(&self) -> Option<f64> {
        self.rare().t_cleanup.get()
    }

    /// When it became INACTIVE.
    #[inline]
    pub fn t_inactive(&self) -> Option<f64> {
        self.rare().t_inactive.get()
    }

    /// Its recorded exception, if any (see [`JobException`]).
    #[inline]
    pub fn exception(&self) -> Option<&JobException> {
        self.rare().exception.as_deref()
    }

    /// Outstanding dependencies, in the order they were added.
    #[inline]
    pub fn dependencies(&self) -> &[String] {
        &self.rare().dependencies
    }

    /// Prolog actions started and not yet finished.
    #[inline]
    pub fn prologs_active(&self) -> u32 {
        self.rare().prologs_active
    }

    /// Epilog actions started and not yet finished.
    #[inline]
    pub fn epilogs_active(&self) -> u32 {
        self.rare().epilogs_active
    }

    /// When the oldest prolog still running started.
    #[inline]
    pub fn prolog_since(&self) -> Option<f64> {
        self.rare().prolog_since.get()
    }

    /// When the oldest epilog still running started.
    #[inline]
    pub fn epilog_since(&self) -> Option<f64> {
        self.rare().epilog_since.get()
    }

    /// Both: when the oldest prolog and the oldest epilog still running
    /// started.
    #[inline]
    pub fn perilogs_since(&self) -> (Option<f64>, Option<f64>) {
        let r = self.rare();
        (r.prolog_since.get(), r.epilog_since.get())
    }

    /// Set every time the job keeps (state times, prolog and epilog
    /// starts, expiration) to `t`, whatever its state: for tests of what
    /// reads them. Not for a job that will apply events: the times it
    /// replaces are not kept as applied.
    #[doc(hidden)]
    pub fn set_every_time(&mut self, t: f64) {
        for slot in [
            &mut self.t_submit,
            &mut self.t_depend,
            &mut self.t_priority,
            &mut self.t_sched,
            &mut self.t_run,
            &mut self.expiration,
        ] {
            slot.set(t);
        }
        let r = self.rare_mut();
        for slot in [
            &mut r.t_cleanup,
            &mut r.t_inactive,
            &mut r.prolog_since,
            &mut r.epilog_since,
        ] {
            slot.set(t);
        }
    }

    /// The time the job entered its current state.
    #[inline]
    pub fn t_state(&self) -> Option<f64> {
        match self.state {
            JobState::New => self.t_submit,
            JobState::Depend => self.t_depend,
            JobState::Priority => self.t_priority,
            JobState::Sched => self.t_sched,
            JobState::Run => self.t_run,
            JobState::Cleanup => self.rare().t_cleanup,
            JobState::Inactive => self.rare().t_inactive,
        }
        .get()
    }

    /// The times of the states entered (none for those not entered).
    fn state_times(&self) -> [Stamp; 7] {
        let r = self.rare();
        [
            self.t_submit,
            self.t_depend,
            self.t_priority,
            self.t_sched,
            self.t_run,
            r.t_cleanup,
            r.t_inactive,
        ]
    }

    /// Whether an event of this timestamp was applied (a state time holds
    /// it, or the others do), and the last timestamp applied: one pass
    /// over the state times, and a search of the others only for a
    /// timestamp not after the last of them.
    #[inline]
    fn applied_probe(&self, ts: f64) -> (bool, Option<f64>) {
        let bits = ts.to_bits();
        let mut seen = false;
        let mut last = self.applied.last().copied();
        for t in self.state_times() {
            if let Some(t) = t.get() {
                seen |= t.to_bits() == bits;
                if last.is_none_or(|l| t.total_cmp(&l).is_gt()) {
                    last = Some(t);
                }
            }
        }
        if !seen
            && let Some(&kept) = self.applied.last()
            && kept.total_cmp(&ts).is_ge()
        {
            seen = self.applied.binary_search_by(|t| t.total_cmp(&ts)).is_ok();
        }
        (seen, last)
    }

    /// Note an applied event's timestamp, unless a state time holds it.
    fn note_applied(&mut self, ts: f64) {
        if !self.state_times().iter().any(|t| same_time(*t, ts)) {
            self.keep_applied(ts);
        }
    }

    /// Keep an applied event's timestamp with the others (in order: most
    /// often last).
    fn keep_applied(&mut self, ts: f64) {
        match self.applied.last() {
            Some(l) if l.total_cmp(&ts).is_ge() => {
                if let Err(pos) = self.applied.binary_search_by(|t| t.total_cmp(&ts)) {
                    self.applied.insert(pos, ts);
                }
            }
            _ => self.applied.push(ts),
        }
    }

    fn applied_wire(&self) -> AppliedWire<'_> {
        let mut times = [0.0; 7];
        let mut set = 0;
        for t in self.state_times().iter().filter_map(|t| t.get()) {
            times[set] = t;
            set += 1;
        }
        let times_set = &mut times[..set];
        times_set.sort_unstable_by(f64::total_cmp);
        // Each once (sorted, so repeats are neighbours).
        let mut unique = 0;
        for i in 0..set {
            if unique == 0 || times[unique - 1].to_bits() != times[i].to_bits() {
                times[unique] = times[i];
                unique += 1;
            }
        }
        let set = unique;
        AppliedWire {
            times,
            set,
            rest: &self.applied,
        }
    }

    /// The timestamp of the last event applied.
    pub fn last_timestamp(&self) -> Option<f64> {
        self.state_times()
            .iter()
            .filter_map(|t| t.get())
            .chain(self.applied.last().copied())
            .max_by(f64::total_cmp)
    }

    /// How many events have been applied.
    pub fn events_applied(&self) -> usize {
        self.applied_wire().len()
    }

    /// `success`: finished with status 0 and no fatal exception.
    pub fn success(&self) -> Option<bool> {
        if self.state != JobState::Inactive {
            return None;
        }
        Some(self.rare().waitstatus.get() == Some(0) && !self.fatal_exception)
    }

    /// The job's result once it is inactive.
    pub fn result(&self) -> Option<JobResult> {
        if self.state != JobState::Inactive {
            return None;
        }
        if self.success() == Some(true) {
            return Some(JobResult::Completed);
        }
        Some(match self.exception().map(|e| e.kind.as_str()) {
            Some("cancel") => JobResult::Canceled,
            Some("timeout") => JobResult::Timeout,
            _ => JobResult::Failed,
        })
    }

    /// job-list's `returncode`: the exit code, or minus the terminating
    /// signal; -128 for a job canceled before it ran; 1 for any other job
    /// that failed without a finish status.
    pub fn returncode(&self) -> Option<i64> {
        if let Some(status) = self.rare().waitstatus.get() {
            let sig = status & 0x7f;
            return Some(if sig == 0 { (status >> 8) & 0xff } else { -sig });
        }
        match self.result()? {
            JobResult::Canceled => Some(-128),
            JobResult::Completed => Some(0),
            _ => Some(1),
        }
    }

    /// Apply one event of the job's primary eventlog.
    pub fn apply(&mut self, ev: &Event) -> Applied {
        let mut out = Applied::default();
        // The journal's `annotations` event describes the scheduler's view and
        // may carry a timestamp slightly before the `alloc` it accompanies:
        // keep it out of the ordering and repeat checks.
        let journal_only = ev.name == "annotations";
        if !journal_only {
            let (seen, last) = self.applied_probe(ev.timestamp);
            if seen {
                out.duplicate = true;
                return out;
            }
            if let Some(last) = last
                && last.total_cmp(&ev.timestamp).is_gt()
            {
                out.anomalies.push(anomaly(
                    AnomalyKind::OutOfOrder,
                    ev,
                    format!(
                        "timestamp {} is earlier than an event already applied ({last})",
                        ev.timestamp,
                    ),
                ));
            }
            if !self.submitted && ev.name != "submit" {
                out.anomalies.push(anomaly(
                    AnomalyKind::UnknownTarget,
                    ev,
                    "event for a job with no submit event; ignored",
                ));
                return out;
            }
        }
        let before = self.state;
        if self.state == JobState::Inactive && !journal_only {
            out.anomalies.push(anomaly(
                AnomalyKind::UnexpectedEvent,
                ev,
                "event after the job became INACTIVE; ignored",
            ));
            self.note_applied(ev.timestamp);
            return out;
        }
        self.dispatch(ev, &mut out.anomalies);
        // After the event: if it set a state time, that time holds it (the
        // time of the state it entered, the only one it can have set).
        if !journal_only && self.t_state().map(f64::to_bits) != Some(ev.timestamp.to_bits()) {
            self.keep_applied(ev.timestamp);
        }
        if self.state != before {
            out.transition = Some(Transition {
                from: before,
                to: self.state,
                timestamp: ev.timestamp,
            });
        }
        out
    }

    fn enter(&mut self, state: JobState, ts: f64) {
        self.state = state;
        // SCHED can be entered again (after a reversion to PRIORITY): as
        // flux-core's job-list, keep the first time, so a job reverted by
        // an urgency change or a restart is still waiting since then.
        if state == JobState::Sched && self.t_sched.get().is_some() {
            return;
        }
        let slot = match state {
            JobState::New => &mut self.t_submit,
            JobState::Depend => &mut self.t_depend,
            JobState::Priority => &mut self.t_priority,
            JobState::Sched => &mut self.t_sched,
            JobState::Run => &mut self.t_run,
            JobState::Cleanup => &mut self.rare_mut().t_cleanup,
            JobState::Inactive => &mut self.rare_mut().t_inactive,
        };
        let old = slot.get();
        slot.set(ts);
        // A state entered again (PRIORITY, after a reversion): the time
        // it replaces was an applied event's, now kept with the others.
        if let Some(old) = old {
            self.note_applied(old);
        }
    }

    /// Whether the job went back from SCHED to PRIORITY and is still
    /// there: pending all along.
    pub fn reverted_to_priority(&self) -> bool {
        self.state == JobState::Priority && self.t_sched.get().is_some()
    }

    /// Fall back from SCHED to PRIORITY (urgency, jobspec-update, flux-restart).
    fn revert_to_priority(&mut self, ts: f64) {
        if self.state == JobState::Sched {
            self.priority.clear();
            self.enter(JobState::Priority, ts);
        }
    }

    fn expect_state(&self, ev: &Event, allowed: &[JobState], anomalies: &mut Vec<Anomaly>) -> bool {
        if allowed.contains(&self.state) {
            return true;
        }
        anomalies.push(anomaly(
            AnomalyKind::UnexpectedEvent,
            ev,
            format!("{} event in state {}", ev.name, self.state),
        ));
        false
    }

    // `expect_state` records an anomaly when the state is wrong; as a match
    // guard that side effect would hide, so the checks stay in the arms.
    #[allow(clippy::collapsible_match)]
    fn dispatch(&mut self, ev: &Event, anomalies: &mut Vec<Anomaly>) {
        let ts = ev.timestamp;
        match ev.name.as_str() {
            "submit" => self.on_submit(ev, anomalies),
            "validate" => {
                if self.expect_state(ev, &[JobState::New], anomalies) {
                    self.enter(JobState::Depend, ts);
                }
            }
            "invalidate" => {
                if self.expect_state(ev, &[JobState::New], anomalies) {
                    self.invalidated = true;
                }
            }
            "depend" => {
                if self.unversioned && self.state == JobState::New {
                    self.t_depend = self.t_submit;
                    self.enter(JobState::Priority, ts);
                } else if self.expect_state(ev, &[JobState::Depend], anomalies) {
                    self.enter(JobState::Priority, ts);
                }
            }
            "priority" => match ev.int("priority") {
                Err(e) => anomalies.push(context_anomaly(ev, e)),
                Ok(p) => {
                    if !(0..=i64::from(u32::MAX)).contains(&p) {
                        anomalies.push(anomaly(
                            AnomalyKind::InvalidContext,
                            ev,
                            format!("priority {p} is outside 0-4294967295"),
                        ));
                    }
                    if self.expect_state(ev, &[JobState::Priority, JobState::Sched], anomalies) {
                        self.priority.set(p);
                        if self.state == JobState::Priority {
                            self.enter(JobState::Sched, ts);
                        }
                    }
                }
            },
            "urgency" => match ev.int("urgency") {
                Err(e) => anomalies.push(context_anomaly(ev, e)),
                Ok(u) => {
                    if !(0..=31).contains(&u) {
                        anomalies.push(anomaly(
                            AnomalyKind::InvalidContext,
                            ev,
                            format!("urgency {u} is outside 0-31"),
                        ));
                    }
                    self.urgency.set(u);
                    self.revert_to_priority(ts);
                }
            },
            "jobspec-update" => {
                match ev.context.as_ref().filter(|c| !c.is_empty()) {
                    None => anomalies.push(anomaly(
                        AnomalyKind::MissingContext,
                        ev,
                        "jobspec-update event with no keys to update",
                    )),
                    Some(c) => {
                        // Period-delimited paths: a few, read apart.
                        let keys: std::collections::BTreeMap<String, Box<RawValue>> =
                            serde_json::from_str(c.raw().get()).unwrap_or_default();
                        self.spec
                            .get_or_insert_default()
                            .update(keys.iter().map(|(k, v)| (k.as_str(), &**v)));
                    }
                }
                self.revert_to_priority(ts);
            }
            "flux-restart" => self.revert_to_priority(ts),
            "alloc" => {
                if self.expect_state(ev, &[JobState::Sched], anomalies) {
                    self.enter(JobState::Run, ts);
                }
            }
            "prolog-start" => {
                self.check_description(ev, anomalies);
                if self.expect_state(ev, &[JobState::Run, JobState::Cleanup], anomalies) {
                    let r = self.rare_mut();
                    if r.prologs_active == 0 {
                        r.prolog_since.set(ts);
                    }
                    r.prologs_active = r.prologs_active.saturating_add(1);
                }
            }
            "prolog-finish" => {
                let r = self.rare_mut();
                finish_action(ev, &mut r.prologs_active, "prolog", anomalies);
                if r.prologs_active == 0 {
                    r.prolog_since.clear();
                }
                self.tidy_rare();
            }
            "epilog-start" => {
                self.check_description(ev, anomalies);
                // flux-core's perilog posts the epilog of a failed prolog
                // while the job is still in RUN, before the prolog's
                // exception and prolog-finish.
                let allowed: &[JobState] = if self.prologs_active() > 0 {
                    &[JobState::Run, JobState::Cleanup]
                } else {
                    &[JobState::Cleanup]
                };
                if self.expect_state(ev, allowed, anomalies) {
                    let r = self.rare_mut();
                    if r.epilogs_active == 0 {
                        r.epilog_since.set(ts);
                    }
                    r.epilogs_active = r.epilogs_active.saturating_add(1);
                }
            }
            "epilog-finish" => {
                let r = self.rare_mut();
                finish_action(ev, &mut r.epilogs_active, "epilog", anomalies);
                if r.epilogs_active == 0 {
                    r.epilog_since.clear();
                }
                self.tidy_rare();
            }
            "start" => {
                if self.expect_state(ev, &[JobState::Run], anomalies) {
                    if self.prologs_active() > 0 {
                        anomalies.push(anomaly(
                            AnomalyKind::UnexpectedEvent,
                            ev,
                            "start while a prolog is still running",
                        ));
                    }
                    if self.started {
                        anomalies.push(anomaly(AnomalyKind::Repeated, ev, "second start event"));
                    }
                    self.started = true;
                }
            }
            "finish" => match ev.int("status") {
                Err(e) => anomalies.push(context_anomaly(ev, e)),
                Ok(status) => {
                    if self.rare().waitstatus.is_some() {
                        anomalies.push(anomaly(AnomalyKind::Repeated, ev, "second finish event"));
                    }
                    if self.expect_state(ev, &[JobState::Run, JobState::Cleanup], anomalies) {
                        self.rare_mut().waitstatus.set(status);
                        if self.state == JobState::Run {
                            self.enter(JobState::Cleanup, ts);
                        }
                    }
                }
            },
            "release" => self.on_release(ev, anomalies),
            "free" => {
                if self.expect_state(ev, &[JobState::Cleanup], anomalies) {
                    // The epilog of a job that never started (its prolog
                    // failed) is not waited for: flux-core 0.88 frees and
                    // cleans such a job with no epilog-finish.
                    if self.epilogs_active() > 0 && self.started {
                        anomalies.push(anomaly(
                            AnomalyKind::UnexpectedEvent,
                            ev,
                            "free while an epilog is still running",
                        ));
                    }
                    self.freed = true;
                    // Kept with what R gave it (a job with ranks has R).
                    if let Some(spec) = self.spec.as_mut() {
                        spec.free(ts);
                    }
                }
            }
            "clean" => {
                if self.expect_state(ev, &[JobState::Cleanup], anomalies) {
                    self.enter(JobState::Inactive, ts);
                    // Nothing runs for an inactive job: an epilog never
                    // finished (see `free`) does not keep it "in epilog".
                    let r = self.rare_mut();
                    r.epilogs_active = 0;
                    r.epilog_since.clear();
                    r.prologs_active = 0;
                    r.prolog_since.clear();
                }
            }
            "exception" => self.on_exception(ev, anomalies),
            "dependency-add" | "dependency-remove" => self.on_dependency(ev, anomalies),
            "resource-update" => match ev.number("expiration") {
                Ok(exp) => self.expiration.set(exp),
                Err(e) => anomalies.push(context_anomaly(ev, e)),
            },
            "set-flags" => {
                if !matches!(ev.get("flags"), Some(serde_json::Value::Array(_))) {
                    anomalies.push(anomaly(
                        AnomalyKind::InvalidContext,
                        ev,
                        "set-flags event without a flags array",
                    ));
                }
            }
            // No state change and nothing job-list reports. `annotations`
            // is not in RFC 21 but the job manager's journal carries it
            // (scheduler annotations).
            "memo" | "annotations" => {}
            name if name.starts_with("debug.") => {}
            // RFC 21's list of events is closed (only `debug.*` is open).
            other => anomalies.push(anomaly(
                AnomalyKind::UnknownEvent,
                ev,
                format!("`{other}` is not an RFC 21 event"),
            )),
        }
    }

    fn on_submit(&mut self, ev: &Event, anomalies: &mut Vec<Anomaly>) {
        if self.submitted {
            anomalies.push(anomaly(
                AnomalyKind::Repeated,
                ev,
                "second submit event; ignored",
            ));
            return;
        }
        self.submitted = true;
        self.t_submit.set(ev.timestamp);
        let values = ev.values(["userid", "urgency", "flags", "version"]);
        match values.int("userid") {
            Ok(u) => self.userid.set(u),
            Err(e) => anomalies.push(context_anomaly(ev, e)),
        }
        match values.int("urgency") {
            Ok(u) => self.urgency.set(u),
            Err(e) => anomalies.push(context_anomaly(ev, e)),
        }
        match values.opt_int("flags") {
            // Most jobs have none: no [`Rare`] for them.
            Ok(f) => match f.unwrap_or(0) {
                0 if self.rare.is_none() => {}
                f => self.rare_mut().flags = f,
            },
            Err(e) => anomalies.push(context_anomaly(ev, e)),
        }
        // Eventlogs without a version (flux-core 0.40 and older) may have
        // no `validate`: there the job was in DEPEND from submit on.
        self.unversioned = !values.has("version");
    }

    fn on_release(&mut self, ev: &Event, anomalies: &mut Vec<Anomaly>) {
        let values = ev.values(["ranks", "final"]);
        match values.str("ranks") {
            Ok(r) => {
                if let Err(e) = Ranks::parse(&r) {
                    anomalies.push(anomaly(
                        AnomalyKind::InvalidContext,
                        ev,
                        format!("release ranks `{r}`: {e}"),
                    ));
                }
            }
            Err(e) => anomalies.push(context_anomaly(ev, e)),
        }
        let is_final = match values.bool("final") {
            Ok(f) => f,
            Err(e) => {
                anomalies.push(context_anomaly(ev, e));
                false
            }
        };
        if self.released_final {
            anomalies.push(anomaly(
                AnomalyKind::UnexpectedEvent,
                ev,
                "release after the final release",
            ));
        }
        if self.expect_state(ev, &[JobState::Run, JobState::Cleanup], anomalies) && is_final {
            self.released_final = true;
        }
    }

    fn on_exception(&mut self, ev: &Event, anomalies: &mut Vec<Anomaly>) {
        let values = ev.values(["type", "severity", "note"]);
        let kind = match values.str("type") {
            Ok(t) => t.to_string(),
            Err(e) => {
                anomalies.push(context_anomaly(ev, e));
                return;
            }
        };
        let severity = match values.int("severity") {
            Ok(s) => s,
            Err(e) => {
                anomalies.push(context_anomaly(ev, e));
                return;
            }
        };
        if !(0..=7).contains(&severity) {
            anomalies.push(anomaly(
                AnomalyKind::InvalidContext,
                ev,
                format!("exception severity {severity} is outside 0-7"),
            ));
        }
        let note = match values.opt_str("note") {
            Ok(n) => n.map(Cow::into_owned).unwrap_or_default(),
            Err(e) => {
                anomalies.push(context_anomaly(ev, e));
                String::new()
            }
        };
        if self.exception().is_none_or(|e| severity < e.severity) {
            self.rare_mut().exception = Some(Box::new(JobException {
                kind,
                severity,
                note,
            }));
        }
        if severity == 0 {
            self.fatal_exception = true;
            if self.state.is_active() && self.state != JobState::Cleanup {
                self.enter(JobState::Cleanup, ev.timestamp);
            }
        }
    }

    fn on_dependency(&mut self, ev: &Event, anomalies: &mut Vec<Anomaly>) {
        let desc = match ev.str("description") {
            Ok(d) => d,
            Err(e) => {
                anomalies.push(context_anomaly(ev, e));
                return;
            }
        };
        // flux-core counts dependencies only before the job leaves DEPEND.
        if !matches!(self.state, JobState::New | JobState::Depend) {
            return;
        }
        if ev.name == "dependency-add" {
            if !self.dependencies().iter().any(|d| *d == desc) {
                self.rare_mut().dependencies.push(desc.to_string());
            }
        } else if let Some(i) = self.dependencies().iter().position(|d| *d == desc) {
            self.rare_mut().dependencies.remove(i);
            self.tidy_rare();
        } else {
            anomalies.push(anomaly(
                AnomalyKind::UnexpectedEvent,
                ev,
                format!("dependency-remove of `{desc}`, which was never added"),
            ));
        }
    }

    fn check_description(&self, ev: &Event, anomalies: &mut Vec<Anomaly>) {
        if let Err(e) = ev.str("description") {
            anomalies.push(context_anomaly(ev, e));
        }
    }

    /// Take the expiration from the job's R (`execution.expiration`), as
    /// job-list does when the job reaches RUN (0 means none), and the
    /// ranks it is allocated (`execution.R_lite[].rank`).
    pub fn apply_r(&mut self, r: &JsonObject) {
        // Only these keys of R are read: the rest is skipped unparsed, in
        // one pass. A repeated key fails that pass; the lookups that keep
        // the last of each, as a map would, decide the expiration then.
        #[derive(serde::Deserialize)]
        struct JobR<'a> {
            #[serde(borrow)]
            execution: Option<Execution<'a>>,
        }
        #[derive(serde::Deserialize)]
        struct Execution<'a> {
            expiration: Option<serde_json::Value>,
            #[serde(rename = "R_lite", borrow, default)]
            r_lite: Vec<RLite<'a>>,
            #[serde(borrow, default)]
            nodelist: Option<Vec<Cow<'a, str>>>,
        }
        #[derive(serde::Deserialize)]
        struct RLite<'a> {
            #[serde(borrow)]
            rank: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            children: Option<Children<'a>>,
        }
        #[derive(serde::Deserialize)]
        struct Children<'a> {
            #[serde(borrow, default)]
            core: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            gpu: Option<Cow<'a, str>>,
        }
        let exp = match serde_json::from_str::<JobR>(r.raw().get()) {
            Ok(parsed) => parsed.execution.and_then(|e| {
                let mut ranks = IdSet::new();
                let (mut cores, mut gpus) = (0u64, 0u64);
                for entry in &e.r_lite {
                    // A rank idset that does not parse, or names more ranks
                    // than an instance can have, is left out: R's own
                    // checks belong to the resource stream.
                    if let Some(set) = entry.rank.as_deref().and_then(|s| bounded_idset(s).ok()) {
                        let per_rank = |ids: Option<&str>| {
                            ids.and_then(|c| bounded_idset(c).ok())
                                .map_or(0, |c| c.len())
                        };
                        let children = entry.children.as_ref();
                        let (c, g) = (
                            per_rank(children.and_then(|c| c.core.as_deref())),
                            per_rank(children.and_then(|c| c.gpu.as_deref())),
                        );
                        cores = cores.saturating_add(set.len().saturating_mul(c));
                        gpus = gpus.saturating_add(set.len().saturating_mul(g));
                        ranks.union_with(&set);
                    }
                }
                if !ranks.is_empty() {
                    self.ranks = ranks.ranges().iter().copied().collect();
                    // The hosts as one hostlist, in R's order.
                    let nodelist = e.nodelist.as_ref().and_then(|parts| match &parts[..] {
                        [one] => Hostlist::normalize(one).ok().map(CompactString::from),
                        _ => {
                            let mut hosts = Hostlist::default();
                            for part in parts {
                                hosts.append(&Hostlist::parse(part).ok()?);
                            }
                            Some(hosts.to_string().into())
                        }
                    });
                    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
                    self.spec.get_or_insert_default().apply_r(
                        clamp(ranks.len()),
                        clamp(cores),
                        clamp(gpus),
                        nodelist.as_deref(),
                    );
                }
                e.expiration
            }),
            Err(_) => r
                .get("execution")
                .and_then(|e| object::find(e, "expiration"))
                .and_then(|x| serde_json::from_str(x.get()).ok()),
        };
        if let Some(exp) = exp.as_ref().and_then(serde_json::Value::as_f64)
            && exp > 0.0
            && !self.expiration.is_some()
        {
            self.expiration.set(exp);
        }
    }

    /// When its `free` gave its R back, if it did.
    pub fn freed_at(&self) -> Option<f64> {
        self.spec.as_ref().and_then(|s| s.freed_at())
    }

    /// Who submitted it, by name, when Flux's side said.
    pub fn username(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.username())
    }

    /// Its submitter's name, as Flux's side resolved it.
    pub fn set_username(&mut self, name: CompactString) {
        self.spec
            .get_or_insert_default()
            .set_text(Text::Username, Some(&name));
    }

    /// Who submitted it, by user id.
    pub fn userid(&self) -> Option<i64> {
        self.userid.get()
    }

    pub fn urgency(&self) -> Option<i64> {
        self.urgency.get()
    }

    /// Its priority, while it has one (see the field).
    pub fn priority(&self) -> Option<i64> {
        self.priority.get()
    }

    /// Its `finish` event's wait status, once finished.
    #[inline]
    pub fn waitstatus(&self) -> Option<i64> {
        self.rare().waitstatus.get()
    }

    /// The queue its jobspec (or an update) names, if any.
    pub fn queue(&self) -> Option<&str> {
        self.spec.as_ref().and_then(|s| s.queue())
    }

    /// What its jobspec says (read again from a later copy): what R
    /// allocated stays.
    pub fn apply_jobspec(&mut self, mut spec: JobSpec) {
        if let Some(old) = self.spec.take() {
            spec.keep_later_of(&old);
        }
        self.spec = Some(Box::new(spec));
    }

    /// The ranks R allocated to the job, as an idset's ranges (none
    /// before R, or without one).
    pub fn allocated_ranges(&self) -> &[(u32, u32)] {
        &self.ranks
    }

    /// Whether the job holds its allocated ranks now: from `alloc` until
    /// `free`, as the scheduler counts them allocated.
    pub fn holds_ranks(&self) -> bool {
        !self.ranks.is_empty()
            && matches!(self.state, JobState::Run | JobState::Cleanup)
            && !self.freed
    }

    /// The `flux jobs --json` view of the job.
    pub fn summary(&self) -> JobSummary {
        let v = self.summary_view();
        let ended = v.ended_exception();
        let texts = v.spec.map(JobSpec::texts).unwrap_or_default();
        let text = |t: Option<&str>| t.map(String::from);
        JobSummary {
            userid: v.userid,
            username: text(texts.username),
            urgency: v.urgency,
            priority: v.priority,
            state: v.state,
            result: v.result,
            success: v.success,
            waitstatus: v.waitstatus,
            returncode: v.returncode,
            // As job-list gives them: of an inactive job only.
            exception_occurred: ended.is_some(),
            exception_type: ended.map(|e| e.kind.clone()),
            exception_severity: ended.map(|e| e.severity),
            exception_note: ended.map(|e| e.note.clone()),
            t_submit: v.t_submit,
            t_depend: v.t_depend,
            t_run: v.t_run,
            t_cleanup: v.t_cleanup,
            t_inactive: v.t_inactive,
            expiration: v.expiration,
            dependencies: v.dependencies.to_vec(),
            name: text(texts.name),
            queue: text(texts.queue),
            project: text(texts.project),
            bank: text(texts.bank),
            duration: v.spec.and_then(JobSpec::duration),
            ntasks: v.spec.and_then(JobSpec::ntasks),
            ncores: v.spec.and_then(JobSpec::ncores),
            nnodes: v.spec.and_then(JobSpec::nnodes),
            nodelist: text(texts.nodelist),
            ranks: v.ranks_text(),
        }
    }

    /// The summary's values, borrowed (an output record serializes them
    /// without copying).
    pub fn summary_view(&self) -> SummaryView<'_> {
        let r = self.rare();
        SummaryView {
            userid: self.userid.get(),
            urgency: self.urgency.get(),
            priority: self.priority.get(),
            state: self.state,
            result: self.result(),
            success: self.success(),
            waitstatus: r.waitstatus.get(),
            returncode: self.returncode(),
            exception: r.exception.as_deref(),
            t_submit: self.t_submit.get(),
            t_depend: self.t_depend.get(),
            t_run: self.t_run.get(),
            t_cleanup: r.t_cleanup.get(),
            t_inactive: r.t_inactive.get(),
            expiration: self.expiration.get(),
            dependencies: &r.dependencies,
            spec: self.spec.as_deref(),
            ranks: &self.ranks,
        }
    }
}

/// What [`JobSummary`] holds, borrowed from the job.
#[derive(Debug, Clone, Copy)]
pub struct SummaryView<'a> {
    pub userid: Option<i64>,
    pub urgency: Option<i64>,
    pub priority: Option<i64>,
    pub state: JobState,
    pub result: Option<JobResult>,
    pub success: Option<bool>,
    pub waitstatus: Option<i64>,
    pub returncode: Option<i64>,
    pub exception: Option<&'a JobException>,
    pub t_submit: Option<f64>,
    pub t_depend: Option<f64>,
    pub t_run: Option<f64>,
    pub t_cleanup: Option<f64>,
    pub t_inactive: Option<f64>,
    pub expiration: Option<f64>,
    pub dependencies: &'a [String],
    /// What its jobspec and R say.
    pub spec: Option<&'a JobSpec>,
    /// The ranks R allocated, as an idset's ranges.
    pub ranks: &'a [(u32, u32)],
}

impl<'a> SummaryView<'a> {
    /// The exception as job-list gives it: of an inactive job only.
    pub fn ended_exception(&self) -> Option<&'a JobException> {
        self.exception.filter(|_| self.state == JobState::Inactive)
    }

    /// The ranks R allocated as an idset (`0-3,7`), once it has R.
    pub fn ranks_text(&self) -> Option<String> {
        (!self.ranks.is_empty()).then(|| {
            let mut set = IdSet::default();
            for &(lo, hi) in self.ranks {
                set.insert_range(lo, hi);
            }
            // As job-list encodes it: brackets around more than one.
            set.to_bracketed()
        })
    }
}

/// A job summary with the field names of `flux jobs --json`. Fields a job
/// never reached are absent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSummary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub userid: Option<i64>,
    /// As resolved where Flux runs; absent when Flux's side did not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub urgency: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    pub state: JobState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<JobResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waitstatus: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub returncode: Option<i64>,
    pub exception_occurred: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_severity: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_submit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_depend: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_run: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_cleanup: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_inactive: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiration: Option<f64>,
    pub dependencies: Vec<String>,
    // From the jobspec and R, as `flux jobs --json` names them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bank: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ntasks: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ncores: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nnodes: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodelist: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn ev(ts: f64, name: &str, ctx: serde_json::Value) -> Event {
        Event::new(ts, name).with_context(ctx)
    }

    fn submit(ts: f64) -> Event {
        ev(
            ts,
            "submit",
            json!({"userid": 5588, "urgency": 16, "flags": 0, "version": 1}),
        )
    }

    /// The old layout, built apart from [`Job`]'s own encoder, with the
    /// timestamps of the events applied.
    fn wire_of(job: &Job, applied: &[f64]) -> JobWire {
        let r = job.rare();
        JobWire {
            state: job.state,
            submitted: job.submitted,
            invalidated: job.invalidated,
            userid: job.userid,
            urgency: job.urgency,
            priority: job.priority,
            flags: r.flags,
            t_submit: job.t_submit,
            t_depend: job.t_depend,
            t_priority: job.t_priority,
            t_sched: job.t_sched,
            t_run: job.t_run,
            t_cleanup: r.t_cleanup,
            t_inactive: r.t_inactive,
            waitstatus: r.waitstatus,
            exception: r.exception.clone(),
            fatal_exception: job.fatal_exception,
            dependencies: r.dependencies.clone(),
            expiration: job.expiration,
            prologs_active: r.prologs_active,
            epilogs_active: r.epilogs_active,
            prolog_since: r.prolog_since,
            epilog_since: r.epilog_since,
            started: job.started,
            released_final: job.released_final,
            freed: job.freed,
            unversioned: job.unversioned,
            applied: applied.iter().copied().collect(),
            ranks: job.ranks.clone(),
            spec: job.spec.clone(),
        }
    }

    #[test]
    fn a_job_saves_in_the_layout_it_had_before_its_rare_parts_moved() {
        let events = [
            ev(
                1.0,
                "submit",
                json!({"userid": 7, "urgency": 16, "flags": 4, "version": 1}),
            ),
            ev(2.0, "validate", json!({})),
            ev(2.5, "dependency-add", json!({"description": "afterok=f1"})),
            ev(
                3.0,
                "dependency-remove",
                json!({"description": "afterok=f1"}),
            ),
            ev(4.0, "depend", json!({})),
            ev(5.0, "priority", json!({"priority": 16})),
            ev(6.0, "alloc", json!({})),
            ev(6.5, "prolog-start", json!({"description": "p"})),
            ev(
                7.0,
                "prolog-finish",
                json!({"description": "p", "status": 0}),
            ),
            ev(8.0, "start", json!({})),
            ev(
                9.0,
                "exception",
                json!({"type": "cancel", "severity": 0, "note": "x"}),
            ),
            ev(10.0, "finish", json!({"status": 15})),
            ev(10.5, "epilog-start", json!({"description": "e"})),
            ev(11.0, "release", json!({"ranks": "all", "final": true})),
            ev(12.0, "free", json!({})),
            ev(13.0, "clean", json!({})),
        ];
        let mut job = Job::default();
        let mut applied = Vec::new();
        for e in &events {
            job.apply(e);
            applied.push(e.timestamp);
            let old = wire_of(&job, &applied);
            let bytes = rmp_serde::to_vec(&job).unwrap();
            assert_eq!(bytes, rmp_serde::to_vec(&old).unwrap(), "after {}", e.name);
            assert_eq!(
                serde_json::to_string(&job).unwrap(),
                serde_json::to_string(&old).unwrap()
            );
            let back: Job = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(back, job, "after {}", e.name);
            assert_eq!(back.rare.is_some(), job.rare.is_some());
        }
        assert_eq!(job.flags(), 4);
        assert_eq!(job.t_inactive(), Some(13.0));
        assert_eq!(job.exception().map(|e| e.note.as_str()), Some("x"));
    }

    #[test]
    fn a_state_entered_again_keeps_the_time_it_replaced_as_applied() {
        let mut job = Job::default();
        job.apply(&submit(1.0));
        for (t, name) in [(2.0, "validate"), (3.0, "depend")] {
            job.apply(&ev(t, name, json!({})));
        }
        job.apply(&ev(4.0, "priority", json!({"priority": 1})));
        assert!(job.applied.is_empty(), "each state time holds its event's");
        // Back to PRIORITY: its time is now 5, the depend's 3 kept apart.
        job.apply(&ev(5.0, "urgency", json!({"urgency": 0})));
        assert_eq!(job.t_priority.get(), Some(5.0));
        assert!(job.apply(&ev(3.0, "depend", json!({}))).duplicate);
        assert_eq!(job.events_applied(), 5);
        let mut back: Job = rmp_serde::from_slice(&rmp_serde::to_vec(&job).unwrap()).unwrap();
        assert!(back.apply(&ev(3.0, "depend", json!({}))).duplicate);
        assert_eq!(back.last_timestamp(), Some(5.0));
    }

    #[test]
    fn the_rare_parts_are_held_only_while_something_in_them_is_set() {
        let mut job = Job::default();
        job.apply(&submit(1.0));
        job.apply(&ev(2.0, "validate", json!({})));
        assert!(job.rare.is_none(), "no flags, nothing rare");
        job.apply(&ev(2.5, "dependency-add", json!({"description": "a"})));
        assert_eq!(job.dependencies(), ["a".to_string()]);
        job.apply(&ev(3.0, "dependency-remove", json!({"description": "a"})));
        assert!(job.rare.is_none(), "the dependency went");
        job.apply(&ev(4.0, "depend", json!({})));
        job.apply(&ev(5.5, "priority", json!({"priority": 1})));
        job.apply(&ev(6.0, "alloc", json!({})));
        job.apply(&ev(6.5, "prolog-start", json!({"description": "p"})));
        assert_eq!(job.state, JobState::Run);
        assert_eq!((job.prologs_active(), job.prolog_since()), (1, Some(6.5)));
        job.apply(&ev(
            7.0,
            "prolog-finish",
            json!({"description": "p", "status": 0}),
        ));
        assert!(job.rare.is_none(), "the prolog finished");
        assert_eq!(std::mem::size_of::<Job>(), 112);
        assert_eq!(std::mem::size_of::<Rare>(), 72);
    }

    #[test]
    fn the_submitters_name_outlives_a_jobspec_read_after_it() {
        let mut job = Job::default();
        job.set_username("alice".into());
        let (spec, _) = JobSpec::parse(r#"{"version":1,"tasks":[{"command":["app"]}]}"#);
        job.apply_jobspec(spec);
        assert_eq!(job.username(), Some("alice"));
        assert_eq!(job.summary().username.as_deref(), Some("alice"));
        // A checkpoint keeps it; one written before it reads as none.
        let bytes = rmp_serde::to_vec(&job).unwrap();
        let back: Job = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back.username(), Some("alice"));
        assert_eq!(Job::default().username(), None);
    }

    #[test]
    fn cores_and_gpus_are_counted_per_rank_of_r() {
        let mut job = Job::default();
        let r: JsonObject = serde_json::from_str(
            r#"{"version":1,"execution":{"R_lite":[{"rank":"0-1","children":{"core":"0-3","gpu":"0-1"}},{"rank":"4","children":{"core":"0"}}],"nodelist":["n[0-1]","n4"]}}"#,
        )
        .unwrap();
        job.apply_r(&r);
        let s = job.summary_view();
        assert_eq!(s.spec.and_then(JobSpec::ncores), Some(9));
        assert_eq!(s.spec.and_then(JobSpec::ngpus), Some(4));
        assert_eq!(s.spec.and_then(JobSpec::nnodes), Some(3));
        // No R yet: not known.
        assert_eq!(JobSpec::default().ngpus(), None);
    }

    #[test]
    fn the_expiration_comes_from_r_as_a_map_would_read_it() {
        let cases = [
            (
                r#"{"version":1,"execution":{"R_lite":[{"rank":"0"}],"expiration":5.5,"nodelist":["a"]}}"#,
                Some(5.5),
            ),
            (
                r#"{"execution":{"expiration":1},"execution":{"expiration":2}}"#,
                Some(2.0),
            ),
            (
                r#"{"execution":{"expiration":1,"expiration":3}}"#,
                Some(3.0),
            ),
            (r#"{"execution":null}"#, None),
            (r#"{"execution":7}"#, None),
            (r#"{"execution":{"expiration":"soon"}}"#, None),
            (r#"{"execution":{"expiration":0}}"#, None),
            (r#"{}"#, None),
        ];
        for (text, want) in cases {
            let r: JsonObject = serde_json::from_str(text).unwrap_or_default();
            let mut job = Job::default();
            job.apply_r(&r);
            assert_eq!(job.expiration.get(), want, "{text}");
        }
    }

    fn run(job: &mut Job, events: &[Event]) -> Vec<Anomaly> {
        events.iter().flat_map(|e| job.apply(e).anomalies).collect()
    }

    fn happy_path() -> Vec<Event> {
        vec![
            submit(1.0),
            Event::new(2.0, "validate"),
            Event::new(3.0, "depend"),
            ev(4.0, "priority", json!({"priority": 16})),
            ev(5.0, "alloc", json!({"annotations": {}})),
            Event::new(6.0, "start"),
            ev(7.0, "finish", json!({"status": 0})),
            ev(8.0, "release", json!({"ranks": "all", "final": true})),
            Event::new(9.0, "free"),
            Event::new(10.0, "clean"),
        ]
    }

    /// RFC 47 (rfc #547): `sched.queue` is no scheduler annotation any
    /// more; a job's queue comes from its jobspec alone, never from
    /// `alloc` or `annotations` annotations.
    #[test]
    fn the_queue_never_comes_from_annotations() {
        let sched = json!({"annotations": {"sched": {"queue": "debug", "resource_summary": "rank0/core0"}}});
        let mut job = Job::new();
        let mut events = happy_path();
        events[4] = ev(5.0, "alloc", sched.clone());
        events.insert(5, ev(5.5, "annotations", sched));
        assert!(run(&mut job, &events).is_empty());
        assert_eq!(job.queue(), None);
    }

    #[test]
    fn happy_path_completes() {
        let mut job = Job::new();
        assert!(run(&mut job, &happy_path()).is_empty());
        let s = job.summary();
        assert_eq!(s.state, JobState::Inactive);
        assert_eq!(s.result, Some(JobResult::Completed));
        assert_eq!(s.success, Some(true));
        assert_eq!(s.returncode, Some(0));
        assert_eq!(s.priority, Some(16));
        assert_eq!(
            (s.t_submit, s.t_depend, s.t_run, s.t_cleanup, s.t_inactive),
            (Some(1.0), Some(2.0), Some(5.0), Some(7.0), Some(10.0))
        );
    }

    #[test]
    fn transitions_are_reported() {
        let mut job = Job::new();
        let states: Vec<_> = happy_path()
            .iter()
            .filter_map(|e| job.apply(e).transition.map(|t| (t.from, t.to)))
            .collect();
        use JobState::*;
        assert_eq!(
            states,
            vec![
                (New, Depend),
                (Depend, Priority),
                (Priority, Sched),
                (Sched, Run),
                (Run, Cleanup),
                (Cleanup, Inactive)
            ]
        );
    }

    #[test]
    fn a_failed_prolog_ends_without_anomaly_or_epilog() {
        // What flux-core 0.88 posts (live instance, per-rank prolog that
        // exits 1): epilog-start in RUN, the exception, prolog-finish,
        // free and clean, and never epilog-finish.
        let to_run = || {
            [
                ev(
                    1.0,
                    "submit",
                    json!({"userid": 0, "urgency": 16, "flags": 0, "version": 1}),
                ),
                ev(1.1, "validate", json!({})),
                ev(1.2, "depend", json!({})),
                ev(1.3, "priority", json!({"priority": 16})),
                ev(1.4, "alloc", json!({})),
            ]
        };
        let mut job = Job::new();
        let mut all = Vec::new();
        for e in to_run().into_iter().chain([
            ev(
                1.5,
                "prolog-start",
                json!({"description": "job-manager.prolog"}),
            ),
            ev(
                1.6,
                "epilog-start",
                json!({"description": "job-manager.epilog"}),
            ),
            ev(
                1.7,
                "exception",
                json!({"type": "prolog", "severity": 0, "note": "x", "userid": 0}),
            ),
            ev(
                1.8,
                "prolog-finish",
                json!({"description": "job-manager.prolog", "status": 256}),
            ),
            ev(1.9, "free", json!({})),
            ev(2.0, "clean", json!({})),
        ]) {
            all.extend(job.apply(&e).anomalies);
        }
        assert_eq!(all, vec![]);
        assert_eq!(job.state, JobState::Inactive);
        assert_eq!((job.epilogs_active(), job.epilog_since()), (0, None));
        // An epilog-start in RUN with no prolog running is still wrong.
        let mut job = Job::new();
        for e in to_run() {
            job.apply(&e);
        }
        let a = job.apply(&ev(
            1.5,
            "epilog-start",
            json!({"description": "job-manager.epilog"}),
        ));
        assert_eq!(a.anomalies.len(), 1);
    }

    #[test]
    fn repeats_are_skipped() {
        let mut once = Job::new();
        run(&mut once, &happy_path());
        let mut twice = Job::new();
        let evs = happy_path();
        for (i, e) in evs.iter().enumerate() {
            twice.apply(e);
            // a journal reconnect resends the whole backlog so far
            for old in &evs[..=i] {
                let a = twice.apply(old);
                assert!(a.duplicate && a.transition.is_none() && a.anomalies.is_empty());
            }
        }
        assert_eq!(once, twice);
    }

    #[test]
    fn fatal_exception_from_sched_goes_to_cleanup() {
        let mut job = Job::new();
        let evs = vec![
            submit(1.0),
            Event::new(2.0, "validate"),
            Event::new(3.0, "depend"),
            ev(4.0, "priority", json!({"priority": 16})),
            ev(
                5.0,
                "exception",
                json!({"type": "cancel", "severity": 0, "note": ""}),
            ),
            Event::new(6.0, "clean"),
        ];
        assert!(run(&mut job, &evs).is_empty());
        let s = job.summary();
        assert_eq!(s.result, Some(JobResult::Canceled));
        assert_eq!(s.returncode, Some(-128));
        assert_eq!(s.t_cleanup, Some(5.0));
        assert_eq!(s.t_run, None);
    }

    #[test]
    fn nonfatal_exception_keeps_state_and_most_severe_wins() {
        let mut job = Job::new();
        let mut evs = happy_path();
        evs.insert(
            6,
            ev(
                6.5,
                "exception",
                json!({"type": "lowest", "severity": 7, "note": "a"}),
            ),
        );
        evs.insert(
            7,
            ev(
                6.6,
                "exception",
                json!({"type": "cancel", "severity": 1, "note": "b"}),
            ),
        );
        evs.insert(
            8,
            ev(
                6.7,
                "exception",
                json!({"type": "other", "severity": 1, "note": "c"}),
            ),
        );
        assert!(run(&mut job, &evs).is_empty());
        let s = job.summary();
        assert_eq!(s.result, Some(JobResult::Completed));
        assert_eq!(s.exception_type.as_deref(), Some("cancel"));
        assert_eq!(s.exception_severity, Some(1));
    }

    #[test]
    fn timeout_result_and_signal_returncode() {
        let mut job = Job::new();
        let mut evs = happy_path();
        evs[6] = ev(7.0, "finish", json!({"status": 9}));
        evs.insert(
            6,
            ev(
                6.5,
                "exception",
                json!({"type": "timeout", "severity": 0, "note": ""}),
            ),
        );
        assert!(run(&mut job, &evs).is_empty());
        assert_eq!(job.result(), Some(JobResult::Timeout));
        assert_eq!(job.returncode(), Some(-9));
        assert_eq!(job.t_cleanup(), Some(6.5));
    }

    #[test]
    fn exit_code_is_returncode() {
        let mut job = Job::new();
        let mut evs = happy_path();
        evs[6] = ev(7.0, "finish", json!({"status": 256}));
        run(&mut job, &evs);
        assert_eq!(job.result(), Some(JobResult::Failed));
        assert_eq!(job.returncode(), Some(1));
        assert_eq!(job.success(), Some(false));
    }

    #[test]
    fn urgency_and_restart_revert_sched_to_priority() {
        let mut job = Job::new();
        let evs = vec![
            submit(1.0),
            Event::new(2.0, "validate"),
            Event::new(3.0, "depend"),
            ev(4.0, "priority", json!({"priority": 16})),
            ev(5.0, "urgency", json!({"urgency": 0, "userid": 1})),
        ];
        run(&mut job, &evs);
        assert_eq!(job.state, JobState::Priority);
        assert_eq!(job.priority(), None);
        job.apply(&ev(6.0, "priority", json!({"priority": 0})));
        assert_eq!(job.state, JobState::Sched);
        job.apply(&Event::new(7.0, "flux-restart"));
        assert_eq!(job.state, JobState::Priority);
        job.apply(&ev(8.0, "priority", json!({"priority": 0})));
        job.apply(&ev(
            9.0,
            "jobspec-update",
            json!({"attributes.system.duration": 60.0}),
        ));
        assert_eq!(job.state, JobState::Priority);
    }

    #[test]
    fn dependencies_before_validate() {
        let mut job = Job::new();
        let evs = vec![
            submit(1.0),
            ev(1.5, "dependency-add", json!({"description": "after-ok=f1"})),
            ev(
                1.6,
                "dependency-add",
                json!({"description": "begin-time=5"}),
            ),
            Event::new(2.0, "validate"),
            ev(
                2.5,
                "dependency-remove",
                json!({"description": "begin-time=5"}),
            ),
        ];
        assert!(run(&mut job, &evs).is_empty());
        assert_eq!(job.dependencies(), ["after-ok=f1".to_string()]);
        let a = job.apply(&ev(
            2.6,
            "dependency-remove",
            json!({"description": "nope"}),
        ));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::UnexpectedEvent);
    }

    #[test]
    fn invalidate_marks_job() {
        let mut job = Job::new();
        run(&mut job, &[submit(1.0), Event::new(2.0, "invalidate")]);
        assert!(job.invalidated);
    }

    #[test]
    fn unversioned_logs_with_and_without_validate() {
        let old_submit = ev(
            1.0,
            "submit",
            json!({"userid": 1, "urgency": 16, "flags": 0}),
        );
        // flux-core 0.40: no validate; the job was in DEPEND from submit on.
        let mut job = Job::new();
        assert!(run(&mut job, &[old_submit.clone(), Event::new(2.0, "depend")]).is_empty());
        assert_eq!(job.state, JobState::Priority);
        assert_eq!(job.t_depend.get(), Some(1.0));
        // flux-core 0.41: no version, but validate.
        let mut job = Job::new();
        let evs = [
            old_submit,
            Event::new(1.5, "validate"),
            Event::new(2.0, "depend"),
        ];
        assert!(run(&mut job, &evs).is_empty());
        assert_eq!(job.state, JobState::Priority);
        assert_eq!(job.t_depend.get(), Some(1.5));
    }

    #[test]
    fn anomalies_for_broken_logs() {
        let mut job = Job::new();
        let a = job.apply(&Event::new(1.0, "validate"));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::UnknownTarget);
        assert!(!job.submitted);

        let mut job = Job::new();
        run(&mut job, &[submit(1.0)]);
        let a = job.apply(&Event::new(2.0, "alloc"));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::UnexpectedEvent);
        let a = job.apply(&ev(3.0, "finish", json!({"status": "x"})));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::InvalidContext);
        let a = job.apply(&Event::new(4.0, "priority"));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::MissingContext);
        let a = job.apply(&Event::new(0.5, "validate"));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::OutOfOrder);
        let a = job.apply(&submit(5.0));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::Repeated);

        let mut job = Job::new();
        run(&mut job, &happy_path());
        let a = job.apply(&Event::new(11.0, "free"));
        assert_eq!(a.anomalies[0].kind, AnomalyKind::UnexpectedEvent);
        assert_eq!(job.state, JobState::Inactive);
    }

    #[test]
    fn prolog_and_epilog_checks() {
        let mut job = Job::new();
        let mut evs = happy_path();
        evs.insert(5, ev(5.5, "prolog-start", json!({"description": "p"})));
        let a = run(&mut job, &evs);
        assert_eq!(a.len(), 1);
        assert!(a[0].message.contains("prolog"));
    }

    const NAMES: &[&str] = &[
        "submit",
        "validate",
        "invalidate",
        "depend",
        "priority",
        "urgency",
        "flux-restart",
        "jobspec-update",
        "alloc",
        "prolog-start",
        "prolog-finish",
        "start",
        "finish",
        "release",
        "epilog-start",
        "epilog-finish",
        "free",
        "clean",
        "exception",
        "dependency-add",
        "dependency-remove",
        "memo",
        "resource-update",
        "set-flags",
        "annotations",
        "debug.x",
    ];

    fn arb_event() -> impl Strategy<Value = Event> {
        let ctx = prop_oneof![
            Just(json!(null)),
            Just(json!({})),
            (0i64..40, -2i64..9, any::<bool>()).prop_map(|(n, s, b)| json!({
                "priority": n, "urgency": n, "userid": n, "status": n * 256,
                "severity": s, "type": if b { "cancel" } else { "timeout" }, "note": "x",
                "description": format!("d{}", n % 3), "ranks": "all", "final": b,
                "expiration": n, "flags": [], "version": 1
            })),
            Just(json!({"priority": "x", "severity": 1.5, "ranks": 7, "final": "y"})),
        ];
        (1u32..60, prop::sample::select(NAMES), ctx)
            .prop_map(|(ts, name, c)| Event::new(f64::from(ts) / 4.0, name).with_context(c))
    }

    proptest! {
        /// The applied timestamps, those a state time holds kept there and
        /// the rest apart, behave as the set of every applied event's
        /// timestamp: repeats, order anomalies, the last timestamp, the
        /// count, what a checkpoint holds, and a restored copy.
        #[test]
        fn applied_timestamps_act_as_the_set_of_every_event_applied(
            tail in prop::collection::vec(arb_event(), 0..40),
            versioned in any::<bool>(),
        ) {
            let mut job = Job::new();
            // Unversioned, `depend` copies the submit time to DEPEND's.
            let first = if versioned {
                submit(0.1)
            } else {
                ev(0.1, "submit", json!({"userid": 1, "urgency": 16}))
            };
            let mut evs = vec![first];
            evs.extend(tail);
            evs.push(Event::new(3.0, "annotations"));
            let mut model: Vec<f64> = Vec::new();
            for e in &evs {
                let submitted = job.submitted;
                let a = job.apply(e);
                if e.name != "annotations" {
                    match model.binary_search_by(|t| t.total_cmp(&e.timestamp)) {
                        Ok(_) => prop_assert!(a.duplicate),
                        Err(pos) => {
                            prop_assert!(!a.duplicate);
                            let late = a.anomalies.iter().any(|x| x.kind == AnomalyKind::OutOfOrder);
                            prop_assert_eq!(late, pos < model.len());
                            if submitted || e.name == "submit" {
                                model.insert(pos, e.timestamp);
                            }
                        }
                    }
                }
                prop_assert_eq!(job.last_timestamp(), model.last().copied());
                prop_assert_eq!(job.events_applied(), model.len());
                let wire: Vec<f64> = job.applied_wire().merged().collect();
                prop_assert_eq!(&wire, &model);
                let back: Job = rmp_serde::from_slice(&rmp_serde::to_vec(&job).unwrap()).unwrap();
                prop_assert_eq!(&back, &job);
            }
        }

        #[test]
        fn random_sequences_never_panic_and_stay_valid(tail in prop::collection::vec(arb_event(), 0..40)) {
            let mut job = Job::new();
            let mut evs = vec![submit(0.1)];
            evs.extend(tail);
            for e in &evs {
                let before = job.state;
                let a = job.apply(e);
                if let Some(t) = a.transition {
                    prop_assert_eq!(t.from, before);
                    prop_assert_ne!(t.from, t.to);
                }
                let s = job.summary();
                prop_assert_eq!(s.result.is_some(), job.state == JobState::Inactive);
                if job.state.is_active() { prop_assert!(job.t_depend.is_some()); }
                if job.state == JobState::Inactive { prop_assert!(job.t_cleanup().is_some()); }
            }
            // replaying the same events again changes nothing
            let snapshot = job.clone();
            for e in &evs {
                job.apply(e);
            }
            prop_assert_eq!(job, snapshot);
        }
    }

    #[test]
    fn an_event_rfc21_does_not_know_is_an_anomaly_but_debug_and_memo_are_not() {
        let mut job = Job::new();
        job.apply(
            &Event::new(1.0, "submit")
                .with_context(json!({"userid": 1, "urgency": 16, "flags": 0, "version": 1})),
        );
        for name in ["memo", "debug.anything", "jobspec-update", "annotations"] {
            assert!(
                job.apply(&Event::new(2.0, name)).anomalies.is_empty(),
                "{name}"
            );
        }
        let a = job.apply(&Event::new(3.0, "frobnicate"));
        assert_eq!(a.anomalies.len(), 1);
        assert_eq!(a.anomalies[0].kind, AnomalyKind::UnknownEvent);
        assert_eq!(job.state, JobState::New, "and nothing changes");
    }
}
