//! Jobs that ended and were dropped from the state, remembered by id so a
//! backlog sent again (a journal consumer started without `since`) is
//! recognised instead of making every job anew.
//!
//! Compact: per cluster an ordered map of job id to its submit second
//! (about 20 bytes a job), bounded by a cap. Flux job ids (FLUIDs) begin
//! with their submit time, so the smallest id of a cluster is its oldest
//! job: past the cap, the oldest are forgotten first, and those are the
//! least likely to come back (flux-core purges the oldest inactive jobs
//! first too).
//!
//! The submit second tells an id reused by a new job (an instance started
//! over with an empty KVS numbers its jobs from the start again) from a
//! repeat: a `submit` at another time is a new job, and the id is
//! forgotten.

use foldhash::HashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Finished jobs per cluster: id → submit time in whole seconds (0 when
/// unknown).
#[derive(Debug, Default)]
pub struct FinishedJobs {
    clusters: HashMap<Arc<str>, BTreeMap<u64, u32>>,
    len: usize,
    cap: usize,
    /// Forgotten to stay under the cap.
    forgotten: u64,
}

/// A submit time as kept: whole seconds, 0 for none or out of range.
fn second(t: Option<f64>) -> u32 {
    match t {
        Some(t) if t >= 1.0 && t < f64::from(u32::MAX) => t as u32,
        _ => 0,
    }
}

impl FinishedJobs {
    /// Remember at most `cap` jobs (0: none).
    pub fn with_cap(cap: usize) -> Self {
        FinishedJobs {
            cap,
            ..FinishedJobs::default()
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Jobs forgotten to stay under the cap, so far.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// Remember that job `id` of `cluster`, submitted at `submitted`,
    /// ended and was dropped.
    pub fn remember(&mut self, cluster: &Arc<str>, id: u64, submitted: Option<f64>) {
        if self.cap == 0 {
            return;
        }
        let ids = match self.clusters.get_mut(&**cluster) {
            Some(ids) => ids,
            None => self.clusters.entry(cluster.clone()).or_default(),
        };
        if ids.insert(id, second(submitted)).is_none() {
            self.len += 1;
        }
        while self.len > self.cap && self.forget_oldest() {}
    }

    /// The oldest job of the cluster that has the most is forgotten
    /// (clusters are few: a look at each is cheap).
    fn forget_oldest(&mut self) -> bool {
        let Some(ids) = self.clusters.values_mut().max_by_key(|ids| ids.len()) else {
            return false;
        };
        if ids.pop_first().is_none() {
            return false;
        }
        self.len -= 1;
        self.forgotten += 1;
        self.clusters.retain(|_, ids| !ids.is_empty());
        true
    }

    /// Whether a record of job `id` of `cluster` (not held) belongs to a
    /// job that already ended here. `submit` is the record's time when it
    /// is the job's `submit` event: at another second, the id was given to
    /// a new job, and is forgotten.
    pub fn is_repeat(&mut self, cluster: &str, id: u64, submit: Option<f64>) -> bool {
        let Some(ids) = self.clusters.get_mut(cluster) else {
            return false;
        };
        let Some(&kept) = ids.get(&id) else {
            return false;
        };
        let now = second(submit);
        if submit.is_some() && kept != 0 && now.abs_diff(kept) > 1 {
            ids.remove(&id);
            self.len -= 1;
            return false;
        }
        true
    }

    /// Every remembered job, per cluster, for a checkpoint.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &BTreeMap<u64, u32>)> + Clone {
        self.clusters.iter()
    }

    /// Take over jobs remembered by a checkpoint.
    pub fn restore(&mut self, cluster: &Arc<str>, ids: impl IntoIterator<Item = (u64, u32)>) {
        if self.cap == 0 {
            return;
        }
        let map = match self.clusters.get_mut(&**cluster) {
            Some(map) => map,
            None => self.clusters.entry(cluster.clone()).or_default(),
        };
        for (id, t) in ids {
            if map.insert(id, t).is_none() {
                self.len += 1;
            }
        }
        while self.len > self.cap && self.forget_oldest() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn a_finished_job_is_recognised_in_its_own_cluster_only() {
        let mut f = FinishedJobs::with_cap(10);
        f.remember(&c("a"), 42, Some(1_700_000_000.5));
        assert!(f.is_repeat("a", 42, None));
        assert!(f.is_repeat("a", 42, Some(1_700_000_000.9)));
        assert!(!f.is_repeat("b", 42, None));
        assert!(!f.is_repeat("a", 43, None));
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn a_submit_at_another_time_is_a_new_job_with_a_reused_id() {
        let mut f = FinishedJobs::with_cap(10);
        f.remember(&c("a"), 42, Some(1_700_000_000.0));
        assert!(!f.is_repeat("a", 42, Some(1_800_000_000.0)));
        // forgotten: the new job's records are its own
        assert!(!f.is_repeat("a", 42, None));
        assert!(f.is_empty());
        // no submit time kept: any submit is taken as the repeat
        f.remember(&c("a"), 7, None);
        assert!(f.is_repeat("a", 7, Some(1_800_000_000.0)));
    }

    #[test]
    fn past_the_cap_the_oldest_of_the_largest_cluster_go_first() {
        let mut f = FinishedJobs::with_cap(3);
        f.remember(&c("a"), 5, None);
        f.remember(&c("a"), 3, None);
        f.remember(&c("b"), 1, None);
        f.remember(&c("a"), 9, None);
        assert_eq!(f.len(), 3);
        assert_eq!(f.forgotten(), 1);
        assert!(!f.is_repeat("a", 3, None));
        assert!(f.is_repeat("a", 5, None) && f.is_repeat("a", 9, None));
        assert!(f.is_repeat("b", 1, None));
    }

    #[test]
    fn a_cap_of_nothing_remembers_nothing() {
        let mut f = FinishedJobs::with_cap(0);
        f.remember(&c("a"), 1, None);
        f.restore(&c("a"), [(2, 0)]);
        assert!(f.is_empty() && !f.is_repeat("a", 1, None));
    }

    proptest! {
        /// Never more than the cap, and the count matches what is kept.
        #[test]
        fn bounded(ids in proptest::collection::vec(any::<u64>(), 0..200), cap in 0usize..50) {
            let mut f = FinishedJobs::with_cap(cap);
            for &id in &ids {
                f.remember(&c("x"), id, None);
            }
            prop_assert!(f.len() <= cap);
            prop_assert_eq!(f.len(), f.iter().map(|(_, m)| m.len()).sum::<usize>());
        }

        /// Ids ending in submit order: the newest `cap` are the ones kept.
        #[test]
        fn keeps_the_newest(mut ids in proptest::collection::vec(any::<u64>(), 0..200), cap in 1usize..50) {
            ids.sort_unstable();
            ids.dedup();
            let mut f = FinishedJobs::with_cap(cap);
            for &id in &ids {
                f.remember(&c("x"), id, None);
            }
            let split = ids.len().saturating_sub(cap);
            for &id in &ids[split..] {
                prop_assert!(f.is_repeat("x", id, None));
            }
            for &id in &ids[..split] {
                prop_assert!(!f.is_repeat("x", id, None));
            }
        }
    }
}
