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
pub(crate) fn ordered(f: f64) -> i64 {
    flip(f.to_bits() as i64)
}

pub(crate) fn unordered(key: i64) -> f64 {
    f64::from_bits(flip(key) as u64)
}

/// The other bits than the sign's, flipped for negative numbers (its own
/// inverse).
fn flip(bits: i64) -> i64 {
    bits ^ ((((bits >> 63) as u64) >> 1) as i64)
}

/// A job's place within its cluster: the listing order without the
/// cluster.
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
            JobState::Inactive => (2, -job.t_inactive().unwrap_or(0.0)),
            // Before the priority is known, as the lowest (flux-core's
            // job-list lists such jobs last among the pending).
            _ => (0, -(job.priority().unwrap_or(-1) as f64)),
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

    /// The place of `(primary, id)` in `group` ([`ClusterJobs::group`]).
    pub fn in_group(self) -> InGroup {
        (self.primary, self.id)
    }

    /// The place in `group` of `(primary, id)` as [`Place::in_group`]
    /// gives them.
    pub fn from_group(group: u8, (primary, id): InGroup) -> Self {
        Place { group, primary, id }
    }
}

/// What the listing keeps of a job: where it is listed, its state, and
/// whether it is pending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    pub place: Place,
    pub state: JobState,
}

impl Standing {
    pub fn of(id: JobId, job: &Job) -> Self {
        Standing {
            place: Place::of(id, job),
            state: job.state,
        }
    }
}

/// A place within its group: `(primary as ordered, id)`.
pub type InGroup = (i64, u64);

/// One cluster's jobs, as the listing keeps them. (A set per group keeps
/// the keys at 16 bytes: this is paid for every job held.)
#[derive(Debug, Default, PartialEq)]
pub struct ClusterJobs {
    /// Each group's jobs in listing order.
    groups: [BTreeSet<InGroup>; Place::GROUPS as usize],
    /// Jobs held per state ([`JobState::index`]).
    pub by_state: [u64; JobState::ALL.len()],
    /// The ids of the pending jobs.
    pending: BTreeSet<u64>,
    /// The newest time of a job event applied.
    pub newest_event: Option<f64>,
}

impl ClusterJobs {
    /// The pending job of the least id: the one submitted first, as flux's
    /// ids (FLUIDs) grow with the time of submission.
    pub fn first_pending(&self) -> Option<u64> {
        self.pending.first().copied()
    }

    /// A group's places (`group` < [`Place::GROUPS`]).
    pub fn group(&self, group: u8) -> &BTreeSet<InGroup> {
        &self.groups[usize::from(group)]
    }

    fn is_empty(&self) -> bool {
        self.groups.iter().all(BTreeSet::is_empty)
    }

    fn add(&mut self, s: &Standing) {
        let p = s.place;
        self.groups[usize::from(p.group)].insert((p.primary, p.id));
        self.by_state[s.state.index()] += 1;
        if s.state.is_pending() {
            self.pending.insert(p.id);
        }
    }

    /// Many jobs not held yet, at once: each tree built whole from its
    /// sorted places and merged in (a bulk build, not an insert each).
    fn add_all(&mut self, jobs: &[Standing]) {
        // Sized first: a million places pushed into vectors that double
        // are a million copied again, and again.
        let mut sizes = [0usize; Place::GROUPS as usize];
        let mut pendings = 0;
        for s in jobs {
            if let Some(n) = sizes.get_mut(usize::from(s.place.group)) {
                *n += 1;
            }
            pendings += usize::from(s.state.is_pending());
        }
        let mut groups = sizes.map(Vec::<InGroup>::with_capacity);
        let mut pending = Vec::with_capacity(pendings);
        for s in jobs {
            let p = s.place;
            if let Some(g) = groups.get_mut(usize::from(p.group)) {
                g.push((p.primary, p.id));
            }
            self.by_state[s.state.index()] += 1;
            if s.state.is_pending() {
                pending.push(p.id);
            }
        }
        for (set, mut places) in self.groups.iter_mut().zip(groups) {
            places.sort_unstable();
            set.append(&mut places.into_iter().collect());
        }
        pending.sort_unstable();
        self.pending.append(&mut pending.into_iter().collect());
    }

    /// Job `id`, listed at one place, went from state `from` to `to`.
    fn restate(&mut self, id: u64, from: JobState, to: JobState) {
        if from == to {
            return;
        }
        let n = &mut self.by_state[from.index()];
        *n = n.saturating_sub(1);
        self.by_state[to.index()] += 1;
        // NEW is listed with the pending jobs but is not one.
        match (from.is_pending(), to.is_pending()) {
            (false, true) => {
                self.pending.insert(id);
            }
            (true, false) => {
                self.pending.remove(&id);
            }
            _ => {}
        }
    }

    fn take(&mut self, s: &Standing) {
        let p = s.place;
        self.groups[usize::from(p.group)].remove(&(p.primary, p.id));
        let n = &mut self.by_state[s.state.index()];
        *n = n.saturating_sub(1);
        if s.state.is_pending() {
            self.pending.remove(&p.id);
        }
    }
}

/// Every cluster's [`ClusterJobs`].
#[derive(Debug, Default)]
pub struct Listing {
    /// By first sight; a cluster whose jobs are all gone keeps its (empty)
    /// entry, so that places in this list never move.
    clusters: Vec<(Arc<str>, ClusterJobs)>,
    index: HashMap<Arc<str>, usize>,
    /// The cluster updated last: records come in runs of one cluster, and
    /// its (interned) name is compared by address, not hashed.
    last: usize,
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
        let at = match self.clusters.get(self.last) {
            Some((c, _)) if Arc::ptr_eq(c, cluster) => self.last,
            _ => match self.index.get(&**cluster) {
                Some(&at) => at,
                None if after.is_none() => return,
                None => {
                    self.index.insert(cluster.clone(), self.clusters.len());
                    self.clusters
                        .push((cluster.clone(), ClusterJobs::default()));
                    self.clusters.len() - 1
                }
            },
        };
        self.last = at;
        let Some((_, jobs)) = self.clusters.get_mut(at) else {
            return;
        };
        match (&before, &after) {
            // Most transitions (to SCHED, to CLEANUP) keep the job's
            // place: only its state's count moves.
            (Some(b), Some(a)) if b.place == a.place => jobs.restate(b.place.id, b.state, a.state),
            _ => {
                if let Some(b) = &before {
                    jobs.take(b);
                }
                if let Some(a) = &after {
                    jobs.add(a);
                }
            }
        }
        if let Some(t) = event.filter(|t| t.is_finite()) {
            jobs.newest_event = Some(jobs.newest_event.map_or(t, |n| n.max(t)));
        }
    }

    /// Jobs of `cluster` not held yet, at once (a restore's), with the
    /// newest event time of any of them.
    pub fn add_all(&mut self, cluster: &Arc<str>, jobs: &[Standing], newest: Option<f64>) {
        if jobs.is_empty() {
            return;
        }
        // Found or made as a job's update would.
        let first = jobs[0];
        self.update(cluster, None, Some(first), newest);
        if let Some((_, held)) = self.clusters.get_mut(self.last) {
            held.add_all(&jobs[1..]);
        }
    }

    /// A cluster's jobs, if it holds any.
    pub fn cluster(&self, cluster: &str) -> Option<(&Arc<str>, &ClusterJobs)> {
        let &at = self.index.get(cluster)?;
        self.clusters
            .get(at)
            .filter(|(_, jobs)| !jobs.is_empty())
            .map(|(c, jobs)| (c, jobs))
    }

    /// Every cluster that holds jobs.
    pub fn clusters(&self) -> impl Iterator<Item = (&Arc<str>, &ClusterJobs)> {
        self.clusters
            .iter()
            .filter(|(_, jobs)| !jobs.is_empty())
            .map(|(c, jobs)| (c, jobs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn standing(group: u8, primary: f64, id: u64) -> Standing {
        let state = [JobState::Sched, JobState::Run, JobState::Inactive][usize::from(group % 3)];
        Standing {
            place: Place::new(group % 3, primary, id),
            state,
        }
    }

    proptest! {
        /// Jobs listed at once (a restore's) are listed as one by one.
        #[test]
        fn listing_at_once_is_listing_one_by_one(
            held in prop::collection::vec((0u8..3, -5.0f64..5.0, 0u64..50), 0..20),
            restored in prop::collection::vec((0u8..3, -5.0f64..5.0, 50u64..200), 0..60),
            newest in prop::option::of(0.0f64..10.0),
        ) {
            let c: Arc<str> = "c".into();
            let (mut one, mut all) = (Listing::default(), Listing::default());
            for &(g, p, id) in &held {
                let s = standing(g, p, id);
                one.update(&c, None, Some(s), None);
                all.update(&c, None, Some(s), None);
            }
            let restored: Vec<Standing> =
                restored.iter().map(|&(g, p, id)| standing(g, p, id)).collect();
            for s in &restored {
                one.update(&c, None, Some(*s), newest);
            }
            // Another copy of the name: the same cluster.
            all.add_all(&"c".into(), &restored, newest);
            prop_assert_eq!(one.cluster("c").map(|(_, j)| j), all.cluster("c").map(|(_, j)| j));
        }

        /// Jobs moved about one record at a time (in place or not, NEW
        /// or pending or not, gone) are listed as the jobs they end as,
        /// listed afresh.
        #[test]
        fn a_listing_kept_by_changes_is_the_listing_of_what_is_left(
            changes in prop::collection::vec(
                (0u64..6, prop::option::of((0usize..JobState::ALL.len(), 0u8..2, 0u8..3))),
                0..80,
            ),
        ) {
            let c: Arc<str> = "c".into();
            let mut kept = Listing::default();
            let mut now: std::collections::BTreeMap<u64, Standing> = Default::default();
            for (id, after) in changes {
                // Few primaries, so a change often keeps the place.
                let after = after.map(|(state, primary, group)| Standing {
                    place: Place::new(group, f64::from(primary), id),
                    state: JobState::ALL[state],
                });
                let before = now.get(&id).copied();
                kept.update(&c, before, after, None);
                match after {
                    Some(a) => now.insert(id, a),
                    None => now.remove(&id),
                };
            }
            let mut fresh = Listing::default();
            for s in now.values() {
                fresh.update(&c, None, Some(*s), None);
            }
            // Compared whole, empty or not: counts left behind by jobs
            // all gone are a difference too.
            fn held<'a>(l: &'a Listing, none: &'a ClusterJobs) -> &'a ClusterJobs {
                l.index.get("c").and_then(|&i| l.clusters.get(i)).map_or(none, |(_, j)| j)
            }
            let none = ClusterJobs::default();
            prop_assert_eq!(held(&kept, &none), held(&fresh, &none));
        }

        /// The integer keeps the order of the floats, and gives them back.
        #[test]
        fn ordered_keeps_order(a in any::<f64>(), b in any::<f64>()) {
            prop_assert_eq!(ordered(a).cmp(&ordered(b)), a.total_cmp(&b));
            prop_assert_eq!(unordered(ordered(a)).to_bits(), a.to_bits());
        }
    }

    #[test]
    fn a_cluster_without_jobs_is_not_listed() {
        let mut l = Listing::default();
        let c: Arc<str> = "c".into();
        let s = Standing {
            place: Place::new(0, -16.0, 1),
            state: JobState::Sched,
        };
        l.update(&c, None, Some(s), Some(5.0));
        let (_, jobs) = l.cluster("c").unwrap();
        assert_eq!(jobs.first_pending(), Some(1));
        assert_eq!(jobs.by_state[JobState::Sched.index()], 1);
        assert_eq!(jobs.newest_event, Some(5.0));
        l.update(&c, Some(s), None, None);
        assert!(l.cluster("c").is_none());
        assert_eq!(l.clusters().count(), 0);
        // Back again (another copy of the name): the same entry.
        l.update(&"c".into(), None, Some(s), None);
        assert_eq!(l.clusters().count(), 1);
        assert_eq!(l.clusters.len(), 1);
    }
}
