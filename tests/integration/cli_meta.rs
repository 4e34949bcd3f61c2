//! What the command says of itself: `--version` with the commit it was
//! built from, shell completions, a manual page and the manual's
//! command-line reference made from the same definitions as its arguments.

use crate::common;
use crate::common::fluxpipe;

fn stdout_of(args: &[&str]) -> String {
    let out = fluxpipe().args(args).output().expect("run fluxpipe");
    assert!(out.status.success(), "fluxpipe {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn the_version_names_the_commit() {
    let text = stdout_of(&["--version"]);
    assert!(
        text.starts_with(&format!("fluxpipe {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        // Built from this checkout: its commit (or a newer one's, if a
        // commit came after the build; the build script reruns on it).
        Some(h) => assert!(text.contains(&format!("({h})")), "{text} (HEAD {h})"),
        None => assert!(text.contains("(unknown commit)"), "{text}"),
    }
}

#[test]
fn completions_know_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let text = stdout_of(&["completions", shell]);
        for command in ["replay", "run", "jobs", "resource", "completions"] {
            assert!(text.contains(command), "{shell}: no {command}");
        }
    }
    let out = fluxpipe()
        .args(["completions", "tcsh"])
        .output()
        .expect("run");
    assert!(!out.status.success(), "an unknown shell is refused");
}

#[test]
fn the_manual_page_is_roff_with_every_command() {
    let text = stdout_of(&["man"]);
    assert!(
        text.starts_with(".ie") || text.contains(".TH fluxpipe"),
        "{}",
        &text[..200.min(text.len())]
    );
    for command in ["replay", "run", "jobs", "resource", "validate"] {
        assert!(text.contains(command), "no {command} in the page");
    }
}

/// The manual's command-line reference is what the clap definitions say
/// today: a flag added, renamed or reworded without `fluxpipe reference >
/// docs/cli.md` fails here.
#[test]
fn the_cli_reference_in_the_manual_is_the_commands_own() {
    let made = stdout_of(&["reference"]);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md");
    let kept = std::fs::read_to_string(path).expect("docs/cli.md");
    assert!(
        made == kept,
        "docs/cli.md differs from `fluxpipe reference`: run `cargo run --release -- reference > docs/cli.md`"
    );
    for command in ["replay", "run", "jobs", "resource status", "report jobs"] {
        assert!(
            made.contains(&format!("## `fluxpipe {command}`")),
            "{command}"
        );
    }
}

/// `fluxpipe | head`: the reader had enough. The run stops cleanly with
/// status 0, says nothing of a broken pipe, and leaves no folder behind.
#[test]
fn a_reader_that_goes_away_ends_the_default_run_quietly() {
    use std::io::BufRead;
    let mut child = fluxpipe()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn fluxpipe");
    let data_dir = std::env::temp_dir().join(format!("fluxpipe-demo-{}", child.id()));
    let stdout = child.stdout.take().expect("stdout");
    let mut first = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut first)
        .expect("a line");
    assert!(first.starts_with('{'), "{first}");
    // The reader goes away (its end of the pipe is dropped here).
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    for said in ["Broken pipe", "ERROR", "WARN"] {
        assert!(!stderr.contains(said), "{said}: {stderr}");
    }
    assert!(!data_dir.exists(), "{} left behind", data_dir.display());
}

/// Other commands die quietly, as Unix tools do, when their reader goes.
#[test]
fn a_reader_that_goes_away_ends_a_listing_quietly() {
    let journal =
        common::corpus().join("instances/B/journals/incarnation1.job-manager.events-journal.jsonl");
    let mut child = fluxpipe()
        .args(["replay", "--format", "json"])
        .arg(&journal)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn fluxpipe");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `run --config FILE PATH`: the config's sources say what to read; a
/// PATH beside it is refused, not ignored.
#[test]
fn run_refuses_paths_beside_a_config() {
    let out = fluxpipe()
        .args(["run", "--config", "pipelines/default.toml", "somewhere"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run fluxpipe");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// replay: a running job's runtime counts to the last event read, with
/// alerts or without; `--since` takes the forms `history --since` takes.
#[test]
fn replay_counts_runtimes_without_alerts_and_takes_durations_for_since() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = dir.path().join("j.jsonl");
    let event = |id: u64, t: f64, name: &str, context: &str| {
        format!(
            "{{\"cluster\":\"t\",\"stream\":\"job\",\"id\":{id},\"event\":{{\"timestamp\":{t},\"name\":\"{name}\"{context}}}}}\n"
        )
    };
    let submit = ",\"context\":{\"userid\":5,\"urgency\":16,\"flags\":0,\"version\":1}";
    let t = 1_795_321_860.0;
    let text = [
        event(1, t, "submit", submit),
        event(1, t + 0.1, "validate", ""),
        event(1, t + 0.2, "depend", ""),
        event(1, t + 0.3, "priority", ",\"context\":{\"priority\":16}"),
        event(1, t + 1.0, "alloc", ""),
        event(1, t + 2.0, "start", ""),
        event(2, t + 61.0, "submit", submit),
    ]
    .concat();
    std::fs::write(&journal, text).expect("journal");
    let runtimes = |extra: &[&str]| {
        let mut args = vec!["replay", "-o", "{state} {runtime!F}"];
        args.extend_from_slice(extra);
        let out = fluxpipe()
            .args(&args)
            .arg(&journal)
            .output()
            .expect("replay");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let with_alerts = runtimes(&[]);
    assert!(with_alerts.contains("RUN 1m"), "{with_alerts}");
    assert_eq!(runtimes(&["--no-alerts"]), with_alerts);
    // Jobs active in the last two hours: every job of a log that old is
    // left out but the active ones.
    let sorted = |text: String| {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    assert_eq!(sorted(runtimes(&["--since", "2h"])), sorted(with_alerts));
    let bad = fluxpipe()
        .args(["replay", "--since", "whenever"])
        .arg(&journal)
        .output()
        .expect("replay");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("is not a time"),
        "{bad:?}"
    );
}
