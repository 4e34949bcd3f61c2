//! The execution phase of one job, from two sides:
//!
//! - [`ExecLog`]: the RFC 50 exec eventlog (`guest.exec.eventlog`), written
//!   by the exec system (unprefixed names) and by the job shell (`shell.*`).
//! - [`ExecProtocol`]: the RFC 32 response stream of `<service>.start`,
//!   from the exec service to the job manager.
//!
//! Both only check and record; the job-side cross-checks (the `complete`
//! status equals the job's `finish` status, a `start` response matches the
//! job's `start` event, ...) are the caller's, through the accessors.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thin_vec::ThinVec;
use thiserror::Error;

use super::anomaly::{Anomaly, AnomalyKind, Stream};
use super::event::{ContextError, Event};
use super::idset::{IdSet, Ranks};
use super::packed::{OptInt, Stamp};

/// What the exec system recorded when the leader shell exited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShellExit {
    pub rank: u32,
    pub wait_status: i64,
    pub active_ranks: Option<IdSet>,
}

/// The outcome of applying one exec eventlog event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecApplied {
    pub anomalies: Vec<Anomaly>,
    /// The event repeats one already applied (same timestamp and name).
    pub skipped_duplicate: bool,
}

/// State of one job's exec eventlog. Every running job has one: its
/// optional numbers are packed ([`Stamp`], [`OptInt`]: 8 bytes, not 16)
/// and the shell's exit, known only at the end, is boxed, so it fits a
/// 96-byte allocation, not a 192-byte one. Each is saved as the field it
/// replaced.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExecLog {
    /// Counts in 32 bits (one job's exec log never nears four billion
    /// events; they saturate), so that the log and a pointer beside it
    /// keep to a 96-byte allocation.
    events: u32,
    initialized: bool,
    starting: bool,
    reattach_count: u32,
    restarted: bool,
    complete_status: OptInt,
    complete_timestamp: Stamp,
    shell_exit: Option<Box<ShellExit>>,
    done: bool,
    shell_events: u32,
    last_shell_event: Option<compact_str::CompactString>,
    /// Newest timestamp among exec-system events. Only those are checked
    /// for order: the shell writes `shell.*` events on its own, and real
    /// logs interleave the two writers with slightly crossed timestamps
    /// (`recoverable` a fraction of a millisecond before `shell.start`).
    last_system_ts: Stamp,
    /// Each event applied, as a 64-bit digest of its timestamp and name,
    /// sorted: repeats are recognized without keeping names per job.
    seen: ThinVec<u64>,
    /// `recoverable` was seen: the shells can be reattached after a
    /// restart (RFC 50). Last, with a default: state saved before it
    /// reads as before.
    #[serde(default)]
    recoverable: bool,
}

/// Events whose context RFC 50 says SHALL be empty.
const EMPTY_CONTEXT: [&str; 6] = [
    "init",
    "reattach",
    "starting",
    "re-starting",
    "recoverable",
    "done",
];

impl ExecLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// `init` was seen.
    pub fn initialized(&self) -> bool {
        self.initialized
    }

    /// `starting` was seen: the exec system launched the shells.
    pub fn started(&self) -> bool {
        self.starting
    }

    /// At least one `reattach` was seen.
    pub fn reattached(&self) -> bool {
        self.reattach_count > 0
    }

    pub fn reattach_count(&self) -> u32 {
        self.reattach_count
    }

    /// `recoverable` was seen: the exec system can reattach to the job's
    /// shells after a restart (a job of flux-core's `bgexec` or
    /// `sdexec`).
    pub fn recoverable(&self) -> bool {
        self.recoverable
    }

    /// `re-starting` was seen (shells of a recovered job re-attached; an
    /// older flux-core's event, gone from RFC 50).
    pub fn restarted(&self) -> bool {
        self.restarted
    }

    /// The wait status of the (first) `complete` event; the job's `finish`
    /// event must carry the same.
    pub fn complete_status(&self) -> Option<i64> {
        self.complete_status.get()
    }

    /// (rank, wait status) of the leader shell's exit.
    /// When the (first) `complete` event was written.
    pub fn complete_timestamp(&self) -> Option<f64> {
        self.complete_timestamp.get()
    }

    pub fn shell_exit(&self) -> Option<(u32, i64)> {
        self.shell_exit.as_ref().map(|s| (s.rank, s.wait_status))
    }

    /// The full `shell-exit` record, with `active_ranks`.
    pub fn shell_exit_info(&self) -> Option<&ShellExit> {
        self.shell_exit.as_deref()
    }

    /// `done` was seen: nothing more may follow.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Number of `shell.*` events applied.
    pub fn shell_event_count(&self) -> u64 {
        u64::from(self.shell_events)
    }

    /// Name of the latest `shell.*` event (e.g. `shell.task-exit`).
    pub fn last_shell_event(&self) -> Option<&str> {
        self.last_shell_event.as_deref()
    }

    /// Number of events applied (duplicates not counted).
    pub fn event_count(&self) -> u64 {
        u64::from(self.events)
    }

    /// Apply one event of the exec eventlog, in log order.
    pub fn apply(&mut self, ev: &Event) -> ExecApplied {
        let mut out = ExecApplied::default();
        let key = event_digest(ev);
        let Err(slot) = self.seen.binary_search(&key) else {
            out.skipped_duplicate = true;
            return out;
        };
        let mut flag = |kind, msg: String| {
            out.anomalies
                .push(Anomaly::new(Stream::Exec, kind, msg).at(&ev.name, ev.timestamp));
        };
        let name = ev.name.as_str();

        if self.done {
            if name == "done" {
                flag(AnomalyKind::Repeated, "second `done` event".into());
            } else {
                flag(
                    AnomalyKind::UnexpectedEvent,
                    "event after `done`, which SHALL be final".into(),
                );
            }
        }
        if self.events == 0 && name != "init" {
            flag(
                AnomalyKind::UnexpectedEvent,
                "the first event SHALL be `init`".into(),
            );
        }
        let system = !name.starts_with("shell.");
        if system {
            if let Some(last) = self.last_system_ts.get()
                && ev.timestamp < last
            {
                flag(
                    AnomalyKind::OutOfOrder,
                    format!("timestamp {} is older than {last}", ev.timestamp),
                );
            }
            if self.last_system_ts.get().is_none_or(|t| ev.timestamp > t) {
                self.last_system_ts.set(ev.timestamp);
            }
        }
        if EMPTY_CONTEXT.contains(&name) && ev.context.as_ref().is_some_and(|c| !c.is_empty()) {
            flag(
                AnomalyKind::InvalidContext,
                format!("`{name}` SHALL have an empty context"),
            );
        }

        match name {
            "init" => {
                if self.initialized {
                    flag(AnomalyKind::Repeated, "second `init` event".into());
                } else if self.events > 0 {
                    flag(
                        AnomalyKind::UnexpectedEvent,
                        "`init` is not the first event".into(),
                    );
                }
                self.initialized = true;
            }
            "reattach" => self.reattach_count = self.reattach_count.saturating_add(1),
            "starting" => {
                if self.starting {
                    flag(AnomalyKind::Repeated, "second `starting` event".into());
                }
                self.starting = true;
            }
            "recoverable" => {
                if self.recoverable {
                    flag(
                        AnomalyKind::Repeated,
                        "`recoverable` SHALL be posted at most once".into(),
                    );
                } else if !self.starting {
                    flag(
                        AnomalyKind::UnexpectedEvent,
                        "`recoverable` before `starting`".into(),
                    );
                }
                self.recoverable = true;
            }
            "re-starting" => {
                if self.reattach_count == 0 {
                    flag(
                        AnomalyKind::UnexpectedEvent,
                        "`re-starting` without a prior `reattach`".into(),
                    );
                }
                self.restarted = true;
            }
            "complete" => match ev.int("status") {
                Ok(status) => {
                    // Seen by its time: a status of i64::MIN packs to none.
                    if self.complete_timestamp.is_some() {
                        flag(AnomalyKind::Repeated, "second `complete` event".into());
                    } else {
                        self.complete_status.set(status);
                        self.complete_timestamp.set(ev.timestamp);
                    }
                }
                Err(e) => flag(context_kind(&e), e.to_string()),
            },
            "shell-exit" => {
                let values = ev.values(["rank", "wait_status", "active_ranks"]);
                let rank = match values.int("rank") {
                    Ok(r) => match u32::try_from(r) {
                        Ok(r) => Some(r),
                        Err(_) => {
                            flag(
                                AnomalyKind::InvalidContext,
                                format!("`rank` {r} is not a broker rank"),
                            );
                            None
                        }
                    },
                    Err(e) => {
                        flag(context_kind(&e), e.to_string());
                        None
                    }
                };
                let wait_status = match values.int("wait_status") {
                    Ok(w) => Some(w),
                    Err(e) => {
                        flag(context_kind(&e), e.to_string());
                        None
                    }
                };
                let active_ranks = match values.opt_str("active_ranks") {
                    Ok(None) => None,
                    Ok(Some(s)) => match IdSet::parse(&s) {
                        Ok(set) => Some(set),
                        Err(e) => {
                            flag(
                                AnomalyKind::InvalidContext,
                                format!("`active_ranks` is not a valid idset ({s:?}): {e}"),
                            );
                            None
                        }
                    },
                    Err(e) => {
                        flag(context_kind(&e), e.to_string());
                        None
                    }
                };
                if self.shell_exit.is_some() {
                    flag(
                        AnomalyKind::Repeated,
                        "`shell-exit` SHALL be posted at most once".into(),
                    );
                } else if let (Some(rank), Some(wait_status)) = (rank, wait_status) {
                    self.shell_exit = Some(Box::new(ShellExit {
                        rank,
                        wait_status,
                        active_ranks,
                    }));
                }
            }
            "done" => self.done = true,
            // `log` has no requirements; other names MAY appear (RFC 50).
            _ if !system => {
                self.shell_events = self.shell_events.saturating_add(1);
                self.last_shell_event = Some(ev.name.clone());
            }
            _ => {}
        }
        self.seen.insert(slot, key);
        self.events = self.events.saturating_add(1);
        out
    }
}

/// An exec event's identity: timestamp and name, digested.
fn event_digest(ev: &Event) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&ev.timestamp.to_bits().to_le_bytes());
    h.update(ev.name.as_bytes());
    h.digest()
}

fn context_kind(e: &ContextError) -> AnomalyKind {
    match e {
        ContextError::Missing(_) => AnomalyKind::MissingContext,
        ContextError::WrongType { .. } => AnomalyKind::InvalidContext,
    }
}

/// One RFC 32 `<service>.start` response.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecResponse {
    /// The job shells have started.
    Start,
    /// `ranks` may be released; `final_` says all ranks now are.
    Release { ranks: Ranks, final_: bool },
    /// Raise an exception on the job (RFC 21 severity and type).
    Exception {
        severity: i64,
        kind: String,
        note: Option<String>,
    },
    /// The job is complete with this wait status.
    Finish { status: i64 },
}

/// Why a message is not an RFC 32 start response.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ExecProtocolError {
    #[error("response is not a JSON object")]
    NotObject,
    #[error("response has no `{0}` key")]
    Missing(&'static str),
    #[error("response key `{key}` is not {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    #[error("unknown response type `{0}`")]
    UnknownType(String),
    #[error("release ranks {0:?} is neither an idset nor \"all\"")]
    BadRanks(String),
}

impl ExecResponse {
    /// Decode `{"id": N, "type": .., "data": {..}}` into the job id and the
    /// response.
    pub fn from_message(v: &Value) -> Result<(u64, ExecResponse), ExecProtocolError> {
        use ExecProtocolError as E;
        let obj = v.as_object().ok_or(E::NotObject)?;
        let id = obj
            .get("id")
            .ok_or(E::Missing("id"))?
            .as_u64()
            .ok_or(E::WrongType {
                key: "id",
                expected: "a non-negative integer",
            })?;
        let kind = obj
            .get("type")
            .ok_or(E::Missing("type"))?
            .as_str()
            .ok_or(E::WrongType {
                key: "type",
                expected: "a string",
            })?;
        let data = obj
            .get("data")
            .ok_or(E::Missing("data"))?
            .as_object()
            .ok_or(E::WrongType {
                key: "data",
                expected: "an object",
            })?;
        let int = |key: &'static str, full: &'static str| -> Result<i64, ExecProtocolError> {
            data.get(key)
                .ok_or(E::Missing(full))?
                .as_i64()
                .ok_or(E::WrongType {
                    key: full,
                    expected: "an integer",
                })
        };
        let resp = match kind {
            "start" => ExecResponse::Start,
            "release" => {
                let ranks = data
                    .get("ranks")
                    .ok_or(E::Missing("data.ranks"))?
                    .as_str()
                    .ok_or(E::WrongType {
                        key: "data.ranks",
                        expected: "a string",
                    })?;
                let ranks = Ranks::parse(ranks).map_err(|_| E::BadRanks(ranks.to_string()))?;
                let final_ = data
                    .get("final")
                    .ok_or(E::Missing("data.final"))?
                    .as_bool()
                    .ok_or(E::WrongType {
                        key: "data.final",
                        expected: "a boolean",
                    })?;
                ExecResponse::Release { ranks, final_ }
            }
            "exception" => {
                let severity = int("severity", "data.severity")?;
                let kind = data
                    .get("type")
                    .ok_or(E::Missing("data.type"))?
                    .as_str()
                    .ok_or(E::WrongType {
                        key: "data.type",
                        expected: "a string",
                    })?
                    .to_string();
                let note = match data.get("note") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(_) => {
                        return Err(E::WrongType {
                            key: "data.note",
                            expected: "a string",
                        });
                    }
                };
                ExecResponse::Exception {
                    severity,
                    kind,
                    note,
                }
            }
            "finish" => ExecResponse::Finish {
                status: int("status", "data.status")?,
            },
            other => return Err(E::UnknownType(other.to_string())),
        };
        Ok((id, resp))
    }

    /// The RFC 32 `type` of this response.
    pub fn type_name(&self) -> &'static str {
        match self {
            ExecResponse::Start => "start",
            ExecResponse::Release { .. } => "release",
            ExecResponse::Exception { .. } => "exception",
            ExecResponse::Finish { .. } => "finish",
        }
    }
}

/// RFC 32 response stream for one job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExecProtocol {
    responses: u64,
    started: bool,
    finish_status: Option<i64>,
    final_released: bool,
    released_all: bool,
    released: IdSet,
    exceptions: u64,
    fatal_exception: bool,
}

impl ExecProtocol {
    pub fn new() -> Self {
        Self::default()
    }

    /// A `start` response was seen.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Status of the `finish` response.
    pub fn finish_status(&self) -> Option<i64> {
        self.finish_status
    }

    /// The final release (end of stream) was seen.
    pub fn final_released(&self) -> bool {
        self.final_released
    }

    /// A release named `all` ranks.
    pub fn released_all(&self) -> bool {
        self.released_all
    }

    /// Union of the ranks named in idset releases.
    pub fn released_ranks(&self) -> &IdSet {
        &self.released
    }

    /// Number of `exception` responses.
    pub fn exception_count(&self) -> u64 {
        self.exceptions
    }

    /// A severity-0 (fatal) exception was raised through this stream.
    pub fn fatal_exception(&self) -> bool {
        self.fatal_exception
    }

    /// Number of responses applied.
    pub fn response_count(&self) -> u64 {
        self.responses
    }

    /// Apply one response, in arrival order.
    pub fn apply(&mut self, r: &ExecResponse) -> Vec<Anomaly> {
        let mut out = Vec::new();
        let mut flag = |kind, msg: &str| {
            let mut a = Anomaly::new(Stream::ExecProtocol, kind, msg);
            a.event = Some(r.type_name().to_string());
            out.push(a);
        };
        self.responses += 1;
        if self.final_released {
            // The final release is end-of-stream; the job manager would
            // not even read this one, so it changes nothing here either.
            flag(
                AnomalyKind::UnexpectedEvent,
                "response after the final release, which SHALL be last",
            );
            return out;
        }
        match r {
            ExecResponse::Start => {
                if self.started {
                    flag(AnomalyKind::Repeated, "second `start` response");
                } else if self.finish_status.is_some() {
                    flag(AnomalyKind::UnexpectedEvent, "`start` after `finish`");
                }
                self.started = true;
            }
            ExecResponse::Release { ranks, final_ } => {
                match ranks {
                    Ranks::All => self.released_all = true,
                    Ranks::Set(set) => self.released.union_with(set),
                }
                if *final_ {
                    self.final_released = true;
                }
            }
            ExecResponse::Exception { severity, .. } => {
                self.exceptions += 1;
                if !(0..=7).contains(severity) {
                    flag(
                        AnomalyKind::InvalidContext,
                        "exception severity outside 0..=7 (RFC 21)",
                    );
                }
                if *severity == 0 {
                    self.fatal_exception = true;
                }
            }
            ExecResponse::Finish { status } => {
                if self.finish_status.is_some() {
                    flag(AnomalyKind::Repeated, "second `finish` response");
                } else {
                    self.finish_status = Some(*status);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::path::{Path, PathBuf};

    fn corpus(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/corpus")
            .join(rel)
    }

    fn events(text: &str) -> Vec<Event> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| Event::parse(l).unwrap())
            .collect()
    }

    fn run(evs: &[Event]) -> (ExecLog, Vec<Anomaly>) {
        let mut log = ExecLog::new();
        let mut out = Vec::new();
        for e in evs {
            out.extend(log.apply(e).anomalies);
        }
        (log, out)
    }

    fn ev(ts: f64, name: &str) -> Event {
        Event::new(ts, name)
    }

    fn evc(ts: f64, name: &str, ctx: Value) -> Event {
        Event::new(ts, name).with_context(ctx)
    }

    fn kinds(a: &[Anomaly]) -> Vec<AnomalyKind> {
        a.iter().map(|a| a.kind).collect()
    }

    /// A normal log: init, starting, shells, shell-exit, complete, done.
    fn normal() -> Vec<Event> {
        vec![
            ev(1.0, "init"),
            ev(1.1, "starting"),
            evc(1.2, "shell.init", json!({"leader-rank": 0, "size": 2})),
            evc(1.3, "shell.start", json!({})),
            evc(
                1.4,
                "shell.task-exit",
                json!({"rank": 0, "wait_status": 256}),
            ),
            evc(
                1.5,
                "shell-exit",
                json!({"rank": 0, "wait_status": 256, "active_ranks": "1"}),
            ),
            evc(1.6, "complete", json!({"status": 256})),
            ev(1.7, "done"),
        ]
    }

    // ---- exec eventlog --------------------------------------------------------

    #[test]
    fn normal_log_state() {
        let (log, anomalies) = run(&normal());
        assert_eq!(anomalies, []);
        assert!(log.initialized() && log.started() && log.done());
        assert!(!log.reattached() && !log.restarted());
        assert_eq!(log.complete_status(), Some(256));
        assert_eq!(log.shell_exit(), Some((0, 256)));
        let info = log.shell_exit_info().unwrap();
        assert_eq!(
            info.active_ranks.as_ref().map(|s| s.to_string()).as_deref(),
            Some("1")
        );
        assert_eq!(log.shell_event_count(), 3);
        assert_eq!(log.last_shell_event(), Some("shell.task-exit"));
        assert_eq!(log.event_count(), 8);
    }

    #[test]
    fn first_event_must_be_init() {
        let (_, a) = run(&[ev(1.0, "starting"), ev(2.0, "init")]);
        assert_eq!(
            kinds(&a),
            [AnomalyKind::UnexpectedEvent, AnomalyKind::UnexpectedEvent]
        );
        assert!(a[1].message.contains("not the first"));
        let (_, a) = run(&[ev(1.0, "init"), ev(2.0, "init")]);
        assert_eq!(kinds(&a), [AnomalyKind::Repeated]);
    }

    #[test]
    fn nothing_after_done() {
        let mut evs = normal();
        evs.push(ev(2.0, "log"));
        evs.push(ev(2.1, "shell.late"));
        evs.push(ev(2.2, "done"));
        let (_, a) = run(&evs);
        assert_eq!(
            kinds(&a),
            [
                AnomalyKind::UnexpectedEvent,
                AnomalyKind::UnexpectedEvent,
                AnomalyKind::Repeated
            ]
        );
    }

    #[test]
    fn complete_rules() {
        let (log, a) = run(&[ev(1.0, "init"), ev(2.0, "complete")]);
        assert_eq!(kinds(&a), [AnomalyKind::MissingContext]);
        assert_eq!(log.complete_status(), None);
        let (_, a) = run(&[
            ev(1.0, "init"),
            evc(2.0, "complete", json!({"status": "0"})),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]);
        let (log, a) = run(&[
            ev(1.0, "init"),
            evc(2.0, "complete", json!({"status": 9})),
            evc(3.0, "complete", json!({"status": 0})),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::Repeated]);
        assert_eq!(log.complete_status(), Some(9));
        // A status that packs to none still counts as the first complete.
        let (log, a) = run(&[
            ev(1.0, "init"),
            evc(2.0, "complete", json!({"status": i64::MIN})),
            evc(3.0, "complete", json!({"status": 0})),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::Repeated]);
        assert_eq!(log.complete_timestamp(), Some(2.0));
    }

    #[test]
    fn shell_exit_rules() {
        let (log, a) = run(&[
            ev(1.0, "init"),
            evc(2.0, "shell-exit", json!({"wait_status": 0})),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::MissingContext]);
        assert_eq!(log.shell_exit(), None);
        let (_, a) = run(&[ev(1.0, "init"), evc(2.0, "shell-exit", json!({"rank": 0}))]);
        assert_eq!(kinds(&a), [AnomalyKind::MissingContext]);
        let (_, a) = run(&[
            ev(1.0, "init"),
            evc(
                2.0,
                "shell-exit",
                json!({"rank": -1, "wait_status": 0, "active_ranks": "x"}),
            ),
        ]);
        assert_eq!(
            kinds(&a),
            [AnomalyKind::InvalidContext, AnomalyKind::InvalidContext]
        );
        let (_, a) = run(&[
            ev(1.0, "init"),
            evc(
                2.0,
                "shell-exit",
                json!({"rank": 0, "wait_status": 0, "active_ranks": 5}),
            ),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]);
        let (log, a) = run(&[
            ev(1.0, "init"),
            evc(2.0, "shell-exit", json!({"rank": 3, "wait_status": 0})),
            evc(3.0, "shell-exit", json!({"rank": 3, "wait_status": 9})),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::Repeated]);
        assert_eq!(log.shell_exit(), Some((3, 0)));
    }

    #[test]
    fn reattach_and_restarting() {
        let (log, a) = run(&[
            ev(1.0, "init"),
            ev(1.1, "starting"),
            ev(5.0, "reattach"),
            ev(5.1, "re-starting"),
            ev(9.0, "reattach"),
        ]);
        assert_eq!(a, []);
        assert!(log.reattached() && log.restarted());
        assert_eq!(log.reattach_count(), 2);
        let (_, a) = run(&[ev(1.0, "init"), ev(1.1, "re-starting")]);
        assert_eq!(kinds(&a), [AnomalyKind::UnexpectedEvent]);
    }

    /// A job of flux-core's bgexec that outlived a job-exec reload, as
    /// the corpus has it: `recoverable` after `starting`, then a
    /// `reattach` and its end, with no anomaly.
    #[test]
    fn recoverable_then_reattached() {
        let (log, a) = run(&[
            ev(1.0, "init"),
            ev(1.1, "starting"),
            ev(1.2, "recoverable"),
            ev(5.0, "reattach"),
            evc(6.0, "complete", json!({"status": 0})),
            ev(6.1, "done"),
        ]);
        assert_eq!(a, []);
        assert!(log.recoverable() && log.reattached() && !log.restarted());
        let (_, a) = run(&[
            ev(1.0, "init"),
            ev(1.1, "starting"),
            ev(1.2, "recoverable"),
            ev(1.3, "recoverable"),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::Repeated]);
        let (log, a) = run(&[ev(1.0, "init"), ev(1.1, "recoverable")]);
        assert_eq!(kinds(&a), [AnomalyKind::UnexpectedEvent]);
        assert!(log.recoverable());
        let (_, a) = run(&[
            ev(1.0, "init"),
            ev(1.1, "starting"),
            evc(1.2, "recoverable", json!({"x": 1})),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]);
    }

    #[test]
    fn starting_twice() {
        let (_, a) = run(&[ev(1.0, "init"), ev(1.1, "starting"), ev(1.2, "starting")]);
        assert_eq!(kinds(&a), [AnomalyKind::Repeated]);
    }

    #[test]
    fn empty_context_events() {
        for name in EMPTY_CONTEXT {
            let mut evs = vec![ev(1.0, "init"), ev(1.5, "reattach")];
            evs.push(evc(2.0, name, json!({"x": 1})));
            let (_, a) = run(&evs);
            assert!(kinds(&a).contains(&AnomalyKind::InvalidContext), "{name}");
        }
        // an empty object is fine
        let (_, a) = run(&[evc(1.0, "init", json!({}))]);
        assert_eq!(a, []);
    }

    #[test]
    fn other_names_and_log_are_free() {
        let (_, a) = run(&[
            ev(1.0, "init"),
            evc(1.1, "log", json!({"data": "x", "rank": "3"})),
            ev(1.2, "checkpoint-taken"),
            evc(1.3, "something-new", json!({"any": [1]})),
        ]);
        assert_eq!(a, []);
    }

    #[test]
    fn ordering_checked_among_system_events_only() {
        // the shell's events may cross the exec system's in time
        let (_, a) = run(&[
            ev(1.0, "init"),
            ev(1.1, "starting"),
            ev(1.31, "shell.start"),
            ev(1.30, "recoverable"),
            ev(1.29, "shell.task-exit"),
        ]);
        assert_eq!(a, []);
        let (log, a) = run(&[
            ev(1.0, "init"),
            ev(1.1, "starting"),
            evc(1.05, "complete", json!({"status": 0})),
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::OutOfOrder]);
        assert_eq!(log.complete_status(), Some(0)); // still applied
    }

    #[test]
    fn duplicates_are_skipped() {
        let mut log = ExecLog::new();
        for e in normal() {
            log.apply(&e);
        }
        for e in normal() {
            let a = log.apply(&e);
            assert!(a.skipped_duplicate && a.anomalies.is_empty());
        }
        assert_eq!(log.event_count(), 8);
        // same timestamp, another name: not a duplicate
        let a = log.apply(&ev(1.7, "init"));
        assert!(!a.skipped_duplicate);
    }

    // ---- corpus ----------------------------------------------------------------

    fn job_dirs() -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus("jobs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        dirs.sort();
        dirs
    }

    fn finish_status(job_eventlog: &[Event]) -> Option<i64> {
        job_eventlog
            .iter()
            .find(|e| e.name == "finish")
            .and_then(|e| e.int("status").ok())
    }

    #[test]
    fn corpus_exec_eventlogs_have_no_anomalies() {
        let mut logs = 0;
        let mut compared = 0;
        for dir in job_dirs() {
            let path = dir.join("exec.eventlog");
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            logs += 1;
            let evs = events(&text);
            let (log, anomalies) = run(&evs);
            assert_eq!(anomalies, [], "{}", path.display());
            assert!(log.initialized() && log.done(), "{}", path.display());
            let job = events(&std::fs::read_to_string(dir.join("eventlog")).unwrap());
            match (log.complete_status(), finish_status(&job)) {
                (Some(c), Some(f)) => {
                    assert_eq!(c, f, "{}", path.display());
                    compared += 1;
                }
                // a job can start and never `finish` (exec lost, exception)
                (c, f) => assert!(c.is_none() || f.is_none(), "{}", path.display()),
            }
            // replaying the whole log again is a no-op
            let mut again = log.clone();
            for e in &evs {
                assert!(again.apply(e).skipped_duplicate);
            }
        }
        assert_eq!(logs, 45);
        assert_eq!(compared, 45);
    }

    #[test]
    fn corpus_old_dump_exec_eventlogs_have_no_anomalies() {
        let mut stack = vec![corpus("upstream-testdata/job-manager-dumps")];
        let mut n = 0;
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let p = entry.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.ends_with("guest/exec/eventlog") {
                    n += 1;
                    let (log, a) = run(&events(&std::fs::read_to_string(&p).unwrap()));
                    assert_eq!(a, [], "{}", p.display());
                    assert!(log.done());
                }
            }
        }
        assert_eq!(n, 12);
    }

    /// Rebuild the RFC 32 responses a job manager received from its job
    /// eventlog: `start`, `release`, `finish`, and exceptions raised by the
    /// exec service (userid FLUX_USERID_UNKNOWN).
    fn responses_from_job_eventlog(job: &[Event]) -> Vec<Value> {
        job.iter()
            .filter_map(|e| {
                let c = e
                    .context
                    .as_ref()
                    .map(|c| Value::Object(c.to_map()))
                    .unwrap_or(json!({}));
                let (kind, data) = match e.name.as_str() {
                    "start" => ("start", json!({})),
                    "release" => ("release", c),
                    "finish" => ("finish", c),
                    "exception" if c["userid"] == json!(u32::MAX) => (
                        "exception",
                        json!({"severity": c["severity"], "type": c["type"], "note": c["note"]}),
                    ),
                    _ => return None,
                };
                Some(json!({"id": 42, "type": kind, "data": data}))
            })
            .collect()
    }

    #[test]
    fn corpus_protocol_rebuilt_from_job_eventlogs() {
        let mut checked = 0;
        for dir in job_dirs() {
            let job = events(&std::fs::read_to_string(dir.join("eventlog")).unwrap());
            let msgs = responses_from_job_eventlog(&job);
            if msgs.is_empty() {
                continue;
            }
            let mut p = ExecProtocol::new();
            for m in &msgs {
                let (id, r) = ExecResponse::from_message(m).unwrap();
                assert_eq!(id, 42);
                assert_eq!(p.apply(&r), [], "{}", dir.display());
            }
            assert!(p.final_released(), "{}", dir.display());
            assert_eq!(p.finish_status(), finish_status(&job));
            if let Ok(text) = std::fs::read_to_string(dir.join("exec.eventlog")) {
                let (log, _) = run(&events(&text));
                if p.finish_status().is_some() {
                    assert_eq!(
                        p.finish_status(),
                        log.complete_status(),
                        "{}",
                        dir.display()
                    );
                }
                assert_eq!(p.started(), log.started(), "{}", dir.display());
            }
            checked += 1;
        }
        assert_eq!(checked, 45);
    }

    // ---- RFC 32 protocol ----------------------------------------------------------

    fn resp(v: Value) -> ExecResponse {
        ExecResponse::from_message(&v).unwrap().1
    }

    #[test]
    fn decodes_every_response_type() {
        let (id, r) =
            ExecResponse::from_message(&json!({"id": 1552593348u64, "type": "start", "data": {}}))
                .unwrap();
        assert_eq!((id, r), (1552593348, ExecResponse::Start));
        assert_eq!(
            resp(json!({"id": 1, "type": "release", "data": {"ranks": "0-2", "final": true}})),
            ExecResponse::Release {
                ranks: Ranks::parse("0-2").unwrap(),
                final_: true
            }
        );
        assert_eq!(
            resp(json!({"id": 1, "type": "release", "data": {"ranks": "all", "final": false}})),
            ExecResponse::Release {
                ranks: Ranks::All,
                final_: false
            }
        );
        assert_eq!(
            resp(json!({"id": 1, "type": "exception",
                        "data": {"severity": 0, "type": "timeout", "note": "expired"}})),
            ExecResponse::Exception {
                severity: 0,
                kind: "timeout".into(),
                note: Some("expired".into())
            }
        );
        assert_eq!(
            resp(json!({"id": 1, "type": "exception", "data": {"severity": 2, "type": "x"}})),
            ExecResponse::Exception {
                severity: 2,
                kind: "x".into(),
                note: None
            }
        );
        assert_eq!(
            resp(json!({"id": 1, "type": "finish", "data": {"status": 143}})),
            ExecResponse::Finish { status: 143 }
        );
    }

    #[test]
    fn rejects_malformed_responses() {
        use ExecProtocolError as E;
        let err = |v: Value| ExecResponse::from_message(&v).unwrap_err();
        assert_eq!(err(json!([])), E::NotObject);
        assert_eq!(err(json!({"type": "start", "data": {}})), E::Missing("id"));
        assert!(matches!(
            err(json!({"id": -1, "type": "start", "data": {}})),
            E::WrongType { key: "id", .. }
        ));
        assert!(matches!(
            err(json!({"id": "1", "type": "start", "data": {}})),
            E::WrongType { key: "id", .. }
        ));
        assert_eq!(err(json!({"id": 1, "data": {}})), E::Missing("type"));
        assert_eq!(err(json!({"id": 1, "type": "start"})), E::Missing("data"));
        assert!(matches!(
            err(json!({"id": 1, "type": "start", "data": []})),
            E::WrongType { key: "data", .. }
        ));
        assert_eq!(
            err(json!({"id": 1, "type": "stop", "data": {}})),
            E::UnknownType("stop".into())
        );
        assert_eq!(
            err(json!({"id": 1, "type": "release", "data": {"final": true}})),
            E::Missing("data.ranks")
        );
        assert_eq!(
            err(json!({"id": 1, "type": "release", "data": {"ranks": "1-", "final": true}})),
            E::BadRanks("1-".into())
        );
        assert_eq!(
            err(json!({"id": 1, "type": "release", "data": {"ranks": "1"}})),
            E::Missing("data.final")
        );
        assert!(matches!(
            err(json!({"id": 1, "type": "release", "data": {"ranks": "1", "final": 1}})),
            E::WrongType {
                key: "data.final",
                ..
            }
        ));
        assert_eq!(
            err(json!({"id": 1, "type": "exception", "data": {"type": "x"}})),
            E::Missing("data.severity")
        );
        assert_eq!(
            err(json!({"id": 1, "type": "exception", "data": {"severity": 1}})),
            E::Missing("data.type")
        );
        assert!(matches!(
            err(
                json!({"id": 1, "type": "exception", "data": {"severity": 1, "type": "x", "note": 3}})
            ),
            E::WrongType {
                key: "data.note",
                ..
            }
        ));
        assert!(matches!(
            err(json!({"id": 1, "type": "finish", "data": {"status": 1.5}})),
            E::WrongType {
                key: "data.status",
                ..
            }
        ));
    }

    fn protocol(rs: &[ExecResponse]) -> (ExecProtocol, Vec<Anomaly>) {
        let mut p = ExecProtocol::new();
        let mut out = Vec::new();
        for r in rs {
            out.extend(p.apply(r));
        }
        (p, out)
    }

    fn release(ranks: &str, final_: bool) -> ExecResponse {
        ExecResponse::Release {
            ranks: Ranks::parse(ranks).unwrap(),
            final_,
        }
    }

    fn exception(severity: i64) -> ExecResponse {
        ExecResponse::Exception {
            severity,
            kind: "test".into(),
            note: None,
        }
    }

    #[test]
    fn normal_protocol() {
        let (p, a) = protocol(&[
            ExecResponse::Start,
            exception(3),
            release("1", false),
            ExecResponse::Finish { status: 0 },
            release("0,2", true),
        ]);
        assert_eq!(a, []);
        assert!(p.started() && p.final_released() && !p.released_all());
        assert_eq!(p.finish_status(), Some(0));
        assert_eq!(p.released_ranks().to_string(), "0-2");
        assert_eq!(p.exception_count(), 1);
        assert!(!p.fatal_exception());
        assert_eq!(p.response_count(), 5);
    }

    #[test]
    fn fatal_exception_may_omit_start_and_finish() {
        let (p, a) = protocol(&[exception(0), release("all", true)]);
        assert_eq!(a, []);
        assert!(p.fatal_exception() && p.released_all() && !p.started());
        assert_eq!(p.finish_status(), None);
    }

    #[test]
    fn nothing_after_final_release() {
        let (p, a) = protocol(&[
            ExecResponse::Start,
            ExecResponse::Finish { status: 0 },
            release("all", true),
            exception(0),
            ExecResponse::Finish { status: 9 },
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::UnexpectedEvent; 2]);
        assert_eq!(a[0].event.as_deref(), Some("exception"));
        assert_eq!(a[0].stream, Stream::ExecProtocol);
        assert_eq!(p.finish_status(), Some(0));
        assert!(!p.fatal_exception());
    }

    #[test]
    fn start_and_finish_at_most_once() {
        let (_, a) = protocol(&[ExecResponse::Start, ExecResponse::Start]);
        assert_eq!(kinds(&a), [AnomalyKind::Repeated]);
        let (p, a) = protocol(&[
            ExecResponse::Finish { status: 1 },
            ExecResponse::Finish { status: 2 },
        ]);
        assert_eq!(kinds(&a), [AnomalyKind::Repeated]);
        assert_eq!(p.finish_status(), Some(1));
        let (_, a) = protocol(&[ExecResponse::Finish { status: 1 }, ExecResponse::Start]);
        assert_eq!(kinds(&a), [AnomalyKind::UnexpectedEvent]);
    }

    #[test]
    fn exception_severity_range() {
        let (_, a) = protocol(&[exception(8)]);
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]);
        let (_, a) = protocol(&[exception(-1)]);
        assert_eq!(kinds(&a), [AnomalyKind::InvalidContext]);
    }

    // ---- properties ----------------------------------------------------------------

    fn arb_exec_event() -> impl Strategy<Value = Event> {
        let names = prop::sample::select(vec![
            "init",
            "reattach",
            "starting",
            "re-starting",
            "complete",
            "log",
            "shell-exit",
            "done",
            "shell.init",
            "shell.task-exit",
            "recoverable",
        ]);
        (
            0.0f64..10.0,
            names,
            prop::option::of(any::<i64>()),
            ".{0,6}",
            any::<bool>(),
        )
            .prop_map(|(ts, name, n, s, ctx)| {
                let e = Event::new(1.0 + (ts * 2.0).round() / 2.0, name);
                if ctx {
                    e.with_context(
                        json!({"status": n, "rank": n, "wait_status": n, "active_ranks": s}),
                    )
                } else {
                    e
                }
            })
    }

    fn arb_response() -> impl Strategy<Value = Value> {
        (
            prop::sample::select(vec!["start", "release", "exception", "finish", "bogus"]),
            prop::option::of(any::<i64>()),
            prop::sample::select(vec!["all", "0-3", "", "x", "1,1"]),
            any::<bool>(),
        )
            .prop_map(|(t, n, ranks, b)| {
                json!({"id": n, "type": t,
                       "data": {"ranks": ranks, "final": b, "severity": n, "type": t, "status": n}})
            })
    }

    proptest! {
        #[test]
        fn exec_log_never_panics(evs in prop::collection::vec(arb_exec_event(), 0..30)) {
            let mut log = ExecLog::new();
            for e in &evs {
                log.apply(e);
            }
            // a second pass is all duplicates
            for e in &evs {
                prop_assert!(log.apply(e).skipped_duplicate);
            }
        }

        #[test]
        fn protocol_never_panics(msgs in prop::collection::vec(arb_response(), 0..20)) {
            let mut p = ExecProtocol::new();
            let mut finals = 0;
            for m in &msgs {
                if let Ok((_, r)) = ExecResponse::from_message(m) {
                    let anomalies = p.apply(&r);
                    if finals > 0 {
                        prop_assert!(!anomalies.is_empty());
                    }
                    if matches!(r, ExecResponse::Release { final_: true, .. }) {
                        finals += 1;
                    }
                }
            }
            prop_assert_eq!(p.final_released(), finals > 0);
        }
    }
}
