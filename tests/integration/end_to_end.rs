//! The whole product at once: a KVS dump tree that grows while fluxpipe
//! runs, the job-manager journal over TCP from several concurrent clients,
//! garbage in between. The job summaries it emits equal `fluxpipe replay`
//! on the same data, and SIGTERM ends it cleanly.

use crate::common::{corpus, fluxpipe, free_port, read_records, replay};

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn dothex_path(id: u64) -> String {
    let h = format!("{id:016x}");
    format!("job/{}/{}/{}/{}", &h[0..4], &h[4..8], &h[8..12], &h[12..16])
}

#[test]
fn growing_dump_tree_plus_tcp_journals_equal_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = dir.path().join("dump");
    let out = dir.path().join("out.jsonl");
    let port = free_port();
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = {data:?}
workers = 2
[sources.dump]
type = "file"
include = ["{dump}/**"]
poll_interval_ms = 20
cluster = "corpus"
[sources.journal]
type = "socket"
address = "127.0.0.1:{port}"
cluster = "corpus"
[sinks.out]
type = "file"
path = {out:?}
inputs = ["jobs", "dead_letter", "anomalies"]
"#,
            data = dir.path().join("data"),
            dump = dump.display(),
        ),
    )
    .expect("config");
    let mut child = fluxpipe()
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");

    // The dump tree grows one job folder at a time while fluxpipe runs.
    let jobs_dir = corpus().join("jobs");
    let mut ids: Vec<u64> = std::fs::read_dir(&jobs_dir)
        .expect("jobs")
        .map(|e| {
            e.expect("entry")
                .file_name()
                .to_string_lossy()
                .parse()
                .expect("id")
        })
        .collect();
    ids.sort();
    let grow = {
        let dump = dump.clone();
        let ids = ids.clone();
        std::thread::spawn(move || {
            for id in ids {
                let dst = dump.join(dothex_path(id));
                std::fs::create_dir_all(dst.join("guest/exec")).expect("mkdir");
                let src = jobs_dir.join(id.to_string());
                // In a live KVS, the jobspec is written at submit, first.
                std::fs::copy(src.join("jobspec.json"), dst.join("jobspec")).expect("copy");
                // R is written at alloc, before the job ends.
                if src.join("R.json").exists() {
                    std::fs::copy(src.join("R.json"), dst.join("R")).expect("copy");
                    std::thread::sleep(Duration::from_millis(60));
                }
                std::fs::copy(src.join("eventlog"), dst.join("eventlog")).expect("copy");
                if src.join("exec.eventlog").exists() {
                    std::fs::copy(src.join("exec.eventlog"), dst.join("guest/exec/eventlog"))
                        .expect("copy");
                }
                // not an eventlog, nor a document: must be skipped
                std::fs::write(dst.join("notes"), "not read\n").expect("write");
                std::thread::sleep(Duration::from_millis(15));
            }
        })
    };

    // Instance B's journals over TCP: three clients at once, each job's
    // events on one connection (in order), garbage in between.
    let journal_lines: Vec<String> = [
        "incarnation1.job-manager.events-journal.jsonl",
        "incarnation2.job-manager.events-journal.jsonl",
    ]
    .iter()
    .flat_map(|f| {
        std::fs::read_to_string(corpus().join("instances/B/journals").join(f))
            .expect("journal")
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    })
    .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the socket source never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let clients: Vec<_> = (0..3u64)
        .map(|c| {
            let lines: Vec<String> = journal_lines
                .iter()
                .filter(|l| {
                    let v: Value = serde_json::from_str(l).expect("json");
                    v["id"].as_i64().unwrap_or(-1).rem_euclid(3) as u64 == c
                })
                .cloned()
                .collect();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                for (i, l) in lines.iter().enumerate() {
                    writeln!(s, "{l}").expect("send");
                    if i % 10 == 0 {
                        writeln!(s, "this is not json {c}").expect("send");
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    grow.join().expect("grow");

    // The same data through replay.
    let inputs = [corpus().join("jobs"), corpus().join("instances/B/journals")];
    let want: BTreeMap<u64, Value> = replay(&["--cluster", "corpus"], &inputs)
        .into_iter()
        .filter(|o| o["kind"] == "job" && o["state"] == "INACTIVE")
        .map(|o| (o["id"].as_u64().expect("id"), o))
        .collect();
    assert!(want.len() >= 52);

    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        let got: BTreeMap<u64, Value> = read_records(&out)
            .into_iter()
            .filter(|r| r["kind"] == "job")
            .map(|r| (r["id"].as_u64().expect("id"), r))
            .collect();
        if got.len() >= want.len() || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    let status = child.wait().expect("wait");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).ok();
    assert!(status.success(), "{stderr}");

    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the same jobs ended"
    );
    for (id, job) in &want {
        assert_eq!(&got[id], job, "job {id}");
    }
    let all = read_records(&out);
    let dead = all.iter().filter(|r| r["kind"] == "dead_letter").count();
    let garbage: usize = (0..3u64)
        .map(|c| {
            let n = journal_lines
                .iter()
                .filter(|l| {
                    let v: Value = serde_json::from_str(l).expect("json");
                    v["id"].as_i64().unwrap_or(-1).rem_euclid(3) as u64 == c
                })
                .count();
            n.div_ceil(10)
        })
        .sum();
    assert_eq!(dead, garbage, "every garbage line is a dead letter");
    let anomalies: Vec<_> = all.iter().filter(|r| r["kind"] == "anomaly").collect();
    assert!(anomalies.is_empty(), "{anomalies:#?}");
}
