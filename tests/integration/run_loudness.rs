//! `fluxpipe run` says what it does and refuses what would go wrong
//! quietly: one run per data folder (a second one names the holder's pid
//! and exits), a start-up line at the default log level, and a file source
//! whose patterns match nothing says so.

use crate::common;
use crate::common::{Reaper, fluxpipe, wait_until};

use std::io::Read;
use std::process::Stdio;

/// Standard error of a child, read on a thread as it comes.
fn stderr_reader(child: &mut std::process::Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut err = child.stderr.take().expect("stderr");
    let t = text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            t.lock()
                .expect("lock")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}

#[test]
fn a_second_run_on_one_data_folder_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // The built-in default on standard input, kept open: it runs on.
    let mut first = fluxpipe()
        .args(["run", "--data-dir"])
        .arg(&data)
        .env_remove("FLUXPIPE_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let log = stderr_reader(&mut first);
    let first = Reaper(first);
    let pid = first.0.id();
    wait_until("the start-up line", 20, || {
        log.lock().expect("lock").contains("starting")
    });
    let line = log.lock().expect("lock").clone();
    assert!(
        line.contains(env!("CARGO_PKG_VERSION")) && line.contains(&data.display().to_string()),
        "the start-up line names the version and the data folder: {line}"
    );

    let second = fluxpipe()
        .args(["run", "--data-dir"])
        .arg(&data)
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success(),
        "a second run must not start: {err}"
    );
    assert!(
        err.contains("in use by another fluxpipe run") && err.contains(&format!("(pid {pid})")),
        "{err}"
    );

    // SIGKILL leaves no stale lock: the next run starts (and ends with
    // its empty input).
    drop(first);
    let third = fluxpipe()
        .args(["run", "--data-dir"])
        .arg(&data)
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(
        third.status.success(),
        "{}",
        String::from_utf8_lossy(&third.stderr)
    );
}

#[test]
fn a_file_source_matching_nothing_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pattern = dir.path().join("nowhere/*.jsonl");
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.f]\ntype = \"file\"\ninclude = [{:?}]\n\
             [sinks.out]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\n",
            dir.path().join("data"),
            pattern
        ),
    )
    .expect("config");
    let mut child = fluxpipe()
        .args(["run", "--config"])
        .arg(&config)
        .env_remove("FLUXPIPE_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let log = stderr_reader(&mut child);
    let _child = Reaper(child);
    wait_until("the warning", 20, || {
        let text = log.lock().expect("lock");
        text.contains("no file to read matches include") && text.contains("nowhere/*.jsonl")
    });
}

/// `fluxpipe run … | head -2`: once the reader is gone, a pipeline whose
/// only sink is standard output stops (it would otherwise tail for ever),
/// cleanly: status 0.
#[test]
fn a_closed_standard_output_stops_a_pipeline_that_only_writes_there() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = fluxpipe()
        .args(["run", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg(common::corpus().join("instances/B/journals"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let log = stderr_reader(&mut child);
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    for _ in 0..2 {
        let mut line = String::new();
        out.read_line(&mut line).expect("a line");
        assert!(line.starts_with('{'), "{line}");
    }
    drop(out);
    let mut child = Reaper(child);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "still running with its standard output closed: {}",
            log.lock().expect("lock")
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // The reader had enough: a stop, as `head` asks, not a failure (the
    // records it left unread are read again by a next run: no final
    // checkpoint).
    assert!(status.success(), "{status}");
    assert!(
        log.lock().expect("lock").contains("standard output closed"),
        "{}",
        log.lock().expect("lock")
    );
}

/// `fluxpipe validate FILE` names every error of the file at once, with
/// its line, in plain words; then what it can check without starting.
#[test]
fn validate_reports_every_error_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "workers = \"two\"\n[sources.a]\ntype = \"stdin\"\n\
         [sinks.s]\ntype = \"stdout\"\ninputs = [\"jobz\"]\nbuffer = -5\n",
    )
    .expect("config");
    let out = common::fluxpipe()
        .arg("validate")
        .arg(&config)
        .output()
        .expect("validate");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    for (line, words) in [
        ("line 1:", "expected a whole number"),
        ("line 6:", "jobz"),
        ("line 7:", "buffer"),
    ] {
        assert!(
            lines.iter().any(|l| l.contains(line) && l.contains(words)),
            "{line} {words}: {err}"
        );
    }
    assert!(!err.contains("usize"), "{err}");

    // Written well, but the address is taken and the data folder cannot
    // be made: said before anything starts.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "").expect("file");
    let config = dir.path().join("busy.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.a]\ntype = \"socket\"\naddress = \"127.0.0.1:{port}\"\n\
             [sources.f]\ntype = \"file\"\ninclude = [{:?}]\n\
             [sinks.s]\ntype = \"stdout\"\ninputs = [\"jobs\"]\n",
            blocker.join("data"),
            dir.path().join("nothing-here/*.jsonl"),
        ),
    )
    .expect("config");
    let out = common::fluxpipe()
        .arg("validate")
        .arg(&config)
        .output()
        .expect("validate");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sources.a.address") && err.contains(&port.to_string()),
        "{err}"
    );
    assert!(
        err.contains("data_dir") && err.contains("not a folder"),
        "{err}"
    );
    assert!(
        err.contains("warning: sources.f") && err.contains("matches no file"),
        "{err}"
    );
    drop(taken);
}

#[test]
fn a_checkpoint_of_another_pipeline_is_refused_with_the_way_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let journal =
        common::corpus().join("instances/B/journals/incarnation1.job-manager.events-journal.jsonl");
    let config = |source: &str| {
        let path = dir.path().join(format!("{source}.toml"));
        std::fs::write(
            &path,
            format!(
                "data_dir = {data:?}\n[sources.{source}]\ntype = \"stdin\"\n\
                 [sinks.out]\ntype = \"blackhole\"\ninputs = [\"jobs\"]\n"
            ),
        )
        .expect("config");
        path
    };
    let run = |config: &std::path::Path, extra: &[&str]| {
        fluxpipe()
            .args(["run", "--config"])
            .arg(config)
            .args(extra)
            .stdin(std::fs::File::open(&journal).expect("journal"))
            .output()
            .expect("run")
    };
    let first = run(&config("journal"), &[]);
    assert!(first.status.success(), "{first:?}");

    // Another config on the same folder: refused, saying whose it is and
    // the ways out.
    let other = config("other");
    let refused = run(&other, &[]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    for words in [
        "belongs to another pipeline",
        "journal (stdin)",
        "other (stdin)",
        "--reset-state",
        "--adopt-checkpoint",
    ] {
        assert!(err.contains(words), "no {words:?} in: {err}");
    }
    // Told to: restored, with a warning.
    let adopted = run(&other, &["--adopt-checkpoint"]);
    let err = String::from_utf8_lossy(&adopted.stderr);
    assert!(adopted.status.success(), "{err}");
    assert!(
        err.contains("restoring the checkpoint of another pipeline"),
        "{err}"
    );
    // The same config again: its own checkpoint now, restored quietly.
    let again = run(&other, &[]);
    assert!(again.status.success(), "{again:?}");
    // The first config is now the other one; --reset-state starts it anew.
    assert!(!run(&config("journal"), &[]).status.success());
    let reset = run(&config("journal"), &["--reset-state"]);
    assert!(reset.status.success(), "{reset:?}");
    // Where no flag can be given (a service), the config says it.
    let third = config("third");
    let text = std::fs::read_to_string(&third).expect("config");
    std::fs::write(
        &third,
        format!("{text}[checkpoint]\nadopt_mismatched = true\n"),
    )
    .expect("config");
    let adopted = run(&third, &[]);
    let err = String::from_utf8_lossy(&adopted.stderr);
    assert!(adopted.status.success(), "{err}");
    assert!(
        err.contains("checkpoint.adopt_mismatched: restoring the checkpoint of another pipeline"),
        "{err}"
    );
}

/// A pipeline whose `http` sink fails for good (nobody listens), holding
/// many batches, and a file source on a corpus journal (stays open).
fn start_with_failing_sink(
    dir: &std::path::Path,
) -> (
    std::process::Child,
    std::sync::Arc<std::sync::Mutex<String>>,
) {
    let dead = common::free_port();
    std::fs::create_dir_all(dir).expect("dir");
    let config = dir.join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[sources.in]\ntype = \"file\"\ninclude = [{:?}]\n\
             [sinks.hook]\ntype = \"http\"\nuri = \"http://127.0.0.1:{dead}/\"\n\
             inputs = [\"transitions\"]\nbatch_max_records = 5\nbatch_timeout_ms = 10\n",
            dir.join("data"),
            common::corpus()
                .join("instances/B/journals/incarnation1.job-manager.events-journal.jsonl")
        ),
    )
    .expect("config");
    let mut child = fluxpipe()
        .args(["run", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let log = stderr_reader(&mut child);
    wait_until("the sink failing", 20, || {
        log.lock().expect("lock").contains("starting")
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    (child, log)
}

fn exit_within(
    child: &mut std::process::Child,
    secs: u64,
    log: &std::sync::Mutex<String>,
) -> std::process::ExitStatus {
    let started = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(secs),
            "still stopping after {secs} s: {}",
            log.lock().expect("lock")
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A stop with a sink that keeps failing is bounded by one grace for all
/// its batches (5 s), not one per batch; a second SIGTERM stops at once
/// with status 2.
#[test]
fn a_stop_with_a_failing_sink_is_bounded_and_a_second_signal_is_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (child, log) = start_with_failing_sink(&dir.path().join("one"));
    let mut child = Reaper(child);
    common::sigterm(&child.0);
    let started = std::time::Instant::now();
    let status = exit_within(&mut child.0, 15, &log);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(12),
        "one grace, not one per batch: {:?}",
        started.elapsed()
    );
    // Records were not delivered: not a clean stop.
    assert_eq!(status.code(), Some(1), "{}", log.lock().expect("lock"));

    let (child, log) = start_with_failing_sink(&dir.path().join("two"));
    let mut child = Reaper(child);
    common::sigterm(&child.0);
    std::thread::sleep(std::time::Duration::from_millis(300));
    common::sigterm(&child.0);
    let status = exit_within(&mut child.0, 3, &log);
    assert_eq!(status.code(), Some(2), "{}", log.lock().expect("lock"));
    assert!(
        log.lock().expect("lock").contains("stopping at once"),
        "{}",
        log.lock().expect("lock")
    );
}

#[test]
fn a_damaged_checkpoint_fails_the_start_before_any_sink_cuts_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let journal = dir.path().join("journal.jsonl");
    let out = dir.path().join("jobs.jsonl");
    // Enough jobs for a checkpoint decoded on threads while the shards
    // take its parts over (a few megabytes).
    let made = fluxpipe()
        .args(["generate", "--seed", "3", "--jobs", "20000", "--out"])
        .arg(&journal)
        .output()
        .expect("generate");
    assert!(made.status.success(), "{made:?}");
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data:?}\n[sources.journal]\ntype = \"stdin\"\n\
             [sinks.out]\ntype = \"file\"\npath = {out:?}\ninputs = [\"jobs\"]\n"
        ),
    )
    .expect("config");
    let run = || {
        fluxpipe()
            .args(["run", "--config"])
            .arg(&config)
            .stdin(std::fs::File::open(&journal).expect("journal"))
            .output()
            .expect("run")
    };
    let first = run();
    assert!(first.status.success(), "{first:?}");
    let saved = data.join("checkpoint.bin");
    let mut bytes = std::fs::read(&saved).expect("a checkpoint");
    assert!(bytes.len() > 4 << 20, "{} bytes", bytes.len());
    // Written after the checkpoint: a start from it would cut this line.
    let mut text = std::fs::read_to_string(&out).expect("output");
    text.push_str("{\"after\":\"the checkpoint\"}\n");
    std::fs::write(&out, &text).expect("output");
    // A bit flipped in a part the shards take over.
    let i = bytes.len() / 2;
    bytes[i] ^= 0x10;
    std::fs::write(&saved, &bytes).expect("damage");

    let second = run();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{err}");
    for words in ["checksum mismatch", "--reset-state"] {
        assert!(err.contains(words), "no {words:?} in: {err}");
    }
    assert_eq!(
        std::fs::read_to_string(&out).expect("output"),
        text,
        "the file sink never started"
    );
}
