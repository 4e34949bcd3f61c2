//! Usage reports over the archive's finished jobs (`fluxpipe report
//! jobs`): what `sreport` answers for one Slurm cluster, across clusters.
//! One row per group (any of cluster, queue, user, day, week, month) of
//! the jobs that ended in a window: counts by result, core-, GPU- and
//! node-hours, waits and run times. Pure: the caller feeds the rows
//! ([`super::Archive::finished_jobs`] streams them) one by one, so a
//! report holds one accumulator per group, not the jobs.

use super::rollup::{RollupKey, RollupSums};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use thiserror::Error;

/// What a report reads of one finished job (a row of `jobs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinishedJob {
    pub cluster: String,
    pub queue: Option<String>,
    pub userid: Option<i64>,
    /// As Flux's side resolved it (`None`: none was sent).
    pub username: Option<String>,
    /// `COMPLETED`, `FAILED`, `CANCELED` or `TIMEOUT`.
    pub result: Option<String>,
    pub t_submit: Option<f64>,
    pub t_run: Option<f64>,
    pub t_cleanup: Option<f64>,
    pub t_inactive: f64,
    pub ncores: Option<i64>,
    pub ngpus: Option<i64>,
    pub nnodes: Option<i64>,
}

impl FinishedJob {
    /// How long it waited to run (`t_run − t_submit`), if it ran.
    pub fn wait(&self) -> Option<f64> {
        match (self.t_submit, self.t_run) {
            (Some(s), Some(r)) if r > 0.0 && r >= s => Some(r - s),
            _ => None,
        }
    }

    /// How long it ran (`t_cleanup − t_run`, as `flux jobs` computes
    /// runtime), if it ran.
    pub fn runtime(&self) -> Option<f64> {
        match (self.t_run, self.t_cleanup) {
            (Some(r), Some(c)) if r > 0.0 && c >= r => Some(c - r),
            _ => None,
        }
    }
}

/// What rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Cluster,
    Queue,
    User,
    Day,
    Week,
    Month,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReportError {
    #[error("unknown grouping `{0}`: expected cluster, queue, user, day, week or month")]
    GroupBy(String),
    #[error("`{0}` is given twice in --by")]
    Repeated(String),
    #[error("unknown field `{0}` to sort by")]
    Sort(String),
}

impl GroupBy {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Cluster => "cluster",
            GroupBy::Queue => "queue",
            GroupBy::User => "user",
            GroupBy::Day => "day",
            GroupBy::Week => "week",
            GroupBy::Month => "month",
        }
    }

    /// `cluster,user,month`: comma-separated, in the order the columns
    /// come.
    pub fn parse_list(text: &str) -> Result<Vec<GroupBy>, ReportError> {
        let mut out = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let by = match word.to_ascii_lowercase().as_str() {
                "cluster" => GroupBy::Cluster,
                "queue" => GroupBy::Queue,
                "user" => GroupBy::User,
                "day" => GroupBy::Day,
                "week" => GroupBy::Week,
                "month" => GroupBy::Month,
                _ => return Err(ReportError::GroupBy(word.to_string())),
            };
            if out.contains(&by) {
                return Err(ReportError::Repeated(word.to_string()));
            }
            out.push(by);
        }
        Ok(out)
    }
}

/// The numeric fields of a row, in the order they are printed.
pub const FIELDS: [&str; 13] = [
    "jobs",
    "completed",
    "failed",
    "canceled",
    "timeout",
    "core_hours",
    "gpu_hours",
    "node_hours",
    "wait_mean_s",
    "wait_p50_s",
    "wait_p90_s",
    "wait_max_s",
    "run_mean_s",
];

/// One group's sums so far: a rollup's, and from rows every wait
/// (exact percentiles need them all: 8 bytes a job that ran).
#[derive(Debug, Default)]
struct Sums {
    totals: RollupSums,
    waits: Vec<f64>,
}

/// A group's key: one value per grouping, in `--by`'s order (`None`: the
/// jobs had none, as a job with no queue).
type Key = Vec<Option<KeyPart>>;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum KeyPart {
    Text(String),
    /// A user: the uid (the name rides in the sums).
    Uid(i64),
}

/// A report being made.
#[derive(Debug)]
pub struct Report {
    by: Vec<GroupBy>,
    tz: jiff::tz::TimeZone,
    groups: BTreeMap<Key, Sums>,
}

impl Report {
    /// Group by `by` (none: one row for everything), days in `tz`.
    pub fn new(by: Vec<GroupBy>, tz: jiff::tz::TimeZone) -> Self {
        Report {
            by,
            tz,
            groups: BTreeMap::new(),
        }
    }

    /// The date of `t` in the report's time zone.
    fn date(&self, t: f64) -> Option<jiff::civil::Date> {
        let ts = jiff::Timestamp::from_microsecond((t * 1e6) as i64).ok()?;
        Some(ts.to_zoned(self.tz.clone()).date())
    }

    fn key(&self, job: &FinishedJob) -> Key {
        let date = self.date(job.t_inactive);
        let iso = |d: Option<jiff::civil::Date>| d.map(|d| KeyPart::Text(d.to_string()));
        self.by
            .iter()
            .map(|by| match by {
                GroupBy::Cluster => Some(KeyPart::Text(job.cluster.clone())),
                GroupBy::Queue => job.queue.clone().map(KeyPart::Text),
                // By name when Flux's side sent one (the same person on
                // every cluster), else by uid.
                GroupBy::User => match (&job.username, job.userid) {
                    (Some(name), _) => Some(KeyPart::Text(name.clone())),
                    (None, Some(uid)) => Some(KeyPart::Uid(uid)),
                    (None, None) => None,
                },
                GroupBy::Day => iso(date),
                // The week's Monday (ISO 8601 weeks).
                GroupBy::Week => iso(date.and_then(|d| {
                    let back = i64::from(d.weekday().to_monday_zero_offset());
                    d.checked_sub(jiff::Span::new().days(back)).ok()
                })),
                GroupBy::Month => iso(date.map(|d| d.first_of_month())),
            })
            .collect()
    }

    /// Count one job in its group.
    pub fn add(&mut self, job: &FinishedJob) {
        let key = self.key(job);
        let s = self.groups.entry(key).or_default();
        s.totals.add(job);
        s.waits.extend(job.wait());
    }

    /// Count a day's rollup in its group (the report's days must be UTC
    /// ones: see [`super::rollup`]).
    pub fn add_rollup(&mut self, key: &RollupKey, sums: &RollupSums) {
        let (username, userid) = key.user();
        let job = FinishedJob {
            cluster: key.cluster.clone(),
            queue: key.queue().map(str::to_string),
            username: username.map(str::to_string),
            userid: userid.or(sums.userid),
            t_inactive: key.day as f64,
            ..FinishedJob::default()
        };
        let key = self.key(&job);
        self.groups.entry(key).or_default().totals.merge(sums);
    }

    /// The rows, in key order: JSON objects with the group's keys first
    /// (`user` as a name with `userid`; dates as ISO dates), then
    /// [`FIELDS`]. A user with no name from Flux's side is named by
    /// `local_name` (this host's accounts), if it knows the uid.
    pub fn rows(self, local_name: impl Fn(i64) -> Option<String>) -> Vec<Map<String, Value>> {
        let by = self.by;
        self.groups
            .into_iter()
            .map(|(key, mut s)| {
                let mut row = Map::new();
                for (g, part) in by.iter().zip(key) {
                    match (g, part) {
                        (GroupBy::User, Some(KeyPart::Text(name))) => {
                            row.insert("user".into(), json!(name));
                            row.insert("userid".into(), json!(s.totals.userid));
                        }
                        (GroupBy::User, Some(KeyPart::Uid(uid))) => {
                            row.insert("user".into(), json!(local_name(uid)));
                            row.insert("userid".into(), json!(uid));
                        }
                        (GroupBy::User, None) => {
                            row.insert("user".into(), Value::Null);
                            row.insert("userid".into(), Value::Null);
                        }
                        (g, Some(KeyPart::Text(t))) => {
                            row.insert(g.as_str().into(), json!(t));
                        }
                        (g, _) => {
                            row.insert(g.as_str().into(), Value::Null);
                        }
                    }
                }
                let t = &s.totals;
                let mean = |sum: f64, n: i64| (n > 0).then(|| sum / n as f64);
                row.insert("jobs".into(), json!(t.jobs));
                row.insert("completed".into(), json!(t.completed));
                row.insert("failed".into(), json!(t.failed));
                row.insert("canceled".into(), json!(t.canceled));
                row.insert("timeout".into(), json!(t.timeout));
                row.insert("core_hours".into(), json!(t.core_seconds / 3600.0));
                row.insert("gpu_hours".into(), json!(t.gpu_seconds / 3600.0));
                row.insert("node_hours".into(), json!(t.node_seconds / 3600.0));
                row.insert("wait_mean_s".into(), json!(mean(t.wait_sum, t.waits)));
                // Exact from rows; from rollups, to their buckets.
                let (p50, p90) = if s.waits.is_empty() {
                    (
                        bucket_rank(&t.wait_buckets, 0.5),
                        bucket_rank(&t.wait_buckets, 0.9),
                    )
                } else {
                    s.waits.sort_by(f64::total_cmp);
                    (nearest_rank(&s.waits, 0.5), nearest_rank(&s.waits, 0.9))
                };
                row.insert("wait_p50_s".into(), json!(p50));
                row.insert("wait_p90_s".into(), json!(p90));
                row.insert("wait_max_s".into(), json!(t.wait_max));
                row.insert("run_mean_s".into(), json!(mean(t.run_sum, t.runs)));
                row
            })
            .collect()
    }
}

/// The `p` quantile of sorted values by the nearest-rank method (the
/// smallest value with at least `p` of them at or below it).
fn nearest_rank(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// The `p` quantile by nearest rank of waits counted per bucket (of
/// milliseconds), in seconds.
fn bucket_rank(buckets: &BTreeMap<u64, i64>, p: f64) -> Option<f64> {
    let n: i64 = buckets.values().sum();
    if n <= 0 {
        return None;
    }
    let rank = ((p * n as f64).ceil() as i64).clamp(1, n);
    let mut seen = 0;
    buckets.iter().find_map(|(&ms, &count)| {
        seen += count;
        (seen >= rank).then_some(ms as f64 / 1000.0)
    })
}

/// Sort rows by a numeric field, largest first (ties keep key order).
pub fn sort_rows(rows: &mut [Map<String, Value>], field: &str) -> Result<(), ReportError> {
    if !FIELDS.contains(&field) {
        return Err(ReportError::Sort(field.to_string()));
    }
    let get = |r: &Map<String, Value>| r.get(field).and_then(Value::as_f64).unwrap_or(f64::MIN);
    rows.sort_by(|a, b| get(b).total_cmp(&get(a)));
    Ok(())
}

/// One change of a node's state (a row of `node_events`): its state after.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeChange {
    pub cluster: String,
    pub rank: i64,
    pub hostname: Option<String>,
    pub timestamp: f64,
    pub drained: Option<bool>,
    pub online: Option<bool>,
    pub drain_reason: Option<String>,
}

/// What flux-core's own drains say caused them: its perilog plugin's
/// `epilog failed for job ƒ…` (or `timed out`), and the housekeeping
/// unit's `housekeeping@… failure`.
fn drain_cause(reason: &str) -> Option<&'static str> {
    if reason.starts_with("epilog ") {
        Some("epilog")
    } else if reason.starts_with("prolog ") {
        Some("prolog")
    } else if reason.starts_with("housekeeping") {
        Some("housekeeping")
    } else {
        None
    }
}

/// One node's sums over the window.
#[derive(Debug, Default)]
struct NodeSums {
    hostname: Option<String>,
    /// Since when it is drained (offline), if it is now.
    drained_at: Option<f64>,
    offline_at: Option<f64>,
    drains: u64,
    drained_s: f64,
    last_drain_reason: Option<String>,
    last_drain_at: Option<f64>,
    offline_episodes: u64,
    offline_s: f64,
    after_epilog: u64,
    after_prolog: u64,
    after_housekeeping: u64,
}

/// A drain report being made (`fluxpipe report nodes`): per node, its
/// drain episodes (one starts when an undrained node is drained; a drain
/// that updates the reason of a drained node is the same episode) and
/// outages that began in the window, and the time it spent drained and
/// offline within it. Changes must come in time order per node.
#[derive(Debug)]
pub struct NodeReport {
    since: f64,
    until: f64,
    nodes: BTreeMap<(String, i64), NodeSums>,
}

impl NodeReport {
    /// Over `[since, until)`; changes before `since` set the state the
    /// window starts in.
    pub fn new(since: Option<f64>, until: f64) -> Self {
        NodeReport {
            since: since.unwrap_or(f64::NEG_INFINITY),
            until,
            nodes: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, c: &NodeChange) {
        if c.timestamp >= self.until {
            return;
        }
        let in_window = c.timestamp >= self.since;
        let (since, until) = (self.since, self.until);
        let overlap = |from, to| overlap(since, until, from, to);
        let n = self.nodes.entry((c.cluster.clone(), c.rank)).or_default();
        if c.hostname.is_some() {
            n.hostname.clone_from(&c.hostname);
        }
        match c.drained {
            Some(true) => {
                if n.drained_at.is_none() {
                    n.drained_at = Some(c.timestamp);
                    if in_window {
                        n.drains += 1;
                        match c.drain_reason.as_deref().and_then(drain_cause) {
                            Some("epilog") => n.after_epilog += 1,
                            Some("prolog") => n.after_prolog += 1,
                            Some(_) => n.after_housekeeping += 1,
                            None => {}
                        }
                    }
                }
                n.last_drain_reason.clone_from(&c.drain_reason);
                n.last_drain_at = Some(c.timestamp);
            }
            Some(false) => {
                if let Some(at) = n.drained_at.take() {
                    n.drained_s += overlap(at, c.timestamp);
                }
            }
            None => {}
        }
        match c.online {
            Some(false) if n.offline_at.is_none() => {
                n.offline_at = Some(c.timestamp);
                n.offline_episodes += u64::from(in_window);
            }
            Some(true) => {
                if let Some(at) = n.offline_at.take() {
                    n.offline_s += overlap(at, c.timestamp);
                }
            }
            _ => {}
        }
    }

    /// The rows, the longest drained first (then by cluster and rank):
    /// nodes with nothing in the window are left out.
    pub fn rows(self) -> Vec<Map<String, Value>> {
        let (since, until) = (self.since, self.until);
        let mut rows: Vec<(f64, Map<String, Value>)> = Vec::new();
        for ((cluster, rank), mut n) in self.nodes {
            // What is still open runs to the end of the window.
            if let Some(at) = n.drained_at {
                n.drained_s += overlap(since, until, at, until);
            }
            if let Some(at) = n.offline_at {
                n.offline_s += overlap(since, until, at, until);
            }
            if n.drains == 0 && n.drained_s == 0.0 && n.offline_episodes == 0 && n.offline_s == 0.0
            {
                continue;
            }
            let mut row = Map::new();
            row.insert("cluster".into(), json!(cluster));
            row.insert("node".into(), json!(n.hostname));
            row.insert("rank".into(), json!(rank));
            row.insert("drains".into(), json!(n.drains));
            row.insert("drained_s".into(), json!(n.drained_s));
            row.insert("last_drain_reason".into(), json!(n.last_drain_reason));
            row.insert("last_drain_at".into(), json!(n.last_drain_at));
            row.insert("drains_after_epilog".into(), json!(n.after_epilog));
            row.insert("drains_after_prolog".into(), json!(n.after_prolog));
            row.insert(
                "drains_after_housekeeping".into(),
                json!(n.after_housekeeping),
            );
            row.insert("offline_episodes".into(), json!(n.offline_episodes));
            row.insert("offline_s".into(), json!(n.offline_s));
            rows.push((n.drained_s, row));
        }
        // Stable: ties keep cluster and rank order.
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
        rows.into_iter().map(|(_, r)| r).collect()
    }
}

/// The part of `[from, to)` inside the window `[since, until)`.
fn overlap(since: f64, until: f64, from: f64, to: f64) -> f64 {
    (to.min(until) - from.max(since)).max(0.0)
}

/// The columns of a node report, in order.
pub const NODE_COLUMNS: [&str; 12] = [
    "cluster",
    "node",
    "rank",
    "drains",
    "drained_s",
    "last_drain_reason",
    "last_drain_at",
    "drains_after_epilog",
    "drains_after_prolog",
    "drains_after_housekeeping",
    "offline_episodes",
    "offline_s",
];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn job(cluster: &str, user: Option<&str>, uid: i64, result: &str, t: [f64; 4]) -> FinishedJob {
        FinishedJob {
            cluster: cluster.into(),
            queue: Some("batch".into()),
            userid: Some(uid),
            username: user.map(String::from),
            result: Some(result.into()),
            t_submit: Some(t[0]),
            t_run: (t[1] > 0.0).then_some(t[1]),
            t_cleanup: (t[2] > 0.0).then_some(t[2]),
            t_inactive: t[3],
            ncores: Some(4),
            ngpus: Some(1),
            nnodes: Some(2),
        }
    }

    #[test]
    fn groups_add_up_as_sreport_would() {
        let utc = jiff::tz::TimeZone::UTC;
        let mut r = Report::new(GroupBy::parse_list("cluster,user").unwrap(), utc);
        // 2026-11-02 (a Monday) 00:00 UTC = 1_793_577_600.
        let d = 1_793_577_600.0;
        // alice: ran 1 h on 4 cores, waited 60 s; and one canceled pending.
        r.add(&job(
            "a",
            Some("alice"),
            1000,
            "COMPLETED",
            [d, d + 60.0, d + 3660.0, d + 3661.0],
        ));
        r.add(&job(
            "a",
            Some("alice"),
            1000,
            "CANCELED",
            [d, 0.0, 0.0, d + 10.0],
        ));
        // uid 1001 with no name: grouped by uid, named here by the fallback.
        r.add(&job(
            "a",
            None,
            1001,
            "FAILED",
            [d, d + 30.0, d + 1830.0, d + 1831.0],
        ));
        r.add(&job(
            "b",
            Some("alice"),
            7,
            "TIMEOUT",
            [d, d + 10.0, d + 20.0, d + 21.0],
        ));
        let rows = r.rows(|uid| (uid == 1001).then(|| "bob-local".to_string()));
        assert_eq!(rows.len(), 3);
        let a_alice = &rows[0];
        assert_eq!(a_alice["cluster"], "a");
        assert_eq!(a_alice["user"], "alice");
        assert_eq!(a_alice["jobs"], 2);
        assert_eq!(a_alice["completed"], 1);
        assert_eq!(a_alice["canceled"], 1);
        assert_eq!(a_alice["core_hours"], 4.0);
        assert_eq!(a_alice["gpu_hours"], 1.0);
        assert_eq!(a_alice["node_hours"], 2.0);
        assert_eq!(a_alice["wait_p50_s"], 60.0);
        assert_eq!(a_alice["run_mean_s"], 3600.0);
        let a_1001 = &rows[1];
        assert_eq!(
            (&a_1001["user"], &a_1001["userid"]),
            (&json!("bob-local"), &json!(1001))
        );
        assert_eq!(a_1001["failed"], 1);
        assert_eq!(rows[2]["cluster"], "b");
        assert_eq!(rows[2]["timeout"], 1);
    }

    #[test]
    fn periods_are_iso_dates_in_the_time_zone() {
        let d = 1_793_577_600.0 + 2.0 * 86400.0 + 3600.0; // Wed 2026-11-04 01:00 UTC
        let mut utc = Report::new(
            GroupBy::parse_list("day,week,month").unwrap(),
            jiff::tz::TimeZone::UTC,
        );
        utc.add(&job("a", None, 1, "COMPLETED", [d, d, d, d]));
        let row = &utc.rows(|_| None)[0];
        assert_eq!(row["day"], "2026-11-04");
        assert_eq!(row["week"], "2026-11-02");
        assert_eq!(row["month"], "2026-11-01");
        // Two hours behind UTC it is still the 3rd.
        let tz = jiff::tz::TimeZone::fixed(jiff::tz::offset(-2));
        let mut west = Report::new(GroupBy::parse_list("day").unwrap(), tz);
        west.add(&job("a", None, 1, "COMPLETED", [d, d, d, d]));
        assert_eq!(west.rows(|_| None)[0]["day"], "2026-11-03");
    }

    #[test]
    fn groupings_and_sorts_are_checked() {
        assert!(matches!(
            GroupBy::parse_list("cluster,nodes"),
            Err(ReportError::GroupBy(_))
        ));
        assert!(matches!(
            GroupBy::parse_list("user,user"),
            Err(ReportError::Repeated(_))
        ));
        assert_eq!(GroupBy::parse_list("").unwrap(), Vec::new());
        let mut rows = vec![Map::new()];
        assert!(sort_rows(&mut rows, "core_hours").is_ok());
        assert!(sort_rows(&mut rows, "bogus").is_err());
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 0.5), Some(5.0));
        assert_eq!(nearest_rank(&v, 0.9), Some(9.0));
        assert_eq!(nearest_rank(&v[..1], 0.9), Some(1.0));
        assert_eq!(nearest_rank(&[], 0.5), None);
    }

    fn change(
        rank: i64,
        t: f64,
        drained: Option<bool>,
        online: Option<bool>,
        reason: &str,
    ) -> NodeChange {
        NodeChange {
            cluster: "c".into(),
            rank,
            hostname: Some(format!("n{rank}")),
            timestamp: t,
            drained,
            online,
            drain_reason: (!reason.is_empty()).then(|| reason.to_string()),
        }
    }

    #[test]
    fn drain_episodes_and_outages_within_the_window() {
        // Window [100, 200).
        let mut r = NodeReport::new(Some(100.0), 200.0);
        // Rank 0: drained before the window (not an episode of it, but its
        // time inside counts), undrained at 110; drained again at 150 by a
        // failed epilog, its reason updated at 160 (the same episode),
        // still drained at the end.
        r.add(&change(0, 50.0, Some(true), Some(true), "bad disk"));
        r.add(&change(0, 110.0, Some(false), Some(true), ""));
        r.add(&change(
            0,
            150.0,
            Some(true),
            Some(true),
            "epilog failed for job f1",
        ));
        r.add(&change(0, 160.0, Some(true), Some(true), "replaced DIMM"));
        // Rank 1: offline 120..130, then housekeeping drained 190..250.
        r.add(&change(1, 120.0, Some(false), Some(false), ""));
        r.add(&change(1, 130.0, Some(false), Some(true), ""));
        r.add(&change(
            1,
            190.0,
            Some(true),
            Some(true),
            "housekeeping@f2 failure: exit-code 1",
        ));
        r.add(&change(1, 250.0, Some(false), Some(true), ""));
        // Rank 2: nothing in the window.
        r.add(&change(2, 10.0, Some(false), Some(true), ""));
        let rows = r.rows();
        assert_eq!(rows.len(), 2);
        let (a, b) = (&rows[0], &rows[1]);
        assert_eq!(a["rank"], 0);
        assert_eq!(a["drains"], 1);
        assert_eq!(a["drained_s"], 10.0 + 50.0);
        assert_eq!(a["last_drain_reason"], "replaced DIMM");
        assert_eq!(a["last_drain_at"], 160.0);
        assert_eq!(a["drains_after_epilog"], 1);
        assert_eq!(b["rank"], 1);
        assert_eq!(b["node"], "n1");
        assert_eq!(b["drained_s"], 10.0);
        assert_eq!(b["drains_after_housekeeping"], 1);
        assert_eq!(b["offline_episodes"], 1);
        assert_eq!(b["offline_s"], 10.0);
    }

    proptest! {
        /// However jobs are grouped, the groups' counts and hours add up
        /// to the whole; nothing panics on odd times.
        #[test]
        fn groups_add_up_to_the_whole(
            jobs in proptest::collection::vec(
                (0u8..3, 0i64..4, 0u8..4, -1e10f64..1e10, 0f64..1e6, 0f64..1e6), 0..60),
            by in "(cluster|queue|user|day|week|month)(,(cluster|user|day)){0,1}",
        ) {
            let by = match GroupBy::parse_list(&by) { Ok(b) => b, Err(_) => return Ok(()) };
            let results = ["COMPLETED", "FAILED", "CANCELED", "TIMEOUT"];
            let mut grouped = Report::new(by, jiff::tz::TimeZone::UTC);
            let mut whole = Report::new(Vec::new(), jiff::tz::TimeZone::UTC);
            for (c, uid, res, t, wait, run) in jobs {
                let j = FinishedJob {
                    cluster: format!("c{c}"),
                    userid: Some(uid),
                    result: Some(results[res as usize].into()),
                    t_submit: Some(t),
                    t_run: Some(t + wait),
                    t_cleanup: Some(t + wait + run),
                    t_inactive: t + wait + run,
                    ncores: Some(2),
                    ..FinishedJob::default()
                };
                grouped.add(&j);
                whole.add(&j);
            }
            let sum = |rows: &[Map<String, Value>], f: &str| -> f64 {
                rows.iter().map(|r| r[f].as_f64().unwrap_or(0.0)).sum()
            };
            let (g, w) = (grouped.rows(|_| None), whole.rows(|_| None));
            prop_assert!(w.len() <= 1);
            for f in ["jobs", "completed", "failed", "canceled", "timeout"] {
                prop_assert_eq!(sum(&g, f), sum(&w, f));
            }
            let (a, b) = (sum(&g, "core_hours"), sum(&w, "core_hours"));
            prop_assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0));
        }
    }
}
