//! Alerts on stuck jobs and sick nodes: the rules ([`rule`]), the engine
//! that times them ([`engine`]) and keeps a subject's conditions in the
//! room of one ([`few`]), what it says ([`event`]), what fires now
//! ([`firing`]) and how its conditions are saved and restored
//! ([`saved`]), and the watch of feeds and instances on the wall clock
//! ([`watch`]); the processor
//! ([`crate::keyed::processor`]) shows the engine what each record changed.
//! Pure: no I/O; the caller owns the clock (wall time, or the newest event
//! time per cluster).

pub mod engine;
pub mod event;
pub mod few;
pub mod firing;
pub mod rule;
pub mod saved;
pub mod timers;
pub mod watch;
pub use rule::{JobView, job_view};

use foldhash::HashMap;
use std::sync::Arc;

/// Which clock alert durations are measured against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// The wall clock: for live streams.
    #[default]
    Wall,
    /// The newest event timestamp seen per cluster: replaying old logs
    /// tells which alerts would have fired.
    Event,
}

/// The newest event timestamp seen per cluster: "now" for
/// `clock = "event"`. Advanced by every record and read by every due-timer
/// check: records come in runs of one cluster, so the cluster met last is
/// compared first, by address when the caller holds the same shared name
/// (the processor's interned copy), before any hashing. Saved as a map of
/// cluster to time.
#[derive(Debug, Clone)]
pub struct EventClock {
    /// Each cluster's clock, in the order first seen.
    clocks: Vec<(Arc<str>, f64)>,
    /// Where each cluster's clock is in `clocks`.
    index: HashMap<Arc<str>, usize>,
    /// The place in `clocks` of the cluster advanced last.
    last: usize,
    /// The latest of every cluster's clock.
    newest: f64,
}

impl Default for EventClock {
    fn default() -> Self {
        EventClock {
            clocks: Vec::new(),
            index: HashMap::default(),
            last: 0,
            newest: f64::NEG_INFINITY,
        }
    }
}

/// Whether `name` is the text of `held`, by address first: a name held
/// here stays alive, so the same address and length are the same text.
fn same_name(held: &Arc<str>, name: &str) -> bool {
    (std::ptr::eq(held.as_ptr(), name.as_ptr()) && held.len() == name.len()) || **held == *name
}

impl EventClock {
    /// Where `cluster`'s clock is, if it has one.
    fn place(&self, cluster: &str) -> Option<usize> {
        match self.clocks.get(self.last) {
            Some((c, _)) if same_name(c, cluster) => Some(self.last),
            _ => self.index.get(cluster).copied(),
        }
    }

    /// Move a cluster's clock to `ts` if later; returns how far `ts` runs
    /// behind the clock as it was (the lag the engine gives a late subject).
    pub fn advance(&mut self, cluster: &str, ts: f64) -> f64 {
        self.advance_at(cluster, ts, || Arc::from(cluster))
    }

    /// [`EventClock::advance`] with the caller's shared copy of the name,
    /// kept to be compared by address from then on.
    pub fn advance_shared(&mut self, cluster: &Arc<str>, ts: f64) -> f64 {
        if let Some((held, _)) = self.clocks.get_mut(self.last)
            && !Arc::ptr_eq(held, cluster)
            && **held == **cluster
        {
            // Met first under another copy (a restore's): this one from now.
            *held = cluster.clone();
        }
        self.advance_at(cluster, ts, || cluster.clone())
    }

    fn advance_at(&mut self, cluster: &str, ts: f64, name: impl FnOnce() -> Arc<str>) -> f64 {
        if !ts.is_finite() {
            return 0.0;
        }
        self.newest = self.newest.max(ts);
        match self.place(cluster) {
            Some(at) => {
                self.last = at;
                let now = &mut self.clocks[at].1;
                let lag = (*now - ts).max(0.0);
                *now = now.max(ts);
                lag
            }
            None => {
                let name = name();
                self.last = self.clocks.len();
                self.index.insert(name.clone(), self.last);
                self.clocks.push((name, ts));
                0.0
            }
        }
    }

    /// Every cluster's clock.
    pub fn clusters(&self) -> impl Iterator<Item = (&str, f64)> {
        self.clocks.iter().map(|(c, t)| (&**c, *t))
    }

    /// The latest clock of any cluster (minus infinity before any).
    pub fn newest(&self) -> f64 {
        self.newest
    }

    /// A cluster's clock, if it has seen an event.
    pub fn now(&self, cluster: &str) -> Option<f64> {
        self.place(cluster).map(|at| self.clocks[at].1)
    }

    /// Take the later of each cluster's clock from `other`, and give it ours.
    pub fn merge(&mut self, other: &mut EventClock) {
        for (c, t) in &other.clocks {
            self.advance_at(c, *t, || c.clone());
        }
        other.clone_from(self);
    }
}

impl serde::Serialize for EventClock {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.clusters())
    }
}

impl<'de> serde::Deserialize<'de> for EventClock {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let saved = std::collections::BTreeMap::<String, f64>::deserialize(d)?;
        let mut clock = EventClock::default();
        for (cluster, t) in saved {
            clock.advance(&cluster, t);
        }
        Ok(clock)
    }
}

/// The event clocks of every shard, merged now and then: "now" for a
/// cluster across shards (jobs of one cluster are spread over them).
#[derive(Debug, Clone, Default)]
pub struct SharedEventClock(std::sync::Arc<std::sync::Mutex<EventClock>>);

impl SharedEventClock {
    /// Merge a shard's clocks in and take everyone's back.
    pub fn sync(&self, local: &mut EventClock) {
        if let Ok(mut shared) = self.0.lock() {
            shared.merge(local);
        }
    }

    /// A cluster's clock as of the last merge.
    pub fn now(&self, cluster: &str) -> Option<f64> {
        self.0.lock().ok().and_then(|c| c.now(cluster))
    }
}

/// Wall-clock time in seconds since the epoch.
pub fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::EventClock;

    #[test]
    fn the_event_clock_only_moves_forward_and_reports_lag() {
        let mut c = EventClock::default();
        assert_eq!(c.advance("a", 100.0), 0.0);
        assert_eq!(c.advance("a", 40.0), 60.0);
        assert_eq!(c.now("a"), Some(100.0));
        assert_eq!(c.advance("a", f64::NAN), 0.0);
        let mut other = EventClock::default();
        other.advance("a", 150.0);
        other.advance("b", 5.0);
        c.merge(&mut other);
        assert_eq!((c.now("a"), c.now("b")), (Some(150.0), Some(5.0)));
        assert_eq!((other.now("a"), other.now("b")), (Some(150.0), Some(5.0)));
    }

    /// Whatever order clusters come in, each clock is the newest time it
    /// was given, and reads back the same from a checkpoint.
    #[test]
    fn each_clusters_clock_is_its_newest_time_and_saves() {
        use proptest::prelude::*;
        use std::collections::BTreeMap;
        proptest!(|(steps in proptest::collection::vec((0u8..4, 1.0f64..1e9), 0..60))| {
            let mut c = EventClock::default();
            let mut want: BTreeMap<String, f64> = BTreeMap::new();
            // Shared names, one per cluster: compared by address.
            let shared: Vec<std::sync::Arc<str>> =
                (0..4).map(|i| std::sync::Arc::from(format!("c{i}"))).collect();
            for (i, (cluster, t)) in steps.iter().enumerate() {
                let name = format!("c{cluster}");
                let before = want.get(&name).copied();
                // By name and by a shared copy, in turns.
                let lag = match i % 2 {
                    0 => c.advance(&name, *t),
                    _ => c.advance_shared(&shared[usize::from(*cluster)], *t),
                };
                prop_assert_eq!(lag, before.map_or(0.0, |b| (b - t).max(0.0)));
                let newest = want.entry(name).or_insert(*t);
                *newest = newest.max(*t);
            }
            for cluster in 0..5 {
                let name = format!("c{cluster}");
                prop_assert_eq!(c.now(&name), want.get(&name).copied());
            }
            let newest = want.values().copied().fold(f64::NEG_INFINITY, f64::max);
            prop_assert_eq!(c.newest(), newest);
            let saved = rmp_serde::to_vec(&c).expect("saved");
            let back: EventClock = rmp_serde::from_slice(&saved).expect("read");
            let got: BTreeMap<String, f64> =
                back.clusters().map(|(c, t)| (c.to_string(), t)).collect();
            prop_assert_eq!(got, want);
        });
    }
}
