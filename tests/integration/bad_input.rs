//! Hostile input through the real pipeline: the bad-input corpus of
//! `tests/bad-input/` (see its generate.py), plus what does not belong in
//! a text file (invalid UTF-8, NUL bytes, a 10 MB line, 100k-deep nesting,
//! a 700 KB context), interleaved with three good jobs. Every line gets the
//! outcome `expected.txt` gives it; the good jobs come out whole; nothing
//! panics or stalls.

use crate::common::fluxpipe;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::Stdio;

#[test]
fn every_bad_line_gets_its_outcome_and_good_jobs_survive() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad-input");
    let text = std::fs::read(dir.join("lines.jsonl")).expect("lines.jsonl");
    let mut lines: Vec<Vec<u8>> = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let mut expected: Vec<String> = std::fs::read_to_string(dir.join("expected.txt"))
        .expect("expected.txt")
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), expected.len());

    // A 700 KB context on a memo of job 3, right after its submit (line 5).
    let keys: serde_json::Map<String, Value> = (0..40_000)
        .map(|i| (format!("k{i}"), Value::from(i)))
        .collect();
    let memo = serde_json::json!({"cluster": "x", "stream": "job", "id": 3,
        "event": {"timestamp": 300.1, "name": "memo", "context": keys}});
    lines.insert(5, memo.to_string().into_bytes());
    expected.insert(5, "good".into());
    let extras: Vec<Vec<u8>> = vec![
        b"\xff\xfe{\"cluster\":\"x\"}".to_vec(),
        b"{\"cluster\":\"x\",\"stream\":\"job\",\"id\":1,\0\"event\":{}}".to_vec(),
        [b"{\"s\":\"".to_vec(), vec![b'a'; 10 << 20], b"\"}".to_vec()].concat(),
        [vec![b'['; 100_000], vec![b']'; 100_000]].concat(),
    ];
    for e in extras {
        lines.push(e);
        expected.push("dead_letter".into());
    }
    let mut input = Vec::new();
    for l in &lines {
        input.extend_from_slice(l);
        input.push(b'\n');
    }

    let tmp = tempfile::tempdir().expect("tempdir");
    let out_path = tmp.path().join("out.jsonl");
    let config = tmp.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\nformat = \"envelope\"\n\
             [sinks.out]\ntype = \"file\"\npath = {:?}\n\
             inputs = [\"jobs\", \"anomalies\", \"dead_letter\"]\n",
            tmp.path().join("data"),
            out_path
        ),
    )
    .expect("config");
    let mut child = fluxpipe()
        .args(["run", "--config"])
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&input).expect("write");
    drop(stdin);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");

    let records: Vec<Value> = std::fs::read_to_string(&out_path)
        .expect("output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON record"))
        .collect();
    let of_kind = |k: &'static str| records.iter().filter(move |r| r["kind"] == k);

    // Dead letters: exactly the undecodable lines, each with a reason.
    let dead: BTreeSet<String> = of_kind("dead_letter")
        .map(|r| {
            assert!(r["error"].as_str().is_some_and(|e| !e.is_empty()), "{r}");
            assert!(
                r["line"].as_str().is_some_and(|l| l.len() <= 4096 * 3),
                "{r}"
            );
            r["location"].as_str().unwrap_or("").to_string()
        })
        .collect();
    let want_dead: BTreeSet<String> = expected
        .iter()
        .enumerate()
        .filter(|(_, e)| *e == "dead_letter")
        .map(|(i, _)| format!("stdin:{}", i + 1))
        .collect();
    assert_eq!(dead, want_dead);
    assert_eq!(of_kind("dead_letter").count(), want_dead.len(), "one each");
    assert!(
        of_kind("dead_letter").any(|r| r["truncated"] == true),
        "the 10 MB line is cut in its dead letter"
    );

    // Anomalies: exactly the expected kinds, for the expected jobs.
    let mut anomalies: Vec<(String, u64)> = of_kind("anomaly")
        .map(|r| {
            (
                r["anomaly"].as_str().unwrap_or("").to_string(),
                r["id"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    anomalies.sort();
    let mut want: Vec<(String, u64)> = expected
        .iter()
        .filter_map(|e| e.strip_prefix("anomaly:"))
        .flat_map(|spec| {
            let (kinds, id) = spec.split_once('@').expect("KINDS@ID");
            let id: u64 = id.parse().expect("id");
            kinds.split(',').map(move |k| (k.to_string(), id))
        })
        .collect();
    want.sort();
    assert_eq!(anomalies, want);

    // The good jobs, whole.
    let jobs: BTreeMap<u64, String> = of_kind("job")
        .map(|r| {
            (
                r["id"].as_u64().unwrap_or(0),
                r["result"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let want_jobs: BTreeMap<u64, String> = [(1, "COMPLETED"), (2, "FAILED"), (3, "COMPLETED")]
        .into_iter()
        .map(|(i, r)| (i, r.to_string()))
        .collect();
    assert_eq!(jobs, want_jobs);
}

/// Garbage does not come out as several times its size in dead letters:
/// at most `dead_letters_per_sec` a second are written; all are counted.
#[test]
fn dead_letters_are_capped_per_second() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out_path = tmp.path().join("out.jsonl");
    let config = tmp.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\ndead_letters_per_sec = 50\n\
             [sinks.out]\ntype = \"file\"\npath = {:?}\ninputs = [\"dead_letter\"]\n",
            tmp.path().join("data"),
            out_path
        ),
    )
    .expect("config");
    let mut child = fluxpipe()
        .args(["run", "--config"])
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let started = std::time::Instant::now();
    let mut stdin = child.stdin.take().expect("stdin");
    let garbage: String = (0..5000).map(|i| format!("garbage {i} {{\n")).collect();
    stdin.write_all(garbage.as_bytes()).expect("write");
    drop(stdin);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
    let secs = started.elapsed().as_secs() + 1;
    let written = std::fs::read_to_string(&out_path)
        .expect("output")
        .lines()
        .count() as u64;
    println!("5000 garbage lines in {secs} s or less: {written} dead letters written");
    assert!(written >= 50, "{written}");
    assert!(written <= 50 * secs, "{written} in {secs} s");
}
