//! The network inputs and outputs of the pipeline, against real sockets and
//! a real HTTP server on loopback: the `socket` source (tcp, unix, udp),
//! the `socket` sink and the `http` sink.

use fluxpipe::output::OutputRecord;
use fluxpipe::output::OutputStream;
use fluxpipe::pipeline::config;
use fluxpipe::pipeline::topology;
use fluxpipe::sinks;
use fluxpipe::sinks::SinkConfig;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket, UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------- helpers

fn e(ts: f64, name: &str) -> Value {
    json!({"timestamp": ts, "name": name})
}

fn ec(ts: f64, name: &str, ctx: Value) -> Value {
    json!({"timestamp": ts, "name": name, "context": ctx})
}

/// A complete, successful job.
fn full_job(t: f64) -> Vec<Value> {
    vec![
        ec(
            t,
            "submit",
            json!({"userid": 42, "urgency": 16, "flags": 0, "version": 1}),
        ),
        e(t + 1.0, "validate"),
        e(t + 2.0, "depend"),
        ec(t + 3.0, "priority", json!({"priority": 16})),
        ec(t + 4.0, "alloc", json!({"annotations": {}})),
        e(t + 5.0, "start"),
        ec(t + 6.0, "finish", json!({"status": 0})),
        ec(t + 7.0, "release", json!({"ranks": "all", "final": true})),
        e(t + 8.0, "free"),
        e(t + 9.0, "clean"),
    ]
}

/// A job's events as two job-manager journal messages.
fn journal(id: u64) -> [String; 2] {
    let events = full_job(100.0);
    let (a, b) = events.split_at(4);
    [
        json!({"id": id, "events": a}).to_string(),
        json!({"id": id, "events": b}).to_string(),
    ]
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A pipeline with one socket source (`source` holds its keys after
/// `type`) and a file sink of jobs and dead letters.
struct Pipeline {
    _dir: tempfile::TempDir,
    out: PathBuf,
    token: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Pipeline {
    fn start(source: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, source)
    }

    fn start_in(dir: tempfile::TempDir, source: &str) -> Self {
        let text = format!(
            r#"
data_dir = "{d}/state"
workers = 2

[sources.net]
type = "socket"
cluster = "picl"
{source}

[sinks.out]
type = "file"
path = "{d}/out.jsonl"
inputs = ["jobs", "dead_letter"]
"#,
            d = dir.path().display()
        );
        let config = config::parse(&text).unwrap_or_else(|e| panic!("{e:?}"));
        let token = CancellationToken::new();
        let task = tokio::spawn(topology::run(config, token.clone()));
        Pipeline {
            out: dir.path().join("out.jsonl"),
            _dir: dir,
            token,
            task,
        }
    }

    /// The whole lines written so far (the sink may be writing the next
    /// one while this reads: its part is left for the next look).
    fn records(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        whole
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    fn dead_letters(&self) -> Vec<Value> {
        of_kind(&self.records(), "dead_letter")
    }

    /// Poll the output until `done` holds (or fail after a few seconds).
    async fn wait_until(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let recs = self.records();
            if done(&recs) {
                return recs;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "timed out waiting for {what}; output: {recs:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("pipeline did not stop")
            .unwrap()
            .expect("pipeline failed");
    }
}

fn of_kind(recs: &[Value], kind: &str) -> Vec<Value> {
    recs.iter().filter(|r| r["kind"] == kind).cloned().collect()
}

fn job_ids(recs: &[Value]) -> Vec<u64> {
    let mut ids: Vec<u64> = of_kind(recs, "job")
        .iter()
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    ids.sort();
    ids
}

async fn connect_tcp(port: u16) -> TcpStream {
    let start = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => return s,
            Err(e) if start.elapsed() > Duration::from_secs(5) => panic!("connect: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn connect_unix(path: &Path) -> UnixStream {
    let start = Instant::now();
    loop {
        match UnixStream::connect(path).await {
            Ok(s) => return s,
            Err(e) if start.elapsed() > Duration::from_secs(5) => panic!("connect: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

// ----------------------------------------------------------- socket source

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_source_serves_concurrent_clients_and_dead_letters_garbage() {
    let port = free_tcp_port();
    let p = Pipeline::start(&format!(
        "mode = \"tcp\"\naddress = \"127.0.0.1:{port}\"\nmax_line_bytes = 2048\n"
    ));
    // Wait until it listens (the probe connection sends nothing).
    drop(connect_tcp(port).await);

    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            tokio::spawn(async move {
                let mut s = connect_tcp(port).await;
                let mut text = String::new();
                for k in 0..5u64 {
                    let [a, b] = journal(1000 * (c + 1) + k);
                    text.push_str(&format!("{a}\nthis is not json\n{b}\r\n"));
                }
                text.push_str(&"x".repeat(5000));
                text.push('\n');
                // In small pieces, so lines straddle reads.
                for chunk in text.as_bytes().chunks(777) {
                    s.write_all(chunk).await.unwrap();
                    tokio::task::yield_now().await;
                }
                s.shutdown().await.unwrap();
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let recs = p
        .wait_until("20 jobs and 24 dead letters", |r| {
            of_kind(r, "job").len() >= 20 && of_kind(r, "dead_letter").len() >= 24
        })
        .await;
    let expected: Vec<u64> = (0..4u64)
        .flat_map(|c| (0..5).map(move |k| 1000 * (c + 1) + k))
        .collect();
    assert_eq!(job_ids(&recs), expected);
    for j in of_kind(&recs, "job") {
        assert_eq!(j["cluster"], "picl");
        assert_eq!(j["state"], "INACTIVE", "{j}");
        assert_eq!(j["result"], "COMPLETED", "{j}");
    }
    let dead = of_kind(&recs, "dead_letter");
    assert_eq!(dead.len(), 24, "{dead:#?}");
    let too_long: Vec<_> = dead
        .iter()
        .filter(|d| d["error"].as_str().unwrap().contains("max_line_bytes"))
        .collect();
    assert_eq!(too_long.len(), 4, "{dead:#?}");
    for d in &dead {
        let loc = d["location"].as_str().unwrap();
        assert!(loc.starts_with("tcp://127.0.0.1:"), "{d}");
        assert_eq!(d["source"], "net");
    }
    // Garbage is the 2nd line of each job's three; the long line is the 16th.
    let garbage_lines: Vec<u64> = dead
        .iter()
        .filter(|d| d["line"] == "this is not json")
        .map(|d| {
            let loc = d["location"].as_str().unwrap();
            loc.rsplit(':').next().unwrap().parse().unwrap()
        })
        .collect();
    assert!(
        garbage_lines.iter().all(|n| n % 3 == 2),
        "{garbage_lines:?}"
    );
    assert!(
        too_long
            .iter()
            .all(|d| d["location"].as_str().unwrap().ends_with(":16")),
        "{too_long:#?}"
    );
    p.stop().await;
}

/// A client that floods one endless line and a client that stalls mid-line
/// starve nobody: a polite client's job comes through at once, the flood
/// is one bounded dead letter (never buffered whole), and the stalled
/// line is dead-lettered when its client finally leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_or_stalled_client_starves_nobody() {
    let port = free_tcp_port();
    let p = Pipeline::start(&format!(
        "mode = \"tcp\"\naddress = \"127.0.0.1:{port}\"\nmax_line_bytes = 65536\n"
    ));
    drop(connect_tcp(port).await);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut s = connect_tcp(port).await;
            let chunk = vec![b'a'; 64 * 1024];
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if s.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len() as u64;
            }
            sent
        })
    };
    let mut stalled = connect_tcp(port).await;
    stalled
        .write_all(b"{\"id\": 7, \"events\": [")
        .await
        .unwrap();

    // Let the flood run, then a polite client sends one job.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut polite = connect_tcp(port).await;
    let [a, b] = journal(4242);
    polite
        .write_all(format!("{a}\n{b}\n").as_bytes())
        .await
        .unwrap();
    polite.shutdown().await.unwrap();
    p.wait_until("the polite client's job", |r| job_ids(r) == vec![4242])
        .await;
    let waited = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flooded = flood.await.unwrap();
    assert!(
        flooded > 10 * 65536,
        "the flood must have outrun one line's limit: {flooded} bytes"
    );
    assert!(waited < Duration::from_secs(5), "{waited:?}");

    drop(stalled);
    // Both connections are closed now: each leaves its dead letter, in
    // whichever order they are read.
    let starts =
        |d: &Value, prefix: &str| d["line"].as_str().is_some_and(|l| l.starts_with(prefix));
    let recs = p
        .wait_until("the stalled line's and the flood's dead letters", |r| {
            let dead = of_kind(r, "dead_letter");
            dead.iter().any(|d| starts(d, "{\"id\": 7")) && dead.iter().any(|d| starts(d, "aaaa"))
        })
        .await;
    // The flood is one over-long line: one dead letter, cut, never buffered
    // whole (the reader skips to the next newline).
    let dead = of_kind(&recs, "dead_letter");
    let floods: Vec<&Value> = dead.iter().filter(|d| starts(d, "aaaa")).collect();
    assert_eq!(floods.len(), 1, "{dead:#?}");
    assert_eq!(floods[0]["truncated"], true);
    assert!(floods[0]["line"].as_str().unwrap().len() <= 4096);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_source_refuses_connections_beyond_max_connections() {
    let port = free_tcp_port();
    let p = Pipeline::start(&format!(
        "mode = \"tcp\"\naddress = \"127.0.0.1:{port}\"\nmax_connections = 1\n"
    ));
    let mut first = connect_tcp(port).await;
    let [a, b] = journal(1);
    first
        .write_all(format!("{a}\n{b}\n").as_bytes())
        .await
        .unwrap();
    p.wait_until("job 1", |r| job_ids(r) == [1]).await;

    // The second client is closed at once, not left waiting behind the
    // first in the accept backlog.
    let mut second = connect_tcp(port).await;
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), second.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the second client was not closed: {read:?}"
    );

    // Once the first has left, a new client is served.
    drop(first);
    let [a, b] = journal(2);
    let start = Instant::now();
    while job_ids(&p.records()) != [1, 2] {
        assert!(start.elapsed() < Duration::from_secs(5), "job 2 never came");
        if let Ok(mut third) = TcpStream::connect(("127.0.0.1", port)).await {
            let _ = third.write_all(format!("{a}\n{b}\n").as_bytes()).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_crowding_clients_cannot_shut_out_others() {
    let port = free_tcp_port();
    let p = Pipeline::start(&format!(
        "mode = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n\
         max_connections_per_peer = 4\nread_timeout_secs = 0.5\n"
    ));
    // Ten connections from 127.0.0.1, each stopping part way through a line.
    let mut crowd = Vec::new();
    for _ in 0..10 {
        let mut s = connect_tcp(port).await;
        let _ = s.write_all(br#"{"id":9,"events":[{"timest"#).await;
        crowd.push(s);
    }
    // A client from another address is served at once.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let start = Instant::now();
    let mut good = socket
        .connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap();
    let [a, b] = journal(5);
    good.write_all(format!("{a}\n{b}\n").as_bytes())
        .await
        .unwrap();
    p.wait_until("the good client's job", |r| job_ids(r) == [5])
        .await;
    println!(
        "a good client's job through beside 10 stalled connections of one peer: {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    // Four were served and closed by the read timeout, their parts dead
    // letters; six were refused at once and nothing of theirs was read.
    let dead = p
        .wait_until("the stalled lines", |r| {
            of_kind(r, "dead_letter").len() >= 4
        })
        .await;
    let dead = of_kind(&dead, "dead_letter");
    assert_eq!(dead.len(), 4, "{dead:#?}");
    assert!(
        dead.iter().all(|d| d["error"]
            .as_str()
            .unwrap_or("")
            .contains("stalled mid-line")),
        "{dead:#?}"
    );
    let mut closed = 0;
    for s in &mut crowd {
        let mut buf = [0u8; 8];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 10, "every crowding connection ends");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_client_leaving_mid_line_loses_nothing_terminated() {
    let port = free_tcp_port();
    let p = Pipeline::start(&format!("mode = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n"));
    let mut s = connect_tcp(port).await;
    let [a, b] = journal(77);
    s.write_all(format!("{a}\n").as_bytes()).await.unwrap();
    // The second line arrives in two writes, then half of a third line.
    let (b1, b2) = b.split_at(b.len() / 2);
    s.write_all(b1.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    s.write_all(format!("{b2}\n").as_bytes()).await.unwrap();
    s.write_all(br#"{"id":78,"events":[{"timestam"#)
        .await
        .unwrap();
    drop(s);
    let recs = p
        .wait_until("job 77 and the cut line", |r| {
            !of_kind(r, "job").is_empty() && !of_kind(r, "dead_letter").is_empty()
        })
        .await;
    assert_eq!(job_ids(&recs), [77]);
    let dead = of_kind(&recs, "dead_letter");
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert!(
        dead[0]["error"]
            .as_str()
            .unwrap()
            .contains("connection closed mid-line"),
        "{dead:#?}"
    );
    assert_eq!(dead[0]["line"], r#"{"id":78,"events":[{"timestam"#);
    assert!(dead[0]["location"].as_str().unwrap().ends_with(":3"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_source_delivers_and_removes_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.sock");
    // A stale socket file left by an earlier run.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());

    let p = Pipeline::start_in(
        dir,
        &format!("mode = \"unix\"\naddress = \"{}\"\n", path.display()),
    );
    let mut clients = Vec::new();
    for id in [5u64, 6] {
        let mut s = connect_unix(&path).await;
        let [a, b] = journal(id);
        s.write_all(format!("{a}\n{b}\n").as_bytes()).await.unwrap();
        clients.push(s);
    }
    drop(clients);
    let recs = p.wait_until("jobs 5 and 6", |r| job_ids(r) == [5, 6]).await;
    assert!(of_kind(&recs, "dead_letter").is_empty(), "{recs:#?}");
    p.stop().await;
    assert!(!path.exists(), "socket file left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_source_splits_datagrams_into_lines() {
    let port = free_udp_port();
    let p = Pipeline::start(&format!(
        "mode = \"udp\"\naddress = \"127.0.0.1:{port}\"\nmax_line_bytes = 1000\n"
    ));
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.connect(("127.0.0.1", port)).await.unwrap();
    // Datagrams sent before the source binds are lost: probe with garbage
    // until it shows up as a dead letter.
    let start = Instant::now();
    while p.dead_letters().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "udp source silent"
        );
        sock.send(b"probe").await.ok();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let probes = p.dead_letters().len();

    // Job 1: both lines in one datagram; job 2: a line per datagram, the
    // last without a newline; then one over-long line.
    let [a, b] = journal(1);
    sock.send(format!("{a}\n{b}\n").as_bytes()).await.unwrap();
    let [a, b] = journal(2);
    sock.send(format!("{a}\n").as_bytes()).await.unwrap();
    sock.send(b.as_bytes()).await.unwrap();
    sock.send(&[b'y'; 3000]).await.unwrap();
    let recs = p
        .wait_until("jobs 1 and 2 and the long line", |r| {
            job_ids(r) == [1, 2] && of_kind(r, "dead_letter").len() > probes
        })
        .await;
    let dead = of_kind(&recs, "dead_letter");
    let last = dead.last().unwrap();
    assert!(
        last["error"].as_str().unwrap().contains("3000 bytes"),
        "{last}"
    );
    assert!(
        last["location"]
            .as_str()
            .unwrap()
            .starts_with("udp://127.0.0.1:")
    );
    p.stop().await;
}

// -------------------------------------------------------------- sink setup

/// A sink's config, parsed the way a pipeline's is.
fn sink_config(keys: &str) -> SinkConfig {
    let text =
        format!("[sources.s]\ntype = \"stdin\"\n\n[sinks.out]\ninputs = [\"jobs\"]\n{keys}\n");
    let mut c = config::parse(&text).unwrap_or_else(|e| panic!("{e:?}"));
    c.sinks.remove("out").unwrap()
}

fn rec(n: u64) -> Arc<OutputRecord> {
    Arc::new(OutputRecord::raw(
        OutputStream::Jobs,
        &json!({"kind": "job", "id": n}),
    ))
}

fn start_sink(
    keys: &str,
) -> (
    mpsc::Sender<Arc<OutputRecord>>,
    JoinHandle<anyhow::Result<()>>,
) {
    let config = sink_config(keys);
    let (tx, rx) = mpsc::channel(64);
    let rx = fluxpipe::channels::fanout::SinkRx::new("out", rx);
    let task = tokio::spawn(sinks::run("out".into(), config, rx, Default::default()));
    (tx, task)
}

async fn finish(task: JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("sink did not finish")
        .unwrap()
}

async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Value {
    let mut line = String::new();
    let n = tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut line))
        .await
        .expect("no line within 5 s")
        .unwrap();
    assert!(n > 0, "connection closed");
    serde_json::from_str(&line).unwrap()
}

// ------------------------------------------------------------- socket sink

#[tokio::test]
async fn socket_sink_reconnects_and_keeps_the_records_in_flight() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, task) = start_sink(&format!(
        "type = \"socket\"\nmode = \"tcp\"\naddress = \"{addr}\"\n"
    ));
    tx.send(rec(1)).await.unwrap();
    let (conn, _) = listener.accept().await.unwrap();
    let mut conn = BufReader::new(conn);
    assert_eq!(read_line(&mut conn).await["id"], 1);

    // The listener goes away; records sent meanwhile must not be lost.
    drop(conn);
    drop(listener);
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send(rec(2)).await.unwrap();
    tx.send(rec(3)).await.unwrap();
    // Long enough for a few refused reconnects.
    tokio::time::sleep(Duration::from_millis(350)).await;

    let listener = TcpListener::bind(addr).await.unwrap();
    let (conn, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
        .await
        .expect("sink did not reconnect")
        .unwrap();
    let mut conn = BufReader::new(conn);
    assert_eq!(read_line(&mut conn).await["id"], 2);
    assert_eq!(read_line(&mut conn).await["id"], 3);
    tx.send(rec(4)).await.unwrap();
    assert_eq!(read_line(&mut conn).await["id"], 4);

    // Channel closed: the sink returns, having delivered everything.
    tx.send(rec(5)).await.unwrap();
    drop(tx);
    finish(task).await.unwrap();
    assert_eq!(read_line(&mut conn).await["id"], 5);
    let mut rest = String::new();
    conn.read_to_string(&mut rest).await.unwrap();
    assert_eq!(rest, "", "nothing after the last record");
}

#[tokio::test]
async fn socket_sink_writes_to_a_unix_listener() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (tx, task) = start_sink(&format!(
        "type = \"socket\"\nmode = \"unix\"\naddress = \"{}\"\n",
        path.display()
    ));
    for n in 0..3 {
        tx.send(rec(n)).await.unwrap();
    }
    drop(tx);
    let (conn, _) = listener.accept().await.unwrap();
    let mut conn = BufReader::new(conn);
    for n in 0..3 {
        assert_eq!(read_line(&mut conn).await["id"], n);
    }
    finish(task).await.unwrap();
}

#[tokio::test]
async fn socket_sink_gives_up_at_shutdown_when_nobody_listens() {
    let port = free_tcp_port();
    let (tx, task) = start_sink(&format!(
        "type = \"socket\"\nmode = \"tcp\"\naddress = \"127.0.0.1:{port}\"\n"
    ));
    tx.send(rec(1)).await.unwrap();
    drop(tx);
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("sink kept retrying forever")
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("1 records not delivered"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(12));
}

// ---------------------------------------------------------------- http sink

/// One request as the test server saw it.
#[derive(Debug)]
struct Request {
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Request {
    fn ids(&self) -> Vec<u64> {
        let v: Value = serde_json::from_slice(&self.body).expect("body is JSON");
        v.as_array()
            .expect("body is a JSON array")
            .iter()
            .map(|r| r["id"].as_u64().unwrap())
            .collect()
    }
}

/// A minimal HTTP/1.1 server: answers each request with the next status
/// in `script` (200 once it runs out) and reports the request.
async fn http_server(script: &[u16]) -> (u16, mpsc::UnboundedReceiver<Request>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (script, tx) = (script.clone(), tx.clone());
            tokio::spawn(async move {
                let mut r = BufReader::new(stream);
                loop {
                    let mut first = String::new();
                    if r.read_line(&mut first).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let path = first.split(' ').nth(1).unwrap_or("").to_string();
                    let mut headers = HashMap::new();
                    loop {
                        let mut h = String::new();
                        r.read_line(&mut h).await.unwrap();
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        let (k, v) = h.split_once(':').unwrap();
                        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                    }
                    let len: usize = headers
                        .get("content-length")
                        .map_or(0, |v| v.parse().unwrap());
                    let mut body = vec![0; len];
                    r.read_exact(&mut body).await.unwrap();
                    let status = script.lock().unwrap().pop_front().unwrap_or(200);
                    tx.send(Request {
                        path,
                        headers,
                        body,
                    })
                    .ok();
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"
                    );
                    if r.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, rx)
}

async fn next_request(rx: &mut mpsc::UnboundedReceiver<Request>) -> Request {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("no request within 5 s")
        .unwrap()
}

/// The counters of sink `out`, summed by name. (A snapshot resets them,
/// so take one at the end.)
fn counters(snap: &Snapshotter) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for (k, _, _, v) in snap.snapshot().into_vec() {
        let ours = k
            .key()
            .labels()
            .any(|l| l.key() == "sink" && l.value() == "out");
        if let (true, DebugValue::Counter(n)) = (ours, v) {
            *out.entry(k.key().name().to_string()).or_default() += n;
        }
    }
    out
}

fn count(counters: &HashMap<String, u64>, name: &str) -> u64 {
    counters.get(name).copied().unwrap_or(0)
}

/// Tests that read metrics run on one thread with a recorder of their own.
fn recorder() -> (DebuggingRecorder, Snapshotter) {
    let r = DebuggingRecorder::new();
    let s = r.snapshotter();
    (r, s)
}

#[tokio::test]
async fn http_sink_posts_json_array_batches_with_headers() {
    let (recorder, snap) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let (port, mut reqs) = http_server(&[]).await;
    let (tx, task) = start_sink(&format!(
        r#"type = "http"
uri = "http://127.0.0.1:{port}/hook"
batch_max_records = 3
batch_timeout_ms = 100
headers = {{ Authorization = "Bearer s3cret", "X-Fluxpipe" = "yes" }}
"#
    ));
    let t0 = Instant::now();
    for n in 0..7 {
        tx.send(rec(n)).await.unwrap();
    }
    let batches: Vec<Request> = [
        next_request(&mut reqs).await,
        next_request(&mut reqs).await,
        next_request(&mut reqs).await,
    ]
    .into();
    assert_eq!(batches[0].ids(), [0, 1, 2]);
    assert_eq!(batches[1].ids(), [3, 4, 5]);
    // The partial batch goes after batch_timeout_ms.
    assert_eq!(batches[2].ids(), [6]);
    assert!(t0.elapsed() >= Duration::from_millis(90));
    for b in &batches {
        assert_eq!(b.path, "/hook");
        assert_eq!(b.headers["content-type"], "application/json");
        assert_eq!(b.headers["authorization"], "Bearer s3cret");
        assert_eq!(b.headers["x-fluxpipe"], "yes");
    }
    drop(tx);
    finish(task).await.unwrap();
    assert!(reqs.try_recv().is_err(), "no more requests");
    let c = counters(&snap);
    assert_eq!(count(&c, "fluxpipe_records_sent_total"), 7);
    assert_eq!(count(&c, "fluxpipe_sink_errors_total"), 0);
}

#[tokio::test]
async fn http_sink_retries_5xx_and_429_then_delivers_once() {
    let (recorder, snap) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let (port, mut reqs) = http_server(&[500, 429, 503, 200]).await;
    let (tx, task) = start_sink(&format!(
        "type = \"http\"\nuri = \"http://127.0.0.1:{port}/\"\nbatch_max_records = 2\nretry_max_secs = 5\n"
    ));
    tx.send(rec(1)).await.unwrap();
    tx.send(rec(2)).await.unwrap();
    let first = next_request(&mut reqs).await;
    for _ in 0..3 {
        let again = next_request(&mut reqs).await;
        assert_eq!(again.body, first.body);
    }
    assert_eq!(first.ids(), [1, 2]);
    // Delivered: not sent again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(reqs.try_recv().is_err(), "batch sent again after a 200");
    drop(tx);
    finish(task).await.unwrap();
    let c = counters(&snap);
    assert_eq!(count(&c, "fluxpipe_records_sent_total"), 2);
    assert_eq!(count(&c, "fluxpipe_sink_errors_total"), 0);
}

#[tokio::test]
async fn http_sink_drops_a_rejected_batch_without_retrying() {
    let (recorder, snap) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let (port, mut reqs) = http_server(&[400, 200]).await;
    let (tx, task) = start_sink(&format!(
        "type = \"http\"\nuri = \"http://127.0.0.1:{port}/\"\nbatch_max_records = 2\nretry_max_secs = 5\n"
    ));
    tx.send(rec(1)).await.unwrap();
    tx.send(rec(2)).await.unwrap();
    assert_eq!(next_request(&mut reqs).await.ids(), [1, 2]);
    tx.send(rec(3)).await.unwrap();
    tx.send(rec(4)).await.unwrap();
    // The next request is the next batch, not the rejected one again.
    assert_eq!(next_request(&mut reqs).await.ids(), [3, 4]);
    drop(tx);
    finish(task).await.unwrap();
    assert!(reqs.try_recv().is_err());
    let c = counters(&snap);
    assert_eq!(count(&c, "fluxpipe_sink_errors_total"), 1);
    assert_eq!(count(&c, "fluxpipe_records_dropped_total"), 2);
    assert_eq!(count(&c, "fluxpipe_records_sent_total"), 2);
}

#[tokio::test]
async fn http_sink_drops_after_retry_max_secs() {
    let (recorder, snap) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let (port, mut reqs) = http_server(&[503; 100]).await;
    let (tx, task) = start_sink(&format!(
        "type = \"http\"\nuri = \"http://127.0.0.1:{port}/\"\nbatch_max_records = 1\nretry_max_secs = 0.5\n"
    ));
    let t0 = Instant::now();
    tx.send(rec(1)).await.unwrap();
    drop(tx);
    finish(task).await.unwrap();
    // Tries at about 0, 0.1, 0.3 and, the last pause cut short, 0.5 s:
    // retried until the deadline, then dropped, not retried for ever.
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_millis(500),
        "gave up early: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    let mut tries = 0;
    while reqs.try_recv().is_ok() {
        tries += 1;
    }
    // (Fewer on a very slow machine, never more.)
    assert!((2..=4).contains(&tries), "{tries} tries");
    let c = counters(&snap);
    assert_eq!(count(&c, "fluxpipe_sink_errors_total"), 1);
    assert_eq!(count(&c, "fluxpipe_records_dropped_total"), 1);
}

#[tokio::test]
async fn http_sink_retries_refused_connections_over_http_and_https() {
    let (recorder, snap) = recorder();
    let _guard = metrics::set_default_local_recorder(&recorder);
    for scheme in ["http", "https"] {
        let port = free_tcp_port();
        let (tx, task) = start_sink(&format!(
            "type = \"http\"\nuri = \"{scheme}://127.0.0.1:{port}/\"\nretry_max_secs = 0.3\n"
        ));
        tx.send(rec(1)).await.unwrap();
        drop(tx);
        finish(task).await.unwrap();
    }
    let c = counters(&snap);
    assert_eq!(count(&c, "fluxpipe_sink_errors_total"), 2);
}

#[tokio::test]
async fn http_sink_sends_its_pending_batch_at_shutdown() {
    let (port, mut reqs) = http_server(&[]).await;
    let (tx, task) = start_sink(&format!(
        "type = \"http\"\nuri = \"http://127.0.0.1:{port}/\"\nbatch_timeout_ms = 60000\n"
    ));
    tx.send(rec(1)).await.unwrap();
    tx.send(rec(2)).await.unwrap();
    drop(tx);
    assert_eq!(next_request(&mut reqs).await.ids(), [1, 2]);
    finish(task).await.unwrap();
}

/// A summary the `http` sink gives up on (rejected) holds the pipeline's
/// positions back: no checkpoint passes it, so the next run reads its job
/// again and the receiver gets it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_an_http_sink_gave_up_on_is_read_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let mut text = String::new();
    for id in 1..=6 {
        for line in journal(id) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    std::fs::write(&input, text).unwrap();
    let config = |port: u16| {
        config::parse(&format!(
            r#"
data_dir = "{d}/state"
[checkpoint]
interval_secs = 0.1

[sources.f]
type = "file"
include = ["{input}"]
poll_interval_ms = 20
cluster = "c"

[sinks.hook]
type = "http"
uri = "http://127.0.0.1:{port}/"
inputs = ["jobs"]
batch_max_records = 1
retry_max_secs = 0.5
"#,
            d = dir.path().display(),
            input = input.display(),
        ))
        .unwrap_or_else(|e| panic!("{e:?}"))
    };
    let run = |port: u16| {
        let token = CancellationToken::new();
        (
            token.clone(),
            tokio::spawn(topology::run(config(port), token)),
        )
    };
    let stop = |(token, task): (CancellationToken, JoinHandle<anyhow::Result<()>>)| async move {
        token.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("pipeline did not stop")
            .unwrap()
    };

    // Run 1: the first summary is rejected, the other five are taken.
    let (port, mut reqs) = http_server(&[400]).await;
    let first = run(port);
    let mut seen = Vec::new();
    while seen.len() < 6 {
        seen.extend(next_request(&mut reqs).await.ids());
    }
    let rejected = seen[0];
    // Rounds come and fail for a while: none may move past the record.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Not a clean stop: a record was left (it exits non-zero, saying so).
    let left = stop(first).await.expect_err("run 1 leaves a record");
    assert!(
        left.to_string()
            .contains("records not delivered at shutdown: 1;"),
        "{left:#}"
    );

    // Run 2: everything is taken; the rejected job's summary comes again.
    let (port, mut reqs) = http_server(&[]).await;
    let second = run(port);
    let mut again = Vec::new();
    while !again.contains(&rejected) {
        again.extend(next_request(&mut reqs).await.ids());
    }
    stop(second).await.expect("run 2 stops cleanly");
}
