//! The job archive: a SQL database (SQLite or PostgreSQL, through sqlx's
//! `Any` driver) that keeps every job's record when it ends, every change
//! of a node's state, and (when asked) every transition; written by the
//! `database` sink, read by `fluxpipe history` and by whatever a site
//! points at it (Grafana).
//!
//! Writes are idempotent by key: a record written again after a restart
//! changes nothing. One batch is one transaction.

pub mod report;
pub mod rollup;
mod rollup_store;
pub mod rows;
pub mod schema;

use crate::flux::user::UserMatch;
use rows::{Batch, Cell, Table};
use sqlx::any::{AnyArguments, AnyPoolOptions};
use sqlx::query::Query;
use sqlx::{Any, AnyPool, AssertSqlSafe, Row};
use std::path::Path;
use std::time::Duration;

/// What went wrong with the archive.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("`{0}`: the database URL must start with sqlite:, postgres: or postgresql:")]
    Url(String),
    #[error("cannot create the folder of the SQLite database {path}: {source}")]
    Folder {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error("schema migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl ArchiveError {
    /// Whether this looks like the database being away, busy or out of
    /// room (it will pass), rather than a fault someone must mend (a wrong
    /// password, a missing database, a schema this fluxpipe does not know).
    /// The sink retries both; only the words it logs differ.
    pub fn is_outage(&self) -> bool {
        use sqlx::migrate::MigrateError;
        let sql = match self {
            ArchiveError::Url(_) | ArchiveError::Folder { .. } => return false,
            ArchiveError::Sql(e)
            | ArchiveError::Migrate(MigrateError::Execute(e))
            | ArchiveError::Migrate(MigrateError::ExecuteMigration(e, _)) => e,
            ArchiveError::Migrate(_) => return false,
        };
        match sql {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|c| outage_code(&c)),
            _ => false,
        }
    }
}

/// A server's error code that means "not now": PostgreSQL's SQLSTATE
/// classes 08 (connection), 53 (out of resources), 57P0x (shutting down,
/// starting), 40001/40P01 (serialization, deadlock), 55P03 (lock); SQLite's
/// BUSY, LOCKED, IOERR, FULL and CANTOPEN (primary codes, under any
/// extended one).
/// (SQLSTATEs are five characters; SQLite's codes, extended ones
/// included, at most four digits.)
fn outage_code(code: &str) -> bool {
    if code.len() == 5 {
        return code.starts_with("08")
            || code.starts_with("53")
            || code.starts_with("57P0")
            || matches!(code, "40001" | "40P01" | "55P03");
    }
    code.parse::<u32>()
        .is_ok_and(|n| matches!(n & 0xff, 5 | 6 | 10 | 13 | 14))
}

/// Most bound values in one statement: below SQLite's limit (32766) and
/// PostgreSQL's (65535).
const MAX_BINDS: usize = 30_000;

/// How long a connection may be waited for before the attempt fails (and
/// the sink retries).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected archive.
#[derive(Debug, Clone)]
pub struct Archive {
    pool: AnyPool,
    sqlite: bool,
}

/// The database a URL names.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Postgres,
    /// A SQLite file, and the URL's query (`mode=…`), if any.
    Sqlite {
        path: &'a str,
        query: &'a str,
    },
}

fn target(url: &str) -> Result<Target<'_>, ArchiveError> {
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        return Ok(Target::Postgres);
    }
    let bad = || ArchiveError::Url(url.to_string());
    let rest = url.strip_prefix("sqlite:").ok_or_else(bad)?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() || path == ":memory:" {
        return Err(bad());
    }
    Ok(Target::Sqlite { path, query })
}

/// Whether `url` names a database the archive can use (without
/// connecting).
pub fn check_url(url: &str) -> Result<(), ArchiveError> {
    target(url).map(|_| ())
}

/// How the archive is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The sink: a SQLite file (and its folder) is made when missing.
    Write,
    /// `fluxpipe history`: nothing is made or changed.
    Read,
}

/// The URL sqlx is given: a SQLite file's mode set (unless the URL sets
/// it), and for writing its folder made.
fn prepared_url(url: &str, access: Access) -> Result<String, ArchiveError> {
    let Target::Sqlite { path, query } = target(url)? else {
        return Ok(url.to_string());
    };
    if access == Access::Write
        && let Some(folder) = Path::new(path)
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(folder).map_err(|source| ArchiveError::Folder {
            path: path.to_string(),
            source,
        })?;
    }
    let mode = match access {
        Access::Write => "mode=rwc",
        Access::Read => "mode=ro",
    };
    Ok(if query.contains("mode=") {
        url.to_string()
    } else if query.is_empty() {
        format!("{url}?{mode}")
    } else {
        format!("{url}&{mode}")
    })
}

impl Archive {
    /// Connect. Does not migrate.
    pub async fn connect(url: &str, access: Access) -> Result<Self, ArchiveError> {
        sqlx::any::install_default_drivers();
        let sqlite = matches!(target(url)?, Target::Sqlite { .. });
        let url = prepared_url(url, access)?;
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(&url)
            .await?;
        Ok(Archive { pool, sqlite })
    }

    /// Bring the schema up to the latest version.
    pub async fn migrate(&self) -> Result<(), ArchiveError> {
        self.migrate_to(schema::LATEST).await
    }

    /// Bring the schema up to `version` (tests start from an old one).
    pub async fn migrate_to(&self, version: i64) -> Result<(), ArchiveError> {
        if self.sqlite {
            // Readers (history, Grafana) then never wait for a commit, nor
            // it for them. Kept in the file once set.
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&self.pool)
                .await?;
        }
        schema::migrator(version).run(&self.pool).await?;
        Ok(())
    }

    /// Write a batch's rows in one transaction: all of them or none, with
    /// its jobs that finished counted in their rollups (but those that
    /// ended before `not_before`: see [`Archive::roll_up_pending`]).
    pub async fn store(&self, batch: &Batch, not_before: Option<f64>) -> Result<(), ArchiveError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for (table, rows) in batch.tables() {
            let per_statement = (MAX_BINDS / table.columns.len()).max(1);
            for chunk in rows.rows().chunks(per_statement) {
                // Not a prepared statement kept for reuse: sqlx's `Any`
                // gives a NULL double another type than a double (0.9), and
                // PostgreSQL refuses a kept statement's parameter whose type
                // changed between batches.
                let mut query =
                    sqlx::query(AssertSqlSafe(insert_sql(table, chunk.len(), self.marks())))
                        .persistent(false);
                for cell in chunk.iter().flatten() {
                    query = bind(query, cell);
                }
                query.execute(&mut *tx).await?;
            }
        }
        rollup_store::roll_up_jobs(&mut tx, &batch.finished_jobs(), not_before, self.marks())
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Delete what ended (jobs) or happened (events) before `cutoff`
    /// (seconds since the epoch); the rows deleted.
    pub async fn prune(&self, cutoff: f64) -> Result<u64, ArchiveError> {
        const DELETES: [&str; 4] = [
            "DELETE FROM job_nodes WHERE EXISTS (SELECT 1 FROM jobs \
             WHERE jobs.cluster = job_nodes.cluster AND jobs.id = job_nodes.id \
             AND jobs.t_inactive < $1)",
            "DELETE FROM jobs WHERE t_inactive < $1",
            "DELETE FROM node_events WHERE timestamp < $1",
            "DELETE FROM transitions WHERE timestamp < $1",
        ];
        let mut tx = self.pool.begin().await?;
        let mut deleted = 0;
        for sql in DELETES {
            deleted += sqlx::query(sql)
                .bind(cutoff)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(deleted)
    }

    /// The records of the jobs `q` asks for: active ones first (as `flux
    /// jobs` lists them), then newest end first.
    pub async fn jobs(&self, q: &JobQuery) -> Result<Vec<String>, ArchiveError> {
        let mut w = Where::default();
        w.equal("j.cluster", q.cluster.clone().map(|c| Cell::Text(Some(c))));
        if let Some(u) = &q.user {
            user_clause(&mut w, "j", u);
        }
        w.equal("j.queue", q.queue.clone().map(|c| Cell::Text(Some(c))));
        let results = q.results.iter().map(|r| Cell::Text(Some(r.clone())));
        w.any_of("j.result", results);
        w.any_of(
            "j.id",
            q.ids.iter().map(|id| Cell::Int(Some(rows::stored_id(*id)))),
        );
        // A job belongs to a window it overlaps: submitted before its end,
        // ended after its start (or not ended: an active job's row).
        if let Some(since) = q.since {
            let p = w.bind(Cell::Float(Some(since)));
            w.clause(format!("(j.t_inactive >= {p} OR j.t_inactive IS NULL)"));
        }
        if let Some(until) = q.until {
            let p = w.bind(Cell::Float(Some(until)));
            w.clause(format!("j.t_submit < {p}"));
        }
        if let Some(host) = &q.host {
            let p = w.bind(Cell::Text(Some(host.clone())));
            w.clause(format!(
                "EXISTS (SELECT 1 FROM job_nodes n WHERE n.cluster = j.cluster \
                 AND n.id = j.id AND n.hostname = {p})"
            ));
        }
        let sql = format!(
            "SELECT j.record FROM jobs j{} \
             ORDER BY (j.t_inactive IS NULL) DESC, j.t_inactive DESC, j.cluster, j.id LIMIT {}",
            w.text(),
            w.limit(q.limit)
        );
        let found = w.query(&sql).fetch_all(&self.pool).await?;
        Ok(found
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?)
    }

    /// The jobs that ended in `q`'s window, one by one to `each` (a
    /// report keeps its groups, not the rows); how many there were.
    pub async fn finished_jobs(
        &self,
        q: &ReportQuery,
        mut each: impl FnMut(report::FinishedJob),
    ) -> Result<u64, ArchiveError> {
        use futures_util::TryStreamExt;
        let mut w = Where::default();
        w.clause("j.t_inactive IS NOT NULL".into());
        q.clauses(&mut w, "j", "t_inactive");
        let sql = format!(
            "SELECT {} FROM jobs j{}",
            rollup_store::FINISHED_COLUMNS,
            w.text()
        );
        let query = w.query(&sql);
        let mut rows = query.fetch(&self.pool);
        let mut n = 0;
        while let Some(row) = rows.try_next().await? {
            each(rollup_store::finished_job(&row)?);
            n += 1;
        }
        Ok(n)
    }

    /// The node changes before `until` (of `cluster`, if given), in time
    /// order per node, one by one to `each`; how many there were.
    pub async fn node_changes(
        &self,
        cluster: Option<&str>,
        until: f64,
        mut each: impl FnMut(report::NodeChange),
    ) -> Result<u64, ArchiveError> {
        use futures_util::TryStreamExt;
        let mut w = Where::default();
        w.clause("e.timestamp IS NOT NULL".into());
        w.equal(
            "e.cluster",
            cluster.map(|c| Cell::Text(Some(c.to_string()))),
        );
        let p = w.bind(Cell::Float(Some(until)));
        w.clause(format!("e.timestamp < {p}"));
        // Booleans as integers: SQLite keeps them so, and sqlx's `Any`
        // reads an integer from both.
        let flag =
            |c: &str| format!("CAST(CASE WHEN e.{c} THEN 1 WHEN NOT e.{c} THEN 0 END AS BIGINT)");
        let sql = format!(
            "SELECT e.cluster, e.rank, e.hostname, e.timestamp, {}, {}, e.drain_reason \
             FROM node_events e{} ORDER BY e.cluster, e.rank, e.timestamp, e.record_id",
            flag("drained"),
            flag("online"),
            w.text()
        );
        let query = w.query(&sql);
        let mut rows = query.fetch(&self.pool);
        let mut n = 0;
        while let Some(row) = rows.try_next().await? {
            let flag = |i: usize| -> Result<Option<bool>, sqlx::Error> {
                Ok(row.try_get::<Option<i64>, _>(i)?.map(|v| v != 0))
            };
            each(report::NodeChange {
                cluster: row.try_get::<Option<String>, _>(0)?.unwrap_or_default(),
                rank: row.try_get::<Option<i64>, _>(1)?.unwrap_or(-1),
                hostname: row.try_get(2)?,
                timestamp: row.try_get::<Option<f64>, _>(3)?.unwrap_or(0.0),
                drained: flag(4)?,
                online: flag(5)?,
                drain_reason: row.try_get(6)?,
            });
            n += 1;
        }
        Ok(n)
    }

    /// The records of the node state changes `q` asks for: the newest,
    /// in the order they happened (changes of no known time first).
    pub async fn node_events(&self, q: &EventQuery) -> Result<Vec<String>, ArchiveError> {
        let mut w = Where::default();
        q.common(&mut w, "e.cluster", "e.timestamp");
        w.equal("e.hostname", q.host.clone().map(|h| Cell::Text(Some(h))));
        let sql = format!(
            "SELECT e.record FROM node_events e{} \
             ORDER BY (e.timestamp IS NULL), e.timestamp DESC, e.cluster DESC, e.rank DESC, \
             e.record_id DESC LIMIT {}",
            w.text(),
            w.limit(q.limit)
        );
        let found = w.query(&sql).fetch_all(&self.pool).await?;
        found
            .iter()
            .rev()
            .map(|row| Ok(row.try_get::<String, _>(0)?))
            .collect()
    }

    /// The transitions `q` asks for (of its jobs, when it names some), as
    /// `transitions` records: the newest, in the order they happened (of
    /// one time, in the order of the states).
    pub async fn transitions(&self, q: &EventQuery) -> Result<Vec<String>, ArchiveError> {
        let mut w = Where::default();
        q.common(&mut w, "t.cluster", "t.timestamp");
        w.any_of(
            "t.id",
            q.ids.iter().map(|id| Cell::Int(Some(rows::stored_id(*id)))),
        );
        let sql = format!(
            "SELECT t.cluster, t.record_id, t.id, t.from_state, t.to_state, t.event, t.timestamp \
             FROM transitions t{} ORDER BY t.timestamp DESC, t.cluster DESC, t.id DESC, \
             CASE t.to_state WHEN 'NEW' THEN 0 WHEN 'DEPEND' THEN 1 WHEN 'PRIORITY' THEN 2 \
             WHEN 'SCHED' THEN 3 WHEN 'RUN' THEN 4 WHEN 'CLEANUP' THEN 5 ELSE 6 END DESC \
             LIMIT {}",
            w.text(),
            w.limit(q.limit)
        );
        let found = w.query(&sql).fetch_all(&self.pool).await?;
        found
            .iter()
            .rev()
            .map(|row| {
                let text = |i: usize| row.try_get::<Option<String>, _>(i);
                let id: i64 = row.try_get(2)?;
                Ok(serde_json::json!({
                    "cluster": text(0)?,
                    "event": text(5)?,
                    "from": text(3)?,
                    "id": rows::job_id(id),
                    "kind": "transition",
                    "record_id": text(1)?,
                    "timestamp": row.try_get::<f64, _>(6)?,
                    "to": text(4)?,
                })
                .to_string())
            })
            .collect()
    }

    /// How this database's statements of many values mark them.
    fn marks(&self) -> Marks {
        if self.sqlite {
            Marks::InOrder
        } else {
            Marks::Numbered
        }
    }

    /// Close the connections.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// `-u`'s clause over the table `t` (jobs, rollups).
fn user_clause(w: &mut Where, t: &str, user: &UserMatch) {
    match user {
        UserMatch::Id(uid) => w.equal(&format!("{t}.userid"), Some(Cell::Int(Some(*uid)))),
        UserMatch::Name { name, fallback_uid } => {
            let n = w.bind(Cell::Text(Some(name.to_string())));
            match fallback_uid {
                // Rows without a name from Flux's side match by the name's
                // uid in this host's accounts.
                Some(uid) => {
                    let u = w.bind(Cell::Int(Some(*uid)));
                    w.clause(format!(
                        "({t}.username = {n} OR ({t}.username IS NULL AND {t}.userid = {u}))"
                    ));
                }
                None => w.clause(format!("{t}.username = {n}")),
            }
        }
    }
}

/// The finished jobs a report reads.
#[derive(Debug, Clone, Default)]
pub struct ReportQuery {
    pub cluster: Option<String>,
    pub queue: Option<String>,
    pub user: Option<UserMatch>,
    /// Jobs that ended at or after this time.
    pub since: Option<f64>,
    /// Jobs that ended before this time.
    pub until: Option<f64>,
}

impl ReportQuery {
    /// Its clauses over the table `t` (jobs, rollups), whose time column
    /// is `time` (a job's end, a rollup's day).
    fn clauses(&self, w: &mut Where, t: &str, time: &str) {
        w.equal(
            &format!("{t}.cluster"),
            self.cluster.clone().map(|c| Cell::Text(Some(c))),
        );
        w.equal(
            &format!("{t}.queue"),
            self.queue.clone().map(|c| Cell::Text(Some(c))),
        );
        if let Some(u) = &self.user {
            user_clause(w, t, u);
        }
        w.window(&format!("{t}.{time}"), self.since, self.until);
    }
}

/// The jobs `fluxpipe history` asks for.
#[derive(Debug, Clone, Default)]
pub struct JobQuery {
    pub cluster: Option<String>,
    pub user: Option<UserMatch>,
    pub queue: Option<String>,
    /// Results (`COMPLETED`, `FAILED`, `CANCELED`, `TIMEOUT`), any of them.
    pub results: Vec<String>,
    pub ids: Vec<u64>,
    /// Jobs that ended at or after this time.
    pub since: Option<f64>,
    /// Jobs submitted before this time.
    pub until: Option<f64>,
    /// Jobs that ran on this host.
    pub host: Option<String>,
    pub limit: usize,
}

/// The node state changes or transitions `fluxpipe history` asks for.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    pub cluster: Option<String>,
    pub since: Option<f64>,
    pub until: Option<f64>,
    pub host: Option<String>,
    pub ids: Vec<u64>,
    pub limit: usize,
}

impl EventQuery {
    fn common(&self, w: &mut Where, cluster: &str, time: &str) {
        w.equal(cluster, self.cluster.clone().map(|c| Cell::Text(Some(c))));
        w.window(time, self.since, self.until);
    }
}

/// A `WHERE` clause and its bound values (`$1`, `$2`… in both SQLite and
/// PostgreSQL).
#[derive(Debug, Default)]
struct Where {
    clauses: Vec<String>,
    binds: Vec<Cell>,
}

impl Where {
    fn bind(&mut self, cell: Cell) -> String {
        self.binds.push(cell);
        format!("${}", self.binds.len())
    }

    fn clause(&mut self, c: String) {
        self.clauses.push(c);
    }

    /// `column = value`, when there is a value.
    fn equal(&mut self, column: &str, value: Option<Cell>) {
        if let Some(v) = value {
            let p = self.bind(v);
            self.clause(format!("{column} = {p}"));
        }
    }

    /// `since <= column < until`, each end when given.
    fn window(&mut self, column: &str, since: Option<f64>, until: Option<f64>) {
        if let Some(since) = since {
            let p = self.bind(Cell::Float(Some(since)));
            self.clause(format!("{column} >= {p}"));
        }
        if let Some(until) = until {
            let p = self.bind(Cell::Float(Some(until)));
            self.clause(format!("{column} < {p}"));
        }
    }

    /// `column IN (values)`, when there are values.
    fn any_of(&mut self, column: &str, values: impl Iterator<Item = Cell>) {
        let ps: Vec<String> = values.map(|v| self.bind(v)).collect();
        if !ps.is_empty() {
            self.clause(format!("{column} IN ({})", ps.join(", ")));
        }
    }

    /// The placeholder of a `LIMIT`.
    fn limit(&mut self, n: usize) -> String {
        self.bind(Cell::Int(Some(i64::try_from(n).unwrap_or(i64::MAX))))
    }

    /// `sql` with the values bound.
    fn query<'q>(&self, sql: &str) -> Query<'q, Any, AnyArguments> {
        let mut query = sqlx::query(AssertSqlSafe(sql.to_string()));
        for cell in &self.binds {
            query = bind(query, cell);
        }
        query
    }

    fn text(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.clauses.join(" AND "))
        }
    }
}

/// `INSERT` of `n` rows into `table`, idempotent by its key.
fn insert_sql(table: &Table, n: usize, marks: Marks) -> String {
    let names: Vec<&str> = table.columns.iter().map(|c| c.name).collect();
    let mut sql = format!(
        "INSERT INTO {} ({}) VALUES {}",
        table.name,
        names.join(", "),
        placeholders(names.len(), n, marks)
    );
    sql.push_str(&format!(" ON CONFLICT ({}) ", table.key.join(", ")));
    if table.replace {
        let set: Vec<String> = names
            .iter()
            .filter(|n| !table.key.contains(n))
            .map(|n| format!("{n} = excluded.{n}"))
            .collect();
        sql.push_str(&format!("DO UPDATE SET {}", set.join(", ")));
        if let Some((column, value)) = table.settled {
            sql.push_str(&format!(
                " WHERE {t}.{column} <> '{value}' OR excluded.{column} = '{value}'",
                t = table.name
            ));
        }
    } else {
        sql.push_str("DO NOTHING");
    }
    sql
}

/// How the values of a statement of many are marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marks {
    /// `$1, $2`: PostgreSQL's.
    Numbered,
    /// `?, ?`: SQLite prepares a statement of thousands of `$N` in
    /// quadratic time (1.5 s for 19,000), of `?` in milliseconds.
    InOrder,
}

impl Marks {
    /// The mark of the `n`th value (from 1).
    fn nth(self, n: usize) -> String {
        match self {
            Marks::Numbered => format!("${n}"),
            Marks::InOrder => "?".to_string(),
        }
    }
}

/// `($1, $2), ($3, $4)` (or `(?, ?), (?, ?)`): `n` rows of `width`
/// values, bound in order.
fn placeholders(width: usize, n: usize, marks: Marks) -> String {
    let rows: Vec<String> = (0..n)
        .map(|r| {
            let ps: Vec<String> = (1..=width).map(|c| marks.nth(r * width + c)).collect();
            format!("({})", ps.join(", "))
        })
        .collect();
    rows.join(", ")
}

fn bind<'q>(query: Query<'q, Any, AnyArguments>, cell: &Cell) -> Query<'q, Any, AnyArguments> {
    match cell {
        Cell::Text(v) => query.bind(v.clone()),
        Cell::Int(v) => query.bind(*v),
        Cell::Float(v) => query.bind(*v),
        Cell::Bool(v) => query.bind(*v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flux::job::{JobState, Transition};
    use crate::flux::jobid::JobId;
    use crate::flux::resource::{RankChange, RankState};
    use crate::keyed::JobKey;
    use crate::keyed::state::KeyedTransition;
    use crate::output::OutputRecord;

    #[test]
    fn urls_are_checked_and_sqlite_files_created() {
        assert!(check_url("sqlite:///var/lib/fluxpipe/jobs.db").is_ok());
        assert!(check_url("sqlite:jobs.db").is_ok());
        assert!(check_url("postgres://u@localhost/fluxpipe").is_ok());
        for bad in [
            "mysql://x",
            "sqlite:",
            "sqlite::memory:",
            "jobs.db",
            "sqlite://?mode=ro",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/a/b/jobs.db", dir.path().display());
        let read = prepared_url(&url, Access::Read).unwrap();
        assert_eq!(read, format!("{url}?mode=ro"));
        assert!(!dir.path().join("a").exists(), "reading makes nothing");
        let write = prepared_url(&url, Access::Write).unwrap();
        assert_eq!(write, format!("{url}?mode=rwc"));
        assert!(dir.path().join("a/b").is_dir());
        assert_eq!(
            prepared_url(&format!("{url}?mode=ro"), Access::Write).unwrap(),
            format!("{url}?mode=ro")
        );
    }

    #[test]
    fn outages_are_told_from_faults_by_their_codes() {
        for code in [
            "08006", "57P01", "53300", "40001", "5", "517", "6", "13", "14",
        ] {
            assert!(outage_code(code), "{code}");
        }
        // A wrong password, no such database, a syntax error; SQLite's
        // constraint and corruption.
        for code in ["28P01", "3D000", "42601", "19", "2067", "11"] {
            assert!(!outage_code(code), "{code}");
        }
    }

    #[test]
    fn inserts_name_every_column_and_their_conflict() {
        let sql = insert_sql(&rows::TRANSITIONS, 2, Marks::Numbered);
        assert_eq!(
            sql,
            "INSERT INTO transitions (cluster, record_id, id, from_state, to_state, event, timestamp) \
             VALUES ($1, $2, $3, $4, $5, $6, $7), ($8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT (cluster, record_id) DO NOTHING"
        );
        let jobs = insert_sql(&rows::JOBS, 1, Marks::Numbered);
        assert!(
            insert_sql(&rows::JOB_NODES, 2, Marks::InOrder)
                .contains("VALUES (?, ?, ?), (?, ?, ?) ON CONFLICT")
        );
        assert!(
            jobs.contains("ON CONFLICT (cluster, id) DO UPDATE SET record_id = excluded.record_id")
        );
        assert!(!jobs.contains("cluster = excluded"));
        assert!(jobs.ends_with(" WHERE jobs.state <> 'INACTIVE' OR excluded.state = 'INACTIVE'"));
    }

    /// SQLite end to end (PostgreSQL: tests/integration/database.rs, with a real server).
    #[tokio::test]
    async fn a_batch_is_stored_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/jobs.db", dir.path().display());
        let archive = Archive::connect(&url, Access::Write).await.unwrap();
        archive.migrate().await.unwrap();
        let job_of = |line: &str| OutputRecord::job(serde_json::from_str(line).unwrap());
        let record = job_of(
            r#"{"cluster":"c","id":18446744073709551615,"kind":"job","nodelist":"n[1-2]","queue":"q","record_id":"r","result":"FAILED","state":"INACTIVE","t_inactive":10.0,"t_submit":1.0,"userid":5,"success":false}"#,
        );
        let job = record.line();
        let mut batch = Batch::default();
        batch.add(&record).unwrap();
        let drained = RankState {
            hostname: Some("n1".into()),
            drained: true,
            ..RankState::new(1)
        };
        let change = RankChange {
            rank: 1,
            before: Some(RankState::new(1)),
            after: Some(drained),
        };
        batch
            .add(&OutputRecord::rank_change(
                "c",
                change,
                Some(("drain", 3.0)),
            ))
            .unwrap();
        let finish = KeyedTransition {
            key: JobKey {
                cluster: "c".into(),
                id: JobId(u64::MAX),
            },
            transition: Transition {
                from: JobState::Run,
                to: JobState::Cleanup,
                timestamp: 9.0,
            },
        };
        batch
            .add(&OutputRecord::transition(&finish, "finish"))
            .unwrap();
        archive.store(&batch, None).await.unwrap();
        archive.store(&batch, None).await.unwrap();
        let all = JobQuery {
            limit: 10,
            ..Default::default()
        };
        assert_eq!(archive.jobs(&all).await.unwrap(), [job]);
        let on = |host: &str| JobQuery {
            host: Some(host.into()),
            results: vec!["FAILED".into()],
            queue: Some("q".into()),
            user: Some(UserMatch::Id(5)),
            ids: vec![u64::MAX],
            since: Some(10.0),
            until: Some(1.5),
            ..all.clone()
        };
        assert_eq!(archive.jobs(&on("n2")).await.unwrap().len(), 1);
        assert!(archive.jobs(&on("n3")).await.unwrap().is_empty());
        let events = EventQuery {
            limit: 10,
            ..Default::default()
        };
        assert_eq!(archive.node_events(&events).await.unwrap().len(), 1);
        let t = archive.transitions(&events).await.unwrap();
        assert_eq!(t.len(), 1);
        assert!(t[0].contains("\"id\":18446744073709551615"), "{}", t[0]);
        // An update of the job while active, written again after its end
        // (a restart): the end stays.
        let mut again = Batch::default();
        again
            .add(&job_of(
                &job.replace("\"INACTIVE\"", "\"RUN\"")
                    .replace("\"r\"", "\"r0\""),
            ))
            .unwrap();
        archive.store(&again, None).await.unwrap();
        assert_eq!(archive.jobs(&all).await.unwrap(), [job]);
        assert_eq!(archive.prune(9.5).await.unwrap(), 2);
        assert_eq!(archive.prune(100.0).await.unwrap(), 3);
        assert!(archive.jobs(&all).await.unwrap().is_empty());
    }
}
