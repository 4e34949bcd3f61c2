//! The records of the `events`, `transitions`, `resources`, `anomalies`
//! and `dead_letter` streams: owned, typed, and written to JSON with their
//! keys in sorted order (the order of a record built as a JSON map, which
//! every line has had since the first version).

use super::{RecordKind, id_bytes, record_id};
use crate::decode::EventStream;
use crate::flux::event::Event;
use crate::flux::job::{JobState, Transition};
use crate::flux::jobid::JobId;
use crate::flux::resource::{RankChange, RankState};
use crate::keyed::state::KeyedAnomaly;
use compact_str::CompactString;
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// `"kind":"transition"`: a job's state change, and the event that made it.
#[derive(Debug, Clone, PartialEq)]
pub struct TransitionRecord {
    /// Inline when short (most names): no allocation of their own.
    pub cluster: CompactString,
    pub event: CompactString,
    pub id: JobId,
    pub transition: Transition,
}

impl TransitionRecord {
    pub fn from_state(&self) -> JobState {
        self.transition.from
    }

    pub fn to_state(&self) -> JobState {
        self.transition.to
    }

    pub fn timestamp(&self) -> f64 {
        self.transition.timestamp
    }

    /// The job, the state it entered and when.
    pub fn record_id(&self) -> String {
        let t = &self.transition;
        record_id(&[
            b"transition",
            self.cluster.as_bytes(),
            &self.id.0.to_le_bytes(),
            t.to.as_str().as_bytes(),
            &t.timestamp.to_bits().to_le_bytes(),
        ])
    }
}

impl Serialize for TransitionRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut r = s.serialize_struct("TransitionRecord", 8)?;
        r.serialize_field("cluster", self.cluster.as_str())?;
        r.serialize_field("event", self.event.as_str())?;
        r.serialize_field("from", &self.transition.from)?;
        r.serialize_field("id", &self.id.0)?;
        r.serialize_field("kind", &RecordKind::Transition)?;
        r.serialize_field("record_id", &self.record_id())?;
        r.serialize_field("timestamp", &self.transition.timestamp)?;
        r.serialize_field("to", &self.transition.to)?;
        r.end()
    }
}

/// `"kind":"rank"` on the `resources` stream: a rank's new state, which
/// fields changed, and what changed them: a resource event, or (with
/// `at`) its jobs (a drained rank whose last job went, or that a job
/// still holds).
#[derive(Debug, Clone, PartialEq)]
pub struct RankRecord {
    pub cluster: CompactString,
    pub change: RankChange,
    /// The event that made the change: its name and time.
    pub event: Option<(CompactString, f64)>,
    /// When it changed, for a change no event made.
    pub at: Option<f64>,
}

impl RankRecord {
    /// The rank's state after the change; `None`: it was removed.
    pub fn after(&self) -> Option<&RankState> {
        self.change.after.as_ref()
    }

    /// The rank, as its state after the change has it.
    pub fn rank(&self) -> u32 {
        self.after().map_or(self.change.rank, |r| r.rank)
    }

    /// The event that made the change, if one did (a change seen `at` a
    /// time was made by the rank's jobs).
    pub fn event_name(&self) -> Option<&str> {
        match (self.at, &self.event) {
            (None, Some((name, _))) => Some(name),
            _ => None,
        }
    }

    /// When it changed: the event's time, or when the change was seen.
    pub fn timestamp(&self) -> Option<f64> {
        self.at.or(self.event.as_ref().map(|(_, ts)| *ts))
    }

    /// The fields that changed.
    pub fn changed(&self) -> Vec<&'static str> {
        self.change.changed_fields()
    }

    /// The rank, what changed it when, and what changed. One event can
    /// make two records of a rank (a drain that finds the rank already
    /// freed: draining, then not), and each needs its own id.
    pub fn record_id(&self) -> String {
        let change = &self.change;
        let (what, ts) = match (self.at, &self.event) {
            (Some(at), _) => match &change.after {
                Some(r) if r.draining => ("draining", at),
                _ => ("drained", at),
            },
            (None, Some((name, ts))) => (name.as_str(), *ts),
            (None, None) => ("", 0.0),
        };
        let changed = change.changed_fields().join(",");
        let after = change.after.as_ref().map_or(0u8, |r| {
            u8::from(r.online == Some(true))
                | u8::from(r.drained) << 1
                | u8::from(r.draining) << 2
                | u8::from(r.torpid) << 3
        });
        record_id(&[
            b"rank",
            self.cluster.as_bytes(),
            &change.rank.to_le_bytes(),
            what.as_bytes(),
            &ts.to_bits().to_le_bytes(),
            changed.as_bytes(),
            &[after],
        ])
    }
}

impl Serialize for RankRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("changed", &self.changed())?;
        m.serialize_entry("cluster", self.cluster.as_str())?;
        let after = self.after();
        if let Some(r) = after {
            m.serialize_entry("drain_reason", &r.drain_reason)?;
            m.serialize_entry("drain_timestamp", &r.drain_timestamp)?;
            m.serialize_entry("drained", &r.drained)?;
            m.serialize_entry("draining", &r.draining)?;
        }
        if let Some(name) = self.event_name() {
            m.serialize_entry("event", name)?;
        }
        if let Some(r) = after {
            m.serialize_entry("hostname", &r.hostname)?;
        }
        m.serialize_entry("kind", &RecordKind::Rank)?;
        if let Some(r) = after {
            m.serialize_entry("online", &r.online)?;
        }
        m.serialize_entry("rank", &self.rank())?;
        m.serialize_entry("record_id", &self.record_id())?;
        if after.is_none() {
            m.serialize_entry("removed", &true)?;
        }
        if let Some(ts) = self.timestamp() {
            m.serialize_entry("timestamp", &ts)?;
        }
        if let Some(r) = after {
            m.serialize_entry("torpid", &r.torpid)?;
        }
        m.end()
    }
}

/// `"kind":"rank"`: one rank's state as a replay ends (no record id: it
/// is an answer, not a change).
#[derive(Debug, Clone, Copy)]
pub struct RankStateRecord<'a> {
    pub cluster: &'a str,
    pub state: &'a RankState,
}

impl Serialize for RankStateRecord<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.state;
        let mut m = s.serialize_struct("RankStateRecord", 10)?;
        m.serialize_field("cluster", self.cluster)?;
        m.serialize_field("drain_reason", &r.drain_reason)?;
        m.serialize_field("drain_timestamp", &r.drain_timestamp)?;
        m.serialize_field("drained", &r.drained)?;
        m.serialize_field("draining", &r.draining)?;
        m.serialize_field("hostname", &r.hostname)?;
        m.serialize_field("kind", &RecordKind::Rank)?;
        m.serialize_field("online", &r.online)?;
        m.serialize_field("rank", &r.rank)?;
        m.serialize_field("torpid", &r.torpid)?;
        m.end()
    }
}

/// `"kind":"event"`: an input event, normalized. Its shape is the
/// envelope input form, so one fluxpipe's `events` feed another's sources.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub cluster: CompactString,
    pub stream: EventStream,
    pub id: Option<JobId>,
    pub event: Event,
    /// The source it came from (not part of its identity).
    pub source: CompactString,
}

impl EventRecord {
    /// The event in its eventlog: the stream, the job, its name and time.
    pub fn record_id(&self) -> String {
        let ev = &self.event;
        record_id(&[
            b"event",
            self.cluster.as_bytes(),
            self.stream.as_str().as_bytes(),
            &id_bytes(self.id),
            ev.name.as_bytes(),
            &ev.timestamp.to_bits().to_le_bytes(),
        ])
    }
}

impl Serialize for EventRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("cluster", self.cluster.as_str())?;
        m.serialize_entry("event", &SortedEvent(&self.event))?;
        if let Some(id) = self.id {
            m.serialize_entry("id", &id.0)?;
        }
        m.serialize_entry("kind", &RecordKind::Event)?;
        m.serialize_entry("record_id", &self.record_id())?;
        m.serialize_entry("source", self.source.as_str())?;
        m.serialize_entry("stream", self.stream.as_str())?;
        m.end()
    }
}

/// An event with its keys sorted, its context's too (as it has always
/// been written: through a JSON map).
struct SortedEvent<'a>(&'a Event);

impl Serialize for SortedEvent<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let ev = self.0;
        if ev.extra.is_some() {
            // Keys of its own, among which the three sort anywhere: rare.
            return serde_json::to_value(ev).unwrap_or(Value::Null).serialize(s);
        }
        let mut m = s.serialize_map(None)?;
        if let Some(context) = &ev.context {
            m.serialize_entry("context", &context.to_map())?;
        }
        m.serialize_entry("name", ev.name.as_str())?;
        m.serialize_entry("timestamp", &ev.timestamp)?;
        m.end()
    }
}

/// A document that comes beside the events, for the `events` feed: what a
/// downstream fluxpipe needs besides them. The envelope decoder reads
/// each back.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    /// An R document as it came (a job's, or an instance's): a job's
    /// expiration, an instance's ranks.
    R(Value),
    /// A job's jobspec, the part kept of it (what the journal carries
    /// with `submit`).
    JobSpec(Value),
    /// Who submitted a job, by name, as Flux's side resolved it.
    Username(String),
}

/// `"kind":"R"`, `"kind":"jobspec"` or `"kind":"username"`: a
/// [`Document`] of a job or an instance.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentRecord {
    pub cluster: CompactString,
    pub stream: EventStream,
    pub id: Option<JobId>,
    pub document: Document,
    pub source: CompactString,
}

impl DocumentRecord {
    pub fn record_id(&self) -> String {
        let (cluster, id) = (self.cluster.as_bytes(), &id_bytes(self.id));
        match &self.document {
            Document::R(r) => record_id(&[
                b"R",
                cluster,
                self.stream.as_str().as_bytes(),
                id,
                r.to_string().as_bytes(),
            ]),
            Document::JobSpec(spec) => {
                record_id(&[b"jobspec", cluster, id, spec.to_string().as_bytes()])
            }
            Document::Username(name) => record_id(&[b"username", cluster, id, name.as_bytes()]),
        }
    }
}

impl Serialize for DocumentRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if let Document::R(r) = &self.document {
            m.serialize_entry("R", r)?;
        }
        m.serialize_entry("cluster", self.cluster.as_str())?;
        m.serialize_entry("id", &self.id.map(|i| i.0))?;
        if let Document::JobSpec(spec) = &self.document {
            m.serialize_entry("jobspec", spec)?;
        }
        let kind = match &self.document {
            Document::R(_) => RecordKind::R,
            Document::JobSpec(_) => RecordKind::JobSpec,
            Document::Username(_) => RecordKind::Username,
        };
        m.serialize_entry("kind", &kind)?;
        m.serialize_entry("record_id", &self.record_id())?;
        m.serialize_entry("source", self.source.as_str())?;
        // A jobspec and a username are a job's, whatever the stream says.
        let stream = match &self.document {
            Document::R(_) => self.stream,
            Document::JobSpec(_) | Document::Username(_) => EventStream::Job,
        };
        m.serialize_entry("stream", stream.as_str())?;
        if let Document::Username(name) = &self.document {
            m.serialize_entry("username", name)?;
        }
        m.end()
    }
}

/// `"kind":"anomaly"`: a rule violation found in the input; the anomaly's
/// own kind is its `anomaly` key.
#[derive(Debug, Clone, PartialEq)]
pub struct AnomalyRecord(pub KeyedAnomaly);

impl AnomalyRecord {
    pub fn record_id(&self) -> String {
        let (a, an) = (&self.0, &self.0.anomaly);
        record_id(&[
            b"anomaly",
            a.cluster.as_bytes(),
            &id_bytes(a.id),
            an.stream.as_str().as_bytes(),
            an.kind.as_str().as_bytes(),
            an.event.as_deref().unwrap_or("").as_bytes(),
            &an.timestamp.unwrap_or(0.0).to_bits().to_le_bytes(),
            &an.rank.unwrap_or(u32::MAX).to_le_bytes(),
            an.message.as_bytes(),
        ])
    }
}

impl Serialize for AnomalyRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (a, an) = (&self.0, &self.0.anomaly);
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("anomaly", &an.kind)?;
        m.serialize_entry("cluster", &a.cluster)?;
        if let Some(event) = &an.event {
            m.serialize_entry("event", event)?;
        }
        if let Some(id) = a.id {
            m.serialize_entry("id", &id.0)?;
        }
        m.serialize_entry("kind", &RecordKind::Anomaly)?;
        m.serialize_entry("message", &an.message)?;
        if let Some(rank) = an.rank {
            m.serialize_entry("rank", &rank)?;
        }
        m.serialize_entry("record_id", &self.record_id())?;
        m.serialize_entry("stream", &an.stream)?;
        if let Some(ts) = an.timestamp {
            m.serialize_entry("timestamp", &ts)?;
        }
        m.end()
    }
}

/// The most of an undecodable line that a dead letter carries.
pub const DEAD_LETTER_MAX_BYTES: usize = 4096;

/// `"kind":"dead_letter"`: input that could not be decoded, where it came
/// from and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetterRecord {
    pub error: String,
    /// `RecordKind::DeadLetter` as this module builds it (private: no other code
    /// sets it); a record read back keeps what it said.
    kind: RecordKind,
    /// The line, cut to [`DEAD_LETTER_MAX_BYTES`], invalid UTF-8 replaced.
    pub line: String,
    pub location: String,
    pub record_id: String,
    pub source: String,
    /// Whether the line was cut.
    pub truncated: bool,
}

impl DeadLetterRecord {
    pub fn new(source: &str, location: &str, error: &str, line: &[u8]) -> Self {
        let cut = &line[..line.len().min(DEAD_LETTER_MAX_BYTES)];
        DeadLetterRecord {
            error: error.to_string(),
            kind: RecordKind::DeadLetter,
            line: String::from_utf8_lossy(cut).into_owned(),
            location: location.to_string(),
            record_id: record_id(&[b"dead_letter", source.as_bytes(), location.as_bytes(), line]),
            source: source.to_string(),
            truncated: line.len() > DEAD_LETTER_MAX_BYTES,
        }
    }
}
