//! Keyed state: every job (key: cluster + job id) and every cluster's ranks,
//! rebuilt by applying decoded records. Pure: no I/O. `fluxpipe replay`
//! drives it over files; the streaming operators drive one per shard.

use super::alerts::engine::{Conditions, JobConditions};
use super::job_table::JobTable;
use super::key::{JobKey, JobKeyRef, Owner};
use super::listing::{Listing, Standing};
use crate::decode::{Body, EventStream, Record};
use crate::flux::allocation::Allocations;
use crate::flux::anomaly::{Anomaly, AnomalyKind, Stream};
use crate::flux::exec::{ExecLog, ExecProtocol};
use crate::flux::job::{Job, JobSummary, Transition};
use crate::flux::jobid::JobId;
use crate::flux::resource::{RankChange, ResourceState};
use serde::{Deserialize, Serialize};
// Keys come from input: foldhash is fast and seeded per process.
use foldhash::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

/// A job in the table not yet in the listing: its cluster (by its place
/// in the caller's list of clusters), where it is listed, and its newest
/// event time ([`State::insert_unlisted`]). No name is counted per job: a
/// restore's million would each count a name other shards count too.
pub type Unlisted = (u32, Standing, Option<f64>);

/// Everything known about one job.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "SavedEntry")]
pub struct JobEntry {
    pub job: Job,
    /// Its id, kept here so that the job table's slots hold the box alone
    /// (8 bytes a slot, not 16). Set by the table when the entry goes in;
    /// not saved (a saved entry is saved beside its key).
    pub(super) id: JobId,
    /// The exec eventlog and the exec service's responses: allocated with
    /// the first exec record, as most active jobs (pending ones) have none.
    /// One pointer for both: the 8 bytes the id took.
    exec: Option<Box<ExecSide>>,
    /// Set once the exec eventlog's `complete` status has been compared
    /// with the job's `finish` status, so a mismatch is reported once.
    exec_checked: bool,
    /// The same, for the exec service's `finish` response.
    protocol_checked: bool,
    /// The input partition its records come from (partitioned sources
    /// only: boxed, so the entry stays within its allocation class).
    pub owner: Option<Box<Owner>>,
    /// When it was seen ending, in Unix seconds on the wall clock (0: not
    /// ended, or not timed: a replay): its time to live runs from then,
    /// across restarts.
    pub ended_at: u32,
    /// Its alert conditions, kept here rather than in a table of the
    /// engine's (one lookup per change, not two). Checkpoints save them
    /// apart, with the nodes' ([`crate::keyed::alerts::engine::SavedConditions`]).
    pub alerts: Conditions,
}

/// A job's exec side, boxed as one: its exec eventlog (RFC 50) and the exec
/// service's responses (RFC 32, rarer: boxed again). 96 bytes, a class of
/// its own.
#[derive(Debug, Clone, Default)]
struct ExecSide {
    log: Option<ExecLog>,
    protocol: Option<Box<ExecProtocol>>,
}

/// How an entry is saved: the exec log and the exec service's responses
/// as two fields, as before they shared a box (checkpoints and changelogs
/// written before read the same).
#[derive(Serialize)]
struct SavedEntryRef<'a> {
    job: &'a Job,
    exec: Option<&'a ExecLog>,
    protocol: Option<&'a ExecProtocol>,
    exec_checked: bool,
    protocol_checked: bool,
    owner: &'a Option<Box<Owner>>,
    ended_at: u32,
}

/// [`SavedEntryRef`] read back.
#[derive(Deserialize)]
struct SavedEntry {
    job: Job,
    #[serde(with = "lazy")]
    exec: Option<ExecLog>,
    #[serde(with = "lazy")]
    protocol: Option<ExecProtocol>,
    exec_checked: bool,
    protocol_checked: bool,
    /// Last ones with defaults: older checkpoints and changelogs read as
    /// held by no partition and not timed (their grace starts again).
    #[serde(default)]
    owner: Option<Box<Owner>>,
    #[serde(default)]
    ended_at: u32,
}

impl Serialize for JobEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        SavedEntryRef {
            job: &self.job,
            exec: self.exec_log(),
            protocol: self.protocol(),
            exec_checked: self.exec_checked,
            protocol_checked: self.protocol_checked,
            owner: &self.owner,
            ended_at: self.ended_at,
        }
        .serialize(s)
    }
}

impl From<SavedEntry> for JobEntry {
    fn from(saved: SavedEntry) -> Self {
        let exec = (saved.exec.is_some() || saved.protocol.is_some()).then(|| {
            Box::new(ExecSide {
                log: saved.exec,
                protocol: saved.protocol.map(Box::new),
            })
        });
        JobEntry {
            job: saved.job,
            id: JobId::default(),
            exec,
            exec_checked: saved.exec_checked,
            protocol_checked: saved.protocol_checked,
            owner: saved.owner,
            ended_at: saved.ended_at,
            alerts: Conditions::default(),
        }
    }
}

impl JobConditions for JobTable {
    fn conditions_of(&self, key: &JobKey) -> Option<&Conditions> {
        self.get(key).map(|e| &e.alerts)
    }
    fn conditions_mut(&mut self, key: &JobKey) -> Option<&mut Conditions> {
        self.get_mut(key).map(|e| &mut e.alerts)
    }
    fn conditions(&self) -> impl Iterator<Item = (JobKeyRef<'_>, &Conditions)> {
        self.iter().map(|(k, e)| (k, &e.alerts))
    }
    fn conditions_all_mut(&mut self) -> impl Iterator<Item = (JobKeyRef<'_>, &mut Conditions)> {
        self.iter_mut().map(|(k, e)| (k, &mut e.alerts))
    }
}

/// Serde for a part of the state allocated on first use: saved as nil
/// while absent (most active jobs have no exec log: one byte, where the
/// empty value took ~20), and absent again when read back empty. Reads
/// the older form too, the empty value saved in place of nil.
mod lazy {
    use serde::{Deserialize, Deserializer};

    /// A part that may be left unallocated while it holds nothing.
    pub trait Lazy {
        fn is_empty(&self) -> bool;
    }

    pub fn deserialize<'de, T: Lazy + Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        let v = Option::<T>::deserialize(d)?;
        Ok(v.filter(|v| !v.is_empty()))
    }
}

impl lazy::Lazy for ExecLog {
    fn is_empty(&self) -> bool {
        self.event_count() == 0
    }
}

impl lazy::Lazy for ExecProtocol {
    fn is_empty(&self) -> bool {
        self.response_count() == 0
    }
}

impl JobEntry {
    /// The exec eventlog so far, if the job has any exec event.
    pub fn exec_log(&self) -> Option<&ExecLog> {
        self.exec.as_ref()?.log.as_ref()
    }

    /// The exec eventlog, made empty if the job had none.
    pub fn exec_log_mut(&mut self) -> &mut ExecLog {
        self.exec
            .get_or_insert_default()
            .log
            .get_or_insert_default()
    }

    /// The exec service's responses so far, if the job has any.
    pub fn protocol(&self) -> Option<&ExecProtocol> {
        self.exec.as_ref()?.protocol.as_deref()
    }

    /// The exec service's responses, made empty if the job had none.
    fn protocol_mut(&mut self) -> &mut ExecProtocol {
        self.exec
            .get_or_insert_default()
            .protocol
            .get_or_insert_default()
    }
}

/// An anomaly with the key it concerns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyedAnomaly {
    pub cluster: String,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "ser_id")]
    pub id: Option<JobId>,
    #[serde(flatten)]
    pub anomaly: Anomaly,
}

fn ser_id<S: serde::Serializer>(id: &Option<JobId>, s: S) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => s.serialize_u64(id.0),
        None => s.serialize_none(),
    }
}

/// A job state transition with its key.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedTransition {
    pub key: JobKey,
    pub transition: Transition,
}

/// What applying one record did.
#[derive(Debug, Clone, Default)]
pub struct Effects {
    /// At most one per record: inline, nothing allocated for it.
    pub transitions: smallvec::SmallVec<[KeyedTransition; 1]>,
    pub anomalies: Vec<KeyedAnomaly>,
    /// Ranks whose state changed, with the cluster they belong to.
    pub rank_changes: Vec<(String, RankChange)>,
    /// The record repeated something already applied and was skipped.
    pub duplicate: bool,
    /// The name and time of the event applied (job and resource streams),
    /// moved out of it: what transition and rank records name.
    pub event: Option<(compact_str::CompactString, f64)>,
}

/// Counters over everything applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub records: u64,
    pub duplicates: u64,
    pub anomalies: u64,
}

/// The ranks jobs hold, shared by every holder of a part of the state: the
/// pipeline's shards each keep some of a cluster's jobs, one keeps its
/// resource state. Locked only when a job takes or gives back its ranks,
/// and when the resource state looks at what changed.
#[derive(Debug, Clone, Default)]
pub struct SharedAllocations(Arc<Mutex<Allocations>>);

impl SharedAllocations {
    pub fn with<R>(&self, f: impl FnOnce(&mut Allocations) -> R) -> R {
        // A panic elsewhere while holding it leaves counts that are still
        // counts: go on with them.
        let mut a = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut a)
    }

    /// The ranks `job` was allocated count as held (`take`), or free again,
    /// by an event of time `at` if one.
    fn count(&self, cluster: &str, job: &Job, take: bool, at: Option<f64>) {
        let ranks = job.allocated_ranges();
        self.with(|a| {
            if take {
                a.hold(cluster, ranks);
            } else {
                a.release(cluster, ranks, at);
            }
        });
    }
}

/// All jobs and ranks.
#[derive(Debug, Default)]
pub struct State {
    /// Changed only through this type's methods, which keep `listing`
    /// in step (elsewhere, what a job's place does not depend on: its
    /// alert conditions, its owner).
    pub jobs: JobTable,
    /// Every job's place in the listing order, and each cluster's counts.
    listing: Listing,
    pub resources: HashMap<String, ResourceState>,
    pub counts: Counts,
    /// Cluster names, one copy each, for the job keys.
    clusters: HashSet<Arc<str>>,
    /// The name interned last.
    last_cluster: Option<Arc<str>>,
    /// The ranks held by jobs, this state's and any other part's.
    allocations: SharedAllocations,
    /// The ranks every part's resource states may hold together.
    rank_budget: RankBudget,
    /// The clusters every part may follow together.
    cluster_budget: ClusterBudget,
}

/// The clusters every part of a state follows together, at most `max`
/// (`operators.max_clusters`): records naming others are refused, so
/// made-up cluster names cannot take all memory and every series. Shared
/// by the shards; looked at only when a shard meets a cluster new to it.
#[derive(Debug, Clone)]
pub struct ClusterBudget {
    max: usize,
    known: Arc<Mutex<HashSet<String>>>,
}

impl Default for ClusterBudget {
    fn default() -> Self {
        ClusterBudget::new(usize::MAX)
    }
}

impl ClusterBudget {
    pub fn new(max: usize) -> Self {
        ClusterBudget {
            max: max.max(1),
            known: Arc::default(),
        }
    }

    /// Whether `cluster` is followed: known, or new with room left (then
    /// it is known from now on).
    pub fn admit(&self, cluster: &str) -> bool {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.contains(cluster) {
            return true;
        }
        if known.len() >= self.max {
            return false;
        }
        known.insert(cluster.to_string());
        true
    }

    /// Whether `cluster` is followed already (nothing admitted).
    pub fn knows(&self, cluster: &str) -> bool {
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.contains(cluster)
    }

    /// Follow `cluster` whatever the limit (restored state).
    fn note(&self, cluster: &str) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if !known.contains(cluster) {
            known.insert(cluster.to_string());
        }
    }
}

/// The ranks the resource states of every part of a state may hold in
/// all (`operators.max_ranks`): made-up cluster names each naming a
/// hundred thousand ranks must not take all memory. Shared by the shards;
/// a resource event is applied holding it (they are few), so two shards
/// cannot both take the last room.
#[derive(Debug, Clone)]
pub struct RankBudget {
    max: usize,
    held: Arc<Mutex<usize>>,
}

impl Default for RankBudget {
    fn default() -> Self {
        RankBudget::new(usize::MAX)
    }
}

impl RankBudget {
    pub fn new(max: usize) -> Self {
        RankBudget {
            max,
            held: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ranks held, all parts together.
    pub fn held(&self) -> usize {
        *self.lock()
    }

    /// A cluster went from `before` ranks to `after`.
    fn changed(&self, before: usize, after: usize) {
        let mut held = self.lock();
        *held = held.saturating_sub(before) + after;
    }
}

impl State {
    pub fn new() -> Self {
        State::default()
    }

    /// Share the ranks its jobs hold with the other parts of the same
    /// state (the pipeline's shards). Before any job is put in.
    pub fn share_allocations(&mut self, allocations: SharedAllocations) {
        debug_assert!(self.jobs.is_empty());
        self.allocations = allocations;
    }

    /// Share the rank budget with the other parts of the same state.
    /// Before any resource state is put in.
    pub fn share_rank_budget(&mut self, budget: RankBudget) {
        debug_assert!(self.resources.is_empty());
        self.rank_budget = budget;
    }

    /// Share the cluster budget with the other parts of the same state.
    pub fn share_cluster_budget(&mut self, budget: ClusterBudget) {
        for c in &self.clusters {
            budget.note(c);
        }
        self.cluster_budget = budget;
    }

    /// Put in a cluster's resource state (restored), counting its ranks.
    pub fn insert_resources(&mut self, cluster: String, res: ResourceState) {
        self.intern(&cluster);
        let after = res.rank_count();
        let before = self
            .resources
            .insert(cluster, res)
            .map_or(0, |old| old.rank_count());
        self.rank_budget.changed(before, after);
    }

    /// Take out a cluster's resource state (its partition went elsewhere).
    pub fn remove_resources(&mut self, cluster: &str) -> Option<ResourceState> {
        let res = self.resources.remove(cluster)?;
        self.rank_budget.changed(res.rank_count(), 0);
        Some(res)
    }

    /// Have every drained rank looked at again at the next refresh (a
    /// restored state: its saved draining may be older than its jobs'
    /// holds, and what differs was never written out).
    pub fn recheck_draining(&mut self) {
        for (cluster, res) in &self.resources {
            let ranks = res
                .ranks()
                .filter(|r| r.drained || r.draining)
                .map(|r| r.rank);
            self.allocations.with(|a| a.mark_flipped(cluster, ranks));
        }
    }

    /// Put a job in (restored state); one already held under its key is
    /// replaced and returned. The ranks it holds count as held.
    pub fn insert_job(&mut self, key: JobKey, entry: Box<JobEntry>) -> Option<Box<JobEntry>> {
        let (old, standing, newest) = self.put_job(&key, entry);
        let before = old.as_ref().map(|o| Standing::of(key.id, &o.job));
        self.listing
            .update(&key.cluster, before, Some(standing), newest);
        if let Some(old) = old.as_ref().filter(|o| o.job.holds_ranks()) {
            self.allocations.count(&key.cluster, &old.job, false, None);
        }
        old
    }

    /// A job put back from saved state, not listed yet: the caller lists a
    /// whole restore's jobs at once, in listing order ([`State::list`]),
    /// rather than each where the saved state happens to put it (a
    /// million restored jobs inserted into the listing's trees at random
    /// places were half of the restore's time). The key must not be held.
    pub fn insert_unlisted(
        &mut self,
        key: &JobKey,
        entry: Box<JobEntry>,
        cluster: u32,
    ) -> Unlisted {
        let (old, standing, newest) = self.put_job(key, entry);
        debug_assert!(old.is_none(), "a restored key was held");
        if let Some(old) = old {
            // Not for a key held: taken out as `insert_job` would have.
            let before = Standing::of(key.id, &old.job);
            self.listing.update(&key.cluster, Some(before), None, None);
            if old.job.holds_ranks() {
                self.allocations.count(&key.cluster, &old.job, false, None);
            }
        }
        (cluster, standing, newest)
    }

    /// List jobs put back unlisted, their clusters by place in `clusters`:
    /// a cluster's at once, each tree of the listing built whole from their
    /// sorted places.
    pub fn list(&mut self, clusters: &[Arc<str>], mut jobs: Vec<Unlisted>) {
        jobs.sort_unstable_by_key(|(cluster, _, _)| *cluster);
        let mut standings = Vec::new();
        for run in jobs.chunk_by(|a, b| a.0 == b.0) {
            let Some(cluster) = clusters.get(run[0].0 as usize) else {
                debug_assert!(false, "a restored job's cluster is not in the list");
                continue;
            };
            standings.clear();
            standings.extend(run.iter().map(|(_, s, _)| *s));
            let newest = run
                .iter()
                .filter_map(|(_, _, t)| t.filter(|t| t.is_finite()))
                .reduce(f64::max);
            self.listing.add_all(cluster, &standings, newest);
        }
    }

    /// The table's part of putting a job in: what it replaced, and what
    /// the listing is to learn of it (its place, its newest event time).
    fn put_job(
        &mut self,
        key: &JobKey,
        entry: Box<JobEntry>,
    ) -> (Option<Box<JobEntry>>, Standing, Option<f64>) {
        if entry.job.holds_ranks() {
            self.allocations.count(&key.cluster, &entry.job, true, None);
        } else if let Some(t) = entry.job.freed_at() {
            // Given back before: when, for a drain the resource state has
            // still to apply.
            let ranks = entry.job.allocated_ranges();
            self.allocations
                .with(|a| a.note_freed(&key.cluster, ranks, t));
        }
        let standing = Standing::of(key.id, &entry.job);
        let newest = entry.job.last_timestamp();
        let old = self.jobs.insert(key, entry);
        (old, standing, newest)
    }

    /// Take a job out (dropped, or its partition revoked): the ranks it
    /// held are free, as far as this state can tell.
    pub fn remove_job(&mut self, key: &JobKey) -> Option<Box<JobEntry>> {
        let entry = self.jobs.remove(key)?;
        let standing = Standing::of(key.id, &entry.job);
        self.listing
            .update(&key.cluster, Some(standing), None, None);
        if entry.job.holds_ranks() {
            self.allocations
                .count(&key.cluster, &entry.job, false, None);
        }
        Some(entry)
    }

    /// Look again at the ranks whose holders changed, for every cluster
    /// whose resource state is here: a drained rank is draining while a
    /// job holds it. For the shards, whose jobs change the holds of
    /// clusters another shard keeps.
    pub fn refresh_draining(&mut self) -> Vec<(String, RankChange)> {
        let clusters = self.allocations.with(|a| a.clusters_flipped());
        let mut out = Vec::new();
        for cluster in clusters {
            if self.resources.contains_key(&cluster) {
                self.refresh_cluster(&cluster, None, &mut out);
            }
        }
        out
    }

    /// Set draining for `cluster`'s ranks that flipped, and for `also`.
    fn refresh_cluster(
        &mut self,
        cluster: &str,
        also: Option<&mut Vec<RankChange>>,
        out: &mut Vec<(String, RankChange)>,
    ) {
        let Some(res) = self.resources.get_mut(cluster) else {
            return;
        };
        let mut changes = also.map(std::mem::take).unwrap_or_default();
        // Ranks a resource event changed (rare): nothing allocated for none.
        let changed: Vec<u32> = changes.iter().map(|c| c.rank).collect();
        // Ranks it drained: a job of another part may have held them then.
        let newly_drained: Vec<u32> = changes
            .iter()
            .filter(|c| c.after.as_ref().is_some_and(|a| a.drained))
            .filter(|c| !c.before.as_ref().is_some_and(|b| b.drained))
            .map(|c| c.rank)
            .collect();
        let mut passed = Vec::new();
        self.allocations.with(|a| {
            let flipped: Vec<u32> = a.flipped(cluster).collect();
            // The flipped ones not draining before this look.
            let mut candidates: Vec<u32> = flipped
                .iter()
                .copied()
                .filter(|&r| res.rank(r).is_some_and(|s| !s.draining))
                .filter(|&r| !a.is_rechecked(cluster, r))
                .chain(newly_drained)
                .collect();
            candidates.sort_unstable();
            candidates.dedup();
            res.set_draining(
                flipped.into_iter().chain(changed),
                |r| a.is_held(cluster, r),
                &mut changes,
            );
            // A job of another part held a drained rank when it was
            // drained, and has given it back by now (the shards applied the
            // job's events and the drain in another order than they came,
            // or between two looks): it was draining until the job's free.
            // Said as it was, not skipped.
            for r in candidates {
                let held_when_drained = res.rank(r).is_some_and(|s| {
                    s.drained
                        && !s.draining
                        && !a.is_held(cluster, r)
                        && s.drain_timestamp
                            .is_some_and(|d| a.held_after(cluster, r, d))
                });
                if held_when_drained {
                    // Apart: one list would coalesce them into nothing.
                    for held in [true, false] {
                        let mut one = Vec::new();
                        res.set_draining([r], |_| held, &mut one);
                        passed.extend(one);
                    }
                }
            }
            a.clear_flipped(cluster);
        });
        out.extend(
            changes
                .into_iter()
                .chain(passed)
                .map(|c| (cluster.to_string(), c)),
        );
    }

    /// The shared copy of a cluster name: a million job keys of one
    /// cluster hold one string, and making a key allocates nothing.
    /// The copy of `cluster` if it is the name interned last: most records
    /// name the cluster the one before named, often by the very string
    /// interned (a shard's copy of its sources' names).
    fn interned_last(&self, cluster: &str) -> Option<Arc<str>> {
        self.last_cluster
            .as_ref()
            .filter(|c| std::ptr::eq(&***c, cluster) || ***c == *cluster)
            .cloned()
    }

    /// As [`State::intern`], for a record: `None` if the cluster is new
    /// and the most clusters are followed.
    pub fn intern_admitted(&mut self, cluster: &str) -> Option<Arc<str>> {
        if let Some(c) = self.interned_last(cluster) {
            return Some(c);
        }
        if !self.clusters.contains(cluster) && !self.cluster_budget.admit(cluster) {
            return None;
        }
        Some(self.intern(cluster))
    }

    pub fn intern(&mut self, cluster: &str) -> Arc<str> {
        if let Some(c) = self.interned_last(cluster) {
            return c;
        }
        if let Some(c) = self.clusters.get(cluster) {
            let c = c.clone();
            self.last_cluster = Some(c.clone());
            return c;
        }
        let c: Arc<str> = Arc::from(cluster);
        self.clusters.insert(c.clone());
        self.cluster_budget.note(cluster);
        c
    }

    /// Room for restored jobs (a part's: one growth of each cluster's
    /// table at most, not one per doubling), each cluster's table made
    /// with the shared copy of its name, the copy live keys carry (keys
    /// decoded on other threads carry copies of their own, and a table
    /// named by one of those would have every live lookup hash the name).
    pub fn reserve_jobs<'k>(&mut self, keys: impl IntoIterator<Item = &'k JobKey>) {
        // (the shared copy, jobs) per cluster; keys come in runs of one
        // decoded copy.
        let mut counts: Vec<(Arc<str>, usize)> = Vec::new();
        let mut last: Option<(&Arc<str>, usize)> = None;
        for key in keys {
            let at = match last {
                Some((copy, at)) if Arc::ptr_eq(copy, &key.cluster) => at,
                _ => match counts.iter().position(|(c, _)| *c == key.cluster) {
                    Some(at) => at,
                    None => {
                        counts.push((self.adopt(&key.cluster), 0));
                        counts.len() - 1
                    }
                },
            };
            last = Some((&key.cluster, at));
            if let Some((_, n)) = counts.get_mut(at) {
                *n += 1;
            }
        }
        for (cluster, n) in counts {
            self.jobs.reserve(&cluster, n);
        }
    }

    /// The shared copy of `cluster`'s name; `cluster` itself becomes it if
    /// there is none yet (restored keys keep the copy they were decoded
    /// with).
    pub fn adopt(&mut self, cluster: &Arc<str>) -> Arc<str> {
        match self.clusters.get(&**cluster) {
            Some(c) => c.clone(),
            None => {
                self.clusters.insert(cluster.clone());
                self.cluster_budget.note(cluster);
                cluster.clone()
            }
        }
    }

    /// Apply one record; `default_cluster` keys records that name none.
    pub fn apply(&mut self, default_cluster: &str, record: Record) -> Effects {
        let cluster = self.intern(record.cluster.as_deref().unwrap_or(default_cluster));
        let key = record.id.map(|id| JobKey {
            cluster: cluster.clone(),
            id,
        });
        self.apply_keyed(&cluster, key.as_ref(), record)
    }

    /// [`State::apply`] for a caller that holds the record's key already:
    /// see [`State::apply_keyed_into`].
    pub fn apply_keyed(&mut self, cluster: &str, key: Option<&JobKey>, record: Record) -> Effects {
        let mut fx = Effects::default();
        self.apply_keyed_into(cluster, key, record, &mut fx);
        fx
    }

    /// [`State::apply`] for a caller that holds the record's key already
    /// (a processor, which interned the cluster's name to admit the
    /// record, and built the key from its id): nothing looked up twice, and
    /// a job's key cloned only where it is kept (a new job, a transition).
    /// Its effects are written into `fx` (empty) where the caller keeps
    /// them: no copy of them returned.
    pub fn apply_keyed_into(
        &mut self,
        cluster: &str,
        key: Option<&JobKey>,
        record: Record,
        fx: &mut Effects,
    ) {
        self.counts.records += 1;
        match (record.stream, key) {
            (EventStream::Resource, _) => self.apply_resource(cluster, record.body, fx),
            (stream, Some(key)) => self.apply_job(key, stream, record.body, fx),
            (stream, None) => {
                // Only a journal sentinel has no job id; it marks the end of
                // the backlog and changes nothing.
                if record.body != Body::Sentinel {
                    fx.anomalies.push(KeyedAnomaly {
                        cluster: cluster.to_string(),
                        id: None,
                        anomaly: Anomaly::new(
                            stream_of(stream),
                            AnomalyKind::UnknownTarget,
                            "record with no job id",
                        ),
                    });
                }
            }
        }
        if fx.duplicate {
            self.counts.duplicates += 1;
        }
        self.counts.anomalies += fx.anomalies.len() as u64;
    }

    fn apply_resource(&mut self, cluster: &str, body: Body, fx: &mut Effects) {
        if !self.resources.contains_key(cluster) {
            self.resources
                .insert(cluster.to_string(), ResourceState::default());
        }
        let Some(res) = self.resources.get_mut(cluster) else {
            return;
        };
        // Held while the event is applied: room taken is room counted.
        let mut held = self.rank_budget.lock();
        let before = res.rank_count();
        res.set_rank_room(
            self.rank_budget
                .max
                .saturating_sub(held.saturating_sub(before)),
        );
        let applied = match body {
            Body::Event(ev) => {
                let applied = res.apply(&ev);
                fx.event = Some((ev.name, ev.timestamp));
                applied
            }
            Body::R(r) => res.apply_r(&r.to_value()),
            Body::Sentinel | Body::ExecResponse(_) | Body::JobSpec(..) | Body::User(_) => return,
        };
        *held = held.saturating_sub(before) + res.rank_count();
        drop(held);
        fx.duplicate = applied.skipped_duplicate;
        let mut changes = applied.changes;
        if !changes.is_empty() || self.allocations.with(|a| a.is_flipped(cluster)) {
            self.refresh_cluster(cluster, Some(&mut changes), &mut fx.rank_changes);
        }
        fx.anomalies
            .extend(applied.anomalies.into_iter().map(|a| KeyedAnomaly {
                cluster: cluster.to_string(),
                id: None,
                anomaly: a,
            }));
    }

    fn apply_job(&mut self, key: &JobKey, stream: EventStream, body: Body, fx: &mut Effects) {
        // Looked up by reference: the key's name is not counted again
        // for a job already held (nearly every record).
        let (entry, before) = match self.jobs.get_mut(key) {
            Some(entry) => {
                let before = Standing::of(key.id, &entry.job);
                (entry, Some(before))
            }
            None => (self.jobs.get_or_insert_default(key), None),
        };
        let mut anomalies = Vec::new();
        // Whether the job's ranks are counted held: a new R may name other
        // ranks, so the old ones are given back first.
        let mut counted = entry.job.holds_ranks();
        let mut recounted = false;
        if counted && matches!(body, Body::R(_)) {
            self.allocations
                .count(&key.cluster, &entry.job, false, None);
            (counted, recounted) = (false, true);
        }
        match (stream, body) {
            (EventStream::Job, Body::Event(ev)) => {
                let applied = entry.job.apply(&ev);
                fx.duplicate = applied.duplicate;
                anomalies.extend(applied.anomalies);
                if let Some(t) = applied.transition {
                    fx.transitions.push(KeyedTransition {
                        key: key.clone(),
                        transition: t,
                    });
                }
                fx.event = Some((ev.name, ev.timestamp));
            }
            (EventStream::Job, Body::R(r)) => entry.job.apply_r(&r),
            (EventStream::Job, Body::User(name)) => entry.job.set_username(name),
            (EventStream::Job, Body::JobSpec(read)) => {
                let crate::decode::JobSpecRead { spec, error, .. } = *read;
                entry.job.apply_jobspec(spec);
                if let Some(e) = error {
                    anomalies.push(Anomaly::new(
                        Stream::Job,
                        AnomalyKind::Malformed,
                        e.to_string(),
                    ));
                }
            }
            (EventStream::Exec, Body::Event(ev)) => {
                let applied = entry.exec_log_mut().apply(&ev);
                fx.duplicate = applied.skipped_duplicate;
                anomalies.extend(applied.anomalies);
            }
            (EventStream::Exec, Body::ExecResponse(resp)) => {
                anomalies.extend(entry.protocol_mut().apply(&resp));
            }
            _ => {}
        }
        entry.cross_check(&mut anomalies);
        let job_event = match (stream, &fx.event) {
            (EventStream::Job, Some((_, t))) => Some(*t),
            _ => None,
        };
        let after = Standing::of(key.id, &entry.job);
        self.listing
            .update(&key.cluster, before, Some(after), job_event);
        let holds = entry.job.holds_ranks();
        if holds != counted {
            let at = fx.event.as_ref().map(|(_, t)| *t);
            self.allocations.count(&key.cluster, &entry.job, holds, at);
            recounted = true;
        }
        if recounted && self.resources.contains_key(&*key.cluster) {
            self.refresh_cluster(&key.cluster, None, &mut fx.rank_changes);
        }
        // Most records have none.
        if !anomalies.is_empty() {
            fx.anomalies
                .extend(anomalies.into_iter().map(|a| KeyedAnomaly {
                    cluster: key.cluster.to_string(),
                    id: Some(key.id),
                    anomaly: a,
                }));
        }
    }

    pub fn listing(&self) -> &Listing {
        &self.listing
    }

    /// Jobs to list: submitted and not invalidated, sorted by key.
    pub fn listed_jobs(&self) -> Vec<(JobKey, &JobEntry)> {
        let mut jobs: Vec<(JobKey, &JobEntry)> = self
            .jobs
            .iter()
            .filter(|(_, e)| e.job.submitted && !e.job.invalidated)
            .map(|(k, e)| (k.to_key(), e))
            .collect();
        jobs.sort_by(|a, b| a.0.cmp(&b.0));
        jobs
    }

    /// Clusters with resource state, sorted by name.
    pub fn clusters(&self) -> Vec<(&String, &ResourceState)> {
        let mut c: Vec<_> = self.resources.iter().collect();
        c.sort_by(|a, b| a.0.cmp(b.0));
        c
    }

    /// Anomalies that only the end of the input reveals: exec events of
    /// jobs that never got a submit.
    pub fn finish(&self) -> Vec<KeyedAnomaly> {
        let mut out: Vec<KeyedAnomaly> = self
            .jobs
            .iter()
            .filter(|(_, e)| !e.job.submitted && e.exec_log().is_some_and(|x| x.event_count() > 0))
            .map(|(k, _)| KeyedAnomaly {
                cluster: k.cluster.to_string(),
                id: Some(k.id),
                anomaly: Anomaly::new(
                    Stream::Exec,
                    AnomalyKind::UnknownTarget,
                    "exec eventlog for a job whose primary eventlog was never seen",
                ),
            })
            .collect();
        out.sort_by(|a, b| (&a.cluster, a.id).cmp(&(&b.cluster, b.id)));
        out
    }
}

fn stream_of(s: EventStream) -> Stream {
    match s {
        EventStream::Job => Stream::Job,
        EventStream::Exec => Stream::Exec,
        EventStream::Resource => Stream::Resource,
    }
}

impl JobEntry {
    /// The job's summary.
    pub fn summary(&self) -> JobSummary {
        self.job.summary()
    }

    /// The job's `finish` status is stated three times: by the exec
    /// eventlog's `complete` (RFC 50), by the exec service's `finish`
    /// response (RFC 32) and by the job eventlog (RFC 21). They must agree.
    /// Each pair is compared once, as soon as both sides are known.
    fn cross_check(&mut self, anomalies: &mut Vec<Anomaly>) {
        let Some(finish) = self.job.waitstatus() else {
            return;
        };
        if !self.exec_checked
            && let Some(complete) = self.exec_log().and_then(ExecLog::complete_status)
        {
            self.exec_checked = true;
            if complete != finish {
                anomalies.push(Anomaly::new(
                    Stream::Exec,
                    AnomalyKind::InvalidContext,
                    format!(
                        "exec complete status {complete} differs from the job's finish status {finish}"
                    ),
                ));
            }
        }
        if !self.protocol_checked
            && let Some(status) = self.protocol().and_then(ExecProtocol::finish_status)
        {
            self.protocol_checked = true;
            if status != finish {
                anomalies.push(Anomaly::new(
                    Stream::ExecProtocol,
                    AnomalyKind::InvalidContext,
                    format!(
                        "exec service finish status {status} differs from the job's finish status {finish}"
                    ),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Format, Origin, decode_line};

    /// Apply journal lines (job or resource) to `state` as cluster `c`;
    /// the rank changes they made, as (rank, draining).
    fn feed(state: &mut State, lines: &[String]) -> Vec<(u32, bool)> {
        let mut out = Vec::new();
        for line in lines {
            let decoded = decode_line(line.as_bytes(), &Origin::default(), Format::Auto);
            assert!(decoded.errors.is_empty(), "{line}: {:?}", decoded.errors);
            for record in decoded.records {
                let fx = state.apply("c", record);
                assert!(fx.anomalies.is_empty(), "{line}: {:?}", fx.anomalies);
                out.extend(
                    fx.rank_changes
                        .into_iter()
                        .filter_map(|(_, ch)| ch.after.map(|a| (a.rank, a.draining))),
                );
            }
        }
        out
    }

    fn resource(name: &str, ts: f64, ctx: &str) -> String {
        format!(r#"{{"events":[{{"timestamp":{ts},"name":"{name}","context":{ctx}}}]}}"#)
    }

    fn job(id: u64, name: &str, ts: f64, ctx: &str) -> String {
        format!(r#"{{"id":{id},"events":[{{"timestamp":{ts},"name":"{name}","context":{ctx}}}]}}"#)
    }

    /// A job's lines from submit to RUN on `ranks`, then to its `free`.
    fn job_lines(id: u64, t: f64, ranks: &str) -> (Vec<String>, Vec<String>) {
        let mut run = vec![
            job(
                id,
                "submit",
                t,
                r#"{"userid":1,"urgency":16,"flags":0,"version":1}"#,
            ),
            job(id, "validate", t + 0.1, "{}"),
            job(id, "depend", t + 0.2, "{}"),
            job(id, "priority", t + 0.3, r#"{"priority":1}"#),
        ];
        run.push(format!(
            r#"{{"id":{id},"events":[{{"timestamp":{},"name":"alloc","context":{{}}}}],"R":{{"version":1,"execution":{{"R_lite":[{{"rank":"{ranks}","children":{{"core":"0"}}}}],"nodelist":["n"]}}}}}}"#,
            t + 0.4
        ));
        let end = vec![
            job(id, "finish", t + 1.0, r#"{"status":0}"#),
            job(id, "release", t + 1.1, r#"{"ranks":"all","final":true}"#),
            job(id, "free", t + 1.2, "{}"),
            job(id, "clean", t + 1.3, "{}"),
        ];
        (run, end)
    }

    fn instance() -> Vec<String> {
        vec![resource(
            "restart",
            1.0,
            r#"{"ranks":"0-3","online":"0-3","nodelist":"n[0-3]"}"#,
        )]
    }

    fn rank(state: &State, r: u32) -> (bool, bool) {
        let s = state.resources["c"].rank(r).unwrap();
        (s.drained, s.draining)
    }

    #[test]
    fn a_drained_rank_is_draining_while_a_job_holds_it() {
        let mut st = State::new();
        feed(&mut st, &instance());
        let (run, end) = job_lines(7, 10.0, "1-2");
        assert_eq!(feed(&mut st, &run), []);
        let drain = resource(
            "drain",
            20.0,
            r#"{"idset":"2-3","reason":"r","overwrite":0}"#,
        );
        assert_eq!(feed(&mut st, &[drain]), [(2, true), (3, false)]);
        assert_eq!((rank(&st, 2), rank(&st, 3)), ((true, true), (true, false)));
        // the job's free gives rank 2 back: drained, no longer draining
        let changes = feed(&mut st, &end);
        assert_eq!(changes, [(2, false)]);
        assert_eq!(rank(&st, 2), (true, false));
        // draining again under a new job, and an undrain clears both
        let (run, _) = job_lines(8, 30.0, "2");
        assert_eq!(feed(&mut st, &run), [(2, true)]);
        let undrain = resource("undrain", 40.0, r#"{"idset":"2"}"#);
        feed(&mut st, &[undrain]);
        assert_eq!(rank(&st, 2), (false, false));
    }

    #[test]
    fn restored_jobs_are_made_room_for_under_the_shared_name() {
        let mut st = State::new();
        // Interned first (a restore puts resources back before jobs).
        let shared = st.intern("c");
        // Decoded on two threads: two other copies, alternating by part.
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("c"), Arc::from("c"));
        let keys: Vec<JobKey> = (0..3000u64)
            .map(|i| JobKey {
                cluster: if (i / 1000) % 2 == 0 {
                    a.clone()
                } else {
                    b.clone()
                },
                id: JobId(i),
            })
            .collect();
        st.reserve_jobs(&keys);
        let (name, room) = st.jobs.cluster_room("c").expect("a table for c");
        assert!(Arc::ptr_eq(name, &shared), "named by the shared copy");
        assert!(room >= 3000, "room for every run, not the largest: {room}");
        for k in keys {
            st.insert_job(k, Box::default());
        }
        assert_eq!(st.jobs.len(), 3000);
        let live = JobKey {
            cluster: shared,
            id: JobId(2999),
        };
        assert!(st.jobs.contains_key(&live));
    }

    #[test]
    fn jobs_of_another_part_make_draining_at_the_next_refresh() {
        let shared = SharedAllocations::default();
        let (mut jobs, mut res) = (State::new(), State::new());
        jobs.share_allocations(shared.clone());
        res.share_allocations(shared);
        feed(&mut res, &instance());
        feed(&mut res, &[resource("drain", 5.0, r#"{"idset":"0-1"}"#)]);
        let (run, end) = job_lines(9, 10.0, "1");
        feed(&mut jobs, &run);
        assert_eq!(rank(&res, 1), (true, false), "not before it looks");
        let changed: Vec<(u32, bool)> = res
            .refresh_draining()
            .into_iter()
            .map(|(_, c)| (c.rank, c.after.unwrap().draining))
            .collect();
        assert_eq!(changed, [(1, true)]);
        assert!(res.refresh_draining().is_empty(), "each flip is seen once");
        feed(&mut jobs, &end);
        assert_eq!(res.refresh_draining().len(), 1);
        assert_eq!(rank(&res, 1), (true, false));
        // a job dropped from its part (revoked) gives its ranks back too
        let (run, _) = job_lines(10, 20.0, "0");
        feed(&mut jobs, &run);
        res.refresh_draining();
        assert_eq!(rank(&res, 0), (true, true));
        let key = JobKey {
            cluster: jobs.intern("c"),
            id: JobId(10),
        };
        assert!(jobs.remove_job(&key).is_some());
        res.refresh_draining();
        assert_eq!(rank(&res, 0), (true, false));
        // and one restored holds them again
        let (run, _) = job_lines(11, 30.0, "0");
        let mut other = State::new();
        feed(&mut other, &run);
        let key = JobKey {
            cluster: other.intern("c"),
            id: JobId(11),
        };
        let entry = other.remove_job(&key).unwrap();
        jobs.insert_job(key, entry);
        res.refresh_draining();
        assert_eq!(rank(&res, 0), (true, true));
    }

    fn draining_flips(res: &mut State) -> Vec<(u32, bool)> {
        res.refresh_draining()
            .into_iter()
            .map(|(_, c)| (c.rank, c.after.unwrap().draining))
            .collect()
    }

    /// Another part's job takes and gives back a drained rank between two
    /// looks (a backlog read at once): it was draining in between if the
    /// drain came before the free, and never if after.
    #[test]
    fn a_rank_taken_and_given_back_between_looks_was_draining_if_drained_first() {
        let shared = SharedAllocations::default();
        let (mut jobs, mut res) = (State::new(), State::new());
        jobs.share_allocations(shared.clone());
        res.share_allocations(shared);
        feed(&mut res, &instance());
        // drained at 10.5, while job 9 held rank 1 (10.4 to 11.2)
        let (run, end) = job_lines(9, 10.0, "1");
        feed(&mut jobs, &run);
        feed(&mut jobs, &end);
        let drain = resource("drain", 10.5, r#"{"idset":"1"}"#);
        let said: Vec<(u32, bool)> = feed(&mut res, &[drain]);
        assert_eq!(
            said,
            [(1, false), (1, true), (1, false)],
            "the drain, then the job"
        );
        assert_eq!(rank(&res, 1), (true, false));
        assert!(draining_flips(&mut res).is_empty(), "said once");
        // the same, with the look after the drain: the refresh says it
        let (run, end) = job_lines(12, 20.0, "1");
        feed(&mut jobs, &run);
        feed(&mut jobs, &end);
        assert_eq!(draining_flips(&mut res), [(1, true), (1, false)]);
        // drained at 30 after a job held rank 2 from 20.4 to 21.2: never
        let (run, end) = job_lines(13, 20.0, "2");
        feed(&mut jobs, &run);
        feed(&mut jobs, &end);
        feed(&mut res, &[resource("drain", 30.0, r#"{"idset":"2"}"#)]);
        assert!(draining_flips(&mut res).is_empty());
        assert_eq!(rank(&res, 2), (true, false));
        // the job's free looked at before the drain arrives (the job's
        // partition ran ahead): the drain, stamped within the hold, says it
        let (run, end) = job_lines(14, 40.0, "3");
        feed(&mut jobs, &run);
        feed(&mut jobs, &end);
        assert!(draining_flips(&mut res).is_empty(), "rank 3 is not drained");
        let drain = resource("drain", 40.5, r#"{"idset":"3"}"#);
        assert_eq!(
            feed(&mut res, &[drain]),
            [(3, false), (3, true), (3, false)]
        );
        assert!(draining_flips(&mut res).is_empty(), "said once");
    }

    /// A job restored as ended (its process died) still tells a drain
    /// applied later that it held the rank then; a restored resource state
    /// that already had the drain says nothing again.
    #[test]
    fn a_restored_job_tells_a_later_drain_it_held_the_rank() {
        let shared = SharedAllocations::default();
        let (mut jobs, mut res) = (State::new(), State::new());
        jobs.share_allocations(shared.clone());
        res.share_allocations(shared);
        feed(&mut res, &instance());
        let mut before = State::new();
        let (run, end) = job_lines(9, 10.0, "1");
        feed(&mut before, &run);
        feed(&mut before, &end);
        let key = JobKey {
            cluster: before.intern("c"),
            id: JobId(9),
        };
        let entry = before.remove_job(&key).unwrap();
        jobs.insert_job(key, entry);
        assert!(draining_flips(&mut res).is_empty());
        let drain = resource("drain", 10.5, r#"{"idset":"1"}"#);
        assert_eq!(
            feed(&mut res, &[drain]),
            [(1, false), (1, true), (1, false)]
        );
        res.recheck_draining();
        assert!(
            draining_flips(&mut res).is_empty(),
            "not again at a restart"
        );
    }

    /// A restored resource state whose saved draining is older than the
    /// holds says the difference at the next look, not silently.
    #[test]
    fn a_restored_state_says_what_its_saved_draining_missed() {
        let shared = SharedAllocations::default();
        let (mut jobs, mut res) = (State::new(), State::new());
        jobs.share_allocations(shared.clone());
        feed(&mut res, &instance());
        feed(&mut res, &[resource("drain", 5.0, r#"{"idset":"1"}"#)]);
        let (run, _) = job_lines(9, 10.0, "1");
        feed(&mut jobs, &run);
        // restored beside the job's part: drained, saved not draining
        let mut restored = State::new();
        restored.share_allocations(shared);
        restored.resources = std::mem::take(&mut res.resources);
        restored.recheck_draining();
        assert_eq!(rank(&restored, 1), (true, false), "not before it looks");
        assert_eq!(draining_flips(&mut restored), [(1, true)]);
    }

    #[test]
    fn ranks_read_from_a_kvs_eventlog_alone_are_unknown_not_offline() {
        let mut st = State::new();
        let log = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/corpus/instances/A-incarnation1/resource.eventlog"
        ))
        .unwrap();
        let origin = Origin {
            stream: Some(EventStream::Resource),
            id: None,
        };
        for line in log.lines() {
            for record in decode_line(line.as_bytes(), &origin, Format::Auto).records {
                st.apply("c", record);
            }
        }
        let res = &st.resources["c"];
        assert!(res.ranks().count() > 0);
        assert!(res.ranks().all(|r| r.online.is_none()));
        let status = res.status_json();
        assert_eq!(
            (status["online"].as_str(), status["offline"].as_str()),
            (Some(""), Some(""))
        );
        assert_eq!(
            status["unknown"],
            serde_json::json!(res.unknown().to_string())
        );
        // the journal's restart says, and from then on it is known
        feed(
            &mut st,
            &[resource(
                "restart",
                2e9,
                r#"{"ranks":"0-3","online":"0","nodelist":"node[0-3]"}"#,
            )],
        );
        let res = &st.resources["c"];
        assert_eq!(res.rank(0).unwrap().online, Some(true));
        assert_eq!(res.rank(1).unwrap().online, Some(false));
        assert!(res.status_json().get("unknown").is_none());
    }

    /// The exec log and the service's responses share a box but are saved
    /// as two fields, each absent while the job has none of it.
    #[test]
    fn an_entrys_exec_side_is_saved_and_read_back_part_by_part() {
        let start = crate::flux::exec::ExecResponse::from_message(
            &serde_json::json!({"id": 1, "type": "start", "data": {}}),
        )
        .unwrap()
        .1;
        let mut only_protocol = JobEntry::default();
        only_protocol.protocol_mut().apply(&start);
        let mut both = only_protocol.clone();
        both.exec_log_mut()
            .apply(&crate::flux::Event::new(1.0, "init"));
        // The form entries were saved in while each had a box of its own.
        #[derive(Serialize)]
        struct Before<'a> {
            job: &'a Job,
            exec: Option<Box<ExecLog>>,
            protocol: Option<Box<ExecProtocol>>,
            exec_checked: bool,
            protocol_checked: bool,
            owner: &'a Option<Box<Owner>>,
            ended_at: u32,
        }
        for (entry, log, protocol) in [
            (JobEntry::default(), false, false),
            (only_protocol, false, true),
            (both, true, true),
        ] {
            let bytes = rmp_serde::to_vec(&entry).unwrap();
            let before = Before {
                job: &entry.job,
                exec: entry.exec_log().cloned().map(Box::new),
                protocol: entry.protocol().cloned().map(Box::new),
                exec_checked: entry.exec_checked,
                protocol_checked: entry.protocol_checked,
                owner: &entry.owner,
                ended_at: entry.ended_at,
            };
            assert_eq!(bytes, rmp_serde::to_vec(&before).unwrap(), "the same bytes");
            let back: JobEntry = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(back.exec_log().is_some(), log);
            assert_eq!(back.protocol().is_some(), protocol);
            assert_eq!(back.exec.is_some(), log || protocol);
            assert_eq!(format!("{:?}", back.exec), format!("{:?}", entry.exec));
            // Seven fields, as before the two shared a box.
            assert_eq!(bytes[0], 0x97);
        }
    }

    /// A job's entry, its first alert condition inline, is one allocation
    /// per active job: it stays within jemalloc's 192-byte class (it took
    /// 256 while the job kept its rare parts inline).
    #[test]
    fn a_job_entry_fits_its_allocation_class() {
        assert!(
            std::mem::size_of::<JobEntry>() <= 192,
            "{}",
            std::mem::size_of::<JobEntry>()
        );
    }
}

/// The README's table of what an active job holds: its sizes in bold are
/// the types' sizes, so the table stays true as the types change.
#[cfg(test)]
mod footprint {
    use std::mem::size_of;

    #[test]
    fn the_readmes_memory_table_holds_the_types_sizes() {
        let readme = include_str!("../../README.md");
        let table = readme
            .split("## What an active job costs in memory")
            .nth(1)
            .and_then(|t| t.split("\n## ").next())
            .unwrap_or_default();
        let bold = |row: &str| -> Vec<usize> {
            let line = table
                .lines()
                .find(|l| l.starts_with(&format!("| {row} ")))
                .unwrap_or_else(|| panic!("no row {row}"));
            line.split("**")
                .skip(1)
                .step_by(2)
                .filter_map(|n| n.parse().ok())
                .collect()
        };
        // Each cluster's table holds the entry's box alone; the id is in
        // the entry.
        let key = size_of::<crate::flux::jobid::JobId>();
        let slot = size_of::<Box<super::JobEntry>>();
        let want: [(&str, Vec<usize>); 7] = [
            ("`JobEntry`, boxed", vec![size_of::<super::JobEntry>()]),
            ("of which `Job`", vec![size_of::<crate::flux::job::Job>()]),
            ("its rare parts, boxed", vec![crate::flux::job::RARE_BYTES]),
            (
                "of which `Conditions`",
                vec![size_of::<super::Conditions>()],
            ),
            ("a slot of the job table", vec![slot, key]),
            (
                "`JobSpec`, boxed",
                vec![size_of::<crate::flux::jobspec::JobSpec>()],
            ),
            (
                "a pending alert's timer",
                vec![crate::keyed::alerts::engine::TIMER_SLOT_BYTES],
            ),
        ];
        for (row, sizes) in want {
            assert_eq!(bold(row), sizes, "README.md's row `{row}`");
        }
        let exec = table
            .split("(`ExecLog`, **")
            .nth(1)
            .and_then(|t| t.split("**").next())
            .and_then(|n| n.parse().ok());
        assert_eq!(exec, Some(size_of::<crate::flux::exec::ExecLog>()));
        // The exec log and the pointer to the exec service's responses
        // share one 96-byte allocation.
        assert_eq!(size_of::<super::ExecSide>(), 96);
    }
}
