//! Helpers shared by the integration tests (each test file is its own
//! crate and uses what it needs).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The copy of the shared corpus in the repository.
pub fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A plain HTTP/1.0 GET on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_with(port, path, "").map(|(status, _, body)| (status, body))
}

/// A plain HTTP/1.0 GET on loopback with extra request header lines
/// (each ending in `\r\n`): (status, response head, body).
pub fn http_get_with(port: u16, path: &str, headers: &str) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n{headers}\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, head.to_string(), body.to_string()))
}

/// The JSON records of a JSON Lines file (none if it does not exist yet;
/// a line still being written is skipped).
pub fn read_records(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The job summaries of a JSON Lines file by (cluster, id). At-least-once
/// delivery may repeat a summary; a repeat must equal the first.
pub fn job_summaries(path: &Path) -> std::collections::BTreeMap<(String, u64), serde_json::Value> {
    let mut out = std::collections::BTreeMap::new();
    for r in read_records(path)
        .into_iter()
        .filter(|r| r["kind"] == "job")
    {
        let key = (
            r["cluster"].as_str().unwrap_or_default().to_string(),
            r["id"].as_u64().expect("job id"),
        );
        if let Some(first) = out.get(&key) {
            assert_eq!(first, &r, "a repeated summary differs");
        }
        out.insert(key, r);
    }
    out
}

/// Poll `done` every 50 ms; fail after `secs` naming `what`.
pub fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Send SIGTERM to a process.
pub fn sigterm(child: &std::process::Child) {
    let _ = std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status();
}

/// A child process, killed when the test ends or fails before it exits.
pub struct Reaper(pub std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
