//! Output records: one type per kind of record, each written as one JSON
//! object with a `kind` and its keys in sorted order. What writes a record
//! (the processor's effects, a source's dead letters, the feed watch) and
//! what reads it (the sinks, the archive, the pagers, the tap, the query
//! API, `fluxpipe top`) share its type; `fluxpipe replay` prints the same.

pub mod alert;
pub mod effects;
pub mod job;
pub mod records;

pub use alert::{AlertRecord, AlertStatus, alert, watch_alert};
pub use job::JobRecord;
pub use records::{
    AnomalyRecord, DEAD_LETTER_MAX_BYTES, DeadLetterRecord, Document, DocumentRecord, EventRecord,
    RankRecord, RankStateRecord, TransitionRecord,
};

use crate::flux::jobid::JobId;
use crate::flux::resource::RankChange;
use crate::keyed::state::{KeyedAnomaly, KeyedTransition};
use serde::{Deserialize, Serialize};
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

/// The `kind` of a record: what its type is, in its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    Event,
    #[serde(rename = "R")]
    R,
    #[serde(rename = "jobspec")]
    JobSpec,
    Username,
    Transition,
    Job,
    Rank,
    Alert,
    Anomaly,
    DeadLetter,
}

/// One record on its way to the sinks: the stream it belongs to, what it
/// is ([`Payload`]), and its JSON text (no trailing newline), written once
/// for every sink where it is first wanted: on a sink's thread, not on
/// the shard's (the busiest), and not at all for a sink that only counts
/// records.
#[derive(Debug, Clone)]
pub struct OutputRecord {
    pub stream: OutputStream,
    line: OnceLock<String>,
    payload: Payload,
}

/// What a record is. A transition is held inline (one allocation for the
/// whole record, freed on a sink's thread); the larger and rarer kinds
/// are boxed.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Event(Box<EventRecord>),
    Document(Box<DocumentRecord>),
    Transition(TransitionRecord),
    Job(Box<JobRecord>),
    Rank(Box<RankRecord>),
    Alert(Box<AlertRecord>),
    Anomaly(Box<AnomalyRecord>),
    DeadLetter(Box<DeadLetterRecord>),
    /// A line of no kind of ours, written already ([`OutputRecord::raw`]).
    Line,
}

/// What a tap's reader can ask of any record without reading its line:
/// which cluster, job, rank and node it concerns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Subject<'a> {
    pub cluster: Option<&'a str>,
    pub id: Option<u64>,
    pub rank: Option<u32>,
    /// A host name (a rank's, or an alert's node).
    pub node: Option<&'a str>,
}

impl OutputRecord {
    fn of(stream: OutputStream, payload: Payload) -> Self {
        OutputRecord {
            stream,
            line: OnceLock::new(),
            payload,
        }
    }

    /// A record of no kind of ours, from anything that serializes to a
    /// JSON object: only its line is known, so the archive ignores it,
    /// the tap's filters and the pagers pass it by, and its Kafka key is
    /// empty. For tests of what carries records; every record the
    /// pipeline makes has a kind.
    pub fn raw(stream: OutputStream, value: &impl Serialize) -> Self {
        OutputRecord {
            stream,
            line: OnceLock::from(json_line(value)),
            payload: Payload::Line,
        }
    }

    /// A `transitions` record of a job's state change, caused by `event`.
    pub fn transition(t: &KeyedTransition, event: &str) -> Self {
        let record = TransitionRecord {
            // Copied, not shared: a count of references written by the
            // shard's thread and a sink's for every record costs more.
            cluster: t.key.cluster.as_ref().into(),
            event: event.into(),
            id: t.key.id,
            transition: t.transition,
        };
        Self::of(OutputStream::Transitions, Payload::Transition(record))
    }

    /// A `jobs` record: a job's summary.
    pub fn job(record: JobRecord) -> Self {
        Self::of(OutputStream::Jobs, Payload::Job(Box::new(record)))
    }

    /// A `job_updates` record: an active job's summary.
    pub fn job_update(record: JobRecord) -> Self {
        Self::of(OutputStream::JobUpdates, Payload::Job(Box::new(record)))
    }

    /// A `resources` record of what an event (its name and time) did to
    /// one rank.
    pub fn rank_change(cluster: &str, change: RankChange, event: Option<(&str, f64)>) -> Self {
        let record = RankRecord {
            cluster: cluster.into(),
            change,
            event: event.map(|(name, ts)| (name.into(), ts)),
            at: None,
        };
        Self::of(OutputStream::Resources, Payload::Rank(Box::new(record)))
    }

    /// A rank's change that no resource event made: a drained rank whose
    /// last job went (drained) or that a job holds (draining), as of `at`.
    pub fn rank_change_at(cluster: &str, change: RankChange, at: f64) -> Self {
        let record = RankRecord {
            cluster: cluster.into(),
            change,
            event: None,
            at: Some(at),
        };
        Self::of(OutputStream::Resources, Payload::Rank(Box::new(record)))
    }

    /// An `events` record: an input event, normalized.
    pub fn event(record: EventRecord) -> Self {
        Self::of(OutputStream::Events, Payload::Event(Box::new(record)))
    }

    /// An `events` record of a document beside the events.
    pub fn document(record: DocumentRecord) -> Self {
        Self::of(OutputStream::Events, Payload::Document(Box::new(record)))
    }

    /// An `alerts` record.
    pub fn alert(record: AlertRecord) -> Self {
        Self::of(OutputStream::Alerts, Payload::Alert(Box::new(record)))
    }

    /// An `anomalies` record.
    pub fn anomaly(anomaly: KeyedAnomaly) -> Self {
        let record = AnomalyRecord(anomaly);
        Self::of(OutputStream::Anomalies, Payload::Anomaly(Box::new(record)))
    }

    /// A `dead_letter` record.
    pub fn dead_letter(record: DeadLetterRecord) -> Self {
        Self::of(
            OutputStream::DeadLetter,
            Payload::DeadLetter(Box::new(record)),
        )
    }

    /// What the record is.
    pub fn payload(&self) -> &Payload {
        &self.payload
    }

    /// The alert, if the record is one.
    pub fn as_alert(&self) -> Option<&AlertRecord> {
        match &self.payload {
            Payload::Alert(a) => Some(a),
            _ => None,
        }
    }

    /// Which cluster, job, rank and node the record concerns.
    pub fn subject(&self) -> Subject<'_> {
        let id = |id: Option<JobId>| id.map(|i| i.0);
        match &self.payload {
            Payload::Event(e) => Subject {
                cluster: Some(&e.cluster),
                id: id(e.id),
                ..Subject::default()
            },
            Payload::Document(d) => Subject {
                cluster: Some(&d.cluster),
                id: id(d.id),
                ..Subject::default()
            },
            Payload::Transition(t) => Subject {
                cluster: Some(&t.cluster),
                id: Some(t.id.0),
                ..Subject::default()
            },
            Payload::Job(j) => Subject {
                cluster: Some(&j.cluster),
                id: Some(j.id),
                ..Subject::default()
            },
            Payload::Rank(r) => Subject {
                cluster: Some(&r.cluster),
                rank: Some(r.rank()),
                node: r.after().and_then(|s| s.hostname.as_deref()),
                ..Subject::default()
            },
            Payload::Alert(a) => Subject {
                cluster: Some(&a.cluster),
                id: a.id,
                rank: a.rank,
                node: a.node.as_deref(),
            },
            Payload::Anomaly(a) => Subject {
                cluster: Some(&a.0.cluster),
                id: id(a.0.id),
                rank: a.0.anomaly.rank,
                node: None,
            },
            Payload::DeadLetter(_) | Payload::Line => Subject::default(),
        }
    }

    /// The key a keyed sink (Kafka) sends it under, so that a job's records
    /// stay in order on one partition: `<cluster>/<id>`, `<cluster>`, or
    /// the source for a dead letter (of no cluster).
    pub fn key(&self) -> String {
        let about = self.subject();
        match (about.cluster, about.id, &self.payload) {
            (Some(c), Some(id), _) => format!("{c}/{id}"),
            (Some(c), None, _) => c.to_string(),
            (None, _, Payload::DeadLetter(d)) => d.source.clone(),
            _ => String::new(),
        }
    }

    /// The record's JSON text.
    pub fn line(&self) -> &str {
        self.line.get_or_init(|| match &self.payload {
            Payload::Event(r) => json_line(r),
            Payload::Document(r) => json_line(r),
            Payload::Transition(r) => json_line(r),
            Payload::Job(r) => json_line(r),
            Payload::Rank(r) => json_line(r),
            Payload::Alert(r) => json_line(r),
            Payload::Anomaly(r) => json_line(r),
            Payload::DeadLetter(r) => json_line(r),
            Payload::Line => String::new(),
        })
    }
}

impl PartialEq for OutputRecord {
    fn eq(&self, other: &Self) -> bool {
        self.stream == other.stream && self.line() == other.line()
    }
}

/// JSON text of a record. Room for a whole transition line from the start
/// (serde_json's own guess is 128 bytes; the line is then copied to grow).
/// Not a `Value`'s `to_string()`: `Display` writes through a formatter,
/// piece by piece, at several times the cost (the same bytes).
pub fn json_line(value: &impl Serialize) -> String {
    let mut out = Vec::with_capacity(384);
    if serde_json::to_writer(&mut out, value).is_err() {
        return String::new();
    }
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::EventStream;
    use crate::flux::anomaly::{Anomaly, AnomalyKind, Stream};
    use crate::flux::event::Event;
    use crate::flux::job::{JobState, Transition};
    use crate::flux::resource::RankState;
    use crate::keyed::JobKey;
    use crate::keyed::alerts::event::{
        AlertEvent, Detail, Drain, NodeKey, Queued, Status, Subject,
    };
    use crate::keyed::alerts::rule::{Rule, RuleKind};
    use crate::keyed::alerts::watch::{WatchAlert, WatchSubject};
    use crate::keyed::state::JobEntry;
    use proptest::prelude::*;
    use serde_json::{Value, json};

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

    fn key(id: u64) -> JobKey {
        JobKey {
            cluster: "c\"1".into(),
            id: JobId(id),
        }
    }

    #[test]
    fn a_transition_line_is_the_json_object_of_its_fields() {
        let t = KeyedTransition {
            key: key(42),
            transition: Transition {
                from: JobState::Sched,
                to: JobState::Run,
                timestamp: 1700000000.25,
            },
        };
        let rec = OutputRecord::transition(&t, "alloc");
        let Payload::Transition(typed) = rec.payload() else {
            unreachable!("a transition")
        };
        let as_map = json!({
            "kind": "transition", "cluster": "c\"1", "id": 42, "from": "SCHED",
            "to": "RUN", "timestamp": 1700000000.25, "event": "alloc",
            "record_id": typed.record_id(),
        });
        assert_eq!(rec.stream, OutputStream::Transitions);
        assert_eq!(rec.line(), serde_json::to_string(&as_map).unwrap());
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
            if let Some(e) = entry.job.exception()
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
            assert_eq!(rec.line(), want, "after {n} events");
            // Read back, it is the same record.
            let back: JobRecord = serde_json::from_str(rec.line()).unwrap();
            assert_eq!(&back, &JobRecord::new(&key, &entry));
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

    fn event_record(id: u64, ev: Event, source: &str) -> EventRecord {
        EventRecord {
            cluster: "c".into(),
            stream: EventStream::Job,
            id: Some(JobId(id)),
            event: ev,
            source: source.into(),
        }
    }

    #[test]
    fn record_ids_are_deterministic_and_distinct() {
        let ev = Event::new(1.5, "submit");
        let a = event_record(1, ev.clone(), "s").record_id();
        let b = event_record(1, ev.clone(), "other-source").record_id();
        let c = event_record(2, ev, "s").record_id();
        assert_eq!(a, b, "the source does not change identity");
        assert_ne!(a, c);
        assert_eq!(a.len(), 16);
        // pinned: the id must not change between versions or runs
        assert_eq!(record_id(&[b"a", b"bc"]), "f42ee0df2a023ef1");
        assert_ne!(record_id(&[b"ab", b"c"]), record_id(&[b"a", b"bc"]));
    }

    fn rule(kind: RuleKind, name: &str) -> Rule {
        Rule::new(name, kind, "5m", "warning").unwrap()
    }

    /// One record of every kind, and of each shape a kind has.
    fn one_of_each() -> Vec<OutputRecord> {
        let mut out = Vec::new();
        // Events: with a context whose keys came unsorted, and spaced;
        // with keys of its own beyond the three.
        let mut ev = Event::new(1.5, "submit");
        ev.context = crate::flux::object::JsonObject::from_raw(
            serde_json::value::RawValue::from_string(
                r#"{ "z": 1, "a": {"y": 2, "b": [1, 2]} }"#.into(),
            )
            .unwrap(),
        )
        .ok();
        out.push(OutputRecord::event(event_record(1, ev.clone(), "s")));
        let mut extra = serde_json::Map::new();
        extra.insert("aa".into(), json!(1));
        extra.insert("zz".into(), json!({"k": "v"}));
        ev.extra = Some(Box::new(extra));
        out.push(OutputRecord::event(event_record(1, ev, "s")));
        out.push(OutputRecord::event(EventRecord {
            id: None,
            stream: EventStream::Resource,
            ..event_record(0, Event::new(2.0, "online"), "s")
        }));
        for (stream, document) in [
            (
                EventStream::Job,
                Document::R(json!({"version": 1, "execution": {"R_lite": []}})),
            ),
            (EventStream::Resource, Document::R(json!({"version": 1}))),
            (
                EventStream::Job,
                Document::JobSpec(json!({"version": 1, "tasks": []})),
            ),
            (EventStream::Job, Document::Username("alice".into())),
        ] {
            out.push(OutputRecord::document(DocumentRecord {
                cluster: "c".into(),
                stream,
                id: (stream == EventStream::Job).then_some(JobId(3)),
                document,
                source: "s".into(),
            }));
        }
        out.push(OutputRecord::transition(
            &KeyedTransition {
                key: key(5),
                transition: Transition {
                    from: JobState::New,
                    to: JobState::Depend,
                    timestamp: 1.0,
                },
            },
            "validate",
        ));
        let mut entry = JobEntry::default();
        entry
            .job
            .apply(&Event::new(1.0, "submit").with_context(json!({"userid": 5})));
        out.push(OutputRecord::job(JobRecord::new(&key(5), &entry)));
        out.push(OutputRecord::job_update(JobRecord::new(&key(5), &entry)));
        let up = RankState {
            rank: 4,
            hostname: Some("n4".into()),
            online: Some(true),
            ..RankState::new(4)
        };
        let drained = RankState {
            drained: true,
            draining: true,
            drain_reason: Some("bad fan".into()),
            drain_timestamp: Some(3.0),
            ..up.clone()
        };
        let change = |before: Option<&RankState>, after: Option<&RankState>| RankChange {
            rank: 4,
            before: before.cloned(),
            after: after.cloned(),
        };
        out.push(OutputRecord::rank_change(
            "c",
            change(None, Some(&up)),
            Some(("online", 2.0)),
        ));
        out.push(OutputRecord::rank_change(
            "c",
            change(Some(&up), None),
            None,
        ));
        out.push(OutputRecord::rank_change_at(
            "c",
            change(Some(&up), Some(&drained)),
            4.0,
        ));
        let job_alert = AlertEvent {
            rule: 0,
            subject: Subject::Job(key(6)),
            status: Status::Resolved,
            since: 10.0,
            starts_at: 310.0,
            ends_at: Some(400.5),
            detail: Detail::Queued(std::sync::Arc::new(Queued {
                state: JobState::Sched,
                queue: "debug".into(),
            })),
        };
        out.push(OutputRecord::alert(alert(
            &rule(RuleKind::JobState(JobState::Sched), "sched_too_long"),
            &job_alert,
        )));
        let node_alert = AlertEvent {
            subject: Subject::Node(NodeKey {
                cluster: "c".into(),
                rank: 4,
            }),
            status: Status::Firing,
            ends_at: None,
            detail: Detail::Drained(Box::new(Drain {
                host: Some("n4".into()),
                reason: Some("bad fan".into()),
                draining: true,
            })),
            ..job_alert
        };
        let mut restored = alert(&rule(RuleKind::NodeDrained, "node_drained"), &node_alert);
        restored.restored = true;
        out.push(OutputRecord::alert(restored));
        for source in [Some("flux".to_string()), None] {
            let kind = if source.is_some() {
                RuleKind::FeedSilent
            } else {
                RuleKind::InstanceDown
            };
            let watch = WatchAlert {
                rule: 0,
                subject: WatchSubject {
                    cluster: "c".into(),
                    source,
                },
                status: Status::Firing,
                since: 1.0,
                starts_at: 61.0,
                ends_at: None,
            };
            out.push(OutputRecord::alert(watch_alert(
                &rule(kind, "quiet"),
                &watch,
            )));
        }
        let anomaly = Anomaly::new(Stream::Job, AnomalyKind::Malformed, "bad").at("alloc", 2.5);
        out.push(OutputRecord::anomaly(KeyedAnomaly {
            cluster: "c".into(),
            id: Some(JobId(8)),
            anomaly,
        }));
        out.push(OutputRecord::anomaly(KeyedAnomaly {
            cluster: "c".into(),
            id: None,
            anomaly: Anomaly::new(Stream::Resource, AnomalyKind::Malformed, "r"),
        }));
        out.push(OutputRecord::dead_letter(DeadLetterRecord::new(
            "s", "f:1", "not JSON", b"{\xff",
        )));
        out
    }

    /// Every line is what a JSON map of its fields prints: keys sorted at
    /// every depth, compact (what every record was before records had
    /// types, and what readers that compare lines rely on).
    #[test]
    fn every_line_is_its_sorted_map() {
        let records = one_of_each();
        for r in &records {
            let line = r.line();
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&v).unwrap(), line);
            let kind: Result<RecordKind, _> = serde_json::from_value(v["kind"].clone());
            assert!(kind.is_ok(), "{line}");
            assert_eq!(v["record_id"].as_str().map(str::len), Some(16), "{line}");
        }
        let lines: Vec<&str> = records.iter().map(OutputRecord::line).collect();
        // The context's keys are sorted, and an event's own keys kept.
        assert!(
            lines[0].contains(r#""context":{"a":{"b":[1,2],"y":2},"z":1}"#),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with(r#"{"cluster":"c","event":{"aa":1,"context""#),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains(r#""stream":"resource""#) && !lines[2].contains(r#""id""#));
    }

    /// What a tap's reader filters on, for each kind.
    #[test]
    fn each_record_says_what_it_is_about() {
        for r in one_of_each() {
            let about = r.subject();
            let v: Value = serde_json::from_str(r.line()).unwrap();
            assert_eq!(about.cluster, v["cluster"].as_str(), "{}", r.line());
            assert_eq!(about.id, v["id"].as_u64(), "{}", r.line());
            assert_eq!(
                about.rank.map(u64::from),
                v["rank"].as_u64(),
                "{}",
                r.line()
            );
            let node = v["hostname"].as_str().or(v["node"].as_str());
            assert_eq!(about.node, node, "{}", r.line());
        }
    }

    /// The key as it was read from the line before records had types.
    fn key_of_line(line: &str) -> String {
        let v: Value = serde_json::from_str(line).unwrap_or_default();
        match (
            v["cluster"].as_str(),
            v["id"].as_u64(),
            v["source"].as_str(),
        ) {
            (Some(c), Some(id), _) => format!("{c}/{id}"),
            (Some(c), None, _) => c.to_string(),
            (None, _, Some(s)) => s.to_string(),
            _ => String::new(),
        }
    }

    #[test]
    fn keys_follow_the_record() {
        let records = one_of_each();
        for r in &records {
            assert_eq!(r.key(), key_of_line(r.line()), "{}", r.line());
        }
        let keys: Vec<String> = records.iter().map(OutputRecord::key).collect();
        assert!(keys.contains(&"c\"1/5".to_string()), "{keys:?}");
        assert_eq!(
            keys.last().map(String::as_str),
            Some("s"),
            "a dead letter's source"
        );
        assert_eq!(
            OutputRecord::raw(OutputStream::Events, &json!({"n": 1})).key(),
            ""
        );
    }

    #[test]
    fn alert_records_read_back_as_they_were() {
        for r in one_of_each() {
            if let Some(a) = r.as_alert() {
                let back: AlertRecord = serde_json::from_str(r.line()).unwrap();
                assert_eq!(&back, a);
            }
        }
    }

    proptest! {
        #[test]
        fn any_alert_record_reads_back(
            labels in prop::collection::btree_map("\\PC{0,8}", "\\PC{0,8}", 0..4),
            summary in "\\PC{0,40}",
            since in any::<u32>(),
            source in prop::option::of(prop::option::of("\\PC{0,8}")),
            restored in any::<bool>(),
        ) {
            let mut a = AlertRecord::of_job("firing", "f1", f64::from(since), None);
            a.labels.extend(labels);
            a.annotations.insert("summary".into(), summary);
            a.source = source;
            a.restored = restored;
            let line = OutputRecord::alert(a.clone()).line().to_string();
            let back: AlertRecord = serde_json::from_str(&line).unwrap();
            prop_assert_eq!(back, a);
        }

        #[test]
        fn any_dead_letter_reads_back(line in prop::collection::vec(any::<u8>(), 0..5000)) {
            let d = DeadLetterRecord::new("s", "f:1", "e", &line);
            prop_assert_eq!(d.truncated, line.len() > DEAD_LETTER_MAX_BYTES);
            let text = OutputRecord::dead_letter(d.clone()).line().to_string();
            let back: DeadLetterRecord = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(back, d);
        }
    }
}
