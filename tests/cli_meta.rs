//! What the command says of itself: `--version` with the commit it was
//! built from, shell completions and a manual page made from the same
//! definitions as its arguments.

mod common;
use common::fluxpipe;

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
