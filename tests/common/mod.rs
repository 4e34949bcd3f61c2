//! Helpers shared by the integration tests (`tests/integration/`) and the
//! cost gate (`tests/cost.rs`), which each use what they need.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The `fluxpipe` binary under test.
pub fn fluxpipe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fluxpipe"))
}

/// Every record of `fluxpipe replay --format json ARGS PATHS`, run from the
/// repository root. Fails the test if replay fails or prints a line that is
/// not JSON.
pub fn replay<P: AsRef<std::ffi::OsStr>>(args: &[&str], paths: &[P]) -> Vec<serde_json::Value> {
    let out = fluxpipe()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["replay", "--format", "json"])
        .args(args)
        .args(paths)
        .output()
        .expect("run fluxpipe replay");
    assert!(
        out.status.success(),
        "replay {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// `fluxpipe generate ARGS --out OUT`; fails the test if it fails.
pub fn generate(args: &[&str], out: &Path) {
    let status = fluxpipe()
        .arg("generate")
        .args(args)
        .arg("--out")
        .arg(out)
        .status()
        .expect("run fluxpipe generate");
    assert!(status.success(), "generate {args:?}");
}

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

/// A real Alertmanager on loopback (clustering off, every alert to a
/// receiver that sends nothing), or `None` where it is not installed
/// (outside CI).
pub fn alertmanager(dir: &Path) -> Option<(Reaper, u16)> {
    let bin = ["prometheus-alertmanager", "alertmanager"]
        .into_iter()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok()
        });
    let Some(bin) = bin else {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus-alertmanager must be installed in CI"
        );
        return None;
    };
    let config = dir.join("alertmanager.yml");
    std::fs::write(
        &config,
        "route:\n  receiver: blackhole\n  group_wait: 1s\nreceivers:\n  - name: blackhole\n",
    )
    .expect("write am config");
    let port = free_port();
    let child = std::process::Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start alertmanager");
    let am = Reaper(child);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while http_get(port, "/-/ready").map(|r| r.0) != Some(200) {
        assert!(
            std::time::Instant::now() < deadline,
            "alertmanager did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some((am, port))
}

/// Alerts Alertmanager holds now (resolved ones are not listed).
pub fn am_alerts(port: u16) -> Vec<serde_json::Value> {
    http_get(port, "/api/v2/alerts")
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// One request an [`HttpReceiver`] got.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: std::collections::BTreeMap<String, String>,
    pub body: Vec<u8>,
}

/// A small HTTP/1.1 server on loopback (a thread per connection, keep-alive,
/// `Content-Length` or chunked bodies) that answers every request `200 OK`
/// and keeps what it got. It lives as long as the test process.
pub struct HttpReceiver {
    pub port: u16,
    got: std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
}

impl HttpReceiver {
    pub fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let keep = keep.clone();
                std::thread::spawn(move || {
                    let _ = serve_http(stream, &keep);
                });
            }
        });
        HttpReceiver { port, got }
    }

    /// The requests so far, in the order they arrived.
    pub fn requests(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }
}

fn serve_http(stream: TcpStream, got: &std::sync::Mutex<Vec<Received>>) -> std::io::Result<()> {
    use std::io::BufRead;
    let mut out = stream.try_clone()?;
    let mut r = std::io::BufReader::new(stream);
    loop {
        let mut first = String::new();
        if r.read_line(&mut first)? == 0 {
            return Ok(());
        }
        let mut words = first.split_whitespace();
        let method = words.next().unwrap_or_default().to_string();
        let path = words.next().unwrap_or_default().to_string();
        let mut headers = std::collections::BTreeMap::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let mut body = Vec::new();
        if headers
            .get("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let mut size = String::new();
                r.read_line(&mut size)?;
                let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                if size == 0 {
                    // trailers, then the empty line
                    loop {
                        let mut t = String::new();
                        if r.read_line(&mut t)? == 0 || t.trim_end().is_empty() {
                            break;
                        }
                    }
                    break;
                }
                let mut chunk = vec![0; size + 2];
                r.read_exact(&mut chunk)?;
                body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(len) = headers.get("content-length") {
            let len: usize = len.parse().unwrap_or(0);
            body = vec![0; len];
            r.read_exact(&mut body)?;
        }
        let close = headers
            .get("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        got.lock().expect("lock").push(Received {
            method,
            path,
            headers,
            body,
        });
        out.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")?;
        if close {
            return Ok(());
        }
    }
}

/// A blocking HTTP client for the tests (reqwest is built without a TLS
/// provider of its own).
#[allow(dead_code)]
pub fn http_client() -> reqwest::blocking::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client")
}

/// A small deterministic generator (xorshift64), for kill times.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The samples of a Prometheus text exposition: series (name and labels
/// as written) → value.
pub fn samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The samples `/metrics` on loopback port `port` gives now (none while
/// it does not answer).
pub fn scrape(port: u16) -> std::collections::BTreeMap<String, f64> {
    match http_get(port, "/metrics") {
        Some((200, text)) => samples(&text),
        _ => Default::default(),
    }
}

/// The sum of metric `name`'s samples, whatever their labels.
pub fn total(samples: &std::collections::BTreeMap<String, f64>, name: &str) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| *k == name || k.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
        .map(|(_, v)| v)
        .sum()
}

/// POST instance B's job-manager journal of the corpus to an `http`
/// source at `url`, expect it acknowledged, and wait until the pipeline's
/// `/metrics` on `api` counts every job of it that ended.
pub fn post_journal_until_counted(url: &str, api: u16) {
    let journal =
        corpus().join("instances/B/journals/incarnation1.job-manager.events-journal.jsonl");
    let answer = http_client()
        .post(url)
        .body(std::fs::read(&journal).expect("journal"))
        .timeout(Duration::from_secs(60))
        .send()
        .unwrap_or_else(|e| panic!("POST to {url}: {e}"));
    assert_eq!(answer.status().as_u16(), 200);
    let ended = replay(&[], &[&journal])
        .iter()
        .filter(|r| r["kind"] == "job" && r["state"] == "INACTIVE")
        .count() as f64;
    assert!(ended > 0.0);
    wait_until("the jobs in /metrics", 30, || {
        total(&scrape(api), "flux_jobs_inactive_total") == ended
    });
}

/// Run a command to its end; fail the test, with its output, if it fails.
pub fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// What an uninterrupted `fluxpipe run` over standard input prints for
/// `journal` (its lines of cluster `cluster`, the streams `inputs` on a
/// `stdout` sink): the reference a run with faults is compared to. Its
/// data folder is under `dir`.
pub fn stdin_run_records(
    dir: &Path,
    cluster: &str,
    journal: &Path,
    inputs: &[&str],
) -> Vec<serde_json::Value> {
    let config = dir.join(format!("stdin-{cluster}.toml"));
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"stdin\"\ncluster = {cluster:?}\n\
             [sinks.out]\ntype = \"stdout\"\ninputs = {inputs:?}\n",
            dir.join(format!("stdin-{cluster}-data"))
        ),
    )
    .expect("config");
    let out = fluxpipe()
        .args(["run", "--config"])
        .arg(&config)
        .stdin(std::fs::File::open(journal).expect("journal"))
        .output()
        .expect("run over stdin");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}
