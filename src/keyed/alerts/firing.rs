//! The alerts firing now, in the order the query API lists them, kept as
//! alerts fire and resolve: a page of what fires reads a range of each
//! cluster's set, not every job held (a site with a stuck queue may have a
//! hundred thousand alerts firing, and the shards answer between records).
//!
//! The order: oldest condition first, then rule, subject (jobs before
//! nodes, by id or rank) and cluster; it is total, so a page can start
//! after any alert ([`AlertPosition`]).

use super::engine::Due;
use crate::keyed::listing::{ordered, unordered};
use foldhash::HashMap;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, btree_set};
use std::ops::Bound;
use std::sync::Arc;
use thiserror::Error;

/// A firing alert within its cluster: 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    /// When its condition began, as [`ordered`].
    since: i64,
    rule: u16,
    /// 0 a job, 1 a node.
    kind: u8,
    /// The job's id or the node's rank.
    id: u64,
}

impl Entry {
    fn new(since: f64, rule: u16, due: Due) -> Self {
        let (kind, id) = match due {
            Due::Job(id) => (0, id.0),
            Due::Node(rank) => (1, u64::from(rank)),
        };
        Entry {
            since: ordered(since),
            rule,
            kind,
            id,
        }
    }
}

/// Every alert firing now, per cluster.
#[derive(Debug, Default)]
pub struct FiringIndex {
    clusters: HashMap<Arc<str>, BTreeSet<Entry>>,
    len: usize,
}

impl FiringIndex {
    /// Alerts firing now, in every cluster.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Alerts firing now in one cluster, or in all.
    pub fn count(&self, cluster: Option<&str>) -> usize {
        match cluster {
            Some(c) => self.clusters.get(c).map_or(0, BTreeSet::len),
            None => self.len,
        }
    }

    /// An alert fired: its condition began at `since`.
    pub(super) fn insert(&mut self, cluster: &str, due: Due, rule: u16, since: f64) {
        let entry = Entry::new(since, rule, due);
        let added = match self.clusters.get_mut(cluster) {
            Some(set) => set.insert(entry),
            None => self
                .clusters
                .entry(Arc::from(cluster))
                .or_default()
                .insert(entry),
        };
        self.len += usize::from(added);
    }

    /// A fired alert resolved, or left with its subject.
    pub(super) fn remove(&mut self, cluster: &str, due: Due, rule: u16, since: f64) {
        let Some(set) = self.clusters.get_mut(cluster) else {
            return;
        };
        if set.remove(&Entry::new(since, rule, due)) {
            self.len -= 1;
        }
        if set.is_empty() {
            self.clusters.remove(cluster);
        }
    }

    /// The first `limit` alerts after `after`, in order, of one cluster or
    /// all. The work is the page's, not what fires: a range per cluster,
    /// merged.
    pub fn page(
        &self,
        cluster: Option<&str>,
        after: Option<&AlertPosition>,
        limit: usize,
    ) -> Vec<AlertPosition> {
        type Range<'a> = btree_set::Range<'a, Entry>;
        // Each cluster's next alert, with the cluster's range.
        let mut heads: BinaryHeap<Reverse<(Entry, &Arc<str>, usize)>> = BinaryHeap::new();
        let mut ranges: Vec<Range<'_>> = Vec::new();
        for (name, set) in &self.clusters {
            if cluster.is_some_and(|c| c != &**name) {
                continue;
            }
            let start = match after {
                // Past the alert itself in its order: at its entry, this
                // cluster comes after it only if its name sorts after.
                Some(p) => {
                    let at = p.entry();
                    if **name > *p.cluster {
                        Bound::Included(at)
                    } else {
                        Bound::Excluded(at)
                    }
                }
                None => Bound::Unbounded,
            };
            let mut range = set.range((start, Bound::Unbounded));
            if let Some(first) = range.next() {
                heads.push(Reverse((*first, name, ranges.len())));
                ranges.push(range);
            }
        }
        let mut page = Vec::new();
        while page.len() < limit
            && let Some(Reverse((entry, name, i))) = heads.pop()
        {
            page.push(AlertPosition::new(entry, name));
            if let Some(next) = ranges.get_mut(i).and_then(Iterator::next) {
                heads.push(Reverse((*next, name, i)));
            }
        }
        page
    }

    /// Every alert firing, in order (for tests and small listings).
    #[cfg(test)]
    pub fn all(&self) -> Vec<AlertPosition> {
        self.page(None, None, usize::MAX)
    }
}

/// A position text that is not one this API gave.
#[derive(Debug, Error)]
#[error("bad position `{0}`")]
pub struct BadPosition(pub String);

/// An alert's place in the listing of what fires: oldest condition first,
/// then rule, subject and cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertPosition {
    pub since: f64,
    pub rule: usize,
    /// 0 a job, 1 a node, 2 a cluster (the feed watch's alerts: `rule`
    /// is then among the watch's rules).
    pub kind: u8,
    /// The job's id or the node's rank (a watch alert's: its source's
    /// name, hashed).
    pub id: u64,
    pub cluster: Arc<str>,
}

impl Eq for AlertPosition {}

impl Ord for AlertPosition {
    fn cmp(&self, other: &Self) -> Ordering {
        self.since
            .total_cmp(&other.since)
            .then(self.rule.cmp(&other.rule))
            .then(self.kind.cmp(&other.kind))
            .then(self.id.cmp(&other.id))
            .then_with(|| self.cluster.cmp(&other.cluster))
    }
}

impl PartialOrd for AlertPosition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl AlertPosition {
    fn new(e: Entry, cluster: &Arc<str>) -> Self {
        AlertPosition {
            since: unordered(e.since),
            rule: usize::from(e.rule),
            kind: e.kind,
            id: e.id,
            cluster: cluster.clone(),
        }
    }

    /// Its entry in a cluster's set. Rule numbers past a `u16` are never
    /// in a set (the engine keeps fewer rules): the greatest serves.
    fn entry(&self) -> Entry {
        Entry {
            since: ordered(self.since),
            rule: u16::try_from(self.rule).unwrap_or(u16::MAX),
            kind: self.kind,
            id: self.id,
        }
    }

    /// As text, for the `next` of a page: opaque to the client.
    pub fn encode(&self) -> String {
        format!(
            "{:x}.{}.{}.{:x}.{}",
            self.since.to_bits(),
            self.rule,
            self.kind,
            self.id,
            self.cluster
        )
    }

    pub fn decode(text: &str) -> Result<Self, BadPosition> {
        let bad = || BadPosition(text.to_string());
        let mut parts = text.splitn(5, '.');
        let mut next = || parts.next().ok_or_else(bad);
        let since = f64::from_bits(u64::from_str_radix(next()?, 16).map_err(|_| bad())?);
        let rule = next()?.parse().map_err(|_| bad())?;
        let kind = next()?.parse().map_err(|_| bad())?;
        let id = u64::from_str_radix(next()?, 16).map_err(|_| bad())?;
        let cluster = next()?.into();
        Ok(AlertPosition {
            since,
            rule,
            kind,
            id,
            cluster,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::jobid::JobId;
    use proptest::prelude::*;

    fn due(kind: u8, id: u64) -> Due {
        if kind == 0 {
            Due::Job(JobId(id))
        } else {
            Due::Node(id as u32)
        }
    }

    proptest! {
        /// Pages of any size, from any alert, join up to the whole set in
        /// the order of positions; counts follow inserts and removals.
        #[test]
        fn pages_are_the_sorted_set(
            ops in proptest::collection::vec((any::<bool>(), 0u8..3, -3i32..3, 0u16..3, 0u8..2, 0u64..4), 0..80),
            limit in 1usize..6,
        ) {
            let mut index = FiringIndex::default();
            let mut model: BTreeSet<AlertPosition> = BTreeSet::new();
            let names = ["a", "b", "c"];
            for (add, c, since, rule, kind, id) in ops {
                let cluster = names[c as usize];
                let since = f64::from(since) * 0.5;
                let p = AlertPosition { since, rule: rule.into(), kind, id: if kind == 1 { id } else { id << 40 }, cluster: cluster.into() };
                let d = due(kind, p.id);
                if add {
                    index.insert(cluster, d, rule, since);
                    model.insert(p);
                } else {
                    index.remove(cluster, d, rule, since);
                    model.remove(&p);
                }
                prop_assert_eq!(index.len(), model.len());
                prop_assert_eq!(index.count(Some("b")), model.iter().filter(|p| &*p.cluster == "b").count());
            }
            let want: Vec<AlertPosition> = model.iter().cloned().collect();
            prop_assert_eq!(&index.all(), &want);
            for only in [None, Some("a"), Some("c")] {
                let want: Vec<&AlertPosition> = want.iter().filter(|p| only.is_none_or(|c| *p.cluster == *c)).collect();
                let mut got = Vec::new();
                let mut after: Option<AlertPosition> = None;
                loop {
                    let page = index.page(only, after.as_ref(), limit);
                    prop_assert!(page.len() <= limit);
                    let Some(last) = page.last().cloned() else { break };
                    got.extend(page);
                    after = Some(last);
                }
                prop_assert_eq!(got.iter().collect::<Vec<_>>(), want);
            }
        }

        /// A page may start after a position that is not (or no longer)
        /// firing: it starts at the next one that is.
        #[test]
        fn a_page_starts_after_any_position(since in -3i32..3, rule in 0usize..70_000, kind in 0u8..2, id in 0u64..4, cluster in "[a-d]") {
            let mut index = FiringIndex::default();
            for (c, s) in [("a", -1.0), ("b", 0.0), ("c", 0.0), ("d", 1.0)] {
                index.insert(c, Due::Job(JobId(2)), 1, s);
                index.insert(c, Due::Node(1), 0, s);
            }
            let p = AlertPosition { since: f64::from(since), rule, kind, id, cluster: cluster.into() };
            let want: Vec<AlertPosition> = index.all().into_iter().filter(|q| *q > p).collect();
            prop_assert_eq!(index.page(None, Some(&p), usize::MAX), want);
        }

        #[test]
        fn positions_round_trip(since in any::<f64>(), rule in 0usize..100, kind in 0u8..2, id in any::<u64>(), cluster in ".*") {
            let p = AlertPosition { since, rule, kind, id, cluster: cluster.into() };
            let back = AlertPosition::decode(&p.encode()).unwrap();
            prop_assert_eq!(p.cmp(&back), Ordering::Equal);
        }

        #[test]
        fn decoding_never_panics(text in ".*") {
            let _ = AlertPosition::decode(&text);
        }
    }
}
