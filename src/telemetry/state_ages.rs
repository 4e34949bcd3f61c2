//! `flux_job_state_oldest_entry_timestamp_seconds`: the oldest entry into
//! each state over the shards.

use super::{escape, metric};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

/// The oldest state-entry time of the active jobs per cluster and state,
/// as each shard last published it, for
/// `flux_job_state_oldest_entry_timestamp_seconds`. The minimum over shards
/// is taken at scrape; a (cluster, state) with no job has no series.
#[derive(Debug, Default, Clone)]
pub struct StateAges(Arc<RwLock<AgesInner>>);

#[derive(Debug, Default)]
struct AgesInner {
    shards: usize,
    /// (cluster, state, shard) → oldest entry time.
    oldest: BTreeMap<(String, &'static str, usize), f64>,
}

impl StateAges {
    /// A number for a new shard.
    pub fn register(&self) -> usize {
        match self.0.write() {
            Ok(mut a) => {
                a.shards += 1;
                a.shards - 1
            }
            Err(_) => 0,
        }
    }

    /// A shard's oldest entry time for (cluster, state); `None`: it has no
    /// job in that state.
    pub fn publish(&self, shard: usize, cluster: &str, state: &'static str, oldest: Option<f64>) {
        let Ok(mut a) = self.0.write() else {
            return;
        };
        let key = (cluster.to_string(), state, shard);
        match oldest {
            Some(t) => {
                a.oldest.insert(key, t);
            }
            None => {
                a.oldest.remove(&key);
            }
        }
    }

    /// The series in the Prometheus text format.
    pub fn render(&self) -> String {
        let Ok(a) = self.0.read() else {
            return String::new();
        };
        let mut min: BTreeMap<(&str, &str), f64> = BTreeMap::new();
        for ((cluster, state, _), t) in &a.oldest {
            let e = min.entry((cluster.as_str(), state)).or_insert(*t);
            *e = e.min(*t);
        }
        let name = metric::FLUX_JOB_STATE_OLDEST_ENTRY_TIMESTAMP_SECONDS;
        let mut out = String::new();
        metric::header(&mut out, name);
        for ((cluster, state), t) in min {
            let _ = writeln!(
                out,
                "{name}{{flux_cluster=\"{}\",state=\"{state}\"}} {t}",
                escape(cluster)
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_entry_is_the_minimum_over_shards_and_vanishes_when_empty() {
        let ages = StateAges::default();
        let (a, b) = (ages.register(), ages.register());
        ages.publish(a, "c", "SCHED", Some(200.0));
        ages.publish(b, "c", "SCHED", Some(100.5));
        ages.publish(b, "c", "RUN", Some(300.0));
        let text = ages.render();
        assert!(text.contains(
            "flux_job_state_oldest_entry_timestamp_seconds{flux_cluster=\"c\",state=\"SCHED\"} 100.5\n"
        ), "{text}");
        ages.publish(b, "c", "SCHED", None);
        ages.publish(b, "c", "RUN", None);
        let text = ages.render();
        assert!(text.contains("state=\"SCHED\"} 200\n"), "{text}");
        assert!(!text.contains("RUN"), "{text}");
    }
}
