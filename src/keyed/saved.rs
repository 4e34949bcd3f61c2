//! A processor's state as saved: what a checkpoint or a changelog gives
//! back to take over ([`crate::keyed::processor::Processor::restore`]),
//! and how it is dealt out to the shards by key. Its layout is the
//! checkpoint's (MessagePack through serde), so a field is only ever
//! added last, with a default.

use crate::flux::resource::ResourceState;
use crate::keyed::alerts::EventClock;
use crate::keyed::alerts::engine::{SavedCondition, Subject};
use crate::keyed::state::JobEntry;
use crate::keyed::{JobKey, Owner};
use serde::Deserialize;

/// A processor's state, as restored.
#[derive(Debug, Default, Deserialize)]
pub struct SavedState {
    /// Boxed as decoded: the shard keeps the box, nothing is moved again.
    pub jobs: Vec<(JobKey, Box<JobEntry>)>,
    pub resources: Vec<(String, ResourceState)>,
    pub alerts: Vec<SavedCondition>,
    pub clock: EventClock,
    /// The partitions clusters' resource state belongs to (partitioned
    /// sources only; jobs carry theirs).
    #[serde(default)]
    pub resource_owners: Vec<(String, Owner)>,
    /// Jobs that ended and were dropped, per cluster: id and submit second
    /// ([`crate::keyed::finished`]). Last, with a default: older
    /// checkpoints read as remembering none.
    #[serde(default)]
    pub finished: Vec<(String, Vec<(u64, u32)>)>,
}

impl SavedState {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.resources.is_empty() && self.alerts.is_empty()
    }

    /// The one shard `pick(cluster, job id)` gives for every entry, if it
    /// gives one (an empty state: the first).
    pub fn owner(&self, pick: impl Fn(&str, Option<u64>) -> usize) -> Option<usize> {
        let i = match (self.jobs.first(), self.resources.first()) {
            (Some((k, _)), _) => pick(&k.cluster, Some(k.id.0)),
            (None, Some((c, _))) => pick(c, None),
            (None, None) => 0,
        };
        let all = self
            .jobs
            .iter()
            .all(|(k, _)| pick(&k.cluster, Some(k.id.0)) == i)
            && self.resources.iter().all(|(c, _)| pick(c, None) == i)
            && self.resource_owners.iter().all(|(c, _)| pick(c, None) == i)
            && self
                .finished
                .iter()
                .all(|(c, ids)| ids.iter().all(|(id, _)| pick(c, Some(*id)) == i))
            && self.alerts.iter().all(|a| match &a.subject {
                Subject::Job(k) => pick(&k.cluster, Some(k.id.0)) == i,
                Subject::Node(node) => pick(&node.cluster, None) == i,
            });
        all.then_some(i)
    }

    /// Take `other`'s entries after these (the clock is not merged).
    pub fn append(&mut self, mut other: SavedState) {
        self.jobs.append(&mut other.jobs);
        self.resources.append(&mut other.resources);
        self.alerts.append(&mut other.alerts);
        self.resource_owners.append(&mut other.resource_owners);
        self.finished.append(&mut other.finished);
    }

    /// Deal the entries out to `out` by `pick(cluster, job id)`.
    pub fn split_into(self, out: &mut [SavedState], pick: impl Fn(&str, Option<u64>) -> usize) {
        let n = out.len();
        if n == 0 {
            return;
        }
        let pick = |cluster: &str, id: Option<u64>| pick(cluster, id).min(n - 1);
        for (key, entry) in self.jobs {
            out[pick(&key.cluster, Some(key.id.0))]
                .jobs
                .push((key, entry));
        }
        for (cluster, res) in self.resources {
            out[pick(&cluster, None)].resources.push((cluster, res));
        }
        for (cluster, owner) in self.resource_owners {
            out[pick(&cluster, None)]
                .resource_owners
                .push((cluster, owner));
        }
        for (cluster, ids) in self.finished {
            let mut dealt: Vec<Vec<(u64, u32)>> = vec![Vec::new(); n];
            for (id, t) in ids {
                dealt[pick(&cluster, Some(id))].push((id, t));
            }
            for (to, ids) in out.iter_mut().zip(dealt) {
                if !ids.is_empty() {
                    to.finished.push((cluster.clone(), ids));
                }
            }
        }
        for c in self.alerts {
            let i = match &c.subject {
                Subject::Job(k) => pick(&k.cluster, Some(k.id.0)),
                Subject::Node(node) => pick(&node.cluster, None),
            };
            out[i].alerts.push(c);
        }
        for s in out.iter_mut() {
            for (c, t) in self.clock.clusters() {
                s.clock.advance(c, t);
            }
        }
    }

    /// This part's share for each of `n` shards: the whole part for the
    /// one shard that owns every entry of it (nothing moved entry by
    /// entry), else its entries dealt out; every shard learns its clock.
    pub fn deal(self, n: usize, pick: impl Fn(&str, Option<u64>) -> usize) -> Vec<SavedState> {
        let n = n.max(1);
        let pick = |cluster: &str, id: Option<u64>| pick(cluster, id).min(n - 1);
        let owner = if n == 1 { Some(0) } else { self.owner(pick) };
        let Some(i) = owner else {
            return self.split(n, pick);
        };
        let mut out: Vec<SavedState> = (0..n)
            .map(|_| SavedState {
                clock: self.clock.clone(),
                ..SavedState::default()
            })
            .collect();
        // `pick` gives at most n - 1.
        if let Some(slot) = out.get_mut(i) {
            *slot = self;
        }
        out
    }

    /// The entries dealt out to `n` shards.
    pub fn split(self, n: usize, pick: impl Fn(&str, Option<u64>) -> usize) -> Vec<SavedState> {
        let mut out: Vec<SavedState> = (0..n.max(1)).map(|_| SavedState::default()).collect();
        self.split_into(&mut out, pick);
        out
    }
}
