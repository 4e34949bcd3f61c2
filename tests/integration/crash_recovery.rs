//! Crash recovery: the real binary on a generated workload (a journal file
//! and a journal over TCP) is killed with SIGKILL at random moments (within
//! the first third of an uninterrupted run's time) over and over, restarted each time, and in the end its job summaries equal
//! those of a run that was never interrupted: every job, every field, and
//! each exactly once (the `file` sink cuts back to its checkpoint and skips
//! what it had written since).
//!
//! The TCP sender behaves as an at-least-once forwarder does: after each
//! restart it sends its whole journal again; what the checkpoint already
//! holds is recognized as repeats.

use crate::common;
use crate::common::{XorShift, fluxpipe, free_port, job_summaries, sigterm};

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A generated journal of `jobs` jobs on 32 nodes.
fn generate(seed: u64, jobs: usize, out: &Path) {
    let (seed, jobs) = (seed.to_string(), jobs.to_string());
    common::generate(&["--nodes", "32", "--seed", &seed, "--jobs", &jobs], out);
}

fn write_config(dir: &Path, data: &Path, out: &Path, port: u16) -> std::path::PathBuf {
    let config = dir.join(format!(
        "{}.toml",
        data.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = {data:?}
workers = 2
[checkpoint]
interval_secs = 0.2
[sources.file]
type = "file"
include = [{journal:?}]
poll_interval_ms = 20
cluster = "A"
[sources.tcp]
type = "socket"
address = "127.0.0.1:{port}"
cluster = "B"
[sinks.out]
type = "file"
path = {out:?}
inputs = ["jobs"]
"#,
            journal = dir.join("a.jsonl"),
        ),
    )
    .expect("config");
    config
}

fn start(config: &Path) -> Child {
    fluxpipe()
        .args(["run", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fluxpipe")
}

/// Send the whole journal once the listener is up; stops quietly when the
/// process dies under it.
fn send_journal(port: u16, lines: std::sync::Arc<Vec<u8>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut conn = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(_) => return,
            }
        };
        for chunk in lines.chunks(16 * 1024) {
            if conn.write_all(chunk).is_err() {
                return;
            }
        }
    })
}

/// Run until `want` jobs are summarized (or the time is up), then SIGTERM.
fn run_to_the_end(
    config: &Path,
    out: &Path,
    port: u16,
    journal: &std::sync::Arc<Vec<u8>>,
    want: usize,
) {
    let mut child = start(config);
    let sender = send_journal(port, journal.clone());
    let deadline = Instant::now() + Duration::from_secs(240);
    while job_summaries(out).len() < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    sender.join().expect("sender");
    // SIGTERM: a clean stop.
    sigterm(&child);
    let status = child.wait().expect("wait");
    assert!(status.success(), "fluxpipe exited with {status}");
}

#[test]
fn twenty_kills_lose_nothing() {
    let (jobs_a, jobs_b) = if cfg!(debug_assertions) {
        (3000, 1000)
    } else {
        (20_000, 5_000)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    generate(5, jobs_a, &dir.path().join("a.jsonl"));
    let b = dir.path().join("b.jsonl");
    generate(6, jobs_b, &b);
    let journal = std::sync::Arc::new(std::fs::read(&b).expect("journal b"));
    let want = jobs_a + jobs_b;

    // The reference: one run, never interrupted.
    let port = free_port();
    let clean_out = dir.path().join("clean.jsonl");
    let clean = write_config(dir.path(), &dir.path().join("clean-data"), &clean_out, port);
    let started = Instant::now();
    run_to_the_end(&clean, &clean_out, port, &journal, want);
    // Kills come within the first third of that run's time, wherever the
    // speed of this build and machine puts it: each run is cut short.
    let clean_ms = started.elapsed().as_millis() as u64;
    let window = (clean_ms / 3).max(300);
    let expected = job_summaries(&clean_out);
    assert_eq!(expected.len(), want, "the clean run summarizes every job");

    // The same, killed 20 times.
    let port = free_port();
    let out = dir.path().join("crashed.jsonl");
    let config = write_config(dir.path(), &dir.path().join("crash-data"), &out, port);
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut progress = Vec::new();
    for kill in 0..20 {
        let mut child = start(&config);
        let sender = send_journal(port, journal.clone());
        // The first kill comes early, so this run is surely cut short
        // however fast the machine is now (the clean run may have been
        // timed while it was busy); the others anywhere in the window.
        let wait = if kill == 0 {
            100
        } else {
            100 + rng.next() % window
        };
        std::thread::sleep(Duration::from_millis(wait));
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        sender.join().expect("sender");
        progress.push(job_summaries(&out).len());
    }
    run_to_the_end(&config, &out, port, &journal, want);
    let got = job_summaries(&out);
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !got.contains_key(*k))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "jobs lost, e.g. {missing:?} (summaries after each kill: {progress:?}; kills within {window} ms)"
    );
    for (key, summary) in &expected {
        assert_eq!(&got[key], summary, "job {key:?} differs from the clean run");
    }
    assert_eq!(
        got.len(),
        expected.len(),
        "no job that the clean run does not have"
    );
    let lines = common::read_records(&out)
        .into_iter()
        .filter(|r| r["kind"] == "job")
        .count();
    assert_eq!(
        lines,
        got.len(),
        "a job summary was written twice across the kills"
    );
    // The kills came mid-stream and left progress behind: the first cut
    // a run short, and some kill found checkpointed work done but not all.
    // (How many kills move the count depends on the machine's speed.)
    assert!(
        progress[0] < want && progress.iter().any(|&p| p > 0 && p < want),
        "summaries after each kill: {progress:?} (clean run {clean_ms} ms)"
    );
}
