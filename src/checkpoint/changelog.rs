//! The changelog: keyed state changes of partitioned sources, as Kafka
//! Streams keeps them, so that the member of a consumer group that is
//! assigned a partition can rebuild that partition's jobs and nodes
//! without the disk of the member that had it before.
//!
//! Records (one changelog partition per input partition, same number):
//! - `job/<cluster>/<id>`: a job's [`Entry::Job`], or a tombstone (no
//!   value) once the job is dropped;
//! - `resource/<cluster>`: a cluster's node state ([`Entry::Resource`]);
//! - `offset/<topic>`: the marker closing one checkpoint round: the input
//!   offset the state written before it is exactly the state after.
//!
//! A round writes its changes, then the marker; restore applies changes
//! only up to the last marker, so a round cut short by a crash is never
//! half applied. Values start with a format byte, then MessagePack. Pure:
//! no I/O (the Kafka side is `sources::kafka::changelog`).

use crate::flux::resource::ResourceState;
use crate::keyed::JobKey;
use crate::keyed::Owner;
use crate::keyed::alerts::EventClock;
use crate::keyed::alerts::engine::SavedCondition;
use crate::keyed::owners::Dirty;
use crate::keyed::processor::Processor;
use crate::keyed::saved::SavedState;
use crate::keyed::state::JobEntry;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use thiserror::Error;

/// The format byte every value starts with. 3: a job's absent exec log
/// and protocol are nil (2, still read: their empty value).
pub const FORMAT: u8 = 3;
const OLDEST_READ: u8 = 2;

/// One change to write: the partition it belongs to, its key, and its new
/// value (`None`: the state is gone).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub owner: Owner,
    pub key: String,
    pub value: Option<Vec<u8>>,
}

/// A changelog value, as read back.
#[derive(Debug, Deserialize)]
pub enum Entry {
    Job {
        key: JobKey,
        entry: Box<JobEntry>,
        alerts: Vec<SavedCondition>,
        /// The cluster's event clock when it was written.
        clock: Option<f64>,
    },
    Resource {
        cluster: String,
        state: Box<ResourceState>,
        alerts: Vec<SavedCondition>,
        clock: Option<f64>,
    },
}

/// A changelog value, borrowed for writing; the same layout as [`Entry`].
#[derive(Serialize)]
pub enum EntryRef<'a> {
    Job {
        key: &'a JobKey,
        entry: &'a JobEntry,
        alerts: Vec<SavedCondition>,
        clock: Option<f64>,
    },
    Resource {
        cluster: &'a str,
        state: &'a ResourceState,
        alerts: Vec<SavedCondition>,
        clock: Option<f64>,
    },
}

#[derive(Debug, Error)]
pub enum ChangelogError {
    #[error("cannot encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error("value format {0} (this fluxpipe reads {OLDEST_READ} to {FORMAT})")]
    Format(u8),
    #[error("empty value")]
    Empty,
    #[error("cannot decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
}

/// The processor's changes since the last call, encoded: each changed
/// job's or cluster's state as it is now, a tombstone for what is gone.
pub fn changes(processor: &mut Processor) -> Vec<Change> {
    let dirty = processor.take_changes();
    let (state, alerts, clock) = (
        processor.state(),
        processor.alerts(),
        processor.event_clock(),
    );
    let mut out = Vec::with_capacity(dirty.len());
    for (dirty, owner) in dirty {
        let (key, value) = match &dirty {
            Dirty::Job(key) => {
                let value = state.jobs.get(key).map(|entry| {
                    EntryRef::Job {
                        key,
                        entry,
                        alerts: alerts.saved_job(key, &entry.alerts),
                        clock: clock.now(&key.cluster),
                    }
                    .encode()
                });
                (job_key(key), value)
            }
            Dirty::Resource(cluster) => {
                let value = state.resources.get(cluster).map(|res| {
                    EntryRef::Resource {
                        cluster,
                        state: res,
                        alerts: alerts.saved_for_nodes(cluster),
                        clock: clock.now(cluster),
                    }
                    .encode()
                });
                (resource_key(cluster), value)
            }
        };
        let value = match value.transpose() {
            Ok(v) => v,
            Err(e) => {
                // Cannot happen for state that was just applied; the key
                // keeps its previous value in the changelog.
                tracing::error!(%key, "cannot encode a changelog value: {e}");
                continue;
            }
        };
        out.push(Change { owner, key, value });
    }
    out
}

pub fn job_key(key: &JobKey) -> String {
    format!("job/{}/{}", key.cluster, key.id.0)
}

pub fn resource_key(cluster: &str) -> String {
    format!("resource/{cluster}")
}

pub fn marker_key(topic: &str) -> String {
    format!("offset/{topic}")
}

fn framed<T: Serialize>(value: &T) -> Result<Vec<u8>, ChangelogError> {
    let mut out = vec![FORMAT];
    rmp_serde::encode::write(&mut out, value)?;
    Ok(out)
}

fn unframed<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, ChangelogError> {
    match bytes.split_first() {
        None => Err(ChangelogError::Empty),
        Some((&format, rest)) if (OLDEST_READ..=FORMAT).contains(&format) => {
            Ok(rmp_serde::from_slice(rest)?)
        }
        Some((&other, _)) => Err(ChangelogError::Format(other)),
    }
}

impl EntryRef<'_> {
    pub fn encode(&self) -> Result<Vec<u8>, ChangelogError> {
        framed(self)
    }
}

impl Entry {
    pub fn decode(bytes: &[u8]) -> Result<Self, ChangelogError> {
        unframed(bytes)
    }
}

pub fn encode_marker(offset: i64) -> Result<Vec<u8>, ChangelogError> {
    framed(&offset)
}

pub fn decode_marker(bytes: &[u8]) -> Result<i64, ChangelogError> {
    unframed(bytes)
}

/// Rebuilds one partition's state from its changelog, read in order.
#[derive(Debug)]
pub struct Restorer {
    marker_key: Vec<u8>,
    /// Last value per key up to the last marker.
    applied: HashMap<Vec<u8>, Vec<u8>>,
    /// Read after the last marker: applied when the next marker comes.
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    marker: Option<i64>,
    /// Records that could not be read.
    pub skipped: u64,
}

/// What a partition's changelog holds.
#[derive(Debug, Default)]
pub struct Restored {
    pub state: SavedState,
    /// The input offset the state is exactly the state after.
    pub offset: Option<i64>,
    /// Records that could not be read (counted, logged by the caller).
    pub skipped: u64,
    /// Records after the last marker: a round cut short.
    pub unfinished: usize,
}

impl Restorer {
    /// For the changelog of input topic `topic`.
    pub fn new(topic: &str) -> Self {
        Restorer {
            marker_key: marker_key(topic).into_bytes(),
            applied: HashMap::new(),
            pending: Vec::new(),
            marker: None,
            skipped: 0,
        }
    }

    /// The next record of the partition.
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        if key == self.marker_key.as_slice() {
            match value.map(decode_marker) {
                Some(Ok(offset)) => {
                    for (k, v) in self.pending.drain(..) {
                        match v {
                            Some(v) => self.applied.insert(k, v),
                            None => self.applied.remove(&k),
                        };
                    }
                    self.marker = Some(offset);
                }
                _ => self.skipped += 1,
            }
        } else if key.starts_with(b"job/") || key.starts_with(b"resource/") {
            self.pending.push((key.to_vec(), value.map(<[u8]>::to_vec)));
        } else if !key.starts_with(b"offset/") {
            self.skipped += 1;
        }
    }

    /// The state up to the last marker, owned by `owner`.
    pub fn finish(self, owner: &Owner) -> Restored {
        let mut out = Restored {
            skipped: self.skipped,
            offset: self.marker,
            unfinished: self.pending.len(),
            state: SavedState::default(),
        };
        let mut clock = EventClock::default();
        for value in self.applied.values() {
            match Entry::decode(value) {
                Ok(Entry::Job {
                    key,
                    mut entry,
                    alerts,
                    clock: t,
                }) => {
                    if let Some(t) = t {
                        clock.advance(&key.cluster, t);
                    }
                    entry.owner = Some(Box::new(owner.clone()));
                    out.state.jobs.push((key, entry));
                    out.state.alerts.extend(alerts);
                }
                Ok(Entry::Resource {
                    cluster,
                    state,
                    alerts,
                    clock: t,
                }) => {
                    if let Some(t) = t {
                        clock.advance(&cluster, t);
                    }
                    out.state
                        .resource_owners
                        .push((cluster.clone(), owner.clone()));
                    out.state.resources.push((cluster, *state));
                    out.state.alerts.extend(alerts);
                }
                Err(_) => out.skipped += 1,
            }
        }
        out.state.clock = clock;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::jobid::JobId;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn owner() -> Owner {
        Owner {
            source: Arc::from("k"),
            partition: 3,
        }
    }

    fn job(id: u64) -> (JobKey, JobEntry) {
        (
            JobKey {
                cluster: "c".into(),
                id: JobId(id),
            },
            JobEntry::default(),
        )
    }

    fn job_value(id: u64, clock: f64) -> (Vec<u8>, Vec<u8>) {
        let (key, entry) = job(id);
        let value = EntryRef::Job {
            key: &key,
            entry: &entry,
            alerts: vec![],
            clock: Some(clock),
        }
        .encode()
        .unwrap();
        (job_key(&key).into_bytes(), value)
    }

    fn ids(r: &Restored) -> Vec<u64> {
        let mut v: Vec<u64> = r.state.jobs.iter().map(|(k, _)| k.id.0).collect();
        v.sort();
        v
    }

    #[test]
    fn last_value_wins_tombstones_delete_and_a_round_without_marker_is_ignored() {
        let mut r = Restorer::new("t");
        let (k1, v1) = job_value(1, 10.0);
        let (k2, v2) = job_value(2, 11.0);
        let (k3, v3) = job_value(3, 12.0);
        r.push(&k1, Some(&v1));
        r.push(&k2, Some(&v2));
        r.push(b"offset/t", Some(&encode_marker(100).unwrap()));
        r.push(&k1, None);
        r.push(&k2, Some(&v2));
        r.push(b"offset/t", Some(&encode_marker(200).unwrap()));
        // cut short: no marker after it
        r.push(&k3, Some(&v3));
        r.push(&k2, None);
        let out = r.finish(&owner());
        assert_eq!(out.offset, Some(200));
        assert_eq!(ids(&out), vec![2]);
        assert_eq!(out.unfinished, 2);
        assert_eq!(out.state.jobs[0].1.owner.as_deref(), Some(&owner()));
        assert_eq!(out.state.clock.now("c"), Some(11.0));
    }

    #[test]
    fn other_topics_markers_and_garbage_are_skipped() {
        let mut r = Restorer::new("t");
        let (k1, v1) = job_value(1, 1.0);
        r.push(&k1, Some(&v1));
        r.push(b"offset/other", Some(&encode_marker(5).unwrap()));
        r.push(b"what", Some(b"x"));
        r.push(b"job/c/9", Some(b"\x01\xff"));
        r.push(b"offset/t", Some(b"garbage"));
        assert_eq!(r.skipped, 2);
        r.push(b"offset/t", Some(&encode_marker(7).unwrap()));
        let out = r.finish(&owner());
        assert_eq!(out.offset, Some(7));
        assert_eq!(ids(&out), vec![1]);
        assert_eq!(out.skipped, 3);
    }

    /// A job value as fluxpipe wrote it in format 2 (job 42 of cluster
    /// `c`, submitted at 100.5, no exec log: its empty value saved).
    const FORMAT_2_JOB: &str = "0281a34a6f629492a1632a96dc001ca34e4557c3c20510c000cb4059200000000000c0c0c0c0c0c0c0c0c290c00000c0c0c2c2c2c291cb40592000000000009d00c2c200c2c0c0c0c200c0c0909800c2c0c2c2919000c2c2c2c090cb4059200000000000";

    #[test]
    fn format_2_values_are_still_read_and_unknown_formats_refused() {
        let old = const_hex::decode(FORMAT_2_JOB).unwrap();
        let Entry::Job {
            key, entry, clock, ..
        } = Entry::decode(&old).unwrap()
        else {
            panic!("a job value");
        };
        assert_eq!((&*key.cluster, key.id.0), ("c", 42));
        assert_eq!(entry.job.userid(), Some(5));
        assert!(entry.exec_log().is_none() && entry.protocol().is_none());
        assert_eq!(clock, Some(100.5));
        // Written again, it is the newer format and shorter.
        let again = EntryRef::Job {
            key: &key,
            entry: &entry,
            alerts: vec![],
            clock,
        }
        .encode()
        .unwrap();
        assert_eq!(again[0], FORMAT);
        assert!(
            again.len() < old.len() - 15,
            "{} vs {}",
            again.len(),
            old.len()
        );
        let mut newer = again.clone();
        newer[0] = FORMAT + 1;
        assert!(matches!(
            Entry::decode(&newer),
            Err(ChangelogError::Format(f)) if f == FORMAT + 1
        ));
    }

    #[test]
    fn an_empty_changelog_restores_nothing() {
        let out = Restorer::new("t").finish(&owner());
        assert_eq!(out.offset, None);
        assert!(out.state.is_empty());
    }

    proptest! {
        #[test]
        fn any_records_never_panic(recs in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..20), proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))), 0..50)) {
            let mut r = Restorer::new("t");
            for (k, v) in &recs {
                r.push(k, v.as_deref());
            }
            let _ = r.finish(&owner());
        }

        #[test]
        fn markers_round_trip(o in any::<i64>()) {
            prop_assert_eq!(decode_marker(&encode_marker(o).unwrap()).unwrap(), o);
        }

        #[test]
        fn job_values_round_trip(id in any::<u64>(), t in -1e12f64..1e12) {
            let (_, v) = job_value(id, t);
            match Entry::decode(&v).unwrap() {
                Entry::Job { key, clock, .. } => {
                    prop_assert_eq!(key.id.0, id);
                    prop_assert_eq!(clock, Some(t));
                }
                Entry::Resource { .. } => prop_assert!(false),
            }
        }
    }
}
