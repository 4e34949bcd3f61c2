//! The `http` source through the real binary on loopback, with a real HTTP
//! client: a POSTed batch is answered with counts once a checkpoint on disk
//! holds it; a batch sent again is skipped as repeats; bad lines, encodings,
//! sizes, tokens and connections beyond the limit get their answers; and
//! nothing acknowledged is lost when `fluxpipe run` is killed with SIGKILL
//! over and over while a client posts instance B's journals. With `tls`,
//! the same over HTTPS with certificates made at test time: plain HTTP,
//! and without a client certificate when `ca_file` asks for one, refused.

use crate::common;
use crate::common::{
    Reaper, XorShift, corpus, fluxpipe, free_port, http_get, job_summaries, read_records, sigterm,
    wait_until,
};

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Instance B's journals, in sorted path order (as `fluxpipe replay` reads
/// them).
fn journals() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus().join("instances/B/journals"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

fn journal(name: &str) -> PathBuf {
    corpus().join("instances/B/journals").join(name)
}

const INC1: &str = "incarnation1.job-manager.events-journal.jsonl";
const INC2: &str = "incarnation2.job-manager.events-journal.jsonl";

fn text_of(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect()
}

/// Records as canonical JSON text, sorted (a multiset).
fn sorted(records: impl IntoIterator<Item = Value>) -> Vec<String> {
    let mut out: Vec<String> = records.into_iter().map(|r| r.to_string()).collect();
    out.sort();
    out
}

/// The records of one kind the file sink holds.
fn of_kind(out: &Path, kind: &str) -> Vec<String> {
    sorted(read_records(out).into_iter().filter(|r| r["kind"] == kind))
}

/// What the file sink must hold after these files: job summaries from
/// `fluxpipe replay`, transitions from an uninterrupted run of the
/// built-in pipeline over their lines on standard input.
struct Expected {
    jobs: Vec<String>,
    transitions: Vec<String>,
}

fn expected(files: &[PathBuf]) -> Expected {
    let replay = fluxpipe()
        .args(["replay", "--format", "json"])
        .args(files)
        .output()
        .unwrap();
    assert!(replay.status.success());
    let data = tempfile::tempdir().unwrap();
    let mut run = fluxpipe()
        .arg("run")
        .arg("--data-dir")
        .arg(data.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = run.stdin.take().unwrap();
    stdin.write_all(text_of(files).as_bytes()).unwrap();
    drop(stdin);
    let clean = run.wait_with_output().unwrap();
    assert!(clean.status.success());
    let records = |bytes: &[u8]| -> Vec<Value> {
        String::from_utf8_lossy(bytes)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let e = Expected {
        // A run sums a job up when it ends; replay also those still running.
        jobs: sorted(
            records(&replay.stdout)
                .into_iter()
                .filter(|r| r["kind"] == "job" && r["state"] == "INACTIVE"),
        ),
        transitions: sorted(
            records(&clean.stdout)
                .into_iter()
                .filter(|r| r["kind"] == "transition"),
        ),
    };
    assert!(!e.jobs.is_empty() && !e.transitions.is_empty());
    e
}

/// The file sink holds exactly what `files` give: every job summary and
/// transition, none twice, nothing else.
fn assert_output(out: &Path, files: &[PathBuf]) {
    let e = expected(files);
    assert_eq!(of_kind(out, "job"), e.jobs, "job summaries");
    assert_eq!(of_kind(out, "transition"), e.transitions, "transitions");
}

/// A `fluxpipe run` with an `http` source `in` (`source`: more keys of it)
/// and a file sink of transitions and jobs; `extra`: more tables.
struct Run {
    dir: tempfile::TempDir,
    port: u16,
    proc: Reaper,
    /// `http`, or `https` for a source with `tls`.
    scheme: &'static str,
}

impl Run {
    fn start(source: &str, extra: &str) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        std::fs::write(
            dir.path().join("fluxpipe.toml"),
            format!(
                r#"
data_dir = "{d}/data"
workers = 2

[sources.in]
type = "http"
address = "127.0.0.1:{port}"
{source}

[sinks.out]
type = "file"
path = "{d}/out.jsonl"
inputs = ["transitions", "jobs"]

{extra}
"#,
                d = dir.path().display()
            ),
        )
        .unwrap();
        let proc = Run::spawn(dir.path());
        let run = Run {
            dir,
            port,
            proc,
            scheme: "http",
        };
        run.wait_listening();
        run
    }

    fn spawn(dir: &Path) -> Reaper {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("fluxpipe.log"))
            .unwrap();
        Reaper(
            fluxpipe()
                .args(["run", "--config"])
                .arg(dir.join("fluxpipe.toml"))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    fn wait_listening(&self) {
        wait_until("the http source to listen", 10, || {
            TcpStream::connect(("127.0.0.1", self.port)).is_ok()
        });
    }

    /// SIGKILL, then the same config on the same data_dir again.
    fn kill_and_restart(&mut self) {
        let died = self.proc.0.try_wait().unwrap();
        assert!(died.is_none(), "fluxpipe exited ({died:?}): {}", self.log());
        self.proc.0.kill().unwrap();
        self.proc.0.wait().unwrap();
        self.proc = Run::spawn(self.dir.path());
    }

    /// SIGTERM: a clean stop (once it listens, SIGTERM is handled).
    fn stop(&mut self) {
        self.wait_listening();
        sigterm(&self.proc.0);
        let status = self.proc.0.wait().unwrap();
        assert!(status.success(), "fluxpipe exited {status}: {}", self.log());
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out.jsonl")
    }

    fn checkpoint(&self) -> PathBuf {
        self.dir.path().join("data/checkpoint.bin")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fluxpipe.log")).unwrap_or_default()
    }

    /// POST `body` with these headers: (status, answer body).
    fn post(
        &self,
        client: &reqwest::blocking::Client,
        body: impl Into<reqwest::blocking::Body>,
        headers: &[(&str, &str)],
    ) -> reqwest::Result<(u16, String)> {
        let mut req = client
            .post(format!("{}://127.0.0.1:{}/", self.scheme, self.port))
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let answer = req.send()?;
        Ok((answer.status().as_u16(), answer.text()?))
    }

    /// POST expecting `200`: the answer's counts.
    fn post_ok(&self, client: &reqwest::blocking::Client, body: &str) -> Value {
        let (status, text) = self.post(client, body.to_string(), &[]).unwrap();
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }
}

fn client() -> reqwest::blocking::Client {
    common::http_client()
}

fn n(answer: &Value, key: &str) -> u64 {
    answer[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {answer}"))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

#[test]
fn a_batch_is_answered_once_a_checkpoint_holds_it_and_a_repeat_is_skipped() {
    // Checkpoints only when the source asks for one.
    let mut run = Run::start("", "[checkpoint]\ninterval_secs = 0\n");
    let client = client();
    let files = [journal(INC1)];
    let body = text_of(&files);
    let lines = body.lines().count() as u64;
    assert!(!run.checkpoint().exists(), "no checkpoint before a batch");

    // The file system's clock lags by up to a tick: `start` is taken well
    // before the request (and with no checkpoint interval nothing else
    // writes one meanwhile).
    let start = SystemTime::now();
    std::thread::sleep(Duration::from_millis(30));
    let first = run.post_ok(&client, &body);
    assert_eq!(n(&first, "lines"), lines, "{first}");
    assert!(n(&first, "records") >= lines - 1, "{first}");
    assert_eq!(n(&first, "applied"), n(&first, "records"), "{first}");
    assert_eq!(n(&first, "repeats"), 0, "{first}");
    assert_eq!(n(&first, "invalid"), 0, "{first}");
    assert_eq!(first["errors"], serde_json::json!([]), "{first}");
    assert_eq!(first["acknowledged"], "checkpoint", "{first}");
    let written = std::fs::metadata(run.checkpoint())
        .expect("checkpoint.bin on disk by the answer")
        .modified()
        .unwrap();
    assert!(written > start, "checkpoint.bin is older than the request");
    // Its outputs were delivered before the answer too.
    assert_output(&run.out(), &files);

    // The same batch again: skipped as repeats, nothing written twice.
    // (Annotations and R documents are applied again: they change nothing.)
    let again = run.post_ok(&client, &body);
    assert_eq!(n(&again, "records"), n(&first, "records"), "{again}");
    assert!(n(&again, "repeats") > 0, "{again}");
    assert!(n(&again, "applied") < n(&again, "repeats"), "{again}");
    assert_eq!(
        n(&again, "applied") + n(&again, "repeats"),
        n(&again, "records"),
        "{again}"
    );
    assert_output(&run.out(), &files);

    // Killed and restarted: the checkpoint held the batch, so the state is
    // as it was: the same answer, and still nothing written twice.
    run.kill_and_restart();
    run.wait_listening();
    let after_kill = run.post_ok(&client, &body);
    assert_eq!(after_kill, again);
    assert_output(&run.out(), &files);
    run.stop();
}

#[test]
fn invalid_lines_are_listed_and_the_good_ones_applied() {
    let mut run = Run::start("", "");
    let files = [journal(INC2)];
    let mut lines: Vec<String> = text_of(&files).lines().map(String::from).collect();
    let good = lines.len() as u64;
    lines.insert(1, "this is not json".into());
    lines.insert(4, r#"{"id": 2}"#.into());
    lines.insert(7, String::new());
    let answer = run.post_ok(&client(), &(lines.join("\n") + "\n"));
    assert_eq!(n(&answer, "lines"), good + 3, "{answer}");
    assert_eq!(n(&answer, "invalid"), 2, "{answer}");
    let errors = answer["errors"].as_array().unwrap();
    let at: Vec<u64> = errors.iter().map(|e| n(e, "line")).collect();
    assert_eq!(at, [2, 5], "{answer}");
    assert!(
        errors[0]["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{answer}"
    );
    assert!(!errors[1]["error"].as_str().unwrap().is_empty(), "{answer}");
    assert!(n(&answer, "applied") > 0, "{answer}");
    assert_eq!(n(&answer, "applied"), n(&answer, "records"), "{answer}");
    assert_output(&run.out(), &files);
    run.stop();
}

#[test]
fn gzip_is_accepted_and_bad_encodings_and_sizes_are_refused() {
    let mut run = Run::start("max_body_bytes = 32768", "");
    let client = client();
    let files = [journal(INC2)];
    let body = text_of(&files);
    let (status, text) = run
        .post(
            &client,
            gzip(body.as_bytes()),
            &[("Content-Encoding", "gzip")],
        )
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(n(&answer, "lines"), body.lines().count() as u64, "{answer}");
    assert!(n(&answer, "applied") > 0, "{answer}");

    // Refused bodies are of the other journal: a record of theirs applied
    // would show in the output.
    let other = std::fs::read_to_string(journal(INC1)).unwrap();
    assert!(other.len() < 32768);
    let oversized = other.clone() + &"\n".repeat(32768 - other.len() + 1);
    let refused: [(&str, Vec<u8>, &str, u16); 5] = [
        ("an unknown encoding", other.clone().into(), "br", 415),
        (
            "over max_body_bytes",
            oversized.clone().into(),
            "identity",
            413,
        ),
        (
            "over max_body_bytes once decompressed",
            gzip(oversized.as_bytes()),
            "gzip",
            413,
        ),
        ("not gzip", other.clone().into(), "gzip", 400),
        (
            "cut gzip",
            gzip(other.as_bytes())[..500].to_vec(),
            "gzip",
            400,
        ),
    ];
    for (what, bytes, encoding, want) in refused {
        let (status, text) = run
            .post(&client, bytes, &[("Content-Encoding", encoding)])
            .unwrap();
        assert_eq!(status, want, "{what}: {text}");
    }
    assert_output(&run.out(), &files);
    run.stop();
}

#[test]
fn a_bearer_token_is_required_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let mut run = Run::start("", &format!("[sources.in.auth]\ntoken_file = {token:?}\n"));
    let client = client();
    let files = [journal(INC2)];
    let body = text_of(&files);
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cret2"),
        Some("Basic s3cret"),
    ] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
        let (status, text) = run.post(&client, body.clone(), &headers).unwrap();
        assert_eq!(status, 401, "{auth:?}: {text}");
    }
    assert!(
        read_records(&run.out()).is_empty(),
        "a refused batch was applied"
    );
    let (status, text) = run
        .post(&client, body, &[("Authorization", "Bearer s3cret")])
        .unwrap();
    assert_eq!(status, 200, "{text}");
    assert_output(&run.out(), &files);
    run.stop();
}

/// A value from a `prometheus` sink's `/metrics` (`series` with its labels).
fn metric(port: u16, series: &str) -> Option<f64> {
    let (_, text) = http_get(port, "/metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A raw HTTP/1.1 POST of nothing, leaving the connection open: the status.
fn raw_post(conn: &mut TcpStream) -> u16 {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    // Read the whole answer (its JSON ends the body), for the next request.
    let mut got = Vec::new();
    while !got.ends_with(b"}\n") {
        let mut buf = [0; 1024];
        let k = conn.read(&mut buf).unwrap();
        assert!(k > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..k]);
    }
    let text = String::from_utf8_lossy(&got);
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn connections_beyond_max_connections_are_closed_at_once_and_counted() {
    let metrics = free_port();
    let mut run = Run::start(
        "max_connections = 2",
        &format!("[api]\naddress = \"127.0.0.1:{metrics}\"\n"),
    );
    let open = r#"fluxpipe_socket_connections{source="in"}"#;
    let refused = r#"fluxpipe_source_connections_refused_total{source="in"}"#;
    // The probes that found the source listening are gone.
    wait_until("no connection open", 10, || {
        metric(metrics, open) == Some(0.0)
    });

    let mut first = TcpStream::connect(("127.0.0.1", run.port)).unwrap();
    let mut second = TcpStream::connect(("127.0.0.1", run.port)).unwrap();
    assert_eq!(raw_post(&mut first), 200);
    assert_eq!(raw_post(&mut second), 200);
    assert_eq!(metric(metrics, open), Some(2.0));

    // The third is accepted by the kernel and closed by fluxpipe at once.
    let mut third = TcpStream::connect(("127.0.0.1", run.port)).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0; 64];
    match third.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the third connection was not closed: {other:?}"),
    }
    wait_until("the refused connection counted", 5, || {
        metric(metrics, refused) == Some(1.0)
    });
    // The two first are still served.
    assert_eq!(raw_post(&mut second), 200);

    // Once one leaves, a new client is served.
    drop(first);
    wait_until("one connection open", 5, || {
        metric(metrics, open) == Some(1.0)
    });
    let answer = run.post_ok(&client(), "");
    assert_eq!(n(&answer, "lines"), 0, "{answer}");
    drop(second);
    run.stop();
}

/// Post `batches` in order, each until it gets a `200` (after a connection
/// error, `503` or `429`, again after a pause); `acked` counts those done.
/// Returns how many tries failed.
fn feed(port: u16, batches: Vec<String>, acked: Arc<AtomicUsize>) -> usize {
    let client = client();
    let url = format!("http://127.0.0.1:{port}/");
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut failed = 0;
    for batch in batches {
        loop {
            assert!(Instant::now() < deadline, "the feeder ran out of time");
            match client.post(&url).body(batch.clone()).send() {
                Ok(r) if r.status() == 200 => {
                    let answer: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
                    assert_eq!(answer["acknowledged"], "checkpoint", "{answer}");
                    assert_eq!(n(&answer, "invalid"), 0, "{answer}");
                    break;
                }
                Ok(r) if [429, 503].contains(&r.status().as_u16()) => {}
                Ok(r) => panic!("unexpected answer {}: {:?}", r.status(), r.text()),
                Err(_) => {}
            }
            failed += 1;
            std::thread::sleep(Duration::from_millis(30));
        }
        acked.fetch_add(1, Ordering::SeqCst);
        // Paced, so that the kills find it mid-stream.
        std::thread::sleep(Duration::from_millis(25));
    }
    failed
}

#[test]
fn nothing_acknowledged_is_lost_across_sigkills() {
    let files = journals();
    let batches: Vec<String> = text_of(&files)
        .lines()
        .collect::<Vec<_>>()
        .chunks(5)
        .map(|c| c.join("\n") + "\n")
        .collect();
    let total = batches.len();
    let mut run = Run::start(
        "request_timeout_secs = 5",
        "[checkpoint]\ninterval_secs = 0.2\n",
    );
    let acked = Arc::new(AtomicUsize::new(0));
    let feeder = {
        let (port, acked) = (run.port, acked.clone());
        std::thread::spawn(move || feed(port, batches, acked))
    };
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut progress = Vec::new();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(50 + rng.next() % 250));
        run.kill_and_restart();
        progress.push(acked.load(Ordering::SeqCst));
    }
    let failed = feeder.join().unwrap();
    run.stop();

    // The kills came mid-stream and cut requests short.
    assert!(
        progress[0] < total && progress.iter().any(|&p| p > 0 && p < total) && failed > 0,
        "batches acknowledged at each kill: {progress:?} of {total}; {failed} tries failed"
    );
    let text = std::fs::read_to_string(run.out()).unwrap_or_default();
    let torn = text
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).is_err())
        .count();
    let context = format!(
        "batches acknowledged at each kill: {progress:?} of {total}; {failed} tries failed; {torn} lines of the output are not JSON"
    );
    eprintln!("{context}");
    let e = expected(&files);
    // Every job, every field (a summary may repeat, never differ).
    let got: Vec<String> = sorted(job_summaries(&run.out()).into_values());
    assert_eq!(got, e.jobs, "job summaries; {context}");
    // Every transition (at least once, for now), nothing else.
    let got: BTreeSet<String> = of_kind(&run.out(), "transition").into_iter().collect();
    let want: BTreeSet<String> = e.transitions.into_iter().collect();
    let missing: Vec<_> = want.difference(&got).take(3).collect();
    let unknown: Vec<_> = got.difference(&want).take(3).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "transitions missing: {missing:#?}; not in the clean run: {unknown:#?}; {context}"
    );
}

// Known bugs of the source: these fail today.

#[test]

fn received_batches_are_answered_with_their_counts() {
    let mut run = Run::start("acknowledgements = \"received\"", "");
    let body = text_of(&[journal(INC1)]);
    let answer = run.post_ok(&client(), &body);
    assert_eq!(answer["acknowledged"], "received", "{answer}");
    assert!(
        n(&answer, "records") >= body.lines().count() as u64 - 1,
        "{answer}"
    );
    run.stop();
}

#[test]

fn sigterm_does_not_wait_for_a_stalled_request() {
    let mut run = Run::start("", "");
    let mut stalled = TcpStream::connect(("127.0.0.1", run.port)).unwrap();
    stalled
        .write_all(b"POST / HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    sigterm(&run.proc.0);
    wait_until("fluxpipe to stop", 10, || {
        run.proc.0.try_wait().unwrap().is_some()
    });
}

/// Certificates made for one test, as PEM files in a folder of their own:
/// a CA (`ca.pem`), a server certificate for 127.0.0.1 and localhost
/// signed by it (`server.pem`, `server.key`), a client certificate signed
/// by it (`client.pem`: certificate and key), and a client certificate
/// signed by nobody the server knows (`stranger.pem`).
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(DnType::CommonName, "fluxpipe test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |names: &[&str], usage: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().unwrap();
            let mut params =
                CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                    .unwrap();
            params.extended_key_usages = vec![usage];
            (params, key)
        };
        let (server, server_key) = leaf(
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let server = server.signed_by(&server_key, &issuer).unwrap();
        let (client, client_key) = leaf(&["client.test"], ExtendedKeyUsagePurpose::ClientAuth);
        let client = client.signed_by(&client_key, &issuer).unwrap();
        let (stranger, stranger_key) =
            leaf(&["stranger.test"], ExtendedKeyUsagePurpose::ClientAuth);
        let stranger = stranger.self_signed(&stranger_key).unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", ca_cert.pem());
        write("server.pem", server.pem());
        write("server.key", server_key.serialize_pem());
        write("client.pem", client.pem() + &client_key.serialize_pem());
        write(
            "stranger.pem",
            stranger.pem() + &stranger_key.serialize_pem(),
        );
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The source's `tls` table; with `ca_file` when `client_certificates`.
    fn table(&self, client_certificates: bool) -> String {
        let mut t = format!(
            "[sources.in.tls]\ncrt_file = {:?}\nkey_file = {:?}\n",
            self.path("server.pem"),
            self.path("server.key")
        );
        if client_certificates {
            t += &format!("ca_file = {:?}\n", self.path("ca.pem"));
        }
        t
    }

    /// A client that trusts only the test CA; presenting `identity` (a
    /// file of certificate and key) if given.
    fn client(&self, identity: Option<&str>) -> reqwest::blocking::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = std::fs::read(self.path("ca.pem")).unwrap();
        let mut b = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()]);
        if let Some(name) = identity {
            let pem = std::fs::read(self.path(name)).unwrap();
            b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        b.build().unwrap()
    }
}

/// The count of failed TLS handshakes on `/metrics` (none yet: 0).
fn handshake_failures(metrics: u16) -> Option<f64> {
    let (_, text) = http_get(metrics, "/metrics")?;
    Some(
        text.lines()
            .find_map(|l| {
                l.strip_prefix(r#"fluxpipe_http_tls_handshake_failures_total{source="in"} "#)?
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0),
    )
}

#[test]
fn a_batch_is_posted_over_https_and_plain_http_is_refused() {
    let pki = Pki::new();
    let metrics = free_port();
    let mut run = Run::start(
        "request_timeout_secs = 4",
        &format!(
            "{}\n[api]\naddress = \"127.0.0.1:{metrics}\"\n\n[log]\nlevel = \"info\"\n",
            pki.table(false)
        ),
    );
    run.scheme = "https";
    // The probes that found the source listening are gone (each a failed
    // handshake).
    wait_until("no connection open", 10, || {
        metric(metrics, r#"fluxpipe_socket_connections{source="in"}"#) == Some(0.0)
    });
    let failed_before = handshake_failures(metrics).unwrap();

    // A client that opens a connection and says nothing holds neither the
    // accept loop nor anyone else: the handshake waits in its own task.
    let mut silent = TcpStream::connect(("127.0.0.1", run.port)).unwrap();
    let since = Instant::now();
    let files = [journal(INC1)];
    let body = text_of(&files);
    let answer = run.post_ok(&pki.client(None), &body);
    // Had the accept loop waited for the silent handshake, this answer
    // would have come after its timeout at the earliest.
    assert!(
        since.elapsed() < Duration::from_secs(3),
        "answered after {:?}",
        since.elapsed()
    );
    assert_eq!(n(&answer, "lines"), body.lines().count() as u64, "{answer}");
    assert_eq!(n(&answer, "applied"), n(&answer, "records"), "{answer}");
    assert_output(&run.out(), &files);
    // ... and is let go after request_timeout_secs.
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0; 64];
    match silent.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the silent connection was not closed: {other:?}"),
    }
    wait_until("the silent handshake counted", 5, || {
        handshake_failures(metrics) == Some(failed_before + 1.0)
    });

    // Plain HTTP to the TLS port: no answer, nothing applied, counted.
    let other = [journal(INC2)];
    let plain = client()
        .post(format!("http://127.0.0.1:{}/", run.port))
        .body(text_of(&other))
        .send();
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    wait_until("the plain HTTP handshake counted", 5, || {
        handshake_failures(metrics) == Some(failed_before + 2.0)
    });
    let log = run.log();
    assert!(
        log.lines()
            .any(|l| l.contains("TLS handshake failed") && l.contains("peer=127.0.0.1:")),
        "no log line of the failed handshake with its peer: {log}"
    );
    assert_output(&run.out(), &files);
    run.stop();
}

#[test]
fn max_connections_holds_for_tls_connections() {
    let pki = Pki::new();
    let metrics = free_port();
    let mut run = Run::start(
        "max_connections = 1",
        &format!(
            "{}\n[api]\naddress = \"127.0.0.1:{metrics}\"\n",
            pki.table(false)
        ),
    );
    run.scheme = "https";
    let open = r#"fluxpipe_socket_connections{source="in"}"#;
    let refused = r#"fluxpipe_source_connections_refused_total{source="in"}"#;
    wait_until("no connection open", 10, || {
        metric(metrics, open) == Some(0.0)
    });
    // The first client keeps its connection (HTTP keep-alive).
    let first = pki.client(None);
    assert_eq!(n(&run.post_ok(&first, ""), "lines"), 0);
    assert_eq!(metric(metrics, open), Some(1.0));
    let second = pki.client(None);
    let refused_answer = run.post(&second, "", &[]);
    assert!(refused_answer.is_err(), "{refused_answer:?}");
    wait_until("the refused connection counted", 5, || {
        metric(metrics, refused) == Some(1.0)
    });
    drop(first);
    wait_until("no connection open", 5, || {
        metric(metrics, open) == Some(0.0)
    });
    assert_eq!(n(&run.post_ok(&second, ""), "lines"), 0);
    run.stop();
}

#[test]
fn with_ca_file_only_clients_with_a_certificate_of_that_ca_are_served() {
    let pki = Pki::new();
    let mut run = Run::start("", &pki.table(true));
    run.scheme = "https";
    let files = [journal(INC2)];
    let body = text_of(&files);
    for (who, client) in [
        ("no certificate", pki.client(None)),
        (
            "a certificate of another CA",
            pki.client(Some("stranger.pem")),
        ),
    ] {
        let refused = run.post(&client, body.clone(), &[]);
        assert!(refused.is_err(), "{who}: {refused:?}");
    }
    assert!(
        read_records(&run.out()).is_empty(),
        "a refused batch was applied"
    );
    let answer = run.post_ok(&pki.client(Some("client.pem")), &body);
    assert_eq!(n(&answer, "lines"), body.lines().count() as u64, "{answer}");
    assert_output(&run.out(), &files);
    run.stop();
}
