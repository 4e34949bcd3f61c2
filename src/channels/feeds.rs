//! When each feed was last heard: a source notes every line it reads (a
//! blank line and an empty `POST` are heartbeats, heard and not applied),
//! and the feed watch ([`crate::operators::feed_watch`]) reads the notes
//! on the wall clock to tell an idle cluster from a dead feed.
//!
//! A note costs two relaxed atomic operations on the per-line path: the
//! watch keeps a coarse clock (milliseconds, moved on every tenth of a
//! second) that the notes copy, so no source reads the system clock per
//! line.

use crate::keyed::state::ClusterBudget;
use std::collections::HashMap;
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
    /// The clusters the pipeline follows (`operators.max_clusters`): a
    /// cluster named in records gets a feed only if it is one of them, so
    /// a flood of made-up names makes no series the shards refuse.
    clusters: ClusterBudget,
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

/// A source's handle on its feed: note that it was heard. Records that
/// name a cluster other than the source's are that cluster's feed of the
/// source, made when first heard ([`Feed::heard_for`]).
#[derive(Debug, Clone)]
pub struct Feed {
    feeds: Feeds,
    source: Arc<str>,
    heartbeats: bool,
    last: Arc<AtomicU64>,
    watched: Arc<AtomicBool>,
    /// The feeds of the clusters its records named, by name.
    named: Arc<Mutex<HashMap<Box<str>, Arc<AtomicU64>>>>,
}

fn wall_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Default for Feeds {
    fn default() -> Self {
        Feeds::following(ClusterBudget::default())
    }
}

impl Feeds {
    /// The feeds of a pipeline that follows the clusters of `clusters`
    /// (shared with its shards: whichever meets a cluster first admits it).
    pub fn following(clusters: ClusterBudget) -> Self {
        Feeds(Arc::new(Inner {
            now: AtomicU64::new(wall_millis()),
            list: Mutex::new(Vec::new()),
            clusters,
        }))
    }

    /// A feed of `source` for `cluster`, heard as of now.
    pub fn register(&self, source: &str, cluster: &str, heartbeats: bool) -> Feed {
        let watched = Arc::new(AtomicBool::new(true));
        let source: Arc<str> = source.into();
        let last = self.add(&source, cluster, heartbeats, &watched);
        Feed {
            feeds: self.clone(),
            source,
            heartbeats,
            last,
            watched,
            named: Arc::default(),
        }
    }

    /// A feed in the list, heard as of now; its last word.
    fn add(
        &self,
        source: &Arc<str>,
        cluster: &str,
        heartbeats: bool,
        watched: &Arc<AtomicBool>,
    ) -> Arc<AtomicU64> {
        let last = Arc::new(AtomicU64::new(self.0.now.load(Ordering::Relaxed)));
        let mut list = self.0.list.lock().unwrap_or_else(|e| e.into_inner());
        list.push(Registered {
            source: source.clone(),
            cluster: cluster.into(),
            heartbeats,
            last: last.clone(),
            watched: watched.clone(),
        });
        last
    }

    /// Move the coarse clock to `now` (milliseconds since the epoch).
    pub fn tick(&self, now: u64) {
        self.0.now.fetch_max(now, Ordering::Relaxed);
    }

    /// Move the coarse clock to the wall clock.
    pub fn tick_wall(&self) {
        self.tick(wall_millis());
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

    /// The feed was heard (a line).
    #[inline]
    pub fn heard(&self) {
        self.note(&self.last);
    }

    #[inline]
    fn note(&self, last: &AtomicU64) {
        let now = self.feeds.0.now.load(Ordering::Relaxed);
        // A store only once a tick: the line path does not write a
        // shared cache line per line.
        if last.load(Ordering::Relaxed) < now {
            last.store(now, Ordering::Relaxed);
        }
    }

    /// A heartbeat (a blank line, an empty `POST`): the feeder lives, for
    /// every cluster it has sent (a heartbeat names none).
    pub fn heartbeat(&self) {
        self.heard();
        let named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        for last in named.values() {
            self.note(last);
        }
    }

    /// This source's feed of `cluster` (its own, or one its records
    /// named) was last heard at `at`, seconds since the epoch: what a
    /// restart restores of a feed that had gone silent. A named cluster
    /// the pipeline no longer follows (its state gone, or refused by an
    /// older version) gets no feed again, nor a place among those
    /// followed: its records make it if they come.
    pub fn heard_last_at(&self, own: &str, cluster: &str, at: f64) {
        let at = (at.max(0.0) * 1000.0) as u64;
        if cluster == own {
            self.last.store(at, Ordering::Relaxed);
            return;
        }
        if !self.feeds.0.clusters.knows(cluster) {
            return;
        }
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = self.named_feed(&mut named, cluster) {
            last.store(at, Ordering::Relaxed);
        }
    }

    /// A record named `cluster`: that cluster's feed of this source was
    /// heard (made, and watched from now, the first time).
    pub fn heard_for(&self, cluster: &str) {
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = self.named_feed(&mut named, cluster) {
            self.note(last);
        }
    }

    /// The last word of this source's feed of `cluster`, made (heard as
    /// of now) the first time; none past [`NAMED_MAX`], nor for a cluster
    /// the pipeline does not follow.
    fn named_feed<'m>(
        &self,
        named: &'m mut HashMap<Box<str>, Arc<AtomicU64>>,
        cluster: &str,
    ) -> Option<&'m Arc<AtomicU64>> {
        if !named.contains_key(cluster)
            && named.len() < NAMED_MAX
            && self.feeds.0.clusters.admit(cluster)
        {
            let last = self
                .feeds
                .add(&self.source, cluster, self.heartbeats, &self.watched);
            named.insert(cluster.into(), last);
        }
        named.get(cluster)
    }
}

/// Clusters a source's records may name that get a feed of their own:
/// what a feed that names a new cluster in every line can make the watch
/// hold.
pub const NAMED_MAX: usize = 1000;

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

    #[test]
    fn clusters_named_in_records_are_feeds_of_their_own() {
        let budget = ClusterBudget::default();
        let feeds = Feeds::following(budget.clone());
        let feed = feeds.register("kafka", "picl", true);
        let start = feeds.readings()[0].last_heard;
        let t = (start * 1000.0) as u64;
        feeds.tick(t + 1_000);
        feed.heard_for("other");
        feeds.tick(t + 2_000);
        feed.heard_for("other");
        let r = feeds.readings();
        assert_eq!(r.len(), 2);
        assert_eq!((&*r[1].source, &*r[1].cluster), ("kafka", "other"));
        assert_eq!(r[1].last_heard, (t + 2_000) as f64 / 1000.0);
        assert_eq!(r[0].last_heard, start, "the source's own not heard");
        // A heartbeat is every cluster's; being watched too.
        feeds.tick(t + 3_000);
        feed.heartbeat();
        assert!(
            feeds
                .readings()
                .iter()
                .all(|r| r.last_heard == (t + 3_000) as f64 / 1000.0)
        );
        feed.set_watched(false);
        assert!(feeds.readings().iter().all(|r| !r.watched));
        // Restored: the source's own, and a named one the pipeline
        // follows made if need be (once: its records find it).
        assert!(budget.admit("far"));
        feed.heard_last_at("picl", "picl", 1.5);
        feed.heard_last_at("picl", "far", 2.5);
        feed.heard_for("far");
        let r = feeds.readings();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].last_heard, 1.5);
        assert_eq!(
            (&*r[2].cluster, r[2].last_heard),
            ("far", (t + 3_000) as f64 / 1000.0)
        );
        // Capped.
        for i in 0..NAMED_MAX + 5 {
            feed.heard_for(&format!("c{i}"));
        }
        assert_eq!(feeds.readings().len(), 1 + NAMED_MAX);
    }

    #[test]
    fn no_feed_is_made_for_a_cluster_the_pipeline_does_not_follow() {
        let budget = ClusterBudget::new(3);
        let feeds = Feeds::following(budget.clone());
        let feed = feeds.register("socket", "own", true);
        // The shards followed "own" first; two more fit. A restored feed
        // of a cluster not followed takes none of them.
        assert!(budget.admit("own"));
        feed.heard_last_at("own", "restored", 2.0);
        for i in 0..10 {
            feed.heard_for(&format!("made-up-{i}"));
        }
        let clusters: Vec<String> = feeds
            .readings()
            .iter()
            .map(|r| r.cluster.to_string())
            .collect();
        assert_eq!(clusters, ["own", "made-up-0", "made-up-1"]);
        // Those the feeds admitted are followed by the shards too.
        assert!(budget.admit("made-up-1") && !budget.admit("made-up-2"));
    }
}
