//! Rotated journals through the real binary (issue 28). A generated
//! journal is split across rotated files in each style a site uses: a
//! folder of files rotated already, read from a fresh start (numbered and
//! dated names); rename + create while the journal grows; copytruncate
//! while it grows. `fluxpipe run` is killed with SIGKILL at random moments
//! and started again, over and over, then run to the end. Its output must
//! then equal the whole journal read in one go: every job summary as
//! `fluxpipe replay` gives it, every transition as an uninterrupted run
//! over standard input gives it (records compared whole, `record_id`
//! included), no anomaly, and each record written once: the `file` sink
//! cuts its file back to the checkpoint after a kill. Only a run killed
//! before any checkpoint existed leaves output with nothing to cut back to
//! (the sink then cuts only a torn line): what it wrote may come again, and
//! only that is forgiven.

use crate::common;
use crate::common::{XorShift, read_records, replay, sigterm};

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `fluxpipe`, logging what the file source says at start.
fn fluxpipe() -> Command {
    let mut c = common::fluxpipe();
    c.env("FLUXPIPE_LOG", "fluxpipe=info");
    c
}

/// A generated journal: `jobs` jobs on 32 nodes; its lines.
fn generate(seed: u64, jobs: usize, out: &Path) -> Vec<String> {
    let (seed, jobs) = (seed.to_string(), jobs.to_string());
    common::generate(&["--nodes", "32", "--seed", &seed, "--jobs", &jobs], out);
    std::fs::read_to_string(out)
        .expect("journal")
        .lines()
        .map(|l| format!("{l}\n"))
        .collect()
}

/// What the whole journal gives, read in one go: job summaries from
/// `fluxpipe replay`, and every record (summaries and transitions) of an
/// uninterrupted `fluxpipe run` over standard input, by `record_id`.
struct Expected {
    /// By (cluster, id).
    jobs: BTreeMap<(String, u64), Value>,
    records: BTreeMap<String, Value>,
}

fn expected(dir: &Path, journals: &[(&str, &Path)]) -> Expected {
    let mut want = Expected {
        jobs: BTreeMap::new(),
        records: BTreeMap::new(),
    };
    for (cluster, journal) in journals {
        for r in replay(&["--cluster", cluster], &[journal]) {
            assert_ne!(r["kind"], "anomaly", "the journal breaks no rule: {r}");
            if r["kind"] == "job" {
                let id = r["id"].as_u64().expect("id");
                want.jobs.insert((cluster.to_string(), id), r);
            }
        }
        for r in
            common::stdin_run_records(dir, cluster, journal, &["jobs", "transitions", "anomalies"])
        {
            let id = r["record_id"].as_str().expect("record_id").to_string();
            want.records.insert(id, r);
        }
    }
    let summaries = want.records.values().filter(|r| r["kind"] == "job");
    assert_eq!(summaries.count(), want.jobs.len());
    want
}

/// A pipeline run over and over: its config, output and log.
struct Pipeline {
    config: PathBuf,
    data: PathBuf,
    out: PathBuf,
    log: PathBuf,
    /// Records of the output written by runs killed before any checkpoint
    /// existed: these may be written again.
    unsaved: std::cell::Cell<usize>,
}

/// A pipeline with a `file` source per (cluster, patterns) and a `file`
/// sink of job summaries, transitions and anomalies.
fn pipeline(dir: &Path, name: &str, sources: &[(&str, Vec<PathBuf>)]) -> Pipeline {
    let out = dir.join(format!("{name}-out.jsonl"));
    let data = dir.join(format!("{name}-data"));
    let mut text = format!(
        "data_dir = {data:?}\nworkers = 2\n[checkpoint]\ninterval_secs = 0.05\n\
         [sinks.out]\ntype = \"file\"\npath = {out:?}\n\
         inputs = [\"jobs\", \"transitions\", \"anomalies\"]\n"
    );
    for (cluster, include) in sources {
        text += &format!(
            "[sources.{cluster}]\ntype = \"file\"\ninclude = {include:?}\n\
             poll_interval_ms = 20\ncluster = \"{cluster}\"\n"
        );
    }
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, text).expect("config");
    Pipeline {
        config,
        data,
        out,
        log: dir.join(format!("{name}.log")),
        unsaved: std::cell::Cell::new(0),
    }
}

impl Pipeline {
    fn start(&self) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        fluxpipe()
            .args(["run", "--config"])
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fluxpipe")
    }

    /// Jobs summarized so far (a repeat counted once).
    fn jobs(&self) -> usize {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let ids: std::collections::BTreeSet<(String, u64)> = text
            .lines()
            .filter(|l| l.contains("\"kind\":\"job\""))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|r| {
                let cluster = r["cluster"].as_str().unwrap_or("").to_string();
                (cluster, r["id"].as_u64().unwrap_or(0))
            })
            .collect();
        ids.len()
    }

    /// Start, wait `wait` ms, SIGKILL.
    fn kill_after(&self, wait: u64) {
        let child = self.start();
        std::thread::sleep(Duration::from_millis(wait));
        self.kill(child);
    }

    fn kill(&self, mut child: Child) {
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        if !self.data.join("checkpoint.bin").exists() {
            self.unsaved.set(read_records(&self.out).len());
        }
    }

    /// Run until `want` jobs are summarized (or 60 s), then SIGTERM; how
    /// long the jobs took. Counted once this run has written a checkpoint:
    /// before, the output may still hold what the sink cuts back at start.
    fn run_to_the_end(&self, want: usize) -> Duration {
        let started = Instant::now();
        let since = std::time::SystemTime::now();
        let mut child = self.start();
        let deadline = Instant::now() + Duration::from_secs(60);
        let saved = || {
            std::fs::metadata(self.data.join("checkpoint.bin"))
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > since)
        };
        while !(saved() && self.jobs() >= want) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = started.elapsed();
        sigterm(&child);
        let status = child.wait().expect("wait");
        assert!(status.success(), "fluxpipe exited with {status}");
        took
    }

    /// The output equals `want`: every record once (or again after the
    /// output of runs killed before any checkpoint), each equal, no other.
    /// Returns how many records came again.
    fn check(&self, want: &Expected, progress: &[usize]) -> usize {
        let got = read_records(&self.out);
        let unsaved = self.unsaved.get().min(got.len());
        let mut by_id: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
        for r in &got[unsaved..] {
            by_id
                .entry(r["record_id"].as_str().expect("record_id"))
                .or_default()
                .push(r);
        }
        let mut again = 0;
        for r in &got[..unsaved] {
            let id = r["record_id"].as_str().expect("record_id");
            assert_eq!(
                Some(r),
                want.records.get(id),
                "record {id} differs from the uninterrupted run"
            );
            match by_id.contains_key(id) {
                true => again += 1,
                false => by_id.entry(id).or_default().push(r),
            }
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
        let anomalies: Vec<&Value> = got.iter().filter(|r| r["kind"] == "anomaly").collect();
        let missing: Vec<&Value> = want
            .records
            .iter()
            .filter(|(id, _)| !by_id.contains_key(id.as_str()))
            .map(|(_, r)| r)
            .collect();
        assert!(
            missing.is_empty() && anomalies.is_empty(),
            "{} of {} records missing, e.g. {:?}; {} anomalies, e.g. {:?} \
             (jobs after each kill: {progress:?}; log, newest first:\n{tail})",
            missing.len(),
            want.records.len(),
            missing.first(),
            anomalies.len(),
            anomalies.first(),
        );
        for (id, rs) in &by_id {
            assert_eq!(
                rs.len(),
                1,
                "record {id} written {} times: {:?}",
                rs.len(),
                rs[0]
            );
            assert_eq!(
                Some(rs[0]),
                want.records.get(*id),
                "record {id} differs from the uninterrupted run"
            );
        }
        let jobs: BTreeMap<(String, u64), &Value> = got
            .iter()
            .filter(|r| r["kind"] == "job")
            .map(|r| {
                let cluster = r["cluster"].as_str().unwrap_or("").to_string();
                ((cluster, r["id"].as_u64().expect("id")), r)
            })
            .collect();
        assert_eq!(jobs.len(), want.jobs.len(), "every job");
        for (key, job) in &want.jobs {
            assert_eq!(jobs.get(key), Some(&job), "job {key:?} differs from replay");
        }
        eprintln!(
            "{}: {} records, {} of them again after runs killed before a checkpoint; \
             jobs after each kill {progress:?}",
            self.out.display(),
            got.len(),
            again
        );
        again
    }
}

/// `lines` cut into `parts` pieces of about the same size.
fn split(lines: &[String], parts: usize) -> Vec<String> {
    let per = lines.len().div_ceil(parts);
    lines.chunks(per).map(|c| c.concat()).collect()
}

/// A fresh start over folders of files rotated already, oldest first on
/// no account of their names' order or times: numbered (`.3` to the live
/// name) for cluster A, dated (`-20261123`, `-20261124`, live) for B, and a
/// compressed file in each, which is said to be skipped. First a run that
/// is never interrupted; then four fresh starts, each killed 4 times within
/// three quarters of the first run's time (whatever the speed of this build
/// and machine; narrowed while kills find all done) and run to the end. The
/// whole folder is read in a few hundred ms and the first checkpoint under
/// such a backlog comes late (the barrier waits behind it), so in each
/// round the first kills cut a run short with nothing or part of the
/// rotated files saved.
#[test]
fn a_folder_of_rotated_journals_is_read_oldest_first_across_kills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (ja, jb) = (d.join("a.jsonl"), d.join("b.jsonl"));
    let (lines_a, lines_b) = (generate(31, 10_000, &ja), generate(32, 10_000, &jb));
    let want = expected(d, &[("A", &ja), ("B", &jb)]);

    // Written newest first: neither names nor times give the order.
    let (num, dated) = (d.join("numbered"), d.join("dated"));
    std::fs::create_dir_all(&num).expect("mkdir");
    std::fs::create_dir_all(&dated).expect("mkdir");
    let names = [
        "journal.jsonl",
        "journal.jsonl.1",
        "journal.jsonl.2",
        "journal.jsonl.3",
    ];
    for (part, name) in split(&lines_a, 4).iter().rev().zip(names) {
        std::fs::write(num.join(name), part).expect("write");
    }
    std::fs::write(num.join("journal.jsonl.4.gz"), b"\x1f\x8b not read").expect("write");
    let names = [
        "journal.jsonl",
        "journal.jsonl-20261124",
        "journal.jsonl-20261123",
    ];
    for (part, name) in split(&lines_b, 3).iter().rev().zip(names) {
        std::fs::write(dated.join(name), part).expect("write");
    }
    std::fs::write(dated.join("journal.jsonl-20261122.gz"), b"\x1f\x8b").expect("write");
    let sources = [
        ("A", vec![num.join("journal.jsonl*")]),
        ("B", vec![dated.join("journal.jsonl*")]),
    ];

    let clean = pipeline(d, "clean", &sources);
    let clean_ms = clean.run_to_the_end(want.jobs.len()).as_millis() as u64;
    assert_eq!(clean.check(&want, &[]), 0);
    let log = std::fs::read_to_string(&clean.log).expect("log");
    for gz in ["journal.jsonl.4.gz", "journal.jsonl-20261122.gz"] {
        assert!(
            log.lines()
                .any(|l| l.contains("not read: compressed") && l.contains(gz)),
            "{gz} is named as skipped at start: {log}"
        );
    }

    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut short = 0;
    // A busy machine can make the clean run slow and these fast: a kill
    // that finds every job done narrows the window.
    let mut window = (clean_ms * 3 / 4).max(100);
    for round in 0..4 {
        let crashed = pipeline(d, &format!("crashed{round}"), &sources);
        let mut progress = Vec::new();
        for _ in 0..4 {
            crashed.kill_after(20 + rng.next() % window);
            let jobs = crashed.jobs();
            if jobs == want.jobs.len() {
                window = (window * 2 / 3).max(100);
            }
            progress.push(jobs);
        }
        crashed.run_to_the_end(want.jobs.len());
        crashed.check(&want, &progress);
        short += progress.iter().filter(|&&p| p < want.jobs.len()).count();
    }
    assert!(
        short >= 4,
        "only {short} of 16 kills cut a run short (clean run {clean_ms} ms, window now {window} ms)"
    );
}

/// How a writer rotates its journal.
#[derive(Clone, Copy)]
enum Style {
    /// logrotate's default: shift `.N` to `.N+1`, rename the live file to
    /// `.1`, create it again; the writer goes on in the renamed file for a
    /// moment (until it is told to reopen).
    RenameCreate,
    /// logrotate's `copytruncate` with `dateext`: copy the live file to
    /// `-DATE`, truncate it; the writer goes on in it.
    CopyTruncate,
}

/// Append `lines` to `folder/journal.jsonl` in chunks of `chunk` lines,
/// `pause` apart, rotating every `rotate_every` chunks.
fn write_rotating(
    folder: PathBuf,
    lines: Vec<String>,
    style: Style,
    chunk: usize,
    rotate_every: usize,
    pause: Duration,
) -> usize {
    let live = folder.join("journal.jsonl");
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&live)
            .expect("open journal")
    };
    let mut file = open();
    let mut rotations = 0;
    for (i, part) in lines.chunks(chunk).enumerate() {
        if i > 0 && i % rotate_every == 0 {
            rotations += 1;
            match style {
                Style::RenameCreate => {
                    for n in (1..rotations).rev() {
                        let from = folder.join(format!("journal.jsonl.{n}"));
                        let to = folder.join(format!("journal.jsonl.{}", n + 1));
                        std::fs::rename(from, to).expect("shift");
                    }
                    std::fs::rename(&live, folder.join("journal.jsonl.1")).expect("rotate");
                    std::fs::File::create(&live).expect("create");
                    // Not told to reopen yet: this chunk goes to the
                    // rotated file, the next ones to the new one.
                    file.write_all(part.concat().as_bytes()).expect("write");
                    file = open();
                    std::thread::sleep(pause);
                    continue;
                }
                Style::CopyTruncate => {
                    let copy = folder.join(format!("journal.jsonl-{}", 20261100 + rotations));
                    std::fs::copy(&live, copy).expect("copy");
                    // The writer's descriptor appends: it goes on at 0.
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&live)
                        .and_then(|f| f.set_len(0))
                        .expect("truncate");
                }
            }
        }
        file.write_all(part.concat().as_bytes()).expect("write");
        std::thread::sleep(pause);
    }
    rotations
}

/// A journal that grows and rotates while `fluxpipe run` is killed at
/// random moments (at least 20 times, and until the writer is done), then
/// run to the end.
fn growing_and_rotating(style: Style, seed: u64, name: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let journal = d.join("whole.jsonl");
    let lines = generate(seed, 5000, &journal);
    let want = expected(d, &[("A", &journal)]);
    let folder = d.join("journals");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let crashed = pipeline(d, name, &[("A", vec![folder.join("journal.jsonl*")])]);

    // About 270 chunks, 12 ms apart, a rotation every 30: ~4 s, 8 rotations.
    let chunk = lines.len() / 270 + 1;
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let done = done.clone();
        std::thread::spawn(move || {
            let n = write_rotating(folder, lines, style, chunk, 30, Duration::from_millis(12));
            done.store(true, Ordering::SeqCst);
            n
        })
    };
    let mut rng = XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut progress = Vec::new();
    let mut during = 0;
    while progress.len() < 20 || !done.load(Ordering::SeqCst) {
        during += usize::from(!done.load(Ordering::SeqCst));
        crashed.kill_after(20 + rng.next() % 300);
        progress.push(crashed.jobs());
    }
    let rotations = writer.join().expect("writer");
    assert!(rotations >= 6, "{rotations} rotations");
    crashed.run_to_the_end(want.jobs.len());
    crashed.check(&want, &progress);
    assert!(
        during >= 10,
        "most kills while the journal grows and rotates: {during} of {}",
        progress.len()
    );
}

#[test]
fn rename_and_create_while_growing_across_kills() {
    growing_and_rotating(Style::RenameCreate, 33, "rename");
}

#[test]
fn copytruncate_while_growing_across_kills() {
    growing_and_rotating(Style::CopyTruncate, 34, "copytruncate");
}

/// `fluxpipe replay` of a folder of rotated journals reads them as the
/// file source does, oldest first (`.2`, `.1`, then the live file), and
/// skips the compressed one: the same records as the journal in one piece.
#[test]
fn replay_reads_a_rotated_folder_oldest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = dir.path().join("whole.jsonl");
    let lines = generate(11, 300, &whole);
    let folder = dir.path().join("rotated");
    std::fs::create_dir(&folder).expect("folder");
    let third = lines.len() / 3;
    for (name, part) in [
        ("journal.jsonl.2", &lines[..third]),
        ("journal.jsonl.1", &lines[third..2 * third]),
        ("journal.jsonl", &lines[2 * third..]),
    ] {
        std::fs::write(folder.join(name), part.concat()).expect("write");
    }
    std::fs::write(folder.join("journal.jsonl.3.xz"), b"\xfd7zXZ not read").expect("write");
    let want = common::replay(&["--cluster", "c"], &[&whole]);
    let got = common::replay(&["--cluster", "c"], &[&folder]);
    let anomalies = |r: &[Value]| r.iter().filter(|v| v["kind"] == "anomaly").count();
    assert_eq!(
        anomalies(&got),
        anomalies(&want),
        "no anomaly from the order"
    );
    assert_eq!(got, want);
}
