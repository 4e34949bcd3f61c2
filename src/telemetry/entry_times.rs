//! The times at which jobs entered a state, as an ordered multiset whose
//! earliest is wanted ([`super::ages`]).
//!
//! Jobs enter a state nearly in time order and leave it in any order. So
//! the times are a sorted deque of (time, jobs): an entry goes on at the
//! back (or, late, in its place by binary search), and a job leaving
//! lowers its time's count. A time whose count reaches zero is a hole,
//! dropped at once at the front (so the front is the earliest held), left
//! in place elsewhere until holes are as many as the times held. An
//! ordered tree did the same at ~500 instructions per change, two changes
//! per job state transition. A time and its count take 12 bytes, about
//! one per active job.

use std::collections::VecDeque;

/// Holes tolerated below this many, whatever the share.
const MIN_HOLES: usize = 64;

/// A time held and its jobs: the time's halves as two `u32`s keep the
/// alignment at 4, so 12 bytes where an `(i64, u32)` took 16.
#[derive(Debug, Clone, Copy)]
struct Held {
    time: [u32; 2],
    jobs: u32,
}

impl Held {
    fn new(time: i64, jobs: u32) -> Self {
        let t = time as u64;
        Held {
            time: [t as u32, (t >> 32) as u32],
            jobs,
        }
    }

    fn time(&self) -> i64 {
        ((u64::from(self.time[1]) << 32) | u64::from(self.time[0])) as i64
    }
}

#[derive(Debug, Clone, Default)]
pub struct EntryTimes {
    /// Sorted by time, distinct; the front's count is never zero.
    times: VecDeque<Held>,
    /// Times whose count is zero.
    holes: usize,
}

impl EntryTimes {
    /// From (time, jobs) pairs sorted by time, distinct, counts above zero.
    pub fn from_sorted(times: impl IntoIterator<Item = (i64, u32)>) -> Self {
        EntryTimes {
            times: times
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .map(|(t, n)| Held::new(t, n))
                .collect(),
            holes: 0,
        }
    }

    /// The earliest time held.
    pub fn first(&self) -> Option<i64> {
        self.times.front().map(Held::time)
    }

    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    /// `n` more jobs entered at `t`; returns whether the earliest changed.
    pub fn add(&mut self, t: i64, n: u32) -> bool {
        if n == 0 {
            return false;
        }
        let earliest = self.first().is_none_or(|first| t < first);
        match self.times.back() {
            Some(last) if t <= last.time() => {
                match self.times.binary_search_by_key(&t, Held::time) {
                    Ok(i) => {
                        if let Some(held) = self.times.get_mut(i) {
                            if held.jobs == 0 {
                                self.holes -= 1;
                            }
                            held.jobs = held.jobs.saturating_add(n);
                        }
                    }
                    Err(i) => self.times.insert(i, Held::new(t, n)),
                }
            }
            _ => self.times.push_back(Held::new(t, n)),
        }
        earliest
    }

    /// A job that entered at `t` left; returns whether the earliest
    /// changed. A time not held changes nothing.
    pub fn remove(&mut self, t: i64) -> bool {
        let Ok(i) = self.times.binary_search_by_key(&t, Held::time) else {
            return false;
        };
        let Some(held) = self.times.get_mut(i) else {
            return false;
        };
        if held.jobs == 0 {
            return false;
        }
        held.jobs -= 1;
        if held.jobs > 0 {
            return false;
        }
        if i > 0 {
            self.holes += 1;
            if self.holes >= MIN_HOLES && self.holes * 2 >= self.times.len() {
                self.times.retain(|h| h.jobs > 0);
                self.holes = 0;
            }
            return false;
        }
        // The earliest left: so do the holes behind it.
        self.times.pop_front();
        while self.times.front().is_some_and(|h| h.jobs == 0) {
            self.times.pop_front();
            self.holes -= 1;
        }
        true
    }

    /// The times held with their jobs, in order.
    #[cfg(test)]
    pub fn held(&self) -> impl Iterator<Item = (i64, u32)> + '_ {
        self.times
            .iter()
            .filter(|h| h.jobs > 0)
            .map(|h| (h.time(), h.jobs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Add(i64, u32),
        Remove(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct times, so adds and removes meet.
        prop_oneof![
            (0i64..40, 1u32..3).prop_map(|(t, n)| Op::Add(t, n)),
            (0i64..40).prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Against an ordered map: the same times held, the same earliest,
        /// and "earliest changed" exactly when it did.
        #[test]
        fn behaves_as_an_ordered_multiset(ops in proptest::collection::vec(op(), 0..400)) {
            let mut model: BTreeMap<i64, u32> = BTreeMap::new();
            let mut times = EntryTimes::default();
            for op in ops {
                let before = model.keys().next().copied();
                let changed = match op {
                    Op::Add(t, n) => {
                        *model.entry(t).or_insert(0) += n;
                        times.add(t, n)
                    }
                    Op::Remove(t) => {
                        if let Some(c) = model.get_mut(&t) {
                            *c -= 1;
                            if *c == 0 {
                                model.remove(&t);
                            }
                        }
                        times.remove(t)
                    }
                };
                let after = model.keys().next().copied();
                prop_assert_eq!(times.first(), after);
                prop_assert_eq!(changed, before != after);
                prop_assert_eq!(times.held().collect::<Vec<_>>(), model.iter().map(|(t, n)| (*t, *n)).collect::<Vec<_>>());
                prop_assert_eq!(times.holes, times.times.iter().filter(|h| h.jobs == 0).count());
                prop_assert!(times.holes < MIN_HOLES || times.holes * 2 < times.times.len());
            }
        }
    }

    proptest! {
        /// Any time comes back from its two halves.
        #[test]
        fn a_time_survives_its_halves(t in any::<i64>(), n in any::<u32>()) {
            let held = Held::new(t, n);
            prop_assert_eq!((held.time(), held.jobs), (t, n));
        }
    }

    #[test]
    fn a_time_and_its_count_take_twelve_bytes() {
        assert_eq!(std::mem::size_of::<Held>(), 12);
    }

    #[test]
    fn holes_are_dropped_once_they_are_half_of_what_is_kept() {
        let mut times = EntryTimes::default();
        for t in 0..1000 {
            times.add(t, 1);
        }
        // Everything but the earliest leaves: the earliest stays put.
        for t in 1..1000 {
            assert!(!times.remove(t));
        }
        assert!(times.times.len() < 1000 / 2 + MIN_HOLES, "holes compacted");
        assert_eq!(times.held().collect::<Vec<_>>(), vec![(0, 1)]);
        assert!(times.remove(0));
        assert!(times.is_empty());
    }
}
