//! `flux_jobs_by_user`: active jobs per cluster, user and state (off
//! unless asked for: a series per user).

use super::{escape, metric};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// Active jobs per cluster, user and state, for `flux_jobs_by_user`: off
/// unless a `prometheus` sink sets `per_user_jobs` (a series per user).
/// The shards count into it; a series whose count falls to 0 is deleted.
#[derive(Debug, Default, Clone)]
pub struct UserJobs(Option<Arc<Mutex<UserCounts>>>);

/// (cluster, user id, state) → active jobs.
type UserCounts = BTreeMap<(String, i64, &'static str), i64>;

impl UserJobs {
    pub fn enabled() -> Self {
        UserJobs(Some(Arc::default()))
    }

    /// `delta` jobs of `userid` entered (or left, negative) `state`.
    pub fn add(&self, cluster: &str, userid: Option<i64>, state: &'static str, delta: i64) {
        let (Some(counts), Some(userid)) = (&self.0, userid) else {
            return;
        };
        let Ok(mut counts) = counts.lock() else {
            return;
        };
        let key = (cluster.to_string(), userid, state);
        let n = counts.entry(key.clone()).or_insert(0);
        *n += delta;
        if *n <= 0 {
            counts.remove(&key);
        }
    }

    /// The series in the Prometheus text format (nothing when off).
    pub fn render(&self) -> String {
        let Some(counts) = &self.0 else {
            return String::new();
        };
        let Ok(counts) = counts.lock() else {
            return String::new();
        };
        let name = metric::FLUX_JOBS_BY_USER;
        let mut out = String::new();
        metric::header(&mut out, name);
        for ((cluster, userid, state), n) in counts.iter() {
            let _ = writeln!(
                out,
                "{name}{{flux_cluster=\"{}\",userid=\"{userid}\",state=\"{state}\"}} {n}",
                escape(cluster)
            );
        }
        out
    }
}
