//! The status page at `/`: plain HTML rendered on the server (no script),
//! readable on a phone, refreshing itself. Per cluster: its nodes as a
//! grid coloured by state (the drain reason on hover), pending and running
//! counts with the oldest pending job, what fires; and the pipeline's own
//! health. Everything comes from the same questions the API asks.

use crate::channels::query::{Answer, Query, Questions};
use crate::exposition;
use crate::flux::fsd;
use crate::flux::jobid::JobId;
use crate::flux::resource::RankState;
use crate::keyed::alerts::wall_now;
use crate::keyed::query::{AlertPosition, ClusterCounts};
use crate::telemetry::metric;
use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use maud::{DOCTYPE, Markup, html};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// Seconds between the page's own reloads.
const REFRESH_SECS: u32 = 15;
/// Longest the page waits for the shards.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Most firing alerts listed (the rest are counted).
const ALERTS_SHOWN: usize = 50;

#[derive(Clone)]
struct Page {
    questions: Questions,
    metrics: Option<&'static PrometheusHandle>,
}

/// The `/` route.
pub fn routes(questions: Questions, metrics: Option<&'static PrometheusHandle>) -> axum::Router {
    axum::Router::new()
        .route("/", get(page))
        .with_state(Page { questions, metrics })
}

/// What the page shows of one cluster.
#[derive(Default)]
struct Cluster {
    counts: ClusterCounts,
    ranks: Vec<RankState>,
    /// The oldest firing alerts, with their places.
    alerts: Vec<(AlertPosition, Value)>,
    /// How many fire in all.
    firing: usize,
}

async fn page(State(page): State<Page>) -> Response {
    let asked = async {
        let q = &page.questions;
        let mut by_cluster: BTreeMap<String, Cluster> = BTreeMap::new();
        for answer in q.ask(&Query::Clusters).await? {
            if let Answer::Clusters(counts) = answer {
                for (name, c) in counts {
                    by_cluster.entry(name).or_default().counts.merge(&c);
                }
            }
        }
        for answer in q.ask(&Query::Nodes { cluster: None }).await? {
            if let Answer::Nodes(ranks) = answer {
                for (name, r) in ranks {
                    by_cluster.entry(name).or_default().ranks.push(r);
                }
            }
        }
        // Each cluster's oldest few: only those are rendered.
        for (name, c) in by_cluster.iter_mut() {
            let query = Query::Alerts {
                cluster: Some(name.clone()),
                after: None,
                limit: ALERTS_SHOWN,
            };
            for answer in q.ask(&query).await? {
                if let Answer::Alerts(page, total) = answer {
                    c.alerts.extend(page);
                    c.firing += total;
                }
            }
        }
        Ok::<_, crate::channels::query::Unavailable>(by_cluster)
    };
    let mut by_cluster = match tokio::time::timeout(ANSWER_TIMEOUT, asked).await {
        Ok(Ok(answers)) => answers,
        Ok(Err(e)) => return unavailable(&e.to_string()),
        Err(_) => return unavailable("the shards did not answer in time (busy)"),
    };
    for c in by_cluster.values_mut() {
        c.ranks.sort_by_key(|r| r.rank);
        c.alerts.sort_by(|a, b| a.0.cmp(&b.0));
        c.alerts.truncate(ALERTS_SHOWN);
    }
    let metrics = page.metrics.map(|h| h.render()).unwrap_or_default();
    Html(render(&by_cluster, &Health::read(&metrics), wall_now()).into_string()).into_response()
}

fn unavailable(why: &str) -> Response {
    let body = html! {
        (DOCTYPE)
        html { head { title { "fluxpipe" } meta http-equiv="refresh" content=(REFRESH_SECS); }
               body { h1 { "fluxpipe" } p { "No answer: " (why) } } }
    };
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        Html(body.into_string()),
    )
        .into_response()
}

/// The pipeline's own figures, read from what `/metrics` shows.
#[derive(Debug, Default, PartialEq)]
struct Health {
    received: f64,
    invalid: f64,
    refused: f64,
    dropped: f64,
    source_lag_bytes: f64,
    kafka_lag: f64,
    last_checkpoint: Option<f64>,
}

impl Health {
    fn read(text: &str) -> Self {
        // A fold from 0: an empty `sum()` of floats is -0.
        let sum = |name| exposition::samples(text, name).fold(0.0, |a, b| a + b);
        Health {
            received: sum(metric::FLUXPIPE_EVENTS_RECEIVED_TOTAL),
            invalid: sum(metric::FLUXPIPE_EVENTS_INVALID_TOTAL),
            refused: sum(metric::FLUXPIPE_JOBS_REFUSED_TOTAL),
            dropped: sum(metric::FLUXPIPE_RECORDS_DROPPED_TOTAL),
            source_lag_bytes: sum(metric::FLUXPIPE_SOURCE_LAG_BYTES),
            kafka_lag: sum(metric::FLUXPIPE_KAFKA_CONSUMER_LAG),
            last_checkpoint: exposition::samples(
                text,
                metric::FLUXPIPE_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS,
            )
            .filter(|t| *t > 0.0)
            .reduce(f64::max),
        }
    }
}

/// A rank's colour class and what its tooltip says.
fn rank_look(r: &RankState) -> (&'static str, String) {
    let host = r.name().into_owned();
    let (class, state) = match r.online {
        Some(false) => ("offline", "offline"),
        _ if r.draining => ("draining", "draining"),
        _ if r.drained => ("drained", "drained"),
        _ if r.torpid => ("torpid", "torpid"),
        None => ("unknown", "unknown"),
        Some(true) => ("up", "online"),
    };
    let mut tip = format!("{host} (rank {}): {state}", r.rank);
    if r.drained {
        if class == "offline" {
            tip.push_str(", drained");
        }
        if let Some(reason) = r.drain_reason.as_deref().filter(|s| !s.is_empty()) {
            tip.push_str(": ");
            tip.push_str(reason);
        }
    }
    (class, tip)
}

/// The grid's colours, in the key's order: each node has one.
const KEY: [(&str, &str); 6] = [
    ("up", "online"),
    ("drained", "drained"),
    ("draining", "draining"),
    ("offline", "offline"),
    ("torpid", "torpid"),
    ("unknown", "unknown"),
];

fn ago(now: f64, then: f64) -> String {
    fsd::format((now - then).max(0.0))
}

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:0.8em;color:#222;max-width:70em}
h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.1em;margin:1em 0 .3em}
.grid{display:flex;flex-wrap:wrap;gap:2px;margin:.4em 0}
.n{width:14px;height:14px;border-radius:2px;display:inline-block}
.up{background:#3a3}.drained{background:#e80}.draining{background:#fc3}
.offline{background:#c33}.torpid{background:#a4c}.unknown{background:#bbb}
.key span{margin-right:.8em;white-space:nowrap}
table{border-collapse:collapse;font-size:.9em;max-width:100%}td,th{padding:2px 6px;text-align:left;border-bottom:1px solid #ddd}
td{overflow-wrap:break-word}
summary{cursor:pointer;margin:.3em 0}
.fig{display:inline-block;margin-right:1.2em}.muted{color:#777}
";

fn render(clusters: &BTreeMap<String, Cluster>, health: &Health, now: f64) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta http-equiv="refresh" content=(REFRESH_SECS);
                // No icon to fetch: a browser's request for one would fail.
                link rel="icon" href="data:,";
                title { "fluxpipe: " (clusters.len()) " clusters" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                h1 { "fluxpipe" }
                p.muted { "Refreshes every " (REFRESH_SECS) " s. The same answers as "
                    a href="/api/v1/clusters" { "/api/v1" } " and " a href="/metrics" { "/metrics" } "." }
                section id="health" {
                    h2 { "Pipeline" }
                    span.fig { "events read: " b { (health.received) } }
                    span.fig { "invalid: " b { (health.invalid) } }
                    span.fig { "jobs refused: " b { (health.refused) } }
                    span.fig { "records dropped: " b { (health.dropped) } }
                    span.fig { "lag: " b { (health.source_lag_bytes) " bytes" } }
                    @if health.kafka_lag > 0.0 {
                        span.fig { "kafka lag: " b { (health.kafka_lag) " records" } }
                    }
                    span.fig { "last checkpoint: " b { @match health.last_checkpoint {
                        Some(t) => { (ago(now, t)) " ago" }
                        None => { "none yet" }
                    } } }
                }
                @if clusters.is_empty() {
                    p { "Nothing read yet." }
                }
                @for (name, c) in clusters {
                    (cluster(name, c, now))
                }
            }
        }
    }
}

fn cluster(name: &str, c: &Cluster, now: f64) -> Markup {
    let jobs =
        |states: &[&str]| -> u64 { states.iter().filter_map(|s| c.counts.jobs.get(s)).sum() };
    let pending = jobs(&["NEW", "DEPEND", "PRIORITY", "SCHED"]);
    let running = jobs(&["RUN", "CLEANUP"]);
    let looks: Vec<(&str, String)> = c.ranks.iter().map(rank_look).collect();
    let drained: Vec<&RankState> = c.ranks.iter().filter(|r| r.drained).collect();
    html! {
        section.cluster id={ "cluster-" (name) } {
            h2 { "Cluster " (name) }
            div {
                span.fig { "pending: " b.pending { (pending) } }
                span.fig { "running: " b.running { (running) } }
                @if let Some((id, t)) = c.counts.oldest_pending {
                    span.fig { "oldest pending: " b { (JobId(id).to_f58()) } " for " (ago(now, t)) }
                }
                @if let Some(t) = c.counts.newest_event {
                    span.fig.muted { "newest event " (ago(now, t)) " ago" }
                }
            }
            div.key {
                @for (class, label) in &KEY {
                    @let n = looks.iter().filter(|(c, _)| c == class).count();
                    @if n > 0 || *class != "unknown" {
                        span { span class={ "n " (class) } {} " " (label) " " (n) }
                    }
                }
            }
            div.grid {
                @for (r, (class, tip)) in c.ranks.iter().zip(&looks) {
                    span class={ "n " (class) } title=(tip) data-rank=(r.rank) {}
                }
            }
            @if !drained.is_empty() {
                details.drains {
                    summary { (drained.len()) " drained or draining" }
                    table {
                        tr { th { "node" } th { "state" } th { "since" } th { "reason" } }
                        @for r in &drained {
                            tr {
                                td { (r.name()) }
                                td { (if r.draining { "draining" } else { "drained" })
                                     @if r.online == Some(false) { " (offline)" } }
                                td { @if let Some(t) = r.drain_timestamp { (ago(now, t)) " ago" } }
                                td { (r.drain_reason.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
            @if c.alerts.is_empty() {
                p.muted { "Nothing firing." }
            } @else {
                table.alerts {
                    tr { th { "since" } th { "alert" } }
                    @for (_, a) in &c.alerts {
                        tr.alert data-about=(about(a)) {
                            td { (ago(now, a["since"].as_f64().unwrap_or(now))) }
                            td { b { (a["alertname"].as_str().unwrap_or("")) } ": "
                                (a["annotations"]["summary"].as_str().unwrap_or(""))
                                @if let Some(r) = a["annotations"]["reason"].as_str() { " (" (r) ")" } }
                        }
                    }
                }
                @if c.firing > c.alerts.len() {
                    p.muted { (c.firing - c.alerts.len()) " more: " a href={ "/api/v1/alerts?cluster=" (name) } { "all" } }
                }
            }
        }
    }
}

/// A job's F58 id or a node's name, from an alert record.
fn about(alert: &Value) -> String {
    let labels = &alert["labels"];
    labels["jobid"]
        .as_str()
        .or_else(|| labels["node"].as_str())
        .unwrap_or("")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_is_read_from_the_metrics_text() {
        let text = "fluxpipe_events_received_total{source=\"a\"} 10\n\
                    fluxpipe_events_received_total{source=\"b\"} 5\n\
                    fluxpipe_checkpoint_last_success_timestamp_seconds 1700000000\n";
        let h = Health::read(text);
        assert_eq!(h.received, 15.0);
        assert_eq!(h.last_checkpoint, Some(1_700_000_000.0));
        assert_eq!(Health::read(""), Health::default());
    }

    #[test]
    fn a_drained_rank_says_why_on_hover_and_text_is_escaped() {
        let r = RankState {
            hostname: Some("node3".into()),
            online: Some(true),
            drained: true,
            drain_reason: Some("<bad> fan".into()),
            ..RankState::new(3)
        };
        assert_eq!(
            rank_look(&r),
            ("drained", "node3 (rank 3): drained: <bad> fan".into())
        );
        let mut clusters = BTreeMap::new();
        clusters.insert(
            "c".to_string(),
            Cluster {
                ranks: vec![r],
                ..Cluster::default()
            },
        );
        let page = render(&clusters, &Health::default(), 0.0).into_string();
        assert!(page.contains("&lt;bad&gt; fan"), "{page}");
        assert!(!page.contains("<bad>"));
    }
}
