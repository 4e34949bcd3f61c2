//! The link between sources and the checkpoint coordinator
//! ([`crate::checkpoint::coordinator`]): a source is asked for a round,
//! reports its positions and waits for the barrier, learns when a
//! checkpoint is on disk, and (Kafka) takes the state changes it must
//! write to its changelog.

use crate::checkpoint::changelog::Change;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, watch};

/// What sources tell the coordinator.
#[derive(Debug)]
pub enum SourceReport {
    /// A source's positions for round `seq`; the source waits until
    /// `resume` is answered or dropped.
    Positions {
        source: Arc<str>,
        seq: u64,
        positions: String,
        resume: oneshot::Sender<()>,
    },
    /// A source has stopped, with its final positions if it has any.
    Finished {
        source: Arc<str>,
        positions: Option<String>,
    },
    /// A source needs a checkpoint soon (a partition is being handed to
    /// another member): the next round starts now.
    Hurry,
}

/// The state changes of one round for a source's changelog; answer
/// `done` once the broker holds them.
#[derive(Debug)]
pub struct ChangelogBatch {
    pub seq: u64,
    pub changes: Vec<Change>,
    pub done: oneshot::Sender<Result<(), String>>,
}

/// Where a source that keeps a changelog takes its batches from.
pub type ChangelogRx = mpsc::Receiver<ChangelogBatch>;

/// A source's end of the protocol.
#[derive(Debug, Clone)]
pub struct CheckpointLink {
    requests: watch::Receiver<u64>,
    /// The last round whose checkpoint is on disk.
    written: watch::Receiver<u64>,
    reports: mpsc::Sender<SourceReport>,
    restored: Option<Arc<str>>,
    changelog: Arc<Mutex<Option<ChangelogRx>>>,
}

impl CheckpointLink {
    /// The coordinator's link for one source.
    pub(crate) fn new(
        requests: watch::Receiver<u64>,
        written: watch::Receiver<u64>,
        reports: mpsc::Sender<SourceReport>,
        restored: Option<Arc<str>>,
        changelog: Option<ChangelogRx>,
    ) -> Self {
        CheckpointLink {
            requests,
            written,
            reports,
            restored,
            changelog: Arc::new(Mutex::new(changelog)),
        }
    }

    /// A link to no coordinator (tests, tools): never asked, reports go
    /// nowhere.
    pub fn detached(restored: Option<String>) -> Self {
        let (_, requests) = watch::channel(0);
        let (_, written) = watch::channel(0);
        let (reports, _) = mpsc::channel(1);
        CheckpointLink {
            requests,
            written,
            reports,
            restored: restored.map(Arc::from),
            changelog: Arc::default(),
        }
    }

    /// The changelog batches for this source, if it keeps a changelog
    /// (once: the first caller takes them).
    pub fn take_changelog(&self) -> Option<ChangelogRx> {
        self.changelog.lock().ok().and_then(|mut c| c.take())
    }

    /// The positions this source saved in the checkpoint restored, in its
    /// own JSON form.
    pub fn restored(&self) -> Option<&str> {
        self.restored.as_deref()
    }

    /// The round the coordinator asks for, if one is waiting for this source.
    pub fn pending(&mut self) -> Option<u64> {
        match self.requests.has_changed() {
            Ok(true) => Some(*self.requests.borrow_and_update()),
            _ => None,
        }
    }

    /// Wait until a round is asked for (forever, with no coordinator);
    /// returns it, as seen by this handle (so [`Self::pending`] on the same
    /// handle says nothing more of it).
    pub async fn requested(&mut self) -> u64 {
        if self.requests.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.requests.borrow_and_update()
    }

    /// The last round whose checkpoint is safely on disk (0: none yet).
    pub fn written(&self) -> u64 {
        *self.written.borrow()
    }

    /// Wait until another checkpoint is on disk (forever, with no
    /// coordinator).
    pub async fn next_written(&mut self) -> u64 {
        if self.written.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.written.borrow_and_update()
    }

    /// Wait until a checkpoint of a round after `seq` is on disk; false if
    /// none will come (the coordinator has stopped). Any number of callers
    /// may wait at once.
    pub async fn written_after(&self, seq: u64) -> bool {
        let mut written = self.written.clone();
        written.wait_for(|w| *w > seq).await.is_ok()
    }

    /// Hand over positions for round `seq` and wait until the barrier is
    /// behind what this source sent.
    pub async fn report(&self, source: &Arc<str>, seq: u64, positions: String) {
        let (resume, resumed) = oneshot::channel();
        let report = SourceReport::Positions {
            source: source.clone(),
            seq,
            positions,
            resume,
        };
        if self.reports.send(report).await.is_ok() {
            let _ = resumed.await;
        }
    }

    /// Ask for a round now rather than at the next interval (the request
    /// is dropped if the coordinator is busy: a round is coming anyway).
    pub fn hurry(&self) {
        let _ = self.reports.try_send(SourceReport::Hurry);
    }

    /// Tell the coordinator this source has stopped.
    pub async fn finish(&self, source: &Arc<str>, positions: Option<String>) {
        let report = SourceReport::Finished {
            source: source.clone(),
            positions,
        };
        let _ = self.reports.send(report).await;
    }
}
