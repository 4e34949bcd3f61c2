//! A queue of timers by deadline, earliest first, where a timer is
//! cancelled in constant time.
//!
//! Most alert conditions clear long before they come due (a job leaves a
//! state well within the rule's duration), so cancelling is the common
//! operation. A cancelled timer only frees its slot; its heap entry stays
//! until it reaches the top or the heap is compacted (when stale entries
//! outnumber live ones), so the heap never holds more than about twice the
//! live timers.

use foldhash::HashSet;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::num::NonZeroU32;

/// A timer in a [`TimerQueue`]: its slot and its stamp (the count of
/// timers set when it was, [`TimerQueue::insert`]), which its slot keeps
/// while it is set, so an id of a timer that fired or was cancelled names
/// no later one. Stamps start at 1, so that "no timer" (`Option<TimerId>`,
/// in every alert condition) takes no room of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerId {
    slot: u32,
    stamp: NonZeroU32,
}

/// Timers with a payload each, popped in deadline order (ties in the order
/// they were set, but for ties across the stamps' wrap, once every four
/// billion timers).
#[derive(Debug)]
pub struct TimerQueue<T> {
    heap: BinaryHeap<Reverse<Entry>>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
    /// The last stamp given.
    seq: NonZeroU32,
    /// Slots whose timers were set before the stamps last wrapped: once
    /// freed, they wait in `retired` for the next wrap, so no stamp of
    /// this round can meet a stale entry of theirs from the last.
    retiring: HashSet<u32>,
    retired: Vec<u32>,
}

/// A heap entry: ordered by deadline, then by when it was set. 16 bytes
/// (one per pending alert, a million for a million stuck jobs): the stamp
/// both orders ties and tells a stale entry from its slot's next timer
/// (stamps wrap: [`TimerQueue::wrap`] keeps them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    key: DeadlineKey,
    stamp: NonZeroU32,
    slot: u32,
}

#[derive(Debug)]
struct Slot<T> {
    /// The stamp of the timer it holds, or last held.
    stamp: NonZeroU32,
    payload: Option<T>,
}

/// The bytes of a slot holding a `T`, for tests that hold a payload's size.
#[cfg(test)]
pub(super) const fn slot_bytes<T>() -> usize {
    std::mem::size_of::<Slot<T>>()
}

/// Below this many stale entries the heap is never compacted: a small
/// queue does not pay for a rebuild.
const COMPACT_FROM: usize = 1024;

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        TimerQueue {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            seq: NonZeroU32::MAX,
            retiring: HashSet::default(),
            retired: Vec::new(),
        }
    }
}

impl<T> TimerQueue<T> {
    /// Timers set and neither fired nor cancelled.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Set a timer for `deadline`.
    pub fn insert(&mut self, deadline: f64, payload: T) -> TimerId {
        let stamp = match self.seq.checked_add(1) {
            Some(next) => next,
            None => {
                self.wrap();
                NonZeroU32::MIN
            }
        };
        self.seq = stamp;
        let slot = match self.free.pop() {
            Some(i) => {
                let s = &mut self.slots[i as usize];
                s.payload = Some(payload);
                s.stamp = stamp;
                i
            }
            None => {
                let i = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Slot {
                    stamp,
                    payload: Some(payload),
                });
                i
            }
        };
        self.heap.push(Reverse(Entry {
            key: DeadlineKey::new(deadline),
            stamp,
            slot,
        }));
        self.live += 1;
        TimerId { slot, stamp }
    }

    /// Cancel a timer; its payload, if it was still set.
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let payload = self.release(id.slot, id.stamp)?;
        self.drop_stale_top();
        self.compact_if_stale();
        Some(payload)
    }

    /// The earliest deadline set.
    pub fn next_deadline(&self) -> Option<f64> {
        self.heap.peek().map(|Reverse(e)| e.key.deadline())
    }

    /// The earliest timer, removed, if its deadline is at or before `now`.
    pub fn pop_due(&mut self, now: f64) -> Option<(TimerId, f64, T)> {
        let Reverse(top) = *self.heap.peek()?;
        let deadline = top.key.deadline();
        if deadline > now {
            return None;
        }
        self.heap.pop();
        let payload = self.release(top.slot, top.stamp);
        self.drop_stale_top();
        let id = TimerId {
            slot: top.slot,
            stamp: top.stamp,
        };
        // The top is always live (stale tops are dropped as they surface).
        payload.map(|p| (id, deadline, p))
    }

    /// Free a live slot, taking its payload.
    fn release(&mut self, slot: u32, stamp: NonZeroU32) -> Option<T> {
        let s = self.slots.get_mut(slot as usize)?;
        if s.stamp != stamp {
            return None;
        }
        let payload = s.payload.take()?;
        self.live -= 1;
        if !self.retiring.is_empty() && self.retiring.remove(&slot) {
            self.retired.push(slot);
        } else {
            self.free.push(slot);
        }
        Some(payload)
    }

    /// The stamps start again at 1 (every four billion timers): a stale
    /// entry left from this round could otherwise meet its slot's timer
    /// of the next with the same stamp, and fire it at the old deadline.
    /// Every stale entry goes now; the slots held since the last wrap are
    /// free again (their stale entries were just dropped); those held now
    /// wait, once freed, until the next.
    fn wrap(&mut self) {
        self.drop_stale_entries();
        self.free.append(&mut self.retired);
        self.retiring = (0..self.slots.len())
            .filter(|&i| self.slots[i].payload.is_some())
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
    }

    fn is_live(&self, e: &Entry) -> bool {
        self.slots
            .get(e.slot as usize)
            .is_some_and(|s| s.stamp == e.stamp && s.payload.is_some())
    }

    /// Keep the top live, so the next deadline can be read without a walk.
    fn drop_stale_top(&mut self) {
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.is_live(top) {
                break;
            }
            self.heap.pop();
        }
    }

    /// Rebuild the heap without its stale entries once they outnumber the
    /// live ones: memory stays within about twice the live timers, and each
    /// stale entry is dropped once, at a constant cost on average.
    fn compact_if_stale(&mut self) {
        let stale = self.heap.len() - self.live.min(self.heap.len());
        if stale < COMPACT_FROM || stale <= self.live {
            return;
        }
        self.drop_stale_entries();
    }

    /// Rebuild the heap of its live entries only.
    fn drop_stale_entries(&mut self) {
        let mut heap = std::mem::take(&mut self.heap).into_vec();
        heap.retain(|Reverse(e)| self.is_live(e));
        self.heap = BinaryHeap::from(heap);
    }
}

/// A deadline as bits whose integer order is `f64::total_cmp`'s order:
/// entries are compared as integers (the heap compares them often).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct DeadlineKey(u64);

/// The bit that `f64::total_cmp` flips the others by (the sign).
const SIGN: u64 = 1 << 63;

impl DeadlineKey {
    fn new(deadline: f64) -> Self {
        let bits = deadline.to_bits();
        // Negative numbers: every bit flipped (larger magnitude sorts
        // first); positive ones: the sign bit set, above every negative.
        DeadlineKey(if bits & SIGN != 0 { !bits } else { bits | SIGN })
    }

    fn deadline(self) -> f64 {
        let bits = if self.0 & SIGN != 0 {
            self.0 & !SIGN
        } else {
            !self.0
        };
        f64::from_bits(bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn pops_in_deadline_order_then_in_the_order_set() {
        let mut q = TimerQueue::default();
        q.insert(30.0, "c");
        q.insert(10.0, "a");
        q.insert(10.0, "b");
        q.insert(20.0, "x");
        assert_eq!(q.next_deadline(), Some(10.0));
        let mut out = Vec::new();
        while let Some((_, d, p)) = q.pop_due(25.0) {
            out.push((d, p));
        }
        assert_eq!(out, vec![(10.0, "a"), (10.0, "b"), (20.0, "x")]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_deadline(), Some(30.0));
    }

    #[test]
    fn a_cancelled_timer_never_fires_and_its_id_does_not_name_the_next() {
        let mut q = TimerQueue::default();
        let a = q.insert(10.0, 1);
        assert_eq!(q.cancel(a), Some(1));
        assert_eq!(q.cancel(a), None);
        assert_eq!(q.next_deadline(), None);
        // The slot is reused; the old id does not cancel the new timer.
        let b = q.insert(20.0, 2);
        assert_ne!(a, b);
        assert_eq!(q.cancel(a), None);
        assert_eq!(
            q.pop_due(f64::INFINITY).map(|(id, _, p)| (id, p)),
            Some((b, 2))
        );
        assert!(q.is_empty());
    }

    #[test]
    fn a_heap_entry_is_16_bytes_and_stamps_wrap_past_zero() {
        assert_eq!(std::mem::size_of::<Entry>(), 16);
        let mut q = TimerQueue::default();
        let a = q.insert(5.0, "a");
        assert_eq!(a.stamp, NonZeroU32::MIN, "the first stamp is 1");
        q.seq = NonZeroU32::new(u32::MAX - 1).unwrap();
        let b = q.insert(7.0, "b");
        let c = q.insert(7.0, "c");
        assert_eq!(c.stamp, NonZeroU32::MIN, "after the last stamp, 1 again");
        // Both stamped 1, in slots of their own: the ids differ.
        assert_ne!(a, c);
        assert_eq!(q.cancel(b), Some("b"));
        assert_eq!(q.pop_due(10.0).map(|(_, _, p)| p), Some("a"));
        assert_eq!(q.pop_due(10.0).map(|(_, _, p)| p), Some("c"));
    }

    /// At the wrap no stale entry is left to meet a later timer of its
    /// slot, and a slot held across it is not given out again before the
    /// next.
    #[test]
    fn the_wrap_drops_stale_entries_and_holds_back_slots_set_before_it() {
        let mut q = TimerQueue {
            seq: NonZeroU32::new(u32::MAX - 3).unwrap(),
            ..TimerQueue::default()
        };
        let _early = q.insert(1.0, "early");
        let a = q.insert(100.0, "a");
        let b = q.insert(200.0, "b");
        assert_eq!(q.cancel(a), Some("a"));
        assert_eq!(q.heap.len(), 3, "a's entry stays, below the top");
        let c = q.insert(300.0, "c");
        assert_eq!(c.stamp, NonZeroU32::MIN);
        assert_eq!(q.heap.len(), q.len(), "no stale entry is left");
        assert_eq!(c.slot, a.slot, "a's slot was free");
        assert_eq!(q.cancel(b), Some("b"));
        let d = q.insert(400.0, "d");
        assert_ne!(d.slot, b.slot, "b's slot waits for the next wrap");
        assert_eq!(q.retired, vec![b.slot]);
        let mut out = Vec::new();
        while let Some((_, _, p)) = q.pop_due(f64::INFINITY) {
            out.push(p);
        }
        assert_eq!(out, ["early", "c", "d"]);
    }

    #[test]
    fn stale_entries_are_compacted_away() {
        let mut q = TimerQueue::default();
        let keep = q.insert(0.0, 0);
        let ids: Vec<_> = (1..=10_000).map(|i| q.insert(f64::from(i), i)).collect();
        for id in ids {
            q.cancel(id);
        }
        assert_eq!(q.len(), 1);
        assert!(q.heap.len() <= 2 * q.len() + COMPACT_FROM);
        assert_eq!(q.cancel(keep), Some(0));
        assert!(q.heap.is_empty());
    }

    proptest! {
        #[test]
        fn deadline_keys_order_as_total_cmp_and_give_the_deadline_back(
            a in prop_oneof![any::<f64>(), Just(f64::NAN), Just(-f64::NAN), Just(-0.0), Just(f64::NEG_INFINITY)],
            b in any::<f64>(),
        ) {
            let (ka, kb) = (DeadlineKey::new(a), DeadlineKey::new(b));
            prop_assert_eq!(ka.cmp(&kb), a.total_cmp(&b));
            prop_assert_eq!(ka.deadline().to_bits(), a.to_bits());
        }

        /// Against a model (an ordered map of the live timers): the same
        /// timers come due, in the same order, whatever is cancelled.
        #[test]
        fn agrees_with_an_ordered_map(
            ops in prop::collection::vec((0u8..4, 0u16..200), 0..400),
        ) {
            let mut q = TimerQueue::default();
            let mut model: BTreeMap<(DeadlineKey, u32), usize> = BTreeMap::new();
            let mut ids: Vec<(TimerId, DeadlineKey, u32)> = Vec::new();
            let mut n = 0usize;
            for (op, v) in ops {
                match op {
                    0 | 1 => {
                        let d = f64::from(v);
                        let id = q.insert(d, n);
                        ids.push((id, DeadlineKey::new(d), q.seq.get()));
                        model.insert((DeadlineKey::new(d), q.seq.get()), n);
                        n += 1;
                    }
                    2 if !ids.is_empty() => {
                        let (id, k, s) = ids.swap_remove(usize::from(v) % ids.len());
                        prop_assert_eq!(q.cancel(id), model.remove(&(k, s)));
                    }
                    _ => {
                        let now = f64::from(v);
                        while let Some((_, d, p)) = q.pop_due(now) {
                            let (&(k, s), &m) = model.iter().next().unwrap();
                            prop_assert_eq!((k.deadline(), p), (d, m));
                            model.remove(&(k, s));
                        }
                        prop_assert!(model.keys().next().is_none_or(|(k, _)| k.deadline() > now));
                    }
                }
                prop_assert_eq!(q.len(), model.len());
                prop_assert_eq!(q.next_deadline(), model.keys().next().map(|(k, _)| k.deadline()));
            }
        }
    }
}
