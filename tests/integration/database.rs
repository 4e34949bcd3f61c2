//! The `database` sink and `fluxpipe history` against a real SQLite file and
//! a real PostgreSQL server (Debian's, started per test by `tests/postgres`
//! in a temporary folder on a free loopback port). Without PostgreSQL the
//! PostgreSQL cases say they were skipped, unless FLUXPIPE_REQUIRE_POSTGRES
//! is set (tests/run-all sets it), which makes them fail instead.
//!
//! - The corpus and a generated workload, written while `fluxpipe run` is
//!   SIGKILLed at random moments: every job's row is there once and equal
//!   to `fluxpipe replay`'s record; node changes and transitions equal
//!   those of a run never killed.
//! - The server killed during the run and started again: nothing lost,
//!   the outage counted.
//! - A database of the first schema version is migrated at start, its
//!   rows kept and counted in the daily rollups.
//! - Reports: from the rows and from the rollups, over a generated year
//!   on three clusters (before and after the retention), the same on
//!   SQLite and PostgreSQL.
//! - Jobs whose jobspec is missing, malformed or huge still get a row.

use crate::common;
use crate::common::{Reaper, XorShift, fluxpipe, free_port, http_get, replay, sigterm, wait_until};

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A PostgreSQL server of this test's own, stopped when dropped.
struct Postgres {
    dir: PathBuf,
    url: String,
}

impl Postgres {
    /// Start one in `dir`; `None` (said on stderr) when this machine has no
    /// PostgreSQL and the run does not require it.
    fn start(dir: &Path) -> Option<Postgres> {
        let out = std::process::Command::new(repo().join("tests/postgres"))
            .arg("start")
            .arg(dir)
            .output()
            .expect("run tests/postgres");
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            assert!(
                std::env::var_os("FLUXPIPE_REQUIRE_POSTGRES").is_none(),
                "PostgreSQL is required here and did not start: {why}"
            );
            eprintln!("PostgreSQL cases skipped: {why}");
            return None;
        }
        let url = String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_string();
        Some(Postgres {
            dir: dir.to_path_buf(),
            url,
        })
    }

    fn ctl(&self, what: &str) {
        let status = std::process::Command::new(repo().join("tests/postgres"))
            .arg(what)
            .arg(&self.dir)
            .stdout(Stdio::null())
            .status()
            .expect("run tests/postgres");
        assert!(status.success(), "tests/postgres {what}");
    }

    /// A new, empty database on this server.
    fn database(&self, name: &str) -> String {
        let base = self.url.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            use sqlx::Connection;
            let mut c = sqlx::PgConnection::connect(&base).await.expect("connect");
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut c)
                .await
                .expect("create database");
        });
        let (server, _) = base.rsplit_once('/').expect("a URL with a database");
        format!("{server}/{name}")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo().join("tests/postgres"))
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// `fluxpipe history --db URL --format json ARGS`: the records.
fn history(url: &str, args: &[&str]) -> Vec<String> {
    let out = fluxpipe()
        .args(["history", "--db", url, "--format", "json", "-c", "1000000"])
        .args(args)
        .output()
        .expect("run fluxpipe history");
    assert!(
        out.status.success(),
        "history {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// The job records (as `history`), or none while the database is not
/// made yet.
fn history_now(url: &str) -> Vec<String> {
    let Ok(out) = fluxpipe()
        .args(["history", "--db", url, "--format", "json", "-c", "1000000"])
        .output()
    else {
        return Vec::new();
    };
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// The job rows, or none while the database is not made yet.
fn jobs_stored(url: &str) -> usize {
    fluxpipe()
        .args(["history", "--db", url, "--format", "json", "-c", "1000000"])
        .output()
        .map(|o| o.stdout.iter().filter(|&&b| b == b'\n').count())
        .unwrap_or(0)
}

/// A pipeline: files under `include` → the database; its API on `port`.
fn config(dir: &Path, tag: &str, url: &str, include: &[PathBuf], port: u16) -> PathBuf {
    let streams = r#"["jobs", "resources", "transitions"]"#;
    config_taking(dir, tag, url, include, port, streams)
}

/// As [`config`], the database sink taking `streams` (a TOML list).
fn config_taking(
    dir: &Path,
    tag: &str,
    url: &str,
    include: &[PathBuf],
    port: u16,
    streams: &str,
) -> PathBuf {
    let path = dir.join(format!("{tag}.toml"));
    let include: Vec<String> = include.iter().map(|p| format!("{p:?}")).collect();
    std::fs::write(
        &path,
        format!(
            r#"
data_dir = {data:?}
# One shard: its records follow the input's order, so two runs make the
# same ones. (With several, a drain's record says draining or not by
# which shard ran ahead; the states they end in agree.)
workers = 1
[checkpoint]
interval_secs = 0.2
[api]
address = "127.0.0.1:{port}"
[sources.files]
type = "file"
include = [{include}]
poll_interval_ms = 20
cluster = "gen"
[sinks.db]
type = "database"
url = "{url}"
inputs = {streams}
batch_max_records = 300
batch_timeout_ms = 50
"#,
            data = dir.join(format!("{tag}-data")),
            include = include.join(", "),
        ),
    )
    .expect("config");
    path
}

/// `fluxpipe run`, killed if the test ends before it does.
fn start(config: &Path, log: &Path) -> Reaper {
    let child = fluxpipe()
        .env("FLUXPIPE_LOG", "fluxpipe=info")
        .args(["run", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("spawn fluxpipe");
    Reaper(child)
}

/// Run until `want` jobs are stored, then stop cleanly.
fn run_to_the_end(config: &Path, log: &Path, url: &str, want: usize) {
    let mut child = start(config, log);
    let deadline = Instant::now() + Duration::from_secs(240);
    while jobs_stored(url) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    sigterm(&child.0);
    let status = child.0.wait().expect("wait");
    let log = std::fs::read_to_string(log).unwrap_or_default();
    assert!(status.success(), "fluxpipe exited with {status}: {log}");
    assert_eq!(jobs_stored(url), want, "jobs stored; log: {log}");
}

/// The input: a generated workload journal of `jobs` jobs (cluster `gen`).
fn inputs(dir: &Path, jobs: usize) -> Vec<PathBuf> {
    let journal = dir.join("workload.jsonl");
    common::generate(
        &["--nodes", "32", "--seed", "7", "--jobs", &jobs.to_string()],
        &journal,
    );
    vec![journal]
}

/// `fluxpipe replay`'s job records for the same inputs, as lines.
fn replayed_jobs(inputs: &[PathBuf]) -> Vec<String> {
    let mut lines: Vec<String> = replay(&["--cluster", "gen", "--no-alerts"], inputs)
        .into_iter()
        .filter(|r| r["kind"] == "job")
        .map(|r| r.to_string())
        .collect();
    lines.sort();
    lines
}

/// One backend: a clean run and a run SIGKILLed at random moments write the
/// same rows, and the jobs are `fluxpipe replay`'s.
fn killed_runs_store_every_job_once(dir: &Path, clean_url: &str, url: &str) {
    let jobs = if cfg!(debug_assertions) { 800 } else { 4000 };
    let inputs = inputs(dir, jobs);
    let want = replayed_jobs(&inputs);
    assert_eq!(want.len(), jobs);

    let started = Instant::now();
    let clean = config(dir, "clean", clean_url, &inputs, free_port());
    run_to_the_end(&clean, &dir.join("clean.log"), clean_url, jobs);
    let window = (started.elapsed().as_millis() as u64 / 2).max(400);
    assert_eq!(
        history(clean_url, &[]),
        want,
        "a clean run's jobs are replay's"
    );

    let killed = config(dir, "killed", url, &inputs, free_port());
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut progress = Vec::new();
    for kill in 0..5 {
        let mut child = start(&killed, &dir.join(format!("killed-{kill}.log")));
        let wait = if kill == 0 {
            300
        } else {
            200 + rng.next() % window
        };
        std::thread::sleep(Duration::from_millis(wait));
        child.0.kill().expect("SIGKILL");
        child.0.wait().expect("wait");
        progress.push(jobs_stored(url));
    }
    run_to_the_end(&killed, &dir.join("killed-end.log"), url, jobs);
    assert_eq!(
        history(url, &[]),
        want,
        "jobs after SIGKILLs (stored after each kill: {progress:?})"
    );
    assert!(
        progress.iter().any(|&p| 0 < p && p < jobs),
        "a kill came mid-stream (stored after each kill: {progress:?})"
    );
    for what in ["--nodes", "--transitions"] {
        let (a, b) = (history(clean_url, &[what]), history(url, &[what]));
        assert!(!a.is_empty(), "{what}: rows");
        let only_clean: Vec<_> = a.iter().filter(|r| !b.contains(r)).take(5).collect();
        let only_killed: Vec<_> = b.iter().filter(|r| !a.contains(r)).take(5).collect();
        assert!(
            only_clean.is_empty() && only_killed.is_empty() && a.len() == b.len(),
            "{what}: a killed run's rows are a clean run's; only in the clean run: \
             {only_clean:?}; only in the killed run: {only_killed:?}"
        );
    }
    // Filters answer as the records say.
    let failed = want
        .iter()
        .filter(|l| l.contains("\"result\":\"FAILED\""))
        .count();
    assert!(failed > 0);
    assert_eq!(history(url, &["--result", "failed"]).len(), failed);
    let first: serde_json::Value = serde_json::from_str(&want[0]).expect("json");
    let id = first["id"].as_u64().expect("id").to_string();
    assert_eq!(history(url, &[&id]), [want[0].clone()]);
    let host = first["nodelist"].as_str().map(|l| l.to_string());
    if let Some(host) = host.filter(|h| !h.contains(['[', ','])) {
        let on_host = history(url, &["--node", &host]);
        assert!(on_host.contains(&want[0]), "jobs on {host}");
        assert!(on_host.len() < want.len());
    }
}

#[test]
fn sqlite_killed_runs_store_every_job_once_as_replay_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = |n: &str| format!("sqlite://{}/{n}.db", dir.path().display());
    killed_runs_store_every_job_once(dir.path(), &url("clean"), &url("killed"));
}

#[test]
fn postgres_killed_runs_store_every_job_once_as_replay_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    let (clean, killed) = (pg.database("clean"), pg.database("killed"));
    killed_runs_store_every_job_once(dir.path(), &clean, &killed);
    grafana_panels_of_the_manual_answer(&killed);
}

/// The Grafana queries of the manual (docs/history.md), their macros
/// expanded as Grafana does for the whole of time, run on an archive: each
/// answers with rows.
fn grafana_panels_of_the_manual_answer(url: &str) {
    let page = std::fs::read_to_string(repo().join("docs/history.md")).expect("docs/history.md");
    let at = page
        .find("**Grafana.**")
        .expect("the Grafana part of docs/history.md");
    let block = &page[at..];
    let block = &block[block.find("```sql").expect("a SQL block") + 6..];
    let block = &block[..block.find("```").expect("the block's end")];
    let queries: Vec<String> = block
        .split(';')
        .map(|q| {
            q.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|q| !q.trim().is_empty())
        .map(|q| expand_grafana_macros(&q))
        .collect();
    assert_eq!(queries.len(), 4, "{block}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        for q in &queries {
            let rows = sqlx::query(sqlx::AssertSqlSafe(q.clone()))
                .fetch_all(&mut c)
                .await
                .unwrap_or_else(|e| panic!("{q}: {e}"));
            assert!(!rows.is_empty(), "no rows: {q}");
        }
    });
}

/// `$__unixEpochGroupAlias(col, 'N[hd]')` and `$__unixEpochFilter(col)`,
/// as Grafana's PostgreSQL data source expands them (over all of time).
fn expand_grafana_macros(q: &str) -> String {
    let mut out = q.to_string();
    for name in ["$__unixEpochGroupAlias(", "$__unixEpochFilter("] {
        while let Some(at) = out.find(name) {
            let args_at = at + name.len();
            let end = args_at + out[args_at..].find(')').expect("a closing parenthesis");
            let args: Vec<&str> = out[args_at..end].split(',').map(str::trim).collect();
            let text = if name.contains("Group") {
                let secs = match args[1] {
                    "'1h'" => 3600,
                    "'1d'" => 86400,
                    other => panic!("interval {other}"),
                };
                format!("floor({col} / {secs}) * {secs} AS \"time\"", col = args[0])
            } else {
                format!("{} BETWEEN 0 AND 4000000000", args[0])
            };
            out.replace_range(at..=end, &text);
        }
    }
    out
}

/// The fluxpipe_sink_errors_total of sink `db` on the API at `port`.
fn sink_errors(port: u16) -> f64 {
    let Some((200, body)) = http_get(port, "/metrics") else {
        return 0.0;
    };
    body.lines()
        .find(|l| l.starts_with("fluxpipe_sink_errors_total{") && l.contains("sink=\"db\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn postgres_down_for_a_while_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    let url = pg.database("outage");
    let jobs = 1500;
    let all = inputs(dir.path(), jobs);
    let want = replayed_jobs(&all);
    // The journal reaches the watched file in three parts: before, during
    // and after the outage.
    let text = std::fs::read_to_string(&all[0]).expect("journal");
    let lines: Vec<&str> = text.lines().collect();
    let thirds = lines.len() / 3;
    let feed = dir.path().join("feed.jsonl");
    let mut file = std::fs::File::create(&feed).expect("feed");
    let mut append = |part: &[&str]| {
        for l in part {
            writeln!(file, "{l}").expect("append");
        }
        file.flush().expect("flush");
    };
    append(&lines[..thirds]);
    let port = free_port();
    let cfg = config(
        dir.path(),
        "outage",
        &url,
        std::slice::from_ref(&feed),
        port,
    );
    let log = dir.path().join("outage.log");
    let mut child = start(&cfg, &log);
    wait_until("the first rows", 60, || jobs_stored(&url) > 0);
    pg.ctl("kill");
    append(&lines[thirds..2 * thirds]);
    wait_until("the outage to be counted", 60, || sink_errors(port) >= 2.0);
    std::thread::sleep(Duration::from_secs(2));
    pg.ctl("restart");
    append(&lines[2 * thirds..]);
    wait_until("every job stored", 120, || jobs_stored(&url) >= jobs);
    sigterm(&child.0);
    assert!(child.0.wait().expect("wait").success());
    assert_eq!(history(&url, &[]), want, "jobs after the outage");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log.contains("retrying until the database answers") && log.contains("answers again"),
        "the outage and its end are logged: {log}"
    );
}

/// The database down when the pipeline stops: it stops within the grace,
/// says what it left, exits non-zero, and the next run writes it all.
#[test]
fn postgres_down_at_shutdown_is_written_by_the_next_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    let url = pg.database("shutdown");
    let jobs = 600;
    let all = inputs(dir.path(), jobs);
    let want = replayed_jobs(&all);
    let text = std::fs::read_to_string(&all[0]).expect("journal");
    let lines: Vec<&str> = text.lines().collect();
    // Cut right after a submit: that job is NEW (it stays so until
    // validated, with no transition) and must have its row too.
    let half = 1 + lines[..lines.len() / 2]
        .iter()
        .rposition(|l| l.contains("\"name\":\"submit\""))
        .expect("a submit in the first half");
    let feed = dir.path().join("feed.jsonl");
    std::fs::write(&feed, lines[..half].join("\n") + "\n").expect("feed");
    let port = free_port();
    let cfg = config(
        dir.path(),
        "shutdown",
        &url,
        std::slice::from_ref(&feed),
        port,
    );
    let log = dir.path().join("shutdown.log");
    let mut child = start(&cfg, &log);
    wait_until("the first rows", 60, || jobs_stored(&url) > 0);
    pg.ctl("kill");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&feed)
        .expect("feed");
    writeln!(f, "{}", lines[half..].join("\n")).expect("append");
    wait_until("the outage to be counted", 60, || sink_errors(port) >= 1.0);
    let stopped = Instant::now();
    sigterm(&child.0);
    let status = child.0.wait().expect("wait");
    let took = stopped.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !status.success(),
        "records were left: not a clean stop: {text}"
    );
    assert!(
        took < Duration::from_secs(25),
        "stopping took {took:?}: {text}"
    );
    assert!(text.contains("records not delivered at shutdown"), "{text}");
    pg.ctl("restart");
    run_to_the_end(&cfg, &dir.path().join("after.log"), &url, jobs);
    assert_eq!(history(&url, &[]), want, "jobs after the next run");
}

/// A v1 archive (before `transitions`) holding a job, then `fluxpipe run`:
/// migrated at start, the old row kept, the new table written.
fn migrates_from_the_first_version(dir: &Path, url: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let old = r#"{"cluster":"old","id":1,"kind":"job","record_id":"r","state":"INACTIVE","t_inactive":1.0}"#;
    rt.block_on(async {
        let archive = fluxpipe::archive::Archive::connect(url, fluxpipe::archive::Access::Write)
            .await
            .expect("connect");
        archive.migrate_to(1).await.expect("v1");
        archive.close().await;
        // A row as the first version stored it (today's sink writes
        // columns that version has not).
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(url).await.expect("connect");
        sqlx::query(
            "INSERT INTO jobs (cluster, id, record_id, state, t_inactive, record) \
             VALUES ('old', 1, 'r', 'INACTIVE', 1.0, $1)",
        )
        .bind(old)
        .execute(&pool)
        .await
        .expect("a v1 row");
        pool.close().await;
    });
    let out = fluxpipe()
        .args(["history", "--db", url, "--transitions"])
        .output()
        .expect("history");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("transitions"),
        "a v1 archive has no transitions yet: {err}"
    );

    let jobs = 50;
    let inputs = inputs(dir, jobs);
    let cfg = config(dir, "migrate", url, &inputs, free_port());
    run_to_the_end(&cfg, &dir.join("migrate.log"), url, jobs + 1);
    assert!(history(url, &[]).contains(&old.to_string()));
    assert!(!history(url, &["--transitions"]).is_empty());
    // The old row is counted in the rollups the migration made, once.
    let port = free_port();
    let run_again = config(dir, "migrate-again", url, &inputs, port);
    let mut again = start(&run_again, &dir.join("again.log"));
    common::wait_until("the second run's API", 60, || {
        http_get(port, "/healthz").is_some_and(|(s, _)| s == 200)
    });
    sigterm(&again.0);
    assert!(again.0.wait().expect("wait").success());
    let rows = report_json(url, &["--by", "cluster", "--from", "rollups"]);
    let old_cluster: Vec<_> = rows.iter().filter(|r| r["cluster"] == "old").collect();
    assert_eq!(old_cluster.len(), 1, "{rows:?}");
    assert_eq!(old_cluster[0]["jobs"], 1);
    assert_same_rows(
        &report_json(url, &["--by", "cluster", "--from", "rows"]),
        &rows,
        true,
        "after the migration",
    );
}

#[test]
fn sqlite_first_version_is_migrated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/v1.db", dir.path().display());
    migrates_from_the_first_version(dir.path(), &url);
}

#[test]
fn postgres_first_version_is_migrated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    let url = pg.database("v1");
    migrates_from_the_first_version(dir.path(), &url);
}

/// `(id, state, t_run)` of job records, sorted.
fn states(records: &[String]) -> Vec<(u64, String, Option<f64>)> {
    let mut out: Vec<_> = records
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json");
            (
                v["id"].as_u64().expect("id"),
                v["state"].as_str().expect("state").to_string(),
                v["t_run"].as_f64(),
            )
        })
        .collect();
    out.sort_by_key(|a| a.0);
    out
}

/// With `job_updates`, every active job has its row, in the state replay
/// says it is in; the rest of the input ends them, and the rows become
/// replay's records (an update sent again never undoes an end).
fn active_jobs_have_rows_that_follow_them(dir: &Path, url: &str) {
    let journal = dir.join("whole.jsonl");
    common::generate(
        &["--nodes", "16", "--seed", "11", "--jobs", "300"],
        &journal,
    );
    let whole = std::fs::read_to_string(&journal).expect("journal");
    let lines: Vec<&str> = whole.lines().collect();
    // Cut right after a submit: that job is NEW (it stays so until
    // validated, with no transition) and must have its row too.
    let half = 1 + lines[..lines.len() / 2]
        .iter()
        .rposition(|l| l.contains("\"name\":\"submit\""))
        .expect("a submit in the first half");
    let input = dir.join("input").join("journal.jsonl");
    std::fs::create_dir_all(input.parent().expect("parent")).expect("mkdir");
    std::fs::write(&input, lines[..half].join("\n") + "\n").expect("first half");
    let first: Vec<String> = {
        let prefix = dir.join("prefix.jsonl");
        std::fs::copy(&input, &prefix).expect("copy");
        replayed_jobs(&[prefix])
    };
    let active = states(&first)
        .iter()
        .filter(|(_, s, _)| s != "INACTIVE")
        .count();
    assert!(active > 10, "the first half leaves jobs active ({active})");
    assert!(
        states(&first).iter().any(|(_, s, _)| s == "NEW"),
        "the cut leaves a job NEW"
    );
    let streams = r#"["jobs", "job_updates"]"#;
    let cfg = config_taking(
        dir,
        "active",
        url,
        std::slice::from_ref(&input),
        free_port(),
        streams,
    );
    let log = dir.join("active.log");
    let mut child = start(&cfg, &log);
    let want = states(&first);
    // Whether `done` holds within two minutes.
    let eventually = |done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !done() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        true
    };
    assert!(
        eventually(&|| states(&history_now(url)) == want),
        "rows after the first half: {:?}, replay: {want:?}; log: {}",
        states(&history_now(url)),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // The rest of the input: every job ends, each row replay's record.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&input)
        .expect("append");
    f.write_all((lines[half..].join("\n") + "\n").as_bytes())
        .expect("second half");
    drop(f);
    let whole_jobs = replayed_jobs(&[journal]);
    assert!(
        eventually(&|| history_now(url) == whole_jobs),
        "rows at the end are replay's; log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    sigterm(&child.0);
    assert!(child.0.wait().expect("wait").success());
}

#[test]
fn sqlite_active_jobs_have_rows_that_follow_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/active.db", dir.path().display());
    active_jobs_have_rows_that_follow_them(dir.path(), &url);
}

#[test]
fn postgres_active_jobs_have_rows_that_follow_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    let url = pg.database("active");
    active_jobs_have_rows_that_follow_them(dir.path(), &url);
}

/// Jobs of a KVS tree whose jobspec is missing, malformed or huge: each
/// still gets a row, with the fields the jobspec gives left out.
#[test]
fn jobs_with_a_bad_jobspec_still_get_a_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/bad.db", dir.path().display());
    let tree = dir.path().join("kvs");
    let src = common::corpus().join("jobs");
    let mut ids: Vec<String> = std::fs::read_dir(&src)
        .expect("corpus jobs")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .collect();
    ids.sort();
    let specs: [Option<Vec<u8>>; 3] = [
        None,
        Some(b"{\"version\": 1, \"resources\": [".to_vec()),
        Some(format!("{{\"attributes\": {{\"x\": \"{}\"}}}}", "y".repeat(2 << 20)).into_bytes()),
    ];
    for (id, spec) in ids.iter().zip(specs) {
        let job = tree.join(id);
        std::fs::create_dir_all(&job).expect("mkdir");
        if let Some(spec) = spec {
            std::fs::write(job.join("jobspec.json"), spec).expect("jobspec");
        }
        std::fs::copy(src.join(id).join("eventlog"), job.join("eventlog")).expect("eventlog");
    }
    let cfg = config(dir.path(), "bad", &url, &[tree.join("**/*")], free_port());
    run_to_the_end(&cfg, &dir.path().join("bad.log"), &url, 3);
    for line in history(&url, &[]) {
        let job: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(job["state"], "INACTIVE", "{line}");
        assert!(
            job.get("name").is_none() && job.get("ntasks").is_none(),
            "{line}"
        );
    }
}

/// A job's whole life as the forwarder sends it: `username` beside its
/// `submit` when `name` is given; its events `step` seconds apart, 4
/// cores on one node in its R.
fn job_lines_every(id: u64, uid: i64, name: Option<&str>, t: f64, step: f64) -> String {
    let events = [
        (
            "submit",
            format!(r#"{{"userid":{uid},"urgency":16,"flags":0,"version":1}}"#),
        ),
        ("validate", "{}".into()),
        ("depend", "{}".into()),
        ("priority", r#"{"priority":16}"#.into()),
        ("alloc", "{}".into()),
        ("start", "{}".into()),
        ("finish", r#"{"status":0}"#.into()),
        ("release", r#"{"ranks":"all","final":true}"#.into()),
        ("free", "{}".into()),
        ("clean", "{}".into()),
    ];
    let mut out = String::new();
    for (i, (event, context)) in events.iter().enumerate() {
        let extra = match (*event, name) {
            ("submit", Some(n)) => format!(r#","username":"{n}""#),
            ("alloc", _) => r#","R":{"version":1,"execution":{"R_lite":[{"rank":"0","children":{"core":"0-3"}}],"nodelist":["n0"]}}"#.to_string(),
            _ => String::new(),
        };
        out += &format!(
            r#"{{"id":{id},"events":[{{"timestamp":{},"name":"{event}","context":{context}}}]{extra}}}"#,
            t + i as f64 * step
        );
        out.push('\n');
    }
    out
}

fn job_lines(id: u64, uid: i64, name: Option<&str>, t: f64) -> String {
    job_lines_every(id, uid, name, t, 0.1)
}

/// `fluxpipe report jobs` over what the sink stored: per user, the hours
/// and waits of known jobs; JSON, CSV and the table.
fn report_from_the_archive(dir: &Path, url: &str) {
    let journal = dir.join("report.jsonl");
    // 2026-11-02 00:00 UTC; events an hour apart: each job waits 4 h
    // (submit to alloc) and runs 2 h (alloc to finish) on 4 cores.
    let d = 1_793_577_600.0;
    let lines = job_lines_every(21, 4242, Some("alice-flux"), d, 3600.0)
        + &job_lines_every(22, 4242, Some("alice-flux"), d + 86400.0, 3600.0)
        + &job_lines_every(23, 4243, Some("bob-flux"), d, 3600.0);
    std::fs::write(&journal, lines).expect("journal");
    // Rank 1 drained by a failed epilog for 300 s; rank 0 offline 300 s.
    let resource = dir.join("resource.jsonl");
    let ev = |t: f64, name: &str, context: &str| {
        format!(
            r#"{{"events":[{{"timestamp":{},"name":"{name}","context":{context}}}]}}"#,
            d + t
        ) + "\n"
    };
    let text = ev(
        1.0,
        "restart",
        r#"{"ranks":"0-1","online":"0-1","nodelist":"n[0-1]"}"#,
    ) + &ev(
        100.0,
        "drain",
        r#"{"idset":"1","nodelist":"n1","reason":"epilog failed for job f1","overwrite":0}"#,
    ) + &ev(400.0, "undrain", r#"{"idset":"1","nodelist":"n1"}"#)
        + &ev(500.0, "offline", r#"{"idset":"0"}"#)
        + &ev(800.0, "online", r#"{"idset":"0"}"#);
    std::fs::write(&resource, text).expect("resource journal");
    let cfg = config(
        dir,
        "report",
        url,
        &[journal.clone(), resource],
        free_port(),
    );
    run_to_the_end(&cfg, &dir.join("report.log"), url, 3);
    let report = |args: &[&str]| -> String {
        let out = fluxpipe()
            .args(["report", "jobs", "--db", url])
            .args(args)
            .output()
            .expect("report");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let rows: serde_json::Value =
        serde_json::from_str(&report(&["--by", "user", "--format", "json"])).expect("json");
    let alice = &rows[0];
    assert_eq!(alice["user"], "alice-flux", "{rows}");
    assert_eq!(alice["userid"], 4242);
    assert_eq!(alice["jobs"], 2);
    assert_eq!(alice["completed"], 2);
    assert_eq!(alice["core_hours"], 16.0, "{rows}");
    assert_eq!(alice["node_hours"], 4.0);
    assert_eq!(alice["wait_p50_s"], 14400.0);
    assert_eq!(alice["run_mean_s"], 7200.0);
    assert_eq!(rows[1]["user"], "bob-flux");
    // A window and days: alice's second job ended on the 3rd.
    let rows: serde_json::Value = serde_json::from_str(&report(&[
        "--by",
        "day",
        "--since",
        "2026-11-03T00:00:00Z",
        "--format",
        "json",
    ]))
    .expect("json");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!(rows[0]["day"], "2026-11-03");
    assert_eq!(rows[0]["jobs"], 1);
    let csv = report(&["--by", "cluster", "--format", "csv"]);
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .is_some_and(|h| h.starts_with("cluster,jobs,completed")),
        "{csv}"
    );
    assert!(
        lines.next().is_some_and(|l| l.starts_with("gen,3,3,")),
        "{csv}"
    );
    let table = report(&["--by", "cluster,user", "--sort", "core_hours"]);
    assert!(table.starts_with("CLUSTER USER"), "{table}");
    assert!(
        table
            .lines()
            .nth(2)
            .is_some_and(|l| l.contains("alice-flux")),
        "{table}"
    );

    // The drain report over the first 1000 s.
    let (since, until) = (d.to_string(), (d + 1000.0).to_string());
    let out = fluxpipe()
        .args([
            "report", "nodes", "--db", url, "--since", &since, "--until", &until,
        ])
        .args(["--format", "json"])
        .output()
        .expect("report nodes");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let (n1, n0) = (&rows[0], &rows[1]);
    assert_eq!(
        (&n1["node"], &n1["rank"]),
        (&serde_json::json!("n1"), &serde_json::json!(1)),
        "{rows}"
    );
    assert_eq!(n1["drains"], 1, "{rows}");
    assert_eq!(n1["drained_s"], 300.0, "{rows}");
    assert_eq!(n1["drains_after_epilog"], 1);
    assert_eq!(n1["last_drain_reason"], "epilog failed for job f1");
    assert_eq!(n0["node"], "n0", "{rows}");
    assert_eq!(n0["drains"], 0);
    assert_eq!(n0["offline_episodes"], 1, "{rows}");
    assert_eq!(n0["offline_s"], 300.0, "{rows}");
}

#[test]
fn sqlite_report_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/report.db", dir.path().display());
    report_from_the_archive(dir.path(), &url);
}

#[test]
fn postgres_report_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    let url = pg.database("report");
    report_from_the_archive(dir.path(), &url);
}

/// User names as Flux's side sent them: stored, asked for by `-u NAME`
/// in `history`, `jobs` and the API; jobs that came without one match by
/// this host's accounts (root is uid 0 everywhere), and a name from Flux
/// wins over them.
fn user_names_from_flux(dir: &Path, url: &str) {
    let journal = dir.join("users.jsonl");
    let lines = job_lines(11, 4242, Some("alice-flux"), 1000.0)
        + &job_lines(12, 0, Some("clusteradmin"), 1001.0)
        + &job_lines(13, 0, None, 1002.0);
    std::fs::write(&journal, lines).expect("journal");
    let port = free_port();
    let cfg = config(dir, "users", url, std::slice::from_ref(&journal), port);
    let log = dir.join("users.log");
    let mut child = start(&cfg, &log);
    wait_until("three job rows", 60, || jobs_stored(url) == 3);
    let api = format!("http://127.0.0.1:{port}");
    let ids = |out: Vec<String>| -> Vec<u64> {
        let mut ids: Vec<u64> = out
            .iter()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("json")["id"]
                    .as_u64()
                    .expect("id")
            })
            .collect();
        ids.sort();
        ids
    };
    let jobs = |user: &str| -> String {
        let out = fluxpipe()
            .args([
                "jobs",
                "-a",
                "-n",
                "--url",
                &api,
                "-u",
                user,
                "-o",
                "{id.dec} {username}",
            ])
            .output()
            .expect("jobs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };
    for (user, want) in [
        ("alice-flux", vec![11]),
        ("clusteradmin", vec![12]),
        // Flux said uid 0 of job 12 is clusteradmin: only job 13 is root's.
        ("root", vec![13]),
        ("0", vec![12, 13]),
        ("4242", vec![11]),
        ("nobody-at-all", vec![]),
    ] {
        assert_eq!(ids(history(url, &["-u", user])), want, "history -u {user}");
        let listed: Vec<u64> = jobs(user)
            .lines()
            .map(|l| {
                l.split_whitespace()
                    .next()
                    .expect("id")
                    .parse()
                    .expect("id")
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(listed, want, "jobs -u {user}");
    }
    // `{id.f58}` as flux prints it under FLUX_F58_FORCE_ASCII.
    let out = fluxpipe()
        .env("FLUX_F58_FORCE_ASCII", "1")
        .args(["jobs", "-a", "-n", "--url", &api, "-o", "{id.f58}"])
        .output()
        .expect("jobs");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        text.lines().count() == 3 && text.lines().all(|l| l.starts_with('f')),
        "{text}"
    );
    // The names shown: Flux's where sent, this host's where not.
    let shown = jobs("0");
    assert!(
        shown.contains("12 clusteradmin") && shown.contains("13 root"),
        "{shown}"
    );
    let (status, body) =
        http_get(port, "/api/v1/jobs?user=alice-flux&state=inactive").expect("api answers");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["jobs"][0]["username"], "alice-flux", "{body}");
    assert_eq!(v["jobs"].as_array().map(Vec::len), Some(1), "{body}");
    assert!(
        history(url, &[])
            .iter()
            .any(|l| l.contains(r#""username":"alice-flux""#))
    );
    sigterm(&child.0);
    let status = child.0.wait().expect("wait");
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn sqlite_user_names_from_flux() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/users.db", dir.path().display());
    user_names_from_flux(dir.path(), &url);
}

#[test]
fn postgres_user_names_from_flux() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    let url = pg.database("users");
    user_names_from_flux(dir.path(), &url);
}

/// One generated finished job: its record, and what a report should make
/// of it.
struct GeneratedJob {
    record: String,
    cluster: String,
    result: &'static str,
    core_seconds: f64,
    wait: Option<f64>,
}

/// A year of finished jobs on three clusters, from 2025-01-01 UTC: a few a
/// day each, of three queues and five users (one without a name from
/// Flux's side), some canceled before they ran.
fn a_generated_year() -> Vec<GeneratedJob> {
    let mut rng = XorShift(0x5eed_2025);
    let start = 1_735_689_600.0;
    let mut out = Vec::new();
    let mut id = 1u64;
    for day in 0..365 {
        for cluster in ["alpha", "beta", "gamma"] {
            for _ in 0..(rng.next() % 8) {
                id += 1;
                let t_submit = start + f64::from(day) * 86_400.0 + (rng.next() % 80_000) as f64;
                let ran = !rng.next().is_multiple_of(10);
                let wait = (rng.next() % 20_000) as f64 + (rng.next() % 1000) as f64 / 1000.0;
                let run = (rng.next() % 30_000) as f64 + 1.0;
                let ncores = 1 + rng.next() % 64;
                let nnodes = 1 + ncores / 16;
                let ngpus = rng.next() % 3;
                let user = rng.next() % 5;
                let queue = ["batch", "debug", "gpu"][(rng.next() % 3) as usize];
                let result = if !ran {
                    "CANCELED"
                } else {
                    ["COMPLETED", "COMPLETED", "FAILED", "TIMEOUT"][(rng.next() % 4) as usize]
                };
                let mut rec = serde_json::json!({
                    "cluster": cluster, "id": id, "kind": "job", "record_id": format!("r{id}"),
                    "state": "INACTIVE", "queue": queue, "userid": 5000 + user,
                    "result": result, "t_submit": t_submit,
                    "ncores": ncores, "nnodes": nnodes, "ngpus": ngpus,
                });
                if user != 4 {
                    rec["username"] = format!("user{user}").into();
                }
                let (t_run, t_cleanup) = (t_submit + wait, t_submit + wait + run);
                let t_inactive = if ran {
                    rec["t_run"] = t_run.into();
                    rec["t_cleanup"] = t_cleanup.into();
                    t_cleanup + 1.0
                } else {
                    t_run
                };
                rec["t_inactive"] = t_inactive.into();
                // As a report computes them from the times.
                out.push(GeneratedJob {
                    record: rec.to_string(),
                    cluster: cluster.to_string(),
                    result,
                    core_seconds: if ran {
                        ncores as f64 * (t_cleanup - t_run)
                    } else {
                        0.0
                    },
                    wait: ran.then_some(t_run - t_submit),
                });
            }
        }
    }
    out
}

/// `fluxpipe report jobs --db URL --format json ARGS`.
fn report_json(url: &str, args: &[&str]) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let out = fluxpipe()
        .args(["report", "jobs", "--db", url, "--format", "json"])
        .args(args)
        .output()
        .expect("report");
    assert!(
        out.status.success(),
        "report {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json rows")
}

/// Report rows equal: keys and counts exactly, sums to 1e-9 (summed in
/// another order); when `rounded`, `b`'s wait percentiles are `a`'s to 3
/// significant digits of milliseconds (`a` from rows, `b` from rollups).
fn assert_same_rows(
    a: &[serde_json::Map<String, serde_json::Value>],
    b: &[serde_json::Map<String, serde_json::Value>],
    rounded: bool,
    what: &str,
) {
    assert_eq!(a.len(), b.len(), "{what}: row counts");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            x.keys().collect::<Vec<_>>(),
            y.keys().collect::<Vec<_>>(),
            "{what}"
        );
        for (k, v) in x {
            let w = &y[k];
            match (v.as_f64(), w.as_f64()) {
                (Some(p), Some(q)) if k.starts_with("wait_p") && rounded => {
                    assert_eq!(bucket_of(p), q, "{what}: {k} in {x:?} vs {y:?}");
                }
                (Some(p), Some(q)) if !v.is_u64() => {
                    assert!(
                        (p - q).abs() <= 1e-9 * p.abs().max(1.0),
                        "{what}: {k} {p} vs {q}"
                    );
                }
                _ => assert_eq!(v, w, "{what}: {k} in {x:?} vs {y:?}"),
            }
        }
    }
}

/// A wait in seconds as rollups keep it: milliseconds to 3 significant
/// digits, rounded down.
fn bucket_of(seconds: f64) -> f64 {
    let mut ms = (seconds * 1000.0).round() as u64;
    let mut unit = 1;
    while ms / unit >= 1000 {
        unit *= 10;
    }
    ms -= ms % unit;
    ms as f64 / 1000.0
}

/// A generated year on three clusters, stored as the sink stores it (and
/// its first quarter stored again, as after a restart): rollups equal a
/// pass over the generated jobs and the report from the rows, before and
/// after the retention deletes half the rows. Returns the rollups' rows by
/// cluster, queue, user and month.
fn a_year_rolls_up(url: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    use fluxpipe::archive::{Access, Archive, rows::Batch};
    let year = a_generated_year();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let archive = rt.block_on(async {
        let archive = Archive::connect(url, Access::Write).await.expect("connect");
        archive.migrate().await.expect("migrate");
        archive
    });
    let started = Instant::now();
    let resent = &year[..year.len() / 4];
    for chunk in year.chunks(500).chain(resent.chunks(300)) {
        let mut batch = Batch::default();
        for job in chunk {
            let record = serde_json::from_str(&job.record).expect("a job record");
            batch
                .add(&fluxpipe::output::OutputRecord::job(record))
                .expect("a job row");
        }
        rt.block_on(archive.store(&batch, None)).expect("store");
    }
    eprintln!(
        "{} jobs stored with their rollups in {:?}",
        year.len(),
        started.elapsed()
    );

    // The totals per cluster, from the generated jobs themselves.
    let by_cluster = report_json(url, &["--by", "cluster", "--from", "rollups"]);
    assert_eq!(by_cluster.len(), 3);
    for row in &by_cluster {
        let cluster = row["cluster"].as_str().expect("cluster");
        let jobs: Vec<&GeneratedJob> = year.iter().filter(|j| j.cluster == cluster).collect();
        let count = |r: &str| jobs.iter().filter(|j| j.result == r).count() as u64;
        assert_eq!(row["jobs"], jobs.len() as u64, "{cluster}");
        for (field, result) in [
            ("completed", "COMPLETED"),
            ("failed", "FAILED"),
            ("canceled", "CANCELED"),
            ("timeout", "TIMEOUT"),
        ] {
            assert_eq!(row[field], count(result), "{cluster} {field}");
        }
        let core_hours: f64 = jobs.iter().map(|j| j.core_seconds).sum::<f64>() / 3600.0;
        let got = row["core_hours"].as_f64().expect("core_hours");
        assert!(
            (got - core_hours).abs() < 1e-6 * core_hours,
            "{got} {core_hours}"
        );
        let mut waits: Vec<f64> = jobs.iter().filter_map(|j| j.wait).collect();
        waits.sort_by(f64::total_cmp);
        let p90 = waits[(0.9 * waits.len() as f64).ceil() as usize - 1];
        assert_eq!(row["wait_p90_s"], bucket_of(p90), "{cluster}");
        assert_eq!(
            row["wait_max_s"],
            *waits.last().expect("waits"),
            "{cluster}"
        );
    }

    let by = ["--by", "cluster,queue,user,month"];
    let rows_report = |extra: &[&str]| {
        let mut args = by.to_vec();
        args.extend_from_slice(extra);
        report_json(url, &args)
    };
    let from_rows = rows_report(&["--from", "rows"]);
    let timed = Instant::now();
    let from_rollups = rows_report(&["--from", "rollups"]);
    eprintln!(
        "report by cluster, queue, user, month: {} rows from rollups in {:?}",
        from_rollups.len(),
        timed.elapsed()
    );
    assert_same_rows(&from_rows, &from_rollups, true, "rows vs rollups");
    // `auto` takes the rollups for whole days, the rows for other windows.
    assert_same_rows(&rows_report(&[]), &from_rollups, false, "auto");
    let window = [
        "--since",
        "2025-03-01T00:00:00Z",
        "--until",
        "2025-04-01T00:00:00Z",
    ];
    assert_same_rows(
        &rows_report(&[&window[..], &["--from", "rows"]].concat()),
        &rows_report(&window),
        true,
        "a month",
    );
    let odd = ["--since", "2025-03-01T12:00:00Z", "--by", "cluster"];
    let err = fluxpipe()
        .args(["report", "jobs", "--db", url, "--from", "rollups"])
        .args(odd)
        .output()
        .expect("report");
    assert!(!err.status.success(), "half a day from rollups");
    assert_eq!(
        report_json(url, &odd),
        report_json(url, &[&odd[..], &["--from", "rows"]].concat()),
        "auto reads rows for half a day"
    );

    // The retention deletes the first half of the year's rows: rollups
    // answer as before, the rows for what is left.
    let deleted = rt
        .block_on(archive.prune(1_735_689_600.0 + 182.0 * 86_400.0))
        .expect("prune");
    assert!(deleted > 0);
    rt.block_on(archive.close());
    assert_same_rows(
        &rows_report(&["--from", "rollups"]),
        &from_rollups,
        false,
        "rollups after the retention",
    );
    let left: u64 = report_json(url, &["--by", "", "--from", "rows"])[0]["jobs"]
        .as_u64()
        .expect("jobs");
    assert!(left < year.len() as u64 * 6 / 10, "{left} rows left");
    from_rollups
}

#[test]
fn sqlite_a_year_rolls_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/year.db", dir.path().display());
    a_year_rolls_up(&url);
}

/// As on SQLite, and the same rows as SQLite's.
#[test]
fn postgres_a_year_rolls_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    let on_postgres = a_year_rolls_up(&pg.database("year"));
    let url = format!("sqlite://{}/year.db", dir.path().display());
    let on_sqlite = a_year_rolls_up(&url);
    assert_same_rows(&on_sqlite, &on_postgres, false, "SQLite vs PostgreSQL");
}

/// Per rank, what a resource journal says of drains and outages, read
/// here on its own: drain episodes (a drain of an undrained rank starts
/// one), the reason of the last drain applied, seconds drained, outages
/// (an `offline`, or a `restart` the rank is not online in) and seconds
/// offline (over the whole journal, open ones to `end`).
#[derive(Debug, Default, PartialEq)]
struct JournalNode {
    drains: u64,
    last_reason: Option<String>,
    drained_s: f64,
    offline_episodes: u64,
    offline_s: f64,
}

fn journal_nodes(journal: &Path, end: f64) -> BTreeMap<i64, JournalNode> {
    use std::collections::btree_map::Entry;
    let ranks = |idset: &str| -> Vec<i64> {
        idset
            .split(',')
            .filter(|p| !p.is_empty())
            .flat_map(|p| match p.split_once('-') {
                Some((a, b)) => (a.parse().expect("rank")..=b.parse().expect("rank")).collect(),
                None => vec![p.parse().expect("rank")],
            })
            .collect()
    };
    let mut nodes: BTreeMap<i64, JournalNode> = BTreeMap::new();
    let mut drained_at: BTreeMap<i64, f64> = BTreeMap::new();
    let mut offline_at: BTreeMap<i64, f64> = BTreeMap::new();
    let text = std::fs::read_to_string(journal).expect("journal");
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a journal line");
        for e in v["events"].as_array().into_iter().flatten() {
            let t = e["timestamp"].as_f64().expect("timestamp");
            let c = &e["context"];
            // A restart: its ranks not online are offline until they join.
            if e["name"] == "restart" {
                let online = ranks(c["online"].as_str().unwrap_or(""));
                for rank in ranks(c["ranks"].as_str().unwrap_or("")) {
                    let n = nodes.entry(rank).or_default();
                    if online.contains(&rank) {
                        if let Some(at) = offline_at.remove(&rank) {
                            n.offline_s += t - at;
                        }
                    } else if let Entry::Vacant(at) = offline_at.entry(rank) {
                        at.insert(t);
                        n.offline_episodes += 1;
                    }
                }
            }
            let idset = c["idset"].as_str().unwrap_or("");
            for rank in ranks(idset) {
                let n = nodes.entry(rank).or_default();
                match e["name"].as_str() {
                    Some("drain") => {
                        if let Entry::Vacant(at) = drained_at.entry(rank) {
                            at.insert(t);
                            n.drains += 1;
                        }
                        n.last_reason = c["reason"].as_str().map(String::from);
                    }
                    Some("undrain") => {
                        if let Some(at) = drained_at.remove(&rank) {
                            n.drained_s += t - at;
                        }
                    }
                    Some("offline") if !offline_at.contains_key(&rank) => {
                        offline_at.insert(rank, t);
                        n.offline_episodes += 1;
                    }
                    Some("online") => {
                        if let Some(at) = offline_at.remove(&rank) {
                            n.offline_s += t - at;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    for (rank, at) in drained_at {
        nodes.entry(rank).or_default().drained_s += end - at;
    }
    for (rank, at) in offline_at {
        nodes.entry(rank).or_default().offline_s += end - at;
    }
    nodes.retain(|_, n| n.drains > 0 || n.offline_episodes > 0);
    nodes
}

/// `report nodes` over a real instance's resource journal (instance A's
/// first life: drains and undrains with every overwrite mode, a broker
/// killed and back) equals what the journal says, rank by rank; and no
/// rank is left drained, as flux's `resource.status` says at its end.
fn report_nodes_follows_a_real_journal(dir: &Path, url: &str) {
    let instance = common::corpus().join("instances/A-incarnation1");
    let journal = instance.join("resource.journal.jsonl");
    let status: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(instance.join("resource.status.rpc.json")).expect("status"),
    )
    .expect("status json");
    assert_eq!(status["drain"], serde_json::json!({}), "flux: none drained");
    let port = free_port();
    let cfg = config(dir, "instance-a", url, std::slice::from_ref(&journal), port);
    let mut child = start(&cfg, &dir.join("instance-a.log"));
    // Read to its end: the node changes stored stop growing.
    let changes = || {
        fluxpipe()
            .args(["history", "--db", url, "--nodes", "--format", "json"])
            .output()
            .map(|o| o.stdout.iter().filter(|&&b| b == b'\n').count())
            .unwrap_or(0)
    };
    let (mut last, mut steady) = (0, Instant::now());
    common::wait_until("every node change stored", 60, || {
        let now = changes();
        if now != last {
            (last, steady) = (now, Instant::now());
        }
        now > 0 && steady.elapsed() > Duration::from_secs(3)
    });
    sigterm(&child.0);
    assert!(child.0.wait().expect("wait").success());

    // Up to a minute past the journal's last event: open episodes (none)
    // would run to it.
    let end = std::fs::read_to_string(&journal)
        .expect("journal")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .flat_map(|v| {
            v["events"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|e| e["timestamp"].as_f64())
        })
        .fold(0.0, f64::max)
        + 60.0;
    let want = journal_nodes(&journal, end);
    assert!(
        want.values().any(|n| n.drains > 1),
        "the journal has repeated drains: {want:?}"
    );
    let out = fluxpipe()
        .args(["report", "nodes", "--db", url, "--format", "json"])
        .args(["--until", &end.to_string()])
        .output()
        .expect("report nodes");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    let got: BTreeMap<i64, JournalNode> = rows
        .iter()
        .map(|r| {
            let rank = r["rank"].as_i64().expect("rank");
            assert_eq!(r["node"], format!("node{rank}"), "{r}");
            let node = JournalNode {
                drains: r["drains"].as_u64().expect("drains"),
                last_reason: r["last_drain_reason"].as_str().map(String::from),
                drained_s: r["drained_s"].as_f64().expect("drained_s"),
                offline_episodes: r["offline_episodes"].as_u64().expect("offline"),
                offline_s: r["offline_s"].as_f64().expect("offline_s"),
            };
            (rank, node)
        })
        .collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (rank, w) in &want {
        let g = &got[rank];
        assert_eq!(
            (g.drains, &g.last_reason, g.offline_episodes),
            (w.drains, &w.last_reason, w.offline_episodes),
            "rank {rank}"
        );
        for (a, b) in [(g.drained_s, w.drained_s), (g.offline_s, w.offline_s)] {
            assert!((a - b).abs() < 1e-3, "rank {rank}: {g:?} vs {w:?}");
        }
    }
}

#[test]
fn sqlite_report_nodes_follows_a_real_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/a.db", dir.path().display());
    report_nodes_follows_a_real_journal(dir.path(), &url);
}

#[test]
fn postgres_report_nodes_follows_a_real_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(pg) = Postgres::start(&dir.path().join("pg")) else {
        return;
    };
    report_nodes_follows_a_real_journal(dir.path(), &pg.database("instance_a"));
}

/// The API and the status page read the past from the pipeline's own
/// archive: the last 24 h per cluster (`/api/v1/usage`, the page's strip)
/// and a node's drain history (`/api/v1/node_history`, its page, linked
/// from the drained nodes).
#[test]
fn the_api_and_page_show_the_last_day_and_a_nodes_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let url = format!("sqlite://{}/past.db", dir.display());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    // Three jobs end within the last day (each waits 240 s and runs 120 s
    // on 4 cores; one fails), one two days ago.
    let failed = job_lines_every(33, 4243, Some("bob-flux"), now - 7200.0, 60.0)
        .replace(r#""status":0"#, r#""status":256"#);
    let lines = job_lines_every(31, 4242, Some("alice-flux"), now - 36_000.0, 60.0)
        + &job_lines_every(32, 4242, Some("alice-flux"), now - 3600.0, 60.0)
        + &failed
        + &job_lines_every(34, 4242, Some("alice-flux"), now - 2.0 * 86_400.0, 60.0);
    let journal = dir.join("jobs.jsonl");
    std::fs::write(&journal, lines).expect("journal");
    let ev = |t: f64, name: &str, context: &str| {
        format!(
            r#"{{"events":[{{"timestamp":{},"name":"{name}","context":{context}}}]}}"#,
            now - t
        ) + "\n"
    };
    let resource = dir.join("resource.jsonl");
    let text = ev(
        10_800.0,
        "restart",
        r#"{"ranks":"0-1","online":"0-1","nodelist":"n[0-1]"}"#,
    ) + &ev(
        7200.0,
        "drain",
        r#"{"idset":"1","nodelist":"n1","reason":"bad dimm","overwrite":0}"#,
    ) + &ev(3600.0, "undrain", r#"{"idset":"1","nodelist":"n1"}"#)
        + &ev(
            1800.0,
            "drain",
            r#"{"idset":"1","nodelist":"n1","reason":"epilog failed for job f2","overwrite":0}"#,
        );
    std::fs::write(&resource, text).expect("resource journal");
    let port = free_port();
    let cfg = config(dir, "past", &url, &[journal, resource], port);
    let mut child = start(&cfg, &dir.join("past.log"));
    wait_until("every job stored", 60, || jobs_stored(&url) == 4);
    let get = |path: &str| -> (u16, String) {
        http_get(port, path).unwrap_or_else(|| panic!("{path}: no answer"))
    };
    let json = |path: &str| -> serde_json::Value {
        let (status, body) = get(path);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).expect("json")
    };
    let day = json("/api/v1/usage");
    let row = &day["clusters"][0];
    assert_eq!(row["cluster"], "gen", "{day}");
    assert_eq!(
        (&row["jobs"], &row["completed"], &row["failed"]),
        (&3.into(), &2.into(), &1.into()),
        "{day}"
    );
    let hours = row["core_hours"].as_f64().expect("core_hours");
    assert!((hours - 3.0 * 4.0 * 120.0 / 3600.0).abs() < 1e-9, "{day}");
    assert_eq!(row["wait_p50_s"], 240.0);
    assert_eq!(json("/api/v1/usage?hours=72")["clusters"][0]["jobs"], 4);
    assert_eq!(
        json("/api/v1/usage?cluster=other")["clusters"],
        serde_json::json!([])
    );

    let history = json("/api/v1/node_history?cluster=gen&host=n1");
    let reasons: Vec<Option<&str>> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["event"] != "restart")
        .map(|e| e["drain_reason"].as_str())
        .collect();
    assert_eq!(
        reasons.first().copied().flatten(),
        Some("bad dimm"),
        "{history}"
    );
    assert_eq!(
        reasons.last().copied().flatten(),
        Some("epilog failed for job f2"),
        "{history}"
    );

    let (status, page) = get("/");
    assert_eq!(status, 200);
    assert!(
        page.contains(r#"data-jobs="3" data-completed="2" data-failed="1""#),
        "{page}"
    );
    assert!(page.contains(r#"href="/nodes/gen/n1""#), "{page}");
    let (status, node) = get("/nodes/gen/n1");
    assert_eq!(status, 200);
    assert!(
        node.contains("bad dimm") && node.contains(r#"data-event="undrain""#),
        "{node}"
    );
    sigterm(&child.0);
    assert!(child.0.wait().expect("wait").success());

    // A pipeline without an archive says so.
    let bare = dir.join("bare.toml");
    let port = free_port();
    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "").expect("empty input");
    std::fs::write(
        &bare,
        format!(
            "data_dir = {:?}\n[api]\naddress = \"127.0.0.1:{port}\"\n\
             [sources.none]\ntype = \"file\"\ninclude = [{empty:?}]\ncluster = \"gen\"\n",
            dir.join("bare-data")
        ),
    )
    .expect("config");
    let mut child = start(&bare, &dir.join("bare.log"));
    wait_until("the API", 30, || http_get(port, "/healthz").is_some());
    let (status, body) = http_get(port, "/api/v1/usage").expect("answer");
    assert_eq!(status, 404, "{body}");
    assert!(!http_get(port, "/").expect("page").1.contains("last 24 h"));
    sigterm(&child.0);
    assert!(child.0.wait().expect("wait").success());
}

/// `report jobs --by queue` and `--by user` over instance B's journals
/// (both lives) equal what the fields of its `flux jobs -a --json` imply,
/// from the rows and from the rollups.
#[test]
fn report_jobs_equals_what_flux_jobs_says_of_instance_b() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let url = format!("sqlite://{}/b.db", dir.display());
    let b = common::corpus().join("instances/B");
    let flux: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(b.join("flux-jobs-a.json")).expect("flux jobs"),
    )
    .expect("json");
    let flux = flux["jobs"].as_array().expect("jobs");
    let journals: Vec<PathBuf> = ["incarnation1", "incarnation2"]
        .iter()
        .map(|i| b.join(format!("journals/{i}.job-manager.events-journal.jsonl")))
        .collect();
    let cfg = config(dir, "b", &url, &journals, free_port());
    run_to_the_end(&cfg, &dir.join("b.log"), &url, flux.len());

    // What flux's own fields imply, for the one group B has (no queue,
    // one user).
    let f = |j: &serde_json::Value, k: &str| j[k].as_f64().unwrap_or(0.0);
    let ran: Vec<&serde_json::Value> = flux
        .iter()
        .filter(|j| f(j, "t_run") > 0.0 && f(j, "t_cleanup") >= f(j, "t_run"))
        .collect();
    let mut waits: Vec<f64> = flux
        .iter()
        .filter(|j| f(j, "t_run") > 0.0 && f(j, "t_run") >= f(j, "t_submit"))
        .map(|j| f(j, "t_run") - f(j, "t_submit"))
        .collect();
    waits.sort_by(f64::total_cmp);
    let rank = |p: f64| waits[((p * waits.len() as f64).ceil() as usize).clamp(1, waits.len()) - 1];
    let count = |r: &str| flux.iter().filter(|j| j["result"] == r).count() as u64;
    let core_s: f64 = ran
        .iter()
        .map(|j| f(j, "ncores") * (f(j, "t_cleanup") - f(j, "t_run")))
        .sum();
    let node_s: f64 = ran
        .iter()
        .map(|j| f(j, "nnodes") * (f(j, "t_cleanup") - f(j, "t_run")))
        .sum();
    assert!(waits.len() > 10 && count("CANCELED") > 0 && count("TIMEOUT") > 0);
    for by in ["queue", "user"] {
        for from in ["rows", "rollups"] {
            let rows = report_json(&url, &["--by", by, "--from", from]);
            assert_eq!(rows.len(), 1, "{by} {from}: {rows:?}");
            let row = &rows[0];
            let what = format!("--by {by} --from {from}: {row:?}");
            if by == "user" {
                assert_eq!(row["user"], flux[0]["username"], "{what}");
                assert_eq!(row["userid"], flux[0]["userid"], "{what}");
            } else {
                assert_eq!(row["queue"], serde_json::Value::Null, "{what}");
            }
            assert_eq!(row["jobs"], flux.len() as u64, "{what}");
            for (field, result) in [
                ("completed", "COMPLETED"),
                ("failed", "FAILED"),
                ("canceled", "CANCELED"),
                ("timeout", "TIMEOUT"),
            ] {
                assert_eq!(row[field], count(result), "{what}");
            }
            let close = |k: &str, want: f64| {
                let got = row[k].as_f64().unwrap_or(f64::NAN);
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{k}: {what}"
                );
            };
            close("core_hours", core_s / 3600.0);
            close("node_hours", node_s / 3600.0);
            close("wait_max_s", *waits.last().expect("waits"));
            close(
                "wait_mean_s",
                waits.iter().sum::<f64>() / waits.len() as f64,
            );
            let (p50, p90) = if from == "rows" {
                (rank(0.5), rank(0.9))
            } else {
                (bucket_of(rank(0.5)), bucket_of(rank(0.9)))
            };
            close("wait_p50_s", p50);
            close("wait_p90_s", p90);
        }
    }
}
