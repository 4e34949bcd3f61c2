//! The status page at `/`: plain HTML rendered on the server (no script),
//! readable on a phone, refreshing itself. At the top, a banner for each
//! instance that is down. Per cluster: its nodes as a grid coloured by
//! state (the drain reason on hover) with counts as `/metrics` counts
//! them, pending and running counts with the oldest pending job, what
//! fires grouped by rule, most severe first; and the pipeline's own
//! health. `/jobs/{id}` shows one job, `/alerts?cluster=C` every alert
//! that fires. Everything comes from the same questions the API asks.

use super::past::ArchiveReader;
use crate::channels::query::{Answer, Query, Questions};
use crate::flux::fsd;
use crate::flux::idset::IdSet;
use crate::flux::jobid::JobId;
use crate::flux::resource::{NodeCount, RankState};
use crate::keyed::alerts::wall_now;
use crate::keyed::query::JobFilter;
use crate::keyed::query::{AlertPosition, ClusterCounts};
use crate::output::AlertRecord;
use crate::telemetry::exposition;
use crate::telemetry::metric;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query as Params, State};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use maud::{DOCTYPE, Markup, html};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// Seconds between the page's own reloads.
const REFRESH_SECS: u32 = 15;
/// Longest the page waits for the shards.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Most firing alerts listed on the front page (the rest are counted).
const ALERTS_SHOWN: usize = 50;
/// Most firing alerts of a cluster on its alerts page.
const ALERTS_PAGE: usize = 5000;

#[derive(Clone)]
struct Page {
    questions: Questions,
    metrics: Option<&'static PrometheusHandle>,
    archive: ArchiveReader,
}

/// The `/` route.
pub fn routes(
    questions: Questions,
    metrics: Option<&'static PrometheusHandle>,
    archive: ArchiveReader,
) -> axum::Router {
    axum::Router::new()
        .route("/", get(page))
        .route("/jobs/{id}", get(job_page))
        .route("/alerts", get(alerts_page))
        .route("/nodes/{cluster}/{host}", get(node_page))
        .with_state(Page {
            questions,
            metrics,
            archive,
        })
}

/// What the page shows of one cluster.
#[derive(Default)]
struct Cluster {
    counts: ClusterCounts,
    ranks: Vec<RankState>,
    /// The oldest firing alerts, with their places.
    alerts: Vec<(AlertPosition, AlertRecord)>,
    /// How many fire in all.
    firing: usize,
    /// Its queues that are not virtual, with their ranks and the virtual
    /// queues scheduled as part of each (once the forwarder sent the
    /// `[queues]` table).
    queues: Vec<(String, IdSet, Vec<String>)>,
    /// The jobs that finished in the last 24 h, from the archive (none:
    /// the pipeline has none; an error: it cannot be read now).
    last_day: Option<Result<Map<String, Value>, String>>,
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
        for answer in q
            .ask(&Query::Nodes {
                cluster: None,
                queue: None,
            })
            .await?
        {
            if let Answer::Nodes(ranks) = answer {
                for (name, r) in ranks {
                    by_cluster.entry(name).or_default().ranks.push(r);
                }
            }
        }
        for answer in q.ask(&Query::Queues { cluster: None }).await? {
            if let Answer::Queues(tables) = answer {
                for t in tables {
                    let queues = t
                        .slices
                        .into_iter()
                        .map(|(name, ranks)| {
                            // What asking for it takes, less itself.
                            let virtual_of =
                                t.config.expand(&name).skip(1).map(String::from).collect();
                            (name, ranks, virtual_of)
                        })
                        .collect();
                    by_cluster.entry(t.cluster).or_default().queues = queues;
                }
            }
        }
        for name in q.watch_clusters() {
            by_cluster.entry(name).or_default();
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
    if page.archive.configured() {
        let rows = tokio::time::timeout(ANSWER_TIMEOUT, page.archive.usage(24.0, None)).await;
        let rows = match rows {
            Ok(Ok((_, _, rows))) => Ok(rows),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the archive did not answer in time".to_string()),
        };
        for (name, c) in by_cluster.iter_mut() {
            c.last_day = Some(match &rows {
                Ok(rows) => Ok(rows
                    .iter()
                    .find(|r| r.get("cluster").and_then(Value::as_str) == Some(name))
                    .cloned()
                    .unwrap_or_default()),
                Err(e) => Err(e.clone()),
            });
        }
    }
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

/// The key under the grid: each count as `/metrics` counts it (a node
/// may count twice, drained and offline say), with the colour a node of
/// that state has.
const KEY: [(NodeCount, &str); 6] = [
    (NodeCount::Online, "up"),
    (NodeCount::Drained, "drained"),
    (NodeCount::Draining, "draining"),
    (NodeCount::Offline, "offline"),
    (NodeCount::Torpid, "torpid"),
    (NodeCount::Unknown, "unknown"),
];

/// Severities, most urgent first; others after them.
fn severity_rank(severity: &str) -> usize {
    ["critical", "error", "warning", "info"]
        .iter()
        .position(|s| *s == severity)
        .unwrap_or(4)
}

/// Alerts grouped by rule, the most severe rules first: (severity,
/// rule, its alerts).
fn by_rule<'a>(
    alerts: impl IntoIterator<Item = &'a AlertRecord>,
) -> Vec<(String, String, Vec<&'a AlertRecord>)> {
    let mut groups: BTreeMap<(usize, String, String), Vec<&AlertRecord>> = BTreeMap::new();
    for a in alerts {
        let (severity, rule) = (a.severity.clone(), a.alertname.clone());
        groups
            .entry((severity_rank(&severity), severity, rule))
            .or_default()
            .push(a);
    }
    groups
        .into_iter()
        .map(|((_, severity, rule), list)| (severity, rule, list))
        .collect()
}

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
.banner{background:#c33;color:#fff;padding:.5em .8em;margin:.4em 0;border-radius:3px;font-weight:bold}
.sev{display:inline-block;min-width:5em;font-weight:bold}.sev-critical{color:#c33}.sev-warning{color:#b60}
th.group{background:#f3f3f3}
";

/// The head of every page: its title, the style, and (the front page)
/// its own reloads.
fn head(title: &str, reloads: bool) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            @if reloads {
                meta http-equiv="refresh" content=(REFRESH_SECS);
            }
            // No icon to fetch: a browser's request for one would fail.
            link rel="icon" href="data:,";
            title { "fluxpipe: " (title) }
            style { (maud::PreEscaped(STYLE)) }
        }
    }
}

fn render(clusters: &BTreeMap<String, Cluster>, health: &Health, now: f64) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(&format!("{} clusters", clusters.len()), true))
            body {
                @for (name, c) in clusters {
                    @if let Some(t) = c.counts.instance_down_since {
                        div.banner.down id={ "down-" (name) } {
                            "The Flux instance of cluster " (name) " is down, since "
                            (ago(now, t)) " ago: no job runs and no node is watched there."
                        }
                    }
                }
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
                    span.fig { "oldest pending: " b { (job_link(name, &JobId(id).to_f58())) } " for " (ago(now, t)) }
                }
                @if let Some(t) = c.counts.newest_event {
                    span.fig.muted { "newest event " (ago(now, t)) " ago" }
                }
            }
            @if let Some(last_day) = &c.last_day {
                (last_day_strip(last_day))
            }
            div.key {
                @for (count, class) in &KEY {
                    @let n = c.ranks.iter().filter(|r| count.holds(r)).count();
                    @if n > 0 || *count != NodeCount::Unknown {
                        span data-count=(count.as_str()) { span class={ "n " (class) } {} " " (count.as_str()) " " (n) }
                    }
                }
            }
            @for (queue, ranks, virtual_of) in &c.queues {
                @let held: Vec<&RankState> = c.ranks.iter().filter(|r| ranks.contains(r.rank)).collect();
                div.queue data-queue=(queue) {
                    "queue " b { (queue) }
                    @if !virtual_of.is_empty() { span.muted { " (and " (virtual_of.join(", ")) ")" } }
                    ": " (held.len()) " nodes"
                    @for (count, _) in &KEY {
                        @let n = held.iter().filter(|r| count.holds(r)).count();
                        @if n > 0 { ", " (count.as_str()) " " (n) }
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
                                td { a href={ "/nodes/" (encode(name)) "/" (encode(&r.name())) } { (r.name()) } }
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
                (alert_table(name, c.alerts.iter().map(|(_, a)| a), now))
                @if c.firing > c.alerts.len() {
                    p.muted { (c.firing - c.alerts.len()) " more: "
                        a href={ "/alerts?cluster=" (encode(name)) } { "all " (c.firing) " firing" } }
                }
            }
        }
    }
}

/// The last 24 h of a cluster, from the archive: jobs finished by result,
/// core-hours, waits.
fn last_day_strip(last_day: &Result<Map<String, Value>, String>) -> Markup {
    let row = match last_day {
        Ok(row) => row,
        Err(why) => return html! { div.usage.muted { "last 24 h: " (why) } },
    };
    let n = |k: &str| row.get(k).and_then(Value::as_u64).unwrap_or(0);
    let seconds = |k: &str| row.get(k).and_then(Value::as_f64).map(fsd::format);
    let hours = row.get("core_hours").and_then(Value::as_f64).unwrap_or(0.0);
    html! {
        div.usage data-jobs=(n("jobs")) data-completed=(n("completed")) data-failed=(n("failed"))
            data-canceled=(n("canceled")) data-timeout=(n("timeout")) data-core-hours=(hours) {
            "last 24 h: " b { (n("jobs")) } " jobs finished"
            @if n("jobs") > 0 {
                " (" (n("completed")) " completed, " (n("failed")) " failed, "
                (n("canceled")) " canceled, " (n("timeout")) " timed out), "
                b { (format!("{hours:.1}")) } " core-hours"
                @if let (Some(p50), Some(p90)) = (seconds("wait_p50_s"), seconds("wait_p90_s")) {
                    ", wait p50 " b { (p50) } ", p90 " b { (p90) }
                }
            }
        }
    }
}

/// `/nodes/{cluster}/{host}`: a node's state changes, from the archive.
async fn node_page(
    State(page): State<Page>,
    Path((cluster, host)): Path<(String, String)>,
) -> Response {
    let events = page.archive.node_history(&cluster, &host, 200).await;
    let when = |t: f64| {
        jiff::Timestamp::from_microsecond((t * 1e6) as i64)
            .map(|ts| ts.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_default()
    };
    let state = |e: &Value| {
        let flag = |k: &str| e.get(k).and_then(Value::as_bool);
        let mut words = Vec::new();
        match flag("online") {
            Some(true) => words.push("online"),
            Some(false) => words.push("offline"),
            None => {}
        }
        if flag("draining") == Some(true) {
            words.push("draining");
        } else if flag("drained") == Some(true) {
            words.push("drained");
        }
        if flag("torpid") == Some(true) {
            words.push("torpid");
        }
        words.join(", ")
    };
    let body = html! {
        (DOCTYPE)
        html lang="en" {
            (head(&format!("{host} of {cluster}"), false))
            body {
                p { a href="/" { "all clusters" } }
                h1 { "Node " (host) " of cluster " (cluster) }
                @match &events {
                    Err(e) => p.muted { "No history: " (e) },
                    Ok(events) if events.is_empty() => p.muted { "The archive holds no change of this node." },
                    Ok(events) => {
                        p.muted { "Its state changes as the archive keeps them, newest last." }
                        table.history {
                            tr { th { "time" } th { "event" } th { "state after" } th { "drain reason" } }
                            @for e in events {
                                tr data-event=(e.get("event").and_then(Value::as_str).unwrap_or("")) {
                                    td { (e.get("timestamp").and_then(Value::as_f64).map(when).unwrap_or_default()) }
                                    td { (e.get("event").and_then(Value::as_str).unwrap_or("")) }
                                    td { (state(e)) }
                                    td { (e.get("drain_reason").and_then(Value::as_str).unwrap_or("")) }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Html(body.into_string()).into_response()
}

/// What fires, grouped by rule, the most severe first, with counts.
fn alert_table<'a>(
    cluster: &str,
    alerts: impl IntoIterator<Item = &'a AlertRecord>,
    now: f64,
) -> Markup {
    html! {
        table.alerts {
            @for (severity, rule, list) in by_rule(alerts) {
                tr.group data-rule=(rule) {
                    th.group colspan="2" {
                        span class={ "sev sev-" (severity) } { (severity) } " "
                        (rule) " " span.count { "(" (list.len()) ")" }
                    }
                }
                @for a in list {
                    tr.alert data-about=(about(a)) {
                        td { (ago(now, a.since)) }
                        td {
                            @if let Some(job) = a.labels.get("jobid") {
                                (job_link(cluster, job)) ": "
                            }
                            (a.annotations.get("summary").map_or("", String::as_str))
                            @if let Some(r) = a.annotations.get("reason") { " (" (r) ")" }
                        }
                    }
                }
            }
        }
    }
}

/// A query string's value.
fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A link to a job's page.
fn job_link(cluster: &str, f58: &str) -> Markup {
    html! { a.job href={ "/jobs/" (encode(f58)) "?cluster=" (encode(cluster)) } { (f58) } }
}

#[derive(serde::Deserialize)]
struct ClusterParam {
    cluster: Option<String>,
}

/// A page of its own, in the front page's style.
fn page_of(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title, false))
            body {
                p { a href="/" { "fluxpipe" } }
                h1 { (title) }
                (body)
            }
        }
    }
}

/// `/jobs/{id}?cluster=C`: one job as the query API holds it.
async fn job_page(
    State(page): State<Page>,
    Path(id): Path<String>,
    params: Result<Params<ClusterParam>, QueryRejection>,
) -> Response {
    let Ok(job) = JobId::parse(&id) else {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            Html(
                page_of("no such job", html! { p { "`" (id) "` is not a job id." } }).into_string(),
            ),
        )
            .into_response();
    };
    let cluster = params.ok().and_then(|Params(p)| p.cluster);
    let query = Query::Jobs {
        filter: JobFilter {
            cluster: cluster.clone(),
            id: Some(job),
            ..JobFilter::default()
        },
        after: None,
        limit: 2,
    };
    let answers = match tokio::time::timeout(ANSWER_TIMEOUT, page.questions.ask(&query)).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return unavailable(&e.to_string()),
        Err(_) => return unavailable("the shards did not answer in time (busy)"),
    };
    let found: Vec<Value> = answers
        .into_iter()
        .filter_map(|a| match a {
            Answer::Jobs(list, _) => Some(list),
            _ => None,
        })
        .flatten()
        .filter_map(|(_, j)| serde_json::to_value(&j).ok())
        .collect();
    let title = format!("job {}", job.to_f58());
    let body = match found.as_slice() {
        [] => html! { p { "No job " (job.to_f58()) " is held (it may have ended and been dropped: "
        code { "fluxpipe history" } " has it if a database sink keeps jobs)." } },
        [one] => fields(one),
        many => html! {
            p { "Job " (job.to_f58()) " is held in several clusters:" }
            ul { @for j in many {
                @let c = j["cluster"].as_str().unwrap_or("");
                li { (job_link(c, &job.to_f58())) " in " (c) }
            } }
        },
    };
    Html(page_of(&title, body).into_string()).into_response()
}

/// A job record as a table of its fields.
fn fields(record: &Value) -> Markup {
    html! {
        table.job {
            @if let Some(map) = record.as_object() {
                @for (k, v) in map {
                    tr { th { (k) } td { @match v {
                        Value::String(s) => { (s) }
                        Value::Null => { span.muted { "-" } }
                        other => { code { (other.to_string()) } }
                    } } }
                }
            }
        }
    }
}

/// `/alerts?cluster=C`: every alert firing in a cluster (the first
/// [`ALERTS_PAGE`]), grouped by rule.
async fn alerts_page(
    State(page): State<Page>,
    params: Result<Params<ClusterParam>, QueryRejection>,
) -> Response {
    let cluster = params.ok().and_then(|Params(p)| p.cluster);
    let query = Query::Alerts {
        cluster: cluster.clone(),
        after: None,
        limit: ALERTS_PAGE,
    };
    let answers = match tokio::time::timeout(ANSWER_TIMEOUT, page.questions.ask(&query)).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return unavailable(&e.to_string()),
        Err(_) => return unavailable("the shards did not answer in time (busy)"),
    };
    let mut all: Vec<(AlertPosition, AlertRecord)> = Vec::new();
    let mut total = 0;
    for answer in answers {
        if let Answer::Alerts(list, n) = answer {
            all.extend(list);
            total += n;
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all.truncate(ALERTS_PAGE);
    let name = cluster.as_deref().unwrap_or("every cluster");
    let now = wall_now();
    let by_cluster = |a: &AlertRecord| a.cluster.clone();
    let body = html! {
        p.muted { (total) " firing" @if total > all.len() { ", the oldest " (all.len()) " shown" } "." }
        @if all.is_empty() { p.muted { "Nothing firing." } }
        @else {
            @let first = all.first().map(|(_, a)| by_cluster(a)).unwrap_or_default();
            (alert_table(cluster.as_deref().unwrap_or(&first), all.iter().map(|(_, a)| a), now))
        }
    };
    Html(page_of(&format!("alerts of {name}"), body).into_string()).into_response()
}

/// A job's F58 id, a node's name or a silent feed's source, from an
/// alert record.
fn about(alert: &AlertRecord) -> String {
    let labels = &alert.labels;
    ["jobid", "node", "source"]
        .iter()
        .find_map(|k| labels.get(*k))
        .cloned()
        .unwrap_or_default()
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
