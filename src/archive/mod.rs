//! The job archive: a SQL database (SQLite or PostgreSQL, through sqlx's
//! `Any` driver) that keeps every job's record when it ends, every change
//! of a node's state, and (when asked) every transition; written by the
//! `database` sink, read by `fluxpipe history` and by whatever a site
//! points at it (Grafana).
//!
//! Writes are idempotent by key: a record written again after a restart
//! changes nothing. One batch is one transaction.

pub mod rows;
pub mod schema;

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
    /// Whether trying again later may help (the database is down, slow or
    /// busy), as opposed to a fault of the config or of the database's
    /// contents that no retry mends.
    pub fn is_transient(&self) -> bool {
        use sqlx::migrate::MigrateError;
        let sql = match self {
            ArchiveError::Url(_) | ArchiveError::Folder { .. } => return false,
            ArchiveError::Sql(e) => e,
            ArchiveError::Migrate(MigrateError::Execute(e)) => e,
            ArchiveError::Migrate(_) => return false,
        };
        match sql {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            // A server's error: shutting down, too many connections, a
            // serialization failure, a locked SQLite file. A constraint or
            // a syntax error would be ours, and lasting.
            sqlx::Error::Database(db) => !matches!(
                db.kind(),
                sqlx::error::ErrorKind::UniqueViolation
                    | sqlx::error::ErrorKind::ForeignKeyViolation
                    | sqlx::error::ErrorKind::NotNullViolation
                    | sqlx::error::ErrorKind::CheckViolation
            ),
            _ => false,
        }
    }
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
}

/// The database a URL names, checked; a SQLite file is created (with its
/// folder) when missing.
fn prepared_url(url: &str) -> Result<String, ArchiveError> {
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        return Ok(url.to_string());
    }
    let Some(rest) = url.strip_prefix("sqlite:") else {
        return Err(ArchiveError::Url(url.to_string()));
    };
    let path = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    if path.is_empty() || path == ":memory:" {
        return Err(ArchiveError::Url(url.to_string()));
    }
    if let Some(folder) = Path::new(path)
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(folder).map_err(|source| ArchiveError::Folder {
            path: path.to_string(),
            source,
        })?;
    }
    Ok(if query.contains("mode=") {
        url.to_string()
    } else if query.is_empty() {
        format!("{url}?mode=rwc")
    } else {
        format!("{url}&mode=rwc")
    })
}

/// Whether `url` names a database the archive can use (without
/// connecting).
pub fn check_url(url: &str) -> Result<(), ArchiveError> {
    let ok = url.starts_with("postgres:")
        || url.starts_with("postgresql:")
        || url
            .strip_prefix("sqlite:")
            .map(|r| r.trim_start_matches('/'))
            .is_some_and(|p| !p.is_empty() && !p.starts_with('?') && p != ":memory:");
    if ok {
        Ok(())
    } else {
        Err(ArchiveError::Url(url.to_string()))
    }
}

impl Archive {
    /// Connect (a SQLite file is created if missing). Does not migrate.
    pub async fn connect(url: &str) -> Result<Self, ArchiveError> {
        sqlx::any::install_default_drivers();
        let url = prepared_url(url)?;
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(&url)
            .await?;
        Ok(Archive { pool })
    }

    /// Bring the schema up to the latest version.
    pub async fn migrate(&self) -> Result<(), ArchiveError> {
        self.migrate_to(schema::LATEST).await
    }

    /// Bring the schema up to `version` (tests start from an old one).
    pub async fn migrate_to(&self, version: i64) -> Result<(), ArchiveError> {
        schema::migrator(version).run(&self.pool).await?;
        Ok(())
    }

    /// Write a batch's rows in one transaction: all of them or none.
    pub async fn store(&self, batch: &Batch) -> Result<(), ArchiveError> {
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
                    sqlx::query(AssertSqlSafe(insert_sql(table, chunk.len()))).persistent(false);
                for cell in chunk.iter().flatten() {
                    query = bind(query, cell);
                }
                query.execute(&mut *tx).await?;
            }
        }
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

    /// The records of the jobs `q` asks for, newest end first.
    pub async fn jobs(&self, q: &JobQuery) -> Result<Vec<String>, ArchiveError> {
        let mut w = Where::default();
        if let Some(c) = &q.cluster {
            let p = w.bind(Cell::Text(Some(c.clone())));
            w.clause(format!("j.cluster = {p}"));
        }
        if let Some(u) = q.userid {
            let p = w.bind(Cell::Int(Some(u)));
            w.clause(format!("j.userid = {p}"));
        }
        if let Some(queue) = &q.queue {
            let p = w.bind(Cell::Text(Some(queue.clone())));
            w.clause(format!("j.queue = {p}"));
        }
        if !q.results.is_empty() {
            let ps: Vec<String> = q
                .results
                .iter()
                .map(|r| w.bind(Cell::Text(Some(r.clone()))))
                .collect();
            w.clause(format!("j.result IN ({})", ps.join(", ")));
        }
        if !q.ids.is_empty() {
            let ps: Vec<String> = q
                .ids
                .iter()
                .map(|id| w.bind(Cell::Int(Some(rows::stored_id(*id)))))
                .collect();
            w.clause(format!("j.id IN ({})", ps.join(", ")));
        }
        // A job belongs to a window it overlaps: submitted before its end,
        // ended after its start.
        if let Some(since) = q.since {
            let p = w.bind(Cell::Float(Some(since)));
            w.clause(format!("j.t_inactive >= {p}"));
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
        let limit = w.bind(Cell::Int(Some(i64::try_from(q.limit).unwrap_or(i64::MAX))));
        let sql = format!(
            "SELECT j.record FROM jobs j{} ORDER BY j.t_inactive DESC, j.cluster, j.id LIMIT {limit}",
            w.text()
        );
        self.records(sql, &w.binds).await
    }

    /// The records of the node state changes `q` asks for: the newest,
    /// in the order they happened.
    pub async fn node_events(&self, q: &EventQuery) -> Result<Vec<String>, ArchiveError> {
        let mut w = Where::default();
        q.common(&mut w, "e.cluster", "e.timestamp");
        if let Some(host) = &q.host {
            let p = w.bind(Cell::Text(Some(host.clone())));
            w.clause(format!("e.hostname = {p}"));
        }
        let limit = w.bind(Cell::Int(Some(i64::try_from(q.limit).unwrap_or(i64::MAX))));
        let sql = format!(
            "SELECT e.record FROM node_events e{} \
             ORDER BY e.timestamp DESC, e.cluster DESC, e.rank DESC, e.record_id DESC LIMIT {limit}",
            w.text()
        );
        let mut found = self.records(sql, &w.binds).await?;
        found.reverse();
        Ok(found)
    }

    /// The transitions `q` asks for (of its jobs, when it names some), as
    /// `transitions` records: the newest, in the order they happened (of
    /// one time, in the order of the states).
    pub async fn transitions(&self, q: &EventQuery) -> Result<Vec<String>, ArchiveError> {
        let mut w = Where::default();
        q.common(&mut w, "t.cluster", "t.timestamp");
        if !q.ids.is_empty() {
            let ps: Vec<String> = q
                .ids
                .iter()
                .map(|id| w.bind(Cell::Int(Some(rows::stored_id(*id)))))
                .collect();
            w.clause(format!("t.id IN ({})", ps.join(", ")));
        }
        let limit = w.bind(Cell::Int(Some(i64::try_from(q.limit).unwrap_or(i64::MAX))));
        let sql = format!(
            "SELECT t.cluster, t.record_id, t.id, t.from_state, t.to_state, t.event, t.timestamp \
             FROM transitions t{} ORDER BY t.timestamp DESC, t.cluster DESC, t.id DESC, \
             CASE t.to_state WHEN 'NEW' THEN 0 WHEN 'DEPEND' THEN 1 WHEN 'PRIORITY' THEN 2 \
             WHEN 'SCHED' THEN 3 WHEN 'RUN' THEN 4 WHEN 'CLEANUP' THEN 5 ELSE 6 END DESC \
             LIMIT {limit}",
            w.text()
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for cell in &w.binds {
            query = bind(query, cell);
        }
        let mut found = query.fetch_all(&self.pool).await?;
        found.reverse();
        found
            .iter()
            .map(|row| {
                let text = |i: usize| row.try_get::<Option<String>, _>(i);
                let id: i64 = row.try_get(2)?;
                Ok(serde_json::json!({
                    "cluster": text(0)?,
                    "event": text(5)?,
                    "from": text(3)?,
                    "id": id as u64,
                    "kind": "transition",
                    "record_id": text(1)?,
                    "timestamp": row.try_get::<f64, _>(6)?,
                    "to": text(4)?,
                })
                .to_string())
            })
            .collect()
    }

    async fn records(&self, sql: String, binds: &[Cell]) -> Result<Vec<String>, ArchiveError> {
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for cell in binds {
            query = bind(query, cell);
        }
        let found = query.fetch_all(&self.pool).await?;
        Ok(found
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?)
    }

    /// Close the connections.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// The jobs `fluxpipe history` asks for.
#[derive(Debug, Clone, Default)]
pub struct JobQuery {
    pub cluster: Option<String>,
    pub userid: Option<i64>,
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
        if let Some(c) = &self.cluster {
            let p = w.bind(Cell::Text(Some(c.clone())));
            w.clause(format!("{cluster} = {p}"));
        }
        if let Some(since) = self.since {
            let p = w.bind(Cell::Float(Some(since)));
            w.clause(format!("{time} >= {p}"));
        }
        if let Some(until) = self.until {
            let p = w.bind(Cell::Float(Some(until)));
            w.clause(format!("{time} < {p}"));
        }
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

    fn text(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.clauses.join(" AND "))
        }
    }
}

/// `INSERT` of `n` rows into `table`, idempotent by its key.
fn insert_sql(table: &Table, n: usize) -> String {
    let names: Vec<&str> = table.columns.iter().map(|c| c.name).collect();
    let width = names.len();
    let mut sql = format!("INSERT INTO {} ({}) VALUES ", table.name, names.join(", "));
    for r in 0..n {
        if r > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for c in 0..width {
            if c > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("${}", r * width + c + 1));
        }
        sql.push(')');
    }
    sql.push_str(&format!(" ON CONFLICT ({}) ", table.key.join(", ")));
    if table.replace {
        let set: Vec<String> = names
            .iter()
            .filter(|n| !table.key.contains(n))
            .map(|n| format!("{n} = excluded.{n}"))
            .collect();
        sql.push_str(&format!("DO UPDATE SET {}", set.join(", ")));
    } else {
        sql.push_str("DO NOTHING");
    }
    sql
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
        assert_eq!(prepared_url(&url).unwrap(), format!("{url}?mode=rwc"));
        assert!(dir.path().join("a/b").is_dir());
        assert_eq!(
            prepared_url(&format!("{url}?mode=ro")).unwrap(),
            format!("{url}?mode=ro")
        );
    }

    #[test]
    fn inserts_name_every_column_and_their_conflict() {
        let sql = insert_sql(&rows::TRANSITIONS, 2);
        assert_eq!(
            sql,
            "INSERT INTO transitions (cluster, record_id, id, from_state, to_state, event, timestamp) \
             VALUES ($1, $2, $3, $4, $5, $6, $7), ($8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT (cluster, record_id) DO NOTHING"
        );
        let jobs = insert_sql(&rows::JOBS, 1);
        assert!(
            jobs.contains("ON CONFLICT (cluster, id) DO UPDATE SET record_id = excluded.record_id")
        );
        assert!(!jobs.contains("cluster = excluded"));
    }

    /// SQLite end to end (PostgreSQL: tests/database.rs, with a real server).
    #[tokio::test]
    async fn a_batch_is_stored_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/jobs.db", dir.path().display());
        let archive = Archive::connect(&url).await.unwrap();
        archive.migrate().await.unwrap();
        let job = r#"{"cluster":"c","id":18446744073709551615,"kind":"job","nodelist":"n[1-2]","queue":"q","record_id":"r","result":"FAILED","state":"INACTIVE","t_inactive":10.0,"t_submit":1.0,"userid":5,"success":false}"#;
        let mut batch = Batch::default();
        batch.add(job).unwrap();
        batch.add(r#"{"kind":"rank","cluster":"c","rank":1,"hostname":"n1","record_id":"x","timestamp":3.0,"drained":true}"#).unwrap();
        batch.add(r#"{"kind":"transition","cluster":"c","id":18446744073709551615,"from":"RUN","to":"CLEANUP","event":"finish","timestamp":9.0,"record_id":"t"}"#).unwrap();
        archive.store(&batch).await.unwrap();
        archive.store(&batch).await.unwrap();
        let all = JobQuery {
            limit: 10,
            ..Default::default()
        };
        assert_eq!(archive.jobs(&all).await.unwrap(), [job]);
        let on = |host: &str| JobQuery {
            host: Some(host.into()),
            results: vec!["FAILED".into()],
            queue: Some("q".into()),
            userid: Some(5),
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
        assert_eq!(archive.prune(9.5).await.unwrap(), 2);
        assert_eq!(archive.prune(100.0).await.unwrap(), 3);
        assert!(archive.jobs(&all).await.unwrap().is_empty());
    }
}
