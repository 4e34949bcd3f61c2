//! `fluxpipe top`: a live view of running pipelines in the terminal, as
//! `vector top` gives: per source and sink, records per second, totals,
//! lag and buffers; per cluster, jobs per state and nodes; what fires;
//! the checkpoint's age. From each pipeline's `/metrics` and query API,
//! asked every `--interval`; `--once` prints one frame as text (rates over
//! one interval) and exits, for scripts and for terminals that are not.

use super::ask::{Client, Servers};
use crate::output::AlertRecord;
use crate::telemetry::exposition::{Sample, parse_samples};
use crate::telemetry::metric;
use anyhow::Result;
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Seconds between two looks.
    #[arg(long, default_value_t = 2.0, value_parser = parse_interval)]
    pub interval: f64,
    /// Print one frame as text and exit (rates over one interval).
    #[arg(long)]
    pub once: bool,
    #[command(flatten)]
    pub servers: Servers,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds above 0")),
    }
}

/// What one pipeline showed at one look.
#[derive(Debug, Default, Clone)]
pub struct Look {
    pub url: String,
    pub metrics: BTreeMap<String, Vec<Sample>>,
    pub clusters: Vec<Value>,
    pub alerts: Vec<AlertRecord>,
    /// Alert records of the answer that did not read (of another
    /// version): said in the list, so it never hides what it leaves out.
    pub unreadable_alerts: usize,
    pub firing: u64,
    /// Why it could not be read, if it could not.
    pub error: Option<String>,
}

/// One table of the view.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: String,
    pub headings: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

/// Everything one frame shows.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub header: Vec<String>,
    pub panels: Vec<Panel>,
}

const STATES: [&str; 7] = [
    "NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP", "INACTIVE",
];

fn sum(look: &Look, name: &str, key: &str, value: &str) -> f64 {
    look.metrics
        .get(name)
        .into_iter()
        .flatten()
        .filter(|s| s.label(key) == Some(value))
        .map(|s| s.value)
        .sum()
}

fn one(look: &Look, name: &str) -> Option<f64> {
    look.metrics.get(name)?.first().map(|s| s.value)
}

/// The values of label `key` across the series of `names`, sorted.
fn names(look: &Look, key: &str, families: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = families
        .iter()
        .flat_map(|f| look.metrics.get(*f).into_iter().flatten())
        .filter_map(|s| s.label(key).map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn rate(now: f64, before: Option<f64>, secs: f64) -> String {
    match before {
        Some(b) if secs > 0.0 && now >= b => format!("{:.0}", (now - b) / secs),
        _ => "-".to_string(),
    }
}

fn count(v: f64) -> String {
    // + 0.0: an empty sum is -0.0.
    format!("{:.0}", v + 0.0)
}

/// How long since `then`, in whole seconds under a minute, else as Flux
/// says durations (`5.5m`, `2h`).
fn ago(now: f64, then: f64) -> String {
    let secs = (now - then).max(0.0);
    if secs < 60.0 {
        format!("{secs:.0}s")
    } else {
        crate::flux::fsd::format(secs)
    }
}

/// The frame for looks `now`, with rates against `before` (the looks
/// `secs` earlier, in the same order), at wall time `wall`.
pub fn view(before: Option<&[Look]>, now: &[Look], secs: f64, wall: f64) -> View {
    let several = now.len() > 1;
    let mut header = Vec::new();
    let mut sources = Vec::new();
    let mut sinks = Vec::new();
    let mut clusters = Vec::new();
    let mut alerts = Vec::new();
    for (i, look) in now.iter().enumerate() {
        let prev = before.and_then(|b| b.get(i)).filter(|p| p.error.is_none());
        if let Some(e) = &look.error {
            header.push(format!("{}: {e}", look.url));
            continue;
        }
        let build = look
            .metrics
            .get(metric::FLUXPIPE_BUILD_INFO)
            .and_then(|v| v.first())
            .map(|s| {
                format!(
                    "fluxpipe {} ({})",
                    s.label("version").unwrap_or("?"),
                    s.label("commit").unwrap_or("?")
                )
            })
            .unwrap_or_else(|| "fluxpipe".to_string());
        let up = one(look, "process_start_time_seconds")
            .map_or_else(|| "-".to_string(), |t| ago(wall, t));
        let checkpoint = one(
            look,
            metric::FLUXPIPE_CHECKPOINT_LAST_SUCCESS_TIMESTAMP_SECONDS,
        )
        .map_or_else(
            || "none yet".to_string(),
            |t| format!("{} ago", ago(wall, t)),
        );
        let memory = one(look, "process_resident_memory_bytes")
            .map_or_else(|| "-".to_string(), |b| format!("{:.0} MiB", b / 1048576.0));
        header.push(format!(
            "{} at {}: up {up}, checkpoint {checkpoint}, {memory} resident, {} firing",
            build, look.url, look.firing
        ));
        let tag = |name: &str| {
            if several {
                format!("{} {name}", look.url)
            } else {
                name.to_string()
            }
        };

        for source in names(
            look,
            "source",
            &[
                metric::FLUXPIPE_EVENTS_RECEIVED_TOTAL,
                metric::FLUXPIPE_SOURCE_LAG_BYTES,
                metric::FLUXPIPE_SOCKET_CONNECTIONS,
            ],
        ) {
            let received = sum(
                look,
                metric::FLUXPIPE_EVENTS_RECEIVED_TOTAL,
                "source",
                &source,
            );
            let before =
                prev.map(|p| sum(p, metric::FLUXPIPE_EVENTS_RECEIVED_TOTAL, "source", &source));
            let lag_bytes = sum(look, metric::FLUXPIPE_SOURCE_LAG_BYTES, "source", &source);
            let lag_msgs = sum(look, metric::FLUXPIPE_KAFKA_CONSUMER_LAG, "source", &source);
            let lag = if lag_msgs > 0.0 {
                format!("{lag_msgs:.0} msgs")
            } else {
                format!("{lag_bytes:.0} B")
            };
            sources.push(vec![
                tag(&source),
                rate(received, before, secs),
                count(received),
                count(sum(
                    look,
                    metric::FLUXPIPE_EVENTS_INVALID_TOTAL,
                    "source",
                    &source,
                )),
                lag,
                count(sum(
                    look,
                    metric::FLUXPIPE_SOCKET_CONNECTIONS,
                    "source",
                    &source,
                )),
            ]);
        }

        for sink in names(
            look,
            "sink",
            &[
                metric::FLUXPIPE_RECORDS_SENT_TOTAL,
                "fluxpipe_sink_buffered_records",
            ],
        ) {
            let sent = sum(look, metric::FLUXPIPE_RECORDS_SENT_TOTAL, "sink", &sink);
            let before = prev.map(|p| sum(p, metric::FLUXPIPE_RECORDS_SENT_TOTAL, "sink", &sink));
            sinks.push(vec![
                tag(&sink),
                rate(sent, before, secs),
                count(sent),
                count(sum(look, "fluxpipe_sink_buffered_records", "sink", &sink)),
                count(sum(look, metric::FLUXPIPE_SINK_ERRORS_TOTAL, "sink", &sink)),
                count(sum(
                    look,
                    metric::FLUXPIPE_RECORDS_DROPPED_TOTAL,
                    "sink",
                    &sink,
                )),
            ]);
        }

        for c in &look.clusters {
            let name = c["cluster"].as_str().unwrap_or("?");
            let mut row = vec![tag(name)];
            for s in STATES {
                row.push(count(c["jobs"][s].as_f64().unwrap_or(0.0)));
            }
            for n in ["online", "offline", "drained", "draining"] {
                row.push(count(c["nodes"][n].as_f64().unwrap_or(0.0)));
            }
            row.push(
                c["newest_event"]
                    .as_f64()
                    .map_or_else(|| "-".to_string(), |t| format!("{} ago", ago(wall, t))),
            );
            clusters.push(row);
        }

        for a in &look.alerts {
            let subject = a.labels.get("jobid").or(a.labels.get("node"));
            alerts.push(vec![
                a.alertname.clone(),
                tag(&a.cluster),
                subject.cloned().unwrap_or_default(),
                ago(wall, a.since),
                a.annotations.get("summary").cloned().unwrap_or_default(),
            ]);
        }
        if look.unreadable_alerts > 0 {
            alerts.push(vec![
                "?".into(),
                String::new(),
                String::new(),
                String::new(),
                format!(
                    "{} alert record(s) from {} not read (another version?)",
                    look.unreadable_alerts, look.url
                ),
            ]);
        }
    }
    View {
        header,
        panels: vec![
            Panel {
                title: "Sources".into(),
                headings: vec![
                    "SOURCE",
                    "EVENTS/S",
                    "EVENTS",
                    "INVALID",
                    "LAG",
                    "CONNECTIONS",
                ],
                rows: sources,
            },
            Panel {
                title: "Sinks".into(),
                headings: vec![
                    "SINK",
                    "RECORDS/S",
                    "RECORDS",
                    "BUFFERED",
                    "ERRORS",
                    "DROPPED",
                ],
                rows: sinks,
            },
            Panel {
                title: "Clusters: jobs per state, nodes".into(),
                headings: vec![
                    "CLUSTER", "NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP", "INACTIVE",
                    "ONLINE", "OFFLINE", "DRAINED", "DRAINING", "NEWEST",
                ],
                rows: clusters,
            },
            Panel {
                title: "Firing".into(),
                headings: vec!["ALERT", "CLUSTER", "JOB/NODE", "FOR", "SUMMARY"],
                rows: alerts,
            },
        ],
    }
}

/// The frame as plain text: each panel a titled table, columns padded.
pub fn text(view: &View) -> String {
    let mut out = String::new();
    for h in &view.header {
        out.push_str(h);
        out.push('\n');
    }
    for p in &view.panels {
        out.push('\n');
        out.push_str(&p.title);
        out.push('\n');
        let mut widths: Vec<usize> = p.headings.iter().map(|h| h.chars().count()).collect();
        for r in &p.rows {
            for (w, v) in widths.iter_mut().zip(r) {
                *w = (*w).max(v.chars().count());
            }
        }
        let mut line = |cells: Vec<&str>| {
            let mut l = String::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    l.push_str(c);
                } else {
                    l.push_str(&format!("{c:<w$} "));
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(p.headings.clone());
        for r in &p.rows {
            line(r.iter().map(String::as_str).collect());
        }
    }
    out
}

fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Look at every pipeline once.
fn look(client: &Client) -> Vec<Look> {
    let metrics = client.get_text_each("/metrics");
    let clusters = client.get_text_each("/api/v1/clusters");
    let alerts = client.get_text_each("/api/v1/alerts?limit=50");
    client
        .urls()
        .iter()
        .zip(metrics)
        .zip(clusters.into_iter().zip(alerts))
        .map(|((url, m), (c, a))| {
            let mut look = Look {
                url: url.clone(),
                ..Look::default()
            };
            match m {
                Ok(text) => look.metrics = parse_samples(&text),
                Err(e) => look.error = Some(format!("{e:#}")),
            }
            if let Ok(v) = c.and_then(|t| Ok(serde_json::from_str::<Value>(&t)?)) {
                look.clusters = v["clusters"].as_array().cloned().unwrap_or_default();
            }
            if let Ok(v) = a.and_then(|t| Ok(serde_json::from_str::<Value>(&t)?)) {
                (look.alerts, look.unreadable_alerts) = alert_records(&v["alerts"]);
                look.firing = v["firing"].as_u64().unwrap_or(0);
            }
            look
        })
        .collect()
}

pub fn run(args: TopArgs) -> Result<ExitCode> {
    let client = Client::new(&args.servers)?;
    let interval = Duration::from_secs_f64(args.interval.clamp(0.1, 3600.0));
    if args.once {
        let first = look(&client);
        let t0 = Instant::now();
        std::thread::sleep(interval);
        let second = look(&client);
        let frame = view(
            Some(&first),
            &second,
            t0.elapsed().as_secs_f64(),
            wall_now(),
        );
        print!("{}", text(&frame));
        let failed = second.iter().all(|l| l.error.is_some());
        return Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        });
    }
    let mut terminal = ratatui::init();
    let result = live(&client, interval, &mut terminal);
    ratatui::restore();
    result.map(|()| ExitCode::SUCCESS)
}

fn live(
    client: &Client,
    interval: Duration,
    terminal: &mut ratatui::DefaultTerminal,
) -> Result<()> {
    let mut before: Option<(Vec<Look>, Instant)> = None;
    loop {
        let now = look(client);
        let at = Instant::now();
        let frame = view(
            before.as_ref().map(|(l, _)| l.as_slice()),
            &now,
            before
                .as_ref()
                .map_or(0.0, |(_, t)| at.duration_since(*t).as_secs_f64()),
            wall_now(),
        );
        terminal.draw(|f| draw(f, &frame))?;
        before = Some((now, at));
        // Keys until the next look: q, Esc or Ctrl-C leave.
        let next = at + interval;
        while let Some(left) = next.checked_duration_since(Instant::now()) {
            if event::poll(left)?
                && let Event::Key(k) = event::read()?
                && k.kind == KeyEventKind::Press
                && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                    || (k.code == KeyCode::Char('c')
                        && k.modifiers.contains(KeyModifiers::CONTROL)))
            {
                return Ok(());
            }
        }
    }
}

fn draw(f: &mut ratatui::Frame, view: &View) {
    let mut heights = vec![Constraint::Length(view.header.len() as u16 + 1)];
    heights.extend(
        view.panels
            .iter()
            .map(|p| Constraint::Min(p.rows.len().min(20) as u16 + 3)),
    );
    let areas = Layout::vertical(heights).split(f.area());
    let mut header: Vec<Line> = view.header.iter().map(|h| Line::from(h.as_str())).collect();
    header.push(Line::from("q: quit"));
    f.render_widget(Paragraph::new(header), areas[0]);
    for (p, area) in view.panels.iter().zip(areas.iter().skip(1)) {
        let widths: Vec<Constraint> = p
            .headings
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let longest = p
                    .rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|v| v.chars().count())
                    .max()
                    .unwrap_or(0)
                    .max(h.len());
                Constraint::Length(longest as u16)
            })
            .collect();
        let table = Table::new(
            p.rows
                .iter()
                .map(|r| Row::new(r.iter().map(String::as_str))),
            widths,
        )
        .header(
            Row::new(p.headings.iter().copied())
                .style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(p.title.as_str()),
        );
        f.render_widget(table, *area);
    }
}

/// The alert records of an answer of `/api/v1/alerts`, and how many did
/// not read as one (of another version): those are left out, not the rest.
fn alert_records(alerts: &Value) -> (Vec<AlertRecord>, usize) {
    let list = alerts.as_array().map_or(&[][..], Vec::as_slice);
    let read: Vec<AlertRecord> = list
        .iter()
        .filter_map(|a| AlertRecord::deserialize(a).ok())
        .collect();
    let unreadable = list.len() - read.len();
    (read, unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn look_of(metrics: &str, clusters: Value, alerts: Value) -> Look {
        let (alerts, unreadable_alerts) = alert_records(&alerts);
        Look {
            url: "http://a".into(),
            metrics: parse_samples(metrics),
            clusters: clusters.as_array().cloned().unwrap_or_default(),
            alerts,
            unreadable_alerts,
            firing: 1,
            error: None,
        }
    }

    #[test]
    fn a_frame_has_rates_totals_clusters_and_alerts() {
        let before = look_of(
            "fluxpipe_events_received_total{source=\"s\"} 100\nfluxpipe_records_sent_total{sink=\"out\"} 10\n",
            json!([]),
            json!([]),
        );
        let now = look_of(
            "fluxpipe_build_info{version=\"0.1.0\",commit=\"abc\"} 1\n\
             process_start_time_seconds 1000\n\
             fluxpipe_checkpoint_last_success_timestamp_seconds 1990\n\
             fluxpipe_events_received_total{source=\"s\"} 300\n\
             fluxpipe_source_lag_bytes{source=\"s\"} 0\n\
             fluxpipe_records_sent_total{sink=\"out\"} 30\n\
             fluxpipe_sink_buffered_records{sink=\"out\"} 4\n",
            json!([{"cluster": "picl", "jobs": {"RUN": 3, "SCHED": 2}, "nodes": {"online": 4, "drained": 1}, "newest_event": 1995.0}]),
            json!([{"alertname": "node_drained", "cluster": "picl", "labels": {"node": "n3"}, "since": 1900.0,
                "annotations": {"summary": "drained"}, "ends_at": null, "kind": "alert", "record_id": "x",
                "rule_kind": "node_drained", "severity": "warning", "starts_at": "", "status": "firing"},
                {"alertname": "of another version"}]),
        );
        let v = view(Some(&[before]), &[now], 2.0, 2000.0);
        assert!(
            v.header[0].contains("fluxpipe 0.1.0 (abc)")
                && v.header[0].contains("checkpoint 10s ago"),
            "{:?}",
            v.header
        );
        assert_eq!(v.panels[0].rows, [vec!["s", "100", "300", "0", "0 B", "0"]]);
        assert_eq!(v.panels[1].rows, [vec!["out", "10", "30", "4", "0", "0"]]);
        let c = &v.panels[2].rows[0];
        assert_eq!(
            (
                c[0].as_str(),
                c[4].as_str(),
                c[5].as_str(),
                c[8].as_str(),
                c[10].as_str()
            ),
            ("picl", "2", "3", "4", "1")
        );
        assert_eq!(v.panels[3].rows[0][..3], ["node_drained", "picl", "n3"]);
        // The record of another version is said, not silently dropped.
        assert_eq!(v.panels[3].rows.len(), 2);
        assert!(
            v.panels[3].rows[1][4].contains("1 alert record(s) from http://a not read"),
            "{:?}",
            v.panels[3].rows[1]
        );
        let t = text(&v);
        assert!(
            t.contains("SOURCE EVENTS/S EVENTS INVALID LAG CONNECTIONS"),
            "{t}"
        );
    }

    #[test]
    fn a_pipeline_that_does_not_answer_is_said() {
        let gone = Look {
            url: "http://b".into(),
            error: Some("no answer".into()),
            ..Look::default()
        };
        let v = view(None, &[gone], 0.0, 0.0);
        assert_eq!(v.header, ["http://b: no answer"]);
        assert!(v.panels.iter().all(|p| p.rows.is_empty()));
    }
}
