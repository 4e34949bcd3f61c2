//! A backlog sent again after its jobs were dropped (issue 28): a journal
//! consumer started without `since` gets every inactive job flux-core
//! keeps once more. The real binary reads a generated journal over TCP,
//! drops each job shortly after it ends, and is then sent the whole
//! journal again, before and after a restart from its checkpoint (and once
//! after a SIGKILL). No job, transition or counter may come out twice.
//!
//! Also here: events dated years ahead or before 1970 are anomalies that
//! move no clock and fire nothing, also after a restart.

use crate::common;
use crate::common::{
    Reaper, fluxpipe, free_port, read_records, scrape as metrics, sigterm, total, wait_until,
};

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

const JOBS: usize = 1500;

fn write_config(dir: &Path, tcp: u16, api: u16, extra: &str) -> std::path::PathBuf {
    let config = dir.join("pipeline.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = {data:?}
workers = 2
[operators]
inactive_grace_secs = 0.3
{extra}
[checkpoint]
interval_secs = 0.5
[sources.tcp]
type = "socket"
address = "127.0.0.1:{tcp}"
cluster = "A"
[sinks.out]
type = "file"
path = {out:?}
inputs = ["jobs", "transitions", "anomalies", "alerts"]
[api]
address = "127.0.0.1:{api}"
"#,
            data = dir.join("state"),
            out = dir.join("out.jsonl"),
        ),
    )
    .expect("config");
    config
}

fn start(config: &Path) -> Reaper {
    Reaper(
        fluxpipe()
            .args(["run", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fluxpipe"),
    )
}

fn send(port: u16, bytes: &[u8]) {
    let mut conn = None;
    wait_until("the socket source", 20, || {
        conn = TcpStream::connect(("127.0.0.1", port)).ok();
        conn.is_some()
    });
    let mut conn = conn.expect("connected");
    conn.write_all(bytes).expect("send");
    conn.flush().expect("flush");
}

fn count(out: &Path, kind: &str) -> usize {
    read_records(out)
        .iter()
        .filter(|r| r["kind"] == kind)
        .count()
}

#[test]
fn a_backlog_sent_again_after_eviction_doubles_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("journal.jsonl");
    common::generate(&["--nodes", "16", "--jobs", &JOBS.to_string()], &journal);
    let lines = std::fs::read(&journal).expect("journal");
    let (tcp, api) = (free_port(), free_port());
    let config = write_config(dir.path(), tcp, api, "");
    let out = dir.path().join("out.jsonl");

    // What one reading of the journal gives.
    let mut run = start(&config);
    send(tcp, &lines);
    wait_until("every job summarized and dropped", 60, || {
        let m = metrics(api);
        total(&m, "fluxpipe_jobs_evicted_total") >= JOBS as f64
            && total(&m, "fluxpipe_jobs_tracked") == 0.0
    });
    let m = metrics(api);
    let inactive = total(&m, "flux_jobs_inactive_total");
    assert_eq!(inactive, JOBS as f64);
    assert_eq!(total(&m, "fluxpipe_finished_jobs_remembered"), JOBS as f64);
    let (jobs, transitions) = (count(&out, "job"), count(&out, "transition"));
    assert_eq!(jobs, JOBS);
    assert!(transitions > 5 * JOBS, "{transitions} transitions");

    // The whole journal again, to the same process.
    send(tcp, &lines);
    let job_lines = lines
        .split(|b| *b == b'\n')
        .filter(|l| l.windows(4).any(|w| w == b"\"id\""))
        .count() as f64
        // the journal's end-of-backlog line names no job's event
        - 1.0;
    wait_until("the backlog recognised", 60, || {
        total(&metrics(api), "fluxpipe_finished_job_repeats_total") >= job_lines
    });
    let m = metrics(api);
    assert_eq!(total(&m, "flux_jobs_inactive_total"), inactive);
    assert_eq!(total(&m, "fluxpipe_jobs_tracked"), 0.0);

    // Restarted from its checkpoint: still remembered.
    sigterm(&run.0);
    let _ = run.0.wait();
    let mut run = start(&config);
    wait_until("restored", 30, || {
        total(&metrics(api), "fluxpipe_finished_jobs_remembered") == JOBS as f64
    });
    send(tcp, &lines);
    wait_until("the backlog recognised after a restart", 60, || {
        total(&metrics(api), "fluxpipe_finished_job_repeats_total") >= job_lines
    });
    // Killed after its next checkpoint, and sent it all once more.
    std::thread::sleep(Duration::from_secs(1));
    let _ = run.0.kill();
    let _ = run.0.wait();
    let run = start(&config);
    send(tcp, &lines);
    wait_until("the backlog recognised after a SIGKILL", 60, || {
        total(&metrics(api), "fluxpipe_finished_job_repeats_total") >= job_lines
    });
    let m = metrics(api);
    assert_eq!(total(&m, "fluxpipe_jobs_tracked"), 0.0);
    drop(run);
    assert_eq!(count(&out, "job"), jobs, "no job summary twice");
    assert_eq!(
        count(&out, "transition"),
        transitions,
        "no transition twice"
    );
    assert_eq!(count(&out, "anomaly"), 0);
}

#[test]
fn far_future_and_far_past_times_are_anomalies_that_harm_no_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tcp, api) = (free_port(), free_port());
    // A pending-too-long rule on the event clock: one event from 2100
    // would fire it for every pending job.
    let config = write_config(
        dir.path(),
        tcp,
        api,
        "[alerts]\nclock = \"event\"\n[alerts.rules.slow]\nkind = \"job_state\"\nstate = \"SCHED\"\nfor = \"1h\"\n",
    );
    let out = dir.path().join("out.jsonl");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let job = |id: u64, t: f64| {
        format!(
            concat!(
                r#"{{"id":{id},"events":[{{"timestamp":{t},"name":"submit","context":{{"userid":1,"urgency":16,"flags":0}}}},"#,
                r#"{{"timestamp":{t1},"name":"validate"}},{{"timestamp":{t2},"name":"depend"}},"#,
                r#"{{"timestamp":{t3},"name":"priority","context":{{"priority":16}}}}]}}"#,
                "\n"
            ),
            id = id,
            t = t,
            t1 = t + 1.0,
            t2 = t + 2.0,
            t3 = t + 3.0,
        )
    };
    let mut feed = String::new();
    for id in 1..=20 {
        feed += &job(id, now - 60.0);
    }
    feed += &job(100, 4_102_444_800.0); // 2100-01-01
    feed += &job(101, 1e300);
    feed += &job(102, -5.0);
    let mut run = start(&config);
    send(tcp, feed.as_bytes());
    wait_until("the jobs pending", 30, || {
        total(&metrics(api), "flux_jobs") >= 20.0
    });
    wait_until("the anomalies", 30, || count(&out, "anomaly") >= 8);
    // Times before 1970 do not even decode: each event invalid.
    assert_eq!(total(&metrics(api), "fluxpipe_events_invalid_total"), 4.0);
    std::thread::sleep(Duration::from_secs(1));
    sigterm(&run.0);
    let _ = run.0.wait();
    // Restarted: the clock restored is the real one.
    let run = start(&config);
    send(tcp, job(21, now - 30.0).as_bytes());
    wait_until("the restart", 30, || {
        total(&metrics(api), "flux_jobs") >= 21.0
    });
    std::thread::sleep(Duration::from_secs(1));
    drop(run);
    let records = read_records(&out);
    let bad: Vec<_> = records
        .iter()
        .filter(|r| r["kind"] == "anomaly")
        .filter(|r| r["anomaly"] == "bad-timestamp")
        .map(|r| (r["id"].as_u64(), r["event"].as_str().map(String::from)))
        .collect();
    // Each refused job's every event is refused (the three after the
    // submit are dated after it): 4 anomalies per job.
    assert_eq!(bad.len(), 8, "{bad:?}");
    for id in [100, 101] {
        assert!(bad.iter().any(|(i, _)| *i == Some(id)), "job {id}");
    }
    assert_eq!(
        records.iter().filter(|r| r["kind"] == "alert").count(),
        0,
        "no alert storm"
    );
}

#[test]
fn an_ended_jobs_grace_runs_on_across_restarts() {
    // The time to live of an ended job runs from its end, not from the
    // last start: a pipeline restarted more often than its grace must
    // still drop what ended (seen live: every job held after 13 restarts).
    const GRACE: f64 = 6.0;
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("journal.jsonl");
    common::generate(&["--nodes", "4", "--jobs", "20"], &journal);
    let (tcp, api) = (free_port(), free_port());
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[operators]\ninactive_grace_secs = {GRACE}\n\
             [checkpoint]\ninterval_secs = 0.5\n\
             [sources.tcp]\ntype = \"socket\"\naddress = \"127.0.0.1:{tcp}\"\ncluster = \"A\"\n\
             [api]\naddress = \"127.0.0.1:{api}\"\n",
            dir.path().join("state"),
        ),
    )
    .expect("config");
    let mut run = start(&config);
    send(tcp, &std::fs::read(&journal).expect("journal"));
    wait_until("every job ended", 30, || {
        total(&metrics(api), "flux_jobs_inactive_total") == 20.0
    });
    let ended = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs_f64(GRACE / 2.0));
    assert!(total(&metrics(api), "fluxpipe_jobs_tracked") > 0.0);
    sigterm(&run.0);
    let _ = run.0.wait();
    let run = start(&config);
    let restarted = std::time::Instant::now();
    wait_until("restored", 30, || {
        total(&metrics(api), "fluxpipe_jobs_tracked") > 0.0
    });
    wait_until("every ended job dropped", 30, || {
        total(&metrics(api), "fluxpipe_jobs_tracked") == 0.0
    });
    let gone = std::time::Instant::now();
    // Ends are saved to the second: at most one early.
    assert!(
        gone.duration_since(ended).as_secs_f64() >= GRACE - 1.5,
        "dropped {:?} after the end",
        gone.duration_since(ended)
    );
    assert!(
        gone.duration_since(restarted).as_secs_f64() < GRACE - 1.0,
        "dropped {:?} after the restart: the grace started again",
        gone.duration_since(restarted)
    );
    drop(run);
}
