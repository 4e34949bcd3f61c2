//! Questions asked of the keyed state while it runs (the query API of
//! `fluxpipe run`): which jobs are held, one job, each cluster's counts.
//! Each part of the state (a shard) answers for its own jobs and ranks; the
//! asker merges the parts. Pure: no I/O, no async.
//!
//! Jobs come in the order `flux jobs` lists them: pending first (highest
//! priority first), then running (newest start first), then
//! inactive (newest end first); ties by cluster and id, so the order is
//! total and a page can start after any job ([`Position`]).

use super::JobKey;
pub use super::alerts::firing::AlertPosition;
use super::listing::{ClusterJobs, InGroup, Place};
use super::state::State;
use crate::flux::job::{Job, JobState};
use crate::flux::jobid::JobId;
use crate::flux::queues::QueueConfig;
use crate::flux::resource::NodeCount;
use crate::flux::user::UserMatch;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, btree_set};
use std::ops::Bound;
use std::sync::Arc;
use thiserror::Error;

/// The states listed first (pending, and NEW), then those listed as
/// running; inactive jobs come last.
const PENDING_GROUP: [JobState; 4] = [
    JobState::New,
    JobState::Depend,
    JobState::Priority,
    JobState::Sched,
];
const RUNNING_GROUP: [JobState; 2] = [JobState::Run, JobState::Cleanup];

/// Which jobs a listing takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobFilter {
    pub cluster: Option<String>,
    /// States taken, by [`JobState::index`] bit; `None`: all.
    pub states: Option<u8>,
    /// Whose jobs: by uid, or by name (see [`UserMatch`]).
    pub user: Option<UserMatch>,
    /// Jobs active at or after this time: still active, or inactive since.
    pub since: Option<f64>,
    pub id: Option<JobId>,
    pub queue: Option<QueueFilter>,
}

/// Jobs of some queues, as `flux jobs -q` takes them: a job whose queue
/// is asked for, or is a virtual queue whose parent is (RFC 33, per the
/// cluster's `[queues]` table).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueFilter {
    /// The names asked for: what a cluster with no table sent takes.
    asked: Vec<String>,
    /// Per cluster whose table is known, every name it takes.
    by_cluster: BTreeMap<String, Vec<String>>,
}

impl QueueFilter {
    /// `asked` (comma-separated names) resolved against each cluster's
    /// table.
    pub fn new<'a>(
        asked: &str,
        tables: impl IntoIterator<Item = (&'a str, &'a QueueConfig)>,
    ) -> Self {
        let asked: Vec<String> = asked
            .split(',')
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .map(String::from)
            .collect();
        let by_cluster = tables
            .into_iter()
            .map(|(cluster, table)| {
                let mut names: Vec<String> = asked
                    .iter()
                    .flat_map(|a| table.expand(a))
                    .map(String::from)
                    .collect();
                names.sort();
                names.dedup();
                (cluster.to_string(), names)
            })
            .collect();
        QueueFilter { asked, by_cluster }
    }

    /// Whether a job of `cluster` in `queue` (none: the anonymous queue,
    /// which no name takes) is taken.
    pub fn takes(&self, cluster: &str, queue: Option<&str>) -> bool {
        let Some(queue) = queue else {
            return false;
        };
        self.by_cluster
            .get(cluster)
            .unwrap_or(&self.asked)
            .iter()
            .any(|q| q == queue)
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum QueryError {
    #[error(
        "unknown state `{0}`; expected a state name (depend, priority, sched, run, cleanup, inactive, new) or pending, running, active, inactive"
    )]
    State(String),
    #[error("bad position `{0}`")]
    Position(String),
}

impl JobFilter {
    /// States by name or group, as `flux jobs --filter`: comma-separated,
    /// any case (`pending,run`).
    pub fn parse_states(text: &str) -> Result<u8, QueryError> {
        let bit = |s: JobState| 1u8 << s.index();
        let pending = bit(JobState::Depend) | bit(JobState::Priority) | bit(JobState::Sched);
        let running = bit(JobState::Run) | bit(JobState::Cleanup);
        let mut bits = 0;
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            bits |= match word.to_ascii_lowercase().as_str() {
                "pending" => pending,
                "running" => running,
                "active" => pending | running,
                name => JobState::ALL
                    .into_iter()
                    .find(|s| s.as_str().eq_ignore_ascii_case(name))
                    .map(bit)
                    .ok_or_else(|| QueryError::State(word.to_string()))?,
            };
        }
        Ok(bits)
    }

    /// The groups of the listing ([`Place::group`]) that hold states this
    /// filter takes, by bit.
    fn groups(&self) -> u8 {
        let Some(states) = self.states else {
            return 0b111;
        };
        let of = |g: &[JobState]| g.iter().any(|s| states & (1 << s.index()) != 0);
        u8::from(of(&PENDING_GROUP))
            | u8::from(of(&RUNNING_GROUP)) << 1
            | u8::from(of(&[JobState::Inactive])) << 2
    }

    /// Whether a job's group and cluster alone decide what this filter
    /// takes (no look at the job itself).
    /// Of a cluster's `jobs`: states it holds no job in count as taken
    /// (`state=pending` leaves NEW jobs out; a cluster with none is read
    /// by place).
    fn takes_by_place(&self, jobs: &ClusterJobs) -> bool {
        let whole = |g: &[JobState], states: u8| {
            let taken = |s: &JobState| states & (1 << s.index()) != 0;
            let held = |s: &JobState| jobs.by_state[s.index()] > 0;
            g.iter().all(|s| taken(s) || !held(s)) || !g.iter().any(taken)
        };
        self.user.is_none()
            && self.since.is_none()
            && self.queue.is_none()
            && self
                .states
                .is_none_or(|b| whole(&PENDING_GROUP, b) && whole(&RUNNING_GROUP, b))
    }

    /// Whether this filter takes the job.
    pub fn takes(&self, key: &JobKey, job: &Job) -> bool {
        let s = job.summary_view();
        self.cluster.as_deref().is_none_or(|c| *key.cluster == *c)
            && self.id.is_none_or(|id| id == key.id)
            && self.states.is_none_or(|b| b & (1 << s.state.index()) != 0)
            && self
                .user
                .as_ref()
                .is_none_or(|u| u.matches(s.userid, job.username()))
            && self.since.is_none_or(|t| {
                s.state != JobState::Inactive || s.t_inactive.is_some_and(|i| i >= t)
            })
            && self
                .queue
                .as_ref()
                .is_none_or(|q| q.takes(&key.cluster, job.queue()))
    }
}

/// A job's place in the listing order (see the module's doc): its place
/// within its cluster, and the cluster, which orders ties on the primary.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    pub place: Place,
    /// Shared with the job's key: a position costs no copy of the name
    /// (a page makes one for every job it looks at).
    pub cluster: Arc<str>,
}

impl Eq for Position {}

impl Ord for Position {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (&self.place, &other.place);
        a.group
            .cmp(&b.group)
            .then(a.in_group().0.cmp(&b.in_group().0))
            .then_with(|| self.cluster.cmp(&other.cluster))
            .then(a.id.cmp(&b.id))
    }
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Position {
    pub fn of(key: &JobKey, job: &Job) -> Self {
        Position::at(&key.cluster, &Place::of(key.id, job))
    }

    /// A cluster's place.
    pub fn at(cluster: &Arc<str>, place: &Place) -> Self {
        Position {
            place: *place,
            cluster: cluster.clone(),
        }
    }

    /// As text, for the `next` of a page: opaque to the client.
    pub fn encode(&self) -> String {
        format!(
            "{}.{:x}.{:x}.{}",
            self.place.group,
            self.place.primary().to_bits(),
            self.place.id,
            self.cluster
        )
    }

    pub fn decode(text: &str) -> Result<Self, QueryError> {
        let bad = || QueryError::Position(text.to_string());
        let mut parts = text.splitn(4, '.');
        let mut next = || parts.next().ok_or_else(bad);
        let group = next()?.parse().map_err(|_| bad())?;
        let primary = f64::from_bits(u64::from_str_radix(next()?, 16).map_err(|_| bad())?);
        let id = u64::from_str_radix(next()?, 16).map_err(|_| bad())?;
        let cluster = next()?.into();
        Ok(Position {
            place: Place::new(group, primary, id),
            cluster,
        })
    }
}

/// A part's page of jobs.
#[derive(Debug, Default)]
pub struct JobPage {
    pub jobs: Vec<(Position, JobKey)>,
    /// Where this part stopped looking with its page not full and more
    /// left to look at (its work per answer is bounded): jobs after this
    /// place were not looked at, and the next page starts after it.
    pub stopped_at: Option<Position>,
}

/// The most jobs a part looks at for one page beyond the page itself: a
/// narrow filter over many jobs gives a short page (and a `next`), not an
/// answer that holds up the records behind it.
pub const SCAN_BUDGET: usize = 10_000;

/// One cluster's places, from where a page starts, through the groups
/// the filter can take.
struct Cursor<'a> {
    cluster: &'a Arc<str>,
    /// Whether the filter takes this cluster's jobs by their place alone.
    by_place: bool,
    ranges: std::vec::IntoIter<(u8, btree_set::Range<'a, InGroup>)>,
    now: Option<(u8, btree_set::Range<'a, InGroup>)>,
}

impl Iterator for Cursor<'_> {
    type Item = Position;

    fn next(&mut self) -> Option<Position> {
        loop {
            if let Some((group, range)) = self.now.as_mut()
                && let Some(&(primary, id)) = range.next()
            {
                return Some(Position::at(
                    self.cluster,
                    &Place::from_group(*group, (primary, id)),
                ));
            }
            self.now = Some(self.ranges.next()?);
        }
    }
}

impl<'a> Cursor<'a> {
    fn new(
        cluster: &'a Arc<str>,
        jobs: &'a ClusterJobs,
        filter: &JobFilter,
        after: Option<&Position>,
    ) -> Self {
        let groups = filter.groups();
        let mut ranges = Vec::new();
        for group in (0..Place::GROUPS).filter(|g| groups & (1 << g) != 0) {
            let start = match after {
                Some(a) if a.place.group > group => continue,
                // Ties on the primary order by cluster, then id.
                Some(a) if a.place.group == group => {
                    let (primary, id) = a.place.in_group();
                    match (**cluster).cmp(&*a.cluster) {
                        Ordering::Less => Bound::Excluded((primary, u64::MAX)),
                        Ordering::Equal => Bound::Excluded((primary, id)),
                        Ordering::Greater => Bound::Included((primary, 0)),
                    }
                }
                _ => Bound::Unbounded,
            };
            let end = match filter.since {
                // Inactive since: ended at or after it.
                Some(t) if group == 2 => {
                    Bound::Included((Place::new(group, -t, 0).in_group().0, u64::MAX))
                }
                _ => Bound::Unbounded,
            };
            if nonempty(&start, &end) {
                ranges.push((group, jobs.group(group).range((start, end))));
            }
        }
        Cursor {
            cluster,
            by_place: filter.takes_by_place(jobs),
            ranges: ranges.into_iter(),
            now: None,
        }
    }
}

/// Whether a range's bounds are in order (`BTreeSet::range` panics if not).
fn nonempty<T: Ord>(start: &Bound<T>, end: &Bound<T>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s <= e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e)) => s < e,
        _ => true,
    }
}

/// The first `limit` jobs the filter takes after `after`, in order: read
/// from the listing (a range per cluster, merged), looking at no more than
/// `budget` jobs beyond the page.
pub fn select_jobs(
    state: &State,
    filter: &JobFilter,
    after: Option<&Position>,
    limit: usize,
    budget: usize,
) -> JobPage {
    let mut page = JobPage::default();
    if limit == 0 {
        return page;
    }
    let listing = state.listing();
    // One job, when asked by id: a look in each cluster.
    if let Some(id) = filter.id {
        let mut found: Vec<(Position, JobKey)> = listing
            .clusters()
            .filter(|(c, _)| filter.cluster.as_deref().is_none_or(|want| ***c == *want))
            .filter_map(|(c, _)| {
                let key = JobKey {
                    cluster: c.clone(),
                    id,
                };
                let entry = state.jobs.get(&key)?;
                filter
                    .takes(&key, &entry.job)
                    .then(|| (Position::of(&key, &entry.job), key))
            })
            .filter(|(p, _)| after.is_none_or(|a| p > a))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found.truncate(limit);
        page.jobs = found;
        return page;
    }
    let clusters: Vec<(&Arc<str>, &ClusterJobs)> = match filter.cluster.as_deref() {
        Some(c) => listing.cluster(c).into_iter().collect(),
        None => listing.clusters().collect(),
    };
    let mut cursors: Vec<Cursor> = clusters
        .into_iter()
        .map(|(c, jobs)| Cursor::new(c, jobs, filter, after))
        .collect();
    // The next place of each cluster, the least on top.
    let mut heads: BinaryHeap<Reverse<(Position, usize)>> = cursors
        .iter_mut()
        .enumerate()
        .filter_map(|(i, c)| Some(Reverse((c.next()?, i))))
        .collect();
    let mut looked = 0usize;
    while let Some(Reverse((pos, i))) = heads.pop() {
        if let Some(next) = cursors[i].next() {
            heads.push(Reverse((next, i)));
        }
        if after.is_some_and(|a| pos <= *a) {
            continue;
        }
        let key = JobKey {
            cluster: pos.cluster.clone(),
            id: JobId(pos.place.id),
        };
        let taken = cursors[i].by_place
            || state
                .jobs
                .get(&key)
                .is_some_and(|e| filter.takes(&key, &e.job));
        if taken {
            page.jobs.push((pos, key));
            if page.jobs.len() == limit {
                return page;
            }
        } else {
            looked += 1;
            if looked >= budget {
                if !heads.is_empty() {
                    page.stopped_at = Some(pos);
                }
                return page;
            }
        }
    }
    page
}

/// What one cluster has, as far as this part of the state knows.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ClusterCounts {
    /// Jobs held per state name.
    pub jobs: BTreeMap<&'static str, u64>,
    /// Ranks per state: `online`, `offline`, `unknown`, `drained`,
    /// `draining`, `torpid` (a rank may count in several).
    pub nodes: BTreeMap<&'static str, u64>,
    /// The newest event time seen in this cluster's jobs and ranks.
    pub newest_event: Option<f64>,
    /// The cluster's event clock (the newest event time of any record
    /// read for it), which times its alerts.
    pub clock: Option<f64>,
    /// The pending job submitted first (of the least id: flux's ids grow
    /// with the time of submission): its id and submit time.
    pub oldest_pending: Option<(u64, f64)>,
    /// Since when the whole instance is down (`instance-down` until its
    /// next `restart`), if it is.
    pub instance_down_since: Option<f64>,
}

impl ClusterCounts {
    /// Add another part's counts.
    pub fn merge(&mut self, other: &ClusterCounts) {
        for (k, v) in &other.jobs {
            *self.jobs.entry(k).or_default() += v;
        }
        for (k, v) in &other.nodes {
            *self.nodes.entry(k).or_default() += v;
        }
        self.newest_event = newer(self.newest_event, other.newest_event);
        self.clock = newer(self.clock, other.clock);
        self.oldest_pending = older_job(self.oldest_pending, other.oldest_pending);
        self.instance_down_since = self.instance_down_since.or(other.instance_down_since);
    }
}

/// The later of two times, either of which may be unknown.
fn newer(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Of two jobs (id, submit time), the one submitted first: of the least
/// id, as each part picks its own.
fn older_job(a: Option<(u64, f64)>, b: Option<(u64, f64)>) -> Option<(u64, f64)> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Every cluster's counts in this part of the state: the jobs' from the
/// listing (kept as records apply), the ranks' counted.
pub fn cluster_counts(state: &State) -> BTreeMap<String, ClusterCounts> {
    let mut out: BTreeMap<String, ClusterCounts> = BTreeMap::new();
    for (cluster, jobs) in state.listing().clusters() {
        let c = out.entry(cluster.to_string()).or_default();
        for s in JobState::ALL {
            let n = jobs.by_state[s.index()];
            if n > 0 {
                c.jobs.insert(s.as_str(), n);
            }
        }
        c.newest_event = jobs.newest_event;
        c.oldest_pending = jobs.first_pending().and_then(|id| {
            let key = JobKey {
                cluster: cluster.clone(),
                id: JobId(id),
            };
            let t = state.jobs.get(&key)?.job.t_submit.get()?;
            Some((id, t))
        });
    }
    for (cluster, res) in &state.resources {
        let c = out.entry(cluster.clone()).or_default();
        for r in res.ranks() {
            for k in NodeCount::ALL.into_iter().filter(|k| k.holds(r)) {
                *c.nodes.entry(k.as_str()).or_default() += 1;
            }
        }
        c.newest_event = newer(c.newest_event, res.last_timestamp());
        c.instance_down_since = res.down_since();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Body, EventStream, Record};
    use crate::flux::event::Event;
    use proptest::prelude::*;

    fn job_event(state: &mut State, cluster: &str, id: u64, t: f64, name: &str, ctx: &str) {
        let record = Record {
            cluster: Some(cluster.into()),
            id: Some(JobId(id)),
            stream: EventStream::Job,
            body: Body::Event(
                Event::parse(&format!(
                    r#"{{"timestamp":{t},"name":"{name}","context":{ctx}}}"#
                ))
                .unwrap(),
            ),
        };
        state.apply("c", record);
    }

    /// c: 1 pending (priority 5), 2 pending (priority 9), 3 running
    /// (since 20), 4 running (since 30), 5 inactive (at 40); d: 6 pending.
    fn sample() -> State {
        let mut s = State::new();
        for (cluster, id) in [("c", 1), ("c", 2), ("c", 3), ("c", 4), ("c", 5), ("d", 6)] {
            job_event(
                &mut s,
                cluster,
                id,
                id as f64,
                "submit",
                r#"{"userid":7,"urgency":16,"flags":0,"version":1}"#,
            );
            job_event(&mut s, cluster, id, id as f64 + 0.1, "validate", "{}");
            job_event(&mut s, cluster, id, id as f64 + 0.2, "depend", "{}");
        }
        for (id, p) in [(1, 5), (2, 9), (3, 1), (4, 1), (5, 1)] {
            job_event(
                &mut s,
                "c",
                id,
                10.0,
                "priority",
                &format!(r#"{{"priority":{p}}}"#),
            );
        }
        job_event(&mut s, "d", 6, 10.0, "priority", r#"{"priority":1}"#);
        for (id, t) in [(3, 20.0), (4, 30.0), (5, 35.0)] {
            job_event(&mut s, "c", id, t, "alloc", "{}");
            job_event(&mut s, "c", id, t + 0.1, "start", "{}");
        }
        job_event(&mut s, "c", 5, 39.0, "finish", r#"{"status":0}"#);
        job_event(
            &mut s,
            "c",
            5,
            39.5,
            "release",
            r#"{"ranks":"all","final":true}"#,
        );
        job_event(&mut s, "c", 5, 39.6, "free", "{}");
        job_event(&mut s, "c", 5, 40.0, "clean", "{}");
        s
    }

    fn ids(page: &[(Position, JobKey)]) -> Vec<u64> {
        page.iter().map(|(_, k)| k.id.0).collect()
    }

    #[test]
    fn jobs_come_in_flux_jobs_order() {
        let s = sample();
        let all = select_jobs(&s, &JobFilter::default(), None, 100, usize::MAX).jobs;
        // pending by priority (9, 5, 1 on c and d), running newest first, inactive.
        assert_eq!(ids(&all), [2, 1, 6, 4, 3, 5]);
        let pending = JobFilter {
            states: Some(JobFilter::parse_states("pending").unwrap()),
            cluster: Some("c".into()),
            ..JobFilter::default()
        };
        assert_eq!(
            ids(&select_jobs(&s, &pending, None, 100, usize::MAX).jobs),
            [2, 1]
        );
        let since = JobFilter {
            since: Some(41.0),
            ..JobFilter::default()
        };
        assert!(!ids(&select_jobs(&s, &since, None, 100, usize::MAX).jobs).contains(&5));
    }

    #[test]
    fn pages_join_up_to_the_whole_listing() {
        let s = sample();
        let all = select_jobs(&s, &JobFilter::default(), None, 100, usize::MAX).jobs;
        let mut paged = Vec::new();
        let mut after: Option<Position> = None;
        loop {
            let page = select_jobs(&s, &JobFilter::default(), after.as_ref(), 2, usize::MAX).jobs;
            let Some((last, _)) = page.last() else { break };
            // A position survives being written out and read back.
            after = Some(Position::decode(&last.encode()).unwrap());
            paged.extend(ids(&page));
        }
        assert_eq!(paged, ids(&all));
    }

    #[test]
    fn one_job_by_cluster_and_id() {
        let s = sample();
        let f = JobFilter {
            cluster: Some("c".into()),
            id: Some(JobId(4)),
            ..JobFilter::default()
        };
        assert_eq!(ids(&select_jobs(&s, &f, None, 10, usize::MAX).jobs), [4]);
        let f = JobFilter {
            id: Some(JobId(4)),
            ..JobFilter::default()
        };
        assert_eq!(ids(&select_jobs(&s, &f, None, 10, usize::MAX).jobs), [4]);
    }

    #[test]
    fn states_parse_by_name_and_group() {
        let b = |s: JobState| 1u8 << s.index();
        assert_eq!(
            JobFilter::parse_states("run,CLEANUP").unwrap(),
            b(JobState::Run) | b(JobState::Cleanup)
        );
        assert_eq!(
            JobFilter::parse_states("running").unwrap(),
            b(JobState::Run) | b(JobState::Cleanup)
        );
        assert!(JobFilter::parse_states("active").unwrap() & b(JobState::Inactive) == 0);
        assert_eq!(
            JobFilter::parse_states("bogus"),
            Err(QueryError::State("bogus".into()))
        );
    }

    #[test]
    fn counts_per_cluster() {
        let counts = cluster_counts(&sample());
        assert_eq!(counts["c"].jobs["SCHED"], 2);
        assert_eq!(counts["c"].jobs["RUN"], 2);
        assert_eq!(counts["c"].jobs["INACTIVE"], 1);
        assert_eq!(counts["c"].newest_event, Some(40.0));
        assert_eq!(counts["d"].jobs.values().sum::<u64>(), 1);
        // Jobs 1 and 2 pend on c; 1 was submitted first.
        assert_eq!(counts["c"].oldest_pending, Some((1, 1.0)));
        assert_eq!(counts["d"].oldest_pending, Some((6, 6.0)));
        let mut merged = counts["c"].clone();
        merged.merge(&counts["d"]);
        assert_eq!(merged.oldest_pending, Some((1, 1.0)));
    }

    /// What a pass over every job answers (the listing must agree).
    fn scan(s: &State, filter: &JobFilter) -> Vec<(Position, JobKey)> {
        let mut all: Vec<(Position, JobKey)> = s
            .jobs
            .iter()
            .map(|(k, e)| (k.to_key(), e))
            .filter(|(k, e)| filter.takes(k, &e.job))
            .map(|(k, e)| (Position::of(&k, &e.job), k))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Jobs on two clusters, each taken through the first `steps` of its
    /// life (`steps[i] = (cluster, userid, priority, steps, time)`); some
    /// taken out and put back.
    fn workload(jobs: &[(bool, i64, i64, usize, u16)], out: &[usize]) -> State {
        let mut s = State::new();
        let life = [
            ("validate", "{}".to_string()),
            ("depend", "{}".to_string()),
            ("priority", String::new()),
            ("alloc", "{}".to_string()),
            ("start", "{}".to_string()),
            ("finish", r#"{"status":0}"#.to_string()),
            ("release", r#"{"ranks":"all","final":true}"#.to_string()),
            ("free", "{}".to_string()),
            ("clean", "{}".to_string()),
        ];
        for (i, &(d, user, prio, steps, t)) in jobs.iter().enumerate() {
            let cluster = if d { "d" } else { "c" };
            let id = i as u64;
            let t = f64::from(t) + 1.0;
            let submit = format!(r#"{{"userid":{user},"urgency":16,"flags":0,"version":1}}"#);
            job_event(&mut s, cluster, id, t, "submit", &submit);
            for (n, (name, ctx)) in life.iter().take(steps).enumerate() {
                let ctx = if *name == "priority" {
                    format!(r#"{{"priority":{prio}}}"#)
                } else {
                    ctx.clone()
                };
                job_event(&mut s, cluster, id, t + n as f64 + 1.0, name, &ctx);
            }
        }
        for &i in out {
            let key = JobKey {
                cluster: if jobs[i % jobs.len()].0 { "d" } else { "c" }.into(),
                id: JobId((i % jobs.len()) as u64),
            };
            // Taken out; every other one put back.
            if let Some(entry) = s.remove_job(&key)
                && i % 2 == 0
            {
                s.insert_job(key, entry);
            }
        }
        s
    }

    fn filter_of(
        cluster: u8,
        states: Option<u8>,
        userid: Option<i64>,
        since: Option<u16>,
    ) -> JobFilter {
        JobFilter {
            cluster: match cluster {
                1 => Some("c".into()),
                2 => Some("d".into()),
                _ => None,
            },
            states: states.map(|b| b & 0x7f),
            user: userid.map(UserMatch::Id),
            since: since.map(f64::from),
            id: None,
            queue: None,
        }
    }

    #[test]
    fn a_queue_takes_its_virtual_queues_where_the_table_says_so() {
        let table = QueueConfig::from_value(&serde_json::json!({
            "batch": {}, "fast": {"parent": "batch"}, "debug": {}
        }))
        .unwrap();
        let f = QueueFilter::new("batch", [("c", &table)]);
        assert!(f.takes("c", Some("batch")));
        assert!(f.takes("c", Some("fast")));
        assert!(!f.takes("c", Some("debug")));
        assert!(!f.takes("c", None), "the anonymous queue has no name");
        // A cluster whose table was never sent: the names as asked.
        assert!(f.takes("d", Some("batch")));
        assert!(!f.takes("d", Some("fast")));
        let f = QueueFilter::new("fast, debug", [("c", &table)]);
        assert!(
            !f.takes("c", Some("batch")),
            "a virtual queue takes only its own"
        );
        assert!(f.takes("c", Some("fast")) && f.takes("c", Some("debug")));
    }

    proptest! {
        /// Page after page, however short the work allowed, the listing
        /// gives what a pass over every job gives; the counts too.
        #[test]
        fn pages_of_the_listing_are_a_scan_of_the_jobs(
            jobs in proptest::collection::vec((any::<bool>(), 1i64..3, 0i64..3, 0usize..10, 0u16..50), 1..40),
            out in proptest::collection::vec(0usize..40, 0..8),
            cluster in 0u8..3,
            states in proptest::option::of(any::<u8>()),
            userid in proptest::option::of(1i64..3),
            since in proptest::option::of(0u16..60),
            limit in 1usize..6,
            budget in 1usize..6,
        ) {
            let s = workload(&jobs, &out);
            let filter = filter_of(cluster, states, userid, since);
            let mut paged = Vec::new();
            let mut after: Option<Position> = None;
            for _ in 0..200 {
                let page = select_jobs(&s, &filter, after.as_ref(), limit, budget);
                let full = page.jobs.len() == limit;
                prop_assert!(page.jobs.len() <= limit);
                if let Some((last, _)) = page.jobs.last() {
                    after = Some(last.clone());
                }
                paged.extend(page.jobs.into_iter().map(|(_, k)| k));
                match page.stopped_at {
                    Some(at) => after = Some(at),
                    None if !full => break,
                    None => {}
                }
            }
            let want: Vec<JobKey> = scan(&s, &filter).into_iter().map(|(_, k)| k).collect();
            prop_assert_eq!(paged, want);
            let counts = cluster_counts(&s);
            for c in ["c", "d"] {
                let mut by_state: BTreeMap<&'static str, u64> = BTreeMap::new();
                let mut oldest = None;
                for (k, e) in s.jobs.iter().filter(|(k, _)| &**k.cluster == c) {
                    *by_state.entry(e.job.state.as_str()).or_default() += 1;
                    if e.job.state.is_pending() {
                        let first = oldest.is_none_or(|(id, _)| k.id.0 < id);
                        if first {
                            oldest = e.job.t_submit.get().map(|t| (k.id.0, t));
                        }
                    }
                }
                let got = counts.get(c).cloned().unwrap_or_default();
                prop_assert_eq!(got.jobs, by_state);
                prop_assert_eq!(got.oldest_pending, oldest);
                // Jobs taken out and put back (a restore) keep their times.
                let newest = s
                    .jobs
                    .iter()
                    .filter(|(k, _)| &**k.cluster == c)
                    .filter_map(|(_, e)| e.job.last_timestamp())
                    .fold(None, |n: Option<f64>, t| Some(n.map_or(t, |n| n.max(t))));
                if out.is_empty() {
                    prop_assert_eq!(got.newest_event, newest);
                }
            }
        }

        #[test]
        fn positions_round_trip(group in 0u8..3, primary in any::<f64>(), id in any::<u64>(), cluster in ".*") {
            let p = Position { place: Place::new(group, primary, id), cluster: cluster.into() };
            let back = Position::decode(&p.encode()).unwrap();
            prop_assert_eq!(p.cmp(&back), Ordering::Equal);
        }

        #[test]
        fn decoding_never_panics(text in ".*") {
            let _ = Position::decode(&text);
            let _ = AlertPosition::decode(&text);
        }

        #[test]
        fn state_lists_never_panic(text in ".*") {
            let _ = JobFilter::parse_states(&text);
        }
    }
}
