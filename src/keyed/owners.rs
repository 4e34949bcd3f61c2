//! Which input partition each piece of partitioned state belongs to, and
//! which of it changed since the last barrier: the keys the changelog of a
//! partitioned source is written for (as a Kafka Streams store logs its
//! changes). A job carries its owner in its entry; a cluster's resource
//! state has its owner here.

use super::state::{JobEntry, State};
use super::{JobKey, Owner};
use foldhash::{HashMap, HashSet};
use std::collections::BTreeSet;
use std::sync::Arc;

/// A changelog key: a job, or a cluster's resource state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dirty {
    Job(JobKey),
    Resource(String),
}

#[derive(Debug, Default)]
pub struct Owners {
    /// The partitions clusters' resource state belongs to.
    resources: HashMap<String, Owner>,
    /// Sources that keep a changelog: changes to state they own are noted.
    logged: HashSet<Arc<str>>,
    /// State changed since the last barrier, with the partition it belongs
    /// to (so a dropped job's tombstone finds its partition).
    dirty: HashMap<Dirty, Owner>,
}

impl Owners {
    /// Note changes for the changelogs of these sources.
    pub fn log(&mut self, sources: impl IntoIterator<Item = Arc<str>>) {
        self.logged = sources.into_iter().collect();
    }

    /// The partitions clusters' resource state belongs to.
    pub fn resources(&self) -> &HashMap<String, Owner> {
        &self.resources
    }

    /// A job's state changed; `owner`: where its record came from (a job
    /// keeps the partition that first sent it).
    pub fn job_changed(&mut self, state: &mut State, key: &JobKey, owner: Option<&Owner>) {
        // Nothing to record, nor a changelog to write it to (most records).
        if owner.is_none() && self.logged.is_empty() {
            return;
        }
        let Some(entry) = state.jobs.get_mut(key) else {
            return;
        };
        if entry.owner.is_none() {
            entry.owner = owner.cloned().map(Box::new);
        }
        self.job_dropped(key, entry);
    }

    /// A job is gone (or changed): its changelog gets its new value, or a
    /// tombstone.
    pub fn job_dropped(&mut self, key: &JobKey, entry: &JobEntry) {
        if let Some(o) = &entry.owner
            && self.logged.contains(&o.source)
        {
            self.dirty.insert(Dirty::Job(key.clone()), (**o).clone());
        }
    }

    /// The same for a cluster's resource state.
    pub fn resource_changed(&mut self, state: &State, cluster: &str, owner: Option<&Owner>) {
        if (owner.is_none() && self.logged.is_empty()) || !state.resources.contains_key(cluster) {
            return;
        }
        if let Some(o) = owner {
            self.resources
                .entry(cluster.to_string())
                .or_insert_with(|| o.clone());
        }
        if let Some(o) = self.resources.get(cluster)
            && self.logged.contains(&o.source)
        {
            self.dirty
                .insert(Dirty::Resource(cluster.to_string()), o.clone());
        }
    }

    /// What changed since the last call.
    pub fn take_dirty(&mut self) -> HashMap<Dirty, Owner> {
        std::mem::take(&mut self.dirty)
    }

    /// Take over the owners of restored resource state.
    pub fn restore(&mut self, resources: Vec<(String, Owner)>) {
        self.resources.extend(resources);
    }

    /// The clusters whose resource state these partitions of `source`
    /// own, forgotten here (nothing of them is logged any more).
    pub fn release_resources(&mut self, source: &str, partitions: &BTreeSet<i32>) -> Vec<String> {
        let owned: Vec<String> = self
            .resources
            .iter()
            .filter(|(_, o)| owned_by(o, source, partitions))
            .map(|(c, _)| c.clone())
            .collect();
        for cluster in &owned {
            self.resources.remove(cluster);
            self.dirty.remove(&Dirty::Resource(cluster.clone()));
        }
        owned
    }

    /// A job released with its partition: nothing of it is logged.
    pub fn release_job(&mut self, key: &JobKey) {
        self.dirty.remove(&Dirty::Job(key.clone()));
    }
}

/// Whether `owner` is one of these partitions of `source`.
pub fn owned_by(owner: &Owner, source: &str, partitions: &BTreeSet<i32>) -> bool {
    &*owner.source == source && partitions.contains(&owner.partition)
}
