//! Wiring: sinks, then the operator shards, then the sources, all joined by
//! bounded channels; then the shutdown sequence.
//!
//! Shutdown (SIGINT/SIGTERM, or every source at its end): sources stop
//! reading and write their checkpoints; when the last source is gone the
//! shards drain their queues and finish; when the last shard is gone the
//! sinks deliver what they hold, flush, and finish.

use super::config::{Config, OperatorConfig, SinkConfig};
use crate::operators::Router;
use crate::operators::shard::{AlertSetup, Retention, Shard};
use crate::sinks::{self, Outputs, SinkContext};
use crate::sources::{self, SourceContext};
use crate::telemetry;
use anyhow::{Context, Result};
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Queue length of each shard.
const SHARD_QUEUE: usize = 1024;

/// How long shutdown waits for in-flight records to reach the sinks.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

fn retention(op: &OperatorConfig) -> Retention {
    Retention {
        inactive_grace: Duration::from_secs_f64(op.inactive_grace_secs.max(0.0)),
        orphan_ttl: Duration::from_secs_f64(op.orphan_ttl_secs.max(0.0)),
    }
}

/// Run a validated pipeline until shutdown.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data_dir {}", config.data_dir.display()))?;

    // Metrics are recorded only when something exports them.
    if config
        .sinks
        .values()
        .any(|s| matches!(s, SinkConfig::Prometheus(_)))
    {
        telemetry::prometheus();
    }
    let sink_ctx = SinkContext::default();
    let (outputs, sink_rxs) = Outputs::new(config.sinks.iter().map(|(n, c)| (n.as_str(), c)));
    let mut sink_tasks = JoinSet::new();
    for ((name, sink), rx) in config.sinks.iter().zip(sink_rxs) {
        let (name, sink, ctx) = (name.clone(), sink.clone(), sink_ctx.clone());
        sink_tasks.spawn(async move {
            let result = sinks::run(name.clone(), sink, rx, ctx).await;
            (name, result)
        });
    }

    let workers = config
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let alert_setup = AlertSetup {
        rules: config
            .alerts
            .rules()
            .map_err(|(rule, key, e)| anyhow::anyhow!("alerts.rules.{rule}.{key}: {e}"))?,
        clock: config.alerts.clock,
        shared: Default::default(),
    };
    let mut shard_tasks = JoinSet::new();
    let mut shard_txs = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (tx, rx) = mpsc::channel(SHARD_QUEUE);
        shard_txs.push(tx);
        let shard = Shard::new(
            outputs.clone(),
            retention(&config.operators),
            sink_ctx.nodes.clone(),
            sink_ctx.ages.clone(),
            alert_setup.clone(),
        );
        shard_tasks.spawn(shard.run(rx));
    }
    let router = Router::new(shard_txs);

    let mut source_tasks = JoinSet::new();
    for (name, source) in &config.sources {
        let ctx = SourceContext::new(
            name,
            source.decode(),
            router.clone(),
            outputs.clone(),
            shutdown.child_token(),
            config.data_dir.join("sources").join(name),
        );
        let (name, source) = (name.clone(), source.clone());
        source_tasks.spawn(async move {
            let result = sources::run(source, ctx).await;
            (name, result)
        });
    }
    // Only the sources hold the router and the outputs now: when they are
    // done, the channels close behind them.
    let drops = outputs.drop_counts();
    drop(router);
    drop(outputs);
    sink_ctx.ready.set(true);

    let mut sigint = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut failed = false;
    loop {
        tokio::select! {
            _ = sigint.recv() => { tracing::info!("SIGINT: shutting down"); shutdown.cancel(); }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: shutting down"); shutdown.cancel(); }
            _ = shutdown.cancelled(), if !shutdown.is_cancelled() => {}
            done = source_tasks.join_next() => match done {
                None => break,
                Some(Ok((name, Err(e)))) => {
                    tracing::error!(source = %name, "source failed: {e:#}");
                    failed = true;
                }
                Some(Ok((_, Ok(())))) => {}
                Some(Err(e)) => { tracing::error!("source task: {e}"); failed = true; }
            },
        }
    }

    sink_ctx.ready.set(false);
    let drain = async {
        while shard_tasks.join_next().await.is_some() {}
        while let Some(done) = sink_tasks.join_next().await {
            if let Ok((name, Err(e))) = done {
                tracing::error!(sink = %name, "sink failed: {e:#}");
                failed = true;
            }
        }
    };
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    for (sink, n) in drops.nonzero() {
        tracing::warn!(sink = %sink, dropped = n, "records dropped (buffer full or sink stopped)");
    }
    if drained.is_err() {
        anyhow::bail!(
            "records still in flight after {DRAIN_TIMEOUT:?}: a sink is not accepting them"
        );
    }
    if failed {
        anyhow::bail!("the pipeline stopped with errors (see above)");
    }
    Ok(())
}
