//! When each feed was last heard: a source notes every line it reads (a
//! blank line and an empty `POST` are heartbeats, heard and not applied),
//! and the feed watch ([`crate::operators::feed_watch`]) reads the notes
//! on the wall clock to tell an idle cluster from a dead feed.
//!
//! A note costs two relaxed atomic operations on the per-line path: the
//! watch keeps a coarse clock (milliseconds, moved on every tenth of a
//! second) that the notes copy, so no source reads the system clock per
//! line.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Every feed of the pipeline, and the coarse clock their notes use.
#[derive(Debug, Clone)]
pub struct Feeds(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// Milliseconds since the epoch, moved on by [`Feeds::tick`].
    now: AtomicU64,
    list: Mutex<Vec<Registered>>,
}

#[derive(Debug)]
struct Registered {
    source: Arc<str>,
    cluster: Arc<str>,
    heartbeats: bool,
    last: Arc<AtomicU64>,
    watched: Arc<AtomicBool>,
}

/// One feed as the watch sees it at a tick.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedReading {
    pub source: Arc<str>,
    pub cluster: Arc<str>,
    /// Whether its source type can carry heartbeats (a silent feed of
    /// one that cannot may only be an idle cluster).
    pub heartbeats: bool,
    /// When it was last heard (seconds since the epoch, to the coarse
    /// clock's tick); the start of the pipeline until it first is.
    pub last_heard: f64,
    /// Whether this member of the pipeline answers for it now (a Kafka
    /// source that owns no partition has nothing to hear).
    pub watched: bool,
}

/// A source's handle on its feed: note that it was heard.
#[derive(Debug, Clone)]
pub struct Feed {
    feeds: Feeds,
    last: Arc<AtomicU64>,
    watched: Arc<AtomicBool>,
}

fn wall_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Default for Feeds {
    fn default() -> Self {
        Feeds(Arc::new(Inner {
            now: AtomicU64::new(wall_millis()),
            list: Mutex::new(Vec::new()),
        }))
    }
}

impl Feeds {
    /// A feed of `source` for `cluster`, heard as of now.
    pub fn register(&self, source: &str, cluster: &str, heartbeats: bool) -> Feed {
        let last = Arc::new(AtomicU64::new(self.0.now.load(Ordering::Relaxed)));
        let watched = Arc::new(AtomicBool::new(true));
        let mut list = self.0.list.lock().unwrap_or_else(|e| e.into_inner());
        list.push(Registered {
            source: source.into(),
            cluster: cluster.into(),
            heartbeats,
            last: last.clone(),
            watched: watched.clone(),
        });
        Feed {
            feeds: self.clone(),
            last,
            watched,
        }
    }

    /// Move the coarse clock to `now` (milliseconds since the epoch).
    pub fn tick(&self, now: u64) {
        self.0.now.fetch_max(now, Ordering::Relaxed);
    }

    /// Move the coarse clock to the wall clock.
    pub fn tick_wall(&self) {
        self.tick(wall_millis());
    }

    /// Feed `source` of `cluster` was last heard at `at` (seconds since
    /// the epoch): what a restart restores of a feed that had gone silent.
    pub fn heard_last_at(&self, source: &str, cluster: &str, at: f64) {
        let list = self.0.list.lock().unwrap_or_else(|e| e.into_inner());
        for r in list
            .iter()
            .filter(|r| &*r.source == source && &*r.cluster == cluster)
        {
            r.last
                .store((at.max(0.0) * 1000.0) as u64, Ordering::Relaxed);
        }
    }

    /// Every feed, as it stands.
    pub fn readings(&self) -> Vec<FeedReading> {
        let list = self.0.list.lock().unwrap_or_else(|e| e.into_inner());
        list.iter()
            .map(|r| FeedReading {
                source: r.source.clone(),
                cluster: r.cluster.clone(),
                heartbeats: r.heartbeats,
                last_heard: r.last.load(Ordering::Relaxed) as f64 / 1000.0,
                watched: r.watched.load(Ordering::Relaxed),
            })
            .collect()
    }
}

impl Feed {
    /// A feed of no pipeline (tools, tests): its notes go nowhere.
    pub fn detached() -> Self {
        Feeds::default().register("", "", false)
    }

    /// Whether this member answers for the feed now: a Kafka source only
    /// while it owns partitions (its silence is another member's else).
    /// While not watched, its silence pages nobody.
    pub fn set_watched(&self, watched: bool) {
        self.watched.store(watched, Ordering::Relaxed);
    }

    /// The feed was heard (a line, a heartbeat).
    #[inline]
    pub fn heard(&self) {
        let now = self.feeds.0.now.load(Ordering::Relaxed);
        // A store only once a tick: the line path does not write a
        // shared cache line per line.
        if self.last.load(Ordering::Relaxed) < now {
            self.last.store(now, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_is_heard_as_of_the_coarse_clock() {
        let feeds = Feeds::default();
        let feed = feeds.register("http", "picl", true);
        let start = feeds.readings()[0].last_heard;
        assert!(start > 1e9, "registered as of the wall clock: {start}");
        let later = (start * 1000.0) as u64 + 5_000;
        feeds.tick(later);
        assert_eq!(feeds.readings()[0].last_heard, start, "not heard yet");
        feed.heard();
        assert_eq!(feeds.readings()[0].last_heard, later as f64 / 1000.0);
        // The clock never goes back.
        feeds.tick(10);
        feed.heard();
        assert_eq!(feeds.readings()[0].last_heard, later as f64 / 1000.0);
        let r = &feeds.readings()[0];
        assert_eq!(
            (&*r.source, &*r.cluster, r.heartbeats, r.watched),
            ("http", "picl", true, true)
        );
        feed.set_watched(false);
        assert!(!feeds.readings()[0].watched);
    }
}
