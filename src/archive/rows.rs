//! Output records → the archive's rows: which table a record goes to, its
//! columns, and its key. Pure: no database here, so the mapping is tested
//! (and fuzzed by proptest) on its own.
//!
//! A batch keeps one row per key (the last one seen): a record repeated
//! within a batch, as after a restart, is written once, and PostgreSQL's
//! `ON CONFLICT DO UPDATE` never meets the same key twice in a statement.

use crate::flux::hostlist::Hostlist;
use serde_json::Value;
use std::collections::HashMap;

/// How a column's value is read from a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Int,
    /// A job id: a u64 stored in a signed 64-bit column, bit for bit.
    Id,
    Float,
    Bool,
    /// A JSON array or object, stored as its text.
    Json,
    /// The whole record's line.
    Record,
}

/// One column: its name, the record key it is read from, and whether a
/// record without it cannot be stored.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub key: &'static str,
    pub kind: Kind,
    pub required: bool,
}

const fn col(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        key: name,
        kind,
        required: false,
    }
}

const fn must(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        key: name,
        kind,
        required: true,
    }
}

/// A table the sink writes: its columns and key.
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [Column],
    /// The columns of the primary key.
    pub key: &'static [&'static str],
    /// A repeated key replaces the row (a job's record) rather than
    /// leaving the first (an event, which never changes).
    pub replace: bool,
    /// A row whose column (first) holds this text (second) is final: only
    /// a row holding it too replaces it (an INACTIVE job's record is not
    /// replaced by an update of the job while active, sent again after a
    /// restart).
    pub settled: Option<(&'static str, &'static str)>,
}

impl Table {
    /// Whether `row` is settled ([`Table::settled`]).
    fn is_settled(&self, row: &[Cell]) -> bool {
        let Some((column, value)) = self.settled else {
            return false;
        };
        self.columns
            .iter()
            .zip(row)
            .any(|(c, cell)| c.name == column && *cell == Cell::Text(Some(value.to_string())))
    }
}

use Kind::*;

/// One row per job, when it ends: the fields of `flux jobs --json` that
/// the job records carry, and the record itself.
pub const JOBS: Table = Table {
    name: "jobs",
    columns: &[
        must("cluster", Text),
        must("id", Id),
        must("record_id", Text),
        col("name", Text),
        col("queue", Text),
        col("project", Text),
        col("bank", Text),
        col("userid", Int),
        col("username", Text),
        must("state", Text),
        col("result", Text),
        col("success", Bool),
        col("exception_occurred", Bool),
        col("exception_type", Text),
        col("exception_severity", Int),
        col("exception_note", Text),
        col("returncode", Int),
        col("waitstatus", Int),
        col("priority", Int),
        col("urgency", Int),
        col("ntasks", Int),
        col("ncores", Int),
        col("ngpus", Int),
        col("nnodes", Int),
        col("nodelist", Text),
        col("ranks", Text),
        col("duration", Float),
        col("expiration", Float),
        col("dependencies", Json),
        col("t_submit", Float),
        col("t_depend", Float),
        col("t_run", Float),
        col("t_cleanup", Float),
        col("t_inactive", Float),
        must("record", Record),
    ],
    key: &["cluster", "id"],
    replace: true,
    settled: Some(("state", "INACTIVE")),
};

/// The hosts each job ran on, one row each: "which jobs ran on node12".
pub const JOB_NODES: Table = Table {
    name: "job_nodes",
    columns: &[
        must("cluster", Text),
        must("id", Id),
        must("hostname", Text),
    ],
    key: &["cluster", "id", "hostname"],
    replace: false,
    settled: None,
};

/// One row per change of a node's state (the `resources` stream).
pub const NODE_EVENTS: Table = Table {
    name: "node_events",
    columns: &[
        must("cluster", Text),
        must("record_id", Text),
        must("rank", Int),
        col("hostname", Text),
        col("timestamp", Float),
        col("event", Text),
        col("changed", Json),
        col("online", Bool),
        col("drained", Bool),
        col("draining", Bool),
        col("torpid", Bool),
        col("removed", Bool),
        col("drain_reason", Text),
        col("drain_timestamp", Float),
        must("record", Record),
    ],
    key: &["cluster", "record_id"],
    replace: false,
    settled: None,
};

/// Every job state transition, when the sink takes them.
pub const TRANSITIONS: Table = Table {
    name: "transitions",
    columns: &[
        must("cluster", Text),
        must("record_id", Text),
        must("id", Id),
        Column {
            name: "from_state",
            key: "from",
            kind: Text,
            required: true,
        },
        Column {
            name: "to_state",
            key: "to",
            kind: Text,
            required: true,
        },
        col("event", Text),
        must("timestamp", Float),
    ],
    key: &["cluster", "record_id"],
    replace: false,
    settled: None,
};

/// The tables, in the order a batch writes them.
pub const TABLES: [&Table; 4] = [&JOBS, &JOB_NODES, &NODE_EVENTS, &TRANSITIONS];

/// One value of a row, typed as its column.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Text(Option<String>),
    Int(Option<i64>),
    Float(Option<f64>),
    Bool(Option<bool>),
}

/// Why a record cannot be stored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RowError {
    #[error("not a JSON object: {0}")]
    NotJson(String),
    #[error("`{0}` is missing or of the wrong type")]
    Field(&'static str),
}

/// Rows of one table, one per key, in the order first seen.
#[derive(Debug, Default)]
pub struct Rows {
    rows: Vec<Vec<Cell>>,
    index: HashMap<Vec<u8>, usize>,
}

impl Rows {
    fn put(&mut self, table: &Table, row: Vec<Cell>) {
        let key = key_of(table, &row);
        match self.index.get(&key) {
            Some(&at) => {
                if !table.is_settled(&self.rows[at]) || table.is_settled(&row) {
                    self.rows[at] = row;
                }
            }
            None => {
                self.index.insert(key, self.rows.len());
                self.rows.push(row);
            }
        }
    }

    pub fn rows(&self) -> &[Vec<Cell>] {
        &self.rows
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A row's key, as bytes.
fn key_of(table: &Table, row: &[Cell]) -> Vec<u8> {
    let mut key = Vec::new();
    for (column, cell) in table.columns.iter().zip(row) {
        if table.key.contains(&column.name) {
            key.extend_from_slice(format!("{cell:?}").as_bytes());
            key.push(0);
        }
    }
    key
}

/// The rows made from a batch of records, one set per table.
#[derive(Debug, Default)]
pub struct Batch {
    jobs: Rows,
    job_nodes: Rows,
    node_events: Rows,
    transitions: Rows,
    /// Records of kinds the archive does not keep.
    pub ignored: usize,
}

impl Batch {
    /// Add one output record's line.
    pub fn add(&mut self, line: &str) -> Result<(), RowError> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| RowError::NotJson(e.to_string()))?;
        if !value.is_object() {
            return Err(RowError::NotJson("not an object".into()));
        }
        match value["kind"].as_str() {
            Some("job") => {
                let row = row_of(&JOBS, &value, line)?;
                let hosts = hosts_of(&value);
                self.jobs.put(&JOBS, row);
                for host in hosts {
                    let row = vec![
                        Cell::Text(value["cluster"].as_str().map(text)),
                        Cell::Int(value["id"].as_u64().map(stored_id)),
                        Cell::Text(Some(text(&host))),
                    ];
                    self.job_nodes.put(&JOB_NODES, row);
                }
            }
            Some("rank") => {
                let row = row_of(&NODE_EVENTS, &value, line)?;
                self.node_events.put(&NODE_EVENTS, row);
            }
            Some("transition") => {
                let row = row_of(&TRANSITIONS, &value, line)?;
                self.transitions.put(&TRANSITIONS, row);
            }
            _ => self.ignored += 1,
        }
        Ok(())
    }

    /// Each table with its rows, in the order of [`TABLES`].
    pub fn tables(&self) -> [(&'static Table, &Rows); 4] {
        [
            (&JOBS, &self.jobs),
            (&JOB_NODES, &self.job_nodes),
            (&NODE_EVENTS, &self.node_events),
            (&TRANSITIONS, &self.transitions),
        ]
    }

    pub fn is_empty(&self) -> bool {
        self.tables().iter().all(|(_, rows)| rows.is_empty())
    }

    /// The keys (cluster, stored id) of the batch's jobs that ended.
    pub fn finished_jobs(&self) -> Vec<(String, i64)> {
        let at = |name: &str| JOBS.columns.iter().position(|c| c.name == name);
        let (Some(cluster), Some(id), Some(state)) = (at("cluster"), at("id"), at("state")) else {
            return Vec::new();
        };
        self.jobs
            .rows()
            .iter()
            .filter(|row| row[state] == Cell::Text(Some("INACTIVE".into())))
            .filter_map(|row| match (&row[cluster], &row[id]) {
                (Cell::Text(Some(c)), Cell::Int(Some(i))) => Some((c.clone(), *i)),
                _ => None,
            })
            .collect()
    }

    pub fn clear(&mut self) {
        *self = Batch::default();
    }
}

/// A record's row for `table`.
fn row_of(table: &Table, value: &Value, line: &str) -> Result<Vec<Cell>, RowError> {
    table
        .columns
        .iter()
        .map(|c| {
            let v = &value[c.key];
            let cell = match c.kind {
                Text => Cell::Text(v.as_str().map(text)),
                Int => Cell::Int(v.as_i64()),
                Id => Cell::Int(v.as_u64().map(stored_id)),
                Float => Cell::Float(v.as_f64()),
                Bool => Cell::Bool(v.as_bool()),
                Json => Cell::Text((v.is_array() || v.is_object()).then(|| v.to_string())),
                Record => Cell::Text(Some(line.to_string())),
            };
            let missing = matches!(
                cell,
                Cell::Text(None) | Cell::Int(None) | Cell::Float(None) | Cell::Bool(None)
            );
            if missing && c.required {
                Err(RowError::Field(c.key))
            } else {
                Ok(cell)
            }
        })
        .collect()
}

/// Most hosts of one job kept in `job_nodes`: more than any machine has,
/// few enough that a forged nodelist (`n[0-4000000000]`) cannot fill the
/// database.
pub const MAX_JOB_HOSTS: usize = 1 << 17;

/// The hosts of a job's `nodelist` (none when it has none, it is not a
/// hostlist, or it names more than [`MAX_JOB_HOSTS`]).
fn hosts_of(job: &Value) -> Vec<String> {
    job["nodelist"]
        .as_str()
        .and_then(|l| Hostlist::parse(l).ok())
        .filter(|h| h.len() <= MAX_JOB_HOSTS)
        .map(|h| h.sorted_unique().iter().collect())
        .unwrap_or_default()
}

/// A job id as stored: the u64's bits in an i64.
pub fn stored_id(id: u64) -> i64 {
    id as i64
}

/// A stored job id, back as the u64 it was.
pub fn job_id(stored: i64) -> u64 {
    stored as u64
}

/// A text column's value: PostgreSQL's text cannot hold NUL, which JSON
/// input can (`\u0000`); it becomes U+FFFD, as invalid UTF-8 does. (The
/// `record` column keeps the line, where NUL is escaped.)
fn text(s: &str) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{FFFD}")
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const JOB: &str = r#"{"cluster":"c","dependencies":[],"duration":60.0,"exception_occurred":false,"id":18446744073709551615,"kind":"job","name":"hostname","nnodes":2,"nodelist":"node[3,1]","ntasks":2,"queue":"batch","record_id":"r1","result":"COMPLETED","state":"INACTIVE","success":true,"t_inactive":5.5,"userid":1000}"#;

    #[test]
    fn a_batch_names_its_finished_jobs() {
        let mut b = Batch::default();
        let job = |id: u64, state: &str| {
            format!(
                r#"{{"kind":"job","cluster":"c","id":{id},"record_id":"r{id}","state":"{state}"}}"#
            )
        };
        b.add(&job(1, "RUN")).unwrap();
        b.add(&job(2, "INACTIVE")).unwrap();
        b.add(&job(u64::MAX, "INACTIVE")).unwrap();
        b.add(&job(1, "INACTIVE")).unwrap();
        let mut done = b.finished_jobs();
        done.sort();
        assert_eq!(
            done,
            [
                ("c".to_string(), -1),
                ("c".to_string(), 1),
                ("c".to_string(), 2)
            ]
        );
    }

    #[test]
    fn a_job_record_is_one_row_and_one_row_per_host() {
        let mut b = Batch::default();
        b.add(JOB).unwrap();
        let [(_, jobs), (_, hosts), ..] = b.tables();
        assert_eq!(jobs.len(), 1);
        let row = &jobs.rows()[0];
        let cell = |name: &str| {
            let i = JOBS.columns.iter().position(|c| c.name == name).unwrap();
            row[i].clone()
        };
        assert_eq!(cell("id"), Cell::Int(Some(-1)));
        assert_eq!(cell("queue"), Cell::Text(Some("batch".into())));
        assert_eq!(cell("success"), Cell::Bool(Some(true)));
        assert_eq!(cell("dependencies"), Cell::Text(Some("[]".into())));
        assert_eq!(cell("t_run"), Cell::Float(None));
        assert_eq!(cell("record"), Cell::Text(Some(JOB.into())));
        let names: Vec<_> = hosts.rows().iter().map(|r| r[2].clone()).collect();
        assert_eq!(
            names,
            [
                Cell::Text(Some("node1".into())),
                Cell::Text(Some("node3".into()))
            ]
        );
    }

    #[test]
    fn a_key_repeated_in_a_batch_keeps_one_row_the_last() {
        let mut b = Batch::default();
        b.add(JOB).unwrap();
        b.add(&JOB.replace("\"r1\"", "\"r2\"")).unwrap();
        let [(_, jobs), ..] = b.tables();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs.rows()[0][2], Cell::Text(Some("r2".into())));
    }

    #[test]
    fn an_active_update_never_replaces_the_end_in_a_batch() {
        let mut b = Batch::default();
        let running = JOB
            .replace("\"r1\"", "\"r0\"")
            .replace("\"INACTIVE\"", "\"RUN\"");
        b.add(&running).unwrap();
        b.add(JOB).unwrap();
        // The update again (a restart sends it again): the end stays.
        b.add(&running).unwrap();
        let [(_, jobs), ..] = b.tables();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs.rows()[0][2], Cell::Text(Some("r1".into())));
    }

    #[test]
    fn ranks_and_transitions_go_to_their_tables_others_are_ignored() {
        let mut b = Batch::default();
        b.add(r#"{"kind":"rank","cluster":"c","rank":3,"hostname":"n3","drained":true,"drain_reason":"bad","changed":["drained"],"event":"drain","timestamp":2.0,"record_id":"x"}"#).unwrap();
        b.add(r#"{"kind":"transition","cluster":"c","id":7,"from":"SCHED","to":"RUN","event":"alloc","timestamp":3.0,"record_id":"y"}"#).unwrap();
        b.add(r#"{"kind":"alert","cluster":"c"}"#).unwrap();
        let counts: Vec<usize> = b.tables().iter().map(|(_, r)| r.len()).collect();
        assert_eq!(counts, [0, 0, 1, 1]);
        assert_eq!(b.ignored, 1);
    }

    #[test]
    fn a_record_without_its_key_is_refused() {
        let mut b = Batch::default();
        assert_eq!(
            b.add(r#"{"kind":"job","cluster":"c","state":"INACTIVE","record_id":"r"}"#),
            Err(RowError::Field("id"))
        );
        assert!(matches!(b.add("[1]"), Err(RowError::NotJson(_))));
        assert!(matches!(b.add("{"), Err(RowError::NotJson(_))));
        assert!(b.is_empty());
    }

    #[test]
    fn a_nul_in_a_text_becomes_a_replacement_character() {
        let mut b = Batch::default();
        b.add(&JOB.replace("hostname", "host\\u0000name")).unwrap();
        let [(_, jobs), ..] = b.tables();
        let i = JOBS.columns.iter().position(|c| c.name == "name").unwrap();
        assert_eq!(
            jobs.rows()[0][i],
            Cell::Text(Some("host\u{FFFD}name".into()))
        );
    }

    #[test]
    fn a_huge_nodelist_keeps_its_job_row_but_no_hosts() {
        let line = JOB.replace("node[3,1]", "n[0-4000000000]");
        let mut b = Batch::default();
        b.add(&line).unwrap();
        let counts: Vec<usize> = b.tables().iter().map(|(_, r)| r.len()).collect();
        assert_eq!(counts, [1, 0, 0, 0]);
    }

    proptest! {
        #[test]
        fn any_line_is_stored_or_refused_never_a_panic(line in ".{0,200}") {
            let mut b = Batch::default();
            let _ = b.add(&line);
        }

        #[test]
        fn any_job_id_comes_back_bit_for_bit(id in any::<u64>()) {
            prop_assert_eq!(job_id(stored_id(id)), id);
        }

        #[test]
        fn any_nodelist_never_panics(list in "[a-z0-9\\[\\],-]{0,40}") {
            let line = serde_json::json!({"kind": "job", "cluster": "c", "id": 1, "state": "INACTIVE", "record_id": "r", "nodelist": list}).to_string();
            let mut b = Batch::default();
            prop_assert!(b.add(&line).is_ok());
        }
    }
}
