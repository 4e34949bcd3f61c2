//! The `jobs` and `job_updates` records: a job's summary, with the
//! fields of `flux jobs --json`.

use super::{RecordKind, record_id};
use crate::flux::job::{JobResult, JobState};
use crate::flux::jobspec::JobSpec;
use crate::keyed::JobKey;
use crate::keyed::state::JobEntry;
use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// A job record, serialized straight to its line: the summary's fields
/// and the record's own, in the sorted order of a record built as a map.
///
/// Owned, so that its line can be written where it is first wanted (a
/// sink's thread) rather than on the shard's.
/// Read back (`Deserialize`) by what takes job records from a line: the
/// API's clients, and tests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bank: Option<CompactString>,
    pub cluster: Box<str>,
    #[serde(default)]
    pub dependencies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_note: Option<String>,
    /// As job-list gives them: of an inactive job only (false before).
    #[serde(default)]
    pub exception_occurred: bool,
    /// An exception raised while the job is still active (one that was
    /// not fatal, or not yet final): job-list shows none until the job
    /// ends, but an operator looking at the job wants it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_raised: Option<RaisedException>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_severity: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiration: Option<f64>,
    pub id: u64,
    /// The id in F58, as `flux jobs` prints it: a string, which JSON
    /// readers that keep numbers in doubles (JavaScript, jq 1.6) cannot
    /// round, as they round ids past 2^53.
    #[serde(default)]
    pub jobid: String,
    /// `RecordKind::Job` as this module builds it (private: no other code
    /// sets it); a record read back keeps what it said.
    kind: RecordKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ncores: Option<u32>,
    /// R's GPUs (not a field of flux-core 0.88's job-list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ngpus: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nnodes: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodelist: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ntasks: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<String>,
    pub record_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<JobResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub returncode: Option<i64>,
    pub state: JobState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_cleanup: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_depend: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_inactive: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_run: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_submit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub urgency: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub userid: Option<i64>,
    /// As resolved where Flux runs; absent when Flux's side did not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<CompactString>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waitstatus: Option<i64>,
}

/// An active job's exception, in [`JobRecord::exception_raised`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RaisedException {
    // In key order, as every record's keys are.
    pub note: String,
    pub severity: i64,
    #[serde(rename = "type")]
    pub kind: String,
}

impl JobRecord {
    pub fn new(key: &JobKey, entry: &JobEntry) -> Self {
        let job = &entry.job;
        let s = job.summary_view();
        let t = job.last_timestamp().unwrap_or(0.0).to_bits().to_le_bytes();
        let spec = s.spec;
        let texts = spec.map(JobSpec::texts).unwrap_or_default();
        let text = |t: Option<&str>| t.map(CompactString::from);
        // job-list gives a job's exception once it is inactive.
        let ended = s.ended_exception();
        JobRecord {
            bank: text(texts.bank),
            cluster: key.cluster.as_ref().into(),
            dependencies: s.dependencies.to_vec(),
            duration: spec.and_then(JobSpec::duration),
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
            kind: RecordKind::Job,
            name: text(texts.name),
            ncores: spec.and_then(JobSpec::ncores),
            ngpus: spec.and_then(JobSpec::ngpus),
            nnodes: spec.and_then(JobSpec::nnodes),
            nodelist: text(texts.nodelist),
            ntasks: spec.and_then(JobSpec::ntasks),
            priority: s.priority,
            project: text(texts.project),
            queue: text(texts.queue),
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
            username: text(texts.username),
            waitstatus: s.waitstatus,
        }
    }
}
