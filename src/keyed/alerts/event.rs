//! What the alert engine says: the subject of an alert (a job or a node),
//! what a condition found ([`Detail`]), and the alert events it emits
//! when a condition has held for its rule's duration, and when it clears.

use crate::flux::job::JobState;
use crate::keyed::JobKey;
use compact_str::CompactString;
use std::sync::Arc;

/// What an alert is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Subject {
    Job(JobKey),
    Node(NodeKey),
}

impl Subject {
    pub fn cluster(&self) -> &str {
        match self {
            Subject::Job(k) => &k.cluster,
            Subject::Node(n) => &n.cluster,
        }
    }
}

/// A node: a rank of a cluster.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct NodeKey {
    pub cluster: String,
    pub rank: u32,
}

/// What an alert says beyond its subject, fixed once it fires so that its
/// resolution carries the same labels (Alertmanager's identity) and
/// annotations, whenever either is sent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Detail {
    /// The job's state when the condition began (or last changed).
    State(JobState),
    /// The node's hostname, if known. Behind one pointer (a `Box<str>`
    /// takes two): the largest variant sets the size of every job
    /// condition's detail, and nodes are few.
    #[allow(clippy::box_collection)]
    Host(Option<Box<String>>),
    /// A drained node: its hostname and the drain reason, as they stood
    /// while the condition held (an undrain clears the reason from the
    /// node before the alert resolves, and a late timer may fire after it).
    /// Boxed: every job condition carries a `Detail`.
    Drained(Box<Drain>),
    /// A job of a queue: its state and queue when the condition began (or
    /// last changed). Behind one pointer, as `Drained`, and shared: jobs of
    /// one queue in one state hold the same ([`SharedDetails`]). After
    /// `Drained`, so saved conditions of the other kinds read as before.
    Queued(Arc<Queued>),
}

/// A job's state and queue, for its conditions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Queued {
    pub state: JobState,
    pub queue: CompactString,
}

/// A drained node's hostname and drain reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Drain {
    pub host: Option<String>,
    pub reason: Option<String>,
    /// A job still ran on it (draining). Saved last, with a default: older
    /// checkpoints read as before.
    #[serde(default)]
    pub draining: bool,
}

/// The queued details in use, shared: a million pending jobs of a few
/// queues hold a few, not a million. Bounded, as queue names come from the
/// input: once [`SharedDetails::MAX`] are held, those no condition holds
/// are forgotten, and past that a detail is made for its job alone.
#[derive(Debug, Default)]
pub struct SharedDetails {
    /// By state (so a look compares the queues of one state only).
    queued: [Vec<Arc<Queued>>; JobState::ALL.len()],
    len: usize,
}

impl SharedDetails {
    const MAX: usize = 256;

    /// A job's detail: its state, and its queue if it has one.
    pub fn of_job(&mut self, state: JobState, queue: Option<&str>) -> Detail {
        let Some(queue) = queue else {
            return Detail::State(state);
        };
        let same = &self.queued[state.index()];
        if let Some(q) = same.iter().find(|q| q.queue == queue) {
            return Detail::Queued(q.clone());
        }
        let q = Arc::new(Queued {
            state,
            queue: queue.into(),
        });
        if self.len >= Self::MAX {
            self.drop_unused();
        }
        if self.len < Self::MAX {
            self.queued[state.index()].push(q.clone());
            self.len += 1;
        }
        Detail::Queued(q)
    }

    /// Forget the details no condition holds any more, so that queues seen
    /// later are shared too.
    fn drop_unused(&mut self) {
        for list in &mut self.queued {
            list.retain(|q| Arc::strong_count(q) > 1);
        }
        self.len = self.queued.iter().map(Vec::len).sum();
    }

    /// A detail read back from a checkpoint, shared as if made here.
    pub fn share(&mut self, detail: Detail) -> Detail {
        match detail {
            Detail::Queued(q) => self.of_job(q.state, Some(&q.queue)),
            other => other,
        }
    }
}

impl Detail {
    /// A job's detail, its own (not shared): tests and one-off records.
    pub fn of_job(state: JobState, queue: Option<&str>) -> Detail {
        SharedDetails::default().of_job(state, queue)
    }

    /// The node's hostname, for node conditions.
    pub fn host(&self) -> Option<&str> {
        match self {
            Detail::Host(h) => h.as_deref().map(String::as_str),
            Detail::Drained(d) => d.host.as_deref(),
            Detail::State(_) | Detail::Queued(_) => None,
        }
    }

    /// The job's state, for job conditions.
    pub fn job_state(&self) -> Option<JobState> {
        match self {
            Detail::State(s) => Some(*s),
            Detail::Queued(q) => Some(q.state),
            _ => None,
        }
    }

    /// The job's queue, for job conditions of a job in one.
    pub fn queue(&self) -> Option<&str> {
        match self {
            Detail::Queued(q) => Some(&q.queue),
            _ => None,
        }
    }

    /// Whether a drained node still ran a job (`None`: not a drain).
    pub fn draining(&self) -> Option<bool> {
        match self {
            Detail::Drained(d) => Some(d.draining),
            _ => None,
        }
    }

    /// The drain reason, for a drained node.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Detail::Drained(d) => d.reason.as_deref(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Firing,
    Resolved,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Firing => "firing",
            Status::Resolved => "resolved",
        }
    }
}

/// An alert firing or resolving.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertEvent {
    /// Index into the engine's rules.
    pub rule: usize,
    pub subject: Subject,
    pub status: Status,
    /// When the condition began.
    pub since: f64,
    /// When the alert began: the condition's start plus the rule's duration.
    pub starts_at: f64,
    /// When the condition cleared (resolved alerts only).
    pub ends_at: Option<f64>,
    pub detail: Detail,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(d: &Detail) -> &Arc<Queued> {
        match d {
            Detail::Queued(q) => q,
            other => panic!("not queued: {other:?}"),
        }
    }

    #[test]
    fn jobs_of_one_queue_in_one_state_share_their_detail() {
        let mut shared = SharedDetails::default();
        let a = shared.of_job(JobState::Sched, Some("batch"));
        let b = shared.of_job(JobState::Sched, Some("batch"));
        assert!(Arc::ptr_eq(queued(&a), queued(&b)));
        let run = shared.of_job(JobState::Run, Some("batch"));
        let debug = shared.of_job(JobState::Sched, Some("debug"));
        assert!(!Arc::ptr_eq(queued(&a), queued(&run)));
        assert!(!Arc::ptr_eq(queued(&a), queued(&debug)));
        assert_eq!(
            shared.of_job(JobState::Sched, None),
            Detail::State(JobState::Sched)
        );
        // Read back from a checkpoint: shared as if made here.
        let restored = shared.share(Detail::of_job(JobState::Sched, Some("batch")));
        assert!(Arc::ptr_eq(queued(&a), queued(&restored)));
    }

    #[test]
    fn when_full_the_details_no_one_holds_make_room() {
        let mut shared = SharedDetails::default();
        let held = shared.of_job(JobState::Sched, Some("kept"));
        for i in 0..SharedDetails::MAX {
            shared.of_job(JobState::Sched, Some(&format!("q{i}")));
        }
        // Full of details no condition holds (and one that is held).
        let late = shared.of_job(JobState::Sched, Some("late"));
        let again = shared.of_job(JobState::Sched, Some("late"));
        assert!(Arc::ptr_eq(queued(&late), queued(&again)));
        let kept = shared.of_job(JobState::Sched, Some("kept"));
        assert!(Arc::ptr_eq(queued(&held), queued(&kept)));
        assert!(shared.len <= SharedDetails::MAX);
    }
}
