//! The query API of `fluxpipe run` (`/api/v1/...`) against a real run: a
//! journal cut off mid-run (jobs in every state, drained and offline
//! ranks), read by two shards; every answer is checked against
//! `fluxpipe replay` of the same lines.

mod common;

use common::{fluxpipe, free_port, generate, http_get, replay, sigterm, wait_until};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Stdio;

fn get_json(port: u16, path: &str) -> (u16, Value) {
    let (status, body) = http_get(port, path).unwrap_or_else(|| panic!("GET {path}: no answer"));
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"));
    (status, value)
}

fn f64_of(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

#[test]
fn the_api_answers_what_replay_finds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = dir.path().join("full.jsonl");
    generate(&["--jobs", "400", "--nodes", "32", "--seed", "7"], &full);
    // Cut off mid-run: many jobs still pending or running.
    let text = std::fs::read_to_string(&full).expect("journal");
    let lines: Vec<&str> = text.lines().collect();
    let cut = dir.path().join("cut.jsonl");
    std::fs::write(&cut, lines[..lines.len() * 2 / 3].join("\n") + "\n").expect("write");

    let replayed = replay(&["--cluster", "g"], &[&cut]);
    let jobs: BTreeMap<u64, &Value> = replayed
        .iter()
        .filter(|r| r["kind"] == "job")
        .map(|r| (r["id"].as_u64().expect("id"), r))
        .collect();
    let ranks: Vec<&Value> = replayed.iter().filter(|r| r["kind"] == "rank").collect();
    let count = |f: &dyn Fn(&str) -> bool| {
        jobs.values()
            .filter(|j| f(j["state"].as_str().unwrap_or("")))
            .count()
    };
    let running = count(&|s| s == "RUN" || s == "CLEANUP");
    let pending = count(&|s| ["DEPEND", "PRIORITY", "SCHED"].contains(&s));
    assert!(
        running > 0 && pending > 0,
        "the cut leaves jobs in every state"
    );

    let port = free_port();
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nworkers = 2\n\
             [operators]\ninactive_grace_secs = 3600\n\
             [sources.journal]\ntype = \"file\"\ninclude = [{:?}]\ncluster = \"g\"\n\
             [api]\naddress = \"127.0.0.1:{port}\"\n",
            dir.path().join("state"),
            cut
        ),
    )
    .expect("config");
    let mut run = fluxpipe()
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .spawn()
        .expect("start fluxpipe run");

    // Clusters: every job and rank read.
    wait_until("every job held", 30, || {
        http_get(port, "/api/v1/clusters").is_some_and(|(s, body)| {
            s == 200
                && serde_json::from_str::<Value>(&body).is_ok_and(|v| {
                    v["clusters"][0]["jobs"].as_object().is_some_and(|m| {
                        m.values().filter_map(Value::as_u64).sum::<u64>() == jobs.len() as u64
                    })
                })
        })
    });
    let (_, clusters) = get_json(port, "/api/v1/clusters");
    let g = &clusters["clusters"][0];
    assert_eq!(g["cluster"], "g");
    for (state, n) in g["jobs"].as_object().expect("jobs") {
        assert_eq!(n.as_u64(), Some(count(&|s| s == state) as u64), "{state}");
    }

    // Jobs, page by page: every job once, equal to replay, in flux jobs order.
    let mut listed: Vec<Value> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/api/v1/jobs?limit=7&after={a}"),
            None => "/api/v1/jobs?limit=7".to_string(),
        };
        let (status, page) = get_json(port, &path);
        assert_eq!(status, 200, "{page}");
        listed.extend(page["jobs"].as_array().expect("jobs").iter().cloned());
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(listed.len(), jobs.len());
    for job in &listed {
        let id = job["id"].as_u64().expect("id");
        let want = jobs[&id];
        for key in [
            "state",
            "priority",
            "t_submit",
            "t_run",
            "t_inactive",
            "result",
            "userid",
        ] {
            assert_eq!(job[key], want[key], "job {id}: {key}");
        }
    }
    let group = |j: &Value| match j["state"].as_str().unwrap_or("") {
        "RUN" | "CLEANUP" => 1,
        "INACTIVE" => 2,
        _ => 0,
    };
    for pair in listed.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(group(a) <= group(b), "{a} before {b}");
        if group(a) == group(b) {
            match group(a) {
                0 => assert!(f64_of(a, "priority") >= f64_of(b, "priority"), "{a} {b}"),
                1 => assert!(f64_of(a, "t_run") >= f64_of(b, "t_run"), "{a} {b}"),
                _ => assert!(
                    f64_of(a, "t_inactive") >= f64_of(b, "t_inactive"),
                    "{a} {b}"
                ),
            }
        }
    }

    // Filters.
    let (_, page) = get_json(port, "/api/v1/jobs?state=running&limit=10000");
    assert_eq!(page["jobs"].as_array().map(Vec::len), Some(running));
    let (_, page) = get_json(port, "/api/v1/jobs?state=pending&cluster=g");
    assert_eq!(page["jobs"].as_array().map(Vec::len), Some(pending));
    let (_, page) = get_json(port, "/api/v1/jobs?cluster=nowhere");
    assert_eq!(page["jobs"].as_array().map(Vec::len), Some(0));
    let (status, e) = get_json(port, "/api/v1/jobs?state=bogus");
    assert_eq!(status, 400, "{e}");
    let (status, e) = get_json(port, "/api/v1/jobs?colour=red");
    assert_eq!(status, 400, "{e}");

    // One job, by its F58 id; an unknown one; a malformed one.
    let (&id, want) = jobs
        .iter()
        .find(|(_, j)| j["state"] == "RUN")
        .expect("a running job");
    let out = fluxpipe()
        .args(["id", "--to", "f58"])
        .arg(id.to_string())
        .output()
        .expect("fluxpipe id");
    let f58 = String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string();
    let (status, job) = get_json(port, &format!("/api/v1/jobs/{f58}"));
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["id"].as_u64(), Some(id));
    assert_eq!(job["t_run"], want["t_run"]);
    assert_eq!(job["state_since"], want["t_run"], "running since its start");
    assert!(job["ranks"].is_string(), "a running job holds ranks: {job}");
    let (status, _) = get_json(port, "/api/v1/jobs/1");
    assert_eq!(status, 404);
    let (status, _) = get_json(port, "/api/v1/jobs/not-an-id");
    assert_eq!(status, 400);

    // Nodes: every rank as replay has it.
    let (_, nodes) = get_json(port, "/api/v1/nodes");
    let nodes = nodes["nodes"].as_array().expect("nodes").clone();
    assert_eq!(nodes.len(), ranks.len());
    for (node, rank) in nodes.iter().zip(&ranks) {
        for key in ["rank", "hostname", "online", "drained", "drain_reason"] {
            assert_eq!(node[key], rank[key], "{node} vs {rank}");
        }
    }
    let drained = ranks.iter().filter(|r| r["drained"] == true).count();
    let (_, only) = get_json(port, "/api/v1/nodes?state=drained,draining");
    assert_eq!(only["nodes"].as_array().map(Vec::len), Some(drained));

    // `-o FORMAT`: `fluxpipe jobs` asking the pipeline and `fluxpipe
    // replay` of the same lines print the same lines.
    let format = "{id.f58:>12} {status_abbrev:>2.2} {state_single} {ntasks:>6h} ?:{queue:<8} ?:{project:<8} {exception.occurred} {nodelist}";
    let printed = |cmd: &mut std::process::Command| -> (String, Vec<String>) {
        let out = cmd.output().expect("fluxpipe");
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let header = lines.remove(0);
        lines.sort();
        (header, lines)
    };
    let asked = printed(fluxpipe().args([
        "jobs",
        "-a",
        "-o",
        format,
        "--url",
        &format!("127.0.0.1:{port}"),
    ]));
    let local = printed(
        fluxpipe()
            .args([
                "replay",
                "--cluster",
                "g",
                "-f",
                "pending,running,inactive",
                "-o",
                format,
            ])
            .arg(&cut),
    );
    assert_eq!(
        asked.0,
        "       JOBID ST S NTASKS QUEUE    EXCEPTION-OCCURRED NODELIST"
    );
    assert_eq!(asked, local);
    assert_eq!(asked.1.len(), jobs.len());
    let refused = fluxpipe()
        .args([
            "jobs",
            "-o",
            "{id} {bogus}",
            "--url",
            &format!("127.0.0.1:{port}"),
        ])
        .output()
        .expect("fluxpipe");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("unknown format field: bogus"),
        "{refused:?}"
    );

    sigterm(&run);
    let status = run.wait().expect("wait");
    assert!(status.success(), "fluxpipe run: {status}");
}
