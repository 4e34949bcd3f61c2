//! The five-minute tour of README.md runs as written: every `fluxpipe`
//! command of its code block is taken from the README itself and run from
//! the repository root; the live `fluxpipe run` is stopped once it has
//! printed transitions.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

fn tour_block() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let section = readme
        .split("## Five minutes on the sample corpus")
        .nth(1)
        .expect("the tour section");
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the tour's code block");
    block.to_string()
}

fn tour_commands() -> Vec<String> {
    tour_block()
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("fluxpipe "))
        .map(str::to_string)
        .collect()
}

/// PATH with the binary under test first, as the tour's `export` does.
fn path_env() -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_fluxpipe"))
        .parent()
        .expect("bin dir")
        .display()
        .to_string();
    format!("{bin}:{}", std::env::var("PATH").unwrap_or_default())
}

#[test]
fn every_tour_command_runs() {
    let commands = tour_commands();
    assert!(commands.len() >= 5, "{commands:?}");
    let root = env!("CARGO_MANIFEST_DIR");
    let mut ran = 0;
    for cmd in &commands {
        if cmd.ends_with('&') {
            // step 5 binds fixed ports: `alerting_tour_step_runs`
            continue;
        }
        if cmd.starts_with("fluxpipe run ") {
            let mut child = Command::new("sh")
                .args(["-c", &format!("exec {cmd}")])
                .current_dir(root)
                .env("PATH", path_env())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn");
            let out = BufReader::new(child.stdout.take().expect("stdout"));
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut transitions = 0;
            for line in out.lines() {
                let line = line.expect("line");
                if line.contains("\"kind\":\"transition\"") {
                    transitions += 1;
                }
                if transitions >= 10 || Instant::now() > deadline {
                    break;
                }
            }
            let _ = child.kill();
            let _ = child.wait();
            assert!(transitions >= 10, "{cmd}: {transitions} transitions");
        } else {
            let out = Command::new("sh")
                .args(["-c", cmd])
                .current_dir(root)
                .env("PATH", path_env())
                .output()
                .expect("run");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{cmd}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!text.trim().is_empty(), "{cmd}: no output");
            if cmd.contains("grep '\"kind\":\"job\"'") {
                assert_eq!(text.lines().count(), 3, "{cmd}");
            }
            if cmd.contains("--to words") {
                assert_eq!(
                    text.trim(),
                    "acrobat-academy-academy--academy-academy-academy"
                );
            }
        }
        ran += 1;
    }
    assert_eq!(ran, 4, "{commands:?}");
}

/// Step 5 as written, but on a free port: the live run fires as many
/// alerts as `fluxpipe replay` of the same files with the same rules, and
/// the scrape shows the nodes left offline.
#[test]
fn alerting_tour_step_runs() {
    let block = tour_block();
    let step = block.split("# 5.").nth(1).expect("step 5");
    let lines: Vec<&str> = step
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let (run, count, scrape) = (lines[0], lines[1], lines[2]);
    assert!(run.starts_with("fluxpipe run --config pipelines/alerting.toml") && run.ends_with('&'));
    assert_eq!(lines[3], "kill %1");

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    let port = common::free_port();
    let config = std::fs::read_to_string(root.join("pipelines/alerting.toml"))
        .expect("alerting.toml")
        .replace("127.0.0.1:9465", &format!("127.0.0.1:{port}"));
    let copy = dir.path().join("alerting.toml");
    std::fs::write(&copy, config).expect("write config");
    let on_port = |cmd: &str| cmd.replace("127.0.0.1:9465", &format!("127.0.0.1:{port}"));
    let run = run
        .trim_end_matches('&')
        .replace("pipelines/alerting.toml", &copy.display().to_string());
    let child = Command::new("sh")
        .args(["-c", &format!("exec {run}")])
        .current_dir(root)
        .env("PATH", path_env())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let _reaper = common::Reaper(child);
    let alerts_file = root.join("alerts.jsonl");
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(alerts_file.clone());

    // What replay says the same rules raise on the same files.
    let replay = common::fluxpipe()
        .current_dir(root)
        .args(["replay", "--format", "json", "--config"])
        .arg(&copy)
        .arg("tests/corpus/upstream-testdata/resource/resource.eventlog.thing2")
        .output()
        .expect("replay");
    let expected = String::from_utf8_lossy(&replay.stdout)
        .lines()
        .filter(|l| l.contains("\"kind\":\"alert\"") && l.contains("\"status\":\"firing\""))
        .count();
    assert!(expected > 0, "the corpus must fire alerts");

    let count = count.split_once(';').map_or(count, |(_, c)| c.trim());
    let firing = || {
        let out = Command::new("sh")
            .args(["-c", count])
            .current_dir(root)
            .output()
            .expect("grep");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<usize>()
            .unwrap_or(0)
    };
    common::wait_until("every alert fired", 60, || firing() >= expected);
    // The job corpus raises none with these rules, so thing2's are all.
    assert_eq!(firing(), expected);

    let out = Command::new("sh")
        .args(["-c", &on_port(scrape)])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("flux_nodes_offline{flux_cluster=\"thing2\"} 42"),
        "{text}"
    );
    assert!(text.contains("flux_jobs_stuck{"), "{text}");
}
