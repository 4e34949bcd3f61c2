//! The file source against real files in a temporary folder: the source
//! runs as a task, a test writes, renames and truncates files meanwhile and
//! reads what reached the router (and the dead-letter stream).

use super::*;
use crate::channels::fanout::{Outputs, SinkRx, Subscription, WhenFull};
use crate::channels::router::{Routed, Router, ShardMsg};
use crate::checkpoint::link::CheckpointLink;
use crate::decode::Body;
use crate::output::StreamSet;
use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::io::Write;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

fn fast() -> Tuning {
    Tuning {
        rotate_grace: Duration::from_millis(300),
        ..Tuning::default()
    }
}

struct Running {
    records: mpsc::Receiver<ShardMsg>,
    /// Records received beyond what `take` was asked for (lines come in
    /// batches).
    extra: std::collections::VecDeque<Routed>,
    dead: SinkRx,
    token: CancellationToken,
    task: tokio::task::JoinHandle<Result<String>>,
    /// Where the positions go when the source stops.
    positions: PathBuf,
}

/// Where the tests keep a source's positions between runs (the pipeline
/// keeps them in its checkpoint).
fn positions_file(dir: &Path) -> PathBuf {
    dir.join("positions.json")
}

/// A source config and context whose positions live in `dir`.
fn context(
    dir: &Path,
    keys: &str,
) -> (
    FileSourceConfig,
    SourceContext,
    mpsc::Receiver<ShardMsg>,
    SinkRx,
) {
    context_with_queue(dir, keys, 4096)
}

/// The same with a shard queue of `queue` messages.
fn context_with_queue(
    dir: &Path,
    keys: &str,
    queue: usize,
) -> (
    FileSourceConfig,
    SourceContext,
    mpsc::Receiver<ShardMsg>,
    SinkRx,
) {
    let config: FileSourceConfig =
        toml::from_str(&format!("poll_interval_ms = 20\n{keys}")).expect("source config");
    let (tx, records) = mpsc::channel(queue);
    let sink = Subscription {
        streams: StreamSet::from_iter([crate::output::OutputStream::DeadLetter]),
        when_full: WhenFull::Block,
        buffer: crate::sinks::config::default_buffer(),
    };
    let (outputs, mut rxs) = Outputs::new([("dead", sink)]);
    let ctx = SourceContext::new(
        "files",
        0,
        config.decode(),
        Router::new(vec![tx]),
        outputs,
        CancellationToken::new(),
        CheckpointLink::detached(std::fs::read_to_string(positions_file(dir)).ok()),
    );
    (config, ctx, records, rxs.remove(0))
}

/// Start a file source whose positions live in `dir`.
fn start(dir: &Path, keys: &str, tuning: Tuning) -> Running {
    let (config, ctx, records, dead) = context(dir, keys);
    Running {
        records,
        extra: Default::default(),
        dead,
        token: ctx.shutdown.clone(),
        task: tokio::spawn(run_tuned(config, ctx, tuning)),
        positions: positions_file(dir),
    }
}

/// The records in a shard message (the tests send no barriers).
fn records(msg: ShardMsg) -> Vec<Routed> {
    match msg {
        ShardMsg::Record(r) => vec![r],
        ShardMsg::Records(batch) => batch,
        other => panic!("unexpected {other:?}"),
    }
}

fn name(r: &Routed) -> String {
    match &r.record.body {
        Body::Event(e) => e.name.to_string(),
        Body::R(_) => "R".into(),
        Body::JobSpec(read) => format!("jobspec {}", read.spec.name().unwrap_or("?")),
        other => format!("{other:?}"),
    }
}

impl Running {
    /// The next `n` records (fails after 5 s).
    async fn take(&mut self, n: usize) -> Vec<Routed> {
        let mut out = Vec::new();
        while out.len() < n
            && let Some(r) = self.extra.pop_front()
        {
            out.push(r);
        }
        while out.len() < n {
            let names: Vec<String> = out.iter().map(name).collect();
            let r = timeout(Duration::from_secs(5), self.records.recv())
                .await
                .unwrap_or_else(|_| panic!("waited 5 s for {n} records, got {names:?}"))
                .expect("router closed");
            out.extend(records(r));
        }
        self.extra.extend(out.drain(n..));
        out
    }

    async fn names(&mut self, n: usize) -> Vec<String> {
        self.take(n).await.iter().map(name).collect()
    }

    async fn name_set(&mut self, n: usize) -> BTreeSet<String> {
        self.names(n).await.into_iter().collect()
    }

    /// Nothing more arrives for `ms`.
    async fn quiet(&mut self, ms: u64) {
        if let Some(r) = self.extra.front() {
            panic!("unexpected record {}", name(r));
        }
        if let Ok(Some(r)) = timeout(Duration::from_millis(ms), self.records.recv()).await {
            let r = records(r);
            let names: Vec<String> = r.iter().map(name).collect();
            panic!("unexpected records {names:?}");
        }
    }

    async fn dead_letter(&mut self) -> serde_json::Value {
        let rec = timeout(Duration::from_secs(5), self.dead.recv())
            .await
            .expect("no dead letter within 5 s")
            .expect("dead letters closed");
        serde_json::from_str(rec.line()).expect("dead letter JSON")
    }

    /// Stop the source and keep its final positions for the next start.
    async fn stop(self) -> Result<()> {
        self.token.cancel();
        let positions = timeout(Duration::from_secs(5), self.task)
            .await
            .expect("source did not stop within 5 s")
            .expect("source task panicked")?;
        std::fs::write(&self.positions, positions)?;
        Ok(())
    }
}

fn ev(n: u32) -> String {
    format!("{{\"timestamp\":{n}.5,\"name\":\"e{n}\"}}\n")
}

fn evs(ns: impl IntoIterator<Item = u32>) -> String {
    ns.into_iter().map(ev).collect()
}

fn set(ns: impl IntoIterator<Item = u32>) -> BTreeSet<String> {
    ns.into_iter().map(|n| format!("e{n}")).collect()
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// Keys for plain `*.log` files in `dir`, read as resource eventlogs.
fn logs(dir: &Path) -> String {
    format!(
        "include = [\"{}/*.log\"]\nstream = \"resource\"\n",
        dir.display()
    )
}

#[tokio::test]
async fn appended_lines_are_tailed_and_partial_lines_held() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    append(&a, &evs(1..=2));
    let mut src = start(dir.path(), &logs(dir.path()), fast());
    assert_eq!(src.names(2).await, ["e1", "e2"]);

    let writer = {
        let a = a.clone();
        tokio::spawn(async move {
            for n in 3..=5 {
                append(&a, &ev(n));
                sleep(Duration::from_millis(30)).await;
            }
        })
    };
    assert_eq!(src.names(3).await, ["e3", "e4", "e5"]);
    writer.await.unwrap();

    // Half a line: nothing until its newline comes.
    append(&a, "{\"timestamp\":6.5,");
    src.quiet(200).await;
    append(&a, "\"name\":\"e6\"}\n");
    assert_eq!(src.names(1).await, ["e6"]);
    src.quiet(100).await;
    src.stop().await.unwrap();
}

#[tokio::test]
async fn between_walks_appends_are_read_and_rewrites_wait() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    append(&a, &ev(1));
    // Walk once, then (practically) never again: only the checks of known
    // files between walks see anything.
    let tuning = Tuning {
        walk_cost_factor: 1_000_000,
        ..fast()
    };
    let mut src = start(dir.path(), &logs(dir.path()), tuning);
    assert_eq!(src.names(1).await, ["e1"]);
    append(&a, &evs(2..=3));
    assert_eq!(src.names(2).await, ["e2", "e3"]);
    // A new file waits for a walk.
    append(&dir.path().join("b.log"), &ev(9));
    // Rewritten in place, longer, another beginning: not read as the rest
    // of the old file.
    std::fs::write(&a, evs(20..=25)).unwrap();
    src.quiet(300).await;
    src.stop().await.unwrap();
}

/// The original race, many times over: each file is appended to, and
/// rewritten in place (longer, another beginning) the moment its new lines
/// arrive, while the source may be reading on. Walks are off, so nothing
/// may be read at all after a rewrite.
#[tokio::test]
async fn between_walks_rewrites_racing_reads_are_never_read_on() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = (0..40)
        .map(|i| dir.path().join(format!("f{i:02}.log")))
        .collect();
    for (i, f) in files.iter().enumerate() {
        append(f, &ev(i as u32 * 100 + 1));
    }
    let tuning = Tuning {
        walk_cost_factor: 1_000_000,
        ..fast()
    };
    let mut src = start(dir.path(), &logs(dir.path()), tuning);
    assert_eq!(
        src.name_set(files.len()).await,
        (0..files.len() as u32)
            .map(|i| format!("e{}", i * 100 + 1))
            .collect()
    );
    for (i, f) in files.iter().enumerate() {
        let base = i as u32 * 100;
        append(f, &evs(base + 2..=base + 3));
        assert_eq!(
            src.names(2).await,
            [format!("e{}", base + 2), format!("e{}", base + 3)]
        );
        std::fs::write(f, evs(base + 20..=base + 29)).unwrap();
    }
    src.quiet(300).await;
    src.stop().await.unwrap();
}

/// A file source driven step by step: walk, check known files, read.
struct Steps {
    src: FileSource,
    records: mpsc::Receiver<ShardMsg>,
    first: bool,
}

impl Steps {
    fn new(dir: &Path, tuning: Tuning) -> Self {
        let (config, ctx, records, _dead) = context(dir, &logs(dir));
        let scanner = Scanner::new(&config, true, 1024).unwrap();
        let src = FileSource::new(
            ctx,
            tuning,
            ReadFrom::Beginning,
            scanner,
            CheckpointFile::default(),
        );
        Steps {
            src,
            records,
            first: true,
        }
    }

    async fn walk(&mut self) {
        let found = self.src.scan().await.unwrap();
        assert!(self.src.reconcile(found, self.first).await.is_ok());
        self.first = false;
    }

    async fn check(&mut self) {
        self.src.check_known().await.unwrap();
    }

    /// Read passes until nothing is left; the names of what was read.
    async fn read(&mut self) -> Vec<String> {
        for _ in 0..100 {
            match self.src.read_pass().await {
                Ok(true) => {}
                Ok(false) => break,
                Err(Stop) => panic!("source stopped"),
            }
        }
        self.src.housekeeping();
        let mut out = Vec::new();
        while let Ok(r) = self.records.try_recv() {
            out.extend(records(r).iter().map(name));
        }
        out
    }

    /// One read pass; the names of what was read.
    async fn read_once(&mut self) -> Vec<String> {
        assert!(self.src.read_pass().await.is_ok());
        self.src.housekeeping();
        let mut out = Vec::new();
        while let Ok(r) = self.records.try_recv() {
            out.extend(records(r).iter().map(name));
        }
        out
    }
}

fn names_of(ns: impl IntoIterator<Item = u32>) -> Vec<String> {
    ns.into_iter().map(|n| format!("e{n}")).collect()
}

/// The race forced: the check between walks sees the file grown with its
/// beginning unchanged, then the file is rewritten in place (longer, another
/// beginning) before the read. Open, idle-closed, and mid-turn readers.
#[tokio::test]
async fn a_rewrite_after_the_check_is_not_read_as_the_rest_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Steps::new(
        dir.path(),
        Tuning {
            lines_per_turn: 1,
            ..fast()
        },
    );
    for i in 0..30u32 {
        let base = i * 100;
        let f = dir.path().join(format!("f{i:02}.log"));
        append(&f, &ev(base + 1));
        s.walk().await;
        assert_eq!(s.read().await, names_of([base + 1]));
        append(&f, &evs(base + 2..=base + 3));
        s.check().await;
        match i % 3 {
            // The reader is open at the old end.
            0 => {}
            // Closed as idle: reopened by path, same inode.
            1 => {
                s.src.tuning.idle_close = Duration::ZERO;
                s.src.housekeeping();
                s.src.tuning.idle_close = fast().idle_close;
                assert!(s.src.tracked.values().all(|t| t.reader.is_none()));
            }
            // In the middle of a turn: e(base+2) handed on, e(base+3) read
            // (before the rewrite) and not yet handed on.
            _ => assert_eq!(s.read_once().await, names_of([base + 2])),
        }
        std::fs::write(&f, evs(base + 20..=base + 25)).unwrap();
        let got = s.read().await;
        let want = if i % 3 == 2 {
            names_of([base + 3])
        } else {
            vec![]
        };
        assert_eq!(got, want, "round {i}");
        // The old entry is gone; the next walk reads the new content once.
        s.check().await;
        assert_eq!(s.read().await, Vec::<String>::new(), "round {i}");
        s.walk().await;
        assert_eq!(s.read().await, names_of(base + 20..=base + 25), "round {i}");
        s.walk().await;
        assert_eq!(s.read().await, Vec::<String>::new(), "round {i}");
    }
}

/// Caught in the middle of a rewrite: no whole first line yet, but longer
/// than what was read. Nothing is read on; once whole, another beginning is
/// a new file (at the next walk), the same beginning is read again.
#[tokio::test]
async fn a_file_caught_mid_rewrite_is_not_read_on() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let mut s = Steps::new(dir.path(), fast());
    append(&a, &ev(1));
    s.walk().await;
    assert_eq!(s.read().await, names_of([1]));
    append(&a, &evs(2..=3));
    s.check().await;
    // Truncated and half written: a first line with no end yet.
    let head = format!(
        "{{\"timestamp\":20.5,\"name\":\"e20\",\"pad\":\"{}",
        "x".repeat(200)
    );
    std::fs::write(&a, &head).unwrap();
    assert_eq!(s.read().await, Vec::<String>::new());
    append(&a, &format!("\"}}\n{}", evs(21..=22)));
    s.check().await;
    assert_eq!(s.read().await, Vec::<String>::new());
    s.walk().await;
    assert_eq!(s.read().await, names_of(20..=22));

    // The same again, but the rewrite keeps the first line: read again
    // from the start, as a truncation.
    let b = dir.path().join("b.log");
    append(&b, &ev(30));
    s.walk().await;
    assert_eq!(s.read().await, names_of([30]));
    append(&b, &evs(31..=33));
    s.check().await;
    let long = format!("{}{}", ev(30), evs(40..=45));
    std::fs::write(&b, &long[..20]).unwrap();
    assert_eq!(s.read().await, Vec::<String>::new());
    std::fs::write(&b, &long).unwrap();
    s.check().await;
    let mut want = names_of([30]);
    want.extend(names_of(40..=45));
    assert_eq!(s.read().await, want);
    s.walk().await;
    assert_eq!(s.read().await, Vec::<String>::new());
}

/// Shrunk below the read position with the same beginning (read again
/// from the start), then rewritten with another beginning before that
/// read: not read under the old fingerprint, so not read twice.
#[tokio::test]
async fn a_truncated_file_rewritten_before_it_is_read_again_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let mut s = Steps::new(dir.path(), fast());
    append(&a, &evs(1..=3));
    s.walk().await;
    assert_eq!(s.read().await, names_of(1..=3));
    std::fs::write(&a, ev(1)).unwrap();
    s.check().await;
    std::fs::write(&a, ev(20)).unwrap();
    assert_eq!(s.read().await, Vec::<String>::new());
    s.walk().await;
    assert_eq!(s.read().await, names_of([20]));
    s.walk().await;
    assert_eq!(s.read().await, Vec::<String>::new());
}

#[tokio::test]
async fn rotation_reads_the_old_file_to_its_end_then_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let rotated = dir.path().join("a.log.1"); // not matched by *.log
    append(&a, &evs(1..=3));
    let mut src = start(dir.path(), &logs(dir.path()), fast());
    assert_eq!(src.names(3).await, ["e1", "e2", "e3"]);

    append(&a, &evs(4..=5));
    std::fs::rename(&a, &rotated).unwrap();
    append(&a, &evs(6..=7));
    // The writer still holds the old file for a moment.
    append(&rotated, &ev(8));
    assert_eq!(src.name_set(5).await, set(4..=8));
    // Past the rotation grace: the old file is retired, nothing is read twice.
    src.quiet(600).await;
    append(&a, &ev(9));
    assert_eq!(src.names(1).await, ["e9"]);
    src.quiet(100).await;
    src.stop().await.unwrap();
}

#[tokio::test]
async fn a_file_renamed_within_the_pattern_is_followed_not_reread() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let b = dir.path().join("b.log");
    append(&a, &evs(1..=2));
    let mut src = start(dir.path(), &logs(dir.path()), fast());
    assert_eq!(src.names(2).await, ["e1", "e2"]);
    std::fs::rename(&a, &b).unwrap();
    src.quiet(200).await;
    append(&b, &ev(3));
    assert_eq!(src.names(1).await, ["e3"]);
    // A copy of the same file elsewhere is the same file: not read again.
    std::fs::copy(&b, dir.path().join("copy.log")).unwrap();
    src.quiet(200).await;
    src.stop().await.unwrap();
}

#[tokio::test]
async fn truncated_or_replaced_files_are_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    append(&a, &evs(1..=3));
    let mut src = start(dir.path(), &logs(dir.path()), fast());
    assert_eq!(src.names(3).await, ["e1", "e2", "e3"]);

    // Replaced (new file renamed over it) by a shorter one.
    let tmp = dir.path().join("a.tmp");
    std::fs::write(&tmp, evs(10..=11)).unwrap();
    std::fs::rename(&tmp, &a).unwrap();
    assert_eq!(src.names(2).await, ["e10", "e11"]);
    src.quiet(100).await;

    // Truncated in place to a shorter content with the same first line.
    std::fs::write(&a, ev(10)).unwrap();
    assert_eq!(src.names(1).await, ["e10"]);
    src.quiet(100).await;

    // Rewritten in place, longer, with another first line.
    std::fs::write(&a, evs(20..=23)).unwrap();
    assert_eq!(src.names(4).await, ["e20", "e21", "e22", "e23"]);
    src.quiet(200).await;
    src.stop().await.unwrap();
}

#[tokio::test]
async fn a_growing_dump_tree_is_followed_with_ids_from_paths() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("dump");
    let job_a = dump.join("job/0000/000a/0000/0000");
    std::fs::create_dir_all(&job_a).unwrap();
    append(&job_a.join("eventlog"), &ev(1));
    // Not an eventlog: never read.
    append(&job_a.join("label"), &ev(99));
    // A document read whole, as R is.
    std::fs::write(
        job_a.join("jobspec.json"),
        r#"{"version":1,"resources":[{"type":"slot","count":1,"with":[{"type":"core","count":1}]}],"tasks":[{"command":["/bin/hostname"]}],"attributes":{"system":{"duration":0}}}"#,
    )
    .unwrap();
    let keys = format!("include = [\"{}/**\"]\n", dump.display());
    let mut src = start(dir.path(), &keys, fast());
    let mut got = src.take(2).await;
    got.sort_by_key(name);
    assert_eq!(name(&got[1]), "jobspec hostname");
    assert_eq!(got[1].record.id, got[0].record.id);
    assert_eq!(name(&got[0]), "e1");
    assert_eq!(got[0].record.stream, EventStream::Job);
    assert_eq!(
        got[0].record.id,
        Some(JobId::parse("0000.000a.0000.0000").unwrap())
    );
    src.quiet(100).await;

    // A new job appears later, with its R and its exec eventlog.
    let job_b = dump.join("job/0000/000b/4100/0000");
    let id_b = JobId::parse("job/0000/000b/4100/0000").unwrap();
    std::fs::create_dir_all(job_b.join("guest/exec")).unwrap();
    append(&job_b.join("eventlog"), &ev(2));
    append(&job_b.join("guest/exec/eventlog"), &ev(3));
    std::fs::write(
        job_b.join("R"),
        r#"{"version":1,"execution":{"expiration":100.0}}"#,
    )
    .unwrap();
    let mut got: Vec<(String, EventStream, Option<JobId>)> = src
        .take(3)
        .await
        .iter()
        .map(|r| (name(r), r.record.stream, r.record.id))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("R".to_string(), EventStream::Job, Some(id_b)),
            ("e2".to_string(), EventStream::Job, Some(id_b)),
            ("e3".to_string(), EventStream::Exec, Some(id_b)),
        ]
    );

    // R rewritten with the same content: not sent again; changed: sent.
    std::fs::write(
        job_b.join("R"),
        r#"{"version":1,"execution":{"expiration":100.0}}"#,
    )
    .unwrap();
    src.quiet(200).await;
    std::fs::write(
        job_b.join("R"),
        r#"{"version":1,"execution":{"expiration":200.0}}"#,
    )
    .unwrap();
    let got = src.take(1).await;
    match &got[0].record.body {
        Body::R(v) => assert_eq!(v.to_value()["execution"]["expiration"], 200.0),
        other => panic!("expected R, got {other:?}"),
    }
    src.quiet(100).await;
    src.stop().await.unwrap();
}

#[tokio::test]
async fn a_restart_resumes_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let b = dir.path().join("b.log");
    append(&a, &evs(1..=3));
    let mut src = start(dir.path(), &logs(dir.path()), fast());
    assert_eq!(src.names(3).await, ["e1", "e2", "e3"]);
    // Stopped in the middle of a line.
    append(&a, "{\"timestamp\":4.5,");
    src.quiet(100).await;
    src.stop().await.unwrap();

    let text = std::fs::read_to_string(positions_file(dir.path())).unwrap();
    let cp: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(cp["files"][0]["position"], evs(1..=3).len());
    assert_eq!(cp["files"][0]["lines"], 3);

    append(&a, "\"name\":\"e4\"}\n");
    append(&a, &ev(5));
    append(&b, &ev(6));
    let mut src = start(dir.path(), &logs(dir.path()), fast());
    assert_eq!(src.name_set(3).await, set(4..=6));
    src.quiet(200).await;
    src.stop().await.unwrap();

    // And once more with nothing new: nothing at all.
    let mut src = start(dir.path(), &logs(dir.path()), fast());
    src.quiet(200).await;
    src.stop().await.unwrap();
}

/// Lines are handed on in batches: those held when the source stops (the
/// pipeline full) are not counted as read, and the next start reads them.
#[tokio::test]
async fn lines_held_at_shutdown_are_read_again() {
    let dir = tempfile::tempdir().unwrap();
    append(&dir.path().join("a.log"), &evs(1..=500));
    // A queue of one message: the source soon waits with lines held.
    let (config, ctx, rx, dead) = context_with_queue(dir.path(), &logs(dir.path()), 1);
    let mut src = Running {
        records: rx,
        extra: Default::default(),
        dead,
        token: ctx.shutdown.clone(),
        task: tokio::spawn(run_tuned(config, ctx, fast())),
        positions: positions_file(dir.path()),
    };
    let first = src.take(70).await;
    // Everything handed on until the source stops: what was queued too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    src.token.cancel();
    let mut seen: Vec<String> = first.iter().map(name).collect();
    seen.extend(src.extra.drain(..).map(|r| name(&r)));
    let task = std::mem::replace(&mut src.task, tokio::spawn(async { Ok(String::new()) }));
    let positions = timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    while let Ok(msg) = src.records.try_recv() {
        seen.extend(records(msg).iter().map(name));
    }
    assert!(
        seen.len() < 500,
        "the source was held up: {} read",
        seen.len()
    );
    let cp: serde_json::Value = serde_json::from_str(&positions).unwrap();
    let n = seen.len();
    assert_eq!(cp["files"][0]["lines"], n, "counted: what was handed on");
    assert_eq!(cp["files"][0]["position"], evs(1..=n as u32).len());
    std::fs::write(positions_file(dir.path()), positions).unwrap();

    let mut src = start(dir.path(), &logs(dir.path()), fast());
    seen.extend(src.names(500 - n).await);
    assert_eq!(seen, names_of(1..=500), "each line once, in order");
    src.quiet(200).await;
    src.stop().await.unwrap();
}

#[tokio::test]
async fn read_from_end_skips_only_files_without_a_checkpoint_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a.log"),
        dir.path().join("b.log"),
        dir.path().join("c.log"),
    );
    append(&a, &evs(1..=2));
    let keys = format!("{}read_from = \"end\"\n", logs(dir.path()));
    let mut src = start(dir.path(), &keys, fast());
    src.quiet(200).await;
    append(&a, &ev(3));
    assert_eq!(src.names(1).await, ["e3"]);
    // Discovered later: a new file, read from its start.
    append(&b, &evs(4..=5));
    assert_eq!(src.names(2).await, ["e4", "e5"]);
    src.stop().await.unwrap();

    append(&a, &ev(6));
    append(&b, &ev(7));
    append(&c, &ev(8)); // exists at startup without a checkpoint: skipped
    let mut src = start(dir.path(), &keys, fast());
    assert_eq!(src.name_set(2).await, set(6..=7));
    src.quiet(200).await;
    append(&c, &ev(9));
    assert_eq!(src.names(1).await, ["e9"]);
    src.stop().await.unwrap();
}

#[tokio::test]
async fn long_and_bad_lines_are_dead_letters_and_reading_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let text = format!("{}{}\nnot json\n{}", ev(1), "x".repeat(200), ev(2));
    append(&a, &text);
    let keys = format!("{}max_line_bytes = 64\n", logs(dir.path()));
    let mut src = start(dir.path(), &keys, fast());
    assert_eq!(src.names(2).await, ["e1", "e2"]);
    let long = src.dead_letter().await;
    assert_eq!(long["location"], format!("{}:2", a.display()));
    assert!(
        long["error"].as_str().unwrap().contains("max_line_bytes"),
        "{long}"
    );
    assert_eq!(long["line"].as_str().unwrap().len(), 64);
    let bad = src.dead_letter().await;
    assert_eq!(bad["location"], format!("{}:3", a.display()));
    src.stop().await.unwrap();
}

#[tokio::test]
async fn corrupt_positions_are_an_error_naming_the_source() {
    let dir = tempfile::tempdir().unwrap();
    append(&dir.path().join("a.log"), &ev(1));
    std::fs::write(positions_file(dir.path()), "{\"version\":1,\"files\":[{").unwrap();
    let mut src = start(dir.path(), &logs(dir.path()), fast());
    let err = timeout(Duration::from_secs(5), &mut src.task)
        .await
        .expect("source should fail at once")
        .unwrap()
        .expect_err("a corrupt checkpoint must be an error");
    let msg = format!("{err:#}");
    assert!(msg.contains("source files"), "{msg}");
    assert!(msg.contains("corrupt"), "{msg}");
    src.quiet(50).await;
}

#[tokio::test]
async fn many_files_with_few_descriptors_lose_and_repeat_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = (0..8)
        .map(|i| dir.path().join(format!("f{i}.log")))
        .collect();
    for (i, f) in files.iter().enumerate() {
        append(f, &ev(i as u32));
    }
    let tuning = Tuning {
        max_open: 2,
        idle_close: Duration::from_millis(40),
        lines_per_turn: 3,
        ..fast()
    };
    let mut src = start(dir.path(), &logs(dir.path()), tuning);
    assert_eq!(src.name_set(8).await, set(0..8));
    for round in 1..=3u32 {
        for (i, f) in files.iter().enumerate() {
            // Several lines per file, more than one turn's worth.
            let base = round * 1000 + i as u32 * 10;
            append(f, &evs(base..base + 5));
        }
        let want: BTreeSet<String> = (0..8u32)
            .flat_map(|i| {
                let base = round * 1000 + i * 10;
                set(base..base + 5)
            })
            .collect();
        assert_eq!(src.name_set(40).await, want);
        sleep(Duration::from_millis(60)).await; // let files go idle and close
    }
    src.quiet(200).await;
    src.stop().await.unwrap();
}

#[tokio::test]
async fn open_files_stay_under_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..10 {
        append(&dir.path().join(format!("f{i}.log")), &evs([i, 100 + i]));
    }
    let (config, ctx, mut records, _dead) = context(dir.path(), &logs(dir.path()));
    let tuning = Tuning {
        max_open: 3,
        ..fast()
    };
    let scanner = Scanner::new(&config, true, 1024).unwrap();
    let mut src = FileSource::new(
        ctx,
        tuning,
        ReadFrom::Beginning,
        scanner,
        CheckpointFile::default(),
    );
    let found = src.scan().await.unwrap();
    assert!(src.reconcile(found, true).await.is_ok());
    assert_eq!(src.tracked.len(), 10);
    assert!(matches!(src.read_pass().await, Ok(false)));
    let open = src.tracked.values().filter(|t| t.reader.is_some()).count();
    assert_eq!(open, src.open_count);
    assert!(open <= 3, "{open} files open");
    let mut n = 0;
    while let Ok(msg) = records.try_recv() {
        n += self::records(msg).len();
    }
    assert_eq!(n, 20);
}

#[test]
fn patterns_walk_their_fixed_folder_and_match_any_depth() {
    assert_eq!(base_of("/a/b/**/eventlog"), PathBuf::from("/a/b"));
    assert_eq!(base_of("dump/job/*/x"), PathBuf::from("dump/job"));
    assert_eq!(base_of("*.jsonl"), PathBuf::new());
    assert_eq!(
        base_of("/a/resource.eventlog"),
        PathBuf::from("/a/resource.eventlog")
    );

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for p in [
        "dump/job/0000/000a/0000/0000/eventlog",
        "dump/job/0000/000a/0000/0000/guest/exec/eventlog",
        "dump/job/0000/000a/0000/0000/label",
        "dump/skip/job.0000.000b.0000.0000.eventlog",
        "other/x.jsonl",
    ] {
        std::fs::create_dir_all(d.join(p).parent().unwrap()).unwrap();
        std::fs::write(d.join(p), ev(1)).unwrap();
    }
    let config: FileSourceConfig = toml::from_str(&format!(
        "include = [\"{0}/dump/**/eventlog\", \"{0}/dump/**/*.eventlog\", \"{0}/dump/job/**\"]\nexclude = [\"{0}/dump/skip/**\"]\n",
        d.display()
    ))
    .unwrap();
    let mut scanner = Scanner::new(&config, false, 1024).unwrap();
    assert_eq!(scanner.roots, [d.join("dump")]);
    let found: Vec<String> = scanner
        .scan()
        .iter()
        .map(|f| f.path.strip_prefix(d).unwrap().display().to_string())
        .collect();
    // label matches but is not an eventlog; skip/ is excluded.
    assert_eq!(
        found,
        [
            "dump/job/0000/000a/0000/0000/eventlog",
            "dump/job/0000/000a/0000/0000/guest/exec/eventlog",
        ]
    );
}

#[test]
fn fingerprints_wait_for_a_whole_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    std::fs::write(&p, "").unwrap();
    assert_eq!(fingerprint(&p).unwrap(), None);
    std::fs::write(&p, "{\"timestamp\":1").unwrap();
    assert_eq!(fingerprint(&p).unwrap(), None);
    std::fs::write(&p, "{\"timestamp\":1}\n").unwrap();
    let one = fingerprint(&p).unwrap().unwrap();
    std::fs::write(&p, "{\"timestamp\":1}\nmore\n").unwrap();
    assert_eq!(
        fingerprint(&p).unwrap(),
        Some(one),
        "appends keep the fingerprint"
    );
    std::fs::write(&p, "x".repeat(FINGERPRINT_BYTES + 10)).unwrap();
    assert!(
        fingerprint(&p).unwrap().is_some(),
        "a long first line is cut"
    );
    // Stable across builds: FNV-1a test vector.
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
}

#[test]
fn rotated_names_are_ordered_oldest_first() {
    // Oldest first, whatever order the names sort in.
    let feed = [
        "journal.jsonl.10",
        "journal.jsonl.2",
        "journal.jsonl.1",
        "journal.jsonl-20261123",
        "journal.jsonl-20261124",
        "journal.jsonl-20261124-1795000000",
        "journal.jsonl",
    ];
    let mut shuffled: Vec<&str> = feed.iter().rev().copied().collect();
    shuffled.swap(1, 4);
    shuffled.sort_by_key(|name| rotation_of(name).1);
    assert_eq!(shuffled, feed);
    for name in feed {
        assert_eq!(rotation_of(name).0, "journal.jsonl", "{name}");
    }

    // The forms of a date, compared as numbers.
    let dated = |s: &str| rotation_of(s).1;
    assert_eq!(
        dated("flux.log-2026-11-24"),
        Rotation::Dated(vec![2026, 11, 24])
    );
    assert_eq!(dated("flux.log_20261124"), Rotation::Dated(vec![20261124]));
    assert_eq!(dated("flux.log.20261124"), Rotation::Dated(vec![20261124]));
    assert_eq!(
        dated("flux.log-1795000000"),
        Rotation::Dated(vec![1795000000])
    );
    assert!(dated("a-20261124") < dated("a-20261125"));
    assert!(dated("a-20261124-9") < dated("a-20261124-10"));
    assert!(dated("a.9") > dated("a.10"), "numbers: the larger is older");
    assert_eq!(rotation_of("my-app-20261124").0, "my-app");

    // Not rotated: the name is its own feed.
    for name in [
        "journal.jsonl",
        "a.log-24",  // too few digits for a date
        "a.1234567", // neither a number nor a date
        "incarnation1.job-manager.events-journal.jsonl",
        "2026-11-24.jsonl",
        ".1",
        "a.",
        "a-",
        "a.99999999999999999999999", // longer than any number
    ] {
        let (live, rotation) = rotation_of(name);
        assert_eq!((&*live, rotation), (name, Rotation::Live), "{name}");
    }

    // logrotate's `extension .jsonl`: the suffix before the extension.
    for (name, rotation) in [
        ("journal.2.jsonl", Rotation::Numbered(Reverse(2))),
        ("journal.1.jsonl", Rotation::Numbered(Reverse(1))),
        ("journal-20261124.jsonl", Rotation::Dated(vec![20261124])),
    ] {
        assert_eq!(
            rotation_of(name),
            ("journal.jsonl".into(), rotation),
            "{name}"
        );
    }
    let mut names = vec![
        "journal.jsonl",
        "journal.1.jsonl",
        "journal.3.jsonl",
        "journal.2.jsonl",
    ];
    names.sort_by_key(|n| rotation_of(n).1);
    assert_eq!(
        names,
        [
            "journal.3.jsonl",
            "journal.2.jsonl",
            "journal.1.jsonl",
            "journal.jsonl"
        ]
    );

    // A feed is a folder and a live name.
    let (feed, rotation) = feed_of(Path::new("/d/journal.jsonl.3"));
    assert_eq!(feed, PathBuf::from("/d/journal.jsonl"));
    assert_eq!(rotation, Rotation::Numbered(Reverse(3)));
    assert_ne!(
        feed_of(Path::new("/d/journal.jsonl.1")).0,
        feed_of(Path::new("/e/journal.jsonl.1")).0
    );

    // Rotated names are read as their live names say.
    assert!(matches!(
        classify(Path::new("/d/journal.jsonl.1")),
        PathKind::Lines
    ));
    assert!(matches!(
        classify(Path::new("/d/journal.jsonl-20261124")),
        PathKind::Lines
    ));
    assert!(matches!(
        classify(Path::new("/d/job.0000.000a.0000.0000.eventlog.2")),
        PathKind::Eventlog(Origin { id: Some(_), .. })
    ));
    assert!(matches!(
        classify(Path::new("/d/journal.jsonl.old")),
        PathKind::Other
    ));
    assert!(matches!(
        classify(Path::new("/d/jobspec.json.1")),
        PathKind::Other
    ));
    assert!(matches!(classify(Path::new("/d/a.log.1")), PathKind::Other));
    // Compressed ones are skipped, and said to be.
    assert!(matches!(
        classify(Path::new("/d/journal.jsonl.2.gz")),
        PathKind::Other
    ));
    assert!(is_compressed_log(Path::new("/d/journal.jsonl.2.gz")));
    assert!(is_compressed_log(Path::new(
        "/d/journal.jsonl-20261124.zst"
    )));
    assert!(!is_compressed_log(Path::new("/d/jobspec.json.gz")));
}

/// Keys for `NAME.log` files in `dir` and their rotated names, read as
/// resource eventlogs.
fn rotated_logs(dir: &Path) -> String {
    format!(
        "include = [\"{}/*.log*\"]\nstream = \"resource\"\n",
        dir.display()
    )
}

/// The names of `got` that are in `of`, in the order they came.
fn only(got: &[String], of: &BTreeSet<String>) -> Vec<String> {
    got.iter().filter(|n| of.contains(*n)).cloned().collect()
}

/// A fresh start over rotated files: each feed oldest first, line after
/// line, even with turns of a few lines; the two feeds take turns.
#[tokio::test]
async fn a_feed_is_read_oldest_first_and_feeds_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Feed a: numbered, 3 files; feed b: dated, 3 files. Written newest
    // first, so neither names nor times put them in order.
    append(&d.join("a.log"), &evs(21..=30));
    append(&d.join("a.log.1"), &evs(11..=20));
    append(&d.join("a.log.2"), &evs(1..=10));
    append(&d.join("b.log"), &evs(121..=130));
    append(&d.join("b.log-20261124"), &evs(111..=120));
    append(&d.join("b.log-20261123"), &evs(101..=110));
    let tuning = Tuning {
        lines_per_turn: 2,
        ..fast()
    };
    let mut src = start(d, &rotated_logs(d), tuning);
    let got = src.names(60).await;
    let (a, b) = (set(1..=30), set(101..=130));
    assert_eq!(only(&got, &a), names_of(1..=30), "feed a in order: {got:?}");
    assert_eq!(
        only(&got, &b),
        names_of(101..=130),
        "feed b in order: {got:?}"
    );
    // Side by side: b did not wait for all of a.
    let first_b = got.iter().position(|n| b.contains(n));
    assert!(first_b.is_some_and(|i| i < 10), "feeds take turns: {got:?}");
    src.quiet(200).await;
    src.stop().await.unwrap();
}

/// Positions as an older fluxpipe saved them (the same format), taken
/// before a rotation: after rename + create while stopped, the rotated
/// file is read on from its position to its end, then the new one.
#[tokio::test]
async fn a_restart_reads_the_rotated_file_to_its_end_before_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = d.join("a.log");
    append(&a, &evs(1..=3));
    let fp = fnv1a(ev(1).as_bytes());
    std::fs::write(
        positions_file(d),
        format!(
            "{{\"version\":1,\"files\":[{{\"fingerprint\":\"{fp:016x}\",\"path\":{:?},\"position\":{},\"lines\":3}}],\"documents\":[]}}",
            a.display().to_string(),
            evs(1..=3).len()
        ),
    )
    .unwrap();
    // Stopped: more lines, two rotations, more lines.
    append(&a, &evs(4..=8));
    std::fs::rename(&a, d.join("a.log.1")).unwrap();
    append(&a, &evs(9..=12));
    std::fs::rename(d.join("a.log.1"), d.join("a.log.2")).unwrap();
    std::fs::rename(&a, d.join("a.log.1")).unwrap();
    append(&a, &evs(13..=16));
    let tuning = Tuning {
        lines_per_turn: 1,
        ..fast()
    };
    let mut src = start(d, &rotated_logs(d), tuning);
    assert_eq!(src.names(13).await, names_of(4..=16));
    src.quiet(200).await;
    src.stop().await.unwrap();
    // Its positions cover all three, under their fingerprints.
    let text = std::fs::read_to_string(positions_file(d)).unwrap();
    let cp: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = cp["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "{text}");
    let first = files
        .iter()
        .find(|f| f["fingerprint"] == format!("{fp:016x}"))
        .unwrap();
    assert_eq!(first["path"], d.join("a.log.2").display().to_string());
    assert_eq!(first["lines"], 8);
}

/// copytruncate: the file is copied to its rotated name, truncated, and
/// written again. Reading goes on in the copy from where it was, then the
/// new content: nothing twice, nothing out of order. Whether the reader
/// sees the truncation before the walk sees the copy or not.
#[tokio::test]
async fn copytruncate_reads_on_in_the_copy_then_the_new_content() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = d.join("a.log");
    let (config, ctx, records, _dead) = context(d, &rotated_logs(d));
    let scanner = Scanner::new(&config, true, 1024).unwrap();
    let src = FileSource::new(
        ctx,
        Tuning {
            lines_per_turn: 1,
            ..fast()
        },
        ReadFrom::Beginning,
        scanner,
        CheckpointFile::default(),
    );
    let mut s = Steps {
        src,
        records,
        first: true,
    };
    let copytruncate = |to: &str| {
        std::fs::copy(&a, d.join(to)).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&a)
            .unwrap()
            .set_len(0)
            .unwrap();
    };
    append(&a, &evs(1..=3));
    s.walk().await;
    assert_eq!(s.read().await, names_of(1..=3));

    // The reader finds the file shrunk before a walk finds the copy.
    append(&a, &evs(4..=5));
    s.check().await;
    copytruncate("a.log-20261123");
    append(&a, &ev(6));
    s.check().await;
    assert_eq!(s.read().await, Vec::<String>::new(), "waits for the walk");
    s.walk().await;
    assert_eq!(s.read().await, names_of(4..=6));

    // The walk finds the copy first (the reader closed as idle).
    append(&a, &evs(7..=8));
    s.src.tuning.idle_close = Duration::ZERO;
    s.src.housekeeping();
    s.src.tuning.idle_close = fast().idle_close;
    copytruncate("a.log-20261124");
    append(&a, &evs(9..=10));
    s.walk().await;
    assert_eq!(s.read().await, names_of(7..=10));

    // Truncated in place with nothing copied: read again from the start
    // once it begins the same again.
    append(&a, &evs(11..=12));
    s.check().await;
    assert_eq!(s.read().await, names_of(11..=12));
    std::fs::write(&a, ev(9)).unwrap();
    s.check().await;
    assert_eq!(s.read().await, Vec::<String>::new(), "waits for a look");
    s.check().await;
    assert_eq!(s.read().await, names_of([9]));
    s.walk().await;
    assert_eq!(s.read().await, Vec::<String>::new());
}
