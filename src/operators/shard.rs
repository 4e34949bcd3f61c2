//! One shard of the job and resource operators: applies its records to its
//! part of the state and emits what changed.
//!
//! Memory stays bounded: the processor drops an INACTIVE job
//! `inactive_grace` after the record that ended it, and a job that only ever
//! got exec events after `orphan_ttl` (see [`crate::keyed::expiry`]); the
//! shard asks it to on every tick.

use crate::channels::fanout::{OutputBuffer, Outputs};
use crate::channels::router::{BarrierReply, Routed, ShardMsg, ShardSnapshot, SourceInfo};
use crate::telemetry::shard_metrics::{ShardMetrics, exception_of};

use crate::checkpoint::changelog;
use crate::checkpoint::file::{CheckpointError, Parts, Reopen, ShardStateRef, spill_path};
use crate::keyed::Owner;
use crate::keyed::alerts::Clock;
use crate::keyed::alerts::engine::AlertEvent;
use crate::keyed::alerts::rule::Rule;
use crate::keyed::expiry::StateTtl;
use crate::keyed::processor::Processor;
use crate::keyed::processor::{Outcome, Processed};
use crate::keyed::restore::{Gone, Restoring, is_active};
use crate::keyed::saved::SavedState;
use crate::output::OutputRecord;
use crate::output::effects;
use crate::telemetry::metric;
use crate::telemetry::{NodeBoard, StateAges, UserJobs};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long state is kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub inactive_grace: Duration,
    pub orphan_ttl: Duration,
    /// Most jobs this shard holds; records of new jobs beyond it are refused.
    pub max_jobs: usize,
    /// Most jobs this shard remembers after dropping them (see
    /// [`crate::keyed::finished`]).
    pub max_finished: usize,
    /// Seconds an event may be dated ahead of the wall clock.
    pub max_clock_skew: f64,
}

/// What the shards' alert engines need: the rules, the clock, and the
/// event clock they share.
#[derive(Debug, Clone, Default)]
pub struct AlertSetup {
    pub rules: Vec<Rule>,
    pub clock: Clock,
    pub shared: SharedEventClock,
}

/// The newest event timestamp per cluster over all shards, for
/// `alerts.clock = "event"`. Shards keep their own view and merge it there
/// on every tick, so the hot path takes no lock.
pub use crate::keyed::alerts::SharedEventClock;

/// Most alerts fired in one go; more wait for the next turn of the loop,
/// so input keeps flowing while a million timers come due.
const FIRE_BATCH: usize = 1024;

/// Most messages taken from the queue in one go, between looks at the
/// timers.
const DRAIN_BATCH: usize = 256;

pub struct Shard {
    /// The per-record core, shared with `fluxpipe replay`.
    processor: Processor,
    /// Alerts fired by the record in hand (kept: no allocation per record).
    fired: Vec<AlertEvent>,
    shared_clock: SharedEventClock,
    /// Outputs of the records in hand, for the sinks once they are applied.
    outputs: OutputBuffer,
    /// The job and node series this shard keeps.
    metrics: ShardMetrics,
    /// Records refused because `max_jobs` was reached.
    refused: u64,
    /// Alerts that were firing when the checkpoint restored was taken,
    /// announced again once the shard runs.
    restored_alerts: Vec<AlertEvent>,
    /// Where to encode the state at a barrier (data folder, shard index,
    /// rounds so far); in memory when unset.
    spill: Option<(PathBuf, usize, u64)>,
    /// Threads that encode the state at a barrier (this shard's share of
    /// the cores).
    encode_threads: usize,
    /// The pipeline's sources, by the index records carry: this shard's
    /// own copies of their names.
    sources: Vec<SourceInfo>,
}

/// Each shard takes over its part of a restored checkpoint, side by side
/// on threads of their own (a million jobs' take-over is about a second of
/// one core's work). The tests' reference for [`restore_from`].
#[cfg(test)]
pub fn restore_all(shards: &mut [Shard], saved: Vec<SavedState>) {
    std::thread::scope(|scope| {
        for (shard, saved) in shards.iter_mut().zip(saved) {
            scope.spawn(move || shard.restore(saved));
        }
    });
}

/// Shares of parts queued for a shard: with what each decoder holds (see
/// [`Parts::each`]), the decoders run a few parts ahead of the slowest
/// shard, no further.
const PARTS_AHEAD: usize = 2;

/// Restore `shards` from a checkpoint's parts while they are decoded:
/// each shard takes over its share of a part on a thread of its own as
/// soon as the part is decoded and dealt out by `shard_of`, while the next
/// parts are decoded (on one worker a restore took the sum of the two, on
/// two cores it takes about the longer). A damaged checkpoint fails this
/// before any part is taken over; a part that cannot be decoded fails it
/// after the parts before it were: the shards are then not to be used.
pub fn restore_from<S: Reopen>(
    shards: &mut [Shard],
    parts: Parts<S>,
    shard_of: impl Fn(&str, Option<u64>) -> usize,
) -> Result<(), CheckpointError> {
    let n = shards.len();
    std::thread::scope(|scope| {
        let mut txs = Vec::with_capacity(n);
        for shard in shards.iter_mut() {
            let (tx, rx) = std::sync::mpsc::sync_channel(PARTS_AHEAD);
            txs.push(tx);
            scope.spawn(move || shard.restore_parts(rx));
        }
        let decoded = parts.each(|part| {
            for (tx, share) in txs.iter().zip(part.deal(n, &shard_of)) {
                // A shard's thread ends only by panicking, which the scope
                // passes on.
                let _ = tx.send(share);
            }
        });
        drop(txs);
        decoded
    })
}

/// Every known label value of `cluster`'s job series is exported, with 0
/// until it happens.
fn register_cluster(metrics: &mut ShardMetrics, processor: &Processor, cluster: &Arc<str>) {
    let rules = processor.alerts().rules_for(true).map(|(_, r)| r);
    metrics.register_cluster(cluster, rules);
}

/// A record's cluster: the one it names, else its source's (the shard's
/// copy, lent), else none.
fn cluster_of<'a>(
    own: &'a Option<Arc<str>>,
    sources: &'a [SourceInfo],
    source: usize,
) -> &'a Arc<str> {
    static UNNAMED: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));
    match own {
        Some(own) => own,
        None => sources.get(source).map_or(&*UNNAMED, |s| &s.cluster),
    }
}

impl Shard {
    pub fn new(
        outputs: Outputs,
        retention: Retention,
        nodes: NodeBoard,
        ages: StateAges,
        alerts: AlertSetup,
    ) -> Self {
        Shard {
            processor: Processor::new(alerts.rules, alerts.clock)
                .with_fire_batch(FIRE_BATCH)
                .with_max_jobs(retention.max_jobs)
                .with_max_finished(retention.max_finished)
                .with_max_clock_skew(retention.max_clock_skew)
                .with_state_ttl(StateTtl {
                    inactive_grace: retention.inactive_grace,
                    orphan_ttl: retention.orphan_ttl,
                }),
            fired: Vec::new(),
            shared_clock: alerts.shared,
            outputs: OutputBuffer::new(outputs),
            metrics: ShardMetrics::new(nodes, ages),
            restored_alerts: Vec::new(),
            refused: 0,
            spill: None,
            encode_threads: 1,
            sources: Vec::new(),
        }
    }

    /// Encode the state for checkpoints into scratch files in `dir`, named
    /// for shard `index`, rather than in memory, on `threads` threads.
    pub fn with_spill(mut self, dir: PathBuf, index: usize, threads: usize) -> Self {
        self.spill = Some((dir, index, 0));
        self.encode_threads = threads.max(1);
        self
    }

    /// Share the ranks jobs hold with the other shards, so the one keeping
    /// a cluster's resource state knows which drained ranks still run a job.
    pub fn with_allocations(mut self, allocations: crate::keyed::state::SharedAllocations) -> Self {
        self.processor = self.processor.with_allocations(allocations);
        self
    }

    /// Share the clusters followed (`operators.max_clusters`) with the
    /// other shards.
    pub fn with_cluster_budget(mut self, budget: crate::keyed::state::ClusterBudget) -> Self {
        self.processor = self.processor.with_cluster_budget(budget);
        self
    }

    /// Share the budget of ranks with the other shards.
    pub fn with_rank_budget(mut self, budget: crate::keyed::state::RankBudget) -> Self {
        self.processor = self.processor.with_rank_budget(budget);
        self
    }

    /// Count active jobs per user too.
    pub fn with_user_jobs(mut self, users: UserJobs) -> Self {
        self.metrics.users = users;
        self
    }

    /// The pipeline's sources, in the order of the indexes their records
    /// carry. Copied: no name is shared with another thread.
    pub fn with_sources(mut self, sources: &[SourceInfo]) -> Self {
        self.sources = sources
            .iter()
            .map(|s| SourceInfo {
                name: Arc::from(&*s.name),
                // The state's own copy, which its job keys share.
                cluster: self.processor.intern(&s.cluster),
            })
            .collect();
        self
    }

    /// Collect changes for the changelog of these sources.
    pub fn with_changelog(mut self, sources: impl IntoIterator<Item = Arc<str>>) -> Self {
        self.processor = self.processor.with_changelog(sources);
        self
    }

    /// This shard's state, encoded for a checkpoint, and the changes since
    /// the last one for the changelog.
    pub fn snapshot(&mut self) -> ShardSnapshot {
        let saved = ShardStateRef::of(&self.processor);
        let state = match &mut self.spill {
            Some((dir, index, n)) => {
                *n += 1;
                saved.spill(self.encode_threads, spill_path(dir, *index, *n))?
            }
            None => saved.encode(self.encode_threads)?,
        };
        Ok(BarrierReply {
            state,
            changes: changelog::changes(&mut self.processor),
        })
    }

    /// Drop the state owned by these partitions of `source`, as if it had
    /// never been here: gauges and alerts go with it, nothing is emitted.
    pub fn release(&mut self, source: &str, partitions: &BTreeSet<i32>) {
        let released = self.processor.release(source, partitions);
        for gone in &released.jobs {
            self.uncount(gone);
        }
        for cluster in &released.clusters {
            self.metrics.nodes.forget(cluster);
        }
        self.report_tracked();
        let (jobs, clusters) = (released.jobs.len(), released.clusters.len());
        if jobs + clusters > 0 {
            tracing::info!(%source, ?partitions, jobs, clusters, "released the state of revoked partitions");
        }
    }

    /// Take a job that left out of the gauges, silently.
    fn uncount(&mut self, gone: &Gone) {
        let job = &gone.entry.job;
        if is_active(job) {
            self.metrics.count_job(&gone.key.cluster, job, -1);
        }
        for rule in &gone.rules {
            if let Some(rule) = self.processor.alerts().rules().get(*rule) {
                ShardMetrics::stuck(&gone.key.cluster, rule, -1.0);
            }
        }
    }

    /// Take over state from a checkpoint, before the first record: the
    /// processor's state (see [`Processor::restore`]) and its metrics.
    #[cfg(test)]
    pub fn restore(&mut self, saved: SavedState) {
        self.restored_alerts = self.take_over([saved]);
    }

    /// Take over state from a checkpoint's parts as they come (each this
    /// shard's share of one part), one by one, before the first record.
    pub fn restore_parts(&mut self, parts: impl IntoIterator<Item = SavedState>) {
        self.restored_alerts = self.take_over(parts);
    }

    /// Take over state restored from a changelog while running; alerts that
    /// were firing are announced again (same identity: a repeat).
    pub async fn adopt(&mut self, saved: SavedState) {
        let jobs = saved.jobs.len();
        let alerts = self.take_over([saved]);
        tracing::debug!(jobs, "adopted restored state");
        self.emit_alerts(&alerts, true).await;
    }

    fn take_over(&mut self, parts: impl IntoIterator<Item = SavedState>) -> Vec<AlertEvent> {
        let mut restoring = Restoring::default();
        for part in parts {
            self.processor.restore_part(&mut restoring, part);
        }
        let restored = self.processor.end_restore(restoring);
        for gone in &restored.replaced {
            self.uncount(gone);
        }
        for cluster in &restored.clusters {
            self.register_cluster(cluster);
        }
        for cluster in &restored.resources {
            self.register_cluster(&Arc::from(cluster.as_str()));
            if let Some(res) = self.processor.state().resources.get(cluster) {
                self.metrics.restored_nodes(cluster, res);
            }
        }
        let name = |i: u32| restored.clusters.get(i as usize).map_or("", |c| &**c);
        for ((cluster, queue, state, userid), n) in &restored.active {
            self.metrics
                .count_active(name(*cluster), queue.as_deref(), *state, *userid, *n);
        }
        self.metrics
            .ages
            .add_all(&restored.clusters, &restored.entered);
        self.metrics
            .report_finished(self.processor.finished().len());
        self.report_tracked();
        restored.firing
    }

    /// Every known label value of the job series is exported, with 0 until
    /// it happens.
    fn register_cluster(&mut self, cluster: &Arc<str>) {
        register_cluster(&mut self.metrics, &self.processor, cluster);
    }

    /// Shards share one gauge: each adds the change in its own count.
    fn report_tracked(&mut self) {
        self.metrics
            .report_tracked(self.processor.state().jobs.len());
    }

    async fn handle(&mut self, msg: ShardMsg) {
        match msg {
            ShardMsg::Record(routed) => {
                self.apply(routed).await;
            }
            // Applied outside any future (see `apply_now`).
            ShardMsg::Records(batch) => {
                self.prefetch(&batch);
                for routed in batch {
                    self.apply_now(routed);
                    self.outputs.flush_if_full().await;
                }
            }
            ShardMsg::Tallied(batch, tally) => {
                self.prefetch(&batch);
                for routed in batch {
                    tally.note(self.apply_now(routed));
                    self.outputs.flush_if_full().await;
                }
            }
            // Everything before the barrier is applied, and its outputs
            // are queued at the sinks.
            ShardMsg::Barrier(reply, mut held) => {
                self.flush().await;
                let _ = reply.send(self.snapshot());
                // Until every shard has answered (or the round is given
                // up): nothing after the barrier reaches a sink before.
                let _ = held.wait_for(|released| *released).await;
            }
            ShardMsg::Release { source, partitions } => self.release(&source, &partitions),
            ShardMsg::Adopt(saved) => self.adopt(*saved).await,
            ShardMsg::Query(asked) => {
                let answer = super::answer::answer(&self.processor, &asked.query);
                let _ = asked.reply.send(answer);
            }
        }
    }

    /// Apply records until every sender is gone; returns the final state,
    /// encoded, for the checkpoint taken at shutdown. The shard is lent,
    /// not given: its owner frees it after the final state has gone out.
    pub async fn run(&mut self, mut rx: mpsc::Receiver<ShardMsg>) -> ShardSnapshot {
        let restored = std::mem::take(&mut self.restored_alerts);
        self.emit_alerts(&restored, true).await;
        self.flush().await;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // What is queued is taken in one go: one trip through `select!`
        // (whose polling of every branch costs as much as applying a small
        // record) and one release of queue room (a lock shared with the
        // sources) for up to `DRAIN_BATCH` messages.
        let mut taken = Vec::with_capacity(DRAIN_BATCH);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut taken, DRAIN_BATCH) => {
                    if n == 0 {
                        break;
                    }
                    for msg in taken.drain(..) {
                        self.handle(msg).await;
                    }
                }
                _ = tick.tick() => self.expire(Instant::now()).await,
                _ = std::future::ready(()), if self.processor.alerts_due() => self.fire_due().await,
            }
            self.flush().await;
        }
        // Input is over: what other shards' jobs did to drained ranks here
        // (as far as they got), and what is due, go out before it ends.
        self.refresh_draining().await;
        while self.processor.alerts_due() {
            self.fire_due().await;
        }
        self.flush().await;
        let last = self.snapshot();
        self.outputs.close().await;
        last
    }

    /// The end of a round of work: hand the outputs held so far to the
    /// sinks, and publish the oldest state entries that changed.
    pub async fn flush(&mut self) {
        self.metrics.ages.publish();
        self.outputs.flush().await;
    }

    /// Ask for the memory of the jobs of `batch` before applying it.
    fn prefetch(&self, batch: &[Routed]) {
        for routed in batch {
            let record = &routed.record;
            // The record's own name is a `Box<str>` until it is applied.
            let cluster: &str = match &record.cluster {
                Some(own) => own,
                None => cluster_of(&None, &self.sources, routed.source),
            };
            self.processor.prefetch(cluster, record.id);
        }
    }

    /// Apply one record and emit its outputs (held until [`Shard::flush`]).
    pub async fn apply(&mut self, routed: Routed) -> Outcome {
        let outcome = self.apply_now(routed);
        self.outputs.flush_if_full().await;
        outcome
    }

    /// [`Shard::apply`] but for handing what is held on: not async, so
    /// the record and what it did are not moved into a future's state
    /// (hundreds of bytes copied for every record).
    fn apply_now(&mut self, routed: Routed) -> Outcome {
        let Routed {
            source,
            partition,
            mut record,
        } = routed;
        // Names are lent from the shard's copies where they can be: a
        // count taken and given back for every record is two locked
        // instructions on the busiest thread.
        let own = record.cluster.take().map(Arc::from);
        let info = self.sources.get(source);
        let owner = partition.map(|partition| Owner {
            source: info.map_or_else(|| Arc::from(""), |s| s.name.clone()),
            partition,
        });
        let cluster = cluster_of(&own, &self.sources, source);
        let source_name: &str = info.map_or("", |s| &s.name);
        let stream = record.stream;
        let id = record.id;
        // The record as it came, for the `events` feed, built only if wanted.
        let input = effects::input(
            &self.outputs,
            cluster,
            stream,
            id,
            &record.body,
            source_name,
        );
        let exception = exception_of(&record);
        let mut fired = std::mem::take(&mut self.fired);
        let mut done = Processed::default();
        let outcome =
            self.processor
                .process_from(owner.as_ref(), cluster, record, &mut fired, &mut done);
        if outcome == Outcome::Refused {
            self.fired = fired;
            self.refused += 1;
            let reason = if done.refused_cluster {
                "max_clusters"
            } else {
                "max_jobs"
            };
            metrics::counter!(metric::FLUXPIPE_JOBS_REFUSED_TOTAL, "reason" => reason).increment(1);
            // The first, then every power of two: a flood stays readable.
            if self.refused.is_power_of_two() {
                if done.refused_cluster {
                    let cluster = cluster_of(&own, &self.sources, source);
                    tracing::warn!(
                        %cluster,
                        refused = self.refused,
                        "operators.max_clusters reached: records of clusters not yet followed are refused"
                    );
                } else {
                    tracing::warn!(
                        held = self.jobs_tracked(),
                        refused = self.refused,
                        "operators.max_jobs reached: records of jobs not yet held are refused"
                    );
                }
            }
            return outcome;
        }
        if done.of_finished_job {
            self.fired = fired;
            metrics::counter!(metric::FLUXPIPE_FINISHED_JOB_REPEATS_TOTAL).increment(1);
            return outcome;
        }
        // By the shard's fields: the cluster's name is lent from another.
        register_cluster(&mut self.metrics, &self.processor, cluster);
        if !fired.is_empty() {
            self.emit_alerts_now(&fired, false);
            fired.clear();
        }
        self.fired = fired;
        let cluster = cluster_of(&own, &self.sources, source);
        let state = self.processor.state();
        // The record's job as it stands now, looked up once for the
        // series and the records.
        let job = done.key.as_ref().and_then(|k| state.jobs.get(k));
        self.metrics
            .applied(cluster, stream, &done, exception, job, state);
        self.metrics.report_tracked(state.jobs.len());
        ShardMetrics::anomalies(&done.fx.anomalies);
        effects::effects(&mut self.outputs, job, stream, outcome, &mut done, input);
        outcome
    }

    /// Fire a batch of the alerts that are due.
    async fn fire_due(&mut self) {
        let mut out = std::mem::take(&mut self.fired);
        self.processor.fire_due(&mut out);
        if !out.is_empty() {
            self.emit_alerts(&out, false).await;
            out.clear();
        }
        self.fired = out;
    }

    /// Alert records for `events` (see [`effects::alerts`]), and the
    /// alert series and changelog that follow them.
    async fn emit_alerts(&mut self, events: &[AlertEvent], restored: bool) {
        self.emit_alerts_now(events, restored);
        self.outputs.flush_if_full().await;
    }

    /// [`Shard::emit_alerts`], held: the caller hands them on.
    fn emit_alerts_now(&mut self, events: &[AlertEvent], restored: bool) {
        for a in events {
            let Some(rule) = self.processor.alerts().rules().get(a.rule) else {
                continue;
            };
            ShardMetrics::alerted(rule, a);
        }
        effects::alerts(
            &mut self.outputs,
            self.processor.alerts().rules(),
            events,
            restored,
        );
    }

    /// Drop the state whose time is up.
    pub async fn expire(&mut self, now: Instant) {
        let expired = self.processor.expire(now.into_std());
        for (_, _, why) in &expired.dropped {
            metrics::counter!(metric::FLUXPIPE_JOBS_EVICTED_TOTAL, "reason" => why.as_str())
                .increment(1);
        }
        ShardMetrics::anomalies(&expired.anomalies);
        effects::anomalies(&mut self.outputs, expired.anomalies);
        self.emit_alerts(&expired.alerts, false).await;
        self.report_tracked();
        self.metrics
            .report_finished(self.processor.finished().len());
        self.refresh_draining().await;
        // The event clock is shared for the alert rules and for the
        // node-seconds counters of the metrics.
        if self.processor.clock() == Clock::Event {
            self.processor.sync_event_clock(&self.shared_clock);
        }
        if self.processor.alerting() {
            self.fire_due().await;
        }
    }

    /// Jobs of other shards took or gave back ranks of clusters whose
    /// resource state is kept here: drained ranks among them become
    /// draining, or drained again. Emitted as rank records of no event.
    async fn refresh_draining(&mut self) {
        let mut out = Vec::new();
        let shared = &self.shared_clock;
        let flips = self.processor.refresh_draining(|c| shared.now(c), &mut out);
        for flip in flips {
            self.metrics.nodes.update(
                &flip.cluster,
                flip.change.rank,
                flip.change.after.as_ref(),
                flip.at,
            );
            self.outputs
                .emit(OutputRecord::rank_change_at(
                    &flip.cluster,
                    flip.change,
                    flip.at,
                ))
                .await;
        }
        if !out.is_empty() {
            self.emit_alerts(&out, false).await;
        }
    }

    /// Alert conditions holding now, fired or waiting.
    pub fn alert_conditions(&self) -> usize {
        self.processor
            .alerts()
            .saved(&self.processor.state().jobs)
            .len()
    }

    /// Jobs currently held.
    pub fn jobs_tracked(&self) -> usize {
        self.processor.state().jobs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::file::{self as checkpoint, ShardBytes};
    use crate::decode::{Body, EventStream, Record};
    use crate::flux::Event;
    use crate::flux::job::JobState;
    use crate::flux::jobid::JobId;
    use crate::keyed::JobKey;
    use crate::keyed::alerts::engine::{SavedCondition, Subject};
    use crate::keyed::alerts::rule::RuleKind;
    use crate::output::OutputStream;
    use crate::pipeline::config;
    use serde_json::json;
    use std::path::Path;
    use std::sync::Arc;

    fn routed(id: u64, stream: EventStream, ev: Event) -> Routed {
        Routed {
            source: 0,
            partition: None,
            record: Record {
                cluster: Some("c".into()),
                stream,
                id: Some(JobId(id)),
                body: Body::Event(ev),
            },
        }
    }

    fn job_events() -> Vec<Event> {
        let mut evs = vec![
            Event::new(1.0, "submit")
                .with_context(json!({"userid": 1, "urgency": 16, "flags": 0, "version": 1})),
        ];
        for (i, name) in ["validate", "depend"].iter().enumerate() {
            evs.push(Event::new(2.0 + i as f64, *name));
        }
        evs.push(Event::new(4.0, "priority").with_context(json!({"priority": 1})));
        evs.push(Event::new(5.0, "alloc"));
        evs.push(Event::new(6.0, "finish").with_context(json!({"status": 0})));
        evs.push(Event::new(7.0, "clean"));
        evs
    }

    /// A job's records from submit to SCHED, the first at `t`.
    fn to_sched(id: u64, t: f64) -> Vec<Routed> {
        let submit = json!({"userid": 1, "urgency": 16, "flags": 0, "version": 1});
        [
            ("submit", Some(submit)),
            ("validate", None),
            ("depend", None),
            ("priority", Some(json!({"priority": 1}))),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (name, ctx))| {
            let mut ev = Event::new(t + i as f64 / 10.0, name);
            if let Some(c) = ctx {
                ev = ev.with_context(c);
            }
            routed(id, EventStream::Job, ev)
        })
        .collect()
    }

    /// One job rule, SCHED for `hold`, on the event clock.
    fn sched_alerts(hold: &str) -> AlertSetup {
        AlertSetup {
            rules: vec![
                Rule::new(
                    "sched",
                    crate::keyed::alerts::rule::RuleKind::JobState(JobState::Sched),
                    hold,
                    "warning",
                )
                .unwrap(),
            ],
            clock: Clock::Event,
            shared: SharedEventClock::default(),
        }
    }

    /// A shard with no sinks and the SCHED rule held 100 s.
    fn sched_shard() -> Shard {
        Shard::new(
            Outputs::new(std::iter::empty()).0,
            RETAIN,
            NodeBoard::default(),
            StateAges::default(),
            sched_alerts("100s"),
        )
    }

    fn sink(inputs: &str) -> (Outputs, crate::channels::fanout::SinkRx) {
        let cfg = config::parse(&format!(
            "[sources.s]\ntype = \"stdin\"\n[sinks.k]\ntype = \"stdout\"\ninputs = {inputs}\nbuffer = 1000\n"
        ))
        .unwrap();
        let (outputs, mut rxs) = Outputs::new(
            cfg.sinks
                .iter()
                .map(|(n, c)| (n.as_str(), c.common().subscription())),
        );
        (outputs, rxs.remove(0))
    }

    const RETAIN: Retention = Retention {
        inactive_grace: Duration::from_secs(60),
        orphan_ttl: Duration::from_secs(600),
        max_jobs: usize::MAX,
        max_finished: 1000,
        max_clock_skew: 3600.0,
    };

    #[tokio::test]
    async fn inactive_jobs_are_summarized_then_dropped_after_the_grace() {
        let (outputs, mut rx) = sink(r#"["jobs", "transitions", "events"]"#);
        let mut shard = Shard::new(
            outputs,
            RETAIN,
            NodeBoard::default(),
            StateAges::default(),
            AlertSetup::default(),
        );
        for ev in job_events() {
            shard.apply(routed(7, EventStream::Job, ev)).await;
        }
        // a late repeat within the grace is recognized: no new job, no output
        shard
            .apply(routed(7, EventStream::Job, Event::new(7.0, "clean")))
            .await;
        shard.flush().await;
        let mut kinds = Vec::new();
        while let Ok(r) = rx.try_recv() {
            kinds
                .push(serde_json::from_str::<serde_json::Value>(r.line()).unwrap()["kind"].clone());
        }
        assert_eq!(kinds.iter().filter(|k| *k == "job").count(), 1);
        assert_eq!(kinds.iter().filter(|k| *k == "event").count(), 7);
        assert_eq!(kinds.iter().filter(|k| *k == "transition").count(), 6);
        assert_eq!(shard.jobs_tracked(), 1);
        shard.expire(Instant::now() + Duration::from_secs(30)).await;
        assert_eq!(shard.jobs_tracked(), 1);
        shard.expire(Instant::now() + Duration::from_secs(61)).await;
        assert_eq!(shard.jobs_tracked(), 0);
    }

    #[tokio::test]
    async fn a_backlog_sent_again_after_the_jobs_were_dropped_changes_nothing() {
        let (outputs, mut rx) = sink(r#"["jobs", "transitions", "events"]"#);
        let mut shard = plain_shard(outputs);
        for ev in job_events() {
            shard.apply(routed(7, EventStream::Job, ev)).await;
        }
        shard.expire(Instant::now() + Duration::from_secs(61)).await;
        assert_eq!(shard.jobs_tracked(), 0);
        shard.flush().await;
        while rx.try_recv().is_ok() {}
        // The whole eventlog again: every record a repeat, nothing out.
        for ev in job_events() {
            let outcome = shard.apply(routed(7, EventStream::Job, ev)).await;
            assert_eq!(outcome, Outcome::Repeat);
        }
        shard.flush().await;
        assert!(rx.try_recv().is_err());
        assert_eq!(shard.jobs_tracked(), 0);
        // Remembered across a checkpoint, dealt out to two shards by id.
        let state = shard.snapshot().unwrap().state;
        let bytes = checkpoint::encode(&Default::default(), &[state]).unwrap();
        let saved = checkpoint::decode(&bytes, Path::new("ck")).unwrap();
        let (_, states) = saved.split(2, |_, id| id.unwrap_or(0) as usize % 2);
        let mut shards: Vec<Shard> = (0..2).map(|_| plain_shard(sink(r#"["jobs"]"#).0)).collect();
        restore_all(&mut shards, states);
        assert_eq!(shards[0].processor.finished().len(), 0);
        assert_eq!(shards[1].processor.finished().len(), 1);
        for ev in job_events() {
            assert_eq!(
                shards[1].apply(routed(7, EventStream::Job, ev)).await,
                Outcome::Repeat
            );
        }
    }

    /// From partition `partition` of source 0 (`k` in a plain shard).
    fn owned(mut r: Routed, partition: i32) -> Routed {
        r.partition = Some(partition);
        r
    }

    fn plain_shard(outputs: Outputs) -> Shard {
        Shard::new(
            outputs,
            RETAIN,
            NodeBoard::default(),
            StateAges::default(),
            AlertSetup::default(),
        )
        .with_changelog([Arc::from("k")])
        .with_sources(&[SourceInfo::new("k", "c")])
    }

    fn key(id: u64) -> JobKey {
        JobKey {
            cluster: "c".into(),
            id: JobId(id),
        }
    }

    #[tokio::test]
    async fn changes_of_owned_state_rebuild_the_same_jobs_in_another_shard() {
        let (outputs, _rx) = sink(r#"["jobs"]"#);
        let mut a = plain_shard(outputs.clone());
        let evs = job_events();
        // job 7 half way, owned by partition 2; job 8 done, partition 3;
        // job 9 from an unpartitioned source.
        for ev in evs.iter().take(4) {
            a.apply(owned(routed(7, EventStream::Job, ev.clone()), 2))
                .await;
        }
        for ev in &evs {
            a.apply(owned(routed(8, EventStream::Job, ev.clone()), 3))
                .await;
            a.apply(routed(9, EventStream::Job, ev.clone())).await;
        }
        let changes = a.snapshot().unwrap().changes;
        let mut keys: Vec<(i32, &str, bool)> = changes
            .iter()
            .map(|c| (c.owner.partition, c.key.as_str(), c.value.is_some()))
            .collect();
        keys.sort();
        assert_eq!(keys, vec![(2, "job/c/7", true), (3, "job/c/8", true)]);
        assert!(a.snapshot().unwrap().changes.is_empty(), "nothing new");

        // Partition 2's changelog, read back into another shard.
        let mut restorer = changelog::Restorer::new("t");
        for c in changes.iter().filter(|c| c.owner.partition == 2) {
            restorer.push(c.key.as_bytes(), c.value.as_deref());
        }
        restorer.push(b"offset/t", Some(&changelog::encode_marker(42).unwrap()));
        let owner = Owner {
            source: Arc::from("k"),
            partition: 2,
        };
        let restored = restorer.finish(&owner);
        assert_eq!(restored.offset, Some(42));
        let mut b = plain_shard(outputs);
        b.adopt(restored.state).await;
        assert_eq!(b.jobs_tracked(), 1);
        assert_eq!(
            b.processor.state().jobs[&key(7)].summary(),
            a.processor.state().jobs[&key(7)].summary()
        );
        // The rest of job 7 goes on in b as it would have in a.
        for ev in evs.iter().skip(4) {
            a.apply(owned(routed(7, EventStream::Job, ev.clone()), 2))
                .await;
            b.apply(owned(routed(7, EventStream::Job, ev.clone()), 2))
                .await;
        }
        assert_eq!(
            b.processor.state().jobs[&key(7)].summary(),
            a.processor.state().jobs[&key(7)].summary()
        );
        assert_eq!(
            b.processor.state().jobs[&key(7)].job.state,
            JobState::Inactive
        );

        // a gives partition 2 up: job 7 goes, silently; 8 and 9 stay.
        a.snapshot().unwrap();
        a.release("k", &BTreeSet::from([2]));
        assert_eq!(a.jobs_tracked(), 2);
        assert!(!a.processor.state().jobs.contains_key(&key(7)));
        assert!(a.snapshot().unwrap().changes.is_empty());

        // Dropped after the grace: a tombstone for the owned job only.
        a.expire(Instant::now() + Duration::from_secs(61)).await;
        assert_eq!(a.jobs_tracked(), 0);
        let gone: Vec<(String, bool)> = a
            .snapshot()
            .unwrap()
            .changes
            .into_iter()
            .map(|c| (c.key, c.value.is_some()))
            .collect();
        assert_eq!(gone, vec![("job/c/8".to_string(), false)]);
    }

    #[tokio::test]
    async fn beyond_max_jobs_new_jobs_are_refused_and_held_ones_go_on() {
        let (outputs, mut rx) = sink(r#"["jobs"]"#);
        let mut shard = Shard::new(
            outputs,
            Retention {
                max_jobs: 3,
                ..RETAIN
            },
            NodeBoard::default(),
            StateAges::default(),
            AlertSetup::default(),
        );
        let evs = job_events();
        // five jobs submitted; only the first three are held
        for id in 1..=5 {
            shard
                .apply(routed(id, EventStream::Job, evs[0].clone()))
                .await;
        }
        assert_eq!(shard.jobs_tracked(), 3);
        assert_eq!(shard.refused, 2);
        // the held ones run to the end; the refused ones stay unknown
        for id in 1..=5 {
            for ev in &evs[1..] {
                shard.apply(routed(id, EventStream::Job, ev.clone())).await;
            }
        }
        shard.flush().await;
        let mut ids = Vec::new();
        while let Ok(r) = rx.try_recv() {
            ids.push(serde_json::from_str::<serde_json::Value>(r.line()).unwrap()["id"].clone());
        }
        assert_eq!(ids, [1, 2, 3]);
        assert_eq!(shard.jobs_tracked(), 3);
    }

    #[tokio::test]
    async fn exec_events_before_submit_are_held_and_orphans_expire() {
        let (outputs, mut rx) = sink(r#"["anomalies"]"#);
        let mut shard = Shard::new(
            outputs,
            RETAIN,
            NodeBoard::default(),
            StateAges::default(),
            AlertSetup::default(),
        );
        // exec eventlog first, then the job's own eventlog: no anomaly
        shard
            .apply(routed(8, EventStream::Exec, Event::new(5.5, "init")))
            .await;
        for ev in job_events() {
            shard.apply(routed(8, EventStream::Job, ev)).await;
        }
        // an exec log whose job never shows up
        shard
            .apply(routed(9, EventStream::Exec, Event::new(5.5, "init")))
            .await;
        shard.flush().await;
        assert!(rx.try_recv().is_err(), "no anomaly yet");
        shard
            .expire(Instant::now() + Duration::from_secs(601))
            .await;
        shard.flush().await;
        let a: serde_json::Value = serde_json::from_str(rx.try_recv().unwrap().line()).unwrap();
        assert_eq!(
            (a["kind"].as_str(), a["id"].as_u64()),
            (Some("anomaly"), Some(9))
        );
        assert!(rx.try_recv().is_err());
        // job 8 was submitted: not an orphan (it goes when its grace ends)
        assert_eq!(shard.jobs_tracked(), 0);
    }

    #[tokio::test]
    async fn oldest_state_entry_follows_the_jobs() {
        let (outputs, _rx) = sink(r#"["jobs"]"#);
        let ages = StateAges::default();
        let mut shard = Shard::new(
            outputs,
            RETAIN,
            NodeBoard::default(),
            ages.clone(),
            AlertSetup::default(),
        );
        let evs = job_events();
        // job 7 reaches SCHED at 4.0; job 8 at 14.0
        for ev in &evs[..4] {
            shard.apply(routed(7, EventStream::Job, ev.clone())).await;
            let mut later = ev.clone();
            later.timestamp += 10.0;
            shard.apply(routed(8, EventStream::Job, later)).await;
        }
        shard.flush().await;
        let text = ages.render();
        assert!(
            text.contains("{flux_cluster=\"c\",state=\"SCHED\"} 4\n"),
            "{text}"
        );
        // job 7 runs: job 8 is now the oldest in SCHED, job 7 the oldest in RUN
        shard
            .apply(routed(7, EventStream::Job, evs[4].clone()))
            .await;
        shard.flush().await;
        let text = ages.render();
        assert!(text.contains("state=\"SCHED\"} 14\n"), "{text}");
        assert!(text.contains("state=\"RUN\"} 5\n"), "{text}");
        // job 7 ends: no job in RUN or CLEANUP, no series
        for ev in &evs[5..] {
            shard.apply(routed(7, EventStream::Job, ev.clone())).await;
        }
        shard.flush().await;
        let text = ages.render();
        assert!(!text.contains("RUN") && !text.contains("CLEANUP"), "{text}");
    }

    /// A checkpoint brings back every alert condition into its job's entry,
    /// fired ones fired and waiting ones with their timers, whatever order
    /// the conditions come in; one for a job not held goes with it.
    #[tokio::test]
    async fn a_job_reverted_to_priority_keeps_waiting_for_the_sched_rule() {
        let mut a = sched_shard();
        for r in to_sched(1, 1000.0) {
            a.apply(r).await;
        }
        let conditions = |s: &Shard| {
            let bytes =
                rmp_serde::to_vec(&s.processor.alerts().saved(&s.processor.state().jobs)).unwrap();
            let v: Vec<SavedCondition> = rmp_serde::from_slice(&bytes).unwrap();
            v.into_iter()
                .map(|c| (c.fired, c.since))
                .collect::<Vec<_>>()
        };
        assert_eq!(conditions(&a), [(false, 1000.3)]);
        // An urgency change (then a restart) sends it back to PRIORITY for
        // a moment: still waiting, since the first SCHED.
        let urgency =
            Event::new(1060.0, "urgency").with_context(json!({"urgency": 20, "userid": 1}));
        a.apply(routed(1, EventStream::Job, urgency)).await;
        assert_eq!(conditions(&a), [(false, 1000.3)]);
        let priority = Event::new(1060.1, "priority").with_context(json!({"priority": 20}));
        a.apply(routed(1, EventStream::Job, priority)).await;
        a.apply(routed(
            1,
            EventStream::Job,
            Event::new(1070.0, "flux-restart"),
        ))
        .await;
        assert_eq!(conditions(&a), [(false, 1000.3)]);
        // Due 100 s after the first SCHED, not after the last.
        a.apply(to_sched(2, 1101.0).swap_remove(0)).await;
        assert_eq!(conditions(&a)[0], (true, 1000.3));
    }

    #[tokio::test]
    async fn a_checkpoint_brings_back_every_alert_condition_in_any_order() {
        let new_shard = sched_shard;
        let mut a = new_shard();
        // jobs 1-10 in SCHED from 1000 (fired by 1200), 11-20 from 1150
        for id in 1..=20u64 {
            for r in to_sched(id, if id <= 10 { 1000.0 } else { 1150.0 }) {
                a.apply(r).await;
            }
        }
        // a new job moves the clock
        a.apply(to_sched(21, 1200.0).swap_remove(0)).await;
        let saved = |s: &Shard| {
            let bytes =
                rmp_serde::to_vec(&s.processor.alerts().saved(&s.processor.state().jobs)).unwrap();
            let mut v: Vec<SavedCondition> = rmp_serde::from_slice(&bytes).unwrap();
            v.sort_by_key(|c| format!("{c:?}"));
            v
        };
        let before = saved(&a);
        assert_eq!(before.len(), 20);
        assert_eq!(before.iter().filter(|c| c.fired).count(), 10);
        let ShardBytes::Memory(parts) = a.snapshot().unwrap().state else {
            panic!("encoded in memory");
        };
        let [bytes] = &parts[..] else {
            panic!("one part");
        };
        for order in ["as saved", "reversed", "an orphan first"] {
            let mut state: SavedState = rmp_serde::from_slice(bytes).unwrap();
            match order {
                "reversed" => state.alerts.reverse(),
                "an orphan first" => {
                    let mut orphan = state.alerts[0].clone();
                    orphan.subject = Subject::Job(key(999));
                    state.alerts.insert(0, orphan);
                }
                _ => {}
            }
            let mut b = new_shard();
            b.restore(state);
            assert_eq!(saved(&b), before, "{order}");
            assert_eq!(b.restored_alerts.len(), 10, "{order}: fired ones announced");
            let mut out = Vec::new();
            b.processor.fire_due_at(1300.0, &mut out);
            assert_eq!(out.len(), 10, "{order}: the waiting ones fire when due");
        }
    }

    /// State restored over jobs the shard still holds (a changelog adopted
    /// again) replaces them: the firing alerts are listed once each, none
    /// lost to the release of the held ones.
    #[tokio::test]
    async fn restoring_over_held_jobs_keeps_every_firing_alert_listed() {
        let mut a = sched_shard();
        for id in 1..=10u64 {
            for r in to_sched(id, 1000.0) {
                a.apply(r).await;
            }
        }
        a.apply(to_sched(11, 1200.0).swap_remove(0)).await;
        assert_eq!(a.processor.alerts().firing(), 10);
        let ShardBytes::Memory(parts) = a.snapshot().unwrap().state else {
            panic!("encoded in memory");
        };
        let decoded = || -> SavedState { rmp_serde::from_slice(&parts[0]).unwrap() };
        let mut b = sched_shard();
        b.restore(decoded());
        for again in 1..=2 {
            b.adopt(decoded()).await;
            assert_eq!(b.processor.alerts().firing(), 10, "adopted {again} times");
            let (page, total) = b.processor.alerts().firing_page(
                &b.processor.state().jobs,
                Some("c"),
                None,
                usize::MAX,
            );
            assert_eq!((page.len(), total), (10, 10), "adopted {again} times");
        }
    }

    /// A shard of more jobs than a part holds is saved in several parts;
    /// they come back whole into one shard or dealt out to two, each job's
    /// conditions with it.
    #[tokio::test]
    async fn a_state_saved_in_parts_comes_back_whole() {
        let new_shard = sched_shard;
        let n = checkpoint::PART_JOBS as u64 + 5;
        let mut a = new_shard();
        for id in 1..=n {
            for r in to_sched(id, 1000.0 + (id % 300) as f64) {
                a.apply(r).await;
            }
        }
        let conditions = |s: &Shard| {
            let bytes =
                rmp_serde::to_vec(&s.processor.alerts().saved(&s.processor.state().jobs)).unwrap();
            let v: Vec<SavedCondition> = rmp_serde::from_slice(&bytes).unwrap();
            let mut v: Vec<(String, f64, bool)> = v
                .into_iter()
                .map(|c| (format!("{:?}", c.subject), c.since, c.fired))
                .collect();
            v.sort_by(|x, y| x.partial_cmp(y).unwrap());
            v
        };
        let before = conditions(&a);
        assert_eq!(before.len() as u64, n);
        assert!(before.iter().any(|c| c.2) && before.iter().any(|c| !c.2));
        let state = a.snapshot().unwrap().state;
        let ShardBytes::Memory(parts) = &state else {
            panic!("encoded in memory");
        };
        assert_eq!(parts.len(), 2);
        let bytes = checkpoint::encode(&Default::default(), &[state]).unwrap();
        for workers in [1, 2] {
            let saved = checkpoint::decode(&bytes, Path::new("ck")).unwrap();
            assert_eq!(saved.parts.len(), 2, "the parts as saved");
            let (_, states) = saved.split(workers, |_, id| id.unwrap_or(0) as usize % workers);
            let mut shards: Vec<Shard> = (0..workers).map(|_| new_shard()).collect();
            restore_all(&mut shards, states);
            let mut after: Vec<_> = shards.iter().flat_map(conditions).collect();
            after.sort_by(|x, y| x.partial_cmp(y).unwrap());
            assert_eq!(after, before, "{workers} workers");
            let held: usize = shards.iter().map(Shard::jobs_tracked).sum();
            assert_eq!(held as u64, n);
            // Taken over part by part while decoded (on threads, as a big
            // checkpoint is): the same shards.
            let opened =
                checkpoint::open(&bytes[..], bytes.len() as u64, Path::new("ck"), 0).unwrap();
            let mut streamed: Vec<Shard> = (0..workers).map(|_| new_shard()).collect();
            restore_from(&mut streamed, opened.parts, |_, id| {
                id.unwrap_or(0) as usize % workers
            })
            .unwrap();
            for (a, b) in shards.iter().zip(&streamed) {
                assert_eq!(conditions(a), conditions(b), "{workers} workers");
                assert_eq!(a.jobs_tracked(), b.jobs_tracked());
                assert_eq!(
                    a.restored_alerts.len(),
                    b.restored_alerts.len(),
                    "firing alerts announced again"
                );
            }
        }
        // A damaged checkpoint fails the take-over, whatever was taken.
        let mut flipped = bytes.clone();
        let i = flipped.len() - 5;
        flipped[i] ^= 0x40;
        let opened =
            checkpoint::open(&flipped[..], flipped.len() as u64, Path::new("ck"), 0).unwrap();
        let mut shards = vec![new_shard()];
        assert!(matches!(
            restore_from(&mut shards, opened.parts, |_, _| 0),
            Err(CheckpointError::Corrupt { why, .. }) if why == "checksum mismatch"
        ));
        assert_eq!(shards[0].jobs_tracked(), 0, "nothing taken over");
    }

    /// A checkpoint fluxpipe wrote in format version 2 (how it was made:
    /// tests/checkpoints/README.md) is restored whole, and saved again in
    /// the current format holds the same state.
    #[test]
    fn a_version_2_checkpoint_is_restored_and_saved_again_alike() {
        let v2 = include_bytes!("../../tests/checkpoints/v2.bin");
        let p = Path::new("v2.bin");
        let jobs = |c: &checkpoint::Checkpoint| {
            let mut v: Vec<String> = c
                .parts
                .iter()
                .flat_map(|s| &s.jobs)
                .map(|(k, e)| format!("{k:?} {:?} {:?} {:?}", e.job, e.exec_log(), e.protocol()))
                .collect();
            v.sort();
            v
        };
        let saved = checkpoint::decode(v2, p).unwrap();
        let before = jobs(&saved);
        assert_eq!(before.len(), 22);
        let with_exec = saved.parts.iter().flat_map(|s| &s.jobs);
        assert_eq!(
            with_exec.filter(|(_, e)| e.exec_log().is_some()).count(),
            15
        );
        let rule = |name: &str, kind, hold: &str| Rule::new(name, kind, hold, "warning").unwrap();
        let mut shard = Shard::new(
            Outputs::new(std::iter::empty()).0,
            RETAIN,
            NodeBoard::default(),
            StateAges::default(),
            AlertSetup {
                rules: vec![
                    rule("sched_long", RuleKind::JobState(JobState::Sched), "10m"),
                    rule("run_long", RuleKind::JobState(JobState::Run), "30d"),
                    rule("node_drained", RuleKind::NodeDrained, "1m"),
                ],
                clock: Clock::Event,
                shared: SharedEventClock::default(),
            },
        );
        let (_, mut states) = saved.split(1, |_, _| 0);
        shard.restore(states.remove(0));
        assert_eq!(shard.jobs_tracked(), 22);
        assert_eq!(shard.alert_conditions(), 13);
        assert_eq!(shard.restored_alerts.len(), 6, "the fired ones");
        let again = checkpoint::encode(&Default::default(), &[shard.snapshot().unwrap().state]);
        let again = checkpoint::decode(&again.unwrap(), p).unwrap();
        assert_eq!(jobs(&again), before);
        assert_eq!(again.parts[0].alerts.len(), 13);
        assert_eq!(again.parts[0].resources.len(), 1);
    }

    /// A million jobs pending past their rule's duration come due at once;
    /// the shard fires them in batches between input records, so a record
    /// sent meanwhile gets through at once instead of after every alert.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_million_due_alerts_do_not_stall_input() {
        let n: u64 = std::env::var("DUE_ALERTS_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if cfg!(debug_assertions) {
                20_000
            } else {
                1_000_000
            });
        let (outputs, mut rx) = sink(r#"["alerts", "transitions"]"#);
        let shard = Shard::new(
            outputs,
            RETAIN,
            NodeBoard::default(),
            StateAges::default(),
            sched_alerts("1h"),
        );
        let (tx, shard_rx) = mpsc::channel(1024);
        let task = tokio::spawn(async move {
            let mut shard = shard;
            shard.run(shard_rx).await
        });
        // Counts alerts; notes when the marker job's transition shows up.
        const MARKER: u64 = u64::MAX - 1;
        let (seen_tx, mut seen_rx) = mpsc::unbounded_channel();
        let consumer = tokio::spawn(async move {
            let mut alerts = 0u64;
            while let Some(r) = rx.recv().await {
                if std::env::var_os("DUE_ALERTS_DEBUG").is_some() {
                    eprintln!("{}", r.line());
                }
                if r.stream == OutputStream::Alerts {
                    alerts += 1;
                } else if r.line().contains(&format!("\"id\":{MARKER}"))
                    || (r.line().contains(&format!("\"id\":{n},")) && r.line().contains("SCHED"))
                {
                    let _ = seen_tx.send((alerts, std::time::Instant::now()));
                }
            }
            alerts
        });
        for id in 1..=n {
            for r in to_sched(id, 1000.0) {
                tx.send(ShardMsg::Record(r)).await.unwrap();
            }
        }
        // all loaded, nothing due yet
        let wait = Duration::from_secs(120);
        let (before, _) = tokio::time::timeout(wait, seen_rx.recv())
            .await
            .expect("the last job reached SCHED")
            .unwrap();
        assert_eq!(before, 0);
        // the clock jumps two hours: every job is overdue
        let submit = |id| to_sched(id, 8200.0).swap_remove(0);
        tx.send(ShardMsg::Record(submit(0))).await.unwrap();
        let sent = std::time::Instant::now();
        tx.send(ShardMsg::Record(submit(MARKER))).await.unwrap();
        // its first transition (NEW → DEPEND) comes with `validate`
        tx.send(ShardMsg::Record(routed(
            MARKER,
            EventStream::Job,
            Event::new(8200.1, "validate"),
        )))
        .await
        .unwrap();
        let (alerts_then, at) = tokio::time::timeout(wait, seen_rx.recv())
            .await
            .expect("the marker got through")
            .unwrap();
        let latency = at - sent;
        drop(tx);
        task.await.unwrap().unwrap();
        let total = consumer.await.unwrap();
        println!(
            "{n} due alerts: marker through after {latency:?}, {alerts_then} alerts fired by then"
        );
        assert_eq!(total, n, "every job alerted once");
        if n > 10 * FIRE_BATCH as u64 {
            assert!(
                alerts_then < n / 2,
                "the marker waited for {alerts_then} of {n} alerts ({latency:?})"
            );
        }
        // How long it took is printed, not asserted: speed is the
        // benchmark's business; what matters here is that the marker did not
        // wait for the whole backlog.
    }
}
