//! Wiring: sinks, then the operator shards, then the sources, all joined by
//! bounded channels; then the shutdown sequence.
//!
//! Startup: the checkpoint in `data_dir` (if any) is read first; its state
//! goes to the shards (dealt out by key) and its positions to the sources,
//! before any record moves. A checkpoint that cannot be read stops the
//! start (`fluxpipe run --reset-state` sets it aside).
//!
//! Shutdown (SIGINT/SIGTERM, or every source at its end): sources stop
//! reading and report their final positions; when the last source is gone
//! the shards drain their queues and finish with their final state; when
//! the last shard is gone the sinks deliver what they hold, flush, and
//! finish. If every sink delivered, the final checkpoint is written.

use super::config::{Config, OperatorConfig};
use crate::api::{Server, Views};
use crate::channels::fanout::Outputs;
use crate::channels::feeds::Feeds;
use crate::channels::query::{Questions, WatchFiring};
use crate::channels::router::{Router, ShardMsg, ShardSnapshot, SourceInfo};
use crate::checkpoint::coordinator::{self, Coordinator, Schedule};
use crate::checkpoint::file::{self as checkpoint, Head};
use crate::keyed::alerts::watch::Watch;
use crate::operators::feed_watch;
use crate::operators::shard::{self, AlertSetup, Retention, Shard};
use crate::sinks::SinkConfig;
use crate::sinks::{self, SinkContext};
use crate::sources::{self, SourceContext, SourceSpec};
use crate::telemetry;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Queue length of each shard, in messages: most carry a source's batch
/// (up to 64 records), so up to ~16k records wait per shard.
const SHARD_QUEUE: usize = 256;

/// How long shutdown waits for in-flight records to reach the sinks.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

fn retention(op: &OperatorConfig, workers: usize) -> Retention {
    Retention {
        inactive_grace: Duration::from_secs_f64(op.inactive_grace_secs.max(0.0)),
        orphan_ttl: Duration::from_secs_f64(op.orphan_ttl_secs.max(0.0)),
        // Keys spread evenly over the shards.
        max_jobs: op.max_jobs.div_ceil(workers.max(1)).max(1),
        max_finished: op.max_finished_jobs.div_ceil(workers.max(1)),
        max_clock_skew: op.max_clock_skew_secs,
    }
}

fn schedule(config: &Config) -> Schedule {
    let c = &config.checkpoint;
    Schedule {
        interval: (c.interval_secs > 0.0)
            .then(|| Duration::from_secs_f64(c.interval_secs.min(1e9))),
        timeout: Duration::from_secs_f64(c.timeout_secs.clamp(0.1, 1e9)),
    }
}

/// A shard's thread ended without its final state.
#[derive(Debug, thiserror::Error)]
#[error("a shard's thread panicked")]
struct ShardPanicked;

/// Run a shard on a thread of its own, in a single-threaded runtime: its
/// loop is the busiest in the pipeline, and on the shared runtime it was
/// moved between worker threads with the sources and sinks, waking them and
/// being woken, its data cold in the other core's cache. The returned
/// future ends with the shard's final state; the thread, once it has
/// freed the shard too.
fn on_own_thread(
    index: usize,
    shard: Shard,
    rx: mpsc::Receiver<ShardMsg>,
) -> anyhow::Result<(
    impl Future<Output = Result<ShardSnapshot, ShardPanicked>> + use<>,
    std::thread::JoinHandle<()>,
)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .context("cannot start a shard's runtime")?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name(format!("fluxpipe-shard-{index}"))
        .spawn(move || {
            let mut shard = shard;
            let _ = done_tx.send(runtime.block_on(shard.run(rx)));
            // Freed after its final state has gone out, while the final
            // checkpoint is written: a stop does not wait for a million
            // jobs' frees before it.
            drop(shard);
        })
        .context("cannot start a shard's thread")?;
    // The sender is dropped unsent only if the shard panicked.
    Ok((
        async move { done_rx.await.map_err(|_| ShardPanicked) },
        thread,
    ))
}

/// How long the API server may take to finish its answers at a stop.
const SERVER_STOP_GRACE: Duration = Duration::from_secs(5);

/// What a restart resumes from: the checkpoint's head, and its parts to
/// decode once the shards exist.
type Resumed = (Option<Head>, Option<checkpoint::Parts<PathBuf>>);

/// Open the checkpoint: its head now, its parts for the shards to take
/// over (see [`shard::restore_from`]).
fn open_checkpoint(config: &Config) -> Result<Resumed> {
    let dir = &config.data_dir;
    let stale = checkpoint::remove_spills(dir);
    if stale > 0 {
        tracing::info!(
            files = stale,
            "removed scratch files of an interrupted checkpoint"
        );
    }
    let Some(mut opened) = checkpoint::open_in(dir).with_context(|| RESTORE_FAILED)? else {
        return Ok((None, None));
    };
    // Another pipeline's state (a data folder shared by two configs) is
    // not taken silently.
    if let Some(why) = checkpoint::mismatch(&opened.head.identities, &config.source_identities()) {
        // A damaged head is said as such, not as another pipeline's (and
        // the parts are not checked twice).
        opened.parts.check_sum().with_context(|| RESTORE_FAILED)?;
        let told = if config.adopt_checkpoint {
            "--adopt-checkpoint"
        } else if config.checkpoint.adopt_mismatched {
            "checkpoint.adopt_mismatched"
        } else {
            anyhow::bail!(
                "the checkpoint in {} belongs to another pipeline: {why}. \
                 `fluxpipe run --reset-state` sets it aside and starts from nothing, \
                 `--data-dir` (or the config's data_dir) keeps this pipeline's state apart, \
                 `--adopt-checkpoint` (or `checkpoint.adopt_mismatched = true` in the config) \
                 restores it anyway",
                dir.display()
            );
        };
        tracing::warn!("{told}: restoring the checkpoint of another pipeline: {why}");
    }
    Ok((Some(opened.head), Some(opened.parts)))
}

/// Why a start failed on its checkpoint, and the way out.
const RESTORE_FAILED: &str = "cannot restore the checkpoint; `fluxpipe run --reset-state` sets it aside and starts from nothing";

/// Sources whose partitions' state goes to a changelog.
fn changelog_sources(config: &Config) -> Vec<Arc<str>> {
    config
        .sources
        .iter()
        .filter(|(_, s)| s.keeps_changelog())
        .map(|(n, _)| Arc::from(n.as_str()))
        .collect()
}

/// The exit status of a stop forced by a second signal.
pub const FORCED_STOP_STATUS: i32 = 2;

/// The first SIGINT/SIGTERM begins a clean stop; one more while it is
/// under way stops at once.
fn stop_on_signal(name: &str, shutdown: &CancellationToken) {
    if shutdown.is_cancelled() {
        stop_at_once(name);
    }
    tracing::info!("{name}: shutting down (again to stop at once)");
    shutdown.cancel();
}

/// Stop now: nothing more is delivered and no checkpoint is written, so
/// the next run reads again from the last one (at least once, as after
/// a crash). The data folder's lock goes with the process.
fn stop_at_once(name: &str) -> ! {
    tracing::warn!(
        "{name} again: stopping at once; what was not delivered is read again by the next run"
    );
    std::process::exit(FORCED_STOP_STATUS)
}

/// Run a validated pipeline until shutdown.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    // Watched from the start: a SIGTERM while the checkpoint is restored
    // or the sources start is a clean shutdown once they have, not death
    // by the signal's default.
    let mut sigint = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    // SIGHUP asks file sinks to reopen their files (logrotate, `systemctl
    // reload`); watched here too, so that a pipeline with no file sink is
    // not ended by the signal's default action.
    let mut sighup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;
    let workers = config
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let (head, parts) = open_checkpoint(&config)?;

    // Metrics are recorded only when something exports them. The server
    // is bound before anything reads: a taken address fails the start.
    let server = match &config.api {
        Some(api) => {
            telemetry::prometheus();
            // The page and the API read the past from the archive the
            // pipeline writes (its first `database` sink's).
            let archive = config.sinks.values().find_map(|s| match s {
                crate::sinks::SinkConfig::Database(d) => Some(d.url.clone()),
                _ => None,
            });
            Some(Server::bind(api).await?.with_archive(archive))
        }
        None => None,
    };
    let watch_rules = config
        .alerts
        .cluster_rules()
        .map_err(|(rule, key, e)| anyhow::anyhow!("alerts.rules.{rule}.{key}: {e}"))?;
    let alert_rules = config
        .alerts
        .rules()
        .map_err(|(rule, key, e)| anyhow::anyhow!("alerts.rules.{rule}.{key}: {e}"))?;
    // Served at 0 from the start (`increase()` sees a first loss).
    let sources: Vec<&str> = config.sources.keys().map(String::as_str).collect();
    let sinks: Vec<&str> = config.sinks.keys().map(String::as_str).collect();
    let rules: Vec<&str> = alert_rules
        .iter()
        .chain(&watch_rules)
        .map(|r| r.name.as_str())
        .collect();
    telemetry::announce_counters(&sources, &sinks, &rules);
    let mut views = Views::default();
    if config.api.as_ref().is_some_and(|a| a.per_user_jobs) {
        views.users = crate::telemetry::UserJobs::enabled();
    }
    // A source that keeps a Kafka changelog may take state over from it,
    // newer than this checkpoint: the file sinks' cuts of this checkpoint
    // would then cut off output the state will not produce again. There
    // the file sinks only cut a torn line (at least once).
    let exactly_once = !config.sources.values().any(SourceSpec::keeps_changelog);
    let cuts = match (&head, exactly_once) {
        (Some(h), true) => h.sinks.clone(),
        _ => Default::default(),
    };
    let sink_ctx = SinkContext {
        offsets: crate::checkpoint::offsets::SinkOffsets::restored(cuts),
        shutdown: shutdown.clone(),
        sinks: config.sinks.len(),
        api_url: config.api.as_ref().map(|a| format!("http://{}", a.address)),
    };
    let (outputs, sink_rxs) = Outputs::new(
        config
            .sinks
            .iter()
            .map(|(n, c)| (n.as_str(), c.common().subscription())),
    );
    let outputs = outputs.with_taps(views.taps.clone());
    // The file sinks' marks exist before any checkpoint round can ask.
    for (name, sink) in &config.sinks {
        if matches!(sink, SinkConfig::File(_)) {
            sink_ctx.offsets.mark(name);
        }
    }
    views.buffers = outputs.counters();
    let alert_setup = AlertSetup {
        rules: alert_rules,
        clock: config.alerts.clock,
        shared: Default::default(),
    };
    views
        .nodes
        .set_clock(config.alerts.clock, alert_setup.shared.clone());
    let source_table: Vec<SourceInfo> = config
        .sources
        .iter()
        .map(|(name, source)| SourceInfo::new(name, &source.decode().cluster))
        .collect();
    // Each shard encodes its state at a barrier on its share of the cores.
    let encode_threads = checkpoint::encode_threads(workers);
    // The ranks jobs hold, over every shard's jobs: for draining.
    let allocations = crate::keyed::state::SharedAllocations::default();
    // The ranks all clusters' resource states may hold together.
    let rank_budget = crate::keyed::state::RankBudget::new(config.operators.max_ranks);
    // The clusters all shards follow together.
    let cluster_budget = crate::keyed::state::ClusterBudget::new(config.operators.max_clusters);
    let mut shards: Vec<Shard> = (0..workers)
        .map(|index| {
            Shard::new(
                outputs.clone(),
                retention(&config.operators, workers),
                views.nodes.clone(),
                views.ages.clone(),
                alert_setup.clone(),
            )
            .with_changelog(changelog_sources(&config))
            .with_user_jobs(views.users.clone())
            .with_allocations(allocations.clone())
            .with_rank_budget(rank_budget.clone())
            .with_cluster_budget(cluster_budget.clone())
            .with_sources(&source_table)
            .with_spill(config.data_dir.clone(), index, encode_threads)
        })
        .collect();
    // Set up first, so what is restored is counted where it is exported
    // (per-user job counts included). Before any sink starts: a file sink
    // cuts its file back to the checkpoint's offsets, which only a
    // checkpoint read whole and sound may tell it.
    if let Some(parts) = parts {
        let started = std::time::Instant::now();
        shard::restore_from(&mut shards, parts, |c, id| {
            Router::shard_index(workers, c, id)
        })
        .with_context(|| RESTORE_FAILED)?;
        let jobs: usize = shards.iter().map(Shard::jobs_tracked).sum();
        tracing::info!(
            seq = head.as_ref().map_or(0, |h| h.seq),
            jobs,
            sources = head.as_ref().map_or(0, |h| h.sources.len()),
            secs = started.elapsed().as_secs_f64(),
            "restored the checkpoint"
        );
    }
    let mut sink_tasks = JoinSet::new();
    for ((name, sink), rx) in config.sinks.iter().zip(sink_rxs) {
        let (name, sink, ctx) = (name.clone(), sink.clone(), sink_ctx.clone());
        sink_tasks.spawn(async move {
            let offsets = ctx.offsets.clone();
            let result = sinks::run(name.clone(), sink, rx, ctx).await;
            if let Err(e) = &result {
                // Said now, not at the stop; a file sink that stopped
                // holds no checkpoint back (its records are dropped as
                // `closed`, and a restart writes them).
                if e.downcast_ref::<sinks::OutputClosed>().is_some() {
                    tracing::info!(sink = %name, "{e:#}: stopping");
                } else {
                    tracing::error!(sink = %name, "sink stopped: {e:#}");
                }
                offsets.stopped(&name);
            }
            (name, result)
        });
    }

    let mut shard_tasks = JoinSet::new();
    let mut shard_txs = Vec::with_capacity(workers);
    let mut shard_threads = Vec::with_capacity(workers);
    for (index, shard) in shards.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel(SHARD_QUEUE);
        shard_txs.push(tx);
        let (done, thread) = on_own_thread(index, shard, rx)?;
        shard_tasks.spawn(done);
        shard_threads.push(thread);
    }
    let ownership = crate::channels::query::Ownership::default();
    let watch_firing = WatchFiring::default();
    let questions = Questions::new(&shard_txs, ownership.clone(), watch_firing.clone());
    let router = Router::new(shard_txs);
    let mut coordinator = Coordinator::new(
        config.data_dir.clone(),
        schedule(&config),
        router.clone(),
        outputs.counters(),
        sink_ctx.offsets.clone(),
        head.as_ref(),
    )
    .with_identities(config.source_identities());

    // What the watch had fired stays fired; a silent feed has not been
    // heard since its silence began.
    let mut watch = Watch::new(watch_rules);
    let saved_watch = head.as_ref().map(|h| h.watch.clone()).unwrap_or_default();
    let announce = watch.restore(&saved_watch);
    // A cluster named in records gets a feed only if it is followed.
    let feeds = Feeds::following(cluster_budget.clone());
    let mut source_tasks = JoinSet::new();
    for (index, (name, source)) in config.sources.iter().enumerate() {
        let link = coordinator.link(name, source.has_positions(), source.keeps_changelog());
        let ctx = SourceContext::new(
            name,
            index,
            source.decode(),
            router.clone(),
            outputs.clone(),
            shutdown.child_token(),
            link.clone(),
        )
        .with_ownership(ownership.clone())
        .with_readiness(views.ready.clone())
        .with_feed({
            let own = &source.decode().cluster;
            let feed = feeds.register(name, own, source.heartbeats());
            for s in saved_watch
                .iter()
                .filter(|s| s.source.as_ref() == Some(name))
            {
                feed.heard_last_at(own, &s.cluster, s.since);
            }
            feed
        });
        let (name, source) = (name.clone(), source.clone());
        source_tasks.spawn(async move {
            let result = sources::run(source, ctx).await;
            let positions = result.as_ref().ok().cloned().flatten();
            link.finish(&Arc::from(name.as_str()), positions).await;
            (name, result)
        });
    }
    let coordinator = tokio::spawn(coordinator.with_watch(watch_firing.clone()).run());
    let stop_watch = CancellationToken::new();
    let watch = tokio::spawn(feed_watch::run(
        watch,
        announce,
        feeds,
        views.nodes.clone(),
        outputs.clone(),
        watch_firing.clone(),
        stop_watch.clone(),
    ));
    // Only the sources and the coordinator hold the router, and only the
    // sources and the feed watch the outputs: when they are done, the
    // channels close behind them.
    let drops = outputs.drop_counts();
    let counters = outputs.counters();
    drop(router);
    drop(outputs);
    views.ready.set(true);
    // The server answers until the pipeline has stopped (a scrape during
    // shutdown sees not ready).
    let stop_server = CancellationToken::new();
    let server = server
        .map(|s| tokio::spawn(s.serve(views.clone(), questions.clone(), stop_server.clone())));

    let mut failed = false;
    loop {
        tokio::select! {
            _ = sigint.recv() => stop_on_signal("SIGINT", &shutdown),
            _ = sigterm.recv() => stop_on_signal("SIGTERM", &shutdown),
            _ = sighup.recv() => { tracing::info!("SIGHUP: file sinks reopen their files"); }
            _ = shutdown.cancelled(), if !shutdown.is_cancelled() => {}
            done = source_tasks.join_next() => match done {
                None => break,
                Some(Ok((name, Err(e)))) => {
                    tracing::error!(source = %name, "source failed: {e:#}");
                    failed = true;
                }
                Some(Ok((_, Ok(_)))) => {}
                Some(Err(e)) => { tracing::error!("source task: {e}"); failed = true; }
            },
        }
    }

    views.ready.set(false);
    // A signal while the rest drains stops at once.
    let second_signal = tokio::spawn(async move {
        tokio::select! {
            _ = sigint.recv() => stop_at_once("SIGINT"),
            _ = sigterm.recv() => stop_at_once("SIGTERM"),
        }
    });
    // The watch lets go of the outputs, so the sinks can finish.
    stop_watch.cancel();
    if let Err(e) = watch.await {
        tracing::error!("feed watch task: {e}");
    }
    let (seq, positions) = coordinator.await.context("checkpoint coordinator")?;
    let mut states = Vec::with_capacity(workers);
    let mut sinks_ok = true;
    // The reader of the output went away (`fluxpipe run | head`).
    let mut output_closed = false;
    let drain = async {
        while let Some(done) = shard_tasks.join_next().await {
            match done {
                Ok(Ok(Ok(reply))) => states.push(reply.state),
                Ok(Ok(Err(e))) => tracing::error!("cannot encode a shard's final state: {e}"),
                Ok(Err(e)) => tracing::error!("{e}"),
                Err(e) => tracing::error!("shard task: {e}"),
            }
        }
        while let Some(done) = sink_tasks.join_next().await {
            match done {
                Ok((_, Err(e))) if e.downcast_ref::<sinks::OutputClosed>().is_some() => {
                    output_closed = true;
                }
                Ok((_, Err(_))) => sinks_ok = false,
                _ => {}
            }
        }
    };
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    failed |= !sinks_ok;
    // The final checkpoint, only if nothing was lost on the way out: else
    // the last periodic one stays and the records since are read again.
    let given_up = counters.given_up();
    if given_up > 0 && !output_closed {
        tracing::warn!(
            given_up,
            "sinks gave up on records: no final checkpoint, the next run reads them again"
        );
    }
    if drained.is_ok() && sinks_ok && given_up == 0 && states.len() == workers {
        // Every sink has finished: its place is the end of what it wrote.
        let head = Head {
            seq: seq + 1,
            written_at: crate::keyed::alerts::wall_now(),
            sources: positions,
            sinks: sink_ctx.offsets.ends(),
            identities: config.source_identities(),
            watch: watch_firing.saved(),
        };
        match coordinator::write(config.data_dir.clone(), head, states).await {
            Ok(bytes) => tracing::info!(bytes, "final checkpoint written"),
            Err(e) => {
                tracing::error!("cannot write the final checkpoint: {e}");
                failed = true;
            }
        }
    } else if !output_closed {
        tracing::warn!(
            "no final checkpoint: not everything was delivered; the last checkpoint stays"
        );
    }
    for (sink, n) in drops.nonzero() {
        tracing::warn!(sink = %sink, dropped = n, "records dropped (buffer full or sink stopped)");
    }
    // Every shard has given its final state, so each thread is only
    // freeing: waited for, so a stop is a stop (and the same work every
    // time). A shard still stuck behind a sink is not waited for.
    if drained.is_ok() {
        let freed = tokio::task::spawn_blocking(move || {
            for thread in shard_threads {
                if thread.join().is_err() {
                    tracing::error!("a shard's thread panicked while freeing its state");
                }
            }
        });
        if let Err(e) = freed.await {
            tracing::error!("shard threads: {e}");
        }
    }
    second_signal.abort();
    stop_server.cancel();
    if let Some(mut server) = server {
        // A client that stopped reading (a tap left in a pager) would hold
        // the graceful stop for ever: it gets a few seconds.
        match tokio::time::timeout(SERVER_STOP_GRACE, &mut server).await {
            Ok(Ok(Err(e))) => {
                tracing::error!("{e:#}");
                failed = true;
            }
            Ok(Err(e)) => tracing::error!("api task: {e}"),
            Ok(Ok(Ok(()))) => {}
            Err(_) => {
                tracing::warn!(
                    "the API's clients did not let go within {SERVER_STOP_GRACE:?}: closed"
                );
                server.abort();
            }
        }
    }
    if drained.is_err() {
        anyhow::bail!(
            "records still in flight after {DRAIN_TIMEOUT:?}: a sink is not accepting them"
        );
    }
    if failed {
        anyhow::bail!("the pipeline stopped with errors (see above)");
    }
    if given_up > 0 && !output_closed {
        // Not lost (the next run reads them again), but not a clean stop.
        anyhow::bail!(
            "records not delivered at shutdown: {given_up}; no final checkpoint, the next \
             run reads them again"
        );
    }
    Ok(())
}
