//! The archive's schema, as versioned migrations run at start (sqlx's
//! migrator, its `_sqlx_migrations` table). The same SQL serves SQLite and
//! PostgreSQL: only types both know, `ON CONFLICT` upserts, no serials.
//!
//! A migration, once released, never changes (its checksum is kept in the
//! database); a change of schema is a new one at the end.

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// Version 1: jobs, the hosts they ran on, node state changes.
const V1: &str = "
CREATE TABLE jobs (
    cluster TEXT NOT NULL,
    id BIGINT NOT NULL,
    record_id TEXT NOT NULL,
    name TEXT,
    queue TEXT,
    project TEXT,
    bank TEXT,
    userid BIGINT,
    state TEXT NOT NULL,
    result TEXT,
    success BOOLEAN,
    exception_occurred BOOLEAN,
    exception_type TEXT,
    exception_severity BIGINT,
    exception_note TEXT,
    returncode BIGINT,
    waitstatus BIGINT,
    priority BIGINT,
    urgency BIGINT,
    ntasks BIGINT,
    ncores BIGINT,
    nnodes BIGINT,
    nodelist TEXT,
    ranks TEXT,
    duration DOUBLE PRECISION,
    expiration DOUBLE PRECISION,
    dependencies TEXT,
    t_submit DOUBLE PRECISION,
    t_depend DOUBLE PRECISION,
    t_run DOUBLE PRECISION,
    t_cleanup DOUBLE PRECISION,
    t_inactive DOUBLE PRECISION,
    record TEXT NOT NULL,
    PRIMARY KEY (cluster, id)
);
CREATE INDEX jobs_by_end ON jobs (t_inactive);
CREATE INDEX jobs_by_user ON jobs (userid, t_inactive);
CREATE INDEX jobs_by_queue ON jobs (queue, t_inactive);

CREATE TABLE job_nodes (
    cluster TEXT NOT NULL,
    id BIGINT NOT NULL,
    hostname TEXT NOT NULL,
    PRIMARY KEY (cluster, id, hostname)
);
CREATE INDEX job_nodes_by_host ON job_nodes (hostname, cluster);

CREATE TABLE node_events (
    cluster TEXT NOT NULL,
    record_id TEXT NOT NULL,
    rank BIGINT NOT NULL,
    hostname TEXT,
    timestamp DOUBLE PRECISION,
    event TEXT,
    changed TEXT,
    online BOOLEAN,
    drained BOOLEAN,
    draining BOOLEAN,
    torpid BOOLEAN,
    removed BOOLEAN,
    drain_reason TEXT,
    drain_timestamp DOUBLE PRECISION,
    record TEXT NOT NULL,
    PRIMARY KEY (cluster, record_id)
);
CREATE INDEX node_events_by_time ON node_events (timestamp);
CREATE INDEX node_events_by_host ON node_events (hostname, timestamp);
";

/// Version 2: every job state transition, when a sink takes them.
const V2: &str = "
CREATE TABLE transitions (
    cluster TEXT NOT NULL,
    record_id TEXT NOT NULL,
    id BIGINT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    event TEXT,
    timestamp DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (cluster, record_id)
);
CREATE INDEX transitions_by_job ON transitions (cluster, id);
CREATE INDEX transitions_by_time ON transitions (timestamp);
";

/// Version 3: a job's GPUs (from R).
const V3: &str = "
ALTER TABLE jobs ADD COLUMN ngpus BIGINT;
";

/// Version 4: the submitter's name, as resolved where Flux runs.
const V4: &str = "
ALTER TABLE jobs ADD COLUMN username TEXT;
CREATE INDEX jobs_by_username ON jobs (username, t_inactive);
";

/// Version 5: daily rollups per cluster, queue and user (see
/// `archive::rollup`), and which finished jobs they count. Rows finished
/// before it are counted by the sink's first start after it.
const V5: &str = "
ALTER TABLE jobs ADD COLUMN rolled_up BOOLEAN;
CREATE INDEX jobs_to_roll_up ON jobs (t_inactive) WHERE rolled_up IS NULL AND state = 'INACTIVE';

CREATE TABLE job_rollups (
    cluster TEXT NOT NULL,
    day BIGINT NOT NULL,
    queue TEXT NOT NULL,
    user_key TEXT NOT NULL,
    username TEXT,
    userid BIGINT,
    jobs BIGINT NOT NULL,
    completed BIGINT NOT NULL,
    failed BIGINT NOT NULL,
    canceled BIGINT NOT NULL,
    timeout BIGINT NOT NULL,
    core_seconds DOUBLE PRECISION NOT NULL,
    gpu_seconds DOUBLE PRECISION NOT NULL,
    node_seconds DOUBLE PRECISION NOT NULL,
    runs BIGINT NOT NULL,
    run_sum DOUBLE PRECISION NOT NULL,
    waits BIGINT NOT NULL,
    wait_sum DOUBLE PRECISION NOT NULL,
    wait_max DOUBLE PRECISION,
    wait_buckets TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (cluster, day, queue, user_key)
);
CREATE INDEX job_rollups_by_day ON job_rollups (day);
";

/// Every migration, oldest first: (version, description, SQL).
const MIGRATIONS: [(i64, &str, &str); 5] = [
    (1, "jobs, job hosts, node events", V1),
    (2, "transitions", V2),
    (3, "job gpus", V3),
    (4, "job user names", V4),
    (5, "daily rollups", V5),
];

/// The newest schema version this fluxpipe writes.
pub const LATEST: i64 = MIGRATIONS.len() as i64;

/// The migrator up to `version` (tests migrate from an older one).
pub fn migrator(version: i64) -> Migrator {
    Migrator::with_migrations(
        MIGRATIONS
            .iter()
            .filter(|(v, _, _)| *v <= version)
            .map(|&(v, description, sql)| {
                Migration::new(
                    v,
                    description.into(),
                    MigrationType::Simple,
                    sqlx::AssertSqlSafe(sql).into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::rows::TABLES;

    /// Archives in the field hold these checksums: a released migration
    /// changed (even its whitespace) would make every one refuse to start.
    #[test]
    fn released_migrations_never_change() {
        let pinned = [
            "88667fee5c653bc0ee5ecd9e2b4784e57ee3bdc90f2f8cb6a66a43f8a9c9ff960a614a2fa9a8bd556e4e4051a42ca360",
            "5e55cb1f8a6663943e478afc2370d2b18854f87a86089963aadf2da9160de9a0b989db27fb385614bc33215419d4cb8c",
            "a50613db0d1f42605cdc523e031ec10582ddccfe86dd105fc8b6381d4a6135f5dd96d6c08fb7bb47108c5f094286811b",
            "be4f078b60423fd72e08b2f776dca34f37d17101e827d9814f02f8d0a9dc07e1e6f573b6f819ec0114bf5c91f94a7ae2",
            "d7a1791ec125da89b717ac71c7c93a2b76dc7aec7662b8254575a0119a18ba8955d99510b849c0becbebe401ac79040c",
        ];
        let migrator = migrator(LATEST);
        assert_eq!(migrator.migrations.len(), pinned.len());
        for (m, want) in migrator.migrations.iter().zip(pinned) {
            assert_eq!(
                const_hex::encode(&*m.checksum),
                want,
                "migration {}",
                m.version
            );
        }
    }

    #[test]
    fn every_column_the_rows_have_is_in_the_schema() {
        let sql = MIGRATIONS.map(|m| m.2).concat();
        for table in TABLES {
            let at = sql
                .find(&format!("CREATE TABLE {} (", table.name))
                .unwrap_or_else(|| panic!("no table {}", table.name));
            let body = &sql[at..];
            let body = &body[..body.find(");").unwrap()];
            for column in table.columns {
                let added = format!("ALTER TABLE {} ADD COLUMN {} ", table.name, column.name);
                assert!(
                    body.contains(&format!("\n    {} ", column.name)) || sql.contains(&added),
                    "{}.{} is not in the schema",
                    table.name,
                    column.name
                );
            }
            let key = format!("PRIMARY KEY ({})", table.key.join(", "));
            assert!(body.contains(&key), "{}: {key}", table.name);
        }
    }
}
