//! Per shard: the state-entry times of the active jobs, per cluster and
//! state, as an ordered multiset, so the oldest is known at once. Each
//! change publishes the new oldest to the shared [`StateAges`] board.

use crate::flux::job::JobState;
use crate::telemetry::StateAges;
use std::collections::{BTreeMap, HashMap};

/// Times are kept in whole microseconds: exact ordering, and finer than any
/// eventlog timestamp means anything by.
fn micros(t: f64) -> i64 {
    (t * 1e6).round() as i64
}

pub struct OldestEntries {
    sets: HashMap<(String, JobState), BTreeMap<i64, u32>>,
    board: StateAges,
    shard: usize,
}

impl OldestEntries {
    pub fn new(board: StateAges) -> Self {
        let shard = board.register();
        OldestEntries {
            sets: HashMap::new(),
            board,
            shard,
        }
    }

    /// A job entered `state` at `t`.
    pub fn add(&mut self, cluster: &str, state: JobState, t: Option<f64>) {
        let Some(t) = t.filter(|t| t.is_finite()) else {
            return;
        };
        let set = self.sets.entry((cluster.to_string(), state)).or_default();
        let before = set.first_key_value().map(|(k, _)| *k);
        *set.entry(micros(t)).or_insert(0) += 1;
        self.publish_if_changed(cluster, state, before);
    }

    /// A job that entered `state` at `t` left it.
    pub fn remove(&mut self, cluster: &str, state: JobState, t: Option<f64>) {
        let Some(t) = t.filter(|t| t.is_finite()) else {
            return;
        };
        let key = (cluster.to_string(), state);
        let Some(set) = self.sets.get_mut(&key) else {
            return;
        };
        let before = set.first_key_value().map(|(k, _)| *k);
        let m = micros(t);
        if let Some(n) = set.get_mut(&m) {
            *n -= 1;
            if *n == 0 {
                set.remove(&m);
            }
        }
        self.publish_if_changed(cluster, state, before);
    }

    fn publish_if_changed(&mut self, cluster: &str, state: JobState, before: Option<i64>) {
        let now = self
            .sets
            .get(&(cluster.to_string(), state))
            .and_then(|s| s.first_key_value())
            .map(|(k, _)| *k);
        if now != before {
            self.board.publish(
                self.shard,
                cluster,
                state.as_str(),
                now.map(|m| m as f64 / 1e6),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_follows_jobs_in_and_out() {
        let board = StateAges::default();
        let mut o = OldestEntries::new(board.clone());
        o.add("c", JobState::Sched, Some(10.0));
        o.add("c", JobState::Sched, Some(5.0));
        o.add("c", JobState::Sched, Some(5.0));
        assert!(board.render().contains("state=\"SCHED\"} 5\n"));
        o.remove("c", JobState::Sched, Some(5.0));
        assert!(board.render().contains("state=\"SCHED\"} 5\n"));
        o.remove("c", JobState::Sched, Some(5.0));
        assert!(board.render().contains("state=\"SCHED\"} 10\n"));
        o.remove("c", JobState::Sched, Some(10.0));
        assert!(!board.render().contains("SCHED"));
        // leaving a state never entered changes nothing
        o.remove("c", JobState::Run, Some(1.0));
        o.add("c", JobState::Run, None);
        assert!(!board.render().contains("RUN"));
    }
}
