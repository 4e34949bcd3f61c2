//! Output records → the archive's rows: which table a record goes to, its
//! columns, and its key, read from the record's typed fields (no line is
//! parsed back). Pure: no database here, so the mapping is tested (and
//! checked by proptest against the records' lines) on its own.
//!
//! A batch keeps one row per key (the last one seen): a record repeated
//! within a batch, as after a restart, is written once, and PostgreSQL's
//! `ON CONFLICT DO UPDATE` never meets the same key twice in a statement.

use crate::flux::hostlist::Hostlist;
use crate::output::{JobRecord, OutputRecord, Payload, RankRecord, TransitionRecord};
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

/// One column: its name, the record field it is read from (the key of the
/// record's line), and whether a record without it cannot be stored.
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
    #[error("`{0}` is missing or not of its column's type")]
    Field(&'static str),
}

/// A record's field as a column reads it.
#[derive(Debug, Clone, PartialEq)]
enum Field<'a> {
    Text(Option<&'a str>),
    /// A text made for the asking (a record id).
    Owned(String),
    Int(Option<i64>),
    Id(u64),
    Float(Option<f64>),
    Bool(Option<bool>),
    /// An array, as its JSON text.
    Json(String),
    Absent,
}

impl Field<'_> {
    /// The cell of a column of `kind` (the record's `line` for a
    /// [`Kind::Record`]); `None`: the field is missing.
    fn cell(self, kind: Kind, line: &str) -> Option<Cell> {
        let cell = match (kind, self) {
            (Text, Field::Text(t)) => Cell::Text(t.map(text)),
            (Text, Field::Owned(t)) => Cell::Text(Some(text(&t))),
            (Int, Field::Int(i)) => Cell::Int(i),
            (Id, Field::Id(i)) => Cell::Int(Some(stored_id(i))),
            // As JSON keeps them: a number that is not finite is null.
            (Float, Field::Float(f)) => Cell::Float(f.filter(|f| f.is_finite())),
            (Bool, Field::Bool(b)) => Cell::Bool(b),
            (Json, Field::Json(t)) => Cell::Text(Some(t)),
            (Record, _) => Cell::Text(Some(line.to_string())),
            _ => return None,
        };
        let missing = matches!(
            cell,
            Cell::Text(None) | Cell::Int(None) | Cell::Float(None) | Cell::Bool(None)
        );
        (!missing).then_some(cell)
    }
}

/// A record the archive keeps: its fields by the keys of its line.
trait Fields {
    fn field(&self, key: &str) -> Field<'_>;
}

impl Fields for JobRecord {
    fn field(&self, key: &str) -> Field<'_> {
        fn t(v: &Option<compact_str::CompactString>) -> Field<'_> {
            Field::Text(v.as_deref())
        }
        fn s(v: &Option<String>) -> Field<'_> {
            Field::Text(v.as_deref())
        }
        let n = |v: Option<u32>| Field::Int(v.map(i64::from));
        match key {
            "cluster" => Field::Text(Some(&self.cluster)),
            "id" => Field::Id(self.id),
            "record_id" => Field::Text(Some(&self.record_id)),
            "name" => t(&self.name),
            "queue" => t(&self.queue),
            "project" => t(&self.project),
            "bank" => t(&self.bank),
            "userid" => Field::Int(self.userid),
            "username" => t(&self.username),
            "state" => Field::Text(Some(self.state.as_str())),
            "result" => Field::Text(self.result.map(|r| r.as_str())),
            "success" => Field::Bool(self.success),
            "exception_occurred" => Field::Bool(Some(self.exception_occurred)),
            "exception_type" => s(&self.exception_type),
            "exception_severity" => Field::Int(self.exception_severity),
            "exception_note" => s(&self.exception_note),
            "returncode" => Field::Int(self.returncode),
            "waitstatus" => Field::Int(self.waitstatus),
            "priority" => Field::Int(self.priority),
            "urgency" => Field::Int(self.urgency),
            "ntasks" => n(self.ntasks),
            "ncores" => n(self.ncores),
            "ngpus" => n(self.ngpus),
            "nnodes" => n(self.nnodes),
            "nodelist" => t(&self.nodelist),
            "ranks" => s(&self.ranks),
            "duration" => Field::Float(self.duration),
            "expiration" => Field::Float(self.expiration),
            "dependencies" => Field::Json(json_text(&self.dependencies)),
            "t_submit" => Field::Float(self.t_submit),
            "t_depend" => Field::Float(self.t_depend),
            "t_run" => Field::Float(self.t_run),
            "t_cleanup" => Field::Float(self.t_cleanup),
            "t_inactive" => Field::Float(self.t_inactive),
            _ => Field::Absent,
        }
    }
}

impl Fields for RankRecord {
    fn field(&self, key: &str) -> Field<'_> {
        let after = self.after();
        let flag = |f: fn(&crate::flux::resource::RankState) -> bool| Field::Bool(after.map(f));
        match key {
            "cluster" => Field::Text(Some(&self.cluster)),
            "record_id" => Field::Owned(self.record_id()),
            "rank" => Field::Int(Some(i64::from(self.rank()))),
            "hostname" => Field::Text(after.and_then(|r| r.hostname.as_deref())),
            "timestamp" => Field::Float(self.timestamp()),
            "event" => Field::Text(self.event_name()),
            "changed" => Field::Json(json_text(&self.changed())),
            "online" => Field::Bool(after.and_then(|r| r.online)),
            "drained" => flag(|r| r.drained),
            "draining" => flag(|r| r.draining),
            "torpid" => flag(|r| r.torpid),
            "removed" => Field::Bool(after.is_none().then_some(true)),
            "drain_reason" => Field::Text(after.and_then(|r| r.drain_reason.as_deref())),
            "drain_timestamp" => Field::Float(after.and_then(|r| r.drain_timestamp)),
            _ => Field::Absent,
        }
    }
}

impl Fields for TransitionRecord {
    fn field(&self, key: &str) -> Field<'_> {
        match key {
            "cluster" => Field::Text(Some(&self.cluster)),
            "record_id" => Field::Owned(self.record_id()),
            "id" => Field::Id(self.id.0),
            "from" => Field::Text(Some(self.from_state().as_str())),
            "to" => Field::Text(Some(self.to_state().as_str())),
            "event" => Field::Text(Some(&self.event)),
            "timestamp" => Field::Float(Some(self.timestamp())),
            _ => Field::Absent,
        }
    }
}

/// An array's JSON text.
fn json_text(items: &[impl serde::Serialize]) -> String {
    serde_json::to_string(items).unwrap_or_default()
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
    /// Add one output record.
    pub fn add(&mut self, record: &OutputRecord) -> Result<(), RowError> {
        match record.payload() {
            Payload::Job(job) => {
                let row = row_of(&JOBS, &**job, record.line())?;
                self.jobs.put(&JOBS, row);
                for host in hosts_of(job) {
                    let row = vec![
                        Cell::Text(Some(text(&job.cluster))),
                        Cell::Int(Some(stored_id(job.id))),
                        Cell::Text(Some(text(&host))),
                    ];
                    self.job_nodes.put(&JOB_NODES, row);
                }
            }
            Payload::Rank(rank) => {
                let row = row_of(&NODE_EVENTS, &**rank, record.line())?;
                self.node_events.put(&NODE_EVENTS, row);
            }
            Payload::Transition(t) => {
                let row = row_of(&TRANSITIONS, t, record.line())?;
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
fn row_of(table: &Table, record: &impl Fields, line: &str) -> Result<Vec<Cell>, RowError> {
    table
        .columns
        .iter()
        .map(|c| match record.field(c.key).cell(c.kind, line) {
            Some(cell) => Ok(cell),
            None if c.required => Err(RowError::Field(c.key)),
            None => Ok(empty(c.kind)),
        })
        .collect()
}

/// The cell of a missing field: NULL.
fn empty(kind: Kind) -> Cell {
    match kind {
        Text | Json | Record => Cell::Text(None),
        Int | Id => Cell::Int(None),
        Float => Cell::Float(None),
        Bool => Cell::Bool(None),
    }
}

/// Most hosts of one job kept in `job_nodes`: more than any machine has,
/// few enough that a forged nodelist (`n[0-4000000000]`) cannot fill the
/// database.
pub const MAX_JOB_HOSTS: usize = 1 << 17;

/// The hosts of a job's `nodelist` (none when it has none, it is not a
/// hostlist, or it names more than [`MAX_JOB_HOSTS`]).
fn hosts_of(job: &JobRecord) -> Vec<String> {
    job.nodelist
        .as_deref()
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

    use crate::flux::job::{JobState, Transition};
    use crate::flux::jobid::JobId;
    use crate::flux::resource::{RankChange, RankState};
    use serde_json::Value;

    const JOB: &str = r#"{"cluster":"c","dependencies":[],"duration":60.0,"exception_occurred":false,"id":18446744073709551615,"jobid":"x","kind":"job","name":"hostname","nnodes":2,"nodelist":"node[3,1]","ntasks":2,"queue":"batch","record_id":"r1","result":"COMPLETED","state":"INACTIVE","success":true,"t_inactive":5.5,"userid":1000}"#;

    /// A job record read from its line.
    fn job(line: &str) -> OutputRecord {
        OutputRecord::job(serde_json::from_str(line).unwrap())
    }

    fn rank_record() -> OutputRecord {
        let after = RankState {
            rank: 3,
            hostname: Some("n3".into()),
            drained: true,
            drain_reason: Some("bad".into()),
            drain_timestamp: Some(2.0),
            ..RankState::new(3)
        };
        let change = RankChange {
            rank: 3,
            before: Some(RankState {
                drained: false,
                ..after.clone()
            }),
            after: Some(after),
        };
        OutputRecord::rank_change("c", change, Some(("drain", 2.0)))
    }

    fn transition_record() -> OutputRecord {
        let t = crate::keyed::state::KeyedTransition {
            key: crate::keyed::JobKey {
                cluster: "c".into(),
                id: JobId(7),
            },
            transition: Transition {
                from: JobState::Sched,
                to: JobState::Run,
                timestamp: 3.0,
            },
        };
        OutputRecord::transition(&t, "alloc")
    }

    /// The row as the archive read it from a record's line before records
    /// had types: every column by its key.
    fn row_of_line(table: &Table, line: &str) -> Vec<Cell> {
        let value: Value = serde_json::from_str(line).unwrap();
        table
            .columns
            .iter()
            .map(|c| {
                let v = &value[c.key];
                match c.kind {
                    Text => Cell::Text(v.as_str().map(text)),
                    Int => Cell::Int(v.as_i64()),
                    Id => Cell::Int(v.as_u64().map(stored_id)),
                    Float => Cell::Float(v.as_f64()),
                    Bool => Cell::Bool(v.as_bool()),
                    Json => Cell::Text((v.is_array() || v.is_object()).then(|| v.to_string())),
                    Record => Cell::Text(Some(line.to_string())),
                }
            })
            .collect()
    }

    fn only_row(b: &Batch, table: usize) -> Vec<Cell> {
        let tables = b.tables();
        assert_eq!(tables[table].1.len(), 1);
        tables[table].1.rows()[0].clone()
    }

    #[test]
    fn a_batch_names_its_finished_jobs() {
        let mut b = Batch::default();
        let job = |id: u64, state: &str| {
            job(&format!(
                r#"{{"kind":"job","cluster":"c","id":{id},"record_id":"r{id}","state":"{state}"}}"#
            ))
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
        let record = job(JOB);
        b.add(&record).unwrap();
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
        assert_eq!(record.line(), JOB, "the line is the record, written again");
        assert_eq!(cell("record"), Cell::Text(Some(JOB.into())));
        assert_eq!(*row, row_of_line(&JOBS, JOB));
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
        b.add(&job(JOB)).unwrap();
        b.add(&job(&JOB.replace("\"r1\"", "\"r2\""))).unwrap();
        let [(_, jobs), ..] = b.tables();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs.rows()[0][2], Cell::Text(Some("r2".into())));
    }

    #[test]
    fn an_active_update_never_replaces_the_end_in_a_batch() {
        let mut b = Batch::default();
        let running = job(&JOB
            .replace("\"r1\"", "\"r0\"")
            .replace("\"INACTIVE\"", "\"RUN\""));
        b.add(&running).unwrap();
        b.add(&job(JOB)).unwrap();
        // The update again (a restart sends it again): the end stays.
        b.add(&running).unwrap();
        let [(_, jobs), ..] = b.tables();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs.rows()[0][2], Cell::Text(Some("r1".into())));
    }

    #[test]
    fn ranks_and_transitions_go_to_their_tables_others_are_ignored() {
        let mut b = Batch::default();
        let (rank, transition) = (rank_record(), transition_record());
        b.add(&rank).unwrap();
        b.add(&transition).unwrap();
        b.add(&OutputRecord::alert(crate::output::AlertRecord::of_job(
            "firing", "f1", 1.0, None,
        )))
        .unwrap();
        let counts: Vec<usize> = b.tables().iter().map(|(_, r)| r.len()).collect();
        assert_eq!(counts, [0, 0, 1, 1]);
        assert_eq!(b.ignored, 1);
        // The same rows as read from the lines.
        assert_eq!(only_row(&b, 2), row_of_line(&NODE_EVENTS, rank.line()));
        assert_eq!(
            only_row(&b, 3),
            row_of_line(&TRANSITIONS, transition.line())
        );
        let at = |t: &Table, c: &str| t.columns.iter().position(|x| x.name == c).unwrap();
        assert_eq!(
            only_row(&b, 2)[at(&NODE_EVENTS, "drain_reason")],
            Cell::Text(Some("bad".into()))
        );
        assert_eq!(
            only_row(&b, 3)[at(&TRANSITIONS, "from_state")],
            Cell::Text(Some("SCHED".into()))
        );
    }

    #[test]
    fn a_removed_rank_and_a_change_no_event_made_have_their_rows() {
        let removed = RankChange {
            rank: 9,
            before: Some(RankState::new(9)),
            after: None,
        };
        let mut draining = rank_record();
        if let Payload::Rank(r) = draining.payload() {
            let mut change = r.change.clone();
            if let Some(a) = change.after.as_mut() {
                a.draining = true;
            }
            draining = OutputRecord::rank_change_at("c", change, 5.0);
        }
        for record in [OutputRecord::rank_change("c", removed, None), draining] {
            let mut b = Batch::default();
            b.add(&record).unwrap();
            assert_eq!(
                only_row(&b, 2),
                row_of_line(&NODE_EVENTS, record.line()),
                "{}",
                record.line()
            );
        }
    }

    #[test]
    fn a_nul_in_a_text_becomes_a_replacement_character() {
        let mut b = Batch::default();
        b.add(&job(&JOB.replace("hostname", "host\\u0000name")))
            .unwrap();
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
        b.add(&job(&line)).unwrap();
        let counts: Vec<usize> = b.tables().iter().map(|(_, r)| r.len()).collect();
        assert_eq!(counts, [1, 0, 0, 0]);
    }

    #[test]
    fn every_column_is_a_field_of_its_record() {
        let full = r#"{"bank":"b","cluster":"c","dependencies":["after:1"],"duration":1.0,"exception_note":"n","exception_occurred":true,"exception_severity":0,"exception_type":"t","expiration":2.0,"id":1,"jobid":"f","kind":"job","name":"x","ncores":1,"ngpus":1,"nnodes":1,"nodelist":"n1","ntasks":1,"priority":1,"project":"p","queue":"q","ranks":"0","record_id":"r","result":"FAILED","returncode":1,"state":"INACTIVE","success":false,"t_cleanup":4.0,"t_depend":1.0,"t_inactive":5.0,"t_run":3.0,"t_submit":0.5,"urgency":16,"userid":5,"username":"u","waitstatus":256}"#;
        let Payload::Job(j) = job(full).payload().clone() else {
            unreachable!()
        };
        for c in JOBS.columns.iter().filter(|c| c.kind != Record) {
            assert_ne!(j.field(c.key), Field::Absent, "{}", c.key);
        }
        let mut b = Batch::default();
        b.add(&job(full)).unwrap();
        assert_eq!(only_row(&b, 0), row_of_line(&JOBS, full));
        assert!(only_row(&b, 0).iter().all(|c| !matches!(
            c,
            Cell::Text(None) | Cell::Int(None) | Cell::Float(None) | Cell::Bool(None)
        )));
        for (table, record) in [
            (&NODE_EVENTS, rank_record()),
            (&TRANSITIONS, transition_record()),
        ] {
            for c in table
                .columns
                .iter()
                .filter(|c| c.kind != Record && c.key != "removed")
            {
                let field = match record.payload() {
                    Payload::Rank(r) => r.field(c.key),
                    Payload::Transition(t) => t.field(c.key),
                    _ => Field::Absent,
                };
                assert_ne!(field, Field::Absent, "{}", c.key);
            }
        }
    }

    proptest! {
        #[test]
        fn a_job_rows_cells_are_what_its_line_says(
            id in any::<u64>(),
            name in "\\PC{0,12}",
            state in prop::sample::select(vec!["NEW", "SCHED", "RUN", "INACTIVE"]),
            nodelist in "[a-z0-9\\[\\],-]{0,40}",
            userid in any::<i64>(),
            t_run in prop::option::of(any::<f64>()),
            ncores in prop::option::of(any::<u32>()),
            deps in prop::collection::vec("\\PC{0,6}", 0..3),
        ) {
            let v = serde_json::json!({"kind": "job", "cluster": "c", "id": id, "state": state,
                "record_id": "r", "name": name, "nodelist": nodelist, "userid": userid,
                "t_run": t_run, "ncores": ncores, "dependencies": deps});
            let record = OutputRecord::job(serde_json::from_value(v).unwrap());
            let mut b = Batch::default();
            prop_assert!(b.add(&record).is_ok());
            prop_assert_eq!(only_row(&b, 0), row_of_line(&JOBS, record.line()));
        }

        #[test]
        fn any_job_id_comes_back_bit_for_bit(id in any::<u64>()) {
            prop_assert_eq!(job_id(stored_id(id)), id);
        }
    }
}
