//! Per shard: the state-entry times of the active jobs, per cluster and
//! state, as an ordered multiset, so the oldest is known at once. The new
//! oldest of what changed is published to the shared [`StateAges`] board
//! when the shard's round of work ends ([`OldestEntries::publish`]): once
//! per round, not once per record under a lock shared by every shard.

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
#[derive(Default)]
struct Sets {
    by_state: [BTreeMap<i64, u32>; JobState::ALL.len()],
    /// The states whose oldest changed since the last publish, by index.
    changed: u16,
}

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
        let Some(sets) = self.sets.get_mut(cluster) else {
            return;
        };
        let set = &mut sets.by_state[state.index()];
        let m = micros(t);
        if set.first_key_value().is_none_or(|(k, _)| m < *k) {
            sets.changed |= 1 << state.index();
        }
        *set.entry(m).or_insert(0) += 1;
    }

    /// A job that entered `state` at `t` left it.
    pub fn remove(&mut self, cluster: &str, state: JobState, t: Option<f64>) {
        let Some(t) = t.filter(|t| t.is_finite()) else {
            return;
        };
        let Some(sets) = self.sets.get_mut(cluster) else {
            return;
        };
        let set = &mut sets.by_state[state.index()];
        let m = micros(t);
        if let Some(n) = set.get_mut(&m) {
            *n -= 1;
            if *n == 0 {
                if set.first_key_value().is_some_and(|(k, _)| *k == m) {
                    sets.changed |= 1 << state.index();
                }
                set.remove(&m);
            }
        }
    }

    /// Publish the oldest of every (cluster, state) whose oldest changed.
    pub fn publish(&mut self) {
        for (cluster, sets) in &mut self.sets {
            let mut changed = std::mem::take(&mut sets.changed);
            while changed != 0 {
                let i = changed.trailing_zeros() as usize;
                changed &= changed - 1;
                let oldest = sets.by_state[i].first_key_value().map(|(k, _)| *k);
                self.board.publish(
                    self.shard,
                    cluster,
                    JobState::ALL[i].as_str(),
                    oldest.map(|m| m as f64 / 1e6),
                );
            }
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
        o.publish();
        assert!(board.render().contains("state=\"SCHED\"} 10\n"));
        o.add("c", JobState::Sched, Some(5.0));
        assert!(
            board.render().contains("state=\"SCHED\"} 10\n"),
            "published when the round ends"
        );
        o.add("c", JobState::Sched, Some(5.0));
        o.publish();
        assert!(board.render().contains("state=\"SCHED\"} 5\n"));
        o.remove("c", JobState::Sched, Some(5.0));
        o.publish();
        assert!(board.render().contains("state=\"SCHED\"} 5\n"));
        o.remove("c", JobState::Sched, Some(5.0));
        o.publish();
        assert!(board.render().contains("state=\"SCHED\"} 10\n"));
        // in and out within a round: the board sees where it ended
        o.add("c", JobState::Sched, Some(1.0));
        o.remove("c", JobState::Sched, Some(1.0));
        o.remove("c", JobState::Sched, Some(10.0));
        o.publish();
        assert!(!board.render().contains("SCHED"));
        // leaving a state never entered changes nothing
        o.remove("c", JobState::Run, Some(1.0));
        o.add("c", JobState::Run, None);
        o.publish();
        assert!(!board.render().contains("RUN"));
    }
}
