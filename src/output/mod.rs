//! Output records: one JSON object per record, with a `kind`, shared by
//! `fluxpipe replay --format json` and every sink of the pipeline so both
//! use the same field names.

pub mod effects;

use crate::decode::EventStream;
use crate::flux::event::Event;
use crate::flux::job::{JobResult, JobState, Transition};
use crate::flux::jobid::JobId;
use crate::flux::jobspec::JobSpec;
use crate::flux::resource::{RankChange, RankState};
use crate::keyed::JobKey;
use crate::keyed::alerts::engine::{AlertEvent, Subject};
use crate::keyed::alerts::rule::{Rule, RuleKind};
use crate::keyed::alerts::watch::WatchAlert;
use crate::keyed::state::{JobEntry, KeyedAnomaly, KeyedTransition};
use compact_str::CompactString;
use serde::Serialize;
use serde_json::{Map, Value, json};
use smallvec::SmallVec;
use std::sync::OnceLock;
use xxhash_rust::xxh3::xxh3_64;

/// The output streams a sink can subscribe to in `inputs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OutputStream {
    /// Every decoded input event, normalized (the log-shipping feed).
    Events,
    /// Job state transitions.
    Transitions,
    /// A job summary when a job becomes INACTIVE.
    Jobs,
    /// A job summary at its submission and at each transition before
    /// the last (the last is on `jobs`): where each active job stands.
    JobUpdates,
    /// Rank changes.
    Resources,
    /// Alerts.
    Alerts,
    /// Rule violations found in the input.
    Anomalies,
    /// Input that could not be decoded.
    DeadLetter,
}

impl OutputStream {
    pub const ALL: [OutputStream; 8] = [
        OutputStream::Events,
        OutputStream::Transitions,
        OutputStream::Jobs,
        OutputStream::JobUpdates,
        OutputStream::Resources,
        OutputStream::Alerts,
        OutputStream::Anomalies,
        OutputStream::DeadLetter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Events => "events",
            OutputStream::Transitions => "transitions",
            OutputStream::Jobs => "jobs",
            OutputStream::JobUpdates => "job_updates",
            OutputStream::Resources => "resources",
            OutputStream::Alerts => "alerts",
            OutputStream::Anomalies => "anomalies",
            OutputStream::DeadLetter => "dead_letter",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        OutputStream::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// A set of output streams: a bit per stream, with room for 32 (a stream
/// added past that fails to build, not to route).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamSet(u32);

const _: () = assert!(OutputStream::ALL.len() <= u32::BITS as usize);

impl StreamSet {
    pub const EMPTY: StreamSet = StreamSet(0);

    pub fn contains(self, stream: OutputStream) -> bool {
        self.0 & Self::bit(stream) != 0
    }

    pub fn insert(&mut self, stream: OutputStream) {
        self.0 |= Self::bit(stream);
    }

    pub fn union(self, other: StreamSet) -> StreamSet {
        StreamSet(self.0 | other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set as bits, for an atomic that holds one; [`StreamSet::from_bits`]
    /// reads them back.
    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn from_bits(bits: u32) -> StreamSet {
        StreamSet(bits)
    }

    fn bit(stream: OutputStream) -> u32 {
        1 << (stream as u32)
    }
}

impl FromIterator<OutputStream> for StreamSet {
    fn from_iter<I: IntoIterator<Item = OutputStream>>(streams: I) -> Self {
        let mut set = StreamSet::EMPTY;
        for s in streams {
            set.insert(s);
        }
        set
    }
}

/// A deterministic id for a record: the same input gives the same id in
/// every run, so consumers can drop the repeats an at-least-once restart
/// may send. XXH3 of the fields that identify the record, in hex.
fn record_id(parts: &[&[u8]]) -> String {
    // Length-prefixed, so ("ab","c") and ("a","bc") differ. Hashed in one
    // call over a stack buffer: the digest a streaming hasher fed the same
    // bytes gives, without its setup.
    let mut bytes: SmallVec<[u8; 256]> = SmallVec::new();
    for p in parts {
        bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
        bytes.extend_from_slice(p);
    }
    const_hex::encode(xxh3_64(&bytes).to_be_bytes())
}

fn id_bytes(id: Option<JobId>) -> [u8; 8] {
    id.map_or(u64::MAX, |i| i.0).to_le_bytes()
}

/// One record on its way to the sinks: the stream it belongs to and its
/// JSON text (no trailing newline), serialized once for every sink.
#[derive(Debug, Clone)]
pub struct OutputRecord {
    pub stream: OutputStream,
    line: OnceLock<String>,
    /// A record whose line is not written yet: it is written where it is
    /// first wanted, on a sink's thread, not on the shard's (the busiest),
    /// and not at all for a sink that only counts records.
    unwritten: Unwritten,
}

/// What the records written late are made from, owned. A transition is
/// held inline (one allocation for the whole record, freed on a sink's
/// thread); a job summary, larger and rarer, is boxed.
#[derive(Debug, Clone)]
enum Unwritten {
    Nothing,
    Transition(OwnedTransition),
    Job(Box<JobRecord>),
    Rank(Box<OwnedRankChange>),
}

/// What a `resources` record of a rank's change is made from, owned.
#[derive(Debug, Clone)]
struct OwnedRankChange {
    cluster: CompactString,
    change: RankChange,
    event: Option<Event>,
    /// When it changed, for a change no event made (draining).
    at: Option<f64>,
}

impl OutputRecord {
    /// A record from anything that serializes to a JSON object (a
    /// record struct, or a `Value` built as a map).
    pub fn new(stream: OutputStream, value: &impl Serialize) -> Self {
        OutputRecord {
            stream,
            line: OnceLock::from(json_line(value)),
            unwritten: Unwritten::Nothing,
        }
    }

    fn unwritten(stream: OutputStream, what: Unwritten) -> Self {
        OutputRecord {
            stream,
            line: OnceLock::new(),
            unwritten: what,
        }
    }

    /// A `transitions` record of a job's state change, caused by `event`.
    pub fn transition(t: &KeyedTransition, event: &str) -> Self {
        let owned = OwnedTransition {
            // Copied, not shared: a count of references written by the
            // shard's thread and a sink's for every record costs more.
            cluster: t.key.cluster.as_ref().into(),
            event: event.into(),
            id: t.key.id,
            transition: t.transition,
        };
        Self::unwritten(OutputStream::Transitions, Unwritten::Transition(owned))
    }

    /// A `jobs` record: a job's summary.
    pub fn job(record: JobRecord) -> Self {
        Self::unwritten(OutputStream::Jobs, Unwritten::Job(Box::new(record)))
    }

    /// A `job_updates` record: an active job's summary.
    pub fn job_update(record: JobRecord) -> Self {
        Self::unwritten(OutputStream::JobUpdates, Unwritten::Job(Box::new(record)))
    }

    /// A `resources` record of what `event` did to one rank.
    pub fn rank_change(cluster: &str, change: RankChange, event: Option<Event>) -> Self {
        let owned = OwnedRankChange {
            cluster: cluster.into(),
            change,
            event,
            at: None,
        };
        Self::unwritten(OutputStream::Resources, Unwritten::Rank(Box::new(owned)))
    }

    /// A rank's change that no resource event made: a drained rank whose
    /// last job went (drained) or that a job holds (draining), as of `at`.
    pub fn rank_change_at(cluster: &str, change: RankChange, at: f64) -> Self {
        let owned = OwnedRankChange {
            cluster: cluster.into(),
            change,
            event: None,
            at: Some(at),
        };
        Self::unwritten(OutputStream::Resources, Unwritten::Rank(Box::new(owned)))
    }

    /// The record's JSON text.
    pub fn line(&self) -> &str {
        self.line.get_or_init(|| match &self.unwritten {
            Unwritten::Transition(t) => {
                json_line(&transition(&t.cluster, t.id, &t.transition, &t.event))
            }
            Unwritten::Job(j) => json_line(&**j),
            Unwritten::Rank(r) => match r.at {
                Some(at) => json_line(&rank_change_at(&r.cluster, &r.change, at)),
                None => json_line(&rank_change(&r.cluster, &r.change, r.event.as_ref())),
            },
            Unwritten::Nothing => String::new(),
        })
    }
}

impl PartialEq for OutputRecord {
    fn eq(&self, other: &Self) -> bool {
        self.stream == other.stream && self.line() == other.line()
    }
}

/// What a transition record is made from, owned.
#[derive(Debug, Clone)]
struct OwnedTransition {
    /// Inline when short (most names): no allocation of their own.
    cluster: CompactString,
    event: CompactString,
    id: JobId,
    transition: Transition,
}

/// JSON text of a record. Room for a whole transition line from the start
/// (serde_json's own guess is 128 bytes; the line is then copied to grow).
/// Not a `Value`'s `to_string()`: `Display` writes through a formatter,
/// piece by piece, at several times the cost (the same bytes).
fn json_line(value: &impl Serialize) -> String {
    let mut out = Vec::with_capacity(384);
    if serde_json::to_writer(&mut out, value).is_err() {
        return String::new();
    }
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

/// `"kind":"job"`: a job summary with the fields of `flux jobs --json`.
pub fn job(key: &JobKey, entry: &JobEntry) -> Value {
    serde_json::to_value(JobRecord::new(key, entry)).unwrap_or(Value::Null)
}

/// A job record, serialized straight to its line: the summary's fields
/// and the record's own, in the sorted order of a record built as a map.
///
/// Owned, so that its line can be written where it is first wanted (a
/// sink's thread) rather than on the shard's.
#[derive(Debug, Clone, Serialize)]
pub struct JobRecord {
    #[serde(skip_serializing_if = "Option::is_none")]
    bank: Option<CompactString>,
    cluster: Box<str>,
    dependencies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exception_note: Option<String>,
    /// As job-list gives them: of an inactive job only (false before).
    exception_occurred: bool,
    /// An exception raised while the job is still active (one that was
    /// not fatal, or not yet final): job-list shows none until the job
    /// ends, but an operator looking at the job wants it.
    #[serde(skip_serializing_if = "Option::is_none")]
    exception_raised: Option<RaisedException>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exception_severity: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exception_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expiration: Option<f64>,
    id: u64,
    /// The id in F58, as `flux jobs` prints it: a string, which JSON
    /// readers that keep numbers in doubles (JavaScript, jq 1.6) cannot
    /// round, as they round ids past 2^53.
    jobid: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ncores: Option<u32>,
    /// R's GPUs (not a field of flux-core 0.88's job-list).
    #[serde(skip_serializing_if = "Option::is_none")]
    ngpus: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nnodes: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nodelist: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ntasks: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    project: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks: Option<String>,
    record_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<JobResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    returncode: Option<i64>,
    state: JobState,
    #[serde(skip_serializing_if = "Option::is_none")]
    success: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    t_cleanup: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    t_depend: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    t_inactive: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    t_run: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    t_submit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    urgency: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    userid: Option<i64>,
    /// As resolved where Flux runs; absent when Flux's side did not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    username: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waitstatus: Option<i64>,
}

/// An active job's exception, in [`JobRecord::exception_raised`].
#[derive(Debug, Clone, PartialEq, Serialize)]
struct RaisedException {
    // In key order, as every record's keys are.
    note: String,
    severity: i64,
    #[serde(rename = "type")]
    kind: String,
}

impl JobRecord {
    pub fn new(key: &JobKey, entry: &JobEntry) -> Self {
        let job = &entry.job;
        let s = job.summary_view();
        let t = job.last_timestamp().unwrap_or(0.0).to_bits().to_le_bytes();
        let spec = s.spec;
        let text = |f: fn(&JobSpec) -> &Option<CompactString>| spec.and_then(|s| f(s).clone());
        // job-list gives a job's exception once it is inactive.
        let ended = s.ended_exception();
        JobRecord {
            bank: text(|s| &s.bank),
            cluster: key.cluster.as_ref().into(),
            dependencies: s.dependencies.to_vec(),
            duration: spec.and_then(|s| s.duration),
            exception_note: ended.map(|e| e.note.clone()),
            exception_occurred: ended.is_some(),
            exception_raised: s
                .exception
                .filter(|_| ended.is_none())
                .map(|e| RaisedException {
                    kind: e.kind.clone(),
                    severity: e.severity,
                    note: e.note.clone(),
                }),
            exception_severity: ended.map(|e| e.severity),
            exception_type: ended.map(|e| e.kind.clone()),
            expiration: s.expiration,
            id: key.id.0,
            jobid: key.id.encode(crate::flux::jobid::Encoding::F58),
            kind: "job",
            name: text(|s| &s.name),
            ncores: spec.and_then(JobSpec::ncores),
            ngpus: spec.and_then(JobSpec::ngpus),
            nnodes: spec.and_then(JobSpec::nnodes),
            nodelist: text(|s| &s.nodelist),
            ntasks: spec.and_then(JobSpec::ntasks),
            priority: s.priority,
            project: text(|s| &s.project),
            queue: text(|s| &s.queue),
            ranks: s.ranks_text(),
            record_id: record_id(&[b"job", key.cluster.as_bytes(), &key.id.0.to_le_bytes(), &t]),
            result: s.result,
            returncode: s.returncode,
            state: s.state,
            success: s.success,
            t_cleanup: s.t_cleanup,
            t_depend: s.t_depend,
            t_inactive: s.t_inactive,
            t_run: s.t_run,
            t_submit: s.t_submit,
            urgency: s.urgency,
            userid: s.userid,
            username: text(|s| &s.username),
            waitstatus: s.waitstatus,
        }
    }
}

fn rank_fields(map: &mut Map<String, Value>, r: &RankState) {
    map.insert("rank".into(), json!(r.rank));
    map.insert("hostname".into(), json!(r.hostname));
    map.insert("online".into(), json!(r.online));
    map.insert("torpid".into(), json!(r.torpid));
    map.insert("drained".into(), json!(r.drained));
    map.insert("draining".into(), json!(r.draining));
    map.insert("drain_reason".into(), json!(r.drain_reason));
    map.insert("drain_timestamp".into(), json!(r.drain_timestamp));
}

/// `"kind":"rank"`: one rank's state (a replay result; no record id).
pub fn rank(cluster: &str, r: &RankState) -> Value {
    let mut map = Map::new();
    map.insert("kind".into(), json!("rank"));
    map.insert("cluster".into(), json!(cluster));
    rank_fields(&mut map, r);
    Value::Object(map)
}

/// `"kind":"rank"` on the `resources` stream: the rank's new state, which
/// fields changed, and the event that changed them.
pub fn rank_change(cluster: &str, change: &RankChange, event: Option<&Event>) -> Value {
    let mut map = Map::new();
    map.insert("kind".into(), json!("rank"));
    map.insert("cluster".into(), json!(cluster));
    match &change.after {
        Some(r) => rank_fields(&mut map, r),
        None => {
            map.insert("rank".into(), json!(change.rank));
            map.insert("removed".into(), json!(true));
        }
    }
    map.insert("changed".into(), json!(change.changed_fields()));
    let (name, ts) = event.map_or(("", 0.0), |e| (e.name.as_str(), e.timestamp));
    if let Some(ev) = event {
        map.insert("event".into(), json!(ev.name));
        map.insert("timestamp".into(), json!(ev.timestamp));
    }
    map.insert(
        "record_id".into(),
        json!(rank_record_id(cluster, change, name, ts)),
    );
    Value::Object(map)
}

/// A rank record's id: the rank, what changed it when, and what changed.
/// One event can make two records of a rank (a drain that finds the rank
/// already freed: draining, then not), and each needs its own id.
fn rank_record_id(cluster: &str, change: &RankChange, what: &str, ts: f64) -> String {
    let changed = change.changed_fields().join(",");
    let after = change.after.as_ref().map_or(0u8, |r| {
        u8::from(r.online == Some(true))
            | u8::from(r.drained) << 1
            | u8::from(r.draining) << 2
            | u8::from(r.torpid) << 3
    });
    record_id(&[
        b"rank",
        cluster.as_bytes(),
        &change.rank.to_le_bytes(),
        what.as_bytes(),
        &ts.to_bits().to_le_bytes(),
        changed.as_bytes(),
        &[after],
    ])
}

/// A rank's change that no resource event made (its jobs did: draining),
/// with when it was seen; its id names what it became and when.
pub fn rank_change_at(cluster: &str, change: &RankChange, at: f64) -> Value {
    let mut v = rank_change(cluster, change, None);
    let became = match &change.after {
        Some(r) if r.draining => "draining",
        _ => "drained",
    };
    if let Value::Object(map) = &mut v {
        map.insert("timestamp".into(), json!(at));
        map.insert(
            "record_id".into(),
            json!(rank_record_id(cluster, change, became, at)),
        );
    }
    v
}

/// `"kind":"anomaly"`: the anomaly's own kind moves to `anomaly`.
pub fn anomaly(a: &KeyedAnomaly) -> Value {
    let mut v = serde_json::to_value(a).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut v {
        if let Some(k) = map.remove("kind") {
            map.insert("anomaly".into(), k);
        }
        map.insert("kind".into(), json!("anomaly"));
        let an = &a.anomaly;
        map.insert(
            "record_id".into(),
            json!(record_id(&[
                b"anomaly",
                a.cluster.as_bytes(),
                &id_bytes(a.id),
                an.stream.as_str().as_bytes(),
                an.kind.as_str().as_bytes(),
                an.event.as_deref().unwrap_or("").as_bytes(),
                &an.timestamp.unwrap_or(0.0).to_bits().to_le_bytes(),
                &an.rank.unwrap_or(u32::MAX).to_le_bytes(),
                an.message.as_bytes(),
            ])),
        );
    }
    v
}

/// `"kind":"transition"`: a job state change.
pub fn transition<'a>(
    cluster: &'a str,
    id: JobId,
    t: &Transition,
    event: &'a str,
) -> TransitionRecord<'a> {
    TransitionRecord {
        cluster,
        event,
        from: t.from,
        id: id.0,
        kind: "transition",
        record_id: record_id(&[
            b"transition",
            cluster.as_bytes(),
            &id.0.to_le_bytes(),
            t.to.as_str().as_bytes(),
            &t.timestamp.to_bits().to_le_bytes(),
        ]),
        timestamp: t.timestamp,
        to: t.to,
    }
}

/// A transition record, serialized straight to its line (one per state
/// change: the hot output). Fields in the sorted order every other record
/// has, as a JSON object built from a map.
#[derive(Debug, Serialize)]
pub struct TransitionRecord<'a> {
    cluster: &'a str,
    event: &'a str,
    from: JobState,
    id: u64,
    kind: &'static str,
    record_id: String,
    timestamp: f64,
    to: JobState,
}

/// `"kind":"event"`: an input event, normalized. Its shape is the
/// envelope input form, so one fluxpipe's `events` feed another's sources.
pub fn event(
    cluster: &str,
    stream: EventStream,
    id: Option<JobId>,
    ev: &Event,
    source: &str,
) -> Value {
    let mut map = Map::new();
    map.insert("kind".into(), json!("event"));
    map.insert("cluster".into(), json!(cluster));
    map.insert("stream".into(), json!(stream.as_str()));
    if let Some(id) = id {
        map.insert("id".into(), json!(id.0));
    }
    map.insert(
        "event".into(),
        serde_json::to_value(ev).unwrap_or(Value::Null),
    );
    map.insert("source".into(), json!(source));
    map.insert(
        "record_id".into(),
        json!(record_id(&[
            b"event",
            cluster.as_bytes(),
            stream.as_str().as_bytes(),
            &id_bytes(id),
            ev.name.as_bytes(),
            &ev.timestamp.to_bits().to_le_bytes(),
        ])),
    );
    Value::Object(map)
}

/// `"kind":"R"`: an R document as it came (a job's, or an instance's), for
/// the `events` feed: what a downstream fluxpipe needs besides the events
/// (a job's expiration, an instance's ranks). The envelope decoder reads it
/// back.
pub fn r_document(
    cluster: &str,
    stream: EventStream,
    id: Option<JobId>,
    r: &Value,
    source: &str,
) -> Value {
    let text = r.to_string();
    json!({
        "kind": "R",
        "cluster": cluster,
        "stream": stream.as_str(),
        "id": id.map(|i| i.0),
        "R": r,
        "source": source,
        "record_id": record_id(&[
            b"R",
            cluster.as_bytes(),
            stream.as_str().as_bytes(),
            &id_bytes(id),
            text.as_bytes(),
        ]),
    })
}

/// `"kind":"jobspec"`: a job's jobspec as it came (what the journal
/// carries with `submit`), for the envelope decoder to read back.
pub fn jobspec_document(cluster: &str, id: Option<JobId>, spec: &Value, source: &str) -> Value {
    let text = spec.to_string();
    json!({
        "kind": "jobspec",
        "cluster": cluster,
        "stream": "job",
        "id": id.map(|i| i.0),
        "jobspec": spec,
        "source": source,
        "record_id": record_id(&[
            b"jobspec",
            cluster.as_bytes(),
            &id_bytes(id),
            text.as_bytes(),
        ]),
    })
}

/// `"kind":"username"`: who submitted a job, by name, as Flux's side
/// resolved it, for the envelope decoder to read back.
pub fn username_document(cluster: &str, id: Option<JobId>, name: &str, source: &str) -> Value {
    json!({
        "kind": "username",
        "cluster": cluster,
        "stream": "job",
        "id": id.map(|i| i.0),
        "username": name,
        "source": source,
        "record_id": record_id(&[
            b"username",
            cluster.as_bytes(),
            &id_bytes(id),
            name.as_bytes(),
        ]),
    })
}

/// RFC 3339 text of a time in seconds since the epoch, to the
/// microsecond (what an f64 of today's epoch seconds holds exactly).
pub fn rfc3339(ts: f64) -> String {
    let micros = (ts * 1e6).round();
    let t = if micros.is_finite() {
        jiff::Timestamp::from_nanosecond(micros as i128 * 1000).ok()
    } else {
        None
    };
    t.unwrap_or(jiff::Timestamp::UNIX_EPOCH).to_string()
}

/// `"kind":"alert"`: an alert firing or resolving, with the labels that
/// identify it to Alertmanager and a human summary (with a drained node's
/// drain reason).
pub fn alert(rule: &Rule, a: &AlertEvent) -> Value {
    let mut labels = Map::new();
    labels.insert("alertname".into(), json!(rule.name));
    labels.insert("flux_cluster".into(), json!(a.subject.cluster()));
    labels.insert("severity".into(), json!(rule.severity));
    let hold = &rule.hold_text;
    let mut map = Map::new();
    map.insert("kind".into(), json!("alert"));
    map.insert("status".into(), json!(a.status.as_str()));
    map.insert("alertname".into(), json!(rule.name));
    map.insert("rule_kind".into(), json!(rule.kind.name()));
    map.insert("severity".into(), json!(rule.severity));
    map.insert("cluster".into(), json!(a.subject.cluster()));
    let (summary, subject_bytes) = match (&a.subject, &a.detail) {
        (Subject::Job(k), detail) => {
            let f58 = k.id.to_f58();
            labels.insert("jobid".into(), json!(f58));
            let state = match (rule.kind, detail.job_state()) {
                (RuleKind::JobState(s), _) | (_, Some(s)) => s.as_str(),
                _ => "",
            };
            if !state.is_empty() {
                labels.insert("state".into(), json!(state));
                map.insert("state".into(), json!(state));
            }
            // As it stood when the alert fired, as the state.
            if let Some(queue) = detail.queue() {
                labels.insert("queue".into(), json!(queue));
                map.insert("queue".into(), json!(queue));
            }
            map.insert("id".into(), json!(k.id.0));
            let summary = match rule.kind {
                RuleKind::JobState(s) => format!("job {f58} in {s} for more than {hold}"),
                RuleKind::Prolog => format!("prolog of job {f58} running for more than {hold}"),
                RuleKind::Epilog => format!("epilog of job {f58} running for more than {hold}"),
                RuleKind::Overrun => {
                    format!("job {f58} still running more than {hold} past its expiration")
                }
                RuleKind::ExecIncomplete => format!(
                    "exec of job {f58} complete but its eventlog has no `done` after {hold}"
                ),
                _ => format!("job {f58}: {}", rule.name),
            };
            (summary, k.id.0.to_le_bytes())
        }
        (Subject::Node(n), detail) => {
            let host = crate::flux::resource::rank_name(n.rank, detail.host()).into_owned();
            labels.insert("node".into(), json!(host));
            labels.insert("rank".into(), json!(n.rank.to_string()));
            // As it stood when the alert fired (its detail is kept from
            // then): a label that changed under an open alert would split
            // it in two at Alertmanager.
            if let Some(draining) = detail.draining() {
                let state = if draining { "draining" } else { "drained" };
                labels.insert("state".into(), json!(state));
                map.insert("state".into(), json!(state));
            }
            map.insert("node".into(), json!(host));
            map.insert("rank".into(), json!(n.rank));
            let what = match rule.kind {
                RuleKind::NodeDrained => "drained",
                RuleKind::NodeOffline => "offline",
                RuleKind::NodeTorpid => "torpid (not heard from)",
                _ => rule.name.as_str(),
            };
            let summary = format!("node {host} (rank {}) {what} for more than {hold}", n.rank);
            (summary, u64::from(n.rank).to_le_bytes())
        }
    };
    let mut annotations = Map::new();
    annotations.insert("summary".into(), json!(summary));
    if let Some(r) = a.detail.reason().filter(|r| !r.is_empty()) {
        annotations.insert("reason".into(), json!(r));
    }
    annotations.insert("since".into(), json!(rfc3339(a.since)));
    map.insert("labels".into(), Value::Object(labels));
    map.insert("annotations".into(), Value::Object(annotations));
    map.insert("since".into(), json!(a.since));
    map.insert("starts_at".into(), json!(rfc3339(a.starts_at)));
    map.insert("ends_at".into(), json!(a.ends_at.map(rfc3339)));
    let ends = a.ends_at.unwrap_or(f64::NAN).to_bits().to_le_bytes();
    map.insert(
        "record_id".into(),
        json!(record_id(&[
            b"alert",
            rule.name.as_bytes(),
            a.subject.cluster().as_bytes(),
            &[matches!(a.subject, Subject::Job(_)) as u8],
            &subject_bytes,
            a.status.as_str().as_bytes(),
            &a.starts_at.to_bits().to_le_bytes(),
            &ends,
        ])),
    );
    Value::Object(map)
}

/// Mark an alert record as announced again from restored state (after a
/// restart or a takeover): a receiver may have been paged for it already
/// (see [`crate::sinks::pager`]).
pub fn mark_restored(record: &mut Value) {
    if let Some(map) = record.as_object_mut() {
        map.insert("restored".into(), Value::Bool(true));
    }
}

/// An alert of the feed watch (`feed_silent`, `instance_down`), in the
/// form of every other alert record: a cluster's, with the source of a
/// silent feed as a label.
pub fn watch_alert(rule: &Rule, a: &WatchAlert) -> Value {
    let cluster = a.subject.cluster.as_str();
    let hold = &rule.hold_text;
    let mut labels = Map::new();
    labels.insert("alertname".into(), json!(rule.name));
    labels.insert("flux_cluster".into(), json!(cluster));
    labels.insert("severity".into(), json!(rule.severity));
    let summary = match (rule.kind, a.subject.source.as_deref()) {
        (RuleKind::FeedSilent, Some(source)) => {
            labels.insert("source".into(), json!(source));
            format!(
                "nothing heard from cluster {cluster} on source {source} (no record, no heartbeat) for more than {hold}"
            )
        }
        (RuleKind::InstanceDown, _) => {
            format!("the Flux instance of cluster {cluster} is down (for more than {hold})")
        }
        _ => format!("cluster {cluster}: {}", rule.name),
    };
    let mut annotations = Map::new();
    annotations.insert("summary".into(), json!(summary));
    annotations.insert("since".into(), json!(rfc3339(a.since)));
    let ends = a.ends_at.unwrap_or(f64::NAN).to_bits().to_le_bytes();
    let source = a.subject.source.as_deref().unwrap_or("");
    json!({
        "kind": "alert",
        "status": a.status.as_str(),
        "alertname": rule.name,
        "rule_kind": rule.kind.name(),
        "severity": rule.severity,
        "cluster": cluster,
        "source": a.subject.source,
        "labels": labels,
        "annotations": annotations,
        "since": a.since,
        "starts_at": rfc3339(a.starts_at),
        "ends_at": a.ends_at.map(rfc3339),
        "record_id": record_id(&[
            b"alert",
            rule.name.as_bytes(),
            cluster.as_bytes(),
            &[2],
            source.as_bytes(),
            a.status.as_str().as_bytes(),
            &a.starts_at.to_bits().to_le_bytes(),
            &ends,
        ]),
    })
}

/// The most of an undecodable line that a dead letter carries.
pub const DEAD_LETTER_MAX_BYTES: usize = 4096;

/// `"kind":"dead_letter"`: input that could not be decoded, where it came
/// from and why.
pub fn dead_letter(source: &str, location: &str, error: &str, line: &[u8]) -> Value {
    let cut = &line[..line.len().min(DEAD_LETTER_MAX_BYTES)];
    json!({
        "kind": "dead_letter",
        "source": source,
        "location": location,
        "error": error,
        "line": String::from_utf8_lossy(cut),
        "truncated": line.len() > DEAD_LETTER_MAX_BYTES,
        "record_id": record_id(&[b"dead_letter", source.as_bytes(), location.as_bytes(), line]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_set_holds_each_stream_apart() {
        let all: StreamSet = OutputStream::ALL.into_iter().collect();
        for s in OutputStream::ALL {
            let one = StreamSet::from_iter([s]);
            assert!(one.contains(s) && all.contains(s));
            assert_eq!(
                OutputStream::ALL
                    .iter()
                    .filter(|o| one.contains(**o))
                    .count(),
                1
            );
            assert_eq!(StreamSet::from_bits(one.bits()), one);
        }
        assert!(StreamSet::EMPTY.is_empty() && !all.is_empty());
        assert_eq!(StreamSet::EMPTY.union(all), all);
    }

    #[test]
    fn a_transition_line_is_the_json_object_of_its_fields() {
        let t = KeyedTransition {
            key: JobKey {
                cluster: "c\"1".into(),
                id: JobId(42),
            },
            transition: crate::flux::job::Transition {
                from: JobState::Sched,
                to: JobState::Run,
                timestamp: 1700000000.25,
            },
        };
        let rec = transition(&t.key.cluster, t.key.id, &t.transition, "alloc");
        let as_map = json!({
            "kind": "transition", "cluster": "c\"1", "id": 42, "from": "SCHED",
            "to": "RUN", "timestamp": 1700000000.25, "event": "alloc",
            "record_id": rec.record_id.clone(),
        });
        let want = serde_json::to_string(&as_map).unwrap_or_default();
        assert_eq!(
            OutputRecord::new(OutputStream::Transitions, &rec).line(),
            want
        );
        // Written later, on a sink's thread: the same line.
        let lazy = OutputRecord::transition(&t, "alloc");
        assert_eq!(lazy.stream, OutputStream::Transitions);
        assert_eq!(lazy.line(), want);
    }

    /// A job record as it was built before `JobRecord`: the summary as a
    /// map, with the record's own keys added.
    fn job_as_map(key: &JobKey, entry: &JobEntry) -> Value {
        let mut v = serde_json::to_value(entry.summary()).unwrap_or_default();
        let t = entry.job.last_timestamp().unwrap_or(0.0).to_bits();
        let id = record_id(&[
            b"job",
            key.cluster.as_bytes(),
            &key.id.0.to_le_bytes(),
            &t.to_le_bytes(),
        ]);
        if let Value::Object(map) = &mut v {
            map.insert("kind".into(), json!("job"));
            map.insert("cluster".into(), json!(key.cluster));
            map.insert("id".into(), json!(key.id.0));
            map.insert("jobid".into(), json!(key.id.to_f58()));
            map.insert("record_id".into(), json!(id));
            if let Some(e) = entry.job.exception.as_deref()
                && entry.job.state != JobState::Inactive
            {
                map.insert(
                    "exception_raised".into(),
                    json!({"type": e.kind, "severity": e.severity, "note": e.note}),
                );
            }
        }
        v
    }

    #[test]
    fn a_job_line_is_the_summary_map_with_the_record_keys() {
        let key = JobKey {
            cluster: "c".into(),
            id: JobId(7),
        };
        let events = [
            Event::new(1.0, "submit")
                .with_context(json!({"userid": 5, "urgency": 16, "flags": 0, "version": 1})),
            Event::new(1.5, "dependency-add").with_context(json!({"description": "after:\"x"})),
            Event::new(2.0, "validate"),
            Event::new(3.0, "depend"),
            Event::new(3.5, "priority").with_context(json!({"priority": 9})),
            Event::new(4.0, "alloc"),
            Event::new(4.5, "exception")
                .with_context(json!({"type": "cancel", "severity": 0, "note": "n\u{e9}"})),
            Event::new(5.0, "finish").with_context(json!({"status": 256})),
            Event::new(6.0, "clean"),
        ];
        let mut entry = JobEntry::default();
        for n in 0..=events.len() {
            if n > 0 {
                entry.job.apply(&events[n - 1]);
            }
            let rec = OutputRecord::job(JobRecord::new(&key, &entry));
            assert_eq!(rec.stream, OutputStream::Jobs);
            let want = serde_json::to_string(&job_as_map(&key, &entry)).unwrap_or_default();
            assert_eq!(rec.line(), want, "after {n} events (written late)");
            let now = OutputRecord::new(OutputStream::Jobs, &JobRecord::new(&key, &entry));
            assert_eq!(now.line(), want, "after {n} events");
            assert_eq!(job(&key, &entry), job_as_map(&key, &entry));
            // job-list gives the exception once the job is inactive; the
            // record keeps it apart before.
            let v: Value = serde_json::from_str(rec.line()).unwrap_or_default();
            match n {
                7 | 8 => {
                    assert_eq!(v["exception_occurred"], false, "after {n}");
                    assert!(v.get("exception_type").is_none(), "after {n}");
                    assert_eq!(v["exception_raised"]["type"], "cancel", "after {n}");
                }
                9 => {
                    assert_eq!(v["exception_occurred"], true);
                    assert_eq!(v["exception_type"], "cancel");
                    assert!(v.get("exception_raised").is_none());
                }
                _ => {}
            }
        }
    }

    #[test]
    fn record_ids_are_deterministic_and_distinct() {
        let ev = Event::new(1.5, "submit");
        let a = event("c", EventStream::Job, Some(JobId(1)), &ev, "s");
        let b = event("c", EventStream::Job, Some(JobId(1)), &ev, "other-source");
        let c = event("c", EventStream::Job, Some(JobId(2)), &ev, "s");
        assert_eq!(
            a["record_id"], b["record_id"],
            "the source does not change identity"
        );
        assert_ne!(a["record_id"], c["record_id"]);
        assert_eq!(a["record_id"].as_str().map(str::len), Some(16));
        // pinned: the id must not change between versions or runs
        assert_eq!(record_id(&[b"a", b"bc"]), "f42ee0df2a023ef1");
        assert_ne!(record_id(&[b"ab", b"c"]), record_id(&[b"a", b"bc"]));
    }
}
