//! The Debian package (contrib/debian, cargo-deb): built from the binary
//! under test, installed with `dpkg -i` on this machine, its unit checked
//! by systemd, and started the way the unit starts it, by its own command
//! line, as a user that is not root (where systemd is not running to make
//! the unit's dynamic user; where it is, the unit it started is checked
//! too). It reads its installed configuration, takes a
//! journal on the ingest port, counts the jobs in `/metrics`, and stops
//! with a checkpoint in its state folder. Purged at the end.
//!
//! It changes the system, so it runs only as root with cargo-deb installed,
//! and only in a release build (the package takes target/release/fluxpipe);
//! elsewhere it says it was skipped, unless FLUXPIPE_REQUIRE_PACKAGE=1
//! (tests/run-all sets it where it runs as root, as CI does).

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const STATE: &str = "/var/lib/fluxpipe";
const UNIT: &str = "/usr/lib/systemd/system/fluxpipe.service";
/// The user the unit's command runs as here: `nobody`.
const USER: u32 = 65534;

use crate::common::run_ok as run;

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn skip_or_fail(why: &str) {
    let required = std::env::var("FLUXPIPE_REQUIRE_PACKAGE").is_ok_and(|v| v == "1");
    assert!(!required, "FLUXPIPE_REQUIRE_PACKAGE=1 but {why}");
    eprintln!("skipped: {why}");
}

/// Purges the package and its state folder when the test ends.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "fluxpipe"]).output();
        let _ = std::fs::remove_dir_all(STATE);
    }
}

#[test]
fn the_package_installs_and_its_unit_command_runs() {
    let bin = env!("CARGO_BIN_EXE_fluxpipe");
    if !bin.ends_with("release/fluxpipe") {
        return skip_or_fail("the package is built from a release build (cargo test --release)");
    }
    if !nix::unistd::geteuid().is_root() {
        return skip_or_fail("dpkg -i needs root");
    }
    let cargo_deb = Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !cargo_deb {
        return skip_or_fail("cargo-deb is not installed (cargo install --locked cargo-deb)");
    }
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "fluxpipe"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("installed"));
    assert!(
        !installed,
        "a fluxpipe package is installed on this machine; this test would replace it"
    );

    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = run(Command::new(top.join("contrib/debian/build-package")).arg("--no-build"));
    let deb = top.join(text(&built));
    let _purge = Purge;
    run(Command::new("dpkg").arg("-i").arg(&deb));

    // What the package holds.
    let installed_version = run(Command::new("/usr/bin/fluxpipe").arg("--version"));
    assert_eq!(
        installed_version.stdout,
        run(common::fluxpipe().arg("--version")).stdout
    );
    let conffiles = run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "fluxpipe"]));
    assert!(
        text(&conffiles).contains("/etc/fluxpipe/fluxpipe.toml"),
        "{conffiles:?}"
    );
    for path in [
        "/usr/share/man/man1/fluxpipe.1.gz",
        "/usr/share/bash-completion/completions/fluxpipe",
        "/usr/share/doc/fluxpipe/examples/default.toml",
        "/usr/lib/systemd/system/flux-forwarder.service",
    ] {
        assert!(Path::new(path).is_file(), "{path} is not installed");
    }
    // The forwarder's module is found where flux-core's Python looks.
    let forwarder = run(Command::new("/usr/bin/flux-forwarder")
        .arg("--help")
        .env("PATH", "/usr/bin:/bin"));
    assert!(text(&forwarder).contains("--connect"), "{forwarder:?}");
    // Enabled, as the package's scripts do it, and read as valid by systemd.
    assert!(
        Path::new("/etc/systemd/system/multi-user.target.wants/fluxpipe.service").exists(),
        "the unit is not enabled"
    );
    if Path::new("/usr/bin/systemd-analyze").exists() {
        run(Command::new("systemd-analyze").args(["verify", UNIT]));
    }
    run(Command::new("/usr/bin/fluxpipe").args(["validate", "/etc/fluxpipe/fluxpipe.toml"]));

    // Where systemd runs, the package started the unit: it serves, then
    // is stopped to free its ports for the run below.
    if Path::new("/run/systemd/system").is_dir() {
        common::wait_until("the fluxpipe unit to answer", 30, || {
            common::http_get(9464, "/healthz").is_some_and(|(s, _)| s == 200)
        });
        run(Command::new("systemctl").args(["stop", "fluxpipe"]));
    }

    // The unit's command line, as systemd would run it: StateDirectory=
    // made and owned by the (here: fixed) user, who is not root.
    let unit = std::fs::read_to_string(UNIT).expect("the unit");
    let exec: Vec<&str> = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart=")
        .split_whitespace()
        .collect();
    let _ = std::fs::remove_dir_all(STATE);
    std::fs::create_dir(STATE).expect("the state folder");
    std::os::unix::fs::chown(STATE, Some(USER), Some(USER)).expect("chown");
    let child = Command::new("setpriv")
        .args([
            "--reuid",
            &USER.to_string(),
            "--regid",
            &USER.to_string(),
            "--clear-groups",
            "--no-new-privs",
            "--",
        ])
        .args(&exec)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdout(Stdio::null())
        .spawn()
        .expect("the unit's command");
    let mut service = common::Reaper(child);
    common::wait_until("/healthz of the installed service", 30, || {
        common::http_get(9464, "/healthz").is_some_and(|(s, _)| s == 200)
    });

    common::post_journal_until_counted("http://127.0.0.1:7070/", 9464);

    common::sigterm(&service.0);
    let status = service.0.wait().expect("wait");
    assert!(status.success(), "the service stopped with {status}");
    let checkpoint = std::fs::metadata(Path::new(STATE).join("checkpoint.bin"))
        .expect("a checkpoint in the state folder");
    assert_eq!(checkpoint.uid(), USER);
}
