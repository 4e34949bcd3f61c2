//! The feed watch: moves the feeds' coarse clock every tenth of a second;
//! once a second serves when each feed was last heard, and asks the watch rules
//! ([`crate::keyed::alerts::watch`]) what fires and resolves for the
//! feeds and the instances the shards say are down; its alerts go to the
//! `alerts` stream like every other, and what fires is told to the query
//! API ([`WatchFiring`]).

use crate::channels::fanout::Outputs;
use crate::channels::feeds::Feeds;
use crate::channels::query::WatchFiring;
use crate::keyed::alerts::event::Status;
use crate::keyed::alerts::watch::WatchAlert;
use crate::keyed::alerts::watch::{FeedState, Watch};
use crate::keyed::query::AlertPosition;
use crate::output::{self, OutputRecord};
use crate::telemetry::{NodeBoard, metric};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the feeds' coarse clock moves on: how late a note may be.
const CLOCK_TICK: Duration = Duration::from_millis(100);

/// Clock ticks between two looks of the watch (a second).
const TICKS_PER_LOOK: u32 = 10;

/// Look every second until `stop`; hold `outputs` no longer than that (the
/// sinks finish once every holder has let go).
pub async fn run(
    mut watch: Watch,
    announce: Vec<WatchAlert>,
    feeds: Feeds,
    nodes: NodeBoard,
    outputs: Outputs,
    firing: WatchFiring,
    stop: CancellationToken,
) {
    // What had fired before a restart, announced again as such.
    for a in &announce {
        if let Some(rule) = watch.rules().get(a.rule) {
            let mut record = output::watch_alert(rule, a);
            record.restored = true;
            outputs.emit(OutputRecord::alert(record)).await;
        }
    }
    tell(&watch, &firing);
    let mut ticks = tokio::time::interval(CLOCK_TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u32 = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        feeds.tick_wall();
        n = n.wrapping_add(1);
        if n % TICKS_PER_LOOK != 1 {
            continue;
        }
        let readings = feeds.readings();
        for r in &readings {
            metrics::gauge!(
                metric::FLUXPIPE_FEED_LAST_SEEN_TIMESTAMP_SECONDS,
                "source" => r.source.to_string(),
                "flux_cluster" => r.cluster.to_string(),
            )
            .set(r.last_heard);
        }
        if watch.is_empty() {
            continue;
        }
        let states: Vec<FeedState> = readings
            .iter()
            .map(|r| FeedState {
                source: &r.source,
                cluster: &r.cluster,
                heartbeats: r.heartbeats,
                last_heard: r.last_heard,
                watched: r.watched,
            })
            .collect();
        let down = nodes.down_clusters();
        let now = crate::keyed::alerts::wall_now();
        let alerts = watch.evaluate(now, &states, down.iter().map(String::as_str));
        for a in &alerts {
            let Some(rule) = watch.rules().get(a.rule) else {
                continue;
            };
            match a.status {
                Status::Firing => tracing::warn!(
                    rule = %rule.name,
                    cluster = %a.subject.cluster,
                    source = a.subject.source.as_deref().unwrap_or(""),
                    "watch alert firing"
                ),
                Status::Resolved => tracing::info!(
                    rule = %rule.name,
                    cluster = %a.subject.cluster,
                    source = a.subject.source.as_deref().unwrap_or(""),
                    "watch alert resolved"
                ),
            }
            metrics::counter!(metric::FLUXPIPE_ALERTS_TOTAL, "rule" => rule.name.clone(), "status" => a.status.as_str()).increment(1);
            outputs
                .emit(OutputRecord::alert(output::watch_alert(rule, a)))
                .await;
        }
        if !alerts.is_empty() {
            tell(&watch, &firing);
        }
    }
}

/// Tell the query API and the checkpoints what fires now.
fn tell(watch: &Watch, firing: &WatchFiring) {
    let records = watch
        .firing()
        .filter_map(|a| {
            let rule = watch.rules().get(a.rule)?;
            Some((position(&a), output::watch_alert(rule, &a)))
        })
        .collect();
    firing.set(records, watch.saved());
}

/// Where a watch alert stands among every alert that fires: by when its
/// condition began, like the others, and after a job's or a node's of
/// the same start and rule.
fn position(a: &WatchAlert) -> AlertPosition {
    let source = a.subject.source.as_deref().unwrap_or("");
    AlertPosition {
        since: a.since,
        rule: a.rule,
        kind: 2,
        id: xxhash_rust::xxh3::xxh3_64(source.as_bytes()),
        cluster: a.subject.cluster.as_str().into(),
    }
}
