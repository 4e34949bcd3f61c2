//! What one feed can make fluxpipe hold is capped (issue 28): made-up
//! cluster names beyond `operators.max_clusters` are refused and counted,
//! drains naming a hundred thousand ranks of clusters nobody knows stop at
//! `operators.max_ranks`, the scrape stays small (and smaller still with
//! `node_series = false`), memory stays flat, and a good client's job
//! still goes through at once.

use crate::common;
use crate::common::{Reaper, fluxpipe, free_port, http_get, read_records, wait_until};

use std::io::Write;
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Instant;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn metric_sum(text: &str, name: &str) -> f64 {
    common::total(&common::samples(text), name)
}

fn drain(cluster: &str, t: f64) -> String {
    format!(
        "{{\"cluster\":\"{cluster}\",\"stream\":\"resource\",\"event\":{{\"timestamp\":{t},\"name\":\"drain\",\"context\":{{\"idset\":\"0-131071\",\"reason\":\"x\",\"overwrite\":0}}}}}}\n"
    )
}

fn job(cluster: &str, id: u64, t: f64) -> String {
    let ev = |dt: f64, name: &str, ctx: &str| {
        format!(
            "{{\"cluster\":\"{cluster}\",\"stream\":\"job\",\"id\":{id},\"event\":{{\"timestamp\":{},\"name\":\"{name}\"{ctx}}}}}\n",
            t + dt
        )
    };
    [
        ev(
            0.0,
            "submit",
            ",\"context\":{\"userid\":1,\"urgency\":16,\"flags\":0}",
        ),
        ev(1.0, "validate", ""),
        ev(2.0, "depend", ""),
        ev(3.0, "priority", ",\"context\":{\"priority\":16}"),
        ev(
            4.0,
            "exception",
            ",\"context\":{\"type\":\"cancel\",\"severity\":0,\"userid\":1,\"note\":\"\"}",
        ),
        ev(5.0, "clean", ""),
    ]
    .concat()
}

#[test]
fn made_up_clusters_and_huge_drains_are_capped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tcp, api) = (free_port(), free_port());
    let out = dir.path().join("out.jsonl");
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = {data:?}
[operators]
max_clusters = 50
max_ranks = 20000
[sources.tcp]
type = "socket"
address = "127.0.0.1:{tcp}"
cluster = "good"
[sinks.out]
type = "file"
path = {out:?}
inputs = ["jobs"]
[api]
address = "127.0.0.1:{api}"
"#,
            data = dir.path().join("state"),
        ),
    )
    .expect("config");
    let run = Reaper(
        fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let mut conn = None;
    wait_until("the source", 20, || {
        conn = TcpStream::connect(("127.0.0.1", tcp)).ok();
        conn.is_some()
    });
    let mut conn = conn.expect("connected");
    // The good cluster first: it is followed whatever comes after.
    conn.write_all(job("good", 1, now - 10.0).as_bytes())
        .expect("send");
    wait_until("the good cluster's first job", 30, || {
        read_records(&out).len() == 1
    });
    let idle = rss_kib(run.0.id());
    // 2000 made-up clusters, each a drain of 131072 ranks.
    let mut flood = String::new();
    for i in 0..2000 {
        flood += &drain(&format!("evil-{i}"), now - 5.0);
    }
    conn.write_all(flood.as_bytes()).expect("flood");
    let sent = Instant::now();
    conn.write_all(job("good", 2, now - 4.0).as_bytes())
        .expect("send");
    wait_until("the good client's job after the flood", 60, || {
        read_records(&out).len() == 2
    });
    let through = sent.elapsed();
    let refused_in = |metrics: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with("fluxpipe_jobs_refused_total{reason=\"max_clusters\"}"))
            .and_then(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // The good job may come through before the shards holding the rest of
    // the flood have read all of it: wait for every refusal to be counted.
    wait_until("every made-up cluster past the cap refused", 60, || {
        http_get(api, "/metrics").is_some_and(|(_, m)| refused_in(&m) >= 1950.0)
    });
    let scraped = Instant::now();
    let metrics = http_get(api, "/metrics").expect("scrape").1;
    let scrape = scraped.elapsed();
    let rss = rss_kib(run.0.id());
    let ranks = metric_sum(&metrics, "flux_nodes");
    let refused = refused_in(&metrics);
    let clusters: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter_map(|l| l.split_once("flux_cluster=\"")?.1.split_once('"'))
        .map(|(c, _)| c)
        .collect();
    println!(
        "2000 made-up clusters × 131072 ranks: good job through in {:.0} ms; RSS {idle} → {rss} KiB; \
         /metrics {} bytes in {:.0} ms, {} clusters, {ranks} ranks held, {refused} records refused",
        through.as_secs_f64() * 1e3,
        metrics.len(),
        scrape.as_secs_f64() * 1e3,
        clusters.len()
    );
    assert!(clusters.len() <= 50, "{} clusters exported", clusters.len());
    assert!(refused >= 1950.0, "{refused} refused");
    assert!(ranks <= 20000.0, "{ranks} ranks held");
    // The scrape is bounded by the ranks held: a few series a node.
    assert!(
        (metrics.len() as f64) < ranks * 600.0 + f64::from(1 << 20),
        "/metrics is {} bytes",
        metrics.len()
    );
    assert!(rss < idle + 200 * 1024, "RSS grew from {idle} to {rss} KiB");
}

#[test]
fn node_series_can_be_switched_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = free_port();
    let feed = dir.path().join("feed.jsonl");
    std::fs::write(&feed, drain("c", 1_700_000_000.0)).expect("feed");
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = {data:?}
[operators]
max_ranks = 5000
[sources.in]
type = "file"
include = [{feed:?}]
[api]
address = "127.0.0.1:{api}"
node_series = false
"#,
            data = dir.path().join("state"),
        ),
    )
    .expect("config");
    let _run = Reaper(
        fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    let mut text = String::new();
    wait_until("the drained nodes counted", 30, || {
        text = http_get(api, "/metrics").map(|r| r.1).unwrap_or_default();
        metric_sum(&text, "flux_nodes_drained") == 5000.0
    });
    assert!(
        !text.contains("flux_node_drain_info{"),
        "per-node series exported"
    );
    assert!(!text.contains("flux_node_drained_seconds_total{"));
}
