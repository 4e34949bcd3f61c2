//! Rollups in the database: finished jobs counted once, as they are
//! stored, and rollups read back for a report ([`super::rollup`] is what
//! they hold).
//!
//! A job is counted when its row is marked `rolled_up`; the mark and the
//! sums change in one transaction, so a job stored twice (a restart, a
//! backlog sent again) or by two writers at once (a consumer group's
//! rebalance) counts once. Sums are added by the database (`x = x +
//! excluded.x`), so writers never overwrite each other's.

use super::report::FinishedJob;
use super::rollup::{RollupKey, RollupSums, Rollups, add_buckets, encode_buckets};
use super::rows::Cell;
use super::{Archive, ArchiveError, MAX_BINDS, Marks, ReportQuery, Where, bind, placeholders};
use sqlx::{Any, AssertSqlSafe, Row, Transaction};
use std::collections::BTreeMap;

/// What a report and a rollup read of a finished job, in
/// [`finished_job`]'s order.
pub(super) const FINISHED_COLUMNS: &str = "cluster, queue, userid, username, result, t_submit, \
     t_run, t_cleanup, t_inactive, ncores, ngpus, nnodes";

/// Jobs marked and summed per statement.
const CHUNK: i64 = 10_000;

/// The columns of `job_rollups` a writer sets, in order.
const ROLLUP_COLUMNS: [&str; 19] = [
    "cluster",
    "day",
    "queue",
    "user_key",
    "username",
    "userid",
    "jobs",
    "completed",
    "failed",
    "canceled",
    "timeout",
    "core_seconds",
    "gpu_seconds",
    "node_seconds",
    "runs",
    "run_sum",
    "waits",
    "wait_sum",
    "wait_max",
];

/// How a stored rollup takes another's sums.
const ROLLUP_MERGE: &str = "username = COALESCE(job_rollups.username, excluded.username), \
     userid = COALESCE(job_rollups.userid, excluded.userid), \
     jobs = job_rollups.jobs + excluded.jobs, \
     completed = job_rollups.completed + excluded.completed, \
     failed = job_rollups.failed + excluded.failed, \
     canceled = job_rollups.canceled + excluded.canceled, \
     timeout = job_rollups.timeout + excluded.timeout, \
     core_seconds = job_rollups.core_seconds + excluded.core_seconds, \
     gpu_seconds = job_rollups.gpu_seconds + excluded.gpu_seconds, \
     node_seconds = job_rollups.node_seconds + excluded.node_seconds, \
     runs = job_rollups.runs + excluded.runs, \
     run_sum = job_rollups.run_sum + excluded.run_sum, \
     waits = job_rollups.waits + excluded.waits, \
     wait_sum = job_rollups.wait_sum + excluded.wait_sum, \
     wait_max = CASE WHEN job_rollups.wait_max IS NULL OR excluded.wait_max > job_rollups.wait_max \
     THEN excluded.wait_max ELSE job_rollups.wait_max END";

impl Archive {
    /// Count the finished jobs no rollup counts yet, in chunks of one
    /// transaction each (the first start after the migration counts every
    /// row there was); how many. Jobs that ended before `not_before` (the
    /// retention) are left: their rows may have been counted and deleted
    /// before, and are about to be deleted again.
    pub async fn roll_up_pending(&self, not_before: Option<f64>) -> Result<u64, ArchiveError> {
        let mut total = 0;
        loop {
            let mut tx = self.pool.begin().await?;
            let n = roll_up_chunk(&mut tx, not_before, self.marks()).await?;
            tx.commit().await?;
            total += n;
            if n < CHUNK as u64 {
                return Ok(total);
            }
        }
    }

    /// The rollups of `q`'s jobs, whose window must be whole UTC days.
    pub async fn rollups(
        &self,
        q: &ReportQuery,
    ) -> Result<BTreeMap<RollupKey, RollupSums>, ArchiveError> {
        use futures_util::TryStreamExt;
        let mut w = Where::default();
        q.clauses(&mut w, "r", "day");
        let sql = format!(
            "SELECT r.{}, r.wait_buckets FROM job_rollups r{}",
            ROLLUP_COLUMNS.join(", r."),
            w.text()
        );
        let mut out = BTreeMap::new();
        let query = w.query(&sql);
        let mut rows = query.fetch(&self.pool);
        while let Some(row) = rows.try_next().await? {
            let int = |i: usize| -> Result<i64, sqlx::Error> {
                Ok(row.try_get::<Option<i64>, _>(i)?.unwrap_or(0))
            };
            let float = |i: usize| -> Result<f64, sqlx::Error> {
                Ok(row.try_get::<Option<f64>, _>(i)?.unwrap_or(0.0))
            };
            let key = RollupKey {
                cluster: row.try_get(0)?,
                day: row.try_get(1)?,
                queue: row.try_get(2)?,
                user_key: row.try_get(3)?,
            };
            let mut sums = RollupSums {
                username: row.try_get(4)?,
                userid: row.try_get(5)?,
                jobs: int(6)?,
                completed: int(7)?,
                failed: int(8)?,
                canceled: int(9)?,
                timeout: int(10)?,
                core_seconds: float(11)?,
                gpu_seconds: float(12)?,
                node_seconds: float(13)?,
                runs: int(14)?,
                run_sum: float(15)?,
                waits: int(16)?,
                wait_sum: float(17)?,
                wait_max: row.try_get(18)?,
                wait_buckets: BTreeMap::new(),
            };
            let text: String = row.try_get(19)?;
            if add_buckets(&text, &mut sums.wait_buckets) > 0 {
                tracing::warn!(cluster = %key.cluster, day = key.day, "a rollup's wait buckets are damaged");
            }
            out.insert(key, sums);
        }
        Ok(out)
    }

    /// The schema version the database is at (0: none).
    pub async fn schema_version(&self) -> Result<i64, ArchiveError> {
        let row = sqlx::query("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }
}

/// Inside a store's transaction: count the batch's finished jobs (`keys`,
/// cluster and stored id) that no rollup counts yet. Only those: the
/// rows an older archive holds are counted beside, by
/// [`Archive::roll_up_pending`], not inside a batch.
pub(super) async fn roll_up_jobs(
    tx: &mut Transaction<'_, Any>,
    keys: &[(String, i64)],
    not_before: Option<f64>,
    marks: Marks,
) -> Result<(), ArchiveError> {
    for chunk in keys.chunks(MAX_BINDS / 2) {
        let mut by_cluster: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for (cluster, id) in chunk {
            by_cluster.entry(cluster).or_default().push(*id);
        }
        let mut binds = vec![Cell::Float(Some(not_before.unwrap_or(f64::MIN)))];
        let mut mark = |cell: Cell| {
            binds.push(cell);
            marks.nth(binds.len())
        };
        let first = marks.nth(1);
        let clauses: Vec<String> = by_cluster
            .into_iter()
            .map(|(cluster, ids)| {
                let c = mark(Cell::Text(Some(cluster.to_string())));
                let ids: Vec<String> = ids.into_iter().map(|i| mark(Cell::Int(Some(i)))).collect();
                format!("(cluster = {c} AND id IN ({}))", ids.join(", "))
            })
            .collect();
        let sql = format!(
            "UPDATE jobs SET rolled_up = TRUE WHERE rolled_up IS NULL AND state = 'INACTIVE' \
             AND t_inactive >= {first} AND ({}) RETURNING {FINISHED_COLUMNS}",
            clauses.join(" OR ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).persistent(false);
        for cell in &binds {
            query = bind(query, cell);
        }
        let marked = query.fetch_all(&mut **tx).await?;
        let mut rollups = Rollups::default();
        for row in &marked {
            rollups.add(&finished_job(row)?);
        }
        store_rollups(tx, &rollups, marks).await?;
    }
    Ok(())
}

/// Mark up to [`CHUNK`] uncounted finished jobs and add them to their
/// rollups; how many.
async fn roll_up_chunk(
    tx: &mut Transaction<'_, Any>,
    not_before: Option<f64>,
    marks: Marks,
) -> Result<u64, ArchiveError> {
    // The outer `rolled_up IS NULL` is checked again on the row a
    // concurrent writer just marked (PostgreSQL's READ COMMITTED), so two
    // writers never both count a job.
    let pending = "rolled_up IS NULL AND state = 'INACTIVE' AND t_inactive >= $1";
    let sql = format!(
        "UPDATE jobs SET rolled_up = TRUE WHERE {pending} AND (cluster, id) IN \
         (SELECT cluster, id FROM jobs WHERE {pending} LIMIT $2) RETURNING {FINISHED_COLUMNS}"
    );
    let marked = sqlx::query(AssertSqlSafe(sql))
        .bind(not_before.unwrap_or(f64::MIN))
        .bind(CHUNK)
        .fetch_all(&mut **tx)
        .await?;
    let mut rollups = Rollups::default();
    for row in &marked {
        rollups.add(&finished_job(row)?);
    }
    store_rollups(tx, &rollups, marks).await?;
    Ok(marked.len() as u64)
}

/// A finished job from the columns [`super::Archive::finished_jobs`]
/// and the roll-up read, in their order.
pub(super) fn finished_job(row: &sqlx::any::AnyRow) -> Result<FinishedJob, sqlx::Error> {
    let text = |i: usize| row.try_get::<Option<String>, _>(i);
    let int = |i: usize| row.try_get::<Option<i64>, _>(i);
    let float = |i: usize| row.try_get::<Option<f64>, _>(i);
    Ok(FinishedJob {
        cluster: text(0)?.unwrap_or_default(),
        queue: text(1)?,
        userid: int(2)?,
        username: text(3)?,
        result: text(4)?,
        t_submit: float(5)?,
        t_run: float(6)?,
        t_cleanup: float(7)?,
        t_inactive: float(8)?.unwrap_or(0.0),
        ncores: int(9)?,
        ngpus: int(10)?,
        nnodes: int(11)?,
    })
}

/// Add `rollups` to the stored ones.
async fn store_rollups(
    tx: &mut Transaction<'_, Any>,
    rollups: &Rollups,
    marks: Marks,
) -> Result<(), ArchiveError> {
    if rollups.is_empty() {
        return Ok(());
    }
    let groups: Vec<(&RollupKey, &RollupSums)> = rollups.groups.iter().collect();
    let key_cells = |k: &RollupKey| {
        [
            Cell::Text(Some(k.cluster.clone())),
            Cell::Int(Some(k.day)),
            Cell::Text(Some(k.queue.clone())),
            Cell::Text(Some(k.user_key.clone())),
        ]
    };
    // One more column: the buckets' text, in the second statement.
    let per_statement = MAX_BINDS / (ROLLUP_COLUMNS.len() + 1);
    for chunk in groups.chunks(per_statement) {
        // The sums add up in SQL; the rows stay locked (PostgreSQL) until
        // the commit.
        let sql = upsert_sql(
            "job_rollups",
            &ROLLUP_COLUMNS,
            &ROLLUP_COLUMNS[..4],
            chunk.len(),
            ROLLUP_MERGE,
            marks,
        );
        // Not kept for reuse: see `Archive::store`.
        let mut query = sqlx::query(AssertSqlSafe(sql)).persistent(false);
        for (k, s) in chunk {
            for cell in key_cells(k).iter().chain(&sum_cells(s)) {
                query = bind(query, cell);
            }
        }
        query.execute(&mut **tx).await?;
        // The stored buckets of the chunk's days (asked by day: sqlx reads
        // rows back slowly from a statement of thousands of parameters).
        let days = chunk.iter().map(|(k, _)| k.day);
        let (first, last) = (days.clone().min().unwrap_or(0), days.max().unwrap_or(0));
        let stored = sqlx::query(
            "SELECT cluster, day, queue, user_key, wait_buckets FROM job_rollups \
             WHERE day >= $1 AND day <= $2 AND wait_buckets <> ''",
        )
        .bind(first)
        .bind(last)
        .fetch_all(&mut **tx)
        .await?;
        let stored: BTreeMap<RollupKey, String> = stored
            .iter()
            .map(|row| {
                let key = RollupKey {
                    cluster: row.try_get(0)?,
                    day: row.try_get(1)?,
                    queue: row.try_get(2)?,
                    user_key: row.try_get(3)?,
                };
                Ok((key, row.try_get(4)?))
            })
            .collect::<Result<_, sqlx::Error>>()?;
        // Buckets do not add up in SQL: added here and written back.
        let mut merged = Vec::new();
        for (key, sums) in chunk {
            if sums.wait_buckets.is_empty() {
                continue;
            }
            let mut buckets = sums.wait_buckets.clone();
            if let Some(text) = stored.get(*key) {
                add_buckets(text, &mut buckets);
            }
            merged.push((*key, encode_buckets(&buckets)));
        }
        if merged.is_empty() {
            continue;
        }
        let mut columns = ROLLUP_COLUMNS.to_vec();
        columns.push("wait_buckets");
        let sql = upsert_sql(
            "job_rollups",
            &columns,
            &ROLLUP_COLUMNS[..4],
            merged.len(),
            "wait_buckets = excluded.wait_buckets",
            marks,
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).persistent(false);
        // The rows are there: only the key and the text are taken.
        let nothing = sum_cells(&RollupSums::default());
        for (k, text) in merged {
            let text = Cell::Text(Some(text));
            for cell in key_cells(k).iter().chain(&nothing).chain([&text]) {
                query = bind(query, cell);
            }
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// A rollup's sums as cells, in [`ROLLUP_COLUMNS`]' order after the key.
fn sum_cells(s: &RollupSums) -> [Cell; 15] {
    [
        Cell::Text(s.username.clone()),
        Cell::Int(s.userid),
        Cell::Int(Some(s.jobs)),
        Cell::Int(Some(s.completed)),
        Cell::Int(Some(s.failed)),
        Cell::Int(Some(s.canceled)),
        Cell::Int(Some(s.timeout)),
        Cell::Float(Some(s.core_seconds)),
        Cell::Float(Some(s.gpu_seconds)),
        Cell::Float(Some(s.node_seconds)),
        Cell::Int(Some(s.runs)),
        Cell::Float(Some(s.run_sum)),
        Cell::Int(Some(s.waits)),
        Cell::Float(Some(s.wait_sum)),
        Cell::Float(s.wait_max),
    ]
}

/// `INSERT` of `n` rows of `columns` that, on a key already there, does
/// `merge`.
fn upsert_sql(
    table: &str,
    columns: &[&str],
    key: &[&str],
    n: usize,
    merge: &str,
    marks: Marks,
) -> String {
    format!(
        "INSERT INTO {table} ({}) VALUES {} ON CONFLICT ({}) DO UPDATE SET {merge}",
        columns.join(", "),
        placeholders(columns.len(), n, marks),
        key.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upserts_add_on_their_key() {
        assert_eq!(
            upsert_sql(
                "t",
                &["a", "b", "n"],
                &["a", "b"],
                2,
                "n = t.n + excluded.n",
                Marks::Numbered
            ),
            "INSERT INTO t (a, b, n) VALUES ($1, $2, $3), ($4, $5, $6) \
             ON CONFLICT (a, b) DO UPDATE SET n = t.n + excluded.n"
        );
        for column in &ROLLUP_COLUMNS[4..] {
            assert!(
                ROLLUP_MERGE.contains(&format!("{column} = ")),
                "{column} is not merged"
            );
        }
    }
}
