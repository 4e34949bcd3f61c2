//! The data folder fills up while fluxpipe runs: checkpoints fail loudly,
//! records keep flowing, and once space returns checkpoints resume and a
//! restart goes on from the last one.
//!
//! A full disk is a real one: a 1 MiB tmpfs mounted on the data folder
//! (this needs root, as CI runs; elsewhere the data folder is made
//! read-only instead, which root would not notice).

use crate::common;
use crate::common::{fluxpipe, read_records, sigterm, wait_until};

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Make `data` unwritable: a full tmpfs (root) or mode 0555 (others).
/// Returns how to undo it.
enum Block {
    Tmpfs,
    ReadOnly,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

fn mount_tmpfs(dir: &Path) -> bool {
    Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

/// Unmounts the tmpfs however the test ends.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn fill(dir: &Path) {
    let mut f = std::fs::File::create(dir.join("filler")).expect("filler");
    let block = vec![0u8; 64 * 1024];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
}

fn summaries(out: &Path) -> usize {
    read_records(out)
        .iter()
        .filter(|r| r["kind"] == "job")
        .map(|r| r["id"].as_u64())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

fn start(config: &Path, log: &Arc<Mutex<String>>) -> Child {
    let mut child = fluxpipe()
        .args(["run", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let log = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            log.lock().expect("log").push_str(&(line + "\n"));
        }
    });
    child
}

fn stop(mut child: Child) {
    sigterm(&child);
    let status = child.wait().expect("wait");
    assert!(status.success(), "fluxpipe exited with {status}");
}

#[test]
fn a_full_data_folder_is_loud_blocks_nothing_and_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    let block = if is_root() && mount_tmpfs(&data) {
        Block::Tmpfs
    } else {
        Block::ReadOnly
    };
    let _unmount = matches!(block, Block::Tmpfs).then(|| Unmount(data.clone()));
    let journal = dir.path().join("all.jsonl");
    let status = fluxpipe()
        .args(["generate", "--jobs", "300", "--nodes", "8", "--out"])
        .arg(&journal)
        .status()
        .expect("generate");
    assert!(status.success());
    let text = std::fs::read_to_string(&journal).expect("journal");
    let lines: Vec<&str> = text.lines().collect();
    let (first, second) = lines.split_at(lines.len() / 2);
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, first.join("\n") + "\n").expect("input");
    let out = dir.path().join("out.jsonl");
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data:?}\nworkers = 2\n[checkpoint]\ninterval_secs = 0.2\n\
             [sources.in]\ntype = \"file\"\ninclude = [{input:?}]\npoll_interval_ms = 20\ncluster = \"c\"\n\
             [sinks.out]\ntype = \"file\"\npath = {out:?}\ninputs = [\"jobs\"]\n"
        ),
    )
    .expect("config");

    let log = Arc::new(Mutex::new(String::new()));
    let child = start(&config, &log);
    let checkpoint = data.join("checkpoint.bin");
    wait_until("a first checkpoint", 30, || checkpoint.exists());

    // The disk fills (or the folder turns read-only); more input arrives.
    match block {
        Block::Tmpfs => fill(&data),
        Block::ReadOnly => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        }
    }
    let before = std::fs::read(&checkpoint).expect("checkpoint");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&input)
        .expect("input");
    f.write_all((second.join("\n") + "\n").as_bytes())
        .expect("append");
    drop(f);
    // Records keep flowing: every job is summarized.
    wait_until("every job summary", 60, || summaries(&out) == 300);
    // And it is loud about it.
    wait_until("a logged checkpoint failure", 30, || {
        log.lock().expect("log").contains("checkpoint abandoned")
    });
    assert_eq!(
        std::fs::read(&checkpoint).expect("checkpoint"),
        before,
        "the old checkpoint stays whole"
    );

    // Space returns: checkpoints resume.
    match block {
        Block::Tmpfs => std::fs::remove_file(data.join("filler")).expect("unfill"),
        Block::ReadOnly => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
    }
    wait_until("a new checkpoint", 30, || {
        std::fs::read(&checkpoint).is_ok_and(|now| now != before)
    });
    stop(child);

    // A restart goes on from there: nothing is summarized twice.
    let emitted = read_records(&out).len();
    let child = start(&config, &log);
    std::thread::sleep(Duration::from_millis(1500));
    stop(child);
    assert_eq!(read_records(&out).len(), emitted, "nothing read again");
}

/// The `file` sink's own disk fills while it writes (a 1 MiB tmpfs under
/// its file: root only, as CI runs), then space returns: the error is
/// counted and logged at once, no torn line is left, and once space
/// returns every record is written, each once.
#[test]
fn a_full_disk_under_the_file_sink_is_waited_out() {
    if !is_root() {
        println!("skipped: mounting a tmpfs needs root (CI runs as root)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sink_dir = dir.path().join("sink");
    std::fs::create_dir_all(&sink_dir).expect("sink dir");
    assert!(mount_tmpfs(&sink_dir), "mount a tmpfs");
    let _unmount = Unmount(sink_dir.clone());
    let journal = dir.path().join("all.jsonl");
    let jobs = 4000;
    let status = fluxpipe()
        .args([
            "generate",
            "--jobs",
            &jobs.to_string(),
            "--nodes",
            "8",
            "--out",
        ])
        .arg(&journal)
        .status()
        .expect("generate");
    assert!(status.success());
    let out = sink_dir.join("out.jsonl");
    let api = common::free_port();
    let config = dir.path().join("p.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data:?}\n[checkpoint]\ninterval_secs = 0.5\n\
             [sources.in]\ntype = \"file\"\ninclude = [{journal:?}]\ncluster = \"c\"\n\
             [sinks.out]\ntype = \"file\"\npath = {out:?}\ninputs = [\"jobs\"]\n\
             [api]\naddress = \"127.0.0.1:{api}\"\n",
            data = dir.path().join("data"),
        ),
    )
    .expect("config");
    let log = Arc::new(Mutex::new(String::new()));
    let child = common::Reaper(start(&config, &log));
    let errors = || {
        common::scrape(api)
            .get("fluxpipe_sink_errors_total{sink=\"out\"}")
            .copied()
            .unwrap_or(0.0)
    };
    wait_until("the disk full and the error counted", 60, || {
        errors() >= 1.0
    });
    assert!(
        log.lock()
            .expect("log")
            .contains("retrying until the file can be written"),
        "logged at once"
    );
    // Cut back to whole lines between its tries (a look may fall inside
    // one, while it writes).
    wait_until("whole lines while it waits", 20, || {
        std::fs::read(&out).is_ok_and(|t| t.is_empty() || t.ends_with(b"\n"))
    });
    let stuck = summaries(&out);
    assert!(stuck < jobs, "the disk never filled ({stuck} summaries)");
    // Space returns.
    let grown = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&sink_dir)
        .status()
        .expect("remount");
    assert!(grown.success());
    wait_until("every summary once space returned", 60, || {
        summaries(&out) == jobs
    });
    sigterm(&child.0);
    let mut child = child;
    let status = child.0.wait().expect("wait");
    assert!(status.success(), "fluxpipe exited with {status}");
    let text = std::fs::read_to_string(&out).expect("out");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), jobs, "each summary once");
    for l in &lines {
        serde_json::from_str::<serde_json::Value>(l).expect("every line whole");
    }
    assert!(
        log.lock()
            .expect("log")
            .contains("succeeded: the file can be written again"),
        "the recovery is logged"
    );
}
