//! The keys of keyed state: a job (cluster + job id) and the input
//! partition state belongs to. At the bottom of the house: the state, the
//! alert engine and the snapshots all name things by these.

use crate::flux::jobid::JobId;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The input partition a job's (or a cluster's resource) state belongs to,
/// when it comes from a partitioned source (Kafka). State is owned per
/// partition: it goes when the partition is revoked, and comes back with it
/// from the changelog.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Owner {
    pub source: Arc<str>,
    pub partition: i32,
}

/// A job's key.
#[derive(Debug, Clone, Eq, PartialOrd, Ord, Serialize)]
pub struct JobKey {
    /// Shared: every key of a cluster points at one copy of its name
    /// ([`crate::keyed::state::State::intern`]).
    pub cluster: Arc<str>,
    pub id: JobId,
}

impl JobKey {
    /// The key lent, as the job table lends its keys.
    pub fn lend(&self) -> JobKeyRef<'_> {
        JobKeyRef {
            cluster: &self.cluster,
            id: self.id,
        }
    }
}

/// Equal as the derived equality would say; cheaper: the ids first, and
/// interned names by address before their bytes.
impl PartialEq for JobKey {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && (Arc::ptr_eq(&self.cluster, &other.cluster) || self.cluster == other.cluster)
    }
}

/// The id alone: equal keys have equal ids, so they hash alike, and ids
/// are unique within a cluster and nearly so across clusters. The name is
/// not hashed (a job is looked up several times for each of its records).
impl std::hash::Hash for JobKey {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

/// Decoded keys share their cluster's name with the key decoded before
/// them on the same thread when it is the same (a checkpoint holds a
/// million keys of a few clusters): one copy, not one allocation per key
/// freed again when the shard interns it.
impl<'de> Deserialize<'de> for JobKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename = "JobKey")]
        struct Raw<'a> {
            #[serde(borrow)]
            cluster: std::borrow::Cow<'a, str>,
            id: JobId,
        }
        let raw = Raw::deserialize(d)?;
        Ok(JobKey {
            cluster: shared_name(&raw.cluster),
            id: raw.id,
        })
    }
}

/// A job's key lent by the job table, which keeps the cluster's name once
/// per cluster, not in each key: nothing counted to name a job while a
/// million are walked (a checkpoint's threads counting one name's
/// references at once would each wait for the others). Encodes as a
/// [`JobKey`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename = "JobKey")]
pub struct JobKeyRef<'a> {
    pub cluster: &'a Arc<str>,
    pub id: JobId,
}

impl JobKeyRef<'_> {
    /// The key, owned: the name's reference counted once more.
    pub fn to_key(self) -> JobKey {
        JobKey {
            cluster: self.cluster.clone(),
            id: self.id,
        }
    }
}

thread_local! {
    /// The cluster name the last key decoded on this thread had.
    static LAST_NAME: std::cell::RefCell<Option<Arc<str>>> = const { std::cell::RefCell::new(None) };
}

/// `name` as the last decoded key's copy if it is the same, else a new one
/// that later keys can share.
fn shared_name(name: &str) -> Arc<str> {
    LAST_NAME.with_borrow_mut(|last| match last {
        Some(l) if **l == *name => l.clone(),
        _ => {
            let new: Arc<str> = Arc::from(name);
            *last = Some(new.clone());
            new
        }
    })
}
