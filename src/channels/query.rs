//! Questions to the shards while they run (the query API): a question goes
//! into each shard's queue like a record and is answered between records,
//! from the shard's own state; the asker merges the answers
//! ([`crate::keyed::query`] says how each part answers).
//!
//! The asker holds the shards' queues weakly: a question never keeps the
//! pipeline from shutting down, and once it has, questions get no answer.

use super::router::ShardMsg;
use crate::flux::resource::RankState;
use crate::keyed::alerts::watch::SavedWatchAlert;
use crate::keyed::query::{AlertPosition, ClusterCounts, JobFilter, Position};
use crate::output::{AlertRecord, JobRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// A question every shard answers for its part.
#[derive(Debug, Clone)]
pub enum Query {
    /// The first `limit` jobs after `after` that the filter takes.
    Jobs {
        filter: JobFilter,
        after: Option<Position>,
        limit: usize,
    },
    /// The ranks of every cluster (or one) this shard keeps; with a
    /// queue, only the ranks of that queue where it is configured.
    Nodes {
        cluster: Option<String>,
        queue: Option<String>,
    },
    /// The `[queues]` tables of the clusters (or one) whose resource
    /// state this shard keeps.
    Queues { cluster: Option<String> },
    /// Each cluster's counts.
    Clusters,
    /// The first `limit` alerts firing now after `after`, in every
    /// cluster (or one).
    Alerts {
        cluster: Option<String>,
        after: Option<AlertPosition>,
        limit: usize,
    },
}

/// What a job looks like to the query API: its summary record and where
/// it stands now.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobNow {
    #[serde(flatten)]
    pub record: JobRecord,
    /// When it entered its current state.
    pub state_since: Option<f64>,
    /// Asked about one job: its alert conditions (`firing`, or `pending`
    /// until their rule's duration has passed), as the alerts stream
    /// shapes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alerts: Option<Vec<AlertRecord>>,
    /// Asked about one job: how far its execution has come (prolog,
    /// epilog, exec eventlog).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<serde_json::Value>,
}

/// A cluster's `[queues]` table as the forwarder sent it, and the ranks
/// of each of its queues that is not virtual.
#[derive(Debug, Clone)]
pub struct ClusterQueues {
    pub cluster: String,
    pub config: crate::flux::queues::QueueConfig,
    pub slices: Vec<(String, crate::flux::idset::IdSet)>,
}

/// One shard's answer.
#[derive(Debug)]
pub enum Answer {
    /// A page of jobs, and where this part stopped looking if it
    /// stopped short ([`crate::keyed::query::JobPage::stopped_at`]).
    Jobs(Vec<(Position, JobNow)>, Option<Position>),
    Nodes(Vec<(String, RankState)>),
    Queues(Vec<ClusterQueues>),
    Clusters(BTreeMap<String, ClusterCounts>),
    /// Alert records, as the alerts stream has them, with their places;
    /// and how many fire in this part in all.
    Alerts(Vec<(AlertPosition, AlertRecord)>, usize),
}

/// A question on its way to one shard, with where the answer goes.
#[derive(Debug)]
pub struct Asked {
    pub query: Query,
    pub reply: oneshot::Sender<Answer>,
}

/// No answer: the pipeline is shutting down (or a shard has stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pipeline is not running")]
pub struct Unavailable;

/// The partitions of one topic that a source of this pipeline owns now.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Owned {
    pub source: String,
    pub topic: String,
    pub owned: BTreeSet<i32>,
    /// How many partitions the topic has (`None` until known).
    pub partitions: Option<i32>,
}

/// Which input partitions this pipeline owns, as its Kafka sources say:
/// in a consumer group each member answers for these, and says so with
/// every answer, so that whoever merges the members' answers knows when a
/// partition had no answer.
#[derive(Debug, Clone, Default)]
pub struct Ownership(Arc<Mutex<BTreeMap<(String, String), Owned>>>);

impl Ownership {
    fn edit(&self, source: &str, topic: &str, f: impl FnOnce(&mut Owned)) {
        if let Ok(mut map) = self.0.lock() {
            let entry = map
                .entry((source.to_string(), topic.to_string()))
                .or_insert_with(|| Owned {
                    source: source.to_string(),
                    topic: topic.to_string(),
                    ..Owned::default()
                });
            f(entry);
        }
    }

    /// A source's topic has `n` partitions.
    pub fn set_partitions(&self, source: &str, topic: &str, n: i32) {
        self.edit(source, topic, |o| o.partitions = Some(n));
    }

    /// A source owns these partitions of its topics now (and no others of
    /// `topics`).
    pub fn set_owned(&self, source: &str, topics: &[String], owned: &BTreeSet<(String, i32)>) {
        for topic in topics {
            let mine = owned
                .iter()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p)
                .collect();
            self.edit(source, topic, |o| o.owned = mine);
        }
    }

    /// Every topic's, or `None` when no source reads partitions.
    pub fn report(&self) -> Option<Vec<Owned>> {
        let map = self.0.lock().ok()?;
        (!map.is_empty()).then(|| map.values().cloned().collect())
    }
}

/// The alerts of the feed watch firing now (`feed_silent`,
/// `instance_down`): no shard holds them, so they are answered beside
/// the shards' answers, from what the watch last said.
#[derive(Debug, Clone, Default)]
pub struct WatchFiring(Arc<Mutex<Told>>);

/// What the watch last told.
#[derive(Debug, Default)]
struct Told {
    /// Alert records with their places, in order.
    firing: Vec<(AlertPosition, AlertRecord)>,
    /// The same, as a checkpoint keeps them.
    saved: Vec<SavedWatchAlert>,
}

impl WatchFiring {
    /// What fires now, in any order, and as a checkpoint keeps it.
    pub fn set(&self, mut firing: Vec<(AlertPosition, AlertRecord)>, saved: Vec<SavedWatchAlert>) {
        firing.sort_by(|a, b| a.0.cmp(&b.0));
        if let Ok(mut told) = self.0.lock() {
            *told = Told { firing, saved };
        }
    }

    /// What fires now, for a checkpoint.
    pub fn saved(&self) -> Vec<SavedWatchAlert> {
        self.0
            .lock()
            .map_or_else(|_| Vec::new(), |told| told.saved.clone())
    }

    /// The clusters with a watch alert firing.
    fn clusters(&self) -> BTreeSet<String> {
        self.0.lock().map_or_else(
            |_| BTreeSet::new(),
            |told| {
                told.firing
                    .iter()
                    .map(|(p, _)| p.cluster.to_string())
                    .collect()
            },
        )
    }

    /// The part of an alerts question the watch answers.
    fn answer(&self, cluster: Option<&str>, after: Option<&AlertPosition>, limit: usize) -> Answer {
        let Ok(told) = self.0.lock() else {
            return Answer::Alerts(Vec::new(), 0);
        };
        let mine = told
            .firing
            .iter()
            .filter(|(p, _)| cluster.is_none_or(|c| *p.cluster == *c));
        let total = mine.clone().count();
        let page = mine
            .filter(|(p, _)| after.is_none_or(|a| p > a))
            .take(limit)
            .cloned()
            .collect();
        Answer::Alerts(page, total)
    }
}

/// The asker's end: every shard's queue, held weakly; which partitions
/// the answers cover; and the watch's alerts.
#[derive(Debug, Clone, Default)]
pub struct Questions {
    shards: Vec<mpsc::WeakSender<ShardMsg>>,
    pub ownership: Ownership,
    watch: WatchFiring,
}

impl Questions {
    pub fn new(
        shards: &[mpsc::Sender<ShardMsg>],
        ownership: Ownership,
        watch: WatchFiring,
    ) -> Self {
        Questions {
            shards: shards.iter().map(mpsc::Sender::downgrade).collect(),
            ownership,
            watch,
        }
    }

    /// Clusters the watch has an alert for (a feed silent from the
    /// start has no job nor node to show its cluster by).
    pub fn watch_clusters(&self) -> BTreeSet<String> {
        self.watch.clusters()
    }

    /// Ask every shard; their answers, in shard order (and the watch's
    /// part of an alerts question last).
    pub async fn ask(&self, query: &Query) -> Result<Vec<Answer>, Unavailable> {
        let mut replies = Vec::with_capacity(self.shards.len());
        for shard in &self.shards {
            let tx = shard.upgrade().ok_or(Unavailable)?;
            let (reply, answer) = oneshot::channel();
            let asked = Box::new(Asked {
                query: query.clone(),
                reply,
            });
            tx.send(ShardMsg::Query(asked))
                .await
                .map_err(|_| Unavailable)?;
            replies.push(answer);
        }
        let mut answers = Vec::with_capacity(replies.len() + 1);
        for answer in replies {
            answers.push(answer.await.map_err(|_| Unavailable)?);
        }
        if let Query::Alerts {
            cluster,
            after,
            limit,
        } = query
        {
            answers.push(
                self.watch
                    .answer(cluster.as_deref(), after.as_ref(), *limit),
            );
        }
        Ok(answers)
    }
}
