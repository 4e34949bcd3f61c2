//! The `alerts` record: an alert firing or resolving, with the labels that
//! identify it to Alertmanager and a human summary. Written by the alert
//! engine's and the feed watch's effects, read by the pagers (the
//! Alertmanager and HTTP sinks), the query API and `fluxpipe top`.

use super::{RecordKind, record_id, rfc3339};
use crate::keyed::alerts::engine::{AlertEvent, Subject};
use crate::keyed::alerts::rule::{Rule, RuleKind};
use crate::keyed::alerts::watch::WatchAlert;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// Where an alert stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertStatus {
    Firing,
    Resolved,
    /// A condition that holds, not yet for its rule's duration (only in
    /// the query API's answer about one job).
    Pending,
}

impl AlertStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertStatus::Firing => "firing",
            AlertStatus::Resolved => "resolved",
            AlertStatus::Pending => "pending",
        }
    }
}

/// An alert record. Its keys are in sorted order, as every record's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertRecord {
    pub alertname: String,
    /// `summary` and `since` (RFC 3339), and a drained node's `reason`.
    pub annotations: BTreeMap<String, String>,
    pub cluster: String,
    /// When it ended (RFC 3339); `null` while it fires.
    pub ends_at: Option<String>,
    /// A job's alert: the job id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// `RecordKind::Alert` as this module builds it (private: no other code
    /// sets it); a record read back keeps what it said.
    kind: RecordKind,
    /// What Alertmanager knows the alert by.
    pub labels: BTreeMap<String, String>,
    /// A node's alert: its name (`rank{N}` while none is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A job's alert: its queue when the alert fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub record_id: String,
    /// Announced again from restored state (after a restart or a
    /// takeover): a receiver may have been paged for it already (see
    /// [`crate::sinks::pager`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub restored: bool,
    pub rule_kind: String,
    pub severity: String,
    /// When its condition began, seconds since the epoch.
    pub since: f64,
    /// A feed watch alert: the silent source (`null` for the instance).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub source: Option<Option<String>>,
    /// When it began (RFC 3339).
    pub starts_at: String,
    /// A job's state, or a node's (`drained`, `draining`), when the
    /// alert fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    pub status: AlertStatus,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A key that is present, even as `null`, is `Some`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

impl AlertRecord {
    /// A record with the keys every alert has (but its summary).
    fn new(rule: &Rule, cluster: &str, status: AlertStatus, since: f64) -> Self {
        let mut labels = BTreeMap::new();
        labels.insert("alertname".into(), rule.name.clone());
        labels.insert("flux_cluster".into(), cluster.to_string());
        labels.insert("severity".into(), rule.severity.clone());
        let mut annotations = BTreeMap::new();
        annotations.insert("since".into(), rfc3339(since));
        AlertRecord {
            alertname: rule.name.clone(),
            annotations,
            cluster: cluster.to_string(),
            ends_at: None,
            id: None,
            kind: RecordKind::Alert,
            labels,
            node: None,
            queue: None,
            rank: None,
            record_id: String::new(),
            restored: false,
            rule_kind: rule.kind.name().to_string(),
            severity: rule.severity.clone(),
            since,
            source: None,
            starts_at: String::new(),
            state: None,
            status,
        }
    }

    /// Its times, and its id: the rule, the cluster, the subject (its kind:
    /// 0 a node, 1 a job, 2 a feed; and its bytes), the status and times.
    fn stamp(
        &mut self,
        rule: &Rule,
        (kind, subject): (u8, &[u8]),
        status: crate::keyed::alerts::event::Status,
        starts_at: f64,
        ends_at: Option<f64>,
    ) {
        self.starts_at = rfc3339(starts_at);
        self.ends_at = ends_at.map(rfc3339);
        let ends = ends_at.unwrap_or(f64::NAN).to_bits().to_le_bytes();
        self.record_id = record_id(&[
            b"alert",
            rule.name.as_bytes(),
            self.cluster.as_bytes(),
            &[kind],
            subject,
            status.as_str().as_bytes(),
            &starts_at.to_bits().to_le_bytes(),
            &ends,
        ]);
    }

    /// The cluster it concerns, as Alertmanager knows it.
    pub fn flux_cluster(&self) -> &str {
        self.labels.get("flux_cluster").map_or("", String::as_str)
    }

    /// When it began (firing) or ended (resolved), as its record says.
    pub fn when_text(&self) -> Option<&str> {
        match self.status {
            AlertStatus::Resolved => self.ends_at.as_deref(),
            _ => Some(self.starts_at.as_str()),
        }
    }
}

#[cfg(test)]
impl AlertRecord {
    /// A job's alert of rule `sched_too_long` in cluster `c` (`status`:
    /// `firing` or `resolved`), for tests.
    pub fn of_job(status: &str, job: &str, starts: f64, ends: Option<f64>) -> Self {
        let status = match status {
            "resolved" => AlertStatus::Resolved,
            _ => AlertStatus::Firing,
        };
        let kind = RuleKind::JobState(crate::flux::job::JobState::Sched);
        let Ok(rule) = Rule::new("sched_too_long", kind, "1h", "warning") else {
            unreachable!("a valid rule")
        };
        let mut r = AlertRecord::new(&rule, "c", status, starts);
        r.labels.remove("severity");
        r.labels.insert("jobid".into(), job.into());
        r.annotations.insert("summary".into(), format!("job {job}"));
        r.starts_at = rfc3339(starts);
        r.ends_at = ends.map(rfc3339);
        r
    }
}

fn status(a: &crate::keyed::alerts::event::Status) -> AlertStatus {
    match a {
        crate::keyed::alerts::event::Status::Firing => AlertStatus::Firing,
        crate::keyed::alerts::event::Status::Resolved => AlertStatus::Resolved,
    }
}

/// The record of a job's or a node's alert, as it stands in `a`.
pub fn alert(rule: &Rule, a: &AlertEvent) -> AlertRecord {
    let hold = &rule.hold_text;
    let cluster = a.subject.cluster();
    let mut record = AlertRecord::new(rule, cluster, status(&a.status), a.since);
    let (summary, subject_bytes) = match (&a.subject, &a.detail) {
        (Subject::Job(k), detail) => {
            let f58 = k.id.to_f58();
            let state = match (rule.kind, detail.job_state()) {
                (RuleKind::JobState(s), _) | (_, Some(s)) => s.as_str(),
                _ => "",
            };
            if !state.is_empty() {
                record.labels.insert("state".into(), state.into());
                record.state = Some(state.into());
            }
            // As it stood when the alert fired, as the state.
            if let Some(queue) = detail.queue() {
                record.labels.insert("queue".into(), queue.into());
                record.queue = Some(queue.into());
            }
            record.id = Some(k.id.0);
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
            record.labels.insert("jobid".into(), f58);
            (summary, k.id.0.to_le_bytes())
        }
        (Subject::Node(n), detail) => {
            let host = crate::flux::resource::rank_name(n.rank, detail.host()).into_owned();
            // As it stood when the alert fired (its detail is kept from
            // then): a label that changed under an open alert would split
            // it in two at Alertmanager.
            if let Some(draining) = detail.draining() {
                let state = if draining { "draining" } else { "drained" };
                record.labels.insert("state".into(), state.into());
                record.state = Some(state.into());
            }
            let what = match rule.kind {
                RuleKind::NodeDrained => "drained",
                RuleKind::NodeOffline => "offline",
                RuleKind::NodeTorpid => "torpid (not heard from)",
                _ => rule.name.as_str(),
            };
            let summary = format!("node {host} (rank {}) {what} for more than {hold}", n.rank);
            record.labels.insert("node".into(), host.clone());
            record.labels.insert("rank".into(), n.rank.to_string());
            record.node = Some(host);
            record.rank = Some(n.rank);
            (summary, u64::from(n.rank).to_le_bytes())
        }
    };
    record.annotations.insert("summary".into(), summary);
    if let Some(r) = a.detail.reason().filter(|r| !r.is_empty()) {
        record.annotations.insert("reason".into(), r.to_string());
    }
    let kind = u8::from(matches!(a.subject, Subject::Job(_)));
    record.stamp(
        rule,
        (kind, &subject_bytes),
        a.status,
        a.starts_at,
        a.ends_at,
    );
    record
}

/// An alert of the feed watch (`feed_silent`, `instance_down`), in the
/// form of every other alert record: a cluster's, with the source of a
/// silent feed as a label.
pub fn watch_alert(rule: &Rule, a: &WatchAlert) -> AlertRecord {
    let cluster = a.subject.cluster.as_str();
    let hold = &rule.hold_text;
    let source = a.subject.source.as_deref();
    let summary = match (rule.kind, source) {
        (RuleKind::FeedSilent, Some(source)) => format!(
            "nothing heard from cluster {cluster} on source {source} (no record, no heartbeat) for more than {hold}"
        ),
        (RuleKind::InstanceDown, _) => {
            format!("the Flux instance of cluster {cluster} is down (for more than {hold})")
        }
        _ => format!("cluster {cluster}: {}", rule.name),
    };
    let mut record = AlertRecord::new(rule, cluster, status(&a.status), a.since);
    record.annotations.insert("summary".into(), summary);
    if let (RuleKind::FeedSilent, Some(source)) = (rule.kind, source) {
        record.labels.insert("source".into(), source.to_string());
    }
    record.source = Some(a.subject.source.clone());
    let source_bytes = source.unwrap_or("").as_bytes();
    record.stamp(rule, (2, source_bytes), a.status, a.starts_at, a.ends_at);
    record
}
