//! The per-node (RAS) series, rendered from the rank state at each scrape:
//! a series that stops being true (a node undrained, a drain reason
//! replaced) disappears rather than sticking at 0.

use super::{escape, metric};
use crate::flux::resource::RankState;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, RwLock};

/// One node as the board knows it: its state, and the node-seconds it
/// spent drained and offline, from event timestamps.
#[derive(Debug, Clone)]
struct Node {
    state: RankState,
    drained: Lost,
    offline: Lost,
}

/// Seconds lost to one condition: closed intervals plus the open one.
#[derive(Debug, Clone, Copy, Default)]
struct Lost {
    closed: f64,
    since: Option<f64>,
}

impl Lost {
    /// The condition holds (or not) as of `at`.
    fn set(&mut self, holds: bool, at: f64) {
        match (self.since, holds) {
            (None, true) => self.since = Some(at),
            (Some(since), false) => {
                self.closed += (at - since).max(0.0);
                self.since = None;
            }
            _ => {}
        }
    }

    /// The total as of `now`.
    fn total(&self, now: f64) -> f64 {
        self.closed + self.since.map_or(0.0, |s| (now - s).max(0.0))
    }
}

/// A cluster's nodes and the newest event time that changed one.
#[derive(Debug, Clone, Default)]
struct ClusterNodes {
    ranks: BTreeMap<u32, Node>,
    latest: f64,
    /// The whole instance is down (`instance-down`, until a `restart`).
    down: bool,
    /// The ranks of each queue that is not virtual (from the cluster's
    /// `[queues]` table and its R's properties).
    queues: Vec<(String, crate::flux::idset::IdSet)>,
}

/// Rank state per cluster, as the operator shards last saw it, for the
/// per-node series. Written by the shard that owns the cluster's resource
/// log; read at scrape.
#[derive(Debug, Default, Clone)]
pub struct NodeBoard(
    Arc<RwLock<BTreeMap<String, ClusterNodes>>>,
    Arc<
        RwLock<
            Option<(
                crate::keyed::alerts::Clock,
                crate::keyed::alerts::SharedEventClock,
            )>,
        >,
    >,
);

impl NodeBoard {
    /// Record a rank's new state (`None`: the rank left the instance) as of
    /// event time `at`.
    pub fn update(&self, cluster: &str, rank: u32, state: Option<&RankState>, at: f64) {
        let Ok(mut board) = self.0.write() else {
            return;
        };
        let c = board.entry(cluster.to_string()).or_default();
        // Counters never go back: an event older than one already seen
        // counts as of the newest.
        if at.is_finite() {
            c.latest = c.latest.max(at);
        }
        let at = c.latest;
        match state {
            Some(s) => {
                let node = c.ranks.entry(rank).or_insert_with(|| Node {
                    state: s.clone(),
                    drained: Lost::default(),
                    offline: Lost::default(),
                });
                node.state = s.clone();
                node.drained.set(s.drained, at);
                node.offline.set(s.online == Some(false), at);
            }
            None => {
                c.ranks.remove(&rank);
            }
        }
    }

    /// What "now" is for the node-seconds counters: the wall clock, or
    /// each cluster's event clock (its newest event of any stream), as
    /// the alert rules use. Unset (tests, tools): the cluster's newest
    /// resource event.
    pub fn set_clock(
        &self,
        clock: crate::keyed::alerts::Clock,
        shared: crate::keyed::alerts::SharedEventClock,
    ) {
        if let Ok(mut c) = self.1.write() {
            *c = Some((clock, shared));
        }
    }

    /// "Now" for a cluster's counters: never before its newest resource
    /// event.
    fn now(&self, cluster: &str, latest: f64) -> f64 {
        let clock = self.1.read().ok().and_then(|c| c.clone());
        let now = match clock {
            Some((crate::keyed::alerts::Clock::Wall, _)) => crate::keyed::alerts::wall_now(),
            Some((crate::keyed::alerts::Clock::Event, shared)) => {
                shared.now(cluster).unwrap_or(latest)
            }
            None => latest,
        };
        now.max(latest)
    }

    /// The ranks of each of a cluster's queues that is not virtual.
    pub fn set_queues(&self, cluster: &str, queues: Vec<(String, crate::flux::idset::IdSet)>) {
        if let Ok(mut board) = self.0.write() {
            board.entry(cluster.to_string()).or_default().queues = queues;
        }
    }

    /// Whether the cluster's whole instance is down.
    pub fn set_instance_down(&self, cluster: &str, down: bool) {
        if let Ok(mut board) = self.0.write() {
            board.entry(cluster.to_string()).or_default().down = down;
        }
    }

    /// The clusters whose whole instance is down now.
    pub fn down_clusters(&self) -> Vec<String> {
        self.0.read().map_or_else(
            |_| Vec::new(),
            |board| {
                board
                    .iter()
                    .filter(|(_, c)| c.down)
                    .map(|(name, _)| name.clone())
                    .collect()
            },
        )
    }

    /// Forget a cluster's nodes (its state moved to another member).
    pub fn forget(&self, cluster: &str) {
        if let Ok(mut board) = self.0.write() {
            board.remove(cluster);
        }
    }

    /// The node series in the Prometheus text format: the per-cluster
    /// counts, and with `per_node` the series of each node.
    pub fn render(&self, per_node: bool) -> String {
        let Ok(board) = self.0.read() else {
            return String::new();
        };
        let mut out = String::new();
        metric::header(&mut out, metric::FLUX_INSTANCE_UP);
        for (cluster, c) in board.iter() {
            let _ = writeln!(
                out,
                "flux_instance_up{{flux_cluster=\"{}\"}} {}",
                escape(cluster),
                u8::from(!c.down)
            );
        }
        use crate::flux::resource::NodeCount;
        let totals: [(&str, Option<NodeCount>); 7] = [
            (metric::FLUX_NODES, None),
            (metric::FLUX_NODES_ONLINE, Some(NodeCount::Online)),
            (metric::FLUX_NODES_OFFLINE, Some(NodeCount::Offline)),
            (
                metric::FLUX_NODES_LIVENESS_UNKNOWN,
                Some(NodeCount::Unknown),
            ),
            (metric::FLUX_NODES_DRAINED, Some(NodeCount::Drained)),
            (metric::FLUX_NODES_DRAINING, Some(NodeCount::Draining)),
            (metric::FLUX_NODES_TORPID, Some(NodeCount::Torpid)),
        ];
        for (name, count) in totals {
            metric::header(&mut out, name);
            for (cluster, c) in board.iter() {
                let n = c
                    .ranks
                    .values()
                    .filter(|n| count.is_none_or(|k| k.holds(&n.state)))
                    .count();
                let _ = writeln!(out, "{name}{{flux_cluster=\"{}\"}} {n}", escape(cluster));
            }
        }
        metric::header(&mut out, metric::FLUX_QUEUE_NODES);
        for (cluster, c) in board.iter() {
            for (queue, ranks) in &c.queues {
                let states = std::iter::once(("all", None))
                    .chain(NodeCount::ALL.into_iter().map(|k| (k.as_str(), Some(k))));
                for (state, count) in states {
                    let n = ranks
                        .iter()
                        .filter_map(|r| c.ranks.get(&r))
                        .filter(|n| count.is_none_or(|k| k.holds(&n.state)))
                        .count();
                    let _ = writeln!(
                        out,
                        "flux_queue_nodes{{flux_cluster=\"{}\",queue=\"{}\",state=\"{state}\"}} {n}",
                        escape(cluster),
                        escape(queue)
                    );
                }
            }
        }
        if !per_node {
            return out;
        }
        let per_node = [metric::FLUX_NODE_ONLINE, metric::FLUX_NODE_TORPID];
        for (i, name) in per_node.iter().enumerate() {
            metric::header(&mut out, name);
            for (cluster, c) in board.iter() {
                for r in c.ranks.values().map(|n| &n.state) {
                    // No series for a node whose liveness is unknown.
                    let Some(v) = (if i == 0 { r.online } else { Some(r.torpid) }) else {
                        continue;
                    };
                    let _ = writeln!(out, "{name}{{{}}} {}", node_labels(cluster, r), u8::from(v));
                }
            }
        }
        metric::header(&mut out, metric::FLUX_NODE_DRAIN_INFO);
        for (cluster, c) in board.iter() {
            for r in c.ranks.values().map(|n| &n.state).filter(|r| r.drained) {
                let _ = writeln!(
                    out,
                    "flux_node_drain_info{{{},reason=\"{}\",state=\"{}\"}} 1",
                    node_labels(cluster, r),
                    escape(r.drain_reason.as_deref().unwrap_or("")),
                    if r.draining { "draining" } else { "drained" }
                );
            }
        }
        metric::header(&mut out, metric::FLUX_NODE_DRAIN_TIMESTAMP_SECONDS);
        for (cluster, c) in board.iter() {
            for r in c.ranks.values().map(|n| &n.state).filter(|r| r.drained) {
                if let Some(ts) = r.drain_timestamp {
                    let _ = writeln!(
                        out,
                        "flux_node_drain_timestamp_seconds{{{}}} {ts}",
                        node_labels(cluster, r)
                    );
                }
            }
        }
        type LostSeries = (&'static str, fn(&Node) -> Lost);
        let lost: [LostSeries; 2] = [
            (metric::FLUX_NODE_DRAINED_SECONDS_TOTAL, |n| n.drained),
            (metric::FLUX_NODE_OFFLINE_SECONDS_TOTAL, |n| n.offline),
        ];
        for (name, get) in lost {
            metric::header(&mut out, name);
            for (cluster, c) in board.iter() {
                let now = self.now(cluster, c.latest);
                for n in c.ranks.values() {
                    let _ = writeln!(
                        out,
                        "{name}{{{}}} {}",
                        node_labels(cluster, &n.state),
                        get(n).total(now)
                    );
                }
            }
        }
        out
    }
}

/// A rank the instance has not named yet is `node="rankN"`, as in alerts,
/// the query API and the status page.
fn node_labels(cluster: &str, r: &RankState) -> String {
    format!(
        "flux_cluster=\"{}\",node=\"{}\",rank=\"{}\"",
        escape(cluster),
        escape(&r.name()),
        r.rank
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_series_follow_the_current_state() {
        let board = NodeBoard::default();
        let mut r = RankState::new(3);
        r.hostname = Some("node3".into());
        r.online = Some(true);
        r.drained = true;
        r.drain_reason = Some("bad \"DIMM\"".into());
        r.drain_timestamp = Some(1700000000.5);
        board.update("picl", 3, Some(&r), 1700000000.5);
        let text = board.render(true);
        assert!(text.contains(
            "flux_node_drain_info{flux_cluster=\"picl\",node=\"node3\",rank=\"3\",reason=\"bad \\\"DIMM\\\"\",state=\"drained\"} 1"
        ), "{text}");
        assert!(text.contains("flux_nodes_drained{flux_cluster=\"picl\"} 1"));
        assert!(text.contains("flux_nodes_draining{flux_cluster=\"picl\"} 0"));
        // a job still runs on it: draining, not drained (flux resource status)
        r.draining = true;
        board.update("picl", 3, Some(&r), 1700000000.5);
        let text = board.render(true);
        assert!(
            text.contains("flux_nodes_drained{flux_cluster=\"picl\"} 0"),
            "{text}"
        );
        assert!(text.contains("flux_nodes_draining{flux_cluster=\"picl\"} 1"));
        assert!(text.contains(",state=\"draining\"} 1"));
        r.draining = false;
        // a rank nothing said is up or down: no online series, counted apart
        board.update("picl", 5, Some(&RankState::new(5)), 1700000000.5);
        let text = board.render(true);
        assert!(
            text.contains("flux_nodes_liveness_unknown{flux_cluster=\"picl\"} 1"),
            "{text}"
        );
        assert!(text.contains("flux_nodes_offline{flux_cluster=\"picl\"} 0"));
        assert!(
            !text.contains("flux_node_online{flux_cluster=\"picl\",node=\"rank5\",rank=\"5\"}")
        );
        assert!(
            text.contains("flux_node_torpid{flux_cluster=\"picl\",node=\"rank5\",rank=\"5\"} 0")
        );
        board.update("picl", 5, None, 1700000000.5);
        assert!(text.contains("flux_instance_up{flux_cluster=\"picl\"} 1"));
        board.set_instance_down("picl", true);
        assert!(
            board
                .render(true)
                .contains("flux_instance_up{flux_cluster=\"picl\"} 0")
        );
        board.set_instance_down("picl", false);
        assert!(text.contains("flux_node_drain_timestamp_seconds{flux_cluster=\"picl\",node=\"node3\",rank=\"3\"} 1700000000.5"));
        // undrained: the drain series disappear, the count goes to 0
        r.drained = false;
        r.drain_reason = None;
        r.drain_timestamp = None;
        board.update("picl", 3, Some(&r), 1700000100.5);
        let text = board.render(true);
        assert!(text.contains(
            "flux_node_drained_seconds_total{flux_cluster=\"picl\",node=\"node3\",rank=\"3\"} 100\n"
        ), "{text}");
        // offline from t+200: the open interval counts up to the newest event
        r.online = Some(false);
        board.update("picl", 3, Some(&r), 1700000200.5);
        let mut r4 = RankState::new(4);
        r4.online = Some(true);
        board.update("picl", 4, Some(&r4), 1700000260.5);
        let text = board.render(true);
        assert!(text.contains(
            "flux_node_offline_seconds_total{flux_cluster=\"picl\",node=\"node3\",rank=\"3\"} 60\n"
        ), "{text}");
        assert!(!text.contains("flux_node_drain_info{"));
        assert!(text.contains("flux_nodes_drained{flux_cluster=\"picl\"} 0"));
        assert!(
            text.contains("flux_node_online{flux_cluster=\"picl\",node=\"node3\",rank=\"3\"} 0")
        );
    }

    #[test]
    fn node_seconds_count_up_to_the_clusters_clock() {
        let board = NodeBoard::default();
        let mut r = RankState::new(1);
        r.hostname = Some("n1".into());
        r.drained = true;
        board.update("c", 1, Some(&r), 1000.0);
        let series = |text: &str| {
            text.lines()
                .find(|l| l.starts_with("flux_node_drained_seconds_total{"))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        };
        // Without a clock: up to the newest resource event.
        assert_eq!(series(&board.render(true)), Some(0.0));
        // The event clock: job events of the cluster moved it on.
        let shared = crate::keyed::alerts::SharedEventClock::default();
        let mut local = crate::keyed::alerts::EventClock::default();
        local.advance("c", 1060.0);
        shared.sync(&mut local);
        board.set_clock(crate::keyed::alerts::Clock::Event, shared.clone());
        assert_eq!(series(&board.render(true)), Some(60.0));
        // The wall clock: up to now.
        board.set_clock(crate::keyed::alerts::Clock::Wall, shared);
        assert!(
            series(&board.render(true)).unwrap() > crate::keyed::alerts::wall_now() - 1000.0 - 5.0
        );
    }
}
