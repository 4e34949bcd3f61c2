//! Every example in `pipelines/` is a valid config: `fluxpipe validate`
//! accepts it, run from the repository root as the examples say.

use std::path::Path;
use std::process::Command;

#[test]
fn every_example_pipeline_validates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("pipelines")).expect("pipelines/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_fluxpipe"))
            .current_dir(root)
            .arg("validate")
            .arg("--config")
            .arg(&path)
            .output()
            .expect("run fluxpipe validate");
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} example pipelines");
}

#[test]
fn validate_names_the_key_and_the_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[sources.a]\ntype = \"stdin\"\n\n[sinks.b]\ntype = \"stdout\"\ninputs = [\"jobs\", \"jobz\"]\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_fluxpipe"))
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 6") && err.contains("sinks.b.inputs") && err.contains("jobz"),
        "{err}"
    );
}
