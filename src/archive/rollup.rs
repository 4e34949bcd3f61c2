//! Daily rollups: per cluster × UTC day × queue × user, the sums a usage
//! report needs, kept in the archive as jobs finish so that a report over
//! a year reads thousands of rows, not millions, and still answers after
//! the retention has deleted the jobs' own rows.
//!
//! Sums add up across days and groups; percentiles do not, so each
//! rollup keeps how many waits fell in each bucket of 3 significant
//! decimal digits (of milliseconds), as a short text in its row (a table
//! of buckets would hold a row per job for the many small groups). A percentile read from rollups is
//! the row report's, rounded down to 3 significant digits (1% at worst);
//! counts, hours, means and the longest wait are the row report's.
//!
//! Pure: [`super::Archive`] feeds it the jobs it marks as rolled up and
//! writes what it returns.

use super::report::FinishedJob;
use std::collections::BTreeMap;

/// Seconds in a day.
pub const DAY: i64 = 86_400;

/// The UTC day (its first second) of `t`.
pub fn day_of(t: f64) -> i64 {
    (t.floor() as i64).div_euclid(DAY) * DAY
}

/// `ms` rounded down to 3 significant decimal digits: the wait bucket.
pub fn wait_bucket(ms: u64) -> u64 {
    let mut unit = 1;
    while ms / unit >= 1000 {
        unit *= 10;
    }
    ms - ms % unit
}

/// A wait in seconds → milliseconds, for its bucket.
pub fn wait_ms(wait: f64) -> u64 {
    (wait * 1000.0).round().max(0.0) as u64
}

/// Buckets as a rollup row keeps them: `MS:COUNT` pairs, space-separated,
/// by bucket.
pub fn encode_buckets(buckets: &BTreeMap<u64, i64>) -> String {
    let pairs: Vec<String> = buckets.iter().map(|(ms, n)| format!("{ms}:{n}")).collect();
    pairs.join(" ")
}

/// Add the buckets `text` holds to `into`; how many pairs could not be
/// read (none, unless someone edited the row).
pub fn add_buckets(text: &str, into: &mut BTreeMap<u64, i64>) -> usize {
    let mut bad = 0;
    for pair in text.split_ascii_whitespace() {
        match pair
            .split_once(':')
            .and_then(|(ms, n)| Some((ms.parse::<u64>().ok()?, n.parse::<i64>().ok()?)))
        {
            Some((ms, n)) => {
                let count = into.entry(ms).or_default();
                *count = count.saturating_add(n);
            }
            None => bad += 1,
        }
    }
    bad
}

/// Which rollup a job counts in. A job with no queue is in queue `""`; its
/// user is the name Flux's side sent, else `#UID`, else `""` (a report
/// groups users the same way).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RollupKey {
    pub cluster: String,
    /// The UTC day the job ended, as its first second.
    pub day: i64,
    pub queue: String,
    pub user_key: String,
}

impl RollupKey {
    pub fn of(job: &FinishedJob) -> Self {
        RollupKey {
            cluster: job.cluster.clone(),
            day: day_of(job.t_inactive),
            queue: job.queue.clone().unwrap_or_default(),
            user_key: user_key(job.username.as_deref(), job.userid),
        }
    }

    /// The queue, `None` for jobs that had none.
    pub fn queue(&self) -> Option<&str> {
        (!self.queue.is_empty()).then_some(self.queue.as_str())
    }

    /// The user as a report groups it: (name, uid).
    pub fn user(&self) -> (Option<&str>, Option<i64>) {
        match self.user_key.strip_prefix('#') {
            Some(uid) => (None, uid.parse().ok()),
            None if self.user_key.is_empty() => (None, None),
            None => (Some(self.user_key.as_str()), None),
        }
    }
}

/// A user's key in rollups (see [`RollupKey`]).
pub fn user_key(username: Option<&str>, userid: Option<i64>) -> String {
    match (username, userid) {
        (Some(name), _) => name.to_string(),
        (None, Some(uid)) => format!("#{uid}"),
        (None, None) => String::new(),
    }
}

/// One rollup's sums. Hours are kept as seconds (× cores, GPUs, nodes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RollupSums {
    pub username: Option<String>,
    pub userid: Option<i64>,
    pub jobs: i64,
    pub completed: i64,
    pub failed: i64,
    pub canceled: i64,
    pub timeout: i64,
    pub core_seconds: f64,
    pub gpu_seconds: f64,
    pub node_seconds: f64,
    /// Jobs that ran, and the sum of their run times.
    pub runs: i64,
    pub run_sum: f64,
    /// Jobs that waited to run, the sum of their waits and the longest.
    pub waits: i64,
    pub wait_sum: f64,
    pub wait_max: Option<f64>,
    /// Waits per bucket ([`wait_bucket`] of milliseconds).
    pub wait_buckets: BTreeMap<u64, i64>,
}

impl RollupSums {
    /// Count one job.
    pub fn add(&mut self, job: &FinishedJob) {
        self.jobs += 1;
        match job.result.as_deref() {
            Some("COMPLETED") => self.completed += 1,
            Some("FAILED") => self.failed += 1,
            Some("CANCELED") => self.canceled += 1,
            Some("TIMEOUT") => self.timeout += 1,
            _ => {}
        }
        if let Some(run) = job.runtime() {
            let of = |n: Option<i64>| n.unwrap_or(0).max(0) as f64 * run;
            self.core_seconds += of(job.ncores);
            self.gpu_seconds += of(job.ngpus);
            self.node_seconds += of(job.nnodes);
            self.runs += 1;
            self.run_sum += run;
        }
        if let Some(wait) = job.wait() {
            self.waits += 1;
            self.wait_sum += wait;
            self.wait_max = Some(self.wait_max.map_or(wait, |m| m.max(wait)));
            *self
                .wait_buckets
                .entry(wait_bucket(wait_ms(wait)))
                .or_default() += 1;
        }
        if self.username.is_none() {
            self.username.clone_from(&job.username);
        }
        self.userid = self.userid.or(job.userid);
    }

    /// Add another's sums (another day's, another queue's).
    pub fn merge(&mut self, o: &RollupSums) {
        self.jobs += o.jobs;
        self.completed += o.completed;
        self.failed += o.failed;
        self.canceled += o.canceled;
        self.timeout += o.timeout;
        self.core_seconds += o.core_seconds;
        self.gpu_seconds += o.gpu_seconds;
        self.node_seconds += o.node_seconds;
        self.runs += o.runs;
        self.run_sum += o.run_sum;
        self.waits += o.waits;
        self.wait_sum += o.wait_sum;
        self.wait_max = match (self.wait_max, o.wait_max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        for (&bucket, &n) in &o.wait_buckets {
            *self.wait_buckets.entry(bucket).or_default() += n;
        }
        if self.username.is_none() {
            self.username.clone_from(&o.username);
        }
        self.userid = self.userid.or(o.userid);
    }
}

/// The rollups a set of newly finished jobs adds to.
#[derive(Debug, Default)]
pub struct Rollups {
    pub groups: BTreeMap<RollupKey, RollupSums>,
}

impl Rollups {
    pub fn add(&mut self, job: &FinishedJob) {
        self.groups.entry(RollupKey::of(job)).or_default().add(job);
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_keep_three_significant_digits() {
        for (ms, want) in [
            (0, 0),
            (7, 7),
            (999, 999),
            (1000, 1000),
            (1009, 1000),
            (12_345, 12_300),
            (14_400_000, 14_400_000),
            (3_601_500, 3_600_000),
            (u64::MAX, 18_400_000_000_000_000_000),
        ] {
            assert_eq!(wait_bucket(ms), want, "{ms}");
        }
        assert_eq!(day_of(86_399.9), 0);
        assert_eq!(day_of(86_400.0), 86_400);
        assert_eq!(day_of(-0.5), -86_400);
    }

    #[test]
    fn user_keys_read_back() {
        let key = |u: &str| RollupKey {
            cluster: "c".into(),
            day: 0,
            queue: String::new(),
            user_key: u.into(),
        };
        assert_eq!(
            key(&user_key(Some("ann"), Some(5))).user(),
            (Some("ann"), None)
        );
        assert_eq!(key(&user_key(None, Some(5))).user(), (None, Some(5)));
        assert_eq!(key(&user_key(None, None)).user(), (None, None));
        assert_eq!(key("").queue(), None);
    }

    #[test]
    fn a_job_counts_in_its_day_queue_and_user() {
        let job = FinishedJob {
            cluster: "c".into(),
            queue: Some("batch".into()),
            userid: Some(7),
            username: None,
            result: Some("TIMEOUT".into()),
            t_submit: Some(100.0),
            t_run: Some(160.0),
            t_cleanup: Some(3760.0),
            t_inactive: 86_400.0 * 3.0 + 5.0,
            ncores: Some(4),
            ngpus: None,
            nnodes: Some(2),
        };
        let mut r = Rollups::default();
        r.add(&job);
        r.add(&job);
        let (key, sums) = r.groups.iter().next().unwrap();
        assert_eq!(key.day, 86_400 * 3);
        assert_eq!(key.user_key, "#7");
        assert_eq!(
            (sums.jobs, sums.timeout, sums.runs, sums.waits),
            (2, 2, 2, 2)
        );
        assert_eq!(sums.core_seconds, 2.0 * 4.0 * 3600.0);
        assert_eq!(sums.gpu_seconds, 0.0);
        assert_eq!(sums.wait_max, Some(60.0));
        assert_eq!(sums.wait_buckets, BTreeMap::from([(60_000, 2)]));
    }

    #[test]
    fn buckets_read_back_and_add() {
        let mut b = BTreeMap::from([(60_000, 2), (7, 1)]);
        let text = encode_buckets(&b);
        assert_eq!(text, "7:1 60000:2");
        assert_eq!(add_buckets(&text, &mut b), 0);
        assert_eq!(b, BTreeMap::from([(60_000, 4), (7, 2)]));
        assert_eq!(add_buckets("x 1:y 5:1", &mut b), 2);
        assert_eq!(b[&5], 1);
        assert_eq!(encode_buckets(&BTreeMap::new()), "");
    }

    proptest! {
        #[test]
        fn bucket_text_round_trips(b in proptest::collection::btree_map(any::<u64>(), 1i64..1_000_000, 0..50)) {
            let mut back = BTreeMap::new();
            prop_assert_eq!(add_buckets(&encode_buckets(&b), &mut back), 0);
            prop_assert_eq!(back, b);
        }

        #[test]
        fn any_bucket_text_is_read_without_panic(text in ".{0,200}") {
            let mut into = BTreeMap::new();
            add_buckets(&text, &mut into);
        }

        /// A bucket is at most the value and within 1% of it, and
        /// buckets keep order (so a percentile's bucket is the bucket of
        /// the percentile).
        #[test]
        fn buckets_are_monotone_and_close(a in any::<u64>(), b in any::<u64>()) {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(wait_bucket(lo) <= wait_bucket(hi));
            prop_assert!(wait_bucket(a) <= a);
            prop_assert!((a - wait_bucket(a)) as f64 <= a as f64 / 100.0);
            prop_assert_eq!(wait_bucket(wait_bucket(a)), wait_bucket(a));
        }
    }
}
