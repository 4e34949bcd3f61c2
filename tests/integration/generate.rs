//! `fluxpipe generate` output replays with zero anomalies, in both formats.

use crate::common;
use crate::common::generate;

use serde_json::Value;
use std::path::Path;

fn replay(path: &Path) -> Vec<Value> {
    common::replay(&[], &[path])
}

#[test]
fn generated_journal_and_kvs_tree_replay_without_anomalies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("w.jsonl");
    let args = ["--seed", "11", "--jobs", "400", "--nodes", "12"];
    generate(&args, &journal);
    let kvs = dir.path().join("dump");
    generate(&[&args[..], &["--format", "kvs"]].concat(), &kvs);

    let from_journal = replay(&journal);
    let from_kvs = replay(&kvs);
    for records in [&from_journal, &from_kvs] {
        let anomalies: Vec<_> = records.iter().filter(|r| r["kind"] == "anomaly").collect();
        assert!(anomalies.is_empty(), "{anomalies:?}");
        let jobs: Vec<_> = records.iter().filter(|r| r["kind"] == "job").collect();
        assert_eq!(jobs.len(), 400);
        assert!(jobs.iter().all(|j| j["state"] == "INACTIVE"));
        for result in ["COMPLETED", "FAILED", "CANCELED", "TIMEOUT"] {
            assert!(jobs.iter().any(|j| j["result"] == result), "no {result}");
        }
        assert_eq!(records.iter().filter(|r| r["kind"] == "rank").count(), 12);
    }
    // The same jobs either way.
    let jobs = |rs: &[Value]| -> Vec<Value> {
        let mut v: Vec<Value> = rs.iter().filter(|r| r["kind"] == "job").cloned().collect();
        v.sort_by_key(|j| j["id"].as_u64());
        v
    };
    assert_eq!(jobs(&from_journal), jobs(&from_kvs));

    // Deterministic by seed.
    let again = dir.path().join("again.jsonl");
    generate(&args, &again);
    assert_eq!(
        std::fs::read(&journal).expect("read"),
        std::fs::read(&again).expect("read")
    );

    // Active jobs never finish.
    let active = dir.path().join("active.jsonl");
    generate(&[&args[..], &["--active"]].concat(), &active);
    let records = replay(&active);
    assert!(records.iter().all(|r| r["kind"] != "anomaly"));
    assert!(
        records
            .iter()
            .filter(|r| r["kind"] == "job")
            .all(|j| j["state"] != "INACTIVE")
    );
}
