//! The file source in a whole pipeline: a KVS dump tree that grows while
//! fluxpipe runs, read into a `file` sink, stopped and started again.

use fluxpipe::pipeline::{config, topology};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn pipeline(dir: &Path) -> String {
    format!(
        r#"
data_dir = "{d}/data"
workers = 2

[sources.dump]
type = "file"
include = ["{d}/dump/**"]
poll_interval_ms = 20
cluster = "picl"

[sinks.out]
type = "file"
path = "{d}/out.jsonl"
inputs = ["events", "dead_letter"]
"#,
        d = dir.display()
    )
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
}

fn output(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("out.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Wait until the sink holds `n` records.
async fn wait_for(dir: &Path, n: usize) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let out = output(dir);
        if out.len() >= n || start.elapsed() > Duration::from_secs(10) {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn start(
    dir: &Path,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let config = config::parse(&pipeline(dir)).expect("config");
    let token = CancellationToken::new();
    let task = tokio::spawn(topology::run(config, token.clone()));
    (token, task)
}

async fn stop(token: CancellationToken, task: tokio::task::JoinHandle<anyhow::Result<()>>) {
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("pipeline stops")
        .unwrap()
        .expect("pipeline ends cleanly");
}

const SUBMIT: &str = r#"{"timestamp":1700000000.1,"name":"submit","context":{"userid":1000,"urgency":16,"flags":0,"version":1}}"#;

fn event(t: f64, name: &str) -> String {
    format!("{{\"timestamp\":{t},\"name\":\"{name}\"}}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_dump_tree_through_the_pipeline_with_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let job_a = d.join("dump/job/0000/000a/0000/0000");
    write(&job_a.join("eventlog"), &format!("{SUBMIT}\n"));
    // A document read whole, as R, and passed on (what fluxpipe reads of it).
    write(
        &job_a.join("jobspec.json"),
        r#"{"version":1,"resources":[{"type":"slot","count":1,"with":[{"type":"core","count":1}]}],"tasks":[{"command":["/bin/true","-x"]}],"attributes":{"system":{"duration":0,"cwd":"/home/u"}}}"#,
    );
    write(&job_a.join("notes.txt"), "not read\n");

    let (token, task) = start(d);
    let mut out = wait_for(d, 2).await;
    assert_eq!(out.len(), 2, "{out:?}");
    out.sort_by_key(|r| r["kind"].as_str().map(String::from));
    assert_eq!(out[0]["kind"], "event");
    assert_eq!(out[0]["cluster"], "picl");
    assert_eq!(out[0]["id"], 0x000a_0000_0000u64);
    assert_eq!(out[0]["event"]["name"], "submit");
    assert_eq!(out[1]["kind"], "jobspec");
    assert_eq!(out[1]["id"], 0x000a_0000_0000u64);
    assert_eq!(
        out[1]["jobspec"]["tasks"][0]["command"],
        serde_json::json!(["/bin/true"])
    );
    assert!(
        out[1]["jobspec"]["attributes"]["system"]
            .get("cwd")
            .is_none()
    );

    // A second job appears while running; the first one goes on.
    let job_b = d.join("dump/job/0000/000b/4100/0000");
    write(
        &job_b.join("eventlog"),
        &format!("{}\n", SUBMIT.replace("1700000000.1", "1700000001.1")),
    );
    write(&job_a.join("eventlog"), &event(1700000000.2, "validate"));
    write(&job_a.join("eventlog"), "not json\n");
    let out = wait_for(d, 5).await;
    assert_eq!(out.len(), 5, "{out:?}");
    let ids: Vec<&Value> = out.iter().filter_map(|r| r.get("id")).collect();
    assert!(ids.contains(&&Value::from(0x000b_4100_0000u64)), "{out:?}");
    let dead: Vec<&Value> = out.iter().filter(|r| r["kind"] == "dead_letter").collect();
    assert_eq!(dead.len(), 1, "{out:?}");
    assert_eq!(
        dead[0]["location"],
        format!("{}:3", job_a.join("eventlog").display())
    );
    stop(token, task).await;
    assert!(d.join("data/checkpoint.bin").exists());

    // While stopped, both jobs go on; after the restart only that is new.
    write(&job_a.join("eventlog"), &event(1700000000.3, "depend"));
    write(&job_b.join("eventlog"), &event(1700000001.2, "validate"));
    let (token, task) = start(d);
    let out = wait_for(d, 7).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop(token, task).await;
    let out2 = output(d);
    assert_eq!(out.len(), 7, "{out:?}");
    assert_eq!(out2.len(), 7, "nothing read twice: {out2:?}");
    let names: Vec<&str> = out2[5..]
        .iter()
        .map(|r| r["event"]["name"].as_str().unwrap())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["depend", "validate"]);
}
