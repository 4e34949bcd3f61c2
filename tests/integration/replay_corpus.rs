//! `fluxpipe replay` on real Flux eventlogs must agree with flux-core's own
//! answers (`flux jobs --json`, job-list records, resource status) on every
//! job and rank field.

use crate::common;
use crate::common::corpus;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn replay(paths: &[&Path]) -> Vec<Value> {
    common::replay(&[], paths)
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("read")).expect("json")
}

const FIELDS: &[&str] = &[
    "state",
    "result",
    "success",
    "waitstatus",
    "returncode",
    "urgency",
    "priority",
    "userid",
    "t_submit",
    "t_depend",
    "t_run",
    "t_cleanup",
    "t_inactive",
    // From the jobspec (and its updates) and R.
    "name",
    "queue",
    "project",
    "bank",
    "duration",
    "ntasks",
    "ncores",
    "nnodes",
    "nodelist",
    "ranks",
];

/// flux-core's answer for one job, in fluxpipe's field names.
fn expected_job(fj: &Value, raw: Option<&Value>) -> BTreeMap<String, Value> {
    let mut e: BTreeMap<String, Value> = FIELDS
        .iter()
        .map(|k| (k.to_string(), fj.get(*k).cloned().unwrap_or(Value::Null)))
        .collect();
    let ex = fj.get("exception").cloned().unwrap_or(Value::Null);
    let occurred = ex.get("occurred").and_then(Value::as_bool).unwrap_or(false);
    e.insert("exception_occurred".into(), Value::Bool(occurred));
    if occurred {
        e.insert("exception_type".into(), ex["type"].clone());
        e.insert("exception_severity".into(), ex["severity"].clone());
        e.insert("exception_note".into(), ex["note"].clone());
    }
    let deps = raw
        .and_then(|r| r.get("dependencies").cloned())
        .or_else(|| fj.get("dependencies").cloned())
        .unwrap_or(Value::Array(vec![]));
    e.insert("dependencies".into(), deps);
    e
}

/// Same rule as the shared checker: an absent answer allows absent, 0 or
/// empty; numbers agree within 1e-5 (drain timestamps: 1 s, as `flux
/// resource status` rounds them).
fn same(exp: &Value, act: Option<&Value>, key: &str) -> bool {
    let act = act.unwrap_or(&Value::Null);
    match exp {
        Value::Null => match act {
            Value::Null => true,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            _ => false,
        },
        Value::Number(n) => {
            let tol = if key == "drain_timestamp" { 1.0 } else { 1e-5 };
            match (n.as_f64(), act.as_f64()) {
                (Some(a), Some(b)) => (a - b).abs() <= tol,
                _ => false,
            }
        }
        Value::Array(a) => {
            let set = |v: &Vec<Value>| v.iter().map(|x| x.to_string()).collect::<BTreeSet<_>>();
            matches!(act, Value::Array(b) if set(a) == set(b))
        }
        _ => exp == act,
    }
}

fn check<K: Ord + std::fmt::Debug>(
    label: &str,
    expected: &BTreeMap<K, BTreeMap<String, Value>>,
    actual: &BTreeMap<K, Value>,
) -> Vec<String> {
    let mut bad = Vec::new();
    for (key, exp) in expected {
        let Some(act) = actual.get(key) else {
            bad.push(format!("{label} {key:?}: missing"));
            continue;
        };
        for (field, want) in exp {
            if !same(want, act.get(field), field) {
                bad.push(format!(
                    "{label} {key:?}: {field} expected {want} got {:?}",
                    act.get(field)
                ));
            }
        }
    }
    bad
}

fn jobs_of(out: &[Value]) -> BTreeMap<u64, Value> {
    out.iter()
        .filter(|o| o["kind"] == "job")
        .map(|o| (o["id"].as_u64().expect("id"), o.clone()))
        .collect()
}

fn ranks_of(out: &[Value]) -> BTreeMap<u64, Value> {
    out.iter()
        .filter(|o| o["kind"] == "rank")
        .map(|o| (o["rank"].as_u64().expect("rank"), o.clone()))
        .collect()
}

fn anomalies_of(out: &[Value]) -> Vec<&Value> {
    out.iter().filter(|o| o["kind"] == "anomaly").collect()
}

fn idset(s: &str) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for part in s
        .trim_matches(['[', ']'])
        .split(',')
        .filter(|p| !p.is_empty())
    {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        out.extend(a.parse::<u64>().expect("id")..=b.parse::<u64>().expect("id"));
    }
    out
}

/// flux-core's resource status → expected rank fields.
fn expected_ranks(status: &Value) -> BTreeMap<u64, BTreeMap<String, Value>> {
    let online = idset(status["online"].as_str().unwrap_or(""));
    let torpid = idset(status["torpid"].as_str().unwrap_or(""));
    let all: Vec<&str> = status["R"]["execution"]["R_lite"]
        .as_array()
        .expect("R_lite")
        .iter()
        .map(|x| x["rank"].as_str().expect("rank"))
        .collect();
    let mut out = BTreeMap::new();
    for r in idset(&all.join(",")) {
        let mut e = BTreeMap::new();
        e.insert("online".into(), Value::Bool(online.contains(&r)));
        e.insert("torpid".into(), Value::Bool(torpid.contains(&r)));
        let d = status["drain"].get(r.to_string());
        e.insert("drained".into(), Value::Bool(d.is_some()));
        if let Some(d) = d {
            e.insert("drain_reason".into(), d["reason"].clone());
            e.insert("drain_timestamp".into(), d["timestamp"].clone());
        }
        out.insert(r, e);
    }
    out
}

#[test]
fn job_folders_agree_with_flux_jobs() {
    let jobs_dir = corpus().join("jobs");
    let mut expected = BTreeMap::new();
    for entry in std::fs::read_dir(&jobs_dir).expect("jobs dir") {
        let dir = entry.expect("entry").path();
        let id: u64 = dir.file_name().unwrap().to_str().unwrap().parse().unwrap();
        let fj = read_json(&dir.join("flux-jobs.json"));
        let raw = read_json(&dir.join("job-list.list-id.raw.json"));
        expected.insert(id, expected_job(&fj, Some(&raw["job"])));
    }
    assert_eq!(expected.len(), 52);
    let out = replay(&[&jobs_dir]);
    let bad = check("jobs/", &expected, &jobs_of(&out));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // Real logs of a healthy flux-core break no rule.
    let anomalies = anomalies_of(&out);
    assert!(anomalies.is_empty(), "{anomalies:#?}");
}

#[test]
fn instance_b_journals_agree_with_flux_core() {
    let b = corpus().join("instances/B");
    let out = replay(&[&b.join("journals")]);
    let raw_of = |id: u64| {
        let p = corpus().join(format!("jobs/{id}/job-list.list-id.raw.json"));
        p.exists().then(|| read_json(&p)["job"].clone())
    };
    let expected: BTreeMap<u64, _> = read_json(&b.join("flux-jobs-a.json"))["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|fj| {
            let id = fj["id"].as_u64().expect("id");
            (id, expected_job(fj, raw_of(id).as_ref()))
        })
        .collect();
    assert!(!expected.is_empty());
    let mut bad = check("B journals job", &expected, &jobs_of(&out));
    let ranks = expected_ranks(&read_json(&b.join("resource.status.raw.json")));
    bad.extend(check("B journals rank", &ranks, &ranks_of(&out)));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let anomalies = anomalies_of(&out);
    assert!(anomalies.is_empty(), "{anomalies:#?}");
}

#[test]
fn instance_a_resource_journal_agrees_with_flux_core() {
    let a1 = corpus().join("instances/A-incarnation1");
    let out = replay(&[&a1.join("resource.journal.jsonl")]);
    let ranks = expected_ranks(&read_json(&a1.join("resource.status.rpc.json")));
    let bad = check("A-incarnation1 rank", &ranks, &ranks_of(&out));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // node[0-3]: hostnames come from the restart event's nodelist.
    let r = ranks_of(&out);
    assert_eq!(r[&2]["hostname"], "node2");
}

#[test]
fn journal_and_kvs_copies_of_the_same_jobs_are_not_applied_twice() {
    // Instance B's jobs are in the job folders and in its journals: read
    // together, each event is applied once and the answers do not change.
    let jobs_dir = corpus().join("jobs");
    let journals = corpus().join("instances/B/journals");
    let alone = jobs_of(&replay(&[&jobs_dir]));
    let both = jobs_of(&replay(&[&jobs_dir, &journals]));
    for (id, job) in &alone {
        let other = &both[id];
        for f in FIELDS {
            assert!(same(&job[*f], other.get(*f), f), "job {id} field {f}");
        }
    }
}

#[test]
fn production_resource_eventlog_replays() {
    let p = corpus().join("upstream-testdata/resource/resource.eventlog.thing2");
    let out = replay(&[&p]);
    // The old format (drains without nodelist, resource-init) still yields ranks.
    assert!(!ranks_of(&out).is_empty());
}

#[test]
fn old_kvs_dumps_replay() {
    // Each dump is one instance (their job ids overlap): replay them apart.
    let dumps = corpus().join("upstream-testdata/job-manager-dumps/valid");
    for dump in std::fs::read_dir(&dumps).expect("dumps") {
        let dump = dump.expect("entry").path();
        let out = replay(&[&dump]);
        let jobs = jobs_of(&out);
        assert!(!jobs.is_empty(), "{}", dump.display());
        for (id, j) in &jobs {
            assert_eq!(j["state"], "INACTIVE", "{} job {id}", dump.display());
        }
        let anomalies = anomalies_of(&out);
        assert!(anomalies.is_empty(), "{}: {anomalies:#?}", dump.display());
    }
}
