//! Hand-written eventlogs for every rule of NOTES.md and every anomaly
//! kind, run through the real `fluxpipe replay` binary on real files.

use crate::common;
use crate::common::fluxpipe;

use serde_json::{Value, json};
use std::path::Path;

/// Write `files` (path → content) under a fresh folder and replay it.
fn replay_files(files: &[(&str, &str)], extra: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, content) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, content).expect("write");
    }
    replay_paths(&[dir.path()], extra)
}

fn replay_paths(paths: &[&Path], extra: &[&str]) -> Vec<Value> {
    common::replay(extra, paths)
}

fn of_kind<'a>(out: &'a [Value], kind: &str) -> Vec<&'a Value> {
    out.iter().filter(|o| o["kind"] == kind).collect()
}

fn job(out: &[Value], id: u64) -> &Value {
    out.iter()
        .find(|o| o["kind"] == "job" && o["id"] == id)
        .unwrap_or_else(|| panic!("job {id} not in {out:#?}"))
}

fn rank(out: &[Value], r: u64) -> &Value {
    out.iter()
        .find(|o| o["kind"] == "rank" && o["rank"] == r)
        .unwrap_or_else(|| panic!("rank {r} not in {out:#?}"))
}

fn anomaly_kinds(out: &[Value]) -> Vec<String> {
    of_kind(out, "anomaly")
        .iter()
        .map(|a| a["anomaly"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn lines(events: &[Value]) -> String {
    events.iter().map(|e| format!("{e}\n")).collect()
}

fn e(ts: f64, name: &str) -> Value {
    json!({"timestamp": ts, "name": name})
}

fn ec(ts: f64, name: &str, ctx: Value) -> Value {
    json!({"timestamp": ts, "name": name, "context": ctx})
}

fn submit(ts: f64) -> Value {
    ec(
        ts,
        "submit",
        json!({"userid": 42, "urgency": 16, "flags": 0, "version": 1}),
    )
}

/// A complete, successful job with prolog and epilog.
fn full_job(t: f64) -> Vec<Value> {
    vec![
        submit(t),
        e(t + 1.0, "validate"),
        e(t + 2.0, "depend"),
        ec(t + 3.0, "priority", json!({"priority": 16})),
        ec(t + 4.0, "alloc", json!({"annotations": {}})),
        ec(t + 5.0, "prolog-start", json!({"description": "p"})),
        ec(
            t + 6.0,
            "prolog-finish",
            json!({"description": "p", "status": 0}),
        ),
        e(t + 7.0, "start"),
        ec(t + 8.0, "finish", json!({"status": 0})),
        ec(t + 9.0, "epilog-start", json!({"description": "e"})),
        ec(t + 10.0, "release", json!({"ranks": "all", "final": true})),
        ec(
            t + 11.0,
            "epilog-finish",
            json!({"description": "e", "status": 0}),
        ),
        e(t + 12.0, "free"),
        e(t + 13.0, "clean"),
    ]
}

const ID: u64 = 48335159296; // ƒ2GeDKtT, 0000.000b.4100.0000

#[test]
fn every_path_layout_places_its_job() {
    let log = lines(&full_job(100.0));
    let exec = lines(&[
        e(104.5, "init"),
        e(104.6, "starting"),
        ec(107.9, "complete", json!({"status": 0})),
        e(108.5, "done"),
    ]);
    let layouts: &[&[&str]] = &[
        &[
            "dump/job/0000/000b/4100/0000/eventlog",
            "dump/job/0000/000b/4100/0000/guest/exec/eventlog",
        ],
        &[
            "kvs/job.0000.000b.4100.0000.eventlog",
            "kvs/job.0000.000b.4100.0000.guest.exec.eventlog",
        ],
        &[
            "jobs/48335159296/eventlog",
            "jobs/48335159296/exec.eventlog",
        ],
        &["jobs/ƒ2GeDKtT/eventlog", "jobs/ƒ2GeDKtT/exec.eventlog"],
        &["jobs/f2GeDKtT/eventlog", "jobs/f2GeDKtT/exec.eventlog"],
        &[
            "jobs/0xb41000000/eventlog",
            "jobs/0xb41000000/exec.eventlog",
        ],
    ];
    for layout in layouts {
        let out = replay_files(&[(layout[0], &log), (layout[1], &exec)], &[]);
        let j = job(&out, ID);
        assert_eq!(j["state"], "INACTIVE", "{layout:?}");
        assert_eq!(j["result"], "COMPLETED", "{layout:?}");
        assert!(anomaly_kinds(&out).is_empty(), "{layout:?}: {out:#?}");
    }
}

#[test]
fn files_that_cannot_be_placed_are_skipped_quietly_and_r_and_the_jobspec_are_read() {
    let out = replay_files(
        &[
            ("jobs/48335159296/eventlog", &lines(&full_job(100.0))),
            (
                "jobs/48335159296/jobspec.json",
                r#"{"version":1,"resources":[{"type":"slot","count":1,"with":[{"type":"core","count":1}]}],"tasks":[{"command":["/bin/true"]}],"attributes":{"system":{"duration":0}}}"#,
            ),
            ("jobs/48335159296/notes.txt", "hello"),
            (
                "jobs/48335159296/R.json",
                r#"{"version":1,"execution":{"R_lite":[],"expiration":1234.5}}"#,
            ),
        ],
        &[],
    );
    assert_eq!(job(&out, ID)["expiration"], 1234.5);
    assert_eq!(job(&out, ID)["name"], "true", "the jobspec beside it");
    assert!(anomaly_kinds(&out).is_empty(), "{out:#?}");
}

/// As the file source does (which sends it to dead_letter): an R that is
/// not JSON is said and not applied; the jobspec beside it still is.
#[test]
fn a_damaged_r_file_is_an_anomaly_and_not_applied() {
    let out = replay_files(
        &[
            ("jobs/48335159296/eventlog", &lines(&full_job(100.0))),
            (
                "jobs/48335159296/R.json",
                r#"{"version":1,"execution":{"R_lite":[],"expir"#,
            ),
        ],
        &[],
    );
    assert_eq!(
        job(&out, ID)["expiration"],
        serde_json::Value::Null,
        "{out:#?}"
    );
    let said: Vec<_> = of_kind(&out, "anomaly")
        .into_iter()
        .filter(|a| {
            a["message"]
                .as_str()
                .unwrap_or("")
                .contains("R is not valid JSON")
        })
        .collect();
    assert_eq!(said.len(), 1, "{out:#?}");
    assert!(
        said[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("R.json:1:"),
        "{said:?}"
    );
}

#[test]
fn every_line_form_is_decoded() {
    let journal = [
        json!({"id": -1, "events": []}),
        json!({"id": 7, "events": [submit(1.0), e(2.0, "validate")]}),
        json!({"id": 7, "events": [e(3.0, "depend")]}),
    ];
    let resource = [
        json!({"events": [ec(1.0, "restart", json!({"ranks": "0-1", "online": "", "nodelist": "n[0-1]"}))]}),
        json!({"events": [ec(2.0, "online", json!({"idset": "0-1"}))]}),
        json!({"events": []}),
    ];
    let envelopes = [
        json!({"cluster": "east", "id": "ƒ8", "stream": "job", "event": submit(1.0)}),
        json!({"cluster": "east", "id": 7, "stream": "job", "event": e(2.0, "validate")}),
        json!({"cluster": "east", "stream": "resource", "event": ec(1.0, "drain", json!({"idset": "3", "reason": "x", "overwrite": 0}))}),
    ];
    let protocol = [
        json!({"id": 7, "type": "start", "data": {}}),
        json!({"id": 7, "type": "release", "data": {"ranks": "0-1", "final": true}}),
    ];
    let out = replay_files(
        &[
            ("a/job.journal.jsonl", &lines(&journal)),
            ("a/resource.journal.jsonl", &lines(&resource)),
            ("a/envelopes.jsonl", &lines(&envelopes)),
            ("a/exec-protocol.jsonl", &lines(&protocol)),
        ],
        &["--cluster", "west"],
    );
    let jobs = of_kind(&out, "job");
    // (west, 7) from the journal and (east, 7) from the envelopes: two jobs.
    assert_eq!(jobs.len(), 2, "{out:#?}");
    let west = jobs.iter().find(|j| j["cluster"] == "west").expect("west");
    assert_eq!(west["state"], "PRIORITY");
    let east = jobs.iter().find(|j| j["cluster"] == "east").expect("east");
    assert_eq!(east["state"], "DEPEND");
    let ranks = of_kind(&out, "rank");
    let west_ranks: Vec<_> = ranks.iter().filter(|r| r["cluster"] == "west").collect();
    assert_eq!(west_ranks.len(), 2);
    assert!(west_ranks.iter().all(|r| r["online"] == true));
    assert_eq!(west_ranks[1]["hostname"], "n1");
    let east_rank = ranks
        .iter()
        .find(|r| r["cluster"] == "east")
        .expect("east rank");
    assert_eq!(east_rank["drained"], true);
    assert_eq!(east_rank["drain_reason"], "x");
    // The protocol response for a job with no start in its eventlog is
    // still checked on its own: no anomaly here.
    assert!(anomaly_kinds(&out).is_empty(), "{out:#?}");
}

#[test]
fn state_machine_rules_of_flux_core() {
    let t = 1000.0;
    let cases: Vec<(u64, Vec<Value>, Value)> = vec![
        // urgency in SCHED falls back to PRIORITY; priority unknown again
        (
            1,
            vec![
                submit(t),
                e(t + 1.0, "validate"),
                e(t + 2.0, "depend"),
                ec(t + 3.0, "priority", json!({"priority": 16})),
                ec(t + 4.0, "urgency", json!({"urgency": 0, "userid": 42})),
            ],
            json!({"state": "PRIORITY", "urgency": 0}),
        ),
        // hold (urgency 0 → priority 0) then release
        (
            2,
            vec![
                ec(
                    t,
                    "submit",
                    json!({"userid": 42, "urgency": 0, "flags": 0, "version": 1}),
                ),
                e(t + 1.0, "validate"),
                e(t + 2.0, "depend"),
                ec(t + 3.0, "priority", json!({"priority": 0})),
                ec(t + 4.0, "urgency", json!({"urgency": 16, "userid": 42})),
                ec(t + 5.0, "priority", json!({"priority": 16})),
            ],
            json!({"state": "SCHED", "urgency": 16, "priority": 16}),
        ),
        // jobspec-update in SCHED falls back to PRIORITY
        (
            3,
            vec![
                submit(t),
                e(t + 1.0, "validate"),
                e(t + 2.0, "depend"),
                ec(t + 3.0, "priority", json!({"priority": 16})),
                ec(
                    t + 4.0,
                    "jobspec-update",
                    json!({"attributes.system.duration": 60.0}),
                ),
            ],
            json!({"state": "PRIORITY"}),
        ),
        // flux-restart in SCHED falls back to PRIORITY
        (
            4,
            vec![
                submit(t),
                e(t + 1.0, "validate"),
                e(t + 2.0, "depend"),
                ec(t + 3.0, "priority", json!({"priority": 16})),
                e(t + 4.0, "flux-restart"),
            ],
            json!({"state": "PRIORITY"}),
        ),
        // severity-0 exception in DEPEND: CLEANUP, canceled before running
        (
            5,
            vec![
                submit(t),
                ec(
                    t + 0.5,
                    "dependency-add",
                    json!({"description": "after-ok=ƒ2"}),
                ),
                e(t + 1.0, "validate"),
                ec(
                    t + 2.0,
                    "exception",
                    json!({"type": "cancel", "severity": 0, "note": ""}),
                ),
                e(t + 3.0, "clean"),
            ],
            json!({"state": "INACTIVE", "result": "CANCELED", "returncode": -128,
                   "dependencies": ["after-ok=ƒ2"], "t_cleanup": t + 2.0}),
        ),
        // severity-0 exception in RUN before finish: TIMEOUT, status from finish
        (
            6,
            vec![
                submit(t),
                e(t + 1.0, "validate"),
                e(t + 2.0, "depend"),
                ec(t + 3.0, "priority", json!({"priority": 16})),
                e(t + 4.0, "alloc"),
                e(t + 5.0, "start"),
                ec(
                    t + 6.0,
                    "exception",
                    json!({"type": "timeout", "severity": 0, "note": "x"}),
                ),
                ec(t + 7.0, "finish", json!({"status": 36352})),
                ec(t + 8.0, "release", json!({"ranks": "all", "final": true})),
                e(t + 9.0, "free"),
                e(t + 10.0, "clean"),
            ],
            json!({"state": "INACTIVE", "result": "TIMEOUT", "returncode": 142,
                   "waitstatus": 36352, "t_cleanup": t + 6.0, "success": false}),
        ),
        // non-fatal exception keeps the state; the job completes
        (
            7,
            {
                let mut v = full_job(t);
                v.insert(
                    8,
                    ec(
                        t + 7.5,
                        "exception",
                        json!({"type": "cancel", "severity": 1, "note": ""}),
                    ),
                );
                v
            },
            json!({"state": "INACTIVE", "result": "COMPLETED", "success": true,
                   "exception_occurred": true, "exception_type": "cancel", "exception_severity": 1}),
        ),
        // killed by a signal: returncode is minus the signal
        (
            8,
            {
                let mut v = full_job(t);
                v[8] = ec(t + 8.0, "finish", json!({"status": 9}));
                v
            },
            json!({"result": "FAILED", "returncode": -9, "waitstatus": 9}),
        ),
        // dependency added then removed: none left
        (
            9,
            vec![
                submit(t),
                ec(
                    t + 0.5,
                    "dependency-add",
                    json!({"description": "begin-time=5"}),
                ),
                e(t + 1.0, "validate"),
                ec(
                    t + 2.0,
                    "dependency-remove",
                    json!({"description": "begin-time=5"}),
                ),
                e(t + 3.0, "depend"),
            ],
            json!({"state": "PRIORITY", "dependencies": []}),
        ),
        // a fatal prolog failure: epilog-start without epilog-finish is fine
        (
            10,
            vec![
                submit(t),
                e(t + 1.0, "validate"),
                e(t + 2.0, "depend"),
                ec(t + 3.0, "priority", json!({"priority": 16})),
                e(t + 4.0, "alloc"),
                ec(t + 5.0, "prolog-start", json!({"description": "p"})),
                ec(
                    t + 6.0,
                    "prolog-finish",
                    json!({"description": "p", "status": 256}),
                ),
                ec(
                    t + 7.0,
                    "exception",
                    json!({"type": "prolog", "severity": 0, "note": ""}),
                ),
                ec(t + 8.0, "epilog-start", json!({"description": "e"})),
                ec(t + 9.0, "release", json!({"ranks": "all", "final": true})),
            ],
            json!({"state": "CLEANUP"}),
        ),
    ];
    let files: Vec<(String, String)> = cases
        .iter()
        .map(|(id, evs, _)| (format!("jobs/{id}/eventlog"), lines(evs)))
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let out = replay_files(&refs, &[]);
    for (id, _, want) in &cases {
        let j = job(&out, *id);
        for (k, v) in want.as_object().expect("object") {
            assert_eq!(&j[k], v, "job {id} field {k}: {j:#}");
        }
    }
    assert_eq!(
        job(&out, 1).get("priority"),
        None,
        "priority is unknown after a fall back"
    );
    assert!(anomaly_kinds(&out).is_empty(), "{out:#?}");
}

#[test]
fn invalidated_jobs_are_not_listed() {
    let out = replay_files(
        &[(
            "j/job.journal.jsonl",
            &lines(&[json!({"id": 5, "events": [submit(1.0), e(2.0, "invalidate")]})]),
        )],
        &[],
    );
    assert!(of_kind(&out, "job").is_empty(), "{out:#?}");
    assert!(anomaly_kinds(&out).is_empty());
}

#[test]
fn drain_overwrite_modes_and_restart() {
    let log = [
        ec(
            1.0,
            "restart",
            json!({"ranks": "0-3", "online": "", "nodelist": "n[0-3]"}),
        ),
        ec(2.0, "online", json!({"idset": "0-3"})),
        ec(3.0, "torpid", json!({"idset": "3"})),
        ec(
            4.0,
            "drain",
            json!({"idset": "0-2", "nodelist": "n[0-2]", "reason": "first", "overwrite": 0}),
        ),
        // 0: reason only where none — ranks 0-2 all have one: nothing changes
        ec(
            5.0,
            "drain",
            json!({"idset": "0", "nodelist": "n0", "reason": "zero", "overwrite": 0}),
        ),
        // 1: replace reason, keep timestamp
        ec(
            6.0,
            "drain",
            json!({"idset": "1", "nodelist": "n1", "reason": "one", "overwrite": 1}),
        ),
        // 2: replace reason and timestamp
        ec(
            7.0,
            "drain",
            json!({"idset": "2", "nodelist": "n2", "reason": "two", "overwrite": 2}),
        ),
        // no overwrite key (older logs) counts as 1; no reason clears it
        ec(8.0, "drain", json!({"idset": "1"})),
        ec(9.0, "undrain", json!({"idset": "0", "nodelist": "n0"})),
        // a new life: online/torpid start over, drains survive
        ec(
            10.0,
            "restart",
            json!({"ranks": "0-3", "online": "", "nodelist": "n[0-3]"}),
        ),
        ec(11.0, "online", json!({"idset": "0-1"})),
    ];
    let out = replay_files(&[("inst/resource.eventlog", &lines(&log))], &[]);
    let r0 = rank(&out, 0);
    assert_eq!(r0["drained"], false);
    assert_eq!(r0["drain_reason"], Value::Null);
    let r1 = rank(&out, 1);
    assert_eq!(
        (&r1["drained"], &r1["drain_reason"]),
        (&json!(true), &Value::Null)
    );
    assert_eq!(r1["drain_timestamp"], 4.0);
    let r2 = rank(&out, 2);
    assert_eq!(
        (&r2["drain_reason"], &r2["drain_timestamp"]),
        (&json!("two"), &json!(7.0))
    );
    assert_eq!(r2["online"], false);
    let r3 = rank(&out, 3);
    assert_eq!(
        (&r3["online"], &r3["torpid"], &r3["drained"]),
        (&json!(false), &json!(false), &json!(false))
    );
    assert_eq!(r3["hostname"], "n3");
    assert!(anomaly_kinds(&out).is_empty(), "{out:#?}");
}

#[test]
fn every_anomaly_kind_is_reported() {
    let job_log = lines(&[
        submit(1.0),
        e(2.0, "alloc"),                                // unexpected-event
        ec(3.0, "priority", json!({})),                 // missing-context
        ec(4.0, "urgency", json!({"urgency": "high"})), // invalid-context
        submit(5.0),                                    // repeated
        e(0.5, "validate"),                             // out-of-order
    ]);
    let resource_log = lines(&[
        ec(
            1.0,
            "restart",
            json!({"ranks": "0-1", "online": "", "nodelist": "n[0-1]"}),
        ),
        ec(2.0, "online", json!({"idset": "7"})), // unknown-rank
        e(3.0, "frobnicate"),                     // unknown-event
    ]);
    let exec_log = lines(&[e(1.0, "init")]);
    let out = replay_files(
        &[
            ("jobs/1/eventlog", &job_log),
            ("jobs/2/exec.eventlog", &exec_log), // unknown-target: no job eventlog
            ("r/resource.eventlog", &resource_log),
            ("x/garbage.jsonl", "{not json\n"), // malformed
        ],
        &[],
    );
    let kinds = anomaly_kinds(&out);
    for want in [
        "malformed",
        "missing-context",
        "invalid-context",
        "unexpected-event",
        "out-of-order",
        "unknown-target",
        "unknown-rank",
        "repeated",
        "unknown-event",
    ] {
        assert!(kinds.iter().any(|k| k == want), "no {want} in {kinds:?}");
    }
    // Anomalies name their job, stream, event and a message.
    let a = of_kind(&out, "anomaly")
        .into_iter()
        .find(|a| a["anomaly"] == "missing-context")
        .expect("missing-context");
    assert_eq!(
        (&a["id"], &a["stream"], &a["event"]),
        (&json!(1), &json!("job"), &json!("priority"))
    );
    assert!(a["message"].as_str().unwrap_or("").contains("priority"));
    let a = of_kind(&out, "anomaly")
        .into_iter()
        .find(|a| a["anomaly"] == "unknown-rank")
        .expect("unknown-rank");
    assert_eq!(a["stream"], "resource");
}

#[test]
fn exec_finish_mismatches_are_reported() {
    let out = replay_files(
        &[
            ("jobs/1/eventlog", &lines(&full_job(100.0))),
            (
                "jobs/1/exec.eventlog",
                &lines(&[
                    e(104.5, "init"),
                    e(104.6, "starting"),
                    ec(107.9, "complete", json!({"status": 256})),
                    e(108.5, "done"),
                ]),
            ),
            (
                "p/protocol.jsonl",
                &lines(&[
                    json!({"id": 1, "type": "start", "data": {}}),
                    json!({"id": 1, "type": "finish", "data": {"status": 15}}),
                    json!({"id": 1, "type": "release", "data": {"ranks": "all", "final": true}}),
                    json!({"id": 1, "type": "start", "data": {}}),
                ]),
            ),
        ],
        &[],
    );
    let msgs: Vec<(String, String)> = of_kind(&out, "anomaly")
        .iter()
        .map(|a| {
            (
                a["stream"].as_str().unwrap_or("").to_string(),
                a["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        msgs.iter()
            .any(|(s, m)| s == "exec" && m.contains("complete status 256")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|(s, m)| s == "exec-protocol" && m.contains("finish status 15")),
        "{msgs:?}"
    );
    // a response after the final release
    assert!(
        msgs.iter().filter(|(s, _)| s == "exec-protocol").count() >= 2,
        "{msgs:?}"
    );
}

#[test]
fn a_resent_backlog_changes_nothing() {
    let events = full_job(100.0);
    let once: Vec<Value> = events
        .iter()
        .map(|ev| json!({"id": 9, "events": [ev]}))
        .collect();
    // A reconnecting journal consumer gets every job's events again.
    let mut twice = once.clone();
    twice.push(json!({"id": 9, "events": events}));
    twice.push(json!({"id": -1, "events": []}));
    let a = replay_files(&[("j/one.jsonl", &lines(&once))], &[]);
    let b = replay_files(&[("j/two.jsonl", &lines(&twice))], &[]);
    assert_eq!(job(&a, 9), job(&b, 9));
    assert!(anomaly_kinds(&b).is_empty(), "{b:#?}");
}

#[test]
fn hostile_lines_are_counted_and_good_lines_around_them_survive() {
    let mut content = Vec::new();
    let good = full_job(100.0);
    let bad_lines: Vec<Vec<u8>> = vec![
        b"\xff\xfe\xfd".to_vec(),                       // invalid UTF-8
        b"{\"timestamp\":1,\"name\":\"x\"\0}".to_vec(), // NUL byte
        format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(), // deep nesting
        b"{\"timestamp\":\"soon\",\"name\":\"submit\"}".to_vec(), // wrong type
        b"{\"timestamp\":-5,\"name\":\"submit\"}".to_vec(), // negative timestamp
        b"{\"timestamp\":1e400,\"name\":\"submit\"}".to_vec(), // huge number
        b"{\"name\":\"submit\"}".to_vec(),              // missing key
        b"{\"timestamp\":1.0,\"name\":\"sub".to_vec(),  // truncated
        vec![b'x'; 17 * 1024 * 1024],                   // over-long line
    ];
    for (i, ev) in good.iter().enumerate() {
        content.extend_from_slice(ev.to_string().as_bytes());
        content.push(b'\n');
        if let Some(bad) = bad_lines.get(i) {
            content.extend_from_slice(bad);
            content.push(b'\n');
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("jobs/5/eventlog");
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, &content).expect("write");
    let out = replay_paths(&[dir.path()], &[]);
    assert_eq!(job(&out, 5)["result"], "COMPLETED");
    let malformed = anomaly_kinds(&out)
        .iter()
        .filter(|k| *k == "malformed")
        .count();
    assert_eq!(
        malformed,
        bad_lines.len(),
        "{:#?}",
        of_kind(&out, "anomaly")
    );
}

#[test]
fn table_output_reads_like_flux_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("jobs/48335159296/eventlog");
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, lines(&full_job(100.0))).expect("write");
    let out = fluxpipe()
        .arg("replay")
        .arg(dir.path())
        .output()
        .expect("run");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(text.contains("ƒ2GeDKtT"), "{text}");
    assert!(
        text.contains("INACTIVE") && text.contains("COMPLETED"),
        "{text}"
    );
    assert!(text.contains("1 job (1 INACTIVE)"), "{text}");
}

/// `fluxpipe replay -` reads standard input, and `.gz` and `.zst` files
/// are read decompressed: all give what the plain file gives.
#[test]
fn standard_input_and_gzip_replay_as_the_file_does() {
    use std::io::Write;
    let journal =
        common::corpus().join("instances/B/journals/incarnation1.job-manager.events-journal.jsonl");
    let text = std::fs::read(&journal).expect("journal");
    let plain = common::replay(&[], &[&journal]);
    assert!(!plain.is_empty());

    let mut child = fluxpipe()
        .args(["replay", "--format", "json", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("replay -");
    let mut stdin = child.stdin.take().expect("stdin");
    let feeding = std::thread::spawn(move || stdin.write_all(&text).expect("feed"));
    let out = child.wait_with_output().expect("wait");
    feeding.join().expect("feeder");
    assert!(out.status.success());
    let from_stdin: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(from_stdin, plain, "standard input");

    let dir = tempfile::tempdir().expect("tempdir");
    let gz = dir
        .path()
        .join("incarnation1.job-manager.events-journal.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).expect("gz"),
        flate2::Compression::default(),
    );
    enc.write_all(&std::fs::read(&journal).expect("journal"))
        .expect("compress");
    enc.finish().expect("finish");
    assert_eq!(common::replay(&[], &[&gz]), plain, "gzip");
    // In a folder too.
    assert_eq!(
        common::replay(&[], &[dir.path()]),
        plain,
        "gzip in a folder"
    );
    // A damaged one is said, and the rest is read.
    std::fs::write(dir.path().join("other.jsonl.gz"), b"\x1f\x8b\x08 cut short").expect("write");
    let got = common::replay(&[], &[dir.path()]);
    assert!(
        got.iter().any(|r| r["message"]
            .as_str()
            .is_some_and(|m| m.contains("other.jsonl.gz") && m.contains("cannot read on"))),
        "{got:#?}"
    );
    let jobs = |r: &[Value]| r.iter().filter(|v| v["kind"] == "job").count();
    assert_eq!(jobs(&got), jobs(&plain));

    // zstd, as logrotate's `compresscmd zstd` leaves it: two frames (a
    // file compressed, then more appended) read as one.
    let zdir = tempfile::tempdir().expect("tempdir");
    let zst = zdir
        .path()
        .join("incarnation1.job-manager.events-journal.jsonl.1.zst");
    let whole = std::fs::read(&journal).expect("journal");
    let half = whole.len() / 2;
    let cut = half
        + whole[half..]
            .iter()
            .position(|b| *b == b'\n')
            .expect("a line")
        + 1;
    let mut bytes = zstd::encode_all(&whole[..cut], 3).expect("zstd");
    bytes.extend(zstd::encode_all(&whole[cut..], 3).expect("zstd"));
    std::fs::write(&zst, bytes).expect("write");
    assert_eq!(common::replay(&[], &[&zst]), plain, "zstd");
    assert_eq!(
        common::replay(&[], &[zdir.path()]),
        plain,
        "zstd in a folder"
    );
}

/// A binary file is not read line by line into thousands of anomalies:
/// one says what it is, and the replay fails, having read nothing.
#[test]
fn binary_input_gives_one_anomaly_and_a_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("core.jsonl");
    let mut bytes = Vec::with_capacity(1 << 20);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..(1 << 20) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.push((x >> 24) as u8);
    }
    std::fs::write(&bin, &bytes).expect("write");
    let out = fluxpipe()
        .args(["replay", "--format", "json"])
        .arg(&bin)
        .output()
        .expect("replay");
    assert!(!out.status.success(), "a binary file is not a replay");
    let records: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(records.len() <= 11, "{} records", records.len());
    assert!(
        records.iter().any(|r| r["message"]
            .as_str()
            .unwrap_or("")
            .contains("not an eventlog or a journal")),
        "{records:#?}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing read"));
}

/// A bare eventlog, its lines naming no job, replays as the job named with
/// `--job-id` (as `flux job eventlog ID | fluxpipe replay --job-id ID -`);
/// the job's summary is the one its own folder gives.
#[test]
fn a_bare_eventlog_replays_as_the_job_named() {
    let id = "104203288576";
    let folder = common::corpus().join("jobs").join(id);
    let from_folder: Vec<Value> = common::replay(&[], &[&folder.join("eventlog")])
        .into_iter()
        .filter(|r| r["kind"] == "job")
        .collect();
    assert_eq!(from_folder.len(), 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let bare = dir.path().join("saved-output.txt");
    std::fs::copy(folder.join("eventlog"), &bare).expect("copy");
    let f58 = String::from_utf8(
        fluxpipe()
            .args(["id", "--to", "f58", id])
            .output()
            .expect("id")
            .stdout,
    )
    .expect("utf-8");
    let named: Vec<Value> = common::replay(&["--job-id", f58.trim()], &[&bare])
        .into_iter()
        .filter(|r| r["kind"] == "job")
        .collect();
    assert_eq!(named, from_folder);
}

/// Filters and a count as `flux jobs` has them: states (names and
/// groups), a user, and at most N, in `flux jobs` order (inactive newest
/// end first).
#[test]
fn replay_lists_jobs_as_flux_jobs_filters_them() {
    let journal =
        common::corpus().join("instances/B/journals/incarnation1.job-manager.events-journal.jsonl");
    let jobs = |args: &[&str]| -> Vec<Value> {
        common::replay(args, &[&journal])
            .into_iter()
            .filter(|r| r["kind"] == "job")
            .collect()
    };
    let all = jobs(&[]);
    let inactive = all.iter().filter(|j| j["state"] == "INACTIVE").count();
    assert!(
        inactive > 3 && inactive < all.len(),
        "{inactive} of {}",
        all.len()
    );

    let ended = jobs(&["-f", "inactive"]);
    assert_eq!(ended.len(), inactive);
    let ends: Vec<f64> = ended
        .iter()
        .map(|j| j["t_inactive"].as_f64().expect("t_inactive"))
        .collect();
    assert!(
        ends.windows(2).all(|w| w[0] >= w[1]),
        "newest end first: {ends:?}"
    );
    assert_eq!(jobs(&["-f", "inactive", "-c", "3"]), ended[..3]);

    let active = jobs(&["--filter", "active"]);
    assert_eq!(active.len(), all.len() - inactive);
    assert!(active.iter().all(|j| j["state"] != "INACTIVE"));

    let user = all[0]["userid"].as_i64().expect("userid");
    let theirs = jobs(&["-u", &user.to_string()]);
    assert!(!theirs.is_empty());
    assert!(theirs.iter().all(|j| j["userid"].as_i64() == Some(user)));

    // A state that does not exist is refused.
    let out = fluxpipe()
        .args(["replay", "-f", "finished"])
        .arg(&journal)
        .output()
        .expect("replay");
    assert!(!out.status.success());
}

/// Ranks are grouped as `flux resource status` groups them (state, up or
/// down, count, host list), then listed with their reasons as `flux
/// resource drain` lists them: not a row per rank.
#[test]
fn table_groups_ranks_as_flux_resource_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("r/resource.eventlog");
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    let log = lines(&[
        ec(
            1.0,
            "restart",
            json!({"ranks": "0-7", "online": "0-4,6", "nodelist": "n[0-7]"}),
        ),
        ec(
            2.0,
            "drain",
            json!({"idset": "1-2", "reason": "A", "overwrite": 0}),
        ),
        ec(
            3.0,
            "drain",
            json!({"idset": "6", "reason": "maint", "overwrite": 0}),
        ),
    ]);
    std::fs::write(&p, log).expect("write");
    let out = fluxpipe()
        .arg("replay")
        .arg(dir.path())
        .output()
        .expect("run");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    for want in [
        "       STATEUP NNODES NODELIST\n",
        "       avail ✔      3 n[0,3-4]\n",
        "      avail* ✗      2 n[5,7]\n",
        "     drained ✔      3 n[1-2,6]\n",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
    let drains: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("TIME "))
        .take(3)
        .collect();
    assert_eq!(drains.len(), 3, "{text}");
    assert!(
        drains[1].contains("drained") && drains[1].contains(" A ") && drains[1].ends_with("n[1-2]"),
        "{text}"
    );
    assert!(
        drains[2].contains("maint") && drains[2].ends_with("n6"),
        "{text}"
    );
    assert!(text.contains("8 ranks"), "{text}");
    assert!(!text.contains("liveness unknown"), "{text}");
}
