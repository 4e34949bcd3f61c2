//! How long a processor holds what it no longer needs: a state
//! time-to-live on processing time, as Flink's state TTL. An INACTIVE job
//! is dropped `inactive_grace` after it ended (the grace lets a late repeat
//! of its records be recognized rather than start a new job); a job that
//! never got its submit is dropped `orphan_ttl` after it was first seen.
//!
//! Deadlines run on a monotonic clock, read when a job ends or first
//! appears; the driver says when to look ([`crate::keyed::processor::Processor::expire`]).
//! `fluxpipe replay` holds everything to the end of its input: it sets
//! none. Both queues are in deadline order (one duration each), so looking
//! costs only what is due.

use super::key::JobKey;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long each kind of finished state is kept.
#[derive(Debug, Clone, Copy)]
pub struct StateTtl {
    pub inactive_grace: Duration,
    pub orphan_ttl: Duration,
}

/// Why a job's state was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// It was INACTIVE and its grace ran out.
    Inactive,
    /// No submit arrived for it in time.
    Orphan,
}

impl Eviction {
    pub const ALL: [Eviction; 2] = [Eviction::Inactive, Eviction::Orphan];

    pub fn as_str(self) -> &'static str {
        match self {
            Eviction::Inactive => "inactive",
            Eviction::Orphan => "orphan",
        }
    }
}

/// The jobs waiting to be dropped, oldest first.
#[derive(Debug)]
pub struct Expiry {
    ttl: StateTtl,
    inactive: VecDeque<(Instant, JobKey)>,
    unsubmitted: VecDeque<(Instant, JobKey)>,
    /// Ended jobs taken over from a checkpoint or changelog, each with
    /// what was left of its grace: latest deadline first once `sorted`
    /// (they come in no order, and only at a start or a takeover).
    restored: Vec<(Instant, JobKey)>,
    sorted: bool,
}

impl Expiry {
    pub fn new(ttl: StateTtl) -> Self {
        Expiry {
            ttl,
            inactive: VecDeque::new(),
            unsubmitted: VecDeque::new(),
            restored: Vec::new(),
            sorted: true,
        }
    }

    /// The grace of an ended job.
    pub fn inactive_grace(&self) -> Duration {
        self.ttl.inactive_grace
    }

    /// An ended job taken over, due at `at` (what its grace had left).
    pub fn restored(&mut self, key: JobKey, at: Instant) {
        self.restored.push((at, key));
        self.sorted = false;
    }

    /// A job became INACTIVE at `now`.
    pub fn ended(&mut self, key: JobKey, now: Instant) {
        self.inactive
            .push_back((now + self.ttl.inactive_grace, key));
    }

    /// A job was first seen at `now` without its submit.
    pub fn unsubmitted(&mut self, key: JobKey, now: Instant) {
        self.unsubmitted.push_back((now + self.ttl.orphan_ttl, key));
    }

    /// The next job whose time is up at `now`, and which of its timers it
    /// was: the caller checks that it still applies (a job may have been
    /// dropped, or got its submit, since).
    pub fn pop_due(&mut self, now: Instant) -> Option<(JobKey, Eviction)> {
        if !self.sorted {
            self.restored
                .sort_unstable_by_key(|(at, _)| std::cmp::Reverse(*at));
            self.sorted = true;
        }
        if self.restored.last().is_some_and(|(at, _)| *at <= now) {
            return self
                .restored
                .pop()
                .map(|(_, key)| (key, Eviction::Inactive));
        }
        for (queue, why) in [
            (&mut self.inactive, Eviction::Inactive),
            (&mut self.unsubmitted, Eviction::Orphan),
        ] {
            if queue.front().is_some_and(|(at, _)| *at <= now) {
                return queue.pop_front().map(|(_, key)| (key, why));
            }
        }
        None
    }

    /// Jobs waiting, of both kinds.
    pub fn len(&self) -> usize {
        self.inactive.len() + self.unsubmitted.len() + self.restored.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::jobid::JobId;

    fn key(id: u64) -> JobKey {
        JobKey {
            cluster: "c".into(),
            id: JobId(id),
        }
    }

    #[test]
    fn jobs_come_due_after_their_own_duration() {
        let mut e = Expiry::new(StateTtl {
            inactive_grace: Duration::from_secs(60),
            orphan_ttl: Duration::from_secs(600),
        });
        let t0 = Instant::now();
        e.unsubmitted(key(1), t0);
        e.ended(key(2), t0);
        e.ended(key(3), t0 + Duration::from_secs(10));
        assert_eq!(e.pop_due(t0 + Duration::from_secs(59)), None);
        assert_eq!(
            e.pop_due(t0 + Duration::from_secs(60)),
            Some((key(2), Eviction::Inactive))
        );
        assert_eq!(e.pop_due(t0 + Duration::from_secs(60)), None);
        assert_eq!(
            e.pop_due(t0 + Duration::from_secs(600)),
            Some((key(3), Eviction::Inactive))
        );
        assert_eq!(
            e.pop_due(t0 + Duration::from_secs(600)),
            Some((key(1), Eviction::Orphan))
        );
        assert!(e.is_empty());
    }

    #[test]
    fn restored_jobs_keep_what_their_grace_had_left() {
        let mut e = Expiry::new(StateTtl {
            inactive_grace: Duration::from_secs(60),
            orphan_ttl: Duration::from_secs(600),
        });
        let t0 = Instant::now();
        // In no order, as a checkpoint's parts give them.
        e.restored(key(1), t0 + Duration::from_secs(30));
        e.restored(key(2), t0);
        e.restored(key(3), t0 + Duration::from_secs(10));
        e.ended(key(4), t0);
        assert_eq!(e.pop_due(t0), Some((key(2), Eviction::Inactive)));
        assert_eq!(e.pop_due(t0), None);
        let t = t0 + Duration::from_secs(30);
        assert_eq!(e.pop_due(t), Some((key(3), Eviction::Inactive)));
        assert_eq!(e.pop_due(t), Some((key(1), Eviction::Inactive)));
        assert_eq!(e.pop_due(t), None);
        assert_eq!(e.len(), 1);
        e.restored(key(5), t0);
        assert_eq!(e.pop_due(t), Some((key(5), Eviction::Inactive)));
        assert_eq!(
            e.pop_due(t0 + Duration::from_secs(60)),
            Some((key(4), Eviction::Inactive))
        );
    }
}
