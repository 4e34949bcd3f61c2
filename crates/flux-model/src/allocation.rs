//! Which ranks jobs hold, per cluster: the scheduler's allocated set as the
//! job eventlogs tell it (a job holds the ranks of its R from `alloc` until
//! `free`). `flux resource status` shows a drained rank that a job still
//! holds as *draining*, and as *drained* once no job does.
//!
//! Not seen here: ranks that flux-core's housekeeping keeps after a job's
//! `free` (housekeeping is not in the job eventlog), so with housekeeping
//! configured a rank reads drained while flux still says draining.

use super::idset::IdSet;
use foldhash::HashMap;

/// Jobs holding each rank, per cluster, and the ranks whose held-ness
/// changed since the owner of the cluster's resource state last looked.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Allocations {
    clusters: HashMap<String, ClusterHolds>,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct ClusterHolds {
    /// How many jobs hold each rank (no entry: none).
    jobs: HashMap<u32, u32>,
    /// Ranks that became held or free since [`Allocations::take_flipped`].
    /// At most every rank once: bounded by the instance's size.
    flipped: IdSet,
    /// When each rank was given back last, in event time: a drain stamped
    /// before it, of a rank still drained, made the rank draining until
    /// then, whatever order the shards applied the drain and the job's
    /// events in. Kept: bounded by the instance's size.
    freed: HashMap<u32, f64>,
    /// Flipped ranks that no job took or gave back: marked to be looked at
    /// again (a restored state), so not a hold that came and went.
    rechecked: IdSet,
}

impl ClusterHolds {
    /// `rank` was given back at `at`: the latest is kept (shards apply
    /// other partitions' frees in any order).
    fn freed_at(&mut self, rank: u32, at: f64) {
        let t = self.freed.entry(rank).or_insert(at);
        *t = t.max(at);
    }

    fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.flipped.is_empty() && self.freed.is_empty()
    }
}

impl Allocations {
    pub fn new() -> Self {
        Allocations::default()
    }

    /// A job of `cluster` took `ranks` (an idset's ranges).
    pub fn hold(&mut self, cluster: &str, ranks: &[(u32, u32)]) {
        if ranks.is_empty() {
            return;
        }
        let c = match self.clusters.get_mut(cluster) {
            Some(c) => c,
            None => self.clusters.entry(cluster.to_string()).or_default(),
        };
        for r in ranks.iter().flat_map(|&(lo, hi)| lo..=hi) {
            let n = c.jobs.entry(r).or_insert(0);
            if *n == 0 {
                c.flipped.insert(r);
                c.rechecked.remove(r);
            }
            *n = n.saturating_add(1);
        }
    }

    /// A job of `cluster` gave `ranks` back, by an event of time `at` if
    /// one. Ranks no job holds are left alone (a release is never counted
    /// twice into the negative).
    pub fn release(&mut self, cluster: &str, ranks: &[(u32, u32)], at: Option<f64>) {
        let Some(c) = self.clusters.get_mut(cluster) else {
            return;
        };
        for r in ranks.iter().flat_map(|&(lo, hi)| lo..=hi) {
            if let Some(n) = c.jobs.get_mut(&r) {
                *n -= 1;
                if *n == 0 {
                    c.jobs.remove(&r);
                    c.flipped.insert(r);
                    c.rechecked.remove(r);
                    if let Some(at) = at {
                        c.freed_at(r, at);
                    }
                }
            }
        }
        if c.is_empty() {
            self.clusters.remove(cluster);
        }
    }

    /// Whether any job of `cluster` holds `rank`.
    pub fn is_held(&self, cluster: &str, rank: u32) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|c| c.jobs.contains_key(&rank))
    }

    /// The ranks of `cluster` some job holds.
    pub fn held(&self, cluster: &str) -> IdSet {
        self.clusters
            .get(cluster)
            .map(|c| c.jobs.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The ranks of `cluster` that became held or free since they were
    /// last cleared, for whoever keeps its resource state to look at again.
    pub fn flipped(&self, cluster: &str) -> impl Iterator<Item = u32> + '_ {
        self.clusters
            .get(cluster)
            .into_iter()
            .flat_map(|c| c.flipped.iter())
    }

    /// Whether the last hold of `rank` (given back since) ended after
    /// event time `t`: a rank drained at `t` and still drained was
    /// draining until then.
    pub fn held_after(&self, cluster: &str, rank: u32, t: f64) -> bool {
        self.clusters
            .get(cluster)
            .and_then(|c| c.freed.get(&rank))
            .is_some_and(|&freed| t < freed)
    }

    /// Have `ranks` looked at again as though they flipped (a restored
    /// resource state, whose saved draining may be older than the holds).
    pub fn mark_flipped(&mut self, cluster: &str, ranks: impl IntoIterator<Item = u32>) {
        let mut ranks = ranks.into_iter().peekable();
        if ranks.peek().is_none() {
            return;
        }
        let c = match self.clusters.get_mut(cluster) {
            Some(c) => c,
            None => self.clusters.entry(cluster.to_string()).or_default(),
        };
        for r in ranks {
            if !c.flipped.contains(r) {
                c.flipped.insert(r);
                c.rechecked.insert(r);
            }
        }
    }

    /// Whether `rank` is flipped only because it was marked again.
    pub fn is_rechecked(&self, cluster: &str, rank: u32) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|c| c.rechecked.contains(rank))
    }

    /// A job (restored, no longer holding them) gave `ranks` back at `at`.
    pub fn note_freed(&mut self, cluster: &str, ranks: &[(u32, u32)], at: f64) {
        if ranks.is_empty() {
            return;
        }
        let c = match self.clusters.get_mut(cluster) {
            Some(c) => c,
            None => self.clusters.entry(cluster.to_string()).or_default(),
        };
        for r in ranks.iter().flat_map(|&(lo, hi)| lo..=hi) {
            c.freed_at(r, at);
        }
    }

    /// Those ranks were looked at.
    pub fn clear_flipped(&mut self, cluster: &str) {
        let Some(c) = self.clusters.get_mut(cluster) else {
            return;
        };
        // Cleared in place: its room serves the next flips.
        c.flipped.clear();
        c.rechecked.clear();
        if c.is_empty() {
            self.clusters.remove(cluster);
        }
    }

    /// [`Allocations::flipped`], then cleared.
    #[cfg(test)]
    pub fn take_flipped(&mut self, cluster: &str) -> IdSet {
        let flipped = self.flipped(cluster).collect();
        self.clear_flipped(cluster);
        flipped
    }

    /// Whether ranks of `cluster` flipped and were not yet looked at.
    pub fn is_flipped(&self, cluster: &str) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|c| !c.flipped.is_empty())
    }

    /// Clusters with ranks flipped and not yet looked at.
    pub fn clusters_flipped(&self) -> Vec<String> {
        self.clusters
            .iter()
            .filter(|(_, c)| !c.flipped.is_empty())
            .map(|(name, _)| name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(s: &str) -> IdSet {
        IdSet::parse(s).unwrap()
    }

    #[test]
    fn a_rank_is_held_while_any_job_holds_it() {
        let mut a = Allocations::new();
        a.hold("c", set("0-1").ranges());
        a.hold("c", set("1-2").ranges());
        assert_eq!(a.held("c"), set("0-2"));
        assert_eq!(a.take_flipped("c"), set("0-2"));
        a.release("c", set("0-1").ranges(), None);
        assert_eq!(a.held("c"), set("1-2"));
        assert_eq!(a.take_flipped("c"), set("0"));
        assert!(a.is_held("c", 1) && !a.is_held("c", 0) && !a.is_held("d", 1));
        a.release("c", set("1-2").ranges(), None);
        assert_eq!(a.take_flipped("c"), set("1-2"));
        assert_eq!(a, Allocations::new(), "nothing is left behind");
    }

    #[test]
    fn releasing_what_is_not_held_changes_nothing() {
        let mut a = Allocations::new();
        a.release("c", set("0-3").ranges(), None);
        a.hold("c", set("2").ranges());
        a.release("c", set("0-1").ranges(), None);
        assert_eq!(a.held("c"), set("2"));
        assert_eq!(a.take_flipped("c"), set("2"));
    }

    #[test]
    fn a_rank_keeps_its_last_hold_in_event_time() {
        let mut a = Allocations::new();
        a.hold("c", set("0-1").ranges());
        a.release("c", set("0-1").ranges(), Some(20.0));
        a.hold("c", set("1").ranges());
        a.release("c", set("1").ranges(), Some(40.0));
        // an older free applied later (another partition behind) keeps it
        a.hold("c", set("1").ranges());
        a.release("c", set("1").ranges(), Some(12.0));
        assert!(a.held_after("c", 0, 15.0) && a.held_after("c", 0, 5.0));
        assert!(!a.held_after("c", 0, 25.0));
        assert!(a.held_after("c", 1, 35.0) && !a.held_after("c", 1, 45.0));
        assert_eq!(a.take_flipped("c"), set("0-1"));
        assert!(a.held_after("c", 0, 15.0), "kept after the look");
        a.mark_flipped("c", [3]);
        assert!(a.is_flipped("c") && a.is_rechecked("c", 3));
        a.hold("c", set("3").ranges());
        assert!(!a.is_rechecked("c", 3), "a true flip");
        assert_eq!(a.take_flipped("c"), set("3"));
        a.note_freed("c", set("5").ranges(), 50.0);
        assert!(a.held_after("c", 5, 49.0) && !a.is_flipped("c"));
    }

    proptest! {
        /// Held is exactly the union of the ranks of the jobs holding, and
        /// a rank flips whenever it went from no job to some or back.
        #[test]
        fn held_is_the_union_of_the_holders(ops in prop::collection::vec((0usize..6, any::<bool>(), 0u32..8, 0u32..4), 0..60)) {
            let mut a = Allocations::new();
            let mut holding: Vec<Option<IdSet>> = vec![None; 6];
            for (job, take, lo, len) in ops {
                let before = a.held("c");
                match (&holding[job], take) {
                    (None, true) => {
                        let ranks = IdSet::from_range(lo, lo + len);
                        a.hold("c", ranks.ranges());
                        holding[job] = Some(ranks);
                    }
                    (Some(ranks), false) => {
                        a.release("c", ranks.ranges(), None);
                        holding[job] = None;
                    }
                    _ => continue,
                }
                let mut want = IdSet::new();
                for r in holding.iter().flatten() {
                    want.union_with(r);
                }
                let after = a.held("c");
                prop_assert_eq!(&after, &want);
                let mut changed = before.clone();
                changed.subtract(&after);
                let mut added = after.clone();
                added.subtract(&before);
                changed.union_with(&added);
                prop_assert_eq!(a.take_flipped("c"), changed);
            }
        }
    }
}
