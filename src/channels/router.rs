//! The router: records go to the shard that owns their key (a hash of
//! cluster and job id; cluster alone for resource records), so each job's
//! events stay in order and shards share no state. Behind the records, the
//! same queues carry checkpoint barriers, partition releases and restored
//! state.

use crate::checkpoint::changelog::Change;
use crate::decode::Record;
use crate::keyed::processor::Outcome;
use crate::keyed::saved::SavedState;
use foldhash::fast::FixedState;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hash, Hasher};

/// The shard hasher's fixed seed.
const SHARD_SEED: u64 = 0x5eed_f1c5_0000_0001;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot, watch};

/// How much room a source waits for when its shard's queue is full.
const WAKE_BATCH: usize = 64;

/// A source as shards know it. Records carry their source's index in the
/// pipeline's list of these rather than its names: a name shared by
/// reference count would have its count written by the source's thread and
/// the shard's for every record, a cache line moved between cores each time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceInfo {
    pub name: Arc<str>,
    /// The cluster of its records that do not name their own.
    pub cluster: Arc<str>,
}

impl SourceInfo {
    pub fn new(name: &str, cluster: &str) -> Self {
        SourceInfo {
            name: name.into(),
            cluster: cluster.into(),
        }
    }
}

/// A decoded record on its way to its shard.
#[derive(Debug)]
pub struct Routed {
    /// The index of the source it came from among the pipeline's sources;
    /// a record from an unknown index has no source name, and its cluster
    /// is its own or empty.
    pub source: usize,
    /// The partition of its source it came from, for partitioned sources
    /// (the shard names the owner: no name shared with the source's
    /// thread).
    pub partition: Option<i32>,
    pub record: Record,
}

/// What a shard's queue carries.
#[derive(Debug)]
pub enum ShardMsg {
    Record(Routed),
    /// Records in the order read: one message (and at most one wake-up of
    /// the shard) for many.
    Records(Vec<Routed>),
    /// Records of a sender that wants to know what became of them (the
    /// `http` source answers its client with the counts).
    Tallied(Vec<Routed>, Arc<Tally>),
    /// A checkpoint barrier: every record before it is applied; the shard
    /// answers with its state, encoded, then waits until released (an
    /// aligned barrier: no output of a record after it reaches a sink
    /// before every shard has reached it; the file sinks cut there).
    Barrier(oneshot::Sender<ShardSnapshot>, watch::Receiver<bool>),
    /// Drop the state of these partitions of a source (revoked): no
    /// output, no alert resolved; their new owner takes it from the
    /// changelog.
    Release {
        source: Arc<str>,
        partitions: BTreeSet<i32>,
    },
    /// Take over state restored from a changelog (a partition assigned).
    Adopt(Box<SavedState>),
    /// A question about the state (the query API), answered between
    /// records.
    Query(Box<super::query::Asked>),
}

/// What became of a sender's records, counted by the shards as they apply
/// them: final once a barrier behind them has passed.
#[derive(Debug, Default)]
pub struct Tally {
    /// Records the sender handed on.
    sent: AtomicU64,
    applied: AtomicU64,
    repeats: AtomicU64,
    refused: AtomicU64,
}

impl Tally {
    pub fn note(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Applied => &self.applied,
            Outcome::Repeat => &self.repeats,
            Outcome::Refused => &self.refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The sender handed `n` more records on.
    pub fn sent_more(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records handed on.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Records applied, repeats skipped, records refused.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.applied.load(Ordering::Relaxed),
            self.repeats.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }
}

/// What a shard answers at a barrier.
#[derive(Debug)]
pub struct BarrierReply {
    /// Its whole state, encoded, for the local checkpoint.
    pub state: crate::checkpoint::file::ShardBytes,
    /// What changed since the previous barrier in state owned by
    /// partitions whose source keeps a changelog.
    pub changes: Vec<Change>,
}

/// A shard's answer at a barrier, or why its state could not be encoded.
pub type ShardSnapshot = Result<BarrierReply, crate::checkpoint::file::CheckpointError>;

/// The pipeline has shut down: nothing more can be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pipeline is shutting down")]
pub struct Closed;

/// A barrier under way: the shards' answers, and their release.
#[derive(Debug)]
pub struct Barrier {
    pub replies: Vec<oneshot::Receiver<ShardSnapshot>>,
    /// Send `true` (or drop) to let the shards go on.
    pub release: watch::Sender<bool>,
}

/// Sends records to the shard that owns their key.
#[derive(Debug, Clone)]
pub struct Router {
    shards: Arc<[mpsc::Sender<ShardMsg>]>,
}

impl Router {
    pub fn new(shards: Vec<mpsc::Sender<ShardMsg>>) -> Self {
        Router {
            shards: shards.into(),
        }
    }

    /// The shard index of a key. The hasher has fixed keys, so a key maps to
    /// the same shard in every run.
    pub fn shard_of(&self, cluster: &str, id: Option<u64>) -> usize {
        Self::shard_index(self.shards.len(), cluster, id)
    }

    /// The shard index of a key among `n` shards.
    pub fn shard_index(n: usize, cluster: &str, id: Option<u64>) -> usize {
        let mut h = FixedState::with_seed(SHARD_SEED).build_hasher();
        cluster.hash(&mut h);
        id.hash(&mut h);
        (h.finish() % n.max(1) as u64) as usize
    }

    /// Send one record to shard `i` (its key's: [`Router::shard_of`]);
    /// waits while the shard's queue is full.
    pub async fn send(&self, i: usize, routed: Routed) -> Result<(), Closed> {
        self.send_msg(i, ShardMsg::Record(routed)).await
    }

    /// Send records, in order, to shard `i` in one message; with a tally,
    /// the shard counts there what became of each.
    pub async fn send_batch(
        &self,
        i: usize,
        batch: Vec<Routed>,
        tally: Option<&Arc<Tally>>,
    ) -> Result<(), Closed> {
        let msg = match tally {
            Some(t) => {
                t.sent_more(batch.len());
                ShardMsg::Tallied(batch, t.clone())
            }
            None => ShardMsg::Records(batch),
        };
        self.send_msg(i, msg).await
    }

    async fn send_msg(&self, i: usize, msg: ShardMsg) -> Result<(), Closed> {
        let shard = self.shards.get(i).ok_or(Closed)?;
        match shard.try_send(msg) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Closed),
            Err(mpsc::error::TrySendError::Full(msg)) => {
                // The shard is behind: wait until it has taken a batch, not
                // one record, so the two threads do not wake each other
                // (a system call each way) for every record.
                let want = WAKE_BATCH.min(shard.max_capacity());
                let mut permits = shard.reserve_many(want).await.map_err(|_| Closed)?;
                permits.next().ok_or(Closed)?.send(msg);
                Ok(())
            }
        }
    }

    /// How many shards there are.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Tell every shard, behind what was already sent, to drop the state
    /// of these partitions.
    pub async fn release(
        &self,
        source: &Arc<str>,
        partitions: BTreeSet<i32>,
    ) -> Result<(), Closed> {
        for shard in self.shards.iter() {
            let msg = ShardMsg::Release {
                source: source.clone(),
                partitions: partitions.clone(),
            };
            shard.send(msg).await.map_err(|_| Closed)?;
        }
        Ok(())
    }

    /// Deal restored state out to the shards that own its keys.
    pub async fn adopt(&self, state: SavedState) -> Result<(), Closed> {
        let n = self.shards.len();
        let parts = state.split(n, |c, id| Self::shard_index(n, c, id));
        for (shard, part) in self.shards.iter().zip(parts) {
            if part.is_empty() {
                continue;
            }
            shard
                .send(ShardMsg::Adopt(Box::new(part)))
                .await
                .map_err(|_| Closed)?;
        }
        Ok(())
    }

    /// Put a barrier behind everything already sent to every shard; one
    /// receiver per shard, in shard order, for its state, and the release
    /// the shards wait for once they have answered (`true`, or dropped).
    pub async fn barrier(&self) -> Result<Barrier, Closed> {
        let (release, held) = watch::channel(false);
        let mut replies = Vec::with_capacity(self.shards.len());
        for shard in self.shards.iter() {
            let (tx, rx) = oneshot::channel();
            shard
                .send(ShardMsg::Barrier(tx, held.clone()))
                .await
                .map_err(|_| Closed)?;
            replies.push(rx);
        }
        Ok(Barrier { replies, release })
    }
}
