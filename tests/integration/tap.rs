//! `fluxpipe tap` and `fluxpipe top`, a look inside a running pipeline
//! through its API, with the real binary on loopback. The tap: every transition of a
//! journal sent to it, as a pipeline whose sink takes them writes them,
//! though no sink of this one takes that stream; a filter on one job; a stream name that does not
//! exist refused by the server.

use crate::common;
use crate::common::{Reaper, fluxpipe, wait_until};

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Write;
use std::process::Stdio;

/// `fluxpipe run` with a socket source `source` of cluster B, the sinks
/// given and an API, both on free loopback ports, answering: (the
/// process, API port, socket port).
fn running(dir: &std::path::Path, source: &str, sinks: &str) -> (Reaper, u16, u16) {
    let (api, ingest) = (common::free_port(), common::free_port());
    let config = dir.join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.{source}]\ntype = \"socket\"\naddress = \"127.0.0.1:{ingest}\"\ncluster = \"B\"\n\
             {sinks}[api]\naddress = \"127.0.0.1:{api}\"\n",
            dir.join("data")
        ),
    )
    .expect("config");
    let run = Reaper(
        fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .spawn()
            .expect("run"),
    );
    wait_until("the API", 20, || {
        common::http_get(api, "/healthz").is_some_and(|(s, _)| s == 200)
    });
    (run, api, ingest)
}

#[test]
fn tap_shows_every_transition_though_no_sink_takes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_run, api, ingest) = running(
        dir.path(),
        "s",
        "[sinks.out]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\n",
    );

    let journal =
        common::corpus().join("instances/B/journals/incarnation1.job-manager.events-journal.jsonl");
    // The reference: the same journal through a pipeline whose sink
    // takes the transitions.
    let reference = dir.path().join("ref.toml");
    std::fs::write(
        &reference,
        format!(
            "data_dir = {:?}\n[sources.s]\ntype = \"stdin\"\ncluster = \"B\"\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = [\"transitions\"]\n",
            dir.path().join("ref-data")
        ),
    )
    .expect("config");
    let out = fluxpipe()
        .args(["run", "--config"])
        .arg(&reference)
        .stdin(std::fs::File::open(&journal).expect("journal"))
        .output()
        .expect("reference run");
    assert!(out.status.success());
    let replayed: Vec<Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let want: BTreeSet<String> = replayed
        .iter()
        .map(|r| r["record_id"].as_str().expect("record_id").to_string())
        .collect();
    assert!(want.len() > 50, "{} transitions", want.len());
    let one_job = replayed[0]["id"].as_u64().expect("id");
    let of_one_job = replayed.iter().filter(|r| r["id"] == one_job).count();

    let url = format!("127.0.0.1:{api}");
    let tap = |extra: &[&str], n: usize| {
        fluxpipe()
            .args(["tap", "transitions", "--url", &url, "-n", &n.to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tap")
    };
    // Ended by -n, or by the pipeline's end if the test fails first.
    let all = tap(&["--cluster", "B"], want.len());
    let one = tap(&["--job", &one_job.to_string()], of_one_job);
    wait_until("two taps open", 20, || {
        common::total(&common::scrape(api), "fluxpipe_taps_open") == 2.0
    });
    let mut feed = std::net::TcpStream::connect(("127.0.0.1", ingest)).expect("connect");
    feed.write_all(&std::fs::read(&journal).expect("journal"))
        .expect("send");
    drop(feed);

    let lines = |child: std::process::Child| {
        let out = child.wait_with_output().expect("tap output");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
            .collect::<Vec<_>>()
    };
    let got = lines(all);
    let ids: BTreeSet<String> = got
        .iter()
        .map(|r| r["record_id"].as_str().expect("record_id").to_string())
        .collect();
    assert_eq!(got.len(), want.len(), "each transition once");
    assert_eq!(ids, want);
    let mine = lines(one);
    assert_eq!(mine.len(), of_one_job);
    assert!(mine.iter().all(|r| r["id"] == one_job), "{mine:?}");

    // What the server refuses, the command says.
    let out = fluxpipe()
        .args(["tap", "transitions", "--url", &url, "--job", "not-a-job"])
        .output()
        .expect("tap");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("400"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `fluxpipe top --once`: one frame of a running pipeline as text, its
/// figures those of what was sent; in a terminal, it draws and leaves on
/// `q`; a pipeline that does not answer is said, and fails `--once`.
#[test]
fn top_shows_sources_sinks_and_clusters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_run, api, ingest) = running(
        dir.path(),
        "feed",
        &format!(
            "[sinks.summaries]\ntype = \"file\"\npath = {:?}\ninputs = [\"jobs\"]\n",
            dir.path().join("jobs.jsonl")
        ),
    );
    let journal =
        common::corpus().join("instances/B/journals/incarnation1.job-manager.events-journal.jsonl");
    let text = std::fs::read(&journal).expect("journal");
    let lines = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    let mut feed = std::net::TcpStream::connect(("127.0.0.1", ingest)).expect("connect");
    feed.write_all(&text).expect("send");
    drop(feed);
    let summaries = dir.path().join("jobs.jsonl");
    let jobs = common::replay(&["--cluster", "B"], &[&journal])
        .iter()
        .filter(|r| r["kind"] == "job" && r["state"] == "INACTIVE")
        .count();
    wait_until("the summaries", 20, || {
        common::read_records(&summaries).len() == jobs
    });

    let url = format!("127.0.0.1:{api}");
    let out = fluxpipe()
        .args(["top", "--once", "--interval", "0.3", "--url", &url])
        .output()
        .expect("top");
    let frame = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{frame}");
    let row = |first: &str| -> Vec<String> {
        frame
            .lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no row {first} in\n{frame}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert!(frame.contains(&format!("at http://{url}")), "{frame}");
    // SOURCE EVENTS/S EVENTS ...: every line sent, counted.
    assert_eq!(row("feed")[2], lines.to_string(), "{frame}");
    // SINK RECORDS/S RECORDS BUFFERED: every summary written, none waiting.
    let sink = row("summaries");
    assert_eq!(
        (sink[2].as_str(), sink[3].as_str()),
        (jobs.to_string().as_str(), "0")
    );
    // CLUSTER NEW DEPEND PRIORITY SCHED RUN CLEANUP INACTIVE: the jobs held.
    let cluster = row("B");
    let held: u64 = cluster[1..8]
        .iter()
        .map(|n| n.parse::<u64>().expect("count"))
        .sum();
    assert!(held > 0, "{frame}");

    // In a terminal (script(1) gives it one): draws, and q leaves.
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_ok()
    {
        let mut tui = fluxpipe_in_a_terminal(&["top", "--interval", "0.3", "--url", &url]);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        tui.stdin.take().expect("stdin").write_all(b"q").expect("q");
        let out = tui.wait_with_output().expect("top in a terminal");
        let screen = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{screen}");
        assert!(
            screen.contains("Sources") && screen.contains("summaries"),
            "{screen}"
        );
    }

    // Nobody there.
    let gone = fluxpipe()
        .args(["top", "--once", "--interval", "0.1", "--url"])
        .arg(format!("127.0.0.1:{}", common::free_port()))
        .output()
        .expect("top");
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stdout).contains("no answer"));
}

/// `fluxpipe ARGS` under script(1), which gives it a terminal; its input
/// piped in, what it drew piped out.
fn fluxpipe_in_a_terminal(args: &[&str]) -> std::process::Child {
    let command = std::iter::once(env!("CARGO_BIN_EXE_fluxpipe"))
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    std::process::Command::new("script")
        // A pseudo-terminal made by script has no size until given one.
        .args([
            "-q",
            "-e",
            "-c",
            &format!("stty rows 40 cols 160; {command}"),
            "/dev/null",
        ])
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script")
}

/// A tap reader that stops reading never holds the pipeline: records go
/// on to the sinks (the tap's are dropped for it), and a stop ends the
/// process within the API's grace, though the reader still holds its
/// connection open.
#[test]
fn a_stalled_tap_reader_holds_nothing() {
    use std::io::Read;
    let dir = tempfile::tempdir().expect("tempdir");
    let summaries = dir.path().join("jobs.jsonl");
    let (mut run, api, ingest) = running(
        dir.path(),
        "feed",
        &format!("[sinks.summaries]\ntype = \"file\"\npath = {summaries:?}\ninputs = [\"jobs\"]\n"),
    );
    // A reader that asks and then never reads.
    let mut stalled = std::net::TcpStream::connect(("127.0.0.1", api)).expect("connect");
    stalled
        .write_all(b"GET /api/v1/tap?stream=events,transitions HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("ask");
    wait_until("the tap open", 20, || {
        common::total(&common::scrape(api), "fluxpipe_taps_open") == 1.0
    });
    let journal = dir.path().join("big.jsonl");
    common::generate(
        &["--jobs", "5000", "--nodes", "16", "--seed", "7"],
        &journal,
    );
    let ended = common::replay(&["--cluster", "B"], &[&journal])
        .iter()
        .filter(|r| r["kind"] == "job" && r["state"] == "INACTIVE")
        .count();
    let mut feed = std::net::TcpStream::connect(("127.0.0.1", ingest)).expect("connect");
    feed.write_all(&std::fs::read(&journal).expect("journal"))
        .expect("send");
    drop(feed);
    wait_until("every summary, the tap stalled", 120, || {
        common::read_records(&summaries).len() == ended
    });
    assert!(
        common::total(&common::scrape(api), "fluxpipe_tap_records_dropped_total") > 0.0,
        "the stalled tap lost records rather than holding them"
    );
    let stopping = std::time::Instant::now();
    common::sigterm(&run.0);
    let status = run.0.wait().expect("wait");
    assert!(status.success(), "{status}");
    assert!(
        stopping.elapsed() < std::time::Duration::from_secs(15),
        "the stop took {:?} with a stalled tap",
        stopping.elapsed()
    );
    // Still connected until the pipeline went: it read nothing.
    let mut one = [0u8; 1];
    let _ = stalled.read(&mut one);
}
