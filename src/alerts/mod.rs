//! Alerts on stuck jobs and sick nodes: the rules ([`rule`]), the engine
//! that times them ([`engine`]), and the glue that feeds the engine from
//! the keyed state after each record. Pure: no I/O; the caller owns the
//! clock (wall time, or the newest event time per cluster).

pub mod engine;
pub mod rule;

use crate::flux::resource::RankChange;
use crate::state::{JobKey, State};
use engine::{AlertEvent, Detail, Engine, Holds, NodeKey, Subject};
use rule::{job_condition, node_condition};

/// Which clock alert durations are measured against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// The wall clock: for live streams.
    #[default]
    Wall,
    /// The newest event timestamp seen per cluster: replaying old logs
    /// tells which alerts would have fired.
    Event,
}

/// Tell the engine where a job stands now. `at` is the time of the record
/// just applied.
pub fn observe_job(
    engine: &mut Engine,
    state: &State,
    key: &JobKey,
    at: f64,
    lag: f64,
    out: &mut Vec<AlertEvent>,
) {
    let entry = state.jobs.get(key);
    let holds: Vec<(usize, Holds)> = engine
        .rules_for(true)
        .map(|(i, rule)| {
            let h = entry.and_then(|e| {
                job_condition(rule.kind, e).map(|since| (since, Detail::State(e.job.state)))
            });
            (i, h)
        })
        .collect();
    if !holds.is_empty() {
        engine.observe_job(key, &holds, at, lag, out);
    }
}

/// Tell the engine where a changed rank stands now.
pub fn observe_rank(
    engine: &mut Engine,
    cluster: &str,
    change: &RankChange,
    at: f64,
    lag: f64,
    out: &mut Vec<AlertEvent>,
) {
    let key = NodeKey {
        cluster: cluster.to_string(),
        rank: change.rank,
    };
    let Some(rank) = &change.after else {
        engine.forget(&Subject::Node(key), at, out);
        return;
    };
    let holds: Vec<(usize, Holds)> = engine
        .rules_for(false)
        .map(|(i, rule)| {
            let h = node_condition(rule.kind, rank)
                .map(|since| (since.unwrap_or(at), Detail::Host(rank.hostname.clone())));
            (i, h)
        })
        .collect();
    if !holds.is_empty() {
        engine.observe_node(&key, &holds, at, lag, out);
    }
}

/// Wall-clock time in seconds since the epoch.
pub fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
