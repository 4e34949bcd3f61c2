//! `fluxpipe jobs`: the jobs a running fluxpipe holds, printed as `flux
//! jobs` prints them (its default columns that the job records carry:
//! JOBID, USER, ST, NNODES, TIME, INFO; a CLUSTER column when there are
//! several), or as JSON. Merges the answers of several servers.

use super::ask::{Client, Servers, coverage};
use super::format::{Format, Val};
use super::listing::{self, Columns};
use crate::flux::fsd;
use crate::flux::hostlist::Hostlist;
use crate::flux::idset::IdSet;
use crate::flux::jobid::{Encoding, JobId};
use crate::flux::user::UserMatch;
use crate::keyed::alerts::wall_now;
use anyhow::{Context, Result};
use clap::Args;
use serde_json::{Value, json};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct JobsArgs {
    #[command(flatten)]
    pub servers: Servers,
    /// Inactive jobs too (those still held: within the inactive grace).
    #[arg(short = 'a')]
    pub all: bool,
    /// States to list, comma-separated: names (depend, priority, sched,
    /// run, cleanup, inactive) or pending, running, active, inactive.
    #[arg(short = 'f', long, value_name = "STATES")]
    pub filter: Option<String>,
    /// Only this user's jobs (a name or a uid). Unlike `flux jobs`, every
    /// user's jobs are listed by default: fluxpipe runs apart from the
    /// users.
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    /// Only this cluster's jobs.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only jobs of these queues, comma-separated; as `flux jobs -q`, a
    /// queue takes the jobs of its virtual queues (RFC 33) too.
    #[arg(short = 'q', long, value_name = "QUEUE,...")]
    pub queue: Option<String>,
    /// Jobs active since this time (seconds since the epoch).
    #[arg(long)]
    pub since: Option<f64>,
    /// At most this many jobs.
    #[arg(short = 'c', long, default_value_t = 1000)]
    pub count: usize,
    /// No header line.
    #[arg(short = 'n', long = "no-header")]
    pub no_header: bool,
    /// The job records as JSON (`{"jobs": [...]}`), not a table.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Columns by a `flux jobs` format string, e.g. `{id.f58:>12}
    /// {name:<10.10+} {status_abbrev:>2} {runtime!F:>8h}` (flux's fields
    /// the job records carry, its `!d`/`!D`/`!F`/`!H`/`!P` conversions,
    /// `h` and `+` suffixes, `?:` and `+:` prefixes; `default` is the
    /// default table).
    #[arg(short = 'o', long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// Only these jobs (any id encoding), in this order.
    pub ids: Vec<String>,
}

pub fn run(args: JobsArgs) -> Result<ExitCode> {
    let client = Client::new(&args.servers)?;
    let (mut jobs, truncated, code) = if args.ids.is_empty() {
        let (jobs, truncated) = listed(&client, &args)?;
        (jobs, truncated, ExitCode::SUCCESS)
    } else {
        by_id(&client, &args)?
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        for job in &mut jobs {
            if let Some(m) = job.as_object_mut() {
                m.remove("record_id");
                m.remove("kind");
                // As `flux jobs --json` shows them (`begin@…`).
                if let Some(Value::Array(deps)) = m.get_mut("dependencies") {
                    for d in deps.iter_mut() {
                        if let Some(text) = d.as_str() {
                            *d = Value::String(listing::dependency(text));
                        }
                    }
                }
            }
        }
        writeln!(out, "{}", json!({ "jobs": jobs }))?;
        return Ok(code);
    }
    let hosts = Hostnames::fetch(&client, &jobs)?;
    if let Some(format) = args.format.as_deref().filter(|f| *f != "default") {
        let lines = format_lines(
            format,
            &jobs,
            &hosts,
            &Users::default(),
            wall_now(),
            !args.no_header,
        )?;
        for line in lines {
            writeln!(out, "{line}")?;
        }
        return Ok(code);
    }
    let table = table(&jobs, &hosts, &Users::default(), wall_now());
    listing::print(&mut out, &table, !args.no_header)?;
    if truncated && !args.no_header {
        eprintln!(
            "warning: output truncated at {} jobs.\nUse --count to increase returned results or use filters to alter results.",
            args.count
        );
    }
    Ok(code)
}

/// The jobs the filters take, every server's merged in `flux jobs` order.
fn listed(client: &Client, args: &JobsArgs) -> Result<(Vec<Value>, bool)> {
    let states = match (&args.filter, args.all) {
        (Some(f), _) => f.clone(),
        (None, true) => "pending,running,inactive".into(),
        (None, false) => "pending,running".into(),
    };
    let mut query = vec![("state", states)];
    if let Some(u) = &args.user {
        // The server matches names Flux's side sent; its own accounts are
        // the fallback for jobs that came without one.
        query.push(("user", u.clone()));
    }
    if let Some(c) = &args.cluster {
        query.push(("cluster", c.clone()));
    }
    if let Some(s) = args.since {
        query.push(("since", s.to_string()));
    }
    if let Some(q) = &args.queue {
        query.push(("queue", q.clone()));
    }
    let mut jobs = Vec::new();
    let mut more = false;
    let mut reports = Vec::new();
    for base in client.urls() {
        let paged = client.get_pages(base, "/api/v1/jobs", "jobs", &query, args.count)?;
        jobs.extend(paged.items);
        more |= paged.more;
        reports.push(paged.partitions);
    }
    for warning in coverage(&reports.iter().map(Option::as_ref).collect::<Vec<_>>()) {
        eprintln!("fluxpipe jobs: warning: {warning}");
    }
    jobs.sort_by(listing_order);
    // A job two members both hold (a partition changing hands) once.
    jobs.dedup_by(|a, b| a["cluster"] == b["cluster"] && a["id"] == b["id"]);
    let truncated = more || jobs.len() > args.count;
    jobs.truncate(args.count);
    Ok((jobs, truncated))
}

/// The jobs named, in the order named; an unknown one is said on stderr.
fn by_id(client: &Client, args: &JobsArgs) -> Result<(Vec<Value>, bool, ExitCode)> {
    let mut jobs = Vec::new();
    let mut missing = 0;
    for text in &args.ids {
        let id = JobId::parse(text).with_context(|| format!("job id `{text}`"))?;
        let mut query = vec![("id", id.0.to_string())];
        if let Some(c) = &args.cluster {
            query.push(("cluster", c.clone()));
        }
        let found: Vec<Value> = client
            .get_all("/api/v1/jobs", &query)?
            .into_iter()
            .flat_map(|page| page["jobs"].as_array().cloned().unwrap_or_default())
            .collect();
        if found.is_empty() {
            eprintln!("JobID {text} unknown");
            missing += 1;
        }
        jobs.extend(found);
    }
    let code = if missing == args.ids.len() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    };
    Ok((jobs, false, code))
}

/// `-u`: a uid, or a name (matched against the names Flux's side sent;
/// jobs that came with none match by the name's uid in this host's
/// accounts).
pub fn user_match(user: &str) -> UserMatch {
    UserMatch::parse(user, crate::accounts::uid_of_name)
}

/// `flux jobs` order: pending (highest priority first, then lowest id),
/// running (newest start first), inactive (newest end first); then
/// cluster and id, so the order is total.
pub fn listing_order(a: &Value, b: &Value) -> Ordering {
    let key = |j: &Value| {
        let f = |k: &str| j[k].as_f64().unwrap_or(0.0);
        match j["state"].as_str().unwrap_or("") {
            "RUN" | "CLEANUP" => (1, -f("t_run")),
            "INACTIVE" => (2, -f("t_inactive")),
            _ => (0, -j["priority"].as_f64().unwrap_or(-1.0)),
        }
    };
    let (ga, pa) = key(a);
    let (gb, pb) = key(b);
    ga.cmp(&gb)
        .then(pa.total_cmp(&pb))
        .then_with(|| a["cluster"].as_str().cmp(&b["cluster"].as_str()))
        .then_with(|| a["id"].as_u64().cmp(&b["id"].as_u64()))
}

/// Names of users: the one Flux's side sent with the job, else this
/// host's accounts (looked up once per uid; right only where this host
/// shares the cluster's accounts); a uid with neither is shown as the
/// number (as `flux jobs` does).
#[derive(Default)]
pub struct Users(std::cell::RefCell<HashMap<i64, String>>);

impl Users {
    fn of(&self, job: &Value) -> Option<String> {
        if let Some(name) = job["username"].as_str() {
            return Some(name.to_string());
        }
        job["userid"].as_i64().map(|uid| self.local_name(uid))
    }

    fn local_name(&self, uid: i64) -> String {
        self.0
            .borrow_mut()
            .entry(uid)
            .or_insert_with(|| crate::accounts::name_of_uid(uid).unwrap_or_else(|| uid.to_string()))
            .clone()
    }
}

/// Host names by cluster and rank, from the servers' nodes.
#[derive(Default)]
pub struct Hostnames(HashMap<(String, u32), String>);

impl Hostnames {
    fn fetch(client: &Client, jobs: &[Value]) -> Result<Self> {
        let mut out = Hostnames::default();
        if !jobs.iter().any(|j| j["ranks"].is_string()) {
            return Ok(out);
        }
        for answer in client.get_all("/api/v1/nodes", &[])? {
            for node in answer["nodes"].as_array().into_iter().flatten() {
                if let (Some(c), Some(r), Some(h)) = (
                    node["cluster"].as_str(),
                    node["rank"].as_u64().and_then(|r| u32::try_from(r).ok()),
                    node["hostname"].as_str(),
                ) {
                    out.0.insert((c.to_string(), r), h.to_string());
                }
            }
        }
        Ok(out)
    }

    #[cfg(test)]
    pub fn insert(&mut self, cluster: &str, rank: u32, host: &str) {
        self.0.insert((cluster.into(), rank), host.into());
    }

    /// The hostlist of a job's ranks, or the ranks themselves if a name
    /// is missing.
    fn nodelist(&self, cluster: &str, ranks: &IdSet) -> String {
        let mut hosts = Hostlist::default();
        for rank in ranks.iter() {
            match self.0.get(&(cluster.to_string(), rank)) {
                Some(h) => hosts.push(h),
                None => return ranks.to_string(),
            }
        }
        hosts.to_string()
    }
}

/// The `ST` column: the state while pending or running, the result after.
pub fn status_abbrev(job: &Value) -> &'static str {
    match job["state"].as_str().unwrap_or("") {
        "DEPEND" => "D",
        "PRIORITY" => "P",
        "SCHED" => "S",
        "RUN" => "R",
        "CLEANUP" => "C",
        "INACTIVE" => result_abbrev(job),
        _ => "",
    }
}

/// flux's `RS`: the result's abbreviation.
fn result_abbrev(job: &Value) -> &'static str {
    match job["result"].as_str().unwrap_or("") {
        "COMPLETED" => "CD",
        "FAILED" => "F",
        "CANCELED" => "CA",
        "TIMEOUT" => "TO",
        _ => "",
    }
}

/// The fields `-o FORMAT` knows, with their headings: the names of `flux
/// jobs` that the job records carry, and fluxpipe's `cluster`.
const FIELDS: &[(&str, &str)] = &[
    ("id", "JOBID"),
    ("id.dec", "JOBID"),
    ("id.hex", "JOBID"),
    ("id.f58", "JOBID"),
    ("id.f58plain", "JOBID"),
    ("id.kvs", "JOBID"),
    ("id.words", "JOBID"),
    ("id.dothex", "JOBID"),
    ("cluster", "CLUSTER"),
    ("userid", "UID"),
    ("username", "USER"),
    ("urgency", "URG"),
    ("priority", "PRI"),
    ("state", "STATE"),
    ("state_single", "S"),
    ("name", "NAME"),
    ("queue", "QUEUE"),
    ("project", "PROJECT"),
    ("bank", "BANK"),
    ("ntasks", "NTASKS"),
    ("ncores", "NCORES"),
    ("duration", "DURATION"),
    ("nnodes", "NNODES"),
    ("expiration", "EXPIRATION"),
    ("ranks", "RANKS"),
    ("nodelist", "NODELIST"),
    ("success", "SUCCESS"),
    ("result", "RESULT"),
    ("result_abbrev", "RS"),
    ("t_submit", "T_SUBMIT"),
    ("t_depend", "T_DEPEND"),
    ("t_run", "T_RUN"),
    ("t_cleanup", "T_CLEANUP"),
    ("t_inactive", "T_INACTIVE"),
    ("runtime", "RUNTIME"),
    ("status", "STATUS"),
    ("status_abbrev", "ST"),
    ("waitstatus", "WSTATUS"),
    ("returncode", "RC"),
    ("exception.occurred", "EXCEPTION-OCCURRED"),
    ("exception.severity", "EXCEPTION-SEVERITY"),
    ("exception.type", "EXCEPTION-TYPE"),
    ("exception.note", "EXCEPTION-NOTE"),
    ("dependencies", "DEPENDENCIES"),
    ("contextual_info", "INFO"),
    ("contextual_time", "TIME"),
];

/// flux jobs' default format, as `-o default` names it.
pub const DEFAULT_FORMAT: &str = "{id.f58:>12} ?:{queue:<8.8} +:{username:<8} {name:<10.10+} {status_abbrev:>2.2} {ntasks:>6} {nnodes:>6h} {contextual_time!F:>8h} {contextual_info}";

/// A field's heading, if `-o` knows it.
pub fn heading(name: &str) -> Option<&'static str> {
    FIELDS.iter().find(|(n, _)| *n == name).map(|(_, h)| *h)
}

/// `flux jobs -o FORMAT`: the job records' lines by a format string
/// (`None`: the format does not parse, and why).
pub fn format_lines(
    format: &str,
    jobs: &[Value],
    hosts: &Hostnames,
    users: &Users,
    now: f64,
    header: bool,
) -> Result<Vec<String>> {
    let parsed = Format::parse(format, heading).with_context(|| format!("format `{format}`"))?;
    Ok(parsed.render(
        jobs,
        |job, name| field(job, name, hosts, users, now),
        header,
    ))
}

/// A job record's value of a field, as `flux jobs` has it: missing times
/// are 0 (so `!d` prints nothing), booleans `True` / `False`.
fn field(job: &Value, name: &str, hosts: &Hostnames, users: &Users, now: f64) -> Val {
    let id = job["id"].as_u64().map(JobId);
    let time = |k: &str| Val::Float(job[k].as_f64().unwrap_or(0.0));
    let state = job["state"].as_str().unwrap_or("");
    match name {
        "id" | "id.f58" => id.map_or(Val::Empty, |i| Val::Str(listing::f58(i))),
        "id.dec" => id.map_or(Val::Empty, |i| Val::Int(i.0 as i64)),
        _ if name.starts_with("id.") => {
            let enc = Encoding::parse(&name[3..]);
            match (id, enc) {
                (Some(i), Some(e)) => Val::Str(i.encode(e)),
                _ => Val::Empty,
            }
        }
        "username" => users.of(job).map_or(Val::Empty, Val::Str),
        "state_single" => Val::Str(state.chars().next().map(String::from).unwrap_or_default()),
        "status" => Val::Str(match state {
            "INACTIVE" => job["result"].as_str().unwrap_or(state).to_string(),
            _ => state.to_string(),
        }),
        "status_abbrev" => Val::Str(status_abbrev(job).into()),
        "result_abbrev" => Val::Str(result_abbrev(job).into()),
        "runtime" => {
            let f = |k: &str| job[k].as_f64().filter(|t| *t > 0.0);
            Val::Float(match (f("t_run"), f("t_cleanup")) {
                (Some(run), Some(cleanup)) => cleanup - run,
                (Some(run), None) => (now - run).max(0.0),
                _ => 0.0,
            })
        }
        "t_submit" | "t_depend" | "t_run" | "t_cleanup" | "t_inactive" | "duration"
        | "expiration" => time(name),
        // Nothing before the job ends, as job-list gives it.
        "exception.occurred" if state != "INACTIVE" => Val::Empty,
        "exception.occurred" => plain(&job["exception_occurred"]),
        "exception.severity" => plain(&job["exception_severity"]),
        "exception.type" => plain(&job["exception_type"]),
        "exception.note" => plain(&job["exception_note"]),
        "dependencies" => Val::Str(
            job["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(listing::dependency)
                .collect::<Vec<_>>()
                .join(","),
        ),
        "contextual_info" => Val::Str(contextual_info(job, hosts)),
        "contextual_time" => Val::Float(contextual_time(job, now)),
        _ => plain(&job[name]),
    }
}

/// A JSON value as a format value (booleans as Python prints them).
fn plain(v: &Value) -> Val {
    match v {
        Value::String(s) => Val::Str(s.clone()),
        Value::Bool(b) => Val::Str(if *b { "True" } else { "False" }.into()),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Val::Int(i),
            None => n.as_f64().map_or(Val::Empty, Val::Float),
        },
        Value::Array(_) | Value::Object(_) => Val::Str(v.to_string()),
        Value::Null => Val::Empty,
    }
}

/// The `TIME` column: for a pending job its time limit, else how long it
/// ran (or has run until `now`).
fn contextual_time(job: &Value, now: f64) -> f64 {
    let f = |k: &str| job[k].as_f64().filter(|t| *t > 0.0);
    match job["state"].as_str().unwrap_or("") {
        "DEPEND" | "PRIORITY" | "SCHED" => f("duration").unwrap_or(0.0),
        _ => match (f("t_run"), f("t_cleanup")) {
            (Some(run), Some(cleanup)) => cleanup - run,
            (Some(run), None) => now - run,
            _ => 0.0,
        },
    }
}

/// The `INFO` column.
fn contextual_info(job: &Value, hosts: &Hostnames) -> String {
    match job["state"].as_str().unwrap_or("") {
        "PRIORITY" => "priority-wait".into(),
        "DEPEND" => {
            let deps: Vec<String> = job["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(listing::dependency)
                .collect();
            format!("depends:{}", deps.join(","))
        }
        "SCHED" => {
            if job["urgency"].as_i64() == Some(0) {
                "held".into()
            } else if job["priority"].as_i64() == Some(0) {
                "priority-hold".into()
            } else {
                String::new()
            }
        }
        // R's nodelist, as flux jobs prints; else the ranks' hosts.
        _ if job["nodelist"].is_string() => job["nodelist"].as_str().unwrap_or("").to_string(),
        _ => {
            let cluster = job["cluster"].as_str().unwrap_or("");
            match job["ranks"].as_str().map(IdSet::parse) {
                Some(Ok(ranks)) => hosts.nodelist(cluster, &ranks),
                _ => String::new(),
            }
        }
    }
}

/// Whether the records come from more than one cluster (a CLUSTER column
/// is then shown).
pub fn several_clusters(records: &[Value]) -> bool {
    let mut names = records.iter().map(|r| r["cluster"].as_str());
    let first = names.next().flatten();
    names.any(|c| c != first)
}

/// The table `flux jobs` prints, for these jobs: its default format,
/// `{id.f58:>12} ?:{queue:<8.8} +:{username:<8} {name:<10.10+}
/// {status_abbrev:>2.2} {ntasks:>6} {nnodes:>6h} {contextual_time!F:>8h}
/// {contextual_info}`, and a CLUSTER column after the id when there are
/// several.
pub fn table(jobs: &[Value], hosts: &Hostnames, users: &Users, now: f64) -> Columns {
    let several = several_clusters(jobs);
    let text = |job: &Value, key: &str| job[key].as_str().unwrap_or("").to_string();
    // `?:`: the column only when some job has a queue.
    let queues = jobs.iter().any(|j| !text(j, "queue").is_empty());
    let mut t = Columns::new();
    t.right("JOBID", 12);
    if several {
        t.left_grow("CLUSTER", 8);
    }
    if queues {
        t.left_cut("QUEUE", 8, false);
    }
    t.left_grow("USER", 8);
    t.left_cut("NAME", 10, true);
    t.right("ST", 2);
    t.right("NTASKS", 6);
    t.right("NNODES", 6);
    t.right("TIME", 8);
    t.last("INFO");
    for job in jobs {
        let id = job["id"]
            .as_u64()
            .map_or_else(String::new, |i| listing::f58(JobId(i)));
        let user = users.of(job).unwrap_or_default();
        let count = |key: &str| {
            job[key]
                .as_u64()
                .map_or_else(String::new, |n| n.to_string())
        };
        let time = listing::hyphen_if_empty(fsd::format(contextual_time(job, now)));
        let mut row = vec![id];
        if several {
            row.push(text(job, "cluster"));
        }
        if queues {
            row.push(text(job, "queue"));
        }
        row.extend([
            user,
            text(job, "name"),
            status_abbrev(job).to_string(),
            count("ntasks"),
            listing::hyphen_if_empty(count("nnodes")),
            time,
            contextual_info(job, hosts),
        ]);
        t.row(row);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(v: Value) -> Value {
        let mut base = json!({"cluster": "c", "userid": 4_000_000_000i64});
        for (k, x) in v.as_object().unwrap() {
            base[k] = x.clone();
        }
        base
    }

    #[test]
    fn lines_as_flux_jobs_prints_them() {
        // Rows from `flux jobs` of flux-core 0.88 (the columns fluxpipe has).
        let jobs = [
            job(
                json!({"id": 1, "state": "SCHED", "urgency": 0, "priority": 0, "name": "sleep", "ntasks": 1, "duration": 60.0, "queue": "batch"}),
            ),
            job(
                json!({"id": 2, "state": "DEPEND", "dependencies": ["after-success=ƒki9ptf"], "name": "averyverylongname", "ntasks": 2, "nnodes": 2, "duration": 0.0, "queue": "debugging-queue"}),
            ),
            job(json!({"id": 3, "state": "PRIORITY", "name": "x", "ntasks": 1})),
            job(
                json!({"id": 4, "state": "RUN", "t_run": 100.0, "ranks": "[1-2]", "name": "app", "ntasks": 4, "nnodes": 2, "queue": "batch"}),
            ),
            job(
                json!({"id": 5, "state": "INACTIVE", "result": "COMPLETED", "t_run": 10.0, "t_cleanup": 60.0, "ranks": "4", "name": "hostname", "ntasks": 1, "nnodes": 1}),
            ),
            job(json!({"id": 6, "state": "INACTIVE", "result": "CANCELED"})),
        ];
        let mut hosts = Hostnames::default();
        for r in 0..8 {
            hosts.insert("c", r, &format!("node{r}"));
        }
        let t = table(&jobs, &hosts, &Users::default(), 175.1);
        let mut out = Vec::new();
        listing::print(&mut out, &t, true).unwrap();
        let text = String::from_utf8(out).unwrap();
        let want = "       JOBID QUEUE    USER       NAME       ST NTASKS NNODES     TIME INFO\n\
                    \x20         ƒ2 batch    4000000000 sleep       S      1      -       1m held\n\
                    \x20         ƒ3 debuggin 4000000000 averyvery+  D      2      2        - depends:after-success=ƒki9ptf\n\
                    \x20         ƒ4          4000000000 x           P      1      -        - priority-wait\n\
                    \x20         ƒ5 batch    4000000000 app         R      4      2   1.252m node[1-2]\n\
                    \x20         ƒ6          4000000000 hostname   CD      1      1      50s node4\n\
                    \x20         ƒ7          4000000000            CA             -        - \n";
        assert_eq!(text, want);
        // flux's default format string prints the same lines.
        let formatted = format_lines(
            DEFAULT_FORMAT,
            &jobs,
            &hosts,
            &Users::default(),
            175.1,
            true,
        )
        .unwrap();
        assert_eq!(formatted.join("\n") + "\n", want);
    }

    #[test]
    fn fields_read_as_flux_jobs_shows_them() {
        let pending = job(
            json!({"id": 2, "state": "SCHED", "exception_occurred": false,
            "exception_raised": {"type": "test", "severity": 1, "note": ""},
            "dependencies": ["begin-time=1700000000.5", "after:x"], "username": "alice"}),
        );
        let ended = job(json!({"id": 3, "state": "INACTIVE", "exception_occurred": true}));
        let line = |j: &Value, f: &str| {
            format_lines(
                f,
                std::slice::from_ref(j),
                &Hostnames::default(),
                &Users::default(),
                0.0,
                false,
            )
            .unwrap()
            .join("")
        };
        // Nothing before the job ends, as job-list gives it.
        assert_eq!(line(&pending, "{exception.occurred}"), "");
        assert_eq!(line(&ended, "{exception.occurred}"), "True");
        // begin-time as begin@…, the others as they are.
        let deps = line(&pending, "{dependencies}");
        assert!(
            deps.starts_with("begin@") && deps.ends_with(",after:x"),
            "{deps}"
        );
        // The name Flux's side sent, whatever this host's accounts say.
        assert_eq!(line(&pending, "{username}"), "alice");
    }

    #[test]
    fn several_clusters_get_a_cluster_column() {
        let jobs = [
            job(json!({"id": 1, "state": "PRIORITY", "cluster": "alpha"})),
            job(json!({"id": 1, "state": "PRIORITY", "cluster": "b"})),
        ];
        let t = table(&jobs, &Hostnames::default(), &Users::default(), 0.0);
        let mut out = Vec::new();
        listing::print(&mut out, &t, true).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("       JOBID CLUSTER  USER"), "{text}");
        assert!(text.contains("ƒ2 alpha    4000000000"), "{text}");
    }

    #[test]
    fn the_order_is_flux_jobs_order() {
        let mut jobs = [
            job(json!({"id": 9, "state": "INACTIVE", "t_inactive": 5.0})),
            job(json!({"id": 8, "state": "RUN", "t_run": 1.0})),
            job(json!({"id": 7, "state": "RUN", "t_run": 2.0})),
            job(json!({"id": 6, "state": "DEPEND"})),
            job(json!({"id": 5, "state": "SCHED", "priority": 0})),
            job(json!({"id": 4, "state": "SCHED", "priority": 16})),
            job(json!({"id": 3, "state": "SCHED", "priority": 16})),
        ];
        jobs.sort_by(listing_order);
        let ids: Vec<u64> = jobs.iter().map(|j| j["id"].as_u64().unwrap()).collect();
        assert_eq!(ids, [3, 4, 5, 6, 7, 8, 9]);
    }
}
