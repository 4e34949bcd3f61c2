//! Per shard: the state-entry times of the active jobs, per cluster and
//! state, as an ordered multiset, so the oldest is known at once. Each
//! change publishes the new oldest to the shared [`StateAges`] board.

use crate::flux::job::JobState;
use crate::telemetry::StateAges;
use foldhash::HashMap;
use std::collections::BTreeMap;

/// Times are kept in whole microseconds: exact ordering, and finer than any
/// eventlog timestamp means anything by.
fn micros(t: f64) -> i64 {
    (t * 1e6).round() as i64
}

/// The entry times of one cluster's active jobs, per state (indexed by
/// the state's place in [`JobState::ALL`]): entry time → jobs.
type Sets = [BTreeMap<i64, u32>; JobState::ALL.len()];

pub struct OldestEntries {
    /// By cluster, looked up by `&str`: nothing is allocated per record.
    sets: HashMap<String, Sets>,
    board: StateAges,
    shard: usize,
}

impl OldestEntries {
    pub fn new(board: StateAges) -> Self {
        let shard = board.register();
        OldestEntries {
            sets: HashMap::default(),
            board,
            shard,
        }
    }

    /// A job entered `state` at `t`.
    pub fn add(&mut self, cluster: &str, state: JobState, t: Option<f64>) {
        let Some(t) = t.filter(|t| t.is_finite()) else {
            return;
        };
        if !self.sets.contains_key(cluster) {
            self.sets.insert(cluster.to_string(), Sets::default());
        }
        let Some(set) = self.sets.get_mut(cluster).map(|s| &mut s[state.index()]) else {
            return;
        };
        let before = set.first_key_value().map(|(k, _)| *k);
        *set.entry(micros(t)).or_insert(0) += 1;
        let now = set.first_key_value().map(|(k, _)| *k);
        self.publish_if_changed(cluster, state, before, now);
    }

    /// A job that entered `state` at `t` left it.
    pub fn remove(&mut self, cluster: &str, state: JobState, t: Option<f64>) {
        let Some(t) = t.filter(|t| t.is_finite()) else {
            return;
        };
        let Some(set) = self.sets.get_mut(cluster).map(|s| &mut s[state.index()]) else {
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
        let now = set.first_key_value().map(|(k, _)| *k);
        self.publish_if_changed(cluster, state, before, now);
    }

    fn publish_if_changed(
        &self,
        cluster: &str,
        state: JobState,
        before: Option<i64>,
        now: Option<i64>,
    ) {
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
