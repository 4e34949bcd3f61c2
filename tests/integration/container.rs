//! The container image (contrib/container): built with buildah from the
//! binary under test, pulling nothing, and run with podman as a site would
//! run it: non-root, on a read-only root, its data on a volume. It answers
//! `--version`, replays the corpus as the binary does on the host, and
//! serves its built-in service configuration: `/healthz`, batches POSTed
//! to the http source, `/metrics`, and a checkpoint on the volume at stop.
//!
//! Where buildah or podman is missing the test says so and passes, unless
//! FLUXPIPE_REQUIRE_CONTAINER=1 (tests/run-all sets it where it runs as
//! root, as CI does).

use crate::common;

use std::path::Path;
use std::process::Command;

const UID: &str = "65532";

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

use crate::common::run_ok as run;

/// `podman run` with what this machine needs: runc where it is installed
/// (crun refuses hybrid cgroup v1 hosts), and limits no higher than this
/// process's own (podman's defaults are higher, and raising them needs a
/// privilege a sandboxed root may lack).
fn podman_run() -> Command {
    let mut cmd = Command::new("podman");
    if have("runc") {
        cmd.args(["--runtime", "runc"]);
    }
    let nofile = rlimit_nofile();
    cmd.args([
        "run",
        "--read-only",
        "--ulimit",
        &format!("nofile={nofile}:{nofile}"),
        "--ulimit",
        "nproc=4096:4096",
    ]);
    cmd
}

fn rlimit_nofile() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(4)?.parse().ok())
        })
        .unwrap_or(1024)
}

/// Removes the image and any container of this test when it ends.
struct Cleanup {
    tag: String,
    container: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", &self.container])
            .output();
        let _ = Command::new("podman")
            .args(["rmi", "-f", &self.tag])
            .output();
    }
}

#[test]
fn the_image_runs_non_root_on_a_read_only_root() {
    let required = std::env::var("FLUXPIPE_REQUIRE_CONTAINER").is_ok_and(|v| v == "1");
    if !have("buildah") || !have("podman") {
        assert!(
            !required,
            "FLUXPIPE_REQUIRE_CONTAINER=1 but buildah or podman is missing"
        );
        eprintln!("skipped: buildah and podman are needed to build and run the image");
        return;
    }
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = env!("CARGO_BIN_EXE_fluxpipe");
    let pid = std::process::id();
    let guard = Cleanup {
        tag: format!("localhost/fluxpipe-test:{pid}"),
        container: format!("fluxpipe-test-{pid}"),
    };
    let tag = guard.tag.as_str();

    // Built from the binary under test, with nothing pulled.
    let built = run(Command::new(top.join("contrib/container/build-image"))
        .arg(bin)
        .arg(tag));
    assert_eq!(String::from_utf8_lossy(&built.stdout).trim(), tag);
    let user =
        run(Command::new("podman").args(["image", "inspect", "--format", "{{.Config.User}}", tag]));
    assert_eq!(
        String::from_utf8_lossy(&user.stdout).trim(),
        format!("{UID}:{UID}")
    );

    // The binary inside is the one under test.
    let version = run(podman_run().args(["--rm", tag, "--version"]));
    let host_version = run(common::fluxpipe().arg("--version"));
    assert_eq!(version.stdout, host_version.stdout);

    // Its own configuration reads well where it will run.
    let valid = run(podman_run().args(["--rm", tag, "validate", "/etc/fluxpipe/fluxpipe.toml"]));
    assert!(
        String::from_utf8_lossy(&valid.stdout).contains(": ok"),
        "{valid:?}"
    );

    // The corpus replayed inside gives what the binary gives on the host.
    let corpus = common::corpus();
    let inside = run(podman_run()
        .arg("--rm")
        .arg("-v")
        .arg(format!("{}:/corpus:ro", corpus.display()))
        .args([tag, "replay", "--format", "json", "/corpus/instances"]));
    let host = run(common::fluxpipe()
        .args(["replay", "--format", "json"])
        .arg(corpus.join("instances")));
    let jobs = String::from_utf8_lossy(&host.stdout)
        .lines()
        .filter(|l| l.contains(r#""kind":"job""#))
        .count();
    assert!(jobs > 10, "the corpus replays to {jobs} jobs");
    // Paths differ (/corpus against the host's), nothing else may.
    let host_text =
        String::from_utf8_lossy(&host.stdout).replace(&corpus.display().to_string(), "/corpus");
    assert_eq!(String::from_utf8_lossy(&inside.stdout), host_text);

    // The service: the image's own command and configuration, its data on
    // a folder of the host owned by the image's user.
    let data = tempfile::tempdir().expect("tempdir");
    run(Command::new("chown")
        .arg(format!("{UID}:{UID}"))
        .arg(data.path()));
    let (api, ingest) = (common::free_port(), common::free_port());
    run(podman_run()
        .args(["-d", "--name", &guard.container])
        .arg("-v")
        .arg(format!("{}:/var/lib/fluxpipe", data.path().display()))
        .args(["-p", &format!("127.0.0.1:{api}:9464")])
        .args(["-p", &format!("127.0.0.1:{ingest}:7070")])
        .arg(tag));
    common::wait_until("/healthz in the container", 60, || {
        common::http_get(api, "/healthz").is_some_and(|(s, _)| s == 200)
    });

    // Non-root, seen from the host.
    let pid = run(Command::new("podman").args([
        "inspect",
        "--format",
        "{{.State.Pid}}",
        &guard.container,
    ]));
    let status = std::fs::read_to_string(format!(
        "/proc/{}/status",
        String::from_utf8_lossy(&pid.stdout).trim()
    ))
    .expect("the container's process");
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid");
    assert!(
        uid_line.split_whitespace().skip(1).all(|u| u == UID),
        "{uid_line}"
    );

    // A journal POSTed to the http source is acknowledged and counted.
    common::post_journal_until_counted(&format!("http://127.0.0.1:{ingest}/"), api);

    // A stop writes its checkpoint onto the volume, as the image's user.
    run(Command::new("podman").args(["stop", "-t", "30", &guard.container]));
    let exit = run(Command::new("podman").args([
        "inspect",
        "--format",
        "{{.State.ExitCode}}",
        &guard.container,
    ]));
    assert_eq!(String::from_utf8_lossy(&exit.stdout).trim(), "0");
    let checkpoint = data.path().join("checkpoint.bin");
    let meta = std::fs::metadata(&checkpoint).expect("a checkpoint on the volume");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.uid().to_string(), UID);
}
