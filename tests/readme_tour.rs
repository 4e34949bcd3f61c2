//! The five-minute tour of README.md runs as written: every `fluxpipe`
//! command of its code block is taken from the README itself and run from
//! the repository root; the live `fluxpipe run` is stopped once it has
//! printed transitions.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tour_commands() -> Vec<String> {
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
    block
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
            // step 5 binds fixed ports; its config is validated by
            // tests/pipelines.rs
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
