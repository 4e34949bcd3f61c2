//! `fluxpipe tap`: the records of a running pipeline's streams, live, from
//! its API, through the real binary on loopback: every transition of a
//! journal sent to it, as a pipeline whose sink takes them writes them,
//! though no sink of this one takes that stream; a filter on one job; a stream name that does not
//! exist refused by the server.

mod common;
use common::{Reaper, fluxpipe, wait_until};

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Write;
use std::process::Stdio;

#[test]
fn tap_shows_every_transition_though_no_sink_takes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (api, ingest) = (common::free_port(), common::free_port());
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.s]\ntype = \"socket\"\naddress = \"127.0.0.1:{ingest}\"\ncluster = \"B\"\n\
             [sinks.out]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\n\
             [api]\naddress = \"127.0.0.1:{api}\"\n",
            dir.path().join("data")
        ),
    )
    .expect("config");
    let _run = Reaper(
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
