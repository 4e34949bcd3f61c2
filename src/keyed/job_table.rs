//! The job table: every job held, by key (cluster + job id).
//!
//! One hash table per cluster, whose slots hold the entry's box alone (8
//! bytes): the id is kept in the entry, and compared there when a slot's
//! hash tag matches (the entry is wanted next anyway). A table of the id
//! and the box took 16 bytes a slot, one keyed by the whole key 32 (the
//! cluster's name beside every job). A million jobs take about 18 MB of
//! table, not 35. Clusters are few: a key finds its cluster's table by the
//! address of its interned name among the first few, else by name.

use super::key::{JobKey, JobKeyRef};
use super::state::JobEntry;
use crate::flux::jobid::JobId;
use foldhash::HashMap;
use hashbrown::hash_table::{Entry, HashTable};
use std::hash::BuildHasher;
use std::sync::Arc;

/// Clusters looked for by address before the name is hashed.
const BY_ADDRESS: usize = 4;

/// Every job held, by key.
#[derive(Debug, Default)]
pub struct JobTable {
    /// Each cluster's jobs, in the order the clusters came. A cluster's
    /// table stays when its last job goes (its name is interned for good).
    clusters: Vec<ClusterJobs>,
    /// Where each cluster's table is in `clusters`.
    by_name: HashMap<Arc<str>, usize>,
    /// Jobs held, all clusters together.
    len: usize,
    /// Hashes ids (ids come from input: seeded per process).
    hasher: foldhash::fast::RandomState,
}

/// One cluster's jobs, each entry holding its id.
#[derive(Debug)]
struct ClusterJobs {
    name: Arc<str>,
    jobs: HashTable<Box<JobEntry>>,
}

/// How a table hashes its entries again when it grows: by the id each
/// holds (read in the entry).
fn rehash(hasher: &foldhash::fast::RandomState) -> impl Fn(&Box<JobEntry>) -> u64 + '_ {
    move |e| hasher.hash_one(e.id)
}

impl JobTable {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The place of `cluster`'s table.
    #[inline]
    fn find(&self, cluster: &Arc<str>) -> Option<usize> {
        // Keys nearly always share the interned name: its address is
        // enough, and nothing is hashed.
        if let Some(at) = self
            .clusters
            .iter()
            .take(BY_ADDRESS)
            .position(|c| Arc::ptr_eq(&c.name, cluster))
        {
            return Some(at);
        }
        self.by_name.get(&**cluster).copied()
    }

    /// The place of `cluster`'s table, made if it has none.
    fn place_of(&mut self, cluster: &Arc<str>) -> usize {
        if let Some(at) = self.find(cluster) {
            return at;
        }
        self.by_name.insert(cluster.clone(), self.clusters.len());
        self.clusters.push(ClusterJobs {
            name: cluster.clone(),
            jobs: HashTable::new(),
        });
        self.clusters.len() - 1
    }

    #[inline]
    fn hash(&self, id: JobId) -> u64 {
        self.hasher.hash_one(id)
    }

    #[inline]
    pub fn get(&self, key: &JobKey) -> Option<&JobEntry> {
        let at = self.find(&key.cluster)?;
        let hash = self.hash(key.id);
        self.clusters[at]
            .jobs
            .find(hash, |e| e.id == key.id)
            .map(|e| &**e)
    }

    #[inline]
    pub fn get_mut(&mut self, key: &JobKey) -> Option<&mut JobEntry> {
        let at = self.find(&key.cluster)?;
        let hash = self.hash(key.id);
        self.clusters[at]
            .jobs
            .find_mut(hash, |e| e.id == key.id)
            .map(|e| &mut **e)
    }

    /// Ask for the memory of `id`'s entry ahead of its use: a shard looks
    /// up a batch of records' jobs in one tight loop, so their misses
    /// overlap, before applying them one by one.
    #[inline]
    pub fn prefetch(&self, cluster: &str, id: JobId) {
        // The interned name's own bytes, else the name.
        let at = self
            .clusters
            .iter()
            .take(BY_ADDRESS)
            .position(|c| std::ptr::eq(&*c.name, cluster))
            .or_else(|| self.by_name.get(cluster).copied());
        let Some(at) = at else {
            return;
        };
        // The first slot whose hash tag matches, its entry not read (that
        // would wait for the very miss this is to overlap): another job's
        // a few times in a hundred (a 7-bit tag), and a hint wasted.
        if let Some(entry) = self.clusters[at].jobs.find(self.hash(id), |_| true) {
            // Every line the entry touches: one every 64 bytes from its
            // start, and its last byte's (an entry not aligned to a line).
            let start = std::ptr::from_ref::<JobEntry>(&**entry).cast::<u8>();
            for offset in (0..size_of::<JobEntry>()).step_by(64) {
                prefetch(start.wrapping_add(offset));
            }
            prefetch(start.wrapping_add(size_of::<JobEntry>() - 1));
        }
    }

    pub fn contains_key(&self, key: &JobKey) -> bool {
        self.get(key).is_some()
    }

    /// Put a job in (its entry takes `key`'s id); the entry it replaces,
    /// if any.
    pub fn insert(&mut self, key: &JobKey, mut entry: Box<JobEntry>) -> Option<Box<JobEntry>> {
        let at = self.place_of(&key.cluster);
        entry.id = key.id;
        let hash = self.hash(key.id);
        match self.clusters[at]
            .jobs
            .entry(hash, |e| e.id == key.id, rehash(&self.hasher))
        {
            Entry::Occupied(mut held) => Some(std::mem::replace(held.get_mut(), entry)),
            Entry::Vacant(new) => {
                new.insert(entry);
                self.len += 1;
                None
            }
        }
    }

    /// The job held under `key`, made empty if there was none.
    pub fn get_or_insert_default(&mut self, key: &JobKey) -> &mut JobEntry {
        let at = self.place_of(&key.cluster);
        let hash = self.hash(key.id);
        match self.clusters[at]
            .jobs
            .entry(hash, |e| e.id == key.id, rehash(&self.hasher))
        {
            Entry::Occupied(held) => held.into_mut(),
            Entry::Vacant(new) => {
                self.len += 1;
                let mut entry = Box::<JobEntry>::default();
                entry.id = key.id;
                new.insert(entry).into_mut()
            }
        }
    }

    pub fn remove(&mut self, key: &JobKey) -> Option<Box<JobEntry>> {
        let at = self.find(&key.cluster)?;
        let hash = self.hash(key.id);
        let held = self.clusters[at]
            .jobs
            .find_entry(hash, |e| e.id == key.id)
            .ok()?;
        let (entry, _) = held.remove();
        self.len -= 1;
        Some(entry)
    }

    /// Room for `more` jobs of `cluster` without growing (a restore's:
    /// a million jobs, one growth, not many: growing reads every entry's
    /// id, a miss each).
    pub fn reserve(&mut self, cluster: &Arc<str>, more: usize) {
        let at = self.place_of(cluster);
        if let Some(c) = self.clusters.get_mut(at) {
            c.jobs.reserve(more, rehash(&self.hasher));
        }
    }

    /// A cluster's table: the name it holds and its room, in jobs.
    #[cfg(test)]
    pub fn cluster_room(&self, cluster: &str) -> Option<(&Arc<str>, usize)> {
        let at = *self.by_name.get(cluster)?;
        let c = self.clusters.get(at)?;
        Some((&c.name, c.jobs.capacity()))
    }

    /// Every job, with its key lent (nothing counted), cluster by cluster.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            clusters: self.clusters.iter(),
            current: None,
            left: self.len,
        }
    }

    /// The same, to change the entries.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (JobKeyRef<'_>, &mut JobEntry)> + '_ {
        self.clusters.iter_mut().flat_map(|c| {
            let name = &c.name;
            c.jobs.iter_mut().map(move |e| {
                let id = e.id;
                (JobKeyRef { cluster: name, id }, &mut **e)
            })
        })
    }

    /// Every job, without its key.
    pub fn values(&self) -> impl Iterator<Item = &JobEntry> + '_ {
        self.clusters
            .iter()
            .flat_map(|c| c.jobs.iter().map(|e| &**e))
    }
}

/// One cluster's jobs, by id.
type IdIter<'a> = hashbrown::hash_table::Iter<'a, Box<JobEntry>>;

/// The jobs of a [`JobTable`], with their keys lent. Its length is known:
/// a checkpoint's encoder writes it first rather than gathering the
/// sequence to count it.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    clusters: std::slice::Iter<'a, ClusterJobs>,
    /// The cluster being walked: its name and its jobs left.
    current: Option<(&'a Arc<str>, IdIter<'a>)>,
    left: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (JobKeyRef<'a>, &'a JobEntry);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((name, jobs)) = &mut self.current
                && let Some(entry) = jobs.next()
            {
                self.left -= 1;
                let key = JobKeyRef {
                    cluster: name,
                    id: entry.id,
                };
                return Some((key, &**entry));
            }
            let c = self.clusters.next()?;
            self.current = Some((&c.name, c.jobs.iter()));
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
impl std::ops::Index<&JobKey> for JobTable {
    type Output = JobEntry;

    /// Panics if the job is not held: for tests.
    fn index(&self, key: &JobKey) -> &JobEntry {
        match self.get(key) {
            Some(e) => e,
            None => panic!("no job {key:?} held"),
        }
    }
}

/// A hint to the processor that the line at `at` is wanted soon.
#[inline(always)]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch reads nothing and faults on no address; SSE
        // is part of every x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(cluster: &Arc<str>, id: u64) -> JobKey {
        JobKey {
            cluster: cluster.clone(),
            id: JobId(id),
        }
    }

    #[test]
    fn jobs_are_found_by_name_whatever_copy_of_it_the_key_holds() {
        let mut t = JobTable::default();
        let names: Vec<Arc<str>> = (0..7).map(|i| Arc::from(format!("c{i}"))).collect();
        for (i, c) in names.iter().enumerate() {
            for id in 0..3 {
                assert!(t.insert(&key(c, id), Box::default()).is_none());
            }
            assert_eq!(t.len(), 3 * (i + 1));
        }
        // Another copy of each name: found by name past the first few.
        for i in 0..7 {
            let other: Arc<str> = Arc::from(format!("c{i}"));
            assert!(t.contains_key(&key(&other, 2)));
            assert!(!t.contains_key(&key(&other, 3)));
        }
        assert!(t.get(&key(&Arc::from("elsewhere"), 0)).is_none());
        assert!(t.insert(&key(&names[5], 1), Box::default()).is_some());
        assert_eq!(t.len(), 21);
        assert!(t.remove(&key(&names[5], 1)).is_some());
        assert!(t.remove(&key(&names[5], 1)).is_none());
        assert_eq!(t.len(), 20);
        assert_eq!(t.iter().count(), 20);
        // Its length known at every step (a checkpoint writes it first).
        let mut it = t.iter().skip(5);
        assert_eq!(it.size_hint(), (15, Some(15)));
        it.next();
        assert_eq!(it.len(), 14);
        assert_eq!(it.count(), 14);
        assert_eq!(t.values().count(), 20);
        let mut keys: Vec<_> = t
            .iter()
            .map(|(k, _)| (k.cluster.to_string(), k.id.0))
            .collect();
        keys.sort();
        assert_eq!(keys.len(), 20);
        assert!(!keys.contains(&("c5".to_string(), 1)));
        t.get_or_insert_default(&key(&names[0], 9)).ended_at = 3;
        assert_eq!(t[&key(&names[0], 9)].ended_at, 3);
        assert_eq!(t.len(), 21);
    }
}
