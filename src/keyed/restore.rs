//! State coming and going whole: a processor takes over saved state (a
//! checkpoint's at start, a changelog's when partitions are assigned) and
//! gives back what revoked partitions owned. What it did comes back as
//! values, for the caller's metrics and alerts.

use super::JobKey;
use super::alerts::engine::{AlertEvent, SavedCondition, Subject};
use super::owners::owned_by;
use super::processor::Processor;
use super::saved::SavedState;
use super::state::JobEntry;
use crate::flux::job::{Job, JobState};
use compact_str::CompactString;
use foldhash::HashMap;
use std::collections::BTreeSet;
use std::sync::Arc;

/// A job that left: its last entry (its alert conditions taken), and the
/// rules whose conditions on it were given up.
#[derive(Debug)]
pub struct Gone {
    pub key: JobKey,
    pub entry: Box<JobEntry>,
    pub rules: Vec<usize>,
}

/// Active jobs counted by (cluster, queue, state, user), the cluster by
/// its index in [`Restored::clusters`].
pub type ActiveCounts = HashMap<(u32, Option<CompactString>, JobState, Option<i64>), i64>;

/// What taking over saved state did.
#[derive(Debug, Default)]
pub struct Restored {
    /// Alerts that were firing when the state was saved: announced again.
    pub firing: Vec<AlertEvent>,
    /// Jobs held already that the saved ones replaced.
    pub replaced: Vec<Gone>,
    /// The clusters of the jobs taken over, in the order met.
    pub clusters: Vec<Arc<str>>,
    /// The active jobs taken over.
    pub active: ActiveCounts,
    /// Each active job's cluster (by index), state and the time it entered
    /// it.
    pub entered: Vec<(u32, JobState, Option<f64>)>,
    /// The clusters whose resource state was taken over.
    pub resources: Vec<String>,
}

/// A take-over part by part under way ([`Processor::restore_part`]).
#[derive(Debug, Default)]
pub struct Restoring {
    out: Restored,
    /// The jobs taken over, to list at the end.
    unlisted: Vec<super::state::Unlisted>,
    /// Conditions whose subjects were not at hand when met.
    out_of_order: Vec<SavedCondition>,
}

/// What revoked partitions owned, given back.
#[derive(Debug, Default)]
pub struct Released {
    pub jobs: Vec<Gone>,
    /// Clusters whose resource state went (their nodes' conditions too).
    pub clusters: Vec<String>,
}

/// Whether a job is counted among the active ones.
pub fn is_active(job: &Job) -> bool {
    job.submitted && !job.invalidated && job.state != JobState::Inactive
}

impl Processor {
    /// Take over saved state: the jobs and ranks, the alert conditions
    /// (fired ones stay fired), the jobs remembered as finished, the event
    /// clock (one a made-up date moved beyond belief stays behind) and
    /// the time to live of ended jobs (from their end).
    pub fn restore(&mut self, saved: SavedState) -> Restored {
        let mut restoring = Restoring::default();
        self.restore_part(&mut restoring, saved);
        self.end_restore(restoring)
    }

    /// [`Processor::restore`] a part at a time, as a checkpoint's parts
    /// are decoded: what is taken over is held at once; the listing, the
    /// draining ranks and the conditions of subjects not met yet wait for
    /// [`Processor::end_restore`].
    pub fn restore_part(&mut self, restoring: &mut Restoring, saved: SavedState) {
        let Restoring {
            out,
            unlisted,
            out_of_order,
        } = restoring;
        let latest = self.latest_plausible();
        for (cluster, t) in saved.clock.clusters() {
            if t <= latest {
                self.event_clock.advance(cluster, t);
            } else {
                tracing::warn!(
                    cluster,
                    t,
                    "a restored event clock beyond belief is set aside"
                );
            }
        }
        self.owners.restore(saved.resource_owners);
        for (cluster, ids) in saved.finished {
            let cluster = self.state.intern(&cluster);
            self.finished.restore(&cluster, ids);
        }
        for (cluster, res) in saved.resources {
            out.resources.push(cluster.clone());
            self.state.insert_resources(cluster, res);
        }
        // Room for the part's jobs at once: a growth per part at most
        // (a million jobs in parts of 65,536: five), not one per doubling
        // of the table. (Room for all parts at the first, guessed from
        // its jobs, measured no faster, and a guess is wrong for a shard
        // dealt none of the first part, or a cluster all in it.) Nothing
        // in this loop touches a reference count or a metric per job:
        // each is an atomic operation, which waits for the table's
        // pending cache misses.
        self.state.reserve_jobs(saved.jobs.iter().map(|(k, _)| k));
        out.entered.reserve(saved.jobs.len());
        unlisted.reserve(saved.jobs.len());
        // A checkpoint lists jobs' conditions in the order of the jobs: each
        // goes into its job's entry while the entry is at hand. What is out
        // of that order (nodes', an older layout's) is looked up after.
        let mut conditions = saved.alerts.into_iter().peekable();
        let mut last: Option<(Arc<str>, u32)> = None;
        for (key, mut entry) in saved.jobs {
            let own = |c: &SavedCondition| matches!(&c.subject, Subject::Job(k) if *k == key);
            while conditions
                .peek()
                .is_some_and(|c| !own(c) && !matches!(c.subject, Subject::Job(_)))
            {
                out_of_order.extend(conditions.next());
            }
            // Held already (left from a checkpoint): the restored one wins.
            // The held one goes first, so releasing its conditions cannot
            // take the restored ones' places in the firing index. (Listed
            // first if it came in this restore, so its listing goes too.)
            if self.state.jobs.contains_key(&key) {
                self.state.list(&out.clusters, std::mem::take(unlisted));
                if let Some(old) = self.remove_job(&key) {
                    out.replaced.push(old);
                }
            }
            let mine = std::iter::from_fn(|| conditions.next_if(own));
            self.alerts
                .restore_job(mine, &mut entry.alerts, &mut out.firing);
            // Decoded keys share a copy of their cluster's name per decoding
            // thread: the processor takes the first it meets as its own and
            // leaves the keys as they are (keys compare equal by name).
            let cluster = match &last {
                Some((name, i)) if Arc::ptr_eq(name, &key.cluster) => *i,
                _ => {
                    let i = match out.clusters.iter().position(|c| *c == key.cluster) {
                        Some(i) => i,
                        None => {
                            // The state's own copy: the listing and the
                            // metrics keep it, and live records' keys
                            // (interned) then match it by address.
                            out.clusters.push(self.state.adopt(&key.cluster));
                            out.clusters.len() - 1
                        }
                    };
                    let i = u32::try_from(i).unwrap_or(u32::MAX);
                    last = Some((key.cluster.clone(), i));
                    i
                }
            };
            let job = &entry.job;
            self.track_restored(&key, &entry);
            if is_active(job) {
                let queue = job.queue().map(CompactString::from);
                *out.active
                    .entry((cluster, queue, job.state, job.userid()))
                    .or_insert(0) += 1;
                out.entered.push((cluster, job.state, job.t_state()));
            }
            unlisted.push(self.state.insert_unlisted(&key, entry, cluster));
        }
        out_of_order.extend(conditions);
    }

    /// The end of a take-over part by part: the jobs are listed, the
    /// draining ranks looked at again and the conditions of subjects met
    /// out of order restored.
    pub fn end_restore(&mut self, restoring: Restoring) -> Restored {
        let Restoring {
            mut out,
            unlisted,
            out_of_order,
        } = restoring;
        self.state.list(&out.clusters, unlisted);
        // Draining as the jobs held now say (processors restore side by
        // side: holds of other processors' jobs come in as they do, and the
        // next refresh looks at them).
        self.state.recheck_draining();
        let firing = self.alerts.restore(out_of_order, &mut self.state.jobs);
        out.firing.extend(firing);
        // Announced again: the subjects' conditions are to be logged.
        self.alerted(&out.firing);
        out
    }

    /// Drop the state owned by these partitions of `source`, as if it had
    /// never been here: its alert conditions go with it, none fires or
    /// resolves.
    pub fn release(&mut self, source: &str, partitions: &BTreeSet<i32>) -> Released {
        let keys: Vec<JobKey> = self
            .state
            .jobs
            .iter()
            .filter(|(_, e)| {
                e.owner
                    .as_deref()
                    .is_some_and(|o| owned_by(o, source, partitions))
            })
            .map(|(k, _)| k.to_key())
            .collect();
        let mut out = Released::default();
        for key in keys {
            self.owners.release_job(&key);
            out.jobs.extend(self.remove_job(&key));
        }
        out.clusters = self.owners.release_resources(source, partitions);
        for cluster in &out.clusters {
            self.state.remove_resources(cluster);
            for node in self.alerts.node_subjects(cluster) {
                self.alerts.release_node(&node);
            }
        }
        out
    }

    /// Take a job out, its alert conditions given up silently.
    fn remove_job(&mut self, key: &JobKey) -> Option<Gone> {
        let mut entry = self.state.remove_job(key)?;
        let conditions = std::mem::take(&mut entry.alerts);
        let rules = self.alerts.release_job(conditions, key);
        Some(Gone {
            key: key.clone(),
            entry,
            rules,
        })
    }
}
