//! Every TOML example in README.md is a config `fluxpipe validate` accepts:
//! a snippet without sources gets a stdin source, one without sinks a stdout
//! sink, so a misspelt key in any example fails here.

use std::path::Path;
mod common;
use common::fluxpipe;

fn toml_blocks(text: &str) -> Vec<String> {
    text.split("```toml")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_toml_example_in_the_readme_validates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let blocks = toml_blocks(&readme);
    assert!(blocks.len() >= 5, "only {} TOML blocks", blocks.len());
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, block) in blocks.iter().enumerate() {
        let mut value: toml::Table = toml::from_str(block)
            .unwrap_or_else(|e| panic!("README TOML block {i} is not TOML: {e}\n{block}"));
        // Paths of the examples point at system folders: keep them inside
        // the test's folder.
        value.insert(
            "data_dir".into(),
            toml::Value::String(dir.path().join("data").display().to_string()),
        );
        if !value.contains_key("sources") {
            value.insert(
                "sources".into(),
                toml::from_str::<toml::Table>("[in]\ntype = \"stdin\"")
                    .expect("source")
                    .into(),
            );
        }
        if !value.contains_key("sinks") {
            value.insert(
                "sinks".into(),
                toml::from_str::<toml::Table>("[out]\ntype = \"stdout\"\ninputs = [\"jobs\"]")
                    .expect("sink")
                    .into(),
            );
        }
        let text = toml::to_string(&value).expect("TOML");
        let path = dir.path().join(format!("block{i}.toml"));
        std::fs::write(&path, &text).expect("write");
        let out = fluxpipe()
            .current_dir(dir.path())
            .args(["validate", "--config"])
            .arg(&path)
            .output()
            .expect("run fluxpipe validate");
        assert!(
            out.status.success(),
            "README TOML block {i} does not validate: {}\n{block}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
