//! The `prometheus` sink: scrape `/metrics` of a real `fluxpipe run` fed
//! with the corpus and check exact values; `promtool check metrics` (from
//! the Debian package `prometheus`, installed by `.ci/run`) accepts it.

use crate::common::{
    Reaper, corpus, fluxpipe, free_port, http_get, http_get_with, samples, sigterm,
};

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Sample values by series (name plus labels, as printed).
/// What Prometheus sends when it scrapes.
const PROMETHEUS_ACCEPT: &str = "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n";

/// Parse OpenMetrics text with the Prometheus Python client's strict
/// parser (`FLUXPIPE_OPENMETRICS_PYTHON`, a Python that has
/// `prometheus_client`: `tests/run-all` makes one; else `python3` if it
/// has it).
fn check_openmetrics(text: &str) {
    let python = std::env::var("FLUXPIPE_OPENMETRICS_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import sys\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
        print(sum(len(f.samples) for f in parse(sys.stdin.read())))\n";
    let has_parser = Command::new(&python)
        .args(["-c", "import prometheus_client"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_parser {
        assert!(
            std::env::var_os("FLUXPIPE_OPENMETRICS_PYTHON").is_none(),
            "{python} has no prometheus_client"
        );
        eprintln!("no Python with prometheus_client: OpenMetrics not parsed");
        return;
    }
    let mut child = Command::new(&python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("python");
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the text: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: usize = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("count");
    let samples = text.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(parsed, samples, "every sample parsed");
}

/// Lines for stdin: instance B's journals (cluster B, from the source's
/// default) and instance A's resource journal up to a point where rank 1 is
/// drained, as envelopes naming cluster A.
fn input() -> Vec<u8> {
    let mut out = Vec::new();
    let b = corpus().join("instances/B/journals");
    for f in [
        "incarnation1.job-manager.events-journal.jsonl",
        "incarnation1.resource.journal.jsonl",
        "incarnation2.job-manager.events-journal.jsonl",
        "incarnation2.resource.journal.jsonl",
    ] {
        out.extend(std::fs::read(b.join(f)).expect("journal"));
    }
    let a =
        std::fs::read_to_string(corpus().join("instances/A-incarnation1/resource.journal.jsonl"))
            .expect("A journal");
    for line in a.lines() {
        let msg: Value = serde_json::from_str(line).expect("json");
        for ev in msg["events"].as_array().expect("events") {
            let env = json!({"cluster": "A", "stream": "resource", "event": ev});
            out.extend(format!("{env}\n").as_bytes());
        }
        if line.contains("forced reason and timestamp") {
            break;
        }
    }
    out
}

#[test]
fn scrape_after_the_corpus_gives_exact_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\ncluster = \"B\"\n\
             [sources.files]\ntype = \"file\"\ninclude = [{:?}]\ncluster = \"F\"\npoll_interval_ms = 20\n\
             [sources.journal]\ntype = \"file\"\ninclude = [{:?}]\ncluster = \"J\"\npoll_interval_ms = 20\n\
             [sinks.out]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\n\
             [api]\naddress = \"127.0.0.1:{port}\"\nper_user_jobs = true\n",
            dir.path().join("state"),
            dir.path().join("f.eventlog"),
            dir.path().join("j.jsonl"),
        ),
    )
    .expect("config");
    // A tailed file, read to its end: its source lag is 0 bytes.
    std::fs::write(
        dir.path().join("f.eventlog"),
        "{\"timestamp\":1.5,\"name\":\"online\",\"context\":{\"idset\":\"0\"}}\n",
    )
    .expect("file");
    // Cluster J, per user: user 7 has a job in DEPEND and one in NEW, user
    // 8 one in NEW, user 9 one that ended (no series left for it).
    let submit = |id: u64, user: u64, t: f64| {
        format!(
            "{{\"id\":{id},\"events\":[{{\"timestamp\":{t},\"name\":\"submit\",\"context\":{{\"userid\":{user},\"urgency\":16,\"flags\":0,\"version\":1}}}}]}}\n"
        )
    };
    let event = |id: u64, t: f64, name: &str| {
        format!("{{\"id\":{id},\"events\":[{{\"timestamp\":{t},\"name\":\"{name}\"}}]}}\n")
    };
    // Queues: job 1 in debug, job 4 in batch (their jobspecs), job 2 in
    // none until an update moves it to batch; job 3 in none.
    let queued = |line: String, queue: &str| {
        line.replace(
            "]}\n",
            &format!(
                "],\"jobspec\":{{\"version\":1,\"resources\":[{{\"type\":\"slot\",\"count\":1,\"with\":[{{\"type\":\"core\",\"count\":1}}]}}],\"tasks\":[{{\"command\":[\"true\"]}}],\"attributes\":{{\"system\":{{\"duration\":0,\"queue\":\"{queue}\"}}}}}}}}\n"
            ),
        )
    };
    let mut journal = queued(submit(1, 7, 1.0), "debug") + &event(1, 2.0, "validate");
    journal += &submit(2, 7, 3.0);
    journal += "{\"id\":2,\"events\":[{\"timestamp\":3.5,\"name\":\"jobspec-update\",\"context\":{\"attributes.system.queue\":\"batch\"}}]}\n";
    journal += &submit(3, 8, 4.0);
    journal += &queued(submit(4, 9, 5.0), "batch");
    journal += &event(4, 6.0, "validate");
    journal += "{\"id\":4,\"events\":[{\"timestamp\":7.0,\"name\":\"exception\",\"context\":{\"type\":\"cancel\",\"severity\":0,\"userid\":9,\"note\":\"\"}}]}\n";
    journal += &event(4, 8.0, "clean");
    std::fs::write(dir.path().join("j.jsonl"), journal).expect("journal");
    // Killed if an assertion fails first: no pipeline left running.
    let mut child = Reaper(
        fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let mut stdin = child.0.stdin.take().expect("stdin");
    stdin.write_all(&input()).expect("write");
    stdin.flush().expect("flush");

    // Poll until every B job is counted.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (text, values) = loop {
        if let Some((200, body)) = http_get(port, "/metrics") {
            let v = samples(&body);
            let done: f64 = v
                .iter()
                .filter(|(k, _)| k.starts_with("flux_jobs_inactive_total{flux_cluster=\"B\""))
                .map(|(_, n)| n)
                .sum();
            let j_done = v
                .get("flux_jobs_inactive_total{flux_cluster=\"J\",queue=\"batch\",result=\"CANCELED\"}")
                .copied()
                .unwrap_or(0.0);
            if done >= 16.0 && j_done >= 1.0 {
                break (body, v);
            }
        }
        assert!(Instant::now() < deadline, "metrics never showed the corpus");
        std::thread::sleep(Duration::from_millis(100));
    };

    let get = |s: &str| {
        *values
            .get(s)
            .unwrap_or_else(|| panic!("no series {s} in\n{text}"))
    };
    assert_eq!(get("fluxpipe_source_lag_bytes{source=\"files\"}"), 0.0);
    // The usual exporter series: this process's own, and what it was built from.
    let version = String::from_utf8(
        fluxpipe()
            .arg("--version")
            .output()
            .expect("version")
            .stdout,
    )
    .expect("utf-8");
    let commit = version
        .split(['(', ')'])
        .nth(1)
        .expect("a commit in --version");
    assert_eq!(
        get(&format!(
            "fluxpipe_build_info{{version=\"{}\",commit=\"{commit}\"}}",
            env!("CARGO_PKG_VERSION")
        )),
        1.0
    );
    assert!(get("process_resident_memory_bytes") > 1e6);
    assert!(get("process_open_fds") >= 3.0);
    assert!(get("process_start_time_seconds") > 1.7e9);
    // Checkpoints take milliseconds: their buckets start there.
    assert!(
        values.contains_key("fluxpipe_checkpoint_duration_seconds_bucket{le=\"0.001\"}"),
        "{text}"
    );
    // flux-core's own answers for instance B: 18 jobs, 16 inactive.
    let fj: Value = serde_json::from_str(
        &std::fs::read_to_string(corpus().join("instances/B/flux-jobs-a.json")).expect("answers"),
    )
    .expect("json");
    // Per queue: jobs of no queue have no `queue` label.
    let mut by_result: BTreeMap<(Option<String>, String), f64> = BTreeMap::new();
    let mut active: BTreeMap<(Option<String>, String), f64> = BTreeMap::new();
    let mut queues: BTreeSet<Option<String>> = BTreeSet::from([None]);
    for j in fj["jobs"].as_array().expect("jobs") {
        let state = j["state"].as_str().expect("state");
        let queue = j["queue"].as_str().map(String::from);
        queues.insert(queue.clone());
        if state == "INACTIVE" {
            let result = j["result"].as_str().expect("result").to_string();
            *by_result.entry((queue, result)).or_default() += 1.0;
        } else {
            *active.entry((queue, state.into())).or_default() += 1.0;
        }
    }
    let series = |name: &str, queue: &Option<String>, key: &str, value: &str| match queue {
        Some(q) => format!("{name}{{flux_cluster=\"B\",queue=\"{q}\",{key}=\"{value}\"}}"),
        None => format!("{name}{{flux_cluster=\"B\",{key}=\"{value}\"}}"),
    };
    for queue in &queues {
        for result in ["COMPLETED", "FAILED", "CANCELED", "TIMEOUT"] {
            let want = by_result
                .get(&(queue.clone(), result.to_string()))
                .copied()
                .unwrap_or(0.0);
            let name = series("flux_jobs_inactive_total", queue, "result", result);
            assert_eq!(get(&name), want, "{name}");
        }
        for state in ["NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP"] {
            let want = active
                .get(&(queue.clone(), state.to_string()))
                .copied()
                .unwrap_or(0.0);
            let name = series("flux_jobs", queue, "state", state);
            assert_eq!(get(&name), want, "{name}");
        }
    }
    // J's queues, a job moved by an update counted in its new one.
    for (series, want) in [
        (
            "flux_jobs{flux_cluster=\"J\",queue=\"debug\",state=\"DEPEND\"}",
            1.0,
        ),
        (
            "flux_jobs{flux_cluster=\"J\",queue=\"batch\",state=\"NEW\"}",
            1.0,
        ),
        ("flux_jobs{flux_cluster=\"J\",state=\"NEW\"}", 1.0),
        ("flux_jobs{flux_cluster=\"J\",state=\"DEPEND\"}", 0.0),
        (
            "flux_jobs_inactive_total{flux_cluster=\"J\",queue=\"batch\",result=\"CANCELED\"}",
            1.0,
        ),
        (
            "flux_jobs_inactive_total{flux_cluster=\"J\",result=\"CANCELED\"}",
            0.0,
        ),
    ] {
        assert_eq!(get(series), want, "{series}");
    }
    // Per user (switched on here): exactly the (user, state) pairs with
    // active jobs; none for B (all its jobs ended) or for J's user 9.
    let by_user = |cluster: &str| -> BTreeMap<String, f64> {
        let prefix = format!("flux_jobs_by_user{{flux_cluster=\"{cluster}\"");
        values
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    assert!(active.is_empty() && by_user("B").is_empty(), "{text}");
    let want: BTreeMap<String, f64> = [("7", "DEPEND", 1.0), ("7", "NEW", 1.0), ("8", "NEW", 1.0)]
        .into_iter()
        .map(|(u, st, n)| {
            (
                format!("flux_jobs_by_user{{flux_cluster=\"J\",userid=\"{u}\",state=\"{st}\"}}"),
                n,
            )
        })
        .collect();
    assert_eq!(by_user("J"), want);
    // The oldest-entry series exists exactly for the states with jobs.
    for state in ["NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP"] {
        let series = format!(
            "flux_job_state_oldest_entry_timestamp_seconds{{flux_cluster=\"B\",state=\"{state}\"}}"
        );
        assert_eq!(
            values.contains_key(&series),
            active.keys().any(|(_, s)| s == state),
            "{series}"
        );
    }
    // Nodes: B has 4 online ranks, none drained; A has rank 1 drained.
    assert_eq!(get("flux_nodes{flux_cluster=\"B\"}"), 4.0);
    assert_eq!(get("flux_nodes_online{flux_cluster=\"B\"}"), 4.0);
    assert_eq!(get("flux_nodes_drained{flux_cluster=\"B\"}"), 0.0);
    assert_eq!(get("flux_nodes_drained{flux_cluster=\"A\"}"), 1.0);
    assert_eq!(
        get(
            "flux_node_drain_info{flux_cluster=\"A\",node=\"node1\",rank=\"1\",reason=\"forced reason and timestamp\",state=\"drained\"}"
        ),
        1.0
    );
    assert!(
        values
            .keys()
            .filter(|k| k.starts_with("flux_node_drain_info{"))
            .count()
            == 1,
        "only rank 1 of A is drained"
    );
    assert_eq!(
        get("flux_node_online{flux_cluster=\"A\",node=\"node2\",rank=\"2\"}"),
        1.0
    );
    assert!(
        get("flux_job_transitions_total{flux_cluster=\"B\",from=\"RUN\",to=\"CLEANUP\"}") >= 1.0
    );
    assert_eq!(get("fluxpipe_sink_buffered_records{sink=\"out\"}"), 0.0);
    assert!(
        values
            .keys()
            .any(|k| k.starts_with("flux_job_queue_wait_seconds_bucket"))
    );

    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));

    // promtool checks the exposition format and the naming conventions.
    if let Ok(mut promtool) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        promtool
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = promtool.wait_with_output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool must be installed in CI"
        );
    }

    // A scraper that prefers OpenMetrics (Prometheus's own Accept header)
    // gets the same samples in OpenMetrics, which a strict parser reads.
    let (status, head, om) = http_get_with(port, "/metrics", PROMETHEUS_ACCEPT).expect("scrape");
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(om.ends_with("\n# EOF\n"), "{om}");
    assert!(om.contains("# TYPE flux_job_transitions counter\n"));
    let series = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_string()))
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(
        series(&om),
        series(&text),
        "the same series in both formats"
    );
    check_openmetrics(&om);

    // The file source tails on after stdin ends: SIGTERM stops it.
    drop(stdin);
    sigterm(&child.0);
    let status = child.0.wait().expect("wait");
    assert!(status.success());

    // Started again on the same data folder: J's jobs come back from the
    // checkpoint (its journal is not read again), counted per user and by
    // state as before.
    let child = Reaper(
        fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let restored = loop {
        if let Some((200, body)) = http_get(port, "/metrics") {
            let v = samples(&body);
            // Per queue, as before the restart.
            if v.get("flux_jobs{flux_cluster=\"J\",state=\"NEW\"}") == Some(&1.0)
                && v.get("flux_jobs{flux_cluster=\"J\",queue=\"batch\",state=\"NEW\"}")
                    == Some(&1.0)
                && v.get("flux_jobs{flux_cluster=\"J\",queue=\"debug\",state=\"DEPEND\"}")
                    == Some(&1.0)
            {
                break v;
            }
        }
        assert!(Instant::now() < deadline, "the restored jobs never showed");
        std::thread::sleep(Duration::from_millis(100));
    };
    let by_user: BTreeMap<String, f64> = restored
        .into_iter()
        .filter(|(k, _)| k.starts_with("flux_jobs_by_user{flux_cluster=\"J\""))
        .collect();
    assert_eq!(by_user, want, "per-user counts restored");
    sigterm(&child.0);
}
