//! Anomalies: what an input did that the RFCs do not allow.
//!
//! The model never stops on bad input; it records an anomaly and goes on as
//! flux-core would. The stream and kind are machine-readable (metrics and
//! sinks group by them); the message is for people.

use serde::Serialize;
use std::fmt;

/// Which eventlog or protocol an anomaly was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stream {
    /// The primary job eventlog (RFC 21).
    Job,
    /// The exec eventlog (RFC 50).
    Exec,
    /// Exec-protocol responses (RFC 32).
    ExecProtocol,
    /// The resource eventlog or journal (RFC 44).
    Resource,
    /// Input that could not be decoded into an event at all.
    Input,
}

impl Stream {
    pub const ALL: [Stream; 5] = [
        Stream::Job,
        Stream::Exec,
        Stream::ExecProtocol,
        Stream::Resource,
        Stream::Input,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Job => "job",
            Stream::Exec => "exec",
            Stream::ExecProtocol => "exec-protocol",
            Stream::Resource => "resource",
            Stream::Input => "input",
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of rule was broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// The line is not JSON, not an RFC 18 event, or not a known message form.
    Malformed,
    /// A REQUIRED context key is missing.
    MissingContext,
    /// A context key has the wrong type or an invalid value (a bad idset, ...).
    InvalidContext,
    /// The event is not allowed in the current state or position.
    UnexpectedEvent,
    /// The event's timestamp is earlier than one already applied.
    OutOfOrder,
    /// An event for something never introduced (no submit, no restart, ...).
    UnknownTarget,
    /// A rank outside the instance's ranks.
    UnknownRank,
    /// Something that must happen at most once happened again.
    Repeated,
    /// An event name the RFCs do not define, where they do not allow others.
    UnknownEvent,
    /// An event dated before 1970 or too far ahead of the wall clock.
    BadTimestamp,
}

impl AnomalyKind {
    pub const ALL: [AnomalyKind; 10] = [
        AnomalyKind::Malformed,
        AnomalyKind::MissingContext,
        AnomalyKind::InvalidContext,
        AnomalyKind::UnexpectedEvent,
        AnomalyKind::OutOfOrder,
        AnomalyKind::UnknownTarget,
        AnomalyKind::UnknownRank,
        AnomalyKind::Repeated,
        AnomalyKind::UnknownEvent,
        AnomalyKind::BadTimestamp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AnomalyKind::Malformed => "malformed",
            AnomalyKind::MissingContext => "missing-context",
            AnomalyKind::InvalidContext => "invalid-context",
            AnomalyKind::UnexpectedEvent => "unexpected-event",
            AnomalyKind::OutOfOrder => "out-of-order",
            AnomalyKind::UnknownTarget => "unknown-target",
            AnomalyKind::UnknownRank => "unknown-rank",
            AnomalyKind::Repeated => "repeated",
            AnomalyKind::UnknownEvent => "unknown-event",
            AnomalyKind::BadTimestamp => "bad-timestamp",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule violation found by a state machine. The caller adds the key
/// (cluster, job id) it was replaying.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Anomaly {
    pub stream: Stream,
    pub kind: AnomalyKind,
    /// The event name involved, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// The timestamp of that event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<f64>,
    /// The rank concerned (resource stream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub message: String,
}

impl Anomaly {
    pub fn new(stream: Stream, kind: AnomalyKind, message: impl Into<String>) -> Self {
        Anomaly {
            stream,
            kind,
            event: None,
            timestamp: None,
            rank: None,
            message: message.into(),
        }
    }

    /// The same anomaly, naming the event it concerns.
    pub fn at(mut self, name: &str, timestamp: f64) -> Self {
        self.event = Some(name.to_string());
        self.timestamp = Some(timestamp);
        self
    }

    /// The same anomaly, naming the rank it concerns.
    pub fn on_rank(mut self, rank: u32) -> Self {
        self.rank = Some(rank);
        self
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.stream, self.kind)?;
        if let Some(e) = &self.event {
            write!(f, " ({e})")?;
        }
        if let Some(r) = self.rank {
            write!(f, " rank {r}")?;
        }
        write!(f, ": {}", self.message)
    }
}
