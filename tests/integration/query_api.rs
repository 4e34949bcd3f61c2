//! The query API of `fluxpipe run` (`/api/v1/...`) against a real run: a
//! journal cut off mid-run (jobs in every state, drained and offline
//! ranks), read by two shards; every answer is checked against
//! `fluxpipe replay` of the same lines.

use crate::common::{Reaper, fluxpipe, free_port, generate, http_get, replay, sigterm, wait_until};
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

/// Ids of the jobs an API page lists.
fn listed_ids(port: u16, path: &str) -> Vec<u64> {
    let (status, page) = get_json(port, path);
    assert_eq!(status, 200, "{path}: {page}");
    let mut ids: Vec<u64> = page["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_u64())
        .collect();
    ids.sort_unstable();
    ids
}

/// Ranks an API node list names.
fn listed_ranks(port: u16, path: &str) -> Vec<u64> {
    let (status, page) = get_json(port, path);
    assert_eq!(status, 200, "{path}: {page}");
    page["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["rank"].as_u64())
        .collect()
}

#[test]
fn queues_follow_the_instance_table_and_properties() {
    // An instance whose `[queues]` table (sent by the forwarder as
    // `queue-config`) has a virtual queue `fast` of `batch`, and whose R
    // puts nodes in queues by instance-local (+NAME) properties. Two
    // shards: the table is kept by one, the jobs spread over both.
    let dir = tempfile::tempdir().expect("tempdir");
    let resource = |t: f64, name: &str, ctx: &str, extra: &str| {
        format!(
            "{{\"events\":[{{\"timestamp\":{t},\"name\":\"{name}\",\"context\":{ctx}}}]{extra}}}\n"
        )
    };
    let mut journal = resource(
        1.0,
        "restart",
        r#"{"ranks":"0-3","online":"0-3","nodelist":"node[0-3]"}"#,
        "",
    );
    journal += &resource(
        1.1,
        "resource-define",
        r#"{"method":"configuration"}"#,
        r#","R":{"version":1,"execution":{"R_lite":[{"rank":"0-3","children":{"core":"0-1"}}],"nodelist":["node[0-3]"],"properties":{"+debug":"0","+batch":"1-3"}}}"#,
    );
    journal += &resource(1.2, "drain", r#"{"idset":"3","reason":"bad dimm"}"#, "");
    journal += &resource(
        1.3,
        "queue-config",
        r#"{"queues":{"batch":{"requires":["+batch"]},"debug":{"requires":["+debug"]},"fast":{"parent":"batch"}}}"#,
        "",
    );
    let queues = [
        (1, Some("batch")),
        (2, Some("fast")),
        (3, Some("debug")),
        (4, Some("fast")),
        (5, None),
        (6, Some("batch")),
    ];
    for (id, queue) in queues {
        let system = queue.map_or(String::new(), |q| format!(",\"queue\":\"{q}\""));
        journal += &format!(
            "{{\"id\":{id},\"events\":[{{\"timestamp\":{t},\"name\":\"submit\",\"context\":{{\"userid\":7,\"urgency\":16,\"flags\":0,\"version\":1}}}}],\
             \"jobspec\":{{\"version\":1,\"resources\":[{{\"type\":\"slot\",\"count\":1,\"with\":[{{\"type\":\"core\",\"count\":1}}]}}],\
             \"tasks\":[{{\"command\":[\"true\"]}}],\"attributes\":{{\"system\":{{\"duration\":0{system}}}}}}}}}\n",
            t = 2.0 + id as f64,
        );
        journal += &format!(
            "{{\"id\":{id},\"events\":[{{\"timestamp\":{t},\"name\":\"validate\"}}]}}\n",
            t = 2.5 + id as f64,
        );
    }
    let file = dir.path().join("j.jsonl");
    std::fs::write(&file, journal).expect("journal");
    let port = free_port();
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nworkers = 2\n\
             [sources.journal]\ntype = \"file\"\ninclude = [{file:?}]\ncluster = \"q\"\n\
             [api]\naddress = \"127.0.0.1:{port}\"\n",
            dir.path().join("state"),
        ),
    )
    .expect("config");
    // Killed if an assertion fails first: no pipeline left running.
    let mut run = Reaper(
        fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .spawn()
            .expect("start fluxpipe run"),
    );
    wait_until("every job and the table held", 30, || {
        http_get(port, "/api/v1/queues").is_some_and(|(s, body)| s == 200 && body.contains("fast"))
            && http_get(port, "/api/v1/jobs")
                .is_some_and(|(s, body)| s == 200 && body.matches("\"userid\"").count() == 6)
    });

    // Jobs as job-list takes them: a parent takes its virtual queues.
    assert_eq!(listed_ids(port, "/api/v1/jobs?queue=batch"), [1, 2, 4, 6]);
    assert_eq!(listed_ids(port, "/api/v1/jobs?queue=fast"), [2, 4]);
    assert_eq!(listed_ids(port, "/api/v1/jobs?queue=debug,fast"), [2, 3, 4]);
    assert_eq!(listed_ids(port, "/api/v1/jobs?queue=nosuch"), [0u64; 0]);
    assert_eq!(
        listed_ids(port, "/api/v1/jobs?queue=batch&cluster=other"),
        [0u64; 0]
    );

    // Nodes by queue: the instance R's +NAME properties; a virtual queue's
    // nodes are its parent's; a queue not configured has none.
    assert_eq!(listed_ranks(port, "/api/v1/nodes?queue=fast"), [1, 2, 3]);
    assert_eq!(listed_ranks(port, "/api/v1/nodes?queue=debug"), [0]);
    assert_eq!(listed_ranks(port, "/api/v1/nodes?queue=nosuch"), [0u64; 0]);
    let (_, table) = get_json(port, "/api/v1/queues");
    let fast = table["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["queue"] == "fast")
        .expect("fast")
        .clone();
    assert_eq!(fast["parent"], "batch");
    assert_eq!(fast["ranks"], "1-3");
    assert_eq!(fast["nnodes"], 3);

    // The per-queue node series: queues that are not virtual.
    let (_, metrics) = http_get(port, "/metrics").expect("scrape");
    for (queue, state, n) in [
        ("batch", "all", 3),
        ("batch", "online", 3),
        ("batch", "drained", 1),
        ("debug", "all", 1),
        ("debug", "drained", 0),
    ] {
        let series = format!(
            "flux_queue_nodes{{flux_cluster=\"q\",queue=\"{queue}\",state=\"{state}\"}} {n}\n"
        );
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
    assert!(
        !metrics.contains("flux_queue_nodes{flux_cluster=\"q\",queue=\"fast\""),
        "{metrics}"
    );

    // The commands: `fluxpipe jobs -q` and `fluxpipe resource status -q`.
    let url = format!("127.0.0.1:{port}");
    let out = fluxpipe()
        .args([
            "jobs",
            "-a",
            "-n",
            "-q",
            "batch",
            "--url",
            &url,
            "-o",
            "{id.dec} {queue}",
        ])
        .output()
        .expect("fluxpipe jobs");
    assert!(out.status.success(), "{out:?}");
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    assert_eq!(lines, ["1 batch", "2 fast", "4 fast", "6 batch"]);
    let out = fluxpipe()
        .args([
            "resource", "status", "-q", "fast", "--url", &url, "-n", "-s", "all",
        ])
        .output()
        .expect("fluxpipe resource status");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("node0"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["drained", "✔", "1", "node3"])
            && text.lines().any(|l| l.ends_with(" 2 node[1-2]")),
        "{text}"
    );

    sigterm(&run.0);
    let status = run.0.wait().expect("wait");
    assert!(status.success(), "fluxpipe run: {status}");
}
