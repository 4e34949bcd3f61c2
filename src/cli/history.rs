//! `fluxpipe history`: ask the job archive (what a `database` sink wrote)
//! what `sacct` answers for Slurm: which jobs ran, by cluster, user,
//! queue, result, time window, node or id; and what became of the nodes
//! (drains with their reasons, offline, online) or of a job's states.
//! A table as `flux jobs` prints one, or the records as JSON Lines (those
//! `fluxpipe replay --format json` prints).

use super::jobs::{self, Hostnames, Users, several_clusters};
use super::listing::{self, Columns};
use crate::archive::{Access, Archive, EventQuery, JobQuery};
use crate::flux::fsd;
use crate::flux::jobid::JobId;
use crate::keyed::alerts::wall_now;
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde_json::Value;
use std::io::Write;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct HistoryArgs {
    /// The archive: `sqlite://PATH` or `postgres://USER@HOST/DATABASE`
    /// (a `database` sink's `url`).
    #[arg(long, value_name = "URL")]
    pub db: String,
    /// Node state changes (drains with their reasons, undrains, offline,
    /// online), not jobs.
    #[arg(long, conflicts_with_all = ["transitions", "user", "queue", "result", "ids"])]
    pub nodes: bool,
    /// Job state transitions (of the jobs named, or all), not jobs; needs
    /// a sink that takes `transitions`.
    #[arg(long, conflicts_with_all = ["user", "queue", "result", "node"])]
    pub transitions: bool,
    /// Only this cluster's.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only this user's jobs (a name or a uid).
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    /// Only jobs of this queue.
    #[arg(short = 'q', long)]
    pub queue: Option<String>,
    /// Only jobs that ended so, comma-separated: completed, failed,
    /// canceled, timeout.
    #[arg(long, value_name = "RESULTS")]
    pub result: Option<String>,
    /// Only jobs that ran on this host (or, with --nodes, its changes).
    #[arg(long, value_name = "HOST")]
    pub node: Option<String>,
    /// From this time: seconds since the epoch, a date or time (RFC 3339;
    /// without an offset, local), `today`, `yesterday`, or a duration
    /// meaning that long ago (`2h`, `7d`). Jobs that ended then or later,
    /// or have not ended (active jobs' rows, from `job_updates`).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Until this time (as --since). Jobs submitted before it.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// At most this many, the newest (jobs newest first; node changes and
    /// transitions in the order they happened).
    #[arg(short = 'c', long, default_value_t = 1000)]
    pub count: usize,
    /// No header line.
    #[arg(short = 'n', long = "no-header")]
    pub no_header: bool,
    /// A table for people, or JSON Lines (the records as fluxpipe wrote
    /// them).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Only these jobs (any id encoding).
    pub ids: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

pub fn run(args: HistoryArgs) -> Result<ExitCode> {
    let now = wall_now();
    let since = args.since.as_deref().map(|t| when(t, now)).transpose()?;
    let until = args.until.as_deref().map(|t| when(t, now)).transpose()?;
    let ids = args
        .ids
        .iter()
        .map(|t| {
            JobId::parse(t)
                .map(|id| id.0)
                .with_context(|| format!("job id `{t}`"))
        })
        .collect::<Result<Vec<u64>>>()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let records = runtime.block_on(async {
        let archive = Archive::connect(&args.db, Access::Read)
            .await
            .with_context(|| format!("cannot open the archive {}", args.db))?;
        let events = EventQuery {
            cluster: args.cluster.clone(),
            since,
            until,
            host: args.node.clone(),
            ids: ids.clone(),
            limit: args.count,
        };
        let found = if args.nodes {
            archive.node_events(&events).await
        } else if args.transitions {
            archive.transitions(&events).await
        } else {
            let query = JobQuery {
                cluster: args.cluster.clone(),
                user: args.user.as_deref().map(jobs::user_match),
                queue: args.queue.clone(),
                results: results(args.result.as_deref())?,
                ids: ids.clone(),
                since,
                until,
                host: args.node.clone(),
                limit: args.count,
            };
            archive.jobs(&query).await
        };
        archive.close().await;
        found.context("cannot read the archive (has a `database` sink written it?)")
    })?;
    let mut out = std::io::stdout().lock();
    if args.format == Format::Json {
        for r in &records {
            writeln!(out, "{r}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let values: Vec<Value> = records
        .iter()
        .filter_map(|r| serde_json::from_str(r).ok())
        .collect();
    let table = if args.nodes {
        node_table(&values)
    } else if args.transitions {
        transition_table(&values)
    } else {
        jobs::table(&values, &Hostnames::default(), &Users::default(), now)
    };
    listing::print(&mut out, &table, !args.no_header)?;
    Ok(ExitCode::SUCCESS)
}

/// `--result`'s names as the records spell them.
fn results(text: Option<&str>) -> Result<Vec<String>> {
    const KNOWN: [&str; 4] = ["COMPLETED", "FAILED", "CANCELED", "TIMEOUT"];
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    text.split(',')
        .map(|r| {
            let up = r.trim().to_ascii_uppercase();
            if KNOWN.contains(&up.as_str()) {
                Ok(up)
            } else {
                bail!("unknown result `{r}`: expected completed, failed, canceled or timeout")
            }
        })
        .collect()
}

/// A time as `--since`/`--until` take it, in seconds since the epoch.
pub fn when(text: &str, now: f64) -> Result<f64> {
    use jiff::civil::{Date, DateTime};
    use jiff::tz::TimeZone;
    let t = text.trim();
    let tz = TimeZone::system();
    let midnight = |days_back: i64| -> Result<f64> {
        let today = jiff::Timestamp::now().to_zoned(tz.clone()).date();
        let day = today.checked_sub(jiff::Span::new().days(days_back))?;
        Ok(day.to_zoned(tz.clone())?.timestamp().as_microsecond() as f64 / 1e6)
    };
    let seconds = |ts: jiff::Timestamp| ts.as_microsecond() as f64 / 1e6;
    if let Ok(n) = t.parse::<f64>()
        && n.is_finite()
    {
        return Ok(n);
    }
    match t {
        "now" => return Ok(now),
        "today" => return midnight(0),
        "yesterday" => return midnight(1),
        _ => {}
    }
    if let Ok(ts) = t.parse::<jiff::Timestamp>() {
        return Ok(seconds(ts));
    }
    if let Ok(dt) = t.parse::<DateTime>() {
        return Ok(seconds(dt.to_zoned(tz)?.timestamp()));
    }
    if let Ok(d) = t.parse::<Date>() {
        return Ok(seconds(d.to_zoned(tz)?.timestamp()));
    }
    if let Ok(ago) = fsd::parse(t) {
        return Ok(now - ago);
    }
    bail!(
        "`{text}` is not a time: seconds since the epoch, a date or time (2026-11-26, \
         2026-11-26T08:00), today, yesterday, or a duration ago (2h, 7d)"
    )
}

fn time_of(record: &Value) -> String {
    record["timestamp"]
        .as_f64()
        .map_or_else(|| "-".into(), local_time)
}

/// Seconds since the epoch as local `YYYY-MM-DDTHH:MM:SS`, as `flux
/// resource drain` prints its TIME.
fn local_time(t: f64) -> String {
    match jiff::Timestamp::from_microsecond((t * 1e6) as i64) {
        Ok(ts) => ts
            .to_zoned(jiff::tz::TimeZone::system())
            .strftime("%FT%T")
            .to_string(),
        Err(_) => t.to_string(),
    }
}

/// Node changes: when, where, what happened, the state after it.
fn node_table(records: &[Value]) -> Columns {
    let several = several_clusters(records);
    let mut t = Columns::new();
    t.left("TIME", 19);
    if several {
        t.left_grow("CLUSTER", 8);
    }
    t.left_grow("HOST", 8);
    t.right("RANK", 4);
    t.left_grow("EVENT", 10);
    t.left_grow("STATE", 14);
    t.last("REASON");
    for r in records {
        let flag = |k: &str| r[k].as_bool() == Some(true);
        let state = if flag("removed") {
            "removed".to_string()
        } else {
            let mut parts = vec![if flag("online") { "online" } else { "offline" }];
            if flag("draining") {
                parts.push("draining");
            } else if flag("drained") {
                parts.push("drained");
            }
            if flag("torpid") {
                parts.push("torpid");
            }
            parts.join(",")
        };
        let mut row = vec![time_of(r)];
        if several {
            row.push(r["cluster"].as_str().unwrap_or("").to_string());
        }
        row.extend([
            r["hostname"].as_str().unwrap_or("").to_string(),
            r["rank"]
                .as_u64()
                .map_or_else(String::new, |n| n.to_string()),
            r["event"].as_str().unwrap_or("-").to_string(),
            state,
            if flag("drained") {
                r["drain_reason"].as_str().unwrap_or("").to_string()
            } else {
                String::new()
            },
        ]);
        t.row(row);
    }
    t
}

/// Transitions: when, which job, from and to, by which event.
fn transition_table(records: &[Value]) -> Columns {
    let several = several_clusters(records);
    let mut t = Columns::new();
    t.left("TIME", 19);
    if several {
        t.left_grow("CLUSTER", 8);
    }
    t.right("JOBID", 12);
    t.left("FROM", 8);
    t.left("TO", 8);
    t.last("EVENT");
    for r in records {
        let text = |k: &str| r[k].as_str().unwrap_or("").to_string();
        let mut row = vec![time_of(r)];
        if several {
            row.push(text("cluster"));
        }
        row.extend([
            r["id"]
                .as_u64()
                .map_or_else(String::new, |i| listing::f58(JobId(i))),
            text("from"),
            text("to"),
            text("event"),
        ]);
        t.row(row);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_are_read_in_every_form_the_help_names() {
        let now = 1_800_000_000.0;
        assert_eq!(when("1795321862.5", now).unwrap(), 1795321862.5);
        assert_eq!(when("now", now).unwrap(), now);
        assert_eq!(when("2h", now).unwrap(), now - 7200.0);
        assert_eq!(when("7d", now).unwrap(), now - 7.0 * 86400.0);
        assert_eq!(when("2026-11-26T08:00:00Z", now).unwrap(), 1_795_680_000.0);
        let today = when("today", now).unwrap();
        let yesterday = when("yesterday", now).unwrap();
        assert!((today - yesterday - 86400.0).abs() <= 3600.0);
        assert!(when("2026-11-26", now).is_ok());
        assert!(when("2026-11-26T08:00", now).is_ok());
        assert!(when("soon", now).is_err());
        assert!(when("", now).is_err());
    }

    #[test]
    fn results_are_the_four_flux_knows() {
        assert_eq!(
            results(Some("failed, Timeout")).unwrap(),
            ["FAILED", "TIMEOUT"]
        );
        assert!(results(Some("lost")).is_err());
        assert!(results(None).unwrap().is_empty());
    }

    #[test]
    fn node_rows_say_the_state_after_and_the_reason_while_drained() {
        let records = [
            json!({"cluster": "c", "rank": 3, "hostname": "n3", "event": "drain", "timestamp": 0.0,
                   "online": true, "drained": true, "draining": false, "drain_reason": "bad dimm"}),
            json!({"cluster": "c", "rank": 3, "hostname": "n3", "event": "undrain", "timestamp": 0.0,
                   "online": true, "drained": false, "drain_reason": null}),
            json!({"cluster": "c", "rank": 4, "removed": true}),
        ];
        let mut out = Vec::new();
        listing::print(&mut out, &node_table(&records), true).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("TIME"), "{text}");
        assert!(
            lines[1].ends_with("n3          3 drain      online,drained bad dimm"),
            "{text}"
        );
        assert!(lines[2].contains("undrain    online"), "{text}");
        assert!(lines[3].contains("removed"), "{text}");
    }
}
