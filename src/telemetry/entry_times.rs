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
//! per job state transition.

use std::collections::VecDeque;

/// Holes tolerated below this many, whatever the share.
const MIN_HOLES: usize = 64;

#[derive(Debug, Clone, Default)]
pub struct EntryTimes {
    /// Sorted by time, distinct; the front's count is never zero.
    times: VecDeque<(i64, u32)>,
    /// Times whose count is zero.
    holes: usize,
}

impl EntryTimes {
    /// From (time, jobs) pairs sorted by time, distinct, counts above zero.
    pub fn from_sorted(times: impl IntoIterator<Item = (i64, u32)>) -> Self {
        EntryTimes {
            times: times.into_iter().filter(|(_, n)| *n > 0).collect(),
            holes: 0,
        }
    }

    /// The earliest time held.
    pub fn first(&self) -> Option<i64> {
        self.times.front().map(|(t, _)| *t)
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
            Some((last, _)) if t <= *last => {
                match self.times.binary_search_by_key(&t, |(time, _)| *time) {
                    Ok(i) => {
                        if let Some((_, count)) = self.times.get_mut(i) {
                            if *count == 0 {
                                self.holes -= 1;
                            }
                            *count = count.saturating_add(n);
                        }
                    }
                    Err(i) => self.times.insert(i, (t, n)),
                }
            }
            _ => self.times.push_back((t, n)),
        }
        earliest
    }

    /// A job that entered at `t` left; returns whether the earliest
    /// changed. A time not held changes nothing.
    pub fn remove(&mut self, t: i64) -> bool {
        let Ok(i) = self.times.binary_search_by_key(&t, |(time, _)| *time) else {
            return false;
        };
        let Some((_, count)) = self.times.get_mut(i) else {
            return false;
        };
        if *count == 0 {
            return false;
        }
        *count -= 1;
        if *count > 0 {
            return false;
        }
        if i > 0 {
            self.holes += 1;
            if self.holes >= MIN_HOLES && self.holes * 2 >= self.times.len() {
                self.times.retain(|(_, n)| *n > 0);
                self.holes = 0;
            }
            return false;
        }
        // The earliest left: so do the holes behind it.
        self.times.pop_front();
        while self.times.front().is_some_and(|(_, n)| *n == 0) {
            self.times.pop_front();
            self.holes -= 1;
        }
        true
    }

    /// The times held with their jobs, in order.
    #[cfg(test)]
    pub fn held(&self) -> impl Iterator<Item = (i64, u32)> + '_ {
        self.times.iter().copied().filter(|(_, n)| *n > 0)
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
                prop_assert_eq!(times.holes, times.times.iter().filter(|(_, n)| *n == 0).count());
                prop_assert!(times.holes < MIN_HOLES || times.holes * 2 < times.times.len());
            }
        }
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
