//! Alerts on stuck jobs and sick nodes: the rules ([`rule`]), the engine
//! that times them ([`engine`]), what it says ([`event`]), what fires now
//! ([`firing`]) and how its conditions are saved and restored
//! ([`saved`]), and the watch of feeds and instances on the wall clock
//! ([`watch`]); the processor
//! ([`crate::keyed::processor`]) shows the engine what each record changed.
//! Pure: no I/O; the caller owns the clock (wall time, or the newest event
//! time per cluster).

pub mod engine;
pub mod event;
pub mod firing;
pub mod rule;
pub mod saved;
pub mod timers;
pub mod watch;
pub use rule::{JobView, job_view};

use foldhash::HashMap;

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
/// `clock = "event"`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct EventClock(HashMap<String, f64>);

impl EventClock {
    /// Move a cluster's clock to `ts` if later; returns how far `ts` runs
    /// behind the clock as it was (the lag the engine gives a late subject).
    pub fn advance(&mut self, cluster: &str, ts: f64) -> f64 {
        if !ts.is_finite() {
            return 0.0;
        }
        match self.0.get_mut(cluster) {
            Some(now) => {
                let lag = (*now - ts).max(0.0);
                *now = now.max(ts);
                lag
            }
            None => {
                self.0.insert(cluster.to_string(), ts);
                0.0
            }
        }
    }

    /// Every cluster's clock.
    pub fn clusters(&self) -> impl Iterator<Item = (&str, f64)> {
        self.0.iter().map(|(c, t)| (c.as_str(), *t))
    }

    /// A cluster's clock, if it has seen an event.
    pub fn now(&self, cluster: &str) -> Option<f64> {
        self.0.get(cluster).copied()
    }

    /// Take the later of each cluster's clock from `other`, and give it ours.
    pub fn merge(&mut self, other: &mut EventClock) {
        for (c, t) in &other.0 {
            self.advance(c, *t);
        }
        other.0.clone_from(&self.0);
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
}
