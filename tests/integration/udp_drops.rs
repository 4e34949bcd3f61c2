//! UDP datagrams the kernel drops because fluxpipe's receive buffer was
//! full are counted (issue 28): the real binary is flooded on loopback,
//! where the receive buffer is the only place a datagram can be lost, so
//! every datagram sent is either received or counted as dropped.

use crate::common;
use crate::common::{Reaper, fluxpipe, free_port, wait_until};

use std::process::Stdio;

/// A metric's value, once `/metrics` answers and has it.
fn sample(port: u16, name: &str) -> Option<f64> {
    let samples = common::scrape(port);
    samples
        .keys()
        .any(|k| k.starts_with(name))
        .then(|| common::total(&samples, name))
}

#[test]
fn datagrams_the_kernel_dropped_are_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (udp, api) = (free_port(), free_port());
    let config = dir.path().join("udp.toml");
    std::fs::write(
        &config,
        format!(
            r#"
data_dir = {data:?}
[sources.udp]
type = "socket"
mode = "udp"
address = "127.0.0.1:{udp}"
[sinks.out]
type = "file"
path = {out:?}
inputs = ["dead_letter"]
[api]
address = "127.0.0.1:{api}"
"#,
            data = dir.path().join("state"),
            out = dir.path().join("dead.jsonl"),
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
    wait_until("the drops series", 20, || {
        sample(api, "fluxpipe_udp_receive_drops_total").is_some()
    });
    // Bad lines each make a dead letter: the pipeline reads slower than
    // this loop sends.
    let sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let line = format!("{{not json {}}}", "x".repeat(900));
    let sent = 200_000u64;
    for _ in 0..sent {
        let _ = sender.send_to(line.as_bytes(), ("127.0.0.1", udp));
    }
    let received = || sample(api, "fluxpipe_events_received_total").unwrap_or(0.0);
    let dropped = || sample(api, "fluxpipe_udp_receive_drops_total").unwrap_or(0.0);
    wait_until("every datagram received or counted as dropped", 60, || {
        received() + dropped() >= sent as f64
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (r, d) = (received(), dropped());
    println!("{sent} datagrams sent: {r} received, {d} dropped by the kernel");
    assert_eq!(r + d, sent as f64);
    assert!(d > 0.0, "no datagram was dropped: the flood was too slow");
}
