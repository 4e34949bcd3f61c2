//! Lines → records: the one place that knows Flux's line formats and the
//! path layouts that tell whose eventlog a file is. Shared by `replay` and
//! by every streaming source.
//!
//! A line is one of:
//! - a plain RFC 18 event, whose key comes from where it was read;
//! - a job-manager journal message `{"id":N,"events":[...],"jobspec"?,"R"?,"username"?}`
//!   (`username`: the forwarder's addition, the submitter's name as
//!   resolved where Flux runs);
//! - a resource journal message `{"events":[...],"R"?}`;
//! - an RFC 32 exec-protocol response `{"id":N,"type":...,"data":{...}}`;
//! - an envelope `{"cluster"?,"id"?,"stream":"job"|"exec"|"resource","event":{...}}`
//!   (or `"R"`, `"jobspec"`, `"username"` in place of `"event"`).

use crate::flux::event::{Event, EventError};
use crate::flux::exec::ExecResponse;
use crate::flux::jobid::JobId;
use crate::flux::jobspec::{JobSpec, JobSpecError};
use crate::flux::object::JsonObject;
use crate::flux::user;
use compact_str::CompactString;
use serde_json::Value;
use smallvec::SmallVec;
use std::path::Path;
use thiserror::Error;

/// Which eventlog an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventStream {
    /// A job's primary eventlog (RFC 21).
    Job,
    /// A job's exec eventlog (RFC 50).
    Exec,
    /// The instance's resource eventlog (RFC 44).
    Resource,
}

impl EventStream {
    pub fn as_str(self) -> &'static str {
        match self {
            EventStream::Job => "job",
            EventStream::Exec => "exec",
            EventStream::Resource => "resource",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "job" => Some(EventStream::Job),
            "exec" => Some(EventStream::Exec),
            "resource" => Some(EventStream::Resource),
            _ => None,
        }
    }
}

/// The line format to expect; `Auto` tells them apart per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Auto,
    Event,
    JobJournal,
    ResourceJournal,
    ExecProtocol,
    Envelope,
}

impl Format {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Format::Auto),
            "event" | "eventlog" => Some(Format::Event),
            "job-journal" => Some(Format::JobJournal),
            "resource-journal" => Some(Format::ResourceJournal),
            "exec-protocol" => Some(Format::ExecProtocol),
            "envelope" => Some(Format::Envelope),
            _ => None,
        }
    }
}

/// What the place a line was read from says about it: a file's path, or a
/// source's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The stream of plain events, when known.
    pub stream: Option<EventStream>,
    /// The job of plain job or exec events, when known.
    pub id: Option<JobId>,
}

/// What a file is, judged by its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathKind {
    /// An eventlog (or journal) whose lines carry events of this origin.
    Eventlog(Origin),
    /// A job's R (`R`, `R.json`): its nodes and expiration.
    JobR(JobId),
    /// A job's jobspec (`jobspec`, `jobspec.json`).
    JobSpec(JobId),
    /// The instance's R (`resource/R`).
    ResourceR,
    /// Journal captures and other line files that name their own keys.
    Lines,
    /// Something else (jobspec, output eventlogs, answers, ...).
    Other,
}

/// Recognize the layouts of KVS dumps, flat KVS keys and plain job folders.
pub fn classify_path(path: &Path) -> PathKind {
    let parts: Vec<&str> = path
        .iter()
        .filter_map(|c| c.to_str())
        .filter(|c| *c != "/")
        .collect();
    let Some(&file) = parts.last() else {
        return PathKind::Other;
    };
    let parent = |n: usize| parts.len().checked_sub(n + 1).map(|i| parts[i]);
    let job = |stream| {
        PathKind::Eventlog(Origin {
            stream: Some(stream),
            id: None,
        })
    };

    // Flat KVS keys: job.<dothex>.eventlog, job.<dothex>.guest.exec.eventlog
    if let Some(rest) = file.strip_prefix("job.") {
        if let Some(dothex) = rest.strip_suffix(".guest.exec.eventlog") {
            return with_id(EventStream::Exec, dothex);
        }
        if let Some(dothex) = rest.strip_suffix(".eventlog") {
            return with_id(EventStream::Job, dothex);
        }
        if let Some(dothex) = rest.strip_suffix(".R")
            && let Ok(id) = JobId::parse(dothex)
        {
            return PathKind::JobR(id);
        }
        if let Some(dothex) = rest.strip_suffix(".jobspec")
            && let Ok(id) = JobId::parse(dothex)
        {
            return PathKind::JobSpec(id);
        }
    }
    // `resource.eventlog` and rotated or renamed copies (`resource.eventlog.1`).
    if file.starts_with("resource.eventlog")
        || (file == "eventlog" && parent(1) == Some("resource"))
    {
        return job(EventStream::Resource);
    }
    if file == "R" && parent(1) == Some("resource") {
        return PathKind::ResourceR;
    }
    // A KVS dump tree: job/xxxx/xxxx/xxxx/xxxx/{eventlog,R,guest/exec/eventlog}
    let dump_id = |depth: usize| -> Option<JobId> {
        let end = parts.len().checked_sub(depth)?;
        let start = end.checked_sub(5)?;
        if parts[start] != "job" {
            return None;
        }
        JobId::parse(&parts[start..end].join("/")).ok()
    };
    match file {
        "eventlog" => {
            if parent(1) == Some("exec")
                && parent(2) == Some("guest")
                && let Some(id) = dump_id(3)
            {
                return eventlog(EventStream::Exec, id);
            }
            if let Some(id) = dump_id(1) {
                return eventlog(EventStream::Job, id);
            }
            if let Some(id) = parent(1).and_then(|d| JobId::parse(d).ok()) {
                return eventlog(EventStream::Job, id);
            }
        }
        "exec.eventlog" => {
            if let Some(id) = parent(1).and_then(|d| JobId::parse(d).ok()) {
                return eventlog(EventStream::Exec, id);
            }
        }
        "R" | "R.json" => {
            if let Some(id) = dump_id(1).or_else(|| parent(1).and_then(|d| JobId::parse(d).ok())) {
                return PathKind::JobR(id);
            }
        }
        "jobspec" | "jobspec.json" => {
            if let Some(id) = dump_id(1).or_else(|| parent(1).and_then(|d| JobId::parse(d).ok())) {
                return PathKind::JobSpec(id);
            }
        }
        _ => {}
    }
    // Journal captures name their own keys on every line.
    if file.ends_with(".jsonl") {
        return PathKind::Lines;
    }
    PathKind::Other
}

fn with_id(stream: EventStream, dothex: &str) -> PathKind {
    match JobId::parse(dothex) {
        Ok(id) => eventlog(stream, id),
        Err(_) => PathKind::Other,
    }
}

fn eventlog(stream: EventStream, id: JobId) -> PathKind {
    PathKind::Eventlog(Origin {
        stream: Some(stream),
        id: Some(id),
    })
}

/// What one decoded item is.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Event(Event),
    /// An R object: a job's (job stream) or the instance's (resource
    /// stream), as read.
    R(JsonObject),
    /// A job's jobspec, read down to the values kept of it.
    JobSpec(Box<JobSpecRead>),
    /// Who submitted the job, by name, as Flux's side resolved it.
    User(CompactString),
    /// A journal sentinel: the backlog ends here.
    Sentinel,
    /// An RFC 32 exec-protocol response.
    ExecResponse(ExecResponse),
}

/// One decoded item with its key.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The cluster named by the line itself; `None` means the source's.
    pub cluster: Option<Box<str>>,
    pub stream: EventStream,
    /// The job (job and exec streams).
    pub id: Option<JobId>,
    pub body: Body,
}

impl Record {
    /// A job journal item: the line names no cluster.
    fn job_journal(id: JobId, body: Body) -> Self {
        Record {
            cluster: None,
            stream: EventStream::Job,
            id: Some(id),
            body,
        }
    }

    /// A resource journal item: the line names no cluster.
    fn resource_journal(body: Body) -> Self {
        Record {
            cluster: None,
            stream: EventStream::Resource,
            id: None,
            body,
        }
    }
}

/// Why a line could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("line is not valid UTF-8")]
    Utf8,
    #[error("line is not valid JSON: {0}")]
    Json(String),
    #[error("line is not a JSON object")]
    NotObject,
    #[error("line is not a known form (event, job or resource journal, exec response, envelope)")]
    UnknownForm,
    #[error("invalid event: {0}")]
    Event(#[from] EventError),
    #[error("invalid {0}")]
    Field(String),
    #[error("plain event with no known stream (the path or source does not say)")]
    NoStream,
    #[error("plain job event with no job id (the path or source does not say)")]
    NoJobId,
    #[error("R is not valid JSON: {0}")]
    RNotJson(String),
}

/// Decode one line (without its newline) into zero or more records.
/// Individual bad events inside a journal message are returned as errors
/// beside the good records of the same message, so one bad event never
/// hides its neighbours.
pub fn decode_line(line: &[u8], origin: &Origin, format: Format) -> Decoded {
    let mut out = Decoded::default();
    // The same check as std's, in fewer instructions on long lines.
    let text = match simdutf8::basic::from_utf8(line) {
        Ok(t) => t,
        Err(_) => {
            out.errors.push(DecodeError::Utf8);
            return out;
        }
    };
    if !fast::decode(text, format, &mut out) {
        decode_general(text, origin, format, &mut out);
    }
    out
}

/// Any line, through a generic `Value`.
fn decode_general(text: &str, origin: &Origin, format: Format, out: &mut Decoded) {
    match serde_json::from_str(text) {
        Ok(value) => decode_value(value, origin, format, out),
        Err(e) => out.errors.push(DecodeError::Json(e.to_string())),
    }
}

/// The common forms read straight into typed structs, without a `Value`
/// for the line, its events and their maps (most of the decoding cost):
/// a job or resource journal message and an event envelope whose events
/// have exactly the RFC 18 keys. Anything else (another key, a bad value,
/// a repeated key, a string job id, the sentinel) is left to the general
/// path, which gives every line its exact outcome: the fast path decodes
/// only lines the general path would decode the same way, whole.
mod fast {
    use super::{Body, Decoded, EventStream, Format, Record};
    use crate::flux::event::{Context, Event};
    use crate::flux::jobid::JobId;
    use crate::flux::object::JsonObject;
    use serde::de::IgnoredAny;
    use serde::{Deserialize, Deserializer};
    use serde_json::value::RawValue;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Journal {
        #[serde(default, deserialize_with = "present")]
        id: Option<u64>,
        /// Inline: most journal messages carry one event.
        events: smallvec::SmallVec<[FastEvent; 1]>,
        #[serde(rename = "R", default)]
        r: Option<Box<RawValue>>,
        #[serde(default)]
        jobspec: Option<Box<RawValue>>,
        #[serde(default, deserialize_with = "present")]
        username: Option<compact_str::CompactString>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Envelope<'a> {
        #[serde(borrow)]
        stream: &'a str,
        #[serde(default)]
        cluster: Option<Box<str>>,
        #[serde(default)]
        id: Option<u64>,
        event: FastEvent,
        // What the `events` output stream adds.
        #[serde(rename = "kind", default)]
        _kind: Option<IgnoredAny>,
        #[serde(rename = "source", default)]
        _source: Option<IgnoredAny>,
        #[serde(rename = "record_id", default)]
        _record_id: Option<IgnoredAny>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FastEvent {
        timestamp: f64,
        name: compact_str::CompactString,
        #[serde(default, deserialize_with = "present")]
        context: Option<Context>,
    }

    /// A key that, when there, must hold a value (`null` is not "absent").
    fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        T::deserialize(d).map(Some)
    }

    impl FastEvent {
        /// Whether it is an event `Event::from_value` accepts.
        fn is_valid(&self) -> bool {
            self.timestamp.is_finite() && self.timestamp > 0.0 && !self.name.is_empty()
        }

        /// The event, if it is one `Event::from_value` accepts.
        fn valid(self) -> Option<Event> {
            self.is_valid().then(|| Event {
                timestamp: self.timestamp,
                name: self.name,
                context: self.context,
                extra: None,
            })
        }
    }

    /// Decode `text` if it is a common form; false leaves it to the
    /// general path (and `out` untouched).
    pub(super) fn decode(text: &str, format: Format, out: &mut Decoded) -> bool {
        let journal = matches!(
            format,
            Format::Auto | Format::JobJournal | Format::ResourceJournal
        );
        // The first key tells which form to try; a line whose keys come in
        // another order just takes the general path.
        let head = text
            .trim_start()
            .strip_prefix('{')
            .unwrap_or("")
            .trim_start();
        if journal && (head.starts_with("\"id\"") || head.starts_with("\"events\"")) {
            let Ok(j) = serde_json::from_str::<Journal>(text) else {
                return false;
            };
            return journal_records(j, format, out);
        }
        if matches!(format, Format::Auto | Format::Envelope) && head.starts_with("\"stream\"") {
            let Ok(e) = serde_json::from_str::<Envelope>(text) else {
                return false;
            };
            return envelope_record(e, out);
        }
        false
    }

    fn journal_records(j: Journal, format: Format, out: &mut Decoded) -> bool {
        if !j.events.iter().all(FastEvent::is_valid) {
            return false;
        }
        let empty = j.events.is_empty();
        // Valid, so each event converts; no list of them is built between.
        let events = j.events.into_iter().filter_map(FastEvent::valid);
        // R not an object: dropped, as the general path drops it.
        let r = j.r.and_then(|r| JsonObject::from_raw(r).ok());
        // A name refused is the general path's to report.
        let user = match j.username {
            Some(name) if crate::flux::user::check_name(&name).is_err() => return false,
            user => user,
        };
        match (j.id, format) {
            (Some(id), Format::Auto | Format::JobJournal) => {
                let record = |body| Record::job_journal(JobId(id), body);
                // The jobspec and R first, as the general path does.
                out.records
                    .extend(j.jobspec.map(|s| record(super::job_spec_raw(s))));
                out.records.extend(user.map(|u| record(Body::User(u))));
                out.records.extend(r.map(|r| record(Body::R(r))));
                out.records.extend(events.map(|e| record(Body::Event(e))));
                true
            }
            (None, Format::Auto | Format::ResourceJournal) if user.is_none() => {
                let record = Record::resource_journal;
                if empty {
                    out.records.push(record(Body::Sentinel));
                    return true;
                }
                out.records.extend(events.map(|e| record(Body::Event(e))));
                out.records.extend(r.map(|r| record(Body::R(r))));
                true
            }
            _ => false,
        }
    }

    fn envelope_record(e: Envelope, out: &mut Decoded) -> bool {
        let Some(stream) = EventStream::parse(e.stream) else {
            return false;
        };
        if stream != EventStream::Resource && e.id.is_none() {
            return false;
        }
        let Some(event) = e.event.valid() else {
            return false;
        };
        out.records.push(Record {
            cluster: e.cluster,
            stream,
            id: e.id.map(JobId),
            body: Body::Event(event),
        });
        true
    }
}

/// The records of one line, and the errors of its bad parts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decoded {
    /// Inline: a line is one record most of the time, and a list on the
    /// heap for each would be allocated and freed per line.
    pub records: SmallVec<[Record; 1]>,
    pub errors: Vec<DecodeError>,
}

fn detect(map: &serde_json::Map<String, Value>) -> Format {
    if map.contains_key("events") {
        if map.contains_key("id") {
            Format::JobJournal
        } else {
            Format::ResourceJournal
        }
    } else if (map.contains_key("event")
        || map.contains_key("R")
        || map.contains_key("jobspec")
        || map.contains_key("username"))
        && map.contains_key("stream")
    {
        Format::Envelope
    } else if map.contains_key("type") && map.contains_key("data") && map.contains_key("id") {
        Format::ExecProtocol
    } else if map.contains_key("timestamp") || map.contains_key("name") {
        Format::Event
    } else {
        Format::Auto
    }
}

fn decode_value(value: Value, origin: &Origin, format: Format, out: &mut Decoded) {
    let Value::Object(map) = value else {
        out.errors.push(DecodeError::NotObject);
        return;
    };
    let format = match format {
        Format::Auto => detect(&map),
        f => f,
    };
    match format {
        Format::Auto => out.errors.push(DecodeError::UnknownForm),
        Format::Event => match plain_event(Value::Object(map), origin) {
            Ok(r) => out.records.push(r),
            Err(e) => out.errors.push(e),
        },
        Format::JobJournal => job_journal(map, out),
        Format::ResourceJournal => resource_journal(map, out),
        Format::ExecProtocol => match ExecResponse::from_message(&Value::Object(map)) {
            Ok((id, resp)) => out.records.push(Record {
                cluster: None,
                stream: EventStream::Exec,
                id: Some(JobId(id)),
                body: Body::ExecResponse(resp),
            }),
            Err(e) => out
                .errors
                .push(DecodeError::Field(format!("exec response: {e}"))),
        },
        Format::Envelope => match envelope(map) {
            Ok(r) => out.records.push(r),
            Err(e) => out.errors.push(e),
        },
    }
}

fn plain_event(value: Value, origin: &Origin) -> Result<Record, DecodeError> {
    let stream = origin.stream.ok_or(DecodeError::NoStream)?;
    let event = Event::from_value(value)?;
    if stream != EventStream::Resource && origin.id.is_none() {
        return Err(DecodeError::NoJobId);
    }
    Ok(Record {
        cluster: None,
        stream,
        id: origin.id,
        body: Body::Event(event),
    })
}

fn job_id_value(v: &Value) -> Result<JobId, DecodeError> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .map(JobId)
            .ok_or_else(|| DecodeError::Field(format!("job id {n}"))),
        Value::String(s) => JobId::parse(s).map_err(|e| DecodeError::Field(format!("job id: {e}"))),
        _ => Err(DecodeError::Field("job id: not a number or string".into())),
    }
}

fn events_array(map: &mut serde_json::Map<String, Value>) -> Result<Vec<Value>, DecodeError> {
    match map.remove("events") {
        Some(Value::Array(a)) => Ok(a),
        _ => Err(DecodeError::Field(
            "journal message: `events` is not an array".into(),
        )),
    }
}

fn job_journal(mut map: serde_json::Map<String, Value>, out: &mut Decoded) {
    let events = match events_array(&mut map) {
        Ok(e) => e,
        Err(e) => return out.errors.push(e),
    };
    // The sentinel: {"id": -1, "events": []}
    if map.get("id").and_then(Value::as_i64) == Some(-1) {
        if !events.is_empty() {
            out.errors.push(DecodeError::Field(
                "journal sentinel (id -1) with events".into(),
            ));
        }
        out.records.push(Record {
            cluster: None,
            stream: EventStream::Job,
            id: None,
            body: Body::Sentinel,
        });
        return;
    }
    let id = match map.get("id").map(job_id_value) {
        Some(Ok(id)) => id,
        Some(Err(e)) => return out.errors.push(e),
        None => {
            return out
                .errors
                .push(DecodeError::Field("journal message without id".into()));
        }
    };
    let record = |body| Record::job_journal(id, body);
    // The jobspec comes with `submit`; what the job is, before its events.
    if let Some(spec) = map.remove("jobspec") {
        out.records.push(record(job_spec(&spec.to_string())));
    }
    match map.remove("username").as_ref().map(user_name) {
        Some(Ok(name)) => out.records.push(record(Body::User(name))),
        Some(Err(e)) => out.errors.push(e),
        None => {}
    }
    // R comes with the alloc event it belongs to; apply it first so the
    // job knows its expiration when it enters RUN.
    if let Some(Ok(r)) = map.remove("R").as_ref().map(JsonObject::from_value) {
        out.records.push(record(Body::R(r)));
    }
    for ev in events {
        match Event::from_value(ev) {
            Ok(e) => out.records.push(record(Body::Event(e))),
            Err(e) => out.errors.push(e.into()),
        }
    }
}

/// A jobspec as read: the values kept of it, the reason some could not be
/// read, and its text while it travels (for the `events` stream; dropped
/// once applied).
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpecRead {
    pub spec: JobSpec,
    pub error: Option<JobSpecError>,
    /// `None`: not a JSON object.
    pub text: Option<JsonObject>,
}

/// A document kept in a file of its own (a job's `R` or `jobspec`, an
/// instance's `resource/R`), as its body. The file source and `replay`
/// both read such files through here, so they agree on what is applied.
///
/// A jobspec is read whatever it is: what cannot be read of it is an
/// anomaly of its job's. An R must be JSON; one that is not is refused
/// (a damaged R applied as `{}` would take the job's ranks away). JSON
/// that is not an object is read as `{}`, which has no expiration or
/// ranks (an instance's R says so, as an anomaly).
pub fn document_file(content: &[u8], jobspec: bool) -> Result<Body, DecodeError> {
    if jobspec {
        return Ok(job_spec(&String::from_utf8_lossy(content)));
    }
    let value: Value =
        serde_json::from_slice(content).map_err(|e| DecodeError::RNotJson(e.to_string()))?;
    Ok(Body::R(JsonObject::from_value(&value).unwrap_or_default()))
}

/// A jobspec's text, read.
pub fn job_spec(text: &str) -> Body {
    // Read from the text as it is (RawValue trims what surrounds a
    // value, and a reason given cites places in the text).
    let (spec, error) = JobSpec::parse(text);
    let raw = serde_json::value::RawValue::from_string(text.to_string()).ok();
    job_spec_body(spec, error, raw)
}

/// A journal's jobspec, read from the text that travels with it.
fn job_spec_raw(raw: Box<serde_json::value::RawValue>) -> Body {
    let (spec, error) = JobSpec::parse(raw.get());
    job_spec_body(spec, error, Some(raw))
}

fn job_spec_body(
    spec: JobSpec,
    error: Option<JobSpecError>,
    raw: Option<Box<serde_json::value::RawValue>>,
) -> Body {
    Body::JobSpec(Box::new(JobSpecRead {
        spec,
        error,
        text: raw.and_then(|r| JsonObject::from_raw(r).ok()),
    }))
}

/// A submitter's name as sent: a string [`user::parse_name`] takes.
fn user_name(v: &Value) -> Result<CompactString, DecodeError> {
    let text = v
        .as_str()
        .ok_or_else(|| DecodeError::Field("username: not a string".into()))?;
    user::parse_name(text).map_err(|e| DecodeError::Field(e.to_string()))
}

fn resource_journal(mut map: serde_json::Map<String, Value>, out: &mut Decoded) {
    let events = match events_array(&mut map) {
        Ok(e) => e,
        Err(e) => return out.errors.push(e),
    };
    let record = Record::resource_journal;
    if events.is_empty() {
        out.records.push(record(Body::Sentinel));
        return;
    }
    for ev in events {
        match Event::from_value(ev) {
            Ok(e) => out.records.push(record(Body::Event(e))),
            Err(e) => out.errors.push(e.into()),
        }
    }
    // R accompanies resource-define: apply it after the event.
    if let Some(Ok(r)) = map.remove("R").as_ref().map(JsonObject::from_value) {
        out.records.push(record(Body::R(r)));
    }
}

fn envelope(mut map: serde_json::Map<String, Value>) -> Result<Record, DecodeError> {
    let stream = match map.get("stream") {
        Some(Value::String(s)) => EventStream::parse(s)
            .ok_or_else(|| DecodeError::Field(format!("envelope stream `{s}`")))?,
        _ => return Err(DecodeError::Field("envelope stream: not a string".into())),
    };
    let cluster = match map.remove("cluster") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.into_boxed_str()),
        Some(_) => return Err(DecodeError::Field("envelope cluster: not a string".into())),
    };
    let id = match map.get("id") {
        None | Some(Value::Null) => None,
        Some(v) => Some(job_id_value(v)?),
    };
    if stream != EventStream::Resource && id.is_none() {
        return Err(DecodeError::NoJobId);
    }
    // A job's jobspec travels as `"jobspec"`, alone.
    if let Some(spec) = map.remove("jobspec") {
        if map.contains_key("event") || map.contains_key("R") {
            return Err(DecodeError::Field(
                "envelope jobspec beside an event or R".into(),
            ));
        }
        return Ok(Record {
            cluster,
            stream,
            id,
            body: job_spec(&spec.to_string()),
        });
    }
    // A submitter's name travels as `"username"`, alone.
    if let Some(name) = map.remove("username") {
        if map.contains_key("event") || map.contains_key("R") || stream != EventStream::Job {
            return Err(DecodeError::Field(
                "envelope username beside an event or R, or not of a job".into(),
            ));
        }
        return Ok(Record {
            cluster,
            stream,
            id,
            body: Body::User(user_name(&name)?),
        });
    }
    // An R document (a job's `R`, or an instance's) travels as `"R"`.
    let body = match map.remove("R") {
        Some(Value::Object(r)) if !map.contains_key("event") => Body::R(JsonObject::from_map(&r)),
        Some(_) => {
            return Err(DecodeError::Field(
                "envelope R: not an object, or beside an event".into(),
            ));
        }
        None => Body::Event(Event::from_value(
            map.remove("event").unwrap_or(Value::Null),
        )?),
    };
    Ok(Record {
        cluster,
        stream,
        id,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The fast path decodes a line exactly as the general path does, or
    /// leaves it alone.
    fn fast_agrees(text: &str, format: Format) -> Result<(), TestCaseError> {
        let origin = origin(EventStream::Job, Some(7));
        let mut fast = Decoded::default();
        let mut general = Decoded::default();
        decode_general(text, &origin, format, &mut general);
        if fast::decode(text, format, &mut fast) {
            prop_assert_eq!(&fast, &general, "{}", text);
            prop_assert!(general.errors.is_empty());
        } else {
            prop_assert_eq!(fast, Decoded::default());
        }
        Ok(())
    }

    #[test]
    fn the_fast_path_takes_the_generated_workload_as_the_general_path_does() {
        let spec = crate::workload::Spec {
            jobs: 200,
            ..Default::default()
        };
        let mut bytes = Vec::new();
        crate::workload::write_journal(spec, &mut bytes).expect("journal");
        let text = String::from_utf8(bytes).expect("utf-8");
        let mut taken = 0;
        for line in text.lines() {
            for format in [
                Format::Auto,
                Format::JobJournal,
                Format::ResourceJournal,
                Format::Envelope,
                Format::Event,
            ] {
                fast_agrees(line, format)
                    .map_err(|e| format!("{e}"))
                    .expect("agrees");
            }
            taken += usize::from(fast::decode(line, Format::Auto, &mut Decoded::default()));
        }
        // Nearly every generated line is a common form (the sentinels are not).
        assert!(
            taken * 100 >= text.lines().count() * 99,
            "{taken} of {}",
            text.lines().count()
        );
    }

    fn origin(stream: EventStream, id: Option<u64>) -> Origin {
        Origin {
            stream: Some(stream),
            id: id.map(JobId),
        }
    }

    #[test]
    fn an_envelope_carries_an_event_or_an_r_document() {
        let o = Origin::default();
        let ev = decode_line(
            br#"{"kind":"event","cluster":"c","stream":"job","id":5,"event":{"timestamp":1.5,"name":"alloc"},"source":"s"}"#,
            &o,
            Format::Auto,
        );
        assert!(ev.errors.is_empty(), "{:?}", ev.errors);
        assert!(matches!(ev.records[0].body, Body::Event(_)));
        let r = decode_line(
            br#"{"kind":"R","cluster":"c","stream":"job","id":5,"R":{"version":1,"execution":{"expiration":9.0}},"source":"s"}"#,
            &o,
            Format::Auto,
        );
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.records[0].cluster.as_deref(), Some("c"));
        assert!(matches!(r.records[0].body, Body::R(_)));
        let both = decode_line(
            br#"{"stream":"job","id":5,"R":{},"event":{"timestamp":1.5,"name":"alloc"}}"#,
            &o,
            Format::Auto,
        );
        assert!(both.records.is_empty() && !both.errors.is_empty());
        let spec = decode_line(
            br#"{"kind":"jobspec","cluster":"c","stream":"job","id":5,"jobspec":{"version":1,"tasks":[{"command":["/bin/app"]}],"attributes":{"system":{"duration":1,"queue":"q"}}},"source":"s"}"#,
            &o,
            Format::Auto,
        );
        assert!(spec.errors.is_empty(), "{:?}", spec.errors);
        match &spec.records[0].body {
            Body::JobSpec(read) => {
                assert_eq!(read.spec.name(), Some("app"));
                assert_eq!(read.spec.queue(), Some("q"));
                assert!(read.text.is_some(), "its text travels on");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn classifies_paths() {
        let id = JobId(0x17e9fb8df16c2e);
        let cases = [
            (
                "dump/job/0017/e9fb/8df1/6c2e/eventlog",
                eventlog(EventStream::Job, id),
            ),
            (
                "dump/job/0017/e9fb/8df1/6c2e/guest/exec/eventlog",
                eventlog(EventStream::Exec, id),
            ),
            (
                "job.0017.e9fb.8df1.6c2e.eventlog",
                eventlog(EventStream::Job, id),
            ),
            (
                "x/job.0017.e9fb.8df1.6c2e.guest.exec.eventlog",
                eventlog(EventStream::Exec, id),
            ),
            (
                "jobs/6731191091817518/eventlog",
                eventlog(EventStream::Job, id),
            ),
            (
                "jobs/ƒuZZybuNNy/exec.eventlog",
                eventlog(EventStream::Exec, id),
            ),
            ("jobs/6731191091817518/R.json", PathKind::JobR(id)),
            ("dump/job/0017/e9fb/8df1/6c2e/R", PathKind::JobR(id)),
            (
                "a/resource.eventlog",
                PathKind::Eventlog(origin(EventStream::Resource, None)),
            ),
            (
                "a/resource.eventlog.thing2",
                PathKind::Eventlog(origin(EventStream::Resource, None)),
            ),
            (
                "dump/resource/eventlog",
                PathKind::Eventlog(origin(EventStream::Resource, None)),
            ),
            ("dump/resource/R", PathKind::ResourceR),
            ("b/incarnation1.resource.journal.jsonl", PathKind::Lines),
            ("jobs/6731191091817518/jobspec.json", PathKind::JobSpec(id)),
            (
                "dump/job/0017/e9fb/8df1/6c2e/jobspec",
                PathKind::JobSpec(id),
            ),
            ("jobs/6731191091817518/label", PathKind::Other),
        ];
        for (p, want) in cases {
            assert_eq!(classify_path(Path::new(p)), want, "{p}");
        }
    }

    #[test]
    fn a_journal_message_carries_the_submitters_name() {
        let none = Origin::default();
        let line = r#"{"id":42,"events":[{"timestamp":1.5,"name":"submit","context":{"userid":4242,"urgency":16,"flags":0,"version":1}}],"username":"alice"}"#;
        let d = decode_line(line.as_bytes(), &none, Format::Auto);
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        assert_eq!(d.records.len(), 2);
        assert_eq!(d.records[0].body, Body::User("alice".into()));
        assert_eq!(d.records[0].id, Some(JobId(42)));
        assert!(matches!(d.records[1].body, Body::Event(_)));
        // The fast path takes it, as the general path reads it.
        fast_agrees(line, Format::Auto).expect("agrees");
        assert!(fast::decode(line, Format::Auto, &mut Decoded::default()));

        // A refused name is an error beside the message's good events.
        for bad in ["\"a b\"", "\"\"", "7", "null"] {
            let text = format!(
                r#"{{"id":42,"events":[{{"timestamp":1.5,"name":"depend"}}],"username":{bad}}}"#
            );
            let d = decode_line(text.as_bytes(), &none, Format::Auto);
            assert_eq!(d.records.len(), 1, "{text}");
            assert!(matches!(d.records[0].body, Body::Event(_)));
            assert_eq!(d.errors.len(), 1, "{text}");
        }
    }

    #[test]
    fn the_events_streams_username_document_reads_back() {
        let doc = crate::output::OutputRecord::document(crate::output::DocumentRecord {
            cluster: "c".into(),
            stream: EventStream::Job,
            id: Some(JobId(5)),
            document: crate::output::Document::Username("alice".into()),
            source: "s".into(),
        });
        let d = decode_line(doc.line().as_bytes(), &Origin::default(), Format::Auto);
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        assert_eq!(d.records.len(), 1);
        assert_eq!(d.records[0].cluster.as_deref(), Some("c"));
        assert_eq!(d.records[0].id, Some(JobId(5)));
        assert_eq!(d.records[0].body, Body::User("alice".into()));
        // Alone, and of a job only.
        for bad in [
            r#"{"stream":"job","id":5,"username":"a","event":{"timestamp":1,"name":"x"}}"#,
            r#"{"stream":"resource","username":"a"}"#,
        ] {
            let d = decode_line(bad.as_bytes(), &Origin::default(), Format::Auto);
            assert!(d.records.is_empty() && d.errors.len() == 1, "{bad}");
        }
    }

    #[test]
    fn decodes_every_form() {
        let o = origin(EventStream::Job, Some(7));
        let d = decode_line(br#"{"timestamp":1.5,"name":"validate"}"#, &o, Format::Auto);
        assert_eq!(d.records.len(), 1);
        assert_eq!(d.records[0].id, Some(JobId(7)));

        let none = Origin::default();
        let d = decode_line(
            br#"{"id":42,"events":[{"timestamp":1,"name":"alloc"},{"bad":1}],"R":{"execution":{}}}"#,
            &none,
            Format::Auto,
        );
        assert_eq!(d.records.len(), 2);
        assert!(matches!(d.records[0].body, Body::R(_)));
        assert_eq!(d.errors.len(), 1);

        let d = decode_line(br#"{"id":-1,"events":[]}"#, &none, Format::Auto);
        assert_eq!(d.records[0].body, Body::Sentinel);

        let d = decode_line(br#"{"events":[]}"#, &none, Format::Auto);
        assert_eq!(d.records[0].stream, EventStream::Resource);
        assert_eq!(d.records[0].body, Body::Sentinel);

        let d = decode_line(
            br#"{"cluster":"c","id":"f2","stream":"exec","event":{"timestamp":1,"name":"init"}}"#,
            &none,
            Format::Auto,
        );
        assert_eq!(d.records[0].cluster.as_deref(), Some("c"));
        assert_eq!(d.records[0].id, Some(JobId(1)));
        assert_eq!(d.records[0].stream, EventStream::Exec);

        let d = decode_line(
            br#"{"id":5,"type":"release","data":{"ranks":"all","final":true}}"#,
            &none,
            Format::Auto,
        );
        assert!(matches!(d.records[0].body, Body::ExecResponse(_)));
    }

    #[test]
    fn reports_bad_lines() {
        let none = Origin::default();
        type Case<'a> = (&'a [u8], fn(&DecodeError) -> bool);
        let bad: &[Case] = &[
            (b"\xff\xfe", |e| *e == DecodeError::Utf8),
            (b"{", |e| matches!(e, DecodeError::Json(_))),
            (b"[]", |e| *e == DecodeError::NotObject),
            (b"{}", |e| *e == DecodeError::UnknownForm),
            (br#"{"timestamp":1,"name":"x"}"#, |e| {
                *e == DecodeError::NoStream
            }),
            (br#"{"id":"zz","events":[]}"#, |e| {
                matches!(e, DecodeError::Field(_))
            }),
            (
                br#"{"stream":"job","event":{"timestamp":1,"name":"x"}}"#,
                |e| *e == DecodeError::NoJobId,
            ),
        ];
        for (line, check) in bad {
            let d = decode_line(line, &none, Format::Auto);
            assert!(d.records.is_empty());
            assert!(check(&d.errors[0]), "{:?}", d.errors);
        }
        let d = decode_line(
            br#"{"timestamp":1,"name":"x"}"#,
            &origin(EventStream::Job, None),
            Format::Auto,
        );
        assert_eq!(d.errors[0], DecodeError::NoJobId);
    }

    #[test]
    fn an_r_file_must_be_json_and_a_jobspec_file_is_read_whatever_it_is() {
        let r = document_file(br#"{"execution":{"expiration":5}}"#, false);
        assert!(matches!(r, Ok(Body::R(ref o)) if o.to_value()["execution"]["expiration"] == 5));
        // JSON, not an object: read as `{}`.
        assert!(
            matches!(document_file(b"[1]", false), Ok(Body::R(ref o)) if o.to_value() == serde_json::json!({}))
        );
        let bad = document_file(br#"{"execution":"#, false);
        assert!(matches!(bad, Err(DecodeError::RNotJson(_))), "{bad:?}");
        match document_file(b"not json", true) {
            Ok(Body::JobSpec(read)) => assert!(read.text.is_none() && read.error.is_some()),
            other => panic!("{other:?}"),
        }
        // A jobspec's reason cites the file as it is, newline and all.
        match document_file(b"[1]\n", true) {
            Ok(Body::JobSpec(read)) => assert_eq!(
                read.error,
                Some(JobSpecError::NotObject("[1]\n".into())),
                "{read:?}"
            ),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics(line in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_line(&line, &origin(EventStream::Job, Some(1)), Format::Auto);
        }

        #[test]
        fn the_fast_path_agrees_with_the_general_path(s in r#"\{("(id|events|stream|event|R|cluster|jobspec|kind|username)":(-?[0-9]{1,3}|1\.5|"(job|exec|resource|x|a b|)"|\[(\{"(timestamp|name|context)":(1|0|"a"|""|null|\{\}),?\}){0,2}\]|\{"(timestamp|name|context)":(1|"a"|null|\{\})\}|\{\}|null|true),?){0,5}\}"#) {
            for format in [Format::Auto, Format::JobJournal, Format::ResourceJournal, Format::Envelope] {
                fast_agrees(&s, format)?;
            }
        }

        #[test]
        fn decode_json_shapes_never_panic(s in r#"\{("(id|events|timestamp|name|context|stream|event|type|data|R|cluster)":(-?[0-9]{1,3}|"[a-z]{0,4}"|\[\]|\{\}|null|true),?){0,6}\}"#) {
            let _ = decode_line(s.as_bytes(), &Origin::default(), Format::Auto);
        }

        #[test]
        fn document_files_never_panic(content in prop::collection::vec(any::<u8>(), 0..200), jobspec: bool) {
            match document_file(&content, jobspec) {
                Ok(Body::R(_)) => prop_assert!(!jobspec),
                Ok(Body::JobSpec(_)) => prop_assert!(jobspec),
                Ok(other) => prop_assert!(false, "{other:?}"),
                Err(e) => prop_assert!(!jobspec && matches!(e, DecodeError::RNotJson(_))),
            }
        }

        #[test]
        fn classify_never_panics(p in "[a-z0-9./]{0,60}") {
            let _ = classify_path(Path::new(&p));
        }
    }
}
