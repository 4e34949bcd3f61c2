//! `fluxpipe report`: what the job archive says of usage, as `sreport`
//! says it of one Slurm cluster, across clusters. `report jobs` groups
//! the jobs that finished in a window ([`crate::archive::report`]).

use super::history::when;
use crate::archive::report::{FIELDS, GroupBy, NODE_COLUMNS, NodeReport, Report, sort_rows};
use crate::archive::rollup::DAY;
use crate::archive::{Access, Archive, ReportQuery};
use crate::keyed::alerts::wall_now;
use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Map, Value};
use std::io::Write;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ReportArgs {
    #[command(subcommand)]
    pub what: ReportWhat,
}

#[derive(Subcommand, Debug)]
pub enum ReportWhat {
    /// Jobs that finished in a window, grouped: counts by result,
    /// core-, GPU- and node-hours, waits and run times.
    Jobs(JobsReportArgs),
    /// Per node: drain episodes, time drained, the last reason, which
    /// drains followed a failed epilog, prolog or housekeeping, outages.
    Nodes(NodesReportArgs),
}

/// What every report reads, over which window, and how it prints.
#[derive(Args, Debug)]
pub struct Window {
    /// The archive: `sqlite://PATH` or `postgres://USER@HOST/DATABASE`
    /// (a `database` sink's `url`).
    #[arg(long, value_name = "URL")]
    pub db: String,
    /// Only this cluster's.
    #[arg(long)]
    pub cluster: Option<String>,
    /// From this time (the forms `history --since` takes: `7d`,
    /// `yesterday`, a date, epoch seconds); all the archive holds
    /// without it.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Until this time (as --since); now without it.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct NodesReportArgs {
    #[command(flatten)]
    pub window: Window,
}

#[derive(Args, Debug)]
pub struct JobsReportArgs {
    /// Jobs that finished in the window.
    #[command(flatten)]
    pub window: Window,
    /// Only jobs of this queue.
    #[arg(short = 'q', long)]
    pub queue: Option<String>,
    /// Only this user's jobs (a name or a uid, as `history -u`).
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    /// Group by any of cluster, queue, user, day, week, month,
    /// comma-separated (`""`: one row for every job).
    #[arg(long, value_name = "KEYS", default_value = "cluster")]
    pub by: String,
    /// Largest first by this field (`core_hours`, `jobs`, `wait_p90_s`,
    /// ...); by the groups' keys without it.
    #[arg(long, value_name = "FIELD")]
    pub sort: Option<String>,
    /// The time zone of days, weeks and months: an IANA name
    /// (`America/Los_Angeles`) or `local`; UTC without it.
    #[arg(long, value_name = "ZONE")]
    pub tz: Option<String>,
    /// What to read: the jobs' rows (exact), the daily rollups (fast over
    /// long windows, and kept after the retention deletes the rows; wait
    /// percentiles to 3 significant digits), or `auto`: the rollups when
    /// the window is whole UTC days (or none) and days are UTC ones.
    #[arg(long, value_enum, default_value_t = Source::Auto)]
    pub from: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Source {
    Auto,
    Rows,
    Rollups,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns, as `sreport` prints them.
    Table,
    /// One JSON array of the rows.
    Json,
    /// A header line, then one line per row.
    Csv,
}

pub fn run(args: ReportArgs) -> Result<ExitCode> {
    match args.what {
        ReportWhat::Jobs(a) => jobs(a),
        ReportWhat::Nodes(a) => nodes(a),
    }
}

fn time_zone(name: Option<&str>) -> Result<jiff::tz::TimeZone> {
    Ok(match name {
        None | Some("UTC" | "utc") => jiff::tz::TimeZone::UTC,
        Some("local") => jiff::tz::TimeZone::system(),
        Some(n) => jiff::tz::TimeZone::get(n).with_context(|| format!("--tz `{n}`"))?,
    })
}

impl Window {
    /// The window's ends, in seconds since the epoch.
    fn times(&self, now: f64) -> Result<(Option<f64>, Option<f64>)> {
        let at = |t: &Option<String>| t.as_deref().map(|t| when(t, now)).transpose();
        Ok((at(&self.since)?, at(&self.until)?))
    }

    /// Run `read` over the archive.
    fn read<T>(
        &self,
        read: impl AsyncFnOnce(&Archive) -> Result<T, crate::archive::ArchiveError>,
    ) -> Result<T> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let archive = Archive::connect(&self.db, Access::Read)
                .await
                .with_context(|| format!("cannot open the archive {}", self.db))?;
            let done = read(&archive).await;
            archive.close().await;
            done.context("cannot read the archive (has a `database` sink written it?)")
        })
    }

    /// Print `rows` in the chosen format; in a table, the `left` columns
    /// (text) to the left, figures to the right.
    fn print(
        &self,
        rows: Vec<Map<String, Value>>,
        cols: &[String],
        left: impl Fn(&str) -> bool,
    ) -> Result<()> {
        let mut out = std::io::stdout().lock();
        match self.format {
            Format::Json => writeln!(
                out,
                "{}",
                Value::Array(rows.into_iter().map(Value::Object).collect())
            )?,
            Format::Csv => write_csv(&mut out, &rows, cols)?,
            Format::Table => write_table(&mut out, &rows, cols, left)?,
        }
        Ok(())
    }
}

fn jobs(args: JobsReportArgs) -> Result<ExitCode> {
    let by = GroupBy::parse_list(&args.by)?;
    let (since, until) = args.window.times(wall_now())?;
    let query = ReportQuery {
        cluster: args.window.cluster.clone(),
        queue: args.queue.clone(),
        user: args.user.as_deref().map(super::jobs::user_match),
        since,
        until,
    };
    let tz = time_zone(args.tz.as_deref())?;
    // Rollups are per UTC day: they answer for whole UTC days only.
    let whole_days = [since, until]
        .iter()
        .flatten()
        .all(|t| t.rem_euclid(DAY as f64) == 0.0);
    let utc = tz == jiff::tz::TimeZone::UTC;
    if args.from == Source::Rollups && !(whole_days && utc) {
        anyhow::bail!(
            "--from rollups needs a window of whole UTC days (dates, at 00:00 UTC) and days in UTC"
        );
    }
    let mut report = Report::new(by, tz);
    args.window.read(async |archive| {
        let rollups = match args.from {
            Source::Rows => false,
            Source::Rollups => true,
            // An archive no sink has migrated yet has none.
            Source::Auto => whole_days && utc && archive.schema_version().await? >= 5,
        };
        if rollups {
            for (key, sums) in archive.rollups(&query).await? {
                report.add_rollup(&key, &sums);
            }
        } else {
            archive.finished_jobs(&query, |j| report.add(&j)).await?;
        }
        Ok(())
    })?;
    let mut rows = report.rows(crate::accounts::name_of_uid);
    if let Some(field) = &args.sort {
        sort_rows(&mut rows, field)?;
    }
    let cols = columns(&args.by);
    let keys = &cols[..cols.len() - FIELDS.len()];
    args.window
        .print(rows, &cols, |c| keys.iter().any(|k| k == c))?;
    Ok(ExitCode::SUCCESS)
}

fn nodes(args: NodesReportArgs) -> Result<ExitCode> {
    let now = wall_now();
    let (since, until) = args.window.times(now)?;
    let until = until.unwrap_or(now);
    let mut report = NodeReport::new(since, until);
    let cluster = args.window.cluster.as_deref();
    args.window.read(async |archive| {
        archive
            .node_changes(cluster, until, |c| report.add(&c))
            .await
    })?;
    let cols: Vec<String> = NODE_COLUMNS.iter().map(|c| c.to_string()).collect();
    // Keys and the reason to the left, figures to the right.
    args.window.print(report.rows(), &cols, |c| {
        matches!(c, "cluster" | "node" | "last_drain_reason")
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The columns: the group's keys, then the figures.
fn columns(by: &str) -> Vec<String> {
    let mut cols = Vec::new();
    for g in GroupBy::parse_list(by).unwrap_or_default() {
        cols.push(g.as_str().to_string());
        if g == GroupBy::User {
            cols.push("userid".into());
        }
    }
    cols.extend(FIELDS.iter().map(|f| f.to_string()));
    cols
}

/// A cell as text: empty for none; hours to 2 places, seconds to 1.
fn cell(col: &str, v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) if col.ends_with("_at") => n
            .as_f64()
            .and_then(|t| jiff::Timestamp::from_second(t as i64).ok())
            .map_or_else(String::new, |t| t.to_string()),
        Some(Value::Number(n)) if col.ends_with("_hours") => {
            format!("{:.2}", n.as_f64().unwrap_or(0.0))
        }
        Some(Value::Number(n)) if col.ends_with("_s") => {
            format!("{:.1}", n.as_f64().unwrap_or(0.0))
        }
        Some(other) => other.to_string(),
    }
}

fn write_csv(out: &mut impl Write, rows: &[Map<String, Value>], cols: &[String]) -> Result<()> {
    let mut w = csv::Writer::from_writer(out);
    w.write_record(cols)?;
    for row in rows {
        // Full precision in CSV: a spreadsheet rounds as it likes.
        w.write_record(cols.iter().map(|c| match row.get(c) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        }))?;
    }
    w.flush()?;
    Ok(())
}

/// Aligned columns under an upper-case header and a line of dashes;
/// columns `left` says are text go to the left, figures to the right.
fn write_table(
    out: &mut impl Write,
    rows: &[Map<String, Value>],
    cols: &[String],
    left: impl Fn(&str) -> bool,
) -> Result<()> {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| cols.iter().map(|c| cell(c, r.get(c))).collect())
        .collect();
    let width = |i: usize| {
        cells
            .iter()
            .map(|r| r[i].chars().count())
            .chain([cols[i].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..cols.len()).map(width).collect();
    let line = |texts: &[String]| -> String {
        let parts: Vec<String> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if left(&cols[i]) {
                    format!("{t:<w$}", w = widths[i])
                } else {
                    format!("{t:>w$}", w = widths[i])
                }
            })
            .collect();
        parts.join(" ").trim_end().to_string()
    };
    let header: Vec<String> = cols.iter().map(|c| c.to_ascii_uppercase()).collect();
    writeln!(out, "{}", line(&header))?;
    let dashes: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    writeln!(out, "{}", line(&dashes))?;
    for r in &cells {
        writeln!(out, "{}", line(r))?;
    }
    Ok(())
}
