//! What a record applied to the processor sends on: its effects, turned
//! into output records. The pure step between the processor and wherever
//! records go, shared by the shards of `fluxpipe run` (the sinks) and by
//! `fluxpipe replay --emit` (standard output), so both send the same
//! records in the same order.

use super::{Document, DocumentRecord, EventRecord, JobRecord, OutputRecord, OutputStream};
use crate::decode::{Body, EventStream};
use crate::flux::job::JobState;
use crate::flux::jobid::JobId;
use crate::keyed::JobKey;
use crate::keyed::alerts::engine::AlertEvent;
use crate::keyed::alerts::rule::Rule;
use crate::keyed::processor::{Outcome, Processed};
use crate::keyed::state::{JobEntry, KeyedAnomaly};

/// Where output records go. Asked first whether a stream is taken at all,
/// so a record nobody takes is never built.
pub trait Emit {
    fn wants(&self, stream: OutputStream) -> bool;
    fn emit(&mut self, record: OutputRecord);
}

/// A record as it came, for the `events` stream: built before the record
/// is applied (applying takes it), sent by [`effects`] only if applying it
/// was not a repeat and its time was believed.
pub fn input(
    out: &impl Emit,
    cluster: &str,
    stream: EventStream,
    id: Option<JobId>,
    body: &Body,
    source: &str,
) -> Option<OutputRecord> {
    if !out.wants(OutputStream::Events) {
        return None;
    }
    let document = |stream, document| {
        OutputRecord::document(DocumentRecord {
            cluster: cluster.into(),
            stream,
            id,
            document,
            source: source.into(),
        })
    };
    Some(match body {
        Body::Event(ev) => OutputRecord::event(EventRecord {
            cluster: cluster.into(),
            stream,
            id,
            event: ev.clone(),
            source: source.into(),
        }),
        Body::R(r) => document(stream, Document::R(r.to_value())),
        Body::User(name) => document(EventStream::Job, Document::Username(name.to_string())),
        Body::JobSpec(read) => {
            let text = read.text.as_ref()?;
            let kept = crate::flux::jobspec::kept_part(&text.to_value());
            document(EventStream::Job, Document::JobSpec(kept))
        }
        _ => return None,
    })
}

/// The records of one applied record, in the order they are sent: the
/// record as it came (`input`), a submitted job's first update, each
/// transition with the job's summary after it (to `jobs` once it ended,
/// to `job_updates` before), each rank's change, and the anomalies found.
/// Alerts are sent apart ([`alerts`]), before these: they are fired by
/// the clock too. A record refused, or of a job that finished and was
/// dropped, sends nothing. `job`: the record's job as it stands now.
/// `done` is lent, not given (no copy of it made): its rank changes and
/// anomalies are taken from it.
pub fn effects(
    out: &mut impl Emit,
    job: Option<&JobEntry>,
    stream: EventStream,
    outcome: Outcome,
    done: &mut Processed,
    input: Option<OutputRecord>,
) {
    if outcome == Outcome::Refused || done.of_finished_job {
        return;
    }
    let Processed {
        key,
        refused_time,
        fx,
        ..
    } = done;
    let refused_time = *refused_time;
    // A repeat sends only what it was found to be.
    if let Some(record) = input.filter(|_| !fx.duplicate && !refused_time) {
        out.emit(record);
    }
    let (name, at) = fx
        .event
        .as_ref()
        .map_or(("", None), |(n, ts)| (n.as_str(), Some(*ts)));
    let (transitions, jobs, updates) = (
        out.wants(OutputStream::Transitions),
        out.wants(OutputStream::Jobs),
        out.wants(OutputStream::JobUpdates),
    );
    // A submit of a job that stays NEW until validated makes no
    // transition: the job's first update is sent for it.
    if updates
        && !fx.duplicate
        && fx.transitions.is_empty()
        && stream == EventStream::Job
        && name == "submit"
        && let Some(key) = key
    {
        summary(out, key, job, false);
    }
    for t in &fx.transitions {
        debug_assert!(
            key.as_ref() == Some(&t.key),
            "a record's transitions are its job's"
        );
        if transitions {
            out.emit(OutputRecord::transition(t, name));
        }
        let ended = t.transition.to == JobState::Inactive;
        if (ended && jobs) || (!ended && updates) {
            // A record's transitions are its own job's.
            summary(out, &t.key, job, ended);
        }
    }
    if !fx.rank_changes.is_empty() && out.wants(OutputStream::Resources) {
        for (cluster, change) in std::mem::take(&mut fx.rank_changes) {
            let ev = at.map(|ts| (name, ts));
            out.emit(OutputRecord::rank_change(&cluster, change, ev));
        }
    }
    anomalies(out, std::mem::take(&mut fx.anomalies));
}

/// A job's summary as it stands now: to `jobs` once it `ended`, to
/// `job_updates` before.
fn summary(out: &mut impl Emit, key: &JobKey, job: Option<&JobEntry>, ended: bool) {
    let Some(entry) = job else {
        return;
    };
    let record = JobRecord::new(key, entry);
    out.emit(if ended {
        OutputRecord::job(record)
    } else {
        OutputRecord::job_update(record)
    });
}

/// Anomaly records.
pub fn anomalies(out: &mut impl Emit, anomalies: impl IntoIterator<Item = KeyedAnomaly>) {
    if !out.wants(OutputStream::Anomalies) {
        return;
    }
    for a in anomalies {
        out.emit(OutputRecord::anomaly(a));
    }
}

/// Alert records of fired or resolved `events`; `restored` ones were
/// firing when the state was saved and are announced again (said, since
/// a receiver may have been paged for them already).
pub fn alerts(out: &mut impl Emit, rules: &[Rule], events: &[AlertEvent], restored: bool) {
    if !out.wants(OutputStream::Alerts) {
        return;
    }
    for a in events {
        let Some(rule) = rules.get(a.rule) else {
            continue;
        };
        let mut record = super::alert::alert(rule, a);
        record.restored = restored;
        out.emit(OutputRecord::alert(record));
    }
}
