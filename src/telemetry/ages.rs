//! Per shard: the state-entry times of the active jobs, per cluster and
//! state, as an ordered multiset, so the oldest is known at once. The new
//! oldest of what changed is published to the shared [`StateAges`] board
//! when the shard's round of work ends ([`OldestEntries::publish`]): once
//! per round, not once per record under a lock shared by every shard.

use super::entry_times::EntryTimes;
use crate::flux::job::JobState;
use crate::telemetry::StateAges;
use foldhash::HashMap;

/// Times are kept in whole microseconds: exact ordering, and finer than any
/// eventlog timestamp means anything by.
fn micros(t: f64) -> i64 {
    (t * 1e6).round() as i64
}

/// The entry times of one cluster's active jobs, per state (indexed by
/// the state's place in [`JobState::ALL`]).
#[derive(Default)]
struct Sets {
    by_state: [EntryTimes; JobState::ALL.len()],
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

    /// A cluster's sets, made with its first job.
    fn sets_of(&mut self, cluster: &str) -> Option<&mut Sets> {
        if !self.sets.contains_key(cluster) {
            self.sets.insert(cluster.to_string(), Sets::default());
        }
        self.sets.get_mut(cluster)
    }

    /// A job entered `state` at `t`.
    pub fn add(&mut self, cluster: &str, state: JobState, t: Option<f64>) {
        let Some(t) = t.filter(|t| t.is_finite()) else {
            return;
        };
        let Some(sets) = self.sets_of(cluster) else {
            return;
        };
        if sets.by_state[state.index()].add(micros(t), 1) {
            sets.changed |= 1 << state.index();
        }
    }

    /// Many jobs at once (a restore), each (cluster, state, entered at),
    /// the cluster by its place in `clusters`: dealt into one list of
    /// times per (cluster, state) and each sorted alone (a million tuples
    /// sorted whole, names or numbers, was a fifth of a restore's
    /// take-over), so a set still empty is built in one ordered pass.
    pub fn add_all<C: AsRef<str>>(
        &mut self,
        clusters: &[C],
        entries: &[(u32, JobState, Option<f64>)],
    ) {
        let width = JobState::ALL.len();
        let list_of = |c: u32, state: JobState| c as usize * width + state.index();
        // Each list sized first (no doubling of a million times).
        let mut sizes = vec![0usize; clusters.len() * width];
        for &(c, state, _) in entries {
            if let Some(n) = sizes.get_mut(list_of(c, state)) {
                *n += 1;
            }
        }
        let mut lists: Vec<Vec<i64>> = sizes.into_iter().map(Vec::with_capacity).collect();
        for &(c, state, t) in entries {
            let Some(t) = t.filter(|t| t.is_finite()) else {
                continue;
            };
            if let Some(list) = lists.get_mut(list_of(c, state)) {
                list.push(micros(t));
            }
        }
        for (at, mut list) in lists.into_iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            list.sort_unstable();
            let (cluster, index) = (at / width, at % width);
            let Some(cluster) = clusters.get(cluster) else {
                continue;
            };
            let Some(sets) = self.sets_of(cluster.as_ref()) else {
                continue;
            };
            sets.changed |= 1 << index;
            let set = &mut sets.by_state[index];
            let times = list.chunk_by(|a, b| a == b).map(|g| (g[0], g.len() as u32));
            if set.is_empty() {
                *set = EntryTimes::from_sorted(times);
            } else {
                for (m, n) in times {
                    set.add(m, n);
                }
            }
        }
    }

    /// A job that entered `state` at `t` left it.
    pub fn remove(&mut self, cluster: &str, state: JobState, t: Option<f64>) {
        let Some(t) = t.filter(|t| t.is_finite()) else {
            return;
        };
        let Some(sets) = self.sets.get_mut(cluster) else {
            return;
        };
        if sets.by_state[state.index()].remove(micros(t)) {
            sets.changed |= 1 << state.index();
        }
    }

    /// Publish the oldest of every (cluster, state) whose oldest changed.
    pub fn publish(&mut self) {
        for (cluster, sets) in &mut self.sets {
            let mut changed = std::mem::take(&mut sets.changed);
            while changed != 0 {
                let i = changed.trailing_zeros() as usize;
                changed &= changed - 1;
                let oldest = sets.by_state[i].first();
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

    /// Adding many at once leaves the sets as adding them one by one.
    #[test]
    fn adding_all_at_once_is_adding_one_by_one() {
        // "d" first: the clusters' places, not their names, order the sort.
        let clusters = ["d", "c", "unused"];
        let entries = vec![
            (1, JobState::Sched, Some(7.0)),
            (0, JobState::Run, Some(3.0)),
            (1, JobState::Sched, Some(2.5)),
            (1, JobState::Sched, Some(7.0)),
            (1, JobState::Run, Some(1.0)),
            (1, JobState::Sched, None),
            (1, JobState::Sched, Some(f64::NAN)),
            // A place with no cluster: left out.
            (7, JobState::Sched, Some(1.0)),
        ];
        let sets = |o: &OldestEntries| {
            let mut v: Vec<_> = o
                .sets
                .iter()
                .map(|(c, s)| {
                    let held = s.by_state.each_ref().map(|t| t.held().collect::<Vec<_>>());
                    (c.clone(), held)
                })
                .collect();
            v.sort();
            v
        };
        let (mut one, mut all) = (
            OldestEntries::new(StateAges::default()),
            OldestEntries::new(StateAges::default()),
        );
        one.add("c", JobState::Sched, Some(9.0));
        all.add("c", JobState::Sched, Some(9.0));
        for &(c, s, t) in entries.iter().filter(|e| e.0 < 2) {
            one.add(clusters[c as usize], s, t);
        }
        all.add_all(&clusters, &entries);
        assert_eq!(sets(&one), sets(&all));
        let board = StateAges::default();
        let mut published = OldestEntries::new(board.clone());
        published.add_all(
            &["c"],
            &[
                (0, JobState::Sched, Some(4.0)),
                (0, JobState::Sched, Some(2.0)),
            ],
        );
        published.publish();
        assert!(board.render().contains("state=\"SCHED\"} 2\n"));
    }

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
