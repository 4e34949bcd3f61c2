//! Every job's place in the `flux jobs` order, and each cluster's counts,
//! kept as records apply: a question about the jobs held reads a range (a
//! page) or a few numbers, never every job (the query API answers between
//! records, so its work must not grow with the jobs held).
//!
//! The order: pending first (highest priority first), then running (newest
//! start first), then inactive (newest end first); ties by cluster, then id.

use crate::flux::job::{Job, JobState};
use crate::flux::jobid::JobId;
use foldhash::HashMap;
use std::collections::BTreeSet;
use std::sync::Arc;

/// `f64` as an integer of the same order as [`f64::total_cmp`].
fn ordered(f: f64) -> i64 {
    flip(f.to_bits() as i64)
}

fn unordered(key: i64) -> f64 {
    f64::from_bits(flip(key) as u64)
}

/// The other bits than the sign's, flipped for negative numbers (its own
/// inverse).
fn flip(bits: i64) -> i64 {
    bits ^ ((((bits >> 63) as u64) >> 1) as i64)
}

/// A job's place within its cluster: the listing order without the
/// cluster (which the cluster's own set leaves out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    /// 0 pending (and NEW), 1 running, 2 inactive.
    pub group: u8,
    /// Ascending within the group: minus the priority, start or end time
    /// (as [`ordered`]).
    primary: i64,
    pub id: u64,
}

impl Place {
    pub const GROUPS: u8 = 3;

    pub fn of(id: JobId, job: &Job) -> Self {
        let (group, primary) = match job.state {
            JobState::Run | JobState::Cleanup => (1, -job.t_run.get().unwrap_or(0.0)),
            JobState::Inactive => (2, -job.t_inactive.get().unwrap_or(0.0)),
            // Before the priority is known, as the lowest (flux-core's
            // job-list lists such jobs last among the pending).
            _ => (0, -(job.priority.unwrap_or(-1) as f64)),
        };
        Place::new(group, primary, id.0)
    }

    pub fn new(group: u8, primary: f64, id: u64) -> Self {
        Place {
            group,
            primary: ordered(primary),
            id,
        }
    }

    pub fn primary(&self) -> f64 {
        unordered(self.primary)
    }

    /// The first place of `group`.
    pub fn first_of(group: u8) -> Self {
        Place {
            group,
            primary: i64::MIN,
            id: 0,
        }
    }

    /// The last place of `group` whose primary is at most `primary`.
    pub fn last_at(group: u8, primary: f64) -> Self {
        Place {
            group,
            primary: ordered(primary),
            id: u64::MAX,
        }
    }
}

/// What the listing keeps of a job: where it is listed, its state, and
/// (while pending) when it was submitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    pub place: Place,
    pub state: JobState,
    /// `(submit time as ordered, id)` of a pending job.
    pending: Option<(i64, u64)>,
}

impl Standing {
    pub fn of(id: JobId, job: &Job) -> Self {
        Standing {
            place: Place::of(id, job),
            state: job.state,
            pending: job
                .state
                .is_pending()
                .then(|| job.t_submit.get().map(|t| (ordered(t), id.0)))
                .flatten(),
        }
    }
}

/// One cluster's jobs, as the listing keeps them.
#[derive(Debug, Default)]
pub struct ClusterJobs {
    /// Every job held, in listing order.
    pub places: BTreeSet<Place>,
    /// Jobs held per state ([`JobState::index`]).
    pub by_state: [u64; JobState::ALL.len()],
    /// Pending jobs by submit time.
    pending: BTreeSet<(i64, u64)>,
    /// The newest time of a job event applied.
    pub newest_event: Option<f64>,
}

impl ClusterJobs {
    /// The pending job submitted longest ago: id and submit time.
    pub fn oldest_pending(&self) -> Option<(u64, f64)> {
        self.pending.first().map(|&(t, id)| (id, unordered(t)))
    }

    fn add(&mut self, s: &Standing) {
        self.places.insert(s.place);
        self.by_state[s.state.index()] += 1;
        if let Some(p) = s.pending {
            self.pending.insert(p);
        }
    }

    fn take(&mut self, s: &Standing) {
        self.places.remove(&s.place);
        let n = &mut self.by_state[s.state.index()];
        *n = n.saturating_sub(1);
        if let Some(p) = s.pending {
            self.pending.remove(&p);
        }
    }
}

/// Every cluster's [`ClusterJobs`].
#[derive(Debug, Default)]
pub struct Listing {
    clusters: HashMap<Arc<str>, ClusterJobs>,
}

impl Listing {
    /// A job of `cluster` went from `before` to `after` (`None`: not held);
    /// `event` is the time of the job event just applied, if any.
    pub fn update(
        &mut self,
        cluster: &Arc<str>,
        before: Option<Standing>,
        after: Option<Standing>,
        event: Option<f64>,
    ) {
        if before == after && event.is_none() {
            return;
        }
        let jobs = match self.clusters.get_mut(&**cluster) {
            Some(jobs) => jobs,
            None if after.is_none() => return,
            None => self.clusters.entry(cluster.clone()).or_default(),
        };
        if before != after {
            if let Some(b) = &before {
                jobs.take(b);
            }
            if let Some(a) = &after {
                jobs.add(a);
            }
        }
        if let Some(t) = event.filter(|t| t.is_finite()) {
            jobs.newest_event = Some(jobs.newest_event.map_or(t, |n| n.max(t)));
        }
        if jobs.places.is_empty() {
            self.clusters.remove(&**cluster);
        }
    }

    pub fn cluster(&self, cluster: &str) -> Option<(&Arc<str>, &ClusterJobs)> {
        self.clusters.get_key_value(cluster)
    }

    pub fn clusters(&self) -> impl Iterator<Item = (&Arc<str>, &ClusterJobs)> {
        self.clusters.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The integer keeps the order of the floats, and gives them back.
        #[test]
        fn ordered_keeps_order(a in any::<f64>(), b in any::<f64>()) {
            prop_assert_eq!(ordered(a).cmp(&ordered(b)), a.total_cmp(&b));
            prop_assert_eq!(unordered(ordered(a)).to_bits(), a.to_bits());
        }
    }

    #[test]
    fn a_cluster_without_jobs_is_forgotten() {
        let mut l = Listing::default();
        let c: Arc<str> = "c".into();
        let s = Standing {
            place: Place::new(0, -16.0, 1),
            state: JobState::Sched,
            pending: Some((ordered(5.0), 1)),
        };
        l.update(&c, None, Some(s), Some(5.0));
        let (_, jobs) = l.cluster("c").unwrap();
        assert_eq!(jobs.oldest_pending(), Some((1, 5.0)));
        assert_eq!(jobs.by_state[JobState::Sched.index()], 1);
        assert_eq!(jobs.newest_event, Some(5.0));
        l.update(&c, Some(s), None, None);
        assert!(l.cluster("c").is_none());
    }
}
