//! `fluxpipe run` as a process: real stdin, stdout, files and signals.

use crate::common;
use crate::common::{corpus, fluxpipe};

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("pipeline.toml");
    std::fs::write(&p, text).expect("write config");
    p
}

/// The job summaries `fluxpipe replay` gives for the same input (cluster B).
fn replay_jobs(paths: &[&Path]) -> BTreeMap<u64, Value> {
    common::replay(&["--cluster", "B"], paths)
        .into_iter()
        .filter(|o| o["kind"] == "job")
        .map(|o| (o["id"].as_u64().expect("id"), o))
        .collect()
}

fn journals() -> Vec<PathBuf> {
    let b = corpus().join("instances/B/journals");
    vec![
        b.join("incarnation1.job-manager.events-journal.jsonl"),
        b.join("incarnation2.job-manager.events-journal.jsonl"),
    ]
}

#[test]
fn stdin_journals_give_the_same_summaries_as_replay_and_garbage_goes_to_dead_letter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\ncluster = \"B\"\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = [\"jobs\", \"dead_letter\", \"anomalies\"]\n",
            dir.path().join("state")
        ),
    );
    let mut input = Vec::new();
    for (i, p) in journals().iter().enumerate() {
        for line in std::fs::read_to_string(p).expect("journal").lines() {
            input.extend_from_slice(line.as_bytes());
            input.push(b'\n');
            if i == 0 && line.len() % 7 == 0 {
                input.extend_from_slice(b"{\"garbage\": tru\n\xff\xfe not utf-8\n");
            }
        }
    }
    let mut child = fluxpipe()
        .arg("run")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("wait");
    writer.join().expect("writer").expect("write stdin");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = json_lines(&String::from_utf8(out.stdout).expect("utf-8"));

    let js = journals();
    let paths: Vec<&Path> = js.iter().map(|p| p.as_path()).collect();
    let want = replay_jobs(&paths);
    let got: BTreeMap<u64, &Value> = records
        .iter()
        .filter(|r| r["kind"] == "job")
        .map(|r| (r["id"].as_u64().expect("id"), r))
        .collect();
    let inactive: Vec<_> = want
        .iter()
        .filter(|(_, j)| j["state"] == "INACTIVE")
        .collect();
    assert!(inactive.len() > 10);
    for (id, job) in inactive {
        let g = got
            .get(id)
            .unwrap_or_else(|| panic!("no summary for job {id}"));
        for (k, v) in job.as_object().expect("object") {
            assert_eq!(&g[k], v, "job {id} field {k}");
        }
    }
    let dead: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "dead_letter")
        .collect();
    assert!(!dead.is_empty());
    assert_eq!(dead.len() % 2, 0, "two garbage lines each time");
    assert!(
        dead.iter()
            .all(|d| d["location"].as_str().unwrap_or("").starts_with("stdin:"))
    );
    assert!(
        records.iter().all(|r| r["kind"] != "anomaly"),
        "real journals break no rule"
    );
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Many complete jobs as journal lines (ids from `base`).
fn job_lines(base: u64, n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let id = base + i;
        let t = 1_000_000.0 + i as f64;
        for (k, (name, ctx)) in [
            (
                "submit",
                r#"{"userid":1,"urgency":16,"flags":0,"version":1}"#,
            ),
            ("validate", "{}"),
            ("depend", "{}"),
            ("priority", r#"{"priority":16}"#),
            ("alloc", "{}"),
            ("start", "{}"),
            ("finish", r#"{"status":0}"#),
            ("release", r#"{"ranks":"all","final":true}"#),
            ("free", "{}"),
            ("clean", "{}"),
        ]
        .iter()
        .enumerate()
        {
            let ts = t + k as f64 * 0.01;
            out.extend_from_slice(
                format!(
                    "{{\"id\":{id},\"events\":[{{\"timestamp\":{ts},\"name\":\"{name}\",\"context\":{ctx}}}]}}\n"
                )
                .as_bytes(),
            );
        }
    }
    out
}

fn spawn_run(config: &Path) -> Child {
    fluxpipe()
        .arg("run")
        .arg("--config")
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

#[test]
fn a_sink_that_stops_reading_slows_the_source_and_memory_stays_flat() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            "data_dir = {:?}\nworkers = 2\n[sources.in]\ntype = \"stdin\"\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = [\"transitions\"]\nbuffer = 64\n",
            dir.path().join("state")
        ),
    );
    let mut child = spawn_run(&config);
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    let input = job_lines(1, 20_000); // ~200k lines, ~20 MB
    let total = input.len();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = written.clone();
    let writer = std::thread::spawn(move || {
        for chunk in input.chunks(4096) {
            if stdin.write_all(chunk).is_err() {
                return;
            }
            w.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
        }
    });
    // Nobody reads stdout: after the pipe and the bounded queues fill, the
    // pipeline stops reading stdin and the writer blocks.
    std::thread::sleep(Duration::from_secs(2));
    let stalled_at = written.load(std::sync::atomic::Ordering::Relaxed);
    let rss1 = rss_kib(pid);
    std::thread::sleep(Duration::from_secs(1));
    let still = written.load(std::sync::atomic::Ordering::Relaxed);
    let rss2 = rss_kib(pid);
    assert!(stalled_at < total, "the writer was never held back");
    assert_eq!(
        stalled_at, still,
        "stdin kept being read while stdout was full"
    );
    assert!(rss2 < 100 * 1024, "resident memory {rss2} KiB");
    assert!(
        rss2 <= rss1 + 4096,
        "memory grew while stalled: {rss1} → {rss2} KiB"
    );
    // Reading stdout releases the pipeline; everything arrives.
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    writer.join().expect("writer");
    let status = child.wait().expect("wait");
    let text = reader.join().expect("reader").expect("read");
    assert!(status.success());
    assert_eq!(text.lines().count(), 20_000 * 6, "6 transitions per job");
}

#[test]
fn drop_newest_counts_what_it_drops_instead_of_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = [\"transitions\"]\nbuffer = 16\nwhen_full = \"drop_newest\"\n",
            dir.path().join("state")
        ),
    );
    let mut child = spawn_run(&config);
    let mut stdin = child.stdin.take().expect("stdin");
    let input = job_lines(1, 5_000);
    let start = Instant::now();
    // Nobody reads stdout, yet all input is taken: the sink drops instead.
    stdin.write_all(&input).expect("write");
    drop(stdin);
    let took = start.elapsed();
    let mut stdout = child.stdout.take().expect("stdout");
    let mut text = String::new();
    stdout.read_to_string(&mut text).expect("read");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let delivered = text.lines().count() as u64;
    let dropped: u64 = stderr
        .split("dropped=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drop count in: {stderr}"));
    assert_eq!(delivered + dropped, 5_000 * 6, "{stderr}");
    assert!(dropped > 0);
    assert!(took < Duration::from_secs(30));
}

#[test]
fn sigterm_mid_stream_flushes_and_exits_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_path = dir.path().join("out/records.jsonl");
    let config = write_config(
        dir.path(),
        &format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\n\
             [sinks.out]\ntype = \"file\"\npath = {:?}\ninputs = [\"jobs\"]\n",
            dir.path().join("state"),
            out_path
        ),
    );
    let mut child = spawn_run(&config);
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&job_lines(1, 300)).expect("write");
    stdin.flush().expect("flush");
    // Wait until the pipeline has taken it all in, stdin still open.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&out_path).map_or(0, |s| s.lines().count()) < 300
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    drop(stdin);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = std::fs::read_to_string(&out_path).expect("sink file");
    assert_eq!(lines.lines().count(), 300);
    assert!(
        json_lines(&lines)
            .iter()
            .all(|r| r["kind"] == "job" && r["result"] == "COMPLETED")
    );
}

#[test]
fn file_sink_reopens_on_sighup_for_logrotate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_path = dir.path().join("records.jsonl");
    let rotated = dir.path().join("records.jsonl.1");
    let config = write_config(
        dir.path(),
        &format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\n\
             [sinks.out]\ntype = \"file\"\npath = {:?}\ninputs = [\"jobs\"]\n",
            dir.path().join("state"),
            out_path
        ),
    );
    let mut child = spawn_run(&config);
    let mut stdin = child.stdin.take().expect("stdin");
    let count = |p: &Path| std::fs::read_to_string(p).map_or(0, |s| s.lines().count());
    let wait_for = |p: &Path, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while count(p) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        count(p)
    };
    stdin.write_all(&job_lines(1, 10)).expect("write");
    stdin.flush().expect("flush");
    assert_eq!(wait_for(&out_path, 10), 10);
    // logrotate: move the file away, then SIGHUP.
    std::fs::rename(&out_path, &rotated).expect("rename");
    let kill = |sig: &str| {
        Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .expect("kill")
    };
    assert!(kill("-HUP").success());
    // The reopen happens when the signal is handled; give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all(&job_lines(100, 5)).expect("write");
    stdin.flush().expect("flush");
    assert_eq!(wait_for(&out_path, 5), 5, "new records go to the new file");
    assert_eq!(count(&rotated), 10, "the rotated file keeps the old ones");
    drop(stdin);
    assert!(child.wait().expect("wait").success());
}

/// A reopen on SIGHUP that fails (its folder is now a file, so nothing can
/// be made there) does not end the sink: it says so, writes on to the file
/// it has open, and tries again until it can.
#[test]
fn file_sink_survives_a_failed_reopen_on_sighup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("out");
    let out_path = folder.join("records.jsonl");
    let moved = dir.path().join("out.old");
    let config = write_config(
        dir.path(),
        &format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\n\
             [sinks.out]\ntype = \"file\"\npath = {:?}\ninputs = [\"jobs\"]\n",
            dir.path().join("state"),
            out_path
        ),
    );
    let mut child = spawn_run(&config);
    let mut stdin = child.stdin.take().expect("stdin");
    let count = |p: &Path| std::fs::read_to_string(p).map_or(0, |s| s.lines().count());
    let wait_for = |p: &Path, n: usize, secs: u64| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while count(p) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        count(p)
    };
    stdin.write_all(&job_lines(1, 10)).expect("write");
    stdin.flush().expect("flush");
    assert_eq!(wait_for(&out_path, 10, 10), 10);
    // The folder moved away and a file in its place: no reopen can work.
    std::fs::rename(&folder, &moved).expect("rename");
    std::fs::write(&folder, b"in the way").expect("block");
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all(&job_lines(100, 5)).expect("write");
    stdin.flush().expect("flush");
    let old = moved.join("records.jsonl");
    assert_eq!(
        wait_for(&old, 15, 10),
        15,
        "written on to the file already open"
    );
    // Out of the way: the next try (within 5 s) opens the new file.
    std::fs::remove_file(&folder).expect("unblock");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !out_path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    stdin.write_all(&job_lines(200, 3)).expect("write");
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("cannot reopen on SIGHUP"), "{err}");
    assert!(err.contains("reopened on SIGHUP"), "{err}");
    assert_eq!(count(&out_path), 3, "new records in the new file");
    assert_eq!(count(&old), 15, "nothing more in the old one");
}

/// SIGHUP (logrotate, `systemctl reload`) does not end a pipeline that has
/// no file sink: the signal's default action would.
#[test]
fn sighup_without_a_file_sink_does_not_end_the_pipeline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = [\"jobs\"]\n",
            dir.path().join("state"),
        ),
    );
    let mut child = spawn_run(&config);
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&job_lines(1, 3)).expect("write");
    stdin.flush().expect("flush");
    // Running (its signal handlers set) before the signal comes.
    std::thread::sleep(Duration::from_millis(500));
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    std::thread::sleep(Duration::from_millis(300));
    stdin
        .write_all(&job_lines(100, 2))
        .expect("write after SIGHUP");
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 5);
}

/// `replay --emit` and `run` drive one processor and turn its effects into
/// records in one place: over the same input, with one worker and alerts
/// on event time, they print the same lines in the same order (only the
/// `source` of `events` records differs: the source's name in `run`).
#[test]
fn replay_emit_prints_what_run_sends_line_for_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("w.jsonl");
    common::generate(
        &["--seed", "11", "--jobs", "1500", "--nodes", "32"],
        &journal,
    );
    // After it (the generated journal starts at 1795000000): a job that
    // breaks a rule (an anomaly), and a resource event two hours on, by
    // which nodes left torpid and offline fire their alerts.
    let t = 1_795_100_000.0;
    let sub = |ts: f64| serde_json::json!({"timestamp": ts, "name": "submit", "context": {"userid": 1000, "urgency": 16, "flags": 0, "version": 1}});
    let ev = |ts: f64, name: &str| serde_json::json!({"timestamp": ts, "name": name});
    let more = [
        serde_json::json!({"id": 998, "events": [sub(t), ev(t + 1.0, "validate"), ev(t + 2.0, "start")]}),
        serde_json::json!({"events": [{"timestamp": t + 7200.0, "name": "online", "context": {"idset": "0"}}]}),
    ];
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .expect("journal");
    for line in more {
        writeln!(file, "{line}").expect("append");
    }
    let streams = [
        "events",
        "transitions",
        "jobs",
        "job_updates",
        "resources",
        "alerts",
        "anomalies",
    ];
    let config = write_config(
        dir.path(),
        &format!(
            "workers = 1\ndata_dir = {:?}\n[alerts]\nclock = \"event\"\n\
             [sources.in]\ntype = \"stdin\"\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = {streams:?}\n",
            dir.path().join("state")
        ),
    );
    let run = common::run_ok(
        fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdin(std::fs::File::open(&journal).expect("journal")),
    );
    let replay = common::run_ok(
        fluxpipe()
            .args(["replay", "--emit", &streams.join(",")])
            .arg(&journal),
    );
    let run = String::from_utf8(run.stdout)
        .expect("utf-8")
        .replace(r#""source":"in""#, r#""source":"replay""#);
    let replay = String::from_utf8(replay.stdout).expect("utf-8");
    let kinds: std::collections::BTreeSet<String> = json_lines(&replay)
        .iter()
        .map(|r| r["kind"].as_str().unwrap_or("?").to_string())
        .collect();
    // Every stream has records here, so none is compared empty.
    for kind in ["event", "transition", "job", "rank", "alert", "anomaly"] {
        assert!(kinds.contains(kind), "no {kind} record: {kinds:?}");
    }
    let (run, replay): (Vec<&str>, Vec<&str>) = (run.lines().collect(), replay.lines().collect());
    assert_eq!(run.len(), replay.len());
    for (i, (r, p)) in run.iter().zip(&replay).enumerate() {
        assert_eq!(r, p, "line {i}");
    }
}
