//! Alerts end to end: a real Alertmanager (Debian package
//! `prometheus-alertmanager`, installed by `.ci/run`, started here on
//! loopback with clustering off) receives a stuck-job alert from
//! `fluxpipe run`, then its resolution when the job moves on. And
//! `fluxpipe replay` tells which alerts a journal would have raised.

use crate::common;
use crate::common::{Reaper, alertmanager, am_alerts, read_records, sigterm};

use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn envelope(id: u64, ts: f64, name: &str, context: Value) -> String {
    let mut ev = json!({"timestamp": ts, "name": name});
    if !context.is_null() {
        ev["context"] = context;
    }
    format!(
        "{}\n",
        json!({"cluster": "t", "stream": "job", "id": id, "event": ev})
    )
}

/// A job from submit to SCHED, its events starting at `t`.
fn to_sched(id: u64, t: f64) -> String {
    [
        envelope(
            id,
            t,
            "submit",
            json!({"userid": 5, "urgency": 16, "flags": 0, "version": 1}),
        ),
        envelope(id, t + 0.01, "validate", Value::Null),
        envelope(id, t + 0.02, "depend", Value::Null),
        envelope(id, t + 0.03, "priority", json!({"priority": 16})),
    ]
    .concat()
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open");
    f.write_all(text.as_bytes()).expect("append");
}

#[test]
fn a_stuck_job_fires_in_alertmanager_then_resolves_when_it_moves_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((_am, am_port)) = alertmanager(dir.path()) else {
        return;
    };
    let events = dir.path().join("events.jsonl");
    let records = dir.path().join("alerts.jsonl");
    let t0 = now();
    // job 1 waits in SCHED; job 2 leaves SCHED at once and must not alert
    append(&events, &to_sched(1, t0));
    append(&events, &to_sched(2, t0));
    append(&events, &envelope(2, t0 + 0.1, "alloc", Value::Null));
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = "{d}/data"

[alerts]
clock = "wall"

[alerts.rules.sched_stuck]
kind = "job_state"
state = "SCHED"
for = "2s"
severity = "critical"

[sources.events]
type = "file"
include = ["{events}"]
poll_interval_ms = 100

[sinks.am]
type = "alertmanager"
url = "http://127.0.0.1:{am_port}"
inputs = ["alerts"]
resend_interval_secs = 60

[sinks.log]
type = "file"
path = "{records}"
inputs = ["alerts"]
"#,
            d = dir.path().display(),
            events = events.display(),
            records = records.display(),
        ),
    )
    .expect("config");
    let mut fluxpipe = run_config(&config);

    let ours = |a: &Value| a["labels"]["alertname"] == "sched_stuck";
    wait_for("the alert in Alertmanager", 30, || {
        am_alerts(am_port).iter().any(ours)
    });
    let held = am_alerts(am_port);
    let alert = held.iter().find(|a| ours(a)).expect("alert");
    let f58 = "ƒ2"; // job id 1 in F58
    assert_eq!(alert["labels"]["jobid"], f58, "{alert}");
    assert_eq!(alert["labels"]["flux_cluster"], "t");
    assert_eq!(alert["labels"]["state"], "SCHED");
    assert_eq!(alert["labels"]["severity"], "critical");
    assert!(
        alert["annotations"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("SCHED for more than 2s")),
        "{alert}"
    );
    assert_eq!(alert["status"]["state"], "active");
    assert_eq!(
        held.iter().filter(|a| ours(a)).count(),
        1,
        "only job 1 is stuck: {held:?}"
    );
    // endsAt lies ahead (four resend intervals): only a resolution ends it
    let ends = alert["endsAt"].as_str().expect("endsAt");
    let ends: jiff::Timestamp = ends.parse().expect("rfc3339");
    assert!(ends.as_second() as f64 > now() + 120.0, "{ends}");

    // the job moves on: the alert resolves in Alertmanager
    append(&events, &envelope(1, now(), "alloc", Value::Null));
    wait_for("the resolution in Alertmanager", 30, || {
        !am_alerts(am_port).iter().any(ours)
    });

    sigterm(&fluxpipe.0);
    let status = fluxpipe.0.wait().expect("wait");
    assert!(status.success(), "{status}");
    let recs = read_records(&records);
    let statuses: Vec<(&str, &str)> = recs
        .iter()
        .map(|r| {
            (
                r["status"].as_str().unwrap_or(""),
                r["labels"]["jobid"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(statuses, vec![("firing", f58), ("resolved", f58)]);
    assert_eq!(recs[0]["labels"], recs[1]["labels"], "same identity");
    assert_eq!(recs[0]["starts_at"], recs[1]["starts_at"]);
    assert!(recs[1]["ends_at"].as_str() > recs[1]["starts_at"].as_str());
    assert_ne!(recs[0]["record_id"], recs[1]["record_id"]);
}

/// The alerts of `fluxpipe replay ARGS INPUT`.
fn replay_alerts(args: &[&str], input: &Path) -> Vec<Value> {
    common::replay(args, &[input])
        .into_iter()
        .filter(|v| v["kind"] == "alert")
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn replay_tells_which_alerts_a_journal_would_have_raised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = 1_700_000_000.0;
    // Job 1 waits 2 h in SCHED, then runs; job 2 waits 10 min and runs;
    // job 3's log ends while it waits (at the end, 3 h after it began).
    let mut journal = String::new();
    journal += &to_sched(1, t);
    journal += &to_sched(2, t);
    journal += &to_sched(3, t);
    journal += &envelope(2, t + 600.0, "alloc", Value::Null);
    journal += &envelope(1, t + 7200.0, "alloc", Value::Null);
    journal += &envelope(1, t + 10800.0, "finish", json!({"status": 0}));
    journal += &envelope(2, t + 20000.0, "finish", json!({"status": 0}));
    let input = write(dir.path(), "journal.jsonl", &journal);
    let config = rules_config(
        dir.path(),
        r#"
[alerts.rules.sched_1h]
kind = "job_state"
state = "SCHED"
for = "1h"
"#,
    );
    let alerts = replay_alerts(&["--config", config.to_str().expect("utf-8")], &input);
    let got: Vec<(u64, &str, &str, Option<&str>)> = alerts
        .iter()
        .map(|a| {
            (
                a["id"].as_u64().unwrap_or(0),
                a["status"].as_str().unwrap_or(""),
                a["starts_at"].as_str().unwrap_or(""),
                a["ends_at"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "firing", "2023-11-14T23:13:20.03Z", None),
            (3, "firing", "2023-11-14T23:13:20.03Z", None),
            (
                1,
                "resolved",
                "2023-11-14T23:13:20.03Z",
                Some("2023-11-15T00:13:20Z")
            ),
        ],
        "{alerts:#?}"
    );
    // The built-in rules apply without a config: job 1 sat in CLEANUP
    // (10 min rule) from t+3h to the end of the journal. --no-alerts
    // silences.
    let builtin = replay_alerts(&[], &input);
    assert_eq!(
        builtin
            .iter()
            .map(|a| (a["alertname"].as_str(), a["id"].as_u64()))
            .collect::<Vec<_>>(),
        vec![(Some("cleanup_too_long"), Some(1))],
        "{builtin:#?}"
    );
    assert!(replay_alerts(&["--no-alerts"], &input).is_empty());
}

#[test]
fn a_drained_node_alert_carries_the_reason_it_was_drained_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = 1_700_000_000.0;
    // Node 0 drained for 2 h, undrained, then drained again for another
    // reason until the log ends 10 minutes later: the alert of the first
    // drain (fired and resolved after the undrain, when the node has no
    // reason left) names the first reason, in both records.
    let resource = |ts: f64, name: &str, ctx: Value| {
        format!(
            "{}\n",
            json!({"events": [{"timestamp": ts, "name": name, "context": ctx}]})
        )
    };
    let mut journal = String::new();
    journal += &resource(
        t,
        "restart",
        json!({"nodelist": "n[0-1]", "online": "", "ranks": "0-1"}),
    );
    journal += &resource(t + 1.0, "online", json!({"idset": "0-1"}));
    journal += &resource(
        t + 10.0,
        "drain",
        json!({"idset": "0", "nodelist": "n0", "reason": "bad memory", "overwrite": 0}),
    );
    journal += &resource(t + 7210.0, "undrain", json!({"idset": "0"}));
    journal += &resource(
        t + 7300.0,
        "drain",
        json!({"idset": "0", "nodelist": "n0", "reason": "other", "overwrite": 0}),
    );
    journal += &resource(t + 7900.0, "online", json!({"idset": "1"}));
    let input = write(dir.path(), "resource.jsonl", &journal);
    let config = rules_config(
        dir.path(),
        r#"
[alerts.rules.drained_1h]
kind = "node_drained"
for = "1h"
"#,
    );
    let alerts = replay_alerts(&["--config", config.to_str().expect("utf-8")], &input);
    let got: Vec<(&str, &str, &str)> = alerts
        .iter()
        .map(|a| {
            (
                a["status"].as_str().unwrap_or(""),
                a["node"].as_str().unwrap_or(""),
                a["annotations"]["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("firing", "n0", "bad memory"),
            ("resolved", "n0", "bad memory")
        ],
        "{alerts:#?}"
    );
}

/// A config of these alert rules, for `fluxpipe replay --config`: the
/// source and sink tables a config needs, alerts out.
fn rules_config(dir: &Path, rules: &str) -> PathBuf {
    write(
        dir,
        "rules.toml",
        &format!(
            "{rules}\n[sources.s]\ntype = \"stdin\"\n\n[sinks.o]\ntype = \"stdout\"\ninputs = [\"alerts\"]\n"
        ),
    )
}

/// A job rule with a `queue` watches only that queue's jobs; every job
/// alert names the queue of a job in one.
#[test]
fn a_queue_rule_watches_only_its_queues_jobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = 1_700_000_000.0;
    let line = |id: u64, ts: f64, name: &str, ctx: Value, queue: Option<&str>| {
        let mut ev = json!({"timestamp": ts, "name": name});
        if !ctx.is_null() {
            ev["context"] = ctx;
        }
        let mut msg = json!({"id": id, "events": [ev]});
        if let Some(q) = queue {
            msg["jobspec"] = json!({"version": 1,
                "resources": [{"type": "slot", "count": 1, "with": [{"type": "core", "count": 1}]}],
                "tasks": [{"command": ["sleep"]}],
                "attributes": {"system": {"duration": 0, "queue": q}}});
        }
        format!("{msg}\n")
    };
    let mut journal = String::new();
    for (id, queue) in [(1, Some("debug")), (2, Some("batch")), (3, None)] {
        let submit = json!({"userid": 5, "urgency": 16, "flags": 0, "version": 1});
        journal += &line(id, t, "submit", submit, queue);
        journal += &line(id, t + 0.01, "validate", Value::Null, None);
        journal += &line(id, t + 0.02, "depend", Value::Null, None);
        journal += &line(id, t + 0.03, "priority", json!({"priority": 16}), None);
    }
    // The clock moves on 2 h (another job's event).
    let submit = json!({"userid": 5, "urgency": 16, "flags": 0, "version": 1});
    journal += &line(4, t + 7200.0, "submit", submit, None);
    let input = write(dir.path(), "journal.jsonl", &journal);
    let config = rules_config(
        dir.path(),
        r#"
[alerts]
clock = "event"

[alerts.rules.debug_sched]
kind = "job_state"
state = "SCHED"
for = "1h"
queue = "debug"

[alerts.rules.any_sched]
kind = "job_state"
state = "SCHED"
for = "1h"
"#,
    );
    let alerts = replay_alerts(&["--config", config.to_str().expect("utf-8")], &input);
    let mut got: Vec<(&str, u64, Option<&str>, Option<&str>)> = alerts
        .iter()
        .filter(|a| a["status"] == "firing")
        .map(|a| {
            (
                a["alertname"].as_str().unwrap_or(""),
                a["id"].as_u64().unwrap_or(0),
                a["labels"]["queue"].as_str(),
                a["queue"].as_str(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("any_sched", 1, Some("debug"), Some("debug")),
            ("any_sched", 2, Some("batch"), Some("batch")),
            ("any_sched", 3, None, None),
            ("debug_sched", 1, Some("debug"), Some("debug")),
        ],
        "{alerts:#?}"
    );
    // A node rule takes no queue.
    let bad = rules_config(
        dir.path(),
        "[alerts.rules.n]\nkind = \"node_drained\"\nfor = \"1h\"\nqueue = \"debug\"\n",
    );
    let out = common::fluxpipe()
        .args(["replay", "--config"])
        .arg(&bad)
        .arg(&input)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("queue"), "{err}");
}

/// Alerts Alertmanager has not taken are shown as buffered: the sink is
/// done with their records at once (they are announced again from the
/// restored state after a restart), so its queue alone would say 0.
#[test]
fn undelivered_alerts_show_as_buffered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (nobody, api) = (common::free_port(), common::free_port());
    let events = dir.path().join("events.jsonl");
    let t0 = now();
    for id in 1..=5 {
        append(&events, &to_sched(id, t0));
    }
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = "{d}/data"
[alerts]
clock = "wall"
[alerts.rules.sched_stuck]
kind = "job_state"
state = "SCHED"
for = "1s"
[sources.events]
type = "file"
include = ["{events}"]
poll_interval_ms = 100
[sinks.am]
type = "alertmanager"
url = "http://127.0.0.1:{nobody}"
inputs = ["alerts"]
[api]
address = "127.0.0.1:{api}"
"#,
            d = dir.path().display(),
            events = events.display(),
        ),
    )
    .expect("config");
    let _fluxpipe = Reaper(
        common::fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fluxpipe"),
    );
    let buffered = || {
        common::scrape(api)
            .get("fluxpipe_sink_buffered_records{sink=\"am\"}")
            .copied()
            .unwrap_or(0.0)
    };
    wait_for(
        "5 alerts buffered for an Alertmanager that is away",
        30,
        || buffered() == 5.0,
    );
}

/// `fluxpipe run --config CONFIG`, its log on ours, killed at the end of
/// the test.
fn run_config(config: &Path) -> Reaper {
    Reaper(
        common::fluxpipe()
            .args(["run", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn fluxpipe"),
    )
}

/// The series whose name and labels contain every one of `parts`.
fn series<'a>(
    samples: &'a std::collections::BTreeMap<String, f64>,
    parts: &[&str],
) -> Vec<(&'a str, f64)> {
    samples
        .iter()
        .filter(|(k, _)| parts.iter().all(|p| k.contains(p)))
        .map(|(k, v)| (k.as_str(), *v))
        .collect()
}

/// The alerts (name, status) an alert receiver got, in order.
fn received_alerts(receiver: &common::HttpReceiver) -> Vec<Value> {
    receiver
        .requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<Value>(&r.body).ok())
        .filter_map(|v| v.as_array().cloned())
        .flatten()
        .collect()
}

/// The watchman over the forwarder's road (an `http` source, an
/// `alertmanager` sink): every counter is served at 0 before any input;
/// empty POSTs (heartbeats) keep `feed_silent` quiet; silence fires it
/// within its `for` and a few seconds, and a line resolves it; an
/// `instance-down` line gives exactly one `instance_down` alert and no
/// `node_offline`, and the `restart` resolves it.
#[test]
fn the_watchman_says_when_a_feed_goes_silent_and_an_instance_goes_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = common::HttpReceiver::start();
    let (http_port, api_port) = (common::free_port(), common::free_port());
    let records = dir.path().join("alerts.jsonl");
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = "{d}/data"

[alerts.rules.feed_silent]
kind = "feed_silent"
for = "3s"
severity = "critical"

[alerts.rules.instance_down]
kind = "instance_down"
for = "1s"
severity = "critical"

[alerts.rules.node_offline]
kind = "node_offline"
for = "1s"
severity = "critical"

[sources.flux]
type = "http"
address = "127.0.0.1:{http_port}"
cluster = "picl"

[sinks.am]
type = "alertmanager"
url = "http://127.0.0.1:{am}"
inputs = ["alerts"]

[sinks.log]
type = "file"
path = "{records}"
inputs = ["alerts"]

[api]
address = "127.0.0.1:{api_port}"
"#,
            d = dir.path().display(),
            am = receiver.port,
            records = records.display(),
        ),
    )
    .expect("config");
    let mut fluxpipe = run_config(&config);
    wait_for("/metrics", 30, || !common::scrape(api_port).is_empty());

    // Before any input: every counter a one-off loss would move is there,
    // at 0.
    let fresh = common::scrape(api_port);
    for parts in [
        &["fluxpipe_events_invalid_total{", "source=\"flux\""][..],
        &["fluxpipe_source_errors_total{", "source=\"flux\""],
        &["fluxpipe_sink_errors_total{", "sink=\"am\""],
        &["fluxpipe_sink_errors_total{", "sink=\"log\""],
        &[
            "fluxpipe_records_dropped_total{",
            "sink=\"am\"",
            "reason=\"full\"",
        ],
        &[
            "fluxpipe_records_dropped_total{",
            "sink=\"log\"",
            "reason=\"undeliverable\"",
        ],
        &["fluxpipe_checkpoint_failures_total"],
        &["fluxpipe_jobs_refused_total{", "reason=\"max_jobs\""],
        &["fluxpipe_events_duplicate_total"],
        &[
            "fluxpipe_anomalies_total{",
            "kind=\"out-of-order\"",
            "stream=\"job\"",
        ],
        &[
            "fluxpipe_alerts_total{",
            "rule=\"feed_silent\"",
            "status=\"firing\"",
        ],
    ] {
        let found = series(&fresh, parts);
        assert_eq!(found.len(), 1, "{parts:?} in a fresh scrape: {found:?}");
        assert_eq!(found[0].1, 0.0, "{found:?}");
    }
    let last_seen = |samples: &std::collections::BTreeMap<String, f64>| {
        series(
            samples,
            &[
                "fluxpipe_feed_last_seen_timestamp_seconds{",
                "source=\"flux\"",
                "flux_cluster=\"picl\"",
            ],
        )
        .first()
        .map(|s| s.1)
    };
    wait_for("the feed's last-seen time", 10, || {
        last_seen(&common::scrape(api_port)).is_some()
    });

    // Heartbeats for twice the rule's `for`: nothing fires.
    let client = common::http_client();
    let url = format!("http://127.0.0.1:{http_port}/");
    let beat = || {
        let answer = client.post(&url).send().expect("heartbeat");
        assert_eq!(answer.status().as_u16(), 200);
        let body: Value =
            serde_json::from_str(&answer.text().expect("an answer")).expect("a JSON answer");
        assert_eq!(body["lines"], 0, "{body}");
        assert_eq!(body["applied"], 0, "{body}");
    };
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        beat();
        std::thread::sleep(Duration::from_millis(500));
    }
    let heard = last_seen(&common::scrape(api_port)).expect("last seen");
    assert!(
        heard >= now() - 3.0,
        "heartbeats move the last-seen time: {heard}"
    );
    let feed_silent = |a: &Value| a["labels"]["alertname"] == "feed_silent";
    assert!(
        !received_alerts(&receiver).iter().any(feed_silent),
        "heartbeats keep feed_silent quiet"
    );

    // Silence: it fires within its `for` and a few seconds.
    let silent_from = Instant::now();
    wait_for("feed_silent at the receiver", 15, || {
        received_alerts(&receiver).iter().any(feed_silent)
    });
    assert!(
        silent_from.elapsed() >= Duration::from_secs(2),
        "not before its `for`"
    );
    let got = received_alerts(&receiver);
    let alert = got.iter().find(|a| feed_silent(a)).expect("alert");
    assert_eq!(alert["labels"]["flux_cluster"], "picl", "{alert}");
    assert_eq!(alert["labels"]["source"], "flux", "{alert}");
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    // The API and the status page list it with every other alert.
    let api_alerts = |query: &str| -> Vec<Value> {
        let (code, body) =
            common::http_get(api_port, &format!("/api/v1/alerts{query}")).expect("/api/v1/alerts");
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        v["alerts"].as_array().cloned().unwrap_or_default()
    };
    let listed = api_alerts("?cluster=picl");
    assert!(
        listed
            .iter()
            .any(|a| feed_silent(a) && a["labels"]["source"] == "flux"),
        "{listed:?}"
    );
    assert!(api_alerts("?cluster=elsewhere").is_empty());
    let (_, page) = common::http_get(api_port, "/").expect("the status page");
    assert!(page.contains("feed_silent"), "{page}");

    // A restart keeps it fired, from the same start: announced again as
    // restored, listed at once, and not fired anew.
    let since = listed.iter().find(|a| feed_silent(a)).expect("listed")["since"].clone();
    sigterm(&fluxpipe.0);
    assert!(fluxpipe.0.wait().expect("wait").success());
    fluxpipe = run_config(&config);
    wait_for("the API again", 30, || {
        common::http_get(api_port, "/api/v1/alerts").is_some_and(|(code, _)| code == 200)
    });
    let listed = api_alerts("");
    let again = listed
        .iter()
        .find(|a| feed_silent(a))
        .expect("still firing");
    assert_eq!(again["since"], since, "{again}");
    wait_for("the restored announcement", 10, || {
        read_records(&records)
            .iter()
            .any(|r| r["alertname"] == "feed_silent" && r["restored"] == true)
    });

    // The instance speaks, then goes down: feed_silent resolves, one
    // instance_down fires, and no node goes offline under it.
    let t = now();
    let post = |body: String| {
        let answer = client.post(&url).body(body).send().expect("POST");
        assert_eq!(answer.status().as_u16(), 200);
    };
    post(format!(
        "{}\n{}\n",
        json!({"events": [{"timestamp": t, "name": "restart",
            "context": {"ranks": "0-1", "online": "", "nodelist": "n[0-1]"}}]}),
        json!({"events": [{"timestamp": t + 0.1, "name": "online", "context": {"idset": "0-1"}}]}),
    ));
    post(format!(
        "{}\n",
        json!({"events": [{"timestamp": t + 0.2, "name": "instance-down",
            "context": {"reason": "the forwarder lost the instance"}}]})
    ));
    // The forwarder keeps talking (heartbeats) while the instance is
    // down: feed_silent stays resolved.
    let stop_beats = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beats = {
        let (stop, url) = (stop_beats.clone(), url.clone());
        std::thread::spawn(move || {
            let client = common::http_client();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = client.post(&url).send();
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    let instance_down = |a: &Value| a["labels"]["alertname"] == "instance_down";
    wait_for("instance_down at the receiver", 15, || {
        received_alerts(&receiver).iter().any(instance_down)
    });
    wait_for("instance_down listed, feed_silent not", 5, || {
        let listed = api_alerts("");
        listed.iter().any(instance_down) && !listed.iter().any(feed_silent)
    });
    // node_offline's `for` passes with nothing under it.
    std::thread::sleep(Duration::from_secs(3));
    // The instance comes back with its nodes (a restart alone would
    // leave them offline, and node_offline would rightly fire a second
    // later, however long the rest of the test takes).
    let back = now();
    post(format!(
        "{}\n{}\n",
        json!({"events": [{"timestamp": back, "name": "restart",
            "context": {"ranks": "0-1", "online": "", "nodelist": "n[0-1]"}}]}),
        json!({"events": [{"timestamp": back + 0.1, "name": "online", "context": {"idset": "0-1"}}]}),
    ));
    let alerts_of = || read_records(&records);
    wait_for("instance_down resolved", 15, || {
        alerts_of()
            .iter()
            .any(|r| r["alertname"] == "instance_down" && r["status"] == "resolved")
    });
    wait_for("instance_down no longer listed", 5, || {
        !api_alerts("").iter().any(instance_down)
    });
    stop_beats.store(true, std::sync::atomic::Ordering::Relaxed);
    beats.join().expect("heartbeats");
    sigterm(&fluxpipe.0);
    let status = fluxpipe.0.wait().expect("wait");
    assert!(status.success(), "{status}");
    // (rule, status, announced again at the restart)
    let said: Vec<(String, String, bool)> = alerts_of()
        .iter()
        .filter(|r| r["alertname"] != "feed_silent" || r["source"] == "flux")
        .map(|r| {
            (
                r["alertname"].as_str().unwrap_or("").to_string(),
                r["status"].as_str().unwrap_or("").to_string(),
                r["restored"] == true,
            )
        })
        .collect();
    let count = |name: &str, status: &str| {
        said.iter()
            .filter(|(n, s, restored)| n == name && s == status && !restored)
            .count()
    };
    // One record announced again at the restart: feed_silent, firing.
    let restored: Vec<_> = said.iter().filter(|(_, _, r)| *r).collect();
    assert_eq!(
        restored,
        [&("feed_silent".to_string(), "firing".to_string(), true)],
        "{said:?}"
    );
    assert_eq!(count("instance_down", "firing"), 1, "{said:?}");
    assert_eq!(count("instance_down", "resolved"), 1, "{said:?}");
    assert_eq!(count("feed_silent", "firing"), 1, "{said:?}");
    assert_eq!(count("feed_silent", "resolved"), 1, "{said:?}");
    assert_eq!(count("node_offline", "firing"), 0, "{said:?}");
    let firing = alerts_of();
    let down = firing
        .iter()
        .find(|r| r["alertname"] == "instance_down")
        .expect("instance_down");
    assert_eq!(down["labels"]["flux_cluster"], "picl", "{down}");
    assert_eq!(down["kind"], "alert");
}

/// No paging for the past: a backlog two hours old (job 1 sat 30 minutes
/// in SCHED and then ran to its end, job 2 is still in SCHED), posted as
/// a forwarder's first start would, pages only job 2, at Alertmanager
/// and at a webhook (whose `jobs` records go as they come); the `alerts` stream
/// keeps job 1's alert and its resolution for the record. After a
/// restart job 2's alert is announced again (`restored`), and its late
/// resolution still reaches the webhook that was paged.
#[test]
fn a_backlog_two_hours_old_pages_only_what_still_fires() {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = common::HttpReceiver::start();
    let hook = common::HttpReceiver::start();
    let (http_port, api_port) = (common::free_port(), common::free_port());
    let records = dir.path().join("alerts.jsonl");
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = "{d}/data"

[api]
address = "127.0.0.1:{api_port}"

[alerts.rules.sched_too_long]
kind = "job_state"
state = "SCHED"
for = "10m"

[sources.flux]
type = "http"
address = "127.0.0.1:{http_port}"

[sinks.am]
type = "alertmanager"
url = "http://127.0.0.1:{am}"
inputs = ["alerts"]
settle_secs = 2

[sinks.hook]
type = "http"
uri = "http://127.0.0.1:{hook}/"
inputs = ["alerts", "jobs"]
settle_secs = 2
batch_timeout_ms = 100

[sinks.log]
type = "file"
path = "{records}"
inputs = ["alerts"]
"#,
            d = dir.path().display(),
            am = receiver.port,
            hook = hook.port,
            records = records.display(),
        ),
    )
    .expect("config");
    let mut fluxpipe = run_config(&config);
    let t0 = now() - 7200.0;
    let ran = t0 + 1800.0;
    let mut backlog = to_sched(1, t0) + &to_sched(2, t0);
    for (i, name) in ["alloc", "start", "finish", "release", "free", "clean"]
        .iter()
        .enumerate()
    {
        let context = match *name {
            "finish" => json!({"status": 0}),
            "release" => json!({"ranks": "all", "final": true}),
            _ => Value::Null,
        };
        backlog += &envelope(1, ran + i as f64, name, context);
    }
    let url = format!("http://127.0.0.1:{http_port}/");
    wait_for("the http source", 30, || {
        common::http_client().post(&url).send().is_ok()
    });
    let answer = common::http_client()
        .post(&url)
        .body(backlog)
        .send()
        .expect("POST the backlog");
    assert_eq!(answer.status().as_u16(), 200);
    let paged = |job: &str| {
        received_alerts(&receiver)
            .iter()
            .any(|a| a["labels"]["jobid"] == job)
    };
    let (job1, job2) = ("ƒ2", "ƒ3"); // ids 1 and 2 in F58
    wait_for("job 2's alert at the receiver", 20, || paged(job2));
    // Re-sends and the settling are over by now: job 1 never went out.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!paged(job1), "{:?}", received_alerts(&receiver));
    let got = received_alerts(&receiver);
    let sent = got
        .iter()
        .find(|a| a["labels"]["jobid"] == job2)
        .expect("job 2");
    assert!(
        sent["endsAt"].as_str() > Some(rfc3339_now().as_str()),
        "sent as firing: {sent}"
    );
    let scraped = common::scrape(api_port);
    let not_paged = series(
        &scraped,
        &["fluxpipe_alerts_not_paged_total{", "sink=\"am\""],
    );
    assert_eq!(not_paged.first().map(|s| s.1), Some(1.0), "{not_paged:?}");

    // The webhook: job 2's alert only, and every job record.
    let hooked = |kind: &str, job: &str| {
        received_alerts(&hook)
            .iter()
            .filter(|r| r["kind"] == kind && (r["labels"]["jobid"] == job || r["jobid"] == job))
            .map(|r| {
                r["status"]
                    .as_str()
                    .or(r["state"].as_str())
                    .unwrap_or("")
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    wait_for("job 2's alert at the webhook", 20, || {
        !hooked("alert", job2).is_empty()
    });
    assert_eq!(hooked("alert", job2), ["firing"]);
    assert!(
        hooked("alert", job1).is_empty(),
        "{:?}",
        received_alerts(&hook)
    );
    // Job 1's record (written once a job is inactive) went out with them.
    assert_eq!(
        hooked("job", job1),
        ["INACTIVE"],
        "{:?}",
        received_alerts(&hook)
    );
    let not_paged = series(
        &scraped,
        &["fluxpipe_alerts_not_paged_total{", "sink=\"hook\""],
    );
    assert_eq!(not_paged.first().map(|s| s.1), Some(1.0), "{not_paged:?}");
    sigterm(&fluxpipe.0);
    let status = fluxpipe.0.wait().expect("wait");
    assert!(status.success(), "{status}");

    // Restarted: job 2 is announced again; it runs an hour ago, and the
    // webhook that was paged hears of the end.
    let mut fluxpipe = run_config(&config);
    wait_for("the http source again", 30, || {
        common::http_client().post(&url).send().is_ok()
    });
    let alloc = envelope(2, now() - 3600.0, "alloc", Value::Null);
    let answer = common::http_client()
        .post(&url)
        .body(alloc)
        .send()
        .expect("POST job 2's alloc");
    assert_eq!(answer.status().as_u16(), 200);
    wait_for("job 2's resolution at the webhook", 20, || {
        hooked("alert", job2).contains(&"resolved".to_string())
    });
    sigterm(&fluxpipe.0);
    let status = fluxpipe.0.wait().expect("wait");
    assert!(status.success(), "{status}");
    let again = read_records(&records)
        .into_iter()
        .filter(|r| r["labels"]["jobid"] == job2 && r["status"] == "firing")
        .collect::<Vec<_>>();
    assert_eq!(again.len(), 2, "{again:?}");
    assert_eq!(again[0].get("restored"), None);
    assert_eq!(again[1]["restored"], true);
    assert_eq!(
        again[0]["record_id"], again[1]["record_id"],
        "the same alert"
    );
    let said: Vec<(String, String)> = read_records(&records)
        .iter()
        .map(|r| {
            (
                r["labels"]["jobid"].as_str().unwrap_or("").to_string(),
                r["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let has = |job: &str, status: &str| said.iter().any(|(j, s)| j == job && s == status);
    assert!(has(job1, "firing") && has(job1, "resolved"), "{said:?}");
    assert!(has(job2, "firing") && has(job2, "resolved"), "{said:?}");
}

fn rfc3339_now() -> String {
    jiff::Timestamp::now().to_string()
}

/// A cluster named in the records (here `t`, beside the source's own
/// `picl`) is a feed of its own: its last word is served, its silence
/// fires `feed_silent` for it, and a heartbeat, which names no cluster,
/// keeps every cluster of the source quiet.
#[test]
fn a_cluster_named_in_records_is_watched_as_a_feed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (http_port, api_port) = (common::free_port(), common::free_port());
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = "{d}/data"

[alerts.rules.feed_silent]
kind = "feed_silent"
for = "2s"

[sources.flux]
type = "http"
address = "127.0.0.1:{http_port}"
cluster = "picl"

[sinks.none]
type = "blackhole"
inputs = ["alerts"]

[api]
address = "127.0.0.1:{api_port}"
"#,
            d = dir.path().display(),
        ),
    )
    .expect("config");
    let _fluxpipe = run_config(&config);
    let client = common::http_client();
    let url = format!("http://127.0.0.1:{http_port}/");
    wait_for("the http source", 30, || client.post(&url).send().is_ok());
    let answer = client
        .post(&url)
        .body(to_sched(1, now()))
        .send()
        .expect("POST");
    assert_eq!(answer.status().as_u16(), 200);
    let seen = |cluster: &str| {
        series(
            &common::scrape(api_port),
            &[
                "fluxpipe_feed_last_seen_timestamp_seconds{",
                "source=\"flux\"",
                &format!("flux_cluster=\"{cluster}\""),
            ],
        )
        .len()
    };
    wait_for("t's last word", 10, || seen("t") == 1);
    let silent = |cluster: &str| {
        let (_, body) =
            common::http_get(api_port, &format!("/api/v1/alerts?cluster={cluster}")).expect("API");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        v["alerts"].as_array().is_some_and(|list| {
            list.iter().any(|a| {
                a["labels"]["alertname"] == "feed_silent" && a["labels"]["source"] == "flux"
            })
        })
    };
    wait_for("feed_silent for t", 15, || silent("t"));
    // Heartbeats: every cluster of the source is heard.
    wait_for("quiet again", 15, || {
        let _ = client.post(&url).send();
        !silent("t") && !silent("picl")
    });
}
